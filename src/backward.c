/* backward.c: checking backward-pass arguments and launching cl/flash_bwd.cl's kernels.
 *
 * One call enqueues three kernels, chained by events:
 *   flash_bwd_pre   D_i = rowsum(dO * O) into scratch (and clears the float
 *                   dQ accumulator in atomic mode)
 *   flash_bwd_dkdv  dK, dV (and, in atomic mode, dQ into the accumulator)
 *   flash_bwd_dq    deterministic mode: dQ by a pass over query blocks
 *   or flash_bwd_dq_store   atomic mode: the accumulator rounded into dQ
 * Scratch (caller-owned): [rows] floats of D_i, then, in atomic mode,
 * [rows][head_dim] floats of dQ, rows = batch * heads_q * seqlen_q.
 * Every kernel is built before the first launch, so a build failure leaves
 * the outputs untouched.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- descriptors and buffers ------------------------------------------------------- */

/* Resolves desc into *r and opts (NULL: defaults) into *o, with messages. */
static flashcl_status resolve(flashcl_context *ctx, const flashcl_attention_desc *desc,
                              const flashcl_backward_options *opts, flashcl_attention_desc *r,
                              flashcl_backward_options *o) {
    if (!desc)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
    *r = *desc;
    flashcl_status st = flashcl_attention_desc_resolve(r);
    if (st == FLASHCL_ERROR_INVALID_SHAPE)
        return flashcl_fail(ctx, st,
                            "invalid shape: batch %d, heads_q %d, heads_k %d, seqlen_q %d, "
                            "seqlen_k %d, head_dim %d (all >= 1, heads_q a multiple of heads_k, "
                            "head_dim <= 256)",
                            desc->batch, desc->heads_q, desc->heads_k, desc->seqlen_q,
                            desc->seqlen_k, desc->head_dim);
    if (st != FLASHCL_SUCCESS)
        return flashcl_fail(ctx, st, "invalid dtype %d, scale %g or softcap %g", (int)desc->dtype,
                            (double)desc->scale, (double)desc->softcap);
    if (opts)
        *o = *opts;
    else
        memset(o, 0, sizeof *o);
    flashcl_default_layout(&o->dout, r->seqlen_q, r->heads_q, r->head_dim);
    flashcl_default_layout(&o->dq, r->seqlen_q, r->heads_q, r->head_dim);
    flashcl_default_layout(&o->dk, r->seqlen_k, r->heads_k, r->head_dim);
    flashcl_default_layout(&o->dv, r->seqlen_k, r->heads_k, r->head_dim);
    return FLASHCL_SUCCESS;
}

enum { T_Q, T_K, T_V, T_OUT, T_DOUT, T_DQ, T_DK, T_DV, T_LSE, T_COUNT };
static const char *const tensor_names[T_COUNT] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv", "lse"};

/* Bytes every tensor spans; 0 when some size overflows size_t. */
static int tensor_bytes(const flashcl_attention_desc *r, const flashcl_backward_options *o,
                        size_t lse_offset, size_t bytes[T_COUNT]) {
    const size_t es = flashcl_dtype_size(r->dtype);
    const int B = r->batch, Nq = r->seqlen_q, Nk = r->seqlen_k, Hq = r->heads_q, Hk = r->heads_k,
              D = r->head_dim;
    bytes[T_Q] = flashcl_layout_bytes(&r->q, B, Nq, Hq, D, es);
    bytes[T_K] = flashcl_layout_bytes(&r->k, B, Nk, Hk, D, es);
    bytes[T_V] = flashcl_layout_bytes(&r->v, B, Nk, Hk, D, es);
    bytes[T_OUT] = flashcl_layout_bytes(&r->out, B, Nq, Hq, D, es);
    bytes[T_DOUT] = flashcl_layout_bytes(&o->dout, B, Nq, Hq, D, es);
    bytes[T_DQ] = flashcl_layout_bytes(&o->dq, B, Nq, Hq, D, es);
    bytes[T_DK] = flashcl_layout_bytes(&o->dk, B, Nk, Hk, D, es);
    bytes[T_DV] = flashcl_layout_bytes(&o->dv, B, Nk, Hk, D, es);
    size_t rows = (size_t)B * (size_t)Hq * (size_t)Nq;
    if (lse_offset + rows < lse_offset || !flashcl_mul_add(lse_offset + rows, sizeof(float), 0, &bytes[T_LSE]))
        bytes[T_LSE] = 0;
    for (int i = 0; i < T_COUNT; ++i)
        if (!bytes[i])
            return 0;
    return 1;
}

/* Scratch bytes for a resolved desc under a choice; 0 on overflow. */
static size_t scratch_bytes(const flashcl_attention_desc *r, int deterministic) {
    size_t rows = (size_t)r->batch * (size_t)r->heads_q * (size_t)r->seqlen_q, n;
    if (!flashcl_mul_add(rows, deterministic ? 1 : (size_t)r->head_dim + 1, 0, &n) ||
        !flashcl_mul_add(n, sizeof(float), 0, &n))
        return 0;
    return n;
}

/* ---- parameters -------------------------------------------------------------------- */

/* FLASHCL_BWD_PARAMS="BLOCK_M=32,BLOCK_N=32,WG=64": strict, like FLASHCL_PARAMS. */
static flashcl_status apply_env_params(flashcl_context *ctx, flashcl_backward_choice *c) {
    const char *env = getenv("FLASHCL_BWD_PARAMS");
    if (!env || !env[0])
        return FLASHCL_SUCCESS;
    for (const char *s = env; *s;) {
        char key[16];
        size_t n = 0;
        while (s[n] && s[n] != '=' && s[n] != ',' && n + 1 < sizeof key) {
            key[n] = (char)toupper((unsigned char)s[n]);
            ++n;
        }
        key[n] = '\0';
        char *end = NULL;
        long value = s[n] == '=' ? strtol(s + n + 1, &end, 10) : 0;
        if (s[n] != '=' || end == s + n + 1 || (*end && *end != ',') || value < 1 || value > 1024 ||
            (*end == ',' && !end[1]))
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                "FLASHCL_BWD_PARAMS: expected KEY=VALUE[,...] with values 1..1024 at '%s'", s);
        if (!strcmp(key, "BLOCK_M"))
            c->block_m = (int)value;
        else if (!strcmp(key, "BLOCK_N"))
            c->block_n = (int)value;
        else if (!strcmp(key, "WG"))
            c->work_group_size = (int)value;
        else
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                "FLASHCL_BWD_PARAMS: unknown parameter '%s' (BLOCK_M, BLOCK_N, WG)", key);
        c->source = "FLASHCL_BWD_PARAMS";
        s = *end ? end + 1 : end;
    }
    return FLASHCL_SUCCESS;
}

static flashcl_status choose(flashcl_context *ctx, const flashcl_attention_desc *r, int deterministic,
                             flashcl_backward_choice *c) {
    flashcl_backward_params(ctx, r, deterministic, c);
    flashcl_status st = apply_env_params(ctx, c);
    if (st != FLASHCL_SUCCESS)
        return st;
    size_t local = flashcl_backward_local_bytes(c->block_m, c->block_n, r->head_dim);
    if (local > ctx->info.local_mem)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                            "backward tiles %dx%d need %zu bytes of local memory, the device has %llu",
                            c->block_m, c->block_n, local, (unsigned long long)ctx->info.local_mem);
    if ((size_t)c->work_group_size > ctx->info.max_wg)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "work-group of %d exceeds the device's %zu",
                            c->work_group_size, ctx->info.max_wg);
    return FLASHCL_SUCCESS;
}

/* ---- kernels ------------------------------------------------------------------------- */

enum { K_PRE, K_MAIN, K_DQ, K_COUNT }; /* K_DQ: flash_bwd_dq or flash_bwd_dq_store */

static flashcl_status build(flashcl_context *ctx, const flashcl_attention_desc *r,
                            const flashcl_backward_choice *c, cl_kernel kernels[K_COUNT]) {
    const char *extra = getenv("FLASHCL_BUILD_OPTIONS");
    char tiles[160], options[512];
    snprintf(tiles, sizeof tiles, " -DHEAD_DIM=%d -DBLOCK_M=%d -DBLOCK_N=%d -DWG=%d", r->head_dim,
             c->block_m, c->block_n, c->work_group_size);
    /* BWD_KERNEL picks the kernel a build holds (flashcl_get_kernel keeps one
     * kernel per file and options); pre and store take head_dim at run time
     * so they build once per dtype. */
    static const struct {
        const char *name;
        int id, tiled;
    } which[4] = {{"flash_bwd_pre", 1, 0}, {"flash_bwd_dkdv", 2, 1}, {"flash_bwd_dq", 3, 1},
                  {"flash_bwd_dq_store", 4, 0}};
    const int pick[K_COUNT] = {0, 1, c->deterministic ? 2 : 3};
    for (int i = 0; i < K_COUNT; ++i) {
        snprintf(options, sizeof options, "-cl-std=CL1.2 -cl-mad-enable -DDTYPE=%d -DBWD_KERNEL=%d%s%s%s",
                 (int)r->dtype, which[pick[i]].id, which[pick[i]].tiled ? tiles : "", extra ? " " : "",
                 extra ? extra : "");
        flashcl_status st = flashcl_get_kernel(ctx, "flash_bwd.cl", which[pick[i]].name, options, &kernels[i]);
        if (st != FLASHCL_SUCCESS)
            return st;
        if (which[pick[i]].tiled) {
            size_t kernel_wg = 0;
            clGetKernelWorkGroupInfo(kernels[i], ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kernel_wg,
                                     &kernel_wg, NULL);
            if (kernel_wg && (size_t)c->work_group_size > kernel_wg)
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                    "%s: work-group of %d exceeds the built kernel's limit of %zu",
                                    which[pick[i]].name, c->work_group_size, kernel_wg);
        }
    }
    return FLASHCL_SUCCESS;
}

/* Sets the four ulongs of a layout from argument *a on. */
static cl_int set_layout_args(cl_kernel kernel, cl_uint *a, const flashcl_layout *l) {
    cl_ulong u[4] = {l->offset, l->stride_batch, l->stride_seq, l->stride_head};
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < 4; ++i)
        err |= clSetKernelArg(kernel, (*a)++, sizeof(cl_ulong), &u[i]);
    return err;
}

/* ---- public entry points -------------------------------------------------------------- */

flashcl_status flashcl_attention_backward_scratch_size(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                       const flashcl_backward_options *opts, size_t *bytes) {
    if (!ctx)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    if (!bytes)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "bytes is NULL");
    flashcl_attention_desc r;
    flashcl_backward_options o;
    flashcl_status st = resolve(ctx, desc, opts, &r, &o);
    if (st != FLASHCL_SUCCESS)
        return st;
    if (ctx->is_host) {
        *bytes = 0;
        return FLASHCL_SUCCESS;
    }
    flashcl_backward_choice c;
    flashcl_backward_params(ctx, &r, o.deterministic, &c);
    size_t n = scratch_bytes(&r, c.deterministic);
    if (!n)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "scratch size overflows size_t");
    *bytes = n;
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_attention_backward(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                          const flashcl_backward_options *opts, cl_mem q, cl_mem k,
                                          cl_mem v, cl_mem out, cl_mem dout, cl_mem lse,
                                          size_t lse_offset, cl_mem dq, cl_mem dk, cl_mem dv,
                                          cl_mem scratch, cl_event *event) {
    if (!ctx)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    if (ctx->is_host)
        return flashcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED,
                            "a host context has no cl_mem buffers: use flashcl_attention_backward_host");
    flashcl_attention_desc r;
    flashcl_backward_options o;
    flashcl_status st = resolve(ctx, desc, opts, &r, &o);
    if (st != FLASHCL_SUCCESS)
        return st;
    size_t bytes[T_COUNT];
    if (!tensor_bytes(&r, &o, lse_offset, bytes))
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "strides or offsets overflow size_t");
    cl_mem bufs[T_COUNT] = {q, k, v, out, dout, dq, dk, dv, lse};
    for (int i = 0; i < T_COUNT; ++i)
        if ((st = flashcl_check_buffer(ctx, tensor_names[i], bufs[i], bytes[i])) != FLASHCL_SUCCESS)
            return st;
    for (int i = T_DQ; i <= T_DV; ++i)
        for (int j = 0; j < T_COUNT; ++j)
            if (j != i && bufs[j] == bufs[i])
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                                    "%s and %s are the same buffer: gradients must not overlap "
                                    "each other or an input", tensor_names[i], tensor_names[j]);
    flashcl_backward_choice c;
    if ((st = choose(ctx, &r, o.deterministic, &c)) != FLASHCL_SUCCESS)
        return st;
    const size_t need = scratch_bytes(&r, c.deterministic);
    if (!need)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "scratch size overflows size_t");
    if ((st = flashcl_check_buffer(ctx, "scratch", scratch, need)) != FLASHCL_SUCCESS)
        return st;
    for (int i = 0; i < T_COUNT; ++i)
        if (bufs[i] == scratch)
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "scratch is the %s buffer",
                                tensor_names[i]);

    cl_kernel kern[K_COUNT];
    if ((st = build(ctx, &r, &c, kern)) != FLASHCL_SUCCESS)
        return st;

    const cl_ulong rows = (cl_ulong)r.batch * (cl_ulong)r.heads_q * (cl_ulong)r.seqlen_q;
    const cl_ulong di_off = 0, dq_acc_off = rows, lse_off = lse_offset;
    const cl_int nq = r.seqlen_q, nk = r.seqlen_k, group = r.heads_q / r.heads_k, D = r.head_dim;
    const cl_int atomics = !c.deterministic, wl = r.window_left, wr = r.window_right;
    const cl_float scale = r.scale, softcap = r.softcap;
    cl_int err = CL_SUCCESS;
    cl_uint a = 0;

    /* flash_bwd_pre(o, dout, scratch, o:4, dout:4, di_off, dq_acc_off, zero_dq, nq, head_dim) */
    cl_kernel kp = kern[K_PRE];
    err |= clSetKernelArg(kp, a++, sizeof(cl_mem), &out);
    err |= clSetKernelArg(kp, a++, sizeof(cl_mem), &dout);
    err |= clSetKernelArg(kp, a++, sizeof(cl_mem), &scratch);
    err |= set_layout_args(kp, &a, &r.out);
    err |= set_layout_args(kp, &a, &o.dout);
    err |= clSetKernelArg(kp, a++, sizeof(cl_ulong), &di_off);
    err |= clSetKernelArg(kp, a++, sizeof(cl_ulong), &dq_acc_off);
    err |= clSetKernelArg(kp, a++, sizeof(cl_int), &atomics);
    err |= clSetKernelArg(kp, a++, sizeof(cl_int), &nq);
    err |= clSetKernelArg(kp, a++, sizeof(cl_int), &D);

    /* flash_bwd_dkdv(q, k, v, dout, lse, scratch, dk, dv, six layouts, lse_off, di_off,
     *                dq_acc_off, use_atomics, nq, nk, group, scale, softcap, wl, wr) */
    cl_kernel km = kern[K_MAIN];
    a = 0;
    cl_mem main_bufs[8] = {q, k, v, dout, lse, scratch, dk, dv};
    for (int i = 0; i < 8; ++i)
        err |= clSetKernelArg(km, a++, sizeof(cl_mem), &main_bufs[i]);
    const flashcl_layout *main_layouts[6] = {&r.q, &r.k, &r.v, &o.dout, &o.dk, &o.dv};
    for (int i = 0; i < 6; ++i)
        err |= set_layout_args(km, &a, main_layouts[i]);
    err |= clSetKernelArg(km, a++, sizeof(cl_ulong), &lse_off);
    err |= clSetKernelArg(km, a++, sizeof(cl_ulong), &di_off);
    err |= clSetKernelArg(km, a++, sizeof(cl_ulong), &dq_acc_off);
    err |= clSetKernelArg(km, a++, sizeof(cl_int), &atomics);
    err |= clSetKernelArg(km, a++, sizeof(cl_int), &nq);
    err |= clSetKernelArg(km, a++, sizeof(cl_int), &nk);
    err |= clSetKernelArg(km, a++, sizeof(cl_int), &group);
    err |= clSetKernelArg(km, a++, sizeof(cl_float), &scale);
    err |= clSetKernelArg(km, a++, sizeof(cl_float), &softcap);
    err |= clSetKernelArg(km, a++, sizeof(cl_int), &wl);
    err |= clSetKernelArg(km, a++, sizeof(cl_int), &wr);

    cl_kernel kd = kern[K_DQ];
    a = 0;
    if (c.deterministic) {
        /* flash_bwd_dq(q, k, v, dout, lse, scratch, dq, five layouts, lse_off, di_off,
         *              nq, nk, group, scale, softcap, wl, wr) */
        cl_mem dq_bufs[7] = {q, k, v, dout, lse, scratch, dq};
        for (int i = 0; i < 7; ++i)
            err |= clSetKernelArg(kd, a++, sizeof(cl_mem), &dq_bufs[i]);
        const flashcl_layout *dq_layouts[5] = {&r.q, &r.k, &r.v, &o.dout, &o.dq};
        for (int i = 0; i < 5; ++i)
            err |= set_layout_args(kd, &a, dq_layouts[i]);
        err |= clSetKernelArg(kd, a++, sizeof(cl_ulong), &lse_off);
        err |= clSetKernelArg(kd, a++, sizeof(cl_ulong), &di_off);
        err |= clSetKernelArg(kd, a++, sizeof(cl_int), &nq);
        err |= clSetKernelArg(kd, a++, sizeof(cl_int), &nk);
        err |= clSetKernelArg(kd, a++, sizeof(cl_int), &group);
        err |= clSetKernelArg(kd, a++, sizeof(cl_float), &scale);
        err |= clSetKernelArg(kd, a++, sizeof(cl_float), &softcap);
        err |= clSetKernelArg(kd, a++, sizeof(cl_int), &wl);
        err |= clSetKernelArg(kd, a++, sizeof(cl_int), &wr);
    } else {
        /* flash_bwd_dq_store(scratch, dq, dq:4, dq_acc_off, nq, head_dim) */
        err |= clSetKernelArg(kd, a++, sizeof(cl_mem), &scratch);
        err |= clSetKernelArg(kd, a++, sizeof(cl_mem), &dq);
        err |= set_layout_args(kd, &a, &o.dq);
        err |= clSetKernelArg(kd, a++, sizeof(cl_ulong), &dq_acc_off);
        err |= clSetKernelArg(kd, a++, sizeof(cl_int), &nq);
        err |= clSetKernelArg(kd, a++, sizeof(cl_int), &D);
    }
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, CL_INVALID_KERNEL_ARGS, "clSetKernelArg failed for the backward kernels");

    const size_t wg = (size_t)c.work_group_size;
    const size_t rows_global[3] = {(size_t)nq, (size_t)r.heads_q, (size_t)r.batch};
    const size_t main_global[3] = {(size_t)((nk + c.block_n - 1) / c.block_n) * wg, (size_t)r.heads_k,
                                   (size_t)r.batch};
    const size_t dq_global[3] = {(size_t)((nq + c.block_m - 1) / c.block_m) * wg, (size_t)r.heads_q,
                                 (size_t)r.batch};
    const size_t local[3] = {wg, 1, 1};
    cl_event e_pre = NULL, e_main = NULL, e_last = NULL;
    err = clEnqueueNDRangeKernel(ctx->queue, kp, 3, NULL, rows_global, NULL, 0, NULL, &e_pre);
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(ctx->queue, km, 3, NULL, main_global, local, 1, &e_pre, &e_main);
    if (err == CL_SUCCESS)
        err = c.deterministic
                  ? clEnqueueNDRangeKernel(ctx->queue, kd, 3, NULL, dq_global, local, 1, &e_main, &e_last)
                  : clEnqueueNDRangeKernel(ctx->queue, kd, 3, NULL, rows_global, NULL, 1, &e_main, &e_last);
    if (e_pre)
        clReleaseEvent(e_pre);
    if (e_main)
        clReleaseEvent(e_main);
    if (err != CL_SUCCESS) {
        if (e_last)
            clReleaseEvent(e_last);
        return flashcl_fail(ctx, err, "launching the backward kernels: %s", flashcl_status_string(err));
    }
    if (event)
        *event = e_last;
    else
        clReleaseEvent(e_last);
    return FLASHCL_SUCCESS;
}

/* ---- host memory convenience layer ------------------------------------------------------ */

flashcl_status flashcl_attention_backward_host(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                               const flashcl_backward_options *opts, const void *q,
                                               const void *k, const void *v, const void *out,
                                               const void *dout, const float *lse, void *dq, void *dk,
                                               void *dv) {
    if (!ctx)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    flashcl_attention_desc r;
    flashcl_backward_options o;
    flashcl_status st = resolve(ctx, desc, opts, &r, &o);
    if (st != FLASHCL_SUCCESS)
        return st;
    const void *ptrs[T_COUNT] = {q, k, v, out, dout, dq, dk, dv, lse};
    for (int i = 0; i < T_COUNT; ++i)
        if (!ptrs[i])
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s is NULL", tensor_names[i]);
    size_t bytes[T_COUNT];
    if (!tensor_bytes(&r, &o, 0, bytes))
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "strides or offsets overflow size_t");
    if (ctx->is_host)
        return flashcl_host_backward(ctx, &r, &o, q, k, v, out, dout, lse, dq, dk, dv);

    size_t scratch_size = 0;
    if ((st = flashcl_attention_backward_scratch_size(ctx, &r, &o, &scratch_size)) != FLASHCL_SUCCESS)
        return st;
    /* Inputs are copied whole; the gradients too, so the elements their
     * strides skip come back unchanged. */
    cl_mem b[T_COUNT + 1] = {0};
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < T_COUNT && err == CL_SUCCESS; ++i) {
        cl_mem_flags f = (i >= T_DQ && i <= T_DV ? CL_MEM_READ_WRITE : CL_MEM_READ_ONLY) | CL_MEM_COPY_HOST_PTR;
        b[i] = clCreateBuffer(ctx->cl_ctx, f, bytes[i], (void *)ptrs[i], &err);
    }
    if (err == CL_SUCCESS)
        b[T_COUNT] = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, scratch_size, NULL, &err);
    void *staging[3] = {NULL, NULL, NULL};
    if (err != CL_SUCCESS) {
        st = flashcl_fail(ctx, err, "allocating device buffers: %s", flashcl_status_string(err));
    } else {
        st = flashcl_attention_backward(ctx, &r, &o, b[T_Q], b[T_K], b[T_V], b[T_OUT], b[T_DOUT],
                                        b[T_LSE], 0, b[T_DQ], b[T_DK], b[T_DV], b[T_COUNT], NULL);
        /* Read all three into staging first, so a failed read cannot leave
         * the outputs half-written. */
        for (int i = 0; i < 3 && st == FLASHCL_SUCCESS; ++i) {
            staging[i] = malloc(bytes[T_DQ + i]);
            err = staging[i] ? clEnqueueReadBuffer(ctx->queue, b[T_DQ + i], CL_TRUE, 0, bytes[T_DQ + i],
                                                   staging[i], 0, NULL, NULL)
                             : CL_OUT_OF_HOST_MEMORY;
            if (err != CL_SUCCESS)
                st = flashcl_fail(ctx, err, "reading results: %s", flashcl_status_string(err));
        }
        if (st == FLASHCL_SUCCESS) {
            memcpy(dq, staging[0], bytes[T_DQ]);
            memcpy(dk, staging[1], bytes[T_DK]);
            memcpy(dv, staging[2], bytes[T_DV]);
        }
    }
    for (int i = 0; i < 3; ++i)
        free(staging[i]);
    for (int i = 0; i <= T_COUNT; ++i)
        if (b[i])
            clReleaseMemObject(b[i]);
    return st;
}
