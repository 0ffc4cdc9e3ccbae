/* test_forward.c: the forward kernel against host_ref over flash-attn's shape list.
 *
 * `test_forward quick` covers every head dim, every (Nq, Nk) pair, every
 * dtype, mask, layout and GQA ratio at least once; `test_forward sweep` takes
 * the full cross product (CTest label "long"); `test_forward mma`, `tf32`
 * and `wgmma` force the NVIDIA tensor-core kernels' tile shapes (GPU only). Inputs are
 * fresh each run (FLASHCL_TEST_SEED replays one). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const int head_dims[] = {32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256};
static const int seqlens[][2] = {{1, 239},    {3, 799},    {113, 203},  {127, 513},   {128, 217},
                                 {108, 256},  {256, 512},  {512, 256},  {1023, 1024}, {1024, 1023}};
#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

static int failures, cases;

static void run(flashcl_context *ctx, test_case tc) {
    ++cases;
    if (!run_case(ctx, &tc, test_seed() + (uint64_t)cases * 7919u, 0))
        ++failures;
}

/* Mesa's rusticl ends a kernel's loops after 65535 iterations: a row longer
 * than one work-item may walk is refused there, never summed in part. */
static void loop_limit(flashcl_context *ctx) {
    if (!strstr(flashcl_context_device_name(ctx), "rusticl"))
        return;
    test_case tc = test_case_basic(FLASHCL_FLOAT32, 4096, 4096, 128);
    flashcl_attention_desc d;
    size_t elems[4];
    case_desc(&tc, &d, elems);
    float *q = calloc(elems[0], 4), *k = calloc(elems[1], 4), *v = calloc(elems[2], 4);
    float *out = malloc(elems[3] * 4);
    memset(out, 0x7f, elems[3] * 4);
    const unsigned char first = ((unsigned char *)out)[0];
    flashcl_status st = flashcl_attention_forward_host(ctx, &d, q, k, v, out, NULL);
    ++cases;
    if (st != FLASHCL_ERROR_INVALID_PARAMS || !strstr(flashcl_last_error(ctx), "65535") ||
        ((unsigned char *)out)[0] != first) {
        ++failures;
        printf("rusticl: 4096 keys at D=128 not refused (%d: %s) FAILED\n", (int)st, flashcl_last_error(ctx));
    } else {
        printf("rusticl: rows of 4096 keys at D=128 refused, output untouched ok\n");
    }
    free(q), free(k), free(v), free(out);
}

/* Huge finite scores, on the device's own kernel and the portable one: one
 * key and several tiles, the hot key first and last (the max set early or
 * late). The portable kernel through FLASHCL_PARAMS=VARIANT=portable (harness.c). */
static void huge_scores(flashcl_context *ctx) {
    const float huge[] = {1e10f, 3e10f, 1e30f, 2e38f};
    for (int portable = 0; portable < 2; ++portable)
        for (int i = 0; i < COUNT(huge); ++i) {
            const int shapes[][3] = {{2, 0, 1}, {300, 0, 64}, {300, 250, 64}, {77, 76, 128}};
            for (int c = 0; c < COUNT(shapes); ++c) {
                ++cases;
                if (!run_huge_scores(ctx, huge[i], shapes[c][0], shapes[c][1], shapes[c][2], portable))
                    ++failures;
            }
        }
}

#if defined(FLASHCL_SOURCE_CL_DIR) && defined(FLASHCL_SOURCE_TEST_DIR)
/* MASK_16 (cl/common_nv.cl), the mask of every NVIDIA tensor-core forward,
 * on this device through tests/mask_probe.cl against the rule it encodes:
 * key n0 + 8j + 2t + (e & 1) is -inf exactly where it lies outside row h =
 * e >> 1's [lo, hi]. Random tiles whose rows' ranges start, end, or are empty
 * around the tile, both ways of the with_lo flag (0 only where every row's
 * lo is at most n0, as the kernels pass it). The macro is pure arithmetic,
 * so any OpenCL device checks what NVIDIA's compiler builds from it. */
static void nv_mask(flashcl_context *ctx) {
    enum { N = 20000, PER = 7 };
    int *c = test_xmalloc((size_t)N * PER * sizeof(int));
    cl_uint *got = test_xmalloc((size_t)N * 3 * sizeof(cl_uint));
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, test_seed() ^ 0x6d61736bu);
#define PICK(lo_, n_) ((lo_) + (int)(flashcl_ref_rng_next(&rng) % (uint64_t)(n_)))
    for (int i = 0; i < N; ++i) {
        int *x = c + PER * i;
        x[0] = PICK(0, 4) == 0 ? PICK(0, 5000) : 128 * PICK(0, 40); /* n0 */
        x[1] = PICK(0, 4);                                          /* t */
        x[6] = PICK(0, 2);                                          /* with_lo */
        for (int h = 0; h < 2; ++h) {
            int lo = x[0] + PICK(-140, 280), hi = lo + PICK(-1, 200);
            if (PICK(0, 8) == 0) /* a row that sees nothing: NV_FRAG_KEYS' [nk, -1] */
                lo = x[0] + PICK(0, 300), hi = -1;
            if (!x[6] && lo > x[0])
                lo = x[0] - PICK(0, 3);
            x[2 + h] = lo < 0 ? 0 : lo, x[4 + h] = hi;
        }
    }
#undef PICK
    memset(got, 0xA5, (size_t)N * 3 * sizeof(cl_uint)); /* poison: no case gives every bit and a count */
    const cl_int err = test_run_probe(ctx, FLASHCL_SOURCE_CL_DIR, FLASHCL_SOURCE_TEST_DIR, "mask_probe.cl", "mask_probe",
                                      c, (size_t)N * PER * sizeof(int), got, (size_t)N * 3 * sizeof(cl_uint), N);
    int bad = 0, first = -1, masked = 0;
    for (int i = 0; i < N; ++i) {
        const int *x = c + PER * i;
        cl_uint want[2] = {0u, 0u};
        for (int j = 0; j < 16; ++j)
            for (int e = 0; e < 4; ++e) {
                const int key = x[0] + 8 * j + 2 * x[1] + (e & 1), h = e >> 1;
                if (key < x[2 + h] || key > x[4 + h])
                    want[j >> 3] |= 1u << (4 * (j & 7) + e);
            }
        masked += want[0] != 0u || want[1] != 0u;
        const int ok = got[3 * i] == want[0] && got[3 * i + 1] == want[1] && got[3 * i + 2] == 0u;
        if (!ok && first < 0)
            first = i;
        bad += !ok;
    }
    char what[240];
    if (first >= 0) {
        const int *x = c + PER * first;
        snprintf(what, sizeof what,
                 "MASK_16 on the device: %d of %d tiles wrong; first n0 %d t %d lo %d,%d hi %d,%d with_lo %d%s", bad, N,
                 x[0], x[1], x[2], x[3], x[4], x[5], x[6], err == CL_SUCCESS ? "" : " (did not run)");
    } else
        snprintf(what, sizeof what, "MASK_16 on the device: %d tiles (%d with a masked key), all right", N, masked);
    ++cases;
    expect(err == CL_SUCCESS && bad == 0, what, &failures);
    free(c), free(got);
}
#endif

static void quick(flashcl_context *ctx) {
    loop_limit(ctx);
    /* Every head dim, rotating dtype, shape and causality. */
    for (int i = 0; i < COUNT(head_dims); ++i) {
        const int *s = seqlens[i % COUNT(seqlens)];
        test_case tc = test_case_basic((flashcl_dtype)(i % 3), s[0] > 512 ? 200 : s[0], s[1] > 512 ? 300 : s[1],
                            head_dims[i]);
        tc.causal = i & 1;
        run(ctx, tc);
    }
    /* Every (Nq, Nk) pair, causal both ways round. */
    for (int i = 0; i < COUNT(seqlens); ++i)
        for (int causal = 0; causal < 2; ++causal) {
            test_case tc = test_case_basic(FLASHCL_FLOAT16, seqlens[i][0], seqlens[i][1], 64);
            tc.causal = causal;
            run(ctx, tc);
        }
    /* Every dtype on a batched GQA shape; windows; soft-cap. */
    for (int dt = 0; dt < 3; ++dt) {
        test_case tc = test_case_basic((flashcl_dtype)dt, 77, 131, 59);
        tc.batch = 2;
        tc.heads_q = 6;
        tc.heads_k = 2;
        run(ctx, tc);
        tc.window_left = 17;
        tc.window_right = 5;
        run(ctx, tc);
        tc.window_right = -1;
        tc.causal = 1;
        run(ctx, tc);
        tc = test_case_basic((flashcl_dtype)dt, 64, 96, 128);
        tc.softcap = 30.0f;
        tc.input_scale = 4.0;
        run(ctx, tc);
    }
    /* MQA and MHA, layouts, explicit scale. */
    test_case tc = test_case_basic(FLASHCL_FLOAT32, 45, 45, 96);
    tc.heads_q = 8;
    tc.heads_k = 1;
    tc.causal = 1;
    run(ctx, tc);
    tc.layout = LAYOUT_BHSD;
    tc.heads_k = 8;
    run(ctx, tc);
    tc.layout = LAYOUT_PADDED;
    tc.dtype = FLASHCL_FLOAT16;
    tc.scale = 0.3f;
    run(ctx, tc);
    tc.layout = LAYOUT_PADDED;
    tc.dtype = FLASHCL_BFLOAT16;
    tc.heads_k = 2;
    tc.causal = 0;
    tc.window_left = 0;
    tc.window_right = 0;
    run(ctx, tc);
    /* Fully masked rows: Nq > Nk with causal leaves the first Nq - Nk rows
     * without keys; a left window of 0 and right of 0 with Nq > Nk too. */
    tc = test_case_basic(FLASHCL_FLOAT16, 200, 37, 64);
    tc.causal = 1;
    run(ctx, tc);
    tc.dtype = FLASHCL_FLOAT32;
    tc.window_left = 3;
    run(ctx, tc);
    /* Large-magnitude scores: exp must not overflow. */
    for (int dt = 0; dt < 3; ++dt) {
        tc = test_case_basic((flashcl_dtype)dt, 33, 257, 64);
        tc.input_scale = 20.0;
        run(ctx, tc);
    }
    /* Tiny shapes: one query, one key, head_dim 1. */
    tc = test_case_basic(FLASHCL_FLOAT32, 1, 1, 1);
    run(ctx, tc);
    tc = test_case_basic(FLASHCL_FLOAT16, 5, 3, 7);
    tc.causal = 1;
    run(ctx, tc);
    huge_scores(ctx);
#if defined(FLASHCL_SOURCE_CL_DIR) && defined(FLASHCL_SOURCE_TEST_DIR)
    if (!flashcl_context_is_host(ctx) && !getenv("FLASHCL_TEST_VARIANT")) /* once a device */
        nv_mask(ctx);
#endif
}

static void sweep(flashcl_context *ctx) {
    for (int dt = 0; dt < 3; ++dt)
        for (int i = 0; i < COUNT(head_dims); ++i)
            for (int s = 0; s < COUNT(seqlens); ++s)
                for (int causal = 0; causal < 2; ++causal) {
                    test_case tc = test_case_basic((flashcl_dtype)dt, seqlens[s][0], seqlens[s][1], head_dims[i]);
                    tc.causal = causal;
                    tc.batch = 1 + (s & 1);
                    tc.heads_q = 2 + 2 * (i & 1);
                    tc.heads_k = (i & 2) ? 1 : tc.heads_q;
                    run(ctx, tc);
                }
}

/* 1 when the table picks `variant` for dtype and head_dim on this device (else says so). */
static int variant_applies_at(flashcl_context *ctx, flashcl_dtype dtype, int head_dim, const char *variant) {
    flashcl_attention_desc probe;
    flashcl_params p;
    memset(&probe, 0, sizeof probe);
    probe.dtype = dtype;
    probe.batch = probe.heads_q = probe.heads_k = 1;
    probe.seqlen_q = probe.seqlen_k = 64;
    probe.head_dim = head_dim;
    if (flashcl_attention_params(ctx, &probe, &p) != FLASHCL_SUCCESS || strcmp(p.variant, variant) != 0) {
        printf("%s does not apply to this device: skipped\n", variant);
        return 0;
    }
    return 1;
}

static int variant_applies(flashcl_context *ctx, flashcl_dtype dtype, const char *variant) {
    return variant_applies_at(ctx, dtype, 64, variant);
}

/* Each head dim under four FLASHCL_PARAMS values of its bucket (bucket(d):
 * a row of params; NULL = the table's), rotating masks, GQA and layouts;
 * dtypes rotate through dtypes[0..ndtypes-1]. */
static void forced_params(flashcl_context *ctx, const flashcl_dtype *dtypes, int ndtypes, const int *dims,
                          int ndims, const char *const (*params)[4], int (*bucket)(int)) {
    for (int i = 0; i < ndims; ++i)
        for (int j = 0; j < 4; ++j) {
            const char *env = params[bucket(dims[i])][j];
            if (env)
                setenv("FLASHCL_PARAMS", env, 1);
            /* (i + j/2) so that each dtype meets both masks */
            test_case tc = test_case_basic(dtypes[(i + j / 2) % ndtypes], 130 + 7 * i, 301 - 5 * j, dims[i]);
            tc.causal = (i + j) & 1;
            tc.heads_q = 4;
            tc.heads_k = j == 2 ? 1 : 2;
            tc.layout = j == 3 ? LAYOUT_PADDED : LAYOUT_PACKED;
            if (j == 1) {
                tc.window_left = 40;
                tc.window_right = 3;
            }
            printf("FLASHCL_PARAMS=%s: ", env ? env : "(table)");
            run(ctx, tc);
            unsetenv("FLASHCL_PARAMS");
        }
}

/* Soft-cap (head dim d_softcap, dtype a), causal rows that see no key
 * (d_empty, dtype b) and large scores (d_large, dtype a) under whatever
 * FLASHCL_PARAMS the caller set. */
static void edge_cases(flashcl_context *ctx, flashcl_dtype a, flashcl_dtype b, int d_softcap, int d_empty,
                       int d_large) {
    test_case tc = test_case_basic(a, 64, 96, d_softcap);
    tc.softcap = 30.0f;
    tc.input_scale = 4.0;
    run(ctx, tc);
    tc = test_case_basic(b, 200, 37, d_empty);
    tc.causal = 1;
    run(ctx, tc);
    tc = test_case_basic(a, 33, 257, d_large);
    tc.input_scale = 20.0;
    run(ctx, tc);
}

static int bucket_64_128_256(int d) {
    return d <= 64 ? 0 : d <= 128 ? 1 : 2;
}

/* Causal (dtype a, head dim d_a), and a window bounded on the right only (b,
 * d_b), over 3 x 6 = 18 (batch, head) pairs: two whole chunks of the
 * longest-first order and one of 2, each head with 3 row blocks or more. */
static void many_heads(flashcl_context *ctx, flashcl_dtype a, int d_a, flashcl_dtype b, int d_b) {
    printf("FLASHCL_PARAMS=(table), 18 heads: ");
    run(ctx, test_case_many_heads(a, 300, 333, d_a, 2, -1));
    printf("FLASHCL_PARAMS=(table), 18 heads: ");
    run(ctx, test_case_many_heads(b, 341, 333, d_b, 2, 5));
}

/* `test_forward mma`: the float16/bfloat16 tensor-core kernel
 * (cl/flash_fwd_nv.cl) under tile shapes that reach one and two 16-row
 * fragments per warp, 2 to 8 warps, one and two K/V stages, 16- to 64-key
 * tiles. Skips (passing) where it does not apply. */
static void mma(flashcl_context *ctx) {
    setenv("FLASHCL_VARIANT", "nv-mma", 1); /* not nv-wgmma, where that applies */
    if (!variant_applies(ctx, FLASHCL_FLOAT16, "nv-mma"))
        return;
    static const char *const params[3][4] = {
        {NULL,                          /* the table's: 2 fragments per warp, two stages */
         "BLOCK_M=64",                  /* one fragment per warp                         */
         "WARPS=2,BLOCK_M=64,BLOCK_N=32",
         "WARPS=8,BLOCK_M=256,BLOCK_N=32"},
        {NULL,
         "BLOCK_M=128,BLOCK_N=32",      /* 2 fragments per warp (spills at D=128), 2 stages */
         "BLOCK_M=128,BLOCK_N=16",      /* the same, 16-key tiles                           */
         "WARPS=2,BLOCK_M=64,BLOCK_N=48"},
        {NULL, "BLOCK_N=16", "WARPS=2,BLOCK_M=32", "WARPS=1,BLOCK_M=16,BLOCK_N=32"}};
    static const int dims[] = {32, 40, 59, 64, 80, 96, 111, 128, 160, 256};
    static const flashcl_dtype dtypes[] = {FLASHCL_FLOAT16, FLASHCL_BFLOAT16};
    forced_params(ctx, dtypes, COUNT(dtypes), dims, COUNT(dims), params, bucket_64_128_256);
    many_heads(ctx, FLASHCL_FLOAT16, 64, FLASHCL_BFLOAT16, 128);
    setenv("FLASHCL_PARAMS", "BLOCK_M=128,BLOCK_N=32", 1);
    edge_cases(ctx, FLASHCL_FLOAT16, FLASHCL_BFLOAT16, 128, 128, 96);
    unsetenv("FLASHCL_PARAMS");
}

#ifdef FLASHCL_SOURCE_CL_DIR
/* Case tc with FLASHCL_KERNEL_DIR set to a copy of the sources that lacks
 * `missing` (files: the ones it keeps): the variant's build fails and its
 * fallback must answer. tc's head dim must be one no earlier case built, or
 * the context's program list answers instead. 1 when the directory was made. */
static int without_source(flashcl_context *ctx, const char *missing, const char *const *files, int nfiles,
                          test_case tc) {
    char dir[] = "/tmp/flashcl-fallback-XXXXXX";
    const int made = test_kernel_dir(dir, FLASHCL_SOURCE_CL_DIR, files, nfiles);
    if (made) {
        printf("FLASHCL_KERNEL_DIR without %s: ", missing);
        setenv("FLASHCL_KERNEL_DIR", dir, 1);
        run(ctx, tc);
        unsetenv("FLASHCL_KERNEL_DIR");
    } else {
        ++cases, ++failures;
        printf("setting up the source directory: FAILED\n");
    }
    test_kernel_dir_remove(dir);
    return made;
}
#endif

static int bucket_64_128(int d) {
    return d > 64;
}

/* The wgmma kernel forced on causal problems of head_dim <= 64 through
 * flashcl_set_params, with one and two warpgroups and 64- and 48-key tiles
 * (the table's is one of 64 keys). */
static void wgmma_d64_causal(flashcl_context *ctx) {
    static const int shapes[][2] = {{64, 64}, {130, 301}, {257, 100}, {3, 700}};
    static const int tiles[][2] = {{64, 64}, {128, 64}, {64, 48}, {128, 48}}; /* block_m, block_n */
    static const int dims[] = {32, 48, 64};
    for (int i = 0; i < COUNT(tiles); ++i)
        for (int j = 0; j < COUNT(shapes); ++j) {
            test_case tc = test_case_basic((i + j) % 2 ? FLASHCL_BFLOAT16 : FLASHCL_FLOAT16, shapes[j][0],
                                           shapes[j][1], dims[(i + j) % COUNT(dims)]);
            tc.causal = 1;
            tc.heads_q = 4;
            tc.heads_k = j % 2 ? 1 : 2;
            flashcl_attention_desc d; /* its class: dtype, head_dim, prefill, causal */
            size_t elems[4];
            case_desc(&tc, &d, elems);
            flashcl_params p = {tiles[i][0], tiles[i][1], 0, 2 * tiles[i][0], "nv-wgmma", NULL};
            printf("nv-wgmma %dx%d, causal: ", tiles[i][0], tiles[i][1]);
            flashcl_params got;
            if (flashcl_set_params(ctx, &d, &p) != FLASHCL_SUCCESS ||
                flashcl_attention_params(ctx, &d, &got) != FLASHCL_SUCCESS || strcmp(got.variant, "nv-wgmma") ||
                got.block_m != p.block_m || got.block_n != p.block_n) {
                ++cases, ++failures;
                printf("flashcl_set_params: FAILED (not in force: %s)\n", flashcl_last_error(ctx));
                flashcl_set_params(ctx, &d, NULL);
                continue;
            }
            run(ctx, tc);
            flashcl_set_params(ctx, &d, NULL);
        }
}

/* `test_forward wgmma`: Hopper's warpgroup-MMA kernel (cl/flash_fwd_sm90.cl)
 * with one and two warpgroups over the head dims it takes (32..128,
 * padded to 64 or 128). Skips (passing) where it does not apply. */
static void wgmma(flashcl_context *ctx) {
    if (!variant_applies_at(ctx, FLASHCL_FLOAT16, 128, "nv-wgmma"))
        return;
    /* The table's (one warpgroup, 64-key tiles), then one warpgroup of
     * 48-key tiles (which keeps Q in a block of its own, with 168 registers
     * above D=64) and two warpgroups taking turns (PINGPONG) with 48- and
     * 64-key tiles; wgmma_d64_causal forces more shapes on causal D <= 64. */
    static const char *const params[2][4] = {
        {NULL, "WARPS=4,BLOCK_M=64,BLOCK_N=48", "WARPS=8,BLOCK_M=128,BLOCK_N=48", "WARPS=8,BLOCK_M=128"},
        {NULL, "WARPS=4,BLOCK_M=64,BLOCK_N=48", "WARPS=8,BLOCK_M=128,BLOCK_N=48", "WARPS=8,BLOCK_M=128"}};
    static const int dims[] = {32, 40, 59, 64, 65, 72, 80, 96, 111, 127, 128};
    static const flashcl_dtype dtypes[] = {FLASHCL_FLOAT16, FLASHCL_BFLOAT16};
    forced_params(ctx, dtypes, COUNT(dtypes), dims, COUNT(dims), params, bucket_64_128);
    edge_cases(ctx, FLASHCL_FLOAT16, FLASHCL_BFLOAT16, 128, 80, 96);
    edge_cases(ctx, FLASHCL_BFLOAT16, FLASHCL_FLOAT16, 64, 32, 48);
    setenv("FLASHCL_PARAMS", "WARPS=8,BLOCK_M=128", 1);
    edge_cases(ctx, FLASHCL_BFLOAT16, FLASHCL_FLOAT16, 72, 128, 111);
    unsetenv("FLASHCL_PARAMS");
    wgmma_d64_causal(ctx);
    /* 48-key tiles (the shape of the OVERLAP loop, under -DOVERLAP=1): the
     * edge cases, and blocks of one, two and three tiles (keys 1, 30, 48, 49,
     * 96, 97), causal and not. */
    static const char *const bn48[] = {"WARPS=4,BLOCK_M=64,BLOCK_N=48", "WARPS=8,BLOCK_M=128,BLOCK_N=48"};
    static const int few_keys[] = {1, 30, 48, 49, 96, 97};
    for (int i = 0; i < (int)COUNT(bn48); ++i) {
        setenv("FLASHCL_PARAMS", bn48[i], 1);
        edge_cases(ctx, FLASHCL_FLOAT16, FLASHCL_BFLOAT16, 96, 128, 80);
        for (int j = 0; j < (int)COUNT(few_keys); ++j) {
            test_case tc = test_case_basic(j % 2 ? FLASHCL_BFLOAT16 : FLASHCL_FLOAT16, 20 + 37 * j, few_keys[j],
                                           j % 3 ? 128 : 88);
            tc.causal = (i + j) & 1;
            printf("FLASHCL_PARAMS=%s: ", bn48[i]);
            run(ctx, tc);
        }
    }
    unsetenv("FLASHCL_PARAMS");
    /* Where the CUDA driver encodes tensor maps both loops copy their tiles
     * by TMA (src/nv_tma.c); their cp.async copies, which the host falls
     * back to, once more through the edge cases. */
    setenv("FLASHCL_TMA", "0", 1);
    edge_cases(ctx, FLASHCL_FLOAT16, FLASHCL_BFLOAT16, 128, 80, 96);
    edge_cases(ctx, FLASHCL_BFLOAT16, FLASHCL_FLOAT16, 64, 32, 48);
    setenv("FLASHCL_PARAMS", "WARPS=8,BLOCK_M=128", 1);
    edge_cases(ctx, FLASHCL_FLOAT16, FLASHCL_BFLOAT16, 128, 80, 96);
    unsetenv("FLASHCL_PARAMS");
    unsetenv("FLASHCL_TMA");
#ifdef FLASHCL_SOURCE_CL_DIR
    /* Its source missing: the build fails and the mma.sync kernel answers
     * (last: the context then no longer picks nv-wgmma). */
    static const char *const files[] = {"flash_fwd.cl", "flash_fwd_nv.cl"};
    test_case tc = test_case_basic(FLASHCL_FLOAT16, 70, 90, 100);
    if (without_source(ctx, "flash_fwd_sm90.cl", files, COUNT(files), tc)) {
        flashcl_params p;
        flashcl_attention_desc probe = {0};
        probe.dtype = FLASHCL_FLOAT16;
        probe.batch = probe.heads_q = probe.heads_k = 1;
        probe.seqlen_q = probe.seqlen_k = 64;
        probe.head_dim = 100;
        ++cases;
        if (flashcl_attention_params(ctx, &probe, &p) != FLASHCL_SUCCESS || strcmp(p.variant, "nv-mma")) {
            ++failures;
            printf("after the failed build: FAILED (the context picks %s, not nv-mma)\n", p.variant);
        }
    }
#endif
}

/* `test_forward tf32`: the float32 tensor-core kernel (cl/flash_fwd_nv32.cl)
 * under FLASHCL_PARAMS values that reach both of its K/V stage counts and
 * other warp counts, over every head dim it takes, masks and layouts. Skips
 * (passing) where it does not apply. */
static void tf32(flashcl_context *ctx) {
    if (!variant_applies(ctx, FLASHCL_FLOAT32, "nv-tf32"))
        return;
    /* Up to D=64 Q lives in registers, above in __local (Q_IN_SMEM). */
    static const char *const params[2][4] = {
        {NULL,                           /* the table's: two K/V stages of 32 keys */
         "BLOCK_N=64",                   /* one stage                              */
         "WARPS=2,BLOCK_M=32,BLOCK_N=8", /* two warps, 8-key tiles                 */
         "WARPS=8,BLOCK_M=128"},
        {NULL,                            /* the table's: 2 warps, one stage of 16 keys */
         "BLOCK_N=8",                     /* two stages                                 */
         "WARPS=4,BLOCK_M=64,BLOCK_N=8",  /* four warps, one stage                      */
         "WARPS=1,BLOCK_M=16,BLOCK_N=32"}};
    static const int dims[] = {1, 8, 32, 40, 59, 64, 80, 96, 111, 128};
    static const flashcl_dtype dtypes[] = {FLASHCL_FLOAT32};
    forced_params(ctx, dtypes, 1, dims, COUNT(dims), params, bucket_64_128);
    edge_cases(ctx, FLASHCL_FLOAT32, FLASHCL_FLOAT32, 128, 64, 128);
    many_heads(ctx, FLASHCL_FLOAT32, 64, FLASHCL_FLOAT32, 96);
    /* Three warps above D=64 (one stage of 16 keys after a 48-row Q block):
     * once faster than the table's two at D=128 on the H200 (BENCHMARKS.md),
     * so covered here before it can become the entry. */
    static const int dims3[] = {72, 96, 128};
    setenv("FLASHCL_PARAMS", "WARPS=3,BLOCK_M=48", 1);
    for (int i = 0; i < (int)COUNT(dims3); ++i) {
        test_case tc = test_case_basic(FLASHCL_FLOAT32, 100 + 41 * i, 200 + 29 * i, dims3[i]);
        tc.causal = i & 1;
        printf("FLASHCL_PARAMS=WARPS=3,BLOCK_M=48: ");
        run(ctx, tc);
    }
    edge_cases(ctx, FLASHCL_FLOAT32, FLASHCL_FLOAT32, 128, 96, 80);
    unsetenv("FLASHCL_PARAMS");
#ifdef FLASHCL_SOURCE_CL_DIR
    /* Its source missing: the build fails and the portable kernel answers. */
    static const char *const files[] = {"flash_fwd.cl", "flash_fwd_cpu.cl", "flash_fwd_nv.cl"};
    without_source(ctx, "flash_fwd_nv32.cl", files, COUNT(files), test_case_basic(FLASHCL_FLOAT32, 70, 90, 72));
#endif
}

/* Tiny shapes for Oclgrind (ctest -L oclgrind, ~1000x slower than a CPU):
 * every dtype, a masked GQA case, a window with soft-cap and a padded layout,
 * on whichever kernel FLASHCL_TEST_VARIANT picks. 37 rows: more than one
 * row block of either kernel on Oclgrind (16 portable, 32 cpu), the last partial. */
static void oclgrind(flashcl_context *ctx) {
    test_case tc = test_case_basic(FLASHCL_FLOAT16, 37, 23, 16);
    tc.heads_q = 2; /* GQA 2:1 */
    tc.causal = 1;
    run(ctx, tc);
    tc = test_case_basic(FLASHCL_FLOAT32, 5, 19, 8);
    tc.window_left = 3;
    tc.window_right = 1;
    tc.softcap = 5.0f;
    tc.layout = LAYOUT_PADDED;
    run(ctx, tc);
    run(ctx, test_case_basic(FLASHCL_BFLOAT16, 3, 2, 5));
}

int main(int argc, char **argv) {
    flashcl_context *ctx = test_context();
    test_seed();
    if (argc > 1 && !strcmp(argv[1], "sweep"))
        sweep(ctx);
    else if (argc > 1 && !strcmp(argv[1], "tf32"))
        tf32(ctx);
    else if (argc > 1 && !strcmp(argv[1], "mma"))
        mma(ctx);
    else if (argc > 1 && !strcmp(argv[1], "wgmma"))
        wgmma(ctx);
    else if (argc > 1 && !strcmp(argv[1], "oclgrind"))
        oclgrind(ctx);
    else
        quick(ctx);
    printf("%d of %d cases passed\n", cases - failures, cases);
    flashcl_context_destroy(ctx);
    return failures ? 1 : 0;
}
