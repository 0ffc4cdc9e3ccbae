/* serving.h: the paged KV cache's structure, shared by kv_cache.c and serving.c, and serving.c's varlen checks. */
#ifndef FLASHCL_SERVING_H
#define FLASHCL_SERVING_H

#include "internal.h"

/* One sequence: its length and page table (physical page per logical page),
 * and where the device copy of that table lives in the cache's `tables`. */
typedef struct flashcl_kv_sequence {
    int live;
    int length;
    int *pages;
    int count, capacity; /* pages in use, allocated entries */
    int dev_off, dev_cap; /* its region of `tables` (dev_cap 0: none yet) */
} flashcl_kv_sequence;

struct flashcl_kv_cache {
    flashcl_context *ctx;
    flashcl_kv_cache_desc desc;
    cl_mem k_pool, v_pool;
    size_t page_bytes;  /* page_size * heads_k * head_dim * page element size */
    /* The pages' storage type: desc.dtype, or an FP8 format (desc.page_dtype),
     * and for FP8 the scales: desc.k_scales/v_scales point to k_scales and
     * v_scales (heads_k each, owned), and `scales` holds them on the device as
     * [heads_k][4] floats {k descale, v descale, k inverse, v inverse}, the
     * inverses 1.0f / scale rounded once on the host so that every device
     * quantizes to the same bytes (kv_append multiplies by them). */
    flashcl_dtype page_dtype;
    float *k_scales, *v_scales;
    cl_mem scales;
    int *refcount;      /* per physical page: sequences using it         */
    int *free_list;     /* a stack; the top is handed out next            */
    int free_count;
    flashcl_kv_sequence *seqs; /* indexed by sequence id                  */
    int seq_count;             /* ids handed out so far (live or not)     */
    int seq_capacity;
    /* Every live sequence's page table on the device, so that an attention
     * call uploads a few ints per sequence, not its tables (kv_cache.c). */
    cl_mem tables;
    int tables_cap, tables_used; /* ints; regions are handed out from tables_used */
    /* The appends' slot lists (and table entries), uploaded into one buffer
     * kept across appends unless they go by value (META_ARGS);
     * slots_reader: the last append kernel, which the next upload, or the
     * next by-value append's kernel, waits for. */
    cl_mem slots;
    size_t slots_cap;
    cl_event slots_reader;
};

/* The live sequence `id`, or NULL. */
const flashcl_kv_sequence *flashcl_kv_cache_sequence(const flashcl_kv_cache *cache, int id);

/* Fails (on ctx) unless seq_ids[0..n) are n distinct live sequences of the
 * cache; `suffix` ends the duplicate's message ("" or " in one append"). O(n),
 * so that a batch of thousands costs nothing next to its kernels. */
flashcl_status flashcl_kv_cache_check_ids(const flashcl_kv_cache *cache, flashcl_context *ctx, const int *seq_ids,
                                          int n, const char *suffix);

/* Non-blocking uploads from the context's host staging copies (serving.c):
 * take a copy with room for `bytes`, fill it, then upload it into *buf
 * (grown to fit, *cap its size) after `after`; *written: the write. */
void *flashcl_staging_take(flashcl_context *ctx, size_t bytes);
flashcl_status flashcl_staging_upload(flashcl_context *ctx, cl_mem *buf, size_t *cap, size_t bytes, cl_event after,
                                      cl_event *written, const char *what);

/* Small per-call arrays as a by-value kernel argument instead of an upload
 * (the decode kernels' batch description, an append's slot list): the int
 * count a kernel is built for to take `ints` (a power of two from 64, at
 * most FLASHCL_BY_VALUE_MAX_INTS, within the device's argument space less
 * 256 bytes for the other arguments), or 0 when they do not fit. (serving.c) */
#define FLASHCL_BY_VALUE_MAX_INTS 1024
int flashcl_by_value_ints(const flashcl_context *ctx, size_t ints);

/* Checks a cu_seqlens array of n sequences (non-NULL, [0] = 0, nondecreasing)
 * with a message naming it; *total = cu[n]. (serving.c) */
flashcl_status flashcl_check_cu_seqlens(flashcl_context *ctx, const char *name, const int *cu, int n, int *total);

#endif
