/* copy_tiles.c: how fast a work-group can stream device memory through __local, by tile shape,
 * to choose the decode kernel's (bench/read_bw.c measures the plain access patterns). NVIDIA
 * only (inline PTX cp.async); not part of the build. On the GPU machine:
 *
 *   gcc -O2 -std=c11 bench/copy_tiles.c -o /tmp/copy_tiles -lOpenCL && /tmp/copy_tiles [MiB [methods]]
 *
 * Each work-group streams its share of a zero-filled buffer (default 4096 MiB) tile by tile
 * through NBUF __local buffers and folds one word a work-item of each landed tile, so nothing is
 * written and nothing can be optimised away. Printed: the median GB/s of 10 runs (profiling
 * events, START -> END) per copy method, access pattern, work-group size, tile bytes, buffers
 * and work-groups per compute unit.
 *   methods  cp      cp.async.cg 16 bytes a copy, the whole group copying each tile, then
 *                    cp.async.wait_group + a barrier (FA2's copies, one group-wide tile)
 *            warp    the same per warp: each warp streams its own tiles through its own buffers,
 *                    bar.warp.sync only (flashcl's decode kernel at 4 KB tiles a warp)
 *            ldst    16-byte loads of the next tile into registers while the current one is
 *                    read, then stored to __local (the register-staged copy, NBUF 1)
 *            wldst   the same per warp, by ld.global.nc.L1::no_allocate, bar.warp.sync only
 *                    (the decode kernel's REG_COPY; tile KB a warp)
 *            wld     the same loads a tile ahead, folded straight from registers: no __local
 *                    (a decode loop whose tiles go into the mma operands as loaded)
 *   pad KB   an extra __local array a group (touched once), as a kernel's other buffers: it
 *            takes its share of the SM's L1 for the shared-memory carveout
 *   patterns slab    each group a contiguous run of the buffer
 *            heads   flashcl's paged K: shuffled 32 KB pages of [16 tokens][8 heads][256 B],
 *                    group g reading head g % 8 (256-byte rows 2 KB apart)
 *            hseq    the same rows, the pages in order
 *            h2mb    the same rows, the pages shuffled within 2 MB runs, the runs shuffled
 *            hmaj    shuffled pages laid out [8 heads][16 tokens][256 B]: group g reads head
 *                    g % 8's 4 KB run of each page
 *            pairs   shuffled pages, each group reading two neighbouring heads (512-byte rows)
 *            pages   shuffled pages, each group reading whole 32 KB pages
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"

static const char *src =
    "uint saddr(__local const void *p) {\n"
    "  uint a;\n"
    "  __asm__(\"{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\" : \"=r\"(a) : \"l\"((ulong)p));\n"
    "  return a;\n"
    "}\n"
    /* ADDR(e): the uint4 at index e of this group's stream; n: its length in uint4. */
    /* HEADS (1, 2 or 8): the kv heads a group reads side by side, rows of HEADS x 256 bytes. */
    "#if HEADS\n"
    "#define STREAM const uint hsel = get_group_id(0) % (8 / HEADS); \\\n"
    "  __global const uint *t = table + (get_group_id(0) / (8 / HEADS)) * per; const long n = per * 256 * HEADS\n"
    "#if HEAD_MAJOR\n" /* pages laid out [head][token][dim]: a head's part of a page is one 4 KB run */
    "#define ADDR(e) (a + (((ulong)t[(e) / (256 * HEADS)] << 11) + hsel * 256 * HEADS + (e) % (256 * HEADS)))\n"
    "#else\n"
    "#define ADDR(e) (a + (((ulong)t[(e) / (256 * HEADS)] << 11) + (((e) / (16 * HEADS)) % 16) * 128 + \\\n"
    "                      hsel * 16 * HEADS + (e) % (16 * HEADS)))\n"
    "#endif\n"
    "#else\n"
    "#define STREAM __global const uint4 *p = a + get_group_id(0) * per; const long n = per\n"
    "#define ADDR(e) (p + (e))\n"
    "#endif\n"
    "#define CP(dst, src) __asm__ __volatile__(\"cp.async.cg.shared.global [%0], [%1], 16;\" :: \"r\"(dst), \"l\"(src) : \"memory\")\n"
    "#define COMMIT() __asm__ __volatile__(\"cp.async.commit_group;\" ::: \"memory\")\n"
    "#define WAIT(n) __asm__ __volatile__(\"cp.async.wait_group %0;\" :: \"n\"(n) : \"memory\")\n"
    "#define WSYNC() __asm__ __volatile__(\"bar.warp.sync 0xffffffff;\" ::: \"memory\")\n"
    "uint4 ldnc(__global const uint4 *p) {\n"
    "  uint4 v;\n"
    "  __asm__ __volatile__(\"ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\"\n"
    "                       : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w) : \"l\"((ulong)p));\n"
    "  return v;\n"
    "}\n"
    "#if METHOD == 1 || METHOD == 3\n" /* per-warp buffers */
    "#define BUF_COPIES (WG / 32)\n"
    "#else\n"
    "#define BUF_COPIES 1\n"
    "#endif\n"
    "#if PAD\n"
    "#define PAD_TOUCH __local uint4 pad[PAD * 64]; pad[tid % (PAD * 64)] = (uint4)(uint)(per >> 62); barrier(CLK_LOCAL_MEM_FENCE); acc ^= pad[(tid + 1) % (PAD * 64)]\n"
    "#else\n"
    "#define PAD_TOUCH\n"
    "#endif\n"
    "#define OUT(acc) if ((acc.x | acc.y | acc.z | acc.w) != 0u) out[get_global_id(0)] = acc.x ^ acc.y ^ acc.z ^ acc.w\n"
    "__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))\n"
    "void copy(__global const uint4 *restrict a, __global const uint *restrict table, ulong per,\n"
    "          __global uint *out) {\n"
    "#if METHOD != 4\n"
    "  __local uint4 buf[NBUF * TILE * BUF_COPIES];\n"
    "#endif\n"
    "  const int tid = get_local_id(0);\n"
    "  STREAM;\n"
    "  uint4 acc = 0;\n"
    "  PAD_TOUCH;\n"
    "#if METHOD == 0\n" /* the group's tiles */
    "  const long tiles = n / TILE;\n"
    "  const uint d0 = saddr(buf);\n"
    "  for (long i = 0; i < tiles + NBUF - 1; ++i) {\n"
    "    if (i < tiles)\n"
    "      for (int j = 0; j < TILE / WG; ++j)\n"
    "        CP(d0 + (uint)((i % NBUF) * TILE + tid + WG * j) * 16u, ADDR(i * TILE + tid + WG * j));\n"
    "    COMMIT();\n"
    "    if (i >= NBUF - 1) {\n"
    "      WAIT(NBUF - 1);\n"
    "      barrier(CLK_LOCAL_MEM_FENCE);\n"
    "      acc ^= buf[((i - NBUF + 1) % NBUF) * TILE + tid];\n"
    "      barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "  }\n"
    "#elif METHOD == 1\n" /* each warp its own tiles of TILE uint4 through its own NBUF buffers */
    "  const int warp = tid / 32, lane = tid % 32, warps = WG / 32;\n"
    "  const long tiles = n / TILE, mine = (tiles - warp + warps - 1) / warps;\n"
    "  __local uint4 *wb = buf + warp * NBUF * TILE;\n"
    "  const uint d0 = saddr(wb);\n"
    "  for (long i = 0; i < mine + NBUF - 1; ++i) {\n"
    "    if (i < mine)\n"
    "      for (int j = 0; j < TILE / 32; ++j)\n"
    "        CP(d0 + (uint)((i % NBUF) * TILE + lane + 32 * j) * 16u, ADDR((warp + i * warps) * TILE + lane + 32 * j));\n"
    "    COMMIT();\n"
    "    if (i >= NBUF - 1) {\n"
    "      WAIT(NBUF - 1);\n"
    "      WSYNC();\n"
    "      acc ^= wb[((i - NBUF + 1) % NBUF) * TILE + lane];\n"
    "      WSYNC();\n"
    "    }\n"
    "  }\n"
    "#elif METHOD == 3\n" /* register-staged per warp, non-coherent loads (the decode kernel's REG_COPY) */
    "  const int warp = tid / 32, lane = tid % 32, warps = WG / 32;\n"
    "  const long tiles = n / TILE, mine = (tiles - warp + warps - 1) / warps;\n"
    "  __local uint4 *wb = buf + warp * TILE;\n"
    "  uint4 r[TILE / 32];\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < TILE / 32; ++j) r[j] = mine > 0 ? ldnc(ADDR(warp * TILE + lane + 32 * j)) : (uint4)0;\n"
    "  for (long i = 0; i < mine; ++i) {\n"
    "    WSYNC();\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < TILE / 32; ++j) wb[lane + 32 * j] = r[j];\n"
    "    if (i + 1 < mine)\n"
    "#pragma unroll\n"
    "      for (int j = 0; j < TILE / 32; ++j) r[j] = ldnc(ADDR((warp + (i + 1) * warps) * TILE + lane + 32 * j));\n"
    "    WSYNC();\n"
    "    acc ^= wb[(lane * 7) % TILE];\n"
    "  }\n"
    "#elif METHOD == 4\n" /* per warp, a tile ahead in registers, folded from them */
    "  const int warp = tid / 32, lane = tid % 32, warps = WG / 32;\n"
    "  const long tiles = n / TILE, mine = (tiles - warp + warps - 1) / warps;\n"
    "  uint4 r[TILE / 32];\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < TILE / 32; ++j) r[j] = mine > 0 ? ldnc(ADDR(warp * TILE + lane + 32 * j)) : (uint4)0;\n"
    "  for (long i = 0; i < mine; ++i) {\n"
    "    uint4 cur[TILE / 32];\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < TILE / 32; ++j) cur[j] = r[j];\n"
    "    if (i + 1 < mine)\n"
    "#pragma unroll\n"
    "      for (int j = 0; j < TILE / 32; ++j) r[j] = ldnc(ADDR((warp + (i + 1) * warps) * TILE + lane + 32 * j));\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < TILE / 32; ++j) acc ^= cur[j];\n"
    "  }\n"
    "#else\n" /* register-staged */
    "  const long tiles = n / TILE;\n"
    "  uint4 r[TILE / WG];\n"
    "  for (int j = 0; j < TILE / WG; ++j) r[j] = tiles ? *ADDR(tid + WG * j) : (uint4)0;\n"
    "  for (long i = 0; i < tiles; ++i) {\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (int j = 0; j < TILE / WG; ++j) buf[tid + WG * j] = r[j];\n"
    "    if (i + 1 < tiles)\n"
    "      for (int j = 0; j < TILE / WG; ++j) r[j] = *ADDR((i + 1) * TILE + tid + WG * j);\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    acc ^= buf[(tid * 7) % TILE];\n"
    "  }\n"
    "#endif\n"
    "  OUT(acc);\n"
    "}\n";

int main(int argc, char **argv) {
    const size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 4096;
    cl_device_id dev;
    cl_uint cus;
    cl_context ctx;
    cl_command_queue q = probe_open("nvidia", NULL, &dev, &ctx, &cus);
    if (!q)
        return 1;
    cl_int err;
    const size_t bytes = mib << 20;
    cl_mem buf, out;
    if (probe_stream_buffers(ctx, q, cus, bytes, &buf, &out))
        return 1;
    /* Page tables of the "heads" patterns, every 32 KB page once: shuffled (xorshift, fixed seed),
     * in order, and shuffled within 2 MB runs of 64 pages whose order is shuffled too (a table
     * that jumps as often as the shuffled one but stays in a run for 64 pages: what an
     * allocator keeping a sequence's pages together would give). */
    const size_t pages = bytes / 32768, runs = pages / 64;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    uint32_t *perm[3] = {probe_shuffled(pages, &seed), malloc(pages * 4), malloc(pages * 4)};
    uint32_t *run_order = probe_shuffled(runs, &seed);
    if (!perm[0] || !perm[1] || !perm[2] || !run_order)
        return 1;
    for (size_t i = 0; i < pages; ++i)
        perm[1][i] = (uint32_t)i;
    for (size_t r = 0; r < runs; ++r) {
        uint32_t *in_run = probe_shuffled(64, &seed);
        for (size_t j = 0; j < 64; ++j)
            perm[2][r * 64 + j] = run_order[r] * 64 + in_run[j];
        free(in_run);
    }
    cl_mem tables[3];
    for (int i = 0; i < 3; ++i) {
        tables[i] = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, pages * 4, perm[i], &err);
        free(perm[i]);
    }
    free(run_order);
    clFinish(q);
    /* name, kv heads a group reads side by side (0: a slab), page table */
    static const struct {
        const char *name;
        int heads, table, head_major;
    } patterns[] = {{"slab", 0, 0, 0},  {"heads", 1, 0, 0}, {"hseq", 1, 1, 0}, {"h2mb", 1, 2, 0},
                    {"hmaj", 1, 0, 1}, {"pairs", 2, 0, 0}, {"pages", 8, 0, 0}};

    /* method, work-group size, tile KB (per warp for "warp", "wldst", "wld"), buffers (each
     * warp's for "warp"), extra __local KB */
    static const struct {
        int method, wg, tile_kb, nbuf, pad_kb;
    } cfg[] = {
        {1, 64, 8, 2, 0},  {1, 64, 4, 4, 0},   {1, 128, 4, 2, 0},  {1, 64, 4, 2, 0},  {0, 64, 8, 2, 0},
        {0, 64, 16, 2, 0}, {0, 128, 8, 2, 0},  {0, 128, 16, 2, 0}, {0, 128, 8, 4, 0}, {0, 128, 12, 3, 0},
        {0, 256, 16, 2, 0}, {0, 128, 4, 4, 0}, {2, 128, 8, 1, 0},  {2, 128, 16, 1, 0}, {2, 256, 16, 1, 0},
        {2, 256, 32, 1, 0}, {3, 64, 8, 1, 0},  {3, 64, 8, 1, 16},  {3, 64, 4, 1, 0},  {3, 128, 8, 1, 0},
        {4, 64, 8, 1, 0},   {4, 64, 8, 1, 32}, {4, 64, 4, 1, 0},   {4, 128, 8, 1, 0}, {4, 64, 16, 1, 0},
    };
    static const char *methods[] = {"cp", "warp", "ldst", "wldst", "wld"};
    const char *only = argc > 2 ? argv[2] : NULL; /* a comma list of methods to run */
    printf("%u compute units, %zu MiB read per run; GB/s (median of 10, START -> END)\n", cus, mib);
    printf("%-5s %-6s %5s %8s %5s %6s %7s %9s\n", "meth", "pat", "local", "tile_kb", "nbuf", "pad_kb", "wgs/cu",
           "GB/s");
    for (size_t pat = 0; pat < sizeof patterns / sizeof patterns[0]; ++pat)
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; ++c) {
            const int heads = patterns[pat].heads, slices = heads ? 8 / heads : 1; /* groups a page slice */
            cl_mem table = tables[patterns[pat].table];
            if (only) {
                char list[256];
                snprintf(list, sizeof list, ",%s,", only);
                char name[16];
                snprintf(name, sizeof name, ",%s,", methods[cfg[c].method]);
                if (!strstr(list, name))
                    continue;
            }
            const int tile = cfg[c].tile_kb * 64; /* uint4 */
            char opts[256];
            snprintf(opts, sizeof opts, "-DHEADS=%d -DHEAD_MAJOR=%d -DMETHOD=%d -DWG=%d -DTILE=%d -DNBUF=%d -DPAD=%d", heads,
                     patterns[pat].head_major,
                     cfg[c].method, cfg[c].wg, tile, cfg[c].nbuf, cfg[c].pad_kb);
            cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
            if (clBuildProgram(prog, 1, &dev, opts, NULL, NULL) != CL_SUCCESS) {
                char log[16384] = "";
                clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
                fprintf(stderr, "build failed (%s):\n%s\n", opts, log);
                return 1;
            }
            cl_kernel k = clCreateKernel(prog, "copy", &err);
            static const int per_cu[] = {1, 2, 3, 4, 6};
            for (int wi = 0; wi < 5; ++wi) {
                size_t groups = (size_t)cus * (size_t)per_cu[wi];
                cl_ulong per;
                double read;
                if (heads) { /* slices of the table's 32 KB pages, 8 / heads groups a slice */
                    groups = groups / (size_t)slices * (size_t)slices;
                    const cl_ulong page_uint4 = 256 * (cl_ulong)heads; /* a group's part of a page */
                    per = pages / (groups / (size_t)slices);
                    per = per * page_uint4 / (cl_ulong)tile * (cl_ulong)tile / page_uint4; /* whole tiles */
                    read = (double)per * (double)(groups / (size_t)slices) * 32768;
                } else {
                    per = bytes / 16 / groups / (cl_ulong)tile * (cl_ulong)tile;
                    read = (double)per * (double)groups * 16;
                }
                clSetKernelArg(k, 0, sizeof buf, &buf);
                clSetKernelArg(k, 1, sizeof table, &table);
                clSetKernelArg(k, 2, sizeof per, &per);
                clSetKernelArg(k, 3, sizeof out, &out);
                const double gbps = probe_median_gbps(q, k, groups * (size_t)cfg[c].wg, (size_t)cfg[c].wg, read);
                printf("%-5s %-6s %5d %8d %5d %6d %7d %9.1f\n", methods[cfg[c].method], patterns[pat].name,
                       cfg[c].wg, cfg[c].tile_kb, cfg[c].nbuf, cfg[c].pad_kb, per_cu[wi], gbps);
                fflush(stdout);
            }
            clReleaseKernel(k);
            clReleaseProgram(prog);
        }
    return 0;
}
