/* tuning_file.c: the user tuning file: where it lives, a small strict JSON reader, and an atomic writer.
 *
 * The file (version 1) is one JSON object:
 *
 *   {"flashcl_tuning": 1,
 *    "entries": [
 *      {"device": "NVIDIA H200",          exact CL_DEVICE_NAME (required)
 *       "driver": "550.54.15",            exact CL_DRIVER_VERSION (optional: any driver)
 *       "variant": "nv-mma",              "portable", "cpu", "nv-mma", "nv-tf32" or "nv-wgmma" (required)
 *       "dtype": "f16",                   "f32", "f16", "bf16" or "any" (required)
 *       "head_dim_min": 65, "head_dim_max": 128,   the head_dim range (optional: 1..256)
 *       "phase": "prefill",               "prefill" (seqlen_q > 1), "decode" (seqlen_q == 1)
 *                                         or "any" (optional: any)
 *       "causal": false,                  true, false or null (optional: either)
 *       "block_m": 64, "block_n": 64,     required, 1..4096
 *       "threads_per_row": 8,             required for "portable"
 *       "warps": 4,                       required for "nv-mma", "nv-tf32" and "nv-wgmma"
 *       "comment": "..."}                 anything else is kept but not read
 *    ],
 *    "serving": [                         optional: the paged/varlen kernels (params_serving.c's
 *      {"device": "NVIDIA H200",          decode_entry, flashcl_decode_params); device and
 *       "driver": "550.54.15",            driver as above
 *       "kernel": "mma",                  "tiled", "decode" or "mma" (required)
 *       "max_rows": 16,                   decode kernels: the most rows per block they take
 *                                         (optional: mma 1..16, default 16; decode 1..8, default 8)
 *       "work_group_size": 128,           decode: 1..1024 (required for "decode")
 *       "unroll": 4,                      decode: keys per slot per step, 1..16 (required for "decode")
 *       "stages": 2,                      decode, mma: K/V pipeline depth, 2..8 (required for both)
 *       "wgs_per_cu": 16,                 split-KV target, 1..1024 (required)
 *       "min_split_keys": 512,            shortest key slice, 1..1048576 (required)
 *       "comment": "..."}                 optional string, shown in the source
 *    ],
 *    "backward": [                        optional: the backward kernels (params_backward.c's table)
 *      {"device": "NVIDIA H200", "driver": "550.54.15",    as above
 *       "head_dim_min": 1, "head_dim_max": 128,   the head_dim range (optional: 1..256)
 *       "block_m": 16, "block_n": 16,     required, 1..1024
 *       "work_group_size": 128,           required, 1..1024
 *       "variant": "cpu",                 optional: "portable" (default, cl/flash_bwd.cl),
 *                                         "cpu" (cl/flash_bwd_cpu.cl), "nv-mma"
 *                                         (cl/flash_bwd_nv.cl) or "nv-wgmma"
 *                                         (cl/flash_bwd_sm90.cl), where they apply
 *       "max_registers": 168,             optional, nv-mma: registers per thread, 16..255
 *                                         (0, the default: the compiler's choice)
 *       "own_regs": 1,                    optional, nv-wgmma: 1 holds K and V (Q and dO)
 *                                         fragments in registers (OWN_REGS=1); 0 the default
 *       "comment": "..."}                 optional string, shown in the source
 *    ]}
 *
 * A value a kernel does not read (unroll on a tiled entry) is still checked
 * when present. Values that pass these checks but do not fit the device
 * (local memory, work-group size, the kernel's rules) pass the entry over at
 * lookup, with a log line (src/params_*.c); they are not errors here.
 *
 * Error policy (documented in the header too): the file is used whole or not
 * at all. A file over FLASHCL_TUNING_MAX_BYTES, one that is not valid JSON
 * (truncated, malformed, nested deeper than 32), a version other than 1, or
 * any entry with a missing or wrong-typed field or an out-of-range value makes
 * the library ignore the whole file: one log line, and flashcl_tuning_file()
 * returns the reason with line and column. Two things are forward-compatible
 * and skip only what they concern: unknown keys are ignored, and an entry
 * naming a variant this build does not know is skipped (an unknown serving
 * "kernel" is an error: the three are all the serving path chooses from).
 * The writer refuses to replace a file it cannot read, so a hand-edited file
 * is never lost, and it rewrites the whole document it read, so "serving",
 * "backward" and unknown keys survive a stored forward entry.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* ---- where the file lives ------------------------------------------------------------ */

int flashcl_tuning_path(char *buf, size_t size) {
    const char *env = getenv("FLASHCL_TUNING_FILE"), *xdg = getenv("XDG_CONFIG_HOME");
    const char *home = getenv("HOME");
    int n;
    if (env && env[0])
        n = snprintf(buf, size, "%s", env);
    else if (xdg && xdg[0] == '/') /* the XDG spec: a relative value is invalid, ignore it */
        n = snprintf(buf, size, "%s/flashcl/tuning.json", xdg);
    else if (home && home[0])
        n = snprintf(buf, size, "%s/.config/flashcl/tuning.json", home);
    else
        return 0;
    return n > 0 && (size_t)n < size;
}

/* ---- a tiny strict JSON DOM ------------------------------------------------------------ */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype type;
    int line, col;    /* where the value starts, for messages */
    double num;       /* J_NUM; J_BOOL: 0 or 1 */
    char *str;        /* J_STR */
    struct jval *kid; /* J_ARR, J_OBJ: items in order          */
    char **keys;      /* J_OBJ: key of each item               */
    size_t n, cap;
} jval;

typedef struct jparser {
    const char *s, *end;
    int line, col, depth;
    char err[160];
} jparser;

#define JSON_MAX_DEPTH 32

static void jfree_kids(jval *v) {
    for (size_t i = 0; i < v->n; ++i) {
        jfree_kids(&v->kid[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->kid);
    free(v->keys);
    free(v->str);
    memset(v, 0, sizeof *v);
}

static int jfail(jparser *p, const char *msg) {
    if (!p->err[0])
        snprintf(p->err, sizeof p->err, "line %d, column %d: %s", p->line, p->col, msg);
    return 0;
}

static void jadvance(jparser *p) {
    if (*p->s == '\n') {
        ++p->line;
        p->col = 1;
    } else {
        ++p->col;
    }
    ++p->s;
}

static void jspace(jparser *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        jadvance(p);
}

static int jlit(jparser *p, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(p->end - p->s) < n || memcmp(p->s, word, n) != 0)
        return jfail(p, "invalid literal");
    for (size_t i = 0; i < n; ++i)
        jadvance(p);
    return 1;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                               : -1;
}

static int jhex4(jparser *p, unsigned *out) {
    *out = 0;
    for (int i = 0; i < 4; ++i) {
        int h = p->s < p->end ? hexval(*p->s) : -1;
        if (h < 0)
            return jfail(p, "bad \\u escape");
        *out = *out * 16 + (unsigned)h;
        jadvance(p);
    }
    return 1;
}

/* Parses a string at p->s (the opening quote) into a heap copy (UTF-8). */
static int jstring(jparser *p, char **out) {
    size_t cap = 16, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return jfail(p, "out of memory");
    jadvance(p); /* the quote */
    for (;;) {
        if (p->s >= p->end) {
            free(buf);
            return jfail(p, "unterminated string");
        }
        unsigned char c = (unsigned char)*p->s;
        unsigned cp = c;
        if (c == '"') {
            jadvance(p);
            break;
        }
        if (c < 0x20) {
            free(buf);
            return jfail(p, "control character in a string");
        }
        jadvance(p);
        if (c == '\\') {
            if (p->s >= p->end) {
                free(buf);
                return jfail(p, "unterminated string");
            }
            char e = *p->s;
            jadvance(p);
            switch (e) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u': {
                if (!jhex4(p, &cp)) {
                    free(buf);
                    return 0;
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
                    unsigned lo;
                    if (p->end - p->s < 2 || p->s[0] != '\\' || p->s[1] != 'u') {
                        free(buf);
                        return jfail(p, "unpaired surrogate");
                    }
                    jadvance(p);
                    jadvance(p);
                    if (!jhex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                        free(buf);
                        return jfail(p, "unpaired surrogate");
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    free(buf);
                    return jfail(p, "unpaired surrogate");
                }
                break;
            }
            default:
                free(buf);
                return jfail(p, "bad escape");
            }
        }
        if (n + 5 > cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) {
                free(buf);
                return jfail(p, "out of memory");
            }
            buf = grown;
        }
        if (c == '\\' && cp >= 0x80) { /* encode the escaped code point */
            if (cp < 0x800) {
                buf[n++] = (char)(0xC0 | (cp >> 6));
            } else if (cp < 0x10000) {
                buf[n++] = (char)(0xE0 | (cp >> 12));
                buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            } else {
                buf[n++] = (char)(0xF0 | (cp >> 18));
                buf[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            }
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            buf[n++] = (char)cp;
        }
    }
    buf[n] = '\0';
    if (strlen(buf) != n) { /* "\u0000" would cut the string short: refuse it */
        free(buf);
        return jfail(p, "NUL in a string");
    }
    *out = buf;
    return 1;
}

/* JSON's number grammar exactly, then strtod on a bounded copy. */
static int jnumber(jparser *p, double *out) {
    const char *s = p->s, *e = p->end, *q = s;
    if (q < e && *q == '-')
        ++q;
    if (q < e && *q == '0')
        ++q;
    else if (q < e && *q >= '1' && *q <= '9')
        while (q < e && *q >= '0' && *q <= '9')
            ++q;
    else
        return jfail(p, "invalid number");
    if (q < e && *q == '.') {
        ++q;
        if (q >= e || *q < '0' || *q > '9')
            return jfail(p, "invalid number");
        while (q < e && *q >= '0' && *q <= '9')
            ++q;
    }
    if (q < e && (*q == 'e' || *q == 'E')) {
        ++q;
        if (q < e && (*q == '+' || *q == '-'))
            ++q;
        if (q >= e || *q < '0' || *q > '9')
            return jfail(p, "invalid number");
        while (q < e && *q >= '0' && *q <= '9')
            ++q;
    }
    char tmp[64];
    size_t len = (size_t)(q - s);
    if (len >= sizeof tmp)
        return jfail(p, "number too long");
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    *out = strtod(tmp, NULL);
    if (!isfinite(*out))
        return jfail(p, "number out of range");
    while (p->s < q)
        jadvance(p);
    return 1;
}

static int jvalue(jparser *p, jval *v);

static int jpush(jparser *p, jval *v, char *key, jval *item) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jval *kid = realloc(v->kid, cap * sizeof *kid);
        if (kid)
            v->kid = kid;
        char **keys = v->type == J_OBJ ? realloc(v->keys, cap * sizeof *keys) : NULL;
        if (keys)
            v->keys = keys;
        if (!kid || (v->type == J_OBJ && !keys)) {
            free(key);
            jfree_kids(item);
            return jfail(p, "out of memory");
        }
        v->cap = cap;
    }
    v->kid[v->n] = *item;
    if (v->type == J_OBJ)
        v->keys[v->n] = key;
    ++v->n;
    return 1;
}

static int jcontainer(jparser *p, jval *v, char close) {
    if (++p->depth > JSON_MAX_DEPTH)
        return jfail(p, "nested too deeply");
    jadvance(p); /* the opening bracket */
    jspace(p);
    if (p->s < p->end && *p->s == close) {
        jadvance(p);
        --p->depth;
        return 1;
    }
    for (;;) {
        char *key = NULL;
        jval item;
        memset(&item, 0, sizeof item);
        if (v->type == J_OBJ) {
            if (p->s >= p->end || *p->s != '"')
                return jfail(p, p->s >= p->end ? "unexpected end of file" : "expected a string key");
            if (!jstring(p, &key))
                return 0;
            for (size_t i = 0; i < v->n; ++i)
                if (!strcmp(v->keys[i], key)) {
                    free(key);
                    return jfail(p, "duplicate key");
                }
            jspace(p);
            if (p->s >= p->end || *p->s != ':') {
                free(key);
                return jfail(p, p->s >= p->end ? "unexpected end of file" : "expected ':'");
            }
            jadvance(p);
            jspace(p);
        }
        if (!jvalue(p, &item)) {
            free(key);
            jfree_kids(&item);
            return 0;
        }
        if (!jpush(p, v, key, &item))
            return 0;
        jspace(p);
        if (p->s >= p->end)
            return jfail(p, "unexpected end of file");
        if (*p->s == close) {
            jadvance(p);
            --p->depth;
            return 1;
        }
        if (*p->s != ',')
            return jfail(p, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
        jadvance(p);
        jspace(p);
    }
}

static int jvalue(jparser *p, jval *v) {
    memset(v, 0, sizeof *v);
    v->line = p->line;
    v->col = p->col;
    if (p->s >= p->end)
        return jfail(p, "unexpected end of file");
    switch (*p->s) {
    case '{': v->type = J_OBJ; return jcontainer(p, v, '}');
    case '[': v->type = J_ARR; return jcontainer(p, v, ']');
    case '"': v->type = J_STR; return jstring(p, &v->str);
    case 't': v->type = J_BOOL; v->num = 1; return jlit(p, "true");
    case 'f': v->type = J_BOOL; return jlit(p, "false");
    case 'n': v->type = J_NULL; return jlit(p, "null");
    default: v->type = J_NUM; return jnumber(p, &v->num);
    }
}

/* Parses a whole document; on failure *err says where and why. */
static int jparse(const char *text, size_t len, jval *root, char *err, size_t errsize) {
    jparser p = {text, text + len, 1, 1, 0, ""};
    int ok = (jspace(&p), jvalue(&p, root));
    if (ok) {
        jspace(&p);
        if (p.s != p.end)
            ok = jfail(&p, "text after the end of the document");
    }
    if (!ok) {
        jfree_kids(root);
        snprintf(err, errsize, "%s", p.err);
    }
    return ok;
}

static jval *jget(const jval *obj, const char *key) {
    for (size_t i = 0; obj->type == J_OBJ && i < obj->n; ++i)
        if (!strcmp(obj->keys[i], key))
            return &obj->kid[i];
    return NULL;
}

/* ---- entries from the DOM ------------------------------------------------------------- */

static const char *const known_variants[] = {"portable", "cpu", "nv-mma", "nv-tf32", "nv-wgmma"};
static const char *const dtype_names[] = {"f32", "f16", "bf16"};         /* flashcl_dtype's order   */
static const char *const phase_names[] = {"any", "prefill", "decode"};   /* FLASHCL_PHASE_* order   */
static const char *const kernel_names[] = {"tiled", "decode", "mma"};    /* FLASHCL_SERVING_* order */
#define NAMES(a) (a), (int)(sizeof(a) / sizeof((a)[0]))
_Static_assert(FLASHCL_FLOAT32 == 0 && FLASHCL_BFLOAT16 == 2 && FLASHCL_PHASE_DECODE == 2 &&
                   FLASHCL_SERVING_TILED == 0 && FLASHCL_SERVING_DECODE_MMA == 2,
               "the name tables follow the enums");

/* The index of s in names[0..count), or -1. */
static int name_index(const char *s, const char *const names[], int count) {
    for (int i = 0; i < count; ++i)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

/* An entry being read, for messages: "entry 3", "serving entry 0". */
typedef struct entry_at {
    const jval *e;
    const char *label;
    size_t index;
    char *err;
    size_t n;
} entry_at;

static int entry_fail(const entry_at *a, const jval *at, const char *what) {
    snprintf(a->err, a->n, "line %d, column %d: %s %zu: %s", at->line, at->col, a->label, a->index, what);
    return -1;
}

/* An integer field in [lo, hi]; absent gives `dflt` (or an error if dflt < 0). */
static int int_field(const entry_at *a, const char *key, int lo, int hi, int dflt, int *out) {
    const jval *v = jget(a->e, key);
    char what[96];
    if (!v) {
        if (dflt < 0) {
            snprintf(what, sizeof what, "missing \"%s\"", key);
            return entry_fail(a, a->e, what);
        }
        *out = dflt;
        return 0;
    }
    if (v->type != J_NUM || v->num != floor(v->num) || v->num < lo || v->num > hi) {
        snprintf(what, sizeof what, "\"%s\" must be an integer in %d..%d", key, lo, hi);
        return entry_fail(a, v, what);
    }
    *out = (int)v->num;
    return 0;
}

static int str_field(const entry_at *a, const char *key, int required, const char **out) {
    const jval *v = jget(a->e, key);
    char what[96];
    *out = NULL;
    if (!v && !required)
        return 0;
    if (!v || v->type != J_STR) {
        snprintf(what, sizeof what, "\"%s\" must be a string", key);
        return entry_fail(a, v ? v : a->e, what);
    }
    *out = v->str;
    return 0;
}

/* Heap copies of an entry's device, driver and comment (both may be NULL); 0, or -1 with *err. */
static int copy_strings(const entry_at *a, const char *device, const char *driver, const char *comment,
                        const char **match_out, const char **driver_out, const char **why_out) {
    char *m = flashcl_strdup(device), *d = driver ? flashcl_strdup(driver) : NULL;
    char *w = comment ? flashcl_strdup(comment) : NULL;
    if (!m || (driver && !d) || (comment && !w)) {
        free(m);
        free(d);
        free(w);
        snprintf(a->err, a->n, "out of memory");
        return -1;
    }
    *match_out = m;
    *driver_out = d;
    if (why_out)
        *why_out = w;
    return 0;
}

/* Reads entry `index`. Returns 1 (filled), 0 (skipped: unknown variant), -1 (error). */
static int read_entry(const jval *e, size_t index, flashcl_param_entry *out, char *err, size_t n) {
    const entry_at a = {e, "entry", index, err, n};
    const char *device, *driver, *variant, *dtype, *phase;
    memset(out, 0, sizeof *out);
    if (e->type != J_OBJ)
        return entry_fail(&a, e, "not an object");
    if (str_field(&a, "device", 1, &device) || str_field(&a, "driver", 0, &driver) ||
        str_field(&a, "variant", 1, &variant) || str_field(&a, "dtype", 1, &dtype) ||
        str_field(&a, "phase", 0, &phase))
        return -1;
    out->dtype = !strcmp(dtype, "any") ? -1 : name_index(dtype, NAMES(dtype_names));
    if (out->dtype < 0 && strcmp(dtype, "any"))
        return entry_fail(&a, jget(e, "dtype"), "\"dtype\" must be f32, f16, bf16 or any");
    out->phase = phase ? name_index(phase, NAMES(phase_names)) : FLASHCL_PHASE_ANY;
    if (out->phase < 0)
        return entry_fail(&a, jget(e, "phase"), "\"phase\" must be prefill, decode or any");
    const jval *causal = jget(e, "causal");
    if (!causal || causal->type == J_NULL)
        out->causal = -1;
    else if (causal->type == J_BOOL)
        out->causal = (int)causal->num;
    else
        return entry_fail(&a, causal, "\"causal\" must be true, false or null");
    if (int_field(&a, "head_dim_min", 1, 256, 1, &out->head_dim_min) ||
        int_field(&a, "head_dim_max", 1, 256, 256, &out->head_dim_max) ||
        int_field(&a, "block_m", 1, 4096, -1, &out->block_m) ||
        int_field(&a, "block_n", 1, 4096, -1, &out->block_n))
        return -1;
    if (out->head_dim_min > out->head_dim_max)
        return entry_fail(&a, e, "head_dim_min is above head_dim_max");
    int v = name_index(variant, NAMES(known_variants));
    if (v < 0)
        return 0; /* a newer library's variant: skip this entry only */
    out->variant = known_variants[v];
    if (!strcmp(out->variant, "portable") && int_field(&a, "threads_per_row", 1, 1024, -1, &out->threads_per_row))
        return -1;
    if (flashcl_variant_is_nv(out->variant) && int_field(&a, "warps", 1, 32, -1, &out->warps))
        return -1;
    return copy_strings(&a, device, driver, NULL, &out->match, &out->driver, NULL) ? -1 : 1;
}

/* Reads serving entry `index`; 0, or -1 with *err. Kernel names are not
 * skipped when unknown, unlike forward variants: the three kernels are the
 * whole set the serving path chooses from, so another name is a typo. */
static int read_serving(const jval *e, size_t index, flashcl_serving_entry *out, char *err, size_t n) {
    const entry_at a = {e, "serving entry", index, err, n};
    const char *device, *driver, *kernel, *comment;
    memset(out, 0, sizeof *out);
    if (e->type != J_OBJ)
        return entry_fail(&a, e, "not an object");
    if (str_field(&a, "device", 1, &device) || str_field(&a, "driver", 0, &driver) ||
        str_field(&a, "kernel", 1, &kernel) || str_field(&a, "comment", 0, &comment))
        return -1;
    if ((out->kernel = name_index(kernel, NAMES(kernel_names))) < 0)
        return entry_fail(&a, jget(e, "kernel"), "\"kernel\" must be tiled, decode or mma");
    /* Required where the kernel reads them (see params_serving.c); checked when present. */
    const int decode = out->kernel == FLASHCL_SERVING_DECODE, tiled = out->kernel == FLASHCL_SERVING_TILED;
    if (int_field(&a, "max_rows", 1, decode ? 8 : 16, decode ? 8 : 16, &out->max_rows) ||
        int_field(&a, "work_group_size", 1, 1024, decode ? -1 : 0, &out->work_group_size) ||
        int_field(&a, "unroll", 1, 16, decode ? -1 : 0, &out->unroll) ||
        int_field(&a, "stages", 2, 8, tiled ? 2 : -1, &out->stages) ||
        int_field(&a, "wgs_per_cu", 1, 1024, -1, &out->wgs_per_cu) ||
        int_field(&a, "min_split_keys", 1, 1 << 20, -1, &out->min_split_keys))
        return -1;
    return copy_strings(&a, device, driver, comment, &out->match, &out->driver, &out->why);
}

/* Reads backward entry `index`; 0, or -1 with *err. */
static int read_backward(const jval *e, size_t index, flashcl_backward_entry *out, char *err, size_t n) {
    const entry_at a = {e, "backward entry", index, err, n};
    const char *device, *driver, *comment, *variant;
    memset(out, 0, sizeof *out);
    if (e->type != J_OBJ)
        return entry_fail(&a, e, "not an object");
    if (str_field(&a, "device", 1, &device) || str_field(&a, "driver", 0, &driver) ||
        str_field(&a, "comment", 0, &comment) || str_field(&a, "variant", 0, &variant) ||
        int_field(&a, "head_dim_min", 1, 256, 1, &out->head_dim_min) ||
        int_field(&a, "head_dim_max", 1, 256, 256, &out->head_dim_max) ||
        int_field(&a, "block_m", 1, 1024, -1, &out->block_m) || int_field(&a, "block_n", 1, 1024, -1, &out->block_n) ||
        int_field(&a, "work_group_size", 1, 1024, -1, &out->work_group_size) ||
        int_field(&a, "max_registers", 0, 255, 0, &out->nv_max_registers) ||
        int_field(&a, "own_regs", 0, 1, 0, &out->nv_own_regs))
        return -1;
    if (out->head_dim_min > out->head_dim_max)
        return entry_fail(&a, e, "head_dim_min is above head_dim_max");
    if (out->nv_max_registers && out->nv_max_registers < 16)
        return entry_fail(&a, e, "\"max_registers\" is 0 (the compiler's choice) or 16..255");
    static const char *const variants[] = {"cpu", "nv-mma", "nv-wgmma"}; /* and "portable": NULL */
    out->variant = NULL; /* a literal when set: nothing to free */
    for (size_t i = 0; variant && i < sizeof variants / sizeof variants[0]; ++i)
        if (!strcmp(variant, variants[i]))
            out->variant = variants[i];
    if (variant && strcmp(variant, "portable") && !out->variant)
        return entry_fail(&a, e, "\"variant\" must be \"portable\", \"cpu\", \"nv-mma\" or \"nv-wgmma\"");
    if (out->nv_own_regs && !(out->variant && !strcmp(out->variant, "nv-wgmma")))
        return entry_fail(&a, e, "\"own_regs\" is for the nv-wgmma variant");
    return copy_strings(&a, device, driver, comment, &out->match, &out->driver, &out->why);
}

/* Frees what read_document filled (the strings of every entry, the arrays). */
static void free_entries(flashcl_tuning_data *tf) {
    for (size_t i = 0; i < tf->count; ++i) {
        free((char *)tf->entries[i].match);
        free((char *)tf->entries[i].driver);
    }
    for (size_t i = 0; i < tf->num_serving; ++i) {
        free((char *)tf->serving[i].match);
        free((char *)tf->serving[i].driver);
        free((char *)tf->serving[i].why);
    }
    for (size_t i = 0; i < tf->num_backward; ++i) {
        free((char *)tf->backward[i].match);
        free((char *)tf->backward[i].driver);
        free((char *)tf->backward[i].why);
    }
    free(tf->entries);
    free(tf->serving);
    free(tf->backward);
    tf->entries = NULL;
    tf->serving = NULL;
    tf->backward = NULL;
    tf->count = tf->num_serving = tf->num_backward = 0;
}

/* Checks the top level and reads every entry; 0 on success. */
static int read_document(const jval *root, flashcl_tuning_data *tf, char *err, size_t n) {
    const jval *version = jget(root, "flashcl_tuning"), *entries = jget(root, "entries");
    const jval *serving = jget(root, "serving"), *backward = jget(root, "backward");
    if (root->type != J_OBJ) {
        snprintf(err, n, "the top level is not an object");
        return -1;
    }
    if (!version || version->type != J_NUM || version->num != 1) {
        snprintf(err, n, "\"flashcl_tuning\" must be 1 (the format version this library reads)");
        return -1;
    }
    if (!entries || entries->type != J_ARR) {
        snprintf(err, n, "\"entries\" must be an array");
        return -1;
    }
    if ((serving && serving->type != J_ARR) || (backward && backward->type != J_ARR)) {
        const jval *at = serving && serving->type != J_ARR ? serving : backward;
        snprintf(err, n, "line %d, column %d: \"%s\" must be an array", at->line, at->col,
                 at == serving ? "serving" : "backward");
        return -1;
    }
    if (!tf)
        return 0;
    size_t num_serving = serving ? serving->n : 0, num_backward = backward ? backward->n : 0;
    tf->entries = entries->n ? calloc(entries->n, sizeof *tf->entries) : NULL;
    tf->serving = num_serving ? calloc(num_serving, sizeof *tf->serving) : NULL;
    tf->backward = num_backward ? calloc(num_backward, sizeof *tf->backward) : NULL;
    if ((entries->n && !tf->entries) || (num_serving && !tf->serving) || (num_backward && !tf->backward)) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < entries->n; ++i) {
        int r = read_entry(&entries->kid[i], i, &tf->entries[tf->count], err, n);
        if (r < 0)
            return -1;
        tf->count += (size_t)r;
    }
    for (; tf->num_serving < num_serving; ++tf->num_serving)
        if (read_serving(&serving->kid[tf->num_serving], tf->num_serving, &tf->serving[tf->num_serving], err, n))
            return -1;
    for (; tf->num_backward < num_backward; ++tf->num_backward)
        if (read_backward(&backward->kid[tf->num_backward], tf->num_backward, &tf->backward[tf->num_backward],
                          err, n))
            return -1;
    return 0;
}

/* Reads up to `limit` bytes of `path` into a heap buffer. 1 ok, 0 absent, -1 error. */
static int read_text(const char *path, size_t limit, char **text, size_t *len, char *err, size_t n) {
    /* Regular files only: a FIFO named by FLASHCL_TUNING_FILE blocked fopen forever. */
    FILE *f = flashcl_open_regular(path, NULL);
    *text = NULL;
    if (!f) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, n, "cannot open: %s", errno == EINVAL ? "not a regular file" : strerror(errno));
        return -1;
    }
    char *buf = malloc(limit + 1);
    size_t got = buf ? fread(buf, 1, limit + 1, f) : 0;
    int bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        snprintf(err, n, buf ? "read error" : "out of memory");
        return -1;
    }
    if (got > limit) {
        free(buf);
        snprintf(err, n, "larger than the %zu-byte limit", limit);
        return -1;
    }
    *text = buf;
    *len = got;
    return 1;
}

void flashcl_tuning_free(flashcl_tuning_data *tf) {
    free_entries(tf);
    free(tf->path);
    free(tf->problem);
    memset(tf, 0, sizeof *tf);
}

int flashcl_tuning_parse(const char *text, size_t len, flashcl_tuning_data *tf, char *err, size_t n) {
    jval root;
    if (len > FLASHCL_TUNING_MAX_BYTES) {
        snprintf(err, n, "larger than the %d-byte limit", FLASHCL_TUNING_MAX_BYTES);
        return -1;
    }
    if (!jparse(text, len, &root, err, n))
        return -1;
    int r = read_document(&root, tf, err, n);
    jfree_kids(&root);
    if (r != 0 && tf) /* whole or nothing */
        free_entries(tf);
    return r;
}

void flashcl_tuning_load(const char *path, flashcl_tuning_data *tf) {
    char err[256] = "";
    char *text;
    size_t len = 0;
    memset(tf, 0, sizeof *tf);
    tf->path = flashcl_strdup(path);
    int r = read_text(path, FLASHCL_TUNING_MAX_BYTES, &text, &len, err, sizeof err);
    if (r > 0)
        r = flashcl_tuning_parse(text, len, tf, err, sizeof err) == 0 ? 1 : -1;
    free(text);
    if (r < 0) {
        size_t need = strlen(path) + strlen(err) + 64;
        tf->problem = malloc(need);
        if (tf->problem)
            snprintf(tf->problem, need, "%s: %s; the whole file is ignored", path, err);
        flashcl_log("tuning file %s", tf->problem ? tf->problem : path);
    } else if (r > 0) {
        flashcl_log("tuning file %s: entries: %zu forward, %zu serving, %zu backward", path, tf->count,
                    tf->num_serving, tf->num_backward);
    }
}

/* ---- writing ------------------------------------------------------------------------- */

static void jwrite_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; ++c) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c == '\n')
            fputs("\\n", f);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

static void jwrite(FILE *f, const jval *v, int indent) {
    switch (v->type) {
    case J_NULL: fputs("null", f); break;
    case J_BOOL: fputs(v->num ? "true" : "false", f); break;
    case J_NUM:
        if (v->num == floor(v->num) && fabs(v->num) < 1e15)
            fprintf(f, "%.0f", v->num);
        else
            fprintf(f, "%.17g", v->num);
        break;
    case J_STR: jwrite_string(f, v->str); break;
    case J_ARR:
    case J_OBJ: {
        /* Entries (objects inside the array) go on one line each: easy to diff. */
        int flat = indent < 0;
        fputc(v->type == J_ARR ? '[' : '{', f);
        for (size_t i = 0; i < v->n; ++i) {
            if (flat)
                fputs(i ? ", " : "", f);
            else
                fprintf(f, "%s\n%*s", i ? "," : "", indent + 2, "");
            if (v->type == J_OBJ) {
                jwrite_string(f, v->keys[i]);
                fputs(": ", f);
            }
            jwrite(f, &v->kid[i], flat || v->type == J_ARR ? -1 : indent + 2);
        }
        if (!flat && v->n)
            fprintf(f, "\n%*s", indent, "");
        fputc(v->type == J_ARR ? ']' : '}', f);
        break;
    }
    }
}

static int add_num(jval *obj, const char *key, double num) {
    jval v = {.type = J_NUM, .num = num};
    jparser p = {0};
    char *k = flashcl_strdup(key);
    return k && jpush(&p, obj, k, &v);
}

static int add_str(jval *obj, const char *key, const char *s) {
    jval v = {.type = J_STR, .str = flashcl_strdup(s)};
    jparser p = {0};
    char *k = flashcl_strdup(key);
    if (!v.str || !k) {
        free(v.str);
        free(k);
        return 0;
    }
    return jpush(&p, obj, k, &v);
}

/* 1 when an existing entry object has the same key as e (so e replaces it). */
static int same_key(const jval *obj, const flashcl_param_entry *e) {
    flashcl_param_entry old;
    char err[256]; /* unused here, but sized like every other caller's */
    int r = read_entry(obj, 0, &old, err, sizeof err);
    if (r < 0)
        return 0;
    const jval *device = jget(obj, "device");
    const jval *driver = jget(obj, "driver");
    int same = device && device->type == J_STR && !strcmp(device->str, e->match) &&
               (driver && driver->type == J_STR ? e->driver && !strcmp(driver->str, e->driver)
                                                : !e->driver) &&
               old.dtype == e->dtype && old.head_dim_min == e->head_dim_min &&
               old.head_dim_max == e->head_dim_max && old.phase == e->phase && old.causal == e->causal;
    if (r > 0) {
        free((char *)old.match);
        free((char *)old.driver);
    }
    return same;
}

static int mkdirs_for(const char *path) {
    char *dir = flashcl_strdup(path);
    if (!dir)
        return -1;
    for (char *s = dir + 1; *s; ++s) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            free(dir);
            return -1;
        }
        *s = '/';
    }
    free(dir);
    return 0;
}

int flashcl_tuning_store(const char *path, const flashcl_param_entry *e, const char *comment,
                         char *err, size_t n) {
    jval root, entry;
    char *text = NULL;
    size_t len = 0;
    memset(&root, 0, sizeof root);
    memset(&entry, 0, sizeof entry);
    int r = read_text(path, FLASHCL_TUNING_MAX_BYTES, &text, &len, err, n);
    if (r < 0)
        return -1;
    if (r > 0) {
        char why[200];
        int ok = jparse(text, len, &root, why, sizeof why) && read_document(&root, NULL, why, sizeof why) == 0;
        free(text);
        if (ok) { /* every entry must read, as the library will read it */
            flashcl_tuning_data check;
            memset(&check, 0, sizeof check);
            ok = read_document(&root, &check, why, sizeof why) == 0;
            flashcl_tuning_free(&check);
        }
        if (!ok) {
            jfree_kids(&root);
            snprintf(err, n, "%s is not a valid tuning file (%s): fix or remove it first", path, why);
            return -1;
        }
    } else {
        jparser p = {0};
        jval entries = {.type = J_ARR};
        root.type = J_OBJ;
        char *k = flashcl_strdup("entries");
        if (!add_num(&root, "flashcl_tuning", 1) || !k || !jpush(&p, &root, k, &entries)) {
            jfree_kids(&root);
            snprintf(err, n, "out of memory");
            return -1;
        }
    }
    jval *entries = jget(&root, "entries");
    for (size_t i = 0; i < entries->n;) {
        if (same_key(&entries->kid[i], e)) {
            jfree_kids(&entries->kid[i]);
            memmove(&entries->kid[i], &entries->kid[i + 1], (entries->n - i - 1) * sizeof *entries->kid);
            --entries->n;
        } else {
            ++i;
        }
    }
    entry.type = J_OBJ;
    int ok = add_str(&entry, "device", e->match) && (!e->driver || add_str(&entry, "driver", e->driver)) &&
             add_str(&entry, "variant", e->variant) &&
             add_str(&entry, "dtype", e->dtype >= 0 && e->dtype <= 2 ? dtype_names[e->dtype] : "any") &&
             add_num(&entry, "head_dim_min", e->head_dim_min) &&
             add_num(&entry, "head_dim_max", e->head_dim_max) &&
             add_str(&entry, "phase", phase_names[e->phase]);
    if (ok && e->causal >= 0) {
        jval b = {.type = J_BOOL, .num = e->causal};
        jparser p = {0};
        char *k = flashcl_strdup("causal");
        ok = k && jpush(&p, &entry, k, &b);
    }
    ok = ok && add_num(&entry, "block_m", e->block_m) && add_num(&entry, "block_n", e->block_n);
    if (ok && e->threads_per_row)
        ok = add_num(&entry, "threads_per_row", e->threads_per_row);
    if (ok && e->warps)
        ok = add_num(&entry, "warps", e->warps);
    if (ok && comment)
        ok = add_str(&entry, "comment", comment);
    jparser p = {0};
    if (!ok || !jpush(&p, entries, NULL, &entry)) {
        if (!ok)
            jfree_kids(&entry);
        jfree_kids(&root);
        snprintf(err, n, "out of memory");
        return -1;
    }

    /* Write beside the target, then rename: readers see the old file or the new one. */
    size_t tlen = strlen(path) + 32;
    char *tmp = malloc(tlen);
    FILE *f = NULL;
    if (tmp) {
        snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
        mkdirs_for(path);
        f = fopen(tmp, "w");
    }
    if (!f) {
        snprintf(err, n, "cannot write %s: %s", tmp ? tmp : path, tmp ? strerror(errno) : "out of memory");
        free(tmp);
        jfree_kids(&root);
        return -1;
    }
    jwrite(f, &root, 0);
    fputc('\n', f);
    int bad = ferror(f) != 0;
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    /* The loader ignores a file over the limit whole (and a later store
     * could not read it back): refuse here instead, the old file intact. */
    long written = ftell(f);
    bad |= fclose(f) != 0;
    jfree_kids(&root);
    if (!bad && written > FLASHCL_TUNING_MAX_BYTES) {
        snprintf(err, n,
                 "not stored: %s would grow to %ld bytes, over the %d-byte limit that tuning files are read "
                 "with (FLASHCL_TUNING_MAX_BYTES); the file is left as it was",
                 path, written, FLASHCL_TUNING_MAX_BYTES);
        unlink(tmp);
        free(tmp);
        return -1;
    }
    if (bad || rename(tmp, path) != 0) {
        snprintf(err, n, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}
