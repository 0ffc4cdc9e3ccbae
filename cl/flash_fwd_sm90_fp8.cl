/* flash_fwd_sm90_fp8.cl: the FP8 forward on Hopper's warpgroup MMA in e4m3/e5m2 (wgmma k32, sm_90a).
 *
 * Arguments and semantics are those of the FP8 forward of flash_fwd.cl
 * (FWD_ARGS FWD_FP8_ARGS, cl/common.cl): q, k, v are FP8 bytes of one format
 * (Q_FP8 = KV_FP8 = 3 e4m3 or 4 e5m2), the output is DTYPE (1 float16 or 2
 * bfloat16), and the true inputs are descale * decode(byte). The host
 * (src/attention.c) builds it the way it builds flash_fwd_sm90.cl: the sm_90a
 * instructions sit behind the SM90A marker and src/program.c rebuilds the
 * program's PTX for sm_90a.
 *
 * Status: the default for FP8 q, k, v with a 16-bit output on compute
 * capability 9.0 (src/params_forward.c's sm_90 entries). Its first version
 * (V transposed by the work-items, O chained through the FP8 MMA's
 * accumulator) ran at 0.56-0.70x the 16-bit kernel (H200, 2026-12-05). This
 * version (Vt by a pre-pass and TMA, the two-level P V sum) passed
 * test_fp8_forward on an H100 and ran at 1.24-1.63x the 16-bit kernel in
 * the same call (2026-12-05, docs/perf-notes-fp8.md, "FP8 forward on warpgroup
 * MMA"), and on the H200 from 4096 keys at 1.26-1.56x cuDNN's float16 at D=128, 1.01-1.12x at
 * D=64 (2026-12-05, 2e86b2a: the softmax below and the host's 168-register cap above D=64);
 * OVERLAP and EX2_FMA_EVERY, on request, are slower (below).
 *
 * Work decomposition. One warpgroup (4 warps) owns BLOCK_M = 64 query rows
 * of one (batch, query head) and walks the visible keys in tiles of
 * BLOCK_N = 128 (on request, at head dims up to 64, two warpgroups own 64
 * rows each of a 128-row block and take turns: PINGPONG, below):
 *   S  = Q K^T : wgmma m64n64k32 e4m3|e5m2 x2 per k-step (keys 0-63, 64-127),
 *                Q (A) from registers, K (B) from __local, K-major;
 *   O += P V   : wgmma m64n64k32 per 64 head dims, P (A) quantized to e4m3
 *                in registers, Vt (B) from __local, K-major; each tile's
 *                product in fresh registers, added to O in float32
 *                (PV_TWO_LEVEL: the FP8 MMA's accumulator is not float32).
 * 8-bit wgmma takes both operands K-major only (no transpose bit), so V,
 * stored keys x dims, is first transposed into Vt, dims x keys, in global
 * memory by fp8_vt_pack (cl/fp8_vt_pack.cl; the host runs it before the
 * forward, into the context's scratch), and Vt tiles then arrive as K tiles
 * do: by TMA where the host encodes tensor maps (USE_TMA), by cp.async
 * elsewhere.
 *
 * The operand layouts in bytes. An 8-bit k32 step is 32 bytes, as a 16-bit
 * k16 step is, and wgmma's 8-bit A fragment puts bytes 4t..4t+3 of rows g
 * and g+8 and bytes 16+4t.. of both in a0..a3, which is where ldmatrix puts
 * the 16-bit fragment's elements: so Q's fragments (SW128_A_FRAGS) and K's
 * descriptors (sw128_desc, 128-byte rows, step kk 32*kk bytes in) are the
 * 16-bit kernel's, with a row of HEAD_DIM <= 128 bytes in one 128-byte panel.
 *
 * P. The accumulator gives lane (g, t) columns 8j+2t and 8j+2t+1 of n8 block
 * j; the A fragment wants 4 consecutive k positions 4t..4t+3 a register. So
 * the four values of blocks j = 4kk, 4kk+1 (columns 2t, 2t+1, 8+2t, 9+2t of
 * a 16-key half) become one register as they stand, and Vt's k positions
 * follow them: position 16G + 4t + i of a tile holds key 16G + 2t + (i & 1) +
 * 8 (i >> 1) (VT_KEY in cl/fp8_vt_pack.cl, which writes Vt in that order).
 * No shuffle between lanes is needed. P is scaled by
 * P_SCALE = 256 before it is rounded to e4m3 (exact, a power of two): p in
 * [2^-17, 1] keeps a normal or subnormal code instead of flushing below
 * 2^-10; the output divides it out with v's descale.
 *
 * Descale factors: per tensor or per (batch, head), they fold into the
 * softmax's scale; with row blocks (sc_rows, a multiple of 8 the host
 * checks) each score is multiplied by its row's q factor and its 8-key
 * block's k factor before the softmax.
 *
 * __local (1024-byte aligned: the swizzle works on address bits 4-9):
 *   K tile  BLOCK_N rows x 128 bytes         16 KB
 *   Vt      VT_ROWS (64 or 128) x 128 bytes   8 or 16 KB
 *   Q block BLOCK_M rows x 128 bytes          8 KB (16 KB: PINGPONG), reloaded into registers every tile
 * One K and one Vt buffer, as flash_fwd_sm90.cl's loops: Vt(n0) lands while
 * S = Q K^T runs, K(n0 + BLOCK_N) while the softmax and O += P V do (K_EARLY,
 * with TMA; as flash_fwd_sm90.cl's PINGPONG loop) or while O += P V does (as
 * its plain loop). A second stage
 * of either fits NVIDIA's 48 KB beside the other tiles only for Vt of one
 * 64-dim panel (8 KB), which OVERLAP (below) uses.
 * Q's fragments are reloaded before every tile, as flash_fwd_sm90.cl does
 * at one panel (Q_PER_TILE there): held across tiles, registers read only by
 * wgmma are not kept live by ptxas around the loop's back edge, and P lands
 * in them (docs/perf-notes.md, "The Q-register fault found in SASS").
 *
 * Ordering: K and Vt arrive by TMA, counted on an mbarrier each that every
 * work-item waits on before its wgmma reads the tile, or by cp.async, waited
 * for and fenced (fence.proxy.async) before the barrier that publishes them;
 * a buffer is refilled only after the barrier that follows every warp's wait
 * for the wgmma that read it. wgmma's registers are pinned with
 * WG_FENCE_REGS around each chain.
 */

/* RESCALE_SKIP (ONLINE_SOFTMAX_16, common_nv.cl): 1 leaves O alone in tiles where no row's
 * max moved; off here until timed (on in the decode kernel). Only the OVERLAP and PV_CHAINED
 * loops rescale O in the softmax: the plain loop does it in the add of P V (PV_ADD). */
#ifndef RESCALE_SKIP
#define RESCALE_SKIP 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef WARPS
#define WARPS 4
#endif
#define WG_SIZE (WARPS * 32)
#if (WARPS != 4 && WARPS != 8) || !defined(BLOCK_M) || !defined(BLOCK_N) || BLOCK_M != 16 * WARPS || BLOCK_N != 128
#error "flash_fwd_sm90_fp8 is one or two warpgroups of 64 rows each (WARPS 4 or 8, BLOCK_M 16*WARPS) over 128-key tiles"
#endif
/* PINGPONG (two warpgroups, WARPS=8; the loop below): FlashAttention-3's ping-pong. The
 * warpgroups share each K and Vt tile and take turns on the tensor cores, so that one's softmax
 * runs while the other's products do. Built to test a guess: at head_dim 64 a 128-key tile's 64
 * exponents a lane keep the SFU 57 % busy while the products need the tensor cores 28 % of the
 * time, and four one-warpgroup work-groups an SM might fall into step. One K, one Vt and a
 * 128-row Q block fit 48 KB only at one 64-dim panel (SMEM_BYTES below). On request only
 * (FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8,WARPS=8,BLOCK_M=128): on an H100 (2026-12-06) it ran
 * 8-13 % slower than one warpgroup, (4,32,4096,64) 532-539 TFLOP/s against 600-608; the products
 * are a tile's short phase at D=64, so there is little to hide under the softmax
 * (docs/perf-notes-fp8.md, "FlashAttention-3's ping-pong at D <= 64"). */
#define PINGPONG (WARPS == 8)
#define K_STEPS ((HEAD_DIM + 31) / 32)  // k32 steps of S = Q K^T (bytes past HEAD_DIM are zero)
#define VT_PANELS ((HEAD_DIM + 63) / 64) // 64-dim groups of O = P V
#define VT_ROWS (64 * VT_PANELS)
#define S_FRAGS (BLOCK_N / 8)            // n8 blocks of S per 16 rows
#define P_STEPS (BLOCK_N / 32)           // k32 steps of O = P V
#define O_FRAGS (VT_ROWS / 8)            // n8 blocks of O per 16 rows
#define K_TILE_BYTES (BLOCK_N * 128)
#define VT_BYTES (VT_ROWS * 128)
#define Q_BYTES (BLOCK_M * 128)
/* OVERLAP=1 (HEAD_DIM <= 64, through FLASHCL_BUILD_OPTIONS; timed on the H200 at 445 TFLOP/s
 * against 553 as built at (4,32,4096,64), 2026-12-05, so off):
 * FlashAttention-3's overlap within a warpgroup. Tile t+1's S = Q K^T and
 * tile t's P V are issued together; the softmax of S(t+1) runs while P(t) V(t)
 * is still on the tensor cores, which the two-level sum allows (P V lands in
 * its own registers, and O is rescaled before it is added). Needs two Vt
 * buffers, which fit 48 KB only with one 64-dim panel; not with PV_CHAINED. */
#ifndef OVERLAP
#define OVERLAP 0
#endif
#ifndef PV_CHAINED
#define PV_CHAINED 0
#endif
#if PINGPONG && PV_CHAINED
#error "PV_CHAINED (a study) is built for the one-warpgroup loop"
#endif
#if OVERLAP && (VT_PANELS != 1 || PV_CHAINED || PINGPONG)
/* Above 64 dims, and with two warpgroups, the plain or PINGPONG loop, so that a test run under
 * -DOVERLAP=1 still builds every case. */
#undef OVERLAP
#define OVERLAP 0
#endif
/* EX2_FMA_EVERY=k (through FLASHCL_BUILD_OPTIONS): every k-th n8 block of scores takes its
 * exponents from ex2_fma (cl/common.cl, the FMA pipes) instead of the SFU, as FlashAttention-4
 * does. By count, a tile's 64 x 128 exponents take the SFU as long as its two products take the
 * FP8 tensor cores at head_dim 128, twice as long at 64; but the kernel runs well below both
 * rates, and k = 2 measured 547 TFLOP/s against 827 as built at (4,32,4096,128) (H200,
 * 2026-12-05): the polynomial costs more than the SFU time it frees, so off. */
#ifndef EX2_FMA_EVERY
#define EX2_FMA_EVERY 0
#endif
#if EX2_FMA_EVERY > 0
#undef EX2_SCORE
#define EX2_SCORE(x, j) ((j) % EX2_FMA_EVERY == EX2_FMA_EVERY - 1 ? ex2_fma(x) : ex2(x))
#endif
/* K_EARLY (default: with TMA, where an mbarrier, not the barrier below, says Vt
 * has landed): the next K tile's copy is issued as soon as every warp's S is
 * done with the K buffer, before the softmax, not after it. With one K buffer
 * (a second does not fit 48 KB) the copy otherwise has only P V's time to land
 * before the next tile's S waits for it. -DK_EARLY=0: after the softmax. */
#ifndef K_EARLY
#define K_EARLY USE_TMA
#endif
#if K_EARLY && !USE_TMA
#error "K_EARLY needs USE_TMA: without it, the barrier after the softmax also publishes Vt"
#endif
#define VT_BUFS (OVERLAP ? 2 : 1)
#define VT_AT K_TILE_BYTES
#define Q_AT (K_TILE_BYTES + VT_BUFS * VT_BYTES)
#define SMEM_BYTES (Q_AT + Q_BYTES + 1024)
#define P_SCALE_LOG2 8
#define P_SCALE ((float)(1 << P_SCALE_LOG2))
/* The softmax writes P_SCALE p (2^8 p) straight from its exponents, and l holds P_SCALE times
 * the sum (SOFTMAX_EXPS_BIASED, common_nv.cl): per score an fma and the exponent, where the
 * subtraction, the multiply by the scale and the one by P_SCALE had been three instructions.
 * 16-26 % fewer on a tile's path, yet level on the H200 (2026-12-05): ncu found the kernel
 * waiting on latency, not on issue (docs/perf-notes-fp8.md, "FP8 forward on warpgroup MMA"). */
#undef SOFTMAX_EXPS
#define SOFTMAX_EXPS(s, n_s, h, mr, sc, psum) SOFTMAX_EXPS_BIASED(s, n_s, h, mr, sc, psum, P_SCALE_LOG2)
/* -DSOFTMAX_CHAINS=4, a study: the row's max and sum in four chains (common_nv.cl). */

#ifndef FLASHCL_NV_PTX
#error "flash_fwd_sm90_fp8 is built with -DFLASHCL_NV_PTX (the PTX helpers in common_nv.cl)"
#endif
#if !Q_FP8 || Q_FP8 != KV_FP8
#error "flash_fwd_sm90_fp8 needs -DQ_FP8 and -DKV_FP8 of one format (3 e4m3, 4 e5m2)"
#endif
#if DTYPE != 1 && DTYPE != 2
#error "flash_fwd_sm90_fp8 writes DTYPE 1 (float16) or 2 (bfloat16)"
#endif
#if HEAD_DIM < 32 || HEAD_DIM > 128 || HEAD_DIM % 16
#error "flash_fwd_sm90_fp8 takes HEAD_DIM 32..128, a multiple of 16"
#endif
#if SMEM_BYTES > 48000
#error "the tiles exceed NVIDIA's ~47 KB of __local memory"
#endif

#if KV_FP8 == 4
#define FP8_PTX "e5m2"
#else
#define FP8_PTX "e4m3"
#endif

/* d[0..7][0..3] (+)= A (a[0..3], this warp's 16x32 bytes of the 64x32 A) times
 * the 32x64 B that desc describes (K-major), in atype x btype; scale_d 0: d's
 * old values are not read. 8-bit wgmma has no transpose operands. */
#define WGMMA_FP8(d, a, desc, scale_d, atype, btype)                                               \
    __asm__ __volatile__(SM90A "wgmma.mma_async.sync.aligned.m64n64k32.f32." atype "." btype      \
                               " " WG_N64_D ", " WG_N64_AB ", " #scale_d ", 1, 1;\n"               \
                         : WG_N64_OUT(d)                                                           \
                         : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "l"(desc)           \
                         : "memory")

/* S = Q K^T over the head dims into s[S_FRAGS][4], for the K tile at shared
 * address k_tile: keys 64h.. (rows 64h.., 8 KB in) into s[8h..8h+7]; k-step
 * kk is 32*kk bytes into the rows; the first overwrites s. */
#define S_CHAIN(s, k_tile)                                                                         \
    _Pragma("unroll") for (int kk = 0; kk < K_STEPS; ++kk)                                         \
        _Pragma("unroll") for (int hh = 0; hh < 2; ++hh) {                                         \
        const ulong db = sw128_desc((k_tile) + (uint)(hh * 64 * 128 + kk * 32));                   \
        if (kk == 0)                                                                               \
            WGMMA_FP8((s) + 8 * hh, qf[kk], db, 0, FP8_PTX, FP8_PTX);                              \
        else                                                                                       \
            WGMMA_FP8((s) + 8 * hh, qf[kk], db, 1, FP8_PTX, FP8_PTX);                              \
    }

/* PV_CHAINED=1, a study build only: O chained through the FP8 MMA's own
 * accumulator across tiles, as the first version of this kernel did, to
 * measure on the GPU what PV_TWO_LEVEL (below) costs and saves; it loses
 * precision over long rows, which test_fp8_forward's 32768-key case checks. */
#if PV_CHAINED
#define PV_FIRST_STEP(t, a, desc) WGMMA_FP8(t, a, desc, 1, "e4m3", FP8_PTX)
#else
#define PV_FIRST_STEP(t, a, desc) WGMMA_FP8(t, a, desc, 0, "e4m3", FP8_PTX)
#endif

/* t = P V for Vt at vt: k-step kk takes k positions 32kk.. (keys VT_KEY of
 * them), one wgmma per 64 head dims hh (Vt rows 64hh.., 8 KB in); the first
 * k-step overwrites t (PV_CHAINED: adds to it). */
#define PV_CHAIN(t, pf, vt)                                                                        \
    _Pragma("unroll") for (int kk = 0; kk < P_STEPS; ++kk)                                         \
        _Pragma("unroll") for (int hh = 0; hh < VT_PANELS; ++hh) {                                 \
        const ulong dv_ = sw128_desc((vt) + (uint)(hh * 64 * 128 + kk * 32));                      \
        if (kk == 0)                                                                               \
            PV_FIRST_STEP((t) + 8 * hh, (pf)[kk], dv_);                                            \
        else                                                                                       \
            WGMMA_FP8((t) + 8 * hh, (pf)[kk], dv_, 1, "e4m3", FP8_PTX);                            \
    }

/* O += P V in two levels: the tile's product into fresh registers, waited for,
 * then added to acc by the CUDA cores in float32. Hopper's FP8 MMA keeps 13
 * mantissa bits of the D it adds to (SageAttention2's measurement; DeepSeek-V3
 * reports 14-bit alignment of the products), truncating: O chained through
 * every tile's MMAs shrank by 2.2 % at 32768 keys and 8.4 % at 131072 in a
 * model of it, against 0.1 % in two levels (docs/perf-notes-fp8.md, "FP8 forward
 * on warpgroup MMA"). acc stays out of the tensor cores; the 4 k-steps of a
 * tile still chain, truncating relative to that tile's sum only. */
#define PV_TWO_LEVEL(acc, pf, vt) PV_TWO_LEVEL_SCALED(acc, pf, vt, 1.0f, 1.0f)
/* The same with O first rescaled by the softmax's alpha of each row (al0: row g, al1: g + 8),
 * O = alpha O + P V by one fma an element where the softmax's rescale and the add took two. */
#define PV_TWO_LEVEL_SCALED(acc, pf, vt, al0, al1) PV_TWO_LEVEL_SCALED_AFTER(acc, pf, vt, al0, al1, (void)0)
/* The same, with the statement `issued` run once the product is issued, before it is waited for. */
#define PV_TWO_LEVEL_SCALED_AFTER(acc, pf, vt, al0, al1, issued)                                   \
    do {                                                                                           \
        float t_[O_FRAGS][4];                                                                      \
        /* t_ is written, not read: PV_CHAIN's first k-step overwrites it */                       \
        PV_WAITED_AFTER(t_, pf, vt, issued);                                                       \
        _Pragma("unroll") for (int j_ = 0; j_ < O_FRAGS; ++j_) {                                   \
            (acc)[j_][0] = fma((acc)[j_][0], (al0), t_[j_][0]);                                    \
            (acc)[j_][1] = fma((acc)[j_][1], (al0), t_[j_][1]);                                    \
            (acc)[j_][2] = fma((acc)[j_][2], (al1), t_[j_][2]);                                    \
            (acc)[j_][3] = fma((acc)[j_][3], (al1), t_[j_][3]);                                    \
        }                                                                                          \
    } while (0)

/* The plain loop's softmax (on its acc, m_run, l_run and sc) and O += P V as this build sums
 * them: alpha applied in the add of the two-level sum, or (PV_CHAINED) to O before the MMA adds
 * to it. SOFTMAX_PHASED (default 1): the softmax's phases over both rows at once, so that every
 * exponent of the tile sits in one straight run with P's packing (ONLINE_SOFTMAX_16_P_BIASED,
 * common_nv.cl), 16 PRMT fewer a 128-key tile: 1.1-4.9 % faster than row by row (-DSOFTMAX_PHASED=0)
 * at every one of issue 35's cells on an H100 (2026-12-06, docs/perf-notes-fp8.md). */
#ifndef SOFTMAX_PHASED
#define SOFTMAX_PHASED 1
#endif
#if PV_CHAINED
#define SOFTMAX_TILE(s, alpha)                                                                     \
    do {                                                                                           \
        ONLINE_SOFTMAX_16(s, S_FRAGS, acc, O_FRAGS, m_run, l_run, sc);                             \
        (alpha)[0] = (alpha)[1] = 1.0f; /* applied already */                                      \
    } while (0)
#define PV_ADD_AFTER(acc, pf, vt, alpha, issued) PV_WAITED_AFTER(acc, pf, vt, issued)
#elif SOFTMAX_PHASED
#define SOFTMAX_TILE(s, alpha) ONLINE_SOFTMAX_16_P_BIASED(s, S_FRAGS, m_run, l_run, sc, alpha, P_SCALE_LOG2)
#else
#define SOFTMAX_TILE(s, alpha) ONLINE_SOFTMAX_16_P(s, S_FRAGS, m_run, l_run, sc, alpha)
#endif
#if !PV_CHAINED
#define PV_ADD_AFTER(acc, pf, vt, alpha, issued)                                                   \
    PV_TWO_LEVEL_SCALED_AFTER(acc, pf, vt, (alpha)[0], (alpha)[1], issued)
#endif
/* O += P V as this build sums it; PV_ADD_AFTER runs `issued` between the product's issue and its wait. */
#define PV_ADD(acc, pf, vt, alpha) PV_ADD_AFTER(acc, pf, vt, alpha, (void)0)

/* Q's A fragments qf from its block (which stays put: read before the K
 * tile's wait, the statement tile_wait), then S = Q K^T on them issued
 * (committed, not waited for: the caller's work may run under it). */
#define S_ISSUE(qf, s, k_tile, tile_wait)                                                          \
    do {                                                                                           \
        SW128_A_FRAGS(qf, s_base + Q_AT, BLOCK_M, K_STEPS);                                        \
        tile_wait;                                                                                 \
        WGMMA_FENCE();                                                                             \
        S_CHAIN(s, k_tile);                                                                        \
        WGMMA_COMMIT();                                                                            \
    } while (0)

/* Four floats rounded to e4m3 (nearest even, saturating) into one register,
 * x0 in its lowest byte (cvt puts its first source in the high byte). */
inline uint pack_e4m3x4(float x0, float x1, float x2, float x3) {
    uint r;
    __asm__("{\n.reg .b16 lo_, hi_;\n"
            "cvt.rn.satfinite.e4m3x2.f32 lo_, %2, %1;\n"
            "cvt.rn.satfinite.e4m3x2.f32 hi_, %4, %3;\n"
            "mov.b32 %0, {lo_, hi_};\n}"
            : "=r"(r)
            : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
    return r;
}

/* P (the softmax's s: P_SCALE p) into the A fragments of O = P V: k-step
 * kk's register 0 holds row g's columns 2t, 2t+1 of blocks 4kk and 4kk+1,
 * register 1 the same of row g+8, registers 2 and 3 those of blocks 4kk+2
 * and 4kk+3 (Vt's key order, VT_KEY). */
#define PACK_P(pf, s)                                                                              \
    _Pragma("unroll") for (int kk = 0; kk < P_STEPS; ++kk) _Pragma("unroll") for (int r_ = 0; r_ < 4; ++r_) { \
        const int j_ = 4 * kk + 2 * (r_ >> 1), e_ = 2 * (r_ & 1);                                  \
        (pf)[kk][r_] = pack_e4m3x4((s)[j_][e_], (s)[j_][e_ + 1], (s)[j_ + 1][e_], (s)[j_ + 1][e_ + 1]); \
    }

/* A tile of 128-byte rows (width bytes of each, zero past width and past
 * rows) by cp.async, shared by the nthreads work-items numbered tid = 0 ..
 * nthreads - 1: nv_copy_rows_to moves 16-bit pairs, so byte counts are
 * halved (width and the stride are even, rows 16-byte aligned). */
inline void copy_rows8_by(__local uchar *smem8, uint s_base, uint dst_bytes, __global const uchar *src,
                          ulong stride, int rows, int nrows, int width, int tid, int nthreads) {
    nv_copy_rows_to((__local ushort *)smem8, s_base, dst_bytes / 2u, (__global const ushort *)src, stride / 2,
                    rows, nrows, 1, tid, width / 2, 0, nthreads, 1);
}
/* The same by the whole work-group. */
inline void copy_rows8(__local uchar *smem8, uint s_base, uint dst_bytes, __global const uchar *src, ulong stride,
                       int rows, int nrows, int width, int tid) {
    copy_rows8_by(smem8, s_base, dst_bytes, src, stride, rows, nrows, width, tid, WG_SIZE);
}

/* Who copies the K and Vt tiles: the whole work-group, or under PINGPONG warpgroup 1 alone
 * (copy_tid its work-items' numbers from 0), and with TMA one work-item of them (TMA_TID). */
#define COPY_THREADS (PINGPONG ? 128 : WG_SIZE)
#define TMA_TID (PINGPONG ? 128 : 0)

/* ---- USE_TMA (common_nv.cl): K and Vt tiles by the Tensor Memory Accelerator ------------ */
#if USE_TMA
/* K's map (over k) and V's (over Vt, vtg below), with the work-groups' slots. */
#define FP8_TMA_ARGS TMA_ARGS(k, v)
/* One box of 128 bytes by rows (the map's box) at coordinates (c0, c1, h, b) into dst, counted on bar. */
inline void tma_rows(uint dst, __global const ulong *map, int c0, int c1, int h, int b, uint bar, uint bytes) {
    mbar_expect(bar, bytes);
    tma_box(dst, map, c0, c1, h, b, bar);
}
/* K: keys n.. (all head dims, one 128-byte panel); Vt: its tile of keys n.. (VT_ROWS rows). */
#define COPY_K(n)                                                                                  \
    do {                                                                                           \
        if (tid == TMA_TID)                                                                        \
            tma_rows(k_tile, k_map_at, 0, n, hk, b, k_bar, (uint)K_TILE_BYTES);                    \
    } while (0)
#define COPY_VT_TO(buf, n)                                                                         \
    do {                                                                                           \
        if (tid == TMA_TID)                                                                        \
            tma_rows(vt + (uint)(buf) * VT_BYTES, v_map_at, n, 0, hk, b, v_bar + 8u * (uint)(buf),  \
                     (uint)VT_BYTES);                                                              \
    } while (0)
#define COPIES_LANDED() do { } while (0)
#define TILE_WAIT(bar, tile) mbar_wait(bar, (uint)(tile)&1u)
#else
#define FP8_TMA_ARGS
#define COPY_K(n)                                                                                  \
    copy_rows8_by(smem8, s_base, 0, kb + (ulong)(n) * k_ss, k_ss, min(BLOCK_N, nk - (n)), BLOCK_N, HEAD_DIM, \
                  copy_tid, COPY_THREADS)
#define COPY_VT_TO(buf, n)                                                                         \
    copy_rows8_by(smem8, s_base, VT_AT + (buf) * VT_BYTES, vtb + (n), (ulong)vt_keys, VT_ROWS, VT_ROWS, 128, \
                  copy_tid, COPY_THREADS)
#define COPIES_LANDED() cp_wait_async_proxy()
#define TILE_WAIT(bar, tile) do { } while (0)
#endif
#define COPY_VT(n) COPY_VT_TO(0, n)

/* Scale (row blocks), soft-cap and mask of the scores s of keys n0.. */
#define SCORES_POST(s, n0)                                                                         \
    do {                                                                                           \
        if (row_blocks) {                                                                          \
            _Pragma("unroll") for (int j_ = 0; j_ < S_FRAGS; ++j_) {                                \
                const float kf_ = FP8_K_SCALE(k_base, min((n0) + 8 * j_, nk - 1));                 \
                s[j_][0] *= q_row_f[0] * kf_;                                                      \
                s[j_][1] *= q_row_f[0] * kf_;                                                      \
                s[j_][2] *= q_row_f[1] * kf_;                                                      \
                s[j_][3] *= q_row_f[1] * kf_;                                                      \
            }                                                                                      \
        }                                                                                          \
        if (softcap)                                                                               \
            SOFTCAP_16(s, S_FRAGS, q_mul_f, softcap_log2);                                         \
        if (!((n0) >= w_all_lo && (n0) + BLOCK_N - 1 <= w_all_hi))                                 \
            MASK_16(s, S_FRAGS, n0, row_lo, row_hi, (n0) < w_all_lo);                              \
    } while (0)

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
flash_fwd_sm90_fp8(FWD_ARGS FP8_TMA_ARGS FWD_FP8_ARGS, __global const uchar *restrict vtg, ulong vt_off,
                   int vt_keys) {
    __local ushort smem_raw[SMEM_BYTES / 2] __attribute__((aligned(1024)));

    NV_FWD_BLOCK;
    __global const uchar *qb = (__global const uchar *)q + (q_off + b * q_sb + hq * q_sh);
    __global const uchar *kb = (__global const uchar *)k + (k_off + b * k_sb + hk * k_sh);
    /* This head's Vt (cl/fp8_vt_pack.cl's layout, from byte vt_off: the context's transpose, or V
     * as the caller packed it, flashcl_attention_desc.v_packed). */
    vtg += vt_off;
    __global const uchar *vtb = vtg + ((ulong)(b * ((int)get_global_size(1) / group) + hk) * VT_ROWS) * (ulong)vt_keys;

    ALIGNED_TILES(smem_raw);
    __local uchar *smem8 = (__local uchar *)smem;
    const uint k_tile = s_base, vt = s_base + VT_AT;
#if USE_TMA
    /* Work-item TMA_TID places the maps (K's over k, V's over this call's Vt) and
     * sets up the two mbarriers, which the barrier after Q's copy publishes. */
    __local ulong tma_bars[1 + VT_BUFS]; /* K, then each Vt buffer's */
    const uint k_bar = shared_addr(&tma_bars[0]), v_bar = shared_addr(&tma_bars[1]);
    __global ulong *k_map_at = TMA_SLOT(), *v_map_at = k_map_at + 16;
    if (tid == TMA_TID) {
        tma_map_place(k_map_at, k_map, (__global const ushort *)((__global const uchar *)k + k_off));
        tma_map_place(v_map_at, v_map, (__global const ushort *)vtg);
        mbar_init(k_bar);
        for (int i = 0; i < VT_BUFS; ++i)
            mbar_init(v_bar + 8u * (uint)i);
        mbar_init_fence();
    }
#endif

    /* The descale factors: folded into the score scale where they are one a
     * head; with row blocks, per row (rows g, g+8 of this lane) and per 8 keys. */
    const int q_base = FP8_Q_BASE(b, hq), k_base = FP8_K_BASE(b, hk);
    const int row_blocks = sc_per_head && sc_rows > 0;
    const float q_mul_f = row_blocks ? q_mul : q_mul * FP8_Q_SCALE(q_base, 0) * FP8_K_SCALE(k_base, 0);

    /* Warpgroup warp / 4's 64 rows: the mask test is per warpgroup (wgmma is collective). */
    NV_WG_FWD_LOOP_STATE(m0 + 64 * (warp / 4), q_mul_f);
    float q_row_f[2] = {1.0f, 1.0f};
    if (row_blocks) {
        q_row_f[0] = FP8_Q_SCALE(q_base, min(w0 + g, nq - 1));
        q_row_f[1] = FP8_Q_SCALE(q_base, min(w0 + g + 8, nq - 1));
    }

#if !USE_TMA
    const int copy_tid = PINGPONG ? tid - 128 : tid; /* with COPY_THREADS: who copies K and Vt */
#endif

    /* Q's block (it stays in __local for the whole loop), published with the mbarriers. */
    copy_rows8(smem8, s_base, Q_AT, qb + (ulong)m0 * q_ss, q_ss, rows_q, BLOCK_M, HEAD_DIM, tid);
    cp_wait_async_proxy();
    barrier(CLK_LOCAL_MEM_FENCE);

#if PINGPONG
    /* Two warpgroups, A (0) and B (1), over one K and one Vt buffer, the
     * protocol of flash_fwd_sm90.cl's PINGPONG loop: they take turns on the
     * tensor cores in the order S_A, S_B, PV_A, PV_B of each tile, each
     * handing the turn over right after issuing its wgmma, so that one's
     * softmax runs under the other's product. B alone copies the tiles: K(n+1)
     * once both S of tile n have completed, Vt(n+1) once both P V have; B
     * hands a turn over only after the tile that turn reads has landed (with
     * TMA: the mbarriers say so to each reader instead).
     *   A: wait(TURN_A) S  arrive(TURN_B) ... arrive(K_FREE)  softmax
     *      wait(TURN_A) PV arrive(TURN_B) ... arrive(V_FREE)
     *   B: wait(TURN_B) S  [Vt(n) landed] arrive(TURN_A) ... wait(K_FREE) copy K(n+1)  softmax
     *      wait(TURN_B) PV [K(n+1) landed] arrive(TURN_A) ... wait(V_FREE) copy Vt(n+1)
     * Each barrier alternates between its arrivals and its waits, so a
     * warpgroup never arrives twice before the other has waited. Every wgmma
     * chain is in code both warpgroups run (ptxas serialises a chain in a
     * branch). */
    const int tiles = n_start <= n_end ? (n_end - n_start) / BLOCK_N + 1 : 0;
    const int producer = warp >= 4;
    const uint my_turn = producer ? PP_TURN_B : PP_TURN_A, their_turn = producer ? PP_TURN_A : PP_TURN_B;
    if (producer && tiles > 0) {
        COPY_K(n_start);
        COPY_VT(n_start);
#if !USE_TMA
        cp_wait_first_async_proxy(); /* K(0); Vt(0) may still fly */
#endif
        pp_arrive(PP_TURN_A);
    }
    for (int tile = 0; tile < tiles; ++tile) { /* not t: the lane's column, which MASK_16 reads */
        const int n0 = n_start + tile * BLOCK_N, n1 = n0 + BLOCK_N;
        const int more = tile + 1 < tiles;

        /* ---- S = Q K^T ---- */
        uint qf[K_STEPS][4];
        float s[S_FRAGS][4];
        pp_sync(my_turn);
        S_ISSUE(qf, s, k_tile, TILE_WAIT(k_bar, tile));
        if (producer)
            COPIES_LANDED(); /* Vt(n0) */
        pp_arrive(their_turn);
        WGMMA_WAIT_ALL();
        WG_FENCE_REGS(s, S_FRAGS);
        if (more)
            PP_REFILL(producer, PP_K_FREE, COPY_K(n1));

        SCORES_POST(s, n0);
        float alpha[2];
        SOFTMAX_TILE(s, alpha);
        uint pf[P_STEPS][4];
        PACK_P(pf, s);

        /* ---- O += P V ---- */
        /* The turn is taken once all of P is packed (pp_sync_after: ptxas would otherwise
         * wait for it in the middle of the softmax). */
        uint p_all = 0;
        _Pragma("unroll") for (int kk = 0; kk < P_STEPS; ++kk) p_all |= pf[kk][0] | pf[kk][1] | pf[kk][2] | pf[kk][3];
        pp_sync_after(my_turn, p_all);
        TILE_WAIT(v_bar, tile);
        PV_ADD_AFTER(acc, pf, vt, alpha, {
            if (!producer) {
                pp_arrive(their_turn);
            } else if (more) {
                COPIES_LANDED(); /* K(n1) */
                pp_arrive(their_turn);
            }
        });
        if (more)
            PP_REFILL(producer, PP_V_FREE, COPY_VT(n1));
    }
#elif !OVERLAP
    if (n_start <= n_end)
        COPY_K(n_start);
    /* One K and one Vt buffer: Vt(n0) lands while S is computed, K(n0+BN)
     * while the softmax (K_EARLY) and O += P V are. */
    for (int n0 = n_start, tile = 0; n0 <= n_end; n0 += BLOCK_N, ++tile) {
        const int n_next = n0 + BLOCK_N;
        /* K(n0) has landed (with TMA: is on its way); every warp is done with Vt(n0-BN). */
        COPIES_LANDED();
        barrier(CLK_LOCAL_MEM_FENCE);
        COPY_VT(n0);

        /* ---- S = Q K^T ---- */
        uint qf[K_STEPS][4];
        float s[S_FRAGS][4];
        S_ISSUE(qf, s, k_tile, TILE_WAIT(k_bar, tile));
        WGMMA_WAIT_ALL();
        WG_FENCE_REGS(s, S_FRAGS);
#if K_EARLY
        /* Every warp's S is done reading K(n0): K(n0 + BN) lands during the softmax too. */
        barrier(CLK_LOCAL_MEM_FENCE);
        if (n_next <= n_end)
            COPY_K(n_next);
#endif

        SCORES_POST(s, n0);
        float alpha[2];
        SOFTMAX_TILE(s, alpha);
        uint pf[P_STEPS][4];
        PACK_P(pf, s);

#if !K_EARLY
        /* Vt(n0) has landed (with TMA: is on its way); every warp is done reading K(n0). */
        COPIES_LANDED();
        barrier(CLK_LOCAL_MEM_FENCE);
        if (n_next <= n_end)
            COPY_K(n_next);
#endif

        /* ---- O += P V ---- */
        TILE_WAIT(v_bar, tile);
        PV_ADD(acc, pf, vt, alpha);
    }
#else
    if (n_start <= n_end)
        COPY_K(n_start);
    /* OVERLAP: one K buffer, Vt of tile t in buffer t % 2. Iteration t issues
     * S(t+1) and P(t) V(t) into pv, waits for S(t+1) only, computes its
     * softmax under P(t) V(t), then waits for that and sets O = alpha (O +
     * pv): O and pv both hold sums against tile t's running max, alpha moves
     * them to tile t+1's. Every wgmma chain sits outside branches (ptxas
     * serialises a chain in one); the last tile's P V follows the loop. */
    const int tiles = n_start <= n_end ? (n_end - n_start) / BLOCK_N + 1 : 0;
    float s[S_FRAGS][4], pv[O_FRAGS][4];
    uint qf[K_STEPS][4], pf[P_STEPS][4];
    if (tiles > 0) {
        COPY_VT_TO(0, n_start);
        COPIES_LANDED(); /* K(0) (with TMA: nothing; the waits below) */
        barrier(CLK_LOCAL_MEM_FENCE);
        S_ISSUE(qf, s, k_tile, TILE_WAIT(k_bar, 0));
        WGMMA_WAIT_ALL();
        WG_FENCE_REGS(s, S_FRAGS);
        barrier(CLK_LOCAL_MEM_FENCE); /* every warp is done reading K(0) */
        if (tiles > 1)
            COPY_K(n_start + BLOCK_N);
        SCORES_POST(s, n_start);
        ONLINE_SOFTMAX_16(s, S_FRAGS, acc, O_FRAGS, m_run, l_run, sc);
        PACK_P(pf, s);
    }
    for (int tile = 0; tile + 1 < tiles; ++tile) { /* not t: the lane's column, which MASK_16 reads */
        const int n1 = n_start + (tile + 1) * BLOCK_N; /* the next tile */
        const int cur = tile & 1;
        /* K(t+1) and Vt(t) have landed (with TMA: are on their way); every warp
         * is done with Vt(t-1), whose buffer Vt(t+1) takes. */
        COPIES_LANDED();
        barrier(CLK_LOCAL_MEM_FENCE);
        COPY_VT_TO(cur ^ 1, n1);
        TILE_WAIT(k_bar, tile + 1);
        TILE_WAIT(v_bar + 8u * (uint)cur, tile >> 1);
        SW128_A_FRAGS(qf, s_base + Q_AT, BLOCK_M, K_STEPS);
        WG_FENCE_REGS_C(pf, P_STEPS, "r");
        WGMMA_FENCE();
        S_CHAIN(s, k_tile);
        WGMMA_COMMIT();
        PV_CHAIN(pv, pf, vt + (uint)cur * VT_BYTES);
        WGMMA_COMMIT();
        WGMMA_WAIT_ONE(); /* S(t+1); P(t) V(t) may still run */
        WG_FENCE_REGS(s, S_FRAGS);
        barrier(CLK_LOCAL_MEM_FENCE); /* every warp is done reading K(t+1) */
        if (tile + 2 < tiles)
            COPY_K(n1 + BLOCK_N);
        SCORES_POST(s, n1);
        float alpha[2];
        ONLINE_SOFTMAX_16_P(s, S_FRAGS, m_run, l_run, sc, alpha);
        WGMMA_WAIT_ALL(); /* P(t) V(t) */
        WG_FENCE_REGS(pv, O_FRAGS);
#pragma unroll
        for (int j = 0; j < O_FRAGS; ++j) {
            acc[j][0] = alpha[0] * (acc[j][0] + pv[j][0]);
            acc[j][1] = alpha[0] * (acc[j][1] + pv[j][1]);
            acc[j][2] = alpha[1] * (acc[j][2] + pv[j][2]);
            acc[j][3] = alpha[1] * (acc[j][3] + pv[j][3]);
        }
        PACK_P(pf, s);
    }
    if (tiles > 0) {
        const int cur = (tiles - 1) & 1;
        COPIES_LANDED(); /* Vt(tiles - 1) */
        barrier(CLK_LOCAL_MEM_FENCE);
        TILE_WAIT(v_bar + 8u * (uint)cur, (tiles - 1) >> 1);
        PV_TWO_LEVEL(acc, pf, vt + (uint)cur * VT_BYTES);
    }
#endif

    /* ---- epilogue: O * v's descale / (P_SCALE l), and LSE (l: P_SCALE times the sum) ---- */
    const float o_f = FP8_V_SCALE(b, hk) / P_SCALE;
    l_run[0] *= 1.0f / P_SCALE, l_run[1] *= 1.0f / P_SCALE;
#pragma unroll
    for (int j = 0; j < O_FRAGS; ++j)
        acc[j][0] *= o_f, acc[j][1] *= o_f, acc[j][2] *= o_f, acc[j][3] *= o_f;
    __global ushort *ob = (__global ushort *)o + (o_off + b * o_sb + hq * o_sh);
    const int o_pair = ((ulong)ob % 4 == 0) && (o_ss % 2 == 0);
    NV_FWD_STORE_FRAG(acc, O_FRAGS, m_run, l_run, sc, w0, ushort, ob, o_pair, NV_STORE_PAIR16, NV_STORE_ONE16);
}

#ifdef FP8_PROBE
/* fp8_wgmma_probe: this file's two products alone, on small integers so that every sum is
 * exact (tests/test_wgmma_layout.c compares with ==), to tell which half of the kernel reads its
 * operands wrong should it ever do so. Row-major inputs with 16-byte rows, nk keys (<= BLOCK_N;
 * the rest zero, as past the end of a sequence):
 *   mode 0: out[64][BLOCK_N] = S = Q K^T, q [64][HEAD_DIM] and k [nk][HEAD_DIM] bytes, through
 *           copy_rows8, SW128_A_FRAGS and S_CHAIN;
 *   mode 1: out[64][VT_ROWS] = P V, p [64][BLOCK_N] floats taken as the accumulator layout gives
 *           them (p = value / P_SCALE carries the value exactly), v one tile of Vt as
 *           fp8_vt_pack (cl/fp8_vt_pack.cl) writes it (VT_ROWS rows of BLOCK_N bytes; the test runs that pass on
 *           v [nk][HEAD_DIM] first), through copy_rows8, PACK_P and PV_ADD.
 * Outputs in the accumulator layout's places: row 16 warp + g (+8), column 8j + 2t (+1). */
__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
fp8_wgmma_probe(__global const uchar *q, __global const uchar *k, __global const uchar *v, __global const float *p,
                __global float *out, int mode, int nk) {
    __local ushort smem_raw[SMEM_BYTES / 2] __attribute__((aligned(1024)));
    const int tid = (int)get_local_id(0), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    ALIGNED_TILES(smem_raw);
    __local uchar *smem8 = (__local uchar *)smem;
    const int row0 = 16 * warp + g;
    if (mode == 0) {
        copy_rows8(smem8, s_base, Q_AT, q, HEAD_DIM, BLOCK_M, BLOCK_M, HEAD_DIM, tid);
        copy_rows8(smem8, s_base, 0, k, HEAD_DIM, nk, BLOCK_N, HEAD_DIM, tid);
        cp_wait_async_proxy();
        barrier(CLK_LOCAL_MEM_FENCE);
        uint qf[K_STEPS][4];
        float s[S_FRAGS][4];
        S_ISSUE(qf, s, s_base, (void)0);
        WGMMA_WAIT_ALL();
        WG_FENCE_REGS(s, S_FRAGS);
#pragma unroll
        for (int j = 0; j < S_FRAGS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                out[(row0 + 8 * (e >> 1)) * BLOCK_N + 8 * j + 2 * t + (e & 1)] = s[j][e];
    } else {
        copy_rows8(smem8, s_base, VT_AT, v, BLOCK_N, VT_ROWS, VT_ROWS, BLOCK_N, tid);
        cp_wait_async_proxy();
        barrier(CLK_LOCAL_MEM_FENCE);
        float s[S_FRAGS][4], acc[O_FRAGS][4];
#pragma unroll
        for (int j = 0; j < S_FRAGS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[j][e] = P_SCALE * p[(row0 + 8 * (e >> 1)) * BLOCK_N + 8 * j + 2 * t + (e & 1)];
#pragma unroll
        for (int j = 0; j < O_FRAGS; ++j)
            acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        uint pf[P_STEPS][4];
        PACK_P(pf, s);
        const float one[2] = {1.0f, 1.0f};
        PV_ADD(acc, pf, s_base + VT_AT, one);
#pragma unroll
        for (int j = 0; j < O_FRAGS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                out[(row0 + 8 * (e >> 1)) * VT_ROWS + 8 * j + 2 * t + (e & 1)] = acc[j][e];
    }
}
#endif
