/* flash_fwd.cl: portable FlashAttention forward (online softmax, K/V tiles in __local).
 *
 * One work-group owns BLOCK_M query rows of one (batch, query head), with
 * TPR work-items per row. The rows go in groups of RPT (2 where the tiles
 * divide, else 1), each group shared by G = RPT*TPR work-items: work-item u
 * of a group owns, for all RPT rows, the output columns d = u, u + G, ...
 * (D_PER of them) and the tile columns c = u, u + G, ... of the score block
 * (N_PER of them), so each K, V value it reads feeds RPT rows.
 *
 *              BLOCK_N keys per tile, streamed through __local
 *            +------------------------------+
 *   BLOCK_M  | S = Q K^T  (s_tile, scaled,  |   Q rows live in q_tile for the
 *   query    |  masked, log2 domain)        |   whole loop; K then V share
 *   rows     +------------------------------+   kv_tile, so a tile costs one
 *                                               buffer of local memory.
 * Per tile:
 *   1. load K[n0 : n0+BLOCK_N) into kv_tile (float, zero past the end)
 *   2. each work-item scores its N_PER columns against its row's Q, applies
 *      the mask and soft-cap, and publishes its partial row max
 *   3. row max m_new; alpha = 2^(m_old - m_new); p = 2^(s - m_new) into
 *      s_tile; the per-work-item partial row sum l and the accumulator are
 *      rescaled by alpha (alpha is uniform along a row, so the partial sums
 *      stay exact and are reduced only once at the end); V overwrites K
 *   4. acc[d] += sum_c p[c] * V[c][d]
 * Only tiles intersecting the block's visible key range are visited, so
 * causal and windowed attention skip fully masked tiles.
 *
 * The softmax runs in base 2 on raw dot products s: p = 2^(s*c - m*c) with
 * c = scale*log2(e), evaluated as one fma, FlashAttention-2's trick. Folding
 * c into Q instead would round every score relative to its own magnitude
 * (2^-24 * 3000 for large logits); here the rounding of m*c is shared by the
 * whole row and cancels in the normalisation and in LSE = (m*c + log2 l) ln 2.
 * Soft-capping needs the natural-scale score for its tanh: there
 * s = softcap*log2(e) * tanh(dot * scale/softcap) and c = 1.
 *
 * A row that sees no key keeps m = -inf and l = 0; it writes 0 and LSE -inf
 * and never evaluates -inf - -inf.
 *
 * FP8 q, k, v (-DQ_FP8 -DKV_FP8, cl/common.cl): decoded as the tiles are
 * staged, so the tiles stay float and the __local estimate
 * (flashcl_forward_local_bytes) is the same. Q and K are multiplied by their
 * descale factors there (a row's, or its row block's, and a key's), so the
 * scores, the LSE and the soft-cap see the dequantized inputs; V's factor is
 * one per (batch, head) and multiplies the output with 1/l.
 */

#ifndef HEAD_DIM
#define HEAD_DIM 64 // exact head dimension (compile-time: loops unroll)
#endif
#ifndef BLOCK_M
#define BLOCK_M 16 // query rows per work-group
#endif
#ifndef BLOCK_N
#define BLOCK_N 32 // keys per __local tile
#endif
#ifndef TPR
#define TPR 8 // work-items per query row (1 suits CPUs: no reductions)
#endif

/* Register tiling: each work-item owns RPT rows (of a group of RPT
 * consecutive rows shared by G = RPT*TPR work-items), so every K or V value
 * it reads from __local feeds RPT multiply-adds, and every Q or P value
 * feeds N_PER or D_PER: __local reads per multiply-add drop from about 1 to
 * (RPT + D_PER) / (RPT * D_PER). The work-group stays BLOCK_M*TPR work-items
 * (the host sizes it so); flashcl_forward_local_bytes (src/params_forward.c)
 * mirrors this rule for the __local it reserves. */
#ifndef RPT
#if BLOCK_M % 2 == 0 && BLOCK_N % (2 * TPR) == 0
#define RPT 2
#else
#define RPT 1
#endif
#endif
#define G (RPT * TPR) /* work-items per row group */
#define WG_SIZE (BLOCK_M * TPR)
#define D_PER ((HEAD_DIM + G - 1) / G)
#define N_PER (BLOCK_N / G)
/* One padding float per row: rows HEAD_DIM apart would otherwise map the
 * G work-items of a group, which read different rows at the same d, onto
 * the same bank whenever HEAD_DIM is a multiple of the bank count. */
#define ROW_STRIDE (HEAD_DIM + 1)
#define S_STRIDE (BLOCK_N + 1)

#if BLOCK_N % TPR != 0
#error "BLOCK_N must be a multiple of TPR"
#endif
#if BLOCK_M % RPT != 0 || BLOCK_N % G != 0
#error "RPT must divide BLOCK_M, and RPT*TPR BLOCK_N"
#endif

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
flash_fwd(FWD_ARGS FWD_FP8_ARGS) {
    __local float q_tile[BLOCK_M * ROW_STRIDE];
    __local float kv_tile[BLOCK_N * ROW_STRIDE];
    __local float s_tile[BLOCK_M * S_STRIDE];
    __local float red[BLOCK_M * G]; /* per row: one partial of each work-item of its group */

    const int lid = (int)get_local_id(0);
    const int r0 = (lid / G) * RPT; /* this work-item's first row within the block */
    const int u = lid % G;          /* lane within the row group */
    const int m0 = (int)get_group_id(0) * BLOCK_M;
    const int hq = (int)get_global_id(1);
    const int b = (int)get_global_id(2);
    const int hk = hq / group;

    const ulong q_base = q_off + b * q_sb + hq * q_sh;
    const ulong k_base = k_off + b * k_sb + hk * k_sh;
    const ulong v_base = v_off + b * v_sb + hk * v_sh;
    const int q_sc = FP8_Q_BASE(b, hq), k_sc = FP8_K_BASE(b, hk); /* FP8: this head's descale factors */

    /* Q block -> q_tile; rows past nq are zero and never stored. */
    for (int idx = lid; idx < BLOCK_M * HEAD_DIM; idx += WG_SIZE) {
        int rr = idx / HEAD_DIM, d = idx % HEAD_DIM;
        float x = 0.0f;
        if (m0 + rr < nq)
            x = LOAD_Q(q, q_base + (ulong)(m0 + rr) * q_ss + d) * FP8_Q_SCALE(q_sc, m0 + rr);
        q_tile[rr * ROW_STRIDE + d] = x;
    }

    /* This work-item's rows' visible keys, and the union over the block,
     * which bounds the tiles visited (lo and hi grow with the row index). */
    long2 mine[RPT];
    int row_valid[RPT];
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
        mine[i] = visible_keys(m0 + r0 + i, nq, nk, win_left, win_right);
        row_valid[i] = m0 + r0 + i < nq;
    }
    const long2 first = visible_keys(m0, nq, nk, win_left, win_right);
    const long2 last = visible_keys(min(m0 + BLOCK_M, nq) - 1, nq, nk, win_left, win_right);
    const long blk_lo = first.x, blk_hi = last.y;

    float acc[RPT][D_PER];
    float m_run[RPT], l_run[RPT]; /* running max of raw scores; this work-item's share of the row sum */
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
#pragma unroll
        for (int e = 0; e < D_PER; ++e)
            acc[i][e] = 0.0f;
        m_run[i] = -INFINITY;
        l_run[i] = 0.0f;
    }
    const int capped = softcap_log2 > 0.0f;
    const float to_log2 = capped ? 1.0f : q_mul; /* score -> log2 domain */

    const long n_start = blk_lo <= blk_hi ? (blk_lo / BLOCK_N) * BLOCK_N : blk_hi + 1;
    for (long n0 = n_start; n0 <= blk_hi; n0 += BLOCK_N) {
        /* 1. K tile. The barrier also protects kv_tile from the previous
         *    tile's P.V readers. */
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int idx = lid; idx < BLOCK_N * HEAD_DIM; idx += WG_SIZE) {
            int c = idx / HEAD_DIM, d = idx % HEAD_DIM;
            float x = 0.0f;
            if (n0 + c < nk)
                x = LOAD_KV(k, k_base + (ulong)(n0 + c) * k_ss + d) * FP8_K_SCALE(k_sc, (int)n0 + c);
            kv_tile[c * ROW_STRIDE + d] = x;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 2. Scores of this work-item's RPT rows x N_PER keys (keys u, u+G, ...). */
        float s[RPT][N_PER];
#pragma unroll
        for (int i = 0; i < RPT; ++i)
#pragma unroll
            for (int j = 0; j < N_PER; ++j)
                s[i][j] = 0.0f;
        for (int d = 0; d < HEAD_DIM; ++d) {
            float qd[RPT];
#pragma unroll
            for (int i = 0; i < RPT; ++i)
                qd[i] = q_tile[(r0 + i) * ROW_STRIDE + d];
#pragma unroll
            for (int j = 0; j < N_PER; ++j) {
                const float kd = kv_tile[(u + j * G) * ROW_STRIDE + d];
#pragma unroll
                for (int i = 0; i < RPT; ++i)
                    s[i][j] = fma(qd[i], kd, s[i][j]);
            }
        }
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            float tile_max = -INFINITY;
#pragma unroll
            for (int j = 0; j < N_PER; ++j) {
                const long key = n0 + u + j * G;
                float x = capped ? softcap_log2 * tanh(s[i][j] * q_mul) : s[i][j];
                if (!row_valid[i] || key < mine[i].x || key > mine[i].y)
                    x = -INFINITY;
                s[i][j] = x;
                tile_max = fmax(tile_max, x);
            }
            red[(r0 + i) * G + u] = tile_max;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 3. Online softmax update. V may now replace K: every score has been
         *    computed before the barrier above. */
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            float m_new = m_run[i];
            for (int w = 0; w < G; ++w)
                m_new = fmax(m_new, red[(r0 + i) * G + w]);
            /* While the row has seen nothing, m_new is -inf: keep alpha = 1
             * and p = 0 instead of forming -inf - -inf. */
            const float alpha = m_new == -INFINITY ? 1.0f : exp2((m_run[i] - m_new) * to_log2);
            float psum = 0.0f;
#pragma unroll
            for (int j = 0; j < N_PER; ++j) {
                /* (s - m) * to_log2, not fma(s, to_log2, -m * to_log2): the
                 * two roundings of s*to_log2 and m*to_log2 differ by up to half
                 * an ulp of m*to_log2, 2^+-512 at m ~ 1e10 (p 0 or inf). */
                const float p = s[i][j] == -INFINITY ? 0.0f : exp2((s[i][j] - m_new) * to_log2);
                s_tile[(r0 + i) * S_STRIDE + u + j * G] = p;
                psum += p;
            }
            l_run[i] = l_run[i] * alpha + psum;
            m_run[i] = m_new;
#pragma unroll
            for (int e = 0; e < D_PER; ++e)
                acc[i][e] *= alpha;
        }

        for (int idx = lid; idx < BLOCK_N * HEAD_DIM; idx += WG_SIZE) {
            int c = idx / HEAD_DIM, d = idx % HEAD_DIM;
            float x = 0.0f;
            if (n0 + c < nk)
                x = LOAD_KV(v, v_base + (ulong)(n0 + c) * v_ss + d);
            kv_tile[c * ROW_STRIDE + d] = x;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 4. acc += P V over this work-item's rows and output columns (u, u+G, ...). */
        for (int c = 0; c < BLOCK_N; ++c) {
            float p[RPT];
#pragma unroll
            for (int i = 0; i < RPT; ++i)
                p[i] = s_tile[(r0 + i) * S_STRIDE + c];
#pragma unroll
            for (int e = 0; e < D_PER; ++e) {
                const int d = u + e * G;
                if (d < HEAD_DIM) {
                    const float vd = kv_tile[c * ROW_STRIDE + d];
#pragma unroll
                    for (int i = 0; i < RPT; ++i)
                        acc[i][e] = fma(p[i], vd, acc[i][e]);
                }
            }
        }
    }

    /* Reduce the partial row sums once. */
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int i = 0; i < RPT; ++i)
        red[(r0 + i) * G + u] = l_run[i];
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
        if (!row_valid[i])
            continue;
        float l = 0.0f;
        for (int w = 0; w < G; ++w)
            l += red[(r0 + i) * G + w];
        const long row = m0 + r0 + i;
        const float inv_l = l > 0.0f ? FP8_V_SCALE(b, hk) / l : 0.0f;
        const ulong o_row = o_off + b * o_sb + hq * o_sh + (ulong)row * o_ss;
#pragma unroll
        for (int e = 0; e < D_PER; ++e) {
            const int d = u + e * G;
            if (d < HEAD_DIM)
                STORE_ELEM(o, o_row + d, acc[i][e] * inv_l);
        }
        if (has_lse && u == 0)
            lse[lse_off + ((ulong)b * get_global_size(1) + hq) * (ulong)nq + row] =
                l > 0.0f ? (m_run[i] * to_log2 + log2(l)) * LN2 : -INFINITY;
    }
}
