/* host_backward.c: the multi-threaded pure-C backward pass used when there is no OpenCL device.
 *
 * The algorithm of cl/flash_bwd.cl's deterministic mode, in float:
 *   pass 0  items (batch, query head, block of rows): D_i = rowsum(dO_i * O_i)
 *   pass 1  items (batch, kv head, block of keys): dK and dV of the block's
 *           keys, summed over the query heads sharing the kv head and the rows
 *           that see the block; one writer per element
 *   pass 2  items (batch, query head, block of rows): dQ of those rows,
 *           summed over their visible keys in key order
 * P = exp(s - LSE) and dS = P (dP - D) g are recomputed in both passes, so
 * memory stays O(block * head_dim) per thread, plus the D_i array.
 * The arithmetic is in src/host_backward_body.h, compiled per instruction set in
 * host_kernels.c next to the forward's (same tiles, micro-kernel, exp2 and
 * conversions) and picked the same way (FLASHCL_HOST_SIMD).
 * Items are handed out through a shared counter (causal blocks differ in cost),
 * and each item's sums run in a fixed order: results do not depend on the
 * thread count or on scheduling.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct job {
    flashcl_host_bwd_args args;
    flashcl_host_kernel kernel;
    size_t scratch_floats;
    int pass;
    int heads;            /* heads per batch of this pass's items */
    size_t items, blocks; /* blocks per (batch, head) of this pass */
    size_t next;          /* guarded by lock */
    pthread_mutex_t lock;
} job;

static void *worker(void *arg) {
    job *j = arg;
    float *ws = NULL;
    if (posix_memalign((void **)&ws, 64, j->scratch_floats * sizeof(float)) != 0)
        return NULL; /* the other threads take the items; run_pass checks */
    for (;;) {
        pthread_mutex_lock(&j->lock);
        size_t item = j->next++;
        pthread_mutex_unlock(&j->lock);
        if (item >= j->items)
            break;
        /* Head-major: the threads share one head's K, V (or Q, dO) while it
         * stays in the caches. Causal blocks cost more the more keys they see:
         * pass 1's first key blocks and pass 2's last row blocks; those go first,
         * so that the cheap ones even out the threads' ends. */
        const size_t bh = item / j->blocks, blk = item % j->blocks;
        j->kernel.bwd(&j->args, j->pass, (int)(bh / (size_t)j->heads), (int)(bh % (size_t)j->heads),
                      (long)(j->pass == 2 ? j->blocks - 1 - blk : blk), ws);
    }
    free(ws);
    return NULL;
}

/* 1 when every item ran (else no thread had scratch). */
static int run_pass(flashcl_context *ctx, job *j) {
    j->next = 0;
    int n = ctx->host_threads;
    if (n < 1)
        n = 1;
    if ((size_t)n > j->items)
        n = (int)j->items;
    if (n > 256)
        n = 256;
    pthread_t threads[256];
    int started = 0;
    for (; started < n - 1; ++started)
        if (pthread_create(&threads[started], NULL, worker, j) != 0)
            break; /* fewer threads is still correct */
    worker(j);
    for (int t = 0; t < started; ++t)
        pthread_join(threads[t], NULL);
    return j->next >= j->items;
}

flashcl_status flashcl_host_backward(flashcl_context *ctx, const flashcl_attention_desc *d,
                                     const flashcl_backward_options *o, const void *q, const void *k,
                                     const void *v, const void *out, const void *dout, const float *lse,
                                     void *dq, void *dk, void *dv) {
    const size_t rows = (size_t)d->batch * d->heads_q * d->seqlen_q;
    float *di = malloc((rows ? rows : 1) * sizeof(float));
    if (!di)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory for D (%zu rows)", rows);
    job j;
    memset(&j, 0, sizeof j);
    j.args.d = d;
    j.args.o = o;
    j.args.q = q, j.args.k = k, j.args.v = v, j.args.out = out, j.args.dout = dout;
    j.args.lse = lse, j.args.di = di;
    j.args.dq = dq, j.args.dk = dk, j.args.dv = dv;
    j.kernel = flashcl_host_kernel_pick(getenv("FLASHCL_HOST_SIMD"));
    j.scratch_floats = flashcl_host_bwd_scratch_floats(d->head_dim);
    pthread_mutex_init(&j.lock, NULL);
    const size_t row_blocks = ((size_t)d->seqlen_q + FLASHCL_HOST_BLOCK_M - 1) / FLASHCL_HOST_BLOCK_M;
    const size_t key_blocks = ((size_t)d->seqlen_k + FLASHCL_HOST_BLOCK_N - 1) / FLASHCL_HOST_BLOCK_N;
    int ok = 1;
    for (int pass = 0; pass < 3 && ok; ++pass) {
        j.pass = pass;
        j.heads = pass == 1 ? d->heads_k : d->heads_q;
        j.blocks = pass == 1 ? key_blocks : row_blocks;
        j.items = (size_t)d->batch * j.heads * j.blocks;
        ok = run_pass(ctx, &j);
    }
    pthread_mutex_destroy(&j.lock);
    free(di);
    if (!ok)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "host backward: no memory for scratch");
    return FLASHCL_SUCCESS;
}
