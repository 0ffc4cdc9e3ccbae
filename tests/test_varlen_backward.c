/* test_varlen_backward.c: flashcl_varlen_backward against the dense backward per sequence, host_ref, and its errors.
 *
 * Each case packs sequences of mixed lengths (1, Nq < Nk, Nq > Nk, one
 * without keys, one without queries) and runs flashcl_varlen_forward for out
 * and LSE, then flashcl_varlen_backward into poisoned gradients with a
 * scratch of exactly the queried size, and checks every sequence
 *   (a) against flashcl_attention_backward on that sequence alone, fed the
 *       same out and LSE: dk and dv bitwise (they are always deterministic),
 *       dq bitwise in deterministic mode, else within twice the reference
 *       tolerance;
 *   (b) against host_ref's double backward with test_backward's rule
 *       (flashcl_ref_check_backward); dq of a sequence without keys and dk,
 *       dv of one without queries exactly 0; elements the padded layouts
 *       skip still poisoned.
 * One case runs again on an out-of-order queue and must give the same bits.
 * Then one test per invalid argument: a status, a message, outputs untouched.
 * Shapes are few on purpose: each (dtype, head dim) is a PoCL compile; they
 * are the pairs test_backward builds. FLASHCL_TEST_SEED replays a run.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))
#define MAX_SEQS 8

static int failures;
static uint64_t seed_counter;

static uint64_t next_seed(void) {
    return test_seed() + 104729u * ++seed_counter;
}

/* ---- one packed batch -------------------------------------------------------------- */

typedef struct vcase {
    const char *name;
    flashcl_dtype dtype;
    int heads_q, heads_k, head_dim, causal;
    float softcap, scale;
    double input_scale; /* stddev of q and k (1 if 0) */
    int padded;         /* padded strides and a nonzero offset on every tensor */
    int deterministic;
    int num_splits;     /* the forward's */
    int num_seqs;
    int nq[MAX_SEQS], nk[MAX_SEQS];
} vcase;

/* Tensors of a batch: q, k, v, out, dout, dq, dk, dv. */
enum { Q, K, V, OUT, DOUT, DQ, DK, DV, NT };
static const int is_key[NT] = {0, 1, 1, 0, 0, 0, 1, 1};

typedef struct batch {
    vcase c;
    flashcl_varlen_desc d;
    flashcl_backward_options o;
    int cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1];
    flashcl_layout lay[NT];
    size_t elems[NT], es, lse_count;
    void *host[NT];
    float *lse;
} batch;

static const size_t lse_pad = 5; /* the LSE sits at a nonzero offset */

/* Lays out one tensor of `tokens` rows and returns its element count;
 * padded: 2 spare elements per head row, 5 per token, and an offset that
 * differs per tensor; else all-zero strides (packed, the default). */
static size_t set_layout(flashcl_layout *l, int padded, int tokens, int heads, int D, int salt) {
    memset(l, 0, sizeof *l);
    if (!padded)
        return (size_t)tokens * (size_t)heads * (size_t)D;
    l->offset = 3 + (size_t)salt;
    l->stride_head = (size_t)D + 2;
    l->stride_seq = (size_t)heads * l->stride_head + 5;
    return l->offset + (size_t)tokens * l->stride_seq;
}

/* Element (t, h, 0) of tensor i. */
static size_t at(const batch *b, int i, int t, int h) {
    const int heads = is_key[i] ? b->c.heads_k : b->c.heads_q, D = b->c.head_dim;
    const flashcl_layout *l = &b->lay[i];
    size_t ss = l->stride_seq ? l->stride_seq : (size_t)heads * D, sh = l->stride_head ? l->stride_head : (size_t)D;
    return l->offset + (size_t)t * ss + (size_t)h * sh;
}

static void batch_init(batch *b, const vcase *c, uint64_t seed) {
    memset(b, 0, sizeof *b);
    b->c = *c;
    b->es = flashcl_dtype_size(c->dtype);
    for (int i = 0; i < c->num_seqs; ++i) {
        b->cu_q[i + 1] = b->cu_q[i] + c->nq[i];
        b->cu_k[i + 1] = b->cu_k[i] + c->nk[i];
    }
    const int n = c->num_seqs;
    for (int i = 0; i < NT; ++i)
        b->elems[i] = set_layout(&b->lay[i], c->padded, is_key[i] ? b->cu_k[n] : b->cu_q[n],
                                 is_key[i] ? c->heads_k : c->heads_q, c->head_dim, i);
    flashcl_varlen_desc *d = &b->d;
    d->dtype = c->dtype;
    d->num_seqs = n;
    d->heads_q = c->heads_q;
    d->heads_k = c->heads_k;
    d->head_dim = c->head_dim;
    d->cu_seqlens_q = b->cu_q;
    d->cu_seqlens_k = b->cu_k;
    d->scale = c->scale;
    d->causal = c->causal;
    d->softcap = c->softcap;
    d->num_splits = c->num_splits;
    d->q = b->lay[Q], d->k = b->lay[K], d->v = b->lay[V], d->out = b->lay[OUT];
    b->o.dout = b->lay[DOUT], b->o.dq = b->lay[DQ], b->o.dk = b->lay[DK], b->o.dv = b->lay[DV];
    b->o.deterministic = c->deterministic;
    b->lse_count = lse_pad + (size_t)c->heads_q * b->cu_q[n];
    b->lse = test_xmalloc(b->lse_count * sizeof(float));
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    const double sd = c->input_scale > 0 ? c->input_scale : 1.0;
    for (int i = 0; i < NT; ++i) {
        b->host[i] = test_xmalloc(b->elems[i] * b->es);
        if (i == OUT || i >= DQ)
            flashcl_ref_poison(b->host[i], c->dtype, b->elems[i]);
        else
            flashcl_ref_fill_normal(&rng, b->host[i], c->dtype, b->elems[i], i == Q || i == K ? sd : 1.0);
    }
    flashcl_ref_poison(b->lse, FLASHCL_FLOAT32, b->lse_count);
}

static void batch_free(batch *b) {
    for (int i = 0; i < NT; ++i)
        free(b->host[i]);
    free(b->lse);
}

/* Sequence s as the dense batch-1 problem, its tensors views of the batch's. */
static void dense_view(const batch *b, int s, flashcl_attention_desc *a, flashcl_backward_options *o) {
    memset(a, 0, sizeof *a);
    memset(o, 0, sizeof *o);
    a->dtype = b->c.dtype;
    a->batch = 1;
    a->heads_q = b->c.heads_q;
    a->heads_k = b->c.heads_k;
    a->seqlen_q = b->c.nq[s];
    a->seqlen_k = b->c.nk[s];
    a->head_dim = b->c.head_dim;
    a->scale = b->c.scale;
    a->causal = b->c.causal;
    a->softcap = b->c.softcap;
    flashcl_layout *l[NT] = {&a->q, &a->k, &a->v, &a->out, &o->dout, &o->dq, &o->dk, &o->dv};
    for (int i = 0; i < NT; ++i) {
        const int heads = is_key[i] ? b->c.heads_k : b->c.heads_q;
        l[i]->offset = at(b, i, is_key[i] ? b->cu_k[s] : b->cu_q[s], 0);
        l[i]->stride_seq = at(b, i, 1, 0) - at(b, i, 0, 0);
        l[i]->stride_head = heads > 1 ? at(b, i, 0, 1) - at(b, i, 0, 0) : (size_t)b->c.head_dim;
        l[i]->stride_batch = 0;
    }
    o->deterministic = b->c.deterministic;
}

/* Forward then backward on ctx; b->host[OUT], b->lse and the gradients are
 * read back. Every call is followed by clFinish (the queue may be out of order). */
static flashcl_status run_varlen(flashcl_context *ctx, batch *b) {
    cl_command_queue queue = flashcl_context_cl_queue(ctx);
    cl_mem m[NT], lse = test_upload(ctx, b->lse, b->lse_count * 4), fs = NULL, bs = NULL;
    for (int i = 0; i < NT; ++i)
        m[i] = test_upload(ctx, b->host[i], b->elems[i] * b->es);
    size_t fbytes = 0, bbytes = 0;
    flashcl_status st = flashcl_varlen_scratch_size(ctx, &b->d, &fbytes);
    if (!st && fbytes)
        fs = test_upload(ctx, NULL, fbytes);
    if (!st)
        st = flashcl_varlen_forward(ctx, &b->d, m[Q], m[K], m[V], m[OUT], lse, lse_pad, fs, NULL);
    clFinish(queue);
    if (!st)
        st = flashcl_varlen_backward_scratch_size(ctx, &b->d, &b->o, &bbytes);
    if (!st && bbytes == 0) {
        printf("  scratch size 0\n");
        st = FLASHCL_ERROR_INVALID_ARGUMENT;
    }
    cl_event ev = NULL;
    if (!st) {
        bs = test_upload(ctx, NULL, bbytes); /* exactly the queried size */
        st = flashcl_varlen_backward(ctx, &b->d, &b->o, m[Q], m[K], m[V], m[OUT], m[DOUT], lse, lse_pad, m[DQ],
                                     m[DK], m[DV], bs, &ev);
    }
    if (!st) {
        clWaitForEvents(1, &ev);
        clReleaseEvent(ev);
        clFinish(queue);
        test_download(ctx, m[OUT], b->host[OUT], b->elems[OUT] * b->es);
        test_download(ctx, lse, b->lse, b->lse_count * 4);
        for (int i = DQ; i <= DV; ++i)
            test_download(ctx, m[i], b->host[i], b->elems[i] * b->es);
    } else {
        printf("  %s: %s\n", flashcl_status_string(st), flashcl_last_error(ctx));
    }
    for (int i = 0; i < NT; ++i)
        clReleaseMemObject(m[i]);
    clReleaseMemObject(lse);
    if (fs)
        clReleaseMemObject(fs);
    if (bs)
        clReleaseMemObject(bs);
    return st;
}

/* flashcl_attention_backward on each sequence with keys and queries alone,
 * from the batch's out and LSE, into alone[DQ..DV] (poisoned, same layouts). */
static flashcl_status run_alone(flashcl_context *ctx, const batch *b, void *alone[NT]) {
    cl_command_queue queue = flashcl_context_cl_queue(ctx);
    cl_mem m[NT];
    for (int i = 0; i < NT; ++i)
        m[i] = test_upload(ctx, i >= DQ ? alone[i] : b->host[i], b->elems[i] * b->es);
    flashcl_status st = FLASHCL_SUCCESS;
    for (int s = 0; s < b->c.num_seqs && !st; ++s) {
        const int nq = b->c.nq[s], Hq = b->c.heads_q;
        if (!nq || !b->c.nk[s])
            continue;
        flashcl_attention_desc a;
        flashcl_backward_options o;
        dense_view(b, s, &a, &o);
        float *lse = test_xmalloc((size_t)Hq * nq * sizeof(float)); /* [heads_q][nq] */
        for (int h = 0; h < Hq; ++h)
            for (int t = 0; t < nq; ++t)
                lse[(size_t)h * nq + t] = b->lse[lse_pad + (size_t)h * b->cu_q[b->c.num_seqs] + b->cu_q[s] + t];
        size_t sb = 0;
        st = flashcl_attention_backward_scratch_size(ctx, &a, &o, &sb);
        cl_mem bl = test_upload(ctx, lse, (size_t)Hq * nq * 4), bs = test_upload(ctx, NULL, sb);
        if (!st)
            st = flashcl_attention_backward(ctx, &a, &o, m[Q], m[K], m[V], m[OUT], m[DOUT], bl, 0, m[DQ], m[DK],
                                            m[DV], bs, NULL);
        clFinish(queue);
        clReleaseMemObject(bl);
        clReleaseMemObject(bs);
        free(lse);
    }
    for (int i = DQ; i <= DV && !st; ++i)
        test_download(ctx, m[i], alone[i], b->elems[i] * b->es);
    for (int i = 0; i < NT; ++i)
        clReleaseMemObject(m[i]);
    if (st)
        printf("  alone: %s: %s\n", flashcl_status_string(st), flashcl_last_error(ctx));
    return st;
}

/* Checks a finished batch; returns 1 when everything holds. */
static int check_batch(flashcl_context *ctx, batch *b, const char *name) {
    const int D = b->c.head_dim, n = b->c.num_seqs;
    const flashcl_dtype dt = b->c.dtype;
    int ok = 1;
    double worst[3] = {0, 0, 0};
    size_t alone_bad = 0, nonzero = 0, written = 0;
    void *alone[NT] = {0};
    unsigned char *covered[NT] = {0}; /* 1: the element belongs to the gradient's shape */
    for (int i = DQ; i <= DV; ++i) {
        alone[i] = test_xmalloc(b->elems[i] * b->es);
        flashcl_ref_poison(alone[i], dt, b->elems[i]);
        covered[i] = test_xmalloc(b->elems[i]);
        memset(covered[i], 0, b->elems[i]);
    }
    ok &= run_alone(ctx, b, alone) == FLASHCL_SUCCESS;
    for (int s = 0; s < n; ++s) {
        const int nq = b->c.nq[s], nk = b->c.nk[s];
        /* (b) against host_ref; its dq tolerance also bounds (a) in atomic mode */
        flashcl_ref_grad_report rep;
        memset(&rep, 0, sizeof rep);
        if (nq && nk) {
            flashcl_attention_desc a;
            flashcl_backward_options o;
            dense_view(b, s, &a, &o);
            flashcl_attention_desc_resolve(&a);
            int good = flashcl_ref_check_backward(&a, &o, b->host[Q], b->host[K], b->host[V], b->host[DOUT],
                                                  b->host[DQ], b->host[DK], b->host[DV], 1, &rep);
            for (int t = 0; t < 3; ++t)
                worst[t] = fmax(worst[t], rep.max_err[t] / fmax(rep.tolerance[t], 1e-300));
            if (!good)
                printf("  seq %d (Nq %d, Nk %d): err/tol dq %.2g/%.2g dk %.2g/%.2g dv %.2g/%.2g\n", s, nq, nk,
                       rep.max_err[0], rep.tolerance[0], rep.max_err[1], rep.tolerance[1], rep.max_err[2],
                       rep.tolerance[2]);
            ok &= good;
        }
        for (int i = DQ; i <= DV; ++i) {
            const int tokens = is_key[i] ? nk : nq, first = is_key[i] ? b->cu_k[s] : b->cu_q[s];
            const int heads = is_key[i] ? b->c.heads_k : b->c.heads_q;
            const int bitwise = i != DQ || b->c.deterministic;
            for (int t = 0; t < tokens; ++t)
                for (int h = 0; h < heads; ++h)
                    for (int x = 0; x < D; ++x) {
                        const size_t e = at(b, i, first + t, h) + (size_t)x;
                        const double got = flashcl_ref_load(b->host[i], dt, e);
                        covered[i][e] = 1;
                        if (!nq || !nk) /* an empty side: exact (positive) zeros */
                            nonzero += got != 0.0 || signbit(got);
                        else if (bitwise) /* (a) bit for bit */
                            alone_bad += memcmp((char *)b->host[i] + e * b->es, (char *)alone[i] + e * b->es, b->es) != 0;
                        else /* (a) atomic dq: both within the reference tolerance */
                            alone_bad += !(fabs(got - flashcl_ref_load(alone[i], dt, e)) <= 2.0 * rep.tolerance[0]);
                    }
        }
    }
    /* Elements the layouts skip keep their poison. */
    void *poison = test_xmalloc(b->es);
    flashcl_ref_poison(poison, dt, 1);
    for (int i = DQ; i <= DV; ++i)
        for (size_t e = 0; e < b->elems[i]; ++e)
            written += !covered[i][e] && memcmp((char *)b->host[i] + e * b->es, poison, b->es) != 0;
    if (nonzero)
        printf("  %zu gradient elements of empty sequences are not 0\n", nonzero);
    if (alone_bad)
        printf("  %zu elements differ from the sequences run alone\n", alone_bad);
    if (written)
        printf("  %zu elements outside the gradients' shapes were written\n", written);
    ok &= !nonzero && !alone_bad && !written;
    char what[200];
    snprintf(what, sizeof what, "%s (err/tol dq %.2f dk %.2f dv %.2f)", name, worst[0], worst[1], worst[2]);
    expect(ok, what, &failures);
    free(poison);
    for (int i = DQ; i <= DV; ++i) {
        free(alone[i]);
        free(covered[i]);
    }
    return ok;
}

static void run_batch(flashcl_context *ctx, const vcase *c) {
    batch b;
    batch_init(&b, c, next_seed());
    if (run_varlen(ctx, &b) == FLASHCL_SUCCESS)
        check_batch(ctx, &b, c->name);
    else
        expect(0, c->name, &failures);
    batch_free(&b);
}

/* The same batch on an out-of-order queue of the same device gives the same
 * bits as on the context's own queue (deterministic mode). */
static void out_of_order(flashcl_context *ctx, const vcase *c) {
    cl_command_queue q;
    flashcl_context *ooo = test_out_of_order_context(ctx, "out-of-order queue", &q);
    if (!ooo)
        return;
    uint64_t seed = next_seed();
    batch x, y;
    batch_init(&x, c, seed);
    batch_init(&y, c, seed);
    int ok = run_varlen(ctx, &x) == FLASHCL_SUCCESS && run_varlen(ooo, &y) == FLASHCL_SUCCESS;
    for (int i = DQ; ok && i <= DV; ++i)
        ok = !memcmp(x.host[i], y.host[i], x.elems[i] * x.es);
    expect(ok, "out-of-order queue: the same bits", &failures);
    batch_free(&x);
    batch_free(&y);
    flashcl_context_destroy(ooo);
    clReleaseCommandQueue(q);
}

/* ---- invalid arguments: an error status, a message, and no output touched ------------- */

static void errors(flashcl_context *ctx) {
    const vcase c = {"errors", FLASHCL_FLOAT32, 2, 1, 16, 1, 0, 0, 0, 0, 0, 0, 2, {3, 4}, {5, 2}};
    batch b;
    batch_init(&b, &c, next_seed());
    cl_mem m[NT], lse = test_upload(ctx, b.lse, b.lse_count * 4);
    for (int i = 0; i < NT; ++i)
        m[i] = test_upload(ctx, b.host[i], b.elems[i] * b.es);
    flashcl_varlen_forward(ctx, &b.d, m[Q], m[K], m[V], m[OUT], lse, lse_pad, NULL, NULL);
    clFinish(flashcl_context_cl_queue(ctx));
    size_t need = 0;
    expect(flashcl_varlen_backward_scratch_size(ctx, &b.d, &b.o, &need) == FLASHCL_SUCCESS && need > 0,
           "scratch size query", &failures);
    expect(flashcl_varlen_backward_scratch_size(ctx, &b.d, &b.o, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "scratch size: NULL bytes", &failures);
    expect(flashcl_varlen_backward_scratch_size(NULL, &b.d, &b.o, &need) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "scratch size: NULL context", &failures);
    cl_mem scratch = test_upload(ctx, NULL, need), short_scratch = test_upload(ctx, NULL, need - 4), small = test_upload(ctx, NULL, 64);

    int cu_bad0[3] = {1, 3, 7}, cu_dec[3] = {0, 5, 4}, cu_empty[3] = {0, 0, 0};
    flashcl_varlen_desc bad[9];
    for (int i = 0; i < COUNT(bad); ++i)
        bad[i] = b.d;
    bad[0].cu_seqlens_q = cu_bad0;
    bad[1].cu_seqlens_k = cu_dec;
    bad[2].cu_seqlens_k = NULL;
    bad[3].cu_seqlens_q = cu_empty;
    bad[4].num_seqs = 0;
    bad[5].heads_q = 3; /* heads_k 1 divides it; make heads_k 2 */
    bad[5].heads_k = 2;
    bad[6].head_dim = 300;
    bad[7].dtype = (flashcl_dtype)7;
    bad[8].scale = -1.0f;
    flashcl_backward_options far = b.o;
    far.dq.offset = 1000; /* with padded-free layouts: past the buffer */
    struct {
        const char *what;
        flashcl_status want;
        const flashcl_varlen_desc *desc;
        const flashcl_backward_options *opts;
        int replace; /* buffer index to replace (NT: lse, NT + 1: scratch), -1 none */
        cl_mem with;
        size_t lse_offset;
    } tests[] = {
        {"cu_seqlens_q[0] != 0", FLASHCL_ERROR_INVALID_ARGUMENT, &bad[0], &b.o, -1, NULL, lse_pad},
        {"cu_seqlens_k decreasing", FLASHCL_ERROR_INVALID_ARGUMENT, &bad[1], &b.o, -1, NULL, lse_pad},
        {"cu_seqlens_k NULL", FLASHCL_ERROR_INVALID_ARGUMENT, &bad[2], &b.o, -1, NULL, lse_pad},
        {"no query tokens", FLASHCL_ERROR_INVALID_SHAPE, &bad[3], &b.o, -1, NULL, lse_pad},
        {"num_seqs 0", FLASHCL_ERROR_INVALID_SHAPE, &bad[4], &b.o, -1, NULL, lse_pad},
        {"heads_q not a multiple of heads_k", FLASHCL_ERROR_INVALID_SHAPE, &bad[5], &b.o, -1, NULL, lse_pad},
        {"head_dim 300", FLASHCL_ERROR_INVALID_SHAPE, &bad[6], &b.o, -1, NULL, lse_pad},
        {"unknown dtype", FLASHCL_ERROR_INVALID_ARGUMENT, &bad[7], &b.o, -1, NULL, lse_pad},
        {"negative scale", FLASHCL_ERROR_INVALID_ARGUMENT, &bad[8], &b.o, -1, NULL, lse_pad},
        {"NULL desc", FLASHCL_ERROR_INVALID_ARGUMENT, NULL, &b.o, -1, NULL, lse_pad},
        {"NULL dout buffer", FLASHCL_ERROR_INVALID_ARGUMENT, &b.d, &b.o, DOUT, NULL, lse_pad},
        {"NULL dk buffer", FLASHCL_ERROR_INVALID_ARGUMENT, &b.d, &b.o, DK, NULL, lse_pad},
        {"NULL lse buffer", FLASHCL_ERROR_INVALID_ARGUMENT, &b.d, &b.o, NT, NULL, lse_pad},
        {"NULL scratch", FLASHCL_ERROR_INVALID_ARGUMENT, &b.d, &b.o, NT + 1, NULL, lse_pad},
        {"dq buffer too small", FLASHCL_ERROR_OUT_OF_BOUNDS, &b.d, &b.o, DQ, small, lse_pad},
        {"dv buffer too small", FLASHCL_ERROR_OUT_OF_BOUNDS, &b.d, &b.o, DV, small, lse_pad},
        {"q buffer too small", FLASHCL_ERROR_OUT_OF_BOUNDS, &b.d, &b.o, Q, small, lse_pad},
        {"dq layout past its buffer", FLASHCL_ERROR_OUT_OF_BOUNDS, &b.d, &far, -1, NULL, lse_pad},
        {"lse offset past the buffer", FLASHCL_ERROR_OUT_OF_BOUNDS, &b.d, &b.o, -1, NULL, lse_pad + 1},
        {"scratch one float short", FLASHCL_ERROR_OUT_OF_BOUNDS, &b.d, &b.o, NT + 1, short_scratch, lse_pad},
        {"dq is the q buffer", FLASHCL_ERROR_INVALID_ARGUMENT, &b.d, &b.o, DQ, m[Q], lse_pad},
        {"scratch is the dout buffer", FLASHCL_ERROR_INVALID_ARGUMENT, &b.d, &b.o, NT + 1, m[DOUT], lse_pad},
    };
    for (int t = 0; t < COUNT(tests); ++t) {
        cl_mem x[NT + 2];
        memcpy(x, m, sizeof m);
        x[NT] = lse;
        x[NT + 1] = scratch;
        if (tests[t].replace >= 0)
            x[tests[t].replace] = tests[t].with;
        cl_event ev = (cl_event)&ev; /* must stay as it is on failure */
        flashcl_status st = flashcl_varlen_backward(ctx, tests[t].desc, tests[t].opts, x[Q], x[K], x[V], x[OUT],
                                                    x[DOUT], x[NT], tests[t].lse_offset, x[DQ], x[DK], x[DV],
                                                    x[NT + 1], &ev);
        char what[120];
        snprintf(what, sizeof what, "error: %s -> %d", tests[t].what, st);
        expect(st == tests[t].want && flashcl_last_error(ctx)[0] && ev == (cl_event)&ev, what, &failures);
    }
    setenv("FLASHCL_BWD_PARAMS", "BLOCK_M=16,BOGUS=2", 1);
    flashcl_status st = flashcl_varlen_backward(ctx, &b.d, &b.o, m[Q], m[K], m[V], m[OUT], m[DOUT], lse, lse_pad,
                                                m[DQ], m[DK], m[DV], scratch, NULL);
    unsetenv("FLASHCL_BWD_PARAMS");
    expect(st == FLASHCL_ERROR_INVALID_PARAMS, "error: malformed FLASHCL_BWD_PARAMS", &failures);
    clFinish(flashcl_context_cl_queue(ctx));
    int untouched = 1;
    for (int i = DQ; i <= DV; ++i) {
        void *back = test_xmalloc(b.elems[i] * b.es);
        test_download(ctx, m[i], back, b.elems[i] * b.es);
        untouched &= !memcmp(back, b.host[i], b.elems[i] * b.es);
        free(back);
    }
    expect(untouched, "errors leave dq, dk, dv untouched", &failures);
    /* And the same arguments, valid, work. */
    st = flashcl_varlen_backward(ctx, &b.d, &b.o, m[Q], m[K], m[V], m[OUT], m[DOUT], lse, lse_pad, m[DQ], m[DK],
                                 m[DV], scratch, NULL);
    clFinish(flashcl_context_cl_queue(ctx));
    expect(st == FLASHCL_SUCCESS, "the valid call after them succeeds", &failures);
    for (int i = 0; i < NT; ++i)
        clReleaseMemObject(m[i]);
    clReleaseMemObject(lse), clReleaseMemObject(scratch), clReleaseMemObject(short_scratch),
        clReleaseMemObject(small);

    flashcl_context *host = NULL;
    flashcl_context_create(&host, "host");
    expect(host && flashcl_varlen_backward_scratch_size(host, &b.d, NULL, &need) ==
                       FLASHCL_ERROR_UNSUPPORTED &&
               flashcl_varlen_backward(host, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL,
                                       NULL, NULL) == FLASHCL_ERROR_UNSUPPORTED,
           "host context: varlen backward unsupported (clear error)", &failures);
    flashcl_context_destroy(host);
    batch_free(&b);
}

int main(void) {
    flashcl_context *ctx = test_context();
    test_seed();
    if (flashcl_context_is_host(ctx)) {
        printf("host context: flashcl_varlen_backward needs an OpenCL device; nothing to test\n");
        flashcl_context_destroy(ctx);
        return 0;
    }
    /* Lengths: 1, Nq == Nk, Nq < Nk, Nq > Nk (causal rows that see no key),
     * no query, no key. */
    static const vcase cases[] = {
        {"f16 GQA 6:2 D59 causal, deterministic", FLASHCL_FLOAT16, 6, 2, 59, 1, 0, 0, 0, 0, 1, 1, 6,
         {17, 1, 0, 40, 3, 25}, {17, 130, 9, 33, 0, 20}},
        {"f16 GQA 6:2 D59 softcap, padded, atomic dq", FLASHCL_FLOAT16, 6, 2, 59, 0, 30.0f, 0, 4.0, 1, 0, 0, 5,
         {17, 1, 40, 0, 3}, {17, 130, 33, 9, 0}},
        {"bf16 MHA 3 D59 causal, padded, atomic dq", FLASHCL_BFLOAT16, 3, 3, 59, 1, 0, 0.3f, 0, 1, 0, 0, 4,
         {1, 64, 5, 9}, {1, 20, 77, 0}},
        {"f32 MQA 4:1 D16 causal softcap, deterministic", FLASHCL_FLOAT32, 4, 1, 16, 1, 20.0f, 0, 3.0, 0, 1, 0, 4,
         {33, 1, 2, 0}, {50, 1, 0, 0}},
        {"f32 one head D16 (LSE read in place), atomic dq", FLASHCL_FLOAT32, 1, 1, 16, 0, 0, 0, 0, 0, 0, 0, 3,
         {7, 0, 30}, {9, 12, 21}},
        {"f32 GQA 4:2 D16 one sequence (LSE in place)", FLASHCL_FLOAT32, 4, 2, 16, 1, 0, 0, 0, 1, 1, 0, 1,
         {45}, {45}},
    };
    for (int i = 0; i < COUNT(cases); ++i)
        run_batch(ctx, &cases[i]);
    /* The portable kernels, as a GPU without tensor cores runs them: their
     * row kernels (pre-pass, the store of a sequence without keys or
     * queries) take 8 work-items a row, the CPU kernels one. */
    vcase portable = cases[1];
    portable.name = "f16 GQA 6:2 D59 softcap, padded, atomic dq, portable kernels";
    setenv("FLASHCL_BWD_PARAMS", "VARIANT=portable", 1);
    run_batch(ctx, &portable);
    unsetenv("FLASHCL_BWD_PARAMS");
    out_of_order(ctx, &cases[0]);
    errors(ctx);
    printf("%s\n", failures ? "FAILED" : "all passed");
    flashcl_context_destroy(ctx);
    return failures ? 1 : 0;
}
