/* fp8.cl: amax-scaled quantization to FP8 on the device (flashcl_fp8_quantize, src/fp8.c).
 *
 * Two kernels, one work-item per (batch, seq, head) row of head_dim elements
 * in the source's layout (elem_t: float32, float16 or bfloat16, by DTYPE):
 *   fp8_amax:     amax[g] = the bits of the largest |x| of group g (a (batch,
 *                 head) pair when per_head, else 0), amax[groups] of all.
 *                 Non-negative floats order as their bit patterns, and NaN's
 *                 bits lie above infinity's, above every finite value's, so
 *                 one atomic_max on uints finds the maximum and any non-finite
 *                 input at once.
 *   fp8_quantize: dst (packed [batch][seqlen][heads][head_dim] bytes) =
 *                 encode(x * inv[g]), inv computed by the host (a correctly
 *                 rounded division there; OpenCL's float divide may be off by
 *                 2.5 ulp), so the bytes equal flashcl_fp8_quantize_host's.
 * encode is common.cl's (src/fp8.c's rules); FP8_E5M2 picks the format.
 */
#ifndef FP8_E5M2
#define FP8_E5M2 0
#endif
#if FP8_E5M2
#define fp8_encode float_to_fp8_e5m2
#else
#define fp8_encode float_to_fp8_e4m3
#endif

#define ROW_ARGS                                                                                   \
    __global const elem_t *restrict src, ulong off, ulong sb, ulong ss, ulong sh, int heads, int head_dim, \
        int per_head
#define ROW_START (off + (ulong)b * sb + (ulong)s * ss + (ulong)h * sh)

__kernel void fp8_amax(ROW_ARGS, __global uint *restrict amax) {
    const int s = (int)get_global_id(0), h = (int)get_global_id(1), b = (int)get_global_id(2);
    const ulong row = ROW_START;
    uint m = 0;
    for (int d = 0; d < head_dim; ++d)
        m = max(m, as_uint(fabs(LOAD_ELEM(src, row + d))));
    const int groups = per_head ? (int)get_global_size(2) * heads : 1;
    atomic_max(&amax[per_head ? b * heads + h : 0], m);
    atomic_max(&amax[groups], m);
}

__kernel void fp8_quantize(ROW_ARGS, __global const float *restrict inv, __global uchar *restrict dst) {
    const int s = (int)get_global_id(0), h = (int)get_global_id(1), b = (int)get_global_id(2);
    const ulong row = ROW_START;
    const float scale = inv[per_head ? b * heads + h : 0];
    const ulong out = (((ulong)b * get_global_size(0) + (ulong)s) * (ulong)heads + (ulong)h) * (ulong)head_dim;
    for (int d = 0; d < head_dim; ++d)
        dst[out + d] = fp8_encode(LOAD_ELEM(src, row + d) * scale);
}
