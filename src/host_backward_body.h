/* host_backward_body.h: the host backward's block kernels, included by host_kernels.c
 * once per instruction set right after host_kernel_body.h (no include guard on
 * purpose), whose micro-kernel, exp2, convert and store_row they reuse, with the same
 * HK(x), HK_TARGET, HK_FMA, HK_MR, HK_NR, HK_BM, HK_BN, HK_LANES.
 *
 * The algorithm of cl/flash_bwd.cl's deterministic mode (see src/host_backward.c for
 * the passes), in float, on tiles of HK_BM query rows x HK_BN keys, rows in the
 * vector lanes as in the forward:
 *   S^T  = K Q^T            [c][r]  micro-kernel, as the forward's scores
 *   dP^T = V dO^T           [c][r]  the same with V and dO
 *   P    = 2^(S c - lse2)           masked to 0; c = scale log2(e), lse2 = lse log2(e)
 *   dS   = P (dP - D_r) g scale     g = 1 - t^2 under a soft-cap t = tanh(...)
 *   pass 1: dV += P^T dO, dK += dS^T Q      (rows: the micro-kernel's k loop)
 *   pass 2: dQ += dS K                      (keys: the k loop, as the forward's P V)
 * Every sum runs in a fixed order (query heads of the group, then rows, in order,
 * for dK and dV; keys in order for dQ): results do not depend on threads. Masked
 * and padding elements get P = dS = 0 exactly (a select, not a product), so they
 * add +-0, which changes no sum: the same as skipping them as the scalar code did. */

/* The scratch of one call, at head_dim padded to DP (sizes: host_kernels.c's
 * flashcl_host_bwd_scratch_floats). */
typedef struct HK(bwd_ws) {
    float *qt, *gt; /* [DP][HK_BM]   Q^T, dO^T                         */
    float *qr, *gr; /* [HK_BM][DP]   Q, dO row-major (pass 1)          */
    float *kb, *vb; /* [HK_BN][DP]   K, V tile                          */
    float *st, *dt; /* [HK_BN][HK_BM] S^T then P^T; dP^T then dS^T     */
    float *acc1, *acc2; /* pass 1: dK, dV [HK_BN][DP]; pass 2: dQ [HK_BM][DP] in acc1 */
    float *tmp;     /* [DP] one output row                             */
} HK(bwd_ws);

static HK_TARGET HK_INLINE HK(bwd_ws) HK(bwd_split)(float *ws, int DP) {
    HK(bwd_ws) w;
    const size_t tq = (size_t)DP * HK_BM, tk = (size_t)DP * HK_BN, ts = (size_t)HK_BN * HK_BM;
    w.qt = ws, w.gt = w.qt + tq, w.qr = w.gt + tq, w.gr = w.qr + tq;
    w.kb = w.gr + tq, w.vb = w.kb + tk, w.st = w.vb + tk, w.dt = w.st + ts;
    w.acc1 = w.dt + ts, w.acc2 = w.acc1 + (tq > tk ? tq : tk), w.tmp = w.acc2 + tk;
    return w;
}

/* Rows m0 .. m0+rows-1 of query head h: Q^T and dO^T into w (zero past rows, up to RP),
 * and, where rowmajor, Q and dO row-major (zero past D). Per row: lse2, D_r, and the
 * visible keys [lo, hi] (lo > hi: none, also for an LSE of -inf: such a row saw no
 * key and contributes nothing). Returns the union of the rows' visible keys in
 * *blk_lo, *blk_hi. */
static HK_TARGET void HK(bwd_rows)(const flashcl_host_bwd_args *a, int b, int h, long m0, int rows,
                                   int RP, int DP, const HK(bwd_ws) * w, int rowmajor, float *lse2,
                                   float *di, long *lo, long *hi, long *blk_lo, long *blk_hi) {
    const flashcl_attention_desc *d = a->d;
    const int D = d->head_dim;
    const long nk = d->seqlen_k;
    const size_t q_base = hk_layout_base(&d->q, b, h), g_base = hk_layout_base(&a->o->dout, b, h);
    /* Converted row-major first (into qr/gr, or the free acc tiles), then transposed,
     * so the rows' cache misses overlap (host_kernel_body.h's block does the same). */
    float *qr = rowmajor ? w->qr : w->acc1, *gr = rowmajor ? w->gr : w->acc2;
    for (int r = 0; r < rows; ++r) {
        HK(convert)(qr + (size_t)r * DP, a->q, q_base + (size_t)(m0 + r) * d->q.stride_seq, D, d->dtype);
        HK(convert)(gr + (size_t)r * DP, a->dout, g_base + (size_t)(m0 + r) * a->o->dout.stride_seq, D,
                    d->dtype);
        for (int x = D; x < DP; ++x)
            qr[(size_t)r * DP + x] = gr[(size_t)r * DP + x] = 0.0f;
    }
    for (int x = 0; x < D; ++x)
        for (int r = 0; r < RP; ++r) {
            w->qt[(size_t)x * HK_BM + r] = r < rows ? qr[(size_t)r * DP + x] : 0.0f;
            w->gt[(size_t)x * HK_BM + r] = r < rows ? gr[(size_t)r * DP + x] : 0.0f;
        }
    *blk_lo = nk;
    *blk_hi = -1;
    for (int r = 0; r < RP; ++r) {
        lse2[r] = di[r] = 0.0f;
        lo[r] = 1;
        hi[r] = 0; /* padding rows see nothing */
        if (r >= rows)
            continue;
        const size_t row = ((size_t)b * d->heads_q + h) * d->seqlen_q + (size_t)(m0 + r);
        const float lse = a->lse[row];
        if (lse == -INFINITY)
            continue;
        lse2[r] = lse * 1.4426950408889634f;
        di[r] = a->di[row];
        const long diag = m0 + r + nk - d->seqlen_q;
        lo[r] = d->window_left < 0 ? 0 : diag - d->window_left;
        hi[r] = d->window_right < 0 ? nk - 1 : diag + d->window_right;
        lo[r] = lo[r] < 0 ? 0 : lo[r];
        hi[r] = hi[r] > nk - 1 ? nk - 1 : hi[r];
        if (lo[r] <= hi[r]) {
            *blk_lo = lo[r] < *blk_lo ? lo[r] : *blk_lo;
            *blk_hi = hi[r] > *blk_hi ? hi[r] : *blk_hi;
        }
    }
}

/* Keys [n0, n0+n) of kv head hk into w->kb, w->vb, zero up to NP keys and DP dims. */
static HK_TARGET void HK(bwd_kv)(const flashcl_host_bwd_args *a, int b, int hk, long n0, int n, int NP,
                                 int DP, const HK(bwd_ws) * w) {
    const flashcl_attention_desc *d = a->d;
    const int D = d->head_dim;
    const size_t k_base = hk_layout_base(&d->k, b, hk), v_base = hk_layout_base(&d->v, b, hk);
    for (int c = 0; c < NP; ++c) {
        float *kr = w->kb + (size_t)c * DP, *vr = w->vb + (size_t)c * DP;
        if (c < n) {
            HK(convert)(kr, a->k, k_base + (size_t)(n0 + c) * d->k.stride_seq, D, d->dtype);
            HK(convert)(vr, a->v, v_base + (size_t)(n0 + c) * d->v.stride_seq, D, d->dtype);
        }
        for (int x = c < n ? D : 0; x < DP; ++x)
            kr[x] = vr[x] = 0.0f;
    }
}

/* One tile: S^T, dP^T, then P into w->st and dS into w->dt, for keys [n0, n0+NP) of
 * the tile (K, V: rows k_ld, v_ld floats apart, in w or in place) and the RP rows
 * whose Q^T, dO^T are in w. */
static HK_TARGET void HK(bwd_tile)(const flashcl_attention_desc *d, long n0, int NP, int RP,
                                   const float *kt, size_t k_ld, const float *vt, size_t v_ld,
                                   const HK(bwd_ws) * w, const float *lse2, const float *di,
                                   const long *lo, const long *hi) {
    const int D = d->head_dim;
    float *restrict st = HK_ALIGNED(w->st), *restrict dt = HK_ALIGNED(w->dt);
    for (int c = 0; c < NP; c += HK_MR) {
        HK(mk_row)(RP, 1, D, kt + c * k_ld, k_ld, 1, w->qt, HK_BM, st + (size_t)c * HK_BM, HK_BM, NULL);
        HK(mk_row)(RP, 1, D, vt + c * v_ld, v_ld, 1, w->gt, HK_BM, dt + (size_t)c * HK_BM, HK_BM, NULL);
    }
    /* A row's visible keys in this tile, as int lanes for the vectorised select. */
    int tlo[HK_BM], thi[HK_BM];
    for (int r = 0; r < RP; ++r) {
        const long x0 = lo[r] > n0 ? lo[r] - n0 : 0, x1 = hi[r] - n0;
        tlo[r] = x0 <= x1 && x1 >= 0 ? (int)x0 : 1;
        thi[r] = x0 <= x1 && x1 >= 0 ? (int)(x1 < NP ? x1 : NP - 1) : 0;
    }
    const float scale = d->scale;
    if (d->softcap > 0.0f) {
        /* tanhf is a libm call: this loop stays scalar (soft-capped runs only). */
        const float q_mul = d->scale / d->softcap, cap_log2 = d->softcap * 1.4426950408889634f;
        for (int c = 0; c < NP; ++c)
            for (int r = 0; r < RP; ++r) {
                const int vis = c >= tlo[r] && c <= thi[r];
                const float t = tanhf(st[c * HK_BM + r] * q_mul), g = 1.0f - t * t;
                const float p = HK(exp2)(HK_FMA(cap_log2, t, -lse2[r]));
                const float ds = p * (dt[c * HK_BM + r] - di[r]) * g * scale;
                st[c * HK_BM + r] = vis ? p : 0.0f;
                dt[c * HK_BM + r] = vis ? ds : 0.0f;
            }
        return;
    }
    const float c2 = scale * 1.4426950408889634f;
    for (int c = 0; c < NP; ++c)
        for (int r = 0; r < RP; ++r) {
            const int vis = c >= tlo[r] && c <= thi[r];
            const float p = HK(exp2)(HK_FMA(st[c * HK_BM + r], c2, -lse2[r]));
            const float ds = p * (dt[c * HK_BM + r] - di[r]) * scale;
            st[c * HK_BM + r] = vis ? p : 0.0f;
            dt[c * HK_BM + r] = vis ? ds : 0.0f;
        }
}

#if HK_MR > 4
#error "HK(ones) has 4 entries"
#endif
static const float HK(ones)[4] = {1.0f, 1.0f, 1.0f, 1.0f}; /* alpha: C += A B, exactly */

/* Pass 1: dK and dV of keys [n0, n0+HK_BN) (those below seqlen_k) of kv head hk,
 * batch b, summed over the group's query heads and every row that sees them. */
static HK_TARGET void HK(bwd_dkdv)(const flashcl_host_bwd_args *a, int b, int hk, long n0, float *ws) {
    const flashcl_attention_desc *d = a->d;
    const int D = d->head_dim, DP = (D + HK_LANES - 1) / HK_LANES * HK_LANES;
    const int group = d->heads_q / d->heads_k;
    const long shift = (long)d->seqlen_k - d->seqlen_q;
    const int n = d->seqlen_k - n0 < HK_BN ? (int)(d->seqlen_k - n0) : HK_BN;
    const int NP = (n + HK_MR - 1) / HK_MR * HK_MR;
    const HK(bwd_ws) w = HK(bwd_split)(ws, DP);
    float *restrict dk = HK_ALIGNED(w.acc1), *restrict dv = HK_ALIGNED(w.acc2);
    float lse2[HK_BM], di[HK_BM];
    long lo[HK_BM], hi[HK_BM];
    HK(bwd_kv)(a, b, hk, n0, n, NP, DP, &w);
    for (size_t x = 0; x < (size_t)NP * DP; ++x)
        dk[x] = dv[x] = 0.0f;
    /* Rows that may see a key of [n0, n0+n): as in cl/flash_bwd.cl. */
    long i_lo = d->window_right < 0 ? 0 : n0 - d->window_right - shift;
    long i_hi = d->window_left < 0 ? d->seqlen_q - 1 : n0 + n - 1 + d->window_left - shift;
    i_lo = i_lo < 0 ? 0 : i_lo;
    i_hi = i_hi > d->seqlen_q - 1 ? d->seqlen_q - 1 : i_hi;
    for (int h = hk * group; h < (hk + 1) * group; ++h)
        for (long m0 = i_lo; m0 <= i_hi; m0 += HK_BM) {
            const int rows = i_hi + 1 - m0 < HK_BM ? (int)(i_hi + 1 - m0) : HK_BM;
            const int RP = (rows + HK_LANES - 1) / HK_LANES * HK_LANES;
            long blk_lo, blk_hi;
            HK(bwd_rows)(a, b, h, m0, rows, RP, DP, &w, 1, lse2, di, lo, hi, &blk_lo, &blk_hi);
            if (blk_lo > n0 + n - 1 || blk_hi < n0)
                continue; /* no row of these sees the block */
            HK(bwd_tile)(d, n0, NP, RP, w.kb, DP, w.vb, DP, &w, lse2, di, lo, hi);
            /* dV[c] += sum_r P^T[c][r] dO[r], dK[c] += sum_r dS^T[c][r] Q[r]: rows in order. */
            for (int c = 0; c < NP; c += HK_MR) {
                HK(mk_row)(DP, 1, rows, w.st + (size_t)c * HK_BM, HK_BM, 1, w.gr, DP, dv + (size_t)c * DP,
                           DP, HK(ones));
                HK(mk_row)(DP, 1, rows, w.dt + (size_t)c * HK_BM, HK_BM, 1, w.qr, DP, dk + (size_t)c * DP,
                           DP, HK(ones));
            }
        }
    const size_t k_base = hk_layout_base(&a->o->dk, b, hk), v_base = hk_layout_base(&a->o->dv, b, hk);
    for (int c = 0; c < n; ++c) {
        HK(store_row)(a->dk, k_base + (size_t)(n0 + c) * a->o->dk.stride_seq, dk + (size_t)c * DP, 1.0f, D,
                      d->dtype, w.tmp);
        HK(store_row)(a->dv, v_base + (size_t)(n0 + c) * a->o->dv.stride_seq, dv + (size_t)c * DP, 1.0f, D,
                      d->dtype, w.tmp);
    }
}

/* Pass 2: dQ of rows [m0, m0+HK_BM) (those below seqlen_q) of query head h, batch b,
 * summed over their visible keys in key order. */
static HK_TARGET void HK(bwd_dq)(const flashcl_host_bwd_args *a, int b, int h, long m0, float *ws) {
    const flashcl_attention_desc *d = a->d;
    const int D = d->head_dim, DP = (D + HK_LANES - 1) / HK_LANES * HK_LANES;
    const int hk = h / (d->heads_q / d->heads_k);
    const int rows = d->seqlen_q - m0 < HK_BM ? (int)(d->seqlen_q - m0) : HK_BM;
    const int RP = (rows + HK_LANES - 1) / HK_LANES * HK_LANES;
    const long nk = d->seqlen_k;
    const HK(bwd_ws) w = HK(bwd_split)(ws, DP);
    const size_t k_base = hk_layout_base(&d->k, b, hk), v_base = hk_layout_base(&d->v, b, hk);
    float lse2[HK_BM], di[HK_BM];
    long lo[HK_BM], hi[HK_BM], blk_lo, blk_hi;
    HK(bwd_rows)(a, b, h, m0, rows, RP, DP, &w, 0, lse2, di, lo, hi, &blk_lo, &blk_hi);
    float *restrict dq = HK_ALIGNED(w.acc1); /* after bwd_rows, which used it */
    for (size_t x = 0; x < (size_t)RP * DP; ++x)
        dq[x] = 0.0f;
    for (long n0 = blk_lo / HK_BN * HK_BN; n0 <= blk_hi; n0 += HK_BN) {
        const int n = nk - n0 < HK_BN ? (int)(nk - n0) : HK_BN;
        const int NP = (n + HK_MR - 1) / HK_MR * HK_MR;
        /* K and V read in place where they can be (float32, rows needing no
         * padding, no key past seqlen_k in a micro-kernel call), as the forward
         * does: each row block reads every tile again, and the copies cost. */
        const int in_place = d->dtype == FLASHCL_FLOAT32 && D == DP && n % HK_MR == 0;
        if (in_place) {
            const float *kt = (const float *)a->k + k_base + (size_t)n0 * d->k.stride_seq;
            const float *vt = (const float *)a->v + v_base + (size_t)n0 * d->v.stride_seq;
            HK(bwd_tile)(d, n0, NP, RP, kt, d->k.stride_seq, vt, d->v.stride_seq, &w, lse2, di, lo, hi);
            /* dQ[r] += sum_c dS^T[c][r] K[c]: keys in order, as the forward's P V. */
            for (int r = 0; r < RP; r += HK_MR)
                HK(mk_row)(DP, 0, n, w.dt + r, 1, HK_BM, kt, d->k.stride_seq, dq + (size_t)r * DP, DP, HK(ones));
        } else {
            HK(bwd_kv)(a, b, hk, n0, n, NP, DP, &w);
            HK(bwd_tile)(d, n0, NP, RP, w.kb, DP, w.vb, DP, &w, lse2, di, lo, hi);
            for (int r = 0; r < RP; r += HK_MR)
                HK(mk_row)(DP, 1, n, w.dt + r, 1, HK_BM, w.kb, DP, dq + (size_t)r * DP, DP, HK(ones));
        }
    }
    const size_t base = hk_layout_base(&a->o->dq, b, h);
    for (int r = 0; r < rows; ++r)
        HK(store_row)(a->dq, base + (size_t)(m0 + r) * a->o->dq.stride_seq, dq + (size_t)r * DP, 1.0f, D,
                      d->dtype, w.tmp);
}

/* Pass 0: D_r = sum_e dO[r][e] O[r][e] of rows [m0, m0+HK_BM) of query head h, in e
 * order. */
static HK_TARGET void HK(bwd_di)(const flashcl_host_bwd_args *a, int b, int h, long m0, float *ws) {
    const flashcl_attention_desc *d = a->d;
    const int D = d->head_dim;
    const int rows = d->seqlen_q - m0 < HK_BM ? (int)(d->seqlen_q - m0) : HK_BM;
    const size_t o_base = hk_layout_base(&d->out, b, h), g_base = hk_layout_base(&a->o->dout, b, h);
    float *restrict o = HK_ALIGNED(ws), *restrict g = o + 256;
    for (int r = 0; r < rows; ++r) {
        HK(convert)(o, a->out, o_base + (size_t)(m0 + r) * d->out.stride_seq, D, d->dtype);
        HK(convert)(g, a->dout, g_base + (size_t)(m0 + r) * a->o->dout.stride_seq, D, d->dtype);
        float s = 0.0f;
        for (int e = 0; e < D; ++e)
            s = HK_FMA(g[e], o[e], s);
        a->di[((size_t)b * d->heads_q + h) * d->seqlen_q + (size_t)(m0 + r)] = s;
    }
}

/* The kernel's entry: pass 0, 1 or 2 on block blk (of HK_BM rows, or HK_BN keys for
 * pass 1) of head h (a kv head for pass 1), batch b. */
static HK_TARGET void HK(bwd)(const flashcl_host_bwd_args *a, int pass, int b, int h, long blk, float *ws) {
    if (pass == 0)
        HK(bwd_di)(a, b, h, blk * HK_BM, ws);
    else if (pass == 1)
        HK(bwd_dkdv)(a, b, h, blk * HK_BN, ws);
    else
        HK(bwd_dq)(a, b, h, blk * HK_BM, ws);
}
