/* attention.c: checking attention arguments and launching the forward kernel. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- descriptors -------------------------------------------------------------------- */

flashcl_status flashcl_attention_desc_resolve(flashcl_attention_desc *d) {
    if (!d)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    /* FP8 q, k, v are the forward's alone (its checks: fp8_forward.c); every
     * other call that resolves a desc refuses them itself. */
    if (flashcl_dtype_is_fp8(d->dtype) ? flashcl_fp8_desc_problem(d) != NULL : flashcl_dtype_unusable(d->dtype) != NULL)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    if (d->v_packed && !flashcl_dtype_is_fp8(d->dtype))
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    if (d->batch < 1 || d->heads_q < 1 || d->heads_k < 1 || d->seqlen_q < 1 || d->seqlen_k < 1 ||
        d->head_dim < 1)
        return FLASHCL_ERROR_INVALID_SHAPE;
    if (d->heads_q % d->heads_k != 0 || d->head_dim > 256)
        return FLASHCL_ERROR_INVALID_SHAPE;
    if (!(d->scale >= 0.0f) || isinf(d->scale) || !(d->softcap >= 0.0f) || isinf(d->softcap))
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    if (d->scale == 0.0f)
        d->scale = 1.0f / sqrtf((float)d->head_dim);
    if (!d->windowed)
        d->window_left = d->window_right = -1;
    if (d->causal)
        d->window_right = 0; /* flash-attn: causal is a window whose right side is 0 */
    d->windowed = 1; /* resolved: the two sides are final */
    if (d->window_left < 0)
        d->window_left = -1;
    if (d->window_right < 0)
        d->window_right = -1;
    flashcl_default_layout(&d->q, d->seqlen_q, d->heads_q, d->head_dim);
    flashcl_default_layout(&d->out, d->seqlen_q, d->heads_q, d->head_dim);
    flashcl_default_layout(&d->k, d->seqlen_k, d->heads_k, d->head_dim);
    flashcl_default_layout(&d->v, d->seqlen_k, d->heads_k, d->head_dim);
    return FLASHCL_SUCCESS;
}

/* Resolves *d into *r and checks it; the error message names the problem. */
static flashcl_status check_desc(flashcl_context *ctx, const flashcl_attention_desc *d,
                                 flashcl_attention_desc *r) {
    if (!d)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
    *r = *d;
    flashcl_status st = flashcl_attention_desc_resolve(r);
    if (st == FLASHCL_SUCCESS)
        return st;
    if (flashcl_dtype_is_fp8(d->dtype) && flashcl_fp8_desc_problem(d))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "FP8 forward: %s", flashcl_fp8_desc_problem(d));
    if (!flashcl_dtype_is_fp8(d->dtype) && flashcl_dtype_unusable(d->dtype))
        return flashcl_check_dtype(ctx, d->dtype);
    if (d->v_packed && !flashcl_dtype_is_fp8(d->dtype))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "v_packed is for FP8 v (dtype FLASHCL_FLOAT8_E4M3 or _E5M2): the layout is the Hopper FP8 "
                            "kernel's");
    if (st == FLASHCL_ERROR_INVALID_SHAPE)
        return flashcl_fail(ctx, st,
                            "invalid shape: batch %d, heads_q %d, heads_k %d, seqlen_q %d, "
                            "seqlen_k %d, head_dim %d (all >= 1, heads_q a multiple of heads_k, "
                            "head_dim <= 256)",
                            d->batch, d->heads_q, d->heads_k, d->seqlen_q, d->seqlen_k, d->head_dim);
    return flashcl_fail(ctx, st, "invalid scale %g or softcap %g (finite, >= 0)", (double)d->scale,
                        (double)d->softcap);
}

/* Bytes each tensor's layout spans (0 on overflow). */
typedef struct extents {
    size_t q, k, v, out, lse;
} extents;

static int tensor_extents(const flashcl_attention_desc *r, size_t lse_offset, extents *e) {
    /* An FP8 desc: q, k, v one byte an element, out out_dtype's size. */
    size_t es = flashcl_dtype_size(r->dtype), es_out = flashcl_dtype_size(flashcl_out_dtype(r));
    size_t lse_count = (size_t)r->batch * (size_t)r->heads_q * (size_t)r->seqlen_q;
    e->q = flashcl_layout_bytes(&r->q, r->batch, r->seqlen_q, r->heads_q, r->head_dim, es);
    e->out = flashcl_layout_bytes(&r->out, r->batch, r->seqlen_q, r->heads_q, r->head_dim, es_out);
    e->k = flashcl_layout_bytes(&r->k, r->batch, r->seqlen_k, r->heads_k, r->head_dim, es);
    if (r->v_packed) { /* its bytes from v.offset */
        int keys, rows;
        const size_t packed = flashcl_fp8_vt_shape(r, &keys, &rows);
        if (!packed || !flashcl_mul_add(1, packed, r->v.offset, &e->v))
            e->v = 0;
    } else {
        e->v = flashcl_layout_bytes(&r->v, r->batch, r->seqlen_k, r->heads_k, r->head_dim, es);
    }
    return e->q && e->out && e->k && e->v && lse_offset + lse_count >= lse_offset &&
           flashcl_mul_add(lse_offset + lse_count, sizeof(float), 0, &e->lse);
}

/* ---- parameters ---------------------------------------------------------------------- */

/* The forward kernels. Each takes the same arguments; they differ in file,
 * in how the work-group is shaped and in the one extra -D they need. */
typedef struct forward_variant {
    const char *name, *file, *kernel;
    const char *extra; /* the -D beyond BLOCK_M/BLOCK_N, or NULL */
} forward_variant;

static const forward_variant variants[] = {
    {"portable", "flash_fwd.cl", "flash_fwd", "TPR"},
    {"cpu", "flash_fwd_cpu.cl", "flash_fwd_cpu", NULL},
    {"nv-mma", "flash_fwd_nv.cl", "flash_fwd_nv", "WARPS"},
    {"nv-tf32", "flash_fwd_nv32.cl", "flash_fwd_nv32", "WARPS"},
    {"nv-wgmma", "flash_fwd_sm90.cl", "flash_fwd_sm90", "WARPS"},
    {"nv-wgmma-fp8", "flash_fwd_sm90_fp8.cl", "flash_fwd_sm90_fp8", "WARPS"},
};

static const forward_variant *find_variant(const char *name) {
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; ++i)
        if (!strcmp(variants[i].name, name))
            return &variants[i];
    return NULL;
}

/* The value of a variant's extra -D from its parameters. */
static int extra_value(const forward_variant *v, const flashcl_params *p) {
    if (!v->extra)
        return 0;
    return !strcmp(v->extra, "TPR") ? p->threads_per_row : p->work_group_size / 32;
}

/* FLASHCL_PARAMS="BLOCK_M=32,BLOCK_N=16,TPR=4": strict; any unknown key,
 * missing value or trailing garbage is FLASHCL_ERROR_MALFORMED_ENV naming
 * the entry (values that parse but do not fit stay INVALID_PARAMS). */
static flashcl_status apply_env_params(flashcl_context *ctx, const flashcl_attention_desc *r, flashcl_params *p) {
    const char *env = getenv("FLASHCL_PARAMS");
    if (!env || !env[0])
        return FLASHCL_SUCCESS;
    flashcl_kv kv;
    int item, value;
    /* VARIANT first, wherever it stands: the other keys are that kernel's. */
    for (const char *s = env; (item = flashcl_kv_next(&s, &kv)) == FLASHCL_KV_ITEM;) {
        if (!flashcl_kv_key(&kv, "VARIANT"))
            continue;
        char name[16] = "";
        if (kv.value_len < sizeof name)
            memcpy(name, kv.value, kv.value_len);
        if (!find_variant(name))
            return flashcl_fail(ctx, FLASHCL_ERROR_MALFORMED_ENV,
                                "FLASHCL_PARAMS: VARIANT must be portable, cpu, nv-mma, nv-tf32, nv-wgmma or nv-wgmma-fp8 "
                                "in '%s'",
                                env);
        char why[200];
        if (!flashcl_variant_params(ctx, r, name, p, why, sizeof why))
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                "FLASHCL_PARAMS: the %s kernel does not apply to this problem on this device%s%s", name,
                                why[0] ? ": " : "", why);
    }
    const forward_variant *v = find_variant(p->variant);
    for (const char *s = env; (item = flashcl_kv_next(&s, &kv)) != FLASHCL_KV_END;) {
        if (item == FLASHCL_KV_ITEM && flashcl_kv_key(&kv, "VARIANT"))
            continue;
        if (item == FLASHCL_KV_NO_EQUALS)
            return flashcl_fail(ctx, FLASHCL_ERROR_MALFORMED_ENV,
                                "FLASHCL_PARAMS: expected KEY=VALUE at '%s'", kv.at);
        if (item == FLASHCL_KV_TRAILING_COMMA)
            return flashcl_fail(ctx, FLASHCL_ERROR_MALFORMED_ENV,
                                "FLASHCL_PARAMS: trailing comma in '%s'", env);
        if (!flashcl_kv_int(&kv, 1, 4096, &value))
            return flashcl_fail(ctx, FLASHCL_ERROR_MALFORMED_ENV,
                                "FLASHCL_PARAMS: bad value for %.*s in '%s'", (int)kv.key_len, kv.key, env);
        if (flashcl_kv_key(&kv, "BLOCK_M"))
            p->block_m = value;
        else if (flashcl_kv_key(&kv, "BLOCK_N"))
            p->block_n = value;
        else if (v && v->extra && flashcl_kv_key(&kv, "TPR") && !strcmp(v->extra, "TPR"))
            p->threads_per_row = value;
        else if (v && v->extra && flashcl_kv_key(&kv, "WARPS") && !strcmp(v->extra, "WARPS"))
            p->work_group_size = 32 * value;
        else
            return flashcl_fail(ctx, FLASHCL_ERROR_MALFORMED_ENV,
                                "FLASHCL_PARAMS: unknown parameter '%.*s' for the %s kernel "
                                "(VARIANT, BLOCK_M, BLOCK_N%s%s)",
                                (int)kv.key_len, kv.key, p->variant, v && v->extra ? ", " : "",
                                v && v->extra ? v->extra : "");
        p->source = "FLASHCL_PARAMS";
    }
    if (p->threads_per_row)
        p->work_group_size = p->block_m * p->threads_per_row;
    return FLASHCL_SUCCESS;
}

/* Checks parameters against the kernel's rules and the device before anything
 * is built: the rules flashcl_set_params and the tuning file are held to. */
static flashcl_status check_params(flashcl_context *ctx, const flashcl_attention_desc *r,
                                   const flashcl_params *p) {
    char why[256];
    if (!flashcl_params_fit(ctx, r->head_dim, p, why, sizeof why))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "%s", why);
    return FLASHCL_SUCCESS;
}

/* Parameters for a resolved desc, checked against the device. */
static flashcl_status choose_params(flashcl_context *ctx, const flashcl_attention_desc *r,
                                    flashcl_params *p) {
    flashcl_default_params(ctx, r, p);
    if (ctx->is_host)
        return FLASHCL_SUCCESS;
    flashcl_status st = apply_env_params(ctx, r, p);
    return st != FLASHCL_SUCCESS ? st : check_params(ctx, r, p);
}

flashcl_status flashcl_attention_params(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                        flashcl_params *params) {
    FLASHCL_LOCKED(ctx);
    if (!ctx || !params)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    flashcl_attention_desc r;
    flashcl_status st = check_desc(ctx, desc, &r);
    return st != FLASHCL_SUCCESS ? st : choose_params(ctx, &r, params);
}

/* ---- the forward pass ------------------------------------------------------------------ */

static flashcl_status build_forward(flashcl_context *ctx, const flashcl_attention_desc *r,
                                    const flashcl_params *p, int tma, cl_kernel *kernel) {
    const forward_variant *v = find_variant(p->variant);
    if (!v)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "no kernel variant '%s'", p->variant);
    const char *extra = getenv("FLASHCL_BUILD_OPTIONS");
    char define[32] = "", cap[40], order[32], fp8[32] = "", options[560];
    if (v->extra)
        snprintf(define, sizeof define, " -D%s=%d", v->extra, extra_value(v, p));
    else if (!strcmp(v->name, "cpu")) /* the vector width flashcl_forward_local_bytes sizes for */
        flashcl_host_define(define, sizeof define, extra, "LANES", FLASHCL_CPU_LANES);
    /* Longest blocks first where they differ, on the tensor-core kernels. */
    flashcl_host_define(order, sizeof order, extra, "LPT_HEADS",
                        flashcl_variant_is_nv(v->name) ? flashcl_lpt_heads(r, v->name) : 0);
    flashcl_host_define(cap, sizeof cap, extra, "FLASHCL_NV_MAXNREG", flashcl_nv_wgmma_max_registers(p, r->head_dim));
    /* FP8: q, k, v decode in the kernel (cl/common.cl); DTYPE is out's type. */
    if (flashcl_dtype_is_fp8(r->dtype))
        snprintf(fp8, sizeof fp8, " -DQ_FP8=%d -DKV_FP8=%d", (int)r->dtype, (int)r->dtype);
    const int n = snprintf(
        options, sizeof options,
        "-cl-std=CL1.2 -cl-mad-enable -DDTYPE=%d%s -DHEAD_DIM=%d -DBLOCK_M=%d -DBLOCK_N=%d%s%s%s%s%s%s%s%s",
        (int)flashcl_out_dtype(r), fp8, r->head_dim, p->block_m, p->block_n, define,
        flashcl_variant_is_nv(v->name) ? " -DFLASHCL_NV_PTX" : "",
        !strcmp(v->name, "nv-wgmma") || !strcmp(v->name, "nv-wgmma-fp8") ? " -DFLASHCL_SM90A" : "",
        tma ? " -DUSE_TMA=1" : "", cap, order, extra ? " " : "", extra ? extra : "");
    const flashcl_status fit = flashcl_options_fit(ctx, n, sizeof options);
    return fit != FLASHCL_SUCCESS ? fit : flashcl_get_kernel(ctx, v->file, v->kernel, options, kernel);
}

/* Whether the forward copies its K and V tiles by TMA (cl/flash_fwd_sm90.cl
 * and flash_fwd_sm90_fp8.cl, USE_TMA), and if so their tensor maps in maps[0]
 * and maps[1]: the wgmma kernels where TMA is usable (flashcl_tma_usable) and
 * both encode. The FP8 kernel's second map is over its Vt scratch. */
static int forward_tma_maps(flashcl_context *ctx, const flashcl_attention_desc *r, const flashcl_params *p,
                            flashcl_tensor_map maps[2]) {
    const int fp8 = !strcmp(p->variant, "nv-wgmma-fp8");
    if ((!fp8 && strcmp(p->variant, "nv-wgmma") != 0) || (fp8 && ctx->no_tma_fp8) || !flashcl_tma_usable(ctx))
        return 0;
    if (!fp8)
        return flashcl_tma_encode_pair(&r->k, &r->v, r->batch, r->seqlen_k, r->heads_k, r->head_dim,
                                       (unsigned)p->block_n, maps);
    int keys, rows;
    flashcl_fp8_vt_shape(r, &keys, &rows);
    const uint64_t vt_dims[4] = {(uint64_t)keys, (uint64_t)rows, (uint64_t)r->heads_k, (uint64_t)r->batch},
                   vt_strides[3] = {(uint64_t)keys, (uint64_t)rows * keys, (uint64_t)r->heads_k * rows * keys};
    return flashcl_tma_encode_layout(&maps[0], &r->k, 1, r->batch, r->seqlen_k, r->heads_k, r->head_dim,
                                     (unsigned)p->block_n) &&
           flashcl_tma_encode(&maps[1], 1, vt_dims, vt_strides, (unsigned)rows);
}

/* Builds the kernel for r and sizes its launch. A variant that fails to
 * build falls back to the kernel that always applies, which cannot give a
 * wrong answer; the log says why (the failure is remembered, so once). */
static flashcl_status forward_kernel(flashcl_context *ctx, const flashcl_attention_desc *r,
                                     cl_kernel *kernel, size_t *local, size_t *global, int *tma,
                                     flashcl_tensor_map maps[2], int *fp8_wgmma, cl_kernel *pack) {
    flashcl_params p;
    flashcl_status st = choose_params(ctx, r, &p);
    if (st != FLASHCL_SUCCESS)
        return st;
    /* flashcl_nv_*_eligible keep FP8 off the 16-bit tensor-core kernels and
     * everything else off the FP8 one; a tuning-file or set entry naming one
     * for the wrong class must not reach a kernel that would read the bytes
     * as another type. */
    const int fp8_kernel = !strcmp(p.variant, "nv-wgmma-fp8");
    if (flashcl_dtype_is_fp8(r->dtype) && flashcl_variant_is_nv(p.variant) && !fp8_kernel)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                            "the %s kernel does not take FP8 q, k, v (the portable, cpu and nv-wgmma-fp8 kernels do)",
                            p.variant);
    if (fp8_kernel && !flashcl_nv_wgmma_fp8_eligible(ctx, r))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                            "the nv-wgmma-fp8 kernel does not apply: it needs " FLASHCL_NV_WGMMA_FP8_NEEDS);
    *tma = forward_tma_maps(ctx, r, &p, maps);
    st = build_forward(ctx, r, &p, *tma, kernel);
    if (st == FLASHCL_ERROR_BUILD_FAILED && *tma) {
        /* The same kernel copying through cp.async cannot be wrong either. */
        flashcl_log("the %s kernel with TMA copies did not build, building it without: %.300s", p.variant,
                    flashcl_last_error(ctx));
        if (fp8_kernel)
            ctx->no_tma_fp8 = 1;
        else
            ctx->no_tma = 1;
        *tma = 0;
        flashcl_clear_error(ctx);
        st = build_forward(ctx, r, &p, 0, kernel);
    }
    /* Explicit parameters (flashcl_set_params, FLASHCL_PARAMS) fail here; a
     * database entry falls back (see src/params_forward.c). */
    if (st == FLASHCL_ERROR_BUILD_FAILED && !strcmp(p.variant, "nv-wgmma") && !flashcl_params_explicit(&p)) {
        /* sm_90a needs a driver that takes the retargeted PTX back; without
         * it the mma.sync kernel (or whatever the database picks next) runs. */
        flashcl_log("the nv-wgmma kernel did not build, using the next choice: %.300s", flashcl_last_error(ctx));
        ctx->no_sm90a = 1;
        flashcl_clear_error(ctx);
        if ((st = choose_params(ctx, r, &p)) != FLASHCL_SUCCESS)
            return st;
        *tma = 0;
        st = build_forward(ctx, r, &p, 0, kernel);
    }
    if (st == FLASHCL_ERROR_BUILD_FAILED && flashcl_variant_is_nv(p.variant) && !flashcl_params_explicit(&p)) {
        flashcl_log("the %s kernel did not build, using the portable kernel: %.300s", p.variant,
                    flashcl_last_error(ctx));
        if (fp8_kernel)
            ctx->no_fp8_wgmma = 1; /* not tried again on this context */
        flashcl_fallback_params(ctx, r, &p);
        flashcl_clear_error(ctx);
        *tma = 0;
        st = build_forward(ctx, r, &p, 0, kernel);
    }
    if (st != FLASHCL_SUCCESS)
        return st;
    /* The driver has the last word on what the built kernel needs: where its
     * count exceeds the host's estimate, a database entry gives way to the
     * type default, which is then halved until it fits. */
    size_t wg = (size_t)p.work_group_size;
    char why[200];
    while (!flashcl_kernel_fits(ctx, *kernel, wg, why, sizeof why) && !flashcl_params_explicit(&p)) {
        if (strncmp(p.source, "default: ", 9) != 0) {
            flashcl_log("parameters from %s do not fit the built kernel (%s): using the default", p.source, why);
            flashcl_fallback_params(ctx, r, &p);
        } else if (!flashcl_params_halve(&p)) {
            break;
        }
        *tma = 0;
        if ((st = build_forward(ctx, r, &p, 0, kernel)) != FLASHCL_SUCCESS)
            return st;
        wg = (size_t)p.work_group_size;
    }
    if (why[0])
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "%s", why);
    /* The FP8 warpgroup-MMA kernel reads V as fp8_vt_pack transposes it (unless the caller packed it). */
    *pack = NULL;
    *fp8_wgmma = !strcmp(p.variant, "nv-wgmma-fp8");
    if (*fp8_wgmma && !r->v_packed && (st = flashcl_fp8_vt_pack_kernel(ctx, r->head_dim, pack)) != FLASHCL_SUCCESS)
        return st;
    local[0] = wg;
    local[1] = local[2] = 1;
    global[0] = (size_t)((r->seqlen_q + p.block_m - 1) / p.block_m) * wg;
    global[1] = (size_t)r->heads_q;
    global[2] = (size_t)r->batch;
    return FLASHCL_SUCCESS;
}

/* The nv-wgmma-fp8 forward's Vt and its keys a row, the kernel's arguments from *a on: v as the
 * caller packed it (r->v_packed), or fp8_vt_pack's transpose of v into ctx->fp8_vt (grown to fit
 * beforehand), enqueued after the last forward that read it, *packed its event. A failure is
 * described in ctx's error here. */
static cl_int vt_args(flashcl_context *ctx, const flashcl_attention_desc *r, cl_mem v, cl_kernel pack,
                      cl_kernel kernel, cl_uint *a, cl_event *packed) {
    int keys, rows;
    flashcl_fp8_vt_shape(r, &keys, &rows);
    const cl_mem vt = r->v_packed ? v : ctx->fp8_vt;
    const cl_ulong vt_off = r->v_packed ? r->v.offset : 0;
    const cl_int vt_keys = keys;
    cl_int err = clSetKernelArg(kernel, (*a)++, sizeof(cl_mem), &vt);
    err |= clSetKernelArg(kernel, (*a)++, sizeof(cl_ulong), &vt_off);
    err |= clSetKernelArg(kernel, (*a)++, sizeof(cl_int), &vt_keys);
    if (err == CL_SUCCESS && !r->v_packed)
        err = flashcl_fp8_vt_pack_enqueue(ctx, pack, v, &r->v, r->batch, r->heads_k, r->seqlen_k, ctx->fp8_vt, 0,
                                          keys, ctx->fp8_vt_reader, packed);
    if (err != CL_SUCCESS)
        flashcl_fail(ctx, err, "%s: %s",
                     r->v_packed ? "setting the FP8 forward's Vt arguments"
                                 : "launching the FP8 forward's V transpose (fp8_vt_pack)",
                     flashcl_status_string(err));
    return err;
}

flashcl_status flashcl_attention_forward(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                         cl_mem q, cl_mem k, cl_mem v, cl_mem out, cl_mem lse,
                                         size_t lse_offset, cl_event *event) {
    FLASHCL_LOCKED(ctx);
    const flashcl_status entry = flashcl_device_entry(ctx, "flashcl_attention_forward_host");
    if (entry != FLASHCL_SUCCESS)
        return entry;
    flashcl_attention_desc r;
    flashcl_status st = check_desc(ctx, desc, &r);
    if (st != FLASHCL_SUCCESS)
        return st;
    extents e;
    if (!tensor_extents(&r, lse_offset, &e))
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "strides or offsets overflow size_t");
    if ((st = flashcl_check_buffer(ctx, "q", q, e.q)) || (st = flashcl_check_buffer(ctx, "k", k, e.k)) ||
        (st = flashcl_check_buffer(ctx, "v", v, e.v)) || (st = flashcl_check_buffer(ctx, "out", out, e.out)) ||
        (lse && (st = flashcl_check_buffer(ctx, "lse", lse, e.lse))))
        return st;
    /* Where the driver ends loops early, refuse rather than return part of a sum. */
    const long cap = flashcl_loop_limit_keys(ctx, r.head_dim);
    long row_keys = r.seqlen_k;
    if (r.window_left >= 0 && r.window_right >= 0 && (long)r.window_left + r.window_right + 1 < row_keys)
        row_keys = (long)r.window_left + r.window_right + 1;
    if (cap > 0 && row_keys > cap)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                            "%s ends a kernel's loops after 65535 iterations: rows of %ld keys exceed the %ld one "
                            "work-item may walk at head_dim %d (the paged and varlen calls split the keys)",
                            ctx->info.name, row_keys, cap, r.head_dim);

    const int fp8 = flashcl_dtype_is_fp8(r.dtype);
    if (fp8 && (st = flashcl_fp8_check_scales(ctx, &r)) != FLASHCL_SUCCESS)
        return st;

    cl_kernel kernel, pack;
    size_t local[3], global[3];
    int tma = 0, fp8_wgmma = 0;
    flashcl_tensor_map maps[2];
    if ((st = forward_kernel(ctx, &r, &kernel, local, global, &tma, maps, &fp8_wgmma, &pack)) != FLASHCL_SUCCESS)
        return st;
    if (tma && (st = flashcl_ensure_tma_slots(ctx, global[0] / local[0] * global[1] * global[2])) != FLASHCL_SUCCESS)
        return st;

    /* The context's scratch, grown before anything is enqueued: V transposed
     * for the Hopper FP8 kernel, or a packed V (r.v_packed) on any other
     * kernel, unpacked there first and read as v in the default layout (the
     * Hopper kernel reads a packed V as it is, vt_args). */
    int vt_keys, vt_rows;
    const size_t vt_bytes = pack ? flashcl_fp8_vt_shape(&r, &vt_keys, &vt_rows) : 0;
    if (pack && !vt_bytes) /* past 2147483520 keys (the loop limit refuses them first on NVIDIA) */
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "the FP8 forward's transposed V would not fit its layout");
    if (pack && (st = flashcl_fp8_vt_scratch(ctx, vt_bytes)) != FLASHCL_SUCCESS)
        return st;
    cl_kernel unpack = NULL;
    cl_mem v_arg = v;
    flashcl_layout vl = r.v;
    if (fp8 && r.v_packed && !fp8_wgmma) {
        if ((st = flashcl_fp8_vt_unpack_kernel(ctx, r.head_dim, &unpack)) != FLASHCL_SUCCESS ||
            (st = flashcl_fp8_vt_scratch(ctx, (size_t)r.batch * r.seqlen_k * r.heads_k * r.head_dim)) !=
            FLASHCL_SUCCESS)
            return st;
        v_arg = ctx->fp8_vt;
        memset(&vl, 0, sizeof vl);
        flashcl_default_layout(&vl, r.seqlen_k, r.heads_k, r.head_dim);
    }

    const float log2e = 1.4426950408889634f;
    cl_ulong u[17] = {r.q.offset,  r.q.stride_batch,   r.q.stride_seq, r.q.stride_head,
                      r.k.offset,  r.k.stride_batch,   r.k.stride_seq, r.k.stride_head,
                      vl.offset,   vl.stride_batch,    vl.stride_seq,  vl.stride_head,
                      r.out.offset, r.out.stride_batch, r.out.stride_seq, r.out.stride_head,
                      lse_offset};
    cl_int has_lse = lse != NULL;
    cl_int nq = r.seqlen_q, nk = r.seqlen_k, group = r.heads_q / r.heads_k;
    cl_float q_mul = r.softcap > 0.0f ? r.scale / r.softcap : r.scale * log2e;
    cl_float softcap_log2 = r.softcap > 0.0f ? r.softcap * log2e : 0.0f;
    cl_int wl = r.window_left, wr = r.window_right;
    /* The kernel wants a valid buffer even when LSE is not stored. */
    cl_mem lse_arg = lse ? lse : out;

    cl_int err = CL_SUCCESS;
    cl_uint a = 0;
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &q);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &k);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &v_arg);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &out);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &lse_arg);
    for (int i = 0; i < 17; ++i)
        err |= clSetKernelArg(kernel, a++, sizeof(cl_ulong), &u[i]);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &has_lse);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &nq);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &nk);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &group);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_float), &q_mul);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_float), &softcap_log2);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &wl);
    err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &wr);
    err |= flashcl_set_tma_args(kernel, &a, tma ? maps : NULL, ctx->tma_slots);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, CL_INVALID_KERNEL_ARGS, "clSetKernelArg failed");
    if (!fp8) {
        err = clEnqueueNDRangeKernel(ctx->queue, kernel, 3, NULL, global, local, 0, NULL, event);
        if (err != CL_SUCCESS)
            return flashcl_fail(ctx, err, "launching flash_fwd: %s", flashcl_status_string(err));
        return FLASHCL_SUCCESS;
    }

    /* FP8: the descale factors (FWD_FP8_ARGS in cl/common.cl), uploaded into
     * the context's buffer; the kernel waits for the write and becomes the
     * buffer's last reader, which the next call's write waits for. */
    cl_event waits[2] = {NULL, NULL}, ran = NULL;
    if ((st = flashcl_fp8_upload_scales(ctx, &r, &waits[0])) != FLASHCL_SUCCESS)
        return st;
    size_t counts[3];
    flashcl_fp8_scale_counts(&r, counts);
    const cl_int sc[4] = {r.fp8.per_head != 0, r.fp8.per_head ? r.fp8.block_rows : 0, (cl_int)counts[0],
                          (cl_int)(counts[0] + counts[1])};
    err = clSetKernelArg(kernel, a++, sizeof(cl_mem), &ctx->fp8_scales);
    for (int i = 0; i < 4; ++i)
        err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &sc[i]);
    /* The warpgroup-MMA kernel reads V as Vt, which fp8_vt_pack writes first
     * into the context's scratch (the last forward that read it done), unless
     * the caller packed it; a packed V for the other kernels is unpacked into
     * that scratch the same way. */
    int described = 0; /* the failure already has its message */
    if (err == CL_SUCCESS && fp8_wgmma) {
        err = vt_args(ctx, &r, v, pack, kernel, &a, &waits[1]);
        described = err != CL_SUCCESS;
    } else if (err == CL_SUCCESS && unpack) {
        err = flashcl_fp8_vt_unpack_enqueue(ctx, unpack, &r, v, ctx->fp8_vt, ctx->fp8_vt_reader, &waits[1]);
        if (err != CL_SUCCESS)
            described = 1, flashcl_fail(ctx, err, "unpacking the packed V (fp8_vt_unpack): %s",
                                        flashcl_status_string(err));
    }
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(ctx->queue, kernel, 3, NULL, global, local, waits[1] ? 2 : 1, waits, &ran);
    /* The buffers' last user: the kernel, or where it failed to launch the
     * enqueued work before it (on an out-of-order queue the next call's
     * writes must still land after that). */
    if (ctx->fp8_scales_reader)
        clReleaseEvent(ctx->fp8_scales_reader);
    ctx->fp8_scales_reader = err == CL_SUCCESS ? ran : waits[0];
    if (waits[1]) { /* the transpose (or unpack) ran: it, or the kernel after it, is the scratch's last user */
        if (ctx->fp8_vt_reader)
            clReleaseEvent(ctx->fp8_vt_reader);
        ctx->fp8_vt_reader = err == CL_SUCCESS ? ran : waits[1];
        if (err == CL_SUCCESS) {
            clRetainEvent(ran); /* held as both buffers' reader */
            clReleaseEvent(waits[1]);
        }
    }
    if (err != CL_SUCCESS)
        return described ? err : flashcl_fail(ctx, err, "launching the FP8 forward: %s", flashcl_status_string(err));
    clReleaseEvent(waits[0]);
    if (event) {
        clRetainEvent(ran);
        *event = ran;
    }
    return FLASHCL_SUCCESS;
}

/* ---- host memory convenience layer -------------------------------------------------------- */

flashcl_status flashcl_attention_forward_host(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                              const void *q, const void *k, const void *v, void *out,
                                              float *lse) {
    FLASHCL_LOCKED(ctx);
    if (!ctx)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    flashcl_attention_desc r;
    flashcl_status st = check_desc(ctx, desc, &r);
    if (st != FLASHCL_SUCCESS)
        return st;
    if (!q || !k || !v || !out)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "a tensor pointer is NULL");
    extents e;
    if (!tensor_extents(&r, 0, &e))
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "strides or offsets overflow size_t");
    if (ctx->is_host && flashcl_dtype_is_fp8(r.dtype)) {
        if ((st = flashcl_fp8_check_scales(ctx, &r)) != FLASHCL_SUCCESS)
            return st;
        return flashcl_fp8_host_forward(ctx, &r, q, k, v, out, lse);
    }
    if (ctx->is_host)
        return flashcl_host_forward(ctx, &r, q, k, v, out, lse);

    /* Inputs are copied whole; out is copied in too so the elements its
     * strides skip come back unchanged. */
    cl_int err = CL_SUCCESS;
    cl_mem_flags in = CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR;
    cl_mem bq = clCreateBuffer(ctx->cl_ctx, in, e.q, (void *)q, &err);
    cl_mem bk = bq ? clCreateBuffer(ctx->cl_ctx, in, e.k, (void *)k, &err) : NULL;
    cl_mem bv = bk ? clCreateBuffer(ctx->cl_ctx, in, e.v, (void *)v, &err) : NULL;
    cl_mem bo = bv ? clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, e.out, out, &err)
                   : NULL;
    cl_mem bl = bo && lse ? clCreateBuffer(ctx->cl_ctx, CL_MEM_WRITE_ONLY, e.lse, NULL, &err) : NULL;
    if (!bo || (lse && !bl)) {
        st = flashcl_fail(ctx, err, "allocating device buffers: %s", flashcl_status_string(err));
    } else {
        st = flashcl_attention_forward(ctx, &r, bq, bk, bv, bo, bl, 0, NULL);
        if (st == FLASHCL_SUCCESS) {
            /* Read into a staging copy first so a failed read cannot leave
             * `out` half-written. */
            void *staging = malloc(e.out);
            err = staging ? clEnqueueReadBuffer(ctx->queue, bo, CL_TRUE, 0, e.out, staging, 0, NULL, NULL)
                          : CL_OUT_OF_HOST_MEMORY;
            if (err == CL_SUCCESS && lse)
                err = clEnqueueReadBuffer(ctx->queue, bl, CL_TRUE, 0, e.lse, lse, 0, NULL, NULL);
            if (err == CL_SUCCESS)
                memcpy(out, staging, e.out);
            else
                st = flashcl_fail(ctx, err, "reading results: %s", flashcl_status_string(err));
            free(staging);
        }
    }
    cl_mem all[5] = {bq, bk, bv, bo, bl};
    for (int i = 0; i < 5; ++i)
        if (all[i])
            clReleaseMemObject(all[i]);
    return st;
}
