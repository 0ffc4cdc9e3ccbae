/* wgmma_probe.cl: one warpgroup MMA (m64n64k16, f16 in, f32 out) on a tile laid out exactly as
 * cl/flash_fwd_sm90.cl lays out its K and V tiles (common_nv.cl's SW128_OFFSET, 128-byte swizzle),
 * read through the same kind of matrix descriptor. tests/test_wgmma_layout.c runs it over tile
 * shapes, k-steps, panels and tile positions and compares every element with the exact product.
 * It exists to pin down which layouts the descriptors describe correctly on the hardware: the
 * forward kernel gave wrong results with 64-key tiles at head_dim <= 64 (one 128-byte panel)
 * until it reloaded Q's A fragments before every tile, and with Q read from __local (A through a
 * descriptor), while two-panel tiles were right (BENCHMARKS.md).
 *
 * Built with -DFLASHCL_NV_PTX -DFLASHCL_SM90A (src/program.c then rebuilds it for sm_90a) and
 *   ROWS  rows of the B tile (keys), a multiple of 16
 *   DPAD  halves per tile row: 64 (one panel) or 128 (two)
 * mode 0: S  = A B^T,  A = a[0..63][16 step ..] (registers), B = the tile's rows 0..63, dims
 *         16 step .. (K-major, as K for S = Q K^T); needs ROWS >= 64.
 * mode 1: O  = A B,    A = a[0..63][0..15] (registers), B = the tile's rows 16 step .., dims
 *         64 panel .. (N-major, the transpose bit, as V for O += P V).
 * mode 2: as mode 0 with A from __local too (an SS wgmma: a in the same layout, 64 rows).
 * The tile starts `offset` bytes (a multiple of 1024) after a 1024-byte boundary.
 */

#ifndef ROWS
#define ROWS 64
#endif
#ifndef DPAD
#define DPAD 64
#endif
#define TILE_BYTES (ROWS * DPAD * 2)
#define A_BYTES (64 * DPAD * 2)
#define CHUNKS (DPAD / 8) /* 16-byte chunks per row */
#define SM90A "//@sm90a "

/* Rows [0, rows) of a [rows][DPAD] matrix into the SW128 layout at shared address base. */
inline void probe_fill(__local ushort *smem, uint smem_off, __global const ushort *src, int rows) {
    for (int i = (int)get_local_id(0); i < rows * CHUNKS; i += 128) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        __global const ushort *p = src + r * DPAD + 8 * c;
        uint4 w = (uint4)(p[0] | (uint)p[1] << 16, p[2] | (uint)p[3] << 16, p[4] | (uint)p[5] << 16,
                          p[6] | (uint)p[7] << 16);
        *(__local uint4 *)(smem + (smem_off + SW128_OFFSET(r, c, rows)) / 2u) = w;
    }
}

#define D_OUT(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define D_ALL D_OUT(0), D_OUT(1), D_OUT(2), D_OUT(3), D_OUT(4), D_OUT(5), D_OUT(6), D_OUT(7)
#define D_REGS "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                      \
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"

__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void
wgmma_probe(__global const ushort *a, __global const ushort *b, __global float *out, int mode, int step,
            int panel, int offset) {
    __local ushort raw[(1024 + 8192 + A_BYTES + TILE_BYTES + 1024) / 2] __attribute__((aligned(1024)));
    const uint raw_base = shared_addr(raw);
    const uint align = (1024u - (raw_base & 1023u)) & 1023u;
    const uint a_off = align, b_off = align + A_BYTES + (uint)offset; /* bytes into raw */
    const int tid = (int)get_local_id(0), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;

    probe_fill(raw, a_off, a, 64);
    probe_fill(raw, b_off, b, ROWS);
    __asm__ __volatile__("fence.proxy.async.shared::cta;" ::: "memory");
    barrier(CLK_LOCAL_MEM_FENCE);

    /* A fragment (mma.sync's 16x16 A layout for this warp's rows 16 warp ..). */
    const int col0 = mode == 1 ? 0 : 16 * step, row0 = 16 * warp + g;
    uint af[4];
    af[0] = a[row0 * DPAD + col0 + 2 * t] | (uint)a[row0 * DPAD + col0 + 2 * t + 1] << 16;
    af[1] = a[(row0 + 8) * DPAD + col0 + 2 * t] | (uint)a[(row0 + 8) * DPAD + col0 + 2 * t + 1] << 16;
    af[2] = a[row0 * DPAD + col0 + 2 * t + 8] | (uint)a[row0 * DPAD + col0 + 2 * t + 9] << 16;
    af[3] = a[(row0 + 8) * DPAD + col0 + 2 * t + 8] | (uint)a[(row0 + 8) * DPAD + col0 + 2 * t + 9] << 16;

    float d[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
        d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
    const uint s_a = raw_base + a_off, s_b = raw_base + b_off;
    /* k-step `step` of a K-major tile: 32 * (step % 4) bytes into panel step / 4. */
    const uint k_at = (uint)((step / 4) * ROWS * 128 + (step % 4) * 32);
    const uint a_at = (uint)((step / 4) * 64 * 128 + (step % 4) * 32);
    __asm__ __volatile__(SM90A "wgmma.fence.sync.aligned;\n" ::: "memory");
    if (mode == 0)
        __asm__ __volatile__(SM90A "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " D_REGS
                                   ", {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n"
                             : D_ALL
                             : "r"(af[0]), "r"(af[1]), "r"(af[2]), "r"(af[3]), "l"(sw128_desc(s_b + k_at))
                             : "memory");
    else if (mode == 1)
        __asm__ __volatile__(SM90A "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " D_REGS
                                   ", {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n"
                             : D_ALL
                             : "r"(af[0]), "r"(af[1]), "r"(af[2]), "r"(af[3]),
                               "l"(sw128_desc(s_b + (uint)(panel * ROWS * 128 + step * 16 * 128)))
                             : "memory");
    else
        __asm__ __volatile__(SM90A "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " D_REGS
                                   ", %32, %33, 1, 1, 1, 0, 0;\n"
                             : D_ALL
                             : "l"(sw128_desc(s_a + a_at)), "l"(sw128_desc(s_b + k_at))
                             : "memory");
    __asm__ __volatile__(SM90A "wgmma.commit_group.sync.aligned;\n" ::: "memory");
    __asm__ __volatile__(SM90A "wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            __asm__ __volatile__("" : "+f"(d[j][e])::"memory");
            out[(row0 + 8 * (e >> 1)) * 64 + 8 * j + 2 * t + (e & 1)] = d[j][e];
        }
}
