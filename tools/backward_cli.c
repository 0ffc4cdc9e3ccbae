/* backward_cli.c: the CLI's backward pieces: `flashcl attention --backward` and `flashcl bench --backward`. */
#define _POSIX_C_SOURCE 200809L
#include "backward_cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "flashcl_ref.h"
#include "npy.h"

const char cli_usage_attention_backward[] =
    "usage: flashcl attention --backward --q Q.npy --k K.npy --v V.npy --dout DO.npy\n"
    "                         --dq DQ.npy --dk DK.npy --dv DV.npy [options]\n"
    "\n"
    "Gradients of attention: given q, k, v and dout = dL/dout (float32 or float16\n"
    ".npy, shapes as for 'flashcl attention', dout like q), writes dq (like q) and\n"
    "dk, dv (like k). The forward runs first for out and its LSE, unless both come\n"
    "from files. The three outputs appear only together and only once complete.\n"
    "\n"
    "options:\n"
    "  --o O.npy --lse LSE.npy   the forward's out and lse (both or neither)\n"
    "  --deterministic   bitwise reproducible dq (a separate dq pass, no atomics)\n"
    "  --causal, --window L,R, --softcap C, --scale S, --device SPEC: as for the\n"
    "                    forward (they must match the forward that made --o/--lse)\n";

const char cli_usage_bench_backward[] =
    "usage: flashcl bench --backward [options]\n"
    "\n"
    "Times flashcl_attention_backward (all its kernels: D_i pre-pass, dK/dV, dQ)\n"
    "after a forward for out and LSE: validates against the double reference when\n"
    "B*Hq*Nq*Nk*D <= 2^27, warms up, then times with OpenCL profiling events\n"
    "(from a marker before the first kernel to the end of the last; wall clock on\n"
    "the host path). TFLOP/s counts 2.5x the forward's 4*B*Hq*Nq*Nk*D (halved\n"
    "when causal), as flash-attn does.\n"
    "\n"
    "options:\n"
    "  --shape B,H,N,D        a shape (repeatable); also B,Hq,Hk,Nq,Nk,D\n"
    "                         (default 1,8,512,64 and 1,8,1024,64 on a CPU,\n"
    "                         1,8,2048,64 and 1,8,4096,64 elsewhere)\n"
    "  --dtype f16|bf16|f32   storage type (default f16)\n"
    "  --causal / --no-causal only one of the two (default: both)\n"
    "  --deterministic        the deterministic mode\n"
    "  --iters N, --warmup N  timed and untimed runs (default 5 and 1)\n"
    "  --memory               also report peak host memory (ru_maxrss), the device\n"
    "                         bytes of all tensors and scratch, and the bytes of one\n"
    "                         B*H*Nq*Nk float score matrix\n"
    "  --json                 print one JSON object instead of the table: device,\n"
    "                         timing, and a row per shape and mask (batch, heads_q,\n"
    "                         heads_k, seqlen_q, seqlen_k, head_dim, dtype, causal,\n"
    "                         deterministic, validated, median_ms, min_ms, tflops,\n"
    "                         wall_ms: per call of --iters calls enqueued back to\n"
    "                         back, error; the --memory figures in bytes); errors also\n"
    "                         go to stderr\n"
    "  --device SPEC\n";

/* ---- attention --backward ------------------------------------------------------------- */

static int read_npy(const char *path, npy_array *a, int ndim) {
    char err[512];
    if (npy_read(path, a, err, sizeof err) != 0) {
        cli_errorf("%s: %s", path, err);
        return -1;
    }
    if (a->ndim != ndim) {
        cli_errorf("%s: %d dimensions, expected %d", path, a->ndim, ndim);
        return -1;
    }
    for (int i = 0; i < ndim; ++i)
        if (a->shape[i] == 0 || a->shape[i] > INT_MAX) {
            cli_errorf("%s: dimension %d is %zu", path, i, a->shape[i]);
            return -1;
        }
    return 0;
}

static int same_shape(const npy_array *a, const npy_array *b, const char *path, const char *what) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0])) {
        char sa[128], sb[128];
        npy_format_shape(a->shape, a->ndim, sa, sizeof sa);
        npy_format_shape(b->shape, b->ndim, sb, sizeof sb);
        cli_errorf("%s: %s %s does not match %s's %s %s", path, npy_dtype_name(a->dtype), sa, what,
                   npy_dtype_name(b->dtype), sb);
        return -1;
    }
    return 0;
}

int cli_attention_backward(int argc, char **argv) {
    const char *path[10] = {0}; /* q k v dout dq dk dv o lse, device */
    static const char *const names[9] = {"--q", "--k", "--v", "--dout", "--dq", "--dk", "--dv", "--o", "--lse"};
    int causal = 0, wl = -1, wr = -1, deterministic = 0, rc = CLI_EXIT_FAIL;
    double softcap = 0.0, scale = 0.0;
    const char *value;
    const cli_flag flags[3] = {
        {"--causal", &causal}, {"--deterministic", &deterministic}, {"--backward", NULL}};
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int r;
        if (cli_help(arg, cli_usage_attention_backward)) {
            return CLI_EXIT_OK;
        }
        if ((r = cli_take_any(argc, argv, &i, names, 9, path)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            continue;
        }
        if ((r = cli_take_value(argc, argv, &i, "--device", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            path[9] = value;
        } else if ((r = cli_take_value(argc, argv, &i, "--window", &value)) != 0) {
            long w[2];
            int n = 0;
            if (r < 0 || cli_parse_long_list(value, -(long)INT_MAX, INT_MAX, w, 2, &n) != 0 || n != 2) {
                cli_errorf("--window wants L,R (integers)");
                return CLI_EXIT_USAGE;
            }
            wl = w[0] < 0 ? -1 : (int)w[0];
            wr = w[1] < 0 ? -1 : (int)w[1];
        } else if ((r = cli_take_softcap_scale(NULL, argc, argv, &i, &softcap, &scale)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if (!cli_take_flag(arg, flags, 3)) {
            return cli_unknown_option(cli_usage_attention_backward, arg);
        }
    }
    for (int n = 0; n < 7; ++n)
        if (!path[n]) {
            cli_errorf("attention --backward needs --q, --k, --v, --dout, --dq, --dk and --dv");
            return CLI_EXIT_USAGE;
        }
    if (!path[7] != !path[8]) {
        cli_errorf("--o and --lse come together (the forward's out and lse), or neither");
        return CLI_EXIT_USAGE;
    }
    /* Outputs (dq dk dv) against every other path by file identity, not by
     * name: "--dq ./q.npy" or a link to q.npy would truncate an input. The
     * order puts the inputs first: q k v dout o lse, then dq dk dv. */
    {
        const char *const order_names[9] = {names[0], names[1], names[2], names[3], names[7], names[8],
                                            names[4], names[5], names[6]};
        const char *const order_paths[9] = {path[0], path[1], path[2], path[3], path[7], path[8],
                                            path[4], path[5], path[6]};
        if (cli_check_outputs(order_names, order_paths, 6, 9) != 0)
            return CLI_EXIT_USAGE;
    }

    npy_array in[6]; /* q k v dout o lse */
    memset(in, 0, sizeof in);
    flashcl_context *ctx = NULL;
    void *grad[3] = {NULL, NULL, NULL}, *out = NULL;
    float *lse = NULL;
    char *tmp[3] = {NULL, NULL, NULL};
    int renamed = 0;
    if (read_npy(path[0], &in[0], 4) || read_npy(path[1], &in[1], 4) || read_npy(path[2], &in[2], 4) ||
        read_npy(path[3], &in[3], 4) || same_shape(&in[3], &in[0], path[3], "q") ||
        same_shape(&in[2], &in[1], path[2], "k"))
        goto done;
    if (in[1].dtype != in[0].dtype || in[1].shape[0] != in[0].shape[0] || in[1].shape[3] != in[0].shape[3] ||
        in[0].shape[2] % in[1].shape[2] != 0) {
        cli_errorf("%s: dtype, batch or head_dim differ from q's, or heads_k does not divide heads_q", path[1]);
        goto done;
    }
    flashcl_attention_desc d = cli_npy_desc(&in[0], &in[1], causal, wl, wr, softcap, scale);
    flashcl_status st = flashcl_attention_desc_resolve(&d);
    if (st != FLASHCL_SUCCESS) {
        cli_errorf("invalid attention problem: %s", flashcl_status_string(st));
        goto done;
    }
    const size_t rows = (size_t)d.batch * d.heads_q * d.seqlen_q, es = flashcl_dtype_size(d.dtype);
    if (path[7]) {
        if (read_npy(path[7], &in[4], 4) || same_shape(&in[4], &in[0], path[7], "q") ||
            read_npy(path[8], &in[5], 3))
            goto done;
        if (in[5].dtype != NPY_FLOAT32 || in[5].shape[0] != (size_t)d.batch || in[5].shape[1] != (size_t)d.heads_q ||
            in[5].shape[2] != (size_t)d.seqlen_q) {
            cli_errorf("%s: expected float32 (batch, heads_q, seqlen_q) = (%d,%d,%d)", path[8], d.batch, d.heads_q,
                       d.seqlen_q);
            goto done;
        }
    }
    for (int t = 0; t < 3; ++t)
        grad[t] = malloc(in[t].count * es);
    out = path[7] ? in[4].data : malloc(in[0].count * es);
    lse = path[7] ? in[5].data : malloc(rows * sizeof(float));
    if (!grad[0] || !grad[1] || !grad[2] || !out || !lse) {
        cli_errorf("out of memory");
        goto done;
    }
    st = flashcl_context_create(&ctx, path[9]);
    if (st != FLASHCL_SUCCESS) {
        cli_errorf("cannot open a device: %s: %s", flashcl_status_string(st), flashcl_last_error(ctx));
        goto done;
    }
    double t0 = cli_now();
    if (!path[7] &&
        (st = flashcl_attention_forward_host(ctx, &d, in[0].data, in[1].data, in[2].data, out, lse)) != FLASHCL_SUCCESS) {
        cli_errorf("forward failed: %s: %s", flashcl_status_string(st), flashcl_last_error(ctx));
        goto done;
    }
    double t1 = cli_now();
    flashcl_backward_options o;
    memset(&o, 0, sizeof o);
    o.deterministic = deterministic;
    st = flashcl_attention_backward_host(ctx, &d, &o, in[0].data, in[1].data, in[2].data, out, in[3].data, lse,
                                         grad[0], grad[1], grad[2]);
    double t2 = cli_now();
    if (st != FLASHCL_SUCCESS) {
        cli_errorf("backward failed: %s: %s", flashcl_status_string(st), flashcl_last_error(ctx));
        goto done;
    }
    /* All three to temporary files, then renamed; a failure removes any
     * already renamed, so the outputs appear together or not at all. */
    for (int t = 0; t < 3; ++t) {
        char err[512];
        if (npy_write_temp(path[4 + t], in[0].dtype, in[t].shape, 4, grad[t], &tmp[t], err, sizeof err) != 0) {
            cli_errorf("%s: %s", path[4 + t], err);
            goto done;
        }
    }
    for (; renamed < 3; ++renamed)
        if (rename(tmp[renamed], path[4 + renamed]) != 0) {
            cli_errorf("%s: cannot move the finished file into place: %s", path[4 + renamed], strerror(errno));
            goto done;
        }
    printf("%s %s %s: forward %.1f ms%s, backward %.1f ms on %s\n", path[4], path[5], path[6], (t1 - t0) * 1e3,
           path[7] ? " (from files)" : "", (t2 - t1) * 1e3, flashcl_context_device_name(ctx));
    rc = CLI_EXIT_OK;
done:
    for (int t = 0; t < 3; ++t) {
        if (tmp[t] && t >= renamed)
            unlink(tmp[t]);
        if (t < renamed && rc != CLI_EXIT_OK)
            unlink(path[4 + t]);
        free(tmp[t]);
        free(grad[t]);
    }
    if (!path[7]) {
        free(out);
        free(lse);
    }
    for (int t = 0; t < 6; ++t)
        npy_free(&in[t]);
    flashcl_context_destroy(ctx);
    return rc;
}

/* ---- bench --backward ----------------------------------------------------------------- */

typedef struct bshape {
    long b, hq, hk, nq, nk, d;
} bshape;

/* What one row measured, for the table or the JSON document. */
typedef struct brow {
    int validated;                    /* 1 valid, 0 INVALID, -1 not validated */
    int timed;                        /* median_ms, min_ms and tflops are set  */
    double median_ms, min_ms, tflops;
    double wall_ms;                   /* per call, iters calls back to back; 0: not measured */
    size_t peak_rss, device_bytes, scratch_bytes, naive_bytes;
    char error[640];                  /* "forward error: ...", empty when the row ran */
} brow;

static const char *validated_name(int validated) {
    return validated < 0 ? "not validated" : validated ? "valid" : "INVALID";
}

/* One row: fills *row; returns 0, or 1 when validation or a call failed. */
static int bench_row(flashcl_context *ctx, const bshape *s, flashcl_dtype dt, int causal, int deterministic,
                     int iters, int warmup, brow *row) {
    flashcl_attention_desc d;
    memset(&d, 0, sizeof d);
    memset(row, 0, sizeof *row);
    row->validated = -1;
    d.dtype = dt;
    d.batch = (int)s->b, d.heads_q = (int)s->hq, d.heads_k = (int)s->hk;
    d.seqlen_q = (int)s->nq, d.seqlen_k = (int)s->nk, d.head_dim = (int)s->d;
    d.causal = causal;
    const size_t es = flashcl_dtype_size(dt);
    const size_t nq = (size_t)s->b * s->nq * s->hq * s->d, nk = (size_t)s->b * s->nk * s->hk * s->d;
    const size_t rows = (size_t)s->b * s->hq * s->nq;
    const double macs = (double)s->b * s->hq * s->nq * s->nk * s->d;
    const double flops = 2.5 * 4.0 * macs * (causal ? 0.5 : 1.0);
    flashcl_backward_options o;
    memset(&o, 0, sizeof o);
    o.deterministic = deterministic;
    const int host = flashcl_context_is_host(ctx);
    size_t scratch = 0;
    flashcl_status st = flashcl_attention_backward_scratch_size(ctx, &d, &o, &scratch);
    void *h[5] = {malloc(nq * es), malloc(nk * es), malloc(nk * es), malloc(nq * es), malloc(nq * es)}; /* q k v out dout */
    void *g[3] = {malloc(nq * es), malloc(nk * es), malloc(nk * es)};
    float *lse = malloc(rows * sizeof(float));
    double *times = malloc((size_t)iters * sizeof(double));
    cl_mem b[10] = {0}; /* q k v out dout lse dq dk dv scratch */
    int failed = 0;
    for (int i = 0; i < 5; ++i)
        failed |= !h[i];
    failed |= !g[0] || !g[1] || !g[2] || !lse || !times || st != FLASHCL_SUCCESS;
    if (failed) {
        snprintf(row->error, sizeof row->error, "error: %s", st ? flashcl_last_error(ctx) : "out of host memory");
        goto done;
    }
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, 12345);
    for (int i = 0; i < 5; ++i)
        if (i != 3)
            flashcl_ref_fill_normal(&rng, h[i], dt, i == 1 || i == 2 ? nk : nq, 1.0);
    if (host) {
        st = flashcl_attention_forward_host(ctx, &d, h[0], h[1], h[2], h[3], lse);
    } else {
        cl_context cl = flashcl_context_cl_context(ctx);
        const size_t sizes[10] = {nq * es, nk * es, nk * es, nq * es, nq * es, rows * 4, nq * es, nk * es, nk * es, scratch};
        cl_int err = CL_SUCCESS;
        for (int i = 0; i < 10 && err == CL_SUCCESS; ++i)
            b[i] = clCreateBuffer(cl, CL_MEM_READ_WRITE | (i < 5 && i != 3 ? CL_MEM_COPY_HOST_PTR : 0), sizes[i],
                                  i < 5 && i != 3 ? h[i] : NULL, &err);
        st = err != CL_SUCCESS ? err : flashcl_attention_forward(ctx, &d, b[0], b[1], b[2], b[3], b[5], 0, NULL);
        if (st == FLASHCL_SUCCESS)
            st = clEnqueueReadBuffer(flashcl_context_cl_queue(ctx), b[3], CL_TRUE, 0, nq * es, h[3], 0, NULL, NULL);
    }
    if (st != FLASHCL_SUCCESS) {
        snprintf(row->error, sizeof row->error, "forward error: %s %s", flashcl_status_string(st),
                 flashcl_last_error(ctx));
        failed = 1;
        goto done;
    }
    for (int it = -warmup - 1; it < iters; ++it) {
        double t0 = cli_now(), ms;
        if (host) {
            st = flashcl_attention_backward_host(ctx, &d, &o, h[0], h[1], h[2], h[3], h[4], lse, g[0], g[1], g[2]);
            ms = (cli_now() - t0) * 1e3;
        } else {
            cl_command_queue queue = flashcl_context_cl_queue(ctx);
            cl_event start = NULL, end = NULL;
            clEnqueueMarkerWithWaitList(queue, 0, NULL, &start);
            st = flashcl_attention_backward(ctx, &d, &o, b[0], b[1], b[2], b[3], b[4], b[5], 0, b[6], b[7], b[8],
                                            b[9], &end);
            clFinish(queue);
            ms = (cli_now() - t0) * 1e3;
            cl_ulong t_start = 0, t_end = 0;
            if (st == FLASHCL_SUCCESS &&
                clGetEventProfilingInfo(start, CL_PROFILING_COMMAND_END, sizeof t_start, &t_start, NULL) == CL_SUCCESS &&
                clGetEventProfilingInfo(end, CL_PROFILING_COMMAND_END, sizeof t_end, &t_end, NULL) == CL_SUCCESS &&
                t_end > t_start)
                ms = (double)(t_end - t_start) * 1e-6;
            if (start)
                clReleaseEvent(start);
            if (end)
                clReleaseEvent(end);
        }
        if (st != FLASHCL_SUCCESS) {
            snprintf(row->error, sizeof row->error, "backward error: %s %s", flashcl_status_string(st),
                     flashcl_last_error(ctx));
            failed = 1;
            goto done;
        }
        if (it == -warmup - 1) { /* the first run is validated, not timed */
            if (!host)
                for (int t = 0; t < 3; ++t)
                    clEnqueueReadBuffer(flashcl_context_cl_queue(ctx), b[6 + t], CL_TRUE, 0, t ? nk * es : nq * es,
                                        g[t], 0, NULL, NULL);
            if (macs <= (double)(1 << 27)) {
                flashcl_attention_desc r = d;
                flashcl_attention_desc_resolve(&r);
                row->validated = flashcl_ref_check_backward(&r, NULL, h[0], h[1], h[2], h[4], g[0], g[1], g[2], 1, NULL);
                failed |= !row->validated;
            }
        } else if (it >= 0) {
            times[it] = ms;
        }
    }
    if (!host) { /* wall clock: the calls enqueued back to back, one wait at the end */
        const double t0 = cli_now();
        for (int it = 0; it < iters && st == FLASHCL_SUCCESS; ++it)
            st = flashcl_attention_backward(ctx, &d, &o, b[0], b[1], b[2], b[3], b[4], b[5], 0, b[6], b[7], b[8],
                                            b[9], NULL);
        if (st == FLASHCL_SUCCESS)
            st = clFinish(flashcl_context_cl_queue(ctx));
        if (st != FLASHCL_SUCCESS) {
            snprintf(row->error, sizeof row->error, "backward error (back-to-back calls): %s %s",
                     flashcl_status_string(st), flashcl_last_error(ctx));
            failed = 1;
            goto done;
        }
        row->wall_ms = (cli_now() - t0) * 1e3 / iters;
    }
    qsort(times, (size_t)iters, sizeof *times, cli_compare_doubles);
    row->timed = 1;
    row->median_ms = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
    row->min_ms = times[0];
    row->tflops = flops / (row->median_ms * 1e-3) / 1e12;
    /* q, out, dout, dq and k, v, dk, dv; lse; scratch */
    row->peak_rss = cli_peak_rss_bytes();
    row->scratch_bytes = scratch;
    row->device_bytes = (4 * nq + 4 * nk) * es + rows * 4 + scratch;
    row->naive_bytes = (size_t)s->b * s->hq * s->nq * s->nk * 4;
done:
    for (int i = 0; i < 10; ++i)
        if (b[i])
            clReleaseMemObject(b[i]);
    for (int i = 0; i < 5; ++i)
        free(h[i]);
    for (int i = 0; i < 3; ++i)
        free(g[i]);
    free(lse);
    free(times);
    return failed;
}

static void print_row_text(const brow *row, const bshape *s, int causal, int deterministic, int memory) {
    char label[96];
    snprintf(label, sizeof label, "%ld,%ld,%ld,%ld,%ld,%ld %s%s", s->b, s->hq, s->hk, s->nq, s->nk, s->d,
             causal ? "causal" : "full", deterministic ? " det" : "");
    if (row->error[0]) {
        printf("%-40s %s\n", label, row->error);
        return;
    }
    printf("%-40s %10.2f %10.2f %9.4f  %s", label, row->median_ms, row->min_ms, row->tflops,
           validated_name(row->validated));
    if (memory)
        printf("  peak RSS %.1f MiB, tensors+scratch %.1f MiB (scratch %.1f), one score matrix %.1f MiB",
               (double)row->peak_rss / 1048576.0, (double)row->device_bytes / 1048576.0,
               (double)row->scratch_bytes / 1048576.0, (double)row->naive_bytes / 1048576.0);
    printf("\n");
}


/* One element of "rows", keys as `flashcl bench --json` names them where they mean the same. */
static void print_row_json(const brow *row, const bshape *s, flashcl_dtype dt, int causal, int deterministic,
                           int iters, int memory, int first) {
    printf("%s\n  {\"dtype\": \"%s\", \"batch\": %ld, \"heads_q\": %ld, \"heads_k\": %ld, \"seqlen_q\": %ld, "
           "\"seqlen_k\": %ld, \"head_dim\": %ld, \"causal\": %s, \"deterministic\": %s, \"validated\": \"%s\", "
           "\"iters\": %d, \"median_ms\": ",
           first ? "" : ",", cli_dtype_name(dt), s->b, s->hq, s->hk, s->nq, s->nk, s->d, causal ? "true" : "false",
           deterministic ? "true" : "false", validated_name(row->validated), row->timed ? iters : 0);
    cli_json_number(stdout, row->median_ms, row->timed);
    printf(", \"min_ms\": ");
    cli_json_number(stdout, row->min_ms, row->timed);
    printf(", \"tflops\": ");
    cli_json_number(stdout, row->tflops, row->timed);
    printf(", \"wall_ms\": "); /* the host path's median_ms is already wall clock */
    cli_json_number(stdout, row->wall_ms, row->wall_ms > 0);
    if (memory)
        printf(", \"peak_rss_bytes\": %zu, \"device_bytes\": %zu, \"scratch_bytes\": %zu, \"naive_scores_bytes\": %zu",
               row->peak_rss, row->device_bytes, row->scratch_bytes, row->naive_bytes);
    printf(", \"error\": ");
    cli_json_string_or_null(stdout, row->error);
    printf("}");
    fflush(stdout);
}

int cli_bench_backward(int argc, char **argv) {
    bshape shapes[32];
    int nshapes = 0, causal_mask = 3, deterministic = 0, memory = 0, json = 0;
    long iters = 5, warmup = 1;
    flashcl_dtype dt = FLASHCL_FLOAT16;
    const char *device = NULL, *value;
    const cli_flag flags[4] = {{"--deterministic", &deterministic},
                               {"--memory", &memory},
                               {"--json", &json},
                               {"--backward", NULL}};
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int r;
        if (cli_help(arg, cli_usage_bench_backward)) {
            return CLI_EXIT_OK;
        } else if ((r = cli_take_value(argc, argv, &i, "--shape", &value)) != 0) {
            long v[6];
            int n = 0;
            if (r < 0 || nshapes == 32 || cli_parse_long_list(value, 1, INT_MAX, v, 6, &n) != 0 || (n != 4 && n != 6)) {
                cli_errorf("--shape wants B,H,N,D or B,Hq,Hk,Nq,Nk,D (at most 32 shapes)");
                return CLI_EXIT_USAGE;
            }
            shapes[nshapes++] = n == 4 ? (bshape){v[0], v[1], v[1], v[2], v[2], v[3]}
                                       : (bshape){v[0], v[1], v[2], v[3], v[4], v[5]};
        } else if ((r = cli_take_value(argc, argv, &i, "--dtype", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_dtype(value, &dt) != 0) {
                cli_errorf("--dtype wants f16, bf16 or f32, not '%s'", value);
                return CLI_EXIT_USAGE;
            }
        } else if ((r = cli_take_long(NULL, argc, argv, &i, "--iters", 1, 100000, "an integer >= 1",
                                      &iters)) != 0 ||
                   (r = cli_take_long(NULL, argc, argv, &i, "--warmup", 0, 100000,
                                      "an integer >= 0", &warmup)) != 0 ||
                   (r = cli_take_value(argc, argv, &i, "--device", &device)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if (!strcmp(arg, "--causal")) {
            causal_mask &= 2;
        } else if (!strcmp(arg, "--no-causal")) {
            causal_mask &= 1;
        } else if (!cli_take_flag(arg, flags, 4)) {
            return cli_unknown_option(cli_usage_bench_backward, arg);
        }
    }
    if (!causal_mask) {
        cli_errorf("--causal and --no-causal leave nothing to run");
        return CLI_EXIT_USAGE;
    }
    flashcl_context *ctx = NULL;
    flashcl_status st = flashcl_context_create(&ctx, device);
    if (st != FLASHCL_SUCCESS) {
        cli_errorf("cannot open a device: %s: %s", flashcl_status_string(st), flashcl_last_error(ctx));
        return CLI_EXIT_FAIL;
    }
    if (!nshapes) {
        cl_device_id dev = flashcl_context_cl_device(ctx);
        cl_device_type type = CL_DEVICE_TYPE_CPU;
        if (dev)
            clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
        const long n0 = (type & CL_DEVICE_TYPE_CPU) ? 512 : 2048;
        shapes[nshapes++] = (bshape){1, 8, 8, n0, n0, 64};
        shapes[nshapes++] = (bshape){1, 8, 8, 2 * n0, 2 * n0, 64};
    }
    if (json) {
        cli_json_bench_open(ctx, "flashcl bench --backward", cli_dtype_name(dt), iters, warmup);
    } else {
        printf("device: %s\n", flashcl_context_device_name(ctx));
        printf("%-40s %10s %10s %9s  %s\n", "shape B,Hq,Hk,Nq,Nk,D mask", "median ms", "min ms", "TFLOP/s", "check");
    }
    int failed = 0, nrows = 0;
    for (int s = 0; s < nshapes; ++s)
        for (int c = 0; c < 2; ++c)
            if (causal_mask & (1 << c)) {
                brow row;
                failed |= bench_row(ctx, &shapes[s], dt, c, deterministic, (int)iters, (int)warmup, &row);
                if (!json) {
                    print_row_text(&row, &shapes[s], c, deterministic, memory);
                    continue;
                }
                if (row.error[0]) /* in the row too; stderr says it as it happens */
                    cli_errorf("bench --backward %ld,%ld,%ld,%ld,%ld,%ld %s: %s", shapes[s].b, shapes[s].hq,
                               shapes[s].hk, shapes[s].nq, shapes[s].nk, shapes[s].d, c ? "causal" : "full",
                               row.error);
                print_row_json(&row, &shapes[s], dt, c, deterministic, (int)iters, memory, nrows++ == 0);
            }
    if (json)
        printf("\n]}\n");
    flashcl_context_destroy(ctx);
    return failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
