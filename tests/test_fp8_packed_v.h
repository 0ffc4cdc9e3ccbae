/* test_fp8_packed_v.h: what test_fp8_packed_v's three sources share: test_fp8_packed_v.c (the
 * layout's reference, the helpers, the pack and forward checks, main), test_fp8_packed_v_refusals.c
 * (the refusals) and test_fp8_packed_v_wgmma.c (the Hopper FP8 kernel). The failure count, the
 * packed layout's sizes, the V layouts, a forward case and its inputs, and the helpers and checks
 * called across files; each is specified where it is defined. */
#ifndef FLASHCL_TEST_FP8_PACKED_V_H
#define FLASHCL_TEST_FP8_PACKED_V_H

#include <stddef.h>
#include <stdint.h>

#include "flashcl.h"

/* Every check's failures (expect's counter), in test_fp8_packed_v.c. */
extern int failures;

/* ---- test_fp8_packed_v.c: the layout and the helpers ----------------------------------------- */

/* A packed V's rows per (batch, kv head), head_dim rounded up to 64, and bytes a row, seqlen_k
 * rounded up to 128. */
size_t packed_rows(int head_dim);
size_t packed_keys(int seqlen_k);

/* V layouts the cases use, for (batch, seqlen, heads, head_dim) rows of bytes. */
enum { V_PACKED, V_BHSD, V_PADDED, V_ODD, V_LAYOUTS };

/* Forces a kernel through FLASHCL_PARAMS (NULL: the device's own choice). */
void use_variant(const char *variant);
/* A device buffer of `bytes` holding `poison` in every byte. */
cl_mem poisoned_buffer(flashcl_context *ctx, size_t bytes, unsigned char poison);
/* Whether all n bytes of p are `value`. */
int all_bytes(const unsigned char *p, size_t n, unsigned char value);

/* ---- test_fp8_packed_v.c: the forward given V packed (2) ------------------------------------- */

/* v strides a packed desc carries: zero (the packed default), past any buffer, or inside the
 * buffer but not V's. A forward that read a packed V as V would differ, fail or fault on each. */
enum { JUNK_ZERO, JUNK_HUGE, JUNK_BHSD };

typedef struct fwd_case {
    flashcl_dtype format, out_dtype;
    int batch, heads_q, heads_k, seqlen_q, seqlen_k, head_dim, causal;
    int v_layout;  /* natural V's layout (V_*) */
    int factors;   /* 0 per head, > 0 per head with blocks of that many rows, -1 NULL arrays */
    size_t offset; /* the packed V's v.offset */
    int junk;      /* the packed desc's v strides (not to be read): JUNK_* */
} fwd_case;

/* The inputs of one case: natural desc d, its packed twin dp, q, k, v, and V packed on the host at
 * dp.v.offset of vp (vp_bytes in all). */
typedef struct fwd_inputs {
    flashcl_attention_desc d, dp;
    unsigned char *q, *k, *v, *vp;
    size_t nq, nk, nv, vp_bytes, n_out, n_lse, out_bytes;
    float *factors[3];
} fwd_inputs;

/* A case's name into buf. */
void describe(char *buf, size_t cap, const fwd_case *c);
/* Fresh inputs for c; returns 0 (after a failed line) when the host pack refused them. Free them
 * with free_inputs either way. */
int make_inputs(const fwd_case *c, uint64_t seed, fwd_inputs *in);
void free_inputs(fwd_inputs *in);
/* A natural result and a packed one bitwise equal, each call successful, every output written. */
void expect_same(const char *what, const fwd_inputs *in, flashcl_status s1, flashcl_status s2,
                 const void *o1, const void *o2, const float *l1, const float *l2,
                 const char *message);
/* flashcl_attention_forward, V natural then packed on the device, on each kernel of `variants`. */
void device_pairs(flashcl_context *ctx, const char *const *variants, int n_variants,
                  const fwd_inputs *in, const char *name);
/* Packed Vs forwarded back to back, `rounds` times, each against its natural forward. */
void back_to_back(flashcl_context *ctx, const char *where, flashcl_dtype out_dtype,
                  const char *variant, int rounds, uint64_t seed);

/* ---- test_fp8_packed_v_refusals.c (3) -------------------------------------------------------- */

/* A forward that must fail with `want` (its error text holding `needle`) and write nothing. */
void refuse_forward(flashcl_context *ctx, const flashcl_attention_desc *d, size_t vp_bytes,
                    flashcl_status want, int desc_error, const char *needle, const char *what);
/* Every refusal; dev or host may be NULL (no OpenCL device, no host context). */
void refusals(flashcl_context *dev, flashcl_context *host);

/* ---- test_fp8_packed_v_wgmma.c: the Hopper FP8 kernel (4) ------------------------------------ */

/* Whether ctx is an OpenCL device of NVIDIA compute capability 9.0. */
int is_hopper(const flashcl_context *ctx);
/* nv-wgmma-fp8 forced on packed against natural V (off compute capability 9.0: its refusal). */
void wgmma_checks(flashcl_context *ctx, uint64_t seed);

#endif
