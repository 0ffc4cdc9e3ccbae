/* layout.c: tensor layouts and buffer checks shared by every entry point. */
#include "internal.h"

void flashcl_default_layout(flashcl_layout *l, int seqlen, int heads, int head_dim) {
    if (l->stride_batch || l->stride_seq || l->stride_head)
        return;
    l->stride_head = (size_t)head_dim;
    l->stride_seq = (size_t)heads * (size_t)head_dim;
    l->stride_batch = (size_t)seqlen * l->stride_seq;
}

int flashcl_layout_rows_16_bytes(const flashcl_layout *l) {
    return l->offset % 16 == 0 && l->stride_batch % 16 == 0 && l->stride_seq % 16 == 0 && l->stride_head % 16 == 0;
}

size_t flashcl_layout_bytes(const flashcl_layout *l, int batch, int seqlen, int heads, int head_dim,
                            size_t elem) {
    size_t t = l->offset + (size_t)head_dim;
    if (t < l->offset || !flashcl_mul_add((size_t)(batch - 1), l->stride_batch, t, &t) ||
        !flashcl_mul_add((size_t)(seqlen - 1), l->stride_seq, t, &t) ||
        !flashcl_mul_add((size_t)(heads - 1), l->stride_head, t, &t) || !flashcl_mul_add(t, elem, 0, &t))
        return 0;
    return t;
}

flashcl_status flashcl_check_buffer(flashcl_context *ctx, const char *name, cl_mem buf, size_t need) {
    if (!buf)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s buffer is NULL", name);
    size_t size = 0;
    cl_int err = clGetMemObjectInfo(buf, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, err, "%s: not a valid cl_mem (%s)", name, flashcl_status_string(err));
    if (need == 0 || need > size)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_BOUNDS,
                            "%s: layout reaches byte %zu but the buffer holds %zu", name, need, size);
    return FLASHCL_SUCCESS;
}
