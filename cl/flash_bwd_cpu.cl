/* flash_bwd_cpu.cl: the backward's dK/dV (and atomic dQ) kernel shaped for CPU OpenCL drivers.
 *
 * The math is flash_bwd.cl's (see there): with s = scale * q.k (soft-capped
 * c * tanh(s / c)), P = exp(s - LSE), D_i = rowsum(dO_i * O_i),
 *   dV += P^T dO,  dS = P * (dO.v - D) * g * scale,  dK += dS^T Q,  dQ += dS K.
 * Only the shape differs, as flash_fwd_cpu.cl's does from flash_fwd.cl's:
 * one work-item owns BLOCK_N keys of one (batch, kv head), the work-group is
 * that single work-item (no barriers: the driver's threads take whole key
 * blocks), and every hot loop has independent float8 lanes innermost so it
 * maps onto AVX registers without reassociating a sum:
 *
 *   S[r][c]  += Q[r][d]  * Kt[d][c]     innermost c (keys): K transposed
 *   dP[r][c] += dO[r][d] * Vt[d][c]     innermost c: V transposed
 *   dV[c][d] += P[r][c]  * dO[r][d]     innermost d (head dim)
 *   dK[c][d] += dS[r][c] * Q[r][d]      innermost d
 *   dQ[r][d] += dS[r][c] * K[c][d]      innermost d, then float atomics
 *
 *   __local (one work-item's scratch; PoCL gives CPUs megabytes):
 *     kt_tile, vt_tile [HEAD_DIM][BLOCK_N]   K, V transposed (fixed)
 *     k_tile           [BLOCK_N][D_PAD]      K as it comes (fixed, for dQ)
 *     dk_acc, dv_acc   [BLOCK_N][D_PAD]      the block's gradients
 *     q_tile, do_tile  [BLOCK_M][D_PAD]      one query tile (streamed)
 *     p_tile, ds_tile  [BLOCK_M][BLOCK_N]    its P and dS
 *
 * The work-item loops over the `group` query heads sharing its kv head and
 * over the BLOCK_M-row query tiles that see any of its keys, so each dK/dV
 * element has one writer and a fixed summation order. Masks and empty rows
 * are flash_bwd.cl's: a masked pair, a padding row or key and a row whose
 * LSE is -inf get P = dS = 0. Arguments are flash_bwd_dkdv's, so the host
 * launches either kernel the same way (src/backward.c); pre, the
 * deterministic dQ pass and the dQ store are flash_bwd.cl's kernels.
 */

#ifndef HEAD_DIM
#define HEAD_DIM 64 // exact head dimension
#endif
#ifndef BLOCK_M
#define BLOCK_M 32 // query rows per streamed tile: each K/V element is reused this often
#endif
#ifndef BLOCK_N
#define BLOCK_N 32 // keys per work-item: the SIMD dimension of the score loops
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

__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
flash_bwd_dkdv_cpu(BWD_DKDV_ARGS) {
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
    const float s_log2 = scale * LOG2E;
    const int capped = softcap > 0.0f;
    const float8 lane = (float8)(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);

    /* 1. K and V once: K as it comes (for dQ), both transposed (for S, dP);
     *    dv_acc holds V until it is transposed, then starts at zero. */
    for (int c = 0; c < BLOCK_N; ++c) {
        load_row((__local float *)k_tile[c], k, ROW_AT(k, b, n0 + c, hk), c < n);
        load_row((__local float *)dv_acc[c], v, ROW_AT(v, b, n0 + c, hk), c < n);
    }
    transpose_tile((__local float *)kt_tile, (__local const float *)k_tile);
    transpose_tile((__local float *)vt_tile, (__local const float *)dv_acc);
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
            /* 2. The query tile: Q, dO, LSE in log2 units, D_i, visible keys
             *    relative to n0 (padding and LSE -inf rows see nothing). */
            for (int r = 0; r < BLOCK_M; ++r) {
                const long i = m0 + r;
                load_row((__local float *)q_tile[r], q, ROW_AT(q, b, i, hq), r < rows);
                load_row((__local float *)do_tile[r], dout, ROW_AT(dout, b, i, hq), r < rows);
                const float l = r < rows ? lse[lse_off + row0 + i] : -INFINITY;
                long2 vis = visible_keys(i, nq, nk, win_left, win_right);
                if (l == -INFINITY)
                    vis = (long2)(1, 0);
                lse2[r] = l == -INFINITY ? 0.0f : l * LOG2E;
                di[r] = r < rows ? scratch[di_off + row0 + i] : 0.0f;
                lo[r] = vis.x - n0;
                hi[r] = vis.y - n0;
            }
            /* 3. Per row: S and dP over the block's keys, then P and dS. */
            for (int r = 0; r < BLOCK_M; ++r) {
                if (lo[r] > hi[r] || hi[r] < 0 || lo[r] >= n) { /* no key of this block */
                    for (int j = 0; j < CPU_NV; ++j) {
                        vstore8((float8)0.0f, j, p_tile[r]);
                        vstore8((float8)0.0f, j, ds_tile[r]);
                    }
                    continue;
                }
                /* Unrolled j loops keep sv[], dpv[] in registers (see
                 * flash_fwd_cpu.cl: rolled, they lived on the stack). */
                float8 sv[CPU_NV], dpv[CPU_NV];
#pragma unroll
                for (int j = 0; j < CPU_NV; ++j)
                    sv[j] = dpv[j] = 0.0f;
                __local const float *qr = (__local const float *)q_tile[r];
                __local const float *gr = (__local const float *)do_tile[r];
                for (int d = 0; d < HEAD_DIM; ++d) {
                    const float8 qd = (float8)(qr[d]), gd = (float8)(gr[d]);
#pragma unroll
                    for (int j = 0; j < CPU_NV; ++j) {
                        sv[j] = fma(qd, kt_tile[d][j], sv[j]);
                        dpv[j] = fma(gd, vt_tile[d][j], dpv[j]);
                    }
                }
                /* Key offsets within a block are < 2^24: exact in float. */
                const float8 lo_v = (float8)((float)max(lo[r], -1L)), hi_v = (float8)((float)min(hi[r], (long)n));
                const float8 l2 = (float8)(lse2[r]), dv8 = (float8)(di[r]);
                for (int j = 0; j < CPU_NV; ++j) {
                    const float8 key = lane + (float8)((float)(j * CPU_VEC));
                    float8 p, g = 1.0f;
                    if (capped) {
                        const float8 t = tanh(sv[j] * (float8)(scale / softcap));
                        p = exp2(fma((float8)softcap * t, (float8)LOG2E, -l2));
                        g = fma(-t, t, (float8)1.0f); /* d/ds of c*tanh(s/c) */
                    } else {
                        p = exp2(fma(sv[j], (float8)s_log2, -l2));
                    }
                    float8 ds = p * (dpv[j] - dv8) * g * (float8)scale;
                    const int8 masked = isless(key, lo_v) || isgreater(key, hi_v);
                    vstore8(select(p, (float8)0.0f, masked), j, p_tile[r]);
                    vstore8(select(ds, (float8)0.0f, masked), j, ds_tile[r]);
                }
            }
            /* 4. dV += P^T dO, dK += dS^T Q. */
            accumulate_keys(dv_acc, p_tile, do_tile, n, rows);
            accumulate_keys(dk_acc, ds_tile, q_tile, n, rows);
            /* 5. Atomic mode: each row's dS K into the float dQ accumulator. */
            if (!use_atomics)
                continue;
            for (int r = 0; r < rows; ++r) {
                if (lo[r] > hi[r] || hi[r] < 0 || lo[r] >= n)
                    continue;
                volatile __global float *acc_row = scratch + dq_acc_off + (row0 + m0 + r) * HEAD_DIM;
                for (int j0 = 0; j0 < CPU_DV; j0 += CPU_CHUNK) {
                    float8 a[CPU_CHUNK];
#pragma unroll
                    for (int u = 0; u < CPU_CHUNK; ++u)
                        a[u] = 0.0f;
                    for (int c = 0; c < n; ++c) {
                        const float8 w = (float8)(ds_tile[r][c]);
#pragma unroll
                        for (int u = 0; u < CPU_CHUNK; ++u)
                            a[u] = fma(w, k_tile[c][j0 + u], a[u]);
                    }
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
