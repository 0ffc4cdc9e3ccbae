/* flash_bwd_cpu.cl: the backward's dK/dV (with dQ's sum) and deterministic dQ kernels shaped for CPUs.
 *
 * The math is flash_bwd.cl's (see there): with s = scale * q.k (soft-capped
 * c * tanh(s / c)), P = exp(s - LSE), D_i = rowsum(dO_i * O_i),
 *   dV += P^T dO,  dS = P * (dO.v - D) * g * scale,  dK += dS^T Q,  dQ += dS K.
 * Only the shape differs, as flash_fwd_cpu.cl's does from flash_fwd.cl's:
 * one work-item owns BLOCK_N keys of one (batch, kv head) (flash_bwd_dkdv_cpu;
 * with use_atomics 2, all the pair's keys, block by block, so that it alone
 * writes those heads' dQ rows) or BLOCK_M query rows of one (batch, query
 * head) (flash_bwd_dq_cpu, the deterministic dQ pass), the work-group is
 * that single work-item (no barriers: the driver's threads take whole
 * blocks), and every hot loop has independent float8 lanes innermost so it
 * maps onto AVX registers without reassociating a sum:
 *
 *   S[r][c]  += Q[r][d]  * Kt[d][c]     innermost c (keys): K transposed
 *   dP[r][c] += dO[r][d] * Vt[d][c]     innermost c: V transposed
 *   dV[c][d] += P[r][c]  * dO[r][d]     innermost d (head dim)
 *   dK[c][d] += dS[r][c] * Q[r][d]      innermost d
 *   dQ[r][d] += dS[r][c] * K[c][d]      innermost d, then float atomics (or plain adds)
 *
 *   __local (one work-item's scratch; PoCL gives CPUs megabytes):
 *     kt_tile, vt_tile [HEAD_DIM][BLOCK_N]   K, V transposed (fixed)
 *     k_tile           [BLOCK_N][CPU_D_PAD]  K as it comes (fixed, for dQ)
 *     dk_acc, dv_acc   [BLOCK_N][CPU_D_PAD]  the block's gradients
 *     q_tile, do_tile  [M_EVEN][CPU_D_PAD]   one query tile (streamed; rows in pairs)
 *     p_tile, ds_tile  [M_EVEN][BLOCK_N]     its P and dS
 *   the dQ pass: the same K/V tiles (streamed), Q and dO (fixed), dq_acc
 *   [M_EVEN][CPU_D_PAD] in place of dK and dV.
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
/* Query tiles hold an even number of rows: the dQ loops take rows in pairs. */
#define M_EVEN (BLOCK_M + BLOCK_M % 2)
#if CPU_NV % 4 == 0 /* key vectors per pass of score_tile */
#define SCORE_NV 4
#elif CPU_NV % 2 == 0
#define SCORE_NV 2
#else
#define SCORE_NV 1
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

/* Head-dim vectors per pass of the loops that accumulate over rows or keys:
 * two rows (or keys) x AK_CH vectors are 16 independent FMA chains at D >= 64,
 * which a Zen 4 or Skylake core needs to hide the FMA latency (the CPU_CHUNK
 * = 4 chains of one row ran at half the FMA rate: measured with perf). */
#if CPU_DV % 8 == 0
#define AK_CH 8
#else
#define AK_CH 4
#endif

/* acc[c][:] += sum over rows r of w[r][c] * x[r][:], for the block's n keys
 * (two at a time: BLOCK_N is even and w is 0 past n), rows summed in order
 * (the one-writer order that keeps dK, dV deterministic). */
inline void accumulate_keys(__local float8 (*acc)[CPU_DV], __local const float (*w)[BLOCK_N],
                            __local const float8 (*x)[CPU_DV], int n, int rows) {
    for (int c = 0; c < n; c += 2)
        for (int j0 = 0; j0 < CPU_DV; j0 += AK_CH) {
            float8 a[2][AK_CH];
#pragma unroll
            for (int u = 0; u < AK_CH; ++u) {
                a[0][u] = acc[c][j0 + u];
                a[1][u] = acc[c + 1][j0 + u];
            }
            for (int r = 0; r < rows; ++r) {
                const float8 w0 = (float8)(w[r][c]), w1 = (float8)(w[r][c + 1]);
#pragma unroll
                for (int u = 0; u < AK_CH; ++u) {
                    const float8 xv = x[r][j0 + u];
                    a[0][u] = fma(w0, xv, a[0][u]);
                    a[1][u] = fma(w1, xv, a[1][u]);
                }
            }
#pragma unroll
            for (int u = 0; u < AK_CH; ++u) {
                acc[c][j0 + u] = a[0][u];
                acc[c + 1][j0 + u] = a[1][u];
            }
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

/* P and dS (scale and the soft-cap derivative folded in) of the query tile's
 * rows (q_tile, do_tile: Q and dO; lse2, di, lo, hi per row) against the
 * keys of kt, vt, which start at key n0; keys outside a row's [lo, hi] get 0
 * (all of them for padding rows and rows that see none of the block).
 * flash_bwd.cl's score_tile, 8 keys a lane. The loop nest keeps its working
 * set in L1: SCORE_NV key vectors of K^T and V^T (16 KB at D=64) stay while
 * the rows stream past two at a time, and two rows x SCORE_NV vectors x (S,
 * dP) are 16 FMA chains fed by 12 loads per 16 FMAs. (One row against all
 * BLOCK_N keys read K^T and V^T from L2 for every row: 2x slower per FLOP
 * than the accumulation loops, measured with perf.) */
inline void score_tile(__local float (*p_tile)[BLOCK_N], __local float (*ds_tile)[BLOCK_N],
                       __local const float8 (*q_tile)[CPU_DV], __local const float8 (*do_tile)[CPU_DV],
                       __local const float8 (*kt)[CPU_NV], __local const float8 (*vt)[CPU_NV], const float *lse2,
                       const float *di, const long *lo, const long *hi, int rows, long n0, float scale,
                       float softcap) {
    const float8 lane = (float8)(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
    for (int j0 = 0; j0 < CPU_NV; j0 += SCORE_NV)
        for (int r = 0; r < rows; r += 2) { /* row r + 1 < M_EVEN; past rows it sees nothing */
            __local const float *q0 = (__local const float *)q_tile[r], *q1 = (__local const float *)q_tile[r + 1];
            __local const float *g0 = (__local const float *)do_tile[r], *g1 = (__local const float *)do_tile[r + 1];
            float8 sv[2][SCORE_NV], dpv[2][SCORE_NV];
#pragma unroll
            for (int j = 0; j < SCORE_NV; ++j)
                sv[0][j] = sv[1][j] = dpv[0][j] = dpv[1][j] = 0.0f;
            for (int d = 0; d < HEAD_DIM; ++d) {
                const float8 qa = (float8)(q0[d]), qb = (float8)(q1[d]);
                const float8 ga = (float8)(g0[d]), gb = (float8)(g1[d]);
#pragma unroll
                for (int j = 0; j < SCORE_NV; ++j) {
                    const float8 kv = kt[d][j0 + j], vv = vt[d][j0 + j];
                    sv[0][j] = fma(qa, kv, sv[0][j]);
                    sv[1][j] = fma(qb, kv, sv[1][j]);
                    dpv[0][j] = fma(ga, vv, dpv[0][j]);
                    dpv[1][j] = fma(gb, vv, dpv[1][j]);
                }
            }
            for (int y = 0; y < 2; ++y) {
                const int row = r + y;
                const int in = row < rows;
                /* Key offsets within a block are < 2^24: exact in float. */
                const float8 lo_v = (float8)(in ? (float)max(lo[row] - n0, -1L) : 1.0f);
                const float8 hi_v = (float8)(in ? (float)min(hi[row] - n0, (long)BLOCK_N) : 0.0f);
                const float8 l2 = (float8)(in ? lse2[row] : 0.0f), di8 = (float8)(in ? di[row] : 0.0f);
                for (int j = 0; j < SCORE_NV; ++j) {
                    const float8 key = lane + (float8)((float)((j0 + j) * CPU_VEC));
                    float8 p, g = 1.0f;
                    if (softcap > 0.0f) {
                        const float8 t = tanh(sv[y][j] * (float8)(scale / softcap));
                        p = exp2(fma((float8)softcap * t, (float8)LOG2E, -l2));
                        g = fma(-t, t, (float8)1.0f); /* d/ds of c*tanh(s/c) */
                    } else {
                        p = exp2(fma(sv[y][j], (float8)(scale * LOG2E), -l2));
                    }
                    const float8 ds = p * (dpv[y][j] - di8) * g * (float8)scale;
                    const int8 masked = isless(key, lo_v) || isgreater(key, hi_v);
                    vstore8(select(p, (float8)0.0f, masked), j0 + j, p_tile[row]);
                    vstore8(select(ds, (float8)0.0f, masked), j0 + j, ds_tile[row]);
                }
            }
        }
}

/* a[y][u] += sum over the n keys c of w_y[c] * x[c][j0 + u] (dS K for two
 * rows, w_0 and w_1), keys summed in order. */
inline void rows_times_keys(float8 (*a)[AK_CH], __local const float *w_0, __local const float *w_1,
                            __local const float8 (*x)[CPU_DV], int n, int j0) {
    for (int c = 0; c < n; ++c) {
        const float8 w0 = (float8)(w_0[c]), w1 = (float8)(w_1[c]);
#pragma unroll
        for (int u = 0; u < AK_CH; ++u) {
            const float8 xv = x[c][j0 + u];
            a[0][u] = fma(w0, xv, a[0][u]);
            a[1][u] = fma(w1, xv, a[1][u]);
        }
    }
}

#if !defined(BWD_KERNEL) || BWD_KERNEL == 2
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void flash_bwd_dkdv_cpu(BWD_DKDV_ARGS) {
    __local float8 kt_tile[HEAD_DIM][CPU_NV], vt_tile[HEAD_DIM][CPU_NV];
    __local float8 k_tile[BLOCK_N][CPU_DV], dk_acc[BLOCK_N][CPU_DV], dv_acc[BLOCK_N][CPU_DV];
    __local float8 q_tile[M_EVEN][CPU_DV], do_tile[M_EVEN][CPU_DV];
    __local float p_tile[M_EVEN][BLOCK_N], ds_tile[M_EVEN][BLOCK_N];
    float lse2[BLOCK_M], di[BLOCK_M];
    long lo[BLOCK_M], hi[BLOCK_M];

    const int hk = (int)get_global_id(1), b = (int)get_global_id(2);
    const int heads_q = (int)get_global_size(1) * group;
    const long shift = (long)nk - (long)nq;
    /* use_atomics 2: this work-item is the one of its (batch, kv head) and
     * walks every key block in turn (the grid's dimension 0 is 1), so it is
     * the only writer of its query heads' dQ rows, which it adds to with plain
     * loads and stores, in a fixed order. Otherwise one key block per
     * work-item, and dQ by atomics when use_atomics is 1. */
    const int owner = use_atomics == 2;
    const int first = owner ? 0 : (int)get_group_id(0) * BLOCK_N, end = owner ? nk : first + 1;
    for (int n0 = first; n0 < end; n0 += BLOCK_N) {
        const int n = min(BLOCK_N, nk - n0); /* valid keys in this block */

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
                /* 3. P and dS over the block's keys (zero for a row that sees none). */
                score_tile(p_tile, ds_tile, q_tile, do_tile, kt_tile, vt_tile, lse2, di, lo, hi, rows, n0, scale,
                           softcap);
                /* 4. dV += P^T dO, dK += dS^T Q. */
                accumulate_keys(dv_acc, p_tile, do_tile, n, rows);
                accumulate_keys(dk_acc, ds_tile, q_tile, n, rows);
                /* 5. Atomic mode: each row's dS K into the float dQ accumulator. */
                if (!use_atomics)
                    continue;
                for (int r = 0; r < rows; r += 2) { /* two rows share each K load; row r + 1 < M_EVEN */
                    const int see0 = sees_block(lo[r], hi[r], n0, n);
                    const int see1 = r + 1 < rows && sees_block(lo[r + 1], hi[r + 1], n0, n);
                    if (!see0 && !see1)
                        continue;
                    volatile __global float *acc_row = scratch + dq_acc_off + (row0 + m0 + r) * HEAD_DIM;
                    for (int j0 = 0; j0 < CPU_DV; j0 += AK_CH) {
                        float8 a[2][AK_CH];
    #pragma unroll
                        for (int u = 0; u < AK_CH; ++u)
                            a[0][u] = a[1][u] = 0.0f;
                        rows_times_keys(a, ds_tile[r], ds_tile[r + 1], k_tile, n, j0);
                        for (int y = 0; y < 2; ++y) {
                            if (!(y ? see1 : see0))
                                continue;
                            const float *af = (const float *)a[y];
                            if (owner) {
                                __global float *row = (__global float *)acc_row + y * HEAD_DIM + j0 * CPU_VEC;
                                for (int e = 0; e < AK_CH * CPU_VEC && j0 * CPU_VEC + e < HEAD_DIM; ++e)
                                    row[e] += af[e];
                            } else {
                                for (int e = 0; e < AK_CH * CPU_VEC && j0 * CPU_VEC + e < HEAD_DIM; ++e)
                                    atomic_add_float(acc_row + y * HEAD_DIM + j0 * CPU_VEC + e, af[e]);
                            }
                        }
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
}
#endif

#if !defined(BWD_KERNEL) || BWD_KERNEL == 3
/* Deterministic mode: one work-item per BLOCK_M query rows of one (batch,
 * query head) recomputes P and dS key tile by key tile and sums dS K in key
 * order into dq_acc: bitwise identical results run to run. */
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void flash_bwd_dq_cpu(BWD_DQ_ARGS) {
    __local float8 kt_tile[HEAD_DIM][CPU_NV], vt_tile[HEAD_DIM][CPU_NV];
    __local float8 k_tile[BLOCK_N][CPU_DV], v_stage[BLOCK_N][CPU_DV];
    __local float8 q_tile[M_EVEN][CPU_DV], do_tile[M_EVEN][CPU_DV], dq_acc[M_EVEN][CPU_DV];
    __local float p_tile[M_EVEN][BLOCK_N], ds_tile[M_EVEN][BLOCK_N];
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
        score_tile(p_tile, ds_tile, q_tile, do_tile, kt_tile, vt_tile, lse2, di, lo, hi, rows, n0, scale, softcap);
        for (int r = 0; r < rows; r += 2) { /* row r + 1 < M_EVEN: a padding row's dS is 0 */
            for (int j0 = 0; j0 < CPU_DV; j0 += AK_CH) {
                float8 a[2][AK_CH];
#pragma unroll
                for (int u = 0; u < AK_CH; ++u) {
                    a[0][u] = dq_acc[r][j0 + u];
                    a[1][u] = dq_acc[r + 1][j0 + u];
                }
                rows_times_keys(a, ds_tile[r], ds_tile[r + 1], k_tile, n, j0);
#pragma unroll
                for (int u = 0; u < AK_CH; ++u) {
                    dq_acc[r][j0 + u] = a[0][u];
                    dq_acc[r + 1][j0 + u] = a[1][u];
                }
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
