/* flash_fwd_nv.cl: FlashAttention-2 forward on NVIDIA tensor cores (sm_80+, inline PTX mma.sync).
 *
 * Same arguments and semantics as flash_fwd.cl; the host selects this file for
 * float16/bfloat16 with 32 <= HEAD_DIM <= 256 on compute capability >= 8.0.
 * It only builds with NVIDIA's OpenCL compiler (inline PTX).
 *
 * Work decomposition. A work-group of WARPS warps owns BLOCK_M query rows of
 * one (batch, query head); warp w owns ROWS_PER_WARP = 16*M_FRAGS of them.
 * Each warp keeps its Q rows as mma A-fragments in registers for the whole
 * key loop, its O rows as f32 accumulator fragments, and one S tile.
 *
 *                   __local (one ushort array, 16-byte aligned)
 *   +-------------+-------------+-------------+-------------+
 *   | K, stage 0  | V, stage 0  | K, stage 1  | V, stage 1  |  each BLOCK_N rows
 *   +-------------+-------------+-------------+-------------+  x PITCH halves;
 *   | Q block (BLOCK_M x PITCH): before the loop only       |  stage 1 only when
 *   +-------------------------------------------------------+  KV_STAGES == 2
 *   PITCH = HEAD_DIM_PAD + KV_PAD halves; columns HEAD_DIM..HEAD_DIM_PAD-1
 *   are zero (the mma k-steps and n8 blocks need multiples of 16).
 *
 * Per key tile, KV_STAGES == 2 (when 2 x (K+V) fit in ~47 KB):
 *
 *     wait tile n0, barrier ---> issue copy K, V (n0+BN) into the other stage
 *     S = Q K^T (mma), mask, online softmax, O += P V      (n0+BN lands meanwhile)
 *
 * KV_STAGES == 1 (one K and one V buffer, FA2's scheme):
 *
 *     wait K(n0), barrier ---> issue copy V(n0) ---+  (V lands while S runs)
 *     S = Q K^T (mma), mask, online softmax        |
 *     wait V(n0), barrier ---> issue copy K(n0+BN) |  (K lands while PV runs)
 *     O += P V
 *
 * In both, P goes from the S registers straight into the P V mma.
 *
 * Copies use cp.async (16-byte chunks, zero-filled past HEAD_DIM and past nk)
 * when every row start is 16-byte aligned, else plain 2-byte loads that
 * complete at issue time; the barriers are the same for both.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16, .f16/.bf16 inputs, .f32 accumulators).
 * lane = 0..31, g = lane / 4 ("groupID"), t = lane % 4 ("threadID_in_group");
 * a 32-bit register holds two 16-bit values, the lower column in the low half.
 *
 *   A (16x16, row-major: Q rows x head dims, or P rows x keys)
 *     a0 = A[g    ][2t, 2t+1]      a2 = A[g    ][2t+8, 2t+9]
 *     a1 = A[g + 8][2t, 2t+1]      a3 = A[g + 8][2t+8, 2t+9]
 *   B (16x8, "col": k x n, read as B[k][n])
 *     b0 = B[2t, 2t+1][g]          b1 = B[2t+8, 2t+9][g]
 *   C/D (16x8 f32)
 *     c0, c1 = C[g    ][2t, 2t+1]  c2, c3 = C[g + 8][2t, 2t+1]
 *
 *   S = Q K^T: B[k][n] = K[key n][dim k], i.e. K rows as stored, so an 8x8
 *     block of K read by a plain ldmatrix gives lane (g, t) K[g][2t, 2t+1],
 *     which is b0 (dims 0-7 of the k-step) or b1 (dims 8-15).
 *   O = P V: B[k][n] = V[key k][dim n]; ldmatrix .trans hands lane (g, t)
 *     V[2t, 2t+1][g] of an 8x8 block: b0 (keys 0-7) or b1 (keys 8-15).
 *   P as A: the accumulators of two adjacent n8 blocks 2k and 2k+1 of S are,
 *     element for element, the A fragment of k-step k of P V:
 *       a0 = S(2k)[c0,c1]  a1 = S(2k)[c2,c3]  a2 = S(2k+1)[c0,c1]  a3 = S(2k+1)[c2,c3]
 *     so P is packed to 16 bits in registers and never touches __local.
 *   ldmatrix .x4: lanes 8i..8i+7 give the row addresses of matrix i, and
 *     matrix i lands in result register i. The lane -> address maps are
 *     chosen so that the results come out in the a0..a3 / b0,b1 order above
 *     (q_lane, k_lane and v_lane in the kernel).
 *   Each lane therefore holds two query rows per 16-row fragment: g and g+8.
 *   A row's max and sum are reduced over the 4 lanes of its quad (xor 1, 2).
 *
 * Softmax in base 2 with the scale folded in: the running max m is kept in
 * raw dot-product units and p = 2^(s*sc - m*sc) is one fma + ex2, where
 * sc = q_mul (scale*log2e, > 0 as the host guarantees). With soft-capping,
 * s is first replaced by softcap_log2 * tanh(q_mul * s) and sc = 1.
 * Q is kept in 16 bits exactly as stored; the scale is applied to the f32
 * scores, so no extra rounding is introduced.
 *
 * A row that sees no key keeps m = -inf and l = 0: it writes 0 and LSE -inf
 * and never evaluates -inf - -inf.
 */

/* RESCALE_SKIP (ONLINE_SOFTMAX_16, common_nv.cl): 1 leaves O alone in tiles where no row's
 * max moved; off here until timed (on in the decode kernel). */
#ifndef RESCALE_SKIP
#define RESCALE_SKIP 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128 // exact head dimension (compile-time: every fragment loop unrolls)
#endif
#ifndef WARPS
#define WARPS 4 // warps per work-group; the work-group is WARPS*32 work-items
#endif
/* Query rows per work-group, 16*M_FRAGS per warp. Two 16-row fragments per
 * warp make every K/V fragment read from __local feed two mma: at D=64 on
 * the H200, 281 TFLOP/s against 215 with one. Above D=64 the extra O and Q
 * registers spill (D=96: no gain; D=128: 228 against 250). */
#ifndef BLOCK_M
#if HEAD_DIM <= 64
#define BLOCK_M (32 * WARPS)
#else
#define BLOCK_M (16 * WARPS)
#endif
#endif
/* Keys per tile. 64 up to D=128 (34 KB of K+V there; 16 or 32 measured
 * slower), 32 above (D=256: 187 TFLOP/s against 175 with 16). */
#ifndef BLOCK_N
#if HEAD_DIM > 128
#define BLOCK_N 32
#else
#define BLOCK_N 64
#endif
#endif
#ifndef KV_PAD
/* halves of padding per __local row (a multiple of 8): the row pitch becomes
 * an odd multiple of 16 bytes, so ldmatrix's 8 row reads hit 8 distinct bank
 * groups (no conflicts) */
#define KV_PAD 8
#endif
#ifndef KV_STAGES
#if 4 * BLOCK_N * (((HEAD_DIM) + 15) / 16 * 16 + KV_PAD) * 2 <= 48000
/* K/V tile buffers: 2 when two K+V pairs fit in ~47 KB (the next tile loads
 * during the whole current one, one barrier per tile; D=64: 215 TFLOP/s
 * against 191 with 1), else 1 */
#define KV_STAGES 2
#else
#define KV_STAGES 1
#endif
#endif
#define WG_SIZE (WARPS * 32)
#define ROWS_PER_WARP (BLOCK_M / WARPS)
#define M_FRAGS (ROWS_PER_WARP / 16)               // 16-row A fragments per warp
#define HEAD_DIM_PAD (((HEAD_DIM) + 15) / 16 * 16) // head dims seen by the mma
#define PITCH (HEAD_DIM_PAD + KV_PAD)              // __local row pitch, halves
#define K_STEPS (HEAD_DIM_PAD / 16)                // k16 steps of S = Q K^T
#define S_FRAGS (BLOCK_N / 8)                      // n8 blocks of S per 16 rows
#define P_STEPS (BLOCK_N / 16)                     // k16 steps of O = P V
#define O_FRAGS (HEAD_DIM_PAD / 8)                 // n8 blocks of O per 16 rows
#define TILE_HALFS (BLOCK_N * PITCH)
#define Q_HALFS (BLOCK_M * PITCH)
#define KV_HALFS (2 * KV_STAGES * TILE_HALFS) // stage s: K at 2s*TILE, V at (2s+1)*TILE
#define SMEM_HALFS (Q_HALFS > KV_HALFS ? Q_HALFS : KV_HALFS)

#if BLOCK_M % (16 * WARPS) != 0 || M_FRAGS < 1
#error "BLOCK_M must be a multiple of 16*WARPS"
#endif
#if BLOCK_N % 16 != 0
#error "BLOCK_N must be a multiple of 16"
#endif
#if KV_STAGES != 1 && KV_STAGES != 2
#error "KV_STAGES must be 1 or 2"
#endif
#if KV_PAD % 8 != 0
#error "KV_PAD must be a multiple of 8 (16-byte rows for cp.async and ldmatrix)"
#endif
#ifndef FLASHCL_NV_PTX
#error "flash_fwd_nv is built with -DFLASHCL_NV_PTX (the PTX helpers in common_nv.cl)"
#endif
#if SMEM_HALFS * 2 > 48000
#error "K and V tiles (or the Q block) exceed NVIDIA's ~47 KB of __local memory"
#endif
#if DTYPE != 1 && DTYPE != 2
#error "flash_fwd_nv needs DTYPE 1 (float16) or 2 (bfloat16)"
#endif

/* ---- global -> __local tile copies (nv_copy_rows in common_nv.cl) ----------------------- */

inline void copy_tile(__local ushort *smem, uint s_base, uint dst_off, __global const ushort *src,
                      ulong stride, int rows, int nrows, int vec, int tid) {
    nv_copy_rows(smem, s_base, dst_off, src, stride, rows, nrows, vec, tid, HEAD_DIM, PITCH,
                 WG_SIZE);
}

/* ---- the kernel ----------------------------------------------------------------------- */

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void flash_fwd_nv(FWD_ARGS) {
    __local ushort smem[SMEM_HALFS] __attribute__((aligned(16)));

    NV_FWD_BLOCK;

    NV_FWD_HEADS(ushort);

    const uint s_base = shared_addr(smem);

    /* Q block -> __local -> A fragments, once. Rows past nq are zero. */
    copy_tile(smem, s_base, 0, qb + (ulong)m0 * q_ss, q_ss, rows_q, BLOCK_M, q_vec, tid);
    cp_wait();
    barrier(CLK_LOCAL_MEM_FENCE);
    uint qf[M_FRAGS][K_STEPS][4];
    {
        /* lanes 0-15 address rows 0-15 at dims 0-7, lanes 16-31 the same rows
         * at dims 8-15: matrices come out as a0 (rows 0-7, dims 0-7), a1
         * (rows 8-15, dims 0-7), a2 (rows 0-7, dims 8-15), a3. */
        const uint q_lane =
            s_base + (uint)((warp * ROWS_PER_WARP + lane % 16) * PITCH + (lane / 16) * 8) * 2u;
#pragma unroll
        for (int mf = 0; mf < M_FRAGS; ++mf)
#pragma unroll
            for (int kk = 0; kk < K_STEPS; ++kk)
                LDMATRIX_X4(qf[mf][kk], q_lane + (uint)(mf * 16 * PITCH + kk * 16) * 2u);
    }
    /* Every warp has its Q before K overwrites the same bytes. */
    barrier(CLK_LOCAL_MEM_FENCE);

    /* K: matrix i of ldmatrix.x4 = keys 8*(i/2).. x dims 8*(i%2).., so the
     * results are b0, b1 of n8 block 2p and b0, b1 of n8 block 2p+1.
     * V (.trans): matrix i = keys 8*(i%2).. x dims 8*(i/2).., giving b0, b1
     * of output n8 block 2p and b0, b1 of block 2p+1. */
    const uint k_lane = (uint)((lane % 8 + (lane / 16) * 8) * PITCH + ((lane / 8) % 2) * 8) * 2u;
    const uint v_lane = (uint)((lane % 8 + ((lane / 8) % 2) * 8) * PITCH + (lane / 16) * 8) * 2u;

    /* Visible keys. lo and hi grow with the row, so a block's (or warp's)
     * union is [lo(first), hi(last)] and the keys every row sees are
     * [lo(last), hi(first)]. Key indices fit in int once clipped. */
    const long2 blk_first = visible_keys(m0, nq, nk, win_left, win_right);
    const long2 blk_last = visible_keys(m0 + rows_q - 1, nq, nk, win_left, win_right);
    const long blk_lo = blk_first.x, blk_hi = blk_last.y;

    const int w0 = m0 + warp * ROWS_PER_WARP; /* first row of this warp */
    NV_WARP_KEYS(w0, min(ROWS_PER_WARP, nq - w0));
    /* Per row of this lane: [lo, hi] for rows g and g+8 of each fragment. */
    int row_lo[M_FRAGS][2], row_hi[M_FRAGS][2];
#pragma unroll
    for (int mf = 0; mf < M_FRAGS; ++mf)
        NV_FRAG_KEYS(row_lo[mf], row_hi[mf], w0 + mf * 16);

    const int softcap = softcap_log2 > 0.0f;
    const float sc = softcap ? 1.0f : q_mul; /* raw score units -> log2 units */

    float acc[M_FRAGS][O_FRAGS][4];
    float m_run[M_FRAGS][2], l_run[M_FRAGS][2];
#pragma unroll
    for (int mf = 0; mf < M_FRAGS; ++mf) {
#pragma unroll
        for (int j = 0; j < O_FRAGS; ++j)
            acc[mf][j][0] = acc[mf][j][1] = acc[mf][j][2] = acc[mf][j][3] = 0.0f;
        m_run[mf][0] = m_run[mf][1] = -INFINITY;
        l_run[mf][0] = l_run[mf][1] = 0.0f;
    }

    const int n_start = blk_lo <= blk_hi ? (int)(blk_lo / BLOCK_N) * BLOCK_N : nk;
    const int n_end = (int)blk_hi; /* last key any row of the block sees */
    if (n_start <= n_end) {
        copy_tile(smem, s_base, 0, kb + (ulong)n_start * k_ss, k_ss, min(BLOCK_N, nk - n_start),
                  BLOCK_N, k_vec, tid);
#if KV_STAGES == 2
        copy_tile(smem, s_base, TILE_HALFS, vb + (ulong)n_start * v_ss, v_ss,
                  min(BLOCK_N, nk - n_start), BLOCK_N, v_vec, tid);
#endif
    }

    int stage = 0; /* buffer pair of the current tile (always 0 with one stage) */
    for (int n0 = n_start; n0 <= n_end; n0 += BLOCK_N) {
        const int n_next = n0 + BLOCK_N;
        const uint k_tile = s_base + (uint)(stage * 2 * TILE_HALFS) * 2u;
        const uint v_tile = k_tile + TILE_HALFS * 2u;
#if KV_STAGES == 2
        /* Tile n0 has landed for everyone, and every warp is done with tile
         * n0-BN, whose buffers now receive tile n0+BN. */
        cp_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
        if (n_next <= n_end) {
            const uint next = (uint)((stage ^ 1) * 2 * TILE_HALFS);
            copy_tile(smem, s_base, next, kb + (ulong)n_next * k_ss, k_ss,
                      min(BLOCK_N, nk - n_next), BLOCK_N, k_vec, tid);
            copy_tile(smem, s_base, next + TILE_HALFS, vb + (ulong)n_next * v_ss, v_ss,
                      min(BLOCK_N, nk - n_next), BLOCK_N, v_vec, tid);
        }
#else
        /* K(n0) has landed for everyone, and every warp is done with V(n0-BN). */
        cp_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
        copy_tile(smem, s_base, TILE_HALFS, vb + (ulong)n0 * v_ss, v_ss, min(BLOCK_N, nk - n0),
                  BLOCK_N, v_vec, tid);
#endif

        /* Warp-uniform: a warp none of whose rows sees this tile skips its math
         * (p would be 0 everywhere and m unchanged), but not the barriers. */
        const int n_last = n0 + BLOCK_N - 1;
        const int active = n0 <= w_hi && n_last >= w_lo;
        float s[M_FRAGS][S_FRAGS][4];
        if (active) {
            /* ---- S = Q K^T ---- */
#pragma unroll
            for (int mf = 0; mf < M_FRAGS; ++mf)
#pragma unroll
                for (int j = 0; j < S_FRAGS; ++j)
                    s[mf][j][0] = s[mf][j][1] = s[mf][j][2] = s[mf][j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < K_STEPS; ++kk)
#pragma unroll
                for (int np = 0; np < S_FRAGS / 2; ++np) {
                    uint kf[4];
                    LDMATRIX_X4(kf, k_tile + k_lane + (uint)(np * 16 * PITCH + kk * 16) * 2u);
#pragma unroll
                    for (int mf = 0; mf < M_FRAGS; ++mf) {
                        MMA_16816_X2(s[mf][2 * np], s[mf][2 * np + 1], qf[mf][kk], kf);
                    }
                }

            /* ---- soft-cap (rare; precise tanh like the portable kernel) ---- */
            if (softcap) {
#pragma unroll
                for (int mf = 0; mf < M_FRAGS; ++mf)
                    SOFTCAP_16(s[mf], S_FRAGS, q_mul, softcap_log2);
            }

            /* ---- mask, only on tiles crossing some row's window edge or nk ---- */
            if (!(n0 >= w_all_lo && n_last <= w_all_hi)) {
#pragma unroll
                for (int mf = 0; mf < M_FRAGS; ++mf)
                    MASK_16(s[mf], S_FRAGS, n0, row_lo[mf], row_hi[mf], n0 < w_all_lo);
            }

            /* ---- online softmax: rows g (e = 0,1) and g+8 (e = 2,3) ---- */
#pragma unroll
            for (int mf = 0; mf < M_FRAGS; ++mf)
                ONLINE_SOFTMAX_16(s[mf], S_FRAGS, acc[mf], O_FRAGS, m_run[mf], l_run[mf], sc);
        }

#if KV_STAGES == 1
        /* V(n0) has landed, and every warp is done reading K(n0). */
        cp_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
        if (n_next <= n_end)
            copy_tile(smem, s_base, 0, kb + (ulong)n_next * k_ss, k_ss, min(BLOCK_N, nk - n_next),
                      BLOCK_N, k_vec, tid);
#endif

        if (active) {
            /* ---- O += P V, P packed from the S registers ---- */
#pragma unroll
            for (int kk = 0; kk < P_STEPS; ++kk) {
                uint pf[M_FRAGS][4];
#pragma unroll
                for (int mf = 0; mf < M_FRAGS; ++mf) {
                    pf[mf][0] = pack2(s[mf][2 * kk][0], s[mf][2 * kk][1]);
                    pf[mf][1] = pack2(s[mf][2 * kk][2], s[mf][2 * kk][3]);
                    pf[mf][2] = pack2(s[mf][2 * kk + 1][0], s[mf][2 * kk + 1][1]);
                    pf[mf][3] = pack2(s[mf][2 * kk + 1][2], s[mf][2 * kk + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < O_FRAGS / 2; ++dp) {
                    uint vf[4];
                    LDMATRIX_X4_TRANS(vf, v_tile + v_lane + (uint)(kk * 16 * PITCH + dp * 16) * 2u);
#pragma unroll
                    for (int mf = 0; mf < M_FRAGS; ++mf) {
                        MMA_16816_X2(acc[mf][2 * dp], acc[mf][2 * dp + 1], pf[mf], vf);
                    }
                }
            }
        }
        stage ^= KV_STAGES - 1;
    }

    /* ---- epilogue: O / l and LSE ---- */
    __global ushort *ob = (__global ushort *)o + (o_off + b * o_sb + hq * o_sh);
    /* Two columns per 32-bit store when every (row, even column) is 4-byte aligned. */
    const int o_pair = (HEAD_DIM % 2 == 0) && ((ulong)ob % 4 == 0) && (o_ss % 2 == 0);
#pragma unroll
    for (int mf = 0; mf < M_FRAGS; ++mf)
        NV_FWD_STORE_FRAG(acc[mf], O_FRAGS, m_run[mf], l_run[mf], sc, w0 + mf * 16, ushort, ob, o_pair,
                          NV_STORE_PAIR16, NV_STORE_ONE16);
}
