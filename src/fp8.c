/* fp8.c: the OCP 8-bit floating-point formats (e4m3fn, e5m2): conversions and amax-scaled quantization on the host.
 *
 * A format is 1 sign bit, E exponent bits (bias 2^(E-1) - 1) and M mantissa
 * bits. e4m3fn gives up infinity for one more binade: only S.1111.111 is NaN,
 * so its largest value is 1.75 * 2^8 = 448. e5m2 is IEEE-like: S.11111.00 is
 * infinity, S.11111.xx (xx != 0) NaN, largest 1.75 * 2^15 = 57344.
 *
 * Encoding is the hardware's cvt.rn.satfinite: round to nearest even, then
 * clamp to +-max (infinities included); NaN to NaN. host_ref/ref_fp8.c has an
 * independent encoder (nearest value of a decoded table), which the tests
 * compare against this one.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct fp8_format {
    int man_bits, bias;
    unsigned max_code; /* the largest finite magnitude's bits */
    float max;
} fp8_format;

static const fp8_format e4m3 = {3, 7, 0x7e, 448.0f};
static const fp8_format e5m2 = {2, 15, 0x7b, 57344.0f};

static const fp8_format *format_of(flashcl_dtype format) {
    return format == FLASHCL_FLOAT8_E4M3 ? &e4m3 : format == FLASHCL_FLOAT8_E5M2 ? &e5m2 : NULL;
}

int flashcl_dtype_is_fp8(flashcl_dtype dtype) {
    return format_of(dtype) != NULL;
}

float flashcl_fp8_decode(flashcl_dtype format, unsigned char bits) {
    const fp8_format *f = format_of(format);
    if (!f)
        return NAN;
    const int m = f->man_bits, exp_max = (1 << (7 - m)) - 1;
    const int e = (bits & 0x7f) >> m, man = bits & ((1 << m) - 1);
    float mag;
    if (f == &e4m3 && e == exp_max && man == (1 << m) - 1)
        mag = NAN;
    else if (f == &e5m2 && e == exp_max)
        mag = man ? NAN : INFINITY;
    else if (e == 0) /* subnormal: man * 2^(1 - bias - m) */
        mag = ldexpf((float)man, 1 - f->bias - m);
    else
        mag = ldexpf((float)((1 << m) + man), e - f->bias - m);
    return bits & 0x80 ? -mag : mag;
}

unsigned char flashcl_fp8_encode(flashcl_dtype format, float value) {
    const fp8_format *f = format_of(format);
    if (!f || isnan(value))
        return (unsigned char)(0x7f | (f && signbit(value) ? 0x80 : 0));
    const unsigned sign = signbit(value) ? 0x80 : 0;
    const float a = fabsf(value);
    if (a >= f->max) /* infinity included */
        return (unsigned char)(sign | f->max_code);
    const int m = f->man_bits;
    /* The quantum (spacing of the format's values) at a's binade, a power of
     * two, so a / quantum is exact and nearbyintf rounds to even. Below the
     * smallest normal 2^(1 - bias) the spacing is the subnormal one. */
    int e;
    frexpf(a, &e); /* a = fr * 2^e, fr in [0.5, 1): binade exponent e - 1 */
    int binade = e - 1;
    if (binade < 1 - f->bias)
        binade = 1 - f->bias;
    const float q = nearbyintf(ldexpf(a, m - binade)); /* in [0, 2^(m+1)] */
    /* Subnormals: the code is q itself (q = 2^m lands on the smallest normal).
     * Normals: ((binade + bias) << m) + q - 2^m; q = 2^(m+1) carries into the
     * next binade by the same sum. */
    unsigned code = a < ldexpf(1.0f, 1 - f->bias) ? (unsigned)q
                                                   : ((unsigned)(binade + f->bias) << m) + (unsigned)q - (1u << m);
    if (code > f->max_code) /* rounded up past max: satfinite */
        code = f->max_code;
    return (unsigned char)(sign | code);
}

/* Element (b, s, h, d) of src's layout; zero strides mean packed. */
static size_t src_index(const flashcl_fp8_quant_desc *d, int b, int s, int h, int x) {
    const flashcl_layout *l = &d->src;
    const int packed = !l->stride_batch && !l->stride_seq && !l->stride_head;
    const size_t sh = packed ? (size_t)d->head_dim : l->stride_head;
    const size_t ss = packed ? (size_t)d->heads * d->head_dim : l->stride_seq;
    const size_t sb = packed ? (size_t)d->seqlen * ss : l->stride_batch;
    return l->offset + (size_t)b * sb + (size_t)s * ss + (size_t)h * sh + (size_t)x;
}

flashcl_status flashcl_fp8_quantize_host(const flashcl_fp8_quant_desc *desc, const void *src, unsigned char *dst,
                                         float *descale) {
    if (!desc || !src || !dst || !descale)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "flashcl_fp8_quantize_host: a NULL argument");
    const fp8_format *f = format_of(desc->format);
    if (!f)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "flashcl_fp8_quantize_host: format %d is not FLASHCL_FLOAT8_E4M3 or _E5M2",
                            (int)desc->format);
    if (desc->src_dtype != FLASHCL_FLOAT32 && desc->src_dtype != FLASHCL_FLOAT16 &&
        desc->src_dtype != FLASHCL_BFLOAT16)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "flashcl_fp8_quantize_host: src_dtype %d is not float32, float16 or bfloat16",
                            (int)desc->src_dtype);
    if (desc->batch < 1 || desc->seqlen < 1 || desc->heads < 1 || desc->head_dim < 1)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_SHAPE,
                            "flashcl_fp8_quantize_host: batch %d, seqlen %d, heads %d, head_dim %d (all >= 1)",
                            desc->batch, desc->seqlen, desc->heads, desc->head_dim);
    /* Pass 1: amax per group, refusing non-finite input before any write. */
    const int groups = desc->per_head ? desc->batch * desc->heads : 1;
    float *amax = calloc((size_t)groups, sizeof *amax);
    if (!amax)
        return flashcl_fail(NULL, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    for (int b = 0; b < desc->batch; ++b)
        for (int h = 0; h < desc->heads; ++h) {
            float *a = &amax[desc->per_head ? b * desc->heads + h : 0];
            for (int s = 0; s < desc->seqlen; ++s)
                for (int x = 0; x < desc->head_dim; ++x) {
                    const float v = flashcl_host_load(src, desc->src_dtype, src_index(desc, b, s, h, x));
                    if (!isfinite(v)) {
                        free(amax);
                        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT,
                                            "flashcl_fp8_quantize_host: %s at (batch %d, seq %d, head %d, dim %d)",
                                            isnan(v) ? "NaN" : "infinity", b, s, h, x);
                    }
                    *a = fmaxf(*a, fabsf(v));
                }
        }
    for (int g = 0; g < groups; ++g)
        descale[g] = amax[g] > 0.0f ? amax[g] / f->max : 1.0f;
    free(amax);
    /* Pass 2: x / descale, rounded. */
    size_t o = 0;
    for (int b = 0; b < desc->batch; ++b)
        for (int s = 0; s < desc->seqlen; ++s)
            for (int h = 0; h < desc->heads; ++h) {
                const float sc = descale[desc->per_head ? b * desc->heads + h : 0];
                for (int x = 0; x < desc->head_dim; ++x)
                    dst[o++] = flashcl_fp8_encode(desc->format,
                                                  flashcl_host_load(src, desc->src_dtype, src_index(desc, b, s, h, x)) / sc);
            }
    flashcl_clear_error(NULL);
    return FLASHCL_SUCCESS;
}
