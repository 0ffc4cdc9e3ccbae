/* params_serving.c: the paged/varlen kernels' parameters: the kernel, its tiles, split-KV.
 *
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
 *             f16/bf16; FP8 pages on sm_89+ with f16 queries, D <= 128; 16-byte
 *             aligned K/V rows); otherwise, and for tiled
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
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "params_internal.h"

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
        /* V's tile is 16 keys a warp also where HEAD_GROUP's tiles are 32 (FP8 pages' HG_WIDE,
         * which moves V to it in halves) */
        const size_t warps = (size_t)c->head_group * (size_t)(c->head_warps > 1 ? c->head_warps : 1), tiles = warps * 16 * (d + 8),
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
        size_t stages = (size_t)c->stages * (size_t)c->unroll * 2 * chunks * wg * (c->chunk_bytes ? (size_t)c->chunk_bytes : 16);
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
    {"HG_KEYS", offsetof(flashcl_decode_choice, hg_keys)},
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
                                    "REG_COPY_MIN_KEYS, HEAD_GROUP, HEAD_WARPS, HG_KEYS, L2_PREFETCH)",
                                    kv.at);
            const size_t off = decode_keys[k].offset;
            const int is_switch = off == offsetof(flashcl_decode_choice, meta_args);
            const int is_l2 = off == offsetof(flashcl_decode_choice, l2_prefetch);
            const int may_be_0 = is_switch || is_l2 || off == offsetof(flashcl_decode_choice, head_group);
            int *field = DECODE_FIELD(c, k);
            const int is_hg_keys = off == offsetof(flashcl_decode_choice, hg_keys);
            if (!flashcl_kv_int(&kv, may_be_0 ? 0 : 1, is_switch ? 1 : 1 << 20, field) ||
                (is_l2 && *field != 0 && *field != 64 && *field != 128 && *field != 256) ||
                (is_hg_keys && *field != 16 && *field != 32))
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS, "FLASHCL_DECODE_PARAMS: %s needs %s at '%s'",
                                    decode_keys[k].key,
                                    is_switch ? "0 or 1"
                                    : is_l2   ? "0, 64, 128 or 256"
                                    : is_hg_keys ? "16 or 32"
                                    : may_be_0 ? "an integer 0..1048576"
                                               : "an integer 1..1048576",
                                    kv.at);
        }
        c->source = "FLASHCL_DECODE_PARAMS";
    }
    return FLASHCL_SUCCESS;
}

/* 8 bytes of FP8 pages, not 16, so that a lane holds 8 elements of q and of
 * its accumulators as with halves (16 a lane took twice the registers and ran
 * at a quarter of the f16 kernel's bytes/s on the H200). */
int flashcl_decode_kv_vec(const flashcl_decode_problem *pb) {
    return pb->kv_fp8 ? 8 : 16 / (int)flashcl_dtype_size(pb->dtype);
}

/* FP8 pages in the tensor-core decode kernel: it widens the bytes to float16 in registers with
 * cvt.rn.f16x2.e4m3x2 / .e5m2x2 (sm_89+) and multiplies in float16, so the queries must be
 * float16 (bfloat16 and float32 ones decode in cl/paged_decode.cl). Up to D=128: the widening
 * runs under REG_COPY, whose tile in registers would cost 128 registers a thread at D=256. */
static int decode_mma_fp8_ok(const flashcl_context *ctx, const flashcl_decode_problem *pb) {
    return ctx->info.nv_cc_major * 10 + ctx->info.nv_cc_minor >= 89 && pb->dtype == FLASHCL_FLOAT16 &&
           pb->head_dim <= 128;
}

/* The tensor-core decode kernel's own conditions (its entry's max_rows aside). */
static int decode_mma_applies(const flashcl_context *ctx, const flashcl_decode_problem *pb) {
    return ctx->info.nv_cc_major >= 8 && !flashcl_variant_forced("portable") &&
           (!pb->kv_fp8 || decode_mma_fp8_ok(ctx, pb)) && pb->dtype != FLASHCL_FLOAT32 && pb->head_dim % 16 == 0 &&
           pb->vec_aligned;
}

/* Checks an explicit decode-kernel choice, one kv head a group; "" when it fits. HEAD_GROUP
 * is kept after, only where it fits (decode_head_group): what it falls back to is checked here. */
static void decode_fit(const flashcl_context *ctx, const flashcl_decode_problem *pb,
                       const flashcl_decode_choice *c, char *why, size_t n) {
    const int vec = flashcl_decode_kv_vec(pb);
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
        if (pb->kv_fp8 && !decode_mma_fp8_ok(ctx, pb))
            snprintf(why, n, "the mma decode kernel reads FP8 pages only on NVIDIA sm_89+, with float16 queries and "
                             "head_dim <= 128 (KERNEL=decode or tiled reads them anywhere)");
        else if (!decode_mma_applies(ctx, pb))
            snprintf(why, n, "the mma decode kernel needs NVIDIA sm_80+, f16/bf16, head_dim a multiple of 16 "
                             "and 16-byte aligned K/V rows");
        else if (pb->kv_fp8 && c->block_n * (pb->head_dim / 16) % 32)
            snprintf(why, n, "mma decode over FP8 pages: BLOCK_N %d x head_dim %d / 16 must be a multiple of 32 "
                             "(a lane's 16-byte loads of a tile)", c->block_n, pb->head_dim);
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
    flashcl_check_work_group(ctx, c->work_group_size, why, n);
    flashcl_check_local(ctx, flashcl_decode_local_bytes(c, pb->head_dim), why, n);
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
     * with one work-item a row, its loops over D=96 and 256-token pages ran
     * past llvmpipe's 65535 iterations (test_serving, f32 page 256: wrong);
     * with 4 or more work-items a row each iterates a quarter as often. */
    const int cpu = (ctx->info.type & CL_DEVICE_TYPE_CPU) != 0 && !ctx->info.is_rusticl;
    const int vec = flashcl_decode_kv_vec(pb);
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
        /* FP8 pages: 32-key tiles, as many bytes in flight as 16 keys of 16-bit rows
         * (cl/paged_decode_nv.cl, LANE_LOADS); HEAD_GROUP's too by default at D=128 (HG_WIDE,
         * decode_hg_wide), else 16. HG_WIDE against HEAD_GROUP's 16-key FP8 tiles (H100, e4m3,
         * D=128, 32/8 heads, kernel times back to back, 2026-12-05, 0e0d30e): 7-11 % faster
         * ((16, 16384) 195.2 us against 211.4 with 8 warps a head, (64, 65536) 2910.9 against
         * 3236.6 with 4 on each of two heads), level at (4, 4096). */
        c->block_n = pb->kv_fp8 ? 32 : 16;
        /* At D=64 too, though clang's build takes 172 registers against 138 for 16-key tiles
         * (a four-warp group fewer an SM than decode_derive's D=64 split count assumes): over
         * e4m3 pages, 32/8 heads, batch 1/4/16 x 16384-131072 keys, calls back to back (H100,
         * 2026-12-05, `flashcl bench --decode --kv-dtype e4m3 --head-dim 64`, two alternated
         * rounds at 688a8ca): batch 16 9-22 % less time a call ((16, 65536) 430 us against 550),
         * batch 4 3-6 % less at 16384 and 65536 keys, batch 1 and (4, 131072) level
         * (docs/perf-notes-fp8.md). D=96 is not a multiple of 64 (decode_hg_wide). */
        c->hg_keys = pb->kv_fp8 && (pb->head_dim == 128 || pb->head_dim == 64) ? 32 : 16;
        /* FP8 pages always run REG_COPY's loop (decode_reg_copy): the fit checks made before
         * that must count its one tile buffer a warp, not STAGES of them. */
        c->reg_copy = pb->kv_fp8 != 0;
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
        c->chunk_bytes = pb->kv_fp8 ? 8 : 16;
        /* Fewer stages until the pipeline fits __local with 1 KB to spare. */
        const size_t budget = flashcl_local_budget(ctx);
        while (c->stages > 2 && flashcl_decode_local_bytes(c, pb->head_dim) > budget)
            --c->stages;
    } else {
        c->block_n = cpu || pb->head_dim <= 128 ? 32 : 16;
        c->tpr = cpu ? 1 : 128 / c->block_m;
        if (c->tpr > 32)
            c->tpr = 32;
        if (c->tpr > c->block_n)
            c->tpr = c->block_n;
        const size_t budget = flashcl_local_budget(ctx);
        while (c->block_n > c->tpr && flashcl_decode_local_bytes(c, pb->head_dim) > budget)
            c->block_n /= 2;
        while (c->block_m > 1 && ((size_t)c->block_m * (size_t)c->tpr > ctx->info.max_wg ||
                                  flashcl_decode_local_bytes(c, pb->head_dim) > budget))
            c->block_m /= 2;
        /* Still too big with one row (16 KiB at D=128 with a 32-key tile):
         * fewer keys a tile, and work-items a row to match. */
        while (c->block_n > 1 && flashcl_decode_local_bytes(c, pb->head_dim) > budget) {
            c->block_n /= 2;
            if (c->tpr > c->block_n)
                c->tpr = c->block_n;
        }
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
    flashcl_log("serving parameters from %s passed over: %s",
                flashcl_level_source(ctx, level, NULL), why);
    return 0;
}

/* Whether HEAD_GROUP's tiles over FP8 pages are 32 keys (HG_WIDE, cl/paged_decode_nv.cl: 16-byte
 * loads, widened where used) rather than 16 (K by 8-byte loads widened as they land): HG_KEYS 32
 * (the default at D=128), the head dim a multiple of 64, BLOCK_N not set to 16. */
static int decode_hg_wide(const flashcl_decode_problem *pb, const flashcl_decode_choice *c) {
    return pb->kv_fp8 && c->hg_keys == 32 && pb->head_dim % 64 == 0 && c->block_n == 32;
}

/* The mma decode kernel's HEAD_GROUP (c->head_group kv heads a work-group,
 * a warp each), kept where it applies, else 0: decoding only (one query
 * token a sequence, a GQA group of at most 8 rows), kv heads in whole
 * groups, head dims a multiple of 32 up to 128, 16-key tiles (32 over FP8
 * pages where decode_hg_wide says so), and the group's V tiles within
 * __local. Sets the work-group to a warp a head. */
static void decode_head_group(const flashcl_context *ctx, const flashcl_decode_problem *pb,
                              flashcl_decode_choice *c) {
    if (c->head_group <= 0 || c->kernel != FLASHCL_SERVING_DECODE_MMA) {
        c->head_group = c->head_warps = 0;
        return;
    }
    if (c->head_warps < 1)
        c->head_warps = 1;
    const int warps = c->head_group * c->head_warps;
    /* The one-head kernel's 32-key tiles over FP8 pages are HEAD_GROUP's 16, or 32 (HG_WIDE). */
    const int wide = decode_hg_wide(pb, c);
    flashcl_decode_choice hg = *c;
    if (pb->kv_fp8 && hg.block_n == 32 && !wide)
        hg.block_n = 16;
    int ok = pb->group >= 1 && pb->group <= 8 && c->block_m >= pb->group && c->block_m <= 8 &&
             pb->heads_k % c->head_group == 0 && pb->head_dim % 32 == 0 && pb->head_dim <= 128 &&
             hg.block_n == (wide ? 32 : 16) && (size_t)(32 * warps) <= ctx->info.max_wg;
    for (int i = 0; ok && i < pb->num_seqs; ++i)
        ok = pb->rows_per_seq[i] == pb->group;
    const size_t local = flashcl_decode_local_bytes(&hg, pb->head_dim);
    if (!ok || local > FLASHCL_NV_LOCAL_LIMIT || local > ctx->info.local_mem) {
        c->head_group = c->head_warps = 0;
        return;
    }
    c->block_n = hg.block_n;
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
    /* FP8 pages from 65536 keys where HEAD_GROUP's tiles would be 16 keys (decode_hg_wide): the
     * one-head kernel's 32-key tiles. H200, e4m3, D=128,
     * 32/8 heads, batch 1/4/16 x 65536 and 131072 keys: 9-16 % faster than the 16-key HEAD_GROUP
     * choice below ((16, 131072) 1249 us against 1484, (1, 131072) 97 against 110; 2026-12-04,
     * 32443ac). With 32-key HEAD_GROUP tiles (HG_WIDE) the rules below win or tie there (H100,
     * 2026-12-05, 0e0d30e, kernel times: (16, 131072) 1465.7 us against 1497.5, (4, 65536) 195.7
     * against 197.6, (1, 131072) 104.3 against 105.8). */
    if (pb->kv_fp8 && pb->max_keys >= 65536 && !decode_hg_wide(pb, c))
        return;
    const long g = one_head_groups(pb, c), cus = (long)ctx->info.compute_units;
    const int pairs = pb->heads_k % 2 == 0;
    if (pb->head_dim == 96 || pb->head_dim == 128) {
        /* FP8 pages at D=128 (32-key tiles; D=96 was not measured): 8 warps on one kv head also
         * from 16384 keys, and where the one-head grid is half to one wave at any length: the
         * 8 warps split a tile's keys, not its heads, so a group streams one head's rows and the
         * splits to merge halve. H200, e4m3, 32/8 heads, batch 1/4/16/64 x 4k-128k keys, kernel
         * time (`flashcl bench --decode --kv-dtype e4m3`, two rounds, 2026-12-05, 4cfd997):
         * batch 16 3-5 % faster at every length ((16, 131072) 1186 us against 1249, (16, 4096)
         * 47.0 against 49.6), batch 4 and 64 1.9-2.7 % from 65536 keys ((64, 131072) 4575 against
         * 4701) and level to 1.3 % at 16384; at 4096 keys batch 4 5 % and batch 64 3 % slower,
         * where the rules below stay. H100 (cb6616c against 9d64330): (16, 4096) 55.4 us against
         * 58.5, the rest level (BENCHMARKS.md). */
        const int fp8_one_head = pb->kv_fp8 && pb->head_dim == 128 &&
                                 (pb->max_keys >= 16384 || (g * 2 >= cus && g <= cus));
        if ((g * 8 <= cus && pb->max_keys >= 8192) || fp8_one_head)
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
    /* FP8 pages are widened on their way through registers, which the cp.async loop does not
     * take: the one-head kernel always runs REG_COPY's loop over them. */
    if (c->kernel == FLASHCL_SERVING_DECODE_MMA && !c->head_group && pb->kv_fp8) {
        c->reg_copy = 1;
        return;
    }
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
    const struct flashcl_param_db *db = flashcl_param_db_get(ctx);
    const level_table levels[] = {
        FILE_AND_BUILTIN_LEVELS(db ? db->file.serving : NULL, db ? db->file.num_serving : 0, decode),
    };
    int level;
    const decode_entry *d =
        flashcl_walk_levels(ctx, levels, COUNT(levels), decode_applies, pb, &level, source);
    if (!d) {
        *source = "default: global";
        return &decode_global[0];
    }
    if (d->why) /* a tuning-file entry without a comment has none */
        *source = flashcl_param_intern(ctx, "%s (%s)", *source, d->why);
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
    /* A built-in decode kernel that cannot fit the device's __local or
     * work-group (an NVIDIA GPU under FLASHCL_MAX_LOCAL_MEM=16384: the mma
     * kernel's fixed tiles need more) gives way to the tiled kernel, whose
     * tiles shrink. A tuning-file entry that does not fit never gets here
     * (decode_applies passes it over); one FLASHCL_DECODE_PARAMS forces stays,
     * and is refused. */
    if (forced_kernel < 0 && c->kernel != FLASHCL_SERVING_TILED &&
        (flashcl_decode_local_bytes(c, pb->head_dim) > flashcl_local_budget(ctx) ||
         (size_t)c->work_group_size > ctx->info.max_wg))
        decode_derive(ctx, pb, e, FLASHCL_SERVING_TILED, c);
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
    /* Where loops stop early (flashcl_loop_limit_keys): slices short enough,
     * else an error, never a result over part of the keys. */
    const long cap = flashcl_loop_limit_keys(ctx, pb->head_dim);
    if (cap > 0) {
        const long need = (pb->max_keys + cap - 1) / cap;
        if (pb->requested_splits <= 0 && need > c->splits)
            c->splits = need < FLASHCL_MAX_SPLITS ? (int)need : FLASHCL_MAX_SPLITS;
        if (c->kernel == FLASHCL_SERVING_TILED ? need > c->splits : pb->max_keys > cap)
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_PARAMS,
                                "%s ends a kernel's loops after 65535 iterations: %ld keys in %d slices exceed "
                                "the %ld one work-item may walk at head_dim %d",
                                ctx->info.name, pb->max_keys, c->splits, cap, pb->head_dim);
    }
    decode_reg_copy(pb, c);
    return FLASHCL_SUCCESS;
}

