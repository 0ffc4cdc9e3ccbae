/* util.c: version, status strings and small helpers shared by the runtime. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

const char *flashcl_version(void) {
    return FLASHCL_VERSION_STRING;
}

size_t flashcl_dtype_size(flashcl_dtype dtype) {
    switch (dtype) {
    case FLASHCL_FLOAT32:
        return 4;
    case FLASHCL_FLOAT16:
    case FLASHCL_BFLOAT16:
        return 2;
    case FLASHCL_FLOAT8_E4M3:
    case FLASHCL_FLOAT8_E5M2:
        return 1;
    }
    return 0;
}

flashcl_status flashcl_check_dtype(flashcl_context *ctx, flashcl_dtype dtype) {
    const char *why = flashcl_dtype_unusable(dtype);
    return why ? flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "dtype %d: %s", (int)dtype, why) : FLASHCL_SUCCESS;
}

const char *flashcl_dtype_unusable(flashcl_dtype dtype) {
    if (flashcl_dtype_is_fp8(dtype))
        return "float8 tensors are taken only by the dense forward (flashcl_attention_forward) and the FP8 helpers "
               "in this version";
    return flashcl_dtype_size(dtype) ? NULL : "unknown dtype";
}

static const char *cl_status_string(cl_int status) {
    switch (status) {
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
    case CL_COMPILER_NOT_AVAILABLE: return "CL_COMPILER_NOT_AVAILABLE";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_PROFILING_INFO_NOT_AVAILABLE: return "CL_PROFILING_INFO_NOT_AVAILABLE";
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_PLATFORM: return "CL_INVALID_PLATFORM";
    case CL_INVALID_DEVICE: return "CL_INVALID_DEVICE";
    case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
    case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_BINARY: return "CL_INVALID_BINARY";
    case CL_INVALID_BUILD_OPTIONS: return "CL_INVALID_BUILD_OPTIONS";
    case CL_INVALID_PROGRAM: return "CL_INVALID_PROGRAM";
    case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
    case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_GLOBAL_WORK_SIZE: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case CL_INVALID_EVENT: return "CL_INVALID_EVENT";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "OpenCL error";
    }
}

const char *flashcl_status_string(flashcl_status status) {
    switch (status) {
    case FLASHCL_SUCCESS: return "success";
    case FLASHCL_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FLASHCL_ERROR_INVALID_SHAPE: return "invalid shape";
    case FLASHCL_ERROR_OUT_OF_BOUNDS: return "tensor overruns its buffer";
    case FLASHCL_ERROR_DTYPE_MISMATCH: return "dtype mismatch";
    case FLASHCL_ERROR_NO_DEVICE: return "no matching OpenCL device";
    case FLASHCL_ERROR_BUILD_FAILED: return "kernel build failed";
    case FLASHCL_ERROR_OUT_OF_HOST_MEMORY: return "out of host memory";
    case FLASHCL_ERROR_UNSUPPORTED: return "operation needs an OpenCL device";
    case FLASHCL_ERROR_INVALID_PARAMS: return "kernel parameters do not fit the device";
    case FLASHCL_ERROR_TUNING_FILE: return "tuning file cannot be read or written";
    case FLASHCL_ERROR_OUT_OF_PAGES: return "the KV cache has too few free pages";
    case FLASHCL_ERROR_MALFORMED_ENV: return "malformed FLASHCL_* environment variable";
    case FLASHCL_ERROR_INVALID_PROBS: return "invalid probabilities or logits";
    default: break;
    }
    if (status < 0 && status > -2000)
        return cl_status_string(status);
    return "unknown status";
}

uint64_t flashcl_fnv1a(uint64_t hash, const void *data, size_t size) {
    const unsigned char *p = data;
    for (size_t i = 0; i < size; ++i) {
        hash ^= p[i];
        hash *= 0x100000001b3ull;
    }
    return hash;
}

char *flashcl_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *copy = malloc(n);
    if (copy)
        memcpy(copy, s, n);
    return copy;
}

int flashcl_mul_add(size_t a, size_t b, size_t c, size_t *out) {
    if (a != 0 && b > (SIZE_MAX - c) / a)
        return 0;
    *out = a * b + c;
    return 1;
}

const char *flashcl_option_define(const char *options, const char *name) {
    char key[64];
    const int n = snprintf(key, sizeof key, "-D%s=", name);
    const char *last = NULL;
    for (const char *at = options; at && (at = strstr(at, key)) != NULL; at += n)
        last = at + n;
    return last;
}

void flashcl_host_define(char *buf, size_t size, const char *extra, const char *name, int value) {
    if (!value || flashcl_option_define(extra, name))
        buf[0] = '\0';
    else
        snprintf(buf, size, " -D%s=%d", name, value);
}

flashcl_status flashcl_options_fit(flashcl_context *ctx, int n, size_t cap) {
    if (n >= 0 && (size_t)n < cap)
        return FLASHCL_SUCCESS;
    return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                        "a kernel's build options need %d bytes, more than its %zu (FLASHCL_BUILD_OPTIONS too long?)",
                        n + 1, cap);
}

int flashcl_kv_next(const char **s, flashcl_kv *kv) {
    const char *p = *s;
    if (!*p)
        return FLASHCL_KV_END;
    kv->at = kv->key = p;
    kv->key_len = strcspn(p, "=,");
    if (p[kv->key_len] != '=')
        return FLASHCL_KV_NO_EQUALS;
    kv->value = p + kv->key_len + 1;
    kv->value_len = strcspn(kv->value, ",");
    p = kv->value + kv->value_len;
    if (*p == ',' && !*++p)
        return FLASHCL_KV_TRAILING_COMMA;
    *s = p;
    return FLASHCL_KV_ITEM;
}

int flashcl_kv_key(const flashcl_kv *kv, const char *name) {
    size_t i = 0;
    while (i < kv->key_len && name[i] && toupper((unsigned char)kv->key[i]) == toupper((unsigned char)name[i]))
        ++i;
    return i == kv->key_len && !name[i];
}

int flashcl_kv_int(const flashcl_kv *kv, long lo, long hi, int *value) {
    char *end = NULL;
    long x = strtol(kv->value, &end, 10);
    if (end == kv->value || end != kv->value + kv->value_len || x < lo || x > hi)
        return 0;
    *value = (int)x;
    return 1;
}
