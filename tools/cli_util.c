/* cli_util.c: helpers shared by the flashcl subcommands: messages, options, clocks, JSON. */
#define _XOPEN_SOURCE 700 /* realpath */

#include "cli_util.h"
#include "npy.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

static void verrorf(const char *fmt, va_list ap) {
    fputs("flashcl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void cli_errorf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verrorf(fmt, ap);
    va_end(ap);
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

int cli_parse_dtype_fp8(const char *text, flashcl_dtype *dtype) {
    if (!strcmp(text, "e4m3") || !strcmp(text, "float8_e4m3fn") || !strcmp(text, "float8_e4m3") ||
        !strcmp(text, "fp8"))
        *dtype = FLASHCL_FLOAT8_E4M3;
    else if (!strcmp(text, "e5m2") || !strcmp(text, "float8_e5m2"))
        *dtype = FLASHCL_FLOAT8_E5M2;
    else
        return cli_parse_dtype(text, dtype);
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

int cli_take_flag(const char *arg, const cli_flag *flags, int count) {
    for (int n = 0; n < count; ++n)
        if (strcmp(arg, flags[n].name) == 0) {
            if (flags[n].value)
                *flags[n].value = 1;
            return 1;
        }
    return 0;
}

int cli_take_any(int argc, char **argv, int *i, const char *const *names, int count,
                 const char **values) {
    int r = 0;
    for (int n = 0; n < count && r == 0; ++n)
        r = cli_take_value(argc, argv, i, names[n], &values[n]);
    return r;
}

/* The message of a value that is out of range (value NULL: missing, already reported by
 * cli_take_value). With `usage`, the usage error naming the value; without, the one line that
 * the backward subcommands print, after a missing value's message too. */
static void cli_wants_error(const char *usage, const char *name, const char *wants,
                            const char *value) {
    if (usage && value)
        cli_usage_error(usage, "%s wants %s, not '%s'", name, wants, value);
    else if (!usage)
        cli_errorf("%s wants %s", name, wants);
}

int cli_take_long(const char *usage, int argc, char **argv, int *i, const char *name, long min,
                  long max, const char *wants, long *out) {
    const char *value;
    int r = cli_take_value(argc, argv, i, name, &value);
    if (r < 0 || (r > 0 && cli_parse_long(value, min, max, out) != 0)) {
        cli_wants_error(usage, name, wants, r < 0 ? NULL : value);
        return -1;
    }
    return r;
}

int cli_take_double(const char *usage, int argc, char **argv, int *i, const char *name, double min,
                    double max, const char *wants, double *out) {
    const char *value;
    double number;
    int r = cli_take_value(argc, argv, i, name, &value);
    if (r < 0 ||
        (r > 0 && (cli_parse_double(value, &number) != 0 || number < min || number > max))) {
        cli_wants_error(usage, name, wants, r < 0 ? NULL : value);
        return -1;
    }
    if (r > 0)
        *out = number;
    return r;
}

int cli_take_softcap_scale(const char *usage, int argc, char **argv, int *i, double *softcap,
                           double *scale) {
    char cap_wants[64], scale_wants[64];
    snprintf(cap_wants, sizeof cap_wants, "a number in [0, %g] (0: no cap)", FLT_MAX);
    snprintf(scale_wants, sizeof scale_wants, "a number in [0, %g] (0: 1/sqrt(head_dim))", FLT_MAX);
    int r = cli_take_double(usage, argc, argv, i, "--softcap", 0.0, FLT_MAX, cap_wants, softcap);
    if (r == 0)
        r = cli_take_double(usage, argc, argv, i, "--scale", 0.0, FLT_MAX, scale_wants, scale);
    return r;
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

void cli_json_string_or_null(FILE *f, const char *text) {
    if (text[0])
        cli_json_string(f, text);
    else
        fputs("null", f);
}

void cli_json_bench_open(flashcl_context *ctx, const char *tool, const char *dtype, long iters,
                         long warmup) {
    const int host = flashcl_context_is_host(ctx);
    printf("{\"tool\": ");
    cli_json_string(stdout, tool);
    printf(", \"version\": ");
    cli_json_string(stdout, flashcl_version());
    printf(", \"device\": ");
    cli_json_string(stdout, flashcl_context_device_name(ctx));
    printf(", \"host_path\": %s, \"timing\": \"%s\", \"dtype\": \"%s\", \"iters\": %ld, "
           "\"warmup\": %ld,\n"
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
    case FLASHCL_FLOAT8_E4M3:
        return "e4m3";
    case FLASHCL_FLOAT8_E5M2:
        return "e5m2";
    }
    return "?";
}

void cli_json_number(FILE *f, double value, int valid) {
    if (valid && isfinite(value))
        fprintf(f, "%.6g", value);
    else
        fputs("null", f);
}

/* ---- usage errors: the message, a "did you mean", and a pointer to --help -------------------- */

/* Levenshtein distance, capped: words longer than 63 characters count as far from everything. */
static int edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    if (na > 63 || nb > 63)
        return 1000;
    int row[64];
    for (size_t j = 0; j <= nb; ++j)
        row[j] = (int)j;
    for (size_t i = 1; i <= na; ++i) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; ++j) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

static int word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

int cli_nearest_word(const char *word, const char *text, char *buf, size_t size) {
    const char *eq = strchr(word, '='); /* "--casual=1": compare the name only */
    size_t nw = eq && word[0] == '-' ? (size_t)(eq - word) : strlen(word);
    int dashed = nw > 2 && word[0] == '-' && word[1] == '-';
    int best = 3;
    size_t best_len = 0;
    const char *best_at = NULL;
    for (const char *p = text; *p;) {
        if (!word_char(*p) || (p > text && word_char(p[-1]))) {
            ++p;
            continue;
        }
        size_t n = 0;
        while (word_char(p[n]))
            ++n;
        int candidate_dashed = n > 2 && p[0] == '-' && p[1] == '-';
        if (candidate_dashed == dashed && (dashed || p[0] != '-')) {
            int d = edit_distance(word, nw, p, n);
            /* Close enough to be a typo: at most 2 edits, and fewer than half the word's letters.
             */
            if (d > 0 && d < best && 2 * d <= (int)nw - 2 * dashed) {
                best = d;
                best_at = p;
                best_len = n;
            }
        }
        p += n;
    }
    if (!best_at || best_len + 1 > size)
        return 0;
    memcpy(buf, best_at, best_len);
    buf[best_len] = '\0';
    return 1;
}

/* "flashcl bench --decode" from "usage: flashcl bench --decode [options]": the words of the usage
 * line up to its first argument (an option that is followed by more arguments is one). */
static void usage_command(const char *usage, char *buf, size_t size) {
    const char *p = strstr(usage, "usage: ");
    snprintf(buf, size, "flashcl");
    if (!p || strncmp(p + 7, "flashcl ", 8) != 0)
        return;
    p += 15;
    size_t len = strlen(buf);
    for (int words = 0; *p && *p != '\n'; ++words) {
        size_t n = 0;
        while (p[n] && p[n] != ' ' && p[n] != '\n')
            ++n;
        /* a command, or a mode option right after it, one without a value (bench --decode
         * [options], attention --backward --q ...) */
        const char *next = p + n;
        while (*next == ' ')
            ++next;
        int mode = words == 1 && p[0] == '-' && (*next == '[' || *next == '-');
        if (n == 0 || p[0] == '[' || p[0] == '<' || (p[0] == '-' && !mode) || len + n + 2 > size)
            break;
        buf[len++] = ' ';
        memcpy(buf + len, p, n);
        len += n;
        buf[len] = '\0';
        p += n;
        while (*p == ' ')
            ++p;
    }
}

static void print_help_hint(const char *usage) {
    char command[96];
    usage_command(usage, command, sizeof command);
    fprintf(stderr, "Try '%s --help'.\n", command);
}

int cli_usage_error(const char *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verrorf(fmt, ap);
    va_end(ap);
    print_help_hint(usage);
    return CLI_EXIT_USAGE;
}

int cli_unknown_option(const char *usage, const char *arg) {
    char command[96], near[64];
    usage_command(usage, command, sizeof command);
    if (cli_nearest_word(arg, usage, near, sizeof near))
        cli_errorf("unknown option '%s' for '%s'; did you mean '%s'?", arg, command, near);
    else
        cli_errorf("unknown option '%s' for '%s'", arg, command);
    print_help_hint(usage);
    return CLI_EXIT_USAGE;
}

/* ---- what the subcommands share: help, contexts, descriptors, sizes -------------------------- */

int cli_help(const char *arg, const char *usage) {
    if (strcmp(arg, "--help") != 0 && strcmp(arg, "-h") != 0)
        return 0;
    fputs(usage, stdout);
    return 1;
}

/* Prints a library error with the context's message, which may carry a build log. */
void cli_report_status(const flashcl_context *ctx, const char *what, flashcl_status status) {
    const char *detail = ctx != NULL ? flashcl_last_error(ctx) : "";
    if (detail == NULL)
        detail = "";
    cli_errorf("%s: %s (%d)%s%s", what, flashcl_status_string(status), status, *detail ? ": " : "",
               detail);
}

flashcl_context *cli_open_context(const char *spec) {
    flashcl_context *ctx = NULL;
    flashcl_status status = flashcl_context_create(&ctx, spec);
    if (status != FLASHCL_SUCCESS) {
        /* A failed create leaves no context: its message is the thread's, under NULL. */
        cli_errorf("cannot open device: %s (%s); 'flashcl devices' lists them", flashcl_last_error(NULL),
                   flashcl_status_string(status));
        return NULL;
    }
    return ctx;
}

/* a*b*c*d elements without overflowing size_t; -1 if it would. */
flashcl_context *cli_open_device(const char *spec, const char *refusal) {
    flashcl_context *ctx = cli_open_context(spec);
    if (ctx && flashcl_context_is_host(ctx)) {
        cli_errorf("%s", refusal);
        flashcl_context_destroy(ctx);
        return NULL;
    }
    return ctx;
}

int cli_count4(size_t a, size_t b, size_t c, size_t d, size_t *out) {
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
flashcl_attention_desc cli_make_desc(flashcl_dtype dtype, int batch, int heads_q, int heads_k,
                                     int seqlen_q, int seqlen_k, int head_dim) {
    flashcl_attention_desc desc = {.dtype = dtype,
                                   .batch = batch,
                                   .heads_q = heads_q,
                                   .heads_k = heads_k,
                                   .seqlen_q = seqlen_q,
                                   .seqlen_k = seqlen_k,
                                   .head_dim = head_dim,
                                   .window_left = -1,
                                   .window_right = -1};
    return desc;
}

flashcl_attention_desc cli_npy_desc(const struct npy_array *q, const struct npy_array *k,
                                    int causal, int window_left, int window_right, double softcap,
                                    double scale) {
    flashcl_attention_desc d = cli_make_desc(
        q->dtype == NPY_FLOAT16 ? FLASHCL_FLOAT16 : FLASHCL_FLOAT32, (int)q->shape[0],
        (int)q->shape[2], (int)k->shape[2], (int)q->shape[1], (int)k->shape[1], (int)q->shape[3]);
    d.causal = causal;
    d.windowed = window_left >= 0 || window_right >= 0;
    d.window_left = window_left;
    d.window_right = window_right;
    d.softcap = (float)softcap;
    d.scale = (float)scale;
    return d;
}

int cli_compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
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
