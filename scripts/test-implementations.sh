#!/usr/bin/env bash
# scripts/test-implementations.sh: the quick forward, backward, serving, speculative, FP8, error
# and parameter tests and `flashcl check --cases 200` on each OpenCL implementation (CTest labels
# impl-pocl, impl-intel, impl-rusticl), after scripts/setup-implementations.sh. Run by .ci/run;
# needs a configured build.
#   scripts/test-implementations.sh [IMPL...]        (default: pocl intel rusticl)
# An implementation whose device cannot be found prints one line "IMPL: NOT TESTED: ..." and
# counts as a failure only with FLASHCL_REQUIRE_IMPLS=1; the summary names every one. A label
# that runs and fails makes the script fail.
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${FLASHCL_BUILD_DIR:-build}" && pwd)
impls=("$@")
[ ${#impls[@]} -eq 0 ] && impls=(pocl intel rusticl)
# Not root (or not CI): Intel's runtime is registered in the build's own vendors directory; so
# too where the system's registration names a library that is gone (an earlier CI build's).
[ -d "$build/icd-vendors" ] && [ ! -f "$(cat /etc/OpenCL/vendors/intel-cpu.icd 2>/dev/null)" ] &&
  export OCL_ICD_VENDORS=$build/icd-vendors
jobs=$(nproc)
status=0 summary=()
for impl in "${impls[@]}"; do
  env=()
  [ "$impl" = rusticl ] && env=(RUSTICL_ENABLE=llvmpipe)
  # A device on a platform the implementation's word names (name, vendor or version: "rusticl",
  # "Intel(R) OpenCL", "PoCL"): the spec "$impl:" the tests use, which no device name can match.
  if ! env "${env[@]}" "$build/flashcl" devices --device "$impl:" >/dev/null 2>&1; then
    echo "$impl: NOT TESTED: no OpenCL device of this implementation (scripts/setup-implementations.sh did not install it)"
    summary+=("$impl: NOT TESTED (not installed)")
    [ "${FLASHCL_REQUIRE_IMPLS:-0}" = 1 ] && status=1
    continue
  fi
  start=$(date +%s)
  ctest --test-dir "$build" -L "^impl-$impl\$" --output-on-failure -j"$jobs" > "$build/impl-$impl.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  tail -n 25 "$build/impl-$impl.log" | sed -n '/tests passed\|tests failed/,$p'
  if [ $rc -eq 0 ]; then
    summary+=("$impl: passed (${took} s)")
  else
    # The failing tests' output is in the log; show the start of each failure.
    grep -E 'FAILED|Failed|\*\*\*' "$build/impl-$impl.log" | head -n 40
    summary+=("$impl: FAILED (${took} s, log $build/impl-$impl.log)")
    status=1
  fi
done
echo "OpenCL implementations:"
printf '  %s\n' "${summary[@]}"
exit $status
