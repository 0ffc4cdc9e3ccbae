/* fp8_vt_pack.cl: FP8 V transposed for the Hopper FP8 forward's P V product (nv-wgmma-fp8).
 *
 * 8-bit warpgroup MMA reads its B operand K-major only, so cl/flash_fwd_sm90_fp8.cl needs V as
 * Vt (head dims x keys). Transposing in the forward cost every tile a load, a byte shuffle and 32
 * stores a work-item on its critical path; this pass writes Vt once, to global memory, before
 * the forward, which then copies Vt tiles as it copies K tiles. Plain OpenCL C: it runs, and is
 * tested (tests/test_fp8_forward.c), on any device.
 *
 * Vt of (batch b, kv head hk) is VT_ROWS rows of vt_keys bytes (nk rounded up to VT_TILE) at
 * vt_off + ((b * heads_k + hk) * VT_ROWS) * vt_keys, heads_k = get_num_groups(1): row d is head dim d,
 * each VT_TILE-key tile's keys in VT_KEY order, zero past nk and past HEAD_DIM. v rows are
 * 16-byte aligned (the forward's condition) and HEAD_DIM a multiple of 16.
 *
 * One work-group of 128 a tile. Its keys' rows go into __local as they are, one 16-byte chunk a
 * work-item (chunk c of key n at chunk c ^ VT_SWZ(n) of its 128-byte row); then each work-item
 * takes four head dims (d4: dims 4 d4 .. 4 d4 + 3) of one 16-key group G, reads the 16 words that
 * hold them (one a key, in VT_KEY order), transposes them as four 4x4 byte blocks in registers
 * and writes four 16-byte chunks of Vt, eight work-items covering a row's 128 bytes. A word
 * access where a byte access was: 8x fewer __local operations. VT_SWZ makes both phases free of
 * bank conflicts: the stores of one quarter-warp (one key's chunks at D=128, two keys' at 64,
 * four at 32) land in distinct banks, and the loads of a warp (G 0..7 by four d4 and one
 * position of the group) in 32. */
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#if HEAD_DIM < 16 || HEAD_DIM > 128 || HEAD_DIM % 16
#error "fp8_vt_pack takes HEAD_DIM 16..128, a multiple of 16"
#endif
#define VT_TILE 128                              /* keys a tile: the forward's BLOCK_N */
#define VT_ROWS ((HEAD_DIM + 63) / 64 * 64)      /* the forward's 64-dim panels */

/* The key (0..VT_TILE-1) at k position c of a tile's Vt rows. The forward's PACK_P puts lane
 * (g, t)'s scores of keys 16G + 2t, 16G + 2t + 1, 16G + 8 + 2t, 16G + 9 + 2t of a 16-key group
 * in one A register, k positions 16G + 4t .. 16G + 4t + 3: Vt follows that order, so P needs no
 * shuffle between lanes (cl/flash_fwd_sm90_fp8.cl, "P"). */
#define VT_KEY(c) (((c) & ~15) + 2 * (((c) >> 2) & 3) + ((c) & 1) + 8 * (((c) >> 1) & 1))

/* The chunk swizzle of key n's row in __local: its 16-key group (the phase-two loads), and bits of
 * n that tell apart the keys one quarter-warp stores (the phase-one stores). */
#define VT_SWZ(n) ((((n) >> 4) ^ (((n)&1) << 2) ^ ((n)&2)) & 7)

/* Row r (0..3) of a 4x4 byte block: byte r of each of a0..a3 (a0's in the lowest byte). */
inline uint4 transpose4x4(uint a0, uint a1, uint a2, uint a3) {
    /* pairs first: x holds bytes 0 and 2 of a0, a1 (interleaved), y bytes 1 and 3; then halves */
    const uint x01 = (a0 & 0x00ff00ffu) | ((a1 << 8) & 0xff00ff00u);
    const uint y01 = ((a0 >> 8) & 0x00ff00ffu) | (a1 & 0xff00ff00u);
    const uint x23 = (a2 & 0x00ff00ffu) | ((a3 << 8) & 0xff00ff00u);
    const uint y23 = ((a2 >> 8) & 0x00ff00ffu) | (a3 & 0xff00ff00u);
    return (uint4)((x01 & 0xffffu) | (x23 << 16), (y01 & 0xffffu) | (y23 << 16), (x01 >> 16) | (x23 & 0xffff0000u),
                   (y01 >> 16) | (y23 & 0xffff0000u));
}

__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void
fp8_vt_pack(__global const uchar *restrict v, TENSOR_ARGS(v), __global uchar *restrict vt, ulong vt_off, int nk,
            int vt_keys) {
    __local uint4 tile[VT_TILE * 8]; /* 128-byte rows, one a key */
    const int tid = (int)get_local_id(0), n0 = (int)get_group_id(0) * VT_TILE;
    const int hk = (int)get_group_id(1), b = (int)get_group_id(2);
    __global const uchar *vb = v + v_off + (ulong)b * v_sb + (ulong)hk * v_sh;
    for (int i = tid; i < VT_TILE * (HEAD_DIM / 16); i += 128) {
        const int key = i / (HEAD_DIM / 16), c = i % (HEAD_DIM / 16);
        tile[key * 8 + (c ^ VT_SWZ(key))] =
            n0 + key < nk ? *(__global const uint4 *)(vb + (ulong)(n0 + key) * v_ss + 16 * c) : (uint4)(0u);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    __local const uint *words = (__local const uint *)tile;
    __global uchar *out = vt + vt_off + ((ulong)(b * (int)get_num_groups(1) + hk) * VT_ROWS) * (ulong)vt_keys + n0;
    for (int i = tid; i < (VT_ROWS / 4) * (VT_TILE / 16); i += 128) {
        const int d4 = i / (VT_TILE / 16), G = i % (VT_TILE / 16);
        uint rows[4][4] = {{0u}}; /* rows 4 d4 + 0..3, words 0..3 of this group's 16 bytes */
        if (4 * d4 < HEAD_DIM) {
            uint w[16]; /* position j of the group: dims 4 d4.. of key 16 G + VT_KEY(j) */
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const int key = VT_KEY(16 * G + j);
                w[j] = words[key * 32 + (d4 ^ (4 * VT_SWZ(key)))];
            }
#pragma unroll
            for (int m = 0; m < 4; ++m) { /* word m of each row: positions 4m .. 4m + 3 */
                const uint4 t = transpose4x4(w[4 * m], w[4 * m + 1], w[4 * m + 2], w[4 * m + 3]);
                rows[0][m] = t.x, rows[1][m] = t.y, rows[2][m] = t.z, rows[3][m] = t.w;
            }
        }
        /* 16-byte aligned: vt_keys and n0 are multiples of VT_TILE */
#pragma unroll
        for (int e = 0; e < 4; ++e)
            *(__global uint4 *)(out + (ulong)(4 * d4 + e) * (ulong)vt_keys + 16 * G) =
                (uint4)(rows[e][0], rows[e][1], rows[e][2], rows[e][3]);
    }
}

/* The k position (0..VT_TILE-1) of key n's bytes in its tile's Vt rows: VT_KEY's inverse. */
#define VT_POS(n) (((n) & ~15) + 4 * (((n) >> 1) & 3) + 2 * (((n) >> 3) & 1) + ((n)&1))

/* fp8_vt_unpack: Vt (as fp8_vt_pack writes it, at vt_off) back into V, packed [batch][nk][heads_k]
 * [HEAD_DIM] bytes, for the kernels that read V in rows (a forward given V packed,
 * flashcl_attention_desc.v_packed, on any other kernel than the Hopper FP8 one). One work-item
 * a key of one (batch, kv head); global (nk, heads_k, batch). Not fast: the CPU and portable
 * kernels it serves then read every byte again, many times over. */
__kernel void fp8_vt_unpack(__global const uchar *restrict vt, ulong vt_off, int vt_keys, __global uchar *restrict v) {
    const int n = (int)get_global_id(0), hk = (int)get_global_id(1), b = (int)get_global_id(2);
    const int heads_k = (int)get_global_size(1), nk = (int)get_global_size(0);
    __global const uchar *in = vt + vt_off + ((ulong)(b * heads_k + hk) * VT_ROWS) * (ulong)vt_keys +
                               (n & ~(VT_TILE - 1)) + VT_POS(n & (VT_TILE - 1));
    __global uchar *row = v + (((ulong)b * (ulong)nk + (ulong)n) * (ulong)heads_k + (ulong)hk) * HEAD_DIM;
    for (int d = 0; d < HEAD_DIM; ++d)
        row[d] = in[(ulong)d * (ulong)vt_keys];
}
