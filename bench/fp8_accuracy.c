/* fp8_accuracy.c: FlashAttention-3's FP8 accuracy experiment on flashcl's FP8 forward. Not part of
 * the build; from the repository root, after building the library into build/:
 *
 *   gcc -O2 -std=c11 -Iinclude -Ihost_ref bench/fp8_accuracy.c host_ref/flashcl_ref.c \
 *       host_ref/ref_fp8.c -Lbuild -lflashcl -Wl,-rpath,$PWD/build -lOpenCL -lm -o /tmp/fp8_accuracy
 *   /tmp/fp8_accuracy [B H N D] [--device SPEC] [--npy DIR] [--out f32|f16|bf16] [--model-p8]
 *
 * Q, K, V ~ N(0,1) with 0.1% of the entries drawn from N(0, 10^2) (FA3, section 4.3; default
 * B=1, H=8, N=4096, D=128, seed fixed), quantized with the library's own helpers
 * (flashcl_fp8_quantize_host) per tensor, per head with 64-row blocks for q and k, with the
 * Hadamard rotation (incoherent processing) per tensor, and with both; each run through the FP8
 * forward (flashcl_attention_forward_host, out float32) and compared with float64 attention on
 * the UNQUANTIZED inputs (host_ref, one core: the slow part, about a minute at the default size).
 * Prints one RMSE per format and option. --npy DIR also writes q, k, v as float32 .npy there,
 * for `flashcl attention --dtype e4m3 [--block-quant] [--hadamard]` to rerun any row.
 * --out picks the output type (the nv-wgmma-fp8 kernel writes float16 or bfloat16 only:
 * FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8 with --out f16). --model-p8 runs no kernel: host_ref's
 * plain FP8 forward instead (float scores and sums, 256 exp(s - m) rounded to e4m3 before P V,
 * flashcl_ref_attention_forward_plain_p8), a model of what that kernel's error should come to
 * (the kernel rounds against the running max, the model against the row's).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashcl.h"
#include "flashcl_ref.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A float32 .npy of shape (b, n, h, d); 0 on success. */
static int write_npy(const char *path, const float *x, int b, int n, int h, int d) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    char header[128];
    int len = snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d, %d), }",
                       b, n, h, d);
    const int total = (10 + len + 1 + 63) / 64 * 64; /* magic + header + '\n', padded to 64 */
    memset(header + len, ' ', (size_t)(total - 10 - len - 1));
    header[total - 10 - 1] = '\n';
    const unsigned short hlen = (unsigned short)(total - 10);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hlen & 0xff, f), fputc(hlen >> 8, f);
    fwrite(header, 1, (size_t)hlen, f);
    fwrite(x, sizeof *x, (size_t)b * n * h * d, f);
    return fclose(f);
}

int main(int argc, char **argv) {
    int shape[4] = {1, 8, 4096, 128}, n_shape = 0;
    const char *device = NULL, *npy = NULL;
    flashcl_dtype out_dtype = FLASHCL_FLOAT32;
    int model_p8 = 0;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strcmp(argv[i], "--model-p8"))
            model_p8 = 1;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            const char *o = argv[++i];
            out_dtype = !strcmp(o, "f16") ? FLASHCL_FLOAT16 : !strcmp(o, "bf16") ? FLASHCL_BFLOAT16 : FLASHCL_FLOAT32;
            if (out_dtype == FLASHCL_FLOAT32 && strcmp(o, "f32")) {
                fprintf(stderr, "--out takes f32, f16 or bf16\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--npy") && i + 1 < argc)
            npy = argv[++i];
        else if (n_shape < 4)
            shape[n_shape++] = atoi(argv[i]);
    }
    const int B = shape[0], H = shape[1], N = shape[2], D = shape[3];
    const size_t n = (size_t)B * N * H * D;
    const uint64_t seed = 20261204;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    float *x[3];
    for (int t = 0; t < 3; ++t) {
        x[t] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; ++i) {
            const double z = flashcl_ref_rng_normal(&rng);
            x[t][i] = (float)(flashcl_ref_rng_uniform(&rng) < 0.001 ? 10.0 * z : z);
        }
    }
    if (npy) {
        static const char *const names[3] = {"q", "k", "v"};
        for (int t = 0; t < 3; ++t) {
            char path[1024];
            snprintf(path, sizeof path, "%s/%s.npy", npy, names[t]);
            if (write_npy(path, x[t], B, N, H, D) != 0) {
                fprintf(stderr, "cannot write %s\n", path);
                return 1;
            }
        }
    }
    flashcl_context *ctx;
    if (flashcl_context_create(&ctx, device) != FLASHCL_SUCCESS) {
        fprintf(stderr, "flashcl: %s\n", flashcl_last_error(NULL));
        return 1;
    }
    printf("B=%d H=%d N=%d D=%d, N(0,1) with 0.1%% from N(0,100), seed %llu, out %s, on %s\n", B, H, N, D,
           (unsigned long long)seed, out_dtype == FLASHCL_FLOAT32 ? "f32" : out_dtype == FLASHCL_FLOAT16 ? "f16" : "bf16",
           model_p8 ? "host_ref's plain model (P in e4m3), no kernel" : flashcl_context_device_name(ctx));

    double t0 = now();
    flashcl_attention_desc f = {0};
    f.dtype = FLASHCL_FLOAT32;
    f.batch = B, f.heads_q = f.heads_k = H, f.seqlen_q = f.seqlen_k = N, f.head_dim = D;
    flashcl_attention_desc_resolve(&f);
    double *ref = malloc(n * sizeof *ref);
    flashcl_ref_attention_forward(&f, x[0], x[1], x[2], ref, NULL, NULL, NULL);
    printf("float64 reference: %.1f s\n", now() - t0);

    static const char *const options[4] = {"per-tensor", "per-tensor + Hadamard", "per-head, 64-row blocks",
                                           "64-row blocks + Hadamard"};
    unsigned char *bytes[3];
    float *scales[3];
    float *out = malloc(n * sizeof *out); /* out_dtype elements */
    double *model = model_p8 ? malloc(n * sizeof *model) : NULL;
    for (int t = 0; t < 3; ++t) {
        bytes[t] = malloc(n);
        scales[t] = malloc((size_t)B * H * ((N + 63) / 64) * sizeof(float));
    }
    for (int fmt = 0; fmt < 2; ++fmt)
        for (int opt = 0; opt < 4; ++opt) {
            const int block = opt >= 2, hadamard = opt & 1;
            flashcl_attention_desc d = f;
            memset(&d.q, 0, sizeof d.q), memset(&d.k, 0, sizeof d.k), memset(&d.v, 0, sizeof d.v);
            memset(&d.out, 0, sizeof d.out);
            d.dtype = fmt ? FLASHCL_FLOAT8_E5M2 : FLASHCL_FLOAT8_E4M3;
            d.out_dtype = out_dtype;
            d.fp8.per_head = block;
            d.fp8.block_rows = block ? 64 : 0;
            for (int t = 0; t < 3; ++t) {
                flashcl_fp8_quant_desc qd = {0};
                qd.format = d.dtype, qd.src_dtype = FLASHCL_FLOAT32;
                qd.batch = B, qd.seqlen = N, qd.heads = H, qd.head_dim = D;
                qd.per_head = block;
                qd.block_rows = block && t < 2 ? 64 : 0; /* v: per (batch, head) */
                qd.hadamard_seed = hadamard && t < 2 ? 0x9e3779b97f4a7c15ull : 0;
                if (flashcl_fp8_quantize_host(&qd, x[t], bytes[t], scales[t]) != FLASHCL_SUCCESS) {
                    fprintf(stderr, "quantize: %s\n", flashcl_last_error(NULL));
                    return 1;
                }
            }
            d.fp8.q_descale = scales[0], d.fp8.k_descale = scales[1], d.fp8.v_descale = scales[2];
            t0 = now();
            flashcl_status st = FLASHCL_SUCCESS;
            if (model_p8)
                flashcl_ref_attention_forward_plain_p8(&d, bytes[0], bytes[1], bytes[2], model);
            else
                st = flashcl_attention_forward_host(ctx, &d, bytes[0], bytes[1], bytes[2], out, NULL);
            const double ms = (now() - t0) * 1e3;
            if (st != FLASHCL_SUCCESS) {
                fprintf(stderr, "forward: %s\n", flashcl_last_error(ctx));
                return 1;
            }
            double se = 0;
            for (size_t i = 0; i < n; ++i) {
                const double o = model_p8 ? model[i] : flashcl_ref_load(out, out_dtype, i);
                se += (o - ref[i]) * (o - ref[i]);
            }
            printf("%s %-26s RMSE %.4g   (%s %.0f ms)\n", fmt ? "e5m2" : "e4m3", options[opt],
                   sqrt(se / (double)n), model_p8 ? "model" : "forward incl. copies", ms);
        }
    free(model);
    flashcl_context_destroy(ctx);
    return 0;
}
