/* launch_floor.c: what one small enqueue costs on an OpenCL device, measured the way
 * `flashcl bench --decode` measures (profiling events from a marker before
 * the host work to the end of the last command), to tell a serving call's
 * fixed costs apart. Not part of the build; on the GPU machine:
 *
 *   gcc -O2 -std=c11 bench/launch_floor.c -o /tmp/launch_floor -lOpenCL && /tmp/launch_floor nvidia
 *
 * Rows (median microseconds of 200):
 *   kernel              one tiny kernel
 *   kernel x2           two, the second waiting on the first's event
 *   write + kernel      a non-blocking 4 KB write the kernel waits on
 *   write+cb + kernel   the same with a completion callback on the write
 *   create + kernel     a CL_MEM_COPY_HOST_PTR buffer per call
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *src = "__kernel void k(__global int *a) { if (get_global_id(0) == 0) a[1] = a[0]; }";

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void CL_CALLBACK noop(cl_event e, cl_int s, void *p) {
    (void)e, (void)s, (void)p;
}

int main(int argc, char **argv) {
    const char *want = argc > 1 ? argv[1] : "";
    cl_platform_id plats[8];
    cl_uint np = 0;
    clGetPlatformIDs(8, plats, &np);
    cl_device_id dev = NULL;
    for (cl_uint i = 0; i < np && !dev; ++i) {
        char name[256];
        clGetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        for (char *c = name; *c; ++c)
            *c = (char)(*c | 32);
        if (!want[0] || strstr(name, want))
            clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, 1, &dev, NULL);
    }
    if (!dev) {
        fprintf(stderr, "no device matching '%s'\n", want);
        return 1;
    }
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    cl_command_queue q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    clBuildProgram(prog, 1, &dev, "", NULL, NULL);
    cl_kernel kern = clCreateKernel(prog, "k", &err);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
    static int host[1024];
    const char *names[] = {"kernel", "kernel x2", "write + kernel", "write+cb + kernel", "create + kernel"};
    enum { N = 200 };
    for (int mode = 0; mode < 5; ++mode) {
        double t[N];
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
            if (mode == 1) {
                clEnqueueNDRangeKernel(q, kern, 1, NULL, (size_t[]){128}, (size_t[]){128}, 0, NULL, &k1);
                clEnqueueNDRangeKernel(q, kern, 1, NULL, (size_t[]){128}, (size_t[]){128}, 1, &k1, &after);
            } else {
                clEnqueueNDRangeKernel(q, kern, 1, NULL, (size_t[]){128}, (size_t[]){128}, w ? 1 : 0,
                                       w ? &w : NULL, &after);
            }
            if (tmp)
                clReleaseMemObject(tmp);
            clWaitForEvents(1, &after);
            cl_ulong s = 0, e = 0;
            clGetEventProfilingInfo(before, CL_PROFILING_COMMAND_END, sizeof s, &s, NULL);
            clGetEventProfilingInfo(after, CL_PROFILING_COMMAND_END, sizeof e, &e, NULL);
            if (it >= 0)
                t[it] = (double)(e - s) * 1e-3;
            clReleaseEvent(before), clReleaseEvent(after);
            if (w)
                clReleaseEvent(w);
            if (k1)
                clReleaseEvent(k1);
        }
        qsort(t, N, sizeof t[0], cmp);
        printf("%-20s median %7.1f us  min %7.1f us\n", names[mode], t[N / 2], t[0]);
    }
    return 0;
}
