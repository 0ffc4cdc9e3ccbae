#!/usr/bin/env bash
# scripts/tsan.sh: the shared-context test (tests/test_threads.c) under ThreadSanitizer, on PoCL
# and on the host C path. Any race report in flashcl's own code fails it; races inside the
# OpenCL implementation, which is not built with TSan, are suppressed (tests/tsan.supp).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${FLASHCL_BUILD_DIR:-build-tsan}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DFLASHCL_SANITIZE=thread -DFLASHCL_BUILD_TOOLS=OFF \
      -DFLASHCL_WERROR=${FLASHCL_WERROR:-OFF} >/dev/null
cmake --build "$build" -j"$(nproc)" --target test_threads
export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp halt_on_error=1 exitcode=66 second_deadlock_stack=1"
ctest --test-dir "$build" -R '^test_threads' --output-on-failure
