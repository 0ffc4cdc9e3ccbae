/* params.c: the forward kernel's parameters per device, in one place.
 *
 * Where the numbers come from:
 *   CPU (cl/flash_fwd_cpu.cl): 32 query rows per work-item reuse each
 *     converted K/V element 32 times; 64-key tiles are eight float8 score
 *     accumulators, which stay in registers; scratch (2*32*D + 2*64*D +
 *     32*64 floats, 56 KB at D=64) fits L2. Measured with `flashcl bench
 *     --shape 1,8,2048,64 --dtype f16` on PoCL (2-core Xeon, median ms,
 *     non-causal): 32x64 297, 64x64 286, 16x64 409, 32x32 368, 32x128 479;
 *     64 rows was within noise of 32 and doubles the idle tail of causal
 *     blocks, so 32.
 *   GPU (cl/flash_fwd.cl): 16 rows x 8 work-items (128 work-items, 4 warps / 2 wavefronts),
 *     32-key tiles; 16 keys above D=128 so that Q + K/V stay near 34 KB,
 *     under NVIDIA's ~47 KB. Hand-chosen for latency hiding with several
 *     work-groups per compute unit.
 * FLASHCL_PARAMS="BLOCK_M=32,BLOCK_N=16,TPR=4" overrides any of them (WARPS for nv-mma); the
 * value is parsed strictly and checked against the device before launch.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

size_t flashcl_forward_local_bytes(const flashcl_params *p, int head_dim) {
    size_t d = (size_t)head_dim, m = (size_t)p->block_m, n = (size_t)p->block_n, floats;
    if (!strcmp(p->variant, "cpu")) { /* q, acc, K^T, V, S: see cl/flash_fwd_cpu.cl */
        size_t dpad = (d + 31) / 32 * 32;
        floats = m * d + m * dpad + n * d + n * dpad + m * n;
    }
    else if (!strcmp(p->variant, "portable")) /* q, K/V, S, reductions (+1 padding per row) */
        floats = m * (d + 1) + n * (d + 1) + m * (n + 1) + m * (size_t)p->threads_per_row;
    else
        return 0; /* fixed in the kernel source; checked on the built kernel */
    return floats * sizeof(float);
}

/* The kernel that cannot fail to apply: cl/flash_fwd_cpu.cl on CPUs,
 * cl/flash_fwd.cl elsewhere (and the host path without OpenCL). */
void flashcl_fallback_params(const flashcl_context *ctx, const flashcl_attention_desc *desc,
                             flashcl_params *p) {
    memset(p, 0, sizeof *p);
    if (ctx->is_host) {
        p->block_m = 16;
        p->block_n = 64;
        p->work_group_size = 1;
        p->variant = "host";
        p->source = "built-in: host path";
        return;
    }
    if (ctx->info.type & CL_DEVICE_TYPE_CPU) {
        p->block_m = 32;
        p->block_n = 64;
        p->work_group_size = 1;
        p->variant = "cpu";
        p->source = "built-in: CPU default";
    } else {
        p->block_m = 16;
        p->block_n = desc->head_dim > 128 ? 16 : 32;
        p->threads_per_row = 8;
        p->variant = "portable";
        p->source = "built-in: GPU default";
    }
    /* Shrink to fit small devices: keys per tile first, then rows. 1 KB is
     * left for the driver (NVIDIA refuses launches at the reported limit). */
    size_t budget = ctx->info.local_mem > 2048 ? (size_t)ctx->info.local_mem - 1024 : 0;
    int min_n = p->threads_per_row ? p->threads_per_row : 1;
    while (p->block_n > min_n && flashcl_forward_local_bytes(p, desc->head_dim) > budget)
        p->block_n /= 2;
    while (p->block_m > 1 && (flashcl_forward_local_bytes(p, desc->head_dim) > budget ||
                              (size_t)p->block_m * (size_t)p->threads_per_row > ctx->info.max_wg))
        p->block_m /= 2;
    if (p->threads_per_row)
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
        flashcl_fallback_params(ctx, desc, p);
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
