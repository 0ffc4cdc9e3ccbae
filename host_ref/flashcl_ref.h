/* flashcl_ref.h: the pure-C reference (the readable specification) and the
 * checking helpers that tests and `flashcl check` share. Built as the static
 * library flashcl_ref, independent of libflashcl: the two implementations
 * check each other. */
#ifndef FLASHCL_REF_H
#define FLASHCL_REF_H

#include <stddef.h>
#include <stdint.h>

#include "flashcl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- storage types -------------------------------------------------------
 * Conversions round to nearest, ties to even, as vstore_half does; NaN stays
 * NaN, overflow goes to infinity. */
float flashcl_ref_half_to_float(uint16_t h);
uint16_t flashcl_ref_float_to_half(float f);
float flashcl_ref_bf16_to_float(uint16_t b);
uint16_t flashcl_ref_float_to_bf16(float f);

/* FP8 (FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT8_E5M2), host_ref/ref_fp8.c: exact
 * decoding; encoding to the nearest value, ties to even, saturating to +-max
 * (cvt.rn.satfinite), NaN to 0x7f with the sign. */
double flashcl_ref_fp8_decode(flashcl_dtype format, unsigned char bits);
unsigned char flashcl_ref_fp8_encode(flashcl_dtype format, double value);
/* The descale factor of an FP8 forward desc (flashcl_fp8_scales) for row
 * `row` of head h (a query head for q, a KV head for k and v) of batch b;
 * tensor 0 q, 1 k, 2 v. 1 when desc->dtype is not FP8 or the array is NULL. */
double flashcl_ref_fp8_descale(const flashcl_attention_desc *desc, int tensor, int b, int h, int row);

/* Element `index` of an array of `dtype`, widened to double. */
double flashcl_ref_load(const void *base, flashcl_dtype dtype, size_t index);
/* Rounds `value` to `dtype` (through float) and stores it at `index`. */
void flashcl_ref_store(void *base, flashcl_dtype dtype, size_t index, double value);

/* ---- masks -----------------------------------------------------------------
 * The keys query row i may see, for a desc passed through
 * flashcl_attention_desc_resolve(): the interval [*lo, *hi]. Returns 0 and
 * leaves lo > hi when the row sees no key. */
int flashcl_ref_visible_keys(const flashcl_attention_desc *desc, int i, int *lo, int *hi);

/* ---- forward attention -----------------------------------------------------
 * desc: resolved. q, k, v: storage dtype, laid out as desc->q/k/v say.
 * out:  double [batch][seqlen_q][heads_q][head_dim] (packed, not desc->out).
 * lse:  double [batch][heads_q][seqlen_q], may be NULL; -INFINITY for a row
 *       that sees no key (whose output is 0).
 * scores, probs: optional debug outputs, double
 *       [batch][heads_q][seqlen_q][seqlen_k]: the scaled (soft-capped) logits
 *       with -INFINITY where masked, and the softmax probabilities (0 where
 *       masked; a row that sees no key is all -INFINITY and all 0).
 * Defensively, all-zero strides are taken as packed and scale 0 as
 * 1/sqrt(head_dim), as resolve would. If an internal allocation fails, every
 * given output is filled with NaN (so any comparison against it fails).
 * Everything is computed in double from the stored (already rounded) inputs. */
void flashcl_ref_attention_forward(const flashcl_attention_desc *desc, const void *q, const void *k,
                                   const void *v, double *out, double *lse, double *scores,
                                   double *probs);

/* A plain (non-tiled) implementation in the storage precision, used to set
 * tolerances the way flash-attn's tests do: scores and softmax in float, the
 * probabilities rounded to the storage dtype before P·V, accumulation in
 * float, the output rounded to the storage dtype (FP8 inputs: out_dtype for
 * both). Same out layout as above. */
void flashcl_ref_attention_forward_plain(const flashcl_attention_desc *desc, const void *q,
                                         const void *k, const void *v, double *out);
/* The same with P in e4m3 for P·V: 256 exp(s - m) rounded to e4m3 (m the
 * row's max), divided by the row's sum after; a model of an FP8 kernel that
 * multiplies P·V in e4m3 (nv-wgmma-fp8, FlashAttention-3's FP8), which
 * rounds against the running max instead: the same 2^-4 relative error per
 * element, at other points. */
void flashcl_ref_attention_forward_plain_p8(const flashcl_attention_desc *desc, const void *q, const void *k,
                                            const void *v, double *out);

/* ---- seeded random numbers (never bare rand()) ------------------------------ */
typedef struct flashcl_ref_rng {
    uint64_t state;
} flashcl_ref_rng;
void flashcl_ref_rng_seed(flashcl_ref_rng *rng, uint64_t seed);
uint64_t flashcl_ref_rng_next(flashcl_ref_rng *rng);  /* splitmix64 */
double flashcl_ref_rng_uniform(flashcl_ref_rng *rng); /* [0, 1)     */
double flashcl_ref_rng_normal(flashcl_ref_rng *rng);  /* N(0, 1)    */
/* Fills `count` elements of `dtype` with N(0,1) * stddev, rounded to dtype. */
void flashcl_ref_fill_normal(flashcl_ref_rng *rng, void *base, flashcl_dtype dtype, size_t count,
                             double stddev);
/* Fills `count` elements with a NaN bit pattern so unwritten outputs fail. */
void flashcl_ref_poison(void *base, flashcl_dtype dtype, size_t count);

/* ---- checking ---------------------------------------------------------------
 * Compares a forward result against the double reference with flash-attn's
 * rule: max|out - ref| <= 2 * max|plain - ref| + slack, where
 *   slack = eps(dtype) * max(1, max|ref|) + 2^-24 * scale * max|q| * max|k| * max|v|
 * (|q|, |k| row norms): the first term scales with the outputs' size, the
 * second is what rounding float scores costs any kernel; plain is
 * flashcl_ref_attention_forward_plain; lse (if given) must match the double
 * LSE within 1e-3 + 1e-4|lse|, -inf exactly where the reference is -inf.
 * NaN anywhere fails. out is in desc->out layout and the storage dtype (an
 * FP8 desc's out_dtype; its inputs are descale * decode(byte) throughout); lse
 * is float [batch][heads_q][seqlen_q] or NULL. */
typedef struct flashcl_ref_report {
    double max_err;      /* max |out - ref| (inf if out has NaN/inf) */
    double plain_err;    /* max |plain - ref|                        */
    double tolerance;    /* 2 * plain_err + slack                    */
    double max_lse_err;  /* max |lse - ref_lse| where ref_lse finite */
    size_t mismatches;   /* elements (out or lse) outside tolerance,
                            (size_t)-1 if the reference could not run */
    size_t first_bad[4]; /* b, i, h, d of the first bad out element
                            (all 0 when only lse entries failed)     */
    int passed;          /* 1 when everything is within tolerance    */
} flashcl_ref_report;

/* Epsilon of the rule above for a storage dtype. */
double flashcl_ref_epsilon(flashcl_dtype dtype);

/* One LSE against the reference's: -inf exactly where want is -inf (its row sees no key),
 * else |got - want| <= tol (NaN fails), recorded in report->max_lse_err. Returns 1 if right. */
int flashcl_ref_lse_ok(double got, double want, double tol, flashcl_ref_report *report);

/* Runs the reference and the plain implementation on q, k, v and checks out
 * and lse against them. When `verbose` is nonzero, the first few mismatches
 * are printed to stderr with their indices. Returns report->passed. */
int flashcl_ref_check_forward(const flashcl_attention_desc *desc, const void *q, const void *k,
                              const void *v, const void *out, const float *lse, int verbose,
                              flashcl_ref_report *report);
/* flashcl_ref_check_forward for a result rounded to the storage type
 * extra_roundings more times than one kernel's output is (e.g. partial
 * outputs, each rounded, merged with rounding): the tolerance grows by half a
 * storage ulp of max(|output|, |v|) for each (every value rounded on the way
 * is a convex combination of v's rows). */
int flashcl_ref_check_forward_rounded(const flashcl_attention_desc *desc, const void *q, const void *k, const void *v,
                                      const void *out, const float *lse, int extra_roundings, int verbose,
                                      flashcl_ref_report *report);
/* flashcl_ref_check_forward for a kernel that rounds P to e4m3 before P·V
 * (nv-wgmma-fp8): the plain baseline is flashcl_ref_attention_forward_plain_p8,
 * so the tolerance includes what that rounding costs (~2^-4 of the output). */
int flashcl_ref_check_forward_p8(const flashcl_attention_desc *desc, const void *q, const void *k, const void *v,
                                 const void *out, const float *lse, int verbose, flashcl_ref_report *report);
/* The same check with K and V stored apart from q and out, as an FP8 KV
 * cache holds them: k, v in kv_dtype (in desc->k, desc->v's layouts), each
 * element standing for descale * value with the descale of its KV head,
 * k_scales[h] and v_scales[h] (NULL: desc's FP8 descales, 1 unless desc is
 * FP8); q and out in desc->dtype (not FP8 here). The reference and the plain
 * implementation read K/V as those products (exact in double, rounded to
 * float for plain), so what quantization lost is not counted against the
 * kernel; the rule is flashcl_ref_check_forward's, which is this check with
 * kv_dtype = desc->dtype and no scales. */
int flashcl_ref_check_forward_kv(const flashcl_attention_desc *desc, const void *q, const void *k, const void *v,
                                 flashcl_dtype kv_dtype, const float *k_scales, const float *v_scales,
                                 const void *out, const float *lse, int verbose, flashcl_ref_report *report);

/* ---- serving: merge, varlen, paged pools (ref_serving.c) --------------------- */

/* The merge of two partial results in double (see flashcl_attention_merge):
 * out double [batch][seqlen][heads][head_dim] packed, lse double
 * [batch][heads][seqlen] (may be NULL). */
void flashcl_ref_attention_merge(const flashcl_merge_desc *desc, const void *o1, const float *lse1,
                                 const void *o2, const float *lse2, double *out, double *lse);
/* Checks a merge result (out in desc->out's layout, lse_out from its offset,
 * may be NULL) against the double merge: within the storage rounding of each
 * element plus a few float ulps; -inf exactly where the reference is -inf. */
int flashcl_ref_check_merge(const flashcl_merge_desc *desc, const void *o1, const float *lse1,
                            const void *o2, const float *lse2, const void *out, const float *lse_out,
                            int verbose, flashcl_ref_report *report);

/* A varlen batch: each sequence run alone through
 * flashcl_ref_attention_forward. out double [total_q][heads_q][head_dim]
 * packed; lse double [heads_q][total_q] (may be NULL). */
void flashcl_ref_varlen_forward(const flashcl_varlen_desc *desc, const void *q, const void *k,
                                const void *v, double *out, double *lse);
/* Checks a varlen result sequence by sequence with flashcl_ref_check_forward's
 * rule (lse float [heads_q][total_q] or NULL); first_bad is (sequence, query
 * token within it, head, d). */
int flashcl_ref_check_varlen(const flashcl_varlen_desc *desc, const void *q, const void *k, const void *v,
                             const void *out, const float *lse, int verbose, flashcl_ref_report *report);

/* Copies a sequence's tokens out of a paged pool [num_pages][page_size]
 * [heads_k][head_dim] into dense [length][heads_k][head_dim] (same dtype;
 * FP8 pages are copied as their bytes). */
void flashcl_ref_kv_gather(const void *pool, flashcl_dtype dtype, int page_size, int heads_k, int head_dim,
                           const int *pages, int length, void *dense);

/* Checks paged attention over FP8 pages (a cache with page_dtype FP8): desc
 * as for flashcl_ref_check_varlen (q, out in desc's dtype and layouts,
 * cu_seqlens_k giving each sequence's keys; desc->k, desc->v are ignored),
 * k, v the FP8 bytes of every sequence back to back, packed [total_k]
 * [heads_k][head_dim] in kv_format (flashcl_ref_kv_gather), k_scales and
 * v_scales the cache's descale per KV head (NULL: 1). Each sequence is
 * checked with flashcl_ref_check_forward_kv: the reference in double from
 * descale * decode(byte), the rule flashcl_ref_check_forward's. first_bad
 * as flashcl_ref_check_varlen's. */
int flashcl_ref_check_paged_fp8(const flashcl_varlen_desc *desc, const void *q, const void *k, const void *v,
                                flashcl_dtype kv_format, const float *k_scales, const float *v_scales,
                                const void *out, const float *lse, int verbose, flashcl_ref_report *report);

/* ---- backward (ref_backward.c) ---------------------------------------------
 * The exact gradients of the forward above, in double, recomputing O and LSE
 * itself: desc as for flashcl_ref_attention_forward; dout in dout_layout's
 * strides (NULL or all-zero strides: packed) and desc's dtype.
 *   dq: double [batch][seqlen_q][heads_q][head_dim] packed
 *   dk, dv: double [batch][seqlen_k][heads_k][head_dim] packed
 * On an allocation failure every output is NaN. */
void flashcl_ref_attention_backward(const flashcl_attention_desc *desc, const void *q, const void *k,
                                    const void *v, const void *dout, const flashcl_layout *dout_layout,
                                    double *dq, double *dk, double *dv);
/* The naive backward in the storage precision (float arithmetic, P, out,
 * dS and the gradients rounded to the dtype): the tolerance baseline. */
void flashcl_ref_attention_backward_plain(const flashcl_attention_desc *desc, const void *q,
                                          const void *k, const void *v, const void *dout,
                                          const flashcl_layout *dout_layout, double *dq, double *dk,
                                          double *dv);

/* Checks dq, dk, dv (storage dtype, in opts' layouts; opts NULL: packed)
 * with flash-attn's gradient rule, per tensor t:
 *   max|got - ref| <= 3 * max|plain - ref|
 *                     + max(0, max|stored - ref| - max|plain - ref|)
 *                     + eps(dtype) * max(1, max|ref|)
 *                     + 4 * 2^-24 * scale * max|q| * max|k| * max|ref|
 * (stored: the exact gradients with D_i taken from out rounded to the dtype,
 * as every kernel that reads the stored out gets them, counted where the
 * plain implementation's error does not already show as much; |q|, |k| row norms:
 * the last term is what float scores cost any kernel). NaN or inf anywhere
 * fails. Index 0, 1, 2 = dq, dk, dv. */
typedef struct flashcl_ref_grad_report {
    double max_err[3], plain_err[3], stored_out_err[3], tolerance[3];
    size_t mismatches; /* (size_t)-1 if the reference could not run */
    int passed;
} flashcl_ref_grad_report;
int flashcl_ref_check_backward(const flashcl_attention_desc *desc, const flashcl_backward_options *opts,
                               const void *q, const void *k, const void *v, const void *dout,
                               const void *dq, const void *dk, const void *dv, int verbose,
                               flashcl_ref_grad_report *report);

/* ---- speculative decoding (ref_spec.c) --------------------------------------
 * The specification of flashcl_spec_verify (rules in ref_spec.c's header):
 * same arguments, same outputs, bit for bit. q may be NULL when greedy. */
void flashcl_ref_spec_verify(const flashcl_spec_desc *desc, const int *draft, const float *q, const float *p,
                             int *accepted, int *tokens);
/* Philox4x32-10 (Random123): out = the block of counter ctr under key. */
void flashcl_ref_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* floor(a * b / 2^64). */
uint64_t flashcl_ref_mulhi64(uint64_t a, uint64_t b);
/* The fixed-operation exp2 of the logits path: 0 below -40. */
float flashcl_ref_spec_exp2(float x);

#ifdef __cplusplus
}
#endif
#endif /* FLASHCL_REF_H */
