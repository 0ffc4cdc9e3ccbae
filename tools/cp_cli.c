/* cp_cli.c: `flashcl attention --context-parallel` and `flashcl bench --context-parallel` under mpirun (built with MPI only). */
#define _POSIX_C_SOURCE 200809L
#include "cp_cli.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_util.h"
#include "flashcl_mpi.h"
#include "flashcl_ref.h"
#include "npy.h"

const char cli_usage_attention_cp[] =
    "usage: mpirun -np P flashcl attention --context-parallel --q Q.npy --k K.npy --v V.npy\n"
    "                                      --out O.npy [options]\n"
    "\n"
    "Context-parallel (ring) attention over MPI: every rank reads the same .npy\n"
    "inputs (shapes and dtypes as for 'flashcl attention'), keeps its zigzag shard\n"
    "(the sequence in 2P chunks, rank r holding chunks r and 2P-1-r: see\n"
    "include/flashcl_mpi.h), runs flashcl_cp_attention_forward on its own device,\n"
    "and rank 0 gathers and writes the full output (and LSE). With --backward the\n"
    "forward runs first, then flashcl_cp_attention_backward, and rank 0 writes\n"
    "dq, dk and dv.\n"
    "\n"
    "options:\n"
    "  --lse LSE.npy     also write the log-sum-exp (batch, heads_q, seqlen_q)\n"
    "  --causal          causal mask over the global sequence, bottom-right aligned\n"
    "  --softcap C, --scale S   as for 'flashcl attention'\n"
    "  --backward --dout DO.npy --dq DQ.npy --dk DK.npy --dv DV.npy   gradients\n"
    "  --device SPEC     each rank's device (FLASHCL_DEVICE per rank works too)\n";

const char cli_usage_bench_cp[] =
    "usage: mpirun -np P flashcl bench --context-parallel [options]\n"
    "\n"
    "Times flashcl_cp_attention_forward over the ranks (wall clock, from a barrier\n"
    "to the slowest rank's return; median and min of --iters after --warmup), after\n"
    "checking its gathered output against the single-device forward that rank 0\n"
    "then runs alone on the whole problem (the baseline, timed the same way).\n"
    "Reports TFLOP/s (4*B*Hq*Nq*Nk*D, halved when causal), the share of the ring's\n"
    "message time hidden behind compute (1 - exposed/total, over all ranks), and\n"
    "the scaling efficiency T(1 rank) / (P * T(P ranks)).\n"
    "\n"
    "options:\n"
    "  --shape B,H,N,D        a shape (repeatable); also B,Hq,Hk,Nq,Nk,D\n"
    "                         (default 1,8,1024,64)\n"
    "  --dtype f16|bf16|f32   storage type (default f32)\n"
    "  --causal / --no-causal only one of the two (default: both)\n"
    "  --iters N, --warmup N  timed and untimed runs (default 5 and 1)\n"
    "  --backward             time flashcl_cp_attention_backward instead (after one\n"
    "                         forward; baseline: the single-device backward; TFLOP/s\n"
    "                         counts 2.5x the forward's)\n"
    "  --device SPEC\n";

static int g_rank, g_size;

/* Prints on rank 0 only: every rank reaches the same verdicts. */
#define ROOT_ERROR(...)                                                                                              \
    do {                                                                                                             \
        if (g_rank == 0)                                                                                             \
            cli_errorf(__VA_ARGS__);                                                                                 \
    } while (0)

/* The sizes of one problem that the commands below share: es bytes an
 * element, qrow/krow bytes of a q or k/v token (all heads), nqe/nke elements
 * of the global q and k/v, nq/nk this rank's tokens, sq/sk bytes of its
 * shards, sl bytes of its LSE shard. */
typedef struct cp_sizes {
    size_t es, qrow, krow, nqe, nke, sq, sk, sl;
    int nq, nk;
} cp_sizes;

static cp_sizes sizes_of(const flashcl_attention_desc *d) {
    cp_sizes z;
    z.es = flashcl_dtype_size(d->dtype);
    z.qrow = (size_t)d->heads_q * d->head_dim * z.es;
    z.krow = (size_t)d->heads_k * d->head_dim * z.es;
    z.nqe = (size_t)d->batch * d->seqlen_q * d->heads_q * d->head_dim;
    z.nke = (size_t)d->batch * d->seqlen_k * d->heads_k * d->head_dim;
    z.nq = flashcl_cp_local_len(d->seqlen_q, g_size, g_rank);
    z.nk = flashcl_cp_local_len(d->seqlen_k, g_size, g_rank);
    z.sq = (size_t)d->batch * z.nq * z.qrow;
    z.sk = (size_t)d->batch * z.nk * z.krow;
    z.sl = (size_t)d->batch * d->heads_q * z.nq * 4;
    return z;
}

/* Every rank's shard into the global tensor on rank 0; nonzero (on every rank) on failure. */
static int gather_shards(const void *shard, void *global, int outer, int seqlen, size_t row_bytes) {
    return flashcl_cp_gather_shards(MPI_COMM_WORLD, 0, shard, global, outer, seqlen, row_bytes) != FLASHCL_SUCCESS;
}

/* One device buffer holding `bytes` of host (NULL: uninitialised). */
static cl_mem upload(flashcl_context *ctx, const void *host, size_t bytes) {
    cl_int err = CL_SUCCESS;
    return clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0),
                          bytes ? bytes : 4, (void *)host, &err);
}

static int download(flashcl_context *ctx, cl_mem b, void *host, size_t bytes) {
    if (!bytes)
        return 0;
    return clEnqueueReadBuffer(flashcl_context_cl_queue(ctx), b, CL_TRUE, 0, bytes, host, 0, NULL, NULL) ==
                   CL_SUCCESS
               ? 0
               : -1;
}

/* A barrier that naps instead of spinning: the other ranks wait here while
 * rank 0 times the single-device baseline, and Open MPI's spinning barrier
 * would take the cores that baseline runs on (PoCL's CPU device). */
static void quiet_barrier(void) {
    MPI_Request req;
    int done = 0;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
}

/* All ranks agree whether every rank succeeded. */
static int all_ok(int ok) {
    int r = 0;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

static int write_npy(const char *path, npy_dtype dtype, const size_t *shape, int ndim, const void *data) {
    char err[512], *tmp = NULL;
    if (npy_write_temp(path, dtype, shape, ndim, data, &tmp, err, sizeof err) != 0) {
        cli_errorf("%s: %s", path, err);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        cli_errorf("%s: cannot rename the temporary file into place", path);
        remove(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

static int read_input(const char *path, npy_array *a) {
    char err[512];
    if (npy_read(path, a, err, sizeof err) != 0) {
        ROOT_ERROR("%s: %s", path, err);
        return -1;
    }
    if (a->ndim != 4) {
        ROOT_ERROR("%s: %d dimensions, expected 4 (batch, seqlen, heads, head_dim)", path, a->ndim);
        return -1;
    }
    for (int i = 0; i < 4; ++i)
        if (a->shape[i] == 0 || a->shape[i] > INT_MAX) {
            ROOT_ERROR("%s: dimension %d is %zu", path, i, a->shape[i]);
            return -1;
        }
    return 0;
}

/* ---- attention --context-parallel ------------------------------------------------------ */

static int attention_cp(int argc, char **argv) {
    const char *path[9] = {0}; /* q k v out lse dout dq dk dv */
    const char *device = NULL, *value;
    enum { Q, K, V, OUT, LSE, DOUT, DQ, DK, DV };
    int causal = 0, backward = 0;
    double softcap = 0, scale = 0;
    for (int i = 2; i < argc; ++i) {
        static const char *const names[9] = {"--q",    "--k",  "--v",  "--out", "--lse",
                                             "--dout", "--dq", "--dk", "--dv"};
        int r = cli_take_any(argc, argv, &i, names, 9, path);
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r > 0)
            continue;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (g_rank == 0)
                fputs(cli_usage_attention_cp, stdout);
            return CLI_EXIT_OK;
        } else if (strcmp(argv[i], "--context-parallel") == 0) {
        } else if (strcmp(argv[i], "--causal") == 0) {
            causal = 1;
        } else if (strcmp(argv[i], "--backward") == 0) {
            backward = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--device", &device)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--softcap", &value)) != 0) {
            if (r < 0 || cli_parse_double(value, &softcap) != 0 || softcap < 0) {
                ROOT_ERROR("--softcap wants a number >= 0");
                return CLI_EXIT_USAGE;
            }
        } else if ((r = cli_take_value(argc, argv, &i, "--scale", &value)) != 0) {
            if (r < 0 || cli_parse_double(value, &scale) != 0) {
                ROOT_ERROR("--scale wants a finite number");
                return CLI_EXIT_USAGE;
            }
        } else {
            ROOT_ERROR("unknown option '%s' for 'flashcl attention --context-parallel'", argv[i]);
            return CLI_EXIT_USAGE;
        }
    }
    if (!path[Q] || !path[K] || !path[V] || (!backward && !path[OUT]) ||
        (backward && (!path[DOUT] || !path[DQ] || !path[DK] || !path[DV]))) {
        ROOT_ERROR("%s", backward ? "--context-parallel --backward needs --q, --k, --v, --dout, --dq, --dk and --dv"
                                  : "--context-parallel needs --q, --k, --v and --out");
        return CLI_EXIT_USAGE;
    }
    npy_array in[4];
    memset(in, 0, sizeof in);
    int rc = CLI_EXIT_FAIL;
    flashcl_context *ctx = NULL;
    cl_mem b[10] = {0};
    void *h[10] = {0};
    void *g[6] = {0};
    int ok = read_input(path[Q], &in[0]) == 0 && read_input(path[K], &in[1]) == 0 &&
             read_input(path[V], &in[2]) == 0 && (!backward || read_input(path[DOUT], &in[3]) == 0);
    if (ok && (in[1].dtype != in[0].dtype || in[2].dtype != in[0].dtype || (backward && in[3].dtype != in[0].dtype) ||
               in[1].shape[0] != in[0].shape[0] || in[1].shape[3] != in[0].shape[3] ||
               memcmp(in[1].shape, in[2].shape, 4 * sizeof(size_t)) != 0 ||
               (backward && memcmp(in[3].shape, in[0].shape, 4 * sizeof(size_t)) != 0))) {
        ROOT_ERROR("the inputs disagree: k and v must match each other and q's batch, head_dim and dtype (dout: q's "
                   "shape)");
        ok = 0;
    }
    if (!all_ok(ok))
        goto done;
    flashcl_attention_desc d = cli_npy_desc(&in[0], &in[1], causal, -1, -1, softcap, scale);
    const cp_sizes z = sizes_of(&d);
    const size_t qrow = z.qrow, krow = z.krow, sq = z.sq, sk = z.sk, sl = z.sl;
    enum { BQ, BK, BV, BO, BL, BDO, BDQ, BDK, BDV };
    size_t sizes[9] = {sq, sk, sk, sq, sl, sq, sq, sk, sk};
    for (int i = 0; i < 9; ++i)
        ok = ok && (h[i] = malloc(sizes[i] + 1)) != NULL;
    ok = ok && !flashcl_cp_take_shard(in[0].data, h[BQ], d.batch, d.seqlen_q, qrow, g_size, g_rank) &&
         !flashcl_cp_take_shard(in[1].data, h[BK], d.batch, d.seqlen_k, krow, g_size, g_rank) &&
         !flashcl_cp_take_shard(in[2].data, h[BV], d.batch, d.seqlen_k, krow, g_size, g_rank) &&
         (!backward || !flashcl_cp_take_shard(in[3].data, h[BDO], d.batch, d.seqlen_q, qrow, g_size, g_rank));
    flashcl_status st = ok ? flashcl_context_create(&ctx, device) : FLASHCL_ERROR_OUT_OF_HOST_MEMORY;
    if (st) {
        cli_errorf("rank %d: cannot create a context: %s", g_rank, ctx ? flashcl_last_error(ctx) : flashcl_last_error(NULL));
        ok = 0;
    }
    for (int i = 0; ok && i < 9; ++i)
        ok = (b[i] = upload(ctx, (i <= BV || i == BDO) ? h[i] : NULL, sizes[i])) != NULL;
    if (!all_ok(ok))
        goto done;
    flashcl_cp_stats fs, bs;
    st = flashcl_cp_attention_forward(ctx, &d, MPI_COMM_WORLD, b[BQ], b[BK], b[BV], b[BO], b[BL], 0, &fs);
    if (!st && backward)
        st = flashcl_cp_attention_backward(ctx, &d, MPI_COMM_WORLD, b[BQ], b[BK], b[BV], b[BO], b[BDO], b[BL], 0,
                                           b[BDQ], b[BDK], b[BDV], &bs);
    if (st) {
        /* Every rank has the same status and message (the library's agreement). */
        ROOT_ERROR("context-parallel attention failed (%s): %s", flashcl_status_string(st), flashcl_last_error(ctx));
        goto done;
    }
    ok = download(ctx, b[BO], h[BO], sq) == 0 && download(ctx, b[BL], h[BL], sl) == 0;
    if (backward)
        ok = ok && download(ctx, b[BDQ], h[BDQ], sq) == 0 && download(ctx, b[BDK], h[BDK], sk) == 0 &&
             download(ctx, b[BDV], h[BDV], sk) == 0;
    if (!all_ok(ok))
        goto done;
    size_t gq = (size_t)d.batch * d.seqlen_q * qrow, gk = (size_t)d.batch * d.seqlen_k * krow,
           gl = (size_t)d.batch * d.heads_q * d.seqlen_q * 4;
    size_t gsz[5] = {gq, gl, gq, gk, gk};
    for (int i = 0; i < 5; ++i)
        ok = ok && (g[i] = malloc(gsz[i] + 1)) != NULL;
    if (!all_ok(ok))
        goto done;
    if (!backward) {
        if (gather_shards(h[BO], g[0], d.batch, d.seqlen_q, qrow) || gather_shards(h[BL], g[1], d.batch * d.heads_q, d.seqlen_q, 4))
            goto done;
    } else if (gather_shards(h[BDQ], g[2], d.batch, d.seqlen_q, qrow) ||
               gather_shards(h[BDK], g[3], d.batch, d.seqlen_k, krow) ||
               gather_shards(h[BDV], g[4], d.batch, d.seqlen_k, krow)) {
        goto done;
    }
    int wrote = 1;
    if (g_rank == 0) {
        size_t lse_shape[3] = {(size_t)d.batch, (size_t)d.heads_q, (size_t)d.seqlen_q};
        if (!backward) {
            wrote = write_npy(path[OUT], in[0].dtype, in[0].shape, 4, g[0]) == 0 &&
                    (!path[LSE] || write_npy(path[LSE], NPY_FLOAT32, lse_shape, 3, g[1]) == 0);
            if (wrote)
                printf("context-parallel forward: %d ranks, %d chunk pairs on rank 0 (%d skipped), %.3f s; wrote %s\n",
                       g_size, fs.pairs_computed, fs.pairs_skipped, fs.total_s, path[OUT]);
        } else {
            wrote = write_npy(path[DQ], in[0].dtype, in[0].shape, 4, g[2]) == 0 &&
                    write_npy(path[DK], in[0].dtype, in[1].shape, 4, g[3]) == 0 &&
                    write_npy(path[DV], in[0].dtype, in[1].shape, 4, g[4]) == 0;
            if (wrote)
                printf("context-parallel backward: %d ranks, forward %.3f s, backward %.3f s; wrote %s, %s, %s\n", g_size,
                       fs.total_s, bs.total_s, path[DQ], path[DK], path[DV]);
        }
    }
    rc = all_ok(wrote) ? CLI_EXIT_OK : CLI_EXIT_FAIL;
done:
    for (int i = 0; i < 10; ++i) {
        if (b[i])
            clReleaseMemObject(b[i]);
        free(h[i]);
    }
    for (int i = 0; i < 6; ++i)
        free(g[i]);
    for (int i = 0; i < 4; ++i)
        npy_free(&in[i]);
    flashcl_context_destroy(ctx);
    return rc;
}

/* ---- bench --context-parallel ---------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct cp_shape {
    int batch, heads_q, heads_k, seqlen_q, seqlen_k, head_dim;
} cp_shape;

/* One shape and mask: validate, time P ranks, time rank 0 alone. Returns 0 when it ran and validated. */
static int bench_one(flashcl_context *ctx, const cp_shape *s, flashcl_dtype dtype, int causal, long iters,
                     long warmup) {
    flashcl_attention_desc d =
        cli_make_desc(dtype, s->batch, s->heads_q, s->heads_k, s->seqlen_q, s->seqlen_k, s->head_dim);
    d.causal = causal;
    const cp_sizes z = sizes_of(&d);
    const size_t es = z.es, qrow = z.qrow, krow = z.krow, nqe = z.nqe, nke = z.nke, sq = z.sq, sk = z.sk;
    void *q = malloc(nqe * es + 1), *k = malloc(nke * es + 1), *v = malloc(nke * es + 1);
    void *hq = malloc(sq + 1), *hk = malloc(sk + 1), *hv = malloc(sk + 1), *ho = malloc(sq + 1);
    void *go = malloc(nqe * es + 1), *so = malloc(nqe * es + 1);
    double *times = malloc(sizeof(double) * (size_t)(iters + 1)), *single = malloc(sizeof(double) * (size_t)(iters + 1));
    cl_mem b[4] = {0}, full[4] = {0};
    int rc = -1;
    int ok = q && k && v && hq && hk && hv && ho && go && so && times && single;
    if (ok) {
        /* The same global inputs on every rank (same seed), each rank's shard taken from them. */
        flashcl_ref_rng rng;
        flashcl_ref_rng_seed(&rng, 39);
        flashcl_ref_fill_normal(&rng, q, dtype, nqe, 1.0);
        flashcl_ref_fill_normal(&rng, k, dtype, nke, 1.0);
        flashcl_ref_fill_normal(&rng, v, dtype, nke, 1.0);
        ok = ok && !flashcl_cp_take_shard(q, hq, d.batch, d.seqlen_q, qrow, g_size, g_rank);
        ok = ok && !flashcl_cp_take_shard(k, hk, d.batch, d.seqlen_k, krow, g_size, g_rank);
        ok = ok && !flashcl_cp_take_shard(v, hv, d.batch, d.seqlen_k, krow, g_size, g_rank);
        b[0] = upload(ctx, hq, sq);
        b[1] = upload(ctx, hk, sk);
        b[2] = upload(ctx, hv, sk);
        b[3] = upload(ctx, NULL, sq);
        ok = b[0] && b[1] && b[2] && b[3];
    }
    if (!all_ok(ok)) {
        ROOT_ERROR("out of memory for the shape");
        goto done;
    }
    flashcl_cp_stats s0;
    flashcl_status st = FLASHCL_SUCCESS;
    for (long w = 0; w < warmup && !st; ++w)
        st = flashcl_cp_attention_forward(ctx, &d, MPI_COMM_WORLD, b[0], b[1], b[2], b[3], NULL, 0, &s0);
    double comm = 0, exposed = 0;
    for (long it = 0; it < iters && !st; ++it) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = cli_now();
        st = flashcl_cp_attention_forward(ctx, &d, MPI_COMM_WORLD, b[0], b[1], b[2], b[3], NULL, 0, &s0);
        double t = cli_now() - t0, tmax = 0, c[2] = {s0.comm_s, s0.comm_exposed_s}, csum[2];
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(c, csum, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        times[it] = tmax;
        comm += csum[0];
        exposed += csum[1];
    }
    if (st) {
        ROOT_ERROR("context-parallel forward failed (%s): %s", flashcl_status_string(st), flashcl_last_error(ctx));
        goto done;
    }
    ok = download(ctx, b[3], ho, sq) == 0;
    if (!all_ok(ok) || gather_shards(ho, go, d.batch, d.seqlen_q, qrow))
        goto done;
    /* The baseline: rank 0 alone, the whole problem, the single-device forward. */
    double err = 0;
    int valid = 1;
    if (g_rank == 0) {
        full[0] = upload(ctx, q, nqe * es);
        full[1] = upload(ctx, k, nke * es);
        full[2] = upload(ctx, v, nke * es);
        full[3] = upload(ctx, NULL, nqe * es);
        cl_command_queue queue = flashcl_context_cl_queue(ctx);
        for (long w = 0; w < warmup + iters && !st; ++w) {
            double t0 = cli_now();
            st = flashcl_attention_forward(ctx, &d, full[0], full[1], full[2], full[3], NULL, 0, NULL);
            clFinish(queue);
            if (w >= warmup)
                single[w - warmup] = cli_now() - t0;
        }
        if (st || download(ctx, full[3], so, nqe * es)) {
            cli_errorf("single-device forward failed: %s", flashcl_last_error(ctx));
            valid = 0;
        }
        for (size_t i = 0; valid && i < nqe; ++i) {
            double e = fabs(flashcl_ref_load(go, dtype, i) - flashcl_ref_load(so, dtype, i));
            if (!(e <= err))
                err = isnan(e) ? INFINITY : e;
        }
        /* Flash-attn's tolerance scale for the dtype, against |out| <= ~1 for N(0,1) inputs. */
        double tol = dtype == FLASHCL_FLOAT32 ? 1e-4 : dtype == FLASHCL_FLOAT16 ? 4e-3 : 3e-2;
        valid = valid && err <= tol;
        qsort(times, (size_t)iters, sizeof *times, cmp_double);
        qsort(single, (size_t)iters, sizeof *single, cmp_double);
        double tp = times[iters / 2], t1 = single[iters / 2];
        double flops = 4.0 * d.batch * d.heads_q * (double)d.seqlen_q * d.seqlen_k * d.head_dim * (causal ? 0.5 : 1.0);
        printf("%d,%d,%d,%d,%d,%d  %-4s %-6s P=%d  median %9.3f ms  min %9.3f ms  %8.4f TFLOP/s  | 1 rank %9.3f ms"
               "  | comm hidden %5.1f %%  scaling eff %5.1f %%  | max|cp-single| %.2g %s\n",
               d.batch, d.heads_q, d.heads_k, d.seqlen_q, d.seqlen_k, d.head_dim, cli_dtype_name(dtype),
               causal ? "causal" : "full", g_size, 1e3 * tp, 1e3 * times[0], flops / tp * 1e-12, 1e3 * t1,
               comm > 0 ? 100.0 * (1.0 - exposed / comm) : 100.0, 100.0 * t1 / (g_size * tp), err,
               valid ? "ok" : "INVALID");
        fflush(stdout);
    }
    quiet_barrier();
    MPI_Bcast(&valid, 1, MPI_INT, 0, MPI_COMM_WORLD);
    rc = valid ? 0 : -1;
done:
    for (int i = 0; i < 4; ++i) {
        if (b[i])
            clReleaseMemObject(b[i]);
        if (full[i])
            clReleaseMemObject(full[i]);
    }
    void *f[] = {q, k, v, hq, hk, hv, ho, go, so, times, single};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; ++i)
        free(f[i]);
    return rc;
}

/* The same for the backward: the forward once for out and LSE, then the
 * timed flashcl_cp_attention_backward calls; the baseline is the
 * single-device backward on rank 0 (its forward untimed). TFLOP/s counts
 * 2.5x the forward's, as `flashcl bench --backward` does. */
static int bench_one_backward(flashcl_context *ctx, const cp_shape *s, flashcl_dtype dtype, int causal, long iters,
                              long warmup) {
    flashcl_attention_desc d =
        cli_make_desc(dtype, s->batch, s->heads_q, s->heads_k, s->seqlen_q, s->seqlen_k, s->head_dim);
    d.causal = causal;
    const cp_sizes z = sizes_of(&d);
    const size_t es = z.es, qrow = z.qrow, krow = z.krow, nqe = z.nqe, nke = z.nke, sq = z.sq, sk = z.sk,
                 sl = z.sl;
    /* Host: global q k v dout, shards q k v dout dq dk dv, gathered dq dk dv, single-device dq dk dv. */
    enum { GQ, GK, GV, GDO, SQ, SK, SV, SDO, SDQ, SDK, SDV, AQ, AK, AV, BQ1, BK1, BV1, NH };
    size_t hs[NH] = {nqe * es, nke * es, nke * es, nqe * es, sq, sk, sk, sq, sq, sk, sk,
                     nqe * es, nke * es, nke * es, nqe * es, nke * es, nke * es};
    void *h[NH] = {0};
    double *times = malloc(sizeof(double) * (size_t)(iters + 1)), *single = malloc(sizeof(double) * (size_t)(iters + 1));
    int ok = times && single, rc = -1;
    for (int i = 0; i < NH; ++i)
        ok = ok && (h[i] = malloc(hs[i] + 4)) != NULL;
    /* Device: shards q k v out lse dout dq dk dv; rank 0's whole problem the same, plus scratch. */
    cl_mem b[9] = {0}, full[10] = {0};
    if (ok) {
        flashcl_ref_rng rng;
        flashcl_ref_rng_seed(&rng, 39);
        flashcl_ref_fill_normal(&rng, h[GQ], dtype, nqe, 1.0);
        flashcl_ref_fill_normal(&rng, h[GK], dtype, nke, 1.0);
        flashcl_ref_fill_normal(&rng, h[GV], dtype, nke, 1.0);
        flashcl_ref_fill_normal(&rng, h[GDO], dtype, nqe, 1.0);
        ok = ok && !flashcl_cp_take_shard(h[GQ], h[SQ], d.batch, d.seqlen_q, qrow, g_size, g_rank);
        ok = ok && !flashcl_cp_take_shard(h[GK], h[SK], d.batch, d.seqlen_k, krow, g_size, g_rank);
        ok = ok && !flashcl_cp_take_shard(h[GV], h[SV], d.batch, d.seqlen_k, krow, g_size, g_rank);
        ok = ok && !flashcl_cp_take_shard(h[GDO], h[SDO], d.batch, d.seqlen_q, qrow, g_size, g_rank);
        size_t bs[9] = {sq, sk, sk, sq, sl, sq, sq, sk, sk};
        const void *init[9] = {h[SQ], h[SK], h[SV], NULL, NULL, h[SDO], NULL, NULL, NULL};
        for (int i = 0; i < 9; ++i)
            ok = ok && (b[i] = upload(ctx, init[i], bs[i])) != NULL;
    }
    if (!all_ok(ok)) {
        ROOT_ERROR("out of memory for the shape");
        goto done;
    }
    flashcl_cp_stats s0;
    flashcl_status st = flashcl_cp_attention_forward(ctx, &d, MPI_COMM_WORLD, b[0], b[1], b[2], b[3], b[4], 0, &s0);
    for (long w = 0; w < warmup && !st; ++w)
        st = flashcl_cp_attention_backward(ctx, &d, MPI_COMM_WORLD, b[0], b[1], b[2], b[3], b[5], b[4], 0, b[6], b[7],
                                           b[8], &s0);
    double comm = 0, exposed = 0;
    for (long it = 0; it < iters && !st; ++it) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = cli_now();
        st = flashcl_cp_attention_backward(ctx, &d, MPI_COMM_WORLD, b[0], b[1], b[2], b[3], b[5], b[4], 0, b[6], b[7],
                                           b[8], &s0);
        double t = cli_now() - t0, tmax = 0, c[2] = {s0.comm_s, s0.comm_exposed_s}, csum[2];
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(c, csum, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        times[it] = tmax;
        comm += csum[0];
        exposed += csum[1];
    }
    if (st) {
        ROOT_ERROR("context-parallel backward failed (%s): %s", flashcl_status_string(st), flashcl_last_error(ctx));
        goto done;
    }
    ok = download(ctx, b[6], h[SDQ], sq) == 0 && download(ctx, b[7], h[SDK], sk) == 0 &&
         download(ctx, b[8], h[SDV], sk) == 0;
    if (!all_ok(ok) || gather_shards(h[SDQ], h[AQ], d.batch, d.seqlen_q, qrow) ||
        gather_shards(h[SDK], h[AK], d.batch, d.seqlen_k, krow) || gather_shards(h[SDV], h[AV], d.batch, d.seqlen_k, krow))
        goto done;
    int valid = 1;
    if (g_rank == 0) {
        size_t scratch = 0;
        st = flashcl_attention_backward_scratch_size(ctx, &d, NULL, &scratch);
        size_t fs[10] = {nqe * es, nke * es, nke * es, nqe * es, (size_t)d.batch * d.heads_q * d.seqlen_q * 4,
                         nqe * es, nqe * es, nke * es, nke * es, scratch};
        const void *init[10] = {h[GQ], h[GK], h[GV], NULL, NULL, h[GDO], NULL, NULL, NULL, NULL};
        for (int i = 0; i < 10; ++i)
            valid = valid && (full[i] = upload(ctx, init[i], fs[i])) != NULL;
        cl_command_queue queue = flashcl_context_cl_queue(ctx);
        if (!st && valid)
            st = flashcl_attention_forward(ctx, &d, full[0], full[1], full[2], full[3], full[4], 0, NULL);
        for (long w = 0; valid && w < warmup + iters && !st; ++w) {
            clFinish(queue);
            double t0 = cli_now();
            st = flashcl_attention_backward(ctx, &d, NULL, full[0], full[1], full[2], full[3], full[5], full[4], 0,
                                            full[6], full[7], full[8], full[9], NULL);
            clFinish(queue);
            if (w >= warmup)
                single[w - warmup] = cli_now() - t0;
        }
        if (!valid || st || download(ctx, full[6], h[BQ1], nqe * es) || download(ctx, full[7], h[BK1], nke * es) ||
            download(ctx, full[8], h[BV1], nke * es)) {
            cli_errorf("single-device backward failed: %s", flashcl_last_error(ctx));
            valid = 0;
        }
        double err = 0;
        size_t counts[3] = {nqe, nke, nke};
        for (int t = 0; valid && t < 3; ++t)
            for (size_t i = 0; i < counts[t]; ++i) {
                double e = fabs(flashcl_ref_load(h[AQ + t], dtype, i) - flashcl_ref_load(h[BQ1 + t], dtype, i));
                if (!(e <= err))
                    err = isnan(e) ? INFINITY : e;
            }
        double tol = dtype == FLASHCL_FLOAT32 ? 1e-4 : dtype == FLASHCL_FLOAT16 ? 8e-3 : 6e-2;
        valid = valid && err <= tol;
        qsort(times, (size_t)iters, sizeof *times, cmp_double);
        qsort(single, (size_t)iters, sizeof *single, cmp_double);
        double tp = times[iters / 2], t1 = single[iters / 2];
        double flops = 2.5 * 4.0 * d.batch * d.heads_q * (double)d.seqlen_q * d.seqlen_k * d.head_dim *
                       (causal ? 0.5 : 1.0);
        printf("%d,%d,%d,%d,%d,%d  %-4s %-6s P=%d  backward median %9.3f ms  min %9.3f ms  %8.4f TFLOP/s  | 1 rank "
               "%9.3f ms  | comm hidden %5.1f %%  scaling eff %5.1f %%  | max|cp-single| %.2g %s\n",
               d.batch, d.heads_q, d.heads_k, d.seqlen_q, d.seqlen_k, d.head_dim, cli_dtype_name(dtype),
               causal ? "causal" : "full", g_size, 1e3 * tp, 1e3 * times[0], flops / tp * 1e-12, 1e3 * t1,
               comm > 0 ? 100.0 * (1.0 - exposed / comm) : 100.0, 100.0 * t1 / (g_size * tp), err,
               valid ? "ok" : "INVALID");
        fflush(stdout);
    }
    quiet_barrier();
    MPI_Bcast(&valid, 1, MPI_INT, 0, MPI_COMM_WORLD);
    rc = valid ? 0 : -1;
done:
    for (int i = 0; i < 10; ++i) {
        if (i < 9 && b[i])
            clReleaseMemObject(b[i]);
        if (full[i])
            clReleaseMemObject(full[i]);
    }
    for (int i = 0; i < NH; ++i)
        free(h[i]);
    free(times);
    free(single);
    return rc;
}

static int bench_cp(int argc, char **argv) {
    cp_shape shapes[16];
    int nshapes = 0, want_causal = -1, backward = 0;
    long iters = 5, warmup = 1;
    flashcl_dtype dtype = FLASHCL_FLOAT32;
    const char *device = NULL, *value;
    for (int i = 2; i < argc; ++i) {
        int r;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (g_rank == 0)
                fputs(cli_usage_bench_cp, stdout);
            return CLI_EXIT_OK;
        } else if (strcmp(argv[i], "--context-parallel") == 0) {
        } else if (strcmp(argv[i], "--causal") == 0) {
            want_causal = 1;
        } else if (strcmp(argv[i], "--no-causal") == 0) {
            want_causal = 0;
        } else if (strcmp(argv[i], "--backward") == 0) {
            backward = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--shape", &value)) != 0) {
            long x[6];
            int n = 0;
            if (r < 0 || cli_parse_long_list(value, 1, INT_MAX, x, 6, &n) != 0 || (n != 4 && n != 6) || nshapes == 16) {
                ROOT_ERROR("--shape wants B,H,N,D or B,Hq,Hk,Nq,Nk,D (at most 16), not '%s'", r < 0 ? "" : value);
                return CLI_EXIT_USAGE;
            }
            shapes[nshapes++] = n == 4 ? (cp_shape){(int)x[0], (int)x[1], (int)x[1], (int)x[2], (int)x[2], (int)x[3]}
                                       : (cp_shape){(int)x[0], (int)x[1], (int)x[2], (int)x[3], (int)x[4], (int)x[5]};
        } else if ((r = cli_take_value(argc, argv, &i, "--dtype", &value)) != 0) {
            if (r < 0 || cli_parse_dtype(value, &dtype) != 0) {
                ROOT_ERROR("--dtype wants f16, bf16 or f32");
                return CLI_EXIT_USAGE;
            }
        } else if ((r = cli_take_value(argc, argv, &i, "--iters", &value)) != 0) {
            if (r < 0 || cli_parse_long(value, 1, 100000, &iters) != 0) {
                ROOT_ERROR("--iters wants 1..100000");
                return CLI_EXIT_USAGE;
            }
        } else if ((r = cli_take_value(argc, argv, &i, "--warmup", &value)) != 0) {
            if (r < 0 || cli_parse_long(value, 0, 100000, &warmup) != 0) {
                ROOT_ERROR("--warmup wants 0..100000");
                return CLI_EXIT_USAGE;
            }
        } else if ((r = cli_take_value(argc, argv, &i, "--device", &device)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else {
            ROOT_ERROR("unknown option '%s' for 'flashcl bench --context-parallel'", argv[i]);
            return CLI_EXIT_USAGE;
        }
    }
    if (!nshapes)
        shapes[nshapes++] = (cp_shape){1, 8, 8, 1024, 1024, 64};
    flashcl_context *ctx = NULL;
    flashcl_status st = flashcl_context_create(&ctx, device);
    if (st)
        cli_errorf("rank %d: cannot create a context: %s", g_rank, flashcl_last_error(NULL));
    if (!all_ok(st == FLASHCL_SUCCESS)) {
        flashcl_context_destroy(ctx);
        return CLI_EXIT_FAIL;
    }
    if (g_rank == 0)
        printf("flashcl bench --context-parallel: %d ranks, device of rank 0: %s\n"
               "wall clock (CPU timer), median of %ld after %ld warm-up; 1 rank = the single-device %s on rank 0\n",
               g_size, flashcl_context_device_name(ctx), iters, warmup, backward ? "backward" : "forward");
    int failures = 0;
    for (int i = 0; i < nshapes; ++i)
        for (int c = 0; c < 2; ++c)
            if (want_causal < 0 || want_causal == c)
                failures += (backward ? bench_one_backward(ctx, &shapes[i], dtype, c, iters, warmup)
                                      : bench_one(ctx, &shapes[i], dtype, c, iters, warmup)) != 0;
    flashcl_context_destroy(ctx);
    return failures ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* ---- entry ------------------------------------------------------------------------------ */

int cli_context_parallel(int argc, char **argv, int bench) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized && MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        cli_errorf("MPI_Init failed");
        return CLI_EXIT_FAIL;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    int rc = bench ? bench_cp(argc, argv) : attention_cp(argc, argv);
    MPI_Finalize();
    return rc;
}
