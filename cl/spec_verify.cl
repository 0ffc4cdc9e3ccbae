/* spec_verify.cl: speculative-decoding verification, one work-group per sequence, bit-exact with host_ref.
 *
 * Per sequence b (work-group b), k draft tokens and k+1 target rows:
 *
 *   draft [b][k]    q [b][k][V]    p [b][k+1][V]    ->   accepted[b], tokens[b][k+1]
 *
 *   1. validate: draft tokens in range; each q row (sampling only) and each p
 *      row: probabilities finite, >= 0, fixed-point sum within tolerance;
 *      logits: no NaN/+inf, maximum and (sampling) fixed-point total Z';
 *   2. walk the drafts: accept d_i iff u * q(d_i) Z'_p < p(d_i) Z'_q (greedy:
 *      iff d_i = argmax p_i); at the first rejection sample the residual
 *      max(0, p Z'_q - q Z'_p) and stop;
 *   3. all accepted: sample the bonus token from p_k (greedy: argmax).
 *
 * The rules are host_ref/ref_spec.c's, which this kernel must match bit for
 * bit. Two things make that possible whatever the work-group size:
 *   - every sum is a sum of 64-bit integers (weights in fixed point,
 *     trunc(w * 2^39)), which is associative, so the tree reductions below
 *     give the same total as the reference's sequential loop;
 *   - every float step is one correctly rounded operation, with contraction
 *     into fma/mad forbidden (the pragma below; OpenCL C allows contraction
 *     by default), and exp2 is a fixed polynomial instead of the built-in.
 * Sampling ("the first token whose inclusive prefix sum exceeds T") splits the
 * vocabulary into WG contiguous chunks: work-item l sums chunk l, work-item 0
 * walks the chunk totals to find the chunk holding T, and that chunk's owner
 * walks its tokens. Random numbers come from Philox4x32-10 keyed by the seed,
 * with counter (b, i, offset): no state is shared between work-groups.
 */
#pragma OPENCL FP_CONTRACT OFF

#ifndef WG
#define WG 64 // work-items per sequence; a power of two, 1 .. 256
#endif
#ifndef LOGITS
#define LOGITS 0 // 1: q and p hold logits (softmax with temperature inside)
#endif
#ifndef GREEDY
#define GREEDY 0 // 1: argmax verification, no random numbers, q unused
#endif
#define MAX_K 64 // FLASHCL_SPEC_MAX_DRAFT

#define BAD_VALUE (-1)
#define BAD_NEGATIVE (-2)
#define BAD_SUM (-3)
#define BAD_TOKEN (-4)
#define BAD_ROW (-5)

/* Philox4x32-10 (Random123's constants). */
inline uint4 philox4x32_10(uint4 c, uint2 k) {
    for (int r = 0; r < 10; ++r) {
        uint hi0 = mul_hi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        uint hi1 = mul_hi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = (uint4)(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k += (uint2)(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}

/* exp2 on [-40, 0], 0 below: the reference's polynomial, step for step. */
inline float spec_exp2(float x) {
    if (!(x >= -40.0f))
        return 0.0f;
    float n = floor(x);
    float f = x - n;
    const float c[10] = {1.0f,
                         0.693147180559945f,
                         0.240226506959101f,
                         0.0555041086648216f,
                         0.00961812910762848f,
                         0.00133335581464284f,
                         0.000154035303933816f,
                         1.52527338040598e-05f,
                         1.32154867901443e-06f,
                         1.01780860092397e-07f};
    float p = c[9];
    for (int j = 8; j >= 0; --j) {
        float t = p * f;
        p = t + c[j];
    }
    return ldexp(p, (int)n);
}

/* A token's weight: its probability, or exp2((logit - max) * s). */
inline float weight(__global const float *row, int y, int logits, float m, float s) {
    if (!logits)
        return row[y];
    float t = row[y] - m;
    return spec_exp2(t * s);
}

/* ---- work-group reductions (WG is a power of two) ------------------------------ */

inline ulong reduce_sum(__local ulong *buf, ulong v, int lid) {
    buf[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (lid < h)
            buf[lid] += buf[lid + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    ulong r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline int reduce_or(__local int *buf, int v, int lid) {
    buf[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (lid < h)
            buf[lid] |= buf[lid + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    int r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline float reduce_max(__local float *buf, float v, int lid) {
    buf[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (lid < h)
            buf[lid] = fmax(buf[lid], buf[lid + h]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* argmax over a row, the smallest index on ties (values are not NaN). */
inline int row_argmax(__global const float *row, int V, __local float *fbuf, __local int *ibuf, int lid) {
    float best = -INFINITY;
    int at = V; // "none yet": loses every tie
    for (int y = lid; y < V; y += WG)
        if (row[y] > best || at == V) {
            best = row[y];
            at = y;
        }
    fbuf[lid] = best;
    ibuf[lid] = at;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (lid < h) {
            float o = fbuf[lid + h];
            int oi = ibuf[lid + h];
            if (oi < V && (ibuf[lid] == V || o > fbuf[lid] || (o == fbuf[lid] && oi < ibuf[lid]))) {
                fbuf[lid] = o;
                ibuf[lid] = oi;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    int r = ibuf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* Fixed-point weights of token y for sampling: the residual
 *   trunc(max(0, w_p * zq - w_q * zp) * 2^(39 - e))
 * (when `residual`), and trunc(w_p * 2^39), the fallback and bonus weights. */
inline ulong p_fixed(__global const float *prow, int y, float mp, float s) {
    return (ulong)(weight(prow, y, LOGITS, mp, s) * 0x1p39f);
}

inline ulong residual_fixed(__global const float *prow, __global const float *qrow, int y, float mp, float mq,
                            float s, float zp, float zq, int e) {
    float a = weight(prow, y, LOGITS, mp, s) * zq;
    float c = weight(qrow, y, LOGITS, mq, s) * zp;
    float diff = a - c;
    return diff > 0.0f ? (ulong)ldexp(diff, 39 - e) : 0;
}

/* Control flow note: PoCL's work-group compiler (and the OpenCL rules on
 * barriers) want every barrier reached by all work-items through simple
 * control flow, so barriers sit only in straight-line code and loops with
 * uniform, fixed trip counts; the decisions (which draft is rejected) are
 * made without barriers, by every work-item alike, from the same values. */
__kernel void spec_verify(__global const int *restrict draft, __global const float *restrict q,
                          __global const float *restrict p, __global int *restrict accepted,
                          __global int *restrict tokens, ulong draft_off, ulong q_off, ulong p_off,
                          ulong acc_off, ulong tok_off, int K, int V, float s, ulong lo, ulong hi, uint key0,
                          uint key1, uint off0, uint off1) {
    __local ulong ubuf[WG], ubuf2[WG];
    __local float fbuf[WG];
    __local int ibuf[WG];
    __local int pick[2];
    __local ulong rem[1];
    __local float zq[MAX_K], zp[MAX_K + 1], mq[MAX_K], mp[MAX_K + 1];
#if GREEDY
    __local int amax[MAX_K + 1];
#endif
    const int lid = (int)get_local_id(0);
    const int b = (int)get_group_id(0);
    __global const int *db = draft + draft_off + (ulong)b * K;
    __global const float *qb = q + q_off + (ulong)b * K * V;
    __global const float *pb = p + p_off + (ulong)b * (K + 1) * V;
    __global int *out = tokens + tok_off + (ulong)b * (K + 1);

    /* 1. Validation, in the reference's order (drafts, q rows, p rows): the
     *    first bad row decides the code; every row is summarised regardless. */
    int bad = 0;
    for (int i = 0; i < K; ++i)
        if (db[i] < 0 || db[i] >= V)
            bad = BAD_TOKEN;
    for (int row = GREEDY ? K : 0; row < 2 * K + 1; ++row) {
        const int is_q = row < K, i = is_q ? row : row - K;
        __global const float *x = is_q ? qb + (ulong)i * V : pb + (ulong)i * V;
        float z = 1.0f, m = 0.0f;
        int row_bad;
#if !LOGITS
        ulong sum = 0;
        int flags = 0;
        for (int y = lid; y < V; y += WG) {
            float v = x[y];
            if (!isfinite(v))
                flags |= 1;
            else if (v < 0.0f)
                flags |= 2;
            else
                sum += (ulong)(v * 0x1p39f);
        }
        flags = reduce_or(ibuf, flags, lid);
        sum = reduce_sum(ubuf, sum, lid);
        row_bad = (flags & 1) ? BAD_VALUE : (flags & 2) ? BAD_NEGATIVE : (sum < lo || sum > hi) ? BAD_SUM : 0;
#else
        float mx = -INFINITY;
        int flags = 0;
        for (int y = lid; y < V; y += WG) {
            float v = x[y];
            if (isnan(v) || v == INFINITY)
                flags = 1;
            else
                mx = fmax(mx, v);
        }
        flags = reduce_or(ibuf, flags, lid);
        m = reduce_max(fbuf, mx, lid);
        row_bad = flags ? BAD_VALUE : m == -INFINITY ? BAD_ROW : 0;
#if !GREEDY
        ulong sum = 0;
        if (!row_bad)
            for (int y = lid; y < V; y += WG)
                sum += (ulong)(weight(x, y, 1, m, s) * 0x1p39f);
        sum = reduce_sum(ubuf, sum, lid);
        z = ldexp(convert_float_rte(sum), -39);
#endif
#endif
        if (!bad)
            bad = row_bad;
        if (lid == 0) {
            if (is_q) {
                zq[i] = z;
                mq[i] = m;
            } else {
                zp[i] = z;
                mp[i] = m;
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* 2. Walk the drafts (no barriers: every work-item takes the same path). */
    int n = 0, last = -1;
#if GREEDY
    for (int i = 0; i <= K; ++i) {
        int a = row_argmax(pb + (ulong)i * V, V, fbuf, ibuf, lid);
        if (lid == 0)
            amax[i] = a;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!bad) {
        while (n < K && db[n] == amax[n])
            ++n;
        last = amax[n];
    }
#else
    const uint2 key = (uint2)(key0, key1);
    ulong r = 0;
    if (!bad) {
        int stop = 0;
        for (int i = 0; i < K && !stop; ++i) {
            const int x = db[i];
            uint4 w = philox4x32_10((uint4)((uint)b, (uint)i, off0, off1), key);
            float u = (float)(w.x >> 8) * 0x1p-24f;
            float a = weight(pb + (ulong)i * V, x, LOGITS, mp[i], s) * zq[i];
            float c = weight(qb + (ulong)i * V, x, LOGITS, mq[i], s) * zp[i];
            float uc = u * c;
            if (uc < a) {
                ++n;
            } else {
                stop = 1;
                r = ((ulong)w.w << 32) | w.z;
            }
        }
        if (!stop) {
            uint4 w = philox4x32_10((uint4)((uint)b, (uint)K, off0, off1), key);
            r = ((ulong)w.w << 32) | w.z;
        }
    }

    /* 3. Sample: the residual of row n when n < K (falling back to p_n's
     *    weights when it totals 0), else the bonus from p_K. Both weight sets
     *    are summed in one pass; each work-item owns a contiguous chunk. */
    const int residual = n < K;
    __global const float *prow = pb + (ulong)n * V;
    __global const float *qrow = qb + (ulong)(residual ? n : 0) * V;
    const float rmp = mp[n], rmq = residual ? mq[n] : 0.0f, rzp = zp[n], rzq = residual ? zq[n] : 1.0f;
    int e = 0;
    frexp(rzq, &e);
    const int chunk = (V + WG - 1) / WG;
    const int y0 = bad ? V : min(V, lid * chunk), y1 = min(V, y0 + chunk);
    ulong mine_r = 0, mine_p = 0;
    for (int y = y0; y < y1; ++y) {
        mine_p += p_fixed(prow, y, rmp, s);
        if (residual)
            mine_r += residual_fixed(prow, qrow, y, rmp, rmq, s, rzp, rzq, e);
    }
    ubuf[lid] = mine_r;
    ubuf2[lid] = mine_p;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
        ulong total_r = 0, total_p = 0;
        for (int j = 0; j < WG; ++j) {
            total_r += ubuf[j];
            total_p += ubuf2[j];
        }
        const int use_r = total_r > 0; /* else p's weights */
        const ulong total = use_r ? total_r : total_p;
        const ulong t = mul_hi(r, total);
        ulong pre = 0;
        pick[0] = -1;
        pick[1] = use_r;
        for (int j = 0; j < WG && pick[0] < 0; ++j) {
            const ulong part = use_r ? ubuf[j] : ubuf2[j];
            if (pre + part > t) {
                pick[0] = j;
                rem[0] = t - pre;
            }
            pre += part;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == pick[0]) {
        const int use_r = pick[1];
        const ulong t = rem[0];
        ulong acc = 0;
        int found = -1;
        for (int y = y0; y < y1 && found < 0; ++y) {
            acc += use_r ? residual_fixed(prow, qrow, y, rmp, rmq, s, rzp, rzq, e) : p_fixed(prow, y, rmp, s);
            if (acc > t)
                found = y;
        }
        ibuf[0] = found;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    last = ibuf[0];
#endif

    if (lid == 0) {
        if (bad) {
            accepted[acc_off + b] = bad;
            for (int j = 0; j <= K; ++j)
                out[j] = -1;
        } else {
            for (int j = 0; j < n; ++j)
                out[j] = db[j];
            out[n] = last;
            for (int j = n + 1; j <= K; ++j)
                out[j] = -1;
            accepted[acc_off + b] = n;
        }
    }
}
