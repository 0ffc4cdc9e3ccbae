/* fp8.cl: amax-scaled quantization to FP8 on the device and its inverse (flashcl_fp8_quantize,
 * flashcl_fp8_dequantize, src/fp8.c).
 *
 * Three kernels, one work-item per (batch, seq, head) row of head_dim elements
 * in the source's layout (elem_t: float32, float16 or bfloat16, by DTYPE):
 *   fp8_amax:     amax[g] = the bits of the largest |x| of group g (see
 *                 "Groups" below; 0 for all when not per_head), amax[groups] of all.
 *                 Non-negative floats order as their bit patterns, and NaN's
 *                 bits lie above infinity's, above every finite value's, so
 *                 one atomic_max on uints finds the maximum and any non-finite
 *                 input at once.
 *   fp8_quantize: dst (packed [batch][seqlen][heads][head_dim] bytes) =
 *                 encode(x * inv[g]), inv computed by the host (a correctly
 *                 rounded division there; OpenCL's float divide may be off by
 *                 2.5 ulp), so the bytes equal flashcl_fp8_quantize_host's.
 * encode is common.cl's (src/fp8.c's rules); FP8_E5M2 picks the format.
 *
 * Groups: with block_rows > 0 (and per_head) a group is block_rows rows of a
 * (batch, head): g = (b * heads + h) * ceil(seqlen / block_rows) + s / block_rows.
 * HADAMARD = D (a power of two, 0 for off): each row x becomes x M,
 * M = diag(signs) H_D / sqrt(D), before its amax and its encoding
 * (incoherent processing); hadamard_row repeats src/fp8.c's butterflies in
 * the same order, so the rounding, and so the bytes, are the host's. The
 * finiteness check (amax[groups]) looks at the row before the rotation,
 * which would turn an infinity into NaN.
 */
/* No contraction: a product rounded then added (the scaled values entering the Hadamard
 * butterflies) must stay two roundings, as in src/fp8.c, or the device's bytes and values
 * would differ from the host's wherever the compiler fuses them (NVIDIA does). */
#pragma OPENCL FP_CONTRACT OFF

#ifndef FP8_E5M2
#define FP8_E5M2 0
#endif
#define FP8_FORMAT (FP8_E5M2 ? 4 : 3) /* as flashcl_dtype */
#ifndef HADAMARD
#define HADAMARD 0 // head_dim when rows are rotated (a power of two <= 256), 0: off
#endif

#if HADAMARD
#define HADAMARD_ARGS , __global const float *restrict signs, float inv_sqrt_d
#else
#define HADAMARD_ARGS
#endif
#define ROW_ARGS                                                                                   \
    __global const elem_t *restrict src, ulong off, ulong sb, ulong ss, ulong sh, int heads, int head_dim, \
        int per_head, int block_rows HADAMARD_ARGS
#define ROW_START (off + (ulong)b * sb + (ulong)s * ss + (ulong)h * sh)
/* The same row in the packed [batch][seqlen][heads][head_dim] FP8 bytes. */
#define PACKED_ROW ((((ulong)b * get_global_size(0) + (ulong)s) * (ulong)heads + (ulong)h) * (ulong)head_dim)

/* The descale index of row s of head h of batch b (see above). */
inline int group_of(int b, int s, int h, int heads, int per_head, int block_rows) {
    if (!per_head)
        return 0;
    const int blocks = fp8_row_blocks((int)get_global_size(0), block_rows);
    return (b * heads + h) * blocks + (block_rows > 0 ? s / block_rows : 0);
}

#if HADAMARD
/* y <- y H_D (unnormalised): the Walsh-Hadamard butterflies in src/fp8.c's order. */
inline void walsh_hadamard(float *y) {
    for (int len = 1; len < HADAMARD; len <<= 1)
        for (int i = 0; i < HADAMARD; i += 2 * len)
            for (int j = i; j < i + len; ++j) {
                const float a = y[j], c = y[j + len];
                y[j] = a + c;
                y[j + len] = a - c;
            }
}

/* y <- y M in place: signs, the butterflies, 1/sqrt(D). */
inline void hadamard_row(float *y, __global const float *restrict signs, float inv_sqrt_d) {
    for (int i = 0; i < HADAMARD; ++i)
        y[i] *= signs[i];
    walsh_hadamard(y);
    for (int i = 0; i < HADAMARD; ++i)
        y[i] *= inv_sqrt_d;
}
#endif

__kernel void fp8_amax(ROW_ARGS, __global uint *restrict amax) {
    const int s = (int)get_global_id(0), h = (int)get_global_id(1), b = (int)get_global_id(2);
    const ulong row = ROW_START;
    uint m = 0, raw = 0;
#if HADAMARD
    float y[HADAMARD];
    for (int d = 0; d < HADAMARD; ++d) {
        y[d] = LOAD_ELEM(src, row + d);
        raw = max(raw, as_uint(fabs(y[d])));
    }
    hadamard_row(y, signs, inv_sqrt_d);
    for (int d = 0; d < HADAMARD; ++d)
        m = max(m, as_uint(fabs(y[d])));
#else
    for (int d = 0; d < head_dim; ++d)
        m = max(m, as_uint(fabs(LOAD_ELEM(src, row + d))));
    raw = m;
#endif
    const int blocks = fp8_row_blocks((int)get_global_size(0), block_rows);
    const int groups = per_head ? (int)get_global_size(2) * heads * blocks : 1;
    atomic_max(&amax[group_of(b, s, h, heads, per_head, block_rows)], m);
    atomic_max(&amax[groups], raw);
}

__kernel void fp8_quantize(ROW_ARGS, __global const float *restrict inv, __global uchar *restrict dst) {
    const int s = (int)get_global_id(0), h = (int)get_global_id(1), b = (int)get_global_id(2);
    const ulong row = ROW_START;
    const float scale = inv[group_of(b, s, h, heads, per_head, block_rows)];
    const ulong out = PACKED_ROW;
#if HADAMARD
    float y[HADAMARD];
    for (int d = 0; d < HADAMARD; ++d)
        y[d] = LOAD_ELEM(src, row + d);
    hadamard_row(y, signs, inv_sqrt_d);
    for (int d = 0; d < HADAMARD; ++d)
        dst[out + d] = FP8_ENCODE(FP8_FORMAT, y[d] * scale);
#else
    for (int d = 0; d < head_dim; ++d)
        dst[out + d] = FP8_ENCODE(FP8_FORMAT, LOAD_ELEM(src, row + d) * scale);
#endif
}

/* fp8_dequantize: the inverse, for flashcl_fp8_dequantize. src packed FP8
 * rows, dst (elem_t) in its layout: dst = descale[g] * decode(byte), rotated
 * back by M^T = H_D diag(signs) / sqrt(D) when HADAMARD. Whole groups of 8
 * decode through the float8 helpers, the rest one by one (the tests run all
 * 256 codes through each). */
__kernel void fp8_dequantize(__global elem_t *restrict dst, ulong off, ulong sb, ulong ss, ulong sh, int heads,
                             int head_dim, int per_head, int block_rows HADAMARD_ARGS,
                             __global const float *restrict descale, __global const uchar *restrict src) {
    const int s = (int)get_global_id(0), h = (int)get_global_id(1), b = (int)get_global_id(2);
    const ulong row = ROW_START;
    const float scale = descale[group_of(b, s, h, heads, per_head, block_rows)];
    const ulong in = PACKED_ROW;
#if HADAMARD
    /* x = y M^T: the butterflies, 1/sqrt(D), then the signs. */
    float y[HADAMARD];
    for (int d = 0; d < HADAMARD; ++d)
        y[d] = FP8_DECODE(FP8_FORMAT, src[in + d]) * scale;
    walsh_hadamard(y);
    for (int d = 0; d < HADAMARD; ++d)
        STORE_ELEM(dst, row + d, y[d] * inv_sqrt_d * signs[d]);
#else
    int d = 0;
    for (; d + 8 <= head_dim; d += 8) {
        const float8 x = FP8_DECODE8(FP8_FORMAT, vload8(0, src + in + d)) * scale;
        STORE_ELEM(dst, row + d, x.s0);
        STORE_ELEM(dst, row + d + 1, x.s1);
        STORE_ELEM(dst, row + d + 2, x.s2);
        STORE_ELEM(dst, row + d + 3, x.s3);
        STORE_ELEM(dst, row + d + 4, x.s4);
        STORE_ELEM(dst, row + d + 5, x.s5);
        STORE_ELEM(dst, row + d + 6, x.s6);
        STORE_ELEM(dst, row + d + 7, x.s7);
    }
    for (; d < head_dim; ++d)
        STORE_ELEM(dst, row + d, FP8_DECODE(FP8_FORMAT, src[in + d]) * scale);
#endif
}
