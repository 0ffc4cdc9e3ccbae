/* params_backward.c: the backward kernels' parameters: tiles and the dQ reduction (cl/flash_bwd.cl).
 *
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
 *     32..128, K and V held in registers above 64; WG 128, 64 keys or rows a
 *     work-group, or 256, two warpgroups and 128; BLOCK_M and BLOCK_N 16,
 *     32 or 64, within NVIDIA's 48 KB); a build failure re-picks without
 *     nv-wgmma entries (so nv-mma's).
 *     FLASHCL_BWD_PARAMS's VARIANT=portable|cpu|nv-mma|nv-wgmma picks one,
 *     and DQ=atomic|pass how nv-mma sums dQ outside deterministic mode: red.add from the dK/dV kernel, or its own pass (the default);
 *     DQ=owner|atomic the cpu variant's: whole (batch, kv head) pairs a work-item with plain adds, or a
 *     key block a work-item with atomics (by default owner where the pairs fill the compute units,
 *     cpu_dq_owner);
 *     MAXNREG=N caps nv-mma's registers per thread (an entry's
 *     nv_max_registers; 0: the compiler's choice; nv-wgmma: its dK/dV
 *     kernel's), see src/program.c; STAGES=2..8 the nv-wgmma kernels' TMA
 *     pipeline depth (streamed pairs in flight; by default two where they
 *     fit 48 KB), within 48 KB; the cp.async kernels built beside them, which
 *     run where a tensor map does not encode, keep their own; OWN_REGS=1
 *     its K and V (Q and dO) fragments held in registers, their __local
 *     taken by the stages (not with DQ=atomic; at head_dim 65..128, where
 *     without it one stage of 16-row tiles fits, 16- or 32-row tiles in up to
 *     five or two stages; there the table's default), OWN_REGS=0 not;
 *     DQ_MAXNREG=N caps the nv-wgmma dQ pass (168 by default where K and V
 *     are held, 0: the compiler's choice).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "params_internal.h"

/* {match, driver, head_dim_min, head_dim_max, block_m, block_n, work_group_size, why, variant,
 *  nv_max_registers, nv_own_regs}:
 * declared in internal.h, the tuning file holds them too. */
typedef flashcl_backward_entry backward_entry;

/* Levels 3-5: nothing measured per device, architecture or vendor yet. */
static const backward_entry backward_device[] = {{NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, 0, 0}};
static const backward_entry backward_arch[] = {
    /* cl/flash_bwd_sm90.cl (Hopper's warpgroup MMA), first so that it wins
     * where it applies (compute capability 9.0; head_dim 32..64 here): one
     * warpgroup of 64 keys or rows streaming 32-row tiles in two stages.
     * H200, (4,32,4096,64) f16, TFLOP/s full / causal (`flashcl bench
     * --backward`, one call): 32-row tiles 149.6 / 113.3, 64-row tiles (one
     * stage) 113.7 / 107.1, mixed 128.5-129.6 / 102.1-119.0; the dK/dV
     * kernel capped at 168 registers (three work-groups an SM) took causal
     * to 134.0 (dK/dV 2782 against 3720 us) and left full level (5341
     * against 5326 us). The cap applies to dK/dV only (src/backward.c). */
    {"sm_90", NULL, 32, 64, 32, 32, 128, "warpgroup MMA (sm_90a)", "nv-wgmma", 168, 0},
    /* Head dims 65..128 with K and V (Q and dO) held as register A operands, two stages of
     * 32-row tiles (34 KB; head dims zero-padded to two 64-dim panels). `bench/h200.sh pending`,
     * f16, TFLOP/s full / causal, against nv-mma in the same call: on an H100 (2026-12-05),
     * (4,32,4096,128) 203.8 / 199.2 against 140.7 / 135.9, (1,32,16384,128) 213.3 / 218.4
     * against 144.8 / 145.4, bf16 alike; on the H200 (2026-12-05, 57cb920), (4,32,4096,80)
     * 128.7 / 128.6 against 120.6 / 116.3 and (4,32,4096,72) 120.4 / 117.5 against 108.1 /
     * 103.9. Without the held fragments only one stage of 16-row tiles fits 48 KB, no faster
     * than nv-mma. test_backward has passed on the GPU at 72, 80, 96, 112 and 128. */
    {"sm_90", NULL, 65, 128, 32, 32, 128, "warpgroup MMA (sm_90a), K and V held in registers", "nv-wgmma", 0, 1},
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
     "nv-mma", 168, 0},
    {"sm_80+", NULL, 65, 128, 32, 32, 64, "measured on the H200: 134/127 TFLOP/s at (4,32,4096,128)", "nv-mma", 0, 0},
    {NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, 0, 0}};
static const backward_entry backward_vendor[] = {{NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, 0, 0}};
static const backward_entry backward_type[] = {
    /* CPU: cl/flash_bwd_cpu.cl, 256 keys per work-item, 64-row query tiles
     * (64 work-items only for the portable fallback). The atomic dQ costs one
     * compare-and-swap per row, head dim and key block, so wide key blocks
     * pay it less often: measured on PoCL (2-core AMD EPYC, f32, (1,8,1024,64),
     * CPU time of `flashcl bench --backward --device cpu --iters 5` under
     * `perf stat -e task-clock`, 2026-12-04): 64x64 1170 ms, 64x128 907,
     * 64x256 869/612 (full/causal), 32x256 1014/695, 128x256 853/630, 64x512
     * 789/663. 64x256 needs 491 KB of __local at D=64; devices with less
     * (Intel's CPU runtime: 256 KB) halve the keys until it fits. */
    {"CPU", NULL, 1, 256, 64, 256, 64, "measured on PoCL: 64x256 of 6 tiles tried", "cpu", 0, 0},
    /* GPU: 16 x 16 tiles (P, dS and four D-wide tiles: 35 KB of __local at
     * D=128), 8 x 8 above D=128 (33 KB at D=256), 128 work-items (64 for the
     * 8 x 8 tiles). Hand-chosen to fit NVIDIA's 48 KB; not yet measured. */
    {"GPU", NULL, 1, 128, 16, 16, 128, "hand-chosen: 35 KB of __local at D=128, under NVIDIA's 48 KB", NULL, 0, 0},
    {"GPU", NULL, 129, 256, 8, 8, 64, "hand-chosen: 33 KB of __local at D=256", NULL, 0, 0},
};
static const backward_entry backward_global[] = {
    {"*", NULL, 1, 128, 16, 16, 128, "as the GPU default", NULL, 0, 0},
    {"*", NULL, 129, 256, 8, 8, 64, "as the GPU default", NULL, 0, 0},
};

size_t flashcl_backward_local_bytes(int block_m, int block_n, int head_dim) {
    size_t m = (size_t)block_m, n = (size_t)block_n, row = (size_t)head_dim + 1;
    /* K, V, Q, dO tiles; P and dS tiles; per row: LSE, D (float), lo, hi (long) */
    return (2 * n * row + 2 * m * row + 2 * m * (n + 1) + 2 * m) * sizeof(float) + 2 * m * sizeof(cl_long);
}

size_t flashcl_backward_cpu_local_bytes(int block_m, int block_n, int head_dim) {
    size_t m = (size_t)block_m + (size_t)block_m % 2, n = (size_t)block_n, d = (size_t)head_dim; /* M_EVEN */
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

/* cl/flash_bwd_sm90.cl's __local: the own rows of K and V (or Q and dO), 64
 * a warpgroup, 128 bytes a row and 64-dim panel, then STAGES pairs of
 * streamed tiles of `rows` rows (with OWN_REGS the stages take the own
 * block's bytes: the larger of both), 1 KB to align the tiles, and the dK/dV
 * kernel's LSE and D_i per streamed row (stats: 1). */
typedef struct wgmma_bytes {
    size_t own, pair, row_stats; /* the own block, one stage's pair of tiles, one stage's stats */
} wgmma_bytes;

static wgmma_bytes wgmma_bytes_of(int rows, int work_group_size, int head_dim) {
    const size_t panels = ((size_t)head_dim + 63) / 64;
    return (wgmma_bytes){2 * (size_t)(work_group_size / 2) * 128 * panels, 2 * (size_t)rows * 128 * panels,
                         2 * (size_t)rows * sizeof(float)};
}

/* STAGES, the kernel's default: two where they fit NVIDIA's 48000 bytes, else one. */
int flashcl_backward_wgmma_stages(int rows, int work_group_size, int head_dim, int own_regs) {
    const wgmma_bytes b = wgmma_bytes_of(rows, work_group_size, head_dim);
    return (own_regs ? 0 : b.own) + 2 * b.pair + 1024 + 2 * b.row_stats <= FLASHCL_NV_LOCAL_LIMIT ? 2 : 1;
}

/* stages: FLASHCL_BWD_PARAMS's STAGES for the TMA kernels (0: the kernel's default); the cp.async
 * kernels built beside them keep the default, so both must fit. */
static size_t backward_wgmma_bytes(int rows, int work_group_size, int head_dim, int stats, int stages, int own_regs) {
    const wgmma_bytes b = wgmma_bytes_of(rows, work_group_size, head_dim);
    const int own_default = flashcl_backward_wgmma_stages(rows, work_group_size, head_dim, own_regs);
    const size_t most = (size_t)(stages > own_default ? stages : own_default);
    const size_t tiles = own_regs ? (b.own > most * b.pair ? b.own : most * b.pair) : b.own + most * b.pair;
    return tiles + (stats ? most * b.row_stats : 0) + 1024;
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
                             int head_dim, int dq_atomic, int stages, int own_regs) {
    if (variant == FLASHCL_BWD_NV_MMA)
        return flashcl_backward_nv_local_bytes(block_m, block_n, work_group_size, head_dim, dq_atomic != 0);
    if (variant == FLASHCL_BWD_NV_WGMMA) {
        /* DQ=atomic: the dK/dV kernel holds a tile of dS as well (block_m rows x WG/2 keys, 2 bytes each) */
        const size_t dkdv = backward_wgmma_bytes(block_m, work_group_size, head_dim, 1, stages, own_regs) +
                            (dq_atomic == 1 ? (size_t)block_m * (size_t)work_group_size : 0); /* dS: rows x keys */
        const size_t dq = backward_wgmma_bytes(block_n, work_group_size, head_dim, 0, stages, own_regs);
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
           d->dtype != FLASHCL_FLOAT32 && d->head_dim >= 32 && d->head_dim <= 128;
}

/* Whether a variant's kernels apply to the device and problem (the portable and cpu ones always do). */
static int backward_variant_applies(const flashcl_context *ctx, const flashcl_attention_desc *d,
                                    flashcl_backward_variant variant) {
    return variant == FLASHCL_BWD_NV_MMA     ? backward_nv_applies(ctx, d)
           : variant == FLASHCL_BWD_NV_WGMMA ? backward_wgmma_applies(ctx, d)
           : variant == FLASHCL_BWD_CPU      ? !ctx->info.is_rusticl /* as the forward's cpu kernel */
                                             : 1;
}

/* The streamed tiles' rows cl/flash_bwd_sm90.cl takes: its score products are m64nNk16 with N the rows. */
static int wgmma_tile_rows(int rows) {
    return rows == 16 || rows == 32 || rows == 64;
}

/* Why K and V (Q and dO) held in registers (OWN_REGS) cannot serve a choice, or NULL where they
 * can: backward_fit's refusal, and where an entry's held fragments give way to an override. */
static const char *own_regs_refusal(flashcl_backward_variant variant, int dq_atomic, int head_dim, int block_m,
                                    int block_n) {
    if (variant != FLASHCL_BWD_NV_WGMMA || dq_atomic == 1)
        return "OWN_REGS holds the nv-wgmma backward's K and V (Q and dO) fragments in registers, without "
               "DQ=atomic (which reads K from local memory)";
    if (head_dim > 64 && (block_m == 64 || block_n == 64))
        return "OWN_REGS at head_dim 65..128 takes 16- or 32-row tiles: with 64-row tiles the held fragments, dK "
               "and dV do not fit the registers (ptxas spills and serialises the wgmma)";
    return NULL;
}

/* 1 when the tiles and work-group fit the device as they are; else 0 and *why. */
static int backward_fit(const flashcl_context *ctx, const flashcl_attention_desc *d, flashcl_backward_variant variant,
                        int block_m, int block_n, int work_group_size, int dq_atomic, int stages, int own_regs,
                        char *why, size_t n) {
    size_t local =
        backward_bytes(variant, block_m, block_n, work_group_size, d->head_dim, dq_atomic, stages, own_regs);
    const char *held = own_regs ? own_regs_refusal(variant, dq_atomic, d->head_dim, block_m, block_n) : NULL;
    why[0] = '\0';
    if (variant == FLASHCL_BWD_CPU && ctx->info.is_rusticl)
        snprintf(why, n, "%s", FLASHCL_RUSTICL_NO_CPU);
    else if (variant == FLASHCL_BWD_CPU && block_n % 8)
        snprintf(why, n, "the cpu backward kernel needs BLOCK_N a multiple of 8, not %d", block_n);
    else if (variant == FLASHCL_BWD_NV_MMA && !backward_nv_applies(ctx, d))
        snprintf(why, n, "the nv-mma backward needs NVIDIA sm_80+, float16 or bfloat16 and head_dim <= 128");
    else if (variant == FLASHCL_BWD_NV_WGMMA && !backward_wgmma_applies(ctx, d))
        snprintf(why, n, "the nv-wgmma backward needs NVIDIA compute capability 9.0 whose driver builds sm_90a, "
                 "float16 or bfloat16 and head_dim 32..128");
    else if (variant == FLASHCL_BWD_NV_WGMMA && ((work_group_size != 128 && work_group_size != 256) ||
                                                 !wgmma_tile_rows(block_m) || !wgmma_tile_rows(block_n)))
        snprintf(why, n, "the nv-wgmma backward is one or two warpgroups (WG 128 or 256) streaming tiles of 16, "
                 "32 or 64 rows (BLOCK_M, BLOCK_N), not WG %d, BLOCK_M %d, BLOCK_N %d", work_group_size, block_m,
                 block_n);
    else if (stages && (variant != FLASHCL_BWD_NV_WGMMA || stages < 2 || stages > 8))
        snprintf(why, n, "STAGES is the nv-wgmma backward's TMA pipeline depth, 2..8 (not %d with %s)", stages,
                 variant == FLASHCL_BWD_NV_WGMMA ? "nv-wgmma" : "another variant");
    else if (held)
        snprintf(why, n, "%s", held);
    else if (variant == FLASHCL_BWD_NV_WGMMA && stages && dq_atomic == 1)
        snprintf(why, n, "STAGES sets the nv-wgmma backward's TMA stages, which DQ=atomic does not take");
    else if (variant == FLASHCL_BWD_NV_WGMMA && local > FLASHCL_NV_LOCAL_LIMIT)
        snprintf(why, n, "nv-wgmma backward tiles (WG %d, BLOCK_M %d, BLOCK_N %d) need %zu bytes of local memory, "
                 "over NVIDIA's 48000", work_group_size, block_m, block_n, local);
    else if (variant == FLASHCL_BWD_NV_MMA && (work_group_size % 32 || block_m % 16 || block_n % 16))
        snprintf(why, n, "the nv-mma backward needs WG a multiple of 32 and BLOCK_M, BLOCK_N multiples of 16 "
                 "(WG %d, BLOCK_M %d, BLOCK_N %d)", work_group_size, block_m, block_n);
    else if (variant == FLASHCL_BWD_NV_MMA && local > FLASHCL_NV_LOCAL_LIMIT)
        snprintf(why, n, "nv-mma backward tiles (WG %d, BLOCK_M %d, BLOCK_N %d) need %zu bytes of local memory, "
                 "over NVIDIA's 48000", work_group_size, block_m, block_n, local);
    else if (local > ctx->info.local_mem)
        snprintf(why, n, "backward tiles %dx%d need %zu bytes of local memory, the device has %llu", block_m,
                 block_n, local, (unsigned long long)ctx->info.local_mem);
    flashcl_check_work_group(ctx, work_group_size, why, n);
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
        backward_fit(ctx, w->desc, variant, e->block_m, e->block_n, e->work_group_size, -1, 0,
                     variant == FLASHCL_BWD_NV_WGMMA ? e->nv_own_regs : 0, why, sizeof why))
        return 1;
    flashcl_param_entry key;
    memset(&key, 0, sizeof key);
    key.match = e->match;
    flashcl_log("backward parameters from %s passed over: %s",
                flashcl_level_source(ctx, level, &key), why);
    return 0;
}

/* FLASHCL_BWD_PARAMS="BLOCK_M=32,BLOCK_N=32,WG=64,VARIANT=cpu", read once:
 * each field -1 where the variable does not set it. */
typedef struct backward_overrides {
    int set, variant, block_m, block_n, work_group_size, dq_pass, dq_owner, max_registers, dq_max_registers, stages,
        own_regs;
} backward_overrides;

static flashcl_status backward_env(flashcl_context *ctx, backward_overrides *o) {
    const char *env = getenv("FLASHCL_BWD_PARAMS");
    flashcl_kv kv;
    int item, value;
    *o = (backward_overrides){0, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
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
        } else if (item == FLASHCL_KV_ITEM && flashcl_kv_key(&kv, "DQ_MAXNREG")) {
            if (!flashcl_kv_int(&kv, 0, 255, &o->dq_max_registers) ||
                (o->dq_max_registers && o->dq_max_registers < 16))
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                    "FLASHCL_BWD_PARAMS: DQ_MAXNREG is 0 (the compiler's choice) or 16..255 at '%s'",
                                    kv.at);
        } else if (item == FLASHCL_KV_ITEM && flashcl_kv_key(&kv, "DQ")) {
            o->dq_pass = kv.value_len == 4 && !strncmp(kv.value, "pass", 4);
            o->dq_owner = kv.value_len == 5 && !strncmp(kv.value, "owner", 5);
            if (!o->dq_pass && !o->dq_owner && !(kv.value_len == 6 && !strncmp(kv.value, "atomic", 6)))
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                    "FLASHCL_BWD_PARAMS: DQ is atomic, pass or owner at '%s'", kv.at);
        } else if (item == FLASHCL_KV_ITEM && flashcl_kv_key(&kv, "OWN_REGS")) {
            if (!flashcl_kv_int(&kv, 0, 1, &o->own_regs))
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                    "FLASHCL_BWD_PARAMS: OWN_REGS is 0 or 1 at '%s'", kv.at);
        } else if (item != FLASHCL_KV_ITEM || !flashcl_kv_int(&kv, 1, 1024, &value)) {
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                "FLASHCL_BWD_PARAMS: expected KEY=VALUE[,...] with values 1..1024 at '%s'", kv.at);
        } else if (flashcl_kv_key(&kv, "BLOCK_M")) {
            o->block_m = value;
        } else if (flashcl_kv_key(&kv, "BLOCK_N")) {
            o->block_n = value;
        } else if (flashcl_kv_key(&kv, "WG")) {
            o->work_group_size = value;
        } else if (flashcl_kv_key(&kv, "STAGES")) {
            o->stages = value;
        } else {
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                "FLASHCL_BWD_PARAMS: unknown parameter '%.*s' (BLOCK_M, BLOCK_N, WG, VARIANT, DQ, "
                                "MAXNREG, DQ_MAXNREG, STAGES, OWN_REGS)",
                                (int)kv.key_len, kv.key);
        }
    }
    return FLASHCL_SUCCESS;
}

/* Whether the cpu variant's dK/dV kernel should own whole (batch, kv head)
 * pairs: one work-item each walking all the key blocks, so that it is the only
 * writer of those heads' dQ rows and adds to them without atomics (use_atomics
 * 2 in cl/flash_bwd_cpu.cl). The atomics' compare-and-swap loop was 20 % of
 * the dK/dV kernel's samples at (1,8,1024,64) f32 (perf, 2026-12-04, 2-core
 * EPYC). The price is parallelism: B * heads_k work-items instead of that
 * times the key blocks, so the pairs must fill the compute units in nearly
 * whole waves (90 %; pairs of equal shape take equal time), or there must be
 * a single key block, where nothing is lost. Deterministic mode keeps its dQ
 * pass. */
static int cpu_dq_owner(const flashcl_context *ctx, const flashcl_attention_desc *d,
                        const flashcl_backward_choice *c) {
    if (c->variant != FLASHCL_BWD_CPU || c->deterministic)
        return 0;
    const long pairs = (long)d->batch * d->heads_k, units = ctx->info.compute_units ? ctx->info.compute_units : 1;
    const long waves = (pairs + units - 1) / units;
    return d->seqlen_k <= c->block_n || pairs * 10 >= 9 * waves * units;
}

/* Halves *side (c's block_m or block_n) while c's tiles need more than budget bytes of local
 * memory (as backward_bytes counts them without held fragments) and *side is above least;
 * 1 when it halved. */
static int halve_to_fit(flashcl_backward_choice *c, int *side, int least, int head_dim, int dq_atomic, int stages,
                        size_t budget) {
    int halved = 0;
    while (*side > least &&
           backward_bytes(c->variant, c->block_m, c->block_n, c->work_group_size, head_dim, dq_atomic, stages, 0) >
               budget)
        *side /= 2, halved = 1;
    return halved;
}

/* The values o sets replace c's. */
static void backward_override(const backward_overrides *o, int head_dim, flashcl_backward_choice *c) {
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
    if (o->dq_owner >= 0)
        c->cpu_dq_owner = o->dq_owner && c->variant == FLASHCL_BWD_CPU && !c->deterministic;
    if (o->max_registers >= 0)
        c->nv_max_registers = o->max_registers;
    if (o->dq_max_registers >= 0)
        c->nv_dq_max_registers = o->dq_max_registers;
    if (o->stages >= 0)
        c->nv_stages = o->stages;
    if (o->own_regs >= 0)
        c->nv_own_regs = o->own_regs;
    else if (o->set && c->nv_own_regs &&
             own_regs_refusal(c->variant, flashcl_backward_dq_atomic(c), head_dim, c->block_m, c->block_n))
        c->nv_own_regs = 0; /* an entry's held fragments give way to what the override asks for */
    /* The held fragments take 16-32 registers more: under the table's cap of 168 ptxas spills
     * (clang's PTX at 64-row tiles) and could reuse them inside the loop, so no cap unless given. */
    if (o->own_regs > 0 && o->max_registers < 0)
        c->nv_max_registers = 0;
    if (o->set)
        c->source = "FLASHCL_BWD_PARAMS";
}

flashcl_status flashcl_backward_params(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                       int deterministic, int skip_nv, flashcl_backward_choice *c) {
    const struct flashcl_param_db *db = flashcl_param_db_get(ctx);
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
    const backward_entry *e =
        flashcl_walk_levels(ctx, levels, COUNT(levels), backward_applies, &walk, &level, &source);
    if (e && e->why) /* a tuning-file entry without a comment has none */
        source = flashcl_param_intern(ctx, "%s (%s)", source, e->why);
    else if (!e) /* a head_dim past every entry: the resolved desc keeps it <= 256 */
        e = &backward_global[head_dim > 128];
    c->block_m = e->block_m;
    c->block_n = e->block_n;
    c->work_group_size = e->work_group_size;
    c->deterministic = deterministic != 0;
    c->nv_dq_pass = 1; /* nv-mma: faster than atomics, see backward_arch; nv-wgmma: level with them (d9da259) */
    c->variant = backward_variant_of(e->variant);
    c->nv_max_registers = flashcl_backward_nv(c) ? e->nv_max_registers : 0;
    c->nv_own_regs = c->variant == FLASHCL_BWD_NV_WGMMA ? e->nv_own_regs : 0;
    c->source = source;
    if (env.variant >= 0) /* VARIANT alone: that kernel's tiles shrink to fit as a default's */
        c->variant = (flashcl_backward_variant)env.variant;
    /* The CPU entry's wide key blocks serve the cpu kernel's atomic dQ; the
     * portable kernel, forced on a CPU, keeps square tiles (its work-items
     * share one tile of keys, which 256 would make a 232 KB working set). */
    if (c->variant == FLASHCL_BWD_PORTABLE && e->variant && !strcmp(e->variant, "cpu"))
        c->block_n = c->block_m;
    if (level >= LVL_TYPE) { /* the defaults shrink to fit; entries above were checked */
        const size_t budget = flashcl_local_budget(ctx);
        const int min_n = c->variant == FLASHCL_BWD_CPU ? 8 : 1; /* the cpu kernel's key vectors */
        int shrunk = halve_to_fit(c, &c->block_n, min_n, head_dim, -1, 0, budget);
        shrunk |= halve_to_fit(c, &c->block_m, 1, head_dim, -1, 0, budget);
        if (ctx->info.max_wg && (size_t)c->work_group_size > ctx->info.max_wg)
            c->work_group_size = (int)ctx->info.max_wg, shrunk = 1;
        if (shrunk)
            c->source = flashcl_shrunk_source(ctx, c->source);
    }
    backward_override(&env, head_dim, c);
    /* The held kernels' dQ pass (K and V held in registers) capped at 168 registers: three
     * work-groups an SM. f16 TFLOP/s full / causal, default against capped (H200, 2026-12-05,
     * `flashcl bench --backward --iters 10`): (4,32,4096,128) 202.6 / 198.5 against 210.7 /
     * 204.3, (1,32,16384,128) 208.5 / 212.5 against 217.2 / 220.9, bf16 alike, (4,32,4096,80)
     * 127.1 / 126.8 against 133.6 / 132.1, (4,32,4096,96) 154.4 / 152.2 against 159.3 / 157.5;
     * test_backward wgmma had passed its held cases under the cap. Only there: at D <= 64 the dQ
     * pass ran slower capped (src/backward.c), and with two warpgroups 168 still leaves one
     * work-group an SM. */
    if (env.dq_max_registers < 0 && c->nv_own_regs && c->variant == FLASHCL_BWD_NV_WGMMA && head_dim > 64 &&
        c->work_group_size == 128 && flashcl_backward_dq_atomic(c) != 1)
        c->nv_dq_max_registers = 168;
    /* An entry's tiles sized for held fragments that the override let go (DQ=atomic, OWN_REGS=0):
     * each side the override does not set is halved, keys first, down to 16 rows, until they fit. */
    if (e->nv_own_regs && !c->nv_own_regs && c->variant == FLASHCL_BWD_NV_WGMMA) {
        const int atomic = flashcl_backward_dq_atomic(c);
        if (env.block_n < 0)
            halve_to_fit(c, &c->block_n, 16, head_dim, atomic, c->nv_stages, FLASHCL_NV_LOCAL_LIMIT);
        if (env.block_m < 0)
            halve_to_fit(c, &c->block_m, 16, head_dim, atomic, c->nv_stages, FLASHCL_NV_LOCAL_LIMIT);
    }
    if (env.dq_owner < 0)
        c->cpu_dq_owner = cpu_dq_owner(ctx, desc, c);
    char why[200];
    if (c->nv_dq_max_registers && (c->variant != FLASHCL_BWD_NV_WGMMA || flashcl_backward_dq_atomic(c) == 1))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                            "FLASHCL_BWD_PARAMS: DQ_MAXNREG caps the nv-wgmma backward's dQ pass, which %s does not run",
                            c->variant == FLASHCL_BWD_NV_WGMMA ? "DQ=atomic" : "this variant");
    if (!backward_fit(ctx, desc, c->variant, c->block_m, c->block_n, c->work_group_size,
                      flashcl_backward_dq_atomic(c), c->nv_stages, c->nv_own_regs, why, sizeof why))
        /* Overrides written for nv-mma meet nv-wgmma where the table now chooses it. */
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "%s%s", why,
                            c->variant == FLASHCL_BWD_NV_WGMMA && env.variant < 0
                                ? " (the table chose nv-wgmma here; VARIANT=nv-mma picks the mma.sync kernels)"
                                : "");
    return FLASHCL_SUCCESS;
}
