#!/usr/bin/env python3
"""compare_torch.py: flashcl's forward next to PyTorch's scaled_dot_product_attention, same card, same run.

flashcl is timed by its own CLI (`flashcl bench --json`: OpenCL profiling
events, warm-up, median of --iters); PyTorch by CUDA events around each call
(warm-up, median of the same count). FLOPs = 4*B*H*N*N*D, halved when causal,
for both. Prints one table with the ratios and writes the raw rows as JSON.

    python3 bench/compare_torch.py --flashcl build/flashcl [--json out.json]
"""
import argparse
import json
import subprocess
import sys

SHAPES = [(4, 32, 1024, 64), (4, 32, 4096, 64), (4, 32, 4096, 128), (1, 32, 16384, 128),
          (16, 16, 512, 64)]


def flashcl_rows(exe, device, dtype, shapes, iters, extra_env=None):
    """Runs `flashcl bench --json` once per dtype; returns {(shape, causal): row}."""
    cmd = [exe, "bench", "--json", "--device", device, "--dtype", dtype, "--iters", str(iters)]
    for s in shapes:
        cmd += ["--shape", ",".join(map(str, s))]
    out = subprocess.run(cmd, capture_output=True, text=True, env=extra_env)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
    rows = {}
    try:
        doc = json.loads(out.stdout)
    except json.JSONDecodeError:
        sys.stderr.write("flashcl bench printed no JSON:\n" + out.stdout + out.stderr)
        return rows
    for r in doc["rows"]:
        key = ((r["batch"], r["heads_q"], r["seqlen_q"], r["head_dim"]), r["causal"])
        rows[key] = r
    return rows


def torch_tflops(shape, dtype, causal, backend, iters):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, h, n, d = shape
    tdtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=tdtype) for _ in range(3))
    which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    try:
        with sdpa_kernel([which]):
            for _ in range(3):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            times = []
            for _ in range(iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
    except RuntimeError:
        return None  # backend does not support this dtype/shape
    times.sort()
    ms = times[len(times) // 2]
    flops = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    return flops / (ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashcl", default="build/flashcl")
    ap.add_argument("--device", default="nvidia")
    ap.add_argument("--dtypes", default="f16,bf16,f32")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", help="write all rows here")
    ap.add_argument("--label", default="", help="a note for the table title (e.g. variant)")
    args = ap.parse_args()

    results = []
    print(f"flashcl vs PyTorch SDPA {args.label} (TFLOP/s, median of {args.iters}; ratio = flashcl / peer)")
    print(f"{'B,H,N,D':>16} {'dtype':>5} {'mask':>6} {'flashcl':>8} {'check':>6} {'FA2':>7} "
          f"{'cuDNN':>7} {'memeff':>7} {'vs FA2':>7} {'vs memeff':>9}")
    for dtype in args.dtypes.split(","):
        fc = flashcl_rows(args.flashcl, args.device, dtype, SHAPES, args.iters)
        for shape in SHAPES:
            for causal in (False, True):
                r = fc.get((shape, causal), {})
                mine = r.get("tflops") if not r.get("error") else None
                peers = {be: torch_tflops(shape, dtype, causal, be, args.iters)
                         for be in ("flash", "cudnn", "efficient")}

                def ratio(p):
                    return f"{mine / p:.2f}x" if mine and p else "-"

                def fmt(x):
                    return f"{x:.1f}" if x else "-"
                print(f"{','.join(map(str, shape)):>16} {dtype:>5} {'causal' if causal else 'none':>6} "
                      f"{fmt(mine):>8} {r.get('validated', '-'):>6} {fmt(peers['flash']):>7} "
                      f"{fmt(peers['cudnn']):>7} {fmt(peers['efficient']):>7} "
                      f"{ratio(peers['flash']):>7} {ratio(peers['efficient']):>9}", flush=True)
                results.append({"shape": shape, "dtype": dtype, "causal": causal, "flashcl": r,
                                "torch_tflops": peers})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
