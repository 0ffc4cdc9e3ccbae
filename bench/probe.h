/* probe.h: what the stand-alone device probes in bench/ share (each is built alone:
 * gcc -O2 -std=c11 bench/<probe>.c -lOpenCL). Header-only; static inline functions. */
#ifndef FLASHCL_BENCH_PROBE_H
#define FLASHCL_BENCH_PROBE_H

#include <CL/cl.h>
#include <stdlib.h>

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

#endif
