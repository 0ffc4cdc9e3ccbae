/* fp8_call_gap.c: where an FP8 forward call's wall clock goes beyond its kernel, on a GPU that runs
 * the warpgroup-MMA kernel (nv-wgmma-fp8). Not part of the build; it reaches into the library
 * (src/internal.h: the V transpose pass alone), so it links the static library. From the
 * repository root, after building into build/:
 *
 *   gcc -O2 -std=c11 -DFLASHCL_STATIC -Iinclude -Isrc bench/fp8_call_gap.c \
 *       build/libflashcl.a -lOpenCL -lpthread -ldl -lm -o /tmp/fp8_call_gap
 *   /tmp/fp8_call_gap [--device SPEC] [--shape B,H,N,D]...   (default issue 35's three shapes)
 *
 * For each shape, full and causal, e4m3 in, float16 out, 20 calls enqueued back to back (best of
 * three rounds), twice: with the same descale factors every call (the context keeps them on the
 * device and skips the upload) and with factors that change every call (one upload a call). It
 * prints the wall clock a call, the forward kernel's own time (its profiling event) and the gap
 * from one forward kernel's end to the next one's start, which holds the call's other device
 * work: the factors' upload and V's transpose (cl/fp8_vt_pack.cl). Then the transpose pass alone,
 * 20 launches, its mean time and the bytes it reads and writes a second. Inputs are arbitrary
 * finite e4m3 codes: a timing, not a check (test_fp8_forward checks the kernels). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashcl.h"
#include "internal.h" /* flashcl_fp8_vt_pack_kernel, flashcl_fp8_vt_pack_enqueue */

enum { CALLS = 20, ROUNDS = 3, MAX_SHAPES = 8 };

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double event_us(cl_event e, cl_profiling_info what) {
    cl_ulong t = 0;
    clGetEventProfilingInfo(e, what, sizeof t, &t, NULL);
    return (double)t * 1e-3;
}

static int fail(flashcl_context *ctx, const char *what, int err) {
    fprintf(stderr, "%s failed (%d): %s\n", what, err, ctx ? flashcl_last_error(ctx) : "");
    return 1;
}

/* CALLS forwards back to back with factors f[0] (or f[0], f[1] alternating), best of ROUNDS by
 * wall clock: wall, kernel and gap in µs a call. */
static int time_calls(flashcl_context *ctx, flashcl_attention_desc *d, cl_mem buf[4], float f[2][3],
                      int changing, double out[3]) {
    cl_event ev[CALLS];
    out[0] = 1e30;
    for (int round = 0; round < ROUNDS; ++round) {
        const double t0 = now_s();
        for (int i = 0; i < CALLS; ++i) {
            const float *s = f[changing && (i & 1)];
            d->fp8.q_descale = &s[0], d->fp8.k_descale = &s[1], d->fp8.v_descale = &s[2];
            const flashcl_status st =
                flashcl_attention_forward(ctx, d, buf[0], buf[1], buf[2], buf[3], NULL, 0, &ev[i]);
            if (st != FLASHCL_SUCCESS) {
                for (int j = 0; j < i; ++j)
                    clReleaseEvent(ev[j]);
                return fail(ctx, "flashcl_attention_forward", st);
            }
        }
        const cl_int err = clFinish(flashcl_context_cl_queue(ctx));
        const double wall = (now_s() - t0) * 1e6 / CALLS;
        double kernel = 0.0, gap = 0.0;
        for (int i = 0; i < CALLS; ++i) {
            kernel += event_us(ev[i], CL_PROFILING_COMMAND_END) -
                      event_us(ev[i], CL_PROFILING_COMMAND_START);
            if (i)
                gap += event_us(ev[i], CL_PROFILING_COMMAND_START) -
                       event_us(ev[i - 1], CL_PROFILING_COMMAND_END);
        }
        for (int i = 0; i < CALLS; ++i)
            clReleaseEvent(ev[i]);
        if (err != CL_SUCCESS)
            return fail(ctx, "clFinish", err);
        if (wall < out[0])
            out[0] = wall, out[1] = kernel / CALLS, out[2] = gap / (CALLS - 1);
    }
    return 0;
}

/* The transpose pass alone, CALLS launches over v as d lays it out: mean µs. */
static int time_pack(flashcl_context *ctx, const flashcl_attention_desc *desc, cl_mem v,
                     double *us) {
    flashcl_attention_desc resolved = *desc, *d = &resolved; /* v's packed strides filled in */
    if (flashcl_attention_desc_resolve(d) != FLASHCL_SUCCESS)
        return fail(ctx, "flashcl_attention_desc_resolve", 0);
    cl_kernel pack;
    flashcl_status st = flashcl_fp8_vt_pack_kernel(ctx, d->head_dim, &pack);
    if (st != FLASHCL_SUCCESS)
        return fail(ctx, "building fp8_vt_pack", st);
    const int keys = (d->seqlen_k + 127) / 128 * 128, rows = (d->head_dim + 63) / 64 * 64;
    cl_int err = CL_SUCCESS;
    cl_mem vt = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE,
                               (size_t)d->batch * d->heads_k * rows * keys, NULL, &err);
    if (!vt)
        return fail(ctx, "allocating Vt", err);
    cl_event ev[CALLS];
    int n = 0;
    for (; n < CALLS && err == CL_SUCCESS; ++n)
        err = flashcl_fp8_vt_pack_enqueue(ctx, pack, v, &d->v, d->batch, d->heads_k, d->seqlen_k,
                                          vt, 0, keys, NULL, &ev[n]);
    n -= err != CL_SUCCESS;
    const cl_int done = clFinish(flashcl_context_cl_queue(ctx));
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        sum +=
            event_us(ev[i], CL_PROFILING_COMMAND_END) - event_us(ev[i], CL_PROFILING_COMMAND_START);
        clReleaseEvent(ev[i]);
    }
    clReleaseMemObject(vt);
    if (err != CL_SUCCESS || done != CL_SUCCESS)
        return fail(ctx, "launching fp8_vt_pack", err != CL_SUCCESS ? err : done);
    *us = sum / CALLS;
    return 0;
}

static int run_shape(flashcl_context *ctx, const int s[4]) {
    const size_t n = (size_t)s[0] * s[1] * s[2] * s[3];
    unsigned char *x = malloc(n);
    if (!x)
        return fail(NULL, "malloc", 0);
    uint32_t r = 12345u;
    for (size_t i = 0; i < n; ++i) { /* finite codes of magnitude below 2^5 (no NaN: 0x7f, 0xff) */
        r = r * 1664525u + 1013904223u;
        x[i] = (unsigned char)(((r >> 24) % 0x60) | ((r >> 16) & 0x80));
    }
    cl_mem buf[4] = {NULL, NULL, NULL, NULL};
    cl_int err = CL_SUCCESS;
    for (int b = 0; b < 3 && err == CL_SUCCESS; ++b)
        buf[b] = clCreateBuffer(flashcl_context_cl_context(ctx),
                                CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n, x, &err);
    if (err == CL_SUCCESS)
        buf[3] =
            clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE, 2 * n, NULL, &err);
    free(x);
    int rc = err != CL_SUCCESS ? fail(ctx, "allocating the tensors", err) : 0;
    float f[2][3] = {{1.0f, 1.0f, 1.0f}, {1.0f, 1.0f, 0.5f}};
    for (int causal = 0; causal < 2 && !rc; ++causal) {
        flashcl_attention_desc d = {0};
        d.dtype = FLASHCL_FLOAT8_E4M3, d.out_dtype = FLASHCL_FLOAT16;
        d.batch = s[0], d.heads_q = d.heads_k = s[1], d.seqlen_q = d.seqlen_k = s[2],
        d.head_dim = s[3];
        d.causal = causal;
        flashcl_params p;
        if (flashcl_attention_params(ctx, &d, &p) == FLASHCL_SUCCESS && causal == 0)
            printf("(%d,%d,%d,%d): variant %s\n", s[0], s[1], s[2], s[3], p.variant);
        double t[2][3];
        for (int changing = 0; changing < 2 && !rc; ++changing) /* after a warm-up call */
            rc = time_calls(ctx, &d, buf, f, 0, t[changing]) ||
                 time_calls(ctx, &d, buf, f, changing, t[changing]);
        for (int changing = 0; changing < 2 && !rc; ++changing)
            printf("  %-6s %-8s factors: wall %7.1f us a call, kernel %7.1f, kernel end to next "
                   "start %5.1f\n",
                   causal ? "causal" : "full", changing ? "changing" : "static", t[changing][0],
                   t[changing][1], t[changing][2]);
        double us;
        if (!rc && !causal && !(rc = time_pack(ctx, &d, buf[2], &us)))
            printf("  fp8_vt_pack alone: %.1f us, %.0f GB/s read + write\n", us,
                   2.0 * (double)n / us * 1e-3);
    }
    for (int b = 0; b < 4; ++b)
        if (buf[b])
            clReleaseMemObject(buf[b]);
    return rc;
}

int main(int argc, char **argv) {
    const char *spec = "nvidia";
    int shapes[MAX_SHAPES][4] = {{4, 32, 4096, 128}, {1, 32, 16384, 128}, {4, 32, 4096, 64}},
        count = 0;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc && count < MAX_SHAPES &&
                 sscanf(argv[++i], "%d,%d,%d,%d", &shapes[count][0], &shapes[count][1],
                        &shapes[count][2], &shapes[count][3]) == 4)
            ++count;
        else {
            fprintf(stderr, "usage: %s [--device SPEC] [--shape B,H,N,D]... (at most %d)\n",
                    argv[0], MAX_SHAPES);
            return 2;
        }
    }
    flashcl_context *ctx = NULL;
    if (flashcl_context_create(&ctx, spec) != FLASHCL_SUCCESS) {
        fprintf(stderr, "no context for %s: %s\n", spec, flashcl_last_error(NULL));
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < (count ? count : 3) && !rc; ++i)
        rc = run_shape(ctx, shapes[i]);
    flashcl_context_destroy(ctx);
    return rc;
}
