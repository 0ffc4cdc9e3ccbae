/* scheduler.c: the continuous-batching (and static-batching) scheduler over the paged KV cache; KV truncation.
 *
 * A request moves WAITING -> RUNNING -> FINISHED, and RUNNING -> WAITING
 * (front of the queue) when preempted. Its state is three numbers: prompt P,
 * generated g, and computed c (tokens whose K/V are in its cache sequence).
 *   prefill:  from admission until c = P + g (g as it was at admission).
 *             After a preemption the cache sequence is gone (c = 0) and the
 *             prompt plus the tokens generated so far are recomputed; the
 *             chunk that completes them yields one token.
 *   decode:   c = P + g - 1 (the newest token has no K/V yet). A step
 *             appends it plus up to spec_tokens drafts (n tokens) and yields
 *             a in 1..n tokens; the K/V of the n - a rejected drafts are
 *             dropped, so c = P + g - 1 again.
 * Planning one step (continuous mode):
 *   1. decodes of running requests, oldest first; while their new pages
 *      exceed the free pages, preempt the youngest running request;
 *   2. prefill chunks of running requests, oldest first, within the token
 *      budget and the free pages;
 *   3. admissions from the front of the queue while a batch slot, budget, and
 *      pages for the request's whole prefill remain (none in a step that
 *      preempted: the pool is tight);
 *   4. when nothing at all could be scheduled but requests are running (every
 *      one a prefill short of pages), preempt the youngest and plan again.
 *      The oldest request alone always fits (flashcl_scheduler_add checks),
 *      so this ends.
 * Static mode admits only into an empty batch, reserves every request's
 * whole length up front (so it never preempts), and otherwise plans alike.
 */
#include <stdlib.h>
#include <string.h>

#include "serving.h"

enum { WAITING = 0, RUNNING = 1, FINISHED = 2 };

typedef struct request {
    int id, prompt, max_new;
    int generated, computed;
    int prefilling; /* 1 from admission until `target` tokens are computed */
    int target;     /* P + g at admission: the tokens its prefill computes */
    int seq;        /* cache sequence, -1 when none */
    long admitted;  /* admission counter value: larger is younger */
    int state;
} request;

struct flashcl_scheduler {
    flashcl_kv_cache *cache;
    flashcl_scheduler_desc desc;
    request *reqs;
    int num_reqs, cap_reqs;
    int *waiting; /* ring buffer of request indices, capacity cap_reqs */
    int wait_head, wait_count;
    int *running; /* request indices in admission order (oldest first) */
    int num_running;
    long admissions, preemptions, steps;
    int finished;
    int reserved; /* static mode: pages reserved by the running batch */
    /* the planned step */
    int pending;
    int n_sched;
    int *s_req, *s_seq, *s_rid, *s_tokens, *s_context, *s_prefill;
};

static int pages_for(long tokens, int page_size) {
    return (int)((tokens + page_size - 1) / page_size);
}

/* ---- KV truncation --------------------------------------------------------------------- */

flashcl_status flashcl_kv_cache_truncate(flashcl_kv_cache *c, int seq, int length) {
    FLASHCL_LOCKED(c ? c->ctx : NULL);
    if (!c)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(c->ctx);
    flashcl_kv_sequence *s = (flashcl_kv_sequence *)flashcl_kv_cache_sequence(c, seq);
    if (!s)
        return flashcl_fail(c->ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "no live sequence %d", seq);
    if (length < 0 || length > s->length)
        return flashcl_fail(c->ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "truncate sequence %d of %d tokens to %d",
                            seq, s->length, length);
    const int keep = pages_for(length, c->desc.page_size);
    for (int i = keep; i < s->count; ++i)
        if (--c->refcount[s->pages[i]] == 0)
            c->free_list[c->free_count++] = s->pages[i];
    s->count = keep;
    s->length = length;
    return FLASHCL_SUCCESS;
}

/* ---- lifetime ---------------------------------------------------------------------------- */

static flashcl_status fail(flashcl_scheduler *s, flashcl_status st, const char *msg) {
    return flashcl_fail(s->cache->ctx, st, "scheduler: %s", msg);
}

flashcl_status flashcl_scheduler_create(flashcl_kv_cache *cache, const flashcl_scheduler_desc *desc,
                                        flashcl_scheduler **out) {
    FLASHCL_LOCKED(cache ? cache->ctx : NULL);
    if (!cache || !out)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    *out = NULL;
    flashcl_context *ctx = cache->ctx;
    flashcl_clear_error(ctx);
    if (!desc)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "scheduler: desc is NULL");
    if ((desc->mode != FLASHCL_SCHEDULE_CONTINUOUS && desc->mode != FLASHCL_SCHEDULE_STATIC) ||
        desc->max_batch < 1 || desc->spec_tokens < 0 || desc->spec_tokens > FLASHCL_SPEC_MAX_DRAFT ||
        (long)desc->token_budget < (long)desc->max_batch * (1 + desc->spec_tokens))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "scheduler: mode %d, max_batch %d (>= 1), spec_tokens %d (0..%d), token_budget %d "
                            "(>= max_batch * (1 + spec_tokens))",
                            (int)desc->mode, desc->max_batch, desc->spec_tokens, FLASHCL_SPEC_MAX_DRAFT,
                            desc->token_budget);
    flashcl_scheduler *s = calloc(1, sizeof *s);
    const size_t mb = (size_t)desc->max_batch;
    if (s) {
        s->running = malloc(mb * sizeof(int));
        s->s_req = malloc(6 * mb * sizeof(int));
    }
    if (!s || !s->running || !s->s_req) {
        if (s)
            free(s->running);
        free(s);
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    s->s_seq = s->s_req + mb;
    s->s_rid = s->s_seq + mb;
    s->s_tokens = s->s_rid + mb;
    s->s_context = s->s_tokens + mb;
    s->s_prefill = s->s_context + mb;
    s->cache = cache;
    s->desc = *desc;
    *out = s;
    return FLASHCL_SUCCESS;
}

void flashcl_scheduler_destroy(flashcl_scheduler *s) {
    FLASHCL_LOCKED(s ? s->cache->ctx : NULL);
    if (!s)
        return;
    for (int i = 0; i < s->num_reqs; ++i)
        if (s->reqs[i].seq >= 0)
            flashcl_kv_cache_free_sequence(s->cache, s->reqs[i].seq);
    free(s->reqs);
    free(s->waiting);
    free(s->running);
    free(s->s_req);
    free(s);
}

void flashcl_scheduler_get_stats(const flashcl_scheduler *s, flashcl_scheduler_stats *st) {
    FLASHCL_LOCKED(s ? s->cache->ctx : NULL);
    if (!st)
        return;
    memset(st, 0, sizeof *st);
    if (!s)
        return;
    st->waiting = s->wait_count;
    st->running = s->num_running;
    st->finished = s->finished;
    st->preemptions = s->preemptions;
    st->steps = s->steps;
}

/* ---- queues ------------------------------------------------------------------------------ */

static void push_back(flashcl_scheduler *s, int r) {
    s->waiting[(s->wait_head + s->wait_count++) % s->cap_reqs] = r;
}

static void push_front(flashcl_scheduler *s, int r) {
    s->wait_head = (s->wait_head + s->cap_reqs - 1) % s->cap_reqs;
    s->waiting[s->wait_head] = r;
    s->wait_count++;
}

static int front(const flashcl_scheduler *s) {
    return s->waiting[s->wait_head];
}

static void pop_front(flashcl_scheduler *s) {
    s->wait_head = (s->wait_head + 1) % s->cap_reqs;
    s->wait_count--;
}

/* The request's whole length in the cache at most (static reservations). */
static int full_pages(const flashcl_scheduler *s, const request *r) {
    return pages_for((long)r->prompt + r->max_new + s->desc.spec_tokens, s->cache->desc.page_size);
}

flashcl_status flashcl_scheduler_add(flashcl_scheduler *s, int request_id, int prompt_len, int max_new) {
    FLASHCL_LOCKED(s ? s->cache->ctx : NULL);
    if (!s)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(s->cache->ctx);
    if (prompt_len < 1 || max_new < 1 || (long)prompt_len + max_new + s->desc.spec_tokens > 0x7fffffffL)
        return flashcl_fail(s->cache->ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "scheduler: request %d: prompt_len %d and max_new %d must be >= 1", request_id,
                            prompt_len, max_new);
    for (int i = 0; i < s->num_reqs; ++i)
        if (s->reqs[i].id == request_id && s->reqs[i].state != FINISHED)
            return flashcl_fail(s->cache->ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                                "scheduler: request id %d is already queued or running", request_id);
    request r = {request_id, prompt_len, max_new, 0, 0, 0, 0, -1, 0, WAITING};
    if (full_pages(s, &r) > s->cache->desc.num_pages)
        return flashcl_fail(s->cache->ctx, FLASHCL_ERROR_OUT_OF_PAGES,
                            "scheduler: request %d needs %d pages alone but the cache has %d", request_id,
                            full_pages(s, &r), s->cache->desc.num_pages);
    if (s->num_reqs == s->cap_reqs) {
        int cap = s->cap_reqs ? 2 * s->cap_reqs : 64;
        request *nr = realloc(s->reqs, (size_t)cap * sizeof *nr);
        if (nr)
            s->reqs = nr;
        int *nw = nr ? malloc((size_t)cap * sizeof(int)) : NULL;
        if (!nw)
            return fail(s, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
        for (int i = 0; i < s->wait_count; ++i) /* unroll the ring into the new buffer */
            nw[i] = s->waiting[(s->wait_head + i) % s->cap_reqs];
        free(s->waiting);
        s->waiting = nw;
        s->wait_head = 0;
        s->cap_reqs = cap;
    }
    s->reqs[s->num_reqs] = r;
    push_back(s, s->num_reqs++);
    return FLASHCL_SUCCESS;
}

/* ---- planning -------------------------------------------------------------------------------- */

static void preempt_youngest(flashcl_scheduler *s) {
    int at = 0;
    for (int i = 1; i < s->num_running; ++i)
        if (s->reqs[s->running[i]].admitted > s->reqs[s->running[at]].admitted)
            at = i;
    const int ri = s->running[at];
    request *r = &s->reqs[ri];
    flashcl_kv_cache_free_sequence(s->cache, r->seq);
    r->seq = -1;
    r->computed = 0;
    r->state = WAITING;
    memmove(s->running + at, s->running + at + 1, (size_t)(s->num_running - at - 1) * sizeof(int));
    s->num_running--;
    push_front(s, ri);
    s->preemptions++;
}

static void schedule(flashcl_scheduler *s, int ri, int tokens, int prefill) {
    request *r = &s->reqs[ri];
    const int n = s->n_sched++;
    s->s_req[n] = ri;
    s->s_seq[n] = r->seq;
    s->s_rid[n] = r->id;
    s->s_tokens[n] = tokens;
    s->s_context[n] = r->computed;
    s->s_prefill[n] = prefill;
}

/* Tokens of a decode step for r: the newest token plus the drafts worth
 * verifying (no more than the request still wants). */
static int decode_tokens(const flashcl_scheduler *s, const request *r) {
    int want = r->max_new - r->generated;
    return want < 1 + s->desc.spec_tokens ? want : 1 + s->desc.spec_tokens;
}

static int new_pages(const flashcl_scheduler *s, const request *r, int tokens) {
    const int ps = s->cache->desc.page_size;
    return pages_for((long)r->computed + tokens, ps) - pages_for(r->computed, ps);
}

/* One planning attempt; returns the pages it would take, or -1 when the
 * decodes alone do not fit (after which the caller preempts). */
static int plan_once(flashcl_scheduler *s, int *budget_left) {
    const int ps = s->cache->desc.page_size;
    int free_pages = flashcl_kv_cache_free_pages(s->cache) - s->reserved;
    /* In static mode the batch's pages were reserved on admission: spend them. */
    if (s->desc.mode == FLASHCL_SCHEDULE_STATIC)
        free_pages = flashcl_kv_cache_free_pages(s->cache);
    int budget = s->desc.token_budget;
    s->n_sched = 0;
    /* 1. decodes */
    int need = 0;
    for (int i = 0; i < s->num_running; ++i) {
        const request *r = &s->reqs[s->running[i]];
        if (r->prefilling)
            continue;
        need += new_pages(s, r, decode_tokens(s, r));
    }
    if (need > free_pages)
        return -1;
    for (int i = 0; i < s->num_running; ++i) {
        const request *r = &s->reqs[s->running[i]];
        if (r->prefilling)
            continue;
        int n = decode_tokens(s, r);
        schedule(s, s->running[i], n, 0);
        budget -= n;
    }
    free_pages -= need;
    /* 2. prefill chunks of running requests, oldest first */
    for (int i = 0; i < s->num_running && budget > 0; ++i) {
        const request *r = &s->reqs[s->running[i]];
        const int left = r->target - r->computed;
        if (!r->prefilling || left <= 0)
            continue;
        int n = left < budget ? left : budget;
        /* as many tokens as the free pages hold (the partly filled last page first) */
        const long room = (long)(pages_for(r->computed, ps) + free_pages) * ps - r->computed;
        if (n > room)
            n = (int)room;
        if (n <= 0)
            continue;
        free_pages -= new_pages(s, r, n);
        schedule(s, s->running[i], n, 1);
        budget -= n;
    }
    *budget_left = budget;
    return 0;
}

/* Admits the front of the queue into a new cache sequence. */
static flashcl_status admit_front(flashcl_scheduler *s) {
    const int ri = front(s);
    request *r = &s->reqs[ri];
    flashcl_status st = flashcl_kv_cache_add_sequence(s->cache, &r->seq);
    if (st)
        return st;
    pop_front(s);
    r->state = RUNNING;
    r->computed = 0;
    r->prefilling = 1;
    r->target = r->prompt + r->generated;
    r->admitted = ++s->admissions;
    s->running[s->num_running++] = ri;
    if (s->desc.mode == FLASHCL_SCHEDULE_STATIC)
        s->reserved += full_pages(s, r);
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_scheduler_step(flashcl_scheduler *s, flashcl_schedule *out) {
    FLASHCL_LOCKED(s ? s->cache->ctx : NULL);
    if (!s)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(s->cache->ctx);
    if (!out)
        return fail(s, FLASHCL_ERROR_INVALID_ARGUMENT, "out is NULL");
    if (s->pending)
        return fail(s, FLASHCL_ERROR_INVALID_ARGUMENT, "the previous step was not completed");
    const int ps = s->cache->desc.page_size;
    const long preempted_before = s->preemptions;
    flashcl_status st;
    int budget = 0;
    if (s->desc.mode == FLASHCL_SCHEDULE_STATIC) {
        /* A new batch only when the previous one is gone: FCFS while the
         * whole length of each request fits the free pages. */
        if (s->num_running == 0) {
            s->reserved = 0;
            while (s->wait_count > 0 && s->num_running < s->desc.max_batch &&
                   s->reserved + full_pages(s, &s->reqs[front(s)]) <= flashcl_kv_cache_free_pages(s->cache))
                if ((st = admit_front(s)))
                    return st;
        }
        plan_once(s, &budget); /* reserved pages: decodes always fit */
    } else {
        for (;;) {
            if (plan_once(s, &budget) < 0) {
                preempt_youngest(s);
                continue;
            }
            /* admissions: a slot, budget, and pages for the whole prefill */
            int free_pages = flashcl_kv_cache_free_pages(s->cache);
            for (int i = 0; i < s->n_sched; ++i)
                free_pages -= new_pages(s, &s->reqs[s->s_req[i]], s->s_tokens[i]);
            /* pages still owed to running prefills (their remaining prompt) */
            for (int i = 0; i < s->num_running; ++i) {
                const request *r = &s->reqs[s->running[i]];
                int planned = 0;
                for (int j = 0; j < s->n_sched; ++j)
                    if (s->s_req[j] == s->running[i])
                        planned = s->s_tokens[j];
                if (r->prefilling && r->computed + planned < r->target)
                    free_pages -= pages_for(r->target, ps) - pages_for((long)r->computed + planned, ps);
            }
            /* no admissions in a step that had to preempt, unless that emptied the batch */
            while ((s->preemptions == preempted_before || s->num_running == 0) && s->wait_count > 0 &&
                   s->num_running < s->desc.max_batch && budget > 0) {
                const request *r = &s->reqs[front(s)];
                const int target = r->prompt + r->generated;
                if (pages_for(target, ps) > free_pages)
                    break;
                if ((st = admit_front(s)))
                    return st;
                const int ri = s->running[s->num_running - 1];
                const int n = target < budget ? target : budget;
                free_pages -= pages_for(target, ps);
                schedule(s, ri, n, 1);
                budget -= n;
            }
            if (s->n_sched == 0 && s->num_running > 0) {
                preempt_youngest(s); /* every running prefill is short of pages */
                continue;
            }
            break;
        }
    }
    s->steps++;
    s->pending = s->n_sched > 0;
    memset(out, 0, sizeof *out);
    out->num_seqs = s->n_sched;
    out->seq_ids = s->s_seq;
    out->request_ids = s->s_rid;
    out->num_tokens = s->s_tokens;
    out->context = s->s_context;
    out->is_prefill = s->s_prefill;
    for (int i = 0; i < s->n_sched; ++i)
        out->total_tokens += s->s_tokens[i];
    out->num_preempted = (int)(s->preemptions - preempted_before);
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_scheduler_complete(flashcl_scheduler *s, const int *produced, int *finished_ids,
                                          int *num_finished) {
    FLASHCL_LOCKED(s ? s->cache->ctx : NULL);
    if (!s)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(s->cache->ctx);
    if (num_finished)
        *num_finished = 0;
    if (!s->pending)
        return fail(s, FLASHCL_ERROR_INVALID_ARGUMENT, "no step is pending");
    if (!produced)
        return fail(s, FLASHCL_ERROR_INVALID_ARGUMENT, "produced is NULL");
    /* Check everything before changing anything. */
    for (int i = 0; i < s->n_sched; ++i) {
        const int len = flashcl_kv_cache_length(s->cache, s->s_seq[i]);
        if (len != s->s_context[i] + s->s_tokens[i])
            return flashcl_fail(s->cache->ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                                "scheduler: sequence %d holds %d tokens, the step planned %d + %d (append them "
                                "before completing)",
                                s->s_seq[i], len, s->s_context[i], s->s_tokens[i]);
        if (produced[i] < 0 || (!s->s_prefill[i] && (produced[i] < 1 || produced[i] > s->s_tokens[i])))
            return flashcl_fail(s->cache->ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                                "scheduler: produced[%d] = %d (a decode of %d tokens yields 1..%d)", i, produced[i],
                                s->s_tokens[i], s->s_tokens[i]);
    }
    int nf = 0;
    for (int i = 0; i < s->n_sched; ++i) {
        request *r = &s->reqs[s->s_req[i]];
        if (s->s_prefill[i]) {
            r->computed += s->s_tokens[i];
            if (r->computed == r->target) { /* the chunk that ends the prefill yields a token */
                r->generated += 1;
                r->prefilling = 0;
            }
        } else {
            int a = produced[i];
            if (a > r->max_new - r->generated)
                a = r->max_new - r->generated;
            if (a < s->s_tokens[i])
                flashcl_kv_cache_truncate(s->cache, r->seq, r->computed + a);
            r->computed += a;
            r->generated += a;
        }
        if (r->generated >= r->max_new) {
            flashcl_kv_cache_free_sequence(s->cache, r->seq);
            r->seq = -1;
            r->state = FINISHED;
            s->finished++;
            for (int j = 0; j < s->num_running; ++j)
                if (s->running[j] == s->s_req[i]) {
                    memmove(s->running + j, s->running + j + 1, (size_t)(s->num_running - j - 1) * sizeof(int));
                    s->num_running--;
                    break;
                }
            if (s->desc.mode == FLASHCL_SCHEDULE_STATIC)
                s->reserved -= full_pages(s, r);
            if (finished_ids)
                finished_ids[nf] = r->id;
            nf++;
        }
    }
    if (num_finished)
        *num_finished = nf;
    s->pending = 0;
    return FLASHCL_SUCCESS;
}
