#!/usr/bin/env bash
# scripts/test.sh: set up a fresh Debian machine, build flashcl, and run the quick test suite on PoCL.
#   scripts/test.sh            quick suite (label "quick")
#   scripts/test.sh long       also the long sweep
# Set FLASHCL_WERROR=ON / FLASHCL_SANITIZE=ON to build with -Werror / ASan+UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${FLASHCL_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} \
      -DFLASHCL_WERROR=${FLASHCL_WERROR:-OFF} -DFLASHCL_SANITIZE=${FLASHCL_SANITIZE:-OFF} >/dev/null
cmake --build "$build" -j"$(nproc)"
label=quick
[ "${1:-}" = long ] && label='quick|long'
ctest --test-dir "$build" -L "$label" --output-on-failure -j"$(nproc)"
