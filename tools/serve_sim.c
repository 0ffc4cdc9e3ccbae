/* serve_sim.c: `flashcl serve-sim` (a request trace through the scheduler, static vs continuous, real kernels).
 *
 * serve-sim replays one trace twice, once per scheduling mode. Each step is
 * what a serving engine would launch for one model layer, minus the model:
 * the scheduler plans the step, the new tokens' K/V (random values, uploaded
 * once) are appended to the paged KV cache with flashcl_kv_cache_append,
 * their queries attend through flashcl_paged_attention (causal), and with
 * --spec-k the decodes' drafts are verified by flashcl_spec_verify against
 * synthetic rows whose acceptance rate is --accept. The clock is the
 * measured wall time of the steps (queue finished each step), plus jumps
 * over idle gaps until the next arrival; latencies are finish - arrival on
 * that clock. Utilisation is the step-time-weighted fraction of the batch
 * slots that held a scheduled sequence. KV memory is pages in use times
 * the page's bytes (K and V), against max_batch contiguous buffers of the
 * trace's longest request. --kv-dtype picks the pages' type (float32 as
 * before, 16-bit, or FP8 with f16 queries); FP8 pages get the byte budget of
 * the 16-bit pool, so twice its pages and tokens.
 */
#define _POSIX_C_SOURCE 200809L
#include "serve_sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "flashcl.h"
#include "flashcl_ref.h"
#include "svg_plot.h"

const char usage_serve_sim[] =
    "usage: flashcl serve-sim [options]\n"
    "\n"
    "Replays a request trace through flashcl's scheduler in static and continuous\n"
    "batching, running the real KV-cache append and paged-attention kernels each\n"
    "step (random Q/K/V in place of a model), and compares tokens/s, latency,\n"
    "slot utilisation and KV memory.\n"
    "\n"
    "trace:\n"
    "  --requests N        synthetic requests (default 48)\n"
    "  --rate R            Poisson arrivals per second; 0: all at t=0 (default 0)\n"
    "  --prompt MIN,MAX    prompt lengths, uniform (default 16,128)\n"
    "  --output MIN,MAX    output lengths, log-uniform (default 10,2000)\n"
    "  --trace FILE        CSV rows arrival_seconds,prompt,output (replaces the above)\n"
    "  --seed N            trace and data seed (default 1)\n"
    "engine:\n"
    "  --device SPEC       OpenCL device (see 'flashcl help')\n"
    "  --mode M            both, static or continuous (default both)\n"
    "  --max-batch B       batch slots (default 16)\n"
    "  --token-budget T    tokens per step (default 256)\n"
    "  --page-size P       tokens per KV page (default 16)\n"
    "  --pages N           KV pages (default: half of max-batch contiguous buffers)\n"
    "  --kv-dtype T        the pages' type: f32 (default), f16, bf16, or e4m3/e5m2: FP8 pages\n"
    "                      (queries f16) in the bytes of --pages f16 pages, so twice the pages\n"
    "                      and tokens\n"
    "  --heads H           query heads (default 2); --kv-heads (default 1); --head-dim D (default 16)\n"
    "  --spec-k K          speculative decoding: K drafts per decode step (default 0)\n"
    "  --accept A          draft acceptance rate with --spec-k (default 0.8)\n"
    "  --model-ms T        charge each step T ms more for the model's other layers, which\n"
    "                      on a GPU cost about the same for 1 or 16 sequences (default 0:\n"
    "                      the clock is the measured kernels alone)\n"
    "output:\n"
    "  --json              JSON instead of the table\n"
    "  --plot FILE.svg     busy slots over time, both modes\n";

/* ---- small helpers ------------------------------------------------------------------------- */

static int usage_fail(const char *usage, const char *msg, const char *arg) {
    return cli_usage_error(usage, "%s%s%s", msg, arg ? " " : "", arg ? arg : "");
}

/* cli_take_value, then a whole number in [min, max]: 1 when taken, 0 for another option, -1
 * after the usage error "<wants> <value>" (wants: "--seed wants an integer >= 0, not"). */
static int take_long(const char *usage, int argc, char **argv, int *i, const char *name, long min,
                     long max, const char *wants, long *out) {
    const char *v = NULL;
    int t = cli_take_value(argc, argv, i, name, &v);
    if (t < 0 || (t > 0 && cli_parse_long(v, min, max, out) != 0)) {
        usage_fail(usage, wants, v);
        return -1;
    }
    return t;
}

static int parse_pair(const char *text, long min, long max, long out[2]) {
    int n = 0;
    if (cli_parse_long_list(text, min, max, out, 2, &n) != 0 || n != 2 || out[0] > out[1])
        return -1;
    return 0;
}

/* ---- the trace ------------------------------------------------------------------------------ */

typedef struct sim_req {
    double arrival;
    int prompt, output;
} sim_req;

static int load_trace(const char *path, sim_req **out, int *count) {
    FILE *f = fopen(path, "r");
    if (!f) {
        cli_errorf("--trace %s: cannot open", path);
        return -1;
    }
    char line[512];
    int n = 0, cap = 0, lineno = 0;
    sim_req *r = NULL;
    while (fgets(line, sizeof line, f)) {
        ++lineno;
        double a;
        long p, o;
        char extra;
        if (line[0] == '#' || line[0] == '\n' || line[0] == '\r')
            continue;
        if (sscanf(line, "%lf,%ld,%ld %c", &a, &p, &o, &extra) != 3 || !isfinite(a) || a < 0 || p < 1 ||
            o < 1 || p > 1000000 || o > 1000000) {
            if (lineno == 1 && n == 0) /* a header line */
                continue;
            cli_errorf("--trace %s:%d: want 'arrival_seconds,prompt,output' (>= 0, >= 1, >= 1)", path, lineno);
            free(r);
            fclose(f);
            return -1;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            sim_req *nr = realloc(r, (size_t)cap * sizeof *nr);
            if (!nr) {
                free(r);
                fclose(f);
                cli_errorf("out of memory");
                return -1;
            }
            r = nr;
        }
        r[n].arrival = a;
        r[n].prompt = (int)p;
        r[n].output = (int)o;
        ++n;
    }
    fclose(f);
    if (n == 0) {
        cli_errorf("--trace %s: no requests", path);
        return -1;
    }
    for (int i = 1; i < n; ++i)
        if (r[i].arrival < r[i - 1].arrival) {
            cli_errorf("--trace %s: arrival times must not decrease (row %d)", path, i + 1);
            free(r);
            return -1;
        }
    *out = r;
    *count = n;
    return 0;
}

/* ---- one run --------------------------------------------------------------------------------- */

typedef struct sim_opts {
    int max_batch, token_budget, page_size, pages, heads_q, heads_k, head_dim, spec_k;
    double accept;
    uint64_t seed;
    double model_ms; /* modelled cost of the model's other layers per step */
    flashcl_dtype dtype;    /* queries, outputs, appended K/V                      */
    flashcl_dtype kv_dtype; /* the pool's pages: dtype, or FP8                     */
} sim_opts;

typedef struct sim_result {
    const char *mode;
    double makespan, busy_time, tokens_per_s, mean_latency, p99_latency, utilisation;
    double mean_kv_bytes, peak_kv_bytes, contiguous_bytes;
    long steps, preemptions, output_tokens, computed_tokens, verify_calls, accepted_drafts;
    double step_utilisation; /* mean over steps of busy slots / max_batch */
    double *tx, *ty;         /* busy slots over time, for the plot */
    int points;
} sim_result;

typedef struct device_bufs {
    cl_mem q, kv, out, scratch, draft, sq, sp, acc, tok;
    size_t scratch_bytes;
} device_bufs;

static void release_bufs(device_bufs *b) {
    cl_mem *all[] = {&b->q, &b->kv, &b->out, &b->scratch, &b->draft, &b->sq, &b->sp, &b->acc, &b->tok};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        if (*all[i]) {
            clReleaseMemObject(*all[i]);
            *all[i] = NULL;
        }
}

static cl_mem make_buf(flashcl_context *ctx, size_t bytes, const void *host) {
    cl_int err;
    return clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0),
                          bytes ? bytes : 4, (void *)host, &err);
}

static void progress(int tty, const char *mode, int done, int total, double t) {
    if (!tty)
        return;
    const int width = 30, fill = total ? done * width / total : width;
    fprintf(stderr, "\r\033[K%-10s [", mode);
    for (int i = 0; i < width; ++i)
        fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %d/%d requests, %.1f s", done, total, t);
    if (done == total)
        fputc('\n', stderr);
    fflush(stderr);
}

/* The KV cache of a run's heads and pages, num_pages of them (FP8 pages:
 * scales 1, random N(0, 1) K/V being well inside e4m3's and e5m2's range). */
static flashcl_kv_cache_desc cache_desc(const sim_opts *o, int num_pages) {
    flashcl_kv_cache_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.dtype = o->dtype;
    cd.page_dtype = o->kv_dtype;
    cd.heads_k = o->heads_k;
    cd.head_dim = o->head_dim;
    cd.page_size = o->page_size;
    cd.num_pages = num_pages;
    return cd;
}

static int run_mode(flashcl_context *ctx, flashcl_schedule_mode mode, const sim_opts *o,
                    const sim_req *reqs, int n, device_bufs *bufs, sim_result *res) {
    memset(res, 0, sizeof *res);
    res->mode = mode == FLASHCL_SCHEDULE_STATIC ? "static" : "continuous";
    const int tty = isatty(STDERR_FILENO);
    const size_t tok_bytes = (size_t)o->heads_k * o->head_dim * flashcl_dtype_size(o->kv_dtype);
    const flashcl_kv_cache_desc cd = cache_desc(o, o->pages);
    flashcl_kv_cache *cache = NULL;
    flashcl_scheduler *sched = NULL;
    const int spec = o->spec_k;
    flashcl_scheduler_desc sd = {mode, o->max_batch, o->token_budget, spec};
    flashcl_status st;
    if ((st = flashcl_kv_cache_create(ctx, &cd, &cache)) || (st = flashcl_scheduler_create(cache, &sd, &sched))) {
        cli_errorf("%s: %s", res->mode, flashcl_last_error(ctx));
        flashcl_kv_cache_destroy(cache);
        return -1;
    }
    double *finish = malloc((size_t)n * sizeof(double));
    int *cu = malloc(((size_t)o->max_batch + 1) * sizeof(int)), *dec = malloc((size_t)o->max_batch * sizeof(int));
    int *produced = malloc((size_t)o->max_batch * sizeof(int)), *fin = malloc((size_t)o->max_batch * sizeof(int));
    int *acc = malloc((size_t)o->max_batch * sizeof(int)), *ids = malloc((size_t)o->max_batch * sizeof(int));
    int cap_points = 1024;
    res->tx = malloc((size_t)cap_points * sizeof(double));
    res->ty = malloc((size_t)cap_points * sizeof(double));
    int rc = 0;
    if (!finish || !cu || !dec || !produced || !fin || !acc || !ids || !res->tx || !res->ty) {
        cli_errorf("out of memory");
        rc = -1;
    }
    double clock = 0.0, kv_time_bytes = 0.0;
    int added = 0, done = 0;
    long max_len = 0;
    for (int i = 0; i < n; ++i)
        if (reqs[i].prompt + reqs[i].output > max_len)
            max_len = reqs[i].prompt + reqs[i].output;
    res->contiguous_bytes = (double)o->max_batch * (double)max_len * 2.0 * (double)tok_bytes;
    double last_progress = -1.0, wall0 = cli_now();
    cl_command_queue queue = flashcl_context_cl_queue(ctx);
    while (rc == 0 && done < n) {
        flashcl_scheduler_stats ss;
        flashcl_scheduler_get_stats(sched, &ss);
        if (ss.waiting == 0 && ss.running == 0 && added < n && reqs[added].arrival > clock)
            clock = reqs[added].arrival; /* idle until the next arrival */
        while (added < n && reqs[added].arrival <= clock) {
            if ((st = flashcl_scheduler_add(sched, added, reqs[added].prompt, reqs[added].output))) {
                cli_errorf("request %d: %s", added, flashcl_last_error(ctx));
                rc = -1;
                break;
            }
            ++added;
        }
        if (rc)
            break;
        const double t0 = cli_now();
        flashcl_schedule s;
        if ((st = flashcl_scheduler_step(sched, &s))) {
            cli_errorf("%s step: %s", res->mode, flashcl_last_error(ctx));
            rc = -1;
            break;
        }
        if (s.num_seqs == 0) {
            if (added < n) { /* everything queued has finished: wait for the next arrival */
                clock = reqs[added].arrival > clock ? reqs[added].arrival : clock;
                continue;
            }
            cli_errorf("%s: the scheduler stalled with %d requests unfinished", res->mode, n - done);
            rc = -1;
            break;
        }
        res->preemptions += s.num_preempted;
        /* 1. append the new tokens' K/V; 2. attend */
        st = flashcl_kv_cache_append(cache, s.num_seqs, s.seq_ids, s.num_tokens, bufs->kv, NULL, bufs->kv, NULL, NULL);
        /* Prefill chunks and decodes attend in separate launches, as engines
         * do: the kernel's row tile follows the tallest sequence, so one mixed
         * launch would give every one-token decode a prefill-sized tile. */
        for (int phase = 1; phase >= 0 && !st; --phase) {
            int m = 0;
            cu[0] = 0;
            for (int i = 0; i < s.num_seqs; ++i)
                if (s.is_prefill[i] == phase) {
                    ids[m] = s.seq_ids[i];
                    cu[m + 1] = cu[m] + s.num_tokens[i];
                    ++m;
                }
            if (m == 0)
                continue;
            flashcl_varlen_desc vd;
            memset(&vd, 0, sizeof vd);
            vd.dtype = o->dtype;
            vd.num_seqs = m;
            vd.heads_q = o->heads_q;
            vd.heads_k = o->heads_k;
            vd.head_dim = o->head_dim;
            vd.cu_seqlens_q = cu;
            vd.causal = 1;
            size_t need = 0;
            st = flashcl_paged_scratch_size(ctx, &vd, cache, ids, &need);
            if (!st && need > bufs->scratch_bytes) {
                if (bufs->scratch)
                    clReleaseMemObject(bufs->scratch);
                bufs->scratch_bytes = need * 2;
                bufs->scratch = make_buf(ctx, bufs->scratch_bytes, NULL);
                if (!bufs->scratch)
                    st = FLASHCL_ERROR_OUT_OF_HOST_MEMORY;
            }
            if (!st) /* both launches read Q from the same random rows: no model, no meaning */
                st = flashcl_paged_attention(ctx, &vd, cache, ids, bufs->q, bufs->out, NULL, 0, bufs->scratch, NULL);
        }
        /* 3. speculative decoding: verify the decodes' drafts */
        int ndec = 0;
        for (int i = 0; i < s.num_seqs; ++i) {
            produced[i] = 1;
            if (!s.is_prefill[i])
                dec[ndec++] = i;
        }
        if (!st && spec > 0 && ndec > 0) {
            flashcl_spec_desc sp;
            memset(&sp, 0, sizeof sp);
            sp.batch = ndec;
            sp.num_draft = spec;
            sp.vocab = 2;
            sp.seed = o->seed;
            sp.offset = (unsigned long long)res->steps;
            st = flashcl_spec_verify(ctx, &sp, bufs->draft, bufs->sq, bufs->sp, bufs->acc, bufs->tok, NULL);
            if (!st && clEnqueueReadBuffer(queue, bufs->acc, CL_TRUE, 0, (size_t)ndec * sizeof(int), acc, 0, NULL,
                                           NULL) != CL_SUCCESS)
                st = FLASHCL_ERROR_INVALID_ARGUMENT;
            for (int j = 0; !st && j < ndec; ++j) {
                const int i = dec[j], usable = s.num_tokens[i] - 1; /* drafts this sequence had room for */
                produced[i] = 1 + (acc[j] < usable ? acc[j] : usable);
                res->verify_calls++;
                res->accepted_drafts += acc[j] < usable ? acc[j] : usable;
            }
        }
        if (!st && clFinish(queue) != CL_SUCCESS)
            st = FLASHCL_ERROR_INVALID_ARGUMENT;
        if (st) {
            cli_errorf("%s step %ld: %s", res->mode, res->steps, flashcl_last_error(ctx));
            rc = -1;
            break;
        }
        const int used_pages = o->pages - flashcl_kv_cache_free_pages(cache);
        int nf = 0;
        if ((st = flashcl_scheduler_complete(sched, produced, fin, &nf))) {
            cli_errorf("%s: %s", res->mode, flashcl_last_error(ctx));
            rc = -1;
            break;
        }
        const double dt = cli_now() - t0 + o->model_ms * 1e-3;
        clock += dt;
        res->busy_time += dt;
        res->utilisation += dt * (double)s.num_seqs / (double)o->max_batch;
        res->step_utilisation += (double)s.num_seqs / (double)o->max_batch;
        const double kv_bytes = (double)used_pages * o->page_size * 2.0 * (double)tok_bytes;
        kv_time_bytes += dt * kv_bytes;
        if (kv_bytes > res->peak_kv_bytes)
            res->peak_kv_bytes = kv_bytes;
        res->computed_tokens += s.total_tokens;
        for (int i = 0; i < nf; ++i) {
            finish[fin[i]] = clock;
            res->output_tokens += reqs[fin[i]].output;
        }
        done += nf;
        if (res->points == cap_points) {
            cap_points *= 2;
            double *nx = realloc(res->tx, (size_t)cap_points * sizeof(double));
            double *ny = nx ? realloc(res->ty, (size_t)cap_points * sizeof(double)) : NULL;
            if (nx)
                res->tx = nx;
            if (ny)
                res->ty = ny;
            if (!nx || !ny) {
                cli_errorf("out of memory");
                rc = -1;
                break;
            }
        }
        res->tx[res->points] = clock;
        res->ty[res->points++] = s.num_seqs;
        res->steps++;
        const double now = cli_now();
        if (now - last_progress > 0.1 || done == n) {
            progress(tty, res->mode, done, n, now - wall0);
            last_progress = now;
        }
    }
    if (rc == 0) {
        double *lat = malloc((size_t)n * sizeof(double)), sum = 0.0;
        for (int i = 0; lat && i < n; ++i) {
            lat[i] = finish[i] - reqs[i].arrival;
            sum += lat[i];
        }
        if (lat) {
            qsort(lat, (size_t)n, sizeof(double), cli_compare_doubles);
            res->mean_latency = sum / n;
            res->p99_latency = lat[(size_t)ceil(0.99 * n) - 1];
        }
        free(lat);
        res->makespan = clock - reqs[0].arrival;
        res->tokens_per_s = res->makespan > 0 ? (double)res->output_tokens / res->makespan : 0.0;
        res->utilisation = res->busy_time > 0 ? res->utilisation / res->busy_time : 0.0;
        res->step_utilisation = res->steps ? res->step_utilisation / (double)res->steps : 0.0;
        res->mean_kv_bytes = res->busy_time > 0 ? kv_time_bytes / res->busy_time : 0.0;
        if (flashcl_kv_cache_free_pages(cache) != o->pages) {
            cli_errorf("%s: %d pages still in use at the end", res->mode, o->pages - flashcl_kv_cache_free_pages(cache));
            rc = -1;
        }
    }
    free(finish);
    free(cu);
    free(dec);
    free(produced);
    free(fin);
    free(acc);
    free(ids);
    flashcl_scheduler_destroy(sched);
    flashcl_kv_cache_destroy(cache);
    return rc;
}

/* Builds every kernel variant a run can meet before anything is timed: the
 * paged-attention tile (block_m follows the rows of the tallest sequence:
 * 1..16), its split-KV combine, the append and the verification. Returns 0
 * or -1 with a message. */
static int warm_kernels(flashcl_context *ctx, const sim_opts *o, device_bufs *bufs) {
    const flashcl_kv_cache_desc cd = cache_desc(o, (512 + o->page_size - 1) / o->page_size);
    flashcl_kv_cache *cache = NULL;
    int seq, rc = 0;
    flashcl_status st = flashcl_kv_cache_create(ctx, &cd, &cache);
    if (!st)
        st = flashcl_kv_cache_add_sequence(cache, &seq);
    for (int nq = 1; !st && nq <= 16 && nq <= o->token_budget; ++nq) {
        for (int splits = 1; !st && splits <= 2; ++splits) {
            int cu[2] = {0, nq};
            if (flashcl_kv_cache_length(cache, seq) + nq > 512)
                break;
            st = flashcl_kv_cache_append(cache, 1, &seq, &nq, bufs->kv, NULL, bufs->kv, NULL, NULL);
            flashcl_varlen_desc vd;
            memset(&vd, 0, sizeof vd);
            vd.dtype = o->dtype;
            vd.num_seqs = 1;
            vd.heads_q = o->heads_q;
            vd.heads_k = o->heads_k;
            vd.head_dim = o->head_dim;
            vd.cu_seqlens_q = cu;
            vd.causal = 1;
            vd.num_splits = splits;
            size_t need = 0;
            if (!st)
                st = flashcl_paged_scratch_size(ctx, &vd, cache, &seq, &need);
            if (!st && need > bufs->scratch_bytes) {
                if (bufs->scratch)
                    clReleaseMemObject(bufs->scratch);
                bufs->scratch_bytes = need;
                bufs->scratch = make_buf(ctx, need, NULL);
            }
            if (!st)
                st = flashcl_paged_attention(ctx, &vd, cache, &seq, bufs->q, bufs->out, NULL, 0, bufs->scratch, NULL);
        }
    }
    if (!st && o->spec_k) {
        flashcl_spec_desc sp;
        memset(&sp, 0, sizeof sp);
        sp.batch = 1;
        sp.num_draft = o->spec_k;
        sp.vocab = 2;
        st = flashcl_spec_verify(ctx, &sp, bufs->draft, bufs->sq, bufs->sp, bufs->acc, bufs->tok, NULL);
    }
    if (!st && clFinish(flashcl_context_cl_queue(ctx)) != CL_SUCCESS)
        st = FLASHCL_ERROR_INVALID_ARGUMENT;
    if (st) {
        cli_errorf("warming the kernels: %s", flashcl_last_error(ctx));
        rc = -1;
    }
    flashcl_kv_cache_destroy(cache);
    return rc;
}

/* ---- output ------------------------------------------------------------------------------------ */

static void print_table(const sim_opts *o, int n, long total_out, const sim_result *r, int count) {
    printf("%d requests, %ld output tokens; batch %d, token budget %d, %d pages of %d tokens, heads %d/%d, "
           "head_dim %d%s\n",
           n, total_out, o->max_batch, o->token_budget, o->pages, o->page_size, o->heads_q, o->heads_k, o->head_dim,
           o->spec_k ? "" : "");
    if (o->spec_k)
        printf("speculative decoding: k=%d, acceptance %.2f (expected %.3f tokens per verification)\n", o->spec_k,
               o->accept, flashcl_spec_expected_tokens(o->accept, o->spec_k));
    if (o->model_ms > 0)
        printf("each step is charged %.3f ms of modelled model layers on top of its measured kernels\n", o->model_ms);
    const double page_mib = (double)o->page_size * o->heads_k * o->head_dim * 2.0 / 1048576.0;
    if (o->kv_dtype != o->dtype)
        printf("KV pages %s (1 byte an element, queries %s): %d pages of %d tokens in %.3f MiB, the bytes of %d f16 "
               "pages: the same pool holds twice the tokens (%ld instead of %ld)\n",
               cli_dtype_name(o->kv_dtype), cli_dtype_name(o->dtype), o->pages, o->page_size,
               page_mib * (double)o->pages, o->pages / 2, (long)o->pages * o->page_size,
               (long)o->pages / 2 * o->page_size);
    else
        printf("KV pages %s: %d pages of %d tokens in %.3f MiB\n", cli_dtype_name(o->kv_dtype), o->pages, o->page_size,
               page_mib * (double)flashcl_dtype_size(o->kv_dtype) * (double)o->pages);
    printf("%-11s %7s %9s %9s %9s %8s %8s %8s %10s %10s %10s\n", "mode", "steps", "tokens/s", "mean lat", "p99 lat",
           "slots %", "(time)", "preempt", "KV mean", "KV peak", "contig");
    printf("%-11s %7s %9s %9s %9s %8s %8s %8s %10s %10s %10s\n", "", "", "", "s", "s", "by step", "weighted", "", "MiB",
           "MiB", "MiB");
    for (int i = 0; i < count; ++i)
        printf("%-11s %7ld %9.1f %9.3f %9.3f %8.1f %8.1f %8ld %10.3f %10.3f %10.3f\n", r[i].mode, r[i].steps,
               r[i].tokens_per_s, r[i].mean_latency, r[i].p99_latency, 100.0 * r[i].step_utilisation,
               100.0 * r[i].utilisation, r[i].preemptions, r[i].mean_kv_bytes / 1048576.0,
               r[i].peak_kv_bytes / 1048576.0, r[i].contiguous_bytes / 1048576.0);
    if (o->spec_k)
        for (int i = 0; i < count; ++i)
            printf("%s: %.3f tokens per verification measured\n", r[i].mode,
                   r[i].verify_calls ? 1.0 + (double)r[i].accepted_drafts / (double)r[i].verify_calls : 0.0);
    if (count == 2 && r[0].tokens_per_s > 0)
        printf("continuous / static: %.2fx tokens/s, %.2fx slot utilisation, %.2fx mean latency; continuous KV "
               "peak %.1f%% of contiguous preallocation\n",
               r[1].tokens_per_s / r[0].tokens_per_s,
               r[1].step_utilisation / (r[0].step_utilisation > 0 ? r[0].step_utilisation : 1),
               r[1].mean_latency / (r[0].mean_latency > 0 ? r[0].mean_latency : 1),
               100.0 * r[1].peak_kv_bytes / r[1].contiguous_bytes);
}

static void print_json(flashcl_context *ctx, const sim_opts *o, int n, long total_out, const sim_result *r,
                       int count) {
    printf("{\"device\": ");
    cli_json_string(stdout, flashcl_context_device_name(ctx));
    printf(", \"kv_dtype\": \"%s\", \"dtype\": \"%s\"", cli_dtype_name(o->kv_dtype), cli_dtype_name(o->dtype));
    printf(", \"requests\": %d, \"output_tokens\": %ld, \"max_batch\": %d, \"token_budget\": %d, \"pages\": %d, "
           "\"page_size\": %d, \"heads_q\": %d, \"heads_k\": %d, \"head_dim\": %d, \"spec_k\": %d, \"accept\": %g, \"model_ms\": %g,\n"
           " \"modes\": [",
           n, total_out, o->max_batch, o->token_budget, o->pages, o->page_size, o->heads_q, o->heads_k, o->head_dim,
           o->spec_k, o->accept, o->model_ms);
    for (int i = 0; i < count; ++i)
        printf("%s\n  {\"mode\": \"%s\", \"steps\": %ld, \"makespan_s\": %.6f, \"tokens_per_s\": %.3f, "
               "\"mean_latency_s\": %.6f, \"p99_latency_s\": %.6f, \"utilisation\": %.5f, \"utilisation_time\": %.5f, "
               "\"preemptions\": %ld, "
               "\"computed_tokens\": %ld, \"kv_mean_bytes\": %.0f, \"kv_peak_bytes\": %.0f, "
               "\"contiguous_bytes\": %.0f, \"tokens_per_verification\": %.4f}",
               i ? "," : "", r[i].mode, r[i].steps, r[i].makespan, r[i].tokens_per_s, r[i].mean_latency,
               r[i].p99_latency, r[i].step_utilisation, r[i].utilisation, r[i].preemptions, r[i].computed_tokens, r[i].mean_kv_bytes,
               r[i].peak_kv_bytes, r[i].contiguous_bytes,
               r[i].verify_calls ? 1.0 + (double)r[i].accepted_drafts / (double)r[i].verify_calls : 0.0);
    printf("]}\n");
}

/* Busy slots over time, averaged into at most 400 buckets per mode. */
static int write_plot(const char *path, const sim_result *r, int count, int max_batch) {
    enum { BUCKETS = 400 };
    double *x = malloc(2 * BUCKETS * sizeof(double) * (size_t)count);
    if (!x)
        return -1;
    svg_series series[2];
    for (int m = 0; m < count; ++m) {
        double *bx = x + (size_t)m * 2 * BUCKETS, *by = bx + BUCKETS;
        const double end = r[m].points ? r[m].tx[r[m].points - 1] : 1.0, w = end / BUCKETS;
        int k = 0;
        double prev = 0.0;
        for (int b = 0; b < BUCKETS; ++b) {
            /* the step-time-weighted mean of busy slots in [b w, (b+1) w) */
            double lo = b * w, hi = lo + w, acc = 0.0, covered = 0.0;
            while (k < r[m].points && r[m].tx[k] <= lo) {
                prev = r[m].tx[k];
                ++k;
            }
            int j = k;
            double t = lo, start = prev;
            (void)start;
            while (j < r[m].points && t < hi) {
                double seg_end = r[m].tx[j] < hi ? r[m].tx[j] : hi;
                acc += (seg_end - t) * r[m].ty[j];
                covered += seg_end - t;
                t = seg_end;
                if (r[m].tx[j] <= hi)
                    ++j;
                else
                    break;
            }
            bx[b] = lo + w / 2;
            by[b] = covered > 0 ? acc / covered : 0.0;
        }
        series[m].label = r[m].mode;
        series[m].x = bx;
        series[m].y = by;
        series[m].n = BUCKETS;
    }
    char title[128], err[256];
    snprintf(title, sizeof title, "Batch slots doing work (of %d), static vs continuous batching", max_batch);
    int rc = svg_plot_write_ytop(path, title, "time (s)", "busy slots", series, count, 0, (double)max_batch, err,
                                 sizeof err);
    if (rc != 0)
        cli_errorf("--plot %s: %s", path, err);
    free(x);
    return rc;
}

/* The options that set one of sim_opts' whole numbers, with their ranges, in the order of its
 * fields. */
static const struct {
    const char *name;
    long min, max;
} sim_int_options[8] = {{"--max-batch", 1, 4096}, {"--token-budget", 1, 1 << 20},
                        {"--page-size", 1, 256},  {"--pages", 1, 1 << 24},
                        {"--heads", 1, 256},      {"--kv-heads", 1, 256},
                        {"--head-dim", 1, 256},   {"--spec-k", 0, FLASHCL_SPEC_MAX_DRAFT}};

/* Takes one of sim_int_options into its field of *o: 1 when taken, 0 for another option, -1
 * after the usage error ("--pages wants 1..16777216, not X"). */
static int take_sim_int(int argc, char **argv, int *i, sim_opts *o) {
    int *field[8] = {&o->max_batch, &o->token_budget, &o->page_size, &o->pages,
                     &o->heads_q,   &o->heads_k,      &o->head_dim,  &o->spec_k};
    for (int k = 0; k < 8; ++k) {
        char wants[64];
        long l;
        snprintf(wants, sizeof wants, "%s wants %ld..%ld, not", sim_int_options[k].name,
                 sim_int_options[k].min, sim_int_options[k].max);
        int t = take_long(usage_serve_sim, argc, argv, i, sim_int_options[k].name,
                          sim_int_options[k].min, sim_int_options[k].max, wants, &l);
        if (t > 0)
            *field[k] = (int)l;
        if (t != 0)
            return t;
    }
    return 0;
}

/* ---- serve-sim ------------------------------------------------------------------------------------ */

int cmd_serve_sim(int argc, char **argv) {
    sim_opts o = {16, 256, 16, 0, 2, 1, 16, 0, 0.8, 1, 0.0, FLASHCL_FLOAT32, FLASHCL_FLOAT32};
    long requests = 48, prompt[2] = {16, 128}, output[2] = {10, 2000};
    double rate = 0.0;
    const char *trace = NULL, *plot = NULL, *device = NULL, *mode = "both";
    int json = 0;
    for (int i = 2; i < argc; ++i) {
        const char *v = NULL;
        long l;
        int t;
        if (cli_help(argv[i], usage_serve_sim)) {
            return CLI_EXIT_OK;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if ((t = take_long(usage_serve_sim, argc, argv, &i, "--requests", 1, 1000000,
                                  "--requests wants 1..1000000, not", &requests)) != 0) {
            if (t < 0)
                return CLI_EXIT_USAGE;
        } else if ((t = cli_take_value(argc, argv, &i, "--rate", &v))) {
            if (t < 0 || cli_parse_double(v, &rate) || rate < 0)
                return usage_fail(usage_serve_sim, "--rate wants a number >= 0, not", v);
        } else if ((t = cli_take_value(argc, argv, &i, "--prompt", &v))) {
            if (t < 0 || parse_pair(v, 1, 1000000, prompt))
                return usage_fail(usage_serve_sim, "--prompt wants MIN,MAX (1 <= MIN <= MAX), not", v);
        } else if ((t = cli_take_value(argc, argv, &i, "--output", &v))) {
            if (t < 0 || parse_pair(v, 1, 1000000, output))
                return usage_fail(usage_serve_sim, "--output wants MIN,MAX (1 <= MIN <= MAX), not", v);
        } else if ((t = cli_take_value(argc, argv, &i, "--trace", &trace)) != 0 ||
                   (t = cli_take_value(argc, argv, &i, "--device", &device)) != 0 ||
                   (t = cli_take_value(argc, argv, &i, "--plot", &plot)) != 0) {
            if (t < 0)
                return CLI_EXIT_USAGE;
        } else if ((t = take_long(usage_serve_sim, argc, argv, &i, "--seed", 0, 0x7fffffffL,
                                  "--seed wants an integer >= 0, not", &l)) != 0) {
            if (t < 0)
                return CLI_EXIT_USAGE;
            o.seed = (uint64_t)l;
        } else if ((t = cli_take_value(argc, argv, &i, "--mode", &v))) {
            if (t < 0 || (strcmp(v, "both") && strcmp(v, "static") && strcmp(v, "continuous")))
                return usage_fail(usage_serve_sim, "--mode wants both, static or continuous, not", v);
            mode = v;
        } else if ((t = take_sim_int(argc, argv, &i, &o)) != 0) {
            if (t < 0)
                return CLI_EXIT_USAGE;
        } else if ((t = cli_take_value(argc, argv, &i, "--accept", &v))) {
            if (t < 0 || cli_parse_double(v, &o.accept) || o.accept < 0 || o.accept > 1)
                return usage_fail(usage_serve_sim, "--accept wants a number in [0, 1], not", v);
        } else if ((t = cli_take_value(argc, argv, &i, "--kv-dtype", &v))) {
            if (t < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_dtype_fp8(v, &o.kv_dtype))
                return usage_fail(usage_serve_sim, "--kv-dtype wants f32, f16, bf16, e4m3 or e5m2, not", v);
            /* 16/32-bit pages: queries in the same type; FP8: f16 queries */
            o.dtype = o.kv_dtype == FLASHCL_FLOAT8_E4M3 || o.kv_dtype == FLASHCL_FLOAT8_E5M2 ? FLASHCL_FLOAT16
                                                                                             : o.kv_dtype;
        } else if ((t = cli_take_value(argc, argv, &i, "--model-ms", &v))) {
            if (t < 0 || cli_parse_double(v, &o.model_ms) || o.model_ms < 0)
                return usage_fail(usage_serve_sim, "--model-ms wants a number >= 0, not", v);
        } else {
            return cli_unknown_option(usage_serve_sim, argv[i]);
        }
    }
    if (o.heads_q % o.heads_k)
        return usage_fail(usage_serve_sim, "--heads must be a multiple of --kv-heads", NULL);
    if (o.token_budget < o.max_batch * (1 + o.spec_k)) {
        o.token_budget = o.max_batch * (1 + o.spec_k);
        cli_errorf("note: --token-budget raised to max-batch x (1 + spec-k) = %d", o.token_budget);
    }

    /* the trace */
    sim_req *reqs = NULL;
    int n = 0;
    if (trace) {
        if (load_trace(trace, &reqs, &n))
            return CLI_EXIT_FAIL;
    } else {
        n = (int)requests;
        reqs = malloc((size_t)n * sizeof *reqs);
        if (!reqs) {
            cli_errorf("out of memory");
            return CLI_EXIT_FAIL;
        }
        flashcl_ref_rng rng;
        flashcl_ref_rng_seed(&rng, o.seed);
        double t = 0.0;
        for (int i = 0; i < n; ++i) {
            if (rate > 0)
                t += -log(1.0 - flashcl_ref_rng_uniform(&rng)) / rate;
            reqs[i].arrival = t;
            reqs[i].prompt = (int)(prompt[0] + (long)(flashcl_ref_rng_uniform(&rng) * (prompt[1] - prompt[0] + 1)));
            double lo = log((double)output[0]), hi = log((double)output[1] + 1.0);
            int out = (int)exp(lo + flashcl_ref_rng_uniform(&rng) * (hi - lo));
            reqs[i].output = out < output[0] ? (int)output[0] : out > output[1] ? (int)output[1] : out;
        }
    }
    long total_out = 0, max_len = 0;
    for (int i = 0; i < n; ++i) {
        total_out += reqs[i].output;
        if (reqs[i].prompt + reqs[i].output > max_len)
            max_len = reqs[i].prompt + reqs[i].output;
    }
    const long pages_one = (max_len + o.spec_k + o.page_size - 1) / o.page_size;
    if (!o.pages) {
        long half = (long)o.max_batch * pages_one / 2;
        o.pages = (int)(half > pages_one ? half : pages_one);
    }
    /* FP8 pages: the byte budget of o.pages f16 pages holds twice as many. */
    const int fp8 = o.kv_dtype != o.dtype;
    if (fp8 && o.pages > (1 << 24) / 2) {
        cli_errorf("--pages %d: twice that many FP8 pages exceed 2^24", o.pages);
        free(reqs);
        return CLI_EXIT_FAIL;
    }
    if (fp8)
        o.pages *= 2;
    if (o.pages < pages_one) {
        cli_errorf("--pages %d cannot hold the longest request (%ld pages)", o.pages, pages_one);
        free(reqs);
        return CLI_EXIT_FAIL;
    }

    flashcl_context *ctx = NULL;
    if (flashcl_context_create(&ctx, device) != FLASHCL_SUCCESS) {
        cli_errorf("%s", flashcl_last_error(ctx));
        flashcl_context_destroy(ctx);
        free(reqs);
        return CLI_EXIT_FAIL;
    }
    if (flashcl_context_is_host(ctx)) {
        cli_errorf("serve-sim needs an OpenCL device (the KV cache lives in device memory)");
        flashcl_context_destroy(ctx);
        free(reqs);
        return CLI_EXIT_FAIL;
    }
    /* Device data, made once: random Q and K/V for a full step, spec rows. */
    device_bufs bufs;
    memset(&bufs, 0, sizeof bufs);
    const size_t qn = (size_t)o.token_budget * o.heads_q * o.head_dim, kn = (size_t)o.token_budget * o.heads_k * o.head_dim;
    const size_t es = flashcl_dtype_size(o.dtype);
    void *host = malloc((qn > kn ? qn : kn) * es);
    int rc = CLI_EXIT_OK;
    if (!host) {
        cli_errorf("out of memory");
        rc = CLI_EXIT_FAIL;
    } else {
        flashcl_ref_rng rng;
        flashcl_ref_rng_seed(&rng, o.seed + 1);
        flashcl_ref_fill_normal(&rng, host, o.dtype, qn, 1.0);
        bufs.q = make_buf(ctx, qn * es, host);
        bufs.out = make_buf(ctx, qn * es, NULL);
        flashcl_ref_fill_normal(&rng, host, o.dtype, kn, 1.0);
        bufs.kv = make_buf(ctx, kn * es, host);
        if (o.spec_k) {
            /* Every decode verifies k drafts of token 0 proposed with q = one-hot(0)
             * against p = (a, 1 - a): sum min(p, q) = a at every position. */
            const size_t B = (size_t)o.max_batch, K = (size_t)o.spec_k;
            int *draft = calloc(B * K, sizeof(int));
            float *qrows = calloc(B * K * 2, sizeof(float)), *prows = calloc(B * (K + 1) * 2, sizeof(float));
            if (draft && qrows && prows) {
                for (size_t r = 0; r < B * K; ++r)
                    qrows[2 * r] = 1.0f;
                for (size_t r = 0; r < B * (K + 1); ++r) {
                    prows[2 * r] = (float)o.accept;
                    prows[2 * r + 1] = 1.0f - (float)o.accept;
                }
                bufs.draft = make_buf(ctx, B * K * sizeof(int), draft);
                bufs.sq = make_buf(ctx, B * K * 2 * sizeof(float), qrows);
                bufs.sp = make_buf(ctx, B * (K + 1) * 2 * sizeof(float), prows);
                bufs.acc = make_buf(ctx, B * sizeof(int), NULL);
                bufs.tok = make_buf(ctx, B * (K + 1) * sizeof(int), NULL);
            }
            free(draft);
            free(qrows);
            free(prows);
            if (!bufs.tok)
                rc = CLI_EXIT_FAIL;
        }
        if (!bufs.q || !bufs.out || !bufs.kv)
            rc = CLI_EXIT_FAIL;
        if (rc)
            cli_errorf("allocating device buffers failed");
    }
    free(host);

    sim_result res[2];
    memset(res, 0, sizeof res);
    int count = 0;
    if (rc == CLI_EXIT_OK && warm_kernels(ctx, &o, &bufs))
        rc = CLI_EXIT_FAIL;
    if (rc == CLI_EXIT_OK && strcmp(mode, "continuous")) {
        if (run_mode(ctx, FLASHCL_SCHEDULE_STATIC, &o, reqs, n, &bufs, &res[count++]))
            rc = CLI_EXIT_FAIL;
    }
    if (rc == CLI_EXIT_OK && strcmp(mode, "static")) {
        if (run_mode(ctx, FLASHCL_SCHEDULE_CONTINUOUS, &o, reqs, n, &bufs, &res[count++]))
            rc = CLI_EXIT_FAIL;
    }
    if (rc == CLI_EXIT_OK) {
        if (json)
            print_json(ctx, &o, n, total_out, res, count);
        else
            print_table(&o, n, total_out, res, count);
        if (plot && write_plot(plot, res, count, o.max_batch))
            rc = CLI_EXIT_FAIL;
        else if (plot && !json)
            printf("plot: %s\n", plot);
    }
    for (int i = 0; i < 2; ++i) {
        free(res[i].tx);
        free(res[i].ty);
    }
    release_bufs(&bufs);
    flashcl_context_destroy(ctx);
    free(reqs);
    return rc;
}
