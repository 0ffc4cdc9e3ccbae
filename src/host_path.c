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
    size_t blocks;    /* row blocks a query head */
    int packing;      /* 1: the items are pack chunks, 0: row blocks */
    size_t items;     /* pack chunks, or blocks * batch * heads_q */
    size_t next;      /* guarded by lock */
    pthread_mutex_t lock;
} job;

#define PACK_CHUNK 256 /* keys a pack item converts */

static void *worker(void *arg) {
    job *j = arg;
    float *ws = NULL;
    if (!j->packing && posix_memalign((void **)&ws, 64, j->scratch_floats * sizeof(float)) != 0)
        ws = NULL;
    const int ready = j->packing || ws;
    for (;;) {
        pthread_mutex_lock(&j->lock);
        size_t item = ready ? j->next++ : j->items;
        pthread_mutex_unlock(&j->lock);
        if (item >= j->items)
            break;
        if (j->packing) {
            const size_t chunks = (j->args.keys + PACK_CHUNK - 1) / PACK_CHUNK, c = item % chunks;
            const size_t bh = item / chunks, end = (c + 1) * PACK_CHUNK;
            j->kernel.pack(&j->args, (int)(bh / j->args.d->heads_k), (int)(bh % j->args.d->heads_k),
                           c * PACK_CHUNK, end < j->args.keys ? end : j->args.keys);
            continue;
        }
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

/* Runs j's items on up to `threads` threads (this one included); 1 when every item ran. */
static int run_items(job *j, int threads) {
    j->next = 0;
    if ((size_t)threads > j->items)
        threads = (int)j->items;
    pthread_t tid[256];
    int started = 0;
    for (; started < threads - 1 && started < 256; ++started)
        if (pthread_create(&tid[started], NULL, worker, j) != 0)
            break; /* fewer threads is still correct */
    worker(j);
    for (int t = 0; t < started; ++t)
        pthread_join(tid[t], NULL);
    return j->next >= j->items; /* else every worker lacked scratch */
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
    j.args = (flashcl_host_fwd_args){d, q, k, v, out, lse, NULL, NULL, 0, 0};
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

    /* K and V packed first, converted once for every row block that reads them
     * and laid out contiguously, where a head's rows lie far apart: in the packed
     * [b][s][h][d] layout they are heads*D elements apart, two rows a 4 KiB page
     * at 8 heads of 64 floats, and long sequences spent their time in TLB misses
     * (f32, N = 16384: 58 GFLOP/s a core, against 86 from the same data in
     * [b][h][s][d]; 82 packed). From 8 MiB of K rows a head (K and V then span
     * more than a Zen 4's 12 MiB of L2 TLB reach; at N = 4096 here: 71 -> 85);
     * below that the pass costs more than it saves (N = 1024: 64 -> 57). Only
     * where K/V rows are read by more than one block, and within a memory budget;
     * otherwise the kernel reads them tile by tile. */
    const size_t group = (size_t)(d->heads_q / d->heads_k);
    const size_t keys = ((size_t)d->seqlen_k + FLASHCL_HOST_BLOCK_N - 1) / FLASHCL_HOST_BLOCK_N * FLASHCL_HOST_BLOCK_N;
    const size_t dim = flashcl_host_padded_dim(d->head_dim);
    const size_t pack_floats = (size_t)d->batch * d->heads_k * keys * dim;
    const size_t esize = d->dtype == FLASHCL_FLOAT32 ? 4 : 2;
    const int spread = (size_t)d->seqlen_k * d->k.stride_seq * esize >= ((size_t)8 << 20);
    const char *env = getenv("FLASHCL_HOST_PACK"); /* "0": never, "1": wherever it may (tests) */
    const int want = env && strcmp(env, "0") == 0 ? 0 : env && strcmp(env, "1") == 0 ? 1 : spread;
    float *kp = NULL, *vp = NULL;
    if (want && blocks * group >= 2 && pack_floats * 2 * sizeof(float) <= FLASHCL_HOST_PACK_BYTES &&
        posix_memalign((void **)&kp, 64, pack_floats * sizeof(float)) == 0 &&
        posix_memalign((void **)&vp, 64, pack_floats * sizeof(float)) == 0) {
        j.args.kp = kp;
        j.args.vp = vp;
        j.args.keys = keys;
        j.args.dim = dim;
        j.packing = 1;
        j.items = (size_t)d->batch * d->heads_k * ((keys + PACK_CHUNK - 1) / PACK_CHUNK);
        run_items(&j, ctx->host_threads);
        j.packing = 0;
        j.items = blocks * d->batch * d->heads_q;
    } else {
        free(kp); /* a failed allocation: the kernel reads K/V in place */
        kp = NULL;
        j.args.kp = j.args.vp = NULL;
    }
    const int ok = run_items(&j, ctx->host_threads);
    free(kp);
    free(vp);
    free(order);
    pthread_mutex_destroy(&j.lock);
    if (!ok)
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
