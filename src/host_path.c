/* host_path.c: the multi-threaded pure-C forward used when there is no OpenCL device.
 *
 * The same algorithm as cl/flash_fwd.cl, in float: each query row streams its
 * visible keys in tiles of TILE, keeping a running max, a running sum and a
 * rescaled accumulator, so memory stays O(head_dim + TILE) per thread. Work is
 * split into (batch, head, 16-row block) items handed out through a shared
 * counter, so threads stay busy under causal masks whose rows differ in cost.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define TILE 64
#define ROWS_PER_ITEM 16

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
    const flashcl_attention_desc *d;
    const void *q, *k, *v;
    void *out;
    float *lse;
    size_t items, blocks_per_head;
    size_t next; /* guarded by lock */
    pthread_mutex_t lock;
} job;

static void forward_row(const job *j, int b, int h, int i, float *qrow, float *acc, float *s) {
    const flashcl_attention_desc *d = j->d;
    const int D = d->head_dim, hk = h / (d->heads_q / d->heads_k);
    const float log2e = 1.4426950408889634f;
    const int capped = d->softcap > 0.0f;
    const float q_mul = capped ? d->scale / d->softcap : d->scale * log2e;
    const float to_log2 = capped ? 1.0f : q_mul; /* raw score -> log2 domain, as in the kernel */
    size_t qb = d->q.offset + b * d->q.stride_batch + (size_t)i * d->q.stride_seq + h * d->q.stride_head;
    for (int x = 0; x < D; ++x) {
        qrow[x] = load(j->q, d->dtype, qb + x);
        acc[x] = 0.0f;
    }
    long diag = (long)i + d->seqlen_k - d->seqlen_q;
    long lo = d->window_left < 0 ? 0 : diag - d->window_left;
    long hi = d->window_right < 0 ? d->seqlen_k - 1 : diag + d->window_right;
    if (lo < 0)
        lo = 0;
    if (hi > d->seqlen_k - 1)
        hi = d->seqlen_k - 1;
    float m = -INFINITY, l = 0.0f;
    for (long n0 = lo; n0 <= hi; n0 += TILE) {
        int n = (int)(hi - n0 + 1 < TILE ? hi - n0 + 1 : TILE);
        float tile_max = -INFINITY;
        for (int c = 0; c < n; ++c) {
            size_t kb = d->k.offset + b * d->k.stride_batch + (size_t)(n0 + c) * d->k.stride_seq +
                        hk * d->k.stride_head;
            float dot = 0.0f;
            for (int x = 0; x < D; ++x)
                dot += qrow[x] * load(j->k, d->dtype, kb + x);
            s[c] = capped ? d->softcap * log2e * tanhf(dot * q_mul) : dot;
            tile_max = fmaxf(tile_max, s[c]);
        }
        float m_new = fmaxf(m, tile_max), alpha = exp2f((m - m_new) * to_log2);
        l *= alpha;
        for (int x = 0; x < D; ++x)
            acc[x] *= alpha;
        for (int c = 0; c < n; ++c) {
            /* (s - m) * to_log2, not fmaf(s, to_log2, -m * to_log2): the two
             * roundings differ by half an ulp of m*to_log2, so at scores ~ 1e10
             * p came out 2^+-512 (0 or inf). s - m is exact near m, <= 0. */
            float p = exp2f((s[c] - m_new) * to_log2);
            size_t vb = d->v.offset + b * d->v.stride_batch + (size_t)(n0 + c) * d->v.stride_seq +
                        hk * d->v.stride_head;
            l += p;
            for (int x = 0; x < D; ++x)
                acc[x] += p * load(j->v, d->dtype, vb + x);
        }
        m = m_new;
    }
    /* No visible key: lo > hi, the loop never ran, l = 0 -> output 0, LSE -inf. */
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    size_t ob = d->out.offset + b * d->out.stride_batch + (size_t)i * d->out.stride_seq +
                h * d->out.stride_head;
    for (int x = 0; x < D; ++x)
        store(j->out, d->dtype, ob + x, acc[x] * inv);
    if (j->lse)
        j->lse[((size_t)b * d->heads_q + h) * d->seqlen_q + i] =
            l > 0.0f ? (m * to_log2 + log2f(l)) * 0.6931471805599453f : -INFINITY;
}

static void *worker(void *arg) {
    job *j = arg;
    float qrow[256], acc[256], s[TILE];
    for (;;) {
        pthread_mutex_lock(&j->lock);
        size_t item = j->next++;
        pthread_mutex_unlock(&j->lock);
        if (item >= j->items)
            return NULL;
        size_t bh = item / j->blocks_per_head;
        int blk = (int)(item % j->blocks_per_head);
        int b = (int)(bh / j->d->heads_q), h = (int)(bh % j->d->heads_q);
        int end = (blk + 1) * ROWS_PER_ITEM < j->d->seqlen_q ? (blk + 1) * ROWS_PER_ITEM : j->d->seqlen_q;
        for (int i = blk * ROWS_PER_ITEM; i < end; ++i)
            forward_row(j, b, h, i, qrow, acc, s);
    }
}

flashcl_status flashcl_host_forward(flashcl_context *ctx, const flashcl_attention_desc *d,
                                    const void *q, const void *k, const void *v, void *out, float *lse) {
    job j = {d, q, k, v, out, lse, 0, 0, 0, PTHREAD_MUTEX_INITIALIZER};
    j.blocks_per_head = ((size_t)d->seqlen_q + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM;
    j.items = (size_t)d->batch * d->heads_q * j.blocks_per_head;
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
    return FLASHCL_SUCCESS;
}

/* The conversions above, for the host backward (src/host_backward.c). */
float flashcl_host_load(const void *base, flashcl_dtype dtype, size_t i) {
    return load(base, dtype, i);
}

void flashcl_host_store(void *base, flashcl_dtype dtype, size_t i, float value) {
    store(base, dtype, i, value);
}
