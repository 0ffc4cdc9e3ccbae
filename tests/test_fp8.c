/* test_fp8.c: the FP8 formats (src/fp8.c) against their definition (host_ref/ref_fp8.c).
 *
 * Every one of the 256 codes of both formats decodes to the reference value;
 * encoding agrees with the reference's nearest-value search on every code,
 * on every midpoint between neighbours (ties to even) and on random values
 * across the range; saturation and NaN follow cvt.rn.satfinite; amax
 * quantization (per tensor and per head, from float32, float16 and
 * bfloat16, packed and strided) gives the reference's bytes and scales, and
 * refuses NaN or infinity without writing, on the host and (where the test
 * device is an OpenCL one) on the device, which must give the host's bytes;
 * the quantize options (row blocks, a Hadamard rotation) give the same bytes
 * and factors on the device as on the host, and dequantize inverts them; the
 * device decode of all 256 codes (cl/common.cl's float8 and scalar helpers)
 * equals flashcl_fp8_decode bit for bit; the merge refuses FP8 tensors with a
 * message. The forward's FP8 path is tests/test_fp8_forward.c's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcl.h"
#include "flashcl_ref.h"
#include "harness.h"

static int failures;
static const flashcl_dtype formats[2] = {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT8_E5M2};
static const char *const names[2] = {"e4m3", "e5m2"};

static int same_value(double ref, float got) {
    return isnan(ref) ? isnan(got) : (double)got == ref && !signbit(ref) == !signbit(got);
}

static void decode_table(void) {
    for (int f = 0; f < 2; ++f) {
        int bad = 0;
        for (int c = 0; c < 256; ++c)
            bad += !same_value(flashcl_ref_fp8_decode(formats[f], (unsigned char)c),
                               flashcl_fp8_decode(formats[f], (unsigned char)c));
        char what[96];
        snprintf(what, sizeof what, "%s: all 256 codes decode to the reference (%d differ)", names[f], bad);
        expect(bad == 0, what, &failures);
    }
    /* The definition's landmarks, written out, so the reference is checked too. */
    const flashcl_dtype E4 = FLASHCL_FLOAT8_E4M3, E5 = FLASHCL_FLOAT8_E5M2;
    expect(flashcl_fp8_decode(E4, 0x7e) == 448.0f && isnan(flashcl_fp8_decode(E4, 0x7f)) &&
               isnan(flashcl_fp8_decode(E4, 0xff)) && flashcl_fp8_decode(E4, 0x78) == 256.0f &&
               flashcl_fp8_decode(E4, 0x38) == 1.0f && flashcl_fp8_decode(E4, 0x08) == ldexpf(1, -6) &&
               flashcl_fp8_decode(E4, 0x01) == ldexpf(1, -9) && flashcl_fp8_decode(E4, 0xb8) == -1.0f,
           "e4m3: 448, NaN only at S.1111.111, 1, 2^-6, 2^-9 subnormal", &failures);
    expect(flashcl_fp8_decode(E5, 0x7b) == 57344.0f && flashcl_fp8_decode(E5, 0x7c) == INFINITY &&
               flashcl_fp8_decode(E5, 0xfc) == -INFINITY && isnan(flashcl_fp8_decode(E5, 0x7d)) &&
               isnan(flashcl_fp8_decode(E5, 0x7f)) && flashcl_fp8_decode(E5, 0x3c) == 1.0f &&
               flashcl_fp8_decode(E5, 0x04) == ldexpf(1, -14) && flashcl_fp8_decode(E5, 0x01) == ldexpf(1, -16),
           "e5m2: 57344, +-inf, NaN, 1, 2^-14, 2^-16 subnormal", &failures);
    expect(flashcl_dtype_size(E4) == 1 && flashcl_dtype_size(E5) == 1, "FP8 elements are one byte", &failures);
}

static void encode_checks(uint64_t seed) {
    for (int f = 0; f < 2; ++f) {
        const flashcl_dtype fmt = formats[f];
        const unsigned max_code = f ? 0x7b : 0x7e;
        int bad = 0, ties = 0, rnd = 0;
        for (unsigned c = 0; c <= max_code; ++c)
            for (int sign = 0; sign < 2; ++sign) {
                const unsigned code = c | (sign ? 0x80u : 0u);
                bad += flashcl_fp8_encode(fmt, flashcl_fp8_decode(fmt, (unsigned char)code)) != code;
            }
        /* Midpoints between neighbours (exact in float: 5 significant bits):
         * ties go to the even code. */
        for (unsigned c = 0; c < max_code; ++c) {
            const double mid = 0.5 * (flashcl_ref_fp8_decode(fmt, (unsigned char)c) +
                                      flashcl_ref_fp8_decode(fmt, (unsigned char)(c + 1)));
            const unsigned char want = flashcl_ref_fp8_encode(fmt, mid);
            ties += flashcl_fp8_encode(fmt, (float)mid) != want || (want & 1);
            ties += flashcl_fp8_encode(fmt, (float)-mid) != (want | 0x80);
        }
        /* Random magnitudes over the whole range and beyond both ends. */
        flashcl_ref_rng rng;
        flashcl_ref_rng_seed(&rng, seed + (uint64_t)f);
        for (int i = 0; i < 200000; ++i) {
            const double frac = flashcl_ref_rng_uniform(&rng), u = flashcl_ref_rng_uniform(&rng);
            const int neg = flashcl_ref_rng_uniform(&rng) < 0.5;
            const float x = (neg ? -1.0f : 1.0f) * ldexpf(1.0f + (float)frac, (int)(u * 44.0) - 22);
            rnd += flashcl_fp8_encode(fmt, x) != flashcl_ref_fp8_encode(fmt, (double)x);
        }
        char what[128];
        snprintf(what, sizeof what, "%s: every value round-trips (%d differ)", names[f], bad);
        expect(bad == 0, what, &failures);
        snprintf(what, sizeof what, "%s: midpoints round to the even neighbour (%d wrong)", names[f], ties);
        expect(ties == 0, what, &failures);
        snprintf(what, sizeof what, "%s: 200000 random values as the reference encodes them (%d differ)", names[f], rnd);
        expect(rnd == 0, what, &failures);
        /* cvt.rn.satfinite: past max, infinities -> +-max; NaN -> 0x7f with the sign. */
        const float mx = f ? 57344.0f : 448.0f;
        expect(flashcl_fp8_encode(fmt, mx * 1.5f) == max_code && flashcl_fp8_encode(fmt, -mx * 1.5f) == (max_code | 0x80) &&
                   flashcl_fp8_encode(fmt, INFINITY) == max_code && flashcl_fp8_encode(fmt, -INFINITY) == (max_code | 0x80) &&
                   flashcl_fp8_encode(fmt, 3e38f) == max_code && flashcl_fp8_encode(fmt, NAN) == 0x7f &&
                   flashcl_fp8_encode(fmt, -NAN) == 0xff && flashcl_fp8_encode(fmt, 1e-30f) == 0 &&
                   flashcl_fp8_encode(fmt, -1e-30f) == 0x80,
               f ? "e5m2: saturates to +-57344 (infinities too), NaN stays NaN, tiny values to +-0"
                 : "e4m3: saturates to +-448 (infinities too), NaN stays NaN, tiny values to +-0",
               &failures);
    }
}

/* One quantization case: shape, source dtype, layout (packed or [b][h][s][d]), per head. */
/* A quantization descriptor of that format, source dtype, shape and grouping, packed. */
static flashcl_fp8_quant_desc quant_desc(flashcl_dtype format, flashcl_dtype src_dtype, int batch, int seqlen,
                                         int heads, int head_dim, int per_head) {
    flashcl_fp8_quant_desc d;
    memset(&d, 0, sizeof d);
    d.format = format;
    d.src_dtype = src_dtype;
    d.batch = batch, d.seqlen = seqlen, d.heads = heads, d.head_dim = head_dim;
    d.per_head = per_head;
    return d;
}

/* The descale factors d gives: one, one a (batch, head), or one a block of block_rows rows of each. */
static size_t quant_groups(const flashcl_fp8_quant_desc *d) {
    if (!d->per_head)
        return 1;
    const size_t blocks = d->block_rows > 0 ? (size_t)(d->seqlen + d->block_rows - 1) / (size_t)d->block_rows : 1;
    return (size_t)d->batch * (size_t)d->heads * blocks;
}

/* The device helper on the same input: its bytes and scales must equal the host's. */
static void device_matches(flashcl_context *ctx, const flashcl_fp8_quant_desc *d, const void *src, size_t src_bytes,
                           const unsigned char *dst, const float *descale, size_t n, const char *label) {
    const size_t sc_bytes = quant_groups(d) * sizeof(float);
    cl_mem bs = test_upload(ctx, src, src_bytes), bd = test_upload(ctx, NULL, n), bsc = test_upload(ctx, NULL, sc_bytes);
    unsigned char *got = test_xmalloc(n);
    float *got_sc = test_xmalloc(sc_bytes);
    const flashcl_status st = flashcl_fp8_quantize(ctx, d, bs, bd, bsc, NULL);
    int same = st == FLASHCL_SUCCESS;
    if (same) {
        test_download(ctx, bd, got, n);
        test_download(ctx, bsc, got_sc, sc_bytes);
        same = !memcmp(got, dst, n) && !memcmp(got_sc, descale, sc_bytes);
    }
    char what[320];
    snprintf(what, sizeof what, "... on the device: the same bytes and scales (%s)", label);
    expect(same, what, &failures);
    free(got), free(got_sc);
    clReleaseMemObject(bs), clReleaseMemObject(bd), clReleaseMemObject(bsc);
}

static void quantize_case(flashcl_context *ctx, flashcl_dtype fmt, flashcl_dtype src_dt, int per_head, int bhsd,
                          uint64_t seed) {
    const int B = 2, S = 37, H = 3, D = 24;
    const size_t n = (size_t)B * S * H * D;
    flashcl_fp8_quant_desc d = quant_desc(fmt, src_dt, B, S, H, D, per_head);
    if (bhsd) { /* [b][h][s][d] with a 5-element offset */
        d.src.offset = 5;
        d.src.stride_head = (size_t)S * D;
        d.src.stride_seq = D;
        d.src.stride_batch = (size_t)H * S * D;
    }
    const size_t es = flashcl_dtype_size(src_dt), span = n + 5;
    unsigned char *src = calloc(span, es), *dst = malloc(n);
    float descale[6];
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    /* N(0,1) with 0.1 % outliers from N(0, 10^2), and one head scaled by 100
     * so per-head scales differ. */
    for (size_t i = 0; i < span; ++i) {
        const double g = flashcl_ref_rng_normal(&rng);
        flashcl_ref_store(src, src_dt, i, flashcl_ref_rng_uniform(&rng) < 0.001 ? 10.0 * g : g);
    }
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s)
            for (int x = 0; x < D; ++x) {
                const size_t at = bhsd ? 5 + ((size_t)(b * H + 1) * S + s) * D + x : (((size_t)b * S + s) * H + 1) * D + x;
                flashcl_ref_store(src, src_dt, at, 100.0 * flashcl_ref_load(src, src_dt, at));
            }
    memset(dst, 0xAA, n);
    const flashcl_status st = flashcl_fp8_quantize_host(&d, src, dst, descale);
    /* The reference: amax per group, descale = amax / max, bytes by ref encode. */
    const double mx = fmt == FLASHCL_FLOAT8_E4M3 ? 448.0 : 57344.0;
    int bad_scale = 0, bad_bytes = 0;
    double worst = 0.0;
    float inv_of[6];
    for (int g = 0; g < (per_head ? B * H : 1); ++g) {
        float amax = 0.0f;
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < H; ++h)
                if (!per_head || g == b * H + h)
                    for (int s = 0; s < S; ++s)
                        for (int x = 0; x < D; ++x) {
                            const size_t at = bhsd ? 5 + ((size_t)(b * H + h) * S + s) * D + x
                                                   : (((size_t)b * S + s) * H + h) * D + x;
                            amax = fmaxf(amax, (float)fabs(flashcl_ref_load(src, src_dt, at)));
                        }
        bad_scale += descale[g] != (amax > 0.0f ? amax / (float)mx : 1.0f);
        inv_of[g] = amax > 0.0f ? (float)mx / amax : 1.0f;
    }
    size_t o = 0;
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s)
            for (int h = 0; h < H; ++h)
                for (int x = 0; x < D; ++x, ++o) {
                    const size_t at = bhsd ? 5 + ((size_t)(b * H + h) * S + s) * D + x : (((size_t)b * S + s) * H + h) * D + x;
                    const float sc = descale[per_head ? b * H + h : 0];
                    const float inv = inv_of[per_head ? b * H + h : 0];
                    const float xv = (float)flashcl_ref_load(src, src_dt, at);
                    bad_bytes += dst[o] != flashcl_ref_fp8_encode(fmt, (double)(xv * inv));
                    /* Relative error of a normal value: half a step, 2^-4 (e4m3) or 2^-3 (e5m2). */
                    const double back = sc * flashcl_ref_fp8_decode(fmt, dst[o]);
                    if (fabs(xv) > sc * (fmt == FLASHCL_FLOAT8_E4M3 ? ldexp(1, -6) : ldexp(1, -14)))
                        worst = fmax(worst, fabs(back - xv) / fabs(xv));
                }
    char what[160];
    snprintf(what, sizeof what, "quantize %s from %s, %s, %s: scales %d off, bytes %d off, worst rel %.3g",
             fmt == FLASHCL_FLOAT8_E4M3 ? "e4m3" : "e5m2",
             src_dt == FLASHCL_FLOAT32 ? "f32" : src_dt == FLASHCL_FLOAT16 ? "f16" : "bf16",
             per_head ? "per head" : "per tensor", bhsd ? "[b][h][s][d]" : "packed", bad_scale, bad_bytes, worst);
    expect(st == FLASHCL_SUCCESS && bad_scale == 0 && bad_bytes == 0 &&
               worst <= (fmt == FLASHCL_FLOAT8_E4M3 ? 0.0625 : 0.125) * 1.0000001,
           what, &failures);
    if (ctx)
        device_matches(ctx, &d, src, span * es, dst, descale, n, what + 9);
    free(src);
    free(dst);
}

static void quantize_errors(void) {
    float src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    unsigned char dst[8];
    float descale[2] = {-7.0f, -7.0f};
    flashcl_fp8_quant_desc d = quant_desc(FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT32, 1, 2, 2, 2, 1);
    src[6] = NAN;
    memset(dst, 0x55, sizeof dst);
    flashcl_status st = flashcl_fp8_quantize_host(&d, src, dst, descale);
    int untouched = descale[0] == -7.0f && descale[1] == -7.0f;
    for (int i = 0; i < 8; ++i)
        untouched &= dst[i] == 0x55;
    expect(st == FLASHCL_ERROR_INVALID_ARGUMENT && untouched && strstr(flashcl_last_error(NULL), "NaN at"),
           "quantize: a NaN input is refused, named, and nothing is written", &failures);
    src[6] = INFINITY;
    st = flashcl_fp8_quantize_host(&d, src, dst, descale);
    expect(st == FLASHCL_ERROR_INVALID_ARGUMENT && descale[0] == -7.0f && dst[0] == 0x55 &&
               strstr(flashcl_last_error(NULL), "infinity"),
           "quantize: an infinite input is refused the same way", &failures);
    src[6] = 7.0f;
    d.format = FLASHCL_FLOAT16;
    expect(flashcl_fp8_quantize_host(&d, src, dst, descale) == FLASHCL_ERROR_INVALID_ARGUMENT &&
               strstr(flashcl_last_error(NULL), "FLASHCL_FLOAT8_E4M3"),
           "quantize: a format that is not FP8 is refused", &failures);
    d.format = FLASHCL_FLOAT8_E5M2;
    d.src_dtype = FLASHCL_FLOAT8_E4M3;
    expect(flashcl_fp8_quantize_host(&d, src, dst, descale) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "quantize: an FP8 source is refused", &failures);
    d.src_dtype = FLASHCL_FLOAT32;
    d.heads = 0;
    expect(flashcl_fp8_quantize_host(&d, src, dst, descale) == FLASHCL_ERROR_INVALID_SHAPE,
           "quantize: a zero dimension is refused", &failures);
    d.heads = 2;
    expect(flashcl_fp8_quantize_host(&d, NULL, dst, descale) == FLASHCL_ERROR_INVALID_ARGUMENT &&
               flashcl_fp8_quantize_host(NULL, src, dst, descale) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "quantize: NULL arguments are refused", &failures);
    expect(descale[0] == -7.0f && dst[0] == 0x55, "... and none of the refusals wrote anything", &failures);
    d.per_head = 0;
    memset(src, 0, sizeof src);
    expect(flashcl_fp8_quantize_host(&d, src, dst, descale) == FLASHCL_SUCCESS && descale[0] == 1.0f && dst[3] == 0,
           "quantize: an all-zero tensor gets descale 1 and zeros", &failures);
}

/* The device helper refuses NaN and infinity after its amax pass, writing nothing. */
static void device_refuses(flashcl_context *ctx) {
    float src[16];
    for (int i = 0; i < 16; ++i)
        src[i] = (float)i - 7.5f;
    src[11] = INFINITY;
    flashcl_fp8_quant_desc d = quant_desc(FLASHCL_FLOAT8_E5M2, FLASHCL_FLOAT32, 1, 4, 2, 2, 1);
    unsigned char poison[16];
    float poison_sc[2] = {-3.0f, -3.0f};
    memset(poison, 0x5a, sizeof poison);
    cl_mem bs = test_upload(ctx, src, sizeof src), bd = test_upload(ctx, poison, sizeof poison),
           bsc = test_upload(ctx, poison_sc, sizeof poison_sc);
    const flashcl_status st = flashcl_fp8_quantize(ctx, &d, bs, bd, bsc, NULL);
    unsigned char got[16];
    float got_sc[2];
    test_download(ctx, bd, got, sizeof got);
    test_download(ctx, bsc, got_sc, sizeof got_sc);
    expect(st == FLASHCL_ERROR_INVALID_ARGUMENT && !memcmp(got, poison, sizeof got) && got_sc[0] == -3.0f &&
               got_sc[1] == -3.0f && strstr(flashcl_last_error(ctx), "infinity (in batch 0, head 1"),
           "device quantize: an infinity is refused, located, nothing written", &failures);
    d.per_head = 0;
    src[11] = NAN;
    clEnqueueWriteBuffer(flashcl_context_cl_queue(ctx), bs, CL_TRUE, 0, sizeof src, src, 0, NULL, NULL);
    expect(flashcl_fp8_quantize(ctx, &d, bs, bd, bsc, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT &&
               strstr(flashcl_last_error(ctx), "NaN"),
           "device quantize: a NaN is refused", &failures);
    expect(flashcl_fp8_quantize(ctx, &d, bs, bd, bd, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "device quantize: dst as descale is refused", &failures);
    d.seqlen = 9; /* src holds 16 floats, not 9 * 2 * 2 */
    expect(flashcl_fp8_quantize(ctx, &d, bs, bd, bsc, NULL) == FLASHCL_ERROR_OUT_OF_BOUNDS,
           "device quantize: a src too small for the shape is refused", &failures);
    clReleaseMemObject(bs), clReleaseMemObject(bd), clReleaseMemObject(bsc);
}

/* The dense forward takes FP8 q, k, v (tests/test_fp8_forward.c); the merge
 * does not: refused, with the reason, nothing written. */
static void merge_refuses_fp8(void) {
    flashcl_merge_desc d = test_merge_desc(FLASHCL_FLOAT8_E4M3, 1, 4, 1, 8);
    flashcl_context *ctx = NULL;
    if (flashcl_context_create(&ctx, "host") != FLASHCL_SUCCESS) {
        expect(0, "a host context", &failures);
        return;
    }
    unsigned char o1[32], o2[32], out[32];
    float l1[4] = {0}, l2[4] = {0}, lse[4];
    memset(o1, 0x38, sizeof o1), memset(o2, 0x38, sizeof o2);
    memset(out, 0x5a, sizeof out);
    memset(lse, 0x5a, sizeof lse);
    const flashcl_status st = flashcl_attention_merge_host(ctx, &d, o1, l1, o2, l2, out, lse);
    expect(st == FLASHCL_ERROR_INVALID_ARGUMENT && strstr(flashcl_last_error(ctx), "float8") && out[0] == 0x5a &&
               out[31] == 0x5a && ((unsigned char *)lse)[0] == 0x5a,
           "the merge refuses FP8 tensors, says why, writes nothing", &failures);
    flashcl_context_destroy(ctx);
}

/* ---- the quantize options and the device decode ------------------------------------------------ */

/* block_rows and hadamard_seed: dequantize inverts them; the device gives the
 * host's bytes and factors, and its dequantize the host's floats. */
static void quantize_options(flashcl_context *dev, uint64_t seed) {
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    for (int f = 0; f < 2; ++f)
        for (int opt = 0; opt < 3; ++opt) {
            /* opt 0: blocks of 5 rows; 1: Hadamard per tensor; 2: both, from bf16 */
            flashcl_fp8_quant_desc qd = quant_desc(formats[f], opt == 2 ? FLASHCL_BFLOAT16 : FLASHCL_FLOAT32, 2, 13,
                                                   3, opt == 0 ? 24 : 64, opt != 1);
            qd.block_rows = opt != 1 ? 5 : 0;
            qd.hadamard_seed = opt ? 0x5eed0000ull + (uint64_t)opt : 0;
            const size_t n = (size_t)qd.batch * qd.seqlen * qd.heads * qd.head_dim, groups = quant_groups(&qd);
            const size_t es = flashcl_dtype_size(qd.src_dtype);
            void *src = test_xmalloc(n * es);
            flashcl_ref_fill_normal(&rng, src, qd.src_dtype, n, 1.0);
            /* An outlier per tensor: the rotation must spread it. */
            flashcl_ref_store(src, qd.src_dtype, n / 3, 40.0);
            unsigned char *bytes = test_xmalloc(n);
            float *sc = test_xmalloc(groups * sizeof *sc), *back = test_xmalloc(n * sizeof *back);
            char name[80], what[200];
            snprintf(name, sizeof name, "%s quantize %s%s from %s", names[f],
                     qd.block_rows ? "blocks of 5" : "per tensor", qd.hadamard_seed ? " + Hadamard" : "",
                     qd.src_dtype == FLASHCL_BFLOAT16 ? "bf16" : "f32");
            const flashcl_status qs = flashcl_fp8_quantize_host(&qd, src, bytes, sc);
            /* Round trip: dequantize (rotating back) is within FP8's rounding of
             * the group's amax: 2^-(m+1) relative, amax <= max|x| * sqrt(D)
             * after a rotation (the bound is loose; a wrong rotation or index
             * is off by O(1)). */
            flashcl_fp8_quant_desc bd = qd;
            bd.src_dtype = FLASHCL_FLOAT32;
            const flashcl_status st = flashcl_fp8_dequantize_host(&bd, bytes, sc, back);
            double worst = 0, amax = 0;
            for (size_t i = 0; i < n; ++i) {
                const double x = flashcl_ref_load(src, qd.src_dtype, i);
                worst = fmax(worst, isnan(back[i]) ? INFINITY : fabs(back[i] - x));
                amax = fmax(amax, fabs(x));
            }
            const double unit = f ? 0x1p-3 : 0x1p-4; /* half a quantum at the top binade, relative */
            snprintf(what, sizeof what, "%s: dequantize_host inverts it (max err %.3g, amax %.3g)", name, worst, amax);
            expect(qs == FLASHCL_SUCCESS && st == FLASHCL_SUCCESS && worst <= 2.0 * unit * amax, what, &failures);
            if (dev) {
                device_matches(dev, &qd, src, n * es, bytes, sc, n, name);
                /* The device's dequantize of those bytes (the host's, which the device's equal). */
                cl_mem bb = test_upload(dev, bytes, n), bsc = test_upload(dev, sc, groups * sizeof *sc);
                cl_mem bf = test_upload(dev, NULL, n * 4);
                float *dback = test_xmalloc(n * sizeof *dback);
                const flashcl_status sd = flashcl_fp8_dequantize(dev, &bd, bb, bsc, bf, NULL);
                test_download(dev, bf, dback, n * sizeof *dback);
                size_t differ = 0;
                for (size_t i = 0; i < n; ++i)
                    differ += memcmp(&dback[i], &back[i], sizeof(float)) != 0;
                snprintf(what, sizeof what, "  device dequantize == host dequantize (%zu differ)", differ);
                expect(sd == FLASHCL_SUCCESS && differ == 0, what, &failures);
                clReleaseMemObject(bb), clReleaseMemObject(bsc), clReleaseMemObject(bf);
                free(dback);
            }
            free(src), free(bytes), free(sc), free(back);
        }
    /* Refusals of the options. */
    flashcl_fp8_quant_desc qd = quant_desc(FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT32, 1, 1, 1, 48, 0);
    float src[48] = {1.0f};
    unsigned char bytes[48];
    float sc[4] = {-3.0f, -3.0f, -3.0f, -3.0f};
    memset(bytes, 0x5a, sizeof bytes);
    qd.hadamard_seed = 7;
    expect(flashcl_fp8_quantize_host(&qd, src, bytes, sc) == FLASHCL_ERROR_INVALID_ARGUMENT &&
               strstr(flashcl_last_error(NULL), "power of two") && bytes[0] == 0x5a && sc[0] == -3.0f,
           "quantize: Hadamard on head_dim 48 is refused, nothing written", &failures);
    qd.hadamard_seed = 0, qd.block_rows = 2;
    expect(flashcl_fp8_quantize_host(&qd, src, bytes, sc) == FLASHCL_ERROR_INVALID_ARGUMENT &&
               strstr(flashcl_last_error(NULL), "per_head") && bytes[0] == 0x5a && sc[0] == -3.0f,
           "quantize: block_rows without per_head is refused, nothing written", &failures);
    if (dev) {
        cl_mem bs = test_upload(dev, src, sizeof src), bb = test_upload(dev, bytes, sizeof bytes);
        cl_mem bsc = test_upload(dev, sc, sizeof sc);
        qd.block_rows = 0, qd.hadamard_seed = 7;
        const flashcl_status st = flashcl_fp8_quantize(dev, &qd, bs, bb, bsc, NULL);
        unsigned char got[48];
        test_download(dev, bb, got, sizeof got);
        expect(st == FLASHCL_ERROR_INVALID_ARGUMENT && strstr(flashcl_last_error(dev), "power of two") &&
                   !memcmp(got, bytes, sizeof got),
               "device quantize: Hadamard on head_dim 48 is refused, nothing written", &failures);
        clReleaseMemObject(bs), clReleaseMemObject(bb), clReleaseMemObject(bsc);
    }
}

/* All 256 codes through the device's decode: head_dim 8 takes the float8
 * helpers, head_dim 1 the scalar ones; factor 1, float32 out, so the result
 * is the decoded value itself. */
static void device_decode(flashcl_context *dev) {
    unsigned char codes[256];
    for (int c = 0; c < 256; ++c)
        codes[c] = (unsigned char)c;
    float one = 1.0f, got[256];
    for (int f = 0; f < 2; ++f)
        for (int width = 8; width >= 1; width -= 7) {
            const flashcl_fp8_quant_desc qd = quant_desc(formats[f], FLASHCL_FLOAT32, 1, 256 / width, 1, width, 0);
            cl_mem bc = test_upload(dev, codes, 256), bs = test_upload(dev, &one, 4), bo = test_upload(dev, NULL, 1024);
            const flashcl_status st = flashcl_fp8_dequantize(dev, &qd, bc, bs, bo, NULL);
            memset(got, 0x5a, sizeof got);
            test_download(dev, bo, got, sizeof got);
            int bad = 0;
            for (int c = 0; c < 256; ++c) {
                const float want = flashcl_fp8_decode(qd.format, (unsigned char)c);
                bad += isnan(want) ? !isnan(got[c]) : memcmp(&want, &got[c], 4) != 0;
            }
            char what[120];
            snprintf(what, sizeof what, "device decode (%s helpers), %s: all 256 codes == flashcl_fp8_decode (%d differ)",
                     width == 8 ? "float8" : "scalar", names[f], bad);
            expect(st == FLASHCL_SUCCESS && bad == 0, what, &failures);
            clReleaseMemObject(bc), clReleaseMemObject(bs), clReleaseMemObject(bo);
        }
}

int main(int argc, char **argv) {
    const uint64_t seed = test_seed();
    /* The device helper is checked against the host one where there is a device. */
    flashcl_context *ctx = test_context();
    flashcl_context *dev = flashcl_context_is_host(ctx) ? NULL : ctx;
    if (argc > 1 && !strcmp(argv[1], "oclgrind")) { /* the device kernels only */
        if (dev) {
            quantize_options(dev, seed + 7);
            device_decode(dev);
        }
        flashcl_context_destroy(ctx);
        return test_summary(failures);
    }
    decode_table();
    encode_checks(seed);
    for (int f = 0; f < 2; ++f)
        for (int dt = 0; dt < 3; ++dt)
            for (int per_head = 0; per_head < 2; ++per_head)
                quantize_case(dev, formats[f], (flashcl_dtype)dt, per_head, (dt + per_head) & 1,
                              seed + 17u * (uint64_t)dt);
    quantize_errors();
    if (dev)
        device_refuses(dev);
    else
        printf("no OpenCL device: the device quantize helper is not checked\n");
    quantize_options(dev, seed + 7);
    if (dev)
        device_decode(dev);
    merge_refuses_fp8();
    flashcl_context_destroy(ctx);
    return test_summary(failures);
}
