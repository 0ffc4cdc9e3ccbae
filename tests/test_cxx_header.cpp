// test_cxx_header.cpp: flashcl.h compiles as C++ (-Wall -Wextra -Werror), its descriptors zero-initialise
// with FLASHCL_ZERO_INIT, and a predefined CL_TARGET_OPENCL_VERSION is left as the application set it.
#include <flashcl.h>
#include <cstdio>
#include <cstring>

#ifdef FLASHCL_TEST_CL_TARGET
static_assert(CL_TARGET_OPENCL_VERSION == FLASHCL_TEST_CL_TARGET, "flashcl.h must keep the caller's target");
#else
static_assert(CL_TARGET_OPENCL_VERSION == 120, "flashcl.h's default target is OpenCL 1.2");
#endif

int main() {
    int failures = 0;
    flashcl_attention_desc d = FLASHCL_ZERO_INIT; // {} in C++
    flashcl_attention_desc cxx = {};              // what C++ users write by hand
    unsigned char zero[sizeof d] = {};
    if (std::memcmp(&d, zero, sizeof d) != 0 || std::memcmp(&cxx, zero, sizeof cxx) != 0) {
        std::printf("FAIL: FLASHCL_ZERO_INIT / {} leave a nonzero byte\n");
        ++failures;
    }
    d.dtype = FLASHCL_FLOAT32;
    d.batch = 1; d.heads_q = 8; d.heads_k = 2;
    d.seqlen_q = d.seqlen_k = 17; d.head_dim = 64;
    if (flashcl_attention_desc_resolve(&d) != FLASHCL_SUCCESS || d.scale <= 0.0f) {
        std::printf("FAIL: flashcl_attention_desc_resolve from C++\n");
        ++failures;
    }
    if (std::strcmp(flashcl_version(), FLASHCL_VERSION_STRING) != 0) {
        std::printf("FAIL: flashcl_version() = %s\n", flashcl_version());
        ++failures;
    }
    std::printf("%s: flashcl.h from C++ (CL_TARGET_OPENCL_VERSION %d)\n", failures ? "FAIL" : "ok",
                CL_TARGET_OPENCL_VERSION);
    return failures != 0;
}
