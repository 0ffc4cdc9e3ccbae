/* ptx_cuda.c: the CUDA-driver side of bench/ptx_harness.c (ptx_cuda.h).
 *
 * The translation of OpenCL's PTX, two rules (the PTX is otherwise untouched, so the SASS is
 * ptxas's from the same text the OpenCL driver compiled):
 *   - OpenCL's parameter qualifiers (".ptr .global .align N") are dropped: the CUDA loader rejects
 *     them, and the pointers are used the same way without them;
 *   - OpenCL reads its launch environment from %envreg registers the CUDA driver never sets:
 *     %envreg0..2 and %envreg3..5 (the group and global offsets) are 0 for these launches, %envreg6..8
 *     are the group counts, %nctaid.x/y/z, and %envreg9 is the work dimension, 3. Any other one is
 *     refused. Where flashcl rebuilds sm_90a PTX (-DFLASHCL_SM90A, src/program.c), the cache holds
 *     the rebuilt text; a text still at sm_90 with "//@sm90a " markers is unmasked here the same way.
 * The launches use device 0's primary context, which flashcl's TMA encoder (src/nv_tma.c) also
 * retains, and the JIT's defaults (ptxas -O3 equivalent).
 */
#define _POSIX_C_SOURCE 200809L
#include "ptx_cuda.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---- the CUDA driver, by value (no cuda.h at build time, as src/nv_tma.c) ---------------------- */

cuda_api cu;

void die(const char *fmt, const char *what) {
    fflush(stdout); /* what was printed before comes first */
    fprintf(stderr, "ptx_harness: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n");
    exit(2);
}

flashcl_context *harness_context(const char **cache, char *fresh, const char *device,
                                 void (*log)(void *, const char *)) {
    /* A fresh, empty program cache: the programs there are then exactly this run's. A named one,
     * empty or filled by an earlier run at the same shape (a second run, under ncu, then skips the
     * OpenCL builds), may hold another run's programs too: the harnesses match theirs by options. */
    if (!*cache && !(*cache = mkdtemp(fresh)))
        die("%s", "mkdtemp failed");
    if (mkdir(*cache, 0755) != 0 && errno != EEXIST)
        die("cannot make the cache directory %s", *cache);
    setenv("FLASHCL_CACHE_DIR", *cache, 1);
    unsetenv("FLASHCL_CACHE");
    flashcl_set_log(log, NULL);
    flashcl_context *ctx = NULL;
    if (flashcl_context_create(&ctx, device) != FLASHCL_SUCCESS)
        die("no flashcl context: %s", flashcl_last_error(NULL));
    return ctx;
}

/* Aborts with the driver's message on a failed call: this is a bench tool. */
void cu_check(CUresult rc, const char *what) {
    if (rc == 0)
        return;
    const char *msg = NULL;
    if (cu.get_error_string)
        cu.get_error_string(rc, &msg);
    fprintf(stderr, "ptx_harness: %s failed: CUDA error %d (%s)\n", what, rc, msg ? msg : "?");
    exit(2);
}

CUcontext load_cuda(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        die("libcuda.so.1 did not load: %s", dlerror());
    /* The _v2 names are the ones the 64-bit driver exports for these calls. */
    static const struct {
        const char *name;
        size_t offset;
    } syms[] = {
#define SYM(field, name) {name, offsetof(cuda_api, field)}
        SYM(init, "cuInit"),
        SYM(device_get, "cuDeviceGet"),
        SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain"),
        SYM(ctx_get_current, "cuCtxGetCurrent"),
        SYM(ctx_set_current, "cuCtxSetCurrent"),
        SYM(ctx_synchronize, "cuCtxSynchronize"),
        SYM(module_load_data_ex, "cuModuleLoadDataEx"),
        SYM(module_get_function, "cuModuleGetFunction"),
        SYM(func_get_attribute, "cuFuncGetAttribute"),
        SYM(func_set_attribute, "cuFuncSetAttribute"),
        SYM(occupancy, "cuOccupancyMaxActiveBlocksPerMultiprocessor"),
        SYM(mem_alloc, "cuMemAlloc_v2"),
        SYM(mem_free, "cuMemFree_v2"),
        SYM(memcpy_htod, "cuMemcpyHtoD_v2"),
        SYM(memcpy_dtoh, "cuMemcpyDtoH_v2"),
        SYM(memset_d8, "cuMemsetD8_v2"),
        SYM(launch, "cuLaunchKernel"),
        SYM(event_create, "cuEventCreate"),
        SYM(event_record, "cuEventRecord"),
        SYM(event_synchronize, "cuEventSynchronize"),
        SYM(event_elapsed, "cuEventElapsedTime"),
        SYM(get_error_string, "cuGetErrorString"),
        SYM(encode_tiled, "cuTensorMapEncodeTiled"),
#undef SYM
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; ++i) {
        void *f = dlsym(lib, syms[i].name);
        if (!f)
            die("libcuda.so.1 has no %s", syms[i].name);
        memcpy((char *)&cu + syms[i].offset, &f, sizeof f);
    }
    int device = 0;
    CUcontext ctx = NULL, before = NULL;
    cu_check(cu.init(0), "cuInit");
    if (cu.ctx_get_current(&before) != 0)
        before = NULL;
    cu_check(cu.device_get(&device, 0), "cuDeviceGet");
    cu_check(cu.primary_ctx_retain(&ctx, device), "cuDevicePrimaryCtxRetain");
    cu_check(cu.ctx_set_current(ctx), "cuCtxSetCurrent");
    return before;
}

/* ---- the disk cache's programs ------------------------------------------------------------------ */

/* All programs in dir; returns their count. Files that do not parse are skipped. */
int read_cache(const char *dir, cached_program *out, int cap) {
    DIR *d = opendir(dir);
    if (!d)
        die("cannot open the cache directory %s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && n < cap;) {
        const size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".bin") != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        cache_header h;
        if (!f)
            continue;
        char *key = NULL, *bin = NULL;
        if (fread(&h, sizeof h, 1, f) == 1 && !memcmp(h.magic, "FLCLBIN3", 8) && h.key_len < (1u << 20) &&
            h.size < ((uint64_t)1 << 31) && (key = malloc(h.key_len + 1)) && (bin = malloc(h.size + 1)) &&
            fread(key, 1, h.key_len, f) == h.key_len && fread(bin, 1, h.size, f) == h.size) {
            /* key text parts: format, source hash, options, device... (NUL-separated) */
            key[h.key_len] = '\0';
            const char *opts = key + strlen(key) + 1;
            opts += strlen(opts) + 1;
            bin[h.size] = '\0';
            out[n].options = strdup(opts);
            out[n].ptx = bin;
            out[n].ptx_len = (size_t)h.size;
            bin = NULL;
            ++n;
        }
        free(key);
        free(bin);
        fclose(f);
    }
    closedir(d);
    return n;
}

/* The value of -DNAME=value in options (the last one), or fallback. */
int option_int(const char *options, const char *name, int fallback) {
    char key[64];
    snprintf(key, sizeof key, "-D%s=", name);
    const char *last = NULL;
    for (const char *at = options; (at = strstr(at, key)) != NULL; at += strlen(key))
        last = at;
    return last ? atoi(last + strlen(key)) : fallback;
}

/* ---- OpenCL's PTX for the CUDA driver ----------------------------------------------------------- */

/* Undoes src/program.c's sm_90 masking: ".target sm_90" becomes sm_90a and the "//@sm90a " markers
 * go. Only for a text that still has them (the cache normally holds the rebuilt sm_90a PTX). */
char *unmask_sm90a(const char *ptx) {
    const char *target = strstr(ptx, ".target sm_90");
    if (!target || target[13] == 'a' || !strstr(ptx, "//@sm90a "))
        return strdup(ptx);
    char *out = malloc(strlen(ptx) + 2), *o = out;
    for (const char *p = ptx; *p;) {
        if (p == target + 13)
            *o++ = 'a';
        if (!strncmp(p, "//@sm90a ", 9)) {
            p += 9;
            continue;
        }
        *o++ = *p++;
    }
    *o = '\0';
    return out;
}

/* The two rules of the header comment. Returns NULL (with a message) on an %envreg it does not
 * know. Every rewrite but %envreg6..8 -> %nctaid.x (one byte longer) shrinks the text. */
char *translate(const char *ptx, int *envregs_seen) {
    const size_t n = strlen(ptx);
    char *out = malloc(n + n / 8 + 16);
    size_t o = 0, line_start = 0;
    *envregs_seen = 0;
    for (const char *p = ptx; *p;) {
        if (!strncmp(p, " .ptr .", 7)) { /* " .ptr .global .align 4" (or without a space) */
            const char *a = strstr(p, ".align ");
            const char *nl = strchr(p, '\n');
            if (a && (!nl || a < nl) && a - p < 40) {
                a += 7;
                while (*a >= '0' && *a <= '9')
                    ++a;
                p = a;
                continue;
            }
        }
        if (!strncmp(p, "%envreg", 7)) {
            char *end;
            const long reg = strtol(p + 7, &end, 10);
            static const char *const dims[] = {"%nctaid.x", "%nctaid.y", "%nctaid.z"};
            const char *with = reg >= 0 && reg <= 5 ? "0" : reg <= 8 ? dims[reg - 6] : reg == 9 ? "3" : NULL;
            if (!with) {
                fprintf(stderr, "ptx_harness: the PTX reads %%envreg%ld, which has no CUDA equivalent here\n", reg);
                free(out);
                return NULL;
            }
            *envregs_seen |= 1 << reg;
            /* A special register is moved with mov.u32, not mov.b32 (the instruction is on this line). */
            if (with[0] == '%') {
                out[o] = '\0';
                char *mv = strstr(out + line_start, "mov.b32");
                if (mv)
                    memcpy(mv, "mov.u32", 7);
            }
            memcpy(out + o, with, strlen(with));
            o += strlen(with);
            p = end;
            continue;
        }
        if (*p == '\n')
            line_start = o + 1;
        out[o++] = *p++;
    }
    out[o] = '\0';
    return out;
}

/* The name of the first .entry whose name starts with prefix and is not `not` (NULL: any). */
int find_entry(const char *ptx, const char *prefix, const char *not, char *name, size_t cap) {
    for (const char *at = ptx; (at = strstr(at, ".entry ")) != NULL; at += 7) {
        const char *s = at + 7;
        size_t len = strcspn(s, "( \t\n");
        if (len < cap && !strncmp(s, prefix, strlen(prefix)) && !(not && len == strlen(not) && !strncmp(s, not, len))) {
            memcpy(name, s, len);
            name[len] = '\0';
            return 1;
        }
    }
    return 0;
}

/* Byte sizes of entry `name`'s parameters (and whether each is a pointer), from its declaration;
 * returns their count. */
int entry_params(const char *ptx, const char *name, size_t *sizes, int *is_ptr, int cap) {
    char head[256];
    snprintf(head, sizeof head, ".entry %s(", name);
    const char *p = strstr(ptx, head);
    if (!p)
        return -1;
    const char *end = strchr(p, ')');
    int n = 0;
    for (p = strstr(p, ".param"); p && p < end && n < cap; p = strstr(p + 6, ".param")) {
        const char *stop = strpbrk(p, ",)");
        size_t size = 0, elem = 0;
        for (const char *t = p + 6; t < stop; ++t) { /* the type token: .u64, .b8, .f32 ... */
            if (t[0] == '.' && strchr("usbf", t[1]) && t[2] >= '1' && t[2] <= '9' && !elem)
                elem = (size_t)atoi(t + 2) / 8;
            if (t[0] == '[')
                size = (size_t)atol(t + 1) * (elem ? elem : 1);
        }
        const char *ptr = strstr(p, ".ptr");
        if (is_ptr)
            is_ptr[n] = ptr && ptr < stop;
        sizes[n++] = size ? size : elem;
    }
    return n;
}

/* ---- launching ------------------------------------------------------------------------------------ */

void arg_u64(arg_list *a, uint64_t v) {
    a->u64[a->nu] = v;
    a->sizes[a->n] = 8;
    a->ptrs[a->n++] = &a->u64[a->nu++];
}
void arg_i32(arg_list *a, int32_t v) {
    a->i32[a->ni] = v;
    a->sizes[a->n] = 4;
    a->ptrs[a->n++] = &a->i32[a->ni++];
}
void arg_f32(arg_list *a, float v) {
    a->f32[a->nf] = v;
    a->sizes[a->n] = 4;
    a->ptrs[a->n++] = &a->f32[a->nf++];
}
void arg_bytes(arg_list *a, void *p, size_t size) {
    a->sizes[a->n] = size;
    a->ptrs[a->n++] = p;
}
/* TENSOR_ARGS(x) (cl/common.cl): offset, stride_batch, stride_seq, stride_head, as src/backward.c's set_layout_args. */
void arg_layout(arg_list *a, const flashcl_layout *l) {
    arg_u64(a, l->offset);
    arg_u64(a, l->stride_batch);
    arg_u64(a, l->stride_seq);
    arg_u64(a, l->stride_head);
}

/* A -DSMEM_DYNAMIC=1 build (cl/flash_bwd_sm90.cl) declares its tiles' array, whose name ends in
 * "smem_raw", with 1024 bytes; that declaration becomes ".extern .shared" at module scope (where
 * PTX allows it), the CUDA driver's dynamic shared memory, sized at launch. NULL if absent. */
char *dynamic_tiles(const char *ptx) {
    const char *decl = strstr(ptx, "smem_raw[1024];");
    if (!decl)
        return NULL;
    const char *line = decl;
    while (line > ptx && line[-1] != '\n')
        --line;
    const char *b8 = strstr(line, ".b8 "), *end = strchr(decl, '\n');
    const char *entry = strstr(ptx, ".entry ");
    if (!b8 || b8 > decl || !end || !entry || !strstr(line, ".shared"))
        return NULL;
    while (entry > ptx && entry[-1] != '\n') /* the start of the first entry's line (".visible .entry") */
        --entry;
    const int name_len = (int)(decl + 8 - (b8 + 4));
    char ext[256];
    snprintf(ext, sizeof ext, ".extern .shared .align 1024 .b8 %.*s[];\n\n", name_len, b8 + 4);
    const size_t n = strlen(ptx);
    char *out = malloc(n + strlen(ext) + 1), *o = out;
    const char *cut_from = line, *cut_to = end + 1;
    /* the text before the entry, the extern, then the rest less the declaration's line */
    const char *first = entry < cut_from ? entry : cut_from;
    memcpy(o, ptx, (size_t)(first - ptx)), o += first - ptx;
    if (entry < cut_from) {
        memcpy(o, ext, strlen(ext)), o += strlen(ext);
        memcpy(o, entry, (size_t)(cut_from - entry)), o += cut_from - entry;
        memcpy(o, cut_to, strlen(cut_to) + 1);
    } else { /* a module-scope declaration before the entry */
        memcpy(o, cut_to, (size_t)(entry - cut_to)), o += entry - cut_to;
        memcpy(o, ext, strlen(ext)), o += strlen(ext);
        memcpy(o, entry, strlen(entry) + 1);
    }
    return out;
}

/* A failure of load_kernel: fatal for flashcl's own kernels, the config's row for a study's. */
static int load_failed(const kernel *k, const char *what, CUresult rc) {
    const char *msg = NULL;
    if (rc && cu.get_error_string)
        cu.get_error_string(rc, &msg);
    fprintf(stderr, "ptx_harness: %s: %s failed%s%s\n", k->name, what, msg ? ": " : "", msg ? msg : "");
    if (!k->dyn_smem)
        exit(2);
    return 0;
}

/* Loads one cached program's PTX and its entry; prints what the JIT says about registers. Returns 1,
 * or 0 (a study's kernel, with dyn_smem) where it could not. */
int load_kernel(kernel *k, const cached_program *prog, const char *prefix, const char *not, const char *dump) {
    if (!find_entry(prog->ptx, prefix, not, k->name, sizeof k->name))
        die("no entry %s... in the cached program", prefix);
    char *unmasked = unmask_sm90a(prog->ptx);
    int envregs = 0;
    char *ptx = translate(unmasked, &envregs);
    free(unmasked);
    if (!ptx)
        return load_failed(k, "translating its PTX", 0);
    if (k->dyn_smem) {
        char *dyn = dynamic_tiles(ptx);
        free(ptx);
        if (!dyn) /* --dump shows the PTX NVIDIA's compiler wrote */
            return load_failed(k, "finding the 1024-byte smem_raw declaration (a -DSMEM_DYNAMIC=1 build?)", 0);
        ptx = dyn;
    }
    if (dump) { /* the PTX as flashcl's cache holds it, and as the CUDA driver gets it */
        char path[4200];
        snprintf(path, sizeof path, "%s/%s%s.ptx", dump, k->name, k->tag);
        FILE *f = fopen(path, "w");
        if (f) {
            fputs(prog->ptx, f);
            fclose(f);
        }
        snprintf(path, sizeof path, "%s/%s%s.cuda.ptx", dump, k->name, k->tag);
        if ((f = fopen(path, "w"))) {
            fputs(ptx, f);
            fclose(f);
        }
    }
    static char info[16384], error[16384];
    int opts[] = {JIT_INFO_LOG_BUFFER, JIT_INFO_LOG_BUFFER_SIZE_BYTES, JIT_ERROR_LOG_BUFFER,
                  JIT_ERROR_LOG_BUFFER_SIZE_BYTES, JIT_LOG_VERBOSE};
    void *vals[] = {info, (void *)(uintptr_t)sizeof info, error, (void *)(uintptr_t)sizeof error, (void *)(uintptr_t)1};
    info[0] = error[0] = '\0';
    CUmodule mod = NULL;
    CUresult rc = cu.module_load_data_ex(&mod, ptx, 5, opts, vals);
    if (rc != 0) {
        fprintf(stderr, "ptx_harness: the JIT log of %s:\n%s\n%s\n", k->name, error, info);
        free(ptx);
        return load_failed(k, "cuModuleLoadDataEx", rc);
    }
    if ((rc = cu.module_get_function(&k->fn, mod, k->name)) != 0) {
        free(ptx);
        return load_failed(k, "cuModuleGetFunction", rc);
    }
    /* Past 48 KB a kernel must ask; the carveout preference (all of L1/shared as shared memory)
     * lets registers, not the carveout, set how many work-groups an SM holds. */
    if (k->dyn_smem &&
        ((rc = cu.func_set_attribute(k->fn, FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)k->dyn_smem)) != 0 ||
         (rc = cu.func_set_attribute(k->fn, FUNC_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)) != 0)) {
        free(ptx);
        return load_failed(k, "cuFuncSetAttribute (dynamic shared memory, carveout)", rc);
    }
    int regs = 0, smem = 0, local = 0;
    cu.func_get_attribute(&regs, FUNC_NUM_REGS, k->fn);
    cu.func_get_attribute(&smem, FUNC_SHARED_SIZE_BYTES, k->fn);
    cu.func_get_attribute(&local, FUNC_LOCAL_SIZE_BYTES, k->fn);
    const char *target = strstr(ptx, ".target ");
    printf("  %-5s %s: %.*s, %s, %d registers, %d B shared + %u B dynamic, %d B local (spills), envregs read 0x%x\n",
           k->role, k->name, target ? (int)strcspn(target, "\n") : 0, target ? target : "",
           strstr(ptx, ".maxnreg") ? "with .maxnreg" : "no .maxnreg", regs, smem, k->dyn_smem, local, (unsigned)envregs);
    free(ptx);
    return 1;
}

/* k's launch as it stands (its argument list checked by launch). */
void relaunch(kernel *k) {
    cu_check(cu.launch(k->fn, k->grid[0], k->grid[1], k->grid[2], k->block, 1, 1, k->dyn_smem, NULL, k->args.ptrs,
                       NULL),
             k->name);
}

/* Checks the argument list against the entry's declaration, then launches. */
void launch(kernel *k, const cached_program *prog) {
    size_t sizes[64];
    const int n = entry_params(prog->ptx, k->name, sizes, NULL, 64);
    int ok = n == k->args.n;
    for (int i = 0; ok && i < n; ++i)
        ok = sizes[i] == k->args.sizes[i];
    if (!ok) {
        fprintf(stderr, "ptx_harness: %s declares %d parameters, the harness passes %d:\n", k->name, n, k->args.n);
        for (int i = 0; i < (n > k->args.n ? n : k->args.n); ++i)
            fprintf(stderr, "  %2d: declared %zu, passed %zu\n", i, i < n ? sizes[i] : 0, i < k->args.n ? k->args.sizes[i] : 0);
        exit(2);
    }
    relaunch(k);
}

/* CUDA-event times of the kernels k[0..n-1] (NULL: skipped, its time 0), each already launched
 * once by launch(): each (synchronised per iteration, mean ms into per[]), then all back to back;
 * returns the back-to-back mean ms of the sequence. The launches go to the driver directly, so no
 * PTX is parsed between the events. */
double time_kernels(kernel *const *k, int n, int iters, double *per) {
    static CUevent ev[TIMED_KERNELS_MAX + 1];
    if (n < 1 || n > TIMED_KERNELS_MAX)
        die("%s", "time_kernels: 1 to TIMED_KERNELS_MAX kernels");
    if (!ev[0])
        for (int i = 0; i <= TIMED_KERNELS_MAX; ++i)
            cu_check(cu.event_create(&ev[i], 0), "cuEventCreate");
    for (int i = 0; i < n; ++i)
        per[i] = 0;
    for (int it = 0; it < iters; ++it) {
        cu.event_record(ev[0], NULL);
        for (int i = 0; i < n; ++i) {
            if (k[i])
                relaunch(k[i]);
            cu.event_record(ev[i + 1], NULL);
        }
        cu_check(cu.event_synchronize(ev[n]), "cuEventSynchronize");
        for (int i = 0; i < n; ++i) {
            float ms = 0;
            cu.event_elapsed(&ms, ev[i], ev[i + 1]);
            per[i] += ms / iters;
        }
    }
    cu.event_record(ev[0], NULL);
    for (int it = 0; it < iters; ++it)
        for (int i = 0; i < n; ++i)
            if (k[i])
                relaunch(k[i]);
    cu.event_record(ev[1], NULL);
    cu_check(cu.event_synchronize(ev[1]), "cuEventSynchronize");
    float total = 0;
    cu.event_elapsed(&total, ev[0], ev[1]);
    return total / iters;
}

void harness_args_start(int argc, char **argv, harness_args *a, const char *usage) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s B H N D %s\n", argv[0], usage);
        exit(2);
    }
    a->B = atoi(argv[1]), a->H = atoi(argv[2]), a->N = atoi(argv[3]), a->D = atoi(argv[4]);
    a->causal = 0, a->iters = 20;
    a->dump = a->cache = NULL, a->device = "nvidia";
}

int harness_flag(int argc, char **argv, int *i, harness_args *a) {
    const char *f = argv[*i];
    if (!strcmp(f, "--causal")) {
        a->causal = 1;
        return 1;
    }
    if (*i + 1 >= argc)
        return 0;
    const char **value = !strcmp(f, "--dtype")    ? &a->dtype
                         : !strcmp(f, "--dump")   ? &a->dump
                         : !strcmp(f, "--device") ? &a->device
                         : !strcmp(f, "--cache")  ? &a->cache
                                                  : NULL;
    if (value)
        *value = argv[++*i];
    else if (!strcmp(f, "--iters"))
        a->iters = atoi(argv[++*i]);
    else
        return 0;
    return 1;
}

void harness_args_check(const harness_args *a) {
    if (a->B < 1 || a->H < 1 || a->N < 1 || a->D < 1 || a->iters < 1)
        die("%s", "B, H, N, D and --iters must be >= 1");
}

cl_mem harness_upload(cl_context c, const void *host, size_t bytes) {
    cl_int err;
    cl_mem m = clCreateBuffer(c, CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0), bytes, (void *)host, &err);
    if (!m)
        die("clCreateBuffer failed (%s)", flashcl_status_string(err));
    return m;
}

double harness_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
