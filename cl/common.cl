/* common.cl: storage-type helpers shared by every flashcl kernel.
 *
 * The host prepends this file to each kernel source. Every kernel stores its
 * tensors in one of three types and computes in float:
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
