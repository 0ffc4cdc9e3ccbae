/* test_fp8_packed_v.c: FP8 V packed for the Hopper FP8 forward (desc.v_packed, flashcl_fp8_pack_v):
 * the layout's reference, the helpers, checks 1 and 2, and main. One program of three sources,
 * split by what they check when this file passed 1,200 lines: the refusals (3) are in
 * test_fp8_packed_v_refusals.c, the Hopper FP8 kernel's checks (argument "wgmma") in
 * test_fp8_packed_v_wgmma.c; test_fp8_packed_v.h declares what the three share.
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
 * 3. Refusals, outputs and packed buffers untouched: of the packed forward, both packs and the
 *    size query, for float16 V, misaligned offsets, head dims off the packed layout, short
 *    buffers, a host context and key counts past the packed layout's
 *    (test_fp8_packed_v_refusals.c).
 * Argument "wgmma" (FLASHCL_TEST_DEVICE=nvidia): on compute capability 9.0 the pack checks (1)
 * on the GPU, then the forward on nv-wgmma-fp8 forced against natural V; elsewhere, that forcing
 * that kernel on a packed V is refused (test_fp8_packed_v_wgmma.c). The default run checks that
 * kernel too on compute capability 9.0. "oclgrind": tiny shapes of the device pack and of a packed
 * forward on both kernels (ctest -L oclgrind).
 * FLASHCL_TEST_SEED replays a run.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcl.h"
#include "flashcl_ref.h"
#include "harness.h"
#include "internal.h" /* the context's V scratch, which back_to_back watches grow */
#include "test_fp8_packed_v.h"

int failures; /* every check's, in the three files (expect's counter) */

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

size_t packed_rows(int head_dim) {
    return (size_t)(head_dim + 63) / 64 * 64;
}
size_t packed_keys(int seqlen_k) {
    return (size_t)(seqlen_k + 127) / 128 * 128;
}

/* The names of the V layouts the cases use (V_*, test_fp8_packed_v.h). */
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
void use_variant(const char *variant) {
    char env[64];
    if (!variant) {
        unsetenv("FLASHCL_PARAMS");
        return;
    }
    snprintf(env, sizeof env, "VARIANT=%s", variant);
    setenv("FLASHCL_PARAMS", env, 1);
}

/* A device buffer of `bytes` holding `poison` in every byte. */
cl_mem poisoned_buffer(flashcl_context *ctx, size_t bytes, unsigned char poison) {
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

int all_bytes(const unsigned char *p, size_t n, unsigned char value) {
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

/* A case's shape (fwd_case) and its inputs (fwd_inputs): test_fp8_packed_v.h. */

void describe(char *buf, size_t cap, const fwd_case *c) {
    static const char *const junk[] = {"", " (huge strides)", " (bhsd strides)"};
    snprintf(buf, cap, "%s->%s B%d Hq%d Hk%d %dx%d D%d%s, v %s, packed at %zu%s",
             dtype_name(c->format), dtype_name(c->out_dtype), c->batch, c->heads_q, c->heads_k,
             c->seqlen_q, c->seqlen_k, c->head_dim, c->causal ? " causal" : "",
             v_layout_name[c->v_layout], c->offset, junk[c->junk]);
}

/* Fresh inputs for c; returns 0 (after a failed line) when the host pack refused them. */
int make_inputs(const fwd_case *c, uint64_t seed, fwd_inputs *in) {
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

void free_inputs(fwd_inputs *in) {
    free(in->q), free(in->k), free(in->v), free(in->vp);
    for (int t = 0; t < 3; ++t)
        free(in->factors[t]);
}

/* A natural result and a packed one: both calls succeeded, every output element of the natural
 * one written (the poison is NaN: no call that wrote nothing passes as equal), and out and lse
 * bitwise equal. */
void expect_same(const char *what, const fwd_inputs *in, flashcl_status s1, flashcl_status s2,
                 const void *o1, const void *o2, const float *l1, const float *l2,
                 const char *message) {
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
void device_pairs(flashcl_context *ctx, const char *const *variants, int n_variants,
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
        const int refused1 = test_cpu_refused_on_rusticl(ctx, variants[i], s1);
        char message[300];
        snprintf(message, sizeof message, "natural: %s", s1 ? flashcl_last_error(ctx) : "ok");
        const flashcl_status s2 =
            flashcl_attention_forward(ctx, &in->dp, bq, bk, bp, bo2, bl2, 0, NULL);
        const int refused = refused1 && test_cpu_refused_on_rusticl(ctx, variants[i], s2);
        if (s2)
            snprintf(message + strlen(message), sizeof message - strlen(message), "; packed: %s",
                     flashcl_last_error(ctx));
        use_variant(NULL);
        test_download(ctx, bo1, o1, in->out_bytes), test_download(ctx, bo2, o2, in->out_bytes);
        test_download(ctx, bl1, l1, in->n_lse * 4), test_download(ctx, bl2, l2, in->n_lse * 4);
        char what[320];
        snprintf(what, sizeof what, "device %s forward %s", variants[i] ? variants[i] : "default",
                 name);
        if (refused) { /* both refused there by design: nothing written either way */
            size_t written = 0;
            for (size_t j = 0; j < in->n_out; ++j)
                written += !isnan(flashcl_ref_load(o1, in->d.out_dtype, j)) +
                           !isnan(flashcl_ref_load(o2, in->d.out_dtype, j));
            for (size_t j = 0; j < in->n_lse; ++j)
                written += !isnan(l1[j]) + !isnan(l2[j]);
            strncat(what, ": refused on rusticl, natural and packed, nothing written",
                    sizeof what - strlen(what) - 1);
            expect(written == 0, what, &failures);
        } else
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
void back_to_back(flashcl_context *ctx, const char *where, flashcl_dtype out_dtype,
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
