/* common_nv.cl: the pieces NVIDIA's tensor-core kernels share (flash_fwd_nv,
 * flash_fwd_nv32, flash_fwd_sm90, flash_bwd_nv, flash_bwd_sm90,
 * paged_decode_nv): inline PTX (shared-window addresses, ldmatrix, mma.sync,
 * cp.async, warpgroup MMA, TMA, shuffles), the online softmax of one mma
 * fragment, the order of row blocks (LPT_HEADS, LPT_PLACE), and the opening
 * and epilogue macros of the forward kernels (the backward's are in
 * common_nv_bwd.cl, which follows this file).
 *
 * Prepended to every kernel after common.cl (src/program.c). The functions
 * are compiled only with -DFLASHCL_NV_PTX; the rest are macros that only
 * those kernels expand, so other devices' builds see no PTX.
 */

/* PTX helpers for kernels built with -DFLASHCL_NV_PTX (NVIDIA devices only). */
#ifdef FLASHCL_NV_PTX
/* 32-bit shared-window address of a __local pointer, as PTX's shared-memory
 * instructions (ldmatrix, cp.async) take it. NVIDIA's OpenCL may hand the
 * asm either a generic address or a shared-window one; isspacep tells them
 * apart, so cvta is applied only where it is meaningful. (A direct cast to a
 * 32-bit integer is rejected by ptxas.) */
inline uint shared_addr(__local const void *p) {
    uint a;
    __asm__("{\n\t.reg .pred ps;\n\t.reg .u64 t;\n\t"
            "isspacep.shared ps, %1;\n\t"
            "@ps cvta.to.shared.u64 t, %1;\n\t"
            "@!ps mov.u64 t, %1;\n\t"
            "cvt.u32.u64 %0, t;\n\t}"
            : "=r"(a)
            : "l"((ulong)p));
    return a;
}

/* Tensor cores (mma.sync, sm_80+), for the 16-bit storage types. */
#if DTYPE == 1 || DTYPE == 2
#if DTYPE == 1
#define MMA_TYPE "f16"
#else
#define MMA_TYPE "bf16"
#endif
/* D += A B for one 16x8x16 block; c[0..3] are the accumulators. */
#define MMA_16816(c, a0, a1, a2, a3, b0, b1)                                                       \
    __asm__("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 "                 \
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                \
            : "+f"((c)[0]), "+f"((c)[1]), "+f"((c)[2]), "+f"((c)[3])                               \
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

/* Two such blocks side by side: c_lo, c_hi += A (registers a[0..3]) times the
 * B fragments of two adjacent n8 blocks, as one ldmatrix.x4 returns them
 * (b[0], b[1] for c_lo; b[2], b[3] for c_hi). */
#define MMA_16816_X2(c_lo, c_hi, a, b)                                                             \
    do {                                                                                           \
        MMA_16816(c_lo, (a)[0], (a)[1], (a)[2], (a)[3], (b)[0], (b)[1]);                           \
        MMA_16816(c_hi, (a)[0], (a)[1], (a)[2], (a)[3], (b)[2], (b)[3]);                           \
    } while (0)

/* Four 8x8 16-bit matrices from __local; volatile keeps them after the barriers. */
#define LDMATRIX_X4(r, addr)                                                                       \
    __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"           \
                         : "=r"((r)[0]), "=r"((r)[1]), "=r"((r)[2]), "=r"((r)[3])                  \
                         : "r"(addr))
#define LDMATRIX_X4_TRANS(r, addr)                                                                 \
    __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"     \
                         : "=r"((r)[0]), "=r"((r)[1]), "=r"((r)[2]), "=r"((r)[3])                  \
                         : "r"(addr))

/* Two floats rounded to nearest even into one register, lo in the low half
 * (cvt puts its first source in the high half). */
inline uint pack2(float lo, float hi) {
    uint r;
    __asm__("cvt.rn." MMA_TYPE "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* NV_FWD_STORE_FRAG's stores of 16-bit outputs: two columns as one 32-bit word, or one. */
#define NV_STORE_PAIR16(orow, d, x0, x1) (*(__global uint *)((orow) + (d)) = pack2((x0), (x1)))
#define NV_STORE_ONE16(orow, d, x) STORE_ELEM((__global elem_t *)(orow), (d), (x))

#endif

#ifndef USE_CP_ASYNC
#define USE_CP_ASYNC 1 // 1: cp.async (sm_80+) for aligned tiles; 0: always plain loads
#endif
/* The 16-byte global -> __local copy every NVIDIA kernel issues. CP_ASYNC_L2
 * = 64, 128 or 256 adds an L2 prefetch of that many bytes around each chunk
 * (PTX ISA 7.4+); 0, the default, none. The tensor-core decode kernel is
 * built with 128 (its L2_PREFETCH parameter, src/params_serving.c: 1-2.5 % faster on
 * the H200); the forward and backward did not move with it (BENCHMARKS.md,
 * 2026-12-03, b0f15f5), so they keep 0. */
#ifndef CP_ASYNC_L2
#define CP_ASYNC_L2 0
#endif
#if CP_ASYNC_L2 == 64
#define CP_ASYNC_16 "cp.async.cg.shared.global.L2::64B"
#elif CP_ASYNC_L2 == 128
#define CP_ASYNC_16 "cp.async.cg.shared.global.L2::128B"
#elif CP_ASYNC_L2 == 256
#define CP_ASYNC_16 "cp.async.cg.shared.global.L2::256B"
#elif CP_ASYNC_L2 == 0
#define CP_ASYNC_16 "cp.async.cg.shared.global"
#else
#error "CP_ASYNC_L2 is 0, 64, 128 or 256"
#endif

/* 1 when every row of the matrix at p, `stride` elements apart, starts 16-byte
 * aligned: what nv_copy_rows's cp.async path needs (vec). Uniform per matrix. */
#define ROWS_16B(p, stride) ((ulong)(p) % 16 == 0 && (stride) * sizeof(*(p)) % 16 == 0)

/* Byte offset of 16-byte chunk c of row r in a tile of nrows rows laid out for
 * wgmma's 128-byte swizzle (cl/flash_fwd_sm90.cl): the row's 128-byte panels
 * (64 halves each) are stored panel after panel, each panel nrows x 128
 * bytes, and within each 1024-byte atom of 8 rows chunk c of row r sits at
 * chunk c ^ (r % 8). The tile must start 1024-byte aligned. */
#define SW128_OFFSET(r, c, nrows) \
    (((uint)((c) >> 3) * (uint)(nrows) + (uint)(r)) * 128u + ((uint)(((c) & 7) ^ ((r) & 7)) << 4))

/* A wgmma shared-memory matrix descriptor for a tile in the SW128_OFFSET
 * layout at shared address addr: both byte offsets 1024 (the 8-row group
 * stride; the other offset is unused by shapes whose k and n extents fit one
 * swizzle atom width), 128-byte swizzle (flash_fwd_sm90.cl,
 * tests/wgmma_probe.cl). */
inline ulong sw128_desc(uint addr) {
    return (ulong)((addr & 0x3FFFFu) >> 4) | ((ulong)(1024u >> 4) << 16) | ((ulong)(1024u >> 4) << 32) |
           ((ulong)1 << 62);
}

/* Tile copies of the tensor-core kernels (flash_fwd_nv.cl, flash_bwd_nv.cl;
 * flash_fwd_nv32.cl moves float rows as pairs of halves, doubling head_dim
 * and pitch).
 * Fills nrows __local rows of `pitch` halves, starting dst_off halves into
 * smem (shared address s_base), from a [*][head_dim] 16-bit matrix whose row
 * r is at src + r*stride; the nthreads work-items of the group share it.
 * Rows >= rows and columns >= head_dim become zero, so padded keys
 * contribute 0 * 0 rather than 0 * garbage (which may be NaN). head_dim,
 * pitch and nthreads are compile-time constants at every call, so the loops
 * fold once this is inlined.
 *
 * vec != 0 (uniform): src and stride are 16-byte aligned, so each 16-byte
 * chunk is one cp.async whose src-size clips it at head_dim (the rest is
 * zero-filled by the hardware). The copy is only issued: cp_wait() and a
 * barrier must follow before the tile is read.
 * vec == 0: 2-byte loads through registers, stored as 16-byte chunks; done
 * when this returns.
 * nv_copy_rows: the plain row-major layout, row r at r*pitch halves;
 * nv_copy_rows_to(..., sw128 = 1) (a compile-time constant at every call):
 * the SW128_OFFSET layout instead, pitch unused (rows are head_dim rounded up
 * to 64 halves; flash_fwd_sm90.cl). */
#define nv_copy_rows(smem, s_base, dst_off, src, stride, rows, nrows, vec, tid, head_dim, pitch,   \
                     nthreads)                                                                     \
    nv_copy_rows_to(smem, s_base, dst_off, src, stride, rows, nrows, vec, tid, head_dim, pitch,    \
                    nthreads, 0)

inline void nv_copy_rows_to(__local ushort *smem, uint s_base, uint dst_off,
                            __global const ushort *src, ulong stride, int rows, int nrows, int vec,
                            int tid, int head_dim, int pitch, int nthreads, int sw128) {
    /* 16-byte chunks of a padded row */
    const int d_chunks = sw128 ? (head_dim + 63) / 64 * 8 : (head_dim + 15) / 16 * 2;
    const int total = nrows * d_chunks;
    const int iters = (total + nthreads - 1) / nthreads;
#if USE_CP_ASYNC
    if (vec) {
        for (int it = 0; it < iters; ++it) {
            const int i = tid + it * nthreads;
            if (i < total) {
                const int r = i / d_chunks, c = i % d_chunks;
                const int bytes = r < rows ? clamp(2 * (head_dim - 8 * c), 0, 16) : 0;
                /* A chunk that copies nothing still needs a valid address. */
                __global const ushort *p = bytes > 0 ? src + (ulong)r * stride + 8 * c : src;
                const uint dst = sw128 ? s_base + dst_off * 2u + SW128_OFFSET(r, c, nrows)
                                       : s_base + (dst_off + (uint)(r * pitch + 8 * c)) * 2u;
                __asm__ __volatile__(CP_ASYNC_16 " [%0], [%1], 16, %2;"
                                     :
                                     : "r"(dst), "l"((ulong)p), "r"(bytes)
                                     : "memory");
            }
        }
        __asm__ __volatile__("cp.async.commit_group;" ::: "memory");
        return;
    }
#endif
    for (int it = 0; it < iters; ++it) {
        const int i = tid + it * nthreads;
        if (i < total) {
            const int r = i / d_chunks, c = i % d_chunks;
            __global const ushort *p = src + (ulong)r * stride;
            uint w[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int d = 8 * c + 2 * e;
                const uint lo = r < rows && d < head_dim ? p[d] : 0u;
                const uint hi = r < rows && d + 1 < head_dim ? p[d + 1] : 0u;
                w[e] = lo | hi << 16;
            }
            __local ushort *dst = sw128 ? smem + dst_off + SW128_OFFSET(r, c, nrows) / 2u
                                        : smem + dst_off + r * pitch + 8 * c;
            *(__local uint4 *)dst = (uint4)(w[0], w[1], w[2], w[3]);
        }
    }
}

/* Waits for this work-item's outstanding cp.async groups (no-op otherwise). */
inline void cp_wait(void) {
#if USE_CP_ASYNC
    __asm__ __volatile__("cp.async.wait_group 0;" ::: "memory");
#endif
}

/* Hopper's warpgroup MMA (sm_90a: flash_fwd_sm90.cl, flash_bwd_sm90.cl). NVIDIA's
 * OpenCL compiles for sm_90, where ptxas rejects these instructions, so each is
 * written behind the marker SM90A, a PTX comment that src/program.c removes
 * from the program's PTX before building it again for sm_90a. */
#if defined(FLASHCL_NV_PTX) && (DTYPE == 1 || DTYPE == 2)
#define SM90A "//@sm90a "

#define WGMMA_FENCE() __asm__ __volatile__(SM90A "wgmma.fence.sync.aligned;\n" ::: "memory")
#define WGMMA_COMMIT() __asm__ __volatile__(SM90A "wgmma.commit_group.sync.aligned;\n" ::: "memory")
#define WGMMA_WAIT_ALL() __asm__ __volatile__(SM90A "wgmma.wait_group.sync.aligned 0;\n" ::: "memory")
#define WGMMA_WAIT_ONE() __asm__ __volatile__(SM90A "wgmma.wait_group.sync.aligned 1;\n" ::: "memory")

/* One wgmma with A from registers: d[0..N/8-1][0..3] = A (a[0..3], this
 * warp's 16x16 slice of the 64x16 A) times the 16xN B that desc describes,
 * plus d when scale_d is 1 (0: d's old values are not read); tnsp_b 0: B
 * K-major, 1: N-major. N is 64, 48, 32 or 16: WG_N64 / WG_N48 / WG_N32 / WG_N16 give the
 * shape's name, its accumulator operands and their numbering, and the
 * numbers of the A and descriptor operands that follow them. */
#define WG_ACC4(d, j) "+f"((d)[j][0]), "+f"((d)[j][1]), "+f"((d)[j][2]), "+f"((d)[j][3])
#define WG_N16_SHAPE "m64n16k16"
#define WG_N16_OUT(d) WG_ACC4(d, 0), WG_ACC4(d, 1)
#define WG_N16_D "{%0,%1,%2,%3,%4,%5,%6,%7}"
#define WG_N16_AB "{%8,%9,%10,%11}, %12"
#define WG_N32_SHAPE "m64n32k16"
#define WG_N32_OUT(d) WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3)
#define WG_N32_D "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define WG_N32_AB "{%16,%17,%18,%19}, %20"
#define WG_N48_SHAPE "m64n48k16"
#define WG_N48_OUT(d) WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5)
#define WG_N48_D "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}"
#define WG_N48_AB "{%24,%25,%26,%27}, %28"
#define WG_N64_SHAPE "m64n64k16"
#define WG_N64_OUT(d) WG_N48_OUT(d), WG_ACC4(d, 6), WG_ACC4(d, 7)
#define WG_N64_D "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                            \
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define WG_N64_AB "{%32,%33,%34,%35}, %36"
#define WGMMA_RS(N, d, a, desc, scale_d, tnsp_b)                                                   \
    __asm__ __volatile__(SM90A "wgmma.mma_async.sync.aligned." N##_SHAPE ".f32." MMA_TYPE          \
                               "." MMA_TYPE " " N##_D ", " N##_AB ", " #scale_d ", 1, 1, " #tnsp_b \
                               ";\n"                                                               \
                         : N##_OUT(d)                                                              \
                         : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "l"(desc)           \
                         : "memory")

/* One wgmma with both operands in __local: d = A B (plus d when scale_d is
 * 1), A and B by descriptor; tnsp_a 1: A M-major (its rows are k), tnsp_b 1:
 * B N-major. N as for WGMMA_RS. */
#define WG_N16_SS "%8, %9"
#define WG_N32_SS "%16, %17"
#define WG_N64_SS "%32, %33"
#define WGMMA_SS(N, d, desc_a, desc_b, scale_d, tnsp_a, tnsp_b)                                    \
    __asm__ __volatile__(SM90A "wgmma.mma_async.sync.aligned." N##_SHAPE ".f32." MMA_TYPE          \
                               "." MMA_TYPE " " N##_D ", " N##_SS ", " #scale_d ", 1, 1, " #tnsp_a \
                               ", " #tnsp_b ";\n"                                                  \
                         : N##_OUT(d)                                                              \
                         : "l"(desc_a), "l"(desc_b)                                                \
                         : "memory")

/* Each register of d[n][4] through an empty asm: after wgmma.wait_group, so
 * that no use of an accumulator is scheduled above the wait; before
 * wgmma.fence, so that no write of an operand (the rescaled O, packed P)
 * sinks between the wgmma of a chain, where ptxas would have to serialise
 * them. c: the constraint, "f" or "r". */
#define WG_FENCE_REGS_C(d, n, c)                                                                   \
    do {                                                                                           \
        _Pragma("unroll") for (int j_ = 0; j_ < (n); ++j_)                                         \
            _Pragma("unroll") for (int e_ = 0; e_ < 4; ++e_)                                       \
                __asm__ __volatile__("" : "+" c((d)[j_][e_])::"memory");                           \
    } while (0)
#define WG_FENCE_REGS(d, n) WG_FENCE_REGS_C(d, n, "f")

/* A use of the A fragments f[0..steps-1] that ptxas has to keep: each group
 * of four stored to the shared address addr + 16 k, predicated on never < 0,
 * where never is a value the caller knows is not negative and neither
 * compiler can prove so (the store never runs). An empty asm such as
 * WG_FENCE_REGS emits no PTX instruction, so it holds nothing for ptxas;
 * this does. Why flash_fwd_sm90 needs it: its Q_KEEP (issue 36). */
#define WG_KEEP_A(f, steps, addr, never)                                                           \
    do {                                                                                           \
        _Pragma("unroll") for (int k_ = 0; k_ < (steps); ++k_)                                     \
            __asm__ __volatile__("{\n\t.reg .pred p_;\n\tsetp.lt.s32 p_, %5, 0;\n\t"                 \
                                 "@p_ st.shared.v4.b32 [%4], {%0,%1,%2,%3};\n\t}\n"                \
                                 ::"r"((f)[k_][0]), "r"((f)[k_][1]), "r"((f)[k_][2]),               \
                                 "r"((f)[k_][3]), "r"((addr) + 16u * (uint)k_), "r"(never)         \
                                 : "memory");                                                      \
    } while (0)

/* O += P V in the wgmma forward kernels (flash_fwd_sm90, flash_fwd_sm90_fp8),
 * waited for: the kernel's own PV_CHAIN(acc, pf, v) over its P_STEPS k-steps
 * into acc[O_FRAGS][4], the operands pinned first, so that no write of them
 * sinks into the chain. PV_WAITED_AFTER runs the statement `issued` between
 * the chain's commit and the wait (a PINGPONG loop hands the tensor cores
 * over there). */
#define PV_WAITED_AFTER(acc, pf, v, issued)                                                        \
    do {                                                                                           \
        WG_FENCE_REGS(acc, O_FRAGS);                                                               \
        WG_FENCE_REGS_C(pf, P_STEPS, "r");                                                         \
        WGMMA_FENCE();                                                                             \
        PV_CHAIN(acc, pf, v);                                                                      \
        WGMMA_COMMIT();                                                                            \
        issued;                                                                                    \
        WGMMA_WAIT_ALL();                                                                          \
        WG_FENCE_REGS(acc, O_FRAGS);                                                               \
    } while (0)
#define PV_WAITED(acc, pf, v) PV_WAITED_AFTER(acc, pf, v, (void)0)

/* Tiles start at the first 1024-byte boundary of the __local array raw (the
 * 128-byte swizzle works on address bits 4-9): smem (halves) and s_base (its
 * shared address). The array holds 1024 bytes more than its tiles need. */
#define ALIGNED_TILES(raw)                                                                         \
    const uint raw_base_ = shared_addr(raw);                                                       \
    const uint align_ = (1024u - (raw_base_ & 1023u)) & 1023u;                                     \
    __local ushort *smem = (raw) + align_ / 2u;                                                    \
    const uint s_base = raw_base_ + align_

/* This warp's A fragments f[0..steps-1] (rows 16*warp.. of the nrows-row
 * SW128 tile at shared address tile, k-steps of 16 dims): lanes 0-15 rows
 * 0-15 at the k-step's dims 0-7, lanes 16-31 the same rows at dims 8-15: a0,
 * a1, a2, a3 as in flash_fwd_nv.cl. */
#define SW128_A_FRAGS(f, tile, nrows, steps)                                                       \
    do {                                                                                           \
        const int r_ = warp * 16 + lane % 16;                                                      \
        _Pragma("unroll") for (int kk = 0; kk < (steps); ++kk)                                     \
            LDMATRIX_X4((f)[kk], (tile) + SW128_OFFSET(r_, 2 * kk + lane / 16, nrows));            \
    } while (0)

/* Named barriers of the two-warpgroup PINGPONG loops (flash_fwd_sm90.cl,
 * flash_fwd_sm90_fp8.cl; 0 is barrier()'s): 256 work-items each, one
 * warpgroup arriving (bar.arrive: release, no wait) and the other waiting
 * (bar.sync: acquire), the producer/consumer use the PTX ISA describes. */
#define PP_TURN_A 1u /* warpgroup 0 waits here for warpgroup 1 */
#define PP_TURN_B 2u /* warpgroup 1 waits here for warpgroup 0 */
#define PP_K_FREE 3u /* warpgroup 0's S = Q K^T has completed */
#define PP_V_FREE 4u /* warpgroup 0's O += P V has completed */
inline void pp_sync(uint id) { __asm__ __volatile__("bar.sync %0, 256;" ::"r"(id) : "memory"); }
inline void pp_arrive(uint id) { __asm__ __volatile__("bar.arrive %0, 256;" ::"r"(id) : "memory"); }
/* pp_sync that ptxas cannot hoist above the work computing dep: the barrier's id is
 * min(id, dep | id), which is id, but through an operation ptxas does not fold. A plain bar.sync
 * has no data inputs, and ptxas scheduled one above all but 5 of a softmax's 64 exponents
 * (clang's PTX, ptxas 13.0, sm_90a), so that a warpgroup waited for its turn on the tensor
 * cores before, not after, its softmax. */
inline void pp_sync_after(uint id, uint dep) {
    __asm__ __volatile__("{\n\t.reg .b32 id_;\n\tor.b32 id_, %1, %0;\n\tmin.u32 id_, id_, %0;\n\t"
                         "bar.sync id_, 256;\n\t}" ::"r"(id),
                         "r"(dep)
                         : "memory");
}

/* PINGPONG: warpgroup 0 is done with a buffer; warpgroup 1 (producer) waits for that at barrier
 * bar, then runs the statement copy (the refill), while warpgroup 0 arrives there. */
#define PP_REFILL(producer, bar, copy)                                                             \
    do {                                                                                           \
        if (producer) {                                                                            \
            pp_sync(bar);                                                                          \
            copy;                                                                                  \
        } else {                                                                                   \
            pp_arrive(bar);                                                                        \
        }                                                                                          \
    } while (0)

/* PINGPONG's first two tile copies by cp.async (K, then V, each its own commit group): the first
 * has landed for this work-item and is visible to wgmma; the second may still be in flight. */
inline void cp_wait_first_async_proxy(void) {
#if USE_CP_ASYNC
    __asm__ __volatile__("cp.async.wait_group 1;" ::: "memory");
#endif
    __asm__ __volatile__("fence.proxy.async.shared::cta;" ::: "memory");
}

/* Copies have landed for this work-item and are visible to wgmma's reads. */
inline void cp_wait_async_proxy(void) {
    cp_wait();
    __asm__ __volatile__("fence.proxy.async.shared::cta;" ::: "memory");
}

/* ---- USE_TMA: tiles by the Tensor Memory Accelerator --------------------------------------
 * Built by the host (src/attention.c, src/backward.c) when the CUDA driver
 * encodes tensor maps (src/nv_tma.c). Why: with cp.async, 16 bytes per
 * work-item, the forward's copies ran serially with its products
 * (BENCHMARKS.md, 2026-12-02, 034269e); one cp.async.bulk.tensor per 64-dim panel,
 * issued by one work-item, lands a tile in the SW128 layout, rows past the
 * tensor's end and dims past its head dim zero (bench/tma_probe.c checked
 * that on the H200). A kernel gets two maps as arguments with a placeholder
 * address: its issuing work-item copies them to its work-group's slot and
 * writes the buffers' addresses in with tensormap.replace
 * (cp.async.bulk.tensor reads a map from global memory, not from __local).
 * A tile's arrival is counted on an mbarrier (its bytes, by complete_tx),
 * whose phase every consumer waits for before its wgmma reads the tile. */
#ifndef USE_TMA
#define USE_TMA 0
#endif
#if USE_TMA
typedef struct {
    ulong w[16];
} tma_map;
/* The kernel's two maps (by value) and the work-groups' slots, after its other arguments. */
#define TMA_ARGS(a, b) , tma_map a##_map, tma_map b##_map, __global ulong *restrict tma_slots
/* This work-group's slot: 32 ulongs, the first map then the second (FLASHCL_TMA_SLOT_BYTES, src/internal.h). */
#define TMA_SLOT()                                                                                 \
    (tma_slots +                                                                                   \
     32 * (get_group_id(0) + get_num_groups(0) * (get_group_id(1) + get_num_groups(1) * get_group_id(2))))
inline void mbar_init(uint bar) {
    __asm__ __volatile__("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
/* After the issuing work-item's mbar_init calls, before the barrier that publishes them. */
inline void mbar_init_fence(void) {
    __asm__ __volatile__("fence.mbarrier_init.release.cluster;" ::: "memory");
}
/* Waits until the mbarrier at bar has completed the phase of the given parity. */
inline void mbar_wait(uint bar, uint parity) {
    uint done = 0;
    while (!done)
        __asm__ __volatile__("{\n\t.reg .pred p;\n\t"
                             "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                             "selp.u32 %0, 1, 0, p;\n\t}"
                             : "=r"(done)
                             : "r"(bar), "r"(parity)
                             : "memory");
}
/* The next phase of bar completes once `bytes` more have landed (the issuer's one arrival). */
inline void mbar_expect(uint bar, uint bytes) {
    __asm__ __volatile__("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                         : "memory");
}
/* The work-group's map in global memory at slot, from template m, addressed at base. */
inline void tma_map_place(__global ulong *slot, tma_map m, __global const ushort *base) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
        slot[i] = m.w[i];
    __asm__ __volatile__(SM90A "tensormap.replace.tile.global_address.global.b1024.b64 [%0], %1;\n" ::"l"(
                             (ulong)slot),
                         "l"((ulong)base)
                         : "memory");
    __asm__ __volatile__("fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
    __asm__ __volatile__("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"((ulong)slot) : "memory");
}
/* One box of the map at map (dims d0..d0+63 of rows n.., head h, batch b)
 * into shared address dst, counted on bar. */
inline void tma_box(uint dst, __global const ulong *map, int d0, int n, int h, int b, uint bar) {
    __asm__ __volatile__("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                         " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
                         "l"((ulong)map), "r"(d0), "r"(n), "r"(h), "r"(b), "r"(bar)
                         : "memory");
}
/* Generic-proxy accesses of __local before this (another warp's ldmatrix of
 * bytes a TMA copy will overwrite, ordered by a barrier) come before the
 * issuing work-item's next copies. */
inline void tma_fence_shared(void) { __asm__ __volatile__("fence.proxy.async.shared::cta;" ::: "memory"); }
#endif
#endif

/* 2^x on the SFU; -inf gives +0, which is what masked scores need. */
inline float ex2(float x) {
    float y;
    __asm__("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Soft-capping of one 16-row fragment's scores s[n_s][4], in place: s
 * becomes softcap*log2(e) * tanh(s * scale/softcap) (precise tanh, like
 * the portable kernel), the log2-unit score the softmax then takes. */
#define SOFTCAP_16(s, n_s, q_mul, softcap_log2)                                                    \
    do {                                                                                           \
        _Pragma("unroll") for (int j_ = 0; j_ < (n_s); ++j_)                                       \
            _Pragma("unroll") for (int e_ = 0; e_ < 4; ++e_)(s)[j_][e_] =                          \
                (softcap_log2)*tanh((q_mul) * (s)[j_][e_]);                                        \
    } while (0)

/* The online-softmax step of one 16-row mma fragment, shared by the
 * tensor-core kernels. s[n_s][4]: the tile's scores of this lane's rows g
 * (e = 0, 1) and g+8 (e = 2, 3) in raw units, -inf where masked; they
 * become p = 2^(s*sc - m*sc). m_run[2] and l_run[2] (l a per-lane partial
 * sum: alpha is uniform along a row, so the quad reduces it once at the
 * end) and the output accumulators acc[n_o][4] are rescaled by alpha. While
 * a row has seen nothing, m_new is -inf: 0 is subtracted instead (p =
 * 2^-inf = 0) and alpha stays 1, so -inf - -inf is never formed; m_run -
 * m_new is exact for close maxima, so alpha matches the portable kernel's.
 * A macro, so the fragments stay in registers.
 * RESCALE_SKIP, which every kernel file using it defines (a build option
 * may): 1 skips the rescale of acc, by the whole warp, when every alpha of
 * its lanes is exactly 1 (no row's max moved); the result is the same (a
 * multiplication by 1 changes nothing, bar flushing a denormal to 0).
 * Decoding (cl/paged_decode_nv.cl, where it is on) streams thousands of keys
 * a slice, and once each row's max has settled most tiles move none, while
 * the rescale is 4 * n_o multiplications a lane a tile (64 at D=128 of the
 * FP8 decode loop's 781 instructions, clang's build); the warp-uniform branch
 * costs a vote. */
#define ONLINE_SOFTMAX_16(s, n_s, acc, n_o, m_run, l_run, sc)                                      \
    do {                                                                                           \
        float al_[2];                                                                              \
        _Pragma("unroll") for (int h_ = 0; h_ < 2; ++h_) {                                         \
            SOFTMAX_ROW_16(s, n_s, m_run, l_run, sc, h_, alpha_);                                  \
            al_[h_] = alpha_;                                                                      \
            if (!RESCALE_SKIP)                                                                     \
                _Pragma("unroll") for (int j_ = 0; j_ < (n_o); ++j_) {                             \
                    (acc)[j_][2 * h_] *= alpha_;                                                   \
                    (acc)[j_][2 * h_ + 1] *= alpha_;                                               \
                }                                                                                  \
        }                                                                                          \
        if (RESCALE_SKIP && warp_any(al_[0] != 1.0f || al_[1] != 1.0f))                            \
            RESCALE_16(acc, n_o, al_);                                                             \
    } while (0)

/* ONLINE_SOFTMAX_16 without touching acc, for a kernel whose previous O += P V
 * is still running on the tensor cores when the next tile's softmax starts
 * (flash_fwd_sm90.cl, OVERLAP), or that applies them where it adds the tile's
 * P V (flash_fwd_sm90_fp8.cl): alpha[2] receives the factors, applied to acc
 * by RESCALE_16 or the caller once that product has been waited for. */
#define ONLINE_SOFTMAX_16_P(s, n_s, m_run, l_run, sc, alpha)                                        \
    do {                                                                                           \
        _Pragma("unroll") for (int h_ = 0; h_ < 2; ++h_) {                                         \
            SOFTMAX_ROW_16(s, n_s, m_run, l_run, sc, h_, alpha_);                                  \
            (alpha)[h_] = alpha_;                                                                  \
        }                                                                                          \
    } while (0)
/* ONLINE_SOFTMAX_16_P with SOFTMAX_EXPS_BIASED's exponents (2^(s sc + bias - m sc), or where
 * |m sc| >= 1024 2^((s - m) sc + bias)), for the FP8 forward's plain loop, in phases: both rows'
 * maxima; their factors and biases, with one vote for the two rows (where either row of any lane
 * is that far, both rows subtract m from their scores in place, then take bias alone); then
 * every exponent, by one fma each, in one straight run. Exponents in two branches, or row g's
 * before row g + 8's vote, met later code through a join, and there ptxas packed P's e4m3 pairs
 * into registers by a PRMT each (16 a 128-key tile) instead of merging the second pair into the
 * first's F2FP; a vote a row, as SOFTMAX_EXPS_BIASED has, spilled at D=64's 128 registers in
 * the build with ROWSUM_MMA (fa0da5d).
 * A row takes the far form when either row of any lane of the warp needs it: the two forms
 * agree to 2^-13, far inside P's e4m3 rounding. */
#define ONLINE_SOFTMAX_16_P_BIASED(s, n_s, m_run, l_run, sc, alpha, bias)                          \
    do {                                                                                           \
        float mx_[2] = {-INFINITY, -INFINITY}, c_[2];                                              \
        _Pragma("unroll") for (int h_ = 0; h_ < 2; ++h_) SOFTMAX_QUAD_MAX(s, n_s, h_, mx_[h_]);    \
        float mr_[2];                                                                              \
        int far_ = 0;                                                                              \
        _Pragma("unroll") for (int h_ = 0; h_ < 2; ++h_) {                                         \
            SOFTMAX_ROW_RESCALE(m_run, h_, mx_[h_], sc, mr_[h_], (alpha)[h_]);                     \
            const float msc_ = mr_[h_] * (sc);                                                     \
            c_[h_] = (float)(bias)-msc_;                                                           \
            far_ |= !(msc_ < 1024.0f && msc_ > -1024.0f);                                          \
        }                                                                                          \
        if (warp_any(far_)) {                                                                      \
            _Pragma("unroll") for (int j_ = 0; j_ < (n_s); ++j_)                                   \
                _Pragma("unroll") for (int e_ = 0; e_ < 4; ++e_)(s)[j_][e_] -= mr_[e_ >> 1];       \
            c_[0] = c_[1] = (float)(bias);                                                         \
        }                                                                                          \
        _Pragma("unroll") for (int h_ = 0; h_ < 2; ++h_) {                                         \
            float psum_ = 0.0f;                                                                    \
            SOFTMAX_EXPS_SUM(s, n_s, h_, psum_, fma(x_, (sc), c_[h_]));                            \
            (l_run)[h_] = (l_run)[h_] * (alpha)[h_] + psum_;                                       \
        }                                                                                          \
    } while (0)
#define RESCALE_16(acc, n_o, alpha)                                                                \
    do {                                                                                           \
        _Pragma("unroll") for (int j_ = 0; j_ < (n_o); ++j_) {                                     \
            (acc)[j_][0] *= (alpha)[0];                                                            \
            (acc)[j_][1] *= (alpha)[0];                                                            \
            (acc)[j_][2] *= (alpha)[1];                                                            \
            (acc)[j_][3] *= (alpha)[1];                                                            \
        }                                                                                          \
    } while (0)

/* The exponent of score block j (an n8 fragment, a compile-time index):
 * ex2 on the SFU, unless a kernel sends some blocks to ex2_fma (cl/common.cl)
 * by defining EX2_SCORE itself. */
#ifndef EX2_SCORE
#define EX2_SCORE(x, j) ex2(x)
#endif
/* Row h's max over the tile, the quad's four lanes (which hold the row's columns) joined, into
 * mx (which starts at -inf). */
#define SOFTMAX_QUAD_MAX(s, n_s, h, mx)                                                            \
    do {                                                                                           \
        SOFTMAX_ROW_MAX(s, n_s, h, mx);                                                            \
        mx = fmax(mx, shfl_xor(mx, 1));                                                            \
        mx = fmax(mx, shfl_xor(mx, 2));                                                            \
    } while (0)
/* Row h's running max m_run[h] moved to take the tile's max mx: mr, the max the exponents
 * subtract (m = -inf, every score so far masked: 0), and alpha, the factor O and l take. */
#define SOFTMAX_ROW_RESCALE(m_run, h, mx, sc, mr, alpha)                                           \
    do {                                                                                           \
        const float m_new_ = fmax((m_run)[h], mx);                                                 \
        mr = m_new_ == -INFINITY ? 0.0f : m_new_;                                                  \
        alpha = m_new_ == -INFINITY ? 1.0f : ex2(((m_run)[h] - m_new_) * (sc));                    \
        (m_run)[h] = m_new_;                                                                       \
    } while (0)
/* One row (h: g or g + 8) of the step: declares alpha_ (the rescale factor). */
#define SOFTMAX_ROW_16(s, n_s, m_run, l_run, sc, h, alpha_)                                        \
    float mx_ = -INFINITY, mr_, alpha_;                                                            \
    SOFTMAX_QUAD_MAX(s, n_s, h, mx_);                                                              \
    SOFTMAX_ROW_RESCALE(m_run, h, mx_, sc, mr_, alpha_);                                           \
    float psum_ = 0.0f;                                                                            \
    SOFTMAX_EXPS(s, n_s, h, mr_, sc, psum_);                                                       \
    (l_run)[h] = (l_run)[h] * alpha_ + psum_

/* SOFTMAX_CHAINS=4 (through FLASHCL_BUILD_OPTIONS, a study; not yet run on a GPU): each row's
 * max and sum in four independent chains, not one, in every kernel of this file's softmax. ncu
 * on the H200 (2026-12-05, the FP8 forward at D=64, three warps a scheduler) put "wait" (a
 * fixed-latency dependency) first among the stalls, at 1.6 warps an issue; a row's 16- to
 * 32-step fmax and add chains are such dependencies. The max is the same in any order; the sum
 * rounds differently. */
#ifndef SOFTMAX_CHAINS
#define SOFTMAX_CHAINS 1
#endif
#if SOFTMAX_CHAINS != 1 && SOFTMAX_CHAINS != 4
#error "SOFTMAX_CHAINS is 1 or 4"
#endif
/* Chain c's value a of SOFTMAX_CHAINS, joined by op (fmax, or + as SOFTMAX_ADD) pairwise. */
#define SOFTMAX_ADD(a, b) ((a) + (b))
#define SOFTMAX_JOIN(a, op) (SOFTMAX_CHAINS == 4 ? op(op((a)[0], (a)[1]), op((a)[2], (a)[3])) : (a)[0])

/* The lane's max of row h's scores into mx: block j into chain j % SOFTMAX_CHAINS. */
#define SOFTMAX_ROW_MAX(s, n_s, h, mx)                                                             \
    do {                                                                                           \
        float m4_[4] = {mx, -INFINITY, -INFINITY, -INFINITY};                                      \
        _Pragma("unroll") for (int j_ = 0; j_ < (n_s); ++j_) m4_[j_ % SOFTMAX_CHAINS] =            \
            fmax(m4_[j_ % SOFTMAX_CHAINS], fmax((s)[j_][2 * (h)], (s)[j_][2 * (h) + 1]));          \
        mx = SOFTMAX_JOIN(m4_, fmax);                                                              \
    } while (0)

/* A row's exponents into s, summed into psum (block j into chain j % SOFTMAX_CHAINS): p = 2^X,
 * X an expression in the score x_. */
#define SOFTMAX_EXPS_SUM(s, n_s, h, psum, X)                                                       \
    do {                                                                                           \
        float ps4_[4] = {psum, 0.0f, 0.0f, 0.0f};                                                  \
        _Pragma("unroll") for (int j_ = 0; j_ < (n_s); ++j_)                                       \
            _Pragma("unroll") for (int e_ = 2 * (h); e_ < 2 * (h) + 2; ++e_) {                     \
            const float x_ = (s)[j_][e_];                                                          \
            const float p_ = EX2_SCORE(X, j_);                                                     \
            (s)[j_][e_] = p_;                                                                      \
            ps4_[j_ % SOFTMAX_CHAINS] += p_;                                                       \
        }                                                                                          \
        psum = SOFTMAX_JOIN(ps4_, SOFTMAX_ADD);                                                    \
    } while (0)

/* p = 2^((s - m) sc), not 2^(s sc - m sc) by fma: the fma rounds s sc once and m sc was rounded
 * another way, so at s = m ~ 1e10 p was 2^+-512 (0 or inf). s - m is exact near m and <= 0
 * always. A kernel may redefine SOFTMAX_EXPS as SOFTMAX_EXPS_BIASED (below). */
#define SOFTMAX_EXPS(s, n_s, h, mr, sc, psum) SOFTMAX_EXPS_SUM(s, n_s, h, psum, (x_ - (mr)) * (sc))
/* p = 2^((s - m) sc + bias) (the FP8 forward: bias = log2 of its P_SCALE), so that the p P V
 * quantizes come out of the exponent already scaled, with no multiply a score; and where the
 * row's |m sc| < 1024 in every lane of the warp (a vote: always, but for scores of thousands of
 * bits) by one fma a score, 2^(s sc + (bias - m sc)), without the subtraction. That exponent is
 * off by the rounding of m sc and of bias - m sc: the same for every score of the row in the
 * tile, so a factor O and l share, under 2^-13 below 1024 (and in the LSE, which the store
 * computes from m sc, under 1e-4). Past 1024 it could reach whole powers of two (the reason for
 * the form above), so those rows keep it. The kernel's l then holds 2^bias times the sum. */
#define SOFTMAX_EXPS_BIASED(s, n_s, h, mr, sc, psum, bias)                                         \
    const float msc_ = (mr) * (sc);                                                                \
    if (!warp_any(!(msc_ < 1024.0f && msc_ > -1024.0f))) {                                         \
        const float c_ = (float)(bias)-msc_;                                                       \
        SOFTMAX_EXPS_SUM(s, n_s, h, psum, fma(x_, (sc), c_));                                      \
    } else {                                                                                       \
        SOFTMAX_EXPS_SUM(s, n_s, h, psum, fma(x_ - (mr), (sc), (float)(bias)));                    \
    }

/* x from lane src of this warp. */
inline float shfl_idx(float x, int src) {
    uint y;
    __asm__ __volatile__("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;"
                         : "=r"(y)
                         : "r"(as_uint(x)), "r"(src));
    return as_float(y);
}

/* 1 in every lane of the warp when c is nonzero in any (vote.sync.any): a
 * warp-uniform condition. */
inline int warp_any(int c) {
    int r;
    __asm__ __volatile__("{\n\t.reg .pred p, q;\n\tsetp.ne.s32 p, %1, 0;\n\t"
                         "vote.sync.any.pred q, p, 0xffffffff;\n\tselp.s32 %0, 1, 0, q;\n\t}"
                         : "=r"(r)
                         : "r"(c));
    return r;
}

/* Butterfly exchange inside a warp: OpenCL 1.2 on NVIDIA has no sub-groups,
 * but inline PTX shfl.sync works on every architecture since sm_30. */
inline float shfl_xor(float x, int mask) {
    uint y;
    __asm__ __volatile__("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"
                         : "=r"(y)
                         : "r"(as_uint(x)), "r"(mask));
    return as_float(y);
}
#endif

/* The mask of one 16-row fragment's scores s[n_s][4] for the tile whose
 * first key is n0: -inf where the key is outside [lo[h], hi[h]] of the
 * lane's row g (h = 0: e = 0, 1) or g+8 (h = 1: e = 2, 3), as NV_FRAG_KEYS
 * gives them. Element (j, e) holds key n0 + 2t + c, c = 8j + (e & 1), so the
 * limits move into the tile's frame once and each end is one compare of the
 * constant c. with_lo, uniform over the warp, is 0 where no row's lo is
 * above n0 (a causal tile's diagonal): only hi is tested then, one ISETP and
 * one FSEL a score, half the instructions. Outside FLASHCL_NV_PTX: it is
 * arithmetic alone, and tests/mask_probe.cl checks it on any device. */
#define MASK_16(s, n_s, n0, lo, hi, with_lo)                                                       \
    do {                                                                                           \
        const int base_ = (n0) + 2 * t;                                                            \
        const int top_[2] = {(hi)[0] - base_, (hi)[1] - base_};                                    \
        if (with_lo) {                                                                             \
            const int bot_[2] = {(lo)[0] - base_, (lo)[1] - base_};                                \
            _Pragma("unroll") for (int j_ = 0; j_ < (n_s); ++j_)                                   \
                _Pragma("unroll") for (int e_ = 0; e_ < 4; ++e_) {                                 \
                const int c_ = 8 * j_ + (e_ & 1);                                                  \
                if (c_ < bot_[e_ >> 1] || c_ > top_[e_ >> 1])                                      \
                    (s)[j_][e_] = -INFINITY;                                                       \
            }                                                                                      \
        } else {                                                                                   \
            _Pragma("unroll") for (int j_ = 0; j_ < (n_s); ++j_)                                   \
                _Pragma("unroll") for (int e_ = 0; e_ < 4; ++e_) {                                 \
                if (8 * j_ + (e_ & 1) > top_[e_ >> 1])                                             \
                    (s)[j_][e_] = -INFINITY;                                                       \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#ifndef LPT_HEADS
#define LPT_HEADS 0
#endif
#if LPT_HEADS < 0
#error "LPT_HEADS is a number of (batch, head) pairs, 0 for the order by head"
#endif
/* The order of the row (or key) blocks. The hardware starts work-groups in
 * order of their linear id, dimension 0 (the block) fastest, and under a
 * causal mask a head's last row blocks see the most keys (its first key
 * blocks the most rows), so by default each head's blocks run longest
 * first: that shortens the tail of the launch. Built with LPT_HEADS = n
 * (the host asks for 8 wherever later rows see more keys, for the nv-mma
 * and nv-tf32 forward and the nv-mma backward: flashcl_lpt_heads), the ids
 * are taken in chunks of n (batch, head) pairs instead, and within a chunk
 * the longest blocks of all its heads come first (longest processing time
 * first): the short blocks then fill the SMs at the end, not a long one
 * started late. n pairs, not all, so that the K and V being read at a time
 * are those of a few heads, which stay in L2. On the H200: causal
 * (4,32,4096,64) 273 TFLOP/s against 256 by head; the wgmma kernel at D=128
 * was slower, by 1-11 % (BENCHMARKS.md).
 * LPT_PLACE(rank, pair): rank 0 is the block to run first, pair = b *
 * get_num_groups(1) + head; a bijection on the grid's work-groups (the
 * linear id fits int: fewer than 2^31 work-groups). */
#if LPT_HEADS
#define LPT_PLACE(rank, pair)                                                                      \
    const int n0_ = (int)get_num_groups(0);                                                        \
    const int hb_all_ = (int)(get_num_groups(1) * get_num_groups(2));                              \
    const int lin_ =                                                                               \
        (int)get_group_id(0) + n0_ * (int)(get_group_id(1) + get_num_groups(1) * get_group_id(2)); \
    const int chunk_ = lin_ / (LPT_HEADS * n0_), in_ = lin_ - chunk_ * LPT_HEADS * n0_;            \
    const int width_ = min(LPT_HEADS, hb_all_ - chunk_ * LPT_HEADS);                               \
    const int pair = chunk_ * LPT_HEADS + in_ % width_, rank = in_ / width_
#define NV_ROW_BLOCK_ORDER(rows)                                                                   \
    LPT_PLACE(lpt_rank_, lpt_pair_);                                                               \
    const int m0 = ((int)get_num_groups(0) - 1 - lpt_rank_) * (rows);                              \
    const int hq = lpt_pair_ % (int)get_num_groups(1);                                             \
    const int b = lpt_pair_ / (int)get_num_groups(1)
#else
#define NV_ROW_BLOCK_ORDER(rows)                                                                   \
    const int m0 = (int)(get_num_groups(0) - 1 - get_group_id(0)) * (rows);                        \
    const int hq = (int)get_global_id(1);                                                          \
    const int b = (int)get_global_id(2)
#endif
/* NV_ROW_BLOCK_ORDER(rows): the row block m0 (of `rows` rows), head hq and
 * batch b of this work-group, last blocks first (the forward, and the
 * backward's dQ pass). */
#define NV_FWD_ORDER NV_ROW_BLOCK_ORDER(BLOCK_M)
/* The opening of the tensor-core forward kernels (flash_fwd_nv, flash_fwd_nv32,
 * flash_fwd_sm90), inside a FWD_ARGS kernel: the work-item's warp and lane
 * (g = lane / 4, t = lane % 4, as in the mma fragment layouts), the block's
 * first query row m0, its heads and batch (in NV_FWD_ORDER's order), and its
 * rows. */
#define NV_FWD_BLOCK                                                                               \
    const int tid = (int)get_local_id(0);                                                          \
    const int warp = tid / 32, lane = tid % 32;                                                    \
    const int g = lane / 4, t = lane % 4;                                                          \
    NV_FWD_ORDER;                                                                                  \
    const int hk = hq / group;                                                                     \
    const int rows_q = min(BLOCK_M, nq - m0)

/* After NV_FWD_BLOCK: the head's Q, K and V as raw T (ushort: the mma takes
 * the stored bits of both 16-bit dtypes; float), and whether each matrix's
 * rows all start 16-byte aligned, as cp.async needs (decided once, uniformly). */
#define NV_FWD_HEADS(T)                                                                            \
    __global const T *qb = (__global const T *)q + (q_off + b * q_sb + hq * q_sh);                 \
    __global const T *kb = (__global const T *)k + (k_off + b * k_sb + hk * k_sh);                 \
    __global const T *vb = (__global const T *)v + (v_off + b * v_sb + hk * v_sh);                 \
    const int q_vec = ROWS_16B(qb, q_ss);                                                          \
    const int k_vec = ROWS_16B(kb, k_ss);                                                          \
    const int v_vec = ROWS_16B(vb, v_ss)

/* The keys of one 16-row fragment's rows g and g+8 of this lane (first row
 * row0): [lo[h], hi[h]], clipped to [0, nk] and [-1, nk) so they fit int. */
#define NV_FRAG_KEYS(lo, hi, row0)                                                                 \
    _Pragma("unroll") for (int h_ = 0; h_ < 2; ++h_) {                                             \
        const long2 r_ = visible_keys((row0) + g + 8 * h_, nq, nk, win_left, win_right);           \
        (lo)[h_] = (int)min(r_.x, (long)nk);                                                       \
        (hi)[h_] = (int)max(r_.y, -1L);                                                            \
    }

/* The keys of the warp whose rows are w0 .. w0 + w_rows - 1 (w_rows <= 0:
 * past nq), inside a FWD_ARGS kernel: lo and hi grow with the row, so the
 * union of its rows' keys is [w_lo, w_hi] = [lo(first), hi(last)] and the
 * keys every row sees are [w_all_lo, w_all_hi] = [lo(last), hi(first)]. A
 * warp past nq keeps empty ranges and skips every tile's math. */
#define NV_WARP_KEYS(w0, w_rows)                                                                   \
    int w_lo = INT_MAX, w_hi = -1, w_all_lo = INT_MAX, w_all_hi = -1;                              \
    if ((w_rows) > 0) {                                                                            \
        const long2 f_ = visible_keys((w0), nq, nk, win_left, win_right);                          \
        const long2 l_ = visible_keys((w0) + (w_rows)-1, nq, nk, win_left, win_right);             \
        w_lo = (int)f_.x;                                                                          \
        w_hi = (int)max(l_.y, -1L);                                                                \
        w_all_lo = (int)l_.x;                                                                      \
        w_all_hi = (int)max(f_.y, -1L);                                                            \
    }

/* The key loop's state in the wgmma forward kernels (flash_fwd_sm90,
 * flash_fwd_sm90_fp8), after NV_FWD_BLOCK: the tiles of BLOCK_N keys the
 * block's rows see, n_start .. n_end (n_start = nk when they see none); the
 * mask's key ranges of the warpgroup whose 64 rows start at row g0
 * (NV_WARP_KEYS: the mask test is per warpgroup, wgmma being collective;
 * w_lo and w_hi go unused) and of this lane's rows, g and g+8 of the warp's
 * 16 from w0 (row_lo, row_hi); the softmax's scale sc (1 under a soft-cap,
 * else q_scale); O's accumulators acc[O_FRAGS][4], and the running max and
 * sum, zeroed. */
#define NV_WG_FWD_LOOP_STATE(g0, q_scale)                                                          \
    const long2 blk_first_ = visible_keys(m0, nq, nk, win_left, win_right);                        \
    const long2 blk_last_ = visible_keys(m0 + rows_q - 1, nq, nk, win_left, win_right);            \
    const int g0_ = (g0);                                                                          \
    NV_WARP_KEYS(g0_, min(64, nq - g0_));                                                          \
    const int w0 = m0 + warp * 16;                                                                 \
    int row_lo[2], row_hi[2];                                                                      \
    NV_FRAG_KEYS(row_lo, row_hi, w0);                                                              \
    const int softcap = softcap_log2 > 0.0f;                                                       \
    const float sc = softcap ? 1.0f : (q_scale);                                                   \
    float acc[O_FRAGS][4];                                                                         \
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};                              \
    _Pragma("unroll") for (int j_ = 0; j_ < O_FRAGS; ++j_) acc[j_][0] = acc[j_][1] = acc[j_][2] =  \
        acc[j_][3] = 0.0f;                                                                         \
    const int n_start = blk_first_.x <= blk_last_.y ? (int)(blk_first_.x / BLOCK_N) * BLOCK_N : nk; \
    const int n_end = (int)blk_last_.y

/* The epilogue of the tensor-core forward kernels (flash_fwd_nv, flash_fwd_nv32,
 * flash_fwd_sm90), inside a FWD_ARGS kernel, for one 16-row fragment whose
 * first row is row0: each lane's rows g and g+8 (h = 0, 1) are divided by
 * their l (summed over the quad) and stored, then their LSE. acc[n_o][4] as
 * in ONLINE_SOFTMAX_16; T the stored element's raw type (ushort or float),
 * ob the head's output base; PAIR(orow, d, x0, x1) stores columns d, d+1
 * where o_pair says every (row, even column) is aligned for it, else
 * ONE(orow, d, x) one column at a time. A row that saw no key (l = 0)
 * stores 0 and LSE -inf. */
#define NV_FWD_STORE_FRAG(acc, n_o, m_run, l_run, sc, row0, T, ob, o_pair, PAIR, ONE)              \
    do {                                                                                           \
        _Pragma("unroll") for (int h_ = 0; h_ < 2; ++h_) {                                         \
            float l_ = (l_run)[h_];                                                                \
            l_ += shfl_xor(l_, 1);                                                                 \
            l_ += shfl_xor(l_, 2);                                                                 \
            const int row_ = (row0) + g + 8 * h_;                                                  \
            if (row_ >= nq)                                                                        \
                continue;                                                                          \
            const float inv_l_ = l_ > 0.0f ? 1.0f / l_ : 0.0f;                                     \
            __global T *orow_ = (ob) + (ulong)row_ * o_ss;                                         \
            _Pragma("unroll") for (int j_ = 0; j_ < (n_o); ++j_) {                                 \
                const int d_ = 8 * j_ + 2 * t;                                                     \
                const float x0_ = (acc)[j_][2 * h_] * inv_l_, x1_ = (acc)[j_][2 * h_ + 1] * inv_l_; \
                if (d_ >= HEAD_DIM)                                                                \
                    continue;                                                                      \
                if (o_pair) {                                                                      \
                    PAIR(orow_, d_, x0_, x1_);                                                     \
                } else {                                                                           \
                    ONE(orow_, d_, x0_);                                                           \
                    if (d_ + 1 < HEAD_DIM)                                                         \
                        ONE(orow_, d_ + 1, x1_);                                                   \
                }                                                                                  \
            }                                                                                      \
            if (has_lse && t == 0)                                                                 \
                lse[lse_off + ((ulong)b * get_global_size(1) + hq) * (ulong)nq + row_] =           \
                    l_ > 0.0f ? ((m_run)[h_] * (sc) + log2(l_)) * LN2 : -INFINITY;                 \
        }                                                                                          \
    } while (0)
