/* launch_floor.c: what one small enqueue costs on an OpenCL device, measured the way
 * `flashcl bench --decode` measures (profiling events from a marker before
 * the host work to the end of the last command), to tell a serving call's
 * fixed costs apart. Not part of the build; on the GPU machine:
 *
 *   gcc -O2 -std=c11 bench/launch_floor.c -o /tmp/launch_floor -lOpenCL && /tmp/launch_floor nvidia
 *
 * Rows (median microseconds of 200; each row also gives its last kernel's own START -> END):
 *   kernel              one tiny kernel
 *   kernel x2           two, the second waiting on the first's event
 *   write + kernel      a non-blocking 4 KB write the kernel waits on
 *   write+cb + kernel   the same with a completion callback on the write
 *   create + kernel     a CL_MEM_COPY_HOST_PTR buffer per call
 *   31 args + kernel    the decode kernel's argument count, set every call
 *   chained write+kernel 31 args, a write waiting on the previous call's kernel and the
 *                       kernel on the write: what flashcl's decode call enqueues
 *   unchained write+kernel the same with no wait lists (enough on an in-order queue)
 * and the candidates for a decode call without a separate upload:
 *   pinned write + kernel  the 4 KB write from a mapped CL_MEM_ALLOC_HOST_PTR buffer
 *   512 KB write + kernel  how the write grows (a batch of 16 at 128k keys has 512 KB
 *                       of page tables)
 *   1 KB arg + kernel    the description passed by value, as a 1 KB struct argument
 *   map/unmap + kernel   the kernel reads a pinned host buffer written between a
 *                       blocking map and an unmap (zero copy)
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"

static const char *src =
    "__kernel void k(__global int *a) { if (get_global_id(0) == 0) a[1] = a[0]; }\n"
    "__kernel void k31(__global int *a, __global int *b, __global int *c, __global int *d,\n"
    "  __global int *e, __global int *f, __global int *g, ulong u0, ulong u1, ulong u2, ulong u3,\n"
    "  ulong u4, ulong u5, ulong u6, ulong u7, ulong u8, ulong u9, ulong u10, ulong u11, ulong u12,\n"
    "  ulong u13, int i0, int i1, int i2, int i3, int i4, int i5, int i6, int i7, float f0, float f1)\n"
    "{ if (get_global_id(0) == 0) a[1] = a[0] + (int)(u13 + i7 + f1); }\n"
    "typedef struct { int v[256]; } blob;\n"
    "__kernel void kblob(__global int *a, blob b) { if (get_global_id(0) == 0) a[1] = b.v[a[0] & 255]; }\n"
    "__kernel void kread(__global int *a, __global const int *h) { if (get_global_id(0) == 0) a[1] = h[a[0] & 1023]; }";

static void CL_CALLBACK noop(cl_event e, cl_int s, void *p) {
    (void)e, (void)s, (void)p;
}

int main(int argc, char **argv) {
    const char *want = argc > 1 ? argv[1] : "";
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q = probe_open(want, NULL, &dev, &ctx, NULL);
    if (!q)
        return 1;
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    clBuildProgram(prog, 1, &dev, "", NULL, NULL);
    cl_kernel kern = clCreateKernel(prog, "k", &err), k31 = clCreateKernel(prog, "k31", &err);
    cl_kernel kblob = clCreateKernel(prog, "kblob", &err), kread = clCreateKernel(prog, "kread", &err);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
    cl_mem big = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 512 * 1024, NULL, &err);
    cl_mem pinned = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_ALLOC_HOST_PTR, 4096, NULL, &err);
    int *pinned_host = clEnqueueMapBuffer(q, pinned, CL_TRUE, CL_MAP_WRITE, 0, 4096, 0, NULL, NULL, &err);
    cl_mem shared = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_ALLOC_HOST_PTR, 4096, NULL, &err);
    static int host[1024], big_host[128 * 1024];
    struct { cl_int v[256]; } blob = {{0}};
    const char *names[] = {"kernel",         "kernel x2",           "write + kernel",         "write+cb + kernel",
                           "create + kernel", "31 args + kernel", "chained write+kernel", "unchained write+kernel",
                           "pinned write + kernel", "512 KB write + kernel", "1 KB arg + kernel",
                           "map/unmap + kernel"};
    cl_event prev = NULL; /* the chained mode's previous kernel */
    enum { N = 200 };
    for (int mode = 0; mode < 12; ++mode) {
        double t[N], own[N]; /* marker END -> last kernel END; that kernel's own START -> END */
        for (int it = -10; it < N; ++it) {
            cl_event before, w = NULL, k1 = NULL, after;
            clEnqueueMarkerWithWaitList(q, 0, NULL, &before);
            cl_mem arg = buf, tmp = NULL;
            if (mode == 2 || mode == 3) {
                clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, sizeof host, host, 0, NULL, &w);
                if (mode == 3)
                    clSetEventCallback(w, CL_COMPLETE, noop, NULL);
            } else if (mode == 4) {
                tmp = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err);
                arg = tmp;
            }
            clSetKernelArg(kern, 0, sizeof arg, &arg);
            if (mode >= 8) {
                cl_kernel kk = kern;
                if (mode == 8)
                    clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, 4096, pinned_host, 0, NULL, &w);
                else if (mode == 9)
                    clEnqueueWriteBuffer(q, big, CL_FALSE, 0, sizeof big_host, big_host, 0, NULL, &w);
                else if (mode == 10) {
                    blob.v[it & 255] = it;
                    kk = kblob;
                    clSetKernelArg(kblob, 0, sizeof buf, &buf);
                    clSetKernelArg(kblob, 1, sizeof blob, &blob);
                } else {
                    int *h = clEnqueueMapBuffer(q, shared, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0, 4096, 0, NULL,
                                                NULL, &err);
                    if (h)
                        memcpy(h, host, 4096);
                    clEnqueueUnmapMemObject(q, shared, h, 0, NULL, &w);
                    kk = kread;
                    clSetKernelArg(kread, 0, sizeof buf, &buf);
                    clSetKernelArg(kread, 1, sizeof shared, &shared);
                }
                clEnqueueNDRangeKernel(q, kk, 1, NULL, (size_t[]){128}, (size_t[]){128}, w ? 1 : 0, w ? &w : NULL,
                                       &after);
            } else if (mode >= 5) {
                cl_ulong u = 0;
                cl_int i = 0;
                cl_float f = 0.0f;
                cl_uint a = 0;
                for (int j = 0; j < 7; ++j)
                    clSetKernelArg(k31, a++, sizeof buf, &buf);
                for (int j = 0; j < 14; ++j)
                    clSetKernelArg(k31, a++, sizeof u, &u);
                for (int j = 0; j < 8; ++j)
                    clSetKernelArg(k31, a++, sizeof i, &i);
                for (int j = 0; j < 2; ++j)
                    clSetKernelArg(k31, a++, sizeof f, &f);
                if (mode >= 6)
                    clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, sizeof host, host, mode == 6 && prev ? 1 : 0,
                                         mode == 6 && prev ? &prev : NULL, &w);
                clEnqueueNDRangeKernel(q, k31, 1, NULL, (size_t[]){128}, (size_t[]){128}, mode == 6 ? 1 : 0,
                                       mode == 6 ? &w : NULL, &after);
                if (prev)
                    clReleaseEvent(prev);
                clRetainEvent(after);
                prev = after;
            } else if (mode == 1) {
                clEnqueueNDRangeKernel(q, kern, 1, NULL, (size_t[]){128}, (size_t[]){128}, 0, NULL, &k1);
                clEnqueueNDRangeKernel(q, kern, 1, NULL, (size_t[]){128}, (size_t[]){128}, 1, &k1, &after);
            } else {
                clEnqueueNDRangeKernel(q, kern, 1, NULL, (size_t[]){128}, (size_t[]){128}, w ? 1 : 0,
                                       w ? &w : NULL, &after);
            }
            if (tmp)
                clReleaseMemObject(tmp);
            clWaitForEvents(1, &after);
            cl_ulong s = 0, e = 0, r = 0;
            clGetEventProfilingInfo(before, CL_PROFILING_COMMAND_END, sizeof s, &s, NULL);
            clGetEventProfilingInfo(after, CL_PROFILING_COMMAND_END, sizeof e, &e, NULL);
            clGetEventProfilingInfo(after, CL_PROFILING_COMMAND_START, sizeof r, &r, NULL);
            if (it >= 0) {
                t[it] = (double)(e - s) * 1e-3;
                own[it] = (double)(e - r) * 1e-3;
            }
            clReleaseEvent(before), clReleaseEvent(after);
            if (w)
                clReleaseEvent(w);
            if (k1)
                clReleaseEvent(k1);
        }
        qsort(t, N, sizeof t[0], probe_cmp_double);
        qsort(own, N, sizeof own[0], probe_cmp_double);
        printf("%-20s median %7.1f us  min %7.1f us  last kernel START->END median %5.1f us\n", names[mode],
               t[N / 2], t[0], own[N / 2]);
    }
    return 0;
}
