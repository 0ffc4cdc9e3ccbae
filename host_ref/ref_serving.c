/* ref_serving.c: the reference of flashcl's serving operations: merging partial
 * results, variable-length batches, and reading a paged KV pool.
 *
 * Like flashcl_ref.c this is the clean, minimal specification, in plain C
 * with double accumulation and no fast-math:
 * - a varlen batch is nothing but independent sequences; each is run through
 *   flashcl_ref_attention_forward on its own (batch 1), so "varlen equals
 *   running each sequence alone" holds by construction here and every mask
 *   rule (bottom-right causal alignment, empty rows) is the forward's;
 * - a paged pool is nothing but a permutation of rows: gathering a sequence's
 *   pages back into a dense array gives the keys the kernels must see;
 * - merging is the log-sum-exp identity, written out in double;
 * - an FP8 pool is that permutation of bytes, each read as descale * decode
 *   (decode exact, the descale its kv head's): dequantized into doubles, the
 *   keys the kernels must see are exact, and attention over them is the
 *   forward's, written out once more over double K/V.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcl_ref.h"

/* ----------------------------------------------------------------------------
 * merging two partial results
 * ------------------------------------------------------------------------- */

/* Index of element (b, n, h, 0) of a [batch][seq][heads][d] tensor; all-zero
 * strides mean packed, as everywhere in flashcl. */
static size_t merge_index(const flashcl_layout *l, const flashcl_merge_desc *d, int b, int n, int h) {
    size_t sh = l->stride_head, ss = l->stride_seq, sb = l->stride_batch;
    if (!sh && !ss && !sb) {
        sh = (size_t)d->head_dim;
        ss = (size_t)d->heads * sh;
        sb = (size_t)d->seqlen * ss;
    }
    return l->offset + (size_t)b * sb + (size_t)n * ss + (size_t)h * sh;
}

void flashcl_ref_attention_merge(const flashcl_merge_desc *desc, const void *o1, const float *lse1,
                                 const void *o2, const float *lse2, double *out, double *lse) {
    // o1, o2: (B, N, H, D) in their layouts; lse1, lse2: float (B, H, N) from
    // their offsets. out: double (B, N, H, D) packed; lse: double (B, H, N).
    const int B = desc->batch, N = desc->seqlen, H = desc->heads, D = desc->head_dim;
    for (int b = 0; b < B; b++) {
        for (int n = 0; n < N; n++) {
            for (int h = 0; h < H; h++) {
                size_t row = ((size_t)b * H + h) * N + n;
                double l1 = lse1[desc->lse1_offset + row], l2 = lse2[desc->lse2_offset + row];
                double *o = out + (((size_t)b * N + n) * H + h) * D;
                // pass 1: the larger LSE is the reference point, so one weight is
                // exactly 1 and exp never overflows
                double m = fmax(l1, l2);
                if (m == -INFINITY) {
                    // neither side saw a key: the union sees none either
                    for (int d = 0; d < D; d++)
                        o[d] = 0.0;
                    if (lse)
                        lse[row] = -INFINITY;
                    continue;
                }
                // pass 2: weights; a side with LSE -inf weighs exactly 0 and its
                // O, which may hold anything, is never read
                double w1 = l1 == -INFINITY ? 0.0 : exp(l1 - m);
                double w2 = l2 == -INFINITY ? 0.0 : exp(l2 - m);
                size_t i1 = merge_index(&desc->o1, desc, b, n, h);
                size_t i2 = merge_index(&desc->o2, desc, b, n, h);
                // pass 3: the weighted mean, and the union's LSE
                for (int d = 0; d < D; d++) {
                    double x = 0.0;
                    if (w1 > 0.0)
                        x += w1 * flashcl_ref_load(o1, desc->dtype, i1 + (size_t)d);
                    if (w2 > 0.0)
                        x += w2 * flashcl_ref_load(o2, desc->dtype, i2 + (size_t)d);
                    o[d] = x / (w1 + w2);
                }
                if (lse)
                    lse[row] = m + log(w1 + w2);
            }
        }
    }
}

/* Unit roundoff of a storage type: storing x costs at most u|x| (normal range). */
static double unit_roundoff(flashcl_dtype dtype) {
    return dtype == FLASHCL_FLOAT32 ? ldexp(1.0, -24) : dtype == FLASHCL_FLOAT16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
}

int flashcl_ref_check_merge(const flashcl_merge_desc *desc, const void *o1, const float *lse1,
                            const void *o2, const float *lse2, const void *out, const float *lse_out,
                            int verbose, flashcl_ref_report *report) {
    // The merge is a handful of float operations per element, so the bound is
    // tight: the final rounding to the storage type (u|ref|), plus a few float
    // ulps of the inputs' size for the weights and the sum, plus 2^-24 for
    // float16 subnormals. LSE: a few float ulps of its size.
    flashcl_ref_report local;
    if (!report)
        report = &local;
    memset(report, 0, sizeof *report);
    const int B = desc->batch, N = desc->seqlen, H = desc->heads, D = desc->head_dim;
    const size_t rows = (size_t)B * H * N;
    double *ref = malloc(rows * (size_t)D * sizeof(double));
    double *ref_lse = malloc(rows * sizeof(double));
    if (!ref || !ref_lse) {
        free(ref);
        free(ref_lse);
        report->mismatches = (size_t)-1;
        return 0;
    }
    flashcl_ref_attention_merge(desc, o1, lse1, o2, lse2, ref, ref_lse);
    const double u = unit_roundoff(desc->dtype), f = ldexp(1.0, -24);
    size_t printed = 0;
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++)
            for (int h = 0; h < H; h++) {
                size_t row = ((size_t)b * H + h) * N + n;
                size_t io = merge_index(&desc->out, desc, b, n, h);
                size_t i1 = merge_index(&desc->o1, desc, b, n, h), i2 = merge_index(&desc->o2, desc, b, n, h);
                for (int d = 0; d < D; d++) {
                    double want = ref[(((size_t)b * N + n) * H + h) * D + d];
                    double got = flashcl_ref_load(out, desc->dtype, io + (size_t)d);
                    double in = 0.0; // size of the inputs that count (finite ones only)
                    if (lse1[desc->lse1_offset + row] != -INFINITY)
                        in = fmax(in, fabs(flashcl_ref_load(o1, desc->dtype, i1 + (size_t)d)));
                    if (lse2[desc->lse2_offset + row] != -INFINITY)
                        in = fmax(in, fabs(flashcl_ref_load(o2, desc->dtype, i2 + (size_t)d)));
                    double tol = u * fabs(want) + 8.0 * f * in + f;
                    double e = isfinite(got) ? fabs(got - want) : INFINITY;
                    report->max_err = fmax(report->max_err, e);
                    if (e <= tol)
                        continue;
                    if (report->mismatches++ == 0) {
                        report->first_bad[0] = (size_t)b;
                        report->first_bad[1] = (size_t)n;
                        report->first_bad[2] = (size_t)h;
                        report->first_bad[3] = (size_t)d;
                    }
                    if (verbose && printed++ < 8)
                        fprintf(stderr, "flashcl merge check: out[b=%d n=%d h=%d d=%d] = %.8g, ref %.8g, tol %.3g\n",
                                b, n, h, d, got, want, tol);
                }
                if (lse_out) {
                    double want = ref_lse[row], got = lse_out[desc->lse_out_offset + row];
                    if (!flashcl_ref_lse_ok(got, want, 8.0 * f * fmax(1.0, fabs(want)), report)) {
                        report->mismatches++;
                        if (verbose && printed++ < 8)
                            fprintf(stderr, "flashcl merge check: lse[b=%d h=%d n=%d] = %.8g, ref %.8g\n", b, h,
                                    n, got, want);
                    }
                }
            }
    report->tolerance = u;
    report->passed = report->mismatches == 0;
    free(ref);
    free(ref_lse);
    return report->passed;
}

/* ----------------------------------------------------------------------------
 * variable-length batches
 * ------------------------------------------------------------------------- */

/* A token-major tensor's (token, head) strides, packed when both are 0. */
static void token_strides(const flashcl_layout *l, int heads, int head_dim, size_t *ss, size_t *sh) {
    *ss = l->stride_seq;
    *sh = l->stride_head;
    if (!*ss && !*sh) {
        *sh = (size_t)head_dim;
        *ss = (size_t)heads * (size_t)head_dim;
    }
}

/* Sequence i of a varlen batch as a plain forward problem (batch 1), its
 * tensors starting at the sequence's first token. */
static flashcl_attention_desc sequence_desc(const flashcl_varlen_desc *v, int i) {
    flashcl_attention_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = v->dtype;
    d.batch = 1;
    d.heads_q = v->heads_q;
    d.heads_k = v->heads_k;
    d.seqlen_q = v->cu_seqlens_q[i + 1] - v->cu_seqlens_q[i];
    d.seqlen_k = v->cu_seqlens_k[i + 1] - v->cu_seqlens_k[i];
    d.head_dim = v->head_dim;
    d.scale = v->scale;
    d.causal = v->causal;
    d.softcap = v->softcap;
    const flashcl_layout *src[4] = {&v->q, &v->k, &v->v, &v->out};
    flashcl_layout *dst[4] = {&d.q, &d.k, &d.v, &d.out};
    for (int t = 0; t < 4; t++) {
        int heads = t == 1 || t == 2 ? v->heads_k : v->heads_q;
        int start = t == 1 || t == 2 ? v->cu_seqlens_k[i] : v->cu_seqlens_q[i];
        size_t ss, sh;
        token_strides(src[t], heads, v->head_dim, &ss, &sh);
        dst[t]->offset = src[t]->offset + (size_t)start * ss;
        dst[t]->stride_seq = ss;
        dst[t]->stride_head = sh;
        dst[t]->stride_batch = ss; // one batch: never multiplied by anything but 0
    }
    return d;
}

void flashcl_ref_varlen_forward(const flashcl_varlen_desc *desc, const void *q, const void *k, const void *v,
                                double *out, double *lse) {
    // q, out: (total_q, Hq, D); k, v: (total_k, Hk, D); lse: (Hq, total_q).
    // out is packed double, whatever desc->out says.
    const int Hq = desc->heads_q, D = desc->head_dim;
    const int total_q = desc->cu_seqlens_q[desc->num_seqs];
    for (int i = 0; i < desc->num_seqs; i++) {
        flashcl_attention_desc d = sequence_desc(desc, i);
        const int q0 = desc->cu_seqlens_q[i], nq = d.seqlen_q;
        if (nq == 0)
            continue;
        if (d.seqlen_k == 0) {
            // no keys at all: every row sees nothing
            for (size_t x = (size_t)q0 * Hq * D; x < (size_t)(q0 + nq) * Hq * D; x++)
                out[x] = 0.0;
            for (int h = 0; lse && h < Hq; h++)
                for (int t = 0; t < nq; t++)
                    lse[(size_t)h * total_q + q0 + t] = -INFINITY;
            continue;
        }
        double *seq_lse = malloc((size_t)Hq * nq * sizeof(double));
        flashcl_ref_attention_forward(&d, q, k, v, out + (size_t)q0 * Hq * D, seq_lse, NULL, NULL);
        for (int h = 0; lse && h < Hq; h++)
            for (int t = 0; t < nq; t++)
                lse[(size_t)h * total_q + q0 + t] = seq_lse ? seq_lse[(size_t)h * nq + t] : NAN;
        free(seq_lse);
    }
}

int flashcl_ref_check_varlen(const flashcl_varlen_desc *desc, const void *q, const void *k, const void *v,
                             const void *out, const float *lse, int verbose, flashcl_ref_report *report) {
    // Each sequence is checked as its own forward problem, with the forward's
    // tolerance rule; the report gathers the worst of them. first_bad[0] is
    // the sequence, [1..3] token-in-sequence, head, d.
    flashcl_ref_report local, one;
    if (!report)
        report = &local;
    memset(report, 0, sizeof *report);
    const int Hq = desc->heads_q, total_q = desc->cu_seqlens_q[desc->num_seqs];
    for (int i = 0; i < desc->num_seqs; i++) {
        flashcl_attention_desc d = sequence_desc(desc, i);
        const int q0 = desc->cu_seqlens_q[i], nq = d.seqlen_q;
        if (nq == 0)
            continue;
        float *seq_lse = NULL;
        if (lse) {
            seq_lse = malloc((size_t)Hq * nq * sizeof(float));
            if (!seq_lse) {
                report->mismatches = (size_t)-1;
                return report->passed = 0;
            }
            for (int h = 0; h < Hq; h++)
                for (int t = 0; t < nq; t++)
                    seq_lse[(size_t)h * nq + t] = lse[(size_t)h * total_q + q0 + t];
        }
        int ok;
        if (d.seqlen_k == 0) {
            // nothing to attend to: 0 and -inf exactly
            memset(&one, 0, sizeof one);
            for (int t = 0; t < nq; t++)
                for (int h = 0; h < Hq; h++)
                    for (int x = 0; x < d.head_dim; x++) {
                        double got = flashcl_ref_load(out, d.dtype, d.out.offset + t * d.out.stride_seq +
                                                                       h * d.out.stride_head + (size_t)x);
                        if (!(got == 0.0))
                            one.mismatches++;
                    }
            for (int n = 0; seq_lse && n < Hq * nq; n++)
                if (!(isinf(seq_lse[n]) && seq_lse[n] < 0))
                    one.mismatches++;
            ok = one.passed = one.mismatches == 0;
        } else {
            ok = flashcl_ref_check_forward(&d, q, k, v, out, seq_lse, verbose, &one);
        }
        free(seq_lse);
        if (!ok && verbose)
            fprintf(stderr, "flashcl varlen check: sequence %d (nq %d, nk %d) failed\n", i, nq, d.seqlen_k);
        if (!ok && report->mismatches == 0) {
            report->first_bad[0] = (size_t)i;
            report->first_bad[1] = one.first_bad[1];
            report->first_bad[2] = one.first_bad[2];
            report->first_bad[3] = one.first_bad[3];
        }
        if (one.mismatches == (size_t)-1 || report->mismatches == (size_t)-1)
            report->mismatches = (size_t)-1;
        else
            report->mismatches += one.mismatches;
        report->max_err = fmax(report->max_err, one.max_err);
        report->plain_err = fmax(report->plain_err, one.plain_err);
        report->tolerance = fmax(report->tolerance, one.tolerance);
        report->max_lse_err = fmax(report->max_lse_err, one.max_lse_err);
    }
    report->passed = report->mismatches == 0;
    return report->passed;
}

/* ----------------------------------------------------------------------------
 * paged KV pools
 * ------------------------------------------------------------------------- */

void flashcl_ref_kv_gather(const void *pool, flashcl_dtype dtype, int page_size, int heads_k, int head_dim,
                           const int *pages, int length, void *dense) {
    // pool: (num_pages, page_size, Hk, D); dense: (length, Hk, D), same dtype.
    // Token n lives in row n % page_size of physical page pages[n / page_size].
    const size_t row = (size_t)heads_k * (size_t)head_dim;
    const size_t es = dtype == FLASHCL_FLOAT32 ? 4 : 2;
    for (int n = 0; n < length; n++) {
        size_t slot = (size_t)pages[n / page_size] * (size_t)page_size + (size_t)(n % page_size);
        memcpy((char *)dense + (size_t)n * row * es, (const char *)pool + slot * row * es, row * es);
    }
}

/* ----------------------------------------------------------------------------
 * FP8 pages
 * ------------------------------------------------------------------------- */

void flashcl_ref_kv_dequantize(const unsigned char *pool, flashcl_dtype format, const float *scales, int page_size,
                               int heads_k, int head_dim, const int *pages, int length, double *dense) {
    // pool: (num_pages, page_size, Hk, D) bytes; dense: (length, Hk, D) double.
    // descale * decode(byte) is exact in double (4 significant bits times 24).
    for (int n = 0; n < length; n++) {
        size_t slot = (size_t)pages[n / page_size] * (size_t)page_size + (size_t)(n % page_size);
        for (int h = 0; h < heads_k; h++)
            for (int d = 0; d < head_dim; d++) {
                size_t at = (slot * (size_t)heads_k + (size_t)h) * (size_t)head_dim + (size_t)d;
                double scale = scales ? (double)scales[h] : 1.0;
                dense[((size_t)n * heads_k + h) * head_dim + d] = scale * flashcl_ref_fp8_decode(format, pool[at]);
            }
    }
}

/* One output row over double K/V: query token t of sequence i, query head h.
 * plain = 0: in double (o, *lse exact up to double rounding); plain = 1: the
 * plain implementation's arithmetic (forward_plain in flashcl_ref.c): K, V
 * and q as floats, float scores and softmax, P rounded to the storage dtype,
 * float accumulation, the output rounded to the dtype. Returns 0 when the
 * row sees no key (o = 0, lse = -inf). */
static int fp8_row(const flashcl_varlen_desc *desc, const void *q, const double *k, const double *v, int i, int t,
                   int h, int plain, double *o, double *lse) {
    const int Hq = desc->heads_q, Hk = desc->heads_k, D = desc->head_dim, group = Hq / Hk, kvh = h / group;
    const int q0 = desc->cu_seqlens_q[i], nq = desc->cu_seqlens_q[i + 1] - q0;
    const int k0 = desc->cu_seqlens_k[i], nk = desc->cu_seqlens_k[i + 1] - k0;
    const double scale = desc->scale != 0.0f ? (double)desc->scale : (double)(1.0f / sqrtf((float)D));
    size_t ss, sh;
    token_strides(&desc->q, Hq, D, &ss, &sh);
    const size_t qi = desc->q.offset + (size_t)(q0 + t) * ss + (size_t)h * sh;
    // pass 0: visible keys, bottom-right causal alignment within the sequence
    const int hi = desc->causal ? nk - nq + t : nk - 1;
    for (int d = 0; d < D; d++)
        o[d] = 0.0;
    *lse = -INFINITY;
    if (hi < 0 || nk == 0)
        return 0;
    double *s = malloc((size_t)(hi + 1) * sizeof(double));
    if (!s) {
        for (int d = 0; d < D; d++)
            o[d] = NAN;
        *lse = NAN;
        return 1;
    }
    // pass 1: scores and their max
    double m = -INFINITY;
    for (int j = 0; j <= hi; j++) {
        const double *kr = k + ((size_t)(k0 + j) * Hk + kvh) * D;
        double x;
        if (plain) {
            float dot = 0.0f;
            for (int d = 0; d < D; d++)
                dot += (float)flashcl_ref_load(q, desc->dtype, qi + (size_t)d) * (float)kr[d];
            float fs = (float)scale * dot;
            if (desc->softcap > 0.0f)
                fs = desc->softcap * tanhf(fs / desc->softcap);
            x = fs;
        } else {
            x = 0.0;
            for (int d = 0; d < D; d++)
                x += flashcl_ref_load(q, desc->dtype, qi + (size_t)d) * kr[d];
            x *= scale;
            if (desc->softcap > 0.0f)
                x = desc->softcap * tanh(x / desc->softcap);
        }
        s[j] = x;
        m = fmax(m, x);
    }
    // pass 2: softmax numerators and their sum
    double sum = 0.0;
    float fsum = 0.0f;
    for (int j = 0; j <= hi; j++) {
        if (plain) {
            s[j] = expf((float)s[j] - (float)m);
            fsum += (float)s[j];
        } else {
            s[j] = exp(s[j] - m);
            sum += s[j];
        }
    }
    // pass 3: P.V (plain: P in the storage dtype, float accumulation, rounded output)
    for (int j = 0; j <= hi; j++) {
        const double *vr = v + ((size_t)(k0 + j) * Hk + kvh) * D;
        if (plain) {
            float p = (float)s[j] / fsum, pr;
            unsigned char scratch[4];
            flashcl_ref_store(scratch, desc->dtype, 0, p);
            pr = (float)flashcl_ref_load(scratch, desc->dtype, 0);
            for (int d = 0; d < D; d++)
                o[d] = (double)((float)o[d] + pr * (float)vr[d]);
        } else {
            for (int d = 0; d < D; d++)
                o[d] += s[j] / sum * vr[d];
        }
    }
    if (plain) {
        unsigned char scratch[4];
        for (int d = 0; d < D; d++) {
            flashcl_ref_store(scratch, desc->dtype, 0, o[d]);
            o[d] = flashcl_ref_load(scratch, desc->dtype, 0);
        }
    }
    *lse = m + log(plain ? (double)fsum : sum);
    free(s);
    return 1;
}

int flashcl_ref_check_paged_fp8(const flashcl_varlen_desc *desc, const void *q, const double *k, const double *v,
                                const void *out, const float *lse, int verbose, flashcl_ref_report *report) {
    // q, out: (total_q, Hq, D) in their layouts and desc->dtype; k, v: double
    // (total_k, Hk, D) packed; lse: float (Hq, total_q) or NULL.
    flashcl_ref_report local;
    if (!report)
        report = &local;
    memset(report, 0, sizeof *report);
    const int Hq = desc->heads_q, Hk = desc->heads_k, D = desc->head_dim, n = desc->num_seqs;
    const int total_q = desc->cu_seqlens_q[n], total_k = desc->cu_seqlens_k[n];
    const size_t count = (size_t)total_q * Hq * D;
    double *ref = malloc(count * sizeof(double)), *plain = malloc(count * sizeof(double));
    double *ref_lse = malloc((size_t)total_q * Hq * sizeof(double)), plain_lse;
    if (!ref || !plain || !ref_lse) {
        free(ref), free(plain), free(ref_lse);
        report->mismatches = (size_t)-1;
        return report->passed = 0;
    }
    // pass 1: the double reference and the plain implementation, row by row
    for (int i = 0; i < n; i++)
        for (int t = 0; t < desc->cu_seqlens_q[i + 1] - desc->cu_seqlens_q[i]; t++)
            for (int h = 0; h < Hq; h++) {
                const size_t row = (size_t)(desc->cu_seqlens_q[i] + t) * Hq + h;
                fp8_row(desc, q, k, v, i, t, h, 0, ref + row * D, &ref_lse[(size_t)h * total_q + row / Hq]);
                fp8_row(desc, q, k, v, i, t, h, 1, plain + row * D, &plain_lse);
            }
    // pass 2: the tolerance, as flashcl_ref_check_forward's: 2 * plain error,
    // eps at the outputs' size, and what float scores cost (2^-24 * scale *
    // max|q| * max|k| * max|v|, row norms)
    double plain_err = 0.0, max_ref = 0.0, qn = 0.0, kn = 0.0, vmax = 0.0;
    for (size_t x = 0; x < count; x++) {
        plain_err = fmax(plain_err, fabs(plain[x] - ref[x]));
        max_ref = fmax(max_ref, fabs(ref[x]));
    }
    size_t ss, sh;
    token_strides(&desc->q, Hq, D, &ss, &sh);
    for (int t = 0; t < total_q; t++)
        for (int h = 0; h < Hq; h++) {
            double sq = 0.0;
            for (int d = 0; d < D; d++) {
                double x = flashcl_ref_load(q, desc->dtype, desc->q.offset + (size_t)t * ss + (size_t)h * sh + (size_t)d);
                sq += x * x;
            }
            qn = fmax(qn, sqrt(sq));
        }
    for (size_t r = 0; r < (size_t)total_k * Hk; r++) {
        double sq = 0.0;
        for (int d = 0; d < D; d++) {
            sq += k[r * D + d] * k[r * D + d];
            vmax = fmax(vmax, fabs(v[r * D + d]));
        }
        kn = fmax(kn, sqrt(sq));
    }
    const double scale = desc->scale != 0.0f ? (double)desc->scale : (double)(1.0f / sqrtf((float)D));
    report->plain_err = plain_err;
    report->tolerance = 2.0 * plain_err + flashcl_ref_epsilon(desc->dtype) * fmax(1.0, max_ref) +
                        ldexp(1.0, -24) * scale * qn * kn * vmax;
    // pass 3: every output element where desc->out puts it; NaN fails
    token_strides(&desc->out, Hq, D, &ss, &sh);
    size_t printed = 0;
    for (int t = 0; t < total_q; t++)
        for (int h = 0; h < Hq; h++)
            for (int d = 0; d < D; d++) {
                double got = flashcl_ref_load(out, desc->dtype, desc->out.offset + (size_t)t * ss + (size_t)h * sh + (size_t)d);
                double want = ref[((size_t)t * Hq + h) * D + d];
                double e = isfinite(got) ? fabs(got - want) : INFINITY;
                report->max_err = fmax(report->max_err, e);
                if (e <= report->tolerance)
                    continue;
                if (report->mismatches++ == 0) {
                    report->first_bad[1] = (size_t)t;
                    report->first_bad[2] = (size_t)h;
                    report->first_bad[3] = (size_t)d;
                }
                if (verbose && printed++ < 8)
                    fprintf(stderr, "flashcl fp8 paged check: out[t=%d h=%d d=%d] = %.8g, ref %.8g, tol %.3g\n", t, h,
                            d, got, want, report->tolerance);
            }
    // pass 4: LSE, -inf exactly where no key is seen
    for (size_t x = 0; lse && x < (size_t)total_q * Hq; x++) {
        double got = lse[x], want = ref_lse[x];
        if (!flashcl_ref_lse_ok(got, want, 1e-3 + 1e-4 * fabs(want), report)) {
            report->mismatches++;
            if (verbose && printed++ < 8)
                fprintf(stderr, "flashcl fp8 paged check: lse[%zu] = %.8g, ref %.8g\n", x, got, want);
        }
    }
    free(ref), free(plain), free(ref_lse);
    report->passed = report->mismatches == 0;
    return report->passed;
}
