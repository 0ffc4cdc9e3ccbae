/* example.c: the minimal program of README.md ("Using the library"); tests/test_install.sh builds
 * it against an installed flashcl, through pkg-config and through CMake's find_package. */
#include <flashcl.h>
#include <stdio.h>

#define N 1024 /* seqlen_q = seqlen_k */
#define HQ 8
#define HK 2
#define D 64

static float q[N * HQ * D], k[N * HK * D], v[N * HK * D], out[N * HQ * D];
static float lse[HQ * N]; /* [batch][heads_q][seqlen_q], natural log */

int main(void) {
    flashcl_context *ctx; /* NULL spec: $FLASHCL_DEVICE, else a GPU, else any device, else C */
    if (flashcl_context_create(&ctx, NULL) != FLASHCL_SUCCESS) {
        fprintf(stderr, "flashcl: %s\n", flashcl_last_error(NULL)); /* this thread's last error */
        return 1;
    }
    /* The device, or on the C path the reason it runs (the library itself prints nothing). */
    printf("flashcl %s on %s\n", flashcl_version(), flashcl_context_device_name(ctx));

    flashcl_attention_desc d = {0}; /* zero = defaults: no mask, 1/sqrt(D), packed; C++: = {} */
    d.dtype = FLASHCL_FLOAT32;
    d.batch = 1;
    d.heads_q = HQ;
    d.heads_k = HK; /* GQA: 4 query heads per KV head */
    d.seqlen_q = d.seqlen_k = N;
    d.head_dim = D;
    d.causal = 1;

    /* q, k, v: [batch][seqlen][heads][head_dim], row-major */
    for (int i = 0; i < N * HQ * D; ++i)
        q[i] = (float)(i % 13) / 13.0f - 0.5f;
    for (int i = 0; i < N * HK * D; ++i) {
        k[i] = (float)(i % 11) / 11.0f - 0.5f;
        v[i] = (float)(i % 7) - 3.0f;
    }

    flashcl_status st = flashcl_attention_forward_host(ctx, &d, q, k, v, out, lse);
    if (st != FLASHCL_SUCCESS) /* the message starts with the status: print it once */
        fprintf(stderr, "flashcl: %s\n", flashcl_last_error(ctx));
    else
        printf("out[0][0][0][0..3] = %.4f %.4f %.4f %.4f, lse[0][0][0] = %.4f\n", out[0], out[1], out[2],
               out[3], lse[0]);
    flashcl_context_destroy(ctx);
    return st != FLASHCL_SUCCESS;
}
