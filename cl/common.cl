/* common.cl: what every flashcl kernel shares: storage types, FP8 decoding,
 * the visible-key rule, and the argument lists of the forward and backward.
 *
 * The host (src/program.c) builds each kernel from this file, then
 * common_nv.cl (the tensor-core kernels' pieces), common_nv_bwd.cl (the
 * tensor-core backward's) and common_serving.cl (the serving kernels'), then
 * the kernel's own file, as one source. Every kernel
 * stores its tensors in one of three types and computes in float:
 *   DTYPE 0  float32   plain loads and stores
 *   DTYPE 1  float16   vload_half / vstore_half_rte: core OpenCL 1.2, so no
 *                      cl_khr_fp16 is needed (NVIDIA does not advertise it)
 *   DTYPE 2  bfloat16  raw 16-bit patterns in ushort: the upper half of a
 *                      float, rounded to nearest even on store
 * LOAD_ELEM8 reads 8 consecutive elements at any element offset (vload_half8
 * needs no alignment beyond the element's own) into a float8.
 */
#ifndef DTYPE
#define DTYPE 1
#endif

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

#if DTYPE == 0
typedef float elem_t;
#define LOAD_ELEM(p, i) ((p)[i])
#define LOAD_ELEM8(p, i) vload8(0, (p) + (i))
#define STORE_ELEM(p, i, x) ((p)[i] = (x))
#elif DTYPE == 1
typedef half elem_t;
#define LOAD_ELEM(p, i) vload_half((i), (p))
#define LOAD_ELEM8(p, i) vload_half8(0, (p) + (i))
#define STORE_ELEM(p, i, x) vstore_half_rte((x), (i), (p))
#elif DTYPE == 2
typedef ushort elem_t;
#define LOAD_ELEM(p, i) as_float((uint)(p)[i] << 16)
#define LOAD_ELEM8(p, i) as_float8(convert_uint8(vload8(0, (p) + (i))) << 16)
#define STORE_ELEM(p, i, x) ((p)[i] = float_to_bf16(x))

/* Round to nearest even by adding 0x7fff plus the lowest kept bit; NaN is
 * kept quiet explicitly because the add could carry it into infinity. */
inline ushort float_to_bf16(float x) {
    uint u = as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}
#else
#error "DTYPE must be 0 (float32), 1 (float16) or 2 (bfloat16)"
#endif

/* FP8 storage (the OCP formats of flashcl_dtype 3 and 4; src/fp8.c is the
 * host's copy of these rules). A kernel whose K and V (KV_FP8) or Q (Q_FP8)
 * are FP8 bytes is built with -DKV_FP8=3|4 and/or -DQ_FP8=3|4; out stays in
 * DTYPE. kv_t / q_t are then uchar and LOAD_KV / LOAD_Q decode to float
 * (exactly: every FP8 value is a float). Without them kv_t = q_t = elem_t.
 * Descale factors are the caller's business: the loads return the FP8 value.
 *
 * Decoding is bit arithmetic, no table: a normal e4m3 magnitude's 7 bits
 * shifted to a float's exponent/mantissa boundary and rebiased (+120 = 127 -
 * 7) is the value; e5m2 is the same with +112 (127 - 15). Subnormals are
 * m * 2^-9 (e4m3) and m * 2^-16 (e5m2); e4m3's 0x7f and e5m2's codes above
 * 0x7c are NaN, e5m2's 0x7c infinity. */
inline float fp8_e4m3_to_float(uint b) {
    const uint mag = b & 0x7fu;
    float v = mag < 8u ? (float)mag * 0x1p-9f : as_float((mag << 20) + (120u << 23));
    v = mag == 0x7fu ? NAN : v;
    return as_float(as_uint(v) | ((b & 0x80u) << 24));
}
inline float fp8_e5m2_to_float(uint b) {
    const uint mag = b & 0x7fu;
    float v = mag < 4u ? (float)mag * 0x1p-16f : as_float((mag << 21) + (112u << 23));
    v = mag == 0x7cu ? INFINITY : v;
    v = mag > 0x7cu ? NAN : v;
    return as_float(as_uint(v) | ((b & 0x80u) << 24));
}
inline float8 fp8_e4m3_to_float8(uchar8 b8) {
    const uint8 b = convert_uint8(b8), mag = b & 0x7fu;
    const float8 sub = convert_float8(mag) * 0x1p-9f;
    float8 v = as_float8((mag << 20) + (120u << 23));
    v = select(v, sub, as_int8(mag < 8u));
    v = select(v, (float8)NAN, as_int8(mag == 0x7fu));
    return as_float8(as_uint8(v) | ((b & 0x80u) << 24));
}
inline float8 fp8_e5m2_to_float8(uchar8 b8) {
    const uint8 b = convert_uint8(b8), mag = b & 0x7fu;
    const float8 sub = convert_float8(mag) * 0x1p-16f;
    float8 v = as_float8((mag << 21) + (112u << 23));
    v = select(v, sub, as_int8(mag < 4u));
    v = select(v, (float8)INFINITY, as_int8(mag == 0x7cu));
    v = select(v, (float8)NAN, as_int8(mag > 0x7cu));
    return as_float8(as_uint8(v) | ((b & 0x80u) << 24));
}

/* Encoding: round to nearest even at the binade's quantum (exact scaling by a
 * power of two, then rint), saturating to +-max as cvt.rn.satfinite does;
 * NaN stays NaN (0x7f with the sign). man/bias/max_code pick the format. */
inline uchar fp8_encode_fmt(float value, int man, int bias, float max_value, uint max_code) {
    const uint sign = signbit(value) ? 0x80u : 0u;
    if (isnan(value))
        return (uchar)(0x7fu | sign);
    const float a = fabs(value);
    if (a >= max_value)
        return (uchar)(sign | max_code);
    int e;
    frexp(a, &e);
    const int binade = max(e - 1, 1 - bias);
    const float q = rint(ldexp(a, man - binade));
    uint code = a < ldexp(1.0f, 1 - bias) ? (uint)q : ((uint)(binade + bias) << man) + (uint)q - (1u << man);
    return (uchar)(sign | min(code, max_code));
}
inline uchar float_to_fp8_e4m3(float x) { return fp8_encode_fmt(x, 3, 7, 448.0f, 0x7eu); }
inline uchar float_to_fp8_e5m2(float x) { return fp8_encode_fmt(x, 2, 15, 57344.0f, 0x7bu); }

/* Row blocks of n >= 1 rows with a descale factor every `rows` rows (0: one
 * block): ceil(n / rows) without forming n + rows, as src/internal.h's
 * flashcl_fp8_row_blocks. */
inline int fp8_row_blocks(int n, int rows) { return rows > 0 ? (n - 1) / rows + 1 : 1; }

/* 2^x on the FMA and integer pipes alone, for the softmax's exponents (x <= 0;
 * right up to x = 126): FlashAttention-4's way past the SFU, whose 16 results a
 * clock an SM bound a softmax of many scores per product (the FP8 forward at
 * head_dim 64; cl/flash_fwd_sm90_fp8.cl, EX2_FMA_EVERY). x = j + f with j the
 * nearest integer (1.5 * 2^23 added puts it in the low mantissa bits) and f in
 * [-1/2, 1/2]; 2^f by a degree-4 polynomial (near-minimax, relative error
 * 2.9e-6 evaluated in float); j added to the exponent bits. Below -126 (and
 * -inf, a masked score) it gives 0, as ex2.approx.ftz does; NaN stays NaN.
 * tests/test_fp8_forward.c checks it on the device against exp2 in double. */
inline float ex2_fma(float x) {
    const float xc = fmax(x, -126.0f);
    const float r = xc + 12582912.0f;
    const float f = xc - (r - 12582912.0f);
    const float p =
        fma(fma(fma(fma(0.00958285294f, f, 0.0559064262f), f, 0.240240991f), f, 0.693124175f), f, 1.0f);
    const float y = as_float(as_int(p) + (as_int(r) << 23));
    return x >= -126.0f ? y : (x < -126.0f ? 0.0f : x);
}

/* By format, the flashcl_dtype value (3 e4m3, 4 e5m2): a constant wherever
 * these are used, so only one side of each choice is compiled in. */
#define FP8_DECODE(fmt, b) ((fmt) == 4 ? fp8_e5m2_to_float(b) : fp8_e4m3_to_float(b))
#define FP8_DECODE8(fmt, b8) ((fmt) == 4 ? fp8_e5m2_to_float8(b8) : fp8_e4m3_to_float8(b8))
#define FP8_ENCODE(fmt, x) ((fmt) == 4 ? float_to_fp8_e5m2(x) : float_to_fp8_e4m3(x))

#if defined(KV_FP8) && (KV_FP8 == 3 || KV_FP8 == 4)
typedef uchar kv_t;
#define LOAD_KV(p, i) FP8_DECODE(KV_FP8, (p)[i])
#define LOAD_KV8(p, i) FP8_DECODE8(KV_FP8, vload8(0, (p) + (i)))
#define STORE_KV(p, i, x) ((p)[i] = FP8_ENCODE(KV_FP8, x))
#else
#undef KV_FP8
#define KV_FP8 0
typedef elem_t kv_t;
#define LOAD_KV(p, i) LOAD_ELEM(p, i)
#define LOAD_KV8(p, i) LOAD_ELEM8(p, i)
#define STORE_KV(p, i, x) STORE_ELEM(p, i, x)
#endif
#if defined(Q_FP8) && (Q_FP8 == 3 || Q_FP8 == 4)
typedef uchar q_t;
#define LOAD_Q(p, i) FP8_DECODE(Q_FP8, (p)[i])
#define LOAD_Q8(p, i) FP8_DECODE8(Q_FP8, vload8(0, (p) + (i)))
#else
#undef Q_FP8
#define Q_FP8 0
typedef elem_t q_t;
#define LOAD_Q(p, i) LOAD_ELEM(p, i)
#define LOAD_Q8(p, i) LOAD_ELEM8(p, i)
#endif

/* Keys visible to query row i under a bottom-right aligned window:
 * [i + shift - left, i + shift + right] clipped to [0, nk), where
 * shift = nk - nq and a negative side is unbounded. Causal is right = 0.
 * Returned as (lo, hi); lo > hi means the row sees nothing. long arithmetic
 * because i + shift may leave int range for 128k-long sequences. */
inline long2 visible_keys(long i, int nq, int nk, int left, int right) {
    long diag = i + (long)nk - (long)nq;
    long lo = left < 0 ? 0 : max(diag - left, 0L);
    long hi = right < 0 ? (long)nk - 1 : min(diag + right, (long)nk - 1);
    return (long2)(lo, hi);
}

/* The CPU-shaped kernels' vector layout (cl/flash_fwd_cpu.cl, cl/flash_bwd_cpu.cl);
 * macros of their HEAD_DIM and BLOCK_N, expanded only where used. Explicit
 * float8 vectors: PoCL's loop vectoriser leaves these loops scalar (measured:
 * scalar vfmadd..ss only), while vector types map straight onto AVX/AVX-512
 * registers, and exp2 on float8 uses the vectorised math library. The head
 * dim is zero-padded to a multiple of CPU_CHUNK vectors so the loops over it
 * keep CPU_CHUNK accumulators in registers. */
#define CPU_VEC 8
#define CPU_NV (BLOCK_N / CPU_VEC) /* key vectors per tile row */
#define CPU_CHUNK 4
#define CPU_DV (((HEAD_DIM + CPU_VEC * CPU_CHUNK - 1) / (CPU_VEC * CPU_CHUNK)) * CPU_CHUNK)
#define CPU_D_PAD (CPU_DV * CPU_VEC)

/* Strides of one tensor: offset, batch, seq, head (elements), as kernel
 * arguments, and the element offset of row n of head h of batch b. */
#define TENSOR_ARGS(x) ulong x##_off, ulong x##_sb, ulong x##_ss, ulong x##_sh
#define ROW_AT(x, b, n, h) (x##_off + (ulong)(b)*x##_sb + (ulong)(n)*x##_ss + (ulong)(h)*x##_sh)

/* The arguments of the forward kernels, flash_fwd (cl/flash_fwd.cl), flash_fwd_cpu,
 * flash_fwd_nv and flash_fwd_nv32: one list, so src/attention.c sets them once
 * for any. Element offsets and (batch, seq, head) strides of each tensor;
 * group = heads_q / heads_k; q_mul = scale*log2e, or scale/softcap;
 * softcap_log2 = softcap*log2e, 0 when off; windows as in visible_keys. */
#define FWD_ARGS                                                                                   \
    __global const q_t *restrict q, __global const kv_t *restrict k,                               \
        __global const kv_t *restrict v, __global elem_t *restrict o,                              \
        __global float *restrict lse, TENSOR_ARGS(q), TENSOR_ARGS(k), TENSOR_ARGS(v),              \
        TENSOR_ARGS(o), ulong lse_off, int has_lse, int nq, int nk, int group, float q_mul,        \
        float softcap_log2, int win_left, int win_right

/* The FP8 forward (flash_fwd, flash_fwd_cpu built with -DQ_FP8 -DKV_FP8:
 * q, k, v FP8 bytes, out in DTYPE): the descale factors follow FWD_ARGS, in
 * one buffer [q | k | v] laid out as flashcl_fp8_scales
 * (include/flashcl.h) indexes each array; src/fp8_forward.c uploads it,
 * ones standing in for a NULL array. sc_per_head 0: one factor each (q at
 * 0, k at sc_k_off, v at sc_v_off); else per (batch, head), and with
 * sc_rows > 0 per sc_rows rows of q and of k. A kernel takes each head's
 * first index once (FP8_Q_BASE(b, hq), FP8_K_BASE(b, hk): hq among the
 * get_global_size(1) query heads, hk among those / group), so a row or key
 * costs one division at most: FP8_Q_SCALE(base, row), FP8_K_SCALE(base,
 * key); FP8_V_SCALE(b, hk) is read once. In the other kernels the factors
 * are 1, which the compiler folds away. */
#if Q_FP8 || KV_FP8
#define FWD_FP8_ARGS                                                                               \
    , __global const float *restrict fp8_sc, int sc_per_head, int sc_rows, int sc_k_off, int sc_v_off
#define FP8_BLOCKS(n) fp8_row_blocks(n, sc_rows)
#define FP8_BLOCK(row) (sc_rows > 0 ? (row) / sc_rows : 0)
#define FP8_Q_BASE(b, hq) (sc_per_head ? ((b) * (int)get_global_size(1) + (hq)) * FP8_BLOCKS(nq) : 0)
#define FP8_K_BASE(b, hk)                                                                          \
    (sc_k_off + (sc_per_head ? ((b) * ((int)get_global_size(1) / group) + (hk)) * FP8_BLOCKS(nk) : 0))
#define FP8_Q_SCALE(base, row) fp8_sc[(base) + (sc_per_head ? FP8_BLOCK(row) : 0)]
#define FP8_K_SCALE(base, key) fp8_sc[(base) + (sc_per_head ? FP8_BLOCK(key) : 0)]
#define FP8_V_SCALE(b, hk)                                                                         \
    fp8_sc[sc_v_off + (sc_per_head ? (b) * ((int)get_global_size(1) / group) + (hk) : 0)]
#else
#define FWD_FP8_ARGS
#define FP8_Q_BASE(b, hq) 0
#define FP8_K_BASE(b, hk) 0
#define FP8_Q_SCALE(base, row) 1.0f
#define FP8_K_SCALE(base, key) 1.0f
#define FP8_V_SCALE(b, hk) 1.0f
#endif

/* The arguments of the backward's dK/dV kernels, flash_bwd_dkdv (cl/flash_bwd.cl),
 * flash_bwd_dkdv_cpu (cl/flash_bwd_cpu.cl) and flash_bwd_dkdv_nv
 * (cl/flash_bwd_nv.cl): one list, so src/backward.c sets them once for any. */
#define BWD_DKDV_ARGS                                                                              \
    __global const elem_t *restrict q, __global const elem_t *restrict k,                          \
        __global const elem_t *restrict v, __global const elem_t *restrict dout,                   \
        __global const float *restrict lse, __global float *scratch, __global elem_t *restrict dk, \
        __global elem_t *restrict dv, TENSOR_ARGS(q), TENSOR_ARGS(k), TENSOR_ARGS(v),              \
        TENSOR_ARGS(dout), TENSOR_ARGS(dk), TENSOR_ARGS(dv), ulong lse_off, ulong di_off,          \
        ulong dq_acc_off, int use_atomics, int nq, int nk, int group, float scale, float softcap,  \
        int win_left, int win_right

/* ... and of the dQ passes, flash_bwd_dq, flash_bwd_dq_cpu and flash_bwd_dq_nv. */
#define BWD_DQ_ARGS                                                                                \
    __global const elem_t *restrict q, __global const elem_t *restrict k,                          \
        __global const elem_t *restrict v, __global const elem_t *restrict dout,                   \
        __global const float *restrict lse, __global const float *restrict scratch,                \
        __global elem_t *restrict dq, TENSOR_ARGS(q), TENSOR_ARGS(k), TENSOR_ARGS(v),              \
        TENSOR_ARGS(dout), TENSOR_ARGS(dq), ulong lse_off, ulong di_off, int nq, int nk,           \
        int group, float scale, float softcap, int win_left, int win_right

/* *p += x on a float in global memory, as a compare-and-swap loop on its
 * bits: the only float accumulation OpenCL 1.2 offers. The order of the adds
 * depends on scheduling, hence the backward's deterministic mode.
 * Every access is atomic: a plain first read of *p would race with other
 * work-groups' cmpxchg (a data race under the OpenCL memory model, which
 * Oclgrind reports). The first try guesses 0.0f (the accumulators start
 * zeroed), so the first add to an element costs one cmpxchg and a later one
 * two, as an atomic_or(p, 0) read would; the guess stores 0.0f + x, the
 * sum the loop would store. */
inline void atomic_add_float(volatile __global float *p, float x) {
    uint seen = atomic_cmpxchg((volatile __global uint *)p, 0u, as_uint(0.0f + x)), want = 0u;
    while (seen != want) {
        want = seen;
        seen = atomic_cmpxchg((volatile __global uint *)p, want, as_uint(as_float(want) + x));
    }
}
