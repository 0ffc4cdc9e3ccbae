/* ref_spec.c: the reference of speculative-decoding verification: Philox4x32-10, fixed-point sampling, the rules.
 *
 * This file is the specification of flashcl_spec_verify, written to be read.
 * The device kernel (cl/spec_verify.cl) and the library's host path
 * (src/spec_host.c) must emit exactly the tokens this code emits, so every
 * choice that could differ between implementations is pinned down here:
 *
 * - Randomness: Philox4x32-10 (Salmon et al., SC'11), counter-based, so a
 *   draw depends only on (seed, offset, sequence, position), never on which
 *   work-item ran first. Position i of sequence b uses one block:
 *     key = (seed & 0xffffffff, seed >> 32), ctr = (b, i, offset lo, offset hi)
 *     u  = (w0 >> 8) * 2^-24            the acceptance uniform, in [0, 1)
 *     r  = (w3 << 32) | w2              the 64-bit draw for sampling
 * - Sums are never float sums (whose value depends on the order of a
 *   parallel reduction): every weight becomes an integer, trunc(w * 2^s), and
 *   integers add associatively. The token drawn from weights W with total S
 *   is the first y whose inclusive prefix sum exceeds T = floor(r * S / 2^64).
 * - Floating-point steps are single IEEE operations (one multiply, one
 *   subtraction, one compare), each correctly rounded everywhere; no fused
 *   multiply-add (the kernel turns FP_CONTRACT off, C11 mode keeps GCC from
 *   contracting, baseline x86-64 has no FMA), no division, no library exp.
 * - Logits: softmax(x / T) with exp2 evaluated by the fixed polynomial below,
 *   so the device and this file round identically.
 *
 * The rules for one sequence, with w_p(i, y) and w_q(i, y) the (unnormalised)
 * weights of rows p_i and q_i and Z'_p(i), Z'_q(i) their totals (1 for
 * probabilities):
 *   accept d_i   iff  u * (w_q(i,d) * Z'_p(i)) < w_p(i,d) * Z'_q(i)
 *                     [u < p/q with the normalisers multiplied across]
 *   residual     W(y) = trunc(max(0, w_p(i,y) Z'_q(i) - w_q(i,y) Z'_p(i)) * 2^(39-e))
 *                     with 2^(e-1) <= Z'_q(i) < 2^e, so every W < 2^39
 *                     [max(0, p - q) up to the positive factor Z'_p Z'_q]
 *   bonus        W(y) = trunc(w_p(k, y) * 2^39)
 *   a residual whose integer total is 0 (p <= q everywhere up to rounding:
 *   a rejection then has probability ~0) falls back to the weights of p_i.
 * Totals stay below vocab * 2^39 <= 2^59, so nothing overflows 64 bits.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "flashcl_ref.h"

/* ----------------------------------------------------------------------------
 * Philox4x32-10 and the 64-bit high product
 * ------------------------------------------------------------------------- */

void flashcl_ref_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    // Ten rounds of two 32x32->64 multiplies with the Weyl-bumped key.
    // Constants from Random123's philox.h.
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)M0 * c0, p1 = (uint64_t)M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += W0;
        k1 += W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint64_t flashcl_ref_mulhi64(uint64_t a, uint64_t b) {
    // floor(a * b / 2^64) from four 32x32 products (what OpenCL's mul_hi does)
    uint64_t a_lo = (uint32_t)a, a_hi = a >> 32, b_lo = (uint32_t)b, b_hi = b >> 32;
    uint64_t ll = a_lo * b_lo, lh = a_lo * b_hi, hl = a_hi * b_lo, hh = a_hi * b_hi;
    uint64_t mid = (ll >> 32) + (uint32_t)lh + (uint32_t)hl;
    return hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
}

/* The block of sequence b, position i. */
static void draw(const flashcl_spec_desc *d, int b, int i, float *u, uint64_t *r) {
    uint32_t ctr[4] = {(uint32_t)b, (uint32_t)i, (uint32_t)d->offset, (uint32_t)(d->offset >> 32)};
    uint32_t key[2] = {(uint32_t)d->seed, (uint32_t)(d->seed >> 32)};
    uint32_t w[4];
    flashcl_ref_philox4x32_10(ctr, key, w);
    *u = (float)(w[0] >> 8) * 0x1p-24f; // exact: 24 bits, scaled by a power of two
    *r = ((uint64_t)w[3] << 32) | w[2];
}

/* ----------------------------------------------------------------------------
 * exp2 on [-40, 0] with fixed float operations
 * ------------------------------------------------------------------------- */

float flashcl_ref_spec_exp2(float x) {
    // Weights below 2^-40 are 0: their fixed-point value trunc(w * 2^39) is 0
    // anyway, and it keeps the result a normal float. -inf (a masked logit)
    // lands here too.
    if (!(x >= -40.0f))
        return 0.0f;
    // x = n + f with n = floor(x) and f in [0, 1); both steps are exact.
    float n = floorf(x);
    float f = x - n;
    // 2^f = e^(f ln 2): Taylor coefficients ln2^j / j!, degree 9 (truncation
    // below 1e-8 on [0, 1)), evaluated by Horner with one rounding per step.
    static const float c[10] = {1.0f,
                                0.693147180559945f,
                                0.240226506959101f,
                                0.0555041086648216f,
                                0.00961812910762848f,
                                0.00133335581464284f,
                                0.000154035303933816f,
                                1.52527338040598e-05f,
                                1.32154867901443e-06f,
                                1.01780860092397e-07f};
    float p = c[9];
    for (int j = 8; j >= 0; j--) {
        float t = p * f;
        p = t + c[j];
    }
    return ldexpf(p, (int)n); // exact: a power-of-two scaling of a normal float
}

/* ----------------------------------------------------------------------------
 * verification
 * ------------------------------------------------------------------------- */

/* What one distribution row becomes after its pass: the normaliser Z' (1
 * for probabilities), the logits' maximum, and whether it was valid. */
typedef struct row_info {
    float z;   // Z' = (sum of fixed-point weights) * 2^-39 as a float
    float max; // logits: the row maximum
    int bad;   // 0 or a FLASHCL_SPEC_BAD_* code
} row_info;

/* The weight of token y in a row: the probability itself, or exp2 of the
 * scaled logit distance to the row maximum. */
static float weight(const flashcl_spec_desc *d, const float *row, const row_info *info, float s, int y) {
    if (!d->logits)
        return row[y];
    float t = row[y] - info->max;
    return flashcl_ref_spec_exp2(t * s);
}

/* Pass over one row: validity, and for sampling its normaliser. */
static row_info check_row(const flashcl_spec_desc *d, const float *row, float s, uint64_t lo, uint64_t hi) {
    row_info info = {1.0f, 0.0f, 0};
    const int V = d->vocab;
    if (!d->logits) {
        // probabilities: finite, >= 0, fixed-point sum within the tolerance
        uint64_t sum = 0;
        int nonfinite = 0, negative = 0;
        for (int y = 0; y < V; y++) {
            float v = row[y];
            if (!isfinite(v))
                nonfinite = 1;
            else if (v < 0.0f)
                negative = 1;
            else
                sum += (uint64_t)(v * 0x1p39f);
        }
        info.bad = nonfinite ? FLASHCL_SPEC_BAD_VALUE
                   : negative ? FLASHCL_SPEC_BAD_NEGATIVE
                   : (sum < lo || sum > hi) ? FLASHCL_SPEC_BAD_SUM
                                            : 0;
        return info;
    }
    // logits: pass 1, the maximum (NaN and +inf are errors, -inf is a mask)
    float m = -INFINITY;
    for (int y = 0; y < V; y++) {
        float v = row[y];
        if (isnan(v) || v == INFINITY) {
            info.bad = FLASHCL_SPEC_BAD_VALUE;
            return info;
        }
        m = v > m ? v : m;
    }
    if (m == -INFINITY) {
        info.bad = FLASHCL_SPEC_BAD_ROW;
        return info;
    }
    info.max = m;
    if (d->greedy)
        return info;
    // pass 2: the fixed-point total of the exp2 weights (the maximum alone
    // contributes exactly 2^39, so Z' >= 1)
    uint64_t sum = 0;
    for (int y = 0; y < V; y++)
        sum += (uint64_t)(weight(d, row, &info, s, y) * 0x1p39f);
    info.z = ldexpf((float)sum, -39);
    return info;
}

/* argmax of a row, the smallest index on ties. */
static int argmax(const float *row, int V) {
    int best = 0;
    for (int y = 1; y < V; y++)
        if (row[y] > row[best])
            best = y;
    return best;
}

/* The first y whose inclusive prefix sum of W exceeds mulhi64(r, S). */
static int pick(const uint64_t *W, int V, uint64_t r) {
    uint64_t S = 0;
    for (int y = 0; y < V; y++)
        S += W[y];
    uint64_t T = flashcl_ref_mulhi64(r, S);
    uint64_t prefix = 0;
    for (int y = 0; y < V; y++) {
        prefix += W[y];
        if (prefix > T)
            return y;
    }
    return V - 1; // unreachable when S > 0 (T < S); callers ensure S > 0
}

void flashcl_ref_spec_verify(const flashcl_spec_desc *d, const int *draft, const float *q, const float *p,
                             int *accepted, int *tokens) {
    // draft: [batch][k]; q: [batch][k][V]; p: [batch][k+1][V] (from their
    // offsets); accepted: [batch]; tokens: [batch][k+1] (from their offsets)
    const int B = d->batch, K = d->num_draft, V = d->vocab;
    const double tol = d->tolerance > 0.0f ? d->tolerance : 1e-3;
    // the accepted range of fixed-point row sums, [ceil((1-tol) 2^39), floor((1+tol) 2^39)]
    const uint64_t lo = (uint64_t)ceil((1.0 - tol) * 0x1p39), hi = (uint64_t)floor((1.0 + tol) * 0x1p39);
    // logits are scaled by log2(e) / temperature, rounded once to float
    const float s = d->logits && !d->greedy ? (float)(1.4426950408889634 / (double)d->temperature)
                    : 1.0f;
    row_info *qi = malloc((size_t)K * sizeof *qi), *pi = malloc(((size_t)K + 1) * sizeof *pi);
    uint64_t *W = malloc((size_t)V * sizeof *W);
    for (int b = 0; b < B; b++) {
        const int *db = draft + d->draft_offset + (size_t)b * K;
        const float *qb = q ? q + d->q_offset + (size_t)b * K * V : NULL;
        const float *pb = p + d->p_offset + (size_t)b * (K + 1) * V;
        int *out = tokens + d->tokens_offset + (size_t)b * (K + 1);
        for (int j = 0; j <= K; j++)
            out[j] = -1;
        if (!qi || !pi || !W) { // no memory: report every sequence as invalid
            accepted[d->accepted_offset + b] = FLASHCL_SPEC_BAD_VALUE;
            continue;
        }

        // pass 1: validate draft tokens, then every row (q rows only when sampling)
        int bad = 0;
        for (int i = 0; i < K && !bad; i++)
            if (db[i] < 0 || db[i] >= V)
                bad = FLASHCL_SPEC_BAD_TOKEN;
        for (int i = 0; i < K && !bad && !d->greedy; i++)
            bad = (qi[i] = check_row(d, qb + (size_t)i * V, s, lo, hi)).bad;
        for (int i = 0; i <= K && !bad; i++)
            bad = (pi[i] = check_row(d, pb + (size_t)i * V, s, lo, hi)).bad;
        if (bad) {
            accepted[d->accepted_offset + b] = bad;
            continue;
        }

        // pass 2: walk the drafts in order
        int n = 0, done = 0;
        for (int i = 0; i < K && !done; i++) {
            const float *prow = pb + (size_t)i * V;
            const int x = db[i];
            if (d->greedy) {
                int best = argmax(prow, V);
                if (best == x) {
                    out[n++] = x;
                } else {
                    out[n] = best;
                    done = 1;
                }
                continue;
            }
            const float *qrow = qb + (size_t)i * V;
            float u;
            uint64_t r;
            draw(d, b, i, &u, &r);
            float a = weight(d, prow, &pi[i], s, x) * qi[i].z; // p(x), times Z'_q
            float c = weight(d, qrow, &qi[i], s, x) * pi[i].z; // q(x), times Z'_p
            float uc = u * c;
            if (uc < a) {
                out[n++] = x;
                continue;
            }
            // rejected: draw from max(0, p - q), in fixed point below 2^39
            int e;
            frexpf(qi[i].z, &e); // Z'_q < 2^e
            uint64_t S = 0;
            for (int y = 0; y < V; y++) {
                float ay = weight(d, prow, &pi[i], s, y) * qi[i].z;
                float cy = weight(d, qrow, &qi[i], s, y) * pi[i].z;
                float diff = ay - cy;
                W[y] = diff > 0.0f ? (uint64_t)ldexpf(diff, 39 - e) : 0;
                S += W[y];
            }
            if (S == 0) // p <= q everywhere after rounding: fall back to p
                for (int y = 0; y < V; y++)
                    W[y] = (uint64_t)(weight(d, prow, &pi[i], s, y) * 0x1p39f);
            out[n] = pick(W, V, r);
            done = 1;
        }

        // pass 3: every draft accepted: the bonus token from p_k
        if (!done) {
            const float *prow = pb + (size_t)K * V;
            if (d->greedy) {
                out[n] = argmax(prow, V);
            } else {
                float u;
                uint64_t r;
                draw(d, b, K, &u, &r);
                for (int y = 0; y < V; y++)
                    W[y] = (uint64_t)(weight(d, prow, &pi[K], s, y) * 0x1p39f);
                out[n] = pick(W, V, r);
            }
        }
        accepted[d->accepted_offset + b] = n;
    }
    free(qi);
    free(pi);
    free(W);
}
