/* fp8_forward.c: what the dense forward needs for FP8 q, k, v: checks, descale factors, the host path.
 *
 * An FP8 forward computes attention on descale * decode(byte) inputs
 * (flashcl_fp8_scales in include/flashcl.h). On OpenCL the portable and CPU
 * kernels decode in the kernel (built with -DQ_FP8 / -DKV_FP8, cl/common.cl)
 * and apply the factors, which reach them through one small device buffer
 * laid out [q factors | k factors | v factors]; a NULL array is uploaded as
 * ones, so the kernel has a single indexing rule. The host path has no FP8
 * kernel: it dequantizes to float32 and runs the float32 path, which is exact
 * up to float32 rounding of descale * value, the same product the kernels
 * form.
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "serving.h"

flashcl_dtype flashcl_out_dtype(const flashcl_attention_desc *d) {
    return flashcl_dtype_is_fp8(d->dtype) ? d->out_dtype : d->dtype;
}

const char *flashcl_fp8_desc_problem(const flashcl_attention_desc *d) {
    if (d->out_dtype != FLASHCL_FLOAT32 && d->out_dtype != FLASHCL_FLOAT16 && d->out_dtype != FLASHCL_BFLOAT16)
        return flashcl_dtype_is_fp8(d->out_dtype)
                   ? "out_dtype is FP8: the FP8 forward writes float32, float16 or bfloat16 (quantize out yourself)"
                   : "out_dtype is not float32, float16 or bfloat16";
    if (d->fp8.block_rows < 0)
        return "fp8.block_rows is negative";
    if (d->fp8.block_rows > 0 && !d->fp8.per_head)
        return "fp8.block_rows needs fp8.per_head (block factors are indexed per (batch, head))";
    return d->v_packed ? flashcl_fp8_packed_v_problem(d) : NULL;
}

void flashcl_fp8_scale_counts(const flashcl_attention_desc *r, size_t counts[3]) {
    const flashcl_fp8_scales *s = &r->fp8;
    if (!s->per_head) {
        counts[0] = counts[1] = counts[2] = 1;
        return;
    }
    counts[0] = (size_t)r->batch * (size_t)r->heads_q * flashcl_fp8_row_blocks(r->seqlen_q, s->block_rows);
    counts[1] = (size_t)r->batch * (size_t)r->heads_k * flashcl_fp8_row_blocks(r->seqlen_k, s->block_rows);
    counts[2] = (size_t)r->batch * (size_t)r->heads_k;
}

static const float *scale_array(const flashcl_attention_desc *r, int t) {
    return t == 0 ? r->fp8.q_descale : t == 1 ? r->fp8.k_descale : r->fp8.v_descale;
}

flashcl_status flashcl_fp8_check_scales(flashcl_context *ctx, const flashcl_attention_desc *r) {
    static const char *const names[3] = {"q_descale", "k_descale", "v_descale"};
    size_t counts[3];
    flashcl_fp8_scale_counts(r, counts);
    /* The kernels index the factors with int. */
    if (counts[0] + counts[1] + counts[2] > (size_t)INT_MAX)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%zu descale factors (fp8.block_rows %d): at most %d",
                            counts[0] + counts[1] + counts[2], r->fp8.block_rows, INT_MAX);
    for (int t = 0; t < 3; ++t) {
        const float *a = scale_array(r, t);
        for (size_t i = 0; a && i < counts[t]; ++i)
            if (!(a[i] > 0.0f) || isinf(a[i]))
                return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                                    "fp8.%s[%zu] is %g: descale factors must be finite and > 0", names[t], i,
                                    (double)a[i]);
    }
    return FLASHCL_SUCCESS;
}

/* r's factors [q | k | v] into dst (ones for a NULL array). */
static void gather_scales(const flashcl_attention_desc *r, float *dst) {
    size_t counts[3];
    flashcl_fp8_scale_counts(r, counts);
    for (int t = 0; t < 3; ++t) {
        const float *a = scale_array(r, t);
        for (size_t i = 0; i < counts[t]; ++i)
            dst[i] = a ? a[i] : 1.0f;
        dst += counts[t];
    }
}

/* A write waits for the previous FP8 forward on this context (the buffer's
 * last reader); the caller makes its kernel ctx->fp8_scales_reader. Factors
 * that match what the buffer holds (static scales, the usual case) are not
 * written again: the kernel waits for that last reader instead, which came
 * after the write that put them there. Waiting for the write alone would let
 * two readers of one write run unordered on an out-of-order queue, and the
 * next write, which waits only for the later, overtake the earlier. */
flashcl_status flashcl_fp8_upload_scales(flashcl_context *ctx, const flashcl_attention_desc *r, cl_event *written) {
    size_t counts[3];
    flashcl_fp8_scale_counts(r, counts);
    const size_t bytes = (counts[0] + counts[1] + counts[2]) * sizeof(float);
    float *host = flashcl_staging_take(ctx, bytes);
    if (!host)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    gather_scales(r, host);
    if (ctx->fp8_scales_reader && ctx->fp8_scales_held_bytes == bytes && !memcmp(ctx->fp8_scales_held, host, bytes)) {
        clRetainEvent(ctx->fp8_scales_reader);
        *written = ctx->fp8_scales_reader;
        return FLASHCL_SUCCESS;
    }
    ctx->fp8_scales_held_bytes = 0; /* unknown until the write is enqueued */
    if (ctx->fp8_scales_held_cap < bytes) {
        float *grown = realloc(ctx->fp8_scales_held, bytes);
        if (!grown)
            return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
        ctx->fp8_scales_held = grown;
        ctx->fp8_scales_held_cap = bytes;
    }
    const flashcl_status st = flashcl_staging_upload(ctx, &ctx->fp8_scales, &ctx->fp8_scales_bytes, bytes,
                                                     ctx->fp8_scales_reader, written, "the FP8 descale factors");
    if (st != FLASHCL_SUCCESS)
        return st;
    memcpy(ctx->fp8_scales_held, host, bytes);
    ctx->fp8_scales_held_bytes = bytes;
    return FLASHCL_SUCCESS;
}

/* ---- the host path ---------------------------------------------------------------------------- */

/* x (FP8, in layout l) -> dst packed [batch][seqlen][heads][head_dim] float32,
 * each value times its factor from sc ([counts] as gather_scales lays them out). */
static void dequantize(const flashcl_attention_desc *r, const unsigned char *x, const flashcl_layout *l, int seqlen,
                       int heads, const float *sc, int by_rows, float *dst) {
    const size_t blocks = by_rows ? flashcl_fp8_row_blocks(seqlen, r->fp8.block_rows) : 1;
    float table[256]; /* decoding by table: 256 values, each exact */
    for (int c = 0; c < 256; ++c)
        table[c] = flashcl_fp8_decode(r->dtype, (unsigned char)c);
    size_t o = 0;
    for (int b = 0; b < r->batch; ++b)
        for (int s = 0; s < seqlen; ++s)
            for (int h = 0; h < heads; ++h) {
                size_t f = 0;
                if (r->fp8.per_head)
                    f = ((size_t)b * (size_t)heads + (size_t)h) * blocks +
                        (by_rows && r->fp8.block_rows > 0 ? (size_t)(s / r->fp8.block_rows) : 0);
                const unsigned char *row = x + l->offset + (size_t)b * l->stride_batch + (size_t)s * l->stride_seq +
                                           (size_t)h * l->stride_head;
                for (int d = 0; d < r->head_dim; ++d)
                    dst[o++] = sc[f] * table[row[d]];
            }
}

flashcl_status flashcl_fp8_host_forward(flashcl_context *ctx, const flashcl_attention_desc *r, const void *q,
                                        const void *k, const void *v, void *out, float *lse) {
    size_t counts[3];
    flashcl_fp8_scale_counts(r, counts);
    const size_t nq = (size_t)r->batch * r->seqlen_q * r->heads_q * r->head_dim;
    const size_t nk = (size_t)r->batch * r->seqlen_k * r->heads_k * r->head_dim;
    float *sc = malloc((counts[0] + counts[1] + counts[2]) * sizeof *sc);
    float *fq = malloc(nq * sizeof *fq), *fo = malloc(nq * sizeof *fo);
    float *fk = malloc(nk * sizeof *fk), *fv = malloc(nk * sizeof *fv);
    flashcl_status st = FLASHCL_SUCCESS;
    if (!sc || !fq || !fo || !fk || !fv) {
        st = flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "FP8 host forward: out of host memory");
        goto done;
    }
    gather_scales(r, sc);
    dequantize(r, q, &r->q, r->seqlen_q, r->heads_q, sc, 1, fq);
    dequantize(r, k, &r->k, r->seqlen_k, r->heads_k, sc + counts[0], 1, fk);
    /* v's factors are per (batch, head) even with block_rows. A packed V is unpacked first. */
    if (r->v_packed) {
        unsigned char *unpacked = malloc(nk);
        if (!unpacked) {
            st = flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "FP8 host forward: out of host memory");
            goto done;
        }
        flashcl_fp8_unpack_v_host(r, v, unpacked);
        flashcl_layout dense = {0, 0, 0, 0}; /* the unpacked copy's layout */
        flashcl_default_layout(&dense, r->seqlen_k, r->heads_k, r->head_dim);
        dequantize(r, unpacked, &dense, r->seqlen_k, r->heads_k, sc + counts[0] + counts[1], 0, fv);
        free(unpacked);
    } else {
        dequantize(r, v, &r->v, r->seqlen_k, r->heads_k, sc + counts[0] + counts[1], 0, fv);
    }
    flashcl_attention_desc f = *r;
    f.dtype = FLASHCL_FLOAT32;
    f.v_packed = 0; /* fv is unpacked */
    memset(&f.q, 0, sizeof f.q), memset(&f.k, 0, sizeof f.k), memset(&f.v, 0, sizeof f.v);
    memset(&f.out, 0, sizeof f.out);
    flashcl_default_layout(&f.q, f.seqlen_q, f.heads_q, f.head_dim);
    flashcl_default_layout(&f.out, f.seqlen_q, f.heads_q, f.head_dim);
    flashcl_default_layout(&f.k, f.seqlen_k, f.heads_k, f.head_dim);
    flashcl_default_layout(&f.v, f.seqlen_k, f.heads_k, f.head_dim);
    if ((st = flashcl_host_forward(ctx, &f, fq, fk, fv, fo, lse)) != FLASHCL_SUCCESS)
        goto done;
    /* out in out_dtype and the caller's layout; the elements its strides skip stay. */
    size_t o = 0;
    for (int b = 0; b < r->batch; ++b)
        for (int s = 0; s < r->seqlen_q; ++s)
            for (int h = 0; h < r->heads_q; ++h) {
                const size_t row = r->out.offset + (size_t)b * r->out.stride_batch + (size_t)s * r->out.stride_seq +
                                   (size_t)h * r->out.stride_head;
                for (int d = 0; d < r->head_dim; ++d)
                    flashcl_host_store(out, r->out_dtype, row + (size_t)d, fo[o++]);
            }
done:
    free(sc), free(fq), free(fo), free(fk), free(fv);
    return st;
}
