/* fp8_packed_v.c: FP8 V transposed for the Hopper FP8 forward (cl/fp8_vt_pack.cl), the
 * context's own transpose and the packed V a caller keeps (flashcl_attention_desc.v_packed).
 *
 * 8-bit warpgroup MMA reads both operands K-major, so the nv-wgmma-fp8 forward needs V with
 * keys along its rows (Vt). Each call writes it into the context's scratch before the forward,
 * a pass that reads and writes V once: 27-42 us a call on the H200 at issue 35's shapes, up to
 * 6 % of a causal call's wall clock (docs/perf-notes-fp8.md). A caller whose V several calls
 * read over the same keys (cross-attention to a fixed encoder output, a shared prefix queried by
 * many requests), or who quantizes V itself, can write that layout once and pass it: the Hopper
 * kernel then reads it as it is, and every other kernel unpacks it into the scratch first
 * (fp8_vt_unpack), so a packed V is the same function everywhere. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define VT_TILE 128 /* keys a tile of the FP8 forward, and of Vt's key order */
/* The most keys a packed V takes: its rows (seqlen_k rounded up to VT_TILE) are an int argument. */
#define VT_MAX_KEYS (INT_MAX / VT_TILE * VT_TILE)

/* The k position of key n within its tile (cl/fp8_vt_pack.cl's VT_POS, VT_KEY's inverse). */
static int vt_pos(int n) {
    return (n & ~15) + 4 * ((n >> 1) & 3) + 2 * ((n >> 3) & 1) + (n & 1);
}

size_t flashcl_fp8_vt_shape(const flashcl_attention_desc *r, int *keys, int *rows) {
    *keys = r->seqlen_k <= VT_MAX_KEYS ? (r->seqlen_k + VT_TILE - 1) / VT_TILE * VT_TILE : 0;
    *rows = (r->head_dim + 63) / 64 * 64;
    size_t heads, bytes;
    return flashcl_mul_add((size_t)r->batch, (size_t)r->heads_k, 0, &heads) &&
                   flashcl_mul_add(heads, (size_t)*rows * (size_t)*keys, 0, &bytes)
               ? bytes
               : 0;
}

/* Byte (b, hk, key n, dim d) of a packed V, from its start. */
static size_t vt_at(const flashcl_attention_desc *r, int keys, int rows, int b, int hk, int n, int d) {
    return (((size_t)b * (size_t)r->heads_k + (size_t)hk) * (size_t)rows + (size_t)d) * (size_t)keys +
           (size_t)(n & ~(VT_TILE - 1)) + (size_t)vt_pos(n & (VT_TILE - 1));
}

/* What the packed layout cannot hold (NULL: nothing), for the forward and the pack alike. */
static const char *layout_problem(int head_dim, int seqlen_k) {
    if (head_dim < 16 || head_dim > 128 || head_dim % 16)
        return "a packed V (v_packed) needs head_dim 16..128 in steps of 16, the packed layout's";
    if (seqlen_k > VT_MAX_KEYS)
        return "a packed V (v_packed) holds at most 2147483520 keys";
    return NULL;
}

const char *flashcl_fp8_packed_v_problem(const flashcl_attention_desc *d) {
    const char *problem = layout_problem(d->head_dim, d->seqlen_k);
    if (problem)
        return problem;
    if (d->v.offset % 16)
        return "a packed V (v_packed) starts at a v.offset that is a multiple of 16";
    return NULL;
}

void flashcl_fp8_unpack_v_host(const flashcl_attention_desc *r, const unsigned char *packed, unsigned char *v) {
    int keys, rows;
    flashcl_fp8_vt_shape(r, &keys, &rows);
    packed += r->v.offset;
    for (int b = 0; b < r->batch; ++b)
        for (int n = 0; n < r->seqlen_k; ++n)
            for (int hk = 0; hk < r->heads_k; ++hk)
                for (int d = 0; d < r->head_dim; ++d)
                    *v++ = packed[vt_at(r, keys, rows, b, hk, n, d)];
}

/* The fields of desc the pack helpers read (dtype, batch, heads_k, seqlen_k, head_dim and v's
 * layout, default strides filled in) into *r; NULL, or what is wrong with them. */
static const char *pack_desc(const flashcl_attention_desc *desc, flashcl_attention_desc *r) {
    if (!desc)
        return "desc is NULL";
    if (!flashcl_dtype_is_fp8(desc->dtype))
        return "the pack takes an FP8 desc (dtype FLASHCL_FLOAT8_E4M3 or _E5M2)";
    if (desc->batch < 1 || desc->heads_k < 1 || desc->seqlen_k < 1)
        return "batch, heads_k and seqlen_k must be >= 1";
    const char *problem = layout_problem(desc->head_dim, desc->seqlen_k);
    if (problem)
        return problem;
    memset(r, 0, sizeof *r);
    r->dtype = desc->dtype;
    r->batch = desc->batch, r->heads_k = desc->heads_k, r->seqlen_k = desc->seqlen_k, r->head_dim = desc->head_dim;
    r->v = desc->v;
    flashcl_default_layout(&r->v, r->seqlen_k, r->heads_k, r->head_dim);
    return NULL;
}

size_t flashcl_fp8_packed_v_bytes(const flashcl_attention_desc *desc) {
    flashcl_attention_desc r;
    int keys, rows;
    return pack_desc(desc, &r) ? 0 : flashcl_fp8_vt_shape(&r, &keys, &rows);
}

flashcl_status flashcl_fp8_pack_v_host(const flashcl_attention_desc *desc, const unsigned char *v,
                                       unsigned char *packed) {
    flashcl_attention_desc r;
    const char *problem = pack_desc(desc, &r);
    if (problem)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "flashcl_fp8_pack_v_host: %s", problem);
    if (!v || !packed)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "flashcl_fp8_pack_v_host: a pointer is NULL");
    int keys, rows;
    const size_t bytes = flashcl_fp8_vt_shape(&r, &keys, &rows);
    memset(packed, 0, bytes); /* past seqlen_k and head_dim */
    for (int b = 0; b < r.batch; ++b)
        for (int n = 0; n < r.seqlen_k; ++n)
            for (int hk = 0; hk < r.heads_k; ++hk) {
                const unsigned char *row = v + r.v.offset + (size_t)b * r.v.stride_batch +
                                           (size_t)n * r.v.stride_seq + (size_t)hk * r.v.stride_head;
                for (int d = 0; d < r.head_dim; ++d)
                    packed[vt_at(&r, keys, rows, b, hk, n, d)] = row[d];
            }
    flashcl_clear_error(NULL); /* as the quantize helpers: a success leaves no stale message */
    return FLASHCL_SUCCESS;
}

/* cl/fp8_vt_pack.cl's kernel `name` for head_dim. */
static flashcl_status vt_kernel(flashcl_context *ctx, const char *name, int head_dim, cl_kernel *kernel) {
    char options[64];
    snprintf(options, sizeof options, "-cl-std=CL1.2 -DHEAD_DIM=%d", head_dim);
    return flashcl_get_kernel(ctx, "fp8_vt_pack.cl", name, options, kernel);
}

flashcl_status flashcl_fp8_vt_pack_kernel(flashcl_context *ctx, int head_dim, cl_kernel *kernel) {
    return vt_kernel(ctx, "fp8_vt_pack", head_dim, kernel);
}

cl_int flashcl_fp8_vt_pack_enqueue(flashcl_context *ctx, cl_kernel pack, cl_mem v, const flashcl_layout *vl,
                                   int batch, int heads_k, int seqlen_k, cl_mem vt, size_t vt_off, int vt_keys,
                                   cl_event after, cl_event *done) {
    /* fp8_vt_pack(v, v:4, vt, vt_off, nk, vt_keys) */
    const cl_ulong ul[4] = {vl->offset, vl->stride_batch, vl->stride_seq, vl->stride_head}, off = vt_off;
    const cl_int nk = seqlen_k, keys = vt_keys;
    cl_uint a = 0;
    cl_int err = clSetKernelArg(pack, a++, sizeof(cl_mem), &v);
    for (int i = 0; i < 4; ++i)
        err |= clSetKernelArg(pack, a++, sizeof(cl_ulong), &ul[i]);
    err |= clSetKernelArg(pack, a++, sizeof(cl_mem), &vt);
    err |= clSetKernelArg(pack, a++, sizeof(cl_ulong), &off);
    err |= clSetKernelArg(pack, a++, sizeof(cl_int), &nk);
    err |= clSetKernelArg(pack, a++, sizeof(cl_int), &keys);
    if (err != CL_SUCCESS)
        return err;
    /* A work-group of 128 a tile of keys. */
    const size_t local[3] = {128, 1, 1},
                 global[3] = {(size_t)(vt_keys / VT_TILE) * 128, (size_t)heads_k, (size_t)batch};
    return clEnqueueNDRangeKernel(ctx->queue, pack, 3, NULL, global, local, after ? 1 : 0, after ? &after : NULL,
                                  done);
}

flashcl_status flashcl_fp8_vt_unpack_kernel(flashcl_context *ctx, int head_dim, cl_kernel *kernel) {
    return vt_kernel(ctx, "fp8_vt_unpack", head_dim, kernel);
}

cl_int flashcl_fp8_vt_unpack_enqueue(flashcl_context *ctx, cl_kernel unpack, const flashcl_attention_desc *r,
                                     cl_mem packed, cl_mem v, cl_event after, cl_event *done) {
    int keys, rows;
    flashcl_fp8_vt_shape(r, &keys, &rows);
    /* fp8_vt_unpack(vt, vt_off, vt_keys, v) */
    const cl_ulong off = r->v.offset;
    const cl_int vt_keys = keys;
    cl_int err = clSetKernelArg(unpack, 0, sizeof(cl_mem), &packed);
    err |= clSetKernelArg(unpack, 1, sizeof(cl_ulong), &off);
    err |= clSetKernelArg(unpack, 2, sizeof(cl_int), &vt_keys);
    err |= clSetKernelArg(unpack, 3, sizeof(cl_mem), &v);
    if (err != CL_SUCCESS)
        return err;
    const size_t global[3] = {(size_t)r->seqlen_k, (size_t)r->heads_k, (size_t)r->batch};
    return clEnqueueNDRangeKernel(ctx->queue, unpack, 3, NULL, global, NULL, after ? 1 : 0, after ? &after : NULL,
                                  done);
}

flashcl_status flashcl_fp8_vt_scratch(flashcl_context *ctx, size_t bytes) {
    if (ctx->fp8_vt_bytes >= bytes)
        return FLASHCL_SUCCESS;
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (!m)
        return flashcl_fail(ctx, err, "allocating %zu bytes for the FP8 forward's V scratch: %s", bytes,
                            flashcl_status_string(err));
    /* Released once the calls already enqueued are done with it. */
    if (ctx->fp8_vt)
        clReleaseMemObject(ctx->fp8_vt);
    ctx->fp8_vt = m;
    ctx->fp8_vt_bytes = bytes;
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_fp8_pack_v(flashcl_context *ctx, const flashcl_attention_desc *desc, cl_mem v, cl_mem packed,
                                  size_t packed_offset, cl_event *event) {
    FLASHCL_LOCKED(ctx);
    const flashcl_status entry = flashcl_device_entry(ctx, "flashcl_fp8_pack_v_host");
    if (entry != FLASHCL_SUCCESS)
        return entry;
    flashcl_attention_desc r;
    const char *problem = pack_desc(desc, &r);
    if (problem)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "flashcl_fp8_pack_v: %s", problem);
    /* The pass reads v by 16-byte words. */
    const flashcl_layout *l = &r.v;
    if (!flashcl_layout_rows_16_bytes(l) || packed_offset % 16)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "flashcl_fp8_pack_v: v's offset and strides and packed_offset must be multiples of 16 "
                            "bytes");
    int keys, rows;
    const size_t bytes = flashcl_fp8_vt_shape(&r, &keys, &rows);
    const size_t v_bytes = flashcl_layout_bytes(l, r.batch, r.seqlen_k, r.heads_k, r.head_dim, 1);
    size_t need;
    if (!v_bytes || !flashcl_mul_add(1, bytes, packed_offset, &need))
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS, "flashcl_fp8_pack_v: sizes overflow size_t");
    flashcl_status st;
    if ((st = flashcl_check_buffer(ctx, "v", v, v_bytes)) != FLASHCL_SUCCESS ||
        (st = flashcl_check_buffer(ctx, "packed", packed, need)) != FLASHCL_SUCCESS)
        return st;
    cl_kernel pack;
    if ((st = flashcl_fp8_vt_pack_kernel(ctx, r.head_dim, &pack)) != FLASHCL_SUCCESS)
        return st;
    const cl_int err = flashcl_fp8_vt_pack_enqueue(ctx, pack, v, l, r.batch, r.heads_k, r.seqlen_k, packed,
                                                   packed_offset, keys, NULL, event);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, err, "launching fp8_vt_pack: %s", flashcl_status_string(err));
    return FLASHCL_SUCCESS;
}
