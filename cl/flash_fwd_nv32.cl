/* flash_fwd_nv32.cl: float32 FlashAttention-2 forward on NVIDIA tensor cores (sm_80+), 3xTF32.
 *
 * Same arguments and semantics as flash_fwd.cl; the host selects this file
 * (variant "nv-tf32") for float32 with head_dim <= 128 on compute capability
 * >= 8.0. It only builds with NVIDIA's OpenCL compiler (inline PTX).
 *
 * Precision. A TF32 tensor-core product keeps 10 mantissa bits of each
 * operand. Each float x is split into x = big + small, both TF32 (big =
 * x rounded to TF32, small = the rest truncated to TF32: FAST_SPLIT), and
 * a*b is summed as a_small*b_big + a_big*b_small + a_big*b_big in the float
 * accumulator: the dropped a_small*b_small (<= 2^-22 |a*b|) and the
 * truncation of the small parts (< 2^-21 each) bound each product's error
 * by ~2^-19.7 |a*b|, 2^-20.4 with the small parts rounded; over 2M random
 * products the worst was 2^-21.1 either way. That is a few float ulps (the
 * tensor cores' f32 accumulation is not IEEE round-to-nearest either), so
 * results are close to float32 accuracy, not bitwise an FMA kernel's (this
 * is CUTLASS's "3xTF32"). Every
 * result is checked against host_ref with the float32 tolerance, as for the
 * other kernels. Inputs within one TF32 rounding of FLT_MAX (|x| > ~3.4e38)
 * would round `big` to infinity and give NaN, as in CUTLASS.
 *
 * Work decomposition as flash_fwd_nv.cl with one 16-row fragment per warp:
 * a work-group of WARPS warps owns BLOCK_M = 16*WARPS query rows of one
 * (batch, query head); Q stays in registers (float) for the whole loop (in
 * __local above D=64: Q_IN_SMEM), O in f32 accumulator fragments; K/V tiles
 * of BLOCK_N keys stream through __local, double-buffered with cp.async when
 * two K+V pairs fit in ~47 KB, else K and V landing apart (KV_SPLIT).
 *
 * Fragment layouts (PTX ISA, mma.m16n8k8 with .tf32 inputs, .f32 accumulators;
 * lane = 0..31, g = lane / 4, t = lane % 4):
 *   A (16x8, row):  a0 = A[g][t]   a1 = A[g+8][t]   a2 = A[g][t+4]   a3 = A[g+8][t+4]
 *   B (8x8, col):   b0 = B[t][g]   b1 = B[t+4][g]
 *   C (16x8):       c0, c1 = C[g][2t, 2t+1]   c2, c3 = C[g+8][2t, 2t+1]
 * 32-bit elements cannot go through ldmatrix's 16-bit transpose, so
 * fragments are read from __local with plain loads; a row pitch of
 * HEAD_DIM_PAD + 4 floats (4 mod 8) makes both patterns below conflict-free.
 *   S = Q K^T: B[k][n] = K[key n][dim k]: b0 = K[g][t], b1 = K[g][t+4].
 *   O = P V:   the A fragment must come from P's accumulators, whose lane
 *     holds columns 2t, 2t+1, not t, t+4. The k index of a P V step only
 *     has to match between A and B, so it is permuted: k = t stands for key
 *     2t and k = t+4 for key 2t+1 of the 8-key step. Then a0 = c0, a1 = c2,
 *     a2 = c1, a3 = c3 of S's block, no shuffle, and b0 = V[2t][g],
 *     b1 = V[2t+1][g].
 *
 * Softmax, masks, LSE and empty rows exactly as in flash_fwd_nv.cl.
 */

/* RESCALE_SKIP (ONLINE_SOFTMAX_16, common_nv.cl): 1 leaves O alone in tiles where no row's
 * max moved; off here until timed (on in the decode kernel). */
#ifndef RESCALE_SKIP
#define RESCALE_SKIP 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 64 // exact head dimension (compile-time: every fragment loop unrolls)
#endif
#ifndef WARPS
/* warps per work-group, 16 query rows each (the host always passes it; these
 * are src/params_forward.c's H200 entries) */
#if HEAD_DIM <= 64
#define WARPS 4
#else
#define WARPS 3
#endif
#endif
#ifndef BLOCK_M
#define BLOCK_M (16 * WARPS)
#endif
#ifndef BLOCK_N
/* Keys per tile: two stages of 32 (D <= 64: 35 KB), or one stage of 16
 * after the Q block (D <= 128, three warps: 45 KB). */
#if HEAD_DIM <= 64
#define BLOCK_N 32
#else
#define BLOCK_N 16
#endif
#endif
#ifndef Q_IN_SMEM
/* 1: Q stays in __local and its fragments are read per tile, instead of
 * living in registers. Above D=64, Q (64 floats per lane at D=128) next to
 * O's 64 accumulators spilled (255 registers, 240 bytes of stack on the
 * H200, 28.8 TFLOP/s at (4,32,4096,128)). */
#define Q_IN_SMEM (HEAD_DIM > 64)
#endif

#define WG_SIZE (WARPS * 32)
#define HEAD_DIM_PAD (((HEAD_DIM) + 7) / 8 * 8) // head dims seen by the mma (k8 steps)
#define PITCH (HEAD_DIM_PAD + 4)                // __local row pitch of V, floats
#define K_STEPS (HEAD_DIM_PAD / 8)              // k8 steps of S = Q K^T; n8 blocks of O
#define S_FRAGS (BLOCK_N / 8)                   // n8 blocks of S; k8 steps of P V
#ifndef DIM_PERM
/* 1: S = Q K^T reads Q and K with one 16-byte load per lane per two k8
 * steps instead of four 4-byte ones, by numbering the head dims of each
 * 16-dim chunk in the order the lanes read them (see "S = Q K^T" below).
 * Needs whole 16-dim chunks. On above D=64 only: with FAST_SPLIT, H200,
 * (4,32,4096,D) TFLOP/s none / causal, D=128 44.9 / 42.4 with it and
 * KV_SPLIT against 40.3 / 39.8 without either; D=64 43.7 / 41.4 with it
 * against 49.9 / 49.4 without (BENCHMARKS.md). */
#define DIM_PERM (HEAD_DIM > 64)
#endif
#if DIM_PERM && HEAD_DIM_PAD % 16 != 0
#undef DIM_PERM
#define DIM_PERM 0
#endif
/* Q and K rows: 16 mod 32 floats apart under DIM_PERM, so that the eight
 * lanes of each 16-byte phase (rows g, g+1, chunks t = 0..3) hit eight
 * different bank quads; else as V. */
#define K_PITCH (DIM_PERM ? (HEAD_DIM_PAD + 16) / 32 * 32 + 16 : PITCH)
#define K_TILE_FLOATS (BLOCK_N * K_PITCH)
#define V_TILE_FLOATS (BLOCK_N * PITCH)
#define STAGE_FLOATS (K_TILE_FLOATS + V_TILE_FLOATS)
#define Q_FLOATS (BLOCK_M * K_PITCH)
#define KV_AT (Q_IN_SMEM * Q_FLOATS) /* K/V tiles after Q when it stays, else over it */
#ifndef KV_STAGES
#if (KV_AT + 2 * STAGE_FLOATS) * 4 <= 48000
#define KV_STAGES 2
#else
#define KV_STAGES 1
#endif
#endif
#define KV_FLOATS (KV_STAGES * STAGE_FLOATS) /* stage s: K at s*STAGE, V after it */
#ifndef KV_SPLIT
/* 1 (one stage only): K and V of a tile land separately, as in FA2: V's copy
 * runs during S and the softmax, the next tile's K during P V, in the same
 * one-stage buffers. 0: the one-stage loop waits for both before S (1 %
 * slower at D=128 on the H200 before FAST_SPLIT; with it, see DIM_PERM). */
#define KV_SPLIT 1
#endif
#if KV_SPLIT && KV_STAGES != 1
#undef KV_SPLIT
#define KV_SPLIT 0
#endif
#define SMEM_FLOATS (KV_AT + KV_FLOATS > Q_FLOATS ? KV_AT + KV_FLOATS : Q_FLOATS)

#if BLOCK_M != 16 * WARPS
#error "BLOCK_M must be 16*WARPS (one 16-row fragment per warp)"
#endif
#if BLOCK_N % 8 != 0
#error "BLOCK_N must be a multiple of 8"
#endif
#if KV_STAGES != 1 && KV_STAGES != 2
#error "KV_STAGES must be 1 or 2"
#endif
#ifndef FLASHCL_NV_PTX
#error "flash_fwd_nv32 is built with -DFLASHCL_NV_PTX (the PTX helpers in common_nv.cl)"
#endif
#if SMEM_FLOATS * 4 > 48000
#error "K and V tiles (or the Q block) exceed NVIDIA's ~47 KB of __local memory"
#endif
#if DTYPE != 0
#error "flash_fwd_nv32 needs DTYPE 0 (float32)"
#endif
#if HEAD_DIM > 128
#error "flash_fwd_nv32 keeps Q and O of 16 rows per warp in registers: HEAD_DIM <= 128"
#endif

/* ---- 3xTF32 ----------------------------------------------------------------------------- */

/* x rounded to TF32 (to nearest, ties away), in a 32-bit register. */
inline uint tf32(float x) {
    uint r;
    __asm__("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

/* x as big + small, both TF32. */
typedef struct tf32_pair {
    uint big, small;
} tf32_pair;

#ifndef FAST_SPLIT
/* 1: the split in integer instructions, no cvt: big is x to nearest TF32,
 * ties away (half a TF32 ulp added to the bits, then the 13 low bits
 * cleared: cvt.rna's value for finite x), small is the rest truncated to
 * TF32 (less than 2^-21 |x| off, against 2^-22 rounded). A NaN x stays NaN
 * in small (big may become -0), so products with it stay NaN.
 * 0: two cvt.rna.tf32 per element. The kernel split 400 values per lane
 * per tile and was bound by the conversions: on the H200, (4,32,4096,D)
 * f32 TFLOP/s without a mask went from 40.5 to 49.9 at D=64 and from 33.7
 * to 44.9 at D=128 (with DIM_PERM and KV_SPLIT; BENCHMARKS.md). */
#define FAST_SPLIT 1
#endif

inline tf32_pair split_tf32(float x) {
    tf32_pair p;
#if FAST_SPLIT
    p.big = (as_uint(x) + 0x1000u) & 0xffffe000u;
    p.small = as_uint(x - as_float(p.big)) & 0xffffe000u;
#else
    p.big = tf32(x);
    p.small = tf32(x - as_float(p.big));
#endif
    return p;
}

/* D += A B for one 16x8x8 block of TF32 operands. */
#define MMA_1688(c, a0, a1, a2, a3, b0, b1)                                                        \
    __asm__("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "                                  \
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                \
            : "+f"((c)[0]), "+f"((c)[1]), "+f"((c)[2]), "+f"((c)[3])                               \
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

/* c += a b for float fragments a[4] (A) and b0, b1 (B), small products first. */
#define MMA_3XTF32(c, a, b0, b1)                                                                   \
    do {                                                                                           \
        const tf32_pair b0_ = split_tf32(b0), b1_ = split_tf32(b1);                                \
        MMA_1688(c, (a)[0].small, (a)[1].small, (a)[2].small, (a)[3].small, b0_.big, b1_.big);     \
        MMA_1688(c, (a)[0].big, (a)[1].big, (a)[2].big, (a)[3].big, b0_.small, b1_.small);         \
        MMA_1688(c, (a)[0].big, (a)[1].big, (a)[2].big, (a)[3].big, b0_.big, b1_.big);             \
    } while (0)

/* ---- global -> __local tile copies ------------------------------------------------------ */

/* nv_copy_rows (common_nv.cl) moves 16-bit halves; a float row is two halves
 * per element, copied bit for bit, and zero halves make +0.0f. */
inline void copy_tile(__local float *smem, uint s_base, uint dst_off, __global const float *src,
                      ulong stride, int rows, int nrows, int vec, int tid, int pitch) {
    nv_copy_rows((__local ushort *)smem, s_base, 2 * dst_off, (__global const ushort *)src,
                 2 * stride, rows, nrows, vec, tid, 2 * HEAD_DIM, 2 * pitch, WG_SIZE);
}

/* ---- the kernel ------------------------------------------------------------------------- */

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void flash_fwd_nv32(FWD_ARGS) {
    __local float smem[SMEM_FLOATS] __attribute__((aligned(16)));

    NV_FWD_BLOCK;

    NV_FWD_HEADS(float);

    const uint s_base = shared_addr(smem);

    /* Q block -> __local -> A fragment values (float), once. Rows past nq are zero. */
    copy_tile(smem, s_base, 0, qb + (ulong)m0 * q_ss, q_ss, rows_q, BLOCK_M, q_vec, tid, K_PITCH);
    cp_wait();
    barrier(CLK_LOCAL_MEM_FENCE);
    /* This lane's Q: a0..a3 of k step kk at qr[8kk], qr[8 K_PITCH + 8kk], qr[8kk + 4],
     * qr[8 K_PITCH + 8kk + 4]; under DIM_PERM the 16-byte runs at qr + 16c and
     * qr + 8 K_PITCH + 16c of rows g and g+8 (see "S = Q K^T"). */
#if DIM_PERM
    __local const float *qr = smem + (warp * 16 + g) * K_PITCH + 4 * t;
#else
    __local const float *qr = smem + (warp * 16 + g) * K_PITCH + t;
#define Q_FRAG(kk, i) qr[((i)&1) * 8 * K_PITCH + 8 * (kk) + ((i) >> 1) * 4]
#endif
#if !Q_IN_SMEM && DIM_PERM
    float4 qa[K_STEPS / 2][2]; /* rows g, g+8; as q4 in the S loop */
#pragma unroll
    for (int c = 0; c < K_STEPS / 2; ++c) {
        qa[c][0] = *(__local const float4 *)(qr + 16 * c);
        qa[c][1] = *(__local const float4 *)(qr + 8 * K_PITCH + 16 * c);
    }
    /* Every warp has its Q before K overwrites the same bytes. */
    barrier(CLK_LOCAL_MEM_FENCE);
#elif !Q_IN_SMEM
    float qa[K_STEPS][4];
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            qa[kk][i] = Q_FRAG(kk, i);
    /* Every warp has its Q before K overwrites the same bytes. */
    barrier(CLK_LOCAL_MEM_FENCE);
#endif

    /* Visible keys: see flash_fwd_nv.cl. */
    const long2 blk_first = visible_keys(m0, nq, nk, win_left, win_right);
    const long2 blk_last = visible_keys(m0 + rows_q - 1, nq, nk, win_left, win_right);
    const long blk_lo = blk_first.x, blk_hi = blk_last.y;

    const int w0 = m0 + warp * 16; /* first row of this warp */
    NV_WARP_KEYS(w0, min(16, nq - w0));
    int row_lo[2], row_hi[2]; /* rows g and g+8 of this lane */
    NV_FRAG_KEYS(row_lo, row_hi, w0);

    const int softcap = softcap_log2 > 0.0f;
    const float sc = softcap ? 1.0f : q_mul; /* raw score units -> log2 units */

    float acc[K_STEPS][4];
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < K_STEPS; ++j)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    const int n_start = blk_lo <= blk_hi ? (int)(blk_lo / BLOCK_N) * BLOCK_N : nk;
    const int n_end = (int)blk_hi;
    /* Issue the copies of K, V, both, of tile n into the stage at float `at`. */
#define ISSUE_K(n, at)                                                                             \
    copy_tile(smem, s_base, (at), kb + (ulong)(n)*k_ss, k_ss, min(BLOCK_N, nk - (n)), BLOCK_N, k_vec, \
              tid, K_PITCH)
#define ISSUE_V(n, at)                                                                             \
    copy_tile(smem, s_base, (at) + K_TILE_FLOATS, vb + (ulong)(n)*v_ss, v_ss, min(BLOCK_N, nk - (n)), \
              BLOCK_N, v_vec, tid, PITCH)
#define ISSUE_KV(n, at)                                                                            \
    do {                                                                                           \
        ISSUE_K(n, at);                                                                            \
        ISSUE_V(n, at);                                                                            \
    } while (0)
#if KV_SPLIT
    if (n_start <= n_end)
        ISSUE_K(n_start, (uint)KV_AT);
#elif KV_STAGES == 2
    if (n_start <= n_end)
        ISSUE_KV(n_start, (uint)KV_AT);
#endif

    int stage = 0;
    for (int n0 = n_start; n0 <= n_end; n0 += BLOCK_N) {
        __local const float *k_tile = smem + KV_AT + stage * STAGE_FLOATS;
        __local const float *v_tile = k_tile + K_TILE_FLOATS;
#if KV_SPLIT
        /* K of tile n0 has landed for everyone, and every warp is done with
         * the previous tile's P V: V's buffer takes this tile's V now. */
        cp_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
        ISSUE_V(n0, (uint)KV_AT);
#elif KV_STAGES == 2
        /* Tile n0 has landed for everyone, and every warp is done with the
         * previous tile, whose buffers now receive the next one. */
        cp_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
        if (n0 + BLOCK_N <= n_end)
            ISSUE_KV(n0 + BLOCK_N, (uint)(KV_AT + (stage ^ 1) * STAGE_FLOATS));
#else
        barrier(CLK_LOCAL_MEM_FENCE); /* every warp is done with the previous tile */
        ISSUE_KV(n0, (uint)KV_AT);
        cp_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        const int n_last = n0 + BLOCK_N - 1;
        /* Warp-uniform: a warp none of whose rows sees this tile skips its math. */
        const int active = n0 <= w_hi && n_last >= w_lo;
        float s[S_FRAGS][4];
        if (active) {
            /* ---- S = Q K^T ----
             * The k index of a step only has to mean the same head dim in A and B.
             * Plainly k = t, t+4 are dims 8kk + t, 8kk + t + 4. Under DIM_PERM, of
             * each 16 dims 16c .. 16c+15 lane t takes 16c + 4t .. 16c + 4t + 3 in
             * one load: step 2c reads k = t, t+4 as the first two, step 2c+1 as
             * the last two, so each step still covers 8 distinct dims. */
#pragma unroll
            for (int j = 0; j < S_FRAGS; ++j)
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#if DIM_PERM
#pragma unroll
            for (int c = 0; c < K_STEPS / 2; ++c) {
                /* q4[r].x,y: a (row g / g+8) of step 2c at k = t, t+4; .z,w: of step 2c+1 */
#if Q_IN_SMEM
                const float4 q4[2] = {*(__local const float4 *)(qr + 16 * c),
                                      *(__local const float4 *)(qr + 8 * K_PITCH + 16 * c)};
#else
                const float4 q4[2] = {qa[c][0], qa[c][1]};
#endif
                float4 k4[S_FRAGS];
#pragma unroll
                for (int j = 0; j < S_FRAGS; ++j)
                    k4[j] = *(__local const float4 *)(k_tile + (8 * j + g) * K_PITCH + 16 * c + 4 * t);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    tf32_pair a[4];
                    a[0] = split_tf32(h ? q4[0].z : q4[0].x);
                    a[1] = split_tf32(h ? q4[1].z : q4[1].x);
                    a[2] = split_tf32(h ? q4[0].w : q4[0].y);
                    a[3] = split_tf32(h ? q4[1].w : q4[1].y);
#pragma unroll
                    for (int j = 0; j < S_FRAGS; ++j)
                        MMA_3XTF32(s[j], a, h ? k4[j].z : k4[j].x, h ? k4[j].w : k4[j].y);
                }
            }
#else
#pragma unroll
            for (int kk = 0; kk < K_STEPS; ++kk) {
                tf32_pair a[4];
#pragma unroll
                for (int i = 0; i < 4; ++i)
#if Q_IN_SMEM
                    a[i] = split_tf32(Q_FRAG(kk, i));
#else
                    a[i] = split_tf32(qa[kk][i]);
#endif
#pragma unroll
                for (int j = 0; j < S_FRAGS; ++j) {
                    __local const float *kr = k_tile + (8 * j + g) * K_PITCH + 8 * kk + t;
                    MMA_3XTF32(s[j], a, kr[0], kr[4]);
                }
            }
#endif

            /* ---- soft-cap (rare; precise tanh like the portable kernel) ---- */
            if (softcap)
                SOFTCAP_16(s, S_FRAGS, q_mul, softcap_log2);

            /* ---- mask, only on tiles crossing some row's window edge or nk ---- */
            if (!(n0 >= w_all_lo && n_last <= w_all_hi))
                MASK_16(s, S_FRAGS, n0, row_lo, row_hi, n0 < w_all_lo);

            /* ---- online softmax: rows g (e = 0,1) and g+8 (e = 2,3) ---- */
            ONLINE_SOFTMAX_16(s, S_FRAGS, acc, K_STEPS, m_run, l_run, sc);
        }
#if KV_SPLIT
        /* V has landed, and every warp is done with K: the next K goes in. */
        cp_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
        if (n0 + BLOCK_N <= n_end)
            ISSUE_K(n0 + BLOCK_N, (uint)KV_AT);
#endif
        if (active) {
            /* ---- O += P V: 8 keys per step, k permuted (see the header) ---- */
#pragma unroll
            for (int sj = 0; sj < S_FRAGS; ++sj) {
                tf32_pair a[4];
                a[0] = split_tf32(s[sj][0]);
                a[1] = split_tf32(s[sj][2]);
                a[2] = split_tf32(s[sj][1]);
                a[3] = split_tf32(s[sj][3]);
                __local const float *vr = v_tile + (8 * sj + 2 * t) * PITCH + g;
#pragma unroll
                for (int j = 0; j < K_STEPS; ++j)
                    MMA_3XTF32(acc[j], a, vr[8 * j], vr[PITCH + 8 * j]);
            }
        }
        stage ^= KV_STAGES - 1;
    }
#undef ISSUE_KV
#undef ISSUE_K
#undef ISSUE_V
#undef Q_FRAG
    cp_wait();

    /* ---- epilogue: O / l and LSE ---- */
    __global float *ob = o + (o_off + b * o_sb + hq * o_sh);
    const int o_pair = (HEAD_DIM % 2 == 0) && ((ulong)ob % 8 == 0) && (o_ss % 2 == 0);
#define STORE_PAIR32(orow, d, x0, x1) (*(__global float2 *)((orow) + (d)) = (float2)((x0), (x1)))
#define STORE_ONE32(orow, d, x) ((orow)[d] = (x))
    NV_FWD_STORE_FRAG(acc, K_STEPS, m_run, l_run, sc, w0, float, ob, o_pair, STORE_PAIR32, STORE_ONE32);
#undef STORE_PAIR32
#undef STORE_ONE32
}
