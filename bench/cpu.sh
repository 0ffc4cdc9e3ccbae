#!/usr/bin/env bash
# cpu.sh: flashcl's CPU paths against PyTorch's CPU SDPA on this machine (bench/cpu_vs_torch.py).
#
#   bench/cpu.sh [--quick] [--rounds R] [--iters N] [--json out.json]
#
# Needs a Release build in $BUILD_DIR (default build/: `scripts/setup.sh` or the README's cmake
# lines). PyTorch is a peer to measure against, not a dependency of flashcl: it goes into a
# virtual environment under the build folder ($BUILD_DIR/torch-venv, about 3 GB with the CUDA
# libraries PyPI's wheel pulls in), installed on the first run. bench/fma_peak.c is compiled
# with -march=native for the machine's FMA ceiling.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
exe=$build/flashcl
[ -x "$exe" ] || { echo "cpu.sh: no $exe: build flashcl first (README, Building)" >&2; exit 1; }

venv=$build/torch-venv
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "cpu.sh: installing PyTorch into $venv (first run only)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check torch numpy
fi

# Threads pinned to cores on both sides. Unpinned, PoCL's two worker threads sometimes share one
# core for a whole run: (1,8,1024,64) f32 on the 2-core EPYC, 2026-12-04, `flashcl bench --device
# cpu --iters 30`, 5 of 22 runs at 0.5-0.75x the others' event-timed median (back-to-back wall
# clock unaffected), 0 of 22 with POCL_AFFINITY=1. PyTorch's OpenMP threads get the same
# (OMP_PROC_BIND=true; it read 0-10 % higher with it in the same session). Either can be overridden.
export POCL_AFFINITY=${POCL_AFFINITY:-1} OMP_PROC_BIND=${OMP_PROC_BIND:-true}

cc -O2 -march=native -pthread "$root/bench/fma_peak.c" -o "$build/fma_peak"
peak=$("$build/fma_peak")
exec "$venv/bin/python" "$root/bench/cpu_vs_torch.py" --flashcl "$exe" --peak "$peak" "$@"
