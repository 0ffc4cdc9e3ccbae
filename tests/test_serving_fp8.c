/* test_serving_fp8.c: the paged KV cache with FP8 pages: quantizing appends, fork, copy-on-write, truncation, exhaustion, paged attention, the scheduler.
 *
 * A cache with page_dtype e4m3 or e5m2 stores byte = encode(x * inv) for
 * every appended element (inv = 1.0f / scale of its kv head). Every check
 * here is against something independent of the library's FP8 code:
 *   - the bytes: the pools are read back, gathered through the page tables
 *     and compared with host_ref's encoder (nearest of all 256 codes, a
 *     different algorithm from src/fp8.c and cl/common.cl) applied to the
 *     float product x * inv;
 *   - attention: host_ref computes it in double from the bytes the device
 *     holds, decoded exactly and times the scales (flashcl_ref_kv_gather,
 *     flashcl_ref_check_paged_fp8), so the kernels' error is measured apart
 *     from quantization's; per-head scales differ (a wrong head's scale
 *     fails), page orders are shuffled, outputs and LSEs are poisoned first.
 * Argument "decode" runs the attention suites on the memory-bound decode
 * kernel (FLASHCL_DECODE_PARAMS=KERNEL=decode) instead of the device's own
 * choice (the tiled kernel on CPUs); "mma" runs decoding on the tensor-core
 * decode kernel (cl/paged_decode_nv.cl, forced, with its HEAD_GROUP and
 * HEAD_WARPS forms) where it reads FP8 pages (NVIDIA sm_89+, float16
 * queries), elsewhere the same shapes on the device's own kernel; "oclgrind"
 * runs tiny shapes on the kernel FLASHCL_DECODE_PARAMS picks (ctest -L
 * oclgrind). FLASHCL_TEST_SEED replays a run.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int failures;
static uint64_t seed_counter;

static uint64_t next_seed(void) {
    return test_seed() + 104729u * ++seed_counter;
}

enum { MAX_SEQS = 8, MAX_TOKENS = 1024 };

static int mma_reads_fp8(flashcl_context *ctx);

/* A cache with FP8 pages and, per mirrored slot, the bytes it must hold. */
typedef struct fp8_mirror {
    flashcl_kv_cache *cache;
    flashcl_kv_cache_desc desc;
    flashcl_dtype fmt;
    float k_scales[8], v_scales[8];
    size_t row; /* elements (bytes) per token: heads_k * head_dim */
    int ids[MAX_SEQS], len[MAX_SEQS];
    unsigned char *k[MAX_SEQS], *v[MAX_SEQS];
} fp8_mirror;

/* Per-head scales that are not powers of two and differ between heads and
 * between K and V, about amax / max for N(0, 1) K/V (amax ~ 4): e4m3 ~ 4 / 448,
 * e5m2 128 times less. pow2: powers of two instead, so that decoded * scale
 * is exact in f16 (the dense comparison needs that). */
static void fp8_init(fp8_mirror *m, flashcl_context *ctx, flashcl_dtype dt, flashcl_dtype fmt, int hk, int d, int ps,
                     int num_pages, int pow2) {
    memset(m, 0, sizeof *m);
    m->fmt = fmt;
    for (int h = 0; h < hk; ++h) {
        const float f = fmt == FLASHCL_FLOAT8_E4M3 ? 1.0f : 1.0f / 128.0f;
        m->k_scales[h] = pow2 ? ldexpf(1.0f, h % 2 ? -5 : -6) : f * (0.0087f + 0.0031f * (float)h);
        m->v_scales[h] = pow2 ? ldexpf(1.0f, h % 2 ? -6 : -5) : f * (0.0113f - 0.0017f * (float)h);
    }
    m->desc.dtype = dt;
    m->desc.heads_k = hk;
    m->desc.head_dim = d;
    m->desc.page_size = ps;
    m->desc.num_pages = num_pages;
    m->desc.page_order_seed = next_seed() | 1;
    m->desc.page_dtype = fmt;
    m->desc.k_scales = m->k_scales;
    m->desc.v_scales = m->v_scales;
    m->row = (size_t)hk * d;
    flashcl_status st = flashcl_kv_cache_create(ctx, &m->desc, &m->cache);
    if (st) {
        fprintf(stderr, "kv_cache_create: %s: %s\n", flashcl_status_string(st), flashcl_last_error(ctx));
        exit(1);
    }
    for (int i = 0; i < MAX_SEQS; ++i) {
        m->k[i] = test_xmalloc(MAX_TOKENS * m->row);
        m->v[i] = test_xmalloc(MAX_TOKENS * m->row);
        m->ids[i] = -1;
    }
}

static void fp8_free(fp8_mirror *m) {
    flashcl_kv_cache_destroy(m->cache);
    for (int i = 0; i < MAX_SEQS; ++i)
        free(m->k[i]), free(m->v[i]);
}

/* Mirror slot `to` becomes a copy of slot `from` (a fork). */
static void fp8_copy_slot(fp8_mirror *m, int to, int from) {
    memcpy(m->k[to], m->k[from], (size_t)m->len[from] * m->row);
    memcpy(m->v[to], m->v[from], (size_t)m->len[from] * m->row);
    m->len[to] = m->len[from];
}

/* Random K/V in the cache's dtype, N(0, 1), with a few elements past the
 * format's range at their head's scale (saturation) and a few tiny ones
 * (subnormal or zero bytes). */
static void fp8_fill(flashcl_ref_rng *rng, fp8_mirror *m, void *x, size_t tokens, const float *scales) {
    const double fmax8 = m->fmt == FLASHCL_FLOAT8_E4M3 ? 448.0 : 57344.0;
    for (size_t t = 0; t < tokens; ++t)
        for (size_t e = 0; e < m->row; ++e) {
            const int h = (int)(e / (size_t)m->desc.head_dim);
            double r = flashcl_ref_rng_normal(rng);
            const uint64_t pick = flashcl_ref_rng_next(rng) % 97;
            if (pick == 0)
                r = (flashcl_ref_rng_uniform(rng) < 0.5 ? -3.0 : 3.0) * fmax8 * scales[h]; /* saturates */
            else if (pick == 1)
                r *= 1e-4; /* subnormal or zero bytes */
            flashcl_ref_store(x, m->desc.dtype, t * m->row + e, r);
        }
}

/* Appends counts[i] random tokens to mirror slot slots[i]; the mirror's bytes
 * are host_ref's encoding of the float products x * (1.0f / scale). */
static flashcl_status fp8_append(flashcl_context *ctx, fp8_mirror *m, int n, const int *slots, const int *counts) {
    const size_t es = flashcl_dtype_size(m->desc.dtype);
    int total = 0, ids[MAX_SEQS];
    for (int i = 0; i < n; ++i) {
        if (m->len[slots[i]] + counts[i] > MAX_TOKENS) {
            fprintf(stderr, "test bug: mirror slot %d would pass MAX_TOKENS\n", slots[i]);
            exit(1);
        }
        total += counts[i], ids[i] = m->ids[slots[i]];
    }
    void *k = test_xmalloc((size_t)total * m->row * es + 1), *v = test_xmalloc((size_t)total * m->row * es + 1);
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, next_seed());
    fp8_fill(&rng, m, k, (size_t)total, m->k_scales);
    fp8_fill(&rng, m, v, (size_t)total, m->v_scales);
    const flashcl_status st = test_kv_append(ctx, m->cache, n, ids, counts, k, v, (size_t)total * m->row * es);
    if (st == FLASHCL_SUCCESS) {
        size_t t = 0;
        for (int i = 0; i < n; ++i) {
            const int s = slots[i];
            for (size_t x = 0; x < (size_t)counts[i] * m->row; ++x) {
                const int h = (int)(x % m->row / (size_t)m->desc.head_dim);
                const float kin = 1.0f / m->k_scales[h], vin = 1.0f / m->v_scales[h];
                const float kx = (float)flashcl_ref_load(k, m->desc.dtype, t * m->row + x) * kin;
                const float vx = (float)flashcl_ref_load(v, m->desc.dtype, t * m->row + x) * vin;
                m->k[s][(size_t)m->len[s] * m->row + x] = flashcl_ref_fp8_encode(m->fmt, kx);
                m->v[s][(size_t)m->len[s] * m->row + x] = flashcl_ref_fp8_encode(m->fmt, vx);
            }
            m->len[s] += counts[i];
            t += (size_t)counts[i];
        }
    }
    free(k), free(v);
    return st;
}

/* The pools, read back (one byte an element) and gathered through every
 * mirrored sequence's page table, equal the mirror's bytes. */
static int fp8_bytes_match(flashcl_context *ctx, fp8_mirror *m) {
    const size_t pool = (size_t)m->desc.num_pages * m->desc.page_size * m->row;
    unsigned char *kp = test_xmalloc(pool), *vp = test_xmalloc(pool);
    test_download(ctx, flashcl_kv_cache_k_pool(m->cache), kp, pool);
    test_download(ctx, flashcl_kv_cache_v_pool(m->cache), vp, pool);
    int ok = 1, pages[MAX_TOKENS], count;
    for (int s = 0; s < MAX_SEQS; ++s) {
        if (m->ids[s] < 0)
            continue;
        ok &= flashcl_kv_cache_length(m->cache, m->ids[s]) == m->len[s];
        ok &= flashcl_kv_cache_page_table(m->cache, m->ids[s], pages, MAX_TOKENS, &count) == FLASHCL_SUCCESS;
        for (int n = 0; ok && n < m->len[s]; ++n) {
            const size_t slot = (size_t)pages[n / m->desc.page_size] * m->desc.page_size + n % m->desc.page_size;
            ok &= !memcmp(kp + slot * m->row, m->k[s] + (size_t)n * m->row, m->row) &&
                  !memcmp(vp + slot * m->row, m->v[s] + (size_t)n * m->row, m->row);
        }
    }
    free(kp), free(vp);
    return ok;
}

/* The FP8 key and value bytes ([total][heads_k][head_dim]) of the cache
 * sequences ids[0..n), back to back, from the pools on the device. */
static void fp8_dense(flashcl_context *ctx, flashcl_kv_cache *cache, int n, const int *ids, const int *cu_k,
                      unsigned char *k, unsigned char *v) {
    const flashcl_kv_cache_desc *cd = flashcl_kv_cache_get_desc(cache);
    const size_t row = (size_t)cd->heads_k * cd->head_dim, pool = (size_t)cd->num_pages * cd->page_size * row;
    unsigned char *kp = test_xmalloc(pool), *vp = test_xmalloc(pool);
    test_download(ctx, flashcl_kv_cache_k_pool(cache), kp, pool);
    test_download(ctx, flashcl_kv_cache_v_pool(cache), vp, pool);
    int *pages = test_xmalloc(4096 * sizeof(int)), count;
    for (int i = 0; i < n; ++i) {
        flashcl_kv_cache_page_table(cache, ids[i], pages, 4096, &count);
        flashcl_ref_kv_gather(kp, cd->page_dtype, cd->page_size, cd->heads_k, cd->head_dim, pages,
                              cu_k[i + 1] - cu_k[i], k + (size_t)cu_k[i] * row);
        flashcl_ref_kv_gather(vp, cd->page_dtype, cd->page_size, cd->heads_k, cd->head_dim, pages,
                              cu_k[i + 1] - cu_k[i], v + (size_t)cu_k[i] * row);
    }
    free(pages), free(kp), free(vp);
}

/* The soft-cap every fp8_attend call passes (0: none); mma_suite sets it for one shape. */
static float attend_softcap;

/* Paged attention of nq[i] queries (causal) for cache sequences ids[0..n)
 * against host_ref over the pools' bytes and scales; q, out in the cache's dtype.
 * Returns 1 when right; *out_host (may be NULL) receives the output. */
static int fp8_attend(flashcl_context *ctx, flashcl_kv_cache *cache, int n, const int *ids, const int *nq,
                      int heads_q, int splits, uint64_t q_seed, const char *name, void **out_host) {
    const flashcl_kv_cache_desc *cd = flashcl_kv_cache_get_desc(cache);
    const flashcl_dtype dt = cd->dtype;
    const size_t es = flashcl_dtype_size(dt);
    const int D = cd->head_dim, Hk = cd->heads_k;
    int cu_q[MAX_SEQS + 1] = {0}, cu_k[MAX_SEQS + 1] = {0};
    for (int i = 0; i < n; ++i) {
        cu_q[i + 1] = cu_q[i] + nq[i];
        cu_k[i + 1] = cu_k[i] + flashcl_kv_cache_length(cache, ids[i]);
    }
    const size_t q_el = (size_t)cu_q[n] * heads_q * D, lse_n = (size_t)cu_q[n] * heads_q;
    const size_t kv_el = (size_t)cu_k[n] * Hk * D;
    void *q = test_xmalloc(q_el * es), *out = test_xmalloc(q_el * es);
    float *lse = test_xmalloc(lse_n * 4);
    unsigned char *k = test_xmalloc(kv_el + 8), *v = test_xmalloc(kv_el + 8);
    fp8_dense(ctx, cache, n, ids, cu_k, k, v);
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, q_seed ? q_seed : next_seed());
    flashcl_ref_fill_normal(&rng, q, dt, q_el, 1.0);
    flashcl_varlen_desc d = test_varlen_desc(dt, n, heads_q, Hk, D, cu_q, NULL);
    d.causal = 1;
    d.num_splits = splits;
    d.softcap = attend_softcap;
    int used_splits = 0;
    flashcl_params params;
    flashcl_status st = test_paged_attention(ctx, &d, cache, ids, q, q_el, out, q_el, lse, lse_n, &params, &used_splits);
    d.cu_seqlens_k = cu_k;
    flashcl_ref_report rep;
    memset(&rep, 0, sizeof rep);
    int ok = !st && flashcl_ref_check_paged_fp8(&d, q, k, v, cd->page_dtype, cd->k_scales, cd->v_scales, out, lse, 1,
                                                &rep);
    ok &= splits == 0 || used_splits == splits;
    char what[200];
    snprintf(what, sizeof what, "%s (%s, splits %d, err %.2g tol %.2g)", name, st ? "-" : params.variant, used_splits,
             st ? -1.0 : rep.max_err, st ? -1.0 : rep.tolerance);
    expect(ok, what, &failures);
    free(q), free(lse), free(k), free(v);
    if (out_host)
        *out_host = out;
    else
        free(out);
    return ok;
}

/* ---- the suites --------------------------------------------------------------------------- */

/* Sequences of 1, page - 1, page + 1 and long_len tokens in one prefill
 * append, one decode append; decode (1 query: unsplit, forced splits,
 * heuristic) and causal prompt chunks. */
static void paged_suite(flashcl_context *ctx, flashcl_dtype dt, flashcl_dtype fmt, int hk, int group, int d, int ps,
                        int long_len, int prompts, const char *tag) {
    fp8_mirror m;
    fp8_init(&m, ctx, dt, fmt, hk, d, ps, (long_len + 4 * ps + 64) / ps + 4, 0);
    int lens[4] = {1, ps > 1 ? ps - 1 : 1, ps + 1, long_len}, slots[4] = {0, 1, 2, 3}, ones[4] = {1, 1, 1, 1};
    for (int i = 0; i < 4; ++i)
        flashcl_kv_cache_add_sequence(m.cache, &m.ids[i]);
    char what[160];
    flashcl_status st = fp8_append(ctx, &m, 4, slots, lens);
    snprintf(what, sizeof what, "%s: prefill append, bytes = encode(x * inv) of their kv head", tag);
    expect(st == FLASHCL_SUCCESS && fp8_bytes_match(ctx, &m), what, &failures);
    st = fp8_append(ctx, &m, 4, slots, ones);
    snprintf(what, sizeof what, "%s: decode append, bytes", tag);
    expect(st == FLASHCL_SUCCESS && fp8_bytes_match(ctx, &m), what, &failures);
    const uint64_t q_seed = next_seed();
    void *unsplit = NULL, *split = NULL;
    snprintf(what, sizeof what, "%s: decode, 1 query, GQA %d", tag, group);
    fp8_attend(ctx, m.cache, 4, m.ids, ones, hk * group, 1, q_seed, what, &unsplit);
    snprintf(what, sizeof what, "%s: decode, 3 splits", tag);
    fp8_attend(ctx, m.cache, 4, m.ids, ones, hk * group, 3, q_seed, what, &split);
    /* Split and unsplit compute the same function: within 2 storage ulps of each output
     * (test_outputs_agree). */
    double worst = INFINITY;
    const int agree = unsplit && split && test_outputs_agree(unsplit, split, dt, (size_t)4 * hk * group * d, &worst);
    snprintf(what, sizeof what, "%s: split-KV equals unsplit (max diff %.2g)", tag, worst);
    expect(agree, what, &failures);
    free(unsplit), free(split);
    snprintf(what, sizeof what, "%s: decode, heuristic splits", tag);
    fp8_attend(ctx, m.cache, 4, m.ids, ones, hk * group, 0, q_seed, what, NULL);
    int nq[4] = {1, lens[1] < 3 ? lens[1] : 3, 2, 5};
    snprintf(what, sizeof what, "%s: prompt chunks, causal", tag);
    if (prompts)
        fp8_attend(ctx, m.cache, 4, m.ids, nq, hk * group, 0, 0, what, NULL);
    fp8_free(&m);
}

/* FP8 paged attention equals the library's dense attention over the decoded
 * values. Power-of-two scales: every decoded * scale is then exactly a half,
 * so the dense f16 problem is exactly the cache's content. */
static void dense_equals_paged(flashcl_context *ctx) {
    const int hk = 2, group = 4, D = 64, nk = 77;
    fp8_mirror m;
    fp8_init(&m, ctx, FLASHCL_FLOAT16, FLASHCL_FLOAT8_E4M3, hk, D, 16, 16, 1);
    flashcl_kv_cache_add_sequence(m.cache, &m.ids[0]);
    int s0[1] = {0}, n0[1] = {nk}, nq[1] = {3};
    flashcl_status st = fp8_append(ctx, &m, 1, s0, n0);
    void *paged = NULL;
    const uint64_t q_seed = next_seed();
    int ok = st == FLASHCL_SUCCESS &&
             fp8_attend(ctx, m.cache, 1, m.ids, nq, hk * group, 1, q_seed, "dense check: paged FP8 (3 queries)", &paged);
    /* The dense problem: the same queries, K/V = scale * decode(bytes) in f16. */
    const size_t kv_el = (size_t)nk * hk * D, q_el = (size_t)3 * hk * group * D;
    uint16_t *k = test_xmalloc(kv_el * 2), *v = test_xmalloc(kv_el * 2), *q = test_xmalloc(q_el * 2),
             *dense = test_xmalloc(q_el * 2);
    int exact = 1;
    for (size_t x = 0; x < kv_el; ++x) {
        const int h = (int)(x / D % hk);
        const double kx = m.k_scales[h] * flashcl_ref_fp8_decode(m.fmt, m.k[0][x]);
        const double vx = m.v_scales[h] * flashcl_ref_fp8_decode(m.fmt, m.v[0][x]);
        flashcl_ref_store(k, FLASHCL_FLOAT16, x, kx);
        flashcl_ref_store(v, FLASHCL_FLOAT16, x, vx);
        exact &= flashcl_ref_load(k, FLASHCL_FLOAT16, x) == kx && flashcl_ref_load(v, FLASHCL_FLOAT16, x) == vx;
    }
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, q_seed);
    flashcl_ref_fill_normal(&rng, q, FLASHCL_FLOAT16, q_el, 1.0);
    flashcl_ref_poison(dense, FLASHCL_FLOAT16, q_el);
    flashcl_attention_desc a = test_attention_desc(FLASHCL_FLOAT16, 1, hk * group, hk, 3, nk, D);
    a.causal = 1;
    st = flashcl_attention_forward_host(ctx, &a, q, k, v, dense, NULL);
    /* Two kernels, one function: within 2 storage ulps of each output (test_outputs_agree). */
    double worst = INFINITY;
    const int agree = ok && st == FLASHCL_SUCCESS && test_outputs_agree(paged, dense, FLASHCL_FLOAT16, q_el, &worst);
    char what[128];
    snprintf(what, sizeof what, "FP8 paged attention equals dense f16 attention over the decoded values (max diff %.2g)",
             worst);
    expect(agree && exact, what, &failures);
    free(k), free(v), free(q), free(dense), free(paged);
    fp8_free(&m);
}

/* Fork and copy-on-write, truncation, exhaustion: as for 16-bit pools. */
static void lifecycle_suite(flashcl_context *ctx, flashcl_dtype fmt) {
    const int ps = 8, hk = 2, D = 32;
    fp8_mirror m;
    fp8_init(&m, ctx, FLASHCL_BFLOAT16, fmt, hk, D, ps, 12, 0);
    const char *f = fmt == FLASHCL_FLOAT8_E4M3 ? "e4m3" : "e5m2";
    char what[160];
    flashcl_kv_cache_add_sequence(m.cache, &m.ids[0]);
    int s0[1] = {0}, n20[1] = {20};
    fp8_append(ctx, &m, 1, s0, n20); /* 3 pages, the last holding 4 tokens */
    const int free0 = flashcl_kv_cache_free_pages(m.cache);
    flashcl_status st = flashcl_kv_cache_fork(m.cache, m.ids[0], &m.ids[1]);
    fp8_copy_slot(&m, 1, 0);
    snprintf(what, sizeof what, "%s: fork shares every page", f);
    expect(st == FLASHCL_SUCCESS && flashcl_kv_cache_free_pages(m.cache) == free0 && fp8_bytes_match(ctx, &m), what,
           &failures);
    /* The fork appends into the shared, partly filled page: one page copied
     * (its bytes as they are), the parent's bytes unchanged. */
    int s1[1] = {1}, n3[1] = {3};
    st = fp8_append(ctx, &m, 1, s1, n3);
    snprintf(what, sizeof what, "%s: copy-on-write into a shared partial page, the other sequence unchanged", f);
    expect(st == FLASHCL_SUCCESS && flashcl_kv_cache_free_pages(m.cache) == free0 - 1 && fp8_bytes_match(ctx, &m), what,
           &failures);
    int ones[2] = {1, 1};
    snprintf(what, sizeof what, "%s: both sequences attend to their own tokens", f);
    fp8_attend(ctx, m.cache, 2, m.ids, ones, hk * 3, 2, 0, what, NULL);
    /* Truncate the parent into its second page, append past it again. */
    st = flashcl_kv_cache_truncate(m.cache, m.ids[0], 10);
    m.len[0] = 10;
    int n9[1] = {9};
    if (st == FLASHCL_SUCCESS)
        st = fp8_append(ctx, &m, 1, s0, n9);
    snprintf(what, sizeof what, "%s: truncate, then append over the dropped rows", f);
    expect(st == FLASHCL_SUCCESS && fp8_bytes_match(ctx, &m), what, &failures);
    snprintf(what, sizeof what, "%s: attention after truncation", f);
    fp8_attend(ctx, m.cache, 2, m.ids, ones, hk * 3, 1, 0, what, NULL);
    /* Exhaustion: an append needing more pages than are free changes nothing. */
    int tables[2][16], counts[2];
    for (int i = 0; i < 2; ++i)
        flashcl_kv_cache_page_table(m.cache, m.ids[i], tables[i], 16, &counts[i]);
    const int free1 = flashcl_kv_cache_free_pages(m.cache);
    int both[2] = {0, 1}, many[2] = {3, ps * (free1 + 1)}; /* one page more than is free */
    st = fp8_append(ctx, &m, 2, both, many);
    int same = flashcl_kv_cache_free_pages(m.cache) == free1;
    for (int i = 0; i < 2; ++i) {
        int t[16], c;
        flashcl_kv_cache_page_table(m.cache, m.ids[i], t, 16, &c);
        same &= c == counts[i] && !memcmp(t, tables[i], (size_t)c * sizeof(int));
    }
    snprintf(what, sizeof what, "%s: out of pages: error, every sequence and its bytes unchanged", f);
    expect(st == FLASHCL_ERROR_OUT_OF_PAGES && same && fp8_bytes_match(ctx, &m), what, &failures);
    fp8_free(&m);
}

/* A continuous-batching run through the scheduler on an FP8 cache: every
 * step appends what it planned and attends (prefill chunks causal, decodes
 * one query), checked against host_ref over the pools' bytes. */
static void scheduler_suite(flashcl_context *ctx) {
    fp8_mirror m;
    fp8_init(&m, ctx, FLASHCL_FLOAT16, FLASHCL_FLOAT8_E4M3, 2, 32, 4, 14, 0);
    flashcl_scheduler *sched = NULL;
    flashcl_scheduler_desc sd = {FLASHCL_SCHEDULE_CONTINUOUS, 3, 10, 0};
    int ok = flashcl_scheduler_create(m.cache, &sd, &sched) == FLASHCL_SUCCESS;
    const int prompts[4] = {9, 3, 14, 6}, news[4] = {3, 4, 2, 3};
    for (int r = 0; ok && r < 4; ++r)
        ok = flashcl_scheduler_add(sched, r, prompts[r], news[r]) == FLASHCL_SUCCESS;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, next_seed());
    int finished = 0, steps = 0, checked = 0;
    while (ok && finished < 4 && steps++ < 100) {
        flashcl_schedule s;
        if (flashcl_scheduler_step(sched, &s) != FLASHCL_SUCCESS || s.num_seqs < 1 || s.num_seqs > MAX_SEQS) {
            ok = 0;
            break;
        }
        const size_t el = (size_t)s.total_tokens * m.row;
        uint16_t *k = test_xmalloc(el * 2), *v = test_xmalloc(el * 2);
        fp8_fill(&rng, &m, k, (size_t)s.total_tokens, m.k_scales);
        fp8_fill(&rng, &m, v, (size_t)s.total_tokens, m.v_scales);
        cl_mem bk = test_upload(ctx, k, el * 2), bv = test_upload(ctx, v, el * 2);
        ok = flashcl_kv_cache_append(m.cache, s.num_seqs, s.seq_ids, s.num_tokens, bk, NULL, bv, NULL, NULL) ==
             FLASHCL_SUCCESS;
        clFinish(flashcl_context_cl_queue(ctx));
        clReleaseMemObject(bk), clReleaseMemObject(bv);
        free(k), free(v);
        for (int i = 0; ok && i < s.num_seqs; ++i)
            ok = flashcl_kv_cache_length(m.cache, s.seq_ids[i]) == s.context[i] + s.num_tokens[i];
        char what[96];
        snprintf(what, sizeof what, "scheduler on an FP8 cache: step %d (%d sequences)", steps, s.num_seqs);
        if (ok)
            ok = fp8_attend(ctx, m.cache, s.num_seqs, s.seq_ids, s.num_tokens, 2 * 4, 0, 0, what, NULL), ++checked;
        int produced[MAX_SEQS], fin[MAX_SEQS], nf = 0;
        for (int i = 0; i < s.num_seqs; ++i)
            produced[i] = 1;
        if (ok && flashcl_scheduler_complete(sched, produced, fin, &nf) != FLASHCL_SUCCESS)
            ok = 0;
        finished += nf;
    }
    flashcl_scheduler_destroy(sched);
    char what[96];
    snprintf(what, sizeof what, "scheduler on an FP8 cache: 4 requests finished in %d steps, every step right", steps);
    expect(ok && finished == 4 && checked == steps && flashcl_kv_cache_free_pages(m.cache) == 14, what, &failures);
    fp8_free(&m);
}

/* ---- invalid arguments ------------------------------------------------------------------- */

static void expect_refused(flashcl_context *ctx, const flashcl_kv_cache_desc *d, const char *what) {
    flashcl_kv_cache *c = (flashcl_kv_cache *)&failures; /* not NULL: create must clear it */
    flashcl_status st = flashcl_kv_cache_create(ctx, d, &c);
    char line[300];
    snprintf(line, sizeof line, "%s refused (%s)", what, flashcl_last_error(ctx));
    expect(st == FLASHCL_ERROR_INVALID_ARGUMENT && !c && flashcl_last_error(ctx)[0], line, &failures);
    if (st == FLASHCL_SUCCESS)
        flashcl_kv_cache_destroy(c);
}

static void errors_suite(flashcl_context *ctx) {
    float one[2] = {1.0f, 1.0f}, zero[2] = {1.0f, 0.0f}, neg[2] = {-0.5f, 1.0f}, nan2[2] = {1.0f, NAN},
          inf2[2] = {INFINITY, 1.0f}, tiny[2] = {1.0f, 1e-39f};
    flashcl_kv_cache_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = FLASHCL_FLOAT16;
    d.heads_k = 2;
    d.head_dim = 32;
    d.page_size = 4;
    d.num_pages = 4;
    d.page_dtype = FLASHCL_FLOAT8_E4M3;
    d.k_scales = d.v_scales = one;
    flashcl_kv_cache_desc bad = d;
    bad.page_dtype = (flashcl_dtype)9;
    expect_refused(ctx, &bad, "page_dtype 9");
    bad.dtype = FLASHCL_FLOAT32;
    bad.page_dtype = FLASHCL_FLOAT16; /* neither dtype nor FP8 */
    expect_refused(ctx, &bad, "page_dtype float16 for a float32 cache");
    bad = d;
    bad.dtype = FLASHCL_FLOAT8_E5M2;
    expect_refused(ctx, &bad, "FP8 pages with an FP8 dtype");
    bad = d;
    bad.v_scales = zero;
    expect_refused(ctx, &bad, "v scale 0");
    bad = d;
    bad.k_scales = neg;
    expect_refused(ctx, &bad, "k scale -0.5");
    bad = d;
    bad.k_scales = nan2;
    expect_refused(ctx, &bad, "k scale NaN");
    bad = d;
    bad.v_scales = inf2;
    expect_refused(ctx, &bad, "v scale inf");
    bad = d;
    bad.k_scales = tiny;
    expect_refused(ctx, &bad, "k scale 1e-39 (its inverse overflows)");

    /* A good FP8 cache: its desc keeps the cache's own copies of the scales. */
    float mine[2] = {0.25f, 3.0f};
    d.k_scales = mine;
    d.v_scales = NULL;
    flashcl_kv_cache *c = NULL;
    flashcl_status st = flashcl_kv_cache_create(ctx, &d, &c);
    mine[0] = 99.0f;
    const flashcl_kv_cache_desc *got = st == FLASHCL_SUCCESS ? flashcl_kv_cache_get_desc(c) : NULL;
    expect(got && got->page_dtype == FLASHCL_FLOAT8_E4M3 && got->k_scales != mine && got->k_scales[0] == 0.25f &&
               got->k_scales[1] == 3.0f && got->v_scales && got->v_scales[0] == 1.0f && got->v_scales[1] == 1.0f,
           "get_desc: the cache's own scale copies (NULL v scales read as 1)", &failures);
    if (!c)
        return;
    int seq;
    flashcl_kv_cache_add_sequence(c, &seq);
    uint16_t kv[2 * 2 * 32] = {0};
    cl_mem bkv = test_upload(ctx, kv, sizeof kv);
    int two = 2;
    flashcl_kv_cache_append(c, 1, &seq, &two, bkv, NULL, bkv, NULL, NULL);
    const int cu[2] = {0, 1};
    uint16_t out_host[4 * 32];
    for (int i = 0; i < 4 * 32; ++i)
        out_host[i] = 0x7e00; /* NaN: the poison must survive a refused call */
    cl_mem bq = test_upload(ctx, out_host, sizeof out_host), bo = test_upload(ctx, out_host, sizeof out_host);
    /* Paged attention with an FP8 desc dtype: the desc's dtype is the cache's (f16). */
    flashcl_varlen_desc vd = test_varlen_desc(FLASHCL_FLOAT8_E4M3, 1, 4, 2, 32, cu, NULL);
    st = flashcl_paged_attention(ctx, &vd, c, &seq, bq, bo, NULL, 0, NULL, NULL);
    char line[300];
    snprintf(line, sizeof line, "paged attention with dtype e4m3 refused (%s)", flashcl_last_error(ctx));
    expect(st != FLASHCL_SUCCESS && flashcl_last_error(ctx)[0], line, &failures);
    /* Varlen with FP8 K/V: refused, its K/V are the caller's tensors in dtype. */
    const int cuk[2] = {0, 2};
    vd = test_varlen_desc(FLASHCL_FLOAT8_E4M3, 1, 4, 2, 32, cu, cuk);
    st = flashcl_varlen_forward(ctx, &vd, bq, bkv, bkv, bo, NULL, 0, NULL, NULL);
    snprintf(line, sizeof line, "varlen forward with dtype e4m3 refused (%s)", flashcl_last_error(ctx));
    expect(st == FLASHCL_ERROR_INVALID_ARGUMENT && flashcl_last_error(ctx)[0], line, &failures);
    /* The tensor-core decode kernel, asked for where it does not read FP8
     * pages (anything but NVIDIA sm_89+; there "mma" runs it), is refused
     * with a message, never run on bytes it would read as halves. */
    const char *env = getenv("FLASHCL_DECODE_PARAMS");
    char saved[256];
    snprintf(saved, sizeof saved, "%s", env ? env : "");
    if (!mma_reads_fp8(ctx)) {
        setenv("FLASHCL_DECODE_PARAMS", "KERNEL=mma", 1);
        vd = test_varlen_desc(FLASHCL_FLOAT16, 1, 4, 2, 32, cu, NULL);
        st = flashcl_paged_attention(ctx, &vd, c, &seq, bq, bo, NULL, 0, NULL, NULL);
        snprintf(line, sizeof line, "KERNEL=mma with FP8 pages refused (%s)", flashcl_last_error(ctx));
        expect(st == FLASHCL_ERROR_INVALID_PARAMS && strstr(flashcl_last_error(ctx), "FP8"), line, &failures);
    }
    if (env)
        setenv("FLASHCL_DECODE_PARAMS", saved, 1);
    else
        unsetenv("FLASHCL_DECODE_PARAMS");
    uint16_t back[4 * 32];
    test_download(ctx, bo, back, sizeof back);
    expect(!memcmp(back, out_host, sizeof back), "refused calls leave the output untouched", &failures);
    clReleaseMemObject(bq), clReleaseMemObject(bo), clReleaseMemObject(bkv);
    flashcl_kv_cache_destroy(c);
}

/* Whether FLASHCL_DECODE_PARAMS=KERNEL=mma is taken for float16 queries over e4m3 pages
 * (the variable is left as it was). */
static int mma_reads_fp8(flashcl_context *ctx) {
    const char *env = getenv("FLASHCL_DECODE_PARAMS");
    char saved[256];
    snprintf(saved, sizeof saved, "%s", env ? env : "");
    setenv("FLASHCL_DECODE_PARAMS", "KERNEL=mma", 1);
    fp8_mirror m;
    fp8_init(&m, ctx, FLASHCL_FLOAT16, FLASHCL_FLOAT8_E4M3, 1, 64, 16, 4, 0);
    int slot = 0, one = 1, cu[2] = {0, 1};
    flashcl_kv_cache_add_sequence(m.cache, &m.ids[0]);
    flashcl_varlen_desc d = test_varlen_desc(FLASHCL_FLOAT16, 1, 4, 1, 64, cu, NULL);
    flashcl_params p;
    int ok = fp8_append(ctx, &m, 1, &slot, &one) == FLASHCL_SUCCESS &&
             flashcl_serving_params(ctx, &d, m.cache, &m.ids[0], &p, NULL) == FLASHCL_SUCCESS &&
             !strncmp(p.variant, "decode-mma", 10);
    fp8_free(&m);
    if (env)
        setenv("FLASHCL_DECODE_PARAMS", saved, 1);
    else
        unsetenv("FLASHCL_DECODE_PARAMS");
    return ok;
}

/* Decoding (one query a sequence) over FP8 pages on the tensor-core kernel: one kv head a
 * work-group (always REG_COPY's loop over FP8), a warp a kv head (HEAD_GROUP), and several
 * warps a head (HEAD_WARPS), in 32-key tiles (HG_WIDE: the default at D=64 and 128) and in
 * 16-key ones (the default at D=96, HG_KEYS=16 at D=64 and 128); e4m3 and e5m2, head dims 32
 * to 128. */
static void mma_suite(flashcl_context *ctx) {
    const int mma = mma_reads_fp8(ctx);
    if (!mma) {
        printf("no tensor-core decode kernel for FP8 pages here: its shapes run on the default kernel\n");
        unsetenv("FLASHCL_DECODE_PARAMS");
    }
    static const struct {
        flashcl_dtype fmt;
        int hk, group, d, ps, long_len;
        const char *forms; /* FLASHCL_DECODE_PARAMS values, ';'-separated */
        const char *name;
        float softcap; /* scores s -> softcap tanh(s / softcap); 0: none */
    } shapes[] = {
        {FLASHCL_FLOAT8_E4M3, 2, 4, 64, 16, 300,
         "KERNEL=mma;KERNEL=mma,HEAD_GROUP=2;KERNEL=mma,HEAD_GROUP=2,HG_KEYS=16;"
         "KERNEL=mma,HEAD_GROUP=2,HEAD_WARPS=2,HG_KEYS=32",
         "e4m3 D64 page 16, GQA 4", 0.0f},
        {FLASHCL_FLOAT8_E5M2, 2, 4, 128, 32, 1000, "KERNEL=mma;KERNEL=mma,HEAD_GROUP=1,HEAD_WARPS=8;"
         "KERNEL=mma,HEAD_GROUP=1,HEAD_WARPS=8,HG_KEYS=16",
         "e5m2 D128 page 32, GQA 4", 0.0f},
        {FLASHCL_FLOAT8_E4M3, 1, 8, 128, 7, 700, "KERNEL=mma;KERNEL=mma,HEAD_GROUP=1,HEAD_WARPS=4;"
         "KERNEL=mma,HEAD_GROUP=1,HEAD_WARPS=4,HG_KEYS=16",
         "e4m3 D128 page 7, GQA 8", 0.0f},
        {FLASHCL_FLOAT8_E4M3, 2, 2, 32, 5, 200, "KERNEL=mma", "e4m3 D32 page 5, GQA 2", 0.0f},
        {FLASHCL_FLOAT8_E4M3, 2, 4, 96, 16, 500, "KERNEL=mma;KERNEL=mma,HEAD_GROUP=2", "e4m3 D96 page 16, GQA 4", 0.0f},
        /* 32-key tiles of four pages (a table read a load), and HEAD_GROUP's 16-key ones of two */
        {FLASHCL_FLOAT8_E4M3, 2, 4, 64, 8, 400, "KERNEL=mma;KERNEL=mma,HEAD_GROUP=2;KERNEL=mma,HEAD_GROUP=2,HG_KEYS=16",
         "e4m3 D64 page 8, GQA 4", 0.0f},
        /* a soft-cap of 2 (scores of order one: tanh bends them), every kernel form at D=128 */
        {FLASHCL_FLOAT8_E4M3, 2, 4, 128, 16, 300,
         "KERNEL=mma;KERNEL=mma,HEAD_GROUP=1,HEAD_WARPS=8;KERNEL=mma,HEAD_GROUP=1,HEAD_WARPS=8,HG_KEYS=16",
         "e4m3 D128 page 16, GQA 4, softcap 2", 2.0f},
        /* 32-key tiles inside 64-token pages (a tile's rows from its page's entry and offset) */
        {FLASHCL_FLOAT8_E4M3, 2, 4, 128, 64, 600, "KERNEL=mma;KERNEL=mma,HEAD_GROUP=2,HEAD_WARPS=4",
         "e4m3 D128 page 64, GQA 4", 0.0f},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
        char forms[256], tag[256];
        snprintf(forms, sizeof forms, "%s", shapes[i].forms);
        attend_softcap = shapes[i].softcap;
        for (char *f = strtok(forms, ";"); f; f = strtok(NULL, ";")) {
            if (mma)
                setenv("FLASHCL_DECODE_PARAMS", f, 1);
            snprintf(tag, sizeof tag, "%s: f16 queries, %s", mma ? f : "mma shapes, default kernel", shapes[i].name);
            paged_suite(ctx, FLASHCL_FLOAT16, shapes[i].fmt, shapes[i].hk, shapes[i].group, shapes[i].d,
                        shapes[i].ps, shapes[i].long_len, 0, tag);
            if (!mma)
                break;
        }
    }
    attend_softcap = 0.0f;
    unsetenv("FLASHCL_DECODE_PARAMS");
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : "all";
    flashcl_context *ctx = test_context();
    test_seed();
    if (!strcmp(only, "oclgrind")) {
        /* Tiny shapes for Oclgrind: quantizing appends, decode with and
         * without splits, prompt chunks, fork and copy-on-write. */
        paged_suite(ctx, FLASHCL_FLOAT16, FLASHCL_FLOAT8_E4M3, 1, 2, 16, 4, 9, 1, "oclgrind: f16 e4m3 D16 page 4");
        paged_suite(ctx, FLASHCL_FLOAT32, FLASHCL_FLOAT8_E5M2, 1, 2, 16, 4, 9, 0, "oclgrind: f32 e5m2 D16 page 4");
        flashcl_context_destroy(ctx);
        return test_summary(failures);
    }
    if (!strcmp(only, "mma")) {
        mma_suite(ctx);
        flashcl_context_destroy(ctx);
        return test_summary(failures);
    }
    const int decode = !strcmp(only, "decode");
    if (decode) /* the memory-bound decode kernel, where the database picks the tiled one (CPUs) */
        setenv("FLASHCL_DECODE_PARAMS", "KERNEL=decode", 1);
    const char *k = decode ? "decode kernel" : "default kernel";
    char tag[96];
    /* On the decode kernel, decoding only: each of its builds takes PoCL
     * 15-35 s, and prompts through it read K/V as decoding does. */
    snprintf(tag, sizeof tag, "%s: f16 queries, e4m3, D64, GQA 8/2, page 16", k);
    paged_suite(ctx, FLASHCL_FLOAT16, FLASHCL_FLOAT8_E4M3, 2, 4, 64, 16, 150, !decode, tag);
    snprintf(tag, sizeof tag, "%s: bf16 queries, e5m2, D32, GQA 8/2, page 5", k);
    paged_suite(ctx, FLASHCL_BFLOAT16, FLASHCL_FLOAT8_E5M2, 2, 4, 32, 5, 90, !decode, tag);
    if (!decode) {
        snprintf(tag, sizeof tag, "%s: f32 queries, e4m3, D48, GQA 3/1, page 7", k);
        paged_suite(ctx, FLASHCL_FLOAT32, FLASHCL_FLOAT8_E4M3, 1, 3, 48, 7, 70, 1, tag);
        dense_equals_paged(ctx);
        lifecycle_suite(ctx, FLASHCL_FLOAT8_E4M3);
        lifecycle_suite(ctx, FLASHCL_FLOAT8_E5M2);
        scheduler_suite(ctx);
        errors_suite(ctx);
    }
    flashcl_context_destroy(ctx);
    return test_summary(failures);
}
