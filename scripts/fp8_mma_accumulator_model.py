#!/usr/bin/env python3
"""fp8_mma_accumulator_model.py: what Hopper's FP8 MMA accumulator does to nv-wgmma-fp8
(cl/flash_fwd_sm90_fp8.cl), modelled in numpy, no GPU needed.

The FP8 warpgroup MMA does not sum in float32. Two published measurements:
  - DeepSeek-V3's report (section 3.5.2): a k-step's products are aligned to the largest one's
    exponent and only the top 14 bits of each are kept (truncated) before they are added;
  - SageAttention2: the D an MMA adds to keeps 13 mantissa bits (the low 10 of a float32 zeroed).
This script applies both to S = Q K^T, and the accumulator's truncation to O = P V (its sums of
products exact: adding the 14-bit alignment there, or truncating each MMA's output too, moved the
32768-key figures below by under 0.05 points in a review of the script), and prints:
  1. O = P V chained through the MMA's accumulator over every 128-key tile (the kernel before
     PV_TWO_LEVEL) against one fresh accumulator a tile, added in float32 (PV_TWO_LEVEL): O's
     shift along the exact result and its RMS error, relative, by key count;
  2. the LSE's error from S = Q K^T chained over the head dim's 32-byte k-steps: the share of rows
     outside test_fp8_forward's float tolerance (1e-4 + 1e-5 |lse|), the worst error, and the worst
     error over the row's largest sum |q||k| x scale, by format, head dim and factor size;
  3. ROWSUM_MMA's row sums of P through the MMA (backed out in c12e791): how far they put the
     LSE below the exact sum of the same rounded P.
Usage: scripts/fp8_mma_accumulator_model.py [KEYS ...]   (default 4096 32768 131072; 131072 takes
about a minute). Inputs: N(0,1) rounded to the format, one head, 64 query rows.
"""
import sys

import numpy as np

rng = np.random.default_rng(1)


def rounded(x, mbits, emin, top):
    """x rounded to nearest even with mbits mantissa bits, normal from 2^emin (subnormals below),
    saturating at top: e4m3 (3, -6, 448) and e5m2 (2, -14, 57344)."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 2.0 ** (emin - mbits)))), emin)
    step = 2.0 ** (e - mbits)
    return np.sign(x) * np.minimum(np.round(a / step) * step, top)


def e4m3(x):
    return rounded(x, 3, -6, 448.0)


def e5m2(x):
    return rounded(x, 2, -14, 57344.0)


def fp22(x):
    """The accumulator an FP8 MMA adds to: float32 with its low 10 mantissa bits zeroed."""
    x = np.asarray(x, np.float32).copy()
    x.view(np.uint32)[...] &= np.uint32(0xFFFFFC00)
    return x


def k_step(a, b):
    """One MMA k-step, a [rows, 32] times b [32, cols]: each product aligned to the largest of its
    32 and floored to 14 bits (sign-fill right shift), then summed."""
    p = a[:, None, :] * b.T[None, :, :]
    top = np.floor(np.log2(np.maximum(np.abs(p).max(2, keepdims=True), 1e-300)))
    grid = 2.0 ** (top - 13)
    return (np.floor(p / grid) * grid).sum(2)


def o_shift(keys, head_dim=128, rows=64, mode="chain"):
    """O of the kernel's online softmax over 128-key tiles, P as e4m3(256 p): mode exact (float32
    sums), chain (O through the FP8 accumulator every k-step of every tile) or two-level (a fresh
    accumulator a tile, added in float32). Returns O's shift along the exact O and its RMS error."""
    q = e4m3(rng.standard_normal((rows, head_dim)))
    k = e4m3(rng.standard_normal((keys, head_dim)))
    v = e4m3(rng.standard_normal((keys, head_dim)))
    s = (q @ k.T) / np.sqrt(head_dim)
    p = np.exp(s - s.max(1, keepdims=True))
    ref = (p @ v) / p.sum(1, keepdims=True)
    acc = np.zeros((rows, head_dim), np.float32)
    m_run = np.full((rows, 1), -np.inf)
    l_run = np.zeros((rows, 1))
    for n0 in range(0, keys, 128):
        st = s[:, n0:n0 + 128]
        m_new = np.maximum(m_run, st.max(1, keepdims=True))
        alpha = np.exp(m_run - m_new)
        pt = np.exp(st - m_new)
        l_run = l_run * alpha + pt.sum(1, keepdims=True)
        m_run = m_new
        acc = (acc * alpha).astype(np.float32)
        p8 = e4m3(256 * pt)
        t = acc if mode != "two-level" else np.zeros_like(acc)
        for kk in range(4):
            if mode == "chain" or (mode == "two-level" and kk):
                t = fp22(t)
            t = (t + p8[:, 32 * kk:32 * kk + 32] @ v[n0 + 32 * kk:n0 + 32 * kk + 32]).astype(np.float32)
        acc = t if mode != "two-level" else (acc + t).astype(np.float32)
    out = acc / (256 * l_run)
    shift = np.sum((out - ref) * ref) / np.sum(ref * ref)
    rms = np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref ** 2))
    return shift, rms


def lse_error(fmt, head_dim, factor, keys=300, rows=128):
    """S = Q K^T through the MMA (k_step per 32 head dims, chained through fp22), scaled by
    factor / sqrt(head_dim); the LSE against float64's. Returns (share of rows outside 1e-4 +
    1e-5 |lse|, worst error, log2 of the worst error over the row's largest sum |q||k| x scale)."""
    q = fmt(rng.standard_normal((rows, head_dim)))
    k = fmt(rng.standard_normal((keys, head_dim)))
    c = factor / np.sqrt(head_dim)
    s = np.zeros((rows, keys), np.float32)
    for kk in range(0, head_dim, 32):
        if kk:
            s = fp22(s)
        s = (s + k_step(q[:, kk:kk + 32], k[:, kk:kk + 32].T)).astype(np.float32)

    def lse(x):
        return x.max(1) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1))

    exact = lse((q @ k.T) * c)
    err = np.abs(lse(s.astype(np.float64) * c) - exact)
    sums = (np.abs(q) @ np.abs(k).T * c).max(1)
    return np.mean(err > 1e-4 + 1e-5 * np.abs(exact)), err.max(), np.log2((err / sums).max())


def rowsum_lse_low(keys, head_dim, factor, rows=256):
    """ROWSUM_MMA (built, then backed out in c12e791): each row's sum of P (256 exp(S - M) in
    e4m3 against each 128-key tile's running max) through the MMA against an all-0.25 B, four
    32-key k-steps chained in the accumulator, tiles added in float32 with their factors.
    Returns how far that LSE falls below the exact sum's of the same rounded P: max, median."""
    q = e4m3(rng.standard_normal((rows, head_dim)) * factor)
    k = e4m3(rng.standard_normal((keys, head_dim)))
    s = q @ k.T / np.sqrt(head_dim)
    low = []
    for r in range(rows):
        m, l_mma, l_exact = -np.inf, 0.0, 0.0
        for t0 in range(0, keys, 128):
            m_new = max(m, s[r, t0:t0 + 128].max())
            alpha = np.exp(m - m_new) if m > -np.inf else 1.0
            p = np.zeros(128)
            p[:min(128, keys - t0)] = e4m3(256.0 * np.exp(s[r, t0:t0 + 128] - m_new))
            acc = np.zeros((1, 8), np.float32)
            for k0 in range(0, 128, 32):
                acc = fp22(acc + k_step(p[None, k0:k0 + 32], np.full((32, 8), 0.25)).astype(np.float32))
            l_mma = np.float32(l_mma * alpha + 4.0 * acc[0, 0])
            l_exact = l_exact * alpha + p.sum()
            m = m_new
        low.append(np.log(l_exact) - np.log(l_mma))
    return max(low), float(np.median(low))


def main():
    keys_list = [int(a) for a in sys.argv[1:]] or [4096, 32768, 131072]
    print("1. O = P V, D=128, 64 rows: shift along the exact O | RMS error, relative")
    for keys in keys_list:
        row = [f"{mode} {shift:+.4f} | {rms:.4f}" for mode in ("exact", "chain", "two-level")
               for shift, rms in [o_shift(keys, mode=mode)]]
        print(f"   {keys:6d} keys: " + ";  ".join(row))
    print("2. the LSE from S through the MMA, 300 keys, 128 rows: rows outside the float tolerance, "
          "worst error, worst error / largest sum |q||k| x scale")
    for name, fmt in (("e4m3", e4m3), ("e5m2", e5m2)):
        for head_dim in (32, 128):
            for factor in (0.25, 1.0, 4.0):
                share, worst, ratio = lse_error(fmt, head_dim, factor)
                print(f"   {name} D={head_dim:3d} factors {factor:4.2f}: {100 * share:5.1f} % of rows, "
                      f"worst {worst:.2g}, 2^{ratio:.1f}")
    print("3. ROWSUM_MMA's LSE (the row sums of e4m3 P through the MMA), e4m3, 256 rows: how far below "
          "the exact sum's LSE, worst and median")
    for keys, head_dim, factor in ((111, 64, 2.0), (300, 64, 1.0), (300, 64, 3.0), (300, 64, 20.0),
                                   (300, 128, 1.0), (4096, 64, 1.0)):
        worst, median = rowsum_lse_low(keys, head_dim, factor)
        print(f"   {keys:5d} keys D={head_dim:3d} factors {factor:4.1f}: worst {worst:.5f}, median {median:.5f}")


if __name__ == "__main__":
    main()
