/* tune.c: `flashcl tune`: search kernel parameters for one problem class, validate, time, keep the fastest.
 *
 * The search space and its constraints are data (tune_spaces below). Every
 * candidate is first offered to flashcl_set_params, which applies the
 * library's own checks (local memory, work-group size, the kernel's
 * divisibility rules): what it refuses is pruned, with its reason. Each
 * remaining candidate is then, in order:
 *   1. built and run on a small problem whose sizes are not tile multiples
 *      (Nq = Nk = 131, GQA 2:1), checked against host_ref (poisoned outputs);
 *   2. run once on the timed problem with a poisoned output, which must come
 *      back without NaN (every block written);
 *   3. warmed up, then timed with OpenCL profiling events (median and min).
 * A candidate that fails to build or validate is a row in the report. The
 * parameters the library picks now are always measured first, as the
 * baseline. The winner is written to the user tuning file (atomically, by
 * flashcl_tuning_file_save). Ctrl-C stops after the current run and keeps
 * the best so far; a second Ctrl-C kills.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "flashcl.h"
#include "flashcl_ref.h"
#include "tune.h"

const char usage_tune[] =
    "usage: flashcl tune [options]\n"
    "\n"
    "Searches the forward kernel's parameters for one problem class (dtype,\n"
    "head_dim class, causal) on one device: prunes what cannot fit, validates\n"
    "every candidate against the reference on a 131x131 GQA problem, times it\n"
    "on the given shape with profiling events (warm-up, median), prints the\n"
    "table and the winner's speedup over the parameters used now, and writes\n"
    "the winner to the user tuning file (FLASHCL_TUNING_FILE, else\n"
    "$XDG_CONFIG_HOME/flashcl/tuning.json, else ~/.config/flashcl/tuning.json).\n"
    "Ctrl-C stops early and still writes the best so far.\n"
    "\n"
    "options:\n"
    "  --device SPEC          see 'flashcl --help'\n"
    "  --dtype f16|bf16|f32   storage type (default f16)\n"
    "  --head-dim D           head dimension (default 64)\n"
    "  --causal               tune the causal class (default: non-causal)\n"
    "  --decode               tune the decode class: seqlen_q = 1, seqlen_k = --seqlen\n"
    "  --seqlen N             timed problem's seqlen_q = seqlen_k (default 4096; 1024 on a CPU)\n"
    "  --batch B, --heads H   timed problem's batch and heads (default 1, 8)\n"
    "  --variant LIST         variants to search: cpu,portable,nv-mma,nv-tf32,nv-wgmma\n"
    "                         (default: the device's own: cpu on CPUs, portable\n"
    "                         elsewhere; on NVIDIA the tensor-core kernel the\n"
    "                         class gets, with portable, or nv-mma beside nv-wgmma)\n"
    "  --budget SECONDS       stop starting candidates after this long (default 300)\n"
    "  --iters N, --warmup N  timed and untimed runs (default 10 and 2; 3 and 1 on a CPU)\n"
    "  --confirm N            rounds that re-time the three fastest and the current\n"
    "                         parameters, interleaved, so that load that changed during\n"
    "                         the search cannot pick the winner (default 3; 0: off)\n"
    "  --output FILE          tuning file to write (default: the one above)\n"
    "  --no-write             do not write the winner\n"
    "  --dry-run              list the candidates (and what is pruned) without running\n";

/* ---- the search space, as data ---------------------------------------------------------------- */

typedef struct tune_space {
    const char *variant;
    int block_m[8], block_n[8]; /* 0-terminated */
    const char *extra;          /* the third parameter: "TPR", "WARPS", or NULL */
    int extra_values[8];
    int max_rows_per_unit;      /* nv-mma: rows per warp at most this (0: no rule) */
    const char *rules;          /* the constraints, as the report states them */
} tune_space;

static const tune_space tune_spaces[] = {
    {"cpu", {8, 16, 32, 64, 128, 0}, {16, 32, 64, 128, 0}, NULL, {0}, 0,
     "BLOCK_N % 8 == 0; tiles fit local memory"},
    {"portable", {4, 8, 16, 32, 64, 0}, {16, 32, 64, 0}, "TPR", {1, 2, 4, 8, 16, 32, 0}, 0,
     "BLOCK_N % TPR == 0; BLOCK_M*TPR <= the device's work-group; tiles fit local memory"},
    /* cl/flash_fwd_nv.cl: 16 or 32 query rows per warp (one or two A fragments). */
    {"nv-mma", {32, 64, 128, 256, 0}, {16, 32, 64, 128, 0}, "WARPS", {2, 4, 8, 0}, 32,
     "BLOCK_M % (16*WARPS) == 0 with <= 32 rows per warp; BLOCK_N % 16 == 0; tiles <= 48000 B"},
    /* cl/flash_fwd_nv32.cl: float32, 16 query rows per warp. */
    {"nv-tf32", {32, 64, 128, 0}, {8, 16, 32, 64, 0}, "WARPS", {2, 4, 8, 0}, 16,
     "BLOCK_M == 16*WARPS; BLOCK_N % 8 == 0; tiles <= 48000 B"},
    /* cl/flash_fwd_sm90.cl: whole warpgroups of 64 rows. */
    {"nv-wgmma", {64, 128, 0}, {48, 64, 0}, "WARPS", {4, 8, 0}, 16,
     "WARPS % 4 == 0; BLOCK_M == 16*WARPS; BLOCK_N 48 or 64; head_dim 32..128"},
};

typedef struct candidate {
    flashcl_params p;
    int baseline;         /* the parameters the library picks now */
    char status[200];     /* "ok", or why not */
    int ok, ran;
    double median_ms, min_ms;
    double confirmed_ms; /* median over the confirmation rounds (0: not confirmed) */
} candidate;

/* ---- Ctrl-C ------------------------------------------------------------------------------------ */

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
    signal(SIGINT, SIG_DFL); /* a second Ctrl-C kills */
}

/* ---- helpers ----------------------------------------------------------------------------------- */

/* The tensor-core variants, parameterised by warps. */
static int is_nv_variant(const char *v) {
    return !strcmp(v, "nv-mma") || !strcmp(v, "nv-tf32") || !strcmp(v, "nv-wgmma") || !strcmp(v, "nv-wgmma-fp8");
}

static void describe(const flashcl_params *p, char *buf, size_t n) {
    if (!strcmp(p->variant, "portable"))
        snprintf(buf, n, "%-8s BM=%-3d BN=%-3d TPR=%d", p->variant, p->block_m, p->block_n,
                 p->threads_per_row);
    else if (is_nv_variant(p->variant))
        snprintf(buf, n, "%-8s BM=%-3d BN=%-3d WARPS=%d", p->variant, p->block_m, p->block_n,
                 p->work_group_size / 32);
    else
        snprintf(buf, n, "%-8s BM=%-3d BN=%-3d", p->variant, p->block_m, p->block_n);
}

static int same_params(const flashcl_params *a, const flashcl_params *b) {
    return !strcmp(a->variant, b->variant) && a->block_m == b->block_m && a->block_n == b->block_n &&
           a->threads_per_row == b->threads_per_row &&
           (!is_nv_variant(a->variant) || a->work_group_size == b->work_group_size);
}

static void fmt_secs(double s, char *buf, size_t n) {
    if (s < 0 || !isfinite(s))
        snprintf(buf, n, "?");
    else if (s >= 60)
        snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else
        snprintf(buf, n, "%.0fs", s);
}

/* One progress update: a redrawn bar on a terminal, a plain line otherwise. */
static void progress(int tty, int done, int total, double elapsed, double budget, const char *what,
                     double best_ms) {
    char eta[32], el[32];
    double left = done > 0 ? elapsed / done * (total - done) : -1;
    if (left > budget - elapsed)
        left = budget - elapsed;
    fmt_secs(left, eta, sizeof eta);
    fmt_secs(elapsed, el, sizeof el);
    if (tty) {
        int width = 24, fill = total ? done * width / total : width;
        fprintf(stderr, "\r\033[K[");
        for (int i = 0; i < width; i++)
            fputc(i < fill ? '#' : '.', stderr);
        fprintf(stderr, "] %d/%d %s ETA %s  best ", done, total, el, eta);
        if (best_ms > 0)
            fprintf(stderr, "%.3f ms  ", best_ms);
        else
            fprintf(stderr, "-  ");
        fprintf(stderr, "%.40s", what);
        if (done == total)
            fputc('\n', stderr);
    } else {
        fprintf(stderr, "tune: [%d/%d] %s (elapsed %s, ETA %s)\n", done, total, what, el, eta);
    }
    fflush(stderr);
}

/* ---- running one candidate -------------------------------------------------------------------- */

typedef struct tune_problem {
    flashcl_attention_desc desc, vdesc; /* timed and validation problems */
    void *vq, *vk, *vv, *vout;
    float *vlse;
    size_t vnq, vnk, vnlse;
    cl_mem bufs[5];
    size_t sizes[5];
    void *poison; /* sizes[3] bytes of NaN for the timed output */
    void *back;   /* sizes[3] bytes read back */
    size_t nq;
    int iters, warmup;
} tune_problem;

static int has_nan(const void *data, flashcl_dtype dtype, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (isnan(flashcl_ref_load(data, dtype, i)))
            return 1;
    return 0;
}

static void fail_status(candidate *c, flashcl_context *ctx, const char *what, flashcl_status st) {
    const char *msg = flashcl_last_error(ctx);
    snprintf(c->status, sizeof c->status, "%s: %s%s%.140s",
             st == FLASHCL_ERROR_BUILD_FAILED ? "build failed" : what, flashcl_status_string(st),
             msg && *msg ? ": " : "", msg ? msg : "");
    /* Keep the row on one line: a build log has newlines. */
    for (char *s = c->status; *s; s++)
        if (*s == '\n' || *s == '\r' || *s == '\t')
            *s = ' ';
}

/* Warm-up, then t->iters profiling-event times of c's parameters (already
 * validated); 0 with the median and min, else -1 with c->status set. */
static int time_candidate(flashcl_context *ctx, tune_problem *t, candidate *c, double *median, double *min) {
    flashcl_status st = flashcl_set_params(ctx, &t->desc, &c->p);
    double *times = malloc((size_t)t->iters * sizeof *times);
    int n = 0;
    if (st != FLASHCL_SUCCESS || !times) {
        if (st != FLASHCL_SUCCESS)
            fail_status(c, ctx, "refused", st);
        else
            snprintf(c->status, sizeof c->status, "out of memory");
        free(times);
        return -1;
    }
    for (int it = 0; it < t->warmup + t->iters && !interrupted; it++) {
        cl_ulong start = 0, end = 0;
        cl_event ev = NULL;
        st = flashcl_attention_forward(ctx, &t->desc, t->bufs[0], t->bufs[1], t->bufs[2], t->bufs[3],
                                       t->bufs[4], 0, &ev);
        if (st == FLASHCL_SUCCESS && ev)
            st = clWaitForEvents(1, &ev);
        if (st == FLASHCL_SUCCESS && ev && it >= t->warmup) {
            st = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL);
            if (st == CL_SUCCESS)
                st = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL);
            times[n++] = (double)(end - start) * 1e-6;
        }
        if (ev)
            clReleaseEvent(ev);
        if (st != FLASHCL_SUCCESS) {
            fail_status(c, ctx, "timing failed", st);
            free(times);
            return -1;
        }
    }
    if (n < t->iters) {
        snprintf(c->status, sizeof c->status, "interrupted");
        free(times);
        return -1;
    }
    qsort(times, (size_t)n, sizeof *times, cli_compare_doubles);
    *min = times[0];
    *median = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    free(times);
    return 0;
}

static void run_candidate(flashcl_context *ctx, tune_problem *t, candidate *c) {
    cl_command_queue queue = flashcl_context_cl_queue(ctx);
    flashcl_status st;
    flashcl_ref_report report;
    c->ran = 1;
    if ((st = flashcl_set_params(ctx, &t->desc, &c->p)) != FLASHCL_SUCCESS) {
        fail_status(c, ctx, "refused", st);
        return;
    }
    /* 1. validation on the small problem */
    flashcl_ref_poison(t->vout, t->vdesc.dtype, t->vnq);
    flashcl_ref_poison(t->vlse, FLASHCL_FLOAT32, t->vnlse);
    st = flashcl_attention_forward_host(ctx, &t->vdesc, t->vq, t->vk, t->vv, t->vout, t->vlse);
    if (st != FLASHCL_SUCCESS) {
        fail_status(c, ctx, "run failed", st);
        return;
    }
    memset(&report, 0, sizeof report);
    if (!flashcl_ref_check_forward(&t->vdesc, t->vq, t->vk, t->vv, t->vout, t->vlse, 0, &report)) {
        snprintf(c->status, sizeof c->status, "wrong result: max_err %.3g > tolerance %.3g",
                 report.max_err, report.tolerance);
        return;
    }
    /* 2. the timed problem once, poisoned: every element must be written */
    cl_int err = clEnqueueWriteBuffer(queue, t->bufs[3], CL_TRUE, 0, t->sizes[3], t->poison, 0, NULL, NULL);
    cl_event ev = NULL;
    st = err == CL_SUCCESS ? flashcl_attention_forward(ctx, &t->desc, t->bufs[0], t->bufs[1], t->bufs[2],
                                                       t->bufs[3], t->bufs[4], 0, &ev)
                           : err;
    if (ev)
        clReleaseEvent(ev);
    if (st == FLASHCL_SUCCESS)
        st = clEnqueueReadBuffer(queue, t->bufs[3], CL_TRUE, 0, t->sizes[3], t->back, 0, NULL, NULL);
    if (st != FLASHCL_SUCCESS) {
        fail_status(c, ctx, "timed problem failed", st);
        return;
    }
    if (has_nan(t->back, t->desc.dtype, t->nq)) {
        snprintf(c->status, sizeof c->status, "wrong result: NaN or unwritten output on the timed shape");
        return;
    }
    /* 3. warm-up, then profiling-event times */
    if (time_candidate(ctx, t, c, &c->median_ms, &c->min_ms) == 0) {
        c->ok = 1;
        snprintf(c->status, sizeof c->status, "ok");
    }
}

/* The integer options: 1 + the index of the one argv[*i] is, 0 if none, -1 if its value is missing. */
static const char *const int_options[] = {"--head-dim", "--seqlen", "--batch", "--heads",
                                          "--iters",    "--warmup", "--confirm"};

static int int_option(int argc, char **argv, int *i, const char **value) {
    for (int k = 0; k < (int)(sizeof int_options / sizeof int_options[0]); k++) {
        int r = cli_take_value(argc, argv, i, int_options[k], value);
        if (r != 0)
            return r < 0 ? -1 : k + 1;
    }
    return 0;
}

/* ---- the command ------------------------------------------------------------------------------- */

static int add_candidate(candidate **list, int *count, int *cap, const flashcl_params *p) {
    for (int i = 0; i < *count; i++)
        if (same_params(&(*list)[i].p, p))
            return 0;
    if (*count == *cap) {
        int grown_cap = *cap ? *cap * 2 : 64;
        candidate *grown = realloc(*list, (size_t)grown_cap * sizeof *grown);
        if (!grown)
            return -1;
        *list = grown;
        *cap = grown_cap;
    }
    memset(&(*list)[*count], 0, sizeof **list);
    (*list)[*count].p = *p;
    (*count)++;
    return 0;
}

/* Candidates of one space that the library accepts for desc; pruned ones
 * are listed too (when list_pruned) with the library's reason. */
static int enumerate(flashcl_context *ctx, const flashcl_attention_desc *desc, const tune_space *s,
                     candidate **list, int *count, int *cap, int *pruned, int list_pruned) {
    static const int none[2] = {0, 0};
    const int *extras = s->extra ? s->extra_values : none;
    for (int a = 0; s->block_m[a]; a++)
        for (int b = 0; s->block_n[b]; b++)
            for (int e = 0; e == 0 || extras[e]; e++) {
                flashcl_params p;
                char why[200] = "";
                memset(&p, 0, sizeof p);
                p.variant = s->variant;
                p.block_m = s->block_m[a];
                p.block_n = s->block_n[b];
                if (s->extra && !strcmp(s->extra, "TPR")) {
                    p.threads_per_row = extras[e];
                    p.work_group_size = p.block_m * p.threads_per_row;
                } else if (s->extra) {
                    p.work_group_size = 32 * extras[e];
                } else {
                    p.work_group_size = 1;
                }
                if (s->max_rows_per_unit && extras[e] &&
                    p.block_m / extras[e] > s->max_rows_per_unit)
                    snprintf(why, sizeof why, "more than %d rows per warp", s->max_rows_per_unit);
                else if (flashcl_set_params(ctx, desc, &p) != FLASHCL_SUCCESS)
                    snprintf(why, sizeof why, "%s", flashcl_last_error(ctx));
                if (why[0]) {
                    (*pruned)++;
                    if (list_pruned) {
                        char d[64];
                        describe(&p, d, sizeof d);
                        printf("  pruned  %-28s %s\n", d, why);
                    }
                } else if (add_candidate(list, count, cap, &p) != 0) {
                    return -1;
                }
                if (!s->extra)
                    break;
            }
    flashcl_set_params(ctx, desc, NULL);
    return 0;
}

static int setup_problem(flashcl_context *ctx, tune_problem *t) {
    flashcl_ref_rng rng;
    const flashcl_attention_desc *d = &t->desc, *v = &t->vdesc;
    size_t esz = flashcl_dtype_size(d->dtype);
    cl_int err = CL_SUCCESS;
    t->vnq = (size_t)v->batch * v->seqlen_q * v->heads_q * v->head_dim;
    t->vnk = (size_t)v->batch * v->seqlen_k * v->heads_k * v->head_dim;
    t->vnlse = (size_t)v->batch * v->heads_q * v->seqlen_q;
    t->vq = malloc(t->vnq * esz);
    t->vk = malloc(t->vnk * esz);
    t->vv = malloc(t->vnk * esz);
    t->vout = malloc(t->vnq * esz);
    t->vlse = malloc(t->vnlse * sizeof(float));
    t->nq = (size_t)d->batch * d->seqlen_q * d->heads_q * d->head_dim;
    size_t nk = (size_t)d->batch * d->seqlen_k * d->heads_k * d->head_dim;
    t->sizes[0] = t->sizes[3] = t->nq * esz;
    t->sizes[1] = t->sizes[2] = nk * esz;
    t->sizes[4] = (size_t)d->batch * d->heads_q * d->seqlen_q * sizeof(float);
    t->poison = malloc(t->sizes[3]);
    t->back = malloc(t->sizes[3]);
    void *host = malloc(t->sizes[1] > t->sizes[0] ? t->sizes[1] : t->sizes[0]);
    if (!t->vq || !t->vk || !t->vv || !t->vout || !t->vlse || !t->poison || !t->back || !host) {
        free(host);
        cli_errorf("out of host memory");
        return -1;
    }
    flashcl_ref_rng_seed(&rng, 0x7E57u);
    flashcl_ref_fill_normal(&rng, t->vq, v->dtype, t->vnq, 1.0);
    flashcl_ref_fill_normal(&rng, t->vk, v->dtype, t->vnk, 1.0);
    flashcl_ref_fill_normal(&rng, t->vv, v->dtype, t->vnk, 1.0);
    flashcl_ref_poison(t->poison, d->dtype, t->nq);
    for (int b = 0; b < 5 && err == CL_SUCCESS; b++) {
        t->bufs[b] = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE, t->sizes[b], NULL, &err);
        if (err == CL_SUCCESS && b < 3) {
            flashcl_ref_fill_normal(&rng, host, d->dtype, b == 0 ? t->nq : nk, 1.0);
            err = clEnqueueWriteBuffer(flashcl_context_cl_queue(ctx), t->bufs[b], CL_TRUE, 0, t->sizes[b],
                                       host, 0, NULL, NULL);
        }
    }
    free(host);
    if (err != CL_SUCCESS) {
        cli_errorf("device buffers for the timed problem: %s (%d)", flashcl_status_string(err), err);
        return -1;
    }
    return 0;
}

static void free_problem(tune_problem *t) {
    for (int b = 0; b < 5; b++)
        if (t->bufs[b])
            clReleaseMemObject(t->bufs[b]);
    free(t->vq);
    free(t->vk);
    free(t->vv);
    free(t->vout);
    free(t->vlse);
    free(t->poison);
    free(t->back);
}

int cmd_tune(int argc, char **argv) {
    const char *device = NULL, *value, *variants = NULL, *output = NULL;
    flashcl_dtype dtype = FLASHCL_FLOAT16;
    long head_dim = 64, seqlen = 0, batch = 1, heads = 8, iters = 0, warmup = -1, confirm = 3, number;
    double budget = 300;
    int causal = 0, decode = 0, dry_run = 0, no_write = 0, rc = CLI_EXIT_FAIL;
    candidate *list = NULL;
    int count = 0, cap = 0, pruned = 0;
    tune_problem t;
    memset(&t, 0, sizeof t);
    const cli_flag flags[4] = {{"--causal", &causal},
                               {"--decode", &decode},
                               {"--dry-run", &dry_run},
                               {"--no-write", &no_write}};

    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int r, k;
        if (cli_help(arg, usage_tune)) {
            return CLI_EXIT_OK;
        }
#define TAKE(name) ((r = cli_take_value(argc, argv, &i, name, &value)) != 0)
        if ((r = cli_take_value(argc, argv, &i, "--device", &device)) != 0 ||
            (r = cli_take_value(argc, argv, &i, "--variant", &variants)) != 0 ||
            (r = cli_take_value(argc, argv, &i, "--output", &output)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if (TAKE("--dtype")) {
            if (r < 0 || cli_parse_dtype(value, &dtype) != 0)
                return r < 0 ? CLI_EXIT_USAGE : (cli_errorf("--dtype wants f16, bf16 or f32"), CLI_EXIT_USAGE);
        } else if ((k = int_option(argc, argv, &i, &value)) != 0) {
            static const long lo[] = {1, 1, 1, 1, 1, 0, 0};
            static const long hi[] = {256, 1 << 24, 1 << 16, 1 << 16, 1 << 20, 1 << 20, 100};
            long *dst[] = {&head_dim, &seqlen, &batch, &heads, &iters, &warmup, &confirm};
            if (k < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_long(value, lo[k - 1], hi[k - 1], &number) != 0) {
                cli_errorf("%s wants an integer in %ld..%ld, not '%s'", int_options[k - 1], lo[k - 1],
                           hi[k - 1], value);
                return CLI_EXIT_USAGE;
            }
            *dst[k - 1] = number;
        } else if (TAKE("--budget")) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_double(value, &budget) != 0 || budget <= 0) {
                cli_errorf("--budget wants seconds > 0, not '%s'", value);
                return CLI_EXIT_USAGE;
            }
        } else if (!cli_take_flag(arg, flags, 4)) {
            return cli_unknown_option(usage_tune, arg);
        }
#undef TAKE
    }
    if (variants) { /* check the list before opening anything */
        char copy[128];
        snprintf(copy, sizeof copy, "%s", variants);
        for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
            int known = 0;
            for (size_t s = 0; s < sizeof tune_spaces / sizeof tune_spaces[0]; s++)
                known |= !strcmp(tok, tune_spaces[s].variant);
            if (!known) {
                cli_errorf("--variant: unknown variant '%s' (cpu, portable, nv-mma)", tok);
                return CLI_EXIT_USAGE;
            }
        }
    }

    flashcl_context *ctx = cli_open_device(
        device, "the host path has no kernel parameters to tune: pick an OpenCL device");
    if (!ctx)
        return CLI_EXIT_FAIL;
    cl_device_type type = 0;
    clGetDeviceInfo(flashcl_context_cl_device(ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL);
    int is_cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
    if (!seqlen)
        seqlen = is_cpu ? 1024 : 4096;
    if (!iters)
        iters = is_cpu ? 3 : 10;
    if (warmup < 0)
        warmup = is_cpu ? 1 : 2;
    t.iters = (int)iters;
    t.warmup = (int)warmup;

    /* The problems: timed, and the validation one of the same class. */
    flashcl_attention_desc *d = &t.desc, *v = &t.vdesc;
    d->dtype = dtype;
    d->batch = (int)batch;
    d->heads_q = d->heads_k = (int)heads;
    d->seqlen_q = decode ? 1 : (int)seqlen;
    d->seqlen_k = (int)seqlen;
    d->head_dim = (int)head_dim;
    d->causal = causal;
    *v = *d;
    v->batch = 1;
    v->heads_q = 2;
    v->heads_k = 1;
    v->seqlen_q = d->seqlen_q == 1 ? 1 : 131; /* the same phase as the timed problem */
    v->seqlen_k = 131;

    const char *problem = NULL, *path = output ? output : flashcl_tuning_file(ctx, &problem);
    flashcl_params base;
    flashcl_status st;
    if ((st = flashcl_attention_params(ctx, d, &base)) != FLASHCL_SUCCESS) {
        cli_errorf("the current parameters: %s: %s", flashcl_status_string(st), flashcl_last_error(ctx));
        goto done;
    }
    if (!variants)
        variants = !strcmp(base.variant, "nv-mma")     ? "nv-mma,portable"
                   : !strcmp(base.variant, "nv-tf32")  ? "nv-tf32,portable"
                   : !strcmp(base.variant, "nv-wgmma") ? "nv-wgmma,nv-mma"
                                                       : base.variant;
    char base_text[64], base_source[300];
    describe(&base, base_text, sizeof base_text);
    snprintf(base_source, sizeof base_source, "%s", base.source);
    printf("flashcl tune: %s\n", flashcl_context_device_name(ctx));
    printf("class: %s, head_dim %ld, %s, %s; timed on B=%ld H=%ld N=%ld; validated on B=1 H=2:1 N=131\n",
           cli_dtype_name(dtype), head_dim, causal ? "causal" : "non-causal", d->seqlen_q == 1 ? "decode" : "prefill",
           batch, heads, seqlen);
    printf("now: %s (%s)\n", base_text, base_source);
    if (!no_write && !dry_run) {
        if (!path) {
            cli_errorf("no tuning file path: set FLASHCL_TUNING_FILE or HOME, or pass --output/--no-write");
            goto done;
        }
        if (problem) {
            cli_errorf("%s\n  fix or remove it, or pass --output/--no-write", problem);
            goto done;
        }
    }

    /* The baseline first, then every space's accepted candidates. */
    base.source = NULL;
    if (add_candidate(&list, &count, &cap, &base) != 0)
        goto oom;
    list[0].baseline = 1;
    if (dry_run)
        printf("\nsearch space (%s):\n", variants);
    char copy[128];
    snprintf(copy, sizeof copy, "%s", variants);
    for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ","))
        for (size_t s = 0; s < sizeof tune_spaces / sizeof tune_spaces[0]; s++)
            if (!strcmp(tok, tune_spaces[s].variant)) {
                if (dry_run)
                    printf(" %s: BLOCK_M x BLOCK_N%s%s; rules: %s\n", tune_spaces[s].variant,
                           tune_spaces[s].extra ? " x " : "", tune_spaces[s].extra ? tune_spaces[s].extra : "",
                           tune_spaces[s].rules);
                if (enumerate(ctx, d, &tune_spaces[s], &list, &count, &cap, &pruned, dry_run) != 0)
                    goto oom;
            }
    if (dry_run) {
        printf("\n%d candidate%s (%d pruned):\n", count, count == 1 ? "" : "s", pruned);
        for (int i = 0; i < count; i++) {
            char text[64];
            describe(&list[i].p, text, sizeof text);
            printf("  %3d  %-28s%s\n", i, text, list[i].baseline ? "  (now)" : "");
        }
        rc = CLI_EXIT_OK;
        goto done;
    }
    if (setup_problem(ctx, &t) != 0)
        goto done;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    int tty = isatty(STDERR_FILENO);
    double t0 = cli_now(), best_ms = -1;
    int best = -1, done_count = 0;
    printf("%d candidates (%d pruned), budget %.0f s, %ld warm-up + %ld timed runs each\n", count, pruned,
           budget, warmup, iters);
    fflush(stdout);
    for (int i = 0; i < count; i++) {
        candidate *c = &list[i];
        char text[64];
        describe(&c->p, text, sizeof text);
        if (interrupted) {
            snprintf(c->status, sizeof c->status, "skipped (interrupted)");
            continue;
        }
        if (cli_now() - t0 > budget && !c->baseline) {
            snprintf(c->status, sizeof c->status, "skipped (budget)");
            continue;
        }
        run_candidate(ctx, &t, c);
        done_count++;
        if (c->ok && (best < 0 || c->median_ms < best_ms)) {
            best = i;
            best_ms = c->median_ms;
        }
        char line[400]; /* text (<= 160) + status (<= 200): no truncation */
        snprintf(line, sizeof line, "%s: %s", text, c->ok ? "ok" : c->status);
        if (c->ok)
            snprintf(line, sizeof line, "%s: %.3f ms", text, c->median_ms);
        progress(tty, i + 1, count, cli_now() - t0, budget, line, best_ms);
    }
    if (tty && done_count && !(count > 0 && list[count - 1].ran))
        fputc('\n', stderr);
    /* Confirmation: the three fastest and the current parameters again,
     * round-robin, so each sees the same machine; the median of the rounds
     * decides. */
    int finalists[4], nfin = 0;
    if (list[0].ok)
        finalists[nfin++] = 0;
    for (int k = 0; k < 3; k++) {
        int pick = -1;
        for (int i = 1; i < count; i++) {
            int taken = 0;
            for (int f = 0; f < nfin; f++)
                taken |= finalists[f] == i;
            if (list[i].ok && !taken && (pick < 0 || list[i].median_ms < list[pick].median_ms))
                pick = i;
        }
        if (pick >= 0)
            finalists[nfin++] = pick;
    }
    if (confirm > 0 && nfin > 1 && !interrupted) {
        double rounds[4][100];
        int complete = 1;
        fprintf(stderr, "tune: confirming %d finalists, %ld interleaved rounds\n", nfin, confirm);
        /* Each round starts with a different finalist, so none (the current parameters were
         * always first) is timed right after the same neighbour every time. */
        for (int r = 0; r < confirm && complete; r++)
            for (int j = 0; j < nfin && complete; j++) {
                int f = (r + j) % nfin;
                double mn;
                complete = time_candidate(ctx, &t, &list[finalists[f]], &rounds[f][r], &mn) == 0;
            }
        if (complete) {
            best = -1;
            for (int f = 0; f < nfin; f++) {
                candidate *c = &list[finalists[f]];
                qsort(rounds[f], (size_t)confirm, sizeof(double), cli_compare_doubles);
                c->confirmed_ms = confirm % 2 ? rounds[f][confirm / 2]
                                              : 0.5 * (rounds[f][confirm / 2 - 1] + rounds[f][confirm / 2]);
                if (best < 0 || c->confirmed_ms < list[best].confirmed_ms)
                    best = finalists[f];
            }
        } else {
            for (int f = 0; f < nfin; f++)
                snprintf(list[finalists[f]].status, sizeof list[finalists[f]].status, "ok");
            printf("confirmation interrupted: the search's times decide\n");
        }
    }
    flashcl_set_params(ctx, d, NULL);
    signal(SIGINT, SIG_DFL);

    /* The table. */
    double flops = 4.0 * d->batch * d->heads_q * (double)d->seqlen_q * d->seqlen_k * d->head_dim *
                   (causal ? 0.5 : 1.0);
    printf("\n%3s  %-28s %10s %10s %9s %8s %12s  %s\n", "#", "candidate", "median_ms", "min_ms", "TFLOP/s",
           "vs now", "confirmed_ms", "status");
    for (int i = 0; i < count; i++) {
        candidate *c = &list[i];
        char text[64];
        describe(&c->p, text, sizeof text);
        printf("%3d%c %-28s ", i, i == best ? '*' : ' ', text);
        char conf[32] = "-";
        if (c->confirmed_ms > 0)
            snprintf(conf, sizeof conf, "%.3f", c->confirmed_ms);
        if (c->ok)
            printf("%10.3f %10.3f %9.3g %7.2fx %12s  %s%s\n", c->median_ms, c->min_ms,
                   flops / (c->median_ms * 1e9), list[0].ok ? list[0].median_ms / c->median_ms : 0.0, conf,
                   c->status, c->baseline ? " (now)" : "");
        else
            printf("%10s %10s %9s %8s %12s  %s%s\n", "-", "-", "-", "-", "-", c->status,
                   c->baseline ? " (now)" : "");
    }
    if (best < 0) {
        cli_errorf("no candidate validated%s: nothing written", interrupted ? " before the interrupt" : "");
        goto done;
    }
    char best_text[64], comment[512];
    describe(&list[best].p, best_text, sizeof best_text);
    /* The speedup compares the winner and the current parameters timed the same way: both by
     * the confirmation rounds, or both by the search; with both, the search's ratio is shown too. */
    if (list[0].ok && list[best].confirmed_ms > 0 && list[0].confirmed_ms > 0)
        printf("\nwinner: %s  %.3f ms vs %.3f ms now (%s), medians of %ld interleaved rounds: %.2fx "
               "(the search's own times: %.3f vs %.3f ms, %.2fx)\n",
               best_text, list[best].confirmed_ms, list[0].confirmed_ms, base_source, confirm,
               list[0].confirmed_ms / list[best].confirmed_ms, list[best].median_ms, list[0].median_ms,
               list[0].median_ms / list[best].median_ms);
    else if (list[0].ok)
        printf("\nwinner: %s  %.3f ms vs %.3f ms now (%s): %.2fx\n", best_text, list[best].median_ms,
               list[0].median_ms, base_source, list[0].median_ms / list[best].median_ms);
    else
        printf("\nwinner: %s  %.3f ms (the current parameters failed: %s)\n", best_text, list[best].median_ms,
               list[0].status);
    if (interrupted)
        printf("interrupted: the best of the %d candidates measured\n", done_count);
    if (no_write) {
        rc = CLI_EXIT_OK;
        goto done;
    }
    int both_confirmed = list[best].confirmed_ms > 0 && list[0].confirmed_ms > 0;
    snprintf(comment, sizeof comment,
             "flashcl tune: B=%ld H=%ld N=%ld D=%ld %s%s: %.4g ms; before (%s) %s%.4g ms; %d of %d candidates "
             "run%s",
             batch, heads, seqlen, head_dim, cli_dtype_name(dtype), causal ? " causal" : "",
             both_confirmed ? list[best].confirmed_ms : list[best].median_ms, base_source,
             list[0].ok ? "" : "failed, ",
             both_confirmed ? list[0].confirmed_ms : list[0].ok ? list[0].median_ms : 0.0,
             done_count, count, both_confirmed ? ", confirmed in interleaved rounds" : "");
    st = flashcl_tuning_file_save(ctx, path, d, &list[best].p, comment);
    if (st != FLASHCL_SUCCESS) {
        cli_errorf("writing %s: %s", path, flashcl_last_error(ctx));
        goto done;
    }
    printf("wrote %s\n", path);
    /* What a fresh context reads back from that file. */
    {
        flashcl_context *check = NULL;
        flashcl_params now;
        const char *saved = getenv("FLASHCL_TUNING_FILE");
        char *restore = saved ? strdup(saved) : NULL;
        setenv("FLASHCL_TUNING_FILE", path, 1);
        if (flashcl_context_create(&check, device) == FLASHCL_SUCCESS &&
            flashcl_attention_params(check, d, &now) == FLASHCL_SUCCESS) {
            char now_text[64];
            describe(&now, now_text, sizeof now_text);
            printf("the library now picks: %s (%s)\n", now_text, now.source);
        }
        flashcl_context_destroy(check);
        if (restore)
            setenv("FLASHCL_TUNING_FILE", restore, 1);
        else
            unsetenv("FLASHCL_TUNING_FILE");
        free(restore);
    }
    rc = CLI_EXIT_OK;
    goto done;
oom:
    cli_errorf("out of memory");
done:
    free_problem(&t);
    free(list);
    flashcl_context_destroy(ctx);
    return rc;
}
