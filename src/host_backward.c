/* host_backward.c: the multi-threaded pure-C backward pass used when there is no OpenCL device.
 *
 * The algorithm of cl/flash_bwd.cl's deterministic mode, in float:
 *   pass 0  D_i = rowsum(dO_i * O_i) for every row (single thread: O(N D))
 *   pass 1  items (batch, kv head, block of KEYS keys): dK and dV of the
 *           block's keys, summed over the query heads sharing the kv head and
 *           the rows that see the block; one writer per element
 *   pass 2  items (batch, query head, block of ROWS rows): dQ of those rows,
 *           summed over their visible keys in key order
 * P = exp(s - LSE) and dS = P (dP - D) g are recomputed in both passes, so
 * memory stays O(KEYS * head_dim) per thread, plus the D_i array.
 * Items are handed out through a shared counter (causal rows differ in cost),
 * and each item's sums run in a fixed order: results do not depend on the
 * thread count or on scheduling.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define KEYS 32 /* keys per pass-1 item: their dK, dV rows stay in cache */
#define ROWS 16 /* query rows per pass-2 item                            */

typedef struct job {
    const flashcl_attention_desc *d;
    const flashcl_backward_options *o;
    const void *q, *k, *v, *dout;
    const float *lse, *di;
    void *dq, *dk, *dv;
    int pass;
    size_t items, blocks; /* blocks per (batch, head) of this pass */
    size_t next;          /* guarded by lock */
    pthread_mutex_t lock;
} job;

static size_t at(const flashcl_layout *l, int b, long n, int h) {
    return l->offset + (size_t)b * l->stride_batch + (size_t)n * l->stride_seq + (size_t)h * l->stride_head;
}

static void load_row(const job *j, const void *x, const flashcl_layout *l, int b, long n, int h, float *row) {
    size_t base = at(l, b, n, h);
    for (int e = 0; e < j->d->head_dim; ++e)
        row[e] = flashcl_host_load(x, j->d->dtype, base + (size_t)e);
}

/* Row i's visible keys [*lo, *hi] (lo > hi: none), as in host_path.c. */
static void visible(const flashcl_attention_desc *d, long i, long *lo, long *hi) {
    long diag = i + d->seqlen_k - d->seqlen_q;
    *lo = d->window_left < 0 ? 0 : diag - d->window_left;
    *hi = d->window_right < 0 ? d->seqlen_k - 1 : diag + d->window_right;
    if (*lo < 0)
        *lo = 0;
    if (*hi > d->seqlen_k - 1)
        *hi = d->seqlen_k - 1;
}

static float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int e = 0; e < n; ++e)
        s = fmaf(a[e], b[e], s);
    return s;
}

/* P and dS (scale and the soft-cap derivative folded in) of one (i, j). */
static void p_ds(const flashcl_attention_desc *d, float qk, float dp, float lse, float di, float *p,
                 float *ds) {
    float g = 1.0f;
    if (d->softcap > 0.0f) {
        float t = tanhf(qk * (d->scale / d->softcap));
        *p = expf(d->softcap * t - lse);
        g = 1.0f - t * t;
    } else {
        *p = expf(qk * d->scale - lse);
    }
    *ds = *p * (dp - di) * g * d->scale;
}

/* Pass 1: dK, dV of keys [n0, n1) of (b, hk). */
static void dkdv_item(const job *j, int b, int hk, long n0, long n1, float *kb, float *vb, float *dkb,
                      float *dvb, float *qr, float *gr) {
    const flashcl_attention_desc *d = j->d;
    const int D = d->head_dim, group = d->heads_q / d->heads_k;
    const long shift = (long)d->seqlen_k - d->seqlen_q;
    for (long n = n0; n < n1; ++n) {
        load_row(j, j->k, &d->k, b, n, hk, kb + (n - n0) * D);
        load_row(j, j->v, &d->v, b, n, hk, vb + (n - n0) * D);
    }
    memset(dkb, 0, (size_t)(n1 - n0) * D * sizeof(float));
    memset(dvb, 0, (size_t)(n1 - n0) * D * sizeof(float));
    /* Rows that may see a key of [n0, n1): as in cl/flash_bwd.cl. */
    long i_lo = d->window_right < 0 ? 0 : n0 - d->window_right - shift;
    long i_hi = d->window_left < 0 ? d->seqlen_q - 1 : n1 - 1 + d->window_left - shift;
    if (i_lo < 0)
        i_lo = 0;
    if (i_hi > d->seqlen_q - 1)
        i_hi = d->seqlen_q - 1;
    for (int h = hk * group; h < (hk + 1) * group; ++h) {
        for (long i = i_lo; i <= i_hi; ++i) {
            size_t r = ((size_t)b * d->heads_q + h) * d->seqlen_q + (size_t)i;
            float lse = j->lse[r], di = j->di[r];
            long lo, hi;
            visible(d, i, &lo, &hi);
            if (lo < n0)
                lo = n0;
            if (hi > n1 - 1)
                hi = n1 - 1;
            if (lse == -INFINITY || lo > hi)
                continue; /* a row that saw no key contributes nothing */
            load_row(j, j->q, &d->q, b, i, h, qr);
            load_row(j, j->dout, &j->o->dout, b, i, h, gr);
            for (long n = lo; n <= hi; ++n) {
                float p, ds, *dkr = dkb + (n - n0) * D, *dvr = dvb + (n - n0) * D;
                p_ds(d, dot(qr, kb + (n - n0) * D, D), dot(gr, vb + (n - n0) * D, D), lse, di, &p, &ds);
                for (int e = 0; e < D; ++e) {
                    dvr[e] = fmaf(p, gr[e], dvr[e]);
                    dkr[e] = fmaf(ds, qr[e], dkr[e]);
                }
            }
        }
    }
    for (long n = n0; n < n1; ++n) {
        size_t ok = at(&j->o->dk, b, n, hk), ov = at(&j->o->dv, b, n, hk);
        for (int e = 0; e < D; ++e) {
            flashcl_host_store(j->dk, d->dtype, ok + (size_t)e, dkb[(n - n0) * D + e]);
            flashcl_host_store(j->dv, d->dtype, ov + (size_t)e, dvb[(n - n0) * D + e]);
        }
    }
}

/* Pass 2: dQ of row i of (b, h). */
static void dq_row(const job *j, int b, int h, long i, float *qr, float *gr, float *kr, float *vr,
                   float *acc) {
    const flashcl_attention_desc *d = j->d;
    const int D = d->head_dim, hk = h / (d->heads_q / d->heads_k);
    size_t r = ((size_t)b * d->heads_q + h) * d->seqlen_q + (size_t)i;
    float lse = j->lse[r], di = j->di[r];
    long lo, hi;
    visible(d, i, &lo, &hi);
    memset(acc, 0, (size_t)D * sizeof(float));
    if (lse != -INFINITY && lo <= hi) {
        load_row(j, j->q, &d->q, b, i, h, qr);
        load_row(j, j->dout, &j->o->dout, b, i, h, gr);
        for (long n = lo; n <= hi; ++n) {
            float p, ds;
            load_row(j, j->k, &d->k, b, n, hk, kr);
            load_row(j, j->v, &d->v, b, n, hk, vr);
            p_ds(d, dot(qr, kr, D), dot(gr, vr, D), lse, di, &p, &ds);
            for (int e = 0; e < D; ++e)
                acc[e] = fmaf(ds, kr[e], acc[e]);
        }
    }
    size_t out = at(&j->o->dq, b, i, h);
    for (int e = 0; e < D; ++e)
        flashcl_host_store(j->dq, d->dtype, out + (size_t)e, acc[e]);
}

static void *worker(void *arg) {
    job *j = arg;
    const flashcl_attention_desc *d = j->d;
    float kb[KEYS * 256], vb[KEYS * 256], dkb[KEYS * 256], dvb[KEYS * 256];
    float qr[256], gr[256], kr[256], vr[256];
    for (;;) {
        pthread_mutex_lock(&j->lock);
        size_t item = j->next++;
        pthread_mutex_unlock(&j->lock);
        if (item >= j->items)
            return NULL;
        size_t bh = item / j->blocks;
        long blk = (long)(item % j->blocks);
        if (j->pass == 1) {
            int b = (int)(bh / d->heads_k), hk = (int)(bh % d->heads_k);
            long n1 = (blk + 1) * KEYS < d->seqlen_k ? (blk + 1) * KEYS : d->seqlen_k;
            dkdv_item(j, b, hk, blk * KEYS, n1, kb, vb, dkb, dvb, qr, gr);
        } else {
            int b = (int)(bh / d->heads_q), h = (int)(bh % d->heads_q);
            long end = (blk + 1) * ROWS < d->seqlen_q ? (blk + 1) * ROWS : d->seqlen_q;
            for (long i = blk * ROWS; i < end; ++i)
                dq_row(j, b, h, i, qr, gr, kr, vr, dvb);
        }
    }
}

static void run_pass(flashcl_context *ctx, job *j) {
    j->next = 0;
    int n = ctx->host_threads;
    if (n < 1)
        n = 1;
    if ((size_t)n > j->items)
        n = (int)j->items;
    if (n > 256)
        n = 256;
    pthread_t threads[256];
    int started = 0;
    for (; started < n - 1; ++started)
        if (pthread_create(&threads[started], NULL, worker, j) != 0)
            break; /* fewer threads is still correct */
    worker(j);
    for (int t = 0; t < started; ++t)
        pthread_join(threads[t], NULL);
}

flashcl_status flashcl_host_backward(flashcl_context *ctx, const flashcl_attention_desc *d,
                                     const flashcl_backward_options *o, const void *q, const void *k,
                                     const void *v, const void *out, const void *dout, const float *lse,
                                     void *dq, void *dk, void *dv) {
    const size_t rows = (size_t)d->batch * d->heads_q * d->seqlen_q;
    float *di = malloc(rows * sizeof(float));
    if (!di)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory for D (%zu rows)", rows);
    /* pass 0: D_i in the (b, h, i) order of lse */
    for (int b = 0; b < d->batch; ++b)
        for (int h = 0; h < d->heads_q; ++h)
            for (int i = 0; i < d->seqlen_q; ++i) {
                size_t ro = at(&d->out, b, i, h), rg = at(&o->dout, b, i, h);
                float s = 0.0f;
                for (int e = 0; e < d->head_dim; ++e)
                    s = fmaf(flashcl_host_load(dout, d->dtype, rg + (size_t)e),
                             flashcl_host_load(out, d->dtype, ro + (size_t)e), s);
                di[((size_t)b * d->heads_q + h) * d->seqlen_q + (size_t)i] = s;
            }
    job j;
    memset(&j, 0, sizeof j);
    j.d = d;
    j.o = o;
    j.q = q, j.k = k, j.v = v, j.dout = dout;
    j.lse = lse, j.di = di;
    j.dq = dq, j.dk = dk, j.dv = dv;
    pthread_mutex_init(&j.lock, NULL);
    j.pass = 1;
    j.blocks = ((size_t)d->seqlen_k + KEYS - 1) / KEYS;
    j.items = (size_t)d->batch * d->heads_k * j.blocks;
    run_pass(ctx, &j);
    j.pass = 2;
    j.blocks = ((size_t)d->seqlen_q + ROWS - 1) / ROWS;
    j.items = (size_t)d->batch * d->heads_q * j.blocks;
    run_pass(ctx, &j);
    pthread_mutex_destroy(&j.lock);
    free(di);
    return FLASHCL_SUCCESS;
}
