/* flash_fwd.cl: portable FlashAttention forward (online softmax, K/V tiles in __local).
 *
 * One work-group owns BLOCK_M query rows of one (batch, query head). Each row
 * is shared by TPR work-items; work-item t of a row owns the output columns
 * d = t, t + TPR, t + 2*TPR, ... (D_PER of them) and the tile columns
 * c = t, t + TPR, ... of the score block (N_PER of them).
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

#define WG_SIZE (BLOCK_M * TPR)
#define D_PER ((HEAD_DIM + TPR - 1) / TPR)
#define N_PER (BLOCK_N / TPR)
/* One padding float per row: rows HEAD_DIM apart would otherwise map the
 * TPR work-items of a row, which read different rows at the same d, onto the
 * same bank whenever HEAD_DIM is a multiple of the bank count. */
#define ROW_STRIDE (HEAD_DIM + 1)
#define S_STRIDE (BLOCK_N + 1)

#if BLOCK_N % TPR != 0
#error "BLOCK_N must be a multiple of TPR"
#endif

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
flash_fwd(FWD_ARGS) {
    __local float q_tile[BLOCK_M * ROW_STRIDE];
    __local float kv_tile[BLOCK_N * ROW_STRIDE];
    __local float s_tile[BLOCK_M * S_STRIDE];
    __local float red[BLOCK_M * TPR];

    const int lid = (int)get_local_id(0);
    const int r = lid / TPR; /* row within the block */
    const int t = lid % TPR; /* lane within the row  */
    const int m0 = (int)get_group_id(0) * BLOCK_M;
    const int hq = (int)get_global_id(1);
    const int b = (int)get_global_id(2);
    const int hk = hq / group;
    const long row = m0 + r;
    const int row_valid = row < nq;

    const ulong q_base = q_off + b * q_sb + hq * q_sh;
    const ulong k_base = k_off + b * k_sb + hk * k_sh;
    const ulong v_base = v_off + b * v_sb + hk * v_sh;

    /* Q block -> q_tile; rows past nq are zero and never stored. */
    for (int idx = lid; idx < BLOCK_M * HEAD_DIM; idx += WG_SIZE) {
        int rr = idx / HEAD_DIM, d = idx % HEAD_DIM;
        float x = 0.0f;
        if (m0 + rr < nq)
            x = LOAD_ELEM(q, q_base + (ulong)(m0 + rr) * q_ss + d);
        q_tile[rr * ROW_STRIDE + d] = x;
    }

    /* This row's visible keys, and the union over the block, which bounds the
     * tiles visited (lo grows and hi grows with the row index). */
    const long2 mine = visible_keys(row, nq, nk, win_left, win_right);
    const long2 first = visible_keys(m0, nq, nk, win_left, win_right);
    const long2 last = visible_keys(min(m0 + BLOCK_M, nq) - 1, nq, nk, win_left, win_right);
    const long blk_lo = first.x, blk_hi = last.y;

    float acc[D_PER];
    for (int i = 0; i < D_PER; ++i)
        acc[i] = 0.0f;
    const int capped = softcap_log2 > 0.0f;
    const float to_log2 = capped ? 1.0f : q_mul; /* score -> log2 domain */
    float m_run = -INFINITY; /* running max of raw scores, uniform in a row */
    float l_run = 0.0f;      /* this work-item's share of the running row sum  */

    const long n_start = blk_lo <= blk_hi ? (blk_lo / BLOCK_N) * BLOCK_N : blk_hi + 1;
    for (long n0 = n_start; n0 <= blk_hi; n0 += BLOCK_N) {
        /* 1. K tile. The barrier also protects kv_tile from the previous
         *    tile's P.V readers. */
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int idx = lid; idx < BLOCK_N * HEAD_DIM; idx += WG_SIZE) {
            int c = idx / HEAD_DIM, d = idx % HEAD_DIM;
            float x = 0.0f;
            if (n0 + c < nk)
                x = LOAD_ELEM(k, k_base + (ulong)(n0 + c) * k_ss + d);
            kv_tile[c * ROW_STRIDE + d] = x;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 2. Scores of this work-item's columns: the Q element is loaded once
         *    per d and reused across the N_PER keys. */
        float s[N_PER];
        for (int j = 0; j < N_PER; ++j)
            s[j] = 0.0f;
        for (int d = 0; d < HEAD_DIM; ++d) {
            float qd = q_tile[r * ROW_STRIDE + d];
            for (int j = 0; j < N_PER; ++j)
                s[j] = fma(qd, kv_tile[(t + j * TPR) * ROW_STRIDE + d], s[j]);
        }
        float tile_max = -INFINITY;
        for (int j = 0; j < N_PER; ++j) {
            long key = n0 + t + j * TPR;
            float x = capped ? softcap_log2 * tanh(s[j] * q_mul) : s[j];
            if (!row_valid || key < mine.x || key > mine.y)
                x = -INFINITY;
            s[j] = x;
            tile_max = fmax(tile_max, x);
        }
        red[r * TPR + t] = tile_max;
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 3. Online softmax update. V may now replace K: every score has been
         *    computed before the barrier above. */
        float m_new = m_run;
        for (int u = 0; u < TPR; ++u)
            m_new = fmax(m_new, red[r * TPR + u]);
        /* While the row has seen nothing, m_new is -inf: keep alpha = 1 and
         * p = 0 instead of forming -inf - -inf. */
        const float alpha = m_new == -INFINITY ? 1.0f : exp2((m_run - m_new) * to_log2);
        const float m_scaled = m_new * to_log2;
        float psum = 0.0f;
        for (int j = 0; j < N_PER; ++j) {
            float p = s[j] == -INFINITY ? 0.0f : exp2(fma(s[j], to_log2, -m_scaled));
            s_tile[r * S_STRIDE + t + j * TPR] = p;
            psum += p;
        }
        l_run = l_run * alpha + psum;
        m_run = m_new;
        for (int i = 0; i < D_PER; ++i)
            acc[i] *= alpha;

        for (int idx = lid; idx < BLOCK_N * HEAD_DIM; idx += WG_SIZE) {
            int c = idx / HEAD_DIM, d = idx % HEAD_DIM;
            float x = 0.0f;
            if (n0 + c < nk)
                x = LOAD_ELEM(v, v_base + (ulong)(n0 + c) * v_ss + d);
            kv_tile[c * ROW_STRIDE + d] = x;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 4. acc += P V over this work-item's output columns. */
        for (int c = 0; c < BLOCK_N; ++c) {
            float p = s_tile[r * S_STRIDE + c];
            for (int i = 0; i < D_PER; ++i) {
                int d = t + i * TPR;
                if (d < HEAD_DIM)
                    acc[i] = fma(p, kv_tile[c * ROW_STRIDE + d], acc[i]);
            }
        }
    }

    /* Reduce the partial row sums once. */
    barrier(CLK_LOCAL_MEM_FENCE);
    red[r * TPR + t] = l_run;
    barrier(CLK_LOCAL_MEM_FENCE);
    float l = 0.0f;
    for (int u = 0; u < TPR; ++u)
        l += red[r * TPR + u];

    if (!row_valid)
        return;
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    const ulong o_row = o_off + b * o_sb + hq * o_sh + (ulong)row * o_ss;
    for (int i = 0; i < D_PER; ++i) {
        int d = t + i * TPR;
        if (d < HEAD_DIM)
            STORE_ELEM(o, o_row + d, acc[i] * inv_l);
    }
    if (has_lse && t == 0)
        lse[lse_off + ((ulong)b * get_global_size(1) + hq) * (ulong)nq + row] =
            l > 0.0f ? (m_run * to_log2 + log2(l)) * LN2 : -INFINITY;
}
