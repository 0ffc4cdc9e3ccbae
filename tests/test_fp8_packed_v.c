/* test_fp8_packed_v.c: FP8 V packed for the Hopper FP8 forward (desc.v_packed, flashcl_fp8_pack_v).
 *
 * 1. The pack against a reference pack written here: per (batch, kv head) ceil(D/64)*64 rows of
 *    ceil(Nk/128)*128 bytes, row d head dim d, position c of a 128-key tile holding key
 *    VT_KEY(c), zeros past Nk and D. The reference is not independent of the library: its key
 *    order (vt_key) is VT_KEY copied from cl/fp8_vt_pack.cl, the kernel the library packs with.
 *    And on PoCL the forward checks below cannot tell a wrong order: there every packed V is
 *    unpacked by the library before any kernel reads it, so a pack and an unpack that were any
 *    pair of mutually inverse permutations would pass them. So the reference pack is itself
 *    checked against the rule include/flashcl.h documents, typed here from the header's text
 *    (key n at byte (n & ~15) + 4 ((n >> 1) & 3) + 2 ((n >> 3) & 1) + (n & 1) of its row, row d
 *    of (b, h) at ((b * heads_k + h) * R + d) * K: layout_rule_checks). Then
 *    flashcl_fp8_packed_v_bytes, flashcl_fp8_pack_v_host and flashcl_fp8_pack_v byte for byte,
 *    destinations poisoned (0x7f) so padding must be written as zeros, and the bytes before and
 *    after the packed V untouched. Random bytes (every code), head dims 16..128 by 16, key counts
 *    around the 128-key tile, batch 2 with 3 kv heads, packed, [b][h][s][d] and padded V layouts
 *    at nonzero offsets, nonzero packed offsets; V rows with no alignment (the host pack takes
 *    them, the device pack, which reads 16-byte words, refuses them); a desc with only the
 *    fields the header says the pack reads.
 * 2. The forward given V packed against the forward given V as it is, same desc otherwise, on
 *    the same kernel: out and lse bitwise equal (the header promises the same function "bit for
 *    bit on a given kernel"). On the device's default kernel, the portable and cpu kernels
 *    forced (FLASHCL_PARAMS), through flashcl_attention_forward_host on the device context and
 *    on a host context; e4m3 and e5m2, f32, f16 and bf16 out, causal or not, GQA, decode,
 *    per-head and block factors, NULL factors. The packed descs' v strides (not to be read) are
 *    zero, past any buffer, or inside the buffer but not V's: a forward that read the packed
 *    bytes as V differs, fails or faults. And back to back, no wait between the calls: two
 *    packed Vs of one shape, then one of a larger shape, each forward against its own natural
 *    one, on the context's queue and for 32 rounds on an out-of-order one (off the Hopper kernel
 *    a packed V is unpacked into the context's scratch buffer: a later call must not overwrite
 *    it under an earlier one, nor, the larger one, reallocate it under them: that it grew in
 *    the first round is checked; an unpack that did not wait for the last reader failed 6 runs
 *    of 6 on PoCL, 2 cores, in 2 to 12 rounds of 32).
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
 * Argument "wgmma" (FLASHCL_TEST_DEVICE=nvidia): on compute capability 9.0 the pack on the GPU,
 * then the forward on nv-wgmma-fp8 forced, which reads a packed V as it is, bitwise against
 * natural V (which it transposes itself): D 32, 64, 96 and 128 (32 and 96: half of a 64-dim
 * panel padding), f16 out, 300 and 1000 keys and queries, causal or not, on a fresh context with
 * TMA copies as the library chooses, then on another with FLASHCL_TMA=0 (cp.async; no TMA slots
 * allocated there, checked; the variable restored after). On each fresh context first: a packed
 * forward (finished) leaves ctx->fp8_vt, the per-call transpose's scratch, unallocated, and a
 * natural one then allocates it. Then back to back as in 2, f16 out on nv-wgmma-fp8 forced, in
 * order and out of order. Elsewhere, that forcing that kernel on a packed V is refused, out
 * untouched. The default run does the same where the device is one. "oclgrind": tiny shapes of
 * the device pack and of a packed forward on both kernels (ctest -L oclgrind).
 * FLASHCL_TEST_SEED replays a run.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcl.h"
#include "flashcl_ref.h"
#include "harness.h"
#include "internal.h" /* the device's compute capability, for nv-wgmma-fp8 */

static int failures;

/* ---- the layout ------------------------------------------------------------------------------ */

/* The key at position c (0..127) of a 128-key tile's packed rows: lane t of the Hopper kernel's P
 * fragments holds keys 2t, 2t+1, 8+2t, 9+2t of each 16-key group at positions 4t..4t+3. This is
 * cl/fp8_vt_pack.cl's VT_KEY, copied, not derived: layout_rule_checks holds it to the header. */
static int vt_key(int c) {
    return (c & ~15) + 2 * ((c >> 2) & 3) + (c & 1) + 8 * ((c >> 1) & 1);
}

/* The position of key n (0..127) in its tile's packed rows, as include/flashcl.h words the rule
 * (typed from the header's text, not from the library's code). */
static int header_pos(int n) {
    return (n & ~15) + 4 * ((n >> 1) & 3) + 2 * ((n >> 3) & 1) + (n & 1);
}

static size_t packed_rows(int head_dim) {
    return (size_t)(head_dim + 63) / 64 * 64;
}
static size_t packed_keys(int seqlen_k) {
    return (size_t)(seqlen_k + 127) / 128 * 128;
}

/* V layouts the cases use, for (batch, seqlen, heads, head_dim) rows of bytes. */
enum { V_PACKED, V_BHSD, V_PADDED, V_ODD, V_LAYOUTS };
static const char *const v_layout_name[V_LAYOUTS] = {"packed", "bhsd@32", "padded@16", "odd@5"};

/* Layout `kind`; *span: the bytes it covers. V_PACKED leaves the strides 0 (the default),
 * V_BHSD and V_PADDED keep rows 16-byte aligned when head_dim is a multiple of 16 (the Hopper
 * kernel's condition), V_ODD aligns nothing. */
static flashcl_layout v_layout(int kind, int batch, int seqlen, int heads, int head_dim,
                               size_t *span) {
    flashcl_layout l = {0, 0, 0, 0};
    const size_t N = (size_t)seqlen, H = (size_t)heads, D = (size_t)head_dim;
    switch (kind) {
    case V_BHSD:
        l.offset = 32, l.stride_seq = D, l.stride_head = N * D, l.stride_batch = H * N * D;
        break;
    case V_PADDED:
        l.offset = 16, l.stride_head = D + 16, l.stride_seq = H * (D + 16) + 32,
        l.stride_batch = N * l.stride_seq + 48;
        break;
    case V_ODD:
        l.offset = 5, l.stride_head = D + 3, l.stride_seq = H * (D + 3) + 1,
        l.stride_batch = N * l.stride_seq + 7;
        break;
    default:
        *span = (size_t)batch * N * H * D;
        return l;
    }
    *span = l.offset + (size_t)batch * l.stride_batch;
    return l;
}

/* V (bytes in layout l, zero strides meaning packed) packed as the header says, into out. */
static void ref_pack(int B, int H, int N, int D, const flashcl_layout *l, const unsigned char *v,
                     unsigned char *out) {
    const int packed = !l->stride_batch && !l->stride_seq && !l->stride_head;
    const size_t sh = packed ? (size_t)D : l->stride_head,
                 ss = packed ? (size_t)H * D : l->stride_seq;
    const size_t sb = packed ? (size_t)N * H * D : l->stride_batch;
    const size_t rows = packed_rows(D), keys = packed_keys(N);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (size_t d = 0; d < rows; ++d)
                for (size_t c = 0; c < keys; ++c) {
                    const size_t key = c / 128 * 128 + (size_t)vt_key((int)(c % 128));
                    out[(((size_t)b * H + h) * rows + d) * keys + c] =
                        d < (size_t)D && key < (size_t)N
                            ? v[l->offset + b * sb + key * ss + h * sh + d]
                            : 0;
                }
}

/* ---- helpers --------------------------------------------------------------------------------- */

static const char *dtype_name(flashcl_dtype d) {
    static const char *const n[] = {"f32", "f16", "bf16", "e4m3", "e5m2"};
    return (unsigned)d < 5 ? n[d] : "?";
}

/* Random FP8 bytes: N(0, 1) encoded (finite codes, so outputs are numbers a comparison can see). */
static void fill_fp8(flashcl_ref_rng *rng, flashcl_dtype f, unsigned char *x, size_t n) {
    for (size_t i = 0; i < n; ++i)
        x[i] = flashcl_fp8_encode(f, (float)flashcl_ref_rng_normal(rng));
}

/* Factors in [0.25, 2): distinct per head and block, so a factor applied to the wrong V shows. */
static float *random_factors(flashcl_ref_rng *rng, size_t n) {
    float *s = test_xmalloc(n * sizeof *s);
    for (size_t i = 0; i < n; ++i)
        s[i] = (float)(0.25 + 1.75 * flashcl_ref_rng_uniform(rng));
    return s;
}

/* Forces a kernel through FLASHCL_PARAMS (NULL: the device's own choice). */
static void use_variant(const char *variant) {
    char env[64];
    if (!variant) {
        unsetenv("FLASHCL_PARAMS");
        return;
    }
    snprintf(env, sizeof env, "VARIANT=%s", variant);
    setenv("FLASHCL_PARAMS", env, 1);
}

/* A device buffer of `bytes` holding `poison` in every byte. */
static cl_mem poisoned_buffer(flashcl_context *ctx, size_t bytes, unsigned char poison) {
    unsigned char *p = test_xmalloc(bytes);
    memset(p, poison, bytes);
    cl_mem b = test_upload(ctx, p, bytes);
    free(p);
    return b;
}

static size_t first_difference(const unsigned char *a, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (a[i] != b[i])
            return i;
    return n;
}

static int all_bytes(const unsigned char *p, size_t n, unsigned char value) {
    for (size_t i = 0; i < n; ++i)
        if (p[i] != value)
            return 0;
    return 1;
}

/* ---- 1. the pack ----------------------------------------------------------------------------- */

/* One shape: the size query, the host pack and (ctx not NULL) the device pack at packed_offset,
 * each against ref_pack. The device pack reads V in 16-byte words: a V whose offset or strides
 * are not multiples of 16 bytes (V_ODD) it refuses (INVALID_ARGUMENT), writing nothing. */
static void pack_case(flashcl_context *ctx, flashcl_dtype f, int B, int H, int N, int D, int layout,
                      size_t packed_offset, uint64_t seed) {
    enum { GUARD = 64, POISON = 0x7f };
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    /* heads_q (twice heads_k) and seqlen_q (1) differ from the kv side's: a pack that took them
     * for heads_k or seqlen_k shows */
    flashcl_attention_desc d = test_attention_desc(f, B, 2 * H, H, 1, N, D);
    size_t span;
    d.v = v_layout(layout, B, N, H, D, &span);
    const size_t want_bytes = (size_t)B * H * packed_rows(D) * packed_keys(N);
    const size_t bytes = flashcl_fp8_packed_v_bytes(&d);
    unsigned char *v = test_xmalloc(span), *want = test_xmalloc(want_bytes);
    for (size_t i = 0; i < span; ++i)
        v[i] = (unsigned char)flashcl_ref_rng_next(&rng); /* every code: the pack moves bytes */
    ref_pack(B, H, N, D, &d.v, v, want);
    char what[240];
    snprintf(what, sizeof what, "pack %s B%d Hk%d Nk%d D%d, v %s", dtype_name(f), B, H, N, D,
             v_layout_name[layout]);
    size_t n = strlen(what);
    snprintf(what + n, sizeof what - n, ": flashcl_fp8_packed_v_bytes %zu (%zu)", bytes,
             want_bytes);
    expect(bytes == want_bytes, what, &failures);
    if (bytes != want_bytes) {
        free(v), free(want);
        return;
    }

    /* host: written 16 bytes into a poisoned array, the bytes around it kept */
    unsigned char *h = test_xmalloc(16 + bytes + GUARD);
    memset(h, POISON, 16 + bytes + GUARD);
    flashcl_status st = flashcl_fp8_pack_v_host(&d, v, h + 16);
    size_t at = first_difference(h + 16, want, bytes);
    what[n] = '\0';
    snprintf(what + n, sizeof what - n, ": host pack (%s) equals the layout's",
             flashcl_status_string(st));
    if (at < bytes)
        snprintf(what + strlen(what), sizeof what - strlen(what),
                 ", first difference at byte %zu (%#x, want %#x)", at, h[16 + at], want[at]);
    expect(st == FLASHCL_SUCCESS && at == bytes && all_bytes(h, 16, POISON) &&
               all_bytes(h + 16 + bytes, GUARD, POISON),
           what, &failures);
    free(h);

    if (ctx) { /* device: at packed_offset in a poisoned buffer, through the event it returns */
        const size_t total = packed_offset + bytes + GUARD;
        cl_mem bv = test_upload(ctx, v, span), bp = poisoned_buffer(ctx, total, POISON);
        cl_event ev = NULL;
        st = flashcl_fp8_pack_v(ctx, &d, bv, bp, packed_offset, &ev);
        int waited = 1;
        if (st == FLASHCL_SUCCESS)
            waited = ev && clWaitForEvents(1, &ev) == CL_SUCCESS;
        if (ev)
            clReleaseEvent(ev);
        unsigned char *got = test_xmalloc(total);
        test_download(ctx, bp, got, total);
        what[n] = '\0';
        if (layout == V_ODD) {
            snprintf(what + n, sizeof what - n, ": device pack refused (%s: %s), writes nothing",
                     flashcl_status_string(st), flashcl_last_error(ctx));
            expect(st == FLASHCL_ERROR_INVALID_ARGUMENT && all_bytes(got, total, POISON), what,
                   &failures);
        } else {
            at = first_difference(got + packed_offset, want, bytes);
            snprintf(what + n, sizeof what - n,
                     ": device pack at byte %zu (%s%s) equals the layout's", packed_offset,
                     flashcl_status_string(st), waited ? "" : ", no event");
            if (at < bytes)
                snprintf(what + strlen(what), sizeof what - strlen(what),
                         ", first difference at byte %zu (%#x, want %#x)", at,
                         got[packed_offset + at], want[at]);
            if (st != FLASHCL_SUCCESS)
                printf("  %s\n", flashcl_last_error(ctx));
            expect(st == FLASHCL_SUCCESS && waited && at == bytes &&
                       all_bytes(got, packed_offset, POISON) &&
                       all_bytes(got + packed_offset + bytes, GUARD, POISON),
                   what, &failures);
        }
        free(got);
        clReleaseMemObject(bv), clReleaseMemObject(bp);
    }
    free(v), free(want);
}

/* The header: of the desc the pack reads dtype, batch, heads_k, seqlen_k, head_dim and v's
 * layout, nothing else. A desc with only those set (no queries yet: a shared prefix packed
 * before any prompt comes) sizes and packs as a full one does, on the host and the device. */
static void pack_fields_only(flashcl_context *ctx, uint64_t seed) {
    enum { B = 2, H = 2, N = 70, D = 64 };
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    flashcl_attention_desc bare = FLASHCL_ZERO_INIT;
    bare.dtype = FLASHCL_FLOAT8_E5M2, bare.batch = B, bare.heads_k = H;
    bare.seqlen_k = N, bare.head_dim = D;
    const size_t n = (size_t)B * N * H * D,
                 want_bytes = (size_t)B * H * packed_rows(D) * packed_keys(N);
    unsigned char *v = test_xmalloc(n), *want = test_xmalloc(want_bytes),
                  *got = test_xmalloc(want_bytes);
    for (size_t i = 0; i < n; ++i)
        v[i] = (unsigned char)flashcl_ref_rng_next(&rng);
    ref_pack(B, H, N, D, &bare.v, v, want);
    const size_t bytes = flashcl_fp8_packed_v_bytes(&bare);
    char what[320];
    snprintf(what, sizeof what,
             "flashcl_fp8_packed_v_bytes of a desc with only the fields the pack reads: %zu (%zu)",
             bytes, want_bytes);
    expect(bytes == want_bytes, what, &failures);
    memset(got, 0x7f, want_bytes);
    flashcl_status st = flashcl_fp8_pack_v_host(&bare, v, got);
    snprintf(what, sizeof what, "host pack of a desc with only the fields the pack reads (%s%s%s)",
             flashcl_status_string(st), st ? ": " : "", st ? flashcl_last_error(NULL) : "");
    expect(st == FLASHCL_SUCCESS && !memcmp(got, want, want_bytes), what, &failures);
    if (ctx) {
        cl_mem bv = test_upload(ctx, v, n), bp = poisoned_buffer(ctx, want_bytes, 0x7f);
        st = flashcl_fp8_pack_v(ctx, &bare, bv, bp, 0, NULL);
        snprintf(what, sizeof what,
                 "device pack of a desc with only the fields the pack reads (%s%s%s)",
                 flashcl_status_string(st), st ? ": " : "", st ? flashcl_last_error(ctx) : "");
        test_download(ctx, bp, got, want_bytes);
        expect(st == FLASHCL_SUCCESS && !memcmp(got, want, want_bytes), what, &failures);
        clReleaseMemObject(bv), clReleaseMemObject(bp);
    }
    free(v), free(want), free(got);
}

/* ref_pack (and so every pack check above, the library's packs being compared with it) against
 * the header's rule, which is written here apart from vt_key: header_pos a permutation of each
 * tile's 128 positions whose inverse is vt_key, and ref_pack putting byte (b, key n, h, d) of V at
 * ((b * heads_k + h) * R + d) * K + (n & ~127) + header_pos(n & 127), R rows, K keys a row. A
 * reference that took vt_key for header_pos (its inverse) fails here; no forward shows it. */
static void layout_rule_checks(uint64_t seed) {
    enum { B = 2, H = 3, N = 300, D = 80 };
    int seen[128] = {0}, inverse = 1, perm = 1;
    for (int n = 0; n < 128; ++n) {
        const int c = header_pos(n);
        perm &= c >= 0 && c < 128 && !seen[c];
        if (c >= 0 && c < 128)
            seen[c] = 1;
        inverse &= vt_key(c) == n;
    }
    expect(perm && inverse,
           "layout: the header's key positions are a permutation of a tile, vt_key its inverse",
           &failures);
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    flashcl_layout l = {0, 0, 0, 0};
    const size_t R = packed_rows(D), K = packed_keys(N), nv = (size_t)B * N * H * D;
    unsigned char *v = test_xmalloc(nv), *out = test_xmalloc((size_t)B * H * R * K);
    for (size_t i = 0; i < nv; ++i)
        v[i] = (unsigned char)flashcl_ref_rng_next(&rng);
    ref_pack(B, H, N, D, &l, v, out);
    size_t wrong = 0;
    for (int b = 0; b < B; ++b)
        for (int n = 0; n < N; ++n)
            for (int h = 0; h < H; ++h)
                for (int d = 0; d < D; ++d) {
                    const size_t at = (((size_t)b * H + h) * R + d) * K + (size_t)(n & ~127) +
                                      (size_t)header_pos(n & 127);
                    wrong += out[at] != v[(((size_t)b * N + n) * H + h) * D + d];
                }
    char line[200];
    snprintf(line, sizeof line,
             "layout: the reference pack puts each byte of V where the header's rule says (%zu of "
             "%zu misplaced)",
             wrong, nv);
    expect(wrong == 0, line, &failures);
    free(v), free(out);
}

/* Head dims 16..128 by 16 (48 and 80: one 64-dim panel partly padded), key counts 1, one short of
 * a tile, a tile, one past, and 300 (a partial third tile); layouts and packed offsets cycled. */
static void pack_checks(flashcl_context *ctx, uint64_t seed) {
    layout_rule_checks(seed + 104729u);
    static const int dims[] = {16, 48, 64, 80, 128}, keys[] = {1, 127, 128, 129, 300};
    static const size_t offsets[] = {0, 16, 48, 4096};
    int i = 0;
    for (size_t a = 0; a < sizeof dims / sizeof dims[0]; ++a)
        for (size_t b = 0; b < sizeof keys / sizeof keys[0]; ++b, ++i)
            pack_case(ctx, i % 2 ? FLASHCL_FLOAT8_E5M2 : FLASHCL_FLOAT8_E4M3, 2, 3, keys[b],
                      dims[a], i % 3, offsets[i % 4], seed + 7919u * (uint64_t)i);
    /* rows with no alignment at all: the host pack takes them, the device pack refuses them */
    pack_case(ctx, FLASHCL_FLOAT8_E4M3, 2, 3, 129, 80, V_ODD, 32, seed + 7919u * (uint64_t)i++);
    pack_case(ctx, FLASHCL_FLOAT8_E5M2, 1, 2, 300, 16, V_ODD, 16, seed + 7919u * (uint64_t)i++);
    pack_fields_only(ctx, seed + 7919u * (uint64_t)i++);
}

/* ---- 2. the forward given V packed ----------------------------------------------------------- */

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

static void describe(char *buf, size_t cap, const fwd_case *c) {
    static const char *const junk[] = {"", " (huge strides)", " (bhsd strides)"};
    snprintf(buf, cap, "%s->%s B%d Hq%d Hk%d %dx%d D%d%s, v %s, packed at %zu%s",
             dtype_name(c->format), dtype_name(c->out_dtype), c->batch, c->heads_q, c->heads_k,
             c->seqlen_q, c->seqlen_k, c->head_dim, c->causal ? " causal" : "",
             v_layout_name[c->v_layout], c->offset, junk[c->junk]);
}

/* Fresh inputs for c; returns 0 (after a failed line) when the host pack refused them. */
static int make_inputs(const fwd_case *c, uint64_t seed, fwd_inputs *in) {
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, seed);
    memset(in, 0, sizeof *in);
    flashcl_attention_desc *d = &in->d;
    *d = test_attention_desc(c->format, c->batch, c->heads_q, c->heads_k, c->seqlen_q, c->seqlen_k,
                             c->head_dim);
    d->out_dtype = c->out_dtype;
    d->causal = c->causal;
    d->v = v_layout(c->v_layout, c->batch, c->seqlen_k, c->heads_k, c->head_dim, &in->nv);
    in->nq = (size_t)c->batch * c->seqlen_q * c->heads_q * c->head_dim;
    in->nk = (size_t)c->batch * c->seqlen_k * c->heads_k * c->head_dim;
    in->q = test_xmalloc(in->nq), in->k = test_xmalloc(in->nk), in->v = test_xmalloc(in->nv);
    fill_fp8(&rng, c->format, in->q, in->nq);
    fill_fp8(&rng, c->format, in->k, in->nk);
    fill_fp8(&rng, c->format, in->v, in->nv);
    if (c->factors >= 0) {
        const size_t hq = (size_t)c->batch * c->heads_q, hk = (size_t)c->batch * c->heads_k;
        const size_t bq = c->factors ? (size_t)(c->seqlen_q + c->factors - 1) / c->factors : 1;
        const size_t bk = c->factors ? (size_t)(c->seqlen_k + c->factors - 1) / c->factors : 1;
        d->fp8.per_head = 1;
        d->fp8.block_rows = c->factors;
        d->fp8.q_descale = in->factors[0] = random_factors(&rng, hq * bq);
        d->fp8.k_descale = in->factors[1] = random_factors(&rng, hk * bk);
        d->fp8.v_descale = in->factors[2] = random_factors(&rng, hk);
    }
    in->n_out = in->nq;
    in->n_lse = (size_t)c->batch * c->heads_q * c->seqlen_q;
    in->out_bytes = in->n_out * flashcl_dtype_size(c->out_dtype);
    in->dp = *d;
    in->dp.v_packed = 1;
    in->dp.v.offset = c->offset;
    /* The header: v's strides are not read with v_packed. */
    flashcl_layout *pl = &in->dp.v;
    const size_t N = (size_t)c->seqlen_k, D = (size_t)c->head_dim;
    if (c->junk == JUNK_HUGE) /* a bounds check that read them would refuse the call */
        pl->stride_batch = pl->stride_seq = pl->stride_head = (size_t)1 << 32;
    else if (c->junk == JUNK_BHSD)
        pl->stride_seq = D, pl->stride_head = N * D, pl->stride_batch = (size_t)c->heads_k * N * D;
    else
        pl->stride_batch = pl->stride_seq = pl->stride_head = 0;
    const size_t bytes = flashcl_fp8_packed_v_bytes(d);
    in->vp_bytes = c->offset + bytes;
    in->vp = test_xmalloc(in->vp_bytes);
    memset(in->vp, 0x7f, in->vp_bytes);
    const flashcl_status st = bytes ? flashcl_fp8_pack_v_host(d, in->v, in->vp + c->offset)
                                    : FLASHCL_ERROR_INVALID_ARGUMENT;
    if (st != FLASHCL_SUCCESS) {
        char what[240];
        describe(what, sizeof what, c);
        snprintf(what + strlen(what), sizeof what - strlen(what), ": host pack of %zu bytes (%s)",
                 bytes, flashcl_status_string(st));
        expect(0, what, &failures);
        return 0;
    }
    return 1;
}

static void free_inputs(fwd_inputs *in) {
    free(in->q), free(in->k), free(in->v), free(in->vp);
    for (int t = 0; t < 3; ++t)
        free(in->factors[t]);
}

/* A natural result and a packed one: both calls succeeded, every output element of the natural
 * one written (the poison is NaN: no call that wrote nothing passes as equal), and out and lse
 * bitwise equal. */
static void expect_same(const char *what, const fwd_inputs *in, flashcl_status s1,
                        flashcl_status s2, const void *o1, const void *o2, const float *l1,
                        const float *l2, const char *message) {
    const flashcl_dtype od = in->d.out_dtype;
    size_t written = 0;
    for (size_t i = 0; i < in->n_out; ++i)
        written += !isnan(flashcl_ref_load(o1, od, i));
    const size_t es = flashcl_dtype_size(od);
    const size_t at = first_difference(o1, o2, in->out_bytes) / es;
    const size_t at_lse =
        first_difference((const unsigned char *)l1, (const unsigned char *)l2, in->n_lse * 4) / 4;
    char line[400];
    snprintf(line, sizeof line, "%s: natural %s, packed %s, %zu of %zu written, out %s, lse %s",
             what, flashcl_status_string(s1), flashcl_status_string(s2), written, in->n_out,
             at == in->n_out ? "same" : "DIFFERS", at_lse == in->n_lse ? "same" : "DIFFERS");
    const int ok = s1 == FLASHCL_SUCCESS && s2 == FLASHCL_SUCCESS && written == in->n_out &&
                   at == in->n_out && at_lse == in->n_lse;
    expect(ok, line, &failures);
    if (s1 != FLASHCL_SUCCESS || s2 != FLASHCL_SUCCESS)
        printf("  %s\n", message);
    if (at < in->n_out && !s1 && !s2)
        printf("  first difference: out[%zu] %.9g vs %.9g\n", at, flashcl_ref_load(o1, od, at),
               flashcl_ref_load(o2, od, at));
    if (at_lse < in->n_lse && !s1 && !s2)
        printf("  first difference: lse[%zu] %.9g vs %.9g\n", at_lse, (double)l1[at_lse],
               (double)l2[at_lse]);
}

/* flashcl_attention_forward_host with natural, then packed V (the host pack's) on ctx, on its
 * own choice of kernel. */
static void host_pointer_pair(flashcl_context *ctx, const char *where, const fwd_inputs *in,
                              const char *name) {
    void *o1 = test_xmalloc(in->out_bytes), *o2 = test_xmalloc(in->out_bytes);
    float *l1 = test_xmalloc(in->n_lse * 4), *l2 = test_xmalloc(in->n_lse * 4);
    flashcl_ref_poison(o1, in->d.out_dtype, in->n_out);
    flashcl_ref_poison(o2, in->d.out_dtype, in->n_out);
    flashcl_ref_poison(l1, FLASHCL_FLOAT32, in->n_lse);
    flashcl_ref_poison(l2, FLASHCL_FLOAT32, in->n_lse);
    const flashcl_status s1 =
        flashcl_attention_forward_host(ctx, &in->d, in->q, in->k, in->v, o1, l1);
    char message[300];
    snprintf(message, sizeof message, "natural: %s", s1 ? flashcl_last_error(ctx) : "ok");
    const flashcl_status s2 =
        flashcl_attention_forward_host(ctx, &in->dp, in->q, in->k, in->vp, o2, l2);
    if (s2)
        snprintf(message + strlen(message), sizeof message - strlen(message), "; packed: %s",
                 flashcl_last_error(ctx));
    char what[320];
    snprintf(what, sizeof what, "%s forward_host %s", where, name);
    expect_same(what, in, s1, s2, o1, o2, l1, l2, message);
    free(o1), free(o2), free(l1), free(l2);
}

/* flashcl_attention_forward on device buffers: V natural, then packed by flashcl_fp8_pack_v into
 * a poisoned buffer at dp.v.offset, on each kernel of `variants` (NULL: the default). */
static void device_pairs(flashcl_context *ctx, const char *const *variants, int n_variants,
                         const fwd_inputs *in, const char *name) {
    cl_mem bq = test_upload(ctx, in->q, in->nq), bk = test_upload(ctx, in->k, in->nk),
           bv = test_upload(ctx, in->v, in->nv);
    cl_mem bp = poisoned_buffer(ctx, in->vp_bytes, 0x7f);
    const flashcl_status sp = flashcl_fp8_pack_v(ctx, &in->d, bv, bp, in->dp.v.offset, NULL);
    if (sp != FLASHCL_SUCCESS) {
        char what[320];
        snprintf(what, sizeof what, "device pack for %s (%s: %s)", name, flashcl_status_string(sp),
                 flashcl_last_error(ctx));
        expect(0, what, &failures);
    }
    void *o1 = test_xmalloc(in->out_bytes), *o2 = test_xmalloc(in->out_bytes);
    float *l1 = test_xmalloc(in->n_lse * 4), *l2 = test_xmalloc(in->n_lse * 4);
    for (int i = 0; i < n_variants && sp == FLASHCL_SUCCESS; ++i) {
        flashcl_ref_poison(o1, in->d.out_dtype, in->n_out);
        flashcl_ref_poison(l1, FLASHCL_FLOAT32, in->n_lse);
        cl_mem bo1 = test_upload(ctx, o1, in->out_bytes), bo2 = test_upload(ctx, o1, in->out_bytes);
        cl_mem bl1 = test_upload(ctx, l1, in->n_lse * 4), bl2 = test_upload(ctx, l1, in->n_lse * 4);
        use_variant(variants[i]);
        const flashcl_status s1 =
            flashcl_attention_forward(ctx, &in->d, bq, bk, bv, bo1, bl1, 0, NULL);
        char message[300];
        snprintf(message, sizeof message, "natural: %s", s1 ? flashcl_last_error(ctx) : "ok");
        const flashcl_status s2 =
            flashcl_attention_forward(ctx, &in->dp, bq, bk, bp, bo2, bl2, 0, NULL);
        if (s2)
            snprintf(message + strlen(message), sizeof message - strlen(message), "; packed: %s",
                     flashcl_last_error(ctx));
        use_variant(NULL);
        test_download(ctx, bo1, o1, in->out_bytes), test_download(ctx, bo2, o2, in->out_bytes);
        test_download(ctx, bl1, l1, in->n_lse * 4), test_download(ctx, bl2, l2, in->n_lse * 4);
        char what[320];
        snprintf(what, sizeof what, "device %s forward %s", variants[i] ? variants[i] : "default",
                 name);
        expect_same(what, in, s1, s2, o1, o2, l1, l2, message);
        clReleaseMemObject(bo1), clReleaseMemObject(bo2);
        clReleaseMemObject(bl1), clReleaseMemObject(bl2);
    }
    free(o1), free(o2), free(l1), free(l2);
    clReleaseMemObject(bq), clReleaseMemObject(bk), clReleaseMemObject(bv), clReleaseMemObject(bp);
}

static const fwd_case fwd_cases[] = {
    /* format, out, B, Hq, Hk, Nq, Nk, D, causal, v layout, factors, packed offset, junk strides */
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT32, 2, 4, 2, 37, 129, 64, 1, V_BHSD, 0, 48, JUNK_ZERO},
    {FLASHCL_FLOAT8_E5M2, FLASHCL_FLOAT16, 1, 2, 1, 50, 300, 128, 0, V_PACKED, 32, 0, JUNK_BHSD},
    {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT16, 2, 6, 3, 1, 127, 80, 1, V_PADDED, 0, 16,
     JUNK_BHSD}, /* decode */
    {FLASHCL_FLOAT8_E5M2, FLASHCL_FLOAT32, 1, 2, 2, 19, 1, 48, 0, V_PACKED, -1, 4096,
     JUNK_HUGE}, /* one key */
    {FLASHCL_FLOAT8_E4M3, FLASHCL_BFLOAT16, 1, 4, 2, 130, 128, 16, 1, V_BHSD, 16, 0, JUNK_ZERO},
};
#define FWD_CASES (sizeof fwd_cases / sizeof fwd_cases[0])

/* Each case on the host context, and where dev is an OpenCL context on its default kernel and
 * the FP8 kernels it also has (cpu and portable), on buffers and through host pointers. */
static void forward_checks(flashcl_context *dev, flashcl_context *host, const fwd_case *cases,
                           size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; ++i) {
        fwd_inputs in;
        char name[240];
        describe(name, sizeof name, &cases[i]);
        if (!make_inputs(&cases[i], seed + 1000003u * (uint64_t)i, &in)) {
            free_inputs(&in);
            continue;
        }
        if (host)
            host_pointer_pair(host, "host", &in, name);
        if (dev) {
            /* the default kernel, then those of cpu and portable it is not */
            const char *variants[3] = {NULL, NULL, NULL};
            int nv = 1;
            flashcl_params p;
            const int have = flashcl_attention_params(dev, &in.d, &p) == FLASHCL_SUCCESS;
            if (!have || strcmp(p.variant, "cpu"))
                variants[nv++] = "cpu";
            if (!have || strcmp(p.variant, "portable"))
                variants[nv++] = "portable";
            device_pairs(dev, variants, nv, &in, name);
            host_pointer_pair(dev, "device", &in, name);
        }
        free_inputs(&in);
    }
}

/* Packed Vs forwarded back to back, `rounds` times, with no wait between the calls of a round
 * (each pack and forward enqueued while the forwards before may still run): two of one shape,
 * then one of a larger shape, each out against the forward of its own natural V, computed
 * before; out_dtype out, on kernel `variant` (NULL: the context's choice). Off the Hopper kernel a
 * packed V is unpacked into the context's scratch buffer, which the calls share: a later unpack
 * must not overwrite it under an earlier forward. The third call needs more scratch than any
 * call before it on these contexts (81920 bytes; forward_checks' largest is 60960), so in the
 * first round the scratch is reallocated while the calls before may still read the old one: that
 * it grew there is checked where the kernel unpacks (the Hopper kernel reads a packed V as it
 * is). Many queries over few keys first, so that those forwards run long beside the next pack
 * and unpack. */
static void back_to_back(flashcl_context *ctx, const char *where, flashcl_dtype out_dtype,
                         const char *variant, int rounds, uint64_t seed) {
    enum { CALLS = 3 };
    /* format, out, B, Hq, Hk, Nq, Nk, D, causal, v layout, factors, packed offset, junk strides */
    const fwd_case
        small =
            {FLASHCL_FLOAT8_E4M3, out_dtype, 1, 4, 2, 512, 256, 64, 0, V_PACKED, 0, 16, JUNK_ZERO},
        large = {
            FLASHCL_FLOAT8_E4M3, out_dtype, 1, 4, 2, 128, 640, 64, 1, V_PACKED, 0, 32, JUNK_ZERO};
    const fwd_case *cases[CALLS] = {&small, &small, &large};
    const int hopper_kernel = variant && !strcmp(variant, "nv-wgmma-fp8");
    fwd_inputs in[CALLS];
    int made = 0;
    while (made < CALLS && make_inputs(cases[made], seed + (uint64_t)made, &in[made]))
        ++made;
    if (made < CALLS) {
        for (int t = 0; t <= made; ++t)
            free_inputs(&in[t]);
        return;
    }
    /* The same factors (per head: the same count at either shape), so that the calls differ in
     * q, k and V alone and the factor upload is skipped after the first. */
    for (int t = 1; t < CALLS; ++t)
        in[t].d.fp8 = in[0].d.fp8, in[t].dp.fp8 = in[0].dp.fp8;
    void *want[CALLS], *got[CALLS];
    cl_mem bq[CALLS], bk[CALLS], bv[CALLS], bp[CALLS], bo[CALLS];
    size_t written[CALLS];
    flashcl_status st = FLASHCL_SUCCESS;
    use_variant(variant);
    for (int t = 0; t < CALLS; ++t) { /* the natural forwards, one at a time */
        const size_t ob = in[t].out_bytes;
        want[t] = test_xmalloc(ob), got[t] = test_xmalloc(ob);
        flashcl_ref_poison(want[t], out_dtype, in[t].n_out);
        bq[t] = test_upload(ctx, in[t].q, in[t].nq), bk[t] = test_upload(ctx, in[t].k, in[t].nk);
        bv[t] = test_upload(ctx, in[t].v, in[t].nv);
        bp[t] = poisoned_buffer(ctx, in[t].vp_bytes, 0x7f);
        bo[t] = test_upload(ctx, want[t], ob);
        if (st == FLASHCL_SUCCESS)
            st =
                flashcl_attention_forward(ctx, &in[t].d, bq[t], bk[t], bv[t], bo[t], NULL, 0, NULL);
        clFinish(flashcl_context_cl_queue(ctx));
        test_download(ctx, bo[t], want[t], ob);
        written[t] = 0;
        for (size_t i = 0; i < in[t].n_out; ++i)
            written[t] += !isnan(flashcl_ref_load(want[t], out_dtype, i));
    }
    int bad[CALLS] = {0, 0, 0};
    size_t scratch_before = ctx->fp8_vt_bytes, scratch_after = scratch_before;
    for (int round = 0; round < rounds && st == FLASHCL_SUCCESS; ++round) {
        for (int t = 0; t < CALLS; ++t) {
            flashcl_ref_poison(got[t], out_dtype, in[t].n_out);
            clEnqueueWriteBuffer(flashcl_context_cl_queue(ctx), bo[t], CL_TRUE, 0, in[t].out_bytes,
                                 got[t], 0, NULL, NULL);
        }
        /* pack, forward, pack, forward, pack, forward */
        for (int t = 0; t < CALLS && st == FLASHCL_SUCCESS; ++t) {
            cl_event packed = NULL;
            st = flashcl_fp8_pack_v(ctx, &in[t].d, bv[t], bp[t], in[t].dp.v.offset, &packed);
            if (st == FLASHCL_SUCCESS) {
                /* an out-of-order queue orders the forward after its pack only by the event */
                const cl_int err =
                    clEnqueueBarrierWithWaitList(flashcl_context_cl_queue(ctx), 1, &packed, NULL);
                st = err == CL_SUCCESS ? flashcl_attention_forward(ctx, &in[t].dp, bq[t], bk[t],
                                                                   bp[t], bo[t], NULL, 0, NULL)
                                       : err;
            }
            if (packed)
                clReleaseEvent(packed);
        }
        if (round == 0)
            scratch_after = ctx->fp8_vt_bytes;
        clFinish(flashcl_context_cl_queue(ctx));
        for (int t = 0; t < CALLS && st == FLASHCL_SUCCESS; ++t) {
            test_download(ctx, bo[t], got[t], in[t].out_bytes);
            bad[t] += memcmp(want[t], got[t], in[t].out_bytes) != 0;
        }
    }
    use_variant(NULL);
    const char *message = st ? flashcl_last_error(ctx) : "";
    for (int t = 0; t < CALLS; ++t) {
        char what[400], name[240];
        describe(name, sizeof name, cases[t]);
        snprintf(what, sizeof what,
                 "%s: packed V %d of %d back to back (%s) equals its natural forward in %d of %d "
                 "rounds (%s%s%s; natural %zu of %zu written)",
                 where, t + 1, CALLS, name, rounds - bad[t], rounds, flashcl_status_string(st),
                 st ? ": " : "", message, written[t], in[t].n_out);
        expect(st == FLASHCL_SUCCESS && !bad[t] && written[t] == in[t].n_out, what, &failures);
        clReleaseMemObject(bq[t]), clReleaseMemObject(bk[t]), clReleaseMemObject(bv[t]);
        clReleaseMemObject(bp[t]), clReleaseMemObject(bo[t]);
        free(want[t]), free(got[t]), free_inputs(&in[t]);
    }
    if (!hopper_kernel && st == FLASHCL_SUCCESS) {
        char what[300];
        snprintf(what, sizeof what,
                 "%s: the context's V scratch grew in the first round (%zu bytes before it, %zu "
                 "after), under the calls before the larger one",
                 where, scratch_before, scratch_after);
        expect(scratch_after > scratch_before, what, &failures);
    }
}

/* ---- 3. refusals ----------------------------------------------------------------------------- */

/* A forward that must fail with `want` and write nothing, through flashcl_attention_forward
 * (device context: buffers, the packed V buffer vp_bytes long) and flashcl_attention_forward_host;
 * `desc_error` (a fault of the desc alone): flashcl_attention_desc_resolve reports it too. */
static void refuse_forward(flashcl_context *ctx, const flashcl_attention_desc *d, size_t vp_bytes,
                           flashcl_status want, int desc_error, const char *needle,
                           const char *what) {
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

static void refusals(flashcl_context *dev, flashcl_context *host) {
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

/* ---- 4. the Hopper FP8 kernel ---------------------------------------------------------------- */

static int is_hopper(const flashcl_context *ctx) {
    return !flashcl_context_is_host(ctx) && ctx->info.is_nvidia && ctx->info.nv_cc_major == 9 &&
           ctx->info.nv_cc_minor == 0;
}

/* A copy of environment variable `name` (NULL: unset), for restore_env. */
static char *save_env(const char *name) {
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

static void restore_env(const char *name, char *saved) {
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}

/* On a context that has run no FP8 forward with natural V: a packed forward on nv-wgmma-fp8
 * (finished) leaves ctx->fp8_vt, the scratch of the per-call transpose, unallocated: the kernel
 * read the packed V as it is. Then a natural forward allocates it (the check can fail), and the
 * two agree bit for bit. */
static void wgmma_no_transpose(flashcl_context *ctx, const char *where, uint64_t seed) {
    /* format, out, B, Hq, Hk, Nq, Nk, D, causal, v layout, factors, packed offset, junk strides */
    const fwd_case c = {
        FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT16, 1, 4, 2, 256, 300, 64, 0, V_BHSD, 0, 32, JUNK_ZERO};
    fwd_inputs in;
    char what[400];
    if (!make_inputs(&c, seed, &in)) {
        free_inputs(&in);
        return;
    }
    snprintf(what, sizeof what, "%s: a fresh context has no V scratch yet (%zu bytes)", where,
             ctx->fp8_vt_bytes);
    expect(!ctx->fp8_vt, what, &failures);
    cl_mem bq = test_upload(ctx, in.q, in.nq), bk = test_upload(ctx, in.k, in.nk),
           bv = test_upload(ctx, in.v, in.nv), bp = poisoned_buffer(ctx, in.vp_bytes, 0x7f);
    void *o1 = test_xmalloc(in.out_bytes), *o2 = test_xmalloc(in.out_bytes);
    float *l1 = test_xmalloc(in.n_lse * 4), *l2 = test_xmalloc(in.n_lse * 4);
    flashcl_ref_poison(o1, in.d.out_dtype, in.n_out);
    flashcl_ref_poison(l1, FLASHCL_FLOAT32, in.n_lse);
    cl_mem bo1 = test_upload(ctx, o1, in.out_bytes), bo2 = test_upload(ctx, o1, in.out_bytes);
    cl_mem bl1 = test_upload(ctx, l1, in.n_lse * 4), bl2 = test_upload(ctx, l1, in.n_lse * 4);
    char message[400] = "";
    const flashcl_status sp = flashcl_fp8_pack_v(ctx, &in.d, bv, bp, in.dp.v.offset, NULL);
    if (sp)
        snprintf(message, sizeof message, "pack: %s", flashcl_last_error(ctx));
    use_variant("nv-wgmma-fp8");
    const flashcl_status s2 =
        sp ? sp : flashcl_attention_forward(ctx, &in.dp, bq, bk, bp, bo2, bl2, 0, NULL);
    if (!sp && s2)
        snprintf(message, sizeof message, "packed: %s", flashcl_last_error(ctx));
    clFinish(flashcl_context_cl_queue(ctx));
    const int scratch_after_packed = ctx->fp8_vt != NULL;
    const flashcl_status s1 = flashcl_attention_forward(ctx, &in.d, bq, bk, bv, bo1, bl1, 0, NULL);
    if (s1)
        snprintf(message + strlen(message), sizeof message - strlen(message), "; natural: %s",
                 flashcl_last_error(ctx));
    clFinish(flashcl_context_cl_queue(ctx));
    use_variant(NULL);
    snprintf(what, sizeof what,
             "%s: a packed nv-wgmma-fp8 forward (%s) runs no transpose (ctx->fp8_vt %s after it)",
             where, flashcl_status_string(s2), scratch_after_packed ? "ALLOCATED" : "still NULL");
    expect(s2 == FLASHCL_SUCCESS && !scratch_after_packed, what, &failures);
    snprintf(what, sizeof what,
             "%s: a natural-V nv-wgmma-fp8 forward (%s) transposes into ctx->fp8_vt (%zu bytes)",
             where, flashcl_status_string(s1), ctx->fp8_vt_bytes);
    expect(s1 == FLASHCL_SUCCESS && ctx->fp8_vt != NULL, what, &failures);
    test_download(ctx, bo1, o1, in.out_bytes), test_download(ctx, bo2, o2, in.out_bytes);
    test_download(ctx, bl1, l1, in.n_lse * 4), test_download(ctx, bl2, l2, in.n_lse * 4);
    char name[240];
    describe(name, sizeof name, &c);
    snprintf(what, sizeof what, "%s: device nv-wgmma-fp8 forward, packed first, %s", where, name);
    expect_same(what, &in, s1, s2, o1, o2, l1, l2, message);
    clReleaseMemObject(bo1), clReleaseMemObject(bo2), clReleaseMemObject(bl1);
    clReleaseMemObject(bl2), clReleaseMemObject(bq), clReleaseMemObject(bk);
    clReleaseMemObject(bv), clReleaseMemObject(bp);
    free(o1), free(o2), free(l1), free(l2), free_inputs(&in);
}

/* nv-wgmma-fp8 forced on ctx, packed against natural V: D 32..128 by 32 (32 and 96 pad a 64-dim
 * panel with zeros), 300 and 1000 keys and queries, causal or not, f16 out. */
static void wgmma_pairs(flashcl_context *ctx, const char *where, uint64_t seed) {
    const char *const wgmma[1] = {"nv-wgmma-fp8"};
    int i = 0;
    for (int D = 32; D <= 128; D += 32)
        for (int N = 300; N <= 1000; N += 700)
            for (int causal = 0; causal < 2; ++causal, ++i) {
                /* e4m3 and e5m2, per-head and 64-row block factors, packed offsets 0..48 and
                 * every kind of junk strides, in turn */
                fwd_case c;
                memset(&c, 0, sizeof c);
                c.format = i % 2 ? FLASHCL_FLOAT8_E5M2 : FLASHCL_FLOAT8_E4M3;
                c.out_dtype = FLASHCL_FLOAT16;
                c.batch = 1, c.heads_q = 4, c.heads_k = 2, c.seqlen_q = c.seqlen_k = N;
                c.head_dim = D, c.causal = causal, c.v_layout = V_PACKED;
                c.factors = i % 3 == 2 ? 64 : 0;
                c.offset = (size_t)(i % 4) * 16;
                c.junk = i % 3;
                fwd_inputs in;
                char name[300];
                snprintf(name, sizeof name, "[%s] ", where);
                describe(name + strlen(name), sizeof name - strlen(name), &c);
                if (make_inputs(&c, seed + 7919u * (uint64_t)i, &in))
                    device_pairs(ctx, wgmma, 1, &in, name);
                free_inputs(&in);
            }
}

/* nv-wgmma-fp8 forced: it reads a packed V as it is, and natural V after transposing it into
 * the context's buffer; the same bytes, so the same results bit for bit. On two fresh contexts,
 * TMA copies as the library chooses, then FLASHCL_TMA=0 (read by each forward, flashcl_tma_usable;
 * the context is fresh all the same, and the variable restored after): first that a packed
 * forward runs no transpose, then the pairs. Then back to back on ctx, f16 out, in order and on an
 * out-of-order queue (which takes no TMA). Off compute capability 9.0: forcing it on a packed V is
 * refused and writes nothing. */
static void wgmma_checks(flashcl_context *ctx, uint64_t seed) {
    if (!is_hopper(ctx)) {
        flashcl_attention_desc d = test_attention_desc(FLASHCL_FLOAT8_E4M3, 1, 2, 2, 64, 64, 64);
        d.out_dtype = FLASHCL_FLOAT16;
        d.v_packed = 1;
        const size_t bytes = flashcl_fp8_packed_v_bytes(&d);
        use_variant("nv-wgmma-fp8");
        refuse_forward(
            ctx, &d, bytes, FLASHCL_ERROR_INVALID_PARAMS, 0, "nv-wgmma-fp8",
            "FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8 with a packed V off compute capability 9.0");
        use_variant(NULL);
        return;
    }
    flashcl_attention_desc probe = test_attention_desc(FLASHCL_FLOAT8_E4M3, 1, 4, 2, 300, 300, 64);
    probe.out_dtype = FLASHCL_FLOAT16;
    flashcl_params p;
    use_variant("nv-wgmma-fp8");
    const flashcl_status applies = flashcl_attention_params(ctx, &probe, &p);
    use_variant(NULL);
    expect(applies == FLASHCL_SUCCESS && !strcmp(p.variant, "nv-wgmma-fp8"),
           "device: compute capability 9.0 takes FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8", &failures);
    if (applies != FLASHCL_SUCCESS)
        return;
    for (int tma_off = 0; tma_off < 2; ++tma_off) {
        const char *where = tma_off ? "FLASHCL_TMA=0" : "TMA as chosen";
        char *saved = save_env("FLASHCL_TMA");
        if (tma_off)
            setenv("FLASHCL_TMA", "0", 1);
        flashcl_context *fresh = test_context();
        wgmma_no_transpose(fresh, where, seed + 101u * (uint64_t)tma_off);
        wgmma_pairs(fresh, where, seed + 7u * (uint64_t)tma_off);
        if (tma_off)
            expect(!fresh->tma_slots,
                   "FLASHCL_TMA=0: no forward copied by TMA (no tensor-map slots allocated)",
                   &failures);
        else
            printf("TMA as chosen: the nv-wgmma-fp8 forwards %s by TMA\n",
                   fresh->tma_slots ? "copied" : "did NOT copy (no CUDA driver encoder?)");
        flashcl_context_destroy(fresh);
        restore_env("FLASHCL_TMA", saved);
    }
    back_to_back(ctx, "nv-wgmma-fp8, f16 out, in-order queue", FLASHCL_FLOAT16, "nv-wgmma-fp8", 4,
                 seed + 13);
    cl_command_queue qq;
    flashcl_context *ooo =
        test_out_of_order_context(ctx, "nv-wgmma-fp8 back to back on an out-of-order queue", &qq);
    if (ooo) {
        back_to_back(ooo, "nv-wgmma-fp8, f16 out, out-of-order queue", FLASHCL_FLOAT16,
                     "nv-wgmma-fp8", 32, seed + 17);
        flashcl_context_destroy(ooo);
        clReleaseCommandQueue(qq);
    }
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    const uint64_t seed = test_seed();
    flashcl_context *ctx = test_context();
    flashcl_context *dev = flashcl_context_is_host(ctx) ? NULL : ctx;
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "oclgrind")) {
        /* the device pack, and its unpack by the forward on both kernels, at tiny shapes */
        static const fwd_case tiny[] = {
            {FLASHCL_FLOAT8_E4M3, FLASHCL_FLOAT32, 1, 2, 1, 5, 9, 16, 1, V_BHSD, 0, 16, 0},
        };
        if (dev) {
            pack_case(dev, FLASHCL_FLOAT8_E4M3, 1, 2, 130, 48, V_PADDED, 16, seed);
            forward_checks(dev, NULL, tiny, 1, seed + 1);
        }
        flashcl_context_destroy(ctx);
        return test_summary(failures);
    }
    if (!strcmp(mode, "wgmma")) {
        if (dev && is_hopper(dev))
            pack_checks(dev, seed);
        if (dev)
            wgmma_checks(dev, seed + 31);
        else
            printf("no OpenCL device: nothing to check in mode wgmma\n");
        flashcl_context_destroy(ctx);
        return test_summary(failures);
    }
    flashcl_context *host = NULL;
    if (flashcl_context_create(&host, "host") != FLASHCL_SUCCESS) {
        printf("cannot create a host context: %s\n", flashcl_last_error(NULL));
        return 1;
    }
    pack_checks(dev, seed);
    forward_checks(dev, host, fwd_cases, FWD_CASES, seed + 11);
    if (dev) {
        back_to_back(dev, "in-order queue", FLASHCL_FLOAT32, NULL, 1, seed + 13);
        cl_command_queue qq;
        flashcl_context *ooo =
            test_out_of_order_context(dev, "packed V back to back on an out-of-order queue", &qq);
        if (ooo) {
            /* many rounds: a race shows only sometimes */
            back_to_back(ooo, "out-of-order queue", FLASHCL_FLOAT32, NULL, 32, seed + 17);
            flashcl_context_destroy(ooo);
            clReleaseCommandQueue(qq);
        }
        if (is_hopper(dev))
            wgmma_checks(dev, seed + 31);
    } else {
        printf("no OpenCL device: the device pack and kernels are not checked\n");
    }
    refusals(dev, host);
    flashcl_context_destroy(host);
    flashcl_context_destroy(ctx);
    return test_summary(failures);
}
