/* nv_shim.h: test_nv_kernels.sh puts this before cl/common*.cl when it compiles
 * the NVIDIA kernels with clang's nvptx target. That target has no OpenCL
 * runtime library, so the work-item functions and the few math and half
 * built-ins the kernels call would stay unresolved externals and ptxas could
 * not assemble the PTX. These stand-ins map them onto PTX special registers
 * and instructions. They exist only for the build check: NVIDIA's own
 * compiler, which builds the kernels flashcl runs, provides the real ones. */
#define NV_SHIM_DIM(d, x, y, z) ((size_t)((d) == 0 ? (x) : (d) == 1 ? (y) : (z)))
#define get_local_id(d)                                                                            \
    NV_SHIM_DIM(d, __nvvm_read_ptx_sreg_tid_x(), __nvvm_read_ptx_sreg_tid_y(), __nvvm_read_ptx_sreg_tid_z())
#define get_group_id(d)                                                                            \
    NV_SHIM_DIM(d, __nvvm_read_ptx_sreg_ctaid_x(), __nvvm_read_ptx_sreg_ctaid_y(),                 \
                __nvvm_read_ptx_sreg_ctaid_z())
#define get_num_groups(d)                                                                          \
    NV_SHIM_DIM(d, __nvvm_read_ptx_sreg_nctaid_x(), __nvvm_read_ptx_sreg_nctaid_y(),               \
                __nvvm_read_ptx_sreg_nctaid_z())
#define get_local_size(d)                                                                          \
    NV_SHIM_DIM(d, __nvvm_read_ptx_sreg_ntid_x(), __nvvm_read_ptx_sreg_ntid_y(), __nvvm_read_ptx_sreg_ntid_z())
#define get_global_id(d) (get_group_id(d) * get_local_size(d) + get_local_id(d))
#define get_global_size(d) (get_num_groups(d) * get_local_size(d))
#define barrier(flags) __nvvm_bar_sync(0)
#define mem_fence(flags) __nvvm_membar_gl()

#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))
#define clamp(x, lo, hi) min(max((x), (lo)), (hi))
#define fmax(a, b) __builtin_fmaxf((a), (b))
#define fmin(a, b) __builtin_fminf((a), (b))
#define fma(a, b, c) __builtin_fmaf((a), (b), (c))

inline float nv_shim_unary(float x, int op) {
    float y;
    if (op == 0)
        __asm__("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    else if (op == 1)
        __asm__("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    else
        __asm__("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#define log2(x) nv_shim_unary((x), 0)
#define exp2(x) nv_shim_unary((x), 1)
#define tanh(x) nv_shim_unary((x), 2)
#define exp(x) nv_shim_unary((x) * 1.44269504f, 1)
#define log(x) (nv_shim_unary((x), 0) * 0.69314718f)

inline void nv_shim_store_half(float x, size_t i, __global half *p) {
    ushort h;
    __asm__("{.reg .f16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t;}" : "=h"(h) : "f"(x));
    ((__global ushort *)p)[i] = h;
}
inline float nv_shim_load_half(size_t i, const __global half *p) {
    float y;
    const ushort h = ((const __global ushort *)p)[i];
    __asm__("{.reg .f16 t; mov.b16 t, %1; cvt.f32.f16 %0, t;}" : "=f"(y) : "h"(h));
    return y;
}
#define vstore_half_rte(x, i, p) nv_shim_store_half((x), (i), (p))
#define vload_half(i, p) nv_shim_load_half((i), (p))

inline int nv_shim_atomic_add(volatile __global int *p, int x) {
    int old;
    __asm__ __volatile__("atom.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(x) : "memory");
    return old;
}
inline uint nv_shim_atomic_cas(volatile __global uint *p, uint cmp, uint x) {
    uint old;
    __asm__ __volatile__("atom.global.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(p), "r"(cmp), "r"(x) : "memory");
    return old;
}
inline int nv_shim_atomic_exch(volatile __global int *p, int x) {
    int old;
    __asm__ __volatile__("atom.global.exch.b32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(x) : "memory");
    return old;
}
#define atomic_inc(p) nv_shim_atomic_add((volatile __global int *)(p), 1)
#define atomic_xchg(p, x) nv_shim_atomic_exch((volatile __global int *)(p), (x))
#define atomic_cmpxchg(p, cmp, x) nv_shim_atomic_cas((volatile __global uint *)(p), (cmp), (x))
#define vload2(i, p) ((float2)((p)[2 * (i)], (p)[2 * (i) + 1]))
/* C99 inline semantics: a call clang chooses not to inline would need an
 * external definition that "inline" alone never emits. */
#define inline static inline
