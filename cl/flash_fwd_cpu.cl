/* flash_fwd_cpu.cl: FlashAttention forward shaped for CPU OpenCL drivers (PoCL and others).
 *
 * One work-item owns BLOCK_M query rows of one (batch, query head); the
 * work-group is that single work-item, so there are no barriers and the
 * driver's threads each take whole blocks. What a GPU gets from many
 * work-items a CPU gets from SIMD inside one: every hot loop below has
 * independent iterations in its innermost dimension, so the compiler
 * vectorises it without reassociating any sum (which would need unsafe-math
 * flags that also break the -inf masks):
 *
 *   S[r][c]   += Q[r][d] * Kt[d][c]     innermost c: K is stored transposed
 *   acc[r][d] += P[r][c] * V[c][d]      innermost d: V as it comes
 *
 *   __local (one work-item's private scratch, sized for L1/L2):
 *     q_tile [BLOCK_M][HEAD_DIM]    Q block, float
 *     kt_tile[HEAD_DIM][BLOCK_N]    K tile, transposed, float
 *     v_tile [BLOCK_N][HEAD_DIM]    V tile, float
 *     s_tile [BLOCK_M][BLOCK_N]     scores, then probabilities
 *     acc    [BLOCK_M][HEAD_DIM]    unnormalised output
 *
 * The online softmax is that of flash_fwd.cl: raw scores s, base-2
 * exponentials p = 2^(s*c - m*c) as one fma (c = scale*log2 e, or 1 after
 * soft-capping), rescaling by alpha = 2^((m_old - m_new)*c) once per tile.
 * Tiles outside the block's visible key range are skipped; inside, each row
 * masks against its own interval. A row with no visible key writes 0 and
 * LSE -inf.
 */

#ifndef HEAD_DIM
#define HEAD_DIM 64 // exact head dimension
#endif
#ifndef BLOCK_M
#define BLOCK_M 16 // query rows per work-item: each K/V element is reused this often
#endif
#ifndef BLOCK_N
#define BLOCK_N 64 // keys per tile: the SIMD dimension of the score loop
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
flash_fwd_cpu(__global const elem_t *restrict q, __global const elem_t *restrict k,
              __global const elem_t *restrict v, __global elem_t *restrict o,
              __global float *restrict lse, ulong q_off, ulong q_sb, ulong q_ss, ulong q_sh,
              ulong k_off, ulong k_sb, ulong k_ss, ulong k_sh, ulong v_off, ulong v_sb, ulong v_ss,
              ulong v_sh, ulong o_off, ulong o_sb, ulong o_ss, ulong o_sh, ulong lse_off,
              int has_lse, int nq, int nk, int group, float q_mul, float softcap_log2,
              int win_left, int win_right) {
    __local float q_tile[BLOCK_M][HEAD_DIM];
    __local float kt_tile[HEAD_DIM][BLOCK_N];
    __local float v_tile[BLOCK_N][HEAD_DIM];
    __local float s_tile[BLOCK_M][BLOCK_N];
    __local float acc[BLOCK_M][HEAD_DIM];
    float m_run[BLOCK_M], l_run[BLOCK_M];
    long lo[BLOCK_M], hi[BLOCK_M];

    const int m0 = (int)get_group_id(0) * BLOCK_M;
    const int hq = (int)get_global_id(1);
    const int b = (int)get_global_id(2);
    const int hk = hq / group;
    const int rows = min(BLOCK_M, nq - m0); /* valid rows in this block */
    const int capped = softcap_log2 > 0.0f;
    const float to_log2 = capped ? 1.0f : q_mul;

    const ulong q_base = q_off + b * q_sb + hq * q_sh + (ulong)m0 * q_ss;
    const ulong k_base = k_off + b * k_sb + hk * k_sh;
    const ulong v_base = v_off + b * v_sb + hk * v_sh;

    for (int r = 0; r < BLOCK_M; ++r) {
        for (int d = 0; d < HEAD_DIM; ++d) {
            q_tile[r][d] = r < rows ? LOAD_ELEM(q, q_base + (ulong)r * q_ss + d) : 0.0f;
            acc[r][d] = 0.0f;
        }
        long2 range = visible_keys(m0 + r, nq, nk, win_left, win_right);
        lo[r] = r < rows ? range.x : 1;
        hi[r] = r < rows ? range.y : 0; /* padding rows see nothing */
        m_run[r] = -INFINITY;
        l_run[r] = 0.0f;
    }
    /* Visible keys grow with the row index, so the block's union is
     * [lo of the first row, hi of the last]. */
    const long blk_lo = lo[0], blk_hi = hi[rows - 1];

    for (long n0 = blk_lo <= blk_hi ? (blk_lo / BLOCK_N) * BLOCK_N : blk_hi + 1; n0 <= blk_hi;
         n0 += BLOCK_N) {
        const int n = (int)min((long)BLOCK_N, (long)nk - n0);
        /* 1. K (transposed) and V tiles; keys past nk are zero and masked. */
        for (int c = 0; c < BLOCK_N; ++c) {
            const ulong kr = k_base + (ulong)(n0 + c) * k_ss, vr = v_base + (ulong)(n0 + c) * v_ss;
            for (int d = 0; d < HEAD_DIM; ++d) {
                kt_tile[d][c] = c < n ? LOAD_ELEM(k, kr + d) : 0.0f;
                v_tile[c][d] = c < n ? LOAD_ELEM(v, vr + d) : 0.0f;
            }
        }
        /* 2. Raw scores, SIMD across the keys of the tile. */
        for (int r = 0; r < BLOCK_M; ++r) {
            float srow[BLOCK_N];
            for (int c = 0; c < BLOCK_N; ++c)
                srow[c] = 0.0f;
            for (int d = 0; d < HEAD_DIM; ++d) {
                const float qd = q_tile[r][d];
                for (int c = 0; c < BLOCK_N; ++c)
                    srow[c] = fma(qd, kt_tile[d][c], srow[c]);
            }
            /* 3. Mask, soft-cap and the online softmax update of row r. */
            float tile_max = -INFINITY;
            for (int c = 0; c < BLOCK_N; ++c) {
                const long key = n0 + c;
                float x = capped ? softcap_log2 * tanh(srow[c] * q_mul) : srow[c];
                x = (key < lo[r] || key > hi[r]) ? -INFINITY : x;
                srow[c] = x;
                tile_max = fmax(tile_max, x);
            }
            const float m_new = fmax(m_run[r], tile_max);
            /* Nothing seen yet: keep alpha = 1, p = 0 (never -inf - -inf). */
            const float alpha = m_new == -INFINITY ? 1.0f : exp2((m_run[r] - m_new) * to_log2);
            const float m_scaled = m_new * to_log2;
            float psum = 0.0f;
            for (int c = 0; c < BLOCK_N; ++c) {
                const float p = srow[c] == -INFINITY ? 0.0f : exp2(fma(srow[c], to_log2, -m_scaled));
                s_tile[r][c] = p;
                psum += p;
            }
            l_run[r] = l_run[r] * alpha + psum;
            m_run[r] = m_new;
            for (int d = 0; d < HEAD_DIM; ++d)
                acc[r][d] *= alpha;
        }
        /* 4. acc += P V, SIMD across the head dimension. */
        for (int r = 0; r < BLOCK_M; ++r)
            for (int c = 0; c < n; ++c) {
                const float p = s_tile[r][c];
                for (int d = 0; d < HEAD_DIM; ++d)
                    acc[r][d] = fma(p, v_tile[c][d], acc[r][d]);
            }
    }

    for (int r = 0; r < rows; ++r) {
        const float l = l_run[r];
        const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
        const ulong o_row = o_off + b * o_sb + hq * o_sh + (ulong)(m0 + r) * o_ss;
        for (int d = 0; d < HEAD_DIM; ++d)
            STORE_ELEM(o, o_row + d, acc[r][d] * inv_l);
        if (has_lse)
            lse[lse_off + ((ulong)b * get_global_size(1) + hq) * (ulong)nq + m0 + r] =
                l > 0.0f ? (m_run[r] * to_log2 + log2(l)) * LN2 : -INFINITY;
    }
}
