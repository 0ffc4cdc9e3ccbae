/* serving_common.h: what test_serving.c and serving_queues.c share: the failure count, seeds, a
 * host mirror of a paged KV cache (every appended token, per sequence) and the checks of paged
 * attention against host_ref over it. */
#ifndef FLASHCL_TEST_SERVING_COMMON_H
#define FLASHCL_TEST_SERVING_COMMON_H

#include <stdint.h>

#include "harness.h"
#include "serving.h" /* the cache's device page tables, to see them rebuilt */

/* Every check's failures (expect's counter). */
extern int serving_failures;
/* A fresh seed a call, reproducible from FLASHCL_TEST_SEED. */
uint64_t serving_seed(void);

/* ---- the paged cache: a host mirror of every sequence ------------------------------------------
 */

typedef struct mirror {
    flashcl_kv_cache *cache;
    flashcl_kv_cache_desc desc;
    size_t row; /* elements per token: heads_k * head_dim */
    int ids[16];
    void *k[16], *v[16]; /* dense host copies, MAX_TOKENS tokens each at most */
    int len[16];
} mirror;

/* The longest mirrored sequence: paged_suite's 2000-token one and its appends.
 * mirror_append stops the test past it: at 1024, the 2000-token suite of the
 * mma mode overran mirror_matches' gather buffer (on the H200 glibc aborted
 * the run; the CPU runs never reached that suite). */
enum { MAX_TOKENS = 2048 };

void mirror_init(mirror *m, flashcl_context *ctx, flashcl_dtype dt, int hk, int d, int page_size,
                 int num_pages);
void mirror_free(mirror *m);
/* Appends random tokens: counts[i] to mirror slot slots[i]. Returns the status. */
flashcl_status mirror_append(flashcl_context *ctx, mirror *m, int n, const int *slots,
                             const int *counts);
/* The pools read back and gathered through the page tables equal the mirror, bit for bit, and
 * every length agrees. */
int mirror_matches(flashcl_context *ctx, mirror *m);
/* Whether the cache's device page tables hold every live sequence's host table. */
int device_tables_match(flashcl_context *ctx, const flashcl_kv_cache *c);
/* Paged attention of nq[i] new queries per listed mirror slot against the cache (heads_q query
 * heads; splits 0: the library's choice), checked against the dense reference and counted in
 * serving_failures as `name`; q_seed 0: fresh queries. Returns whether it passed; *out_host (if
 * not NULL) receives the output, which the caller frees. */
/* The soft-cap every paged_check passes (scores s -> softcap tanh(s / softcap); 0: none). */
extern float paged_softcap;
int paged_check(flashcl_context *ctx, mirror *m, int n, const int *slots, const int *nq,
                int heads_q, int causal, int splits, uint64_t q_seed, const char *name,
                void **out_host);
/* Lengths 1, page_size - 1, page_size, page_size + 1 and long_len in a fresh cache (hk kv heads,
 * group query heads each, head dim d, pages of ps): appends, decode with and without splits, a
 * padded Q, prompt chunks; each check named after tag. */
void paged_suite(flashcl_context *ctx, flashcl_dtype dt, int hk, int group, int d, int ps,
                 int long_len, const char *tag);
/* One sequence of `len` tokens in a fresh mirror, and the desc of a one-token step over it
 * (heads_q query heads); cu: {0, 1}. */
void one_sequence(flashcl_context *ctx, mirror *m, flashcl_varlen_desc *d, const int *cu,
                  flashcl_dtype dt, int head_dim, int heads_q, int len);

/* ---- out-of-order queues (serving_queues.c)
 * ------------------------------------------------------ */

/* Append to a parent and fork it at once, on an out-of-order queue, 24 times. */
void ooo_fork_case(flashcl_context *base);
/* 24 appends back to back on an out-of-order queue, nothing waited for in between. */
void ooo_appends_case(flashcl_context *base);
/* Four unwaited decode calls on an out-of-order queue sharing one scratch buffer, each right;
 * grow: the batch description outgrows its buffer at the second call. */
void ooo_suite(flashcl_context *base, int grow, const char *name);

#endif
