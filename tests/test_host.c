/* test_host.c: with no OpenCL platform at all, the default context runs the host C path, says why in its description,
 * and logs it once. */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "internal.h" /* flashcl_host_kernel_pick: each SIMD copy of the forward */

/* The exp2 of a copy of the host kernel (src/host_kernel_body.h) against libm's in
 * double: within 2 ulp where the result is normal, within one unit of 2^-149 where
 * it is subnormal, exactly 0 from -inf (a masked score) and far below, exactly 1 at
 * 0, NaN from NaN. */
static int exp2_accurate(const flashcl_host_kernel *k) {
    enum { N = 1 << 16 };
    static float x[N + 4], y[N + 4];
    for (int i = 0; i < N; ++i)
        x[i] = -160.0f + 288.0f * (float)i / N; /* -160 .. 128 */
    x[N] = -INFINITY;
    x[N + 1] = 0.0f;
    x[N + 2] = NAN;
    x[N + 3] = -1e30f;
    memcpy(y, x, sizeof y);
    k->exp2_array(y, N + 4);
    double worst = 0.0;
    int ok = 1;
    for (int i = 0; i < N; ++i) {
        const double want = exp2((double)x[i]);
        const double ulp = want < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(want) - 23);
        const double err = want >= 0x1p128 ? (isinf(y[i]) ? 0.0 : INFINITY) : fabs(y[i] - want) / ulp;
        if (err > worst)
            worst = err;
        if (!(err <= (want < 0x1p-126 ? 1.0 : 2.0))) {
            if (ok)
                printf("exp2 (%s): 2^%.9g = %.9g, want %.9g\n", k->name, (double)x[i], (double)y[i], want);
            ok = 0;
        }
    }
    ok = ok && y[N] == 0.0f && y[N + 1] == 1.0f && isnan(y[N + 2]) && y[N + 3] == 0.0f;
    printf("exp2 (%s): worst %.2f ulp, 2^-inf %g, 2^0 %g, 2^NaN %g\n", k->name, worst, (double)y[N],
           (double)y[N + 1], (double)y[N + 2]);
    return ok;
}

static int notes;

static void count(void *user, const char *line) {
    (void)user;
    if (strstr(line, "host C path"))
        ++notes;
}

int main(void) {
    int failures = 0;
    flashcl_set_log(count, NULL);
    /* CTest runs this with OCL_ICD_VENDORS pointing at an empty directory,
     * so the ICD loader finds no platform. */
    flashcl_context *a = NULL, *b = NULL;
    expect(flashcl_context_create(&a, NULL) == FLASHCL_SUCCESS && flashcl_context_is_host(a),
           "default context falls back to the host path", &failures);
    expect(flashcl_context_create(&b, "") == FLASHCL_SUCCESS && flashcl_context_is_host(b),
           "a second one too", &failures);
    expect(notes == 1, "the fallback is announced once", &failures);
    flashcl_context *gpu = NULL;
    expect(flashcl_context_create(&gpu, "gpu") == FLASHCL_ERROR_NO_DEVICE && !gpu,
           "an explicit device spec still fails without OpenCL", &failures);
    expect(strstr(flashcl_context_device_name(a), "host") != NULL, "the name says host", &failures);
    printf("description: %s\n", flashcl_context_device_name(a));
    expect(strstr(flashcl_context_device_name(a), "no OpenCL platform was found") != NULL,
           "the description says why the C path runs (the library prints nothing)", &failures);
    flashcl_context *asked = NULL;
    expect(flashcl_context_create(&asked, "host") == FLASHCL_SUCCESS &&
               strstr(flashcl_context_device_name(asked), "device spec is 'host'") != NULL,
           "spec 'host': the description says it was asked for", &failures);
    flashcl_context_destroy(asked);

    /* Same semantics as the device path: masks, GQA, dtypes, empty rows; head dims
     * off the kernel's 16-float vectors (1, 3, 59, 96, 111) and at its largest (256);
     * lengths off its 64-row blocks and 64-key tiles; more rows than keys and the
     * reverse (rows that see nothing under the bottom-right causal mask); windows
     * narrower than a tile; soft-capping; a long causal run. */
    uint64_t seed = test_seed();
    test_case cases[] = {
        {FLASHCL_FLOAT32, 2, 4, 2, 37, 53, 59, 1, -1, -1, 0.0f, 0.0f, LAYOUT_PACKED, 1.0},
        {FLASHCL_FLOAT16, 1, 3, 1, 100, 40, 64, 1, 5, -1, 0.0f, 0.0f, LAYOUT_PADDED, 1.0},
        {FLASHCL_BFLOAT16, 1, 2, 2, 65, 129, 111, 0, 9, 3, 20.0f, 0.0f, LAYOUT_BHSD, 3.0},
        {FLASHCL_FLOAT32, 1, 1, 1, 1, 300, 256, 0, -1, -1, 0.0f, 0.5f, LAYOUT_PACKED, 1.0},
        {FLASHCL_FLOAT32, 1, 2, 2, 77, 77, 1, 1, -1, -1, 0.0f, 0.0f, LAYOUT_PACKED, 1.0},
        {FLASHCL_FLOAT16, 2, 2, 1, 130, 70, 3, 0, -1, -1, 0.0f, 0.0f, LAYOUT_BHSD, 1.0},
        {FLASHCL_BFLOAT16, 1, 4, 2, 200, 333, 96, 1, -1, -1, 0.0f, 0.0f, LAYOUT_PADDED, 1.0},
        {FLASHCL_FLOAT16, 1, 2, 2, 129, 257, 256, 1, 17, -1, 0.0f, 0.0f, LAYOUT_PACKED, 2.0},
        {FLASHCL_FLOAT32, 1, 8, 2, 150, 150, 128, 0, 40, 0, 0.0f, 0.0f, LAYOUT_PACKED, 1.0},
        {FLASHCL_FLOAT32, 1, 2, 1, 1, 1000, 64, 1, -1, -1, 0.0f, 0.0f, LAYOUT_PACKED, 1.0},
        {FLASHCL_BFLOAT16, 1, 2, 2, 96, 96, 32, 0, -1, -1, 30.0f, 0.0f, LAYOUT_BHSD, 4.0},
        {FLASHCL_FLOAT16, 1, 2, 2, 1500, 1500, 64, 1, -1, -1, 0.0f, 0.0f, LAYOUT_PACKED, 1.0},
    };
    /* Every copy of the kernel this CPU runs (FLASHCL_HOST_SIMD picks one), with K
     * and V packed first (FLASHCL_HOST_PACK=1; by default only for long sequences)
     * and read tile by tile from the caller's arrays (FLASHCL_HOST_PACK=0). */
    static const char *copies[] = {"avx512", "avx2", "generic"};
    const char *saved = getenv("FLASHCL_HOST_SIMD");
    char *saved_copy = saved ? strdup(saved) : NULL;
    for (size_t c = 0; c < sizeof copies / sizeof copies[0]; ++c) {
        const flashcl_host_kernel k = flashcl_host_kernel_pick(copies[c]);
        if (strcmp(k.name, copies[c]) != 0) {
            printf("SIMD copy %s: not on this CPU or build, skipped\n", copies[c]);
            continue;
        }
        setenv("FLASHCL_HOST_SIMD", copies[c], 1);
        char what[96];
        snprintf(what, sizeof what, "%s: exp2 within 2 ulp, exact at -inf, 0, NaN", copies[c]);
        expect(exp2_accurate(&k), what, &failures);
        for (int pack = 1; pack >= 0; --pack) {
            setenv("FLASHCL_HOST_PACK", pack ? "1" : "0", 1);
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
                snprintf(what, sizeof what, "%s%s: host forward case %zu matches host_ref", copies[c],
                         pack ? "" : ", unpacked", i);
                expect(run_case(a, &cases[i], seed + i, 0), what, &failures);
            }
        }
        unsetenv("FLASHCL_HOST_PACK");
        /* Huge finite scores: the answer is exact in float, so must be ours. */
        const float huge[] = {1e10f, 3e10f, 1e30f, 2e38f};
        for (size_t i = 0; i < sizeof huge / sizeof huge[0]; ++i) {
            snprintf(what, sizeof what, "%s: host forward, huge scores %g", copies[c], huge[i]);
            expect(run_huge_scores(a, huge[i], 2, 0, 1, 0) && run_huge_scores(a, huge[i], 300, 250, 64, 0),
                   what, &failures);
        }
    }
    if (saved_copy)
        setenv("FLASHCL_HOST_SIMD", saved_copy, 1);
    else
        unsetenv("FLASHCL_HOST_SIMD");
    free(saved_copy);
    flashcl_context_destroy(a);
    flashcl_context_destroy(b);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
