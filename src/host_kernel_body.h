/* host_kernel_body.h: the host forward's block kernel, included by host_kernels.c once per
 * instruction set (no include guard on purpose). The includer defines:
 *   HK(x)          the name of x in this copy (hk_avx512_x, ...)
 *   HK_TARGET      a function attribute (GCC/Clang target("...")), or nothing
 *   HK_FMA(a,b,c)  a*b+c: fmaf where the target has a fused multiply-add (one
 *                  instruction), else the plain expression (a libm fmaf call
 *                  per element would be far slower)
 *   HK_MR          query rows per micro-kernel call
 *   HK_NR          floats of the micro-kernel's output row (its accumulators:
 *                  HK_MR * HK_NR floats, which must fit the target's registers)
 * and the shared HK_BM, HK_BN, HK_LANES, HK_INLINE, hk_layout_base, hk_store_row.
 *
 * One call computes HK_BM query rows of one (batch, query head), as
 * cl/flash_fwd_cpu.cl does: Q converted once, then per tile of HK_BN keys
 *   K^T tile, V tile      converted to float once, zero-padded
 *   S  = Q K^T            micro-kernel, keys in the vector lanes
 *   online softmax        per row: mask, max, p = 2^((s - m) * c), sum
 *   acc = alpha acc + P V micro-kernel, head dims in the vector lanes
 * Every inner loop has a fixed trip count over contiguous floats and
 * independent iterations, so the compiler vectorises it without any
 * reassociation (no -ffast-math, which would also drop the -inf masks). */

#if HK_BN % HK_NR != 0 || HK_BM % HK_MR != 0 || (HK_NR > HK_LANES ? HK_NR % HK_LANES : HK_LANES % HK_NR) != 0
#error "HK_NR must divide HK_BN and be a multiple or divisor of HK_LANES; HK_MR must divide HK_BM"
#endif

/* C[0..MR)[0..NR) = A[0..MR)[0..K) * B[0..K)[0..NR): the scores of MR rows against NR
 * keys (A = Q rows, lda = their stride; B = the K^T tile). The MR*NR sums live in
 * registers for the whole k loop: GCC/Clang keep c[][] there once the i and j loops
 * are unrolled and vectorised (checked with objdump: the avx512 copy's loop is 4
 * broadcasts, 4 loads and 16 vfmadd231ps on zmm). */
static HK_TARGET HK_INLINE void HK(mk_scores)(int K, const float *restrict A, int lda,
                                              const float *restrict B, float *restrict C) {
    float c[HK_MR][HK_NR];
    for (int i = 0; i < HK_MR; ++i)
        for (int j = 0; j < HK_NR; ++j)
            c[i][j] = 0.0f;
    for (int k = 0; k < K; ++k) {
        const float *restrict b = B + (size_t)k * HK_BN;
        for (int i = 0; i < HK_MR; ++i) {
            const float a = A[(size_t)i * lda + k];
            for (int j = 0; j < HK_NR; ++j)
                c[i][j] = HK_FMA(a, b[j], c[i][j]);
        }
    }
    for (int i = 0; i < HK_MR; ++i)
        for (int j = 0; j < HK_NR; ++j)
            C[(size_t)i * HK_BN + j] = c[i][j];
}

/* C[i][0..nr) = alpha[i] * C[i][0..nr) + sum_k P[i][k] * V[k][0..nr), i < MR: the
 * output update of MR rows over nr head dims (P: probabilities, stride HK_BN; V and C
 * stride ld). The rescale by alpha rides on the load of C. nr is a constant at each
 * call (HK_NR, or HK_LANES for the rest of a head dim that is not a multiple of
 * HK_NR), so after inlining the j loops have fixed trip counts. */
static HK_TARGET HK_INLINE void HK(mk_pv)(int nr, int K, const float *restrict P, const float *restrict V,
                                          float *restrict C, int ld, const float *restrict alpha) {
    float c[HK_MR][HK_NR];
    for (int i = 0; i < HK_MR; ++i)
        for (int j = 0; j < nr; ++j)
            c[i][j] = C[(size_t)i * ld + j] * alpha[i];
    for (int k = 0; k < K; ++k) {
        const float *restrict v = V + (size_t)k * ld;
        for (int i = 0; i < HK_MR; ++i) {
            const float p = P[(size_t)i * HK_BN + k];
            for (int j = 0; j < nr; ++j)
                c[i][j] = HK_FMA(p, v[j], c[i][j]);
        }
    }
    for (int i = 0; i < HK_MR; ++i)
        for (int j = 0; j < nr; ++j)
            C[(size_t)i * ld + j] = c[i][j];
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
    for (int i = 0; i < n; ++i) {
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

/* Rows m0 .. m0+HK_BM-1 (those below seqlen_q) of query head h, batch b. ws: this
 * thread's scratch, hk_scratch_floats(head_dim) floats, 64-byte aligned. */
static HK_TARGET void HK(block)(const flashcl_host_fwd_args *a, int b, int h, int m0, float *ws) {
    const flashcl_attention_desc *d = a->d;
    const int D = d->head_dim, DP = (D + HK_LANES - 1) / HK_LANES * HK_LANES;
    const int hk = h / (d->heads_q / d->heads_k);
    const int rows = d->seqlen_q - m0 < HK_BM ? d->seqlen_q - m0 : HK_BM;
    const int rows_pad = (rows + HK_MR - 1) / HK_MR * HK_MR; /* whole micro-kernel groups */
    const long nk = d->seqlen_k;
    const float log2e = 1.4426950408889634f;
    const int capped = d->softcap > 0.0f;
    const float q_mul = capped ? d->scale / d->softcap : d->scale * log2e;
    const float to_log2 = capped ? 1.0f : q_mul; /* raw score -> log2 domain, as in the kernels */
    const float cap_log2 = d->softcap * log2e;
    const size_t esize = d->dtype == FLASHCL_FLOAT32 ? 4 : 2, row_bytes = (size_t)D * esize;

    float *restrict q = ws;                       /* [HK_BM][DP]  Q block               */
    float *restrict kt = q + HK_BM * DP;          /* [DP][HK_BN]  K tile, transposed    */
    float *restrict v = kt + (size_t)DP * HK_BN;  /* [HK_BN][DP]  V tile, zero-padded   */
    float *restrict s = v + (size_t)HK_BN * DP;   /* [HK_BM][HK_BN] scores, then p      */
    float *restrict acc = s + HK_BM * HK_BN;      /* [HK_BM][DP]  unnormalised output   */
    float *restrict row = acc + HK_BM * DP;       /* [DP]         one converted K row   */
    float m_run[HK_BM], l_run[HK_BM], alpha[HK_BM];
    long lo[HK_BM], hi[HK_BM];
    int tlo[HK_BM], thi[HK_BM]; /* a row's visible keys in the current tile; tlo > thi: none */

    const size_t q_base = hk_layout_base(&d->q, b, h), k_base = hk_layout_base(&d->k, b, hk),
                 v_base = hk_layout_base(&d->v, b, hk);
    long blk_lo = nk, blk_hi = -1; /* the union of the rows' visible keys */
    for (int r = 0; r < rows_pad; ++r) {
        float *qr = q + (size_t)r * DP;
        if (r < rows)
            HK(convert)(qr, a->q, q_base + (size_t)(m0 + r) * d->q.stride_seq, D, d->dtype);
        for (int x = r < rows ? D : 0; x < DP; ++x)
            qr[x] = 0.0f;
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
        /* 1. K^T and V tiles in float; keys past n and head dims past D are zero. */
        for (int c = 0; c < HK_BN; ++c) {
            float *vr = v + (size_t)c * DP;
            if (c < n) {
                HK(convert)(row, a->k, k_base + (size_t)(n0 + c) * d->k.stride_seq, D, d->dtype);
                HK(convert)(vr, a->v, v_base + (size_t)(n0 + c) * d->v.stride_seq, D, d->dtype);
            }
            for (int x = 0; x < D; ++x)
                kt[(size_t)x * HK_BN + c] = c < n ? row[x] : 0.0f;
            for (int x = c < n ? D : 0; x < DP; ++x)
                vr[x] = 0.0f;
        }
        /* The next tile's K and V rows, requested now to arrive during this tile's
         * arithmetic. In the packed layout a head's rows are heads*D elements apart
         * (2 KiB at 8 heads of 64 floats): two rows a 4 KiB page, which the hardware
         * prefetchers do not follow; at N = 4096 (K, V 1 MiB a head each, past L2)
         * the row copies above took a third of the time without this. */
        if (n0 + HK_BN <= blk_hi)
            for (int c = 0; c < HK_BN && n0 + HK_BN + c < nk; ++c) {
                hk_prefetch_row(a->k, k_base + (size_t)(n0 + HK_BN + c) * d->k.stride_seq, row_bytes, esize);
                hk_prefetch_row(a->v, v_base + (size_t)(n0 + HK_BN + c) * d->v.stride_seq, row_bytes, esize);
            }
        /* Which rows see which keys of this tile. */
        int any_group[HK_BM / HK_MR];
        for (int g = 0; g < rows_pad / HK_MR; ++g)
            any_group[g] = 0;
        for (int r = 0; r < rows_pad; ++r) {
            const long x0 = lo[r] > n0 ? lo[r] - n0 : 0;
            const long x1 = hi[r] < n0 + n - 1 ? hi[r] - n0 : n - 1;
            tlo[r] = x0 <= x1 ? (int)x0 : 1;
            thi[r] = x0 <= x1 ? (int)x1 : 0;
            any_group[r / HK_MR] |= x0 <= x1;
        }
        /* 2. Raw scores, HK_MR rows by HK_NR keys at a time. */
        for (int g = 0; g < rows_pad / HK_MR; ++g)
            if (any_group[g])
                for (int c0 = 0; c0 < HK_BN; c0 += HK_NR)
                    HK(mk_scores)(D, q + (size_t)g * HK_MR * DP, DP, kt + c0,
                                  s + (size_t)g * HK_MR * HK_BN + c0);
        /* 3. Mask, soft-cap and the online softmax update, row by row. */
        for (int r = 0; r < rows_pad; ++r) {
            float *restrict sr = s + (size_t)r * HK_BN;
            if (tlo[r] > thi[r]) { /* nothing visible: unchanged (p = 0, alpha = 1) */
                for (int c = 0; c < HK_BN; ++c)
                    sr[c] = 0.0f;
                alpha[r] = 1.0f;
                continue;
            }
            if (capped)
                for (int c = 0; c < HK_BN; ++c)
                    sr[c] = cap_log2 * tanhf(sr[c] * q_mul);
            if (tlo[r] > 0 || thi[r] < HK_BN - 1) {
                const int x0 = tlo[r], x1 = thi[r];
                for (int c = 0; c < HK_BN; ++c)
                    sr[c] = c < x0 || c > x1 ? -INFINITY : sr[c];
            }
            /* Max and sum over HK_LANES independent partials (a plain reduction
             * would need reassociation to vectorise). */
            float part[HK_LANES];
            for (int j = 0; j < HK_LANES; ++j)
                part[j] = -INFINITY;
            for (int c0 = 0; c0 < HK_BN; c0 += HK_LANES)
                for (int j = 0; j < HK_LANES; ++j)
                    part[j] = sr[c0 + j] > part[j] ? sr[c0 + j] : part[j];
            float m_new = m_run[r];
            for (int j = 0; j < HK_LANES; ++j)
                m_new = part[j] > m_new ? part[j] : m_new;
            /* Nothing finite yet: keep alpha = 1 and p = 0 (never -inf - -inf). */
            alpha[r] = m_new == -INFINITY ? 1.0f : HK(exp2)((m_run[r] - m_new) * to_log2);
            /* (s - m) * to_log2, not fmaf(s, to_log2, -m * to_log2): those two
             * roundings differ by half an ulp of m*to_log2, which at scores ~ 1e10
             * made p 2^+-512 (0 or inf). s - m is exact near m, <= 0. */
            const float m_sub = m_new == -INFINITY ? 0.0f : m_new;
            for (int j = 0; j < HK_LANES; ++j)
                part[j] = 0.0f;
            for (int c0 = 0; c0 < HK_BN; c0 += HK_LANES)
                for (int j = 0; j < HK_LANES; ++j) {
                    const float p = HK(exp2)((sr[c0 + j] - m_sub) * to_log2);
                    sr[c0 + j] = p;
                    part[j] += p;
                }
            float sum = 0.0f;
            for (int j = 0; j < HK_LANES; ++j)
                sum += part[j];
            l_run[r] = l_run[r] * alpha[r] + sum;
            m_run[r] = m_new;
        }
        /* 4. acc = alpha acc + P V, HK_MR rows by HK_NR head dims at a time; keys
         *    past n have p = 0 and are not visited. */
        for (int g = 0; g < rows_pad / HK_MR; ++g) {
            if (!any_group[g])
                continue;
            const float *pg = s + (size_t)g * HK_MR * HK_BN;
            float *ag = acc + (size_t)g * HK_MR * DP;
            int x0 = 0;
            for (; x0 + HK_NR <= DP; x0 += HK_NR)
                HK(mk_pv)(HK_NR, n, pg, v + x0, ag + x0, DP, alpha + g * HK_MR);
#if HK_NR > HK_LANES
            for (; x0 < DP; x0 += HK_LANES)
                HK(mk_pv)(HK_LANES, n, pg, v + x0, ag + x0, DP, alpha + g * HK_MR);
#endif
        }
    }

    for (int r = 0; r < rows; ++r) {
        const float l = l_run[r];
        /* No visible key: l = 0 -> output 0, LSE -inf. */
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        hk_store_row(a, b, h, m0 + r, acc + (size_t)r * DP, inv);
        if (a->lse)
            a->lse[((size_t)b * d->heads_q + h) * d->seqlen_q + m0 + r] =
                l > 0.0f ? (m_run[r] * to_log2 + log2f(l)) * 0.6931471805599453f : -INFINITY;
    }
}
