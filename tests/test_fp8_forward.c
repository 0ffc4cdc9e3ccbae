/* test_fp8_forward.c: the FP8 forward (q, k, v FP8 with descale factors); the quantize helpers
 * and their options are tests/test_fp8.c's.
 *
 * 1. Kernels against host_ref: fresh random FP8 bytes and descale factors
 *    (distinct per head and per row block, so a wrong index fails), the
 *    reference computed in double from the same decoded values times the
 *    same factors, so only the kernel's own error is measured; outputs
 *    poisoned before each call, NaN never passes. e4m3 and e5m2, out
 *    float32/float16/bfloat16, per-tensor, per-head and block factors, NULL
 *    factors, GQA, causal, windows, odd lengths, head_dim 40, 64, 128,
 *    scores of thousands of bits beside ordinary ones (boost), packed and padded layouts (offsets, strides with gaps that must stay), on
 *    the cpu and portable kernels (FLASHCL_PARAMS) and a host context.
 *    On compute capability 9.0, the FP8 warpgroup-MMA kernel (nv-wgmma-fp8,
 *    the default there for 16-bit outputs) on its own cases, with bounds for its e4m3 P and its MMA's
 *    truncating accumulator (below), and 32768-key rows checked for an
 *    output shrunk by that accumulator; elsewhere, that asking for it is
 *    refused with outputs untouched.
 * 2. Refusals: FP8 out, block_rows without per_head, a bad factor, the
 *    backward and varlen given FP8, Hadamard on a head_dim that is not a
 *    power of two: each an error with outputs untouched.
 * 3. The V transpose the FP8 warpgroup-MMA forward reads (cl/fp8_vt_pack.cl,
 *    plain OpenCL C) on every device, against a host transpose in the
 *    forward's P order.
 * 4. Accuracy as FlashAttention-3 measured it, at a small size (B=1, H=8,
 *    N=512, D=128; bench/fp8_accuracy.c runs the full one): N(0,1)
 *    inputs with 0.1% outliers from N(0,10^2), quantized by the library's
 *    own helpers per tensor, per head and 64-row block, and block plus
 *    Hadamard; RMSE against float64 attention on the unquantized inputs.
 * 5. ex2_fma (cl/common.cl), the FP8 forward's optional exponent off the SFU,
 *    on the device against exp2 in double.
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcl.h"
#include "flashcl_ref.h"
#include "harness.h"
#include "internal.h" /* the device's compute capability, for nv-wgmma-fp8 */

static int failures;

typedef struct fp8_case {
    flashcl_dtype format, out_dtype;
    int batch, heads_q, heads_k, seqlen_q, seqlen_k, head_dim;
    int causal, windowed, window_left, window_right;
    int scales;     /* 0 per tensor, 1 per head, 2 per block of block_rows, 3 NULL arrays */
    int block_rows; /* scales 2 */
    float softcap;
    int padded;     /* nonzero: every tensor at an offset, with padded strides */
    /* nonzero: q's factors at indices 1, 5, 9... (heads or row blocks) set to this, so that those
     * rows' scores reach thousands of bits, past where the FP8 kernel's softmax folds m sc into
     * one fma (SOFTMAX_EXPS_BIASED, cl/common_nv.cl), beside rows that stay below */
    float boost;
    /* nonzero (with scales 2): k's factors of every key block from key 128 on (the FP8 kernel's
     * second tile) set to this, so that rows whose first tile is ordinary leap by hundreds of
     * bits in a later one: what a softmax keeping a stale max must notice (docs/perf-notes-fp8.md,
     * "Exponents against the running max") */
    float k_boost;
} fp8_case;

/* A padded layout for (seqlen, heads, head_dim) rows: gaps after each head,
 * row and batch, and an offset; *span: the elements it covers. */
static flashcl_layout padded_layout(int batch, int seqlen, int heads, int head_dim, size_t *span) {
    flashcl_layout l;
    l.offset = 5;
    l.stride_head = (size_t)head_dim + 3;
    l.stride_seq = (size_t)heads * l.stride_head + 1;
    l.stride_batch = (size_t)seqlen * l.stride_seq + 7;
    *span = l.offset + (size_t)batch * l.stride_batch;
    return l;
}

/* Where packed element i of (seqlen, heads, head_dim) rows lives in layout l. */
static size_t at(const flashcl_layout *l, int seqlen, int heads, int head_dim, size_t i) {
    const size_t d = i % (size_t)head_dim, h = i / (size_t)head_dim % (size_t)heads;
    const size_t s = i / ((size_t)head_dim * heads) % (size_t)seqlen, b = i / ((size_t)head_dim * heads * seqlen);
    return l->offset + b * l->stride_batch + s * l->stride_seq + h * l->stride_head + d;
}

static const char *dtype_name(flashcl_dtype d) {
    static const char *const n[] = {"f32", "f16", "bf16", "e4m3", "e5m2"};
    return (unsigned)d < 5 ? n[d] : "?";
}

/* Random FP8 bytes: N(0, sd) encoded (finite codes only). */
static void fill_fp8(flashcl_ref_rng *rng, flashcl_dtype f, unsigned char *x, size_t n, double sd) {
    for (size_t i = 0; i < n; ++i)
        x[i] = flashcl_fp8_encode(f, (float)(sd * flashcl_ref_rng_normal(rng)));
}

/* Factors in [0.25, 2): distinct enough that a wrong index shows. */
static float *random_factors(flashcl_ref_rng *rng, size_t n) {
    float *s = test_xmalloc(n * sizeof *s);
    for (size_t i = 0; i < n; ++i)
        s[i] = (float)(0.25 + 1.75 * flashcl_ref_rng_uniform(rng));
    return s;
}

/* Per LSE row ([batch][head][query]), the largest sum_i |q_i k_i| over the row's visible keys,
 * scaled as the score is (the reference's scores over |q| and |k|, sign bits cleared; 0 for a row
 * that sees no key): what bounds the error of a score summed with a relative precision u, and so
 * of the LSE, an average of the row's scores. Caller frees. */
static double *row_abs_sums(const flashcl_attention_desc *r, const unsigned char *q, const unsigned char *k,
                            size_t span_q, size_t span_k) {
    const size_t nk = (size_t)r->seqlen_k, n = (size_t)r->batch * r->heads_q * r->seqlen_q;
    unsigned char *qa = test_xmalloc(span_q), *ka = test_xmalloc(span_k);
    for (size_t i = 0; i < span_q; ++i)
        qa[i] = q[i] & 0x7f;
    for (size_t i = 0; i < span_k; ++i)
        ka[i] = k[i] & 0x7f;
    flashcl_attention_desc a = *r;
    a.softcap = 0.0f; /* the sum before any cap */
    double *scores = test_xmalloc(n * nk * sizeof *scores), *out = test_xmalloc(n * (size_t)r->head_dim * sizeof *out);
    double *sums = test_xmalloc(n * sizeof *sums);
    flashcl_ref_attention_forward(&a, qa, ka, ka, out, NULL, scores, NULL); /* k for v: out is not read */
    for (size_t i = 0; i < n; ++i) {
        sums[i] = 0.0;
        for (size_t j = 0; j < nk; ++j)
            if (isfinite(scores[i * nk + j]))
                sums[i] = fmax(sums[i], scores[i * nk + j]);
    }
    free(qa), free(ka), free(scores), free(out);
    return sums;
}

/* Where run_fp8_case leaves its out and lse, when `on` and the call succeeded (the caller frees
 * them): the two-warpgroup shape of the wgmma kernel is held bitwise to the one-warpgroup shape's
 * results on the same inputs. */
static struct {
    int on;
    void *out;
    float *lse;
    size_t out_bytes, nlse;
} captured;

/* Runs one case on ctx (variant NULL: the device's choice, else forced by
 * FLASHCL_PARAMS) and checks out and lse against host_ref. */
static void run_fp8_case(flashcl_context *ctx, const char *where, const char *variant, const fp8_case *c, uint64_t seed) {
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    flashcl_attention_desc d = test_attention_desc(c->format, c->batch, c->heads_q, c->heads_k, c->seqlen_q,
                                                   c->seqlen_k, c->head_dim);
    d.out_dtype = c->out_dtype;
    d.causal = c->causal;
    d.windowed = c->windowed;
    d.window_left = c->window_left;
    d.window_right = c->window_right;
    d.softcap = c->softcap;
    const size_t nq = (size_t)c->batch * c->seqlen_q * c->heads_q * c->head_dim;
    const size_t nk = (size_t)c->batch * c->seqlen_k * c->heads_k * c->head_dim;
    size_t span_q = nq, span_k = nk, span_o = nq; /* elements each array holds */
    if (c->padded) {
        d.q = padded_layout(c->batch, c->seqlen_q, c->heads_q, c->head_dim, &span_q);
        d.out = padded_layout(c->batch, c->seqlen_q, c->heads_q, c->head_dim, &span_o);
        d.k = d.v = padded_layout(c->batch, c->seqlen_k, c->heads_k, c->head_dim, &span_k);
    }
    unsigned char *q = test_xmalloc(span_q), *k = test_xmalloc(span_k), *v = test_xmalloc(span_k);
    fill_fp8(&rng, c->format, q, span_q, 1.0);
    fill_fp8(&rng, c->format, k, span_k, 1.0);
    fill_fp8(&rng, c->format, v, span_k, 1.0);
    float *qs = NULL, *ks = NULL, *vs = NULL;
    if (c->scales != 3) {
        d.fp8.per_head = c->scales >= 1;
        d.fp8.block_rows = c->scales == 2 ? c->block_rows : 0;
        const size_t bq = c->scales == 2 ? (size_t)(c->seqlen_q + c->block_rows - 1) / c->block_rows : 1;
        const size_t bk = c->scales == 2 ? (size_t)(c->seqlen_k + c->block_rows - 1) / c->block_rows : 1;
        const size_t hq = c->scales ? (size_t)c->batch * c->heads_q : 1, hk = c->scales ? (size_t)c->batch * c->heads_k : 1;
        d.fp8.q_descale = qs = random_factors(&rng, hq * bq);
        for (size_t i = 1; c->boost > 0.0f && i < hq * bq; i += 4)
            qs[i] = c->boost;
        d.fp8.k_descale = ks = random_factors(&rng, hk * bk);
        for (size_t i = 0; c->k_boost > 0.0f && i < hk * bk; ++i)
            if ((i % bk) * (size_t)c->block_rows >= 128) /* i % bk: the key block within (b, h) */
                ks[i] = c->k_boost;
        d.fp8.v_descale = vs = random_factors(&rng, hk);
    }
    const size_t es = flashcl_dtype_size(c->out_dtype), nlse = (size_t)c->batch * c->heads_q * c->seqlen_q;
    void *out = test_xmalloc(span_o * es);
    float *lse = test_xmalloc(nlse * sizeof *lse);
    flashcl_ref_poison(out, c->out_dtype, span_o);
    flashcl_ref_poison(lse, FLASHCL_FLOAT32, nlse);
    char env[64] = "";
    if (variant)
        snprintf(env, sizeof env, "VARIANT=%s", variant), setenv("FLASHCL_PARAMS", env, 1);
    const flashcl_status st = flashcl_attention_forward_host(ctx, &d, q, k, v, out, lse);
    if (variant)
        unsetenv("FLASHCL_PARAMS");

    char what[320];
    snprintf(what, sizeof what,
             "%s%s%s: %s -> %s, B%d Hq%d Hk%d %dx%d D%d%s%s, %s factors%s", where, variant ? " " : "",
             variant ? variant : "", dtype_name(c->format), dtype_name(c->out_dtype), c->batch, c->heads_q,
             c->heads_k, c->seqlen_q, c->seqlen_k, c->head_dim, c->causal ? " causal" : "",
             c->windowed ? (c->padded ? " window padded" : " window") : c->padded ? " padded" : "",
             (const char *const[]){"per-tensor", "per-head", "block", "NULL"}[c->scales],
             c->softcap > 0 ? " softcap" : "");
    if (test_cpu_refused_on_rusticl(ctx, variant, st)) {
        /* refused there by design: then it must have written nothing */
        void *fresh = test_xmalloc(span_o * es);
        float *fresh_lse = test_xmalloc(nlse * sizeof *fresh_lse);
        flashcl_ref_poison(fresh, c->out_dtype, span_o);
        flashcl_ref_poison(fresh_lse, FLASHCL_FLOAT32, nlse);
        strncat(what, ": refused on rusticl, out and lse untouched",
                sizeof what - strlen(what) - 1);
        expect(!memcmp(out, fresh, span_o * es) && !memcmp(lse, fresh_lse, nlse * sizeof *lse),
               what, &failures);
        free(fresh), free(fresh_lse);
    } else if (st != FLASHCL_SUCCESS) {
        printf("  %s: %s\n", flashcl_status_string(st), flashcl_last_error(ctx));
        expect(0, what, &failures);
    } else {
        flashcl_attention_desc r = d;
        flashcl_attention_desc_resolve(&r);
        const int p_e4m3 = variant && !strncmp(variant, "nv-wgmma-fp8", 12);
        const int B = c->batch, Hq = c->heads_q, Nq = c->seqlen_q, Nk = c->seqlen_k, D = c->head_dim;
        double *ref = test_xmalloc(nq * sizeof *ref), *ref_lse = test_xmalloc(nlse * sizeof *ref_lse);
        double *probs = p_e4m3 ? test_xmalloc((size_t)B * Hq * Nq * Nk * sizeof *probs) : NULL;
        flashcl_ref_attention_forward(&r, q, k, v, ref, ref_lse, NULL, probs);
        /* The wgmma kernel rounds 256 e to e4m3 before P V, e = 2^((s - m) c)
         * against the running max m (P = e / l at the end). Where 256 e is a
         * normal e4m3 (e >= 2^-14, which holds wherever the normalised p =
         * e_final / l >= 2^-14, since e >= e_final >= p) it carries a relative
         * error of at most 2^-4, so out moves by at most 2^-4 sum_i p_i |v_i|:
         * attention over |v| (sign bits cleared) times 2^-4. Below, a subnormal
         * or zero code is off by at most 2^-10 / 256 = 2^-18 in e, so by at
         * most 2^-18 |v_i| in out (l >= 1): summed over the keys with p_i <
         * 2^-14, from the reference's probabilities. The LSE does not see P's
         * rounding and keeps its tolerance. p_err[i]: that allowance. */
        double *p_err = NULL;
        double *abs_sums = p_e4m3 ? row_abs_sums(&r, q, k, span_q, span_k) : NULL; /* for the LSE, below */
        if (p_e4m3) {
            unsigned char *v_abs = test_xmalloc(span_k);
            for (size_t i = 0; i < span_k; ++i)
                v_abs[i] = v[i] & 0x7f;
            p_err = test_xmalloc(nq * sizeof *p_err);
            flashcl_ref_attention_forward(&r, q, k, v_abs, p_err, NULL, NULL, NULL); /* sum_i p_i |v_i| */
            for (int b = 0; b < B; ++b)
                for (int n = 0; n < Nq; ++n)
                    for (int h = 0; h < Hq; ++h) {
                        const int hk = h / (Hq / c->heads_k);
                        const double *pr = probs + (((size_t)b * Hq + h) * Nq + n) * Nk;
                        for (int e = 0; e < D; ++e) {
                            double sub = 0.0;
                            for (int j = 0; j < Nk; ++j)
                                if (pr[j] < 0x1p-14) {
                                    const size_t vi = at(&r.v, Nk, c->heads_k, D,
                                                         (((size_t)b * Nk + j) * c->heads_k + hk) * D + e);
                                    sub += fabs(flashcl_ref_fp8_decode(c->format, v[vi]) *
                                                flashcl_ref_fp8_descale(&r, 2, b, hk, j));
                                }
                            double *pe = &p_err[(((size_t)b * Nq + n) * Hq + h) * D + e];
                            /* Boosted rows: the MMA's truncation (below, the LSE's tolerance:
                             * 2^-14 of the row's sum |q||k| x scale a score) becomes tenths of a
                             * unit in scores of thousands, so p moves by up to e^(2 x that) where
                             * two keys nearly tie. */
                            const double trunc =
                                c->boost > 0.0f || c->k_boost > 0.0f
                                    ? expm1(0x1p-13 * abs_sums[((size_t)b * Hq + h) * Nq + n])
                                    : 0.0;
                            *pe = (0x1p-4 * 1.01 + trunc) * *pe + 0x1p-18 * sub;
                        }
                    }
            free(v_abs);
        }
        free(probs);
        /* Tolerance: out's own rounding (a unit roundoff of its type, relative)
         * plus what float32 accumulation costs (a few 2^-24 of the largest
         * output, ordinary scores' size and the key count folded into 2e-5).
         * Scores of thousands (the boost cases) round in float32 by |S| 2^-24
         * each, which moves every p by as much relative: a few |S| 2^-24 of the
         * largest output more, |S| the row's LSE (its max score within ln Nk). */
        const double eps = c->out_dtype == FLASHCL_FLOAT32 ? 0x1p-24 : c->out_dtype == FLASHCL_FLOAT16 ? 0x1p-11 : 0x1p-8;
        double amax = 0;
        for (size_t i = 0; i < nq; ++i)
            amax = fmax(amax, fabs(ref[i]));
        size_t bad = 0, bad_lse = 0, first = 0;
        double worst = 0;
        const flashcl_layout ol = r.out; /* resolved: packed strides when not padded */
        /* sum (got - ref) ref, sum ref^2 and sum (got - ref)^2: out's shift along ref and its
         * relative RMS error, for the long-row checks below */
        double along = 0.0, ref_sq = 0.0, err_sq = 0.0;
        for (size_t i = 0; i < nq; ++i) {
            const size_t o = at(&ol, c->seqlen_q, c->heads_q, c->head_dim, i);
            const double got = flashcl_ref_load(out, c->out_dtype, o), err = fabs(got - ref[i]);
            along += (got - ref[i]) * ref[i], ref_sq += ref[i] * ref[i], err_sq += (got - ref[i]) * (got - ref[i]);
            const size_t d_i = i / (size_t)c->head_dim, row = d_i / (size_t)Hq / (size_t)Nq * Hq * Nq +
                                                               d_i % (size_t)Hq * Nq + d_i / (size_t)Hq % (size_t)Nq;
            const double big = isfinite(ref_lse[row]) ? 0x1p-21 * fabs(ref_lse[row]) * fmax(1.0, amax) : 0.0;
            if (!(err <= 2.0 * eps * fabs(ref[i]) + 2e-5 * fmax(1.0, amax) + big + (p_err ? p_err[i] : 0.0))) {
                if (!bad++)
                    first = i;
            }
            worst = fmax(worst, isnan(err) ? INFINITY : err);
        }
        /* The LSE's tolerance. The FP8 warpgroup MMA does not sum in float32: it aligns a k-step's
         * products to the largest and keeps 14 bits of each (DeepSeek-V3's report, section
         * 3.5.2), and keeps 13 mantissa bits of the accumulator it adds to (SageAttention2's
         * measurement on Ada and Hopper), both by truncation. A model of both
         * (docs/perf-notes-fp8.md, "FP8 forward on warpgroup MMA") put every score's error, and
         * so the LSE's, at most about 2^-14 of the row's largest sum |q||k| x scale; 2^-12 of it
         * is allowed on that kernel. A wrong factor or index errs by a good fraction of that sum,
         * far outside. */
        size_t worst_lse = nlse;
        for (size_t i = 0; i < nlse; ++i) {
            const double want = ref_lse[i], got = lse[i];
            const double tol = 1e-4 + 1e-5 * fabs(want) + (abs_sums ? 0x1p-12 * abs_sums[i] : 0.0);
            if (isinf(want) ? got != want : !(fabs(got - want) <= tol)) {
                ++bad_lse;
                if (worst_lse == nlse || !(fabs(got - want) <= fabs(lse[worst_lse] - ref_lse[worst_lse])))
                    worst_lse = i;
            }
        }
        if (c->boost > 0.0f) {
            /* Both forms of the softmax's exponent: rows whose max scaled score is past 1024 bits
             * (LSE > 1024 ln 2 + ln Nk) and rows well below it. */
            size_t past = 0, below = 0;
            for (size_t i = 0; i < nlse; ++i) {
                past += ref_lse[i] > 1024.0 * log(2.0) + log((double)Nk);
                below += ref_lse[i] < 600.0;
            }
            char why[sizeof what + 64];
            snprintf(why, sizeof why, "%s: %zu rows past 1024 bits, %zu below", what, past, below);
            expect(past > 0 && below > 0, why, &failures);
        }
        if (c->k_boost > 0.0f) {
            /* Rows whose max leaps past their first tile's by more than 100 bits (their first
             * 128 keys keep ordinary factors, so their first tile's max is a few units). */
            size_t leap = 0;
            for (size_t i = 0; i < nlse; ++i)
                leap += ref_lse[i] > 100.0 * log(2.0) + log((double)Nk);
            char why[sizeof what + 64];
            snprintf(why, sizeof why, "%s: %zu rows whose max leaps in a later tile", what, leap);
            expect(leap > 0, why, &failures);
        }
        /* The gaps of a padded out stay as poisoned. */
        size_t written = 0;
        for (size_t i = 0; i < span_o; ++i)
            written += !isnan(flashcl_ref_load(out, c->out_dtype, i));
        bad += written > nq ? written - nq : 0;
        if (bad)
            printf("  first bad out at %zu: %g vs %g; %zu elements written, %zu expected\n", first,
                   flashcl_ref_load(out, c->out_dtype, at(&ol, c->seqlen_q, c->heads_q, c->head_dim, first)),
                   ref[first], written, nq);
        snprintf(what + strlen(what), sizeof what - strlen(what), " (max err %.2g, %zu out / %zu lse bad)", worst, bad,
                 bad_lse);
        expect(bad == 0 && bad_lse == 0, what, &failures);
        if (p_e4m3 && Nk >= 4096) {
            /* Long rows: out not shrunk. Chained through the FP8 MMA's truncating accumulator over
             * every key tile, out shrank by 2.2 % at 32768 keys in a model, by 0.1 % added up in
             * float32 a tile at a time as the kernel does (PV_TWO_LEVEL); P's rounding alone
             * shifted it by 0.1 %. The output's tolerance above, 2^-4 of attention over |v|
             * against outputs of 1/sqrt(keys), cannot see it. */
            const double shift = ref_sq > 0.0 ? along / ref_sq : 0.0;
            char why[sizeof what + 96];
            snprintf(why, sizeof why, "%s: out not shrunk over %d keys (shift along the reference %+.4f, at most 0.005)",
                     what, Nk, shift);
            expect(fabs(shift) <= 0.005, why, &failures);
            /* And no error the shift cannot see (one uncorrelated with ref): the per-element bound
             * above is 20 times out's RMS here, the subnormal-P allowance of every small p. P's
             * e4m3 rounding gave a relative RMS error of 2.6 % in the model. */
            const double rms = ref_sq > 0.0 ? sqrt(err_sq / ref_sq) : 0.0;
            snprintf(why, sizeof why, "%s: out's relative RMS error over %d keys %.4f, at most 0.05", what, Nk, rms);
            expect(rms <= 0.05, why, &failures);
        }
        if (bad_lse) {
            /* The worst row's error over its largest sum: float32 kernels show about 2^-23, the
             * FP8 MMA's truncation 2^-14 and below, a wrong factor or index something near 2^0. */
            double *sums = abs_sums ? abs_sums : row_abs_sums(&r, q, k, span_q, span_k);
            const double err = fabs(lse[worst_lse] - ref_lse[worst_lse]), most = sums[worst_lse];
            printf("  worst lse: row %zu, %.6g against %.6g (error %.3g); largest sum |q||k| x scale of the row "
                   "%.4g, error / sum = 2^%.1f\n",
                   worst_lse, lse[worst_lse], ref_lse[worst_lse], err, most, most > 0.0 ? log2(err / most) : INFINITY);
            if (!abs_sums)
                free(sums);
        }
        free(abs_sums);
        free(ref), free(ref_lse), free(p_err);
    }
    if (captured.on && st == FLASHCL_SUCCESS) {
        captured.out = out, captured.lse = lse, captured.out_bytes = span_o * es, captured.nlse = nlse;
        out = NULL, lse = NULL;
    }
    free(q), free(k), free(v), free(qs), free(ks), free(vs), free(out), free(lse);
}

static const fp8_case cases[] = {
    /* format, out, B, Hq, Hk, Nq, Nk, D, causal, windowed, wl, wr, scales, block_rows, softcap,
     * padded, boost, k_boost */
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT32, 1, 4, 2, 37, 61, 64, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT32, 2, 2, 1, 45, 45, 64, 0, 1, 7, 3, 2, 16, 0, 1, 0, 0},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT32, 1, 2, 2, 19, 70, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT32, 1, 3, 1, 33, 29, 64, 1, 0, 0, 0, 3, 0, 20.0f, 0, 0, 0},
    {FLASHCL_FLOAT8_E5M2, FLASHCL_FLOAT16, 1, 4, 1, 37, 61, 128, 1, 0, 0, 0, 2, 32, 0, 0, 0, 0},
    {FLASHCL_FLOAT8_E5M2, FLASHCL_BFLOAT16, 2, 2, 2, 17, 33, 40, 0, 1, 5, 0, 2, 7, 0, 1, 0, 0},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_BFLOAT16, 1, 2, 1, 50, 50, 40, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0},
    /* scores of thousands of bits in every fourth block of 8 rows, beside ordinary ones */
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT32, 1, 2, 1, 40, 70, 64, 0, 0, 0, 0, 2, 8, 0, 0, 300, 0},
};
#define CASES (sizeof cases / sizeof cases[0])

/* `oclgrind` mode (ctest -L oclgrind): shapes tiny enough for Oclgrind's
 * checks, still odd lengths, GQA, blocks that straddle tiles, both formats. */
static const fp8_case tiny_cases[] = {
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT32, 1, 2, 1, 9, 13, 16, 1, 0, 0, 0, 2, 4, 0, 0, 0, 0},
    {FLASHCL_FLOAT8_E5M2, FLASHCL_BFLOAT16, 1, 2, 2, 5, 7, 8, 0, 1, 2, 1, 1, 0, 0, 1, 0, 0},
};

/* The FP8 warpgroup-MMA kernel (cl/flash_fwd_sm90_fp8.cl): head dims in steps
 * of 16, 16-bit outputs, 16-byte aligned rows (so packed layouts only); odd
 * lengths, several 128-key tiles and a partial last one, GQA, causal,
 * windows, soft-cap, every kind of factors, block rows straddling tiles. */
static const fp8_case wgmma_cases[] = {
    /* format, out, B, Hq, Hk, Nq, Nk, D, causal, windowed, wl, wr, scales, block_rows, softcap,
     * padded, boost, k_boost */
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT16, 1, 4, 2, 37, 61, 64, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_BFLOAT16, 2, 2, 1, 200, 333, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {FLASHCL_FLOAT8_E5M2, FLASHCL_FLOAT16, 1, 4, 1, 150, 300, 128, 1, 0, 0, 0, 2, 64, 0, 0, 0, 0},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT16, 1, 2, 2, 70, 260, 96, 0, 1, 50, 10, 2, 16, 0, 0, 0, 0},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_BFLOAT16, 1, 3, 1, 33, 29, 64, 1, 0, 0, 0, 3, 0, 20.0f, 0, 0, 0},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT16, 3, 8, 2, 1, 515, 128, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0},
    {FLASHCL_FLOAT8_E5M2, FLASHCL_BFLOAT16, 1, 2, 1, 129, 129, 32, 1, 0, 0, 0, 2, 8, 0, 0, 0, 0},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT16, 1, 2, 2, 64, 1000, 80, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0},
    /* long rows */
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT16, 1, 2, 1, 64, 32768, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* causal, more queries than keys (bottom-right): the first 200 rows see no key, so the first
     * three blocks of 64 rows run no tile and only store zeros and LSE -inf */
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT16, 1, 2, 1, 300, 100, 64, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0},
    /* scores of thousands of bits (the softmax's exact form) in every fourth block of 8 rows, so
     * in warps beside warps of ordinary rows (which take the fma form), and in one of two heads */
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT16, 1, 2, 1, 130, 300, 64, 0, 0, 0, 0, 2, 8, 0, 0, 300, 0},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_BFLOAT16, 1, 2, 1, 100, 200, 128, 1, 0, 0, 0, 1, 0, 0, 0, 2048,
     0},
    /* several 128-row blocks over several tiles (the two-warpgroup shape's warpgroups then see
     * different tiles' keys): a window leaving some rows no key in a tile both see, and causal */
    {FLASHCL_FLOAT8_E4M3, FLASHCL_BFLOAT16, 2, 2, 1, 260, 700, 64, 0, 1, 100, 30, 2, 16, 0, 0, 0,
     0},
    {FLASHCL_FLOAT8_E5M2, FLASHCL_FLOAT16, 1, 4, 2, 513, 513, 48, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0},
    /* keys from 128 on boosted: rows whose max leaps by hundreds of bits after their first tile */
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT16, 1, 2, 1, 100, 400, 64, 0, 0, 0, 0, 2, 8, 0, 0, 0, 100},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_BFLOAT16, 1, 2, 2, 300, 300, 128, 1, 0, 0, 0, 2, 16, 0, 0, 0, 60},
};

/* Below (descale factors kept on the device between calls); the wgmma cases run it on that kernel. */
static void factors_reuse(flashcl_context *ctx, const char *variant, flashcl_dtype out_dtype, int rounds,
                          uint64_t seed);

/* On compute capability 9.0 the wgmma cases (the kernel must apply there);
 * elsewhere, that asking for the kernel is refused and leaves the outputs as
 * they were. The device decides which, not the library's own answer, so that
 * a wrong eligibility rule cannot skip the cases. */
static void wgmma_kernel(flashcl_context *ctx, uint64_t seed) {
    flashcl_attention_desc d = test_attention_desc(FLASHCL_FLOAT8_E4M3, 1, 2, 2, 64, 64, 64);
    d.out_dtype = FLASHCL_FLOAT16;
    flashcl_params p;
    const int hopper = ctx->info.is_nvidia && ctx->info.nv_cc_major == 9 && ctx->info.nv_cc_minor == 0;
    setenv("FLASHCL_PARAMS", "VARIANT=nv-wgmma-fp8", 1);
    const flashcl_status applies = flashcl_attention_params(ctx, &d, &p);
    if (!hopper) {
        unsigned char x[64 * 2 * 64];
        uint16_t out[64 * 2 * 64];
        memset(x, 0x38, sizeof x), memset(out, 0x5a, sizeof out);
        const flashcl_status st = flashcl_attention_forward_host(ctx, &d, x, x, x, out, NULL);
        int untouched = 1;
        for (size_t i = 0; i < sizeof out / sizeof out[0]; ++i)
            untouched &= out[i] == 0x5a5a;
        unsetenv("FLASHCL_PARAMS");
        expect(st == FLASHCL_ERROR_INVALID_PARAMS && strstr(flashcl_last_error(ctx), "nv-wgmma-fp8") && untouched,
               "device: FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8 off compute capability 9.0 is refused, writes nothing",
               &failures);
        return;
    }
    unsetenv("FLASHCL_PARAMS");
    expect(applies == FLASHCL_SUCCESS && !strcmp(p.variant, "nv-wgmma-fp8"),
           "device: compute capability 9.0 takes FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8", &failures);
    if (applies != FLASHCL_SUCCESS)
        return;
    for (size_t i = 0; i < sizeof wgmma_cases / sizeof wgmma_cases[0]; ++i)
        run_fp8_case(ctx, "device", "nv-wgmma-fp8", &wgmma_cases[i], seed + 7919u * (uint64_t)i);
    factors_reuse(ctx, "nv-wgmma-fp8", FLASHCL_FLOAT16, 1, seed + 19);
    /* Both of the kernel's shapes at head dims up to 64, whichever the host picks: one
     * warpgroup, and two taking turns on the tensor cores (PINGPONG, 128-row blocks, whose
     * warpgroups see different keys under masks and past nq). Each against host_ref, and the
     * two against each other bitwise: a warpgroup runs the same tiles in the same order either
     * way, and a tile that masks all of a row's keys leaves its O, max and sum as they were. */
    static const char *const shapes[] = {"nv-wgmma-fp8,WARPS=4,BLOCK_M=64", "nv-wgmma-fp8,WARPS=8,BLOCK_M=128"};
    for (size_t i = 0; i < sizeof wgmma_cases / sizeof wgmma_cases[0]; ++i) {
        const fp8_case *c = &wgmma_cases[i];
        if (c->head_dim > 64)
            continue;
        void *out[2] = {NULL, NULL};
        float *lse[2] = {NULL, NULL};
        size_t out_bytes = 0, nlse = 0;
        for (int s = 0; s < 2; ++s) {
            captured.on = 1;
            run_fp8_case(ctx, "device", shapes[s], c, seed + 7919u * (uint64_t)i + 101u);
            captured.on = 0;
            out[s] = captured.out, lse[s] = captured.lse, out_bytes = captured.out_bytes, nlse = captured.nlse;
            captured.out = NULL, captured.lse = NULL;
        }
        char what[200];
        snprintf(what, sizeof what, "device: case %zu (%dx%d D%d%s) in two warpgroups equals one, out and lse bitwise", i,
                 c->seqlen_q, c->seqlen_k, c->head_dim, c->causal ? " causal" : c->windowed ? " window" : "");
        expect(out[0] && out[1] && !memcmp(out[0], out[1], out_bytes) && !memcmp(lse[0], lse[1], nlse * sizeof(float)),
               what, &failures);
        for (int s = 0; s < 2; ++s)
            free(out[s]), free(lse[s]);
    }
    for (size_t s = 0; s < 2; ++s)
        factors_reuse(ctx, shapes[s], FLASHCL_FLOAT16, 1, seed + 23 + s);
}

/* ---- refusals ------------------------------------------------------------------------------------ */

static void refusals(flashcl_context *ctx, const char *where) {
    unsigned char q[2 * 8 * 16], k[2 * 8 * 16], v[2 * 8 * 16];
    float out[2 * 8 * 16], lse[16];
    memset(q, 0x38, sizeof q), memset(k, 0x38, sizeof k), memset(v, 0x38, sizeof v);
    flashcl_attention_desc d = test_attention_desc(FLASHCL_FLOAT8_E4M3, 1, 2, 2, 8, 8, 16);
    char what[200];
    /* Each: edit, call, expect INVALID_ARGUMENT, message, out and lse untouched. */
    for (int t = 0; t < 7; ++t) {
        flashcl_attention_desc e = d;
        const float neg = -1.0f, nan_factor = NAN, inf_factor = INFINITY;
        const char *name = "", *needle = "";
        switch (t) {
        case 0: e.out_dtype = FLASHCL_FLOAT8_E4M3, name = "an FP8 out_dtype", needle = "out_dtype"; break;
        case 1: e.fp8.block_rows = 4, name = "block_rows without per_head", needle = "per_head"; break;
        case 2: e.fp8.k_descale = &neg, name = "a negative k descale", needle = "k_descale"; break;
        case 3: e.out_dtype = (flashcl_dtype)7, name = "an unknown out_dtype", needle = "out_dtype"; break;
        case 4: e.fp8.per_head = 1, e.fp8.block_rows = -1, name = "a negative block_rows", needle = "block_rows"; break;
        case 5: e.fp8.q_descale = &inf_factor, name = "an infinite q descale", needle = "q_descale"; break;
        default: e.fp8.v_descale = &nan_factor, name = "a NaN v descale", needle = "v_descale"; break;
        }
        memset(out, 0x5a, sizeof out), memset(lse, 0x5a, sizeof lse);
        const flashcl_status st = flashcl_attention_forward_host(ctx, &e, q, k, v, out, lse);
        int untouched = 1;
        for (size_t i = 0; i < sizeof out; ++i)
            untouched &= ((unsigned char *)out)[i] == 0x5a;
        for (size_t i = 0; i < sizeof lse; ++i)
            untouched &= ((unsigned char *)lse)[i] == 0x5a;
        snprintf(what, sizeof what, "%s: the forward refuses %s, says so, writes nothing", where, name);
        expect(st == FLASHCL_ERROR_INVALID_ARGUMENT && strstr(flashcl_last_error(ctx), needle) && untouched, what,
               &failures);
    }
    /* block_rows past every sequence (INT_MAX: one block, and no overflow on the way to it)
     * computes what per-head factors do. */
    {
        const float qs[2] = {0.5f, 0.25f}, ks[2] = {2.0f, 0.125f}, vs[2] = {1.5f, 0.75f};
        float per_head[sizeof out / sizeof(float)], huge[sizeof out / sizeof(float)];
        unsigned char qv[sizeof q], kv[sizeof k], vv[sizeof v]; /* varied finite codes: every factor matters */
        for (size_t i = 0; i < sizeof q; ++i) {
            qv[i] = (unsigned char)(0x20 + (i * 37) % 40), kv[i] = (unsigned char)(0xa0 + (i * 11) % 40);
            vv[i] = (unsigned char)(0x30 + (i * 13) % 40);
        }
        flashcl_attention_desc e = d;
        e.fp8.q_descale = qs, e.fp8.k_descale = ks, e.fp8.v_descale = vs, e.fp8.per_head = 1;
        const flashcl_status s1 = flashcl_attention_forward_host(ctx, &e, qv, kv, vv, per_head, NULL);
        e.fp8.block_rows = INT_MAX;
        const flashcl_status s2 = flashcl_attention_forward_host(ctx, &e, qv, kv, vv, huge, NULL);
        snprintf(what, sizeof what, "%s: block_rows INT_MAX runs as one block a head", where);
        expect(!s1 && !s2 && !memcmp(per_head, huge, sizeof huge), what, &failures);
    }
    /* The backward takes no FP8. */
    float dq[sizeof q], dk[sizeof q], dv[sizeof q];
    memset(dq, 0x5a, sizeof dq);
    const flashcl_status st = flashcl_attention_backward_host(ctx, &d, NULL, q, k, v, out, out, lse, dq, dk, dv);
    snprintf(what, sizeof what, "%s: the backward refuses FP8 tensors, says why, writes nothing", where);
    expect(st == FLASHCL_ERROR_INVALID_ARGUMENT && strstr(flashcl_last_error(ctx), "float8") &&
               ((unsigned char *)dq)[0] == 0x5a && ((unsigned char *)dq)[sizeof dq - 1] == 0x5a,
           what, &failures);
    if (flashcl_context_is_host(ctx))
        return;
    /* Varlen (device buffers only). */
    const int cu[2] = {0, 8};
    flashcl_varlen_desc vd = test_varlen_desc(FLASHCL_FLOAT8_E4M3, 1, 2, 2, 16, cu, cu);
    cl_mem bq = test_upload(ctx, q, sizeof q), bo = test_upload(ctx, NULL, sizeof out);
    float poison[sizeof out / sizeof(float)], back[sizeof out / sizeof(float)];
    memset(poison, 0x5a, sizeof poison);
    clEnqueueWriteBuffer(flashcl_context_cl_queue(ctx), bo, CL_TRUE, 0, sizeof poison, poison, 0, NULL, NULL);
    const flashcl_status sv = flashcl_varlen_forward(ctx, &vd, bq, bq, bq, bo, NULL, 0, NULL, NULL);
    test_download(ctx, bo, back, sizeof back);
    snprintf(what, sizeof what, "%s: varlen refuses FP8 tensors, says why, writes nothing", where);
    expect(sv == FLASHCL_ERROR_INVALID_ARGUMENT && strstr(flashcl_last_error(ctx), "float8") &&
               !memcmp(back, poison, sizeof back),
           what, &failures);
    clReleaseMemObject(bq), clReleaseMemObject(bo);
}

/* ---- the V transpose of the FP8 warpgroup-MMA forward -------------------------------------------- */

/* fp8_vt_pack (cl/fp8_vt_pack.cl, plain OpenCL C) on this device against a
 * host transpose written from the forward's P layout: lane t of a 16-key
 * group G holds keys 16G + 2t, +1, +8, +9 at k positions 16G + 4t .. +3.
 * Strided V (16-byte aligned rows with gaps), lengths off the 128-key tile,
 * head dims 32, 80, 128; the output poisoned, every byte of it checked
 * (zeros past the keys and past head_dim included) and the bytes after it
 * untouched. Launched as the library launches it (flashcl_fp8_vt_pack_enqueue). */
static void vt_pack(flashcl_context *ctx, uint64_t seed) {
    static const int shapes[][4] = {{2, 3, 300, 80}, {1, 2, 128, 128}, {1, 1, 77, 32}, {1, 2, 200, 64}, {1, 1, 130, 48}};
    /* B, Hk, nk, D */
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; ++c) {
        const int B = shapes[c][0], H = shapes[c][1], N = shapes[c][2], D = shapes[c][3];
        const int keys = (N + 127) / 128 * 128, rows = (D + 63) / 64 * 64;
        flashcl_layout l = {16, 0, 0, 0};
        l.stride_head = (size_t)D + 16;
        l.stride_seq = (size_t)H * l.stride_head + 32;
        l.stride_batch = (size_t)N * l.stride_seq + 48;
        const size_t span = l.offset + (size_t)B * l.stride_batch, out_n = (size_t)B * H * rows * keys, guard = 64;
        unsigned char *v = test_xmalloc(span), *want = test_xmalloc(out_n), *got = test_xmalloc(out_n + guard);
        for (size_t i = 0; i < span; ++i)
            v[i] = (unsigned char)flashcl_ref_rng_next(&rng);
        memset(want, 0, out_n);
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < H; ++h)
                for (int key = 0; key < N; ++key)
                    for (int d = 0; d < D; ++d) {
                        const int within = key % 128, G = within / 16, t = within % 16 % 8 / 2;
                        const int i = within % 2 + 2 * (within % 16 >= 8); /* keys 2t, 2t+1, 8+2t, 9+2t */
                        const size_t pos = (size_t)(key / 128 * 128 + 16 * G + 4 * t + i);
                        want[(((size_t)b * H + h) * rows + d) * keys + pos] =
                            v[l.offset + b * l.stride_batch + (size_t)key * l.stride_seq + h * l.stride_head + d];
                    }
        cl_kernel pack;
        cl_int err = flashcl_fp8_vt_pack_kernel(ctx, D, &pack) == FLASHCL_SUCCESS ? CL_SUCCESS : CL_BUILD_PROGRAM_FAILURE;
        cl_mem bv = test_upload(ctx, v, span), bo = test_upload(ctx, NULL, out_n + guard);
        const unsigned char poison = 0x7f;
        if (err == CL_SUCCESS)
            err = clEnqueueFillBuffer(ctx->queue, bo, &poison, 1, 0, out_n + guard, 0, NULL, NULL);
        if (err == CL_SUCCESS)
            err = flashcl_fp8_vt_pack_enqueue(ctx, pack, bv, &l, B, H, N, bo, 0, keys, NULL, NULL);
        memset(got, 0x5a, out_n + guard);
        if (err == CL_SUCCESS)
            test_download(ctx, bo, got, out_n + guard);
        size_t bad = 0, first = 0, kept = 0;
        for (size_t i = 0; i < out_n; ++i)
            if (got[i] != want[i] && !bad++)
                first = i;
        for (size_t i = out_n; i < out_n + guard; ++i)
            kept += got[i] == poison;
        char what[200];
        snprintf(what, sizeof what,
                 "fp8_vt_pack B=%d Hk=%d nk=%d D=%d (strided V): %zu of %zu bytes differ (first at %zu), %zu of %zu "
                 "bytes past Vt kept%s",
                 B, H, N, D, bad, out_n, first, kept, guard, err == CL_SUCCESS ? "" : " (did not run)");
        expect(err == CL_SUCCESS && bad == 0 && kept == guard, what, &failures);
        clReleaseMemObject(bv), clReleaseMemObject(bo);
        free(v), free(want), free(got);
    }
}

/* ---- descale factors kept on the device between calls ------------------------------------------ */

/* The forward skips uploading factors that match what the context's buffer
 * already holds (src/fp8_forward.c). Calls enqueued back to back with no wait
 * between them, into separate outputs, with factors A, A, B, A, then A per
 * tensor (fewer bytes) and A again: each output against its own reference. A
 * stale factor moves the output by the factors' ratio (2 to 4 here), far
 * outside the tolerance; a write that overtook a queued reader shows as the
 * same. `variant` NULL: the device's default kernel. A float32 out is held to
 * 1e-4 an element; a float16 one (the warpgroup-MMA kernel, which rounds P to
 * e4m3) to a relative RMS error of 5 % (2.6 % in the model of P's rounding,
 * run_fp8_case), where a stale factor gives 50 % and more. On an out-of-order
 * queue (factors_reuse_out_of_order) the calls' order is the library's events
 * alone: a write of B that overtook a reader of A still running shows too. */
static void factors_reuse(flashcl_context *ctx, const char *variant, flashcl_dtype out_dtype, int rounds,
                          uint64_t seed) {
    enum { B = 1, H = 2, N = 96, D = 64, CALLS = 6 };
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    const size_t n = (size_t)B * N * H * D;
    unsigned char *x[3];
    cl_mem buf[3], out[CALLS];
    for (int t = 0; t < 3; ++t) {
        x[t] = test_xmalloc(n);
        fill_fp8(&rng, FLASHCL_FLOAT8_E4M3, x[t], n, 1.0);
        buf[t] = test_upload(ctx, x[t], n);
    }
    /* per (batch, head) factors: A and B differ in every entry, by 2x or more */
    const float fa[3][H] = {{0.5f, 0.25f}, {0.125f, 0.25f}, {1.0f, 2.0f}};
    const float fb[3][H] = {{0.125f, 1.0f}, {0.5f, 0.0625f}, {4.0f, 0.5f}};
    flashcl_attention_desc d[CALLS];
    for (int c = 0; c < CALLS; ++c) {
        const float(*f)[H] = c == 2 ? fb : fa;
        d[c] = test_attention_desc(FLASHCL_FLOAT8_E4M3, B, H, H, N, N, D);
        d[c].out_dtype = out_dtype;
        d[c].fp8.per_head = c != 4;
        d[c].fp8.q_descale = f[0], d[c].fp8.k_descale = f[1], d[c].fp8.v_descale = f[2];
    }
    const size_t es = flashcl_dtype_size(out_dtype);
    void *host_out = test_xmalloc(n * es);
    double *ref = test_xmalloc(CALLS * n * sizeof *ref);
    for (int c = 0; c < CALLS; ++c) {
        flashcl_attention_desc r = d[c];
        flashcl_attention_desc_resolve(&r);
        flashcl_ref_attention_forward(&r, x[0], x[1], x[2], ref + c * n, NULL, NULL, NULL);
    }
    size_t bad[CALLS] = {0};
    double worst[CALLS] = {0.0}, rms_most[CALLS] = {0.0};
    flashcl_status st = FLASHCL_SUCCESS;
    char env[64] = "";
    for (int round = 0; round < rounds && st == FLASHCL_SUCCESS; ++round) {
        flashcl_ref_poison(host_out, out_dtype, n);
        if (variant)
            snprintf(env, sizeof env, "VARIANT=%s", variant), setenv("FLASHCL_PARAMS", env, 1);
        for (int c = 0; c < CALLS; ++c) {
            out[c] = test_upload(ctx, host_out, n * es); /* poisoned */
            if (st == FLASHCL_SUCCESS)
                st = flashcl_attention_forward(ctx, &d[c], buf[0], buf[1], buf[2], out[c], NULL, 0, NULL);
        }
        if (variant)
            unsetenv("FLASHCL_PARAMS");
        clFinish(flashcl_context_cl_queue(ctx)); /* the reads below wait for nothing on an out-of-order queue */
        for (int c = 0; c < CALLS; ++c) {
            test_download(ctx, out[c], host_out, n * es);
            clReleaseMemObject(out[c]);
            double err_sq = 0.0, ref_sq = 0.0;
            for (size_t i = 0; i < n; ++i) {
                const double want = ref[c * n + i], err = fabs(flashcl_ref_load(host_out, out_dtype, i) - want);
                bad[c] += !(err <= 1e-4 + 1e-4 * fabs(want));
                worst[c] = fmax(worst[c], isnan(err) ? INFINITY : err);
                err_sq += err * err, ref_sq += want * want;
            }
            rms_most[c] = fmax(rms_most[c], isnan(err_sq) ? INFINITY : sqrt(err_sq / ref_sq));
        }
    }
    char what[240];
    snprintf(what, sizeof what, "FP8 factors A, A, B, A, A per tensor, A back to back%s%s, %d rounds: enqueued (%s)",
             variant ? " on " : "", variant ? variant : "", rounds,
             st == FLASHCL_SUCCESS ? "ok" : flashcl_last_error(ctx));
    expect(st == FLASHCL_SUCCESS, what, &failures);
    for (int c = 0; c < CALLS && st == FLASHCL_SUCCESS; ++c) {
        snprintf(what, sizeof what,
                 "FP8 factors reused%s%s, call %d (%s, %s): %zu of %zu beyond 1e-4 over %d rounds, max err %.2g, "
                 "relative RMS at most %.3g",
                 variant ? " on " : "", variant ? variant : "", c, c == 2 ? "B" : "A",
                 d[c].fp8.per_head ? "per head" : "per tensor", bad[c], (size_t)rounds * n, rounds, worst[c],
                 rms_most[c]);
        expect(out_dtype == FLASHCL_FLOAT32 ? bad[c] == 0 : rms_most[c] <= 0.05, what, &failures);
    }
    for (int t = 0; t < 3; ++t)
        clReleaseMemObject(buf[t]), free(x[t]);
    free(ref), free(host_out);
}

/* The same on an out-of-order queue of ctx's device, where the implementation has one. */
static void factors_reuse_out_of_order(flashcl_context *base, uint64_t seed) {
    cl_command_queue qq;
    flashcl_context *ctx = test_out_of_order_context(base, "FP8 factors reused on an out-of-order queue", &qq);
    if (!ctx)
        return;
    printf("FP8 factors reused on an out-of-order queue:\n");
    factors_reuse(ctx, NULL, FLASHCL_FLOAT32, 256, seed); /* a race shows only sometimes */
    flashcl_context_destroy(ctx);
    clReleaseCommandQueue(qq);
}

/* ---- ex2_fma: the softmax's exponent off the SFU (cl/common.cl) ------------------------------------ */

/* ex2_fma on this device (tests/ex2_probe.cl, built from a FLASHCL_KERNEL_DIR
 * holding the sources and the probe) against exp2 in double: over [-126, 0]
 * densely, every half-integer and its neighbours (the rounding of j), and up
 * to 16, relative error at most 4e-6 (the polynomial's 2.9e-6 and float
 * rounding); below -126 and -inf exactly 0 (a masked score must add
 * nothing); NaN stays NaN. FLASHCL_KERNEL_DIR points at that directory for
 * the probe's build only. */
static void ex2_fma_check(flashcl_context *ctx) {
    enum { DENSE = 200000, HALF = 3 * 253, SPECIAL = 8 };
    const int n = DENSE + HALF + SPECIAL;
    float *x = test_xmalloc((size_t)n * 4), *y = test_xmalloc((size_t)n * 4);
    int i = 0;
    for (; i < DENSE; ++i)
        x[i] = -126.0f + 142.0f * (float)i / (float)(DENSE - 1); /* [-126, 16] */
    for (int k = -126; k <= 126; ++k) {
        const float h = (float)k - 0.5f;
        x[i++] = h, x[i++] = nextafterf(h, -INFINITY), x[i++] = nextafterf(h, INFINITY);
    }
    const float special[SPECIAL] = {0.0f, -0.0f, -126.0f, nextafterf(-126.0f, -INFINITY), -127.5f, -1e30f,
                                    -INFINITY, NAN};
    for (int k = 0; k < SPECIAL; ++k)
        x[i++] = special[k];
    for (int k = 0; k < n; ++k)
        y[k] = 12345.0f; /* a value no input gives */
    const cl_int err = test_run_probe(ctx, FLASHCL_SOURCE_CL_DIR, FLASHCL_SOURCE_TEST_DIR, "ex2_probe.cl", "ex2_probe", x,
                                      (size_t)n * 4, y, (size_t)n * 4, n);
    double worst = 0.0;
    int bad = 0, worst_at = 0;
    for (int k = 0; k < n; ++k) {
        int ok;
        if (isnan(x[k]))
            ok = isnan(y[k]);
        else if (x[k] < -126.0f)
            ok = y[k] == 0.0f;
        else {
            const double rel = fabs((double)y[k] / exp2((double)x[k]) - 1.0);
            ok = rel <= 4e-6; /* NaN fails */
            if (rel > worst || rel != rel)
                worst = rel, worst_at = k;
        }
        bad += !ok;
    }
    char what[200];
    snprintf(what, sizeof what,
             "ex2_fma on the device: %d inputs in [-126, 16], below, -inf and NaN; %d wrong; worst relative error "
             "%.2e at x = %.7g%s",
             n, bad, worst, (double)x[worst_at], err == CL_SUCCESS ? "" : " (did not run)");
    expect(err == CL_SUCCESS && bad == 0, what, &failures);
    free(x), free(y);
}

/* ---- accuracy ------------------------------------------------------------------------------------- */

/* N(0,1) with 0.1% of entries from N(0, 10^2), FlashAttention-3's test. */
static void fill_outliers(flashcl_ref_rng *rng, float *x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const double z = flashcl_ref_rng_normal(rng);
        x[i] = (float)(flashcl_ref_rng_uniform(rng) < 0.001 ? 10.0 * z : z);
    }
}

/* Quantizes x (packed float32 [B][N][H][D]) as option opt says: 0 per tensor,
 * 1 per head with 64-row blocks for q and k, 2 that plus Hadamard on q and k. */
static float *quantize(const float *x, int B, int N, int H, int D, int opt, int is_v, unsigned char *bytes,
                       flashcl_fp8_scales *s, int which) {
    flashcl_fp8_quant_desc qd = {0};
    qd.format = FLASHCL_FLOAT8_E4M3, qd.src_dtype = FLASHCL_FLOAT32;
    qd.batch = B, qd.seqlen = N, qd.heads = H, qd.head_dim = D;
    qd.per_head = opt > 0;
    qd.block_rows = opt > 0 && !is_v ? 64 : 0;
    qd.hadamard_seed = opt == 2 && !is_v ? 0x9e3779b97f4a7c15ull : 0;
    const size_t groups = qd.per_head ? (size_t)B * H * (qd.block_rows ? (size_t)(N + 63) / 64 : 1) : 1;
    float *sc = test_xmalloc(groups * sizeof *sc);
    if (flashcl_fp8_quantize_host(&qd, x, bytes, sc) != FLASHCL_SUCCESS) {
        printf("quantize: %s\n", flashcl_last_error(NULL));
        exit(1);
    }
    s->per_head = qd.per_head;
    if (!is_v) /* v's factors stay per (batch, head) whatever block_rows says */
        s->block_rows = qd.block_rows;
    if (which == 0)
        s->q_descale = sc;
    else if (which == 1)
        s->k_descale = sc;
    else
        s->v_descale = sc;
    return sc;
}

static void accuracy(flashcl_context *ctx, uint64_t seed) {
    const int B = 1, H = 8, N = 512, D = 128;
    const size_t n = (size_t)B * N * H * D;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    float *x[3];
    for (int t = 0; t < 3; ++t) {
        x[t] = test_xmalloc(n * sizeof(float));
        fill_outliers(&rng, x[t], n);
    }
    flashcl_attention_desc f = test_attention_desc(FLASHCL_FLOAT32, B, H, H, N, N, D);
    double *ref = test_xmalloc(n * sizeof *ref);
    flashcl_attention_desc_resolve(&f);
    flashcl_ref_attention_forward(&f, x[0], x[1], x[2], ref, NULL, NULL, NULL);
    double rmse[3];
    static const char *const names[3] = {"per-tensor", "per-head + 64-row blocks", "blocks + Hadamard"};
    for (int opt = 0; opt < 3; ++opt) {
        flashcl_attention_desc d = test_attention_desc(FLASHCL_FLOAT8_E4M3, B, H, H, N, N, D);
        unsigned char *b[3];
        float *sc[3];
        for (int t = 0; t < 3; ++t) {
            b[t] = test_xmalloc(n);
            sc[t] = quantize(x[t], B, N, H, D, opt, t == 2, b[t], &d.fp8, t);
        }
        float *out = test_xmalloc(n * sizeof *out);
        flashcl_ref_poison(out, FLASHCL_FLOAT32, n);
        const flashcl_status st = flashcl_attention_forward_host(ctx, &d, b[0], b[1], b[2], out, NULL);
        double se = 0;
        for (size_t i = 0; i < n; ++i)
            se += (out[i] - ref[i]) * (out[i] - ref[i]);
        rmse[opt] = st == FLASHCL_SUCCESS ? sqrt(se / (double)n) : NAN;
        printf("accuracy, e4m3 B=%d H=%d N=%d D=%d, 0.1%% outliers: %-24s RMSE %.4g\n", B, H, N, D, names[opt],
               rmse[opt]);
        for (int t = 0; t < 3; ++t)
            free(b[t]), free(sc[t]);
        free(out);
    }
    /* The bound. FlashAttention-3's 9.1e-3 for blocks + Hadamard is at
     * B=1, H=8, N=4096 (its P is FP8 too; here P stays float32). The same
     * experiment on this library (bench/fp8_accuracy.c, PoCL, 2026-12-04)
     * gives 8.2e-3 there. The figure does not shrink with N: longer rows
     * meet more outlier products, whose scores carry large absolute errors.
     * At this size, over 90 seeds, blocks + Hadamard gave 7.1e-3 .. 9.8e-3
     * (a smaller sample: each outlier moves the figure more), so the bound
     * is 1.2e-2, above every seed seen, while factors applied to the wrong
     * rows or heads gave 0.15 .. 0.6. And the options must help: blocks +
     * Hadamard was at most 0.72x the per-tensor figure; 0.85x leaves room
     * for other seeds, and a rotation or blocking that does nothing fails.
     * Blocks alone are not bounded: over 40 more seeds they gave 0.81 ..
     * 0.95x per-tensor at this size (a block's few outliers set its scale),
     * too close to 1 for a check that must not fail by chance. */
    const double bound = 1.2e-2;
    char what[200];
    snprintf(what, sizeof what, "accuracy: blocks + Hadamard %.3g < %.3g (seeds' spread at N=%d; see above)",
             rmse[2], bound, N);
    expect(rmse[2] < bound, what, &failures);
    snprintf(what, sizeof what, "accuracy: blocks + Hadamard < 0.85x the per-tensor RMSE (%.2fx; blocks alone %.2fx)",
             rmse[2] / rmse[0], rmse[1] / rmse[0]);
    expect(rmse[2] < 0.85 * rmse[0], what, &failures);
    for (int t = 0; t < 3; ++t)
        free(x[t]);
    free(ref);
}

int main(int argc, char **argv) {
    const uint64_t seed = test_seed();
    flashcl_context *ctx = test_context();
    const int is_host = flashcl_context_is_host(ctx);
    if (argc > 1 && !strcmp(argv[1], "oclgrind")) {
        /* The device kernels only: the forward on both variants and the V transpose. */
        for (size_t i = 0; i < sizeof tiny_cases / sizeof tiny_cases[0] && !is_host; ++i) {
            run_fp8_case(ctx, "device", "cpu", &tiny_cases[i], seed + i);
            run_fp8_case(ctx, "device", "portable", &tiny_cases[i], seed + i);
        }
        if (!is_host)
            vt_pack(ctx, seed + 13);
        flashcl_context_destroy(ctx);
        return test_summary(failures);
    }
    const int only_host = argc > 1 && !strcmp(argv[1], "host");
    flashcl_context *host = NULL;
    if (flashcl_context_create(&host, "host") != FLASHCL_SUCCESS) {
        printf("cannot create a host context: %s\n", flashcl_last_error(NULL));
        return 1;
    }
    for (size_t i = 0; i < CASES; ++i) {
        const uint64_t s = seed + 1000003u * (uint64_t)i;
        run_fp8_case(host, "host", NULL, &cases[i], s);
        if (!is_host && !only_host) {
            run_fp8_case(ctx, "device", "cpu", &cases[i], s);
            run_fp8_case(ctx, "device", "portable", &cases[i], s);
        }
    }
    if (!is_host && !only_host)
        wgmma_kernel(ctx, seed + 31);
    refusals(host, "host");
    if (!is_host)
        refusals(ctx, "device");
    if (!is_host) {
        vt_pack(ctx, seed + 13);
        factors_reuse(ctx, NULL, FLASHCL_FLOAT32, 1, seed + 17);
        factors_reuse_out_of_order(ctx, seed + 23);
    } else
        printf("no OpenCL device: the V transpose and the factors kept between calls are not checked\n");
    accuracy(is_host || only_host ? host : ctx, seed + 11);
    if (!is_host && !only_host)
        ex2_fma_check(ctx);
    flashcl_context_destroy(host);
    flashcl_context_destroy(ctx);
    return test_summary(failures);
}
