/* spec_sim.c: `flashcl spec-sim`, a statistical check of speculative verification on given
 * target and draft distributions (flashcl_spec_verify, many trials). */
#define _POSIX_C_SOURCE 200809L
#include "spec_sim.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "flashcl.h"
#include "flashcl_ref.h"
#include "npy.h"

const char usage_spec_sim[] =
    "usage: flashcl spec-sim --target P.npy --draft Q.npy [--trials N] [--seed S] [--out H.npy]\n"
    "                        [--device SPEC]\n"
    "\n"
    "Speculative-decoding check: P holds k+1 target rows and Q k draft rows of\n"
    "probabilities (float32/float16/float64, shapes (k+1, V) and (k, V)). Each of\n"
    "N trials (default 100000) samples k draft tokens from Q's rows, and\n"
    "flashcl_spec_verify verifies them against P (seed S, default 1). Prints the\n"
    "mean number of accepted drafts next to the constant-rate formula, and the\n"
    "first emitted token's frequencies next to P's first row (they agree: the\n"
    "method is lossless); --out writes the first token's counts, float64 [V].\n";

/* Element i of an array as double. */
static double npy_at(const npy_array *a, size_t i) {
    if (a->dtype == NPY_FLOAT64)
        return ((const double *)a->data)[i];
    if (a->dtype == NPY_FLOAT32)
        return ((const float *)a->data)[i];
    return flashcl_ref_half_to_float(((const uint16_t *)a->data)[i]);
}

int cmd_spec_sim(int argc, char **argv) {
    const char *target = NULL, *draft_path = NULL, *out = NULL, *device = NULL;
    long trials = 100000, seed = 1;
    for (int i = 2; i < argc; ++i) {
        int t;
        if (cli_help(argv[i], usage_spec_sim)) {
            return CLI_EXIT_OK;
        } else if ((t = cli_take_value(argc, argv, &i, "--target", &target)) != 0 ||
                   (t = cli_take_value(argc, argv, &i, "--draft", &draft_path)) != 0 ||
                   (t = cli_take_value(argc, argv, &i, "--out", &out)) != 0 ||
                   (t = cli_take_value(argc, argv, &i, "--device", &device)) != 0) {
            if (t < 0)
                return CLI_EXIT_USAGE;
        } else if ((t = cli_take_long(usage_spec_sim, argc, argv, &i, "--trials", 1, 1000000000L, "1..1e9",
                                      &trials)) != 0 ||
                   (t = cli_take_long(usage_spec_sim, argc, argv, &i, "--seed", 0, 0x7fffffffL, "an integer >= 0",
                                      &seed)) != 0) {
            if (t < 0)
                return CLI_EXIT_USAGE;
        } else {
            return cli_unknown_option(usage_spec_sim, argv[i]);
        }
    }
    if (!target || !draft_path)
        return cli_usage_error(usage_spec_sim, "spec-sim needs --target and --draft");
    npy_array P, Q;
    char err[256];
    if (npy_read_any(target, &P, err, sizeof err)) {
        cli_errorf("%s: %s", target, err);
        return CLI_EXIT_FAIL;
    }
    if (npy_read_any(draft_path, &Q, err, sizeof err)) {
        cli_errorf("%s: %s", draft_path, err);
        npy_free(&P);
        return CLI_EXIT_FAIL;
    }
    int rc = CLI_EXIT_OK;
    if (P.ndim != 2 || Q.ndim != 2 || P.shape[1] != Q.shape[1] || P.shape[0] != Q.shape[0] + 1 || Q.shape[0] < 1 ||
        Q.shape[0] > FLASHCL_SPEC_MAX_DRAFT || P.shape[1] < 1 || P.shape[1] > FLASHCL_SPEC_MAX_VOCAB) {
        cli_errorf("want P of shape (k+1, V) and Q of shape (k, V) with 1 <= k <= %d, 1 <= V <= %d",
                   FLASHCL_SPEC_MAX_DRAFT, FLASHCL_SPEC_MAX_VOCAB);
        npy_free(&P);
        npy_free(&Q);
        return CLI_EXIT_FAIL;
    }
    const int K = (int)Q.shape[0], V = (int)P.shape[1];
    /* Trials per launch: about 64 MiB of replicated rows. */
    long chunk = (16L << 20) / ((2L * K + 1) * V);
    chunk = chunk < 1 ? 1 : chunk > trials ? trials : chunk;
    float *p1 = malloc((size_t)(K + 1) * V * sizeof(float)), *q1 = malloc((size_t)K * V * sizeof(float));
    double *cdf = malloc((size_t)K * V * sizeof(double)), *hist = calloc((size_t)V, sizeof(double));
    float *pb = malloc((size_t)chunk * (K + 1) * V * sizeof(float)), *qb = malloc((size_t)chunk * K * V * sizeof(float));
    int *db = malloc((size_t)chunk * K * sizeof(int)), *acc = malloc((size_t)chunk * sizeof(int));
    int *tok = malloc((size_t)chunk * (K + 1) * sizeof(int));
    flashcl_context *ctx = NULL;
    if (!p1 || !q1 || !cdf || !hist || !pb || !qb || !db || !acc || !tok) {
        cli_errorf("out of memory");
        rc = CLI_EXIT_FAIL;
    } else if (flashcl_context_create(&ctx, device) != FLASHCL_SUCCESS) {
        cli_errorf("%s", flashcl_last_error(ctx));
        rc = CLI_EXIT_FAIL;
    }
    double alpha[FLASHCL_SPEC_MAX_DRAFT];
    if (rc == CLI_EXIT_OK) {
        for (size_t i = 0; i < (size_t)(K + 1) * V; ++i)
            p1[i] = (float)npy_at(&P, i);
        for (int i = 0; i < K; ++i) {
            double c = 0.0, a = 0.0;
            for (int y = 0; y < V; ++y) {
                q1[(size_t)i * V + y] = (float)npy_at(&Q, (size_t)i * V + y);
                c += q1[(size_t)i * V + y] > 0 ? q1[(size_t)i * V + y] : 0.0;
                cdf[(size_t)i * V + y] = c;
                a += fmin(p1[(size_t)i * V + y], q1[(size_t)i * V + y]);
            }
            alpha[i] = a;
        }
        for (long c = 0; c < chunk; ++c) {
            memcpy(pb + (size_t)c * (K + 1) * V, p1, (size_t)(K + 1) * V * sizeof(float));
            memcpy(qb + (size_t)c * K * V, q1, (size_t)K * V * sizeof(float));
        }
    }
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, (uint64_t)seed ^ 0x5bd1e995ull);
    double accepted_sum = 0.0;
    long done_trials = 0;
    const double t0 = cli_now();
    for (long base = 0; rc == CLI_EXIT_OK && base < trials; base += chunk) {
        const long b_n = trials - base < chunk ? trials - base : chunk;
        for (long b = 0; b < b_n; ++b)
            for (int i = 0; i < K; ++i) { /* inverse CDF of Q's row i */
                const double *row = cdf + (size_t)i * V, u = flashcl_ref_rng_uniform(&rng) * row[V - 1];
                int lo = 0, hi = V - 1;
                while (lo < hi) {
                    int mid = (lo + hi) / 2;
                    if (row[mid] > u)
                        hi = mid;
                    else
                        lo = mid + 1;
                }
                db[(size_t)b * K + i] = lo;
            }
        flashcl_spec_desc d;
        memset(&d, 0, sizeof d);
        d.batch = (int)b_n;
        d.num_draft = K;
        d.vocab = V;
        d.seed = (unsigned long long)seed;
        d.offset = (unsigned long long)(base / chunk); /* fresh counters per launch */
        flashcl_status st = flashcl_spec_verify_host(ctx, &d, db, qb, pb, acc, tok);
        if (st) {
            cli_errorf("spec verify: %s", flashcl_last_error(ctx));
            rc = CLI_EXIT_FAIL;
            break;
        }
        for (long b = 0; b < b_n; ++b) {
            accepted_sum += acc[b];
            hist[tok[(size_t)b * (K + 1)]] += 1.0;
        }
        done_trials += b_n;
    }
    if (rc == CLI_EXIT_OK) {
        const double mean = accepted_sum / (double)done_trials;
        printf("device: %s\n", flashcl_context_device_name(ctx));
        printf("%ld trials, k = %d, vocab %d, %.2f s\n", done_trials, K, V, cli_now() - t0);
        printf("alpha_i = sum min(p_i, q_i):");
        double amean = 0.0;
        for (int i = 0; i < K; ++i) {
            printf(" %.4f", alpha[i]);
            amean += alpha[i] / K;
        }
        /* positions accept independently: E[tokens] = 1 + a_0 + a_0 a_1 + ... (the
         * library's formula when every a_i is equal) */
        double expect_tokens = 1.0, prod = 1.0;
        for (int i = 0; i < K; ++i)
            expect_tokens += (prod *= alpha[i]);
        printf("\nmean accepted drafts %.4f, tokens per verification %.4f; expected 1 + a_0 + a_0 a_1 + ... = %.4f "
               "(flashcl_spec_expected_tokens(mean alpha %.4f, %d) = %.4f)\n",
               mean, mean + 1.0, expect_tokens, amean, K, flashcl_spec_expected_tokens(amean, K));
        /* the first token against p_0: chi-square statistic */
        double chi = 0.0, maxdev = 0.0;
        int df = -1;
        for (int y = 0; y < V; ++y) {
            double e = (double)p1[y] * (double)done_trials;
            if (e > 0) {
                chi += (hist[y] - e) * (hist[y] - e) / e;
                ++df;
            }
            maxdev = fmax(maxdev, fabs(hist[y] / (double)done_trials - p1[y]));
        }
        printf("first emitted token vs p_0: max |freq - p| %.5f, chi-square %.2f on %d degrees of freedom\n", maxdev,
               chi, df);
        if (V <= 16) {
            printf("%6s %10s %10s\n", "token", "freq", "p_0");
            for (int y = 0; y < V; ++y)
                printf("%6d %10.5f %10.5f\n", y, hist[y] / (double)done_trials, p1[y]);
        }
        if (out) {
            size_t shape[1] = {(size_t)V};
            char *tmp = NULL;
            if (npy_write_temp(out, NPY_FLOAT64, shape, 1, hist, &tmp, err, sizeof err) != 0) {
                cli_errorf("%s: %s", out, err);
                rc = CLI_EXIT_FAIL;
            } else if (rename(tmp, out) != 0) {
                cli_errorf("%s: cannot rename the temporary file into place", out);
                remove(tmp);
                rc = CLI_EXIT_FAIL;
            } else {
                printf("histogram (counts, float64 [%d]): %s\n", V, out);
            }
            free(tmp);
        }
    }
    flashcl_context_destroy(ctx);
    free(p1);
    free(q1);
    free(cdf);
    free(hist);
    free(pb);
    free(qb);
    free(db);
    free(acc);
    free(tok);
    npy_free(&P);
    npy_free(&Q);
    return rc;
}
