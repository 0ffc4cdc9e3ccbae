/* cli_util.h: helpers shared by the flashcl subcommands: messages, options, clocks, JSON. */
#ifndef FLASHCL_TOOLS_CLI_UTIL_H
#define FLASHCL_TOOLS_CLI_UTIL_H

#include <stddef.h>
#include <stdio.h>

#include "flashcl.h"

/* Exit statuses of the tool. */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

#if defined(__GNUC__)
#define CLI_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CLI_PRINTF(f, a)
#endif

/* Prints "flashcl: <message>\n" to stderr. */
void cli_errorf(const char *fmt, ...) CLI_PRINTF(1, 2);

/* Usage errors print one line and a pointer to --help, never the whole help text.
 * cli_usage_error: "flashcl: <message>" then "Try 'flashcl CMD --help' for its options.", CMD read
 * from the first line of `usage`; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *usage, const char *fmt, ...) CLI_PRINTF(2, 3);
/* The same for an unknown option, with "did you mean '--x'?" when an option named in `usage` is
 * within two edits of it (--casual: --causal). */
int cli_unknown_option(const char *usage, const char *arg);
/* The word of `text` nearest to `word` (options with options, plain words with plain words), if
 * it is within two edits and fewer than half the word's letters: copies it to buf, returns 1. */
int cli_nearest_word(const char *word, const char *text, char *buf, size_t size);

/* Seconds on CLOCK_MONOTONIC. */
double cli_now(void);

/* Strict number parsing: the whole text must be a number in range.
 * Return 0 on success, -1 otherwise (nothing printed). */
int cli_parse_long(const char *text, long min, long max, long *out);
int cli_parse_double(const char *text, double *out); /* finite values only */
/* A storage type by name: f16/fp16/float16, bf16/bfloat16, f32/fp32/float32. */
int cli_parse_dtype(const char *text, flashcl_dtype *dtype);
/* The same, plus the FP8 formats e4m3 (float8_e4m3fn, fp8) and e5m2 (float8_e5m2),
 * for the commands that take them (the forward's attention and bench). */
int cli_parse_dtype_fp8(const char *text, flashcl_dtype *dtype);
/* Its short name, "f32", "f16" or "bf16" ("?" for none). */
const char *cli_dtype_name(flashcl_dtype dtype);
/* "1,8,1024,64": up to max_count integers in [min, max]; *count gets how many. */
int cli_parse_long_list(const char *text, long min, long max, long *values, int max_count,
                        int *count);

/* Matches argv[*i] against an option that takes a value, written either
 * "--name VALUE" or "--name=VALUE". Returns 1 and sets *value (advancing *i
 * past a separate value) on a match, 0 when argv[*i] is another option, and
 * -1 after printing "option --name needs a value" when the value is missing. */
int cli_take_value(int argc, char **argv, int *i, const char *name, const char **value);
/* --softcap C and --scale S (attention, attention --backward): numbers in [0, FLT_MAX], 0 meaning
 * no cap and 1/sqrt(head_dim); the returns and messages of cli_take_double. */
int cli_take_softcap_scale(const char *usage, int argc, char **argv, int *i, double *softcap,
                           double *scale);
/* A switch (an option without a value) and the int it sets to 1 (NULL: accepted, nothing set). */
typedef struct cli_flag {
    const char *name;
    int *value;
} cli_flag;
/* 1 after setting the value of the one of `count` flags named `arg`, 0 when none is. */
int cli_take_flag(const char *arg, const cli_flag *flags, int count);
/* cli_take_value for each of `count` options names[n], storing the value in values[n]: the
 * same returns. */
int cli_take_any(int argc, char **argv, int *i, const char *const *names, int count,
                 const char **values);
/* cli_take_value, then the value parsed as a whole number (or a finite number) in [min, max].
 * Return 1 with *out set, 0 when argv[*i] is another option, and -1 after a missing value's
 * message or cli_usage_error(usage, "NAME wants WANTS, not 'VALUE'") (usage NULL: just
 * "flashcl: NAME wants WANTS"): the caller returns CLI_EXIT_USAGE. */
int cli_take_long(const char *usage, int argc, char **argv, int *i, const char *name, long min,
                  long max, const char *wants, long *out);
int cli_take_double(const char *usage, int argc, char **argv, int *i, const char *name, double min,
                    double max, const char *wants, double *out);

/* 1 when paths a and b name the same file: for files that exist, the same
 * st_dev and st_ino (so hard links, symlinks and "./x" vs "x" all count);
 * otherwise the same canonical directory and name. An output that is one of
 * the inputs would be truncated before (or while) it is read. */
int cli_same_file(const char *a, const char *b);

/* Checks that each of the paths[first_output..count) names a file that no
 * other path names (NULL entries are skipped). Prints "flashcl: NAME and
 * NAME name the same file 'PATH'" and returns -1 on the first clash. */
int cli_check_outputs(const char *const *names, const char *const *paths, int first_output, int count);

/* Peak resident set size of this process in bytes (getrusage ru_maxrss). */
size_t cli_peak_rss_bytes(void);

/* Writes `text` as a JSON string literal, quotes included. */
void cli_json_string(FILE *f, const char *text);
/* Writes `text` as a JSON string literal, or null when it is empty (a row's error). */
void cli_json_string_or_null(FILE *f, const char *text);
/* Writes value as a JSON number, or null unless valid and finite. */
void cli_json_number(FILE *f, double value, int valid);

/* Opens a bench document on stdout: {"tool": tool, "version", "device", "host_path",
 * "timing", "dtype", "iters", "warmup", then "rows": [ (the caller writes the rows
 * and closes with "]}"). */
void cli_json_bench_open(flashcl_context *ctx, const char *tool, const char *dtype, long iters,
                         long warmup);

/* For --help and -h: prints `usage` on stdout and returns 1 (the caller exits CLI_EXIT_OK). */
int cli_help(const char *arg, const char *usage);
/* Prints "flashcl: what: status (code): <the context's last error>" (which may carry a build log).
 */
void cli_report_status(const flashcl_context *ctx, const char *what, flashcl_status status);
/* A context for a device spec (NULL: the default), or NULL after printing why. */
flashcl_context *cli_open_context(const char *spec);
/* The same for commands that need an OpenCL device: on the host path, prints "flashcl:
 * <refusal>" and returns NULL. */
flashcl_context *cli_open_device(const char *spec, const char *refusal);
/* a*b*c*d elements without overflowing size_t: 0, or -1 if it would overflow. */
int cli_count4(size_t a, size_t b, size_t c, size_t d, size_t *out);
/* A zeroed descriptor with the mask fields meaning "no mask": zero windows would mean "the
 * diagonal only", so unbounded sides are set explicitly. */
flashcl_attention_desc cli_make_desc(flashcl_dtype dtype, int batch, int heads_q, int heads_k,
                                     int seqlen_q, int seqlen_k, int head_dim);
/* The descriptor of q [B][Nq][Hq][D] and k [B][Nk][Hk][D] read from .npy files (q's dtype, f16
 * or f32), checked by the caller to agree, with the mask (a window side < 0: unbounded; both:
 * no window) and score options; resolve it before use. */
struct npy_array;
flashcl_attention_desc cli_npy_desc(const struct npy_array *q, const struct npy_array *k,
                                    int causal, int window_left, int window_right, double softcap,
                                    double scale);
/* qsort's comparison for doubles, ascending. */
int cli_compare_doubles(const void *a, const void *b);

#endif /* FLASHCL_TOOLS_CLI_UTIL_H */
