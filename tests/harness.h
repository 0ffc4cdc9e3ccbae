/* harness.h: what every flashcl test shares: device choice, seeds, running one forward case. */
#ifndef FLASHCL_TEST_HARNESS_H
#define FLASHCL_TEST_HARNESS_H

#include <stdint.h>

#include "flashcl.h"
#include "flashcl_ref.h"

/* Layouts a case can use for q/k/v/out. */
enum {
    LAYOUT_PACKED = 0, /* [b][s][h][d], strides left 0                       */
    LAYOUT_BHSD = 1,   /* [b][h][s][d] through strides                       */
    LAYOUT_PADDED = 2, /* packed with padded strides and a nonzero offset    */
};

typedef struct test_case {
    flashcl_dtype dtype;
    int batch, heads_q, heads_k, seqlen_q, seqlen_k, head_dim;
    int causal, window_left, window_right;
    float softcap, scale;
    int layout;
    double input_scale; /* stddev of random q and k (1 if 0); v is always N(0,1) */
} test_case;

/* One batch, one head, no mask, packed layout: the shape cases start from. */
test_case test_case_basic(flashcl_dtype dtype, int seqlen_q, int seqlen_k, int head_dim);
/* More (batch, head) pairs than one chunk of the NVIDIA kernels'
 * longest-first order (LPT_HEADS=8, cl/common_nv.cl): batch 3, 6 query heads
 * over heads_k, causal (window_right < 0) or a window bounded on the right
 * only. */
test_case test_case_many_heads(flashcl_dtype dtype, int seqlen_q, int seqlen_k, int head_dim, int heads_k,
                               int window_right);

/* The context the tests run on: FLASHCL_TEST_DEVICE, else the default
 * device. Exits with a message when none can be created. */
flashcl_context *test_context(void);

/* A context on an out-of-order queue of base's device (*queue: that queue,
 * to release after the context is destroyed), or NULL after a line saying
 * that `what` is skipped (the implementation has no such queue). */
flashcl_context *test_out_of_order_context(flashcl_context *base, const char *what, cl_command_queue *queue);

/* A seed for fresh inputs: FLASHCL_TEST_SEED if set, else time-based;
 * printed once so a failure can be replayed. */
uint64_t test_seed(void);

/* Runs one case on ctx against host_ref with fresh inputs and poisoned
 * outputs. Prints a line on failure (and a summary when verbose). Returns 1
 * when the case passed. */
int run_case(flashcl_context *ctx, const test_case *tc, uint64_t seed, int verbose);

/* Forward with one query whose scores are huge but finite (score against
 * key `hot`, score/2 against the others; f32, scale 1): checks out = 2 and
 * LSE = score on ctx and in host_ref. `portable`: on the portable kernel
 * (flashcl_set_params) rather than the device's own choice. 1 when both
 * are right. */
int run_huge_scores(flashcl_context *ctx, float score, int seqlen_k, int hot, int head_dim, int portable);

/* Fills desc's shape and layout from a case (buffer sizes in *elems). */
void case_desc(const test_case *tc, flashcl_attention_desc *desc, size_t elems[4]);

/* Zeroed descriptors with their shape fields set; every other field 0 (for a dense desc that
 * includes the windows, which 0 makes "the diagonal only": callers set the mask they mean). */
flashcl_attention_desc test_attention_desc(flashcl_dtype dtype, int batch, int heads_q, int heads_k,
                                           int seqlen_q, int seqlen_k, int head_dim);
flashcl_merge_desc test_merge_desc(flashcl_dtype dtype, int batch, int seqlen, int heads,
                                   int head_dim);
flashcl_varlen_desc test_varlen_desc(flashcl_dtype dtype, int num_seqs, int heads_q, int heads_k,
                                     int head_dim, const int *cu_seqlens_q,
                                     const int *cu_seqlens_k);

/* Two runs of one function whose float sums differ only in order (split-KV against unsplit):
 * whether n outputs of dtype dt, a and b, lie within 2 storage ulps of each other at each one's
 * magnitude, plus the reference's absolute slack (4 flashcl_ref_epsilon) for float32's longer
 * sums. A float32 difference far below an ulp can still round to neighbouring values, and the
 * split partials are rounded too: the fixed bound this replaced (4 epsilon, 8e-4 for float16)
 * is under two float16 ulps from |out| 0.5 on (9.8e-4), and failed a CI run so (2026-12-06).
 * *worst: the largest |a - b| (infinity for a NaN or inf). */
int test_outputs_agree(const void *a, const void *b, flashcl_dtype dt, size_t n, double *worst);

/* 1 where a call that forced `variant` was refused as flashcl refuses the cpu kernels on Mesa's
 * rusticl (src/internal.h, FLASHCL_RUSTICL_NO_CPU): variant "cpu", a rusticl device,
 * FLASHCL_ERROR_INVALID_PARAMS and a message naming rusticl. A test then checks that the call
 * wrote nothing, in place of its result. */
int test_cpu_refused_on_rusticl(flashcl_context *ctx, const char *variant, flashcl_status st);

/* The end of a test's main: prints "N FAILED" or "all passed"; returns its exit status. */
int test_summary(int failures);

/* Prints "name: ok" or "name: FAILED" and counts failures. */
void expect(int ok, const char *what, int *failures);

/* Test plumbing that ends the test on failure (nothing after it could be
 * checked): malloc (n = 0 allowed); a device buffer of `bytes` (4 if 0), a
 * copy of `host` when given; a blocking read of `bytes` into `host`. */
void *test_xmalloc(size_t n);
cl_mem test_upload(flashcl_context *ctx, const void *host, size_t bytes);
void test_download(flashcl_context *ctx, cl_mem b, void *host, size_t bytes);

/* Copies from_dir/name to to_dir/name; 1 on success. */
int test_copy_file(const char *from_dir, const char *to_dir, const char *name);

/* One flashcl_paged_attention call as the serving tests make it: out
 * (out_el elements of d->dtype) and lse (lse_n floats) are poisoned and
 * uploaded with q (q_el elements), scratch is sized by
 * flashcl_paged_scratch_size, and on success out and lse hold the results
 * (on failure the status and message are printed). *params and *used_splits
 * receive flashcl_serving_params's choice. */
flashcl_status test_paged_attention(flashcl_context *ctx, const flashcl_varlen_desc *d, flashcl_kv_cache *cache,
                                    const int *ids, const void *q, size_t q_el, void *out, size_t out_el, float *lse,
                                    size_t lse_n, flashcl_params *params, int *used_splits);

/* Host K and V (bytes each) uploaded and appended to cache (n sequences ids, counts[i] new tokens
 * each, one call), the queue finished and the buffers released; the append's status. */
flashcl_status test_kv_append(flashcl_context *ctx, flashcl_kv_cache *cache, int n, const int *ids,
                              const int *counts, const void *k, const void *v, size_t bytes);

/* A FLASHCL_KERNEL_DIR holding only some kernel sources (tests that take one
 * away to see a fallback): mkdtemp(dir) on a "...XXXXXX" template, then the
 * files every kernel is built on (from_dir's common*.cl, src/program.c) and
 * the `count` files, copied from from_dir; 1 on success.
 * test_kernel_dir_remove deletes it and what it holds, whole or partly made. */
int test_kernel_dir(char *dir, const char *from_dir, const char *const *files, int count);
void test_kernel_dir_remove(const char *dir);

/* A test's own probe kernel, `kernel` in test_dir/file, built like a library
 * kernel (cl_dir's common*.cl before it, through a FLASHCL_KERNEL_DIR made
 * for the build alone) and run once over n work-items (rounded up to 64)
 * with arguments (in, out, int n). out's out_bytes are uploaded as the
 * output's first contents (the caller's poison) and read back after the run;
 * on any failure they stay as they were. CL_SUCCESS when it ran. */
cl_int test_run_probe(flashcl_context *ctx, const char *cl_dir, const char *test_dir, const char *file,
                      const char *kernel, const void *in, size_t in_bytes, void *out, size_t out_bytes, int n);

#endif
