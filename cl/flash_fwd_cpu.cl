/* flash_fwd_cpu.cl: FlashAttention forward shaped for CPU OpenCL drivers (PoCL and others).
 *
 * One work-item owns BLOCK_M query rows of one (batch, query head); the
 * work-group is that single work-item, so there are no barriers and the
 * driver's threads each take whole blocks. What a GPU gets from many
 * work-items a CPU gets from SIMD inside one. The query rows are the vector
 * lanes wherever a row-wise quantity is computed, so nothing is ever reduced
 * across lanes and no tile is transposed per key tile:
 *
 *   S[c][rows] += K[c][d] * Q^T[d][rows]    broadcast one K element, LANES rows at once
 *   max, exp2, sum over c                    vertical: one vector op per key
 *   acc[r][d]  += P[c][r] * V[c][d]          broadcast one probability, LANES head dims at once
 *
 * Q is transposed once per block (BLOCK_M*D stores, reused by every tile);
 * K and V are copied as they are stored, converted to float once per tile.
 * The hot loops keep 16 accumulators in registers (QK_KEYS keys x QK_RG row
 * vectors, PV_ROWS rows x PV_CH head-dim vectors): a Zen 4 or Skylake core
 * needs 8 or more independent FMA chains to hide the FMA latency, and one
 * K or V load feeds several FMAs. Explicit vector types: PoCL's loop
 * vectoriser leaves scalar loops scalar here (measured), while float8/16 map
 * straight onto AVX/AVX-512 registers and exp2 on them is vectorised.
 *
 *   __local (one work-item's private scratch, sized for L1/L2):
 *     qt     [HEAD_DIM][RV]      Q^T block, pre-multiplied by q_mul, rowv
 *     k_tile [N_PAD][HEAD_DIM]   K tile, float
 *     v_tile [BLOCK_N][DV]       V tile, head dim zero-padded, rowv
 *     s_tile [N_PAD][RV]         scores, then probabilities, rowv
 *     acc    [M_PAD][DV]         unnormalised output, rowv
 *
 * The online softmax works in base 2 on scores already scaled by
 * q_mul = scale*log2(e) (or by scale/softcap, then softcap*log2(e)*tanh):
 * p = 2^(s - m), rescaling by alpha = 2^(m_old - m_new) once per tile.
 * s - m is exact near m, so p stays exact for scores of any finite size
 * (an fma(s, c, -m*c) form made p 2^+-512 at scores ~1e10). Tiles outside
 * the block's visible keys are skipped; tiles every row sees whole skip the
 * mask; the others mask each row against its own interval. A row with no
 * visible key writes 0 and LSE -inf.
 *
 * FP8 q, k, v (-DQ_FP8 -DKV_FP8, cl/common.cl) are decoded where Q^T and the
 * K and V tiles are converted to float anyway (so __local is unchanged), Q
 * and K times their descale factors (a row's or its block's, a key's); V's,
 * one per (batch, head), multiplies the output with 1/l.
 */

#ifndef HEAD_DIM
#define HEAD_DIM 64 // exact head dimension
#endif
#ifndef BLOCK_M
#define BLOCK_M 32 // query rows per work-item: each K/V element is reused this often
#endif
#ifndef BLOCK_N
#define BLOCK_N 64 // keys per tile
#endif
#ifndef LANES
#define LANES 16 // vector width: query rows per vector, 8 or 16; the host passes FLASHCL_CPU_LANES
#endif

#if LANES == 8
#define rowv float8
#define VLOADV vload8
#define VSTOREV vstore8
#elif LANES == 16
#define rowv float16
#define VLOADV vload16
#define VSTOREV vstore16
#else
#error "LANES is 8 or 16"
#endif

#define RV0 ((BLOCK_M + LANES - 1) / LANES)                 /* row vectors the rows need */
#define QK_RG (RV0 < 4 ? RV0 : 4)                           /* row vectors per pass of the score loop */
#define RV ((RV0 + QK_RG - 1) / QK_RG * QK_RG)              /* row vectors of a block: whole passes */
#define M_PAD (RV * LANES)                                  /* rows, padded to whole vectors */
#define DV ((HEAD_DIM + LANES - 1) / LANES)                 /* head-dim vectors of V and acc */
#define D_PAD (DV * LANES)
#define QK_KEYS 4                                           /* keys per pass of the score loop */
#define N_PAD ((BLOCK_N + QK_KEYS - 1) / QK_KEYS * QK_KEYS)
/* Head-dim vectors per pass of the PV loop: the largest of 8, 4, 2, 1 that
 * divides DV, so no pass needs a guard; two rows share each V load. */
#if DV % 8 == 0
#define PV_CH 8
#elif DV % 4 == 0
#define PV_CH 4
#elif DV % 2 == 0
#define PV_CH 2
#else
#define PV_CH 1
#endif
#define PV_ROWS 2

/* The float offset of key c's probability for row r in s_tile. */
#define P_AT(c, r) ((c) * M_PAD + (r))

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
flash_fwd_cpu(FWD_ARGS FWD_FP8_ARGS) {
    __local rowv qt[HEAD_DIM][RV];
    __local float k_tile[N_PAD][HEAD_DIM];
    __local rowv v_tile[BLOCK_N][DV];
    __local rowv s_tile[N_PAD][RV];
    __local rowv acc[M_PAD][DV];
    __local float alpha_s[M_PAD], lo_rel[M_PAD], hi_rel[M_PAD];
    rowv m_run[RV], l_run[RV];

    /* Causal blocks later in a head see more keys: the driver hands out
     * work-groups in id order, so the last block runs first and the short
     * ones fill the tail. */
    const int m0 = ((int)get_num_groups(0) - 1 - (int)get_group_id(0)) * BLOCK_M;
    const int hq = (int)get_global_id(1);
    const int b = (int)get_global_id(2);
    const int hk = hq / group;
    const int rows = min(BLOCK_M, nq - m0); /* valid rows in this block */
    /* Row vectors holding valid rows, in whole score-loop passes: a short
     * last block (or a decode row) does not pay for BLOCK_M rows. */
    const int rv_used = min(RV, ((rows + LANES - 1) / LANES + QK_RG - 1) / QK_RG * QK_RG);
    const int capped = softcap_log2 > 0.0f;

    const ulong q_base = q_off + b * q_sb + hq * q_sh + (ulong)m0 * q_ss;
    const ulong k_base = k_off + b * k_sb + hk * k_sh;
    const ulong v_base = v_off + b * v_sb + hk * v_sh;
    const int q_sc = FP8_Q_BASE(b, hq), k_sc = FP8_K_BASE(b, hk); /* FP8: this head's descale factors */

    __local float *qtf = (__local float *)qt;
    for (int r = 0; r < M_PAD; ++r)
        for (int d = 0; d < HEAD_DIM; ++d)
            qtf[d * M_PAD + r] =
                r < rows ? LOAD_Q(q, q_base + (ulong)r * q_ss + d) * FP8_Q_SCALE(q_sc, m0 + r) * q_mul : 0.0f;
    for (int r = 0; r < M_PAD; ++r)
        for (int j = 0; j < DV; ++j)
            acc[r][j] = 0.0f;
    for (int g = 0; g < RV; ++g) {
        m_run[g] = -INFINITY;
        l_run[g] = 0.0f;
    }
    /* Visible keys grow with the row index, so the block's union is
     * [lo of the first row, hi of the last], and every row sees
     * [lo of the last row, hi of the first]. */
    const long2 first = visible_keys(m0, nq, nk, win_left, win_right);
    const long2 last = visible_keys(m0 + rows - 1, nq, nk, win_left, win_right);
    const long blk_lo = first.x, blk_hi = last.y;

    for (long n0 = blk_lo <= blk_hi ? (blk_lo / BLOCK_N) * BLOCK_N : blk_hi + 1; n0 <= blk_hi;
         n0 += BLOCK_N) {
        const int n = (int)min((long)BLOCK_N, (long)nk - n0);
        const int full = n == BLOCK_N && n0 >= last.x && n0 + BLOCK_N - 1 <= first.y;
        /* 1. K and V tiles as stored, in float; keys past nk and the
         *    head-dim padding are zero (and the keys masked below). Whole
         *    vectors of 8 convert at once (F16C on x86). */
        for (int c = 0; c < N_PAD; ++c) {
            const ulong kr = k_base + (ulong)(n0 + c) * k_ss, vr = v_base + (ulong)(n0 + c) * v_ss;
            __local float *kd = k_tile[c];
            __local float *vd = (__local float *)v_tile[c < BLOCK_N ? c : 0];
            /* Only keys < nk have a factor; the others are zeroed below. */
            const float ks = KV_FP8 && c < n ? FP8_K_SCALE(k_sc, (int)n0 + c) : 1.0f;
            int d = 0;
            for (; d + 8 <= HEAD_DIM; d += 8) {
                vstore8(c < n ? LOAD_KV8(k, kr + d) * ks : (float8)0.0f, 0, kd + d);
                if (c < BLOCK_N)
                    vstore8(c < n ? LOAD_KV8(v, vr + d) : (float8)0.0f, 0, vd + d);
            }
            for (; d < D_PAD; ++d) {
                const int in = c < n && d < HEAD_DIM;
                if (d < HEAD_DIM)
                    kd[d] = in ? LOAD_KV(k, kr + d) * ks : 0.0f;
                if (c < BLOCK_N)
                    vd[d] = in ? LOAD_KV(v, vr + d) : 0.0f;
            }
        }
        /* 2. Scores, QK_KEYS keys x QK_RG row vectors at a time. */
        for (int c = 0; c < N_PAD; c += QK_KEYS) {
            for (int g = 0; g < rv_used; g += QK_RG) {
                rowv s[QK_KEYS][QK_RG];
#pragma unroll
                for (int x = 0; x < QK_KEYS; ++x)
#pragma unroll
                    for (int u = 0; u < QK_RG; ++u)
                        s[x][u] = 0.0f;
                for (int d = 0; d < HEAD_DIM; ++d) {
                    rowv qv[QK_RG];
#pragma unroll
                    for (int u = 0; u < QK_RG; ++u)
                        qv[u] = qt[d][g + u];
#pragma unroll
                    for (int x = 0; x < QK_KEYS; ++x) {
                        const rowv kx = (rowv)(k_tile[c + x][d]);
#pragma unroll
                        for (int u = 0; u < QK_RG; ++u)
                            s[x][u] = fma(qv[u], kx, s[x][u]);
                    }
                }
#pragma unroll
                for (int x = 0; x < QK_KEYS; ++x)
#pragma unroll
                    for (int u = 0; u < QK_RG; ++u)
                        s_tile[c + x][g + u] = s[x][u];
            }
        }
        /* 3. Mask, soft-cap and the online softmax update, LANES rows at a
         *    time. Key offsets within a tile and the clamped bounds are small
         *    integers: exact in float. */
        if (!full)
            for (int r = 0; r < M_PAD; ++r) {
                const long2 range = r < rows ? visible_keys(m0 + r, nq, nk, win_left, win_right)
                                             : (long2)(1, 0); /* padding rows see nothing */
                lo_rel[r] = (float)clamp(range.x - n0, -1L, (long)BLOCK_N);
                hi_rel[r] = (float)clamp(range.y - n0, -1L, (long)BLOCK_N);
            }
        for (int g = 0; g < rv_used; ++g) {
            rowv vmax = -INFINITY;
            if (full && !capped) {
                for (int c = 0; c < n; ++c)
                    vmax = fmax(vmax, s_tile[c][g]);
            } else {
                const rowv lo_v = VLOADV(g, lo_rel), hi_v = VLOADV(g, hi_rel);
                for (int c = 0; c < BLOCK_N; ++c) {
                    rowv x = s_tile[c][g];
                    if (capped)
                        x = (rowv)softcap_log2 * tanh(x);
                    if (!full)
                        x = select(x, (rowv)(-INFINITY), isless((rowv)c, lo_v) || isgreater((rowv)c, hi_v));
                    s_tile[c][g] = x;
                    vmax = fmax(vmax, x);
                }
            }
            const rowv m_new = fmax(m_run[g], vmax);
            /* Nothing seen yet: subtract 0, not -inf (never -inf - -inf);
             * p and alpha are then 2^-inf = 0, and acc and l were 0. */
            const rowv m_sub = select(m_new, (rowv)0.0f, isequal(m_new, (rowv)(-INFINITY)));
            const rowv alpha = exp2(m_run[g] - m_sub);
            rowv psum = 0.0f;
            const int n_exp = full ? n : BLOCK_N;
            for (int c = 0; c < n_exp; ++c) {
                const rowv p = exp2(s_tile[c][g] - m_sub);
                s_tile[c][g] = p;
                psum += p;
            }
            l_run[g] = l_run[g] * alpha + psum;
            m_run[g] = m_new;
            VSTOREV(alpha, g, alpha_s);
        }
        /* 4. acc = alpha * acc + P V, PV_ROWS rows x PV_CH head-dim vectors
         *    at a time. Keys past n have p = 0 (masked) and V = 0. */
        __local const float *pf = (__local const float *)s_tile;
        for (int r = 0; r < rows; r += PV_ROWS) {
            for (int j0 = 0; j0 < DV; j0 += PV_CH) {
                rowv a[PV_ROWS][PV_CH];
#pragma unroll
                for (int y = 0; y < PV_ROWS; ++y)
#pragma unroll
                    for (int u = 0; u < PV_CH; ++u)
                        a[y][u] = acc[r + y][j0 + u] * alpha_s[r + y];
                for (int c = 0; c < n; ++c) {
                    rowv p[PV_ROWS];
#pragma unroll
                    for (int y = 0; y < PV_ROWS; ++y)
                        p[y] = (rowv)(pf[P_AT(c, r + y)]);
#pragma unroll
                    for (int u = 0; u < PV_CH; ++u) {
                        const rowv vv = v_tile[c][j0 + u];
#pragma unroll
                        for (int y = 0; y < PV_ROWS; ++y)
                            a[y][u] = fma(p[y], vv, a[y][u]);
                    }
                }
#pragma unroll
                for (int y = 0; y < PV_ROWS; ++y)
#pragma unroll
                    for (int u = 0; u < PV_CH; ++u)
                        acc[r + y][j0 + u] = a[y][u];
            }
        }
    }

    /* l and m of each row, as floats (reusing the bound arrays). */
    for (int g = 0; g < RV; ++g) {
        VSTOREV(l_run[g], g, lo_rel);
        VSTOREV(m_run[g], g, hi_rel);
    }
    for (int r = 0; r < rows; ++r) {
        const float l = lo_rel[r];
        const float inv_l = l > 0.0f ? FP8_V_SCALE(b, hk) / l : 0.0f;
        const ulong o_row = o_off + b * o_sb + hq * o_sh + (ulong)(m0 + r) * o_ss;
        __local const float *out_row = (__local const float *)acc[r];
        for (int d = 0; d < HEAD_DIM; ++d)
            STORE_ELEM(o, o_row + d, out_row[d] * inv_l);
        if (has_lse)
            lse[lse_off + ((ulong)b * get_global_size(1) + hq) * (ulong)nq + m0 + r] =
                l > 0.0f ? (hi_rel[r] + log2(l)) * LN2 : -INFINITY;
    }
}
