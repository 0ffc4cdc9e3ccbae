/* params_common.c: what the parameter-database tests share (params_common.h). */
#define _POSIX_C_SOURCE 200809L
#include "params_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char dir[256];

void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    static char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return buf;
}

flashcl_attention_desc desc_of(flashcl_dtype dtype, int n, int d, int causal) {
    flashcl_attention_desc x = test_attention_desc(dtype, 1, 2, 2, n, n, d);
    x.causal = causal;
    return x;
}

/* The params of desc on a fresh context reading the tuning file `path`. */
flashcl_status params_with_file(const char *path, const flashcl_attention_desc *d,
                                       flashcl_params *p, char *source, size_t size,
                                       const char **problem_out, char *problem, size_t psize) {
    setenv("FLASHCL_TUNING_FILE", path, 1);
    flashcl_context *ctx = test_context();
    flashcl_status st = flashcl_attention_params(ctx, d, p);
    const char *pr = NULL;
    flashcl_tuning_file(ctx, &pr);
    snprintf(source, size, "%s", st == FLASHCL_SUCCESS ? p->source : "");
    if (problem_out)
        *problem_out = pr ? problem : NULL;
    if (problem)
        snprintf(problem, psize, "%s", pr ? pr : "");
    flashcl_context_destroy(ctx);
    return st;
}

const char *device_name(void) {
    static char name[256];
    flashcl_context *ctx = test_context();
    snprintf(name, sizeof name, "%s", ctx->info.name);
    flashcl_context_destroy(ctx);
    return name;
}

/* 1 when text parses; *count: forward entries, *other (may be NULL): serving + backward. */
int parses2(const char *text, size_t len, size_t *count, size_t *other, char *err, size_t n) {
    flashcl_tuning_data tf;
    memset(&tf, 0, sizeof tf);
    int r = flashcl_tuning_parse(text, len, &tf, err, n);
    if (count)
        *count = tf.count;
    if (other)
        *other = tf.num_serving + tf.num_backward;
    flashcl_tuning_free(&tf);
    return r == 0;
}

void pretend_plain(flashcl_context *ctx) {
    ctx->info.is_rusticl = 0;
    ctx->info.max_wg = 1024;
}

void pretend_h200(flashcl_context *ctx) {
    pretend_plain(ctx);
    /* Not a name with built-in device entries: this tests the arch level. */
    snprintf(ctx->info.name, sizeof ctx->info.name, "Pretend NVIDIA sm_90 GPU");
    snprintf(ctx->info.vendor, sizeof ctx->info.vendor, "NVIDIA Corporation");
    snprintf(ctx->info.driver, sizeof ctx->info.driver, "550.0");
    ctx->info.type = CL_DEVICE_TYPE_GPU;
    ctx->info.nv_cc_major = 9;
    ctx->info.nv_cc_minor = 0;
    ctx->info.is_nvidia = 1;
    ctx->info.local_mem = 48 * 1024;
    ctx->info.max_wg = 1024;
}

/* A fresh context on the pretend H200 after writing `text` to the tuning file at path. */
flashcl_context *pretend_h200_tuned(const char *path, const char *text) {
    write_file(path, text);
    flashcl_context *ctx = test_context();
    pretend_h200(ctx);
    return ctx;
}

int params_make_dir(const char *name) {
    snprintf(dir, sizeof dir, "/tmp/%s.%ld", name, (long)getpid());
    if (mkdir(dir, 0755) != 0) {
        perror(dir);
        return 0;
    }
    return 1;
}

void params_remove_dir(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}
