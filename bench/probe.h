/* probe.h: what the stand-alone device probes in bench/ share (each is built alone:
 * gcc -O2 -std=c11 bench/<probe>.c -lOpenCL). Header-only; static inline functions. */
#ifndef FLASHCL_BENCH_PROBE_H
#define FLASHCL_BENCH_PROBE_H

#include <CL/cl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* qsort's order for doubles. */
static inline int probe_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* GB/s of `bytes` over the median of 10 timed runs (after 2 untimed) of kern over global x
 * local work-items, each timed START -> END by its profiling event; -1 if one fails to enqueue. */
static inline double probe_median_gbps(cl_command_queue q, cl_kernel kern, size_t global, size_t local, double bytes) {
    double t[10];
    for (int it = -2; it < 10; ++it) {
        cl_event e;
        if (clEnqueueNDRangeKernel(q, kern, 1, NULL, &global, &local, 0, NULL, &e) != CL_SUCCESS)
            return -1.0;
        clWaitForEvents(1, &e);
        cl_ulong s = 0, f = 0;
        clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof s, &s, NULL);
        clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof f, &f, NULL);
        clReleaseEvent(e);
        if (it >= 0)
            t[it] = (double)(f - s) * 1e-9;
    }
    qsort(t, 10, sizeof t[0], probe_cmp_double);
    return bytes / (0.5 * (t[4] + t[5])) / 1e9;
}

/* The first device of the first platform whose name contains `want`, in any case ("": the
 * first platform); *is_nvidia (if not NULL) says whether that platform is NVIDIA's. NULL if none. */
static inline cl_device_id probe_device(const char *want, int *is_nvidia) {
    cl_platform_id plats[8];
    cl_uint np = 0;
    clGetPlatformIDs(8, plats, &np);
    for (cl_uint i = 0; i < np && i < 8; ++i) {
        char name[256] = "", low[256] = "";
        clGetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof name - 1, name, NULL);
        for (size_t c = 0; name[c]; ++c)
            low[c] = (char)(name[c] | 32);
        char w[256] = "";
        for (size_t c = 0; want[c] && c < sizeof w - 1; ++c)
            w[c] = (char)(want[c] | 32);
        cl_device_id dev = NULL;
        if ((!w[0] || strstr(low, w)) && clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, 1, &dev, NULL) == CL_SUCCESS) {
            if (is_nvidia)
                *is_nvidia = strstr(low, "nvidia") != NULL;
            return dev;
        }
    }
    return NULL;
}

/* probe_device(want, is_nvidia) in *dev, a context on it and a profiling queue in that, and its
 * compute units (if cus is not NULL); NULL, with a message printed, if any cannot be had. */
static inline cl_command_queue probe_open(const char *want, int *is_nvidia, cl_device_id *dev, cl_context *ctx,
                                          cl_uint *cus) {
    if (!(*dev = probe_device(want, is_nvidia))) {
        fprintf(stderr, "no OpenCL device matching '%s'\n", want);
        return NULL;
    }
    if (cus) {
        *cus = 0;
        clGetDeviceInfo(*dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof *cus, cus, NULL);
    }
    cl_int err = CL_SUCCESS;
    *ctx = clCreateContext(NULL, 1, dev, NULL, NULL, &err);
    cl_command_queue q = *ctx ? clCreateCommandQueue(*ctx, *dev, CL_QUEUE_PROFILING_ENABLE, &err) : NULL;
    if (!q)
        fprintf(stderr, "cannot open a profiling queue on the device (%d)\n", err);
    return q;
}

/* The buffers a read probe streams: *buf, `bytes` of zeros to read, and *out, room for one word
 * a work-item of up to 64 Ki work-items a compute unit (written only where a fold is not zero,
 * which never happens). 0, or an error message printed and 1. */
static inline int probe_stream_buffers(cl_context ctx, cl_command_queue q, cl_uint cus, size_t bytes, cl_mem *buf,
                                       cl_mem *out) {
    cl_int err_buf, err_out;
    *buf = clCreateBuffer(ctx, CL_MEM_READ_ONLY, bytes, NULL, &err_buf);
    *out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)cus * 64 * 1024 * 4, NULL, &err_out);
    if (err_buf != CL_SUCCESS || err_out != CL_SUCCESS) {
        fprintf(stderr, "cannot allocate %zu MiB (%d, %d)\n", bytes >> 20, err_buf, err_out);
        return 1;
    }
    const cl_uint zero = 0;
    clEnqueueFillBuffer(q, *buf, &zero, sizeof zero, 0, bytes, 0, NULL, NULL);
    return 0;
}

/* 0 .. n - 1 in a shuffled order (Fisher-Yates on xorshift64 from *state, which advances);
 * the caller frees it. */
static inline uint32_t *probe_shuffled(size_t n, uint64_t *state) {
    uint32_t *perm = malloc(n * sizeof *perm);
    if (!perm)
        return NULL;
    for (size_t i = 0; i < n; ++i)
        perm[i] = (uint32_t)i;
    for (size_t i = n - 1; i > 0 && n > 1; --i) {
        uint64_t x = *state;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        *state = x;
        const size_t j = x % (i + 1);
        const uint32_t tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    return perm;
}

#endif
