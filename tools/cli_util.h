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
/* Writes value as a JSON number, or null unless valid and finite. */
void cli_json_number(FILE *f, double value, int valid);

/* Opens a bench document on stdout: {"tool": tool, "version", "device", "host_path",
 * "timing", "dtype", "iters", "warmup", then "rows": [ (the caller writes the rows
 * and closes with "]}"). */
void cli_json_bench_open(flashcl_context *ctx, const char *tool, const char *dtype, long iters,
                         long warmup);

/* 1 for --help and -h. */
int cli_is_help(const char *arg);
/* Prints "flashcl: what: status (code): <the context's last error>" (which may carry a build log).
 */
void cli_report_status(const flashcl_context *ctx, const char *what, flashcl_status status);
/* A context for a device spec (NULL: the default), or NULL after printing why. */
flashcl_context *cli_open_context(const char *spec);
/* a*b*c*d elements without overflowing size_t: 0, or -1 if it would overflow. */
int cli_count4(size_t a, size_t b, size_t c, size_t d, size_t *out);
/* A zeroed descriptor with the mask fields meaning "no mask": zero windows would mean "the
 * diagonal only", so unbounded sides are set explicitly. */
flashcl_attention_desc cli_make_desc(flashcl_dtype dtype, int batch, int heads_q, int heads_k,
                                     int seqlen_q, int seqlen_k, int head_dim);
/* qsort's comparison for doubles, ascending. */
int cli_compare_doubles(const void *a, const void *b);

#endif /* FLASHCL_TOOLS_CLI_UTIL_H */
