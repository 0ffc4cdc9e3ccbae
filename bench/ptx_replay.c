/* ptx_replay.c: any one kernel launch of any flashcl run, recorded at the OpenCL API and relaunched
 * through the CUDA driver, so that Nsight Compute and compute-sanitizer see it (bench only, never in
 * the library or CTest; bench/ptx_harness.c says why NVIDIA's tools need this).
 *
 * Why a recorder. bench/ptx_harness.c and ptx_fwd_harness.c rebuild the backward's and the
 * forward's argument lists by hand, which pays for kernels with tensor maps (they hold the device
 * addresses of the OpenCL buffers, so a relaunch must encode its own). The serving kernels (the
 * decode kernels, their split merge, the KV-cache appends) take 20-30 arguments built from a batch
 * description, and none holds an address: for them, recording is exact and needs no copy of
 * src/serving.c's code.
 *
 * How. This file defines clCreateBuffer, clReleaseMemObject, clSetKernelArg and
 * clEnqueueNDRangeKernel; linked into the CLI (target flashcl_replay), flashcl's calls reach these,
 * which pass every call on to the ICD loader's (dlsym RTLD_NEXT) and remember the buffers and each
 * kernel's arguments. At the launch chosen (PTX_REPLAY_KERNEL, the first kernel whose name starts
 * with it, after PTX_REPLAY_SKIP such launches, default 0) it:
 *   1. waits for the queue, reads back every buffer argument (the state before), lets the launch
 *      run, waits, reads them again (the state after);
 *   2. takes the kernel's program binary, which NVIDIA's OpenCL keeps as PTX, translates it for the
 *      CUDA driver (bench/ptx_cuda.c) and loads it;
 *   3. launches it with CUDA copies of the state before, the recorded scalars and the same grid,
 *      and checks every buffer bitwise against the state after;
 *   4. times PTX_REPLAY_ITERS (default 20) more launches by cuEvents, each on the state before
 *      (the buffers the kernel changed are restored between launches, outside the timing).
 * PTX_REPLAY_VIA=opencl relaunches through OpenCL instead (fresh buffers from the state before, a
 * new kernel of the same program): it needs no CUDA and checks the recording itself on any device
 * (tests/test_ptx_replay.c does, with PTX_REPLAY_PERTURB=1 to see a relaunch on other inputs fail).
 * A buffer passed as two arguments (the decode kernels' output and unused split scratch) stays one
 * buffer in the relaunch.
 * The run then goes on as if nothing happened; the report goes to stderr, and the process exits 3
 * at its end if the check failed.
 *
 * Build: cmake -DFLASHCL_BUILD_BENCH_HARNESS=ON, target flashcl_replay (the CLI plus this file).
 * Run, e.g. the decode kernel at one shape, and under ncu:
 *   PTX_REPLAY_KERNEL=paged_decode build-gpu/flashcl_replay bench --decode --device nvidia \
 *       --kv-dtype e4m3 --batch 4 --context 16384 --iters 3
 *   ncu --set full -k regex:paged_decode PTX_REPLAY_ITERS=1 ... (the same command)
 * Not covered: launches with a global offset, work-groups of more than one dimension, __local
 * arguments, and arguments holding device addresses (tensor maps: the harnesses above).
 */
#define _GNU_SOURCE /* RTLD_NEXT */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <CL/cl.h>

#include "ptx_cuda.h"

#define MAX_BUFFERS 4096
#define MAX_KERNELS 256
#define MAX_ARGS 64

typedef struct {
    size_t size;
    int is_mem;         /* the value is a cl_mem this process created */
    unsigned char *val; /* the bytes as set (a cl_mem handle for buffers) */
} recorded_arg;

typedef struct {
    cl_kernel kernel;
    int n;
    recorded_arg args[MAX_ARGS];
} recorded_kernel;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cl_mem buffers[MAX_BUFFERS];
static int n_buffers;
static recorded_kernel kernels[MAX_KERNELS];
static int n_kernels, matched, done, failed;
static int outcome = -1; /* ptx_replay_outcome */

static cl_mem (*real_create)(cl_context, cl_mem_flags, size_t, void *, cl_int *);
static cl_int (*real_release)(cl_mem);
static cl_int (*real_set_arg)(cl_kernel, cl_uint, size_t, const void *);
static cl_int (*real_enqueue)(cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *,
                              const size_t *, cl_uint, const cl_event *, cl_event *);

static void *next_symbol(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    if (!f)
        die("no %s after this file's (is the OpenCL ICD loader linked?)", name);
    return f;
}
static void bind_real(void) {
    if (real_enqueue)
        return;
    *(void **)&real_create = next_symbol("clCreateBuffer");
    *(void **)&real_release = next_symbol("clReleaseMemObject");
    *(void **)&real_set_arg = next_symbol("clSetKernelArg");
    *(void **)&real_enqueue = next_symbol("clEnqueueNDRangeKernel");
}

static void report_exit(void) {
    if (failed)
        _exit(3);
}

/* For tests/test_ptx_replay.c: -1 until the chosen launch has been relaunched, then the number of
 * buffers whose bytes differed (0: equal). */
int ptx_replay_outcome(void);
int ptx_replay_outcome(void) { return outcome; }
/* Records the next matching launch again, the outcome and the failure forgotten. */
void ptx_replay_rearm(void);
void ptx_replay_rearm(void) {
    pthread_mutex_lock(&lock);
    done = matched = failed = 0;
    outcome = -1;
    pthread_mutex_unlock(&lock);
}

/* ---- the recording ------------------------------------------------------------------------------ */

cl_mem clCreateBuffer(cl_context c, cl_mem_flags flags, size_t size, void *host, cl_int *err) {
    bind_real();
    cl_mem m = real_create(c, flags, size, host, err);
    pthread_mutex_lock(&lock);
    if (m && n_buffers < MAX_BUFFERS)
        buffers[n_buffers++] = m;
    pthread_mutex_unlock(&lock);
    return m;
}

cl_int clReleaseMemObject(cl_mem m) {
    bind_real();
    /* The handle leaves the set only when its last reference goes: a later buffer may reuse it. */
    cl_uint refs = 0;
    clGetMemObjectInfo(m, CL_MEM_REFERENCE_COUNT, sizeof refs, &refs, NULL);
    if (refs == 1) {
        pthread_mutex_lock(&lock);
        for (int i = 0; i < n_buffers; ++i)
            if (buffers[i] == m) {
                buffers[i] = buffers[--n_buffers];
                break;
            }
        pthread_mutex_unlock(&lock);
    }
    return real_release(m);
}

static int known_buffer(cl_mem m) {
    for (int i = 0; i < n_buffers; ++i)
        if (buffers[i] == m)
            return 1;
    return 0;
}

static recorded_kernel *kernel_record(cl_kernel k) {
    for (int i = 0; i < n_kernels; ++i)
        if (kernels[i].kernel == k)
            return &kernels[i];
    if (n_kernels == MAX_KERNELS)
        die("%s", "more than 256 kernels: raise MAX_KERNELS");
    recorded_kernel *r = &kernels[n_kernels++];
    memset(r, 0, sizeof *r);
    r->kernel = k;
    return r;
}

cl_int clSetKernelArg(cl_kernel k, cl_uint index, size_t size, const void *value) {
    bind_real();
    const cl_int err = real_set_arg(k, index, size, value);
    if (err != CL_SUCCESS || index >= MAX_ARGS)
        return err;
    pthread_mutex_lock(&lock);
    recorded_kernel *r = kernel_record(k);
    recorded_arg *a = &r->args[index];
    free(a->val);
    a->size = size;
    a->val = value ? malloc(size) : NULL;
    if (a->val)
        memcpy(a->val, value, size);
    a->is_mem = value && size == sizeof(cl_mem) && known_buffer(*(const cl_mem *)value);
    if ((int)index >= r->n)
        r->n = (int)index + 1;
    pthread_mutex_unlock(&lock);
    return err;
}

/* ---- the relaunch -------------------------------------------------------------------------------- */

/* The first argument that holds the same buffer as argument i (i itself if none before it): a
 * buffer passed twice (out and the split scratch, say) must stay one buffer in the relaunch. */
static int first_alias(const recorded_kernel *r, int i) {
    for (int j = 0; j < i; ++j)
        if (r->args[j].is_mem && !memcmp(r->args[j].val, r->args[i].val, sizeof(cl_mem)))
            return j;
    return i;
}

typedef struct {
    size_t size;
    unsigned char *before, *after, *replay;
} buffer_state;

static void read_buffer(cl_command_queue q, cl_mem m, size_t size, unsigned char *to) {
    const cl_int err = clEnqueueReadBuffer(q, m, CL_TRUE, 0, size, to, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        die("clEnqueueReadBuffer failed (%s)", flashcl_status_string(err));
}

/* The bytes of each buffer that differ between want and got; returns the buffers that differ. */
static int compare(const recorded_kernel *r, const buffer_state *st, const char *via) {
    int bad_buffers = 0;
    for (int i = 0; i < r->n; ++i) {
        if (!r->args[i].is_mem)
            continue;
        size_t bad = 0, first = 0;
        for (size_t b = 0; b < st[i].size; ++b)
            if (st[i].after[b] != st[i].replay[b] && !bad++)
                first = b;
        const int changed = memcmp(st[i].before, st[i].after, st[i].size) != 0;
        const int j = first_alias(r, i);
        char alias[32] = "";
        if (j != i)
            snprintf(alias, sizeof alias, " (arg %d's buffer)", j);
        fprintf(stderr, "ptx_replay:   arg %2d: %zu bytes%s%s, %s", i, st[i].size, alias, changed ? " (written)" : "",
                bad ? "" : "equal\n");
        if (bad) {
            fprintf(stderr, "%zu bytes differ, the first at %zu\n", bad, first);
            ++bad_buffers;
        }
    }
    fprintf(stderr, "ptx_replay: %s relaunch %s OpenCL's result\n", via, bad_buffers ? "DIFFERS FROM" : "equals");
    outcome = bad_buffers;
    return bad_buffers;
}

static void replay_opencl(cl_command_queue q, cl_kernel k, const char *name, const recorded_kernel *r,
                          buffer_state *st, cl_uint dims, const size_t *global, const size_t *local) {
    cl_context c = NULL;
    cl_program p = NULL;
    clGetKernelInfo(k, CL_KERNEL_CONTEXT, sizeof c, &c, NULL);
    clGetKernelInfo(k, CL_KERNEL_PROGRAM, sizeof p, &p, NULL);
    cl_int err = CL_SUCCESS;
    cl_kernel twin = clCreateKernel(p, name, &err);
    if (err != CL_SUCCESS)
        die("clCreateKernel failed (%s)", flashcl_status_string(err));
    cl_mem copies[MAX_ARGS] = {0};
    for (int i = 0; i < r->n && err == CL_SUCCESS; ++i) {
        if (r->args[i].is_mem) {
            const int j = first_alias(r, i);
            if (j == i)
                copies[i] = real_create(c, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, st[i].size, st[i].before, &err);
            if (err == CL_SUCCESS)
                err = real_set_arg(twin, (cl_uint)i, sizeof(cl_mem), &copies[j]);
        } else {
            err = real_set_arg(twin, (cl_uint)i, r->args[i].size, r->args[i].val);
        }
    }
    if (err == CL_SUCCESS)
        err = real_enqueue(q, twin, dims, NULL, global, local, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        die("the OpenCL relaunch failed (%s)", flashcl_status_string(err));
    for (int i = 0; i < r->n; ++i)
        if (r->args[i].is_mem)
            read_buffer(q, copies[first_alias(r, i)], st[i].size, st[i].replay);
    for (int i = 0; i < r->n; ++i)
        if (copies[i])
            real_release(copies[i]);
    clReleaseKernel(twin);
    failed |= compare(r, st, "OpenCL") != 0;
}

static void replay_cuda(cl_kernel k, const char *name, const recorded_kernel *r, buffer_state *st, cl_uint dims,
                        const size_t *global, const size_t *local) {
    cl_program p = NULL;
    clGetKernelInfo(k, CL_KERNEL_PROGRAM, sizeof p, &p, NULL);
    size_t bytes = 0;
    if (clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof bytes, &bytes, NULL) != CL_SUCCESS || !bytes)
        die("%s", "no program binary (one device a program is expected)");
    char *ptx = calloc(1, bytes + 1);
    unsigned char *binaries[1] = {(unsigned char *)ptx};
    if (!ptx || clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof binaries, binaries, NULL) != CL_SUCCESS)
        die("%s", "clGetProgramInfo(CL_PROGRAM_BINARIES) failed");
    if (!strstr(ptx, ".entry"))
        die("%s", "the program binary is not PTX (NVIDIA's OpenCL keeps PTX; elsewhere PTX_REPLAY_VIA=opencl)");
    load_cuda();
    cached_program prog = {.options = "", .ptx = ptx, .ptx_len = strlen(ptx)};
    kernel kr;
    memset(&kr, 0, sizeof kr);
    kr.role = "replay";
    load_kernel(&kr, &prog, name, NULL, getenv("PTX_REPLAY_DUMP"));
    if (strcmp(kr.name, name))
        die("the program's first entry of that name is %s", kr.name);
    for (cl_uint d = 0; d < 3; ++d)
        kr.grid[d] = d < dims ? (unsigned)(global[d] / local[d]) : 1u;
    kr.block = (unsigned)local[0];
    CUdeviceptr dev[MAX_ARGS] = {0};
    for (int i = 0; i < r->n; ++i) {
        if (r->args[i].is_mem) {
            const int j = first_alias(r, i);
            if (j == i) {
                cu_check(cu.mem_alloc(&dev[i], st[i].size ? st[i].size : 1), "cuMemAlloc");
                cu_check(cu.memcpy_htod(dev[i], st[i].before, st[i].size), "cuMemcpyHtoD");
            }
            arg_u64(&kr.args, (uint64_t)dev[j]);
        } else {
            arg_bytes(&kr.args, r->args[i].val, r->args[i].size);
        }
    }
    fprintf(stderr, "ptx_replay: CUDA launch of %s, grid (%u,%u,%u) x %u\n", kr.name, kr.grid[0], kr.grid[1],
            kr.grid[2], kr.block);
    launch(&kr, &prog); /* checks the list against the entry's parameters */
    cu_check(cu.ctx_synchronize(), "the relaunch");
    for (int i = 0; i < r->n; ++i)
        if (r->args[i].is_mem)
            cu_check(cu.memcpy_dtoh(st[i].replay, dev[first_alias(r, i)], st[i].size), "cuMemcpyDtoH");
    failed |= compare(r, st, "CUDA") != 0;

    /* Timed launches, each on the state before: what a launch wrote is put back outside the events. */
    const int iters = getenv("PTX_REPLAY_ITERS") ? atoi(getenv("PTX_REPLAY_ITERS")) : 20;
    CUevent e0 = NULL, e1 = NULL;
    cu_check(cu.event_create(&e0, 0), "cuEventCreate");
    cu_check(cu.event_create(&e1, 0), "cuEventCreate");
    double total = 0;
    for (int it = 0; it < iters; ++it) {
        for (int i = 0; i < r->n; ++i)
            if (dev[i] && memcmp(st[i].before, st[i].after, st[i].size))
                cu_check(cu.memcpy_htod(dev[i], st[i].before, st[i].size), "cuMemcpyHtoD");
        float ms = 0;
        cu_check(cu.event_record(e0, NULL), "cuEventRecord");
        relaunch(&kr);
        cu_check(cu.event_record(e1, NULL), "cuEventRecord");
        cu_check(cu.event_synchronize(e1), "cuEventSynchronize");
        cu_check(cu.event_elapsed(&ms, e0, e1), "cuEventElapsedTime");
        total += ms;
    }
    if (iters > 0)
        fprintf(stderr, "ptx_replay: %s %.1f us a launch (cuEvents, mean of %d, state restored between)\n", kr.name,
                1000.0 * total / iters, iters);
    for (int i = 0; i < r->n; ++i)
        if (dev[i])
            cu.mem_free(dev[i]);
    free(ptx);
}

/* The caller's launch, recorded: the buffers' states around it, then the relaunch. Returns the
 * launch's status, and its event through event as the caller asked. */
static cl_int replay(cl_command_queue q, cl_kernel k, const char *name, cl_uint dims, const size_t *offset,
                     const size_t *global, const size_t *local, cl_uint n_wait, const cl_event *wait,
                     cl_event *event) {
    for (cl_uint d = 0; d < dims; ++d)
        if (offset && offset[d])
            die("%s", "a global offset: not covered");
    if (!local || (dims > 1 && (local[1] != 1 || (dims > 2 && local[2] != 1))))
        die("%s", "a work-group of one dimension is needed");
    const recorded_kernel *r = kernel_record(k);
    buffer_state st[MAX_ARGS];
    memset(st, 0, sizeof st);
    for (int i = 0; i < r->n; ++i) {
        if (!r->args[i].val)
            die("%s", "a __local argument or an unset one: not covered");
        if (!r->args[i].is_mem)
            continue;
        cl_mem m = *(const cl_mem *)r->args[i].val;
        clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof st[i].size, &st[i].size, NULL);
        st[i].before = malloc(st[i].size + 1);
        st[i].after = malloc(st[i].size + 1);
        st[i].replay = malloc(st[i].size + 1);
        if (!st[i].before || !st[i].after || !st[i].replay)
            die("%s", "out of host memory for the buffers' states");
        read_buffer(q, m, st[i].size, st[i].before);
    }
    fprintf(stderr, "ptx_replay: recorded %s (%d arguments)\n", name, r->n);
    const cl_int err = real_enqueue(q, k, dims, offset, global, local, n_wait, wait, event);
    if (err != CL_SUCCESS)
        return err; /* the caller hears of it as without this file */
    clFinish(q);
    for (int i = 0; i < r->n; ++i)
        if (r->args[i].is_mem)
            read_buffer(q, *(const cl_mem *)r->args[i].val, st[i].size, st[i].after);
    /* PTX_REPLAY_PERTURB=1 (tests): the relaunch gets the first input buffer with one sign bit
     * flipped (byte 3, bit 7: a float32's sign, a 16-bit value's), so its check must fail. */
    const char *perturb = getenv("PTX_REPLAY_PERTURB");
    for (int i = 0; perturb && !strcmp(perturb, "1") && i < r->n; ++i)
        if (r->args[i].is_mem && st[i].size >= 4 && !memcmp(st[i].before, st[i].after, st[i].size)) {
            st[i].before[3] ^= 0x80u;
            break;
        }
    const char *via = getenv("PTX_REPLAY_VIA");
    if (via && !strcmp(via, "opencl"))
        replay_opencl(q, k, name, r, st, dims, global, local);
    else
        replay_cuda(k, name, r, st, dims, global, local);
    for (int i = 0; i < r->n; ++i) {
        free(st[i].before);
        free(st[i].after);
        free(st[i].replay);
    }
    return err;
}

cl_int clEnqueueNDRangeKernel(cl_command_queue q, cl_kernel k, cl_uint dims, const size_t *offset,
                              const size_t *global, const size_t *local, cl_uint n_wait, const cl_event *wait,
                              cl_event *event) {
    bind_real();
    const char *want = getenv("PTX_REPLAY_KERNEL");
    char name[256] = "";
    if (want && !done)
        clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL);
    if (!want || done || strncmp(name, want, strlen(want)))
        return real_enqueue(q, k, dims, offset, global, local, n_wait, wait, event);
    const int skip = getenv("PTX_REPLAY_SKIP") ? atoi(getenv("PTX_REPLAY_SKIP")) : 0;
    if (matched++ < skip)
        return real_enqueue(q, k, dims, offset, global, local, n_wait, wait, event);
    done = 1;
    atexit(report_exit);
    /* The caller's launch is the recorded one (its wait list, its event, its results); the state
     * before it is read once what it waits for is done. */
    if (n_wait && clWaitForEvents(n_wait, wait) != CL_SUCCESS)
        die("%s", "clWaitForEvents failed on the launch's wait list");
    clFinish(q);
    pthread_mutex_lock(&lock);
    const cl_int err = replay(q, k, name, dims, offset, global, local, n_wait, wait, event);
    pthread_mutex_unlock(&lock);
    return err;
}
