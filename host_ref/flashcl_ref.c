/* flashcl_ref.c: the pure-C reference of flashcl's forward attention, the
 * storage-type conversions, the seeded RNG and the checker built on them.
 *
 * This file is the clean, minimal reference of flashcl. As such:
 * - it runs on the CPU, in C11 with libc and libm only: no OpenCL, no threads,
 *   no intrinsics, no fast-math;
 * - it favours reading over speed: one query row at a time, plain loops split
 *   into numbered passes, every sum accumulated in double;
 * - it is the readable specification of every semantic choice the kernels
 *   and the host path must reproduce: where an element lives, which keys a
 *   row sees (bottom-right aligned masks), what a row that sees no key
 *   returns, how GQA maps heads, how soft-capping and rounding work.
 *
 * Two forwards live here. flashcl_ref_attention_forward is the "exact" answer
 * (double throughout). flashcl_ref_attention_forward_plain is what a naive
 * implementation gets in the storage precision; the distance between the two
 * sets the tolerance, as in flash-attn's tests: an optimised kernel may be at
 * most twice as wrong as the naive one.
 */
#include "flashcl_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ----------------------------------------------------------------------------
 * storage types
 * ------------------------------------------------------------------------- */

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u); /* memcpy, not a pointer cast: no aliasing UB */
    return u;
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float flashcl_ref_half_to_float(uint16_t h) {
    // h: IEEE binary16, 1 sign, 5 exponent (bias 15), 10 mantissa bits.
    // Every half is exactly a float, so this direction never rounds.
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1Fu;
    uint32_t mantissa = h & 0x3FFu;
    if (exponent == 0x1F) {
        // infinity, or NaN with its payload kept (a NaN mantissa is nonzero)
        return bits_float(sign | 0x7F800000u | (mantissa << 13));
    }
    if (exponent == 0) {
        // zero or subnormal: mantissa * 2^-24, exact in float
        float magnitude = ldexpf((float)mantissa, -24);
        return sign ? -magnitude : magnitude;
    }
    // normal: rebias the exponent from 15 to 127
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t flashcl_ref_float_to_half(float f) {
    // Round to nearest, ties to even, exactly like vstore_half_rte.
    uint32_t x = float_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7FFFFFFFu; // |f| as bits; ordered like the values
    if (a > 0x7F800000u) {
        // NaN: keep the top payload bits and force the quiet bit, so a
        // signalling NaN whose payload sits in the low bits stays a NaN
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    }
    if (a >= 0x477FF000u) {
        // 65520 is halfway between the largest half (65504, odd mantissa)
        // and 2^16: the tie goes to the even side, which is infinity
        return (uint16_t)(sign | 0x7C00u);
    }
    if (a < 0x38800000u) {
        // below 2^-14: a half subnormal m * 2^-24 (or zero). With the implicit
        // bit, |f| = mant * 2^(e-150), so m = mant >> (126 - e), rounded.
        uint32_t e = a >> 23;
        if (e < 102)
            return sign; // < 2^-25: under half the smallest subnormal
        uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e; // 14 .. 24
        uint32_t m = mant >> shift;
        uint32_t rest = mant & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rest > halfway || (rest == halfway && (m & 1u)))
            m++; // may reach 2^-14: fine
        return (uint16_t)(sign | m);
    }
    // normal: rebias 127 -> 15 and drop 13 mantissa bits, rounded. A carry out
    // of the mantissa correctly bumps the exponent; it cannot reach infinity
    // because the overflow case was handled above.
    uint32_t r = a - 0x38000000u;
    uint32_t m = r >> 13;
    uint32_t rest = r & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (m & 1u)))
        m++;
    return (uint16_t)(sign | m);
}

float flashcl_ref_bf16_to_float(uint16_t b) {
    // bfloat16 is the upper half of a binary32: widening is a shift
    return bits_float((uint32_t)b << 16);
}

uint16_t flashcl_ref_float_to_bf16(float f) {
    uint32_t x = float_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        // NaN: the rounding add below could carry it into infinity
        return (uint16_t)((x >> 16) | 0x0040u);
    }
    // Round to nearest even: add just under half an ulp, plus one when the kept
    // lowest bit is odd. Overflow carries into the exponent and gives infinity.
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* f rounded to `dtype` and widened back: the value a store then a load gives. */
static float round_to_dtype(float f, flashcl_dtype dtype) {
    switch (dtype) {
    case FLASHCL_FLOAT16:
        return flashcl_ref_half_to_float(flashcl_ref_float_to_half(f));
    case FLASHCL_BFLOAT16:
        return flashcl_ref_bf16_to_float(flashcl_ref_float_to_bf16(f));
    default:
        return f;
    }
}

double flashcl_ref_load(const void *base, flashcl_dtype dtype, size_t index) {
    switch (dtype) {
    case FLASHCL_FLOAT32:
        return ((const float *)base)[index];
    case FLASHCL_FLOAT16:
        return flashcl_ref_half_to_float(((const uint16_t *)base)[index]);
    case FLASHCL_BFLOAT16:
        return flashcl_ref_bf16_to_float(((const uint16_t *)base)[index]);
    case FLASHCL_FLOAT8_E4M3:
    case FLASHCL_FLOAT8_E5M2:
        return flashcl_ref_fp8_decode(dtype, ((const unsigned char *)base)[index]);
    }
    return NAN; // unknown dtype: a value no check can accept
}

void flashcl_ref_store(void *base, flashcl_dtype dtype, size_t index, double value) {
    // Through float, as the header says: a kernel computes in float and rounds
    // that float to the storage type, so the reference rounds the same way.
    float f = (float)value;
    switch (dtype) {
    case FLASHCL_FLOAT32:
        ((float *)base)[index] = f;
        break;
    case FLASHCL_FLOAT16:
        ((uint16_t *)base)[index] = flashcl_ref_float_to_half(f);
        break;
    case FLASHCL_BFLOAT16:
        ((uint16_t *)base)[index] = flashcl_ref_float_to_bf16(f);
        break;
    case FLASHCL_FLOAT8_E4M3:
    case FLASHCL_FLOAT8_E5M2:
        ((unsigned char *)base)[index] = flashcl_ref_fp8_encode(dtype, f);
        break;
    }
}

/* ----------------------------------------------------------------------------
 * layouts, heads and masks
 * ------------------------------------------------------------------------- */

/* The layout actually used: all-zero strides mean packed
 * [batch][seqlen][heads][head_dim]. Resolve already did this; repeating it is
 * harmless, since all-zero strides cannot mean anything else. */
static flashcl_layout effective_layout(flashcl_layout l, int seqlen, int heads, int head_dim) {
    if (l.stride_batch == 0 && l.stride_seq == 0 && l.stride_head == 0) {
        l.stride_head = (size_t)head_dim;
        l.stride_seq = (size_t)heads * (size_t)head_dim;
        l.stride_batch = (size_t)seqlen * l.stride_seq;
    }
    return l;
}

/* Index of element (b, n, h, 0) of a tensor; head_dim is always contiguous. */
static size_t row_index(const flashcl_layout *l, int b, int n, int h) {
    return l->offset + (size_t)b * l->stride_batch + (size_t)n * l->stride_seq +
           (size_t)h * l->stride_head;
}

/* The softmax scale: 0 means 1/sqrt(head_dim), computed in float exactly as
 * resolve does, so a resolved and an unresolved desc give the same bits. */
static double effective_scale(const flashcl_attention_desc *desc) {
    return desc->scale != 0.0f ? (double)desc->scale
                               : (double)(1.0f / sqrtf((float)desc->head_dim));
}

int flashcl_ref_visible_keys(const flashcl_attention_desc *desc, int i, int *lo, int *hi) {
    // Bottom-right alignment (flash-attn >= 2.1): the last query row lines up
    // with the last key, so with shift = seqlen_k - seqlen_q row i's diagonal
    // is key i + shift. Row i sees key j iff
    //     i + shift - window_left  <=  j  <=  i + shift + window_right
    // with a negative side unbounded, and always 0 <= j < seqlen_k.
    // When seqlen_q > seqlen_k the first rows have their diagonal left of key
    // 0 and, under a causal mask, see nothing at all.
    //
    // causal is right = 0 whatever window_right says (resolve already wrote
    // that; repeating it here means an unresolved desc still gets causal).
    // Without `windowed` both sides are unbounded, whatever they hold.
    int right = desc->causal ? 0 : desc->windowed ? desc->window_right : -1;
    int left = desc->windowed ? desc->window_left : -1;
    // long long: i + shift + window may leave int range (windows near INT_MAX)
    long long diag = (long long)i + (long long)desc->seqlen_k - (long long)desc->seqlen_q;
    long long first = 0, last = (long long)desc->seqlen_k - 1;
    if (left >= 0 && diag - left > first)
        first = diag - left;
    if (right >= 0 && diag + right < last)
        last = diag + right;
    if (first > last) {
        // Clip into [0, seqlen_k] x [-1, seqlen_k - 1] to fit an int; since
        // first >= 0 and last <= seqlen_k - 1 already, clipping keeps first > last.
        *lo = (int)(first > desc->seqlen_k ? desc->seqlen_k : first);
        *hi = (int)(last < -1 ? -1 : last);
        return 0;
    }
    *lo = (int)first;
    *hi = (int)last;
    return 1;
}

/* dot(a, b) over n elements. Four partial sums, because one running sum is a
 * chain of dependent adds, and these dots are most of the reference's time;
 * in double the order of the adds is far below what any check can see. */
static double dot_double(const double *a, const double *b, int n) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int d = 0;
    for (; d + 4 <= n; d += 4) {
        s0 += a[d] * b[d];
        s1 += a[d + 1] * b[d + 1];
        s2 += a[d + 2] * b[d + 2];
        s3 += a[d + 3] * b[d + 3];
    }
    for (; d < n; d++)
        s0 += a[d] * b[d];
    return (s0 + s1) + (s2 + s3);
}

/* The same in float, for the plain implementation: a blocked order, as any
 * real GEMM uses; the baseline models storage precision, not one order. */
static float dot_float(const float *a, const float *b, int n) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int d = 0;
    for (; d + 4 <= n; d += 4) {
        s0 += a[d] * b[d];
        s1 += a[d + 1] * b[d + 1];
        s2 += a[d + 2] * b[d + 2];
        s3 += a[d + 3] * b[d + 3];
    }
    for (; d < n; d++)
        s0 += a[d] * b[d];
    return (s0 + s1) + (s2 + s3);
}

/* y += a * x over n elements, the P.V update. restrict (y and x never
 * overlap) and the unrolled body let even -O2 pack it into vector
 * instructions; the element-wise result is the same as the plain loop's. */
static void axpy_double(double *restrict y, double a, const double *restrict x, int n) {
    int d = 0;
    for (; d + 4 <= n; d += 4) {
        y[d] += a * x[d];
        y[d + 1] += a * x[d + 1];
        y[d + 2] += a * x[d + 2];
        y[d + 3] += a * x[d + 3];
    }
    for (; d < n; d++)
        y[d] += a * x[d];
}

static void axpy_float(float *restrict y, float a, const float *restrict x, int n) {
    int d = 0;
    for (; d + 4 <= n; d += 4) {
        y[d] += a * x[d];
        y[d + 1] += a * x[d + 1];
        y[d + 2] += a * x[d + 2];
        y[d + 3] += a * x[d + 3];
    }
    for (; d < n; d++)
        y[d] += a * x[d];
}

/* ----------------------------------------------------------------------------
 * operands: how q, k and v are stored
 * ------------------------------------------------------------------------- */

/* How one of q, k, v is read: element x stands for descale * x in the
 * operand's own storage type (for FP8, descale * decode(byte): exact in
 * double). Two kinds of problems fill it: a forward desc, whose q, k, v all
 * share desc->dtype and take FP8 descales from desc->fp8; and an FP8 KV
 * cache, whose K/V bytes carry one static descale per KV head next to a
 * 16/32-bit q. One description lets both run the same forwards and checks. */
typedef struct operand {
    flashcl_dtype dtype;
    const float *head_scales; /* per KV head; NULL: desc's FP8 descale (1 unless desc is FP8) */
} operand;

/* q, k, v of a desc: its dtype; K and V may be stored apart as kv_dtype with
 * per-KV-head descales (NULL: desc's). */
static void describe_operands(const flashcl_attention_desc *desc, flashcl_dtype kv_dtype, const float *k_scales,
                              const float *v_scales, operand ops[3]) {
    ops[0] = (operand){desc->dtype, NULL};
    ops[1] = (operand){kv_dtype, k_scales};
    ops[2] = (operand){kv_dtype, v_scales};
}

/* The descale of row `row` of head h of batch b of operand t (0 q, 1 k, 2 v). */
static double descale(const flashcl_attention_desc *desc, const operand *ops, int t, int b, int h, int row) {
    return ops[t].head_scales ? (double)ops[t].head_scales[h] : flashcl_ref_fp8_descale(desc, t, b, h, row);
}

/* ----------------------------------------------------------------------------
 * forward attention, in double: the exact answer
 * ------------------------------------------------------------------------- */

/* Returns 0 when a buffer could not be allocated (nothing is written then). */
static int forward_double(const flashcl_attention_desc *desc, const operand *ops, const void *q, const void *k,
                          const void *v, double *out, double *lse, double *scores, double *probs) {
    // q: (B, Nq, Hq, D), k and v: (B, Nk, Hk, D), in their layouts and dtype
    // out: (B, Nq, Hq, D) packed; lse: (B, Hq, Nq); scores, probs: (B, Hq, Nq, Nk)
    const int B = desc->batch, Hq = desc->heads_q, Hk = desc->heads_k;
    const int Nq = desc->seqlen_q, Nk = desc->seqlen_k, D = desc->head_dim;
    const flashcl_layout ql = effective_layout(desc->q, Nq, Hq, D);
    const flashcl_layout kl = effective_layout(desc->k, Nk, Hk, D);
    const flashcl_layout vl = effective_layout(desc->v, Nk, Hk, D);
    const double scale = effective_scale(desc);
    const double softcap = (double)desc->softcap;
    // GQA: query heads come in Hk groups of `group` consecutive heads; group g
    // shares key/value head g, i.e. query head h reads key/value head h / group.
    // MHA is group 1, MQA is Hk 1.
    const int group = Hq / Hk;

    // One key/value head of one batch, widened to double and packed (Nk, D),
    // so that the inner loops read contiguous rows whatever the input strides.
    double *kh_buf = malloc((size_t)Nk * (size_t)D * sizeof(double));
    double *vh_buf = malloc((size_t)Nk * (size_t)D * sizeof(double));
    double *q_row = malloc((size_t)D * sizeof(double));
    double *s_row = malloc((size_t)Nk * sizeof(double)); // one row of scores, then of exp
    if (!kh_buf || !vh_buf || !q_row || !s_row) {
        free(kh_buf);
        free(vh_buf);
        free(q_row);
        free(s_row);
        return 0;
    }

    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < Hk; kvh++) {
            // pass 0: load K and V of (b, kvh) once for all the query heads that share them
            for (int j = 0; j < Nk; j++) {
                size_t kj = row_index(&kl, b, j, kvh), vj = row_index(&vl, b, j, kvh);
                // FP8: the real inputs are descale * decode(byte) (1 otherwise);
                // a float times a decoded FP8 value is exact in double.
                const double ks = descale(desc, ops, 1, b, kvh, j), vs = descale(desc, ops, 2, b, kvh, j);
                for (int d = 0; d < D; d++) {
                    kh_buf[(size_t)j * D + d] = ks * flashcl_ref_load(k, ops[1].dtype, kj + (size_t)d);
                    vh_buf[(size_t)j * D + d] = vs * flashcl_ref_load(v, ops[2].dtype, vj + (size_t)d);
                }
            }
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int i = 0; i < Nq; i++) {
                    double *o = out + (((size_t)b * Nq + i) * Hq + h) * D;
                    size_t stat = ((size_t)b * Hq + h) * Nq + i;        // (b, h, i) of lse
                    double *s_dbg = scores ? scores + stat * Nk : NULL; // row (b, h, i, :)
                    double *p_dbg = probs ? probs + stat * Nk : NULL;
                    size_t qi = row_index(&ql, b, i, h);
                    const double qs = descale(desc, ops, 0, b, h, i);
                    for (int d = 0; d < D; d++)
                        q_row[d] = qs * flashcl_ref_load(q, ops[0].dtype, qi + (size_t)d);

                    // Masked keys: score -inf, probability 0. Filling the whole
                    // debug row first leaves only the visible part to write.
                    for (int j = 0; j < Nk; j++) {
                        if (s_dbg)
                            s_dbg[j] = -INFINITY;
                        if (p_dbg)
                            p_dbg[j] = 0.0;
                    }
                    for (int d = 0; d < D; d++)
                        o[d] = 0.0;

                    int lo, hi;
                    if (!flashcl_ref_visible_keys(desc, i, &lo, &hi)) {
                        // A row that sees no key: softmax over an empty set is
                        // undefined; flash-attn returns 0 and LSE -inf (the log
                        // of an empty sum), and so do we. No -inf - -inf is ever
                        // evaluated, so no NaN can appear.
                        if (lse)
                            lse[stat] = -INFINITY;
                        continue;
                    }

                    // pass 1: scores s_j = scale * q_i . k_j (soft-capped), and their max
                    double m = -INFINITY;
                    for (int j = lo; j <= hi; j++) {
                        double s = scale * dot_double(q_row, kh_buf + (size_t)j * D, D);
                        // soft-capping (Gemma 2, Grok) squashes the logits smoothly
                        // into (-softcap, softcap); it applies after the scale
                        if (softcap > 0.0)
                            s = softcap * tanh(s / softcap);
                        s_row[j] = s;
                        if (s_dbg)
                            s_dbg[j] = s;
                        if (s > m)
                            m = s;
                    }

                    // pass 2: exp(s - m) and their sum. Subtracting the max keeps
                    // every exp in (0, 1] (no overflow) and at least one term 1.
                    double sum = 0.0;
                    for (int j = lo; j <= hi; j++) {
                        s_row[j] = exp(s_row[j] - m);
                        sum += s_row[j];
                    }

                    // pass 3: out_i = sum_j p_j v_j with p_j = exp(s_j - m) / sum
                    for (int j = lo; j <= hi; j++) {
                        double p = s_row[j] / sum;
                        if (p_dbg)
                            p_dbg[j] = p;
                        axpy_double(o, p, vh_buf + (size_t)j * D, D);
                    }

                    // pass 4: LSE = log sum_j exp(s_j) = m + log(sum), natural log:
                    // what the backward pass needs to recompute p_j = exp(s_j - LSE)
                    if (lse)
                        lse[stat] = m + log(sum);
                }
            }
        }
    }

    free(kh_buf);
    free(vh_buf);
    free(q_row);
    free(s_row);
    return 1;
}

/* Fills a double array with NaN: what a forward leaves when it cannot run, so
 * that any comparison against it fails instead of passing on stale memory. */
static void fill_nan(double *x, size_t count) {
    if (x)
        for (size_t n = 0; n < count; n++)
            x[n] = NAN;
}

void flashcl_ref_attention_forward(const flashcl_attention_desc *desc, const void *q, const void *k,
                                   const void *v, double *out, double *lse, double *scores,
                                   double *probs) {
    operand ops[3];
    describe_operands(desc, desc->dtype, NULL, NULL, ops);
    if (forward_double(desc, ops, q, k, v, out, lse, scores, probs))
        return;
    size_t rows = (size_t)desc->batch * desc->heads_q * desc->seqlen_q;
    fill_nan(out, rows * desc->head_dim);
    fill_nan(lse, rows);
    fill_nan(scores, rows * desc->seqlen_k);
    fill_nan(probs, rows * desc->seqlen_k);
}

/* ----------------------------------------------------------------------------
 * forward attention, plain, in the storage precision: the tolerance baseline
 * ------------------------------------------------------------------------- */

/* Returns 0 when a buffer could not be allocated (nothing is written then). */
/* The storage type of out: an FP8 desc's out_dtype (q, k, v are FP8, out is
 * not), else dtype. */
static flashcl_dtype out_dtype_of(const flashcl_attention_desc *desc) {
    const int fp8 = desc->dtype == FLASHCL_FLOAT8_E4M3 || desc->dtype == FLASHCL_FLOAT8_E5M2;
    return fp8 ? desc->out_dtype : desc->dtype;
}

static int forward_plain(const flashcl_attention_desc *desc, const operand *ops, const void *q, const void *k,
                         const void *v, double *out, int p_e4m3) {
    // q: (B, Nq, Hq, D), k and v: (B, Nk, Hk, D), in their layouts and dtype
    // out: (B, Nq, Hq, D) packed, each value rounded to the storage dtype
    //
    // Same loops as forward_double, with every number a float, plus the
    // roundings a non-fused implementation cannot avoid: P is stored in the
    // storage type before the P.V product, and so is the output. FP8 inputs:
    // descale * value rounded to float, P and out in out's type, or with
    // p_e4m3 the unnormalised P, exp(s - m) <= 1, times 256 in e4m3 before
    // the division by the row's sum: a model of what FlashAttention-3's FP8
    // forward and cl/flash_fwd_sm90_fp8.cl do for an FP8 P.V product (they
    // round against the running max, which is this m from the tile that
    // holds the row's max on; 256, a power of two, keeps a code for values
    // down to 2^-17).
    const int B = desc->batch, Hq = desc->heads_q, Hk = desc->heads_k;
    const int Nq = desc->seqlen_q, Nk = desc->seqlen_k, D = desc->head_dim;
    const flashcl_dtype odt = out_dtype_of(desc);
    const flashcl_layout ql = effective_layout(desc->q, Nq, Hq, D);
    const flashcl_layout kl = effective_layout(desc->k, Nk, Hk, D);
    const flashcl_layout vl = effective_layout(desc->v, Nk, Hk, D);
    const float scale = (float)effective_scale(desc);
    const float softcap = desc->softcap;
    const int group = Hq / Hk; // GQA mapping as in forward_double

    float *kh_buf = malloc((size_t)Nk * (size_t)D * sizeof(float));
    float *vh_buf = malloc((size_t)Nk * (size_t)D * sizeof(float));
    float *q_row = malloc((size_t)D * sizeof(float));
    float *s_row = malloc((size_t)Nk * sizeof(float));
    float *acc = malloc((size_t)D * sizeof(float));
    if (!kh_buf || !vh_buf || !q_row || !s_row || !acc) {
        free(kh_buf);
        free(vh_buf);
        free(q_row);
        free(s_row);
        free(acc);
        return 0;
    }

    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < Hk; kvh++) {
            // pass 0: K and V of (b, kvh) as floats (exact: every storage value is a float)
            for (int j = 0; j < Nk; j++) {
                size_t kj = row_index(&kl, b, j, kvh), vj = row_index(&vl, b, j, kvh);
                const double ks = descale(desc, ops, 1, b, kvh, j), vs = descale(desc, ops, 2, b, kvh, j);
                for (int d = 0; d < D; d++) {
                    kh_buf[(size_t)j * D + d] = (float)(ks * flashcl_ref_load(k, ops[1].dtype, kj + (size_t)d));
                    vh_buf[(size_t)j * D + d] = (float)(vs * flashcl_ref_load(v, ops[2].dtype, vj + (size_t)d));
                }
            }
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int i = 0; i < Nq; i++) {
                    double *o = out + (((size_t)b * Nq + i) * Hq + h) * D;
                    size_t qi = row_index(&ql, b, i, h);
                    const double qs = descale(desc, ops, 0, b, h, i);
                    for (int d = 0; d < D; d++)
                        q_row[d] = (float)(qs * flashcl_ref_load(q, ops[0].dtype, qi + (size_t)d));
                    for (int d = 0; d < D; d++)
                        acc[d] = 0.0f;

                    int lo, hi;
                    if (flashcl_ref_visible_keys(desc, i, &lo, &hi)) {
                        // pass 1: float scores, soft-capped, and their max
                        float m = -INFINITY;
                        for (int j = lo; j <= hi; j++) {
                            float s = scale * dot_float(q_row, kh_buf + (size_t)j * D, D);
                            if (softcap > 0.0f)
                                s = softcap * tanhf(s / softcap);
                            s_row[j] = s;
                            if (s > m)
                                m = s;
                        }
                        // pass 2: float softmax numerators and their float sum
                        float sum = 0.0f;
                        for (int j = lo; j <= hi; j++) {
                            s_row[j] = expf(s_row[j] - m);
                            sum += s_row[j];
                        }
                        // pass 3: P normalised in float, stored in the storage type,
                        // then P.V accumulated in float
                        for (int j = lo; j <= hi; j++) {
                            float p = round_to_dtype(s_row[j] / sum, odt);
                            if (p_e4m3) /* 256 exp(s - m), m the row's max, rounded; then / sum */
                                p = (float)(flashcl_ref_fp8_decode(FLASHCL_FLOAT8_E4M3,
                                                                   flashcl_ref_fp8_encode(FLASHCL_FLOAT8_E4M3,
                                                                                          256.0 * s_row[j])) /
                                            256.0) /
                                    sum;
                            axpy_float(acc, p, vh_buf + (size_t)j * D, D);
                        }
                    }
                    // pass 4: the output, as stored (a row that sees no key stays 0)
                    for (int d = 0; d < D; d++)
                        o[d] = (double)round_to_dtype(acc[d], odt);
                }
            }
        }
    }

    free(kh_buf);
    free(vh_buf);
    free(q_row);
    free(s_row);
    free(acc);
    return 1;
}

static void attention_forward_plain(const flashcl_attention_desc *desc, const void *q, const void *k,
                                    const void *v, double *out, int p_e4m3) {
    operand ops[3];
    describe_operands(desc, desc->dtype, NULL, NULL, ops);
    if (forward_plain(desc, ops, q, k, v, out, p_e4m3))
        return;
    fill_nan(out, (size_t)desc->batch * desc->heads_q * desc->seqlen_q * desc->head_dim);
}

void flashcl_ref_attention_forward_plain(const flashcl_attention_desc *desc, const void *q,
                                         const void *k, const void *v, double *out) {
    attention_forward_plain(desc, q, k, v, out, 0);
}

void flashcl_ref_attention_forward_plain_p8(const flashcl_attention_desc *desc, const void *q, const void *k,
                                            const void *v, double *out) {
    attention_forward_plain(desc, q, k, v, out, 1);
}

/* ----------------------------------------------------------------------------
 * seeded random numbers
 * ------------------------------------------------------------------------- */

void flashcl_ref_rng_seed(flashcl_ref_rng *rng, uint64_t seed) {
    // splitmix64 accepts any seed, 0 included: its output mixes state + constant
    rng->state = seed;
}

uint64_t flashcl_ref_rng_next(flashcl_ref_rng *rng) {
    // splitmix64 (Steele, Lea, Flood 2014): a Weyl sequence through a 64-bit
    // finaliser. Tiny, fast, passes BigCrush, and the same on every platform,
    // so a failing case can be replayed from its seed alone.
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double flashcl_ref_rng_uniform(flashcl_ref_rng *rng) {
    // the top 53 bits fill a double's significand: multiples of 2^-53 in [0, 1)
    return (double)(flashcl_ref_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

double flashcl_ref_rng_normal(flashcl_ref_rng *rng) {
    // Box-Muller. u1 = 1 - uniform lies in (0, 1], so log(u1) is finite. The
    // second normal of the pair is dropped: keeping it would need state
    // beyond the one word, and the tests do not need the speed.
    double u1 = 1.0 - flashcl_ref_rng_uniform(rng);
    double u2 = flashcl_ref_rng_uniform(rng);
    const double two_pi = 6.283185307179586476925286766559;
    return sqrt(-2.0 * log(u1)) * cos(two_pi * u2);
}

void flashcl_ref_fill_normal(flashcl_ref_rng *rng, void *base, flashcl_dtype dtype, size_t count,
                             double stddev) {
    for (size_t n = 0; n < count; n++)
        flashcl_ref_store(base, dtype, n, flashcl_ref_rng_normal(rng) * stddev);
}

void flashcl_ref_poison(void *base, flashcl_dtype dtype, size_t count) {
    // A quiet NaN in every element: an output element a kernel forgets to
    // write then fails the check (NaN never passes) instead of passing on
    // whatever the previous case left there.
    for (size_t n = 0; n < count; n++) {
        switch (dtype) {
        case FLASHCL_FLOAT32:
            ((float *)base)[n] = bits_float(0x7FC00000u);
            break;
        case FLASHCL_FLOAT16:
            ((uint16_t *)base)[n] = 0x7E00u;
            break;
        case FLASHCL_BFLOAT16:
            ((uint16_t *)base)[n] = 0x7FC0u;
            break;
        case FLASHCL_FLOAT8_E4M3:
        case FLASHCL_FLOAT8_E5M2:
            ((unsigned char *)base)[n] = 0x7Fu; /* NaN in both formats */
            break;
        }
    }
}

/* ----------------------------------------------------------------------------
 * checking
 * ------------------------------------------------------------------------- */

int flashcl_ref_lse_ok(double got, double want, double tol, flashcl_ref_report *report) {
    if (isinf(want))
        return isinf(got) && got < 0.0;
    const double e = isfinite(got) ? fabs(got - want) : INFINITY;
    report->max_lse_err = fmax(report->max_lse_err, e);
    return e <= tol;
}

double flashcl_ref_epsilon(flashcl_dtype dtype) {
    // The absolute slack added to 2 * plain_err. It covers what the rule's
    // relative part cannot: when the plain implementation happens to be nearly
    // exact on a case (tiny shapes, outputs that round exactly), 2 * plain_err
    // is near 0 but a correct kernel still rounds once more. The values are
    // about one storage ulp at |out| ~ 0.3, the typical size of an attention
    // output on N(0,1) inputs; flash-attn's newer tests use the same idea
    // (hopper/: fwd_atol = 2 * max|(out + 0.3 - 0.3) - out|).
    //   float32  ulp(0.3) = 3e-8, but float accumulation orders differ by far
    //            more over long rows: 1e-5
    //   float16  ulp(0.3) = 2^-12 = 2.4e-4: 2e-4
    //   bfloat16 ulp(0.3) = 2^-9  = 2.0e-3: 2e-3
    switch (dtype) {
    case FLASHCL_FLOAT32:
        return 1e-5;
    case FLASHCL_FLOAT16:
        return 2e-4;
    case FLASHCL_BFLOAT16:
        return 2e-3;
    case FLASHCL_FLOAT8_E4M3: /* ulp(0.3) = 2^-5: an FP8 output is not checked by this rule yet */
    case FLASHCL_FLOAT8_E5M2:
        return 0.0;
    }
    return 0.0;
}

/* Over the (batch, seq, head) rows of operand t (0 q, 1 k, 2 v), as descale * element: the
 * largest Euclidean norm of a row (norm 1), or the largest |element| (norm 0; for v, a bound on
 * every attention output and every partial one, convex combinations of v's rows). */
static double max_row_stat(const flashcl_attention_desc *desc, const operand *ops, int t, const void *x,
                           flashcl_layout l, int seqlen, int heads, int norm) {
    l = effective_layout(l, seqlen, heads, desc->head_dim);
    double best = 0.0;
    for (int b = 0; b < desc->batch; b++)
        for (int n = 0; n < seqlen; n++)
            for (int h = 0; h < heads; h++) {
                const size_t base = row_index(&l, b, n, h);
                const double sc = descale(desc, ops, t, b, h, n);
                double sum = 0.0;
                for (int d = 0; d < desc->head_dim; d++) {
                    const double e = sc * flashcl_ref_load(x, ops[t].dtype, base + (size_t)d);
                    if (norm)
                        sum += e * e;
                    else
                        best = fmax(best, fabs(e));
                }
                if (norm)
                    best = fmax(best, sqrt(sum));
            }
    return best;
}

/* What rounding the scores to float alone may cost, for any correct float
 * kernel: a score s carries an error of about 2^-24 |s| <= 2^-24 scale |q||k|
 * (Cauchy-Schwarz), and moves each output by at most that times max|v|. It
 * is negligible for N(0,1) inputs (~1e-6) but dominates when the logits are
 * in the hundreds, where two float kernels that sum in different orders
 * differ by far more than the plain baseline happens to err on one draw. */
static double score_rounding_bound(const flashcl_attention_desc *desc, const operand *ops, const void *q,
                                   const void *k, const void *v) {
    const double qn = max_row_stat(desc, ops, 0, q, desc->q, desc->seqlen_q, desc->heads_q, 1);
    const double kn = max_row_stat(desc, ops, 1, k, desc->k, desc->seqlen_k, desc->heads_k, 1);
    const double vmax = max_row_stat(desc, ops, 2, v, desc->v, desc->seqlen_k, desc->heads_k, 0);
    return ldexp(1.0, -24) * effective_scale(desc) * qn * kn * vmax;
}

enum { MAX_PRINTED = 8 }; // verbose: the first few mismatches say more than thousands

static int check_forward(const flashcl_attention_desc *desc, const void *q, const void *k, const void *v,
                         flashcl_dtype kv_dtype, const float *k_scales, const float *v_scales, const void *out,
                         const float *lse, int verbose, flashcl_ref_report *report, int p_e4m3,
                         int extra_roundings);

int flashcl_ref_check_forward(const flashcl_attention_desc *desc, const void *q, const void *k,
                              const void *v, const void *out, const float *lse, int verbose,
                              flashcl_ref_report *report) {
    return check_forward(desc, q, k, v, desc->dtype, NULL, NULL, out, lse, verbose, report, 0, 0);
}

int flashcl_ref_check_forward_rounded(const flashcl_attention_desc *desc, const void *q, const void *k, const void *v,
                                      const void *out, const float *lse, int extra_roundings, int verbose,
                                      flashcl_ref_report *report) {
    return check_forward(desc, q, k, v, desc->dtype, NULL, NULL, out, lse, verbose, report, 0, extra_roundings);
}

int flashcl_ref_check_forward_p8(const flashcl_attention_desc *desc, const void *q, const void *k, const void *v,
                                 const void *out, const float *lse, int verbose, flashcl_ref_report *report) {
    return check_forward(desc, q, k, v, desc->dtype, NULL, NULL, out, lse, verbose, report, 1, 0);
}

int flashcl_ref_check_forward_kv(const flashcl_attention_desc *desc, const void *q, const void *k, const void *v,
                                 flashcl_dtype kv_dtype, const float *k_scales, const float *v_scales,
                                 const void *out, const float *lse, int verbose, flashcl_ref_report *report) {
    return check_forward(desc, q, k, v, kv_dtype, k_scales, v_scales, out, lse, verbose, report, 0, 0);
}

static int check_forward(const flashcl_attention_desc *desc, const void *q, const void *k, const void *v,
                         flashcl_dtype kv_dtype, const float *k_scales, const float *v_scales, const void *out,
                         const float *lse, int verbose, flashcl_ref_report *report, int p_e4m3,
                         int extra_roundings) {
    // out: (B, Nq, Hq, D) in desc->out's layout and the storage dtype
    // lse: float (B, Hq, Nq) packed, or NULL
    operand ops[3];
    describe_operands(desc, kv_dtype, k_scales, v_scales, ops);
    flashcl_ref_report local;
    if (!report)
        report = &local;
    memset(report, 0, sizeof *report);

    const int B = desc->batch, Hq = desc->heads_q, Nq = desc->seqlen_q, D = desc->head_dim;
    const flashcl_layout ol = effective_layout(desc->out, Nq, Hq, D);
    const size_t rows = (size_t)B * Hq * Nq, count = rows * D;

    double *ref = malloc(count * sizeof(double));
    double *ref_lse = malloc(rows * sizeof(double));
    double *plain = malloc(count * sizeof(double));
    int ran = ref && ref_lse && plain && forward_double(desc, ops, q, k, v, ref, ref_lse, NULL, NULL) &&
              forward_plain(desc, ops, q, k, v, plain, p_e4m3);
    if (!ran) {
        free(ref);
        free(ref_lse);
        free(plain);
        report->mismatches = (size_t)-1;
        report->passed = 0;
        if (verbose)
            fprintf(stderr, "flashcl check: out of memory for the reference\n");
        return 0;
    }

    // pass 1: how wrong the plain implementation is sets the tolerance
    double plain_err = 0.0;
    for (size_t n = 0; n < count; n++) {
        double e = fabs(plain[n] - ref[n]);
        if (e > plain_err)
            plain_err = e;
    }
    // eps is a slack at the typical output size of N(0,1) inputs; outputs
    // of larger magnitude (large-valued V) get it relative to their size,
    // because every rounding error scales with them.
    double max_ref = 0.0;
    for (size_t n = 0; n < count; n++)
        max_ref = fmax(max_ref, fabs(ref[n]));
    const double eps = flashcl_ref_epsilon(out_dtype_of(desc)) * fmax(1.0, max_ref) +
                       score_rounding_bound(desc, ops, q, k, v);
    report->plain_err = plain_err;
    report->tolerance = 2.0 * plain_err + eps;
    if (extra_roundings > 0) {
        /* Each rounds a value no larger than max|v| (outputs, partial outputs and their merges are
         * convex combinations of v's rows): at most half a storage ulp of it. */
        const double bound = fmax(max_ref, max_row_stat(desc, ops, 2, v, desc->v, desc->seqlen_k, desc->heads_k, 0));
        const flashcl_dtype od = out_dtype_of(desc);
        const int mant = od == FLASHCL_FLOAT16 ? 10 : od == FLASHCL_BFLOAT16 ? 7 : 23;
        if (bound > 0.0 && isfinite(bound))
            report->tolerance += 0.5 * extra_roundings * ldexp(1.0, ilogb(bound) - mant);
    }

    // pass 2: every output element, read where desc->out says it lives. The
    // test is written so that NaN fails (!(e <= tol)), and any non-finite
    // value fails outright: the reference output is always finite.
    size_t printed = 0;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < Nq; i++) {
            for (int h = 0; h < Hq; h++) {
                size_t at = row_index(&ol, b, i, h);
                for (int d = 0; d < D; d++) {
                    double got = flashcl_ref_load(out, out_dtype_of(desc), at + (size_t)d);
                    double want = ref[(((size_t)b * Nq + i) * Hq + h) * D + d];
                    double e = isfinite(got) ? fabs(got - want) : INFINITY;
                    if (e > report->max_err)
                        report->max_err = e;
                    if (e <= report->tolerance)
                        continue;
                    if (report->mismatches == 0) {
                        report->first_bad[0] = (size_t)b;
                        report->first_bad[1] = (size_t)i;
                        report->first_bad[2] = (size_t)h;
                        report->first_bad[3] = (size_t)d;
                    }
                    report->mismatches++;
                    if (verbose && printed++ < MAX_PRINTED)
                        fprintf(stderr,
                                "flashcl check: out[b=%d i=%d h=%d d=%d] = %.8g, ref %.8g, "
                                "err %.3g > tol %.3g\n",
                                b, i, h, d, got, want, e, report->tolerance);
                }
            }
        }
    }

    // pass 3: LSE. A row that sees no key must say -inf exactly (a kernel
    // returning some huge negative number there would turn exp(s - lse) into
    // garbage in a backward pass); elsewhere a relative+absolute bound, loose
    // enough for a float log of a float sum.
    if (lse) {
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < Hq; h++) {
                for (int i = 0; i < Nq; i++) {
                    size_t n = ((size_t)b * Hq + h) * Nq + i;
                    double got = (double)lse[n], want = ref_lse[n];
                    if (flashcl_ref_lse_ok(got, want, 1e-3 + 1e-4 * fabs(want), report))
                        continue;
                    report->mismatches++;
                    if (verbose && printed++ < MAX_PRINTED)
                        fprintf(stderr, "flashcl check: lse[b=%d h=%d i=%d] = %.8g, ref %.8g\n", b,
                                h, i, got, want);
                }
            }
        }
    }

    report->passed = report->mismatches == 0;
    if (verbose && !report->passed)
        fprintf(stderr,
                "flashcl check: FAILED, %zu mismatches; max_err %.3g, tolerance %.3g "
                "(2 * plain_err %.3g + eps %.3g), max_lse_err %.3g\n",
                report->mismatches, report->max_err, report->tolerance, 2.0 * plain_err, eps,
                report->max_lse_err);

    free(ref);
    free(ref_lse);
    free(plain);
    return report->passed;
}
