#!/usr/bin/env bash
# bench/h200.sh: one call on the H200 machine: register NVIDIA's OpenCL, build,
# run the correctness suite on the GPU, then time flashcl next to PyTorch.
#   bench/h200.sh [tests|bench|all]      (results also under $OUT when set)
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-/tmp/flashcl-out}
mkdir -p "$out" /etc/OpenCL/vendors
echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFLASHCL_WERROR=ON >/dev/null
cmake --build build-gpu -j"$(nproc)" 2>&1 | grep -E 'error|warning' 
export FLASHCL_CACHE_DIR=$PWD/build-gpu/kernel-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
./build-gpu/flashcl devices | tee "$out/devices.txt"
if [ "$what" != bench ]; then
  for variant in default portable; do
    [ $variant = portable ] && export FLASHCL_VARIANT=portable || unset FLASHCL_VARIANT
    echo "== tests on the GPU, variant $variant"
    for t in test_forward test_errors test_cache; do
      FLASHCL_TEST_DEVICE=nvidia ./build-gpu/tests/$t quick > "$out/$t-$variant.log" 2>&1
      echo "$t ($variant): exit $? $(tail -1 "$out/$t-$variant.log")"
    done
    grep FAILED "$out/test_forward-$variant.log" | head -5
    ./build-gpu/flashcl check --device nvidia --cases 40 > "$out/check-$variant.log" 2>&1
    echo "flashcl check --cases 40 ($variant): exit $?"
  done
  unset FLASHCL_VARIANT
fi
if [ "$what" != tests ]; then
  PYTHONUNBUFFERED=1 python3 bench/compare_torch.py --flashcl build-gpu/flashcl --json "$out/compare.json" \
    --label "(default variants)" | tee "$out/compare.txt"
  FLASHCL_VARIANT=portable PYTHONUNBUFFERED=1 python3 bench/compare_torch.py --flashcl build-gpu/flashcl \
    --dtypes f16 --label "(portable kernel only)" | tee "$out/compare-portable.txt"
  ./build-gpu/flashcl bench --device nvidia --shape 1,8,65536,64 --causal --dtype f16 --memory | tee "$out/memory.txt"
fi
