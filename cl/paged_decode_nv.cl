/* paged_decode_nv.cl: decoding over paged or packed K/V on NVIDIA tensor cores (inline PTX
 * mma.sync).
 *
 * Same arguments, meta, grid and results as paged_decode.cl: grid (block,
 * kv head, split), a block being BLOCK_M <= 16 rows of one sequence (row r =
 * token r / group, query head hk * group + r % group), split s taking a slice
 * of the keys, the last split merging (merge_if_last_split, common_serving.cl). Only
 * for float16/bfloat16, HEAD_DIM a multiple of 16, 16-byte aligned K/V rows.
 *
 * Why tensor cores for a memory-bound kernel: reading K and V at the card's
 * bandwidth leaves only a few instructions per element, and the SIMT kernel
 * spends them on fp16 conversions, lane sums and two FMAs per element per
 * row. Here the block's rows are one 16-row mma fragment (the GQA group of a
 * token, padded with zero rows, as FA2's decode pads its query block): per
 * 16 keys a warp issues HEAD_DIM/16 ldmatrix + HEAD_DIM/8 mma for S = Q K^T
 * and the same for O += P V, whatever the number of rows.
 *
 * Work: each of the WARPS warps takes every WARPS-th tile of BLOCK_N keys of
 * the slice and keeps its own online softmax over them (m, l, O fragments);
 * the warps merge once at the end through __local. A warp streams its tiles
 * through STAGES private __local buffers with cp.async (page lookups per key,
 * zero-fill past the slice), so the loop needs no work-group barrier, only
 * the warp's own bar.warp.sync between a tile landing and ldmatrix reading
 * what other lanes copied. On long slices the host builds it with REG_COPY
 * instead: the same tiles, copied by 16-byte loads staged through registers
 * (below).
 *
 *   __local: warp 0: STAGES x (K tile, V tile)  |  warp 1: ...   (Q, 16 x PITCH halves, first;
 *            after the tiles when Q_IN_LOCAL)
 *   after the loop the tile area holds the warps' O rows for their merge,
 *   then the split weights for the last split's merge.
 *
 * Fragment layouts, the P-from-S register trick and the base-2 softmax with
 * the scale folded in are flash_fwd_nv.cl's (documented there); the running
 * max is kept in raw score units and multiplied by sc at exp time.
 */

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BLOCK_M
#define BLOCK_M 4 /* rows per block (<= 16, one mma fragment) */
#endif
#ifndef BLOCK_N
#define BLOCK_N 16 /* keys per tile, a multiple of 16 */
#endif
#ifndef WARPS
#define WARPS 2
#endif
#ifndef STAGES
#define STAGES 2 /* tiles per warp in flight + 1 */
#endif
#ifndef PAGE_SIZE
#define PAGE_SIZE 0 /* as in paged_decode.cl */
#endif
#define MAX_SPLITS 128 /* FLASHCL_MAX_SPLITS (src/internal.h) */
/* Tried on the H200 and taken out (BENCHMARKS.md): page-table reads a tile
 * ahead in the cp.async loop (REG_COPY's loop keeps one: there its loads
 * waited on the read), L2 prefetches of the tiles ahead (up to 15 % slower), rows by
 * cp.async.bulk, K a tile further ahead than V in its own cp.async group,
 * deeper rings, five groups a CU (register caps: spills), and K loaded
 * straight into the mma operands' registers with V by cp.async (K_IN_REGS,
 * 2026-12-02..03, 5c69a4b-1d15059: REG_COPY below is 3 % faster at D=128). One kv head's rows
 * laid out contiguously (as FA2's cache) read within 1.5 % of the shuffled
 * pages. Under REG_COPY, one prefetch.global.L2 of the K and V rows of the tile after next
 * (to have the shuffled page's address translated before its loads): 6 % slower at batch
 * 4-16, even over 256-token pages (8ee2e34). In the HEAD_GROUP kernel, the keys as the mma
 * rows (S^T = K Q^T, O^T += V^T P^T, P^T by movmatrix: half the mma, 167 registers instead of
 * 242 at D=128) with K two tiles ahead: level from 65536 keys, 1-6 % slower at batch 1-4 with
 * 16384; pages read as [head][token][dim]: level at batch 16 (2026-12-03, 64aef0e). */

/* REG_COPY: K and V by 16-byte loads (chunk_or_zero), a tile ahead in registers,
 * stored to the warp's tile buffer when the tile starts, instead of by
 * cp.async. Why: on the H200, cp.async from OpenCL reads at 3.9 TB/s at most
 * whatever its tiles (per warp or group-wide, 4-16 KB, 2-4 buffers, 1-6
 * groups a CU), while loads staged through registers into __local read at
 * 4.45-4.55 TB/s with 64 KB in flight an SM (bench/copy_tiles.c). It costs
 * 64 registers a thread at D=128 (255 in all: still 4 groups an SM) and
 * the overlap of a second tile in flight, which slices of 512 keys miss
 * (8 % slower there); the host asks for it from 1024 keys. */
#ifndef REG_COPY
#define REG_COPY 0
#endif
/* HEAD_GROUP: a work-group of HEAD_GROUP warps takes as many neighbouring kv heads of one
 * decoding token (a warp each), so that an SM reads whole rows of the pool's
 * [page][token][head][dim] pages at once rather than one head's 256 bytes of every 2 KB
 * (bench/copy_tiles.c: whole pages a group stream 2.6 % faster on the H200). On the H200 that
 * was level at batch 16 and slower at batch 1-4 (75bc46b), and as level with a work-group
 * barrier every tile to keep the warps on the same page (2026-12-03, a762927). With
 * HG_WPH warps a head (below), HEAD_GROUP=1 and 8 warps is what the host picks for grids too
 * small to fill the device without many splits: a work-group of 8 warps on one slice keeps as
 * much in flight as four 2-warp groups with a quarter of the splits to merge (batch 1: 3-13 %
 * faster, a762927). The kernel at the end of this file. 0, the default: one kv head a group. */
#ifndef HEAD_GROUP
#define HEAD_GROUP 0
#endif
/* REG_COPY keeps one tile buffer a warp: the tile in flight is in registers. Half the __local
 * of two buffers (17.8 KB a group at D=128, against 35.2); on the H200 as fast as two (75bc46b),
 * though bench/copy_tiles.c reads flashcl's paged rows 7 % slower with 16 KB more __local a
 * group, at 4 groups a CU (the SM's L1, where loads in flight land, gives way to __local). */
#if REG_COPY
#define TILE_BUFS 1
#else
#define TILE_BUFS STAGES
#endif

/* RESCALE_SKIP (default 1 here): the online softmax leaves O alone in tiles where no row's
 * max moved (ONLINE_SOFTMAX_16, common_nv.cl; the same result); 0, the rescale every tile,
 * for timing both (2026-12-05, not yet run on a GPU). */
#ifndef RESCALE_SKIP
#define RESCALE_SKIP 1
#endif

#define WG_SIZE (WARPS * 32)
#define PITCH (HEAD_DIM + 8)    /* halves: an odd multiple of 16 bytes, no ldmatrix conflicts */
#define D_CHUNKS (HEAD_DIM / 8) /* 16-byte chunks per row */
#define K_STEPS (HEAD_DIM / 16) /* k16 steps of S = Q K^T */
#define S_FRAGS (BLOCK_N / 8)   /* n8 blocks of S */
#define P_STEPS (BLOCK_N / 16)  /* k16 steps of O = P V */
#define O_FRAGS (HEAD_DIM / 8)  /* n8 blocks of O */
#define TILE_HALFS (BLOCK_N * PITCH)
#define WARP_HALFS (TILE_BUFS * 2 * TILE_HALFS)
#define Q_HALFS (16 * PITCH)
/* Up to D=128 Q's A fragments stay in registers and Q only passes through
 * the tile area before the first copy. Above, one warp's O accumulators
 * alone take 128 registers and Q's would take 64 more (ptxas spilled 284
 * bytes at D=256): Q stays in __local after the tiles and each k-step reads
 * its fragment, one ldmatrix more per 16 keys. flashcl_decode_local_bytes
 * (src/params_serving.c) reserves __local by the same rule. */
#ifndef Q_IN_LOCAL
#define Q_IN_LOCAL (HEAD_DIM > 128)
#endif
/* DIAG: timing-only builds that take work out of the kernel, to tell where
 * its time goes (their results are wrong): bit 1 computes nothing (the
 * tiles are still copied and waited for), bit 2 copies nothing in the
 * cp.async loop (the products run on whatever __local holds), bit 4 leaves
 * out the last split's merge. 0, the default: none. */
#ifndef DIAG
#define DIAG 0
#endif
#if HEAD_GROUP
/* HEAD_GROUP's own checks are with its kernel. */
#elif Q_IN_LOCAL
#define Q_BASE (WARPS * WARP_HALFS)
#define SMEM_HALFS (WARPS * WARP_HALFS + Q_HALFS)
#else
#define Q_BASE 0
#define SMEM_HALFS (Q_HALFS > WARPS * WARP_HALFS ? Q_HALFS : WARPS * WARP_HALFS)
#endif

#ifndef FLASHCL_NV_PTX
#error "paged_decode_nv is built with -DFLASHCL_NV_PTX"
#endif
#if DTYPE != 1 && DTYPE != 2
#error "paged_decode_nv needs DTYPE 1 (float16) or 2 (bfloat16)"
#endif
#if HEAD_DIM % 16 != 0 || BLOCK_N % 16 != 0 || BLOCK_M > 16
#error "HEAD_DIM and BLOCK_N must be multiples of 16, BLOCK_M at most 16"
#endif
#if !HEAD_GROUP && (WARPS * WARP_HALFS * 2 < WARPS * 16 * HEAD_DIM * 4 || WARPS * WARP_HALFS * 2 < BLOCK_M * MAX_SPLITS * 4)
#error "the tile area must hold the warps' O rows and the split weights for the final merges"
#endif
#if !HEAD_GROUP && SMEM_HALFS * 2 > 48000
#error "Q and the warps' K/V stages exceed NVIDIA's ~47 KB of __local memory"
#endif

#define WARP_SYNC() __asm__ __volatile__("bar.warp.sync 0xffffffff;" ::: "memory")

/* FP8 pools (KV_FP8, common.cl): K and V are read as bytes, half of the 16-bit rows' traffic, and
 * each 8-element chunk is widened to float16 in registers by the hardware's cvt.rn.f16x2.e4m3x2 /
 * .e5m2x2 (sm_89+) before it is stored to the tile or used as an mma operand, so everything after
 * the loads is the float16 kernel. So the queries must be float16 (DTYPE 1): the mma then runs on
 * exact float16 copies of the FP8 values (both formats widen exactly). The cp.async loop copies
 * bytes it cannot widen: FP8 runs under REG_COPY or HEAD_GROUP, whose loads pass through registers
 * (the host builds it so). The scales are the host's: the k scale is folded into q_mul, the v
 * scale into the output. */
#if KV_FP8
#if DTYPE != 1 || !(REG_COPY || HEAD_GROUP)
#error "paged_decode_nv over FP8 pages needs float16 queries and REG_COPY or HEAD_GROUP"
#endif
typedef uchar kv_raw_t;
#if KV_FP8 == 3
#define CVT_FP8X2 "cvt.rn.f16x2.e4m3x2"
#else
#define CVT_FP8X2 "cvt.rn.f16x2.e5m2x2"
#endif
/* Bytes b0..b3 of w (b0 lowest, the lowest element) -> float16 pairs (b0, b1) and (b2, b3), each
 * with the lower element in the lower half, as a 16-bit row's word holds them. */
inline uint2 fp8x4_to_f16x4(uint w) {
    uint lo, hi;
    __asm__("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t" CVT_FP8X2 " %0, l;\n\t" CVT_FP8X2 " %1, h;\n\t}"
            : "=r"(lo), "=r"(hi)
            : "r"(w));
    return (uint2)(lo, hi);
}
#else
typedef ushort kv_raw_t;
#endif

/* Where a tile never crosses a page (pages a multiple of BLOCK_N tokens; a
 * tile starts at a multiple of BLOCK_N, slices at multiples of 32), the rows
 * of its keys follow from its page's entry in the page table: one read a tile
 * instead of one per key row a lane copies. Where a tile is two whole pages
 * (FP8's 32-key tiles over 16-token pages), from its two pages' entries: two
 * reads a tile (the second only where the slice reaches that page: the table
 * may end before it) instead of one a load, each in the same tile as its
 * load (2026-12-05). TILE_PAGE0 is that entry, or entries (tile_rows_t; 0
 * where tiles may cross pages otherwise), read by the REG_COPY and HEAD_GROUP
 * loops a tile ahead (issue_tile, the cp.async loop's, in the tile's own);
 * TILE_ROWS turns them into the tile's first row (rows) where the loads use
 * them, a tile later (the product right after the read would wait for it);
 * TILE_ROW is the row of key n (<= s_hi) of the tile at n0 from those. */
#if defined(PAGE_SIZE) && PAGE_SIZE && PAGE_SIZE % BLOCK_N == 0 && 32 % BLOCK_N == 0
typedef uint tile_rows_t;
#define TILE_PAGE0(n0, s_hi, tables, k_base) ((uint)(tables)[(k_base) + (n0) / PAGE_SIZE])
#define TILE_ROWS(page0, n0) ((page0) * PAGE_SIZE + (uint)((n0) % PAGE_SIZE))
#define TILE_ROW(n, n0, rows, tables, k_base) ((rows) + (uint)((n) - (n0)))
#elif defined(PAGE_SIZE) && PAGE_SIZE && BLOCK_N == 2 * PAGE_SIZE && 32 % BLOCK_N == 0
typedef uint2 tile_rows_t;
#define TILE_PAGE0(n0, s_hi, tables, k_base)                                                       \
    ((uint2)((uint)(tables)[(k_base) + (n0) / PAGE_SIZE],                                          \
             (n0) + PAGE_SIZE <= (s_hi) ? (uint)(tables)[(k_base) + (n0) / PAGE_SIZE + 1] : 0u))
#define TILE_ROWS(page0, n0) ((page0) * (uint)PAGE_SIZE)
#define TILE_ROW(n, n0, rows, tables, k_base)                                                      \
    ((n) - (n0) < PAGE_SIZE ? (rows).x + (uint)((n) - (n0)) : (rows).y + (uint)((n) - (n0) - PAGE_SIZE))
#else
typedef uint tile_rows_t;
#define TILE_PAGE0(n0, s_hi, tables, k_base) 0u
#define TILE_ROWS(page0, n0) 0u
#define TILE_ROW(n, n0, rows, tables, k_base) key_row((n), (tables), (k_base))
#endif

#if !HEAD_GROUP
/* Issues this lane's cp.async copies of tile `tile` (keys s_lo + tile *
 * BLOCK_N ..), its K rows into k_dst and its V rows into v_dst (shared
 * addresses), then commits them as one group. Keys past s_hi are
 * zero-filled: their V rows then contribute 0 * 0 and their scores are
 * masked. */
inline void issue_tile(int tile, uint k_dst, uint v_dst, int s_lo, int s_hi, __global const int *tables, int k_base,
                       __global const kv_raw_t *kb, ulong k_ss, __global const kv_raw_t *vb, ulong v_ss) {
    const int lane = (int)get_local_id(0) % 32;
#if DIAG & 2
    __asm__ __volatile__("cp.async.commit_group;" ::: "memory");
    return;
#endif
    const int n0 = s_lo + tile * BLOCK_N;
    const tile_rows_t rows0 = TILE_ROWS(TILE_PAGE0(n0, s_hi, tables, k_base), n0);
#pragma unroll
    for (int it = 0; it < BLOCK_N * D_CHUNKS / 32; ++it) { /* a whole number: HEAD_DIM % 16 == 0 */
        const int i = lane + 32 * it, r = i / D_CHUNKS, c = i % D_CHUNKS;
        const int key = n0 + r;
        const int live = key <= s_hi;
        const uint kr = TILE_ROW(live ? key : n0, n0, rows0, tables, k_base);
        const uint off = (uint)(r * PITCH + 8 * c) * 2u;
        const int bytes = live ? 16 : 0;
        __asm__ __volatile__(CP_ASYNC_16 " [%0], [%1], 16, %2;" ::"r"(k_dst + off),
                             "l"((ulong)(kb + (ulong)kr * k_ss + 8 * c)), "r"(bytes)
                             : "memory");
        __asm__ __volatile__(CP_ASYNC_16 " [%0], [%1], 16, %2;" ::"r"(v_dst + off),
                             "l"((ulong)(vb + (ulong)kr * v_ss + 8 * c)), "r"(bytes)
                             : "memory");
    }
    __asm__ __volatile__("cp.async.commit_group;" ::: "memory");
}

#define COMMIT_EMPTY() __asm__ __volatile__("cp.async.commit_group;" ::: "memory")
#endif

#if REG_COPY || HEAD_GROUP
/* Copies staged through registers (REG_COPY): a lane's share of a tile of BLOCK_N rows is
 * loads lane + 32 * it (for 16-bit rows the chunks issue_tile copies). A lane's loads of a tile: 16 bytes each, 8 elements of 16-bit rows or 16 of FP8 ones. FP8
 * tiles stay raw in registers while in flight and are widened to float16 as they are stored,
 * so a lane holds as many registers of them as of a 16-bit tile of half the keys: the host
 * gives the one-head kernel 32-key tiles over FP8 pages, which keeps as many bytes in flight
 * as the 16-bit kernel's 16-key tiles. With 8-byte loads widened at once (16-key tiles), half
 * as many bytes were in flight and e4m3 pages decoded no faster than float16 ones on the
 * H200 (0.96-1.11x, 2026-12-04, bench/h200.sh fp8). */
#if KV_FP8
#define LOAD_ELEMS 16
#else
#define LOAD_ELEMS 8
#endif
#define ROW_LOADS (HEAD_DIM / LOAD_ELEMS)
#define LANE_LOADS (BLOCK_N * ROW_LOADS / 32)
#if LANE_LOADS * 32 != BLOCK_N * ROW_LOADS
#error "a tile's 16-byte loads must be a whole number a lane"
#endif

/* 16 bytes at p, or zero where !live. K and V are read once, and nothing writes them while the
 * kernel runs: through the non-coherent path, without a place in L1 (H200, REG_COPY: 1-5 %
 * faster than a plain load; an L2 prefetch of the tile after next, 12 % slower; BENCHMARKS.md). */
inline uint4 chunk16_or_zero(int live, __global const ushort *p) {
    uint4 v = (uint4)(0u);
    if (live)
        __asm__ __volatile__("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                             : "l"((ulong)p));
    return v;
}

/* The 8 elements at p as 16 bytes of float16 (FP8 pages: 8 bytes read, then widened), or zero:
 * HEAD_GROUP's K fragments, which go straight into the mma operands. */
#if KV_FP8
inline uint4 chunk_or_zero(int live, __global const kv_raw_t *p) {
    uint2 w = (uint2)(0u);
    if (live)
        __asm__ __volatile__("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];"
                             : "=r"(w.x), "=r"(w.y)
                             : "l"((ulong)p));
    const uint2 a = fp8x4_to_f16x4(w.x), b = fp8x4_to_f16x4(w.y);
    return (uint4)(a.x, a.y, b.x, b.y);
}
#else
#define chunk_or_zero chunk16_or_zero
#endif

/* This lane's 16-byte loads it0 .. it0 + n - 1 of the rows of keys n0 .. n0 + BLOCK_N - 1 of
 * base (past s_hi: zero), load i = lane + 32 * it at row i / ROW_LOADS, elements LOAD_ELEMS *
 * (i % ROW_LOADS) on; page0 is TILE_PAGE0(n0, ...), read by the caller a tile ahead. A range of
 * loads is a range of rows: HEAD_GROUP's 32-key FP8 tiles move in two halves of 16 keys. */
inline void load_lane_rows_part(uint4 *x, int it0, int n, int n0, tile_rows_t page0, int s_hi,
                                __global const int *tables, int k_base, __global const kv_raw_t *base, ulong ss,
                                int lane) {
    const tile_rows_t rows0 = TILE_ROWS(page0, n0);
#pragma unroll
    for (int it = it0; it < it0 + n; ++it) {
        const int i = lane + 32 * it, r = i / ROW_LOADS, c = i % ROW_LOADS, key = n0 + r;
        const int live = key <= s_hi;
        const uint row = TILE_ROW(live ? key : n0, n0, rows0, tables, k_base);
        x[it] = chunk16_or_zero(live, (__global const ushort *)(base + (ulong)row * ss + LOAD_ELEMS * c));
    }
}
inline void load_lane_rows(uint4 *x, int n0, tile_rows_t page0, int s_hi, __global const int *tables,
                           int k_base, __global const kv_raw_t *base, ulong ss, int lane) {
    load_lane_rows_part(x, 0, LANE_LOADS, n0, page0, s_hi, tables, k_base, base, ss, lane);
}

/* ... and loads it0 .. it0 + n - 1 into the tile at `tile` (rows PITCH halves apart: a multiple
 * of 16 bytes), their first row at the tile's first, FP8 widened to two float16 chunks. */
inline void store_lane_rows_part(const uint4 *x, int it0, int n, __local ushort *tile, int lane) {
#pragma unroll
    for (int it = it0; it < it0 + n; ++it) {
        const int i = lane + 32 * it;
        __local ushort *dst = tile + (i / ROW_LOADS - it0 * 32 / ROW_LOADS) * PITCH + LOAD_ELEMS * (i % ROW_LOADS);
#if KV_FP8
        const uint2 a = fp8x4_to_f16x4(x[it].x), b = fp8x4_to_f16x4(x[it].y);
        const uint2 c = fp8x4_to_f16x4(x[it].z), d = fp8x4_to_f16x4(x[it].w);
        *(__local uint4 *)dst = (uint4)(a.x, a.y, b.x, b.y);
        *(__local uint4 *)(dst + 8) = (uint4)(c.x, c.y, d.x, d.y);
#else
        *(__local uint4 *)dst = x[it];
#endif
    }
}
inline void store_lane_rows(const uint4 *x, __local ushort *tile, int lane) {
    store_lane_rows_part(x, 0, LANE_LOADS, tile, lane);
}
#endif

#if !HEAD_GROUP
/* The block's 16 Q rows -> __local at Q_BASE (rows past nrows zero).
 *
 * Why it is written this way: with one element a work-item a pass and the
 * store after each load, the loads ran one after another, each a round trip
 * to memory before the group could start, on a kernel that is one wave of
 * short-lived groups at long contexts. Here the passes are unrolled and a
 * work-item's 16-byte chunks (8 elements of a row) are all asked for before
 * any is stored; element by element only where Q's rows are not 16-byte
 * aligned (uniform per call). On the H200 about 4 us came off each call whose
 * slices are 1024 keys or shorter (BENCHMARKS.md, 2026-12-03, b0f15f5). */
#define Q_ROW_CHUNKS (HEAD_DIM / 8)
inline void load_q(__local ushort *smem, __global const ushort *q, ulong q_off, ulong q_ss, ulong q_sh, int q_start,
                   int m0, int nrows, int group, int hk) {
    const int tid = (int)get_local_id(0);
    /* Chunk c (of width elements) of the 16 rows, from global memory; zero past nrows. */
#define Q_AT(c, width) (q + q_off + (ulong)(q_start + (m0 + (c) / (HEAD_DIM / (width))) / group) * q_ss +           \
                        (ulong)(hk * group + (m0 + (c) / (HEAD_DIM / (width))) % group) * q_sh +                 \
                        (width) * ((c) % (HEAD_DIM / (width))))
    if ((ulong)q % 16 == 0 && q_off % 8 == 0 && q_ss % 8 == 0 && q_sh % 8 == 0) {
        /* At most 4 chunks (16 registers) in flight a work-item: D=256's one-warp groups would
         * otherwise hold 16. */
        enum { TOTAL = 16 * Q_ROW_CHUNKS, PASSES = (TOTAL + WG_SIZE - 1) / WG_SIZE, BATCH = PASSES < 4 ? PASSES : 4 };
        for (int p0 = 0; p0 < PASSES; p0 += BATCH) {
            uint4 x[BATCH];
#pragma unroll
            for (int j = 0; j < BATCH; ++j) {
                const int c = tid + (p0 + j) * WG_SIZE;
                x[j] = c < TOTAL && c / Q_ROW_CHUNKS < nrows ? *(__global const uint4 *)Q_AT(c, 8) : (uint4)(0u);
            }
#pragma unroll
            for (int j = 0; j < BATCH; ++j) { /* 4-byte stores, as the element path's */
                const int c = tid + (p0 + j) * WG_SIZE;
                if (c >= TOTAL)
                    break;
                __local uint *dst = (__local uint *)(smem + Q_BASE + (c / Q_ROW_CHUNKS) * PITCH + 8 * (c % Q_ROW_CHUNKS));
                dst[0] = x[j].x, dst[1] = x[j].y, dst[2] = x[j].z, dst[3] = x[j].w;
            }
        }
        return;
    }
    enum { TOTAL1 = 16 * HEAD_DIM, PASSES1 = (TOTAL1 + WG_SIZE - 1) / WG_SIZE, BATCH1 = PASSES1 < 8 ? PASSES1 : 8 };
    for (int p0 = 0; p0 < PASSES1; p0 += BATCH1) {
        ushort x[BATCH1];
#pragma unroll
        for (int j = 0; j < BATCH1; ++j) {
            const int i = tid + (p0 + j) * WG_SIZE;
            x[j] = i < TOTAL1 && i / HEAD_DIM < nrows ? *Q_AT(i, 1) : 0;
        }
#pragma unroll
        for (int j = 0; j < BATCH1; ++j) {
            const int i = tid + (p0 + j) * WG_SIZE;
            if (i >= TOTAL1)
                break;
            smem[Q_BASE + (i / HEAD_DIM) * PITCH + i % HEAD_DIM] = x[j];
        }
    }
#undef Q_AT
}
#endif

/* The warps' merge for one row: over warps w0 .. w0 + n - 1, whose running max and sum
 * are at m[w * stride + r] and l[...], the greatest max (.x) and the sum rescaled to it (.y). */
inline float2 warps_max_sum(__local const float *m, __local const float *l, int w0, int n, int stride, int r,
                            float sc) {
    float mx = -INFINITY, sum = 0.0f;
    for (int w = w0; w < w0 + n; ++w)
        mx = fmax(mx, m[w * stride + r]);
    for (int w = w0; w < w0 + n; ++w)
        if (m[w * stride + r] != -INFINITY)
            sum += l[w * stride + r] * ex2((m[w * stride + r] - mx) * sc);
    return (float2)(mx, sum);
}

/* Both kernels' last step once their rows' parts are written: with several
 * splits, the last split of the block and grid row gy to finish merges them
 * (common_serving.cl), sr naming the rows, wts and row_lse its __local scratch. */
inline void merge_splits(__global int *meta, int counters_off, int blk, int gy, int splits, __global float *part,
                         __global elem_t *o, __global float *lse, split_rows sr, __local float *wts,
                         __local float *row_lse, __local int *flag) {
#if DIAG & 4
    return;
#endif
    if (splits == 1)
        return;
    const int counter_at = counters_off + (blk * (int)get_global_size(1) + gy) * split_counters(splits);
    merge_if_last_split(&meta[counter_at], splits, part, o, lse, sr, HEAD_DIM, wts, row_lse, flag);
}

#if !HEAD_GROUP
__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
paged_decode_nv(SERVING_ARGS,
                int counters_off SERVING_META_ARG) { /* meta[counters_off + block * heads_k + hk]: finished splits */
    __local ushort smem[SMEM_HALFS] __attribute__((aligned(16)));
    __local float red_m[WARPS * 16], red_l[WARPS * 16];
    __local float row_inv[16], row_lse[16];
    __local int is_last;

    const int tid = (int)get_local_id(0);
    const int warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int blk = (int)get_group_id(0);
    const int hk = (int)get_global_id(1);
    const int split = (int)get_global_id(2), splits = (int)get_global_size(2);
    const serving_block b = SERVING_BLOCK(blocks_off, blk);
    const int m0 = b.m0, rows = b.nq * group;
    const int nrows = min(BLOCK_M, rows - m0);
    const uint s_base = shared_addr(smem);

    const uint k_lane = (uint)((lane % 8 + (lane / 16) * 8) * PITCH + ((lane / 8) % 2) * 8) * 2u;
    const uint v_lane = (uint)((lane % 8 + ((lane / 8) % 2) * 8) * PITCH + (lane / 16) * 8) * 2u;

    /* Last visible key of this lane's rows g and g + 8 (-1: padding row). */
    const int shift = causal ? b.nk - b.nq : b.nk;
    int row_hi[2];
    int blk_hi = -1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = g + 8 * h;
        row_hi[h] = r < nrows ? (causal ? min(shift + (m0 + r) / group, b.nk - 1) : b.nk - 1) : -1;
    }
    for (int r = 0; r < nrows; ++r)
        blk_hi = max(blk_hi, causal ? min(shift + (m0 + r) / group, b.nk - 1) : b.nk - 1);
    /* This split's slice, cut as the other decode kernel cuts it. */
    const long chunk_keys = (((long)b.nk + splits - 1) / splits + 31) / 32 * 32;
    const int s_lo = (int)min((long)split * chunk_keys, (long)b.nk);
    const int s_hi = (int)min(s_lo + chunk_keys - 1, (long)blk_hi);
    const int tiles = s_hi >= s_lo ? (s_hi - s_lo) / BLOCK_N + 1 : 0;
    const int my_tiles = tiles > warp ? (tiles - warp + WARPS - 1) / WARPS : 0; /* warp-uniform */

    q_mul *= K_DESCALE(hk); /* FP8 pages: keys are k descale * the widened bytes (common.cl) */
    const int softcap = softcap_log2 > 0.0f;
    const float sc = softcap ? 1.0f : q_mul;
    __global const kv_raw_t *kb = (__global const kv_raw_t *)k + k_off + (ulong)hk * k_sh;
    __global const kv_raw_t *vb = (__global const kv_raw_t *)v + v_off + (ulong)hk * v_sh;
    const uint warp_buf = s_base + (uint)(warp * WARP_HALFS) * 2u;

    float acc[O_FRAGS][4];
#pragma unroll
    for (int j = 0; j < O_FRAGS; ++j)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

#if REG_COPY
    /* The first tile's loads go out before Q's: registers, not the __local Q passes through.
     * page_next is the next tile's page-table entry (or two: TILE_PAGE0), read a tile ahead
     * of its loads, so that they wait on no table read (H200: 0.4-0.5 % faster at batch 16,
     * 2026-12-03, 75bc46b). */
#define TILE_N0(i) (s_lo + (warp + (i) * WARPS) * BLOCK_N)
    uint4 xk[LANE_LOADS], xv[LANE_LOADS];
    tile_rows_t page_next = (tile_rows_t)(0u);
    if (my_tiles > 0) {
        const tile_rows_t page0 = TILE_PAGE0(TILE_N0(0), s_hi, tables, b.k_base);
        load_lane_rows(xk, TILE_N0(0), page0, s_hi, tables, b.k_base, kb, k_ss, lane);
        load_lane_rows(xv, TILE_N0(0), page0, s_hi, tables, b.k_base, vb, v_ss, lane);
    }
    if (my_tiles > 1)
        page_next = TILE_PAGE0(TILE_N0(1), s_hi, tables, b.k_base);
#endif
    /* Q rows -> __local (zero rows past the block) -> A fragments, once. */
    load_q(smem, (__global const ushort *)q, q_off, q_ss, q_sh, b.q_start, m0, nrows, group, hk);
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint q_lane = s_base + (uint)(Q_BASE + (lane % 16) * PITCH + (lane / 16) * 8) * 2u;
#if !Q_IN_LOCAL
    uint qf[K_STEPS][4];
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk)
        LDMATRIX_X4(qf[kk], q_lane + (uint)(kk * 16) * 2u);
    barrier(CLK_LOCAL_MEM_FENCE); /* every warp has its Q before the tiles overwrite it */
#endif

    /* Tile i of this warp is the slice's tile warp + i * WARPS, in buffer i % TILE_BUFS: K, then V. */
#define K_BUF(i) (warp_buf + (uint)(((i) % TILE_BUFS) * 2 * TILE_HALFS) * 2u)
#define V_BUF(i) (K_BUF(i) + TILE_HALFS * 2u)
#if REG_COPY
    /* Tile i + 1 arrives in xk, xv while tile i is computed and goes to the warp's buffer when
     * tile i + 1 starts, after a warp sync: every lane is done reading tile i - 1 (at i = 0, the
     * work-group barrier after Q's fragments stands for it). The sync after the stores makes
     * the tile whole for ldmatrix. (Issuing the next K loads between the K and V stores, so
     * that they go out while V's data may still be arriving, was 0.1 % slower: 75bc46b.) */
    __local ushort *const warp_tiles = smem + warp * WARP_HALFS;
    for (int i = 0; i < my_tiles; ++i) {
        if (i > 0)
            WARP_SYNC();
        const int more = i + 1 < my_tiles;
        store_lane_rows(xk, warp_tiles, lane);
        store_lane_rows(xv, warp_tiles + TILE_HALFS, lane);
        if (more) {
            load_lane_rows(xk, TILE_N0(i + 1), page_next, s_hi, tables, b.k_base, kb, k_ss, lane);
            load_lane_rows(xv, TILE_N0(i + 1), page_next, s_hi, tables, b.k_base, vb, v_ss, lane);
        }
        if (i + 2 < my_tiles)
            page_next = TILE_PAGE0(TILE_N0(i + 2), s_hi, tables, b.k_base);
        WARP_SYNC();

#undef TILE_N0
#else
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < my_tiles)
            issue_tile(warp + i * WARPS, K_BUF(i), V_BUF(i), s_lo, s_hi, tables, b.k_base, kb, k_ss, vb, v_ss);
        else
            COMMIT_EMPTY();
    }
    for (int i = 0; i < my_tiles; ++i) {
        const int ahead = i + STAGES - 1;
        if (ahead < my_tiles)
            issue_tile(warp + ahead * WARPS, K_BUF(ahead), V_BUF(ahead), s_lo, s_hi, tables, b.k_base, kb, k_ss, vb,
                       v_ss);
        else
            COMMIT_EMPTY();
        __asm__ __volatile__("cp.async.wait_group %0;" ::"n"(STAGES - 1) : "memory");
        WARP_SYNC(); /* every lane's part of tile i has landed */
#endif
#if !(DIAG & 1)
        const uint k_tile = K_BUF(i), v_tile = V_BUF(i);
        const int n0 = s_lo + (warp + i * WARPS) * BLOCK_N;

        /* ---- S = Q K^T ---- */
        float s[S_FRAGS][4];
#pragma unroll
        for (int j = 0; j < S_FRAGS; ++j)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
#if Q_IN_LOCAL
            uint qa[4];
            LDMATRIX_X4(qa, q_lane + (uint)(kk * 16) * 2u);
#else
            const uint *qa = qf[kk];
#endif
#pragma unroll
            for (int np = 0; np < S_FRAGS / 2; ++np) {
                uint kf[4];
                LDMATRIX_X4(kf, k_tile + k_lane + (uint)(np * 16 * PITCH + kk * 16) * 2u);
                MMA_16816_X2(s[2 * np], s[2 * np + 1], qa, kf);
            }
        }
        if (softcap)
            SOFTCAP_16(s, S_FRAGS, q_mul, softcap_log2);
            /* ---- mask: keys past a row's last visible key or past the slice ---- */
#pragma unroll
        for (int j = 0; j < S_FRAGS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = n0 + 8 * j + 2 * t + (e & 1);
                if (key > min(row_hi[e >> 1], s_hi))
                    s[j][e] = -INFINITY;
            }
        /* ---- online softmax: rows g (e = 0,1) and g+8 (e = 2,3) ---- */
        ONLINE_SOFTMAX_16(s, S_FRAGS, acc, O_FRAGS, m_run, l_run, sc);
        /* ---- O += P V ---- */
#pragma unroll
        for (int kk = 0; kk < P_STEPS; ++kk) {
            const uint p0 = pack2(s[2 * kk][0], s[2 * kk][1]),
                       p1 = pack2(s[2 * kk][2], s[2 * kk][3]);
            const uint p2 = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            const uint p3 = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < O_FRAGS / 2; ++dp) {
                uint vf[4];
                LDMATRIX_X4_TRANS(vf, v_tile + v_lane + (uint)(kk * 16 * PITCH + dp * 16) * 2u);
                MMA_16816(acc[2 * dp], p0, p1, p2, p3, vf[0], vf[1]);
                MMA_16816(acc[2 * dp + 1], p0, p1, p2, p3, vf[2], vf[3]);
            }
        }
#endif
#if !REG_COPY
        WARP_SYNC(); /* done reading this buffer before a later issue refills it */
#endif
    }
#if !REG_COPY /* (REG_COPY's loop issues no cp.async) */
    __asm__ __volatile__("cp.async.wait_group 0;" ::: "memory");
#endif

    /* ---- merge the warps: per row the max, the sum, then O ---- */
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l_run[h] += shfl_xor(l_run[h], 1);
        l_run[h] += shfl_xor(l_run[h], 2);
        if (t == 0) {
            red_m[warp * 16 + g + 8 * h] = m_run[h];
            red_l[warp * 16 + g + 8 * h] = l_run[h];
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);                 /* also: every warp is past its tiles */
    __local float *red_o = (__local float *)smem; /* [warp][16][HEAD_DIM] */
    float row_m[2], row_l[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = g + 8 * h;
        const float2 ms = warps_max_sum(red_m, red_l, 0, WARPS, 16, r, sc);
        row_m[h] = ms.x, row_l[h] = ms.y;
        const float wgt = m_run[h] == -INFINITY ? 0.0f : ex2((m_run[h] - ms.x) * sc);
#pragma unroll
        for (int j = 0; j < O_FRAGS; ++j) {
            red_o[(warp * 16 + r) * HEAD_DIM + 8 * j + 2 * t] = acc[j][2 * h] * wgt;
            red_o[(warp * 16 + r) * HEAD_DIM + 8 * j + 2 * t + 1] = acc[j][2 * h + 1] * wgt;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    /* Row r's LSE and 1 / l, from the lanes that hold it (t == 0 of group g). */
    if (warp == 0 && t == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = g + 8 * h;
            row_inv[r] = row_l[h] > 0.0f ? V_DESCALE(hk) / row_l[h] : 0.0f; /* V_DESCALE: 1 unless FP8 */
            row_lse[r] = row_l[h] > 0.0f ? (row_m[h] * sc + log2(row_l[h])) * LN2 : -INFINITY;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = tid; e < nrows * HEAD_DIM; e += WG_SIZE) {
        const int r = e / HEAD_DIM, d = e % HEAD_DIM, row = m0 + r;
        float x = 0.0f;
        for (int w = 0; w < WARPS; ++w)
            x += red_o[(w * 16 + r) * HEAD_DIM + d];
        x *= row_inv[r];
        const ulong token = (ulong)(b.q_start + row / group);
        const int hq = hk * group + row % group;
        if (splits == 1)
            STORE_ELEM(o, o_off + token * o_ss + (ulong)hq * o_sh + d, x);
        else /* partial results stay in float: merged, then rounded once */
            part[(((ulong)split * total_q + token) * heads_q + hq) * HEAD_DIM + d] = x;
    }
    if (tid < nrows) {
        const int row = m0 + tid;
        const ulong token = (ulong)(b.q_start + row / group);
        const int hq = hk * group + row % group;
        if (splits > 1)
            part[part_lse_off + ((ulong)split * total_q + token) * heads_q + hq] = row_lse[tid];
        else if (has_lse)
            lse[lse_off + (ulong)hq * total_q + token] = row_lse[tid];
    }
    const split_rows sr = {o_off,   o_ss,  o_sh, lse_off,   part_lse_off, has_lse, total_q,
                           heads_q, group, hk,   b.q_start, m0,           nrows};
    /* The split weights reuse the tile area (red_o is read before its first barrier). */
    merge_splits(meta, counters_off, blk, hk, splits, part, o, lse, sr, red_o, red_m, &is_last);
}
#else /* HEAD_GROUP */

/* ==== HEAD_GROUP: a warp a kv head ===========================================================
 * Grid (block, group of HEAD_GROUP kv heads, split); warp w takes kv head
 * get_group_id(1) * HEAD_GROUP + w over the split's whole slice, so the
 * group's warps go through the same pages side by side. Only for decoding:
 * every block is the GQA group of one token (rows = group <= BLOCK_M <= 8),
 * HEAD_DIM a multiple of 32 up to 128 (the host's decode_head_group).
 *
 * Each warp keeps its own online softmax and ends with its own rows, so no
 * warps merge. Only V passes through __local (a tile a warp, by the
 * REG_COPY loads): Q and K go straight into the mma operands, with the head
 * dims permuted alike on both sides of S = Q K^T, which leaves the sums
 * unchanged. Lane (g, t) loads 16-byte chunks c = 4j + t (j < HEAD_DIM / 32)
 * of its key rows (g and g + 8 of the tile) and of Q's row g; chunk j's four
 * words are k-steps 2j and 2j + 1 of the fragments:
 *   word x: k-step 2j, B's b0 / A's a0      word y: k-step 2j, b1 / a2
 *   word z: k-step 2j+1, b0 / a0            word w: k-step 2j+1, b1 / a2
 * (A's rows g + 8, a1 and a3, are padding: zero.) */
/* HG_WPH: warps a kv head (1, the default). Above 1, the head's warps take every HG_WPH-th tile
 * of its slice and merge at the end through __local, as the one-head kernel's warps do: one
 * work-group of HG_WPH warps then takes a whole (token, kv head), so that a batch that covers
 * the device once needs no split and no merge across work-groups. */
#ifndef HG_WPH
#define HG_WPH 1
#endif
#if HEAD_GROUP * HG_WPH != WARPS
#error "HEAD_GROUP is built with WARPS = HEAD_GROUP * HG_WPH"
#endif
/* HG_WIDE (BLOCK_N=32 over FP8 pages, head dims a multiple of 64; the host's default there,
 * HG_KEYS=32; H100: 7-11 % faster than 16-key tiles, src/params_serving.c): 32-key
 * tiles whose K and V come by 16-byte loads of 16 elements and stay raw in registers while in
 * flight: K is widened where S's mma uses it, V as each 16-key half goes to the warp's tile
 * (which stays 16 keys: eight warps' 32-key float16 V tiles would need 70 KB). A lane then has
 * as many bytes in flight as in the 16-bit kernel's 16-key tiles. FP8's 16-key tiles (8-byte K
 * loads widened as they land) keep half as many, which is what held the one-head kernel to
 * 0.96-1.11x the float16 pool until its tiles became 32 keys (2026-12-04). The lane's chunks
 * then hold 16 head dims each, 4 k-steps of S (below); Q's fragments follow the same order. */
#define HG_WIDE (KV_FP8 && BLOCK_N == 32)
#if HEAD_DIM % 32 != 0 || HEAD_DIM > 128 || BLOCK_M > 8 || (BLOCK_N != 16 && !HG_WIDE) || (HG_WIDE && HEAD_DIM % 64 != 0)
#error "HEAD_GROUP needs HEAD_DIM a multiple of 32 up to 128, BLOCK_M <= 8 and 16-key tiles (32 over FP8 pages at D % 64 == 0)"
#endif
#define HG_CHUNKS (HEAD_DIM / 32) /* a lane's 8-element chunks of one key row */
#define HG_WIDE_CHUNKS (HEAD_DIM / 64) /* HG_WIDE: a lane's 16-element chunks of one key row */
#define HG_TILE_HALFS (16 * PITCH) /* a warp's V tile: 16 keys */
#define HG_HALF_LOADS (LANE_LOADS / 2) /* HG_WIDE: a lane's loads of 16 of V's 32 rows */
/* The warps' V tiles; after the loop, the final merge's split weights. */
#define HG_HALFS (WARPS * HG_TILE_HALFS > WARPS * BLOCK_M * MAX_SPLITS * 2 ? WARPS * HG_TILE_HALFS : WARPS * BLOCK_M * MAX_SPLITS * 2)
#if HG_WPH > 1 && WARPS * BLOCK_M * HEAD_DIM * 2 > HG_HALFS
#error "the warps' O rows for their merge exceed the V tiles' __local"
#endif
#if HG_HALFS * 2 + WARPS * 16 * 4 > 48000
#error "the warps' V tiles exceed NVIDIA's ~47 KB of __local memory"
#endif

/* K's chunks for S: lane (g, t) loads chunks c = 4j + t of the rows of keys n0 + 8h + g (h <
 * HG_K_ROWS; past s_hi: zero). 16-key tiles: 8-element chunks, widened as they land
 * (chunk_or_zero), j < HG_CHUNKS. HG_WIDE: raw 16-byte chunks of 16 elements, j <
 * HG_WIDE_CHUNKS, chunk j's word q (its elements 4q .. 4q + 3) widening to B's b0 and b1 of
 * k-step 4j + q where S's mma uses it. */
#if HG_WIDE
#define HG_K_ROWS 4
#define HG_K_CHUNKS HG_WIDE_CHUNKS
#define HG_K_ELEMS 16
#define HG_K_CHUNK(live, row, c) chunk16_or_zero(live, (__global const ushort *)((row) + 16 * (c)))
#else
#define HG_K_ROWS 2
#define HG_K_CHUNKS HG_CHUNKS
#define HG_K_ELEMS 8
#define HG_K_CHUNK(live, row, c) chunk_or_zero(live, (row) + 8 * (c))
#endif
inline void load_k_frags(uint4 x[HG_K_ROWS][HG_K_CHUNKS], int n0, tile_rows_t page0, int s_hi,
                         __global const int *tables, int k_base, __global const kv_raw_t *kb, ulong k_ss, int g, int t) {
    const tile_rows_t rows0 = TILE_ROWS(page0, n0);
#pragma unroll
    for (int h = 0; h < HG_K_ROWS; ++h) {
        const int key = n0 + 8 * h + g, live = key <= s_hi;
        __global const kv_raw_t *row = kb + (ulong)TILE_ROW(live ? key : n0, n0, rows0, tables, k_base) * k_ss;
#pragma unroll
        for (int j = 0; j < HG_K_CHUNKS; ++j)
            x[h][j] = HG_K_CHUNK(live, row, 4 * j + t);
    }
}

/* O += P V for 16 keys: P from S's n8 blocks s0 and s1 (keys 0-7, 8-15 of the 16) as the A
 * fragments, V from the warp's 16-key tile at v_frag. */
#define HG_PV16(s0, s1)                                                                            \
    do {                                                                                           \
        const uint p0 = pack2((s0)[0], (s0)[1]), p1 = pack2((s0)[2], (s0)[3]);                     \
        const uint p2 = pack2((s1)[0], (s1)[1]), p3 = pack2((s1)[2], (s1)[3]);                     \
        _Pragma("unroll") for (int dp = 0; dp < O_FRAGS / 2; ++dp) {                               \
            uint vf[4];                                                                            \
            LDMATRIX_X4_TRANS(vf, v_frag + (uint)(dp * 16) * 2u);                                  \
            MMA_16816(acc[2 * dp], p0, p1, p2, p3, vf[0], vf[1]);                                  \
            MMA_16816(acc[2 * dp + 1], p0, p1, p2, p3, vf[2], vf[3]);                              \
        }                                                                                          \
    } while (0)

__kernel __attribute__((reqd_work_group_size(WG_SIZE, 1, 1))) void
paged_decode_nv(SERVING_ARGS,
                int counters_off SERVING_META_ARG) { /* meta[counters_off + block * heads_k / HEAD_GROUP + group]: finished splits */
    __local ushort smem[HG_HALFS] __attribute__((aligned(16)));
    __local float red_lse[WARPS * 16];
    __local int is_last;

    const int tid = (int)get_local_id(0);
    const int warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int blk = (int)get_group_id(0);
    const int hg = (int)get_global_id(1), hk = hg * HEAD_GROUP + warp / HG_WPH, sub = warp % HG_WPH;
    const int split = (int)get_global_id(2), splits = (int)get_global_size(2);
    const serving_block b = SERVING_BLOCK(blocks_off, blk);
    const int nrows = min(BLOCK_M, b.nq * group - b.m0); /* = group: one token */

    /* Every row sees every key of the sequence: one query token, causal or not. */
    const long chunk_keys = (((long)b.nk + splits - 1) / splits + 31) / 32 * 32;
    const int s_lo = (int)min((long)split * chunk_keys, (long)b.nk);
    const int s_hi = (int)min(s_lo + chunk_keys - 1, (long)b.nk - 1);
    const int slice_tiles = s_hi >= s_lo ? (s_hi - s_lo) / BLOCK_N + 1 : 0;
    /* This warp's tiles: sub, sub + HG_WPH, ... of the slice (warp-uniform). */
    const int tiles = slice_tiles > sub ? (slice_tiles - sub + HG_WPH - 1) / HG_WPH : 0;

    q_mul *= K_DESCALE(hk); /* FP8 pages: keys are k descale * the widened bytes (common.cl) */
    const int softcap = softcap_log2 > 0.0f;
    const float sc = softcap ? 1.0f : q_mul;
    __global const kv_raw_t *kb = (__global const kv_raw_t *)k + k_off + (ulong)hk * k_sh;
    __global const kv_raw_t *vb = (__global const kv_raw_t *)v + v_off + (ulong)hk * v_sh;
    __local ushort *const v_tile = smem + warp * HG_TILE_HALFS;
    const uint v_frag = shared_addr(v_tile) + (uint)((lane % 8 + ((lane / 8) % 2) * 8) * PITCH + (lane / 16) * 8) * 2u;

    /* The first tile's loads, then Q's row g (A's a0 and a2 words, per k-step). */
#define TILE_N0(i) (s_lo + (sub + (i) * HG_WPH) * BLOCK_N)
    uint4 xk[HG_K_ROWS][HG_K_CHUNKS], xv[LANE_LOADS];
    tile_rows_t page_next = (tile_rows_t)(0u);
    if (tiles > 0) {
        const tile_rows_t page0 = TILE_PAGE0(TILE_N0(0), s_hi, tables, b.k_base);
        load_k_frags(xk, TILE_N0(0), page0, s_hi, tables, b.k_base, kb, k_ss, g, t);
        load_lane_rows(xv, TILE_N0(0), page0, s_hi, tables, b.k_base, vb, v_ss, lane);
    }
    if (tiles > 1)
        page_next = TILE_PAGE0(TILE_N0(1), s_hi, tables, b.k_base);
    uint qa[K_STEPS][2];
    {
        const int r = b.m0 + g;
        __global const ushort *qrow = (__global const ushort *)q + q_off + (ulong)(b.q_start + r / group) * q_ss +
                                      (ulong)(hk * group + r % group) * q_sh;
        /* Dims HG_K_ELEMS (4j + t) + 4q .. + 3 are k-step HG_K_ELEMS / 4 j + q's a0 (the first
         * two) and a2 words, as K's chunk j (load_k_frags) gives them to b0 and b1. */
#pragma unroll
        for (int j = 0; j < HG_K_CHUNKS; ++j) {
            uint e[HG_K_ELEMS / 2];
#pragma unroll
            for (int w = 0; w < HG_K_ELEMS / 2; ++w) { /* element loads: Q's rows need not be 16-byte aligned */
                const int d = HG_K_ELEMS * (4 * j + t) + 2 * w;
                e[w] = g < nrows ? (uint)qrow[d] | ((uint)qrow[d + 1] << 16) : 0u;
            }
#pragma unroll
            for (int qs = 0; qs < HG_K_ELEMS / 4; ++qs)
                qa[HG_K_ELEMS / 4 * j + qs][0] = e[2 * qs], qa[HG_K_ELEMS / 4 * j + qs][1] = e[2 * qs + 1];
        }
    }

    float acc[O_FRAGS][4];
#pragma unroll
    for (int j = 0; j < O_FRAGS; ++j)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

    /* Tile i: V to the warp's tile, S from K's registers, then tile i + 1's
     * loads into both, then softmax and P V while they are in flight. HG_WIDE:
     * V's first 16 keys to the tile, whose registers then take tile i + 1's first
     * half at once, S, tile i + 1's K, softmax, P V over the first half; then the
     * second half the same way. */
    for (int i = 0; i < tiles; ++i) {
        if (i > 0)
            WARP_SYNC(); /* every lane is done reading tile i - 1's V */
#if HG_WIDE
        const int more = i + 1 < tiles;
        store_lane_rows_part(xv, 0, HG_HALF_LOADS, v_tile, lane);
        if (more)
            load_lane_rows_part(xv, 0, HG_HALF_LOADS, TILE_N0(i + 1), page_next, s_hi, tables, b.k_base, vb, v_ss,
                                lane);
#else
        store_lane_rows(xv, v_tile, lane);
#endif
        float s[S_FRAGS][4];
#pragma unroll
        for (int j = 0; j < S_FRAGS; ++j)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#if HG_WIDE
#pragma unroll
        for (int j = 0; j < HG_WIDE_CHUNKS; ++j)
#pragma unroll
            for (int h = 0; h < HG_K_ROWS; ++h) {
                const uint4 w = xk[h][j];
                const uint2 f0 = fp8x4_to_f16x4(w.x), f1 = fp8x4_to_f16x4(w.y);
                const uint2 f2 = fp8x4_to_f16x4(w.z), f3 = fp8x4_to_f16x4(w.w);
                MMA_16816(s[h], qa[4 * j][0], 0u, qa[4 * j][1], 0u, f0.x, f0.y);
                MMA_16816(s[h], qa[4 * j + 1][0], 0u, qa[4 * j + 1][1], 0u, f1.x, f1.y);
                MMA_16816(s[h], qa[4 * j + 2][0], 0u, qa[4 * j + 2][1], 0u, f2.x, f2.y);
                MMA_16816(s[h], qa[4 * j + 3][0], 0u, qa[4 * j + 3][1], 0u, f3.x, f3.y);
            }
        const int n0 = TILE_N0(i);
        if (more)
            load_k_frags(xk, TILE_N0(i + 1), page_next, s_hi, tables, b.k_base, kb, k_ss, g, t);
#else
#pragma unroll
        for (int j = 0; j < HG_CHUNKS; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                MMA_16816(s[h], qa[2 * j][0], 0u, qa[2 * j][1], 0u, xk[h][j].x, xk[h][j].y);
                MMA_16816(s[h], qa[2 * j + 1][0], 0u, qa[2 * j + 1][1], 0u, xk[h][j].z, xk[h][j].w);
            }
        const int n0 = TILE_N0(i);
        if (i + 1 < tiles) {
            load_k_frags(xk, TILE_N0(i + 1), page_next, s_hi, tables, b.k_base, kb, k_ss, g, t);
            load_lane_rows(xv, TILE_N0(i + 1), page_next, s_hi, tables, b.k_base, vb, v_ss, lane);
        }
        if (i + 2 < tiles)
            page_next = TILE_PAGE0(TILE_N0(i + 2), s_hi, tables, b.k_base);
#endif
        WARP_SYNC(); /* the V tile is whole */

        if (softcap)
            SOFTCAP_16(s, S_FRAGS, q_mul, softcap_log2);
        /* keys past the slice; rows g + 8 are padding */
#pragma unroll
        for (int j = 0; j < S_FRAGS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (n0 + 8 * j + 2 * t + (e & 1) > s_hi || (e >> 1) || g >= nrows)
                    s[j][e] = -INFINITY;
        ONLINE_SOFTMAX_16(s, S_FRAGS, acc, O_FRAGS, m_run, l_run, sc);
        /* ---- O += P V ---- */
        HG_PV16(s[0], s[1]);
#if HG_WIDE
        WARP_SYNC(); /* every lane is done reading V's first half */
        store_lane_rows_part(xv, HG_HALF_LOADS, HG_HALF_LOADS, v_tile, lane);
        if (more)
            load_lane_rows_part(xv, HG_HALF_LOADS, HG_HALF_LOADS, TILE_N0(i + 1), page_next, s_hi, tables, b.k_base,
                                vb, v_ss, lane);
        if (i + 2 < tiles)
            page_next = TILE_PAGE0(TILE_N0(i + 2), s_hi, tables, b.k_base);
        WARP_SYNC(); /* the second half is whole */
        HG_PV16(s[2], s[3]);
#endif
    }
#undef TILE_N0

    /* ---- this warp's rows g: O / l (or the split's part) and the LSE ---- */
    l_run[0] += shfl_xor(l_run[0], 1);
    l_run[0] += shfl_xor(l_run[0], 2);
#if HG_WPH > 1
    /* The head's warps merge, as the one-head kernel's do: the row's max and sum over them,
     * then their O rows, weighted, through __local; warp `sub` of the head sums and writes the
     * n8 blocks j with j % HG_WPH == sub. */
    __local float *red_m = red_lse, *red_l = red_lse + WARPS * 8;
    if (t == 0)
        red_m[warp * 8 + g] = m_run[0], red_l[warp * 8 + g] = l_run[0];
    barrier(CLK_LOCAL_MEM_FENCE); /* also: every warp is past its V tile */
    const int w0 = warp - sub;
    const float2 ms = warps_max_sum(red_m, red_l, w0, HG_WPH, 8, g, sc);
    const float wgt = m_run[0] == -INFINITY ? 0.0f : ex2((m_run[0] - ms.x) * sc);
    __local float *red_o = (__local float *)smem; /* [warp][BLOCK_M][HEAD_DIM] */
    if (g < nrows) {
#pragma unroll
        for (int j = 0; j < O_FRAGS; ++j)
            *(__local float2 *)(red_o + (warp * BLOCK_M + g) * HEAD_DIM + 8 * j + 2 * t) =
                (float2)(acc[j][0] * wgt, acc[j][1] * wgt);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (g < nrows) {
#pragma unroll
        for (int j = 0; j < O_FRAGS; ++j)
            if (j % HG_WPH == sub) {
                float2 x = (float2)(0.0f);
                for (int w = w0; w < w0 + HG_WPH; ++w)
                    x += *(__local const float2 *)(red_o + (w * BLOCK_M + g) * HEAD_DIM + 8 * j + 2 * t);
                acc[j][0] = x.x, acc[j][1] = x.y;
            }
    }
    m_run[0] = ms.x, l_run[0] = ms.y;
#define OWNS(j) ((j) % HG_WPH == sub)
#else
#define OWNS(j) 1
#endif
    const float inv = l_run[0] > 0.0f ? V_DESCALE(hk) / l_run[0] : 0.0f; /* V_DESCALE: 1 unless FP8 */
    const float row_lse = l_run[0] > 0.0f ? (m_run[0] * sc + log2(l_run[0])) * LN2 : -INFINITY;
    if (g < nrows) {
        const int r = b.m0 + g;
        const ulong token = (ulong)(b.q_start + r / group);
        const int hq = hk * group + r % group;
        if (splits == 1) {
            __global elem_t *orow = o + o_off + token * o_ss + (ulong)hq * o_sh;
#pragma unroll
            for (int j = 0; j < O_FRAGS; ++j)
                if (OWNS(j)) {
                    STORE_ELEM(orow, 8 * j + 2 * t, acc[j][0] * inv);
                    STORE_ELEM(orow, 8 * j + 2 * t + 1, acc[j][1] * inv);
                }
            if (has_lse && t == 0 && sub == 0)
                lse[lse_off + (ulong)hq * total_q + token] = row_lse;
        } else { /* partial results stay in float: merged, then rounded once */
            __global float *prow = part + (((ulong)split * total_q + token) * heads_q + hq) * HEAD_DIM;
#pragma unroll
            for (int j = 0; j < O_FRAGS; ++j)
                if (OWNS(j))
                    *(__global float2 *)(prow + 8 * j + 2 * t) = (float2)(acc[j][0] * inv, acc[j][1] * inv);
            if (t == 0 && sub == 0)
                part[part_lse_off + ((ulong)split * total_q + token) * heads_q + hq] = row_lse;
        }
    }
    /* The group's rows as one block of HEAD_GROUP * group rows of kv head "hg" with a GQA
     * group of HEAD_GROUP * group: row r is query head hg * HEAD_GROUP * group + r, of the
     * block's one token. The split weights reuse the V tiles (read after the merge's first
     * barrier, when every warp is past its loop). */
    const split_rows sr = {o_off,   o_ss,  o_sh, lse_off, part_lse_off, has_lse, total_q,
                           heads_q, HEAD_GROUP * group, hg, b.q_start, 0, HEAD_GROUP * nrows};
    merge_splits(meta, counters_off, blk, hg, splits, part, o, lse, sr, (__local float *)smem, red_lse, &is_last);
#undef OWNS
}
#endif /* HEAD_GROUP */
