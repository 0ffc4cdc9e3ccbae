/* internal.h: the context structure and the functions the src/ files share. */
#ifndef FLASHCL_INTERNAL_H
#define FLASHCL_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "flashcl.h"

/* What flashcl reads off a device once, to pick kernels and key caches. */
typedef struct flashcl_device_info {
    char name[256], vendor[256], version[256], driver[256];
    char platform_name[256], platform_version[256];
    cl_device_type type;
    cl_ulong local_mem;  /* CL_DEVICE_LOCAL_MEM_SIZE                    */
    size_t max_wg;       /* CL_DEVICE_MAX_WORK_GROUP_SIZE               */
    cl_uint compute_units;
    int nv_cc_major, nv_cc_minor; /* 0 unless cl_nv_device_attribute_query */
    int is_nvidia, is_pocl;
} flashcl_device_info;

/* One built program, keyed by its source file and build options. A failed
 * build is remembered (program NULL, log kept) so it is not retried. */
typedef struct flashcl_program {
    char *file;
    char *options;
    cl_program program;
    cl_kernel kernel;
    char *build_log;
    struct flashcl_program *next;
} flashcl_program;

struct flashcl_context {
    int is_host;
    cl_platform_id platform;
    cl_device_id device;
    cl_context cl_ctx;
    cl_command_queue queue;
    flashcl_device_info info;
    char description[1100];
    char *error;      /* last error text, heap, never NULL after create  */
    size_t error_cap;
    flashcl_program *programs;
    int host_threads; /* threads of the host path                        */
};

/* ---- errors and logging (context.c) ---- */
/* Records a formatted message as the context's last error; returns status. */
flashcl_status flashcl_fail(flashcl_context *ctx, flashcl_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Appends text (such as a build log) to the last error. */
void flashcl_append_error(flashcl_context *ctx, const char *text);
void flashcl_clear_error(flashcl_context *ctx);
/* Emits one line to the log sink (a callback, or stderr with FLASHCL_LOG=1). */
void flashcl_log(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* ---- programs (program.c) ---- */
/* The kernel `kernel_name` of cl/`file` (prefixed by cl/common.cl) built
 * with `options`: from memory, else the disk cache, else source. */
flashcl_status flashcl_get_kernel(flashcl_context *ctx, const char *file, const char *kernel_name,
                                  const char *options, cl_kernel *kernel);
void flashcl_release_programs(flashcl_context *ctx);

/* ---- parameters (params.c) ---- */
/* The built-in choice for a resolved desc on this context's device. */
void flashcl_default_params(const flashcl_context *ctx, const flashcl_attention_desc *desc,
                            flashcl_params *params);
/* The choice that always applies (the fallback when a variant cannot build). */
void flashcl_fallback_params(const flashcl_context *ctx, const flashcl_attention_desc *desc,
                             flashcl_params *params);
/* 1 when the tensor-core variant applies (NVIDIA sm_80+, f16/bf16, D 32..256). */
int flashcl_nv_mma_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc);
/* __local bytes the cpu and portable kernels need (0 for others). */
size_t flashcl_forward_local_bytes(const flashcl_params *params, int head_dim);

/* ---- the pure-C host path (host_path.c) ---- */
flashcl_status flashcl_host_forward(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                    const void *q, const void *k, const void *v, void *out,
                                    float *lse);

/* ---- small utilities (util.c) ---- */
uint64_t flashcl_fnv1a(uint64_t hash, const void *data, size_t size);
char *flashcl_strdup(const char *s);
/* a * b + c without overflow; returns 0 on overflow. */
int flashcl_mul_add(size_t a, size_t b, size_t c, size_t *out);

#endif
