/* host_kernel_body.h: the host forward's block kernel, included by host_kernels.c once per
 * instruction set (no include guard on purpose). The includer defines:
 *   HK(x)          the name of x in this copy (hk_avx512_x, ...)
 *   HK_TARGET      a function attribute (GCC/Clang target("...")), or nothing
 *   HK_FMA(a,b,c)  a*b+c: fmaf where the target has a fused multiply-add (one
 *                  instruction), else the plain expression (a libm fmaf call
 *                  per element would be far slower)
 *   HK_F16C        defined where the target has F16C (and <immintrin.h> is included)
 *   HK_MR, HK_NR   the micro-kernel's HK_MR x HK_NR accumulators, which must fit
 *                  the target's vector registers with room for the operands
 * and the shared HK_BM, HK_BN, HK_LANES, HK_INLINE, HK_ALIGNED, hk_layout_base,
 * hk_prefetch_row.
 *
 * One call computes up to HK_BM query rows of one (batch, query head) with the
 * algorithm of cl/flash_fwd_cpu.cl, but with the query rows in the vector lanes:
 *   Q^T [d][r]            converted and transposed once per block
 *   per tile of HK_BN keys:
 *   K [c][d], V [c][d]    converted to float once, as they come (no transpose)
 *   S^T = K Q^T           micro-kernel: broadcast K[c][d], rows r in the lanes
 *   online softmax        mask, column max, p = 2^((s - m) * c), sums: all
 *                         elementwise across rows, no horizontal reduction
 *   acc = alpha acc + P V micro-kernel: broadcast P[r][c], head dims in the lanes
 * Every inner loop runs over contiguous floats with independent iterations, so the
 * compiler vectorises it without any reassociation (no -ffast-math, which would
 * also drop the -inf masks). Scores are raw (unscaled) as in the kernels, which
 * keeps p exact for huge scores (see the softmax step). */

#if HK_BM % HK_LANES != 0 || (HK_NR > HK_LANES ? HK_NR % HK_LANES : HK_LANES % HK_NR) != 0 || \
    HK_BN % HK_MR != 0 || HK_BM % HK_MR != 0
#error "HK_NR must be a multiple or a divisor of HK_LANES; HK_MR must divide HK_BM and HK_BN"
#endif

/* The micro-kernel, for MR x nr outputs:
 *   C[i][j] = (alpha ? alpha[i] * C[i][j] : 0) + sum_{k<K} A[i*ai + k*ak] * B[k*ldb + j]
 * with i < HK_MR, j < nr. The MR*nr sums stay in registers for the whole k loop: nr,
 * b_aligned, ak and alpha's NULLness are constants at each call, so after inlining the
 * i and j loops unroll and vectorise and c[][] becomes registers (objdump: the avx512
 * copy's loop is 4 broadcasts, 4 loads and 16 vfmadd231ps on zmm). C is always in
 * the scratch: 64-byte aligned, ldc a multiple of HK_LANES floats; so is B where
 * b_aligned says so (V read in place from the caller's array may not be). Telling
 * the compiler matters: GCC's SSE2 code otherwise built each vector of B from four
 * scalar loads (5 GFLOP/s). */
static HK_TARGET HK_INLINE void HK(mk)(int nr, int b_aligned, int K, const float *restrict A, size_t ai,
                                       size_t ak, const float *B, size_t ldb, float *C, int ldc,
                                       const float *restrict alpha) {
    if (b_aligned) {
        B = HK_ALIGNED(B);
        ldb = ldb / HK_LANES * HK_LANES;
    }
    C = HK_ALIGNED(C);
    ldc = ldc / HK_LANES * HK_LANES;
    float c[HK_MR][HK_NR];
    for (int i = 0; i < HK_MR; ++i)
        for (int j = 0; j < nr; ++j)
            c[i][j] = alpha ? C[(size_t)i * ldc + j] * alpha[i] : 0.0f;
    for (int k = 0; k < K; ++k) {
        const float *restrict b = B + (size_t)k * ldb;
        for (int i = 0; i < HK_MR; ++i) {
            const float x = A[i * ai + k * ak];
            for (int j = 0; j < nr; ++j)
                c[i][j] = HK_FMA(x, b[j], c[i][j]);
        }
    }
    for (int i = 0; i < HK_MR; ++i)
        for (int j = 0; j < nr; ++j)
            C[(size_t)i * ldc + j] = c[i][j];
}

/* The micro-kernel over MR x `width` outputs, width a multiple of HK_LANES: whole
 * HK_NR chunks, then HK_LANES ones. */
static HK_TARGET HK_INLINE void HK(mk_row)(int width, int b_aligned, int K, const float *restrict A,
                                           size_t ai, size_t ak, const float *B, size_t ldb, float *C,
                                           int ldc, const float *restrict alpha) {
    int x0 = 0;
    for (; x0 + HK_NR <= width; x0 += HK_NR)
        HK(mk)(HK_NR, b_aligned, K, A, ai, ak, B + x0, ldb, C + x0, ldc, alpha);
#if HK_NR > HK_LANES
    for (; x0 < width; x0 += HK_LANES)
        HK(mk)(HK_LANES, b_aligned, K, A, ai, ak, B + x0, ldb, C + x0, ldc, alpha);
#endif
}

/* 2^x in float, branch-free so that a loop of it vectorises (libm's exp2f is a call
 * per element without -ffast-math). x is clamped to [-150, 128]: -inf (a masked
 * score) becomes 2^-150, which rounds to exactly 0; NaN passes through. Then
 * x = n + f with n an integer and |f| <= 1/2, 2^f from Cephes' exp2f polynomial
 * (relative error ~1.7e-7 peak, 2.8e-8 rms there; tests/test_host.c checks <= 2 ulp
 * against double), and 2^n applied as two normal factors 2^(n/2) 2^(n - n/2), so
 * results down in the subnormals round once and correctly, and 2^128 overflows to
 * inf as it should. */
static HK_TARGET HK_INLINE float HK(exp2)(float x) {
    const float shifter = 0x1.8p23f; /* adding it rounds to an integer, kept in the low bits */
    x = x < -150.0f ? -150.0f : x;
    x = x > 128.0f ? 128.0f : x;
    const float big = x + shifter;
    const float f = x - (big - shifter);
    uint32_t bits;
    memcpy(&bits, &big, sizeof bits);
    const int32_t n = (int32_t)(bits - 0x4b400000u); /* the integer: -150..128 */
    const int32_t n1 = n / 2, n2 = n - n1;
    const uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    float p = 1.535336188319500e-4f;
    p = HK_FMA(p, f, 1.339887440266574e-3f);
    p = HK_FMA(p, f, 9.618437357674640e-3f);
    p = HK_FMA(p, f, 5.550332471162809e-2f);
    p = HK_FMA(p, f, 2.402264791363012e-1f);
    p = HK_FMA(p, f, 6.931472028550421e-1f);
    p = HK_FMA(p, f, 1.0f);
    return p * s1 * s2;
}

/* Exported per copy for the test of the polynomial (host_kernels.c). */
static HK_TARGET void HK(exp2_array)(float *x, int n) {
    for (int i = 0; i < n; ++i)
        x[i] = HK(exp2)(x[i]);
}

/* n elements of storage type dtype at src[off...] to float. f16 and bf16 are done
 * with integer operations and selects (no branch), so the loop vectorises: this
 * runs once per element of each Q block and K/V tile. */
static HK_TARGET HK_INLINE void HK(convert)(float *restrict dst, const void *src, size_t off, int n,
                                            flashcl_dtype dtype) {
    if (dtype == FLASHCL_FLOAT32) {
        memcpy(dst, (const float *)src + off, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *restrict h = (const uint16_t *)src + off;
    if (dtype == FLASHCL_BFLOAT16) {
        for (int i = 0; i < n; ++i) {
            const uint32_t u = (uint32_t)h[i] << 16;
            memcpy(&dst[i], &u, sizeof u);
        }
        return;
    }
    int i = 0;
#ifdef HK_F16C
    /* F16C: 8 at a time in one instruction (exact, like the code below). */
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; ++i) {
        const uint32_t x = h[i], em = x & 0x7fffu, sign = (x & 0x8000u) << 16;
        /* Normal: rebias the exponent by 112; inf and NaN (exponent 31): to 255. */
        const uint32_t nb = (em << 13) + (em >= 0x7c00u ? 0x70000000u : 0x38000000u);
        float normal, sub = (float)(int32_t)em * 0x1p-24f; /* zero or subnormal: exact */
        memcpy(&normal, &nb, sizeof normal);
        const float mag = em < 0x400u ? sub : normal;
        uint32_t u;
        memcpy(&u, &mag, sizeof u);
        u |= sign;
        memcpy(&dst[i], &u, sizeof u);
    }
}

/* One output row: acc[0..n) * inv into the storage type at out[off...], rounded to
 * nearest even as flashcl_host_store does (host_path.c; bit for bit: NaN becomes the
 * quiet NaN of its sign there too). Branch-free, so it vectorises. tmp: n floats. */
static HK_TARGET HK_INLINE void HK(store_row)(void *out, size_t off, const float *restrict acc, float inv,
                                              int n, flashcl_dtype dtype, float *restrict tmp) {
    for (int i = 0; i < n; ++i)
        tmp[i] = acc[i] * inv;
    if (dtype == FLASHCL_FLOAT32) {
        memcpy((float *)out + off, tmp, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *restrict o = (uint16_t *)out + off;
    if (dtype == FLASHCL_BFLOAT16) {
        for (int i = 0; i < n; ++i) {
            uint32_t u;
            memcpy(&u, &tmp[i], sizeof u);
            const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
            u = nan ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u);
            o[i] = (uint16_t)(u >> 16);
        }
        return;
    }
    for (int i = 0; i < n; ++i) {
        uint32_t u;
        memcpy(&u, &tmp[i], sizeof u);
        const uint32_t sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
        /* Normal: rebias the exponent, round the 13 dropped bits to even. */
        const uint32_t hn = (abs >> 13) - (112u << 10), rest = abs & 0x1fffu;
        const uint32_t normal = hn + (rest > 0x1000u || (rest == 0x1000u && (hn & 1u)));
        /* Below the smallest normal half: units of 2^-24, rounded to even by the
         * 1.5 * 2^23 shifter (exact: fewer than 2^10 units). */
        float mag;
        memcpy(&mag, &abs, sizeof mag);
        const float units = mag * 16777216.0f + 0x1.8p23f;
        uint32_t sub;
        memcpy(&sub, &units, sizeof sub);
        sub -= 0x4b400000u;
        uint32_t h = abs < 0x38800000u ? sub : normal;
        h = abs >= 0x477ff000u ? 0x7c00u : h; /* rounds to >= 65520: infinity */
        h = abs > 0x7f800000u ? 0x7e00u : h;
        o[i] = (uint16_t)(sign | h);
    }
}

/* K and V rows [r0, r1) of kv head hk, batch b, into a->kp and a->vp (layout in
 * internal.h): converted once for all the row blocks that read them, contiguous,
 * zero past seqlen_k and past head_dim. */
static HK_TARGET void HK(pack)(const flashcl_host_fwd_args *a, int b, int hk, size_t r0, size_t r1) {
    const flashcl_attention_desc *d = a->d;
    const int D = d->head_dim;
    const size_t head = ((size_t)b * d->heads_k + hk) * a->keys * a->dim;
    const size_t k_base = hk_layout_base(&d->k, b, hk), v_base = hk_layout_base(&d->v, b, hk);
    for (size_t r = r0; r < r1; ++r) {
        float *kr = a->kp + head + r * a->dim, *vr = a->vp + head + r * a->dim;
        const int in = r < (size_t)d->seqlen_k;
        if (in) {
            HK(convert)(kr, a->k, k_base + r * d->k.stride_seq, D, d->dtype);
            HK(convert)(vr, a->v, v_base + r * d->v.stride_seq, D, d->dtype);
        }
        for (size_t x = in ? (size_t)D : 0; x < a->dim; ++x)
            kr[x] = vr[x] = 0.0f;
    }
}

/* Rows m0 .. m0+HK_BM-1 (those below seqlen_q) of query head h, batch b. ws: this
 * thread's scratch, flashcl_host_scratch_floats(head_dim) floats, 64-byte aligned. */
static HK_TARGET void HK(block)(const flashcl_host_fwd_args *a, int b, int h, int m0, float *ws) {
    const flashcl_attention_desc *d = a->d;
    const int D = d->head_dim, DP = (D + HK_LANES - 1) / HK_LANES * HK_LANES;
    const int hk = h / (d->heads_q / d->heads_k);
    const int rows = d->seqlen_q - m0 < HK_BM ? d->seqlen_q - m0 : HK_BM;
    const int RP = (rows + HK_LANES - 1) / HK_LANES * HK_LANES; /* rows in whole vectors */
    const long nk = d->seqlen_k;
    const float log2e = 1.4426950408889634f;
    const int capped = d->softcap > 0.0f;
    const float q_mul = capped ? d->scale / d->softcap : d->scale * log2e;
    const float to_log2 = capped ? 1.0f : q_mul; /* raw score -> log2 domain, as in the kernels */
    const float cap_log2 = d->softcap * log2e;
    const size_t esize = d->dtype == FLASHCL_FLOAT32 ? 4 : 2, row_bytes = (size_t)D * esize;

    float *restrict qt = ws;                      /* [DP][HK_BM]  Q^T block             */
    float *restrict kb = qt + (size_t)DP * HK_BM; /* [HK_BN][DP]  K tile                */
    float *restrict vb = kb + (size_t)HK_BN * DP; /* [HK_BN][DP]  V tile, zero-padded   */
    float *restrict st = vb + (size_t)HK_BN * DP; /* [HK_BN][HK_BM] S^T, then P^T       */
    float *restrict acc = st + HK_BN * HK_BM;     /* [HK_BM][DP]  unnormalised output   */
    float *restrict tmp = acc + (size_t)HK_BM * DP; /* [DP]       one output row        */
    float m_run[HK_BM], l_run[HK_BM], alpha[HK_BM], m_sub[HK_BM], sum[HK_BM];
    long lo[HK_BM], hi[HK_BM];
    int tlo[HK_BM], thi[HK_BM]; /* a row's visible keys in the current tile; tlo > thi: none */

    const size_t q_base = hk_layout_base(&d->q, b, h), k_base = hk_layout_base(&d->k, b, hk),
                 v_base = hk_layout_base(&d->v, b, hk);
    long blk_lo = nk, blk_hi = -1; /* the union of the rows' visible keys */
    /* Q's rows are read once and out's written once, each a few cache lines
     * heads*D elements apart, so their misses are what costs: out's are requested
     * now, and Q's rows are all converted first (into acc, free until the tiles)
     * and transposed after, so that their loads overlap. Converting and
     * transposing row by row let one or two rows' misses run at a time: 7% of the
     * time at N = 1024, D = 64. */
    const size_t o_base = hk_layout_base(&d->out, b, h);
    for (int r = 0; r < rows; ++r) {
        hk_prefetch_row(a->out, o_base + (size_t)(m0 + r) * d->out.stride_seq, row_bytes, esize, 1);
        HK(convert)(acc + (size_t)r * DP, a->q, q_base + (size_t)(m0 + r) * d->q.stride_seq, D, d->dtype);
    }
    for (int r = 0; r < RP; ++r) {
        for (int x = 0; x < D; ++x)
            qt[(size_t)x * HK_BM + r] = r < rows ? acc[(size_t)r * DP + x] : 0.0f;
    }
    for (int r = 0; r < RP; ++r) {
        for (int x = 0; x < DP; ++x)
            acc[(size_t)r * DP + x] = 0.0f;
        m_run[r] = -INFINITY;
        l_run[r] = 0.0f;
        lo[r] = 1;
        hi[r] = 0; /* padding rows see nothing */
        if (r < rows) {
            const long diag = (long)(m0 + r) + nk - d->seqlen_q;
            lo[r] = d->window_left < 0 ? 0 : diag - d->window_left;
            hi[r] = d->window_right < 0 ? nk - 1 : diag + d->window_right;
            lo[r] = lo[r] < 0 ? 0 : lo[r];
            hi[r] = hi[r] > nk - 1 ? nk - 1 : hi[r];
            if (lo[r] <= hi[r]) {
                blk_lo = lo[r] < blk_lo ? lo[r] : blk_lo;
                blk_hi = hi[r] > blk_hi ? hi[r] : blk_hi;
            }
        }
    }

    /* Tiles start at multiples of HK_BN, so a causal diagonal falls in one tile. */
    for (long n0 = blk_lo / HK_BN * HK_BN; n0 <= blk_hi; n0 += HK_BN) {
        const int n = nk - n0 < HK_BN ? (int)(nk - n0) : HK_BN;
        const int NP = (n + HK_MR - 1) / HK_MR * HK_MR; /* keys in whole micro-kernel calls */
        /* 1. K and V tiles in float; keys past n and head dims past D are zero.
         *    Packed (host_path.c, where it fits a budget): there already, contiguous
         *    and aligned. Else float32 is read in place where it can be: K always
         *    (it is only broadcast), V when its rows need no padding; not the last
         *    tile when it ends inside a micro-kernel call. The copies cost ~15% of
         *    the time at D = 64, even from L2. */
        const int packed = a->kp != NULL;
        const int in_place = !packed && d->dtype == FLASHCL_FLOAT32 && n % HK_MR == 0;
        const int v_in_place = in_place && D == DP;
        const float *kt = kb, *vt = vb;
        size_t k_ld = DP, v_ld = DP;
        if (packed) {
            kt = a->kp + (((size_t)b * d->heads_k + hk) * a->keys + (size_t)n0) * DP;
            vt = a->vp + (((size_t)b * d->heads_k + hk) * a->keys + (size_t)n0) * DP;
        } else {
            if (in_place) {
                kt = (const float *)a->k + k_base + (size_t)n0 * d->k.stride_seq;
                k_ld = d->k.stride_seq;
            }
            if (v_in_place) {
                vt = (const float *)a->v + v_base + (size_t)n0 * d->v.stride_seq;
                v_ld = d->v.stride_seq;
            }
        }
        for (int c = 0; c < (packed || v_in_place ? 0 : NP); ++c) {
            float *kr = kb + (size_t)c * DP, *vr = vb + (size_t)c * DP;
            if (c < n) {
                if (!in_place)
                    HK(convert)(kr, a->k, k_base + (size_t)(n0 + c) * d->k.stride_seq, D, d->dtype);
                HK(convert)(vr, a->v, v_base + (size_t)(n0 + c) * d->v.stride_seq, D, d->dtype);
            }
            for (int x = c < n ? D : 0; x < DP; ++x)
                kr[x] = vr[x] = 0.0f;
        }
        /* Which rows see which keys of this tile; a mask is needed unless every
         * row sees all n keys and n is the whole tile. */
        int masked = 0;
        for (int r = 0; r < RP; ++r) {
            const long x0 = lo[r] > n0 ? lo[r] - n0 : 0;
            const long x1 = hi[r] < n0 + n - 1 ? hi[r] - n0 : n - 1;
            tlo[r] = x0 <= x1 ? (int)x0 : 1;
            thi[r] = x0 <= x1 ? (int)x1 : 0;
            masked |= tlo[r] > 0 || thi[r] < HK_BN - 1;
        }
        /* 2. Raw scores S^T[c][r], HK_MR keys at a time. Along the way, the next
         *    tile's K and V rows are requested, HK_MR of each a call, to arrive
         *    during this tile's arithmetic: in the packed layout a head's rows are
         *    heads*D elements apart (2 KiB at 8 heads of 64 floats), two rows a
         *    4 KiB page, which the hardware prefetchers do not follow. (All 128 at
         *    once, before the loop, overflowed the miss buffers: half the gain.) */
        const long next = n0 + HK_BN;
        for (int c = 0; c < NP; c += HK_MR) {
            for (int i = c; i < c + HK_MR && !packed && next <= blk_hi && next + i < nk; ++i) {
                hk_prefetch_row(a->k, k_base + (size_t)(next + i) * d->k.stride_seq, row_bytes, esize, 0);
                hk_prefetch_row(a->v, v_base + (size_t)(next + i) * d->v.stride_seq, row_bytes, esize, 0);
            }
            HK(mk_row)(RP, 1, D, kt + c * k_ld, k_ld, 1, qt, HK_BM, st + (size_t)c * HK_BM, HK_BM, NULL);
        }
        /* 3. Soft-cap, mask and the online softmax update, all rows at once. */
        if (capped)
            for (int c = 0; c < n; ++c)
                for (int r = 0; r < RP; ++r)
                    st[c * HK_BM + r] = cap_log2 * tanhf(st[c * HK_BM + r] * q_mul);
        if (masked)
            for (int c = 0; c < n; ++c)
                for (int r = 0; r < RP; ++r)
                    st[c * HK_BM + r] = c < tlo[r] || c > thi[r] ? -INFINITY : st[c * HK_BM + r];
        for (int r = 0; r < RP; ++r)
            sum[r] = m_run[r]; /* the new maxima, first */
        for (int c = 0; c < n; ++c)
            for (int r = 0; r < RP; ++r)
                sum[r] = st[c * HK_BM + r] > sum[r] ? st[c * HK_BM + r] : sum[r];
        for (int r = 0; r < RP; ++r) {
            const float m_new = sum[r];
            /* Nothing finite yet: keep alpha = 1 and p = 0 (never -inf - -inf). */
            alpha[r] = m_new == -INFINITY ? 1.0f : HK(exp2)((m_run[r] - m_new) * to_log2);
            m_sub[r] = m_new == -INFINITY ? 0.0f : m_new;
            m_run[r] = m_new;
            sum[r] = 0.0f;
        }
        /* (s - m) * to_log2, not fmaf(s, to_log2, -m * to_log2): those two roundings
         * differ by half an ulp of m*to_log2, which at scores ~ 1e10 made p 2^+-512
         * (0 or inf). s - m is exact near m, <= 0. */
        for (int c = 0; c < n; ++c)
            for (int r = 0; r < RP; ++r) {
                const float p = HK(exp2)((st[c * HK_BM + r] - m_sub[r]) * to_log2);
                st[c * HK_BM + r] = p;
                sum[r] += p;
            }
        for (int r = 0; r < RP; ++r)
            l_run[r] = l_run[r] * alpha[r] + sum[r];
        /* 4. acc = alpha acc + P V, HK_MR rows at a time; keys past n not visited. */
        for (int r = 0; r < RP; r += HK_MR) {
            if (v_in_place)
                HK(mk_row)(DP, 0, n, st + r, 1, HK_BM, vt, v_ld, acc + (size_t)r * DP, DP, alpha + r);
            else
                HK(mk_row)(DP, 1, n, st + r, 1, HK_BM, vt, DP, acc + (size_t)r * DP, DP, alpha + r);
        }
    }

    for (int r = 0; r < rows; ++r) {
        const float l = l_run[r];
        /* No visible key: l = 0 -> output 0, LSE -inf. */
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        HK(store_row)(a->out, o_base + (size_t)(m0 + r) * d->out.stride_seq,
                      acc + (size_t)r * DP, inv, D, d->dtype, tmp);
        if (a->lse)
            a->lse[((size_t)b * d->heads_q + h) * d->seqlen_q + m0 + r] =
                l > 0.0f ? (m_run[r] * to_log2 + log2f(l)) * 0.6931471805599453f : -INFINITY;
    }
}
