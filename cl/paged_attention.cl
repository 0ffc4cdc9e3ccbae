/* paged_attention.cl: attention of packed variable-length queries over paged or packed K/V, with split-KV.
 *
 * One launch serves a batch of sequences of different lengths:
 *   q, out: [total_q][heads_q][head_dim]  tokens of all sequences back to back
 *           (offset + token and head strides), sequence i owning tokens
 *           [q_start_i, q_start_i + nq_i)
 *   K/V of sequence i, key n (0 <= n < nk_i), is row kr(n) of k and v:
 *     paged (page_size > 0): the KV pool [num_pages][page_size][heads_k][head_dim],
 *                            kr(n) = table_i[n / page_size] * page_size + n % page_size
 *     packed (page_size 0):  flash-attn's varlen layout, kr(n) = k_start_i + n
 *   meta (int): per sequence {q_start, nq, k_base, nk}, where k_base is the
 *     index of the sequence's page table inside `tables` (paged: the KV
 *     cache's device copy of every table) or k_start (packed); at blocks_off
 *     a list of work blocks {sequence, first row}. The host builds it per call.
 *
 * Grid: (block, kv head, split). A block is BLOCK_M "rows" of one sequence,
 * a row being one (query token, query head) pair of the kv head:
 *
 *   row r -> token r / group, query head hk * group + r % group
 *
 * so for decoding (nq = 1) one work-group holds all `group` query heads that
 * share a kv head and every K/V element it loads serves all of them (GQA
 * reuse; the score tile is a small GEMM instead of a dot per head). A long
 * prompt simply becomes several blocks. The list of blocks holds only real
 * ones, so mixed lengths waste no work-groups.
 *
 * Split-KV (flash-decoding): with `splits` > 1 the keys of a sequence are cut
 * into `splits` slices of `chunk` keys (a multiple of BLOCK_N, the same for all
 * blocks of that sequence); split s handles keys [s*chunk, (s+1)*chunk) and
 * writes its normalised partial output and LSE in float to
 *   part_o [split][token][heads_q][head_dim],  part_lse [split][token][heads_q]
 * (both in one scratch buffer, part_lse from element part_lse_off)
 * which attn_combine (merge.cl) merges exactly. With one split the kernel
 * writes out and lse ([heads_q][total_q], flash-attn's varlen LSE) itself.
 *
 * The inner loop is flash_fwd.cl's: TPR work-items per row, raw scores, base-2
 * online softmax as one fma per probability, K then V through one __local
 * tile. Causal masks are bottom-right aligned per sequence: token t sees keys
 * [0, nk - nq + t]. A row (or a split) that sees no key writes O = 0 and
 * LSE = -inf, which merging treats as "contributes nothing".
 *
 * FP8 pages (-DKV_FP8, common.cl): K and V are bytes, decoded into the float
 * tile as they are staged (LOAD_KV), so __local holds floats either way; the
 * kv head's k descale multiplies q_mul and its v descale the output.
 */

#ifndef HEAD_DIM
#define HEAD_DIM 128 // exact head dimension (compile-time: loops unroll)
#endif
#ifndef BLOCK_M
#define BLOCK_M 4 // rows (token x query head of one kv head) per work-group
#endif
#ifndef BLOCK_N
#define BLOCK_N 32 // keys per __local tile
#endif
#ifndef TPR
#define TPR 32 // work-items per row
#endif

#define WG_SIZE (BLOCK_M * TPR)
#define D_PER ((HEAD_DIM + TPR - 1) / TPR)
#define N_PER (BLOCK_N / TPR)
/* +1 float per row so the TPR work-items of a row, which read different key
 * rows at the same d, do not all hit one bank when HEAD_DIM is a multiple of it. */
#define ROW_STRIDE (HEAD_DIM + 1)
#define S_STRIDE (BLOCK_N + 1)

#if BLOCK_N % TPR != 0
#error "BLOCK_N must be a multiple of TPR"
#endif

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
paged_attention(SERVING_ARGS) {
    __local float q_tile[BLOCK_M * ROW_STRIDE];
    __local float kv_tile[BLOCK_N * ROW_STRIDE];
    __local float s_tile[BLOCK_M * S_STRIDE];
    __local float red[BLOCK_M * TPR];
    __local long key_row[BLOCK_N];

    const int lid = (int)get_local_id(0);
    const int r = lid / TPR, t = lid % TPR;
    const int blk = (int)get_group_id(0);
    const int hk = (int)get_global_id(1);
    const int split = (int)get_global_id(2), splits = (int)get_global_size(2);
    const serving_block b = serving_block_at(meta, blocks_off, blk);
    const int m0 = b.m0, q_start = b.q_start, nq = b.nq, k_base = b.k_base, nk = b.nk;
    const int rows = nq * group;
    const int row = m0 + r;
    const int row_valid = row < rows;
    const int tok = min(row, rows - 1) / group; /* clamped: padding rows alias a real one */
    const int hq = hk * group + min(row, rows - 1) % group;

    for (int idx = lid; idx < BLOCK_M * HEAD_DIM; idx += WG_SIZE) {
        const int rr = m0 + idx / HEAD_DIM, d = idx % HEAD_DIM;
        float x = 0.0f;
        if (rr < rows)
            x = LOAD_ELEM(q, q_off + (ulong)(q_start + rr / group) * q_ss +
                                 (ulong)(hk * group + rr % group) * q_sh + d);
        q_tile[(idx / HEAD_DIM) * ROW_STRIDE + d] = x;
    }

    /* Visible keys: [0, hi]. Rows are ordered by token, so the block's last
     * valid row has the largest hi. long: nk - nq + t may be negative. */
    const long shift = causal ? (long)nk - nq : (long)nk;
    const long my_hi = causal ? min(shift + tok, (long)nk - 1) : (long)nk - 1;
    const long blk_hi =
        causal ? min(shift + (min(m0 + BLOCK_M, rows) - 1) / group, (long)nk - 1) : (long)nk - 1;
    /* This split's slice; every block of the sequence cuts at the same keys. */
    const long chunk = (((long)nk + splits - 1) / splits + BLOCK_N - 1) / BLOCK_N * BLOCK_N;
    const long s_lo = (long)split * chunk;
    const long s_hi = min(s_lo + chunk - 1, blk_hi);
    const long row_hi = row_valid ? min(my_hi, s_hi) : -1;

    float acc[D_PER];
    for (int i = 0; i < D_PER; ++i)
        acc[i] = 0.0f;
    const int capped = softcap_log2 > 0.0f;
    /* scale * log2e (or scale / softcap) times the kv head's k descale: the
     * scores of keys stored as descale * decode(byte). */
    const float kq_mul = q_mul * K_DESCALE(hk);
    const float to_log2 = capped ? 1.0f : kq_mul;
    float m_run = -INFINITY, l_run = 0.0f;

    for (long n0 = s_lo; n0 <= s_hi; n0 += BLOCK_N) {
        /* 0. Where this tile's keys live. One table lookup per key, shared by
         *    the whole work-group; -1 marks keys past the slice. */
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int c = lid; c < BLOCK_N; c += WG_SIZE) {
            const long n = n0 + c;
            long kr = -1;
            if (n <= s_hi)
                kr = page_size ? (long)tables[k_base + (int)(n / page_size)] * page_size + n % page_size
                               : (long)k_base + n;
            key_row[c] = kr;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* 1. K tile. */
        for (int idx = lid; idx < BLOCK_N * HEAD_DIM; idx += WG_SIZE) {
            const int c = idx / HEAD_DIM, d = idx % HEAD_DIM;
            const long kr = key_row[c];
            kv_tile[c * ROW_STRIDE + d] =
                kr >= 0 ? LOAD_KV(k, k_off + (ulong)kr * k_ss + (ulong)hk * k_sh + d) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 2. Scores of this work-item's columns; mask; partial row max. */
        float s[N_PER];
        for (int j = 0; j < N_PER; ++j)
            s[j] = 0.0f;
        for (int d = 0; d < HEAD_DIM; ++d) {
            const float qd = q_tile[r * ROW_STRIDE + d];
            for (int j = 0; j < N_PER; ++j)
                s[j] = fma(qd, kv_tile[(t + j * TPR) * ROW_STRIDE + d], s[j]);
        }
        float tile_max = -INFINITY;
        for (int j = 0; j < N_PER; ++j) {
            const long key = n0 + t + j * TPR;
            float x = capped ? softcap_log2 * tanh(s[j] * kq_mul) : s[j];
            if (key > row_hi)
                x = -INFINITY;
            s[j] = x;
            tile_max = fmax(tile_max, x);
        }
        red[r * TPR + t] = tile_max;
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 3. Online softmax; then V replaces K (all scores are done). */
        float m_new = m_run;
        for (int u = 0; u < TPR; ++u)
            m_new = fmax(m_new, red[r * TPR + u]);
        const float alpha = m_new == -INFINITY ? 1.0f : exp2((m_run - m_new) * to_log2);
        float psum = 0.0f;
        for (int j = 0; j < N_PER; ++j) {
            /* (s - m) * to_log2: an fma against a separately rounded m*to_log2
             * is off by 2^+-512 at scores ~ 1e10 (see flash_fwd.cl). */
            const float p = s[j] == -INFINITY ? 0.0f : exp2((s[j] - m_new) * to_log2);
            s_tile[r * S_STRIDE + t + j * TPR] = p;
            psum += p;
        }
        l_run = l_run * alpha + psum;
        m_run = m_new;
        for (int i = 0; i < D_PER; ++i)
            acc[i] *= alpha;
        for (int idx = lid; idx < BLOCK_N * HEAD_DIM; idx += WG_SIZE) {
            const int c = idx / HEAD_DIM, d = idx % HEAD_DIM;
            const long kr = key_row[c];
            kv_tile[c * ROW_STRIDE + d] =
                kr >= 0 ? LOAD_KV(v, v_off + (ulong)kr * v_ss + (ulong)hk * v_sh + d) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 4. acc += P V over this work-item's output columns. */
        for (int c = 0; c < BLOCK_N; ++c) {
            const float p = s_tile[r * S_STRIDE + c];
            for (int i = 0; i < D_PER; ++i) {
                const int d = t + i * TPR;
                if (d < HEAD_DIM)
                    acc[i] = fma(p, kv_tile[c * ROW_STRIDE + d], acc[i]);
            }
        }
    }

    barrier(CLK_LOCAL_MEM_FENCE);
    red[r * TPR + t] = l_run;
    barrier(CLK_LOCAL_MEM_FENCE);
    float l = 0.0f;
    for (int u = 0; u < TPR; ++u)
        l += red[r * TPR + u];
    if (!row_valid)
        return;
    const float inv_l = l > 0.0f ? V_DESCALE(hk) / l : 0.0f; /* V_DESCALE: 1 unless FP8 pages */
    const float row_lse = l > 0.0f ? (m_run * to_log2 + log2(l)) * LN2 : -INFINITY;
    const ulong token = (ulong)(q_start + tok);
    if (splits == 1) {
        const ulong o_row = o_off + token * o_ss + (ulong)hq * o_sh;
        for (int i = 0; i < D_PER; ++i) {
            const int d = t + i * TPR;
            if (d < HEAD_DIM)
                STORE_ELEM(o, o_row + d, acc[i] * inv_l);
        }
        if (has_lse && t == 0)
            lse[lse_off + (ulong)hq * total_q + token] = row_lse;
    } else {
        /* Partial results stay in float: they are merged, then rounded once. */
        const ulong prow = ((ulong)split * total_q + token) * heads_q + hq;
        for (int i = 0; i < D_PER; ++i) {
            const int d = t + i * TPR;
            if (d < HEAD_DIM)
                part[prow * HEAD_DIM + d] = acc[i] * inv_l;
        }
        if (t == 0)
            part[part_lse_off + prow] = row_lse;
    }
}
