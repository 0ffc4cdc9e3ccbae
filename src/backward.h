/* backward.h: the dense backward's checks and launches (src/backward.c), shared with src/varlen_backward.c. */
#ifndef FLASHCL_BACKWARD_H
#define FLASHCL_BACKWARD_H

#include "internal.h"

/* The nine tensors of a backward call, in the order of the bufs arrays below. */
enum {
    FLASHCL_BWD_Q, FLASHCL_BWD_K, FLASHCL_BWD_V, FLASHCL_BWD_OUT, FLASHCL_BWD_DOUT,
    FLASHCL_BWD_DQ, FLASHCL_BWD_DK, FLASHCL_BWD_DV, FLASHCL_BWD_LSE, FLASHCL_BWD_TENSORS
};

/* The kernels of one backward configuration, all built. */
typedef struct flashcl_backward_kernels {
    flashcl_backward_choice choice;
    cl_kernel pre, dkdv;
    cl_kernel dq;    /* flash_bwd_dq: deterministic mode only, else NULL          */
    cl_kernel store; /* flash_bwd_dq_store: atomic mode or when asked, else NULL  */
    /* nv-wgmma: dkdv and dq copying their streamed tiles by TMA (USE_TMA),
     * where the driver encodes tensor maps; each call runs them where its
     * tensors' maps encode, else dkdv and dq. NULL otherwise. */
    cl_kernel dkdv_tma, dq_tma;
    int row_lanes; /* work-items a row of pre and store (ROW_LANES, cl/flash_bwd.cl) */
} flashcl_backward_kernels;

/* Scratch bytes of one launch for a resolved desc (rows = batch * heads_q *
 * seqlen_q floats of D_i, then rows * head_dim floats of the dQ accumulator
 * unless deterministic); 0 on overflow. */
size_t flashcl_backward_scratch_bytes(const flashcl_attention_desc *r, int deterministic);

/* Checks the buffers of a resolved desc and resolved opts: each non-NULL and
 * within its CL_MEM_SIZE (lse float [batch][heads_q][seqlen_q] from
 * lse_offset), no gradient the same buffer as another tensor, and scratch of
 * at least scratch_need bytes, distinct from every tensor. seqlen_k 0 (a
 * varlen batch without a key) asks only for non-NULL k, v, dk and dv. */
flashcl_status flashcl_backward_check_buffers(flashcl_context *ctx, const flashcl_attention_desc *r,
                                              const flashcl_backward_options *o, size_t lse_offset,
                                              const cl_mem bufs[FLASHCL_BWD_TENSORS], cl_mem scratch,
                                              size_t scratch_need);

/* Picks the tiles (FLASHCL_BWD_PARAMS included), checks them against the
 * device and builds every kernel the mode needs; with_store: build
 * flash_bwd_dq_store in deterministic mode too. */
flashcl_status flashcl_backward_prepare(flashcl_context *ctx, const flashcl_attention_desc *r,
                                        int deterministic, int with_store, flashcl_backward_kernels *k);

/* Enqueues one backward (pre, dkdv, then dq or the dQ store) on checked
 * buffers. The first kernel waits on wait[0 .. num_wait); the kernels are
 * chained by events; scratch is used from float element scratch_offset on.
 * *event (may be NULL) receives the last kernel's event. */
flashcl_status flashcl_backward_enqueue(flashcl_context *ctx, const flashcl_attention_desc *r,
                                        const flashcl_backward_options *o, const flashcl_backward_kernels *k,
                                        const cl_mem bufs[FLASHCL_BWD_TENSORS], size_t lse_offset,
                                        cl_mem scratch, size_t scratch_offset, cl_uint num_wait,
                                        const cl_event *wait, cl_event *event);

/* k's flash_bwd_dq_store: rounds float rows scratch[acc_offset ..] ([batch]
 * [heads][seqlen][head_dim]) into dst at layout l, in the kernel's dtype.
 * Waits and returns an event as flashcl_backward_enqueue does. */
flashcl_status flashcl_backward_enqueue_store(flashcl_context *ctx, const flashcl_backward_kernels *k, cl_mem scratch,
                                              size_t acc_offset, cl_mem dst, const flashcl_layout *l,
                                              int batch, int seqlen, int heads, int head_dim, cl_uint num_wait,
                                              const cl_event *wait, cl_event *event);

#endif
