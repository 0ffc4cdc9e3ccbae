/* flash_bwd_sm90.cl: FlashAttention-2 backward on Hopper's warpgroup MMA (wgmma, sm_90a).
 *
 * The "nv-wgmma" backward variant, for float16/bfloat16 with 32 <= head_dim
 * <= 128 on compute capability 9.0 (head_dim 65..128: two 128-byte panels,
 * below; the table takes 65..128 with K and V held in registers, OWN_REGS). Same arguments, semantics and D_i pre-pass
 * as flash_bwd_nv.cl (whose comment gives the formulas), and the same two
 * kernels: dK/dV per key block, then dQ by a pass over query blocks (a fixed
 * order: deterministic); with DQ_ATOMIC (FLASHCL_BWD_PARAMS=DQ=atomic) the
 * dK/dV kernel adds dQ into a float accumulator itself instead (below). The
 * sm_90a instructions sit behind common_nv.cl's SM90A marker; src/program.c
 * rebuilds the program for sm_90a and the host falls back to flash_bwd_nv.cl
 * when that fails.
 *
 * Why wgmma here. flash_bwd_nv.cl gives each warp 16 keys, so every warp
 * reads the whole Q and dO tile from __local through ldmatrix, twice a tile
 * (plain, then transposed): the kernel is bound by those reads at about 185
 * TFLOP/s. A warpgroup's wgmma reads its B operand from __local once for all
 * four warps, so the same 64 keys cost a quarter of the reads.
 *
 * Work decomposition: one warpgroup (128 work-items) a work-group; warp w
 * owns rows (keys or query rows) 16w..16w+15 of every 64 x 64 accumulator,
 * laid out as a 16-row mma.sync fragment (flash_fwd_sm90.cl), so the
 * elementwise code is flash_bwd_nv.cl's.
 *   flash_bwd_dkdv_sm90  64 keys of one (batch, kv head); K, V in __local for
 *                        the whole loop; BLOCK_M-row tiles of Q and dO (with
 *                        LSE, D_i) of every query head sharing the kv head
 *                        stream through __local:
 *                          S^T  = K Q^T    dP^T = V dO^T   (A: K, V via ldmatrix)
 *                          P^T, dS^T elementwise, packed into A fragments
 *                          dV  += P^T dO   dK  += dS^T Q   (B: dO, Q N-major)
 *   flash_bwd_dq_sm90    64 query rows of one (batch, query head); Q, dO in
 *                        __local for the whole loop; BLOCK_N-key tiles of K, V:
 *                          S = Q K^T   dP = dO V^T   dS   dQ += dS K (K N-major)
 * Every product is m64nNk16 with A from registers (N: a streamed tile's rows
 * for the scores, 64 head dims for the gradients); A fragments of K, V (or Q,
 * dO) are read from __local again before every tile, as the forward does
 * with Q (flash_fwd_sm90.cl says why: held across tiles they went wrong),
 * unless OWN_REGS holds them (WG_KEEP_A keeps them; below).
 *
 * __local, 1024-byte aligned, every tile 128 bytes a row in common_nv.cl's SW128
 * layout (head dims zero-padded to 64): the own 64 rows of K and V (Q and
 * dO), 16 KB a 64-dim panel (with OWN_REGS the stages start over it), then
 * the streamed pairs: two stages of 32-row tiles (the next
 * pair lands during the current one; the table's choice, 34 KB), or one of
 * 64 rows, whose loads are issued once a buffer is free (in the dQ pass V's
 * after dP, K's after dQ += dS K); plus LSE and D_i of the dK/dV kernel's
 * tiles. Three work-groups an SM (the dK/dV kernel's registers capped at 168
 * by the host) hide one another's waits. On the H200 two stages of 32 rows
 * measured 149.6 TFLOP/s at (4,32,4096,64) against 113.7 with one of 64
 * (BENCHMARKS.md).
 *
 * With USE_TMA (common_nv.cl; the host builds it where the CUDA driver encodes
 * tensor maps, for two stages of 32-row tiles) work-item 0 copies each
 * streamed pair by TMA, one box per tile counted on the stage's mbarrier,
 * as the forward does; the own block and the stats still come by cp.async
 * (the own block by plain loads where its rows are not 16-byte aligned). On
 * the H200 (4,32,4096,64) f16 ran 166 / 155 TFLOP/s (none / causal) so,
 * against 148 / 132 with cp.async (BENCHMARKS.md).
 *
 * Head dims 65..128 (PANELS 2): every tile holds two 128-byte panels (dims
 * 0-63, then 64-127), dK and dV (dQ) take 128 (64) registers a work-item,
 * the gradient products are one m64n64 wgmma a panel, and the score products
 * read the own block's K and V (Q and dO) from __local (SS: held A fragments
 * would add 64 registers to dK's and dV's 128). In 48 KB that leaves one
 * stage of 16-row tiles: 32 KB of own block, 8 KB of pair (42 KB). With
 * OWN_REGS (below) the fragments are held after all, and the own block's
 * 32 KB take two stages of 32-row tiles: bench/ptx_harness.c's study measured
 * wider tiles as what pays at this head dim (16 -> 32 rows, two stages:
 * 158 -> 211 TFLOP/s, in 49 and 65 KB). ptxas 13.0 on clang's PTX of the
 * TMA builds: 255 registers (dK/dV; 4 bytes of spill) and 198 (dQ), no
 * serialisation; the cp.async twins spill 16-56 bytes; 64-row tiles do not
 * fit (112 bytes of spill, serialised wgmma), so the host refuses them.
 *
 * On request (FLASHCL_BWD_PARAMS, src/params_backward.c; tested on the H200,
 * none faster than the defaults by more than 2 %), within 48 KB, and for
 * bench/ptx_harness.c's study of tiles past that limit (issue 36): WG 256,
 * two warpgroups owning 64 keys (rows) each, 128 a work-group, every
 * streamed tile read by both, as FA2's 128-key blocks; STAGES up to 8, a ring
 * of pairs counted on the TMA mbarriers, tile it+STAGES-1 issued as tile it
 * starts. The study alone: SMEM_LIMIT and SMEM_DYNAMIC (below) for the CUDA
 * driver's dynamic shared memory.
 *
 * Ordering, as in flash_fwd_sm90.cl: each thread's copies are waited for and
 * fenced for the async proxy (cp_wait_async_proxy) before the barrier that
 * publishes a tile; accumulators are read only after wgmma.wait_group and
 * pinned by empty asm (WG_FENCE_REGS); a buffer is refilled only after a
 * barrier that follows every warp's wait for the wgmma reading it.
 */

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef WG
#define WG 128
#endif
#ifndef BLOCK_M
#define BLOCK_M 32 // dkdv: query rows per streamed Q/dO tile, 32 or 64 (16: the study's)
#endif
#ifndef BLOCK_N
#define BLOCK_N 32 // dq: keys per streamed K/V tile, 32 or 64 (16: the study's)
#endif

#define PANELS ((HEAD_DIM + 63) / 64)  // 128-byte panels of 64 halves a row
#define OWN (WG / 2)                    // keys (dkdv) or rows (dq) per work-group: 64 a warpgroup (its M)
#define OWN_BYTES (OWN * 128 * PANELS)  // the work-group's own K, V (or Q, dO)
#define K_STEPS (4 * PANELS)            // k16 steps over the head dim (padded to 64s)
#define D_FRAGS (8 * PANELS)            // n8 blocks over the head dim (padded to 64s)
#if BWD_KERNEL == 3
#define TROWS BLOCK_N // rows of a streamed tile
#else
#define TROWS BLOCK_M
#endif
#define T_BYTES (TROWS * 128 * PANELS) // one streamed tile
#define S_FRAGS (TROWS / 8)   // n8 blocks of S (S^T) per 16 rows
#define T_STEPS (TROWS / 16)  // k16 steps over a streamed tile's rows (P^T dO, dS^T Q, dS K)
/* SMEM_LIMIT: the bytes of __local a work-group may take, NVIDIA's OpenCL's
 * ~47 KB unless bench/ptx_harness.c's study asks for more (SMEM_DYNAMIC). */
#ifndef SMEM_LIMIT
#define SMEM_LIMIT 48000
#endif
#ifndef SMEM_DYNAMIC
#define SMEM_DYNAMIC 0
#endif
/* OWN_REGS (issue 36's idea; not with DQ_ATOMIC): the own block's A
 * fragments (K and V, or Q and dO) are read into registers once, kept live
 * past the loop by WG_KEEP_A, and the streamed stages reuse the own block's
 * __local: 16-32 KB freed for deeper or wider Q/dO (K/V) stages, for 32 more
 * registers a work-item a panel. */
#ifndef OWN_REGS
#define OWN_REGS 0
#endif
#define OWN_AREA (OWN_REGS ? 0 : 2 * OWN_BYTES) /* bytes of the own block beside the stages */
/* Two stages of the streamed pair (the next lands during the current) where
 * they fit beside the own block and the 1024 bytes that align the tiles. */
#ifndef STAGES
#if OWN_AREA + 4 * T_BYTES + 1024 + 4 * 4 * TROWS <= SMEM_LIMIT
#define STAGES 2
#else
#define STAGES 1
#endif
#endif
/* DQ_ATOMIC (dK/dV kernel only): dQ += dS K inside the dK/dV kernel, added
 * into the float accumulator in scratch by red.global.add, instead of the dQ
 * pass (below). */
#ifndef DQ_ATOMIC
#define DQ_ATOMIC 0
#endif
#if DQ_ATOMIC && BWD_KERNEL != 2
#error "DQ_ATOMIC is the dK/dV kernel's"
#endif
#if OWN_REGS && DQ_ATOMIC
#error "OWN_REGS: DQ_ATOMIC reads K from __local"
#endif
#define STAGE_BYTES (2 * T_BYTES)
#define STAGE_AT(st) ((uint)OWN_AREA + (uint)(st)*STAGE_BYTES) /* bytes: stage st's pair */
/* bytes: dS (DQ_ATOMIC only), after the own block and stages, or the larger of both (OWN_REGS) */
#if OWN_REGS && STAGES * STAGE_BYTES < 2 * OWN_BYTES
#define DS_AT (2 * OWN_BYTES)
#else
#define DS_AT (OWN_AREA + STAGES * STAGE_BYTES)
#endif
#define DS_BYTES (TROWS * OWN * 2)                   /* dS: the tile's rows x the own keys, DQ_ATOMIC only */
#define SMEM_BYTES (DS_AT + DQ_ATOMIC * DS_BYTES + 1024)
/* The tiles' __local array. SMEM_DYNAMIC is bench/ptx_harness.c's study of
 * tiles larger than NVIDIA's OpenCL allows (never built by the library): the
 * array is declared with 1024 bytes so that the OpenCL build's ptxas accepts
 * it, and the harness turns the declaration into the CUDA driver's dynamic
 * shared memory (.extern .shared) and launches with SMEM_BYTES of it. The
 * tiles are addressed from ALIGNED_TILES' base, by shared addresses in inline
 * PTX (cp.async, TMA, ldmatrix, wgmma descriptors) or smem; the study's
 * shapes have whole, aligned tiles, which come by cp.async and TMA only. */
#if SMEM_DYNAMIC
#define TILES_ARRAY_BYTES 1024
#else
#define TILES_ARRAY_BYTES SMEM_BYTES
#endif

#if (WG != 128 && WG != 256) || (TROWS != 16 && TROWS != 32 && TROWS != 64) || STAGES < 1 || STAGES > 8
#error "flash_bwd_sm90 is one or two warpgroups (WG 128, 256) streaming 16-, 32- or 64-row tiles in 1..8 stages"
#endif
#if STAGES > 2 && !USE_TMA
#error "more than two stages are counted on TMA's mbarriers (USE_TMA)"
#endif
#if SMEM_BYTES + (BWD_KERNEL != 3) * STAGES * 2 * TROWS * 4 > SMEM_LIMIT /* + the dK/dV kernel's stats */
#error "the tiles exceed SMEM_LIMIT (NVIDIA's OpenCL: ~47 KB of __local memory)"
#endif
/* A wgmma whose n is a streamed tile's rows (its B K-major); WGMMA_SS_NT the
 * same with both operands in __local, A M-major (DQ_ATOMIC's dQ^T = K^T dS^T);
 * WGMMA_SS_K with A K-major (the scores at two panels). */
#if TROWS == 64
#define WGMMA_NT(d, a, desc, scale_d) WGMMA_RS(WG_N64, d, a, desc, scale_d, 0)
#define WGMMA_SS_NT(d, desc_a, desc_b, scale_d) WGMMA_SS(WG_N64, d, desc_a, desc_b, scale_d, 1, 0)
#define WGMMA_SS_K(d, desc_a, desc_b, scale_d) WGMMA_SS(WG_N64, d, desc_a, desc_b, scale_d, 0, 0)
#elif TROWS == 16
#define WGMMA_NT(d, a, desc, scale_d) WGMMA_RS(WG_N16, d, a, desc, scale_d, 0)
#define WGMMA_SS_NT(d, desc_a, desc_b, scale_d) WGMMA_SS(WG_N16, d, desc_a, desc_b, scale_d, 1, 0)
#define WGMMA_SS_K(d, desc_a, desc_b, scale_d) WGMMA_SS(WG_N16, d, desc_a, desc_b, scale_d, 0, 0)
#else
#define WGMMA_NT(d, a, desc, scale_d) WGMMA_RS(WG_N32, d, a, desc, scale_d, 0)
#define WGMMA_SS_NT(d, desc_a, desc_b, scale_d) WGMMA_SS(WG_N32, d, desc_a, desc_b, scale_d, 1, 0)
#define WGMMA_SS_K(d, desc_a, desc_b, scale_d) WGMMA_SS(WG_N32, d, desc_a, desc_b, scale_d, 0, 0)
#endif
#if HEAD_DIM < 32 || HEAD_DIM > 128
#error "flash_bwd_sm90 takes 32 <= HEAD_DIM <= 128 (one or two 128-byte panels)"
#endif
#ifndef FLASHCL_NV_PTX
#error "flash_bwd_sm90 is built with -DFLASHCL_NV_PTX (the PTX helpers in common_nv.cl)"
#endif
#if DTYPE != 1 && DTYPE != 2
#error "flash_bwd_sm90 needs DTYPE 1 (float16) or 2 (bfloat16)"
#endif

#if USE_TMA && STAGES < 2
#error "USE_TMA takes two or more stages of streamed tiles"
#endif
#if USE_TMA
/* The stage's mbarrier: phase it / STAGES of it holds tile it. */
#define TMA_BAR(st) shared_addr(&tma_bars[st])
#define TMA_PARITY(it) ((uint)((it) / STAGES) & 1u)
/* Work-item 0 places the kernel's two maps (x's, y's), as flash_fwd_sm90.cl does, and
 * sets up the stages' mbarriers, which the loop's first barrier publishes. */
#define TMA_SETUP(x, xb, y, yb)                                                                    \
    __local ulong tma_bars[STAGES];                                                                \
    __global ulong *x##_map_at = TMA_SLOT(), *y##_map_at = x##_map_at + 16;                        \
    if (tid == 0) {                                                                                \
        tma_map_place(x##_map_at, x##_map, (__global const ushort *)(xb));                         \
        tma_map_place(y##_map_at, y##_map, (__global const ushort *)(yb));                         \
        for (int st_ = 0; st_ < STAGES; ++st_)                                                     \
            mbar_init(TMA_BAR(st_));                                                               \
        mbar_init_fence();                                                                         \
    }
/* Work-item 0 copies rows n.. of head h of x and y into the stage's pair at
 * byte `at` (x's tile, then y's). */
#define TMA_PAIR(at, st, x, y, n, h)                                                               \
    do {                                                                                           \
        if (tid == 0) {                                                                            \
            mbar_expect(TMA_BAR(st), 2u * T_BYTES);                                                \
            _Pragma("unroll") for (int p_ = 0; p_ < PANELS; ++p_) {                                \
                const uint pan_ = (uint)p_ * TROWS * 128u;                                         \
                tma_box(s_base + (at) + pan_, x##_map_at, 64 * p_, n, h, b, TMA_BAR(st));          \
                tma_box(s_base + (at) + T_BYTES + pan_, y##_map_at, 64 * p_, n, h, b, TMA_BAR(st)); \
            }                                                                                      \
        }                                                                                          \
    } while (0)
#define TMA_PAIR_WAIT(st, it) mbar_wait(TMA_BAR(st), TMA_PARITY(it))
#else
#define TMA_PAIR_WAIT(st, it) do { } while (0)
#endif
/* The stage after st, in place: a ring of STAGES buffers. */
#if STAGES > 2
#define NEXT_STAGE(st) (st) = (st) + 1 == STAGES ? 0 : (st) + 1
#else
#define NEXT_STAGE(st) (st) ^= STAGES - 1
#endif

/* B operands, streamed tiles (TROWS rows) at shared address `tile` in the
 * SW128 layout: K-major (rows are n, dims are k: X Y^T over the head dim),
 * k-step kk 32*(kk%4) bytes into panel kk/4; N-major (rows are k: A Y over
 * the tile's rows), k-step kk at its 16 rows, of the first panel (A Y takes
 * one wgmma a panel). A_K_MAJOR: the same K-major steps of the own block (OWN
 * rows), this warpgroup's 64 rows, as the A operand of an SS wgmma. */
#define B_K_MAJOR(tile, kk) sw128_desc((tile) + (uint)((kk) / 4) * (TROWS * 128u) + (uint)((kk) % 4) * 32u)
#define B_N_MAJOR(tile, kk) sw128_desc((tile) + (uint)(kk)*2048u)
#define A_K_MAJOR(tile, kk)                                                                        \
    sw128_desc((tile) + (uint)((kk) / 4) * (OWN * 128u) + (WG > 128 ? (uint)(warp / 4) * 8192u : 0u) +            \
               (uint)((kk) % 4) * 32u)

/* acc = A Y^T, A's fragments a[K_STEPS][4] (this warp's 16 rows of X), Y the
 * TROWS rows of the streamed tile at y: a product over the head dim, acc
 * (TROWS wide) overwritten. */
#define CHAIN_XYT(acc, a, y)                                                                       \
    _Pragma("unroll") for (int kk = 0; kk < K_STEPS; ++kk) {                                       \
        if (kk == 0)                                                                               \
            WGMMA_NT(acc, (a)[kk], B_K_MAJOR(y, kk), 0);                                            \
        else                                                                                       \
            WGMMA_NT(acc, (a)[kk], B_K_MAJOR(y, kk), 1);                                            \
    }

/* acc += A Y, A's fragments a[T_STEPS][4] (TROWS wide, over Y's rows), Y the
 * streamed tile at y, acc HEAD_DIM wide: one m64n64 wgmma a 64-dim panel. */
#define CHAIN_AY(acc, a, y)                                                                        \
    _Pragma("unroll") for (int kk = 0; kk < T_STEPS; ++kk)                                         \
        _Pragma("unroll") for (int hh = 0; hh < PANELS; ++hh)                                      \
            WGMMA_RS(WG_N64, (acc) + 8 * hh, (a)[kk], B_N_MAJOR((y) + (uint)hh * (TROWS * 128u), kk), 1, 1)

/* This warp's A fragments (rows 16*warp..) of the own block at x over the head dim. */
#define LOAD_A_FRAGS(f, x) SW128_A_FRAGS(f, x, OWN, K_STEPS)

/* s = X Y^T and dp = Z W^T over the head dim, waited for: X and Z the own
 * block's tiles at x and z, Y and W the streamed tiles at y and w, which
 * tile_wait (a statement) waits for. S^T and
 * dP^T in the dK/dV kernel, S and dP in the dQ pass. At one panel X and Z
 * are A fragments (ldmatrix, reloaded every tile); at two, 64 registers of
 * them would join the 128 of dK and dV (at most 255), so the wgmma read X
 * and Z from __local themselves (SS), unless OWN_REGS holds them. */
#if PANELS > 1 && !OWN_REGS
#define SCORES_A_FRAGS(x, z) /* none: the wgmma read X and Z */
#define CHAIN_S(acc, f, x, y)                                                                      \
    _Pragma("unroll") for (int kk = 0; kk < K_STEPS; ++kk) {                                       \
        if (kk == 0)                                                                               \
            WGMMA_SS_K(acc, A_K_MAJOR(x, kk), B_K_MAJOR(y, kk), 0);                                \
        else                                                                                       \
            WGMMA_SS_K(acc, A_K_MAJOR(x, kk), B_K_MAJOR(y, kk), 1);                                \
    }
#elif OWN_REGS
#define SCORES_A_FRAGS(x, z) /* none: xf_ and zf_ are held (OWN_FRAGS_HELD) */
#define CHAIN_S(acc, f, x, y) CHAIN_XYT(acc, f, y)
#else
#define SCORES_A_FRAGS(x, z)                                                                       \
    uint xf_[K_STEPS][4], zf_[K_STEPS][4];                                                         \
    LOAD_A_FRAGS(xf_, x);                                                                          \
    LOAD_A_FRAGS(zf_, z)
#define CHAIN_S(acc, f, x, y) CHAIN_XYT(acc, f, y)
#endif
#if OWN_REGS
/* The own block's fragments into the registers SCORES reads (xf_ of x, zf_ of z), once the block
 * has landed; then every warp is done with the block's __local, which the stages take. With TMA
 * the issuing work-item orders those generic reads before its copies (tma_fence_shared). */
#define OWN_FRAGS_HELD(x, z)                                                                       \
    uint xf_[K_STEPS][4], zf_[K_STEPS][4];                                                         \
    cp_wait_async_proxy();                                                                         \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                  \
    LOAD_A_FRAGS(xf_, x);                                                                          \
    LOAD_A_FRAGS(zf_, z);                                                                          \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                  \
    OWN_FRAGS_TMA_FENCE
#if USE_TMA
#define OWN_FRAGS_TMA_FENCE                                                                        \
    if (tid == 0)                                                                                  \
        tma_fence_shared()
#else
#define OWN_FRAGS_TMA_FENCE do { } while (0)
#endif
/* After the loop: a use of the held fragments ptxas must keep (WG_KEEP_A; never is not negative),
 * so that it does not reuse their registers inside the loop (docs/perf-notes.md, the Q-register
 * fault). */
#define OWN_FRAGS_KEEP(never)                                                                      \
    do {                                                                                           \
        WG_KEEP_A(xf_, K_STEPS, s_base, never);                                                    \
        WG_KEEP_A(zf_, K_STEPS, s_base, never);                                                    \
    } while (0)
#else
#define OWN_FRAGS_HELD(x, z) do { } while (0)
#define OWN_FRAGS_KEEP(never) do { } while (0)
#endif
#define SCORES(s, dp, x, y, z, w, tile_wait)                                                       \
    do {                                                                                           \
        SCORES_A_FRAGS(x, z); /* the own block stays put: read before the tile's wait */           \
        tile_wait;                                                                                 \
        WGMMA_FENCE();                                                                             \
        CHAIN_S(s, xf_, x, y);                                                                     \
        CHAIN_S(dp, zf_, z, w);                                                                    \
        WGMMA_COMMIT();                                                                            \
        WGMMA_WAIT_ALL();                                                                          \
        WG_FENCE_REGS(s, S_FRAGS);                                                                 \
        WG_FENCE_REGS(dp, S_FRAGS);                                                                \
    } while (0)

/* A fragments of a TROWS-wide accumulator (n8 blocks 2kk, 2kk+1 per k-step). */
#define PACK_A(a, acc)                                                                             \
    _Pragma("unroll") for (int kk = 0; kk < T_STEPS; ++kk) ACC_TO_A((a)[kk], (acc)[2 * kk], (acc)[2 * kk + 1])

#define ZERO_ACC(acc)                                                                              \
    _Pragma("unroll") for (int j_ = 0; j_ < D_FRAGS; ++j_)                                         \
        _Pragma("unroll") for (int e_ = 0; e_ < 4; ++e_)(acc)[j_][e_] = 0.0f

/* nrows rows of a [*][HEAD_DIM] matrix (row r at src + r*stride, `rows` of
 * them real, the rest zero) into the tile `at` bytes into the tiles. */
#define COPY_TILE(at, src, stride, rows, nrows, vec)                                               \
    nv_copy_rows_to(smem, s_base, (at) / 2u, src, stride, rows, nrows, vec, tid, HEAD_DIM, 0, WG, 1)

/* ==== dK, dV ================================================================================ */
#if !defined(BWD_KERNEL) || BWD_KERNEL == 2

#if DQ_ATOMIC
/* dQ += dS K for the tile's rows, from the dK/dV kernel.
 *
 * Why: the dQ pass recomputes S and dP for every (row block, key block), 3
 * products where this adds 1 (FA2 sums dQ the same way). wgmma's M is 64, the
 * tile has 32 rows, so the product is dQ^T = K^T dS^T: M = 64 head dims, k =
 * the 64 keys, n = the tile's rows; both operands from __local: A = K^T is the
 * own K tile read M-major, B = dS^T is dS stored [rows][keys] (K-major, one
 * 128-byte panel of 64 keys a row, SW128). Warp w holds dims 16w.. of the
 * result, which it adds into dq_acc ([row][head_dim] floats, scaled as dQ).
 * On the H200 at (4,32,4096,64) f16 the dK/dV kernel then took 7.8 ms
 * against 5.0 ms + 2.9 ms for the dQ pass: level without a mask, 2-3 %
 * faster causal (BENCHMARKS.md, 2026-12-03, d9da259), so the host asks for it only
 * under FLASHCL_BWD_PARAMS=DQ=atomic. Adding 4 floats a red (a 4 x 4
 * exchange among lanes first) was slower (8.3 / 4.5 ms against 8.0 / 4.0):
 * the added time is not the reds' count.
 * With two warpgroups (WG 256, opt-in) dS holds the 128 keys in two panels
 * and warpgroup 0 alone takes k over all of them, so each
 * dQ element gets one red per 128 keys, as in FA2, where one warpgroup gets
 * one per 64. At two panels (head dims 65..128) the product runs once a
 * 64-dim panel of K (M is 64), into the same accumulator registers.
 *
 * DS_STORE: this warp's dS^T fragments (keys 16w.., the tile's rows) into the
 * dS tile as dS[row][key], rounded to DTYPE. */
#define DS_STORE(ds)                                                                               \
    _Pragma("unroll") for (int j = 0; j < S_FRAGS; ++j)                                            \
        _Pragma("unroll") for (int e = 0; e < 4; ++e) {                                            \
            const int r_ = 8 * j + 2 * t + (e & 1), c_ = 16 * warp + g + 8 * (e >> 1);            \
            smem[(DS_AT + SW128_OFFSET(r_, c_ >> 3, TROWS)) / 2u + (uint)(c_ & 7)] =               \
                (ushort)(pack2((ds)[j][e], 0.0f) & 0xFFFFu);                                       \
        }
/* dQ^T = K^T dS^T (fresh), waited for; then this lane's part added into the
 * accumulator rows of tile rows m0_.. of query head hq_. */
#define DQ_ADD(m0_, hq_)                                                                           \
    _Pragma("unroll") for (int mb_ = 0; mb_ < PANELS; ++mb_) {                                     \
        const uint kp_ = k_own + (uint)mb_ * (OWN * 128u); /* dims 64 mb_.. of K: its panel mb_ */ \
        float dq_[S_FRAGS][4];                                                                     \
        WGMMA_FENCE();                                                                             \
        _Pragma("unroll") for (int kk = 0; kk < OWN / 16; ++kk) {                                  \
            if (kk == 0)                                                                           \
                WGMMA_SS_NT(dq_, B_N_MAJOR(kp_, kk), B_K_MAJOR(s_base + DS_AT, kk), 0);            \
            else                                                                                   \
                WGMMA_SS_NT(dq_, B_N_MAJOR(kp_, kk), B_K_MAJOR(s_base + DS_AT, kk), 1);            \
        }                                                                                          \
        WGMMA_COMMIT();                                                                            \
        WGMMA_WAIT_ALL();                                                                          \
        WG_FENCE_REGS(dq_, S_FRAGS);                                                               \
        __global float *acc_ = scratch + dq_acc_off + ((ulong)b * heads_q + (hq_)) * (ulong)nq * HEAD_DIM; \
        _Pragma("unroll") for (int j = 0; j < S_FRAGS; ++j)                                        \
            _Pragma("unroll") for (int e = 0; e < 4; ++e) {                                        \
                const int row_ = (m0_) + 8 * j + 2 * t + (e & 1);                                 \
                const int d_ = 64 * mb_ + 16 * warp + g + 8 * (e >> 1);                            \
                if (row_ < nq && d_ < HEAD_DIM)                                                    \
                    __asm__ __volatile__("red.global.add.f32 [%0], %1;" ::"l"(                     \
                                             acc_ + (ulong)row_ * HEAD_DIM + d_),                  \
                                         "f"(dq_[j][e])                                            \
                                         : "memory");                                              \
            }                                                                                      \
    }
#endif

#if USE_TMA
#define DKDV_TMA_ARGS TMA_ARGS(q, dout)
#else
#define DKDV_TMA_ARGS
#endif
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void flash_bwd_dkdv_sm90(BWD_DKDV_ARGS DKDV_TMA_ARGS) {
    __local ushort smem_raw[TILES_ARRAY_BYTES / 2] __attribute__((aligned(1024)));
    /* per row of a stage's tile: LSE as stored (-inf past nq; NV_P_DS_T applies lse_log2), D_i */
    __local float stats[STAGES][2][BLOCK_M];

    const int tid = (int)get_local_id(0);
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    NV_KEY_BLOCK_ORDER(OWN);
    const int heads_q = (int)get_global_size(1) * group;
    ALIGNED_TILES(smem_raw);
    const uint k_own = s_base, v_own = s_base + OWN_BYTES;

    /* K and V of the group's keys, once. */
    __global const ushort *kb = (__global const ushort *)k + ROW_AT(k, b, n0, hk);
    __global const ushort *vb = (__global const ushort *)v + ROW_AT(v, b, n0, hk);
    const int n_rows = min(OWN, nk - n0);
    COPY_TILE(0u, kb, k_ss, n_rows, OWN, ROWS_16B(kb, k_ss));
    COPY_TILE(OWN_BYTES, vb, v_ss, n_rows, OWN, ROWS_16B(vb, v_ss));

    NV_KEY_BLOCK_ROW_TILES(OWN);
#if USE_TMA
    TMA_SETUP(q, q + q_off, dout, dout + dout_off);
    /* Issues the copies of tile `it` into stage `st` (Q, dO by TMA; LSE and
     * D_i by cp.async, NV_TILE_STATS: waited for with the others). */
#define ISSUE_TILE(it, st)                                                                         \
    do {                                                                                           \
        const int hq_ = hk * group + (it) / m_tiles;                                               \
        const int m0_ = m_first + ((it) % m_tiles) * BLOCK_M;                                      \
        TMA_PAIR(STAGE_AT(st), st, q, dout, m0_, hq_);                                             \
        NV_TILE_STATS(stats[st], m0_, hq_);                                                        \
    } while (0)
#else
    NV_QDO_VEC;

    /* Issues the copies of tile `it` into stage `st` (Q, dO by cp.async or
     * plain loads; LSE and D_i by cp.async, NV_TILE_STATS). */
#define ISSUE_TILE(it, st)                                                                         \
    do {                                                                                           \
        const int hq_ = hk * group + (it) / m_tiles;                                               \
        const int m0_ = m_first + ((it) % m_tiles) * BLOCK_M;                                      \
        const int rows_ = min(BLOCK_M, nq - m0_);                                                  \
        const uint at_ = STAGE_AT(st);                                                             \
        COPY_TILE(at_, (__global const ushort *)q + ROW_AT(q, b, m0_, hq_), q_ss, rows_, BLOCK_M,  \
                  q_vec);                                                                          \
        COPY_TILE(at_ + T_BYTES, (__global const ushort *)dout + ROW_AT(dout, b, m0_, hq_),        \
                  dout_ss, rows_, BLOCK_M, do_vec);                                                \
        NV_TILE_STATS(stats[st], m0_, hq_);                                                        \
    } while (0)
#endif

    float dk_acc[D_FRAGS][4], dv_acc[D_FRAGS][4];
    ZERO_ACC(dk_acc);
    ZERO_ACC(dv_acc);
    const int kw0 = n0 + 16 * warp; /* this warp's first key */

    OWN_FRAGS_HELD(k_own, v_own);
    if (tiles > 0)
        ISSUE_TILE(0, 0);
#if STAGES > 2
    for (int i = 1; i < STAGES - 1 && i < tiles; ++i)
        ISSUE_TILE(i, i);
#endif
    int stage = 0;
    for (int it = 0; it < tiles; ++it) {
        /* Tile it (and, the first time, K and V) has landed for everyone; with
         * two or more stages every warp is also done with tile it-1, whose
         * buffers now take tile it+STAGES-1. */
        cp_wait_async_proxy();
        barrier(CLK_LOCAL_MEM_FENCE);
#if STAGES > 2
        if (it + STAGES - 1 < tiles)
            ISSUE_TILE(it + STAGES - 1, stage == 0 ? STAGES - 1 : stage - 1);
#elif STAGES == 2
        if (it + 1 < tiles)
            ISSUE_TILE(it + 1, stage ^ 1);
#endif
        const int m0 = m_first + (it % m_tiles) * BLOCK_M;
        const uint q_tile = s_base + STAGE_AT(stage), do_tile = q_tile + T_BYTES;

        /* ---- S^T = K Q^T and dP^T = V dO^T (64 keys x BLOCK_M rows) ---- */
        float s[S_FRAGS][4], dp[S_FRAGS][4];
        SCORES(s, dp, k_own, q_tile, v_own, do_tile, TMA_PAIR_WAIT(stage, it));

        /* ---- P^T into s, dS^T into dp ---- */
        const long rel_max = (long)kw0 + 15 - m0, rel_min = (long)kw0 - (m0 + BLOCK_M - 1);
        const int masked = rel_min < rel.x || rel_max > rel.y || kw0 + 15 >= nk;
        NV_P_DS_T(s, dp, stats[stage], m0, masked);
#if DQ_ATOMIC
        DS_STORE(dp); /* read by the dQ product below, after the barrier */
#endif

        /* ---- dV += P^T dO and dK += dS^T Q, k = the tile's rows ---- */
        {
            uint pa[T_STEPS][4], da[T_STEPS][4];
            PACK_A(pa, s);
            PACK_A(da, dp);
            WG_FENCE_REGS(dv_acc, D_FRAGS);
            WG_FENCE_REGS(dk_acc, D_FRAGS);
            WG_FENCE_REGS_C(pa, T_STEPS, "r");
            WG_FENCE_REGS_C(da, T_STEPS, "r");
            WGMMA_FENCE();
            CHAIN_AY(dv_acc, pa, do_tile);
            CHAIN_AY(dk_acc, da, q_tile);
            WGMMA_COMMIT();
            WGMMA_WAIT_ALL();
            WG_FENCE_REGS(dv_acc, D_FRAGS);
            WG_FENCE_REGS(dk_acc, D_FRAGS);
        }
#if DQ_ATOMIC
        /* Every warp's dS is in __local and visible to wgmma; the next tile's
         * first barrier keeps it until every warp's product is done. */
        __asm__ __volatile__("fence.proxy.async.shared::cta;" ::: "memory");
        barrier(CLK_LOCAL_MEM_FENCE);
        if (WG == 128 || warp < 4) /* one warpgroup: all the keys' dS in one product */
            DQ_ADD(m0, hk * group + it / m_tiles);
#endif
#if STAGES == 1
        /* Every warp is done with tile it: its buffers take tile it+1. */
        barrier(CLK_LOCAL_MEM_FENCE);
        if (it + 1 < tiles)
            ISSUE_TILE(it + 1, 0);
#endif
        NEXT_STAGE(stage);
    }
#undef ISSUE_TILE
    OWN_FRAGS_KEEP(nk);
    cp_wait(); /* K and V when there was no tile */

    NV_STORE_DKDV;
}
#endif

/* ==== dQ ==================================================================================== */
#if !defined(BWD_KERNEL) || BWD_KERNEL == 3

#if USE_TMA
#define DQ_TMA_ARGS TMA_ARGS(k, v)
#else
#define DQ_TMA_ARGS
#endif
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void flash_bwd_dq_sm90(BWD_DQ_ARGS DQ_TMA_ARGS) {
    __local ushort smem_raw[TILES_ARRAY_BYTES / 2] __attribute__((aligned(1024)));

    const int tid = (int)get_local_id(0);
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    /* Last blocks first: under a causal mask they see the most keys. */
    NV_ROW_BLOCK_ORDER(OWN);
    const int hk = hq / group;
    const int rows_q = min(OWN, nq - m0);
    ALIGNED_TILES(smem_raw);
    const uint q_own = s_base, do_own = s_base + OWN_BYTES;

    __global const ushort *qb = (__global const ushort *)q + ROW_AT(q, b, m0, hq);
    __global const ushort *ob = (__global const ushort *)dout + ROW_AT(dout, b, m0, hq);
#if !USE_TMA
    __global const ushort *kb = (__global const ushort *)k + ROW_AT(k, b, 0, hk);
    __global const ushort *vb = (__global const ushort *)v + ROW_AT(v, b, 0, hk);
    const int k_vec = ROWS_16B(kb, k_ss);
    const int v_vec = ROWS_16B(vb, v_ss);
#endif

    /* Q and dO of the block, once. */
    COPY_TILE(0u, qb, q_ss, rows_q, OWN, ROWS_16B(qb, q_ss));
    COPY_TILE(OWN_BYTES, ob, dout_ss, rows_q, OWN, ROWS_16B(ob, dout_ss));

    /* Keys any row of the block sees; a warp past nq computes too (its rows give dS = 0). */
    NV_DQ_ROWS_AND_KEYS;

    float dq_acc[D_FRAGS][4];
    ZERO_ACC(dq_acc);

#if USE_TMA
    TMA_SETUP(k, k + k_off, v, v + v_off);
    /* K and V of the keys n.. into stage st, by TMA (K's tile first). */
#define ISSUE_PAIR(n, st) TMA_PAIR(STAGE_AT(st), st, k, v, n, hk)
#else
    /* K or V (x) of the keys n.. into stage st: K's tile first (slot 0), V's after it (slot 1). */
#define ISSUE(x, slot, n, st)                                                                      \
    COPY_TILE(STAGE_AT(st) + (slot)*T_BYTES, x##b + (ulong)(n)*x##_ss,                             \
              x##_ss, min(BLOCK_N, nk - (n)), BLOCK_N, x##_vec)
#define ISSUE_PAIR(n, st)                                                                          \
    do {                                                                                           \
        ISSUE(k, 0u, n, st);                                                                       \
        ISSUE(v, 1u, n, st);                                                                       \
    } while (0)
#endif
    OWN_FRAGS_HELD(q_own, do_own);
    if (n_start <= n_end)
        ISSUE_PAIR(n_start, 0);
#if STAGES > 2
    for (int i = 1; i < STAGES - 1 && n_start + i * BLOCK_N <= n_end; ++i)
        ISSUE_PAIR(n_start + i * BLOCK_N, i);
#endif
    int stage = 0;
    for (int n0 = n_start, it = 0; n0 <= n_end; n0 += BLOCK_N, ++it) {
        const int n1 = n0 + BLOCK_N, more = n1 <= n_end;
        /* K(n0) and V(n0) (and, the first time, Q and dO) have landed for
         * everyone; with two or more stages every warp is also done with the
         * previous tile, whose buffers now take the one STAGES-1 ahead. */
        cp_wait_async_proxy();
        barrier(CLK_LOCAL_MEM_FENCE);
#if STAGES > 2
        if (n0 + (STAGES - 1) * BLOCK_N <= n_end)
            ISSUE_PAIR(n0 + (STAGES - 1) * BLOCK_N, stage == 0 ? STAGES - 1 : stage - 1);
#elif STAGES == 2
        if (more)
            ISSUE_PAIR(n1, stage ^ 1);
#endif
        const uint k_tile = s_base + STAGE_AT(stage), v_tile = k_tile + T_BYTES;

        /* ---- S = Q K^T and dP = dO V^T (64 rows x BLOCK_N keys) ---- */
        float s[S_FRAGS][4], dp[S_FRAGS][4];
        SCORES(s, dp, q_own, k_tile, do_own, v_tile, TMA_PAIR_WAIT(stage, it));
#if STAGES == 1
        /* Every warp is done with V(n0): V(n1) lands during the rest. */
        barrier(CLK_LOCAL_MEM_FENCE);
        if (more)
            ISSUE(v, 1u, n1, 0);
#endif

        /* ---- dS into dp ---- */
        const long rel_max = (long)n0 + BLOCK_N - 1 - w0, rel_min = (long)n0 - (w0 + 15);
        const int masked = rel_min < rel.x || rel_max > rel.y || n0 + BLOCK_N > nk;
        NV_DS(s, dp, n0, masked);

        /* ---- dQ += dS K, k = the tile's keys ---- */
        {
            uint da[T_STEPS][4];
            PACK_A(da, dp);
            WG_FENCE_REGS(dq_acc, D_FRAGS);
            WG_FENCE_REGS_C(da, T_STEPS, "r");
            WGMMA_FENCE();
            CHAIN_AY(dq_acc, da, k_tile);
            WGMMA_COMMIT();
            WGMMA_WAIT_ALL();
            WG_FENCE_REGS(dq_acc, D_FRAGS);
        }
#if STAGES == 1
        /* Every warp is done with K(n0). */
        barrier(CLK_LOCAL_MEM_FENCE);
        if (more)
            ISSUE(k, 0u, n1, 0);
#endif
        NEXT_STAGE(stage);
    }
#undef ISSUE
#undef ISSUE_PAIR
    OWN_FRAGS_KEEP(nk);
    cp_wait(); /* Q and dO when there was no tile */

    if (w_rows > 0)
        STORE_ACC((__global ushort *)dq + ROW_AT(dq, b, w0, hq), dq_ss, dq_acc, w_rows);
}
#endif
