/* serving_queues.c: test_serving's cases on an out-of-order queue: forks, appends and decode
 * calls issued back to back with nothing waited for; the library's event chains must order them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serving_common.h"

/* On an out-of-order queue: append to a parent (waiting on nothing), fork it
 * at once, then wait for the append's event only. The child's device table is
 * copied from the parent's on the device, so that copy must come after the
 * append's kernel and before anything that reads the child (repeated: a race
 * shows only sometimes). */
void ooo_fork_case(flashcl_context *base) {
    cl_command_queue qq;
    flashcl_context *ctx = test_out_of_order_context(base, "fork on an out-of-order queue", &qq);
    if (!ctx)
        return;
    int ok = 1;
    for (int round = 0; round < 24 && ok; ++round) {
        flashcl_kv_cache_desc cd = {
            FLASHCL_FLOAT16, 1,    64,  2, 4100, (unsigned long long)(round + 1),
            FLASHCL_FLOAT16, NULL, NULL};
        flashcl_kv_cache *c = NULL;
        int parent, child, n = 8001;
        cl_mem kv = test_upload(ctx, NULL, (size_t)n * 64 * 2);
        cl_event appended = NULL;
        ok &= flashcl_kv_cache_create(ctx, &cd, &c) == FLASHCL_SUCCESS &&
              flashcl_kv_cache_add_sequence(c, &parent) == FLASHCL_SUCCESS &&
              flashcl_kv_cache_append(c, 1, &parent, &n, kv, NULL, kv, NULL, &appended) ==
                  FLASHCL_SUCCESS &&
              flashcl_kv_cache_fork(c, parent, &child) == FLASHCL_SUCCESS;
        if (appended) {
            clWaitForEvents(1, &appended);
            clReleaseEvent(appended);
        }
        clFinish(flashcl_context_cl_queue(ctx));
        ok &= c && device_tables_match(ctx, c);
        flashcl_kv_cache_destroy(c);
        clReleaseMemObject(kv);
    }
    expect(ok, "fork on an out-of-order queue: the child's device table is the parent's, 24 times",
           &serving_failures);
    flashcl_context_destroy(ctx);
    clReleaseCommandQueue(qq);
}

/* On an out-of-order queue: 24 appends back to back, nothing waited for in
 * between. They share the cache's slot-list buffer, so each upload into it
 * must wait for the previous append's kernel, and each kernel for its
 * upload; at the end the pools and the device tables must hold every token. */
void ooo_appends_case(flashcl_context *base) {
    cl_command_queue qq;
    flashcl_context *ctx = test_out_of_order_context(base, "appends on an out-of-order queue", &qq);
    if (!ctx)
        return;
    mirror m;
    mirror_init(&m, ctx, FLASHCL_FLOAT16, 2, 32, 4, 600);
    for (int i = 0; i < 4; ++i)
        flashcl_kv_cache_add_sequence(m.cache, &m.ids[i]);
    enum { ROUNDS = 24 };
    cl_mem bufs[2 * ROUNDS];
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, serving_seed());
    int ok = 1;
    for (int r = 0; r < ROUNDS; ++r) {
        int slots[2] = {r % 4, (r + 1 + r / 4) % 4}, counts[2], ids[2], total = 0;
        if (slots[1] == slots[0])
            slots[1] = (slots[0] + 1) % 4;
        for (int i = 0; i < 2; ++i) {
            counts[i] = 1 + (int)(flashcl_ref_rng_next(&rng) % (r % 3 ? 3 : 40));
            ids[i] = m.ids[slots[i]];
            total += counts[i];
        }
        void *k = test_xmalloc((size_t)total * m.row * 2),
             *v = test_xmalloc((size_t)total * m.row * 2);
        flashcl_ref_fill_normal(&rng, k, FLASHCL_FLOAT16, (size_t)total * m.row, 1.0);
        flashcl_ref_fill_normal(&rng, v, FLASHCL_FLOAT16, (size_t)total * m.row, 1.0);
        bufs[2 * r] = test_upload(ctx, k, (size_t)total * m.row * 2);
        bufs[2 * r + 1] = test_upload(ctx, v, (size_t)total * m.row * 2);
        ok &= flashcl_kv_cache_append(m.cache, 2, ids, counts, bufs[2 * r], NULL, bufs[2 * r + 1],
                                      NULL, NULL) == FLASHCL_SUCCESS;
        for (int i = 0, t = 0; i < 2; t += counts[i], ++i) {
            memcpy((char *)m.k[slots[i]] + (size_t)m.len[slots[i]] * m.row * 2,
                   (char *)k + (size_t)t * m.row * 2, (size_t)counts[i] * m.row * 2);
            memcpy((char *)m.v[slots[i]] + (size_t)m.len[slots[i]] * m.row * 2,
                   (char *)v + (size_t)t * m.row * 2, (size_t)counts[i] * m.row * 2);
            m.len[slots[i]] += counts[i];
        }
        free(k), free(v);
    }
    clFinish(flashcl_context_cl_queue(ctx));
    for (int i = 0; i < 2 * ROUNDS; ++i)
        clReleaseMemObject(bufs[i]);
    expect(ok && mirror_matches(ctx, &m) && device_tables_match(ctx, m.cache),
           "appends on an out-of-order queue, back to back: every token and table entry lands",
           &serving_failures);
    mirror_free(&m);
    flashcl_context_destroy(ctx);
    clReleaseCommandQueue(qq);
}

/* An out-of-order queue: four decode calls back to back, sharing one scratch buffer and the
 * context's upload buffer, none waited for; each answer is its own. The library chains every call
 * after the previous one's last kernel, so this holds for the split-KV merge and the combine pass
 * alike. grow: the first call describes one sequence and the others two with 1300 one-token
 * pages, so the batch description outgrows its first buffer at the second call, and the chain
 * must survive the new buffer. */
void ooo_suite(flashcl_context *base, int grow, const char *name) {
    cl_command_queue qq;
    flashcl_context *ctx = test_out_of_order_context(base, name, &qq);
    if (!ctx)
        return;
    enum { CALLS = 4, HQ = 8, HK = 2, D = 64 };
    const flashcl_dtype dt = FLASHCL_FLOAT16;
    const size_t es = 2, q_el = 2 * HQ * D;
    mirror m;
    mirror_init(&m, ctx, dt, HK, D, grow ? 1 : 16, grow ? 1400 : 64);
    int slots[2] = {0, 1}, lens[2] = {grow ? 1000 : 300, grow ? 300 : 77};
    flashcl_kv_cache_add_sequence(m.cache, &m.ids[0]);
    flashcl_kv_cache_add_sequence(m.cache, &m.ids[1]);
    mirror_append(ctx, &m, 2, slots, lens);
    int cu_q[3] = {0, 1, 2}, cu_k[3] = {0, lens[0], lens[0] + lens[1]};
    flashcl_varlen_desc d = test_varlen_desc(dt, 2, HQ, HK, D, cu_q, NULL);
    d.causal = 1;
    d.num_splits = 3;
    size_t sb = 0;
    flashcl_status st = flashcl_paged_scratch_size(ctx, &d, m.cache, m.ids, &sb);
    cl_mem scratch = sb ? test_upload(ctx, NULL, sb) : NULL;
    void *q[CALLS], *out[CALLS];
    cl_mem bq[CALLS], bo[CALLS];
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, serving_seed());
    for (int i = 0; i < CALLS; ++i) {
        q[i] = test_xmalloc(q_el * es), out[i] = test_xmalloc(q_el * es);
        flashcl_ref_fill_normal(&rng, q[i], dt, q_el, 1.0);
        flashcl_ref_poison(out[i], dt, q_el);
        bq[i] = test_upload(ctx, q[i], q_el * es), bo[i] = test_upload(ctx, out[i], q_el * es);
    }
    /* The i-th call describes sequences first(i) .. 1: with grow, the first only the second. */
#define FIRST(i) (grow && (i) == 0 ? 1 : 0)
    for (int i = 0; !st && i < CALLS; ++i) {
        flashcl_varlen_desc di = d;
        di.num_seqs = 2 - FIRST(i);
        st = flashcl_paged_attention(ctx, &di, m.cache, m.ids + FIRST(i), bq[i], bo[i], NULL, 0,
                                     scratch, NULL);
    }
    clFinish(qq);
    void *k = test_xmalloc((size_t)cu_k[2] * m.row * es),
         *v = test_xmalloc((size_t)cu_k[2] * m.row * es);
    for (int i = 0; i < 2; ++i) {
        memcpy((char *)k + (size_t)cu_k[i] * m.row * es, m.k[i], (size_t)lens[i] * m.row * es);
        memcpy((char *)v + (size_t)cu_k[i] * m.row * es, m.v[i], (size_t)lens[i] * m.row * es);
    }
    int ok = !st;
    for (int i = 0; i < CALLS; ++i) {
        /* The reference over the same sequences: cu_seqlens from the first one on. */
        const int f = FIRST(i);
        int cu_kf[3] = {0, cu_k[f + 1] - cu_k[f], cu_k[2] - cu_k[f]};
        flashcl_varlen_desc di = d;
        di.num_seqs = 2 - f;
        di.cu_seqlens_k = cu_kf;
        flashcl_ref_report rep;
        test_download(ctx, bo[i], out[i], q_el * es);
        ok &= !st && flashcl_ref_check_varlen(&di, q[i], (char *)k + (size_t)cu_k[f] * m.row * es,
                                              (char *)v + (size_t)cu_k[f] * m.row * es, out[i],
                                              NULL, 1, &rep);
        clReleaseMemObject(bq[i]), clReleaseMemObject(bo[i]);
        free(q[i]), free(out[i]);
    }
#undef FIRST
    expect(ok, name, &serving_failures);
    if (st)
        printf("  %s: %s\n", flashcl_status_string(st), flashcl_last_error(ctx));
    if (scratch)
        clReleaseMemObject(scratch);
    free(k), free(v);
    mirror_free(&m);
    flashcl_context_destroy(ctx);
    clReleaseCommandQueue(qq);
}
