/* fp8_vt_pack.cl: FP8 V transposed for the Hopper FP8 forward's P V product (nv-wgmma-fp8).
 *
 * 8-bit warpgroup MMA reads its B operand K-major only, so cl/flash_fwd_sm90_fp8.cl needs V as
 * Vt (head dims x keys). Transposing in the forward cost every tile a load, a byte shuffle and 32
 * stores a work-item on its critical path; this pass writes Vt once, to global memory, before
 * the forward, which then copies Vt tiles as it copies K tiles. Plain OpenCL C: it runs, and is
 * tested (tests/test_fp8_forward.c), on any device.
 *
 * Vt of (batch b, kv head hk) is VT_ROWS rows of vt_keys bytes (nk rounded up to VT_TILE) at
 * ((b * heads_k + hk) * VT_ROWS) * vt_keys, heads_k = get_num_groups(1): row d is head dim d,
 * each VT_TILE-key tile's keys in VT_KEY order, zero past nk and past HEAD_DIM. v rows are
 * 16-byte aligned (the forward's condition) and HEAD_DIM a multiple of 16.
 *
 * One work-group of 128 a tile: its keys' rows into __local (one 16-byte load a chunk), then
 * 16-byte chunks of Vt out, eight work-items a row (128 contiguous bytes). Rows of
 * VT_PACK_PITCH = 129 bytes put the eight keys, 16 apart, that a warp reads at once in eight
 * banks. */
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#if HEAD_DIM < 16 || HEAD_DIM > 128 || HEAD_DIM % 16
#error "fp8_vt_pack takes HEAD_DIM 16..128, a multiple of 16"
#endif
#define VT_TILE 128                              /* keys a tile: the forward's BLOCK_N */
#define VT_ROWS ((HEAD_DIM + 63) / 64 * 64)      /* the forward's 64-dim panels */
#define VT_PACK_PITCH 129

/* The key (0..VT_TILE-1) at k position c of a tile's Vt rows. The forward's PACK_P puts lane
 * (g, t)'s scores of keys 16G + 2t, 16G + 2t + 1, 16G + 8 + 2t, 16G + 9 + 2t of a 16-key group
 * in one A register, k positions 16G + 4t .. 16G + 4t + 3: Vt follows that order, so P needs no
 * shuffle between lanes (cl/flash_fwd_sm90_fp8.cl, "P"). */
#define VT_KEY(c) (((c) & ~15) + 2 * (((c) >> 2) & 3) + ((c) & 1) + 8 * (((c) >> 1) & 1))

__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void
fp8_vt_pack(__global const uchar *restrict v, TENSOR_ARGS(v), __global uchar *restrict vt, int nk, int vt_keys) {
    __local uchar tile[VT_TILE * VT_PACK_PITCH];
    const int tid = (int)get_local_id(0), n0 = (int)get_group_id(0) * VT_TILE;
    const int hk = (int)get_group_id(1), b = (int)get_group_id(2);
    __global const uchar *vb = v + v_off + (ulong)b * v_sb + (ulong)hk * v_sh;
    for (int i = tid; i < VT_TILE * (HEAD_DIM / 16); i += 128) {
        const int key = i / (HEAD_DIM / 16), c = i % (HEAD_DIM / 16);
        const uint4 x =
            n0 + key < nk ? *(__global const uint4 *)(vb + (ulong)(n0 + key) * v_ss + 16 * c) : (uint4)(0u);
        const uint w[4] = {x.x, x.y, x.z, x.w};
        __local uchar *row = tile + key * VT_PACK_PITCH + 16 * c;
        for (int j = 0; j < 16; ++j)
            row[j] = (uchar)(w[j / 4] >> (8 * (j % 4)));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    __global uchar *out = vt + ((ulong)(b * (int)get_num_groups(1) + hk) * VT_ROWS) * (ulong)vt_keys + n0;
    for (int i = tid; i < VT_ROWS * (VT_TILE / 16); i += 128) {
        const int d = i / (VT_TILE / 16), G = i % (VT_TILE / 16);
        uint w[4] = {0u, 0u, 0u, 0u};
        if (d < HEAD_DIM)
            for (int j = 0; j < 16; ++j)
                w[j / 4] |= (uint)tile[VT_KEY(16 * G + j) * VT_PACK_PITCH + d] << (8 * (j % 4));
        /* 16-byte aligned: vt_keys and n0 are multiples of VT_TILE */
        *(__global uint4 *)(out + (ulong)d * (ulong)vt_keys + 16 * G) = (uint4)(w[0], w[1], w[2], w[3]);
    }
}
