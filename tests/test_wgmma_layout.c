/* test_wgmma_layout.c: the shared-memory layouts flash_fwd_sm90.cl hands to wgmma, one MMA at a
 * time (tests/wgmma_probe.cl), on Hopper only (compute capability 9.0; elsewhere: skipped, passing).
 *
 * The forward kernel was right with two-panel tiles (head dims 65..128), wrong with one-panel
 * 64-key tiles (head_dim <= 64) until it reloaded Q's A fragments before every tile, and wrong
 * with Q read through a descriptor (BENCHMARKS.md). This runs the MMA alone on known small
 * integers, so every product is exact in float and compared with ==: each tile shape (rows, one
 * or two 128-byte panels), k-step, panel, operand form (K-major B, N-major B, A from __local) and
 * tile position gets a line saying whether the hardware read what the layout means. Then the
 * FP8 forward's two products alone (cl/flash_fwd_sm90_fp8.cl built with -DFP8_PROBE: S = Q K^T
 * and P V through that kernel's own fragment loads, P packing and V transpose), per format, head
 * dim and a full or partial key tile, rows past the keys holding NaN codes that must not leak.
 * Not a timing; bench/h200.sh runs it with the GPU tests.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "internal.h"

static const char *const mode_names[] = {"K-major B (as K), A in registers", "N-major B (as V), A in registers",
                                         "K-major B, A from __local (SS)"};

/* Small integers in [-3, 3] as float16 bits: products and their 16-term sums are exact. */
static void fill_small(flashcl_ref_rng *rng, uint16_t *h, float *f, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        f[i] = (float)((int)(flashcl_ref_rng_next(rng) % 7) - 3);
        h[i] = flashcl_ref_float_to_half(f[i]);
    }
}

/* The exact result of (mode, step, panel) on A [64][dpad] and B [rows][dpad]. */
static void expected(int mode, int step, int panel, int dpad, const float *a, const float *b, float *out) {
    for (int m = 0; m < 64; ++m)
        for (int n = 0; n < 64; ++n) {
            double s = 0.0;
            for (int k = 0; k < 16; ++k)
                s += mode == 1 ? (double)a[m * dpad + k] * b[(16 * step + k) * dpad + 64 * panel + n]
                               : (double)a[m * dpad + 16 * step + k] * b[n * dpad + 16 * step + k];
            out[m * 64 + n] = (float)s;
        }
}

/* FP8 small integers in [-3, 3] (exact in e4m3 and e5m2) as bytes and their values. */
static void fill_small8(flashcl_ref_rng *rng, flashcl_dtype f, unsigned char *b, float *x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        x[i] = (float)((int)(flashcl_ref_rng_next(rng) % 7) - 3);
        b[i] = flashcl_fp8_encode(f, x[i]);
    }
}

/* fp8_vt_pack on one tile: v [nk][d] bytes -> vt (vt_rows rows of 128 keys), poisoned first. */
static cl_int vt_pack_run(flashcl_context *ctx, cl_kernel pack, const unsigned char *v, int d, int nk, cl_mem vt,
                          int vt_rows) {
    cl_mem vb = test_upload(ctx, v, (size_t)128 * d);
    const flashcl_layout layout = {0, (size_t)128 * d, (size_t)d, (size_t)128 * d}; /* offset, batch, seq, head */
    const unsigned char poison = 0x7f; /* a NaN code in both formats */
    cl_int err = clEnqueueFillBuffer(ctx->queue, vt, &poison, 1, 0, (size_t)vt_rows * 128, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = flashcl_fp8_vt_pack_enqueue(ctx, pack, vb, &layout, 1, 1, nk, vt, 0, 128, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clFinish(ctx->queue);
    clReleaseMemObject(vb);
    return err;
}

/* One run of fp8_wgmma_probe; the number of elements of out that differ from want. */
static int fp8_probe_run(flashcl_context *ctx, cl_kernel kernel, cl_mem buf[5], int mode, int nk, size_t out_n,
                         const float *want, float *got, int cols, char *first, size_t first_size) {
    cl_int err = CL_SUCCESS;
    for (cl_uint i = 0; i < 5; ++i)
        err |= clSetKernelArg(kernel, i, sizeof(cl_mem), &buf[i]);
    err |= clSetKernelArg(kernel, 5, sizeof(cl_int), &mode);
    err |= clSetKernelArg(kernel, 6, sizeof(cl_int), &nk);
    const float poison = NAN;
    err |= clEnqueueFillBuffer(ctx->queue, buf[4], &poison, sizeof poison, 0, out_n * 4, 0, NULL, NULL);
    size_t global = 128, local = 128;
    err |= clEnqueueNDRangeKernel(ctx->queue, kernel, 1, NULL, &global, &local, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        snprintf(first, first_size, " enqueue: %s", flashcl_status_string(err));
        return 1;
    }
    test_download(ctx, buf[4], got, out_n * 4);
    int wrong = 0;
    for (size_t i = 0; i < out_n; ++i)
        if (!(got[i] == want[i]) && !wrong++) /* NaN never passes */
            snprintf(first, first_size, " (first (%zu,%zu): %g not %g)", i / (size_t)cols, i % (size_t)cols,
                     (double)got[i], (double)want[i]);
    return wrong;
}

/* The FP8 probe over formats, head dims and key counts; the number of failed lines. */
static int fp8_products(flashcl_context *ctx, flashcl_ref_rng *rng, int *lines) {
    static const struct {
        flashcl_dtype f;
        int d;
    } cases[] = {{FLASHCL_FLOAT8_E4M3, 128}, {FLASHCL_FLOAT8_E4M3, 64}, {FLASHCL_FLOAT8_E5M2, 80},
                 {FLASHCL_FLOAT8_E4M3, 32}};
    const int bn = 128;
    int failures = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        const flashcl_dtype f = cases[c].f;
        const int d = cases[c].d, vt_rows = (d + 63) / 64 * 64;
        char options[200];
        snprintf(options, sizeof options,
                 "-cl-std=CL1.2 -DFLASHCL_NV_PTX -DFLASHCL_SM90A -DFP8_PROBE -DDTYPE=1 -DQ_FP8=%d -DKV_FP8=%d "
                 "-DHEAD_DIM=%d -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4",
                 (int)f, (int)f, d);
        cl_kernel kernel, pack;
        if (flashcl_get_kernel(ctx, "flash_fwd_sm90_fp8.cl", "fp8_wgmma_probe", options, &kernel) != FLASHCL_SUCCESS ||
            flashcl_fp8_vt_pack_kernel(ctx, d, &pack) != FLASHCL_SUCCESS) {
            printf("FP8 probe, D=%d: build FAILED: %.400s\n", d, flashcl_last_error(ctx));
            ++failures;
            continue;
        }
        unsigned char *qb = test_xmalloc((size_t)64 * d), *kb = test_xmalloc((size_t)bn * d),
                      *vb = test_xmalloc((size_t)bn * d);
        float *qx = test_xmalloc((size_t)64 * d * 4), *kx = test_xmalloc((size_t)bn * d * 4),
              *vx = test_xmalloc((size_t)bn * d * 4), *p = test_xmalloc((size_t)64 * bn * 4),
              *pv = test_xmalloc((size_t)64 * bn * 4), *want = test_xmalloc((size_t)64 * bn * 4),
              *got = test_xmalloc((size_t)64 * bn * 4);
        fill_small8(rng, f, qb, qx, (size_t)64 * d);
        fill_small8(rng, f, kb, kx, (size_t)bn * d);
        fill_small8(rng, f, vb, vx, (size_t)bn * d);
        for (int i = 0; i < 64 * bn; ++i) {
            pv[i] = (float)((int)(flashcl_ref_rng_next(rng) % 7) - 3);
            p[i] = pv[i] / 256.0f; /* the kernel's P_SCALE gives pv back exactly */
        }
        for (int nk = bn; nk >= 77; nk -= bn - 77) {
            /* Keys past nk: NaN codes, which the copies must replace by zeros. */
            for (size_t i = (size_t)nk * d; i < (size_t)bn * d; ++i)
                kb[i] = vb[i] = 0x7f;
            cl_mem buf[5] = {test_upload(ctx, qb, (size_t)64 * d), test_upload(ctx, kb, (size_t)bn * d),
                             test_upload(ctx, NULL, (size_t)vt_rows * bn), test_upload(ctx, p, (size_t)64 * bn * 4),
                             test_upload(ctx, NULL, (size_t)64 * bn * 4)};
            /* The P V probe reads V as the forward does: transposed by fp8_vt_pack (over poison). */
            if (vt_pack_run(ctx, pack, vb, d, nk, buf[2], vt_rows) != CL_SUCCESS) {
                printf("FP8 %s, D=%d, %d keys: fp8_vt_pack FAILED to run\n", f == FLASHCL_FLOAT8_E4M3 ? "e4m3" : "e5m2",
                       d, nk);
                ++failures;
            }
            for (int mode = 0; mode < 2; ++mode) {
                const int cols = mode == 0 ? bn : vt_rows;
                for (int m = 0; m < 64; ++m)
                    for (int n = 0; n < cols; ++n) {
                        double sum = 0.0;
                        if (mode == 0 && n < nk)
                            for (int e = 0; e < d; ++e)
                                sum += (double)qx[m * d + e] * kx[n * d + e];
                        else if (mode == 1 && n < d)
                            for (int key = 0; key < nk; ++key)
                                sum += (double)pv[m * bn + key] * vx[key * d + n];
                        want[m * cols + n] = (float)sum;
                    }
                char first[160] = "";
                const int wrong =
                    fp8_probe_run(ctx, kernel, buf, mode, nk, (size_t)64 * cols, want, got, cols, first, sizeof first);
                ++*lines;
                printf("FP8 %s, D=%d, %d keys, %s: %s%s\n", f == FLASHCL_FLOAT8_E4M3 ? "e4m3" : "e5m2", d, nk,
                       mode == 0 ? "S = Q K^T (Q in registers, K-major K)" : "P V (P packed to e4m3, V transposed)",
                       wrong ? "FAILED" : "ok", first);
                failures += wrong > 0;
            }
            for (int i = 0; i < 5; ++i)
                clReleaseMemObject(buf[i]);
        }
        free(qb), free(kb), free(vb), free(qx), free(kx), free(vx), free(p), free(pv), free(want), free(got);
    }
    return failures;
}

int main(void) {
    flashcl_context *ctx = test_context();
    if (!ctx->info.is_nvidia || ctx->info.nv_cc_major != 9 || ctx->info.nv_cc_minor != 0) {
        printf("skipped: not compute capability 9.0\n");
        flashcl_context_destroy(ctx);
        return 0;
    }
    char dir[] = "/tmp/flashcl-wgmma-probe-XXXXXX";
    static const char *const kernel_files[] = {"flash_fwd_sm90_fp8.cl", "fp8_vt_pack.cl"};
    if (!test_kernel_dir(dir, FLASHCL_SOURCE_CL_DIR, kernel_files, 2) ||
        !test_copy_file(FLASHCL_SOURCE_TEST_DIR, dir, "wgmma_probe.cl")) {
        printf("setting up the kernel directory: FAILED\n");
        return 1;
    }
    setenv("FLASHCL_KERNEL_DIR", dir, 1);
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, test_seed());
    /* {rows, dpad}: the forward's 64-key tiles at D <= 64 and at D = 128, 48-key tiles, 128 keys,
     * and 32-row tiles (N-major only: 32 keys of a P V or dS K product). */
    static const int shapes[][2] = {{64, 64}, {64, 128}, {48, 128}, {48, 64}, {128, 64}, {32, 128}, {32, 64}};
    static const int offsets[] = {0, 1024, 8192};
    int failures = 0, lines = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; ++sh) {
        const int rows = shapes[sh][0], dpad = shapes[sh][1];
        char options[160];
        snprintf(options, sizeof options, "-cl-std=CL1.2 -DFLASHCL_NV_PTX -DFLASHCL_SM90A -DROWS=%d -DDPAD=%d", rows,
                 dpad);
        cl_kernel kernel;
        if (flashcl_get_kernel(ctx, "wgmma_probe.cl", "wgmma_probe", options, &kernel) != FLASHCL_SUCCESS) {
            printf("rows %d, %d halves: build FAILED: %.400s\n", rows, dpad, flashcl_last_error(ctx));
            ++failures;
            continue;
        }
        uint16_t *ah = test_xmalloc((size_t)64 * dpad * 2), *bh = test_xmalloc((size_t)rows * dpad * 2);
        float *af = test_xmalloc((size_t)64 * dpad * 4), *bf = test_xmalloc((size_t)rows * dpad * 4);
        float *got = test_xmalloc(64 * 64 * 4), *want = test_xmalloc(64 * 64 * 4);
        fill_small(&rng, ah, af, (size_t)64 * dpad);
        fill_small(&rng, bh, bf, (size_t)rows * dpad);
        cl_mem ba = test_upload(ctx, ah, (size_t)64 * dpad * 2), bb = test_upload(ctx, bh, (size_t)rows * dpad * 2);
        cl_mem bo = test_upload(ctx, NULL, 64 * 64 * 4);
        for (int mode = 0; mode < 3; ++mode) {
            if (mode != 1 && rows < 64)
                continue; /* 64 rows of B for an n64 product */
            const int steps = mode == 1 ? rows / 16 : dpad / 16, panels = mode == 1 ? dpad / 64 : 1;
            for (size_t oi = 0; oi < sizeof offsets / sizeof offsets[0]; ++oi) {
                char wrong[512] = "";
                size_t at = 0;
                int bad = 0;
                for (int step = 0; step < steps; ++step)
                    for (int panel = 0; panel < panels; ++panel) {
                        cl_int args[4] = {mode, step, panel, offsets[oi]};
                        cl_int err = clSetKernelArg(kernel, 0, sizeof(cl_mem), &ba);
                        err |= clSetKernelArg(kernel, 1, sizeof(cl_mem), &bb);
                        err |= clSetKernelArg(kernel, 2, sizeof(cl_mem), &bo);
                        for (int i = 0; i < 4; ++i)
                            err |= clSetKernelArg(kernel, 3 + (cl_uint)i, sizeof(cl_int), &args[i]);
                        size_t global = 128, local = 128;
                        const float poison = NAN;
                        err |= clEnqueueFillBuffer(ctx->queue, bo, &poison, sizeof poison, 0, 64 * 64 * 4, 0, NULL,
                                                   NULL);
                        err |= clEnqueueNDRangeKernel(ctx->queue, kernel, 1, NULL, &global, &local, 0, NULL, NULL);
                        if (err != CL_SUCCESS) {
                            printf("enqueue: %s: FAILED\n", flashcl_status_string(err));
                            return 1;
                        }
                        test_download(ctx, bo, got, 64 * 64 * 4);
                        expected(mode, step, panel, dpad, af, bf, want);
                        int n_wrong = 0, first = -1;
                        for (int i = 0; i < 64 * 64; ++i)
                            if (!(got[i] == want[i])) /* NaN never passes */
                                first = first < 0 ? i : first, ++n_wrong;
                        if (n_wrong) {
                            ++bad;
                            at += (size_t)snprintf(wrong + at, at < sizeof wrong ? sizeof wrong - at : 0,
                                                   " [step %d panel %d: %d wrong, first (%d,%d) %g not %g]", step,
                                                   panel, n_wrong, first / 64, first % 64, (double)got[first],
                                                   (double)want[first]);
                            if (at >= sizeof wrong)
                                at = sizeof wrong - 1;
                        }
                    }
                ++lines;
                printf("rows %3d, %3d halves, %s, tile at +%d: %s%s\n", rows, dpad, mode_names[mode], offsets[oi],
                       bad ? "FAILED" : "ok", wrong);
                failures += bad > 0;
            }
        }
        clReleaseMemObject(ba), clReleaseMemObject(bb), clReleaseMemObject(bo);
        free(ah), free(bh), free(af), free(bf), free(got), free(want);
    }
    failures += fp8_products(ctx, &rng, &lines);
    unsetenv("FLASHCL_KERNEL_DIR");
    test_kernel_dir_remove(dir);
    printf("%d of %d layouts read as meant%s\n", lines - failures, lines, failures ? ": FAILED" : "");
    flashcl_context_destroy(ctx);
    return failures ? 1 : 0;
}
