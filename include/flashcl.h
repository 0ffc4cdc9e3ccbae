/* flashcl.h: public API of flashcl, exact FlashAttention on any OpenCL device. */
#ifndef FLASHCL_H
#define FLASHCL_H

/* The OpenCL API level flashcl's declarations need is 1.2. An application that targets
 * another version (say 300) defines CL_TARGET_OPENCL_VERSION before including this header or
 * on the command line; flashcl then leaves it as it is. */
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#ifdef __APPLE__
#include <OpenCL/cl.h>
#else
#include <CL/cl.h>
#endif
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FLASHCL_STATIC)
#define FLASHCL_API
#elif defined(_WIN32)
#ifdef FLASHCL_BUILDING
#define FLASHCL_API __declspec(dllexport)
#else
#define FLASHCL_API __declspec(dllimport)
#endif
#else
#define FLASHCL_API __attribute__((visibility("default")))
#endif

/* Zero-initialises any flashcl descriptor in C and C++ alike:
 *   flashcl_attention_desc d = FLASHCL_ZERO_INIT;
 * It is `{0}` in C and `{}` in C++, where `{0}` does not compile for a struct whose first
 * member is an enum (flashcl_dtype). Zero means "default" in every descriptor field. */
#ifdef __cplusplus
#define FLASHCL_ZERO_INIT {}
#else
#define FLASHCL_ZERO_INIT {0}
#endif

/* Before 1.0 a minor version may change the ABI: rebuild against its header. 0.2 grew
 * flashcl_attention_desc (v_packed), which a caller compiled against 0.1's header does not hold. */
#define FLASHCL_VERSION_MAJOR 0
#define FLASHCL_VERSION_MINOR 2
#define FLASHCL_VERSION_PATCH 0
#define FLASHCL_VERSION_STRING "0.2.0"

/* Returns FLASHCL_VERSION_STRING of the library actually linked. */
FLASHCL_API const char *flashcl_version(void);

/* ------------------------------------------------------------------------
 * Status codes. 0 is success. Negative values in [-1, -1000) are OpenCL's
 * own CL_* codes passed through unchanged (so a cl_int can be returned as
 * is); the library's own codes live in [-2000, -2099].
 * ---------------------------------------------------------------------- */
typedef int flashcl_status;
enum {
    FLASHCL_SUCCESS = 0,
    FLASHCL_ERROR_INVALID_ARGUMENT = -2000, /* NULL handle, zero size, bad enum  */
    FLASHCL_ERROR_INVALID_SHAPE = -2001,    /* heads_q % heads_k, head_dim > 256  */
    FLASHCL_ERROR_OUT_OF_BOUNDS = -2002,    /* strides/offsets overrun a buffer   */
    FLASHCL_ERROR_DTYPE_MISMATCH = -2003,   /* tensors disagree on element type   */
    FLASHCL_ERROR_NO_DEVICE = -2004,        /* no device matches the spec         */
    FLASHCL_ERROR_BUILD_FAILED = -2005,     /* kernel build failed (log in last_error) */
    FLASHCL_ERROR_OUT_OF_HOST_MEMORY = -2006, /* malloc failed                     */
    FLASHCL_ERROR_UNSUPPORTED = -2007,      /* the operation needs an OpenCL device */
    FLASHCL_ERROR_INVALID_PARAMS = -2008,   /* kernel parameters that do not fit  */
    FLASHCL_ERROR_OUT_OF_PAGES = -2009,     /* the KV cache pool has too few free pages */
    FLASHCL_ERROR_MALFORMED_ENV = -2010,    /* a FLASHCL_* variable that does not parse */
    FLASHCL_ERROR_TUNING_FILE = -2020,      /* the tuning file cannot be read or written */
    FLASHCL_ERROR_INVALID_PROBS = -2060,    /* spec verify: bad probabilities or logits */
};

/* A static English description of any status, OpenCL's codes included. */
FLASHCL_API const char *flashcl_status_string(flashcl_status status);

/* ------------------------------------------------------------------------
 * Contexts
 * ---------------------------------------------------------------------- */
/* Threads. Every function that takes a context, or a KV cache or scheduler
 * made on one, may be called from several threads at once on the same
 * context: the calls run one after another under the context's lock (the
 * kernels then run in the order the calls took it), with the results each
 * would give alone. Holding it, a `_host` call waits for its own copies and
 * kernels, so host-memory calls on one context do not overlap; use a context
 * per thread for calls that should. Contexts are independent of each other.
 * A KV cache or scheduler object is safe to share the same way (its calls
 * take its context's lock).
 * On a context adopted from the application (flashcl_context_adopt), the
 * application may keep using its queue from other threads, as OpenCL allows:
 * flashcl's commands and the application's are ordered by the queue (on an
 * in-order queue, in the order they were enqueued) and by the events passed
 * and returned, never by flashcl's lock. flashcl_set_log is process-wide:
 * call it before other threads use the library. */
typedef struct flashcl_context flashcl_context;

/* Creates a context on a device chosen by `spec` (NULL or "" means the
 * environment variable FLASHCL_DEVICE, else the default: the first GPU, else
 * the first device of any type). Specs, case-insensitive:
 *   "gpu", "cpu", "accelerator"  first device of that type
 *   "nvidia", "amd", "intel", "pocl", any other word:
 *                                the first device of the first platform whose
 *                                name, vendor or version contains the word;
 *                                where none does, the first device whose name
 *                                or vendor does (so "intel" takes Intel's
 *                                runtime before PoCL's device on an Intel CPU)
 *   "PLATFORM:DEVICE"            a platform by index or word (name, vendor or
 *                                version), then its device by index or word
 *                                (name or vendor); either part may be empty:
 *                                "0:1", "intel:", "nvidia:H100", ":gfx90a"
 *   "host"                       no OpenCL: the multi-threaded C path
 * When no OpenCL platform exists at all and `spec` does not demand one, the
 * context falls back to the host path and flashcl_context_is_host() says so.
 * On failure *out is NULL and the status says why. */
FLASHCL_API flashcl_status flashcl_context_create(flashcl_context **out, const char *spec);

/* Adopts the application's own OpenCL objects. flashcl retains them (and
 * releases its references in flashcl_context_destroy); the caller keeps its
 * own. The queue must belong to `context` and `device`. Timing functions need
 * CL_QUEUE_PROFILING_ENABLE on the queue; everything else works without it. */
FLASHCL_API flashcl_status flashcl_context_adopt(flashcl_context **out, cl_context context,
                                                 cl_device_id device, cl_command_queue queue);

/* Destroys a context and everything it built. NULL is a no-op. */
FLASHCL_API void flashcl_context_destroy(flashcl_context *ctx);

/* The message of the calling thread's last call on `ctx` when that call
 * failed (with the OpenCL build log when a build failed); "" after a success,
 * or when this thread's last call was on another context. ctx NULL: why the
 * thread's last flashcl_context_create or flashcl_context_adopt failed (no
 * context exists to hold it), or its last context-free call (the FP8
 * helpers). Messages are per thread, so threads sharing a
 * context never see each other's. Owned by the library, valid until this
 * thread's next call. */
FLASHCL_API const char *flashcl_last_error(const flashcl_context *ctx);

/* 1 when the context runs the pure-C host path instead of OpenCL. */
FLASHCL_API int flashcl_context_is_host(const flashcl_context *ctx);

/* The OpenCL objects in use (NULL on a host context). Owned by the context. */
FLASHCL_API cl_context flashcl_context_cl_context(const flashcl_context *ctx);
FLASHCL_API cl_device_id flashcl_context_cl_device(const flashcl_context *ctx);
FLASHCL_API cl_command_queue flashcl_context_cl_queue(const flashcl_context *ctx);

/* A one-line description: "NVIDIA H200 (NVIDIA CUDA, OpenCL 3.0 ...)". On the host C path it
 * says why that path runs, e.g. "host (pure C, 8 threads, no OpenCL) because no OpenCL platform
 * was found (...)": the library prints nothing, so an application that wants to tell its user
 * about the fallback prints this. Owned by the context. */
FLASHCL_API const char *flashcl_context_device_name(const flashcl_context *ctx);

/* Optional log sink for notes such as "no OpenCL platform: using host path"
 * or "disk cache hit". Process-wide; NULL restores the default, which
 * prints nothing unless FLASHCL_LOG=1 (then lines go to stderr). */
typedef void (*flashcl_log_fn)(void *user, const char *line);
FLASHCL_API void flashcl_set_log(flashcl_log_fn fn, void *user);

/* ------------------------------------------------------------------------
 * Attention
 * ---------------------------------------------------------------------- */
typedef enum flashcl_dtype {
    FLASHCL_FLOAT32 = 0,
    FLASHCL_FLOAT16 = 1,  /* IEEE binary16 */
    FLASHCL_BFLOAT16 = 2, /* upper 16 bits of a binary32 */
    /* The OCP 8-bit formats, as PyTorch's float8_e4m3fn and float8_e5m2
     * ("FP8" below). Taken by the FP8 helpers; for q, k and v by the dense
     * forward (flashcl_attention_forward, _forward_host: see out_dtype and
     * fp8 in flashcl_attention_desc); and as a KV cache's page_dtype (FP8
     * pages). The backward, varlen, merge and a KV cache's dtype given one
     * return FLASHCL_ERROR_INVALID_ARGUMENT with a message saying so. */
    FLASHCL_FLOAT8_E4M3 = 3, /* 1-4-3, bias 7: max 448, no infinity  */
    FLASHCL_FLOAT8_E5M2 = 4, /* 1-5-2, bias 15: max 57344, infinity */
} flashcl_dtype;

/* Size in bytes of one element of `dtype` (0 for an unknown value). */
FLASHCL_API size_t flashcl_dtype_size(flashcl_dtype dtype);

/* Where a 4-D tensor lives inside its buffer. All counts are in elements.
 * The last (head_dim) dimension is always contiguous. When all three strides
 * are 0 the default packed layout is used:
 *   q, out: [batch][seqlen_q][heads_q][head_dim]
 *   k, v:   [batch][seqlen_k][heads_k][head_dim]
 * The [batch][heads][seqlen][head_dim] layout is just other strides. */
typedef struct flashcl_layout {
    size_t offset;
    size_t stride_batch, stride_seq, stride_head;
} flashcl_layout;

/* One attention problem. Zero-initialise, then set the shape:
 *   flashcl_attention_desc d = {0}; d.batch = 2; ...
 * Zero means the defaults: no mask, scale 1/sqrt(head_dim), no soft-cap,
 * packed layouts. Masks are aligned bottom-right (flash-attn >= 2.1): with
 * shift = seqlen_k - seqlen_q, query row i sees key j iff
 *   i + shift - window_left <= j <= i + shift + window_right,
 * where a negative side is unbounded and the window applies only when
 * `windowed` is nonzero (so a zeroed desc is not a diagonal-only window);
 * causal sets window_right to 0. A row that sees no key gets output 0 and
 * LSE -inf. */
/* Descale factors of an FP8 forward (flash-attn 3's q_descale, k_descale,
 * v_descale): the real inputs are descale * decode(byte). What the FP8
 * quantize helpers (flashcl_fp8_quantize_host, flashcl_fp8_quantize) write
 * with the same per_head and block_rows is what this takes. Pointers are host
 * memory, read during the call (not kept); NULL means every factor is 1.
 *   per_head 0:               one factor per tensor, [0]
 *   per_head, block_rows 0:   [b * heads + h], heads = heads_q for q,
 *                             heads_k for k and v
 *   per_head, block_rows > 0: q and k get one factor per block_rows rows of
 *                             each (batch, head),
 *                             [(b * heads + h) * ceil(seqlen / block_rows) + row / block_rows]
 *                             (seqlen = seqlen_q for q, seqlen_k for k); v
 *                             stays per (batch, head): its factor multiplies
 *                             the output, which mixes all its rows.
 * Factors must be finite and > 0. */
typedef struct flashcl_fp8_scales {
    const float *q_descale, *k_descale, *v_descale;
    int per_head;   /* zero: per tensor; nonzero: per (batch, head), see above */
    int block_rows; /* > 0 (needs per_head): per block of rows for q and k; 0: off */
} flashcl_fp8_scales;

typedef struct flashcl_attention_desc {
    flashcl_dtype dtype;      /* storage type of q, k, v (and out unless FP8) */
    int batch;                /* >= 1                                       */
    int heads_q, heads_k;     /* heads_q % heads_k == 0 (MHA, GQA, MQA)     */
    int seqlen_q, seqlen_k;   /* >= 1, independent                          */
    int head_dim;             /* 1 .. 256                                   */
    float scale;              /* 0 means 1/sqrt(head_dim)                   */
    int causal;               /* nonzero: causal mask, bottom-right aligned */
    int windowed;             /* nonzero: window_left/right below apply     */
    int window_left;          /* keys left of the diagonal seen; < 0: all   */
    int window_right;         /* keys right of the diagonal seen; < 0: all  */
    float softcap;            /* > 0: scores become softcap*tanh(s/softcap) */
    flashcl_layout q, k, v, out;
    /* Read only when dtype is FLASHCL_FLOAT8_E4M3 or _E5M2 (the forward
     * only): q, k and v are FP8 bytes in the usual layouts (strides in
     * elements = bytes), the real inputs descale * decode(byte) (fp8 below);
     * the softmax scale applies to the dequantized scores. out is out_dtype:
     * FLASHCL_FLOAT32 (= 0, so a zeroed desc gets float32), FLOAT16 or
     * BFLOAT16; an FP8 out is refused. lse is float32 as always. */
    flashcl_dtype out_dtype;
    flashcl_fp8_scales fp8;
    /* FP8 only. Nonzero: v holds V packed for the Hopper FP8 kernel (the
     * layout under flashcl_fp8_pack_v below), starting at byte v.offset (a
     * multiple of 16); v's strides are not read; head_dim 16..128 in steps
     * of 16. The same function as v in its usual layout, bit for bit on a
     * given kernel; which kernel runs follows the usual rules, except that
     * v's alignment is then v.offset's alone. Where the Hopper kernel runs
     * (variant "nv-wgmma-fp8": its conditions under
     * flashcl_attention_forward) it reads v as it is, where it otherwise
     * transposes v into the context's buffer first, each call. Every other
     * kernel unpacks it into that buffer first, each call (one more pass
     * over V, and a buffer of V's unpacked size the context keeps); the
     * host path unpacks it in host memory. So pack a V that several
     * Hopper calls read over the same keys (the same batch, heads_k,
     * seqlen_k and head_dim: cross-attention to a fixed encoder output, a
     * prefix many requests query). */
    int v_packed;
} flashcl_attention_desc;

/* Normalises and checks a descriptor without running anything: fills the
 * default scale, default strides, and the window implied by `windowed` and
 * `causal` (afterwards window_left/right are final, -1 meaning unbounded).
 * Returns FLASHCL_SUCCESS or the error the forward call would report. */
FLASHCL_API flashcl_status flashcl_attention_desc_resolve(flashcl_attention_desc *desc);

/* Forward attention on caller-owned device buffers, enqueued on the
 * context's queue:
 *   out = softmax(scale * q k^T + mask) v,   lse = logsumexp(scale * q k^T + mask)
 * lse (may be NULL): float32 [batch][heads_q][seqlen_q], at element
 * lse_offset. Every buffer is checked against its CL_MEM_SIZE before launch.
 * On error nothing is enqueued and no output is touched (except that an FP8
 * call whose kernel fails to launch leaves its descale upload, and its V
 * transpose or unpack, enqueued: they write only the context's own buffers). `event`
 * (may be NULL) receives the kernel's event; the caller releases it.
 * FP8 q, k, v (desc->dtype FLASHCL_FLOAT8_E4M3/E5M2): the descale factors
 * are copied during the call (the arrays may be freed when it returns) and
 * uploaded without blocking; the portable kernel runs on GPUs, the cpu kernel
 * on CPUs. On compute capability 9.0, prefill (seqlen_q > 1) with a float16
 * or bfloat16 output, head dims 32..128 in steps of 16, 16-byte aligned rows
 * of q, k and v and factor blocks of a multiple of 8 rows runs the Hopper
 * kernel instead (variant "nv-wgmma-fp8"). It rounds P to e4m3 for P V, as
 * FlashAttention-3 does, and its lse carries the FP8 MMA's truncating sums
 * (about 2^-14 of a row's largest sum of |q||k| times the scale). It first
 * writes v transposed into a buffer the context allocates, keeps for later
 * calls and frees in flashcl_context_destroy: batch * heads_k * head_dim
 * rounded up to 64 * seqlen_k rounded up to 128 bytes (v's own size at
 * head_dim 128); a v packed by the caller (v_packed) skips that pass. */
FLASHCL_API flashcl_status flashcl_attention_forward(flashcl_context *ctx,
                                                     const flashcl_attention_desc *desc,
                                                     cl_mem q, cl_mem k, cl_mem v, cl_mem out,
                                                     cl_mem lse, size_t lse_offset,
                                                     cl_event *event);

/* FP8 V packed for the Hopper FP8 forward (flashcl_attention_desc.v_packed).
 * 8-bit warpgroup MMA reads both operands K-major, so P V needs V with the
 * keys along its rows. The layout, for each (batch b, kv head h) in turn:
 * R = ceil(head_dim / 64) * 64 rows of K = ceil(seqlen_k / 128) * 128
 * bytes, at ((b * heads_k + h) * R + d) * K for row d (head dim d); key n
 * at byte (n & ~15) + 4 * ((n >> 1) & 3) + 2 * ((n >> 3) & 1) + (n & 1) of
 * its row, the order in which the kernel's P fragments take a 16-key group
 * (cl/fp8_vt_pack.cl, VT_KEY); bytes past seqlen_k and past head_dim must
 * be zero (the Hopper kernel multiplies them by P = 0; a NaN code there
 * would give NaN). Of the desc only dtype (FP8), batch, heads_k, seqlen_k
 * (at most 2147483520), head_dim (16..128 in steps of 16) and the v layout
 * (v's own, not packed; v_packed is not read) are read.
 * flashcl_fp8_packed_v_bytes: the packed size in bytes (0 where those
 * fields do not qualify). flashcl_fp8_pack_v: enqueues the pack of v
 * (desc->v's layout, its offset and strides multiples of 16 bytes) into
 * packed at byte packed_offset (a multiple of 16), which must hold
 * flashcl_fp8_packed_v_bytes from there and must not overlap v; `event`
 * as flashcl_attention_forward's (on an out-of-order queue, order the
 * forward after it). Returns FLASHCL_ERROR_INVALID_ARGUMENT for fields,
 * offsets or strides that do not qualify, FLASHCL_ERROR_OUT_OF_BOUNDS for
 * a buffer too small, FLASHCL_ERROR_UNSUPPORTED on a host context (use the
 * _host form). flashcl_fp8_pack_v_host: the same on host memory, any v
 * layout; its errors are read with flashcl_last_error(NULL). */
FLASHCL_API size_t flashcl_fp8_packed_v_bytes(const flashcl_attention_desc *desc);
FLASHCL_API flashcl_status flashcl_fp8_pack_v(flashcl_context *ctx, const flashcl_attention_desc *desc, cl_mem v,
                                              cl_mem packed, size_t packed_offset, cl_event *event);
FLASHCL_API flashcl_status flashcl_fp8_pack_v_host(const flashcl_attention_desc *desc, const unsigned char *v,
                                                   unsigned char *packed);

/* The same on host memory: copies to the device, runs, copies back and
 * waits (on a host context it runs the multi-threaded C path directly).
 * Layout offsets and strides apply to the host arrays; the caller guarantees
 * that they lie inside the arrays. lse may be NULL. Blocking. */
FLASHCL_API flashcl_status flashcl_attention_forward_host(flashcl_context *ctx,
                                                          const flashcl_attention_desc *desc,
                                                          const void *q, const void *k,
                                                          const void *v, void *out, float *lse);

/* ------------------------------------------------------------------------
 * Kernel parameters (what flashcl picks for a device; see src/params_forward.c)
 * ---------------------------------------------------------------------- */
typedef struct flashcl_params {
    int block_m;         /* query rows per work-group                      */
    int block_n;         /* keys per tile held in __local memory           */
    int threads_per_row; /* portable kernel: work-items sharing a row      */
    int work_group_size; /* work-items per work-group                      */
    const char *variant; /* "portable", "cpu", "nv-mma", "nv-tf32", "nv-wgmma", "nv-wgmma-fp8" or "host" */
    const char *source;  /* where the numbers came from: "set: flashcl_set_params",
                          * "tuned: <file>", "built-in device: <name>",
                          * "built-in arch: sm_80+", "built-in vendor: NVIDIA",
                          * "default: CPU"/"GPU"/"global", "FLASHCL_PARAMS";
                          * owned by the context                          */
} flashcl_params;

/* The parameters the forward kernel would use for `desc` on this context. */
FLASHCL_API flashcl_status flashcl_attention_params(flashcl_context *ctx,
                                                    const flashcl_attention_desc *desc,
                                                    flashcl_params *params);

/* Parameters are looked up in a database (src/params_forward.c), first match wins:
 * flashcl_set_params on this context; the user tuning file; built-in entries
 * for the exact device, its architecture, its vendor; the default for its
 * type (CPU/GPU); a global default. Entries are keyed by variant and problem
 * class: dtype, head_dim class (1..64, 65..128, 129..256), prefill or decode
 * (seqlen_q == 1), causal. A miss never fails. Database entries that do not
 * fit the device are passed over (with a log line); explicit requests
 * (flashcl_set_params, the FLASHCL_PARAMS variable) are refused instead.
 *
 * Sets the parameters forward calls on this context use for every problem of
 * desc's class (its dtype, head_dim class, phase and causality); NULL params
 * removes that override. Only variant, block_m, block_n and threads_per_row
 * ("portable") or work_group_size (32 * warps: "nv-mma", "nv-tf32",
 * "nv-wgmma", "nv-wgmma-fp8") are read. Checked now against the device (local memory,
 * work-group size, the kernel's divisibility rules): parameters that cannot
 * fit return FLASHCL_ERROR_INVALID_PARAMS with a message and change nothing.
 * A kernel built with them that the driver still refuses fails the forward
 * call rather than falling back. */
FLASHCL_API flashcl_status flashcl_set_params(flashcl_context *ctx,
                                              const flashcl_attention_desc *desc,
                                              const flashcl_params *params);

/* The user tuning file this context reads: FLASHCL_TUNING_FILE, else
 * $XDG_CONFIG_HOME/flashcl/tuning.json, else ~/.config/flashcl/tuning.json
 * (NULL on a host context or without HOME). The file is JSON, format in
 * src/tuning_file.c, at most 1 MiB. It is used whole or not at all: a file
 * that is too large, not valid JSON, of another format version, or with any
 * wrong-typed or out-of-range entry is ignored as a whole, and *problem
 * (may be NULL) is set to why, with line and column; otherwise *problem is
 * NULL (also when the file does not exist). Unknown keys are ignored, and an
 * entry naming an unknown variant is skipped alone (forward compatibility).
 * Besides the forward entries, the file may hold entries for the serving
 * (paged/varlen) and backward kernels, which those kernels' lookups try
 * first in the same way. The file is read once per context, on first use.
 * Strings are owned by the context. */
FLASHCL_API const char *flashcl_tuning_file(flashcl_context *ctx, const char **problem);

/* Adds `params` to the tuning file at `path` (NULL: the path above) for this
 * context's device (name and driver) and desc's problem class, replacing an
 * entry with the same key; `comment` (may be NULL) is stored beside it. The
 * file is written to a temporary file and renamed into place. An existing
 * file that cannot be read is left alone: FLASHCL_ERROR_TUNING_FILE. The
 * params are checked as flashcl_set_params checks them. Contexts read the
 * file once: create a new context to use the entry. */
FLASHCL_API flashcl_status flashcl_tuning_file_save(flashcl_context *ctx, const char *path,
                                                    const flashcl_attention_desc *desc,
                                                    const flashcl_params *params,
                                                    const char *comment);

/* ------------------------------------------------------------------------
 * Serving: merge, paged KV cache, decode, varlen
 *
 * Everything here except flashcl_attention_merge_host needs an OpenCL
 * device (a host context returns FLASHCL_ERROR_UNSUPPORTED). Kernels are
 * enqueued on the context's queue, which is assumed in-order.
 * ---------------------------------------------------------------------- */

/* Two partial attention results of the same queries over disjoint key sets,
 * (o1, lse1) and (o2, lse2), and their merge (out, lse_out): the attention
 * over the union of the key sets, exact up to float rounding:
 *   m = max(lse1, lse2), w_i = exp(lse_i - m),
 *   out = (w1 o1 + w2 o2) / (w1 + w2), lse_out = m + log(w1 + w2).
 * A side whose LSE is -inf (it saw no key) contributes nothing, whatever its
 * O holds; both -inf gives out 0 and lse_out -inf.
 *   o1, o2, out: [batch][seqlen][heads][head_dim] in `dtype`, per layout
 *                (all-zero strides: packed); out may be o1 or o2 when their
 *                layouts are equal (in place).
 *   lse1, lse2, lse_out: float [batch][heads][seqlen] packed, from element
 *                *_offset; lse_out may be NULL (not stored) and must not
 *                overlap lse1 or lse2.
 * This is what split-KV decoding uses internally, and what ring or context-
 * parallel attention across devices needs. */
typedef struct flashcl_merge_desc {
    flashcl_dtype dtype;
    int batch, seqlen, heads, head_dim; /* >= 1 */
    flashcl_layout o1, o2, out;
    size_t lse1_offset, lse2_offset, lse_out_offset;
} flashcl_merge_desc;

FLASHCL_API flashcl_status flashcl_attention_merge(flashcl_context *ctx, const flashcl_merge_desc *desc,
                                                   cl_mem o1, cl_mem lse1, cl_mem o2, cl_mem lse2,
                                                   cl_mem out, cl_mem lse_out, cl_event *event);

/* The same on host memory (blocking; on a host context it runs in C). The
 * lse arrays start at their *_offset elements as on the device. */
FLASHCL_API flashcl_status flashcl_attention_merge_host(flashcl_context *ctx,
                                                        const flashcl_merge_desc *desc,
                                                        const void *o1, const float *lse1,
                                                        const void *o2, const float *lse2, void *out,
                                                        float *lse_out);

/* A paged KV cache: two device pools of fixed-size pages, owned by the cache,
 *   k_pool, v_pool: [num_pages][page_size][heads_k][head_dim] in `dtype`, or
 *                   one byte an element with FP8 pages (page_dtype, below)
 * (token n of a sequence lives at page table[n / page_size], row
 * n % page_size), a host-side allocator (free list, a reference count per
 * page) and one page table per sequence. Sequences are small integer ids
 * handed out by the cache. Forked sequences share pages; the first append
 * into a shared, partially filled page copies it first (copy-on-write), so
 * no sequence ever sees another's new tokens. The cache also keeps a copy of
 * every page table on the device, kept current by the appends' own kernels
 * (and fork by one device copy), so attention calls do not upload tables.
 * On an out-of-order queue an append's kernel waits for the context's last
 * attention call and fork is fenced by barriers; as for the pools, the
 * caller waits on an append's event before attention reads what it wrote. */
typedef struct flashcl_kv_cache flashcl_kv_cache;

typedef struct flashcl_kv_cache_desc {
    flashcl_dtype dtype;
    int heads_k, head_dim; /* >= 1; head_dim <= 256     */
    int page_size;         /* tokens per page, 1 .. 256 */
    int num_pages;         /* pages in each pool, >= 1  */
    /* Nonzero: pages are handed out in an order shuffled by this seed
     * instead of 0, 1, 2, ... (tests use it so page tables are scattered). */
    unsigned long long page_order_seed;
    /* FP8 pages: FLASHCL_FLOAT8_E4M3 (the usual choice) or FLASHCL_FLOAT8_E5M2 stores each K and V
     * element in one byte, so a pool holds twice the tokens of a 16-bit one and decoding reads half the bytes.
     * 0 (or dtype itself): pages in dtype, as before. dtype stays the type of appended K/V and of the
     * queries and outputs of paged attention. FP8 pages need dtype float32, float16 or bfloat16.
     * (0 is FLASHCL_FLOAT32's value too: a float32 cache leaves it 0 and stores float32.) */
    flashcl_dtype page_dtype;
    /* FP8 pages: heads_k descale factors each (NULL: all 1), copied at create. Token x is stored as
     * encode(x / scale) and read as scale * decode(byte); finite and > 0. Ignored for 16/32-bit pages.
     * The scales are static per (cache, kv head), as vLLM's kv_cache_dtype=fp8 with calibrated scales,
     * not computed per page at append: a page's scale would have to change when later tokens (of this
     * sequence, or of a fork sharing the page) outgrow it, either saturating them or requantizing bytes
     * other sequences share. With static scales an append writes only its own bytes, and fork and
     * copy-on-write stay byte copies. Choose them from calibration (amax / 448 for e4m3 over typical
     * K and V; flashcl_fp8_quantize_host's descale is that) or leave them 1 where K/V are already
     * well inside the format's range. */
    const float *k_scales, *v_scales;
} flashcl_kv_cache_desc;

/* Creates a cache and allocates its pools (contents undefined until
 * written). The cache keeps `ctx`, which must outlive it; errors of cache
 * calls are reported through flashcl_last_error(ctx). */
FLASHCL_API flashcl_status flashcl_kv_cache_create(flashcl_context *ctx, const flashcl_kv_cache_desc *desc,
                                                   flashcl_kv_cache **out);
/* Releases the pools and every sequence. NULL is a no-op. */
FLASHCL_API void flashcl_kv_cache_destroy(flashcl_kv_cache *cache);

/* The pools (owned by the cache) and its description. The description's
 * k_scales and v_scales point to the cache's own copies (heads_k floats each,
 * all 1 when created with NULL) for FP8 pages, NULL otherwise; valid while the
 * cache lives. */
FLASHCL_API cl_mem flashcl_kv_cache_k_pool(const flashcl_kv_cache *cache);
FLASHCL_API cl_mem flashcl_kv_cache_v_pool(const flashcl_kv_cache *cache);
FLASHCL_API const flashcl_kv_cache_desc *flashcl_kv_cache_get_desc(const flashcl_kv_cache *cache);
/* Pages not used by any sequence. */
FLASHCL_API int flashcl_kv_cache_free_pages(const flashcl_kv_cache *cache);

/* A new, empty sequence; its id in *seq. */
FLASHCL_API flashcl_status flashcl_kv_cache_add_sequence(flashcl_kv_cache *cache, int *seq);
/* A new sequence sharing every page of `src` (same length; no page is copied,
 * only its page table, on the device, which can fail with a device error). */
FLASHCL_API flashcl_status flashcl_kv_cache_fork(flashcl_kv_cache *cache, int src, int *seq);
/* Drops a sequence; pages no other sequence uses return to the free list. */
FLASHCL_API flashcl_status flashcl_kv_cache_free_sequence(flashcl_kv_cache *cache, int seq);
/* Tokens stored for `seq`, or -1 when it is not a live sequence. */
FLASHCL_API int flashcl_kv_cache_length(const flashcl_kv_cache *cache, int seq);
/* Copies seq's page table (physical page per logical page) into pages[0 ..
 * capacity); *count receives its length (which may exceed capacity). */
FLASHCL_API flashcl_status flashcl_kv_cache_page_table(const flashcl_kv_cache *cache, int seq, int *pages,
                                                       int capacity, int *count);

/* Appends new tokens to several distinct sequences in one kernel:
 * num_tokens[i] tokens to seq_ids[i] (0 allowed). k and v hold them back to
 * back, all of seq_ids[0]'s first:
 *   k, v: [total][heads_k][head_dim] in the cache's dtype, at
 *         layout->offset + t * stride_seq + h * stride_head (stride_batch is
 *         unused; a NULL layout or all-zero strides: packed at offset).
 * With FP8 pages each element is quantized on the way in, byte =
 * encode(x * inv) with inv = 1.0f / scale of its kv head rounded to float
 * (the same byte flashcl_fp8_encode(page_dtype, x * inv) gives: nearest, ties
 * to even, saturating to +-max, NaN to NaN).
 * Pages are taken from the free list. The capacity of the whole append is
 * checked before anything changes: when the pool is too small the call
 * returns FLASHCL_ERROR_OUT_OF_PAGES and every sequence (and the pools' used
 * pages) stays as it was. `event` receives the append kernel's event. */
FLASHCL_API flashcl_status flashcl_kv_cache_append(flashcl_kv_cache *cache, int num_seqs,
                                                   const int *seq_ids, const int *num_tokens,
                                                   cl_mem k, const flashcl_layout *k_layout, cl_mem v,
                                                   const flashcl_layout *v_layout, cl_event *event);

/* Attention of a packed batch of sequences of different lengths (flash-attn's
 * varlen API), for prompts and for decoding alike:
 *   sequence i owns query tokens [cu_seqlens_q[i], cu_seqlens_q[i+1]) and, in
 *   flashcl_varlen_forward, key tokens [cu_seqlens_k[i], cu_seqlens_k[i+1]);
 *   in flashcl_paged_attention its keys are the cache's tokens of seq_ids[i].
 *   q, out: [total_q][heads_q][head_dim]; k, v: [total_k][heads_k][head_dim];
 *           each at offset + t * stride_seq + h * stride_head (stride_batch
 *           unused; all-zero strides: packed).
 *   lse (may be NULL): float [heads_q][total_q] from element lse_offset.
 * Causal masks are bottom-right aligned within each sequence: its query t
 * (0-based) sees keys 0 .. nk - nq + t. A query that sees no key gets 0 and
 * LSE -inf. GQA maps query head h to kv head h / (heads_q / heads_k).
 * Split-KV: the keys of each sequence may be cut into slices computed by
 * different work-groups and merged exactly (as flashcl_attention_merge);
 * num_splits = 0 lets flashcl choose from the device and the lengths, 1..128
 * forces a count. Partial results live in a caller-owned scratch buffer
 * whose size the *_scratch_size functions return (0: none needed, scratch
 * may be NULL). The cu_seqlens arrays are host memory, read during the call.
 * Kernels (flashcl_serving_params names the one a call gets): decoding, a
 * few query rows per sequence and kv head, runs a memory-bound split-KV
 * kernel (on tensor cores on NVIDIA sm_80+ for f16/bf16), whose last split
 * merges the others; prompts, CPUs and unaligned layouts run a tiled kernel
 * with a separate combine pass. A decode kernel takes the call's few ints
 * of batch description as a by-value argument where they fit; otherwise
 * they are uploaded. Calls on one context are ordered with each other by
 * events (they share its upload and split-counter buffers), also on an
 * out-of-order queue. FLASHCL_DECODE_PARAMS overrides the choice (README). */
typedef struct flashcl_varlen_desc {
    flashcl_dtype dtype;      /* paged: must equal the cache's             */
    int num_seqs;             /* >= 1                                      */
    int heads_q, heads_k;     /* heads_q % heads_k == 0; paged: the cache's */
    int head_dim;             /* 1 .. 256; paged: the cache's              */
    const int *cu_seqlens_q;  /* num_seqs + 1 offsets, [0] = 0, nondecreasing, total_q >= 1 */
    const int *cu_seqlens_k;  /* the same for keys (varlen only)           */
    float scale;              /* 0 means 1/sqrt(head_dim)                  */
    int causal;               /* nonzero: causal, bottom-right per sequence */
    float softcap;            /* > 0: scores become softcap*tanh(s/softcap) */
    int num_splits;           /* 0: heuristic; 1 .. 128: forced            */
    flashcl_layout q, k, v, out; /* k, v: varlen only                      */
} flashcl_varlen_desc;

/* Bytes of scratch flashcl_varlen_forward needs for desc on this context. */
FLASHCL_API flashcl_status flashcl_varlen_scratch_size(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                                       size_t *bytes);
FLASHCL_API flashcl_status flashcl_varlen_forward(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                                  cl_mem q, cl_mem k, cl_mem v, cl_mem out, cl_mem lse,
                                                  size_t lse_offset, cl_mem scratch, cl_event *event);

/* The gradient of flashcl_varlen_forward, per sequence exactly the dense
 * backward's ("Backward pass" below; conventions of
 * flashcl_attention_backward): from the forward's desc, q, k, v, out and
 * lse, and dout = dL/dout, computes dq, dk, dv in desc's dtype, accumulated
 * in float32.
 *   dout, dq: [total_q][heads_q][head_dim]; dk, dv: [total_k][heads_k]
 *             [head_dim]; in opts' layouts (offset + t * stride_seq +
 *             h * stride_head, stride_batch unused; all-zero strides or opts
 *             NULL: packed). opts->deterministic as in the dense backward.
 *   lse:      float [heads_q][total_q] from element lse_offset, as
 *             flashcl_varlen_forward wrote it.
 *   scratch:  at least flashcl_varlen_backward_scratch_size bytes (never 0:
 *             the longest sequence's dense scratch, its LSE restaged as
 *             [heads_q][nq], zeros for empty sequences); contents ignored;
 *             busy until the returned event completes.
 * Masks (causal bottom-right per sequence), soft-cap and scale as in the
 * forward; num_splits is not read. GQA/MQA: dk, dv of a kv head are sums
 * over its query heads. A sequence with no key gets dq = 0; keys no query
 * sees (all keys of a sequence with no query) get dk = dv = 0. In
 * deterministic mode a sequence's gradients are bitwise those of
 * flashcl_attention_backward on that sequence alone. The gradients must not
 * share a buffer with each other or an input. Every buffer is checked
 * against its CL_MEM_SIZE and every kernel built before the first launch:
 * on error nothing is enqueued and no output is touched. `event` (may be
 * NULL) receives the last command's event; commands are chained by events,
 * so an out-of-order queue works too.
 * Cost: one backward launch set (3 kernels, plus an LSE copy when heads_q >
 * 1) per sequence, the sequences one after another: a batch of many short
 * sequences is bound by launch overhead. */
struct flashcl_backward_options; /* defined under "Backward pass" */
FLASHCL_API flashcl_status flashcl_varlen_backward_scratch_size(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                                                const struct flashcl_backward_options *opts,
                                                                size_t *bytes);
FLASHCL_API flashcl_status flashcl_varlen_backward(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                                   const struct flashcl_backward_options *opts, cl_mem q,
                                                   cl_mem k, cl_mem v, cl_mem out, cl_mem dout, cl_mem lse,
                                                   size_t lse_offset, cl_mem dq, cl_mem dk, cl_mem dv,
                                                   cl_mem scratch, cl_event *event);

/* The same with keys and values read through the cache's page tables
 * (seq_ids: num_seqs distinct live sequences; append the new tokens' K/V
 * before attending, so a decode step's query sees its own key). desc->dtype
 * is the cache's dtype, also with FP8 pages: keys and values are then read
 * as k_scale * decode(byte) and v_scale * decode(byte) of their kv head (the
 * k scale folded into the score scale, the v scale into the output), queries,
 * outputs and split-KV partials staying in dtype and float. FP8 pages run the
 * portable decode kernel or the tiled kernel on every device, and on NVIDIA
 * sm_89+ with float16 queries and head_dim <= 128 the tensor-core decode
 * kernel, which widens the bytes to float16 in hardware (elsewhere
 * FLASHCL_DECODE_PARAMS asking for KERNEL=mma with an FP8 cache is refused).
 * flashcl_varlen_forward
 * takes no FP8: its K/V are the caller's tensors in desc->dtype. */
FLASHCL_API flashcl_status flashcl_paged_scratch_size(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                                      const flashcl_kv_cache *cache, const int *seq_ids,
                                                      size_t *bytes);
FLASHCL_API flashcl_status flashcl_paged_attention(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                                   const flashcl_kv_cache *cache, const int *seq_ids,
                                                   cl_mem q, cl_mem out, cl_mem lse, size_t lse_offset,
                                                   cl_mem scratch, cl_event *event);

/* The serving kernel's choice for desc, with cache NULL for
 * flashcl_varlen_forward; the split count in *splits (may be NULL). */
FLASHCL_API flashcl_status flashcl_serving_params(flashcl_context *ctx, const flashcl_varlen_desc *desc,
                                                const flashcl_kv_cache *cache, const int *seq_ids,
                                                flashcl_params *params, int *splits);

/* ------------------------------------------------------------------------
 * FP8 (FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT8_E5M2)
 *
 * Conversions: decoding is exact. Encoding rounds to nearest, ties to even,
 * and saturates as the hardware's cvt.rn.satfinite does: a finite value past
 * the largest magnitude, and an infinity, become +-max (448 for e4m3, 57344
 * for e5m2); NaN becomes the format's NaN (0x7f with the sign bit). So e5m2's
 * infinity is decoded but never produced. Quantization scales by the
 * absolute maximum (amax), as FlashAttention-3's descale factors expect:
 *   descale = amax / max, inv = max / amax (both 1 when amax is 0),
 *   fp8 = encode(x * inv),  x ~ descale * decode(fp8).
 * ---------------------------------------------------------------------- */
FLASHCL_API float flashcl_fp8_decode(flashcl_dtype format, unsigned char bits);
FLASHCL_API unsigned char flashcl_fp8_encode(flashcl_dtype format, float value);

typedef struct flashcl_fp8_quant_desc {
    flashcl_dtype format;   /* FLASHCL_FLOAT8_E4M3 or FLASHCL_FLOAT8_E5M2 */
    flashcl_dtype src_dtype; /* float32, float16 or bfloat16 */
    int batch, seqlen, heads, head_dim; /* >= 1 */
    flashcl_layout src;     /* zero strides: packed [batch][seqlen][heads][head_dim] */
    int per_head;           /* nonzero: a scale per (batch, head); zero: one for all */
    /* > 0 (needs per_head): a scale per block_rows rows of each (batch,
     * head), FlashAttention-3's block quantization, descale count
     * batch * heads * ceil(seqlen / block_rows), index
     * (b * heads + h) * ceil(seqlen / block_rows) + row / block_rows, as
     * flashcl_fp8_scales reads it. Use it on q and k; v's scale multiplies
     * the output and must stay per (batch, head). */
    int block_rows;
    /* Nonzero: incoherent processing (FlashAttention-3): each row x of
     * head_dim elements is replaced by x M before it is quantized (and the
     * amax taken), M = diag(s) H / sqrt(D) with s random +-1 signs drawn from
     * this seed and H the Sylvester Hadamard matrix of order D = head_dim,
     * which must be a power of two <= 256. M is orthogonal, so q and k
     * quantized with the same seed give the same q k^T while an outlier is
     * spread over the whole row. Not for v: out would come out rotated. */
    unsigned long long hadamard_seed;
} flashcl_fp8_quant_desc;

/* Quantizes src (desc->src_dtype in desc->src's layout) into dst, packed
 * [batch][seqlen][heads][head_dim] bytes of desc->format, and writes the
 * descale factors: descale[b * heads + h] when per_head (flash-attn 3's
 * (batch, heads) descale shape), per block as above with block_rows, else
 * descale[0]. A NaN or infinity in src returns FLASHCL_ERROR_INVALID_ARGUMENT
 * (an amax scale has no meaning then) with nothing written;
 * flashcl_last_error(NULL) says where. */
FLASHCL_API flashcl_status flashcl_fp8_quantize_host(const flashcl_fp8_quant_desc *desc, const void *src,
                                                    unsigned char *dst, float *descale);
/* The same on the device: src in desc->src's layout, dst at least
 * batch*seqlen*heads*head_dim bytes, descale a float buffer of the scale
 * count. The bytes and scales equal the host helper's. It reads the amax
 * back before it writes anything (so it blocks for one kernel), refuses a NaN
 * or infinity with nothing written, then enqueues the quantize kernel;
 * `event` (may be NULL) receives it. A host context: FLASHCL_ERROR_UNSUPPORTED. */
FLASHCL_API flashcl_status flashcl_fp8_quantize(flashcl_context *ctx, const flashcl_fp8_quant_desc *desc, cl_mem src,
                                               cl_mem dst, cl_mem descale, cl_event *event);

/* The inverse, with the same desc: src is packed [batch][seqlen][heads]
 * [head_dim] bytes of desc->format, descale as the quantize helpers write it
 * for that desc (per tensor, per head or per row block), and dst receives
 * descale * decode(byte) as desc->src_dtype in desc->src's layout (the float
 * side). With hadamard_seed the rows are rotated back (x M^T), so
 * dequantize(quantize(x)) approximates x. The elements dst's strides skip are
 * left alone. Exact when src_dtype is float32 and no rotation: decoding is
 * exact and descale * value is rounded once. */
FLASHCL_API flashcl_status flashcl_fp8_dequantize_host(const flashcl_fp8_quant_desc *desc, const unsigned char *src,
                                                      const float *descale, void *dst);
/* The same on the device (enqueued, not blocking; `event` may be NULL). A
 * host context: FLASHCL_ERROR_UNSUPPORTED. */
FLASHCL_API flashcl_status flashcl_fp8_dequantize(flashcl_context *ctx, const flashcl_fp8_quant_desc *desc, cl_mem src,
                                                 cl_mem descale, cl_mem dst, cl_event *event);

/* ------------------------------------------------------------------------
 * Backward pass
 *
 * Gradients of the forward above (flash-attn 2's algorithm): given the same
 * desc (dtype, shape, masks, soft-cap, scale, strides) and the forward's q,
 * k, v, out and lse, and dout = dL/dout, computes dq, dk, dv = dL/dq,
 * dL/dk, dL/dv in the storage dtype, accumulated in float32. Memory is
 * linear in the sequence lengths: P and dS exist one tile at a time on chip.
 * GQA/MQA: dk and dv of a key/value head are the sums over the query heads
 * sharing it. A row that sees no key (LSE -inf) gets dq 0 and contributes
 * nothing to dk, dv; keys no row sees get dk = dv = 0.
 *
 * Precision with large scores: P is recomputed as exp(s - lse) from the
 * forward's float32 LSE (flash-attn's and PyTorch's format). An LSE of
 * magnitude L is rounded by up to L * 2^-24, so each P carries that relative
 * error: the same order as the rounding float32 already puts into a score of
 * that size (|s| * 2^-24), under 1e-3 for |scores| below ~1e4. Past ~1e7 it
 * is of order 1: two tied keys at s = 1e10 each get P = 1, not 0.5. The
 * forward stays exact for any finite score; a gradient of scores that large
 * needs more than a float32 LSE (docs/design.md, "Numerics").
 * ---------------------------------------------------------------------- */
typedef struct flashcl_backward_options {
    /* Layouts of the gradient tensors; all-zero strides mean packed, as in
     * flashcl_attention_desc. Zero-initialise for packed everywhere.
     *   dout, dq: [batch][seqlen_q][heads_q][head_dim]
     *   dk, dv:   [batch][seqlen_k][heads_k][head_dim]                      */
    flashcl_layout dout, dq, dk, dv;
    /* Nonzero: results are bitwise identical from run to run (dq is summed
     * by a second pass over query blocks in a fixed order). Zero (default):
     * dq is summed into float32 scratch with atomic compare-and-swap adds in
     * the one pass that makes dk and dv, which saves recomputing P and dS;
     * dq's last bits may then differ between runs. dk and dv are always
     * deterministic. The host path is always deterministic, and so is the
     * NVIDIA tensor-core backward (f16/bf16, head_dim <= 128 on sm_80+),
     * whose dq pass measured faster than, or level with, its atomics
     * (FLASHCL_BWD_PARAMS=DQ=atomic asks for those: README).              */
    int deterministic;
} flashcl_backward_options;

/* Bytes of scratch flashcl_attention_backward needs for desc and opts (opts
 * may be NULL: packed layouts, default mode) on this context:
 *   4 * batch * heads_q * seqlen_q            (D_i = rowsum(dout * out))
 *   + 4 * batch * heads_q * seqlen_q * head_dim  unless deterministic
 *                                             (the float32 dq accumulator)
 * A host context answers 0. */
FLASHCL_API flashcl_status flashcl_attention_backward_scratch_size(flashcl_context *ctx,
                                                                   const flashcl_attention_desc *desc,
                                                                   const flashcl_backward_options *opts,
                                                                   size_t *bytes);

/* The backward on caller-owned device buffers, enqueued on the context's
 * queue (the kernels are chained by events, so an out-of-order queue works):
 *   q, k, v, out: the forward's tensors, in desc's layouts and dtype
 *   dout:         in opts->dout's layout, desc's dtype
 *   lse:          float32 [batch][heads_q][seqlen_q] from element lse_offset,
 *                 as the forward wrote it
 *   dq, dk, dv:   outputs in opts' layouts and desc's dtype; every element
 *                 of their shapes is written, elements their strides skip are
 *                 not. They must not overlap each other or any input.
 *   scratch:      at least flashcl_attention_backward_scratch_size bytes,
 *                 contents ignored; busy until the returned event completes
 * Every buffer is checked against its CL_MEM_SIZE and every kernel is built
 * before the first launch: on error nothing is enqueued. `event` (may be
 * NULL) receives the last kernel's event; the caller releases it. */
FLASHCL_API flashcl_status flashcl_attention_backward(flashcl_context *ctx,
                                                      const flashcl_attention_desc *desc,
                                                      const flashcl_backward_options *opts,
                                                      cl_mem q, cl_mem k, cl_mem v, cl_mem out,
                                                      cl_mem dout, cl_mem lse, size_t lse_offset,
                                                      cl_mem dq, cl_mem dk, cl_mem dv,
                                                      cl_mem scratch, cl_event *event);

/* The same on host memory (lse from element 0), blocking: copies to the
 * device and back with its own scratch; on a host context it runs the
 * multi-threaded C path. On error no output is touched. */
FLASHCL_API flashcl_status flashcl_attention_backward_host(flashcl_context *ctx,
                                                           const flashcl_attention_desc *desc,
                                                           const flashcl_backward_options *opts,
                                                           const void *q, const void *k,
                                                           const void *v, const void *out,
                                                           const void *dout, const float *lse,
                                                           void *dq, void *dk, void *dv);

/* ------------------------------------------------------------------------
 * Speculative decoding: verification of draft tokens
 *
 * For each of `batch` sequences a draft model proposed k tokens d_0..d_{k-1}
 * with distributions q_0..q_{k-1}, and the target model scored k+1 positions
 * with distributions p_0..p_k. Verification (Leviathan et al. 2023) keeps
 * the output distribution exactly the target's:
 *   for i = 0 .. k-1: accept d_i with probability min(1, p_i(d_i)/q_i(d_i));
 *     at the first rejection emit a token drawn from
 *     norm(max(0, p_i - q_i)) and stop;
 *   if all k are accepted, emit a bonus token drawn from p_k.
 * Greedy verification (desc.greedy) accepts d_i iff it is argmax p_i (ties:
 * the smallest index), emits argmax p_i at the first mismatch, else argmax
 * p_k; q is not read and no random numbers are used.
 *
 * Randomness is counter-based, so any device and host_ref emit the same
 * tokens for the same inputs, seed and offset: position i of sequence b uses
 * Philox4x32-10 with key (seed low, seed high 32 bits) and counter (b, i,
 * offset low, offset high); its word 0 gives the acceptance uniform
 * u = (w0 >> 8) * 2^-24 and words 2, 3 a 64-bit draw r for sampling. Sampling
 * is exact integer arithmetic: weights become fixed point, w -> trunc(w *
 * 2^39), the integer total S is order-independent, and the token is the
 * first whose inclusive prefix sum exceeds mulhi64(r, S). The full rules
 * (fixed-point scales, the logits path's exp2, fallbacks) are written out in
 * host_ref/ref_spec.c, the specification.
 *
 * Logits input (desc.logits): rows are logits, the distributions are
 * softmax(x / temperature), computed inside with a fixed polynomial exp2 that
 * host_ref evaluates with the same float operations; probabilities below
 * 2^-40 of the row's largest count as 0. Advancing `offset` per call (for
 * example by the step number) gives fresh randomness with one seed.
 *
 * Invalid input: in probability mode every value must be finite and >= 0
 * and every row's sum within `tolerance` of 1 (default 1e-3; the sum is the
 * exact fixed-point sum above, so every implementation agrees on it); logits
 * must not be NaN or +inf and a row must not be all -inf; draft tokens must
 * lie in [0, vocab). A sequence with invalid input gets accepted[b] = one of
 * the FLASHCL_SPEC_BAD_* codes and tokens -1; flashcl_spec_verify_host turns
 * that into FLASHCL_ERROR_INVALID_PROBS with a message.
 * ---------------------------------------------------------------------- */
#define FLASHCL_SPEC_MAX_DRAFT 64        /* k at most                       */
#define FLASHCL_SPEC_MAX_VOCAB (1 << 20) /* vocab at most                   */
enum {
    FLASHCL_SPEC_BAD_VALUE = -1,    /* NaN or infinity (logits: NaN or +inf) */
    FLASHCL_SPEC_BAD_NEGATIVE = -2, /* a negative probability               */
    FLASHCL_SPEC_BAD_SUM = -3,      /* a row's sum is not within tolerance of 1 */
    FLASHCL_SPEC_BAD_TOKEN = -4,    /* a draft token outside [0, vocab)     */
    FLASHCL_SPEC_BAD_ROW = -5,      /* a logits row that is all -inf        */
};

typedef struct flashcl_spec_desc {
    int batch;            /* sequences, >= 1                                   */
    int num_draft;        /* k, 1 .. FLASHCL_SPEC_MAX_DRAFT                    */
    int vocab;            /* 1 .. FLASHCL_SPEC_MAX_VOCAB                       */
    int logits;           /* nonzero: q and p hold logits, not probabilities   */
    float temperature;    /* logits, sampling: > 0                             */
    int greedy;           /* nonzero: argmax verification (q unused, may be NULL) */
    float tolerance;      /* probabilities: |row sum - 1| allowed; 0: 1e-3     */
    unsigned long long seed, offset; /* the Philox key and counter offset      */
    /* Where each tensor starts in its buffer, in elements; all packed:
     *   draft:    int32 [batch][k]
     *   q:        float32 [batch][k][vocab]
     *   p:        float32 [batch][k + 1][vocab]
     *   accepted: int32 [batch]          accepted drafts (0..k) or a BAD code
     *   tokens:   int32 [batch][k + 1]   the accepted drafts, then the
     *             correction or bonus token; -1 after them            */
    size_t draft_offset, q_offset, p_offset, accepted_offset, tokens_offset;
} flashcl_spec_desc;

/* Verification on caller-owned device buffers (see above), one kernel on the
 * context's queue; `event` (may be NULL) receives it. Argument and buffer-
 * size errors return a status and enqueue nothing; invalid probabilities
 * are reported per sequence in `accepted`. Needs an OpenCL device. */
FLASHCL_API flashcl_status flashcl_spec_verify(flashcl_context *ctx, const flashcl_spec_desc *desc,
                                               cl_mem draft, cl_mem q, cl_mem p, cl_mem accepted,
                                               cl_mem tokens, cl_event *event);

/* The same on host memory, blocking (on a host context it runs in C, with
 * the same results). The *_offset fields apply to the host arrays. When any
 * sequence's input is invalid it returns FLASHCL_ERROR_INVALID_PROBS, says
 * which sequence and why in flashcl_last_error, and leaves accepted and
 * tokens untouched. */
FLASHCL_API flashcl_status flashcl_spec_verify_host(flashcl_context *ctx, const flashcl_spec_desc *desc,
                                                    const int *draft, const float *q, const float *p,
                                                    int *accepted, int *tokens);

/* Expected tokens emitted per verification (per target-model call) when
 * every draft token is accepted independently with probability alpha:
 *   E = sum_{i=0..k} alpha^i = (1 - alpha^(k+1)) / (1 - alpha),  k + 1 at alpha = 1.
 * alpha = sum_x min(p(x), q(x)) for a draft q and target p. NaN when alpha
 * is outside [0, 1] or k < 0. */
FLASHCL_API double flashcl_spec_expected_tokens(double alpha, int k);

/* ------------------------------------------------------------------------
 * Continuous batching: an iteration-level scheduler over the paged KV cache
 *
 * Requests (a prompt of P tokens, then up to max_new generated tokens) wait
 * in FIFO order; each step the scheduler picks the work of one model
 * iteration, the caller runs it (appending each scheduled sequence's new
 * K/V with flashcl_kv_cache_append, attending, sampling) and reports what
 * each sequence produced. Continuous mode (Orca, vLLM): finished sequences
 * leave and waiting requests join at every step as soon as the cache's free
 * pages allow; at most `token_budget` tokens are scheduled per step, decodes
 * first, so a long prompt is cut into chunks (chunked prefill) instead of
 * stalling the decodes. When a step's decodes need more pages than are
 * free, the youngest running sequence is preempted: its cache sequence is
 * freed and it goes back to the front of the queue, to be recomputed (its
 * prompt plus the tokens generated so far become its prefill). Static mode:
 * a batch is formed only when the previous one has completely finished and
 * runs until its longest request ends (slots of finished requests stay idle),
 * with pages for each request's whole length reserved on admission.
 *
 * A sequence's per-step token count: a prefill chunk of its remaining
 * prompt, or in decode 1 + spec_tokens (the last generated token and the
 * draft tokens to verify). After the step, flashcl_scheduler_complete takes
 * how many tokens each produced (prefill: 1 when the chunk ends the prompt,
 * else 0; decode: 1 .. 1 + spec_tokens, the accepted drafts plus one); the
 * KV of rejected drafts is dropped by truncating the cache sequence.
 * Requests are never lost or duplicated: each one finishes exactly once.
 * ---------------------------------------------------------------------- */
typedef struct flashcl_scheduler flashcl_scheduler;

typedef enum flashcl_schedule_mode {
    FLASHCL_SCHEDULE_CONTINUOUS = 0,
    FLASHCL_SCHEDULE_STATIC = 1,
} flashcl_schedule_mode;

typedef struct flashcl_scheduler_desc {
    flashcl_schedule_mode mode;
    int max_batch;    /* batch slots: running sequences at most, >= 1       */
    int token_budget; /* tokens per step, >= max_batch * (1 + spec_tokens)  */
    int spec_tokens;  /* draft tokens verified per decode step, 0 .. 64     */
} flashcl_scheduler_desc;

/* One step's work: num_seqs distinct sequences of the cache. Arrays owned by
 * the scheduler, valid until its next call. */
typedef struct flashcl_schedule {
    int num_seqs;
    const int *seq_ids;     /* cache sequence ids                          */
    const int *request_ids; /* the caller's ids of their requests          */
    const int *num_tokens;  /* new tokens to append and attend, >= 1       */
    const int *context;     /* tokens in the cache before this step        */
    const int *is_prefill;  /* 1: a prompt chunk; 0: a decode              */
    int total_tokens;       /* sum of num_tokens, <= token_budget           */
    int num_preempted;      /* sequences preempted while planning this step */
} flashcl_schedule;

typedef struct flashcl_scheduler_stats {
    int waiting, running;   /* requests in each queue now                  */
    int finished;           /* requests finished so far                    */
    long preemptions;       /* preemptions so far                          */
    long steps;             /* steps planned so far                        */
} flashcl_scheduler_stats;

/* Creates a scheduler that allocates and frees sequences of `cache` (which
 * it does not own and which must outlive it; other sequences of the cache
 * are left alone but their pages count as used). */
FLASHCL_API flashcl_status flashcl_scheduler_create(flashcl_kv_cache *cache, const flashcl_scheduler_desc *desc,
                                                    flashcl_scheduler **out);
/* Frees the scheduler and the cache sequences it still holds. NULL is a no-op. */
FLASHCL_API void flashcl_scheduler_destroy(flashcl_scheduler *sched);

/* Queues a request: `request_id` is the caller's (any int, unique among
 * unfinished requests), prompt_len >= 1, max_new >= 1. A request that could
 * never fit the cache alone (prompt_len + max_new + spec_tokens tokens)
 * returns FLASHCL_ERROR_OUT_OF_PAGES and is not queued. */
FLASHCL_API flashcl_status flashcl_scheduler_add(flashcl_scheduler *sched, int request_id, int prompt_len,
                                                 int max_new);

/* Plans the next step into *out (num_seqs 0 when nothing can run: no
 * requests, or static mode with nothing left). Must be followed by
 * flashcl_scheduler_complete before the next plan. */
FLASHCL_API flashcl_status flashcl_scheduler_step(flashcl_scheduler *sched, flashcl_schedule *out);

/* Ends the planned step: produced[i] tokens for sequence i of the schedule
 * (see above; clamped to what the request still wants). The caller must have
 * appended num_tokens[i] tokens to each sequence. Requests that are now
 * complete leave: their ids go to finished_ids[0 .. *num_finished) (room for
 * num_seqs entries; finished_ids and num_finished may be NULL) and their
 * cache sequences are freed. */
FLASHCL_API flashcl_status flashcl_scheduler_complete(flashcl_scheduler *sched, const int *produced,
                                                      int *finished_ids, int *num_finished);

FLASHCL_API void flashcl_scheduler_get_stats(const flashcl_scheduler *sched, flashcl_scheduler_stats *stats);

/* Drops tokens past `length` from a cache sequence (0 <= length <= its
 * length), returning pages no longer needed to the free list; what rolling
 * back rejected draft tokens needs. A later append overwrites the dropped
 * rows (copying the page first if it is shared). */
FLASHCL_API flashcl_status flashcl_kv_cache_truncate(flashcl_kv_cache *cache, int seq, int length);

#ifdef __cplusplus
}
#endif
#endif /* FLASHCL_H */
