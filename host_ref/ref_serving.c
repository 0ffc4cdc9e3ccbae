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
 *   (decode exact, the descale its kv head's): gathered, its sequences are
 *   checked as a varlen batch whose K/V the forward reads in their own type.
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

/* The checks of flashcl_ref_check_varlen and flashcl_ref_check_paged_fp8: K/V
 * stored as kv_dtype with per-KV-head descales (flashcl_ref_check_forward_kv). */
static int check_sequences(const flashcl_varlen_desc *desc, const void *q, const void *k, const void *v,
                           flashcl_dtype kv_dtype, const float *k_scales, const float *v_scales, const void *out,
                           const float *lse, int verbose, flashcl_ref_report *report) {
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
            ok = flashcl_ref_check_forward_kv(&d, q, k, v, kv_dtype, k_scales, v_scales, out, seq_lse, verbose, &one);
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

int flashcl_ref_check_varlen(const flashcl_varlen_desc *desc, const void *q, const void *k, const void *v,
                             const void *out, const float *lse, int verbose, flashcl_ref_report *report) {
    return check_sequences(desc, q, k, v, desc->dtype, NULL, NULL, out, lse, verbose, report);
}

/* ----------------------------------------------------------------------------
 * paged KV pools
 * ------------------------------------------------------------------------- */

void flashcl_ref_kv_gather(const void *pool, flashcl_dtype dtype, int page_size, int heads_k, int head_dim,
                           const int *pages, int length, void *dense) {
    // pool: (num_pages, page_size, Hk, D); dense: (length, Hk, D), same dtype.
    // Token n lives in row n % page_size of physical page pages[n / page_size].
    const size_t row = (size_t)heads_k * (size_t)head_dim;
    const size_t es = dtype == FLASHCL_FLOAT32 ? 4 : dtype == FLASHCL_FLOAT16 || dtype == FLASHCL_BFLOAT16 ? 2 : 1;
    for (int n = 0; n < length; n++) {
        size_t slot = (size_t)pages[n / page_size] * (size_t)page_size + (size_t)(n % page_size);
        memcpy((char *)dense + (size_t)n * row * es, (const char *)pool + slot * row * es, row * es);
    }
}

int flashcl_ref_check_paged_fp8(const flashcl_varlen_desc *desc, const void *q, const void *k, const void *v,
                                flashcl_dtype kv_format, const float *k_scales, const float *v_scales,
                                const void *out, const float *lse, int verbose, flashcl_ref_report *report) {
    // k, v are gathered bytes, packed whatever desc->k and desc->v say (a
    // paged desc's own K/V live in the cache's pools)
    flashcl_varlen_desc packed = *desc;
    memset(&packed.k, 0, sizeof packed.k);
    memset(&packed.v, 0, sizeof packed.v);
    return check_sequences(&packed, q, k, v, kv_format, k_scales, v_scales, out, lse, verbose, report);
}
