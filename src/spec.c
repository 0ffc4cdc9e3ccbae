/* spec.c: flashcl_spec_verify (argument checks, work-group choice, launch), its host-memory form, expected tokens.
 *
 * The kernel is cl/spec_verify.cl, one work-group per sequence. Its results
 * do not depend on the work-group size (sums are integer, see the kernel's
 * comment), so the size is picked for speed alone: about 16 tokens per
 * work-item, a power of two up to 256 and the device's limit.
 * FLASHCL_SPEC_WG=N forces N (a power of two; tests use it to show that
 * the tokens do not change).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"

double flashcl_spec_expected_tokens(double alpha, int k) {
    if (!(alpha >= 0.0 && alpha <= 1.0) || k < 0)
        return NAN;
    if (alpha == 1.0)
        return (double)k + 1.0;
    return (1.0 - pow(alpha, (double)k + 1.0)) / (1.0 - alpha);
}

/* Element counts of the five tensors (offset included). */
typedef struct spec_sizes {
    size_t draft, q, p, accepted, tokens;
} spec_sizes;

static flashcl_status check_desc(flashcl_context *ctx, const flashcl_spec_desc *d, spec_sizes *n) {
    if (!d)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
    if (d->batch < 1 || d->num_draft < 1 || d->num_draft > FLASHCL_SPEC_MAX_DRAFT || d->vocab < 1 ||
        d->vocab > FLASHCL_SPEC_MAX_VOCAB)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                            "spec verify: batch %d (>= 1), num_draft %d (1..%d), vocab %d (1..%d)", d->batch,
                            d->num_draft, FLASHCL_SPEC_MAX_DRAFT, d->vocab, FLASHCL_SPEC_MAX_VOCAB);
    if (!(d->tolerance >= 0.0f && d->tolerance <= 0.5f))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "tolerance %g: want 0 (default 1e-3) .. 0.5",
                            (double)d->tolerance);
    if (d->logits && !d->greedy) {
        float s = (float)(1.4426950408889634 / (double)d->temperature);
        if (!(d->temperature > 0.0f) || !isfinite(d->temperature) || !isfinite(s))
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                                "temperature %g: logits sampling needs a finite temperature > 1e-38",
                                (double)d->temperature);
    }
    const size_t B = (size_t)d->batch, K = (size_t)d->num_draft, V = (size_t)d->vocab;
    int ok = flashcl_mul_add(B, K, d->draft_offset, &n->draft) &&
             flashcl_mul_add(B * K, V, d->q_offset, &n->q) && flashcl_mul_add(B * (K + 1), V, d->p_offset, &n->p) &&
             flashcl_mul_add(B, 1, d->accepted_offset, &n->accepted) &&
             flashcl_mul_add(B, K + 1, d->tokens_offset, &n->tokens) && n->p < ((size_t)1 << 60);
    if (!ok)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "spec verify: sizes overflow");
    return FLASHCL_SUCCESS;
}

static flashcl_status check_buf(flashcl_context *ctx, const char *name, cl_mem buf, size_t bytes) {
    if (!buf)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s buffer is NULL", name);
    size_t size = 0;
    cl_int err = clGetMemObjectInfo(buf, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, err, "%s: not a valid cl_mem (%s)", name, flashcl_status_string(err));
    if (bytes > size)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "%s: needs %zu bytes but the buffer holds %zu", name,
                            bytes, size);
    return FLASHCL_SUCCESS;
}

static flashcl_status pick_wg(flashcl_context *ctx, int vocab, int *wg) {
    const char *env = getenv("FLASHCL_SPEC_WG");
    size_t limit = ctx->info.max_wg < 256 ? ctx->info.max_wg : 256;
    if (env && env[0]) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 1 || v > (long)limit || (v & (v - 1)))
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                "FLASHCL_SPEC_WG='%s': want a power of two in 1..%zu", env, limit);
        *wg = (int)v;
        return FLASHCL_SUCCESS;
    }
    int w = 1;
    while ((size_t)w * 2 <= limit && w * 16 < vocab)
        w *= 2;
    *wg = w;
    return FLASHCL_SUCCESS;
}

/* Mesa's rusticl (22.3, llvmpipe) returns wrong tokens from the kernel at
 * vocabularies of 2^17 and more (tests/test_spec.c: V=200003 logits at every
 * work-group size, V=262144 probabilities below 32 work-items), where PoCL,
 * Intel's runtime and host_ref agree bit for bit: a work-item's passes over
 * the vocabulary run past llvmpipe's 65535 loop iterations
 * (flashcl_loop_limit_keys). There the buffers are read,
 * verified by the C implementation, which host_ref checks too, and the
 * results written back, blocking. */
static flashcl_status verify_on_host(flashcl_context *ctx, const flashcl_spec_desc *desc, const spec_sizes *n,
                                     cl_mem draft, cl_mem q, cl_mem p, cl_mem accepted, cl_mem tokens,
                                     cl_event *event) {
    int *d = malloc(n->draft * 4), *acc = malloc(n->accepted * 4), *tok = malloc(n->tokens * 4);
    float *qh = desc->greedy ? NULL : malloc(n->q * 4), *ph = malloc(n->p * 4);
    flashcl_status st = FLASHCL_SUCCESS;
    cl_int err = CL_SUCCESS;
    if (!d || !acc || !tok || !ph || (!desc->greedy && !qh))
        st = flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    if (!st) {
        err = clEnqueueReadBuffer(ctx->queue, draft, CL_TRUE, 0, n->draft * 4, d, 0, NULL, NULL);
        if (!err && qh)
            err = clEnqueueReadBuffer(ctx->queue, q, CL_TRUE, 0, n->q * 4, qh, 0, NULL, NULL);
        if (!err)
            err = clEnqueueReadBuffer(ctx->queue, p, CL_TRUE, 0, n->p * 4, ph, 0, NULL, NULL);
        /* Elements outside the batch's stay as the caller's buffers hold them. */
        if (!err)
            err = clEnqueueReadBuffer(ctx->queue, accepted, CL_TRUE, 0, n->accepted * 4, acc, 0, NULL, NULL);
        if (!err)
            err = clEnqueueReadBuffer(ctx->queue, tokens, CL_TRUE, 0, n->tokens * 4, tok, 0, NULL, NULL);
        if (err)
            st = flashcl_fail(ctx, err, "spec verify: reading the inputs: %s", flashcl_status_string(err));
    }
    spec_consts c;
    flashcl_spec_consts(desc, &c);
    if (!st && flashcl_spec_host_verify(desc, &c, d, qh, ph, acc, tok) != 0)
        st = flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    if (!st) {
        err = clEnqueueWriteBuffer(ctx->queue, accepted, CL_TRUE, 0, n->accepted * 4, acc, 0, NULL, NULL);
        if (!err)
            err = clEnqueueWriteBuffer(ctx->queue, tokens, CL_TRUE, 0, n->tokens * 4, tok, 0, NULL, NULL);
        if (!err && event)
            err = clEnqueueMarkerWithWaitList(ctx->queue, 0, NULL, event);
        if (err)
            st = flashcl_fail(ctx, err, "spec verify: writing the results: %s", flashcl_status_string(err));
    }
    free(d), free(acc), free(tok), free(qh), free(ph);
    return st;
}

flashcl_status flashcl_spec_verify(flashcl_context *ctx, const flashcl_spec_desc *desc, cl_mem draft, cl_mem q,
                                   cl_mem p, cl_mem accepted, cl_mem tokens, cl_event *event) {
    FLASHCL_LOCKED(ctx);
    const flashcl_status entry = flashcl_device_entry(ctx, "flashcl_spec_verify_host");
    if (entry != FLASHCL_SUCCESS)
        return entry;
    spec_sizes n;
    flashcl_status st = check_desc(ctx, desc, &n);
    if (st)
        return st;
    if ((st = check_buf(ctx, "draft", draft, n.draft * 4)) || (!desc->greedy && (st = check_buf(ctx, "q", q, n.q * 4))) ||
        (st = check_buf(ctx, "p", p, n.p * 4)) || (st = check_buf(ctx, "accepted", accepted, n.accepted * 4)) ||
        (st = check_buf(ctx, "tokens", tokens, n.tokens * 4)))
        return st;
    int wg = 1;
    if ((st = pick_wg(ctx, desc->vocab, &wg)))
        return st;
    if (ctx->info.is_rusticl)
        return verify_on_host(ctx, desc, &n, draft, q, p, accepted, tokens, event);
    char options[96];
    /* No -cl-mad-enable or fast-math: the results must round as host_ref does. */
    snprintf(options, sizeof options, "-cl-std=CL1.2 -DWG=%d -DLOGITS=%d -DGREEDY=%d", wg, desc->logits != 0,
             desc->greedy != 0);
    cl_kernel kernel;
    if ((st = flashcl_get_kernel(ctx, "spec_verify.cl", "spec_verify", options, &kernel)))
        return st;
    spec_consts c;
    flashcl_spec_consts(desc, &c);
    cl_mem q_arg = desc->greedy ? p : q; /* never read when greedy */
    cl_ulong offs[5] = {desc->draft_offset, desc->q_offset, desc->p_offset, desc->accepted_offset,
                        desc->tokens_offset};
    cl_int ints[2] = {desc->num_draft, desc->vocab};
    cl_ulong bounds[2] = {c.lo, c.hi};
    cl_uint keys[4] = {(cl_uint)desc->seed, (cl_uint)(desc->seed >> 32), (cl_uint)desc->offset,
                       (cl_uint)(desc->offset >> 32)};
    cl_uint a = 0;
    cl_int err = clSetKernelArg(kernel, a++, sizeof(cl_mem), &draft);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &q_arg);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &p);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &accepted);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &tokens);
    for (int i = 0; i < 5; ++i)
        err |= clSetKernelArg(kernel, a++, sizeof(cl_ulong), &offs[i]);
    for (int i = 0; i < 2; ++i)
        err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &ints[i]);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_float), &c.s);
    for (int i = 0; i < 2; ++i)
        err |= clSetKernelArg(kernel, a++, sizeof(cl_ulong), &bounds[i]);
    for (int i = 0; i < 4; ++i)
        err |= clSetKernelArg(kernel, a++, sizeof(cl_uint), &keys[i]);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, CL_INVALID_KERNEL_ARGS, "clSetKernelArg failed");
    size_t local = (size_t)wg, global = (size_t)desc->batch * local;
    err = clEnqueueNDRangeKernel(ctx->queue, kernel, 1, NULL, &global, &local, 0, NULL, event);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, err, "launching spec_verify: %s", flashcl_status_string(err));
    return FLASHCL_SUCCESS;
}

static const char *bad_reason(int code) {
    switch (code) {
    case FLASHCL_SPEC_BAD_VALUE: return "a NaN or infinite value";
    case FLASHCL_SPEC_BAD_NEGATIVE: return "a negative probability";
    case FLASHCL_SPEC_BAD_SUM: return "a row whose sum is not within tolerance of 1";
    case FLASHCL_SPEC_BAD_TOKEN: return "a draft token outside [0, vocab)";
    case FLASHCL_SPEC_BAD_ROW: return "a logits row that is all -inf";
    default: return "invalid input";
    }
}

flashcl_status flashcl_spec_verify_host(flashcl_context *ctx, const flashcl_spec_desc *desc, const int *draft,
                                        const float *q, const float *p, int *accepted, int *tokens) {
    FLASHCL_LOCKED(ctx);
    if (!ctx)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    spec_sizes n;
    flashcl_status st = check_desc(ctx, desc, &n);
    if (st)
        return st;
    if (!draft || (!q && !desc->greedy) || !p || !accepted || !tokens)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "a pointer is NULL");
    /* Results land in staging first, so the caller's arrays stay untouched on error. */
    int *acc = malloc(n.accepted * sizeof(int)), *tok = malloc(n.tokens * sizeof(int));
    if (!acc || !tok) {
        free(acc);
        free(tok);
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    if (ctx->is_host) {
        spec_consts c;
        flashcl_spec_consts(desc, &c);
        if (flashcl_spec_host_verify(desc, &c, draft, q, p, acc, tok) != 0)
            st = flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    } else {
        cl_int err = CL_SUCCESS;
        const cl_mem_flags in = CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR;
        cl_mem b[5] = {0};
        b[0] = clCreateBuffer(ctx->cl_ctx, in, n.draft * 4, (void *)draft, &err);
        if (b[0] && !desc->greedy)
            b[1] = clCreateBuffer(ctx->cl_ctx, in, n.q * 4, (void *)q, &err);
        if (b[0] && (b[1] || desc->greedy))
            b[2] = clCreateBuffer(ctx->cl_ctx, in, n.p * 4, (void *)p, &err);
        if (b[2])
            b[3] = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, n.accepted * 4, NULL, &err);
        if (b[3])
            b[4] = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, n.tokens * 4, NULL, &err);
        if (!b[4])
            st = flashcl_fail(ctx, err, "allocating device buffers: %s", flashcl_status_string(err));
        else if ((st = flashcl_spec_verify(ctx, desc, b[0], b[1], b[2], b[3], b[4], NULL)) == FLASHCL_SUCCESS) {
            err = clEnqueueReadBuffer(ctx->queue, b[3], CL_TRUE, 0, n.accepted * 4, acc, 0, NULL, NULL);
            if (err == CL_SUCCESS)
                err = clEnqueueReadBuffer(ctx->queue, b[4], CL_TRUE, 0, n.tokens * 4, tok, 0, NULL, NULL);
            if (err != CL_SUCCESS)
                st = flashcl_fail(ctx, err, "reading results: %s", flashcl_status_string(err));
        }
        for (int i = 0; i < 5; ++i)
            if (b[i])
                clReleaseMemObject(b[i]);
    }
    if (st == FLASHCL_SUCCESS)
        for (int i = 0; i < desc->batch; ++i) {
            int code = acc[desc->accepted_offset + (size_t)i];
            if (code < 0) {
                st = flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PROBS, "spec verify: sequence %d has %s", i,
                                  bad_reason(code));
                break;
            }
        }
    if (st == FLASHCL_SUCCESS) {
        memcpy(accepted + desc->accepted_offset, acc + desc->accepted_offset, (size_t)desc->batch * sizeof(int));
        memcpy(tokens + desc->tokens_offset, tok + desc->tokens_offset,
               (size_t)desc->batch * ((size_t)desc->num_draft + 1) * sizeof(int));
    }
    free(acc);
    free(tok);
    return st;
}
