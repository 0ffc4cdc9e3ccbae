/* test_params_tables.c: the backward kernels' table (flashcl_backward_params) and the decode
 * kernels' (flashcl_decode_params) on pretend devices, FLASHCL_BWD_PARAMS and FLASHCL_DECODE_PARAMS,
 * and the tuning file's serving and backward entries. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "params_common.h"

static int failures;

/* ---- the backward kernels' table (flashcl_backward_params) -------------------------------- */

/* flashcl_backward_params for a resolved desc of dtype dt and head_dim d under FLASHCL_BWD_PARAMS=env
 * (NULL: unset); skip_nv as the build-failure fallback passes it. */
static flashcl_status backward_choice_with(flashcl_context *ctx, flashcl_dtype dt, int d, const char *env,
                                           int deterministic, int skip_nv, flashcl_backward_choice *c) {
    flashcl_attention_desc r = desc_of(dt, 100, d, 0);
    flashcl_attention_desc_resolve(&r);
    if (env)
        setenv("FLASHCL_BWD_PARAMS", env, 1);
    else
        unsetenv("FLASHCL_BWD_PARAMS");
    flashcl_status st = flashcl_backward_params(ctx, &r, deterministic, skip_nv, c);
    unsetenv("FLASHCL_BWD_PARAMS");
    return st;
}

static flashcl_status backward_choice_of(flashcl_context *ctx, flashcl_dtype dt, int d, const char *env, int skip_nv,
                                         flashcl_backward_choice *c) {
    return backward_choice_with(ctx, dt, d, env, 0, skip_nv, c);
}

/* ... for float32. */
static flashcl_status backward_choice(flashcl_context *ctx, int d, const char *env, flashcl_backward_choice *c) {
    return backward_choice_of(ctx, FLASHCL_FLOAT32, d, env, 0, c);
}

static void test_backward_levels(void) {
    flashcl_backward_choice c;
    flashcl_context *ctx = test_context();
    /* A CPU with room for every tile: the CPU default as the table has it. */
    pretend_plain(ctx);
    ctx->info.type = CL_DEVICE_TYPE_CPU;
    ctx->info.local_mem = 1 << 20;
    ctx->info.max_wg = 4096;
    expect(backward_choice(ctx, 64, NULL, &c) == FLASHCL_SUCCESS && c.block_m == 64 && c.block_n == 256 &&
               c.work_group_size == 64 && c.variant == FLASHCL_BWD_CPU && !strncmp(c.source, "default: CPU (measured", 22),
           "backward, CPU: the cpu kernel, 64x256 tiles, 64 work-items, source names the level", &failures);
    expect(backward_choice(ctx, 64, "VARIANT=portable", &c) == FLASHCL_SUCCESS && c.variant == FLASHCL_BWD_PORTABLE &&
               c.block_n == 64,
           "FLASHCL_BWD_PARAMS=VARIANT=portable picks the portable kernel", &failures);
    expect(backward_choice(ctx, 64, "VARIANT=cpu,BLOCK_N=12", &c) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "multiple of 8"),
           "the cpu kernel refuses BLOCK_N not a multiple of 8", &failures);
    /* How the cpu kernel sums dQ (cpu_dq_owner): whole (batch, kv head) pairs a
     * work-item where they fill the compute units in whole waves, or where
     * there is one key block; atomics otherwise; the dQ pass when deterministic. */
    {
        static const struct {
            int units, batch, heads_k, seqlen, deterministic;
            const char *env;
            int owner;
            const char *what;
        } cases[] = {
            {2, 1, 8, 1024, 0, NULL, 1, "8 pairs on 2 units: owner"},
            {2, 1, 3, 1024, 0, NULL, 0, "3 pairs on 2 units (75 %): atomics"},
            {2, 1, 9, 1024, 0, NULL, 1, "9 pairs on 2 units (90 %): owner"},
            {16, 1, 8, 1024, 0, NULL, 0, "8 pairs on 16 units: atomics"},
            {16, 1, 1, 256, 0, NULL, 1, "one key block: owner whatever the units"},
            {2, 1, 8, 1024, 1, NULL, 0, "deterministic: the dQ pass"},
            {2, 1, 8, 1024, 0, "DQ=atomic", 0, "DQ=atomic: atomics"},
            {16, 1, 1, 1024, 0, "DQ=owner", 1, "DQ=owner: owner"},
            {2, 1, 8, 1024, 1, "DQ=owner", 0, "DQ=owner, deterministic: the dQ pass"},
            {2, 1, 8, 1024, 0, "VARIANT=portable,DQ=owner", 0, "DQ=owner on the portable kernel: none"},
        };
        const cl_uint units = ctx->info.compute_units;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
            flashcl_attention_desc r = desc_of(FLASHCL_FLOAT32, cases[i].seqlen, 64, 0);
            r.batch = cases[i].batch;
            r.heads_q = r.heads_k = cases[i].heads_k;
            flashcl_attention_desc_resolve(&r);
            ctx->info.compute_units = (cl_uint)cases[i].units;
            if (cases[i].env)
                setenv("FLASHCL_BWD_PARAMS", cases[i].env, 1);
            flashcl_status st = flashcl_backward_params(ctx, &r, cases[i].deterministic, 0, &c);
            unsetenv("FLASHCL_BWD_PARAMS");
            char what[160];
            snprintf(what, sizeof what, "backward, CPU dQ: %s", cases[i].what);
            expect(st == FLASHCL_SUCCESS && c.cpu_dq_owner == cases[i].owner &&
                       flashcl_backward_dq_atomic(&c) == !cases[i].deterministic,
                   what, &failures);
        }
        ctx->info.compute_units = units;
    }
    /* A small CPU: the cpu default shrinks, its keys staying a multiple of 8. */
    ctx->info.local_mem = 48 * 1024;
    expect(backward_choice(ctx, 256, NULL, &c) == FLASHCL_SUCCESS && c.variant == FLASHCL_BWD_CPU && c.block_n % 8 == 0 &&
               flashcl_backward_cpu_local_bytes(c.block_m, c.block_n, 256) <= 47 * 1024,
           "backward, CPU: the cpu default shrinks to fit 48 KB", &failures);
    ctx->info.local_mem = 1 << 20;
    /* A GPU: 16x16/128 up to D=128, 8x8/64 above. */
    pretend_h200(ctx);
    expect(backward_choice(ctx, 128, NULL, &c) == FLASHCL_SUCCESS && c.block_m == 16 && c.block_n == 16 &&
               c.work_group_size == 128 && c.variant == FLASHCL_BWD_PORTABLE &&
               !strncmp(c.source, "default: GPU (hand-chosen", 25),
           "backward, GPU D=128: 16x16 tiles, 128 work-items", &failures);
    expect(backward_choice(ctx, 129, NULL, &c) == FLASHCL_SUCCESS && c.block_m == 8 && c.block_n == 8 &&
               c.work_group_size == 64 && !strncmp(c.source, "default: GPU (", 14),
           "backward, GPU D=129: 8x8 tiles, 64 work-items", &failures);
    /* The default shrinks to a small device, and says so. */
    ctx->info.local_mem = 16 * 1024;
    ctx->info.max_wg = 64;
    expect(backward_choice(ctx, 128, NULL, &c) == FLASHCL_SUCCESS &&
               flashcl_backward_local_bytes(c.block_m, c.block_n, 128) <= 15 * 1024 && c.work_group_size == 64 &&
               strstr(c.source, "default: GPU") && strstr(c.source, "shrunk to fit"),
           "backward default shrinks to fit 16 KB and 64 work-items", &failures);
    pretend_h200(ctx);
    /* FLASHCL_BWD_PARAMS replaces single values (any case) and is named. */
    expect(backward_choice(ctx, 128, "block_m=8,WG=32", &c) == FLASHCL_SUCCESS && c.block_m == 8 &&
               c.block_n == 16 && c.work_group_size == 32 && !strcmp(c.source, "FLASHCL_BWD_PARAMS"),
           "FLASHCL_BWD_PARAMS override is used and named as the source", &failures);
    static const char *const bad[] = {"BLOCK_M=16,BOGUS=2", "VARIANT=gpu", "VARIANT=", "DQ=", "DQ=fast", "DQ=owners", "MAXNREG=8", "MAXNREG=256", "MAXNREG=", "BLOCK_M", "BLOCK_M=", "BLOCK_M=abc", "BLOCK_M=16,",
                                      "BLOCK_M=0", "BLOCK_M=1025", ",BLOCK_M=16", "BLOCK_M=16,,WG=32",
                                      "BLOCK_M=16x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char what[120];
        snprintf(what, sizeof what, "FLASHCL_BWD_PARAMS=\"%s\" is refused", bad[i]);
        expect(backward_choice(ctx, 128, bad[i], &c) == FLASHCL_ERROR_INVALID_PARAMS &&
                   strstr(flashcl_last_error(ctx), "FLASHCL_BWD_PARAMS"),
               what, &failures);
    }
    /* Explicit values are refused when they do not fit, never shrunk. */
    expect(backward_choice(ctx, 128, "BLOCK_M=64,BLOCK_N=64", &c) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "local memory"),
           "FLASHCL_BWD_PARAMS tiles over the device's local memory are refused", &failures);
    ctx->info.max_wg = 256;
    expect(backward_choice(ctx, 128, "WG=512", &c) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "work-group"),
           "FLASHCL_BWD_PARAMS work-group over the device's maximum is refused", &failures);

    /* NVIDIA sm_80+: the tensor-core kernels for 16-bit dtypes up to D=128. */
    pretend_h200(ctx);
    ctx->info.nv_cc_major = 8; /* Ampere: no warpgroup MMA */
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_MMA && c.block_m == 32 && c.block_n == 64 && c.work_group_size == 128 &&
               flashcl_backward_keys_per_group(&c) == 64 && flashcl_backward_rows_per_group(&c) == 64 &&
               !strncmp(c.source, "built-in arch: sm_80+", 21),
           "backward, sm_80 f16 D=64: nv-mma, 4 warps of 16 keys or rows, named by its level", &failures);
    expect(c.nv_max_registers == 168, "backward, sm_80 f16 D=64: registers capped at 168 (measured)", &failures);
    /* Hopper at head dims 32..128: the warpgroup MMA kernels, one warpgroup of 64 keys or rows,
     * two stages of 32-row tiles; above 64, K and V (Q and dO) held in registers, no cap. */
    pretend_h200(ctx);
    static const int wgmma_dims[] = {32, 48, 64, 65, 72, 77, 80, 95, 96, 100, 112, 128};
    for (size_t i = 0; i < sizeof wgmma_dims / sizeof wgmma_dims[0]; ++i) {
        const int d = wgmma_dims[i], held = d > 64;
        const flashcl_dtype dt = i % 2 ? FLASHCL_BFLOAT16 : FLASHCL_FLOAT16;
        char what[160];
        snprintf(what, sizeof what, "backward, sm_90 %s D=%d: nv-wgmma, 64 keys or rows a warpgroup, 32-row tiles%s",
                 dt == FLASHCL_BFLOAT16 ? "bf16" : "f16", d, held ? ", K and V held, two stages" : "");
        expect(backward_choice_of(ctx, dt, d, NULL, 0, &c) == FLASHCL_SUCCESS && c.variant == FLASHCL_BWD_NV_WGMMA &&
                   c.block_m == 32 && c.block_n == 32 && c.work_group_size == 128 &&
                   flashcl_backward_keys_per_group(&c) == 64 && flashcl_backward_rows_per_group(&c) == 64 &&
                   !flashcl_backward_dq_atomic(&c) && c.nv_own_regs == held &&
                   c.nv_max_registers == (held ? 0 : 168) && flashcl_backward_wgmma_stages(32, 128, d, held) == 2 &&
                   !strncmp(c.source, "built-in arch: sm_90", 20),
               what, &failures);
    }
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 31, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_MMA,
           "backward, sm_90 D=31: nv-mma (warpgroup MMA from 32)", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "VARIANT=nv-mma", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_MMA && c.block_m == 32 && c.work_group_size == 128 &&
               c.nv_max_registers == 168,
           "FLASHCL_BWD_PARAMS=VARIANT=nv-mma at sm_90 D=64: nv-mma with its own entry's tiles and cap", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "VARIANT=nv-wgmma", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_WGMMA && c.block_m == 32,
           "FLASHCL_BWD_PARAMS=VARIANT=nv-wgmma at sm_90 D=64: nv-wgmma with its entry's tiles", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "BLOCK_M=64,BLOCK_N=64", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_WGMMA && c.block_m == 64 && c.block_n == 64,
           "FLASHCL_BWD_PARAMS: nv-wgmma with 64-row tiles (one stage)", &failures);
    /* Two warpgroups (128 keys or rows a work-group) fit NVIDIA's 48 KB with 16-row tiles in two stages
     * (42240 bytes, by TMA) or 32-row tiles in one (41 KB); 16-row tiles with one warpgroup too. */
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "WG=256,BLOCK_M=16,BLOCK_N=16", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_WGMMA && c.work_group_size == 256 &&
               flashcl_backward_keys_per_group(&c) == 128 && flashcl_backward_rows_per_group(&c) == 128 &&
               flashcl_backward_wgmma_stages(16, 256, 64, 0) == 2,
           "FLASHCL_BWD_PARAMS: nv-wgmma with two warpgroups and 16-row tiles in two stages", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 48, "WG=256", 0, &c) == FLASHCL_SUCCESS &&
               c.work_group_size == 256 && c.block_m == 32 && flashcl_backward_wgmma_stages(32, 256, 64, 0) == 1 &&
               flashcl_backward_wgmma_stages(32, 128, 64, 0) == 2 && flashcl_backward_wgmma_stages(64, 128, 64, 0) == 1,
           "FLASHCL_BWD_PARAMS: nv-wgmma with two warpgroups and 32-row tiles (one stage)", &failures);
    /* Head dims 65..128 without the held fragments: two 64-dim panels, one stage of 16-row tiles (42 KB). */
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "OWN_REGS=0", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_WGMMA && c.nv_own_regs == 0 && c.block_m == 16 && c.block_n == 16 &&
               c.work_group_size == 128 && c.nv_max_registers == 0 &&
               flashcl_backward_wgmma_stages(16, 128, 128, 0) == 1 && flashcl_backward_wgmma_stages(16, 128, 96, 0) == 1,
           "FLASHCL_BWD_PARAMS=OWN_REGS=0 at D=128: the entry's tiles halved to 16 rows, one stage", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "VARIANT=nv-wgmma", 0, &c) == FLASHCL_SUCCESS &&
               c.nv_own_regs == 1 && c.block_m == 32,
           "FLASHCL_BWD_PARAMS=VARIANT=nv-wgmma at D=128: the entry's held fragments", &failures);
    /* Letting them go halves only the sides the override leaves, keys first, down to 16 rows. */
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "DQ=atomic,BLOCK_N=16", 0, &c) == FLASHCL_SUCCESS &&
               c.nv_own_regs == 0 && c.block_n == 16 && c.block_m == 16 && flashcl_backward_dq_atomic(&c),
           "FLASHCL_BWD_PARAMS=DQ=atomic,BLOCK_N=16 at D=128: BLOCK_M halved to 16 to fit", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "OWN_REGS=0,BLOCK_M=16", 0, &c) == FLASHCL_SUCCESS &&
               c.block_m == 16 && c.block_n == 16,
           "FLASHCL_BWD_PARAMS=OWN_REGS=0,BLOCK_M=16 at D=128: BLOCK_N halved to 16", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "WG=64", 0, &c) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "VARIANT=nv-mma"),
           "FLASHCL_BWD_PARAMS=WG=64 at D=128 (an nv-mma shape): refused, naming VARIANT=nv-mma", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "VARIANT=nv-mma,WG=64", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_MMA && c.work_group_size == 64,
           "... and taken with it", &failures);
    /* Two warpgroups adding dQ with atomics: 16-row tiles, 45 KB with the 4 KB dS tile of 128 keys. */
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "WG=256,BLOCK_M=16,BLOCK_N=16,DQ=atomic", 0, &c) ==
                   FLASHCL_SUCCESS && flashcl_backward_dq_atomic(&c) && c.work_group_size == 256,
           "FLASHCL_BWD_PARAMS: nv-wgmma with two warpgroups and DQ=atomic (16-row tiles)", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "VARIANT=nv-wgmma,DQ=atomic", 0, &c) == FLASHCL_SUCCESS &&
               flashcl_backward_dq_atomic(&c) && c.block_m == 16 && c.block_n == 16 && c.nv_own_regs == 0,
           "... and one warpgroup at D=128 (dS 2 KB beside 42 KB; the held fragments let go)", &failures);
    /* OWN_REGS: K and V held in registers, the stages in their __local: four 32-row stages in 34 KB. */
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "OWN_REGS=1,STAGES=4", 0, &c) == FLASHCL_SUCCESS &&
               c.nv_own_regs == 1 && c.nv_stages == 4 && c.nv_max_registers == 0 &&
               flashcl_backward_wgmma_stages(64, 128, 64, 1) == 2 &&
               flashcl_backward_wgmma_stages(64, 128, 64, 0) == 1,
           "FLASHCL_BWD_PARAMS OWN_REGS=1: four stages of 32 rows, or two of 64 (which without it take one); "
           "no register cap",
           &failures);
    /* ... and at D=128 (two panels): 64 registers of fragments beside dK's and dV's 128, and the
     * own block's 32 KB for two stages of 32-row tiles (one of 16 rows without it). */
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=32,BLOCK_N=32", 0, &c) ==
                   FLASHCL_SUCCESS && c.nv_own_regs == 1 && c.block_m == 32 && c.nv_max_registers == 0 &&
               flashcl_backward_wgmma_stages(32, 128, 128, 1) == 2 && flashcl_backward_wgmma_stages(32, 128, 128, 0) == 1,
           "FLASHCL_BWD_PARAMS OWN_REGS=1 at D=128: two stages of 32-row tiles", &failures);
    expect(backward_choice_of(ctx, FLASHCL_BFLOAT16, 96, "VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=16,BLOCK_N=16,STAGES=5",
                              0, &c) == FLASHCL_SUCCESS && c.nv_stages == 5,
           "... or five of 16 rows at D=96 (41 KB)", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "OWN_REGS=1,MAXNREG=200", 0, &c) == FLASHCL_SUCCESS &&
               c.nv_max_registers == 200,
           "... unless MAXNREG gives one", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.nv_dq_max_registers == 168 && c.nv_max_registers == 0 && c.nv_own_regs == 1 &&
               backward_choice_of(ctx, FLASHCL_FLOAT16, 80, "BLOCK_M=32", 0, &c) == FLASHCL_SUCCESS &&
               c.nv_dq_max_registers == 168 &&
               backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "DQ_MAXNREG=0", 0, &c) == FLASHCL_SUCCESS &&
               c.nv_dq_max_registers == 0 && c.nv_own_regs == 1 &&
               backward_choice_of(ctx, FLASHCL_FLOAT16, 64, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.nv_dq_max_registers == 0 &&
               backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "OWN_REGS=0", 0, &c) == FLASHCL_SUCCESS &&
               c.nv_dq_max_registers == 0 &&
               backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "OWN_REGS=1", 0, &c) == FLASHCL_SUCCESS &&
               c.nv_own_regs == 1 && c.nv_dq_max_registers == 0,
           "the held dQ pass capped at 168 registers by default above D=64 (DQ_MAXNREG=0: not; none where "
           "K and V are not held, nor at D=64)",
           &failures);
    /* STAGES: the TMA kernels' pipeline depth, within 48 KB (stats: 2 floats a row and stage). */
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "STAGES=3", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_WGMMA && c.nv_stages == 3 && c.block_m == 32,
           "FLASHCL_BWD_PARAMS STAGES=3: three stages of 32-row tiles (41 KB)", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "WG=256,BLOCK_M=16,BLOCK_N=16,STAGES=3", 0, &c) ==
                   FLASHCL_SUCCESS && c.nv_stages == 3 && c.work_group_size == 256,
           "... two warpgroups with three stages of 16-row tiles (45 KB)", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, NULL, 0, &c) == FLASHCL_SUCCESS && c.nv_stages == 0,
           "... and none by default (the kernel's own)", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "BLOCK_M=16,BLOCK_N=16", 0, &c) == FLASHCL_SUCCESS &&
               c.work_group_size == 128 && c.block_m == 16 && flashcl_backward_wgmma_stages(16, 128, 64, 0) == 2,
           "FLASHCL_BWD_PARAMS: nv-wgmma with 16-row tiles", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, NULL, 1, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_PORTABLE,
           "backward, sm_90 f16 D=64 after a tensor-core build failure: the portable kernels", &failures);
    ctx->no_sm90a_bwd = 1;
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_MMA && c.block_m == 32 && c.nv_max_registers == 168,
           "backward, sm_90 f16 D=64 after an nv-wgmma build failure: nv-mma's entry", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "VARIANT=nv-wgmma", 0, &c) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "sm_90a"),
           "... where VARIANT=nv-wgmma is refused, saying why", &failures);
    ctx->no_sm90a_bwd = 0;
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "MAXNREG=0", 0, &c) == FLASHCL_SUCCESS &&
               c.nv_max_registers == 0 && backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "maxnreg=200", 0, &c) ==
               FLASHCL_SUCCESS && c.nv_max_registers == 200,
           "FLASHCL_BWD_PARAMS MAXNREG=0 lifts the cap, MAXNREG=200 sets one", &failures);
    expect(backward_choice_of(ctx, FLASHCL_BFLOAT16, 128, "VARIANT=nv-mma", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_MMA && c.block_m == 32 && c.block_n == 32 && c.work_group_size == 64 &&
               flashcl_backward_nv_local_bytes(c.block_m, c.block_n, c.work_group_size, 128, 1) <= 48000 &&
               c.nv_dq_pass && !flashcl_backward_dq_atomic(&c) && c.nv_max_registers == 0,
           "FLASHCL_BWD_PARAMS=VARIANT=nv-mma, bf16 D=128: within 48000 bytes, dQ by its pass, no register cap",
           &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "VARIANT=nv-mma,DQ=atomic", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_MMA && flashcl_backward_dq_atomic(&c),
           "FLASHCL_BWD_PARAMS=VARIANT=nv-mma,DQ=atomic: nv-mma sums dQ with atomics", &failures);
    /* The fit counts the dS^T tile only when atomics will use it: 46976 bytes in pass mode, 54144 with atomics. */
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 96, "VARIANT=nv-mma,WG=128,BLOCK_M=48", 0, &c) == FLASHCL_SUCCESS &&
               flashcl_backward_nv_local_bytes(48, 32, 128, 96, 0) <= 48000,
           "nv-mma tiles that fit only without the atomic dQ tile are taken in pass mode", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 96, "VARIANT=nv-mma,WG=128,BLOCK_M=48,DQ=atomic", 0, &c) ==
                   FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "48000"),
           "... and refused with DQ=atomic", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT32, 64, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_PORTABLE,
           "backward, sm_90 f32: the portable kernels", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 160, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_PORTABLE,
           "backward, sm_90 f16 D=160: the portable kernels", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, NULL, 1, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_PORTABLE && c.block_m == 16,
           "backward, sm_90 f16 after an nv-mma build failure: the portable kernels and their tiles", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "VARIANT=portable", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_PORTABLE,
           "FLASHCL_BWD_PARAMS=VARIANT=portable passes over nv-mma", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 96, "VARIANT=nv-mma,WG=64,BLOCK_M=32", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_MMA && flashcl_backward_keys_per_group(&c) == 32 && c.block_m == 32,
           "FLASHCL_BWD_PARAMS resizes the nv-mma kernels", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "DQ=atomic", 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_WGMMA && flashcl_backward_dq_atomic(&c),
           "FLASHCL_BWD_PARAMS=DQ=atomic at sm_90 D=64: nv-wgmma sums dQ with atomics", &failures);
    expect(backward_choice_with(ctx, FLASHCL_FLOAT16, 64, "DQ=atomic", 1, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_WGMMA && !flashcl_backward_dq_atomic(&c),
           "... but not in deterministic mode", &failures);
    static const struct {
        flashcl_dtype dt;
        int d;
        const char *env, *why;
    } refused[] = {{FLASHCL_FLOAT16, 64, "VARIANT=nv-mma,BLOCK_M=24", "multiples of 16"},
                   {FLASHCL_FLOAT16, 64, "VARIANT=nv-mma,WG=48", "multiple of 32"},
                   {FLASHCL_FLOAT16, 64, "BLOCK_M=48", "32 or 64 rows"},
                   {FLASHCL_FLOAT16, 48, "WG=512", "WG 128 or 256"},
                   {FLASHCL_FLOAT16, 64, "WG=256,BLOCK_M=64", "over NVIDIA's 48000"},
                   {FLASHCL_FLOAT16, 64, "WG=256,DQ=atomic", "over NVIDIA's 48000"},
                   {FLASHCL_FLOAT16, 64, "STAGES=4", "over NVIDIA's 48000"},
                   {FLASHCL_FLOAT16, 64, "OWN_REGS=1,STAGES=6", "over NVIDIA's 48000"},
                   {FLASHCL_FLOAT16, 64, "OWN_REGS=1,DQ=atomic", "without DQ=atomic"},
                   {FLASHCL_FLOAT16, 128, "VARIANT=nv-wgmma,BLOCK_M=32,BLOCK_N=32,OWN_REGS=1,STAGES=3",
                    "over NVIDIA's 48000"},
                   {FLASHCL_FLOAT16, 128, "VARIANT=nv-wgmma,BLOCK_M=16,BLOCK_N=16,OWN_REGS=1,STAGES=6",
                    "over NVIDIA's 48000"},
                   {FLASHCL_BFLOAT16, 80, "VARIANT=nv-wgmma,BLOCK_M=64,BLOCK_N=64,OWN_REGS=1", "16- or 32-row"},
                   {FLASHCL_FLOAT16, 128, "VARIANT=nv-wgmma,BLOCK_M=32,BLOCK_N=64,OWN_REGS=1", "16- or 32-row"},
                   {FLASHCL_FLOAT16, 64, "OWN_REGS=2", "OWN_REGS is 0 or 1"},
                   {FLASHCL_FLOAT16, 64, "DQ_MAXNREG=8", "16..255"},
                   {FLASHCL_FLOAT16, 64, "VARIANT=nv-mma,DQ_MAXNREG=168", "DQ_MAXNREG caps"},
                   {FLASHCL_FLOAT16, 64, "DQ=atomic,DQ_MAXNREG=168", "which DQ=atomic does not run"},
                   {FLASHCL_FLOAT16, 64, "VARIANT=nv-mma,OWN_REGS=1", "OWN_REGS holds the nv-wgmma"},
                   {FLASHCL_FLOAT16, 64, "STAGES=1", "2..8"},
                   {FLASHCL_FLOAT16, 64, "STAGES=9", "2..8"},
                   {FLASHCL_FLOAT16, 64, "STAGES=3,DQ=atomic", "DQ=atomic does not take"},
                   {FLASHCL_FLOAT16, 128, "VARIANT=nv-wgmma,OWN_REGS=0,STAGES=2", "over NVIDIA's 48000"},
                   {FLASHCL_FLOAT16, 64, "VARIANT=nv-mma,STAGES=2", "another variant"},
                   {FLASHCL_FLOAT32, 64, "VARIANT=nv-wgmma", "float16 or bfloat16"},
                   {FLASHCL_FLOAT16, 96, "VARIANT=nv-wgmma,WG=128,BLOCK_M=64,BLOCK_N=64", "over NVIDIA's 48000"},
                   {FLASHCL_FLOAT16, 160, "VARIANT=nv-wgmma,BLOCK_M=16,BLOCK_N=16", "head_dim 32..128"},
                   {FLASHCL_FLOAT16, 128, "VARIANT=nv-wgmma,OWN_REGS=0,BLOCK_M=32,BLOCK_N=16", "over NVIDIA's 48000"},
                   {FLASHCL_FLOAT16, 128, "BLOCK_M=64", "48000"},
                   {FLASHCL_FLOAT32, 64, "VARIANT=nv-mma", "float16 or bfloat16"},
                   {FLASHCL_FLOAT16, 256, "VARIANT=nv-mma,BLOCK_M=16,BLOCK_N=16,WG=32", "head_dim <= 128"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; ++i) {
        char what[160];
        snprintf(what, sizeof what, "nv backward: FLASHCL_BWD_PARAMS=\"%s\" at D=%d is refused (%s)",
                 refused[i].env, refused[i].d, refused[i].why);
        expect(backward_choice_of(ctx, refused[i].dt, refused[i].d, refused[i].env, 0, &c) ==
                       FLASHCL_ERROR_INVALID_PARAMS &&
                   strstr(flashcl_last_error(ctx), refused[i].why),
               what, &failures);
    }
    ctx->info.nv_cc_minor = 9; /* Ada (8.9): nv-mma, no nv-wgmma */
    ctx->info.nv_cc_major = 8;
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, "VARIANT=nv-wgmma", 0, &c) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "compute capability 9.0"),
           "FLASHCL_BWD_PARAMS=VARIANT=nv-wgmma on sm_89 is refused", &failures);
    ctx->info.nv_cc_major = 7; /* Volta: no nv-mma */
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_PORTABLE,
           "backward, sm_70 f16: the portable kernels", &failures);
    flashcl_context_destroy(ctx);

    /* A tuned nv-mma backward entry: used where the kernels apply, passed over for float32. */
    char path[300];
    snprintf(path, sizeof path, "%s/bwd-nv.json", dir);
    setenv("FLASHCL_TUNING_FILE", path, 1);
    ctx = pretend_h200_tuned(path, "{\"flashcl_tuning\": 1, \"entries\": [], \"backward\": [{\"device\": "
                                   "\"Pretend NVIDIA sm_90 GPU\", \"variant\": \"nv-mma\", \"head_dim_max\": 64, "
                                   "\"block_m\": 16, \"block_n\": 32, \"work_group_size\": 64, "
                                   "\"max_registers\": 192}]}");
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_MMA && c.block_m == 16 && c.block_n == 32 && c.work_group_size == 64 &&
               c.nv_max_registers == 192 && !strncmp(c.source, "tuned: ", 7),
           "backward: a tuned nv-mma entry is used, with its register cap", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT32, 64, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_PORTABLE && strncmp(c.source, "tuned: ", 7) != 0 && c.nv_max_registers == 0,
           "backward: ... and passed over for float32 (no cap on the portable kernels)", &failures);
    flashcl_context_destroy(ctx);

    /* A tuned nv-wgmma entry: used on compute capability 9.0, passed over once its build failed. */
    ctx = pretend_h200_tuned(path, "{\"flashcl_tuning\": 1, \"entries\": [], \"backward\": [{\"device\": "
                                   "\"Pretend NVIDIA sm_90 GPU\", \"variant\": \"nv-wgmma\", \"head_dim_max\": 64, "
                                   "\"block_m\": 64, \"block_n\": 32, \"work_group_size\": 128}]}");
    expect(backward_choice_of(ctx, FLASHCL_BFLOAT16, 48, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_WGMMA && c.block_m == 64 && c.block_n == 32 && c.nv_max_registers == 0 &&
               !strncmp(c.source, "tuned: ", 7),
           "backward: a tuned nv-wgmma entry is used", &failures);
    ctx->no_sm90a_bwd = 1;
    expect(backward_choice_of(ctx, FLASHCL_BFLOAT16, 48, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_MMA && !strncmp(c.source, "built-in arch: sm_80+", 21),
           "backward: ... and passed over after an nv-wgmma build failure (nv-mma's built-in entry)", &failures);
    flashcl_context_destroy(ctx);

    /* Tuned entries holding the fragments: 64-row tiles at D <= 64 (two stages), kept as they are;
     * 16-row tiles at D 96..128, which fit 48 KB in up to five stages. */
    ctx = pretend_h200_tuned(path, "{\"flashcl_tuning\": 1, \"entries\": [], \"backward\": [{\"device\": "
                                   "\"Pretend NVIDIA sm_90 GPU\", \"variant\": \"nv-wgmma\", \"head_dim_max\": 64, "
                                   "\"block_m\": 64, \"block_n\": 64, \"work_group_size\": 128, \"own_regs\": 1}, "
                                   "{\"device\": \"Pretend NVIDIA sm_90 GPU\", \"variant\": \"nv-wgmma\", "
                                   "\"head_dim_min\": 96, \"block_m\": 16, \"block_n\": 16, \"work_group_size\": 128, "
                                   "\"own_regs\": 1}]}");
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 64, NULL, 0, &c) == FLASHCL_SUCCESS && c.nv_own_regs == 1 &&
               c.block_m == 64 && !strncmp(c.source, "tuned: ", 7),
           "backward: a tuned entry's held 64-row tiles at D=64 are kept", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, NULL, 0, &c) == FLASHCL_SUCCESS &&
               c.variant == FLASHCL_BWD_NV_WGMMA && c.block_m == 16 && c.nv_own_regs == 1 &&
               !strncmp(c.source, "tuned: ", 7),
           "backward: a tuned entry's own_regs is used", &failures);
    expect(backward_choice_of(ctx, FLASHCL_FLOAT16, 128, "DQ=atomic", 0, &c) == FLASHCL_SUCCESS &&
               c.block_m == 16 && c.nv_own_regs == 0 && flashcl_backward_dq_atomic(&c),
           "backward: ... and let go under DQ=atomic", &failures);
    flashcl_context_destroy(ctx);
    unsetenv("FLASHCL_TUNING_FILE");
    unlink(path);
}

/* ---- the tuning file's serving and backward entries ----------------------------------------- */

/* flashcl_decode_params on ctx for one sequence of `rows` rows, head_dim d, 4096 keys, over
 * choice_heads_k KV heads (1 unless a check sets it). */
static int choice_heads_k = 1;
static int choice_max_keys = 4096;
static flashcl_dtype choice_kv_fp8; /* FP8 pages' format, 0 for pages in dtype */
static flashcl_status serving_choice(flashcl_context *ctx, flashcl_dtype dtype, int d, int rows,
                                     flashcl_decode_choice *c) { /* a GQA group of 4 */
    static int rows_per_seq[1];
    flashcl_decode_problem pb;
    memset(&pb, 0, sizeof pb);
    rows_per_seq[0] = rows;
    pb.dtype = dtype;
    pb.head_dim = d;
    pb.heads_k = choice_heads_k;
    pb.num_seqs = 1;
    pb.rows_per_seq = rows_per_seq;
    pb.max_keys = choice_max_keys;
    pb.vec_aligned = 1;
    pb.group = 4;
    pb.kv_fp8 = choice_kv_fp8;
    return flashcl_decode_params(ctx, &pb, c);
}

/* The built-in decode choice on the pretend H200 (132 compute units): the
 * tensor-core kernel, its splits filling one wave of 4 two-warp groups per
 * compute unit, 5 one-warp groups above D=128. */
static void test_decode_levels(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/none.json", dir);
    unlink(path);
    setenv("FLASHCL_TUNING_FILE", path, 1);
    flashcl_context *ctx = test_context();
    pretend_h200(ctx);
    ctx->info.compute_units = 132;
    flashcl_decode_choice c;
    /* One sequence, GQA group 4 (one block), 4096 keys: over 33 KV heads (odd: one head a group,
     * decode_head_warps) 528 / 33 slices, at most 8 of 512 keys (264 work-groups, every compute
     * unit busy); over one KV head 8 such slices would leave 124 of the 132 idle, so the slices
     * halve: 16 of 256 keys. */
    choice_heads_k = 33;
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS &&
               c.kernel == FLASHCL_SERVING_DECODE_MMA && c.work_group_size == 64 && c.wgs_per_cu == 4 &&
               c.splits == 8,
           "decode on sm_90, D=128: tensor cores, 2 warps, 4 groups per CU, splits capped by 512-key slices",
           &failures);
    expect(!c.reg_copy, "... copies by cp.async on those 512-key slices", &failures);
    /* FP8 pages: the same kernel with float16 queries, in 32-key tiles always staged through
     * registers (where they are widened), within 48 KB; it was passed over for the tiled kernel
     * while the fit counted two 32-key cp.async buffers a warp (bench/h200.sh fp8, 2026-12-04). */
    choice_kv_fp8 = FLASHCL_FLOAT8_E4M3;
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS &&
               c.kernel == FLASHCL_SERVING_DECODE_MMA && c.block_n == 32 && c.reg_copy &&
               flashcl_decode_local_bytes(&c, 128) <= 48000,
           "decode over e4m3 pages on sm_90, f16 queries: tensor cores, 32-key tiles through registers", &failures);
    expect(serving_choice(ctx, FLASHCL_BFLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.kernel == FLASHCL_SERVING_DECODE,
           "... bf16 queries (no e4m3 -> bf16 widening): the SIMT decode kernel", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 256, 4, &c) == FLASHCL_SUCCESS && c.kernel == FLASHCL_SERVING_DECODE,
           "... D=256 (no registers to widen a tile in): the SIMT decode kernel", &failures);
    choice_heads_k = 8; /* 8 one-head groups: a work-group of 8 warps on each head (HEAD_GROUP) */
    choice_max_keys = 16384;
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS &&
               c.kernel == FLASHCL_SERVING_DECODE_MMA && c.head_group == 1 && c.block_n == 32,
           "... few heads: a warp group a head, its 32-key tiles (HG_WIDE)", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 96, 4, &c) == FLASHCL_SUCCESS &&
               c.kernel == FLASHCL_SERVING_DECODE_MMA && c.head_group == 1 && c.block_n == 16,
           "... at D=96 (not a multiple of 64) 16-key ones", &failures);
    choice_max_keys = 131072;
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.head_group == 1 &&
               c.block_n == 32,
           "... from 65536 keys too", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 96, 4, &c) == FLASHCL_SUCCESS && !c.head_group && c.block_n == 32,
           "... but the one-head kernel's 32-key tiles at D=96 there", &failures);
    /* FP8 pages, D=128, batch 4/16/64 of 8 kv heads (one-head grids of 32/128/512, one block a
     * sequence as here): 8 warps on one head from 16384 keys, and at batch 16 at any length;
     * float16 pages keep pairs of heads at batch 16 and the one-head kernel at batch 64. */
    const int grids[3] = {32, 128, 512}, keys[2] = {4096, 16384};
    for (int gi = 0; gi < 3; ++gi)
        for (int ki = 0; ki < 2; ++ki) {
            choice_heads_k = grids[gi], choice_max_keys = keys[ki];
            const int one_head = keys[ki] >= 16384 || grids[gi] == 128;
            char what[160];
            snprintf(what, sizeof what, "... FP8 pages, one-head grid %d, %d keys: %s", grids[gi], keys[ki],
                     one_head ? "8 warps on one kv head" : "the float16 pages' choice");
            flashcl_decode_choice f16;
            choice_kv_fp8 = 0;
            const int ok16 = serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &f16) == FLASHCL_SUCCESS;
            choice_kv_fp8 = FLASHCL_FLOAT8_E4M3;
            expect(ok16 && serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS &&
                       (one_head ? c.head_group == 1 && c.head_warps == 8
                                 : c.head_group == f16.head_group && c.head_warps == f16.head_warps) &&
                       (grids[gi] <= 128 ? f16.head_group == 2 : !f16.head_group),
                   what, &failures);
        }
    /* ... not at D=96 (16-key tiles there, not measured): pairs at batch 16 and 4096 keys */
    choice_heads_k = 128, choice_max_keys = 4096;
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 96, 4, &c) == FLASHCL_SUCCESS && c.head_group == 2 &&
               c.head_warps == 4,
           "... FP8 pages at D=96, one-head grid 128, 4096 keys: two heads of 4 warps, as float16", &failures);
    choice_kv_fp8 = 0, choice_heads_k = 33, choice_max_keys = 4096;
    /* The same GPU with 16 KiB of __local (FLASHCL_MAX_LOCAL_MEM=16384): the mma kernel's fixed
     * tiles need more, so the tiled kernel, shrunk to fit (it was the mma kernel, which then
     * failed every call: test_serving_16k on the H200). */
    const size_t local_was = ctx->info.local_mem;
    ctx->info.local_mem = 16384;
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.kernel == FLASHCL_SERVING_TILED &&
               flashcl_decode_local_bytes(&c, 128) <= 16384 - 1024,
           "decode on sm_90 with 16 KiB of __local: the tiled kernel, fitted", &failures);
    ctx->info.local_mem = local_was;
    choice_heads_k = 528; /* one slice of all 4096 keys */
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.splits == 1 && c.reg_copy &&
               flashcl_decode_local_bytes(&c, 128) <= 48000,
           "... copies staged through registers on 4096-key slices", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 80, 4, &c) == FLASHCL_SUCCESS &&
               c.kernel == FLASHCL_SERVING_DECODE_MMA && c.reg_copy,
           "... at D=80 too", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 256, 4, &c) == FLASHCL_SUCCESS &&
               c.kernel == FLASHCL_SERVING_DECODE_MMA && !c.reg_copy,
           "... but not at D=256, whose one warp has no registers to stage a tile in", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 32, 4, &c) == FLASHCL_SUCCESS &&
               c.kernel == FLASHCL_SERVING_DECODE_MMA && !c.reg_copy,
           "... nor at D=32, whose 1 KB tiles keep too little in flight", &failures);
    expect(c.l2_prefetch == 128, "... with an L2 prefetch of 128 bytes on each cp.async", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "L2_PREFETCH=0", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 80, 4, &c) == FLASHCL_SUCCESS && c.l2_prefetch == 0,
           "... FLASHCL_DECODE_PARAMS L2_PREFETCH=0 takes it off", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "L2_PREFETCH=100", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 80, 4, &c) == FLASHCL_ERROR_INVALID_PARAMS,
           "... and refuses a size the hint does not have (100)", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "REG_COPY_MIN_KEYS=8192", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && !c.reg_copy,
           "... FLASHCL_DECODE_PARAMS REG_COPY_MIN_KEYS moves the threshold", &failures);
    /* Four-warp groups fit NVIDIA's 48 KB only with REG_COPY's one tile buffer a warp (35 KB at
     * D=128; two cp.async buffers a warp take 70 KB): so the fit is checked with the slices'
     * length known. */
    setenv("FLASHCL_DECODE_PARAMS", "WG=128", 1);
    choice_heads_k = 528; /* one slice of all 4096 keys: REG_COPY */
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.work_group_size == 128 &&
               c.reg_copy && flashcl_decode_local_bytes(&c, 128) <= 48000,
           "... FLASHCL_DECODE_PARAMS WG=128 fits where the slices take REG_COPY", &failures);
    choice_heads_k = 1; /* 256-key slices: the cp.async loop */
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_ERROR_INVALID_PARAMS,
           "... and is refused where they take the cp.async loop", &failures);
    /* HEAD_GROUP: 8 kv heads a work-group, a warp each, where it applies. One sequence over 8 kv
     * heads is one group: 132 slices would fill the CUs, but 512-key slices give 8, and 8 groups
     * leave CUs idle, so 256-key ones: 16. */
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_GROUP=8", 1);
    choice_heads_k = 8;
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.head_group == 8 &&
               c.work_group_size == 256 && !c.reg_copy && c.splits == 16 &&
               flashcl_decode_local_bytes(&c, 128) <= 48000,
           "... FLASHCL_DECODE_PARAMS HEAD_GROUP=8: a warp a kv head, 8 a group, 16 slices", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 64, 4, &c) == FLASHCL_SUCCESS && c.head_group == 8,
           "... at D=64 too", &failures);
    /* HEAD_WARPS: 8 warps on each kv head, one head a group: as many warps a CU as the default's
     * 4 two-warp groups, so 8 groups fill 132 CUs by 16 slices (256 keys each, as above). */
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_GROUP=1,HEAD_WARPS=8", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.head_group == 1 &&
               c.head_warps == 8 && c.work_group_size == 256 && c.splits == 16 &&
               flashcl_decode_local_bytes(&c, 128) <= 48000,
           "... HEAD_GROUP=1,HEAD_WARPS=8: 8 warps a kv head, a work-group of 256", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_GROUP=8,HEAD_WARPS=8", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && !c.head_group &&
               c.work_group_size == 64,
           "... and not where the work-group would exceed the device's (64 warps)", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_GROUP=8", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 16, &c) == FLASHCL_SUCCESS && !c.head_group &&
               c.work_group_size == 64,
           "... not for 4 query tokens a sequence (one kv head a group, as before)", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 80, 4, &c) == FLASHCL_SUCCESS && !c.head_group,
           "... nor at D=80 (not a multiple of 32)", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 256, 4, &c) == FLASHCL_SUCCESS && !c.head_group &&
               c.work_group_size == 32,
           "... nor at D=256", &failures);
    choice_heads_k = 12;
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && !c.head_group,
           "... nor over 12 kv heads, not whole groups of 8", &failures);
    /* HG_KEYS=32 over FP8 pages (HG_WIDE, the default there): 32-key tiles of 16-byte loads,
     * their V still moved through a 16-key tile a warp, so eight warps fit 48 KB as with 16-key
     * tiles. */
    choice_heads_k = 8;
    choice_kv_fp8 = FLASHCL_FLOAT8_E4M3;
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_GROUP=1,HEAD_WARPS=8,HG_KEYS=32", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.head_group == 1 &&
               c.head_warps == 8 && c.block_n == 32 && flashcl_decode_local_bytes(&c, 128) <= 48000 &&
               flashcl_decode_local_bytes(&c, 128) == 8 * 16 * 136 * 2 + (8 * 16 + 1) * 4,
           "... HG_KEYS=32 over e4m3 pages: 32-key tiles, V through 16-key tiles (34.9 KB)", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 64, 4, &c) == FLASHCL_SUCCESS && c.head_group == 1 &&
               c.block_n == 32,
           "... at D=64 too", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_GROUP=1,HEAD_WARPS=8,BLOCK_N=16", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.head_group == 1 &&
               c.head_warps == 8 && c.block_n == 16,
           "... BLOCK_N=16 keeps HEAD_GROUP, in 16-key tiles", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_GROUP=1,HEAD_WARPS=8", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 64, 4, &c) == FLASHCL_SUCCESS && c.head_group == 1 &&
               c.block_n == 32,
           "... by default 32-key tiles at D=64 as at D=128 (both timed)", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 96, 4, &c) == FLASHCL_SUCCESS && c.head_group == 1 &&
               c.block_n == 16,
           "... but 16-key tiles at D=96 (not a multiple of 64)", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_GROUP=1,HEAD_WARPS=8,HG_KEYS=16", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.head_group == 1 &&
               c.block_n == 16,
           "... and 16-key tiles over e4m3 pages with HG_KEYS=16", &failures);
    choice_kv_fp8 = 0;
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_GROUP=1,HEAD_WARPS=8,HG_KEYS=32", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.head_group == 1 &&
               c.block_n == 16,
           "... and over float16 pages, whose 16-key tiles hold as many bytes already", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_GROUP=1,HG_KEYS=24", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_ERROR_INVALID_PARAMS,
           "... HG_KEYS other than 16 or 32 is refused", &failures);
    unsetenv("FLASHCL_DECODE_PARAMS");
    choice_heads_k = 1;
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.splits == 16,
           "... and by 256-key slices where 512-key ones would leave compute units idle", &failures);
    /* The warps for decoding follow the one-head grid G (here one sequence: G = kv heads) on the
     * pretend H200's 132 CUs (decode_head_warps). D=128: G <= 132 / 8 takes 8 warps a kv head
     * from 8192 keys; else G <= 132 over an even number of kv heads, 4 warps on each of 2. */
    expect(!c.head_group && c.work_group_size == 64, "... one head a group of 2 warps over 4096 keys", &failures);
    choice_heads_k = 2;
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && c.head_group == 2 &&
               c.head_warps == 4 && c.work_group_size == 256 && c.splits == 16,
           "... over 2 kv heads: 4 warps on each, 16 slices for the one group", &failures);
    choice_heads_k = 1;
    choice_max_keys = 16384;
    /* The rule over 16384 keys, case by case: kv heads and head dim, then the choice expected
     * (head_group 0: the one-head kernel; -1: not checked). */
    static const struct {
        int heads_k, head_dim, head_group, head_warps, wg, wgs_per_cu, splits;
        const char *what;
    } warps[] = {
        {1, 128, 1, 8, 256, -1, -1, "... 8 warps a kv head over 16384, where the grid has at most CUs / 8 groups"},
        {16, 128, 1, 8, -1, -1, -1, "... 16 kv heads: still"},
        {17, 128, 0, -1, 64, -1, -1, "... 17: one head a group of 2 warps (no pairs of heads)"},
        {18, 128, 2, 4, -1, -1, 14, "... 18: 4 warps on each of 2 heads, 9 groups in 14 slices (one group a CU)"},
        {132, 128, 2, 4, -1, -1, 2, "... 132 (as many as CUs): still, 66 groups in 2 slices"},
        {134, 128, 0, -1, 64, -1, -1, "... 134: one head a group of 2 warps"},
        /* D=64: 12 warps a CU; 4 warps on one kv head, or on each of 2 where 33 <= G <= 264. */
        {1, 64, 1, 4, 128, 6, -1, "... D=64: 4 warps a kv head, 6 two-warp groups' worth a CU"},
        {34, 64, 2, 2, 128, -1, 23, "... 34 kv heads: 2 warps on each of 2, 17 groups in 23 slices (3 groups a CU)"},
        {32, 64, 1, 4, -1, -1, -1, "... 32 (at most CUs / 4): one head a group"},
        {266, 64, 1, 4, -1, -1, 1, "... 266 (over 2 x CUs): one head a group"},
        {266, 32, 2, 2, -1, 10, -1, "... D=32: 2 warps on each of 2 kv heads, 10 two-warp groups' worth a CU"},
        {3, 32, 1, 4, -1, -1, -1, "... over 3 kv heads, 4 warps on one"},
        {18, 96, 2, 4, -1, 4, -1, "... D=96 as D=128: 4 warps on each of 2 kv heads"},
        {18, 80, 0, -1, 64, 4, -1, "... not at D=80 (not a multiple of 32)"},
    };
    for (size_t i = 0; i < sizeof warps / sizeof warps[0]; ++i) {
        choice_heads_k = warps[i].heads_k;
        const int ok = serving_choice(ctx, FLASHCL_FLOAT16, warps[i].head_dim, 4, &c) == FLASHCL_SUCCESS;
        expect(ok && c.head_group == warps[i].head_group &&
                   (warps[i].head_warps < 0 || c.head_warps == warps[i].head_warps) &&
                   (warps[i].wg < 0 || c.work_group_size == warps[i].wg) &&
                   (warps[i].wgs_per_cu < 0 || c.wgs_per_cu == warps[i].wgs_per_cu) &&
                   (warps[i].splits < 0 || c.splits == warps[i].splits),
               warps[i].what, &failures);
    }
    choice_heads_k = 1;
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_GROUP=0", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && !c.head_group &&
               c.work_group_size == 64,
           "... FLASHCL_DECODE_PARAMS HEAD_GROUP=0 keeps one head a group of 2 warps", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "HEAD_WARPS=4", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && !c.head_group,
           "... as does HEAD_WARPS without HEAD_GROUP", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "WG=32", 1);
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 128, 4, &c) == FLASHCL_SUCCESS && !c.head_group &&
               c.work_group_size == 32,
           "... and an explicit WG", &failures);
    unsetenv("FLASHCL_DECODE_PARAMS");
    choice_max_keys = 4096;
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 256, 4, &c) == FLASHCL_SUCCESS &&
               c.kernel == FLASHCL_SERVING_DECODE_MMA && c.work_group_size == 32 && c.wgs_per_cu == 5,
           "decode on sm_90, D=256: one warp, 5 groups per CU", &failures);
    setenv("FLASHCL_DECODE_PARAMS", "WGS_PER_CU=3", 1); /* not what any rule derives */
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 256, 4, &c) == FLASHCL_SUCCESS && c.wgs_per_cu == 3,
           "... FLASHCL_DECODE_PARAMS sets the count as given", &failures);
    unsetenv("FLASHCL_DECODE_PARAMS");
    flashcl_context_destroy(ctx);
}

static void test_serving_backward_file(void) {
    char path[300], text[4096], want[400], bad_path[320], def_serving[600], def_backward[600];
    const char *name = device_name(), *pr;
    flashcl_decode_choice dc;
    flashcl_backward_choice bc;
    snprintf(path, sizeof path, "%s/serving.json", dir);

    /* The built-in choices, for comparison. */
    unlink(path);
    setenv("FLASHCL_TUNING_FILE", path, 1);
    flashcl_context *ctx = test_context();
    serving_choice(ctx, FLASHCL_FLOAT16, 64, 1, &dc);
    backward_choice(ctx, 64, NULL, &bc);
    snprintf(def_serving, sizeof def_serving, "%s", dc.source); /* the context owns the strings */
    snprintf(def_backward, sizeof def_backward, "%s", bc.source);
    flashcl_context_destroy(ctx);

    /* Entries for this device (the first for another driver) are used and named. */
    snprintf(text, sizeof text,
             "{\"flashcl_tuning\": 1, \"entries\": [],\n"
             " \"serving\": [\n"
             "  {\"device\": \"%s\", \"driver\": \"not-this-driver\", \"kernel\": \"tiled\", \"wgs_per_cu\": 5,"
             " \"min_split_keys\": 99},\n"
             "  {\"device\": \"%s\", \"kernel\": \"tiled\", \"wgs_per_cu\": 3, \"min_split_keys\": 77,"
             " \"comment\": \"hand-written\"}],\n"
             " \"backward\": [\n"
             "  {\"device\": \"%s\", \"head_dim_max\": 128, \"block_m\": 4, \"block_n\": 8,"
             " \"work_group_size\": 16}]}\n",
             name, name, name);
    write_file(path, text);
    ctx = test_context();
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 64, 1, &dc) == FLASHCL_SUCCESS && dc.wgs_per_cu == 3 &&
               dc.min_split_keys == 77 && dc.kernel == FLASHCL_SERVING_TILED,
           "serving: the tuning file's entry for this device is used (not the other driver's)", &failures);
    snprintf(want, sizeof want, "tuned: %s (hand-written)", path);
    expect(!strcmp(dc.source, want), "serving: source names the file and the entry's comment", &failures);
    if (strcmp(dc.source, want) || getenv("VERBOSE"))
        printf("    source: %s\n", dc.source);
    snprintf(want, sizeof want, "tuned: %s", path);
    expect(backward_choice(ctx, 64, NULL, &bc) == FLASHCL_SUCCESS && bc.block_m == 4 && bc.block_n == 8 &&
               bc.work_group_size == 16 && !strcmp(bc.source, want),
           "backward: the tuning file's entry is used and named", &failures);
    expect(backward_choice(ctx, 200, NULL, &bc) == FLASHCL_SUCCESS && strncmp(bc.source, "tuned: ", 7) != 0,
           "backward: the entry's head_dim range is kept (D=200 gets the built-in)", &failures);
    expect(backward_choice(ctx, 64, "BLOCK_N=4", &bc) == FLASHCL_SUCCESS && bc.block_m == 4 && bc.block_n == 4 &&
               !strcmp(bc.source, "FLASHCL_BWD_PARAMS"),
           "backward: FLASHCL_BWD_PARAMS still applies on top of the tuned entry", &failures);
    flashcl_params fp;
    flashcl_attention_desc d = desc_of(FLASHCL_FLOAT16, 100, 64, 0);
    flashcl_attention_params(ctx, &d, &fp);
    expect(strncmp(fp.source, "tuned: ", 7) != 0, "forward lookups do not read serving/backward entries",
           &failures);
    flashcl_context_destroy(ctx);

    /* Malformed serving or backward entries: the whole file is ignored, with a reason. */
    static const char *const broken[] = {
        "\"serving\": [{\"device\": \"%s\", \"kernel\": \"turbo\", \"wgs_per_cu\": 3, \"min_split_keys\": 77}]",
        "\"serving\": [{\"device\": \"%s\", \"kernel\": \"tiled\", \"wgs_per_cu\": \"3\", \"min_split_keys\": 77}]",
        "\"serving\": [{\"device\": \"%s\", \"kernel\": \"tiled\", \"wgs_per_cu\": 3, \"min_split_keys\": 0}]",
        "\"backward\": [{\"device\": \"%s\", \"block_m\": 4, \"block_n\": 8, \"work_group_size\": 4096}]",
        "\"backward\": [{\"device\": \"%s\", \"block_m\": 4, \"block_n\": 8, \"work_group_size\": 16,"
        " \"variant\": \"gpu\"}]",
    };
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; ++i) {
        char body[600], what[120];
        snprintf(body, sizeof body, broken[i], name);
        snprintf(text, sizeof text,
                 "{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"%s\", \"variant\": \"cpu\", \"dtype\": \"any\","
                 " \"block_m\": 4, \"block_n\": 8}],\n %s}\n",
                 name, body);
        snprintf(bad_path, sizeof bad_path, "%s/bad-serving%zu.json", dir, i);
        write_file(bad_path, text);
        setenv("FLASHCL_TUNING_FILE", bad_path, 1);
        ctx = test_context();
        flashcl_tuning_file(ctx, &pr);
        serving_choice(ctx, FLASHCL_FLOAT16, 64, 1, &dc);
        backward_choice(ctx, 64, NULL, &bc);
        flashcl_attention_params(ctx, &d, &fp);
        snprintf(what, sizeof what, "malformed %s entry %zu: the whole file ignored with a reason",
                 i < 3 ? "serving" : "backward", i);
        expect(pr && strstr(pr, "line") && strstr(pr, i < 3 ? "serving entry 0" : "backward entry 0") &&
                   strstr(pr, "ignored") && !strcmp(dc.source, def_serving) && !strcmp(bc.source, def_backward) &&
                   strncmp(fp.source, "tuned: ", 7) != 0,
               what, &failures);
        if (!pr || getenv("VERBOSE"))
            printf("    problem: %s\n", pr ? pr : "(none)");
        flashcl_context_destroy(ctx);
    }

    /* Entries that do not fit the device: passed over, the built-in used. */
    setenv("FLASHCL_TUNING_FILE", path, 1);
    snprintf(text, sizeof text,
             "{\"flashcl_tuning\": 1, \"entries\": [],\n"
             " \"serving\": [{\"device\": \"Pretend NVIDIA sm_90 GPU\", \"kernel\": \"decode\","
             " \"work_group_size\": 1024, \"unroll\": 2, \"stages\": 2, \"wgs_per_cu\": 3, \"min_split_keys\": 77}],\n"
             " \"backward\": [{\"device\": \"Pretend NVIDIA sm_90 GPU\", \"block_m\": 1024, \"block_n\": 1024,"
             " \"work_group_size\": 128}]}\n");
    ctx = pretend_h200_tuned(path, text);
    ctx->info.max_wg = 256; /* the decode entry's 1024 work-items do not fit */
    expect(serving_choice(ctx, FLASHCL_FLOAT32, 128, 1, &dc) == FLASHCL_SUCCESS &&
               !strncmp(dc.source, "built-in arch: sm_80+", 21) && dc.work_group_size <= 256,
           "serving: a tuned entry that does not fit is passed over for the built-in", &failures);
    expect(backward_choice(ctx, 64, NULL, &bc) == FLASHCL_SUCCESS && !strncmp(bc.source, "default: GPU", 12) &&
               bc.block_m == 16,
           "backward: tuned tiles that do not fit are passed over for the default", &failures);
    flashcl_context_destroy(ctx);
    /* ... and one that fits on the same pretend GPU picks the decode kernel with its values. */
    snprintf(text, sizeof text,
             "{\"flashcl_tuning\": 1, \"entries\": [],\n"
             " \"serving\": [{\"device\": \"Pretend NVIDIA sm_90 GPU\", \"kernel\": \"decode\","
             " \"work_group_size\": 256, \"unroll\": 1, \"stages\": 3, \"wgs_per_cu\": 3, \"min_split_keys\": 77}]}\n");
    ctx = pretend_h200_tuned(path, text);
    ctx->info.max_wg = 256;
    snprintf(want, sizeof want, "tuned: %s", path);
    expect(serving_choice(ctx, FLASHCL_FLOAT32, 128, 1, &dc) == FLASHCL_SUCCESS && !strcmp(dc.source, want) &&
               dc.kernel == FLASHCL_SERVING_DECODE && dc.work_group_size == 256 && dc.unroll == 1 &&
               dc.stages == 3 && dc.wgs_per_cu == 3,
           "serving: a fitting tuned decode entry beats the arch entry on the pretend GPU", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT32, 128, 16, &dc) == FLASHCL_SUCCESS &&
               dc.kernel == FLASHCL_SERVING_DECODE && dc.block_m == 8 && !strcmp(dc.source, want),
           "serving: 16 rows, twice the entry's max_rows (8), take two 8-row decode blocks", &failures);
    expect(serving_choice(ctx, FLASHCL_FLOAT32, 128, 33, &dc) == FLASHCL_SUCCESS &&
               dc.kernel == FLASHCL_SERVING_TILED && !strcmp(dc.source, want),
           "serving: more than four blocks' rows (33 > 4 x 8) take the tiled kernel", &failures);
    flashcl_context_destroy(ctx);

    /* The writer keeps the serving and backward arrays when it stores a forward entry. */
    snprintf(text, sizeof text,
             "{\"flashcl_tuning\": 1, \"entries\": [],\n"
             " \"serving\": [{\"device\": \"%s\", \"kernel\": \"tiled\", \"wgs_per_cu\": 3, \"min_split_keys\": 77}],\n"
             " \"backward\": [{\"device\": \"%s\", \"block_m\": 4, \"block_n\": 8, \"work_group_size\": 16}],\n"
             " \"mine\": {\"keep\": true}}\n",
             name, name);
    write_file(path, text);
    ctx = test_context();
    flashcl_attention_params(ctx, &d, &fp);
    expect(flashcl_tuning_file_save(ctx, path, &d, &fp, "saved") == FLASHCL_SUCCESS,
           "saving a forward entry into a file with serving/backward entries", &failures);
    flashcl_context_destroy(ctx);
    char *saved = read_all(path), err[200];
    size_t count = 0, other = 0;
    expect(parses2(saved, strlen(saved), &count, &other, err, sizeof err) && count == 1 && other == 2 &&
               strstr(saved, "\"mine\""),
           "... keeps them (and unknown keys) beside the new forward entry", &failures);
    ctx = test_context();
    expect(serving_choice(ctx, FLASHCL_FLOAT16, 64, 1, &dc) == FLASHCL_SUCCESS && !strcmp(dc.source, want) &&
               dc.wgs_per_cu == 3 && backward_choice(ctx, 64, NULL, &bc) == FLASHCL_SUCCESS &&
               !strcmp(bc.source, want),
           "... and a new context still uses them", &failures);
    flashcl_context_destroy(ctx);
    unlink(path);
}

int main(void) {
    if (!params_make_dir("flashcl-test-params-tables"))
        return 1;
    flashcl_context *ctx = test_context();
    int host = flashcl_context_is_host(ctx);
    flashcl_context_destroy(ctx);
    if (host) {
        printf("host context: no kernel parameters; table tests skipped\n");
    } else {
        test_backward_levels();
        test_serving_backward_file();
        test_decode_levels();
    }
    params_remove_dir();
    printf("%s\n", failures ? "FAILED" : "all passed");
    return failures ? 1 : 0;
}
