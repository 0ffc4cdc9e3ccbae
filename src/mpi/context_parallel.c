/* context_parallel.c: ring (context-parallel) attention over MPI, forward and backward (include/flashcl_mpi.h). */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashcl_mpi.h"
#include "internal.h" /* flashcl_fail, flashcl_check_buffer, flashcl_host_load/store */

/* ---- the zigzag layout ------------------------------------------------------ */

/* First global row of chunk c (0 .. 2P) of a sequence of n rows. */
static int64_t chunk_start(int n, int p, int c) {
    return (int64_t)c * n / (2 * (int64_t)p);
}

static int64_t chunk_len(int n, int p, int c) {
    return chunk_start(n, p, c + 1) - chunk_start(n, p, c);
}

int flashcl_cp_local_len(int seqlen, int nranks, int rank) {
    if (seqlen < 0 || nranks < 1 || rank < 0 || rank >= nranks)
        return -1;
    return (int)(chunk_len(seqlen, nranks, rank) + chunk_len(seqlen, nranks, 2 * nranks - 1 - rank));
}

int flashcl_cp_global_row(int seqlen, int nranks, int rank, int local_row) {
    int n = flashcl_cp_local_len(seqlen, nranks, rank);
    if (n < 0 || local_row < 0 || local_row >= n)
        return -1;
    int64_t first = chunk_len(seqlen, nranks, rank);
    if (local_row < first)
        return (int)(chunk_start(seqlen, nranks, rank) + local_row);
    return (int)(chunk_start(seqlen, nranks, 2 * nranks - 1 - rank) + (local_row - first));
}

/* A run of rows of one rank's shard: global first row, local first row, length. */
typedef struct seg {
    int64_t gstart;
    int lstart, len;
} seg;

/* The non-empty runs of rank's shard: its two chunks when the mask needs the
 * global positions, else the whole shard as one run (gstart unused). */
static int shard_segments(int n, int p, int rank, int split, seg out[2]) {
    int count = 0, local = 0;
    if (!split) {
        int len = flashcl_cp_local_len(n, p, rank);
        if (len > 0)
            out[count++] = (seg){0, 0, len};
        return count;
    }
    int chunks[2] = {rank, 2 * p - 1 - rank};
    for (int i = 0; i < 2; ++i) {
        int len = (int)chunk_len(n, p, chunks[i]);
        if (len > 0)
            out[count++] = (seg){chunk_start(n, p, chunks[i]), local, len};
        local += len;
    }
    return count;
}

/* ---- one problem on every rank ---------------------------------------------- */

typedef struct cp_problem {
    flashcl_attention_desc g; /* the global desc, resolved                      */
    int masked;               /* a right-hand bound (causal or window_right >= 0) */
    int rank, nranks;
    int nq;                   /* this rank's query rows                          */
    size_t es;                /* element size                                    */
    size_t qrow, krow;        /* elements of one row: heads * head_dim           */
} cp_problem;

/* The sub-problem of query run qs against key run ks of a block whose shard
 * holds nk_block rows, for flashcl's single-device calls. Keys past the last
 * one the run's last row sees are cut off (*klen), which keeps the window's
 * right side >= 0, the only way flashcl's window fields can say it (a negative
 * side means unbounded). Returns 0 when the mask hides the pair entirely. */
static int pair_desc(const cp_problem *p, const seg *qs, const seg *ks, int nk_block,
                     flashcl_attention_desc *sub, int *klen) {
    int lq = qs->len, lk = ks->len;
    if (lq <= 0 || lk <= 0)
        return 0;
    *sub = p->g;
    sub->causal = 0;
    sub->windowed = 0;
    sub->window_left = sub->window_right = -1;
    if (p->masked) {
        int64_t shift = (int64_t)p->g.seqlen_k - p->g.seqlen_q;
        int64_t last_key = qs->gstart + lq - 1 + shift + p->g.window_right; /* the last row's last key */
        int64_t kend = ks->gstart + lk;
        if (last_key + 1 < kend)
            kend = last_key + 1;
        if (kend <= ks->gstart)
            return 0;
        lk = (int)(kend - ks->gstart);
        /* Global j <= i + shift + wr becomes local j' <= i' + (lk - lq) + wr'. */
        int64_t wr = p->g.window_right + (qs->gstart - ks->gstart) + shift - ((int64_t)lk - lq);
        if (wr < 0 || wr > INT_MAX)
            return 0; /* cannot happen after the cut (the last row sees key lk-1) */
        sub->windowed = 1;
        sub->window_right = (int)wr;
    }
    *klen = lk;
    sub->seqlen_q = lq;
    sub->seqlen_k = lk;
    size_t qd = p->qrow, kd = p->krow;
    sub->q = (flashcl_layout){p->g.q.offset + (size_t)qs->lstart * qd, (size_t)p->nq * qd, qd, (size_t)p->g.head_dim};
    sub->k = (flashcl_layout){(size_t)ks->lstart * kd, (size_t)nk_block * kd, kd, (size_t)p->g.head_dim};
    sub->v = sub->k;
    sub->out = (flashcl_layout){0, 0, 0, 0}; /* the caller sets it */
    return 1;
}

/* Fields the ranks must agree on, in the order messages name them. */
enum { F_STATUS, F_OP, F_DTYPE, F_BATCH, F_HQ, F_HK, F_SQ, F_SK, F_D, F_CAUSAL, F_WINDOWED, F_WL, F_WR,
       F_SCALE, F_SOFTCAP, F_COUNT };
static const char *const field_names[F_COUNT] = {
    "status", "operation", "dtype", "batch", "heads_q", "heads_k", "seqlen_q", "seqlen_k", "head_dim",
    "causal", "windowed", "window_left", "window_right", "scale (bits)", "softcap (bits)"};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static flashcl_status mpi_fail(flashcl_context *ctx, int err, const char *what) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "error %d", err);
    return flashcl_fail(ctx, FLASHCL_ERROR_MPI, "context-parallel: %s failed: %s", what, text);
}

/* The agreement: every rank's fields and local status, reduced to each
 * field's smallest and largest value with the ranks holding them (MINLOC,
 * MAXLOC: fixed sizes, nothing to allocate), checked the same way on each
 * rank, so every rank returns the same status and message. local_msg is this
 * rank's own reason when its status is not 0. */
static flashcl_status agree(flashcl_context *ctx, MPI_Comm comm, int rank, const int64_t mine[F_COUNT],
                            const char *local_msg) {
    int in[2 * F_COUNT], lo[2 * F_COUNT], hi[2 * F_COUNT];
    for (int f = 0; f < F_COUNT; ++f) {
        in[2 * f] = (int)(int32_t)(uint32_t)mine[f]; /* every field fits 32 bits (scale: its bits) */
        in[2 * f + 1] = rank;
    }
    int err = MPI_Allreduce(in, lo, F_COUNT, MPI_2INT, MPI_MINLOC, comm);
    if (err == MPI_SUCCESS)
        err = MPI_Allreduce(in, hi, F_COUNT, MPI_2INT, MPI_MAXLOC, comm);
    if (err != MPI_SUCCESS)
        return mpi_fail(ctx, err, "MPI_Allreduce of the problem");
    /* Disagreements first: they explain most local failures too. */
    for (int f = F_OP; f < F_COUNT; ++f) {
        if (lo[2 * f] == hi[2 * f])
            continue;
        flashcl_status code = f == F_DTYPE                      ? FLASHCL_ERROR_DTYPE_MISMATCH
                              : (f >= F_BATCH && f <= F_D)       ? FLASHCL_ERROR_INVALID_SHAPE
                                                                 : FLASHCL_ERROR_INVALID_ARGUMENT;
        if (f == F_OP)
            return flashcl_fail(ctx, code, "context-parallel: rank %d called the forward, rank %d the backward",
                                lo[2 * f + 1], hi[2 * f + 1]);
        return flashcl_fail(ctx, code, "context-parallel: ranks disagree on %s: rank %d has %d, rank %d has %d",
                            field_names[f], lo[2 * f + 1], lo[2 * f], hi[2 * f + 1], hi[2 * f]);
    }
    /* Statuses are <= 0: the smallest is a failure, named by its rank, whose
     * message every rank then receives (one broadcast, from that rank). */
    if (lo[0] != 0) {
        char text[512];
        snprintf(text, sizeof text, "%s", lo[1] == rank ? local_msg : "");
        err = MPI_Bcast(text, (int)sizeof text, MPI_CHAR, lo[1], comm);
        if (err != MPI_SUCCESS)
            return mpi_fail(ctx, err, "MPI_Bcast of a rank's failure");
        return flashcl_fail(ctx, lo[0], "context-parallel: rank %d: %s", lo[1], text);
    }
    return FLASHCL_SUCCESS;
}

/* A failure during the ring, shared at the end of each step: the lowest
 * status (with its rank) wins everywhere. */
static flashcl_status share_status(flashcl_context *ctx, MPI_Comm comm, int rank, flashcl_status local, int step,
                                   char *local_msg) {
    int in[2] = {local, rank}, out[2];
    int err = MPI_Allreduce(in, out, 1, MPI_2INT, MPI_MINLOC, comm);
    if (err != MPI_SUCCESS)
        return mpi_fail(ctx, err, "MPI_Allreduce of the step's status");
    if (out[0] == 0)
        return FLASHCL_SUCCESS;
    char where[32] = "set-up";
    if (step >= 0)
        snprintf(where, sizeof where, "ring step %d", step);
    if (out[1] == rank)
        return flashcl_fail(ctx, out[0], "context-parallel: rank %d, %s: %s", rank, where, local_msg);
    return flashcl_fail(ctx, out[0], "context-parallel: rank %d failed at %s: %s", out[1], where,
                        flashcl_status_string(out[0]));
}

/* Non-blocking messages of any size: pieces of at most 1 GiB (MPI counts are int). */
#define MAX_REQS 256
typedef struct reqs {
    MPI_Request r[MAX_REQS];
    int n;
} reqs;

static int post(reqs *q, int is_recv, void *buf, size_t bytes, int peer, int tag, MPI_Comm comm) {
    const size_t piece = (size_t)1 << 30;
    char *c = buf;
    for (size_t done = 0; done < bytes; done += piece) {
        size_t n = bytes - done < piece ? bytes - done : piece;
        if (q->n == MAX_REQS)
            return MPI_ERR_COUNT;
        int err = is_recv ? MPI_Irecv(c + done, (int)n, MPI_BYTE, peer, tag, comm, &q->r[q->n])
                          : MPI_Isend(c + done, (int)n, MPI_BYTE, peer, tag, comm, &q->r[q->n]);
        if (err != MPI_SUCCESS)
            return err;
        q->n++;
    }
    return MPI_SUCCESS;
}

/* Waits for the step's kernels (a marker event) and its messages together,
 * polling both, and books how long each took and how much of the messages'
 * time outlasted the kernels. Returns an MPI error or MPI_SUCCESS; *cl_status
 * gets the marker's final status. */
static int wait_step(cl_event marker, reqs *q, double t0, flashcl_cp_stats *s, cl_int *cl_status) {
    int cdone = marker == NULL, mdone = q->n == 0;
    double tc = t0, tm = t0;
    *cl_status = CL_SUCCESS;
    while (!cdone || !mdone) {
        if (!cdone) {
            cl_int es = CL_COMPLETE;
            cl_int err = clGetEventInfo(marker, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof es, &es, NULL);
            if (err != CL_SUCCESS || es <= CL_COMPLETE) {
                cdone = 1;
                tc = now_s();
                *cl_status = err != CL_SUCCESS ? err : es;
            }
        }
        if (!mdone) {
            int flag = 0;
            int err = MPI_Testall(q->n, q->r, &flag, MPI_STATUSES_IGNORE);
            if (err != MPI_SUCCESS)
                return err;
            if (flag) {
                mdone = 1;
                tm = now_s();
            }
        }
        if (!cdone || !mdone) {
            /* Short naps: the device (PoCL: CPU threads) needs the cores. */
            struct timespec nap = {0, 20000};
            nanosleep(&nap, NULL);
        }
    }
    s->compute_s += tc - t0;
    if (q->n) {
        s->comm_s += tm - t0;
        if (tm > tc)
            s->comm_exposed_s += tm - tc;
    }
    q->n = 0;
    return MPI_SUCCESS;
}

static cl_mem make_buffer(flashcl_context *ctx, size_t bytes, flashcl_status *st) {
    cl_int err = CL_SUCCESS;
    cl_mem b = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE, bytes ? bytes : 4, NULL, &err);
    if (!b && !*st)
        *st = flashcl_fail(ctx, err, "context-parallel: clCreateBuffer of %zu bytes failed (%s)", bytes,
                           flashcl_status_string(err));
    return b;
}

static void release(cl_mem *b, int n) {
    for (int i = 0; i < n; ++i)
        if (b[i])
            clReleaseMemObject(b[i]);
}

/* Checks shared by both directions, on this rank alone: fills p, returns a
 * status and a message. */
static flashcl_status local_checks(flashcl_context *ctx, const flashcl_attention_desc *desc, MPI_Comm comm, int op,
                                   cp_problem *p, int64_t fields[F_COUNT], char *msg, size_t msg_size) {
    memset(p, 0, sizeof *p);
    memset(fields, 0, sizeof(int64_t) * F_COUNT);
    fields[F_OP] = op;
    MPI_Comm_rank(comm, &p->rank);
    MPI_Comm_size(comm, &p->nranks);
    if (!desc) {
        snprintf(msg, msg_size, "desc is NULL");
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    }
    fields[F_DTYPE] = desc->dtype;
    fields[F_BATCH] = desc->batch;
    fields[F_HQ] = desc->heads_q;
    fields[F_HK] = desc->heads_k;
    fields[F_SQ] = desc->seqlen_q;
    fields[F_SK] = desc->seqlen_k;
    fields[F_D] = desc->head_dim;
    fields[F_CAUSAL] = desc->causal != 0;
    fields[F_WINDOWED] = desc->windowed != 0;
    fields[F_WL] = desc->windowed ? desc->window_left : 0;
    fields[F_WR] = desc->windowed ? desc->window_right : 0;
    uint32_t bits;
    memcpy(&bits, &desc->scale, 4);
    fields[F_SCALE] = bits;
    memcpy(&bits, &desc->softcap, 4);
    fields[F_SOFTCAP] = bits;
    if (!ctx || flashcl_context_is_host(ctx)) {
        snprintf(msg, msg_size, "%s", ctx ? "a host context has no cl_mem buffers" : "ctx is NULL");
        return ctx ? FLASHCL_ERROR_UNSUPPORTED : FLASHCL_ERROR_INVALID_ARGUMENT;
    }
    const flashcl_layout *ls[4] = {&desc->q, &desc->k, &desc->v, &desc->out};
    for (int i = 0; i < 4; ++i)
        if (ls[i]->stride_batch || ls[i]->stride_seq || ls[i]->stride_head) {
            snprintf(msg, msg_size, "shards are packed: q, k, v and out take offsets only (strides 0)");
            return FLASHCL_ERROR_INVALID_ARGUMENT;
        }
    if (flashcl_dtype_is_fp8(desc->dtype)) { /* the dense resolve takes FP8, for the one-device forward only */
        snprintf(msg, msg_size, "float8 tensors are not taken by the context-parallel calls in this version");
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    }
    p->g = *desc;
    flashcl_status st = flashcl_attention_desc_resolve(&p->g);
    if (st) {
        snprintf(msg, msg_size, "%s", flashcl_last_error(ctx)[0] ? flashcl_last_error(ctx) : flashcl_status_string(st));
        return st;
    }
    if (p->g.window_left >= 0) {
        snprintf(msg, msg_size, "a window bounded on the left (window_left %d) is not supported", p->g.window_left);
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    }
    p->masked = p->g.window_right >= 0;
    p->nq = flashcl_cp_local_len(p->g.seqlen_q, p->nranks, p->rank);
    p->es = flashcl_dtype_size(p->g.dtype);
    p->qrow = (size_t)p->g.heads_q * (size_t)p->g.head_dim;
    p->krow = (size_t)p->g.heads_k * (size_t)p->g.head_dim;
    return FLASHCL_SUCCESS;
}

/* The buffer checks, with flashcl's own message kept for the agreement. */
static flashcl_status check_buf(flashcl_context *ctx, const char *name, cl_mem b, size_t bytes, char *msg,
                                size_t msg_size) {
    /* A rank may hold no rows (seqlen < 2P): its buffer must still exist. */
    flashcl_status st = flashcl_check_buffer(ctx, name, b, bytes ? bytes : 1);
    if (st)
        snprintf(msg, msg_size, "%s", flashcl_last_error(ctx));
    return st;
}

static size_t shard_bytes(const cp_problem *p, int rows, size_t row, size_t offset) {
    return (offset + (size_t)p->g.batch * (size_t)rows * row) * p->es;
}

/* Copies a run's packed [batch*heads][len] LSE rows to or from a shard's
 * [batch*heads][nq] rows (at element base + s->lstart). */
static cl_int lse_rect(cl_command_queue q, cl_mem seg_buf, cl_mem shard, size_t base, const seg *s, int nq,
                       size_t rows, int to_shard) {
    size_t seg_origin[3] = {0, 0, 0}, shard_origin[3] = {(base + (size_t)s->lstart) * 4, 0, 0};
    size_t region[3] = {(size_t)s->len * 4, rows, 1};
    size_t seg_pitch = (size_t)s->len * 4, shard_pitch = (size_t)nq * 4;
    if (to_shard)
        return clEnqueueCopyBufferRect(q, seg_buf, shard, seg_origin, shard_origin, region, seg_pitch, 0,
                                       shard_pitch, 0, 0, NULL, NULL);
    return clEnqueueCopyBufferRect(q, shard, seg_buf, shard_origin, seg_origin, region, shard_pitch, 0, seg_pitch, 0,
                                   0, NULL, NULL);
}

/* ---- forward ---------------------------------------------------------------- */

/* The host merge (f16/bf16): the float32 accumulators of one run, (o, l) in
 * [batch][nq][heads][dim] and [batch][heads][nq], take in a partial result
 * (o2 in dtype [batch][len][heads][dim], l2 float [batch][heads][len]) by
 * flashcl_attention_merge's rule. Keeping these sums in float32 rounds the
 * output once, where merging on the device in the storage type would round
 * it once a pair (measured: up to 2 f16 ulps over the single-device result
 * at P = 4, past flash-attn's tolerance now and then). */
static void host_merge(float *o, float *l, const void *o2, const float *l2, const seg *qs, int nq, int batch,
                       int heads, int dim, flashcl_dtype dtype) {
    for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads; ++h)
            for (int i = 0; i < qs->len; ++i) {
                float *li = &l[((size_t)b * heads + h) * nq + qs->lstart + i];
                float lb = l2[((size_t)b * heads + h) * qs->len + i];
                if (lb == -INFINITY)
                    continue; /* the partial saw no key */
                float m = *li > lb ? *li : lb;
                float w1 = *li == -INFINITY ? 0.0f : expf(*li - m), w2 = expf(lb - m), inv = 1.0f / (w1 + w2);
                float *oi = o + (((size_t)b * nq + qs->lstart + i) * heads + h) * dim;
                size_t src = (((size_t)b * qs->len + i) * heads + h) * dim;
                for (int d = 0; d < dim; ++d)
                    oi[d] = (w1 * oi[d] + w2 * flashcl_host_load(o2, dtype, src + d)) * inv;
                *li = m + logf(w1 + w2);
            }
}

/* This rank's own K and V shard (nk rows) read into host, K then V, for its
 * first trip around the ring; non-blocking: the caller finishes the queue. */
static cl_int stage_own_block(cl_command_queue queue, const cp_problem *p, int nk, cl_mem k, cl_mem v,
                              char *host) {
    const size_t own = (size_t)p->g.batch * (size_t)nk * p->krow * p->es;
    if (!own)
        return CL_SUCCESS;
    cl_int err = clEnqueueReadBuffer(queue, k, CL_FALSE, p->g.k.offset * p->es, own, host, 0, NULL, NULL);
    return err | clEnqueueReadBuffer(queue, v, CL_FALSE, p->g.v.offset * p->es, own, host + own, 0, NULL, NULL);
}

/* The end of a ring step: its kernels (a marker event polled with its
 * messages, so that the time spent waiting on communication is told apart
 * from compute; without one, after a failed enqueue, the queue is finished)
 * and its messages (unless merr already failed). Returns the MPI status; *cls:
 * the kernels' execution status. */
static int finish_step(cl_command_queue queue, int enqueued, int merr, reqs *rq, double t0, flashcl_cp_stats *s,
                       cl_int *cls) {
    cl_event marker = NULL;
    clFlush(queue);
    if (enqueued && clEnqueueMarkerWithWaitList(queue, 0, NULL, &marker) != CL_SUCCESS)
        marker = NULL;
    clFlush(queue);
    if (merr == MPI_SUCCESS)
        merr = wait_step(marker, rq, t0, s, cls);
    if (marker)
        clReleaseEvent(marker);
    else
        clFinish(queue);
    return merr;
}

/* One ring step's K/V block, the same in the forward and the backward: unless
 * it is the last step, the next block's receive from the left and this one's
 * send to the right are posted, to overlap the step's attention; after the
 * first step the block received into host[step & 1] is uploaded into dk/dv,
 * which are attended instead of the rank's own k and v (*kb, *vb at *koff,
 * *voff). Returns the MPI status; an upload failure goes to *lst. */
static int ring_step_kv(const cp_problem *p, flashcl_context *ctx, MPI_Comm comm, int step, reqs *rq,
                        char *host[2], cl_mem k, cl_mem v, cl_mem dk, cl_mem dv, flashcl_cp_stats *s, cl_mem *kb,
                        cl_mem *vb, size_t *koff, size_t *voff, flashcl_status *lst) {
    const int P = p->nranks, rank = p->rank, cur = step & 1;
    const int src = (rank - step + P) % P, next_src = (rank - step - 1 + P) % P;
    const size_t row = (size_t)p->g.batch * p->krow * p->es;
    const size_t blk = row * (size_t)flashcl_cp_local_len(p->g.seqlen_k, P, src);
    int merr = MPI_SUCCESS;
    if (step < P - 1) {
        size_t nblk = row * (size_t)flashcl_cp_local_len(p->g.seqlen_k, P, next_src);
        merr = post(rq, 1, host[cur ^ 1], 2 * nblk, (rank + P - 1) % P, 39, comm);
        if (merr == MPI_SUCCESS)
            merr = post(rq, 0, host[cur], 2 * blk, (rank + 1) % P, 39, comm);
        s->bytes_sent += (double)(2 * blk);
    }
    *kb = k, *vb = v;
    *koff = p->g.k.offset, *voff = p->g.v.offset;
    if (step > 0) {
        cl_command_queue queue = flashcl_context_cl_queue(ctx);
        *kb = dk, *vb = dv;
        *koff = *voff = 0;
        if (blk) {
            cl_int err = clEnqueueWriteBuffer(queue, dk, CL_FALSE, 0, blk, host[cur], 0, NULL, NULL);
            err |= clEnqueueWriteBuffer(queue, dv, CL_FALSE, 0, blk, host[cur] + blk, 0, NULL, NULL);
            if (err != CL_SUCCESS)
                *lst = flashcl_fail(ctx, err, "uploading block %d failed", src);
        }
    }
    return merr;
}

flashcl_status flashcl_cp_attention_forward(flashcl_context *ctx, const flashcl_attention_desc *desc, MPI_Comm comm,
                                            cl_mem q, cl_mem k, cl_mem v, cl_mem out, cl_mem lse,
                                            size_t lse_offset, flashcl_cp_stats *stats) {
    double t_start = now_s();
    flashcl_cp_stats s;
    memset(&s, 0, sizeof s);
    cp_problem p;
    int64_t fields[F_COUNT];
    char msg[1024] = "";
    flashcl_status st = local_checks(ctx, desc, comm, 1, &p, fields, msg, sizeof msg);
    int nk = 0;
    if (!st) {
        nk = flashcl_cp_local_len(p.g.seqlen_k, p.nranks, p.rank);
        size_t rows_lse = (size_t)p.g.batch * (size_t)p.g.heads_q;
        /* The first failure is kept, with its message. */
        (void)((st = check_buf(ctx, "q", q, shard_bytes(&p, p.nq, p.qrow, p.g.q.offset), msg, sizeof msg)) ||
            (st = check_buf(ctx, "k", k, shard_bytes(&p, nk, p.krow, p.g.k.offset), msg, sizeof msg)) ||
            (st = check_buf(ctx, "v", v, shard_bytes(&p, nk, p.krow, p.g.v.offset), msg, sizeof msg)) ||
            (st = check_buf(ctx, "out", out, shard_bytes(&p, p.nq, p.qrow, p.g.out.offset), msg, sizeof msg)) ||
            (lse && (st = check_buf(ctx, "lse", lse, (lse_offset + rows_lse * (size_t)p.nq) * 4, msg, sizeof msg))));
    }
    fields[F_STATUS] = st;
    /* Even without a context this rank takes part, or the others would wait
     * for it; its message then goes where flashcl_last_error(NULL) reads it. */
    if ((st = agree(ctx, comm, p.rank, fields, msg)) != FLASHCL_SUCCESS)
        return st;

    const int P = p.nranks, rank = p.rank;
    cl_command_queue queue = flashcl_context_cl_queue(ctx);
    const size_t B = (size_t)p.g.batch, HQ = (size_t)p.g.heads_q;
    int nk_max = 0;
    for (int r = 0; r < P; ++r) {
        int n = flashcl_cp_local_len(p.g.seqlen_k, P, r);
        nk_max = n > nk_max ? n : nk_max;
    }
    seg qsegs[2];
    int nqseg = shard_segments(p.g.seqlen_q, P, rank, p.masked, qsegs);
    int qmax = 0;
    for (int i = 0; i < nqseg; ++i)
        qmax = qsegs[i].len > qmax ? qsegs[i].len : qmax;
    size_t kv_elems = B * (size_t)nk_max * p.krow; /* one of K or V of the largest block */
    size_t kv_bytes = kv_elems * p.es;
    char *host[2] = {malloc(2 * kv_bytes + 1), malloc(2 * kv_bytes + 1)};
    /* Device buffers: the received block's K and V, the output accumulator,
     * each run's LSE accumulator (ping-pong: merge's lse_out must not be its
     * input), and one partial (O, LSE) for the run being computed. */
    enum { DK, DV, OACC, OTMP, LTMP, L00, L01, L10, L11, PO0, PL0 = PO0 + 4, NBUF = PL0 + 4 };
    /* f16/bf16 merge on the host in float32 (host_merge): each pair of a step
     * gets its own partial buffers, read back and merged after the step. */
    const int on_host = p.g.dtype != FLASHCL_FLOAT32;
    const size_t part_o = B * (size_t)qmax * p.qrow * p.es, part_l = B * HQ * (size_t)qmax * 4;
    float *hacc_o = NULL, *hacc_l = NULL;
    char *hpart = NULL;
    if (on_host) {
        hacc_o = calloc(B * (size_t)p.nq * p.qrow + 1, 4);
        hacc_l = malloc((B * HQ * (size_t)p.nq + 1) * 4);
        hpart = malloc(4 * (part_o + part_l) + 1);
        if (!hacc_o || !hacc_l || !hpart)
            st = flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "context-parallel: out of host memory");
        for (size_t i = 0; hacc_l && i < B * HQ * (size_t)p.nq; ++i)
            hacc_l[i] = -INFINITY;
    }
    cl_mem b[NBUF] = {0};
    if (!host[0] || !host[1])
        st = flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "context-parallel: out of host memory");
    if (!st) {
        b[DK] = make_buffer(ctx, kv_bytes, &st);
        b[DV] = make_buffer(ctx, kv_bytes, &st);
        b[OACC] = make_buffer(ctx, B * (size_t)p.nq * p.qrow * p.es, &st);
        b[OTMP] = make_buffer(ctx, B * (size_t)qmax * p.qrow * p.es, &st);
        b[LTMP] = make_buffer(ctx, B * HQ * (size_t)qmax * 4, &st);
        for (int i = 0; i < nqseg && !on_host; ++i)
            for (int j = 0; j < 2; ++j)
                b[L00 + 2 * i + j] = make_buffer(ctx, B * HQ * (size_t)qsegs[i].len * 4, &st);
        for (int i = 0; i < 4 && on_host; ++i) {
            b[PO0 + i] = make_buffer(ctx, part_o, &st);
            b[PL0 + i] = make_buffer(ctx, part_l, &st);
        }
    }
    int lcur[2] = {0, 0}; /* which LSE accumulator of each run is current */
    if (!st) {
        /* Rows that no key reaches end as out 0 and LSE -inf, like flashcl's forward. */
        const float zero = 0.0f, minus_inf = -INFINITY;
        cl_int err = CL_SUCCESS;
        if (p.nq && !on_host)
            err |= clEnqueueFillBuffer(queue, b[OACC], &zero, 1, 0, B * (size_t)p.nq * p.qrow * p.es, 0, NULL, NULL);
        for (int i = 0; i < nqseg && !on_host; ++i)
            err |= clEnqueueFillBuffer(queue, b[L00 + 2 * i], &minus_inf, 4, 0, B * HQ * (size_t)qsegs[i].len * 4, 0,
                                       NULL, NULL);
        /* This rank's own block, staged for its first trip around the ring. */
        err |= stage_own_block(queue, &p, nk, k, v, host[0]);
        err |= clFinish(queue);
        if (err != CL_SUCCESS)
            st = flashcl_fail(ctx, err, "context-parallel: staging the first block failed");
    }
    /* Local set-up failures are shared before the ring starts. */
    if (st)
        snprintf(msg, sizeof msg, "%s", flashcl_last_error(ctx));
    if ((st = share_status(ctx, comm, rank, st, -1, msg)))
        goto done;

    reqs rq = {.n = 0};
    for (int step = 0; step < P && !st; ++step) {
        int src = (rank - step + P) % P, nkb = flashcl_cp_local_len(p.g.seqlen_k, P, src);
        double t0 = now_s();
        flashcl_status lst = FLASHCL_SUCCESS;
        cl_mem kb, vb;
        size_t koff, voff;
        int merr = ring_step_kv(&p, ctx, comm, step, &rq, host, k, v, b[DK], b[DV], &s, &kb, &vb, &koff, &voff, &lst);
        seg ksegs[2];
        int nkseg = shard_segments(p.g.seqlen_k, P, src, p.masked, ksegs);
        int pair_q[4], npairs = 0;
        for (int i = 0; i < nqseg && !lst; ++i)
            for (int j = 0; j < nkseg && !lst; ++j) {
                flashcl_attention_desc sub;
                int klen;
                if (!pair_desc(&p, &qsegs[i], &ksegs[j], nkb, &sub, &klen)) {
                    s.pairs_skipped++;
                    continue;
                }
                sub.k.offset += koff;
                sub.v.offset += voff;
                if (on_host) {
                    int pi = npairs;
                    lst = flashcl_attention_forward(ctx, &sub, q, kb, vb, b[PO0 + pi], b[PL0 + pi], 0, NULL);
                    if (lst)
                        break;
                    char *stage = hpart + (size_t)pi * (part_o + part_l);
                    size_t ob = B * (size_t)qsegs[i].len * p.qrow * p.es, lb = B * HQ * (size_t)qsegs[i].len * 4;
                    cl_int err = clEnqueueReadBuffer(queue, b[PO0 + pi], CL_FALSE, 0, ob, stage, 0, NULL, NULL);
                    err |= clEnqueueReadBuffer(queue, b[PL0 + pi], CL_FALSE, 0, lb, stage + part_o, 0, NULL, NULL);
                    if (err != CL_SUCCESS)
                        lst = flashcl_fail(ctx, err, "reading a partial result failed");
                    pair_q[npairs++] = i;
                    s.pairs_computed++;
                    continue;
                }
                lst = flashcl_attention_forward(ctx, &sub, q, kb, vb, b[OTMP], b[LTMP], 0, NULL);
                if (lst)
                    break;
                flashcl_merge_desc m = {0};
                m.dtype = p.g.dtype;
                m.batch = p.g.batch;
                m.seqlen = qsegs[i].len;
                m.heads = p.g.heads_q;
                m.head_dim = p.g.head_dim;
                m.o1 = (flashcl_layout){(size_t)qsegs[i].lstart * p.qrow, (size_t)p.nq * p.qrow, p.qrow,
                                        (size_t)p.g.head_dim};
                m.out = m.o1;
                cl_mem lin = b[L00 + 2 * i + lcur[i]], lout = b[L00 + 2 * i + (lcur[i] ^ 1)];
                lst = flashcl_attention_merge(ctx, &m, b[OACC], lin, b[OTMP], b[LTMP], b[OACC], lout, NULL);
                lcur[i] ^= 1;
                s.pairs_computed++;
            }
        if (lst)
            snprintf(msg, sizeof msg, "%s", flashcl_last_error(ctx));
        cl_int cls = CL_SUCCESS;
        merr = finish_step(queue, !lst, merr, &rq, t0, &s, &cls);
        if (merr != MPI_SUCCESS) {
            st = mpi_fail(ctx, merr, "a ring message");
            break; /* MPI itself failed: its error handler decides the rest */
        }
        if (!lst && cls < 0) {
            lst = cls;
            snprintf(msg, sizeof msg, "the step's kernels failed (%s)", flashcl_status_string(cls));
        }
        for (int n = 0; n < npairs && !lst; ++n) {
            const char *stage = hpart + (size_t)n * (part_o + part_l);
            host_merge(hacc_o, hacc_l, stage, (const float *)(stage + part_o), &qsegs[pair_q[n]], p.nq, p.g.batch,
                       p.g.heads_q, p.g.head_dim, p.g.dtype);
        }
        st = share_status(ctx, comm, rank, lst, step, msg);
    }
    if (!st) {
        /* Only now, with every rank done, are the outputs written. */
        cl_int err = CL_SUCCESS;
        size_t oel = B * (size_t)p.nq * p.qrow;
        if (on_host && p.nq) {
            /* Rounded once, into the staging area (large enough: it held whole runs). */
            char *ob = oel * p.es <= 4 * (part_o + part_l) ? hpart : malloc(oel * p.es);
            if (!ob) {
                st = flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "context-parallel: out of host memory");
                goto done;
            }
            for (size_t i = 0; i < oel; ++i)
                flashcl_host_store(ob, p.g.dtype, i, hacc_o[i]);
            err |= clEnqueueWriteBuffer(queue, out, CL_TRUE, p.g.out.offset * p.es, oel * p.es, ob, 0, NULL, NULL);
            if (lse)
                err |= clEnqueueWriteBuffer(queue, lse, CL_TRUE, lse_offset * 4, B * HQ * (size_t)p.nq * 4, hacc_l, 0,
                                            NULL, NULL);
            if (ob != hpart)
                free(ob);
        }
        if (p.nq && !on_host)
            err |= clEnqueueCopyBuffer(queue, b[OACC], out, 0, p.g.out.offset * p.es,
                                       B * (size_t)p.nq * p.qrow * p.es, 0, NULL, NULL);
        for (int i = 0; lse && !on_host && i < nqseg; ++i)
            err |= lse_rect(queue, b[L00 + 2 * i + lcur[i]], lse, lse_offset, &qsegs[i], p.nq, B * HQ, 1);
        err |= clFinish(queue);
        if (err != CL_SUCCESS)
            st = flashcl_fail(ctx, err, "context-parallel: writing the outputs failed");
    }
done:
    clFinish(queue);
    release(b, NBUF);
    free(host[0]);
    free(host[1]);
    free(hacc_o);
    free(hacc_l);
    free(hpart);
    s.steps = P;
    s.total_s = now_s() - t_start;
    if (stats)
        *stats = s;
    if (!st)
        flashcl_clear_error(ctx);
    return st;
}

/* ---- backward --------------------------------------------------------------- */

/* acc[rows of a run] += part, element by element in float32: dst holds
 * `total` rows of `row` floats per batch, part holds `len` rows of `dtype`
 * per batch, landing at row `first`. */
static void accumulate(float *dst, int total, const void *part, int len, int first, size_t row, int batch,
                       flashcl_dtype dtype) {
    for (int bi = 0; bi < batch; ++bi) {
        float *d = dst + ((size_t)bi * (size_t)total + (size_t)first) * row;
        size_t base = (size_t)bi * (size_t)len * row;
        for (size_t i = 0; i < (size_t)len * row; ++i)
            d[i] += flashcl_host_load(part, dtype, base + i);
    }
}

flashcl_status flashcl_cp_attention_backward(flashcl_context *ctx, const flashcl_attention_desc *desc, MPI_Comm comm,
                                             cl_mem q, cl_mem k, cl_mem v, cl_mem out, cl_mem dout, cl_mem lse,
                                             size_t lse_offset, cl_mem dq, cl_mem dk, cl_mem dv,
                                             flashcl_cp_stats *stats) {
    double t_start = now_s();
    flashcl_cp_stats s;
    memset(&s, 0, sizeof s);
    cp_problem p;
    int64_t fields[F_COUNT];
    char msg[1024] = "";
    flashcl_status st = local_checks(ctx, desc, comm, 2, &p, fields, msg, sizeof msg);
    int nk = 0;
    if (!st) {
        nk = flashcl_cp_local_len(p.g.seqlen_k, p.nranks, p.rank);
        size_t rows_lse = (size_t)p.g.batch * (size_t)p.g.heads_q;
        size_t qb = shard_bytes(&p, p.nq, p.qrow, 0), kbytes = shard_bytes(&p, nk, p.krow, 0);
        /* The first failure is kept, with its message. */
        (void)((st = check_buf(ctx, "q", q, shard_bytes(&p, p.nq, p.qrow, p.g.q.offset), msg, sizeof msg)) ||
            (st = check_buf(ctx, "k", k, shard_bytes(&p, nk, p.krow, p.g.k.offset), msg, sizeof msg)) ||
            (st = check_buf(ctx, "v", v, shard_bytes(&p, nk, p.krow, p.g.v.offset), msg, sizeof msg)) ||
            (st = check_buf(ctx, "out", out, shard_bytes(&p, p.nq, p.qrow, p.g.out.offset), msg, sizeof msg)) ||
            (st = check_buf(ctx, "dout", dout, qb, msg, sizeof msg)) ||
            (st = check_buf(ctx, "lse", lse, (lse_offset + rows_lse * (size_t)p.nq) * 4, msg, sizeof msg)) ||
            (st = check_buf(ctx, "dq", dq, qb, msg, sizeof msg)) ||
            (st = check_buf(ctx, "dk", dk, kbytes, msg, sizeof msg)) ||
            (st = check_buf(ctx, "dv", dv, kbytes, msg, sizeof msg)));
    }
    fields[F_STATUS] = st;
    /* Even without a context this rank takes part, or the others would wait
     * for it; its message then goes where flashcl_last_error(NULL) reads it. */
    if ((st = agree(ctx, comm, p.rank, fields, msg)) != FLASHCL_SUCCESS)
        return st;

    const int P = p.nranks, rank = p.rank, right = (rank + 1) % P, left = (rank + P - 1) % P;
    cl_command_queue queue = flashcl_context_cl_queue(ctx);
    const size_t B = (size_t)p.g.batch, HQ = (size_t)p.g.heads_q;
    int nk_max = 0;
    for (int r = 0; r < P; ++r) {
        int n = flashcl_cp_local_len(p.g.seqlen_k, P, r);
        nk_max = n > nk_max ? n : nk_max;
    }
    seg qsegs[2];
    int nqseg = shard_segments(p.g.seqlen_q, P, rank, p.masked, qsegs);
    int qmax = 0;
    for (int i = 0; i < nqseg; ++i)
        qmax = qsegs[i].len > qmax ? qsegs[i].len : qmax;
    size_t kv_elems = B * (size_t)nk_max * p.krow;
    size_t kv_bytes = kv_elems * p.es;
    size_t dq_elems = B * (size_t)p.nq * p.qrow;
    /* Host: the K/V blocks in flight (dtype), the dK/dV partial sums travelling
     * with them (float32), this rank's dQ sum (float32), and the staging of
     * each pair's partial gradients (dtype), at most four pairs a step. */
    char *host[2] = {malloc(2 * kv_bytes + 1), malloc(2 * kv_bytes + 1)};
    float *dkv[2] = {malloc(2 * kv_elems * 4 + 4), malloc(2 * kv_elems * 4 + 4)};
    float *dq_acc = calloc(dq_elems + 1, 4);
    size_t part_q = B * (size_t)qmax * p.qrow * p.es, part_k = kv_bytes; /* per pair */
    char *part = malloc(4 * (part_q + 2 * part_k) + 1);
    enum { DK, DV, LSEG0, LSEG1, SCRATCH, PQ0, PK0 = PQ0 + 4, PV0 = PK0 + 4, NBUF = PV0 + 4 };
    cl_mem b[NBUF] = {0};
    if (!host[0] || !host[1] || !dkv[0] || !dkv[1] || !dq_acc || !part)
        st = flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "context-parallel: out of host memory");
    size_t scratch = 0;
    if (!st && qmax) {
        flashcl_attention_desc big = p.g;
        big.seqlen_q = qmax;
        big.seqlen_k = nk_max > 0 ? nk_max : 1;
        big.causal = big.windowed = 0;
        big.window_left = big.window_right = -1;
        big.q = big.k = big.v = big.out = (flashcl_layout){0, 0, 0, 0};
        st = flashcl_attention_backward_scratch_size(ctx, &big, NULL, &scratch);
    }
    if (!st) {
        b[DK] = make_buffer(ctx, kv_bytes, &st);
        b[DV] = make_buffer(ctx, kv_bytes, &st);
        b[SCRATCH] = make_buffer(ctx, scratch, &st);
        for (int i = 0; i < nqseg; ++i)
            b[LSEG0 + i] = make_buffer(ctx, B * HQ * (size_t)qsegs[i].len * 4, &st);
        for (int i = 0; i < 4; ++i) {
            b[PQ0 + i] = make_buffer(ctx, part_q, &st);
            b[PK0 + i] = make_buffer(ctx, part_k, &st);
            b[PV0 + i] = make_buffer(ctx, part_k, &st);
        }
    }
    if (!st) {
        /* Each run's LSE rows packed, as flashcl's backward reads them. */
        cl_int err = CL_SUCCESS;
        for (int i = 0; i < nqseg; ++i)
            err |= lse_rect(queue, b[LSEG0 + i], lse, lse_offset, &qsegs[i], p.nq, B * HQ, 0);
        err |= stage_own_block(queue, &p, nk, k, v, host[0]);
        err |= clFinish(queue);
        if (err != CL_SUCCESS)
            st = flashcl_fail(ctx, err, "context-parallel: staging the first block failed");
    }
    if (st)
        snprintf(msg, sizeof msg, "%s", flashcl_last_error(ctx));
    if ((st = share_status(ctx, comm, rank, st, -1, msg)))
        goto done;

    reqs rq = {.n = 0};
    for (int step = 0; step < P && !st; ++step) {
        int cur = step & 1, src = (rank - step + P) % P, next_src = (rank - step - 1 + P) % P;
        int nkb = flashcl_cp_local_len(p.g.seqlen_k, P, src);
        size_t blk_elems = B * (size_t)nkb * p.krow;
        double t0 = now_s();
        flashcl_status lst = FLASHCL_SUCCESS;
        cl_mem kb, vb;
        size_t koff, voff;
        int merr = ring_step_kv(&p, ctx, comm, step, &rq, host, k, v, b[DK], b[DV], &s, &kb, &vb, &koff, &voff, &lst);
        seg ksegs[2];
        int nkseg = shard_segments(p.g.seqlen_k, P, src, p.masked, ksegs);
        struct {
            int qi, ki, klen;
        } pairs[4];
        int npairs = 0;
        for (int i = 0; i < nqseg && !lst; ++i)
            for (int j = 0; j < nkseg && !lst; ++j) {
                flashcl_attention_desc sub;
                int klen;
                if (!pair_desc(&p, &qsegs[i], &ksegs[j], nkb, &sub, &klen)) {
                    s.pairs_skipped++;
                    continue;
                }
                int pi = npairs;
                sub.k.offset += koff;
                sub.v.offset += voff;
                flashcl_backward_options o;
                memset(&o, 0, sizeof o);
                o.dout = sub.q;
                o.dout.offset -= p.g.q.offset; /* dout's shard starts at element 0 */
                sub.out = sub.q;
                sub.out.offset += p.g.out.offset - p.g.q.offset;
                lst = flashcl_attention_backward(ctx, &sub, &o, q, kb, vb, out, dout, b[LSEG0 + i], 0, b[PQ0 + pi],
                                                 b[PK0 + pi], b[PV0 + pi], b[SCRATCH], NULL);
                if (lst)
                    break;
                size_t qbytes = B * (size_t)qsegs[i].len * p.qrow * p.es, kbytes = B * (size_t)klen * p.krow * p.es;
                char *stage = part + (size_t)pi * (part_q + 2 * part_k);
                cl_int err = clEnqueueReadBuffer(queue, b[PQ0 + pi], CL_FALSE, 0, qbytes, stage, 0, NULL, NULL);
                err |= clEnqueueReadBuffer(queue, b[PK0 + pi], CL_FALSE, 0, kbytes, stage + part_q, 0, NULL, NULL);
                err |= clEnqueueReadBuffer(queue, b[PV0 + pi], CL_FALSE, 0, kbytes, stage + part_q + part_k, 0, NULL,
                                           NULL);
                if (err != CL_SUCCESS)
                    lst = flashcl_fail(ctx, err, "reading partial gradients failed");
                pairs[npairs].qi = i;
                pairs[npairs].ki = j;
                pairs[npairs].klen = klen;
                npairs++;
                s.pairs_computed++;
            }
        if (lst)
            snprintf(msg, sizeof msg, "%s", flashcl_last_error(ctx));
        cl_int cls = CL_SUCCESS;
        /* The messages waited for here: this step's K/V, and the dK/dV sums
         * posted at the end of the last step (the block computed now). */
        merr = finish_step(queue, !lst, merr, &rq, t0, &s, &cls);
        if (merr != MPI_SUCCESS) {
            st = mpi_fail(ctx, merr, "a ring message");
            break;
        }
        if (!lst && cls < 0) {
            lst = cls;
            snprintf(msg, sizeof msg, "the step's kernels failed (%s)", flashcl_status_string(cls));
        }
        if (!lst) {
            if (step == 0)
                memset(dkv[cur], 0, 2 * blk_elems * 4);
            for (int n = 0; n < npairs; ++n) {
                const seg *qs = &qsegs[pairs[n].qi], *ks = &ksegs[pairs[n].ki];
                const char *stage = part + (size_t)n * (part_q + 2 * part_k);
                accumulate(dq_acc, p.nq, stage, qs->len, qs->lstart, p.qrow, p.g.batch, p.g.dtype);
                accumulate(dkv[cur], nkb, stage + part_q, pairs[n].klen, ks->lstart, p.krow, p.g.batch, p.g.dtype);
                accumulate(dkv[cur] + blk_elems, nkb, stage + part_q + part_k, pairs[n].klen, ks->lstart, p.krow,
                           p.g.batch, p.g.dtype);
            }
        }
        st = share_status(ctx, comm, rank, lst, step, msg);
        if (st)
            break;
        /* The block's sums go on to the right; the next block's come from the
         * left (after the last step: this rank's own, home after P hops). */
        int nxt_src_len = flashcl_cp_local_len(p.g.seqlen_k, P, next_src);
        merr = post(&rq, 1, dkv[cur ^ 1], 2 * B * (size_t)nxt_src_len * p.krow * 4, left, 40, comm);
        if (merr == MPI_SUCCESS)
            merr = post(&rq, 0, dkv[cur], 2 * blk_elems * 4, right, 40, comm);
        s.bytes_sent += (double)(2 * blk_elems * 4);
        if (merr != MPI_SUCCESS)
            st = mpi_fail(ctx, merr, "a ring message");
    }
    if (!st) {
        double t0 = now_s();
        cl_int cls;
        int merr = wait_step(NULL, &rq, t0, &s, &cls);
        if (merr != MPI_SUCCESS)
            st = mpi_fail(ctx, merr, "the last dK/dV message");
    }
    if (!st) {
        /* Round once into the outputs; the staging area is free again. */
        const float *own = dkv[P & 1];
        size_t kel = B * (size_t)nk * p.krow;
        char *obuf = part;
        size_t need = dq_elems > 2 * kel ? dq_elems : 2 * kel;
        if (need * p.es > 4 * (part_q + 2 * part_k) + 1) {
            obuf = malloc(need * p.es);
            if (!obuf)
                st = flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "context-parallel: out of host memory");
        }
        cl_int err = CL_SUCCESS;
        if (!st && kel) {
            for (size_t i = 0; i < 2 * kel; ++i)
                flashcl_host_store(obuf, p.g.dtype, i, own[i]);
            err |= clEnqueueWriteBuffer(queue, dk, CL_TRUE, 0, kel * p.es, obuf, 0, NULL, NULL);
            err |= clEnqueueWriteBuffer(queue, dv, CL_TRUE, 0, kel * p.es, obuf + kel * p.es, 0, NULL, NULL);
        }
        if (!st && dq_elems) {
            for (size_t i = 0; i < dq_elems; ++i)
                flashcl_host_store(obuf, p.g.dtype, i, dq_acc[i]);
            err |= clEnqueueWriteBuffer(queue, dq, CL_TRUE, 0, dq_elems * p.es, obuf, 0, NULL, NULL);
        }
        if (obuf != part)
            free(obuf);
        if (!st && err != CL_SUCCESS)
            st = flashcl_fail(ctx, err, "context-parallel: writing the gradients failed");
    }
done:
    clFinish(queue);
    release(b, NBUF);
    free(host[0]);
    free(host[1]);
    free(dkv[0]);
    free(dkv[1]);
    free(dq_acc);
    free(part);
    s.steps = P;
    s.total_s = now_s() - t_start;
    if (stats)
        *stats = s;
    if (!st)
        flashcl_clear_error(ctx);
    return st;
}
