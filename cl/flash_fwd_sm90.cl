/* flash_fwd_sm90.cl: FlashAttention forward on Hopper's warpgroup MMA (wgmma, sm_90a).
 *
 * Same arguments and semantics as flash_fwd.cl; the host selects this file for
 * float16/bfloat16 with HEAD_DIM <= 128 on compute capability 9.0.
 *
 * How it reaches the hardware. NVIDIA's OpenCL compiles for ".target sm_90",
 * where ptxas rejects wgmma, but it accepts PTX for sm_90a back through
 * clCreateProgramWithBinary. So every sm_90a instruction here is written as
 * inline asm whose lines start with the marker SM90A, a PTX comment: the
 * source builds as usual (the compiler fills in the registers of each
 * operand), and src/program.c then deletes the markers from the program's
 * PTX, retargets it to sm_90a and builds that. Built any other way (or if
 * the rebuild fails) the kernel would compute nothing, which is why the host
 * only ever runs the rebuilt program and otherwise falls back to
 * flash_fwd_nv.cl.
 *
 * Work decomposition. A work-group of WARPS warps (WARPS/4 warpgroups) owns
 * BLOCK_M = 16*WARPS query rows of one (batch, query head); warpgroup i owns
 * rows 64i..64i+63 and computes, per key tile of BLOCK_N (48 or 64) keys,
 *   S  = Q K^T  : wgmma m64nBLOCK_Nk16, Q (A) from registers, K (B) from __local;
 *   O += P V    : wgmma m64n64k16, P (A) from the S registers, V (B) from
 *                 __local read N-major (the transpose bit), one per 64 dims.
 * All warpgroups share each K/V tile, so a tile is loaded once per BLOCK_M rows.
 * A warp's part of a warpgroup accumulator is exactly a 16-row mma.sync
 * fragment (warp w%4 holds rows 16(w%4)..+15, lane (g, t) columns 8j+2t,
 * 8j+2t+1 of rows g and g+8 in registers 4j..4j+3), so the softmax code,
 * the P packing and the epilogue are those of flash_fwd_nv.cl.
 *
 * __local (1024-byte aligned: the swizzle works on address bits 4-9):
 *   +-----------+-----------+
 *   |     K     |     V     |   BLOCK_N rows each, in the SW128_OFFSET layout (common_nv.cl)
 *   +-----------+-----------+
 *   |  Q block (BLOCK_M rows) |   read before the loop only; where it fits, a block of
 *   +-----------------------+    its own, read every tile (Q_PER_TILE, below)
 * One K and one V buffer, as flash_fwd_nv.cl's one-stage scheme: V(n0)
 * lands while S is computed, K(n0+BN) while O += P V is. (Built with
 * OVERLAP=1, an experiment: one K and two V buffers (at D > 64 of two
 * warpgroups' 48-key tiles, where nothing else fits), the softmax overlapped with
 * the previous tile's P V; see OVERLAP below.) Two stages of K and V, which
 * fit only with the 8 KB tiles of HEAD_DIM <= 64, measured no faster there
 * than one (BENCHMARKS.md). With two warpgroups (WARPS=8, on request: the
 * host's table runs one) the loop is PINGPONG's: the warpgroups take turns
 * on the tensor cores instead of computing their softmax at the same time,
 * and warpgroup 1 alone copies the tiles, through named barriers rather
 * than barrier().
 * wgmma reads B through a matrix descriptor: 128-byte swizzle, 8-row groups
 * 1024 bytes apart. K is K-major (dims contiguous): k-step kk starts
 * 32*(kk%4) bytes into panel kk/4. V is N-major (dims contiguous, keys
 * strided): k-step kk starts at its 16 keys, dims 64h..64h+63 in panel h.
 * Q's A fragments come out of the same layout through ldmatrix.
 *
 * Where the host can encode tensor maps (USE_TMA, below) the K and V tiles
 * of the PINGPONG and plain loops arrive by TMA instead of cp.async: the
 * PINGPONG loop ran 1.26-1.41x faster on the H200 (BENCHMARKS.md). The
 * OVERLAP experiment still uses cp.async.
 *
 * Ordering. cp.async writes __local through the generic proxy and wgmma
 * reads it through the async proxy, so each thread's copies are waited for
 * and fenced (fence.proxy.async) before the barrier that publishes a tile.
 * wgmma runs asynchronously: its accumulators are read only after
 * wgmma.wait_group, and each register is then passed through an empty asm
 * (WG_FENCE_REGS) so the compiler cannot move a use above the wait; a
 * buffer is refilled only after every warpgroup has waited for the wgmma
 * that read it (the barrier after the wait).
 *
 * Softmax, masking, soft-cap, rows without keys, LSE: as flash_fwd_nv.cl.
 */

/* RESCALE_SKIP (ONLINE_SOFTMAX_16, common_nv.cl): 1 leaves O alone in tiles where no row's
 * max moved; off here until timed (on in the decode kernel). */
#ifndef RESCALE_SKIP
#define RESCALE_SKIP 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef WARPS
#define WARPS 8 // warps per work-group, a multiple of 4 (warpgroups)
#endif
#ifndef BLOCK_M
#define BLOCK_M (16 * WARPS)
#endif
#ifndef BLOCK_N
#define BLOCK_N 64
#endif
#define WG_SIZE (WARPS * 32)
#define HEAD_DIM_PAD (((HEAD_DIM) + 63) / 64 * 64) // 128-byte panels of 64 halves
#define PANELS (HEAD_DIM_PAD / 64)
#define K_STEPS (HEAD_DIM_PAD / 16) // k16 steps of S = Q K^T
#define S_FRAGS (BLOCK_N / 8)       // n8 blocks of S per 16 rows
#define P_STEPS (BLOCK_N / 16)      // k16 steps of O = P V
#define O_FRAGS (HEAD_DIM_PAD / 8)  // n8 blocks of O per 16 rows
#define TILE_BYTES (BLOCK_N * HEAD_DIM_PAD * 2)
#define Q_BYTES (BLOCK_M * HEAD_DIM_PAD * 2)
#ifndef OVERLAP
#define OVERLAP 0 /* 1: softmax overlapped with the previous tile's P V (below); off until timed */
#endif
/* Q keeps a __local block of its own, reloaded every tile, where it fits
 * beside one K and one V tile above one panel; at one panel Q stays in
 * registers (Q_KEEP, below). */
#ifndef Q_PER_TILE /* overridable for study builds (issue 36) */
#define Q_PER_TILE (PANELS != 1 && 2 * TILE_BYTES + Q_BYTES + 1024 <= 48000)
#endif
#if OVERLAP && 3 * TILE_BYTES + (Q_PER_TILE ? Q_BYTES : 0) + 1024 > 48000
/* Three tiles do not fit beside Q's own block (one warpgroup of 48-key
 * tiles above D=64), or at all (64 keys at D=128): the plain loop, so that
 * a test run under -DOVERLAP=1 still builds those cases and the host's
 * rules (src/params_forward.c: its __local estimate, the register cap) hold; a
 * timing of OVERLAP above D=64 must ask for two warpgroups of 48 keys. */
#undef OVERLAP
#define OVERLAP 0
#endif
#ifndef PINGPONG
/* Two warpgroups take turns on the tensor cores (the loop below). H200, f16
 * TFLOP/s with it / without: (4,32,4096,128) 331 / 315, (1,32,16384,128)
 * 336 / 329, (4,32,4096,64) 317 / 299. With a causal mask two warpgroups so
 * ordered measured 235 at (4,32,4096,128), below one warpgroup's 288. Once
 * the tiles came by TMA, one warpgroup of 64 keys beat it with a mask and
 * without (547 against 463 at (4,32,4096,128)), so the host's table runs one
 * (src/params_forward.c). */
#define PINGPONG (WARPS == 8)
#endif
#if PINGPONG && (WARPS != 8 || OVERLAP)
#undef PINGPONG
#define PINGPONG 0
#endif
#define KV_BYTES ((OVERLAP ? 3 : 2) * TILE_BYTES)
/* Where Q's block fits beside K and V above one panel (Q_PER_TILE: one
 * warpgroup with 48-key tiles) it keeps it, and each warp reloads its A
 * fragments from it before every tile's S = Q K^T; elsewhere K and V
 * overwrite Q once its fragments are in registers. Above HEAD_DIM 64 the
 * reload frees Q's 32 registers outside the S chain: one warpgroup then
 * fits 168 registers without spilling, three groups an SM, which the host
 * asks for (flashcl_nv_wgmma_max_registers, src/params_forward.c). At
 * HEAD_DIM <= 64 (one 128-byte panel) the reload was first a fix: fragments
 * loaded once gave wrong scores from the second tile on on the H200 (exact
 * with K of those tiles zero, wrong with Q zero, so the A registers no
 * longer held Q), whatever pinned or copied them. Q_KEEP (below) found and
 * mended the cause; with it, Q held in registers at one panel was 0.5-4.2 %
 * faster than the reload (medians of three alternated rounds, H100,
 * 2026-12-05, docs/perf-notes.md), so the reload stays above one panel only.
 * tests/test_nv_kernels.sh checks every build's SASS for the fault
 * (scripts/wgmma_a_regs.py). (Q kept in __local for an SS wgmma, 32
 * registers fewer, gave wrong results at D=128 too.) */
/* Q_KEEP (issue 36): where Q's fragments stay in registers for the whole
 * loop, one more use of them after it (WG_KEEP_A: a store that never runs).
 * Their only uses in the loop are wgmma A operands, and ptxas (13.0, sm_90a,
 * on clang's PTX) then treats them as dead once the tile's S = Q K^T has
 * waited: at HEAD_DIM <= 64 with 64-key tiles it packs P into Q's registers,
 * so the next tile's S = P K^T, the fault described above; at 128 its SASS
 * keeps them, but with the second panel's P V taken out it packs P into them
 * too, so nothing there is known to protect them. A use past the loop makes
 * them live around its back edge. Empty asm (pinning) and "+r" constraints
 * leave the PTX, and so ptxas's choice, as they were. On by default at one
 * panel, where Q_PER_TILE is off; -DQ_KEEP=1 adds it at two panels, which
 * changes their SASS and was level on an H100 (2026-12-05). */
#ifndef Q_KEEP
#define Q_KEEP (!Q_PER_TILE && PANELS == 1)
#endif
#if Q_PER_TILE
#define Q_AT KV_BYTES
#define SMEM_USED (KV_BYTES + Q_BYTES)
#else
#define Q_AT 0
#define SMEM_USED (Q_BYTES > KV_BYTES ? Q_BYTES : KV_BYTES)
#endif
/* + 1024: room to align the tiles when the compiler does not honour aligned(1024) */
#define SMEM_BYTES (SMEM_USED + 1024)

#if WARPS % 4 != 0 || WARPS < 4
#error "WARPS must be a multiple of 4 (whole warpgroups)"
#endif
#if BLOCK_M != 16 * WARPS
#error "BLOCK_M must be 16*WARPS (64 rows per warpgroup)"
#endif
/* Validated on the H200 (test_forward wgmma): head dims 32..128 (padded to
 * 64 or 128) with 48- or 64-key tiles; the host does not ask for less. */
#if HEAD_DIM < 32 || HEAD_DIM > 128 || (BLOCK_N != 64 && BLOCK_N != 48)
#error "flash_fwd_sm90 takes 32 <= HEAD_DIM <= 128 and BLOCK_N 48 or 64"
#endif
#if SMEM_BYTES > 48000
#error "K and V tiles (the Q block, or at HEAD_DIM <= 64 both) exceed NVIDIA's ~47 KB of __local memory"
#endif
#ifndef FLASHCL_NV_PTX
#error "flash_fwd_sm90 is built with -DFLASHCL_NV_PTX (the PTX helpers in common_nv.cl)"
#endif
#if DTYPE != 1 && DTYPE != 2
#error "flash_fwd_sm90 needs DTYPE 1 (float16) or 2 (bfloat16)"
#endif

/* S = Q K^T for one k-step: m64nBLOCK_Nk16 into s[S_FRAGS][4], B = K (K-major). */
#if BLOCK_N == 64
#define WGMMA_S(d, a, db, scale_d) WGMMA_RS(WG_N64, d, a, db, scale_d, 0)
#else
#define WGMMA_S(d, a, db, scale_d) WGMMA_RS(WG_N48, d, a, db, scale_d, 0)
#endif

/* S = Q K^T over the head dims into s, for the K tile at shared address k_tile:
 * k-step kk (dims 16kk..) starts 32*(kk%4) bytes into panel kk/4; the first
 * overwrites s. */
#define S_CHAIN(s, k_tile)                                                                         \
    _Pragma("unroll") for (int kk = 0; kk < K_STEPS; ++kk) {                                       \
        const uint k_at = (uint)((kk / 4) * BLOCK_N * 128 + (kk % 4) * 32);                        \
        const ulong db = sw128_desc((k_tile) + k_at);                                              \
        if (kk == 0)                                                                               \
            WGMMA_S(s, qf[kk], db, 0);                                                             \
        else                                                                                       \
            WGMMA_S(s, qf[kk], db, 1);                                                             \
    }

/* O += P V for the V tile at v_tile: k-step kk takes keys 16kk.., one wgmma
 * per 64-dim panel hh. */
#define PV_CHAIN(acc, pf, v_tile)                                                                  \
    _Pragma("unroll") for (int kk = 0; kk < P_STEPS; ++kk)                                         \
        _Pragma("unroll") for (int hh = 0; hh < PANELS; ++hh)                                      \
            WGMMA_RS(WG_N64, (acc) + 8 * hh, (pf)[kk],                                             \
                     sw128_desc((v_tile) + (uint)(hh * BLOCK_N * 128 + kk * 16 * 128)), 1, 1)

/* P (the softmax's s) packed into the A fragments of the P V product. */
#define PACK_P(pf, s)                                                                              \
    _Pragma("unroll") for (int kk = 0; kk < P_STEPS; ++kk) {                                       \
        (pf)[kk][0] = pack2((s)[2 * kk][0], (s)[2 * kk][1]);                                       \
        (pf)[kk][1] = pack2((s)[2 * kk][2], (s)[2 * kk][3]);                                       \
        (pf)[kk][2] = pack2((s)[2 * kk + 1][0], (s)[2 * kk + 1][1]);                               \
        (pf)[kk][3] = pack2((s)[2 * kk + 1][2], (s)[2 * kk + 1][3]);                               \
    }

/* Soft-cap, then the mask of keys n0.. unless every row sees the whole tile. */
#define SCORES_POST(s, n0)                                                                         \
    do {                                                                                           \
        if (softcap)                                                                               \
            SOFTCAP_16(s, S_FRAGS, q_mul, softcap_log2);                                           \
        if (!((n0) >= w_all_lo && (n0) + BLOCK_N - 1 <= w_all_hi))                                 \
            MASK_16(s, S_FRAGS, n0, row_lo, row_hi, (n0) < w_all_lo);                              \
    } while (0)

/* This warp's A fragments of Q (rows 16*warp.., from the block at Q_AT). */
#define LOAD_Q_FRAGS(qf) SW128_A_FRAGS(qf, s_base + Q_AT, BLOCK_M, K_STEPS)
#if Q_PER_TILE
#define RELOAD_Q_FRAGS(qf) LOAD_Q_FRAGS(qf)
#else
#define RELOAD_Q_FRAGS(qf) do { } while (0)
#endif

/* A tile in the SW128 layout, copied by the nthreads work-items numbered tid
 * = 0 .. nthreads - 1 (copy_tile: the whole group). */
inline void copy_tile_by(__local ushort *smem, uint s_base, uint dst_bytes, __global const ushort *src,
                         ulong stride, int rows, int nrows, int vec, int tid, int nthreads) {
    nv_copy_rows_to(smem, s_base, dst_bytes / 2u, src, stride, rows, nrows, vec, tid, HEAD_DIM, 0,
                    nthreads, 1);
}

inline void copy_tile(__local ushort *smem, uint s_base, uint dst_bytes, __global const ushort *src,
                      ulong stride, int rows, int nrows, int vec, int tid) {
    copy_tile_by(smem, s_base, dst_bytes, src, stride, rows, nrows, vec, tid, WG_SIZE);
}

/* ---- USE_TMA (common_nv.cl): K and V tiles by the Tensor Memory Accelerator ------------- */
#if USE_TMA
#define FWD_TMA_ARGS TMA_ARGS(k, v)
/* Keys n.. of (batch b, kv head hk) through the map at map into the tile at
 * shared address dst, one box per 64-dim panel, counted on bar. */
inline void tma_tile(uint dst, __global const ulong *map, int n, int hk, int b, uint bar) {
    mbar_expect(bar, (uint)TILE_BYTES);
#pragma unroll
    for (int h = 0; h < PANELS; ++h)
        tma_box(dst + (uint)(h * BLOCK_N * 128), map, 64 * h, n, hk, b, bar);
}
/* One work-item issues every copy: in PINGPONG the copying warpgroup's first. */
#define TMA_TID (PINGPONG ? 128 : 0)
/* Keys n.. of x (k or v) into the buffer dst bytes into the tiles. */
#define TMA_COPY(dst, x, n)                                                                        \
    do {                                                                                           \
        if (tid == TMA_TID)                                                                        \
            tma_tile(s_base + (dst), x##_map_at, n, hk, b, x##_bar);                               \
    } while (0)
#if OVERLAP
#error "USE_TMA is built for the plain and PINGPONG loops, not OVERLAP's"
#endif
#else
#define FWD_TMA_ARGS
#endif
/* For both loops below: COPIES_LANDED: the calling work-item's copies have
 * landed and are visible to wgmma (cp.async; with TMA nothing to do);
 * TILE_WAIT: with TMA, every work-item waits until the tile-th tile through
 * the mbarrier at bar has landed, before its wgmma reads it. */
#if USE_TMA
#define COPIES_LANDED() do { } while (0)
#define TILE_WAIT(bar, tile) mbar_wait(bar, (uint)(tile)&1u)
#else
#define COPIES_LANDED() cp_wait_async_proxy()
#define TILE_WAIT(bar, tile) do { } while (0)
#endif

/* ---- the kernel ----------------------------------------------------------------------- */

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void flash_fwd_sm90(FWD_ARGS FWD_TMA_ARGS) {
    __local ushort smem_raw[SMEM_BYTES / 2] __attribute__((aligned(1024)));

    NV_FWD_BLOCK;
    const int wgrp = warp / 4; /* warpgroup */

    NV_FWD_HEADS(ushort);

    ALIGNED_TILES(smem_raw);
#if USE_TMA
    /* The copying work-item (TMA_TID) places the maps and sets up the two
     * mbarriers, which the barrier after Q's copy publishes. */
    __local ulong tma_bars[2]; /* K, V */
    /* K's map, then V's, in the work-group's slot */
    const uint k_bar = shared_addr(&tma_bars[0]), v_bar = shared_addr(&tma_bars[1]);
    __global ulong *k_map_at = TMA_SLOT(), *v_map_at = k_map_at + 16;
    if (tid == TMA_TID) {
        tma_map_place(k_map_at, k_map, (__global const ushort *)k + k_off);
        tma_map_place(v_map_at, v_map, (__global const ushort *)v + v_off);
        mbar_init(k_bar);
        mbar_init(v_bar);
        mbar_init_fence();
    }
#endif

    /* Q block -> __local -> A fragments (again before every tile where
     * Q_PER_TILE). Rows past nq are zero. */
    copy_tile(smem, s_base, Q_AT, qb + (ulong)m0 * q_ss, q_ss, rows_q, BLOCK_M, q_vec, tid);
    cp_wait();
    barrier(CLK_LOCAL_MEM_FENCE);
    uint qf[K_STEPS][4];
    LOAD_Q_FRAGS(qf);
#if !Q_PER_TILE
    /* Every warp has its Q before K overwrites the same bytes. */
    barrier(CLK_LOCAL_MEM_FENCE);
#endif

    NV_WG_FWD_LOOP_STATE(m0 + wgrp * 64, q_mul);
#if !PINGPONG && USE_TMA
    if (n_start <= n_end) {
        if (tid == TMA_TID) /* every warp's reads of Q, which K may overwrite, come before the copy */
            tma_fence_shared();
        TMA_COPY(0, k, n_start);
    }
#elif !PINGPONG
    if (n_start <= n_end)
        copy_tile(smem, s_base, 0, kb + (ulong)n_start * k_ss, k_ss, min(BLOCK_N, nk - n_start),
                  BLOCK_N, k_vec, tid);
#endif

#if PINGPONG
    /* Two warpgroups, A (0) and B (1), take turns on the tensor cores in the
     * order S_A, S_B, PV_A, PV_B of each tile, so that each one's softmax runs
     * while the other's product does; in the plain loop both compute their
     * softmax at once, between barriers, with the tensor cores idle. Each
     * hands the turn over right after issuing its wgmma, so the next product
     * is queued behind it. B alone copies the tiles (one K and one V buffer,
     * as the plain loop): K(n+1) once both S of tile n have completed, V(n+1)
     * once both P V have, and B hands over a turn only after the tile that
     * turn reads has landed. The barriers sit in branches; every wgmma chain
     * is in code both warpgroups run (a branch around one makes ptxas
     * serialise it).
     *   A: wait(TURN_A) S  arrive(TURN_B) ... arrive(K_FREE)  softmax
     *      wait(TURN_A) PV arrive(TURN_B) ... arrive(V_FREE)
     *   B: wait(TURN_B) S  [V(n) landed] arrive(TURN_A) ... wait(K_FREE) copy K(n+1)  softmax
     *      wait(TURN_B) PV [K(n+1) landed] arrive(TURN_A) ... wait(V_FREE) copy V(n+1)
     * Each barrier alternates between its arrivals and its waits, so a
     * warpgroup can never arrive twice before the other has waited. */
    const int tiles = n_start <= n_end ? (n_end - n_start) / BLOCK_N + 1 : 0;
    const int producer = wgrp == 1;
    const int ptid = tid - 128;
    const uint my_turn = producer ? PP_TURN_B : PP_TURN_A, their_turn = producer ? PP_TURN_A : PP_TURN_B;
    const uint k_tile = s_base, v_tile = k_tile + TILE_BYTES;
/* B's copy of the tile of keys n.. of x (k or v) into the buffer at dst bytes. */
#if USE_TMA
#define PP_COPY(dst, x, n) TMA_COPY(dst, x, n)
#else
#define PP_COPY(dst, x, n)                                                                         \
    copy_tile_by(smem, s_base, dst, x##b + (ulong)(n) * x##_ss, x##_ss, min(BLOCK_N, nk - (n)),    \
                 BLOCK_N, x##_vec, ptid, 128)
#endif
    if (producer && tiles > 0) {
#if USE_TMA
        /* Every warp's reads of Q, which K and V may overwrite, come before the copies. */
        tma_fence_shared();
        PP_COPY(0, k, n_start);
        PP_COPY(TILE_BYTES, v, n_start);
#else
        PP_COPY(0, k, n_start);
        PP_COPY(TILE_BYTES, v, n_start);
        cp_wait_first_async_proxy(); /* K(0); V(0) may still fly */
#endif
        pp_arrive(PP_TURN_A);
    }
    for (int tile = 0; tile < tiles; ++tile) { /* not t: the lane's column, which MASK_16 reads */
        const int n0 = n_start + tile * BLOCK_N, n1 = n0 + BLOCK_N;
        const int more = tile + 1 < tiles;
        float s[S_FRAGS][4];

        /* ---- S = Q K^T ---- */
        pp_sync(my_turn);
        RELOAD_Q_FRAGS(qf);
        TILE_WAIT(k_bar, tile);
        WGMMA_FENCE();
        S_CHAIN(s, k_tile);
        WGMMA_COMMIT();
        if (producer)
            COPIES_LANDED(); /* V(n0) */
        pp_arrive(their_turn);
        WGMMA_WAIT_ALL();
        WG_FENCE_REGS(s, S_FRAGS);
        if (more)
            PP_REFILL(producer, PP_K_FREE, PP_COPY(0, k, n1));
        SCORES_POST(s, n0);
        ONLINE_SOFTMAX_16(s, S_FRAGS, acc, O_FRAGS, m_run, l_run, sc);
        uint pf[P_STEPS][4];
        PACK_P(pf, s);

        /* ---- O += P V ---- */
        pp_sync(my_turn);
        TILE_WAIT(v_bar, tile);
        WG_FENCE_REGS(acc, O_FRAGS);
        WG_FENCE_REGS_C(pf, P_STEPS, "r");
        WGMMA_FENCE();
        PV_CHAIN(acc, pf, v_tile);
        WGMMA_COMMIT();
        if (!producer) {
            pp_arrive(their_turn);
        } else if (more) {
            COPIES_LANDED(); /* K(n1) */
            pp_arrive(their_turn);
        }
        WGMMA_WAIT_ALL();
        WG_FENCE_REGS(acc, O_FRAGS);
        if (more)
            PP_REFILL(producer, PP_V_FREE, PP_COPY(TILE_BYTES, v, n1));
    }
#undef PP_COPY
#elif !OVERLAP
    const uint k_tile = s_base, v_tile = k_tile + TILE_BYTES;
/* LOOP_COPY: the tile of keys n.. of x (k or v) into the buffer dst bytes into the tiles. */
#if USE_TMA
#define LOOP_COPY(dst, x, n) TMA_COPY(dst, x, n)
#else
#define LOOP_COPY(dst, x, n)                                                                       \
    copy_tile(smem, s_base, dst, x##b + (ulong)(n) * x##_ss, x##_ss, min(BLOCK_N, nk - (n)), BLOCK_N, \
              x##_vec, tid)
#endif
    for (int n0 = n_start, tile = 0; n0 <= n_end; n0 += BLOCK_N, ++tile) {
        const int n_next = n0 + BLOCK_N;
        /* K(n0) has landed (with TMA: is on its way); every warpgroup is done with V(n0-BN). */
        COPIES_LANDED();
        barrier(CLK_LOCAL_MEM_FENCE);
        LOOP_COPY(TILE_BYTES, v, n0);

        /* Every warpgroup computes every tile of the block: a branch around
         * wgmma makes ptxas serialise the wgmma chain. Keys a row does not
         * see are masked, and a tile none of them sees leaves m, l and O as
         * they were (p = 0, alpha = 1). */
        float s[S_FRAGS][4];
        {
            /* ---- S = Q K^T ---- */
            RELOAD_Q_FRAGS(qf);
            TILE_WAIT(k_bar, tile);
            WGMMA_FENCE();
            S_CHAIN(s, k_tile);
            WGMMA_COMMIT();
            WGMMA_WAIT_ALL();
            WG_FENCE_REGS(s, S_FRAGS);
            SCORES_POST(s, n0);
            ONLINE_SOFTMAX_16(s, S_FRAGS, acc, O_FRAGS, m_run, l_run, sc);
        }

        /* V(n0) has landed (with TMA: is on its way); every warpgroup is done reading K(n0). */
        COPIES_LANDED();
        barrier(CLK_LOCAL_MEM_FENCE);
        if (n_next <= n_end)
            LOOP_COPY(0, k, n_next);

        {
            /* ---- O += P V, P packed from the S registers ---- */
            uint pf[P_STEPS][4];
            PACK_P(pf, s);
            TILE_WAIT(v_bar, tile);
            PV_WAITED(acc, pf, v_tile);
        }
    }
#undef LOOP_COPY
#else
    /* One K buffer and two V buffers (tile t's V in buffer t % 2). Iteration
     * t issues S(t+1) = Q K(t+1)^T, then O += P(t) V(t), both asynchronous:
     * the softmax of S(t+1) runs while that P V product is still on the
     * tensor cores, and O's rescale by the new alpha waits for it. V(t+1)
     * loads during the whole iteration, K(t+2) from the moment every
     * warpgroup has S(t+1). The last tile's P V runs after the loop, which
     * keeps every wgmma out of a branch. */
    const uint k_tile = s_base;
    const int tiles = n_start <= n_end ? (n_end - n_start) / BLOCK_N + 1 : 0;
    float s[S_FRAGS][4];
    uint pf[P_STEPS][4];
    if (tiles > 0) {
        copy_tile(smem, s_base, TILE_BYTES, vb + (ulong)n_start * v_ss, v_ss, min(BLOCK_N, nk - n_start),
                  BLOCK_N, v_vec, tid);
        cp_wait_async_proxy(); /* K(0) */
        barrier(CLK_LOCAL_MEM_FENCE);
        RELOAD_Q_FRAGS(qf);
        WGMMA_FENCE();
        S_CHAIN(s, k_tile);
        WGMMA_COMMIT();
        WGMMA_WAIT_ALL();
        WG_FENCE_REGS(s, S_FRAGS);
        barrier(CLK_LOCAL_MEM_FENCE); /* every warpgroup is done reading K(0) */
        if (tiles > 1)
            copy_tile(smem, s_base, 0, kb + (ulong)(n_start + BLOCK_N) * k_ss, k_ss,
                      min(BLOCK_N, nk - n_start - BLOCK_N), BLOCK_N, k_vec, tid);
        SCORES_POST(s, n_start);
        ONLINE_SOFTMAX_16(s, S_FRAGS, acc, O_FRAGS, m_run, l_run, sc);
        PACK_P(pf, s);
    }
    for (int tile = 0; tile + 1 < tiles; ++tile) { /* not t: the lane's column, which MASK_16 reads */
        const int n1 = n_start + (tile + 1) * BLOCK_N; /* the next tile */
        const uint v_cur = s_base + TILE_BYTES * (uint)(1 + (tile & 1));
        const uint v_next = TILE_BYTES * (uint)(2 - (tile & 1)); /* bytes into the tile area */
        /* V(t) and K(t+1) have landed; every warpgroup is done with V(t-1). */
        cp_wait_async_proxy();
        barrier(CLK_LOCAL_MEM_FENCE);
        copy_tile(smem, s_base, v_next, vb + (ulong)n1 * v_ss, v_ss, min(BLOCK_N, nk - n1), BLOCK_N,
                  v_vec, tid);
        RELOAD_Q_FRAGS(qf);
        WG_FENCE_REGS(acc, O_FRAGS);
        WG_FENCE_REGS_C(pf, P_STEPS, "r");
        WGMMA_FENCE();
        S_CHAIN(s, k_tile);
        WGMMA_COMMIT();
        PV_CHAIN(acc, pf, v_cur);
        WGMMA_COMMIT();
        WGMMA_WAIT_ONE(); /* S(t+1); P(t) V(t) may still run */
        WG_FENCE_REGS(s, S_FRAGS);
        barrier(CLK_LOCAL_MEM_FENCE); /* every warpgroup is done reading K(t+1) */
        if (tile + 2 < tiles)
            copy_tile(smem, s_base, 0, kb + (ulong)(n1 + BLOCK_N) * k_ss, k_ss,
                      min(BLOCK_N, nk - n1 - BLOCK_N), BLOCK_N, k_vec, tid);
        SCORES_POST(s, n1);
        float alpha[2];
        ONLINE_SOFTMAX_16_P(s, S_FRAGS, m_run, l_run, sc, alpha);
        WGMMA_WAIT_ALL(); /* P(t) V(t) */
        WG_FENCE_REGS(acc, O_FRAGS);
        RESCALE_16(acc, O_FRAGS, alpha);
        PACK_P(pf, s);
    }
    if (tiles > 0) {
        const uint v_cur = s_base + TILE_BYTES * (uint)(1 + ((tiles - 1) & 1));
        cp_wait_async_proxy(); /* V(tiles - 1) */
        barrier(CLK_LOCAL_MEM_FENCE);
        PV_WAITED(acc, pf, v_cur);
    }
#endif

#if Q_KEEP
    /* Q's fragments used past the loop (Q_KEEP); nk is never negative. */
    WG_KEEP_A(qf, K_STEPS, s_base, nk);
#endif

    /* ---- epilogue: O / l and LSE ---- */
    __global ushort *ob = (__global ushort *)o + (o_off + b * o_sb + hq * o_sh);
    const int o_pair = (HEAD_DIM % 2 == 0) && ((ulong)ob % 4 == 0) && (o_ss % 2 == 0);
    NV_FWD_STORE_FRAG(acc, O_FRAGS, m_run, l_run, sc, w0, ushort, ob, o_pair, NV_STORE_PAIR16,
                      NV_STORE_ONE16);
}
