/* serving_cli.c: `flashcl attention --paged` (dense problem through a shuffled paged cache) and `flashcl bench --decode`. */
#include "serving_cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "flashcl_ref.h"

/* ---- attention --paged -------------------------------------------------------------------- */

static cl_mem make_buffer(flashcl_context *ctx, size_t bytes, const void *host, cl_int *err) {
    cl_mem_flags flags = CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0);
    return clCreateBuffer(flashcl_context_cl_context(ctx), flags, bytes ? bytes : 4, (void *)host, err);
}

flashcl_status cli_paged_forward_host(flashcl_context *ctx, const flashcl_attention_desc *d, int page_size,
                                      const void *q, const void *k, const void *v, void *out, float *lse) {
    if (flashcl_context_is_host(ctx)) {
        cli_errorf("--paged needs an OpenCL device (the KV cache lives in device memory)");
        return FLASHCL_ERROR_UNSUPPORTED;
    }
    if (d->window_left >= 0 || (!d->causal && d->window_right >= 0)) {
        cli_errorf("--paged supports causal or full attention, not --window");
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    }
    const int B = d->batch, Hq = d->heads_q, Hk = d->heads_k, Nq = d->seqlen_q, Nk = d->seqlen_k, D = d->head_dim;
    const size_t es = flashcl_dtype_size(d->dtype);
    const size_t q_bytes = (size_t)B * Nq * Hq * D * es, k_bytes = (size_t)B * Nk * Hk * D * es;
    const size_t lse_n = (size_t)B * Hq * Nq;
    flashcl_kv_cache_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.dtype = d->dtype;
    cd.heads_k = Hk;
    cd.head_dim = D;
    cd.page_size = page_size;
    cd.num_pages = B * ((Nk + page_size - 1) / page_size);
    cd.page_order_seed = 0x5eedf00dull; /* scattered page tables: the point of the exercise */
    flashcl_kv_cache *cache = NULL;
    int *ids = malloc((size_t)B * sizeof(int)), *counts = malloc((size_t)B * sizeof(int));
    int *cu = malloc(((size_t)B + 1) * sizeof(int));
    float *lse_paged = lse ? malloc(lse_n * sizeof(float)) : NULL;
    cl_mem bk = NULL, bv = NULL, bq = NULL, bo = NULL, bl = NULL, scratch = NULL;
    cl_int err = CL_SUCCESS;
    flashcl_status st = FLASHCL_SUCCESS;
    if (!ids || !counts || !cu || (lse && !lse_paged)) {
        st = FLASHCL_ERROR_OUT_OF_HOST_MEMORY;
        goto done;
    }
    if ((st = flashcl_kv_cache_create(ctx, &cd, &cache)))
        goto done;
    cu[0] = 0;
    for (int b = 0; b < B; ++b) {
        if ((st = flashcl_kv_cache_add_sequence(cache, &ids[b])))
            goto done;
        counts[b] = Nk;
        cu[b + 1] = cu[b] + Nq;
    }
    /* k and v are [batch][seqlen_k][heads_k][d]: as new tokens, batch after batch. */
    bk = make_buffer(ctx, k_bytes, k, &err);
    bv = bk ? make_buffer(ctx, k_bytes, v, &err) : NULL;
    bq = bv ? make_buffer(ctx, q_bytes, q, &err) : NULL;
    bo = bq ? make_buffer(ctx, q_bytes, NULL, &err) : NULL;
    bl = bo && lse ? make_buffer(ctx, lse_n * sizeof(float), NULL, &err) : NULL;
    if (!bo || (lse && !bl)) {
        st = err;
        goto done;
    }
    if ((st = flashcl_kv_cache_append(cache, B, ids, counts, bk, NULL, bv, NULL, NULL)))
        goto done;
    flashcl_varlen_desc vd;
    memset(&vd, 0, sizeof vd);
    vd.dtype = d->dtype;
    vd.num_seqs = B;
    vd.heads_q = Hq;
    vd.heads_k = Hk;
    vd.head_dim = D;
    vd.cu_seqlens_q = cu;
    vd.scale = d->scale;
    vd.causal = d->causal;
    vd.softcap = d->softcap;
    size_t scratch_bytes = 0;
    if ((st = flashcl_paged_scratch_size(ctx, &vd, cache, ids, &scratch_bytes)))
        goto done;
    if (scratch_bytes && !(scratch = make_buffer(ctx, scratch_bytes, NULL, &err))) {
        st = err;
        goto done;
    }
    if ((st = flashcl_paged_attention(ctx, &vd, cache, ids, bq, bo, bl, 0, scratch, NULL)))
        goto done;
    cl_command_queue queue = flashcl_context_cl_queue(ctx);
    err = clEnqueueReadBuffer(queue, bo, CL_TRUE, 0, q_bytes, out, 0, NULL, NULL);
    if (err == CL_SUCCESS && lse)
        err = clEnqueueReadBuffer(queue, bl, CL_TRUE, 0, lse_n * sizeof(float), lse_paged, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        st = err;
        goto done;
    }
    /* varlen LSE is [heads_q][total_q]; the forward's is [batch][heads_q][seqlen_q]. */
    for (int b = 0; lse && b < B; ++b)
        for (int h = 0; h < Hq; ++h)
            for (int i = 0; i < Nq; ++i)
                lse[((size_t)b * Hq + h) * Nq + i] = lse_paged[(size_t)h * B * Nq + (size_t)b * Nq + i];
done:
    if (st != FLASHCL_SUCCESS)
        cli_errorf("paged attention: %s (%d): %s", flashcl_status_string(st), st, flashcl_last_error(ctx));
    cl_mem all[6] = {bk, bv, bq, bo, bl, scratch};
    for (int i = 0; i < 6; ++i)
        if (all[i])
            clReleaseMemObject(all[i]);
    flashcl_kv_cache_destroy(cache);
    free(ids), free(counts), free(cu), free(lse_paged);
    return st;
}

/* ---- bench --decode -------------------------------------------------------------------------- */

const char cli_usage_bench_decode[] =
    "usage: flashcl bench --decode [options]\n"
    "\n"
    "Decode throughput of flashcl_paged_attention: one new query per sequence\n"
    "against a paged KV cache of `context` tokens (pages in shuffled order).\n"
    "For each (batch, context): fills K with one constant and V with another, runs\n"
    "once and checks that every output equals V's constant (a sanity check that\n"
    "catches unwritten or non-finite outputs; correctness proper is\n"
    "tests/test_serving), warms up, then times with OpenCL profiling events from\n"
    "a marker before the call to the end of its last kernel (attention plus the\n"
    "split-KV combine). Reports median and min microseconds and GB/s of K+V read\n"
    "(batch * context * heads_k * head_dim * 2 * K/V element size / median; KV_MB\n"
    "is those bytes per step: 1 an element with --kv-dtype e4m3|e5m2), and\n"
    "host_us: the median time the call itself takes on the host (checks, the\n"
    "batch description, enqueueing; the kernels run after it returns), and\n"
    "last_us: the median run time of the call's last kernel alone, from its\n"
    "start to its end (the decode kernels merge their own splits, so there it\n"
    "is all of the device's work; median_us less last_us is the launch cost,\n"
    "and the upload's where the batch description does not go by value).\n"
    "pipe_us: the same calls enqueued back to back, iters of them with no wait\n"
    "between, from a marker before the first to the end of the last, divided by\n"
    "iters: the time a call adds when the host keeps the queue ahead of the\n"
    "device, as a serving loop does and as flash-attn's own benchmarks time\n"
    "(back-to-back calls; \"-\" under --step, whose appends grow the context).\n"
    "keys and wg: the kernel's keys a tile and its work-group size, which with\n"
    "kernel tell its form (decode-mma-heads: HEAD_GROUP, wg / 32 warps).\n"
    "A row whose output fails the check is still timed, marked INVALID, and\n"
    "the command fails (timing-only diagnostic builds run this way).\n"
    "\n"
    "options:\n"
    "  --batch LIST      batch sizes (default 1,4,16,64; 1,4 on a CPU)\n"
    "  --context LIST    context lengths (default 1024,4096,16384,65536,131072;\n"
    "                    1024,4096 on a CPU)\n"
    "  --heads HQ,HK     query and kv heads (default 32,8)\n"
    "  --head-dim D      (default 128)\n"
    "  --page-size P     tokens per page (default 16)\n"
    "  --step            time a whole decode step: the append of one new token per\n"
    "                    sequence (the context grows by one each run), then the attention\n"
    "  --page-order shuffled|sequential\n"
    "                    physical page order (default shuffled: a pool after\n"
    "                    churn; sequential: one sequence's pages in order)\n"
    "  --dtype f16|bf16|f32  queries and outputs, and the appended K/V (default f16)\n"
    "  --kv-dtype f16|bf16|f32|e4m3|e5m2\n"
    "                    the pool's pages (default: --dtype); e4m3/e5m2: FP8 pages,\n"
    "                    one byte an element, static per-head scales (2^-6 here)\n"
    "  --splits N        force the split-KV count (default: flashcl's heuristic)\n"
    "  --iters N         timed runs (default 20; 5 on a CPU)\n"
    "  --warmup N        untimed runs (default 3; 1 on a CPU)\n"
    "  --device SPEC\n";

/* One element of value x in the storage type, as a fill pattern. */
static void pattern(flashcl_dtype dt, float x, unsigned char *buf, size_t *size) {
    if (dt == FLASHCL_FLOAT32) {
        memcpy(buf, &x, 4);
        *size = 4;
        return;
    }
    uint16_t h = dt == FLASHCL_FLOAT16 ? flashcl_ref_float_to_half(x) : flashcl_ref_float_to_bf16(x);
    memcpy(buf, &h, 2);
    *size = 2;
}

/* How bench --decode runs its rows. */
typedef struct decode_opts {
    int page_size, shuffled, splits_forced, iters, warmup;
    int step; /* time an append of one token per sequence, then the attention */
    flashcl_dtype kv_dtype; /* the pool's pages: dtype, or an FP8 format */
} decode_opts;


/* Runs one (batch, context) row; prints it. Returns 0 on success. */
static int decode_row(flashcl_context *ctx, flashcl_dtype dt, int batch, int context, int hq, int hk, int dim,
                      const decode_opts *o) {
    const int page_size = o->page_size, iters = o->iters, warmup = o->warmup;
    const size_t es = flashcl_dtype_size(dt), row = (size_t)hk * dim;
    const int fp8 = o->kv_dtype == FLASHCL_FLOAT8_E4M3 || o->kv_dtype == FLASHCL_FLOAT8_E5M2;
    const size_t kv_es = flashcl_dtype_size(o->kv_dtype); /* what each decode step reads per element */
    /* --step appends a token per sequence per run: room for them, and a
     * source of at least one token per sequence. */
    const int grown = o->step ? warmup + iters : 0, src_rows = context > batch ? context : batch;
    cl_command_queue queue = flashcl_context_cl_queue(ctx);
    flashcl_kv_cache_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.dtype = dt;
    cd.heads_k = hk;
    cd.head_dim = dim;
    cd.page_size = page_size;
    cd.num_pages = batch * ((context + grown + page_size - 1) / page_size);
    cd.page_order_seed = o->shuffled ? 12345 : 0;
    /* FP8 pages: a descale of 2^-6 on every head (amax / 448 for |K|, |V| up
     * to 7, about N(0, 1) activations' range), under which the constants the
     * check uses (0.25, 0.5) are exact bytes. */
    float *scales = fp8 ? malloc((size_t)hk * sizeof(float)) : NULL;
    for (int h = 0; scales && h < hk; ++h)
        scales[h] = 1.0f / 64.0f;
    cd.page_dtype = o->kv_dtype;
    cd.k_scales = cd.v_scales = scales;
    flashcl_kv_cache *cache = NULL;
    cl_mem src_k = NULL, src_v = NULL, bq = NULL, bo = NULL, scratch = NULL;
    int *ids = calloc((size_t)batch, sizeof(int)), *cu = calloc((size_t)batch + 1, sizeof(int));
    void *host = malloc((size_t)batch * hq * dim * es);
    double *times = calloc((size_t)iters, sizeof(double)), *host_us = calloc((size_t)iters, sizeof(double));
    double *last_us = calloc((size_t)iters, sizeof(double));
    int rc = 1, splits = 0, one = context, *ones = calloc((size_t)batch, sizeof(int));
    cl_int err = CL_SUCCESS;
    flashcl_status st = FLASHCL_SUCCESS;
    if (!ids || !cu || !host || !times || !host_us || !last_us || !ones || (fp8 && !scales)) {
        cli_errorf("out of host memory");
        goto done;
    }
    if ((st = flashcl_kv_cache_create(ctx, &cd, &cache)))
        goto fail;
    src_k = make_buffer(ctx, (size_t)src_rows * row * es, NULL, &err);
    src_v = src_k ? make_buffer(ctx, (size_t)src_rows * row * es, NULL, &err) : NULL;
    if (!src_v) {
        st = err;
        goto fail;
    }
    unsigned char pk[4], pv[4];
    size_t ps;
    pattern(dt, 0.25f, pk, &ps);
    pattern(dt, 0.5f, pv, &ps);
    clEnqueueFillBuffer(queue, src_k, pk, ps, 0, (size_t)src_rows * row * es, 0, NULL, NULL);
    clEnqueueFillBuffer(queue, src_v, pv, ps, 0, (size_t)src_rows * row * es, 0, NULL, NULL);
    for (int b = 0; b < batch; ++b) {
        ones[b] = 1;
        if ((st = flashcl_kv_cache_add_sequence(cache, &ids[b])) ||
            (st = flashcl_kv_cache_append(cache, 1, &ids[b], &one, src_k, NULL, src_v, NULL, NULL)))
            goto fail;
        cu[b + 1] = b + 1;
    }
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, 42);
    flashcl_ref_fill_normal(&rng, host, dt, (size_t)batch * hq * dim, 1.0);
    bq = make_buffer(ctx, (size_t)batch * hq * dim * es, host, &err);
    flashcl_ref_poison(host, dt, (size_t)batch * hq * dim);
    bo = bq ? make_buffer(ctx, (size_t)batch * hq * dim * es, host, &err) : NULL;
    if (!bo) {
        st = err;
        goto fail;
    }
    flashcl_varlen_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.num_seqs = batch;
    d.heads_q = hq;
    d.heads_k = hk;
    d.head_dim = dim;
    d.cu_seqlens_q = cu;
    d.causal = 1;
    size_t sb = 0;
    flashcl_params params;
    /* Scratch for the most splits a call may take (under --step the keys
     * grow, and with them the split count may). */
    d.num_splits = o->splits_forced || !o->step ? o->splits_forced : 128; /* num_splits' most (flashcl.h) */
    if ((st = flashcl_paged_scratch_size(ctx, &d, cache, ids, &sb)))
        goto fail;
    d.num_splits = o->splits_forced;
    if ((st = flashcl_serving_params(ctx, &d, cache, ids, &params, &splits)))
        goto fail;
    if (sb && !(scratch = make_buffer(ctx, sb, NULL, &err))) {
        st = err;
        goto fail;
    }
    /* Validate: constant V comes out unchanged whatever the scores. */
    if ((st = flashcl_paged_attention(ctx, &d, cache, ids, bq, bo, NULL, 0, scratch, NULL)))
        goto fail;
    err = clEnqueueReadBuffer(queue, bo, CL_TRUE, 0, (size_t)batch * hq * dim * es, host, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        st = err;
        goto fail;
    }
    /* A wrong output is reported and the row still timed, marked INVALID
     * (and the command fails): timing-only diagnostic builds (paged_decode_nv.cl's DIAG) run here. */
    int invalid = 0;
    for (size_t i = 0; i < (size_t)batch * hq * dim && !invalid; ++i) {
        double x = flashcl_ref_load(host, dt, i);
        if (!(fabs(x - 0.5) <= 1e-3)) {
            cli_errorf("decode B%d ctx %d: output %zu is %g, expected 0.5: INVALID", batch, context, i, x);
            invalid = 1;
        }
    }
    for (int w = 0; w < warmup; ++w)
        if ((o->step && (st = flashcl_kv_cache_append(cache, batch, ids, ones, src_k, NULL, src_v, NULL, NULL))) ||
            (st = flashcl_paged_attention(ctx, &d, cache, ids, bq, bo, NULL, 0, scratch, NULL)))
            goto fail;
    clFinish(queue);
    int wall = 0;
    for (int it = 0; it < iters; ++it) {
        cl_event before = NULL, after = NULL;
        double t0 = cli_now();
        clEnqueueMarkerWithWaitList(queue, 0, NULL, &before);
        double h0 = cli_now();
        if ((o->step && (st = flashcl_kv_cache_append(cache, batch, ids, ones, src_k, NULL, src_v, NULL, NULL))) ||
            (st = flashcl_paged_attention(ctx, &d, cache, ids, bq, bo, NULL, 0, scratch, &after)))
            goto fail;
        host_us[it] = (cli_now() - h0) * 1e6;
        clWaitForEvents(1, &after);
        double t1 = cli_now();
        cl_ulong start = 0, end = 0, run = 0;
        if (!wall && before &&
            clGetEventProfilingInfo(before, CL_PROFILING_COMMAND_END, sizeof start, &start, NULL) == CL_SUCCESS &&
            clGetEventProfilingInfo(after, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL) == CL_SUCCESS &&
            clGetEventProfilingInfo(after, CL_PROFILING_COMMAND_START, sizeof run, &run, NULL) == CL_SUCCESS &&
            end > start && end >= run)
            times[it] = (double)(end - start) * 1e-3, last_us[it] = (double)(end - run) * 1e-3;
        else
            wall = 1, times[it] = (t1 - t0) * 1e6; /* no profiling: wall clock */
        if (before)
            clReleaseEvent(before);
        clReleaseEvent(after);
    }
    /* Back to back: iters calls, one wait (not under --step, whose appends
     * grow the context from call to call). */
    double pipe_us = -1.0;
    if (!wall && !o->step) {
        cl_event before = NULL, after = NULL;
        clFinish(queue);
        int ok = clEnqueueMarkerWithWaitList(queue, 0, NULL, &before) == CL_SUCCESS;
        for (int it = 0; ok && it < iters; ++it) {
            if (after)
                clReleaseEvent(after), after = NULL;
            st = flashcl_paged_attention(ctx, &d, cache, ids, bq, bo, NULL, 0, scratch, &after);
            ok = st == FLASHCL_SUCCESS;
        }
        cl_ulong start = 0, end = 0;
        if (ok && clWaitForEvents(1, &after) == CL_SUCCESS &&
            clGetEventProfilingInfo(before, CL_PROFILING_COMMAND_END, sizeof start, &start, NULL) == CL_SUCCESS &&
            clGetEventProfilingInfo(after, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL) == CL_SUCCESS &&
            end > start)
            pipe_us = (double)(end - start) * 1e-3 / iters;
        if (before)
            clReleaseEvent(before);
        if (after)
            clReleaseEvent(after);
        if (st)
            goto fail;
    }
    qsort(times, (size_t)iters, sizeof(double), cli_compare_doubles);
    qsort(host_us, (size_t)iters, sizeof(double), cli_compare_doubles);
    qsort(last_us, (size_t)iters, sizeof(double), cli_compare_doubles);
    double median = times[iters / 2], kv_bytes = (double)batch * context * (double)row * 2.0 * (double)kv_es;
    char last[16] = "-", pipe[16] = "-"; /* no profiling: no kernel time */
    if (!wall)
        snprintf(last, sizeof last, "%.1f", last_us[iters / 2]);
    if (pipe_us > 0)
        snprintf(pipe, sizeof pipe, "%.1f", pipe_us);
    printf("%6d %8d %7d %10.1f %10.1f %9.1f %9.1f %8.1f %8s %8s %5d %5d  %-10s%s%s\n", batch, context, splits, median,
           times[0], kv_bytes * 1e-6, kv_bytes / median * 1e-3, host_us[iters / 2], last, pipe, params.block_n,
           params.work_group_size, params.variant,
           wall ? "  (wall clock)" : "", invalid ? "  INVALID" : "");
    fflush(stdout);
    rc = invalid;
    goto done;
fail:
    cli_errorf("decode B%d ctx %d: %s (%d): %s", batch, context, flashcl_status_string(st), st,
               flashcl_last_error(ctx));
done:
    if (src_k)
        clReleaseMemObject(src_k);
    if (src_v)
        clReleaseMemObject(src_v);
    if (bq)
        clReleaseMemObject(bq);
    if (bo)
        clReleaseMemObject(bo);
    if (scratch)
        clReleaseMemObject(scratch);
    flashcl_kv_cache_destroy(cache);
    free(ids), free(cu), free(host), free(times), free(host_us), free(last_us), free(ones), free(scales);
    return rc;
}

int cli_bench_decode(int argc, char **argv) {
    long batches[16] = {1, 4, 16, 64}, contexts[16] = {1024, 4096, 16384, 65536, 131072}, heads[2] = {32, 8};
    int nb = 0, nc = 0, nh = 2;
    long dim = 128, page = 16, splits = 0, iters = -1, warmup = -1;
    const char *device = NULL, *value;
    flashcl_dtype dt = FLASHCL_FLOAT16, kv_dt = (flashcl_dtype)-1;
    int shuffled = 1, step = 0;
    for (int i = 2; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--decode"))
            continue;
        if (!strcmp(argv[i], "--step")) {
            step = 1;
            continue;
        }
        if (cli_help(argv[i], cli_usage_bench_decode)) {
            return CLI_EXIT_OK;
        }
#define LIST(name, arr, n, lo, hi)                                                                  \
    if ((r = cli_take_value(argc, argv, &i, name, &value)) != 0) {                                  \
        if (r < 0 || cli_parse_long_list(value, lo, hi, arr, 16, &n) != 0 || n < 1) {               \
            cli_errorf("%s wants a list of integers in [%ld, %ld], not '%s'", name, (long)(lo),       \
                       (long)(hi), r < 0 ? "" : value);                                             \
            return CLI_EXIT_USAGE;                                                                  \
        }                                                                                           \
        continue;                                                                                   \
    }
#define ONE(name, var, lo, hi)                                                                      \
    if ((r = cli_take_value(argc, argv, &i, name, &value)) != 0) {                                  \
        if (r < 0 || cli_parse_long(value, lo, hi, &var) != 0) {                                    \
            cli_errorf("%s wants an integer in [%ld, %ld], not '%s'", name, (long)(lo), (long)(hi),  \
                       r < 0 ? "" : value);                                                         \
            return CLI_EXIT_USAGE;                                                                  \
        }                                                                                           \
        continue;                                                                                   \
    }
        LIST("--batch", batches, nb, 1, 4096)
        LIST("--context", contexts, nc, 1, 1 << 24)
        LIST("--heads", heads, nh, 1, 1024)
        ONE("--head-dim", dim, 1, 256)
        ONE("--page-size", page, 1, 256)
        ONE("--splits", splits, 0, 128)
        ONE("--iters", iters, 1, 100000)
        ONE("--warmup", warmup, 0, 100000)
#undef LIST
#undef ONE
        if ((r = cli_take_value(argc, argv, &i, "--device", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            device = value;
            continue;
        }
        if ((r = cli_take_value(argc, argv, &i, "--dtype", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_dtype(value, &dt) != 0) {
                cli_errorf("--dtype wants f16, bf16 or f32, not '%s'", value);
                return CLI_EXIT_USAGE;
            }
            continue;
        }
        if ((r = cli_take_value(argc, argv, &i, "--kv-dtype", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_dtype_fp8(value, &kv_dt) != 0) {
                cli_errorf("--kv-dtype wants f16, bf16, f32, e4m3 or e5m2, not '%s'", value);
                return CLI_EXIT_USAGE;
            }
            continue;
        }
        if ((r = cli_take_value(argc, argv, &i, "--page-order", &value)) != 0) {
            if (r < 0 || (strcmp(value, "shuffled") && strcmp(value, "sequential"))) {
                cli_errorf("--page-order wants shuffled or sequential, not '%s'", r < 0 ? "" : value);
                return CLI_EXIT_USAGE;
            }
            shuffled = !strcmp(value, "shuffled");
            continue;
        }
        return cli_unknown_option(cli_usage_bench_decode, argv[i]);
    }
    if (nh != 2 || heads[0] % heads[1] != 0) {
        cli_errorf("--heads wants HQ,HK with HK dividing HQ");
        return CLI_EXIT_USAGE;
    }
    flashcl_context *ctx = cli_open_device(device, "bench --decode needs an OpenCL device");
    if (!ctx)
        return CLI_EXIT_FAIL;
    cl_device_type type = 0;
    clGetDeviceInfo(flashcl_context_cl_device(ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL);
    const int cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
    if (!nb)
        nb = cpu ? 2 : 4;
    if (!nc) {
        nc = cpu ? 2 : 5;
        if (cpu)
            contexts[0] = 1024, contexts[1] = 4096;
    }
    if (iters < 0)
        iters = cpu ? 5 : 20;
    if (warmup < 0)
        warmup = cpu ? 1 : 3;
    if ((int)kv_dt < 0)
        kv_dt = dt;
    if (kv_dt != dt && kv_dt != FLASHCL_FLOAT8_E4M3 && kv_dt != FLASHCL_FLOAT8_E5M2) {
        cli_errorf("--kv-dtype wants --dtype's type or e4m3/e5m2 (FP8 pages), not %s with --dtype %s",
                   cli_dtype_name(kv_dt), cli_dtype_name(dt));
        flashcl_context_destroy(ctx);
        return CLI_EXIT_USAGE;
    }
    const decode_opts opts = {(int)page, shuffled, (int)splits, (int)iters, (int)warmup, step, kv_dt};
    char pages[80] = "";
    if (kv_dt != dt)
        snprintf(pages, sizeof pages, ", K/V pages %s (1 byte an element, scales 2^-6)", cli_dtype_name(kv_dt));
    printf("decode on %s: %s%s, heads %ld/%ld, head_dim %ld, page %ld (%s), causal, one query per sequence%s\n",
           flashcl_context_device_name(ctx), cli_dtype_name(dt), pages, heads[0], heads[1], dim, page,
           shuffled ? "shuffled" : "sequential",
           step ? "; timed: an append of one token per sequence, then the attention" : "");
    printf("%6s %8s %7s %10s %10s %9s %9s %8s %8s %8s %5s %5s  %-10s\n", "batch", "context", "splits", "median_us",
           "min_us", "KV_MB", "KV_GB/s", "host_us", "last_us", "pipe_us", "keys", "wg", "kernel");
    int failed = 0;
    for (int b = 0; b < nb; ++b)
        for (int c = 0; c < nc; ++c)
            failed |= decode_row(ctx, dt, (int)batches[b], (int)contexts[c], (int)heads[0], (int)heads[1], (int)dim,
                                 &opts);
    flashcl_context_destroy(ctx);
    return failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
