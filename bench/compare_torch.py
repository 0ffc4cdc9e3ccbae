#!/usr/bin/env python3
"""compare_torch.py: flashcl's forward next to PyTorch's scaled_dot_product_attention, same card, same run.

Two timings of each. By events: flashcl's CLI (`flashcl bench --json`: OpenCL
profiling events, warm-up, median of --iters), PyTorch by CUDA events around
each call (warm-up, median of the same count). By wall clock: --iters calls
back to back, one wait at the end, per call (flashcl's `wall_ms`; PyTorch
between two events around the whole run, which is what the host waits for).
FLOPs = 4*B*H*N*N*D, halved when causal, for both. Prints one table with the
ratios (events, then wall clock) and writes the raw rows as JSON.

FP8 (--dtypes e4m3 or e5m2): PyTorch has no FP8 attention, so its peers run
float16, and flashcl's own float16 forward is measured in the same run too:
the table then gives FP8 / own f16 and FP8 / cuDNN f16, issue 35's two bars.
FLASHCL_PARAMS in the environment reaches the runs of the dtypes listed (e.g.
VARIANT=nv-wgmma-fp8 with --dtypes e4m3), not those own float16 runs.
--v-packed passes `--v-packed` to flashcl's runs of FP8 dtypes (V packed once, untimed, by
flashcl_fp8_pack_v: the timed calls skip the Hopper kernel's per-call V transpose); their rows
read "e4m3+vp" (the JSON: "v_packed": true).

    python3 bench/compare_torch.py --flashcl build/flashcl [--dtypes f16,e4m3] [--json out.json]
                                   [--shape B,H,N,D ...] [--v-packed]
"""
import os
import argparse
import json
import subprocess
import sys

SHAPES = [(4, 32, 1024, 64), (4, 32, 4096, 64), (4, 32, 4096, 128), (1, 32, 16384, 128),
          (16, 16, 512, 64)]


FP8 = ("e4m3", "e5m2")


def flops(shape, causal):
    b, h, n, d = shape
    return 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)


def flashcl_rows(exe, device, dtype, shapes, iters, extra_env=None, v_packed=False):
    """Runs `flashcl bench --json` once per dtype (v_packed: with --v-packed, FP8 only); returns
    {(shape, causal): row}, each row with `wall_tflops` added (from its wall_ms)."""
    cmd = [exe, "bench", "--json", "--device", device, "--dtype", dtype, "--iters", str(iters)]
    if v_packed:
        cmd.append("--v-packed")
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
        wall = r.get("wall_ms")
        r["wall_tflops"] = flops(key[0], key[1]) / (wall * 1e-3) / 1e12 if wall and not r.get("error") else None
        rows[key] = r
    return rows


def torch_tflops(shape, dtype, causal, backend, iters):
    """(TFLOP/s by the median of per-call events, TFLOP/s by wall clock back to back), or (None, None)."""
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
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            end.record()
            torch.cuda.synchronize()
            wall_ms = start.elapsed_time(end) / iters
    except RuntimeError:
        return None, None  # backend does not support this dtype/shape
    times.sort()
    ms = times[len(times) // 2]
    f = flops(shape, causal)
    return f / (ms * 1e-3) / 1e12, f / (wall_ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashcl", default="build/flashcl")
    ap.add_argument("--device", default="nvidia")
    ap.add_argument("--dtypes", default="f16,bf16,f32")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", help="write all rows here")
    ap.add_argument("--label", default="", help="a note for the table title (e.g. variant)")
    ap.add_argument("--shape", action="append", metavar="B,H,N,D",
                    help="a shape to run (repeatable; default: SHAPES, every one)")
    ap.add_argument("--v-packed", action="store_true",
                    help="FP8 dtypes: flashcl bench --v-packed (V packed once, untimed; rows 'e4m3+vp')")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] if args.shape else SHAPES
    if any(len(s) != 4 or min(s) < 1 for s in shapes):
        ap.error("--shape takes four positive integers, B,H,N,D")

    results = []
    dw = 7 if args.v_packed else 5  # the dtype column: room for "e4m3+vp"
    vp_note = "; FP8 rows +vp: V packed once, untimed" if args.v_packed else ""
    print(f"flashcl vs PyTorch SDPA {args.label} (TFLOP/s: events, median of {args.iters} | wall clock, "
          f"{args.iters} back to back; ratio = flashcl / peer, events | wall{vp_note})")
    print(f"{'B,H,N,D':>16} {'dtype':>{dw}} {'mask':>6} {'flashcl':>13} {'check':>6} {'FA2':>13} "
          f"{'cuDNN':>13} {'memeff':>13} {'vs FA2':>11} {'vs cuDNN':>11} {'own f16':>13} {'vs own f16':>11}")
    # FLASHCL_PARAMS is for the dtypes listed (see the docstring), not FP8's own float16 runs.
    plain_env = {k: v for k, v in os.environ.items() if k != "FLASHCL_PARAMS"}
    for dtype in args.dtypes.split(","):
        fp8 = dtype in FP8
        peer_dtype = "f16" if fp8 else dtype
        packed = fp8 and args.v_packed
        label = dtype + "+vp" if packed else dtype  # +vp: V packed once (flashcl bench --v-packed)
        fc = flashcl_rows(args.flashcl, args.device, dtype, shapes, args.iters, v_packed=packed)
        own = flashcl_rows(args.flashcl, args.device, "f16", shapes, args.iters, plain_env) if fp8 else {}
        for shape in shapes:
            for causal in (False, True):
                r = fc.get((shape, causal), {})
                mine = (r.get("tflops"), r.get("wall_tflops")) if not r.get("error") else (None, None)
                o = own.get((shape, causal), {})
                own_f16 = (o.get("tflops"), o.get("wall_tflops")) if o and not o.get("error") else (None, None)
                peers = {be: torch_tflops(shape, peer_dtype, causal, be, args.iters)
                         for be in ("flash", "cudnn", "efficient")}

                def ratio(p):
                    return "|".join(f"{m / x:.2f}" if m and x else "-" for m, x in zip(mine, p))

                def fmt(x):
                    return "|".join(f"{v:.1f}" if v else "-" for v in x)
                print(f"{','.join(map(str, shape)):>16} {label:>{dw}} {'causal' if causal else 'none':>6} "
                      f"{fmt(mine):>13} {r.get('validated', '-'):>6} {fmt(peers['flash']):>13} "
                      f"{fmt(peers['cudnn']):>13} {fmt(peers['efficient']):>13} "
                      f"{ratio(peers['flash']):>11} {ratio(peers['cudnn']):>11} "
                      f"{fmt(own_f16) if fp8 else '':>13} {ratio(own_f16) if fp8 else '':>11}", flush=True)
                results.append({"shape": shape, "dtype": dtype, "v_packed": packed, "causal": causal, "flashcl": r,
                                "torch_dtype": peer_dtype,
                                "torch_tflops": {be: p[0] for be, p in peers.items()},
                                "torch_wall_tflops": {be: p[1] for be, p in peers.items()},
                                "flashcl_f16": o if fp8 else None})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
