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

cc -O2 -march=native -pthread "$root/bench/fma_peak.c" -o "$build/fma_peak"
peak=$("$build/fma_peak")
exec "$venv/bin/python" "$root/bench/cpu_vs_torch.py" --flashcl "$exe" --peak "$peak" "$@"
