/* program.c: building kernels once, with an in-memory and an on-disk program cache.
 *
 * A kernel is cl/common.cl, cl/common_nv.cl, cl/common_nv_bwd.cl and
 * cl/common_serving.cl followed by one cl/ file, built with -D options.
 * Lookup order: the context's list (same file + options) -> the disk cache
 * -> a build from source, whose binary is then written to the disk cache.
 *
 * Disk cache: one file per program in $FLASHCL_CACHE_DIR, else
 * $XDG_CACHE_HOME/flashcl, else ~/.cache/flashcl; FLASHCL_CACHE=0 turns it
 * off. The file name is a 64-bit FNV-1a hash of everything that changes the
 * binary: a format version, the source text, the options, the device name,
 * device version, driver version, platform name and platform version. The
 * file holds a header (magic, key, binary size, hash, key text length), the
 * key text (those parts, the source as its own hash and length) and the
 * binary; the hash covers key text and binary. A file is used only when its
 * key text equals this program's, its sizes add up to the file's and the
 * hash matches: a file copied under another key's name, or truncated with
 * its header rewritten, is never handed to the driver (PoCL aborted on the
 * one and crashed on the other). Written to a temporary file and renamed,
 * so readers never see a partial file. Only regular files are opened (a
 * FIFO would block). Any cache failure (unreadable, corrupt, rejected by
 * the driver) silently falls back to building from source.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "kernels.h"

#define CACHE_FORMAT "flashcl-cache-v3" /* v3: key text stored and hashed with the binary */
#define CACHE_MAGIC "FLCLBIN3"

/* ---- kernel sources --------------------------------------------------------------- */

/* The text of cl/<file>: embedded, or read from $FLASHCL_KERNEL_DIR while
 * developing kernels. Caller frees. */
static char *load_source(flashcl_context *ctx, const char *file) {
    const char *dir = getenv("FLASHCL_KERNEL_DIR");
    if (dir && dir[0]) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        FILE *f = fopen(path, "rb");
        if (!f) {
            flashcl_fail(ctx, FLASHCL_ERROR_BUILD_FAILED, "FLASHCL_KERNEL_DIR: cannot open %s", path);
            return NULL;
        }
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *text = size >= 0 ? malloc((size_t)size + 1) : NULL;
        if (text && fread(text, 1, (size_t)size, f) == (size_t)size) {
            text[size] = '\0';
        } else {
            free(text);
            text = NULL;
            flashcl_fail(ctx, FLASHCL_ERROR_BUILD_FAILED, "FLASHCL_KERNEL_DIR: cannot read %s", path);
        }
        fclose(f);
        return text;
    }
    for (const flashcl_embedded_source *s = flashcl_embedded_sources; s->name; ++s)
        if (!strcmp(s->name, file))
            return flashcl_strdup(s->text);
    flashcl_fail(ctx, FLASHCL_ERROR_BUILD_FAILED, "no embedded kernel source %s", file);
    return NULL;
}

/* The files every kernel is built on, in this order (cl/common.cl says what
 * each holds): a kernel's source is these, then its own file. */
static const char *const kernel_preludes[] = {"common.cl", "common_nv.cl", "common_nv_bwd.cl", "common_serving.cl"};
#define PRELUDES (sizeof kernel_preludes / sizeof kernel_preludes[0])

/* The preludes + file, as one string, each part ending in a newline. */
static char *assemble_source(flashcl_context *ctx, const char *file) {
    char *part[PRELUDES + 1] = {NULL};
    size_t len[PRELUDES + 1], total = 1;
    int ok = 1;
    for (size_t i = 0; ok && i <= PRELUDES; ++i) {
        part[i] = load_source(ctx, i < PRELUDES ? kernel_preludes[i] : file);
        ok = part[i] != NULL;
        if (ok)
            total += (len[i] = strlen(part[i])) + 1;
    }
    char *all = ok ? malloc(total) : NULL;
    if (all) {
        char *at = all;
        for (size_t i = 0; i <= PRELUDES; ++i) {
            memcpy(at, part[i], len[i]);
            at += len[i];
            *at++ = '\n';
        }
        *at = '\0';
    }
    for (size_t i = 0; i <= PRELUDES; ++i)
        free(part[i]);
    return all;
}

/* ---- the disk cache -------------------------------------------------------------- */

static int cache_dir(char *out, size_t cap) {
    const char *off = getenv("FLASHCL_CACHE");
    if (off && !strcmp(off, "0"))
        return 0;
    const char *dir = getenv("FLASHCL_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (dir && dir[0])
        n = snprintf(out, cap, "%s", dir);
    else if (xdg && xdg[0])
        n = snprintf(out, cap, "%s/flashcl", xdg);
    else if (home && home[0])
        n = snprintf(out, cap, "%s/.cache/flashcl", home);
    else
        return 0;
    return n > 0 && (size_t)n < cap;
}

/* mkdir -p; failures surface later as a failed write, which is ignored. */
static void make_dirs(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; ++p) {
        if (*p == '/') {
            *p = '\0';
            mkdir(tmp, 0755);
            *p = '/';
        }
    }
    mkdir(tmp, 0755);
}

/* The key text: everything that changes the binary, NUL-separated, the
 * source as its hash and length (it is long; its hash is in the name too).
 * Caller frees; NULL when out of memory. */
static char *cache_key_text(const flashcl_context *ctx, const char *source, const char *options, size_t *len) {
    const flashcl_device_info *d = &ctx->info;
    char src[64];
    snprintf(src, sizeof src, "source %016llx %zu",
             (unsigned long long)flashcl_fnv1a(0xcbf29ce484222325ull, source, strlen(source)), strlen(source));
    const char *parts[] = {CACHE_FORMAT, src,       options,           d->name,
                           d->version,   d->driver, d->platform_name, d->platform_version};
    size_t n = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; ++i)
        n += strlen(parts[i]) + 1; /* the NUL separates parts */
    char *text = malloc(n);
    if (!text)
        return NULL;
    *len = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; ++i) {
        memcpy(text + *len, parts[i], strlen(parts[i]) + 1);
        *len += strlen(parts[i]) + 1;
    }
    return text;
}

/* The file name (hash of the key text) under the cache directory. */
static int cache_path(const char *key_text, size_t key_len, char *path, size_t cap, uint64_t *key) {
    char dir[3072];
    if (!cache_dir(dir, sizeof dir))
        return 0;
    *key = flashcl_fnv1a(0xcbf29ce484222325ull, key_text, key_len);
    int n = snprintf(path, cap, "%s/%016llx.bin", dir, (unsigned long long)*key);
    return n > 0 && (size_t)n < cap;
}

typedef struct cache_header {
    char magic[8];
    uint64_t key, size, hash; /* size: of the binary; hash: key text then binary */
    uint64_t key_len;         /* bytes of key text after the header */
} cache_header;

/* Opens path for reading only if it is a regular file: O_NONBLOCK so that a
 * FIFO (or a device) planted there cannot block the open, then fstat. */
FILE *flashcl_open_regular(const char *path, off_t *size) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EINVAL;
        return NULL;
    }
    /* Regular files never block; clear O_NONBLOCK for plain stdio reads. */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return NULL;
    }
    if (size)
        *size = st.st_size;
    return f;
}

/* Returns a malloc'd binary or NULL on any problem (nothing is trusted that
 * the key text, the sizes and the hash do not all confirm). */
static unsigned char *cache_read(const char *path, uint64_t key, const char *key_text, size_t key_len,
                                 size_t *size) {
    off_t file_size = 0;
    FILE *f = flashcl_open_regular(path, &file_size);
    if (!f)
        return NULL;
    cache_header h;
    unsigned char *bin = NULL;
    char *text = NULL;
    if (fread(&h, sizeof h, 1, f) == 1 && !memcmp(h.magic, CACHE_MAGIC, 8) && h.key == key &&
        h.key_len == key_len && h.size > 0 && h.size < ((uint64_t)1 << 31) &&
        (uint64_t)file_size == sizeof h + h.key_len + h.size) {
        text = malloc(key_len);
        bin = malloc((size_t)h.size);
        if (!text || !bin || fread(text, 1, key_len, f) != key_len || memcmp(text, key_text, key_len) != 0 ||
            fread(bin, 1, (size_t)h.size, f) != h.size ||
            flashcl_fnv1a(flashcl_fnv1a(0xcbf29ce484222325ull, text, key_len), bin, (size_t)h.size) != h.hash) {
            free(bin);
            bin = NULL;
        }
        *size = (size_t)h.size;
    }
    free(text);
    fclose(f);
    return bin;
}

static void cache_write(const char *path, uint64_t key, const char *key_text, size_t key_len,
                        const unsigned char *bin, size_t size) {
    char dir[4096], tmp[4200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    make_dirs(dir);
    /* The pid and address make concurrent writers' temporary names differ. */
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%p", path, (long)getpid(), (const void *)bin);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return;
    cache_header h;
    memcpy(h.magic, CACHE_MAGIC, 8);
    h.key = key;
    h.size = size;
    h.hash = flashcl_fnv1a(flashcl_fnv1a(0xcbf29ce484222325ull, key_text, key_len), bin, size);
    h.key_len = key_len;
    int ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(key_text, 1, key_len, f) == key_len &&
             fwrite(bin, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0)
        remove(tmp);
}

/* The device binary of a built program; NULL when the driver gives none. */
static unsigned char *program_binary(cl_program program, size_t *size) {
    size_t sz = 0;
    if (clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof sz, &sz, NULL) != CL_SUCCESS || !sz)
        return NULL;
    unsigned char *bin = malloc(sz);
    if (!bin)
        return NULL;
    if (clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) != CL_SUCCESS) {
        free(bin);
        return NULL;
    }
    *size = sz;
    return bin;
}

/* ---- building ------------------------------------------------------------------ */

static char *build_log(cl_program program, cl_device_id device) {
    size_t size = 0;
    clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size);
    char *log = malloc(size + 1);
    if (!log)
        return NULL;
    log[0] = '\0';
    if (size)
        clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, size, log, NULL);
    log[size] = '\0';
    return log;
}

static cl_program build_from_binary(flashcl_context *ctx, const unsigned char *bin, size_t size,
                                    const char *options) {
    cl_int err, status;
    cl_program p = clCreateProgramWithBinary(ctx->cl_ctx, 1, &ctx->device, &size, &bin, &status, &err);
    if (!p)
        return NULL;
    if (err != CL_SUCCESS || status != CL_SUCCESS ||
        clBuildProgram(p, 1, &ctx->device, options, NULL, NULL) != CL_SUCCESS) {
        clReleaseProgram(p);
        return NULL;
    }
    return p;
}

/* ---- register caps on NVIDIA ------------------------------------------------------ */

/* Offset of needle in bin[from, size), or size. */
static size_t find_bytes(const unsigned char *bin, size_t size, size_t from, const char *needle) {
    const size_t n = strlen(needle);
    for (size_t i = from; i + n <= size; ++i)
        if (!memcmp(bin + i, needle, n))
            return i;
    return size;
}

/* Start of the next kernel entry declaration at or after `from` (".entry",
 * ".visible .entry" or ".weak .entry" first on its line, after any blanks;
 * a comment never is one), or size. */
static size_t next_entry(const unsigned char *ptx, size_t size, size_t from) {
    static const char *const heads[] = {".entry ", ".visible .entry ", ".weak .entry "};
    for (size_t i = from; i < size; ++i) {
        size_t blanks = i; /* walk back over blanks to the line's start */
        while (blanks > 0 && (ptx[blanks - 1] == ' ' || ptx[blanks - 1] == '\t'))
            --blanks;
        if (blanks > 0 && ptx[blanks - 1] != '\n')
            continue;
        for (size_t h = 0; h < sizeof heads / sizeof heads[0]; ++h) {
            const size_t n = strlen(heads[h]);
            if (i + n <= size && !memcmp(ptx + i, heads[h], n))
                return i;
        }
    }
    return size;
}

unsigned char *flashcl_ptx_cap_registers(const unsigned char *ptx, size_t size, int cap, size_t *out_size,
                                         size_t *entries) {
    /* "[.visible ].entry name(params)\n[directives]\n{": the directive goes before the brace. */
    char directive[32];
    const size_t dlen = (size_t)snprintf(directive, sizeof directive, ".maxnreg %d\n", cap);
    size_t count = 0;
    for (size_t at = 0; (at = next_entry(ptx, size, at)) < size; ++at)
        ++count;
    unsigned char *out = count ? malloc(size + count * dlen) : NULL;
    size_t n = 0, from = 0, patched = 0;
    for (size_t at = 0; out && (at = next_entry(ptx, size, at)) < size; ++at) {
        const size_t brace = find_bytes(ptx, size, at, "\n{");
        if (brace == size)
            break;
        memcpy(out + n, ptx + from, brace + 1 - from);
        n += brace + 1 - from;
        memcpy(out + n, directive, dlen);
        n += dlen;
        from = brace + 1;
        at = brace;
        ++patched;
    }
    *entries = patched;
    if (!out || patched < count) { /* an entry without a body: not PTX as expected */
        free(out);
        return NULL;
    }
    memcpy(out + n, ptx + from, size - from);
    *out_size = n + size - from;
    return out;
}

int flashcl_nv_register_cap(const char *options) {
    const char *value = flashcl_option_define(options, "FLASHCL_NV_MAXNREG");
    return value ? atoi(value) : 0;
}

/* NVIDIA's OpenCL ignores -cl-nv-maxrregcount, and its program binary is
 * PTX text that it also accepts back. A program built with
 * -DFLASHCL_NV_MAXNREG=N is therefore rebuilt from its PTX with ".maxnreg N"
 * on every kernel entry, a directive ptxas honours: fewer registers per
 * thread, more work-groups per SM. Returns the rebuilt program, or p when no
 * cap is asked for, the binary is not PTX (another vendor: the option means
 * nothing there), or the PTX could not be capped (*missed = 1: p must not be
 * cached as the capped program). Each outcome is logged. */
static cl_program nv_cap_registers(flashcl_context *ctx, cl_program p, const char *file, const char *options,
                                   int *missed) {
    const int cap = flashcl_nv_register_cap(options);
    *missed = 0;
    if (!cap)
        return p;
    size_t size = 0, capped_size = 0, entries = 0;
    unsigned char *bin = cap >= 16 && cap <= 255 ? program_binary(p, &size) : NULL;
    const int ptx = bin && find_bytes(bin, size, 0, ".version") < size;
    unsigned char *capped = ptx ? flashcl_ptx_cap_registers(bin, size, cap, &capped_size, &entries) : NULL;
    cl_program rebuilt = capped ? build_from_binary(ctx, capped, capped_size, options) : NULL;
    flashcl_log("%s: FLASHCL_NV_MAXNREG=%d %s", file, cap,
                rebuilt ? "applied (rebuilt from the capped PTX)"
                : !bin  ? "ignored (no binary, or a cap outside 16..255)"
                : !ptx  ? "ignored (the binary is not PTX)"
                : !capped ? "not applied: no kernel entry found in the PTX, the uncapped program stays"
                          : "not applied: the rebuild failed, the uncapped program stays");
    free(capped);
    free(bin);
    *missed = ptx && !rebuilt;
    if (!rebuilt)
        return p;
    clReleaseProgram(p);
    return rebuilt;
}

/* ---- sm_90a kernels on NVIDIA ----------------------------------------------------------- */

/* The marker that hides an sm_90a instruction from the sm_90 build, as
 * cl/common_nv.cl writes it (SM90A there). */
#define SM90A_MARKER "//@sm90a "

unsigned char *flashcl_ptx_enable_sm90a(const unsigned char *ptx, size_t size, size_t *out_size,
                                        size_t *markers) {
    static const char target[] = ".target sm_90";
    const size_t mlen = strlen(SM90A_MARKER), tlen = strlen(target);
    *markers = 0;
    size_t at = find_bytes(ptx, size, 0, target);
    /* Exactly sm_90 (not sm_90a, not sm_100): sm_90a code runs on compute capability 9.0 only. */
    const unsigned char next = at + tlen < size ? ptx[at + tlen] : '\n';
    if (at == size || next == 'a' || (next >= '0' && next <= '9'))
        return NULL;
    unsigned char *out = malloc(size + 1);
    if (!out)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < size;) {
        if (i == at + tlen)
            out[n++] = 'a';
        if (i + mlen <= size && !memcmp(ptx + i, SM90A_MARKER, mlen)) {
            i += mlen;
            ++*markers;
            continue;
        }
        out[n++] = ptx[i++];
    }
    if (!*markers) {
        free(out);
        return NULL;
    }
    *out_size = n;
    return out;
}

/* A program built with -DFLASHCL_SM90A holds sm_90a instructions behind
 * SM90A_MARKER: its PTX is unmasked, retargeted and built again. Returns
 * the rebuilt program (p is released), or NULL with *why set when this
 * device cannot have it (p is released too: the masked program computes
 * nothing and must never run). Other programs pass through. */
static cl_program nv_enable_sm90a(flashcl_context *ctx, cl_program p, const char *options, const char **why) {
    if (!strstr(options, "-DFLASHCL_SM90A"))
        return p;
    size_t size = 0, patched_size = 0, markers = 0;
    unsigned char *bin = program_binary(p, &size);
    unsigned char *patched = bin ? flashcl_ptx_enable_sm90a(bin, size, &patched_size, &markers) : NULL;
    cl_program rebuilt = patched ? build_from_binary(ctx, patched, patched_size, options) : NULL;
    *why = !bin       ? "the driver gave no program binary"
           : !patched ? "the program binary is not sm_90 PTX with sm_90a sections"
           : !rebuilt ? "the driver did not build the sm_90a PTX"
                      : NULL;
    free(patched);
    free(bin);
    clReleaseProgram(p);
    return rebuilt;
}

/* Builds (file, options) into entry; on failure entry->build_log says why. */
static flashcl_status build_entry(flashcl_context *ctx, flashcl_program *entry) {
    char *source = assemble_source(ctx, entry->file);
    if (!source)
        return FLASHCL_ERROR_BUILD_FAILED;

    char path[4096];
    uint64_t key = 0;
    size_t key_len = 0;
    char *key_text = cache_key_text(ctx, source, entry->options, &key_len);
    int cached = key_text && cache_path(key_text, key_len, path, sizeof path, &key);
    if (cached) {
        size_t size = 0;
        unsigned char *bin = cache_read(path, key, key_text, key_len, &size);
        if (bin) {
            entry->program = build_from_binary(ctx, bin, size, entry->options);
            free(bin);
        }
        flashcl_log("disk cache %s: %s [%s]", entry->program ? "hit" : "miss", entry->file,
                    entry->options);
        if (entry->program) {
            free(source);
            free(key_text);
            return FLASHCL_SUCCESS;
        }
    }

    cl_int err;
    const char *src = source;
    cl_program p = clCreateProgramWithSource(ctx->cl_ctx, 1, &src, NULL, &err);
    free(source);
    if (!p) {
        free(key_text);
        return err;
    }
    err = clBuildProgram(p, 1, &ctx->device, entry->options, NULL, NULL);
    if (err != CL_SUCCESS) {
        entry->build_log = build_log(p, ctx->device);
        clReleaseProgram(p);
        free(key_text);
        return FLASHCL_ERROR_BUILD_FAILED;
    }
    const char *why = NULL;
    if (!(p = nv_enable_sm90a(ctx, p, entry->options, &why))) {
        entry->build_log = flashcl_strdup(why);
        free(key_text);
        return FLASHCL_ERROR_BUILD_FAILED;
    }
    int cap_missed;
    p = nv_cap_registers(ctx, p, entry->file, entry->options, &cap_missed);
    entry->program = p;
    if (getenv("FLASHCL_LOG")) {
        /* Compiler reports (e.g. -cl-nv-verbose register counts). */
        char *log = build_log(p, ctx->device);
        if (log && log[0])
            flashcl_log("build log of %s [%s]:\n%s", entry->file, entry->options, log);
        free(log);
    }
    if (cached && !cap_missed) { /* an uncapped binary must not answer for capped options */
        size_t size = 0;
        unsigned char *bin = program_binary(p, &size);
        if (bin)
            cache_write(path, key, key_text, key_len, bin, size);
        free(bin);
    }
    free(key_text);
    return FLASHCL_SUCCESS;
}

/* The kernel `name` of a built program, created once and kept with it. */
static flashcl_status program_kernel(flashcl_context *ctx, flashcl_program *e, const char *name,
                                     cl_kernel *kernel) {
    for (flashcl_kernel_entry *k = e->kernels; k; k = k->next)
        if (!strcmp(k->name, name)) {
            *kernel = k->kernel;
            return FLASHCL_SUCCESS;
        }
    flashcl_kernel_entry *k = calloc(1, sizeof *k);
    char *copy = flashcl_strdup(name);
    if (!k || !copy) {
        free(k);
        free(copy);
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    cl_int err;
    k->kernel = clCreateKernel(e->program, name, &err);
    if (!k->kernel) {
        free(k);
        free(copy);
        return flashcl_fail(ctx, err, "clCreateKernel(%s) in %s: %s", name, e->file,
                            flashcl_status_string(err));
    }
    k->name = copy;
    k->next = e->kernels;
    e->kernels = k;
    *kernel = k->kernel;
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_get_kernel(flashcl_context *ctx, const char *file, const char *kernel_name,
                                  const char *options, cl_kernel *kernel) {
    flashcl_program *e;
    for (e = ctx->programs; e; e = e->next)
        if (!strcmp(e->file, file) && !strcmp(e->options, options))
            break;
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e)
            return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
        e->file = flashcl_strdup(file);
        e->options = flashcl_strdup(options);
        if (!e->file || !e->options) {
            free(e->file);
            free(e->options);
            free(e);
            return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
        }
        e->next = ctx->programs;
        ctx->programs = e;
        flashcl_status st = build_entry(ctx, e);
        if (st != FLASHCL_SUCCESS && !e->build_log) {
            /* Not a compiler failure (no source, no memory): do not remember it. */
            ctx->programs = e->next;
            free(e->file);
            free(e->options);
            free(e);
            return st == FLASHCL_ERROR_BUILD_FAILED
                       ? st
                       : flashcl_fail(ctx, st, "building %s: %s", file, flashcl_status_string(st));
        }
    }
    if (!e->program) {
        /* A remembered failure: report it again without rebuilding. */
        flashcl_fail(ctx, FLASHCL_ERROR_BUILD_FAILED, "building %s with '%s' failed:\n", e->file,
                     e->options);
        flashcl_append_error(ctx, e->build_log ? e->build_log : "(no build log)");
        return FLASHCL_ERROR_BUILD_FAILED;
    }
    return program_kernel(ctx, e, kernel_name, kernel);
}

void flashcl_release_programs(flashcl_context *ctx) {
    flashcl_program *e = ctx->programs;
    while (e) {
        flashcl_program *next = e->next;
        for (flashcl_kernel_entry *k = e->kernels, *kn; k; k = kn) {
            kn = k->next;
            clReleaseKernel(k->kernel);
            free(k->name);
            free(k);
        }
        if (e->program)
            clReleaseProgram(e->program);
        free(e->file);
        free(e->options);
        free(e->build_log);
        free(e);
        e = next;
    }
    ctx->programs = NULL;
}

int flashcl_kernel_fits(const flashcl_context *ctx, cl_kernel kernel, size_t wg, char *why, size_t why_size) {
    size_t kernel_wg = 0;
    cl_ulong local = 0;
    clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kernel_wg, &kernel_wg, NULL);
    clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_LOCAL_MEM_SIZE, sizeof local, &local, NULL);
    if (!kernel_wg || kernel_wg > ctx->info.max_wg)
        kernel_wg = ctx->info.max_wg;
    why[0] = '\0';
    if (wg > kernel_wg)
        snprintf(why, why_size, "a work-group of %zu exceeds the built kernel's limit of %zu", wg, kernel_wg);
    else if (local > ctx->info.device_local_mem)
        snprintf(why, why_size, "the built kernel needs %llu bytes of local memory, the device has %llu",
                 (unsigned long long)local, (unsigned long long)ctx->info.device_local_mem);
    return why[0] == '\0';
}
