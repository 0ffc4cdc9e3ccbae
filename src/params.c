/* params.c: the forward kernel's parameters per device, in one place.
 *
 * Where the numbers come from:
 *   CPU (PoCL and other CPU drivers): one work-item per query row
 *     (threads_per_row 1) so no cross-work-item reductions are needed; a
 *     work-group of 16 rows is PoCL's unit of vectorisation and of threading;
 *     64-key tiles keep K/V + Q + S (~36 KB at D=64) inside L1/L2. Hand-chosen,
 *     then checked against the alternatives with `flashcl bench` on PoCL.
 *   GPU: 16 rows x 8 work-items (128 work-items, 4 warps / 2 wavefronts),
 *     32-key tiles; 16 keys above D=128 so that Q + K/V stay near 34 KB,
 *     under NVIDIA's ~47 KB. Hand-chosen for latency hiding with several
 *     work-groups per compute unit.
 * FLASHCL_PARAMS="BLOCK_M=32,BLOCK_N=16,TPR=4" overrides any of them; the
 * value is parsed strictly and checked against the device before launch.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

size_t flashcl_forward_local_bytes(const flashcl_params *p, int head_dim) {
    size_t row = (size_t)head_dim + 1;
    size_t floats = (size_t)p->block_m * row + (size_t)p->block_n * row +
                    (size_t)p->block_m * ((size_t)p->block_n + 1) +
                    (size_t)p->block_m * (size_t)p->threads_per_row;
    return floats * sizeof(float);
}

/* The portable kernel's parameters (also the fallback of every other variant). */
void flashcl_portable_params(const flashcl_context *ctx, const flashcl_attention_desc *desc,
                             flashcl_params *p) {
    memset(p, 0, sizeof *p);
    if (ctx->is_host) {
        p->block_m = 1;
        p->block_n = 64;
        p->threads_per_row = 1;
        p->work_group_size = 1;
        p->variant = "host";
        p->source = "built-in: host path";
        return;
    }
    if (ctx->info.type & CL_DEVICE_TYPE_CPU) {
        p->block_m = 16;
        p->block_n = 64;
        p->threads_per_row = 1;
        p->variant = "portable-cpu";
        p->source = "built-in: CPU default";
    } else {
        p->block_m = 16;
        p->block_n = desc->head_dim > 128 ? 16 : 32;
        p->threads_per_row = 8;
        p->variant = "portable-gpu";
        p->source = "built-in: GPU default";
    }
    /* Shrink to fit small devices: keys per tile first, then rows. 1 KB is
     * left for the driver (NVIDIA refuses launches at the reported limit). */
    size_t budget = ctx->info.local_mem > 2048 ? (size_t)ctx->info.local_mem - 1024 : 0;
    while (p->block_n > p->threads_per_row && flashcl_forward_local_bytes(p, desc->head_dim) > budget)
        p->block_n /= 2;
    while (p->block_m > 1 && ((size_t)p->block_m * (size_t)p->threads_per_row > ctx->info.max_wg ||
                              flashcl_forward_local_bytes(p, desc->head_dim) > budget))
        p->block_m /= 2;
    p->work_group_size = p->block_m * p->threads_per_row;
}

int flashcl_nv_mma_eligible(const flashcl_context *ctx, const flashcl_attention_desc *desc) {
    const char *force = getenv("FLASHCL_VARIANT");
    if (force && !strcmp(force, "portable"))
        return 0;
    return !ctx->is_host && ctx->info.nv_cc_major >= 8 && desc->dtype != FLASHCL_FLOAT32 &&
           desc->head_dim >= 32 && desc->head_dim <= 256;
}

void flashcl_default_params(const flashcl_context *ctx, const flashcl_attention_desc *desc,
                            flashcl_params *p) {
    if (!flashcl_nv_mma_eligible(ctx, desc)) {
        flashcl_portable_params(ctx, desc, p);
        return;
    }
    /* Tensor cores (cl/flash_fwd_nv.cl): 4 warps of 16 query rows each;
     * 64-key tiles, 32 above D=128, keep double-buffered K and V in ~46 KB. */
    memset(p, 0, sizeof *p);
    p->block_m = 64;
    p->block_n = desc->head_dim > 128 ? 32 : 64;
    p->threads_per_row = 0;
    p->work_group_size = 128;
    p->variant = "nv-mma";
    p->source = "built-in: NVIDIA sm_80+ default";
}
