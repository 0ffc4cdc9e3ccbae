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

/* CPU_VEC, CPU_NV, CPU_CHUNK, CPU_DV, CPU_D_PAD: the float8 layout, in common.cl. */
#if BLOCK_N % 8 != 0
#error "BLOCK_N must be a multiple of 8"
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
flash_fwd_cpu(FWD_ARGS) {
    __local float q_tile[BLOCK_M][HEAD_DIM];
    __local float8 kt_tile[HEAD_DIM][CPU_NV]; /* K transposed: keys along the vector */
    __local float8 v_tile[BLOCK_N][CPU_DV];   /* V: head dim along the vector       */
    __local float s_tile[BLOCK_M][BLOCK_N];
    __local float8 acc[BLOCK_M][CPU_DV];
    float m_run[BLOCK_M], l_run[BLOCK_M];
    long lo[BLOCK_M], hi[BLOCK_M];

    const int m0 = (int)get_group_id(0) * BLOCK_M;
    const int hq = (int)get_global_id(1);
    const int b = (int)get_global_id(2);
    const int hk = hq / group;
    const int rows = min(BLOCK_M, nq - m0); /* valid rows in this block */
    const int capped = softcap_log2 > 0.0f;
    const float to_log2 = capped ? 1.0f : q_mul;
    const float8 lane = (float8)(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);

    const ulong q_base = q_off + b * q_sb + hq * q_sh + (ulong)m0 * q_ss;
    const ulong k_base = k_off + b * k_sb + hk * k_sh;
    const ulong v_base = v_off + b * v_sb + hk * v_sh;

    for (int r = 0; r < BLOCK_M; ++r) {
        for (int d = 0; d < HEAD_DIM; ++d)
            q_tile[r][d] = r < rows ? LOAD_ELEM(q, q_base + (ulong)r * q_ss + d) : 0.0f;
        for (int j = 0; j < CPU_DV; ++j)
            acc[r][j] = 0.0f;
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
        /* 1. K (transposed) and V tiles; keys past nk and the head-dim
         *    padding are zero (and the keys masked below). */
        __local float *kt = (__local float *)kt_tile;
        __local float *vt = (__local float *)v_tile;
        /* Whole vectors of 8 convert at once (F16C on x86); the ragged end of
         * an odd head dim goes element by element. */
        for (int c = 0; c < BLOCK_N; ++c) {
            const ulong kr = k_base + (ulong)(n0 + c) * k_ss, vr = v_base + (ulong)(n0 + c) * v_ss;
            int d = 0;
            for (; d + CPU_VEC <= HEAD_DIM; d += CPU_VEC) {
                const float8 kx = c < n ? LOAD_ELEM8(k, kr + d) : (float8)0.0f;
                v_tile[c][d / CPU_VEC] = c < n ? LOAD_ELEM8(v, vr + d) : (float8)0.0f;
                kt[(d + 0) * BLOCK_N + c] = kx.s0;
                kt[(d + 1) * BLOCK_N + c] = kx.s1;
                kt[(d + 2) * BLOCK_N + c] = kx.s2;
                kt[(d + 3) * BLOCK_N + c] = kx.s3;
                kt[(d + 4) * BLOCK_N + c] = kx.s4;
                kt[(d + 5) * BLOCK_N + c] = kx.s5;
                kt[(d + 6) * BLOCK_N + c] = kx.s6;
                kt[(d + 7) * BLOCK_N + c] = kx.s7;
            }
            for (; d < CPU_D_PAD; ++d) {
                const int in = c < n && d < HEAD_DIM;
                if (d < HEAD_DIM)
                    kt[d * BLOCK_N + c] = in ? LOAD_ELEM(k, kr + d) : 0.0f;
                vt[c * CPU_D_PAD + d] = in ? LOAD_ELEM(v, vr + d) : 0.0f;
            }
        }
        for (int r = 0; r < BLOCK_M; ++r) {
            /* 2. Raw scores of row r, one vector of 8 keys at a time. */
            /* The unrolled j loops keep sv[] in registers: CPU_NV independent
             * fma chains. Left rolled, sv[] lived on the stack and every fma
             * waited on a store-to-load round trip (measured with perf). */
            float8 sv[CPU_NV];
#pragma unroll
            for (int j = 0; j < CPU_NV; ++j)
                sv[j] = 0.0f;
            for (int d = 0; d < HEAD_DIM; ++d) {
                const float8 qd = (float8)(q_tile[r][d]);
#pragma unroll
                for (int j = 0; j < CPU_NV; ++j)
                    sv[j] = fma(qd, kt_tile[d][j], sv[j]);
            }
            /* 3. Mask, soft-cap and the online softmax update of row r. */
            const float8 lo_v = (float8)((float)(lo[r] - n0)), hi_v = (float8)((float)(hi[r] - n0));
            float8 vmax = (float8)(-INFINITY);
            for (int j = 0; j < CPU_NV; ++j) {
                /* Key offsets within a tile are < 2^24: exact in float. */
                const float8 key = lane + (float8)((float)(j * CPU_VEC));
                float8 x = capped ? (float8)softcap_log2 * tanh(sv[j] * (float8)q_mul) : sv[j];
                x = select(x, (float8)(-INFINITY), isless(key, lo_v) || isgreater(key, hi_v));
                sv[j] = x;
                vmax = fmax(vmax, x);
            }
            vmax.lo = fmax(vmax.lo, vmax.hi);
            vmax.s01 = fmax(vmax.s01, vmax.s23);
            const float m_new = fmax(m_run[r], fmax(vmax.s0, vmax.s1));
            /* Nothing seen yet: keep alpha = 1, p = 0 (never -inf - -inf). */
            const float alpha = m_new == -INFINITY ? 1.0f : exp2((m_run[r] - m_new) * to_log2);
            /* (s - m) * to_log2, not fma(s, to_log2, -m * to_log2): those two
             * roundings differ by half an ulp of m*to_log2, which at m ~ 1e10
             * made p 2^+-512 (0 or inf). s - m is exact near m. */
            const float8 m_v = (float8)(m_new == -INFINITY ? 0.0f : m_new);
            float8 psum = 0.0f;
            for (int j = 0; j < CPU_NV; ++j) {
                float8 p = exp2((sv[j] - m_v) * (float8)to_log2);
                p = select(p, (float8)0.0f, isequal(sv[j], (float8)(-INFINITY)));
                vstore8(p, j, &s_tile[r][0]);
                psum += p;
            }
            psum.lo += psum.hi;
            psum.s01 += psum.s23;
            l_run[r] = l_run[r] * alpha + psum.s0 + psum.s1;
            m_run[r] = m_new;
            /* 4. acc = alpha * acc + P V, one vector of 8 head dims at a time. */
            for (int j0 = 0; j0 < CPU_DV; j0 += CPU_CHUNK) {
                float8 a[CPU_CHUNK];
#pragma unroll
                for (int u = 0; u < CPU_CHUNK; ++u)
                    a[u] = acc[r][j0 + u] * alpha;
                for (int c = 0; c < n; ++c) {
                    const float8 p = (float8)(s_tile[r][c]);
#pragma unroll
                    for (int u = 0; u < CPU_CHUNK; ++u)
                        a[u] = fma(p, v_tile[c][j0 + u], a[u]);
                }
#pragma unroll
                for (int u = 0; u < CPU_CHUNK; ++u)
                    acc[r][j0 + u] = a[u];
            }
        }
    }

    for (int r = 0; r < rows; ++r) {
        const float l = l_run[r];
        const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
        const ulong o_row = o_off + b * o_sb + hq * o_sh + (ulong)(m0 + r) * o_ss;
        __local const float *out_row = (__local const float *)acc[r];
        for (int d = 0; d < HEAD_DIM; ++d)
            STORE_ELEM(o, o_row + d, out_row[d] * inv_l);
        if (has_lse)
            lse[lse_off + ((ulong)b * get_global_size(1) + hq) * (ulong)nq + m0 + r] =
                l > 0.0f ? (m_run[r] * to_log2 + log2(l)) * LN2 : -INFINITY;
    }
}
