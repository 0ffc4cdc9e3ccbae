/* common_nv_bwd.cl: the pieces NVIDIA's tensor-core backward kernels share
 * (flash_bwd_nv.cl, flash_bwd_sm90.cl): which keys a row sees, a score's P and
 * dS from the row's LSE and D_i, the kernels' opening and the dK/dV epilogue.
 *
 * Prepended to every kernel after common_nv.cl, whose PTX helpers it uses
 * (src/program.c); compiled only with -DFLASHCL_NV_PTX and -DBWD_KERNEL, so
 * every other build sees nothing of it.
 */
#if defined(FLASHCL_NV_PTX) && defined(BWD_KERNEL) && (DTYPE == 1 || DTYPE == 2)
/* [lo_rel, hi_rel]: key j is visible to row i iff lo_rel <= j - i <= hi_rel
 * (a side without a window is widened past any j - i). */
inline long2 visible_rel(int nq, int nk, int win_left, int win_right) {
    const long shift = (long)nk - (long)nq;
    return (long2)(win_left < 0 ? -(1L << 40) : shift - win_left,
                   win_right < 0 ? (1L << 40) : shift + win_right);
}

/* The raw score x of one (row, key) pair -> (P, dS) given the row's LSE in
 * log2 units (+inf: the row contributes nothing), its D_i, and dP. */
inline float2 p_and_ds(float x, float dp, float lse2, float di, float scale, float softcap) {
    float p, g = 1.0f;
    if (softcap > 0.0f) {
        const float th = tanh(x * (scale / softcap));
        p = ex2(fma(softcap * th, LOG2E, -lse2));
        g = fma(-th, th, 1.0f); /* d/ds of c*tanh(s/c) */
    } else {
        p = ex2(fma(x, scale * LOG2E, -lse2));
    }
    return (float2)(p, p * (dp - di) * g * scale);
}

/* Two adjacent n8 accumulator blocks -> the A fragment of one k16 step (the
 * forward's P trick, flash_fwd_nv.cl). */
#define ACC_TO_A(a, lo, hi)                                                                        \
    do {                                                                                           \
        (a)[0] = pack2((lo)[0], (lo)[1]);                                                          \
        (a)[1] = pack2((lo)[2], (lo)[3]);                                                          \
        (a)[2] = pack2((hi)[0], (hi)[1]);                                                          \
        (a)[3] = pack2((hi)[2], (hi)[3]);                                                          \
    } while (0)

/* Stores columns d, d+1 (d even, d < HEAD_DIM) of one row of 16-bit elements:
 * one 32-bit store when pair (every row start 4-byte aligned). */
inline void store_two(__global ushort *row, int d, float x0, float x1, int pair) {
    if (pair) {
        *(__global uint *)(row + d) = pack2(x0, x1);
    } else {
        STORE_ELEM((__global elem_t *)row, d, x0);
        if (d + 1 < HEAD_DIM)
            STORE_ELEM((__global elem_t *)row, d + 1, x1);
    }
}

/* Stores one warp's 16 x HEAD_DIM f32 accumulators acc[D_FRAGS][4] (this
 * lane's rows g and g + 8, at most `rows` of them) into a [*][HEAD_DIM]
 * 16-bit matrix whose row r is at dst + r*stride. A macro: passed to a
 * function, the accumulators would leave registers for the stack. */
#define STORE_ACC(dst, stride, acc, rows)                                                          \
    do {                                                                                           \
        __global ushort *dst_ = (dst);                                                             \
        const ulong stride_ = (stride);                                                            \
        const int pair_ = (HEAD_DIM % 2 == 0) && ((ulong)dst_ % 4 == 0) && (stride_ % 2 == 0);     \
        _Pragma("unroll") for (int h_ = 0; h_ < 2; ++h_) {                                         \
            if (g + 8 * h_ < (rows)) {                                                             \
                _Pragma("unroll") for (int j_ = 0; j_ < D_FRAGS; ++j_) {                           \
                    if (8 * j_ + 2 * t < HEAD_DIM)                                                 \
                        store_two(dst_ + (ulong)(g + 8 * h_) * stride_, 8 * j_ + 2 * t,            \
                                  (acc)[j_][2 * h_], (acc)[j_][2 * h_ + 1], pair_);                \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* The opening of a dK/dV kernel: its key block n0 (of `keys` keys), kv head hk
 * and batch b. Under LPT_HEADS the first key blocks of a chunk of heads run
 * first (they see the most rows under a causal mask), else grid order. */
#if LPT_HEADS
#define NV_KEY_BLOCK_ORDER(keys)                                                                   \
    LPT_PLACE(lpt_rank_, lpt_pair_);                                                               \
    const int n0 = lpt_rank_ * (keys);                                                             \
    const int hk = lpt_pair_ % (int)get_num_groups(1), b = lpt_pair_ / (int)get_num_groups(1)
#else
#define NV_KEY_BLOCK_ORDER(keys)                                                                   \
    const int n0 = (int)get_group_id(0) * (keys);                                                 \
    const int hk = (int)get_global_id(1), b = (int)get_global_id(2)
#endif

/* The rows that see any key of [n0, n0 + keys) and the BLOCK_M-row tiles over
 * them, for each of the `group` query heads: `tiles` tiles in all, streamed in
 * one loop (tile it: head hk * group + it / m_tiles, first row m_first + (it %
 * m_tiles) * BLOCK_M); rel is visible_rel's. */
#define NV_KEY_BLOCK_ROW_TILES(keys)                                                               \
    const long2 rel = visible_rel(nq, nk, win_left, win_right);                                    \
    const long n_last = min((long)n0 + (keys), (long)nk) - 1;                                      \
    const long i_lo = max((long)n0 - rel.y, 0L), i_hi = min(n_last - rel.x, (long)nq - 1);         \
    const int m_first = i_lo <= i_hi ? (int)(i_lo / BLOCK_M) * BLOCK_M : 0;                        \
    const int m_tiles = i_lo <= i_hi ? (int)((i_hi - m_first) / BLOCK_M) + 1 : 0;                  \
    const int tiles = m_tiles * group

/* Whether the Q and dO rows of every query head start 16-byte aligned
 * (cp.async; else plain loads): uniform over the heads when the head stride
 * is a multiple of 8 elements. */
#define NV_QDO_VEC                                                                                 \
    const int q_vec = ((ulong)q % 16 == 0) && (q_off % 8 == 0) && (q_sb % 8 == 0) &&               \
                      (q_ss % 8 == 0) && (q_sh % 8 == 0);                                          \
    const int do_vec = ((ulong)dout % 16 == 0) && (dout_off % 8 == 0) && (dout_sb % 8 == 0) &&     \
                       (dout_ss % 8 == 0) && (dout_sh % 8 == 0)

/* One float from src into dst: by a 4-byte cp.async, waited for by cp_wait()
 * after the next cp.async.commit_group; or, without cp.async, a plain load.
 * NV_STATS_ASYNC=0 (FLASHCL_BUILD_OPTIONS) takes the plain load always: the
 * backward's tile stats as they were copied before 2026-12-05, for timing the
 * two side by side. */
#ifndef NV_STATS_ASYNC
#define NV_STATS_ASYNC USE_CP_ASYNC
#endif
#if NV_STATS_ASYNC && !USE_CP_ASYNC
#error "NV_STATS_ASYNC needs USE_CP_ASYNC (cp_wait is what waits for its copies)"
#endif
inline void nv_copy_f32(__local float *dst, __global const float *src) {
#if NV_STATS_ASYNC
    __asm__ __volatile__("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(shared_addr(dst)), "l"((ulong)src)
                         : "memory");
#else
    *dst = *src;
#endif
}

/* Closes the group of this work-item's nv_copy_f32 copies (cp_wait waits for committed groups only). */
#if NV_STATS_ASYNC
#define NV_COMMIT_COPIES() __asm__ __volatile__("cp.async.commit_group;" ::: "memory")
#else
#define NV_COMMIT_COPIES() do { } while (0)
#endif

/* An LSE as the backward's elementwise steps use it: log2 units, +inf where
 * the row contributes nothing (-inf: past nq, or a row that saw no key). */
inline float lse_log2(float l) {
    return l == -INFINITY ? INFINITY : l * LOG2E;
}

/* The LSE and D_i of the BLOCK_M rows from m0_ of query head hq_ into
 * ts[0][r], ts[1][r] (a dK/dV tile's stats, in __local), as stored: the LSE in
 * natural-log units (NV_P_DS_T applies lse_log2), -inf and 0 past nq. By
 * 4-byte cp.async, committed as a group and waited for with the tile's copies
 * before the barrier that publishes them, so that no warp waits on these
 * loads: the kernels issue them with the next tile's copies, where a plain
 * load stalls its warp for the load's latency, and with it the warpgroup's
 * next wgmma (or the work-group's next barrier), every tile. */
#define NV_TILE_STATS(ts, m0_, hq_)                                                                \
    do {                                                                                           \
        const ulong row0_ = ((ulong)b * heads_q + (hq_)) * (ulong)nq;                              \
        for (int r_ = tid; r_ < BLOCK_M; r_ += WG) {                                               \
            const int i_ = (m0_) + r_;                                                             \
            if (i_ < nq) {                                                                         \
                nv_copy_f32(&(ts)[0][r_], lse + lse_off + row0_ + i_);                             \
                nv_copy_f32(&(ts)[1][r_], scratch + di_off + row0_ + i_);                          \
            } else {                                                                               \
                (ts)[0][r_] = -INFINITY;                                                           \
                (ts)[1][r_] = 0.0f;                                                                \
            }                                                                                      \
        }                                                                                          \
        NV_COMMIT_COPIES();                                                                        \
    } while (0)

/* A dK/dV warp's elementwise step: S^T in s and dP^T in dp (its 16 keys kw0..
 * x the BLOCK_M rows from m0; lane: keys g, g+8 x rows 8j+2t, +1) become P^T
 * and dS^T, with the rows' stats ts as NV_TILE_STATS left them; where masked,
 * pairs the mask hides or keys past nk get 0. */
#define NV_P_DS_T(s, dp, ts, m0, masked)                                                           \
    _Pragma("unroll") for (int j = 0; j < BLOCK_M / 8; ++j) {                                      \
        const int r = 8 * j + 2 * t;                                                               \
        const float2 lr = vload2(0, &(ts)[0][r]), di = vload2(0, &(ts)[1][r]);                     \
        const float2 l2 = (float2)(lse_log2(lr.x), lse_log2(lr.y));                                \
        _Pragma("unroll") for (int e = 0; e < 4; ++e) {                                            \
            float2 pd = p_and_ds((s)[j][e], (dp)[j][e], (e & 1) ? l2.y : l2.x, (e & 1) ? di.y : di.x, \
                                 scale, softcap);                                                  \
            if (masked) {                                                                          \
                const int key = kw0 + g + 8 * (e >> 1);                                            \
                const long d = (long)key - ((m0) + r + (e & 1));                                   \
                if (key >= nk || d < rel.x || d > rel.y)                                           \
                    pd = (float2)(0.0f, 0.0f);                                                     \
            }                                                                                      \
            (s)[j][e] = pd.x;                                                                      \
            (dp)[j][e] = pd.y;                                                                     \
        }                                                                                          \
    }

/* The opening of a dQ pass over the row block m0 (rows_q rows) of head hq: w0,
 * this warp's first row; lse2[h], di[h], the LSE (log2 units, +inf for none)
 * and D_i of this lane's rows w0 + g + 8h; rel; the keys [n_start, n_end] that
 * any row of the block sees, n_start on a BLOCK_N boundary; w_rows, the warp's
 * rows before nq (<= 0: none). */
#define NV_DQ_ROWS_AND_KEYS                                                                        \
    const int w0 = m0 + 16 * warp;                                                                 \
    const ulong row0 = ((ulong)b * get_global_size(1) + hq) * (ulong)nq;                           \
    float lse2[2], di[2];                                                                          \
    _Pragma("unroll") for (int h = 0; h < 2; ++h) {                                                \
        const int i = w0 + g + 8 * h;                                                              \
        lse2[h] = lse_log2(i < nq ? lse[lse_off + row0 + i] : -INFINITY);                          \
        di[h] = i < nq ? scratch[di_off + row0 + i] : 0.0f;                                        \
    }                                                                                              \
    const long2 rel = visible_rel(nq, nk, win_left, win_right);                                    \
    const long2 blk_first = visible_keys(m0, nq, nk, win_left, win_right);                         \
    const long2 blk_last = visible_keys(m0 + rows_q - 1, nq, nk, win_left, win_right);             \
    const int n_start = blk_first.x <= blk_last.y ? (int)(blk_first.x / BLOCK_N) * BLOCK_N : nk;   \
    const int n_end = (int)blk_last.y;                                                             \
    const int w_rows = min(16, nq - w0)

/* A dQ warp's elementwise step: S in s and dP in dp (its 16 rows w0.. x the
 * BLOCK_N keys from n0; lane: rows g, g+8 x keys 8j+2t, +1) become dS in dp;
 * where masked, pairs the mask hides or keys past nk get 0. */
#define NV_DS(s, dp, n0, masked)                                                                   \
    _Pragma("unroll") for (int j = 0; j < BLOCK_N / 8; ++j)                                        \
        _Pragma("unroll") for (int e = 0; e < 4; ++e) {                                            \
            float ds = p_and_ds((s)[j][e], (dp)[j][e], lse2[e >> 1], di[e >> 1], scale, softcap).y; \
            if (masked) {                                                                          \
                const int key = (n0) + 8 * j + 2 * t + (e & 1);                                    \
                const long d = (long)key - (w0 + g + 8 * (e >> 1));                                \
                if (key >= nk || d < rel.x || d > rel.y)                                           \
                    ds = 0.0f;                                                                     \
            }                                                                                      \
            (dp)[j][e] = ds;                                                                       \
        }

/* A dK/dV warp's 16 rows of dK and dV (dk_acc, dv_acc) stored, those before nk. */
#define NV_STORE_DKDV                                                                              \
    do {                                                                                           \
        if (kw0 < nk) {                                                                            \
            const int rows = min(16, nk - kw0);                                                    \
            STORE_ACC((__global ushort *)dk + ROW_AT(dk, b, kw0, hk), dk_ss, dk_acc, rows);        \
            STORE_ACC((__global ushort *)dv + ROW_AT(dv, b, kw0, hk), dv_ss, dv_acc, rows);        \
        }                                                                                          \
    } while (0)
#endif
