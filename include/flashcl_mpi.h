/* flashcl_mpi.h: context-parallel (ring) attention across devices and machines on MPI. */
#ifndef FLASHCL_MPI_H
#define FLASHCL_MPI_H

#include <mpi.h>

#include "flashcl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Context parallelism (issue 39). P ranks of an MPI communicator each hold
 * 1/P of the sequence on their own flashcl context; K/V blocks travel around
 * the ring (rank r sends to r+1 and receives from r-1, modulo P) while each
 * rank computes the attention of its queries against the block it holds, and
 * the partial results are merged exactly by log-sum-exp
 * (flashcl_attention_merge). Messages are non-blocking MPI_Isend/MPI_Irecv
 * posted before the block's kernels run, so the transfer of the next block
 * overlaps the attention of the current one; blocks are staged through two
 * host buffers (clEnqueueReadBuffer / WriteBuffer), one being sent while the
 * other is received.
 *
 * Zigzag layout. A sequence of N rows (queries or keys, each on its own
 * length) is cut into 2P chunks, chunk c holding global rows
 *   [floor(c N / 2P), floor((c+1) N / 2P))
 * (so remainders spread one row at a time; chunks may be empty when N < 2P).
 * Rank r holds chunks r and 2P-1-r, in that order, as one local sequence:
 *   local rows [0, len(r))               = global chunk r
 *   local rows [len(r), len(r)+len(2P-1-r)) = global chunk 2P-1-r
 * Under a causal mask every rank then does about the same work. A rank's
 * shards are the global tensors restricted to its rows, packed:
 *   q, out, dout, dq: [batch][local_seqlen_q][heads_q][head_dim]
 *   k, v, dk, dv:     [batch][local_seqlen_k][heads_k][head_dim]
 *   lse:              float32 [batch][heads_q][local_seqlen_q] from lse_offset
 * Each tensor starts at its layout's offset (in elements); its strides must be
 * 0 (packed). flashcl_cp_local_len and flashcl_cp_global_row give the lengths
 * and the row map.
 *
 * Masks. desc describes the GLOBAL problem (seqlen_q, seqlen_k over all
 * ranks); masks keep their bottom-right alignment over the global sequence:
 * with causal, global query i sees global key j iff j <= i + seqlen_k -
 * seqlen_q. Each (query chunk, key chunk) pair becomes one flashcl call whose
 * window fields express that diagonal (keys past the last visible one are cut
 * off the call, so the right-hand window is never negative); fully masked
 * pairs are skipped. Windows bounded on the right only (window_left < 0) are
 * supported the same way; a window bounded on the left returns
 * FLASHCL_ERROR_INVALID_ARGUMENT. GQA/MQA, soft-cap, scale and every dtype pass
 * through.
 *
 * Agreement. Before any other communication the ranks exchange their desc,
 * shard lengths and local checks (one MPI_Allgather). When any rank's call is
 * invalid or disagrees with rank 0's (shape, dtype, mask, scale), EVERY rank
 * returns the same status with a message naming the mismatch, e.g.
 * "context-parallel: rank 1 has seqlen_q 64, rank 0 has 63"; a failure on one
 * rank during the ring (a kernel build, say) is shared the same way at the end
 * of each step. Messages are read with flashcl_last_error(ctx). On error no
 * output is touched. MPI errors return FLASHCL_ERROR_MPI.
 *
 * Threads and blocking: the calls are collective over comm (every rank must
 * call the same function), blocking, and wait for the context's queue. MPI
 * must be initialised; a communicator should not be used by other threads
 * during the call. The queue is assumed in-order. Host contexts are refused
 * (FLASHCL_ERROR_UNSUPPORTED: they have no cl_mem). */
enum {
    FLASHCL_ERROR_MPI = -2070, /* an MPI call failed (its error string in last_error) */
};

/* Timings of one call on this rank (CPU wall clock, seconds). */
typedef struct flashcl_cp_stats {
    double total_s;        /* the whole call                                  */
    double compute_s;      /* waiting for this rank's kernels, step by step  */
    double comm_s;         /* ring messages: posting to completion, per step */
    double comm_exposed_s; /* the part of comm_s that outlasted compute      */
    double bytes_sent;     /* bytes this rank sent around the ring           */
    int steps;             /* ring steps (P)                                 */
    int pairs_computed;    /* (query chunk, key chunk) calls made            */
    int pairs_skipped;     /* pairs the mask hides entirely                  */
} flashcl_cp_stats;

/* Rows of a sequence of `seqlen` that rank `rank` of `nranks` holds (the
 * zigzag above); -1 for arguments out of range. */
FLASHCL_API int flashcl_cp_local_len(int seqlen, int nranks, int rank);
/* The global row of local row `local_row` on `rank`; -1 when out of range. */
FLASHCL_API int flashcl_cp_global_row(int seqlen, int nranks, int rank, int local_row);

/* Host tensors to shards and back, for a caller that holds a whole tensor on
 * the host (data loading, checking). The tensor is packed [outer][seqlen]
 * rows of row_bytes each: q, out, dout are outer = batch, row_bytes = heads_q
 * * head_dim * element size (k, v likewise with heads_k); lse is outer =
 * batch * heads_q, row_bytes = 4. A shard is [outer][local_len][row_bytes].
 *
 * flashcl_cp_take_shard copies rank `rank`'s rows of global into shard (no
 * communication). flashcl_cp_gather_shards is the inverse, collective over
 * comm: each rank passes its shard, and root receives the whole tensor in
 * global (read only there). outer, seqlen, row_bytes and root must agree on
 * every rank; a rank's shard is read only if it has rows. Both return
 * FLASHCL_ERROR_INVALID_ARGUMENT for negative sizes, a rank out of range, a
 * NULL pointer where bytes are due, or (gather) a shard or total over INT_MAX
 * bytes (MPI's counts are int); gather returns FLASHCL_ERROR_OUT_OF_HOST_MEMORY
 * when root cannot stage the shards. Gather's status is the same on every
 * rank, and nothing is written on a failure. */
FLASHCL_API flashcl_status flashcl_cp_take_shard(const void *global, void *shard, int outer, int seqlen,
                                                 size_t row_bytes, int nranks, int rank);
FLASHCL_API flashcl_status flashcl_cp_gather_shards(MPI_Comm comm, int root, const void *shard, void *global,
                                                    int outer, int seqlen, size_t row_bytes);

/* Context-parallel forward, collective over comm. desc: the global problem
 * (its q/k/v/out layouts: offsets only, strides 0). q, k, v: this rank's
 * shards (above); out: this rank's output shard; lse (may be NULL): float32
 * [batch][heads_q][local_seqlen_q] from element lse_offset, the global
 * log-sum-exp of each local row. stats (may be NULL) receives timings. The
 * result equals the single-device forward on the gathered tensors up to float
 * rounding. float32 partials are merged on the device (flashcl_attention_merge);
 * f16/bf16 partials are read back and merged on the host in float32, so the
 * output is rounded to its storage type once, not once per merge. */
FLASHCL_API flashcl_status flashcl_cp_attention_forward(flashcl_context *ctx,
                                                        const flashcl_attention_desc *desc,
                                                        MPI_Comm comm, cl_mem q, cl_mem k, cl_mem v,
                                                        cl_mem out, cl_mem lse, size_t lse_offset,
                                                        flashcl_cp_stats *stats);

/* Context-parallel backward, collective over comm: the gradients of the
 * forward above. q, k, v, out, lse as the forward took and wrote them (lse is
 * required); dout, dq, dk, dv: this rank's shards in desc's dtype, packed,
 * from element offset 0 (dout, dq like q; dk, dv like k). K/V travel the ring
 * as in the forward and the float32 partial sums of dK/dV travel with them,
 * arriving back at the block's owner after P hops; dQ, dK and dV are summed in
 * float32 on the host and rounded once into the outputs (each pair's partial
 * gradient comes out of flashcl's backward in the storage type, so f16/bf16
 * partials carry one rounding each into that sum). */
FLASHCL_API flashcl_status flashcl_cp_attention_backward(flashcl_context *ctx,
                                                         const flashcl_attention_desc *desc,
                                                         MPI_Comm comm, cl_mem q, cl_mem k, cl_mem v,
                                                         cl_mem out, cl_mem dout, cl_mem lse,
                                                         size_t lse_offset, cl_mem dq, cl_mem dk,
                                                         cl_mem dv, flashcl_cp_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* FLASHCL_MPI_H */
