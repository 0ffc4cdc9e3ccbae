/* flash_bwd_cpu.cl: the backward's dK/dV (with atomic dQ) and deterministic dQ kernels shaped for CPUs.
 *
 * The math is flash_bwd.cl's (see there): with s = scale * q.k (soft-capped
 * c * tanh(s / c)), P = exp(s - LSE), D_i = rowsum(dO_i * O_i),
 *   dV += P^T dO,  dS = P * (dO.v - D) * g * scale,  dK += dS^T Q,  dQ += dS K.
 * Only the shape differs, as flash_fwd_cpu.cl's does from flash_fwd.cl's:
 * one work-item owns BLOCK_N keys of one (batch, kv head) (flash_bwd_dkdv_cpu)
 * or BLOCK_M query rows of one (batch, query head) (flash_bwd_dq_cpu, the
 * deterministic dQ pass), the work-group is that single work-item (no
 * barriers: the driver's threads take whole blocks), and every hot loop has
 * independent float8 lanes innermost so it maps onto AVX registers without
 * reassociating a sum:
 *
 *   S[r][c]  += Q[r][d]  * Kt[d][c]     innermost c (keys): K transposed
 *   dP[r][c] += dO[r][d] * Vt[d][c]     innermost c: V transposed
 *   dV[c][d] += P[r][c]  * dO[r][d]     innermost d (head dim)
 *   dK[c][d] += dS[r][c] * Q[r][d]      innermost d
 *   dQ[r][d] += dS[r][c] * K[c][d]      innermost d, then float atomics
 *
 *   __local (one work-item's scratch; PoCL gives CPUs megabytes):
 *     kt_tile, vt_tile [HEAD_DIM][BLOCK_N]   K, V transposed (fixed)
 *     k_tile           [BLOCK_N][CPU_D_PAD]  K as it comes (fixed, for dQ)
 *     dk_acc, dv_acc   [BLOCK_N][CPU_D_PAD]  the block's gradients
 *     q_tile, do_tile  [BLOCK_M][CPU_D_PAD]  one query tile (streamed)
 *     p_tile, ds_tile  [BLOCK_M][BLOCK_N]    its P and dS
 *   the dQ pass: the same K/V tiles (streamed), Q and dO (fixed), dq_acc
 *   [BLOCK_M][CPU_D_PAD] in place of dK and dV.
 *
 * The dK/dV work-item loops over the `group` query heads sharing its kv head
 * and over the BLOCK_M-row query tiles that see any of its keys, so each
 * dK/dV element has one writer and a fixed summation order; the dQ
 * work-item loops over the BLOCK_N-key tiles its rows see, in order. Masks
 * and empty rows are flash_bwd.cl's: a masked pair, a padding row or key and
 * a row whose LSE is -inf get P = dS = 0. Arguments are flash_bwd_dkdv's and
 * flash_bwd_dq's (common.cl's lists), so the host launches either variant
 * the same way (src/backward.c); the D pre-pass and the atomic mode's dQ
 * store are flash_bwd.cl's kernels. BWD_KERNEL (2: dK/dV, 3: dQ) picks the
 * kernel a build holds, as there.
 */

#ifndef HEAD_DIM
#define HEAD_DIM 64 // exact head dimension
#endif
#ifndef BLOCK_M
#define BLOCK_M 64 // query rows per tile (dK/dV: streamed; dQ: per work-item)
#endif
#ifndef BLOCK_N
#define BLOCK_N 64 // keys per tile (dK/dV: per work-item; dQ: streamed), the score loops' SIMD dimension
#endif

#if BLOCK_N % 8 != 0 /* the vector layout: common.cl */
#error "BLOCK_N must be a multiple of 8"
#endif

/* One row of HEAD_DIM elements (zero when !in) into a padded float row. */
inline void load_row(__local float *dst, __global const elem_t *x, ulong at, int in) {
    int d = 0;
    for (; d + CPU_VEC <= HEAD_DIM; d += CPU_VEC)
        vstore8(in ? LOAD_ELEM8(x, at + d) : (float8)0.0f, 0, dst + d);
    for (; d < CPU_D_PAD; ++d)
        dst[d] = in && d < HEAD_DIM ? LOAD_ELEM(x, at + d) : 0.0f;
}

/* dst[d][c] = src[c][d] for the block's keys: the score loops' layout. */
inline void transpose_tile(__local float *dst, __local const float *src) {
    for (int c = 0; c < BLOCK_N; ++c)
        for (int d = 0; d < HEAD_DIM; ++d)
            dst[d * BLOCK_N + c] = src[c * CPU_D_PAD + d];
}

/* acc[c][:] += sum over rows r of w[r][c] * x[r][:], for the block's n keys,
 * rows summed in order (the one-writer order that keeps dK, dV deterministic). */
inline void accumulate_keys(__local float8 (*acc)[CPU_DV], __local const float (*w)[BLOCK_N],
                            __local const float8 (*x)[CPU_DV], int n, int rows) {
    for (int c = 0; c < n; ++c)
        for (int j0 = 0; j0 < CPU_DV; j0 += CPU_CHUNK) {
            float8 a[CPU_CHUNK];
#pragma unroll
            for (int u = 0; u < CPU_CHUNK; ++u)
                a[u] = acc[c][j0 + u];
            for (int r = 0; r < rows; ++r) {
                const float8 wv = (float8)(w[r][c]);
#pragma unroll
                for (int u = 0; u < CPU_CHUNK; ++u)
                    a[u] = fma(wv, x[r][j0 + u], a[u]);
            }
#pragma unroll
            for (int u = 0; u < CPU_CHUNK; ++u)
                acc[c][j0 + u] = a[u];
        }
}

/* K and V of keys n0 .. n0 + n - 1 (zero past n): K as it comes into k_tile
 * (for dQ), K and V transposed into kt, vt (for S, dP); stage is scratch of
 * BLOCK_N x CPU_DV float8 that V passes through. */
inline void load_keys(__local float8 (*k_tile)[CPU_DV], __local float8 (*kt)[CPU_NV], __local float8 (*vt)[CPU_NV],
                      __local float8 (*stage)[CPU_DV], __global const elem_t *k, ulong k_row0, ulong k_ss,
                      __global const elem_t *v, ulong v_row0, ulong v_ss, int n) {
    for (int c = 0; c < BLOCK_N; ++c) {
        load_row((__local float *)k_tile[c], k, k_row0 + (ulong)c * k_ss, c < n);
        load_row((__local float *)stage[c], v, v_row0 + (ulong)c * v_ss, c < n);
    }
    transpose_tile((__local float *)kt, (__local const float *)k_tile);
    transpose_tile((__local float *)vt, (__local const float *)stage);
}

/* Rows m0 .. m0 + BLOCK_M - 1 of one (batch, query head): Q and dO (zero
 * past nq), LSE in log2 units, D_i and the visible keys [lo, hi] (lo > hi
 * for padding rows and rows whose LSE is -inf: they see nothing). */
inline void load_queries(__local float8 (*q_tile)[CPU_DV], __local float8 (*do_tile)[CPU_DV], float *lse2,
                         float *di, long *lo, long *hi, __global const elem_t *q, ulong q_row0, ulong q_ss,
                         __global const elem_t *dout, ulong do_row0, ulong do_ss, __global const float *lse,
                         ulong lse_row0, __global const float *scratch, ulong di_row0, long m0, int nq, int nk,
                         int win_left, int win_right) {
    const int rows = (int)min((long)BLOCK_M, (long)nq - m0);
    for (int r = 0; r < BLOCK_M; ++r) {
        const long i = m0 + r;
        load_row((__local float *)q_tile[r], q, q_row0 + (ulong)i * q_ss, r < rows);
        load_row((__local float *)do_tile[r], dout, do_row0 + (ulong)i * do_ss, r < rows);
        const float l = r < rows ? lse[lse_row0 + i] : -INFINITY;
        long2 vis = visible_keys(i, nq, nk, win_left, win_right);
        if (l == -INFINITY)
            vis = (long2)(1, 0);
        lse2[r] = l == -INFINITY ? 0.0f : l * LOG2E;
        di[r] = r < rows ? scratch[di_row0 + i] : 0.0f;
        lo[r] = vis.x;
        hi[r] = vis.y;
    }
}

/* 1 when a row seeing keys [lo, hi] sees any of n0 .. n0 + n - 1. */
inline int sees_block(long lo, long hi, long n0, int n) {
    return lo <= hi && hi >= n0 && lo < n0 + n;
}

/* P and dS (scale and the soft-cap derivative folded in) of one query row
 * (qr, gr: its Q and dO) against the keys of kt, vt, which start at key n0;
 * keys outside [lo, hi] get 0. flash_bwd.cl's score_tile, 8 keys a lane. */
inline void score_row(__local float *p_row, __local float *ds_row, __local const float *qr,
                      __local const float *gr, __local const float8 (*kt)[CPU_NV],
                      __local const float8 (*vt)[CPU_NV], long lo, long hi, long n0, float lse2, float di,
                      float scale, float softcap) {
    const float8 lane = (float8)(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
    /* Unrolled j loops keep sv[], dpv[] in registers (see flash_fwd_cpu.cl:
     * rolled, they lived on the stack). */
    float8 sv[CPU_NV], dpv[CPU_NV];
#pragma unroll
    for (int j = 0; j < CPU_NV; ++j)
        sv[j] = dpv[j] = 0.0f;
    for (int d = 0; d < HEAD_DIM; ++d) {
        const float8 qd = (float8)(qr[d]), gd = (float8)(gr[d]);
#pragma unroll
        for (int j = 0; j < CPU_NV; ++j) {
            sv[j] = fma(qd, kt[d][j], sv[j]);
            dpv[j] = fma(gd, vt[d][j], dpv[j]);
        }
    }
    /* Key offsets within a block are < 2^24: exact in float. */
    const float8 lo_v = (float8)((float)max(lo - n0, -1L)), hi_v = (float8)((float)min(hi - n0, (long)BLOCK_N));
    const float8 l2 = (float8)(lse2), di8 = (float8)(di);
    for (int j = 0; j < CPU_NV; ++j) {
        const float8 key = lane + (float8)((float)(j * CPU_VEC));
        float8 p, g = 1.0f;
        if (softcap > 0.0f) {
            const float8 t = tanh(sv[j] * (float8)(scale / softcap));
            p = exp2(fma((float8)softcap * t, (float8)LOG2E, -l2));
            g = fma(-t, t, (float8)1.0f); /* d/ds of c*tanh(s/c) */
        } else {
            p = exp2(fma(sv[j], (float8)(scale * LOG2E), -l2));
        }
        const float8 ds = p * (dpv[j] - di8) * g * (float8)scale;
        const int8 masked = isless(key, lo_v) || isgreater(key, hi_v);
        vstore8(select(p, (float8)0.0f, masked), j, p_row);
        vstore8(select(ds, (float8)0.0f, masked), j, ds_row);
    }
}

/* a[u] += sum over the n keys c of w[c] * x[c][j0 + u] (dS K for one row),
 * keys summed in order. */
inline void row_times_keys(float8 *a, __local const float *w, __local const float8 (*x)[CPU_DV], int n,
                           int j0) {
    for (int c = 0; c < n; ++c) {
        const float8 wc = (float8)(w[c]);
#pragma unroll
        for (int u = 0; u < CPU_CHUNK; ++u)
            a[u] = fma(wc, x[c][j0 + u], a[u]);
    }
}

#if !defined(BWD_KERNEL) || BWD_KERNEL == 2
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void flash_bwd_dkdv_cpu(BWD_DKDV_ARGS) {
    __local float8 kt_tile[HEAD_DIM][CPU_NV], vt_tile[HEAD_DIM][CPU_NV];
    __local float8 k_tile[BLOCK_N][CPU_DV], dk_acc[BLOCK_N][CPU_DV], dv_acc[BLOCK_N][CPU_DV];
    __local float8 q_tile[BLOCK_M][CPU_DV], do_tile[BLOCK_M][CPU_DV];
    __local float p_tile[BLOCK_M][BLOCK_N], ds_tile[BLOCK_M][BLOCK_N];
    float lse2[BLOCK_M], di[BLOCK_M];
    long lo[BLOCK_M], hi[BLOCK_M];

    const int n0 = (int)get_group_id(0) * BLOCK_N;
    const int hk = (int)get_global_id(1), b = (int)get_global_id(2);
    const int heads_q = (int)get_global_size(1) * group;
    const int n = min(BLOCK_N, nk - n0); /* valid keys in this block */
    const long shift = (long)nk - (long)nq;

    /* 1. K and V once (dv_acc is the staging tile, then starts at zero). */
    load_keys(k_tile, kt_tile, vt_tile, dv_acc, k, ROW_AT(k, b, n0, hk), k_ss, v, ROW_AT(v, b, n0, hk), v_ss, n);
    for (int c = 0; c < BLOCK_N; ++c)
        for (int j = 0; j < CPU_DV; ++j)
            dk_acc[c][j] = dv_acc[c][j] = 0.0f;

    /* Rows that see any key of [n0, n0 + n - 1] (flash_bwd_dkdv's bounds). */
    const long n_last = (long)n0 + n - 1;
    const long i_lo = max(win_right < 0 ? 0L : (long)n0 - win_right - shift, 0L);
    const long i_hi = min(win_left < 0 ? (long)nq - 1 : n_last + win_left - shift, (long)nq - 1);

    for (int hh = 0; hh < group; ++hh) {
        const int hq = hk * group + hh;
        const ulong row0 = ((ulong)b * heads_q + hq) * (ulong)nq; /* this head's first LSE / D row */
        for (long m0 = (i_lo / BLOCK_M) * BLOCK_M; m0 <= i_hi; m0 += BLOCK_M) {
            const int rows = (int)min((long)BLOCK_M, (long)nq - m0);
            /* 2. The query tile. */
            load_queries(q_tile, do_tile, lse2, di, lo, hi, q, ROW_AT(q, b, 0, hq), q_ss, dout,
                         ROW_AT(dout, b, 0, hq), dout_ss, lse, lse_off + row0, scratch, di_off + row0, m0, nq, nk,
                         win_left, win_right);
            /* 3. Per row: P and dS over the block's keys (zero for a row that sees none). */
            for (int r = 0; r < BLOCK_M; ++r) {
                if (sees_block(lo[r], hi[r], n0, n)) {
                    score_row(p_tile[r], ds_tile[r], (__local const float *)q_tile[r],
                              (__local const float *)do_tile[r], kt_tile, vt_tile, lo[r], hi[r], n0, lse2[r], di[r],
                              scale, softcap);
                } else {
                    for (int j = 0; j < CPU_NV; ++j) {
                        vstore8((float8)0.0f, j, p_tile[r]);
                        vstore8((float8)0.0f, j, ds_tile[r]);
                    }
                }
            }
            /* 4. dV += P^T dO, dK += dS^T Q. */
            accumulate_keys(dv_acc, p_tile, do_tile, n, rows);
            accumulate_keys(dk_acc, ds_tile, q_tile, n, rows);
            /* 5. Atomic mode: each row's dS K into the float dQ accumulator. */
            if (!use_atomics)
                continue;
            for (int r = 0; r < rows; ++r) {
                if (!sees_block(lo[r], hi[r], n0, n))
                    continue;
                volatile __global float *acc_row = scratch + dq_acc_off + (row0 + m0 + r) * HEAD_DIM;
                for (int j0 = 0; j0 < CPU_DV; j0 += CPU_CHUNK) {
                    float8 a[CPU_CHUNK];
#pragma unroll
                    for (int u = 0; u < CPU_CHUNK; ++u)
                        a[u] = 0.0f;
                    row_times_keys(a, ds_tile[r], k_tile, n, j0);
                    const float *af = (const float *)a;
                    for (int e = 0; e < CPU_CHUNK * CPU_VEC && j0 * CPU_VEC + e < HEAD_DIM; ++e)
                        atomic_add_float(acc_row + j0 * CPU_VEC + e, af[e]);
                }
            }
        }
    }

    /* 6. The block's dK and dV rows. */
    for (int c = 0; c < n; ++c) {
        __local const float *kr = (__local const float *)dk_acc[c], *vr = (__local const float *)dv_acc[c];
        for (int d = 0; d < HEAD_DIM; ++d) {
            STORE_ELEM(dk, ROW_AT(dk, b, n0 + c, hk) + d, kr[d]);
            STORE_ELEM(dv, ROW_AT(dv, b, n0 + c, hk) + d, vr[d]);
        }
    }
}
#endif

#if !defined(BWD_KERNEL) || BWD_KERNEL == 3
/* Deterministic mode: one work-item per BLOCK_M query rows of one (batch,
 * query head) recomputes P and dS key tile by key tile and sums dS K in key
 * order into dq_acc: bitwise identical results run to run. */
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void flash_bwd_dq_cpu(BWD_DQ_ARGS) {
    __local float8 kt_tile[HEAD_DIM][CPU_NV], vt_tile[HEAD_DIM][CPU_NV];
    __local float8 k_tile[BLOCK_N][CPU_DV], v_stage[BLOCK_N][CPU_DV];
    __local float8 q_tile[BLOCK_M][CPU_DV], do_tile[BLOCK_M][CPU_DV], dq_acc[BLOCK_M][CPU_DV];
    __local float p_tile[BLOCK_M][BLOCK_N], ds_tile[BLOCK_M][BLOCK_N];
    float lse2[BLOCK_M], di[BLOCK_M];
    long lo[BLOCK_M], hi[BLOCK_M];

    const int m0 = (int)get_group_id(0) * BLOCK_M;
    const int hq = (int)get_global_id(1), b = (int)get_global_id(2);
    const int hk = hq / group;
    const int rows = min(BLOCK_M, nq - m0);
    const ulong row0 = ((ulong)b * get_global_size(1) + hq) * (ulong)nq;

    load_queries(q_tile, do_tile, lse2, di, lo, hi, q, ROW_AT(q, b, 0, hq), q_ss, dout, ROW_AT(dout, b, 0, hq),
                 dout_ss, lse, lse_off + row0, scratch, di_off + row0, m0, nq, nk, win_left, win_right);
    for (int r = 0; r < BLOCK_M; ++r)
        for (int j = 0; j < CPU_DV; ++j)
            dq_acc[r][j] = 0.0f;

    /* Keys any row of the block sees: both ends grow with the row index. */
    const long blk_lo = visible_keys(m0, nq, nk, win_left, win_right).x;
    const long blk_hi = visible_keys(m0 + rows - 1, nq, nk, win_left, win_right).y;
    for (long n0 = blk_lo <= blk_hi ? (blk_lo / BLOCK_N) * BLOCK_N : blk_hi + 1; n0 <= blk_hi; n0 += BLOCK_N) {
        const int n = (int)min((long)BLOCK_N, (long)nk - n0);
        load_keys(k_tile, kt_tile, vt_tile, v_stage, k, ROW_AT(k, b, n0, hk), k_ss, v, ROW_AT(v, b, n0, hk), v_ss, n);
        for (int r = 0; r < rows; ++r) {
            if (!sees_block(lo[r], hi[r], n0, n))
                continue; /* dS is 0 over this tile: nothing to add */
            score_row(p_tile[r], ds_tile[r], (__local const float *)q_tile[r], (__local const float *)do_tile[r],
                      kt_tile, vt_tile, lo[r], hi[r], n0, lse2[r], di[r], scale, softcap);
            for (int j0 = 0; j0 < CPU_DV; j0 += CPU_CHUNK) {
                float8 a[CPU_CHUNK];
#pragma unroll
                for (int u = 0; u < CPU_CHUNK; ++u)
                    a[u] = dq_acc[r][j0 + u];
                row_times_keys(a, ds_tile[r], k_tile, n, j0);
#pragma unroll
                for (int u = 0; u < CPU_CHUNK; ++u)
                    dq_acc[r][j0 + u] = a[u];
            }
        }
    }

    for (int r = 0; r < rows; ++r) {
        __local const float *qr = (__local const float *)dq_acc[r];
        for (int d = 0; d < HEAD_DIM; ++d)
            STORE_ELEM(dq, ROW_AT(dq, b, m0 + r, hq) + d, qr[d]);
    }
}
#endif
