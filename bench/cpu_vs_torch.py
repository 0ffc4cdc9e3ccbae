#!/usr/bin/env python3
"""cpu_vs_torch.py: flashcl on the CPU (PoCL's `cpu` kernels and the no-OpenCL host path) next to
PyTorch's CPU scaled_dot_product_attention, same machine, same run, float32.

flashcl is timed by its CLI (`flashcl bench --json`, `flashcl bench --backward --json`): the median
of --iters calls by OpenCL profiling events, and `wall_ms`, the wall clock per call of --iters calls
enqueued back to back; the host path by wall clock per call. PyTorch by wall clock per call (CPU
calls are synchronous), median of the same count, with torch.set_num_threads(the CPUs flashcl
uses). FLOPs = 4*B*H*N*N*D forward and 2.5x that backward, halved when causal, for both.
The machine's FMA ceiling (bench/fma_peak.c) is printed with the table.

Run through bench/cpu.sh, which builds fma_peak and puts PyTorch in a virtual environment:
    bench/cpu.sh [--quick] [--rounds R] [--iters N] [--json out.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# The CPUs this process may run on, read before PyTorch loads: with OMP_PROC_BIND set (bench/cpu.sh
# sets it), its OpenMP runtime binds this thread to one core, and a child process inherits that
# mask. flashcl's runs get the whole set back (a host-path run bound to one core ran at half speed).
ALL_CPUS = os.sched_getaffinity(0)

FORWARD = [(1, 8, 1024, 64), (1, 8, 4096, 64), (1, 4, 2048, 128)]
SWEEP = [(1, 8, n, 64) for n in (1024, 2048, 4096, 8192, 16384)]
BACKWARD = [(1, 8, 1024, 64)]


def flashcl(exe, device, shapes, iters, backward=False, causal=None):
    cmd = [exe, "bench"] + (["--backward"] if backward else []) + [
        "--json", "--device", device, "--dtype", "f32", "--iters", str(iters), "--warmup", "2"]
    if causal is not None:
        cmd.append("--causal" if causal else "--no-causal")
    for s in shapes:
        cmd += ["--shape", ",".join(map(str, s))]
    out = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=lambda: os.sched_setaffinity(0, ALL_CPUS))
    try:
        doc = json.loads(out.stdout)
    except json.JSONDecodeError:
        sys.exit("flashcl printed no JSON for %s:\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    rows = {}
    for r in doc["rows"]:
        if r.get("error"):
            sys.exit("flashcl %s: %s" % (" ".join(cmd), r["error"]))
        if r.get("validated") == "fail":
            sys.exit("flashcl %s: validation failed" % " ".join(cmd))
        key = ((r["batch"], r["heads_q"], r["seqlen_q"], r["head_dim"]), r["causal"])
        wall = r.get("wall_ms")
        rows[key] = {"median_ms": r["median_ms"], "wall_ms": wall if wall is not None else r["median_ms"],
                     "validated": r["validated"], "params": r.get("params")}
    return rows


def torch_ms(shape, causal, iters, backward=False):
    import torch
    b, h, n, d = shape
    q, k, v = (torch.randn(b, h, n, d, requires_grad=backward) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if backward:
        o = sdpa(q, k, v, is_causal=causal)
        g = torch.randn_like(o)
        call = lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
    else:
        call = lambda: sdpa(q, k, v, is_causal=causal)
    with torch.no_grad() if not backward else torch.enable_grad():
        call()  # warm-up: two calls, as flashcl gets
        call()
        times = []
        start = time.perf_counter()
        for _ in range(iters):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e3)
        total = (time.perf_counter() - start) * 1e3
    return statistics.median(times), total / iters


def gflops(shape, causal, ms, backward=False):
    b, h, n, d = shape
    f = 4.0 * b * h * n * n * d * (2.5 if backward else 1.0) / (2 if causal else 1)
    return f / (ms * 1e-3) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashcl", required=True)
    ap.add_argument("--peak", help="fma_peak's JSON line")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; figures are medians over them")
    ap.add_argument("--quick", action="store_true", help="the main shapes only: no sweep to 16384")
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args()
    import torch
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    peak = json.loads(args.peak) if args.peak else None

    results = []
    print("flashcl on the CPU against PyTorch %s CPU SDPA (%d threads), float32, GFLOP/s: medians over %d "
          "interleaved rounds (the sweep: %d) of each round's median of %d calls (flashcl cpu by events; "
          "wall = per call of %d back to back)" % (torch.__version__, threads, args.rounds, max(1, args.rounds - 1),
                                                   args.iters, args.iters))
    print("threads: POCL_AFFINITY=%s, OMP_PROC_BIND=%s (bench/cpu.sh pins both)" %
          (os.environ.get("POCL_AFFINITY", "unset"), os.environ.get("OMP_PROC_BIND", "unset")))
    if peak:
        print("FMA ceiling (bench/fma_peak.c, %d threads, %d lanes): %.1f GFLOP/s" %
              (peak["threads"], peak["lanes"], peak["gflops"]))
    print()
    print("| pass | B,H,N,D | mask | flashcl cpu | cpu wall | host | torch | cpu / torch | "
          "cpu wall / torch | host / cpu |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

    def table(kind, shapes, with_host, rounds):
        """rounds of (flashcl cpu, flashcl host, torch), interleaved, so that a slow
        stretch of a shared machine falls on every side; each figure is the
        median over rounds of that round's median."""
        backward = kind == "backward"
        runs = {"cpu": [], "host": [], "torch": {}}
        for _ in range(rounds):
            runs["cpu"].append(flashcl(args.flashcl, "cpu", shapes, args.iters, backward))
            if with_host:
                runs["host"].append(flashcl(args.flashcl, "host", shapes, max(1, args.iters // 2), backward))
            for shape in shapes:
                for causal in (False, True):
                    runs["torch"].setdefault((shape, causal), []).append(
                        torch_ms(shape, causal, args.iters, backward))
        med = statistics.median
        for shape in shapes:
            for causal in (False, True):
                key = (shape, causal)
                c = runs["cpu"][0][key]
                t_med = med(t[0] for t in runs["torch"][key])
                t_wall = med(t[1] for t in runs["torch"][key])
                row = {"pass": kind, "shape": shape, "causal": causal, "rounds": rounds,
                       "cpu_gflops": gflops(shape, causal, med(r[key]["median_ms"] for r in runs["cpu"]), backward),
                       "cpu_wall_gflops": gflops(shape, causal, med(r[key]["wall_ms"] for r in runs["cpu"]), backward),
                       "torch_gflops": gflops(shape, causal, t_med, backward),
                       "torch_wall_gflops": gflops(shape, causal, t_wall, backward),
                       "cpu_params": c["params"], "validated": c["validated"]}
                if with_host:
                    row["host_gflops"] = gflops(shape, causal, med(r[key]["median_ms"] for r in runs["host"]),
                                                backward)
                results.append(row)
                h = "%.1f" % row["host_gflops"] if "host_gflops" in row else "-"
                hc = "%.2f" % (row["host_gflops"] / row["cpu_gflops"]) if "host_gflops" in row else "-"
                print("| %s | %s | %s | %.1f | %.1f | %s | %.1f | %.2f | %.2f | %s |" % (
                    kind, ",".join(map(str, shape)), "causal" if causal else "none", row["cpu_gflops"],
                    row["cpu_wall_gflops"], h, row["torch_gflops"], row["cpu_gflops"] / row["torch_gflops"],
                    row["cpu_wall_gflops"] / row["torch_wall_gflops"], hc))
                sys.stdout.flush()

    table("forward", FORWARD, True, args.rounds)
    table("backward", BACKWARD, True, args.rounds)
    if not args.quick:
        table("forward", [s for s in SWEEP if s not in FORWARD], True, max(1, args.rounds - 1))
        for path in ("cpu", "host"):
            for causal in (False, True):
                sweep = [r[path + "_gflops"] for r in results if r["pass"] == "forward" and r["shape"] in SWEEP
                         and r["causal"] == causal and path + "_gflops" in r]
                if sweep:
                    print("\nforward, (1,8,N,64) %s, N = 1024..16384: %s %.1f..%.1f GFLOP/s, lowest %.0f %% of "
                          "the best" % ("causal" if causal else "no mask", "PoCL cpu" if path == "cpu" else "host path",
                                        min(sweep), max(sweep), 100.0 * min(sweep) / max(sweep)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peak": peak, "rows": results}, f, indent=1, default=list)


if __name__ == "__main__":
    main()
