/* read_bw.c: how fast an OpenCL kernel can read device memory, by access pattern, to tell the
 * decode kernel's ceiling apart from the platform's. Not part of the build; on the GPU machine:
 *
 *   gcc -O2 -std=c11 bench/read_bw.c -o /tmp/read_bw -lOpenCL && /tmp/read_bw nvidia [MiB]
 *
 * Reads a zero-filled buffer (default 4096 MiB) and prints, per pattern, work-group size and
 * work-groups per compute unit, the median of 10 runs (profiling events, START -> END) as GB/s
 * of bytes read. Every kernel folds what it reads into one value and writes it only if it is
 * not zero, so nothing is written and nothing can be optimised away. Patterns:
 *   stride   each work-item reads uint4 at gid, gid + global size, ...: 4 loads in flight
 *   slab     work-group g reads its own contiguous 1/groups of the buffer, lanes consecutive,
 *            8 loads in flight per work-item (FA2's decode: one CTA per (sequence, head) streams
 *            its contiguous cache)
 *   page4k   the same over 4 KB pages in shuffled order, the page ids read from a table as
 *            flashcl's decode reads its page tables (a 16-token page of one head at D=128)
 *   page32k  32 KB pages (a 16-token page of all 8 heads)
 *   cpasync  (NVIDIA) slab, but through cp.async into __local as the decode kernel copies:
 *            64 work-items, each warp streams its own 8 KB tiles, two stages
 *   heads    flashcl's paged K: 32 KB pages of [16 tokens][8 heads][256 B] in shuffled order,
 *            group g reading head g % 8 of its pages (256-byte rows 2 KB apart), 8 groups
 *            sharing each page
 *   cp128, cp256  cpasync with an L2 prefetch hint (.L2::128B, .L2::256B) on each copy, as
 *            CUTLASS's sm80 cp.async issues it
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"

static const char *src =
    "#define FOLD(acc, v) acc ^= (v)\n"
    "#define OUT(acc) if ((acc.x | acc.y | acc.z | acc.w) != 0u) out[get_global_id(0)] = acc.x ^ acc.y ^ acc.z ^ acc.w\n"
    "__kernel void stride(__global const uint4 *restrict a, ulong n, __global uint *out) {\n"
    "  const ulong gs = get_global_size(0);\n"
    "  ulong i = get_global_id(0);\n"
    "  uint4 acc = 0;\n"
    "  for (; i + 3 * gs < n; i += 4 * gs) acc ^= a[i] ^ a[i + gs] ^ a[i + 2 * gs] ^ a[i + 3 * gs];\n"
    "  for (; i < n; i += gs) acc ^= a[i];\n"
    "  OUT(acc);\n"
    "}\n"
    "__kernel void slab(__global const uint4 *restrict a, ulong per, __global uint *out) {\n"
    "  __global const uint4 *p = a + get_group_id(0) * per;\n"
    "  const ulong ls = get_local_size(0);\n"
    "  ulong i = get_local_id(0);\n"
    "  uint4 acc = 0;\n"
    "  for (; i + 7 * ls < per; i += 8 * ls)\n"
    "    acc ^= p[i] ^ p[i + ls] ^ p[i + 2 * ls] ^ p[i + 3 * ls] ^ p[i + 4 * ls] ^ p[i + 5 * ls] ^\n"
    "           p[i + 6 * ls] ^ p[i + 7 * ls];\n"
    "  for (; i < per; i += ls) acc ^= p[i];\n"
    "  OUT(acc);\n"
    "}\n"
    /* per: pages per group; page: uint4 per page (a power of two, 1 << shift) */
    "__kernel void pages(__global const uint4 *restrict a, __global const uint *restrict table, ulong per,\n"
    "                    uint shift, __global uint *out) {\n"
    "  __global const uint *t = table + get_group_id(0) * per;\n"
    "  const ulong ls = get_local_size(0), n = per << shift, mask = (1ul << shift) - 1;\n"
    "  ulong i = get_local_id(0);\n"
    "  uint4 acc = 0;\n"
    "#define AT(e) a[((ulong)t[(e) >> shift] << shift) + ((e) & mask)]\n"
    "  for (; i + 7 * ls < n; i += 8 * ls)\n"
    "    acc ^= AT(i) ^ AT(i + ls) ^ AT(i + 2 * ls) ^ AT(i + 3 * ls) ^ AT(i + 4 * ls) ^ AT(i + 5 * ls) ^\n"
    "           AT(i + 6 * ls) ^ AT(i + 7 * ls);\n"
    "  for (; i < n; i += ls) acc ^= AT(i);\n"
    "  OUT(acc);\n"
    "}\n"
    /* The paged cache's own pattern: 32 KB pages of [16 tokens][8 heads][256 B]; group g reads
       head g % 8 of the pages in table slice g / 8: 256-byte rows 2 KB apart. */
    "__kernel void heads(__global const uint4 *restrict a, __global const uint *restrict table, ulong per,\n"
    "                    __global uint *out) {\n"
    "  const uint g = get_group_id(0), head = g % 8;\n"
    "  __global const uint *t = table + (g / 8) * per;\n"
    "  const ulong ls = get_local_size(0), n = per * 256; /* uint4 of this head: 16 rows x 16 a page */\n"
    "  ulong i = get_local_id(0);\n"
    "  uint4 acc = 0;\n"
    "#define AH(e) a[((ulong)t[(e) >> 8] << 11) + (((e) >> 4) & 15) * 128 + head * 16 + ((e) & 15)]\n"
    "  for (; i + 7 * ls < n; i += 8 * ls)\n"
    "    acc ^= AH(i) ^ AH(i + ls) ^ AH(i + 2 * ls) ^ AH(i + 3 * ls) ^ AH(i + 4 * ls) ^ AH(i + 5 * ls) ^\n"
    "           AH(i + 6 * ls) ^ AH(i + 7 * ls);\n"
    "  for (; i < n; i += ls) acc ^= AH(i);\n"
    "  OUT(acc);\n"
    "}\n"
    "#ifdef NV\n"
    "#if CP_L2 == 128\n"
    "#define CPA \"cp.async.cg.shared.global.L2::128B\"\n"
    "#elif CP_L2 == 256\n"
    "#define CPA \"cp.async.cg.shared.global.L2::256B\"\n"
    "#else\n"
    "#define CPA \"cp.async.cg.shared.global\"\n"
    "#endif\n"
    /* A __local pointer as a .shared address (its generic form converted), as common_nv.cl's shared_addr. */
    "uint saddr(__local const void *p) {\n"
    "  uint a;\n"
    "  __asm__(\"{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\" : \"=r\"(a) : \"l\"((ulong)p));\n"
    "  return a;\n"
    "}\n"
    /* 2 warps; warp w copies tiles w, w + 2, ... of the group's slab (512 uint4 = 8 KB each) into
       its two stages, waits for the older, folds one word of it per lane. */
    "__kernel __attribute__((reqd_work_group_size(64, 1, 1)))\n"
    "void cpasync(__global const uint4 *restrict a, ulong per, __global uint *out) {\n"
    "  __local uint4 buf[2 * 2 * 512];\n"
    "  const int warp = get_local_id(0) / 32, lane = get_local_id(0) % 32;\n"
    "  __global const uint4 *p = a + get_group_id(0) * per;\n"
    "  const long tiles = per / 512, mine = (tiles - warp + 1) / 2;\n"
    "  __local uint4 *wb = buf + warp * 1024;\n"
    "  uint4 acc = 0;\n"
    "  for (long i = 0; i <= mine; ++i) {\n"
    "    if (i < mine) {\n"
    "      __global const uint4 *s = p + (warp + 2 * i) * 512;\n"
    "      const uint d = saddr(wb + (i % 2) * 512);\n"
    "      for (int j = 0; j < 16; ++j)\n"
    "        __asm__ __volatile__(CPA \" [%0], [%1], 16;\" :: \"r\"(d + (uint)(lane + 32 * j) * 16u),\n"
    "                             \"l\"(s + lane + 32 * j) : \"memory\");\n"
    "    }\n"
    "    __asm__ __volatile__(\"cp.async.commit_group;\" ::: \"memory\");\n"
    "    if (i > 0) {\n"
    "      __asm__ __volatile__(\"cp.async.wait_group 1;\" ::: \"memory\");\n"
    "      __asm__ __volatile__(\"bar.warp.sync 0xffffffff;\" ::: \"memory\");\n"
    "      acc ^= wb[((i - 1) % 2) * 512 + lane];\n"
    "      __asm__ __volatile__(\"bar.warp.sync 0xffffffff;\" ::: \"memory\");\n"
    "    }\n"
    "  }\n"
    "  OUT(acc);\n"
    "}\n"
    "#endif\n";

int main(int argc, char **argv) {
    const char *want = argc > 1 ? argv[1] : "";
    const size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 4096;
    int nv = 0;
    cl_device_id dev;
    cl_uint cus;
    cl_context ctx;
    cl_command_queue q = probe_open(want, &nv, &dev, &ctx, &cus);
    if (!q)
        return 1;
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    /* One program per cp.async hint (the plain patterns come from the first). */
    cl_program progs[3];
    const char *hints[] = {"-DNV -DCP_L2=0", "-DNV -DCP_L2=128", "-DNV -DCP_L2=256"};
    for (int h = 0; h < (nv ? 3 : 1); ++h) {
        progs[h] = h ? clCreateProgramWithSource(ctx, 1, &src, NULL, &err) : prog;
        if (clBuildProgram(progs[h], 1, &dev, nv ? hints[h] : "", NULL, NULL) != CL_SUCCESS) {
            char log[16384] = "";
            clGetProgramBuildInfo(progs[h], dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
            fprintf(stderr, "build failed:\n%s\n", log);
            return 1;
        }
    }
    const size_t bytes = mib << 20, n4 = bytes / 16;
    cl_mem buf, out;
    if (probe_stream_buffers(ctx, q, cus, bytes, &buf, &out))
        return 1;
    /* Page tables: every page of the buffer once, in a shuffled order (xorshift, fixed seed). */
    const size_t pages4k = bytes / 4096;
    cl_mem tables[2];
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int k = 0; k < 2; ++k) {
        const size_t np_k = k ? bytes / 32768 : pages4k;
        uint32_t *perm = probe_shuffled(np_k, &seed);
        tables[k] = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, np_k * 4, perm, &err);
        free(perm);
    }
    clFinish(q);

    printf("%u compute units, %zu MiB read per run; GB/s (median of 10, START -> END)\n", cus, mib);
    printf("%-8s %5s %7s %9s\n", "pattern", "local", "wgs/cu", "GB/s");
    const char *names[] = {"stride", "slab", "page4k", "page32k", "heads", "cpasync", "cp128", "cp256"};
    for (int pat = 0; pat < (nv ? 8 : 5); ++pat) {
        cl_kernel k = clCreateKernel(pat >= 5 ? progs[pat - 5] : prog,
                                     pat == 0 ? "stride" : pat == 1 ? "slab" : pat == 4 ? "heads"
                                     : pat >= 5 ? "cpasync" : "pages", &err);
        const size_t locals[] = {64, 128, 256};
        for (int li = 0; li < 3; ++li) {
            const size_t local = pat >= 5 ? 64 : locals[li];
            if (pat >= 5 && li > 0)
                break;
            const int per_cu[] = {1, 2, 4, 8, 16};
            for (int wi = 0; wi < 5; ++wi) {
                size_t groups = (size_t)cus * (size_t)per_cu[wi];
                if (pat == 4) /* whole pages: 8 groups, one a head, per table slice */
                    groups = groups < 8 ? 8 : groups / 8 * 8;
                double read = (double)bytes;
                cl_ulong per;
                if (pat == 0) {
                    per = n4;
                    clSetKernelArg(k, 0, sizeof buf, &buf);
                    clSetKernelArg(k, 1, sizeof per, &per);
                    clSetKernelArg(k, 2, sizeof out, &out);
                } else if (pat == 1 || pat >= 5) {
                    per = n4 / groups / 512 * 512; /* whole 8 KB tiles for cpasync */
                    read = (double)per * groups * 16;
                    clSetKernelArg(k, 0, sizeof buf, &buf);
                    clSetKernelArg(k, 1, sizeof per, &per);
                    clSetKernelArg(k, 2, sizeof out, &out);
                } else if (pat == 4) {
                    per = (bytes >> 15) / (groups / 8); /* 32 KB pages per 8 groups */
                    read = (double)per * (groups / 8) * 32768;
                    clSetKernelArg(k, 0, sizeof buf, &buf);
                    clSetKernelArg(k, 1, sizeof tables[1], &tables[1]);
                    clSetKernelArg(k, 2, sizeof per, &per);
                    clSetKernelArg(k, 3, sizeof out, &out);
                } else {
                    const cl_uint shift = pat == 2 ? 8 : 11; /* 256 or 2048 uint4 a page */
                    per = (bytes >> (shift + 4)) / groups;
                    read = (double)per * groups * (double)(16u << shift);
                    clSetKernelArg(k, 0, sizeof buf, &buf);
                    clSetKernelArg(k, 1, sizeof tables[pat - 2], &tables[pat - 2]);
                    clSetKernelArg(k, 2, sizeof per, &per);
                    clSetKernelArg(k, 3, sizeof shift, &shift);
                    clSetKernelArg(k, 4, sizeof out, &out);
                }
                const double gbps = probe_median_gbps(q, k, groups * local, local, read);
                printf("%-8s %5zu %7d %9.1f\n", names[pat], local, per_cu[wi], gbps);
                fflush(stdout);
            }
        }
        clReleaseKernel(k);
    }
    return 0;
}
