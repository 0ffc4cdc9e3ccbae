/* host_kernels.c: the host forward's block kernel (src/host_kernel_body.h), compiled once
 * per instruction set, and the choice among the copies at run time.
 *
 * The library is built for the baseline of its architecture (no -march=native), so on
 * x86-64 with GCC or Clang the body is also compiled with target("avx512f,...") and
 * target("avx2,fma,f16c") and the copy the CPU supports is picked by __builtin_cpu_supports.
 * Each copy has its own register blocking (HK_MR x HK_NR accumulators: 16 zmm, 8 ymm,
 * 8 xmm) and its own HK_FMA: fmaf only where it is one instruction. Other compilers
 * and architectures build the plain copy alone (fmaf there when FP_FAST_FMAF says it
 * is fast). FLASHCL_HOST_SIMD=avx512|avx2|generic picks a lower copy (tests, and
 * comparisons); a copy the CPU lacks is never chosen.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define HK_BM FLASHCL_HOST_BLOCK_M /* query rows per block: each K/V tile is reused this often */
#define HK_BN FLASHCL_HOST_BLOCK_N /* keys per tile: K^T and V tiles of 16 KiB at D = 64      */
#define HK_LANES 16                /* head dims are padded to this; partial max/sum lanes     */
#if defined(__GNUC__) || defined(__clang__)
#define HK_INLINE inline __attribute__((always_inline))
#define HK_ALIGNED(p) __builtin_assume_aligned(p, 64)
#else
#define HK_INLINE inline
#define HK_ALIGNED(p) (p)
#endif

size_t flashcl_host_padded_dim(int head_dim) {
    return ((size_t)head_dim + HK_LANES - 1) / HK_LANES * HK_LANES;
}

size_t flashcl_host_scratch_floats(int head_dim) {
    const size_t dp = flashcl_host_padded_dim(head_dim);
    /* Q^T, acc: DP x BM; K, V: BN x DP; S^T: BN x BM; one Q row: DP. */
    return 2 * dp * HK_BM + 2 * (size_t)HK_BN * dp + (size_t)HK_BN * HK_BM + dp;
}

size_t flashcl_host_bwd_scratch_floats(int head_dim) {
    const size_t dp = flashcl_host_padded_dim(head_dim);
    /* host_backward_body.h's bwd_split: Q^T, dO^T, Q, dO: DP x BM; K, V: BN x DP;
     * S^T, dP^T: BN x BM; acc1: DP x max(BM, BN); acc2: BN x DP; one row: DP. */
    const size_t bmn = HK_BM > HK_BN ? HK_BM : HK_BN;
    return 4 * dp * HK_BM + 3 * (size_t)HK_BN * dp + 2 * (size_t)HK_BN * HK_BM + dp * bmn + dp;
}

static size_t hk_layout_base(const flashcl_layout *l, int b, int h) {
    return l->offset + (size_t)b * l->stride_batch + (size_t)h * l->stride_head;
}

/* Asks the caches for the row of `bytes` at element `at` of base, to read or (write
 * 1) to write (a hint: no fault). */
static void hk_prefetch_row(const void *base, size_t at, size_t bytes, size_t esize, int write) {
#if defined(__GNUC__) || defined(__clang__)
    const uintptr_t first = ((uintptr_t)base + at * esize) & ~(uintptr_t)63;
    const uintptr_t last = ((uintptr_t)base + at * esize + bytes - 1) & ~(uintptr_t)63;
    for (uintptr_t line = first; line <= last; line += 64) {
        if (write)
            __builtin_prefetch((const void *)line, 1);
        else
            __builtin_prefetch((const void *)line);
    }
#else
    (void)base, (void)at, (void)bytes, (void)esize, (void)write;
#endif
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HK_X86 1
#include <cpuid.h>
#include <immintrin.h> /* F16C's conversions, in the copies whose target has it */
#endif

/* ---- the copies ---- */
#ifdef HK_X86
#define HK(x) hk_avx512_##x
#define HK_TARGET __attribute__((target("avx512f,avx512vl,avx2,fma,f16c")))
#define HK_F16C 1
#define HK_FMA(a, b, c) fmaf(a, b, c)
#define HK_MR 4
#define HK_NR 64 /* 4 x 4 zmm accumulators, of 32 registers */
#include "host_kernel_copy.h"

#define HK(x) hk_avx2_##x
#define HK_TARGET __attribute__((target("avx2,fma,f16c")))
#define HK_F16C 1
#define HK_FMA(a, b, c) fmaf(a, b, c)
#define HK_MR 2
#define HK_NR 32 /* 2 x 4 ymm accumulators, of 16 registers (GCC 12 vectorised 4 x 16
                  * across k, with shuffles: 11 GFLOP/s, against 99 on the EPYC here) */
#include "host_kernel_copy.h"
#endif

#define HK(x) hk_generic_##x
#define HK_TARGET
#if defined(FP_FAST_FMAF)
#define HK_FMA(a, b, c) fmaf(a, b, c)
#else
#define HK_FMA(a, b, c) ((a) * (b) + (c))
#endif
#define HK_MR 4
/* 4 x 2 vectors of 4 (SSE2's 16 registers; NEON has 32). 4 x 16 came out at a
 * quarter of the speed with GCC 12 on SSE2. */
#define HK_NR 8
#include "host_kernel_copy.h"

/* ---- the choice ---- */
#ifdef HK_X86
/* F16C, from CPUID (__builtin_cpu_supports has no name for it in older GCCs).
 * Every AVX2 CPU has it; checked all the same. */
static int hk_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif
static int hk_supported(const char *name) {
#ifdef HK_X86
    __builtin_cpu_init();
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && hk_has_f16c();
    if (strcmp(name, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && hk_has_f16c();
#endif
    return strcmp(name, "generic") == 0;
}

flashcl_host_kernel flashcl_host_kernel_pick(const char *want) {
    static const flashcl_host_kernel copies[] = {
#ifdef HK_X86
        {"avx512", hk_avx512_block, hk_avx512_pack, hk_avx512_exp2_array, hk_avx512_bwd},
        {"avx2", hk_avx2_block, hk_avx2_pack, hk_avx2_exp2_array, hk_avx2_bwd},
#endif
        {"generic", hk_generic_block, hk_generic_pack, hk_generic_exp2_array, hk_generic_bwd},
    };
    const size_t count = sizeof copies / sizeof copies[0];
    size_t i = 0;
    if (want)
        while (i + 1 < count && strcmp(copies[i].name, want) != 0)
            ++i; /* an unknown name: the generic copy */
    while (i + 1 < count && !hk_supported(copies[i].name))
        ++i;
    return copies[i];
}
