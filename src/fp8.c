/* fp8.c: the OCP 8-bit floating-point formats (e4m3fn, e5m2): conversions and amax-scaled quantization on the host.
 *
 * A format is 1 sign bit, E exponent bits (bias 2^(E-1) - 1) and M mantissa
 * bits. e4m3fn gives up infinity for one more binade: only S.1111.111 is NaN,
 * so its largest value is 1.75 * 2^8 = 448. e5m2 is IEEE-like: S.11111.00 is
 * infinity, S.11111.xx (xx != 0) NaN, largest 1.75 * 2^15 = 57344.
 *
 * Encoding is the hardware's cvt.rn.satfinite: round to nearest even, then
 * clamp to +-max (infinities included); NaN to NaN. host_ref/ref_fp8.c has an
 * independent encoder (nearest value of a decoded table), which the tests
 * compare against this one.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct fp8_format {
    int man_bits, bias;
    unsigned max_code; /* the largest finite magnitude's bits */
    float max;
} fp8_format;

static const fp8_format e4m3 = {3, 7, 0x7e, 448.0f};
static const fp8_format e5m2 = {2, 15, 0x7b, 57344.0f};

static const fp8_format *format_of(flashcl_dtype format) {
    return format == FLASHCL_FLOAT8_E4M3 ? &e4m3 : format == FLASHCL_FLOAT8_E5M2 ? &e5m2 : NULL;
}

int flashcl_dtype_is_fp8(flashcl_dtype dtype) {
    return format_of(dtype) != NULL;
}

float flashcl_fp8_decode(flashcl_dtype format, unsigned char bits) {
    const fp8_format *f = format_of(format);
    if (!f)
        return NAN;
    const int m = f->man_bits, exp_max = (1 << (7 - m)) - 1;
    const int e = (bits & 0x7f) >> m, man = bits & ((1 << m) - 1);
    float mag;
    if (f == &e4m3 && e == exp_max && man == (1 << m) - 1)
        mag = NAN;
    else if (f == &e5m2 && e == exp_max)
        mag = man ? NAN : INFINITY;
    else if (e == 0) /* subnormal: man * 2^(1 - bias - m) */
        mag = ldexpf((float)man, 1 - f->bias - m);
    else
        mag = ldexpf((float)((1 << m) + man), e - f->bias - m);
    return bits & 0x80 ? -mag : mag;
}

unsigned char flashcl_fp8_encode(flashcl_dtype format, float value) {
    const fp8_format *f = format_of(format);
    if (!f || isnan(value))
        return (unsigned char)(0x7f | (f && signbit(value) ? 0x80 : 0));
    const unsigned sign = signbit(value) ? 0x80 : 0;
    const float a = fabsf(value);
    if (a >= f->max) /* infinity included */
        return (unsigned char)(sign | f->max_code);
    const int m = f->man_bits;
    /* The quantum (spacing of the format's values) at a's binade, a power of
     * two, so a / quantum is exact and nearbyintf rounds to even. Below the
     * smallest normal 2^(1 - bias) the spacing is the subnormal one. */
    int e;
    frexpf(a, &e); /* a = fr * 2^e, fr in [0.5, 1): binade exponent e - 1 */
    int binade = e - 1;
    if (binade < 1 - f->bias)
        binade = 1 - f->bias;
    const float q = nearbyintf(ldexpf(a, m - binade)); /* in [0, 2^(m+1)] */
    /* Subnormals: the code is q itself (q = 2^m lands on the smallest normal).
     * Normals: ((binade + bias) << m) + q - 2^m; q = 2^(m+1) carries into the
     * next binade by the same sum. */
    unsigned code = a < ldexpf(1.0f, 1 - f->bias) ? (unsigned)q
                                                   : ((unsigned)(binade + f->bias) << m) + (unsigned)q - (1u << m);
    if (code > f->max_code) /* rounded up past max: satfinite */
        code = f->max_code;
    return (unsigned char)(sign | code);
}

/* src's layout with zero strides resolved to packed. */
static flashcl_layout src_layout(const flashcl_fp8_quant_desc *d) {
    flashcl_layout l = d->src;
    flashcl_default_layout(&l, d->seqlen, d->heads, d->head_dim);
    return l;
}

/* Element (b, s, h, x) of a resolved layout. */
static size_t src_index(const flashcl_layout *l, int b, int s, int h, int x) {
    return l->offset + (size_t)b * l->stride_batch + (size_t)s * l->stride_seq + (size_t)h * l->stride_head +
           (size_t)x;
}

/* Row blocks of a (batch, head) with block quantization (1 without). */
static size_t row_blocks(const flashcl_fp8_quant_desc *d) {
    return flashcl_fp8_row_blocks(d->seqlen, d->block_rows);
}

/* Descale factors written: one, one per (batch, head), or one per row block of each. */
static size_t group_count(const flashcl_fp8_quant_desc *d) {
    return d->per_head ? (size_t)d->batch * (size_t)d->heads * row_blocks(d) : 1;
}

/* The group (descale index) of row s of head h of batch b, as flashcl_fp8_scales indexes it. */
static size_t group_of(const flashcl_fp8_quant_desc *d, int b, int s, int h) {
    if (!d->per_head)
        return 0;
    return ((size_t)b * (size_t)d->heads + (size_t)h) * row_blocks(d) +
           (d->block_rows > 0 ? (size_t)(s / d->block_rows) : 0);
}

/* Incoherent processing (hadamard_seed): the random signs s of
 * M = diag(s) H / sqrt(D), +-1 from a splitmix64 stream of the seed, the same
 * floats for both helpers (the device gets these). */
static void hadamard_signs(unsigned long long seed, int dim, float *signs) {
    uint64_t z = (uint64_t)seed;
    for (int i = 0; i < dim; ++i) {
        z += 0x9e3779b97f4a7c15ull;
        uint64_t x = z;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        x ^= x >> 31;
        signs[i] = x >> 63 ? -1.0f : 1.0f;
    }
}

/* row <- row H_dim (unnormalised): the fast Walsh-Hadamard transform (Sylvester's H), its
 * butterflies in this order, which cl/fp8.cl's walsh_hadamard repeats so that the rounding is
 * the same. */
static void walsh_hadamard(float *row, int dim) {
    for (int len = 1; len < dim; len <<= 1)
        for (int i = 0; i < dim; i += 2 * len)
            for (int j = i; j < i + len; ++j) {
                const float a = row[j], b = row[j + len];
                row[j] = a + b;
                row[j + len] = a - b;
            }
}

/* row <- row M: signs, the transform, then 1/sqrt(D) as the float inv_sqrt. */
static void hadamard_row(float *row, int dim, const float *signs, float inv_sqrt) {
    for (int i = 0; i < dim; ++i)
        row[i] *= signs[i];
    walsh_hadamard(row, dim);
    for (int i = 0; i < dim; ++i)
        row[i] *= inv_sqrt;
}

/* 1/sqrt(D) rounded once, here, for both helpers. */
static float hadamard_inv_sqrt(int dim) {
    return (float)(1.0 / sqrt((double)dim));
}

/* Checks desc for either quantize helper (ctx NULL for the host one). */
static flashcl_status check_desc(flashcl_context *ctx, const char *fn, const flashcl_fp8_quant_desc *desc,
                                 const fp8_format **f) {
    *f = desc ? format_of(desc->format) : NULL;
    if (!desc)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
    if (!*f)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s: format %d is not FLASHCL_FLOAT8_E4M3 or _E5M2",
                            fn, (int)desc->format);
    if (desc->src_dtype != FLASHCL_FLOAT32 && desc->src_dtype != FLASHCL_FLOAT16 &&
        desc->src_dtype != FLASHCL_BFLOAT16)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "%s: src_dtype %d is not float32, float16 or bfloat16", fn, (int)desc->src_dtype);
    if (desc->batch < 1 || desc->seqlen < 1 || desc->heads < 1 || desc->head_dim < 1)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "%s: batch %d, seqlen %d, heads %d, head_dim %d (all >= 1)",
                            fn, desc->batch, desc->seqlen, desc->heads, desc->head_dim);
    if (desc->block_rows < 0 || (desc->block_rows > 0 && !desc->per_head))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "%s: block_rows %d (>= 0; > 0 needs per_head: blocks are counted per (batch, head))", fn,
                            desc->block_rows);
    if (desc->hadamard_seed && (desc->head_dim > 256 || (desc->head_dim & (desc->head_dim - 1))))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "%s: hadamard_seed needs a head_dim that is a power of two <= 256 (Sylvester's "
                            "Hadamard matrix), not %d",
                            fn, desc->head_dim);
    return FLASHCL_SUCCESS;
}

/* The scales of one group from its amax: descale = amax / max and its
 * inverse max / amax (1 and 1 for an all-zero group), both correctly rounded
 * here, so the host and device helpers multiply by the same float. */
static void group_scales(const fp8_format *f, float amax, float *descale, float *inv) {
    *descale = amax > 0.0f ? amax / f->max : 1.0f;
    *inv = amax > 0.0f ? f->max / amax : 1.0f;
}

flashcl_status flashcl_fp8_quantize_host(const flashcl_fp8_quant_desc *desc, const void *src, unsigned char *dst,
                                         float *descale) {
    const fp8_format *f;
    flashcl_status st = check_desc(NULL, "flashcl_fp8_quantize_host", desc, &f);
    if (st)
        return st;
    if (!src || !dst || !descale)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "flashcl_fp8_quantize_host: a NULL argument");
    const flashcl_layout l = src_layout(desc);
    const size_t groups = group_count(desc);
    const int dim = desc->head_dim;
    float *amax = calloc(2 * groups, sizeof *amax), *inv = amax + groups;
    float *row = malloc((size_t)dim * 2 * sizeof *row), *signs = row + dim;
    if (!amax || !row) {
        free(amax), free(row);
        return flashcl_fail(NULL, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    const float inv_sqrt = hadamard_inv_sqrt(dim);
    if (desc->hadamard_seed)
        hadamard_signs(desc->hadamard_seed, dim, signs);
    /* Pass 1: amax per group (after the rotation), refusing non-finite input
     * (checked before the rotation, which would smear it) before any write. */
    for (int b = 0; b < desc->batch; ++b)
        for (int h = 0; h < desc->heads; ++h)
            for (int s = 0; s < desc->seqlen; ++s) {
                for (int x = 0; x < dim; ++x) {
                    row[x] = flashcl_host_load(src, desc->src_dtype, src_index(&l, b, s, h, x));
                    if (!isfinite(row[x])) {
                        const int is_nan = isnan(row[x]);
                        free(amax), free(row);
                        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT,
                                            "flashcl_fp8_quantize_host: %s at (batch %d, seq %d, head %d, dim %d)",
                                            is_nan ? "NaN" : "infinity", b, s, h, x);
                    }
                }
                if (desc->hadamard_seed)
                    hadamard_row(row, dim, signs, inv_sqrt);
                float *a = &amax[group_of(desc, b, s, h)];
                for (int x = 0; x < dim; ++x)
                    *a = fmaxf(*a, fabsf(row[x]));
            }
    for (size_t g = 0; g < groups; ++g)
        group_scales(f, amax[g], &descale[g], &inv[g]);
    /* Pass 2: x * inv, rounded. */
    size_t o = 0;
    for (int b = 0; b < desc->batch; ++b)
        for (int s = 0; s < desc->seqlen; ++s)
            for (int h = 0; h < desc->heads; ++h) {
                const float sc = inv[group_of(desc, b, s, h)];
                for (int x = 0; x < dim; ++x)
                    row[x] = flashcl_host_load(src, desc->src_dtype, src_index(&l, b, s, h, x));
                if (desc->hadamard_seed)
                    hadamard_row(row, dim, signs, inv_sqrt);
                for (int x = 0; x < dim; ++x)
                    dst[o++] = flashcl_fp8_encode(desc->format, row[x] * sc);
            }
    free(amax), free(row);
    flashcl_clear_error(NULL);
    return FLASHCL_SUCCESS;
}

/* ---- on the device (cl/fp8.cl) ---------------------------------------------------------------- */

/* Sets the row arguments shared by both kernels (ROW_ARGS in cl/fp8.cl);
 * *next: the index of the kernel's next argument. signs: the Hadamard signs
 * (NULL without hadamard_seed: the kernel is built without those arguments). */
static cl_int set_row_args(cl_kernel k, const flashcl_fp8_quant_desc *d, const flashcl_layout *l, cl_mem src,
                           cl_mem signs, cl_uint *next) {
    const cl_ulong u[4] = {l->offset, l->stride_batch, l->stride_seq, l->stride_head};
    const cl_int heads = d->heads, dim = d->head_dim, per_head = d->per_head != 0;
    const cl_int block_rows = d->per_head && d->block_rows > 0 ? d->block_rows : 0;
    cl_uint a = 0;
    cl_int err = clSetKernelArg(k, a++, sizeof src, &src);
    for (int i = 0; i < 4; ++i)
        err |= clSetKernelArg(k, a++, sizeof u[i], &u[i]);
    err |= clSetKernelArg(k, a++, sizeof heads, &heads);
    err |= clSetKernelArg(k, a++, sizeof dim, &dim);
    err |= clSetKernelArg(k, a++, sizeof per_head, &per_head);
    err |= clSetKernelArg(k, a++, sizeof block_rows, &block_rows);
    if (signs) {
        const cl_float inv_sqrt = hadamard_inv_sqrt(d->head_dim);
        err |= clSetKernelArg(k, a++, sizeof signs, &signs);
        err |= clSetKernelArg(k, a++, sizeof inv_sqrt, &inv_sqrt);
    }
    *next = a;
    return err;
}

/* cl/fp8.cl's kernel `which` (1 fp8_amax, 2 fp8_quantize, 3 fp8_dequantize) for desc. One kernel
 * per (file, options): FP8_KERNEL names it, so each is a program of its own; HADAMARD is the
 * row length of the rotation (0: none), fixed at build. */
static flashcl_status fp8_kernel(flashcl_context *ctx, const flashcl_fp8_quant_desc *desc, int which, cl_kernel *k) {
    static const char *const names[4] = {"", "fp8_amax", "fp8_quantize", "fp8_dequantize"};
    char options[128];
    snprintf(options, sizeof options, "-cl-std=CL1.2 -DDTYPE=%d -DFP8_E5M2=%d -DHADAMARD=%d -DFP8_KERNEL=%d",
             (int)desc->src_dtype, desc->format == FLASHCL_FLOAT8_E5M2, desc->hadamard_seed ? desc->head_dim : 0,
             which);
    return flashcl_get_kernel(ctx, "fp8.cl", names[which], options, k);
}

/* What both device helpers check before anything is enqueued: the desc; the factor count, which
 * cl/fp8.cl indexes with int; and the buffers' sizes: `values` (named vname) in desc->src's
 * layout and src_dtype, `bytes` packed FP8, descale a float a factor. */
static flashcl_status check_device_args(flashcl_context *ctx, const char *fn, const flashcl_fp8_quant_desc *desc,
                                        const fp8_format **f, const char *vname, cl_mem values, const char *bname,
                                        cl_mem bytes, cl_mem descale) {
    flashcl_status st = check_desc(ctx, fn, desc, f);
    if (st)
        return st;
    if (group_count(desc) >= (size_t)1 << 28)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s: %zu descale factors are too many", fn,
                            group_count(desc));
    const flashcl_layout l = src_layout(desc);
    const size_t n = (size_t)desc->batch * desc->seqlen * desc->heads * desc->head_dim;
    if ((st = flashcl_check_buffer(ctx, vname, values,
                                   flashcl_layout_bytes(&l, desc->batch, desc->seqlen, desc->heads, desc->head_dim,
                                                        flashcl_dtype_size(desc->src_dtype)))) ||
        (st = flashcl_check_buffer(ctx, bname, bytes, n)) ||
        (st = flashcl_check_buffer(ctx, "descale", descale, group_count(desc) * sizeof(float))))
        return st;
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_fp8_quantize(flashcl_context *ctx, const flashcl_fp8_quant_desc *desc, cl_mem src, cl_mem dst,
                                    cl_mem descale, cl_event *event) {
    FLASHCL_LOCKED(ctx);
    const flashcl_status entry = flashcl_device_entry(ctx, "flashcl_fp8_quantize_host");
    if (entry != FLASHCL_SUCCESS)
        return entry;
    const fp8_format *f;
    flashcl_status st = check_device_args(ctx, "flashcl_fp8_quantize", desc, &f, "src", src, "dst", dst, descale);
    if (st)
        return st;
    const flashcl_layout l = src_layout(desc);
    const int groups = (int)group_count(desc);
    if (dst == src || descale == src || descale == dst)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "flashcl_fp8_quantize: src, dst and descale must differ");

    cl_kernel k_amax, k_quant;
    const int hadamard = desc->hadamard_seed ? desc->head_dim : 0;
    if ((st = fp8_kernel(ctx, desc, 1, &k_amax)) || (st = fp8_kernel(ctx, desc, 2, &k_quant)))
        return st;
    float signs_host[256];
    if (hadamard)
        hadamard_signs(desc->hadamard_seed, desc->head_dim, signs_host);

    /* amax: groups + 1 uints; inv: groups floats. */
    cl_int err;
    uint32_t *host = calloc((size_t)groups + 1, 4);
    float *scales = calloc(2 * (size_t)groups, sizeof(float));
    cl_mem scratch = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, ((size_t)groups + 1) * 4, NULL, &err);
    cl_mem inv = scratch ? clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_ONLY, (size_t)groups * 4, NULL, &err) : NULL;
    cl_mem signs = inv && hadamard ? clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                                    (size_t)hadamard * sizeof(float), signs_host, &err)
                                   : NULL;
    if (!host || !scales || !scratch || !inv || (hadamard && !signs)) {
        free(host), free(scales);
        if (inv)
            clReleaseMemObject(inv);
        if (scratch)
            clReleaseMemObject(scratch);
        return !host || !scales ? flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory")
                                : flashcl_fail(ctx, err, "flashcl_fp8_quantize: scratch: %s", flashcl_status_string(err));
    }
    const size_t global[3] = {(size_t)desc->seqlen, (size_t)desc->heads, (size_t)desc->batch};
    /* 1. amax, read back (blocking): a NaN or infinity is refused before anything is written. */
    err = clEnqueueWriteBuffer(ctx->queue, scratch, CL_TRUE, 0, ((size_t)groups + 1) * 4, host, 0, NULL, NULL);
    cl_uint next;
    err |= set_row_args(k_amax, desc, &l, src, signs, &next);
    err |= clSetKernelArg(k_amax, next, sizeof scratch, &scratch);
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(ctx->queue, k_amax, 3, NULL, global, NULL, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clEnqueueReadBuffer(ctx->queue, scratch, CL_TRUE, 0, ((size_t)groups + 1) * 4, host, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        st = flashcl_fail(ctx, err, "flashcl_fp8_quantize: the amax pass failed: %s", flashcl_status_string(err));
    } else if (host[groups] >= 0x7f800000u) {
        /* amax[groups] is the maximum before any rotation, which would turn
         * an infinity into NaN; the groups' own are after it. */
        int g = 0;
        while (g < groups && host[g] < 0x7f800000u)
            ++g;
        const int bh = (int)((size_t)g / row_blocks(desc));
        st = flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                          "flashcl_fp8_quantize: src holds a %s (in batch %d, head %d%s); nothing written",
                          host[groups] > 0x7f800000u ? "NaN" : "infinity", desc->per_head ? bh / desc->heads : 0,
                          desc->per_head ? bh % desc->heads : 0, desc->per_head ? "" : " or later: per-tensor amax");
    } else {
        /* 2. the scales, on the host; 3. the bytes. */
        for (int g = 0; g < groups; ++g) {
            float a;
            memcpy(&a, &host[g], sizeof a);
            group_scales(f, a, &scales[g], &scales[groups + g]);
        }
        err = clEnqueueWriteBuffer(ctx->queue, descale, CL_TRUE, 0, (size_t)groups * 4, scales, 0, NULL, NULL);
        err |= clEnqueueWriteBuffer(ctx->queue, inv, CL_TRUE, 0, (size_t)groups * 4, scales + groups, 0, NULL, NULL);
        if (err == CL_SUCCESS) {
            err = set_row_args(k_quant, desc, &l, src, signs, &next);
            err |= clSetKernelArg(k_quant, next, sizeof inv, &inv);
            err |= clSetKernelArg(k_quant, next + 1, sizeof dst, &dst);
        }
        if (err == CL_SUCCESS)
            err = clEnqueueNDRangeKernel(ctx->queue, k_quant, 3, NULL, global, NULL, 0, NULL, event);
        if (err != CL_SUCCESS)
            st = flashcl_fail(ctx, err, "flashcl_fp8_quantize: %s", flashcl_status_string(err));
    }
    /* Released while the kernel may still run: OpenCL keeps them until it ends. */
    clReleaseMemObject(inv);
    clReleaseMemObject(scratch);
    if (signs)
        clReleaseMemObject(signs);
    free(host), free(scales);
    return st;
}

/* ---- dequantization ---------------------------------------------------------------------------- */

/* y <- y M^T = y H diag(signs) / sqrt(D): cl/fp8.cl's fp8_dequantize order. */
static void hadamard_row_back(float *row, int dim, const float *signs, float inv_sqrt) {
    walsh_hadamard(row, dim);
    for (int i = 0; i < dim; ++i)
        row[i] = row[i] * inv_sqrt * signs[i];
}

flashcl_status flashcl_fp8_dequantize_host(const flashcl_fp8_quant_desc *desc, const unsigned char *src,
                                           const float *descale, void *dst) {
    const fp8_format *f;
    flashcl_status st = check_desc(NULL, "flashcl_fp8_dequantize_host", desc, &f);
    if (st)
        return st;
    if (!src || !dst || !descale)
        return flashcl_fail(NULL, FLASHCL_ERROR_INVALID_ARGUMENT, "flashcl_fp8_dequantize_host: a NULL argument");
    const int dim = desc->head_dim;
    float *row = malloc((size_t)dim * 2 * sizeof *row), *signs = row + dim;
    if (!row)
        return flashcl_fail(NULL, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    if (desc->hadamard_seed)
        hadamard_signs(desc->hadamard_seed, dim, signs);
    const float inv_sqrt = hadamard_inv_sqrt(dim);
    const flashcl_layout l = src_layout(desc);
    size_t in = 0;
    for (int b = 0; b < desc->batch; ++b)
        for (int s = 0; s < desc->seqlen; ++s)
            for (int h = 0; h < desc->heads; ++h) {
                const float sc = descale[group_of(desc, b, s, h)];
                for (int x = 0; x < dim; ++x)
                    row[x] = flashcl_fp8_decode(desc->format, src[in++]) * sc;
                if (desc->hadamard_seed)
                    hadamard_row_back(row, dim, signs, inv_sqrt);
                for (int x = 0; x < dim; ++x)
                    flashcl_host_store(dst, desc->src_dtype, src_index(&l, b, s, h, x), row[x]);
            }
    free(row);
    flashcl_clear_error(NULL);
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_fp8_dequantize(flashcl_context *ctx, const flashcl_fp8_quant_desc *desc, cl_mem src,
                                      cl_mem descale, cl_mem dst, cl_event *event) {
    FLASHCL_LOCKED(ctx);
    const flashcl_status entry = flashcl_device_entry(ctx, "flashcl_fp8_dequantize_host");
    if (entry != FLASHCL_SUCCESS)
        return entry;
    const fp8_format *f;
    flashcl_status st = check_device_args(ctx, "flashcl_fp8_dequantize", desc, &f, "dst", dst, "src", src, descale);
    if (st)
        return st;
    const flashcl_layout l = src_layout(desc);
    if (dst == src || dst == descale)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "flashcl_fp8_dequantize: dst must differ from src and descale");
    cl_kernel kernel;
    const int hadamard = desc->hadamard_seed ? desc->head_dim : 0;
    if ((st = fp8_kernel(ctx, desc, 3, &kernel)))
        return st;
    float signs_host[256];
    cl_int err = CL_SUCCESS;
    cl_mem signs = NULL;
    if (hadamard) {
        hadamard_signs(desc->hadamard_seed, desc->head_dim, signs_host);
        signs = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (size_t)hadamard * sizeof(float),
                               signs_host, &err);
        if (!signs)
            return flashcl_fail(ctx, err, "flashcl_fp8_dequantize: signs: %s", flashcl_status_string(err));
    }
    /* The row arguments are quantize's, with dst in src's place. */
    cl_uint next;
    err = set_row_args(kernel, desc, &l, dst, signs, &next);
    err |= clSetKernelArg(kernel, next, sizeof descale, &descale);
    err |= clSetKernelArg(kernel, next + 1, sizeof src, &src);
    const size_t global[3] = {(size_t)desc->seqlen, (size_t)desc->heads, (size_t)desc->batch};
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(ctx->queue, kernel, 3, NULL, global, NULL, 0, NULL, event);
    if (signs)
        clReleaseMemObject(signs); /* kept by OpenCL until the kernel ends */
    if (err != CL_SUCCESS)
        return flashcl_fail(ctx, err, "flashcl_fp8_dequantize: %s", flashcl_status_string(err));
    return FLASHCL_SUCCESS;
}
