/* bench_cli.c: `flashcl bench`: validate, then time the forward kernel; sweeps, JSON, CSV and a
 * plot. */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backward_cli.h"
#include "bench_cli.h"
#include "cp_cli.h"
#include "cli_util.h"
#include "flashcl.h"
#include "flashcl_ref.h"
#include "serving_cli.h"
#include "svg_plot.h"

/* Problems up to this many multiply-adds (B*Hq*Nq*Nk*D) are validated against
 * the double-precision reference in `bench`, and the reference is timed:
 * about a second or two of the naive loops on one core. */
#define BENCH_REF_MAX_MACS 2147483648.0

const char usage_bench[] =
    "usage: flashcl bench [options]\n"
    "\n"
    "For each shape: runs once and validates against the reference (when\n"
    "B*Hq*Nq*Nk*D <= 2^31), warms up, then times the kernel with OpenCL profiling\n"
    "events (wall clock on the host path). Reports median and min ms, TFLOP/s\n"
    "(4*B*Hq*Nq*Nk*D / median, halved when causal) and the naive reference's time.\n"
    "Default shapes: 1,8,1024,64  1,8,2048,64  1,8,4096,64  2,16,1024,128 (smaller\n"
    "on a CPU device), non-causal and causal.\n"
    "\n"
    "options:\n"
    "  --shape B,H,N,D        a shape (repeatable); also B,Hq,Hk,Nq,Nk,D\n"
    "  --dtype LIST           storage types, f16,bf16,f32,e4m3,e5m2 (default f16); FP8\n"
    "                         (e4m3, e5m2): random N(0,1) inputs quantized once per\n"
    "                         tensor (untimed, flashcl_fp8_quantize_host), out float16\n"
    "  --v-packed             FP8 only: pack V once (flashcl_fp8_pack_v, untimed) and\n"
    "                         time calls with desc.v_packed = 1, which skip the Hopper\n"
    "                         FP8 kernel's per-call V transpose; rows say 'v-packed'\n"
    "  --causal               causal only (default: both)\n"
    "  --no-causal            non-causal only\n"
    "  --seqlen LIST          sweep: seqlen_q = seqlen_k values, e.g. 512,1024,2048\n"
    "  --head-dim LIST        sweep: head dims (default 64 when sweeping)\n"
    "  --batch LIST           sweep: batch sizes (default 1 when sweeping)\n"
    "  --heads LIST           sweep: heads, heads_q = heads_k (default 8 when sweeping)\n"
    "                         (the sweep is every combination, added to --shape rows;\n"
    "                         default seqlens 512..4096, 256..1024 on a CPU)\n"
    "  --iters N              timed runs (default 20; 5 on a CPU)\n"
    "  --warmup N             untimed runs before timing (default 3; 1 on a CPU)\n"
    "  --long                 add longer default shapes\n"
    "  --memory               also report peak host memory (ru_maxrss), the device\n"
    "                         bytes of q,k,v,out,lse, and the B*H*Nq*Nk*4 bytes a naive\n"
    "                         score matrix would take (fewer runs by default)\n"
    "  --json                 print one JSON object instead of the table; its wall_ms\n"
    "                         is the wall clock per call of --iters calls enqueued\n"
    "                         back to back (one wait at the end)\n"
    "  --csv                  print CSV (one header line, one line per row) instead\n"
    "  --plot FILE.svg        also draw TFLOP/s against seqlen, one line per\n"
    "                         configuration (dtype, B, H, D, mask)\n"
    "GB/s counts the bytes of q, k, v, out and lse once (the minimum traffic).\n"
    "  --decode               decode throughput over a paged KV cache instead\n"
    "                         (its own options: flashcl bench --decode --help)\n"
    "  --backward             time the backward pass instead\n"
    "                         (its own options: flashcl bench --backward --help)\n"
    "  --context-parallel     under mpirun: ring attention across ranks instead\n"
    "                         (its own options: flashcl bench --context-parallel --help)\n"
    "  --device SPEC\n";

typedef struct bench_shape {
    int batch, heads_q, heads_k, seqlen_q, seqlen_k, head_dim;
} bench_shape;

typedef struct bench_row {
    bench_shape s;
    flashcl_dtype dtype;
    int causal;
    int v_packed;  /* ran on V packed once (--v-packed, FP8) */
    int validated; /* 1 passed, 0 failed, -1 not run (too large, or an error first) */
    double max_err, tolerance;
    int iters;
    double median_ms, min_ms, tflops; /* < 0 when not timed */
    double wall_ms;                   /* per call, iters calls back to back; < 0 when not timed */
    double ref_ms;                    /* < 0 when the reference was not run */
    size_t device_bytes, naive_bytes, peak_rss;
    flashcl_params params; /* what the row ran with; params.source points into params_source */
    char params_variant[32], params_source[160]; /* empty when unknown */
    char error[1024];                            /* empty when the row ran */
} bench_row;

typedef struct bench_options {
    flashcl_dtype dtype;
    int iters, warmup, memory, json;
    int csv;          /* CSV instead of the table */
    int v_packed;     /* --v-packed: FP8 runs read V packed by flashcl_fp8_pack_v */
    const char *plot; /* SVG path, or NULL */
} bench_options;

static void row_error(bench_row *row, const flashcl_context *ctx, const char *what,
                      flashcl_status status) {
    const char *detail = ctx != NULL ? flashcl_last_error(ctx) : "";
    snprintf(row->error, sizeof row->error, "%s: %s (%d)%s%s", what, flashcl_status_string(status),
             status, detail && *detail ? ": " : "", detail ? detail : "");
}

/* Validates `out`/`lse` (host copies of the first run) against the reference;
 * a kernel that rounds P to e4m3 (nv-wgmma-fp8) against the baseline that
 * rounds it so too. */
static void bench_validate(bench_row *row, const flashcl_attention_desc *desc, const void *q,
                           const void *k, const void *v, const void *out, const float *lse) {
    flashcl_ref_report report;
    memset(&report, 0, sizeof report);
    const int p_e4m3 = !strcmp(row->params_variant, "nv-wgmma-fp8");
    row->validated = (p_e4m3 ? flashcl_ref_check_forward_p8 : flashcl_ref_check_forward)(desc, q, k, v, out, lse, 0,
                                                                                          &report)
                         ? 1
                         : 0;
    row->max_err = report.max_err;
    row->tolerance = report.tolerance;
    if (!row->validated)
        snprintf(row->error, sizeof row->error,
                 "validation failed: max_err %.3g > tolerance %.3g (%zu mismatches); not timed",
                 report.max_err, report.tolerance, report.mismatches);
}

static void finish_times(bench_row *row, double *times, int n, double flops) {
    qsort(times, (size_t)n, sizeof *times, cli_compare_doubles);
    row->iters = n;
    row->min_ms = times[0];
    row->median_ms = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    row->tflops = row->median_ms > 0 ? flops / (row->median_ms * 1e-3) / 1e12 : -1.0;
}

/* Host copies of out and lse, poisoned so that elements a kernel skips fail validation;
 * -1 with the row's error set when memory runs out (the caller frees what was allocated). */
static int alloc_outputs(bench_row *row, flashcl_dtype dtype, size_t nq, size_t nlse, void **out,
                         float **lse) {
    *out = malloc(nq * flashcl_dtype_size(dtype));
    *lse = malloc(nlse * sizeof **lse);
    if (*out == NULL || *lse == NULL) {
        snprintf(row->error, sizeof row->error, "out of host memory for the outputs");
        return -1;
    }
    flashcl_ref_poison(*out, dtype, nq);
    flashcl_ref_poison(*lse, FLASHCL_FLOAT32, nlse);
    return 0;
}

/* FP8 inputs: n N(0,1) values quantized per tensor into x (the format's
 * bytes), the descale factor in *descale; 0 on success. */
static int fp8_inputs(flashcl_ref_rng *rng, flashcl_dtype format, const bench_shape *s, int seqlen, int heads,
                      unsigned char *x, float *descale) {
    flashcl_fp8_quant_desc qd;
    memset(&qd, 0, sizeof qd);
    qd.format = format;
    qd.src_dtype = FLASHCL_FLOAT32;
    qd.batch = s->batch, qd.seqlen = seqlen, qd.heads = heads, qd.head_dim = s->head_dim;
    const size_t n = (size_t)s->batch * (size_t)seqlen * (size_t)heads * (size_t)s->head_dim;
    float *src = malloc(n * sizeof *src);
    if (src == NULL)
        return -1;
    flashcl_ref_fill_normal(rng, src, FLASHCL_FLOAT32, n, 1.0);
    const flashcl_status st = flashcl_fp8_quantize_host(&qd, src, x, descale);
    free(src);
    return st == FLASHCL_SUCCESS ? 0 : -1;
}

/* Runs one shape: validate, warm up, time; fills row. */
static void run_bench_row(flashcl_context *ctx, const bench_options *opt, bench_row *row) {
    const bench_shape *s = &row->s;
    flashcl_attention_desc desc = cli_make_desc(opt->dtype, s->batch, s->heads_q, s->heads_k,
                                                s->seqlen_q, s->seqlen_k, s->head_dim);
    /* FP8: one-byte q, k, v with per-tensor factors; out float16. */
    const int fp8 = opt->dtype == FLASHCL_FLOAT8_E4M3 || opt->dtype == FLASHCL_FLOAT8_E5M2;
    const flashcl_dtype out_dtype = fp8 ? FLASHCL_FLOAT16 : opt->dtype;
    float descales[3] = {1.0f, 1.0f, 1.0f};
    if (fp8) {
        desc.out_dtype = out_dtype;
        desc.fp8.q_descale = &descales[0];
        desc.fp8.k_descale = &descales[1];
        desc.fp8.v_descale = &descales[2];
    }
    size_t esz = flashcl_dtype_size(opt->dtype), osz = flashcl_dtype_size(out_dtype), nq, nk, nlse, naive;
    double macs = (double)s->batch * s->heads_q * s->seqlen_q * s->seqlen_k * s->head_dim;
    double flops = 4.0 * macs * (row->causal ? 0.5 : 1.0);
    int feasible = macs <= BENCH_REF_MAX_MACS, is_host = flashcl_context_is_host(ctx);
    void *q = NULL, *k = NULL, *v = NULL, *out = NULL;
    float *lse = NULL;
    double *times = NULL;
    /* --v-packed: V packed once, untimed (bufs[5] on a device, vpack on the host path); the timed
     * calls take `run`, desc with v_packed set, while validation and the reference read desc. */
    const int packed = fp8 && opt->v_packed;
    flashcl_attention_desc run;
    unsigned char *vpack = NULL;
    cl_mem bufs[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    size_t sizes[6] = {0, 0, 0, 0, 0, 0};
    flashcl_ref_rng rng;
    flashcl_status status;

    row->dtype = opt->dtype;
    row->v_packed = packed;
    row->validated = -1;
    row->median_ms = row->min_ms = row->tflops = row->ref_ms = row->wall_ms = -1.0;
    row->error[0] = '\0';
    desc.causal = row->causal;
    status = flashcl_attention_desc_resolve(&desc);
    if (status != FLASHCL_SUCCESS) {
        row_error(row, NULL, "descriptor rejected", status);
        return;
    }
    run = desc;
    if (packed) {
        run.v_packed = 1;
        run.v.offset = 0;
        sizes[5] = flashcl_fp8_packed_v_bytes(&desc);
        if (sizes[5] == 0) {
            snprintf(row->error, sizeof row->error,
                     "flashcl_fp8_packed_v_bytes: 0 bytes for this shape");
            return;
        }
        status = flashcl_attention_desc_resolve(&run);
        if (status != FLASHCL_SUCCESS) {
            row_error(row, NULL, "descriptor with v_packed rejected", status);
            return;
        }
    }
    /* The parameters this shape runs with and where they came from (tuned, built-in, default):
     * the strings are the context's, so the row keeps copies. */
    memset(&row->params, 0, sizeof row->params);
    row->params_variant[0] = row->params_source[0] = '\0';
    if (flashcl_attention_params(ctx, &run, &row->params) == FLASHCL_SUCCESS) {
        snprintf(row->params_variant, sizeof row->params_variant, "%s",
                 row->params.variant ? row->params.variant : "?");
        snprintf(row->params_source, sizeof row->params_source, "%s",
                 row->params.source ? row->params.source : "?");
    }
    row->params.variant = row->params_variant;
    row->params.source = row->params_source;
    if (cli_count4((size_t)s->batch, (size_t)s->seqlen_q, (size_t)s->heads_q, (size_t)s->head_dim,
                   &nq) != 0 ||
        cli_count4((size_t)s->batch, (size_t)s->seqlen_k, (size_t)s->heads_k, (size_t)s->head_dim,
                   &nk) != 0 ||
        cli_count4((size_t)s->batch, (size_t)s->heads_q, (size_t)s->seqlen_q, 1, &nlse) != 0 ||
        nq > SIZE_MAX / 8 || nk > SIZE_MAX / 8) {
        snprintf(row->error, sizeof row->error, "shape too large for this machine");
        return;
    }
    row->device_bytes = (nq + 2 * nk) * esz + nq * osz + nlse * sizeof(float);
    row->naive_bytes = cli_count4((size_t)s->batch, (size_t)s->heads_q, (size_t)s->seqlen_q,
                                  (size_t)s->seqlen_k, &naive) == 0 &&
                               naive <= SIZE_MAX / 4
                           ? naive * 4
                           : SIZE_MAX;

    /* On a device, the buffers come first: a shape the device cannot hold
     * becomes an error row before any host memory is spent on it. */
    if (!is_host) {
        cl_context clctx = flashcl_context_cl_context(ctx);
        cl_ulong max_alloc = 0;
        static const char *const names[6] = {"q", "k", "v", "out", "lse", "packed v"};
        cl_int err = CL_SUCCESS;
        sizes[0] = nq * esz;
        sizes[3] = nq * osz;
        sizes[1] = sizes[2] = nk * esz;
        sizes[4] = nlse * sizeof(float);
        clGetDeviceInfo(flashcl_context_cl_device(ctx), CL_DEVICE_MAX_MEM_ALLOC_SIZE,
                        sizeof max_alloc, &max_alloc, NULL);
        for (int b = 0; b < (packed ? 6 : 5); b++) {
            if (max_alloc != 0 && sizes[b] > max_alloc) {
                snprintf(row->error, sizeof row->error,
                         "%s needs %zu bytes, over the device's largest allocation (%llu)",
                         names[b], sizes[b], (unsigned long long)max_alloc);
                goto done;
            }
            /* the packed V (5) is written by flashcl_fp8_pack_v */
            bufs[b] = clCreateBuffer(clctx, b < 3 ? CL_MEM_READ_ONLY : CL_MEM_READ_WRITE, sizes[b],
                                     NULL, &err);
            if (err != CL_SUCCESS) {
                snprintf(row->error, sizeof row->error,
                         "clCreateBuffer(%s, %zu bytes) failed: %s (%d)", names[b], sizes[b],
                         flashcl_status_string(err), err);
                goto done;
            }
        }
    }

    times = malloc((size_t)opt->iters * sizeof *times);
    q = malloc(nq * esz);
    k = malloc(nk * esz);
    v = malloc(nk * esz);
    if (times == NULL || q == NULL || k == NULL || v == NULL) {
        snprintf(row->error, sizeof row->error, "out of host memory for the inputs");
        goto done;
    }
    flashcl_ref_rng_seed(&rng, 0x5EED0000u + (uint64_t)s->seqlen_q * 131u + (uint64_t)s->head_dim);
    if (fp8) {
        if (fp8_inputs(&rng, opt->dtype, s, s->seqlen_q, s->heads_q, q, &descales[0]) != 0 ||
            fp8_inputs(&rng, opt->dtype, s, s->seqlen_k, s->heads_k, k, &descales[1]) != 0 ||
            fp8_inputs(&rng, opt->dtype, s, s->seqlen_k, s->heads_k, v, &descales[2]) != 0) {
            snprintf(row->error, sizeof row->error, "quantizing the inputs to FP8: %s", flashcl_last_error(NULL));
            goto done;
        }
    } else {
        flashcl_ref_fill_normal(&rng, q, opt->dtype, nq, 1.0);
        flashcl_ref_fill_normal(&rng, k, opt->dtype, nk, 1.0);
        flashcl_ref_fill_normal(&rng, v, opt->dtype, nk, 1.0);
    }

    if (is_host) {
        /* No OpenCL: the blocking host entry point, timed by wall clock. */
        if (alloc_outputs(row, out_dtype, nq, nlse, &out, &lse) != 0)
            goto done;
        if (packed) {
            vpack = malloc(sizes[5]);
            if (vpack == NULL) {
                snprintf(row->error, sizeof row->error, "out of host memory for the packed V");
                goto done;
            }
            status = flashcl_fp8_pack_v_host(&desc, v, vpack);
            if (status != FLASHCL_SUCCESS) {
                snprintf(row->error, sizeof row->error, "packing V (flashcl_fp8_pack_v_host): %s",
                         flashcl_last_error(NULL));
                goto done;
            }
        }
        const void *vrun = packed ? (const void *)vpack : v;
        status = flashcl_attention_forward_host(ctx, &run, q, k, vrun, out, lse);
        if (status != FLASHCL_SUCCESS) {
            row_error(row, ctx, "forward failed", status);
            goto done;
        }
        if (feasible) {
            bench_validate(row, &desc, q, k, v, out, lse);
            if (!row->validated)
                goto done;
        }
        for (int it = 0; it < opt->warmup + opt->iters; it++) {
            double t0 = cli_now();
            status = flashcl_attention_forward_host(ctx, &run, q, k, vrun, out, lse);
            if (status != FLASHCL_SUCCESS) {
                row_error(row, ctx, "forward failed", status);
                goto done;
            }
            if (it >= opt->warmup)
                times[it - opt->warmup] = (cli_now() - t0) * 1e3;
        }
    } else {
        cl_command_queue queue = flashcl_context_cl_queue(ctx);
        void *const init[3] = {q, k, v};
        cl_event event = NULL;
        cl_int err = CL_SUCCESS;

        for (int b = 0; b < 3 && err == CL_SUCCESS; b++)
            err =
                clEnqueueWriteBuffer(queue, bufs[b], CL_TRUE, 0, sizes[b], init[b], 0, NULL, NULL);
        if (err != CL_SUCCESS) {
            row_error(row, NULL, "uploading the inputs", err);
            goto done;
        }
        if (packed) { /* once, before anything is timed, and waited for */
            status = flashcl_fp8_pack_v(ctx, &desc, bufs[2], bufs[5], 0, &event);
            if (status != FLASHCL_SUCCESS) {
                row_error(row, ctx, "packing V (flashcl_fp8_pack_v)", status);
                goto done;
            }
            err = event != NULL ? clWaitForEvents(1, &event) : clFinish(queue);
            if (event != NULL)
                clReleaseEvent(event);
            event = NULL;
            if (err != CL_SUCCESS) {
                row_error(row, NULL, "waiting for the V pack", err);
                goto done;
            }
        }
        cl_mem vrun = packed ? bufs[5] : bufs[2];
        /* Poisoned outputs, so that a kernel that skips elements fails validation. */
        if (feasible) {
            if (alloc_outputs(row, out_dtype, nq, nlse, &out, &lse) != 0)
                goto done;
            err = clEnqueueWriteBuffer(queue, bufs[3], CL_TRUE, 0, sizes[3], out, 0, NULL, NULL);
            if (err == CL_SUCCESS)
                err =
                    clEnqueueWriteBuffer(queue, bufs[4], CL_TRUE, 0, sizes[4], lse, 0, NULL, NULL);
            if (err != CL_SUCCESS) {
                row_error(row, NULL, "poisoning the outputs", err);
                goto done;
            }
        }
        if (!feasible) {
            /* The inputs live on the device now; drop the host copies so the
             * peak RSS reflects what the benchmark needs. */
            free(q);
            free(k);
            free(v);
            q = k = v = NULL;
        }
        status = flashcl_attention_forward(ctx, &run, bufs[0], bufs[1], vrun, bufs[3], bufs[4], 0,
                                           &event);
        if (status != FLASHCL_SUCCESS) {
            row_error(row, ctx, "forward failed", status);
            goto done;
        }
        if (event != NULL)
            clReleaseEvent(event);
        err = clFinish(queue);
        if (err != CL_SUCCESS) {
            row_error(row, NULL, "clFinish after the first run", err);
            goto done;
        }
        if (feasible) {
            err = clEnqueueReadBuffer(queue, bufs[3], CL_TRUE, 0, sizes[3], out, 0, NULL, NULL);
            if (err == CL_SUCCESS)
                err = clEnqueueReadBuffer(queue, bufs[4], CL_TRUE, 0, sizes[4], lse, 0, NULL, NULL);
            if (err != CL_SUCCESS) {
                row_error(row, NULL, "reading the output back", err);
                goto done;
            }
            bench_validate(row, &desc, q, k, v, out, lse);
            if (!row->validated)
                goto done;
        }
        for (int it = 0; it < opt->warmup + opt->iters; it++) {
            cl_ulong start = 0, end = 0;
            event = NULL;
            status = flashcl_attention_forward(ctx, &run, bufs[0], bufs[1], vrun, bufs[3], bufs[4],
                                               0, &event);
            if (status != FLASHCL_SUCCESS) {
                row_error(row, ctx, "forward failed", status);
                goto done;
            }
            if (event == NULL) {
                snprintf(row->error, sizeof row->error, "the library returned no kernel event");
                goto done;
            }
            err = clWaitForEvents(1, &event);
            if (err == CL_SUCCESS && it >= opt->warmup) {
                err = clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_START, sizeof start,
                                              &start, NULL);
                if (err == CL_SUCCESS)
                    err = clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_END, sizeof end, &end,
                                                  NULL);
                times[it - opt->warmup] = (double)(end - start) * 1e-6;
            }
            clReleaseEvent(event);
            if (err != CL_SUCCESS) {
                row_error(row, NULL, "timing the kernel event", err);
                goto done;
            }
        }
        /* Wall clock: the same calls enqueued back to back, one wait at the end
         * (what an application sees, launch and queue overheads included). */
        const double t0 = cli_now();
        for (int it = 0; it < opt->iters && status == FLASHCL_SUCCESS; it++)
            status = flashcl_attention_forward(ctx, &run, bufs[0], bufs[1], vrun, bufs[3], bufs[4],
                                               0, NULL);
        err = clFinish(queue);
        if (status != FLASHCL_SUCCESS || err != CL_SUCCESS) {
            row_error(row, ctx, "forward failed (back-to-back calls)", status != FLASHCL_SUCCESS ? status : err);
            goto done;
        }
        if (opt->iters > 0)
            row->wall_ms = (cli_now() - t0) * 1e3 / opt->iters;
    }
    if (opt->iters > 0)
        finish_times(row, times, opt->iters, flops);

    if (feasible && q != NULL) {
        /* The naive reference, once: what the kernel is being compared to. */
        double *ref_out = malloc(nq * sizeof *ref_out);
        if (ref_out != NULL) {
            double t0 = cli_now();
            flashcl_ref_attention_forward(&desc, q, k, v, ref_out, NULL, NULL, NULL);
            row->ref_ms = (cli_now() - t0) * 1e3;
            free(ref_out);
        }
    }
done:
    for (int b = 0; b < 6; b++)
        if (bufs[b] != NULL)
            clReleaseMemObject(bufs[b]);
    row->peak_rss = cli_peak_rss_bytes();
    free(vpack);
    free(times);
    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
}

static double mib(size_t bytes) {
    return (double)bytes / (1024.0 * 1024.0);
}

/* Bytes of q, k, v, out and lse over the median time: the minimum traffic. */
static double bench_gbps(const bench_row *row) {
    return row->median_ms > 0 ? (double)row->device_bytes / (row->median_ms * 1e-3) / 1e9 : -1.0;
}

static void print_bench_header(const bench_options *opt) {
    printf("%-5s %3s %4s %4s %7s %7s %4s  %-7s %-5s %10s %10s %8s %8s %10s %8s", "dtype", "B", "Hq",
           "Hk", "Nq", "Nk", "D", "mask", "check", "median_ms", "min_ms", "TFLOP/s", "GB/s",
           "ref_ms", "speedup");
    if (opt->memory)
        printf(" %12s %11s %12s", "peak_rss_MiB", "device_MiB", "naive_S_MiB");
    printf("  params (source)%s\n", opt->v_packed ? "  [v-packed: V packed once, untimed]" : "");
}

static void print_bench_row(const bench_options *opt, const bench_row *row) {
    const bench_shape *s = &row->s;
    printf("%-5s %3d %4d %4d %7d %7d %4d  %-7s %-5s ", cli_dtype_name(row->dtype), s->batch,
           s->heads_q, s->heads_k, s->seqlen_q, s->seqlen_k, s->head_dim,
           row->causal ? "causal" : "none",
           row->validated > 0    ? "pass"
           : row->validated == 0 ? "FAIL"
                                 : "-");
    if (row->median_ms >= 0)
        printf("%10.3f %10.3f %8.3g %8.3g ", row->median_ms, row->min_ms, row->tflops,
               bench_gbps(row));
    else
        printf("%10s %10s %8s %8s ", "-", "-", "-", "-");
    if (row->ref_ms >= 0 && row->median_ms > 0) {
        double speedup = row->ref_ms / row->median_ms;
        printf("%10.1f %7.*fx", row->ref_ms, speedup < 10 ? 2 : 0, speedup);
    } else
        printf("%10s %8s", "-", "-");
    if (opt->memory)
        printf(" %12.1f %11.1f %12.1f", mib(row->peak_rss), mib(row->device_bytes),
               mib(row->naive_bytes));
    if (row->params_variant[0])
        printf("  %s %dx%d wg %d (%s)", row->params_variant, row->params.block_m,
               row->params.block_n, row->params.work_group_size, row->params_source);
    else
        printf("  -");
    if (row->v_packed)
        printf("  v-packed");
    printf("\n");
    if (row->error[0])
        printf("      error: %s\n", row->error);
    fflush(stdout);
}

static void print_bench_json(flashcl_context *ctx, const bench_options *opt, const bench_row *rows,
                             int count) {
    cli_json_bench_open(ctx, "flashcl bench", cli_dtype_name(opt->dtype), opt->iters, opt->warmup);
    for (int i = 0; i < count; i++) {
        const bench_row *r = &rows[i];
        printf("%s\n  {\"dtype\": \"%s\", \"batch\": %d, \"heads_q\": %d, \"heads_k\": %d, "
               "\"seqlen_q\": %d, \"seqlen_k\": %d, \"head_dim\": %d, \"causal\": %s, "
               "\"validated\": \"%s\", \"max_err\": ",
               i ? "," : "", cli_dtype_name(r->dtype), r->s.batch, r->s.heads_q, r->s.heads_k,
               r->s.seqlen_q, r->s.seqlen_k, r->s.head_dim, r->causal ? "true" : "false",
               r->validated > 0    ? "pass"
               : r->validated == 0 ? "fail"
                                   : "skipped");
        cli_json_number(stdout, r->max_err, r->validated >= 0);
        printf(", \"tolerance\": ");
        cli_json_number(stdout, r->tolerance, r->validated >= 0);
        printf(", \"iters\": %d, \"median_ms\": ", r->median_ms >= 0 ? r->iters : 0);
        cli_json_number(stdout, r->median_ms, r->median_ms >= 0);
        printf(", \"min_ms\": ");
        cli_json_number(stdout, r->min_ms, r->median_ms >= 0);
        printf(", \"tflops\": ");
        cli_json_number(stdout, r->tflops, r->tflops >= 0);
        printf(", \"wall_ms\": "); /* the host path's median_ms is already wall clock */
        cli_json_number(stdout, r->wall_ms, r->wall_ms >= 0);
        printf(", \"gbps\": ");
        cli_json_number(stdout, bench_gbps(r), r->median_ms > 0);
        printf(", \"ref_ms\": ");
        cli_json_number(stdout, r->ref_ms, r->ref_ms >= 0);
        printf(", \"speedup\": ");
        cli_json_number(stdout, r->median_ms > 0 ? r->ref_ms / r->median_ms : 0.0,
                        r->ref_ms >= 0 && r->median_ms > 0);
        printf(", \"peak_rss_bytes\": %zu, \"device_bytes\": %zu, \"naive_scores_bytes\": %zu, "
               "\"params\": ",
               r->peak_rss, r->device_bytes, r->naive_bytes);
        if (r->params_variant[0]) {
            printf("{\"variant\": ");
            cli_json_string(stdout, r->params_variant);
            printf(", \"block_m\": %d, \"block_n\": %d, \"threads_per_row\": %d, "
                   "\"work_group_size\": %d, "
                   "\"source\": ",
                   r->params.block_m, r->params.block_n, r->params.threads_per_row,
                   r->params.work_group_size);
            cli_json_string(stdout, r->params_source);
            printf("}");
        } else
            fputs("null", stdout);
        printf(", \"v_packed\": %s, \"error\": ", r->v_packed ? "true" : "false");
        cli_json_string_or_null(stdout, r->error);
        printf("}");
    }
    printf("\n]}\n");
}

/* CSV: the JSON row keys as columns; empty cells where JSON has null. */
static void print_bench_csv(const bench_row *rows, int count) {
    printf("dtype,batch,heads_q,heads_k,seqlen_q,seqlen_k,head_dim,causal,validated,max_err,"
           "tolerance,iters,median_ms,min_ms,tflops,gbps,ref_ms,error,v_packed\n");
    for (int i = 0; i < count; i++) {
        const bench_row *r = &rows[i];
        const bench_shape *s = &r->s;
        printf("%s,%d,%d,%d,%d,%d,%d,%d,%s,", cli_dtype_name(r->dtype), s->batch, s->heads_q,
               s->heads_k, s->seqlen_q, s->seqlen_k, s->head_dim, r->causal,
               r->validated > 0    ? "pass"
               : r->validated == 0 ? "fail"
                                   : "skipped");
        if (r->validated >= 0)
            printf("%.6g,%.6g,", r->max_err, r->tolerance);
        else
            printf(",,");
        printf("%d,", r->median_ms >= 0 ? r->iters : 0);
        if (r->median_ms >= 0)
            printf("%.6g,%.6g,%.6g,%.6g,", r->median_ms, r->min_ms, r->tflops, bench_gbps(r));
        else
            printf(",,,,");
        if (r->ref_ms >= 0)
            printf("%.6g", r->ref_ms);
        putchar(',');
        if (r->error[0]) { /* quoted, with quotes doubled */
            putchar('"');
            for (const char *c = r->error; *c; c++) {
                if (*c == '"')
                    putchar('"');
                putchar(*c == '\n' ? ' ' : *c);
            }
            putchar('"');
        }
        printf(",%d\n", r->v_packed);
    }
}

/* TFLOP/s against seqlen_q, one line per configuration (all but the seqlen). */
static int write_bench_plot(flashcl_context *ctx, const char *path, const bench_row *rows,
                            int count) {
    svg_series *series = calloc((size_t)count, sizeof *series);
    double *xs = calloc((size_t)count, sizeof *xs), *ys = calloc((size_t)count, sizeof *ys);
    char(*labels)[96] = calloc((size_t)count, sizeof *labels);
    int *owner = calloc((size_t)count, sizeof *owner), num = 0, used = 0, rc = -1;
    char err[300], title[400];
    if (!series || !xs || !ys || !labels || !owner) {
        cli_errorf("out of memory for the plot");
        goto done;
    }
    for (int i = 0; i < count; i++) { /* the configuration of each row */
        const bench_row *r = &rows[i];
        owner[i] = -1;
        for (int j = 0; j < i && owner[i] < 0; j++) {
            const bench_row *o = &rows[j];
            if (o->dtype == r->dtype && o->v_packed == r->v_packed && o->s.batch == r->s.batch &&
                o->s.heads_q == r->s.heads_q && o->s.heads_k == r->s.heads_k &&
                o->s.head_dim == r->s.head_dim && o->causal == r->causal)
                owner[i] = owner[j];
        }
        if (owner[i] < 0) {
            owner[i] = num;
            if (r->s.heads_q == r->s.heads_k)
                snprintf(labels[num], sizeof labels[num], "%s%s B=%d H=%d D=%d%s",
                         cli_dtype_name(r->dtype), r->v_packed ? " v-packed" : "", r->s.batch,
                         r->s.heads_q, r->s.head_dim, r->causal ? " causal" : "");
            else
                snprintf(labels[num], sizeof labels[num], "%s%s B=%d H=%d:%d D=%d%s",
                         cli_dtype_name(r->dtype), r->v_packed ? " v-packed" : "", r->s.batch,
                         r->s.heads_q, r->s.heads_k, r->s.head_dim, r->causal ? " causal" : "");
            num++;
        }
    }
    for (int k = 0; k < num; k++) { /* each line's points, in order of seqlen */
        series[k].label = labels[k];
        series[k].x = xs + used;
        series[k].y = ys + used;
        for (int i = 0; i < count; i++) {
            if (owner[i] != k)
                continue;
            int at = series[k].n++;
            while (at > 0 && xs[used + at - 1] > rows[i].s.seqlen_q) {
                xs[used + at] = xs[used + at - 1];
                ys[used + at] = ys[used + at - 1];
                at--;
            }
            xs[used + at] = rows[i].s.seqlen_q;
            ys[used + at] = rows[i].tflops;
        }
        used += series[k].n;
    }
    {
        const char *name = flashcl_context_device_name(ctx), *paren = strstr(name, " (");
        snprintf(title, sizeof title, "flashcl forward, %.*s",
                 paren ? (int)(paren - name) : (int)strlen(name), name);
    }
    if (svg_plot_write(path, title, "sequence length (seqlen_q = seqlen_k)", "TFLOP/s (median)",
                       series, num, 1, err, sizeof err) != 0) {
        cli_errorf("--plot: %s", err);
        goto done;
    }
    rc = 0;
done:
    free(series);
    free(xs);
    free(ys);
    free(labels);
    free(owner);
    return rc;
}

#define BENCH_MAX_SHAPES 64
#define BENCH_MAX_LIST 16

/* "B,H,N,D" or "B,Hq,Hk,Nq,Nk,D"; returns NULL or what is wrong with it. */
static const char *parse_shape(const char *text, bench_shape *s) {
    long v[6];
    int n = 0;
    if (cli_parse_long_list(text, 1, INT_MAX, v, 6, &n) != 0 || (n != 4 && n != 6))
        return "wants B,H,N,D or B,Hq,Hk,Nq,Nk,D (positive integers)";
    s->batch = (int)v[0];
    s->heads_q = (int)v[1];
    s->heads_k = (int)v[n == 4 ? 1 : 2];
    s->seqlen_q = (int)v[n == 4 ? 2 : 3];
    s->seqlen_k = (int)v[n == 4 ? 2 : 4];
    s->head_dim = (int)v[n == 4 ? 3 : 5];
    if (s->heads_q % s->heads_k != 0)
        return "needs heads_q to be a multiple of heads_k";
    if (s->head_dim > 256)
        return "has head_dim over flashcl's limit of 256";
    return NULL;
}

/* --seqlen, --head-dim, --batch, --heads: a list of integers each; returns 1
 * when argv[*i] was one, 0 when not, -1 after a message. */
static const char *const sweep_names[4] = {"--seqlen", "--head-dim", "--batch", "--heads"};

static int sweep_option(int argc, char **argv, int *i, long lists[4][BENCH_MAX_LIST],
                        int counts[4]) {
    static const long hi[4] = {1 << 24, 256, 1 << 16, 1 << 16};
    const char *value;
    for (int k = 0; k < 4; k++) {
        int r = cli_take_value(argc, argv, i, sweep_names[k], &value);
        if (r < 0)
            return -1;
        if (r == 0)
            continue;
        if (cli_parse_long_list(value, 1, hi[k], lists[k], BENCH_MAX_LIST, &counts[k]) != 0 ||
            counts[k] < 1) {
            cli_usage_error(usage_bench,
                            "%s wants up to %d integers in 1..%ld separated by commas, not '%s'",
                            sweep_names[k], BENCH_MAX_LIST, hi[k], value);
            return -1;
        }
        return 1;
    }
    return 0;
}

int cmd_bench(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--context-parallel") == 0) /* ring attention over MPI: tools/cp_cli.c */
            return cli_context_parallel(argc, argv, 1);
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--decode") == 0) /* decode throughput: tools/serving_cli.c */
            return cli_bench_decode(argc, argv);
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--backward") == 0) /* backward pass: tools/backward_cli.c */
            return cli_bench_backward(argc, argv);
    static const bench_shape gpu_shapes[] = {{1, 8, 8, 1024, 1024, 64},
                                             {1, 8, 8, 2048, 2048, 64},
                                             {1, 8, 8, 4096, 4096, 64},
                                             {2, 16, 16, 1024, 1024, 128}};
    static const bench_shape gpu_long[] = {
        {1, 8, 8, 8192, 8192, 64}, {1, 8, 8, 16384, 16384, 64}, {1, 16, 16, 8192, 8192, 128}};
    /* A 2-core CPU through PoCL ran the first kernels at ~3 GFLOP/s: these
     * rows, reference and validation included, take ~25 s there. */
    static const bench_shape cpu_shapes[] = {{1, 4, 4, 256, 256, 64},
                                             {1, 8, 8, 512, 512, 64},
                                             {1, 8, 8, 1024, 1024, 64},
                                             {1, 4, 4, 512, 512, 128}};
    static const bench_shape cpu_long[] = {{1, 8, 8, 2048, 2048, 64}, {1, 8, 8, 4096, 4096, 64}};
    bench_shape shapes[BENCH_MAX_SHAPES];
    bench_options opt;
    bench_row *rows = NULL;
    const char *device = NULL, *value, *problem;
    int num_shapes = 0, causal_only = 0, want_long = 0;
    int is_cpu, num_rows = 0, failures = 0;
    long iters = 0, warmup = -1; /* unset: chosen for the device below */
    flashcl_context *ctx;
    flashcl_dtype dtypes[3] = {FLASHCL_FLOAT16};
    int num_dtypes = 1, no_causal = 0;
    long sweep[4][BENCH_MAX_LIST]; /* seqlen, head_dim, batch, heads */
    int sweep_count[4] = {0, 0, 0, 0};

    memset(&opt, 0, sizeof opt);
    opt.dtype = FLASHCL_FLOAT16;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int r;
        if (cli_help(arg, usage_bench)) {
            return CLI_EXIT_OK;
        } else if ((r = cli_take_value(argc, argv, &i, "--device", &device)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--dtype", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            char list[64], *tok, *save = NULL;
            snprintf(list, sizeof list, "%s", value);
            num_dtypes = 0;
            for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (num_dtypes == 3 || cli_parse_dtype_fp8(tok, &dtypes[num_dtypes]) != 0)
                    return cli_usage_error(
                        usage_bench, "--dtype wants f16, bf16, f32, e4m3 or e5m2 (a list of up to 3), not '%s'",
                        value);
                num_dtypes++;
            }
            if (num_dtypes == 0)
                return cli_usage_error(usage_bench, "--dtype needs a value");
            opt.dtype = dtypes[0];
        } else if ((r = cli_take_value(argc, argv, &i, "--shape", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (num_shapes >= BENCH_MAX_SHAPES)
                return cli_usage_error(usage_bench, "too many --shape options (at most %d)",
                                       BENCH_MAX_SHAPES);
            if ((problem = parse_shape(value, &shapes[num_shapes])) != NULL)
                return cli_usage_error(usage_bench, "--shape %s %s", value, problem);
            num_shapes++;
        } else if ((r = cli_take_long(usage_bench, argc, argv, &i, "--iters", 1, 1000000,
                                      "an integer >= 1", &iters)) != 0 ||
                   (r = cli_take_long(usage_bench, argc, argv, &i, "--warmup", 0, 1000000,
                                      "an integer >= 0", &warmup)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if (strcmp(arg, "--causal") == 0) {
            causal_only = 1;
        } else if (strcmp(arg, "--long") == 0) {
            want_long = 1;
        } else if (strcmp(arg, "--memory") == 0) {
            opt.memory = 1;
        } else if ((r = sweep_option(argc, argv, &i, sweep, sweep_count)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if (strcmp(arg, "--no-causal") == 0) {
            no_causal = 1;
        } else if (strcmp(arg, "--csv") == 0) {
            opt.csv = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--plot", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            opt.plot = value;
        } else if (strcmp(arg, "--json") == 0) {
            opt.json = 1;
        } else if (strcmp(arg, "--v-packed") == 0) {
            opt.v_packed = 1;
        } else {
            return cli_unknown_option(usage_bench, arg);
        }
    }

    for (int t = 0; opt.v_packed && t < num_dtypes; t++)
        if (dtypes[t] != FLASHCL_FLOAT8_E4M3 && dtypes[t] != FLASHCL_FLOAT8_E5M2)
            return cli_usage_error(
                usage_bench,
                "--v-packed packs FP8 V: it needs --dtype e4m3 and/or e5m2 only, not %s",
                cli_dtype_name(dtypes[t]));

    ctx = cli_open_context(device);
    if (ctx == NULL)
        return CLI_EXIT_FAIL;
    is_cpu = flashcl_context_is_host(ctx);
    if (!is_cpu) {
        cl_device_type type = 0;
        if (clGetDeviceInfo(flashcl_context_cl_device(ctx), CL_DEVICE_TYPE, sizeof type, &type,
                            NULL) == CL_SUCCESS)
            is_cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
    }
    opt.iters = iters ? (int)iters : opt.memory ? (is_cpu ? 1 : 5) : (is_cpu ? 5 : 20);
    opt.warmup = warmup >= 0 ? (int)warmup : opt.memory && is_cpu ? 0 : (is_cpu ? 1 : 3);
    if (causal_only && no_causal) {
        flashcl_context_destroy(ctx);
        return cli_usage_error(usage_bench, "--causal and --no-causal leave nothing to run");
    }
    if (sweep_count[0] || sweep_count[1] || sweep_count[2] || sweep_count[3]) {
        /* Every combination; unset lists take one default value. */
        static const long cpu_seqlens[] = {256, 512, 1024}, gpu_seqlens[] = {512, 1024, 2048, 4096};
        static const long one_d[] = {64}, one_b[] = {1}, one_h[] = {8};
        const long *lists[4] = {sweep[0], sweep[1], sweep[2], sweep[3]};
        int counts[4] = {sweep_count[0], sweep_count[1], sweep_count[2], sweep_count[3]};
        if (!counts[0]) {
            lists[0] = is_cpu ? cpu_seqlens : gpu_seqlens;
            counts[0] = is_cpu ? 3 : 4;
        }
        if (!counts[1])
            lists[1] = one_d, counts[1] = 1;
        if (!counts[2])
            lists[2] = one_b, counts[2] = 1;
        if (!counts[3])
            lists[3] = one_h, counts[3] = 1;
        for (int b = 0; b < counts[2]; b++)
            for (int h = 0; h < counts[3]; h++)
                for (int d = 0; d < counts[1]; d++)
                    for (int n = 0; n < counts[0]; n++) {
                        bench_shape sh = {(int)lists[2][b], (int)lists[3][h], (int)lists[3][h],
                                          (int)lists[0][n], (int)lists[0][n], (int)lists[1][d]};
                        if (num_shapes >= BENCH_MAX_SHAPES) {
                            flashcl_context_destroy(ctx);
                            return cli_usage_error(usage_bench, "the sweep has more than %d shapes",
                                                   BENCH_MAX_SHAPES);
                        }
                        shapes[num_shapes++] = sh;
                    }
    }
    if (num_shapes == 0) {
        const bench_shape *base = is_cpu ? cpu_shapes : gpu_shapes;
        const bench_shape *more = is_cpu ? cpu_long : gpu_long;
        int nbase = is_cpu ? (int)(sizeof cpu_shapes / sizeof cpu_shapes[0])
                           : (int)(sizeof gpu_shapes / sizeof gpu_shapes[0]);
        int nmore = is_cpu ? (int)(sizeof cpu_long / sizeof cpu_long[0])
                           : (int)(sizeof gpu_long / sizeof gpu_long[0]);
        for (int i = 0; i < nbase; i++)
            shapes[num_shapes++] = base[i];
        for (int i = 0; want_long && i < nmore; i++)
            shapes[num_shapes++] = more[i];
    }
    rows = calloc((size_t)num_shapes * 2 * (size_t)num_dtypes, sizeof *rows);
    if (rows == NULL) {
        cli_errorf("out of memory");
        flashcl_context_destroy(ctx);
        return CLI_EXIT_FAIL;
    }

    if (!opt.json && !opt.csv) {
        printf("flashcl bench: %s%s; %s%s%s%s%s%s, %d warm-up + %d timed runs (%s)\n",
               flashcl_context_device_name(ctx), flashcl_context_is_host(ctx) ? " [host path]" : "",
               cli_dtype_name(dtypes[0]), num_dtypes > 1 ? "," : "",
               num_dtypes > 1 ? cli_dtype_name(dtypes[1]) : "", num_dtypes > 2 ? "," : "",
               num_dtypes > 2 ? cli_dtype_name(dtypes[2]) : "",
               opt.v_packed ? " with V packed once (flashcl_fp8_pack_v, untimed; desc.v_packed)"
                            : "",
               opt.warmup, opt.iters,
               flashcl_context_is_host(ctx) ? "wall clock" : "OpenCL profiling events");
        print_bench_header(&opt);
    }
    for (int t = 0; t < num_dtypes; t++)
        for (int i = 0; i < num_shapes; i++) {
            for (int causal = causal_only; causal <= (no_causal ? 0 : 1); causal++) {
                bench_row *row = &rows[num_rows++];
                opt.dtype = dtypes[t];
                row->s = shapes[i];
                row->causal = causal;
                run_bench_row(ctx, &opt, row);
                if (row->error[0])
                    failures++;
                if (!opt.json && !opt.csv)
                    print_bench_row(&opt, row);
            }
        }
    if (opt.plot && write_bench_plot(ctx, opt.plot, rows, num_rows) != 0)
        failures++;
    else if (opt.plot && !opt.json && !opt.csv)
        printf("wrote %s\n", opt.plot);
    if (opt.csv)
        print_bench_csv(rows, num_rows);
    else if (opt.json)
        print_bench_json(ctx, &opt, rows, num_rows);
    else if (opt.memory)
        printf("peak_rss: the process's peak resident memory so far; device: q,k,v,out,lse; "
               "naive_S: one float32 B*H*Nq*Nk score matrix\n");
    free(rows);
    flashcl_context_destroy(ctx);
    if (failures) {
        cli_errorf("%d of %d rows failed", failures, num_rows);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
