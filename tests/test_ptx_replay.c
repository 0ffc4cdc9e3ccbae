/* test_ptx_replay.c: bench/ptx_replay.c's recorder on the test device, without a GPU.
 *
 * Why a test for a bench tool: the recorder is what makes a profile of the serving kernels
 * trustworthy (the relaunch is checked bitwise against OpenCL's own run), and it runs only on a
 * lent GPU, in minutes of device time. Its OpenCL relaunch (PTX_REPLAY_VIA=opencl: fresh buffers
 * from the recorded state before, a new kernel of the same program, the recorded scalars and
 * grid) checks the recording on any device:
 *   - a forward launch, and a decode launch over the paged cache with its splits merged in the
 *     kernel (a scratch buffer with counters, the output passed twice), relaunch equal to the
 *     recorded run;
 *   - the same forward with one input's sign bit flipped in the relaunch (PTX_REPLAY_PERTURB=1):
 *     the check must say it differs. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "serving_common.h"

int ptx_replay_outcome(void);
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
    setenv("PTX_REPLAY_VIA", "opencl", 1);
    flashcl_context *ctx = test_context();
    if (flashcl_context_is_host(ctx)) {
        printf("test_ptx_replay: the host path launches no kernel: skipped\n");
        flashcl_context_destroy(ctx);
        return test_summary(0);
    }
    const uint64_t seed = test_seed();

    int o = forward_outcome(ctx, seed, 0);
    printf("forward: outcome %d\n", o);
    expect(o == 0, "a forward launch relaunched equals the recorded one", &failures);
    o = forward_outcome(ctx, seed, 1);
    printf("forward, one sign flipped in the relaunch: outcome %d\n", o);
    expect(o > 0, "a perturbed relaunch is found to differ", &failures);

    /* Decoding over the paged cache with four splits merged by the last one: one sequence of 300
     * tokens, two kv heads of four query heads each, head dim 64, 16-token pages. */
    mirror m;
    mirror_init(&m, ctx, FLASHCL_FLOAT16, 2, 64, 16, 64);
    flashcl_kv_cache_add_sequence(m.cache, &m.ids[0]);
    const int slot[1] = {0}, tokens[1] = {300}, queries[1] = {1};
    expect(mirror_append(ctx, &m, 1, slot, tokens) == FLASHCL_SUCCESS, "300 tokens appended", &failures);
    ptx_replay_rearm();
    setenv("PTX_REPLAY_PERTURB", "0", 1);
    setenv("PTX_REPLAY_KERNEL", "paged_decode", 1);
    setenv("FLASHCL_DECODE_PARAMS", "KERNEL=decode", 1); /* the kernel that merges its own splits */
    expect(paged_check(ctx, &m, 1, slot, queries, 8, 1, 4, 0, "decode with 4 splits under the recorder", NULL),
           "decode with 4 splits under the recorder", &failures);
    unsetenv("FLASHCL_DECODE_PARAMS");
    mirror_free(&m);
    o = ptx_replay_outcome();
    printf("decode: outcome %d\n", o);
    expect(o == 0, "a decode launch with split merging relaunched equals the recorded one", &failures);

    ptx_replay_rearm(); /* the perturbed run's failure is this test's, not the process's exit */
    unsetenv("PTX_REPLAY_KERNEL");
    flashcl_context_destroy(ctx);
    return test_summary(failures + serving_failures);
}
