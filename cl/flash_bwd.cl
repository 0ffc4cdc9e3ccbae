/* flash_bwd.cl: portable FlashAttention-2 backward (dQ, dK, dV) with K/V and Q tiles in __local.
 *
 * Given the forward's Q, K, V, its output O, the output gradient dO and the
 * forward's natural-log LSE, with s = scale * q.k (soft-capped:
 * c * tanh(s / c)) and P = exp(s - LSE):
 *   dV = P^T dO          dP = dO V^T          D_i = rowsum(dO_i * O_i)
 *   dS = P * (dP - D) * g,   g = 1 - tanh^2(s / c) under soft-cap, else 1
 *   dQ = scale * dS K    dK = scale * dS^T Q
 * No N x N matrix is ever stored: P and dS exist one BLOCK_M x BLOCK_N tile
 * at a time in __local memory.
 *
 * Four kernels, one per launch (BWD_KERNEL selects which one a build holds,
 * so each build compiles only what it launches; without it all four build):
 *   1 flash_bwd_pre      ROW_LANES work-items a query row: D_i into scratch, and,
 *                        in atomic mode, zeroes the row's float dQ accumulator
 *   2 flash_bwd_dkdv     one work-group per BLOCK_N keys of one (batch, kv
 *                        head); it loops over the `group` query heads sharing
 *                        that kv head and over the BLOCK_M-row query tiles
 *                        that see any of its keys, so every dK/dV element has
 *                        exactly one writer (GQA sums included) and stays in
 *                        registers until the end. In atomic mode it also adds
 *                        each tile's dS K into the float dQ accumulator with
 *                        compare-and-swap loops (OpenCL 1.2 has no float add)
 *   3 flash_bwd_dq       deterministic mode: one work-group per BLOCK_M query
 *                        rows of one (batch, query head) recomputes P and dS
 *                        tile by tile over the keys and sums dS K in a fixed
 *                        order: bitwise identical results run to run
 *   4 flash_bwd_dq_store atomic mode: the float dQ accumulator -> dQ in DTYPE
 *
 *   dkdv work-group, per query tile:          __local tiles (+1 pad per row)
 *     keys n0..n0+BLOCK_N-1 (fixed)             k_tile, v_tile [BLOCK_N][D]
 *     rows m0..m0+BLOCK_M-1 (streamed)          q_tile, do_tile [BLOCK_M][D]
 *     1. load Q, dO, LSE*log2e, D_i, masks      p_tile, ds_tile [BLOCK_M][BLOCK_N]
 *     2. (i, j) pairs: s, P, dP -> P, dS tiles
 *     3. owned (j, d): dV += P^T dO, dK += dS^T Q   (KV_PER registers each)
 *     4. atomic mode: (i, d): dQ_acc += dS K
 *
 * The work-group is WG work-items that share every phase by striding over the
 * tile's elements, so any WG fits any tile (CPUs and GPUs alike).
 * Masks are the forward's (bottom-right windows, causal = right side 0): a
 * masked pair, a padding row or key, and a row whose LSE is -inf (it saw no
 * key) all get P = 0 and dS = 0, so such rows get dQ = 0 and contribute
 * nothing to dK, dV; -inf - -inf is never formed.
 */

#ifndef HEAD_DIM
#define HEAD_DIM 64 // exact head dimension (compile-time: loops unroll)
#endif
#ifndef BLOCK_M
#define BLOCK_M 16 // query rows per streamed tile
#endif
#ifndef BLOCK_N
#define BLOCK_N 16 // keys per work-group (dkdv) or per streamed tile (dq)
#endif
#ifndef WG
#define WG 64 // work-items per work-group
#endif

#define ROW (HEAD_DIM + 1) /* padded row of a Q/dO/K/V tile: see flash_fwd.cl */
#define PS (BLOCK_N + 1)   /* padded row of the P and dS tiles               */
#define KV_PER ((BLOCK_N * HEAD_DIM + WG - 1) / WG) /* dK/dV elements per work-item */
#define Q_PER ((BLOCK_M * HEAD_DIM + WG - 1) / WG)  /* dQ elements per work-item    */

#if !defined(BWD_KERNEL) || BWD_KERNEL == 1 || BWD_KERNEL == 4
/* Work-items a row of the row kernels (pre-pass, dQ store), see below. */
#ifndef ROW_LANES
#define ROW_LANES 1
#endif
#define ROW_WG 128 /* work-items a group when ROW_LANES > 1 */
#if ROW_LANES > 1 && (ROW_WG % ROW_LANES != 0)
#error "ROW_LANES must divide ROW_WG"
#endif
#endif

#if !defined(BWD_KERNEL) || BWD_KERNEL == 1
/* D_i = sum_d dO[i][d] * O[i][d] in float, into di[(b*Hq + h)*Nq + i]; with
 * zero_dq, the float dQ accumulator row (head_dim floats at dq_acc +
 * ((b*Hq + h)*Nq + i)*head_dim) is cleared. head_dim is an argument so this
 * kernel builds once per dtype.
 *
 * ROW_LANES work-items share a row (the host launches work-groups of
 * ROW_WG = ROW_LANES * rows), lane l reading elements l, l + ROW_LANES, ...:
 * on a GPU neighbouring work-items then read neighbouring bytes. With one
 * work-item a row (ROW_LANES 1, the CPU's choice: each reads its row from
 * its own cache lines), a warp's loads hit 32 rows each and the H200 took
 * 350 us for the 134 MB of O and dO at (4,32,4096,64), about 0.4 TB/s;
 * 32 lanes a row (4 rows a group) took 186 us, most of it the many small
 * groups and the 32-term sums; the host asks for 8 (16 rows a group). */
__kernel void flash_bwd_pre(__global const elem_t *restrict o, __global const elem_t *restrict dout,
                            __global float *restrict scratch, TENSOR_ARGS(o), TENSOR_ARGS(dout),
                            ulong di_off, ulong dq_acc_off, int zero_dq, int nq, int head_dim) {
    const int i = (int)get_global_id(0) / ROW_LANES, lane = (int)get_global_id(0) % ROW_LANES;
    const int h = (int)get_global_id(1), b = (int)get_global_id(2);
    const ulong r = ((ulong)b * get_global_size(1) + h) * (ulong)nq + i;
    float acc = 0.0f;
    if (i < nq) {
        const ulong orow = ROW_AT(o, b, i, h), grow = ROW_AT(dout, b, i, h);
        for (int d = lane; d < head_dim; d += ROW_LANES)
            acc = fma(LOAD_ELEM(dout, grow + d), LOAD_ELEM(o, orow + d), acc);
        if (zero_dq)
            for (int d = lane; d < head_dim; d += ROW_LANES)
                scratch[dq_acc_off + r * head_dim + d] = 0.0f;
    }
#if ROW_LANES > 1
    /* The row's partial sums meet in __local; its first lane adds them in
     * lane order (a fixed order: the same bits every run). Rows past nq take
     * part in the barrier and store nothing. */
    __local float part[ROW_WG];
    const int lid = (int)get_local_id(0);
    part[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lane != 0 || i >= nq)
        return;
    acc = 0.0f;
    for (int l = 0; l < ROW_LANES; ++l)
        acc += part[lid + l];
#else
    if (i >= nq)
        return;
#endif
    scratch[di_off + r] = acc;
}
#endif

#if !defined(BWD_KERNEL) || BWD_KERNEL == 4
/* dQ[i][d] = dq_acc[...] rounded to DTYPE (scale is already folded in),
 * ROW_LANES work-items a row as in the pre-pass (where it runs, atomic mode,
 * its GPU time was not measured: the H200 runs the dQ pass). */
__kernel void flash_bwd_dq_store(__global const float *restrict scratch, __global elem_t *restrict dq,
                                 TENSOR_ARGS(dq), ulong dq_acc_off, int nq, int head_dim) {
    const int i = (int)get_global_id(0) / ROW_LANES, lane = (int)get_global_id(0) % ROW_LANES;
    const int h = (int)get_global_id(1), b = (int)get_global_id(2);
    if (i >= nq)
        return;
    const ulong r = ((ulong)b * get_global_size(1) + h) * (ulong)nq + i;
    const ulong out = ROW_AT(dq, b, i, h);
    for (int d = lane; d < head_dim; d += ROW_LANES)
        STORE_ELEM(dq, out + d, scratch[dq_acc_off + r * head_dim + d]);
}
#endif

#if !defined(BWD_KERNEL) || BWD_KERNEL == 2 || BWD_KERNEL == 3
/* Loads `rows` rows of one (batch, head) of a tensor into a padded float
 * tile, zero past `limit`. */
inline void load_tile(__local float *tile, __global const elem_t *x, ulong base, ulong stride_seq,
                      int first, int rows, int limit) {
    for (int idx = (int)get_local_id(0); idx < rows * HEAD_DIM; idx += WG) {
        const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
        tile[r * ROW + d] = first + r < limit ? LOAD_ELEM(x, base + (ulong)(first + r) * stride_seq + d) : 0.0f;
    }
}

/* Per-row state of a query tile: LSE in log2 units, D_i, visible keys.
 * Padding rows and rows whose LSE is -inf see nothing (lo > hi). */
inline void load_row_stats(__local float *lse2, __local float *di, __local long *lo, __local long *hi,
                           __global const float *lse, ulong lse_row0, __global const float *scratch,
                           ulong di_row0, int m0, int nq, int nk, int win_left, int win_right) {
    for (int r = (int)get_local_id(0); r < BLOCK_M; r += WG) {
        const int i = m0 + r;
        float l = i < nq ? lse[lse_row0 + i] : -INFINITY;
        long2 vis = visible_keys(i, nq, nk, win_left, win_right);
        if (i >= nq || l == -INFINITY)
            vis = (long2)(1, 0);
        lse2[r] = l == -INFINITY ? 0.0f : l * LOG2E;
        di[r] = i < nq ? scratch[di_row0 + i] : 0.0f;
        lo[r] = vis.x;
        hi[r] = vis.y;
    }
}

/* Phase 2: for every (i, j) of the tile, P_ij and dS_ij (dS with scale and
 * the soft-cap derivative folded in) from the four tiles in __local. */
inline void score_tile(__local const float *q_tile, __local const float *do_tile,
                       __local const float *k_tile, __local const float *v_tile,
                       __local const float *lse2, __local const float *di, __local const long *lo,
                       __local const long *hi, __local float *p_tile, __local float *ds_tile, long n0,
                       float scale, float softcap) {
    const float s_log2 = scale * LOG2E;
    for (int idx = (int)get_local_id(0); idx < BLOCK_M * BLOCK_N; idx += WG) {
        const int i = idx / BLOCK_N, j = idx % BLOCK_N;
        const long key = n0 + j;
        float p = 0.0f, ds = 0.0f;
        if (key >= lo[i] && key <= hi[i]) {
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < HEAD_DIM; ++d) {
                s = fma(q_tile[i * ROW + d], k_tile[j * ROW + d], s);
                dp = fma(do_tile[i * ROW + d], v_tile[j * ROW + d], dp);
            }
            float g = 1.0f;
            if (softcap > 0.0f) {
                const float t = tanh(s * (scale / softcap));
                p = exp2(fma(softcap * t, LOG2E, -lse2[i]));
                g = fma(-t, t, 1.0f); /* d/ds of c*tanh(s/c) */
            } else {
                p = exp2(fma(s, s_log2, -lse2[i]));
            }
            ds = p * (dp - di[i]) * g * scale;
        }
        p_tile[i * PS + j] = p;
        ds_tile[i * PS + j] = ds;
    }
}
#endif

#if !defined(BWD_KERNEL) || BWD_KERNEL == 2
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
flash_bwd_dkdv(BWD_DKDV_ARGS) {
    __local float k_tile[BLOCK_N * ROW], v_tile[BLOCK_N * ROW];
    __local float q_tile[BLOCK_M * ROW], do_tile[BLOCK_M * ROW];
    __local float p_tile[BLOCK_M * PS], ds_tile[BLOCK_M * PS];
    __local float lse2[BLOCK_M], di[BLOCK_M];
    __local long lo[BLOCK_M], hi[BLOCK_M];

    const int lid = (int)get_local_id(0);
    const int n0 = (int)get_group_id(0) * BLOCK_N;
    const int hk = (int)get_global_id(1), b = (int)get_global_id(2);
    const int heads_q = (int)get_global_size(1) * group;
    const long shift = (long)nk - (long)nq;

    load_tile(k_tile, k, ROW_AT(k, b, 0, hk), k_ss, n0, BLOCK_N, nk);
    load_tile(v_tile, v, ROW_AT(v, b, 0, hk), v_ss, n0, BLOCK_N, nk);

    float dk_acc[KV_PER], dv_acc[KV_PER];
    for (int u = 0; u < KV_PER; ++u)
        dk_acc[u] = dv_acc[u] = 0.0f;

    /* Rows that see any key of [n0, n_last]: row i sees key j iff
     * i + shift - left <= j <= i + shift + right (a negative side unbounded). */
    const long n_last = min((long)n0 + BLOCK_N, (long)nk) - 1;
    const long i_lo = max(win_right < 0 ? 0L : (long)n0 - win_right - shift, 0L);
    const long i_hi = min(win_left < 0 ? (long)nq - 1 : n_last + win_left - shift, (long)nq - 1);

    for (int hh = 0; hh < group; ++hh) {
        const int hq = hk * group + hh;
        const ulong lse_row0 = lse_off + ((ulong)b * heads_q + hq) * (ulong)nq;
        const ulong di_row0 = di_off + ((ulong)b * heads_q + hq) * (ulong)nq;
        for (long m0 = (i_lo / BLOCK_M) * BLOCK_M; m0 <= i_hi; m0 += BLOCK_M) {
            /* 1. The query tile. The barrier protects every tile from the
             *    previous iteration's readers. */
            barrier(CLK_LOCAL_MEM_FENCE);
            load_tile(q_tile, q, ROW_AT(q, b, 0, hq), q_ss, (int)m0, BLOCK_M, nq);
            load_tile(do_tile, dout, ROW_AT(dout, b, 0, hq), dout_ss, (int)m0, BLOCK_M, nq);
            load_row_stats(lse2, di, lo, hi, lse, lse_row0, scratch, di_row0, (int)m0, nq, nk,
                           win_left, win_right);
            barrier(CLK_LOCAL_MEM_FENCE);
            /* 2. P and dS of the tile. */
            score_tile(q_tile, do_tile, k_tile, v_tile, lse2, di, lo, hi, p_tile, ds_tile, n0,
                       scale, softcap);
            barrier(CLK_LOCAL_MEM_FENCE);
            /* 3. dV += P^T dO and dK += dS^T Q on this work-item's (j, d). */
            for (int u = 0; u < KV_PER; ++u) {
                const int e = lid + u * WG;
                if (e < BLOCK_N * HEAD_DIM) {
                    const int j = e / HEAD_DIM, d = e % HEAD_DIM;
                    float av = dv_acc[u], ak = dk_acc[u];
                    for (int i = 0; i < BLOCK_M; ++i) {
                        av = fma(p_tile[i * PS + j], do_tile[i * ROW + d], av);
                        ak = fma(ds_tile[i * PS + j], q_tile[i * ROW + d], ak);
                    }
                    dv_acc[u] = av;
                    dk_acc[u] = ak;
                }
            }
            /* 4. Atomic mode: this tile's share of dQ. */
            if (use_atomics) {
                for (int e = lid; e < BLOCK_M * HEAD_DIM; e += WG) {
                    const int i = e / HEAD_DIM, d = e % HEAD_DIM;
                    if (lo[i] > hi[i])
                        continue; /* padding or empty row: nothing to add */
                    float a = 0.0f;
                    for (int j = 0; j < BLOCK_N; ++j)
                        a = fma(ds_tile[i * PS + j], k_tile[j * ROW + d], a);
                    atomic_add_float(scratch + dq_acc_off + (di_row0 - di_off + (ulong)(m0 + i)) * HEAD_DIM + d, a);
                }
            }
        }
    }

    for (int u = 0; u < KV_PER; ++u) {
        const int e = lid + u * WG;
        const int j = e / HEAD_DIM, d = e % HEAD_DIM;
        if (e < BLOCK_N * HEAD_DIM && n0 + j < nk) {
            STORE_ELEM(dk, ROW_AT(dk, b, n0 + j, hk) + d, dk_acc[u]);
            STORE_ELEM(dv, ROW_AT(dv, b, n0 + j, hk) + d, dv_acc[u]);
        }
    }
}
#endif

#if !defined(BWD_KERNEL) || BWD_KERNEL == 3
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
flash_bwd_dq(BWD_DQ_ARGS) {
    __local float k_tile[BLOCK_N * ROW], v_tile[BLOCK_N * ROW];
    __local float q_tile[BLOCK_M * ROW], do_tile[BLOCK_M * ROW];
    __local float p_tile[BLOCK_M * PS], ds_tile[BLOCK_M * PS];
    __local float lse2[BLOCK_M], di[BLOCK_M];
    __local long lo[BLOCK_M], hi[BLOCK_M];

    const int lid = (int)get_local_id(0);
    const int m0 = (int)get_group_id(0) * BLOCK_M;
    const int hq = (int)get_global_id(1), b = (int)get_global_id(2);
    const int hk = hq / group;
    const ulong row0 = ((ulong)b * get_global_size(1) + hq) * (ulong)nq;

    load_tile(q_tile, q, ROW_AT(q, b, 0, hq), q_ss, m0, BLOCK_M, nq);
    load_tile(do_tile, dout, ROW_AT(dout, b, 0, hq), dout_ss, m0, BLOCK_M, nq);
    load_row_stats(lse2, di, lo, hi, lse, lse_off + row0, scratch, di_off + row0, m0, nq, nk,
                   win_left, win_right);

    float dq_acc[Q_PER];
    for (int u = 0; u < Q_PER; ++u)
        dq_acc[u] = 0.0f;

    /* Keys any row of the block sees: both ends grow with the row index. */
    const long2 first = visible_keys(m0, nq, nk, win_left, win_right);
    const long2 last = visible_keys(min(m0 + BLOCK_M, nq) - 1, nq, nk, win_left, win_right);
    const long blk_lo = first.x, blk_hi = last.y;
    for (long n0 = blk_lo <= blk_hi ? (blk_lo / BLOCK_N) * BLOCK_N : blk_hi + 1; n0 <= blk_hi;
         n0 += BLOCK_N) {
        barrier(CLK_LOCAL_MEM_FENCE);
        load_tile(k_tile, k, ROW_AT(k, b, 0, hk), k_ss, (int)n0, BLOCK_N, nk);
        load_tile(v_tile, v, ROW_AT(v, b, 0, hk), v_ss, (int)n0, BLOCK_N, nk);
        barrier(CLK_LOCAL_MEM_FENCE);
        score_tile(q_tile, do_tile, k_tile, v_tile, lse2, di, lo, hi, p_tile, ds_tile, n0, scale,
                   softcap);
        barrier(CLK_LOCAL_MEM_FENCE);
        /* dQ += dS K, in the same key order every run. */
        for (int u = 0; u < Q_PER; ++u) {
            const int e = lid + u * WG;
            if (e < BLOCK_M * HEAD_DIM) {
                const int i = e / HEAD_DIM, d = e % HEAD_DIM;
                float a = dq_acc[u];
                for (int j = 0; j < BLOCK_N; ++j)
                    a = fma(ds_tile[i * PS + j], k_tile[j * ROW + d], a);
                dq_acc[u] = a;
            }
        }
    }

    for (int u = 0; u < Q_PER; ++u) {
        const int e = lid + u * WG;
        const int i = e / HEAD_DIM, d = e % HEAD_DIM;
        if (e < BLOCK_M * HEAD_DIM && m0 + i < nq)
            STORE_ELEM(dq, ROW_AT(dq, b, m0 + i, hq) + d, dq_acc[u]);
    }
}
#endif
