/* ref_backward.c: the pure-C reference of flashcl's attention backward pass, its
 * same-precision baseline and the gradient checker.
 *
 * This is the clean, minimal specification of the backward pass, written
 * like flashcl_ref.c: C11 and libm only, one query row at a time, numbered
 * passes, every sum in double. With L any loss and dout = dL/dout, the
 * forward of one row i of one (batch, query head) is
 *     s_j = scale * q_i . k_j              (soft-capped: c * tanh(s_j / c))
 *     P_j = exp(s_j - LSE_i),  LSE_i = log sum_j exp(s_j)   over visible j
 *     out_i = sum_j P_j v_j
 * and the chain rule gives, for the same row,
 *     dv_j += P_j dout_i                    (summed over every row i and every
 *     dP_j  = dout_i . v_j                   query head sharing the kv head)
 *     D_i   = sum_j P_j dP_j = dout_i . out_i
 *     dS_j  = P_j (dP_j - D_i)              gradient wrt the (capped) score
 *     dz_j  = dS_j * g_j * scale            g_j = 1 - tanh^2(s_j / c), or 1
 *     dq_i += dz_j k_j,   dk_j += dz_j q_i
 * Masked pairs have P = 0 and contribute nothing; a row that sees no key
 * has dq = 0 and adds nothing to dk, dv; a key no row sees gets dk = dv = 0.
 * The reference takes no O or LSE from outside: it recomputes both exactly,
 * so it is the gradient of the exact forward, not of a rounded one.
 *
 * The plain variant is the naive implementation in the storage precision
 * (float arithmetic, P and dS rounded to the storage type before the
 * products, as a framework's unfused fp16 autograd would), whose error sets
 * the tolerance: flash-attn's rule for gradients is err <= 3 * plain_err + eps.
 */
#include "flashcl_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* All-zero strides mean packed [batch][seqlen][heads][head_dim]. */
static flashcl_layout packed_or(const flashcl_layout *l, int seqlen, int heads, int head_dim) {
    flashcl_layout r = {0, 0, 0, 0};
    if (l)
        r = *l;
    if (r.stride_batch == 0 && r.stride_seq == 0 && r.stride_head == 0) {
        r.stride_head = (size_t)head_dim;
        r.stride_seq = (size_t)heads * (size_t)head_dim;
        r.stride_batch = (size_t)seqlen * r.stride_seq;
    }
    return r;
}

/* Index of element (b, n, h, 0). */
static size_t row_at(const flashcl_layout *l, int b, int n, int h) {
    return l->offset + (size_t)b * l->stride_batch + (size_t)n * l->stride_seq + (size_t)h * l->stride_head;
}

/* 0 means 1/sqrt(head_dim) computed in float, as resolve does. */
static double scale_of(const flashcl_attention_desc *d) {
    return d->scale != 0.0f ? (double)d->scale : (double)(1.0f / sqrtf((float)d->head_dim));
}

static float round_to(float x, flashcl_dtype dtype) {
    if (dtype == FLASHCL_FLOAT16)
        return flashcl_ref_half_to_float(flashcl_ref_float_to_half(x));
    if (dtype == FLASHCL_BFLOAT16)
        return flashcl_ref_bf16_to_float(flashcl_ref_float_to_bf16(x));
    return x;
}

/* ----------------------------------------------------------------------------
 * the exact gradients, in double
 * ------------------------------------------------------------------------- */

/* stored_out: D_i from out rounded to the dtype, as a kernel reads it back
 * (FA2's pre-pass reads the stored out); 0: the exact gradients. */
static int backward_double(const flashcl_attention_desc *desc, const void *q, const void *k,
                           const void *v, const void *dout, const flashcl_layout *dout_layout,
                           int stored_out, double *dq, double *dk, double *dv) {
    // q, dout: (B, Nq, Hq, D), k and v: (B, Nk, Hk, D), in their layouts and dtype
    // dq: (B, Nq, Hq, D), dk and dv: (B, Nk, Hk, D), packed doubles
    const int B = desc->batch, Hq = desc->heads_q, Hk = desc->heads_k;
    const int Nq = desc->seqlen_q, Nk = desc->seqlen_k, D = desc->head_dim;
    const flashcl_dtype dt = desc->dtype;
    const flashcl_layout ql = packed_or(&desc->q, Nq, Hq, D), kl = packed_or(&desc->k, Nk, Hk, D);
    const flashcl_layout vl = packed_or(&desc->v, Nk, Hk, D), gl = packed_or(dout_layout, Nq, Hq, D);
    const double scale = scale_of(desc), cap = (double)desc->softcap;
    const int group = Hq / Hk; // GQA: query head h reads kv head h / group

    double *kb = malloc((size_t)Nk * D * sizeof(double)); // K of one (b, kv head), packed
    double *vb = malloc((size_t)Nk * D * sizeof(double));
    double *qr = malloc((size_t)D * sizeof(double));      // q_i
    double *gr = malloc((size_t)D * sizeof(double));      // dout_i
    double *orow = malloc((size_t)D * sizeof(double));    // out_i, recomputed
    double *s = malloc((size_t)Nk * sizeof(double));      // scores, then P
    double *g = malloc((size_t)Nk * sizeof(double));      // soft-cap derivative
    int ok = kb && vb && qr && gr && orow && s && g;
    if (ok) {
        memset(dq, 0, (size_t)B * Nq * Hq * D * sizeof(double));
        memset(dk, 0, (size_t)B * Nk * Hk * D * sizeof(double));
        memset(dv, 0, (size_t)B * Nk * Hk * D * sizeof(double));
    }
    for (int b = 0; ok && b < B; b++) {
        for (int kvh = 0; kvh < Hk; kvh++) {
            // pass 0: K and V of (b, kvh), widened once for the whole group
            for (int j = 0; j < Nk; j++)
                for (int d = 0; d < D; d++) {
                    kb[(size_t)j * D + d] = flashcl_ref_load(k, dt, row_at(&kl, b, j, kvh) + (size_t)d);
                    vb[(size_t)j * D + d] = flashcl_ref_load(v, dt, row_at(&vl, b, j, kvh) + (size_t)d);
                }
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int i = 0; i < Nq; i++) {
                    int lo, hi;
                    if (!flashcl_ref_visible_keys(desc, i, &lo, &hi))
                        continue; // no key: dq_i stays 0, nothing flows to dk, dv
                    for (int d = 0; d < D; d++) {
                        qr[d] = flashcl_ref_load(q, dt, row_at(&ql, b, i, h) + (size_t)d);
                        gr[d] = flashcl_ref_load(dout, dt, row_at(&gl, b, i, h) + (size_t)d);
                    }
                    // pass 1: scores (soft-capped) and their max
                    double m = -INFINITY;
                    for (int j = lo; j <= hi; j++) {
                        double x = 0.0;
                        for (int d = 0; d < D; d++)
                            x += qr[d] * kb[(size_t)j * D + d];
                        x *= scale;
                        g[j] = 1.0;
                        if (cap > 0.0) {
                            double t = tanh(x / cap);
                            x = cap * t;
                            g[j] = 1.0 - t * t; // d/dx of cap * tanh(x / cap)
                        }
                        s[j] = x;
                        m = x > m ? x : m;
                    }
                    // pass 2: P = softmax over the visible keys
                    double sum = 0.0;
                    for (int j = lo; j <= hi; j++)
                        sum += (s[j] = exp(s[j] - m));
                    for (int j = lo; j <= hi; j++)
                        s[j] /= sum;
                    // pass 3: out_i, and D_i = dout_i . out_i
                    for (int d = 0; d < D; d++)
                        orow[d] = 0.0;
                    for (int j = lo; j <= hi; j++)
                        for (int d = 0; d < D; d++)
                            orow[d] += s[j] * vb[(size_t)j * D + d];
                    double di = 0.0;
                    for (int d = 0; d < D; d++)
                        di += gr[d] * (stored_out ? (double)round_to((float)orow[d], dt) : orow[d]);
                    // pass 4: per key, dP, dS, and the three gradient updates
                    double *dqr = dq + (((size_t)b * Nq + i) * Hq + h) * D;
                    for (int j = lo; j <= hi; j++) {
                        double dp = 0.0;
                        for (int d = 0; d < D; d++)
                            dp += gr[d] * vb[(size_t)j * D + d];
                        double dz = s[j] * (dp - di) * g[j] * scale;
                        double *dkr = dk + (((size_t)b * Nk + j) * Hk + kvh) * D;
                        double *dvr = dv + (((size_t)b * Nk + j) * Hk + kvh) * D;
                        for (int d = 0; d < D; d++) {
                            dqr[d] += dz * kb[(size_t)j * D + d];
                            dkr[d] += dz * qr[d];
                            dvr[d] += s[j] * gr[d];
                        }
                    }
                }
            }
        }
    }
    free(kb);
    free(vb);
    free(qr);
    free(gr);
    free(orow);
    free(s);
    free(g);
    return ok;
}

/* ----------------------------------------------------------------------------
 * plain, in the storage precision: the tolerance baseline
 * ------------------------------------------------------------------------- */

static int backward_plain(const flashcl_attention_desc *desc, const void *q, const void *k,
                          const void *v, const void *dout, const flashcl_layout *dout_layout,
                          double *dq, double *dk, double *dv) {
    // Same loops as backward_double with float numbers, plus the roundings
    // an unfused implementation stores: P (before P.V and dv), out (before
    // D_i), dS (before the dq/dk products), and dq, dk, dv themselves.
    const int B = desc->batch, Hq = desc->heads_q, Hk = desc->heads_k;
    const int Nq = desc->seqlen_q, Nk = desc->seqlen_k, D = desc->head_dim;
    const flashcl_dtype dt = desc->dtype;
    const flashcl_layout ql = packed_or(&desc->q, Nq, Hq, D), kl = packed_or(&desc->k, Nk, Hk, D);
    const flashcl_layout vl = packed_or(&desc->v, Nk, Hk, D), gl = packed_or(dout_layout, Nq, Hq, D);
    const float scale = (float)scale_of(desc), cap = desc->softcap;
    const int group = Hq / Hk;
    const size_t nq_all = (size_t)B * Nq * Hq * D, nk_all = (size_t)B * Nk * Hk * D;

    float *kb = malloc((size_t)Nk * D * sizeof(float));
    float *vb = malloc((size_t)Nk * D * sizeof(float));
    float *qr = malloc((size_t)D * sizeof(float));
    float *gr = malloc((size_t)D * sizeof(float));
    float *orow = malloc((size_t)D * sizeof(float));
    float *s = malloc((size_t)Nk * sizeof(float));
    float *g = malloc((size_t)Nk * sizeof(float));
    float *fq = calloc(nq_all, sizeof(float)); // float accumulators of dq, dk, dv
    float *fk = calloc(nk_all, sizeof(float));
    float *fv = calloc(nk_all, sizeof(float));
    int ok = kb && vb && qr && gr && orow && s && g && fq && fk && fv;
    for (int b = 0; ok && b < B; b++) {
        for (int kvh = 0; kvh < Hk; kvh++) {
            for (int j = 0; j < Nk; j++)
                for (int d = 0; d < D; d++) {
                    kb[(size_t)j * D + d] = (float)flashcl_ref_load(k, dt, row_at(&kl, b, j, kvh) + (size_t)d);
                    vb[(size_t)j * D + d] = (float)flashcl_ref_load(v, dt, row_at(&vl, b, j, kvh) + (size_t)d);
                }
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int i = 0; i < Nq; i++) {
                    int lo, hi;
                    if (!flashcl_ref_visible_keys(desc, i, &lo, &hi))
                        continue;
                    for (int d = 0; d < D; d++) {
                        qr[d] = (float)flashcl_ref_load(q, dt, row_at(&ql, b, i, h) + (size_t)d);
                        gr[d] = (float)flashcl_ref_load(dout, dt, row_at(&gl, b, i, h) + (size_t)d);
                    }
                    float m = -INFINITY;
                    for (int j = lo; j <= hi; j++) {
                        float x = 0.0f;
                        for (int d = 0; d < D; d++)
                            x += qr[d] * kb[(size_t)j * D + d];
                        x *= scale;
                        g[j] = 1.0f;
                        if (cap > 0.0f) {
                            float t = tanhf(x / cap);
                            x = cap * t;
                            g[j] = 1.0f - t * t;
                        }
                        s[j] = x;
                        m = x > m ? x : m;
                    }
                    float sum = 0.0f;
                    for (int j = lo; j <= hi; j++)
                        sum += (s[j] = expf(s[j] - m));
                    for (int j = lo; j <= hi; j++)
                        s[j] = round_to(s[j] / sum, dt); // P as stored
                    for (int d = 0; d < D; d++)
                        orow[d] = 0.0f;
                    for (int j = lo; j <= hi; j++)
                        for (int d = 0; d < D; d++)
                            orow[d] += s[j] * vb[(size_t)j * D + d];
                    float di = 0.0f;
                    for (int d = 0; d < D; d++)
                        di += gr[d] * round_to(orow[d], dt); // out as stored
                    float *dqr = fq + (((size_t)b * Nq + i) * Hq + h) * D;
                    for (int j = lo; j <= hi; j++) {
                        float dp = 0.0f;
                        for (int d = 0; d < D; d++)
                            dp += gr[d] * vb[(size_t)j * D + d];
                        float dz = round_to(s[j] * (dp - di) * g[j], dt) * scale; // dS as stored
                        float *dkr = fk + (((size_t)b * Nk + j) * Hk + kvh) * D;
                        float *dvr = fv + (((size_t)b * Nk + j) * Hk + kvh) * D;
                        for (int d = 0; d < D; d++) {
                            dqr[d] += dz * kb[(size_t)j * D + d];
                            dkr[d] += dz * qr[d];
                            dvr[d] += s[j] * gr[d];
                        }
                    }
                }
            }
        }
    }
    if (ok) {
        for (size_t n = 0; n < nq_all; n++)
            dq[n] = round_to(fq[n], dt);
        for (size_t n = 0; n < nk_all; n++) {
            dk[n] = round_to(fk[n], dt);
            dv[n] = round_to(fv[n], dt);
        }
    }
    free(kb);
    free(vb);
    free(qr);
    free(gr);
    free(orow);
    free(s);
    free(g);
    free(fq);
    free(fk);
    free(fv);
    return ok;
}

static void fill_nan3(const flashcl_attention_desc *d, double *dq, double *dk, double *dv) {
    size_t nq = (size_t)d->batch * d->seqlen_q * d->heads_q * d->head_dim;
    size_t nk = (size_t)d->batch * d->seqlen_k * d->heads_k * d->head_dim;
    for (size_t n = 0; n < nq; n++)
        dq[n] = NAN;
    for (size_t n = 0; n < nk; n++)
        dk[n] = dv[n] = NAN;
}

void flashcl_ref_attention_backward(const flashcl_attention_desc *desc, const void *q, const void *k,
                                    const void *v, const void *dout, const flashcl_layout *dout_layout,
                                    double *dq, double *dk, double *dv) {
    if (!backward_double(desc, q, k, v, dout, dout_layout, 0, dq, dk, dv))
        fill_nan3(desc, dq, dk, dv);
}

void flashcl_ref_attention_backward_plain(const flashcl_attention_desc *desc, const void *q,
                                          const void *k, const void *v, const void *dout,
                                          const flashcl_layout *dout_layout, double *dq, double *dk,
                                          double *dv) {
    if (!backward_plain(desc, q, k, v, dout, dout_layout, dq, dk, dv))
        fill_nan3(desc, dq, dk, dv);
}

/* ----------------------------------------------------------------------------
 * checking
 * ------------------------------------------------------------------------- */

/* The largest Euclidean norm of a (b, n, h) row. */
static double max_norm(const void *x, flashcl_dtype dt, const flashcl_layout *l, int B, int N, int H, int D) {
    double best = 0.0;
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++)
            for (int h = 0; h < H; h++) {
                double sum = 0.0;
                for (int d = 0; d < D; d++) {
                    double e = flashcl_ref_load(x, dt, row_at(l, b, n, h) + (size_t)d);
                    sum += e * e;
                }
                best = fmax(best, sqrt(sum));
            }
    return best;
}

enum { MAX_PRINTED = 8 };

int flashcl_ref_check_backward(const flashcl_attention_desc *desc, const flashcl_backward_options *opts,
                               const void *q, const void *k, const void *v, const void *dout,
                               const void *dq, const void *dk, const void *dv, int verbose,
                               flashcl_ref_grad_report *report) {
    // dq in opts->dq's layout, dk and dv in opts->dk/dv's (opts NULL: packed)
    flashcl_ref_grad_report local;
    if (!report)
        report = &local;
    memset(report, 0, sizeof *report);
    const int B = desc->batch, Hq = desc->heads_q, Hk = desc->heads_k;
    const int Nq = desc->seqlen_q, Nk = desc->seqlen_k, D = desc->head_dim;
    const flashcl_layout *gl = opts ? &opts->dout : NULL;
    const flashcl_layout lay[3] = {packed_or(opts ? &opts->dq : NULL, Nq, Hq, D),
                                   packed_or(opts ? &opts->dk : NULL, Nk, Hk, D),
                                   packed_or(opts ? &opts->dv : NULL, Nk, Hk, D)};
    const void *got[3] = {dq, dk, dv};
    const int N[3] = {Nq, Nk, Nk}, H[3] = {Hq, Hk, Hk};
    static const char *const names[3] = {"dq", "dk", "dv"};
    size_t count[3];
    double *ref[3], *plain[3], *stored[3];
    int ran = 1;
    for (int t = 0; t < 3; t++) {
        count[t] = (size_t)B * N[t] * H[t] * D;
        ref[t] = malloc(count[t] * sizeof(double));
        plain[t] = malloc(count[t] * sizeof(double));
        stored[t] = malloc(count[t] * sizeof(double));
        ran = ran && ref[t] && plain[t] && stored[t];
    }
    ran = ran && backward_double(desc, q, k, v, dout, gl, 0, ref[0], ref[1], ref[2]) &&
          backward_plain(desc, q, k, v, dout, gl, plain[0], plain[1], plain[2]) &&
          backward_double(desc, q, k, v, dout, gl, 1, stored[0], stored[1], stored[2]);
    if (!ran) {
        report->mismatches = (size_t)-1;
        if (verbose)
            fprintf(stderr, "flashcl check: out of memory for the backward reference\n");
    }

    // Rounding scores to float costs any float kernel about 2^-24 scale
    // |q||k| per score; every gradient moves by at most that, relative to
    // its size (see score_rounding_bound in flashcl_ref.c for the forward).
    const flashcl_layout ql = packed_or(&desc->q, Nq, Hq, D), kl = packed_or(&desc->k, Nk, Hk, D);
    const double score_rel = ran ? ldexp(1.0, -24) * scale_of(desc) *
                                       max_norm(q, desc->dtype, &ql, B, Nq, Hq, D) *
                                       max_norm(k, desc->dtype, &kl, B, Nk, Hk, D)
                                 : 0.0;
    size_t printed = 0;
    for (int t = 0; ran && t < 3; t++) {
        // pass 1: the plain implementation's error and the tensor's size set
        // the tolerance. Plus what storing out costs, where plain's error
        // does not already show it: D_i = rowsum(dO * out) is read from out
        // as stored, and any kernel that does (FA2's pre-pass) inherits that
        // rounding's effect on the gradients. The plain implementation rounds
        // its own out, so its error holds a different realisation of the
        // same effect, which at small head dims (nothing averages D_i's
        // error) can be far the smaller: at D=1 one key's dK moved by 1.1e-3
        // from out's f16 rounding alone, against a plain error of about 2e-4.
        double plain_err = 0.0, max_ref = 0.0, stored_err = 0.0;
        for (size_t n = 0; n < count[t]; n++) {
            plain_err = fmax(plain_err, fabs(plain[t][n] - ref[t][n]));
            max_ref = fmax(max_ref, fabs(ref[t][n]));
            stored_err = fmax(stored_err, fabs(stored[t][n] - ref[t][n]));
        }
        const double eps = flashcl_ref_epsilon(desc->dtype) * fmax(1.0, max_ref) + 4.0 * score_rel * max_ref;
        report->plain_err[t] = plain_err;
        report->stored_out_err[t] = stored_err;
        report->tolerance[t] = 3.0 * plain_err + fmax(0.0, stored_err - plain_err) + eps;
        // pass 2: every element where its layout puts it; NaN and inf fail
        for (int b = 0; b < B; b++)
            for (int n = 0; n < N[t]; n++)
                for (int h = 0; h < H[t]; h++)
                    for (int d = 0; d < D; d++) {
                        double x = flashcl_ref_load(got[t], desc->dtype, row_at(&lay[t], b, n, h) + (size_t)d);
                        double want = ref[t][(((size_t)b * N[t] + n) * H[t] + h) * D + d];
                        double e = isfinite(x) ? fabs(x - want) : INFINITY;
                        report->max_err[t] = fmax(report->max_err[t], e);
                        if (e <= report->tolerance[t])
                            continue;
                        report->mismatches++;
                        if (verbose && printed++ < MAX_PRINTED)
                            fprintf(stderr, "flashcl check: %s[b=%d n=%d h=%d d=%d] = %.8g, ref %.8g, err %.3g > tol %.3g\n",
                                    names[t], b, n, h, d, x, want, e, report->tolerance[t]);
                    }
    }
    report->passed = ran && report->mismatches == 0;
    if (verbose && ran && !report->passed)
        fprintf(stderr, "flashcl check: backward FAILED, %zu mismatches; max_err dq %.3g dk %.3g dv %.3g, "
                        "tolerance %.3g %.3g %.3g\n",
                report->mismatches, report->max_err[0], report->max_err[1], report->max_err[2],
                report->tolerance[0], report->tolerance[1], report->tolerance[2]);
    for (int t = 0; t < 3; t++) {
        free(ref[t]);
        free(plain[t]);
        free(stored[t]);
    }
    return report->passed;
}
