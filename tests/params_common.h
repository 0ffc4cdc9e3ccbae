/* params_common.h: what test_params.c (the forward's database, the tuning file) and
 * test_params_tables.c (the backward's and decode's tables) share: a scratch directory, files,
 * descriptors, a pretend H200. */
#ifndef FLASHCL_TEST_PARAMS_COMMON_H
#define FLASHCL_TEST_PARAMS_COMMON_H

#include <stddef.h>

#include "harness.h"
#include "internal.h"

/* The test's scratch directory (params_make_dir). */
extern char dir[256];
/* Makes /tmp/NAME.PID the scratch directory; 0 (with a message) if it cannot. */
int params_make_dir(const char *name);
void params_remove_dir(void);

/* text into path (exits on failure); a file's contents (up to 64 KB, a static buffer). */
void write_file(const char *path, const char *text);
char *read_all(const char *path);
/* One batch, two heads, n queries and keys of head_dim d. */
flashcl_attention_desc desc_of(flashcl_dtype dtype, int n, int d, int causal);
/* The params of d on a fresh context reading the tuning file at path; source and problem (the
 * file's, if any: *problem_out points at it, else NULL) copied out. */
flashcl_status params_with_file(const char *path, const flashcl_attention_desc *d, flashcl_params *p, char *source,
                                size_t size, const char **problem_out, char *problem, size_t psize);
/* The test device's name. */
const char *device_name(void);
/* 1 when text parses; *count: forward entries, *other (may be NULL): serving + backward. */
int parses2(const char *text, size_t len, size_t *count, size_t *other, char *err, size_t n);
/* ctx's device info cleared of what the running implementation adds to the parameter rules
 * (rusticl's refusals, and its probed 32 work-items a group: 1024 here), so that a pretend
 * device's tables come out the same whichever implementation runs the test. */
void pretend_plain(flashcl_context *ctx);
/* ctx's device info made an H200 without its name (the arch level's entries apply), plain. */
void pretend_h200(flashcl_context *ctx);
/* A fresh context on the pretend H200 after writing `text` to the tuning file at path. */
flashcl_context *pretend_h200_tuned(const char *path, const char *text);

#endif
