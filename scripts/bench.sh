#!/usr/bin/env bash
# scripts/bench.sh: set up, build, and run `flashcl bench` on the default device (PoCL's CPU without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target flashcl_cli
./build/flashcl devices
./build/flashcl bench "$@"
