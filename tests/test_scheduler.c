/* test_scheduler.c: the continuous-batching scheduler: nothing lost or duplicated under random traces with preemption, pages returned, continuous beats static; KV truncation.
 *
 * The scheduler runs against a real (tiny) paged KV cache on the test device:
 * every planned step is appended with flashcl_kv_cache_append, as a serving
 * loop would, and decode steps report a random number of accepted tokens.
 * Invariants are checked at every step; FLASHCL_TEST_SEED replays a run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int failures;

typedef struct trace_req {
    int prompt, max_new, arrive_step;
    int finished_count; /* times reported finished */
    long produced;      /* tokens the test reported for it (clamped by the scheduler) */
} trace_req;

typedef struct run_result {
    long steps, slot_steps, busy_slot_steps, preemptions, tokens;
    long decodes, max_decode_tokens; /* decode entries planned, and the most tokens one had */
    int ok;
} run_result;

/* Runs a trace to completion; checks invariants; 1 in result->ok when they all held. */
static run_result run_trace(flashcl_context *ctx, flashcl_schedule_mode mode, trace_req *reqs, int n, int max_batch,
                            int budget, int spec, int page_size, int num_pages, uint64_t seed, int verbose) {
    run_result res;
    memset(&res, 0, sizeof res);
    res.ok = 1;
    flashcl_kv_cache_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.dtype = FLASHCL_FLOAT32;
    cd.heads_k = 1;
    cd.head_dim = 1;
    cd.page_size = page_size;
    cd.num_pages = num_pages;
    cd.page_order_seed = seed | 1;
    flashcl_kv_cache *cache = NULL;
    flashcl_scheduler *sched = NULL;
    flashcl_scheduler_desc sd = {mode, max_batch, budget, spec};
    if (flashcl_kv_cache_create(ctx, &cd, &cache) || flashcl_scheduler_create(cache, &sd, &sched)) {
        printf("  setup failed: %s\n", flashcl_last_error(ctx));
        res.ok = 0;
        flashcl_kv_cache_destroy(cache);
        return res;
    }
    cl_int err;
    cl_mem kv = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE, (size_t)budget * 4, NULL, &err);
    int *produced = malloc((size_t)max_batch * sizeof(int)), *fin = malloc((size_t)max_batch * sizeof(int));
    int *index_of = malloc((size_t)n * sizeof(int)); /* request id -> trace index (identity here) */
    for (int i = 0; i < n; ++i) {
        reqs[i].finished_count = 0;
        reqs[i].produced = 0;
        index_of[i] = i;
    }
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    int added = 0, done = 0;
    for (long step = 0; done < n && step < 1000000; ++step) {
        while (added < n && reqs[added].arrive_step <= step) {
            if (flashcl_scheduler_add(sched, added, reqs[added].prompt, reqs[added].max_new)) {
                printf("  add %d: %s\n", added, flashcl_last_error(ctx));
                res.ok = 0;
            }
            added++;
        }
        flashcl_schedule s;
        if (flashcl_scheduler_step(sched, &s)) {
            printf("  step: %s\n", flashcl_last_error(ctx));
            res.ok = 0;
            break;
        }
        res.preemptions += s.num_preempted;
        if (s.num_seqs == 0) {
            flashcl_scheduler_stats st;
            flashcl_scheduler_get_stats(sched, &st);
            if (st.waiting || st.running) { /* work queued but nothing planned: a stall */
                printf("  step %ld: %d waiting, %d running, nothing scheduled\n", step, st.waiting, st.running);
                res.ok = 0;
                break;
            }
            continue;
        }
        /* invariants of the plan */
        if (s.total_tokens > budget || s.num_seqs > max_batch) {
            printf("  step %ld: %d tokens (budget %d), %d sequences\n", step, s.total_tokens, budget, s.num_seqs);
            res.ok = 0;
        }
        for (int i = 0; i < s.num_seqs; ++i) {
            for (int j = 0; j < i; ++j)
                if (s.seq_ids[j] == s.seq_ids[i] || s.request_ids[j] == s.request_ids[i]) {
                    printf("  step %ld: a sequence or request scheduled twice\n", step);
                    res.ok = 0;
                }
            int rid = s.request_ids[i];
            if (rid < 0 || rid >= added || reqs[index_of[rid]].finished_count ||
                flashcl_kv_cache_length(cache, s.seq_ids[i]) != s.context[i] || s.num_tokens[i] < 1) {
                printf("  step %ld: bad entry %d (request %d, context %d vs cache %d)\n", step, i, rid, s.context[i],
                       flashcl_kv_cache_length(cache, s.seq_ids[i]));
                res.ok = 0;
            }
        }
        if (!res.ok)
            break;
        if (flashcl_kv_cache_append(cache, s.num_seqs, s.seq_ids, s.num_tokens, kv, NULL, kv, NULL, NULL)) {
            printf("  step %ld: append: %s\n", step, flashcl_last_error(ctx));
            res.ok = 0;
            break;
        }
        int busy = 0;
        for (int i = 0; i < s.num_seqs; ++i) {
            produced[i] = s.is_prefill[i] ? 1 : 1 + (int)(flashcl_ref_rng_next(&rng) % (uint64_t)s.num_tokens[i]);
            if (!s.is_prefill[i]) {
                busy++;
                res.decodes++;
                if (s.num_tokens[i] > res.max_decode_tokens)
                    res.max_decode_tokens = s.num_tokens[i];
                if (s.num_tokens[i] > 1 + spec) {
                    printf("  step %ld: a decode of %d tokens with spec %d\n", step, s.num_tokens[i], spec);
                    res.ok = 0;
                }
            }
            res.tokens += s.num_tokens[i];
        }
        int nf = 0;
        if (flashcl_scheduler_complete(sched, produced, fin, &nf)) {
            printf("  step %ld: complete: %s\n", step, flashcl_last_error(ctx));
            res.ok = 0;
            break;
        }
        for (int i = 0; i < nf; ++i) {
            if (fin[i] < 0 || fin[i] >= added) {
                printf("  unknown request %d finished\n", fin[i]);
                res.ok = 0;
                continue;
            }
            reqs[index_of[fin[i]]].finished_count++;
            done++;
        }
        res.steps++;
        res.slot_steps += max_batch;
        res.busy_slot_steps += s.num_seqs;
        (void)busy;
    }
    clFinish(flashcl_context_cl_queue(ctx));
    for (int i = 0; i < n; ++i)
        if (reqs[i].finished_count != 1) {
            if (res.ok)
                printf("  request %d finished %d times\n", i, reqs[i].finished_count);
            res.ok = 0;
        }
    flashcl_scheduler_stats st;
    flashcl_scheduler_get_stats(sched, &st);
    if (st.waiting || st.running || st.finished != n) {
        printf("  at the end: %d waiting, %d running, %d finished of %d\n", st.waiting, st.running, st.finished, n);
        res.ok = 0;
    }
    if (flashcl_kv_cache_free_pages(cache) != num_pages) {
        printf("  %d of %d pages free at the end\n", flashcl_kv_cache_free_pages(cache), num_pages);
        res.ok = 0;
    }
    if (verbose)
        printf("  %s: %ld steps, slots busy %.1f%%, %ld preemptions, %ld tokens\n",
               mode == FLASHCL_SCHEDULE_STATIC ? "static" : "continuous", res.steps,
               100.0 * (double)res.busy_slot_steps / (double)(res.slot_steps ? res.slot_steps : 1), res.preemptions,
               res.tokens);
    free(produced);
    free(fin);
    free(index_of);
    clReleaseMemObject(kv);
    flashcl_scheduler_destroy(sched);
    flashcl_kv_cache_destroy(cache);
    return res;
}

static void random_trace(flashcl_ref_rng *rng, trace_req *r, int n, int max_prompt, int max_new, int spread) {
    for (int i = 0; i < n; ++i) {
        r[i].prompt = 1 + (int)(flashcl_ref_rng_next(rng) % (uint64_t)max_prompt);
        r[i].max_new = 1 + (int)(flashcl_ref_rng_next(rng) % (uint64_t)max_new);
        r[i].arrive_step = spread ? (int)(flashcl_ref_rng_next(rng) % (uint64_t)spread) : 0;
    }
    /* arrivals in order of index */
    for (int i = 1; i < n; ++i)
        if (r[i].arrive_step < r[i - 1].arrive_step)
            r[i].arrive_step = r[i - 1].arrive_step;
}

static void test_random_traces(flashcl_context *ctx) {
    const uint64_t seed = test_seed();
    for (int t = 0; t < 6; ++t) {
        flashcl_ref_rng rng;
        flashcl_ref_rng_seed(&rng, seed + 13 * t);
        const int n = 40, spec = t % 3 == 2 ? 3 : 0, mb = 4 + t;
        trace_req reqs[40];
        random_trace(&rng, reqs, n, 40, 30, t % 2 ? 200 : 0);
        /* a pool that holds the largest request but far from the batch: preemption is certain */
        const int ps = 1 + t % 4, pages = (40 + 30 + spec + ps - 1) / ps + 3;
        run_result r = run_trace(ctx, FLASHCL_SCHEDULE_CONTINUOUS, reqs, n, mb, mb * (1 + spec) + 7, spec, ps, pages,
                                 seed + t, 1);
        char what[160];
        snprintf(what, sizeof what,
                 "continuous, trace %d (page %d, %d pages, batch %d, spec %d): every request once, pages back, %ld "
                 "preemptions",
                 t, ps, pages, mb, spec, r.preemptions);
        expect(r.ok && r.preemptions > 0, what, &failures);
        snprintf(what, sizeof what, "trace %d: %ld decode steps planned, up to %ld tokens each (1 + spec %d)", t,
                 r.decodes, r.max_decode_tokens, spec);
        expect(r.decodes > 0 && r.max_decode_tokens == 1 + spec, what, &failures);
        run_result s = run_trace(ctx, FLASHCL_SCHEDULE_STATIC, reqs, n, mb, mb * (1 + spec) + 7, spec, ps, pages,
                                 seed + t, 1);
        snprintf(what, sizeof what, "static, trace %d: every request once, pages back, no preemption", t);
        expect(s.ok && s.preemptions == 0, what, &failures);
    }
}

/* Mixed output lengths, all arriving at once, a pool large enough for any
 * mode: continuous needs fewer steps and keeps more slots busy. */
static void test_continuous_beats_static(flashcl_context *ctx) {
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, test_seed() + 99);
    enum { N = 48 };
    trace_req reqs[N];
    for (int i = 0; i < N; ++i) {
        reqs[i].prompt = 4 + (int)(flashcl_ref_rng_next(&rng) % 12);
        /* output lengths 2 .. 200, log-uniform-ish: most short, some long */
        double u = flashcl_ref_rng_uniform(&rng);
        reqs[i].max_new = 2 + (int)(198.0 * u * u * u);
        reqs[i].arrive_step = 0;
    }
    run_result c = run_trace(ctx, FLASHCL_SCHEDULE_CONTINUOUS, reqs, N, 8, 64, 0, 16, 200, 7, 1);
    run_result s = run_trace(ctx, FLASHCL_SCHEDULE_STATIC, reqs, N, 8, 64, 0, 16, 200, 7, 1);
    double uc = (double)c.busy_slot_steps / (double)c.slot_steps, us = (double)s.busy_slot_steps / (double)s.slot_steps;
    char what[160];
    snprintf(what, sizeof what, "mixed lengths: continuous %ld steps (%.0f%% slots busy) < static %ld steps (%.0f%%)",
             c.steps, 100 * uc, s.steps, 100 * us);
    expect(c.ok && s.ok && c.steps < s.steps && uc > us, what, &failures);
}

static void test_truncate_and_errors(flashcl_context *ctx) {
    flashcl_kv_cache_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.dtype = FLASHCL_FLOAT32;
    cd.heads_k = 1;
    cd.head_dim = 2;
    cd.page_size = 4;
    cd.num_pages = 8;
    flashcl_kv_cache *cache = NULL;
    if (flashcl_kv_cache_create(ctx, &cd, &cache)) {
        expect(0, "cache for the truncate test", &failures);
        return;
    }
    cl_int err;
    float host[40];
    for (int i = 0; i < 40; ++i)
        host[i] = (float)i;
    cl_mem kv = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host,
                               host, &err);
    int a, b, ten = 10, three = 3;
    flashcl_kv_cache_add_sequence(cache, &a);
    flashcl_kv_cache_append(cache, 1, &a, &ten, kv, NULL, kv, NULL, NULL); /* 3 pages */
    flashcl_kv_cache_fork(cache, a, &b);                                  /* shares all 3 */
    int ok = flashcl_kv_cache_truncate(cache, a, 5) == FLASHCL_SUCCESS && flashcl_kv_cache_length(cache, a) == 5 &&
             flashcl_kv_cache_free_pages(cache) == 5; /* page 3 still held by b */
    ok &= flashcl_kv_cache_truncate(cache, b, 4) == FLASHCL_SUCCESS && flashcl_kv_cache_free_pages(cache) == 6;
    /* a's partly filled page 2 is shared no more... a holds pages 0,1; b holds page 0 */
    ok &= flashcl_kv_cache_append(cache, 1, &a, &three, kv, NULL, kv, NULL, NULL) == FLASHCL_SUCCESS &&
          flashcl_kv_cache_length(cache, a) == 8;
    /* b appends into its full page 0? it is full (4 tokens): a new page */
    ok &= flashcl_kv_cache_append(cache, 1, &b, &three, kv, NULL, kv, NULL, NULL) == FLASHCL_SUCCESS;
    float pool[8 * 4 * 2];
    clEnqueueReadBuffer(flashcl_context_cl_queue(ctx), flashcl_kv_cache_k_pool(cache), CL_TRUE, 0, sizeof pool, pool, 0,
                        NULL, NULL);
    int pages[4], count;
    flashcl_kv_cache_page_table(cache, a, pages, 4, &count);
    /* a's tokens 0..4 are the first append's, 5..7 the second's (elements 0..5 of kv) */
    for (int t = 0; t < 8 && ok; ++t) {
        float want = t < 5 ? (float)(2 * t) : (float)(2 * (t - 5));
        ok &= pool[(pages[t / 4] * 4 + t % 4) * 2] == want;
    }
    expect(ok, "truncate: pages return to the free list (shared ones when the last holder drops them), appends resume",
           &failures);
    expect(flashcl_kv_cache_truncate(cache, a, 9) == FLASHCL_ERROR_INVALID_ARGUMENT &&
               flashcl_kv_cache_truncate(cache, a, -1) == FLASHCL_ERROR_INVALID_ARGUMENT &&
               flashcl_kv_cache_truncate(cache, 77, 0) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "truncate: longer than the sequence, negative, or no such sequence -> invalid argument", &failures);
    flashcl_kv_cache_free_sequence(cache, a);
    flashcl_kv_cache_free_sequence(cache, b);

    flashcl_scheduler *s = NULL;
    flashcl_scheduler_desc bad = {FLASHCL_SCHEDULE_CONTINUOUS, 4, 7, 1};
    expect(flashcl_scheduler_create(cache, &bad, &s) == FLASHCL_ERROR_INVALID_ARGUMENT && !s,
           "scheduler: token budget below max_batch * (1 + spec) -> invalid argument", &failures);
    flashcl_scheduler_desc d = {FLASHCL_SCHEDULE_CONTINUOUS, 4, 16, 0};
    flashcl_scheduler_create(cache, &d, &s);
    expect(flashcl_scheduler_add(s, 1, 30, 3) == FLASHCL_ERROR_OUT_OF_PAGES,
           "scheduler: a request larger than the whole cache -> out of pages", &failures);
    expect(flashcl_scheduler_add(s, 1, 5, 3) == FLASHCL_SUCCESS &&
               flashcl_scheduler_add(s, 1, 5, 3) == FLASHCL_ERROR_INVALID_ARGUMENT &&
               flashcl_scheduler_add(s, 2, 0, 3) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "scheduler: duplicate id or empty prompt -> invalid argument", &failures);
    flashcl_schedule plan;
    int produced[4] = {1, 1, 1, 1};
    expect(flashcl_scheduler_complete(s, produced, NULL, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "scheduler: complete without a step -> invalid argument", &failures);
    flashcl_scheduler_step(s, &plan);
    expect(plan.num_seqs == 1 && plan.num_tokens[0] == 5 && plan.is_prefill[0] &&
               flashcl_scheduler_step(s, &plan) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "scheduler: a second step before complete -> invalid argument", &failures);
    expect(flashcl_scheduler_complete(s, produced, NULL, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "scheduler: complete before the append -> invalid argument (nothing changes)", &failures);
    flashcl_scheduler_destroy(s); /* frees its sequence */
    expect(flashcl_kv_cache_free_pages(cache) == 8, "scheduler: destroy frees its sequences", &failures);
    clReleaseMemObject(kv);
    flashcl_kv_cache_destroy(cache);
}

int main(void) {
    flashcl_context *ctx = test_context();
    if (flashcl_context_is_host(ctx)) {
        printf("the paged KV cache needs an OpenCL device: skipped\n");
        flashcl_context_destroy(ctx);
        return 0;
    }
    test_truncate_and_errors(ctx);
    test_random_traces(ctx);
    test_continuous_beats_static(ctx);
    flashcl_context_destroy(ctx);
    return test_summary(failures);
}
