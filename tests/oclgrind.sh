#!/usr/bin/env bash
# tests/oclgrind.sh: runs one test program under Oclgrind (ctest -L oclgrind) and fails on any
# diagnostic Oclgrind prints, whatever the program's exit status: Oclgrind reports invalid
# accesses, data races and divergent barriers as messages and leaves the exit code alone.
#   oclgrind.sh LOG PROGRAM [ARGS...]
# --data-races adds race checks to its default checks (out-of-bounds accesses, barrier
# divergence, API errors). Not --uninitialized: it aborts on LLVM's freeze instruction.
set -uo pipefail
log=$1; shift
mkdir -p "$(dirname "$log")"
rm -f "$log"
oclgrind --data-races --log "$log" "$@"
rc=$?
if [ -s "$log" ]; then
  # Each diagnostic opens with a line like "Invalid write of size 4 at global memory address ..."
  # or "Read-write data race at global memory address ...", followed by its kernel and entity.
  n=$(grep -c -E '^(Invalid|Read-write|Write-write|Work-group divergence|Work-item divergence|Uninitialized|Oclgrind)' "$log")
  echo "oclgrind: $n diagnostic(s) in $log (program exit status $rc); the first:"
  head -n 40 "$log"
  exit 1
fi
[ "$rc" -eq 0 ] || echo "oclgrind: no diagnostic, but the program exited with status $rc"
exit "$rc"
