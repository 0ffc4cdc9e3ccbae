/* host_path.c: the multi-threaded pure-C forward used when there is no OpenCL device,
 * and the storage conversions the host backward shares.
 *
 * The arithmetic is in host_kernels.c: one call there computes a block of
 * FLASHCL_HOST_BLOCK_M query rows of one (batch, query head), streaming its visible
 * keys in tiles with the online softmax of cl/flash_fwd_cpu.cl. Here the
 * ctx->host_threads workers take (block, batch, head) items from a shared counter,
 * the costliest blocks first, each with its own aligned scratch.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Storage conversions. The reference in host_ref/ has its own: the two are
 * independent on purpose, so one checks the other. */
static float load(const void *base, flashcl_dtype dtype, size_t i) {
    uint32_t bits;
    float f;
    if (dtype == FLASHCL_FLOAT32)
        return ((const float *)base)[i];
    uint16_t h = ((const uint16_t *)base)[i];
    if (dtype == FLASHCL_BFLOAT16) {
        bits = (uint32_t)h << 16;
    } else {
        uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
        if (exp == 0x1f) {
            bits = sign | 0x7f800000u | (man << 13);
        } else if (exp == 0) {
            f = ldexpf((float)man, -24); /* zero or subnormal */
            return sign ? -f : f;
        } else {
            bits = sign | ((exp + 112) << 23) | (man << 13);
        }
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000, abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00);
    if (abs >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00);
    if (abs < 0x38800000u) { /* below the smallest normal half: subnormal */
        float scaled = fabsf(f) * 16777216.0f; /* units of 2^-24, exact */
        return (uint16_t)(sign | (uint32_t)nearbyintf(scaled));
    }
    /* Normal: rebias the exponent, round the 13 dropped bits to even. */
    uint32_t h = ((abs >> 13) - (112u << 10));
    uint32_t rest = abs & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        ++h;
    return (uint16_t)(sign | h);
}

static void store(void *base, flashcl_dtype dtype, size_t i, float f) {
    if (dtype == FLASHCL_FLOAT32) {
        ((float *)base)[i] = f;
    } else if (dtype == FLASHCL_FLOAT16) {
        ((uint16_t *)base)[i] = to_half(f);
    } else {
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            u |= 0x400000u; /* keep NaN quiet */
        else
            u += 0x7fffu + ((u >> 16) & 1u);
        ((uint16_t *)base)[i] = (uint16_t)(u >> 16);
    }
}

typedef struct job {
    flashcl_host_fwd_args args;
    flashcl_host_kernel kernel;
    size_t scratch_floats;
    const int *order; /* row blocks, costliest first */
    size_t items, blocks; /* items = blocks * batch * heads_q */
    size_t next;         /* guarded by lock */
    pthread_mutex_t lock;
} job;

static void *worker(void *arg) {
    job *j = arg;
    float *ws = NULL;
    if (posix_memalign((void **)&ws, 64, j->scratch_floats * sizeof(float)) != 0)
        ws = NULL;
    for (;;) {
        pthread_mutex_lock(&j->lock);
        size_t item = ws ? j->next++ : j->items;
        pthread_mutex_unlock(&j->lock);
        if (item >= j->items)
            break;
        /* Head-major: the threads share one head's K and V (read once per block)
         * while it stays in the caches; going across heads instead (all heads'
         * costliest blocks first) read them from memory at N = 4096: 40% of the
         * time in copying K/V rows. The end of the list is still the cheapest
         * blocks (of the last head). */
        const int blk = j->order[item % j->blocks];
        const size_t bh = item / j->blocks;
        const int b = (int)(bh / j->args.d->heads_q), h = (int)(bh % j->args.d->heads_q);
        j->kernel.block(&j->args, b, h, blk * FLASHCL_HOST_BLOCK_M, ws);
    }
    free(ws);
    return NULL;
}

/* Keys a row block sees (the span of the union of its rows' windows): its cost. */
static long block_keys(const flashcl_attention_desc *d, long blk) {
    const long first = blk * FLASHCL_HOST_BLOCK_M, nk = d->seqlen_k;
    long last = first + FLASHCL_HOST_BLOCK_M - 1;
    if (last > d->seqlen_q - 1)
        last = d->seqlen_q - 1;
    long lo = d->window_left < 0 ? 0 : first + nk - d->seqlen_q - d->window_left;
    long hi = d->window_right < 0 ? nk - 1 : last + nk - d->seqlen_q + d->window_right;
    lo = lo < 0 ? 0 : lo;
    hi = hi > nk - 1 ? nk - 1 : hi;
    return hi >= lo ? hi - lo + 1 : 0;
}

typedef struct block_cost {
    long keys;
    int blk;
} block_cost;

static int costlier_first(const void *x, const void *y) {
    const block_cost *a = x, *b = y;
    return a->keys != b->keys ? (a->keys > b->keys ? -1 : 1) : (a->blk > b->blk) - (a->blk < b->blk);
}

flashcl_status flashcl_host_forward(flashcl_context *ctx, const flashcl_attention_desc *d,
                                    const void *q, const void *k, const void *v, void *out, float *lse) {
    job j;
    memset(&j, 0, sizeof j);
    j.args = (flashcl_host_fwd_args){d, q, k, v, out, lse};
    j.kernel = flashcl_host_kernel_pick(getenv("FLASHCL_HOST_SIMD"));
    j.scratch_floats = flashcl_host_scratch_floats(d->head_dim);
    const size_t blocks = ((size_t)d->seqlen_q + FLASHCL_HOST_BLOCK_M - 1) / FLASHCL_HOST_BLOCK_M;
    j.blocks = blocks;
    j.items = blocks * d->batch * d->heads_q;
    pthread_mutex_init(&j.lock, NULL);
    block_cost *cost = malloc(blocks * sizeof *cost);
    int *order = malloc(blocks * sizeof *order);
    if (!cost || !order) {
        free(cost);
        free(order);
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "host forward: no memory for %zu blocks",
                            blocks);
    }
    /* Costliest first (causal: the last blocks), so no thread is left with a long
     * block at the end while the others idle. */
    for (size_t i = 0; i < blocks; ++i)
        cost[i] = (block_cost){block_keys(d, (long)i), (int)i};
    qsort(cost, blocks, sizeof *cost, costlier_first);
    for (size_t i = 0; i < blocks; ++i)
        order[i] = cost[i].blk;
    free(cost);
    j.order = order;

    int n = ctx->host_threads;
    if ((size_t)n > j.items)
        n = (int)j.items;
    pthread_t threads[256];
    int started = 0;
    for (; started < n - 1; ++started)
        if (pthread_create(&threads[started], NULL, worker, &j) != 0)
            break; /* fewer threads is still correct */
    worker(&j);
    for (int t = 0; t < started; ++t)
        pthread_join(threads[t], NULL);
    free(order);
    pthread_mutex_destroy(&j.lock);
    if (j.next < j.items) /* every worker lacked scratch: nothing, or not everything, ran */
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "host forward: no memory for scratch");
    return FLASHCL_SUCCESS;
}

/* The conversions above, for the host backward (src/host_backward.c). */
float flashcl_host_load(const void *base, flashcl_dtype dtype, size_t i) {
    return load(base, dtype, i);
}

void flashcl_host_store(void *base, flashcl_dtype dtype, size_t i, float value) {
    store(base, dtype, i, value);
}
