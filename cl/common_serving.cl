/* common_serving.cl: the pieces the serving kernels share (paged_attention,
 * paged_decode, paged_decode_nv): their argument list, the FP8 page scales,
 * the batch description, and the decode kernels' split-KV merge, which the
 * last split of a row runs (cl/merge.cl is the standalone merge).
 *
 * Prepended to every kernel after common.cl, common_nv.cl and common_nv_bwd.cl (src/program.c).
 */

/* The arguments of the serving kernels, paged_attention (cl/paged_attention.cl),
 * paged_decode and paged_decode_nv: one list, so src/serving.c sets them once
 * for any (the decode kernels take counters_off after it, and built with
 * META_ARG_INTS the description by value after that). part: the
 * split-KV scratch (part_o, then part_lse); meta: the batch description
 * (fill_meta in src/serving.c); tables: the page tables (the KV cache's
 * device copy; a sequence's starts at its k_base); offsets and (token, head) strides in
 * elements; q_mul = scale*log2e, or scale/softcap; softcap_log2 =
 * softcap*log2e, 0 when off. */
#define SERVING_ARGS                                                                               \
    __global const elem_t *restrict q, __global const kv_t *restrict k,                            \
        __global const kv_t *restrict v, __global elem_t *restrict o,                              \
        __global float *restrict lse, __global float *part, __global int *meta,                   \
        __global const int *restrict tables, ulong q_off,                                          \
        ulong q_ss, ulong q_sh, ulong k_off, ulong k_ss, ulong k_sh, ulong v_off, ulong v_ss,      \
        ulong v_sh, ulong o_off, ulong o_ss, ulong o_sh, ulong lse_off, ulong part_lse_off,        \
        int has_lse, int blocks_off, int total_q, int heads_q, int group, int page_size,           \
        int causal, float q_mul, float softcap_log2 SERVING_KV_SCALES

/* FP8 pages (-DKV_FP8, a KV cache with page_dtype FP8): k and v are bytes
 * and the kernels take the cache's scales after softcap_log2, [heads_k][4] =
 * {k descale, v descale, k inverse, v inverse} (src/kv_cache.c). A key reads
 * as K_DESCALE(hk) * LOAD_KV(...): the kernels fold K_DESCALE into q_mul (one
 * multiply per kv head, none per element) and V_DESCALE into the stored
 * output, which is linear in V (so split-KV partials carry it, and merging
 * them is unchanged). 16/32-bit pages: no argument, both 1. */
#if KV_FP8
#define SERVING_KV_SCALES , __global const float *restrict kv_scales
#define K_DESCALE(hk) kv_scales[4 * (hk)]
#define V_DESCALE(hk) kv_scales[4 * (hk) + 1]
#else
#define SERVING_KV_SCALES
#define K_DESCALE(hk) 1.0f
#define V_DESCALE(hk) 1.0f
#endif

/* The serving kernels' batch description (src/serving.c builds it): per
 * sequence {q_start, nq, k_base, nk} from meta[0], and from blocks_off one
 * {sequence, first row} pair per work block. */
typedef struct serving_block {
    int m0, q_start, nq, k_base, nk;
} serving_block;

inline serving_block serving_block_at(__global const int *meta, int blocks_off, int blk) {
    const int seq = meta[blocks_off + 2 * blk];
    serving_block b = {meta[blocks_off + 2 * blk + 1], meta[4 * seq], meta[4 * seq + 1],
                       meta[4 * seq + 2], meta[4 * seq + 3]};
    return b;
}

/* The decode kernels' K/V row of a sequence's key n, PAGE_SIZE being their
 * compile-time page size: through the page table (k_base: where it starts in
 * `tables`), or k_base + n for packed varlen K/V (PAGE_SIZE 0). */
inline uint key_row(int n, __global const int *tables, int k_base) {
#if defined(PAGE_SIZE) && PAGE_SIZE
    return (uint)tables[k_base + n / PAGE_SIZE] * PAGE_SIZE + n % PAGE_SIZE;
#else
    return (uint)(k_base + n);
#endif
}

/* The decode kernels take the description (the part above, counters_off
 * ints) either in `meta`, uploaded per call, or, built with META_ARG_INTS >
 * 0, by value in the argument meta_arg after counters_off (no upload: the
 * call is one kernel launch). `meta` then holds only the split counters,
 * which stay zero between calls: the last split resets its own
 * (merge_if_last_split). SERVING_BLOCK(blocks_off, blk) reads block blk's
 * from wherever it is. */
#ifndef META_ARG_INTS
#define META_ARG_INTS 0
#endif
#if META_ARG_INTS
typedef struct serving_meta_arg {
    int v[META_ARG_INTS];
} serving_meta_arg;
#define SERVING_META_ARG , serving_meta_arg meta_arg
inline serving_block serving_block_by_value(const serving_meta_arg *m, int blocks_off, int blk) {
    const int seq = m->v[blocks_off + 2 * blk];
    serving_block b = {m->v[blocks_off + 2 * blk + 1], m->v[4 * seq], m->v[4 * seq + 1], m->v[4 * seq + 2],
                       m->v[4 * seq + 3]};
    return b;
}
#define SERVING_BLOCK(blocks_off, blk) serving_block_by_value(&meta_arg, blocks_off, blk)
#else
#define SERVING_META_ARG
#define SERVING_BLOCK(blocks_off, blk) serving_block_at(meta, blocks_off, blk)
#endif

/* ---- split-KV: the last split merges (the decode kernels) -------------------------------- */

/* The partial results one work-group leaves for the last to arrive: on
 * NVIDIA plain stores and volatile loads behind the writers' fence and the
 * counter's atomic, CUDA's threadfence reduction, which PTX's memory model
 * orders. OpenCL 1.2's model does not order plain accesses of two work-groups
 * through a fence, so elsewhere each element goes through an atomic: Oclgrind
 * --data-races then finds nothing (it reported ~1000 races a run in
 * paged_decode.cl's merge), at an atomic per element of the few parts. */
#ifdef FLASHCL_NV_PTX
#define PART_LOAD(p, i) (((volatile __global const float *)(p))[i])
#define PART_STORE(p, i, x) ((p)[i] = (x))
#else
#define PART_LOAD(p, i) as_float(atomic_or((volatile __global uint *)(p) + (i), 0u))
#define PART_STORE(p, i, x) ((void)atomic_xchg((volatile __global uint *)(p) + (i), as_uint(x)))
#endif

#ifndef MERGE_VEC4
/* The merge reads the parts in 16-byte runs where head_dim % 4 == 0 (0: one
 * float at a time). H200, 66 splits at batch 1: the decode kernel 4-5 us
 * shorter at 64k-128k keys, level elsewhere (BENCHMARKS.md). Elsewhere the
 * parts go through atomics (PART_LOAD), one float at a time. */
#ifdef FLASHCL_NV_PTX
#define MERGE_VEC4 1
#else
#define MERGE_VEC4 0
#endif
#endif
#if MERGE_VEC4
inline float4 fma4(float w, float4 y, float4 x) {
    return (float4)(fma(w, y.x, x.x), fma(w, y.y, x.y), fma(w, y.z, x.z), fma(w, y.w, x.w));
}
#endif

/* Where a block's rows go: output and LSE layouts, the float split scratch
 * (part_o [split][token][heads_q][head_dim], then part_lse from element
 * part_lse_off), and which rows (m0 .. m0 + nrows - 1 of kv head hk). */
typedef struct split_rows {
    ulong o_off, o_ss, o_sh, lse_off, part_lse_off;
    int has_lse, total_q, heads_q, group, hk, q_start, m0, nrows;
} split_rows;

/* Element e of the block's rows (row-major, head_dim a row): its offset in
 * one split's part_o, and in the output. */
inline ulong split_part_at(split_rows r, int e, int head_dim) {
    const int row = r.m0 + e / head_dim;
    return ((ulong)(r.q_start + row / r.group) * r.heads_q + r.hk * r.group + row % r.group) * head_dim +
           e % head_dim;
}

inline ulong split_out_at(split_rows r, int e, int head_dim) {
    const int row = r.m0 + e / head_dim;
    return r.o_off + (ulong)(r.q_start + row / r.group) * r.o_ss + (ulong)(r.hk * r.group + row % r.group) * r.o_sh +
           e % head_dim;
}

#ifndef MERGE_GROUP
#define MERGE_GROUP 8 /* splits a first-level merge takes (FLASHCL_MERGE_GROUP, src/internal.h) */
#endif
/* Two levels above 2 * MERGE_GROUP splits; the split counters of one (block,
 * kv head): one, and with two levels one more per run of MERGE_GROUP
 * (flashcl_split_counters, src/internal.h). */
#define TWO_LEVELS(splits) ((splits) > 2 * MERGE_GROUP)
inline int split_counters(int splits) {
    return TWO_LEVELS(splits) ? 1 + (splits + MERGE_GROUP - 1) / MERGE_GROUP : 1;
}

/* Merges `splits` partial results, those in slots first + t * step (t <
 * splits), with merge.cl's rule (weights exp(L_s - max L) / sum; a part
 * with L = -inf, no key in its slice, weighs 0; no key at all gives O = 0
 * and LSE -inf): into the output (final) or, as a partial result again,
 * into slot `first` (each work-item reads all of its elements' parts before
 * it writes them). wts: nrows * splits floats of __local; row_lse: nrows. */
__attribute__((always_inline)) inline void merge_parts(__global float *part, int first, int splits, int step,
                                                      int final, __global elem_t *o, __global float *lse,
                                                      split_rows r, int head_dim, __local float *wts,
                                                      __local float *row_lse) {
    const int lid = (int)get_local_id(0), wg = (int)get_local_size(0);
#if MERGE_VEC4
    /* Volatile reads, past the L1 cache: an SM's L1 may still hold a line of
     * a run's first slot from before that run's merge rewrote it (another
     * work-group of the SM read the split's part there). */
    volatile __global const float *vpart = part;
#endif
    /* Every part's LSE into __local (a work-item's loads four at a time, all
     * issued before the first is stored), each row's max and log-sum, the
     * weights. */
    for (int e = lid; e < r.nrows * splits; e += wg) {
        const int row = r.m0 + e / splits;
        wts[e] = PART_LOAD(part, r.part_lse_off + ((ulong)(first + (e % splits) * step) * r.total_q +
                                                   (ulong)(r.q_start + row / r.group)) * r.heads_q +
                                r.hk * r.group + row % r.group);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < r.nrows) {
        float mx = -INFINITY, wsum = 0.0f;
        for (int t = 0; t < splits; ++t)
            mx = fmax(mx, wts[lid * splits + t]);
        for (int t = 0; t < splits && mx != -INFINITY; ++t)
            wsum += exp(wts[lid * splits + t] - mx); /* -inf -> 0 */
        row_lse[lid] = mx == -INFINITY ? -INFINITY : mx + log(wsum);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = lid; e < r.nrows * splits; e += wg) {
        const float l = row_lse[e / splits];
        wts[e] = l == -INFINITY ? 0.0f : exp(wts[e] - l);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    /* The outputs: four elements per work-item per pass, the splits' loads
     * issued 4 x 8 at a time. This tail is a chain of round trips to L2
     * that the whole launch waits on, so it is written for loads in flight.
     * (The reads are volatile, above.) */
    const ulong stride = (ulong)r.total_q * r.heads_q * head_dim; /* one split's part_o */
#define SLOT(t) ((ulong)(first + (t) * step) * stride)
    const int total = r.nrows * head_dim;
#if MERGE_VEC4
    /* Whole 16-byte runs of a row: two per work-item per pass, the splits'
     * loads issued 2 x 8 at a time (part is a buffer's start, head_dim and
     * every offset multiples of 4). */
    if (head_dim % 4 == 0) {
        const int total4 = total / 4;
        for (int c0 = lid; c0 < total4; c0 += 2 * wg) {
            ulong src[2];
            int gr[2];
            float4 x[2] = {(float4)(0.0f), (float4)(0.0f)};
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int e = 4 * min(c0 + j * wg, total4 - 1); /* past the end: not stored */
                gr[j] = e / head_dim;
                src[j] = split_part_at(r, e, head_dim);
            }
            int t = 0;
            for (; t + 8 <= splits; t += 8) {
                float4 y[2][8];
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int i = 0; i < 8; ++i)
                        y[j][i] = *(volatile __global const float4 *)(vpart + src[j] + SLOT(t + i));
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int i = 0; i < 8; ++i)
                        x[j] = fma4(wts[gr[j] * splits + t + i], y[j][i], x[j]);
            }
            for (; t < splits; ++t)
#pragma unroll
                for (int j = 0; j < 2; ++j)
                    x[j] = fma4(wts[gr[j] * splits + t],
                                *(volatile __global const float4 *)(vpart + src[j] + SLOT(t)), x[j]);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int e = 4 * (c0 + j * wg);
                if (e < total && !final) {
                    *(__global float4 *)(part + src[j] + SLOT(0)) = x[j];
                } else if (e < total) {
                    const ulong at = split_out_at(r, e, head_dim);
                    STORE_ELEM(o, at, x[j].x);
                    STORE_ELEM(o, at + 1, x[j].y);
                    STORE_ELEM(o, at + 2, x[j].z);
                    STORE_ELEM(o, at + 3, x[j].w);
                }
            }
        }
    } else
#endif
    for (int e0 = lid; e0 < total; e0 += 4 * wg) {
        ulong src[4];
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int g[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int e = min(e0 + j * wg, total - 1); /* past the end: a duplicate, not stored */
            g[j] = e / head_dim;
            src[j] = split_part_at(r, e, head_dim);
        }
        int t = 0;
        for (; t + 8 <= splits; t += 8) {
            float y[4][8];
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int i = 0; i < 8; ++i)
                    y[j][i] = PART_LOAD(part, src[j] + SLOT(t + i));
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int i = 0; i < 8; ++i)
                    x[j] = fma(wts[g[j] * splits + t + i], y[j][i], x[j]);
        }
        for (; t < splits; ++t)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                x[j] = fma(wts[g[j] * splits + t], PART_LOAD(part, src[j] + SLOT(t)), x[j]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int e = e0 + j * wg;
            if (e < total && !final)
                PART_STORE(part, src[j] + SLOT(0), x[j]);
            else if (e < total)
                STORE_ELEM(o, split_out_at(r, e, head_dim), x[j]);
        }
    }
    if (lid < r.nrows) {
        const int row = r.m0 + lid;
        const ulong token = (ulong)(r.q_start + row / r.group);
        const int hq = r.hk * r.group + row % r.group;
        if (!final) /* the merged part's LSE, in its slot */
            PART_STORE(part, r.part_lse_off + ((ulong)first * r.total_q + token) * r.heads_q + hq, row_lse[lid]);
        else if (r.has_lse)
            lse[r.lse_off + (ulong)hq * r.total_q + token] = row_lse[lid];
    }
#undef SLOT
}

/* Whether this work-group is the last of n to arrive at *counter, once its
 * results are globally visible (every writer fences, as CUDA's threadfence
 * reduction does). The counter is zeroed by the host's upload of the batch
 * description, or, META_ARG_INTS, left zero by the previous call's last
 * arrival, which resets it. flag: one int of __local. */
__attribute__((always_inline)) inline int last_to_arrive(__global int *counter, int n, __local int *flag) {
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) {
        const int last = atomic_inc(counter) == n - 1;
        *flag = last;
#if META_ARG_INTS
        if (last) /* every group has counted: zero again for the next call */
            atomic_xchg(counter, 0);
#endif
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* (the next call's first barrier orders these reads before its write) */
    const int last = *flag;
    if (last)
        mem_fence(CLK_GLOBAL_MEM_FENCE);
    return last;
}

/* Split s of a (block, kv head) calls this with every work-item after it
 * wrote its partial results (O as float, LSE) to slot s. Up to 2 *
 * MERGE_GROUP splits, the last to finish merges them all. Above, in two
 * levels, so that the merge the whole launch waits on reads few parts: the
 * last of each run of MERGE_GROUP consecutive splits merges that run into
 * the run's first slot while other splits still compute, and the last of
 * those merges the runs' results. H200, one sequence of 65536 keys, 66
 * splits: the one-level merge took 10.5 of the decode kernel's 91 us, two
 * levels 4-5 us less; at 16 splits two levels were 1 us slower
 * (BENCHMARKS.md).
 * counters: split_counters(splits) ints, the whole (block, kv head)'s first;
 * wts: nrows * splits floats of __local; row_lse: nrows; flag: one int. */
inline void merge_if_last_split(__global int *counters, int splits, __global float *part, __global elem_t *o,
                                __global float *lse, split_rows r, int head_dim, __local float *wts,
                                __local float *row_lse, __local int *flag) {
    /* One call site each for last_to_arrive and merge_parts, in a loop of
     * one or two levels: PoCL runs a work-group's work-items as loops
     * between barriers, and gave wrong LSEs with merge_parts (barriers
     * inside) called from three places. */
    const int levels = TWO_LEVELS(splits) ? 2 : 1, runs = (splits + MERGE_GROUP - 1) / MERGE_GROUP;
    const int run = levels == 2 ? (int)get_group_id(2) / MERGE_GROUP : 0;
    for (int level = 0; level < levels; ++level) {
        const int final = level == levels - 1, top = final && levels == 2;
        const int first = final ? 0 : run * MERGE_GROUP;
        const int count = top ? runs : final ? splits : min(MERGE_GROUP, splits - first);
        if (!last_to_arrive(final ? counters : counters + 1 + run, count, flag))
            return;
        merge_parts(part, first, count, top ? MERGE_GROUP : 1, final, o, lse, r, head_dim, wts, row_lse);
    }
}
