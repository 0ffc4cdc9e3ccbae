/* ptx_fwd_harness.c: flashcl's forward kernel (and, for FP8, its V transpose) relaunched through the
 * CUDA driver, so that Nsight Compute sees them. The forward's twin of bench/ptx_harness.c, whose
 * header says why this works (NVIDIA's OpenCL keeps PTX, the CUDA driver loads PTX) and which
 * shares its CUDA side (bench/ptx_cuda.c).
 *
 * Why. Issue 35's FP8 forward runs at 1.26x cuDNN's float16 at (4,32,4096,128) but 1.12x causal,
 * and its causal rate is 0.74x its full rate where the float16 kernel's is 0.91x (H200, 2026-12-05,
 * BENCHMARKS.md). A model of the schedule puts that on a fixed cost per work-group
 * (docs/perf-notes-fp8.md, "FP8 forward on warpgroup MMA"); a profile says which.
 *
 * What it does, at one shape (seeded inputs, an empty disk program cache as ptx_harness uses):
 *   1. flashcl's forward on the NVIDIA GPU (dtype e4m3, e5m2: FP8 q, k, v with per-tensor descales
 *      and a float16 output, on the table's kernel, nv-wgmma-fp8 on compute capability 9.0; f16,
 *      bf16: the 16-bit forward), keeping out and LSE; its calls back to back by wall clock;
 *   2. the forward's program (and fp8_vt_pack's) read back from the cache, a -DUSE_TMA=1 build where
 *      the cache holds one (that is what flashcl ran);
 *   3. the same launches through the CUDA driver with src/attention.c's arguments and grid: for FP8
 *      fp8_vt_pack (V into Vt) then the forward; tensor maps encoded by flashcl's own src/nv_tma.c;
 *   4. out and LSE checked bitwise against flashcl's (one kernel, same arithmetic, same order), then
 *      each kernel timed by cuEvents and both back to back.
 *
 * Build: with ptx_harness (-DFLASHCL_BUILD_BENCH_HARNESS=ON), target ptx_fwd_harness.
 * Run:   build-gpu/ptx_fwd_harness B H N D [--dtype e4m3|e5m2|f16|bf16] [--causal] [--iters N]
 *        [--dump DIR] [--cache DIR] [--device SPEC]; exit status 0 when out and LSE match. Under ncu:
 *        ncu --set full -k regex:flash_fwd --launch-count 1 build-gpu/ptx_fwd_harness 4 32 4096 128
 *        --dtype e4m3 --causal --iters 1 (the first matching launch is the checked one).
 * Not covered: the other forward variants' launches where they differ (nv-mma's grid is the same;
 * the portable and cpu kernels are not NVIDIA's concern), GQA (heads_k = heads_q here), windows,
 * soft-cap, per-head or block descales.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashcl.h"
#include "internal.h" /* flashcl_tma_encode*: the maps exactly as the library encodes them */
#include "ptx_cuda.h"

/* Seeded random bits with the exponent held in a narrow band (values of magnitude 1/4 to 4, no
 * NaN or infinity in any format), so no conversion code is needed: bits per element 8 or 16,
 * exp_bits and bias of the format. */
static uint64_t rng_state = 0x5eed2026fa57ull;
static uint32_t rng_u32(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static void fill(void *dst, size_t n, int bits, int exp_bits, int bias) {
    const int man_bits = bits - 1 - exp_bits;
    for (size_t i = 0; i < n; ++i) {
        const uint32_t r = rng_u32();
        const uint32_t e = (uint32_t)(bias - 2 + (int)(r % 4u)); /* 2^-2 .. 2^1, times 1.m */
        const uint32_t m = (r >> 8) & ((1u << man_bits) - 1u), s = (r >> 30) & 1u;
        const uint32_t x = (s << (bits - 1)) | (e << man_bits) | m;
        if (bits == 8)
            ((uint8_t *)dst)[i] = (uint8_t)x;
        else
            ((uint16_t *)dst)[i] = (uint16_t)x;
    }
}

static void log_line(void *user, const char *line) {
    (void)user;
    printf("  flashcl log: %s\n", line);
}

/* The number of bytes that differ, printed with the first. */
static size_t differ(const char *what, const void *ref, const void *got, size_t bytes) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < bytes; ++i)
        if (((const uint8_t *)ref)[i] != ((const uint8_t *)got)[i] && !bad++)
            first = i;
    printf("  %-3s %zu of %zu bytes differ%s", what, bad, bytes, bad ? "" : " (bitwise equal)\n");
    if (bad)
        printf(", the first at byte %zu\n", first);
    return bad;
}
/* The cached program holding an entry named prefix... built for head_dim and (dtype >= 0) -DDTYPE,
 * with -DQ_FP8 where fp8 is 1 and without it where 0 (-1: either; an FP8 forward's -DDTYPE is its
 * output's, so a 16-bit program of the same head dim in a shared cache matches DTYPE too), preferring
 * a -DUSE_TMA=1 build (what flashcl runs when both built; a TMA build that then did not fit the
 * device would be picked wrongly: the bitwise check says so). */
static const cached_program *pick_program(const cached_program *progs, int n, const char *prefix, int head_dim,
                                          int dtype, int fp8) {
    const cached_program *best = NULL;
    char name[128];
    for (int i = 0; i < n; ++i) {
        if (!find_entry(progs[i].ptx, prefix, NULL, name, sizeof name) ||
            option_int(progs[i].options, "HEAD_DIM", -1) != head_dim ||
            (dtype >= 0 && option_int(progs[i].options, "DTYPE", -1) != dtype) ||
            (fp8 >= 0 && (option_int(progs[i].options, "Q_FP8", 0) != 0) != fp8))
            continue;
        if (!best || (option_int(progs[i].options, "USE_TMA", 0) && !option_int(best->options, "USE_TMA", 0)))
            best = &progs[i];
    }
    return best;
}

int main(int argc, char **argv) {
    harness_args a = {.dtype = "e4m3"};
    harness_args_start(argc, argv, &a, "[--dtype e4m3|e5m2|f16|bf16] [--causal] [--iters N] [--dump DIR] "
                                       "[--cache DIR] [--device SPEC]");
    for (int i = 5; i < argc; ++i)
        if (!harness_flag(argc, argv, &i, &a))
            die("unknown argument %s", argv[i]);
    harness_args_check(&a);
    const int B = a.B, H = a.H, N = a.N, D = a.D, causal = a.causal, iters = a.iters;
    const char *dtype = a.dtype, *dump = a.dump, *device = a.device, *cache = a.cache;
    flashcl_attention_desc desc = {0};
    if (!strcmp(dtype, "e4m3"))
        desc.dtype = FLASHCL_FLOAT8_E4M3;
    else if (!strcmp(dtype, "e5m2"))
        desc.dtype = FLASHCL_FLOAT8_E5M2;
    else if (!strcmp(dtype, "f16"))
        desc.dtype = FLASHCL_FLOAT16;
    else if (!strcmp(dtype, "bf16"))
        desc.dtype = FLASHCL_BFLOAT16;
    else
        die("unknown --dtype %s", dtype);
    const int fp8 = desc.dtype == FLASHCL_FLOAT8_E4M3 || desc.dtype == FLASHCL_FLOAT8_E5M2;
    /* Per-tensor descales, powers of two (the kernel folds them into its scales either way). */
    static const float q_descale = 0.5f, k_descale = 0.25f, v_descale = 2.0f;
    desc.batch = B, desc.heads_q = desc.heads_k = H, desc.seqlen_q = desc.seqlen_k = N, desc.head_dim = D;
    desc.causal = causal;
    if (fp8) {
        desc.out_dtype = FLASHCL_FLOAT16;
        desc.fp8.q_descale = &q_descale, desc.fp8.k_descale = &k_descale, desc.fp8.v_descale = &v_descale;
    }
    flashcl_attention_desc r = desc;
    if (flashcl_attention_desc_resolve(&r) != FLASHCL_SUCCESS)
        die("%s", "invalid shape");

    char fresh[] = "/tmp/ptx_fwd_harness.XXXXXX";
    flashcl_context *ctx = harness_context(&cache, fresh, device, log_line);
    printf("device: %s\nshape (B,H,N,D) = (%d,%d,%d,%d), %s, %s\n", flashcl_context_device_name(ctx), B, H, N, D,
           dtype, causal ? "causal" : "non-causal");

    const size_t elems = (size_t)B * H * N * D, rows = (size_t)B * H * N;
    const size_t in_bytes = elems * (fp8 ? 1 : 2), out_bytes = elems * 2;
    void *host[3];
    for (int t = 0; t < 3; ++t) {
        host[t] = malloc(in_bytes);
        if (desc.dtype == FLASHCL_FLOAT8_E4M3)
            fill(host[t], elems, 8, 4, 7);
        else if (desc.dtype == FLASHCL_FLOAT8_E5M2)
            fill(host[t], elems, 8, 5, 15);
        else if (desc.dtype == FLASHCL_FLOAT16)
            fill(host[t], elems, 16, 5, 15);
        else
            fill(host[t], elems, 16, 8, 127);
    }
    cl_context clc = flashcl_context_cl_context(ctx);
    cl_command_queue queue = flashcl_context_cl_queue(ctx);
    cl_mem q = harness_upload(clc, host[0], in_bytes), k = harness_upload(clc, host[1], in_bytes);
    cl_mem v = harness_upload(clc, host[2], in_bytes);
    cl_mem out = harness_upload(clc, NULL, out_bytes), lse = harness_upload(clc, NULL, rows * 4);
    if (flashcl_attention_forward(ctx, &desc, q, k, v, out, lse, 0, NULL) != FLASHCL_SUCCESS)
        die("flashcl: %s", flashcl_last_error(ctx));
    clFinish(queue);
    void *ref_out = malloc(out_bytes), *ref_lse = malloc(rows * 4);
    clEnqueueReadBuffer(queue, out, CL_TRUE, 0, out_bytes, ref_out, 0, NULL, NULL);
    clEnqueueReadBuffer(queue, lse, CL_TRUE, 0, rows * 4, ref_lse, 0, NULL, NULL);
    const double flops = 4.0 * B * H * (double)N * N * D * (causal ? 0.5 : 1.0);
    double t0 = harness_now_ms();
    for (int i = 0; i < iters; ++i)
        flashcl_attention_forward(ctx, &desc, q, k, v, out, lse, 0, NULL);
    clFinish(queue);
    const double cl_ms = (harness_now_ms() - t0) / iters;
    printf("flashcl (OpenCL): %.3f ms a forward call, %.1f TFLOP/s (%d calls back to back, wall clock)\n", cl_ms,
           flops / cl_ms * 1e-9, iters);

    /* The programs flashcl built: the forward (its TMA build where present) and, for FP8 on
     * nv-wgmma-fp8, the V transpose. */
    static cached_program progs[64];
    const int np = read_cache(cache, progs, 64);
    const cached_program *fwd = pick_program(progs, np, "flash_fwd", D, (int)(fp8 ? desc.out_dtype : desc.dtype), fp8);
    if (!fwd)
        die("%s", "the cache holds no forward program (not an NVIDIA device, or the cache is off?)");
    load_cuda(); /* before load_kernel, which loads the PTX through the driver */
    kernel kf = {.role = "fwd"}, kp = {.role = "pack"};
    load_kernel(&kf, fwd, "flash_fwd", NULL, dump);
    const int wgmma_fp8 = !strncmp(kf.name, "flash_fwd_sm90_fp8", 18);
    const cached_program *pack = wgmma_fp8 ? pick_program(progs, np, "fp8_vt_pack", D, -1, -1) : NULL;
    if (wgmma_fp8 && !pack)
        die("%s", "nv-wgmma-fp8 ran, but the cache holds no fp8_vt_pack program");
    if (pack)
        load_kernel(&kp, pack, "fp8_vt_pack", NULL, dump);
    const int tma = option_int(fwd->options, "USE_TMA", 0), block_m = option_int(fwd->options, "BLOCK_M", 0),
              block_n = option_int(fwd->options, "BLOCK_N", 0), warps = option_int(fwd->options, "WARPS", 0);
    if (block_m < 1 || warps < 1)
        die("not a tensor-core forward (no -DBLOCK_M or -DWARPS; flashcl fell back?): %s", fwd->options);
    printf("forward program (from %s):\n  [%s]\n", cache, fwd->options);

    /* ---- the same launches through the CUDA driver ---- */
    CUdeviceptr d_q, d_k, d_v, d_out, d_lse, d_sc = 0, d_vt = 0, d_slots = 0;
    CUdeviceptr *dev_in[3] = {&d_q, &d_k, &d_v};
    for (int t = 0; t < 3; ++t) {
        cu_check(cu.mem_alloc(dev_in[t], in_bytes), "cuMemAlloc");
        cu_check(cu.memcpy_htod(*dev_in[t], host[t], in_bytes), "cuMemcpyHtoD");
    }
    cu_check(cu.mem_alloc(&d_out, out_bytes), "cuMemAlloc");
    cu_check(cu.mem_alloc(&d_lse, rows * 4), "cuMemAlloc");
    cu_check(cu.memset_d8(d_out, 0xff, out_bytes), "cuMemsetD8"); /* poisoned: NaN bits */
    cu_check(cu.memset_d8(d_lse, 0xff, rows * 4), "cuMemsetD8");
    const unsigned groups_m = (unsigned)((N + block_m - 1) / block_m);
    if (tma) {
        cu_check(cu.mem_alloc(&d_slots, (size_t)groups_m * H * B * FLASHCL_TMA_SLOT_BYTES), "cuMemAlloc");
    }
    /* src/attention.c's fp8_vt_shape: keys rounded up to 128, head dims to 64. */
    const int vt_keys = (N + 127) / 128 * 128, vt_rows = (D + 63) / 64 * 64;
    if (pack) {
        cu_check(cu.mem_alloc(&d_vt, (size_t)B * H * vt_rows * vt_keys), "cuMemAlloc");
        cu_check(cu.memset_d8(d_vt, 0x7f, (size_t)B * H * vt_rows * vt_keys), "cuMemsetD8");
        /* fp8_vt_pack(v, v:4, vt, vt_off, nk, vt_keys): global {vt_keys / 128 * 128, heads_k, batch}, local 128 */
        kp.grid[0] = (unsigned)(vt_keys / 128), kp.grid[1] = (unsigned)H, kp.grid[2] = (unsigned)B, kp.block = 128;
        arg_u64(&kp.args, d_v), arg_layout(&kp.args, &r.v), arg_u64(&kp.args, d_vt), arg_u64(&kp.args, 0);
        arg_i32(&kp.args, N), arg_i32(&kp.args, vt_keys);
    }
    if (fp8) { /* flashcl_fp8_upload_scales, per tensor: [q | k | v] */
        const float sc[3] = {q_descale, k_descale, v_descale};
        cu_check(cu.mem_alloc(&d_sc, sizeof sc), "cuMemAlloc");
        cu_check(cu.memcpy_htod(d_sc, sc, sizeof sc), "cuMemcpyHtoD");
    }
    flashcl_tensor_map maps[2];
    if (tma) {
        int ok;
        if (wgmma_fp8) {
            const uint64_t vt_dims[4] = {(uint64_t)vt_keys, (uint64_t)vt_rows, (uint64_t)H, (uint64_t)B},
                           vt_strides[3] = {(uint64_t)vt_keys, (uint64_t)vt_rows * vt_keys,
                                            (uint64_t)H * vt_rows * vt_keys};
            ok = flashcl_tma_encode_layout(&maps[0], &r.k, 1, B, N, H, D, (unsigned)block_n) &&
                 flashcl_tma_encode(&maps[1], 1, vt_dims, vt_strides, (unsigned)vt_rows);
        } else {
            ok = flashcl_tma_encode_pair(&r.k, &r.v, B, N, H, D, (unsigned)block_n, maps);
        }
        if (!ok)
            die("%s", "the tensor maps did not encode here, where flashcl's did");
    }
    /* The forward's arguments, in src/attention.c's order: FWD_ARGS, the TMA maps and slots, the
     * descales (FWD_FP8_ARGS), Vt and its keys a row. */
    const float log2e = 1.4426950408889634f;
    arg_u64(&kf.args, d_q), arg_u64(&kf.args, d_k), arg_u64(&kf.args, d_v), arg_u64(&kf.args, d_out);
    arg_u64(&kf.args, d_lse);
    arg_layout(&kf.args, &r.q), arg_layout(&kf.args, &r.k), arg_layout(&kf.args, &r.v);
    arg_layout(&kf.args, &r.out), arg_u64(&kf.args, 0); /* lse_offset */
    arg_i32(&kf.args, 1), arg_i32(&kf.args, N), arg_i32(&kf.args, N), arg_i32(&kf.args, 1); /* has_lse, nq, nk, group */
    arg_f32(&kf.args, r.softcap > 0.0f ? r.scale / r.softcap : r.scale * log2e);
    arg_f32(&kf.args, r.softcap > 0.0f ? r.softcap * log2e : 0.0f);
    arg_i32(&kf.args, r.window_left), arg_i32(&kf.args, r.window_right);
    if (tma)
        arg_bytes(&kf.args, maps[0].words, sizeof maps[0].words), arg_bytes(&kf.args, maps[1].words, sizeof maps[1].words),
            arg_u64(&kf.args, d_slots);
    if (fp8) /* per tensor: sc_per_head 0, sc_rows 0, k's factor at 1, v's at 2 */
        arg_u64(&kf.args, d_sc), arg_i32(&kf.args, 0), arg_i32(&kf.args, 0), arg_i32(&kf.args, 1), arg_i32(&kf.args, 2);
    if (pack)
        arg_u64(&kf.args, d_vt), arg_u64(&kf.args, 0), arg_i32(&kf.args, vt_keys);
    kf.grid[0] = groups_m, kf.grid[1] = (unsigned)H, kf.grid[2] = (unsigned)B, kf.block = (unsigned)(32 * warps);

    kernel *ks[2] = {pack ? &kp : NULL, &kf};
    const cached_program *ps[2] = {pack, fwd};
    for (int i = 0; i < 2; ++i) {
        if (!ks[i])
            continue;
        int blocks = 0, regs = 0;
        cu.occupancy(&blocks, ks[i]->fn, (int)ks[i]->block, 0);
        cu.func_get_attribute(&regs, FUNC_NUM_REGS, ks[i]->fn);
        printf("  %-7s grid (%u,%u,%u) x %u work-items, %d registers, %d work-groups an SM by the occupancy "
               "calculator%s\n",
               ks[i]->role, ks[i]->grid[0], ks[i]->grid[1], ks[i]->grid[2], ks[i]->block, regs, blocks,
               i && tma ? ", TMA copies" : "");
    }
    /* The checked run: the transpose, then the forward (the first flash_fwd launch is ncu's). */
    for (int i = 0; i < 2; ++i)
        if (ks[i])
            launch(ks[i], ps[i]);
    cu_check(cu.ctx_synchronize(), "the CUDA-launched forward");
    void *got = malloc(out_bytes > rows * 4 ? out_bytes : rows * 4);
    cu_check(cu.memcpy_dtoh(got, d_out, out_bytes), "cuMemcpyDtoH");
    size_t bad = differ("out", ref_out, got, out_bytes);
    cu_check(cu.memcpy_dtoh(got, d_lse, rows * 4), "cuMemcpyDtoH");
    bad += differ("lse", ref_lse, got, rows * 4);

    /* cuEvent times: each kernel on its own (mean of iters), then both back to back. */
    double per[2];
    const double total = time_kernels(ks, 2, iters, per);
    if (pack)
        printf("CUDA launches: V transpose %.1f us, ", per[0] * 1e3);
    else
        printf("CUDA launches: ");
    printf("forward %.1f us (cuEvents, mean of %d); back to back %.3f ms a forward, %.1f TFLOP/s\n", per[1] * 1e3,
           iters, total, flops / total * 1e-9);
    printf("%s\n", bad ? "RESULT: the CUDA launches DIFFER from flashcl's" : "RESULT: bitwise equal to flashcl's");
    flashcl_context_destroy(ctx);
    return bad ? 1 : 0;
}
