/* params_internal.h: what src/params*.c share beyond internal.h: database, levels, the walk. */
#ifndef FLASHCL_PARAMS_INTERNAL_H
#define FLASHCL_PARAMS_INTERNAL_H

#include <stddef.h>

#include "internal.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ---- the per-context state: the tuning file, overrides and source strings ---------------- */

struct interned; /* params.c: the source strings flashcl_param_intern keeps */

struct flashcl_param_db {
    flashcl_tuning_data file;
    int file_loaded;
    flashcl_param_entry *overrides; /* flashcl_set_params, newest last */
    size_t num_overrides;
    struct interned *strings;
};

/* The context's database, created (and the tuning file loaded) on first use;
 * NULL when out of memory. */
struct flashcl_param_db *flashcl_param_db_get(const flashcl_context *ctx);

/* snprintf(fmt, a, b) (b NULL: "") as a string that lives as long as the
 * context (for a choice's source). */
const char *flashcl_param_intern(const flashcl_context *ctx, const char *fmt, const char *a,
                                 const char *b);

/* source, marked as a default shrunk to fit this device. */
const char *flashcl_shrunk_source(const flashcl_context *ctx, const char *source);

/* The __local bytes a default may take: the device's with 1 KB left for the
 * driver (NVIDIA refuses launches at the reported limit); 0 at 2 KB or less. */
size_t flashcl_local_budget(const flashcl_context *ctx);

/* Where why is still "" (no earlier check failed) and the device's __local
 * or work-group limit is exceeded, says so in why (n bytes). */
void flashcl_check_local(const flashcl_context *ctx, size_t bytes, char *why, size_t n);
void flashcl_check_work_group(const flashcl_context *ctx, int work_group_size, char *why, size_t n);

/* 1 when FLASHCL_VARIANT names variant ("portable": no tensor-core kernels). */
int flashcl_variant_forced(const char *variant);

/* ---- levels: most specific first (params_forward.c's opening comment lists them) --------- */

enum { LVL_SET, LVL_FILE, LVL_DEVICE, LVL_ARCH, LVL_VENDOR, LVL_TYPE, LVL_GLOBAL, LVL_COUNT };

/* 1 when entry e's key (match, driver) at level matches this device; arch is
 * flashcl_device_arch's. */
int flashcl_level_key_match(const flashcl_context *ctx, int level, const flashcl_param_entry *e,
                            const char *arch);

/* The source string of a choice from e at level ("built-in arch: sm_80+"...). */
const char *flashcl_level_source(const flashcl_context *ctx, int level,
                                 const flashcl_param_entry *e);

/* The serving and backward tables: one array per level (the tuning file's
 * entries, then the built-in tables), walked with the forward's level keys.
 * Their entry types differ but open with the key: `const char *match, *driver`. */
typedef struct level_table {
    int level;
    const void *entries; /* count entries of size bytes */
    size_t count, size;
} level_table;
#define LEVEL_TABLE(level, a)                                                                      \
    { level, a, COUNT(a), sizeof((a)[0]) }
/* The tuning file's entries (count of them), then the built-in tables
 * <name>_device, _arch, _vendor, _type and _global. */
#define FILE_AND_BUILTIN_LEVELS(entries, count, name)                                              \
    {LVL_FILE, entries, count, sizeof((name##_global)[0])},                                        \
        LEVEL_TABLE(LVL_DEVICE, name##_device), LEVEL_TABLE(LVL_ARCH, name##_arch),                \
        LEVEL_TABLE(LVL_VENDOR, name##_vendor), LEVEL_TABLE(LVL_TYPE, name##_type),                \
        LEVEL_TABLE(LVL_GLOBAL, name##_global)

/* The first entry, most specific level first, whose key matches this device
 * and that applies (applies NULL: every entry); *level and *source name its
 * level. NULL, with both untouched, when none does. */
const void *flashcl_walk_levels(const flashcl_context *ctx, const level_table *levels,
                                size_t num_levels,
                                int (*applies)(const flashcl_context *ctx, int level,
                                               const void *entry, const void *arg),
                                const void *arg, int *level, const char **source);

#endif
