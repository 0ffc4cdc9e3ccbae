/* tma_probe.c: can an OpenCL kernel on NVIDIA's Hopper use the Tensor Memory Accelerator, and what
 * does it read at? Not part of the build; on the GPU machine:
 *
 *   gcc -O2 -std=c11 bench/tma_probe.c -o /tmp/tma_probe -lOpenCL -ldl && /tmp/tma_probe [MiB]
 *
 * Why: 034269e's diagnostics (BENCHMARKS.md) showed the wgmma forward's per-thread cp.async tile
 * copies running serially with its tensor-core products, 1.1 of 3.3 ms at (4,32,4096,128). FA3
 * and cuDNN copy a tile with one cp.async.bulk.tensor issued by one thread. That instruction
 * reads a tensor map, a 128-byte descriptor that only the CUDA driver encodes
 * (cuTensorMapEncodeTiled); OpenCL has no such call. This probe checks the way round:
 *   1. the device address of an OpenCL buffer, from a kernel that stores its pointer;
 *   2. cuTensorMapEncodeTiled from libcuda.so.1 (dlopen: the library that NVIDIA's OpenCL
 *      itself sits on) over that address, for a [rows][128] float16 matrix (a K or V head at
 *      D=128) in boxes of 64 columns (one 128-byte panel, as the kernels' SW128 layout) and
 *      128-byte swizzle;
 *   3. the map copied into a buffer and read by an OpenCL kernel's inline PTX
 *      (cp.async.bulk.tensor, completion on an mbarrier).
 * It prints whether the bytes land where the kernels' SW128 layout puts them (chunk c of row r of
 * a panel at r*128 + 16*(c ^ r%8)), rows past the end zero-filled; then GB/s, median of 10
 * (profiling events), of work-groups each streaming a contiguous slab of the matrix through a
 * ring of four 8 KB tiles, by TMA (one thread issues) and by cp.async (128 work-items, 16 bytes
 * each, as the kernels copy), 1..6 work-groups per compute unit.
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"

#define COLS 128     /* float16 columns: 256-byte rows */
#define BOX_ROWS 64  /* rows of the checked tile */
#define SBOX_ROWS 32 /* rows of a streamed tile: 32 x 256 B = 8 KB */
#define STAGES 4

static const char *src =
    "#define STR_(x) #x\n"
    "#define STR(x) STR_(x)\n"
    "uint saddr(__local const void *p) {\n"
    "  uint a;\n"
    "  __asm__(\"{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\" : \"=r\"(a) : \"l\"((ulong)p));\n"
    "  return a;\n"
    "}\n"
    "__kernel void addr_of(__global const ushort *buf, __global ulong *out) { out[0] = (ulong)buf; }\n"
    "void mbar_init(uint bar) {\n"
    "  __asm__ __volatile__(\"mbarrier.init.shared::cta.b64 [%0], 1;\" :: \"r\"(bar) : \"memory\");\n"
    "  __asm__ __volatile__(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");\n"
    "}\n"
    "void mbar_expect(uint bar, uint bytes) {\n"
    "  __asm__ __volatile__(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\" :: \"r\"(bar), \"r\"(bytes) : \"memory\");\n"
    "}\n"
    "void mbar_wait(uint bar, uint phase) {\n"
    "  uint done = 0;\n"
    "  while (!done)\n"
    "    __asm__ __volatile__(\"{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\"\n"
    "                         : \"=r\"(done) : \"r\"(bar), \"r\"(phase) : \"memory\");\n"
    "}\n"
    /* box (64 columns from col, BOX rows from row) of the map into shared address dst */
    "void tma_2d(uint dst, __global const uchar *map, int col, int row, uint bar) {\n"
    "  __asm__ __volatile__(\"cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes\"\n"
    "                       \" [%0], [%1, {%2, %3}], [%4];\"\n"
    "                       :: \"r\"(dst), \"l\"((ulong)map), \"r\"(col), \"r\"(row), \"r\"(bar) : \"memory\");\n"
    "}\n"
    /* One 64-row tile at row0, both panels, copied out byte for byte. */
    "__kernel __attribute__((reqd_work_group_size(128, 1, 1)))\n"
    "void tile(__global const uchar *map, int row0, __global uint4 *out) {\n"
    "  __local uint4 raw[(2 * 64 * 128 + 1024) / 16];\n"
    "  __local ulong bar_mem;\n"
    "  const uint base = saddr(raw), off = (1024u - (base & 1023u)) & 1023u, dst = base + off;\n"
    "  __local const uint4 *t = raw + off / 16u;\n"
    "  const uint bar = saddr(&bar_mem);\n"
    "  const int tid = get_local_id(0);\n"
    "  if (tid == 0) {\n"
    "    __asm__ __volatile__(\"fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\" :: \"l\"((ulong)map) : \"memory\");\n"
    "    mbar_init(bar);\n"
    "  }\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  if (tid == 0) {\n"
    "    mbar_expect(bar, 2 * 64 * 128);\n"
    "    tma_2d(dst, map, 0, row0, bar);\n"
    "    tma_2d(dst + 64 * 128, map, 64, row0, bar);\n"
    "  }\n"
    "  mbar_wait(bar, 0);\n"
    "  for (int i = tid; i < 2 * 64 * 128 / 16; i += 128) out[i] = t[i];\n"
    "}\n"
    /* Work-group g streams rows [g*per, (g+1)*per) in 32-row tiles through STAGES slots; one
       work-item issues. Folds one word of each tile so that the reads count. */
    "__kernel __attribute__((reqd_work_group_size(128, 1, 1)))\n"
    "void tma_stream(__global const uchar *map, int per, __global uint *out) {\n"
    "  __local uint4 raw[(STAGES * SBOX * 256 + 1024) / 16];\n"
    "  __local ulong bars[STAGES];\n"
    "  const uint base = saddr(raw), off = (1024u - (base & 1023u)) & 1023u, dst = base + off;\n"
    "  __local const uint *t = (__local const uint *)(raw + off / 16u);\n"
    "  if (get_local_id(0) != 0) return;\n"
    "  for (int s = 0; s < STAGES; ++s) mbar_init(saddr(&bars[s]));\n"
    "  const int row0 = get_group_id(0) * per, tiles = per / SBOX;\n"
    "  uint acc = 0;\n"
    "  for (int i = 0; i < tiles + STAGES; ++i) {\n"
    "    const int s = i % STAGES;\n"
    "    const uint bar = saddr(&bars[s]);\n"
    "    if (i >= STAGES) { mbar_wait(bar, (uint)((i / STAGES - 1) & 1)); acc ^= t[s * SBOX * 64 + (i & 63)]; }\n"
    "    if (i < tiles) {\n"
    "      const uint d = dst + (uint)(s * SBOX * 256);\n"
    "      mbar_expect(bar, SBOX * 256);\n"
    "      tma_2d(d, map, 0, row0 + i * SBOX, bar);\n"
    "      tma_2d(d + SBOX * 128, map, 64, row0 + i * SBOX, bar);\n"
    "    }\n"
    "  }\n"
    "  if (acc == 0x9e3779b9u) out[get_group_id(0)] = acc;\n"
    "}\n"
    /* The same stream by cp.async, 16 bytes a work-item, as the kernels copy (each work-item
       reuses its own chunks of a slot, so no barrier is needed). */
    "__kernel __attribute__((reqd_work_group_size(128, 1, 1)))\n"
    "void cp_stream(__global const uint4 *a, int per, __global uint *out) {\n"
    "  __local uint4 raw[STAGES * SBOX * 16];\n"
    "  const uint dst = saddr(raw);\n"
    "  const int tid = get_local_id(0), tiles = per / SBOX;\n"
    "  __global const uint4 *p = a + (ulong)get_group_id(0) * per * 16;\n"
    "  uint acc = 0;\n"
    "  for (int i = 0; i < tiles + STAGES - 1; ++i) {\n"
    "    if (i < tiles) {\n"
    "      const int s = i % STAGES;\n"
    "      for (int c = tid; c < SBOX * 16; c += 128)\n"
    "        __asm__ __volatile__(\"cp.async.cg.shared.global [%0], [%1], 16;\"\n"
    "                             :: \"r\"(dst + (uint)((s * SBOX * 16 + c) * 16)), \"l\"((ulong)(p + (ulong)i * SBOX * 16 + c)) : \"memory\");\n"
    "    }\n"
    "    __asm__ __volatile__(\"cp.async.commit_group;\" ::: \"memory\");\n"
    "    if (i >= STAGES - 1) {\n"
    "      __asm__ __volatile__(\"cp.async.wait_group \" STR(STAGES_M1) \";\" ::: \"memory\");\n"
    "      acc ^= ((__local const uint *)raw)[((i - STAGES + 1) % STAGES) * SBOX * 64 + tid];\n"
    "    }\n"
    "  }\n"
    "  if (acc == 0x9e3779b9u) out[get_group_id(0) * 128 + tid] = acc;\n"
    "}\n";

/* The CUDA driver entry points used, by value types (no cuda.h needed to build this). */
typedef struct {
    _Alignas(128) uint64_t opaque[16];
} tensor_map;
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_device_get_fn)(int *, int);
typedef int (*cu_ctx_retain_fn)(void **, int);
typedef int (*cu_ctx_set_fn)(void *);
typedef int (*cu_encode_fn)(tensor_map *, int dtype, unsigned rank, void *addr, const uint64_t *dims,
                            const uint64_t *strides, const unsigned *box, const unsigned *elem_strides,
                            int interleave, int swizzle, int l2, int oob);
enum { CU_F16 = 6, CU_SWIZZLE_128B = 3, CU_L2_256B = 3 };

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cl_int e_ = (x);                                                                           \
        if (e_ != CL_SUCCESS) {                                                                    \
            fprintf(stderr, "%s: error %d (line %d)\n", #x, e_, __LINE__);                         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static cl_context ctx;
static cl_command_queue queue;
static cl_program prog;

static double run_ms(cl_kernel k, size_t groups) {
    size_t local = 128, global = groups * 128;
    cl_event ev;
    CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, &local, 0, NULL, &ev));
    CHECK(clWaitForEvents(1, &ev));
    cl_ulong a, b;
    CHECK(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof a, &a, NULL));
    CHECK(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL));
    clReleaseEvent(ev);
    return (double)(b - a) * 1e-6;
}

/* Median GB/s of 10 runs of k over groups work-groups reading bytes. */
static double gbps(cl_kernel k, size_t groups, double bytes) {
    double t[10];
    run_ms(k, groups);
    for (int i = 0; i < 10; ++i)
        t[i] = run_ms(k, groups);
    qsort(t, 10, sizeof t[0], probe_cmp_double);
    return bytes / (0.5 * (t[4] + t[5]) * 1e-3) / 1e9;
}

int main(int argc, char **argv) {
    const size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 1024;
    const size_t rows = mib * 1024 * 1024 / (COLS * 2);
    cl_device_id dev;
    cl_uint cus;
    if (!(queue = probe_open("nvidia", NULL, &dev, &ctx, &cus)))
        return 1;
    cl_int err;
    prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK(err);
    char opts[128];
    snprintf(opts, sizeof opts, "-DSTAGES=%d -DSTAGES_M1=%d -DSBOX=%d", STAGES, STAGES - 1, SBOX_ROWS);
    if (clBuildProgram(prog, 1, &dev, opts, NULL, NULL) != CL_SUCCESS) {
        static char log[1 << 16];
        clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        fprintf(stderr, "build failed:\n%s\n", log);
        return 1;
    }

    /* The matrix: element (r, c) = a hash of both, so that a misplaced chunk shows. */
    const size_t bytes = rows * COLS * 2;
    cl_mem mat = clCreateBuffer(ctx, CL_MEM_READ_ONLY, bytes, NULL, &err);
    CHECK(err);
    uint16_t *host = malloc(bytes);
    for (size_t r = 0; r < rows; ++r)
        for (int c = 0; c < COLS; ++c)
            host[r * COLS + c] = (uint16_t)((r * 2654435761u + (size_t)c * 40503u) >> 7) | 1u;
    CHECK(clEnqueueWriteBuffer(queue, mat, CL_TRUE, 0, bytes, host, 0, NULL, NULL));

    /* 1. its device address */
    cl_mem addr_buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 8, NULL, &err);
    CHECK(err);
    cl_kernel k_addr = clCreateKernel(prog, "addr_of", &err);
    CHECK(err);
    CHECK(clSetKernelArg(k_addr, 0, sizeof mat, &mat));
    CHECK(clSetKernelArg(k_addr, 1, sizeof addr_buf, &addr_buf));
    size_t one = 1;
    CHECK(clEnqueueNDRangeKernel(queue, k_addr, 1, NULL, &one, &one, 0, NULL, NULL));
    uint64_t addr = 0;
    CHECK(clEnqueueReadBuffer(queue, addr_buf, CL_TRUE, 0, 8, &addr, 0, NULL, NULL));
    printf("OpenCL buffer of %zu MiB at device address 0x%llx\n", mib, (unsigned long long)addr);

    /* 2. the tensor map, encoded by the CUDA driver */
    void *cu = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cu) /* where NVIDIA-OPENCL.md's machine keeps the driver's libraries */
        cu = dlopen("/usr/local/nvidia/lib64/libcuda.so.1", RTLD_NOW);
    if (!cu) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    cu_init_fn cu_init = (cu_init_fn)dlsym(cu, "cuInit");
    cu_device_get_fn cu_device_get = (cu_device_get_fn)dlsym(cu, "cuDeviceGet");
    cu_ctx_retain_fn cu_ctx_retain = (cu_ctx_retain_fn)dlsym(cu, "cuDevicePrimaryCtxRetain");
    cu_ctx_set_fn cu_ctx_set = (cu_ctx_set_fn)dlsym(cu, "cuCtxSetCurrent");
    cu_encode_fn encode = (cu_encode_fn)dlsym(cu, "cuTensorMapEncodeTiled");
    if (!cu_init || !cu_device_get || !cu_ctx_retain || !cu_ctx_set || !encode) {
        fprintf(stderr, "libcuda.so.1 lacks an entry point\n");
        return 1;
    }
    int cu_dev = 0, rc = cu_init(0);
    printf("cuInit: %d\n", rc);
    const uint64_t dims[2] = {COLS, rows}, strides[1] = {COLS * 2};
    const unsigned elem[2] = {1, 1};
    tensor_map map, smap;
    unsigned box[2] = {64, BOX_ROWS};
    rc = encode(&map, CU_F16, 2, (void *)(uintptr_t)addr, dims, strides, box, elem, 0, CU_SWIZZLE_128B, CU_L2_256B, 0);
    printf("cuTensorMapEncodeTiled without a CUDA context: %d\n", rc);
    if (rc != 0) {
        void *cu_ctx = NULL;
        rc = cu_device_get(&cu_dev, 0);
        rc = rc ? rc : cu_ctx_retain(&cu_ctx, cu_dev);
        rc = rc ? rc : cu_ctx_set(cu_ctx);
        rc = rc ? rc : encode(&map, CU_F16, 2, (void *)(uintptr_t)addr, dims, strides, box, elem, 0, CU_SWIZZLE_128B,
                              CU_L2_256B, 0);
        printf("... with the primary context current: %d\n", rc);
        if (rc != 0)
            return 1;
    }
    box[1] = SBOX_ROWS;
    rc = encode(&smap, CU_F16, 2, (void *)(uintptr_t)addr, dims, strides, box, elem, 0, CU_SWIZZLE_128B, CU_L2_256B, 0);
    if (rc != 0) {
        fprintf(stderr, "the streaming map: %d\n", rc);
        return 1;
    }
    cl_mem map_buf = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof map, &map, &err);
    CHECK(err);
    cl_mem smap_buf = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof smap, &smap, &err);
    CHECK(err);

    /* 3. one tile, checked chunk by chunk against the SW128 layout */
    const size_t tile_bytes = 2 * 64 * 128;
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, tile_bytes, NULL, &err);
    CHECK(err);
    cl_kernel k_tile = clCreateKernel(prog, "tile", &err);
    CHECK(err);
    uint16_t *got = malloc(tile_bytes);
    const int starts[3] = {0, 37, (int)rows - 20};
    int bad_total = 0;
    for (int si = 0; si < 3; ++si) {
        const int row0 = starts[si];
        memset(got, 0xAB, tile_bytes);
        CHECK(clEnqueueWriteBuffer(queue, out, CL_TRUE, 0, tile_bytes, got, 0, NULL, NULL));
        CHECK(clSetKernelArg(k_tile, 0, sizeof map_buf, &map_buf));
        CHECK(clSetKernelArg(k_tile, 1, sizeof row0, &row0));
        CHECK(clSetKernelArg(k_tile, 2, sizeof out, &out));
        size_t l = 128;
        CHECK(clEnqueueNDRangeKernel(queue, k_tile, 1, NULL, &l, &l, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(queue, out, CL_TRUE, 0, tile_bytes, got, 0, NULL, NULL));
        int bad = 0;
        for (int h = 0; h < 2; ++h)
            for (int r = 0; r < 64; ++r)
                for (int c = 0; c < 8; ++c)
                    for (int e = 0; e < 8; ++e) {
                        const size_t at = (size_t)h * 64 * 64 + (size_t)r * 64 + (size_t)((c ^ (r % 8)) * 8 + e);
                        const size_t gr = (size_t)row0 + (size_t)r;
                        const uint16_t want = gr < rows ? host[gr * COLS + (size_t)h * 64 + (size_t)c * 8 + (size_t)e] : 0;
                        if (got[at] != want && bad++ < 3)
                            printf("  row0 %d: panel %d row %d chunk %d element %d: got 0x%04x, want 0x%04x\n", row0,
                                   h, r, c, e, got[at], want);
                    }
        printf("tile at row %d: %s (%d of %zu elements wrong)\n", row0, bad ? "WRONG" : "exact, SW128 layout", bad,
               tile_bytes / 2);
        bad_total += bad;
    }

    /* 4. streaming: TMA against cp.async */
    cl_mem sink = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)cus * 8 * 128 * 4, NULL, &err);
    CHECK(err);
    cl_kernel k_tma = clCreateKernel(prog, "tma_stream", &err);
    CHECK(err);
    cl_kernel k_cp = clCreateKernel(prog, "cp_stream", &err);
    CHECK(err);
    printf("streaming %zu MiB, %d-row tiles (8 KB), %d slots; GB/s (median of 10):\n", mib, SBOX_ROWS, STAGES);
    printf("%-16s %10s %10s\n", "groups per CU", "TMA", "cp.async");
    for (int per_cu = 1; per_cu <= 6; ++per_cu) {
        const size_t groups = (size_t)cus * (size_t)per_cu;
        const int per = (int)(rows / groups / SBOX_ROWS * SBOX_ROWS);
        const double read = (double)groups * per * COLS * 2;
        CHECK(clSetKernelArg(k_tma, 0, sizeof smap_buf, &smap_buf));
        CHECK(clSetKernelArg(k_tma, 1, sizeof per, &per));
        CHECK(clSetKernelArg(k_tma, 2, sizeof sink, &sink));
        CHECK(clSetKernelArg(k_cp, 0, sizeof mat, &mat));
        CHECK(clSetKernelArg(k_cp, 1, sizeof per, &per));
        CHECK(clSetKernelArg(k_cp, 2, sizeof sink, &sink));
        printf("%-16d %10.0f %10.0f\n", per_cu, gbps(k_tma, groups, read), gbps(k_cp, groups, read));
    }
    free(got);
    free(host);
    return bad_total ? 2 : 0;
}
