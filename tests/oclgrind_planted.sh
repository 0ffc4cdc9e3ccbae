#!/usr/bin/env bash
# tests/oclgrind_planted.sh: the oclgrind label cannot pass vacuously. attn_merge (cl/merge.cl),
# copied to a FLASHCL_KERNEL_DIR with one planted store one element past the end of `out`
# (the last work-item writes out[io + 1]; out is packed and exactly its size in
# `test_serving oclgrind-merge`), must make tests/oclgrind.sh fail with an invalid write in
# attn_merge; the same run on the untouched file must pass.
#   oclgrind_planted.sh CL_DIR TEST_SERVING WORK_DIR
set -uo pipefail
cl=$1 prog=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work/kernels"
cp "$cl"/*.cl "$work/kernels/"
store='    STORE_ELEM(out, io, x * inv);'
grep -qxF "$store" "$work/kernels/merge.cl" || { echo "FAILED: cl/merge.cl no longer has the line to plant after: $store"; exit 1; }
plant='    if (d == (int)get_global_size(0) - 1 \&\& sh == (int)get_global_size(1) - 1 \&\& b == (int)get_global_size(2) - 1) STORE_ELEM(out, io + 1, x); /* planted */'
sed -i "s#^    STORE_ELEM(out, io, x \* inv);\$#&\n$plant#" "$work/kernels/merge.cl"
grep -q planted "$work/kernels/merge.cl" || { echo "FAILED: could not plant the store"; exit 1; }
failures=0
# A cache of its own: the planted kernel's binary must not be found under the real one's key, nor stay behind.
export FLASHCL_CACHE_DIR=$work/cache
if bash "$here/oclgrind.sh" "$work/clean.log" "$prog" oclgrind-merge > "$work/clean.out" 2>&1; then
  echo "the untouched attn_merge: no diagnostic: ok"
else
  echo "the untouched attn_merge: FAILED"; cat "$work/clean.out"; failures=$((failures + 1))
fi
if FLASHCL_KERNEL_DIR=$work/kernels bash "$here/oclgrind.sh" "$work/planted.log" "$prog" oclgrind-merge > "$work/planted.out" 2>&1; then
  echo "the planted out-of-bounds store: FAILED (the run passed)"; cat "$work/planted.out"; failures=$((failures + 1))
elif grep -q 'Invalid write' "$work/planted.log" && grep -q 'attn_merge' "$work/planted.log"; then
  echo "the planted out-of-bounds store: reported and failing: ok"
  head -n 12 "$work/planted.log"
else
  echo "the planted out-of-bounds store: FAILED (no invalid write in attn_merge reported)"; cat "$work/planted.out"
  failures=$((failures + 1))
fi
exit "$failures"
