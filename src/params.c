/* params.c: what the forward, serving and backward parameter choices share: the per-context
 * database (the tuning file, flashcl_set_params' overrides, source strings), the level keys
 * (device, architecture, vendor, device type) and the walk over per-level tables. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "params_internal.h"

/* ---- the per-context state: the tuning file, overrides and source strings ---------------- */

typedef struct interned {
    struct interned *next;
    char text[];
} interned;

void flashcl_param_db_free(struct flashcl_param_db *db) {
    if (!db)
        return;
    flashcl_tuning_free(&db->file);
    free(db->overrides);
    while (db->strings) {
        interned *next = db->strings->next;
        free(db->strings);
        db->strings = next;
    }
    free(db);
}

/* The context is logically const here: the database is a cache of the
 * file and of source strings. */
struct flashcl_param_db *flashcl_param_db_get(const flashcl_context *cctx) {
    flashcl_context *ctx = (flashcl_context *)cctx;
    if (!ctx->params_db)
        ctx->params_db = calloc(1, sizeof *ctx->params_db);
    struct flashcl_param_db *db = ctx->params_db;
    if (db && !db->file_loaded) {
        char path[4096];
        db->file_loaded = 1;
        if (flashcl_tuning_path(path, sizeof path))
            flashcl_tuning_load(path, &db->file);
    }
    return db;
}

const char *flashcl_param_intern(const flashcl_context *ctx, const char *fmt, const char *a,
                                 const char *b) {
    static const char fallback[] = "(out of memory)";
    struct flashcl_param_db *db = flashcl_param_db_get(ctx);
    char text[600];
    snprintf(text, sizeof text, fmt, a, b ? b : "");
    if (!db)
        return fallback;
    for (interned *s = db->strings; s; s = s->next)
        if (!strcmp(s->text, text))
            return s->text;
    interned *s = malloc(sizeof *s + strlen(text) + 1);
    if (!s)
        return fallback;
    strcpy(s->text, text);
    s->next = db->strings;
    db->strings = s;
    return s->text;
}

const char *flashcl_shrunk_source(const flashcl_context *ctx, const char *source) {
    return flashcl_param_intern(ctx, "%s (shrunk to fit %s)", source, ctx->info.name);
}

size_t flashcl_local_budget(const flashcl_context *ctx) {
    return ctx->info.local_mem > 2048 ? (size_t)ctx->info.local_mem - 1024 : 0;
}

void flashcl_check_local(const flashcl_context *ctx, size_t bytes, char *why, size_t n) {
    if (!why[0] && bytes > ctx->info.local_mem)
        snprintf(why, n, "%zu bytes of local memory needed, the device has %llu", bytes,
                 (unsigned long long)ctx->info.local_mem);
}

void flashcl_check_work_group(const flashcl_context *ctx, int work_group_size, char *why,
                              size_t n) {
    if (!why[0] && (size_t)work_group_size > ctx->info.max_wg)
        snprintf(why, n, "work-group of %d exceeds the device's %zu", work_group_size,
                 ctx->info.max_wg);
}

int flashcl_variant_forced(const char *variant) {
    const char *force = getenv("FLASHCL_VARIANT");
    return force && !strcmp(force, variant);
}

/* ---- level keys: architecture, vendor, device type ---------------------------------------- */

static int contains_nocase(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; ++hay) {
        size_t i = 0;
        while (i < n && hay[i] && (hay[i] | 32) == (needle[i] | 32))
            ++i;
        if (i == n)
            return 1;
    }
    return 0;
}

void flashcl_device_arch(const flashcl_context *ctx, char *buf, size_t n) {
    const flashcl_device_info *i = &ctx->info;
    buf[0] = '\0';
    if (i->nv_cc_major > 0)
        snprintf(buf, n, "sm_%d%d", i->nv_cc_major, i->nv_cc_minor);
    else if (!strncmp(i->name, "gfx", 3)) /* ROCm names devices by their ISA */
        snprintf(buf, n, "%.*s", (int)strcspn(i->name, ":"), i->name);
    else if (contains_nocase(i->vendor, "intel") && (i->type & CL_DEVICE_TYPE_GPU))
        snprintf(buf, n, "%s",
                 contains_nocase(i->name, "Max") ? "xe-hpc"
                 : contains_nocase(i->name, "Arc") ? "xe-hpg"
                 : contains_nocase(i->name, "Xe") ? "xe-lp"
                                                  : "");
}

static const char *vendor_of(const flashcl_context *ctx) {
    const flashcl_device_info *i = &ctx->info;
    if (i->is_nvidia)
        return "NVIDIA";
    if (contains_nocase(i->vendor, "advanced micro") || contains_nocase(i->vendor, "amd"))
        return "AMD";
    if (contains_nocase(i->vendor, "intel"))
        return "Intel";
    return "";
}

/* Arch keys: "sm_90" exactly, or "sm_80+" for that compute capability or newer. */
static int arch_match(const char *key, const char *arch) {
    size_t n = strlen(key);
    if (n && key[n - 1] == '+' && !strncmp(key, "sm_", 3) && !strncmp(arch, "sm_", 3))
        return atoi(arch + 3) >= atoi(key + 3);
    return arch[0] && !strcmp(key, arch);
}

int flashcl_level_key_match(const flashcl_context *ctx, int level, const flashcl_param_entry *e,
                            const char *arch) {
    const flashcl_device_info *i = &ctx->info;
    switch (level) {
    case LVL_SET: return 1;
    case LVL_FILE:
    case LVL_DEVICE: return !strcmp(e->match, i->name) && (!e->driver || !strcmp(e->driver, i->driver));
    case LVL_ARCH: return arch_match(e->match, arch);
    case LVL_VENDOR: return !strcmp(e->match, vendor_of(ctx));
    case LVL_TYPE: return !strcmp(e->match, (i->type & CL_DEVICE_TYPE_CPU) ? "CPU" : "GPU");
    default: return 1;
    }
}

const char *flashcl_level_source(const flashcl_context *ctx, int level,
                                 const flashcl_param_entry *e) {
    struct flashcl_param_db *db = flashcl_param_db_get(ctx);
    switch (level) {
    case LVL_SET: return "set: flashcl_set_params";
    case LVL_FILE: return flashcl_param_intern(ctx, "tuned: %s%s", db ? db->file.path : "?", NULL);
    case LVL_DEVICE: return flashcl_param_intern(ctx, "built-in device: %s%s", e->match, NULL);
    case LVL_ARCH: return flashcl_param_intern(ctx, "built-in arch: %s%s", e->match, NULL);
    case LVL_VENDOR: return flashcl_param_intern(ctx, "built-in vendor: %s%s", e->match, NULL);
    case LVL_TYPE: return flashcl_param_intern(ctx, "default: %s%s", e->match, NULL);
    default: return "default: global";
    }
}

/* The serving and backward entries are read through a flashcl_param_entry's key. */
_Static_assert(offsetof(flashcl_serving_entry, driver) == sizeof(const char *) &&
                   offsetof(flashcl_backward_entry, driver) == sizeof(const char *),
               "level table entries open with match, driver");

const void *flashcl_walk_levels(const flashcl_context *ctx, const level_table *levels,
                                size_t num_levels,
                                int (*applies)(const flashcl_context *ctx, int level,
                                               const void *entry, const void *arg),
                                const void *arg, int *level, const char **source) {
    char arch[64];
    flashcl_device_arch(ctx, arch, sizeof arch);
    for (size_t l = 0; l < num_levels; ++l)
        for (size_t i = 0; i < levels[l].count; ++i) {
            const void *entry = (const char *)levels[l].entries + i * levels[l].size;
            flashcl_param_entry key;
            memset(&key, 0, sizeof key);
            memcpy(&key.match, entry, sizeof key.match);
            memcpy(&key.driver, (const char *)entry + sizeof key.match, sizeof key.driver);
            if (key.match && flashcl_level_key_match(ctx, levels[l].level, &key, arch) &&
                (!applies || applies(ctx, levels[l].level, entry, arg))) {
                *level = levels[l].level;
                *source = flashcl_level_source(ctx, levels[l].level, &key);
                return entry;
            }
        }
    return NULL;
}

/* ---- public: the tuning file this context read ------------------------------------------ */

const char *flashcl_tuning_file(flashcl_context *ctx, const char **problem) {
    FLASHCL_LOCKED(ctx);
    if (problem)
        *problem = NULL;
    if (!ctx || ctx->is_host)
        return NULL;
    struct flashcl_param_db *db = flashcl_param_db_get(ctx);
    if (!db || !db->file.path)
        return NULL;
    if (problem)
        *problem = db->file.problem;
    return db->file.path;
}

