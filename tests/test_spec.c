/* test_spec.c: speculative-decoding verification: bit-exact tokens against host_ref, losslessness, acceptance rate, bad input.
 *
 * 1. Philox4x32-10 against Random123's known answers; mulhi64; the fixed exp2.
 * 2. Device, host path and host_ref emit identical tokens for the same seed
 *    (probabilities, logits, greedy; vocabularies 1 .. 256k, not powers of
 *    two; forced work-group sizes 1, 4, 32 give the same tokens).
 * 3. Losslessness: the first emitted token's histogram over 2*10^5 trials
 *    passes a chi-square goodness-of-fit test against p_0 (p-value > 1e-3,
 *    or, below that, on a second draw; several seeds, host path and one
 *    device launch), and the same test
 *    rejects two deliberately wrong samplers (residual replaced by p; no
 *    rejection at all) with p-value < 1e-3.
 * 4. Mean tokens per verification = (1 - a^(k+1)) / (1 - a) for rows with
 *    known a = sum min(p, q), within 5 standard errors (measured from the
 *    sample itself: a false failure has probability ~6e-7).
 * 5. Every kind of bad input gives its status, and the outputs stay as they
 *    were.
 * FLASHCL_TEST_SEED replays a run.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int failures;

/* ---- chi-square: the regularized upper incomplete gamma Q(a, x) ------------------------------- */

/* Q(a, x) = Gamma(a, x) / Gamma(a): the series of P for x < a + 1, else
 * Lentz's continued fraction for Q (both converge fast in their regions). */
static double gamma_q(double a, double x) {
    if (x <= 0.0)
        return 1.0;
    const double lead = exp(-x + a * log(x) - lgamma(a));
    if (x < a + 1.0) {
        double term = 1.0 / a, sum = term;
        for (int n = 1; n < 10000 && fabs(term) > 1e-17 * fabs(sum); ++n) {
            term *= x / (a + n);
            sum += term;
        }
        return 1.0 - sum * lead;
    }
    const double tiny = 1e-300;
    double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
    for (int i = 1; i < 10000; ++i) {
        double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        d = fabs(d) < tiny ? tiny : d;
        c = b + an / c;
        c = fabs(c) < tiny ? tiny : c;
        d = 1.0 / d;
        double delta = d * c;
        h *= delta;
        if (fabs(delta - 1.0) < 1e-15)
            break;
    }
    return h * lead;
}

/* p-value of Pearson's chi-square for counts against probabilities p. */
static double chi_square_p(const long *counts, const double *p, int V, long n) {
    double chi = 0.0;
    int df = -1;
    for (int y = 0; y < V; ++y) {
        if (p[y] <= 0.0) {
            if (counts[y] > 0)
                return 0.0; /* a token of probability 0 appeared */
            continue;
        }
        double e = p[y] * (double)n, dlt = (double)counts[y] - e;
        chi += dlt * dlt / e;
        ++df;
    }
    return df < 1 ? 1.0 : gamma_q(df / 2.0, chi / 2.0);
}

static void test_chi_square_cdf(void) {
    /* Known values: chi2 survival of 3.841459 at df 1 = 0.05; 18.307 at df 10 = 0.05;
     * df 2 is exp(-x/2) exactly. */
    expect(fabs(gamma_q(0.5, 3.841459 / 2) - 0.05) < 1e-6, "chi2 sf(3.8415, df 1) = 0.05", &failures);
    expect(fabs(gamma_q(5.0, 18.307038 / 2) - 0.05) < 1e-6, "chi2 sf(18.307, df 10) = 0.05", &failures);
    expect(fabs(gamma_q(1.0, 7.0 / 2) - exp(-3.5)) < 1e-12, "chi2 sf(7, df 2) = exp(-3.5)", &failures);
    /* Even df: sf(x; 2m) = exp(-x/2) sum_{j<m} (x/2)^j / j!, exactly; both branches. */
    for (int t = 0; t < 2; ++t) {
        const double x = t ? 150.0 : 60.0, h = x / 2;
        double term = exp(-h), sum = 0.0;
        for (int j = 0; j < 50; ++j) {
            sum += term;
            term *= h / (j + 1);
        }
        char what[64];
        snprintf(what, sizeof what, "chi2 sf(%g, df 100) = closed form %.6g", x, sum);
        expect(fabs(gamma_q(50.0, h) - sum) < 1e-10 * fmax(1.0, sum) + 1e-14, what, &failures);
    }
}

/* ---- primitives --------------------------------------------------------------------------------- */

static void test_primitives(void) {
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e,
         0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb,
         0x5001e420, 0x24126ea1}};
    int ok = 1;
    for (int t = 0; t < 3; ++t) {
        uint32_t out[4];
        flashcl_ref_philox4x32_10(kat[t], kat[t] + 4, out);
        ok &= !memcmp(out, kat[t] + 6, sizeof out);
    }
    expect(ok, "Philox4x32-10 matches Random123's known answers", &failures);

    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, test_seed());
    ok = 1;
    for (int i = 0; i < 10000; ++i) {
        uint64_t a = flashcl_ref_rng_next(&rng), b = flashcl_ref_rng_next(&rng);
        if (i < 4)
            b = i == 0 ? 0 : i == 1 ? ~0ull : i == 2 ? 1 : (1ull << 63);
        /* Compare against the long-multiplication identity via 32-bit halves in double-free form. */
        uint64_t hi = flashcl_ref_mulhi64(a, b);
        uint64_t lo = a * b;
        /* Check hi:lo == a*b by recomputing (a*b) mod 2^64 and (a*b) / 2^64 with __int128 when available. */
#if defined(__SIZEOF_INT128__)
        unsigned __int128 full = (unsigned __int128)a * b;
        ok &= hi == (uint64_t)(full >> 64) && lo == (uint64_t)full;
#else
        (void)lo;
        ok &= hi <= a;
#endif
    }
    expect(ok, "mulhi64 equals the 128-bit product's high half", &failures);

    double worst = 0.0;
    for (int i = 0; i <= 40000; ++i) {
        float x = -40.0f + (float)i * 0.001f;
        double want = exp2((double)x), got = flashcl_ref_spec_exp2(x);
        worst = fmax(worst, fabs(got - want) / want);
    }
    printf("  fixed exp2 on [-40, 0]: max relative error %.2e\n", worst);
    expect(worst < 1e-6 && flashcl_ref_spec_exp2(-41.0f) == 0.0f && flashcl_ref_spec_exp2(-INFINITY) == 0.0f &&
               flashcl_ref_spec_exp2(0.0f) == 1.0f,
           "fixed exp2 within 1e-6 of exp2, 0 below -40", &failures);

    expect(fabs(flashcl_spec_expected_tokens(0.7, 5) - (1 - pow(0.7, 6)) / 0.3) < 1e-12 &&
               flashcl_spec_expected_tokens(1.0, 4) == 5.0 && flashcl_spec_expected_tokens(0.0, 4) == 1.0 &&
               isnan(flashcl_spec_expected_tokens(1.5, 4)) && isnan(flashcl_spec_expected_tokens(0.5, -1)),
           "flashcl_spec_expected_tokens", &failures);
}

/* ---- random problems ------------------------------------------------------------------------------ */

typedef struct problem {
    flashcl_spec_desc d;
    int *draft;
    float *q, *p;
} problem;

/* A random row: probabilities from exp(N(0, spread)) with some exact zeros,
 * normalised in double and rounded to float (sums within ~1e-7 of 1); or
 * logits with some -inf. */
static void random_row(flashcl_ref_rng *rng, float *row, int V, int logits, double spread) {
    double sum = 0.0;
    double *tmp = test_xmalloc((size_t)V * sizeof *tmp);
    for (int y = 0; y < V; ++y) {
        double z = flashcl_ref_rng_normal(rng) * spread;
        int masked = V > 2 && flashcl_ref_rng_uniform(rng) < 0.1;
        tmp[y] = masked ? 0.0 : exp(z);
        sum += tmp[y];
        if (logits)
            row[y] = masked ? -INFINITY : (float)z;
    }
    if (sum == 0.0) {
        tmp[0] = 1.0;
        sum = 1.0;
        if (logits)
            row[0] = 0.0f;
    }
    if (!logits)
        for (int y = 0; y < V; ++y)
            row[y] = (float)(tmp[y] / sum);
    free(tmp);
}

/* Draft q rows random; target p rows a blend of q and another random row, so
 * both acceptances and rejections happen; drafts sampled from q (or, with
 * small probability, any token, so q(x) = 0 drafts occur). */
static problem make_problem(uint64_t seed, int B, int K, int V, int logits, int greedy) {
    problem pr;
    memset(&pr, 0, sizeof pr);
    pr.d.batch = B;
    pr.d.num_draft = K;
    pr.d.vocab = V;
    pr.d.logits = logits;
    pr.d.greedy = greedy;
    pr.d.temperature = logits ? 0.8f : 0.0f;
    pr.d.seed = seed * 2654435761u + 17;
    pr.d.offset = seed % 1000;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    pr.draft = test_xmalloc((size_t)B * K * sizeof(int));
    pr.q = test_xmalloc((size_t)B * K * V * sizeof(float));
    pr.p = test_xmalloc((size_t)B * (K + 1) * V * sizeof(float));
    float *other = test_xmalloc((size_t)V * sizeof(float));
    for (int b = 0; b < B; ++b) {
        for (int i = 0; i <= K; ++i) {
            float *prow = pr.p + ((size_t)b * (K + 1) + i) * V;
            float *qrow = i < K ? pr.q + ((size_t)b * K + i) * V : NULL;
            random_row(&rng, prow, V, logits, 2.0);
            if (!qrow)
                continue;
            random_row(&rng, other, V, logits, 2.0);
            double w = flashcl_ref_rng_uniform(&rng);
            double qs = 0.0;
            for (int y = 0; y < V; ++y) {
                if (logits) {
                    qrow[y] = isinf(other[y]) || isinf(prow[y]) ? prow[y] : (float)(w * prow[y] + (1 - w) * other[y]);
                } else {
                    qrow[y] = (float)(w * prow[y] + (1 - w) * other[y]);
                    qs += qrow[y];
                }
            }
            (void)qs;
            /* the draft token: from q (probabilities: inverse CDF in double; logits: a
             * visible token), occasionally uniform */
            int x = (int)(flashcl_ref_rng_next(&rng) % (uint64_t)V);
            if (!logits && flashcl_ref_rng_uniform(&rng) < 0.9) {
                double u = flashcl_ref_rng_uniform(&rng), acc = 0.0;
                for (int y = 0; y < V; ++y) {
                    acc += qrow[y];
                    if (acc > u) {
                        x = y;
                        break;
                    }
                }
            }
            pr.draft[(size_t)b * K + i] = x;
        }
    }
    free(other);
    return pr;
}

static void free_problem(problem *pr) {
    free(pr->draft);
    free(pr->q);
    free(pr->p);
}

/* Runs pr through ctx and host_ref; 1 when accepted and tokens are identical. */
static int same_as_ref(flashcl_context *ctx, const problem *pr, const char *what, int *n_accept_total) {
    const int B = pr->d.batch, K = pr->d.num_draft;
    int *acc = test_xmalloc((size_t)B * sizeof(int)), *tok = test_xmalloc((size_t)B * (K + 1) * sizeof(int));
    int *racc = test_xmalloc((size_t)B * sizeof(int)), *rtok = test_xmalloc((size_t)B * (K + 1) * sizeof(int));
    for (int i = 0; i < B; ++i)
        acc[i] = 0x7eadbeef;
    for (int i = 0; i < B * (K + 1); ++i)
        tok[i] = 0x7eadbeef;
    flashcl_ref_spec_verify(&pr->d, pr->draft, pr->q, pr->p, racc, rtok);
    flashcl_status st = flashcl_spec_verify_host(ctx, &pr->d, pr->draft, pr->q, pr->p, acc, tok);
    int ok = st == FLASHCL_SUCCESS;
    if (!ok)
        printf("  %s: status %d (%s)\n", what, st, flashcl_last_error(ctx));
    int shown = 0;
    for (int b = 0; ok && b < B; ++b) {
        if (racc[b] < 0) {
            printf("  %s: the reference flags sequence %d (%d)\n", what, b, racc[b]);
            ok = 0;
        }
        int same = acc[b] == racc[b] && !memcmp(tok + (size_t)b * (K + 1), rtok + (size_t)b * (K + 1),
                                                 (size_t)(K + 1) * sizeof(int));
        if (!same && shown++ < 3) {
            printf("  %s: sequence %d: accepted %d vs ref %d; tokens", what, b, acc[b], racc[b]);
            for (int j = 0; j <= K; ++j)
                printf(" %d/%d", tok[(size_t)b * (K + 1) + j], rtok[(size_t)b * (K + 1) + j]);
            printf("\n");
        }
        ok &= same;
        if (n_accept_total)
            *n_accept_total += racc[b];
    }
    free(acc);
    free(tok);
    free(racc);
    free(rtok);
    return ok;
}

static void test_identical(flashcl_context *dev, flashcl_context *host) {
    static const struct { int B, K, V, logits, greedy; } cases[] = {
        {64, 4, 1, 0, 0},    {200, 3, 17, 0, 0},  {50, 5, 113, 1, 0},  {40, 7, 1023, 0, 0},
        {30, 2, 1023, 1, 0}, {20, 4, 5000, 0, 1}, {20, 4, 4999, 1, 1}, {2, 2, 262144, 0, 0},
        {2, 2, 200003, 1, 0},
    };
    const uint64_t seed = test_seed();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        problem pr = make_problem(seed + 101 * c, cases[c].B, cases[c].K, cases[c].V, cases[c].logits,
                                  cases[c].greedy);
        char what[160];
        int accepted = 0;
        snprintf(what, sizeof what, "B=%d k=%d V=%d %s%s: device = host_ref", cases[c].B, cases[c].K, cases[c].V,
                 cases[c].logits ? "logits" : "probs", cases[c].greedy ? " greedy" : "");
        if (dev) {
            int ok = same_as_ref(dev, &pr, what, &accepted);
            printf("  (%d drafts accepted of %d)\n", accepted, cases[c].B * cases[c].K);
            expect(ok, what, &failures);
        }
        snprintf(what, sizeof what, "B=%d k=%d V=%d %s%s: host path = host_ref", cases[c].B, cases[c].K,
                 cases[c].V, cases[c].logits ? "logits" : "probs", cases[c].greedy ? " greedy" : "");
        expect(same_as_ref(host, &pr, what, NULL), what, &failures);
        free_problem(&pr);
    }
    if (!dev)
        return;
    /* The work-group size must not change a token (32: the largest every
     * supported device takes; rusticl's kernels stop there). */
    static const char *const wgs[] = {"1", "4", "32"};
    problem pr = make_problem(seed + 999, 60, 4, 1500, 0, 0);
    problem pl = make_problem(seed + 998, 30, 3, 777, 1, 0);
    for (int i = 0; i < 3; ++i) {
        setenv("FLASHCL_SPEC_WG", wgs[i], 1);
        char what[96];
        snprintf(what, sizeof what, "work-group size %s: probs and logits = host_ref", wgs[i]);
        expect(same_as_ref(dev, &pr, what, NULL) && same_as_ref(dev, &pl, what, NULL), what, &failures);
    }
    unsetenv("FLASHCL_SPEC_WG");
    free_problem(&pr);
    free_problem(&pl);
}

/* ---- losslessness --------------------------------------------------------------------------------- */

/* The test's fixed p and q: p and q differ a lot (alpha = 0.55), one token
 * q never proposes, one p never emits. */
#define LV 6
static const double P0[LV] = {0.30, 0.05, 0.20, 0.25, 0.20, 0.0};
static const double Q0[LV] = {0.10, 0.40, 0.05, 0.0, 0.25, 0.20};

/* Trials: each a sequence with k drafts sampled from q (position 0 from Q0,
 * later positions from Q0 too) and p rows P0 (position 0) and uniform after. */
static problem lossless_problem(uint64_t seed, int trials, int K) {
    problem pr;
    memset(&pr, 0, sizeof pr);
    pr.d.batch = trials;
    pr.d.num_draft = K;
    pr.d.vocab = LV;
    pr.d.seed = seed;
    pr.d.offset = 7;
    pr.draft = test_xmalloc((size_t)trials * K * sizeof(int));
    pr.q = test_xmalloc((size_t)trials * K * LV * sizeof(float));
    pr.p = test_xmalloc((size_t)trials * (K + 1) * LV * sizeof(float));
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed ^ 0xabcdefull);
    for (int b = 0; b < trials; ++b) {
        for (int i = 0; i <= K; ++i)
            for (int y = 0; y < LV; ++y) {
                pr.p[((size_t)b * (K + 1) + i) * LV + y] = i == 0 ? (float)P0[y] : 1.0f / LV;
                if (i < K)
                    pr.q[((size_t)b * K + i) * LV + y] = (float)Q0[y];
            }
        for (int i = 0; i < K; ++i) {
            double u = flashcl_ref_rng_uniform(&rng), acc = 0.0;
            int x = LV - 1;
            for (int y = 0; y < LV; ++y)
                if ((acc += Q0[y]) > u) {
                    x = y;
                    break;
                }
            pr.draft[(size_t)b * K + i] = x;
        }
    }
    return pr;
}

/* The deliberately wrong samplers: accept with min(1, p/q), then on rejection
 * draw from p itself (variant 0) or keep the draft anyway (variant 1). */
static int wrong_first_token(flashcl_ref_rng *rng, int x, int variant) {
    double u = flashcl_ref_rng_uniform(rng);
    if (Q0[x] > 0 && u * Q0[x] < P0[x])
        return x;
    if (variant == 1)
        return x;
    double v = flashcl_ref_rng_uniform(rng), acc = 0.0;
    for (int y = 0; y < LV; ++y)
        if ((acc += P0[y]) > v)
            return y;
    return LV - 1;
}

static double first_token_p_value(flashcl_context *ctx, uint64_t seed, int trials, int K) {
    problem pr = lossless_problem(seed, trials, K);
    int *acc = test_xmalloc((size_t)trials * sizeof(int)), *tok = test_xmalloc((size_t)trials * (K + 1) * sizeof(int));
    flashcl_status st = flashcl_spec_verify_host(ctx, &pr.d, pr.draft, pr.q, pr.p, acc, tok);
    double pv = -1.0;
    if (st == FLASHCL_SUCCESS) {
        long counts[LV] = {0};
        for (int b = 0; b < trials; ++b)
            counts[tok[(size_t)b * (K + 1)]]++;
        pv = chi_square_p(counts, P0, LV, trials);
    } else {
        printf("  status %d: %s\n", st, flashcl_last_error(ctx));
    }
    free(acc);
    free(tok);
    free_problem(&pr);
    return pv;
}

/* Under a correct sampler the p-value is uniform, so one draw at 1e-3 fails
 * one check in a thousand, and the suite runs six of them in each of several
 * configurations. A check therefore fails only when a second, independent
 * draw (a fresh seed) also falls below 1e-3: a false failure has probability
 * 1e-6, while a wrong sampler gives p-values far below 1e-3 on both draws
 * (the wrong samplers below reach p < 1e-3 on a single draw). */
static void expect_lossless(flashcl_context *ctx, const char *where, uint64_t seed, int trials, int K) {
    double pv = first_token_p_value(ctx, seed, trials, K), again = -1.0;
    if (pv <= 1e-3)
        again = first_token_p_value(ctx, seed ^ 0x5bd1e995ull, trials, K);
    char what[160];
    if (again < 0.0)
        snprintf(what, sizeof what, "lossless, %s, k=%d: chi-square p = %.4f > 1e-3", where, K, pv);
    else
        snprintf(what, sizeof what, "lossless, %s, k=%d: chi-square p = %.4f, on a second draw %.4f > 1e-3", where,
                 K, pv, again);
    expect(pv > 1e-3 || again > 1e-3, what, &failures);
}

static void test_lossless(flashcl_context *dev, flashcl_context *host) {
    const int N = 200000;
    const uint64_t seed = test_seed();
    for (int s = 0; s < 4; ++s)
        expect_lossless(host, "host path", seed + 31 * s, N, 1 + s % 3);
    if (dev)
        for (int s = 0; s < 2; ++s)
            expect_lossless(dev, "device (one launch of 200000)", seed + 77 * s + 5, N, 2 + s);
    for (int variant = 0; variant < 2; ++variant) {
        flashcl_ref_rng rng;
        flashcl_ref_rng_seed(&rng, seed + variant);
        long counts[LV] = {0};
        for (int t = 0; t < N; ++t) {
            double u = flashcl_ref_rng_uniform(&rng), a = 0.0;
            int x = LV - 1;
            for (int y = 0; y < LV; ++y)
                if ((a += Q0[y]) > u) {
                    x = y;
                    break;
                }
            counts[wrong_first_token(&rng, x, variant)]++;
        }
        double pv = chi_square_p(counts, P0, LV, N);
        char what[128];
        snprintf(what, sizeof what, "the test rejects a wrong sampler (%s): p = %.3g < 1e-3",
                 variant ? "no rejection" : "resample from p", pv);
        expect(pv < 1e-3, what, &failures);
    }
}

/* ---- acceptance rate -------------------------------------------------------------------------------- */

/* p = (a, 1 - a, 0...), q = one-hot on token 0: sum min(p, q) = a at every
 * position, so the tokens per verification follow a truncated geometric law. */
static void test_expected_tokens(flashcl_context *ctx, const char *name) {
    const int N = 100000, V = 3;
    static const struct { double a; int k; } cases[] = {{0.3, 4}, {0.7, 5}, {0.9, 3}, {1.0, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        const int K = cases[c].k;
        const float a = (float)cases[c].a;
        problem pr;
        memset(&pr, 0, sizeof pr);
        pr.d.batch = N;
        pr.d.num_draft = K;
        pr.d.vocab = V;
        pr.d.seed = test_seed() + c;
        pr.draft = test_xmalloc((size_t)N * K * sizeof(int));
        pr.q = test_xmalloc((size_t)N * K * V * sizeof(float));
        pr.p = test_xmalloc((size_t)N * (K + 1) * V * sizeof(float));
        for (size_t i = 0; i < (size_t)N * K; ++i) {
            pr.draft[i] = 0;
            pr.q[i * V] = 1.0f;
            pr.q[i * V + 1] = pr.q[i * V + 2] = 0.0f;
        }
        for (size_t i = 0; i < (size_t)N * (K + 1); ++i) {
            pr.p[i * V] = a;
            pr.p[i * V + 1] = 1.0f - a;
            pr.p[i * V + 2] = 0.0f;
        }
        int *acc = test_xmalloc((size_t)N * sizeof(int)), *tok = test_xmalloc((size_t)N * (K + 1) * sizeof(int));
        flashcl_status st = flashcl_spec_verify_host(ctx, &pr.d, pr.draft, pr.q, pr.p, acc, tok);
        double sum = 0.0, sum2 = 0.0;
        for (int b = 0; st == FLASHCL_SUCCESS && b < N; ++b) {
            double t = acc[b] + 1.0;
            sum += t;
            sum2 += t * t;
        }
        double mean = sum / N, var = sum2 / N - mean * mean, se = sqrt(var / N);
        double want = flashcl_spec_expected_tokens((double)a, K);
        char what[160];
        snprintf(what, sizeof what, "%s: alpha %.1f, k %d: mean tokens %.4f vs %.4f (+- 5 x %.4f)", name,
                 cases[c].a, K, mean, want, se);
        /* alpha = 1: every draft is accepted, the mean is exactly k + 1. */
        expect(st == FLASHCL_SUCCESS && fabs(mean - want) <= 5 * se + 1e-12, what, &failures);
        free(acc);
        free(tok);
        free_problem(&pr);
    }
}

/* ---- bad input ------------------------------------------------------------------------------------- */

static void test_bad_input(flashcl_context *ctx, const char *name) {
    const int B = 3, K = 2, V = 4;
    problem pr = make_problem(test_seed() + 5, B, K, V, 0, 0);
    int acc[3], tok[9];
    struct {
        const char *what;
        int which; /* 0 q, 1 p, 2 draft, 3 desc */
        size_t at;
        float value;
        flashcl_status want;
    } bad[] = {
        {"negative probability", 1, 5, -0.25f, FLASHCL_ERROR_INVALID_PROBS},
        {"NaN probability", 0, 13, NAN, FLASHCL_ERROR_INVALID_PROBS},
        {"infinite probability", 1, 30, INFINITY, FLASHCL_ERROR_INVALID_PROBS},
        {"row sum 1.01", 1, 33, 0.01f, FLASHCL_ERROR_INVALID_PROBS},
        {"draft token = vocab", 2, 4, (float)V, FLASHCL_ERROR_INVALID_PROBS},
        {"draft token -1", 2, 0, -1.0f, FLASHCL_ERROR_INVALID_PROBS},
        {"vocab 0", 3, 0, 0, FLASHCL_ERROR_INVALID_SHAPE},
        {"num_draft 65", 3, 1, 0, FLASHCL_ERROR_INVALID_SHAPE},
        {"tolerance 0.9", 3, 2, 0, FLASHCL_ERROR_INVALID_ARGUMENT},
        {"logits with temperature 0", 3, 3, 0, FLASHCL_ERROR_INVALID_ARGUMENT},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; ++c) {
        problem t = make_problem(test_seed() + 5, B, K, V, 0, 0);
        if (bad[c].which == 0)
            t.q[bad[c].at] = bad[c].value;
        else if (bad[c].which == 1)
            t.p[bad[c].at] += bad[c].value;
        else if (bad[c].which == 2)
            t.draft[bad[c].at] = (int)bad[c].value;
        else if (bad[c].at == 0)
            t.d.vocab = 0;
        else if (bad[c].at == 1)
            t.d.num_draft = 65;
        else if (bad[c].at == 2)
            t.d.tolerance = 0.9f;
        else {
            t.d.logits = 1;
            t.d.temperature = 0.0f;
        }
        if (bad[c].which == 1 && bad[c].value == -0.25f)
            t.p[bad[c].at] = -0.25f;
        for (int i = 0; i < 3; ++i)
            acc[i] = 1234;
        for (int i = 0; i < 9; ++i)
            tok[i] = 5678;
        flashcl_status st = flashcl_spec_verify_host(ctx, &t.d, t.draft, t.q, t.p, acc, tok);
        int untouched = 1;
        for (int i = 0; i < 3; ++i)
            untouched &= acc[i] == 1234;
        for (int i = 0; i < 9; ++i)
            untouched &= tok[i] == 5678;
        char what[160];
        snprintf(what, sizeof what, "%s: %s -> %s, outputs untouched", name, bad[c].what,
                 flashcl_status_string(bad[c].want));
        expect(st == bad[c].want && untouched, what, &failures);
        if (st != bad[c].want)
            printf("  got %d: %s\n", st, flashcl_last_error(ctx));
        free_problem(&t);
    }
    /* Logits: NaN, +inf, and a row that is all -inf. */
    for (int c = 0; c < 3; ++c) {
        problem t = make_problem(test_seed() + 6, B, K, V, 1, 0);
        size_t row = 2 * V; /* p row 2 of sequence 0 */
        if (c == 0)
            t.p[row + 1] = NAN;
        else if (c == 1)
            t.q[3] = INFINITY;
        else
            for (int y = 0; y < V; ++y)
                t.p[row + y] = -INFINITY;
        acc[0] = 1234;
        flashcl_status st = flashcl_spec_verify_host(ctx, &t.d, t.draft, t.q, t.p, acc, tok);
        char what[128];
        snprintf(what, sizeof what, "%s: logits %s -> invalid probabilities", name,
                 c == 0 ? "NaN" : c == 1 ? "+inf" : "row all -inf");
        expect(st == FLASHCL_ERROR_INVALID_PROBS && acc[0] == 1234, what, &failures);
        free_problem(&t);
    }
    /* A row summing to 1 + 5e-4 passes the default tolerance, not 1e-4. */
    pr.p[0] += 5e-4f;
    flashcl_status st1 = flashcl_spec_verify_host(ctx, &pr.d, pr.draft, pr.q, pr.p, acc, tok);
    pr.d.tolerance = 1e-4f;
    flashcl_status st2 = flashcl_spec_verify_host(ctx, &pr.d, pr.draft, pr.q, pr.p, acc, tok);
    expect(st1 == FLASHCL_SUCCESS && st2 == FLASHCL_ERROR_INVALID_PROBS,
           "row sum 1 + 5e-4: accepted by tolerance 1e-3, refused by 1e-4", &failures);
    free_problem(&pr);
    expect(flashcl_spec_verify_host(ctx, NULL, NULL, NULL, NULL, NULL, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "NULL desc", &failures);
}

/* The cl_mem form writes the BAD code into accepted. */
static void test_device_codes(flashcl_context *ctx) {
    problem t = make_problem(test_seed() + 8, 3, 2, 5, 0, 0);
    t.p[(size_t)1 * 3 * 5 + 2] = -0.5f; /* sequence 1: negative */
    cl_context c = flashcl_context_cl_context(ctx);
    cl_int err;
    cl_mem bd = clCreateBuffer(c, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, 6 * 4, t.draft, &err);
    cl_mem bq = clCreateBuffer(c, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, 30 * 4, t.q, &err);
    cl_mem bp = clCreateBuffer(c, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, 45 * 4, t.p, &err);
    cl_mem ba = clCreateBuffer(c, CL_MEM_READ_WRITE, 3 * 4, NULL, &err);
    cl_mem bt = clCreateBuffer(c, CL_MEM_READ_WRITE, 9 * 4, NULL, &err);
    cl_mem small = clCreateBuffer(c, CL_MEM_READ_WRITE, 8, NULL, &err);
    flashcl_status st = flashcl_spec_verify(ctx, &t.d, bd, bq, bp, ba, bt, NULL);
    int acc[3] = {0}, tok[9] = {0};
    clEnqueueReadBuffer(flashcl_context_cl_queue(ctx), ba, CL_TRUE, 0, sizeof acc, acc, 0, NULL, NULL);
    clEnqueueReadBuffer(flashcl_context_cl_queue(ctx), bt, CL_TRUE, 0, sizeof tok, tok, 0, NULL, NULL);
    expect(st == FLASHCL_SUCCESS && acc[0] >= 0 && acc[1] == FLASHCL_SPEC_BAD_NEGATIVE && acc[2] >= 0 &&
               tok[3] == -1 && tok[5] == -1,
           "cl_mem form: a bad sequence gets FLASHCL_SPEC_BAD_NEGATIVE and tokens -1, the others run", &failures);
    expect(flashcl_spec_verify(ctx, &t.d, bd, bq, bp, small, bt, NULL) == FLASHCL_ERROR_OUT_OF_BOUNDS,
           "cl_mem form: a short accepted buffer -> out of bounds", &failures);
    setenv("FLASHCL_SPEC_WG", "3", 1);
    expect(flashcl_spec_verify(ctx, &t.d, bd, bq, bp, ba, bt, NULL) == FLASHCL_ERROR_INVALID_PARAMS,
           "FLASHCL_SPEC_WG=3 (not a power of two) is refused", &failures);
    unsetenv("FLASHCL_SPEC_WG");
    clReleaseMemObject(bd);
    clReleaseMemObject(bq);
    clReleaseMemObject(bp);
    clReleaseMemObject(ba);
    clReleaseMemObject(bt);
    clReleaseMemObject(small);
    free_problem(&t);
}

/* Tiny problems for Oclgrind (ctest -L oclgrind): sampled and greedy
 * verification, probabilities and logits, against the host path. */
static int oclgrind(flashcl_context *dev) {
    static const int modes[3][2] = {{0, 0}, {1, 0}, {1, 1}}; /* logits, greedy */
    for (int i = 0; i < 3; ++i) {
        problem pr = make_problem(test_seed() + (uint64_t)i, 2, 3, 37, modes[i][0], modes[i][1]);
        char what[96];
        snprintf(what, sizeof what, "oclgrind: B2 K3 V37 %s%s equals the reference", modes[i][0] ? "logits" : "probs",
                 modes[i][1] ? " greedy" : "");
        expect(same_as_ref(dev, &pr, what, NULL), what, &failures);
        free_problem(&pr);
    }
    return failures ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "oclgrind")) {
        flashcl_context *dev = test_context();
        int rc = oclgrind(dev);
        flashcl_context_destroy(dev);
        return rc;
    }
    flashcl_context *host = NULL;
    if (flashcl_context_create(&host, "host") != FLASHCL_SUCCESS) {
        fprintf(stderr, "no host context\n");
        return 1;
    }
    flashcl_context *dev = test_context();
    if (flashcl_context_is_host(dev)) {
        printf("no OpenCL device: host path only\n");
        flashcl_context_destroy(dev);
        dev = NULL;
    } else {
        printf("device: %s\n", flashcl_context_device_name(dev));
    }
    test_chi_square_cdf();
    test_primitives();
    test_identical(dev, host);
    test_lossless(dev, host);
    test_expected_tokens(host, "host path");
    if (dev)
        test_expected_tokens(dev, "device");
    test_bad_input(host, "host path");
    if (dev) {
        test_bad_input(dev, "device");
        test_device_codes(dev);
    }
    flashcl_context_destroy(dev);
    flashcl_context_destroy(host);
    return test_summary(failures);
}
