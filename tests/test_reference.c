/* test_reference.c: checks the pure-C reference (host_ref/) against cases
 * whose answers are known without it: conversions, masks, special inputs
 * whose attention can be written down by hand, and the checker itself.
 *
 * Every other test trusts flashcl_ref, so this one must not: each expected
 * value below is computed independently (by hand, from definitions, or from a
 * rearranged problem that must give the same answer). No OpenCL is used.
 * Returns 0 when everything passes; prints each failure otherwise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcl_ref.h"
#include "harness.h"

static int failures = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static size_t elem_size(flashcl_dtype dt) {
    return dt == FLASHCL_FLOAT32 ? 4 : 2;
}

static void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static const char *dtype_name(flashcl_dtype dt) {
    return dt == FLASHCL_FLOAT32 ? "float32" : dt == FLASHCL_FLOAT16 ? "float16" : "bfloat16";
}

/* ---- conversions ----------------------------------------------------------- */

static int half_is_nan(uint16_t h) {
    return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu);
}
static int bf16_is_nan(uint16_t b) {
    return (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu);
}

static void test_half(void) {
    // hand-picked values, ties included
    struct {
        float f;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3C00},
        {-2.0f, 0xC000},
        {1.0f + 0x1p-11f, 0x3C00},            // tie between 1 and 1+2^-10: even is 1
        {1.0f + 3 * 0x1p-11f, 0x3C02},        // tie between 1+2^-10 and 1+2^-9: even is up
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01}, // just above the tie: up
        {65504.0f, 0x7BFF},                   // largest half
        {65519.0f, 0x7BFF},
        {65520.0f, 0x7C00}, // tie with 2^16: rounds to even = infinity
        {1e6f, 0x7C00},
        {-1e6f, 0xFC00},
        {INFINITY, 0x7C00},
        {-INFINITY, 0xFC00},
        {0x1p-14f, 0x0400},        // smallest normal
        {0x1p-24f, 0x0001},        // smallest subnormal
        {0x1p-25f, 0x0000},        // half of it: tie to even 0
        {0x1.000002p-25f, 0x0001}, // just above: up
        {0x1.8p-24f, 0x0002},      // 1.5 ulp: tie to even 2
        {0x1.ff8p-15f, 0x03FF},    // largest subnormal
        {0x1.ffcp-15f, 0x0400},    // tie above it: even is the smallest normal
        {0x1p-30f, 0x0000},
        {bits_to_float(1), 0x0000}, // float subnormal
        {0.333333343f, 0x3555},
    };
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        uint16_t got = flashcl_ref_float_to_half(cases[n].f);
        CHECK(got == cases[n].h, "float_to_half(%a) = 0x%04X, want 0x%04X", cases[n].f, got,
              cases[n].h);
    }
    CHECK(flashcl_ref_half_to_float(0x0001) == 0x1p-24f, "half 0x0001");
    CHECK(flashcl_ref_half_to_float(0x03FF) == 0x3FFp-24f, "half 0x03FF");
    CHECK(flashcl_ref_half_to_float(0x7BFF) == 65504.0f, "half 0x7BFF");
    CHECK(flashcl_ref_half_to_float(0xFC00) == -INFINITY, "half 0xFC00");
    CHECK(isnan(flashcl_ref_half_to_float(0x7E00)), "half 0x7E00 is NaN");
    CHECK(isnan(flashcl_ref_half_to_float(0x7C01)), "half 0x7C01 is NaN");

    // NaN stays NaN, payload in the low bits included (a naive shift would
    // drop it and produce infinity)
    CHECK(half_is_nan(flashcl_ref_float_to_half(NAN)), "NaN");
    CHECK(half_is_nan(flashcl_ref_float_to_half(bits_to_float(0x7F800001u))), "low-payload NaN");
    CHECK(half_is_nan(flashcl_ref_float_to_half(bits_to_float(0xFFC00000u))), "negative NaN");

    // every half survives a round trip; NaNs stay NaN
    for (uint32_t h = 0; h <= 0xFFFF; h++) {
        float f = flashcl_ref_half_to_float((uint16_t)h);
        uint16_t back = flashcl_ref_float_to_half(f);
        if (half_is_nan((uint16_t)h)) {
            CHECK(isnan(f) && half_is_nan(back), "NaN half 0x%04X", h);
        } else {
            CHECK(back == h, "round trip of half 0x%04X gives 0x%04X", h, back);
        }
    }

    // every midpoint between neighbouring positive halves (exact in float:
    // 12 significant bits) goes to the even one, and its float neighbours go
    // to the nearer one. Both signs.
    for (uint32_t h = 0; h < 0x7C00; h++) {
        float a = flashcl_ref_half_to_float((uint16_t)h);
        float b = h == 0x7BFF ? 65536.0f : flashcl_ref_half_to_float((uint16_t)(h + 1));
        float mid = (a + b) / 2;
        CHECK((double)mid == ((double)a + (double)b) / 2, "midpoint exact");
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        uint16_t got = flashcl_ref_float_to_half(mid);
        CHECK(got == even, "tie %a -> 0x%04X, want 0x%04X", mid, got, even);
        got = flashcl_ref_float_to_half(-mid);
        CHECK(got == (even | 0x8000u), "tie %a -> 0x%04X", -mid, got);
        got = flashcl_ref_float_to_half(nextafterf(mid, 0.0f));
        CHECK(got == h, "below tie %a -> 0x%04X, want 0x%04X", mid, got, h);
        got = flashcl_ref_float_to_half(nextafterf(mid, INFINITY));
        CHECK(got == h + 1, "above tie %a -> 0x%04X, want 0x%04X", mid, got, h + 1);
    }
}

static void test_bf16(void) {
    struct {
        float f;
        uint16_t b;
    } cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3F80},
        {1.0f + 0x1p-8f, 0x3F80},     // tie: even is 1
        {1.0f + 3 * 0x1p-8f, 0x3F82}, // tie: even is up
        {1.0f + 0x1p-8f + 0x1p-23f, 0x3F81},
        {-3.0f, 0xC040},
        {bits_to_float(0x7F7FFFFFu), 0x7F80}, // FLT_MAX rounds to infinity
        {bits_to_float(0x7F7F7FFFu), 0x7F7F},
        {INFINITY, 0x7F80},
        {-INFINITY, 0xFF80},
        {bits_to_float(0x00008000u), 0x0000}, // float subnormal tie: even 0
        {bits_to_float(0x00018000u), 0x0002}, // tie: even up
    };
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        uint16_t got = flashcl_ref_float_to_bf16(cases[n].f);
        CHECK(got == cases[n].b, "float_to_bf16(%a) = 0x%04X, want 0x%04X", cases[n].f, got,
              cases[n].b);
    }
    CHECK(flashcl_ref_float_to_bf16(NAN) == 0x7FC0, "NaN -> 0x%04X",
          flashcl_ref_float_to_bf16(NAN));
    CHECK(bf16_is_nan(flashcl_ref_float_to_bf16(bits_to_float(0x7FFFFFFFu))), "NaN near carry");
    CHECK(bf16_is_nan(flashcl_ref_float_to_bf16(bits_to_float(0x7F800001u))), "low-payload NaN");
    CHECK(flashcl_ref_float_to_bf16(bits_to_float(0xFF800001u)) == 0xFFC0, "negative NaN");
    for (uint32_t b = 0; b <= 0xFFFF; b++) {
        float f = flashcl_ref_bf16_to_float((uint16_t)b);
        uint16_t back = flashcl_ref_float_to_bf16(f);
        if (bf16_is_nan((uint16_t)b)) {
            CHECK(isnan(f) && bf16_is_nan(back), "NaN bf16 0x%04X", b);
        } else {
            CHECK(back == b, "round trip of bf16 0x%04X gives 0x%04X", b, back);
        }
    }
    // ties between every pair of neighbouring positive finite bf16 values
    for (uint32_t b = 0; b < 0x7F7F; b++) {
        float lo = flashcl_ref_bf16_to_float((uint16_t)b);
        float mid = bits_to_float(((uint32_t)b << 16) | 0x8000u); // exact midpoint
        uint16_t even = (b & 1) ? (uint16_t)(b + 1) : (uint16_t)b;
        CHECK(flashcl_ref_float_to_bf16(mid) == even, "tie above %a", lo);
        CHECK(flashcl_ref_float_to_bf16(nextafterf(mid, 0.0f)) == b, "below tie above %a", lo);
        CHECK(flashcl_ref_float_to_bf16(nextafterf(mid, INFINITY)) == b + 1, "above tie %a", lo);
    }
}

static void test_load_store(void) {
    // store rounds through float, load widens exactly
    uint16_t h[2];
    float f[2];
    flashcl_ref_store(h, FLASHCL_FLOAT16, 1, 1.0 + 3 * 0x1p-11);
    CHECK(h[1] == 0x3C02, "store half");
    CHECK(flashcl_ref_load(h, FLASHCL_FLOAT16, 1) == 1.0 + 0x1p-9, "load half");
    flashcl_ref_store(h, FLASHCL_BFLOAT16, 0, -1.0 - 3 * 0x1p-8);
    CHECK(h[0] == 0xBF82, "store bf16 0x%04X", h[0]);
    CHECK(flashcl_ref_load(h, FLASHCL_BFLOAT16, 0) == -1.0 - 0x1p-6, "load bf16");
    flashcl_ref_store(f, FLASHCL_FLOAT32, 1, 0.1);
    CHECK(f[1] == 0.1f, "store float");
    CHECK(flashcl_ref_load(f, FLASHCL_FLOAT32, 1) == (double)0.1f, "load float");
}

/* ---- random numbers -------------------------------------------------------- */

static void test_rng(void) {
    flashcl_ref_rng a, b;
    flashcl_ref_rng_seed(&a, 42);
    flashcl_ref_rng_seed(&b, 42);
    for (int n = 0; n < 100; n++)
        CHECK(flashcl_ref_rng_next(&a) == flashcl_ref_rng_next(&b), "seeded");
    // splitmix64's published first output for seed 0
    flashcl_ref_rng_seed(&a, 0);
    uint64_t first = flashcl_ref_rng_next(&a);
    CHECK(first == 0xE220A8397B1DCDAFull, "splitmix64(0) = %llx", (unsigned long long)first);

    const int count = 200000;
    double sum = 0, sum2 = 0, umin = 1, umax = 0;
    flashcl_ref_rng_seed(&a, 7);
    for (int n = 0; n < count; n++) {
        double u = flashcl_ref_rng_uniform(&a);
        if (u < umin)
            umin = u;
        if (u > umax)
            umax = u;
        double z = flashcl_ref_rng_normal(&a);
        CHECK(isfinite(z), "normal finite");
        sum += z;
        sum2 += z * z;
    }
    CHECK(umin >= 0.0 && umax < 1.0 && umin < 1e-3 && umax > 1 - 1e-3, "uniform range");
    double mean = sum / count, var = sum2 / count - mean * mean;
    CHECK(fabs(mean) < 0.01 && fabs(var - 1) < 0.02, "normal mean %g var %g", mean, var);

    // fill_normal stores values of the dtype (a round trip leaves them alone)
    uint16_t hv[64];
    flashcl_ref_fill_normal(&a, hv, FLASHCL_FLOAT16, 64, 3.0);
    int nonzero = 0;
    for (int n = 0; n < 64; n++) {
        CHECK(flashcl_ref_float_to_half(flashcl_ref_half_to_float(hv[n])) == hv[n], "half fill");
        nonzero += hv[n] != 0;
    }
    CHECK(nonzero > 60, "fill_normal wrote values");

    float fp[3];
    uint16_t hp[3], bp[3];
    flashcl_ref_poison(fp, FLASHCL_FLOAT32, 3);
    flashcl_ref_poison(hp, FLASHCL_FLOAT16, 3);
    flashcl_ref_poison(bp, FLASHCL_BFLOAT16, 3);
    for (int n = 0; n < 3; n++) {
        CHECK(isnan(fp[n]) && hp[n] == 0x7E00 && bp[n] == 0x7FC0, "poison %d", n);
        CHECK(isnan(flashcl_ref_load(hp, FLASHCL_FLOAT16, (size_t)n)), "poisoned half loads NaN");
        CHECK(isnan(flashcl_ref_load(bp, FLASHCL_BFLOAT16, (size_t)n)), "poisoned bf16 loads NaN");
    }
}

/* ---- problems -------------------------------------------------------------- */

/* A zeroed desc with packed strides written out (as resolve would). */
static flashcl_attention_desc make_desc(flashcl_dtype dt, int B, int Hq, int Hk, int Nq, int Nk,
                                        int D) {
    flashcl_attention_desc d = test_attention_desc(dt, B, Hq, Hk, Nq, Nk, D);
    d.scale = (float)(1.0 / sqrt((double)D));
    d.window_left = -1;
    d.window_right = -1;
    flashcl_layout ql = {0, (size_t)Nq * Hq * D, (size_t)Hq * D, (size_t)D};
    flashcl_layout kl = {0, (size_t)Nk * Hk * D, (size_t)Hk * D, (size_t)D};
    d.q = ql;
    d.out = ql;
    d.k = kl;
    d.v = kl;
    return d;
}

static size_t qcount(const flashcl_attention_desc *d) {
    return (size_t)d->batch * d->seqlen_q * d->heads_q * d->head_dim;
}
static size_t kcount(const flashcl_attention_desc *d) {
    return (size_t)d->batch * d->seqlen_k * d->heads_k * d->head_dim;
}
static size_t qrows(const flashcl_attention_desc *d) {
    return (size_t)d->batch * d->heads_q * d->seqlen_q;
}

/* Packed index helpers: (b, n, h, x) of a [B][N][H][D] array, (b, h, i) of lse. */
static size_t at4(int N, int H, int D, int b, int n, int h, int x) {
    return (((size_t)b * N + n) * H + h) * D + x;
}
static size_t at_lse(const flashcl_attention_desc *d, int b, int h, int i) {
    return ((size_t)b * d->heads_q + h) * d->seqlen_q + i;
}

/* dot(q(b,i,h), k(b,j,kh)) in double from packed stored arrays. */
static double dot_qk(const flashcl_attention_desc *d, const void *q, const void *k, int b, int i,
                     int h, int j, int kh) {
    double s = 0;
    for (int x = 0; x < d->head_dim; x++)
        s += flashcl_ref_load(q, d->dtype, at4(d->seqlen_q, d->heads_q, d->head_dim, b, i, h, x)) *
             flashcl_ref_load(k, d->dtype, at4(d->seqlen_k, d->heads_k, d->head_dim, b, j, kh, x));
    return s;
}

/* ---- masks ------------------------------------------------------------------ */

static void expect_keys(int Nq, int Nk, int causal, int left, int right, int i, int want_lo,
                        int want_hi) {
    flashcl_attention_desc d = make_desc(FLASHCL_FLOAT32, 1, 1, 1, Nq, Nk, 8);
    d.causal = causal;
    d.window_left = left;
    d.windowed = 1;
    d.window_right = right;
    int lo = 12345, hi = -12345;
    int any = flashcl_ref_visible_keys(&d, i, &lo, &hi);
    if (want_lo > want_hi) {
        CHECK(!any && lo > hi, "Nq %d Nk %d causal %d win (%d,%d) row %d: [%d,%d] should be empty",
              Nq, Nk, causal, left, right, i, lo, hi);
    } else {
        CHECK(any && lo == want_lo && hi == want_hi,
              "Nq %d Nk %d causal %d win (%d,%d) row %d: [%d,%d], want [%d,%d]", Nq, Nk, causal,
              left, right, i, lo, hi, want_lo, want_hi);
    }
}

static void test_visible_keys(void) {
    // square causal: the classic lower triangle
    for (int i = 0; i < 4; i++)
        expect_keys(4, 4, 1, -1, -1, i, 0, i);
    // Nq < Nk, causal, bottom-right: the last query row sees every key
    expect_keys(2, 5, 1, -1, -1, 0, 0, 3);
    expect_keys(2, 5, 1, -1, -1, 1, 0, 4);
    // Nq > Nk, causal: the first Nq - Nk rows see nothing
    for (int i = 0; i < 3; i++)
        expect_keys(5, 2, 1, -1, -1, i, 1, 0);
    expect_keys(5, 2, 1, -1, -1, 3, 0, 0);
    expect_keys(5, 2, 1, -1, -1, 4, 0, 1);
    // causal wins over a positive window_right, even on an unresolved desc
    expect_keys(4, 4, 1, -1, 3, 1, 0, 1);
    // sliding window (1, 1), square
    expect_keys(6, 6, 0, 1, 1, 0, 0, 1);
    expect_keys(6, 6, 0, 1, 1, 3, 2, 4);
    expect_keys(6, 6, 0, 1, 1, 5, 4, 5);
    // window (0, 0): only the diagonal key, shifted
    expect_keys(3, 5, 0, 0, 0, 0, 2, 2);
    expect_keys(5, 3, 0, 0, 0, 1, 1, 0); // diagonal -1: empty
    expect_keys(5, 3, 0, 0, 0, 2, 0, 0);
    // left window with causal, Nq > Nk
    expect_keys(6, 4, 1, 2, -1, 5, 1, 3);
    expect_keys(6, 4, 1, 2, -1, 2, 0, 0);
    expect_keys(6, 4, 1, 2, -1, 1, 1, 0);
    // only a right window: rows left of the keys see everything up to diag + right
    expect_keys(8, 3, 0, -1, 1, 4, 0, 0);
    expect_keys(8, 3, 0, -1, 1, 3, 1, 0);
    // only a left window: a row right of all keys sees nothing
    expect_keys(2, 6, 0, 1, -1, 0, 3, 5);
    expect_keys(3, 10, 0, 0, -1, 2, 9, 9);
    // no mask at all
    expect_keys(3, 7, 0, -1, -1, 1, 0, 6);
    // huge windows and lengths: i + shift + window leaves int range
    expect_keys(1, 2000000000, 0, 2147483647, 2147483647, 0, 0, 1999999999);
    expect_keys(2000000000, 1, 0, 2147483647, 2147483647, 0, 0, 0);
    expect_keys(2000000000, 1, 1, 5, 2147483647, 0, 1, 0);

    // brute force against the definition on random small shapes
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, 99);
    for (int t = 0; t < 3000; t++) {
        int Nq = 1 + (int)(flashcl_ref_rng_next(&rng) % 9);
        int Nk = 1 + (int)(flashcl_ref_rng_next(&rng) % 9);
        int causal = (int)(flashcl_ref_rng_next(&rng) % 2);
        int left = (int)(flashcl_ref_rng_next(&rng) % 8) - 2;
        int right = (int)(flashcl_ref_rng_next(&rng) % 8) - 2;
        flashcl_attention_desc d = make_desc(FLASHCL_FLOAT32, 1, 1, 1, Nq, Nk, 8);
        d.causal = causal;
        d.window_left = left;
        d.windowed = 1;
        d.window_right = right;
        int r = causal ? 0 : right;
        for (int i = 0; i < Nq; i++) {
            int lo, hi, first = -1, last = -2, count = 0;
            int any = flashcl_ref_visible_keys(&d, i, &lo, &hi);
            for (int j = 0; j < Nk; j++) {
                int diag = i + Nk - Nq;
                int seen = (left < 0 || j >= diag - left) && (r < 0 || j <= diag + r);
                if (seen && first < 0)
                    first = j;
                if (seen)
                    last = j;
                count += seen;
            }
            CHECK(count == 0 || count == last - first + 1, "visible set is an interval");
            if (first < 0) {
                CHECK(!any && lo > hi, "brute empty Nq %d Nk %d c %d (%d,%d) i %d", Nq, Nk, causal,
                      left, right, i);
            } else {
                CHECK(any && lo == first && hi == last,
                      "brute Nq %d Nk %d c %d (%d,%d) i %d: [%d,%d] want [%d,%d]", Nq, Nk, causal,
                      left, right, i, lo, hi, first, last);
            }
        }
    }
}

/* ---- forward: cases with known answers -------------------------------------- */

/* Runs both forwards; out/plain are packed doubles, lse may be NULL. */
static void run_both(const flashcl_attention_desc *d, const void *q, const void *k, const void *v,
                     double *out, double *lse, double *scores, double *probs, double *plain) {
    flashcl_ref_attention_forward(d, q, k, v, out, lse, scores, probs);
    if (plain)
        flashcl_ref_attention_forward_plain(d, q, k, v, plain);
}

/* Identical keys: every visible score is equal, so attention is uniform and
 * out_i = mean of the visible V rows; lse_i = s_i + log(count). */
static void test_uniform(flashcl_dtype dt) {
    const int B = 2, H = 2, Nq = 3, Nk = 7, D = 8;
    flashcl_attention_desc d = make_desc(dt, B, H, H, Nq, Nk, D);
    d.causal = 1; // shift 4: rows see 5, 6, 7 keys
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, 1);
    void *q = xcalloc(qcount(&d), elem_size(dt)), *k = xcalloc(kcount(&d), elem_size(dt)),
         *v = xcalloc(kcount(&d), elem_size(dt));
    flashcl_ref_fill_normal(&rng, q, dt, qcount(&d), 1.0);
    flashcl_ref_fill_normal(&rng, v, dt, kcount(&d), 1.0);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int x = 0; x < D; x++) {
                double val = flashcl_ref_rng_normal(&rng);
                for (int j = 0; j < Nk; j++)
                    flashcl_ref_store(k, dt, at4(Nk, H, D, b, j, h, x), val);
            }
    double *out = xcalloc(qcount(&d), sizeof(double)), *plain = xcalloc(qcount(&d), sizeof(double));
    double *lse = xcalloc(qrows(&d), sizeof(double));
    run_both(&d, q, k, v, out, lse, NULL, NULL, plain);
    double plain_tol = dt == FLASHCL_FLOAT32 ? 1e-6 : dt == FLASHCL_FLOAT16 ? 4e-3 : 3e-2;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < Nq; i++) {
                int count = i + 5;
                double s = d.scale * dot_qk(&d, q, k, b, i, h, 0, h);
                double want_lse = s + log((double)count);
                double got_lse = lse[at_lse(&d, b, h, i)];
                CHECK(fabs(got_lse - want_lse) < 1e-12 * (1 + fabs(want_lse)),
                      "%s uniform lse (%d,%d,%d): %.17g want %.17g", dtype_name(dt), b, h, i,
                      got_lse, want_lse);
                for (int x = 0; x < D; x++) {
                    double mean = 0;
                    for (int j = 0; j < count; j++)
                        mean += flashcl_ref_load(v, dt, at4(Nk, H, D, b, j, h, x));
                    mean /= count;
                    size_t n = at4(Nq, H, D, b, i, h, x);
                    CHECK(fabs(out[n] - mean) < 1e-12,
                          "%s uniform out (%d,%d,%d,%d): %.17g want %.17g", dtype_name(dt), b, i, h,
                          x, out[n], mean);
                    CHECK(fabs(plain[n] - mean) < plain_tol, "%s uniform plain %.9g want %.9g",
                          dtype_name(dt), plain[n], mean);
                }
            }
    free(q), free(k), free(v), free(out), free(plain), free(lse);
}

/* Window (0, 0): each row sees exactly its diagonal key, so out_i = v_(i+shift)
 * exactly and lse_i = s_(i, i+shift). Nq < Nk, so the diagonal is shifted. */
static void test_single_key(flashcl_dtype dt) {
    const int Nq = 3, Nk = 5, D = 16, H = 2;
    flashcl_attention_desc d = make_desc(dt, 1, H, H, Nq, Nk, D);
    d.window_left = 0;
    d.windowed = 1;
    d.window_right = 0;
    d.softcap = 2.0f; // the single probability is 1 whatever the score
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, 2);
    void *q = xcalloc(qcount(&d), elem_size(dt)), *k = xcalloc(kcount(&d), elem_size(dt)),
         *v = xcalloc(kcount(&d), elem_size(dt));
    flashcl_ref_fill_normal(&rng, q, dt, qcount(&d), 1.0);
    flashcl_ref_fill_normal(&rng, k, dt, kcount(&d), 1.0);
    flashcl_ref_fill_normal(&rng, v, dt, kcount(&d), 1.0);
    double *out = xcalloc(qcount(&d), sizeof(double)), *plain = xcalloc(qcount(&d), sizeof(double));
    double *lse = xcalloc(qrows(&d), sizeof(double));
    run_both(&d, q, k, v, out, lse, NULL, NULL, plain);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < Nq; i++) {
            int j = i + 2;
            double s = d.scale * dot_qk(&d, q, k, 0, i, h, j, h);
            s = 2.0 * tanh(s / 2.0);
            CHECK(fabs(lse[at_lse(&d, 0, h, i)] - s) < 1e-12, "single-key lse");
            for (int x = 0; x < D; x++) {
                double want = flashcl_ref_load(v, dt, at4(Nk, H, D, 0, j, h, x));
                size_t n = at4(Nq, H, D, 0, i, h, x);
                CHECK(out[n] == want, "%s single-key out %.17g want %.17g", dtype_name(dt), out[n],
                      want);
                // p = 1 exactly in float too, so the plain output is exact
                CHECK(plain[n] == want, "%s single-key plain %.17g want %.17g", dtype_name(dt),
                      plain[n], want);
            }
        }
    free(q), free(k), free(v), free(out), free(plain), free(lse);
}

/* D = 1, two keys, numbers chosen by hand: s = (0, x), p = (1, e^x) / (1 + e^x). */
static void test_by_hand(void) {
    flashcl_attention_desc d = make_desc(FLASHCL_FLOAT32, 1, 1, 1, 1, 2, 1);
    d.scale = 0.5f;
    float q[1] = {2.0f}, k[2] = {0.0f, 0.75f}, v[2] = {1.0f, 5.0f};
    double out[1], lse[1], scores[2], probs[2];
    flashcl_ref_attention_forward(&d, q, k, v, out, lse, scores, probs);
    double x = 0.75; // 0.5 * 2 * 0.75
    double p1 = exp(x) / (1 + exp(x));
    CHECK(scores[0] == 0.0 && scores[1] == x, "by hand scores %g %g", scores[0], scores[1]);
    CHECK(fabs(probs[1] - p1) < 1e-15 && fabs(probs[0] + probs[1] - 1) < 1e-15, "by hand probs");
    CHECK(fabs(out[0] - ((1 - p1) * 1 + p1 * 5)) < 1e-14, "by hand out %.17g", out[0]);
    CHECK(fabs(lse[0] - log(1 + exp(x))) < 1e-15, "by hand lse %.17g", lse[0]);
    // scale 0 falls back to 1/sqrt(head_dim) = 1
    d.scale = 0.0f;
    flashcl_ref_attention_forward(&d, q, k, v, out, lse, scores, NULL);
    CHECK(scores[1] == 1.5, "default scale: score %g", scores[1]);
}

/* The plain implementation rounds P to the storage type before P.V. With
 * v = (1, -1) the output p0 - p1 is a difference of two rounded numbers, which
 * differs from the rounded difference: bf16, scores (0, x), x = 0.01. */
static void test_plain_rounds_p(void) {
    const flashcl_dtype dt = FLASHCL_BFLOAT16;
    flashcl_attention_desc d = make_desc(dt, 1, 1, 1, 1, 2, 1);
    d.scale = 1.0f;
    uint16_t q[1], k[2], v[2];
    q[0] = flashcl_ref_float_to_bf16(1.0f);
    k[0] = flashcl_ref_float_to_bf16(0.0f);
    k[1] = flashcl_ref_float_to_bf16(0.01f);
    v[0] = flashcl_ref_float_to_bf16(1.0f);
    v[1] = flashcl_ref_float_to_bf16(-1.0f);
    double x = flashcl_ref_bf16_to_float(k[1]);
    float p0 = (float)(1 / (1 + exp(x))), p1 = (float)(exp(x) / (1 + exp(x)));
    float r0 = flashcl_ref_bf16_to_float(flashcl_ref_float_to_bf16(p0));
    float r1 = flashcl_ref_bf16_to_float(flashcl_ref_float_to_bf16(p1));
    double want = flashcl_ref_bf16_to_float(flashcl_ref_float_to_bf16(r0 - r1));
    double unrounded = flashcl_ref_bf16_to_float(flashcl_ref_float_to_bf16(p0 - p1));
    CHECK(want != unrounded, "the case must tell the two apart");
    double plain[1], ref[1];
    flashcl_ref_attention_forward_plain(&d, q, k, v, plain);
    flashcl_ref_attention_forward(&d, q, k, v, ref, NULL, NULL, NULL);
    CHECK(plain[0] == want, "plain %.9g, want %.9g (P rounded to bf16)", plain[0], want);
    CHECK(fabs(ref[0] - (p0 - p1)) < 1e-7, "ref %.9g, want %.9g", ref[0], (double)(p0 - p1));
}

/* The _p8 baseline rounds 256 exp(s - m) to e4m3 before P.V and divides by
 * the sum after: e4m3 q = 1, k = (0, 0.5), v = (1, -1), scale 1: 256 e =
 * (155.3, 256) round to (160, 256), so out = (0.625 - 1) / sum = -0.2334,
 * against -0.2449 unrounded. A result with that rounding passes the _p8
 * check and fails the plain one (whose baseline keeps P in float32). */
static void test_plain_p8(void) {
    flashcl_attention_desc d = make_desc(FLASHCL_FLOAT8_E4M3, 1, 1, 1, 1, 2, 1);
    d.out_dtype = FLASHCL_FLOAT32;
    d.scale = 1.0f;
    const unsigned char q[1] = {flashcl_ref_fp8_encode(FLASHCL_FLOAT8_E4M3, 1.0)};
    const unsigned char k[2] = {flashcl_ref_fp8_encode(FLASHCL_FLOAT8_E4M3, 0.0),
                                flashcl_ref_fp8_encode(FLASHCL_FLOAT8_E4M3, 0.5)};
    const unsigned char v[2] = {flashcl_ref_fp8_encode(FLASHCL_FLOAT8_E4M3, 1.0),
                                flashcl_ref_fp8_encode(FLASHCL_FLOAT8_E4M3, -1.0)};
    double p8[1], plain[1];
    flashcl_ref_attention_forward_plain_p8(&d, q, k, v, p8);
    flashcl_ref_attention_forward_plain(&d, q, k, v, plain);
    const float sum = expf(-0.5f) + 1.0f, want = 0.625f / sum - 1.0f / sum;
    CHECK(fabs(p8[0] - want) < 1e-6 && fabs(want + 0.2334) < 1e-4,
          "plain_p8 %.9g, want %.9g (256 e rounded to e4m3: 160 and 256)", p8[0], (double)want);
    CHECK(fabs(plain[0] - (1.0 - exp(0.5)) / (1.0 + exp(0.5))) < 1e-7, "plain %.9g keeps P in float32", plain[0]);
    const float out[1] = {(float)p8[0]};
    flashcl_ref_report rep;
    CHECK(flashcl_ref_check_forward_p8(&d, q, k, v, out, NULL, 0, &rep), "the _p8 check takes e4m3 P (tolerance %g)",
          rep.tolerance);
    CHECK(!flashcl_ref_check_forward(&d, q, k, v, out, NULL, 0, &rep),
          "the plain check refuses e4m3 P (max_err %g, tolerance %g)", rep.max_err, rep.tolerance);
}

/* Nq > Nk under a causal mask: rows 0 .. Nq-Nk-1 see nothing (out 0, lse
 * -inf, scores -inf, probs 0); row Nq-Nk sees only key 0. */
static void test_empty_rows(flashcl_dtype dt) {
    const int Nq = 6, Nk = 3, D = 4, H = 1;
    flashcl_attention_desc d = make_desc(dt, 1, H, H, Nq, Nk, D);
    d.causal = 1;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, 3);
    void *q = xcalloc(qcount(&d), elem_size(dt)), *k = xcalloc(kcount(&d), elem_size(dt)),
         *v = xcalloc(kcount(&d), elem_size(dt));
    flashcl_ref_fill_normal(&rng, q, dt, qcount(&d), 1.0);
    flashcl_ref_fill_normal(&rng, k, dt, kcount(&d), 1.0);
    flashcl_ref_fill_normal(&rng, v, dt, kcount(&d), 1.0);
    double *out = xcalloc(qcount(&d), sizeof(double)), *plain = xcalloc(qcount(&d), sizeof(double));
    double *lse = xcalloc(qrows(&d), sizeof(double));
    double *scores = xcalloc(qrows(&d) * Nk, sizeof(double)),
           *probs = xcalloc(qrows(&d) * Nk, sizeof(double));
    run_both(&d, q, k, v, out, lse, scores, probs, plain);
    for (int i = 0; i < Nq; i++) {
        double psum = 0;
        for (int j = 0; j < Nk; j++) {
            double s = scores[(size_t)i * Nk + j], p = probs[(size_t)i * Nk + j];
            int visible = j <= i - 3;
            if (visible) {
                double want = d.scale * dot_qk(&d, q, k, 0, i, 0, j, 0);
                CHECK(fabs(s - want) < 1e-12 && p > 0, "empty-rows score (%d,%d)", i, j);
            } else {
                CHECK(isinf(s) && s < 0 && p == 0.0, "masked (%d,%d): score %g prob %g", i, j, s,
                      p);
            }
            psum += p;
        }
        if (i < 3) {
            CHECK(isinf(lse[i]) && lse[i] < 0, "%s empty row %d lse %g", dtype_name(dt), i, lse[i]);
            CHECK(psum == 0.0, "empty row probs");
            for (int x = 0; x < D; x++)
                CHECK(out[(size_t)i * D + x] == 0.0 && plain[(size_t)i * D + x] == 0.0,
                      "empty row %d out %g plain %g", i, out[(size_t)i * D + x],
                      plain[(size_t)i * D + x]);
        } else {
            CHECK(isfinite(lse[i]) && fabs(psum - 1) < 1e-14, "row %d lse %g psum %g", i, lse[i],
                  psum);
        }
    }
    for (int x = 0; x < D; x++)
        CHECK(out[3 * D + x] == flashcl_ref_load(v, dt, (size_t)x), "row 3 sees only key 0");
    free(q), free(k), free(v), free(out), free(plain), free(lse), free(scores), free(probs);
}

/* Soft-capping: the debug scores equal cap * tanh(s / cap) of the uncapped
 * ones, stay inside (-cap, cap), and the probabilities follow from them. */
static void test_softcap(void) {
    const int Nq = 5, Nk = 9, D = 16;
    const flashcl_dtype dt = FLASHCL_FLOAT32;
    flashcl_attention_desc d = make_desc(dt, 1, 1, 1, Nq, Nk, D);
    d.scale = 0.5f;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, 4);
    float q[5 * 16], k[9 * 16], v[9 * 16];
    flashcl_ref_fill_normal(&rng, q, dt, 5 * 16, 2.0);
    flashcl_ref_fill_normal(&rng, k, dt, 9 * 16, 2.0);
    flashcl_ref_fill_normal(&rng, v, dt, 9 * 16, 1.0);
    double out[5 * 16], raw[5 * 9], capped[5 * 9], probs[5 * 9];
    flashcl_ref_attention_forward(&d, q, k, v, out, NULL, raw, NULL);
    d.softcap = 5.0f;
    flashcl_ref_attention_forward(&d, q, k, v, out, NULL, capped, probs);
    int saturated = 0;
    for (int i = 0; i < Nq; i++) {
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < Nk; j++) {
            double want = 5.0 * tanh(raw[i * Nk + j] / 5.0);
            CHECK(fabs(capped[i * Nk + j] - want) < 1e-14, "softcap (%d,%d): %.17g want %.17g", i,
                  j, capped[i * Nk + j], want);
            CHECK(fabs(capped[i * Nk + j]) < 5.0, "softcap bound");
            saturated += fabs(raw[i * Nk + j]) > 5.0;
            if (capped[i * Nk + j] > m)
                m = capped[i * Nk + j];
        }
        for (int j = 0; j < Nk; j++)
            sum += exp(capped[i * Nk + j] - m);
        for (int j = 0; j < Nk; j++)
            CHECK(fabs(probs[i * Nk + j] - exp(capped[i * Nk + j] - m) / sum) < 1e-15,
                  "softcap probs");
    }
    CHECK(saturated > 3, "the softcap test should have scores beyond the cap (%d)", saturated);
    // the plain implementation caps too: in float32 it stays within float noise
    double plain[5 * 16];
    flashcl_ref_attention_forward_plain(&d, q, k, v, plain);
    for (int n = 0; n < Nq * D; n++)
        CHECK(fabs(plain[n] - out[n]) < 1e-5, "softcap plain %.9g, ref %.9g", plain[n], out[n]);
}

/* GQA: heads_q = 6, heads_k = 2 must equal MHA on K and V with each key head
 * repeated for query heads h = 3g, 3g+1, 3g+2 (h / 3 = g). Exact equality:
 * the same numbers go through the same operations. MQA too. */
static void test_gqa(int Hk) {
    const int B = 2, Hq = 6, Nq = 7, Nk = 11, D = 8;
    const flashcl_dtype dt = FLASHCL_FLOAT16;
    flashcl_attention_desc g = make_desc(dt, B, Hq, Hk, Nq, Nk, D);
    flashcl_attention_desc m = make_desc(dt, B, Hq, Hq, Nq, Nk, D);
    g.causal = m.causal = 1;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, 5);
    uint16_t *q = xcalloc(qcount(&g), 2), *k = xcalloc(kcount(&g), 2), *v = xcalloc(kcount(&g), 2);
    uint16_t *km = xcalloc(kcount(&m), 2), *vm = xcalloc(kcount(&m), 2);
    flashcl_ref_fill_normal(&rng, q, dt, qcount(&g), 1.0);
    flashcl_ref_fill_normal(&rng, k, dt, kcount(&g), 1.0);
    flashcl_ref_fill_normal(&rng, v, dt, kcount(&g), 1.0);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Nk; j++)
            for (int h = 0; h < Hq; h++)
                for (int x = 0; x < D; x++) {
                    km[at4(Nk, Hq, D, b, j, h, x)] = k[at4(Nk, Hk, D, b, j, h / (Hq / Hk), x)];
                    vm[at4(Nk, Hq, D, b, j, h, x)] = v[at4(Nk, Hk, D, b, j, h / (Hq / Hk), x)];
                }
    size_t n = qcount(&g), r = qrows(&g);
    double *og = xcalloc(n, 8), *om = xcalloc(n, 8), *pg = xcalloc(n, 8), *pm = xcalloc(n, 8);
    double *lg = xcalloc(r, 8), *lm = xcalloc(r, 8);
    run_both(&g, q, k, v, og, lg, NULL, NULL, pg);
    run_both(&m, q, km, vm, om, lm, NULL, NULL, pm);
    CHECK(memcmp(og, om, n * 8) == 0, "GQA Hk=%d out differs from repeated-head MHA", Hk);
    CHECK(memcmp(pg, pm, n * 8) == 0, "GQA Hk=%d plain differs from repeated-head MHA", Hk);
    CHECK(memcmp(lg, lm, r * 8) == 0, "GQA Hk=%d lse differs from repeated-head MHA", Hk);
    free(q), free(k), free(v), free(km), free(vm), free(og), free(om), free(pg), free(pm), free(lg),
        free(lm);
}

/* A [batch][heads][seqlen][head_dim] layout with an offset and padding
 * everywhere: `pad` extra elements after each row, head and batch. */
static flashcl_layout bhsd_layout(int N, int H, int D, size_t offset, size_t pad) {
    flashcl_layout l;
    l.offset = offset;
    l.stride_seq = (size_t)D + pad;
    l.stride_head = (size_t)N * l.stride_seq + pad;
    l.stride_batch = (size_t)H * l.stride_head + pad;
    return l;
}

static size_t layout_span(const flashcl_layout *l, int B, int N, int H, int D) {
    return l->offset + (size_t)(B - 1) * l->stride_batch + (size_t)(N - 1) * l->stride_seq +
           (size_t)(H - 1) * l->stride_head + (size_t)D;
}

/* Copies a packed tensor into `layout` (filling the gaps with poison). */
static void *relayout(const void *packed, flashcl_dtype dt, const flashcl_layout *l, int B, int N,
                      int H, int D) {
    size_t span = layout_span(l, B, N, H, D);
    void *dst = xcalloc(span, elem_size(dt));
    flashcl_ref_poison(dst, dt, span); // a gap read by mistake would show as NaN
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++)
            for (int h = 0; h < H; h++)
                for (int x = 0; x < D; x++) {
                    size_t to = l->offset + b * l->stride_batch + n * l->stride_seq +
                                h * l->stride_head + (size_t)x;
                    memcpy((char *)dst + to * elem_size(dt),
                           (const char *)packed + at4(N, H, D, b, n, h, x) * elem_size(dt),
                           elem_size(dt));
                }
    return dst;
}

static void test_strided(flashcl_dtype dt) {
    const int B = 2, Hq = 4, Hk = 2, Nq = 9, Nk = 13, D = 12;
    flashcl_attention_desc p = make_desc(dt, B, Hq, Hk, Nq, Nk, D);
    p.window_left = 3;
    p.windowed = 1;
    p.window_right = 1;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, 6);
    void *q = xcalloc(qcount(&p), elem_size(dt)), *k = xcalloc(kcount(&p), elem_size(dt)),
         *v = xcalloc(kcount(&p), elem_size(dt));
    flashcl_ref_fill_normal(&rng, q, dt, qcount(&p), 1.0);
    flashcl_ref_fill_normal(&rng, k, dt, kcount(&p), 1.0);
    flashcl_ref_fill_normal(&rng, v, dt, kcount(&p), 1.0);
    flashcl_attention_desc s = p;
    s.q = bhsd_layout(Nq, Hq, D, 5, 3);
    s.k = bhsd_layout(Nk, Hk, D, 0, 1);
    s.v = bhsd_layout(Nk, Hk, D, 17, 2);
    void *qs = relayout(q, dt, &s.q, B, Nq, Hq, D), *ks = relayout(k, dt, &s.k, B, Nk, Hk, D),
         *vs = relayout(v, dt, &s.v, B, Nk, Hk, D);
    size_t n = qcount(&p), r = qrows(&p);
    double *op = xcalloc(n, 8), *os = xcalloc(n, 8), *pp = xcalloc(n, 8), *ps = xcalloc(n, 8);
    double *lp = xcalloc(r, 8), *ls = xcalloc(r, 8);
    run_both(&p, q, k, v, op, lp, NULL, NULL, pp);
    run_both(&s, qs, ks, vs, os, ls, NULL, NULL, ps);
    CHECK(memcmp(op, os, n * 8) == 0, "%s strided out differs from packed", dtype_name(dt));
    CHECK(memcmp(pp, ps, n * 8) == 0, "%s strided plain differs from packed", dtype_name(dt));
    CHECK(memcmp(lp, ls, r * 8) == 0, "%s strided lse differs from packed", dtype_name(dt));
    // all-zero strides mean packed, as resolve would make them
    flashcl_attention_desc z = p;
    memset(&z.q, 0, sizeof z.q);
    memset(&z.k, 0, sizeof z.k);
    memset(&z.v, 0, sizeof z.v);
    flashcl_ref_attention_forward(&z, q, k, v, os, ls, NULL, NULL);
    CHECK(memcmp(op, os, n * 8) == 0, "%s zero strides differ from packed", dtype_name(dt));
    free(q), free(k), free(v), free(qs), free(ks), free(vs), free(op), free(os), free(pp), free(ps),
        free(lp), free(ls);
}

/* ---- the checker --------------------------------------------------------- */

static void test_check(flashcl_dtype dt) {
    const int B = 2, Hq = 4, Hk = 2, Nq = 37, Nk = 29, D = 40;
    flashcl_attention_desc d = make_desc(dt, B, Hq, Hk, Nq, Nk, D);
    d.causal = 1; // Nq > Nk: rows 0..7 see nothing
    d.out = bhsd_layout(Nq, Hq, D, 11, 5);
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, 8 + (uint64_t)dt);
    size_t es = elem_size(dt), n = qcount(&d), r = qrows(&d);
    void *q = xcalloc(n, es), *k = xcalloc(kcount(&d), es), *v = xcalloc(kcount(&d), es);
    flashcl_ref_fill_normal(&rng, q, dt, n, 1.0);
    flashcl_ref_fill_normal(&rng, k, dt, kcount(&d), 1.0);
    flashcl_ref_fill_normal(&rng, v, dt, kcount(&d), 1.0);

    // the plain output, stored in desc->out's layout, and the reference LSE as float
    double *plain = xcalloc(n, 8), *ref_lse = xcalloc(r, 8), *ref = xcalloc(n, 8);
    flashcl_ref_attention_forward_plain(&d, q, k, v, plain);
    flashcl_ref_attention_forward(&d, q, k, v, ref, ref_lse, NULL, NULL);
    size_t span = layout_span(&d.out, B, Nq, Hq, D);
    void *out = xcalloc(span, es);
    flashcl_ref_poison(out, dt, span);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Nq; i++)
            for (int h = 0; h < Hq; h++)
                for (int x = 0; x < D; x++)
                    flashcl_ref_store(out, dt,
                                      d.out.offset + b * d.out.stride_batch + i * d.out.stride_seq +
                                          h * d.out.stride_head + (size_t)x,
                                      plain[at4(Nq, Hq, D, b, i, h, x)]);
    float *lse = xcalloc(r, sizeof(float));
    for (size_t t = 0; t < r; t++)
        lse[t] = (float)ref_lse[t];

    flashcl_ref_report rep;
    int ok = flashcl_ref_check_forward(&d, q, k, v, out, lse, 1, &rep);
    double eps = flashcl_ref_epsilon(dt);
    double plain_cap = dt == FLASHCL_FLOAT32 ? 1e-5 : dt == FLASHCL_FLOAT16 ? 4e-3 : 3e-2;
    CHECK(ok && rep.passed && rep.mismatches == 0, "%s: the plain output must pass",
          dtype_name(dt));
    CHECK(rep.max_err == rep.plain_err, "%s: max_err %g != plain_err %g", dtype_name(dt),
          rep.max_err, rep.plain_err);
    double max_ref = 0.0;
    for (size_t t = 0; t < n; t++)
        max_ref = fmax(max_ref, fabs(ref[t]));
    /* the score-rounding term is ~1e-6 on N(0,1) inputs */
    double base = 2 * rep.plain_err + eps * fmax(1.0, max_ref);
    CHECK(rep.tolerance >= base && rep.tolerance <= base + 1e-5, "%s: tolerance", dtype_name(dt));
    CHECK(rep.plain_err > 0 || dt == FLASHCL_FLOAT32, "%s: plain_err should be nonzero",
          dtype_name(dt));
    CHECK(rep.plain_err < plain_cap, "%s: plain_err %g too large", dtype_name(dt), rep.plain_err);
    CHECK(rep.max_lse_err < 1e-5, "%s: max_lse_err %g", dtype_name(dt), rep.max_lse_err);
    // without lse too
    CHECK(flashcl_ref_check_forward(&d, q, k, v, out, NULL, 0, &rep), "%s: without lse",
          dtype_name(dt));
    // _rounded: the tolerance grows by half a storage ulp of max(|out|, |v|) a rounding
    {
        const int mant = dt == FLASHCL_FLOAT16 ? 10 : dt == FLASHCL_BFLOAT16 ? 7 : 23;
        double bound = max_ref;
        for (size_t t = 0; t < kcount(&d); t++) /* v is packed here */
            bound = fmax(bound, fabs(flashcl_ref_load(v, dt, t)));
        const double half_ulp = 0.5 * ldexp(1.0, ilogb(bound) - mant), tol0 = rep.tolerance;
        CHECK(flashcl_ref_check_forward_rounded(&d, q, k, v, out, lse, 0, 0, &rep) && rep.tolerance == tol0,
              "%s: _rounded with 0 roundings is the plain rule", dtype_name(dt));
        CHECK(flashcl_ref_check_forward_rounded(&d, q, k, v, out, lse, 6, 0, &rep) &&
                  fabs(rep.tolerance - (tol0 + 6 * half_ulp)) <= 1e-12 * tol0,
              "%s: _rounded with 6 roundings: tolerance %g, want %g", dtype_name(dt), rep.tolerance,
              tol0 + 6 * half_ulp);
        // an element moved past the plain tolerance, but within 6 half-ulps more, passes only _rounded
        const size_t at = d.out.offset + 1 * d.out.stride_batch + 30 * d.out.stride_seq + d.out.stride_head + 3;
        const double was = flashcl_ref_load(out, dt, at), want = ref[at4(Nq, Hq, D, 1, 30, 1, 3)];
        const double moved = want + tol0 + 3 * half_ulp;
        flashcl_ref_store(out, dt, at, moved);
        const double err = fabs(flashcl_ref_load(out, dt, at) - want);
        CHECK(err > tol0 && err < tol0 + 6 * half_ulp, "%s: the moved element's error %g is between %g and %g",
              dtype_name(dt), err, tol0, tol0 + 6 * half_ulp);
        CHECK(!flashcl_ref_check_forward(&d, q, k, v, out, lse, 0, &rep) &&
                  flashcl_ref_check_forward_rounded(&d, q, k, v, out, lse, 6, 0, &rep) &&
                  !flashcl_ref_check_forward_rounded(&d, q, k, v, out, lse, 1, 0, &rep),
              "%s: an error of %g passes 6 extra roundings, not 0 or 1", dtype_name(dt), err);
        flashcl_ref_store(out, dt, at, was);
    }

    // a NaN in one element fails, and first_bad names it
    size_t bad =
        d.out.offset + 1 * d.out.stride_batch + 20 * d.out.stride_seq + 2 * d.out.stride_head + 7;
    double saved = flashcl_ref_load(out, dt, bad);
    flashcl_ref_store(out, dt, bad, NAN);
    fprintf(stderr, "(expected mismatch report follows)\n");
    ok = flashcl_ref_check_forward(&d, q, k, v, out, lse, 1, &rep);
    CHECK(!ok && !rep.passed && rep.mismatches == 1, "%s: NaN must fail (%zu mismatches)",
          dtype_name(dt), rep.mismatches);
    CHECK(rep.first_bad[0] == 1 && rep.first_bad[1] == 20 && rep.first_bad[2] == 2 &&
              rep.first_bad[3] == 7,
          "%s: first_bad %zu %zu %zu %zu", dtype_name(dt), rep.first_bad[0], rep.first_bad[1],
          rep.first_bad[2], rep.first_bad[3]);
    CHECK(isinf(rep.max_err), "%s: a NaN output makes max_err infinite", dtype_name(dt));
    flashcl_ref_store(out, dt, bad, INFINITY);
    CHECK(!flashcl_ref_check_forward(&d, q, k, v, out, lse, 0, &rep), "%s: inf must fail",
          dtype_name(dt));

    // a perturbation well beyond the tolerance fails; a NaN in the (unread)
    // padding does not matter
    flashcl_ref_store(out, dt, bad, saved);
    CHECK(flashcl_ref_check_forward(&d, q, k, v, out, lse, 0, &rep), "%s: restored",
          dtype_name(dt));
    size_t bad2 =
        d.out.offset + 0 * d.out.stride_batch + 9 * d.out.stride_seq + 3 * d.out.stride_head + 0;
    saved = flashcl_ref_load(out, dt, bad2);
    flashcl_ref_store(out, dt, bad2, saved + 4 * rep.tolerance + 0.01);
    ok = flashcl_ref_check_forward(&d, q, k, v, out, lse, 0, &rep);
    CHECK(!ok && rep.mismatches == 1 && rep.first_bad[0] == 0 && rep.first_bad[1] == 9 &&
              rep.first_bad[2] == 3 && rep.first_bad[3] == 0,
          "%s: perturbed element must fail (%zu mismatches)", dtype_name(dt), rep.mismatches);
    CHECK(rep.max_err > rep.tolerance, "%s: max_err of the perturbed element", dtype_name(dt));
    // a nonzero output in a row that sees no key fails too
    flashcl_ref_store(out, dt, bad2, saved);
    size_t empty = d.out.offset + 2 * d.out.stride_seq + 1 * d.out.stride_head + 5;
    flashcl_ref_store(out, dt, empty, 0.05);
    CHECK(!flashcl_ref_check_forward(&d, q, k, v, out, lse, 0, &rep), "%s: empty row nonzero",
          dtype_name(dt));
    flashcl_ref_store(out, dt, empty, 0.0);

    // LSE: -inf where the row is empty, finite elsewhere, within 1e-3 + 1e-4|lse|
    size_t e_row = at_lse(&d, 1, 3, 4), f_row = at_lse(&d, 1, 3, 30);
    CHECK(isinf(lse[e_row]) && isfinite(lse[f_row]), "lse rows chosen right");
    lse[e_row] = -1e30f;
    CHECK(!flashcl_ref_check_forward(&d, q, k, v, out, lse, 0, &rep), "%s: empty-row lse finite",
          dtype_name(dt));
    lse[e_row] = -INFINITY;
    float f_saved = lse[f_row];
    lse[f_row] = -INFINITY;
    CHECK(!flashcl_ref_check_forward(&d, q, k, v, out, lse, 0, &rep), "%s: lse -inf",
          dtype_name(dt));
    lse[f_row] = NAN;
    CHECK(!flashcl_ref_check_forward(&d, q, k, v, out, lse, 0, &rep), "%s: lse NaN",
          dtype_name(dt));
    lse[f_row] = (float)(ref_lse[f_row] + 3e-3 + 1e-4 * fabs(ref_lse[f_row]));
    CHECK(!flashcl_ref_check_forward(&d, q, k, v, out, lse, 0, &rep), "%s: lse off by 3e-3",
          dtype_name(dt));
    lse[f_row] = (float)(ref_lse[f_row] + 5e-4);
    CHECK(flashcl_ref_check_forward(&d, q, k, v, out, lse, 0, &rep) && rep.max_lse_err > 4e-4,
          "%s: lse off by 5e-4 passes", dtype_name(dt));
    lse[f_row] = f_saved;

    // an output nobody wrote (still poisoned) fails everywhere
    flashcl_ref_poison(out, dt, span);
    ok = flashcl_ref_check_forward(&d, q, k, v, out, lse, 0, &rep);
    CHECK(!ok && rep.mismatches == n, "%s: poisoned out: %zu mismatches of %zu", dtype_name(dt),
          rep.mismatches, n);

    // the reference itself, rounded to the dtype, passes too
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Nq; i++)
            for (int h = 0; h < Hq; h++)
                for (int x = 0; x < D; x++)
                    flashcl_ref_store(out, dt,
                                      d.out.offset + b * d.out.stride_batch + i * d.out.stride_seq +
                                          h * d.out.stride_head + (size_t)x,
                                      ref[at4(Nq, Hq, D, b, i, h, x)]);
    CHECK(flashcl_ref_check_forward(&d, q, k, v, out, lse, 1, &rep), "%s: rounded ref",
          dtype_name(dt));

    free(q), free(k), free(v), free(plain), free(ref_lse), free(ref), free(out), free(lse);
}

int main(void) {
    const flashcl_dtype dtypes[3] = {FLASHCL_FLOAT32, FLASHCL_FLOAT16, FLASHCL_BFLOAT16};
    test_half();
    test_bf16();
    test_load_store();
    test_rng();
    test_visible_keys();
    test_by_hand();
    test_softcap();
    test_plain_rounds_p();
    test_plain_p8();
    test_gqa(2);
    test_gqa(1);
    for (int t = 0; t < 3; t++) {
        test_uniform(dtypes[t]);
        test_single_key(dtypes[t]);
        test_empty_rows(dtypes[t]);
        test_strided(dtypes[t]);
        test_check(dtypes[t]);
    }
    CHECK(flashcl_ref_epsilon(FLASHCL_FLOAT32) == 1e-5 &&
              flashcl_ref_epsilon(FLASHCL_FLOAT16) == 2e-4 &&
              flashcl_ref_epsilon(FLASHCL_BFLOAT16) == 2e-3,
          "epsilon table");
    if (failures) {
        fprintf(stderr, "test_reference: %d checks FAILED\n", failures);
        return 1;
    }
    printf("test_reference: all checks passed\n");
    return 0;
}
