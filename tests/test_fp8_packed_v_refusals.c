/* test_fp8_packed_v_refusals.c: test_fp8_packed_v's refusals (3): the packed forward, the packs and
 * the size query refusing what the packed layout cannot take, and writing nothing. A file of its
 * own since test_fp8_packed_v.c, which runs them (refusals), passed 1,200 lines;
 * test_fp8_packed_v.h declares what the files share (refuse_forward serves the Hopper kernel's
 * checks in test_fp8_packed_v_wgmma.c too).
 *
 * 3. Refusals, outputs and packed buffers untouched: v_packed with float16 q, k, v, with a
 *    v.offset off 16 bytes, at head dims off the packed layout's 16..128 by 16
 *    (INVALID_ARGUMENT, also from flashcl_attention_desc_resolve); a packed buffer short of
 *    v.offset + flashcl_fp8_packed_v_bytes (OUT_OF_BOUNDS); the pack with a packed_offset off 16
 *    bytes, of float16 V or at those head dims (INVALID_ARGUMENT), with a short destination or
 *    source (OUT_OF_BOUNDS), on a host context (UNSUPPORTED); flashcl_fp8_packed_v_bytes of a
 *    non-FP8 desc, or at those head dims, is 0. Key counts past the packed layout's
 *    INT_MAX - 127 (its rows, seqlen_k rounded up to 128, are an int), INT_MAX and
 *    INT_MAX - 100: flashcl_fp8_packed_v_bytes 0, both packs refused (INVALID_ARGUMENT),
 *    flashcl_attention_desc_resolve of a v_packed desc refused (INVALID_ARGUMENT or
 *    INVALID_SHAPE), and flashcl_attention_forward with v_packed refused (INVALID_ARGUMENT,
 *    INVALID_SHAPE or OUT_OF_BOUNDS), its K layout 16 bytes long so that only the packed V can
 *    be why; INT_MAX - 127 itself is sized exactly and resolves.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcl.h"
#include "harness.h"
#include "test_fp8_packed_v.h"

/* ---- 3. refusals ----------------------------------------------------------------------------- */

/* A forward that must fail with `want` and write nothing, through flashcl_attention_forward
 * (device context: buffers, the packed V buffer vp_bytes long) and flashcl_attention_forward_host;
 * `desc_error` (a fault of the desc alone): flashcl_attention_desc_resolve reports it too. */
void refuse_forward(flashcl_context *ctx, const flashcl_attention_desc *d, size_t vp_bytes,
                    flashcl_status want, int desc_error, const char *needle, const char *what) {
    enum { POISON = 0x5a };
    const size_t nq = (size_t)d->batch * d->seqlen_q * d->heads_q * d->head_dim;
    const size_t nk = (size_t)d->batch * d->seqlen_k * d->heads_k * d->head_dim;
    const size_t in_bytes = nq * flashcl_dtype_size(d->dtype) > nk * flashcl_dtype_size(d->dtype)
                                ? nq * flashcl_dtype_size(d->dtype)
                                : nk * flashcl_dtype_size(d->dtype);
    const size_t out_bytes = nq * 4, lse_bytes = (size_t)d->batch * d->heads_q * d->seqlen_q * 4;
    unsigned char *x = test_xmalloc(in_bytes + vp_bytes), *out = test_xmalloc(out_bytes),
                  *lse = test_xmalloc(lse_bytes);
    memset(x, 0x38, in_bytes + vp_bytes); /* a finite code in every format here */
    char line[400];
    if (!flashcl_context_is_host(ctx)) {
        memset(out, POISON, out_bytes), memset(lse, POISON, lse_bytes);
        cl_mem bx = test_upload(ctx, x, in_bytes), bp = test_upload(ctx, x, vp_bytes);
        cl_mem bo = test_upload(ctx, out, out_bytes), bl = test_upload(ctx, lse, lse_bytes);
        const flashcl_status st = flashcl_attention_forward(ctx, d, bx, bx, bp, bo, bl, 0, NULL);
        const char *message = flashcl_last_error(ctx);
        clFinish(flashcl_context_cl_queue(ctx));
        test_download(ctx, bo, out, out_bytes), test_download(ctx, bl, lse, lse_bytes);
        snprintf(line, sizeof line, "device forward refuses %s (%s: %s), writes nothing", what,
                 flashcl_status_string(st), message);
        expect(st == want && strstr(message, needle) && all_bytes(out, out_bytes, POISON) &&
                   all_bytes(lse, lse_bytes, POISON),
               line, &failures);
        clReleaseMemObject(bx), clReleaseMemObject(bp);
        clReleaseMemObject(bo), clReleaseMemObject(bl);
    }
    if (want == FLASHCL_ERROR_OUT_OF_BOUNDS)
        goto done; /* host arrays have no size to check */
    memset(out, POISON, out_bytes), memset(lse, POISON, lse_bytes);
    const flashcl_status st = flashcl_attention_forward_host(ctx, d, x, x, x, out, (float *)lse);
    snprintf(line, sizeof line, "%s forward_host refuses %s (%s: %s), writes nothing",
             flashcl_context_is_host(ctx) ? "host" : "device", what, flashcl_status_string(st),
             flashcl_last_error(ctx));
    expect(st == want && strstr(flashcl_last_error(ctx), needle) &&
               all_bytes(out, out_bytes, POISON) && all_bytes(lse, lse_bytes, POISON),
           line, &failures);
    if (desc_error) {
        flashcl_attention_desc r = *d;
        const flashcl_status sr = flashcl_attention_desc_resolve(&r);
        snprintf(line, sizeof line, "flashcl_attention_desc_resolve refuses %s (%s)", what,
                 flashcl_status_string(sr));
        expect(sr == want, line, &failures);
    }
done:
    free(x), free(out), free(lse);
}

/* flashcl_fp8_pack_v that must fail with `want`, its destination (dst_bytes) untouched. */
static void refuse_pack(flashcl_context *ctx, const flashcl_attention_desc *d, size_t v_bytes,
                        size_t dst_bytes, size_t offset, flashcl_status want, const char *what) {
    enum { POISON = 0x7f };
    unsigned char *back = test_xmalloc(dst_bytes), *v = test_xmalloc(v_bytes);
    memset(v, 0x38, v_bytes);
    cl_mem bv = test_upload(ctx, v, v_bytes), bp = poisoned_buffer(ctx, dst_bytes, POISON);
    const flashcl_status st = flashcl_fp8_pack_v(ctx, d, bv, bp, offset, NULL);
    const char *message = flashcl_last_error(ctx);
    clFinish(flashcl_context_cl_queue(ctx));
    test_download(ctx, bp, back, dst_bytes);
    char line[400];
    snprintf(line, sizeof line, "flashcl_fp8_pack_v refuses %s (%s: %s), writes nothing", what,
             flashcl_status_string(st), message);
    expect(st == want && message[0] && all_bytes(back, dst_bytes, POISON), line, &failures);
    clReleaseMemObject(bv), clReleaseMemObject(bp);
    free(back), free(v);
}

/* Key counts past the packed layout's INT_MAX - 127 (its rows, seqlen_k rounded up to 128 keys,
 * are an int): no size, no pack, no packed forward, and a desc flashcl_attention_desc_resolve
 * refuses; INT_MAX - 127 itself sized exactly. The forward's K layout is 16 bytes long
 * (stride_seq 0), every buffer a few KB: only the packed V (its key count, or a size computed
 * from it) can refuse that call, and one that ran would walk 2^31 keys. */
static void huge_key_counts(flashcl_context *dev) {
    enum { D = 16, ROOM = 4096, POISON = 0x5a };
    static const int counts[] = {INT_MAX, INT_MAX - 100, INT_MAX - 127};
    char line[400];
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; ++i) {
        const int nk = counts[i], over = nk > INT_MAX - 127;
        flashcl_attention_desc d = test_attention_desc(FLASHCL_FLOAT8_E4M3, 1, 1, 1, 1, nk, D);
        const size_t bytes = flashcl_fp8_packed_v_bytes(&d);
        const size_t want = over ? 0 : packed_rows(D) * packed_keys(nk);
        snprintf(line, sizeof line,
                 "seqlen_k %d (INT_MAX - %d): flashcl_fp8_packed_v_bytes %zu (%zu)", nk,
                 INT_MAX - nk, bytes, want);
        expect(bytes == want, line, &failures);
        flashcl_attention_desc r = d;
        r.v_packed = 1;
        const flashcl_status sr = flashcl_attention_desc_resolve(&r);
        snprintf(line, sizeof line,
                 "seqlen_k INT_MAX - %d: flashcl_attention_desc_resolve of a v_packed desc (%s)",
                 INT_MAX - nk, flashcl_status_string(sr));
        expect(over ? sr == FLASHCL_ERROR_INVALID_ARGUMENT || sr == FLASHCL_ERROR_INVALID_SHAPE
                    : sr == FLASHCL_SUCCESS,
               line, &failures);
        if (!over)
            continue;
        /* the host pack, only where the size query refused too (else it would read 2^31 keys of
         * a few bytes) */
        unsigned char *v = test_xmalloc(ROOM), *p = test_xmalloc(ROOM);
        memset(v, 0x38, ROOM), memset(p, 0x7f, ROOM);
        const flashcl_status sh = bytes ? FLASHCL_SUCCESS : flashcl_fp8_pack_v_host(&d, v, p);
        snprintf(line, sizeof line,
                 "seqlen_k INT_MAX - %d: flashcl_fp8_pack_v_host refused (%s), writes nothing",
                 INT_MAX - nk,
                 bytes ? "not called: the size query gave a size" : flashcl_last_error(NULL));
        expect(sh == FLASHCL_ERROR_INVALID_ARGUMENT && all_bytes(p, ROOM, 0x7f), line, &failures);
        free(v), free(p);
        if (!dev)
            continue;
        snprintf(line, sizeof line, "seqlen_k INT_MAX - %d", INT_MAX - nk);
        refuse_pack(dev, &d, ROOM, ROOM, 0, FLASHCL_ERROR_INVALID_ARGUMENT, line);

        /* the forward, on buffers that all but the packed V would do with */
        flashcl_attention_desc e = d;
        e.v_packed = 1;
        e.k.stride_batch = e.k.stride_head = D, e.k.stride_seq = 0;
        unsigned char *x = test_xmalloc(ROOM), *out = test_xmalloc(ROOM), *lse = test_xmalloc(ROOM);
        memset(x, 0x38, ROOM), memset(out, POISON, ROOM), memset(lse, POISON, ROOM);
        cl_mem bq = test_upload(dev, x, ROOM), bk = test_upload(dev, x, ROOM),
               bv = test_upload(dev, x, ROOM), bo = test_upload(dev, out, ROOM),
               bl = test_upload(dev, lse, ROOM);
        const flashcl_status st = flashcl_attention_forward(dev, &e, bq, bk, bv, bo, bl, 0, NULL);
        snprintf(line, sizeof line, "seqlen_k INT_MAX - %d: ", INT_MAX - nk);
        snprintf(line + strlen(line), sizeof line - strlen(line),
                 "device forward refuses a packed V (%s: %s), writes nothing",
                 flashcl_status_string(st), flashcl_last_error(dev));
        clFinish(flashcl_context_cl_queue(dev));
        test_download(dev, bo, out, ROOM), test_download(dev, bl, lse, ROOM);
        expect((st == FLASHCL_ERROR_INVALID_ARGUMENT || st == FLASHCL_ERROR_INVALID_SHAPE ||
                st == FLASHCL_ERROR_OUT_OF_BOUNDS) &&
                   all_bytes(out, ROOM, POISON) && all_bytes(lse, ROOM, POISON),
               line, &failures);
        clReleaseMemObject(bq), clReleaseMemObject(bk), clReleaseMemObject(bv);
        clReleaseMemObject(bo), clReleaseMemObject(bl);
        free(x), free(out), free(lse);
    }
}

void refusals(flashcl_context *dev, flashcl_context *host) {
    enum { B = 1, H = 2, N = 40, D = 32 };
    flashcl_attention_desc d = test_attention_desc(FLASHCL_FLOAT8_E4M3, B, H, H, 24, N, D);
    const size_t bytes = flashcl_fp8_packed_v_bytes(&d), v_bytes = (size_t)B * N * H * D;
    expect(bytes == (size_t)B * H * packed_rows(D) * packed_keys(N),
           "flashcl_fp8_packed_v_bytes of an e4m3 desc", &failures);

    flashcl_attention_desc f16 = test_attention_desc(FLASHCL_FLOAT16, B, H, H, 24, N, D);
    flashcl_attention_desc f32 = test_attention_desc(FLASHCL_FLOAT32, B, H, H, 24, N, D);
    expect(flashcl_fp8_packed_v_bytes(&f16) == 0 && flashcl_fp8_packed_v_bytes(&f32) == 0,
           "flashcl_fp8_packed_v_bytes of float16 and float32 descs is 0", &failures);
    {
        unsigned char *v = test_xmalloc(v_bytes * 2), *p = test_xmalloc(bytes);
        memset(v, 0x38, v_bytes * 2), memset(p, 0x7f, bytes);
        const flashcl_status st = flashcl_fp8_pack_v_host(&f16, v, p);
        char line[300];
        snprintf(line, sizeof line,
                 "flashcl_fp8_pack_v_host refuses float16 V (%s: %s), writes nothing",
                 flashcl_status_string(st), flashcl_last_error(NULL));
        expect(st == FLASHCL_ERROR_INVALID_ARGUMENT && all_bytes(p, bytes, 0x7f), line, &failures);
        free(v), free(p);
    }

    /* the forward */
    flashcl_context *ctxs[2] = {host, dev};
    for (int i = 0; i < 2; ++i) {
        if (!ctxs[i])
            continue;
        flashcl_attention_desc e = f16;
        e.v_packed = 1;
        refuse_forward(ctxs[i], &e, 2 * v_bytes, FLASHCL_ERROR_INVALID_ARGUMENT, 1, "v_packed",
                       "v_packed with float16 q, k, v");
        e = d, e.v_packed = 1, e.v.offset = 8;
        refuse_forward(ctxs[i], &e, 8 + bytes, FLASHCL_ERROR_INVALID_ARGUMENT, 1, "v.offset",
                       "v_packed with v.offset 8 (not a multiple of 16)");
        if (ctxs[i] == dev) {
            e = d, e.v_packed = 1, e.v.offset = 32;
            refuse_forward(
                dev, &e, 32 + bytes - 1, FLASHCL_ERROR_OUT_OF_BOUNDS, 0, "v",
                "a packed V buffer one byte short of v.offset + flashcl_fp8_packed_v_bytes");
            /* The packed V's size, not V's: a buffer that holds V but not its padding to 64 dims
             * and 128 keys (2560 bytes here, against 16384 packed). */
            e = d, e.v_packed = 1;
            refuse_forward(dev, &e, v_bytes, FLASHCL_ERROR_OUT_OF_BOUNDS, 0, "v",
                           "a packed V buffer of V's own size, short of the packed size");
        }
    }
    /* Head dims off the packed layout's (the Hopper kernel's 16..128 by 16): no size, no pack,
     * no packed forward. */
    static const int off_dims[] = {8, 40, 136};
    for (size_t i = 0; i < sizeof off_dims / sizeof off_dims[0]; ++i) {
        const int dd = off_dims[i];
        flashcl_attention_desc e = test_attention_desc(FLASHCL_FLOAT8_E4M3, B, H, H, 24, N, dd);
        const size_t nv = (size_t)B * N * H * dd, room = (size_t)B * H * 192 * packed_keys(N);
        unsigned char *v = test_xmalloc(nv), *p = test_xmalloc(room);
        memset(v, 0x38, nv), memset(p, 0x7f, room);
        const size_t sz = flashcl_fp8_packed_v_bytes(&e);
        const flashcl_status st = flashcl_fp8_pack_v_host(&e, v, p);
        char line[300];
        snprintf(line, sizeof line,
                 "head_dim %d: flashcl_fp8_packed_v_bytes %zu, the host pack refused (%s), writes "
                 "nothing",
                 dd, sz, flashcl_status_string(st));
        expect(sz == 0 && st == FLASHCL_ERROR_INVALID_ARGUMENT && all_bytes(p, room, 0x7f), line,
               &failures);
        if (dev) {
            snprintf(line, sizeof line, "head_dim %d", dd);
            refuse_pack(dev, &e, nv, room, 0, FLASHCL_ERROR_INVALID_ARGUMENT, line);
        }
        e.v_packed = 1;
        for (int c = 0; c < 2; ++c)
            if (ctxs[c]) {
                snprintf(line, sizeof line, "v_packed at head_dim %d", dd);
                refuse_forward(ctxs[c], &e, room, FLASHCL_ERROR_INVALID_ARGUMENT, 1, "head_dim",
                               line);
            }
        free(v), free(p);
    }
    huge_key_counts(dev);
    if (!dev)
        return;

    /* the pack */
    refuse_pack(dev, &d, v_bytes, 8 + bytes + 64, 8, FLASHCL_ERROR_INVALID_ARGUMENT,
                "packed_offset 8");
    refuse_pack(dev, &d, v_bytes, 16 + bytes - 1, 16, FLASHCL_ERROR_OUT_OF_BOUNDS,
                "a destination one byte short of packed_offset + flashcl_fp8_packed_v_bytes");
    refuse_pack(dev, &d, v_bytes - 1, bytes, 0, FLASHCL_ERROR_OUT_OF_BOUNDS,
                "a V buffer one byte short of V");
    refuse_pack(dev, &f16, 2 * v_bytes, bytes, 0, FLASHCL_ERROR_INVALID_ARGUMENT, "float16 V");
    if (host) {
        cl_mem b = test_upload(dev, NULL, bytes);
        const flashcl_status st = flashcl_fp8_pack_v(host, &d, b, b, 0, NULL);
        char line[300];
        snprintf(line, sizeof line, "flashcl_fp8_pack_v on a host context (%s: %s)",
                 flashcl_status_string(st), flashcl_last_error(host));
        expect(st == FLASHCL_ERROR_UNSUPPORTED, line, &failures);
        clReleaseMemObject(b);
    }
}
