/* merge.cl: exact merging of partial attention results (public merge, split-KV combine).
 *
 * A partial result over a key set K_s is a normalised output O_s and its
 * log-sum-exp L_s = log sum_{j in K_s} exp(score_j). Over disjoint sets the
 * union's softmax is a weighted mean of the parts:
 *
 *   m = max_s L_s,   w_s = exp(L_s - m),   W = sum_s w_s
 *   O = sum_s (w_s / W) O_s,                L = m + log W
 *
 * which is exact (no approximation beyond float rounding) and needs no
 * running state, so any number of parts merge in one pass. A part whose key
 * set was empty (or fully masked) carries L_s = -inf and gets weight 0; when
 * every part is -inf the row saw nothing: O = 0 and L = -inf, as the forward
 * kernels write, and -inf - -inf is never formed.
 *
 * Two kernels, one work-item per output element (d, row), so a warp reads
 * consecutive head-dim elements; the LSE of a row is read by each of its
 * work-items (it is cached) and written by the d = 0 one:
 *   attn_merge    two parts in the caller's layouts and storage dtype:
 *                 o1, o2, out [batch][seqlen][heads][head_dim] (offset +
 *                 strides), lse1, lse2, lse_out float [batch][heads][seqlen]
 *   attn_combine  `splits` float parts from the split-KV scratch of
 *                 paged_attention.cl: part_o [split][token][head][d],
 *                 part_lse [split][token][head] (one buffer, part_lse from
 *                 element part_lse_off); out [token][head][d] in the
 *                 storage dtype (offset + strides), lse float [head][token].
 * Nothing here is tunable: head_dim and every size are run-time arguments,
 * so one binary per dtype serves every shape.
 */

/* Weight of a part relative to the row maximum; 0 for an empty part. */
inline float part_weight(float lse, float m) {
    return lse == -INFINITY ? 0.0f : exp(lse - m);
}

__kernel void attn_merge(__global const elem_t *o1, __global const float *lse1,
                         __global const elem_t *o2, __global const float *lse2,
                         __global elem_t *out, __global float *lse_out,
                         /* element offsets and strides (batch, seq, head) */
                         ulong o1_off, ulong o1_sb, ulong o1_ss, ulong o1_sh,
                         ulong o2_off, ulong o2_sb, ulong o2_ss, ulong o2_sh,
                         ulong out_off, ulong out_sb, ulong out_ss, ulong out_sh,
                         ulong lse1_off, ulong lse2_off, ulong lse_out_off, int has_lse_out,
                         int seqlen, int heads) {
    /* No restrict: out may be o1 or o2 (in place), which is safe because each
     * work-item reads its element of both inputs before writing it. */
    const int d = (int)get_global_id(0);
    const int sh = (int)get_global_id(1); /* seq * heads + head */
    const int b = (int)get_global_id(2);
    const int n = sh / heads, h = sh % heads;
    const ulong lrow = ((ulong)b * heads + h) * seqlen + n;
    const float l1 = lse1[lse1_off + lrow], l2 = lse2[lse2_off + lrow];
    const float m = fmax(l1, l2);
    const ulong i1 = o1_off + b * o1_sb + n * o1_ss + h * o1_sh + d;
    const ulong i2 = o2_off + b * o2_sb + n * o2_ss + h * o2_sh + d;
    const ulong io = out_off + b * out_sb + n * out_ss + h * out_sh + d;
    if (m == -INFINITY) {
        /* Neither side saw a key. The inputs are not read: a side that saw
         * nothing may hold anything, NaN included. */
        STORE_ELEM(out, io, 0.0f);
        if (has_lse_out && d == 0)
            lse_out[lse_out_off + lrow] = -INFINITY;
        return;
    }
    const float w1 = part_weight(l1, m), w2 = part_weight(l2, m);
    const float inv = 1.0f / (w1 + w2); /* >= 1/2: the max part has weight 1 */
    /* An empty side contributes exactly nothing, even if its O is garbage. */
    float x = 0.0f;
    if (w1 > 0.0f)
        x += w1 * LOAD_ELEM(o1, i1);
    if (w2 > 0.0f)
        x += w2 * LOAD_ELEM(o2, i2);
    STORE_ELEM(out, io, x * inv);
    if (has_lse_out && d == 0)
        lse_out[lse_out_off + lrow] = m + log(w1 + w2);
}

__kernel void attn_combine(__global const float *restrict part, __global elem_t *restrict out,
                           __global float *restrict lse, ulong part_lse_off, ulong out_off,
                           ulong out_ss, ulong out_sh, ulong lse_off, int has_lse, int splits, int total_q, int heads,
                           int head_dim) {
    const int d = (int)get_global_id(0);
    const int h = (int)get_global_id(1);
    const int t = (int)get_global_id(2);
    const ulong row = (ulong)t * heads + h;           /* [token][head] */
    const ulong split_stride = (ulong)total_q * heads; /* rows per split */
    __global const float *part_o = part, *part_lse = part + part_lse_off;
    float m = -INFINITY;
    for (int s = 0; s < splits; ++s)
        m = fmax(m, part_lse[s * split_stride + row]);
    const ulong io = out_off + (ulong)t * out_ss + (ulong)h * out_sh + d;
    if (m == -INFINITY) {
        STORE_ELEM(out, io, 0.0f);
        if (has_lse && d == 0)
            lse[lse_off + (ulong)h * total_q + t] = -INFINITY;
        return;
    }
    float x = 0.0f, w_sum = 0.0f;
    for (int s = 0; s < splits; ++s) {
        const float w = part_weight(part_lse[s * split_stride + row], m);
        if (w > 0.0f) /* an empty split never wrote a meaningful O */
            x += w * part_o[(s * split_stride + row) * head_dim + d];
        w_sum += w;
    }
    STORE_ELEM(out, io, x / w_sum);
    if (has_lse && d == 0)
        lse[lse_off + (ulong)h * total_q + t] = m + log(w_sum);
}
