#!/usr/bin/env python3
"""compare_backward.py: flashcl's backward next to PyTorch's SDPA backward, same card, same run.

flashcl is timed by its own CLI (`flashcl bench --backward --json`: OpenCL
profiling events around all its backward kernels, after a forward, warm-up,
median of --iters). PyTorch: scaled_dot_product_attention forward once under
sdpa_kernel(backend), then torch.autograd.grad(out, (q, k, v), dout) timed by
CUDA events (warm-up, median of the same count); autograd.grad rather than
out.backward so no .grad accumulation is timed. Then by wall clock: --iters
calls back to back, one wait at the end, per call (flashcl's `wall_ms`;
PyTorch between two events around the whole run, which is what the host waits
for). FLOPs = 2.5 * 4*B*H*N*N*D, halved when causal, for both (flash-attn's
convention). Prints one markdown table of TFLOP/s, each cell "events | wall";
--json writes the raw rows. torch is imported lazily: without it (or without
CUDA) the torch columns read n/a.

    python3 bench/compare_backward.py --flashcl build/flashcl [--json out.json]
"""
import argparse
import importlib.util
import json
import subprocess
import sys
import warnings

SHAPES = [(4, 32, 4096, 64), (4, 32, 4096, 128), (1, 32, 16384, 128)]
BACKENDS = ("flash", "cudnn", "efficient")  # FA2, cuDNN, memory-efficient


def flashcl_rows(exe, device, dtype, shapes, iters, warmup):
    """Runs `flashcl bench --backward --json` once per dtype; returns {(shape, causal): row}."""
    cmd = [exe, "bench", "--backward", "--json", "--device", device, "--dtype", dtype,
           "--iters", str(iters), "--warmup", str(warmup)]
    for s in shapes:
        cmd += ["--shape", ",".join(map(str, s))]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        sys.stderr.write(f"cannot run {exe}: {e}\n")
        return {}
    if out.returncode != 0:  # a failed row still leaves a document (its "error" set)
        sys.stderr.write(out.stderr)
    try:
        doc = json.loads(out.stdout)
    except json.JSONDecodeError:
        sys.stderr.write("flashcl bench --backward printed no JSON:\n" + out.stdout + out.stderr)
        return {}
    return {((r["batch"], r["heads_q"], r["seqlen_q"], r["head_dim"]), r["causal"]): r
            for r in doc["rows"]}


def torch_tflops(shape, dtype, causal, backend, iters, warmup):
    """(TFLOP/s by the median of per-call events, TFLOP/s by wall clock back to back) of SDPA's
    backward with one backend, or (None, None): no torch or CUDA, or the backend refused."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None, None
    if not torch.cuda.is_available():
        return None, None
    b, h, n, d = shape
    tdtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    warnings.simplefilter("ignore", UserWarning)  # "kernel not used because": the RuntimeError says it
    try:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=tdtype, requires_grad=True)
                   for _ in range(3))
        with sdpa_kernel([which]):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            dout = torch.randn_like(out)
            for _ in range(warmup):
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            times = []
            for _ in range(iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            end.record()
            torch.cuda.synchronize()
            wall_ms = start.elapsed_time(end) / iters
    except RuntimeError as e:  # backend does not support this dtype/shape (or out of memory)
        sys.stderr.write(f"torch {backend} {shape} {dtype} causal={causal}: {str(e).splitlines()[0]}\n")
        return None, None
    finally:
        torch.cuda.empty_cache()
    times.sort()
    ms = times[len(times) // 2]
    flops = 2.5 * 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    return flops / (ms * 1e-3) / 1e12, flops / (wall_ms * 1e-3) / 1e12


def flops_of(shape, causal):
    b, h, n, d = shape
    return 2.5 * 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flashcl", default="build/flashcl", help="the flashcl executable")
    ap.add_argument("--device", default="nvidia", help=argparse.SUPPRESS)  # e.g. cpu, to test the parsing
    ap.add_argument("--dtypes", default="f16,bf16")
    ap.add_argument("--shapes", nargs="+", metavar="B,H,N,D",
                    help="shapes (default " + " ".join(",".join(map(str, s)) for s in SHAPES) + ")")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="write all rows here ('-': stdout, after the table)")
    ap.add_argument("--label", default="", help="a note for the table title (e.g. variant)")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else SHAPES
    if any(len(s) != 4 for s in shapes):
        ap.error("--shapes wants B,H,N,D")

    def fmt(x):
        return "n/a" if not x else f"{x:.1f}" if x >= 10 else f"{x:.3g}"

    def pair(t):  # "events | wall"
        return f"{fmt(t[0])} \\| {fmt(t[1])}"

    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "n/a"

    if importlib.util.find_spec("torch") is None:
        sys.stderr.write("torch is not installed: the torch columns read n/a\n")

    results = []
    print(f"### flashcl backward vs PyTorch SDPA backward {args.label}\n\n"
          f"TFLOP/s (2.5x the forward's FLOPs): events, median of {args.iters} | wall clock, "
          f"{args.iters} back to back\n")
    print("| B,H,N,D | dtype | mask | flashcl | FA2 | cuDNN | mem-eff | flashcl / FA2 |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |", flush=True)
    for dtype in args.dtypes.split(","):
        fc = flashcl_rows(args.flashcl, args.device, dtype, shapes, args.iters, args.warmup)
        for shape in shapes:
            for causal in (False, True):
                r = fc.get((shape, causal), {})
                wall = r.get("wall_ms")
                mine = ((r.get("tflops"), flops_of(shape, causal) / (wall * 1e-3) / 1e12 if wall and wall > 0 else None)
                        if not r.get("error") else (None, None))
                peers = {be: torch_tflops(shape, dtype, causal, be, args.iters, args.warmup)
                         for be in BACKENDS}
                mark = " (INVALID)" if r.get("validated") == "INVALID" else ""
                fa2 = peers["flash"]
                print(f"| {','.join(map(str, shape))} | {dtype} | {'causal' if causal else 'none'} | "
                      f"{pair(mine)}{mark} | {pair(fa2)} | {pair(peers['cudnn'])} | "
                      f"{pair(peers['efficient'])} | {ratio(mine[0], fa2[0])} \\| {ratio(mine[1], fa2[1])} |",
                      flush=True)
                results.append({"shape": shape, "dtype": dtype, "causal": causal, "flashcl": r,
                                "flashcl_wall_tflops": mine[1],
                                "torch_tflops": {be: p[0] for be, p in peers.items()},
                                "torch_wall_tflops": {be: p[1] for be, p in peers.items()}})
    if args.json == "-":
        json.dump(results, sys.stdout, indent=1)
        print()
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
