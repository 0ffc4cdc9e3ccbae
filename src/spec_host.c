/* spec_host.c: speculative-decoding verification in C for host contexts, bit-exact with cl/spec_verify.cl.
 *
 * Written apart from host_ref/ref_spec.c (the specification) so the two check
 * each other, and shaped like the kernel instead: one sequence at a time,
 * rows summarised first (validity, logits maximum, fixed-point total), then
 * the drafts walked in order. Every float step is a single IEEE operation
 * in its own statement (C11 mode does not contract them into fma); sums are
 * 64-bit integers, so their order does not matter.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"

typedef struct row_sum {
    float z, m; /* Z' (1 for probabilities) and the logits maximum */
} row_sum;

typedef struct seq_job {
    const flashcl_spec_desc *d;
    const spec_consts *c;
    row_sum *rq, *rp;
    uint64_t *w; /* vocab fixed-point weights */
} seq_job;

static void philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; ++r) {
        uint64_t a = (uint64_t)0xD2511F53u * c[0], b = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t x0 = (uint32_t)(b >> 32) ^ c[1] ^ k0, x2 = (uint32_t)(a >> 32) ^ c[3] ^ k1;
        c[0] = x0;
        c[1] = (uint32_t)b;
        c[2] = x2;
        c[3] = (uint32_t)a;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

static uint64_t mul_hi64(uint64_t a, uint64_t b) {
#if defined(__SIZEOF_INT128__)
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
#else
    uint64_t al = a & 0xffffffffu, ah = a >> 32, bl = b & 0xffffffffu, bh = b >> 32;
    uint64_t t = (al * bl >> 32) + (ah * bl & 0xffffffffu) + (al * bh & 0xffffffffu);
    return ah * bh + (ah * bl >> 32) + (al * bh >> 32) + (t >> 32);
#endif
}

static float exp2_fixed(float x) {
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
    if (!(x >= -40.0f))
        return 0.0f;
    const float n = floorf(x);
    const float f = x - n;
    float p = c[9];
    for (int j = 8; j >= 0; --j) {
        const float t = p * f;
        p = t + c[j];
    }
    return ldexpf(p, (int)n);
}

static float weight(const seq_job *j, const float *row, float m, int y) {
    if (!j->d->logits)
        return row[y];
    const float t = row[y] - m;
    return exp2_fixed(t * j->c->s);
}

/* Summarises a row into *rs; returns 0 or a FLASHCL_SPEC_BAD_* code. */
static int summarise(const seq_job *j, const float *row, row_sum *rs) {
    const int V = j->d->vocab;
    rs->z = 1.0f;
    rs->m = 0.0f;
    if (!j->d->logits) {
        uint64_t sum = 0;
        int flags = 0;
        for (int y = 0; y < V; ++y) {
            if (!isfinite(row[y]))
                flags |= 1;
            else if (row[y] < 0.0f)
                flags |= 2;
            else
                sum += (uint64_t)(row[y] * 0x1p39f);
        }
        if (flags & 1)
            return FLASHCL_SPEC_BAD_VALUE;
        if (flags & 2)
            return FLASHCL_SPEC_BAD_NEGATIVE;
        return sum < j->c->lo || sum > j->c->hi ? FLASHCL_SPEC_BAD_SUM : 0;
    }
    float m = -INFINITY;
    for (int y = 0; y < V; ++y) {
        if (isnan(row[y]) || row[y] == INFINITY)
            return FLASHCL_SPEC_BAD_VALUE;
        if (row[y] > m)
            m = row[y];
    }
    if (m == -INFINITY)
        return FLASHCL_SPEC_BAD_ROW;
    rs->m = m;
    if (!j->d->greedy) {
        uint64_t sum = 0;
        for (int y = 0; y < V; ++y)
            sum += (uint64_t)(weight(j, row, m, y) * 0x1p39f);
        rs->z = ldexpf((float)sum, -39);
    }
    return 0;
}

static int first_max(const float *row, int V) {
    int at = 0;
    for (int y = 1; y < V; ++y)
        if (row[y] > row[at])
            at = y;
    return at;
}

/* Draws from j->w[0 .. V) with the 64-bit draw r; -1 when the weights total 0. */
static int draw_token(const seq_job *j, uint64_t r) {
    const int V = j->d->vocab;
    uint64_t total = 0, acc = 0;
    for (int y = 0; y < V; ++y)
        total += j->w[y];
    if (!total)
        return -1;
    const uint64_t t = mul_hi64(r, total);
    for (int y = 0; y < V; ++y)
        if ((acc += j->w[y]) > t)
            return y;
    return -1;
}

static void p_weights(const seq_job *j, const float *row, float m) {
    for (int y = 0; y < j->d->vocab; ++y)
        j->w[y] = (uint64_t)(weight(j, row, m, y) * 0x1p39f);
}

/* One sequence: *acc gets the accepted count or a BAD code; out[0 .. k]. */
static void verify_one(const seq_job *j, int b, const int *draft, const float *q, const float *p, int *acc,
                       int *out) {
    const flashcl_spec_desc *d = j->d;
    const int K = d->num_draft, V = d->vocab;
    for (int i = 0; i <= K; ++i)
        out[i] = -1;
    int bad = 0;
    for (int i = 0; i < K && !bad; ++i)
        if (draft[i] < 0 || draft[i] >= V)
            bad = FLASHCL_SPEC_BAD_TOKEN;
    for (int i = 0; i < K && !bad && !d->greedy; ++i)
        bad = summarise(j, q + (size_t)i * V, &j->rq[i]);
    for (int i = 0; i <= K && !bad; ++i)
        bad = summarise(j, p + (size_t)i * V, &j->rp[i]);
    if (bad) {
        *acc = bad;
        return;
    }
    const uint32_t k0 = (uint32_t)d->seed, k1 = (uint32_t)(d->seed >> 32);
    int n = 0;
    for (int i = 0; i <= K; ++i) {
        const float *prow = p + (size_t)i * V;
        if (d->greedy) {
            const int best = first_max(prow, V);
            if (i < K && best == draft[i]) {
                out[n++] = best;
                continue;
            }
            out[n] = best;
            break;
        }
        uint32_t w[4] = {(uint32_t)b, (uint32_t)i, (uint32_t)d->offset, (uint32_t)(d->offset >> 32)};
        philox(w, k0, k1);
        const uint64_t r = ((uint64_t)w[3] << 32) | w[2];
        const float mp = j->rp[i].m;
        if (i == K) { /* every draft accepted: the bonus token */
            p_weights(j, prow, mp);
            out[n] = draw_token(j, r);
            break;
        }
        const float *qrow = q + (size_t)i * V;
        const float zp = j->rp[i].z, zq = j->rq[i].z, mq = j->rq[i].m;
        const float u = (float)(w[0] >> 8) * 0x1p-24f;
        const float a = weight(j, prow, mp, draft[i]) * zq;
        const float c = weight(j, qrow, mq, draft[i]) * zp;
        const float uc = u * c;
        if (uc < a) {
            out[n++] = draft[i];
            continue;
        }
        int e;
        frexpf(zq, &e);
        for (int y = 0; y < V; ++y) {
            const float ay = weight(j, prow, mp, y) * zq;
            const float cy = weight(j, qrow, mq, y) * zp;
            const float diff = ay - cy;
            j->w[y] = diff > 0.0f ? (uint64_t)ldexpf(diff, 39 - e) : 0;
        }
        int tok = draw_token(j, r);
        if (tok < 0) { /* a zero residual: p_i's weights */
            p_weights(j, prow, mp);
            tok = draw_token(j, r);
        }
        out[n] = tok;
        break;
    }
    *acc = n;
}

void flashcl_spec_consts(const flashcl_spec_desc *d, spec_consts *c) {
    const double tol = d->tolerance > 0.0f ? d->tolerance : 1e-3;
    c->lo = (uint64_t)ceil((1.0 - tol) * 0x1p39);
    c->hi = (uint64_t)floor((1.0 + tol) * 0x1p39);
    c->s = d->logits && !d->greedy ? (float)(1.4426950408889634 / (double)d->temperature) : 1.0f;
}

int flashcl_spec_host_verify(const flashcl_spec_desc *d, const spec_consts *c, const int *draft,
                             const float *q, const float *p, int *accepted, int *tokens) {
    const int K = d->num_draft, V = d->vocab;
    seq_job j = {d, c, malloc((size_t)K * sizeof(row_sum)), malloc(((size_t)K + 1) * sizeof(row_sum)),
                 malloc((size_t)V * sizeof(uint64_t))};
    if (!j.rq || !j.rp || !j.w) {
        free(j.rq);
        free(j.rp);
        free(j.w);
        return -1;
    }
    for (int b = 0; b < d->batch; ++b)
        verify_one(&j, b, draft + d->draft_offset + (size_t)b * K,
                   q ? q + d->q_offset + (size_t)b * K * V : NULL, p + d->p_offset + (size_t)b * (K + 1) * V,
                   accepted + d->accepted_offset + b, tokens + d->tokens_offset + (size_t)b * (K + 1));
    free(j.rq);
    free(j.rp);
    free(j.w);
    return 0;
}
