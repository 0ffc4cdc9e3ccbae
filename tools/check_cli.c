/* check_cli.c: `flashcl check`: random problems on a device against the double-precision reference.
 */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_cli.h"
#include "cli_util.h"
#include "flashcl.h"
#include "flashcl_ref.h"

const char usage_check[] =
    "usage: flashcl check [--device SPEC] [--seed N] [--cases N]\n"
    "\n"
    "Runs seeded random problems (float32, float16, bfloat16; odd head dims;\n"
    "seqlen_q != seqlen_k both ways; causal, local windows, softcap, GQA/MQA)\n"
    "through flashcl with fresh inputs and poisoned outputs, and checks each\n"
    "against the double-precision reference. Prints one row per case; exits 1 if\n"
    "any case fails.\n"
    "\n"
    "options:\n"
    "  --seed N    seed of inputs and random shapes (default 1)\n"
    "  --cases N   number of cases (default 12: the fixed set; more adds random shapes)\n"
    "  --device SPEC\n";

/* "none", "causal", "causal,L=32", "win(8,8)", then "+cap30" and "+s0.08". */
static void mask_label(int causal, int window_left, int window_right, double softcap, double scale,
                       char *buf, size_t size) {
    int n;
    if (causal && window_left >= 0)
        n = snprintf(buf, size, "causal,L=%d", window_left);
    else if (causal)
        n = snprintf(buf, size, "causal");
    else if (window_left >= 0 || window_right >= 0)
        n = snprintf(buf, size, "win(%d,%d)", window_left, window_right);
    else
        n = snprintf(buf, size, "none");
    if (n < 0 || (size_t)n >= size)
        return;
    if (softcap > 0)
        n += snprintf(buf + n, size - (size_t)n, "+cap%g", softcap);
    if (n < 0 || (size_t)n >= size)
        return;
    if (scale > 0)
        snprintf(buf + n, size - (size_t)n, "+s%.3g", scale);
}

typedef struct check_case {
    flashcl_dtype dtype;
    int batch, heads_q, heads_k, seqlen_q, seqlen_k, head_dim;
    int causal, window_left, window_right;
    float softcap, scale;
} check_case;

/* The fixed set: every feature at least once, sizes that are not tile
 * multiples; the first four alone cover the three dtypes, odd head dims,
 * GQA/MQA, Nq < Nk and Nq > Nk, causal with empty rows, windows and softcap. */
static const check_case fixed_cases[] = {
    /* dtype           B  Hq Hk  Nq   Nk    D  causal wl  wr  softcap scale */
    {FLASHCL_FLOAT16, 1, 4, 4, 65, 65, 64, 1, -1, -1, 0.0f, 0.0f},
    {FLASHCL_FLOAT32, 2, 6, 2, 17, 130, 59, 0, -1, -1, 0.0f, 0.0f},   /* GQA 3:1, Nq < Nk */
    {FLASHCL_BFLOAT16, 1, 4, 1, 113, 40, 111, 1, -1, -1, 0.0f, 0.0f}, /* MQA, empty rows */
    {FLASHCL_FLOAT16, 1, 2, 2, 100, 100, 128, 0, 16, 0, 30.0f, 0.0f}, /* window + softcap */
    {FLASHCL_FLOAT32, 1, 3, 3, 1, 257, 32, 1, -1, -1, 0.0f, 0.0f},    /* one query (decode) */
    {FLASHCL_FLOAT16, 2, 4, 2, 77, 93, 80, 0, 8, 8, 0.0f, 0.0f},      /* symmetric window */
    {FLASHCL_BFLOAT16, 1, 2, 2, 31, 31, 256, 0, -1, -1, 0.0f, 0.0f},  /* largest head_dim */
    {FLASHCL_FLOAT16, 1, 2, 1, 64, 64, 1, 1, -1, -1, 0.0f, 0.0f},     /* head_dim 1 */
    {FLASHCL_FLOAT32, 1, 2, 2, 129, 64, 96, 1, 32, -1, 20.0f, 0.08f}, /* everything at once */
    {FLASHCL_BFLOAT16, 1, 8, 2, 200, 200, 64, 1, -1, -1, 0.0f, 0.0f},
    {FLASHCL_FLOAT16, 3, 3, 3, 2, 7, 16, 0, -1, -1, 0.0f, 0.0f},
    {FLASHCL_FLOAT32, 1, 1, 1, 255, 513, 40, 0, -1, -1, 0.0f, 0.0f},
};
#define NUM_FIXED_CASES ((int)(sizeof fixed_cases / sizeof fixed_cases[0]))

/* The reference runs in double twice per case (exact and plain); this bound
 * on B*Hq*Nq*Nk*D keeps a random case to a few tens of milliseconds. */
#define CHECK_MAX_MACS 4000000.0

static int pick(flashcl_ref_rng *rng, int n) {
    return (int)(flashcl_ref_rng_next(rng) % (uint64_t)n);
}

static void random_case(flashcl_ref_rng *rng, check_case *c) {
    static const int dims[] = {1,  3,  8,  16,  24,  32,  40,  48,  59, 64,
                               72, 80, 96, 100, 111, 128, 160, 192, 256};
    static const int lens[] = {1,  2,  3,   7,   16,  17,  31,  32,  33, 63,
                               64, 65, 100, 113, 127, 128, 129, 200, 255};
    static const int ratios[] = {1, 1, 2, 4};
    int mask;
    memset(c, 0, sizeof *c);
    c->dtype = (flashcl_dtype)pick(rng, 3);
    c->head_dim = dims[pick(rng, (int)(sizeof dims / sizeof dims[0]))];
    c->heads_k = 1 + pick(rng, 3);
    c->heads_q = c->heads_k * ratios[pick(rng, 4)];
    c->batch = 1 + pick(rng, 2);
    c->seqlen_q = lens[pick(rng, (int)(sizeof lens / sizeof lens[0]))];
    c->seqlen_k = lens[pick(rng, (int)(sizeof lens / sizeof lens[0]))];
    c->window_left = c->window_right = -1;
    mask = pick(rng, 4);
    if (mask == 1 || mask == 3)
        c->causal = 1;
    if (mask >= 2) {
        c->window_left = pick(rng, 65);
        if (mask == 2)
            c->window_right = pick(rng, 5) == 0 ? -1 : pick(rng, 65);
    }
    if (pick(rng, 4) == 0)
        c->softcap = (float)(10 + pick(rng, 41));
    if (pick(rng, 5) == 0)
        c->scale = (float)(20 + pick(rng, 281)) / 1000.0f; /* 0.02 .. 0.3 */
    while ((double)c->batch * c->heads_q * c->seqlen_q * c->seqlen_k * c->head_dim >
           CHECK_MAX_MACS) {
        if (c->seqlen_q >= c->seqlen_k)
            c->seqlen_q = (c->seqlen_q + 1) / 2;
        else
            c->seqlen_k = (c->seqlen_k + 1) / 2;
    }
}

/* Runs one case; returns 1 on pass. Prints its table row. */
static int run_check_case(flashcl_context *ctx, int index, const check_case *c, uint64_t seed) {
    flashcl_attention_desc desc = cli_make_desc(c->dtype, c->batch, c->heads_q, c->heads_k,
                                                c->seqlen_q, c->seqlen_k, c->head_dim);
    flashcl_ref_report report;
    flashcl_ref_rng rng;
    flashcl_status status;
    size_t esz = flashcl_dtype_size(c->dtype), nq = 0, nk = 0, nlse = 0;
    void *q = NULL, *k = NULL, *v = NULL, *out = NULL;
    float *lse = NULL;
    char mask[64];
    double t0, ms;
    int passed = 0;

    desc.causal = c->causal;
    desc.windowed = c->window_left >= 0 || c->window_right >= 0;
    desc.window_left = c->window_left;
    desc.window_right = c->window_right;
    desc.softcap = c->softcap;
    desc.scale = c->scale;
    mask_label(c->causal, c->window_left, c->window_right, c->softcap, c->scale, mask, sizeof mask);
    printf("%4d  %-4s %3d %3d %3d %5d %5d %4d  %-22s ", index, cli_dtype_name(c->dtype), c->batch,
           c->heads_q, c->heads_k, c->seqlen_q, c->seqlen_k, c->head_dim, mask);
    fflush(stdout);

    status = flashcl_attention_desc_resolve(&desc);
    if (status != FLASHCL_SUCCESS) {
        printf("FAIL\n");
        cli_report_status(NULL, "case description rejected", status);
        return 0;
    }
    cli_count4((size_t)c->batch, (size_t)c->seqlen_q, (size_t)c->heads_q, (size_t)c->head_dim, &nq);
    cli_count4((size_t)c->batch, (size_t)c->seqlen_k, (size_t)c->heads_k, (size_t)c->head_dim, &nk);
    nlse = (size_t)c->batch * (size_t)c->heads_q * (size_t)c->seqlen_q;
    q = malloc(nq * esz);
    k = malloc(nk * esz);
    v = malloc(nk * esz);
    out = malloc(nq * esz);
    lse = malloc(nlse * sizeof *lse);
    if (q == NULL || k == NULL || v == NULL || out == NULL || lse == NULL) {
        printf("FAIL\n");
        cli_errorf("out of memory");
        goto done;
    }
    /* Fresh inputs per case from a stream keyed by (seed, case), and poisoned
     * outputs so that anything the kernel forgets to write fails. */
    flashcl_ref_rng_seed(&rng, seed * 0x9E3779B97F4A7C15ull + (uint64_t)index + 1u);
    flashcl_ref_fill_normal(&rng, q, c->dtype, nq, 1.0);
    flashcl_ref_fill_normal(&rng, k, c->dtype, nk, 1.0);
    flashcl_ref_fill_normal(&rng, v, c->dtype, nk, 1.0);
    flashcl_ref_poison(out, c->dtype, nq);
    flashcl_ref_poison(lse, FLASHCL_FLOAT32, nlse);

    t0 = cli_now();
    status = flashcl_attention_forward_host(ctx, &desc, q, k, v, out, lse);
    ms = (cli_now() - t0) * 1e3;
    if (status != FLASHCL_SUCCESS) {
        printf("%10s %10s %10s %8.1f  FAIL\n", "-", "-", "-", ms);
        cli_report_status(ctx, "forward failed", status);
        goto done;
    }
    memset(&report, 0, sizeof report);
    passed = flashcl_ref_check_forward(&desc, q, k, v, out, lse, 0, &report);
    printf("%10.3g %10.3g %10.3g %8.1f  %s\n", report.max_err, report.tolerance, report.max_lse_err,
           ms, passed ? "PASS" : "FAIL");
    if (!passed) {
        fflush(stdout);
        fprintf(stderr,
                "  case %d: %zu mismatches; first bad out element b=%zu i=%zu h=%zu d=%zu\n", index,
                report.mismatches, report.first_bad[0], report.first_bad[1], report.first_bad[2],
                report.first_bad[3]);
        /* Again, verbosely: the first mismatches with their indices. */
        flashcl_ref_check_forward(&desc, q, k, v, out, lse, 1, &report);
    }
done:
    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
    fflush(stdout);
    return passed;
}

int cmd_check(int argc, char **argv) {
    const char *device = NULL;
    long cases = NUM_FIXED_CASES, seed_long = 1;
    flashcl_context *ctx;
    flashcl_ref_rng shape_rng;
    int failures = 0;
    double t0;

    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int r;
        if (cli_help(arg, usage_check)) {
            return CLI_EXIT_OK;
        } else if ((r = cli_take_value(argc, argv, &i, "--device", &device)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if ((r = cli_take_long(usage_check, argc, argv, &i, "--seed", 0, LONG_MAX,
                                      "a non-negative integer", &seed_long)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if ((r = cli_take_long(usage_check, argc, argv, &i, "--cases", 1, 1000000,
                                      "an integer >= 1", &cases)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else {
            return cli_unknown_option(usage_check, arg);
        }
    }

    ctx = cli_open_context(device);
    if (ctx == NULL)
        return CLI_EXIT_FAIL;
    printf("flashcl check: %s%s, seed %ld, %ld case%s\n", flashcl_context_device_name(ctx),
           flashcl_context_is_host(ctx) ? " [host path]" : "", seed_long, cases,
           cases == 1 ? "" : "s");
    printf("%4s  %-4s %3s %3s %3s %5s %5s %4s  %-22s %10s %10s %10s %8s  %s\n", "case", "dtype",
           "B", "Hq", "Hk", "Nq", "Nk", "D", "mask", "max_err", "tolerance", "lse_err", "ms",
           "result");
    flashcl_ref_rng_seed(&shape_rng, (uint64_t)seed_long);
    t0 = cli_now();
    for (long i = 0; i < cases; i++) {
        check_case c;
        if (i < NUM_FIXED_CASES)
            c = fixed_cases[i];
        else
            random_case(&shape_rng, &c);
        if (!run_check_case(ctx, (int)i, &c, (uint64_t)seed_long))
            failures++;
    }
    printf("%ld/%ld passed in %.1f s\n", cases - failures, cases, cli_now() - t0);
    flashcl_context_destroy(ctx);
    if (failures) {
        cli_errorf("%d of %ld cases failed", failures, cases);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
