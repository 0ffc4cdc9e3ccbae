/* test_ptx_replay.c: bench/ptx_replay.c's recorder on the test device.
 *
 * Why a test for a bench tool: the recorder is what makes a profile of the serving kernels
 * trustworthy (the relaunch is checked bitwise against OpenCL's own run), and its CUDA side runs
 * only on a lent GPU, in minutes of device time. Its OpenCL relaunch (PTX_REPLAY_VIA=opencl, the
 * default here: fresh buffers from the recorded state before, a new kernel of the same program,
 * the recorded scalars and grid) checks the recording on any device; on an NVIDIA GPU,
 * PTX_REPLAY_VIA=cuda checks the CUDA relaunch the same way (TEST_REPLAY_DECODE_PARAMS: the decode
 * kernel's FLASHCL_DECODE_PARAMS, default KERNEL=decode, the kernel that merges its own splits).
 * The inputs are random and the forward and decode results are checked against host_ref, so an
 * "equal" relaunch reproduced real work:
 *   - a forward launch relaunched equal;
 *   - the same forward with one input's sign bit flipped in the relaunch (PTX_REPLAY_PERTURB=1):
 *     a written buffer must differ;
 *   - a decode launch over the paged cache with four splits merged in the kernel (scratch with
 *     counters) relaunched equal;
 *   - a decode launch without LSE or scratch, one split: the output buffer stands in for both,
 *     so one buffer is passed as several arguments, and the relaunch must keep it one. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "serving_common.h"

int ptx_replay_outcome(void);
int ptx_replay_aliased(void);
void ptx_replay_rearm(void);

static int failures;

/* One forward case on ctx, the recorder armed for its kernel; returns the recorder's outcome. */
static int forward_outcome(flashcl_context *ctx, uint64_t seed, int perturb) {
    ptx_replay_rearm();
    setenv("PTX_REPLAY_KERNEL", "flash_fwd", 1);
    setenv("PTX_REPLAY_PERTURB", perturb ? "1" : "0", 1);
    test_case tc = test_case_basic(FLASHCL_FLOAT32, 64, 96, 64);
    tc.heads_q = tc.heads_k = 2;
    expect(run_case(ctx, &tc, seed, 0), perturb ? "forward under the recorder (perturbed relaunch)"
                                                : "forward under the recorder", &failures);
    return ptx_replay_outcome();
}

int main(void) {
    setenv("PTX_REPLAY_VIA", getenv("PTX_REPLAY_VIA") ? getenv("PTX_REPLAY_VIA") : "opencl", 1);
    const char *decode_params = getenv("TEST_REPLAY_DECODE_PARAMS") ? getenv("TEST_REPLAY_DECODE_PARAMS")
                                                                    : "KERNEL=decode";
    flashcl_context *ctx = test_context();
    if (flashcl_context_is_host(ctx)) {
        printf("test_ptx_replay: the host path launches no kernel: skipped\n");
        flashcl_context_destroy(ctx);
        return test_summary(0);
    }
    printf("relaunch through %s; decode under FLASHCL_DECODE_PARAMS=%s\n", getenv("PTX_REPLAY_VIA"), decode_params);
    const uint64_t seed = test_seed();

    int o = forward_outcome(ctx, seed, 0);
    printf("forward: outcome %d\n", o);
    expect(o == 0, "a forward launch relaunched equals the recorded one", &failures);
    o = forward_outcome(ctx, seed, 1);
    printf("forward, one sign flipped in the relaunch: outcome %d\n", o);
    expect(o > 0, "a perturbed relaunch is found to differ in a written buffer", &failures);
    setenv("PTX_REPLAY_PERTURB", "0", 1);

    /* Decoding over the paged cache: one sequence of 300 tokens, two kv heads of four query heads
     * each, head dim 64, 16-token pages. */
    mirror m;
    mirror_init(&m, ctx, FLASHCL_FLOAT16, 2, 64, 16, 64);
    flashcl_kv_cache_add_sequence(m.cache, &m.ids[0]);
    const int slot[1] = {0}, tokens[1] = {300}, queries[1] = {1};
    expect(mirror_append(ctx, &m, 1, slot, tokens) == FLASHCL_SUCCESS, "300 tokens appended", &failures);
    setenv("FLASHCL_DECODE_PARAMS", decode_params, 1);
    setenv("PTX_REPLAY_KERNEL", "paged_decode", 1); /* paged_decode, paged_decode_nv */
    ptx_replay_rearm();
    paged_check(ctx, &m, 1, slot, queries, 8, 1, 4, 0, "decode with 4 splits under the recorder", NULL);
    o = ptx_replay_outcome();
    printf("decode, 4 splits: outcome %d\n", o);
    expect(o == 0, "a decode launch with split merging relaunched equals the recorded one", &failures);

    /* The same without LSE or scratch, one split. */
    const int cu_q[2] = {0, 1};
    flashcl_varlen_desc d = test_varlen_desc(FLASHCL_FLOAT16, 1, 8, 2, 64, cu_q, NULL);
    d.causal = 1;
    d.num_splits = 1;
    uint16_t *host = test_xmalloc(8 * 64 * sizeof *host);
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    flashcl_ref_fill_normal(&rng, host, FLASHCL_FLOAT16, 8 * 64, 1.0);
    cl_mem bq = test_upload(ctx, host, 8 * 64 * sizeof *host), bo = test_upload(ctx, NULL, 8 * 64 * sizeof *host);
    ptx_replay_rearm();
    const flashcl_status st = flashcl_paged_attention(ctx, &d, m.cache, m.ids, bq, bo, NULL, 0, NULL, NULL);
    clFinish(flashcl_context_cl_queue(ctx));
    o = ptx_replay_outcome();
    printf("decode, no LSE or scratch: status %d, outcome %d, %d arguments aliased\n", (int)st, o,
           ptx_replay_aliased());
    expect(st == FLASHCL_SUCCESS && o == 0, "a decode launch without LSE or scratch relaunched equal", &failures);
    expect(ptx_replay_aliased() > 0, "that launch passed one buffer as several arguments", &failures);
    clReleaseMemObject(bq);
    clReleaseMemObject(bo);
    free(host);
    unsetenv("FLASHCL_DECODE_PARAMS");
    mirror_free(&m);

    ptx_replay_rearm(); /* the perturbed run's failure is this test's, not the process's exit */
    unsetenv("PTX_REPLAY_KERNEL");
    flashcl_context_destroy(ctx);
    return test_summary(failures + serving_failures);
}
