/* nv_tma.c: tensor maps for Hopper's Tensor Memory Accelerator, encoded by the CUDA driver.
 *
 * Why. On the H200 the wgmma forward's tile copies, 16 bytes per work-item
 * through cp.async, ran serially with its tensor-core products: at
 * (4,32,4096,128) the kernel took 3.34 ms, 2.24 without copying tiles
 * (BENCHMARKS.md, 2026-12-02, 034269e). One cp.async.bulk.tensor, issued by one
 * work-item, copies a whole tile in the kernels' 128-byte-swizzled layout,
 * but it reads a tensor map: a 128-byte descriptor that only the CUDA driver
 * encodes (cuTensorMapEncodeTiled), and OpenCL has no call for it.
 * NVIDIA's OpenCL runs on that driver, so libcuda.so.1 is on every machine
 * where this matters. It is opened at run time (dlopen), so flashcl
 * neither builds nor links against CUDA. Where it does not load, or encoding
 * fails, the kernels copy through cp.async as before. bench/tma_probe.c
 * checked the route on the H200: the tiles land exactly, and a TMA stream
 * read 4255 GB/s against cp.async's 3890.
 *
 * A map holds its tensor's device address, which OpenCL does not tell the
 * host. So the host encodes a placeholder address, and each work-group
 * writes its own copy of the map to global memory with the buffer's address
 * put in by tensormap.replace (cl/flash_fwd_sm90.cl, USE_TMA).
 *
 * The encoder refuses to run without a current CUDA context (error 201), so
 * device 0's primary context is retained for the life of the process; a
 * process that uses CUDA itself shares it. (Were the kernels to replace the
 * dims and strides as well as the address, one map per tile shape would
 * do, and the context could be released after encoding it.)
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The driver's types, by value (no cuda.h at build time). */
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_device_get_fn)(int *, int);
typedef int (*cu_primary_ctx_retain_fn)(void **, int);
typedef int (*cu_ctx_set_current_fn)(void *);
typedef int (*cu_encode_tiled_fn)(void *map, int dtype, unsigned rank, void *address, const uint64_t *dims,
                                  const uint64_t *strides, const unsigned *box, const unsigned *element_strides,
                                  int interleave, int swizzle, int l2_promotion, int oob_fill);
enum {
    CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0,  /* FP8 bytes */
    CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1, /* the bits of float16 and bfloat16 alike */
    CU_TENSOR_MAP_INTERLEAVE_NONE = 0,
    CU_TENSOR_MAP_SWIZZLE_128B = 3,
    CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3,
    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 /* out-of-bounds elements read as zero */
};
/* Any 16-byte-aligned address: every work-group replaces it. */
#define PLACEHOLDER_ADDRESS ((uintptr_t)1 << 20)

static struct {
    pthread_once_t once;
    int ready;
    void *context; /* device 0's primary context: encoding needs one current */
    cu_ctx_set_current_fn set_current;
    cu_encode_tiled_fn encode;
} driver = {PTHREAD_ONCE_INIT, 0, NULL, NULL, NULL};

static void load_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        flashcl_log("TMA: libcuda.so.1 did not load (%s): tiles are copied through cp.async", dlerror());
        return;
    }
    cu_init_fn init = (cu_init_fn)dlsym(lib, "cuInit");
    cu_device_get_fn device_get = (cu_device_get_fn)dlsym(lib, "cuDeviceGet");
    cu_primary_ctx_retain_fn retain = (cu_primary_ctx_retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
    driver.set_current = (cu_ctx_set_current_fn)dlsym(lib, "cuCtxSetCurrent");
    driver.encode = (cu_encode_tiled_fn)dlsym(lib, "cuTensorMapEncodeTiled");
    int device = 0, rc = -1;
    if (init && device_get && retain && driver.set_current && driver.encode && (rc = init(0)) == 0 &&
        (rc = device_get(&device, 0)) == 0 && (rc = retain(&driver.context, device)) == 0) {
        driver.ready = 1;
        return;
    }
    /* The library stays loaded: the driver itself is, under NVIDIA's OpenCL. */
    flashcl_log("TMA: the CUDA driver gave no tensor-map encoder (error %d): tiles are copied through cp.async",
                rc);
}

int flashcl_tma_available(void) {
    pthread_once(&driver.once, load_driver);
    return driver.ready;
}

int flashcl_tma_strides(const uint64_t dims[4], const uint64_t strides[3], unsigned elem_bytes, uint64_t bytes[3]) {
    for (int i = 0; i < 3; ++i) {
        /* A dimension of extent 1 is never stepped: its stride only has to be
         * valid, so it becomes the extent of the ones below it. */
        const uint64_t s = dims[i + 1] == 1 && i > 0 ? bytes[i - 1] * dims[i] : elem_bytes * strides[i];
        if (s == 0 || s % 16 != 0 || s >= ((uint64_t)1 << 40))
            return 0;
        bytes[i] = s;
    }
    return 1;
}

int flashcl_tma_encode(flashcl_tensor_map *map, unsigned elem_bytes, const uint64_t dims[4],
                       const uint64_t strides[3], unsigned box_rows) {
    uint64_t bytes[3];
    if ((elem_bytes != 1 && elem_bytes != 2) || !flashcl_tma_strides(dims, strides, elem_bytes, bytes) ||
        !flashcl_tma_available())
        return 0;
    /* One 128-byte swizzle span of columns a box. */
    const unsigned box[4] = {128 / elem_bytes, box_rows, 1, 1}, element_strides[4] = {1, 1, 1, 1};
    /* cuCtxSetCurrent binds the context to the calling thread only, which may
     * be any of the caller's. */
    if (driver.set_current(driver.context) != 0)
        return 0;
    memset(map, 0, sizeof *map);
    const int type = elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16;
    return driver.encode(map->words, type, 4, (void *)PLACEHOLDER_ADDRESS, dims, bytes, box, element_strides,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == 0;
}

int flashcl_tma_usable(flashcl_context *ctx) {
    const char *env = getenv("FLASHCL_TMA");
    cl_command_queue_properties props = 0;
    return !ctx->no_tma && !(env && !strcmp(env, "0")) &&
           clGetCommandQueueInfo(ctx->queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL) == CL_SUCCESS &&
           !(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) && flashcl_tma_available();
}

int flashcl_tma_encode_layout(flashcl_tensor_map *map, const flashcl_layout *l, unsigned elem_bytes, int batch,
                              int seqlen, int heads, int dim, unsigned box_rows) {
    /* The kernel adds the offset to the buffer's address: it must keep 16-byte alignment. */
    if ((l->offset * elem_bytes) % 16)
        return 0;
    const uint64_t dims[4] = {(uint64_t)dim, (uint64_t)seqlen, (uint64_t)heads, (uint64_t)batch};
    const uint64_t strides[3] = {l->stride_seq, l->stride_head, l->stride_batch};
    return flashcl_tma_encode(map, elem_bytes, dims, strides, box_rows);
}

int flashcl_tma_encode_pair(const flashcl_layout *a, const flashcl_layout *b, int batch, int seqlen, int heads,
                            int dim, unsigned box_rows, flashcl_tensor_map maps[2]) {
    return flashcl_tma_encode_layout(&maps[0], a, 2, batch, seqlen, heads, dim, box_rows) &&
           flashcl_tma_encode_layout(&maps[1], b, 2, batch, seqlen, heads, dim, box_rows);
}

flashcl_status flashcl_ensure_tma_slots(flashcl_context *ctx, size_t groups) {
    const size_t bytes = groups * FLASHCL_TMA_SLOT_BYTES;
    if (ctx->tma_slots_bytes >= bytes)
        return FLASHCL_SUCCESS;
    cl_int err;
    cl_mem m = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (!m)
        return flashcl_fail(ctx, err, "allocating %zu bytes of tensor-map slots: %s", bytes,
                            flashcl_status_string(err));
    /* Released only once the calls already enqueued are done with it. */
    if (ctx->tma_slots)
        clReleaseMemObject(ctx->tma_slots);
    ctx->tma_slots = m;
    ctx->tma_slots_bytes = bytes;
    return FLASHCL_SUCCESS;
}

cl_int flashcl_set_tma_args(cl_kernel kernel, cl_uint *a, const flashcl_tensor_map maps[2], cl_mem slots) {
    if (!maps)
        return CL_SUCCESS;
    cl_int err = clSetKernelArg(kernel, (*a)++, sizeof maps[0].words, maps[0].words);
    err |= clSetKernelArg(kernel, (*a)++, sizeof maps[1].words, maps[1].words);
    err |= clSetKernelArg(kernel, (*a)++, sizeof(cl_mem), &slots);
    return err;
}
