/* test_serving.c: merge, paged KV cache (append, fork, copy-on-write, exhaustion), paged and varlen attention, split-KV.
 *
 * Every result is checked against host_ref with fresh random inputs and
 * poisoned outputs; page tables are scattered (the cache shuffles its free
 * list) and the pools are read back and compared bit for bit with what was
 * appended. Shapes are few on purpose: each (dtype, head dim, tile) is one
 * PoCL compile. FLASHCL_TEST_SEED replays a run.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* rmdir */

#include "serving_common.h" /* the mirror, paged_check and paged_suite; serving_queues.c */

/* ---- merge ------------------------------------------------------------------------------ */

/* Random partial results with some -inf LSEs (one side, both sides); the O of
 * a -inf side is NaN, which must not leak into the merge. */
static void merge_random(flashcl_context *ctx, flashcl_dtype dt, int in_place, int padded) {
    flashcl_merge_desc d = test_merge_desc(dt, 2, 7, 3, 37);
    size_t es = flashcl_dtype_size(dt), rows = (size_t)d.batch * d.heads * d.seqlen;
    size_t packed = rows * (size_t)d.head_dim;
    size_t n2 = packed;
    if (padded) { /* o2 with padded strides and an offset */
        d.o2.offset = 5;
        d.o2.stride_head = (size_t)d.head_dim + 2;
        d.o2.stride_seq = d.heads * d.o2.stride_head + 1;
        d.o2.stride_batch = d.seqlen * d.o2.stride_seq + 3;
        n2 = d.o2.offset + d.batch * d.o2.stride_batch;
        d.lse2_offset = 9;
        d.lse_out_offset = 4;
    }
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, serving_seed());
    void *o1 = test_xmalloc(packed * es), *o2 = test_xmalloc(n2 * es), *out = test_xmalloc(packed * es);
    float *l1 = test_xmalloc(rows * 4), *l2 = test_xmalloc((rows + 9) * 4), *lo = test_xmalloc((rows + 4) * 4);
    flashcl_ref_fill_normal(&rng, o1, dt, packed, 1.0);
    flashcl_ref_fill_normal(&rng, o2, dt, n2, 1.0);
    for (size_t r = 0; r < rows + 9; ++r)
        l2[r] = (float)(flashcl_ref_rng_normal(&rng) * 4.0);
    for (size_t r = 0; r < rows; ++r) {
        l1[r] = (float)(flashcl_ref_rng_normal(&rng) * 4.0);
        int kind = (int)(r % 5); /* 0: side 1 empty, 1: side 2 empty, 2: both */
        if (kind == 0 || kind == 2)
            l1[r] = -INFINITY;
        if (kind == 1 || kind == 2)
            l2[d.lse2_offset + r] = -INFINITY;
    }
    /* NaN in the O of every empty side (row-wise, packed o1 only: enough). */
    for (size_t r = 0; r < rows; ++r)
        if (l1[r] == -INFINITY) {
            size_t b = r / (d.heads * d.seqlen), h = (r / d.seqlen) % d.heads, n = r % d.seqlen;
            flashcl_ref_poison((char *)o1 + (((b * d.seqlen + n) * d.heads + h) * d.head_dim) * es, dt,
                               (size_t)d.head_dim);
        }
    flashcl_ref_poison(out, dt, packed);
    flashcl_ref_poison(lo, FLASHCL_FLOAT32, rows + 4);

    cl_mem b1 = test_upload(ctx, o1, packed * es), bl1 = test_upload(ctx, l1, rows * 4);
    cl_mem b2 = test_upload(ctx, o2, n2 * es), bl2 = test_upload(ctx, l2, (rows + 9) * 4);
    cl_mem bo = in_place ? b1 : test_upload(ctx, out, packed * es), blo = test_upload(ctx, lo, (rows + 4) * 4);
    flashcl_status st = flashcl_attention_merge(ctx, &d, b1, bl1, b2, bl2, bo, blo, NULL);
    if (st == FLASHCL_SUCCESS) {
        test_download(ctx, bo, out, packed * es);
        test_download(ctx, blo, lo, (rows + 4) * 4);
    }
    flashcl_ref_report rep;
    int ok = st == FLASHCL_SUCCESS && flashcl_ref_check_merge(&d, o1, l1, o2, l2, out, lo, 1, &rep);
    char what[96];
    snprintf(what, sizeof what, "merge random dtype %d%s%s (err %.2g)", (int)dt, in_place ? " in place" : "",
             padded ? " padded" : "", st ? -1.0 : rep.max_err);
    expect(ok, what, &serving_failures);
    clReleaseMemObject(b1);
    clReleaseMemObject(bl1);
    clReleaseMemObject(b2);
    clReleaseMemObject(bl2);
    if (!in_place)
        clReleaseMemObject(bo);
    clReleaseMemObject(blo);
    free(o1), free(o2), free(out), free(l1), free(l2), free(lo);
}

/* Attention over keys [0, a) merged with attention over [a, n) equals
 * attention over [0, n): the property split-KV and ring attention rely on. */
static void merge_equals_full(flashcl_context *ctx, const char *name) {
    const flashcl_dtype dt = FLASHCL_FLOAT16;
    const int B = 2, Hq = 4, Hk = 2, Nq = 5, Nk = 70, split = 33, D = 64;
    size_t es = 2, nq_el = (size_t)B * Nq * Hq * D, nk_el = (size_t)B * Nk * Hk * D, rows = (size_t)B * Hq * Nq;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, serving_seed());
    void *q = test_xmalloc(nq_el * es), *k = test_xmalloc(nk_el * es), *v = test_xmalloc(nk_el * es);
    void *o1 = test_xmalloc(nq_el * es), *o2 = test_xmalloc(nq_el * es), *out = test_xmalloc(nq_el * es);
    float *l1 = test_xmalloc(rows * 4), *l2 = test_xmalloc(rows * 4), *lo = test_xmalloc(rows * 4);
    flashcl_ref_fill_normal(&rng, q, dt, nq_el, 1.0);
    flashcl_ref_fill_normal(&rng, k, dt, nk_el, 1.0);
    flashcl_ref_fill_normal(&rng, v, dt, nk_el, 1.0);
    flashcl_ref_poison(out, dt, nq_el);
    flashcl_ref_poison(lo, FLASHCL_FLOAT32, rows);
    /* The two halves are views of the same k/v: offsets and full strides. */
    flashcl_attention_desc a = test_attention_desc(dt, B, Hq, Hk, Nq, 0, D);
    a.q.stride_head = a.out.stride_head = (size_t)D;
    a.q.stride_seq = a.out.stride_seq = (size_t)Hq * D;
    a.q.stride_batch = a.out.stride_batch = (size_t)Nq * Hq * D;
    a.k.stride_head = (size_t)D;
    a.k.stride_seq = (size_t)Hk * D;
    a.k.stride_batch = (size_t)Nk * Hk * D;
    a.v = a.k;
    flashcl_attention_desc first = a, second = a;
    first.seqlen_k = split;
    second.seqlen_k = Nk - split;
    second.k.offset = second.v.offset = (size_t)split * Hk * D;
    flashcl_status st = flashcl_attention_forward_host(ctx, &first, q, k, v, o1, l1);
    if (!st)
        st = flashcl_attention_forward_host(ctx, &second, q, k, v, o2, l2);
    flashcl_merge_desc m = test_merge_desc(dt, B, Nq, Hq, D);
    if (!st)
        st = flashcl_attention_merge_host(ctx, &m, o1, l1, o2, l2, out, lo);
    flashcl_attention_desc full = a;
    full.seqlen_k = Nk;
    flashcl_ref_report rep;
    /* The halves' outputs were rounded to float16 before the merge rounded again: one rounding
     * more than a single call's (a seed put the plain rule 0.00011 short at an output of 1.78). */
    int ok = st == FLASHCL_SUCCESS && flashcl_ref_check_forward_rounded(&full, q, k, v, out, lo, 1, 1, &rep);
    if (st)
        printf("  %s: %s\n", flashcl_status_string(st), flashcl_last_error(ctx));
    expect(ok, name, &serving_failures);
    free(q), free(k), free(v), free(o1), free(o2), free(out), free(l1), free(l2), free(lo);
}

/* Fork, copy-on-write of a shared partial page, free. */
static void fork_suite(flashcl_context *ctx) {
    mirror m;
    const int ps = 8;
    mirror_init(&m, ctx, FLASHCL_FLOAT16, 2, 64, ps, 64);
    flashcl_kv_cache_add_sequence(m.cache, &m.ids[0]);
    int s0[1] = {0}, n20[1] = {20};
    mirror_append(ctx, &m, 1, s0, n20); /* 3 pages, the last holding 4 tokens */
    int free0 = flashcl_kv_cache_free_pages(m.cache);
    flashcl_status st = flashcl_kv_cache_fork(m.cache, m.ids[0], &m.ids[1]);
    memcpy(m.k[1], m.k[0], (size_t)20 * m.row * 2);
    memcpy(m.v[1], m.v[0], (size_t)20 * m.row * 2);
    m.len[1] = 20;
    expect(st == FLASHCL_SUCCESS && flashcl_kv_cache_free_pages(m.cache) == free0 && mirror_matches(ctx, &m),
           "fork shares every page (no page taken)", &serving_failures);
    /* Both append different tokens in one call: exactly one copy is made,
     * the last sharer writes in place. */
    int both[2] = {0, 1}, counts[2] = {3, 2};
    st = mirror_append(ctx, &m, 2, both, counts);
    expect(st == FLASHCL_SUCCESS && flashcl_kv_cache_free_pages(m.cache) == free0 - 1 && mirror_matches(ctx, &m),
           "copy-on-write: each branch sees only its own new tokens", &serving_failures);
    /* A second fork, then a multi-page append to the fork. */
    flashcl_kv_cache_fork(m.cache, m.ids[1], &m.ids[2]);
    memcpy(m.k[2], m.k[1], (size_t)22 * m.row * 2);
    memcpy(m.v[2], m.v[1], (size_t)22 * m.row * 2);
    m.len[2] = 22;
    int s2[1] = {2}, n13[1] = {13};
    st = mirror_append(ctx, &m, 1, s2, n13);
    expect(st == FLASHCL_SUCCESS && mirror_matches(ctx, &m), "fork of a fork, append across pages", &serving_failures);
    int slots[3] = {0, 1, 2}, ones[3] = {1, 1, 1};
    paged_check(ctx, &m, 3, slots, ones, 8, 1, 2, 0, "attention over forked sequences", NULL);
    /* Three sharers of one partial page (sequence 0, 23 tokens, and two forks)
     * append in one call: two copies, the third writes in place. */
    for (int f = 3; f < 5; ++f) {
        flashcl_kv_cache_fork(m.cache, m.ids[0], &m.ids[f]);
        memcpy(m.k[f], m.k[0], (size_t)23 * m.row * 2);
        memcpy(m.v[f], m.v[0], (size_t)23 * m.row * 2);
        m.len[f] = 23;
    }
    int free3 = flashcl_kv_cache_free_pages(m.cache), three[3] = {4, 0, 3};
    st = mirror_append(ctx, &m, 3, three, ones);
    expect(st == FLASHCL_SUCCESS && flashcl_kv_cache_free_pages(m.cache) == free3 - 2 && mirror_matches(ctx, &m),
           "copy-on-write: three sharers in one append make two copies", &serving_failures);
    for (int f = 3; f < 5; ++f)
        flashcl_kv_cache_free_sequence(m.cache, m.ids[f]);
    for (int i = 0; i < 3; ++i)
        flashcl_kv_cache_free_sequence(m.cache, m.ids[i]);
    expect(flashcl_kv_cache_free_pages(m.cache) == 64 && flashcl_kv_cache_length(m.cache, m.ids[0]) == -1,
           "freeing every sequence returns every page", &serving_failures);
    m.ids[0] = m.ids[1] = m.ids[2] = m.ids[3] = m.ids[4] = -1;
    mirror_free(&m);
}

/* The device copy of the page tables: sequences growing out of their regions
 * (page size 1: a new region at 17, 33, 65, ... tokens), forks copying their
 * parent's region, truncation, frees and re-adds, until the tables buffer has been rebuilt
 * (compacted) several times; after every round, decode attention over every
 * live sequence, with and without splits, against the reference. */
static void device_tables_suite(flashcl_context *ctx) {
    mirror m;
    mirror_init(&m, ctx, FLASHCL_FLOAT16, 1, 32, 1, 900);
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, serving_seed());
    cl_mem last = m.cache->tables;
    int rebuilt = 0, ok = 1;
    for (int round = 0; round < 24; ++round) {
        int slots[8], counts[8], n = 0;
        for (int i = 0; i < 8; ++i) {
            if (m.ids[i] < 0) {
                flashcl_kv_cache_add_sequence(m.cache, &m.ids[i]);
                m.len[i] = 0;
            }
            if (m.len[i] < 60) {
                slots[n] = i;
                counts[n++] = 5 + (int)(flashcl_ref_rng_next(&rng) % 20);
            }
        }
        if (mirror_append(ctx, &m, n, slots, counts) != FLASHCL_SUCCESS)
            ok = 0, printf("  round %d: append: %s\n", round, flashcl_last_error(ctx));
        /* A fork of one sequence into slot 8 + round % 4 (freeing what was there). */
        const int from = (int)(flashcl_ref_rng_next(&rng) % 8), to = 8 + round % 4;
        if (m.ids[to] >= 0)
            flashcl_kv_cache_free_sequence(m.cache, m.ids[to]);
        ok &= flashcl_kv_cache_fork(m.cache, m.ids[from], &m.ids[to]) == FLASHCL_SUCCESS;
        memcpy(m.k[to], m.k[from], (size_t)m.len[from] * m.row * 2);
        memcpy(m.v[to], m.v[from], (size_t)m.len[from] * m.row * 2);
        m.len[to] = m.len[from];
        int one[1] = {to}, three[1] = {3};
        ok &= mirror_append(ctx, &m, 1, one, three) == FLASHCL_SUCCESS; /* the fork diverges */
        int live[12], ones[12], nl = 0;
        for (int i = 0; i < 12; ++i)
            if (m.ids[i] >= 0) {
                live[nl] = i;
                ones[nl++] = 1;
            }
        char what[96];
        snprintf(what, sizeof what, "device page tables, round %d (%d sequences, %d rebuilds)", round, nl, rebuilt);
        ok &= paged_check(ctx, &m, nl, live, ones, 4, 1, round % 2 ? 3 : 1, 0, what, NULL);
        if (!device_tables_match(ctx, m.cache))
            ok = 0, printf("  round %d: the device page tables differ from the host's\n", round);
        /* One sequence is cut back (its table shrinks; the next append
         * refills the same region or moves it). */
        const int cut = (int)(flashcl_ref_rng_next(&rng) % 8);
        if (m.ids[cut] >= 0 && m.len[cut] > 2) {
            m.len[cut] /= 2;
            ok &= flashcl_kv_cache_truncate(m.cache, m.ids[cut], m.len[cut]) == FLASHCL_SUCCESS;
        }
        /* The longest one leaves, and comes back empty next round. */
        int longest = 0;
        for (int i = 1; i < 8; ++i)
            if (m.len[i] > m.len[longest])
                longest = i;
        flashcl_kv_cache_free_sequence(m.cache, m.ids[longest]);
        m.ids[longest] = -1;
        if (m.cache->tables != last) {
            ++rebuilt;
            last = m.cache->tables;
        }
    }
    expect(ok && rebuilt >= 2 && mirror_matches(ctx, &m), "device page tables: relocated, forked and rebuilt, always right",
           &serving_failures);
    printf("  (the tables buffer was rebuilt %d times)\n", rebuilt);
    for (int i = 0; i < 12; ++i)
        if (m.ids[i] >= 0)
            flashcl_kv_cache_free_sequence(m.cache, m.ids[i]);
    for (int i = 0; i < 16; ++i)
        m.ids[i] = -1;
    mirror_free(&m);
}

/* Running out of pages: a clear error, and nothing changes. */
static void exhaustion_suite(flashcl_context *ctx) {
    mirror m;
    mirror_init(&m, ctx, FLASHCL_FLOAT16, 2, 64, 4, 6);
    for (int i = 0; i < 3; ++i)
        flashcl_kv_cache_add_sequence(m.cache, &m.ids[i]);
    int slots[3] = {0, 1, 2}, fill[3] = {7, 6, 2}; /* 2 + 2 + 1 pages: 1 left */
    flashcl_status st = mirror_append(ctx, &m, 3, slots, fill);
    flashcl_kv_cache_fork(m.cache, m.ids[2], &m.ids[3]);
    memcpy(m.k[3], m.k[2], 2 * m.row * 2);
    memcpy(m.v[3], m.v[2], 2 * m.row * 2);
    m.len[3] = 2;
    expect(st == FLASHCL_SUCCESS && flashcl_kv_cache_free_pages(m.cache) == 1, "pool filled to one free page",
           &serving_failures);
    int tables[4][8], counts[4];
    for (int i = 0; i < 4; ++i)
        flashcl_kv_cache_page_table(m.cache, m.ids[i], tables[i], 8, &counts[i]);
    /* seq 0 needs 1 more page (7 -> 9) and seq 2 a copy of its shared page
     * (2 -> 3): 2 pages, 1 free. The first part alone would fit. */
    int which[2] = {0, 2}, more[2] = {2, 1};
    st = mirror_append(ctx, &m, 2, which, more);
    char message[300];
    snprintf(message, sizeof message, "%s", flashcl_last_error(ctx));
    int same = flashcl_kv_cache_free_pages(m.cache) == 1;
    for (int i = 0; i < 4; ++i) {
        int t[8], c;
        flashcl_kv_cache_page_table(m.cache, m.ids[i], t, 8, &c);
        same &= c == counts[i] && !memcmp(t, tables[i], (size_t)c * sizeof(int));
    }
    expect(st == FLASHCL_ERROR_OUT_OF_PAGES && same && mirror_matches(ctx, &m),
           "out of pages: clear error, every sequence intact", &serving_failures);
    printf("  (message: %s)\n", message);
    int only[1] = {0}, two[1] = {2};
    st = mirror_append(ctx, &m, 1, only, two);
    expect(st == FLASHCL_SUCCESS && flashcl_kv_cache_free_pages(m.cache) == 0 && mirror_matches(ctx, &m),
           "an append that fits still works afterwards", &serving_failures);
    int all[4] = {0, 1, 2, 3}, ones[4] = {1, 1, 1, 1};
    paged_check(ctx, &m, 4, all, ones, 4, 1, 1, 0, "attention after exhaustion", NULL);
    mirror_free(&m);
}

/* ---- varlen ------------------------------------------------------------------------------ */

static void varlen_case(flashcl_context *ctx, flashcl_dtype dt, int causal, int splits, const char *name) {
    /* Lengths include an empty query set and an empty key set. */
    const int n = 5, Hq = 6, Hk = 2, D = 64;
    const int nq[5] = {17, 1, 0, 40, 3}, nk[5] = {17, 130, 9, 33, 0};
    int cu_q[6] = {0}, cu_k[6] = {0};
    for (int i = 0; i < n; ++i)
        cu_q[i + 1] = cu_q[i] + nq[i], cu_k[i + 1] = cu_k[i] + nk[i];
    const size_t es = flashcl_dtype_size(dt), q_el = (size_t)cu_q[n] * Hq * D, k_el = (size_t)cu_k[n] * Hk * D;
    const size_t lse_n = (size_t)cu_q[n] * Hq;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, serving_seed());
    void *q = test_xmalloc(q_el * es), *k = test_xmalloc(k_el * es), *v = test_xmalloc(k_el * es), *out = test_xmalloc(q_el * es);
    float *lse = test_xmalloc(lse_n * 4);
    flashcl_ref_fill_normal(&rng, q, dt, q_el, 1.0);
    flashcl_ref_fill_normal(&rng, k, dt, k_el, 1.0);
    flashcl_ref_fill_normal(&rng, v, dt, k_el, 1.0);
    flashcl_ref_poison(out, dt, q_el);
    flashcl_ref_poison(lse, FLASHCL_FLOAT32, lse_n);
    flashcl_varlen_desc d = test_varlen_desc(dt, n, Hq, Hk, D, cu_q, cu_k);
    d.causal = causal;
    d.num_splits = splits;
    size_t sb = 0;
    flashcl_status st = flashcl_varlen_scratch_size(ctx, &d, &sb);
    cl_mem bq = test_upload(ctx, q, q_el * es), bk = test_upload(ctx, k, k_el * es), bv = test_upload(ctx, v, k_el * es);
    cl_mem bo = test_upload(ctx, out, q_el * es), bl = test_upload(ctx, lse, lse_n * 4);
    cl_mem scratch = sb ? test_upload(ctx, NULL, sb) : NULL;
    if (!st)
        st = flashcl_varlen_forward(ctx, &d, bq, bk, bv, bo, bl, 0, scratch, NULL);
    if (!st) {
        test_download(ctx, bo, out, q_el * es);
        test_download(ctx, bl, lse, lse_n * 4);
    } else {
        printf("  %s: %s\n", flashcl_status_string(st), flashcl_last_error(ctx));
    }
    flashcl_ref_report rep;
    int ok = !st && flashcl_ref_check_varlen(&d, q, k, v, out, lse, 1, &rep);
    /* Each sequence alone through the library's own forward gives the same
     * answer (within both results' tolerance against the reference). */
    double worst = 0.0;
    for (int i = 0; ok && i < n; ++i) {
        if (nq[i] == 0 || nk[i] == 0)
            continue;
        flashcl_attention_desc a = test_attention_desc(dt, 1, Hq, Hk, nq[i], nk[i], D);
        a.causal = causal;
        size_t el = (size_t)nq[i] * Hq * D;
        void *alone = test_xmalloc(el * es);
        flashcl_status s2 = flashcl_attention_forward_host(ctx, &a, (char *)q + (size_t)cu_q[i] * Hq * D * es,
                                                           (char *)k + (size_t)cu_k[i] * Hk * D * es,
                                                           (char *)v + (size_t)cu_k[i] * Hk * D * es, alone, NULL);
        for (size_t x = 0; x < el; ++x) {
            double p = flashcl_ref_load(out, dt, (size_t)cu_q[i] * Hq * D + x), r = flashcl_ref_load(alone, dt, x);
            worst = fmax(worst, s2 == FLASHCL_SUCCESS && isfinite(p) ? fabs(p - r) : INFINITY);
        }
        free(alone);
    }
    ok &= worst <= 2.0 * rep.tolerance;
    char what[160];
    snprintf(what, sizeof what, "%s (err %.2g, vs alone %.2g)", name, st ? -1.0 : rep.max_err, worst);
    expect(ok, what, &serving_failures);
    clReleaseMemObject(bq), clReleaseMemObject(bk), clReleaseMemObject(bv), clReleaseMemObject(bo),
        clReleaseMemObject(bl);
    if (scratch)
        clReleaseMemObject(scratch);
    free(q), free(k), free(v), free(out), free(lse);
}

/* ---- invalid arguments --------------------------------------------------------------------- */

static void errors_suite(flashcl_context *ctx) {
    flashcl_kv_cache_desc cd = {FLASHCL_FLOAT16, 2, 64, 16, 8, 0, FLASHCL_FLOAT16, NULL, NULL};
    flashcl_kv_cache *c = NULL;
    flashcl_kv_cache_desc bad = cd;
    bad.page_size = 257;
    expect(flashcl_kv_cache_create(ctx, &bad, &c) == FLASHCL_ERROR_INVALID_SHAPE && !c, "page_size 257 refused",
           &serving_failures);
    bad = cd;
    bad.dtype = (flashcl_dtype)7;
    expect(flashcl_kv_cache_create(ctx, &bad, &c) == FLASHCL_ERROR_INVALID_ARGUMENT, "bad cache dtype refused",
           &serving_failures);
    flashcl_kv_cache_create(ctx, &cd, &c);
    int s, t;
    flashcl_kv_cache_add_sequence(c, &s);
    int ids[2] = {s, s}, counts[2] = {1, 1};
    cl_mem kv = test_upload(ctx, NULL, 4 * 64 * 2 * 2);
    expect(flashcl_kv_cache_append(c, 2, ids, counts, kv, NULL, kv, NULL, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "append: a sequence twice refused", &serving_failures);
    ids[0] = 99;
    expect(flashcl_kv_cache_append(c, 1, ids, counts, kv, NULL, kv, NULL, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "append: unknown sequence refused", &serving_failures);
    ids[0] = s;
    counts[0] = 5; /* 5 tokens of 128 elements do not fit 512 bytes */
    expect(flashcl_kv_cache_append(c, 1, ids, counts, kv, NULL, kv, NULL, NULL) == FLASHCL_ERROR_OUT_OF_BOUNDS &&
               flashcl_kv_cache_length(c, s) == 0,
           "append: new tokens overrunning their buffer refused", &serving_failures);
    expect(flashcl_kv_cache_fork(c, 42, &t) == FLASHCL_ERROR_INVALID_ARGUMENT, "fork of unknown sequence refused",
           &serving_failures);
    expect(flashcl_kv_cache_free_sequence(c, 42) == FLASHCL_ERROR_INVALID_ARGUMENT, "free of unknown sequence",
           &serving_failures);
    counts[0] = 3;
    flashcl_kv_cache_append(c, 1, ids, counts, kv, NULL, kv, NULL, NULL);

    int cu[2] = {0, 1}, cu_bad[3] = {0, 2, 1};
    flashcl_varlen_desc d = test_varlen_desc(FLASHCL_FLOAT16, 1, 4, 2, 64, cu, cu);
    uint16_t poison[256];
    flashcl_ref_poison(poison, FLASHCL_FLOAT16, 256);
    cl_mem q = test_upload(ctx, poison, 512), o = test_upload(ctx, poison, 512);
    flashcl_varlen_desc e = d;
    e.dtype = FLASHCL_BFLOAT16;
    expect(flashcl_paged_attention(ctx, &e, c, &s, q, o, NULL, 0, NULL, NULL) == FLASHCL_ERROR_DTYPE_MISMATCH,
           "paged: dtype differing from the cache refused", &serving_failures);
    e = d;
    e.heads_q = 3;
    expect(flashcl_paged_attention(ctx, &e, c, &s, q, o, NULL, 0, NULL, NULL) == FLASHCL_ERROR_INVALID_SHAPE,
           "paged: heads_q not a multiple of heads_k refused", &serving_failures);
    e = d;
    e.num_seqs = 2;
    e.cu_seqlens_q = cu_bad;
    int two[2] = {s, s};
    expect(flashcl_paged_attention(ctx, &e, c, two, q, o, NULL, 0, NULL, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "paged: decreasing cu_seqlens_q refused", &serving_failures);
    e = d;
    e.num_splits = 129;
    expect(flashcl_paged_attention(ctx, &e, c, &s, q, o, NULL, 0, NULL, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "paged: num_splits 129 refused", &serving_failures);
    {
        /* Many sequences, the last repeating the first: refused, and named. */
        enum { MANY = 300 };
        int many_ids[MANY], many_cu[MANY + 1];
        many_ids[0] = s, many_cu[0] = 0;
        for (int i = 1; i < MANY; ++i)
            flashcl_kv_cache_add_sequence(c, &many_ids[i]);
        many_ids[MANY - 1] = s;
        for (int i = 0; i < MANY; ++i)
            many_cu[i + 1] = i + 1;
        e = d;
        e.num_seqs = MANY;
        e.cu_seqlens_q = many_cu;
        char want[64];
        snprintf(want, sizeof want, "sequence %d appears twice", s);
        expect(flashcl_paged_attention(ctx, &e, c, many_ids, q, o, NULL, 0, NULL, NULL) ==
                       FLASHCL_ERROR_INVALID_ARGUMENT &&
                   strstr(flashcl_last_error(ctx), want),
               "paged: a sequence repeated 299 places later refused, and named", &serving_failures);
        many_ids[MANY - 1] = many_ids[1];
        flashcl_kv_cache_free_sequence(c, many_ids[1]);
        expect(flashcl_paged_attention(ctx, &e, c, many_ids, q, o, NULL, 0, NULL, NULL) ==
                       FLASHCL_ERROR_INVALID_ARGUMENT &&
                   strstr(flashcl_last_error(ctx), "seq_ids[1]"),
               "paged: a freed sequence refused, and its index named", &serving_failures);
        for (int i = 2; i < MANY - 1; ++i)
            flashcl_kv_cache_free_sequence(c, many_ids[i]);
    }
    e = d;
    e.num_splits = 2;
    size_t need = 0;
    flashcl_paged_scratch_size(ctx, &e, c, &s, &need);
    expect(need > 0 && flashcl_paged_attention(ctx, &e, c, &s, q, o, NULL, 0, NULL, NULL) ==
                           FLASHCL_ERROR_INVALID_ARGUMENT,
           "paged: split without scratch refused", &serving_failures);
    int dead = 77;
    expect(flashcl_paged_attention(ctx, &d, c, &dead, q, o, NULL, 0, NULL, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "paged: unknown sequence refused", &serving_failures);
    e = d;
    e.out.offset = 200; /* 200 + 256 elements > 256 */
    expect(flashcl_varlen_forward(ctx, &e, q, kv, kv, o, NULL, 0, NULL, NULL) == FLASHCL_ERROR_OUT_OF_BOUNDS,
           "varlen: out overrunning its buffer refused", &serving_failures);
    e = d;
    e.cu_seqlens_k = NULL;
    expect(flashcl_varlen_forward(ctx, &e, q, kv, kv, o, NULL, 0, NULL, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "varlen: missing cu_seqlens_k refused", &serving_failures);
    uint16_t back[256];
    test_download(ctx, o, back, 512);
    expect(!memcmp(back, poison, 512), "refused calls left the output untouched", &serving_failures);

    flashcl_merge_desc md;
    memset(&md, 0, sizeof md);
    md.dtype = FLASHCL_FLOAT16;
    md.batch = md.seqlen = md.heads = 1;
    md.head_dim = 64;
    cl_mem l = test_upload(ctx, poison, 64);
    expect(flashcl_attention_merge(ctx, &md, q, l, q, l, o, l, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "merge: lse_out aliasing an input refused", &serving_failures);
    md.head_dim = 0;
    expect(flashcl_attention_merge(ctx, &md, q, l, q, l, o, NULL, NULL) == FLASHCL_ERROR_INVALID_SHAPE,
           "merge: head_dim 0 refused", &serving_failures);
    md.head_dim = 300; /* 300 halfs > 512 bytes */
    expect(flashcl_attention_merge(ctx, &md, q, l, q, l, o, NULL, NULL) == FLASHCL_ERROR_OUT_OF_BOUNDS,
           "merge: tensors overrunning their buffers refused", &serving_failures);
    clReleaseMemObject(q), clReleaseMemObject(o), clReleaseMemObject(l), clReleaseMemObject(kv);
    flashcl_kv_cache_destroy(c);
    flashcl_kv_cache_destroy(NULL);

    flashcl_context *host = NULL;
    flashcl_context_create(&host, "host");
    flashcl_kv_cache *hc = NULL;
    expect(flashcl_kv_cache_create(host, &cd, &hc) == FLASHCL_ERROR_UNSUPPORTED && !hc,
           "host context: KV cache unsupported (clear error)", &serving_failures);
    flashcl_context_destroy(host);
}

/* The decode kernel's source missing (FLASHCL_KERNEL_DIR without
 * paged_decode.cl): its build fails and the call runs the tiled kernel with
 * the same splits, still right. Head dim 48 so that no kernel built earlier
 * in this process answers from the in-memory cache. */
static void decode_build_failure(flashcl_context *ctx) {
    static const char *const keep[] = {"paged_attention.cl", "merge.cl", "kv_cache.cl"};
    char dir[] = "/tmp/flashcl-serving-fallback-XXXXXX";
    int ok = test_kernel_dir(dir, FLASHCL_SOURCE_CL_DIR, keep, (int)(sizeof keep / sizeof keep[0]));
    if (ok) {
        setenv("FLASHCL_KERNEL_DIR", dir, 1);
        mirror m;
        mirror_init(&m, ctx, FLASHCL_FLOAT16, 2, 48, 16, 40);
        int slots[2] = {0, 1}, lens[2] = {200, 9}, ones[2] = {1, 1};
        flashcl_kv_cache_add_sequence(m.cache, &m.ids[0]);
        flashcl_kv_cache_add_sequence(m.cache, &m.ids[1]);
        ok = mirror_append(ctx, &m, 2, slots, lens) == FLASHCL_SUCCESS &&
             paged_check(ctx, &m, 2, slots, ones, 4, 1, 3, 0,
                         "decode kernel source missing: the tiled kernel runs instead, right", NULL);
        mirror_free(&m);
        unsetenv("FLASHCL_KERNEL_DIR");
    } else {
        expect(0, "decode build failure: setting up the source directory", &serving_failures);
    }
    test_kernel_dir_remove(dir);
}

/* FLASHCL_DECODE_PARAMS is strict, and an explicit choice that cannot run is
 * refused before anything is enqueued. */
static void decode_params_suite(flashcl_context *ctx) {
    mirror m;
    flashcl_varlen_desc d;
    const int cu[2] = {0, 1};
    one_sequence(ctx, &m, &d, cu, FLASHCL_FLOAT16, 36, 2, 5); /* 36 halves: not whole 16-byte chunks */
    static const struct {
        const char *env, *why;
    } bad[] = {
        {"KERNEL=decode", "the decode kernel on unaligned rows"},
        {"KERNEL=fast", "an unknown kernel"},
        {"UNROLL=0", "a zero value"},
        {"KERNEL=tiled,BLOCK_N=1048576", "tiles larger than __local memory"},
        {"WG=64,", "a trailing comma"},
        {"SPLITS=2", "an unknown key"},
        {"KERNEL=tiled,BLOCK_N=24,TPR=16", "BLOCK_N not a multiple of TPR"},
        {"META_ARGS=2", "a switch other than 0 or 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        setenv("FLASHCL_DECODE_PARAMS", bad[i].env, 1);
        flashcl_params p;
        flashcl_status st = flashcl_serving_params(ctx, &d, m.cache, &m.ids[0], &p, NULL);
        char what[160];
        snprintf(what, sizeof what, "FLASHCL_DECODE_PARAMS=%s refused: %s", bad[i].env, bad[i].why);
        expect(st == FLASHCL_ERROR_INVALID_PARAMS, what, &serving_failures);
    }
    setenv("FLASHCL_DECODE_PARAMS", "META_ARGS=0", 1);
    {
        flashcl_params p;
        expect(flashcl_serving_params(ctx, &d, m.cache, &m.ids[0], &p, NULL) == FLASHCL_SUCCESS,
               "FLASHCL_DECODE_PARAMS=META_ARGS=0 accepted (off)", &serving_failures);
    }
    setenv("FLASHCL_DECODE_PARAMS", "KERNEL=tiled", 1);
    flashcl_params p;
    expect(flashcl_serving_params(ctx, &d, m.cache, &m.ids[0], &p, NULL) == FLASHCL_SUCCESS &&
               !strcmp(p.variant, "paged") && !strcmp(p.source, "FLASHCL_DECODE_PARAMS"),
           "FLASHCL_DECODE_PARAMS=KERNEL=tiled is used and named as the source", &serving_failures);
    mirror_free(&m);
    setenv("FLASHCL_DECODE_PARAMS", "KERNEL=decode", 1);
}

/* Appends 3 tokens to a fresh one-sequence cache: 1 if the slot list was
 * uploaded, 0 if it went by value, -1 if the append failed. */
static int small_append_uploads(flashcl_context *ctx) {
    mirror a;
    mirror_init(&a, ctx, FLASHCL_FLOAT16, 1, 64, 16, 8);
    int id, three = 3;
    flashcl_kv_cache_add_sequence(a.cache, &id);
    cl_mem kv = test_upload(ctx, NULL, (size_t)3 * 64 * 2);
    flashcl_status st = flashcl_kv_cache_append(a.cache, 1, &id, &three, kv, NULL, kv, NULL, NULL);
    clFinish(flashcl_context_cl_queue(ctx));
    const int uploaded = st != FLASHCL_SUCCESS ? -1 : a.cache->slots != NULL;
    clReleaseMemObject(kv);
    mirror_free(&a);
    return uploaded;
}

/* The forced-kernel modes (decode, by-value, mma) set FLASHCL_DECODE_PARAMS
 * themselves; what the caller had set comes first and stays (the forced keys,
 * later, win), so `FLASHCL_DECODE_PARAMS=STAGES=3 test_serving mma` validates
 * that tuning before bench/h200.sh times it. */
static char caller_params[256];

static void force_params(const char *forced) {
    char v[512];
    snprintf(v, sizeof v, "%s%s%s", caller_params, caller_params[0] ? "," : "", forced);
    setenv("FLASHCL_DECODE_PARAMS", v, 1);
}

static void restore_params(void) {
    if (caller_params[0])
        setenv("FLASHCL_DECODE_PARAMS", caller_params, 1);
    else
        unsetenv("FLASHCL_DECODE_PARAMS");
}

/* META_ARGS=1 (the description by value, no upload) under `params`: paged
 * decode with and without splits over several calls (the split counters must
 * be zero again after each), varlen, the out-of-order queue, and a batch too
 * large for the argument space (uploaded as before). */
static void by_value_suite(flashcl_context *ctx, const char *params, const char *kernel) {
    char what[128];
    force_params(params);
    snprintf(what, sizeof what, "%s, description by value: f16 D64 page 16", kernel);
    paged_suite(ctx, FLASHCL_FLOAT16, 2, 4, 64, 16, 300, what);
    snprintf(what, sizeof what, "%s, description by value: varlen non-causal, 2 splits", kernel);
    varlen_case(ctx, FLASHCL_FLOAT16, 0, 2, what);
    snprintf(what, sizeof what, "%s, description by value: out-of-order queue, four calls", kernel);
    ooo_suite(ctx, 0, what);
    /* rusticl miscompiles by-value lists (internal.h, is_rusticl): uploaded there. */
    const int by_value = !ctx->info.is_rusticl;
    snprintf(what, sizeof what, "%s, description by value: %s", kernel,
             by_value ? "taken (the split-counter buffer exists)" : "not on rusticl (uploaded)");
    expect((ctx->serving_counters != NULL) == by_value, what, &serving_failures);
    /* Appends go by value under the same switch: forks with copy-on-write,
     * tables that move and a rebuilt table buffer, the out-of-order queue. */
    fork_suite(ctx);
    device_tables_suite(ctx);
    ooo_fork_case(ctx);
    ooo_appends_case(ctx);
    snprintf(what, sizeof what, "%s, slot list by value: a small append uploads %s", kernel,
             by_value ? "nothing" : "its list on rusticl");
    expect((small_append_uploads(ctx) == 0) == by_value, what, &serving_failures);
    /* 300 one-token sequences: 1800 ints of description, more than any
     * device's argument space: uploaded (the upload buffer holds them). */
    mirror m;
    mirror_init(&m, ctx, FLASHCL_FLOAT16, 1, 64, 16, 400);
    int ids[300], cu[301], lens[300];
    for (int i = 0; i < 300; ++i) {
        flashcl_kv_cache_add_sequence(m.cache, &ids[i]);
        lens[i] = 1 + i % 17;
        cu[i] = i;
    }
    cu[300] = 300;
    cl_mem kv = test_upload(ctx, NULL, (size_t)17 * 300 * 64 * 2);
    flashcl_status st = FLASHCL_SUCCESS;
    for (int i = 0; i < 300 && !st; ++i)
        st = flashcl_kv_cache_append(m.cache, 1, &ids[i], &lens[i], kv, NULL, kv, NULL, NULL);
    flashcl_varlen_desc d = test_varlen_desc(FLASHCL_FLOAT16, 300, 4, 1, 64, cu, NULL);
    d.causal = 1;
    cl_mem q = test_upload(ctx, NULL, (size_t)300 * 4 * 64 * 2), o = test_upload(ctx, NULL, (size_t)300 * 4 * 64 * 2);
    size_t sb = 0;
    if (!st)
        st = flashcl_paged_scratch_size(ctx, &d, m.cache, ids, &sb);
    cl_mem scratch = sb ? test_upload(ctx, NULL, sb) : NULL;
    if (!st)
        st = flashcl_paged_attention(ctx, &d, m.cache, ids, q, o, NULL, 0, scratch, NULL);
    clFinish(flashcl_context_cl_queue(ctx));
    snprintf(what, sizeof what, "%s, description by value: a 300-sequence batch is uploaded instead", kernel);
    expect(st == FLASHCL_SUCCESS && ctx->serving_meta_bytes >= 1800 * sizeof(int), what, &serving_failures);
    clReleaseMemObject(kv), clReleaseMemObject(q), clReleaseMemObject(o);
    if (scratch)
        clReleaseMemObject(scratch);
    mirror_free(&m);
    restore_params();
}

/* META_ARGS=0 (`params`) on a context of its own: the description and an
 * append's slot list are uploaded, whatever the default, and the answers
 * stay right. */
static void upload_case(const char *params, const char *kernel) {
    char what[128];
    flashcl_context *up = test_context();
    force_params(params);
    snprintf(what, sizeof what, "%s, META_ARGS=0: f16 D128 page 32, GQA 4", kernel);
    paged_suite(up, FLASHCL_FLOAT16, 2, 4, 128, 32, 700, what);
    snprintf(what, sizeof what, "%s, META_ARGS=0: the description and a slot list are uploaded", kernel);
    expect(small_append_uploads(up) == 1 && up->serving_counters == NULL && up->serving_meta_bytes > 0, what,
           &serving_failures);
    flashcl_context_destroy(up);
    restore_params();
}

/* Whether FLASHCL_DECODE_PARAMS=KERNEL=mma is accepted here (f16, D=64). */
static int mma_available(flashcl_context *ctx) {
    mirror m;
    flashcl_varlen_desc d;
    const int cu[2] = {0, 1};
    one_sequence(ctx, &m, &d, cu, FLASHCL_FLOAT16, 64, 1, 3);
    flashcl_params p;
    int ok = flashcl_serving_params(ctx, &d, m.cache, &m.ids[0], &p, NULL) == FLASHCL_SUCCESS &&
             !strncmp(p.variant, "decode-mma", 10);
    mirror_free(&m);
    return ok;
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : "all";
    const char *env = getenv("FLASHCL_DECODE_PARAMS");
    snprintf(caller_params, sizeof caller_params, "%s", env ? env : "");
    flashcl_context *ctx = test_context();
    test_seed();
    int all = !strcmp(only, "all");
    if (all || !strcmp(only, "merge")) {
        merge_random(ctx, FLASHCL_FLOAT16, 0, 1);
        merge_random(ctx, FLASHCL_BFLOAT16, 1, 0);
        merge_random(ctx, FLASHCL_FLOAT32, 0, 0);
        merge_equals_full(ctx, "merge of two key halves equals full attention");
        flashcl_context *host = NULL;
        if (flashcl_context_create(&host, "host") == FLASHCL_SUCCESS)
            merge_equals_full(host, "the same on the host path");
        flashcl_context_destroy(host);
    }
    if (all || !strcmp(only, "paged")) {
        paged_suite(ctx, FLASHCL_FLOAT16, 2, 4, 64, 16, 300, "f16 D64 page 16");
        paged_suite(ctx, FLASHCL_BFLOAT16, 1, 3, 40, 1, 70, "bf16 D40 page 1");
        paged_suite(ctx, FLASHCL_FLOAT32, 2, 1, 96, 256, 600, "f32 D96 page 256");
        paged_softcap = 2.0f; /* scores of order one: tanh bends them */
        paged_suite(ctx, FLASHCL_FLOAT16, 2, 4, 64, 16, 300, "f16 D64 page 16, softcap 2");
        paged_softcap = 0.0f;
        fork_suite(ctx);
        device_tables_suite(ctx);
        ooo_fork_case(ctx);
        ooo_appends_case(ctx);
        exhaustion_suite(ctx);
        ooo_suite(ctx, 0, "out-of-order queue: four decode calls sharing a scratch buffer, each right");
        ooo_suite(ctx, 1, "... and when the batch description outgrows its buffer at the second call");
    }
    if (all || !strcmp(only, "varlen")) {
        varlen_case(ctx, FLASHCL_FLOAT16, 1, 1, "varlen causal equals each sequence alone");
        varlen_case(ctx, FLASHCL_FLOAT16, 0, 2, "varlen non-causal, 2 splits");
    }
    if (all || !strcmp(only, "errors"))
        errors_suite(ctx);
    if (!strcmp(only, "decode")) {
        /* The memory-bound decode kernel (cl/paged_decode.cl), forced where
         * the database would pick the tiled one (CPUs): the same suites, so
         * both kernels answer every paged and varlen case. Its shapes need
         * 16-byte rows: D=40 halves and D=96 floats leave lanes idle. */
        force_params("KERNEL=decode");
        paged_suite(ctx, FLASHCL_FLOAT16, 2, 4, 64, 16, 300, "decode kernel: f16 D64 page 16");
        paged_suite(ctx, FLASHCL_BFLOAT16, 1, 3, 40, 1, 70, "decode kernel: bf16 D40 page 1");
        paged_suite(ctx, FLASHCL_FLOAT32, 2, 1, 96, 256, 600, "decode kernel: f32 D96 page 256");
        paged_softcap = 2.0f;
        paged_suite(ctx, FLASHCL_FLOAT16, 2, 4, 64, 16, 300, "decode kernel: f16 D64 page 16, softcap 2");
        paged_softcap = 0.0f;
        varlen_case(ctx, FLASHCL_FLOAT16, 1, 1, "decode kernel: varlen causal equals each sequence alone");
        varlen_case(ctx, FLASHCL_FLOAT16, 0, 2, "decode kernel: varlen non-causal, 2 splits");
        ooo_suite(ctx, 0, "decode kernel: out-of-order queue, four calls sharing a scratch buffer, each right");
        ooo_suite(ctx, 1, "decode kernel: ... and when the batch description outgrows its buffer");
        decode_build_failure(ctx);
        decode_params_suite(ctx);
        restore_params();
    }
    if (!strcmp(only, "oclgrind")) {
        /* Tiny shapes for Oclgrind (ctest -L oclgrind), on the kernel
         * FLASHCL_DECODE_PARAMS picks: the merge, KV appends, decode with
         * and without split-KV (20 and 128 splits: the two-level combine),
         * prompt chunks, varlen (causal; 2 splits), and copy-on-write
         * appends after forks. */
        merge_random(ctx, FLASHCL_FLOAT16, 1, 1);
        paged_suite(ctx, FLASHCL_FLOAT16, 1, 2, 16, 4, 9, "oclgrind: f16 D16 page 4");
        varlen_case(ctx, FLASHCL_FLOAT16, 1, 1, "oclgrind: varlen causal equals each sequence alone");
        varlen_case(ctx, FLASHCL_FLOAT16, 0, 2, "oclgrind: varlen non-causal, 2 splits");
        fork_suite(ctx);
    }
    if (!strcmp(only, "oclgrind-merge")) /* tests/oclgrind_planted.sh's kernel: packed f32, out exactly its size */
        merge_random(ctx, FLASHCL_FLOAT32, 0, 0);
    if (!strcmp(only, "by-value")) {
        by_value_suite(ctx, "KERNEL=decode,META_ARGS=1", "decode kernel");
        upload_case("KERNEL=decode,META_ARGS=0", "decode kernel");
    }
    if (!strcmp(only, "mma")) {
        /* The tensor-core decode kernel (cl/paged_decode_nv.cl), forced, on
         * NVIDIA sm_80+ (bench/h200.sh runs this): head dims 64 to 256, one
         * and several 16-row blocks, splits, varlen. Elsewhere the same
         * shapes run on the device's own kernel, so CI covers the host side
         * of them (the test's mirrors, the reference, the descriptions). */
        force_params("KERNEL=mma");
        const int mma = mma_available(ctx);
        const char *k = mma ? "mma kernel" : "mma shapes, default kernel";
        if (!mma) {
            printf("no tensor-core decode kernel here: its shapes run on the default kernel\n");
            restore_params();
        }
        char what[128];
        static const struct {
            flashcl_dtype dt;
            int hk, group, d, ps, long_len;
            const char *name;
        } shapes[] = {
            {FLASHCL_FLOAT16, 2, 4, 64, 16, 300, "f16 D64 page 16"},
            {FLASHCL_BFLOAT16, 1, 3, 128, 1, 70, "bf16 D128 page 1"},
            {FLASHCL_FLOAT16, 2, 1, 256, 256, 600, "f16 D256 page 256"},
            {FLASHCL_BFLOAT16, 2, 8, 96, 7, 1000, "bf16 D96 page 7, GQA 8"},
            {FLASHCL_FLOAT16, 2, 4, 128, 32, 2000, "f16 D128 page 32, GQA 4"},
            {FLASHCL_FLOAT16, 2, 4, 32, 16, 500, "f16 D32 page 16"},
            {FLASHCL_FLOAT16, 2, 4, 128, 8, 400, "f16 D128 page 8, GQA 4"}, /* 16-key tiles of two pages */
        };
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
            snprintf(what, sizeof what, "%s: %s", k, shapes[i].name);
            paged_suite(ctx, shapes[i].dt, shapes[i].hk, shapes[i].group, shapes[i].d, shapes[i].ps,
                        shapes[i].long_len, what);
        }
        /* Copies staged through registers (REG_COPY), which the host asks
         * for on slices of 1024 keys and more, here on every slice: head dims
         * up to 128, blocks of 4 to 16 rows, pages of 1 to 32 tokens. */
        if (mma)
            force_params("KERNEL=mma,REG_COPY_MIN_KEYS=1");
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
            if (shapes[i].d < 64 || shapes[i].d > 128)
                continue;
            snprintf(what, sizeof what, "%s, copies through registers: %s", k, shapes[i].name);
            paged_suite(ctx, shapes[i].dt, shapes[i].hk, shapes[i].group, shapes[i].d, shapes[i].ps,
                        shapes[i].long_len, what);
        }
        /* A warp a kv head (HEAD_GROUP), every kv head of a shape in one work-group: head dims
         * 64 to 128 that are multiples of 32; the suites' prompt chunks keep one head a group. */
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
            if (shapes[i].d % 32 || shapes[i].d > 128 || shapes[i].group > 8)
                continue;
            char params[64];
            snprintf(params, sizeof params, "KERNEL=mma,HEAD_GROUP=%d", shapes[i].hk);
            if (mma)
                force_params(params);
            snprintf(what, sizeof what, "%s, a warp a kv head: %s", k, shapes[i].name);
            paged_suite(ctx, shapes[i].dt, shapes[i].hk, shapes[i].group, shapes[i].d, shapes[i].ps,
                        shapes[i].long_len, what);
        }
        if (mma) /* eight kv heads a group: eight warps */
            force_params("KERNEL=mma,HEAD_GROUP=8");
        snprintf(what, sizeof what, "%s, a warp a kv head: f16 D128 page 16, 8 kv heads", k);
        paged_suite(ctx, FLASHCL_FLOAT16, 8, 4, 128, 16, 700, what);
        /* Several warps a kv head (HEAD_WARPS), which merge in the work-group: 8 or 4 warps on
         * one head (short sequences leave some without a tile), 4 or 2 on each of 2 heads (what
         * the host picks for decoding, decode_head_warps in src/params_serving.c); GPU only. */
        static const struct {
            int heads, warps;
        } hw[] = {{1, 8}, {1, 4}, {2, 4}, {2, 2}};
        for (size_t w = 0; mma && w < sizeof hw / sizeof hw[0]; ++w)
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
                if (shapes[i].d % 32 || shapes[i].d > 128 || shapes[i].group > 8 || shapes[i].hk % hw[w].heads)
                    continue;
                char params[64];
                snprintf(params, sizeof params, "KERNEL=mma,HEAD_GROUP=%d,HEAD_WARPS=%d", hw[w].heads, hw[w].warps);
                force_params(params);
                snprintf(what, sizeof what, "%s, %d warps a kv head, %d heads a group: %s", k, hw[w].warps,
                         hw[w].heads, shapes[i].name);
                paged_suite(ctx, shapes[i].dt, shapes[i].hk, shapes[i].group, shapes[i].d, shapes[i].ps,
                            shapes[i].long_len, what);
            }
        if (mma) {
            force_params("KERNEL=mma,HEAD_GROUP=2,HEAD_WARPS=4");
            snprintf(what, sizeof what, "%s, 4 warps a kv head, 2 heads a group: f16 D128 page 16, 8 kv heads", k);
            paged_suite(ctx, FLASHCL_FLOAT16, 8, 4, 128, 16, 700, what);
        }
        /* A soft-cap of 2 on the one-head kernel and on 8 warps a kv head. */
        static const char *const capped[] = {"KERNEL=mma", "KERNEL=mma,HEAD_GROUP=1,HEAD_WARPS=8"};
        paged_softcap = 2.0f;
        for (size_t c = 0; c < (mma ? 2u : 1u); ++c) {
            if (mma)
                force_params(capped[c]);
            snprintf(what, sizeof what, "%s%s%s, softcap 2: f16 D128 page 16", k, mma ? ", " : "", mma ? capped[c] : "");
            paged_suite(ctx, FLASHCL_FLOAT16, 2, 4, 128, 16, 300, what);
        }
        paged_softcap = 0.0f;
        if (mma)
            force_params("KERNEL=mma");
        snprintf(what, sizeof what, "%s: varlen causal equals each sequence alone", k);
        varlen_case(ctx, FLASHCL_FLOAT16, 1, 1, what);
        snprintf(what, sizeof what, "%s: varlen non-causal, 2 splits", k);
        varlen_case(ctx, FLASHCL_FLOAT16, 0, 2, what);
        snprintf(what, sizeof what, "%s: out-of-order queue, four calls sharing a scratch buffer, each right", k);
        ooo_suite(ctx, 0, what);
        if (mma) { /* (without it, the caller's parameters were restored above) */
            restore_params();
            by_value_suite(ctx, "KERNEL=mma,META_ARGS=1", "mma kernel");
            upload_case("KERNEL=mma,META_ARGS=0", "mma kernel");
        }
    }
    printf("%s\n", serving_failures ? "FAILED" : "all passed");
    flashcl_context_destroy(ctx);
    return serving_failures ? 1 : 0;
}
