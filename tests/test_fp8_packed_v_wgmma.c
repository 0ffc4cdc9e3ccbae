/* test_fp8_packed_v_wgmma.c: test_fp8_packed_v's checks of the Hopper FP8 kernel, nv-wgmma-fp8, on
 * a packed V (4). A file of its own since test_fp8_packed_v.c, which runs them (wgmma_checks) and
 * holds the pack checks and the forward pairs they build on, passed 1,200 lines;
 * test_fp8_packed_v.h declares what the files share.
 *
 * Argument "wgmma" (FLASHCL_TEST_DEVICE=nvidia): on compute capability 9.0 the pack on the GPU
 * (test_fp8_packed_v.c's checks 1), then the forward on nv-wgmma-fp8 forced, which reads a packed V
 * as it is, bitwise against natural V (which it transposes itself): D 32, 64, 96 and 128 (32 and
 * 96: half of a 64-dim panel padding), f16 out, 300 and 1000 keys and queries, causal or not, on a
 * fresh context with TMA copies as the library chooses, then on another with FLASHCL_TMA=0
 * (cp.async; no TMA slots allocated there, checked; the variable restored after). On each fresh
 * context first: a packed forward (finished) leaves ctx->fp8_vt, the per-call transpose's scratch,
 * unallocated, and a natural one then allocates it. Then back to back as in 2 (back_to_back), f16
 * out on nv-wgmma-fp8 forced, in order and out of order. Elsewhere, that forcing that kernel on a
 * packed V is refused, out untouched. The default run does the same on compute capability 9.0
 * and none of this elsewhere.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcl.h"
#include "flashcl_ref.h"
#include "harness.h"
#include "internal.h" /* the compute capability, the V scratch and TMA slots of a context */
#include "test_fp8_packed_v.h"

/* ---- 4. the Hopper FP8 kernel ---------------------------------------------------------------- */

int is_hopper(const flashcl_context *ctx) {
    return !flashcl_context_is_host(ctx) && ctx->info.is_nvidia && ctx->info.nv_cc_major == 9 &&
           ctx->info.nv_cc_minor == 0;
}

/* A copy of environment variable `name` (NULL: unset), for restore_env. */
static char *save_env(const char *name) {
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

static void restore_env(const char *name, char *saved) {
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}

/* On a context that has run no FP8 forward with natural V: a packed forward on nv-wgmma-fp8
 * (finished) leaves ctx->fp8_vt, the scratch of the per-call transpose, unallocated: the kernel
 * read the packed V as it is. Then a natural forward allocates it (the check can fail), and the
 * two agree bit for bit. */
static void wgmma_no_transpose(flashcl_context *ctx, const char *where, uint64_t seed) {
    /* format, out, B, Hq, Hk, Nq, Nk, D, causal, v layout, factors, packed offset, junk strides */
    const fwd_case c = {
        FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT16, 1, 4, 2, 256, 300, 64, 0, V_BHSD, 0, 32, JUNK_ZERO};
    fwd_inputs in;
    char what[400];
    if (!make_inputs(&c, seed, &in)) {
        free_inputs(&in);
        return;
    }
    snprintf(what, sizeof what, "%s: a fresh context has no V scratch yet (%zu bytes)", where,
             ctx->fp8_vt_bytes);
    expect(!ctx->fp8_vt, what, &failures);
    cl_mem bq = test_upload(ctx, in.q, in.nq), bk = test_upload(ctx, in.k, in.nk),
           bv = test_upload(ctx, in.v, in.nv), bp = poisoned_buffer(ctx, in.vp_bytes, 0x7f);
    void *o1 = test_xmalloc(in.out_bytes), *o2 = test_xmalloc(in.out_bytes);
    float *l1 = test_xmalloc(in.n_lse * 4), *l2 = test_xmalloc(in.n_lse * 4);
    flashcl_ref_poison(o1, in.d.out_dtype, in.n_out);
    flashcl_ref_poison(l1, FLASHCL_FLOAT32, in.n_lse);
    cl_mem bo1 = test_upload(ctx, o1, in.out_bytes), bo2 = test_upload(ctx, o1, in.out_bytes);
    cl_mem bl1 = test_upload(ctx, l1, in.n_lse * 4), bl2 = test_upload(ctx, l1, in.n_lse * 4);
    char message[400] = "";
    const flashcl_status sp = flashcl_fp8_pack_v(ctx, &in.d, bv, bp, in.dp.v.offset, NULL);
    if (sp)
        snprintf(message, sizeof message, "pack: %s", flashcl_last_error(ctx));
    use_variant("nv-wgmma-fp8");
    const flashcl_status s2 =
        sp ? sp : flashcl_attention_forward(ctx, &in.dp, bq, bk, bp, bo2, bl2, 0, NULL);
    if (!sp && s2)
        snprintf(message, sizeof message, "packed: %s", flashcl_last_error(ctx));
    clFinish(flashcl_context_cl_queue(ctx));
    const int scratch_after_packed = ctx->fp8_vt != NULL;
    const flashcl_status s1 = flashcl_attention_forward(ctx, &in.d, bq, bk, bv, bo1, bl1, 0, NULL);
    if (s1)
        snprintf(message + strlen(message), sizeof message - strlen(message), "; natural: %s",
                 flashcl_last_error(ctx));
    clFinish(flashcl_context_cl_queue(ctx));
    use_variant(NULL);
    snprintf(what, sizeof what,
             "%s: a packed nv-wgmma-fp8 forward (%s) runs no transpose (ctx->fp8_vt %s after it)",
             where, flashcl_status_string(s2), scratch_after_packed ? "ALLOCATED" : "still NULL");
    expect(s2 == FLASHCL_SUCCESS && !scratch_after_packed, what, &failures);
    snprintf(what, sizeof what,
             "%s: a natural-V nv-wgmma-fp8 forward (%s) transposes into ctx->fp8_vt (%zu bytes)",
             where, flashcl_status_string(s1), ctx->fp8_vt_bytes);
    expect(s1 == FLASHCL_SUCCESS && ctx->fp8_vt != NULL, what, &failures);
    test_download(ctx, bo1, o1, in.out_bytes), test_download(ctx, bo2, o2, in.out_bytes);
    test_download(ctx, bl1, l1, in.n_lse * 4), test_download(ctx, bl2, l2, in.n_lse * 4);
    char name[240];
    describe(name, sizeof name, &c);
    snprintf(what, sizeof what, "%s: device nv-wgmma-fp8 forward, packed first, %s", where, name);
    expect_same(what, &in, s1, s2, o1, o2, l1, l2, message);
    clReleaseMemObject(bo1), clReleaseMemObject(bo2), clReleaseMemObject(bl1);
    clReleaseMemObject(bl2), clReleaseMemObject(bq), clReleaseMemObject(bk);
    clReleaseMemObject(bv), clReleaseMemObject(bp);
    free(o1), free(o2), free(l1), free(l2), free_inputs(&in);
}

/* nv-wgmma-fp8 forced on ctx, packed against natural V: D 32..128 by 32 (32 and 96 pad a 64-dim
 * panel with zeros), 300 and 1000 keys and queries, causal or not, f16 out; up to D=64 also in
 * the kernel's two-warpgroup shape (PINGPONG). */
static void wgmma_pairs(flashcl_context *ctx, const char *where, uint64_t seed) {
    const char *const wgmma[2] = {"nv-wgmma-fp8", "nv-wgmma-fp8,WARPS=8,BLOCK_M=128"};
    int i = 0;
    for (int D = 32; D <= 128; D += 32)
        for (int N = 300; N <= 1000; N += 700)
            for (int causal = 0; causal < 2; ++causal, ++i) {
                /* e4m3 and e5m2, per-head and 64-row block factors, packed offsets 0..48 and
                 * every kind of junk strides, in turn */
                fwd_case c;
                memset(&c, 0, sizeof c);
                c.format = i % 2 ? FLASHCL_FLOAT8_E5M2 : FLASHCL_FLOAT8_E4M3;
                c.out_dtype = FLASHCL_FLOAT16;
                c.batch = 1, c.heads_q = 4, c.heads_k = 2, c.seqlen_q = c.seqlen_k = N;
                c.head_dim = D, c.causal = causal, c.v_layout = V_PACKED;
                c.factors = i % 3 == 2 ? 64 : 0;
                c.offset = (size_t)(i % 4) * 16;
                c.junk = i % 3;
                fwd_inputs in;
                char name[300];
                snprintf(name, sizeof name, "[%s] ", where);
                describe(name + strlen(name), sizeof name - strlen(name), &c);
                if (make_inputs(&c, seed + 7919u * (uint64_t)i, &in))
                    device_pairs(ctx, wgmma, D <= 64 ? 2 : 1, &in, name);
                free_inputs(&in);
            }
}

/* nv-wgmma-fp8 forced: it reads a packed V as it is, and natural V after transposing it into
 * the context's buffer; the same bytes, so the same results bit for bit. On two fresh contexts,
 * TMA copies as the library chooses, then FLASHCL_TMA=0 (read by each forward, flashcl_tma_usable;
 * the context is fresh all the same, and the variable restored after): first that a packed
 * forward runs no transpose, then the pairs. Then back to back on ctx, f16 out, in order and on an
 * out-of-order queue (which takes no TMA). Off compute capability 9.0: forcing it on a packed V is
 * refused and writes nothing. */
void wgmma_checks(flashcl_context *ctx, uint64_t seed) {
    if (!is_hopper(ctx)) {
        flashcl_attention_desc d = test_attention_desc(FLASHCL_FLOAT8_E4M3, 1, 2, 2, 64, 64, 64);
        d.out_dtype = FLASHCL_FLOAT16;
        d.v_packed = 1;
        const size_t bytes = flashcl_fp8_packed_v_bytes(&d);
        use_variant("nv-wgmma-fp8");
        refuse_forward(
            ctx, &d, bytes, FLASHCL_ERROR_INVALID_PARAMS, 0, "nv-wgmma-fp8",
            "FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8 with a packed V off compute capability 9.0");
        use_variant(NULL);
        return;
    }
    flashcl_attention_desc probe = test_attention_desc(FLASHCL_FLOAT8_E4M3, 1, 4, 2, 300, 300, 64);
    probe.out_dtype = FLASHCL_FLOAT16;
    flashcl_params p;
    use_variant("nv-wgmma-fp8");
    const flashcl_status applies = flashcl_attention_params(ctx, &probe, &p);
    use_variant(NULL);
    expect(applies == FLASHCL_SUCCESS && !strcmp(p.variant, "nv-wgmma-fp8"),
           "device: compute capability 9.0 takes FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8", &failures);
    if (applies != FLASHCL_SUCCESS)
        return;
    for (int tma_off = 0; tma_off < 2; ++tma_off) {
        const char *where = tma_off ? "FLASHCL_TMA=0" : "TMA as chosen";
        char *saved = save_env("FLASHCL_TMA");
        if (tma_off)
            setenv("FLASHCL_TMA", "0", 1);
        flashcl_context *fresh = test_context();
        wgmma_no_transpose(fresh, where, seed + 101u * (uint64_t)tma_off);
        wgmma_pairs(fresh, where, seed + 7u * (uint64_t)tma_off);
        if (tma_off)
            expect(!fresh->tma_slots,
                   "FLASHCL_TMA=0: no forward copied by TMA (no tensor-map slots allocated)",
                   &failures);
        else
            printf("TMA as chosen: the nv-wgmma-fp8 forwards %s by TMA\n",
                   fresh->tma_slots ? "copied" : "did NOT copy (no CUDA driver encoder?)");
        flashcl_context_destroy(fresh);
        restore_env("FLASHCL_TMA", saved);
    }
    back_to_back(ctx, "nv-wgmma-fp8, f16 out, in-order queue", FLASHCL_FLOAT16, "nv-wgmma-fp8", 4,
                 seed + 13);
    cl_command_queue qq;
    flashcl_context *ooo =
        test_out_of_order_context(ctx, "nv-wgmma-fp8 back to back on an out-of-order queue", &qq);
    if (ooo) {
        back_to_back(ooo, "nv-wgmma-fp8, f16 out, out-of-order queue", FLASHCL_FLOAT16,
                     "nv-wgmma-fp8", 32, seed + 17);
        flashcl_context_destroy(ooo);
        clReleaseCommandQueue(qq);
    }
}
