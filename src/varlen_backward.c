/* varlen_backward.c: the backward of flashcl_varlen_forward, one dense backward launch set per sequence.
 *
 * Sequence i of a packed batch is the dense problem batch 1, seqlen_q = nq_i,
 * seqlen_k = nk_i, whose tensors are views of the packed ones (offset +
 * cu_seqlens[i] * stride_seq), so src/backward.c's kernels run on it as they
 * are, with the same tiles: in deterministic mode a sequence's gradients are
 * bitwise those of flashcl_attention_backward on that sequence alone.
 *
 * The LSE is the one tensor that is not a view: the varlen forward writes
 * float [heads_q][total_q], the dense kernels read [heads_q][nq_i] packed
 * (lse_off + h * nq_i + t). cl/flash_bwd.cl takes no LSE head stride, and
 * adding one would change every backward build for the sake of this path,
 * so each sequence's LSE is staged into scratch by one clEnqueueCopyBufferRect
 * (heads_q rows of nq_i floats). When heads_q is 1, or one sequence holds
 * every query, the two layouts coincide and the forward's LSE is read in place.
 *
 * A sequence with queries but no key gets dq = 0, and one with keys but no
 * query dk = dv = 0: flash_bwd_dq_store copies a zeroed float region of
 * scratch into them (any layout and dtype, one launch per tensor).
 *
 * Scratch, in floats:
 *   [0, work)              the dense scratch of the longest sequence (D_i,
 *                          and the dQ accumulator in atomic mode), reused by
 *                          every sequence
 *   [work, +staging)       the staged LSE: heads_q * the longest nq_i staged
 *   [work + staging, +zero) zeros: max(nq_i * heads_q, nk_i * heads_k) *
 *                          head_dim over the sequences that need them
 * Because the regions are reused, every command waits on the one enqueued
 * before it (events, so an out-of-order queue works): the sequences run one
 * after another, each with its own 3 or 4 kernel launches.
 */
#include <string.h>

#include "backward.h"
#include "serving.h"

typedef struct varlen_plan {
    flashcl_varlen_desc r;        /* as given; cu_seqlens checked              */
    flashcl_attention_desc whole; /* resolved: the batch as one sequence of
                                   * total_q queries and total_k keys, which
                                   * gives every buffer's extent              */
    flashcl_backward_options o;   /* gradient layouts resolved                */
    int total_q, total_k;
    size_t work, staging, zero;   /* scratch regions, in floats               */
    size_t scratch_bytes;
} varlen_plan;

/* Varlen layouts are token-major: stride_batch is unused, and zero seq and
 * head strides mean packed (as flashcl_varlen_forward reads them). */
static void varlen_layout(flashcl_layout *l, int heads, int head_dim) {
    l->stride_batch = 0;
    flashcl_default_layout(l, 1, heads, head_dim);
    l->stride_batch = 0;
}

/* Tokens of sequence i, per cu_seqlens. */
static int count(const int *cu, int i) {
    return cu[i + 1] - cu[i];
}

/* Sequence i as a dense batch-1 problem over views of the packed tensors. */
static void sequence_view(const varlen_plan *p, int i, flashcl_attention_desc *d, flashcl_backward_options *o) {
    const size_t q0 = (size_t)p->r.cu_seqlens_q[i], k0 = (size_t)p->r.cu_seqlens_k[i];
    *d = p->whole;
    *o = p->o;
    d->seqlen_q = count(p->r.cu_seqlens_q, i);
    d->seqlen_k = count(p->r.cu_seqlens_k, i);
    flashcl_layout *per_query[4] = {&d->q, &d->out, &o->dout, &o->dq};
    flashcl_layout *per_key[4] = {&d->k, &d->v, &o->dk, &o->dv};
    for (int t = 0; t < 4; ++t) {
        per_query[t]->offset += q0 * per_query[t]->stride_seq;
        per_key[t]->offset += k0 * per_key[t]->stride_seq;
    }
}

/* Checks everything but the buffers and sizes the scratch. */
static flashcl_status plan(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                           const flashcl_backward_options *opts, varlen_plan *p) {
    memset(p, 0, sizeof *p);
    if (!ctx)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    if (ctx->is_host)
        return flashcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "varlen backward needs an OpenCL device");
    if (!desc)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
    p->r = *desc;
    const flashcl_varlen_desc *r = &p->r;
    if (r->num_seqs < 1)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "num_seqs %d, must be >= 1", r->num_seqs);
    flashcl_status st = flashcl_check_cu_seqlens(ctx, "cu_seqlens_q", r->cu_seqlens_q, r->num_seqs, &p->total_q);
    if (st || (st = flashcl_check_cu_seqlens(ctx, "cu_seqlens_k", r->cu_seqlens_k, r->num_seqs, &p->total_k)))
        return st;
    if (p->total_q < 1)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "no query tokens (cu_seqlens_q[num_seqs] = 0)");

    /* The dense resolve checks dtype, heads, head_dim, scale and softcap (on
     * a stand-in length of 1) and turns causal into the bottom-right window. */
    flashcl_attention_desc *w = &p->whole;
    if (flashcl_dtype_is_fp8(r->dtype)) /* the dense resolve takes FP8, for the forward only */
        return flashcl_check_dtype(ctx, r->dtype);
    w->dtype = r->dtype;
    w->batch = w->seqlen_q = w->seqlen_k = 1;
    w->heads_q = r->heads_q;
    w->heads_k = r->heads_k;
    w->head_dim = r->head_dim;
    w->scale = r->scale;
    w->causal = r->causal;
    w->softcap = r->softcap;
    w->q = r->q, w->k = r->k, w->v = r->v, w->out = r->out;
    if (opts)
        p->o = *opts;
    flashcl_layout *per_query[4] = {&w->q, &w->out, &p->o.dout, &p->o.dq};
    flashcl_layout *per_key[4] = {&w->k, &w->v, &p->o.dk, &p->o.dv};
    for (int t = 0; t < 4; ++t) {
        varlen_layout(per_query[t], r->heads_q, r->head_dim);
        varlen_layout(per_key[t], r->heads_k, r->head_dim);
    }
    if ((st = flashcl_attention_desc_resolve(w)) != FLASHCL_SUCCESS)
        return flashcl_fail(ctx, st, "varlen backward: dtype %d, heads_q %d, heads_k %d, head_dim %d, scale %g, "
                                     "softcap %g: %s", (int)r->dtype, r->heads_q, r->heads_k, r->head_dim,
                            (double)r->scale, (double)r->softcap,
                            st == FLASHCL_ERROR_INVALID_SHAPE
                                ? "heads must be >= 1, heads_q a multiple of heads_k, head_dim 1 .. 256"
                                : "the dtype is unknown, or scale or softcap is not finite and >= 0");
    w->seqlen_q = p->total_q;
    w->seqlen_k = p->total_k; /* may be 0: then k, v, dk, dv are never read or written */

    /* Scratch: the regions in the file comment. */
    const size_t Hq = (size_t)r->heads_q, Hk = (size_t)r->heads_k, D = (size_t)r->head_dim;
    int longest = 0, longest_staged = 0;
    for (int i = 0; i < r->num_seqs; ++i) {
        const int nq = count(r->cu_seqlens_q, i), nk = count(r->cu_seqlens_k, i);
        size_t z = 0;
        if (nq > 0 && nk > 0) {
            longest = nq > longest ? nq : longest;
            if (Hq > 1 && nq != p->total_q && nq > longest_staged)
                longest_staged = nq;
        } else if (!flashcl_mul_add(nq > 0 ? (size_t)nq * Hq : (size_t)nk * Hk, D, 0, &z)) {
            return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "scratch size overflows size_t");
        }
        p->zero = z > p->zero ? z : p->zero;
    }
    if (longest) {
        flashcl_attention_desc one = *w;
        one.seqlen_q = longest;
        p->work = flashcl_backward_scratch_bytes(&one, p->o.deterministic != 0) / sizeof(float);
        if (!p->work)
            return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "scratch size overflows size_t");
    }
    p->staging = Hq * (size_t)longest_staged;
    size_t floats = p->work + p->staging;
    if (floats < p->work || floats + p->zero < floats ||
        !flashcl_mul_add(floats + p->zero, sizeof(float), 0, &p->scratch_bytes))
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "scratch size overflows size_t");
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_varlen_backward_scratch_size(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                                    const flashcl_backward_options *opts, size_t *bytes) {
    FLASHCL_LOCKED(ctx);
    varlen_plan p;
    flashcl_status st = plan(ctx, desc, opts, &p);
    if (st)
        return st;
    if (!bytes)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = p.scratch_bytes;
    return FLASHCL_SUCCESS;
}

/* Enqueues sequence i's commands after *prev (NULL: none) and replaces *prev
 * by the last one's event. */
static flashcl_status enqueue_sequence(flashcl_context *ctx, const varlen_plan *p, const flashcl_backward_kernels *k,
                                       int i, const cl_mem bufs[FLASHCL_BWD_TENSORS], size_t lse_offset,
                                       cl_mem scratch, cl_event *prev) {
    flashcl_attention_desc d;
    flashcl_backward_options o;
    sequence_view(p, i, &d, &o);
    const size_t zero_at = p->work + p->staging;
    const cl_uint nw = *prev != NULL;
    cl_event next = NULL, mid = NULL;
    flashcl_status st = FLASHCL_SUCCESS;
    if (d.seqlen_q > 0 && d.seqlen_k > 0) {
        cl_mem view[FLASHCL_BWD_TENSORS];
        memcpy(view, bufs, sizeof view);
        size_t lse_at = lse_offset + (size_t)p->r.cu_seqlens_q[i]; /* in place: heads_q 1 or one sequence */
        if (d.heads_q > 1 && d.seqlen_q != p->total_q) {
            const size_t src[3] = {lse_at * sizeof(float), 0, 0}, dst[3] = {p->work * sizeof(float), 0, 0};
            const size_t region[3] = {(size_t)d.seqlen_q * sizeof(float), (size_t)d.heads_q, 1};
            cl_int err = clEnqueueCopyBufferRect(ctx->queue, bufs[FLASHCL_BWD_LSE], scratch, src, dst, region,
                                                 (size_t)p->total_q * sizeof(float), 0, region[0], 0, nw,
                                                 nw ? prev : NULL, &mid);
            if (err != CL_SUCCESS)
                return flashcl_fail(ctx, err, "staging the LSE of sequence %d: %s", i, flashcl_status_string(err));
            view[FLASHCL_BWD_LSE] = scratch;
            lse_at = p->work;
        }
        st = flashcl_backward_enqueue(ctx, &d, &o, k, view, lse_at, scratch, 0, mid || nw ? 1 : 0,
                                      mid ? &mid : prev, &next);
    } else if (d.seqlen_q > 0) { /* no key: dq = 0 */
        st = flashcl_backward_enqueue_store(ctx, k, scratch, zero_at, bufs[FLASHCL_BWD_DQ], &o.dq, 1,
                                            d.seqlen_q, d.heads_q, d.head_dim, nw, prev, &next);
    } else if (d.seqlen_k > 0) { /* no query: dk = dv = 0 */
        st = flashcl_backward_enqueue_store(ctx, k, scratch, zero_at, bufs[FLASHCL_BWD_DK], &o.dk, 1,
                                            d.seqlen_k, d.heads_k, d.head_dim, nw, prev, &mid);
        if (st == FLASHCL_SUCCESS)
            st = flashcl_backward_enqueue_store(ctx, k, scratch, zero_at, bufs[FLASHCL_BWD_DV], &o.dv, 1,
                                                d.seqlen_k, d.heads_k, d.head_dim, 1, &mid, &next);
    }
    if (mid)
        clReleaseEvent(mid);
    if (next) {
        if (*prev)
            clReleaseEvent(*prev);
        *prev = next;
    }
    return st;
}

flashcl_status flashcl_varlen_backward(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                       const flashcl_backward_options *opts, cl_mem q, cl_mem k, cl_mem v,
                                       cl_mem out, cl_mem dout, cl_mem lse, size_t lse_offset, cl_mem dq,
                                       cl_mem dk, cl_mem dv, cl_mem scratch, cl_event *event) {
    FLASHCL_LOCKED(ctx);
    varlen_plan p;
    flashcl_status st = plan(ctx, desc, opts, &p);
    if (st)
        return st;
    const cl_mem bufs[FLASHCL_BWD_TENSORS] = {q, k, v, out, dout, dq, dk, dv, lse};
    flashcl_backward_kernels kern;
    if ((st = flashcl_backward_check_buffers(ctx, &p.whole, &p.o, lse_offset, bufs, scratch, p.scratch_bytes)) ||
        (st = flashcl_backward_prepare(ctx, &p.whole, p.o.deterministic, p.zero > 0, &kern)))
        return st;

    cl_event prev = NULL; /* the last command enqueued: the next one waits on it */
    if (p.zero) {
        const cl_float zero = 0.0f;
        cl_int err = clEnqueueFillBuffer(ctx->queue, scratch, &zero, sizeof zero,
                                         (p.work + p.staging) * sizeof(float), p.zero * sizeof(float), 0, NULL,
                                         &prev);
        if (err != CL_SUCCESS)
            return flashcl_fail(ctx, err, "clearing scratch: %s", flashcl_status_string(err));
    }
    for (int i = 0; i < p.r.num_seqs && st == FLASHCL_SUCCESS; ++i)
        st = enqueue_sequence(ctx, &p, &kern, i, bufs, lse_offset, scratch, &prev);
    if (st != FLASHCL_SUCCESS || !event) {
        if (prev)
            clReleaseEvent(prev);
    } else {
        *event = prev;
    }
    return st;
}
