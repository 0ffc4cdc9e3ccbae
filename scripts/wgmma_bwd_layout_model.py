#!/usr/bin/env python3
"""scripts/wgmma_bwd_layout_model.py: a model of flash_bwd_sm90.cl's __local layout and wgmma operand reads (numpy; no GPU).

Written to review f17e189 (head dims 65..128, two warpgroups, 16-row tiles) before any GPU run: the
kernels' eight products over D 40/64/96/128, TROWS 16/32/64, WG 128/256, stage bases up to 256 KB,
compared exactly with numpy. MUT=<name> plants one known error (see the code) to show the model
catches it. Run: python3 scripts/wgmma_bwd_layout_model.py (about 45 s).

Layout: SW128_OFFSET (common_nv.cl) / TMA SWIZZLE_128B (boxes {64, TROWS}, one a panel).
Descriptors: sw128_desc (common_nv.cl) encoded, then decoded the way the hardware reads them
(PTX ISA "matrix descriptor"; CUTLASS mma_traits_sm90_gmma.hpp canonical layouts, uint128 units):
  K-major  B128: Swizzle<3,4,3> o ((8,m),2):((8,SBO),1)          (LBO unused)
  MN-major B128: Swizzle<3,4,3> o ((8,n),(8,k)):((1,LBO),(8,SBO))
The swizzle acts on the absolute shared address: bits [4:6] ^= bits [7:9] (base_offset 0).
Fragments: RS A (m64nNk16, per warp = m16n8k16's A), accumulator (row 16w+g(+8), col 8j+2t(+1)).

Kernel "dqa" (added to review 825773a): the dK/dV kernel with DQ_ATOMIC, its dkdv products plus
DS_STORE (each warp's dS^T fragments into dS[row][key] at DS_AT, SW128, nrows TROWS, 64-key panels)
and DQ_ADD (warpgroup 0 only: dQ^T = K^T dS^T, WGMMA_SS_NT with A = K^T M-major via B_N_MAJOR of
the own K tile, B = dS^T K-major via B_K_MAJOR of the dS tile, k over the OWN keys; then one red
per dQ element from the accumulator fragments), summed dQ compared with dS @ K
(DQA_DIMS: its head dims, 64,40,128,96 by default; 128 and 96 take DQ_ADD once a 64-dim panel). Its MUTs: ds_warp, ds_nrows, dqa_allwg, dqa_kmajor.

OWN_REGS (added 2026-12-05 for head dims 65..128): the own block's A fragments read by ldmatrix.x4
(SW128_A_FRAGS) into registers, the own block's __local then poisoned and taken by the stages
(OWN_AREA 0), the score products from those registers; every configuration the host accepts, at
its most stages.
Its MUT: ldsm_chunk (both halves of a k-step from one 16-byte chunk).
"""
import itertools, sys
import numpy as np, os
MUT = os.environ.get("MUT", "")
DQA_DIMS = tuple(int(d) for d in os.environ.get("DQA_DIMS", "64,40,128,96").split(","))  # DQ_ATOMIC head dims

SMEM = 256 * 1024


def sw128_offset(r, c, nrows):  # bytes, chunk c (16 B) of row r
    return ((c >> 3) * nrows + r) * 128 + (((c & 7) ^ (r & 7)) << 4)


def sw128_desc(addr):
    return ((addr & (0xFFFF if MUT == 'mask16' else 0x3FFFF)) >> 4) | ((1024 >> 4) << 16) | (((512 if MUT == 'sbo512' else 1024) >> 4) << 32) | (1 << 62)


def swz(addr):
    return addr ^ (((addr >> 7) & 7) << 4)


def decode(desc):
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    base_off = (desc >> 49) & 7
    mode = (desc >> 62) & 3
    assert mode == 1 and base_off == 0
    assert start & 0x380 == 0, 'start not on a 1024-byte swizzle row phase: base_offset would matter'
    return start, lbo, sbo


class Smem:
    def __init__(self):
        self.m = np.full(SMEM // 2, np.nan)  # halves; NaN = never written
        self.owner = {}

    def put_tile(self, base, mat, nrows, panels):
        """nv_copy_rows_to(sw128=1): rows >= mat.shape[0] and dims >= head_dim zero."""
        assert base % 1024 == 0
        for r in range(nrows):
            for c in range(8 * panels):
                off = base + sw128_offset(r, c, nrows)
                for e in range(8):
                    d = 8 * c + e
                    v = mat[r, d] if r < mat.shape[0] and d < mat.shape[1] else 0.0
                    self.m[(off >> 1) + e] = v

    def put_tma(self, dst, mat, nrows, panels):
        """TMA_PAIR: one box {64, nrows} a panel at dst + p*nrows*128, coordinate 64p; the
        SWIZZLE_128B pattern is the address's (dst panel 1024-aligned): 16-byte chunk c of
        box row r at r*128 + ((c ^ (addr bits 7-9)) << 4)."""
        for p in range(panels):
            pd = dst + p * nrows * 128
            for r in range(nrows):
                for c in range(8):
                    lin = pd + r * 128 + c * 16
                    for e in range(8):
                        d = 64 * p + 8 * c + e
                        v = mat[r, d] if r < mat.shape[0] and d < mat.shape[1] else 0.0
                        self.m[(swz(lin) >> 1) + e] = v

    def rd(self, addr):
        v = self.m[addr >> 1]
        if np.isnan(v):
            raise RuntimeError("read of unwritten __local at %#x" % addr)
        return v

    def kmajor(self, desc, rows):
        """rows x 16 operand, K-major, 128B swizzle: element (i, k)."""
        start, lbo, sbo = decode(desc)
        out = np.zeros((rows, 16))
        for i in range(rows):
            for k in range(16):
                lin = start + (i // 8) * sbo + (i % 8) * 128 + (k // 8) * 16 + (k % 8) * 2
                out[i, k] = self.rd(swz(lin))
        return out

    def nmajor(self, desc, n):
        """16 x n operand (k rows), MN-major, 128B swizzle: element (k, j)."""
        start, lbo, sbo = decode(desc)
        out = np.zeros((16, n))
        for k in range(16):
            for j in range(n):
                lin = start + (j // 64) * lbo + ((j % 64) // 8) * 16 + (j % 8) * 2 + (k // 8) * sbo + (k % 8) * 128
                out[k, j] = self.rd(swz(lin))
        return out


# ---- register fragments (per warp of a warpgroup: 32 lanes) ----
def acc_from_matrix(Mwg, nfr):
    """64 x (8 nfr) warpgroup accumulator -> d[warp][lane][j][e]."""
    d = np.zeros((4, 32, nfr, 4))
    for w, lane, j, e in itertools.product(range(4), range(32), range(nfr), range(4)):
        g, t = lane // 4, lane % 4
        d[w, lane, j, e] = Mwg[16 * w + g + 8 * (e >> 1), 8 * j + 2 * t + (e & 1)]
    return d


def acc_to_matrix(d):
    nfr = d.shape[2]
    M = np.full((64, 8 * nfr), np.nan)
    for w, lane, j, e in itertools.product(range(4), range(32), range(nfr), range(4)):
        g, t = lane // 4, lane % 4
        r, c = 16 * w + g + 8 * (e >> 1), 8 * j + 2 * t + (e & 1)
        assert np.isnan(M[r, c])
        M[r, c] = d[w, lane, j, e]
    assert not np.isnan(M).any()
    return M


def pack_a(d, t_steps):
    """PACK_A / ACC_TO_A: a[kk] = {lo0,lo1},{lo2,lo3},{hi0,hi1},{hi2,hi3}; a pair is (lo half, hi half)."""
    a = np.zeros((4, 32, t_steps, 4, 2))
    for w, lane, kk in itertools.product(range(4), range(32), range(t_steps)):
        lo, hi = d[w, lane, 2 * kk], d[w, lane, 2 * kk + 1]
        a[w, lane, kk] = [(lo[0], lo[1]), (hi[0], hi[1]), (lo[2], lo[3]), (hi[2], hi[3])] if MUT == 'pack' else [(lo[0], lo[1]), (lo[2], lo[3]), (hi[0], hi[1]), (hi[2], hi[3])]
    return a


def a_regs_to_matrix(a, kk):
    """wgmma m64nNk16 RS A: warp w rows 16w..; a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)."""
    M = np.full((64, 16), np.nan)
    for w, lane in itertools.product(range(4), range(32)):
        g, t = lane // 4, lane % 4
        for i, (dr, dc) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):
            for h in range(2):
                r, c = 16 * w + g + dr, 2 * t + dc + h
                assert np.isnan(M[r, c])
                M[r, c] = a[w, lane, kk, i, h]
    assert not np.isnan(M).any()
    return M


def ds_store(sm, ds_at, d_fr, warp0, TROWS):
    """DS_STORE: warp warp0+w's dS^T fragments (key 16 warp+g(+8), row 8j+2t(+1)) into
    dS[row][key] at ds_at, SW128_OFFSET(row, key/8, TROWS); returns the halves that fell past
    256 KB or were already written (twice by DS_STORE, or over a tile): none expected."""
    clash = 0
    for w, lane, j, e in itertools.product(range(4), range(32), range(d_fr.shape[2]), range(4)):
        g, t = lane // 4, lane % 4
        warp = (warp0 % 4 if MUT == 'ds_warp' else warp0) + w
        r, c = 8 * j + 2 * t + (e & 1), 16 * warp + g + 8 * (e >> 1)
        nrows = 64 if MUT == 'ds_nrows' else TROWS
        h = (ds_at + sw128_offset(r, c >> 3, nrows) + 2 * (c & 7)) >> 1
        if h >= sm.m.size or not np.isnan(sm.m[h]):
            clash += 1
            continue
        sm.m[h] = d_fr[w, lane, j, e]
    return clash


def dq_add(sm, k_own, ds_tile, D, TROWS, OWN, PANELS, dq, reds):
    """DQ_ADD by one warpgroup (warps 0-3): per 64-dim panel mb of K, dQ^T (64 dims x TROWS rows)
    = sum over kk < OWN/16 of A (K^T, M-major: B_N_MAJOR(kp, kk)) times B (dS^T, K-major:
    B_K_MAJOR(ds_tile, kk)); then lane (g,t) of warp w reds its fragment j, e into
    dq[8j+2t+(e&1)][64 mb+16w+g+8(e>>1)] (dims >= D skipped), counting reds per element."""
    for mb in range(PANELS):
        kp = k_own + mb * OWN * 128
        acc = np.zeros((64, TROWS))
        for kk in range(OWN // 16):
            A = sm.nmajor(sw128_desc(kp + kk * 2048), 64).T        # 64 dims x 16 keys
            if MUT == 'dqa_kmajor':  # A read K-major (tnsp_a = 0) instead
                A = sm.kmajor(sw128_desc(kp + (kk // 4) * (OWN * 128) + (kk % 4) * 32), 64)
            B = sm.kmajor(sw128_desc(ds_tile + (kk // 4) * (TROWS * 128) + (kk % 4) * 32), TROWS)
            acc += A @ B.T                                           # B: TROWS rows x 16 keys
        fr = acc_from_matrix(acc, TROWS // 8)
        for w, lane, j, e in itertools.product(range(4), range(32), range(TROWS // 8), range(4)):
            g, t = lane // 4, lane % 4
            row, d = 8 * j + 2 * t + (e & 1), 64 * mb + 16 * w + g + 8 * (e >> 1)
            if d < D:
                dq[row, d] += fr[w, lane, j, e]
                reds[row, d] += 1


def ldsm_a_frags(sm, tile, nrows, k_steps, warp0):
    """SW128_A_FRAGS (OWN_REGS): each warp's ldmatrix.x4 of its 16 rows, k-step kk at chunks
    2kk, 2kk+1; lane l gives the address of row 16 warp + l%16, chunk 2kk + l/16, and matrix i
    (lanes 8i..8i+7's rows) lands in register i of every lane: row l/4, halves 2(l%4), +1."""
    a = np.zeros((4, 32, k_steps, 4, 2))
    for w, lane, kk, i in itertools.product(range(4), range(32), range(k_steps), range(4)):
        src = 8 * i + lane // 4  # the lane whose address row the matrix's row comes from
        r = 16 * (warp0 + w) + src % 16
        c = 2 * kk + (src // 16 if MUT != 'ldsm_chunk' else 0)
        at = tile + sw128_offset(r, c, nrows) + 4 * (lane % 4)
        a[w, lane, kk, i] = (sm.rd(at), sm.rd(at + 2))
    return a


def run(D, TROWS, WG, s_base, stage, stages, kernel, rng, own_regs=False):
    dqa = kernel == "dqa"  # the dK/dV kernel with DQ_ATOMIC
    kernel = "dkdv" if dqa else kernel
    PANELS = (D + 63) // 64
    OWN = WG // 2
    OWN_BYTES = OWN * 128 * PANELS
    K_STEPS = 4 * PANELS
    T_BYTES = TROWS * 128 * PANELS
    STAGE_BYTES = 2 * T_BYTES
    S_FRAGS, T_STEPS = TROWS // 8, TROWS // 16
    DP = 64 * PANELS
    sm = Smem()
    ri = lambda r, c: rng.integers(-4, 5, size=(r, c)).astype(np.float64)
    X, Z = ri(OWN, D), ri(OWN, D)          # own block: K, V (dkdv) or Q, dO (dq)
    Y, W = ri(TROWS, D), ri(TROWS, D)      # streamed: Q, dO (dkdv) or K, V (dq)
    x_own, z_own = s_base, s_base + OWN_BYTES
    sm.put_tile(x_own, X, OWN, PANELS)     # COPY_TILE(0u, ...)
    sm.put_tile(z_own, Z, OWN, PANELS)     # COPY_TILE(OWN_BYTES, ...)
    own_area = 0 if own_regs else 2 * OWN_BYTES  # OWN_AREA: with OWN_REGS the stages take the own block's bytes
    if own_regs:  # OWN_FRAGS_HELD: every warpgroup's fragments, then the block's __local is free
        held = [(ldsm_a_frags(sm, x_own, OWN, K_STEPS, 4 * wgi), ldsm_a_frags(sm, z_own, OWN, K_STEPS, 4 * wgi))
                for wgi in range(WG // 128)]
        sm.m[s_base // 2:(s_base + 2 * OWN_BYTES) // 2] = np.nan  # a later read of the own block fails
    y_tile = s_base + own_area + stage * STAGE_BYTES
    w_tile = y_tile + T_BYTES
    assert w_tile + T_BYTES <= s_base + own_area + stages * STAGE_BYTES
    if stage % 2:  # alternate the two fill paths
        sm.put_tile(y_tile, Y, TROWS, PANELS)
        sm.put_tile(w_tile, W, TROWS, PANELS)
    else:
        sm.put_tma(y_tile, Y, TROWS, PANELS)
        sm.put_tma(w_tile, W, TROWS, PANELS)
    pad = lambda M: np.pad(M, ((0, 0), (0, DP - M.shape[1])))
    fails = []
    ds_at = s_base + 2 * OWN_BYTES + stages * STAGE_BYTES  # s_base + DS_AT
    assert not dqa or (ds_at % 1024 == 0 and ds_at + TROWS * OWN * 2 <= SMEM)
    ds_parts = []  # each warpgroup's dS^T (its 64 keys x TROWS rows)
    for wgi in range(WG // 128):
        rows = slice(64 * wgi, 64 * wgi + 64)
        warp = 4 * wgi  # any warp of the warpgroup: warp / 4 is uniform

        def A_K_MAJOR(tile, kk):
            return sw128_desc(tile + (kk // 4) * ((TROWS if MUT == 'a_panel' else OWN) * 128) + ((warp // 4) * 8192 if WG > 128 and MUT != 'no8192' else 0) + (kk % 4) * 32)

        def B_K_MAJOR(tile, kk):
            return sw128_desc(tile + (kk // 4) * (TROWS * 128) + (kk % 4) * 32)

        def B_N_MAJOR(tile, kk):
            return sw128_desc(tile + kk * 2048)

        def chain_ss_xyt(x, y):  # CHAIN_SS_XYT: m64 n TROWS k16, both K-major
            acc = np.zeros((64, TROWS))
            for kk in range(K_STEPS):
                A = sm.kmajor(A_K_MAJOR(x, kk), 64)
                B = sm.kmajor(B_K_MAJOR(y, kk), TROWS)
                acc = (acc if kk else 0) + A @ B.T
            return acc

        def chain_rs_xyt(a, y):  # CHAIN_XYT with held fragments: m64 n TROWS k16, B K-major
            acc = np.zeros((64, TROWS))
            for kk in range(K_STEPS):
                acc = (acc if kk else 0) + a_regs_to_matrix(a, kk) @ sm.kmajor(B_K_MAJOR(y, kk), TROWS).T
            return acc

        if own_regs:
            s = chain_rs_xyt(held[wgi][0], y_tile)
            dp = chain_rs_xyt(held[wgi][1], w_tile)
        else:
            s = chain_ss_xyt(x_own, y_tile)
            dp = chain_ss_xyt(z_own, w_tile)
        for name, got, want in (("S(T)=X Y^T", s, X[rows] @ Y.T), ("dP(T)=Z W^T", dp, Z[rows] @ W.T)):
            if not np.array_equal(got, want):
                bad = np.argwhere(got != want)
                fails.append("%s wg%d: %d bad, first %s" % (name, wgi, len(bad), bad[:4].tolist()))
        # accumulator fragments as the elementwise code sees them
        s_fr = acc_from_matrix(s, S_FRAGS)
        dp_fr = acc_from_matrix(dp, S_FRAGS)
        assert np.array_equal(acc_to_matrix(s_fr), s)
        # elementwise step stand-ins: P^T := S^T / 2, dS^T := dP^T (exact in f16 for small ints)
        P = s / 2
        dS = dp
        pa = pack_a(acc_from_matrix(P, S_FRAGS), T_STEPS)
        da = pack_a(acc_from_matrix(dS, S_FRAGS), T_STEPS)
        if dqa:  # DS_STORE(dp): this warpgroup's warps 4 wgi..
            clash = ds_store(sm, ds_at, acc_from_matrix(dS, S_FRAGS), 4 * wgi, TROWS)
            if clash:
                fails.append("DS_STORE wg%d: %d halves past 256 KB, written twice or over a tile" % (wgi, clash))
            ds_parts.append(dS)
        for kk in range(T_STEPS):
            assert np.array_equal(a_regs_to_matrix(pa, kk), P[:, 16 * kk:16 * kk + 16])
            assert np.array_equal(a_regs_to_matrix(da, kk), dS[:, 16 * kk:16 * kk + 16])

        def chain_ay(a, y):  # CHAIN_AY, PANELS 2: acc + 8 hh, B at y + hh*TROWS*128 + kk*2048
            acc = np.zeros((64, 8 * 8 * PANELS))
            for kk in range(T_STEPS):
                A = a_regs_to_matrix(a, kk)
                for hh in range(PANELS):
                    if PANELS == 1:
                        B = sm.nmajor(B_N_MAJOR(y, kk), 64)
                    else:
                        B = sm.nmajor(B_N_MAJOR(y + hh * ((OWN if MUT == 'ay_panel' else TROWS) * 128), kk), 64)
                    acc[:, 64 * hh:64 * hh + 64] += A @ B
            return acc

        if kernel == "dkdv":
            dv = chain_ay(pa, w_tile)   # dV += P^T dO   (w = dO tile)
            dk = chain_ay(da, y_tile)   # dK += dS^T Q   (y = Q tile)
            checks = (("dV+=P^T dO", dv, P @ pad(W)), ("dK+=dS^T Q", dk, dS @ pad(Y)))
        else:
            dq = chain_ay(da, y_tile)   # dQ += dS K     (y = K tile)
            checks = (("dQ+=dS K", dq, dS @ pad(Y)),)
        for name, got, want in checks:
            # fragments of the D_FRAGS-wide accumulator round trip too
            assert np.array_equal(acc_to_matrix(acc_from_matrix(got, 8 * PANELS)), got)
            if not np.array_equal(got, want):
                bad = np.argwhere(got != want)
                fails.append("%s wg%d: %d bad, first %s" % (name, wgi, len(bad), bad[:4].tolist()))
    if dqa:  # after the barrier: DQ_ADD by warpgroup 0 (`WG == 128 || warp < 4`)
        dq, reds = np.zeros((TROWS, D)), np.zeros((TROWS, D), dtype=int)
        try:
            for wgi in range(WG // 128 if MUT == 'dqa_allwg' else 1):
                dq_add(sm, x_own, ds_at, D, TROWS, OWN, PANELS, dq, reds)
        except RuntimeError as e:  # a descriptor read of __local that nothing wrote
            return fails + ["dQ+=dS K (DQ_ATOMIC): %s" % e]
        want = np.vstack(ds_parts).T @ X   # dQ = dS K: TROWS rows x D, k over the OWN keys
        if not np.array_equal(dq, want) or not (reds == 1).all():
            bad = np.argwhere(dq != want)
            fails.append("dQ+=dS K (DQ_ATOMIC): %d bad, first %s; reds per element %d..%d"
                         % (len(bad), bad[:4].tolist(), reds.min(), reds.max()))
    return fails


def desc_field_check():
    """Every shared address < 256 KB, 16-byte aligned: the 14-bit start field round-trips."""
    for addr in range(0, SMEM, 16):
        assert ((sw128_desc(addr) & 0x3FFF) << 4) == addr
    return True


def main():
    rng = np.random.default_rng(1)
    desc_field_check()
    counts = [0, 0]  # configurations, failing

    def check(kernel, D, TROWS, WG, s_base, stage, stages, own_regs=False):
        f = run(D, TROWS, WG, s_base, stage, stages, kernel, rng, own_regs=own_regs)
        counts[0] += 1
        tag = "%s%s D=%d TROWS=%d WG=%d base=%#x stage=%d/%d" % (kernel, " OWN_REGS" if own_regs else "", D, TROWS,
                                                                 WG, s_base, stage, stages)
        if f:
            counts[1] += 1
            print("FAIL", tag, *f, sep="\n  ")
        else:
            print("ok  ", tag)

    def sizes(D, TROWS, WG):  # PANELS, OWN_BYTES, STAGE_BYTES
        panels = (D + 63) // 64
        return panels, (WG // 2) * 128 * panels, 2 * TROWS * 128 * panels

    cases = list(itertools.product(("dkdv", "dq"), (128, 96, 64, 40), (16, 32, 64), (128, 256)))
    cases += list(itertools.product(("dqa",), DQA_DIMS, (16, 32, 64), (128, 256)))  # after: same rng draws above
    for kernel, D, TROWS, WG in cases:
        _, OWN_BYTES, STAGE_BYTES = sizes(D, TROWS, WG)
        # stages as large as fit ~170 KB, and bases: 0, 1 KB, and one pushing the last stage near 256 KB
        stages = max(1, min(8, (170 * 1024 - 2 * OWN_BYTES - 1024) // STAGE_BYTES))
        span = 2 * OWN_BYTES + stages * STAGE_BYTES + (TROWS * WG if kernel == "dqa" else 0)  # + DS_BYTES
        for s_base in sorted({0, 1024, (SMEM - span) // 1024 * 1024}):
            for stage in sorted({0, stages - 1}):
                check(kernel, D, TROWS, WG, s_base, stage, stages)
    # OWN_REGS (one warpgroup; WG 256 too at one panel): the own block's fragments by ldmatrix,
    # then the stages over its bytes
    # (100, 80, 77 and 72: the held path is the default at head dims 65..128, and a second panel of
    # 36, 16, 13 or 8 real dims is zero-filled past them)
    for kernel, D, TROWS, WG in itertools.product(("dkdv", "dq"), (128, 100, 96, 80, 77, 72, 64, 40), (16, 32, 64),
                                                 (128, 256)):
        PANELS, OWN_BYTES, STAGE_BYTES = sizes(D, TROWS, WG)
        if PANELS > 1 and TROWS == 64:  # refused by the host (src/params_backward.c: ptxas spills)
            continue
        # the most stages the host lets through (backward_wgmma_bytes): the larger of the own block
        # and the stages, the dK/dV kernel's stats (two floats a row and stage), 1 KB, within 48000
        fits = [st for st in range(1, 9)
                if max(2 * OWN_BYTES, st * STAGE_BYTES) + st * 2 * TROWS * 4 + 1024 <= 48000]
        if not fits:
            continue
        for s_base in (0, 1024 * 7):
            for stage in sorted({0, fits[-1] - 1}):
                check(kernel, D, TROWS, WG, s_base, stage, fits[-1], own_regs=True)
    print("%d configs, %d failing" % tuple(counts))
    return 1 if counts[1] else 0


if __name__ == "__main__":
    sys.exit(main())
