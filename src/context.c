/* context.c: choosing or adopting a device, the host fallback, errors and logging. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#ifndef CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV
#define CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV 0x4000
#define CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV 0x4001
#endif

/* ---- logging ---------------------------------------------------------------- */

static flashcl_log_fn log_fn;
static void *log_user;

void flashcl_set_log(flashcl_log_fn fn, void *user) {
    log_fn = fn;
    log_user = user;
}

int flashcl_log_enabled(void) {
    const char *env = getenv("FLASHCL_LOG");
    return log_fn || (env && env[0] && strcmp(env, "0") != 0);
}

void flashcl_log(const char *fmt, ...) {
    if (!flashcl_log_enabled())
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (log_fn)
        log_fn(log_user, line);
    else
        fprintf(stderr, "flashcl: %s\n", line);
}

/* ---- errors ------------------------------------------------------------------- */

/* The last error is kept per thread, tagged with the context it was recorded
 * on (NULL for a failed create or adopt). Two threads sharing a context then
 * never see each other's messages, and a failed creation, which leaves no
 * context to hold one, still has a message for flashcl_last_error(NULL).
 * The text is on the heap because a build log can be long; a thread's record
 * is freed when the thread exits. */
typedef struct error_record {
    const flashcl_context *ctx;
    char *text;
    size_t cap;
} error_record;

static pthread_key_t error_key;
static pthread_once_t error_key_once = PTHREAD_ONCE_INIT;
static int error_key_ok;

static void free_error_record(void *p) {
    error_record *r = p;
    if (r)
        free(r->text);
    free(r);
}

static void make_error_key(void) {
    error_key_ok = pthread_key_create(&error_key, free_error_record) == 0;
}

/* The calling thread's record, made on first use; NULL when memory runs out. */
static error_record *thread_error(int create) {
    pthread_once(&error_key_once, make_error_key);
    if (!error_key_ok)
        return NULL;
    error_record *r = pthread_getspecific(error_key);
    if (!r && create) {
        r = calloc(1, sizeof *r);
        if (r && pthread_setspecific(error_key, r) != 0) {
            free(r);
            r = NULL;
        }
    }
    return r;
}

static void set_error(const flashcl_context *ctx, const char *text, int append) {
    error_record *r = thread_error(1);
    if (!r)
        return;
    if (r->ctx != ctx)
        append = 0; /* a message on another context is not continued */
    size_t old = append && r->text ? strlen(r->text) : 0;
    size_t need = old + strlen(text) + 1;
    if (need > r->cap) {
        char *grown = realloc(r->text, need);
        if (!grown)
            return; /* keep the old message rather than lose the status */
        r->text = grown;
        r->cap = need;
    }
    r->ctx = ctx;
    memcpy(r->text + old, text, strlen(text) + 1);
}

flashcl_status flashcl_fail(flashcl_context *ctx, flashcl_status status, const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    set_error(ctx, text, 0);
    if (!ctx)
        flashcl_log("%s", text); /* a creation failure: FLASHCL_LOG=1 shows it too */
    return status;
}

void flashcl_append_error(flashcl_context *ctx, const char *text) {
    set_error(ctx, text, 1);
}

flashcl_status flashcl_device_entry(flashcl_context *ctx, const char *host_fn) {
    if (!ctx)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    if (ctx->is_host)
        return flashcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "a host context has no cl_mem buffers: use %s", host_fn);
    return FLASHCL_SUCCESS;
}

void flashcl_clear_error(flashcl_context *ctx) {
    error_record *r = thread_error(0);
    if (r && r->text) {
        r->text[0] = '\0';
        r->ctx = ctx;
    }
}

const char *flashcl_last_error(const flashcl_context *ctx) {
    const error_record *r = thread_error(0);
    return r && r->text && r->ctx == ctx ? r->text : "";
}

/* ---- the context's lock --------------------------------------------------------- */

void flashcl_lock(flashcl_context *ctx) {
    if (ctx)
        pthread_mutex_lock(&ctx->lock);
}

void flashcl_unlock(flashcl_context *ctx) {
    if (ctx)
        pthread_mutex_unlock(&ctx->lock);
}

void flashcl_unlock_scope(flashcl_context **ctx) {
    flashcl_unlock(*ctx);
}

/* ---- device properties ---------------------------------------------------------- */

static void read_string(cl_device_id dev, cl_device_info what, char *out, size_t cap) {
    out[0] = '\0';
    if (clGetDeviceInfo(dev, what, cap, out, NULL) != CL_SUCCESS)
        out[0] = '\0';
    out[cap - 1] = '\0';
}

static int contains_nocase(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; ++hay) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
            ++i;
        if (i == n)
            return 1;
    }
    return n == 0;
}

static void read_device_info(cl_platform_id platform, cl_device_id dev, flashcl_device_info *info) {
    memset(info, 0, sizeof *info);
    read_string(dev, CL_DEVICE_NAME, info->name, sizeof info->name);
    read_string(dev, CL_DEVICE_VENDOR, info->vendor, sizeof info->vendor);
    read_string(dev, CL_DEVICE_VERSION, info->version, sizeof info->version);
    read_string(dev, CL_DRIVER_VERSION, info->driver, sizeof info->driver);
    clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof info->platform_name, info->platform_name, NULL);
    clGetPlatformInfo(platform, CL_PLATFORM_VERSION, sizeof info->platform_version,
                      info->platform_version, NULL);
    info->platform_name[sizeof info->platform_name - 1] = '\0';
    info->platform_version[sizeof info->platform_version - 1] = '\0';
    clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof info->type, &info->type, NULL);
    clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof info->local_mem, &info->local_mem, NULL);
    clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof info->max_wg, &info->max_wg, NULL);
    info->device_local_mem = info->local_mem;
    info->local_scale = 1;
    if (clGetDeviceInfo(dev, CL_DEVICE_MAX_PARAMETER_SIZE, sizeof info->max_param, &info->max_param, NULL) !=
        CL_SUCCESS)
        info->max_param = 1024; /* the minimum OpenCL guarantees */
    clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof info->compute_units,
                    &info->compute_units, NULL);
    info->is_nvidia = contains_nocase(info->vendor, "nvidia") || contains_nocase(info->platform_name, "nvidia");
    info->is_pocl = contains_nocase(info->platform_name, "portable computing") ||
                    contains_nocase(info->platform_version, "pocl");
    info->is_rusticl = contains_nocase(info->platform_name, "rusticl");
    char ext[8192];
    read_string(dev, CL_DEVICE_EXTENSIONS, ext, sizeof ext);
    if (strstr(ext, "cl_nv_device_attribute_query")) {
        cl_uint major = 0, minor = 0;
        clGetDeviceInfo(dev, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof major, &major, NULL);
        clGetDeviceInfo(dev, CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV, sizeof minor, &minor, NULL);
        info->nv_cc_major = (int)major;
        info->nv_cc_minor = (int)minor;
    }
}

/* ---- what kernels may really use ------------------------------------------------- */

/* A positive integer from the environment, or 0. */
static unsigned long env_limit(const char *name) {
    const char *v = getenv(name);
    char *end;
    unsigned long n = v && v[0] ? strtoul(v, &end, 10) : 0;
    return n && *end == '\0' ? n : 0;
}

/* Drivers differ from what the device reports in two ways that matter here,
 * so a tiny kernel with 1 KB of __local and a barrier is built once per
 * context and asked: Mesa's rusticl on llvmpipe counts a kernel's __local
 * bytes twice (a kernel declaring 23456 bytes reports 46912, and launching
 * one past the device's 32 KB corrupts results or crashes), and limits every
 * kernel's work-group to 32 although the device says 1024. The budgets the
 * parameter code fits tiles to are lowered to match. NVIDIA's driver is not
 * probed: its numbers are exact, and its kernels' work-group limits come from
 * their registers, which each kernel family checks itself. */
static void probe_kernel_limits(flashcl_context *ctx) {
    static const char source[] =
        "__kernel void flashcl_probe(__global float *out) {\n"
        "    __local float tile[256];\n"
        "    tile[get_local_id(0) % 256] = (float)get_local_id(0);\n"
        "    barrier(CLK_LOCAL_MEM_FENCE);\n"
        "    out[get_global_id(0)] = tile[(get_local_id(0) + 1) % 256];\n"
        "}\n";
    flashcl_device_info *info = &ctx->info;
    const char *text = source;
    cl_int err;
    cl_program program = clCreateProgramWithSource(ctx->cl_ctx, 1, &text, NULL, &err);
    if (!program)
        return;
    cl_kernel kernel = NULL;
    if (clBuildProgram(program, 1, &ctx->device, "", NULL, NULL) == CL_SUCCESS)
        kernel = clCreateKernel(program, "flashcl_probe", &err);
    if (kernel) {
        cl_ulong local = 0;
        size_t wg = 0;
        clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_LOCAL_MEM_SIZE, sizeof local, &local, NULL);
        clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
        if (local > 1024) {
            info->local_scale = (unsigned)((local + 1023) / 1024);
            info->local_mem /= info->local_scale;
        }
        if (wg && wg < info->max_wg)
            info->max_wg = wg;
        clReleaseKernel(kernel);
    }
    clReleaseProgram(program);
}

/* The device's limits as parameters see them: probed, then capped. */
static void kernel_limits(flashcl_context *ctx) {
    flashcl_device_info *info = &ctx->info;
    if (!info->is_nvidia)
        probe_kernel_limits(ctx);
    unsigned long cap_local = env_limit("FLASHCL_MAX_LOCAL_MEM"), cap_wg = env_limit("FLASHCL_MAX_WORK_GROUP");
    if (cap_local && cap_local < info->device_local_mem) {
        info->device_local_mem = cap_local;
        info->local_mem = cap_local / info->local_scale;
    }
    if (cap_wg && cap_wg < info->max_wg)
        info->max_wg = cap_wg;
}

/* ---- creation ------------------------------------------------------------------ */

static flashcl_context *alloc_context(void) {
    flashcl_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return NULL;
    /* Recursive: a public call may make others on the same context (the
     * _host variants call the device ones, a KV cache's calls its context's). */
    pthread_mutexattr_t attr;
    int ok = pthread_mutexattr_init(&attr) == 0;
    if (ok) {
        ok = pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE) == 0 &&
             pthread_mutex_init(&ctx->lock, &attr) == 0;
        pthread_mutexattr_destroy(&attr);
    }
    if (!ok) {
        free(ctx);
        return NULL;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    ctx->host_threads = cpus > 0 ? (int)(cpus > 256 ? 256 : cpus) : 1;
    return ctx;
}

/* why: for the host path, the reason it runs (NULL on the OpenCL path). */
static void describe(flashcl_context *ctx, const char *why) {
    if (ctx->is_host) {
        snprintf(ctx->description, sizeof ctx->description,
                 "host (pure C, %d threads, no OpenCL) because %s", ctx->host_threads,
                 why ? why : "it was asked for");
        return;
    }
    snprintf(ctx->description, sizeof ctx->description, "%s (%s, %s, driver %s)", ctx->info.name,
             ctx->info.platform_name, ctx->info.version, ctx->info.driver);
}

static flashcl_status make_host(flashcl_context *ctx, const char *why) {
    /* Said once per process, not per context: tests create many. */
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&said)) {
        flashcl_log("%s: using the multi-threaded host C path", why);
    }
    ctx->is_host = 1;
    flashcl_clear_error(ctx);
    describe(ctx, why);
    return FLASHCL_SUCCESS;
}

/* 1 where the platform's name, vendor or version holds word (case-insensitive), read whole
 * whatever its length. */
static int platform_names(cl_platform_id platform, const char *word) {
    static const cl_platform_info fields[] = {CL_PLATFORM_NAME, CL_PLATFORM_VENDOR,
                                              CL_PLATFORM_VERSION};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; ++i) {
        size_t size = 0;
        if (clGetPlatformInfo(platform, fields[i], 0, NULL, &size) != CL_SUCCESS || size == 0)
            continue;
        char *text = calloc(size + 1, 1);
        const int holds = text &&
                          clGetPlatformInfo(platform, fields[i], size, text, NULL) == CL_SUCCESS &&
                          contains_nocase(text, word);
        free(text);
        if (holds)
            return 1;
    }
    return 0;
}

/* 1 where the device's name or vendor holds word. */
static int device_names(cl_platform_id platform, cl_device_id device, const char *word) {
    flashcl_device_info info;
    read_device_info(platform, device, &info);
    return contains_nocase(info.name, word) || contains_nocase(info.vendor, word);
}

/* 1 where text is a decimal number, its value in *value. */
static int is_index(const char *text, unsigned long *value) {
    char *end = NULL;
    *value = strtoul(text, &end, 10);
    return *text >= '0' && *text <= '9' && *end == '\0';
}

/* "PLATFORM:DEVICE" (pick_device), split at the first colon: the first platform that PLATFORM
 * names (its index, or a word of its name, vendor or version; any, where empty) holding a device
 * that DEVICE picks (its index on that platform, a word of its name or vendor, or its first
 * device where empty). Returns FLASHCL_ERROR_NO_DEVICE with *named 0, and no message, where
 * PLATFORM is a word that names no platform: the caller then tries the whole spec as one word
 * (AMD's device names hold colons: "gfx90a:sramecc+:xnack-"). */
static flashcl_status pick_on_platform(flashcl_context *ctx, const char *spec, const char *colon,
                                       const cl_platform_id *plats, cl_uint nplat,
                                       cl_platform_id *platform, cl_device_id *device, int *named) {
    char word[128];
    const size_t len = (size_t)(colon - spec);
    *named = 1;
    if (len >= sizeof word)
        return flashcl_fail(ctx, FLASHCL_ERROR_NO_DEVICE,
                            "device spec '%s': the platform's part is too long", spec);
    memcpy(word, spec, len);
    word[len] = '\0';
    const char *dev_word = colon + 1;
    unsigned long plat_index, index;
    const int plat_by_index = is_index(word, &plat_index), by_index = is_index(dev_word, &index);
    if (plat_by_index && plat_index >= nplat)
        return flashcl_fail(ctx, FLASHCL_ERROR_NO_DEVICE,
                            "device spec '%s': no platform %lu (%u found)", spec, plat_index,
                            nplat);
    int platforms = 0, devices = 0;
    for (cl_uint p = 0; p < nplat; ++p) {
        if (plat_by_index ? p != plat_index : !platform_names(plats[p], word))
            continue;
        ++platforms;
        cl_device_id devs[64];
        cl_uint ndev = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 64, devs, &ndev) != CL_SUCCESS)
            continue;
        devices += (int)ndev;
        for (cl_uint d = 0; d < ndev && d < 64; ++d) {
            if (by_index ? d != index : !device_names(plats[p], devs[d], dev_word))
                continue;
            *platform = plats[p];
            *device = devs[d];
            return FLASHCL_SUCCESS;
        }
    }
    if (!platforms) {
        *named = 0;
        return FLASHCL_ERROR_NO_DEVICE;
    }
    if (!devices)
        return flashcl_fail(ctx, FLASHCL_ERROR_NO_DEVICE,
                            "device spec '%s': the platforms '%s' names have no devices", spec,
                            word);
    return flashcl_fail(ctx, FLASHCL_ERROR_NO_DEVICE,
                        "device spec '%s': no device '%s' on the platforms '%s' names", spec,
                        dev_word, word);
}

/* Parses spec into a device; returns the status and sets *platform / *device. */
static flashcl_status pick_device(flashcl_context *ctx, const char *spec, cl_platform_id *platform,
                                  cl_device_id *device) {
    cl_platform_id plats[32];
    cl_uint nplat = 0;
    cl_int err = clGetPlatformIDs(32, plats, &nplat);
    if (err != CL_SUCCESS || nplat == 0)
        return flashcl_fail(ctx, FLASHCL_ERROR_NO_DEVICE, "no OpenCL platform found (%s)",
                            flashcl_status_string(err == CL_SUCCESS ? -1001 : err));
    if (nplat > 32)
        nplat = 32;

    /* "PLATFORM:DEVICE": "P:D" indices as `flashcl devices` lists them, or words: the platform
     * by its name, vendor or version, then its device by an index or a word of the device's name
     * or vendor (either part may be empty). */
    const char *colon = strchr(spec, ':');
    int named = 1;
    if (colon) {
        const flashcl_status st =
            pick_on_platform(ctx, spec, colon, plats, nplat, platform, device, &named);
        if (named)
            return st;
    }

    cl_device_type want = CL_DEVICE_TYPE_ALL;
    const char *word = NULL; /* a name fragment to match */
    if (spec[0] == '\0')
        want = CL_DEVICE_TYPE_GPU; /* default: a GPU first, then anything */
    else if (!strcmp(spec, "gpu"))
        want = CL_DEVICE_TYPE_GPU;
    else if (!strcmp(spec, "cpu"))
        want = CL_DEVICE_TYPE_CPU;
    else if (!strcmp(spec, "accelerator"))
        want = CL_DEVICE_TYPE_ACCELERATOR;
    else
        word = spec;

    /* A word names an implementation before a device: first the platforms it names, then the
     * devices whose name or vendor hold it. PoCL on an Intel CPU calls its device
     * "pthread-...-Intel(R) Xeon(R)...", so "intel" would otherwise take PoCL's device where
     * Intel's own runtime is installed too. */
    for (int pass = 0; pass < 2; ++pass) {
        for (cl_uint p = 0; p < nplat; ++p) {
            if (word && pass == 0 && !platform_names(plats[p], word))
                continue;
            cl_device_id devs[64];
            cl_uint ndev = 0;
            if (clGetDeviceIDs(plats[p], want, 64, devs, &ndev) != CL_SUCCESS)
                continue;
            for (cl_uint d = 0; d < ndev && d < 64; ++d) {
                if (word && pass == 1 && !device_names(plats[p], devs[d], word))
                    continue;
                *platform = plats[p];
                *device = devs[d];
                return FLASHCL_SUCCESS;
            }
        }
        if (spec[0] == '\0')
            want = CL_DEVICE_TYPE_ALL; /* default spec, second pass: any device */
        else if (!word)
            break;
    }
    if (!named)
        return flashcl_fail(
            ctx, FLASHCL_ERROR_NO_DEVICE,
            "device spec '%s': no OpenCL platform named '%.*s', nor a device named '%s'", spec,
            (int)(colon - spec), spec, spec);
    return flashcl_fail(ctx, FLASHCL_ERROR_NO_DEVICE, "device spec '%s': no matching device", spec);
}

flashcl_status flashcl_context_create(flashcl_context **out, const char *spec) {
    if (!out)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "flashcl_context_create: out is NULL");
    *out = NULL;
    const char *from = "";
    if (!spec || !spec[0]) {
        spec = getenv("FLASHCL_DEVICE");
        from = spec && spec[0] ? " (from FLASHCL_DEVICE)" : "";
    }
    char lowered[256] = "";
    for (size_t i = 0; spec && spec[i] && i + 1 < sizeof lowered; ++i) {
        lowered[i] = (char)tolower((unsigned char)spec[i]);
        lowered[i + 1] = '\0';
    }
    if (!strcmp(lowered, "host")) {
        flashcl_context *ctx = alloc_context();
        if (!ctx)
            return flashcl_fail(NULL, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
        *out = ctx;
        return make_host(ctx, "the device spec is 'host'");
    }

    /* Failures before the context exists are recorded for flashcl_last_error(NULL). */
    cl_platform_id platform = NULL;
    cl_device_id device = NULL;
    flashcl_status st = pick_device(NULL, lowered, &platform, &device);
    if (st != FLASHCL_SUCCESS) {
        cl_uint nplat = 0;
        /* No OpenCL at all and no device demanded: the host path, which says why in its
         * description (the library prints nothing; FLASHCL_LOG=1 logs it too). */
        cl_int perr = lowered[0] == '\0' ? clGetPlatformIDs(0, NULL, &nplat) : CL_SUCCESS;
        if (lowered[0] == '\0' && (perr != CL_SUCCESS || nplat == 0)) {
            char why[160];
            snprintf(why, sizeof why, "no OpenCL platform was found (clGetPlatformIDs: %s)",
                     flashcl_status_string(perr == CL_SUCCESS ? -1001 : perr));
            flashcl_context *ctx = alloc_context();
            if (!ctx)
                return flashcl_fail(NULL, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
            *out = ctx;
            return make_host(ctx, why);
        }
        if (from[0])
            flashcl_append_error(NULL, from);
        return st;
    }
    cl_int err;
    cl_context clctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (!clctx)
        return flashcl_fail(NULL, err, "device spec '%s'%s: clCreateContext failed (%s)", spec ? spec : "",
                            from, flashcl_status_string(err));
    cl_command_queue queue = clCreateCommandQueue(clctx, device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (!queue) {
        clReleaseContext(clctx);
        return flashcl_fail(NULL, err, "device spec '%s'%s: clCreateCommandQueue failed (%s)",
                            spec ? spec : "", from, flashcl_status_string(err));
    }
    st = flashcl_context_adopt(out, clctx, device, queue);
    /* adopt retained both; drop the creation references. */
    clReleaseCommandQueue(queue);
    clReleaseContext(clctx);
    return st;
}

flashcl_status flashcl_context_adopt(flashcl_context **out, cl_context context, cl_device_id device,
                                     cl_command_queue queue) {
    if (!out)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "flashcl_context_adopt: out is NULL");
    *out = NULL;
    if (!context || !device || !queue)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "flashcl_context_adopt: %s is NULL",
                            !context ? "context" : !device ? "device" : "queue");
    cl_context qctx = NULL;
    cl_device_id qdev = NULL;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof qctx, &qctx, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof qdev, &qdev, NULL);
    if (err != CL_SUCCESS)
        return flashcl_fail(NULL, err, "flashcl_context_adopt: the queue cannot be queried (%s)",
                            flashcl_status_string(err));
    if (qctx != context || qdev != device)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "flashcl_context_adopt: the queue belongs to another %s",
                            qctx != context ? "context" : "device");
    cl_platform_id platform = NULL;
    err = clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL);
    if (err != CL_SUCCESS)
        return flashcl_fail(NULL, err, "flashcl_context_adopt: the device cannot be queried (%s)",
                            flashcl_status_string(err));

    flashcl_context *ctx = alloc_context();
    if (!ctx)
        return flashcl_fail(NULL, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    clRetainContext(context);
    clRetainCommandQueue(queue);
    clRetainDevice(device);
    ctx->cl_ctx = context;
    ctx->queue = queue;
    ctx->device = device;
    ctx->platform = platform;
    read_device_info(platform, device, &ctx->info);
    kernel_limits(ctx);
    describe(ctx, NULL);
    flashcl_clear_error(NULL);
    *out = ctx;
    return FLASHCL_SUCCESS;
}

void flashcl_context_destroy(flashcl_context *ctx) {
    if (!ctx)
        return;
    flashcl_release_programs(ctx);
    flashcl_param_db_free(ctx->params_db);
    if (ctx->serving_meta_reader)
        clReleaseEvent(ctx->serving_meta_reader);
    if (ctx->fp8_scales_reader)
        clReleaseEvent(ctx->fp8_scales_reader);
    free(ctx->fp8_scales_held);
    if (ctx->fp8_vt_reader)
        clReleaseEvent(ctx->fp8_vt_reader);
    for (int i = 0; i < FLASHCL_STAGING_SLOTS; ++i) {
        if (ctx->serving_staging[i].written) { /* the write reads the host copy freed below */
            clWaitForEvents(1, &ctx->serving_staging[i].written);
            clReleaseEvent(ctx->serving_staging[i].written);
        }
        free(ctx->serving_staging[i].host);
    }
    if (ctx->serving_meta)
        clReleaseMemObject(ctx->serving_meta);
    if (ctx->serving_counters)
        clReleaseMemObject(ctx->serving_counters);
    if (ctx->tma_slots)
        clReleaseMemObject(ctx->tma_slots);
    if (ctx->fp8_scales)
        clReleaseMemObject(ctx->fp8_scales);
    if (ctx->fp8_vt)
        clReleaseMemObject(ctx->fp8_vt);
    if (ctx->queue)
        clReleaseCommandQueue(ctx->queue);
    if (ctx->device)
        clReleaseDevice(ctx->device);
    if (ctx->cl_ctx)
        clReleaseContext(ctx->cl_ctx);
    pthread_mutex_destroy(&ctx->lock);
    flashcl_clear_error(ctx); /* a later context at the same address starts clean */
    free(ctx);
}

int flashcl_context_is_host(const flashcl_context *ctx) {
    return ctx ? ctx->is_host : 0;
}

cl_context flashcl_context_cl_context(const flashcl_context *ctx) {
    return ctx ? ctx->cl_ctx : NULL;
}

cl_device_id flashcl_context_cl_device(const flashcl_context *ctx) {
    return ctx ? ctx->device : NULL;
}

cl_command_queue flashcl_context_cl_queue(const flashcl_context *ctx) {
    return ctx ? ctx->queue : NULL;
}

const char *flashcl_context_device_name(const flashcl_context *ctx) {
    return ctx ? ctx->description : "";
}
