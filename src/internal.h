/* internal.h: the context structure and the functions the src/ files share. */
#ifndef FLASHCL_INTERNAL_H
#define FLASHCL_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "flashcl.h"

/* What flashcl reads off a device once, to pick kernels and key caches. */
typedef struct flashcl_device_info {
    char name[256], vendor[256], version[256], driver[256];
    char platform_name[256], platform_version[256];
    cl_device_type type;
    /* The budgets parameters are fitted to, in the host's count of a
     * kernel's __local bytes (flashcl_forward_local_bytes and the like):
     * CL_DEVICE_LOCAL_MEM_SIZE and CL_DEVICE_MAX_WORK_GROUP_SIZE, lowered by
     * what a probe kernel shows of the driver (context.c, probe_kernel_limits)
     * and by FLASHCL_MAX_LOCAL_MEM / FLASHCL_MAX_WORK_GROUP (tests emulate
     * small devices with them). */
    cl_ulong local_mem;
    size_t max_wg;
    /* The driver's own numbers, which a built kernel's CL_KERNEL_LOCAL_MEM_SIZE
     * is compared with (flashcl_kernel_fits). local_scale: the driver's count
     * of a kernel's __local bytes per declared byte (1; 2 on rusticl). */
    cl_ulong device_local_mem;
    unsigned local_scale;
    size_t max_param;    /* CL_DEVICE_MAX_PARAMETER_SIZE (bytes of kernel arguments) */
    cl_uint compute_units;
    int nv_cc_major, nv_cc_minor; /* 0 unless cl_nv_device_attribute_query */
    int is_nvidia, is_pocl;
    /* Mesa's rusticl: it miscompiles a by-value struct argument indexed in
     * non-uniform control flow ("Treating load_kernel_arg in control flow as
     * uniform, results may be incorrect": the KV append and decode kernels'
     * by-value lists gave garbage or crashed in Mesa 22.3-23), so those
     * lists are uploaded there instead (flashcl_by_value_ints). */
    int is_rusticl;
} flashcl_device_info;
/* Mesa's rusticl (22.3, llvmpipe) returns wrong rows from the cpu forward and
 * backward kernels (cl/flash_fwd_cpu.cl, cl/flash_bwd_cpu.cl) once a block
 * sees more than about 128 keys (flashcl check: 4 of 30 random cases, NaN or
 * errors ~0.1; test_backward: dk, dv inf), where PoCL, Intel's runtime and
 * Oclgrind run them clean: one work-item walks a whole block of rows there,
 * past llvmpipe's 65535 loop iterations (flashcl_loop_limit_keys). The
 * portable kernels spread that work over more work-items and pass; asking
 * for the cpu ones there is refused with this. */
#define FLASHCL_RUSTICL_NO_CPU                                                                   \
    "the cpu kernels are not used on Mesa's rusticl, whose loops end after 65535 iterations, "    \
    "which their work-items pass: the portable kernels run there"

/* A kernel object of a program, created on first use. */
typedef struct flashcl_kernel_entry {
    char *name;
    cl_kernel kernel;
    struct flashcl_kernel_entry *next;
} flashcl_kernel_entry;

/* One built program, keyed by its source file and build options, with the
 * kernels taken from it so far. A failed build is remembered (program NULL,
 * log kept) so it is not retried. */
typedef struct flashcl_program {
    char *file;
    char *options;
    cl_program program;
    flashcl_kernel_entry *kernels;
    char *build_log;
    struct flashcl_program *next;
} flashcl_program;

/* A host buffer a non-blocking upload reads from, busy until `written`. */
#define FLASHCL_STAGING_SLOTS 4
typedef struct flashcl_staging {
    void *host;
    size_t bytes;
    cl_event written; /* NULL when free */
} flashcl_staging;

struct flashcl_context {
    int is_host;
    int no_sm90a;     /* the nv-wgmma kernel failed to build here: no longer chosen */
    int no_sm90a_bwd; /* likewise the nv-wgmma backward kernels */
    int no_tma;       /* an nv-wgmma kernel with TMA copies failed to build: built without */
    int no_tma_fp8;   /* the same for nv-wgmma-fp8, remembered apart so the 16-bit kernels keep TMA */
    int no_fp8_wgmma; /* nv-wgmma-fp8 failed to build here (TMA or not): the table no longer chooses it */
    cl_platform_id platform;
    cl_device_id device;
    cl_context cl_ctx;
    cl_command_queue queue;
    flashcl_device_info info;
    char description[1100];
    /* Held by every public call on the context (flashcl_lock): calls from
     * several threads run one after another, so the program cache, kernel
     * arguments, staging buffers, TMA slots and parameter database below are
     * only ever touched by one thread at a time. Recursive. */
    pthread_mutex_t lock;
    flashcl_program *programs;
    int host_threads; /* threads of the host path                        */
    struct flashcl_param_db *params_db; /* params.c: tuning file, overrides; lazy */
    /* serving.c: the batch description of paged/varlen attention, reused
     * across calls; serving_meta_reader, the event of the context's last
     * serving kernel, which the next upload, a by-value call and the KV
     * cache's appends (kv_cache.c) wait for; and the host copies the
     * non-blocking uploads read from. */
    cl_mem serving_meta;
    size_t serving_meta_bytes;
    /* The decode kernels' split counters when the batch description goes by
     * value (META_ARGS): zeroed once, and reset by the kernels after use. */
    cl_mem serving_counters;
    size_t serving_counters_bytes;
    cl_event serving_meta_reader;
    flashcl_staging serving_staging[FLASHCL_STAGING_SLOTS];
    int serving_staging_next;
    /* nv_tma.c: each work-group's copy of its kernel's two tensor maps
     * (FLASHCL_TMA_SLOT_BYTES each), grown to the largest grid. */
    cl_mem tma_slots;
    size_t tma_slots_bytes;
    /* fp8_forward.c: the FP8 forward's descale factors, uploaded through
     * the staging copies above into this buffer (grown, kept);
     * fp8_scales_reader, the last forward that read it, which the next
     * upload waits for (so calls stay ordered on out-of-order queues).
     * fp8_scales_held: what the buffer holds once the last write enqueued
     * completes, fp8_scales_held_bytes of it (0: unknown). A call whose
     * factors match skips the upload (1.7-2.4 us a call on the H200,
     * BENCHMARKS.md) and waits for fp8_scales_reader, which every call that
     * uploads sets (to its kernel, or to the write where that failed). */
    cl_mem fp8_scales;
    size_t fp8_scales_bytes;
    cl_event fp8_scales_reader;
    float *fp8_scales_held;
    size_t fp8_scales_held_bytes, fp8_scales_held_cap;
    /* attention.c: V transposed for the nv-wgmma-fp8 forward (fp8_vt_pack,
     * cl/fp8_vt_pack.cl), or a packed V unpacked for the other kernels
     * (fp8_packed_v.c; grown, kept); fp8_vt_reader, the last forward
     * that read it, which the next call's transpose or unpack waits for. */
    cl_mem fp8_vt;
    size_t fp8_vt_bytes;
    cl_event fp8_vt_reader;
};

/* ---- the context's lock (context.c) ---- */
/* NULL-safe; recursive. Public functions take the lock for their whole body
 * with FLASHCL_LOCKED(ctx), which unlocks on every return (GCC's and Clang's
 * cleanup attribute: no unlock can be missed on an early error return). */
void flashcl_lock(flashcl_context *ctx);
void flashcl_unlock(flashcl_context *ctx);
void flashcl_unlock_scope(flashcl_context **ctx);
#define FLASHCL_LOCKED(ctx)                                                                       \
    flashcl_context *flashcl_locked_ __attribute__((cleanup(flashcl_unlock_scope), unused)) = (ctx); \
    flashcl_lock(flashcl_locked_)

/* ---- errors and logging (context.c) ---- */
/* The last error is per thread and per context (context.c): a call records
 * its message with flashcl_fail; flashcl_last_error(ctx) returns it to the
 * same thread. ctx NULL: a creation failure. */
/* Records a formatted message as the context's last error; returns status. */
flashcl_status flashcl_fail(flashcl_context *ctx, flashcl_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* The start of a public call on device buffers: INVALID_ARGUMENT for a NULL
 * ctx; the thread's last error cleared; on a host context UNSUPPORTED, with
 * a message naming host_fn, the call that takes host memory. */
flashcl_status flashcl_device_entry(flashcl_context *ctx, const char *host_fn);
/* Appends text (such as a build log) to the last error. */
void flashcl_append_error(flashcl_context *ctx, const char *text);
void flashcl_clear_error(flashcl_context *ctx);
/* Whether there is a log sink: a callback (flashcl_set_log), or FLASHCL_LOG=1. */
int flashcl_log_enabled(void);
/* Emits one line to the log sink (a callback, or stderr with FLASHCL_LOG=1). */
void flashcl_log(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* ---- programs (program.c) ---- */
/* 1 when a built kernel can be launched with work-groups of `wg` on ctx's
 * device (its CL_KERNEL_WORK_GROUP_SIZE and CL_KERNEL_LOCAL_MEM_SIZE, within
 * the emulated limits); else 0 and *why says why. */
int flashcl_kernel_fits(const flashcl_context *ctx, cl_kernel kernel, size_t wg, char *why, size_t why_size);
/* The kernel `kernel_name` of cl/`file` (prefixed by cl/common*.cl) built
 * with `options`: from memory, else the disk cache, else source. */
flashcl_status flashcl_get_kernel(flashcl_context *ctx, const char *file, const char *kernel_name,
                                  const char *options, cl_kernel *kernel);
void flashcl_release_programs(flashcl_context *ctx);
/* A copy of PTX text with ".maxnreg cap" added to every kernel entry, how
 * options with -DFLASHCL_NV_MAXNREG=cap build on NVIDIA; NULL when there is
 * no entry, an entry has no body, or memory runs out. *entries: the entries
 * patched. Caller frees. */
unsigned char *flashcl_ptx_cap_registers(const unsigned char *ptx, size_t size, int cap, size_t *out_size,
                                         size_t *entries);
/* A copy of NVIDIA's sm_90 PTX of a -DFLASHCL_SM90A program with its sm_90a
 * instructions unmasked (every "//@sm90a " removed) and ".target sm_90a";
 * NULL when the target is not exactly sm_90, nothing is masked, or memory
 * runs out. *markers: the markers removed. Caller frees. */
unsigned char *flashcl_ptx_enable_sm90a(const unsigned char *ptx, size_t size, size_t *out_size,
                                        size_t *markers);
/* The register cap build options ask for: the value of their last
 * -DFLASHCL_NV_MAXNREG= (so FLASHCL_BUILD_OPTIONS, appended last, wins), or 0. */
int flashcl_nv_register_cap(const char *options);

/* ---- Hopper's Tensor Memory Accelerator (nv_tma.c) ---- */
/* A CUtensorMap: 128 opaque bytes, 64-byte aligned as the driver requires. */
typedef struct flashcl_tensor_map {
    _Alignas(64) uint64_t words[16];
} flashcl_tensor_map;
/* Bytes of one work-group's maps in ctx->tma_slots: two of them (K's, then V's in the forward). */
#define FLASHCL_TMA_SLOT_BYTES 256
/* 1 when the CUDA driver (libcuda.so.1, opened at run time) can encode
 * tensor maps; loaded once per process, the reason logged when not. */
int flashcl_tma_available(void);
/* A map of a tensor of elem_bytes-byte elements (1: FP8, 2: float16 and
 * bfloat16) of dims {cols, rows, heads, batch} whose element strides are
 * {rows, heads, batch}, read in boxes of one 128-byte panel of columns (64
 * 16-bit ones, 128 bytes) by box_rows rows into the 128-byte swizzle,
 * out-of-bounds elements zero, at a placeholder address (the kernel replaces
 * it). 1 on success; 0 when TMA is unavailable or the strides are not
 * multiples of 16 bytes. */
int flashcl_tma_encode(flashcl_tensor_map *map, unsigned elem_bytes, const uint64_t dims[4],
                       const uint64_t strides[3], unsigned box_rows);
/* The map's byte strides for dims and element strides as above: 1, or 0 when
 * a stepped one is not a multiple of 16 bytes below 2^40 (the driver's rule). */
int flashcl_tma_strides(const uint64_t dims[4], const uint64_t strides[3], unsigned elem_bytes, uint64_t bytes[3]);
/* Whether kernels may copy by TMA on ctx: the driver's encoder, an in-order
 * queue (each work-group writes its maps to a slot of ctx->tma_slots, which
 * the next kernel's work-groups rewrite), no TMA build failure before, and
 * not FLASHCL_TMA=0 (the cp.async copies, for comparison). */
int flashcl_tma_usable(flashcl_context *ctx);
/* The map of a tensor of elem_bytes-byte elements in layout l, [batch][seqlen][heads][dim], in
 * boxes of one 128-byte panel by box_rows rows (flashcl_tma_encode): 1, or 0 when it cannot be
 * encoded (an offset, or a stride, not a multiple of 16 bytes). */
int flashcl_tma_encode_layout(flashcl_tensor_map *map, const flashcl_layout *l, unsigned elem_bytes, int batch,
                              int seqlen, int heads, int dim, unsigned box_rows);
/* The maps of two 16-bit tensors a and b of [batch][seqlen][heads][dim], in
 * boxes of 64 dims by box_rows rows (flashcl_tma_encode): 1, or 0 when
 * either cannot be encoded (an offset, or a stride, not a multiple of 16 bytes). */
int flashcl_tma_encode_pair(const flashcl_layout *a, const flashcl_layout *b, int batch, int seqlen, int heads,
                            int dim, unsigned box_rows, flashcl_tensor_map maps[2]);
/* ctx->tma_slots holds at least groups work-groups' maps. */
flashcl_status flashcl_ensure_tma_slots(flashcl_context *ctx, size_t groups);
/* USE_TMA's kernel arguments after the kernel's others, from *a on: the two
 * maps by value, then the work-groups' slots; nothing when maps is NULL. */
cl_int flashcl_set_tma_args(cl_kernel kernel, cl_uint *a, const flashcl_tensor_map maps[2], cl_mem slots);

/* ---- parameters (params_forward.c; the shared database in params.c) ---- */
/* The built-in choice for a resolved desc on this context's device. */
void flashcl_default_params(const flashcl_context *ctx, const flashcl_attention_desc *desc,
                            flashcl_params *params);
/* The choice that always applies (the fallback when a variant cannot build). */
void flashcl_fallback_params(const flashcl_context *ctx, const flashcl_attention_desc *desc,
                             flashcl_params *params);
/* 1 when the tensor-core variant applies (NVIDIA sm_80+, f16/bf16, D 32..256). */
int flashcl_nv_mma_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc);
/* 1 when the float32 tensor-core variant applies (NVIDIA sm_80+, f32, D <= 128). */
int flashcl_nv_tf32_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc);
/* cl/flash_fwd_sm90.cl applies: NVIDIA compute capability 9.0 whose driver has
 * built it (or not yet tried), f16/bf16, head_dim 32..128. */
int flashcl_nv_wgmma_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc);
/* cl/flash_fwd_sm90_fp8.cl applies (the sm_90 table's choice for prefill): compute
 * capability 9.0 with sm_90a, FP8 q, k, v into f16/bf16, head_dim 32..128 in
 * steps of 16, 16-byte aligned rows, factor blocks a multiple of 8 rows. */
int flashcl_nv_wgmma_fp8_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc);
/* Those conditions, for the messages that refuse it. */
#define FLASHCL_NV_WGMMA_FP8_NEEDS                                                                 \
    "NVIDIA compute capability 9.0 (sm_90a), FP8 q, k, v into a float16 or bfloat16 out, "          \
    "head_dim 32..128 in steps of 16, 16-byte aligned rows, descale row blocks a multiple of 8"
/* fp8_packed_v.c: V transposed as the nv-wgmma-fp8 forward reads it (cl/fp8_vt_pack.cl).
 * flashcl_fp8_vt_shape: keys a row (seqlen_k rounded up to the kernel's 128-key tiles), rows
 * a (batch, kv head) (head_dim rounded up to 64), and the bytes of r's Vt. */
size_t flashcl_fp8_vt_shape(const flashcl_attention_desc *r, int *keys, int *rows);
/* What a desc with v_packed lacks (NULL: nothing), for flashcl_fp8_desc_problem. */
const char *flashcl_fp8_packed_v_problem(const flashcl_attention_desc *d);
/* r's packed V (at r->v.offset of packed) into v, packed [batch][seqlen_k][heads_k][head_dim]. */
void flashcl_fp8_unpack_v_host(const flashcl_attention_desc *r, const unsigned char *packed, unsigned char *v);
/* The transpose for head_dim; plain OpenCL C, built on any device. */
flashcl_status flashcl_fp8_vt_pack_kernel(flashcl_context *ctx, int head_dim, cl_kernel *kernel);
/* That kernel enqueued: v (layout vl, batch x heads_k x seqlen_k keys) into
 * vt from byte vt_off, whose rows hold vt_keys keys (seqlen_k rounded up to
 * 128), after the event `after` (may be NULL); *done (may be NULL) gets the
 * pass's event. */
cl_int flashcl_fp8_vt_pack_enqueue(flashcl_context *ctx, cl_kernel pack, cl_mem v, const flashcl_layout *vl,
                                   int batch, int heads_k, int seqlen_k, cl_mem vt, size_t vt_off, int vt_keys,
                                   cl_event after, cl_event *done);
/* fp8_vt_unpack for head_dim, and that kernel enqueued: r's packed V (packed, from
 * r->v.offset) into v, packed [batch][seqlen_k][heads_k][head_dim], after `after` (may be NULL). */
flashcl_status flashcl_fp8_vt_unpack_kernel(flashcl_context *ctx, int head_dim, cl_kernel *kernel);
cl_int flashcl_fp8_vt_unpack_enqueue(flashcl_context *ctx, cl_kernel unpack, const flashcl_attention_desc *r,
                                     cl_mem packed, cl_mem v, cl_event after, cl_event *done);
/* ctx->fp8_vt grown to at least bytes. */
flashcl_status flashcl_fp8_vt_scratch(flashcl_context *ctx, size_t bytes);
/* 1 for the tensor-core variants ("nv-mma", "nv-tf32", "nv-wgmma", "nv-wgmma-fp8"): parameterised by warps,
 * built with -DFLASHCL_NV_PTX, falling back to the portable kernel. */
int flashcl_variant_is_nv(const char *variant);
/* LPT_HEADS (cl/common_nv.cl) for the tensor-core forward kernels and the
 * nv-mma backward on a resolved desc: 8 (16 for `variant` "nv-tf32", and for
 * "nv-wgmma-fp8" at head dims up to 64) where
 * later rows see more keys (a causal mask, or a window bounded on the right
 * only), so that the longest blocks run first; 0 elsewhere, where each
 * head's blocks take turns. */
int flashcl_lpt_heads(const flashcl_attention_desc *resolved, const char *variant);
/* The register cap (-DFLASHCL_NV_MAXNREG) the nv-wgmma kernel is built with
 * under params at head_dim; 0: none. */
int flashcl_nv_wgmma_max_registers(const flashcl_params *params, int head_dim);
/* __local bytes the cpu, portable and nv-mma kernels need (0 for others). */
size_t flashcl_forward_local_bytes(const flashcl_params *params, int head_dim);
/* 1 when params can run on the device for this head_dim; else 0 and *why says why. */
int flashcl_params_fit(const flashcl_context *ctx, int head_dim, const flashcl_params *params,
                       char *why, size_t why_size);
/* The built-in tiles of one forward variant ("portable", "cpu", or a
 * tensor-core one where it applies to desc on this device), shrunk to fit:
 * FLASHCL_PARAMS=VARIANT=...; 0 when the variant does not apply, or ("cpu")
 * where not even one row of its tiles fits the device's local memory, with
 * *why saying which where it knows ("" otherwise). */
int flashcl_variant_params(const flashcl_context *ctx, const flashcl_attention_desc *desc, const char *variant,
                           flashcl_params *params, char *why, size_t why_size);
/* The most keys (or query rows) one work-item of the forward, backward or
 * tiled serving kernels may walk on ctx's driver; 0: no limit. Mesa's rusticl
 * (llvmpipe) ends loops after 65535 iterations: params_forward.c. */
long flashcl_loop_limit_keys(const flashcl_context *ctx, int head_dim);
/* The next smaller tiles of a portable or cpu choice (keys per tile first,
 * then rows): 1, or 0 when there is none (or a tensor-core variant). */
int flashcl_params_halve(flashcl_params *params);
/* 1 when params were asked for explicitly (flashcl_set_params, FLASHCL_PARAMS):
 * those are refused when they do not fit, never replaced by a fallback. */
int flashcl_params_explicit(const flashcl_params *params);
/* "sm_90", "gfx90a", "xe-hpg" or "" for the device. */
void flashcl_device_arch(const flashcl_context *ctx, char *buf, size_t size);
/* The head_dim class a desc falls in: 1..64, 65..128, 129..256. */
void flashcl_head_dim_bucket(int head_dim, int *lo, int *hi);
void flashcl_param_db_free(struct flashcl_param_db *db);

/* One database entry: where it applies and the parameters (see params_forward.c). */
enum { FLASHCL_PHASE_ANY = 0, FLASHCL_PHASE_PREFILL = 1, FLASHCL_PHASE_DECODE = 2 };
typedef struct flashcl_param_entry {
    const char *match;   /* the level's key: device name, "sm_80+", "NVIDIA", "CPU"...  */
    const char *driver;  /* device entries: exact driver version, or NULL for any    */
    const char *variant; /* "portable", "cpu", "nv-mma", "nv-wgmma" (static strings) */
    int dtype;           /* flashcl_dtype, or -1 for any                              */
    int head_dim_min, head_dim_max;
    int phase;           /* FLASHCL_PHASE_*                                           */
    int causal;          /* 0, 1, or -1 for either                                    */
    int block_m, block_n, threads_per_row, warps;
    const char *why;     /* built-in entries: where the numbers came from             */
} flashcl_param_entry;

/* A serving-kernel entry (params_serving.c's tables, the tuning file's "serving"):
 * the kernel (FLASHCL_SERVING_*) and what it is launched with. */
typedef struct flashcl_serving_entry {
    const char *match;  /* the level key, as flashcl_param_entry's           */
    const char *driver; /* device entries: exact driver version, or NULL     */
    int kernel, max_rows, work_group_size, unroll, stages, wgs_per_cu, min_split_keys;
    const char *why;    /* where the numbers came from (the file: its comment) */
} flashcl_serving_entry;

/* A backward-kernel entry (params_backward.c's table, the tuning file's "backward"). */
typedef struct flashcl_backward_entry {
    const char *match, *driver; /* as flashcl_serving_entry's */
    int head_dim_min, head_dim_max, block_m, block_n, work_group_size;
    const char *why;
    const char *variant; /* "cpu": cl/flash_bwd_cpu.cl, "nv-mma": cl/flash_bwd_nv.cl, NULL or "portable": cl/flash_bwd.cl */
    int nv_max_registers; /* nv-mma: registers per thread ptxas may use (program.c's
                           * FLASHCL_NV_MAXNREG); 0: the compiler's choice */
    int nv_own_regs;      /* nv-wgmma: 1 holds the own block's fragments in registers (OWN_REGS=1) */
} flashcl_backward_entry;

/* ---- the user tuning file (tuning_file.c) ---- */
#define FLASHCL_TUNING_MAX_BYTES (1 << 20) /* a larger file is ignored whole */
typedef struct flashcl_tuning_data {
    char *path;
    char *problem; /* NULL, or why the whole file is ignored */
    flashcl_param_entry *entries; /* "entries": the forward kernels' */
    size_t count;
    flashcl_serving_entry *serving; /* "serving" */
    size_t num_serving;
    flashcl_backward_entry *backward; /* "backward" */
    size_t num_backward;
} flashcl_tuning_data;
/* FLASHCL_TUNING_FILE, else $XDG_CONFIG_HOME/flashcl/tuning.json, else
 * ~/.config/flashcl/tuning.json; 0 when none can be formed. */
int flashcl_tuning_path(char *buf, size_t size);
/* Reads path; never fails: a missing file has no entries, a bad one sets problem. */
void flashcl_tuning_load(const char *path, flashcl_tuning_data *tf);
/* Parses a document (tf may be NULL: only check it); 0, or -1 with *err. */
int flashcl_tuning_parse(const char *text, size_t len, flashcl_tuning_data *tf, char *err, size_t n);
void flashcl_tuning_free(flashcl_tuning_data *tf);
/* Adds or replaces entry e (same device, driver and class) in path, atomically;
 * refuses to touch an existing file it cannot read. 0, or -1 with *err. */
int flashcl_tuning_store(const char *path, const flashcl_param_entry *e, const char *comment,
                         char *err, size_t n);

/* ---- serving kernels' parameters (params_serving.c, flashcl_decode_params) ---- */
/* The three serving kernels: cl/paged_attention.cl (__local tiles, any
 * shape, any alignment), cl/paged_decode.cl (few rows per sequence, 16-byte
 * loads, SIMT: the memory-bound decode kernel for any GPU) and
 * cl/paged_decode_nv.cl (the same on NVIDIA tensor cores, f16/bf16). */
enum { FLASHCL_SERVING_TILED = 0, FLASHCL_SERVING_DECODE = 1, FLASHCL_SERVING_DECODE_MMA = 2 };
typedef struct flashcl_decode_problem {
    flashcl_dtype dtype;
    int head_dim, heads_k, num_seqs;
    const int *rows_per_seq; /* query tokens of sequence i * (heads_q / heads_k) */
    long max_keys;           /* the longest sequence's keys                     */
    int requested_splits;    /* > 0 forces the split count                      */
    int vec_aligned;         /* K/V rows start on 16 bytes (offsets, strides)    */
    int force_tiled;         /* the tiled kernel whatever else applies (a decode
                              * kernel failed to build)                         */
    int group;               /* query heads per kv head                          */
    flashcl_dtype kv_fp8;    /* 0: K/V in dtype; else the FP8 pages' format (one
                              * byte an element: the decode kernel's 8-byte
                              * chunks, the mma kernel's 32-key tiles)         */
} flashcl_decode_problem;
typedef struct flashcl_decode_choice {
    int kernel;          /* FLASHCL_SERVING_TILED, _DECODE or _DECODE_MMA      */
    int block_m;         /* rows (token x query head of one kv head) per work-group */
    int block_n;         /* tiled, decode-mma: keys per __local tile          */
    int tpr;             /* tiled: work-items per row                         */
    int lanes;           /* decode: work-items per key (16-byte loads each)   */
    int unroll;          /* decode: keys per key slot per step                */
    int stages;          /* decode kernels: steps of K/V in the __local pipeline */
    int vec;             /* decode: elements per chunk (a lane's load)         */
    int chunk_bytes;     /* decode: bytes per chunk: 16, or 8 on FP8 pages (0: 16) */
    int work_group_size;
    int wgs_per_cu;      /* split-KV: work-groups wanted per compute unit     */
    int min_split_keys;  /* split-KV: no slice shorter than this              */
    int splits;          /* key slices per (block, kv head); 1 = no combine   */
    int reg_copy_min_keys; /* decode-mma: slices of at least this many keys copy
                            * K/V by loads staged through registers instead of
                            * cp.async (cl/paged_decode_nv.cl REG_COPY)        */
    int reg_copy;          /* decode-mma: that choice, made with the split count */
    int head_group;        /* decode-mma: kv heads a work-group takes, a warp each
                            * (cl/paged_decode_nv.cl HEAD_GROUP); 0: one      */
    int head_warps;        /* ... and warps a kv head there (HG_WPH; 0: 1)    */
    int hg_keys;           /* ... and its keys a tile over FP8 pages: 16 (0: 16)
                            * or 32 (HG_WIDE, head dims a multiple of 64)     */
    int l2_prefetch;     /* decode kernels: bytes of L2 prefetch on each cp.async
                          * (common_nv.cl CP_ASYNC_L2: 0, 64, 128 or 256)        */
    int meta_args;       /* decode kernels: 1 passes the batch description as a
                          * by-value kernel argument when it fits (no upload)  */
    const char *source;  /* where the numbers came from                       */
} flashcl_decode_choice;
#define FLASHCL_MAX_SPLITS 128
/* Bytes of __local a kernel may declare statically on NVIDIA's OpenCL: 48 KB
 * less the driver's own share (../shared/gpu/NVIDIA-OPENCL.md: ~47 KB). Every
 * NVIDIA kernel's tiles are sized against it; their .cl files check it too. */
#define FLASHCL_NV_LOCAL_LIMIT 48000
/* The vector width of cl/flash_fwd_cpu.cl (its LANES): query rows per
 * vector, to which it pads a block's rows and the head dim. 16 (an AVX-512
 * register, two AVX2 ones) measured ~10 % above 8 on Zen 4 (BENCHMARKS.md). */
#define FLASHCL_CPU_LANES 16
/* The decode kernels merge their splits in two levels above twice
 * FLASHCL_MERGE_GROUP splits, with one counter per (block, kv head) and one
 * per run of that many splits: cl/common_serving.cl's MERGE_GROUP, TWO_LEVELS and
 * split_counters, which these mirror. */
#define FLASHCL_MERGE_GROUP 8
static inline int flashcl_split_counters(int splits) {
    return splits > 2 * FLASHCL_MERGE_GROUP ? 1 + (splits + FLASHCL_MERGE_GROUP - 1) / FLASHCL_MERGE_GROUP : 1;
}
/* Fills *choice for the problem: database entry, FLASHCL_DECODE_PARAMS, then
 * the split count. Fails only on a malformed FLASHCL_DECODE_PARAMS or an
 * explicit choice that does not fit the device. */
flashcl_status flashcl_decode_params(flashcl_context *ctx, const flashcl_decode_problem *problem,
                                     flashcl_decode_choice *choice);
/* __local bytes the chosen kernel needs. */
size_t flashcl_decode_local_bytes(const flashcl_decode_choice *choice, int head_dim);
/* Elements of K/V in a chunk, one lane's load in the decode kernel
 * (cl/paged_decode.cl): 16 bytes of 16/32-bit K/V, 8 of FP8 pages. */
int flashcl_decode_kv_vec(const flashcl_decode_problem *problem);
/* The META_ARGS switch for the serving calls that have no decode choice of
 * their own (a KV-cache append's slot list): FLASHCL_DECODE_PARAMS's value,
 * else the default; a malformed variable is left for the decode call to
 * report. */
int flashcl_serving_by_value(void);

/* ---- backward kernels' parameters (params_backward.c, flashcl_backward_params) ---- */
/* Tiles of cl/flash_bwd.cl and how dQ is reduced. */
/* The dK/dV and dQ kernels of a backward (pre and store are always cl/flash_bwd.cl's). */
typedef enum flashcl_backward_variant {
    FLASHCL_BWD_PORTABLE, /* cl/flash_bwd.cl: any device                                    */
    FLASHCL_BWD_CPU,      /* cl/flash_bwd_cpu.cl: one work-item per block (work_group_size
                           * unused, kept for the portable fallback)                         */
    FLASHCL_BWD_NV_MMA,   /* cl/flash_bwd_nv.cl: NVIDIA sm_80+ tensor cores, f16/bf16,
                           * head_dim <= 128; WG/32 warps own 16 keys (dK/dV) or 16 rows
                           * (dQ) each; block_m = dK/dV's streamed query rows, block_n =
                           * dQ's streamed keys; dQ always by its own pass (deterministic) */
    FLASHCL_BWD_NV_WGMMA  /* cl/flash_bwd_sm90.cl: Hopper's warpgroup MMA (compute capability
                           * 9.0), f16/bf16, head_dim 32..128 (held A operands from 65); one or two
                           * warpgroups (WG 128, 256) own 64 keys or rows each; block_m,
                           * block_n (16, 32 or 64) as nv-mma's; dQ by its own pass */
} flashcl_backward_variant;
typedef struct flashcl_backward_choice {
    int block_m;         /* query rows per streamed tile                    */
    int block_n;         /* keys per dkdv work-group / per streamed dq tile */
    int work_group_size; /* work-items per work-group                       */
    int deterministic;   /* 1: separate dQ pass; 0: float atomics           */
    int nv_dq_pass;      /* nv-mma: 1 runs the dQ pass in both modes, 0 adds
                          * dQ with atomics unless deterministic             */
    int nv_max_registers; /* nv-mma: register cap per thread, 0: none         */
    int nv_dq_max_registers; /* nv-wgmma: its dQ pass's cap (DQ_MAXNREG), 0: none */
    int nv_stages;       /* nv-wgmma: its TMA kernels' streamed stages (2..8),
                          * 0: the kernel's default (two where they fit)      */
    int nv_own_regs;     /* nv-wgmma: 1 holds the own block's fragments in
                          * registers (cl/flash_bwd_sm90.cl's OWN_REGS)       */
    int cpu_dq_owner;    /* cpu, outside deterministic mode: 1 has one work-item
                          * per (batch, kv head) walk all its key blocks and add
                          * dQ without atomics (flashcl_backward_params) */
    flashcl_backward_variant variant;
    const char *source;  /* where the numbers came from                     */
} flashcl_backward_choice;
/* Fills *choice for a resolved desc: database entry (shrunk to fit when it
 * is a default), then FLASHCL_BWD_PARAMS; deterministic: the caller's
 * flashcl_backward_options.deterministic; skip_nv: pass over the
 * tensor-core entries (after nv-mma failed to build; a failed nv-wgmma sets
 * ctx->no_sm90a_bwd instead, which passes over its entries alone). Fails
 * only on a malformed FLASHCL_BWD_PARAMS or tiles or a work-group that do
 * not fit the device. */
flashcl_status flashcl_backward_params(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                       int deterministic, int skip_nv, flashcl_backward_choice *choice);
/* __local bytes cl/flash_bwd.cl needs with these tiles. */
size_t flashcl_backward_local_bytes(int block_m, int block_n, int head_dim);
/* __local bytes cl/flash_bwd_cpu.cl's kernel needs with these tiles. */
size_t flashcl_backward_cpu_local_bytes(int block_m, int block_n, int head_dim);
/* __local bytes of cl/flash_bwd_nv.cl's larger kernel with these tiles. */
size_t flashcl_backward_nv_local_bytes(int block_m, int block_n, int work_group_size, int head_dim,
                                       int dq_atomic);
/* 1 when the backward of choice c sums dQ with float atomics (else by its dQ pass). */
int flashcl_backward_dq_atomic(const flashcl_backward_choice *c);
/* 1 for the tensor-core variants (nv-mma, nv-wgmma). */
int flashcl_backward_nv(const flashcl_backward_choice *c);
/* Rows of keys (dK/dV) and of queries (dQ) one work-group of the choice owns. */
int flashcl_backward_keys_per_group(const flashcl_backward_choice *c);
/* cl/flash_bwd_sm90.cl's streamed stages (2 where they fit 48 KB, else 1) for tiles of `rows` rows. */
int flashcl_backward_wgmma_stages(int rows, int work_group_size, int head_dim, int own_regs);
int flashcl_backward_rows_per_group(const flashcl_backward_choice *c);

/* ---- the pure-C host path (host_path.c) ---- */
flashcl_status flashcl_host_forward(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                    const void *q, const void *k, const void *v, void *out,
                                    float *lse);
/* The backward on host memory (src/host_backward.c): desc resolved, opts
 * with resolved layouts, lse float [batch][heads_q][seqlen_q]. */
flashcl_status flashcl_host_backward(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                     const flashcl_backward_options *opts, const void *q,
                                     const void *k, const void *v, const void *out, const void *dout,
                                     const float *lse, void *dq, void *dk, void *dv);
/* The forward's block kernel (host_kernels.c, src/host_kernel_body.h): one call
 * computes FLASHCL_HOST_BLOCK_M query rows from m0 of query head h, batch b, with
 * ws: flashcl_host_scratch_floats(head_dim) floats of scratch, 64-byte aligned. */
typedef struct flashcl_host_fwd_args {
    const flashcl_attention_desc *d; /* resolved */
    const void *q, *k, *v;
    void *out;
    float *lse; /* may be NULL */
    /* K and V packed (pack below), or NULL: float [batch][heads_k][keys][dim],
     * keys = seqlen_k rounded up to FLASHCL_HOST_BLOCK_N, dim = head_dim rounded
     * up to 16, zero-padded, 64-byte aligned. */
    float *kp, *vp;
    size_t keys, dim;
} flashcl_host_fwd_args;
/* The backward's kernels (src/host_backward_body.h), on the same blocks. */
typedef struct flashcl_host_bwd_args {
    const flashcl_attention_desc *d;  /* resolved */
    const flashcl_backward_options *o; /* resolved layouts */
    const void *q, *k, *v, *out, *dout;
    const float *lse; /* [batch][heads_q][seqlen_q] */
    float *di;        /* the same shape: written by pass 0, read by passes 1, 2 */
    void *dq, *dk, *dv;
} flashcl_host_bwd_args;
#define FLASHCL_HOST_BLOCK_M 64 /* query rows per block */
#define FLASHCL_HOST_BLOCK_N 64 /* keys per tile */
typedef struct flashcl_host_kernel {
    const char *name; /* "avx512", "avx2", "generic" */
    void (*block)(const flashcl_host_fwd_args *a, int b, int h, int m0, float *ws);
    /* Fills kp and vp for keys [r0, r1) of kv head hk, batch b. */
    void (*pack)(const flashcl_host_fwd_args *a, int b, int hk, size_t r0, size_t r1);
    void (*exp2_array)(float *x, int n); /* the copy's exp2, in place (tests) */
    /* The backward's pass 0 (D of FLASHCL_HOST_BLOCK_M rows), 1 (dK, dV of
     * FLASHCL_HOST_BLOCK_N keys of kv head h) or 2 (dQ of FLASHCL_HOST_BLOCK_M rows)
     * on block blk; ws: flashcl_host_bwd_scratch_floats(head_dim), 64-byte aligned. */
    void (*bwd)(const flashcl_host_bwd_args *a, int pass, int b, int h, long blk, float *ws);
} flashcl_host_kernel;
/* Most bytes the host forward takes for K and V packed in float (host_path.c);
 * past it the kernel reads them tile by tile from the caller's arrays. */
#define FLASHCL_HOST_PACK_BYTES ((size_t)256 << 20)
size_t flashcl_host_scratch_floats(int head_dim);
size_t flashcl_host_bwd_scratch_floats(int head_dim);
size_t flashcl_host_padded_dim(int head_dim);
/* The best copy this CPU runs; want (may be NULL) names a lower one to take instead
 * when the CPU runs it (FLASHCL_HOST_SIMD). */
flashcl_host_kernel flashcl_host_kernel_pick(const char *want);
/* host_path.c's storage conversions: element i of an array of dtype. */
float flashcl_host_load(const void *base, flashcl_dtype dtype, size_t i);
/* ---- FP8 (fp8.c) ---- */
int flashcl_dtype_is_fp8(flashcl_dtype dtype);
/* Why attention cannot take tensors of dtype (an unknown value, or FP8,
 * which only the dense forward and the FP8 helpers take in this version), or
 * NULL when it can. The dense forward checks FP8 itself (fp8_forward.c). */
const char *flashcl_dtype_unusable(flashcl_dtype dtype);
/* Row blocks of n rows with a descale factor every block_rows rows
 * (block_rows of flashcl_fp8_scales and flashcl_fp8_quant_desc): ceil(n /
 * block_rows), without forming n + block_rows (as the kernels' FP8_BLOCKS);
 * 1 when block_rows is 0. */
static inline size_t flashcl_fp8_row_blocks(int n, int block_rows) {
    if (block_rows <= 0)
        return 1;
    return n > 0 ? (size_t)(n - 1) / (size_t)block_rows + 1 : 0;
}
/* ---- the FP8 forward (fp8_forward.c) ---- */
/* The storage type of out: out_dtype for an FP8 desc, else dtype. */
flashcl_dtype flashcl_out_dtype(const flashcl_attention_desc *d);
/* Why an FP8 desc's out_dtype or fp8 scales' mode is refused, or NULL. */
const char *flashcl_fp8_desc_problem(const flashcl_attention_desc *d);
/* Descale counts of q, k and v for a resolved FP8 desc (flashcl_fp8_scales). */
void flashcl_fp8_scale_counts(const flashcl_attention_desc *r, size_t counts[3]);
/* Checks the caller's factors (finite, > 0); fails on ctx naming the first bad one. */
flashcl_status flashcl_fp8_check_scales(flashcl_context *ctx, const flashcl_attention_desc *r);
/* Makes ctx->fp8_scales hold r's factors [q | k | v] (1 for a NULL array):
 * uploads them unless it already does; *written (retained for the caller),
 * what the kernel waits for: the write, or where none was needed the buffer's
 * last reader, which came after the write that put them there. */
flashcl_status flashcl_fp8_upload_scales(flashcl_context *ctx, const flashcl_attention_desc *r, cl_event *written);
/* The host path: dequantizes to float32 and runs flashcl_host_forward. */
flashcl_status flashcl_fp8_host_forward(flashcl_context *ctx, const flashcl_attention_desc *r, const void *q,
                                        const void *k, const void *v, void *out, float *lse);
/* FLASHCL_SUCCESS, or INVALID_ARGUMENT with that reason as ctx's last error. */
flashcl_status flashcl_check_dtype(flashcl_context *ctx, flashcl_dtype dtype);
void flashcl_host_store(void *base, flashcl_dtype dtype, size_t i, float value);

/* ---- layouts and buffer checks (layout.c) ---- */
/* All-zero strides become the packed [batch][seqlen][heads][head_dim]. */
void flashcl_default_layout(flashcl_layout *l, int seqlen, int heads, int head_dim);
/* Whether every row of l starts at a multiple of 16 bytes into its buffer (offset and strides
 * in bytes): what the FP8 kernels' 16-byte loads and copies need. */
int flashcl_layout_rows_16_bytes(const flashcl_layout *l);
/* Bytes up to the end of the last element a layout touches; 0 on overflow. */
size_t flashcl_layout_bytes(const flashcl_layout *l, int batch, int seqlen, int heads, int head_dim,
                            size_t elem_size);
/* A non-NULL cl_mem of at least `need` bytes (need 0 means an overflowed
 * size), or an error naming the tensor. */
flashcl_status flashcl_check_buffer(flashcl_context *ctx, const char *name, cl_mem buf, size_t need);

/* ---- small utilities (util.c) ---- */
uint64_t flashcl_fnv1a(uint64_t hash, const void *data, size_t size);
/* fopen(path, "rb") for regular files only (a FIFO or device there is
 * refused, without blocking); *size (may be NULL) gets the file's size.
 * NULL on any failure. In src/program.c. */
FILE *flashcl_open_regular(const char *path, off_t *size);
char *flashcl_strdup(const char *s);
/* a * b + c without overflow; returns 0 on overflow. */
int flashcl_mul_add(size_t a, size_t b, size_t c, size_t *out);
/* A build option the host chooses: " -Dname=value" into buf, or "" when
 * value is 0 or the user's options (extra: FLASHCL_BUILD_OPTIONS, may be
 * NULL) already define name, so that theirs wins. */
void flashcl_host_define(char *buf, size_t size, const char *extra, const char *name, int value);
/* The text after the last "-D<name>=" in options (may be NULL), or NULL where there is none: the
 * value a build defines last, which is the one the kernel sees. */
const char *flashcl_option_define(const char *options, const char *name);
/* After snprintf of a kernel's build options (n its result, cap the buffer's size): an error that
 * names FLASHCL_BUILD_OPTIONS where they did not fit. Options cut short could build a kernel other
 * than the one the launch is sized for, so they are refused. */
flashcl_status flashcl_options_fit(flashcl_context *ctx, int n, size_t cap);

/* The strict KEY=VALUE[,KEY=VALUE...] lists of FLASHCL_PARAMS,
 * FLASHCL_BWD_PARAMS and FLASHCL_DECODE_PARAMS. Each caller names its keys
 * and writes its own messages; the syntax is checked here, once. */
typedef struct flashcl_kv {
    const char *at;    /* the item and the rest of the list, for messages */
    const char *key;   /* key_len characters, not terminated              */
    const char *value; /* value_len characters up to the next ',' or end  */
    size_t key_len, value_len;
} flashcl_kv;
enum {
    FLASHCL_KV_TRAILING_COMMA = -2, /* "A=1,": a ',' with nothing after it   */
    FLASHCL_KV_NO_EQUALS = -1,      /* an item without '=' (also "" in ",,") */
    FLASHCL_KV_END = 0,
    FLASHCL_KV_ITEM = 1
};
/* Reads the item at *s into *kv and moves *s past it and its ','; returns
 * one of the FLASHCL_KV_ codes (*s unmoved on an error). */
int flashcl_kv_next(const char **s, flashcl_kv *kv);
/* 1 when kv's key is name, ignoring case. */
int flashcl_kv_key(const flashcl_kv *kv, const char *name);
/* 1 with *value when kv's whole value is a decimal integer in lo..hi, else 0. */
int flashcl_kv_int(const flashcl_kv *kv, long lo, long hi, int *value);

#endif
