/* cli_util.c: helpers shared by the flashcl subcommands: messages, options, clocks, JSON. */
#define _XOPEN_SOURCE 700 /* realpath */

#include "cli_util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

void cli_errorf(const char *fmt, ...) {
    va_list ap;
    fputs("flashcl: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_parse_dtype(const char *text, flashcl_dtype *dtype) {
    if (!strcmp(text, "f16") || !strcmp(text, "fp16") || !strcmp(text, "float16"))
        *dtype = FLASHCL_FLOAT16;
    else if (!strcmp(text, "bf16") || !strcmp(text, "bfloat16"))
        *dtype = FLASHCL_BFLOAT16;
    else if (!strcmp(text, "f32") || !strcmp(text, "fp32") || !strcmp(text, "float32"))
        *dtype = FLASHCL_FLOAT32;
    else
        return -1;
    return 0;
}

int cli_parse_long(const char *text, long min, long max, long *out) {
    char *end;
    long value;
    if (text == NULL || *text == '\0')
        return -1;
    errno = 0;
    value = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || value < min || value > max)
        return -1;
    *out = value;
    return 0;
}

int cli_parse_double(const char *text, double *out) {
    char *end;
    double value;
    if (text == NULL || *text == '\0')
        return -1;
    errno = 0;
    value = strtod(text, &end);
    if (errno != 0 || *end != '\0' || !isfinite(value))
        return -1;
    *out = value;
    return 0;
}

int cli_parse_long_list(const char *text, long min, long max, long *values, int max_count,
                        int *count) {
    char item[64];
    const char *p = text;
    int n = 0;
    if (text == NULL || *text == '\0')
        return -1;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= sizeof item || n >= max_count)
            return -1;
        memcpy(item, p, len);
        item[len] = '\0';
        if (cli_parse_long(item, min, max, &values[n]) != 0)
            return -1;
        n++;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    *count = n;
    return 0;
}

int cli_take_value(int argc, char **argv, int *i, const char *name, const char **value) {
    const char *arg = argv[*i];
    size_t len = strlen(name);
    if (strncmp(arg, name, len) != 0)
        return 0;
    if (arg[len] == '=') {
        *value = arg + len + 1;
        return 1;
    }
    if (arg[len] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        cli_errorf("option %s needs a value", name);
        return -1;
    }
    *i += 1;
    *value = argv[*i];
    return 1;
}

size_t cli_peak_rss_bytes(void) {
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) != 0 || usage.ru_maxrss < 0)
        return 0;
#if defined(__APPLE__)
    return (size_t)usage.ru_maxrss; /* bytes on macOS */
#else
    return (size_t)usage.ru_maxrss * 1024; /* KiB on Linux and the BSDs */
#endif
}

void cli_json_string(FILE *f, const char *text) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(text ? text : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

void cli_json_bench_open(flashcl_context *ctx, const char *tool, const char *dtype, long iters, long warmup) {
    const int host = flashcl_context_is_host(ctx);
    printf("{\"tool\": ");
    cli_json_string(stdout, tool);
    printf(", \"version\": ");
    cli_json_string(stdout, flashcl_version());
    printf(", \"device\": ");
    cli_json_string(stdout, flashcl_context_device_name(ctx));
    printf(", \"host_path\": %s, \"timing\": \"%s\", \"dtype\": \"%s\", \"iters\": %ld, \"warmup\": %ld,\n"
           " \"rows\": [",
           host ? "true" : "false", host ? "wall-clock" : "opencl-profiling", dtype, iters, warmup);
}

const char *cli_dtype_name(flashcl_dtype dtype) {
    switch (dtype) {
    case FLASHCL_FLOAT32:
        return "f32";
    case FLASHCL_FLOAT16:
        return "f16";
    case FLASHCL_BFLOAT16:
        return "bf16";
    }
    return "?";
}

void cli_json_number(FILE *f, double value, int valid) {
    if (valid && isfinite(value))
        fprintf(f, "%.6g", value);
    else
        fputs("null", f);
}

/* The canonical directory of path plus its last component; 0 on success. */
static int canonical_name(const char *path, char *buf, size_t cap) {
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    if (!slash) {
        snprintf(dir, sizeof dir, ".");
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        if (n >= sizeof dir)
            return -1;
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    char *real = realpath(dir, NULL);
    if (!real)
        return -1;
    int n = snprintf(buf, cap, "%s/%s", real, slash ? slash + 1 : path);
    free(real);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int cli_same_file(const char *a, const char *b) {
    if (!strcmp(a, b))
        return 1;
    struct stat sa, sb;
    int ha = stat(a, &sa) == 0, hb = stat(b, &sb) == 0;
    if (ha && hb)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (ha != hb)
        return 0; /* one exists, the other does not: two files */
    /* Two outputs not written yet: the same name in the same directory. */
    char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
    return canonical_name(a, ca, sizeof ca) == 0 && canonical_name(b, cb, sizeof cb) == 0 && !strcmp(ca, cb);
}

int cli_check_outputs(const char *const *names, const char *const *paths, int first_output, int count) {
    for (int a = first_output; a < count; ++a)
        for (int b = 0; b < count; ++b)
            if (b != a && paths[a] && paths[b] && (b > a || b < first_output) && cli_same_file(paths[a], paths[b])) {
                cli_errorf("%s '%s' and %s '%s' are the same file (an output would overwrite %s)",
                           names[a], paths[a], names[b], paths[b], b < first_output ? "an input" : "another output");
                return -1;
            }
    return 0;
}

const char *cli_device_label(const char *spec, char *buf, size_t cap) {
    const char *env = getenv("FLASHCL_DEVICE");
    if (spec && spec[0])
        snprintf(buf, cap, "'%s'", spec);
    else if (env && env[0])
        snprintf(buf, cap, "'%s' (from FLASHCL_DEVICE)", env);
    else
        snprintf(buf, cap, "(default)");
    return buf;
}
