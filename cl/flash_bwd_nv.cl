/* flash_bwd_nv.cl: FlashAttention-2 backward on NVIDIA tensor cores (sm_80+, inline PTX mma.sync).
 *
 * The "nv-mma" backward variant, for float16/bfloat16 and head_dim <= 128.
 * Same arguments and semantics as cl/flash_bwd.cl's flash_bwd_dkdv and
 * flash_bwd_dq (common.cl's BWD_DKDV_ARGS, BWD_DQ_ARGS), with the same D_i
 * pre-pass (flash_bwd_pre). dQ comes either from its own pass (flash_bwd_dq_nv,
 * a fixed order: deterministic), or, built with DQ_ATOMIC=1, from the dK/dV
 * kernel adding each tile's dS K into the float accumulator with red.add
 * (flash_bwd_dq_store then rounds it); the host picks (FLASHCL_BWD_PARAMS DQ=).
 *
 * With s = scale * q.k (soft-capped: c*tanh(s/c)), P = exp(s - LSE):
 *   dV = P^T dO    dP = dO V^T    dS = P * (dP - D) * g * scale
 *   dK = dS^T Q    dQ = dS K      (g = 1 - tanh^2(s/c) under soft-cap, else 1)
 *
 * Work decomposition (16 = one mma fragment of rows):
 *   flash_bwd_dkdv_nv  a work-group of WARPS warps owns 16*WARPS keys of one
 *                      (batch, kv head); warp w owns 16 of them and keeps
 *                      their dK and dV as f32 accumulator fragments. The group
 *                      streams BLOCK_M-row tiles of Q and dO (with their LSE
 *                      and D_i) of every query head sharing the kv head, over
 *                      the rows that see any of its keys. Per tile and warp:
 *                        S^T  = K_w Q^T        dP^T = V_w dO^T       (16 x BLOCK_M)
 *                        P^T, dS^T elementwise in the accumulators
 *                        dV_w += P^T dO        dK_w += dS^T Q        (16 x D)
 *                      computing the transposes keeps each key's sums in one
 *                      warp's registers; P^T and dS^T go from accumulators to
 *                      A fragments in registers (see flash_fwd_nv.cl), and Q, dO
 *                      serve as B both plain (S^T, dP^T) and transposed
 *                      (ldmatrix .trans: dV, dK). DQ_ATOMIC: the warps' dS^T
 *                      meet in __local, and the tile's dQ = dS K (BLOCK_M x D)
 *                      is split over the warps in 16 x 16 units, each added to
 *                      the accumulator element by element.
 *   flash_bwd_dq_nv    a work-group of WARPS warps owns 16*WARPS query rows of
 *                      one (batch, query head), Q and dO as A fragments in
 *                      registers for the whole loop (the forward's shape);
 *                      K/V tiles of BLOCK_N keys stream through __local:
 *                        S = Q K^T   dP = dO V^T   dS   dQ += dS K (K .trans)
 *
 *   __local, dkdv:                             __local, dq:
 *   +-----------+-----------+                  +----------------+----------------+
 *   | K (16W)   | V (16W)   |  loaded once     | Q (16W)        | dO (16W)       | before the loop
 *   +-----------+-----------+                  +----------------+----------------+
 *   | Q, dO (BLOCK_M) x Q_STAGES            |  | K, V (BLOCK_N) x KV_STAGES      | in the loop
 *   +---------------------------------------+  +---------------------------------+
 *   | dS^T (16W x BLOCK_M): DQ_ATOMIC only  |
 *   +---------------------------------------+
 *   rows of PITCH halves: HEAD_DIM zero-padded to a multiple of 16, plus 8
 *   halves so that ldmatrix's 8 row reads hit distinct bank groups.
 *
 * Masks are the forward's (bottom-right windows; causal = right side 0): key
 * j is visible to row i iff shift - left <= j - i <= shift + right (a
 * negative side unbounded), shift = nk - nq. Padding rows and rows whose LSE
 * is -inf carry LSE +inf here, so P = 2^(s - inf) = 0 and dS = 0 without a
 * -inf - -inf. Warps skip tiles none of whose pairs is visible and mask only
 * tiles that cross a window edge or the end of the keys.
 *
 * Fragment layouts and the lane -> address maps of ldmatrix: flash_fwd_nv.cl.
 */

#ifndef HEAD_DIM
#define HEAD_DIM 64 // exact head dimension (compile-time: every fragment loop unrolls)
#endif
#ifndef WG
#define WG 128 // work-items per work-group: WG/32 warps of 16 keys (dkdv) or 16 rows (dq)
#endif
#ifndef BLOCK_M
#define BLOCK_M 64 // dkdv: query rows per streamed Q/dO tile (a multiple of 16)
#endif
#ifndef BLOCK_N
#define BLOCK_N 64 // dq: keys per streamed K/V tile (a multiple of 16)
#endif

#define WARPS (WG / 32)
#define OWN (16 * WARPS)                           // keys (dkdv) or rows (dq) per work-group
#define HEAD_DIM_PAD (((HEAD_DIM) + 15) / 16 * 16) // head dims seen by the mma
#define PITCH (HEAD_DIM_PAD + 8)                   // __local row pitch, halves
#define K_STEPS (HEAD_DIM_PAD / 16)                // k16 steps over the head dim
#define D_FRAGS (HEAD_DIM_PAD / 8)                 // n8 blocks of a 16 x D result
#define SMEM_LIMIT 48000                           // NVIDIA's OpenCL allows ~47 KB of __local

#if WG % 32 != 0 || WARPS < 1
#error "WG must be a multiple of 32"
#endif
#if BLOCK_M % 16 != 0 || BLOCK_N % 16 != 0
#error "BLOCK_M and BLOCK_N must be multiples of 16"
#endif
#ifndef FLASHCL_NV_PTX
#error "flash_bwd_nv is built with -DFLASHCL_NV_PTX (the PTX helpers in common_nv.cl)"
#endif
#if DTYPE != 1 && DTYPE != 2
#error "flash_bwd_nv needs DTYPE 1 (float16) or 2 (bfloat16)"
#endif
#if HEAD_DIM > 128
#error "flash_bwd_nv keeps 16 x HEAD_DIM dK and dV per warp in registers: HEAD_DIM <= 128"
#endif

/* ---- shared pieces ----------------------------------------------------------------------- */

/* Lane offsets (bytes) of ldmatrix.x4 within a tile of PITCH-half rows:
 *   A_LANE  16 rows x 16 columns as an A fragment (a0..a3)
 *   B_LANE  16 rows x 16 columns as the B fragments of two n8 blocks, the
 *           rows being n and the columns k (K rows in S = Q K^T)
 *   BT_LANE (.trans) 16 rows x 16 columns as the B fragments of two n8
 *           blocks, the rows being k and the columns n (V rows in P V) */
#define A_LANE(lane) ((uint)(((lane) % 16) * PITCH + ((lane) / 16) * 8) * 2u)
#define B_LANE(lane)                                                                               \
    ((uint)(((lane) % 8 + ((lane) / 16) * 8) * PITCH + (((lane) / 8) % 2) * 8) * 2u)
#define BT_LANE(lane)                                                                              \
    ((uint)(((lane) % 8 + (((lane) / 8) % 2) * 8) * PITCH + ((lane) / 16) * 8) * 2u)

#define TILE_BYTES(rows) ((rows)*PITCH * 2)

/* ==== dK, dV ================================================================================ */
#if !defined(BWD_KERNEL) || BWD_KERNEL == 2

#ifndef DQ_ATOMIC
/* 1: dQ += dS K into the float accumulator here (red.add); 0: flash_bwd_dq_nv does it */
#define DQ_ATOMIC 0
#endif
#ifndef KV_REGS
/* 1: each warp keeps its K and V rows as A fragments in registers (D <= 64:
 * 32 registers), so the loop reads only Q and dO from __local */
#define KV_REGS (HEAD_DIM <= 64)
#endif
#define DS_PITCH (BLOCK_M + 8) /* halves per dS^T row: 16-byte rows, conflict-free ldmatrix */
#define DS_BYTES (DQ_ATOMIC * OWN * DS_PITCH * 2)
#ifndef Q_STAGES
#if 2 * TILE_BYTES(OWN) + 4 * TILE_BYTES(BLOCK_M) + 4 * 4 * BLOCK_M + DS_BYTES <= SMEM_LIMIT
#define Q_STAGES 2 // the next Q/dO tile lands during the current one
#else
#define Q_STAGES 1
#endif
#endif
#define KV_HALFS (2 * OWN * PITCH)
#define QT_HALFS (BLOCK_M * PITCH)                 /* one Q (or dO) tile */
#define DS_AT (KV_HALFS + 2 * Q_STAGES * QT_HALFS) /* halves: dS^T, DQ_ATOMIC only */
#define DKDV_HALFS (DS_AT + DS_BYTES / 2)
#if DKDV_HALFS * 2 + Q_STAGES * 2 * BLOCK_M * 4 > SMEM_LIMIT
#error "K, V and the Q/dO tiles exceed NVIDIA's ~47 KB of __local memory: fewer warps or rows"
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void flash_bwd_dkdv_nv(BWD_DKDV_ARGS) {
    __local ushort smem[DKDV_HALFS] __attribute__((aligned(16)));
    /* per tile row: LSE as stored (-inf past nq; NV_P_DS_T applies lse_log2), D_i */
    __local float stats[Q_STAGES][2][BLOCK_M];
    (void)scratch;

    const int tid = (int)get_local_id(0);
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    NV_KEY_BLOCK_ORDER(OWN);
    const int heads_q = (int)get_global_size(1) * group;
    const uint s_base = shared_addr(smem);

    /* K and V of the group's keys, once. */
    __global const ushort *kb = (__global const ushort *)k + ROW_AT(k, b, n0, hk);
    __global const ushort *vb = (__global const ushort *)v + ROW_AT(v, b, n0, hk);
    const int n_rows = min(OWN, nk - n0);
    nv_copy_rows(smem, s_base, 0, kb, k_ss, n_rows, OWN, ROWS_16B(kb, k_ss), tid,
                 HEAD_DIM, PITCH, WG);
    nv_copy_rows(smem, s_base, OWN * PITCH, vb, v_ss, n_rows, OWN,
                 ROWS_16B(vb, v_ss), tid, HEAD_DIM, PITCH, WG);

    NV_KEY_BLOCK_ROW_TILES(OWN);
    NV_QDO_VEC;

    /* Issues the copies of tile `it` into stage `st` (Q, dO by cp.async or
     * plain loads; LSE and D_i by cp.async, NV_TILE_STATS). */
#define ISSUE_TILE(it, st)                                                                         \
    do {                                                                                           \
        const int hq_ = hk * group + (it) / m_tiles;                                               \
        const int m0_ = m_first + ((it) % m_tiles) * BLOCK_M;                                      \
        const int rows_ = min(BLOCK_M, nq - m0_);                                                  \
        const uint q_at = (uint)(KV_HALFS + (st)*2 * QT_HALFS);                                    \
        nv_copy_rows(smem, s_base, q_at, (__global const ushort *)q + ROW_AT(q, b, m0_, hq_),      \
                     q_ss, rows_, BLOCK_M, q_vec, tid, HEAD_DIM, PITCH, WG);                       \
        nv_copy_rows(smem, s_base, q_at + QT_HALFS,                                                \
                     (__global const ushort *)dout + ROW_AT(dout, b, m0_, hq_), dout_ss, rows_,    \
                     BLOCK_M, do_vec, tid, HEAD_DIM, PITCH, WG);                                   \
        NV_TILE_STATS(stats[st], m0_, hq_);                                                        \
    } while (0)

    float dk_acc[D_FRAGS][4], dv_acc[D_FRAGS][4];
#pragma unroll
    for (int j = 0; j < D_FRAGS; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dk_acc[j][e] = dv_acc[j][e] = 0.0f;

    const int kw0 = n0 + 16 * warp; /* this warp's first key */
    const uint k_frag = s_base + (uint)(warp * 16 * PITCH) * 2u + A_LANE(lane);
    const uint v_frag = k_frag + (uint)(OWN * PITCH) * 2u;
    const uint b_lane = B_LANE(lane), bt_lane = BT_LANE(lane);
#if DQ_ATOMIC
    __global float *dq_acc = scratch + dq_acc_off;
    const uint ds_tile = s_base + (uint)DS_AT * 2u;
    /* dS^T [key][row] read as A = dS [row][key] by ldmatrix .trans: lane
     * addresses as B_LANE's, over the dS^T rows. */
    const uint ds_lane =
        (uint)(((lane % 8 + (lane / 16) * 8) * DS_PITCH + ((lane / 8) % 2) * 8) * 2);
#endif

#if Q_STAGES == 2
    if (tiles > 0)
        ISSUE_TILE(0, 0);
#endif
#if KV_REGS
    uint kreg[K_STEPS][4], vreg[K_STEPS][4];
    cp_wait(); /* K and V (and tile 0) have landed */
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk) {
        LDMATRIX_X4(kreg[kk], k_frag + kk * 32u);
        LDMATRIX_X4(vreg[kk], v_frag + kk * 32u);
    }
#endif
    int stage = 0;
    for (int it = 0; it < tiles; ++it) {
#if Q_STAGES == 2
        /* Tile it has landed for everyone, and every warp is done with tile
         * it-1, whose buffers now receive tile it+1. */
        cp_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
        if (it + 1 < tiles)
            ISSUE_TILE(it + 1, stage ^ 1);
#else
        barrier(CLK_LOCAL_MEM_FENCE); /* every warp is done with the previous tile */
        ISSUE_TILE(it, 0);
        cp_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        const int m0 = m_first + (it % m_tiles) * BLOCK_M;
        /* Warp-uniform: skip the math of a tile none of whose (row, key)
         * pairs is visible or whose keys all lie past nk (its dS^T is 0);
         * mask one that crosses an edge. */
        const long rel_max = (long)kw0 + 15 - m0, rel_min = (long)kw0 - (m0 + BLOCK_M - 1);
        const int active = kw0 < nk && rel_max >= rel.x && rel_min <= rel.y;
        const int masked = rel_min < rel.x || rel_max > rel.y || kw0 + 15 >= nk;
        const uint q_tile = s_base + (uint)(KV_HALFS + stage * 2 * QT_HALFS) * 2u;
        const uint do_tile = q_tile + QT_HALFS * 2u;

        /* ---- S^T = K_w Q^T and dP^T = V_w dO^T (16 keys x BLOCK_M rows) ---- */
        float s[BLOCK_M / 8][4], dp[BLOCK_M / 8][4];
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[j][e] = dp[j][e] = 0.0f;
        if (active) {
#pragma unroll
            for (int kk = 0; kk < K_STEPS; ++kk) {
#if KV_REGS
#define ka kreg[kk]
#define va vreg[kk]
#else
                uint ka[4], va[4];
                LDMATRIX_X4(ka, k_frag + kk * 32u);
                LDMATRIX_X4(va, v_frag + kk * 32u);
#endif
#pragma unroll
                for (int np = 0; np < BLOCK_M / 16; ++np) {
                    uint qb[4], ob[4];
                    const uint at = b_lane + (uint)(np * 16 * PITCH + kk * 16) * 2u;
                    LDMATRIX_X4(qb, q_tile + at);
                    LDMATRIX_X4(ob, do_tile + at);
                    MMA_16816_X2(s[2 * np], s[2 * np + 1], ka, qb);
                    MMA_16816_X2(dp[2 * np], dp[2 * np + 1], va, ob);
                }
#undef ka
#undef va
            }

            /* ---- P^T into s, dS^T into dp ---- */
            NV_P_DS_T(s, dp, stats[stage], m0, masked);

            /* ---- dV_w += P^T dO and dK_w += dS^T Q, k = the tile's rows ---- */
#pragma unroll
            for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
                uint pa[4], da[4];
                ACC_TO_A(pa, s[2 * kk], s[2 * kk + 1]);
                ACC_TO_A(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
                for (int dq2 = 0; dq2 < D_FRAGS / 2; ++dq2) {
                    uint ob[4], qb[4];
                    const uint at = bt_lane + (uint)(kk * 16 * PITCH + dq2 * 16) * 2u;
                    LDMATRIX_X4_TRANS(ob, do_tile + at);
                    LDMATRIX_X4_TRANS(qb, q_tile + at);
                    MMA_16816_X2(dv_acc[2 * dq2], dv_acc[2 * dq2 + 1], pa, ob);
                    MMA_16816_X2(dk_acc[2 * dq2], dk_acc[2 * dq2 + 1], da, qb);
                }
            }
        } /* active */
#if DQ_ATOMIC
        /* ---- dQ += dS K: every warp's dS^T into __local (0 where inactive) ---- */
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *(__local uint *)(smem + DS_AT + (16 * warp + g + 8 * h) * DS_PITCH + 8 * j +
                                  2 * t) = pack2(dp[j][2 * h], dp[j][2 * h + 1]);
        barrier(CLK_LOCAL_MEM_FENCE);
        {
            const int hq = hk * group + it / m_tiles;
            const ulong row0 = ((ulong)b * heads_q + hq) * (ulong)nq;
            /* 16 rows x 16 dims per unit; the next tile's first barrier keeps
             * dS^T until every warp is done with it. */
            for (int u = warp; u < (BLOCK_M / 16) * (D_FRAGS / 2); u += WARPS) {
                const int rf = u / (D_FRAGS / 2), dp2 = u % (D_FRAGS / 2);
                float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
                for (int kk = 0; kk < OWN / 16; ++kk) {
                    uint da[4], kf[4];
                    LDMATRIX_X4_TRANS(da, ds_tile + ds_lane +
                                              (uint)(kk * 16 * DS_PITCH + rf * 16) * 2u);
                    LDMATRIX_X4_TRANS(kf,
                                      s_base + bt_lane + (uint)(kk * 16 * PITCH + dp2 * 16) * 2u);
                    MMA_16816_X2(c[0], c[1], da, kf);
                }
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const int row = m0 + rf * 16 + g + 8 * ((e >> 1) & 1);
                    const int d = dp2 * 16 + 8 * (e >> 2) + 2 * t + (e & 1);
                    if (row < nq && d < HEAD_DIM)
                        __asm__ __volatile__("red.global.add.f32 [%0], %1;" ::"l"(
                                                 dq_acc + ((row0 + row) * HEAD_DIM + d)),
                                             "f"(c[e >> 2][e & 3])
                                             : "memory");
                }
            }
        }
#endif
        stage ^= Q_STAGES - 1;
    }
#undef ISSUE_TILE
    cp_wait(); /* K and V when there was no tile */

    NV_STORE_DKDV;
}
#endif

/* ==== dQ ==================================================================================== */
#if !defined(BWD_KERNEL) || BWD_KERNEL == 3

#ifndef KV_STAGES
#if 4 * TILE_BYTES(BLOCK_N) <= SMEM_LIMIT
#define KV_STAGES 2 // the next K/V tile lands during the current one
#else
#define KV_STAGES 1
#endif
#endif
#define KT_HALFS (BLOCK_N * PITCH)
#define DQ_KV_HALFS (2 * KV_STAGES * KT_HALFS)
#define DQ_QO_HALFS (2 * OWN * PITCH)
#define DQ_HALFS (DQ_KV_HALFS > DQ_QO_HALFS ? DQ_KV_HALFS : DQ_QO_HALFS)
#if DQ_HALFS * 2 > SMEM_LIMIT
#error "the Q/dO block or the K/V tiles exceed NVIDIA's ~47 KB of __local memory"
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void flash_bwd_dq_nv(BWD_DQ_ARGS) {
    __local ushort smem[DQ_HALFS] __attribute__((aligned(16)));

    const int tid = (int)get_local_id(0);
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    /* Last blocks first: under a causal mask they see the most keys. */
    NV_ROW_BLOCK_ORDER(OWN);
    const int hk = hq / group;
    const int rows_q = min(OWN, nq - m0);
    const uint s_base = shared_addr(smem);

    __global const ushort *qb = (__global const ushort *)q + ROW_AT(q, b, m0, hq);
    __global const ushort *ob = (__global const ushort *)dout + ROW_AT(dout, b, m0, hq);
    __global const ushort *kb = (__global const ushort *)k + ROW_AT(k, b, 0, hk);
    __global const ushort *vb = (__global const ushort *)v + ROW_AT(v, b, 0, hk);
    const int k_vec = ROWS_16B(kb, k_ss);
    const int v_vec = ROWS_16B(vb, v_ss);

    /* Q and dO -> __local -> A fragments, once. */
    nv_copy_rows(smem, s_base, 0, qb, q_ss, rows_q, OWN, ROWS_16B(qb, q_ss), tid,
                 HEAD_DIM, PITCH, WG);
    nv_copy_rows(smem, s_base, OWN * PITCH, ob, dout_ss, rows_q, OWN,
                 ROWS_16B(ob, dout_ss), tid, HEAD_DIM, PITCH, WG);
    cp_wait();
    barrier(CLK_LOCAL_MEM_FENCE);
    uint qf[K_STEPS][4], of[K_STEPS][4];
    {
        const uint at = s_base + (uint)(warp * 16 * PITCH) * 2u + A_LANE(lane);
#pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
            LDMATRIX_X4(qf[kk], at + kk * 32u);
            LDMATRIX_X4(of[kk], at + (uint)(OWN * PITCH) * 2u + kk * 32u);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* every warp has its fragments before K/V overwrite them */

    /* Keys any row of the block sees; the warp's own range decides skips (a
     * warp past nq skips every tile). */
    NV_DQ_ROWS_AND_KEYS;

    float dq_acc[D_FRAGS][4];
#pragma unroll
    for (int j = 0; j < D_FRAGS; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dq_acc[j][e] = 0.0f;

    const uint b_lane = B_LANE(lane), bt_lane = BT_LANE(lane);
    /* Issues the copies of K and V tile n into the buffers at halves `at`. */
#define ISSUE_KV(n, at)                                                                            \
    do {                                                                                           \
        nv_copy_rows(smem, s_base, (at), kb + (ulong)(n)*k_ss, k_ss, min(BLOCK_N, nk - (n)),       \
                     BLOCK_N, k_vec, tid, HEAD_DIM, PITCH, WG);                                    \
        nv_copy_rows(smem, s_base, (at) + KT_HALFS, vb + (ulong)(n)*v_ss, v_ss,                    \
                     min(BLOCK_N, nk - (n)), BLOCK_N, v_vec, tid, HEAD_DIM, PITCH, WG);            \
    } while (0)
#if KV_STAGES == 2
    if (n_start <= n_end)
        ISSUE_KV(n_start, 0u);
#endif
    int stage = 0;
    for (int n0 = n_start; n0 <= n_end; n0 += BLOCK_N) {
        const uint k_tile = s_base + (uint)(stage * 2 * KT_HALFS) * 2u;
        const uint v_tile = k_tile + KT_HALFS * 2u;
#if KV_STAGES == 2
        /* Tile n0 has landed for everyone, and every warp is done with the
         * previous tile, whose buffers now receive the next one. */
        cp_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
        if (n0 + BLOCK_N <= n_end)
            ISSUE_KV(n0 + BLOCK_N, (uint)((stage ^ 1) * 2 * KT_HALFS));
#else
        barrier(CLK_LOCAL_MEM_FENCE); /* every warp is done with the previous tile */
        ISSUE_KV(n0, 0u);
        cp_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
#endif

        const long rel_max = (long)n0 + BLOCK_N - 1 - w0, rel_min = (long)n0 - (w0 + 15);
        if (w_rows > 0 && rel_max >= rel.x && rel_min <= rel.y) {
            const int masked = rel_min < rel.x || rel_max > rel.y || n0 + BLOCK_N > nk;
            /* ---- S = Q K^T and dP = dO V^T (16 rows x BLOCK_N keys) ---- */
            float s[BLOCK_N / 8][4], dp[BLOCK_N / 8][4];
#pragma unroll
            for (int j = 0; j < BLOCK_N / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s[j][e] = dp[j][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < K_STEPS; ++kk) {
#pragma unroll
                for (int np = 0; np < BLOCK_N / 16; ++np) {
                    uint kf[4], vf[4];
                    const uint at = b_lane + (uint)(np * 16 * PITCH + kk * 16) * 2u;
                    LDMATRIX_X4(kf, k_tile + at);
                    LDMATRIX_X4(vf, v_tile + at);
                    MMA_16816_X2(s[2 * np], s[2 * np + 1], qf[kk], kf);
                    MMA_16816_X2(dp[2 * np], dp[2 * np + 1], of[kk], vf);
                }
            }
            /* ---- dS into dp ---- */
            NV_DS(s, dp, n0, masked);
                /* ---- dQ += dS K, k = the tile's keys ---- */
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
                uint da[4];
                ACC_TO_A(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
                for (int dq2 = 0; dq2 < D_FRAGS / 2; ++dq2) {
                    uint kf[4];
                    LDMATRIX_X4_TRANS(kf,
                                      k_tile + bt_lane + (uint)(kk * 16 * PITCH + dq2 * 16) * 2u);
                    MMA_16816_X2(dq_acc[2 * dq2], dq_acc[2 * dq2 + 1], da, kf);
                }
            }
        }
        stage ^= KV_STAGES - 1;
    }
#undef ISSUE_KV

    if (w_rows > 0)
        STORE_ACC((__global ushort *)dq + ROW_AT(dq, b, w0, hq), dq_ss, dq_acc, w_rows);
}
#endif
