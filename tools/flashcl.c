/* flashcl.c: the flashcl command-line tool: devices, attention on .npy files, check and bench. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "flashcl.h"
#include "flashcl_ref.h"
#include "npy.h"
#include "serving_cli.h"
#include "backward_cli.h"
#include "svg_plot.h"
#include "serve_sim.h"
#include "tune.h"

/* CL_PLATFORM_NOT_FOUND_KHR (cl_khr_icd): what the ICD loader returns when
 * no platform is registered; spelled out to avoid needing cl_ext.h. */
#define CLI_CL_PLATFORM_NOT_FOUND (-1001)

/* Problems up to this many multiply-adds (B*Hq*Nq*Nk*D) are validated against
 * the double-precision reference in `bench`, and the reference is timed:
 * about a second or two of the naive loops on one core. */
#define BENCH_REF_MAX_MACS 2147483648.0

/* ======================================================================
 * Usage texts
 * ==================================================================== */

static const char usage_main[] =
    "usage: flashcl <command> [options]\n"
    "\n"
    "commands:\n"
    "  devices     list OpenCL platforms and devices and the parameters flashcl picks\n"
    "  attention   run attention on .npy files\n"
    "  check       compare random problems against the reference implementation\n"
    "  bench       validate, then time the forward kernel\n"
    "  tune        search kernel parameters for a device and save the fastest\n"
    "  serve-sim   replay a request trace: static vs continuous batching on real kernels\n"
    "  spec-sim    check speculative-decoding verification on .npy distributions\n"
    "  help CMD    show the options of a command\n"
    "\n"
    "  --help      show this text\n"
    "  --version   show the tool's and the library's version\n"
    "\n"
    "Devices (--device SPEC, else $FLASHCL_DEVICE, else the first GPU, else any device):\n"
    "  gpu, cpu, accelerator, host (no OpenCL), P:D (platform:device index from\n"
    "  'flashcl devices'), or a word of the platform or device name (nvidia, pocl...).\n";

static const char usage_devices[] =
    "usage: flashcl devices\n"
    "\n"
    "Lists every OpenCL platform and device (name, vendor, type, version, driver,\n"
    "compute units, local memory, max work-group size) and the kernel parameters\n"
    "flashcl picks on each for float16, head_dim 64 and 128, causal and not.\n"
    "Without any OpenCL platform it says so: flashcl then runs its host path.\n";

static const char usage_attention[] =
    "usage: flashcl attention --q Q.npy --k K.npy --v V.npy --out O.npy [options]\n"
    "\n"
    "Computes out = softmax(scale * q k^T + mask) v on .npy files, float32 ('<f4')\n"
    "or float16 ('<f2'), C order, all three of one dtype:\n"
    "  q    (batch, seqlen_q, heads_q, head_dim)\n"
    "  k, v (batch, seqlen_k, heads_k, head_dim)   heads_q a multiple of heads_k\n"
    "  out  like q, in q's dtype;  lse (batch, heads_q, seqlen_q) float32\n"
    "Outputs appear only once complete: nothing is left behind on an error.\n"
    "\n"
    "options:\n"
    "  --lse LSE.npy   also write each row's log-sum-exp (-inf for a row that sees no key)\n"
    "  --causal        causal mask, aligned bottom-right when seqlen_q != seqlen_k\n"
    "  --window L,R    local attention: row i sees keys i-L .. i+R (shifted by\n"
    "                  seqlen_k - seqlen_q); a negative side is unbounded; with\n"
    "                  --causal, R is 0\n"
    "  --softcap C     scores become C * tanh(s / C) (C > 0)\n"
    "  --scale S       score scale (default 1/sqrt(head_dim))\n"
    "  --paged P       store K/V in a paged KV cache of P-token pages (1..256) handed\n"
    "                  out in shuffled order and attend through the page tables\n"
    "                  (flashcl_paged_attention); the output equals the dense one\n"
    "  --device SPEC   see 'flashcl --help'\n"
    "  --backward      gradients dq, dk, dv instead (its own options:\n"
    "                  flashcl attention --backward --help)\n";

static const char usage_check[] =
    "usage: flashcl check [--device SPEC] [--seed N] [--cases N]\n"
    "\n"
    "Runs seeded random problems (float32, float16, bfloat16; odd head dims;\n"
    "seqlen_q != seqlen_k both ways; causal, local windows, softcap, GQA/MQA)\n"
    "through flashcl with fresh inputs and poisoned outputs, and checks each\n"
    "against the double-precision reference. Prints one row per case; exits 1 if\n"
    "any case fails.\n"
    "\n"
    "options:\n"
    "  --seed N    seed of inputs and random shapes (default 1)\n"
    "  --cases N   number of cases (default 12: the fixed set; more adds random shapes)\n"
    "  --device SPEC\n";

static const char usage_bench[] =
    "usage: flashcl bench [options]\n"
    "\n"
    "For each shape: runs once and validates against the reference (when\n"
    "B*Hq*Nq*Nk*D <= 2^31), warms up, then times the kernel with OpenCL profiling\n"
    "events (wall clock on the host path). Reports median and min ms, TFLOP/s\n"
    "(4*B*Hq*Nq*Nk*D / median, halved when causal) and the naive reference's time.\n"
    "Default shapes: 1,8,1024,64  1,8,2048,64  1,8,4096,64  2,16,1024,128 (smaller\n"
    "on a CPU device), non-causal and causal.\n"
    "\n"
    "options:\n"
    "  --shape B,H,N,D        a shape (repeatable); also B,Hq,Hk,Nq,Nk,D\n"
    "  --dtype LIST           storage types, f16,bf16,f32 (default f16)\n"
    "  --causal               causal only (default: both)\n"
    "  --no-causal            non-causal only\n"
    "  --seqlen LIST          sweep: seqlen_q = seqlen_k values, e.g. 512,1024,2048\n"
    "  --head-dim LIST        sweep: head dims (default 64 when sweeping)\n"
    "  --batch LIST           sweep: batch sizes (default 1 when sweeping)\n"
    "  --heads LIST           sweep: heads, heads_q = heads_k (default 8 when sweeping)\n"
    "                         (the sweep is every combination, added to --shape rows;\n"
    "                         default seqlens 512..4096, 256..1024 on a CPU)\n"
    "  --iters N              timed runs (default 20; 5 on a CPU)\n"
    "  --warmup N             untimed runs before timing (default 3; 1 on a CPU)\n"
    "  --long                 add longer default shapes\n"
    "  --memory               also report peak host memory (ru_maxrss), the device\n"
    "                         bytes of q,k,v,out,lse, and the B*H*Nq*Nk*4 bytes a naive\n"
    "                         score matrix would take (fewer runs by default)\n"
    "  --json                 print one JSON object instead of the table\n"
    "  --csv                  print CSV (one header line, one line per row) instead\n"
    "  --plot FILE.svg        also draw TFLOP/s against seqlen, one line per\n"
    "                         configuration (dtype, B, H, D, mask)\n"
    "GB/s counts the bytes of q, k, v, out and lse once (the minimum traffic).\n"
    "  --decode               decode throughput over a paged KV cache instead\n"
    "                         (its own options: flashcl bench --decode --help)\n"
    "  --backward             time the backward pass instead\n"
    "                         (its own options: flashcl bench --backward --help)\n"
    "  --device SPEC\n";

/* ======================================================================
 * Shared helpers
 * ==================================================================== */

/* Prints "flashcl: <message>", a blank line and the usage text to stderr;
 * returns the usage exit status. */
static int usage_error(const char *usage, const char *fmt, ...) CLI_PRINTF(2, 3);

static int usage_error(const char *usage, const char *fmt, ...) {
    va_list ap;
    fputs("flashcl: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n\n", stderr);
    fputs(usage, stderr);
    return CLI_EXIT_USAGE;
}

static int is_help(const char *arg) {
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

/* Prints a library error with the context's message, which may carry a build log. */
static void report_status(const flashcl_context *ctx, const char *what, flashcl_status status) {
    const char *detail = ctx != NULL ? flashcl_last_error(ctx) : "";
    if (detail == NULL)
        detail = "";
    cli_errorf("%s: %s (%d)%s%s", what, flashcl_status_string(status), status, *detail ? ": " : "",
               detail);
}

static flashcl_context *open_context(const char *spec) {
    flashcl_context *ctx = NULL;
    flashcl_status status = flashcl_context_create(&ctx, spec);
    if (status != FLASHCL_SUCCESS) {
        /* A failed create leaves no context to hold a message: the status is all. */
        char label[600];
        cli_errorf("cannot open device %s: %s (%d); 'flashcl devices' lists them",
                   cli_device_label(spec, label, sizeof label), flashcl_status_string(status), status);
        return NULL;
    }
    return ctx;
}

/* a*b*c*d elements without overflowing size_t; -1 if it would. */
static int count4(size_t a, size_t b, size_t c, size_t d, size_t *out) {
    size_t n = a;
    if (b != 0 && n > SIZE_MAX / b)
        return -1;
    n *= b;
    if (c != 0 && n > SIZE_MAX / c)
        return -1;
    n *= c;
    if (d != 0 && n > SIZE_MAX / d)
        return -1;
    *out = n * d;
    return 0;
}

/* A zeroed descriptor with the mask fields meaning "no mask": zero windows
 * would mean "the diagonal only", so unbounded sides are set explicitly. */
static flashcl_attention_desc make_desc(flashcl_dtype dtype, int batch, int heads_q, int heads_k,
                                        int seqlen_q, int seqlen_k, int head_dim) {
    flashcl_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.dtype = dtype;
    desc.batch = batch;
    desc.heads_q = heads_q;
    desc.heads_k = heads_k;
    desc.seqlen_q = seqlen_q;
    desc.seqlen_k = seqlen_k;
    desc.head_dim = head_dim;
    desc.window_left = -1;
    desc.window_right = -1;
    return desc;
}

/* "none", "causal", "causal,L=32", "win(8,8)", then "+cap30" and "+s0.08". */
static void mask_label(int causal, int window_left, int window_right, double softcap, double scale,
                       char *buf, size_t size) {
    int n;
    if (causal && window_left >= 0)
        n = snprintf(buf, size, "causal,L=%d", window_left);
    else if (causal)
        n = snprintf(buf, size, "causal");
    else if (window_left >= 0 || window_right >= 0)
        n = snprintf(buf, size, "win(%d,%d)", window_left, window_right);
    else
        n = snprintf(buf, size, "none");
    if (n < 0 || (size_t)n >= size)
        return;
    if (softcap > 0)
        n += snprintf(buf + n, size - (size_t)n, "+cap%g", softcap);
    if (n < 0 || (size_t)n >= size)
        return;
    if (scale > 0)
        snprintf(buf + n, size - (size_t)n, "+s%.3g", scale);
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ======================================================================
 * flashcl devices
 * ==================================================================== */

static void platform_string(cl_platform_id platform, cl_platform_info what, char *buf,
                            size_t size) {
    if (clGetPlatformInfo(platform, what, size - 1, buf, NULL) != CL_SUCCESS)
        snprintf(buf, size, "?");
    buf[size - 1] = '\0';
}

static void device_string(cl_device_id device, cl_device_info what, char *buf, size_t size) {
    if (clGetDeviceInfo(device, what, size - 1, buf, NULL) != CL_SUCCESS)
        snprintf(buf, size, "?");
    buf[size - 1] = '\0';
}

static void format_bytes(unsigned long long bytes, char *buf, size_t size) {
    if (bytes >= (1ull << 30))
        snprintf(buf, size, "%.1f GiB", (double)bytes / (double)(1ull << 30));
    else if (bytes >= (1ull << 20))
        snprintf(buf, size, "%.1f MiB", (double)bytes / (double)(1ull << 20));
    else if (bytes >= 1024)
        snprintf(buf, size, "%llu KiB", bytes / 1024);
    else
        snprintf(buf, size, "%llu bytes", bytes);
}

static void format_device_type(cl_device_type type, char *buf, size_t size) {
    size_t used = 0;
    static const struct {
        cl_device_type bit;
        const char *name;
    } names[] = {{CL_DEVICE_TYPE_CPU, "CPU"},
                 {CL_DEVICE_TYPE_GPU, "GPU"},
                 {CL_DEVICE_TYPE_ACCELERATOR, "accelerator"},
                 {CL_DEVICE_TYPE_DEFAULT, "default"}};
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if ((type & names[i].bit) && used < size) {
            int n = snprintf(buf + used, size - used, "%s%s", used ? "+" : "", names[i].name);
            if (n > 0)
                used += (size_t)n;
        }
    }
    if (buf[0] == '\0')
        snprintf(buf, size, "other (0x%llx)", (unsigned long long)type);
}

/* The parameters flashcl picks for representative float16 problems. */
static void print_params(flashcl_context *ctx, const char *indent) {
    /* Prefill rows of each head_dim class, then the classes that differ:
     * float32 (no tensor cores) and decode (seqlen_q = 1). */
    static const struct {
        flashcl_dtype dtype;
        int head_dim, causal, seqlen_q;
    } reps[] = {{FLASHCL_FLOAT16, 64, 0, 1024},  {FLASHCL_FLOAT16, 64, 1, 1024},
                {FLASHCL_FLOAT16, 128, 0, 1024}, {FLASHCL_FLOAT16, 128, 1, 1024},
                {FLASHCL_FLOAT16, 256, 0, 1024}, {FLASHCL_FLOAT32, 64, 0, 1024},
                {FLASHCL_FLOAT16, 128, 0, 1}};
    const char *problem = NULL, *tuning = flashcl_tuning_file(ctx, &problem);
    if (tuning != NULL)
        printf("%stuning file: %s (%s)\n", indent, tuning,
               problem != NULL                  ? problem
               : access(tuning, F_OK) == 0      ? "read"
                                                : "none yet: 'flashcl tune' writes it");
    printf("%s%-5s %-4s %-7s %-5s %7s %7s %11s %4s  %-9s %s\n", indent, "dtype", "D", "mask", "Nq",
           "block_m", "block_n", "threads/row", "wg", "variant", "source");
    for (size_t i = 0; i < sizeof reps / sizeof reps[0]; i++) {
        flashcl_attention_desc desc =
            make_desc(reps[i].dtype, 1, 8, 8, reps[i].seqlen_q, 1024, reps[i].head_dim);
        flashcl_params params;
        flashcl_status status;
        desc.causal = reps[i].causal;
        memset(&params, 0, sizeof params);
        status = flashcl_attention_params(ctx, &desc, &params);
        printf("%s%-5s %-4d %-7s %-5d ", indent, cli_dtype_name(reps[i].dtype), reps[i].head_dim,
               reps[i].causal ? "causal" : "none", reps[i].seqlen_q);
        if (status != FLASHCL_SUCCESS) {
            const char *detail = flashcl_last_error(ctx);
            printf("error: %s (%d)%s%s\n", flashcl_status_string(status), status,
                   detail && *detail ? ": " : "", detail ? detail : "");
            continue;
        }
        printf("%7d %7d %11d %4d  %-9s %s\n", params.block_m, params.block_n, params.threads_per_row,
               params.work_group_size, params.variant ? params.variant : "?",
               params.source ? params.source : "?");
    }
}

static void print_context_params(const char *spec, const char *indent) {
    flashcl_context *ctx = NULL;
    flashcl_status status = flashcl_context_create(&ctx, spec);
    if (status != FLASHCL_SUCCESS) {
        printf("%sflashcl cannot use it (spec \"%s\"): %s (%d)\n", indent, spec,
               flashcl_status_string(status), status);
        return;
    }
    printf("%sflashcl, spec \"%s\": %s%s\n", indent, spec, flashcl_context_device_name(ctx),
           flashcl_context_is_host(ctx) ? " [host path]" : "");
    print_params(ctx, indent);
    flashcl_context_destroy(ctx);
}

static int cmd_devices(int argc, char **argv) {
    cl_uint num_platforms = 0;
    cl_platform_id *platforms = NULL;
    cl_int err;

    for (int i = 2; i < argc; i++) {
        if (is_help(argv[i])) {
            fputs(usage_devices, stdout);
            return CLI_EXIT_OK;
        }
        return usage_error(usage_devices, "unknown option '%s' for 'flashcl devices'", argv[i]);
    }

    err = clGetPlatformIDs(0, NULL, &num_platforms);
    if (err == CLI_CL_PLATFORM_NOT_FOUND || (err == CL_SUCCESS && num_platforms == 0)) {
        printf("No OpenCL platform found: flashcl uses its host path (multi-threaded C).\n");
        print_context_params("host", "  ");
        return CLI_EXIT_OK;
    }
    if (err != CL_SUCCESS) {
        cli_errorf("clGetPlatformIDs failed: %s (%d)", flashcl_status_string(err), err);
        return CLI_EXIT_FAIL;
    }
    platforms = malloc(num_platforms * sizeof *platforms);
    if (platforms == NULL) {
        cli_errorf("out of memory");
        return CLI_EXIT_FAIL;
    }
    err = clGetPlatformIDs(num_platforms, platforms, NULL);
    if (err != CL_SUCCESS) {
        cli_errorf("clGetPlatformIDs failed: %s (%d)", flashcl_status_string(err), err);
        free(platforms);
        return CLI_EXIT_FAIL;
    }

    for (cl_uint p = 0; p < num_platforms; p++) {
        char name[512], vendor[512], version[512];
        cl_uint num_devices = 0;
        cl_device_id *devices;
        platform_string(platforms[p], CL_PLATFORM_NAME, name, sizeof name);
        platform_string(platforms[p], CL_PLATFORM_VENDOR, vendor, sizeof vendor);
        platform_string(platforms[p], CL_PLATFORM_VERSION, version, sizeof version);
        printf("%sPlatform %u: %s\n", p ? "\n" : "", p, name);
        printf("  vendor           %s\n  version          %s\n", vendor, version);

        err = clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 0, NULL, &num_devices);
        if (err == CL_DEVICE_NOT_FOUND || (err == CL_SUCCESS && num_devices == 0)) {
            printf("  (no devices)\n");
            continue;
        }
        if (err != CL_SUCCESS) {
            printf("  clGetDeviceIDs failed: %s (%d)\n", flashcl_status_string(err), err);
            continue;
        }
        devices = malloc(num_devices * sizeof *devices);
        if (devices == NULL) {
            cli_errorf("out of memory");
            free(platforms);
            return CLI_EXIT_FAIL;
        }
        err = clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, num_devices, devices, NULL);
        if (err != CL_SUCCESS) {
            printf("  clGetDeviceIDs failed: %s (%d)\n", flashcl_status_string(err), err);
            free(devices);
            continue;
        }
        for (cl_uint d = 0; d < num_devices; d++) {
            char dname[512], dvendor[512], dversion[512], driver[512], type_text[64];
            char local_text[32], global_text[32], alloc_text[32], spec[32];
            cl_device_type type = 0;
            cl_uint units = 0;
            cl_ulong local_mem = 0, global_mem = 0, max_alloc = 0;
            size_t max_wg = 0;
            device_string(devices[d], CL_DEVICE_NAME, dname, sizeof dname);
            device_string(devices[d], CL_DEVICE_VENDOR, dvendor, sizeof dvendor);
            device_string(devices[d], CL_DEVICE_VERSION, dversion, sizeof dversion);
            device_string(devices[d], CL_DRIVER_VERSION, driver, sizeof driver);
            clGetDeviceInfo(devices[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
            clGetDeviceInfo(devices[d], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL);
            clGetDeviceInfo(devices[d], CL_DEVICE_LOCAL_MEM_SIZE, sizeof local_mem, &local_mem,
                            NULL);
            clGetDeviceInfo(devices[d], CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global_mem, &global_mem,
                            NULL);
            clGetDeviceInfo(devices[d], CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc,
                            NULL);
            clGetDeviceInfo(devices[d], CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg,
                            NULL);
            format_device_type(type, type_text, sizeof type_text);
            format_bytes(local_mem, local_text, sizeof local_text);
            format_bytes(global_mem, global_text, sizeof global_text);
            format_bytes(max_alloc, alloc_text, sizeof alloc_text);
            printf("\n  Device %u:%u: %s\n", p, d, dname);
            printf("    vendor         %s\n", dvendor);
            printf("    type           %s\n", type_text);
            printf("    version        %s\n", dversion);
            printf("    driver         %s\n", driver);
            printf("    compute units  %u\n", units);
            printf("    local memory   %s\n", local_text);
            printf("    global memory  %s (max allocation %s)\n", global_text, alloc_text);
            printf("    max work-group %zu\n", max_wg);
            snprintf(spec, sizeof spec, "%u:%u", p, d);
            print_context_params(spec, "    ");
        }
        free(devices);
    }
    free(platforms);
    return CLI_EXIT_OK;
}

/* ======================================================================
 * flashcl attention
 * ==================================================================== */

static const char *const dim_names[4] = {"batch", "seqlen", "heads", "head_dim"};

/* Reads one input and checks what does not depend on the other inputs. */
static int load_input(const char *path, npy_array *array, char *shape_text, size_t shape_size) {
    char err[512];
    if (npy_read(path, array, err, sizeof err) != 0) {
        cli_errorf("%s: %s", path, err);
        return -1;
    }
    npy_format_shape(array->shape, array->ndim, shape_text, shape_size);
    if (array->ndim != 4) {
        cli_errorf("%s: shape %s has %d dimension%s, expected 4: (batch, seqlen, heads, head_dim)",
                   path, shape_text, array->ndim, array->ndim == 1 ? "" : "s");
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        if (array->shape[i] == 0) {
            cli_errorf("%s: shape %s has a zero dimension (%s)", path, shape_text, dim_names[i]);
            return -1;
        }
        if (array->shape[i] > INT_MAX) {
            cli_errorf("%s: shape %s: %s %zu is too large", path, shape_text, dim_names[i],
                       array->shape[i]);
            return -1;
        }
    }
    if (array->shape[3] > 256) {
        cli_errorf("%s: shape %s: head_dim %zu exceeds flashcl's limit of 256", path, shape_text,
                   array->shape[3]);
        return -1;
    }
    return 0;
}

/* Writes both outputs to temporary files, then renames them into place, so
 * that an output path names either a complete result or nothing new. */
static int write_outputs(const char *out_path, const npy_array *q, const void *out,
                         const char *lse_path, const size_t *lse_shape, const float *lse) {
    char err[512];
    char *tmp_out = NULL, *tmp_lse = NULL;
    int rc = -1, out_renamed = 0;

    if (npy_write_temp(out_path, q->dtype, q->shape, 4, out, &tmp_out, err, sizeof err) != 0) {
        cli_errorf("%s: %s", out_path, err);
        goto done;
    }
    if (lse_path != NULL &&
        npy_write_temp(lse_path, NPY_FLOAT32, lse_shape, 3, lse, &tmp_lse, err, sizeof err) != 0) {
        cli_errorf("%s: %s", lse_path, err);
        goto done;
    }
    if (rename(tmp_out, out_path) != 0) {
        cli_errorf("%s: cannot move the finished file into place: %s", out_path, strerror(errno));
        goto done;
    }
    out_renamed = 1;
    if (tmp_lse != NULL && rename(tmp_lse, lse_path) != 0) {
        cli_errorf("%s: cannot move the finished file into place: %s", lse_path, strerror(errno));
        /* Keep the pair consistent: no out without the lse that was asked for. */
        unlink(out_path);
        goto done;
    }
    rc = 0;
done:
    if (tmp_out != NULL && !out_renamed)
        unlink(tmp_out);
    if (tmp_lse != NULL && rc != 0)
        unlink(tmp_lse);
    free(tmp_out);
    free(tmp_lse);
    return rc;
}

static int cmd_attention(int argc, char **argv) {
    const char *q_path = NULL, *k_path = NULL, *v_path = NULL, *out_path = NULL;
    const char *lse_path = NULL, *device = NULL, *value;
    int causal = 0, window_left = -1, window_right = -1, paged = 0;
    double softcap = 0.0, scale = 0.0, t0, elapsed;
    npy_array q, k, v;
    char q_shape[256], k_shape[256], v_shape[256];
    flashcl_attention_desc desc;
    flashcl_context *ctx = NULL;
    flashcl_status status;
    void *out = NULL;
    float *lse = NULL;
    size_t lse_shape[3], lse_count;
    int rc = CLI_EXIT_FAIL;

    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--backward") == 0) /* gradients: tools/backward_cli.c */
            return cli_attention_backward(argc, argv);
    memset(&q, 0, sizeof q);
    memset(&k, 0, sizeof k);
    memset(&v, 0, sizeof v);
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int r;
        if (is_help(arg)) {
            fputs(usage_attention, stdout);
            return CLI_EXIT_OK;
        } else if ((r = cli_take_value(argc, argv, &i, "--q", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            q_path = value;
        } else if ((r = cli_take_value(argc, argv, &i, "--k", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            k_path = value;
        } else if ((r = cli_take_value(argc, argv, &i, "--v", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            v_path = value;
        } else if ((r = cli_take_value(argc, argv, &i, "--out", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            out_path = value;
        } else if ((r = cli_take_value(argc, argv, &i, "--lse", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            lse_path = value;
        } else if ((r = cli_take_value(argc, argv, &i, "--device", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            device = value;
        } else if ((r = cli_take_value(argc, argv, &i, "--window", &value)) != 0) {
            long w[2];
            int n = 0;
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_long_list(value, -(long)INT_MAX, INT_MAX, w, 2, &n) != 0 || n != 2)
                return usage_error(usage_attention, "--window wants L,R (integers), not '%s'",
                                   value);
            window_left = w[0] < 0 ? -1 : (int)w[0];
            window_right = w[1] < 0 ? -1 : (int)w[1];
        } else if ((r = cli_take_value(argc, argv, &i, "--softcap", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_double(value, &softcap) != 0 || softcap < 0 || softcap > FLT_MAX)
                return usage_error(usage_attention,
                                   "--softcap wants a number in [0, %g] (0: no cap), not '%s'", FLT_MAX, value);
        } else if ((r = cli_take_value(argc, argv, &i, "--scale", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_double(value, &scale) != 0 || scale < 0 || scale > FLT_MAX)
                return usage_error(usage_attention,
                                   "--scale wants a number in [0, %g] (0: 1/sqrt(head_dim)), not '%s'", FLT_MAX,
                                   value);
        } else if ((r = cli_take_value(argc, argv, &i, "--paged", &value)) != 0) {
            long p;
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_long(value, 1, 256, &p) != 0)
                return usage_error(usage_attention, "--paged wants a page size 1..256, not '%s'", value);
            paged = (int)p;
        } else if (strcmp(arg, "--causal") == 0) {
            causal = 1;
        } else {
            return usage_error(usage_attention, "unknown option '%s' for 'flashcl attention'", arg);
        }
    }
    if (q_path == NULL || k_path == NULL || v_path == NULL || out_path == NULL)
        return usage_error(usage_attention, "%s", "attention needs --q, --k, --v and --out");
    /* By file identity, not by name: "--out ./q.npy" or a link to q.npy
     * would truncate an input before it is read. */
    {
        const char *const names[5] = {"--q", "--k", "--v", "--out", "--lse"};
        const char *const paths[5] = {q_path, k_path, v_path, out_path, lse_path};
        if (cli_check_outputs(names, paths, 3, 5) != 0)
            return CLI_EXIT_USAGE;
    }

    /* Each file is checked on its own first, then against q, so that every
     * message names the file at fault. */
    if (load_input(q_path, &q, q_shape, sizeof q_shape) != 0 ||
        load_input(k_path, &k, k_shape, sizeof k_shape) != 0)
        goto done;
    if (k.dtype != q.dtype) {
        cli_errorf("%s: dtype %s does not match q's %s", k_path, npy_dtype_name(k.dtype),
                   npy_dtype_name(q.dtype));
        goto done;
    }
    if (k.shape[0] != q.shape[0]) {
        cli_errorf("%s: shape %s does not match q's batch %zu", k_path, k_shape, q.shape[0]);
        goto done;
    }
    if (k.shape[3] != q.shape[3]) {
        cli_errorf("%s: shape %s does not match q's head_dim %zu", k_path, k_shape, q.shape[3]);
        goto done;
    }
    if (q.shape[2] % k.shape[2] != 0) {
        cli_errorf("%s: shape %s: heads_k %zu does not divide q's heads %zu", k_path, k_shape,
                   k.shape[2], q.shape[2]);
        goto done;
    }
    if (load_input(v_path, &v, v_shape, sizeof v_shape) != 0)
        goto done;
    if (v.dtype != q.dtype) {
        cli_errorf("%s: dtype %s does not match q's %s", v_path, npy_dtype_name(v.dtype),
                   npy_dtype_name(q.dtype));
        goto done;
    }
    if (memcmp(v.shape, k.shape, 4 * sizeof k.shape[0]) != 0) {
        cli_errorf("%s: shape %s does not match k's shape %s", v_path, v_shape, k_shape);
        goto done;
    }

    desc = make_desc(q.dtype == NPY_FLOAT16 ? FLASHCL_FLOAT16 : FLASHCL_FLOAT32, (int)q.shape[0],
                     (int)q.shape[2], (int)k.shape[2], (int)q.shape[1], (int)k.shape[1],
                     (int)q.shape[3]);
    desc.causal = causal;
    desc.windowed = window_left >= 0 || window_right >= 0;
    desc.window_left = window_left;
    desc.window_right = window_right;
    desc.softcap = (float)softcap;
    desc.scale = (float)scale;
    status = flashcl_attention_desc_resolve(&desc);
    if (status != FLASHCL_SUCCESS) {
        report_status(NULL, "invalid attention problem", status);
        goto done;
    }

    lse_shape[0] = q.shape[0];
    lse_shape[1] = q.shape[2];
    lse_shape[2] = q.shape[1];
    lse_count = lse_shape[0] * lse_shape[1] * lse_shape[2];
    out = malloc(q.count * npy_dtype_size(q.dtype));
    lse = lse_path != NULL ? malloc(lse_count * sizeof *lse) : NULL;
    if (out == NULL || (lse_path != NULL && lse == NULL)) {
        cli_errorf("out of memory for the outputs");
        goto done;
    }

    ctx = open_context(device);
    if (ctx == NULL)
        goto done;
    t0 = cli_now();
    if (paged) /* prints its own reason on failure */
        status = cli_paged_forward_host(ctx, &desc, paged, q.data, k.data, v.data, out, lse);
    else
        status = flashcl_attention_forward_host(ctx, &desc, q.data, k.data, v.data, out, lse);
    elapsed = cli_now() - t0;
    if (status != FLASHCL_SUCCESS) {
        if (!paged)
            report_status(ctx, "attention failed", status);
        goto done;
    }
    if (write_outputs(out_path, &q, out, lse_path, lse_shape, lse) != 0)
        goto done;
    {
        /* The device's name, without the "(platform, version...)" tail. */
        const char *name = flashcl_context_device_name(ctx);
        const char *paren = strstr(name, " (");
        printf("%s: %s %s, %.1f ms on %.*s\n", out_path, q_shape, npy_dtype_name(q.dtype),
               elapsed * 1e3, paren ? (int)(paren - name) : (int)strlen(name), name);
    }
    rc = CLI_EXIT_OK;
done:
    flashcl_context_destroy(ctx);
    free(out);
    free(lse);
    npy_free(&q);
    npy_free(&k);
    npy_free(&v);
    return rc;
}

/* ======================================================================
 * flashcl check
 * ==================================================================== */

typedef struct check_case {
    flashcl_dtype dtype;
    int batch, heads_q, heads_k, seqlen_q, seqlen_k, head_dim;
    int causal, window_left, window_right;
    float softcap, scale;
} check_case;

/* The fixed set: every feature at least once, sizes that are not tile
 * multiples; the first four alone cover the three dtypes, odd head dims,
 * GQA/MQA, Nq < Nk and Nq > Nk, causal with empty rows, windows and softcap. */
static const check_case fixed_cases[] = {
    /* dtype           B  Hq Hk  Nq   Nk    D  causal wl  wr  softcap scale */
    {FLASHCL_FLOAT16, 1, 4, 4, 65, 65, 64, 1, -1, -1, 0.0f, 0.0f},
    {FLASHCL_FLOAT32, 2, 6, 2, 17, 130, 59, 0, -1, -1, 0.0f, 0.0f},   /* GQA 3:1, Nq < Nk */
    {FLASHCL_BFLOAT16, 1, 4, 1, 113, 40, 111, 1, -1, -1, 0.0f, 0.0f}, /* MQA, empty rows */
    {FLASHCL_FLOAT16, 1, 2, 2, 100, 100, 128, 0, 16, 0, 30.0f, 0.0f}, /* window + softcap */
    {FLASHCL_FLOAT32, 1, 3, 3, 1, 257, 32, 1, -1, -1, 0.0f, 0.0f},    /* one query (decode) */
    {FLASHCL_FLOAT16, 2, 4, 2, 77, 93, 80, 0, 8, 8, 0.0f, 0.0f},      /* symmetric window */
    {FLASHCL_BFLOAT16, 1, 2, 2, 31, 31, 256, 0, -1, -1, 0.0f, 0.0f},  /* largest head_dim */
    {FLASHCL_FLOAT16, 1, 2, 1, 64, 64, 1, 1, -1, -1, 0.0f, 0.0f},     /* head_dim 1 */
    {FLASHCL_FLOAT32, 1, 2, 2, 129, 64, 96, 1, 32, -1, 20.0f, 0.08f}, /* everything at once */
    {FLASHCL_BFLOAT16, 1, 8, 2, 200, 200, 64, 1, -1, -1, 0.0f, 0.0f},
    {FLASHCL_FLOAT16, 3, 3, 3, 2, 7, 16, 0, -1, -1, 0.0f, 0.0f},
    {FLASHCL_FLOAT32, 1, 1, 1, 255, 513, 40, 0, -1, -1, 0.0f, 0.0f},
};
#define NUM_FIXED_CASES ((int)(sizeof fixed_cases / sizeof fixed_cases[0]))

/* The reference runs in double twice per case (exact and plain); this bound
 * on B*Hq*Nq*Nk*D keeps a random case to a few tens of milliseconds. */
#define CHECK_MAX_MACS 4000000.0

static int pick(flashcl_ref_rng *rng, int n) {
    return (int)(flashcl_ref_rng_next(rng) % (uint64_t)n);
}

static void random_case(flashcl_ref_rng *rng, check_case *c) {
    static const int dims[] = {1,  3,  8,  16,  24,  32,  40,  48,  59, 64,
                               72, 80, 96, 100, 111, 128, 160, 192, 256};
    static const int lens[] = {1,  2,  3,   7,   16,  17,  31,  32,  33, 63,
                               64, 65, 100, 113, 127, 128, 129, 200, 255};
    static const int ratios[] = {1, 1, 2, 4};
    int mask;
    memset(c, 0, sizeof *c);
    c->dtype = (flashcl_dtype)pick(rng, 3);
    c->head_dim = dims[pick(rng, (int)(sizeof dims / sizeof dims[0]))];
    c->heads_k = 1 + pick(rng, 3);
    c->heads_q = c->heads_k * ratios[pick(rng, 4)];
    c->batch = 1 + pick(rng, 2);
    c->seqlen_q = lens[pick(rng, (int)(sizeof lens / sizeof lens[0]))];
    c->seqlen_k = lens[pick(rng, (int)(sizeof lens / sizeof lens[0]))];
    c->window_left = c->window_right = -1;
    mask = pick(rng, 4);
    if (mask == 1 || mask == 3)
        c->causal = 1;
    if (mask >= 2) {
        c->window_left = pick(rng, 65);
        if (mask == 2)
            c->window_right = pick(rng, 5) == 0 ? -1 : pick(rng, 65);
    }
    if (pick(rng, 4) == 0)
        c->softcap = (float)(10 + pick(rng, 41));
    if (pick(rng, 5) == 0)
        c->scale = (float)(20 + pick(rng, 281)) / 1000.0f; /* 0.02 .. 0.3 */
    while ((double)c->batch * c->heads_q * c->seqlen_q * c->seqlen_k * c->head_dim >
           CHECK_MAX_MACS) {
        if (c->seqlen_q >= c->seqlen_k)
            c->seqlen_q = (c->seqlen_q + 1) / 2;
        else
            c->seqlen_k = (c->seqlen_k + 1) / 2;
    }
}

/* Runs one case; returns 1 on pass. Prints its table row. */
static int run_check_case(flashcl_context *ctx, int index, const check_case *c, uint64_t seed) {
    flashcl_attention_desc desc = make_desc(c->dtype, c->batch, c->heads_q, c->heads_k, c->seqlen_q,
                                            c->seqlen_k, c->head_dim);
    flashcl_ref_report report;
    flashcl_ref_rng rng;
    flashcl_status status;
    size_t esz = flashcl_dtype_size(c->dtype), nq = 0, nk = 0, nlse = 0;
    void *q = NULL, *k = NULL, *v = NULL, *out = NULL;
    float *lse = NULL;
    char mask[64];
    double t0, ms;
    int passed = 0;

    desc.causal = c->causal;
    desc.windowed = c->window_left >= 0 || c->window_right >= 0;
    desc.window_left = c->window_left;
    desc.window_right = c->window_right;
    desc.softcap = c->softcap;
    desc.scale = c->scale;
    mask_label(c->causal, c->window_left, c->window_right, c->softcap, c->scale, mask, sizeof mask);
    printf("%4d  %-4s %3d %3d %3d %5d %5d %4d  %-22s ", index, cli_dtype_name(c->dtype), c->batch,
           c->heads_q, c->heads_k, c->seqlen_q, c->seqlen_k, c->head_dim, mask);
    fflush(stdout);

    status = flashcl_attention_desc_resolve(&desc);
    if (status != FLASHCL_SUCCESS) {
        printf("FAIL\n");
        report_status(NULL, "case description rejected", status);
        return 0;
    }
    count4((size_t)c->batch, (size_t)c->seqlen_q, (size_t)c->heads_q, (size_t)c->head_dim, &nq);
    count4((size_t)c->batch, (size_t)c->seqlen_k, (size_t)c->heads_k, (size_t)c->head_dim, &nk);
    nlse = (size_t)c->batch * (size_t)c->heads_q * (size_t)c->seqlen_q;
    q = malloc(nq * esz);
    k = malloc(nk * esz);
    v = malloc(nk * esz);
    out = malloc(nq * esz);
    lse = malloc(nlse * sizeof *lse);
    if (q == NULL || k == NULL || v == NULL || out == NULL || lse == NULL) {
        printf("FAIL\n");
        cli_errorf("out of memory");
        goto done;
    }
    /* Fresh inputs per case from a stream keyed by (seed, case), and poisoned
     * outputs so that anything the kernel forgets to write fails. */
    flashcl_ref_rng_seed(&rng, seed * 0x9E3779B97F4A7C15ull + (uint64_t)index + 1u);
    flashcl_ref_fill_normal(&rng, q, c->dtype, nq, 1.0);
    flashcl_ref_fill_normal(&rng, k, c->dtype, nk, 1.0);
    flashcl_ref_fill_normal(&rng, v, c->dtype, nk, 1.0);
    flashcl_ref_poison(out, c->dtype, nq);
    flashcl_ref_poison(lse, FLASHCL_FLOAT32, nlse);

    t0 = cli_now();
    status = flashcl_attention_forward_host(ctx, &desc, q, k, v, out, lse);
    ms = (cli_now() - t0) * 1e3;
    if (status != FLASHCL_SUCCESS) {
        printf("%10s %10s %10s %8.1f  FAIL\n", "-", "-", "-", ms);
        report_status(ctx, "forward failed", status);
        goto done;
    }
    memset(&report, 0, sizeof report);
    passed = flashcl_ref_check_forward(&desc, q, k, v, out, lse, 0, &report);
    printf("%10.3g %10.3g %10.3g %8.1f  %s\n", report.max_err, report.tolerance, report.max_lse_err,
           ms, passed ? "PASS" : "FAIL");
    if (!passed) {
        fflush(stdout);
        fprintf(stderr,
                "  case %d: %zu mismatches; first bad out element b=%zu i=%zu h=%zu d=%zu\n", index,
                report.mismatches, report.first_bad[0], report.first_bad[1], report.first_bad[2],
                report.first_bad[3]);
        /* Again, verbosely: the first mismatches with their indices. */
        flashcl_ref_check_forward(&desc, q, k, v, out, lse, 1, &report);
    }
done:
    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
    fflush(stdout);
    return passed;
}

static int cmd_check(int argc, char **argv) {
    const char *device = NULL, *value;
    long cases = NUM_FIXED_CASES, seed_long = 1;
    flashcl_context *ctx;
    flashcl_ref_rng shape_rng;
    int failures = 0;
    double t0;

    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int r;
        if (is_help(arg)) {
            fputs(usage_check, stdout);
            return CLI_EXIT_OK;
        } else if ((r = cli_take_value(argc, argv, &i, "--device", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            device = value;
        } else if ((r = cli_take_value(argc, argv, &i, "--seed", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_long(value, 0, LONG_MAX, &seed_long) != 0)
                return usage_error(usage_check, "--seed wants a non-negative integer, not '%s'",
                                   value);
        } else if ((r = cli_take_value(argc, argv, &i, "--cases", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_long(value, 1, 1000000, &cases) != 0)
                return usage_error(usage_check, "--cases wants an integer >= 1, not '%s'", value);
        } else {
            return usage_error(usage_check, "unknown option '%s' for 'flashcl check'", arg);
        }
    }

    ctx = open_context(device);
    if (ctx == NULL)
        return CLI_EXIT_FAIL;
    printf("flashcl check: %s%s, seed %ld, %ld case%s\n", flashcl_context_device_name(ctx),
           flashcl_context_is_host(ctx) ? " [host path]" : "", seed_long, cases,
           cases == 1 ? "" : "s");
    printf("%4s  %-4s %3s %3s %3s %5s %5s %4s  %-22s %10s %10s %10s %8s  %s\n", "case", "dtype",
           "B", "Hq", "Hk", "Nq", "Nk", "D", "mask", "max_err", "tolerance", "lse_err", "ms",
           "result");
    flashcl_ref_rng_seed(&shape_rng, (uint64_t)seed_long);
    t0 = cli_now();
    for (long i = 0; i < cases; i++) {
        check_case c;
        if (i < NUM_FIXED_CASES)
            c = fixed_cases[i];
        else
            random_case(&shape_rng, &c);
        if (!run_check_case(ctx, (int)i, &c, (uint64_t)seed_long))
            failures++;
    }
    printf("%ld/%ld passed in %.1f s\n", cases - failures, cases, cli_now() - t0);
    flashcl_context_destroy(ctx);
    if (failures) {
        cli_errorf("%d of %ld cases failed", failures, cases);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

/* ======================================================================
 * flashcl bench
 * ==================================================================== */

typedef struct bench_shape {
    int batch, heads_q, heads_k, seqlen_q, seqlen_k, head_dim;
} bench_shape;

typedef struct bench_row {
    bench_shape s;
    flashcl_dtype dtype;
    int causal;
    int validated; /* 1 passed, 0 failed, -1 not run (too large, or an error first) */
    double max_err, tolerance;
    int iters;
    double median_ms, min_ms, tflops; /* < 0 when not timed */
    double ref_ms;                    /* < 0 when the reference was not run */
    size_t device_bytes, naive_bytes, peak_rss;
    char error[1024]; /* empty when the row ran */
} bench_row;

typedef struct bench_options {
    flashcl_dtype dtype;
    int iters, warmup, memory, json;
    int csv;          /* CSV instead of the table */
    const char *plot; /* SVG path, or NULL */
} bench_options;

static void row_error(bench_row *row, const flashcl_context *ctx, const char *what,
                      flashcl_status status) {
    const char *detail = ctx != NULL ? flashcl_last_error(ctx) : "";
    snprintf(row->error, sizeof row->error, "%s: %s (%d)%s%s", what, flashcl_status_string(status),
             status, detail && *detail ? ": " : "", detail ? detail : "");
}

/* Validates `out`/`lse` (host copies of the first run) against the reference. */
static void bench_validate(bench_row *row, const flashcl_attention_desc *desc, const void *q,
                           const void *k, const void *v, const void *out, const float *lse) {
    flashcl_ref_report report;
    memset(&report, 0, sizeof report);
    row->validated = flashcl_ref_check_forward(desc, q, k, v, out, lse, 0, &report) ? 1 : 0;
    row->max_err = report.max_err;
    row->tolerance = report.tolerance;
    if (!row->validated)
        snprintf(row->error, sizeof row->error,
                 "validation failed: max_err %.3g > tolerance %.3g (%zu mismatches); not timed",
                 report.max_err, report.tolerance, report.mismatches);
}

static void finish_times(bench_row *row, double *times, int n, double flops) {
    qsort(times, (size_t)n, sizeof *times, compare_doubles);
    row->iters = n;
    row->min_ms = times[0];
    row->median_ms = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    row->tflops = row->median_ms > 0 ? flops / (row->median_ms * 1e-3) / 1e12 : -1.0;
}

/* Runs one shape: validate, warm up, time; fills row. */
static void run_bench_row(flashcl_context *ctx, const bench_options *opt, bench_row *row) {
    const bench_shape *s = &row->s;
    flashcl_attention_desc desc = make_desc(opt->dtype, s->batch, s->heads_q, s->heads_k,
                                            s->seqlen_q, s->seqlen_k, s->head_dim);
    size_t esz = flashcl_dtype_size(opt->dtype), nq, nk, nlse, naive;
    double macs = (double)s->batch * s->heads_q * s->seqlen_q * s->seqlen_k * s->head_dim;
    double flops = 4.0 * macs * (row->causal ? 0.5 : 1.0);
    int feasible = macs <= BENCH_REF_MAX_MACS, is_host = flashcl_context_is_host(ctx);
    void *q = NULL, *k = NULL, *v = NULL, *out = NULL;
    float *lse = NULL;
    double *times = NULL;
    cl_mem bufs[5] = {NULL, NULL, NULL, NULL, NULL};
    size_t sizes[5] = {0, 0, 0, 0, 0};
    flashcl_ref_rng rng;
    flashcl_status status;

    row->dtype = opt->dtype;
    row->validated = -1;
    row->median_ms = row->min_ms = row->tflops = row->ref_ms = -1.0;
    row->error[0] = '\0';
    desc.causal = row->causal;
    status = flashcl_attention_desc_resolve(&desc);
    if (status != FLASHCL_SUCCESS) {
        row_error(row, NULL, "descriptor rejected", status);
        return;
    }
    if (count4((size_t)s->batch, (size_t)s->seqlen_q, (size_t)s->heads_q, (size_t)s->head_dim,
               &nq) != 0 ||
        count4((size_t)s->batch, (size_t)s->seqlen_k, (size_t)s->heads_k, (size_t)s->head_dim,
               &nk) != 0 ||
        count4((size_t)s->batch, (size_t)s->heads_q, (size_t)s->seqlen_q, 1, &nlse) != 0 ||
        nq > SIZE_MAX / 8 || nk > SIZE_MAX / 8) {
        snprintf(row->error, sizeof row->error, "shape too large for this machine");
        return;
    }
    row->device_bytes = (2 * nq + 2 * nk) * esz + nlse * sizeof(float);
    row->naive_bytes = count4((size_t)s->batch, (size_t)s->heads_q, (size_t)s->seqlen_q,
                              (size_t)s->seqlen_k, &naive) == 0 &&
                               naive <= SIZE_MAX / 4
                           ? naive * 4
                           : SIZE_MAX;

    /* On a device, the buffers come first: a shape the device cannot hold
     * becomes an error row before any host memory is spent on it. */
    if (!is_host) {
        cl_context clctx = flashcl_context_cl_context(ctx);
        cl_ulong max_alloc = 0;
        static const char *const names[5] = {"q", "k", "v", "out", "lse"};
        cl_int err = CL_SUCCESS;
        sizes[0] = sizes[3] = nq * esz;
        sizes[1] = sizes[2] = nk * esz;
        sizes[4] = nlse * sizeof(float);
        clGetDeviceInfo(flashcl_context_cl_device(ctx), CL_DEVICE_MAX_MEM_ALLOC_SIZE,
                        sizeof max_alloc, &max_alloc, NULL);
        for (int b = 0; b < 5; b++) {
            if (max_alloc != 0 && sizes[b] > max_alloc) {
                snprintf(row->error, sizeof row->error,
                         "%s needs %zu bytes, over the device's largest allocation (%llu)",
                         names[b], sizes[b], (unsigned long long)max_alloc);
                goto done;
            }
            bufs[b] = clCreateBuffer(clctx, b < 3 ? CL_MEM_READ_ONLY : CL_MEM_READ_WRITE, sizes[b],
                                     NULL, &err);
            if (err != CL_SUCCESS) {
                snprintf(row->error, sizeof row->error,
                         "clCreateBuffer(%s, %zu bytes) failed: %s (%d)", names[b], sizes[b],
                         flashcl_status_string(err), err);
                goto done;
            }
        }
    }

    times = malloc((size_t)opt->iters * sizeof *times);
    q = malloc(nq * esz);
    k = malloc(nk * esz);
    v = malloc(nk * esz);
    if (times == NULL || q == NULL || k == NULL || v == NULL) {
        snprintf(row->error, sizeof row->error, "out of host memory for the inputs");
        goto done;
    }
    flashcl_ref_rng_seed(&rng, 0x5EED0000u + (uint64_t)s->seqlen_q * 131u + (uint64_t)s->head_dim);
    flashcl_ref_fill_normal(&rng, q, opt->dtype, nq, 1.0);
    flashcl_ref_fill_normal(&rng, k, opt->dtype, nk, 1.0);
    flashcl_ref_fill_normal(&rng, v, opt->dtype, nk, 1.0);

    if (is_host) {
        /* No OpenCL: the blocking host entry point, timed by wall clock. */
        out = malloc(nq * esz);
        lse = malloc(nlse * sizeof *lse);
        if (out == NULL || lse == NULL) {
            snprintf(row->error, sizeof row->error, "out of host memory for the outputs");
            goto done;
        }
        flashcl_ref_poison(out, opt->dtype, nq);
        flashcl_ref_poison(lse, FLASHCL_FLOAT32, nlse);
        status = flashcl_attention_forward_host(ctx, &desc, q, k, v, out, lse);
        if (status != FLASHCL_SUCCESS) {
            row_error(row, ctx, "forward failed", status);
            goto done;
        }
        if (feasible) {
            bench_validate(row, &desc, q, k, v, out, lse);
            if (!row->validated)
                goto done;
        }
        for (int it = 0; it < opt->warmup + opt->iters; it++) {
            double t0 = cli_now();
            status = flashcl_attention_forward_host(ctx, &desc, q, k, v, out, lse);
            if (status != FLASHCL_SUCCESS) {
                row_error(row, ctx, "forward failed", status);
                goto done;
            }
            if (it >= opt->warmup)
                times[it - opt->warmup] = (cli_now() - t0) * 1e3;
        }
    } else {
        cl_command_queue queue = flashcl_context_cl_queue(ctx);
        void *const init[3] = {q, k, v};
        cl_event event = NULL;
        cl_int err = CL_SUCCESS;

        for (int b = 0; b < 3 && err == CL_SUCCESS; b++)
            err =
                clEnqueueWriteBuffer(queue, bufs[b], CL_TRUE, 0, sizes[b], init[b], 0, NULL, NULL);
        if (err != CL_SUCCESS) {
            row_error(row, NULL, "uploading the inputs", err);
            goto done;
        }
        /* Poisoned outputs, so that a kernel that skips elements fails validation. */
        if (feasible) {
            out = malloc(nq * esz);
            lse = malloc(nlse * sizeof *lse);
            if (out == NULL || lse == NULL) {
                snprintf(row->error, sizeof row->error, "out of host memory for the outputs");
                goto done;
            }
            flashcl_ref_poison(out, opt->dtype, nq);
            flashcl_ref_poison(lse, FLASHCL_FLOAT32, nlse);
            err = clEnqueueWriteBuffer(queue, bufs[3], CL_TRUE, 0, sizes[3], out, 0, NULL, NULL);
            if (err == CL_SUCCESS)
                err =
                    clEnqueueWriteBuffer(queue, bufs[4], CL_TRUE, 0, sizes[4], lse, 0, NULL, NULL);
            if (err != CL_SUCCESS) {
                row_error(row, NULL, "poisoning the outputs", err);
                goto done;
            }
        }
        if (!feasible) {
            /* The inputs live on the device now; drop the host copies so the
             * peak RSS reflects what the benchmark needs. */
            free(q);
            free(k);
            free(v);
            q = k = v = NULL;
        }
        status = flashcl_attention_forward(ctx, &desc, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4],
                                           0, &event);
        if (status != FLASHCL_SUCCESS) {
            row_error(row, ctx, "forward failed", status);
            goto done;
        }
        if (event != NULL)
            clReleaseEvent(event);
        err = clFinish(queue);
        if (err != CL_SUCCESS) {
            row_error(row, NULL, "clFinish after the first run", err);
            goto done;
        }
        if (feasible) {
            err = clEnqueueReadBuffer(queue, bufs[3], CL_TRUE, 0, sizes[3], out, 0, NULL, NULL);
            if (err == CL_SUCCESS)
                err = clEnqueueReadBuffer(queue, bufs[4], CL_TRUE, 0, sizes[4], lse, 0, NULL, NULL);
            if (err != CL_SUCCESS) {
                row_error(row, NULL, "reading the output back", err);
                goto done;
            }
            bench_validate(row, &desc, q, k, v, out, lse);
            if (!row->validated)
                goto done;
        }
        for (int it = 0; it < opt->warmup + opt->iters; it++) {
            cl_ulong start = 0, end = 0;
            event = NULL;
            status = flashcl_attention_forward(ctx, &desc, bufs[0], bufs[1], bufs[2], bufs[3],
                                               bufs[4], 0, &event);
            if (status != FLASHCL_SUCCESS) {
                row_error(row, ctx, "forward failed", status);
                goto done;
            }
            if (event == NULL) {
                snprintf(row->error, sizeof row->error, "the library returned no kernel event");
                goto done;
            }
            err = clWaitForEvents(1, &event);
            if (err == CL_SUCCESS && it >= opt->warmup) {
                err = clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_START, sizeof start,
                                              &start, NULL);
                if (err == CL_SUCCESS)
                    err = clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_END, sizeof end, &end,
                                                  NULL);
                times[it - opt->warmup] = (double)(end - start) * 1e-6;
            }
            clReleaseEvent(event);
            if (err != CL_SUCCESS) {
                row_error(row, NULL, "timing the kernel event", err);
                goto done;
            }
        }
    }
    if (opt->iters > 0)
        finish_times(row, times, opt->iters, flops);

    if (feasible && q != NULL) {
        /* The naive reference, once: what the kernel is being compared to. */
        double *ref_out = malloc(nq * sizeof *ref_out);
        if (ref_out != NULL) {
            double t0 = cli_now();
            flashcl_ref_attention_forward(&desc, q, k, v, ref_out, NULL, NULL, NULL);
            row->ref_ms = (cli_now() - t0) * 1e3;
            free(ref_out);
        }
    }
done:
    for (int b = 0; b < 5; b++)
        if (bufs[b] != NULL)
            clReleaseMemObject(bufs[b]);
    row->peak_rss = cli_peak_rss_bytes();
    free(times);
    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
}

static double mib(size_t bytes) {
    return (double)bytes / (1024.0 * 1024.0);
}

/* Bytes of q, k, v, out and lse over the median time: the minimum traffic. */
static double bench_gbps(const bench_row *row) {
    return row->median_ms > 0 ? (double)row->device_bytes / (row->median_ms * 1e-3) / 1e9 : -1.0;
}

static void print_bench_header(const bench_options *opt) {
    printf("%-5s %3s %4s %4s %7s %7s %4s  %-7s %-5s %10s %10s %8s %8s %10s %8s", "dtype", "B", "Hq",
           "Hk", "Nq", "Nk", "D", "mask", "check", "median_ms", "min_ms", "TFLOP/s", "GB/s", "ref_ms",
           "speedup");
    if (opt->memory)
        printf(" %12s %11s %12s", "peak_rss_MiB", "device_MiB", "naive_S_MiB");
    printf("\n");
}

static void print_bench_row(const bench_options *opt, const bench_row *row) {
    const bench_shape *s = &row->s;
    printf("%-5s %3d %4d %4d %7d %7d %4d  %-7s %-5s ", cli_dtype_name(row->dtype), s->batch,
           s->heads_q, s->heads_k, s->seqlen_q, s->seqlen_k, s->head_dim,
           row->causal ? "causal" : "none",
           row->validated > 0    ? "pass"
           : row->validated == 0 ? "FAIL"
                                 : "-");
    if (row->median_ms >= 0)
        printf("%10.3f %10.3f %8.3g %8.3g ", row->median_ms, row->min_ms, row->tflops,
               bench_gbps(row));
    else
        printf("%10s %10s %8s %8s ", "-", "-", "-", "-");
    if (row->ref_ms >= 0 && row->median_ms > 0) {
        double speedup = row->ref_ms / row->median_ms;
        printf("%10.1f %7.*fx", row->ref_ms, speedup < 10 ? 2 : 0, speedup);
    } else
        printf("%10s %8s", "-", "-");
    if (opt->memory)
        printf(" %12.1f %11.1f %12.1f", mib(row->peak_rss), mib(row->device_bytes),
               mib(row->naive_bytes));
    printf("\n");
    if (row->error[0])
        printf("      error: %s\n", row->error);
    fflush(stdout);
}

static void print_bench_json(flashcl_context *ctx, const bench_options *opt, const bench_row *rows,
                             int count) {
    cli_json_bench_open(ctx, "flashcl bench", cli_dtype_name(opt->dtype), opt->iters, opt->warmup);
    for (int i = 0; i < count; i++) {
        const bench_row *r = &rows[i];
        printf("%s\n  {\"dtype\": \"%s\", \"batch\": %d, \"heads_q\": %d, \"heads_k\": %d, "
               "\"seqlen_q\": %d, \"seqlen_k\": %d, \"head_dim\": %d, \"causal\": %s, "
               "\"validated\": \"%s\", \"max_err\": ",
               i ? "," : "", cli_dtype_name(r->dtype), r->s.batch, r->s.heads_q, r->s.heads_k,
               r->s.seqlen_q, r->s.seqlen_k, r->s.head_dim, r->causal ? "true" : "false",
               r->validated > 0    ? "pass"
               : r->validated == 0 ? "fail"
                                   : "skipped");
        cli_json_number(stdout, r->max_err, r->validated >= 0);
        printf(", \"tolerance\": ");
        cli_json_number(stdout, r->tolerance, r->validated >= 0);
        printf(", \"iters\": %d, \"median_ms\": ", r->median_ms >= 0 ? r->iters : 0);
        cli_json_number(stdout, r->median_ms, r->median_ms >= 0);
        printf(", \"min_ms\": ");
        cli_json_number(stdout, r->min_ms, r->median_ms >= 0);
        printf(", \"tflops\": ");
        cli_json_number(stdout, r->tflops, r->tflops >= 0);
        printf(", \"gbps\": ");
        cli_json_number(stdout, bench_gbps(r), r->median_ms > 0);
        printf(", \"ref_ms\": ");
        cli_json_number(stdout, r->ref_ms, r->ref_ms >= 0);
        printf(", \"speedup\": ");
        cli_json_number(stdout, r->median_ms > 0 ? r->ref_ms / r->median_ms : 0.0,
                    r->ref_ms >= 0 && r->median_ms > 0);
        printf(", \"peak_rss_bytes\": %zu, \"device_bytes\": %zu, \"naive_scores_bytes\": %zu, "
               "\"error\": ",
               r->peak_rss, r->device_bytes, r->naive_bytes);
        if (r->error[0])
            cli_json_string(stdout, r->error);
        else
            fputs("null", stdout);
        printf("}");
    }
    printf("\n]}\n");
}

/* CSV: the JSON row keys as columns; empty cells where JSON has null. */
static void print_bench_csv(const bench_row *rows, int count) {
    printf("dtype,batch,heads_q,heads_k,seqlen_q,seqlen_k,head_dim,causal,validated,max_err,"
           "tolerance,iters,median_ms,min_ms,tflops,gbps,ref_ms,error\n");
    for (int i = 0; i < count; i++) {
        const bench_row *r = &rows[i];
        const bench_shape *s = &r->s;
        printf("%s,%d,%d,%d,%d,%d,%d,%d,%s,", cli_dtype_name(r->dtype), s->batch, s->heads_q, s->heads_k,
               s->seqlen_q, s->seqlen_k, s->head_dim, r->causal,
               r->validated > 0 ? "pass" : r->validated == 0 ? "fail" : "skipped");
        if (r->validated >= 0)
            printf("%.6g,%.6g,", r->max_err, r->tolerance);
        else
            printf(",,");
        printf("%d,", r->median_ms >= 0 ? r->iters : 0);
        if (r->median_ms >= 0)
            printf("%.6g,%.6g,%.6g,%.6g,", r->median_ms, r->min_ms, r->tflops, bench_gbps(r));
        else
            printf(",,,,");
        if (r->ref_ms >= 0)
            printf("%.6g", r->ref_ms);
        putchar(',');
        if (r->error[0]) { /* quoted, with quotes doubled */
            putchar('"');
            for (const char *c = r->error; *c; c++) {
                if (*c == '"')
                    putchar('"');
                putchar(*c == '\n' ? ' ' : *c);
            }
            putchar('"');
        }
        putchar('\n');
    }
}

/* TFLOP/s against seqlen_q, one line per configuration (all but the seqlen). */
static int write_bench_plot(flashcl_context *ctx, const char *path, const bench_row *rows, int count) {
    svg_series *series = calloc((size_t)count, sizeof *series);
    double *xs = calloc((size_t)count, sizeof *xs), *ys = calloc((size_t)count, sizeof *ys);
    char(*labels)[96] = calloc((size_t)count, sizeof *labels);
    int *owner = calloc((size_t)count, sizeof *owner), num = 0, used = 0, rc = -1;
    char err[300], title[400];
    if (!series || !xs || !ys || !labels || !owner) {
        cli_errorf("out of memory for the plot");
        goto done;
    }
    for (int i = 0; i < count; i++) { /* the configuration of each row */
        const bench_row *r = &rows[i];
        owner[i] = -1;
        for (int j = 0; j < i && owner[i] < 0; j++) {
            const bench_row *o = &rows[j];
            if (o->dtype == r->dtype && o->s.batch == r->s.batch && o->s.heads_q == r->s.heads_q &&
                o->s.heads_k == r->s.heads_k && o->s.head_dim == r->s.head_dim && o->causal == r->causal)
                owner[i] = owner[j];
        }
        if (owner[i] < 0) {
            owner[i] = num;
            if (r->s.heads_q == r->s.heads_k)
                snprintf(labels[num], sizeof labels[num], "%s B=%d H=%d D=%d%s", cli_dtype_name(r->dtype),
                         r->s.batch, r->s.heads_q, r->s.head_dim, r->causal ? " causal" : "");
            else
                snprintf(labels[num], sizeof labels[num], "%s B=%d H=%d:%d D=%d%s", cli_dtype_name(r->dtype),
                         r->s.batch, r->s.heads_q, r->s.heads_k, r->s.head_dim, r->causal ? " causal" : "");
            num++;
        }
    }
    for (int k = 0; k < num; k++) { /* each line's points, in order of seqlen */
        series[k].label = labels[k];
        series[k].x = xs + used;
        series[k].y = ys + used;
        for (int i = 0; i < count; i++) {
            if (owner[i] != k)
                continue;
            int at = series[k].n++;
            while (at > 0 && xs[used + at - 1] > rows[i].s.seqlen_q) {
                xs[used + at] = xs[used + at - 1];
                ys[used + at] = ys[used + at - 1];
                at--;
            }
            xs[used + at] = rows[i].s.seqlen_q;
            ys[used + at] = rows[i].tflops;
        }
        used += series[k].n;
    }
    {
        const char *name = flashcl_context_device_name(ctx), *paren = strstr(name, " (");
        snprintf(title, sizeof title, "flashcl forward, %.*s", paren ? (int)(paren - name) : (int)strlen(name),
                 name);
    }
    if (svg_plot_write(path, title, "sequence length (seqlen_q = seqlen_k)", "TFLOP/s (median)", series, num, 1,
                       err, sizeof err) != 0) {
        cli_errorf("--plot: %s", err);
        goto done;
    }
    rc = 0;
done:
    free(series);
    free(xs);
    free(ys);
    free(labels);
    free(owner);
    return rc;
}

#define BENCH_MAX_SHAPES 64
#define BENCH_MAX_LIST 16

/* "B,H,N,D" or "B,Hq,Hk,Nq,Nk,D"; returns NULL or what is wrong with it. */
static const char *parse_shape(const char *text, bench_shape *s) {
    long v[6];
    int n = 0;
    if (cli_parse_long_list(text, 1, INT_MAX, v, 6, &n) != 0 || (n != 4 && n != 6))
        return "wants B,H,N,D or B,Hq,Hk,Nq,Nk,D (positive integers)";
    s->batch = (int)v[0];
    s->heads_q = (int)v[1];
    s->heads_k = (int)v[n == 4 ? 1 : 2];
    s->seqlen_q = (int)v[n == 4 ? 2 : 3];
    s->seqlen_k = (int)v[n == 4 ? 2 : 4];
    s->head_dim = (int)v[n == 4 ? 3 : 5];
    if (s->heads_q % s->heads_k != 0)
        return "needs heads_q to be a multiple of heads_k";
    if (s->head_dim > 256)
        return "has head_dim over flashcl's limit of 256";
    return NULL;
}

/* --seqlen, --head-dim, --batch, --heads: a list of integers each; returns 1
 * when argv[*i] was one, 0 when not, -1 after a message. */
static const char *const sweep_names[4] = {"--seqlen", "--head-dim", "--batch", "--heads"};

static int sweep_option(int argc, char **argv, int *i, long lists[4][BENCH_MAX_LIST], int counts[4]) {
    static const long hi[4] = {1 << 24, 256, 1 << 16, 1 << 16};
    const char *value;
    for (int k = 0; k < 4; k++) {
        int r = cli_take_value(argc, argv, i, sweep_names[k], &value);
        if (r < 0)
            return -1;
        if (r == 0)
            continue;
        if (cli_parse_long_list(value, 1, hi[k], lists[k], BENCH_MAX_LIST, &counts[k]) != 0 ||
            counts[k] < 1) {
            usage_error(usage_bench, "%s wants up to %d integers in 1..%ld separated by commas, not '%s'",
                        sweep_names[k], BENCH_MAX_LIST, hi[k], value);
            return -1;
        }
        return 1;
    }
    return 0;
}

static int cmd_bench(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--decode") == 0) /* decode throughput: tools/serving_cli.c */
            return cli_bench_decode(argc, argv);
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--backward") == 0) /* backward pass: tools/backward_cli.c */
            return cli_bench_backward(argc, argv);
    static const bench_shape gpu_shapes[] = {{1, 8, 8, 1024, 1024, 64},
                                             {1, 8, 8, 2048, 2048, 64},
                                             {1, 8, 8, 4096, 4096, 64},
                                             {2, 16, 16, 1024, 1024, 128}};
    static const bench_shape gpu_long[] = {
        {1, 8, 8, 8192, 8192, 64}, {1, 8, 8, 16384, 16384, 64}, {1, 16, 16, 8192, 8192, 128}};
    /* A 2-core CPU through PoCL ran the first kernels at ~3 GFLOP/s: these
     * rows, reference and validation included, take ~25 s there. */
    static const bench_shape cpu_shapes[] = {{1, 4, 4, 256, 256, 64},
                                             {1, 8, 8, 512, 512, 64},
                                             {1, 8, 8, 1024, 1024, 64},
                                             {1, 4, 4, 512, 512, 128}};
    static const bench_shape cpu_long[] = {{1, 8, 8, 2048, 2048, 64}, {1, 8, 8, 4096, 4096, 64}};
    bench_shape shapes[BENCH_MAX_SHAPES];
    bench_options opt;
    bench_row *rows = NULL;
    const char *device = NULL, *value, *problem;
    int num_shapes = 0, causal_only = 0, want_long = 0, iters_set = 0, warmup_set = 0;
    int is_cpu, num_rows = 0, failures = 0;
    long number;
    flashcl_context *ctx;
    flashcl_dtype dtypes[3] = {FLASHCL_FLOAT16};
    int num_dtypes = 1, no_causal = 0;
    long sweep[4][BENCH_MAX_LIST]; /* seqlen, head_dim, batch, heads */
    int sweep_count[4] = {0, 0, 0, 0};

    memset(&opt, 0, sizeof opt);
    opt.dtype = FLASHCL_FLOAT16;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int r;
        if (is_help(arg)) {
            fputs(usage_bench, stdout);
            return CLI_EXIT_OK;
        } else if ((r = cli_take_value(argc, argv, &i, "--device", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            device = value;
        } else if ((r = cli_take_value(argc, argv, &i, "--dtype", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            char list[64], *tok, *save = NULL;
            snprintf(list, sizeof list, "%s", value);
            num_dtypes = 0;
            for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (num_dtypes == 3 || cli_parse_dtype(tok, &dtypes[num_dtypes]) != 0)
                    return usage_error(usage_bench, "--dtype wants f16, bf16 or f32 (a list of up to 3), not '%s'",
                                       value);
                num_dtypes++;
            }
            if (num_dtypes == 0)
                return usage_error(usage_bench, "--dtype needs a value");
            opt.dtype = dtypes[0];
        } else if ((r = cli_take_value(argc, argv, &i, "--shape", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (num_shapes >= BENCH_MAX_SHAPES)
                return usage_error(usage_bench, "too many --shape options (at most %d)",
                                   BENCH_MAX_SHAPES);
            if ((problem = parse_shape(value, &shapes[num_shapes])) != NULL)
                return usage_error(usage_bench, "--shape %s %s", value, problem);
            num_shapes++;
        } else if ((r = cli_take_value(argc, argv, &i, "--iters", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_long(value, 1, 1000000, &number) != 0)
                return usage_error(usage_bench, "--iters wants an integer >= 1, not '%s'", value);
            opt.iters = (int)number;
            iters_set = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--warmup", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_long(value, 0, 1000000, &number) != 0)
                return usage_error(usage_bench, "--warmup wants an integer >= 0, not '%s'", value);
            opt.warmup = (int)number;
            warmup_set = 1;
        } else if (strcmp(arg, "--causal") == 0) {
            causal_only = 1;
        } else if (strcmp(arg, "--long") == 0) {
            want_long = 1;
        } else if (strcmp(arg, "--memory") == 0) {
            opt.memory = 1;
        } else if ((r = sweep_option(argc, argv, &i, sweep, sweep_count)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if (strcmp(arg, "--no-causal") == 0) {
            no_causal = 1;
        } else if (strcmp(arg, "--csv") == 0) {
            opt.csv = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--plot", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            opt.plot = value;
        } else if (strcmp(arg, "--json") == 0) {
            opt.json = 1;
        } else {
            return usage_error(usage_bench, "unknown option '%s' for 'flashcl bench'", arg);
        }
    }

    ctx = open_context(device);
    if (ctx == NULL)
        return CLI_EXIT_FAIL;
    is_cpu = flashcl_context_is_host(ctx);
    if (!is_cpu) {
        cl_device_type type = 0;
        if (clGetDeviceInfo(flashcl_context_cl_device(ctx), CL_DEVICE_TYPE, sizeof type, &type,
                            NULL) == CL_SUCCESS)
            is_cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
    }
    if (!iters_set)
        opt.iters = opt.memory ? (is_cpu ? 1 : 5) : (is_cpu ? 5 : 20);
    if (!warmup_set)
        opt.warmup = opt.memory && is_cpu ? 0 : (is_cpu ? 1 : 3);
    if (causal_only && no_causal) {
        flashcl_context_destroy(ctx);
        return usage_error(usage_bench, "--causal and --no-causal leave nothing to run");
    }
    if (sweep_count[0] || sweep_count[1] || sweep_count[2] || sweep_count[3]) {
        /* Every combination; unset lists take one default value. */
        static const long cpu_seqlens[] = {256, 512, 1024}, gpu_seqlens[] = {512, 1024, 2048, 4096};
        static const long one_d[] = {64}, one_b[] = {1}, one_h[] = {8};
        const long *lists[4] = {sweep[0], sweep[1], sweep[2], sweep[3]};
        int counts[4] = {sweep_count[0], sweep_count[1], sweep_count[2], sweep_count[3]};
        if (!counts[0]) {
            lists[0] = is_cpu ? cpu_seqlens : gpu_seqlens;
            counts[0] = is_cpu ? 3 : 4;
        }
        if (!counts[1])
            lists[1] = one_d, counts[1] = 1;
        if (!counts[2])
            lists[2] = one_b, counts[2] = 1;
        if (!counts[3])
            lists[3] = one_h, counts[3] = 1;
        for (int b = 0; b < counts[2]; b++)
            for (int h = 0; h < counts[3]; h++)
                for (int d = 0; d < counts[1]; d++)
                    for (int n = 0; n < counts[0]; n++) {
                        bench_shape sh = {(int)lists[2][b], (int)lists[3][h], (int)lists[3][h],
                                          (int)lists[0][n], (int)lists[0][n], (int)lists[1][d]};
                        if (num_shapes >= BENCH_MAX_SHAPES) {
                            flashcl_context_destroy(ctx);
                            return usage_error(usage_bench, "the sweep has more than %d shapes",
                                               BENCH_MAX_SHAPES);
                        }
                        shapes[num_shapes++] = sh;
                    }
    }
    if (num_shapes == 0) {
        const bench_shape *base = is_cpu ? cpu_shapes : gpu_shapes;
        const bench_shape *more = is_cpu ? cpu_long : gpu_long;
        int nbase = is_cpu ? (int)(sizeof cpu_shapes / sizeof cpu_shapes[0])
                           : (int)(sizeof gpu_shapes / sizeof gpu_shapes[0]);
        int nmore = is_cpu ? (int)(sizeof cpu_long / sizeof cpu_long[0])
                           : (int)(sizeof gpu_long / sizeof gpu_long[0]);
        for (int i = 0; i < nbase; i++)
            shapes[num_shapes++] = base[i];
        for (int i = 0; want_long && i < nmore; i++)
            shapes[num_shapes++] = more[i];
    }
    rows = calloc((size_t)num_shapes * 2 * (size_t)num_dtypes, sizeof *rows);
    if (rows == NULL) {
        cli_errorf("out of memory");
        flashcl_context_destroy(ctx);
        return CLI_EXIT_FAIL;
    }

    if (!opt.json && !opt.csv) {
        printf("flashcl bench: %s%s; %s%s%s%s%s, %d warm-up + %d timed runs (%s)\n",
               flashcl_context_device_name(ctx), flashcl_context_is_host(ctx) ? " [host path]" : "",
               cli_dtype_name(dtypes[0]), num_dtypes > 1 ? "," : "", num_dtypes > 1 ? cli_dtype_name(dtypes[1]) : "",
               num_dtypes > 2 ? "," : "", num_dtypes > 2 ? cli_dtype_name(dtypes[2]) : "", opt.warmup, opt.iters,
               flashcl_context_is_host(ctx) ? "wall clock" : "OpenCL profiling events");
        print_bench_header(&opt);
    }
    for (int t = 0; t < num_dtypes; t++)
    for (int i = 0; i < num_shapes; i++) {
        for (int causal = causal_only; causal <= (no_causal ? 0 : 1); causal++) {
            bench_row *row = &rows[num_rows++];
            opt.dtype = dtypes[t];
            row->s = shapes[i];
            row->causal = causal;
            run_bench_row(ctx, &opt, row);
            if (row->error[0])
                failures++;
            if (!opt.json && !opt.csv)
                print_bench_row(&opt, row);
        }
    }
    if (opt.plot && write_bench_plot(ctx, opt.plot, rows, num_rows) != 0)
        failures++;
    else if (opt.plot && !opt.json && !opt.csv)
        printf("wrote %s\n", opt.plot);
    if (opt.csv)
        print_bench_csv(rows, num_rows);
    else if (opt.json)
        print_bench_json(ctx, &opt, rows, num_rows);
    else if (opt.memory)
        printf("peak_rss: the process's peak resident memory so far; device: q,k,v,out,lse; "
               "naive_S: one float32 B*H*Nq*Nk score matrix\n");
    free(rows);
    flashcl_context_destroy(ctx);
    if (failures) {
        cli_errorf("%d of %d rows failed", failures, num_rows);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

/* ======================================================================
 * main
 * ==================================================================== */

typedef struct command {
    const char *name;
    const char *usage;
    int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
    {"devices", usage_devices, cmd_devices},
    {"attention", usage_attention, cmd_attention},
    {"check", usage_check, cmd_check},
    {"bench", usage_bench, cmd_bench},
    {"tune", usage_tune, cmd_tune},
    {"serve-sim", usage_serve_sim, cmd_serve_sim},
    {"spec-sim", usage_spec_sim, cmd_spec_sim},
};

static const command *find_command(const char *name) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

int main(int argc, char **argv) {
    const command *cmd;
    if (argc < 2) {
        fputs(usage_main, stderr);
        return CLI_EXIT_USAGE;
    }
    if (is_help(argv[1])) {
        fputs(usage_main, stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
        printf("flashcl %s (library %s)\n", FLASHCL_VERSION_STRING, flashcl_version());
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "help") == 0) {
        if (argc == 2) {
            fputs(usage_main, stdout);
            return CLI_EXIT_OK;
        }
        cmd = find_command(argv[2]);
        if (cmd == NULL || argc > 3)
            return usage_error(usage_main, "no help for '%s'", argc > 3 ? argv[3] : argv[2]);
        fputs(cmd->usage, stdout);
        return CLI_EXIT_OK;
    }
    cmd = find_command(argv[1]);
    if (cmd == NULL)
        return usage_error(usage_main,
                           argv[1][0] == '-' ? "unknown option '%s'" : "unknown command '%s'",
                           argv[1]);
    return cmd->run(argc, argv);
}
