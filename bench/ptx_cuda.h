/* ptx_cuda.h: the CUDA-driver side of bench/ptx_harness.c (bench only, never in the library): the
 * driver's entry points opened with dlopen (no cuda.h at build time, as src/nv_tma.c), flashcl's disk
 * program cache read back, OpenCL's PTX translated for cuModuleLoadDataEx, kernels loaded, their
 * argument lists built, launched and timed. bench/ptx_cuda.c says how the PTX is translated. */
#ifndef FLASHCL_BENCH_PTX_CUDA_H
#define FLASHCL_BENCH_PTX_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "flashcl.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUevent, *CUstream;
enum { /* CUjit_option */
       JIT_INFO_LOG_BUFFER = 3,
       JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
       JIT_ERROR_LOG_BUFFER = 5,
       JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
       JIT_LOG_VERBOSE = 12 };
enum { /* CUfunction_attribute */
       FUNC_SHARED_SIZE_BYTES = 1,
       FUNC_LOCAL_SIZE_BYTES = 3,
       FUNC_NUM_REGS = 4,
       FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
       FUNC_PREFERRED_SHARED_MEMORY_CARVEOUT = 9 };

typedef struct cuda_api {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(int *, int);
    CUresult (*primary_ctx_retain)(CUcontext *, int);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*ctx_synchronize)(void);
    CUresult (*module_load_data_ex)(CUmodule *, const void *, unsigned, int *, void **);
    CUresult (*module_get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*func_get_attribute)(int *, int, CUfunction);
    CUresult (*func_set_attribute)(CUfunction, int, int);
    CUresult (*occupancy)(int *, CUfunction, int, size_t);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*memset_d8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                       void **, void **);
    CUresult (*event_create)(CUevent *, unsigned);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_synchronize)(CUevent);
    CUresult (*event_elapsed)(float *, CUevent, CUevent);
    CUresult (*get_error_string)(CUresult, const char **);
    CUresult (*encode_tiled)(void *, int, unsigned, void *, const uint64_t *, const uint64_t *, const unsigned *,
                             const unsigned *, int, int, int, int);
} cuda_api;
extern cuda_api cu;

/* Prints "ptx_harness: " and the message, exits 2 (a bench tool: no recovery). */
void die(const char *fmt, const char *what);
/* The harnesses' command line: B H N D, then the flags both take. */
typedef struct {
    int B, H, N, D, causal, iters;
    const char *dtype, *dump, *device, *cache;
} harness_args;
/* B H N D from argv[1..4] into a, and the defaults (causal 0, iters 20, device "nvidia", no
 * dump or cache; dtype stays as the caller set it); exits with usage on fewer than five
 * arguments. */
void harness_args_start(int argc, char **argv, harness_args *a, const char *usage);
/* Takes argv[*i] (with its value, *i moved past it) if it is a common flag: --causal, --dtype,
 * --iters, --dump, --device, --cache. Returns 0 for any other argument. */
int harness_flag(int argc, char **argv, int *i, harness_args *a);
/* Exits unless B, H, N, D and iters are at least 1. */
void harness_args_check(const harness_args *a);
/* A read-write buffer of bytes, filled from host when it is not NULL; exits on failure. */
cl_mem harness_upload(cl_context c, const void *host, size_t bytes);
/* CLOCK_MONOTONIC in milliseconds, for wall-clock timing. */
double harness_now_ms(void);

/* flashcl's context on device, its disk program cache in *cache (NULL: a fresh directory made from
 * the mkdtemp template fresh, which must outlive the run), so that the programs the run builds can
 * be read back (read_cache); log receives flashcl's log lines. Exits on failure. */
flashcl_context *harness_context(const char **cache, char *fresh, const char *device,
                                 void (*log)(void *, const char *));
/* Exits with the driver's message on a failed call. */
void cu_check(CUresult rc, const char *what);
/* Opens libcuda.so.1, fills cu and makes device 0's primary context current; returns the context
 * that was current on this thread before (NULL: none), for a caller that must restore it. */
CUcontext load_cuda(void);

/* src/program.c's cache_header: magic "FLCLBIN3", key, binary size, hash, key text length. */
typedef struct {
    char magic[8];
    uint64_t key, size, hash, key_len;
} cache_header;

typedef struct {
    char *options; /* the build options (the key text's third part) */
    char *ptx;     /* NUL-terminated */
    size_t ptx_len;
} cached_program;

/* All programs in dir (src/program.c's cache files); returns their count. */
int read_cache(const char *dir, cached_program *out, int cap);
/* The value of -DNAME=value in options (the last one), or fallback. */
int option_int(const char *options, const char *name, int fallback);

/* PTX text: src/program.c's sm_90a masking undone; OpenCL's launch environment and parameter
 * qualifiers translated (NULL, with a message, on an %envreg it does not know); a -DSMEM_DYNAMIC=1
 * build's tile array made dynamic shared memory (NULL if absent). Each returns a new string. */
char *unmask_sm90a(const char *ptx);
char *translate(const char *ptx, int *envregs_seen);
char *dynamic_tiles(const char *ptx);
/* The name of the first .entry starting with prefix that is not `not` (NULL: any); 1 if found. */
int find_entry(const char *ptx, const char *prefix, const char *not, char *name, size_t cap);
/* Byte sizes of entry `name`'s parameters, and (is_ptr not NULL) whether each is a pointer (".ptr"
 * in OpenCL's PTX); returns their count (-1: no such entry). */
int entry_params(const char *ptx, const char *name, size_t *sizes, int *is_ptr, int cap);

/* One kernel argument: its bytes (kernelParams takes a pointer to each). */
typedef struct {
    void *ptrs[64];
    size_t sizes[64];
    int n;
    /* storage for the values */
    uint64_t u64[64];
    int32_t i32[64];
    float f32[64];
    int nu, ni, nf;
} arg_list;
void arg_u64(arg_list *a, uint64_t v);
void arg_i32(arg_list *a, int32_t v);
void arg_f32(arg_list *a, float v);
void arg_bytes(arg_list *a, void *p, size_t size);
/* TENSOR_ARGS(x) (cl/common.cl): offset, stride_batch, stride_seq, stride_head. */
void arg_layout(arg_list *a, const flashcl_layout *l);

typedef struct {
    const char *role; /* "pre", "dkdv", "dq" */
    char name[128];
    CUfunction fn;
    unsigned grid[3], block;
    unsigned dyn_smem; /* > 0: the tiles in this many bytes of dynamic shared memory (the --study builds) */
    char tag[32];      /* --dump's file names: "" for flashcl's kernels, ".study-N" for the N-th config's */
    arg_list args;
} kernel;

/* Loads the program's entry `prefix`... (not `not`) into k, with dynamic shared memory when
 * k->dyn_smem; prints the JIT's registers; --dump's files under dump (NULL: none). Returns 1, or 0
 * where a study's kernel (dyn_smem) could not load; flashcl's own kernels exit instead. */
int load_kernel(kernel *k, const cached_program *prog, const char *prefix, const char *not, const char *dump);
/* Checks k's argument list against the entry's declaration, then launches it. */
void launch(kernel *k, const cached_program *prog);
/* k's launch again, unchecked (launch has checked it). */
void relaunch(kernel *k);
/* cuEvent times of k[0..n-1] (NULL entries skipped), each launched by launch() before: each (mean
 * ms into per[]), and all back to back (returned). */
#define TIMED_KERNELS_MAX 4
double time_kernels(kernel *const *k, int n, int iters, double *per);

#endif
