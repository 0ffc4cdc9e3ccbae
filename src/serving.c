/* serving.c: merging partial results, and attention over varlen batches and the paged KV cache with split-KV.
 *
 * One launcher serves flashcl_varlen_forward and flashcl_paged_attention: both
 * become one kernel over a list of work blocks, differing only in how a
 * key's row is found (cu_seqlens_k offsets or page tables). The kernel is
 * one of three with the same arguments (the decode kernels take counters_off,
 * and with META_ARGS the description by value, after them):
 * cl/paged_decode_nv.cl (few rows per sequence on NVIDIA tensor cores),
 * cl/paged_decode.cl (few rows per sequence, any GPU: memory-bound SIMT) or
 * cl/paged_attention.cl (anything else). A call:
 *   1. checks the descriptor (make_plan) and asks flashcl_decode_params
 *      (params_serving.c) for the kernel, its tiles and the split count;
 *   2. writes `meta` on the host (fill_meta): per sequence {q_start, nq,
 *      k_base, nk} and the block list (the page tables are on the device
 *      already: the cache keeps them there, kv_cache.c);
 *   3. enqueues the attention kernel, then for the tiled kernel with
 *      splits > 1 the combine
 *      kernel of cl/merge.cl over the caller's scratch.
 * meta (a few ints per sequence and block) goes to a decode kernel as a
 * by-value argument when it fits (META_ARGS, on unless FLASHCL_DECODE_PARAMS
 * says META_ARGS=0: no upload command, 8-15 us a call on the H200); otherwise
 * it is uploaded without blocking into a device buffer the context keeps
 * (upload_meta), so the call never waits on the queue.
 * FP8 pages (a cache with page_dtype e4m3/e5m2): the kernel is built with
 * -DKV_FP8=<format> and takes the cache's scales buffer after softcap_log2
 * (SERVING_KV_SCALES, cl/common_serving.cl); the decode kernel or the tiled one
 * runs, or on NVIDIA sm_89+ with float16 queries the mma kernel, which widens
 * the bytes in registers (params_serving.c).
 * Partial results, which scale with the problem, go in the caller's scratch
 * (flashcl_*_scratch_size). The kernels are chained by
 * events, so an out-of-order queue works.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serving.h"

/* ---- shared checks -------------------------------------------------------------------- */

/* ---- merge ----------------------------------------------------------------------------- */

typedef struct merge_extents {
    size_t o1, o2, out;       /* bytes */
    size_t lse1, lse2, lse_out; /* bytes */
} merge_extents;

static flashcl_status resolve_merge(flashcl_context *ctx, const flashcl_merge_desc *d, flashcl_merge_desc *r,
                                    merge_extents *e) {
    if (!d)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
    size_t es = flashcl_dtype_size(d->dtype);
    flashcl_status st = flashcl_check_dtype(ctx, d->dtype);
    if (st)
        return st;
    if (d->batch < 1 || d->seqlen < 1 || d->heads < 1 || d->head_dim < 1)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                            "invalid merge shape: batch %d, seqlen %d, heads %d, head_dim %d (all >= 1)",
                            d->batch, d->seqlen, d->heads, d->head_dim);
    *r = *d;
    flashcl_default_layout(&r->o1, r->seqlen, r->heads, r->head_dim);
    flashcl_default_layout(&r->o2, r->seqlen, r->heads, r->head_dim);
    flashcl_default_layout(&r->out, r->seqlen, r->heads, r->head_dim);
    size_t rows = (size_t)r->batch * (size_t)r->heads * (size_t)r->seqlen;
    e->o1 = flashcl_layout_bytes(&r->o1, r->batch, r->seqlen, r->heads, r->head_dim, es);
    e->o2 = flashcl_layout_bytes(&r->o2, r->batch, r->seqlen, r->heads, r->head_dim, es);
    e->out = flashcl_layout_bytes(&r->out, r->batch, r->seqlen, r->heads, r->head_dim, es);
    int ok = e->o1 && e->o2 && e->out && flashcl_mul_add(r->lse1_offset + rows, 4, 0, &e->lse1) &&
             flashcl_mul_add(r->lse2_offset + rows, 4, 0, &e->lse2) &&
             flashcl_mul_add(r->lse_out_offset + rows, 4, 0, &e->lse_out);
    if (!ok)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "strides or offsets overflow size_t");
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_attention_merge(flashcl_context *ctx, const flashcl_merge_desc *desc, cl_mem o1,
                                       cl_mem lse1, cl_mem o2, cl_mem lse2, cl_mem out, cl_mem lse_out,
                                       cl_event *event) {
    FLASHCL_LOCKED(ctx);
    const flashcl_status entry = flashcl_device_entry(ctx, "flashcl_attention_merge_host");
    if (entry != FLASHCL_SUCCESS)
        return entry;
    flashcl_merge_desc r;
    merge_extents e;
    flashcl_status st = resolve_merge(ctx, desc, &r, &e);
    if (st)
        return st;
    if ((st = flashcl_check_buffer(ctx, "o1", o1, e.o1)) || (st = flashcl_check_buffer(ctx, "lse1", lse1, e.lse1)) ||
        (st = flashcl_check_buffer(ctx, "o2", o2, e.o2)) || (st = flashcl_check_buffer(ctx, "lse2", lse2, e.lse2)) ||
        (st = flashcl_check_buffer(ctx, "out", out, e.out)) ||
        (lse_out && (st = flashcl_check_buffer(ctx, "lse_out", lse_out, e.lse_out))))
        return st;
    if (lse_out && (lse_out == lse1 || lse_out == lse2))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "lse_out must not be lse1 or lse2");
    if ((size_t)r.seqlen * (size_t)r.heads > 0x7fffffffu)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "seqlen * heads exceeds 2^31");

    char options[64];
    /* flashcl_get_kernel keeps one kernel per (file, options): merge.cl's two
     * kernels differ by a -D naming the kernel, which the source ignores. */
    snprintf(options, sizeof options, "-cl-std=CL1.2 -DDTYPE=%d", (int)r.dtype);
    cl_kernel kernel;
    if ((st = flashcl_get_kernel(ctx, "merge.cl", "attn_merge", options, &kernel)))
        return st;
    cl_ulong u[15] = {r.o1.offset,  r.o1.stride_batch,  r.o1.stride_seq,  r.o1.stride_head,
                      r.o2.offset,  r.o2.stride_batch,  r.o2.stride_seq,  r.o2.stride_head,
                      r.out.offset, r.out.stride_batch, r.out.stride_seq, r.out.stride_head,
                      r.lse1_offset, r.lse2_offset, r.lse_out_offset};
    cl_int has = lse_out != NULL, n = r.seqlen, h = r.heads;
    cl_mem lse_arg = lse_out ? lse_out : lse1; /* never written when has == 0 */
    cl_uint a = 0;
    cl_int err = clSetKernelArg(kernel, a++, sizeof(cl_mem), &o1);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &lse1);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &o2);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &lse2);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &out);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &lse_arg);
    for (int i = 0; i < 15; ++i)
        err |= clSetKernelArg(kernel, a++, sizeof(cl_ulong), &u[i]);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &has);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &n);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &h);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, CL_INVALID_KERNEL_ARGS, "clSetKernelArg failed");
    size_t global[3] = {(size_t)r.head_dim, (size_t)r.seqlen * (size_t)r.heads, (size_t)r.batch};
    err = clEnqueueNDRangeKernel(ctx->queue, kernel, 3, NULL, global, NULL, 0, NULL, event);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, err, "launching attn_merge: %s", flashcl_status_string(err));
    return FLASHCL_SUCCESS;
}

/* Storage loads and stores for the host merge (round to nearest even). */
static float host_load(const void *p, flashcl_dtype dt, size_t i) {
    if (dt == FLASHCL_FLOAT32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    uint32_t bits;
    float f;
    if (dt == FLASHCL_BFLOAT16) {
        bits = (uint32_t)h << 16;
    } else {
        uint32_t sign = (uint32_t)(h & 0x8000) << 16, ex = (h >> 10) & 0x1f, man = h & 0x3ff;
        if (ex == 0x1f)
            bits = sign | 0x7f800000u | (man << 13);
        else if (ex == 0) {
            f = ldexpf((float)man, -24);
            return sign ? -f : f;
        } else
            bits = sign | ((ex + 112) << 23) | (man << 13);
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void host_store(void *p, flashcl_dtype dt, size_t i, float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if (dt == FLASHCL_FLOAT32) {
        ((float *)p)[i] = f;
    } else if (dt == FLASHCL_BFLOAT16) {
        if ((x & 0x7fffffffu) > 0x7f800000u)
            ((uint16_t *)p)[i] = (uint16_t)((x >> 16) | 0x40);
        else
            ((uint16_t *)p)[i] = (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
    } else {
        uint32_t sign = (x >> 16) & 0x8000, a = x & 0x7fffffffu, h;
        if (a > 0x7f800000u)
            h = sign | 0x7e00;
        else if (a >= 0x477ff000u)
            h = sign | 0x7c00;
        else if (a < 0x38800000u)
            h = sign | (uint32_t)nearbyintf(fabsf(f) * 16777216.0f); /* subnormal, exact scaling */
        else {
            h = (a >> 13) - (112u << 10);
            uint32_t rest = a & 0x1fff;
            if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
                h++;
            h |= sign;
        }
        ((uint16_t *)p)[i] = (uint16_t)h;
    }
}

/* The merge in C, the same arithmetic as attn_merge. */
static void host_merge(const flashcl_merge_desc *r, const void *o1, const float *lse1, const void *o2,
                       const float *lse2, void *out, float *lse_out) {
    for (int b = 0; b < r->batch; ++b)
        for (int n = 0; n < r->seqlen; ++n)
            for (int h = 0; h < r->heads; ++h) {
                size_t lrow = ((size_t)b * r->heads + h) * r->seqlen + n;
                float l1 = lse1[r->lse1_offset + lrow], l2 = lse2[r->lse2_offset + lrow];
                float m = fmaxf(l1, l2);
                size_t i1 = r->o1.offset + b * r->o1.stride_batch + n * r->o1.stride_seq + h * r->o1.stride_head;
                size_t i2 = r->o2.offset + b * r->o2.stride_batch + n * r->o2.stride_seq + h * r->o2.stride_head;
                size_t io = r->out.offset + b * r->out.stride_batch + n * r->out.stride_seq +
                            h * r->out.stride_head;
                float w1 = l1 == -INFINITY || m == -INFINITY ? 0.0f : expf(l1 - m);
                float w2 = l2 == -INFINITY || m == -INFINITY ? 0.0f : expf(l2 - m);
                for (int d = 0; d < r->head_dim; ++d) {
                    float x = 0.0f;
                    if (w1 > 0.0f)
                        x += w1 * host_load(o1, r->dtype, i1 + d);
                    if (w2 > 0.0f)
                        x += w2 * host_load(o2, r->dtype, i2 + d);
                    host_store(out, r->dtype, io + d, m == -INFINITY ? 0.0f : x / (w1 + w2));
                }
                if (lse_out)
                    lse_out[r->lse_out_offset + lrow] = m == -INFINITY ? -INFINITY : m + logf(w1 + w2);
            }
}

flashcl_status flashcl_attention_merge_host(flashcl_context *ctx, const flashcl_merge_desc *desc,
                                            const void *o1, const float *lse1, const void *o2,
                                            const float *lse2, void *out, float *lse_out) {
    FLASHCL_LOCKED(ctx);
    if (!ctx)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    flashcl_merge_desc r;
    merge_extents e;
    flashcl_status st = resolve_merge(ctx, desc, &r, &e);
    if (st)
        return st;
    if (!o1 || !lse1 || !o2 || !lse2 || !out)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "a tensor pointer is NULL");
    if (ctx->is_host) {
        host_merge(&r, o1, lse1, o2, lse2, out, lse_out);
        return FLASHCL_SUCCESS;
    }
    cl_int err = CL_SUCCESS;
    cl_mem_flags in = CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR;
    cl_mem b[6] = {0};
    b[0] = clCreateBuffer(ctx->cl_ctx, in, e.o1, (void *)o1, &err);
    b[1] = b[0] ? clCreateBuffer(ctx->cl_ctx, in, e.lse1, (void *)lse1, &err) : NULL;
    b[2] = b[1] ? clCreateBuffer(ctx->cl_ctx, in, e.o2, (void *)o2, &err) : NULL;
    b[3] = b[2] ? clCreateBuffer(ctx->cl_ctx, in, e.lse2, (void *)lse2, &err) : NULL;
    /* out is copied in so the elements its strides skip come back unchanged. */
    b[4] = b[3] ? clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, e.out, out, &err) : NULL;
    b[5] = b[4] && lse_out ? clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, e.lse_out,
                                            lse_out, &err)
                           : NULL;
    if (!b[4] || (lse_out && !b[5])) {
        st = flashcl_fail(ctx, err, "allocating device buffers: %s", flashcl_status_string(err));
    } else if ((st = flashcl_attention_merge(ctx, &r, b[0], b[1], b[2], b[3], b[4], b[5], NULL)) ==
               FLASHCL_SUCCESS) {
        void *staging = malloc(e.out);
        err = staging ? clEnqueueReadBuffer(ctx->queue, b[4], CL_TRUE, 0, e.out, staging, 0, NULL, NULL)
                      : CL_OUT_OF_HOST_MEMORY;
        if (err == CL_SUCCESS && lse_out)
            err = clEnqueueReadBuffer(ctx->queue, b[5], CL_TRUE, 0, e.lse_out, lse_out, 0, NULL, NULL);
        if (err == CL_SUCCESS)
            memcpy(out, staging, e.out);
        else
            st = flashcl_fail(ctx, err, "reading results: %s", flashcl_status_string(err));
        free(staging);
    }
    for (int i = 0; i < 6; ++i)
        if (b[i])
            clReleaseMemObject(b[i]);
    return st;
}

/* ---- varlen and paged attention: the plan ------------------------------------------------------ */

typedef struct serving_plan {
    flashcl_varlen_desc r; /* resolved: scale, layouts                        */
    int total_q, total_k, group, num_blocks;
    long max_keys;
    flashcl_decode_choice choice;
    const flashcl_kv_cache *cache; /* paged: the cache and the sequences' ids */
    const int *seq_ids;
    size_t meta_count, blocks_off, counters_off; /* meta: see fill_meta */
    size_t scratch_bytes, part_lse_off; /* part_lse_off in floats         */
} serving_plan;

static flashcl_status check_cu(flashcl_context *ctx, const char *name, const int *cu, int n, int *total) {
    if (!cu)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
    if (cu[0] != 0)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s[0] = %d, must be 0", name, cu[0]);
    for (int i = 0; i < n; ++i)
        if (cu[i + 1] < cu[i])
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s decreases at %d (%d -> %d)", name,
                                i, cu[i], cu[i + 1]);
    *total = cu[n];
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_check_cu_seqlens(flashcl_context *ctx, const char *name, const int *cu, int n, int *total) {
    return check_cu(ctx, name, cu, n, total);
}

/* Checks desc (against the cache when paged) and sizes the batch description and scratch for the choice. */
static flashcl_status make_plan(flashcl_context *ctx, const flashcl_varlen_desc *d,
                                const flashcl_kv_cache *cache, const int *seq_ids, int force_tiled, int splits,
                                serving_plan *p) {
    memset(p, 0, sizeof *p);
    if (!d)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
    p->r = *d;
    p->cache = cache;
    p->seq_ids = seq_ids;
    flashcl_varlen_desc *r = &p->r;
    if (cache && flashcl_dtype_is_fp8(r->dtype))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "dtype %d: paged attention's dtype is the cache's (that of the queries and outputs), "
                            "also when its pages are FP8",
                            (int)r->dtype);
    flashcl_status st = flashcl_check_dtype(ctx, r->dtype);
    if (st)
        return st;
    if (r->num_seqs < 1 || r->heads_q < 1 || r->heads_k < 1 || r->head_dim < 1 || r->head_dim > 256 ||
        r->heads_q % r->heads_k != 0)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                            "invalid shape: num_seqs %d, heads_q %d, heads_k %d, head_dim %d (all >= 1, "
                            "heads_q a multiple of heads_k, head_dim <= 256)",
                            r->num_seqs, r->heads_q, r->heads_k, r->head_dim);
    if (!(r->scale >= 0.0f) || isinf(r->scale) || !(r->softcap >= 0.0f) || isinf(r->softcap))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "invalid scale %g or softcap %g (finite, >= 0)",
                            (double)r->scale, (double)r->softcap);
    if (r->num_splits < 0 || r->num_splits > FLASHCL_MAX_SPLITS)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "num_splits %d (0 .. %d)", r->num_splits,
                            FLASHCL_MAX_SPLITS);
    if (r->scale == 0.0f)
        r->scale = 1.0f / sqrtf((float)r->head_dim);
    const int n = r->num_seqs;
    st = check_cu(ctx, "cu_seqlens_q", r->cu_seqlens_q, n, &p->total_q);
    if (st)
        return st;
    if (p->total_q < 1)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "no query tokens (cu_seqlens_q[num_seqs] = 0)");
    if (cache) {
        if (!seq_ids)
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "seq_ids is NULL");
        const flashcl_kv_cache_desc *cd = &cache->desc;
        if (r->dtype != cd->dtype || r->heads_k != cd->heads_k || r->head_dim != cd->head_dim)
            return flashcl_fail(ctx, FLASHCL_ERROR_DTYPE_MISMATCH,
                                "desc (dtype %d, heads_k %d, head_dim %d) disagrees with the cache "
                                "(dtype %d, heads_k %d, head_dim %d)",
                                (int)r->dtype, r->heads_k, r->head_dim, (int)cd->dtype, cd->heads_k,
                                cd->head_dim);
        if ((st = flashcl_kv_cache_check_ids(cache, ctx, seq_ids, n, "")))
            return st;
        for (int i = 0; i < n; ++i) {
            const flashcl_kv_sequence *s = flashcl_kv_cache_sequence(cache, seq_ids[i]);
            if (s->length > p->max_keys)
                p->max_keys = s->length;
        }
    } else {
        if ((st = check_cu(ctx, "cu_seqlens_k", r->cu_seqlens_k, n, &p->total_k)))
            return st;
        for (int i = 0; i < n; ++i)
            if (r->cu_seqlens_k[i + 1] - r->cu_seqlens_k[i] > p->max_keys)
                p->max_keys = r->cu_seqlens_k[i + 1] - r->cu_seqlens_k[i];
    }
    p->group = r->heads_q / r->heads_k;

    /* Layouts: token-major; all-zero strides mean packed. stride_batch is unused. */
    flashcl_layout *ls[4] = {&r->q, &r->out, &r->k, &r->v};
    for (int i = 0; i < 4; ++i) {
        int heads = i < 2 ? r->heads_q : r->heads_k;
        if (!ls[i]->stride_seq && !ls[i]->stride_head) {
            ls[i]->stride_head = (size_t)r->head_dim;
            ls[i]->stride_seq = (size_t)heads * (size_t)r->head_dim;
        }
        ls[i]->stride_batch = 0;
    }
    if (cache) { /* the pools are packed [slot][heads_k][head_dim] */
        memset(&r->k, 0, sizeof r->k);
        r->k.stride_head = (size_t)r->head_dim;
        r->k.stride_seq = (size_t)r->heads_k * (size_t)r->head_dim;
        r->v = r->k;
    }

    /* Tiles and splits. */
    int *rows = malloc((size_t)n * sizeof(int));
    if (!rows)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    long blocks = 0;
    for (int i = 0; i < n; ++i) {
        long nr = (long)(r->cu_seqlens_q[i + 1] - r->cu_seqlens_q[i]) * p->group;
        rows[i] = nr > 0x7fffffffL ? 0x7fffffff : (int)nr;
    }
    const flashcl_dtype kv_fp8 = cache && cache->scales ? cache->page_dtype : (flashcl_dtype)0;
    flashcl_decode_problem pb = {r->dtype, r->head_dim, r->heads_k, n, rows, p->max_keys,
                                 splits > 0 ? splits : r->num_splits, 1, force_tiled, p->group, kv_fp8};
    /* The decode kernel reads K/V rows in chunks of vec elements. */
    const size_t vec = (size_t)flashcl_decode_kv_vec(&pb);
    for (int i = 2; i < 4; ++i)
        if (ls[i]->offset % vec || ls[i]->stride_seq % vec || ls[i]->stride_head % vec)
            pb.vec_aligned = 0;
    st = flashcl_decode_params(ctx, &pb, &p->choice);
    for (int i = 0; !st && i < n; ++i)
        blocks += (rows[i] + p->choice.block_m - 1) / p->choice.block_m;
    free(rows);
    if (st)
        return st;
    if ((long)p->total_q * r->heads_q > 0x7fffffffL || blocks > 0x3fffffffL || 4L * n + 2 * blocks > 0x7fffffffL)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "the batch is too large for 32-bit indices");
    p->num_blocks = (int)blocks;

    /* meta: {q_start, nq, k_base, nk} per sequence, then the blocks. */
    p->blocks_off = 4 * (size_t)n;
    p->meta_count = p->blocks_off + 2 * (size_t)blocks;
    /* The decode kernel merges its splits itself: zeroed counters per
     * (block, kv head) after the blocks (merge_if_last_split, cl/common_serving.cl). */
    p->counters_off = p->meta_count;
    if (p->choice.kernel != FLASHCL_SERVING_TILED && p->choice.splits > 1)
        p->meta_count +=
            (size_t)blocks * (size_t)r->heads_k * (size_t)flashcl_split_counters(p->choice.splits);
    if (p->meta_count > 0x7fffffffu)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "the batch is too large for 32-bit indices");
    if (p->choice.splits > 1) {
        size_t rows_all = (size_t)p->choice.splits * (size_t)p->total_q * (size_t)r->heads_q;
        p->part_lse_off = rows_all * (size_t)r->head_dim;
        p->scratch_bytes = (p->part_lse_off + rows_all) * sizeof(float);
    }
    return FLASHCL_SUCCESS;
}

/* ---- varlen and paged attention: the launch -------------------------------------------------- */

/* Writes the batch description: {q_start, nq, k_base, nk} per sequence
 * (k_base: where the sequence's page table starts in the cache's device
 * tables when paged, else its first key), {sequence, first row} per block
 * from blocks_off, then, with `counters`, the split counters (zero) from
 * counters_off to meta_count. Written straight into the upload's staging
 * copy, or without the counters into the by-value argument (META_ARGS: the
 * counters have a buffer of their own). */
static void fill_meta(const serving_plan *p, int *meta, int counters) {
    const flashcl_varlen_desc *r = &p->r;
    size_t b = 0;
    for (int i = 0; i < r->num_seqs; ++i) {
        const int nq = r->cu_seqlens_q[i + 1] - r->cu_seqlens_q[i];
        meta[4 * i] = r->cu_seqlens_q[i];
        meta[4 * i + 1] = nq;
        if (p->cache) {
            const flashcl_kv_sequence *s = flashcl_kv_cache_sequence(p->cache, p->seq_ids[i]);
            meta[4 * i + 2] = s->dev_off;
            meta[4 * i + 3] = s->length;
        } else {
            meta[4 * i + 2] = r->cu_seqlens_k[i];
            meta[4 * i + 3] = r->cu_seqlens_k[i + 1] - r->cu_seqlens_k[i];
        }
        for (int m0 = 0; m0 < nq * p->group; m0 += p->choice.block_m) {
            meta[p->blocks_off + 2 * b] = i;
            meta[p->blocks_off + 2 * b + 1] = m0;
            ++b;
        }
    }
    if (counters)
        memset(meta + p->counters_off, 0, (p->meta_count - p->counters_off) * sizeof(int));
}

/* The context's host staging copies for non-blocking uploads (the serving
 * calls' batch descriptions, the KV cache's slot lists): a few, each reused
 * once its last write has completed, usually long since done, so the check
 * costs nothing, and no completion callback is needed (on NVIDIA one adds
 * 5 us to every call). flashcl_staging_take hands out the next one with
 * room for `bytes` (NULL: out of memory); flashcl_staging_upload writes it
 * into *buf, which it grows by doubling (allocating device memory per call
 * costs more than a decode step at short contexts), without blocking and
 * after `after` (the buffer's last reader, NULL for none: a grown buffer is
 * new, but callers order on it anyway). *written receives the write. */
void *flashcl_staging_take(flashcl_context *ctx, size_t bytes) {
    flashcl_staging *slot = &ctx->serving_staging[ctx->serving_staging_next];
    if (slot->written) { /* its previous upload must have read it */
        clWaitForEvents(1, &slot->written);
        clReleaseEvent(slot->written);
        slot->written = NULL;
    }
    if (slot->bytes < bytes) {
        void *grown = realloc(slot->host, bytes);
        if (!grown)
            return NULL;
        slot->host = grown;
        slot->bytes = bytes;
    }
    return slot->host;
}

/* Makes *buf (*cap bytes) hold at least `bytes`: a new buffer of the old size
 * doubled until it does (4 KB to start) when it does not. The old one is
 * released; OpenCL defers that until queued kernels no longer use it. */
static flashcl_status grow_buffer(flashcl_context *ctx, cl_mem *buf, size_t *cap, size_t bytes, const char *what) {
    if (bytes <= *cap && *buf)
        return FLASHCL_SUCCESS;
    size_t grown = *cap ? *cap : 4096;
    while (grown < bytes)
        grown *= 2;
    if (*buf)
        clReleaseMemObject(*buf);
    *cap = 0;
    cl_int err = CL_SUCCESS;
    *buf = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, grown, NULL, &err);
    if (!*buf)
        return flashcl_fail(ctx, err, "allocating %s (%zu bytes): %s", what, grown, flashcl_status_string(err));
    *cap = grown;
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_staging_upload(flashcl_context *ctx, cl_mem *buf, size_t *cap, size_t bytes, cl_event after,
                                      cl_event *written, const char *what) {
    flashcl_status st = grow_buffer(ctx, buf, cap, bytes, what);
    if (st)
        return st;
    flashcl_staging *slot = &ctx->serving_staging[ctx->serving_staging_next];
    cl_int err = clEnqueueWriteBuffer(ctx->queue, *buf, CL_FALSE, 0, bytes, slot->host, after ? 1 : 0,
                                      after ? &after : NULL, written);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, err, "uploading %s: %s", what, flashcl_status_string(err));
    clRetainEvent(*written);
    slot->written = *written;
    ctx->serving_staging_next = (ctx->serving_staging_next + 1) % FLASHCL_STAGING_SLOTS;
    return FLASHCL_SUCCESS;
}

/* Uploads the batch description into the context's buffer. The write waits
 * for the previous call's last kernel: the last reader of the old contents,
 * which also orders calls on out-of-order queues (the next call may share the
 * caller's scratch and outputs with it), grown buffer or not. */
static flashcl_status upload_meta(flashcl_context *ctx, serving_plan *p, cl_event *written) {
    int *host = flashcl_staging_take(ctx, p->meta_count * sizeof(int));
    if (!host)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    fill_meta(p, host, 1);
    return flashcl_staging_upload(ctx, &ctx->serving_meta, &ctx->serving_meta_bytes, p->meta_count * sizeof(int),
                                  ctx->serving_meta_reader, written, "the batch description");
}

/* Rounded up to a power of two from 64 so that each size is its own build
 * and a batch of one does not pass 4 KB per launch. */
int flashcl_by_value_ints(const flashcl_context *ctx, size_t ints) {
    if (ctx->info.max_param < 256 + 256 || ctx->info.is_rusticl)
        return 0;
    const size_t room = (ctx->info.max_param - 256) / 4;
    size_t n = 64;
    while (n < ints)
        n *= 2;
    return n <= room && n <= FLASHCL_BY_VALUE_MAX_INTS ? (int)n : 0;
}

/* Ints of description a decode kernel takes by value (META_ARGS); 0: it
 * does not fit, or META_ARGS is off: it is uploaded. */
static int by_value_ints(const flashcl_context *ctx, const serving_plan *p) {
    if (p->choice.kernel == FLASHCL_SERVING_TILED || !p->choice.meta_args)
        return 0;
    return flashcl_by_value_ints(ctx, p->counters_off);
}

/* The context's split-counter buffer for by-value descriptions, at least
 * `bytes`, zero: a new one is filled with zeros (*filled: that command,
 * which the kernel must wait for), and the kernels leave it zero. */
static flashcl_status counters_buffer(flashcl_context *ctx, size_t bytes, cl_event *filled) {
    *filled = NULL;
    const cl_mem before = ctx->serving_counters; /* a buffer even with no splits */
    flashcl_status st = grow_buffer(ctx, &ctx->serving_counters, &ctx->serving_counters_bytes, bytes,
                                    "the split counters");
    if (st || ctx->serving_counters == before)
        return st;
    const cl_int zero = 0;
    cl_int err = clEnqueueFillBuffer(ctx->queue, ctx->serving_counters, &zero, sizeof zero, 0,
                                     ctx->serving_counters_bytes, 0, NULL, filled);
    if (err != CL_SUCCESS) { /* not zero: not to be used */
        clReleaseMemObject(ctx->serving_counters);
        ctx->serving_counters = NULL;
        ctx->serving_counters_bytes = 0;
        return flashcl_fail(ctx, err, "zeroing the split counters: %s", flashcl_status_string(err));
    }
    return FLASHCL_SUCCESS;
}

static flashcl_status launch(flashcl_context *ctx, serving_plan *p, cl_mem q, cl_mem k, cl_mem v,
                             int page_size, cl_mem out, cl_mem lse, size_t lse_offset, cl_mem scratch,
                             cl_event *event) {
    const flashcl_varlen_desc *r = &p->r;
    const flashcl_decode_choice *c = &p->choice;
    const size_t es = flashcl_dtype_size(r->dtype);
    flashcl_status st;
    size_t lse_need;
    if (!flashcl_mul_add(lse_offset + (size_t)p->total_q * (size_t)r->heads_q, 4, 0, &lse_need))
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "lse_offset overflows");
    if ((st = flashcl_check_buffer(ctx, "q", q, flashcl_layout_bytes(&r->q, 1, p->total_q, r->heads_q, r->head_dim, es))) ||
        (st = flashcl_check_buffer(ctx, "out", out, flashcl_layout_bytes(&r->out, 1, p->total_q, r->heads_q, r->head_dim, es))) ||
        (lse && (st = flashcl_check_buffer(ctx, "lse", lse, lse_need))))
        return st;
    if (!page_size && p->total_k > 0 &&
        ((st = flashcl_check_buffer(ctx, "k", k, flashcl_layout_bytes(&r->k, 1, p->total_k, r->heads_k, r->head_dim, es))) ||
         (st = flashcl_check_buffer(ctx, "v", v, flashcl_layout_bytes(&r->v, 1, p->total_k, r->heads_k, r->head_dim, es)))))
        return st;
    if (!page_size && p->total_k == 0) { /* no key anywhere: any valid buffer serves */
        if (!k || !v)
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "k or v buffer is NULL");
    }
    if (c->splits > 1 && (st = flashcl_check_buffer(ctx, "scratch", scratch, p->scratch_bytes)))
        return st;
    if (flashcl_decode_local_bytes(c, r->head_dim) > ctx->info.local_mem ||
        (size_t)c->work_group_size > ctx->info.max_wg)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                            "serving kernel (%d rows, %d work-items) does not fit the device", c->block_m,
                            c->work_group_size);

    char options[512], tiles[192];
    const char *extra = getenv("FLASHCL_BUILD_OPTIONS");
    /* The decode kernels merge their own splits (counters_off, and with
     * META_ARGS the description, after the shared arguments). */
    const int decode = c->kernel != FLASHCL_SERVING_TILED;
    static const char *const files[] = {"paged_attention.cl", "paged_decode.cl", "paged_decode_nv.cl"};
    static const char *const names[] = {"paged_attention", "paged_decode", "paged_decode_nv"};
    if (c->kernel == FLASHCL_SERVING_DECODE) /* shuffles through PTX on NVIDIA, through __local elsewhere */
        snprintf(tiles, sizeof tiles, "-DLANES=%d -DWG_SIZE=%d -DUNROLL=%d -DSTAGES=%d -DPAGE_SIZE=%d -DCP_ASYNC_L2=%d%s",
                 c->lanes, c->work_group_size, c->unroll, c->stages, page_size, c->l2_prefetch,
                 ctx->info.is_nvidia ? " -DFLASHCL_NV_PTX" : "");
    else if (c->kernel == FLASHCL_SERVING_DECODE_MMA)
        snprintf(tiles, sizeof tiles, "-DBLOCK_N=%d -DWARPS=%d -DSTAGES=%d -DPAGE_SIZE=%d -DFLASHCL_NV_PTX -DREG_COPY=%d "
                 "-DCP_ASYNC_L2=%d -DHEAD_GROUP=%d -DHG_WPH=%d",
                 c->block_n, c->work_group_size / 32, c->stages, page_size, c->reg_copy, c->l2_prefetch,
                 c->head_group, c->head_warps > 1 ? c->head_warps : 1);
    else
        snprintf(tiles, sizeof tiles, "-DBLOCK_N=%d -DTPR=%d", c->block_n, c->tpr);
    const int arg_ints = by_value_ints(ctx, p);
    char by_value[32] = "";
    if (arg_ints)
        snprintf(by_value, sizeof by_value, " -DMETA_ARG_INTS=%d", arg_ints);
    /* FP8 pages: K/V bytes of that format and the cache's scales (SERVING_KV_SCALES, cl/common_serving.cl). */
    const cl_mem kv_scales = p->cache ? p->cache->scales : NULL;
    char fp8[16] = "";
    if (kv_scales)
        snprintf(fp8, sizeof fp8, " -DKV_FP8=%d", (int)p->cache->page_dtype);
    const int n = snprintf(options, sizeof options,
                           "-cl-std=CL1.2 -cl-mad-enable -DDTYPE=%d%s -DHEAD_DIM=%d -DBLOCK_M=%d %s%s%s%s", (int)r->dtype,
                           fp8, r->head_dim, c->block_m, tiles, by_value, extra ? " " : "", extra ? extra : "");
    cl_kernel kernel, combine = NULL;
    if ((st = flashcl_options_fit(ctx, n, sizeof options)) != FLASHCL_SUCCESS ||
        (st = flashcl_get_kernel(ctx, files[c->kernel], names[c->kernel], options, &kernel)))
        return st;
    if (c->splits > 1 && !decode) {
        snprintf(options, sizeof options, "-cl-std=CL1.2 -DDTYPE=%d", (int)r->dtype);
        if ((st = flashcl_get_kernel(ctx, "merge.cl", "attn_combine", options, &combine)))
            return st;
    }
    /* The description: uploaded (written: the kernel waits for it), or by
     * value, the kernel then waiting for the previous call's last kernel
     * (which shares the counters and maybe the scratch) and a new counter
     * buffer's zeroing. */
    cl_event written = NULL, attended = NULL, waits[2];
    cl_uint num_waits = 0;
    cl_mem meta;
    int arg_meta[FLASHCL_BY_VALUE_MAX_INTS]; /* arg_ints of them: the description, zeros after it */
    if (arg_ints) {
        const size_t counters = p->meta_count - p->counters_off;
        if ((st = counters_buffer(ctx, counters * sizeof(int), &written)))
            return st;
        if (written)
            waits[num_waits++] = written;
        if (ctx->serving_meta_reader)
            waits[num_waits++] = ctx->serving_meta_reader;
        meta = ctx->serving_counters;
        fill_meta(p, arg_meta, 0);
        memset(arg_meta + p->counters_off, 0, ((size_t)arg_ints - p->counters_off) * sizeof(int));
    } else {
        if ((st = upload_meta(ctx, p, &written)))
            return st;
        waits[num_waits++] = written;
        meta = ctx->serving_meta;
    }
    /* Page tables: the cache's device copy (varlen: unused; q, read-only like
     * the tables, so that no restrict argument aliases a written one). */
    cl_mem tables = p->cache ? p->cache->tables : q;
    cl_int err;

    const float log2e = 1.4426950408889634f;
    cl_float q_mul = r->softcap > 0.0f ? r->scale / r->softcap : r->scale * log2e;
    cl_float softcap_log2 = r->softcap > 0.0f ? r->softcap * log2e : 0.0f;
    cl_ulong u[14] = {r->q.offset,   r->q.stride_seq,   r->q.stride_head,   r->k.offset,
                      r->k.stride_seq, r->k.stride_head, r->v.offset,       r->v.stride_seq,
                      r->v.stride_head, r->out.offset,   r->out.stride_seq, r->out.stride_head,
                      lse_offset,     p->part_lse_off};
    cl_int ints[8] = {lse != NULL,  (cl_int)p->blocks_off, p->total_q, r->heads_q,
                      p->group,     page_size,             r->causal != 0, 0};
    /* Unused buffers still need valid arguments; they are never accessed. */
    cl_mem lse_arg = lse ? lse : out, part = c->splits > 1 ? scratch : out;
    cl_uint a = 0;
    err = clSetKernelArg(kernel, a++, sizeof(cl_mem), &q);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &k);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &v);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &out);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &lse_arg);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &part);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &meta);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &tables);
    for (int i = 0; i < 14; ++i)
        err |= clSetKernelArg(kernel, a++, sizeof(cl_ulong), &u[i]);
    for (int i = 0; i < 7; ++i)
        err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &ints[i]);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_float), &q_mul);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_float), &softcap_log2);
    if (kv_scales)
        err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &kv_scales);
    if (decode) {
        cl_int counters_off = arg_ints ? 0 : (cl_int)p->counters_off; /* by value: the counters' own buffer */
        err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &counters_off);
        if (arg_ints)
            err |= clSetKernelArg(kernel, a++, (size_t)arg_ints * sizeof(int), arg_meta);
    }
    size_t local[3] = {(size_t)c->work_group_size, 1, 1};
    const int heads_per_group = c->head_group > 0 ? c->head_group : 1;
    size_t global[3] = {(size_t)p->num_blocks * local[0], (size_t)(r->heads_k / heads_per_group), (size_t)c->splits};
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(ctx->queue, kernel, 3, NULL, global, local, num_waits, num_waits ? waits : NULL,
                                     &attended);
    if (written)
        clReleaseEvent(written);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, err, "launching %s: %s", names[c->kernel], flashcl_status_string(err));
    /* The next call's upload waits for this call's last kernel: the reader of
     * the description buffer, and of the caller's scratch, which the next
     * call may reuse. So calls on one context run in order on any queue. */
    if (ctx->serving_meta_reader)
        clReleaseEvent(ctx->serving_meta_reader);
    ctx->serving_meta_reader = attended;
    if (c->splits == 1 || decode) {
        if (event) {
            clRetainEvent(attended);
            *event = attended;
        }
        return FLASHCL_SUCCESS;
    }

    cl_ulong cu[5] = {p->part_lse_off, r->out.offset, r->out.stride_seq, r->out.stride_head, lse_offset};
    cl_int ci[5] = {lse != NULL, c->splits, p->total_q, r->heads_q, r->head_dim};
    a = 0;
    err = clSetKernelArg(combine, a++, sizeof(cl_mem), &scratch);
    err |= clSetKernelArg(combine, a++, sizeof(cl_mem), &out);
    err |= clSetKernelArg(combine, a++, sizeof(cl_mem), &lse_arg);
    for (int i = 0; i < 5; ++i)
        err |= clSetKernelArg(combine, a++, sizeof(cl_ulong), &cu[i]);
    for (int i = 0; i < 5; ++i)
        err |= clSetKernelArg(combine, a++, sizeof(cl_int), &ci[i]);
    size_t cglobal[3] = {(size_t)r->head_dim, (size_t)r->heads_q, (size_t)p->total_q};
    cl_event combined = NULL;
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(ctx->queue, combine, 3, NULL, cglobal, NULL, 1, &attended, &combined);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, err, "launching attn_combine: %s", flashcl_status_string(err));
    clReleaseEvent(ctx->serving_meta_reader); /* attended: the combine comes after it */
    ctx->serving_meta_reader = combined;
    if (event) {
        clRetainEvent(combined);
        *event = combined;
    }
    return FLASHCL_SUCCESS;
}

static flashcl_status begin(flashcl_context *ctx, const char *what) {
    if (!ctx)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    if (ctx->is_host)
        return flashcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "%s needs an OpenCL device", what);
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_varlen_scratch_size(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                           size_t *bytes) {
    FLASHCL_LOCKED(ctx);
    flashcl_status st = begin(ctx, "varlen attention");
    if (st)
        return st;
    if (!bytes)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "bytes is NULL");
    serving_plan p;
    st = make_plan(ctx, desc, NULL, NULL, 0, 0, &p);
    if (st == FLASHCL_SUCCESS)
        *bytes = p.scratch_bytes;
    return st;
}

/* Plans and launches. If a decode kernel does not build (an older driver,
 * another compiler), the tiled kernel runs instead with the same split
 * count, so the same scratch serves, and the log says why: never a failure
 * the caller could not have avoided, never a wrong answer. */
static flashcl_status plan_and_launch(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                      const flashcl_kv_cache *cache, const int *seq_ids, cl_mem q, cl_mem k,
                                      cl_mem v, int page_size, cl_mem out, cl_mem lse, size_t lse_offset,
                                      cl_mem scratch, cl_event *event) {
    serving_plan p;
    flashcl_status st = make_plan(ctx, desc, cache, seq_ids, 0, 0, &p);
    if (st == FLASHCL_SUCCESS)
        st = launch(ctx, &p, q, k, v, page_size, out, lse, lse_offset, scratch, event);
    if (st == FLASHCL_ERROR_BUILD_FAILED && p.choice.kernel != FLASHCL_SERVING_TILED) {
        flashcl_log("serving: the decode kernel did not build, the tiled kernel runs instead: %s",
                    flashcl_last_error(ctx));
        const int splits = p.choice.splits;
        flashcl_clear_error(ctx);
        st = make_plan(ctx, desc, cache, seq_ids, 1, splits, &p);
        if (st == FLASHCL_SUCCESS)
            st = launch(ctx, &p, q, k, v, page_size, out, lse, lse_offset, scratch, event);
    }
    return st;
}

flashcl_status flashcl_varlen_forward(flashcl_context *ctx, const flashcl_varlen_desc *desc, cl_mem q,
                                      cl_mem k, cl_mem v, cl_mem out, cl_mem lse, size_t lse_offset,
                                      cl_mem scratch, cl_event *event) {
    FLASHCL_LOCKED(ctx);
    flashcl_status st = begin(ctx, "varlen attention");
    if (st)
        return st;
    return plan_and_launch(ctx, desc, NULL, NULL, q, k, v, 0, out, lse, lse_offset, scratch, event);
}

flashcl_status flashcl_paged_scratch_size(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                          const flashcl_kv_cache *cache, const int *seq_ids, size_t *bytes) {
    FLASHCL_LOCKED(ctx);
    flashcl_status st = begin(ctx, "paged attention");
    if (st)
        return st;
    if (!bytes || !cache)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "bytes or cache is NULL");
    serving_plan p;
    st = make_plan(ctx, desc, cache, seq_ids, 0, 0, &p);
    if (st == FLASHCL_SUCCESS)
        *bytes = p.scratch_bytes;
    return st;
}

flashcl_status flashcl_paged_attention(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                       const flashcl_kv_cache *cache, const int *seq_ids, cl_mem q,
                                       cl_mem out, cl_mem lse, size_t lse_offset, cl_mem scratch,
                                       cl_event *event) {
    FLASHCL_LOCKED(ctx);
    flashcl_status st = begin(ctx, "paged attention");
    if (st)
        return st;
    if (!cache)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "cache is NULL");
    if (cache->ctx != ctx)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "the cache belongs to another context");
    return plan_and_launch(ctx, desc, cache, seq_ids, q, cache->k_pool, cache->v_pool, cache->desc.page_size, out,
                           lse, lse_offset, scratch, event);
}

flashcl_status flashcl_serving_params(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                      const flashcl_kv_cache *cache, const int *seq_ids,
                                      flashcl_params *params, int *splits) {
    FLASHCL_LOCKED(ctx);
    flashcl_status st = begin(ctx, "serving attention");
    if (st)
        return st;
    if (!params)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "params is NULL");
    serving_plan p;
    st = make_plan(ctx, desc, cache, seq_ids, 0, 0, &p);
    if (st)
        return st;
    memset(params, 0, sizeof *params);
    params->block_m = p.choice.block_m;
    params->block_n = p.choice.block_n;
    static const char *const variants[] = {"paged", "decode", "decode-mma"};
    params->threads_per_row = p.choice.kernel == FLASHCL_SERVING_DECODE ? p.choice.lanes
                              : p.choice.kernel == FLASHCL_SERVING_TILED ? p.choice.tpr
                                                                          : 0;
    params->work_group_size = p.choice.work_group_size;
    params->variant = p.choice.head_group ? "decode-mma-heads"
                      : p.choice.reg_copy ? "decode-mma-regcopy"
                                          : variants[p.choice.kernel];
    params->source = p.choice.source;
    if (splits)
        *splits = p.choice.splits;
    return FLASHCL_SUCCESS;
}
