/* test_host.c: with no OpenCL platform at all, the default context runs the host C path, says why in its description,
 * and logs it once. */
#include <stdio.h>
#include <string.h>

#include "harness.h"

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

    /* Same semantics as the device path: masks, GQA, dtypes, empty rows. */
    uint64_t seed = test_seed();
    test_case cases[] = {
        {FLASHCL_FLOAT32, 2, 4, 2, 37, 53, 59, 1, -1, -1, 0.0f, 0.0f, LAYOUT_PACKED, 1.0},
        {FLASHCL_FLOAT16, 1, 3, 1, 100, 40, 64, 1, 5, -1, 0.0f, 0.0f, LAYOUT_PADDED, 1.0},
        {FLASHCL_BFLOAT16, 1, 2, 2, 65, 129, 111, 0, 9, 3, 20.0f, 0.0f, LAYOUT_BHSD, 3.0},
        {FLASHCL_FLOAT32, 1, 1, 1, 1, 300, 256, 0, -1, -1, 0.0f, 0.5f, LAYOUT_PACKED, 1.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        char what[64];
        snprintf(what, sizeof what, "host forward case %zu matches host_ref", i);
        expect(run_case(a, &cases[i], seed + i, 0), what, &failures);
    }
    /* Huge finite scores: the answer is exact in float, so must be ours. */
    const float huge[] = {1e10f, 3e10f, 1e30f, 2e38f};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; ++i) {
        char what[64];
        snprintf(what, sizeof what, "host forward, huge scores %g", huge[i]);
        expect(run_huge_scores(a, huge[i], 2, 0, 1, 0) && run_huge_scores(a, huge[i], 300, 250, 64, 0), what,
               &failures);
    }
    flashcl_context_destroy(a);
    flashcl_context_destroy(b);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
