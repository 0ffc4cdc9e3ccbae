/* serving_common.c: the host mirror of a paged KV cache and the paged-attention checks that
 * every mode of test_serving runs (serving_common.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serving_common.h"

int serving_failures;
static uint64_t seed_counter;

uint64_t serving_seed(void) {
    return test_seed() + 7919u * ++seed_counter;
}

void mirror_init(mirror *m, flashcl_context *ctx, flashcl_dtype dt, int hk, int d, int page_size,
                 int num_pages) {
    memset(m, 0, sizeof *m);
    m->desc.dtype = dt;
    m->desc.heads_k = hk;
    m->desc.head_dim = d;
    m->desc.page_size = page_size;
    m->desc.num_pages = num_pages;
    m->desc.page_order_seed = serving_seed() | 1;
    m->row = (size_t)hk * d;
    flashcl_status st = flashcl_kv_cache_create(ctx, &m->desc, &m->cache);
    if (st) {
        fprintf(stderr, "kv_cache_create: %s: %s\n", flashcl_status_string(st),
                flashcl_last_error(ctx));
        exit(1);
    }
    for (int i = 0; i < 16; ++i) {
        m->k[i] = test_xmalloc(MAX_TOKENS * m->row * flashcl_dtype_size(dt));
        m->v[i] = test_xmalloc(MAX_TOKENS * m->row * flashcl_dtype_size(dt));
        m->ids[i] = -1;
    }
}

void mirror_free(mirror *m) {
    flashcl_kv_cache_destroy(m->cache);
    for (int i = 0; i < 16; ++i)
        free(m->k[i]), free(m->v[i]);
}

/* Appends random tokens: counts[i] to mirror slot slots[i]. Returns the status. */
flashcl_status mirror_append(flashcl_context *ctx, mirror *m, int n, const int *slots,
                             const int *counts) {
    size_t es = flashcl_dtype_size(m->desc.dtype);
    int total = 0, ids[16];
    for (int i = 0; i < n; ++i) {
        if (m->len[slots[i]] + counts[i] > MAX_TOKENS) {
            fprintf(stderr, "test bug: mirror slot %d would hold %d tokens, MAX_TOKENS is %d\n",
                    slots[i], m->len[slots[i]] + counts[i], MAX_TOKENS);
            exit(1);
        }
        total += counts[i], ids[i] = m->ids[slots[i]];
    }
    void *k = test_xmalloc((size_t)total * m->row * es),
         *v = test_xmalloc((size_t)total * m->row * es);
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, serving_seed());
    flashcl_ref_fill_normal(&rng, k, m->desc.dtype, (size_t)total * m->row, 1.0);
    flashcl_ref_fill_normal(&rng, v, m->desc.dtype, (size_t)total * m->row, 1.0);
    const flashcl_status st = test_kv_append(ctx, m->cache, n, ids, counts, k, v, (size_t)total * m->row * es);
    if (st == FLASHCL_SUCCESS) {
        size_t t = 0;
        for (int i = 0; i < n; ++i) {
            int s = slots[i];
            memcpy((char *)m->k[s] + (size_t)m->len[s] * m->row * es, (char *)k + t * m->row * es,
                   (size_t)counts[i] * m->row * es);
            memcpy((char *)m->v[s] + (size_t)m->len[s] * m->row * es, (char *)v + t * m->row * es,
                   (size_t)counts[i] * m->row * es);
            m->len[s] += counts[i];
            t += (size_t)counts[i];
        }
    }
    free(k), free(v);
    return st;
}

/* The pools read back and gathered through the page tables equal the mirror,
 * bit for bit, and every length agrees. */
int mirror_matches(flashcl_context *ctx, mirror *m) {
    size_t es = flashcl_dtype_size(m->desc.dtype);
    size_t pool = (size_t)m->desc.num_pages * m->desc.page_size * m->row * es;
    void *kp = test_xmalloc(pool), *vp = test_xmalloc(pool),
         *dense = test_xmalloc(MAX_TOKENS * m->row * es);
    test_download(ctx, flashcl_kv_cache_k_pool(m->cache), kp, pool);
    test_download(ctx, flashcl_kv_cache_v_pool(m->cache), vp, pool);
    int ok = 1, pages[MAX_TOKENS], count;
    for (int s = 0; s < 16; ++s) {
        if (m->ids[s] < 0)
            continue;
        ok &= flashcl_kv_cache_length(m->cache, m->ids[s]) == m->len[s];
        ok &= flashcl_kv_cache_page_table(m->cache, m->ids[s], pages, MAX_TOKENS, &count) ==
              FLASHCL_SUCCESS;
        ok &= count == (m->len[s] + m->desc.page_size - 1) / m->desc.page_size;
        flashcl_ref_kv_gather(kp, m->desc.dtype, m->desc.page_size, m->desc.heads_k,
                              m->desc.head_dim, pages, m->len[s], dense);
        ok &= !memcmp(dense, m->k[s], (size_t)m->len[s] * m->row * es);
        flashcl_ref_kv_gather(vp, m->desc.dtype, m->desc.page_size, m->desc.heads_k,
                              m->desc.head_dim, pages, m->len[s], dense);
        ok &= !memcmp(dense, m->v[s], (size_t)m->len[s] * m->row * es);
    }
    free(kp), free(vp), free(dense);
    return ok;
}

/* Paged attention of nq[i] new queries per listed mirror slot against the
 * cache, checked against the dense reference; returns the output (caller
 * frees) so split counts can be compared. */
/* Set: paged_check's queries sit at an offset of 3 elements with padded
 * strides, so that no Q row is 16-byte aligned (the kernels' element-wise Q
 * loads). */
static int q_padded;

float paged_softcap;

int paged_check(flashcl_context *ctx, mirror *m, int n, const int *slots, const int *nq,
                int heads_q, int causal, int splits, uint64_t q_seed, const char *name,
                void **out_host) {
    const flashcl_dtype dt = m->desc.dtype;
    const size_t es = flashcl_dtype_size(dt);
    const int D = m->desc.head_dim, Hk = m->desc.heads_k;
    int cu_q[17] = {0}, cu_k[17] = {0}, ids[16];
    for (int i = 0; i < n; ++i) {
        cu_q[i + 1] = cu_q[i] + nq[i];
        cu_k[i + 1] = cu_k[i] + m->len[slots[i]];
        ids[i] = m->ids[slots[i]];
    }
    const int total_q = cu_q[n], total_k = cu_k[n];
    size_t q_el = (size_t)total_q * heads_q * D, lse_n = (size_t)total_q * heads_q;
    const size_t q_sh = q_padded ? (size_t)D + 3 : (size_t)D,
                 q_ss = q_padded ? heads_q * q_sh + 1 : heads_q * q_sh;
    const size_t q_off = q_padded ? 3 : 0, q_alloc = q_off + (size_t)total_q * q_ss;
    void *q = test_xmalloc(q_alloc * es), *out = test_xmalloc(q_el * es);
    void *k = test_xmalloc((size_t)total_k * Hk * D * es),
         *v = test_xmalloc((size_t)total_k * Hk * D * es);
    float *lse = test_xmalloc(lse_n * 4);
    for (int i = 0; i < n; ++i) {
        memcpy((char *)k + (size_t)cu_k[i] * m->row * es, m->k[slots[i]],
               (size_t)m->len[slots[i]] * m->row * es);
        memcpy((char *)v + (size_t)cu_k[i] * m->row * es, m->v[slots[i]],
               (size_t)m->len[slots[i]] * m->row * es);
    }
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, q_seed ? q_seed : serving_seed());
    flashcl_ref_fill_normal(&rng, q, dt, q_alloc, 1.0);
    flashcl_varlen_desc d = test_varlen_desc(dt, n, heads_q, Hk, D, cu_q, NULL);
    d.causal = causal;
    d.num_splits = splits;
    d.softcap = paged_softcap;
    d.q.offset = q_off;
    d.q.stride_seq = q_ss;
    d.q.stride_head = q_sh;
    int used_splits = 0;
    flashcl_params params;
    flashcl_status st = test_paged_attention(ctx, &d, m->cache, ids, q, q_alloc, out, q_el, lse,
                                             lse_n, &params, &used_splits);
    d.cu_seqlens_k = cu_k;
    flashcl_ref_report rep;
    int ok = !st && flashcl_ref_check_varlen(&d, q, k, v, out, lse, 1, &rep);
    ok &= splits == 0 || used_splits == splits;
    char what[160];
    snprintf(what, sizeof what, "%s (splits %d, err %.2g tol %.2g)", name, used_splits,
             st ? -1.0 : rep.max_err, st ? -1.0 : rep.tolerance);
    expect(ok, what, &serving_failures);
    free(q), free(k), free(v), free(lse);
    if (out_host)
        *out_host = out;
    else
        free(out);
    return ok;
}

/* Lengths 1, page_size - 1, page_size, page_size + 1 and long, prefilled in
 * one append, one decode step, then decode and a prompt chunk with splits. */
void paged_suite(flashcl_context *ctx, flashcl_dtype dt, int hk, int group, int d, int ps,
                 int long_len, const char *tag) {
    mirror m;
    mirror_init(&m, ctx, dt, hk, d, ps, (long_len + 4 * ps + 64) / ps + 8);
    int lens[5] = {1, ps > 1 ? ps - 1 : 1, ps, ps + 1, long_len}, slots[5] = {0, 1, 2, 3, 4},
        ones[5] = {1, 1, 1, 1, 1};
    for (int i = 0; i < 5; ++i)
        flashcl_kv_cache_add_sequence(m.cache, &m.ids[i]);
    char what[128];
    flashcl_status st = mirror_append(ctx, &m, 5, slots, lens);
    snprintf(what, sizeof what, "%s: prefill append of mixed lengths", tag);
    expect(st == FLASHCL_SUCCESS && mirror_matches(ctx, &m), what, &serving_failures);
    st = mirror_append(ctx, &m, 5, slots, ones);
    snprintf(what, sizeof what, "%s: decode append, pools equal the appended tokens", tag);
    expect(st == FLASHCL_SUCCESS && mirror_matches(ctx, &m), what, &serving_failures);

    void *unsplit = NULL, *split = NULL;
    snprintf(what, sizeof what, "%s: decode, 1 query, GQA %d", tag, group);
    const uint64_t q_seed = serving_seed(); /* the same queries both times */
    paged_check(ctx, &m, 5, slots, ones, hk * group, 1, 1, q_seed, what, &unsplit);
    snprintf(what, sizeof what, "%s: decode, split-KV", tag);
    paged_check(ctx, &m, 5, slots, ones, hk * group, 1, 3, q_seed, what, &split);
    /* Split and unsplit agree within the sum of their tolerances against the
     * reference (both were checked above); here: within 2 storage ulps of
     * each output (test_outputs_agree). */
    double worst;
    const int agree = test_outputs_agree(unsplit, split, dt, (size_t)5 * hk * group * d, &worst);
    snprintf(what, sizeof what, "%s: split-KV equals unsplit (max diff %.2g)", tag, worst);
    expect(agree, what, &serving_failures);
    free(unsplit), free(split);
    /* Above 16 splits the decode kernels merge in two levels (runs of 8, the
     * last run short here; slices past the keys are empty), up to the most. */
    snprintf(what, sizeof what, "%s: decode, 20 splits", tag);
    paged_check(ctx, &m, 5, slots, ones, hk * group, 1, 20, q_seed, what, NULL);
    snprintf(what, sizeof what, "%s: decode, 128 splits", tag);
    paged_check(ctx, &m, 5, slots, ones, hk * group, 1, 128, q_seed, what, NULL);
    q_padded = 1;
    snprintf(what, sizeof what, "%s: decode, Q at an offset with padded strides", tag);
    paged_check(ctx, &m, 5, slots, ones, hk * group, 1, 3, 0, what, NULL);
    q_padded = 0;
    int nq[5] = {1, lens[1], 3, lens[3], 7};
    snprintf(what, sizeof what, "%s: prompt chunks, causal, auto splits", tag);
    paged_check(ctx, &m, 5, slots, nq, hk * group, 1, 0, 0, what, NULL);
    mirror_free(&m);
}

/* Whether the cache's device page tables hold every live sequence's host table. */
int device_tables_match(flashcl_context *ctx, const flashcl_kv_cache *c) {
    int *dev = test_xmalloc((size_t)c->tables_cap * sizeof(int)), ok = 1;
    clEnqueueReadBuffer(flashcl_context_cl_queue(ctx), c->tables, CL_TRUE, 0,
                        (size_t)c->tables_cap * sizeof(int), dev, 0, NULL, NULL);
    for (int i = 0; i < c->seq_count; ++i) {
        const flashcl_kv_sequence *q = &c->seqs[i];
        if (q->live && q->count > 0)
            ok &= q->dev_cap >= q->count && q->dev_off + q->dev_cap <= c->tables_used &&
                  !memcmp(dev + q->dev_off, q->pages, (size_t)q->count * sizeof(int));
    }
    free(dev);
    return ok;
}

/* One sequence of `len` tokens in a fresh mirror, and the desc of a
 * one-token step over it (heads_q query heads). */
void one_sequence(flashcl_context *ctx, mirror *m, flashcl_varlen_desc *d, const int *cu,
                  flashcl_dtype dt, int head_dim, int heads_q, int len) {
    int slot = 0;
    mirror_init(m, ctx, dt, 1, head_dim, 4, 8);
    flashcl_kv_cache_add_sequence(m->cache, &m->ids[0]);
    mirror_append(ctx, m, 1, &slot, &len);
    memset(d, 0, sizeof *d);
    d->dtype = dt;
    d->num_seqs = 1;
    d->heads_q = heads_q;
    d->heads_k = 1;
    d->head_dim = head_dim;
    d->cu_seqlens_q = cu;
}
