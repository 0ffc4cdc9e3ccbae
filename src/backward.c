/* backward.c: checking backward-pass arguments and launching the backward kernels (cl/flash_bwd*.cl).
 *
 * One call enqueues three kernels, chained by events (flashcl_backward_enqueue,
 * which src/varlen_backward.c runs once per sequence):
 *   flash_bwd_pre   D_i = rowsum(dO * O) into scratch (and clears the float
 *                   dQ accumulator in atomic mode)
 *   flash_bwd_dkdv  dK, dV (and, in atomic mode, dQ into the accumulator)
 *   flash_bwd_dq    deterministic mode: dQ by a pass over query blocks
 *   (the "cpu" variant: flash_bwd_dkdv_cpu and flash_bwd_dq_cpu from
 *   cl/flash_bwd_cpu.cl, same arguments, one work-item per work-group, whose
 *   dK/dV kernel may own whole (batch, kv head) pairs and add dQ without
 *   atomics: cpu_dq_owner in src/params_backward.c; the
 *   "nv-mma" variant: flash_bwd_dkdv_nv and flash_bwd_dq_nv from
 *   cl/flash_bwd_nv.cl on tensor cores, the dQ pass in both modes unless
 *   FLASHCL_BWD_PARAMS says DQ=atomic: then flash_bwd_dkdv_nv, built with
 *   DQ_ATOMIC, adds dQ into the accumulator and flash_bwd_dq_store follows;
 *   the "nv-wgmma" variant: flash_bwd_dkdv_sm90 and flash_bwd_dq_sm90 from
 *   cl/flash_bwd_sm90.cl on Hopper's warpgroup MMA, the dQ pass in both modes)
 *   or flash_bwd_dq_store   atomic mode: the accumulator rounded into dQ
 * Scratch (caller-owned): [rows] floats of D_i, then, in atomic mode,
 * [rows][head_dim] floats of dQ, rows = batch * heads_q * seqlen_q.
 * Every kernel is built before the first launch, so a build failure leaves
 * the outputs untouched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backward.h"

/* ---- descriptors and buffers ------------------------------------------------------- */

/* Resolves desc into *r and opts (NULL: defaults) into *o, with messages. */
static flashcl_status resolve(flashcl_context *ctx, const flashcl_attention_desc *desc,
                              const flashcl_backward_options *opts, flashcl_attention_desc *r,
                              flashcl_backward_options *o) {
    if (!desc)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
    /* The resolve takes FP8 (for the forward); the backward does not. */
    if (flashcl_dtype_is_fp8(desc->dtype))
        return flashcl_check_dtype(ctx, desc->dtype);
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

static const char *const tensor_names[FLASHCL_BWD_TENSORS] = {"q",    "k",  "v",  "out", "dout",
                                                              "dq",   "dk", "dv", "lse"};

/* Bytes every tensor spans; 0 when some size overflows size_t. seqlen_k 0
 * (a varlen batch without keys) asks 1 byte of k, v, dk, dv: any buffer. */
static int tensor_bytes(const flashcl_attention_desc *r, const flashcl_backward_options *o,
                        size_t lse_offset, size_t bytes[FLASHCL_BWD_TENSORS]) {
    const size_t es = flashcl_dtype_size(r->dtype);
    const int B = r->batch, Nq = r->seqlen_q, Nk = r->seqlen_k, Hq = r->heads_q, Hk = r->heads_k,
              D = r->head_dim;
    bytes[FLASHCL_BWD_Q] = flashcl_layout_bytes(&r->q, B, Nq, Hq, D, es);
    bytes[FLASHCL_BWD_K] = Nk ? flashcl_layout_bytes(&r->k, B, Nk, Hk, D, es) : 1;
    bytes[FLASHCL_BWD_V] = Nk ? flashcl_layout_bytes(&r->v, B, Nk, Hk, D, es) : 1;
    bytes[FLASHCL_BWD_OUT] = flashcl_layout_bytes(&r->out, B, Nq, Hq, D, es);
    bytes[FLASHCL_BWD_DOUT] = flashcl_layout_bytes(&o->dout, B, Nq, Hq, D, es);
    bytes[FLASHCL_BWD_DQ] = flashcl_layout_bytes(&o->dq, B, Nq, Hq, D, es);
    bytes[FLASHCL_BWD_DK] = Nk ? flashcl_layout_bytes(&o->dk, B, Nk, Hk, D, es) : 1;
    bytes[FLASHCL_BWD_DV] = Nk ? flashcl_layout_bytes(&o->dv, B, Nk, Hk, D, es) : 1;
    size_t rows = (size_t)B * (size_t)Hq * (size_t)Nq;
    if (lse_offset + rows < lse_offset ||
        !flashcl_mul_add(lse_offset + rows, sizeof(float), 0, &bytes[FLASHCL_BWD_LSE]))
        bytes[FLASHCL_BWD_LSE] = 0;
    for (int i = 0; i < FLASHCL_BWD_TENSORS; ++i)
        if (!bytes[i])
            return 0;
    return 1;
}

size_t flashcl_backward_scratch_bytes(const flashcl_attention_desc *r, int deterministic) {
    size_t rows = (size_t)r->batch * (size_t)r->heads_q * (size_t)r->seqlen_q, n;
    if (!flashcl_mul_add(rows, deterministic ? 1 : (size_t)r->head_dim + 1, 0, &n) ||
        !flashcl_mul_add(n, sizeof(float), 0, &n))
        return 0;
    return n;
}

flashcl_status flashcl_backward_check_buffers(flashcl_context *ctx, const flashcl_attention_desc *r,
                                              const flashcl_backward_options *o, size_t lse_offset,
                                              const cl_mem bufs[FLASHCL_BWD_TENSORS], cl_mem scratch,
                                              size_t scratch_need) {
    size_t bytes[FLASHCL_BWD_TENSORS];
    if (!tensor_bytes(r, o, lse_offset, bytes) || !scratch_need)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "strides, offsets or scratch overflow size_t");
    flashcl_status st;
    for (int i = 0; i < FLASHCL_BWD_TENSORS; ++i)
        if ((st = flashcl_check_buffer(ctx, tensor_names[i], bufs[i], bytes[i])) != FLASHCL_SUCCESS)
            return st;
    for (int i = FLASHCL_BWD_DQ; i <= FLASHCL_BWD_DV; ++i)
        for (int j = 0; j < FLASHCL_BWD_TENSORS; ++j)
            if (j != i && bufs[j] == bufs[i])
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                                    "%s and %s are the same buffer: gradients must not overlap "
                                    "each other or an input", tensor_names[i], tensor_names[j]);
    if ((st = flashcl_check_buffer(ctx, "scratch", scratch, scratch_need)) != FLASHCL_SUCCESS)
        return st;
    for (int i = 0; i < FLASHCL_BWD_TENSORS; ++i)
        if (bufs[i] == scratch)
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "scratch is the %s buffer",
                                tensor_names[i]);
    return FLASHCL_SUCCESS;
}

/* ---- kernels ------------------------------------------------------------------------- */

/* Work-items a row in the row kernels, the D_i pre-pass and the dQ store
 * (cl/flash_bwd.cl says why): 8 on GPUs, in groups of ROW_WG; 1 with the
 * CPU kernels, or where a group of ROW_WG does not fit. */
#define ROW_WG 128 /* as cl/flash_bwd.cl */
static int row_lanes(const flashcl_context *ctx, const flashcl_backward_choice *c) {
    return c->variant == FLASHCL_BWD_CPU || ctx->info.max_wg < ROW_WG ? 1 : 8;
}

/* The NDRange of a row kernel over rows x heads x batch, `lanes` work-items a
 * row; returns the local size to launch with (local, or NULL for one a row). */
static const size_t *row_range(int lanes, int rows, int heads, int batch, size_t global[3], size_t local[3]) {
    const size_t wg = lanes > 1 ? ROW_WG : 1;
    global[0] = ((size_t)rows * (size_t)lanes + wg - 1) / wg * wg;
    global[1] = (size_t)heads, global[2] = (size_t)batch;
    local[0] = wg, local[1] = local[2] = 1;
    return lanes > 1 ? local : NULL;
}

flashcl_status flashcl_backward_prepare(flashcl_context *ctx, const flashcl_attention_desc *r,
                                        int deterministic, int with_store, flashcl_backward_kernels *k) {
    memset(k, 0, sizeof *k);
    /* A work-item walks a key block's query rows (dK/dV) and a row block's
     * keys (dQ): where the driver ends loops early, refuse both lengths past it. */
    const long walk = flashcl_loop_limit_keys(ctx, r->head_dim);
    if (walk > 0 && (r->seqlen_q > walk || r->seqlen_k > walk))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                            "%s ends a kernel's loops after 65535 iterations: the backward's %d query rows and "
                            "%d keys exceed the %ld one work-item may walk at head_dim %d",
                            ctx->info.name, r->seqlen_q, r->seqlen_k, walk, r->head_dim);
    const flashcl_backward_choice *c = &k->choice;
    flashcl_status st = flashcl_backward_params(ctx, r, deterministic, 0, &k->choice);
    if (st != FLASHCL_SUCCESS)
        return st;
    const char *extra = getenv("FLASHCL_BUILD_OPTIONS");
    /* BWD_KERNEL picks the kernel a build holds (flashcl_get_kernel keeps one
     * kernel per file and options); pre and store take head_dim at run time
     * so they build once per dtype. The cpu, nv-mma and nv-wgmma variants
     * take dK/dV and the dQ pass from their own files; the tensor-core ones
     * run the dQ pass in both modes unless the choice says atomics
     * (flashcl_backward_dq_atomic). */
    static const struct {
        const char *file, *dkdv, *dq;
    } files[] = {[FLASHCL_BWD_PORTABLE] = {"flash_bwd.cl", "flash_bwd_dkdv", "flash_bwd_dq"},
                 [FLASHCL_BWD_CPU] = {"flash_bwd_cpu.cl", "flash_bwd_dkdv_cpu", "flash_bwd_dq_cpu"},
                 [FLASHCL_BWD_NV_MMA] = {"flash_bwd_nv.cl", "flash_bwd_dkdv_nv", "flash_bwd_dq_nv"},
                 [FLASHCL_BWD_NV_WGMMA] = {"flash_bwd_sm90.cl", "flash_bwd_dkdv_sm90", "flash_bwd_dq_sm90"}};
    for (int i = 0; i < 4; ++i) {
        const int nv = flashcl_backward_nv(c), tiled = i == 1 || i == 2;
        const int sm90a = c->variant == FLASHCL_BWD_NV_WGMMA;
        const int atomic = flashcl_backward_dq_atomic(c);
        const int wanted = i == 0 || i == 1 || (i == 2 && !atomic) || (i == 3 && (atomic || with_store));
        cl_kernel *slot[4] = {&k->pre, &k->dkdv, &k->dq, &k->store};
        if (!wanted)
            continue;
        const char *file = tiled ? files[c->variant].file : "flash_bwd.cl";
        const char *name = i == 0   ? "flash_bwd_pre"
                           : i == 1 ? files[c->variant].dkdv
                           : i == 2 ? files[c->variant].dq
                                    : "flash_bwd_dq_store";
        char tiles[200], cap[40], order[32], options[512];
        /* The cap is applied by program.c on NVIDIA's PTX; the order is the
         * forward's. nv-wgmma caps its dK/dV kernel with MAXNREG: its dQ pass
         * needs about 120 registers at D <= 64, and under a cap of 168 ptxas
         * took more and ran slower (BENCHMARKS.md); DQ_MAXNREG caps that pass
         * (the held build at D=128 takes 198 registers, two work-groups an SM). */
        const int capped = nv && !(sm90a && i == 2);
        flashcl_host_define(cap, sizeof cap, extra, "FLASHCL_NV_MAXNREG",
                            capped ? c->nv_max_registers : sm90a && i == 2 ? c->nv_dq_max_registers : 0);
        flashcl_host_define(order, sizeof order, extra, "LPT_HEADS", nv ? flashcl_lpt_heads(r, NULL) : 0);
        snprintf(tiles, sizeof tiles, " -DHEAD_DIM=%d -DBLOCK_M=%d -DBLOCK_N=%d -DWG=%d%s%s%s%s", r->head_dim,
                 c->block_m, c->block_n, c->work_group_size,
                 !nv ? "" : atomic && i == 1 ? " -DFLASHCL_NV_PTX -DDQ_ATOMIC=1" : " -DFLASHCL_NV_PTX",
                 !sm90a ? "" : c->nv_own_regs ? " -DFLASHCL_SM90A -DOWN_REGS=1" : " -DFLASHCL_SM90A", cap, order);
        char lanes[24] = "";
        if (i == 0) /* the first kernel of each pass over the choice */
            k->row_lanes = row_lanes(ctx, c);
        if (i == 0 || i == 3)
            snprintf(lanes, sizeof lanes, " -DROW_LANES=%d", k->row_lanes);
        const int n = snprintf(options, sizeof options, "-cl-std=CL1.2 -cl-mad-enable -DDTYPE=%d -DBWD_KERNEL=%d%s%s%s%s",
                               (int)r->dtype, i + 1, tiled ? tiles : "", lanes, extra ? " " : "", extra ? extra : "");
        if ((st = flashcl_options_fit(ctx, n, sizeof options)) != FLASHCL_SUCCESS)
            return st;
        st = flashcl_get_kernel(ctx, file, name, options, slot[i]);
        const int forced = !strcmp(c->source, "FLASHCL_BWD_PARAMS");
        if (st == FLASHCL_ERROR_BUILD_FAILED && tiled && sm90a && !forced) {
            /* The sm_90a rebuild failed (a driver that refuses it): the
             * mma.sync kernels, re-picked without nv-wgmma entries. */
            flashcl_log("the nv-wgmma backward kernel %s did not build, using the next choice: %.300s", name,
                        flashcl_last_error(ctx));
            flashcl_clear_error(ctx);
            ctx->no_sm90a_bwd = 1;
            if ((st = flashcl_backward_params(ctx, r, deterministic, 0, &k->choice)) != FLASHCL_SUCCESS)
                return st;
            k->dkdv = k->dq = k->store = k->dkdv_tma = k->dq_tma = NULL;
            i = -1;
            continue;
        }
        if (st == FLASHCL_ERROR_BUILD_FAILED && tiled &&
            (c->variant == FLASHCL_BWD_CPU || (nv && !forced))) {
            /* Slower, never wrong: the cpu variant falls back to the portable
             * kernels with the same tiles (the fit check covered them too);
             * nv-mma, unless asked for by FLASHCL_BWD_PARAMS, re-picks its
             * tiles without nv-mma entries. Start over
             * so every kernel is of one variant; the failure is remembered,
             * so this is once. */
            flashcl_log("the %s backward kernel %s did not build, using the portable kernels: %.300s",
                        nv ? "nv-mma" : "cpu", name, flashcl_last_error(ctx));
            flashcl_clear_error(ctx);
            if (nv && (st = flashcl_backward_params(ctx, r, deterministic, 1, &k->choice)) != FLASHCL_SUCCESS)
                return st;
            k->choice.variant = FLASHCL_BWD_PORTABLE;
            k->dkdv = k->dq = k->store = k->dkdv_tma = k->dq_tma = NULL;
            i = -1;
            continue;
        }
        if (st != FLASHCL_SUCCESS)
            return st;
        if (sm90a && i == 1 && c->nv_stages && !flashcl_tma_usable(ctx))
            flashcl_log("FLASHCL_BWD_PARAMS STAGES=%d sets the TMA kernels' stages; without TMA here the "
                        "cp.async kernels run with their own", c->nv_stages);
        if (sm90a && (i == 1 || i == 2) &&
            (c->nv_stages ||
             (flashcl_backward_wgmma_stages(c->block_m, c->work_group_size, r->head_dim, c->nv_own_regs) == 2 &&
              flashcl_backward_wgmma_stages(c->block_n, c->work_group_size, r->head_dim, c->nv_own_regs) == 2)) &&
            flashcl_tma_usable(ctx)) {
            /* The same kernel with its streamed tiles copied by TMA (where
             * both kernels' tiles take two stages, cl/flash_bwd_sm90.cl, or
             * as many as FLASHCL_BWD_PARAMS's STAGES). If it does not build,
             * the cp.async kernel just built answers. */
            char with_tma[560];
            snprintf(with_tma, sizeof with_tma, "%s -DUSE_TMA=1", options);
            if (c->nv_stages)
                snprintf(with_tma + strlen(with_tma), sizeof with_tma - strlen(with_tma), " -DSTAGES=%d",
                         c->nv_stages);
            st = flashcl_get_kernel(ctx, file, name, with_tma, i == 1 ? &k->dkdv_tma : &k->dq_tma);
            if (st == FLASHCL_ERROR_BUILD_FAILED && c->nv_stages)
                return st; /* STAGES means the TMA kernels: no quiet fallback to two stages of cp.async */
            if (st == FLASHCL_ERROR_BUILD_FAILED) {
                flashcl_log("the nv-wgmma backward kernel %s with TMA copies did not build, using it without: %.300s",
                            name, flashcl_last_error(ctx));
                flashcl_clear_error(ctx);
                ctx->no_tma = 1;
                k->dkdv_tma = k->dq_tma = NULL;
            } else if (st != FLASHCL_SUCCESS) {
                return st;
            }
        }
        if (tiled && c->variant == FLASHCL_BWD_PORTABLE) {
            size_t kernel_wg = 0;
            clGetKernelWorkGroupInfo(*slot[i], ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kernel_wg,
                                     &kernel_wg, NULL);
            if (kernel_wg && (size_t)c->work_group_size > kernel_wg)
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                    "%s: work-group of %d exceeds the built kernel's limit of %zu", name,
                                    c->work_group_size, kernel_wg);
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

/* FLASHCL_PROFILE=1 with the log on (FLASHCL_LOG=1 or flashcl_set_log; a
 * diagnostic: a backward call then waits for its kernels): the log gets each
 * backward kernel's time from the queue's profiling events, when the queue
 * records them. */
static void profile_kernels(cl_event pre, cl_event main_k, cl_event dq) {
    const char *env = getenv("FLASHCL_PROFILE");
    if (!env || strcmp(env, "1") != 0 || !flashcl_log_enabled())
        return; /* nowhere to say it: no waiting either */
    cl_event all[3] = {pre, main_k, dq};
    const char *names[3] = {"D_i pre-pass", "dK/dV", "dQ pass"};
    char line[256];
    size_t at = (size_t)snprintf(line, sizeof line, "backward kernels:");
    for (int i = 0; i < 3 && all[i]; ++i) {
        cl_ulong t0 = 0, t1 = 0;
        clWaitForEvents(1, &all[i]);
        if (clGetEventProfilingInfo(all[i], CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL) != CL_SUCCESS ||
            clGetEventProfilingInfo(all[i], CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL) != CL_SUCCESS)
            return; /* no profiling on this queue */
        at += (size_t)snprintf(line + at, at < sizeof line ? sizeof line - at : 0, " %s %.1f us%s", names[i],
                               (double)(t1 - t0) * 1e-3, i < 2 && all[i + 1] ? "," : "");
        if (at >= sizeof line)
            break;
    }
    flashcl_log("%s", line);
}

/* Hands the last event of a launch to the caller, or releases it. */
static void hand_over(cl_event e, cl_event *event) {
    if (event)
        *event = e;
    else
        clReleaseEvent(e);
}

flashcl_status flashcl_backward_enqueue_store(flashcl_context *ctx, const flashcl_backward_kernels *k, cl_mem scratch,
                                              size_t acc_offset, cl_mem dst, const flashcl_layout *l,
                                              int batch, int seqlen, int heads, int head_dim, cl_uint num_wait,
                                              const cl_event *wait, cl_event *event) {
    /* flash_bwd_dq_store(scratch, dq, dq:4, dq_acc_off, nq, head_dim) */
    cl_kernel store = k->store;
    const cl_ulong acc_off = acc_offset;
    const cl_int n = seqlen, D = head_dim;
    cl_uint a = 0;
    cl_int err = clSetKernelArg(store, a++, sizeof(cl_mem), &scratch);
    err |= clSetKernelArg(store, a++, sizeof(cl_mem), &dst);
    err |= set_layout_args(store, &a, l);
    err |= clSetKernelArg(store, a++, sizeof(cl_ulong), &acc_off);
    err |= clSetKernelArg(store, a++, sizeof(cl_int), &n);
    err |= clSetKernelArg(store, a++, sizeof(cl_int), &D);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, CL_INVALID_KERNEL_ARGS, "clSetKernelArg failed for flash_bwd_dq_store");
    size_t global[3], local[3];
    const size_t *use_local = row_range(k->row_lanes, seqlen, heads, batch, global, local);
    cl_event e = NULL;
    err = clEnqueueNDRangeKernel(ctx->queue, store, 3, NULL, global, use_local, num_wait, num_wait ? wait : NULL, &e);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, err, "launching flash_bwd_dq_store: %s", flashcl_status_string(err));
    hand_over(e, event);
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_backward_enqueue(flashcl_context *ctx, const flashcl_attention_desc *r,
                                        const flashcl_backward_options *o, const flashcl_backward_kernels *k,
                                        const cl_mem bufs[FLASHCL_BWD_TENSORS], size_t lse_offset,
                                        cl_mem scratch, size_t scratch_offset, cl_uint num_wait,
                                        const cl_event *wait, cl_event *event) {
    const flashcl_backward_choice *c = &k->choice;
    const cl_mem q = bufs[FLASHCL_BWD_Q], kk = bufs[FLASHCL_BWD_K], v = bufs[FLASHCL_BWD_V];
    const cl_mem out = bufs[FLASHCL_BWD_OUT], dout = bufs[FLASHCL_BWD_DOUT], lse = bufs[FLASHCL_BWD_LSE];
    const cl_mem dq = bufs[FLASHCL_BWD_DQ], dk = bufs[FLASHCL_BWD_DK], dv = bufs[FLASHCL_BWD_DV];
    const cl_ulong rows = (cl_ulong)r->batch * (cl_ulong)r->heads_q * (cl_ulong)r->seqlen_q;
    const cl_ulong di_off = scratch_offset, dq_acc_off = scratch_offset + rows, lse_off = lse_offset;
    const cl_int nq = r->seqlen_q, nk = r->seqlen_k, group = r->heads_q / r->heads_k, D = r->head_dim;
    const int dq_pass = !flashcl_backward_dq_atomic(c);
    /* use_atomics: 0 the dQ pass sums dQ, 1 atomics from the dK/dV kernel, 2
     * the cpu kernel's owner mode (plain adds; dQ's accumulator as for 1) */
    const cl_int atomics = dq_pass ? 0 : c->cpu_dq_owner ? 2 : 1, wl = r->window_left, wr = r->window_right;
    const cl_float scale = r->scale, softcap = r->softcap;
    cl_int err = CL_SUCCESS;
    cl_uint a = 0;

    /* the cpu kernels: one work-item per work-group */
    const size_t wg = c->variant == FLASHCL_BWD_CPU ? 1 : (size_t)c->work_group_size;
    const int keys = flashcl_backward_keys_per_group(c), rows_per = flashcl_backward_rows_per_group(c);
    size_t rows_global[3], rows_local[3];
    const size_t *pre_local = row_range(k->row_lanes, nq, r->heads_q, r->batch, rows_global, rows_local);
    const size_t key_groups = c->cpu_dq_owner ? 1 : (size_t)((nk + keys - 1) / keys);
    const size_t main_global[3] = {key_groups * wg, (size_t)r->heads_k, (size_t)r->batch};
    const size_t dq_global[3] = {(size_t)((nq + rows_per - 1) / rows_per) * wg, (size_t)r->heads_q,
                                 (size_t)r->batch};

    /* flash_bwd_pre(o, dout, scratch, o:4, dout:4, di_off, dq_acc_off, zero_dq, nq, head_dim) */
    cl_kernel kp = k->pre;
    err |= clSetKernelArg(kp, a++, sizeof(cl_mem), &out);
    err |= clSetKernelArg(kp, a++, sizeof(cl_mem), &dout);
    err |= clSetKernelArg(kp, a++, sizeof(cl_mem), &scratch);
    err |= set_layout_args(kp, &a, &r->out);
    err |= set_layout_args(kp, &a, &o->dout);
    err |= clSetKernelArg(kp, a++, sizeof(cl_ulong), &di_off);
    err |= clSetKernelArg(kp, a++, sizeof(cl_ulong), &dq_acc_off);
    err |= clSetKernelArg(kp, a++, sizeof(cl_int), &atomics);
    err |= clSetKernelArg(kp, a++, sizeof(cl_int), &nq);
    err |= clSetKernelArg(kp, a++, sizeof(cl_int), &D);

    /* The nv-wgmma kernels copy by TMA where both built so and every map
     * encodes: Q's and dO's for dK/dV, K's and V's for the dQ pass. */
    flashcl_tensor_map maps[2][2];
    const int tma = k->dkdv_tma && (k->dq_tma || !dq_pass) &&
                    flashcl_tma_encode_pair(&r->q, &o->dout, r->batch, nq, r->heads_q, D, (unsigned)c->block_m,
                                            maps[0]) &&
                    (!dq_pass || flashcl_tma_encode_pair(&r->k, &r->v, r->batch, nk, r->heads_k, D,
                                                         (unsigned)c->block_n, maps[1]));
    if (tma) {
        const size_t main_groups = main_global[0] / wg * main_global[1] * main_global[2];
        const size_t dq_groups = dq_global[0] / wg * dq_global[1] * dq_global[2];
        flashcl_status st = flashcl_ensure_tma_slots(ctx, main_groups > dq_groups ? main_groups : dq_groups);
        if (st != FLASHCL_SUCCESS)
            return st;
    }

    /* flash_bwd_dkdv, flash_bwd_dkdv_cpu or flash_bwd_dkdv_nv(q, k, v, dout, lse, scratch, dk, dv, six layouts,
     *                lse_off, di_off, dq_acc_off, use_atomics, nq, nk, group, scale, softcap, wl, wr) */
    cl_kernel km = tma ? k->dkdv_tma : k->dkdv;
    a = 0;
    const cl_mem main_bufs[8] = {q, kk, v, dout, lse, scratch, dk, dv};
    for (int i = 0; i < 8; ++i)
        err |= clSetKernelArg(km, a++, sizeof(cl_mem), &main_bufs[i]);
    const flashcl_layout *main_layouts[6] = {&r->q, &r->k, &r->v, &o->dout, &o->dk, &o->dv};
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
    err |= flashcl_set_tma_args(km, &a, tma ? maps[0] : NULL, ctx->tma_slots);

    cl_kernel kd = tma ? k->dq_tma : k->dq;
    if (dq_pass) {
        /* flash_bwd_dq, flash_bwd_dq_cpu or flash_bwd_dq_nv(q, k, v, dout, lse, scratch, dq, five layouts, lse_off, di_off,
         *              nq, nk, group, scale, softcap, wl, wr) */
        a = 0;
        const cl_mem dq_bufs[7] = {q, kk, v, dout, lse, scratch, dq};
        for (int i = 0; i < 7; ++i)
            err |= clSetKernelArg(kd, a++, sizeof(cl_mem), &dq_bufs[i]);
        const flashcl_layout *dq_layouts[5] = {&r->q, &r->k, &r->v, &o->dout, &o->dq};
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
        err |= flashcl_set_tma_args(kd, &a, tma ? maps[1] : NULL, ctx->tma_slots);
    }
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, CL_INVALID_KERNEL_ARGS, "clSetKernelArg failed for the backward kernels");
    const size_t local[3] = {wg, 1, 1};
    cl_event e_pre = NULL, e_main = NULL, e_last = NULL;
    err = clEnqueueNDRangeKernel(ctx->queue, kp, 3, NULL, rows_global, pre_local, num_wait, num_wait ? wait : NULL,
                                 &e_pre);
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(ctx->queue, km, 3, NULL, main_global, local, 1, &e_pre, &e_main);
    if (err == CL_SUCCESS && dq_pass)
        err = clEnqueueNDRangeKernel(ctx->queue, kd, 3, NULL, dq_global, local, 1, &e_main, &e_last);
    if (err == CL_SUCCESS)
        profile_kernels(e_pre, e_main, e_last);
    if (e_pre)
        clReleaseEvent(e_pre);
    if (err != CL_SUCCESS) {
        if (e_main)
            clReleaseEvent(e_main);
        if (e_last)
            clReleaseEvent(e_last);
        return flashcl_fail(ctx, err, "launching the backward kernels: %s", flashcl_status_string(err));
    }
    if (dq_pass) {
        clReleaseEvent(e_main);
        hand_over(e_last, event);
        return FLASHCL_SUCCESS;
    }
    /* Atomic mode: the accumulator rounded into dQ. */
    flashcl_status st = flashcl_backward_enqueue_store(ctx, k, scratch, dq_acc_off, dq, &o->dq, r->batch,
                                                       nq, r->heads_q, D, 1, &e_main, event);
    clReleaseEvent(e_main);
    return st;
}

/* ---- public entry points -------------------------------------------------------------- */

flashcl_status flashcl_attention_backward_scratch_size(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                                       const flashcl_backward_options *opts, size_t *bytes) {
    FLASHCL_LOCKED(ctx);
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
    size_t n = flashcl_backward_scratch_bytes(&r, o.deterministic != 0);
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
    FLASHCL_LOCKED(ctx);
    const flashcl_status entry = flashcl_device_entry(ctx, "flashcl_attention_backward_host");
    if (entry != FLASHCL_SUCCESS)
        return entry;
    flashcl_attention_desc r;
    flashcl_backward_options o;
    flashcl_status st = resolve(ctx, desc, opts, &r, &o);
    if (st != FLASHCL_SUCCESS)
        return st;
    const cl_mem bufs[FLASHCL_BWD_TENSORS] = {q, k, v, out, dout, dq, dk, dv, lse};
    const size_t need = flashcl_backward_scratch_bytes(&r, o.deterministic != 0);
    flashcl_backward_kernels kern;
    if ((st = flashcl_backward_check_buffers(ctx, &r, &o, lse_offset, bufs, scratch, need)) != FLASHCL_SUCCESS ||
        (st = flashcl_backward_prepare(ctx, &r, o.deterministic, 0, &kern)) != FLASHCL_SUCCESS)
        return st;
    return flashcl_backward_enqueue(ctx, &r, &o, &kern, bufs, lse_offset, scratch, 0, 0, NULL, event);
}

/* ---- host memory convenience layer ------------------------------------------------------ */

flashcl_status flashcl_attention_backward_host(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                               const flashcl_backward_options *opts, const void *q,
                                               const void *k, const void *v, const void *out,
                                               const void *dout, const float *lse, void *dq, void *dk,
                                               void *dv) {
    FLASHCL_LOCKED(ctx);
    if (!ctx)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    flashcl_attention_desc r;
    flashcl_backward_options o;
    flashcl_status st = resolve(ctx, desc, opts, &r, &o);
    if (st != FLASHCL_SUCCESS)
        return st;
    const void *ptrs[FLASHCL_BWD_TENSORS] = {q, k, v, out, dout, dq, dk, dv, lse};
    for (int i = 0; i < FLASHCL_BWD_TENSORS; ++i)
        if (!ptrs[i])
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s is NULL", tensor_names[i]);
    size_t bytes[FLASHCL_BWD_TENSORS];
    if (!tensor_bytes(&r, &o, 0, bytes))
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "strides or offsets overflow size_t");
    if (ctx->is_host)
        return flashcl_host_backward(ctx, &r, &o, q, k, v, out, dout, lse, dq, dk, dv);

    size_t scratch_size = 0;
    if ((st = flashcl_attention_backward_scratch_size(ctx, &r, &o, &scratch_size)) != FLASHCL_SUCCESS)
        return st;
    /* Inputs are copied whole; the gradients too, so the elements their
     * strides skip come back unchanged. */
    cl_mem b[FLASHCL_BWD_TENSORS + 1] = {0};
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < FLASHCL_BWD_TENSORS && err == CL_SUCCESS; ++i) {
        const int grad = i >= FLASHCL_BWD_DQ && i <= FLASHCL_BWD_DV;
        cl_mem_flags f = (grad ? CL_MEM_READ_WRITE : CL_MEM_READ_ONLY) | CL_MEM_COPY_HOST_PTR;
        b[i] = clCreateBuffer(ctx->cl_ctx, f, bytes[i], (void *)ptrs[i], &err);
    }
    if (err == CL_SUCCESS)
        b[FLASHCL_BWD_TENSORS] = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, scratch_size, NULL, &err);
    void *staging[3] = {NULL, NULL, NULL};
    if (err != CL_SUCCESS) {
        st = flashcl_fail(ctx, err, "allocating device buffers: %s", flashcl_status_string(err));
    } else {
        st = flashcl_attention_backward(ctx, &r, &o, b[FLASHCL_BWD_Q], b[FLASHCL_BWD_K], b[FLASHCL_BWD_V],
                                        b[FLASHCL_BWD_OUT], b[FLASHCL_BWD_DOUT], b[FLASHCL_BWD_LSE], 0,
                                        b[FLASHCL_BWD_DQ], b[FLASHCL_BWD_DK], b[FLASHCL_BWD_DV],
                                        b[FLASHCL_BWD_TENSORS], NULL);
        /* Read all three into staging first, so a failed read cannot leave
         * the outputs half-written. */
        for (int i = 0; i < 3 && st == FLASHCL_SUCCESS; ++i) {
            const size_t n = bytes[FLASHCL_BWD_DQ + i];
            staging[i] = malloc(n);
            err = staging[i] ? clEnqueueReadBuffer(ctx->queue, b[FLASHCL_BWD_DQ + i], CL_TRUE, 0, n,
                                                   staging[i], 0, NULL, NULL)
                             : CL_OUT_OF_HOST_MEMORY;
            if (err != CL_SUCCESS)
                st = flashcl_fail(ctx, err, "reading results: %s", flashcl_status_string(err));
        }
        if (st == FLASHCL_SUCCESS) {
            memcpy(dq, staging[0], bytes[FLASHCL_BWD_DQ]);
            memcpy(dk, staging[1], bytes[FLASHCL_BWD_DK]);
            memcpy(dv, staging[2], bytes[FLASHCL_BWD_DV]);
        }
    }
    for (int i = 0; i < 3; ++i)
        free(staging[i]);
    for (int i = 0; i <= FLASHCL_BWD_TENSORS; ++i)
        if (b[i])
            clReleaseMemObject(b[i]);
    return st;
}
