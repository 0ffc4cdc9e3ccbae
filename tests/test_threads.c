/* test_threads.c: one context shared by several threads. Each thread runs the
 * forward (float32, float16, and FP8 with per-head descale factors of its
 * own, which travel through the context's shared upload buffer), the backward, speculative verification, paged attention through a
 * shared KV cache, and a forward on an adopted context whose queue the
 * application also uses, over and over with inputs of its own; every result
 * must equal, bit for bit, what the same call gave when run alone. Errors are
 * per thread: one thread's failed call never shows in another's
 * flashcl_last_error. Run under ThreadSanitizer by CI (scripts/tsan.sh). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum {
    THREADS = 6,
    ROUNDS = 8,
    /* The dense shape (the report: f32, 4 query heads over 2, causal). */
    B = 1, HQ = 4, HK = 2, N = 64, D = 32,
    /* Speculative verification. */
    SPEC_BATCH = 2, SPEC_K = 4, VOCAB = 50,
    /* A float16 forward (on NVIDIA's Hopper, the tensor-core kernel with its TMA slots). */
    HN = 128, HD = 64,
    /* Paged attention: a prompt's last rows against its keys, 16-token pages. */
    PAGE = 16, PAGED_Q = 3, PAGES = 96
};
#define DENSE (B * N * HQ * D)
#define DENSE_K (B * N * HK * D)
#define LSE (B * HQ * N)
#define HALF (B * HN * HQ * HD)
#define HALF_K (B * HN * HK * HD)

/* One thread's inputs and the results its calls gave when run alone. */
typedef struct job {
    int id, paged_keys;
    flashcl_attention_desc desc, half_desc, fp8_desc;
    unsigned char q8[DENSE], k8[DENSE_K], v8[DENSE_K];
    float q8_scale[B * HQ], k8_scale[B * HK], v8_scale[B * HK], out8[DENSE], lse8[LSE];
    uint16_t hq[HALF], hk[HALF_K], hv[HALF_K], hout[HALF];
    float hlse[B * HQ * HN];
    float q[DENSE], k[DENSE_K], v[DENSE_K], dout[DENSE];
    float out[DENSE], lse[LSE], dq[DENSE], dk[DENSE_K], dv[DENSE_K];
    int draft[SPEC_BATCH * SPEC_K], accepted[SPEC_BATCH], tokens[SPEC_BATCH * (SPEC_K + 1)];
    float spec_q[SPEC_BATCH * SPEC_K * VOCAB], spec_p[SPEC_BATCH * (SPEC_K + 1) * VOCAB];
    float *paged_kv, paged_q[PAGED_Q * HQ * D], paged_out[PAGED_Q * HQ * D];
    int failures;
    char first_failure[256];
} job;

static flashcl_context *shared_ctx, *adopted_ctx;
static flashcl_kv_cache *shared_cache;

static void fail(job *j, const char *what, int round) {
    if (!j->failures++)
        snprintf(j->first_failure, sizeof j->first_failure, "thread %d round %d: %s (%s)", j->id, round, what,
                 flashcl_last_error(shared_ctx));
}

/* Probability rows that sum to 1 in float. */
static void fill_probs(flashcl_ref_rng *rng, float *rows, int count) {
    for (int r = 0; r < count; ++r) {
        float *row = rows + (size_t)r * VOCAB, sum = 0;
        for (int i = 0; i < VOCAB; ++i)
            sum += row[i] = (float)(flashcl_ref_rng_uniform(rng) + 0.01);
        for (int i = 0; i < VOCAB; ++i)
            row[i] /= sum;
    }
}

static void job_init(job *j, int id, uint64_t seed) {
    memset(j, 0, sizeof *j);
    j->id = id;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed + 7919u * (uint64_t)id);
    flashcl_attention_desc *d = &j->desc;
    d->dtype = FLASHCL_FLOAT32;
    d->batch = B, d->heads_q = HQ, d->heads_k = HK, d->seqlen_q = N, d->seqlen_k = N, d->head_dim = D;
    d->causal = 1;
    flashcl_ref_fill_normal(&rng, j->q, FLASHCL_FLOAT32, DENSE, 1.0);
    flashcl_ref_fill_normal(&rng, j->k, FLASHCL_FLOAT32, DENSE_K, 1.0);
    flashcl_ref_fill_normal(&rng, j->v, FLASHCL_FLOAT32, DENSE_K, 1.0);
    flashcl_ref_fill_normal(&rng, j->dout, FLASHCL_FLOAT32, DENSE, 1.0);
    j->half_desc = *d;
    j->half_desc.dtype = FLASHCL_FLOAT16;
    j->half_desc.seqlen_q = j->half_desc.seqlen_k = HN;
    j->half_desc.head_dim = HD;
    flashcl_ref_fill_normal(&rng, j->hq, FLASHCL_FLOAT16, HALF, 1.0);
    flashcl_ref_fill_normal(&rng, j->hk, FLASHCL_FLOAT16, HALF_K, 1.0);
    flashcl_ref_fill_normal(&rng, j->hv, FLASHCL_FLOAT16, HALF_K, 1.0);
    /* FP8: the float32 inputs quantized per head; each thread's factors differ. */
    j->fp8_desc = *d;
    j->fp8_desc.dtype = FLASHCL_FLOAT8_E4M3;
    j->fp8_desc.fp8 = (flashcl_fp8_scales){j->q8_scale, j->k8_scale, j->v8_scale, 1, 0};
    flashcl_fp8_quant_desc qd = {.format = FLASHCL_FLOAT8_E4M3, .src_dtype = FLASHCL_FLOAT32, .batch = B,
                                 .seqlen = N, .heads = HQ, .head_dim = D, .per_head = 1};
    flashcl_fp8_quantize_host(&qd, j->q, j->q8, j->q8_scale);
    qd.heads = HK;
    flashcl_fp8_quantize_host(&qd, j->k, j->k8, j->k8_scale);
    flashcl_fp8_quantize_host(&qd, j->v, j->v8, j->v8_scale);
    for (int i = 0; i < SPEC_BATCH * SPEC_K; ++i)
        j->draft[i] = (int)(flashcl_ref_rng_next(&rng) % VOCAB);
    fill_probs(&rng, j->spec_q, SPEC_BATCH * SPEC_K);
    fill_probs(&rng, j->spec_p, SPEC_BATCH * (SPEC_K + 1));
    j->paged_keys = 37 + 5 * id; /* sequences of different lengths, pages not full */
    j->paged_kv = test_xmalloc(sizeof(float) * (size_t)j->paged_keys * HK * D * 2);
    flashcl_ref_fill_normal(&rng, j->paged_kv, FLASHCL_FLOAT32, (size_t)j->paged_keys * HK * D * 2, 1.0);
    flashcl_ref_fill_normal(&rng, j->paged_q, FLASHCL_FLOAT32, PAGED_Q * HQ * D, 1.0);
}

/* Paged attention of j's sequence, appended to the shared cache under a new
 * id that is dropped afterwards: out [PAGED_Q][HQ][D]. */
static flashcl_status run_paged(job *j, float *out) {
    size_t kv_bytes = sizeof(float) * (size_t)j->paged_keys * HK * D;
    cl_mem kv = test_upload(shared_ctx, j->paged_kv, 2 * kv_bytes);
    cl_mem q = test_upload(shared_ctx, j->paged_q, sizeof j->paged_q);
    cl_mem o = test_upload(shared_ctx, NULL, sizeof j->paged_out);
    flashcl_layout v_at = {.offset = (size_t)j->paged_keys * HK * D};
    int seq = -1, cu_q[2] = {0, PAGED_Q};
    flashcl_varlen_desc d = {.dtype = FLASHCL_FLOAT32, .num_seqs = 1, .heads_q = HQ, .heads_k = HK, .head_dim = D,
                             .cu_seqlens_q = cu_q, .causal = 1};
    size_t scratch_bytes = 0;
    cl_mem scratch = NULL;
    flashcl_status st = flashcl_kv_cache_add_sequence(shared_cache, &seq);
    if (st == FLASHCL_SUCCESS)
        st = flashcl_kv_cache_append(shared_cache, 1, &seq, &j->paged_keys, kv, NULL, kv, &v_at, NULL);
    if (st == FLASHCL_SUCCESS)
        st = flashcl_paged_scratch_size(shared_ctx, &d, shared_cache, &seq, &scratch_bytes);
    if (st == FLASHCL_SUCCESS && scratch_bytes)
        scratch = test_upload(shared_ctx, NULL, scratch_bytes);
    if (st == FLASHCL_SUCCESS)
        st = flashcl_paged_attention(shared_ctx, &d, shared_cache, &seq, q, o, NULL, 0, scratch, NULL);
    if (st == FLASHCL_SUCCESS)
        test_download(shared_ctx, o, out, sizeof j->paged_out);
    if (seq >= 0 && flashcl_kv_cache_free_sequence(shared_cache, seq) != FLASHCL_SUCCESS && st == FLASHCL_SUCCESS)
        st = FLASHCL_ERROR_INVALID_ARGUMENT;
    if (scratch)
        clReleaseMemObject(scratch);
    clReleaseMemObject(kv);
    clReleaseMemObject(q);
    clReleaseMemObject(o);
    return st;
}

/* The application's pattern on an adopted context: its own threads enqueue
 * their uploads on the shared in-order queue, call flashcl, and read back;
 * the queue's order, not flashcl's lock, keeps each thread's commands in step. */
static flashcl_status run_adopted(job *j, float *out) {
    cl_command_queue queue = flashcl_context_cl_queue(adopted_ctx);
    cl_mem q = test_upload(adopted_ctx, NULL, sizeof j->q), k = test_upload(adopted_ctx, NULL, sizeof j->k);
    cl_mem v = test_upload(adopted_ctx, NULL, sizeof j->v), o = test_upload(adopted_ctx, NULL, sizeof j->out);
    cl_int err = clEnqueueWriteBuffer(queue, q, CL_FALSE, 0, sizeof j->q, j->q, 0, NULL, NULL);
    err |= clEnqueueWriteBuffer(queue, k, CL_FALSE, 0, sizeof j->k, j->k, 0, NULL, NULL);
    err |= clEnqueueWriteBuffer(queue, v, CL_FALSE, 0, sizeof j->v, j->v, 0, NULL, NULL);
    flashcl_status st = err ? FLASHCL_ERROR_INVALID_ARGUMENT
                            : flashcl_attention_forward(adopted_ctx, &j->desc, q, k, v, o, NULL, 0, NULL);
    if (st == FLASHCL_SUCCESS && clEnqueueReadBuffer(queue, o, CL_TRUE, 0, sizeof j->out, out, 0, NULL, NULL))
        st = FLASHCL_ERROR_INVALID_ARGUMENT;
    clReleaseMemObject(q);
    clReleaseMemObject(k);
    clReleaseMemObject(v);
    clReleaseMemObject(o);
    return st;
}

/* The results of one round of j's calls. */
typedef struct results {
    float out[DENSE], lse[LSE], dq[DENSE], dk[DENSE_K], dv[DENSE_K];
    uint16_t hout[HALF];
    float hlse[B * HQ * HN], out8[DENSE], lse8[LSE];
    int accepted[SPEC_BATCH], tokens[SPEC_BATCH * (SPEC_K + 1)];
    float paged_out[PAGED_Q * HQ * D], adopted_out[DENSE];
} results;

/* One round; 0 when every call succeeded (then *r holds the results). */
static int run_round(job *j, results *r, int round) {
    flashcl_ref_poison(r, FLASHCL_FLOAT32, sizeof *r / sizeof(float));
    flashcl_backward_options opts = {.deterministic = 1};
    flashcl_spec_desc spec = {.batch = SPEC_BATCH, .num_draft = SPEC_K, .vocab = VOCAB, .seed = 42, .offset = 7};
    int device = !flashcl_context_is_host(shared_ctx);
    if (flashcl_attention_forward_host(shared_ctx, &j->desc, j->q, j->k, j->v, r->out, r->lse)) {
        fail(j, "forward_host failed", round);
        return 1;
    }
    if (flashcl_last_error(shared_ctx)[0]) /* a success leaves this thread no message */
        fail(j, "a successful call left a message", round);
    if (flashcl_attention_backward_host(shared_ctx, &j->desc, &opts, j->q, j->k, j->v, r->out, j->dout, r->lse,
                                        r->dq, r->dk, r->dv)) {
        fail(j, "backward_host failed", round);
        return 1;
    }
    if (flashcl_attention_forward_host(shared_ctx, &j->half_desc, j->hq, j->hk, j->hv, r->hout, r->hlse)) {
        fail(j, "float16 forward_host failed", round);
        return 1;
    }
    if (flashcl_attention_forward_host(shared_ctx, &j->fp8_desc, j->q8, j->k8, j->v8, r->out8, r->lse8)) {
        fail(j, "FP8 forward_host failed", round);
        return 1;
    }
    if (flashcl_spec_verify_host(shared_ctx, &spec, j->draft, j->spec_q, j->spec_p, r->accepted, r->tokens)) {
        fail(j, "spec_verify_host failed", round);
        return 1;
    }
    if (device && run_paged(j, r->paged_out)) {
        fail(j, "paged attention failed", round);
        return 1;
    }
    if (device && run_adopted(j, r->adopted_out)) {
        fail(j, "forward on the adopted context failed", round);
        return 1;
    }
    /* A call that fails: its message is this thread's, and names the field. */
    flashcl_attention_desc bad = j->desc;
    bad.head_dim = 0;
    if (flashcl_attention_forward_host(shared_ctx, &bad, j->q, j->k, j->v, r->adopted_out, NULL) == FLASHCL_SUCCESS ||
        !strstr(flashcl_last_error(shared_ctx), "head_dim"))
        fail(j, "an invalid call was not reported to its own thread", round);
    return 0;
}

static void compare(job *j, const results *r, int round) {
    int device = !flashcl_context_is_host(shared_ctx);
#define SAME(field, what)                                                                                         \
    if (memcmp(r->field, j->field, sizeof r->field))                                                               \
        fail(j, what " differs from the single-threaded call", round);
    SAME(out, "forward out")
    SAME(lse, "forward lse")
    SAME(dq, "dq")
    SAME(dk, "dk")
    SAME(dv, "dv")
    SAME(hout, "float16 forward out")
    SAME(hlse, "float16 forward lse")
    SAME(out8, "FP8 forward out")
    SAME(lse8, "FP8 forward lse")
    SAME(accepted, "spec accepted")
    SAME(tokens, "spec tokens")
    if (device) {
        SAME(paged_out, "paged out")
        if (memcmp(r->adopted_out, j->out, sizeof j->out))
            fail(j, "the adopted context's forward differs from the single-threaded call", round);
    }
#undef SAME
}

static void *worker(void *arg) {
    job *j = arg;
    results *r = test_xmalloc(sizeof *r);
    for (int round = 0; round < ROUNDS && !j->failures; ++round)
        if (!run_round(j, r, round))
            compare(j, r, round);
    free(r);
    return NULL;
}

int main(void) {
    int failures = 0;
    uint64_t seed = test_seed();
    shared_ctx = test_context();
    int device = !flashcl_context_is_host(shared_ctx);
    if (device) {
        flashcl_kv_cache_desc cd = {.dtype = FLASHCL_FLOAT32, .heads_k = HK, .head_dim = D, .page_size = PAGE,
                                    .num_pages = PAGES, .page_order_seed = seed | 1};
        if (flashcl_kv_cache_create(shared_ctx, &cd, &shared_cache) ||
            flashcl_context_adopt(&adopted_ctx, flashcl_context_cl_context(shared_ctx),
                                  flashcl_context_cl_device(shared_ctx), flashcl_context_cl_queue(shared_ctx))) {
            fprintf(stderr, "setup failed: %s\n", flashcl_last_error(shared_ctx));
            return 1;
        }
    }

    /* Each thread's calls alone first: the results every threaded round must repeat. */
    static job jobs[THREADS];
    results *alone = test_xmalloc(sizeof *alone);
    for (int t = 0; t < THREADS; ++t) {
        job *j = &jobs[t];
        job_init(j, t, seed);
        if (run_round(j, alone, -1) || j->failures) {
            fprintf(stderr, "%s\n", j->first_failure);
            return 1;
        }
        memcpy(j->out, alone->out, sizeof j->out);
        memcpy(j->lse, alone->lse, sizeof j->lse);
        memcpy(j->dq, alone->dq, sizeof j->dq);
        memcpy(j->dk, alone->dk, sizeof j->dk);
        memcpy(j->dv, alone->dv, sizeof j->dv);
        memcpy(j->hout, alone->hout, sizeof j->hout);
        memcpy(j->hlse, alone->hlse, sizeof j->hlse);
        memcpy(j->out8, alone->out8, sizeof j->out8);
        memcpy(j->lse8, alone->lse8, sizeof j->lse8);
        memcpy(j->accepted, alone->accepted, sizeof j->accepted);
        memcpy(j->tokens, alone->tokens, sizeof j->tokens);
        memcpy(j->paged_out, alone->paged_out, sizeof j->paged_out);
        /* ... and those single-threaded results are right. */
        flashcl_ref_report report;
        int ok = flashcl_ref_check_forward(&j->desc, j->q, j->k, j->v, j->out, j->lse, 1, &report);
        ok = ok && flashcl_ref_check_forward(&j->half_desc, j->hq, j->hk, j->hv, j->hout, j->hlse, 1, &report);
        ok = ok && flashcl_ref_check_forward(&j->fp8_desc, j->q8, j->k8, j->v8, j->out8, j->lse8, 1, &report);
        if (ok && device)
            ok = !memcmp(alone->adopted_out, j->out, sizeof j->out);
        flashcl_ref_grad_report grads;
        flashcl_backward_options opts = {.deterministic = 1};
        ok = ok && flashcl_ref_check_backward(&j->desc, &opts, j->q, j->k, j->v, j->dout, j->dq, j->dk, j->dv, 1,
                                              &grads);
        flashcl_spec_desc spec = {.batch = SPEC_BATCH, .num_draft = SPEC_K, .vocab = VOCAB, .seed = 42, .offset = 7};
        int acc[SPEC_BATCH], tok[SPEC_BATCH * (SPEC_K + 1)];
        flashcl_ref_spec_verify(&spec, j->draft, j->spec_q, j->spec_p, acc, tok);
        ok = ok && !memcmp(acc, j->accepted, sizeof acc) && !memcmp(tok, j->tokens, sizeof tok);
        if (ok && device) {
            int cu_q[2] = {0, PAGED_Q}, cu_k[2] = {0, j->paged_keys};
            flashcl_varlen_desc vd = {.dtype = FLASHCL_FLOAT32, .num_seqs = 1, .heads_q = HQ, .heads_k = HK,
                                      .head_dim = D, .cu_seqlens_q = cu_q, .cu_seqlens_k = cu_k, .causal = 1};
            ok = flashcl_ref_check_varlen(&vd, j->paged_q, j->paged_kv,
                                          j->paged_kv + (size_t)j->paged_keys * HK * D, j->paged_out, NULL, 1, &report);
        }
        char what[64];
        snprintf(what, sizeof what, "thread %d's calls alone match host_ref", t);
        expect(ok, what, &failures);
    }
    free(alone);

    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; ++t)
        if (pthread_create(&threads[t], NULL, worker, &jobs[t])) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    for (int t = 0; t < THREADS; ++t)
        pthread_join(threads[t], NULL);
    for (int t = 0; t < THREADS; ++t) {
        char what[96];
        snprintf(what, sizeof what, "thread %d: %d rounds on the shared context equal the calls alone", t, ROUNDS);
        expect(!jobs[t].failures, what, &failures);
        if (jobs[t].failures)
            fprintf(stderr, "  %d failures; first: %s\n", jobs[t].failures, jobs[t].first_failure);
        free(jobs[t].paged_kv);
    }
    if (device)
        expect(flashcl_kv_cache_free_pages(shared_cache) == PAGES, "every page back in the pool", &failures);

    flashcl_kv_cache_destroy(shared_cache);
    flashcl_context_destroy(adopted_ctx);
    flashcl_context_destroy(shared_ctx);
    printf("%d failures\n", failures);
    return failures != 0;
}
