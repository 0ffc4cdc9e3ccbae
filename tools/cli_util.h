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

/* What a device spec names, for messages: "'gpu'", "'x' (from FLASHCL_DEVICE)"
 * when spec is empty and the variable is set (the library then reads it),
 * else "(default)". Returns buf. */
const char *cli_device_label(const char *spec, char *buf, size_t cap);

/* Peak resident set size of this process in bytes (getrusage ru_maxrss). */
size_t cli_peak_rss_bytes(void);

/* Writes `text` as a JSON string literal, quotes included. */
void cli_json_string(FILE *f, const char *text);
/* Writes value as a JSON number, or null unless valid and finite. */
void cli_json_number(FILE *f, double value, int valid);

/* Opens a bench document on stdout: {"tool": tool, "version", "device", "host_path",
 * "timing", "dtype", "iters", "warmup", then "rows": [ (the caller writes the rows
 * and closes with "]}"). */
void cli_json_bench_open(flashcl_context *ctx, const char *tool, const char *dtype, long iters, long warmup);

#endif /* FLASHCL_TOOLS_CLI_UTIL_H */
