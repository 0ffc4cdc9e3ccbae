/* harness.c: device choice, seeds and the run-and-check loop the tests share. */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"
#include "internal.h" /* flashcl_get_kernel: test_run_probe */

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

flashcl_context *test_context(void) {
    flashcl_context *ctx = NULL;
    const char *spec = getenv("FLASHCL_TEST_DEVICE");
    flashcl_status st = flashcl_context_create(&ctx, spec);
    if (st != FLASHCL_SUCCESS) {
        fprintf(stderr, "cannot create a context (%s): %s\n", flashcl_status_string(st),
                flashcl_last_error(ctx));
        exit(1);
    }
    static int said;
    if (!said) {
        said = 1;
        printf("device: %s\n", flashcl_context_device_name(ctx));
    }
    return ctx;
}

uint64_t test_seed(void) {
    static uint64_t seed;
    static int have;
    if (!have) {
        const char *env = getenv("FLASHCL_TEST_SEED");
        if (env && env[0]) {
            seed = strtoull(env, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
        }
        have = 1;
        printf("seed: FLASHCL_TEST_SEED=%llu\n", (unsigned long long)seed);
    }
    return seed;
}

test_case test_case_basic(flashcl_dtype dtype, int seqlen_q, int seqlen_k, int head_dim) {
    test_case tc;
    memset(&tc, 0, sizeof tc);
    tc.dtype = dtype;
    tc.batch = 1;
    tc.heads_q = tc.heads_k = 1;
    tc.seqlen_q = seqlen_q;
    tc.seqlen_k = seqlen_k;
    tc.head_dim = head_dim;
    tc.window_left = tc.window_right = -1;
    return tc;
}

test_case test_case_many_heads(flashcl_dtype dtype, int seqlen_q, int seqlen_k, int head_dim, int heads_k,
                               int window_right) {
    test_case tc = test_case_basic(dtype, seqlen_q, seqlen_k, head_dim);
    tc.batch = 3;
    tc.heads_q = 6;
    tc.heads_k = heads_k;
    if (window_right < 0)
        tc.causal = 1;
    else
        tc.window_right = window_right;
    return tc;
}

/* One unit in the last place of dtype dt at |x| (its smallest normal's where |x| is below it). */
static double storage_ulp(flashcl_dtype dt, double x) {
    const int mant = dt == FLASHCL_FLOAT16 ? 10 : dt == FLASHCL_BFLOAT16 ? 7 : 23;
    const int emin = dt == FLASHCL_FLOAT16 ? -14 : -126;
    int e;
    frexp(fabs(x), &e); /* |x| = m 2^e, m in [0.5, 1) */
    return ldexp(1.0, (e - 1 > emin ? e - 1 : emin) - mant);
}

int test_outputs_agree(const void *a, const void *b, flashcl_dtype dt, size_t n, double *worst) {
    int ok = 1;
    *worst = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double x = flashcl_ref_load(a, dt, i), y = flashcl_ref_load(b, dt, i);
        const double d = isfinite(x) && isfinite(y) ? fabs(x - y) : INFINITY;
        *worst = fmax(*worst, d);
        ok &= d <= 2.0 * storage_ulp(dt, fmax(fabs(x), fabs(y))) + 4.0 * flashcl_ref_epsilon(dt);
    }
    return ok;
}

int test_cpu_refused_on_rusticl(flashcl_context *ctx, const char *variant, flashcl_status st) {
    return variant && !strcmp(variant, "cpu") &&
           strstr(flashcl_context_device_name(ctx), "rusticl") &&
           st == FLASHCL_ERROR_INVALID_PARAMS && strstr(flashcl_last_error(ctx), "rusticl");
}

void expect(int ok, const char *what, int *failures) {
    printf("%-60s %s\n", what, ok ? "ok" : "FAILED");
    if (!ok)
        ++*failures;
}

/* Lays out one tensor of shape (batch, seqlen, heads, head_dim). */
static size_t set_layout(flashcl_layout *l, int layout, int batch, int seqlen, int heads, int head_dim) {
    memset(l, 0, sizeof *l);
    size_t s = (size_t)seqlen, h = (size_t)heads, d = (size_t)head_dim;
    switch (layout) {
    case LAYOUT_BHSD:
        l->stride_seq = d;
        l->stride_head = s * d;
        l->stride_batch = h * s * d;
        return (size_t)batch * h * s * d;
    case LAYOUT_PADDED: /* 3 spare elements per head row, 7 per token, 5 per batch */
        l->offset = 11;
        l->stride_head = d + 3;
        l->stride_seq = h * (d + 3) + 7;
        l->stride_batch = s * l->stride_seq + 5;
        return l->offset + (size_t)batch * l->stride_batch;
    default:
        return (size_t)batch * s * h * d;
    }
}

void case_desc(const test_case *tc, flashcl_attention_desc *d, size_t elems[4]) {
    memset(d, 0, sizeof *d);
    d->dtype = tc->dtype;
    d->batch = tc->batch;
    d->heads_q = tc->heads_q;
    d->heads_k = tc->heads_k;
    d->seqlen_q = tc->seqlen_q;
    d->seqlen_k = tc->seqlen_k;
    d->head_dim = tc->head_dim;
    d->causal = tc->causal;
    d->windowed = tc->window_left >= 0 || tc->window_right >= 0;
    d->window_left = tc->window_left;
    d->window_right = tc->window_right;
    d->softcap = tc->softcap;
    d->scale = tc->scale;
    elems[0] = set_layout(&d->q, tc->layout, tc->batch, tc->seqlen_q, tc->heads_q, tc->head_dim);
    elems[1] = set_layout(&d->k, tc->layout, tc->batch, tc->seqlen_k, tc->heads_k, tc->head_dim);
    elems[2] = set_layout(&d->v, tc->layout, tc->batch, tc->seqlen_k, tc->heads_k, tc->head_dim);
    elems[3] = set_layout(&d->out, tc->layout, tc->batch, tc->seqlen_q, tc->heads_q, tc->head_dim);
}

static void describe_case(const test_case *tc, char *buf, size_t cap) {
    static const char *dtypes[] = {"f32", "f16", "bf16"};
    snprintf(buf, cap, "%-4s B%d Hq%d Hk%d Nq%d Nk%d D%d%s win(%d,%d)%s%s%s", dtypes[tc->dtype],
             tc->batch, tc->heads_q, tc->heads_k, tc->seqlen_q, tc->seqlen_k, tc->head_dim,
             tc->causal ? " causal" : "", tc->window_left, tc->window_right,
             tc->softcap > 0 ? " softcap" : "",
             tc->layout == LAYOUT_BHSD ? " bhsd" : tc->layout == LAYOUT_PADDED ? " padded" : "",
             tc->input_scale > 1 ? " large" : "");
}

int run_case(flashcl_context *ctx, const test_case *tc, uint64_t seed, int verbose) {
    flashcl_attention_desc d;
    size_t elems[4];
    case_desc(tc, &d, elems);
    size_t es = flashcl_dtype_size(tc->dtype);
    size_t lse_count = (size_t)tc->batch * tc->heads_q * tc->seqlen_q;
    void *host[4];
    float *lse = malloc(lse_count * sizeof(float));
    for (int i = 0; i < 4; ++i)
        host[i] = malloc(elems[i] * es);
    char name[200];
    describe_case(tc, name, sizeof name);
    int ok = 0;
    if (!lse || !host[0] || !host[1] || !host[2] || !host[3]) {
        fprintf(stderr, "%s: out of host memory\n", name);
        goto done;
    }
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    double sd = tc->input_scale > 0 ? tc->input_scale : 1.0;
    /* input_scale makes the scores large (q and k); v stays N(0,1) so the
     * outputs keep their usual size and the tolerance its meaning. */
    for (int i = 0; i < 3; ++i)
        flashcl_ref_fill_normal(&rng, host[i], tc->dtype, elems[i], i < 2 ? sd : 1.0);
    flashcl_ref_poison(host[3], tc->dtype, elems[3]);
    flashcl_ref_poison(lse, FLASHCL_FLOAT32, lse_count);

    flashcl_status st = FLASHCL_SUCCESS;
    /* FLASHCL_TEST_VARIANT=portable runs the GPU kernel on any device (CI
     * checks it on PoCL's CPU, where the CPU kernel would be chosen). */
    const char *variant = getenv("FLASHCL_TEST_VARIANT");
    if (variant && !strcmp(variant, "portable") && !flashcl_context_is_host(ctx)) {
        flashcl_params p = {16, d.head_dim > 128 ? 16 : 32, 8, 128, "portable", NULL};
        st = flashcl_set_params(ctx, &d, &p);
    }
    if (st != FLASHCL_SUCCESS) {
        /* reported below */
    } else if (flashcl_context_is_host(ctx)) {
        st = flashcl_attention_forward_host(ctx, &d, host[0], host[1], host[2], host[3], lse);
    } else {
        cl_context cl = flashcl_context_cl_context(ctx);
        cl_command_queue queue = flashcl_context_cl_queue(ctx);
        cl_int err;
        cl_mem buf[5] = {0};
        for (int i = 0; i < 4; ++i)
            buf[i] = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, elems[i] * es, host[i], &err);
        buf[4] = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, lse_count * 4, lse, &err);
        st = flashcl_attention_forward(ctx, &d, buf[0], buf[1], buf[2], buf[3], buf[4], 0, NULL);
        if (st == FLASHCL_SUCCESS) {
            clEnqueueReadBuffer(queue, buf[3], CL_TRUE, 0, elems[3] * es, host[3], 0, NULL, NULL);
            clEnqueueReadBuffer(queue, buf[4], CL_TRUE, 0, lse_count * 4, lse, 0, NULL, NULL);
        }
        for (int i = 0; i < 5; ++i)
            if (buf[i])
                clReleaseMemObject(buf[i]);
    }
    if (st != FLASHCL_SUCCESS) {
        printf("%s: FAILED: %s: %s\n", name, flashcl_status_string(st), flashcl_last_error(ctx));
        goto done;
    }
    /* The harness's own layouts are only for the device; the check reads
     * the resolved strides from the same desc. */
    flashcl_attention_desc_resolve(&d);
    flashcl_ref_report rep;
    ok = flashcl_ref_check_forward(&d, host[0], host[1], host[2], host[3], lse, 1, &rep);
    if (!ok || verbose)
        printf("%-64s err %.3g tol %.3g lse_err %.3g %s\n", name, rep.max_err, rep.tolerance,
               rep.max_lse_err, ok ? "ok" : "FAILED");
done:
    for (int i = 0; i < 4; ++i)
        free(host[i]);
    free(lse);
    return ok;
}

int test_copy_file(const char *from_dir, const char *to_dir, const char *name) {
    char from[4096], to[4096], buf[4096];
    snprintf(from, sizeof from, "%s/%s", from_dir, name);
    snprintf(to, sizeof to, "%s/%s", to_dir, name);
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    int ok = in && out;
    for (size_t n; ok && (n = fread(buf, 1, sizeof buf, in)) > 0;)
        ok = fwrite(buf, 1, n, out) == n;
    if (in)
        fclose(in);
    if (out && fclose(out))
        ok = 0;
    return ok;
}

flashcl_status test_paged_attention(flashcl_context *ctx, const flashcl_varlen_desc *d, flashcl_kv_cache *cache,
                                    const int *ids, const void *q, size_t q_el, void *out, size_t out_el, float *lse,
                                    size_t lse_n, flashcl_params *params, int *used_splits) {
    const size_t es = flashcl_dtype_size(d->dtype);
    flashcl_ref_poison(out, d->dtype, out_el);
    flashcl_ref_poison(lse, FLASHCL_FLOAT32, lse_n);
    size_t scratch_bytes = 0;
    *used_splits = 0;
    flashcl_status st = flashcl_paged_scratch_size(ctx, d, cache, ids, &scratch_bytes);
    if (!st)
        st = flashcl_serving_params(ctx, d, cache, ids, params, used_splits);
    cl_mem bq = test_upload(ctx, q, q_el * es), bo = test_upload(ctx, out, out_el * es),
           bl = test_upload(ctx, lse, lse_n * 4);
    cl_mem scratch = scratch_bytes ? test_upload(ctx, NULL, scratch_bytes) : NULL;
    if (!st)
        st = flashcl_paged_attention(ctx, d, cache, ids, bq, bo, bl, 0, scratch, NULL);
    if (!st) {
        test_download(ctx, bo, out, out_el * es);
        test_download(ctx, bl, lse, lse_n * 4);
    } else {
        printf("  %s: %s\n", flashcl_status_string(st), flashcl_last_error(ctx));
    }
    clReleaseMemObject(bq), clReleaseMemObject(bo), clReleaseMemObject(bl);
    if (scratch)
        clReleaseMemObject(scratch);
    return st;
}

int test_kernel_dir(char *dir, const char *from_dir, const char *const *files, int count) {
    int ok = mkdtemp(dir) != NULL;
    DIR *d = ok ? opendir(from_dir) : NULL;
    ok = d != NULL;
    for (struct dirent *e; ok && d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (!strncmp(e->d_name, "common", 6) && n > 3 && !strcmp(e->d_name + n - 3, ".cl"))
            ok = test_copy_file(from_dir, dir, e->d_name);
    }
    if (d)
        closedir(d);
    for (int i = 0; ok && i < count; ++i)
        ok = test_copy_file(from_dir, dir, files[i]);
    return ok;
}

void test_kernel_dir_remove(const char *dir) {
    char path[4096];
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            remove(path);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

cl_int test_run_probe(flashcl_context *ctx, const char *cl_dir, const char *test_dir, const char *file,
                      const char *kernel, const void *in, size_t in_bytes, void *out, size_t out_bytes, int n) {
    char dir[] = "/tmp/flashcl-probe-XXXXXX";
    cl_kernel k = NULL;
    cl_int err = CL_BUILD_PROGRAM_FAILURE;
    if (test_kernel_dir(dir, cl_dir, NULL, 0) && test_copy_file(test_dir, dir, file)) {
        setenv("FLASHCL_KERNEL_DIR", dir, 1);
        if (flashcl_get_kernel(ctx, file, kernel, "-cl-std=CL1.2", &k) == FLASHCL_SUCCESS)
            err = CL_SUCCESS;
        unsetenv("FLASHCL_KERNEL_DIR");
    }
    test_kernel_dir_remove(dir);
    if (err != CL_SUCCESS)
        return err;
    cl_mem bin = test_upload(ctx, in, in_bytes), bout = test_upload(ctx, out, out_bytes);
    const cl_int count = n;
    const size_t global = (size_t)(n + 63) / 64 * 64;
    err = clSetKernelArg(k, 0, sizeof(cl_mem), &bin);
    err |= clSetKernelArg(k, 1, sizeof(cl_mem), &bout);
    err |= clSetKernelArg(k, 2, sizeof(cl_int), &count);
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(flashcl_context_cl_queue(ctx), k, 1, NULL, &global, NULL, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        test_download(ctx, bout, out, out_bytes);
    clReleaseMemObject(bin), clReleaseMemObject(bout);
    return err;
}

static void die(const char *what, long code) {
    fprintf(stderr, "%s failed (%ld)\n", what, code);
    exit(1);
}

void *test_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    return p ? p : (die("malloc", (long)n), NULL);
}

flashcl_context *test_out_of_order_context(flashcl_context *base, const char *what, cl_command_queue *queue) {
    cl_int err = CL_SUCCESS;
    *queue = clCreateCommandQueue(flashcl_context_cl_context(base), flashcl_context_cl_device(base),
                                  CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    flashcl_context *ctx = NULL;
    if (!*queue ||
        flashcl_context_adopt(&ctx, flashcl_context_cl_context(base), flashcl_context_cl_device(base), *queue)) {
        printf("%s: no out-of-order queue here (%d), skipped\n", what, err);
        if (*queue)
            clReleaseCommandQueue(*queue);
        *queue = NULL;
        return NULL;
    }
    return ctx;
}

cl_mem test_upload(flashcl_context *ctx, const void *host, size_t bytes) {
    cl_int err = CL_SUCCESS;
    cl_mem b = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0),
                              bytes ? bytes : 4, (void *)host, &err);
    return b ? b : (die("clCreateBuffer", err), NULL);
}

void test_download(flashcl_context *ctx, cl_mem b, void *host, size_t bytes) {
    cl_int err = clEnqueueReadBuffer(flashcl_context_cl_queue(ctx), b, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        die("clEnqueueReadBuffer", err);
}

flashcl_status test_kv_append(flashcl_context *ctx, flashcl_kv_cache *cache, int n, const int *ids,
                              const int *counts, const void *k, const void *v, size_t bytes) {
    cl_mem bk = test_upload(ctx, k, bytes), bv = test_upload(ctx, v, bytes);
    const flashcl_status st = flashcl_kv_cache_append(cache, n, ids, counts, bk, NULL, bv, NULL, NULL);
    clFinish(flashcl_context_cl_queue(ctx));
    clReleaseMemObject(bk);
    clReleaseMemObject(bv);
    return st;
}

flashcl_attention_desc test_attention_desc(flashcl_dtype dtype, int batch, int heads_q, int heads_k,
                                           int seqlen_q, int seqlen_k, int head_dim) {
    flashcl_attention_desc d = {.dtype = dtype,
                                .batch = batch,
                                .heads_q = heads_q,
                                .heads_k = heads_k,
                                .seqlen_q = seqlen_q,
                                .seqlen_k = seqlen_k,
                                .head_dim = head_dim};
    return d;
}

flashcl_varlen_desc test_varlen_desc(flashcl_dtype dtype, int num_seqs, int heads_q, int heads_k,
                                     int head_dim, const int *cu_seqlens_q,
                                     const int *cu_seqlens_k) {
    flashcl_varlen_desc d = {.dtype = dtype,
                             .num_seqs = num_seqs,
                             .heads_q = heads_q,
                             .heads_k = heads_k,
                             .head_dim = head_dim,
                             .cu_seqlens_q = cu_seqlens_q,
                             .cu_seqlens_k = cu_seqlens_k};
    return d;
}

flashcl_merge_desc test_merge_desc(flashcl_dtype dtype, int batch, int seqlen, int heads,
                                   int head_dim) {
    flashcl_merge_desc d = {
        .dtype = dtype, .batch = batch, .seqlen = seqlen, .heads = heads, .head_dim = head_dim};
    return d;
}

int test_summary(int failures) {
    if (failures) {
        printf("%d FAILED\n", failures);
        return 1;
    }
    printf("all passed\n");
    return 0;
}

/* One query whose score against the key at `hot` is `score` and against
 * every other key score/2 (q = [score, 0...], k_hot = [1, 0...], others
 * [0.5, 0...], scale 1). The softmax is one-hot for any large score, so the
 * right answer is out = v_hot = 2 and LSE = score, whatever its size: a
 * kernel that rounds m * log2(e) once and s * log2(e) another way gets
 * exp2(+-hundreds) there instead of 1 (0 or inf, out 0 or NaN). */
int run_huge_scores(flashcl_context *ctx, float score, int seqlen_k, int hot, int head_dim, int portable) {
    flashcl_attention_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = FLASHCL_FLOAT32;
    d.batch = d.heads_q = d.heads_k = d.seqlen_q = 1;
    d.seqlen_k = seqlen_k;
    d.head_dim = head_dim;
    d.scale = 1.0f;
    float *q = calloc((size_t)head_dim, sizeof(float));
    float *k = calloc((size_t)seqlen_k * head_dim, sizeof(float));
    float *v = calloc((size_t)seqlen_k * head_dim, sizeof(float));
    float *out = malloc((size_t)head_dim * sizeof(float));
    double ref_out[256], ref_lse = 0.0;
    float lse = 0.0f;
    int ok = 0;
    if (!q || !k || !v || !out || head_dim > 256)
        goto done;
    q[0] = score;
    for (int j = 0; j < seqlen_k; ++j)
        for (int x = 0; x < head_dim; ++x) {
            k[(size_t)j * head_dim + x] = x == 0 ? (j == hot ? 1.0f : 0.5f) : 0.0f;
            v[(size_t)j * head_dim + x] = j == hot ? 2.0f : 3.0f;
        }
    flashcl_ref_poison(out, FLASHCL_FLOAT32, (size_t)head_dim);
    flashcl_status st = FLASHCL_SUCCESS;
    /* The portable kernel with its built-in tiles, shrunk to fit the device. */
    const int force = portable && !flashcl_context_is_host(ctx) && !getenv("FLASHCL_PARAMS");
    if (force)
        setenv("FLASHCL_PARAMS", "VARIANT=portable", 1);
    st = flashcl_attention_forward_host(ctx, &d, q, k, v, out, &lse);
    if (force)
        unsetenv("FLASHCL_PARAMS");
    flashcl_ref_attention_forward(&d, q, k, v, ref_out, &ref_lse, NULL, NULL);
    ok = st == FLASHCL_SUCCESS;
    /* The LSE is score + log(1 + (n-1) e^(-score/2)): score itself in float. */
    double want_lse = (double)score;
    ok = ok && fabs(lse - want_lse) <= 1e-6 * fabs(want_lse) + 1e-6;
    ok = ok && fabs(ref_lse - want_lse) <= 1e-6 * fabs(want_lse) + 1e-6;
    for (int x = 0; x < head_dim; ++x)
        ok = ok && fabs(out[x] - 2.0) <= 1e-6 && fabs(ref_out[x] - 2.0) <= 1e-12;
    if (!ok)
        printf("huge scores %g, Nk %d, hot key %d, D %d%s: %s; out[0] %g (ref %g), lse %g (ref %g), want 2 and %g\n",
               score, seqlen_k, hot, head_dim, portable ? " portable" : "", st ? flashcl_status_string(st) : "wrong values", out[0],
               ref_out[0], lse, ref_lse, want_lse);
done:
    free(q);
    free(k);
    free(v);
    free(out);
    return ok;
}
