/* params_forward.c: the forward kernel's parameter database: built-in entries, the lookup chain, overrides.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "params_internal.h"

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
    /* FP8 q, k, v on warpgroup MMA (cl/flash_fwd_sm90_fp8.cl; its one shape: 64 rows over 128-key
     * tiles, one warpgroup). `test_fp8_forward` passed on an H100 (2026-12-05, `bench/h200.sh
     * pending`); TFLOP/s e4m3 / flashcl's f16 in the same call: (4,32,4096,128) 820 / 534, causal
     * 616 / 467; (4,32,4096,64) 549 / 423; (1,32,16384,128) 814 / 500. The portable kernel, the
     * only other FP8 path on NVIDIA, ran (4,32,4096,128) at 6.7 on the H200. The kernel's own
     * conditions (a 16-bit output, head dims in steps of 16, 16-byte rows) are
     * flashcl_nv_wgmma_fp8_eligible's; elsewhere the portable kernel runs. Prefill only:
     * at one query row the kernel fills 1 of its 64 and its pre-pass transposes all of V every
     * call; decode there has not been measured. */
    {"sm_90", NULL, "nv-wgmma-fp8", FLASHCL_FLOAT8_E4M3, 32, 128, PREFILL, ANY, 64, 128, 0, 4,
     "measured on an H100: 820 TFLOP/s at (4,32,4096,128), 1.54x flashcl's f16"},
    {"sm_90", NULL, "nv-wgmma-fp8", FLASHCL_FLOAT8_E5M2, 32, 128, PREFILL, ANY, 64, 128, 0, 4,
     "as e4m3 (the same kernel; tested, not timed)"},
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
    /* CPU (cl/flash_fwd_cpu.cl): 128 query rows per work-item, eight
     * 16-lane row vectors, reuse each converted K/V element 128 times, which
     * also keeps the TLB misses of long rows (a head's keys 2 KiB apart in
     * the packed layout) off the critical path. Measured on PoCL (2-core AMD
     * EPYC Zen 4, f32, GFLOP/s from the min of `flashcl bench --device cpu
     * --iters 5`, 2026-12-04), rows x keys x lanes at (1,8,1024,64) none /
     * causal and (1,8,16384,64) none / causal: 32x64x8 137-150 / 129-141 and
     * 113 (8192); 64x64x16 160-171 / 129-162 and 117 / 128; 128x64x16 166 /
     * 141 and 138 / 141; 64x128x16 no better. */
    {"CPU", NULL, "cpu", ANY, 1, 256, PHASE_ANY, ANY, 128, 64, 0, 0,
     "measured: PoCL 2-core AMD EPYC, f32, 128x64 of 6 tilings"},
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

/* ---- fitting ----------------------------------------------------------------------------- */

/* cl/flash_fwd_sm90.cl's Q_PER_TILE: above one 64-dim panel, Q keeps a __local block of its
 * own beside one K and one V tile wherever the three fit in FLASHCL_NV_LOCAL_LIMIT bytes (with
 * the kernel's 1024 of alignment room): one warpgroup with 48-key tiles. At one panel Q stays
 * in registers (Q_KEEP). */
static int wgmma_q_own_block(int head_dim, int block_m, int block_n) {
    const size_t dpad = ((size_t)head_dim + 63) / 64 * 64;
    return dpad != 64 && ((size_t)block_m + 2 * (size_t)block_n) * dpad * 2 + 1024 <= FLASHCL_NV_LOCAL_LIMIT;
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
     * and 41.4 at 2 (D=64: 50.0 against 49.4). nv-wgmma-fp8 at D <= 64 takes
     * 16 too: on an H100 (2026-12-06) causal (4,32,4096,64) ran 538 and 535
     * TFLOP/s at 16 against 518-522 at 8, (2,16,8192,64) 588 and 596 against
     * 583-584, level at (1,32,16384,64) and (16,16,1024,64); 32 pairs lost
     * 2 % at 16384 keys. At D=128 8 stays best by about 1 %. */
    if (!(r->window_left < 0 && r->window_right >= 0))
        return 0;
    if (variant && !strcmp(variant, "nv-tf32"))
        return 16;
    return variant && !strcmp(variant, "nv-wgmma-fp8") && r->head_dim <= 64 ? 16 : 8;
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
    /* The FP8 kernel above head dim 64: NVIDIA's build took 168 registers at D=128 but 188 with
     * LPT_HEADS (the causal order), two work-groups an SM; capped at 168 (24 bytes of spill),
     * three: causal (4,32,4096,128) 690 TFLOP/s against 587 by wall clock, full attention level
     * (H200, 2026-12-05, BENCHMARKS.md). At D <= 64 it takes 152, three work-groups an SM; capped
     * at 128 (72 bytes of spill, nine local accesses in a tile of about 490 instructions; none in
     * the causal order's build), four: (4,32,4096,64) 568-572 TFLOP/s against 523-527 uncapped,
     * causal 491-494 against 459-461 (H100, 2026-12-05, tree 88274de, `bench/h200.sh pending`,
     * alternated). */
    if (p->variant && !strcmp(p->variant, "nv-wgmma-fp8"))
        return head_dim > 64 ? 168 : 128;
    return 0;
}

size_t flashcl_forward_local_bytes(const flashcl_params *p, int head_dim) {
    size_t d = (size_t)head_dim, m = (size_t)p->block_m, n = (size_t)p->block_n, floats;
    if (!strcmp(p->variant, "cpu")) { /* Q^T, K, V, S, acc, 3 row arrays: see cl/flash_fwd_cpu.cl */
        const size_t lanes = FLASHCL_CPU_LANES, rv0 = (m + lanes - 1) / lanes, rg = rv0 < 4 ? rv0 : 4;
        const size_t mpad = (rv0 + rg - 1) / rg * rg * lanes; /* the kernel's M_PAD */
        const size_t dpad = (d + lanes - 1) / lanes * lanes, npad = (n + 3) / 4 * 4;
        floats = d * mpad + npad * d + n * dpad + npad * mpad + mpad * dpad + 3 * mpad;
    } else if (!strcmp(p->variant, "portable")) { /* q, K/V, S, reductions (+1 padding per row) */
        /* FP8 tiles are decoded into these float tiles: the same bytes. */
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
    } else if (!strcmp(p->variant, "nv-wgmma-fp8")) { /* bytes, see SMEM_BYTES: K, Vt, Q in 128-byte rows + 1024 */
        return (n + (d + 63) / 64 * 64 + m) * 128 + 1024;
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
    why[0] = '\0';
    if (strcmp(v, "cpu") && strcmp(v, "portable") && !flashcl_variant_is_nv(v))
        snprintf(why, n, "unknown variant '%s' (portable, cpu, nv-mma, nv-tf32, nv-wgmma, nv-wgmma-fp8)", v);
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
    else if (!strcmp(v, "nv-wgmma-fp8") && ((p->work_group_size != 128 && p->work_group_size != 256) ||
                                             p->block_m != p->work_group_size / 2 || p->block_n != 128))
        snprintf(why, n, "FP8 wgmma kernel: one or two warpgroups of 64 rows each over 128-key tiles, WARPS 4 or 8, "
                 "BLOCK_M 16*WARPS, BLOCK_N 128 (got %d, %d, %d)", p->work_group_size / 32, p->block_m, p->block_n);
    else if (!strcmp(v, "nv-wgmma-fp8") && (head_dim < 32 || head_dim > 128 || head_dim % 16))
        snprintf(why, n, "FP8 wgmma kernel: head_dim %d is not a multiple of 16 in 32..128", head_dim);
    else if (!strcmp(v, "nv-tf32") && (p->work_group_size < 32 || p->work_group_size % 32 ||
                                        p->block_m != p->work_group_size / 2 || p->block_n % 8))
        snprintf(why, n, "float32 tensor-core kernel: BLOCK_M %d must be 16*WARPS (WARPS %d) and BLOCK_N %d a "
                 "multiple of 8", p->block_m, p->work_group_size / 32, p->block_n);
    else if (!strcmp(v, "nv-tf32") && head_dim > 128)
        snprintf(why, n, "float32 tensor-core kernel: head_dim %d over 128", head_dim);
    else if (flashcl_variant_is_nv(v) && flashcl_forward_local_bytes(p, head_dim) > FLASHCL_NV_LOCAL_LIMIT)
        snprintf(why, n, "tensor-core kernel: %zu bytes of tiles, over its 48000-byte limit",
                 flashcl_forward_local_bytes(p, head_dim));
    if (!ctx->is_host) {
        flashcl_check_local(ctx, flashcl_forward_local_bytes(p, head_dim), why, n);
        flashcl_check_work_group(ctx, p->work_group_size, why, n);
    }
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

/* Why kernel v does not apply to d on ctx's device (what holds it off, else what it needs), or
 * NULL where it applies: the one text of both ways to name a kernel (FLASHCL_PARAMS and
 * flashcl_set_params). */
static const char *variant_refusal(const flashcl_context *ctx, const flashcl_attention_desc *d,
                                   const char *v) {
    if (!strcmp(v, "cpu"))
        return ctx->info.is_rusticl ? FLASHCL_RUSTICL_NO_CPU : NULL;
    if (!flashcl_variant_is_nv(v))
        return NULL;
    const int wgmma = !strncmp(v, "nv-wgmma", 8);
    if (flashcl_variant_forced("portable"))
        return "FLASHCL_VARIANT=portable keeps the tensor-core kernels off";
    if (wgmma && flashcl_variant_forced("nv-mma"))
        return "FLASHCL_VARIANT=nv-mma keeps the warpgroup-MMA kernels off";
    if (wgmma && ctx->no_sm90a)
        return "sm_90a code failed to build on this context";
    if (!strcmp(v, "nv-mma"))
        return flashcl_nv_mma_eligible(ctx, d) ? NULL
                                               : "it needs NVIDIA sm_80+, f16/bf16, D 32..256";
    if (!strcmp(v, "nv-wgmma"))
        return flashcl_nv_wgmma_eligible(ctx, d) ? NULL
                                                 : "it needs NVIDIA sm_90, f16/bf16, D 32..128";
    if (!strcmp(v, "nv-wgmma-fp8"))
        return flashcl_nv_wgmma_fp8_eligible(ctx, d) ? NULL
                                                     : "it needs " FLASHCL_NV_WGMMA_FP8_NEEDS;
    return flashcl_nv_tf32_eligible(ctx, d) ? NULL : "it needs NVIDIA sm_80+, f32, D <= 128";
}

/* variant_refusal, or for the FP8 kernel once it failed to build on this context, that: what
 * keeps a kernel from the lookup (defaults and flashcl_set_params's entries alike).
 * FLASHCL_PARAMS names it past that and builds it again, a failure then an error. */
static const char *stored_refusal(const flashcl_context *ctx, const flashcl_attention_desc *d,
                                  const char *v) {
    if (ctx->no_fp8_wgmma && !strcmp(v, "nv-wgmma-fp8"))
        return "it failed to build on this context";
    return variant_refusal(ctx, d, v);
}

static int variant_applies(const flashcl_context *ctx, const flashcl_attention_desc *d, const char *v) {
    return v && !stored_refusal(ctx, d, v);
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
    return variant && (!strcmp(variant, "nv-mma") || !strcmp(variant, "nv-tf32") || !strcmp(variant, "nv-wgmma") ||
                       !strcmp(variant, "nv-wgmma-fp8"));
}

/* NVIDIA sm_80+ and not FLASHCL_VARIANT=portable. */
static int nv_tensor_cores(const flashcl_context *ctx) {
    return !flashcl_variant_forced("portable") && !ctx->is_host && ctx->info.nv_cc_major >= 8;
}

/* The 16-bit tensor-core kernels read q, k, v as f16/bf16: FP8 descs take
 * the portable kernel on GPUs (and the cpu one on CPUs), which decode FP8. */
static int sixteen_bit(const flashcl_attention_desc *desc) {
    return desc->dtype == FLASHCL_FLOAT16 || desc->dtype == FLASHCL_BFLOAT16;
}

int flashcl_nv_mma_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc) {
    return nv_tensor_cores(ctx) && sixteen_bit(desc) && desc->head_dim >= 32 && desc->head_dim <= 256;
}

/* sm_90a code runs on compute capability 9.0 exactly; the kernel takes head dims 32..128. */
int flashcl_nv_wgmma_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc) {
    return nv_tensor_cores(ctx) && !ctx->no_sm90a && !flashcl_variant_forced("nv-mma") &&
           ctx->info.nv_cc_major == 9 && ctx->info.nv_cc_minor == 0 && sixteen_bit(desc) &&
           desc->head_dim >= 32 && desc->head_dim <= 128;
}

/* cl/flash_fwd_sm90_fp8.cl's conditions: compute capability 9.0 with sm_90a,
 * FP8 q, k, v with a 16-bit output, head dims 32..128 in steps of 16, every
 * row of q, k and v 16-byte aligned (its cp.async and V's 16-byte loads:
 * offsets and strides in bytes, the buffers' own alignment being the
 * driver's), and row blocks of descale factors, if any, a multiple of 8 keys
 * (the kernel reads a k factor per 8 keys). */

int flashcl_nv_wgmma_fp8_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc) {
    return nv_tensor_cores(ctx) && !ctx->no_sm90a && !flashcl_variant_forced("nv-mma") &&
           ctx->info.nv_cc_major == 9 && ctx->info.nv_cc_minor == 0 &&
           flashcl_dtype_is_fp8(desc->dtype) &&
           (desc->out_dtype == FLASHCL_FLOAT16 || desc->out_dtype == FLASHCL_BFLOAT16) && desc->head_dim >= 32 &&
           desc->head_dim <= 128 && desc->head_dim % 16 == 0 && flashcl_layout_rows_16_bytes(&desc->q) &&
           flashcl_layout_rows_16_bytes(&desc->k) &&
           (desc->v_packed ? desc->v.offset % 16 == 0 : flashcl_layout_rows_16_bytes(&desc->v)) &&
           (!desc->fp8.per_head || desc->fp8.block_rows % 8 == 0);
}

int flashcl_nv_tf32_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc) {
    return nv_tensor_cores(ctx) && desc->dtype == FLASHCL_FLOAT32 && desc->head_dim <= 128;
}

/* ---- the lookup ----------------------------------------------------------------------------- */

/* The fewest keys a tile may have: the cpu kernel's 8-key vectors, the
 * portable kernel's TPR work-items a row. */
static int min_block_n(const flashcl_params *p) {
    return !strcmp(p->variant, "cpu") ? 8 : p->threads_per_row ? p->threads_per_row : 1;
}

/* Shrinks a default to the device: keys per tile first, then rows, until
 * they fit flashcl_local_budget. */
static int shrink_to_fit(const flashcl_context *ctx, int head_dim, flashcl_params *p) {
    const size_t budget = flashcl_local_budget(ctx);
    const int min_n = min_block_n(p);
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
    const int min_n = min_block_n(p);
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
    struct flashcl_param_db *db = flashcl_param_db_get(ctx);
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
                !flashcl_level_key_match(ctx, level, e, arch) || (score = class_match(e, desc)) < 0)
                continue;
            /* Newer overrides win ties: >= keeps the last of equals. */
            if (level == LVL_SET ? score < best_score : score <= best_score)
                continue;
            flashcl_params cand;
            entry_params(e, &cand);
            if (level < LVL_TYPE && !flashcl_params_fit(ctx, desc->head_dim, &cand, why, sizeof why)) {
                flashcl_log("parameters from %s passed over: %s",
                            flashcl_level_source(ctx, level, e), why);
                continue;
            }
            best = e;
            best_score = score;
        }
        if (!best)
            continue;
        entry_params(best, p);
        p->source = flashcl_level_source(ctx, level, best);
        if (level >= LVL_TYPE && shrink_to_fit(ctx, desc->head_dim, p))
            p->source = flashcl_shrunk_source(ctx, p->source);
        return 1;
    }
    return 0;
}

int flashcl_variant_params(const flashcl_context *ctx, const flashcl_attention_desc *desc, const char *variant,
                           flashcl_params *p, char *why, size_t why_size) {
    why[0] = '\0';
    const char *refusal = variant_refusal(ctx, desc, variant);
    if (refusal) {
        snprintf(why, why_size, "%s", refusal);
        return 0;
    }
    /* The FP8 wgmma kernel has one shape, whatever the table says. */
    if (!strcmp(variant, "nv-wgmma-fp8")) {
        memset(p, 0, sizeof *p);
        p->variant = "nv-wgmma-fp8";
        p->block_m = 64;
        p->block_n = 128;
        p->work_group_size = 128;
        /* Explicit (flashcl_params_explicit): a failed build is an error, not a fallback. */
        p->source = "FLASHCL_PARAMS";
        return 1;
    }
    /* The tensor-core variants' tiles are the architecture table's, where
     * one of its entries applies to the problem on this device. */
    if (flashcl_variant_is_nv(variant)) {
        for (size_t i = 0; i < COUNT(builtin_arch); ++i) {
            const flashcl_param_entry *e = &builtin_arch[i];
            if (!strcmp(e->variant, variant) && class_match(e, desc) >= 0) {
                entry_params(e, p);
                p->source = "FLASHCL_PARAMS";
                return 1;
            }
        }
        snprintf(why, why_size, "none of its built-in tile shapes is for this problem");
        return 0;
    }
    if (strcmp(variant, "cpu") && strcmp(variant, "portable"))
        return 0;
    entry_params(!strcmp(variant, "cpu") ? &builtin_type[0] : &builtin_global[desc->head_dim > 128], p);
    shrink_to_fit(ctx, desc->head_dim, p);
    /* Where not one row of the cpu kernel fits, shrink_to_fit takes the portable kernel: right
     * for a default, not for a kernel asked for by name. */
    if (strcmp(p->variant, variant)) {
        snprintf(why, why_size, "one row of its tiles does not fit the device's local memory");
        return 0;
    }
    p->source = "FLASHCL_PARAMS";
    return 1;
}

/* The kernel that cannot fail to apply: the type default (cl/flash_fwd_cpu.cl
 * on CPUs, cl/flash_fwd.cl elsewhere) and the host path without OpenCL. */
void flashcl_fallback_params(const flashcl_context *ctx, const flashcl_attention_desc *desc,
                             flashcl_params *p) {
    memset(p, 0, sizeof *p);
    if (ctx->is_host) {
        p->block_m = FLASHCL_HOST_BLOCK_M;
        p->block_n = FLASHCL_HOST_BLOCK_N;
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
    static const char *const names[] = {"portable", "cpu", "nv-mma", "nv-tf32", "nv-wgmma", "nv-wgmma-fp8"};
    flashcl_params p = *params;
    char why[200];
    class_entry(d, e);
    for (size_t i = 0; i < COUNT(names); ++i)
        if (p.variant && !strcmp(p.variant, names[i]))
            e->variant = names[i];
    if (!e->variant)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                            "unknown variant '%s' (portable, cpu, nv-mma, nv-tf32, nv-wgmma, nv-wgmma-fp8)",
                            p.variant ? p.variant : "(null)");
    const char *refusal = stored_refusal(ctx, d, e->variant);
    if (refusal)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                            "the %s kernel does not apply here: %s", e->variant, refusal);
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
    struct flashcl_param_db *db = flashcl_param_db_get(ctx);
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
    /* The file's dtype key knows float32, float16 and bfloat16; anything else would be written
     * as "any" and override every dtype's entry. */
    if (d.dtype != FLASHCL_FLOAT32 && d.dtype != FLASHCL_FLOAT16 && d.dtype != FLASHCL_BFLOAT16)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "the tuning file has no problem class for dtype %d (FP8): flashcl_set_params sets one "
                            "for this context",
                            (int)d.dtype);
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

long flashcl_loop_limit_keys(const flashcl_context *ctx, int head_dim) {
    /* llvmpipe (gallivm, behind Mesa's rusticl) ends a kernel's loops once
     * they have run LP_MAX_TGSI_LOOP_ITERATIONS = 65535 iterations together
     * (src/gallium/auxiliary/gallivm/lp_bld_limits.h), with no error; OpenCL
     * sets no such limit. A work-item of the forward, backward and tiled
     * serving kernels iterates about head_dim / 4 + a few times a key
     * (22.3.6, f32, D=128: 1500 keys right, 2048 wrong; flashcl bench
     * --device rusticl --shape 1,1,4096,128: max_err 0.18), so the keys one
     * work-item may walk are capped at twice that estimate's cost: 819 at
     * D=128, 1365 at D=64. */
    if (!ctx || ctx->is_host || !ctx->info.is_rusticl)
        return 0;
    return 65535L / (head_dim / 2 + 16);
}
