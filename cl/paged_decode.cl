/* paged_decode.cl: decoding (a few query rows per sequence) over paged or packed K/V, memory-bound.
 *
 * Same arguments, `meta` and grid as paged_attention.cl (which documents
 * them), plus counters_off: grid (block, kv head, split), a block being
 * BLOCK_M rows of one sequence, row r = (token r / group, query head
 * hk * group + r % group), and split s taking keys [s * chunk, (s + 1) *
 * chunk) into the float scratch; the last split to finish merges them (step
 * 6), so no combine kernel runs. This kernel computes the same thing as
 * paged_attention.cl for the case that matters in serving, a handful of rows
 * against a long context, where the work is reading K and V once at the
 * card's bandwidth:
 *
 *   - A key's row is read by LANES work-items, each one 16-byte load per
 *     CHUNKS (uint4 of 8 halves, or float4): consecutive lanes read
 *     consecutive bytes, so a warp reads whole 128-byte lines. Nothing goes
 *     through __local: K and V go from the load straight into registers.
 *   - The work-group is SLOTS = WG_SIZE / LANES key slots. Slot s takes keys
 *     base + u * SLOTS + s (u < UNROLL) of each step and keeps its own
 *     online-softmax state (m, l and the output accumulator of its D-slice
 *     for every row): no barrier in the key loop. The slots' states are
 *     merged once at the end through __local (flash-decoding's merge, inside
 *     the work-group).
 *   - Loads run STAGES - 1 steps ahead of the arithmetic. Each work-item
 *     copies its own chunks of a future step into its own __local slots and
 *     reads them back when that step comes: on NVIDIA with cp.async, so the
 *     bytes in flight cost no registers (UNROLL * 2 * 16 bytes per step per
 *     work-item, STAGES - 1 steps ahead); elsewhere with plain loads and
 *     stores. A work-item reads only what it wrote itself, so the pipeline
 *     needs no barrier either.
 *   - The BLOCK_M rows sharing the kv head (a GQA group) use each loaded K/V
 *     element BLOCK_M times. q lives in registers, pre-converted to float.
 *   - A key's score is a LANES-wide sum: each lane's partial dot product is
 *     reduced with butterfly shuffles (shfl.sync on NVIDIA, -DFLASHCL_NV_PTX;
 *     elsewhere one exchange through __local, which is what CPU devices run
 *     in the tests: same algorithm, slower).
 *
 * Requirements the host checks before choosing this kernel: HEAD_DIM a
 * multiple of VEC, K/V offsets and strides multiples of VEC (16-byte aligned
 * rows). Scores are in the base-2 domain as in paged_attention.cl:
 * t = s * scale * log2e (or softcap * log2e * tanh(s * scale / softcap)),
 * p = 2^(t - m), so the rounding of the row max cancels out of the result.
 *
 * FP8 pages (-DKV_FP8, common.cl): a lane's chunk is 8 bytes, 8 elements
 * (VEC 8, as with halves), so a lane keeps as many q and accumulator floats
 * as with 16-bit K/V (16-byte chunks of 16 elements doubled both, and the
 * kernel, out of registers, read FP8 at a quarter of f16's bytes/s on the
 * H200); a warp still reads whole 128-byte lines (two D=128 rows). The
 * __local pipeline stages raw bytes (cp.async.ca, which copies 8; .cg takes
 * only 16), decoded to float by bit arithmetic as they are read back
 * (unpack_chunk). The kv head's k descale multiplies q_mul, its v descale
 * the stored output.
 */

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BLOCK_M
#define BLOCK_M 4 /* rows per work-group (a GQA group of one token) */
#endif
#ifndef LANES
#define LANES 16 /* work-items per key: a power of two, at most 32 */
#endif
#ifndef WG_SIZE
#define WG_SIZE 128
#endif
#ifndef UNROLL
#define UNROLL 2 /* keys per slot per step */
#endif
#ifndef STAGES
#define STAGES 4 /* steps of K/V in __local: STAGES - 1 in flight */
#endif
#define MAX_SPLITS 128 /* FLASHCL_MAX_SPLITS (src/internal.h) */
#ifndef PAGE_SIZE
#define PAGE_SIZE 0 /* tokens per page; 0: packed K/V (varlen). A constant, so
                     * the per-key page lookup divides by multiply and shift. */
#endif

#if KV_FP8
#define VEC 8
typedef uint2 chunk_t;
#elif DTYPE == 0
#define VEC 4
typedef float4 chunk_t;
#else
#define VEC 8
typedef uint4 chunk_t;
#endif
#define NCHUNK (HEAD_DIM / VEC)                    /* chunks per row (16 bytes; 8 of FP8) */
#define CHUNKS ((NCHUNK + LANES - 1) / LANES)      /* per lane               */
#define DL (CHUNKS * VEC)                          /* elements per lane      */
#define SLOTS (WG_SIZE / LANES)
#define STEP (SLOTS * UNROLL)                      /* keys per step          */

#if HEAD_DIM % VEC != 0
#error "paged_decode needs HEAD_DIM to be a multiple of VEC (a chunk of elements)"
#endif
#if STAGES < 2 || STAGES > 8
#error "STAGES must be 2..8"
#endif
#if LANES > 32 || (LANES & (LANES - 1)) != 0 || WG_SIZE % LANES != 0
#error "LANES must be a power of two <= 32 dividing WG_SIZE"
#endif

#ifdef FLASHCL_NV_PTX
#define EXP2 ex2 /* the SFU's 2^x: probabilities need no more */
#else
#define EXP2 exp2
#endif

/* ---- 16-byte chunks to floats ---------------------------------------------------------- */

#if DTYPE == 1
/* Two halves of one word; the low half is the first element. */
inline float2 half2_to_float2(uint w) {
#ifdef FLASHCL_NV_PTX
    float lo, hi;
    __asm__("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
            "cvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
            : "=f"(lo), "=f"(hi)
            : "r"(w));
    return (float2)(lo, hi);
#else
    return vload_half2(0, (const half *)&w);
#endif
}
#endif

inline void unpack_chunk(chunk_t c, float *f) {
#if KV_FP8
    /* as_uchar8 keeps the bytes in memory order: element e is byte e. */
    const uchar8 b = as_uchar8(c);
    vstore8(FP8_DECODE8(KV_FP8, b), 0, f);
#elif DTYPE == 0
    f[0] = c.x, f[1] = c.y, f[2] = c.z, f[3] = c.w;
#else
    const uint w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#if DTYPE == 1
        const float2 x = half2_to_float2(w[i]);
        f[2 * i] = x.x, f[2 * i + 1] = x.y;
#else
        f[2 * i] = as_float(w[i] << 16), f[2 * i + 1] = as_float(w[i] & 0xffff0000u);
#endif
    }
#endif
}

/* ---- sums over the LANES work-items of a key ------------------------------------------- */

/* x[g] becomes the sum of x[g] over the LANES work-items sharing this key. */
#ifdef FLASHCL_NV_PTX
/* Reduce-scatter, then gather: while more than one row is left, each lane
 * keeps half the rows and trades the other half with its partner (BLOCK_M-1
 * shuffles in all, instead of BLOCK_M per level); once a lane holds one row,
 * plain butterflies finish its sum, and BLOCK_M indexed shuffles hand every
 * row's total to every lane. 4 rows over 16 lanes: 9 shuffles, not 16. */
#define RS_LEVELS (BLOCK_M < LANES ? BLOCK_M : LANES) /* rows split across lanes */
inline void lane_sums(float *x, __local float *xch) {
    const int lane = (int)get_local_id(0) % LANES;
    int rows = BLOCK_M, mask = LANES / 2, row_base = 0;
#pragma unroll
    for (int level = 1; level < RS_LEVELS; level *= 2) { /* halve the rows held */
        const int upper = (lane & mask) != 0;
        rows /= 2;
#pragma unroll
        for (int i = 0; i < BLOCK_M / 2; ++i) {
            if (i < rows) {
                const float send = upper ? x[i] : x[i + rows];
                const float keep = upper ? x[i + rows] : x[i];
                x[i] = keep + shfl_xor(send, mask);
            }
        }
        row_base += upper ? rows : 0;
        mask /= 2;
    }
    /* rows is now BLOCK_M / RS_LEVELS rows per lane (1 unless BLOCK_M > LANES). */
#pragma unroll
    for (; mask > 0; mask /= 2)
#pragma unroll
        for (int i = 0; i < BLOCK_M / RS_LEVELS; ++i)
            x[i] += shfl_xor(x[i], mask);
    /* Lane L holds rows row_base(L) .. +rows; row g lives on the lanes whose
     * top bits spell g / rows. Gather from the first such lane of the group. */
    const int group_first = (int)get_local_id(0) % 32 - lane;
    float held[BLOCK_M / RS_LEVELS];
#pragma unroll
    for (int i = 0; i < BLOCK_M / RS_LEVELS; ++i)
        held[i] = x[i];
#pragma unroll
    for (int g = 0; g < BLOCK_M; ++g) {
        const int owner = g / (BLOCK_M / RS_LEVELS); /* its top-bit pattern, msb first */
        int src = 0;
#pragma unroll
        for (int bit = LANES / 2, rem = RS_LEVELS / 2; rem > 0; rem /= 2, bit /= 2)
            src |= (owner & rem) ? bit : 0;
        x[g] = shfl_idx(held[g % (BLOCK_M / RS_LEVELS)], group_first + src);
    }
    (void)xch, (void)row_base;
}
#else
/* Through __local in one round (two barriers, whatever LANES and BLOCK_M:
 * CPU compilers turn each barrier into a loop split). Every work-item of the
 * group calls this equally often (the key loop's trip count is uniform), so
 * the barriers are legal. */
inline void lane_sums(float *x, __local float *xch) {
    const int lid = (int)get_local_id(0), first = lid - lid % LANES;
    for (int g = 0; g < BLOCK_M; ++g)
        xch[g * WG_SIZE + lid] = x[g];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int g = 0; g < BLOCK_M; ++g) {
        float sum = 0.0f;
        for (int j = 0; j < LANES; ++j)
            sum += xch[g * WG_SIZE + first + j];
        x[g] = sum;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

/* ---- the load pipeline ------------------------------------------------------------------ */

/* Chunk idx of this work-item's stage slots := *src, or zeros when !live. */
#if defined(FLASHCL_NV_PTX) && KV_FP8
/* 8-byte chunks: cp.async.ca (cp.async.cg copies 16 bytes only). */
#define FETCH16(stage, stage_base, idx, src, live)                                                 \
    __asm__ __volatile__("cp.async.ca.shared.global [%0], [%1], 8, %2;"                             \
                         :                                                                         \
                         : "r"((stage_base) + 8u * (uint)(idx)), "l"((ulong)(src)),                \
                           "r"((live) ? 8 : 0)                                                     \
                         : "memory")
#elif defined(FLASHCL_NV_PTX)
#define FETCH16(stage, stage_base, idx, src, live)                                                 \
    __asm__ __volatile__(CP_ASYNC_16 " [%0], [%1], 16, %2;"                                         \
                         :                                                                         \
                         : "r"((stage_base) + 16u * (uint)(idx)), "l"((ulong)(src)),               \
                           "r"((live) ? 16 : 0)                                                    \
                         : "memory")
#else
#define FETCH16(stage, stage_base, idx, src, live) ((stage)[idx] = (live) ? *(src) : (chunk_t)(0))
#endif
#ifdef FLASHCL_NV_PTX
#define FETCH_COMMIT() __asm__ __volatile__("cp.async.commit_group;" ::: "memory")
/* All but the newest STAGES - 1 groups have landed. */
#define FETCH_WAIT() __asm__ __volatile__("cp.async.wait_group %0;" ::"n"(STAGES - 1) : "memory")
#else
#define FETCH_COMMIT()
#define FETCH_WAIT()
#endif

/* Slot of (stage, key u, K or V, chunk c) for work-item lid: consecutive
 * work-items use consecutive 16 bytes, so a warp's accesses never conflict. */
#define STAGE_IDX(st, u, kv, c, lid) (((((st) * UNROLL + (u)) * 2 + (kv)) * CHUNKS + (c)) * WG_SIZE + (lid))

/* This work-item's D-slice of key u's K (kv 0) or V (kv 1) row in stage st, in float. */
inline void stage_row(__local const chunk_t *stage, int st, int u, int kv, float *f) {
    const int lid = (int)get_local_id(0);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c)
        unpack_chunk(stage[STAGE_IDX(st, u, kv, c, lid)], f + c * VEC);
}

/* Issues this work-item's loads of step j (keys s_lo + j * STEP + u * SLOTS
 * + slot) into stage j % STAGES. k_head, v_head: element offsets of the kv
 * head in row 0. Keys past s_hi and chunks past HEAD_DIM become zeros. */
inline void issue_step(int j, __local chunk_t *stage, uint stage_base, int s_lo, int s_hi,
                       __global const int *tables, int k_base,
                       __global const kv_t *restrict k, ulong k_head, ulong k_ss,
                       __global const kv_t *restrict v, ulong v_head, ulong v_ss) {
    const int lid = (int)get_local_id(0), slot = lid / LANES, lane = lid % LANES;
    const int st = j % STAGES;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int key = s_lo + j * STEP + u * SLOTS + slot;
        const int live = key <= s_hi;
        const uint kr = key_row(live ? key : s_lo, tables, k_base); /* a valid row to point at */
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            const int chunk = lane + c * LANES, use = live && chunk < NCHUNK;
            const ulong e = (ulong)(use ? chunk : 0) * VEC;
            FETCH16(stage, stage_base, STAGE_IDX(st, u, 0, c, lid),
                    (__global const chunk_t *)(k + k_head + (ulong)kr * k_ss + e), use);
            FETCH16(stage, stage_base, STAGE_IDX(st, u, 1, c, lid),
                    (__global const chunk_t *)(v + v_head + (ulong)kr * v_ss + e), use);
        }
    }
}

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
paged_decode(SERVING_ARGS,
             int counters_off SERVING_META_ARG) { /* meta[counters_off + block * heads_k + hk]: finished splits */
    /* The end-of-group merge: per slot and row, m and l; one row's D-wide
     * partial outputs of every slot at a time. */
    __local float red_m[SLOTS * BLOCK_M], red_l[SLOTS * BLOCK_M];
    __local float red_o[SLOTS * HEAD_DIM];
    __local chunk_t stage[STAGES * UNROLL * 2 * CHUNKS * WG_SIZE];
#ifdef FLASHCL_NV_PTX
    const uint stage_base = shared_addr(stage);
#else
    const uint stage_base = 0;
#endif
#ifdef FLASHCL_NV_PTX
    __local float *xch = NULL; /* unused: shuffles */
#else
    __local float xch[BLOCK_M * WG_SIZE];
#endif

    const int lid = (int)get_local_id(0);
    const int slot = lid / LANES, lane = lid % LANES;
    const int blk = (int)get_group_id(0);
    const int hk = (int)get_global_id(1);
    const int split = (int)get_global_id(2), splits = (int)get_global_size(2);
    const serving_block b = SERVING_BLOCK(blocks_off, blk);
    const int m0 = b.m0, q_start = b.q_start, nq = b.nq, k_base = b.k_base, nk = b.nk;
    const int rows = nq * group;

    /* q of every row, this lane's D-slice, in float. Padding rows (past the
     * sequence) and padding elements (past HEAD_DIM) are zero. */
    float qr[BLOCK_M][DL];
    int row_hi[BLOCK_M]; /* last visible key of each row; -1 for padding rows */
    const int shift = causal ? nk - nq : nk;
#pragma unroll
    for (int g = 0; g < BLOCK_M; ++g) {
        const int row = m0 + g;
        const int tok = row / group, hq = hk * group + row % group;
        row_hi[g] = row < rows ? (causal ? min(shift + tok, nk - 1) : nk - 1) : -1;
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            const int chunk = lane + c * LANES;
#pragma unroll
            for (int e = 0; e < VEC; ++e)
                qr[g][c * VEC + e] =
                    row < rows && chunk < NCHUNK
                        ? LOAD_ELEM(q, q_off + (ulong)(q_start + tok) * q_ss + (ulong)hq * q_sh + chunk * VEC + e)
                        : 0.0f;
        }
    }
    int blk_hi = -1;
#pragma unroll
    for (int g = 0; g < BLOCK_M; ++g)
        blk_hi = max(blk_hi, row_hi[g]);
    /* This split's slice, cut as paged_attention.cl cuts it (chunk rounded to
     * 32 keys there; any multiple works, the combine only needs disjoint
     * slices covering the keys). */
    const long chunk_keys = (((long)nk + splits - 1) / splits + 31) / 32 * 32;
    const int s_lo = (int)min((long)split * chunk_keys, (long)nk);
    const int s_hi = (int)min(s_lo + chunk_keys - 1, (long)blk_hi);

    const int capped = softcap_log2 > 0.0f;
    const float kq_mul = q_mul * K_DESCALE(hk); /* keys are k descale * decode(byte) on FP8 pages */
    float m[BLOCK_M], l[BLOCK_M], acc[BLOCK_M][DL];
#pragma unroll
    for (int g = 0; g < BLOCK_M; ++g) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int d = 0; d < DL; ++d)
            acc[g][d] = 0.0f;
    }

    const int steps = s_hi >= s_lo ? (s_hi - s_lo) / STEP + 1 : 0;
    for (int j = 0; j < STAGES - 1; ++j) {
        if (j < steps)
            issue_step(j, stage, stage_base, s_lo, s_hi, tables, k_base, k, k_off + (ulong)hk * k_sh, k_ss,
                       v, v_off + (ulong)hk * v_sh, v_ss);
        FETCH_COMMIT(); /* empty groups keep the count uniform */
    }
    for (int i = 0; i < steps; ++i) {
        /* 1. Loads of step i + STAGES - 1 into the stage step i - 1 used;
         *    then wait for step i's. */
        if (i + STAGES - 1 < steps)
            issue_step(i + STAGES - 1, stage, stage_base, s_lo, s_hi, tables, k_base, k,
                       k_off + (ulong)hk * k_sh, k_ss, v, v_off + (ulong)hk * v_sh, v_ss);
        FETCH_COMMIT();
        FETCH_WAIT();
        const int st = i % STAGES;
        int key[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            key[u] = s_lo + i * STEP + u * SLOTS + slot;
        /* 2. Scores (base 2), masked per row. */
        float s[UNROLL][BLOCK_M];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            float kf[DL];
            stage_row(stage, st, u, 0, kf);
            float dot[BLOCK_M];
#pragma unroll
            for (int g = 0; g < BLOCK_M; ++g) {
                dot[g] = 0.0f;
#pragma unroll
                for (int d = 0; d < DL; ++d)
                    dot[g] = fma(qr[g][d], kf[d], dot[g]);
            }
            lane_sums(dot, xch);
#pragma unroll
            for (int g = 0; g < BLOCK_M; ++g) {
                const float t = capped ? softcap_log2 * tanh(dot[g] * kq_mul) : dot[g] * kq_mul;
                s[u][g] = key[u] <= row_hi[g] && key[u] <= s_hi ? t : -INFINITY;
            }
        }
        /* 3. Online softmax over the step's UNROLL keys; one rescale per step. */
#pragma unroll
        for (int g = 0; g < BLOCK_M; ++g) {
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                mx = fmax(mx, s[u][g]);
            if (mx == -INFINITY)
                continue; /* nothing visible yet: acc and l stay 0 */
            if (mx > m[g]) { /* rescale only when the max moves (rarely, late in the keys) */
                const float alpha = EXP2(m[g] - mx); /* m = -inf gives 0: acc is 0 anyway */
                m[g] = mx;
                l[g] *= alpha;
#pragma unroll
                for (int d = 0; d < DL; ++d)
                    acc[g][d] *= alpha;
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                s[u][g] = EXP2(s[u][g] - mx); /* -inf -> 0 */
        }
        /* 4. acc += P V. */
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            float vf[DL];
            stage_row(stage, st, u, 1, vf);
#pragma unroll
            for (int g = 0; g < BLOCK_M; ++g) {
                if (m[g] == -INFINITY)
                    continue; /* s still holds -inf scores for this row */
                const float p = s[u][g];
                l[g] += p;
#pragma unroll
                for (int d = 0; d < DL; ++d)
                    acc[g][d] = fma(p, vf[d], acc[g][d]);
            }
        }
    }

    /* 5. Merge the slots: every lane of a slot holds the same m and l. */
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < BLOCK_M; ++g) {
            red_m[slot * BLOCK_M + g] = m[g];
            red_l[slot * BLOCK_M + g] = l[g];
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int g = 0; g < BLOCK_M; ++g) {
        const int row = m0 + g;
        float mx = -INFINITY, sum = 0.0f;
        for (int t = 0; t < SLOTS; ++t)
            mx = fmax(mx, red_m[t * BLOCK_M + g]);
        for (int t = 0; t < SLOTS; ++t)
            if (red_m[t * BLOCK_M + g] != -INFINITY)
                sum += red_l[t * BLOCK_M + g] * exp2(red_m[t * BLOCK_M + g] - mx);
        const float w = m[g] == -INFINITY ? 0.0f : exp2(m[g] - mx);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            const int chunk = lane + c * LANES;
            if (chunk < NCHUNK)
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    red_o[slot * HEAD_DIM + chunk * VEC + e] = acc[g][c * VEC + e] * w;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (row < rows) {
            const float inv_l = sum > 0.0f ? V_DESCALE(hk) / sum : 0.0f; /* V_DESCALE: 1 unless FP8 */
            const float row_lse = sum > 0.0f ? (mx + log2(sum)) * LN2 : -INFINITY;
            const ulong token = (ulong)(q_start + row / group);
            const int hq = hk * group + row % group;
            const ulong prow = ((ulong)split * total_q + token) * heads_q + hq;
            for (int d = lid; d < HEAD_DIM; d += WG_SIZE) {
                float x = 0.0f;
                for (int t = 0; t < SLOTS; ++t)
                    x += red_o[t * HEAD_DIM + d];
                if (splits == 1)
                    STORE_ELEM(o, o_off + token * o_ss + (ulong)hq * o_sh + d, x * inv_l);
                else /* partial results stay in float: merged, then rounded once */
                    PART_STORE(part, prow * HEAD_DIM + d, x * inv_l);
            }
            if (lid == 0) {
                if (splits > 1)
                    PART_STORE(part, part_lse_off + prow, row_lse);
                else if (has_lse)
                    lse[lse_off + (ulong)hq * total_q + token] = row_lse;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (splits == 1)
        return;

    /* 6. Split-KV: the last split of this (block, kv head) to finish merges
     *    them all (common_serving.cl), which saves the combine launch. */
    __local float wts[BLOCK_M * MAX_SPLITS]; /* [row][split] */
    __local int is_last;
    const split_rows sr = {o_off, o_ss, o_sh, lse_off, part_lse_off, has_lse, total_q, heads_q, group, hk,
                           q_start, m0, min(BLOCK_M, rows - m0)};
    const int counter_at = counters_off + (blk * (int)get_global_size(1) + hk) * split_counters(splits);
    merge_if_last_split(&meta[counter_at], splits, part, o, lse, sr, HEAD_DIM, wts, red_m, &is_last);
}
