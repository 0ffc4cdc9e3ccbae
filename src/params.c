/* params.c: the forward kernel's parameter database: built-in entries, the lookup chain, overrides.
 *
 * Lookup, first match wins (a miss never fails; the last level always matches):
 *   1. flashcl_set_params() on this context                "set: flashcl_set_params"
 *   2. the user tuning file (src/tuning_file.c)            "tuned: <path>"
 *   3. built-in, exact device: name (+ driver if given)    "built-in device: <name>"
 *   4. built-in, architecture: NVIDIA "sm_XY" (or "sm_XY+" = that or newer),
 *      AMD "gfxNNN" (the device name on ROCm), Intel "xe-lp/xe-hpg/xe-hpc"
 *                                                          "built-in arch: <arch>"
 *   5. built-in, vendor: "NVIDIA", "AMD", "Intel"          "built-in vendor: <vendor>"
 *   6. built-in, device type: "CPU", "GPU"                 "default: <type>"
 *   7. built-in, global                                    "default: global"
 * Then FLASHCL_PARAMS (src/attention.c) may replace single values.
 * Within a level, entries are keyed by variant and problem class (dtype,
 * head_dim range, prefill/decode, causal); the most specific match wins. An
 * entry whose variant does not apply (nv-mma off NVIDIA sm_80+ or on float32,
 * nv-tf32 off NVIDIA sm_80+ or on 16-bit dtypes, either with
 * FLASHCL_VARIANT=portable) is passed over silently. An entry that does
 * not fit the device (local memory, work-group size, the kernel's own
 * divisibility rules) is passed over with a log line and the lookup goes on:
 * database entries are preferences. Explicit requests (flashcl_set_params,
 * FLASHCL_PARAMS) are refused with FLASHCL_ERROR_INVALID_PARAMS instead.
 * The device-type and global defaults are shrunk to fit, never skipped.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

/* ---- built-in entries: every number with where it came from ------------------------------ */

#define ANY (-1)
#define F32 FLASHCL_FLOAT32
#define F16 FLASHCL_FLOAT16
#define BF16 FLASHCL_BFLOAT16
#define PREFILL FLASHCL_PHASE_PREFILL
#define DECODE FLASHCL_PHASE_DECODE
#define PHASE_ANY FLASHCL_PHASE_ANY

/* Row layout: {match, driver, variant, dtype, head_dim_min, head_dim_max, phase, causal,
 *              block_m, block_n, threads_per_row, warps, why} */

/* Level 3, exact devices: measured winners, with the command and figures,
 * pinned here so that a later change to the architecture entries cannot
 * move this card. On the H200 (driver 580.159.04, 2026-12-01) `bench/h200.sh
 * final` ran `flashcl tune --device nvidia --dtype f16 --seqlen 4096 --batch
 * 4 --heads 32 --budget 35 --confirm 2 --head-dim 64`: the sm_80+ entry
 * (1.00x over it). Since then the wgmma kernel took over (the sm_90 entries
 * below say what it measured); these pin its TMA-era choice. */
static const flashcl_param_entry builtin_device[] = {
    {"NVIDIA H200", NULL, "nv-wgmma", F16, 1, 64, PREFILL, ANY, 64, 64, 0, 4,
     "flashcl bench on the H200, TMA tiles: 439 TFLOP/s at 4,32,4096,64 (two warpgroups 405), 389 causal"},
    {"NVIDIA H200", NULL, "nv-wgmma", F16, 65, 128, PREFILL, ANY, 64, 64, 0, 4,
     "flashcl bench on the H200, TMA tiles: 547 TFLOP/s at 4,32,4096,128 (two warpgroups 463), 492 causal"},
    {NULL, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL},
};

/* Level 4, architectures. */
static const flashcl_param_entry builtin_arch[] = {
    /* Hopper's warpgroup MMA (cl/flash_fwd_sm90.cl); first, so that it wins
     * over the sm_80+ entries of the same class on compute capability 9.0.
     * One warpgroup of 64 query rows over 64-key tiles, which arrive by TMA
     * (USE_TMA). H200, f16, `flashcl bench --device nvidia`, TFLOP/s at
     * (4,32,4096,D) / (1,32,16384,128), no mask | causal (2026-12-02, a2db0d7):
     *   D=128  one warpgroup, 64 keys   547 / 569 | 491 / 532
     *          one warpgroup, 48 keys             | 437 / 451
     *          two warpgroups in turns  463 / 482 | 355 / 409
     *   D=64   one warpgroup, 64 keys   439       | 391 (nv-mma: 276)
     *          two warpgroups in turns  405       | 360
     * Through cp.async (FLASHCL_TMA=0, or no CUDA driver to encode the
     * maps) the copies ran serially with the products, and the best shapes
     * were others: two warpgroups in turns without a mask (331 / 336 at
     * D=128), one warpgroup of 48 keys with Q in its own block under a
     * 168-register cap causal (290 / 315), and nv-mma causal at D <= 64;
     * there this entry's shape runs within 2-10 % of those (causal D=128
     * 276, D=64 252). ptxas: 158 registers at D > 64, 106 at D <= 64, no
     * spills. */
    {"sm_90", NULL, "nv-wgmma", ANY, 1, 128, PHASE_ANY, ANY, 64, 64, 0, 4,
     "measured on the H200 with TMA tiles: 547 TFLOP/s at (4,32,4096,128), 491 causal"},
    /* Tensor cores (cl/flash_fwd_nv.cl), 4 warps. Measured on the H200
     * (f16, 4,32,4096,D, TFLOP/s no mask / causal): D=64 BM128 2-stage
     * 281/256 vs BM64 215/201; D=128 BM64 BN64 250/235 vs BN32 201, BM128
     * spills. Above D=128, 32-key tiles keep K+V within 48 KB. */
    {"sm_80+", NULL, "nv-mma", ANY, 1, 64, PHASE_ANY, ANY, 128, 64, 0, 4,
     "measured on the H200: 32 rows per warp, two K/V stages"},
    {"sm_80+", NULL, "nv-mma", ANY, 65, 128, PHASE_ANY, ANY, 64, 64, 0, 4,
     "measured on the H200: BM128 spills at D=128"},
    {"sm_80+", NULL, "nv-mma", ANY, 129, 256, PHASE_ANY, ANY, 64, 32, 0, 4,
     "hand-chosen: K+V tiles in ~34 KB at D=256"},
    /* float32 on tensor cores, 3xTF32 (cl/flash_fwd_nv32.cl), 16 rows per
     * warp. D <= 64: 4 warps, Q in registers, two stages of 32-key K/V tiles
     * (H200, f32 (4,32,4096,64), with the cvt-era split: 40.8 TFLOP/s; 8-key
     * tiles 28.3, 2 warps 36.7, 8 warps 40.8; with FAST_SPLIT 50.3). D <= 128:
     * Q in __local (in registers it spilled: 28.8), one stage of 16-key tiles.
     * With the cvt-era split, 2 warps (36 KB) gave 33.7 at (4,32,4096,128),
     * against 28.0 with two stages of 8 keys, 30.1 with 4 warps and 8 keys,
     * 14.6 with one warp and 32 keys. With FAST_SPLIT: 2 warps 44.9, 3 warps
     * (48 rows, 45 KB) 46.8, the entry. */
    {"sm_80+", NULL, "nv-tf32", F32, 1, 64, PHASE_ANY, ANY, 64, 32, 0, 4,
     "measured on the H200: 50.3 TFLOP/s at (4,32,4096,64)"},
    {"sm_80+", NULL, "nv-tf32", F32, 65, 128, PHASE_ANY, ANY, 48, 16, 0, 3,
     "measured on the H200: 46.8 TFLOP/s at (4,32,4096,128)"},
};

/* Level 5, vendors. None yet (nothing measured per vendor). */
static const flashcl_param_entry builtin_vendor[] = {
    {NULL, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL},
};

/* Level 6, device types; level 7, global. These are shrunk to fit. */
static const flashcl_param_entry builtin_type[] = {
    /* CPU (cl/flash_fwd_cpu.cl): 32 query rows per work-item reuse each
     * converted K/V element 32 times; 64-key tiles are eight float8 score
     * accumulators, which stay in registers; scratch (2*32*D + 2*64*D +
     * 32*64 floats, 56 KB at D=64) fits L2. Measured with `flashcl bench
     * --shape 1,8,2048,64 --dtype f16` on PoCL (2-core Xeon, median ms,
     * non-causal): 32x64 297, 64x64 286, 16x64 409, 32x32 368, 32x128 479;
     * 64 rows was within noise of 32 and doubles the idle tail of causal
     * blocks, so 32. */
    {"CPU", NULL, "cpu", ANY, 1, 256, PHASE_ANY, ANY, 32, 64, 0, 0,
     "measured: PoCL 2-core Xeon, 1,8,2048,64 f16"},
    /* GPU (cl/flash_fwd.cl): 16 rows x 8 work-items (128 work-items, 4 warps
     * / 2 wavefronts), 32-key tiles; 16 keys above D=128 so that Q + K/V stay
     * near 34 KB, under NVIDIA's ~47 KB. Hand-chosen for latency hiding with
     * several work-groups per compute unit. */
    {"GPU", NULL, "portable", ANY, 1, 128, PHASE_ANY, ANY, 16, 32, 8, 0,
     "hand-chosen: 128 work-items, several groups per CU"},
    {"GPU", NULL, "portable", ANY, 129, 256, PHASE_ANY, ANY, 16, 16, 8, 0,
     "hand-chosen: Q + K/V near 34 KB at D=256"},
};
static const flashcl_param_entry builtin_global[] = {
    {"*", NULL, "portable", ANY, 1, 128, PHASE_ANY, ANY, 16, 32, 8, 0, "as the GPU default"},
    {"*", NULL, "portable", ANY, 129, 256, PHASE_ANY, ANY, 16, 16, 8, 0, "as the GPU default"},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ---- the per-context state: the tuning file, overrides and source strings ---------------- */

typedef struct interned {
    struct interned *next;
    char text[];
} interned;

struct flashcl_param_db {
    flashcl_tuning_data file;
    int file_loaded;
    flashcl_param_entry *overrides; /* flashcl_set_params, newest last */
    size_t num_overrides;
    interned *strings;
};

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

/* The context's database, created on first use. The context is logically
 * const here: the database is a cache of the file and of source strings. */
static struct flashcl_param_db *get_db(const flashcl_context *cctx) {
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

/* A string that lives as long as the context (for params->source). */
static const char *intern(const flashcl_context *ctx, const char *fmt, const char *a, const char *b) {
    static const char fallback[] = "(out of memory)";
    struct flashcl_param_db *db = get_db(ctx);
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

/* ---- fitting ----------------------------------------------------------------------------- */

/* cl/flash_fwd_sm90.cl's Q_PER_TILE: Q keeps a __local block of its own
 * beside one K and one V tile wherever the three fit in FLASHCL_NV_LOCAL_LIMIT bytes (with
 * the kernel's 1024 of alignment room), which is every head dim <= 64 and,
 * above, one warpgroup with 48-key tiles. */
static int wgmma_q_own_block(int head_dim, int block_m, int block_n) {
    const size_t dpad = ((size_t)head_dim + 63) / 64 * 64;
    return dpad == 64 || ((size_t)block_m + 2 * (size_t)block_n) * dpad * 2 + 1024 <= FLASHCL_NV_LOCAL_LIMIT;
}

int flashcl_lpt_heads(const flashcl_attention_desc *r, const char *variant) {
    /* Chunks of 8 pairs: on the H200 causal (4,32,4096,64) nv-mma ran 273-274
     * TFLOP/s at 8, 32 and 128 pairs a chunk, against 256 by head; the
     * smallest keeps the fewest heads' K and V in L2 at a time. The nv-mma
     * backward gained 1-4 %, nv-tf32 2-3 %. nv-wgmma lost 1-11 % with its
     * cp.async tiles; with one warpgroup of 64-key TMA tiles it gains 1-2 %
     * (causal f16 (4,32,4096,128) 501 against 494 TFLOP/s, D=64 396 against
     * 388; 16 and 32 pairs within 1 % of it). nv-tf32 takes chunks of 16: causal f32
     * (4,32,4096,128) ran 46.1 TFLOP/s at 16 against 44.7 at 8, 42.5 at 4
     * and 41.4 at 2 (D=64: 50.0 against 49.4). */
    if (!(r->window_left < 0 && r->window_right >= 0))
        return 0;
    return variant && !strcmp(variant, "nv-tf32") ? 16 : 8;
}

int flashcl_nv_wgmma_max_registers(const flashcl_params *p, int head_dim) {
    /* Above head dim 64, Q reloaded every tile frees its 32 registers outside
     * the S chain, and one warpgroup fits 168 without spilling (ptxas on the
     * H200: 162, against 198 uncapped without the reload): 3 x 128 x 168 of
     * the SM's 65536 registers, three groups an SM. Capped, the causal
     * (4,32,4096,128) ran 290 TFLOP/s against 268 uncapped (BENCHMARKS.md). */
    if (p->variant && !strcmp(p->variant, "nv-wgmma") && head_dim > 64 && p->work_group_size == 128 &&
        wgmma_q_own_block(head_dim, p->block_m, p->block_n))
        return 168;
    return 0;
}

size_t flashcl_forward_local_bytes(const flashcl_params *p, int head_dim) {
    size_t d = (size_t)head_dim, m = (size_t)p->block_m, n = (size_t)p->block_n, floats;
    if (!strcmp(p->variant, "cpu")) { /* q, acc, K^T, V, S: see cl/flash_fwd_cpu.cl */
        size_t dpad = (d + 31) / 32 * 32;
        floats = m * d + m * dpad + n * d + n * dpad + m * n;
    } else if (!strcmp(p->variant, "portable")) { /* q, K/V, S, reductions (+1 padding per row) */
        /* RPT in cl/flash_fwd.cl: 2 rows per work-item where the tiles divide,
         * and then a row's reduction has 2*TPR partials */
        const size_t tpr = (size_t)p->threads_per_row;
        const size_t rpt = tpr && m % 2 == 0 && n % (2 * tpr) == 0 ? 2 : 1;
        floats = m * (d + 1) + n * (d + 1) + m * (n + 1) + m * tpr * rpt;
    } else if (!strcmp(p->variant, "nv-mma")) { /* halves: max(Q block, K + V stages), see SMEM_HALFS */
        size_t pitch = (d + 15) / 16 * 16 + 8, qh = m * pitch;
        size_t stages = 4 * n * pitch * 2 <= FLASHCL_NV_LOCAL_LIMIT ? 2 : 1; /* the kernel double-buffers when it fits */
        size_t kv = 2 * stages * n * pitch;
        return (qh > kv ? qh : kv) * 2;
    } else if (!strcmp(p->variant, "nv-wgmma")) { /* bytes, see SMEM_BYTES: max(Q, K + V) + 1024 */
        size_t dpad = (d + 63) / 64 * 64, tile = n * dpad * 2, qb = m * dpad * 2, kv = 2 * tile;
        if (wgmma_q_own_block(head_dim, p->block_m, p->block_n)) /* Q_PER_TILE: after K and V */
            return qb + kv + 1024;
        return (qb > kv ? qb : kv) + 1024;
    } else if (!strcmp(p->variant, "nv-tf32")) { /* floats, see SMEM_FLOATS: Q, then K + V stages */
        size_t dpad = (d + 7) / 8 * 8, pitch = dpad + 4;
        size_t k_pitch = d > 64 && dpad % 16 == 0 ? (dpad + 16) / 32 * 32 + 16 : pitch; /* DIM_PERM */
        size_t qf = m * k_pitch, stage = n * (k_pitch + pitch);
        size_t kv_at = d > 64 ? qf : 0; /* Q_IN_SMEM: Q stays, the tiles follow it */
        size_t stages = (kv_at + 2 * stage) * 4 <= FLASHCL_NV_LOCAL_LIMIT ? 2 : 1;
        size_t kv = kv_at + stages * stage;
        return (qf > kv ? qf : kv) * 4;
    } else {
        return 0;
    }
    return floats * sizeof(float);
}

int flashcl_params_fit(const flashcl_context *ctx, int head_dim, const flashcl_params *p, char *why,
                       size_t n) {
    const char *v = p->variant ? p->variant : "";
    size_t local = 0;
    why[0] = '\0';
    if (strcmp(v, "cpu") && strcmp(v, "portable") && !flashcl_variant_is_nv(v))
        snprintf(why, n, "unknown variant '%s' (portable, cpu, nv-mma, nv-tf32, nv-wgmma)", v);
    else if (p->block_m < 1 || p->block_m > 4096 || p->block_n < 1 || p->block_n > 4096)
        snprintf(why, n, "BLOCK_M %d / BLOCK_N %d outside 1..4096", p->block_m, p->block_n);
    else if (!strcmp(v, "cpu") && ctx->info.is_rusticl)
        snprintf(why, n, "%s", FLASHCL_RUSTICL_NO_CPU);
    else if (!strcmp(v, "cpu") && p->block_n % 8)
        snprintf(why, n, "cpu kernel: BLOCK_N %d is not a multiple of 8", p->block_n);
    else if (!strcmp(v, "portable") && (p->threads_per_row < 1 || p->block_n % p->threads_per_row))
        snprintf(why, n, "portable kernel: BLOCK_N %d is not a multiple of TPR %d", p->block_n,
                 p->threads_per_row);
    else if (!strcmp(v, "nv-mma") &&
             (p->work_group_size < 32 || p->work_group_size % 32 ||
              p->block_m % (p->work_group_size / 2) || p->block_n % 16))
        snprintf(why, n,
                 "tensor-core kernel: BLOCK_M %d must be a multiple of 16*WARPS (WARPS %d) and "
                 "BLOCK_N %d of 16",
                 p->block_m, p->work_group_size / 32, p->block_n);
    else if (!strcmp(v, "nv-wgmma") && (p->work_group_size < 128 || p->work_group_size % 128 ||
                                         p->block_m != p->work_group_size / 2 ||
                                         (p->block_n != 64 && p->block_n != 48)))
        snprintf(why, n, "wgmma kernel: WARPS %d must be a multiple of 4, BLOCK_M %d 16*WARPS and BLOCK_N %d "
                 "48 or 64", p->work_group_size / 32, p->block_m, p->block_n);
    else if (!strcmp(v, "nv-wgmma") && (head_dim < 32 || head_dim > 128))
        snprintf(why, n, "wgmma kernel: head_dim %d outside 32..128", head_dim);
    else if (!strcmp(v, "nv-tf32") && (p->work_group_size < 32 || p->work_group_size % 32 ||
                                        p->block_m != p->work_group_size / 2 || p->block_n % 8))
        snprintf(why, n, "float32 tensor-core kernel: BLOCK_M %d must be 16*WARPS (WARPS %d) and BLOCK_N %d a "
                 "multiple of 8", p->block_m, p->work_group_size / 32, p->block_n);
    else if (!strcmp(v, "nv-tf32") && head_dim > 128)
        snprintf(why, n, "float32 tensor-core kernel: head_dim %d over 128", head_dim);
    else if (flashcl_variant_is_nv(v) && flashcl_forward_local_bytes(p, head_dim) > FLASHCL_NV_LOCAL_LIMIT)
        snprintf(why, n, "tensor-core kernel: %zu bytes of tiles, over its 48000-byte limit",
                 flashcl_forward_local_bytes(p, head_dim));
    else if (!ctx->is_host && (local = flashcl_forward_local_bytes(p, head_dim)) > ctx->info.local_mem)
        snprintf(why, n, "%zu bytes of local memory needed, the device has %llu", local,
                 (unsigned long long)ctx->info.local_mem);
    else if (!ctx->is_host && (size_t)p->work_group_size > ctx->info.max_wg)
        snprintf(why, n, "work-group of %d exceeds the device's %zu", p->work_group_size,
                 ctx->info.max_wg);
    return why[0] == '\0';
}

/* ---- problem classes and matching ------------------------------------------------------- */

static int phase_of(const flashcl_attention_desc *d) {
    return d->seqlen_q == 1 ? FLASHCL_PHASE_DECODE : FLASHCL_PHASE_PREFILL;
}

/* desc->causal, or a resolved window that is causal. */
static int causal_of(const flashcl_attention_desc *d) {
    return d->causal != 0;
}

void flashcl_head_dim_bucket(int head_dim, int *lo, int *hi) {
    *lo = head_dim <= 64 ? 1 : head_dim <= 128 ? 65 : 129;
    *hi = head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

/* -1 when e does not apply to desc, else how specific it is (higher wins). */
static int class_match(const flashcl_param_entry *e, const flashcl_attention_desc *d) {
    if ((e->dtype >= 0 && e->dtype != (int)d->dtype) || d->head_dim < e->head_dim_min ||
        d->head_dim > e->head_dim_max || (e->phase && e->phase != phase_of(d)) ||
        (e->causal >= 0 && e->causal != causal_of(d)))
        return -1;
    return (e->dtype >= 0) + (e->phase != 0) + (e->causal >= 0) +
           (e->head_dim_min > 1 || e->head_dim_max < 256);
}

static int variant_applies(const flashcl_context *ctx, const flashcl_attention_desc *d, const char *v) {
    /* See FLASHCL_RUSTICL_NO_CPU. */
    if (v && !strcmp(v, "cpu") && ctx->info.is_rusticl)
        return 0;
    if (v && !strcmp(v, "nv-mma"))
        return flashcl_nv_mma_eligible(ctx, d);
    if (v && !strcmp(v, "nv-wgmma"))
        return flashcl_nv_wgmma_eligible(ctx, d);
    if (v && !strcmp(v, "nv-tf32"))
        return flashcl_nv_tf32_eligible(ctx, d);
    return v != NULL;
}

static void entry_params(const flashcl_param_entry *e, flashcl_params *p) {
    memset(p, 0, sizeof *p);
    p->block_m = e->block_m;
    p->block_n = e->block_n;
    p->variant = e->variant;
    if (!strcmp(e->variant, "portable")) {
        p->threads_per_row = e->threads_per_row;
        p->work_group_size = e->block_m * e->threads_per_row;
    } else if (flashcl_variant_is_nv(e->variant)) {
        p->work_group_size = 32 * e->warps;
    } else {
        p->work_group_size = 1;
    }
}

int flashcl_variant_is_nv(const char *variant) {
    return variant && (!strcmp(variant, "nv-mma") || !strcmp(variant, "nv-tf32") || !strcmp(variant, "nv-wgmma"));
}

/* NVIDIA sm_80+ and not FLASHCL_VARIANT=portable. */
static int nv_tensor_cores(const flashcl_context *ctx) {
    const char *force = getenv("FLASHCL_VARIANT");
    return !(force && !strcmp(force, "portable")) && !ctx->is_host && ctx->info.nv_cc_major >= 8;
}

int flashcl_nv_mma_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc) {
    return nv_tensor_cores(ctx) && desc->dtype != FLASHCL_FLOAT32 && desc->head_dim >= 32 && desc->head_dim <= 256;
}

/* sm_90a code runs on compute capability 9.0 exactly; the kernel takes head dims 32..128. */
int flashcl_nv_wgmma_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc) {
    const char *force = getenv("FLASHCL_VARIANT");
    return nv_tensor_cores(ctx) && !ctx->no_sm90a && !(force && !strcmp(force, "nv-mma")) &&
           ctx->info.nv_cc_major == 9 && ctx->info.nv_cc_minor == 0 && desc->dtype != FLASHCL_FLOAT32 &&
           desc->head_dim >= 32 && desc->head_dim <= 128;
}

int flashcl_nv_tf32_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc) {
    return nv_tensor_cores(ctx) && desc->dtype == FLASHCL_FLOAT32 && desc->head_dim <= 128;
}

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

enum { LVL_SET, LVL_FILE, LVL_DEVICE, LVL_ARCH, LVL_VENDOR, LVL_TYPE, LVL_GLOBAL, LVL_COUNT };

static int level_key_match(const flashcl_context *ctx, int level, const flashcl_param_entry *e,
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

static const char *level_source(const flashcl_context *ctx, int level, const flashcl_param_entry *e) {
    struct flashcl_param_db *db = get_db(ctx);
    switch (level) {
    case LVL_SET: return "set: flashcl_set_params";
    case LVL_FILE: return intern(ctx, "tuned: %s%s", db ? db->file.path : "?", NULL);
    case LVL_DEVICE: return intern(ctx, "built-in device: %s%s", e->match, NULL);
    case LVL_ARCH: return intern(ctx, "built-in arch: %s%s", e->match, NULL);
    case LVL_VENDOR: return intern(ctx, "built-in vendor: %s%s", e->match, NULL);
    case LVL_TYPE: return intern(ctx, "default: %s%s", e->match, NULL);
    default: return "default: global";
    }
}

/* The serving and backward tables: one array per level (the tuning file's
 * entries, then the built-in tables), walked with the forward's level keys.
 * Their entry types differ but open with the key: `const char *match, *driver`. */
typedef struct level_table {
    int level;
    const void *entries; /* count entries of size bytes */
    size_t count, size;
} level_table;
#define LEVEL_TABLE(level, a) {level, a, COUNT(a), sizeof((a)[0])}
/* The tuning file's entries (count of them), then the built-in tables
 * <name>_device, _arch, _vendor, _type and _global. */
#define FILE_AND_BUILTIN_LEVELS(entries, count, name)                                                   \
    {LVL_FILE, entries, count, sizeof((name##_global)[0])}, LEVEL_TABLE(LVL_DEVICE, name##_device),       \
        LEVEL_TABLE(LVL_ARCH, name##_arch), LEVEL_TABLE(LVL_VENDOR, name##_vendor),                     \
        LEVEL_TABLE(LVL_TYPE, name##_type), LEVEL_TABLE(LVL_GLOBAL, name##_global)
_Static_assert(offsetof(flashcl_serving_entry, driver) == sizeof(const char *) &&
                   offsetof(flashcl_backward_entry, driver) == sizeof(const char *),
               "level table entries open with match, driver");

/* The first entry, most specific level first, whose key matches this device
 * and that applies (applies NULL: every entry); *level and *source name its
 * level. NULL, with both untouched, when none does. */
static const void *walk_levels(const flashcl_context *ctx, const level_table *levels, size_t num_levels,
                               int (*applies)(const flashcl_context *ctx, int level, const void *entry,
                                              const void *arg),
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
            if (key.match && level_key_match(ctx, levels[l].level, &key, arch) &&
                (!applies || applies(ctx, levels[l].level, entry, arg))) {
                *level = levels[l].level;
                *source = level_source(ctx, levels[l].level, &key);
                return entry;
            }
        }
    return NULL;
}

/* Shrinks a default to the device: keys per tile first, then rows. 1 KB is
 * left for the driver (NVIDIA refuses launches at the reported limit). */
static int shrink_to_fit(const flashcl_context *ctx, int head_dim, flashcl_params *p) {
    size_t budget = ctx->info.local_mem > 2048 ? (size_t)ctx->info.local_mem - 1024 : 0;
    int min_n = !strcmp(p->variant, "cpu") ? 8 : p->threads_per_row ? p->threads_per_row : 1;
    int shrunk = 0;
    while (p->block_n > min_n && flashcl_forward_local_bytes(p, head_dim) > budget)
        p->block_n /= 2, shrunk = 1;
    while (p->block_m > 1 && (flashcl_forward_local_bytes(p, head_dim) > budget ||
                              (size_t)p->block_m * (size_t)p->threads_per_row > ctx->info.max_wg))
        p->block_m /= 2, shrunk = 1;
    if (p->threads_per_row)
        p->work_group_size = p->block_m * p->threads_per_row;
    if (!strcmp(p->variant, "cpu") && flashcl_forward_local_bytes(p, head_dim) > budget) {
        /* The CPU kernel keeps a work-item's rows and 8 keys of D floats each:
         * where even one row does not fit (D=256 in 16 KB), the portable
         * kernel, whose work-items share their tiles, does. */
        const char *source = p->source;
        entry_params(&builtin_global[head_dim > 128], p);
        shrink_to_fit(ctx, head_dim, p);
        p->source = source;
        return 1;
    }
    return shrunk;
}

int flashcl_params_halve(flashcl_params *p) {
    int min_n = !strcmp(p->variant, "cpu") ? 8 : p->threads_per_row ? p->threads_per_row : 1;
    if (flashcl_variant_is_nv(p->variant))
        return 0;
    if (p->block_n / 2 >= min_n && (p->block_n / 2) % min_n == 0)
        p->block_n /= 2;
    else if (p->block_m > 1)
        p->block_m /= 2;
    else
        return 0;
    if (p->threads_per_row)
        p->work_group_size = p->block_m * p->threads_per_row;
    return 1;
}

/* Walks the levels; returns 1 with *p filled (always, unless out of memory). */
static int lookup(const flashcl_context *ctx, const flashcl_attention_desc *desc, int first_level,
                  flashcl_params *p) {
    struct flashcl_param_db *db = get_db(ctx);
    char arch[64], why[200];
    flashcl_device_arch(ctx, arch, sizeof arch);
    for (int level = first_level; level < LVL_COUNT; ++level) {
        const flashcl_param_entry *table = NULL;
        size_t count = 0;
        switch (level) {
        case LVL_SET: table = db ? db->overrides : NULL, count = db ? db->num_overrides : 0; break;
        case LVL_FILE: table = db ? db->file.entries : NULL, count = db ? db->file.count : 0; break;
        case LVL_DEVICE: table = builtin_device, count = COUNT(builtin_device); break;
        case LVL_ARCH: table = builtin_arch, count = COUNT(builtin_arch); break;
        case LVL_VENDOR: table = builtin_vendor, count = COUNT(builtin_vendor); break;
        case LVL_TYPE: table = builtin_type, count = COUNT(builtin_type); break;
        default: table = builtin_global, count = COUNT(builtin_global); break;
        }
        const flashcl_param_entry *best = NULL;
        int best_score = -1;
        for (size_t i = 0; i < count; ++i) {
            const flashcl_param_entry *e = &table[i];
            int score;
            if (!e->match || !variant_applies(ctx, desc, e->variant) ||
                !level_key_match(ctx, level, e, arch) || (score = class_match(e, desc)) < 0)
                continue;
            /* Newer overrides win ties: >= keeps the last of equals. */
            if (level == LVL_SET ? score < best_score : score <= best_score)
                continue;
            flashcl_params cand;
            entry_params(e, &cand);
            if (level < LVL_TYPE && !flashcl_params_fit(ctx, desc->head_dim, &cand, why, sizeof why)) {
                flashcl_log("parameters from %s passed over: %s", level_source(ctx, level, e), why);
                continue;
            }
            best = e;
            best_score = score;
        }
        if (!best)
            continue;
        entry_params(best, p);
        p->source = level_source(ctx, level, best);
        if (level >= LVL_TYPE && shrink_to_fit(ctx, desc->head_dim, p))
            p->source = intern(ctx, "%s (shrunk to fit %s)", p->source, ctx->info.name);
        return 1;
    }
    return 0;
}

int flashcl_variant_params(const flashcl_context *ctx, const flashcl_attention_desc *desc, const char *variant,
                           flashcl_params *p) {
    /* The tensor-core variants' tiles are the architecture table's, where
     * one of its entries applies to the problem on this device. */
    for (size_t i = 0; i < COUNT(builtin_arch); ++i) {
        const flashcl_param_entry *e = &builtin_arch[i];
        if (!strcmp(e->variant, variant) && flashcl_variant_is_nv(variant) && variant_applies(ctx, desc, variant) &&
            class_match(e, desc) >= 0) {
            entry_params(e, p);
            p->source = "FLASHCL_PARAMS";
            return 1;
        }
    }
    if (strcmp(variant, "cpu") && strcmp(variant, "portable"))
        return 0;
    entry_params(!strcmp(variant, "cpu") ? &builtin_type[0] : &builtin_global[desc->head_dim > 128], p);
    shrink_to_fit(ctx, desc->head_dim, p);
    p->source = "FLASHCL_PARAMS";
    return 1;
}

/* The kernel that cannot fail to apply: the type default (cl/flash_fwd_cpu.cl
 * on CPUs, cl/flash_fwd.cl elsewhere) and the host path without OpenCL. */
void flashcl_fallback_params(const flashcl_context *ctx, const flashcl_attention_desc *desc,
                             flashcl_params *p) {
    memset(p, 0, sizeof *p);
    if (ctx->is_host) {
        p->block_m = 16;
        p->block_n = 64;
        p->work_group_size = 1;
        p->variant = "host";
        p->source = "built-in: host path";
        return;
    }
    if (!lookup(ctx, desc, LVL_TYPE, p)) { /* out of memory for source strings only */
        entry_params(&builtin_global[desc->head_dim > 128], p);
        shrink_to_fit(ctx, desc->head_dim, p);
        p->source = "default: global";
    }
}

void flashcl_default_params(const flashcl_context *ctx, const flashcl_attention_desc *desc,
                            flashcl_params *p) {
    if (ctx->is_host || !lookup(ctx, desc, LVL_SET, p))
        flashcl_fallback_params(ctx, desc, p);
}

int flashcl_params_explicit(const flashcl_params *p) {
    return p->source && (!strcmp(p->source, "set: flashcl_set_params") ||
                         !strncmp(p->source, "FLASHCL_PARAMS", 14));
}

/* ---- public: overrides and the tuning file ---------------------------------------------- */

/* The class key of desc: its dtype, head_dim bucket, phase and causality. */
static void class_entry(const flashcl_attention_desc *d, flashcl_param_entry *e) {
    memset(e, 0, sizeof *e);
    e->dtype = (int)d->dtype;
    flashcl_head_dim_bucket(d->head_dim, &e->head_dim_min, &e->head_dim_max);
    e->phase = phase_of(d);
    e->causal = causal_of(d);
}

static int same_class(const flashcl_param_entry *a, const flashcl_param_entry *b) {
    return a->dtype == b->dtype && a->head_dim_min == b->head_dim_min &&
           a->head_dim_max == b->head_dim_max && a->phase == b->phase && a->causal == b->causal;
}

/* Checks params for desc's class on ctx and fills e from them. */
static flashcl_status params_entry(flashcl_context *ctx, const flashcl_attention_desc *d,
                                   const flashcl_params *params, flashcl_param_entry *e) {
    static const char *const names[] = {"portable", "cpu", "nv-mma", "nv-tf32", "nv-wgmma"};
    flashcl_params p = *params;
    char why[200];
    class_entry(d, e);
    for (size_t i = 0; i < COUNT(names); ++i)
        if (p.variant && !strcmp(p.variant, names[i]))
            e->variant = names[i];
    if (!e->variant)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                            "unknown variant '%s' (portable, cpu, nv-mma, nv-tf32, nv-wgmma)", p.variant ? p.variant : "(null)");
    if (!variant_applies(ctx, d, e->variant))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                            !strcmp(e->variant, "nv-mma")
                                ? "the nv-mma kernel does not apply here (NVIDIA sm_80+, f16/bf16, D 32..256)"
                            : !strcmp(e->variant, "nv-wgmma")
                                ? "the nv-wgmma kernel does not apply here (NVIDIA sm_90, f16/bf16, D 32..128)"
                                : "the nv-tf32 kernel does not apply here (NVIDIA sm_80+, f32, D <= 128)");
    p.variant = e->variant;
    if (!strcmp(e->variant, "portable"))
        p.work_group_size = p.block_m * p.threads_per_row;
    else if (!strcmp(e->variant, "cpu"))
        p.work_group_size = 1, p.threads_per_row = 0;
    else
        p.threads_per_row = 0;
    if (!flashcl_params_fit(ctx, d->head_dim, &p, why, sizeof why))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "%s", why);
    e->block_m = p.block_m;
    e->block_n = p.block_n;
    e->threads_per_row = p.threads_per_row;
    e->warps = flashcl_variant_is_nv(e->variant) ? p.work_group_size / 32 : 0;
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_set_params(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                  const flashcl_params *params) {
    FLASHCL_LOCKED(ctx);
    if (!ctx)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    flashcl_attention_desc d;
    if (!desc)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
    d = *desc;
    if (flashcl_attention_desc_resolve(&d) != FLASHCL_SUCCESS)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc does not resolve (see flashcl_attention_desc_resolve)");
    if (ctx->is_host)
        return flashcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "a host context has no kernel parameters");
    struct flashcl_param_db *db = get_db(ctx);
    if (!db)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of memory");
    flashcl_param_entry e;
    if (!params) { /* remove this class's override */
        class_entry(&d, &e);
        size_t kept = 0;
        for (size_t i = 0; i < db->num_overrides; ++i)
            if (!same_class(&db->overrides[i], &e))
                db->overrides[kept++] = db->overrides[i];
        db->num_overrides = kept;
        return FLASHCL_SUCCESS;
    }
    flashcl_status st = params_entry(ctx, &d, params, &e);
    if (st != FLASHCL_SUCCESS)
        return st;
    e.match = "set";
    for (size_t i = 0; i < db->num_overrides; ++i)
        if (same_class(&db->overrides[i], &e)) {
            db->overrides[i] = e;
            return FLASHCL_SUCCESS;
        }
    flashcl_param_entry *grown = realloc(db->overrides, (db->num_overrides + 1) * sizeof *grown);
    if (!grown)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of memory");
    db->overrides = grown;
    db->overrides[db->num_overrides++] = e;
    return FLASHCL_SUCCESS;
}

const char *flashcl_tuning_file(flashcl_context *ctx, const char **problem) {
    FLASHCL_LOCKED(ctx);
    if (problem)
        *problem = NULL;
    if (!ctx || ctx->is_host)
        return NULL;
    struct flashcl_param_db *db = get_db(ctx);
    if (!db || !db->file.path)
        return NULL;
    if (problem)
        *problem = db->file.problem;
    return db->file.path;
}

flashcl_status flashcl_tuning_file_save(flashcl_context *ctx, const char *path,
                                        const flashcl_attention_desc *desc,
                                        const flashcl_params *params, const char *comment) {
    FLASHCL_LOCKED(ctx);
    if (!ctx || !params)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(ctx);
    if (!desc)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
    if (ctx->is_host)
        return flashcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "a host context has no kernel parameters");
    flashcl_attention_desc d = *desc;
    if (flashcl_attention_desc_resolve(&d) != FLASHCL_SUCCESS)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc does not resolve");
    char def[4096], err[600];
    if (!path || !path[0]) {
        if (!flashcl_tuning_path(def, sizeof def))
            return flashcl_fail(ctx, FLASHCL_ERROR_TUNING_FILE,
                                "no tuning file path: set FLASHCL_TUNING_FILE, XDG_CONFIG_HOME or HOME");
        path = def;
    }
    flashcl_param_entry e;
    flashcl_status st = params_entry(ctx, &d, params, &e);
    if (st != FLASHCL_SUCCESS)
        return st;
    e.match = ctx->info.name;
    e.driver = ctx->info.driver;
    if (flashcl_tuning_store(path, &e, comment, err, sizeof err) != 0)
        return flashcl_fail(ctx, FLASHCL_ERROR_TUNING_FILE, "%s", err);
    return FLASHCL_SUCCESS;
}

/* ==== Serving kernels: the kernel, its tiles, the split-KV heuristic ========================
 * Everything flashcl_paged_attention and flashcl_varlen_forward launch with is
 * chosen here. The database has its own small tables, walked with the same
 * level keys as the forward's (the tuning file's "serving" entries, "tuned:
 * <path>", then exact device, architecture, vendor, device type, global),
 * then FLASHCL_DECODE_PARAMS may replace single values
 * ("KERNEL=decode,UNROLL=2", keys below; malformed is an error, as
 * FLASHCL_PARAMS). A tuning-file entry whose choice for the problem does not
 * fit the device (decode_fit: work-group, __local, the kernel's rules) is
 * passed over with a log line; built-in entries are trusted, the choices
 * derived from them adapt. An entry gives:
 *   kernel    mma (cl/paged_decode_nv.cl) or decode (cl/paged_decode.cl)
 *             when every block has at most max_rows rows (8 for the decode
 *             kernel under an mma entry) and the kernel applies (NVIDIA sm_80+
 *             f16/bf16; 16-byte aligned K/V rows); otherwise, and for tiled
 *             entries, cl/paged_attention.cl.
 *   wg, unroll, stages the decode kernel's work-group, keys per slot per step
 *                      and pipeline depth (steps of K/V in __local; fewer
 *                      when they do not fit).
 *   wgs_per_cu, min_split_keys   split-KV: when blocks * heads_k work-groups
 *             cannot give each compute unit wgs_per_cu of them, the keys are
 *             cut into as many slices as fit that (rounded down), never
 *             shorter than min_split_keys
 *             (below that the combine pass and the per-slice q load cost more
 *             than the parallelism gains), at most FLASHCL_MAX_SPLITS.
 * Not stored: META_ARGS (FLASHCL_DECODE_PARAMS, else BY_VALUE_DEFAULT) passes
 * the decode kernels' batch description, and an append's slot list, as a
 * by-value kernel argument when it fits the device's argument space, instead
 * of an upload (serving.c, kv_cache.c).
 * Derived, not stored: REG_COPY_MIN_KEYS and L2_PREFETCH (the mma kernel's,
 * see decode_derive; FLASHCL_DECODE_PARAMS may set them); rows per block
 * (the smallest power of two >= the longest sequence's rows, so decode
 * with a GQA group of 4 gets 4 rows and every K/V element loaded serves the
 * 4 heads that share it), the decode kernel's lanes per key (one 16-byte chunk each, up to 32), and the tiled
 * kernel's tiles: 128 work-items on GPUs (tpr = 128 / rows, at most 32),
 * one per row on CPUs (no reductions); 32-key tiles, 16 above D=128, halved
 * until they fit __local with 1 KB to spare.
 */
/* {match, driver, kernel, max_rows, work_group_size, unroll, stages, wgs_per_cu,
 *  min_split_keys, why}: declared in internal.h, the tuning file holds them too. */
typedef flashcl_serving_entry decode_entry;

#define TILED FLASHCL_SERVING_TILED
#define DECODE_K FLASHCL_SERVING_DECODE
#define DECODE_MMA FLASHCL_SERVING_DECODE_MMA
static const decode_entry decode_device[] = {{NULL, NULL, 0, 0, 0, 0, 0, 0, 0, NULL}};
static const decode_entry decode_arch[] = {
    /* Tensor cores (cl/paged_decode_nv.cl) for f16/bf16 with D a multiple
     * of 16; other problems fall to the SIMT decode kernel, then the tiled
     * one. 2 warps, 16-key tiles, 2 stages: 35 KB of __local at D=128, 17.8
     * under REG_COPY (1 warp above D=128). H200, `bench/h200.sh decode`, µs
     * at batch 1/8/64 x context 4k/32k/128k: 1 warp with 4 stages or 32-key tiles 5-20 %
     * slower everywhere; slices of at least 512 keys beat 256 at 6 of 9
     * shapes ((1, 32768) 88 against 110 µs; (1, 4096) 56 against 52).
     * 4 work-groups per compute unit: at up to 255 registers a thread (REG_COPY;
     * 168 with cp.async), 4 of these 64-thread groups fit an SM's registers
     * at once, so the splits fill exactly one wave (8, two waves: level or
     * 1 % slower at batch 16, 2026-12-03, b4f8851). Against 16 (nearly 4 waves) at batch 1/4/16 x
     * context 16k/64k/128k: 6 shapes 3-9 % faster ((1, 65536) 127 against
     * 139-143 µs), 3 level; 5, 8, 10 and 32 were slower. */
    {"sm_80+", NULL, DECODE_MMA, 16, 64, 0, 2, 4, 512, "measured on the H200, see BENCHMARKS.md"},
};
static const decode_entry decode_vendor[] = {{NULL, NULL, 0, 0, 0, 0, 0, 0, 0, NULL}};
static const decode_entry decode_type[] = {
    /* PoCL runs a work-group as a loop over work-items: the tiled kernel
     * with one work-item per row has no reductions; the decode kernel's
     * shuffles would become __local round trips. One group per core. */
    {"CPU", NULL, TILED, 0, 1, 1, 2, 1, 256, "hand-chosen: no cross-work-item reductions on a CPU"},
    {"GPU", NULL, DECODE_K, 8, 128, 4, 2, 16, 256, "measured on the H200, see the comment above"},
};
static const decode_entry decode_global[] = {
    {"*", NULL, TILED, 0, 128, 1, 2, 2, 256, "as the GPU tiled kernel"},
};
#undef TILED
#undef DECODE_K
#undef DECODE_MMA

static int next_pow2(int x) {
    int p = 1;
    while (p < x)
        p *= 2;
    return p;
}

size_t flashcl_decode_local_bytes(const flashcl_decode_choice *c, int head_dim) {
    size_t d = (size_t)head_dim, m = (size_t)c->block_m, n = (size_t)c->block_n;
    if (c->kernel == FLASHCL_SERVING_DECODE_MMA && c->head_group > 0) {
        /* halves: a V tile a warp (then the warps' O rows), or the final merge's split weights;
         * rows' LSEs, a flag */
        const size_t warps = (size_t)c->head_group * (size_t)(c->head_warps > 1 ? c->head_warps : 1), tiles = warps * n * (d + 8),
                     weights = warps * m * FLASHCL_MAX_SPLITS * 2;
        return (tiles > weights ? tiles : weights) * 2 + (warps * 16 + 1) * sizeof(float);
    }
    if (c->kernel == FLASHCL_SERVING_DECODE_MMA) { /* halves: Q, then per warp buffers x (K, V); merge floats */
        const size_t warps = (size_t)(c->work_group_size / 32);
        const size_t bufs = c->reg_copy ? 1 : (size_t)c->stages; /* REG_COPY: the next tile is in registers */
        size_t q = 16 * (d + 8), tiles = warps * bufs * 2 * n * (d + 8);
        const size_t halves = d > 128 ? q + tiles : (q > tiles ? q : tiles); /* Q_IN_LOCAL above D=128 */
        return halves * 2 + (warps * 32 + 33) * sizeof(float);
    }
    if (c->kernel == FLASHCL_SERVING_DECODE) { /* slot merge (m, l, one row's O) + lane exchange */
        size_t slots = (size_t)(c->work_group_size / c->lanes), wg = (size_t)c->work_group_size;
        size_t chunks = (d / (size_t)c->vec + (size_t)c->lanes - 1) / (size_t)c->lanes; /* per lane */
        size_t stages = (size_t)c->stages * (size_t)c->unroll * 2 * chunks * wg * 16;
        return (2 * slots * m + slots * d + m * wg + m * FLASHCL_MAX_SPLITS) * sizeof(float) + stages;
    }
    size_t floats = m * (d + 1) + n * (d + 1) + m * (n + 1) + m * (size_t)c->tpr;
    return floats * sizeof(float) + n * sizeof(cl_long); /* + the key-row table */
}

/* Small per-call arrays go by value (META_ARGS=1) unless FLASHCL_DECODE_PARAMS
 * says META_ARGS=0: on the H200 a decode call is 8-15 us shorter without its
 * upload (the context-16 floor 38.8 -> 29.5 us), and test_serving's mma and
 * by-value suites pass there (BENCHMARKS.md). A description or slot list
 * too large for the argument space is uploaded as before. */
#define BY_VALUE_DEFAULT 1

int flashcl_serving_by_value(void) {
    const char *s = getenv("FLASHCL_DECODE_PARAMS");
    flashcl_kv kv;
    int item, on = BY_VALUE_DEFAULT, value;
    while (s && (item = flashcl_kv_next(&s, &kv)) == FLASHCL_KV_ITEM)
        if (flashcl_kv_key(&kv, "META_ARGS") && flashcl_kv_int(&kv, 0, 1, &value))
            on = value;
    return on;
}

/* FLASHCL_DECODE_PARAMS: KERNEL=tiled|decode|mma and integer KEY=VALUE pairs. */
/* The integer keys of FLASHCL_DECODE_PARAMS and the choice fields they set. */
static const struct {
    const char *key;
    size_t offset;
} decode_keys[] = {
    {"BLOCK_M", offsetof(flashcl_decode_choice, block_m)},
    {"BLOCK_N", offsetof(flashcl_decode_choice, block_n)},
    {"TPR", offsetof(flashcl_decode_choice, tpr)},
    {"LANES", offsetof(flashcl_decode_choice, lanes)},
    {"WG", offsetof(flashcl_decode_choice, work_group_size)},
    {"UNROLL", offsetof(flashcl_decode_choice, unroll)},
    {"STAGES", offsetof(flashcl_decode_choice, stages)},
    {"WGS_PER_CU", offsetof(flashcl_decode_choice, wgs_per_cu)},
    {"MIN_SPLIT_KEYS", offsetof(flashcl_decode_choice, min_split_keys)},
    {"META_ARGS", offsetof(flashcl_decode_choice, meta_args)},
    {"REG_COPY_MIN_KEYS", offsetof(flashcl_decode_choice, reg_copy_min_keys)},
    {"HEAD_GROUP", offsetof(flashcl_decode_choice, head_group)},
    {"HEAD_WARPS", offsetof(flashcl_decode_choice, head_warps)},
    {"L2_PREFETCH", offsetof(flashcl_decode_choice, l2_prefetch)},
};
#define DECODE_FIELD(c, i) ((int *)((char *)(c) + decode_keys[i].offset))

static flashcl_status decode_env(flashcl_context *ctx, flashcl_decode_choice *c, int *forced_kernel) {
    const char *env = getenv("FLASHCL_DECODE_PARAMS");
    flashcl_kv kv;
    int item;
    *forced_kernel = -1;
    if (!env || !env[0])
        return FLASHCL_SUCCESS;
    for (const char *s = env; (item = flashcl_kv_next(&s, &kv)) != FLASHCL_KV_END;) {
        if (item == FLASHCL_KV_NO_EQUALS)
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "FLASHCL_DECODE_PARAMS: expected KEY=VALUE at '%s'", kv.at);
        if (item == FLASHCL_KV_TRAILING_COMMA)
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "FLASHCL_DECODE_PARAMS: trailing ',' in '%s'", env);
        if (flashcl_kv_key(&kv, "KERNEL")) {
            if (kv.value_len == 5 && !strncasecmp(kv.value, "tiled", 5))
                *forced_kernel = FLASHCL_SERVING_TILED;
            else if (kv.value_len == 6 && !strncasecmp(kv.value, "decode", 6))
                *forced_kernel = FLASHCL_SERVING_DECODE;
            else if (kv.value_len == 3 && !strncasecmp(kv.value, "mma", 3))
                *forced_kernel = FLASHCL_SERVING_DECODE_MMA;
            else
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                    "FLASHCL_DECODE_PARAMS: KERNEL must be tiled, decode or mma at '%s'", kv.at);
        } else {
            size_t k = 0;
            while (k < COUNT(decode_keys) && !flashcl_kv_key(&kv, decode_keys[k].key))
                ++k;
            if (k == COUNT(decode_keys))
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                    "FLASHCL_DECODE_PARAMS: unknown key at '%s' (KERNEL, BLOCK_M, BLOCK_N, TPR, "
                                    "LANES, WG, UNROLL, STAGES, WGS_PER_CU, MIN_SPLIT_KEYS, META_ARGS, "
                                    "REG_COPY_MIN_KEYS, HEAD_GROUP, HEAD_WARPS, L2_PREFETCH)",
                                    kv.at);
            const size_t off = decode_keys[k].offset;
            const int is_switch = off == offsetof(flashcl_decode_choice, meta_args);
            const int is_l2 = off == offsetof(flashcl_decode_choice, l2_prefetch);
            const int may_be_0 = is_switch || is_l2 || off == offsetof(flashcl_decode_choice, head_group);
            int *field = DECODE_FIELD(c, k);
            if (!flashcl_kv_int(&kv, may_be_0 ? 0 : 1, is_switch ? 1 : 1 << 20, field) ||
                (is_l2 && *field != 0 && *field != 64 && *field != 128 && *field != 256))
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "FLASHCL_DECODE_PARAMS: %s needs %s at '%s'",
                                    decode_keys[k].key,
                                    is_switch ? "0 or 1"
                                    : is_l2   ? "0, 64, 128 or 256"
                                    : may_be_0 ? "an integer 0..1048576"
                                               : "an integer 1..1048576",
                                    kv.at);
        }
        c->source = "FLASHCL_DECODE_PARAMS";
    }
    return FLASHCL_SUCCESS;
}

/* The tensor-core decode kernel's own conditions (its entry's max_rows aside). */
static int decode_mma_applies(const flashcl_context *ctx, const flashcl_decode_problem *pb) {
    const char *force = getenv("FLASHCL_VARIANT");
    return ctx->info.nv_cc_major >= 8 && !(force && !strcmp(force, "portable")) &&
           pb->dtype != FLASHCL_FLOAT32 && pb->head_dim % 16 == 0 && pb->vec_aligned;
}

/* Checks an explicit decode-kernel choice, one kv head a group; "" when it fits. HEAD_GROUP
 * is kept after, only where it fits (decode_head_group): what it falls back to is checked here. */
static void decode_fit(const flashcl_context *ctx, const flashcl_decode_problem *pb,
                       const flashcl_decode_choice *c, char *why, size_t n) {
    const int vec = 16 / (int)flashcl_dtype_size(pb->dtype);
    why[0] = '\0';
    if (c->kernel == FLASHCL_SERVING_DECODE) {
        if (pb->head_dim % vec || !pb->vec_aligned)
            snprintf(why, n, "the decode kernel needs 16-byte aligned K/V rows (head_dim and strides multiples of %d)", vec);
        else if (c->lanes > 32 || (c->lanes & (c->lanes - 1)) || c->work_group_size % c->lanes)
            snprintf(why, n, "LANES %d must be a power of two <= 32 dividing WG %d", c->lanes, c->work_group_size);
        else if (c->block_m > 16 || c->unroll > 16)
            snprintf(why, n, "BLOCK_M %d and UNROLL %d must be <= 16", c->block_m, c->unroll);
        else if (c->stages < 2 || c->stages > 8)
            snprintf(why, n, "STAGES %d must be 2..8", c->stages);
    } else if (c->kernel == FLASHCL_SERVING_DECODE_MMA) {
        if (!decode_mma_applies(ctx, pb))
            snprintf(why, n, "the mma decode kernel needs NVIDIA sm_80+, f16/bf16, head_dim a multiple of 16 "
                             "and 16-byte aligned K/V rows");
        else if (c->block_n % 16 || c->work_group_size % 32 || c->block_m > 16 || c->stages < 2 || c->stages > 8)
            snprintf(why, n, "mma decode: BLOCK_N %d (multiple of 16), WG %d (of 32), BLOCK_M %d (<= 16), "
                             "STAGES %d (2..8)",
                     c->block_n, c->work_group_size, c->block_m, c->stages);
        else if (flashcl_decode_local_bytes(c, pb->head_dim) > FLASHCL_NV_LOCAL_LIMIT)
            snprintf(why, n, "mma decode: %zu bytes of __local, over NVIDIA's ~47 KB",
                     flashcl_decode_local_bytes(c, pb->head_dim));
    } else if (c->block_n % c->tpr) {
        snprintf(why, n, "BLOCK_N %d is not a multiple of TPR %d", c->block_n, c->tpr);
    }
    if (!why[0] && (size_t)c->work_group_size > ctx->info.max_wg)
        snprintf(why, n, "work-group of %d exceeds the device's %zu", c->work_group_size, ctx->info.max_wg);
    else if (!why[0] && flashcl_decode_local_bytes(c, pb->head_dim) > ctx->info.local_mem)
        snprintf(why, n, "%zu bytes of local memory needed, the device has %llu",
                 flashcl_decode_local_bytes(c, pb->head_dim), (unsigned long long)ctx->info.local_mem);
}

/* The kernel and tiles entry e gives for the problem, with the kernel
 * replaced by forced_kernel when that is >= 0 (FLASHCL_DECODE_PARAMS); the
 * split count is left to the caller. */
static void decode_derive(const flashcl_context *ctx, const flashcl_decode_problem *pb, const decode_entry *e,
                          int forced_kernel, flashcl_decode_choice *c) {
    memset(c, 0, sizeof *c);
    int max_rows = 1;
    for (int i = 0; i < pb->num_seqs; ++i)
        if (pb->rows_per_seq[i] > max_rows)
            max_rows = pb->rows_per_seq[i];
    /* rusticl (a CPU device) is given the GPU shape of the tiled kernel:
     * with one work-item a row, a row's D floats of private state gave wrong
     * results there at D=96 (test_serving, f32 page 256), with 4 or more
     * work-items a row none did. */
    const int cpu = (ctx->info.type & CL_DEVICE_TYPE_CPU) != 0 && !ctx->info.is_rusticl;
    const int vec = 16 / (int)flashcl_dtype_size(pb->dtype);
    c->wgs_per_cu = e->wgs_per_cu;
    c->min_split_keys = e->min_split_keys;
    c->meta_args = BY_VALUE_DEFAULT;
    /* The entry's kernel where it applies, else the next simpler one. */
    /* An entry's max_rows is what one block takes; a sequence may use up to
     * DECODE_BLOCKS blocks (each re-reads its K/V), which is how a GQA group
     * wider than a block (MQA with 32 query heads) still decodes here. */
    enum { DECODE_BLOCKS = 4 };
    const int simt_ok = pb->head_dim % vec == 0 && pb->vec_aligned && !cpu;
    if (e->kernel == FLASHCL_SERVING_DECODE_MMA && max_rows <= DECODE_BLOCKS * e->max_rows &&
        decode_mma_applies(ctx, pb))
        c->kernel = FLASHCL_SERVING_DECODE_MMA;
    else if (e->kernel != FLASHCL_SERVING_TILED &&
             max_rows <= DECODE_BLOCKS * (e->kernel == FLASHCL_SERVING_DECODE ? e->max_rows : 8) && simt_ok)
        c->kernel = FLASHCL_SERVING_DECODE;
    else
        c->kernel = FLASHCL_SERVING_TILED;
    if (forced_kernel >= 0)
        c->kernel = forced_kernel;

    c->block_m = next_pow2(max_rows < 16 ? max_rows : 16);
    if (c->kernel == FLASHCL_SERVING_DECODE_MMA) {
        c->block_n = 16;
        /* Copies staged through registers where slices are long: cp.async
         * from OpenCL reads at 3.9 TB/s at most on the H200, loads at 4.5.
         * Batch 1-16 x context 4k-128k, D=128: slices of 1024 keys and more
         * 3-6 % faster than 1d15059's kernel ((16, 65536) 997 against 1035
         * us, (1, 65536) 78 against 83), 512 keys 8 % slower than cp.async
         * (BENCHMARKS.md, 2026-12-03, b4f8851). */
        c->reg_copy_min_keys = 1024; /* where the kernel takes it: decode_reg_copy */
        /* An L2 prefetch of 128 bytes on each 16-byte cp.async, as CUTLASS's
         * sm80 copies issue it. H200, batch 1-16 x context 4k-128k, calls
         * back to back: 1-2.5 % faster at all 12 shapes ((16, 4096) 84.0 ->
         * 82.1 us, (1, 131072) 149.6 -> 146.9); 256 bytes mixed
         * (BENCHMARKS.md, 2026-12-03, b0f15f5). */
        c->l2_prefetch = 128;
        c->stages = e->kernel == FLASHCL_SERVING_DECODE_MMA ? e->stages : 2;
        c->work_group_size = pb->head_dim > 128 ? 32 : 64; /* K/V stages of 2 warps exceed 48 KB above D=128 */
        /* The entry's work-groups per CU count 2-warp groups: 4 on sm_80+,
         * one wave of them at 204-208 registers a thread. The one-warp groups
         * above D=128 are held by __local instead (42.5 KB each at D=256),
         * and 5 fit an H200 SM: with 5 per CU (4 * 5 / 4), batch 1/4/16/64 x
         * context 16k/128k, 5 shapes ran 2-10 % faster than with 16, two
         * level, (1, 16384) 11 % slower; 10 and 20 in between. */
        if (c->work_group_size == 32)
            c->wgs_per_cu = c->wgs_per_cu * 5 / 4;
        /* At D=64 the kernels take 164 registers a thread (one head a group) and 139 (HEAD_GROUP):
         * 12 warps fit an SM, so 6 two-warp groups (4 * 3 / 2). H200, batch 4-32 at 65536 keys
         * and more: 15-17 % faster than with 4 ((16, 131072) 1103 us against 1329); batch 64 has
         * a group for every slot already (2026-12-03, 8ee2e34). */
        if (pb->head_dim == 64)
            c->wgs_per_cu = c->wgs_per_cu * 3 / 2;
        /* At D=32 (HEAD_GROUP: 101 registers, 4 four-warp groups fit an SM) two warps on each of
         * two heads with splits for 5 such groups (10 two-warp groups' worth) were 16-26 % faster
         * than the one-head kernel's 4 from 65536 keys (2026-12-03, 8ee2e34). */
        else if (pb->head_dim == 32)
            c->wgs_per_cu = c->wgs_per_cu * 5 / 2;
    } else if (c->kernel == FLASHCL_SERVING_DECODE) {
        if (c->block_m > 8) /* q and the accumulators of 8 rows already take 128 registers */
            c->block_m = 8;
        int chunks = pb->head_dim / vec;
        c->lanes = next_pow2(chunks < 32 ? chunks : 32);
        c->work_group_size = e->kernel == FLASHCL_SERVING_DECODE ? e->work_group_size : 128;
        if (c->block_m > 8)
            c->block_m = 8;
        if (c->work_group_size < c->lanes)
            c->work_group_size = c->lanes;
        /* A derived work-group (not an entry's own) fits the device: rusticl's
         * kernels take 32 work-items. */
        while (e->kernel != FLASHCL_SERVING_DECODE && c->work_group_size / 2 >= c->lanes &&
               (size_t)c->work_group_size > ctx->info.max_wg)
            c->work_group_size /= 2;
        c->unroll = e->kernel == FLASHCL_SERVING_DECODE ? e->unroll : 4;
        c->stages = e->kernel == FLASHCL_SERVING_DECODE ? e->stages : 2;
        c->vec = vec;
        /* Fewer stages until the pipeline fits __local with 1 KB to spare. */
        size_t budget = ctx->info.local_mem > 2048 ? (size_t)ctx->info.local_mem - 1024 : 0;
        while (c->stages > 2 && flashcl_decode_local_bytes(c, pb->head_dim) > budget)
            --c->stages;
    } else {
        c->block_n = cpu || pb->head_dim <= 128 ? 32 : 16;
        c->tpr = cpu ? 1 : 128 / c->block_m;
        if (c->tpr > 32)
            c->tpr = 32;
        if (c->tpr > c->block_n)
            c->tpr = c->block_n;
        size_t budget = ctx->info.local_mem > 2048 ? (size_t)ctx->info.local_mem - 1024 : 0;
        while (c->block_n > c->tpr && flashcl_decode_local_bytes(c, pb->head_dim) > budget)
            c->block_n /= 2;
        while (c->block_m > 1 && ((size_t)c->block_m * (size_t)c->tpr > ctx->info.max_wg ||
                                  flashcl_decode_local_bytes(c, pb->head_dim) > budget))
            c->block_m /= 2;
        c->work_group_size = c->block_m * c->tpr;
    }
}

/* Tuning-file entries only: the choice for this problem must fit the device
 * (the built-in entries' choices adapt to it, see above). */
static int decode_applies(const flashcl_context *ctx, int level, const void *entry, const void *arg) {
    flashcl_decode_choice c;
    char why[200];
    if (level != LVL_FILE)
        return 1;
    decode_derive(ctx, arg, entry, -1, &c);
    decode_fit(ctx, arg, &c, why, sizeof why);
    if (!why[0])
        return 1;
    flashcl_log("serving parameters from %s passed over: %s", level_source(ctx, level, NULL), why);
    return 0;
}

/* The mma decode kernel's HEAD_GROUP (c->head_group kv heads a work-group,
 * a warp each), kept where it applies, else 0: decoding only (one query
 * token a sequence, a GQA group of at most 8 rows), kv heads in whole
 * groups, head dims a multiple of 32 up to 128, 16-key tiles, and the
 * group's V tiles within __local. Sets the work-group to a warp a head. */
static void decode_head_group(const flashcl_context *ctx, const flashcl_decode_problem *pb,
                              flashcl_decode_choice *c) {
    if (c->head_group <= 0 || c->kernel != FLASHCL_SERVING_DECODE_MMA) {
        c->head_group = c->head_warps = 0;
        return;
    }
    if (c->head_warps < 1)
        c->head_warps = 1;
    const int warps = c->head_group * c->head_warps;
    int ok = pb->group >= 1 && pb->group <= 8 && c->block_m >= pb->group && c->block_m <= 8 &&
             pb->heads_k % c->head_group == 0 && pb->head_dim % 32 == 0 && pb->head_dim <= 128 &&
             c->block_n == 16 && (size_t)(32 * warps) <= ctx->info.max_wg;
    for (int i = 0; ok && i < pb->num_seqs; ++i)
        ok = pb->rows_per_seq[i] == pb->group;
    const size_t local = flashcl_decode_local_bytes(c, pb->head_dim);
    if (!ok || local > FLASHCL_NV_LOCAL_LIMIT || local > ctx->info.local_mem) {
        c->head_group = c->head_warps = 0;
        return;
    }
    c->work_group_size = 32 * warps;
}

/* The decode grid before splitting, one kv head a work-group: blocks x kv heads. */
static long one_head_groups(const flashcl_decode_problem *pb, const flashcl_decode_choice *c) {
    long blocks = 0;
    for (int i = 0; i < pb->num_seqs; ++i)
        blocks += (pb->rows_per_seq[i] + c->block_m - 1) / c->block_m;
    return blocks * pb->heads_k;
}

/* The mma decode kernel's warps for decoding, from the one-head grid (blocks x kv heads, G) at
 * the head dims where they were measured (H200, f16, 32 query over 8 kv heads, batch 1-64 x
 * 4k-128k keys, 16-token shuffled pages; BENCHMARKS.md, a762927, 8ee2e34). decode_head_group keeps
 * the choice only where the HEAD_GROUP kernel applies (one token a sequence, D a multiple of
 * 32 up to 128), else the one-head kernel of 2 warps stays.
 *   D=128 and 96 (242 and 183 registers a thread: one 8-warp group a CU):
 *     G <= CUs / 8, from 8192 keys: 8 warps on one kv head (HEAD_GROUP=1, HEAD_WARPS=8), as many
 *       warps a CU as 4 two-warp groups with a quarter of the splits to merge: batch 1 at 16384
 *       keys 27.8 us against 31.3, batch 2 41.8 against 48.1 (under 8192 keys 0.5-1 us slower);
 *     else G <= CUs, an even number of kv heads: 4 warps on each of two neighbouring heads
 *       (HEAD_GROUP=2, HEAD_WARPS=4), whose rows of the pool's pages are read together, one
 *       group a CU: batch 4 at 4096 keys 26.9 us against 29.7, batch 8 44.9 against 47.9, 0-2 %
 *       faster at batch 1-16 up to 16384 keys, level (+-0.5 %) at 65536 keys and more. At batch
 *       32 (G = 256) level to 10 % slower at 4096 keys: there the one-head kernel stays.
 *   D=64 (139 registers: three 4-warp groups a CU, decode_derive): 4 warps on one kv head, or on
 *     each of two heads where G is between CUs / 4 and 2 x CUs (batch 8-32), 20-24 % faster
 *     than the one-head kernel at 65536 keys and more ((16, 131072) 1011 us against 1331,
 *     (64, 131072) 4171 against 5274); pairs are 2-3 % faster than one head at batch 16-32 and
 *     up to 9 % slower at batch 64, one head up to 5 % faster at batch 1-4.
 *   D=96, the same as D=128: 0.5-1 % faster than the one-head kernel at batch 4-16 over 65536
 *     keys and more, batch 1 at 16384 keys 9 % (8 warps a head); at 4096 keys within 2 us
 *     either way.
 *   D=32 (101 registers; the splits for 5 four-warp groups a CU, decode_derive): 2 warps on each
 *     of two kv heads at every batch, 16-26 % faster than the one-head kernel from 65536 keys
 *     ((16, 131072) 540 us against 698, (64, 131072) 2253 against 3053); one head (4 warps) up to
 *     45 % slower than pairs from batch 4, 2-4 % faster at batch 1. */
static void decode_head_warps(const flashcl_context *ctx, const flashcl_decode_problem *pb,
                              flashcl_decode_choice *c) {
    if (c->kernel != FLASHCL_SERVING_DECODE_MMA)
        return;
    const long g = one_head_groups(pb, c), cus = (long)ctx->info.compute_units;
    const int pairs = pb->heads_k % 2 == 0;
    if (pb->head_dim == 96 || pb->head_dim == 128) {
        if (g * 8 <= cus && pb->max_keys >= 8192)
            c->head_group = 1, c->head_warps = 8;
        else if (g <= cus && pairs)
            c->head_group = 2, c->head_warps = 4;
    } else if (pb->head_dim == 32 || pb->head_dim == 64) { /* 4-warp groups: on two heads or on one */
        const int two = pairs && (pb->head_dim == 32 || (g * 4 > cus && g <= 2 * cus));
        c->head_group = two ? 2 : 1, c->head_warps = two ? 2 : 4;
    }
}

/* The mma decode kernel's REG_COPY, once the split count is known: the
 * longest sequence's slice (cut as the kernel cuts it) against
 * reg_copy_min_keys, where the kernel takes it (in place of the two-stage
 * cp.async loop of 16-key tiles), at head dims 64..128. H200, batch 1-16 x
 * 16k-64k keys: 2-8 % faster than 1d15059's kernel at D=64, 96 and 128; at D=32 slower
 * than it and than the cp.async loop (a 16-key tile is 1 KB of K: too
 * little in flight); at D=256 (one warp a group) 2.3x slower (BENCHMARKS.md,
 * 2026-12-03, b4f8851). */
static void decode_reg_copy(const flashcl_decode_problem *pb, flashcl_decode_choice *c) {
    const long slice = ((pb->max_keys + c->splits - 1) / c->splits + 31) / 32 * 32;
    c->reg_copy = c->kernel == FLASHCL_SERVING_DECODE_MMA && !c->head_group && c->reg_copy_min_keys > 0 &&
                  slice >= c->reg_copy_min_keys &&
                  pb->head_dim >= 64 && pb->head_dim <= 128 && c->block_n == 16 && c->stages == 2;
}

/* The split count: the caller's, else enough work-groups to fill the device once. */
static void decode_splits(const flashcl_context *ctx, const flashcl_decode_problem *pb, flashcl_decode_choice *c) {
    if (pb->requested_splits > 0) {
        c->splits = pb->requested_splits < FLASHCL_MAX_SPLITS ? pb->requested_splits : FLASHCL_MAX_SPLITS;
        return;
    }
    long groups = one_head_groups(pb, c);
    /* Rounded down: work-groups run in waves of equal length (every slice
     * has the same keys), and one more than a whole number of waves adds a
     * nearly empty last wave. */
    long target = (long)ctx->info.compute_units * c->wgs_per_cu;
    if (c->head_group > 0) { /* the entry counts 2-warp groups: as many warps a CU */
        const int per_cu = c->wgs_per_cu * 2 / (c->head_group * c->head_warps);
        groups /= c->head_group;
        target = (long)ctx->info.compute_units * (per_cu > 0 ? per_cu : 1);
    }
    long splits = groups > 0 && groups < target ? target / groups : 1;
    long by_keys = (pb->max_keys + c->min_split_keys - 1) / c->min_split_keys;
    /* A grid with fewer work-groups than compute units leaves some idle:
     * then slices may be half as long. H200, one sequence of 4096 keys
     * (64 work-groups with 512-key slices): 16 slices of 256 keys took
     * 35.8 / 37.3 us against 39.5 / 43.2 for 8 (two calls); where the
     * device is covered (batch 4, or 16384 keys) 256-key slices were level
     * or slower (BENCHMARKS.md). */
    if (groups * (splits < by_keys ? splits : by_keys) < ctx->info.compute_units && c->min_split_keys > 1) {
        const long half = c->min_split_keys / 2;
        by_keys = (pb->max_keys + half - 1) / half;
    }
    if (splits > by_keys)
        splits = by_keys;
    if (splits > FLASHCL_MAX_SPLITS)
        splits = FLASHCL_MAX_SPLITS;
    c->splits = splits < 1 ? 1 : (int)splits;
}

/* The first entry for this device and problem, most specific level first. */
static const decode_entry *decode_lookup(const flashcl_context *ctx, const flashcl_decode_problem *pb,
                                         const char **source) {
    const struct flashcl_param_db *db = get_db(ctx);
    const level_table levels[] = {
        FILE_AND_BUILTIN_LEVELS(db ? db->file.serving : NULL, db ? db->file.num_serving : 0, decode),
    };
    int level;
    const decode_entry *d = walk_levels(ctx, levels, COUNT(levels), decode_applies, pb, &level, source);
    if (!d) {
        *source = "default: global";
        return &decode_global[0];
    }
    if (d->why) /* a tuning-file entry without a comment has none */
        *source = intern(ctx, "%s (%s)", *source, d->why);
    return d;
}

flashcl_status flashcl_decode_params(flashcl_context *ctx, const flashcl_decode_problem *pb,
                                     flashcl_decode_choice *c) {
    flashcl_decode_choice env;
    memset(c, 0, sizeof *c);
    memset(&env, 0, sizeof env);
    env.meta_args = env.l2_prefetch = env.head_group = -1; /* unset: their 0 is a value */
    int forced_kernel;
    flashcl_status st = decode_env(ctx, &env, &forced_kernel);
    if (st != FLASHCL_SUCCESS)
        return st;
    const char *source;
    const decode_entry *e = decode_lookup(ctx, pb, &source);
    decode_derive(ctx, pb, e, pb->force_tiled ? FLASHCL_SERVING_TILED : forced_kernel, c);
    c->source = source;

    /* Explicit values replace the derived ones and must fit as given. */
    if (env.source) {
        for (size_t i = 0; i < COUNT(decode_keys); ++i)
            if (*DECODE_FIELD(&env, i) > 0 && decode_keys[i].offset != offsetof(flashcl_decode_choice, work_group_size) &&
                decode_keys[i].offset != offsetof(flashcl_decode_choice, meta_args) &&
                decode_keys[i].offset != offsetof(flashcl_decode_choice, head_group))
                *DECODE_FIELD(c, i) = *DECODE_FIELD(&env, i);
        if (env.head_group >= 0)
            c->head_group = env.head_group;
        if (env.meta_args >= 0)
            c->meta_args = env.meta_args;
        if (env.l2_prefetch >= 0)
            c->l2_prefetch = env.l2_prefetch;
        if (c->kernel == FLASHCL_SERVING_TILED)
            c->work_group_size = c->block_m * c->tpr;
        else if (env.work_group_size)
            c->work_group_size = env.work_group_size;
        c->source = env.source;
        /* The one-head kernel (what HEAD_GROUP falls back to) must fit as given, checked with
         * its split count and so its REG_COPY known: one tile buffer a warp lets wider groups fit. */
        flashcl_decode_choice one_head = *c;
        one_head.head_group = 0;
        decode_splits(ctx, pb, &one_head);
        decode_reg_copy(pb, &one_head);
        char why[200];
        decode_fit(ctx, pb, &one_head, why, sizeof why);
        if (why[0])
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "FLASHCL_DECODE_PARAMS: %s", why);
    }
    if (env.head_group < 0 && env.head_warps <= 0 && !env.work_group_size) /* an explicit choice wins */
        decode_head_warps(ctx, pb, c);
    decode_head_group(ctx, pb, c);
    decode_splits(ctx, pb, c);
    decode_reg_copy(pb, c);
    return FLASHCL_SUCCESS;
}

/* ==== Backward kernels: tiles and the dQ reduction (cl/flash_bwd.cl) =======================
 * Everything the backward pass launches with is chosen here, in
 * flashcl_backward_params. The database has its own small tables, keyed by
 * head_dim range and walked with the forward's level keys (the tuning file's
 * "backward" entries, "tuned: <path>", then exact device, architecture,
 * vendor, device type, global); then FLASHCL_BWD_PARAMS may replace single values
 * ("BLOCK_M=16,BLOCK_N=16,WG=128"; malformed is an error, as FLASHCL_PARAMS).
 * An entry above the device-type level that does not fit the device is passed
 * over with a log line; the device-type and global defaults are shrunk to
 * fit: tiles halved (keys first, then rows) until they fit __local with 1 KB
 * to spare, the work-group clamped to the device's maximum. Explicit values
 * that do not fit are refused with FLASHCL_ERROR_INVALID_PARAMS.
 *   dQ: float atomics (one dkdv pass, dQ summed in a float scratch) unless the
 *     caller asks for determinism, which adds a dQ pass recomputing P and dS.
 *   variant: "cpu" takes dK, dV (and atomic dQ) and the deterministic dQ pass
 *     from cl/flash_bwd_cpu.cl, one work-item per BLOCK_N keys (a multiple of
 *     8) or BLOCK_M rows; WG is then unused, kept (and checked) for the
 *     portable kernels a build failure falls back to. "nv-mma" takes them from
 *     cl/flash_bwd_nv.cl (tensor cores; NVIDIA sm_80+, f16/bf16, head_dim <=
 *     128, else the entry does not apply): WG/32 warps of 16 keys or rows,
 *     BLOCK_M = dK/dV's streamed query rows, BLOCK_N = dQ's streamed keys,
 *     both multiples of 16, within NVIDIA's 48 KB; a build failure re-picks
 *     without nv-mma entries. "nv-wgmma" takes them from cl/flash_bwd_sm90.cl
 *     (Hopper's warpgroup MMA: compute capability 9.0, f16/bf16, head_dim
 *     32..64; WG 128, 64 keys or rows a work-group, BLOCK_M and BLOCK_N 32 or
 *     64); a build failure re-picks without nv-wgmma entries (so nv-mma's).
 *     FLASHCL_BWD_PARAMS's VARIANT=portable|cpu|nv-mma|nv-wgmma picks one,
 *     and DQ=atomic|pass how nv-mma sums dQ outside deterministic mode: red.add from the dK/dV kernel, or its own pass (the default);
 *     MAXNREG=N caps nv-mma's registers per thread (an entry's
 *     nv_max_registers; 0: the compiler's choice; nv-wgmma: its dK/dV
 *     kernel's), see src/program.c.
 */
/* {match, driver, head_dim_min, head_dim_max, block_m, block_n, work_group_size, why, variant,
 *  nv_max_registers}:
 * declared in internal.h, the tuning file holds them too. */
typedef flashcl_backward_entry backward_entry;

/* Levels 3-5: nothing measured per device, architecture or vendor yet. */
static const backward_entry backward_device[] = {{NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, 0}};
static const backward_entry backward_arch[] = {
    /* cl/flash_bwd_sm90.cl (Hopper's warpgroup MMA), first so that it wins
     * where it applies (compute capability 9.0, head_dim 32..64): one
     * warpgroup of 64 keys or rows streaming 32-row tiles in two stages.
     * H200, (4,32,4096,64) f16, TFLOP/s full / causal (`flashcl bench
     * --backward`, one call): 32-row tiles 149.6 / 113.3, 64-row tiles (one
     * stage) 113.7 / 107.1, mixed 128.5-129.6 / 102.1-119.0; the dK/dV
     * kernel capped at 168 registers (three work-groups an SM) took causal
     * to 134.0 (dK/dV 2782 against 3720 us) and left full level (5341
     * against 5326 us). The cap applies to dK/dV only (src/backward.c). */
    {"sm_90", NULL, 32, 64, 32, 32, 128, "warpgroup MMA (sm_90a)", "nv-wgmma", 168},
    /* cl/flash_bwd_nv.cl. Measured on the H200 (`bench/h200.sh backward`,
     * f16, (4,32,4096,D), TFLOP/s full/causal): D <= 64, 4 warps, 32-row
     * Q/dO tiles (two stages), 64-key K/V tiles in the dQ pass: 117/109,
     * against 104/98 with 64-row tiles and 107-113 with 2 or 8 warps or
     * 16-32-key tiles. D <= 128, 2 warps, 32-row tiles, 32-key tiles:
     * 134/127, against 120/115 with 4 warps and 16-row tiles, 49/46 with
     * one warp, 110-115 with 16 or 64 keys. Summing dQ with red.add from
     * the dK/dV kernel (DQ=atomic) instead of the dQ pass measured slower:
     * 99/91 at D=64 (16- or 32-row tiles alike), 71/66 at D=128 (98/91
     * with 4 warps and 16-row tiles): its dS^T tile costs __local the Q/dO
     * stages need, and 64-key groups make two atomic adds per dQ element
     * per 128 keys. The same measurement put K/V fragments in registers
     * (KV_REGS, D <= 64) at 118.4 against 117.3 from __local.
     * Register caps (`bench/h200.sh regs` at 0127898, (4,32,4096,D) full):
     * at D <= 64, 168 registers a thread (three work-groups an SM instead
     * of two) gave 129.1 against 118.1 uncapped and 115.2 at 128; at D=128
     * a cap of 168 lost (111.1 against 134.4). */
    {"sm_80+", NULL, 1, 64, 32, 64, 128, "measured on the H200: 129 TFLOP/s at (4,32,4096,64) with 168 registers",
     "nv-mma", 168},
    {"sm_80+", NULL, 65, 128, 32, 32, 64, "measured on the H200: 134/127 TFLOP/s at (4,32,4096,128)", "nv-mma", 0},
    {NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, 0}};
static const backward_entry backward_vendor[] = {{NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, 0}};
static const backward_entry backward_type[] = {
    /* CPU: cl/flash_bwd_cpu.cl, 64 keys per work-item, 64-row query tiles
     * (64 work-items only for the portable fallback). Measured on PoCL (2-core AVX-512 Xeon, load ~1, `flashcl
     * bench --backward --device cpu`, f16, median ms full/causal): 64x64 gave
     * 14.1/7.7 at (1,4,512,64), 25.9/15.9 at (1,2,512,256); 32x32 22.8/9.2
     * and 34.5/18.1; 32x64, 64x32, 64x128, 16x32, 32x16 no better. (The
     * portable kernel, 32x32/64: 163/69 at (1,4,512,64).) */
    {"CPU", NULL, 1, 256, 64, 64, 64, "measured on PoCL: 64x64 of 7 tiles tried", "cpu", 0},
    /* GPU: 16 x 16 tiles (P, dS and four D-wide tiles: 35 KB of __local at
     * D=128), 8 x 8 above D=128 (33 KB at D=256), 128 work-items (64 for the
     * 8 x 8 tiles). Hand-chosen to fit NVIDIA's 48 KB; not yet measured. */
    {"GPU", NULL, 1, 128, 16, 16, 128, "hand-chosen: 35 KB of __local at D=128, under NVIDIA's 48 KB", NULL, 0},
    {"GPU", NULL, 129, 256, 8, 8, 64, "hand-chosen: 33 KB of __local at D=256", NULL, 0},
};
static const backward_entry backward_global[] = {
    {"*", NULL, 1, 128, 16, 16, 128, "as the GPU default", NULL, 0},
    {"*", NULL, 129, 256, 8, 8, 64, "as the GPU default", NULL, 0},
};

size_t flashcl_backward_local_bytes(int block_m, int block_n, int head_dim) {
    size_t m = (size_t)block_m, n = (size_t)block_n, row = (size_t)head_dim + 1;
    /* K, V, Q, dO tiles; P and dS tiles; per row: LSE, D (float), lo, hi (long) */
    return (2 * n * row + 2 * m * row + 2 * m * (n + 1) + 2 * m) * sizeof(float) + 2 * m * sizeof(cl_long);
}

size_t flashcl_backward_cpu_local_bytes(int block_m, int block_n, int head_dim) {
    size_t m = (size_t)block_m, n = (size_t)block_n, d = (size_t)head_dim;
    size_t d_pad = (d + 31) / 32 * 32; /* the kernel's D_PAD: head dim in whole CHUNKs of float8 */
    /* K^T, V^T; K, dK, dV (K, V staging in the dQ pass); Q, dO (+ dQ in the dQ pass); P, dS */
    return (2 * d * n + 3 * n * d_pad + 3 * m * d_pad + 2 * m * n) * sizeof(float);
}

size_t flashcl_backward_nv_local_bytes(int block_m, int block_n, int work_group_size, int head_dim,
                                       int dq_atomic) {
    /* halves per row: head_dim padded to 16, plus 8 (cl/flash_bwd_nv.cl's PITCH) */
    const size_t row = ((size_t)head_dim + 15) / 16 * 16 + 8, own = 16 * (size_t)(work_group_size / 32);
    const size_t m = (size_t)block_m, n = (size_t)block_n, limit = FLASHCL_NV_LOCAL_LIMIT;
    /* dK/dV: K, V of the group's keys; Q, dO tiles (two stages when they fit) + LSE, D_i;
     * with atomic dQ, the dS^T tile (16-byte rows) */
    const size_t ds = dq_atomic ? own * (m + 8) * 2 : 0;
    size_t dkdv = (2 * own * row + 4 * m * row) * 2 + 4 * m * sizeof(float) + ds;
    if (dkdv > limit)
        dkdv = (2 * own * row + 2 * m * row) * 2 + 2 * m * sizeof(float) + ds;
    /* dQ: the Q, dO block, then K, V tiles (two stages when they fit) in the same bytes */
    size_t kv = 4 * n * row * 2;
    if (kv > limit)
        kv /= 2;
    const size_t dq = 2 * own * row * 2 > kv ? 2 * own * row * 2 : kv;
    return dkdv > dq ? dkdv : dq;
}

/* cl/flash_bwd_sm90.cl's __local: the own 64 rows of K and V (or Q and dO),
 * 128 bytes a row, then STAGES pairs of streamed tiles of `rows` rows (two
 * where they fit), 1 KB to align the tiles, and the dK/dV kernel's LSE and
 * D_i per streamed row (stats: 1). */
static size_t backward_wgmma_bytes(int rows, int stats) {
    const size_t own = 2 * 64 * 128, pair = 2 * (size_t)rows * 128, row_stats = 2 * (size_t)rows * sizeof(float);
    const size_t stages = own + 2 * pair + 1024 + 2 * row_stats <= FLASHCL_NV_LOCAL_LIMIT ? 2 : 1;
    return own + stages * (pair + (stats ? row_stats : 0)) + 1024;
}

static int backward_variant_nv(flashcl_backward_variant variant) {
    return variant == FLASHCL_BWD_NV_MMA || variant == FLASHCL_BWD_NV_WGMMA;
}

int flashcl_backward_nv(const flashcl_backward_choice *c) {
    return backward_variant_nv(c->variant);
}

int flashcl_backward_dq_atomic(const flashcl_backward_choice *c) {
    return !c->deterministic && !(flashcl_backward_nv(c) && c->nv_dq_pass);
}

/* The tensor-core kernels: 16 keys (dK/dV) or rows (dQ) a warp. */
int flashcl_backward_keys_per_group(const flashcl_backward_choice *c) {
    return flashcl_backward_nv(c) ? 16 * (c->work_group_size / 32) : c->block_n;
}

int flashcl_backward_rows_per_group(const flashcl_backward_choice *c) {
    return flashcl_backward_nv(c) ? 16 * (c->work_group_size / 32) : c->block_m;
}

/* __local bytes of the variant's kernels: the cpu variant may run the portable dQ pass too. */
/* dq_atomic: nv-mma's dQ mode (-1: not known yet, so the larger of both). */
static size_t backward_bytes(flashcl_backward_variant variant, int block_m, int block_n, int work_group_size,
                             int head_dim, int dq_atomic) {
    if (variant == FLASHCL_BWD_NV_MMA)
        return flashcl_backward_nv_local_bytes(block_m, block_n, work_group_size, head_dim, dq_atomic != 0);
    if (variant == FLASHCL_BWD_NV_WGMMA) {
        /* DQ=atomic: the dK/dV kernel holds a tile of dS (block_m rows of 128 bytes) as well */
        const size_t dkdv = backward_wgmma_bytes(block_m, 1) + (dq_atomic == 1 ? (size_t)block_m * 128 : 0);
        const size_t dq = backward_wgmma_bytes(block_n, 0);
        return dkdv > dq ? dkdv : dq;
    }
    size_t portable = flashcl_backward_local_bytes(block_m, block_n, head_dim);
    size_t own = variant == FLASHCL_BWD_CPU ? flashcl_backward_cpu_local_bytes(block_m, block_n, head_dim) : 0;
    return own > portable ? own : portable;
}

/* 1 when the nv-mma kernels apply to the device and problem. */
static int backward_nv_applies(const flashcl_context *ctx, const flashcl_attention_desc *d) {
    return !ctx->is_host && ctx->info.nv_cc_major >= 8 && d->dtype != FLASHCL_FLOAT32 && d->head_dim <= 128;
}

/* 1 when the nv-wgmma kernels apply: compute capability 9.0 exactly (sm_90a
 * code runs there only), unless they failed to build here. */
static int backward_wgmma_applies(const flashcl_context *ctx, const flashcl_attention_desc *d) {
    return !ctx->is_host && !ctx->no_sm90a_bwd && ctx->info.nv_cc_major == 9 && ctx->info.nv_cc_minor == 0 &&
           d->dtype != FLASHCL_FLOAT32 && d->head_dim >= 32 && d->head_dim <= 64;
}

/* Whether a variant's kernels apply to the device and problem (the portable and cpu ones always do). */
static int backward_variant_applies(const flashcl_context *ctx, const flashcl_attention_desc *d,
                                    flashcl_backward_variant variant) {
    return variant == FLASHCL_BWD_NV_MMA     ? backward_nv_applies(ctx, d)
           : variant == FLASHCL_BWD_NV_WGMMA ? backward_wgmma_applies(ctx, d)
           : variant == FLASHCL_BWD_CPU      ? !ctx->info.is_rusticl /* as the forward's cpu kernel */
                                             : 1;
}

/* 1 when the tiles and work-group fit the device as they are; else 0 and *why. */
static int backward_fit(const flashcl_context *ctx, const flashcl_attention_desc *d, flashcl_backward_variant variant,
                        int block_m, int block_n, int work_group_size, int dq_atomic, char *why, size_t n) {
    size_t local = backward_bytes(variant, block_m, block_n, work_group_size, d->head_dim, dq_atomic);
    why[0] = '\0';
    if (variant == FLASHCL_BWD_CPU && ctx->info.is_rusticl)
        snprintf(why, n, "%s", FLASHCL_RUSTICL_NO_CPU);
    else if (variant == FLASHCL_BWD_CPU && block_n % 8)
        snprintf(why, n, "the cpu backward kernel needs BLOCK_N a multiple of 8, not %d", block_n);
    else if (variant == FLASHCL_BWD_NV_MMA && !backward_nv_applies(ctx, d))
        snprintf(why, n, "the nv-mma backward needs NVIDIA sm_80+, float16 or bfloat16 and head_dim <= 128");
    else if (variant == FLASHCL_BWD_NV_WGMMA && !backward_wgmma_applies(ctx, d))
        snprintf(why, n, "the nv-wgmma backward needs NVIDIA compute capability 9.0 whose driver builds sm_90a, "
                 "float16 or bfloat16 and head_dim 32..64");
    else if (variant == FLASHCL_BWD_NV_WGMMA && (work_group_size != 128 || (block_m != 32 && block_m != 64) ||
                                                 (block_n != 32 && block_n != 64)))
        snprintf(why, n, "the nv-wgmma backward is one warpgroup (WG 128) streaming tiles of 32 or 64 rows "
                 "(BLOCK_M, BLOCK_N), not WG %d, BLOCK_M %d, BLOCK_N %d", work_group_size, block_m, block_n);
    else if (variant == FLASHCL_BWD_NV_MMA && (work_group_size % 32 || block_m % 16 || block_n % 16))
        snprintf(why, n, "the nv-mma backward needs WG a multiple of 32 and BLOCK_M, BLOCK_N multiples of 16 "
                 "(WG %d, BLOCK_M %d, BLOCK_N %d)", work_group_size, block_m, block_n);
    else if (variant == FLASHCL_BWD_NV_MMA && local > FLASHCL_NV_LOCAL_LIMIT)
        snprintf(why, n, "nv-mma backward tiles (WG %d, BLOCK_M %d, BLOCK_N %d) need %zu bytes of local memory, "
                 "over NVIDIA's 48000", work_group_size, block_m, block_n, local);
    else if (local > ctx->info.local_mem)
        snprintf(why, n, "backward tiles %dx%d need %zu bytes of local memory, the device has %llu", block_m,
                 block_n, local, (unsigned long long)ctx->info.local_mem);
    else if ((size_t)work_group_size > ctx->info.max_wg)
        snprintf(why, n, "work-group of %d exceeds the device's %zu", work_group_size, ctx->info.max_wg);
    return why[0] == '\0';
}

static const char *const backward_variant_names[] = {"portable", "cpu", "nv-mma", "nv-wgmma"}; /* the enum's order */

/* The variant named by the n bytes at name, or -1. */
static int backward_variant_named(const char *name, size_t n) {
    for (int i = 0; i < (int)COUNT(backward_variant_names); ++i)
        if (n == strlen(backward_variant_names[i]) && !strncmp(name, backward_variant_names[i], n))
            return i;
    return -1;
}

/* A table or tuning-file entry's variant: NULL (or unknown) is portable. */
static flashcl_backward_variant backward_variant_of(const char *variant) {
    const int v = variant ? backward_variant_named(variant, strlen(variant)) : -1;
    return v < 0 ? FLASHCL_BWD_PORTABLE : (flashcl_backward_variant)v;
}

typedef struct backward_walk {
    const flashcl_attention_desc *desc;
    int skip_nv; /* pass over the tensor-core entries */
    int only_nv; /* a tensor-core variant FLASHCL_BWD_PARAMS asks for: pass over the other one's; -1: none */
} backward_walk;

/* An entry for this head_dim whose variant applies; above the device-type level, only one that fits. */
static int backward_applies(const flashcl_context *ctx, int level, const void *entry, const void *arg) {
    const backward_entry *e = entry;
    const backward_walk *w = arg;
    const flashcl_backward_variant variant = backward_variant_of(e->variant);
    char why[200];
    if (w->desc->head_dim < e->head_dim_min || w->desc->head_dim > e->head_dim_max)
        return 0;
    if (backward_variant_nv(variant) && (w->skip_nv || (w->only_nv >= 0 && (int)variant != w->only_nv)))
        return 0;
    if (!backward_variant_applies(ctx, w->desc, variant))
        return 0;
    if (level >= LVL_TYPE ||
        backward_fit(ctx, w->desc, variant, e->block_m, e->block_n, e->work_group_size, -1, why, sizeof why))
        return 1;
    flashcl_param_entry key;
    memset(&key, 0, sizeof key);
    key.match = e->match;
    flashcl_log("backward parameters from %s passed over: %s", level_source(ctx, level, &key), why);
    return 0;
}

/* FLASHCL_BWD_PARAMS="BLOCK_M=32,BLOCK_N=32,WG=64,VARIANT=cpu", read once:
 * each field -1 where the variable does not set it. */
typedef struct backward_overrides {
    int set, variant, block_m, block_n, work_group_size, dq_pass, max_registers;
} backward_overrides;

static flashcl_status backward_env(flashcl_context *ctx, backward_overrides *o) {
    const char *env = getenv("FLASHCL_BWD_PARAMS");
    flashcl_kv kv;
    int item, value;
    *o = (backward_overrides){0, -1, -1, -1, -1, -1, -1};
    for (const char *s = env ? env : ""; (item = flashcl_kv_next(&s, &kv)) != FLASHCL_KV_END; o->set = 1) {
        if (item == FLASHCL_KV_ITEM && flashcl_kv_key(&kv, "VARIANT")) {
            if ((o->variant = backward_variant_named(kv.value, kv.value_len)) < 0)
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                    "FLASHCL_BWD_PARAMS: VARIANT is portable, cpu, nv-mma or nv-wgmma at '%s'",
                                    kv.at);
        } else if (item == FLASHCL_KV_ITEM && flashcl_kv_key(&kv, "MAXNREG")) {
            if (!flashcl_kv_int(&kv, 0, 255, &o->max_registers) || (o->max_registers && o->max_registers < 16))
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                    "FLASHCL_BWD_PARAMS: MAXNREG is 0 (the compiler's choice) or 16..255 at '%s'",
                                    kv.at);
        } else if (item == FLASHCL_KV_ITEM && flashcl_kv_key(&kv, "DQ")) {
            o->dq_pass = kv.value_len == 4 && !strncmp(kv.value, "pass", 4);
            if (!o->dq_pass && !(kv.value_len == 6 && !strncmp(kv.value, "atomic", 6)))
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                    "FLASHCL_BWD_PARAMS: DQ is atomic or pass at '%s'", kv.at);
        } else if (item != FLASHCL_KV_ITEM || !flashcl_kv_int(&kv, 1, 1024, &value)) {
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                "FLASHCL_BWD_PARAMS: expected KEY=VALUE[,...] with values 1..1024 at '%s'", kv.at);
        } else if (flashcl_kv_key(&kv, "BLOCK_M")) {
            o->block_m = value;
        } else if (flashcl_kv_key(&kv, "BLOCK_N")) {
            o->block_n = value;
        } else if (flashcl_kv_key(&kv, "WG")) {
            o->work_group_size = value;
        } else {
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                "FLASHCL_BWD_PARAMS: unknown parameter '%.*s' (BLOCK_M, BLOCK_N, WG, VARIANT, DQ, "
                                "MAXNREG)",
                                (int)kv.key_len, kv.key);
        }
    }
    return FLASHCL_SUCCESS;
}

/* The values o sets replace c's. */
static void backward_override(const backward_overrides *o, flashcl_backward_choice *c) {
    if (o->variant >= 0)
        c->variant = (flashcl_backward_variant)o->variant;
    if (o->block_m > 0)
        c->block_m = o->block_m;
    if (o->block_n > 0)
        c->block_n = o->block_n;
    if (o->work_group_size > 0)
        c->work_group_size = o->work_group_size;
    if (o->dq_pass >= 0)
        c->nv_dq_pass = o->dq_pass;
    if (o->max_registers >= 0)
        c->nv_max_registers = o->max_registers;
    if (o->set)
        c->source = "FLASHCL_BWD_PARAMS";
}

flashcl_status flashcl_backward_params(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                       int deterministic, int skip_nv, flashcl_backward_choice *c) {
    const struct flashcl_param_db *db = get_db(ctx);
    const level_table levels[] = {
        FILE_AND_BUILTIN_LEVELS(db ? db->file.backward : NULL, db ? db->file.num_backward : 0, backward),
    };
    const int head_dim = desc->head_dim;
    backward_overrides env;
    flashcl_status st = backward_env(ctx, &env);
    if (st != FLASHCL_SUCCESS)
        return st;
    /* VARIANT=portable or cpu: tiles from entries of the kernels asked for;
     * VARIANT=nv-mma or nv-wgmma: from that variant's entries */
    const int env_nv = env.variant >= 0 && backward_variant_nv((flashcl_backward_variant)env.variant);
    const backward_walk walk = {desc, skip_nv || (env.variant >= 0 && !env_nv), env_nv ? env.variant : -1};
    const char *source = "default: global";
    int level = LVL_GLOBAL;
    memset(c, 0, sizeof *c);
    const backward_entry *e = walk_levels(ctx, levels, COUNT(levels), backward_applies, &walk, &level, &source);
    if (e && e->why) /* a tuning-file entry without a comment has none */
        source = intern(ctx, "%s (%s)", source, e->why);
    else if (!e) /* a head_dim past every entry: the resolved desc keeps it <= 256 */
        e = &backward_global[head_dim > 128];
    c->block_m = e->block_m;
    c->block_n = e->block_n;
    c->work_group_size = e->work_group_size;
    c->deterministic = deterministic != 0;
    c->nv_dq_pass = 1; /* nv-mma: faster than atomics, see backward_arch; nv-wgmma: level with them (d9da259) */
    c->variant = backward_variant_of(e->variant);
    c->nv_max_registers = flashcl_backward_nv(c) ? e->nv_max_registers : 0;
    c->source = source;
    if (env.variant >= 0) /* VARIANT alone: that kernel's tiles shrink to fit as a default's */
        c->variant = (flashcl_backward_variant)env.variant;
    if (level >= LVL_TYPE) { /* the defaults shrink to fit; entries above were checked */
        size_t budget = ctx->info.local_mem > 2048 ? (size_t)ctx->info.local_mem - 1024 : 0;
        const int min_n = c->variant == FLASHCL_BWD_CPU ? 8 : 1; /* the cpu kernel's key vectors */
        int shrunk = 0;
        while (c->block_n > min_n &&
               backward_bytes(c->variant, c->block_m, c->block_n, c->work_group_size, head_dim, -1) > budget)
            c->block_n /= 2, shrunk = 1;
        while (c->block_m > 1 &&
               backward_bytes(c->variant, c->block_m, c->block_n, c->work_group_size, head_dim, -1) > budget)
            c->block_m /= 2, shrunk = 1;
        if (ctx->info.max_wg && (size_t)c->work_group_size > ctx->info.max_wg)
            c->work_group_size = (int)ctx->info.max_wg, shrunk = 1;
        if (shrunk)
            c->source = intern(ctx, "%s (shrunk to fit %s)", c->source, ctx->info.name);
    }
    backward_override(&env, c);
    char why[200];
    if (!backward_fit(ctx, desc, c->variant, c->block_m, c->block_n, c->work_group_size,
                      flashcl_backward_dq_atomic(c), why, sizeof why))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "%s", why);
    return FLASHCL_SUCCESS;
}
