/* devices_cli.c: `flashcl devices`: platforms, devices, and the parameters flashcl picks for each.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "devices_cli.h"
#include "flashcl.h"

/* CL_PLATFORM_NOT_FOUND_KHR (cl_khr_icd): what the ICD loader returns when
 * no platform is registered; spelled out to avoid needing cl_ext.h. */
#define CLI_CL_PLATFORM_NOT_FOUND (-1001)

const char usage_devices[] =
    "usage: flashcl devices [--device SPEC]\n"
    "\n"
    "Lists every OpenCL platform and device (name, vendor, type, version, driver,\n"
    "compute units, local memory, max work-group size) and the kernel parameters\n"
    "flashcl picks on each for float16, head_dim 64 and 128, causal and not.\n"
    "Without any OpenCL platform it says so: flashcl then runs its host path.\n"
    "\n"
    "  --device SPEC   only the device SPEC picks (as --device and FLASHCL_DEVICE\n"
    "                  take it everywhere) and its parameters; exit 1 where SPEC\n"
    "                  picks none, with the reason\n";

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
               problem != NULL             ? problem
               : access(tuning, F_OK) == 0 ? "read"
                                           : "none yet: 'flashcl tune' writes it");
    printf("%s%-5s %-4s %-7s %-5s %7s %7s %11s %4s  %-9s %s\n", indent, "dtype", "D", "mask", "Nq",
           "block_m", "block_n", "threads/row", "wg", "variant", "source");
    for (size_t i = 0; i < sizeof reps / sizeof reps[0]; i++) {
        flashcl_attention_desc desc =
            cli_make_desc(reps[i].dtype, 1, 8, 8, reps[i].seqlen_q, 1024, reps[i].head_dim);
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
        printf("%7d %7d %11d %4d  %-9s %s\n", params.block_m, params.block_n,
               params.threads_per_row, params.work_group_size,
               params.variant ? params.variant : "?", params.source ? params.source : "?");
    }
}

/* Returns the status of making a context on spec. */
static flashcl_status print_context_params(const char *spec, const char *indent) {
    flashcl_context *ctx = NULL;
    flashcl_status status = flashcl_context_create(&ctx, spec);
    if (status != FLASHCL_SUCCESS) {
        printf("%sflashcl cannot use it (spec \"%s\"): %s (%d): %s\n", indent, spec,
               flashcl_status_string(status), status, flashcl_last_error(NULL));
        return status;
    }
    printf("%sflashcl, spec \"%s\": %s%s\n", indent, spec, flashcl_context_device_name(ctx),
           flashcl_context_is_host(ctx) ? " [host path]" : "");
    print_params(ctx, indent);
    flashcl_context_destroy(ctx);
    return FLASHCL_SUCCESS;
}

int cmd_devices(int argc, char **argv) {
    cl_uint num_platforms = 0;
    cl_platform_id *platforms = NULL;
    cl_int err;

    const char *only = NULL;
    for (int i = 2; i < argc; i++) {
        int r;
        if (cli_help(argv[i], usage_devices))
            return CLI_EXIT_OK;
        if ((r = cli_take_value(argc, argv, &i, "--device", &only)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            continue;
        }
        return cli_unknown_option(usage_devices, argv[i]);
    }
    if (only)
        return print_context_params(only, "") == FLASHCL_SUCCESS ? CLI_EXIT_OK : CLI_EXIT_FAIL;

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
