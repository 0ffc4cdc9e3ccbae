/* ref_fp8.c: the OCP 8-bit formats by definition, for checking src/fp8.c.
 *
 * Decoding follows the format's fields literally, in double. Encoding does
 * not compute anything clever: it decodes all 256 codes once and picks the
 * nearest finite value (ties to the even code, whose last mantissa bit is
 * 0), then applies cvt.rn.satfinite's rules (past the largest magnitude:
 * +-max; NaN: 0x7f with the sign). A different algorithm from src/fp8.c's
 * rounding by the binade's quantum, so each checks the other.
 */
#include <math.h>

#include "flashcl_ref.h"

double flashcl_ref_fp8_decode(flashcl_dtype format, unsigned char bits) {
    const int e4m3 = format == FLASHCL_FLOAT8_E4M3;
    const int man_bits = e4m3 ? 3 : 2, exp_bits = e4m3 ? 4 : 5, bias = e4m3 ? 7 : 15;
    const int exponent = (bits >> man_bits) & ((1 << exp_bits) - 1), mantissa = bits & ((1 << man_bits) - 1);
    const double sign = bits & 0x80 ? -1.0 : 1.0;
    if (e4m3 && exponent == 15 && mantissa == 7)
        return NAN; /* e4m3fn: S.1111.111 is the only NaN; no infinity */
    if (!e4m3 && exponent == 31)
        return mantissa ? NAN : sign * INFINITY;
    if (exponent == 0)
        return sign * ldexp((double)mantissa / (1 << man_bits), 1 - bias);
    return sign * ldexp(1.0 + (double)mantissa / (1 << man_bits), exponent - bias);
}

unsigned char flashcl_ref_fp8_encode(flashcl_dtype format, double value) {
    const unsigned char max_code = format == FLASHCL_FLOAT8_E4M3 ? 0x7e : 0x7b;
    const unsigned char sign = signbit(value) ? 0x80 : 0;
    if (isnan(value))
        return (unsigned char)(0x7f | sign);
    const double a = fabs(value);
    if (a >= flashcl_ref_fp8_decode(format, max_code))
        return (unsigned char)(sign | max_code);
    unsigned best = 0;
    double best_dist = INFINITY;
    for (unsigned code = 0; code <= max_code; ++code) {
        const double dist = fabs(flashcl_ref_fp8_decode(format, (unsigned char)code) - a);
        if (dist < best_dist || (dist == best_dist && (code & 1) == 0)) {
            best = code;
            best_dist = dist;
        }
    }
    return (unsigned char)(sign | best);
}

double flashcl_ref_fp8_descale(const flashcl_attention_desc *desc, int tensor, int b, int h, int row) {
    // sc: (1) per tensor; (B, H) per head; (B, H, ceil(N / block_rows)) per
    // block of rows, for q and k only: v's factor scales the output, which
    // mixes all of v's rows, so it is always per (batch, head).
    if (desc->dtype != FLASHCL_FLOAT8_E4M3 && desc->dtype != FLASHCL_FLOAT8_E5M2)
        return 1.0;
    const flashcl_fp8_scales *s = &desc->fp8;
    const float *sc = tensor == 0 ? s->q_descale : tensor == 1 ? s->k_descale : s->v_descale;
    if (!sc)
        return 1.0;
    if (!s->per_head)
        return sc[0];
    const int heads = tensor == 0 ? desc->heads_q : desc->heads_k;
    const int seqlen = tensor == 0 ? desc->seqlen_q : desc->seqlen_k;
    const int by_block = tensor < 2 && s->block_rows > 0;
    const long blocks = by_block ? ((long)seqlen - 1) / s->block_rows + 1 : 1;
    return sc[((long)b * heads + h) * blocks + (by_block ? row / s->block_rows : 0)];
}
