/* test_backward.c: the backward pass against host_ref's double gradients, its determinism and its errors.
 *
 * `test_backward quick`: a finite-difference check of the double reference
 * itself on tiny shapes; a small set of cases covering every dtype, odd head
 * dims, Nq != Nk both ways, causal, windows, soft-cap, GQA/MQA, strided
 * layouts, fully masked rows, both dQ modes; deterministic mode giving
 * identical bits over 50 runs; one test per invalid argument (status and
 * untouched outputs). `test_backward sweep` (label long) crosses head dims,
 * shapes, dtypes and masks. On a host context (FLASHCL_TEST_DEVICE=host) the
 * same cases run through flashcl_attention_backward_host.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

static int failures, cases;
/* `test_backward mma|wgmma K/N`: the K-th of N shards of the mode's cases (configs by index mod
 * N, the cases after them as one or two more), for N processes building kernels side by side on a GPU
 * machine's cores (`bench/h200.sh pending`). Every case runs in exactly one shard. */
static int shard_k, shard_n = 1;
static int in_shard(int i) { return i % shard_n == shard_k; }

/* ---- the finite-difference check of the reference -------------------------------- */

/* L = sum(dout * out) in double, out from the double forward (packed). */
static double loss(const flashcl_attention_desc *d, const float *q, const float *k, const float *v,
                   const float *dout, double *out) {
    flashcl_ref_attention_forward(d, q, k, v, out, NULL, NULL, NULL);
    size_t n = (size_t)d->batch * d->seqlen_q * d->heads_q * d->head_dim;
    double l = 0.0;
    for (size_t i = 0; i < n; ++i)
        l += (double)dout[i] * out[i];
    return l;
}

/* Central differences of L over every input element against the reference
 * gradient. The inputs are float32, so x +- h is rounded: the quotient uses
 * the stored difference. Truncation error is O(h^2) ~ 1e-6. */
static int fd_case(const char *name, flashcl_attention_desc d, uint64_t seed) {
    const size_t nq = (size_t)d.batch * d.seqlen_q * d.heads_q * d.head_dim;
    const size_t nk = (size_t)d.batch * d.seqlen_k * d.heads_k * d.head_dim;
    float *x[4] = {malloc(nq * 4), malloc(nk * 4), malloc(nk * 4), malloc(nq * 4)}; /* q k v dout */
    double *g[3] = {malloc(nq * 8), malloc(nk * 8), malloc(nk * 8)};
    double *out = malloc(nq * 8);
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    for (int t = 0; t < 4; ++t)
        flashcl_ref_fill_normal(&rng, x[t], FLASHCL_FLOAT32, t == 0 || t == 3 ? nq : nk, 1.0);
    flashcl_ref_attention_backward(&d, x[0], x[1], x[2], x[3], NULL, g[0], g[1], g[2]);
    double worst = 0.0;
    int ok = 1;
    for (int t = 0; t < 3; ++t) {
        size_t n = t == 0 ? nq : nk;
        for (size_t i = 0; i < n; ++i) {
            const float x0 = x[t][i], h = 1e-3f;
            x[t][i] = x0 + h;
            const float up = x[t][i];
            double lu = loss(&d, x[0], x[1], x[2], x[3], out);
            x[t][i] = x0 - h;
            const float down = x[t][i];
            double ld = loss(&d, x[0], x[1], x[2], x[3], out);
            x[t][i] = x0;
            double fd = (lu - ld) / ((double)up - (double)down);
            double e = fabs(fd - g[t][i]);
            worst = fmax(worst, e);
            if (!(e <= 1e-5 + 1e-4 * fabs(g[t][i]))) {
                if (ok)
                    printf("  %s: d%s[%zu]: finite difference %.9g, reference %.9g\n", name,
                           t == 0 ? "q" : t == 1 ? "k" : "v", i, fd, g[t][i]);
                ok = 0;
            }
        }
    }
    char what[120];
    snprintf(what, sizeof what, "reference vs finite differences: %s (max err %.2g)", name, worst);
    expect(ok, what, &failures);
    for (int t = 0; t < 4; ++t)
        free(x[t]);
    for (int t = 0; t < 3; ++t)
        free(g[t]);
    free(out);
    return ok;
}

static void fd_checks(uint64_t seed) {
    flashcl_attention_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = FLASHCL_FLOAT32;
    d.batch = 1;
    d.heads_q = d.heads_k = 1;
    d.seqlen_q = 3;
    d.seqlen_k = 4;
    d.head_dim = 3;
    fd_case("1x3x4 D3", d, seed);
    d.causal = 1;
    d.seqlen_q = 5; /* Nq > Nk: the first row sees no key */
    fd_case("causal 5x4 D3", d, seed + 1);
    d.causal = 0;
    d.softcap = 2.0f;
    d.scale = 0.9f;
    d.seqlen_q = 2;
    fd_case("softcap 2x4 D3", d, seed + 2);
    d.softcap = 0.0f;
    d.scale = 0.0f;
    d.heads_q = 4;
    d.heads_k = 2;
    d.windowed = 1;
    d.window_left = 1;
    d.window_right = 0;
    d.seqlen_q = 4;
    d.seqlen_k = 3;
    d.head_dim = 2;
    fd_case("GQA 4:2 window(1,0) 4x3 D2", d, seed + 3);
}

/* The gradient check itself (flashcl_ref_check_backward): the exact
 * gradients rounded to the dtype pass; one element moved by twice the
 * tolerance, or made NaN, fails. Its tolerance carries what storing out
 * costs any kernel (D_i read from out in the dtype), which at D=1 under a
 * soft-cap (nothing averages D_i's rounding) had been left to chance: one
 * run in six of the sweep's f16 D=1 case failed with a correct kernel,
 * whose dK differed from the exact one by about that much (1.1e-3 against a
 * tolerance of 8.2e-4). */
static void checker_case(const char *what, flashcl_attention_desc d, uint64_t seed) {
    ++cases;
    const int B = d.batch, Nq = d.seqlen_q, Nk = d.seqlen_k, D = d.head_dim;
    const size_t n[3] = {(size_t)B * Nq * d.heads_q * D, (size_t)B * Nk * d.heads_k * D,
                         (size_t)B * Nk * d.heads_k * D};
    const size_t es = flashcl_dtype_size(d.dtype);
    void *x[4], *grad[3];
    double *exact[3];
    int ok = 1;
    for (int t = 0; t < 3; ++t) {
        ok = ok && (x[t] = malloc(n[t] * es)) && (grad[t] = malloc(n[t] * es)) &&
             (exact[t] = malloc(n[t] * sizeof(double)));
    }
    ok = ok && (x[3] = malloc(n[0] * es));
    if (!ok) {
        printf("checker %s: out of host memory\n", what);
        ++failures;
        return; /* a test process: the allocations go with it */
    }
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    for (int t = 0; t < 4; ++t)
        flashcl_ref_fill_normal(&rng, x[t], d.dtype, n[t < 3 ? t : 0], t < 2 ? 2.0 : 1.0);
    flashcl_attention_desc r = d;
    flashcl_attention_desc_resolve(&r);
    flashcl_ref_attention_backward(&r, x[0], x[1], x[2], x[3], NULL, exact[0], exact[1], exact[2]);
    for (int t = 0; t < 3; ++t)
        for (size_t e = 0; e < n[t]; ++e)
            flashcl_ref_store(grad[t], d.dtype, e, exact[t][e]);
    flashcl_ref_grad_report rep;
    const int rounded_ok = flashcl_ref_check_backward(&r, NULL, x[0], x[1], x[2], x[3], grad[0], grad[1], grad[2], 0,
                                                      &rep);
    /* dk's element 0, moved by twice the tolerance: fails; then NaN: fails. */
    const double tol = rep.tolerance[1], keep = flashcl_ref_load(grad[1], d.dtype, 0);
    flashcl_ref_store(grad[1], d.dtype, 0, keep + 2.0 * tol + 2.0 * fabs(keep) * flashcl_ref_epsilon(d.dtype));
    const int moved_fails = !flashcl_ref_check_backward(&r, NULL, x[0], x[1], x[2], x[3], grad[0], grad[1], grad[2], 0,
                                                        NULL);
    flashcl_ref_store(grad[1], d.dtype, 0, NAN);
    const int nan_fails = !flashcl_ref_check_backward(&r, NULL, x[0], x[1], x[2], x[3], grad[0], grad[1], grad[2], 0,
                                                      NULL);
    /* In a 16-bit dtype, out's rounding moves the gradients: never by nothing. */
    const int stored_seen = d.dtype == FLASHCL_FLOAT32 || rep.stored_out_err[1] > 0.0;
    ok = rounded_ok && moved_fails && nan_fails && stored_seen;
    printf("checker %-44s stored-out err dq %.2g dk %.2g dv %.2g, tol dk %.2g: %s\n", what, rep.stored_out_err[0],
           rep.stored_out_err[1], rep.stored_out_err[2], tol, ok ? "ok" : "FAILED");
    if (!ok)
        ++failures;
    for (int t = 0; t < 3; ++t) {
        free(x[t]);
        free(grad[t]);
        free(exact[t]);
    }
    free(x[3]);
}

static void checker_checks(uint64_t seed) {
    /* First the sweep's case that had failed: f16, D=1, causal, soft-cap. */
    flashcl_attention_desc d = {.dtype = FLASHCL_FLOAT16, .batch = 1, .heads_q = 2, .heads_k = 2, .seqlen_q = 108,
                                .seqlen_k = 256, .head_dim = 1, .causal = 1, .softcap = 20.0f};
    checker_case("f16 108x256 D1 causal softcap", d, seed + 11);
    d.dtype = FLASHCL_BFLOAT16;
    d.softcap = 0.0f;
    d.head_dim = 64;
    d.heads_k = 1;
    checker_case("bf16 108x256 D64 causal GQA 2:1", d, seed + 12);
    d.dtype = FLASHCL_FLOAT32;
    d.causal = 0;
    d.head_dim = 33;
    checker_case("f32 108x256 D33", d, seed + 13);
}

/* ---- device (or host-path) runs ---------------------------------------------------------- */

typedef struct run_buffers {
    flashcl_attention_desc d;  /* as the case lays it out (unresolved) */
    flashcl_backward_options o;
    size_t elems[4], lse_count;
    void *host[4], *dout, *grad[3];
    float *lse;
} run_buffers;

static const size_t lse_pad = 5; /* the device runs put LSE at a nonzero offset */

static int setup(run_buffers *rb, const test_case *tc, uint64_t seed) {
    memset(rb, 0, sizeof *rb);
    case_desc(tc, &rb->d, rb->elems);
    rb->o.dout = rb->d.out;
    rb->o.dq = rb->d.q;
    rb->o.dk = rb->d.k;
    rb->o.dv = rb->d.v;
    const size_t es = flashcl_dtype_size(tc->dtype);
    rb->lse_count = (size_t)tc->batch * tc->heads_q * tc->seqlen_q;
    for (int i = 0; i < 4; ++i)
        rb->host[i] = malloc(rb->elems[i] * es);
    rb->dout = malloc(rb->elems[3] * es);
    for (int i = 0; i < 3; ++i)
        rb->grad[i] = malloc(rb->elems[i] * es);
    rb->lse = malloc((rb->lse_count + lse_pad) * sizeof(float));
    if (!rb->host[0] || !rb->host[1] || !rb->host[2] || !rb->host[3] || !rb->dout || !rb->grad[0] ||
        !rb->grad[1] || !rb->grad[2] || !rb->lse)
        return 0;
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    double sd = tc->input_scale > 0 ? tc->input_scale : 1.0;
    for (int i = 0; i < 3; ++i)
        flashcl_ref_fill_normal(&rng, rb->host[i], tc->dtype, rb->elems[i], i < 2 ? sd : 1.0);
    flashcl_ref_fill_normal(&rng, rb->dout, tc->dtype, rb->elems[3], 1.0);
    return 1;
}

static void teardown(run_buffers *rb) {
    for (int i = 0; i < 4; ++i)
        free(rb->host[i]);
    free(rb->dout);
    for (int i = 0; i < 3; ++i)
        free(rb->grad[i]);
    free(rb->lse);
}

static void poison_grads(run_buffers *rb, flashcl_dtype dt) {
    for (int i = 0; i < 3; ++i)
        flashcl_ref_poison(rb->grad[i], dt, rb->elems[i]);
}

static cl_mem make_buffer(flashcl_context *ctx, size_t bytes, void *init) {
    cl_int err;
    return clCreateBuffer(flashcl_context_cl_context(ctx),
                          CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), bytes, init, &err);
}

/* Forward (for out and LSE), then backward into rb->grad. On a host context
 * both go through the *_host functions. */
static flashcl_status run_backward(flashcl_context *ctx, run_buffers *rb, int deterministic) {
    const size_t es = flashcl_dtype_size(rb->d.dtype);
    rb->o.deterministic = deterministic;
    if (flashcl_context_is_host(ctx)) {
        flashcl_status st =
            flashcl_attention_forward_host(ctx, &rb->d, rb->host[0], rb->host[1], rb->host[2], rb->host[3], rb->lse);
        return st ? st
                  : flashcl_attention_backward_host(ctx, &rb->d, &rb->o, rb->host[0], rb->host[1], rb->host[2],
                                                    rb->host[3], rb->dout, rb->lse, rb->grad[0], rb->grad[1],
                                                    rb->grad[2]);
    }
    cl_command_queue queue = flashcl_context_cl_queue(ctx);
    size_t scratch_bytes = 0;
    flashcl_status st = flashcl_attention_backward_scratch_size(ctx, &rb->d, &rb->o, &scratch_bytes);
    if (st)
        return st;
    cl_mem b[10] = {0};
    for (int i = 0; i < 4; ++i)
        b[i] = make_buffer(ctx, rb->elems[i] * es, rb->host[i]);
    b[4] = make_buffer(ctx, rb->elems[3] * es, rb->dout);
    for (int i = 0; i < 3; ++i)
        b[5 + i] = make_buffer(ctx, rb->elems[i] * es, rb->grad[i]);
    b[8] = make_buffer(ctx, (rb->lse_count + lse_pad) * sizeof(float), NULL);
    b[9] = make_buffer(ctx, scratch_bytes, NULL);
    st = FLASHCL_SUCCESS;
    for (int i = 0; i < 10; ++i)
        if (!b[i])
            st = CL_OUT_OF_RESOURCES;
    if (!st)
        st = flashcl_attention_forward(ctx, &rb->d, b[0], b[1], b[2], b[3], b[8], lse_pad, NULL);
    cl_event ev = NULL;
    if (!st)
        st = flashcl_attention_backward(ctx, &rb->d, &rb->o, b[0], b[1], b[2], b[3], b[4], b[8], lse_pad,
                                        b[5], b[6], b[7], b[9], &ev);
    if (!st) {
        clWaitForEvents(1, &ev);
        clReleaseEvent(ev);
        for (int i = 0; i < 3; ++i)
            clEnqueueReadBuffer(queue, b[5 + i], CL_TRUE, 0, rb->elems[i] * es, rb->grad[i], 0, NULL, NULL);
        clEnqueueReadBuffer(queue, b[3], CL_TRUE, 0, rb->elems[3] * es, rb->host[3], 0, NULL, NULL);
    }
    for (int i = 0; i < 10; ++i)
        if (b[i])
            clReleaseMemObject(b[i]);
    return st;
}

static void describe(const test_case *tc, int deterministic, char *buf, size_t cap) {
    static const char *dtypes[] = {"f32", "f16", "bf16"};
    snprintf(buf, cap, "%s B%d Hq%d Hk%d Nq%d Nk%d D%d%s win(%d,%d)%s%s%s", dtypes[tc->dtype], tc->batch,
             tc->heads_q, tc->heads_k, tc->seqlen_q, tc->seqlen_k, tc->head_dim, tc->causal ? " causal" : "",
             tc->window_left, tc->window_right, tc->softcap > 0 ? " softcap" : "",
             tc->layout == LAYOUT_BHSD ? " bhsd" : tc->layout == LAYOUT_PADDED ? " padded" : "",
             deterministic ? " det" : "");
}

static void run(flashcl_context *ctx, test_case tc, int deterministic) {
    ++cases;
    char name[200];
    describe(&tc, deterministic, name, sizeof name);
    run_buffers rb;
    int ok = 0;
    if (!setup(&rb, &tc, test_seed() + (uint64_t)cases * 7919u)) {
        printf("%s: out of host memory\n", name);
    } else {
        poison_grads(&rb, tc.dtype);
        flashcl_status st = run_backward(ctx, &rb, deterministic);
        if (st) {
            printf("%s: FAILED: %s: %s\n", name, flashcl_status_string(st), flashcl_last_error(ctx));
        } else {
            flashcl_attention_desc_resolve(&rb.d);
            flashcl_ref_grad_report rep;
            ok = flashcl_ref_check_backward(&rb.d, &rb.o, rb.host[0], rb.host[1], rb.host[2], rb.dout,
                                            rb.grad[0], rb.grad[1], rb.grad[2], 1, &rep);
            printf("%-62s err/tol dq %.2g/%.2g dk %.2g/%.2g dv %.2g/%.2g %s\n", name, rep.max_err[0],
                   rep.tolerance[0], rep.max_err[1], rep.tolerance[1], rep.max_err[2], rep.tolerance[2],
                   ok ? "ok" : "FAILED");
        }
    }
    teardown(&rb);
    if (!ok)
        ++failures;
}

/* Runs tc under FLASHCL_BWD_PARAMS=env (device contexts only). */
static void run_with(flashcl_context *ctx, const test_case *tc, int deterministic, const char *env) {
    if (flashcl_context_is_host(ctx))
        return;
    if (strstr(env, "VARIANT=cpu") && strstr(flashcl_context_device_name(ctx), "rusticl")) {
        /* The cpu kernels are refused there (src/internal.h, FLASHCL_RUSTICL_NO_CPU). */
        setenv("FLASHCL_BWD_PARAMS", env, 1);
        flashcl_attention_desc d;
        size_t elems[4], most = 0;
        case_desc(tc, &d, elems);
        for (int i = 0; i < 4; ++i)
            most = elems[i] > most ? elems[i] : most;
        void *t[8];
        for (int i = 0; i < 8; ++i) /* q, k, v, out, dout, dq, dk, dv: zeros are fine */
            t[i] = calloc(most, 4);
        float *lse = calloc((size_t)d.batch * d.heads_q * d.seqlen_q, sizeof(float));
        flashcl_status st = flashcl_attention_backward_host(ctx, &d, NULL, t[0], t[1], t[2], t[3], t[4], lse, t[5],
                                                            t[6], t[7]);
        char what[160];
        snprintf(what, sizeof what, "FLASHCL_BWD_PARAMS=%s refused on rusticl", env);
        expect(st == FLASHCL_ERROR_INVALID_PARAMS && strstr(flashcl_last_error(ctx), "rusticl"), what, &failures);
        for (int i = 0; i < 8; ++i)
            free(t[i]);
        free(lse);
        unsetenv("FLASHCL_BWD_PARAMS");
        return;
    }
    printf("FLASHCL_BWD_PARAMS=%s:\n", env);
    setenv("FLASHCL_BWD_PARAMS", env, 1);
    run(ctx, *tc, deterministic);
    unsetenv("FLASHCL_BWD_PARAMS");
}

#ifdef FLASHCL_SOURCE_CL_DIR
/* Copies cl/<name> into dir; 0 on any failure. */
/* A variant's source missing (FLASHCL_KERNEL_DIR holding the forward's and
 * backward's files but that one): its build fails, and the backward falls
 * back to the portable kernels, still right. env: FLASHCL_BWD_PARAMS, with
 * tiles of its own so no kernel built earlier in this process answers from
 * the in-memory cache (NULL: the table's choice). */
static void build_failure(flashcl_context *ctx, const char *missing, test_case tc, const char *env) {
    static const char *const all[] = {"flash_fwd.cl", "flash_fwd_cpu.cl", "flash_fwd_nv.cl", "flash_bwd.cl",
                                      "flash_bwd_cpu.cl", "flash_bwd_nv.cl", "flash_bwd_sm90.cl"};
    const char *files[COUNT(all)];
    int count = 0;
    char dir[] = "/tmp/flashcl-bwd-fallback-XXXXXX";
    if (flashcl_context_is_host(ctx))
        return;
    for (int i = 0; i < COUNT(all); ++i)
        if (strcmp(all[i], missing) != 0)
            files[count++] = all[i];
    if (test_kernel_dir(dir, FLASHCL_SOURCE_CL_DIR, files, count)) {
        printf("FLASHCL_KERNEL_DIR without %s:\n", missing);
        setenv("FLASHCL_KERNEL_DIR", dir, 1);
        if (env)
            run_with(ctx, &tc, 1, env);
        else
            run(ctx, tc, 0);
        unsetenv("FLASHCL_KERNEL_DIR");
    } else {
        expect(0, "build failure: setting up the source directory", &failures);
    }
    test_kernel_dir_remove(dir);
}

static void cpu_build_failure(flashcl_context *ctx) {
    test_case tc = test_case_basic(FLASHCL_FLOAT32, 37, 53, 16);
    tc.causal = 1;
    build_failure(ctx, "flash_bwd_cpu.cl", tc, "VARIANT=cpu,BLOCK_M=8,BLOCK_N=16,WG=16");
}
#endif

/* Kernel builds dominate on PoCL: the quick set uses three (dtype, head_dim)
 * pairs, f32/16, f16/59 and bf16/59, plus D=1. The table's kernel variant
 * runs every case; VARIANT= runs a few on the other one too (cl/flash_bwd.cl
 * and cl/flash_bwd_cpu.cl, whichever the device's default is not), with
 * tiles of their own so both see several key and query blocks. */
static void quick(flashcl_context *ctx) {
    test_case tc = test_case_basic(FLASHCL_FLOAT32, 37, 53, 16);
    run(ctx, tc, 0);
    run(ctx, tc, 1);
    run_with(ctx, &tc, 1, "VARIANT=portable,BLOCK_M=8,BLOCK_N=4,WG=32");
    run_with(ctx, &tc, 1, "VARIANT=cpu,BLOCK_M=8,BLOCK_N=8");
    /* the cpu kernel's two ways to sum dQ outside deterministic mode, over 7 key blocks */
    run_with(ctx, &tc, 0, "VARIANT=cpu,BLOCK_M=8,BLOCK_N=8,DQ=owner");
    run_with(ctx, &tc, 0, "VARIANT=cpu,BLOCK_M=8,BLOCK_N=8,DQ=atomic");
    tc.softcap = 30.0f; /* large scores, where the cap bends: its derivative matters */
    tc.input_scale = 4.0;
    tc.seqlen_q = 64;
    tc.seqlen_k = 96;
    run(ctx, tc, 0);
    tc = test_case_basic(FLASHCL_FLOAT32, 45, 45, 16); /* MQA through strides */
    tc.heads_q = 4;
    tc.causal = 1;
    tc.layout = LAYOUT_BHSD;
    run(ctx, tc, 1);

    tc = test_case_basic(FLASHCL_FLOAT16, 77, 131, 59); /* GQA, odd head dim, Nq < Nk */
    tc.batch = 2;
    tc.heads_q = 6;
    tc.heads_k = 2;
    tc.causal = 1;
    run(ctx, tc, 0);
    run_with(ctx, &tc, 0, "VARIANT=portable");
    run_with(ctx, &tc, 0, "VARIANT=cpu");
    run_with(ctx, &tc, 0, "VARIANT=cpu,BLOCK_N=8,DQ=owner"); /* GQA 3: one work-item, three heads' dQ */
    run_with(ctx, &tc, 0, "VARIANT=cpu,BLOCK_N=8,DQ=atomic");
    tc.causal = 0;
    tc.window_left = 17;
    tc.window_right = 5;
    run(ctx, tc, 1);
    tc = test_case_basic(FLASHCL_FLOAT16, 50, 40, 59);
    tc.layout = LAYOUT_PADDED;
    tc.scale = 0.3f;
    run(ctx, tc, 1);

    tc = test_case_basic(FLASHCL_BFLOAT16, 131, 77, 59); /* Nq > Nk causal: 54 rows see no key */
    tc.heads_q = 3;
    tc.causal = 1;
    run(ctx, tc, 0);
    tc.causal = 0;
    tc.window_left = 0; /* diagonal only, fully masked rows too */
    tc.window_right = 0;
    run(ctx, tc, 0);

    tc = test_case_basic(FLASHCL_FLOAT32, 1, 1, 1);
    run(ctx, tc, 0);
}

static const int head_dims[] = {1, 8, 32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256};
static const int seqlens[][2] = {{1, 239}, {3, 799}, {113, 203}, {128, 217}, {108, 256},
                                 {256, 512}, {512, 256}, {1023, 1024}};

static void sweep(flashcl_context *ctx) {
    for (int i = 0; i < COUNT(head_dims); ++i)
        for (int s = 0; s < COUNT(seqlens); ++s)
            for (int causal = 0; causal < 2; ++causal) {
                test_case tc = test_case_basic((flashcl_dtype)((i + s) % 3), seqlens[s][0], seqlens[s][1], head_dims[i]);
                tc.causal = causal;
                tc.batch = 1 + (s & 1);
                tc.heads_q = 2 + 2 * (i & 1);
                tc.heads_k = (i & 2) ? 1 : tc.heads_q;
                if (s == 2) {
                    tc.window_left = 31;
                    tc.window_right = 7;
                }
                if (s == 4)
                    tc.softcap = 20.0f;
                run(ctx, tc, (i + s + causal) & 1);
            }
}

/* ---- the tensor-core kernels (NVIDIA sm_80+ only) --------------------------------------------- */

/* Whether FLASHCL_BWD_PARAMS=env (a VARIANT) is accepted here: a tiny f16 run at head_dim d. */
static int nv_variant_available(flashcl_context *ctx, const char *env, int d) {
    test_case tc = test_case_basic(FLASHCL_FLOAT16, 3, 5, d);
    run_buffers rb;
    if (flashcl_context_is_host(ctx))
        return 0;
    setenv("FLASHCL_BWD_PARAMS", env, 1);
    const int ok = setup(&rb, &tc, 1) && run_backward(ctx, &rb, 0) == FLASHCL_SUCCESS;
    unsetenv("FLASHCL_BWD_PARAMS");
    teardown(&rb);
    return ok;
}

/* The shapes every forced tile configuration (the i-th of its list, head_dim
 * d, FLASHCL_BWD_PARAMS=env) runs: Nq < Nk with GQA 2, causal (deterministic
 * for odd i) and not; Nq > Nk causal with MQA (53 rows see no key), in the
 * padded or the [batch][heads][seqlen][head_dim] layout. */
static void run_config_shapes(flashcl_context *ctx, int i, int d, const char *env) {
    const flashcl_dtype dt = i % 2 ? FLASHCL_BFLOAT16 : FLASHCL_FLOAT16;
    test_case tc = test_case_basic(dt, 200, 333, d);
    tc.batch = 2;
    tc.heads_q = 4;
    tc.heads_k = 2;
    tc.causal = 1;
    run_with(ctx, &tc, i % 2, env);
    tc.causal = 0;
    run_with(ctx, &tc, 0, env);
    tc = test_case_basic(dt, 150, 97, d);
    tc.heads_q = 3;
    tc.heads_k = 1;
    tc.causal = 1;
    tc.layout = i % 2 ? LAYOUT_BHSD : LAYOUT_PADDED;
    run_with(ctx, &tc, 0, env);
}

/* `test_backward mma`: cl/flash_bwd_nv.cl forced, over the head dims, tiles
 * (both stage counts of each kernel), masks and layouts it handles; its
 * build failure falling back. Skips (passing) where nv-mma does not apply. */
static void mma(flashcl_context *ctx) {
    if (!nv_variant_available(ctx, "VARIANT=nv-mma", 16)) {
        printf("nv-mma backward does not apply to this device: skipped (%s)\n", flashcl_last_error(ctx));
        return;
    }
    static const struct {
        int d;
        const char *env;
    } configs[] = {
        {64, "VARIANT=nv-mma"},                               /* the table's tiles: one Q/dO stage */
        {64, "VARIANT=nv-mma,WG=64,BLOCK_M=32,BLOCK_N=16"},   /* two Q/dO stages, 32 keys per group */
        {32, "VARIANT=nv-mma,WG=32,BLOCK_M=16,BLOCK_N=32"},   /* one warp */
        {59, "VARIANT=nv-mma"},                               /* padded head dim */
        {80, "VARIANT=nv-mma,WG=128,BLOCK_M=16,BLOCK_N=32"},
        {96, "VARIANT=nv-mma,WG=64,BLOCK_M=32,BLOCK_N=32"},
        {128, "VARIANT=nv-mma"},                              /* the table's tiles: two K/V stages */
        {128, "VARIANT=nv-mma,WG=64,BLOCK_M=16,BLOCK_N=64"},  /* two Q/dO stages, one K/V stage */
        {64, "VARIANT=nv-mma,DQ=atomic"},                     /* dQ by red.add from the dK/dV kernel */
        {59, "VARIANT=nv-mma,DQ=atomic,WG=64,BLOCK_M=16"},
        {128, "VARIANT=nv-mma,DQ=atomic"},
        {96, "VARIANT=nv-mma,DQ=atomic,WG=128,BLOCK_M=32"},
    };
    for (int i = 0; i < COUNT(configs); ++i)
        if (in_shard(i))
            run_config_shapes(ctx, i, configs[i].d, configs[i].env);
    if (!in_shard(COUNT(configs)))
        return;
    /* More (batch, head) pairs than one chunk of the longest-first order:
     * 3 x 3 kv heads for dK/dV (a whole chunk and one of 1), 3 x 6 query
     * heads for dQ; causal, then a window bounded on the right only. */
    test_case tc = test_case_many_heads(FLASHCL_FLOAT16, 300, 333, 64, 3, -1);
    run_with(ctx, &tc, 0, "VARIANT=nv-mma");
    tc = test_case_many_heads(FLASHCL_BFLOAT16, 300, 283, 128, 3, 7);
    run_with(ctx, &tc, 1, "VARIANT=nv-mma");
    tc = test_case_basic(FLASHCL_FLOAT16, 300, 300, 64);
    tc.window_left = 40; /* windows: tiles masked on both edges, and skipped */
    tc.window_right = 9;
    run_with(ctx, &tc, 0, "VARIANT=nv-mma");
    tc.window_left = 0;
    tc.window_right = 0; /* the diagonal only */
    run_with(ctx, &tc, 1, "VARIANT=nv-mma,WG=64,BLOCK_M=32,BLOCK_N=16");
    tc = test_case_basic(FLASHCL_BFLOAT16, 64, 96, 128);
    tc.softcap = 30.0f; /* the soft-cap's derivative */
    tc.input_scale = 4.0;
    run_with(ctx, &tc, 0, "VARIANT=nv-mma");
    tc = test_case_basic(FLASHCL_FLOAT16, 1, 1000, 128); /* one query row */
    run_with(ctx, &tc, 0, "VARIANT=nv-mma");
    run_with(ctx, &tc, 0, "VARIANT=nv-mma,DQ=atomic");
    tc = test_case_basic(FLASHCL_FLOAT16, 1000, 1, 64); /* one key */
    tc.causal = 1;
    run_with(ctx, &tc, 0, "VARIANT=nv-mma");
    run_with(ctx, &tc, 0, "VARIANT=nv-mma,DQ=atomic");
    tc = test_case_basic(FLASHCL_FLOAT16, 300, 300, 64);
    tc.window_left = 40;
    tc.window_right = 9;
    run_with(ctx, &tc, 0, "VARIANT=nv-mma,DQ=atomic,WG=64,BLOCK_M=32");
#ifdef FLASHCL_SOURCE_CL_DIR
    tc = test_case_basic(FLASHCL_FLOAT16, 37, 53, 48); /* a head dim no case above built */
    tc.causal = 1;
    build_failure(ctx, "flash_bwd_nv.cl", tc, NULL);
#endif
}

/* `test_backward wgmma`: cl/flash_bwd_sm90.cl forced, over its head dims (32..128,
 * padded to 64s), tiles (one or two warpgroups, 16-, 32- and 64-row tiles),
 * masks, windows, soft-cap, GQA and MQA, layouts (the padded one takes the
 * plain-load path), one row, one key. Skips (passing) where nv-wgmma
 * does not apply (no compute capability 9.0, or a driver without sm_90a). */
static int builds_failed; /* log lines of a kernel that did not build (wgmma's shapes must all build) */
static void count_build_failures(void *user, const char *line) {
    (void)user;
    if (strstr(line, "did not build"))
        ++builds_failed, printf("  log: %s\n", line);
}

static void wgmma(flashcl_context *ctx) {
    const char *env = "VARIANT=nv-wgmma";
    /* A kernel with TMA copies that does not build falls back to its cp.async twin, right but
     * untested, and turns TMA off for the context: every kernel from here on, the probe's too,
     * must build as asked. */
    builds_failed = 0;
    flashcl_set_log(count_build_failures, NULL);
    if (!nv_variant_available(ctx, env, 64)) {
        flashcl_set_log(NULL, NULL);
        printf("nv-wgmma backward does not apply to this device: skipped (%s)\n", flashcl_last_error(ctx));
        return;
    }
    static const struct {
        int d;
        const char *env;
    } configs[] = {
        {64, "VARIANT=nv-wgmma"},                         /* the table's tiles: 32 rows, two stages */
        {32, "VARIANT=nv-wgmma,BLOCK_M=64,BLOCK_N=64"},   /* 64-row tiles, one stage */
        {59, "VARIANT=nv-wgmma"},                         /* padded head dims */
        {40, "VARIANT=nv-wgmma,BLOCK_M=64"},
        {48, "VARIANT=nv-wgmma,BLOCK_N=64"},
        {64, "VARIANT=nv-wgmma,BLOCK_M=64,BLOCK_N=64"},
        {64, "VARIANT=nv-wgmma,DQ=atomic"},               /* dQ = dS K inside the dK/dV kernel */
        {40, "VARIANT=nv-wgmma,DQ=atomic,BLOCK_M=64"},    /* 64-row tiles, padded head dims */
        /* two warpgroups, 128 keys (rows) a work-group: 16-row tiles in two stages (TMA), 32-row in one */
        {64, "VARIANT=nv-wgmma,WG=256,BLOCK_M=16,BLOCK_N=16"},
        {40, "VARIANT=nv-wgmma,WG=256"},
        {59, "VARIANT=nv-wgmma,WG=256,BLOCK_M=16,BLOCK_N=32"},
        {48, "VARIANT=nv-wgmma,BLOCK_M=16,BLOCK_N=16"},   /* one warpgroup, 16-row tiles */
        {64, "VARIANT=nv-wgmma,STAGES=3"},                /* a ring of three TMA stages */
        {48, "VARIANT=nv-wgmma,WG=256,BLOCK_M=16,BLOCK_N=16,STAGES=3"}, /* rows of 16-byte multiples: TMA */
        {40, "VARIANT=nv-wgmma,BLOCK_M=16,BLOCK_N=16,STAGES=4"},
        {64, "VARIANT=nv-wgmma,WG=256,BLOCK_M=16,BLOCK_N=16,DQ=atomic"}, /* one red per 128 keys */
        {128, "VARIANT=nv-wgmma,DQ=atomic"},              /* the dQ product once a 64-dim panel */
        {64, "VARIANT=nv-wgmma,OWN_REGS=1,STAGES=4"},     /* K, V (Q, dO) held: four TMA stages */
        {48, "VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=64,BLOCK_N=64"}, /* two 64-row stages */
        {40, "VARIANT=nv-wgmma,WG=256,OWN_REGS=1"},
        /* head dims 65..128 without the held fragments: two 64-dim panels, SS score products, one
         * stage of 16 rows */
        {128, "VARIANT=nv-wgmma,OWN_REGS=0"},
        {96, "VARIANT=nv-wgmma,OWN_REGS=0"},
        {80, "VARIANT=nv-wgmma,OWN_REGS=0,BLOCK_M=16,BLOCK_N=16"}, /* padded to two panels */
        /* ... with K and V (Q and dO) held as register A operands (OWN_REGS; the table's choice at
         * head dims 65..128): the own block's 32 KB taken by two stages of 32-row tiles, or five of
         * 16 rows; 80 and 72 a second panel of 16 or 8 dims */
        {128, "VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=32,BLOCK_N=32"},
        {96, "VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=32,BLOCK_N=32"},
        {112, "VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=16,BLOCK_N=16,STAGES=5"},
        {80, "VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=32,BLOCK_N=32"},
        {72, "VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=32,BLOCK_N=32"},
        /* the held dQ pass uncapped (the default caps it at 168 registers: three work-groups an
         * SM, 3-5 % faster backwards on the H200, 92 bytes of spill at D=128) */
        {128, "VARIANT=nv-wgmma,DQ_MAXNREG=0"},
        {80, "VARIANT=nv-wgmma,DQ_MAXNREG=0"},
        /* the table's held default at head dims not a multiple of 8 (rows not 16-byte aligned: no
         * TMA; the second panel mostly padding) */
        {77, "VARIANT=nv-wgmma"},
        {100, "VARIANT=nv-wgmma"},
    };
    for (int i = 0; i < COUNT(configs); ++i)
        if (in_shard(i))
            run_config_shapes(ctx, i, configs[i].d, configs[i].env);
    /* Where the CUDA driver encodes tensor maps, the table's tiles (32 rows,
     * two stages) come by TMA wherever the tensors' strides allow (above);
     * their cp.async copies, which the host falls back to, once more. */
    if (in_shard(COUNT(configs))) {
        setenv("FLASHCL_TMA", "0", 1);
        run_config_shapes(ctx, 0, 64, env);
        run_config_shapes(ctx, 1, 40, env);
        run_config_shapes(ctx, 2, 59, "VARIANT=nv-wgmma,DQ=atomic");
        run_config_shapes(ctx, 3, 64, "VARIANT=nv-wgmma,WG=256,BLOCK_M=16,BLOCK_N=16");
        run_config_shapes(ctx, 4, 128, "VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=32,BLOCK_N=32");
        unsetenv("FLASHCL_TMA");
    }
    if (!in_shard(COUNT(configs) + 1)) {
        flashcl_set_log(NULL, NULL);
        expect(builds_failed == 0, "nv-wgmma: every kernel above built as asked (no fallback)", &failures);
        return;
    }
    test_case tc = test_case_many_heads(FLASHCL_FLOAT16, 300, 333, 64, 3, -1);
    run_with(ctx, &tc, 0, env);
    tc = test_case_many_heads(FLASHCL_BFLOAT16, 300, 283, 48, 3, 7);
    run_with(ctx, &tc, 1, env);
    tc = test_case_basic(FLASHCL_FLOAT16, 300, 300, 64);
    tc.window_left = 40; /* windows: tiles masked on both edges, and skipped */
    tc.window_right = 9;
    run_with(ctx, &tc, 0, env);
    tc.window_left = 0;
    tc.window_right = 0; /* the diagonal only */
    run_with(ctx, &tc, 1, env);
    tc = test_case_basic(FLASHCL_BFLOAT16, 64, 96, 64);
    tc.softcap = 30.0f; /* the soft-cap's derivative */
    tc.input_scale = 4.0;
    run_with(ctx, &tc, 0, env);
    run_with(ctx, &tc, 0, "VARIANT=nv-wgmma,DQ=atomic");
    tc = test_case_basic(FLASHCL_FLOAT16, 1, 1000, 64); /* one query row */
    run_with(ctx, &tc, 0, env);
    run_with(ctx, &tc, 0, "VARIANT=nv-wgmma,DQ=atomic");
    tc = test_case_basic(FLASHCL_FLOAT16, 1000, 1, 32); /* one key */
    tc.causal = 1;
    run_with(ctx, &tc, 0, env);
    run_with(ctx, &tc, 0, "VARIANT=nv-wgmma,DQ=atomic");
    tc = test_case_basic(FLASHCL_BFLOAT16, 1024, 1024, 64); /* whole tiles only, many of them */
    tc.heads_q = 8;
    tc.heads_k = 2;
    tc.causal = 1;
    run_with(ctx, &tc, 1, env);
    run_with(ctx, &tc, 1, "VARIANT=nv-wgmma,DQ=atomic");
    tc.causal = 0;
    run_with(ctx, &tc, 0, "VARIANT=nv-wgmma,BLOCK_M=64,BLOCK_N=64");
    flashcl_set_log(NULL, NULL);
    expect(builds_failed == 0, "nv-wgmma: every kernel above, forward and backward, built as asked (no fallback)",
           &failures);
#ifdef FLASHCL_SOURCE_CL_DIR
    /* Last: the failure is remembered by the context, which then never picks nv-wgmma again. */
    tc = test_case_basic(FLASHCL_FLOAT16, 37, 53, 56); /* a head dim no case above built */
    tc.causal = 1;
    build_failure(ctx, "flash_bwd_sm90.cl", tc, NULL);
#endif
}

/* ---- determinism ------------------------------------------------------------------------ */

static void determinism(flashcl_context *ctx) {
    test_case tc = test_case_basic(FLASHCL_FLOAT16, 77, 131, 59);
    tc.batch = 2;
    tc.heads_q = 6;
    tc.heads_k = 2;
    tc.causal = 1;
    run_buffers rb;
    int ok = setup(&rb, &tc, test_seed() + 99991u);
    void *first[3] = {NULL, NULL, NULL};
    const size_t es = flashcl_dtype_size(tc.dtype);
    for (int i = 0; ok && i < 3; ++i)
        ok = (first[i] = malloc(rb.elems[i] * es)) != NULL;
    int runs = 0;
    for (; ok && runs < 50; ++runs) {
        poison_grads(&rb, tc.dtype);
        if (run_backward(ctx, &rb, 1) != FLASHCL_SUCCESS) {
            printf("  run %d: %s\n", runs, flashcl_last_error(ctx));
            ok = 0;
            break;
        }
        for (int i = 0; i < 3; ++i) {
            if (runs == 0)
                memcpy(first[i], rb.grad[i], rb.elems[i] * es);
            else if (memcmp(first[i], rb.grad[i], rb.elems[i] * es) != 0) {
                printf("  run %d: d%c differs from run 0\n", runs, "qkv"[i]);
                ok = 0;
            }
        }
    }
    /* The identical bits must also be right. */
    if (ok) {
        flashcl_attention_desc_resolve(&rb.d);
        ok = flashcl_ref_check_backward(&rb.d, &rb.o, rb.host[0], rb.host[1], rb.host[2], rb.dout, first[0],
                                        first[1], first[2], 1, NULL);
    }
    char what[100];
    snprintf(what, sizeof what, "deterministic mode: identical bits over %d runs", runs);
    expect(ok && runs == 50, what, &failures);
    for (int i = 0; i < 3; ++i)
        free(first[i]);
    teardown(&rb);
}

/* ---- invalid arguments: an error status, and no output touched ------------------------- */

static void errors(flashcl_context *ctx) {
    test_case tc = test_case_basic(FLASHCL_FLOAT32, 37, 53, 16);
    run_buffers rb;
    if (!setup(&rb, &tc, test_seed() + 5u)) {
        expect(0, "errors: setup", &failures);
        return;
    }
    flashcl_attention_desc d = rb.d;
    const size_t es = 4;
    size_t scratch_bytes = 0;
    expect(flashcl_attention_backward_scratch_size(ctx, &d, NULL, &scratch_bytes) == FLASHCL_SUCCESS,
           "scratch size query", &failures);
    expect(flashcl_attention_backward_scratch_size(ctx, &d, NULL, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT,
           "scratch size: NULL bytes", &failures);
    flashcl_attention_desc bad = d;
    bad.heads_q = 3;
    bad.heads_k = 2;
    expect(flashcl_attention_backward_scratch_size(ctx, &bad, NULL, &scratch_bytes) == FLASHCL_ERROR_INVALID_SHAPE,
           "scratch size: heads_q % heads_k", &failures);

    if (flashcl_context_is_host(ctx)) {
        expect(flashcl_attention_backward(ctx, &d, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL,
                                          NULL, NULL, NULL) == FLASHCL_ERROR_UNSUPPORTED,
               "host context: cl_mem entry point unsupported", &failures);
    } else {
        flashcl_attention_backward_scratch_size(ctx, &d, NULL, &scratch_bytes);
        cl_mem b[10];
        for (int i = 0; i < 4; ++i)
            b[i] = make_buffer(ctx, rb.elems[i] * es, rb.host[i]);
        b[4] = make_buffer(ctx, rb.elems[3] * es, rb.dout);
        poison_grads(&rb, tc.dtype);
        for (int i = 0; i < 3; ++i)
            b[5 + i] = make_buffer(ctx, rb.elems[i] * es, rb.grad[i]);
        b[8] = make_buffer(ctx, rb.lse_count * 4, NULL);
        b[9] = make_buffer(ctx, scratch_bytes, NULL);
        cl_mem small = make_buffer(ctx, 64, NULL);
        flashcl_attention_forward(ctx, &d, b[0], b[1], b[2], b[3], b[8], 0, NULL);
        clFinish(flashcl_context_cl_queue(ctx));
        struct {
            const char *what;
            flashcl_status want;
            int replace; /* which buffer to replace: -1 none */
            cl_mem with;
            flashcl_attention_desc *desc;
            size_t lse_offset;
        } tests[] = {
            {"NULL dq buffer", FLASHCL_ERROR_INVALID_ARGUMENT, 5, NULL, &d, 0},
            {"NULL dout buffer", FLASHCL_ERROR_INVALID_ARGUMENT, 4, NULL, &d, 0},
            {"dk buffer too small", FLASHCL_ERROR_OUT_OF_BOUNDS, 6, small, &d, 0},
            {"scratch too small", FLASHCL_ERROR_OUT_OF_BOUNDS, 9, small, &d, 0},
            {"NULL scratch", FLASHCL_ERROR_INVALID_ARGUMENT, 9, NULL, &d, 0},
            {"lse offset past the buffer", FLASHCL_ERROR_OUT_OF_BOUNDS, -1, NULL, &d, 1},
            {"dq is the q buffer", FLASHCL_ERROR_INVALID_ARGUMENT, 5, b[0], &d, 0},
            {"heads_q not a multiple of heads_k", FLASHCL_ERROR_INVALID_SHAPE, -1, NULL, &bad, 0},
        };
        for (int t = 0; t < COUNT(tests); ++t) {
            cl_mem x[10];
            memcpy(x, b, sizeof x);
            if (tests[t].replace >= 0)
                x[tests[t].replace] = tests[t].with;
            flashcl_status st = flashcl_attention_backward(ctx, tests[t].desc, NULL, x[0], x[1], x[2], x[3], x[4],
                                                           x[8], tests[t].lse_offset, x[5], x[6], x[7], x[9], NULL);
            char what[120];
            snprintf(what, sizeof what, "error: %s -> %d (%s)", tests[t].what, st, flashcl_status_string(st));
            expect(st == tests[t].want && flashcl_last_error(ctx)[0], what, &failures);
        }
        /* A malformed parameter override is reported, not ignored. */
        setenv("FLASHCL_BWD_PARAMS", "BLOCK_M=16,BOGUS=2", 1);
        flashcl_status st = flashcl_attention_backward(ctx, &d, NULL, b[0], b[1], b[2], b[3], b[4], b[8], 0,
                                                       b[5], b[6], b[7], b[9], NULL);
        unsetenv("FLASHCL_BWD_PARAMS");
        expect(st == FLASHCL_ERROR_INVALID_PARAMS, "error: malformed FLASHCL_BWD_PARAMS", &failures);
        clFinish(flashcl_context_cl_queue(ctx));
        /* Nothing above may have written a gradient. */
        int untouched = 1;
        void *check = malloc(rb.elems[0] * es > rb.elems[1] * es ? rb.elems[0] * es : rb.elems[1] * es);
        for (int i = 0; check && i < 3; ++i) {
            clEnqueueReadBuffer(flashcl_context_cl_queue(ctx), b[5 + i], CL_TRUE, 0, rb.elems[i] * es, check, 0,
                                NULL, NULL);
            untouched &= memcmp(check, rb.grad[i], rb.elems[i] * es) == 0;
        }
        expect(check && untouched, "errors leave dq, dk, dv untouched", &failures);
        free(check);
        for (int i = 0; i < 10; ++i)
            clReleaseMemObject(b[i]);
        clReleaseMemObject(small);
    }
    /* The host-pointer layer: NULL pointers and bad shapes, outputs untouched. */
    poison_grads(&rb, tc.dtype);
    flashcl_attention_forward_host(ctx, &d, rb.host[0], rb.host[1], rb.host[2], rb.host[3], rb.lse);
    void *saved = malloc(rb.elems[0] * es);
    memcpy(saved, rb.grad[0], rb.elems[0] * es);
    expect(flashcl_attention_backward_host(ctx, &d, NULL, rb.host[0], rb.host[1], rb.host[2], rb.host[3],
                                           rb.dout, NULL, rb.grad[0], rb.grad[1], rb.grad[2]) ==
               FLASHCL_ERROR_INVALID_ARGUMENT,
           "host layer: NULL lse", &failures);
    bad = d;
    bad.head_dim = 300;
    expect(flashcl_attention_backward_host(ctx, &bad, NULL, rb.host[0], rb.host[1], rb.host[2], rb.host[3],
                                           rb.dout, rb.lse, rb.grad[0], rb.grad[1], rb.grad[2]) ==
               FLASHCL_ERROR_INVALID_SHAPE,
           "host layer: head_dim 300", &failures);
    bad = d;
    bad.dtype = (flashcl_dtype)7;
    expect(flashcl_attention_backward_host(ctx, &bad, NULL, rb.host[0], rb.host[1], rb.host[2], rb.host[3],
                                           rb.dout, rb.lse, rb.grad[0], rb.grad[1], rb.grad[2]) ==
               FLASHCL_ERROR_INVALID_ARGUMENT,
           "host layer: unknown dtype", &failures);
    expect(memcmp(saved, rb.grad[0], rb.elems[0] * es) == 0, "host layer errors leave dq untouched", &failures);
    /* And it works: the same gradients through host pointers. */
    flashcl_status st = flashcl_attention_backward_host(ctx, &d, NULL, rb.host[0], rb.host[1], rb.host[2],
                                                        rb.host[3], rb.dout, rb.lse, rb.grad[0], rb.grad[1], rb.grad[2]);
    flashcl_attention_desc r = d;
    flashcl_attention_desc_resolve(&r);
    expect(st == FLASHCL_SUCCESS && flashcl_ref_check_backward(&r, NULL, rb.host[0], rb.host[1], rb.host[2],
                                                               rb.dout, rb.grad[0], rb.grad[1], rb.grad[2], 1, NULL),
           "host layer: flashcl_attention_backward_host matches the reference", &failures);
    free(saved);
    teardown(&rb);
}

/* Tiny shapes for Oclgrind (ctest -L oclgrind): each backward kernel
 * variant in both dQ modes (atomic float adds when not deterministic, the dQ
 * pass when deterministic), tiles small enough that several work-groups add
 * into the same dQ rows. */
static void oclgrind(flashcl_context *ctx) {
    test_case tc = test_case_basic(FLASHCL_FLOAT32, 11, 13, 8);
    tc.heads_q = 2; /* GQA 2:1: dK/dV sum over both query heads */
    tc.causal = 1;
    for (int det = 0; det < 2; ++det) {
        run_with(ctx, &tc, det, "VARIANT=portable,BLOCK_M=8,BLOCK_N=4,WG=32");
        run_with(ctx, &tc, det, "VARIANT=cpu,BLOCK_M=8,BLOCK_N=8");
    }
    tc = test_case_basic(FLASHCL_FLOAT16, 6, 9, 5);
    tc.window_left = 2;
    tc.window_right = 1;
    tc.softcap = 5.0f;
    run_with(ctx, &tc, 0, "VARIANT=portable,BLOCK_M=8,BLOCK_N=4,WG=32");
    run_with(ctx, &tc, 0, "VARIANT=cpu,BLOCK_M=8,BLOCK_N=8");
}

int main(int argc, char **argv) {
    flashcl_context *ctx = test_context();
    uint64_t seed = test_seed();
    if (argc > 2 && (sscanf(argv[2], "%d/%d", &shard_k, &shard_n) != 2 || shard_n < 1 || shard_k < 0 ||
                     shard_k >= shard_n)) {
        fprintf(stderr, "test_backward: shard \"%s\" is not K/N with 0 <= K < N\n", argv[2]);
        return 2;
    }
    if (argc > 1 && !strcmp(argv[1], "sweep")) {
        sweep(ctx);
    } else if (argc > 1 && !strcmp(argv[1], "mma")) {
        mma(ctx);
    } else if (argc > 1 && !strcmp(argv[1], "wgmma")) {
        wgmma(ctx);
    } else if (argc > 1 && !strcmp(argv[1], "oclgrind")) {
        oclgrind(ctx);
    } else {
        fd_checks(seed);
        checker_checks(seed);
        quick(ctx);
#ifdef FLASHCL_SOURCE_CL_DIR
        cpu_build_failure(ctx);
#endif
        determinism(ctx);
        errors(ctx);
    }
    printf("%d of %d cases passed, %d failures\n", cases - (failures > cases ? cases : failures), cases, failures);
    flashcl_context_destroy(ctx);
    return failures ? 1 : 0;
}
