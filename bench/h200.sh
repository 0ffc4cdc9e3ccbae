#!/usr/bin/env bash
# bench/h200.sh: one call on the H200 machine: register NVIDIA's OpenCL, build,
# run the correctness suite on the GPU, then time flashcl next to PyTorch.
#   bench/h200.sh [tests|bench|all|final|decode|serve|backward|fp32|fp8|fp8-kernel|fp8-gap|fp8-table|forward|regs|profile|sanitize|study|optin|pending|setup]   (results also under $OUT when set)
# REQUIRE_CARD=H200 (any text nvidia-smi -L prints): stop at once, exit 3, on another card. A run
# for an H200 often gets an H100; this spends seconds of the device budget, not a build's minutes.
# pending: what waits for a GPU (docs/perf-notes.md, "Waiting for a GPU"), in one call: the
#         decode rule over FP8 pages checked by the serving tests, then decode over e4m3 against
#         PyTorch's FA2 over the whole grid (see the mode).
# fp8-table: issue 35's FP8 forward table in one call: the packed V's and the FP8 forward's
#         Hopper tests side by side (FP8_TABLE_TESTS, default test_fp8_packed_v in its wgmma and
#         plain modes and test_fp8_forward wgmma; empty: none), then, where they passed,
#         compare_torch.py --dtypes e4m3 at the issue's three shapes with V as it comes and packed
#         (--v-packed), each cut at its share of what is left of CALL_BUDGET seconds (default 585,
#         from the script's start) or at TABLE_TIMEOUT where less; tables as
#         $out/fp8-table{,-packed}.txt. On an H100 (2026-12-06, 9485ac4) the whole call took
#         417 s, the setup build included. TABLE_TIMEOUT is a number of seconds (0: no table).
# setup: only register NVIDIA's OpenCL and build (build-gpu/), for commands of one's own after it.
# fp8-gap: where an FP8 forward call's wall clock goes beyond its kernel (bench/fp8_call_gap.c,
#         linked against the static library: factors kept or uploaded, V's transpose alone) at
#         GAP_SHAPES ("B,H,N,D", default issue 35's three); its table as $out/fp8-gap.txt.
# profile: builds only bench/ptx_harness and ptx_fwd_harness (-DFLASHCL_BUILD_BENCH_HARNESS=ON).
#         ptx_harness relaunches the backward's kernels through the CUDA driver, checks them bitwise against flashcl's and times
#         both, at each of SHAPES ("B,H,N,D", default 4,32,4096,64 4,32,4096,128; f16, non-causal;
#         HARNESS_ARGS added, e.g. "--causal" or "--dtype bf16"), then runs ncu on its dK/dV and dQ
#         launches (NCU_SECTIONS; details text, raw CSV, PTX and .ncu-rep under $OUT). With
#         FLASHCL_BWD_PARAMS set, flashcl (and so the profile) runs that choice: an opt-in shape's.
#         FWD_SHAPES ("B,H,N,D,dtype[,causal]", e.g. "4,32,4096,128,e4m3,causal"; SHAPES= to skip
#         the backward): the same for the forward (and FP8's V transpose) by ptx_fwd_harness.
# sanitize: compute-sanitizer (each of SAN_TOOLS, default memcheck racecheck synccheck) on
#         the kernels the harnesses relaunch through the CUDA driver: the backward's at each of
#         SAN_SHAPES ("B,H,N,D[,causal]", default D=64 and 128, 256 keys, causal and not), the
#         forward's at SAN_FWD_SHAPES ("B,H,N,D,dtype[,causal]", default f16 causal and e4m3 at
#         1,2,256,128). A run exits 9 where the tool reports an error, else with the harness's own
#         check (0: equal to flashcl's). Logs under $out/sanitize-*.log.
# replay: one launch of a flashcl run recorded at the OpenCL API and relaunched through the CUDA driver
#         (bench/ptx_replay.c, target flashcl_replay: the CLI with its OpenCL calls recorded), checked
#         bitwise against OpenCL's and timed, then under ncu, for each REPLAYS entry "KERNEL|CLI ARGS"
#         ("+" for a space; default the e4m3 decode kernel, paged_decode_nv, at batch 4 x 16384 keys,
#         16 x 4096 and 16 x 16384; none starts past REPLAY_BUDGET seconds, default 300). For
#         kernels without tensor maps (the serving kernels). The decode bench's K and V are
#         constants (its own check needs constant V): a profile, not a check of varied data, which
#         test_ptx_replay (PTX_REPLAY_VIA=cuda) gives.
# study: the backward's cost of NVIDIA's 48 KB of __local (issue 36): bench/ptx_harness --study at
#         each of STUDY_SHAPES ("B,H,N,D[,causal]", default 4,32,4096,64; f16; one a call fits
#         the 600 s limit with room; D > 64: the nv-wgmma backward on request),
#         every STUDY_CONFIGS entry (WG,ROWS,STAGES[,MAXNREG] specs; default: the shipping tiles, two
#         warpgroups in 41-45 KB, then ones needing about 50, 65, 97 and 129-145 KB) with that much dynamic shared
#         memory, checked against flashcl's gradients and timed; then PyTorch's FA2 and cuDNN
#         backward at the same shapes (compare_backward.py) for the ratio.
# optin: the nv-wgmma backward's opt-in shapes that fit 48 KB (FLASHCL_BWD_PARAMS): test_backward
#         wgmma, then `flashcl bench --backward` under each (STUDY_BWD_PARAMS) at OPTIN_SHAPES.
# forward: test_wgmma_layout (one wgmma per tile layout: which read as meant), test_forward wgmma
#         and mma (tile shapes forced) and quick on the GPU (TESTS="a b+mode": these instead; TESTS="":
#         none, for a call that only times what an earlier one validated), wgmma also under each of
#         FWD_OPTIONS' build options ("+" for a space: FWD_OPTIONS=-DOVERLAP=1), fp16/bf16
#         vs PyTorch (DTYPES=none: not). SWEEP=1 first: ptxas and TFLOP/s at
#         D in SWEEP_DIMS (128) for the defaults and each SWEEP_PARAMS entry,
#         "FLASHCL_PARAMS value[|extra build options]".
# regs: forward, backward and decode timings under register caps (CAPS; CAPS=""
#         only the uncapped row), all with EXTRA build options (e.g.
#         -DCP_ASYNC_L2=256), then TESTS (binaries) with TEST_ARG under TEST_OPTIONS.
# fp32: the forward and serving tests on the GPU (nv-tf32 forced through its tile
#         shapes too), nv-tf32's registers, float32 vs PyTorch, a FLASHCL_PARAMS sweep.
# backward: the backward tests on the GPU (nv-wgmma and nv-mma forced too; TESTS as forward's), the kernels'
#         registers, the time per backward kernel (FLASHCL_PROFILE) at issue 5's shapes,
#         backward vs PyTorch, two forward rows (SWEEP=1: a FLASHCL_BWD_PARAMS sweep first).
# decode: the serving tests on the GPU (TESTS="": none), the decode kernel's registers, decode vs
#         PyTorch (each of COMPARES, "params@page": "-@16"; ""), a sweep of FLASHCL_DECODE_PARAMS values
#         (DECODE_SWEEP, at SWEEP_BATCH x SWEEP_CONTEXT, pages of SWEEP_KV: e4m3 for an FP8 pool), then (DECODE_OPTIONS, "+"
#         for a space: DECODE_OPTIONS="-DCP_ASYNC_L2=256 -DCP_ASYNC_L2=256+-DQ_IN_LOCAL=1") build-option
#         variants of the decode kernels, each passing test_serving mma before it is timed.
# serve: the serving tests on the GPU, one decode row, and serve-sim.
# fp8: the FP8 tests on the GPU (TESTS as forward's): formats and quantize, the dense forward,
#      FP8 pages on the default, decode and mma kernels; the mma kernel's registers over e4m3
#      pages; decode over e4m3 pages under each DECODE_FP8_PARAMS value (default: the default
#      and HG_KEYS=16); decode over an e4m3 pool against PyTorch's float16 FlashAttention-2 and flashcl's
#      own float16 pool (compare_decode.py --kv-dtype e4m3, ROUNDS, default 2); the FP8 forward's
#      TFLOP/s next to the float16 one's (FWD_SHAPES); the FP8 wgmma kernel (nv-wgmma-fp8, named):
#      its registers, compare_torch.py --dtypes e4m3 (against PyTorch's float16 and flashcl's own,
#      events and wall clock) and FA3's accuracy experiment on it (bench/fp8_accuracy.c --out f16).
# fp8-kernel: the FP8 warpgroup-MMA forward (nv-wgmma-fp8) in two calls of under 600 s on
#      one warm machine. PART=1: test_wgmma_layout, test_fp8_forward as built, with cp.async copies
#      (FLASHCL_TMA=0) and under -DPV_CHAINED=1 (O through the FP8 MMA's accumulator; its 32768-key
#      case checks the shrink a model predicted, which an H100 did not show at b7482a2), then (as
#      built passing) compare_torch.py --dtypes e4m3 and FA3's accuracy run.
#      PART=2: test_fp8_forward under each FP8_TEST_OPTIONS entry side by side (default none;
#      earlier calls tested -DFLASHCL_NV_MAXNREG=128, the D <= 64 default since 4cfd997,
#      -DSOFTMAX_CHAINS=4 -DOVERLAP=1 -DEX2_FMA_EVERY=4 -DK_EARLY=0), then `flashcl bench --dtype
#      e4m3` at FP8_SHAPES (default issue 35's three) under each FP8_OPTIONS entry (default: as
#      built, twice, the run's spread; "+" for a space; FLASHCL_* entries are environment settings,
#      a FLASHCL_PARAMS entry overriding the mode's VARIANT=nv-wgmma-fp8, e.g. the two-warpgroup
#      shape FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8,WARPS=8,BLOCK_M=128;
#      --v-packed: `flashcl bench --v-packed`, V packed once, untimed, so no per-call V transpose,
#      its rows ending "v-packed"; none starts past FP8_BUDGET seconds, default 480) and flashcl's
#      f16, then NVIDIA's own PTX of the kernel (D=128 as built, D=64 under FP8_SASS_OPTIONS,
#      default none, and with FP8_SASS_PARAMS appended to its FLASHCL_PARAMS, e.g.
#      ",WARPS=8,BLOCK_M=128") through ptxas and the in-flight check. PART=1's cp.async and PV_CHAINED builds were timed by PART=2 with
#      FP8_TEST_OPTIONS= FP8_OPTIONS="- FLASHCL_TMA=0 -DPV_CHAINED=1 -".
# final: the suite with the default variants (forward, serving, backward),
#        fp16/bf16 forward vs PyTorch, decode vs PyTorch, tuning runs, a plot.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${REQUIRE_CARD:-}" ] && ! nvidia-smi -L | grep -q -- "$REQUIRE_CARD"; then
  echo "not a $REQUIRE_CARD card: $(nvidia-smi -L)"; exit 3
fi
what=${1:-all}
out=${OUT:-/tmp/flashcl-out}
mkdir -p "$out" /etc/OpenCL/vendors
echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd
# No -Werror here: this machine's gcc 13 warns where CI's gcc 12 (which runs -Werror) does not.
harness=; targets=
case $what in
  profile) harness=-DFLASHCL_BUILD_BENCH_HARNESS=ON targets="--target ptx_harness ptx_fwd_harness" ;;
  sanitize) harness=-DFLASHCL_BUILD_BENCH_HARNESS=ON targets="--target ptx_harness ptx_fwd_harness flashcl_cli" ;;
  replay) harness=-DFLASHCL_BUILD_BENCH_HARNESS=ON targets="--target flashcl_replay" ;;
  study) harness=-DFLASHCL_BUILD_BENCH_HARNESS=ON targets="--target ptx_harness flashcl_cli" ;;
  optin) targets="--target flashcl_cli test_backward" ;;
  pending) targets="--target flashcl_cli test_serving_fp8 test_params" ;;
  fp8-gap) targets="--target flashcl_static flashcl_cli" ;;
esac
# The configure step's errors stay on stderr; a build that leaves no CLI ends the call with its
# log's tail (a failed configure once went unseen here: its "Error" is capitalised).
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release $harness >/dev/null
cmake --build build-gpu -j"$(nproc)" $targets > "$out/build.log" 2>&1
grep -iE 'error|warning' "$out/build.log"
if [ -z "$targets" ] || [[ $targets == *flashcl_cli* ]]; then
  [ -x build-gpu/flashcl ] || { echo "the build left no build-gpu/flashcl:"; tail -n 30 "$out/build.log"; exit 1; }
fi
export FLASHCL_CACHE_DIR=$PWD/build-gpu/kernel-cache
# gpu_test "BINARY [MODE]" [TAG]: one test binary on the GPU; its log goes under $out, its last
# line and first failures to the output. A "+" stands for the space, so that a TESTS list given
# on the command line can name modes: TESTS="test_serving test_serving+mma".
# Returns the test's exit status.
gpu_test() {
  local t=${1//+/ } rc
  local log="$out/${t//[ \/]/_}${2:+-$2}.log" # "test_backward wgmma 0/6": test_backward_wgmma_0_6.log
  # GPU_TEST_TIMEOUT (seconds): the modes that must fit one 600-second call bound each test.
  FLASHCL_TEST_DEVICE=nvidia ${GPU_TEST_TIMEOUT:+timeout $GPU_TEST_TIMEOUT} stdbuf -oL ./build-gpu/tests/$t > "$log" 2>&1
  rc=$?
  echo "$t${2:+ ($2)}: exit $rc $(tail -n 1 "$log")"
  grep -m5 FAILED "$log"
  return $rc
}
# side_by_side ENTRY...: gpu_test on every ENTRY at once ("TEST" or "TEST|OPTIONS|TAG": TEST as
# gpu_test takes it, OPTIONS its FLASHCL_BUILD_OPTIONS with "+" for a space, TAG its log's tag);
# NVIDIA's compiler builds one kernel at a time a process, so each builds on its own core. Prints
# the status lines in order and sets `failed` to the entries whose test failed, each between spaces.
side_by_side() {
  local pids=() i t o tag
  failed=
  for i in "$@"; do
    IFS='|' read -r t o tag <<< "$i"
    ( [ -n "$o" ] && export FLASHCL_BUILD_OPTIONS="${o//+/ }"; gpu_test "$t" $tag ) > "$out/.status-${#pids[@]}" &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed="$failed ${@:i+1:1} "
    cat "$out/.status-$i"; rm -f "$out/.status-$i"
  done
}
# sass_of PTX: PTX (sm_90a) assembled by ptxas into PTX's .cubin and disassembled into its .sass
# beside it (for scripts/wgmma_*.py); prints ptxas's register count.
sass_of() {
  /usr/local/cuda/bin/ptxas -arch=sm_90a -v "$1" -o "${1%.ptx}.cubin" 2>&1 | grep -o 'Used [0-9]* registers'
  /usr/local/cuda/bin/cuobjdump -sass "${1%.ptx}.cubin" > "${1%.ptx}.sass"
}
# fp8_accuracy_wgmma: FA3's accuracy experiment (bench/fp8_accuracy.c, out f16) on nv-wgmma-fp8,
# into $out/fp8-accuracy-wgmma.txt; bounded, for the modes that must fit one 600-second call.
fp8_accuracy_wgmma() {
  echo "== FA3's accuracy experiment on nv-wgmma-fp8 (out f16)"
  gcc -O2 -std=c11 -Iinclude -Ihost_ref bench/fp8_accuracy.c host_ref/flashcl_ref.c host_ref/ref_fp8.c \
    -Lbuild-gpu -lflashcl -Wl,-rpath,"$PWD/build-gpu" -lOpenCL -lm -o build-gpu/fp8_accuracy &&
    FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8 timeout 120 ./build-gpu/fp8_accuracy --device nvidia --out f16 2>&1 |
    tee "$out/fp8-accuracy-wgmma.txt"
}
# ptx_from_cache DIR ENTRY: the PTX of every program in the kernel cache DIR that holds a kernel
# named ENTRY..., unmasked and retargeted to sm_90a as src/program.c does, as DIR/fwdN.ptx.
ptx_from_cache() {
  python3 - "$1" "$2" <<'PY'
import glob, re, sys
d, entry = sys.argv[1], sys.argv[2].encode()
for i, f in enumerate(sorted(glob.glob(d + "/*.bin"))):
    data = open(f, "rb").read()
    at = data.find(b".version")
    if at >= 0 and b".entry " + entry in data:
        ptx = data[at:].split(b"\0")[0].replace(b"//@sm90a ", b"")  # as src/program.c unmasks it
        ptx = re.sub(rb"\.target sm_90\b(?!a)", b".target sm_90a", ptx)
        open("%s/fwd%d.ptx" % (d, i), "wb").write(ptx)
PY
}
# time_fp8_wgmma TAG: the FP8 wgmma kernel's registers (NVIDIA's build log), then
# compare_torch.py --dtypes e4m3 (both of issue 35's bars), its files named $out/TAG.*.
time_fp8_wgmma() {
  echo "== ptxas report of nv-wgmma-fp8 (e4m3, D=128)"
  FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8 FLASHCL_LOG=1 FLASHCL_CACHE=0 FLASHCL_BUILD_OPTIONS=-cl-nv-verbose \
    ./build-gpu/flashcl bench --device nvidia --shape 1,8,1024,128 --dtype e4m3 --iters 2 2>&1 |
    grep -E "registers|spill|stack" | head -4
  echo "== nv-wgmma-fp8 (e4m3) vs PyTorch's float16 FA2/cuDNN and flashcl's own float16, events and wall clock"
  FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8 PYTHONUNBUFFERED=1 timeout "${FP8_COMPARE_TIMEOUT:-240}" \
    python3 bench/compare_torch.py --flashcl build-gpu/flashcl \
    --dtypes e4m3 --label "(nv-wgmma-fp8)" --json "$out/$1.json" 2>&1 | tee "$out/$1.txt"
}
# compare_decode_e4m3 [TIMEOUT]: decode over an e4m3 pool against PyTorch's float16 FA2 and
# flashcl's own float16 pool (compare_decode.py, ROUNDS rounds, default 2), bounded by TIMEOUT
# seconds where given; its table and JSON as $out/decode-e4m3.*.
compare_decode_e4m3() {
  echo "== decode over an e4m3 pool vs PyTorch (float16 FA2) and flashcl's float16 pool"
  PYTHONUNBUFFERED=1 ${1:+timeout "$1"} python3 bench/compare_decode.py --flashcl build-gpu/flashcl \
    --kv-dtype e4m3 --rounds "${ROUNDS:-2}" --json "$out/decode-e4m3.json" 2>&1 | tee "$out/decode-e4m3.txt"
}
# run_sanitize: compute-sanitizer (each of SAN_TOOLS, default memcheck racecheck synccheck) on the
# kernels the PTX harnesses relaunch through the CUDA driver: the backward's at each of SAN_SHAPES
# ("B,H,N,D[,causal]"), the forward's at each of SAN_FWD_SHAPES ("B,H,N,D,dtype[,causal]"). A line
# a run (its exit status, compute-sanitizer's summary); logs in $out/sanitize-{bwd,fwd}.log. One
# program cache a shape, causal or not, shared by the tools: only the first run builds in OpenCL.
# No run starts past SAN_BUDGET seconds into the script (default 330).
run_sanitize() {
  export PATH=$PATH:/usr/local/cuda/bin
  local shape dims causal dtype
  for shape in ${SAN_SHAPES-1,2,256,64 1,2,256,64,causal 1,2,256,128 1,2,256,128,causal}; do
    dims=${shape%,causal}; causal=; [ "$dims" != "$shape" ] && causal=--causal
    sanitize_one "$out/sanitize-bwd.log" "/tmp/san-${dims//,/-}" ./build-gpu/ptx_harness ${dims//,/ } $causal
  done
  for shape in ${SAN_FWD_SHAPES-1,2,256,128,f16,causal 1,2,256,128,e4m3}; do
    dims=${shape%,causal}; causal=; [ "$dims" != "$shape" ] && causal=--causal
    dtype=${dims##*,}; dims=${dims%,*}
    sanitize_one "$out/sanitize-fwd.log" "/tmp/san-fwd-${dims//,/-}-$dtype" ./build-gpu/ptx_fwd_harness ${dims//,/ } \
      --dtype "$dtype" $causal
  done
  rm -f "$out"/sanitize-*.log.run
}
# sanitize_one LOG CACHE HARNESS ARGS...: every tool on one harness run.
sanitize_one() {
  local log=$1 cache=$2 tool rc; shift 2
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    if [ "$SECONDS" -gt "${SAN_BUDGET:-330}" ]; then
      echo "$tool $*: not run, past SAN_BUDGET" | tee -a "$log"
      continue
    fi
    timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 "$@" --iters 1 --cache "$cache" > "$log.run" 2>&1
    rc=$?
    { echo "== compute-sanitizer --tool $tool $*"; cat "$log.run"; } >> "$log"
    echo "$tool $*: exit $rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log.run" | tail -1)" | tee -a "$log"
  done
}
# ncu's sections for the profiling modes (profile, replay), and ncu_details REPORT TAG LOG LINES:
# REPORT's details page as $out/ncu-TAG-details.txt and its first LINES summary lines into LOG;
# fails when ncu wrote no report.
ncu_sections=${NCU_SECTIONS:-SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis MemoryWorkloadAnalysis_Tables
  LaunchStats Occupancy SchedulerStats WarpStateStats}
ncu_details() {
  [ -f "$1" ] || return 1
  ncu -i "$1" --page details > "$out/ncu-$2-details.txt" 2>&1
  grep -E "^  [a-z_0-9]+ |Duration|Registers Per|Achieved Occupancy|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Thr" \
    "$out/ncu-$2-details.txt" | head -"$4" | tee -a "$3"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
if [ "$what" = profile ]; then
  # Four files a shape (the tool that fetches $OUT takes eight): the log (harness, then ncu's run of
  # it and a summary), ncu's details page as text and its raw metrics as CSV, and a .tgz of the
  # kernels' PTX (as cached and as translated) and the .ncu-rep. The ncu run reuses the first run's
  # program cache, so it skips the OpenCL builds.
  export PATH=$PATH:/usr/local/cuda/bin
  # ncu_files TAG WORK LOG: ncu_details, the raw CSV beside it, and the PTX and .ncu-rep of WORK as
  # $out/profile-TAG.tgz.
  ncu_files() {
    local tag=$1 work=$2 log=$3
    if ncu_details "$work/ncu-$tag.ncu-rep" "$tag" "$log" 24; then
      ncu -i "$work/ncu-$tag.ncu-rep" --page raw --csv > "$out/ncu-$tag-raw.csv" 2>&1
    fi
    tar czf "$out/profile-$tag.tgz" -C "$work" ptx $(cd "$work" && ls ncu-*.ncu-rep 2>/dev/null)
  }
  for shape in ${SHAPES-4,32,4096,64 4,32,4096,128}; do
    tag=${shape//,/-}; log="$out/profile-$tag.log"; work=/tmp/profile-$tag
    rm -rf "$work" && mkdir -p "$work/ptx" # a fresh cache: this call's programs only (FLASHCL_BWD_PARAMS may differ)
    echo "== ptx_harness $shape ${HARNESS_ARGS:-}: CUDA-driver launches vs flashcl" | tee "$log"
    timeout 120 ./build-gpu/ptx_harness ${shape//,/ } --iters 20 --dump "$work/ptx" --cache "$work/cache" \
      ${HARNESS_ARGS:-} 2>&1 | tee -a "$log"
    echo "== ncu --clock-control none, sections: $(echo $ncu_sections), on the checked dK/dV and dQ launches" | tee -a "$log"
    timeout 150 ncu --clock-control none $(printf -- '--section %s ' $ncu_sections) -k 'regex:flash_bwd_(dkdv|dq)' \
      --launch-count 2 -f -o "$work/ncu-$tag" ./build-gpu/ptx_harness ${shape//,/ } --iters 2 --cache "$work/cache" \
      ${HARNESS_ARGS:-} >> "$log" 2>&1
    echo "ncu exit $?" | tee -a "$log"
    ncu_files "$tag" "$work" "$log"
  done
  # The forward the same way (bench/ptx_fwd_harness.c): FWD_SHAPES "B,H,N,D,dtype[,causal]", none by
  # default; ncu on the checked launch of the forward kernel and, for FP8, the V transpose before it.
  for shape in ${FWD_SHAPES:-}; do
    dims=${shape%,causal}; causal=; [ "$dims" != "$shape" ] && causal=--causal
    dtype=${dims##*,}; dims=${dims%,*}
    tag=fwd-${shape//,/-}; log="$out/profile-$tag.log"; work=/tmp/profile-$tag
    rm -rf "$work" && mkdir -p "$work/ptx"
    echo "== ptx_fwd_harness $dims $dtype $causal: CUDA-driver launches vs flashcl" | tee "$log"
    timeout 120 ./build-gpu/ptx_fwd_harness ${dims//,/ } --dtype $dtype $causal --iters 20 --dump "$work/ptx" \
      --cache "$work/cache" 2>&1 | tee -a "$log"
    echo "== ncu --clock-control none, sections: $(echo $ncu_sections), on the checked launches" | tee -a "$log"
    timeout 150 ncu --clock-control none $(printf -- '--section %s ' $ncu_sections) -k 'regex:(flash_fwd|fp8_vt_pack)' \
      --launch-count 2 -f -o "$work/ncu-$tag" ./build-gpu/ptx_fwd_harness ${dims//,/ } --dtype $dtype $causal \
      --iters 1 --cache "$work/cache" >> "$log" 2>&1
    echo "ncu exit $?" | tee -a "$log"
    ncu_files "$tag" "$work" "$log"
  done
  exit 0
fi
if [ "$what" = sanitize ]; then
  run_sanitize
  exit 0
fi
if [ "$what" = replay ]; then
  export PATH=$PATH:/usr/local/cuda/bin
  replays="paged_decode_nv|bench+--decode+--kv-dtype+e4m3+--batch+4+--context+16384+--iters+2
    paged_decode_nv|bench+--decode+--kv-dtype+e4m3+--batch+16+--context+4096+--iters+2
    paged_decode_nv|bench+--decode+--kv-dtype+e4m3+--batch+16+--context+16384+--iters+2"
  for entry in ${REPLAYS-$replays}; do
    if [ "$SECONDS" -gt "${REPLAY_BUDGET:-300}" ]; then
      echo "== time budget reached before $entry: REPLAYS=... for the rest"
      break
    fi
    IFS='|' read -r kname args <<< "$entry"
    tag=$(echo "$kname ${args//+/ }" | tr -cs 'a-z0-9\n' '-'); log="$out/replay-$tag.log"
    echo "== PTX_REPLAY_KERNEL=$kname flashcl_replay ${args//+/ } --device nvidia" | tee "$log"
    PTX_REPLAY_KERNEL=$kname timeout 120 ./build-gpu/flashcl_replay ${args//+/ } --device nvidia 2>&1 | tee -a "$log"
    echo "exit ${PIPESTATUS[0]}; ncu on the CUDA launch (--launch-count 2: the checked one, the first timed)" | tee -a "$log"
    PTX_REPLAY_KERNEL=$kname PTX_REPLAY_ITERS=1 timeout 150 ncu --clock-control none $(printf -- '--section %s ' $ncu_sections) \
      -k "regex:$kname" --launch-count 2 -f -o "/tmp/ncu-$tag" ./build-gpu/flashcl_replay ${args//+/ } --device nvidia \
      >> "$log" 2>&1
    echo "ncu exit $?" | tee -a "$log"
    ncu_details "/tmp/ncu-$tag.ncu-rep" "$tag" "$log" 16
  done
  exit 0
fi
if [ "$what" = study ]; then
  # Per head dim: 48 KB's own shapes first, then ones needing about 50, 65, 81, 97, 129-145 KB.
  configs64=${STUDY_CONFIGS:-"WG=128,ROWS=32,STAGES=2 WG=256,ROWS=16,STAGES=2 WG=256,ROWS=16,STAGES=3
    WG=128,ROWS=32,STAGES=4,OWN_REGS=1 WG=128,ROWS=64,STAGES=2,OWN_REGS=1 WG=256,ROWS=32,STAGES=2,OWN_REGS=1
    WG=128,ROWS=64,STAGES=2 WG=256,ROWS=32,STAGES=2
    WG=256,ROWS=32,STAGES=2,MAXNREG=128 WG=128,ROWS=32,STAGES=4 WG=256,ROWS=64,STAGES=2 WG=256,ROWS=32,STAGES=4
    WG=128,ROWS=64,STAGES=4 WG=256,ROWS=64,STAGES=4 WG=256,ROWS=32,STAGES=8 WG=256,ROWS=64,STAGES=6
    WG=128,ROWS=64,STAGES=8 WG=128,ROWS=32,STAGES=8,OWN_REGS=1"}
  configs128=${STUDY_CONFIGS:-"WG=128,ROWS=16,STAGES=2 WG=128,ROWS=32,STAGES=2 WG=128,ROWS=32,STAGES=3
    WG=256,ROWS=16,STAGES=2 WG=128,ROWS=64,STAGES=2 WG=128,ROWS=32,STAGES=4 WG=256,ROWS=32,STAGES=2
    WG=256,ROWS=32,STAGES=4 WG=256,ROWS=64,STAGES=2 WG=128,ROWS=32,STAGES=2,OWN_REGS=1
    WG=128,ROWS=16,STAGES=5,OWN_REGS=1 WG=128,ROWS=64,STAGES=2,OWN_REGS=1"}
  shapes=${STUDY_SHAPES:-4,32,4096,64}
  for shape in $shapes; do
    dims=${shape%,causal}; tag=study-${shape//,/-}; causal=; [ "$dims" != "$shape" ] && causal=--causal
    # Head dims past 64: flashcl runs nv-wgmma there only when asked (one stage of 16-row tiles).
    configs=$configs64 params=; [ "${dims##*,}" -gt 64 ] && configs=$configs128 params=VARIANT=nv-wgmma
    rm -rf "/tmp/$tag" "/tmp/$tag-ptx" && mkdir -p "/tmp/$tag-ptx" # a fresh cache: this run's programs only
    echo "== ptx_harness ${dims//,/ } $causal --study ... ${params:+(FLASHCL_BWD_PARAMS=$params)}" | tee "$out/$tag.log"
    env ${params:+FLASHCL_BWD_PARAMS=$params} timeout 200 ./build-gpu/ptx_harness ${dims//,/ } $causal --iters 20 \
      --cache "/tmp/$tag" --dump "/tmp/$tag-ptx" $(printf -- '--study %s ' $configs) 2>&1 | tee -a "$out/$tag.log"
    echo "ptx_harness exit ${PIPESTATUS[0]}" | tee -a "$out/$tag.log"
    # NVIDIA's own PTX of every kernel the harness ran, assembled for sm_90a: no register a warpgroup
    # MMA reads or writes may be written while it is in flight (scripts/wgmma_inflight.py).
    echo "== SASS check (ptxas, cuobjdump, scripts/wgmma_inflight.py) of the kernels above" | tee -a "$out/$tag.log"
    for p in /tmp/$tag-ptx/*sm90*.cuda.ptx; do
      sass_of "$p" > /dev/null
    done
    python3 scripts/wgmma_inflight.py /tmp/$tag-ptx/*sm90*.sass 2>&1 | sed "s#/tmp/$tag-ptx/##" | tail -n 40 | tee -a "$out/$tag.log"
  done
  echo "== PyTorch's backward at the same shapes (f16), flashcl's through the OpenCL API beside it"
  torch_shapes=$(for s in $shapes; do echo "${s%,causal}"; done | sort -u)
  PYTHONUNBUFFERED=1 timeout 150 python3 bench/compare_backward.py --flashcl build-gpu/flashcl --dtypes f16 \
    --shapes $torch_shapes --json "$out/study-torch.json" 2>&1 | tee "$out/study-torch.txt"
  exit 0
fi
if [ "$what" = optin ]; then
  # The nv-wgmma backward's opt-in shapes (FLASHCL_BWD_PARAMS: two warpgroups, 16-row tiles,
  # STAGES, head dims 65..128, the atomic dQ with them): test_backward wgmma, then, if it passes,
  # `flashcl bench --backward` (events; its JSON adds wall clock back to back) under each of
  # STUDY_BWD_PARAMS at OPTIN_SHAPES (default 4,32,4096,64 and 4,32,4096,128).
  # One call is 600 s: no new timing starts past OPTIN_BUDGET seconds (default 520) into the script;
  # OPTIN_SKIP_TEST=1 skips the test, for a second call on the same tree that times the rest.
  GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-300}
  if [ "${OPTIN_SKIP_TEST:-0}" = 1 ] || gpu_test "test_backward wgmma" optin; then
    for dims in ${OPTIN_SHAPES:-4,32,4096,64 4,32,4096,128}; do
      if [ "${dims##*,}" -gt 64 ]; then
        list=${STUDY_BWD_PARAMS:-"VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=32,BLOCK_N=32 VARIANT=nv-wgmma
          VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=16,BLOCK_N=16,STAGES=5 VARIANT=nv-wgmma,DQ=atomic"}
      else
        list=${STUDY_BWD_PARAMS:-"VARIANT=nv-wgmma VARIANT=nv-wgmma,STAGES=3 VARIANT=nv-wgmma,BLOCK_M=16,BLOCK_N=16,STAGES=4
          VARIANT=nv-wgmma,WG=256,BLOCK_M=16,BLOCK_N=16 VARIANT=nv-wgmma,WG=256,BLOCK_M=16,BLOCK_N=16,STAGES=3
          VARIANT=nv-wgmma,DQ=atomic VARIANT=nv-wgmma,WG=256,BLOCK_M=16,BLOCK_N=16,DQ=atomic
          VARIANT=nv-wgmma,OWN_REGS=1,STAGES=4 VARIANT=nv-wgmma,OWN_REGS=1,BLOCK_M=64,BLOCK_N=64"}
      fi
      for params in $list; do
        if [ "$SECONDS" -gt "${OPTIN_BUDGET:-520}" ]; then
          echo "== time budget reached before $params at $dims: the rest in another call" | tee -a "$out/optin.txt"
          break 2
        fi
        echo "== FLASHCL_BWD_PARAMS=$params flashcl bench --backward --shape $dims" | tee -a "$out/optin.txt"
        FLASHCL_BWD_PARAMS=$params timeout 60 ./build-gpu/flashcl bench --backward --device nvidia --dtype f16 \
          --shape "$dims" --iters 20 2>&1 | tee -a "$out/optin.txt"
      done
    done
  fi
  exit 0
fi
./build-gpu/flashcl devices > "$out/devices.txt"
[ "$what" = setup ] && exit 0
if [ "$what" = fp8-gap ]; then
  gcc -O2 -std=c11 -DFLASHCL_STATIC -Iinclude -Isrc bench/fp8_call_gap.c build-gpu/libflashcl.a -lOpenCL -lpthread -ldl -lm \
    -o build-gpu/fp8_call_gap || exit 1
  ./build-gpu/fp8_call_gap $(for s in ${GAP_SHAPES-}; do echo --shape "$s"; done) | tee "$out/fp8-gap.txt"
  exit 0
fi
if [ "$what" = pending ]; then
  # What waits for a GPU (docs/perf-notes.md, "Waiting for a GPU"), in one call of under 600 s:
  # c686f94's decode rule over FP8 pages (8 warps on one kv head from 16384 keys and at batch 16)
  # checked on the GPU by the serving tests as built, then timed against PyTorch's FA2 over the
  # whole grid (batch 1-64 x 4k-128k keys) for BENCHMARKS.md, only where the tests passed.
  ok=1
  for t in "test_serving_fp8 mma" test_serving_fp8 test_params; do
    GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-150} gpu_test "$t" || ok=0
  done
  [ $ok = 1 ] || { echo "a serving test failed: decode not timed"; exit 0; }
  compare_decode_e4m3 300
  exit 0
fi
if [ "$what" = fp8-table ]; then
  # The tests side by side (about 95 s on an H100, 2026-12-06), then each table cut at its share
  # of what is left of CALL_BUDGET seconds (default 585, counted from the script's start, the
  # build included), or at TABLE_TIMEOUT where that is less: one 600-second call holds both.
  tests=(${FP8_TABLE_TESTS-"test_fp8_packed_v+wgmma" test_fp8_packed_v "test_fp8_forward+wgmma"})
  if [ ${#tests[@]} -gt 0 ]; then
    GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-180} side_by_side "${tests[@]}"
    [ -z "$failed" ] || { echo "an FP8 test failed:$failed- not timed"; exit 0; }
  fi
  left=2
  for packed in "" --v-packed; do
    cut=$(( (${CALL_BUDGET:-585} - SECONDS) / left )) left=$((left - 1))
    case ${TABLE_TIMEOUT:-} in
      '') ;;
      *[!0-9]*) echo "TABLE_TIMEOUT is a number of seconds, not '$TABLE_TIMEOUT'"; exit 1 ;;
      *) [ "$TABLE_TIMEOUT" -lt "$cut" ] && cut=$TABLE_TIMEOUT ;;
    esac
    [ "$cut" -ge 30 ] || { echo "== no time left for issue 35's table${packed:+, V packed}"; break; }
    echo "== issue 35's table${packed:+, V packed}: cut at $cut s"
    PYTHONUNBUFFERED=1 timeout "$cut" python3 bench/compare_torch.py --flashcl build-gpu/flashcl --dtypes e4m3 \
      --shape 4,32,4096,128 --shape 1,32,16384,128 --shape 4,32,4096,64 $packed 2>&1 |
      tee "$out/fp8-table${packed:+-packed}.txt"
  done
  exit 0
fi
if [ "$what" = serve ]; then
  for t in test_serving "test_serving mma" test_params; do
    gpu_test "$t"
  done
  ./build-gpu/flashcl bench --decode --device nvidia --batch 8 --context 32768 --iters 10 | tail -n 2
  timeout 150 ./build-gpu/flashcl serve-sim --device nvidia --heads 32 --kv-heads 8 --head-dim 128 \
    --max-batch 32 --requests 96 --output 10,2000 --plot "$out/serve-h200.svg" 2>/dev/null | tee "$out/serve-h200.txt"
  exit 0
fi
if [ "$what" = forward ]; then
  for t in ${TESTS-test_wgmma_layout "test_forward wgmma" "test_forward mma" "test_forward quick"}; do
    gpu_test "$t"
  done
  # FWD_OPTIONS: build options ("+" for a space) under which test_forward wgmma runs too,
  # e.g. -DOVERLAP=1 before a SWEEP_PARAMS entry times it.
  for o in ${FWD_OPTIONS:-}; do
    FLASHCL_BUILD_OPTIONS="${o//+/ }" gpu_test "test_forward wgmma" "${o//[^A-Za-z0-9]/_}"
  done
  if [ "${SWEEP:-0}" = 1 ]; then
    # Each entry: FLASHCL_PARAMS value, optionally "|" and extra build options (e.g. -DRESCALE_SKIP=0;
    # "+" stands for a space between options: -DQ_SMEM=1+-DFLASHCL_NV_MAXNREG=128).
    for e in "" ${SWEEP_PARAMS:-}; do
      p=${e%%|*}; o=; [ "$e" != "$p" ] && o=${e#*|}; o=${o//+/ }
      for d in ${SWEEP_DIMS:-128}; do
        echo "== D=$d FLASHCL_PARAMS=${p:-defaults} ${o:+build options $o}: ptxas and a validated shape, then TFLOP/s (f16)"
        FLASHCL_PARAMS=$p FLASHCL_LOG=1 FLASHCL_CACHE=0 FLASHCL_BUILD_OPTIONS="-cl-nv-verbose $o" ./build-gpu/flashcl \
          bench --device nvidia --shape 2,4,777,$d --iters 1 2>&1 | grep -E "registers|spill|pass|FAIL|rror" | head -4
        FLASHCL_PARAMS=$p FLASHCL_BUILD_OPTIONS="$o" ./build-gpu/flashcl bench --device nvidia --shape 4,32,4096,$d \
          ${SWEEP_LONG:+--shape 1,32,16384,$d} --iters 10 2>&1 | grep -E "^ *f16|error" | head -4
      done
    done
  fi
  [ "${DTYPES:-}" = none ] ||
    PYTHONUNBUFFERED=1 python3 bench/compare_torch.py --flashcl build-gpu/flashcl --dtypes ${DTYPES:-f16,bf16} \
      --json "$out/compare.json" --label "(default variants)" 2>/dev/null | tee "$out/compare.txt"
  exit 0
fi
if [ "$what" = regs ]; then
  # Register caps through the PTX rebuild (-DFLASHCL_NV_MAXNREG, src/program.c):
  # forward, backward and decode at each cap in CAPS ("" = the compiler's choice).
  for c in "" ${CAPS-168 128}; do
    o="${EXTRA:-}${c:+ -DFLASHCL_NV_MAXNREG=$c}"
    echo "== cap ${c:-none}"
    FLASHCL_LOG=1 FLASHCL_CACHE=0 FLASHCL_BUILD_OPTIONS="-cl-nv-verbose $o" ./build-gpu/flashcl bench --device nvidia \
      --shape 1,2,256,64 --shape 1,2,256,128 --no-causal --iters 1 2>&1 | grep -E "MAXNREG|registers|spill" | head -6
    FLASHCL_BUILD_OPTIONS="$o" ./build-gpu/flashcl bench --device nvidia --shape 4,32,4096,64 --shape 4,32,4096,128 \
      --iters 10 2>&1 | grep -E "^ *f16|error" | head -4
    # "none" lifts the table's backward cap too (MAXNREG=0); a cap in the build options replaces it.
    bwd=; [ -z "$c" ] && bwd=MAXNREG=0
    FLASHCL_BWD_PARAMS=$bwd FLASHCL_BUILD_OPTIONS="$o" ./build-gpu/flashcl bench --backward \
      --device nvidia --shape 4,32,4096,64 --shape 4,32,4096,128 --no-causal --iters 5 2>&1 | grep -E "^4,32|error" | head -2
    FLASHCL_BUILD_OPTIONS="$o" ./build-gpu/flashcl bench --decode --device nvidia --batch 1,16 --context 16384,131072 \
      --iters 20 2>&1 | grep -E '^ +[0-9]|error'
  done
  [ -n "${TESTS:-}" ] && echo "== tests with build options: ${TEST_OPTIONS:-none}"
  for t in ${TESTS:-}; do
    FLASHCL_BUILD_OPTIONS="${TEST_OPTIONS:-}" gpu_test "$t${TEST_ARG:+ $TEST_ARG}"
  done
  exit 0
fi
if [ "$what" = fp32 ]; then
  for t in ${TESTS-"test_forward tf32" "test_forward quick" test_serving "test_serving mma"}; do
    gpu_test "$t"
  done
  echo "== ptxas report of the nv-tf32 kernel (f32, D=64 and 128)"
  FLASHCL_LOG=1 FLASHCL_CACHE=0 FLASHCL_BUILD_OPTIONS=-cl-nv-verbose ./build-gpu/flashcl bench --device nvidia \
    --dtype f32 --shape 1,2,256,64 --shape 1,2,256,128 --iters 1 2>&1 | grep -E "registers|spill" | head -4
  PYTHONUNBUFFERED=1 python3 bench/compare_torch.py --flashcl build-gpu/flashcl --dtypes f32 \
    --json "$out/compare-f32.json" --label "(float32: nv-tf32)" 2>&1 | tee "$out/compare-f32.txt"
  if [ "${SWEEP:-0}" = 1 ]; then
    echo "== FLASHCL_PARAMS sweep of nv-tf32 at D=128 (flashcl bench, f32, TFLOP/s)"
    for p in "" BLOCK_N=8 WARPS=4,BLOCK_M=64,BLOCK_N=8 WARPS=1,BLOCK_M=16,BLOCK_N=32; do
      echo "-- ${p:-defaults}"
      FLASHCL_PARAMS=$p ./build-gpu/flashcl bench --device nvidia --dtype f32 --shape 4,32,4096,128 \
        --iters 5 2>&1 | grep -E "^ *f32|error" | head -2
    done
  fi
  exit 0
fi
if [ "$what" = backward ]; then
  for t in ${TESTS-"test_backward wgmma" "test_backward mma" "test_backward quick" test_varlen_backward "test_forward quick"}; do
    gpu_test "$t"
  done
  for d in 64 128; do
    echo "== ptxas report of the tensor-core backward kernels (f16, D=$d)"
    FLASHCL_LOG=1 FLASHCL_CACHE=0 FLASHCL_BUILD_OPTIONS=-cl-nv-verbose ./build-gpu/flashcl bench --backward \
      --device nvidia --shape 1,2,256,$d --iters 1 2>&1 | grep -E "Compiling|registers|spill" | head -8
  done
  echo "== where the backward's time goes (FLASHCL_PROFILE=1, f16; the last timed run of each)"
  for shape in 4,32,4096,64 4,32,4096,128 1,32,16384,128; do
    for mask in --no-causal --causal; do
      FLASHCL_PROFILE=1 FLASHCL_LOG=1 ./build-gpu/flashcl bench --backward --device nvidia --shape $shape $mask \
        --iters 3 2>&1 >/dev/null | grep "backward kernels" | tail -n 1 | sed "s/^/$shape $mask: /"
    done
  done
  if [ "${SWEEP:-0}" = 1 ]; then
    echo "== FLASHCL_BWD_PARAMS sweep (flashcl bench --backward, f16)"
    for p in "" WG=64,BLOCK_M=32 WG=64,BLOCK_M=64 WG=128,BLOCK_M=32 WG=256,BLOCK_M=16 BLOCK_N=32 BLOCK_N=16 DQ=atomic; do
      echo "-- D=64 ${p:-defaults}"
      FLASHCL_BWD_PARAMS=$p ./build-gpu/flashcl bench --backward --device nvidia --shape 4,32,4096,64 --iters 5 2>&1 | tail -n 2
    done
    for p in "" WG=64,BLOCK_M=16 WG=128,BLOCK_M=16 WG=32,BLOCK_M=32 BLOCK_N=16 BLOCK_N=64 DQ=atomic; do
      echo "-- D=128 ${p:-defaults}"
      FLASHCL_BWD_PARAMS=$p ./build-gpu/flashcl bench --backward --device nvidia --shape 4,32,4096,128 --iters 5 2>&1 | tail -n 2
    done
    FLASHCL_BWD_PARAMS=VARIANT=portable ./build-gpu/flashcl bench --backward --device nvidia \
      --shape 4,32,4096,64 --iters 2 2>&1 | tail -n 2
  fi
  if [ -f bench/compare_backward.py ]; then
    PYTHONUNBUFFERED=1 python3 bench/compare_backward.py --flashcl build-gpu/flashcl --dtypes f16,bf16 \
      --json "$out/backward.json" 2>&1 | tee "$out/backward.txt"
  fi
  ./build-gpu/flashcl bench --device nvidia --shape 4,32,4096,64 --shape 4,32,4096,128 --dtype f16 --iters 10 | tail -n 5
  exit 0
fi
if [ "$what" = fp8-kernel ]; then
  shapes=${FP8_SHAPES:-"--shape 4,32,4096,128 --shape 4,32,4096,64 --shape 1,32,16384,128"}
  GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-120}
  if [ "${PART:-1}" = 1 ]; then
    gpu_test test_wgmma_layout
    gpu_test test_fp8_forward || { echo "test_fp8_forward failed: nv-wgmma-fp8 not timed"; exit 0; }
    FLASHCL_TMA=0 gpu_test test_fp8_forward cp-async
    FLASHCL_BUILD_OPTIONS=-DPV_CHAINED=1 gpu_test test_fp8_forward pv-chained
    grep -E "32768" "$out/test_fp8_forward.log" "$out/test_fp8_forward-pv-chained.log" | head -6
    time_fp8_wgmma compare-fp8
    fp8_accuracy_wgmma
  else
    # The test runs side by side (each builds its kernels on its own core), reported in order; an
    # option whose test failed is not timed below (cp.async's and PV_CHAINED's test is PART=1's). A
    # log's tag is its option in lower case and dashes.
    tests=()
    for o in ${FP8_TEST_OPTIONS-}; do
      tests+=("test_fp8_forward|$o|$(echo "${o#-D}" | tr 'A-Z+' 'a-z ' | tr -cs 'a-z0-9\n' '-')")
    done
    side_by_side "${tests[@]}"
    options="- -" # (a quoted default inside ${...} would stay one word: the list is a variable, split on use)
    for o in ${FP8_OPTIONS-$options}; do
      for mask in "" --causal; do
        if [ "$SECONDS" -gt "${FP8_BUDGET:-480}" ]; then # the f16 rows and the SASS check still fit
          echo "== time budget reached before ${o//+/ } $mask: FP8_OPTIONS=... for the rest" | tee -a "$out/fp8-options.txt"
          break 2
        fi
        case $failed in *"|${o%%+-DFLASHCL_NV_MAXNREG=*}|"*)
          echo "== ${o//+/ }: its test failed, not timed" | tee -a "$out/fp8-options.txt"; continue 2 ;;
        esac
        echo "== nv-wgmma-fp8 ${o//+/ } $mask" | tee -a "$out/fp8-options.txt"
        bench_args=() # --v-packed: an option of `flashcl bench`, not of the build
        case $o in
          -) env=() ;;
          --v-packed) env=() bench_args=(--v-packed) ;;
          FLASHCL_*) env=("$o") ;;
          *) env=("FLASHCL_BUILD_OPTIONS=${o//+/ }") ;;
        esac
        # An entry's own FLASHCL_PARAMS (e.g. the two-warpgroup shape) comes last, so it wins.
        env FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8 "${env[@]}" timeout 60 ./build-gpu/flashcl bench --device nvidia \
          --dtype e4m3 ${bench_args[@]+"${bench_args[@]}"} $shapes $mask --iters 20 2>&1 | grep -E "^e4m3 " |
          tee -a "$out/fp8-options.txt"
      done
    done
    for mask in "" --causal; do
      echo "== f16 (the default forward) $mask" | tee -a "$out/fp8-options.txt"
      timeout 60 ./build-gpu/flashcl bench --device nvidia --dtype f16 $shapes $mask --iters 20 2>&1 |
        grep -E "^f16 " | tee -a "$out/fp8-options.txt"
    done
    # NVIDIA's own PTX of the kernel (D=128 as built, D=64 under FP8_SASS_OPTIONS, default none: the
    # 128-register cap is built in there) from a fresh cache, assembled by ptxas: its registers and
    # spills, and no register of a warpgroup MMA written while it is in flight
    # (scripts/wgmma_inflight.py).
    echo "== nv-wgmma-fp8 as NVIDIA's compiler builds it: registers, SASS check"
    export PATH=$PATH:/usr/local/cuda/bin
    rm -rf build-gpu/sass-fp8 && mkdir -p build-gpu/sass-fp8
    for d in 128 64; do
      FLASHCL_CACHE_DIR=$PWD/build-gpu/sass-fp8 \
        FLASHCL_PARAMS="VARIANT=nv-wgmma-fp8$([ $d = 64 ] && echo "${FP8_SASS_PARAMS-}")" \
        FLASHCL_BUILD_OPTIONS="$([ $d = 64 ] && echo "${FP8_SASS_OPTIONS-}")" \
        ./build-gpu/flashcl bench --device nvidia \
        --shape 1,8,1024,$d --dtype e4m3 --iters 1 > /dev/null 2>&1
    done
    ptx_from_cache build-gpu/sass-fp8 flash_fwd_sm90_fp8
    for f in build-gpu/sass-fp8/fwd*.ptx; do
      [ -f "$f" ] || { echo "no nv-wgmma-fp8 PTX in the cache"; break; }
      echo "-- $f ($(grep -c 'wgmma.mma_async' "$f") wgmma): $(sass_of "$f")"
      /usr/local/cuda/bin/ptxas -arch=sm_90a -v "$f" -o /dev/null 2>&1 | grep -E "spill" | head -1
      python3 scripts/wgmma_inflight.py "${f%.ptx}.sass" | tail -n 2
    done
  fi
  exit 0
fi
if [ "$what" = fp8 ]; then
  fp8_ok=1
  for t in ${TESTS-test_fp8 test_fp8_forward test_serving_fp8 "test_serving_fp8 decode" "test_serving_fp8 mma"
    "test_serving mma" test_params}; do
    gpu_test "$t" || { [ "$t" = test_fp8_forward ] && fp8_ok=0; }
  done
  echo "== ptxas report of the mma decode kernel over e4m3 pages (f16 queries, D=128)"
  FLASHCL_LOG=1 FLASHCL_CACHE=0 FLASHCL_BUILD_OPTIONS=-cl-nv-verbose ./build-gpu/flashcl bench --decode \
    --device nvidia --kv-dtype e4m3 --batch 1 --context 4096 --iters 2 2>&1 | grep -E "registers|spill|stack" | head -4
  # HEAD_GROUP's 32-key tiles over FP8 pages (HG_WIDE, the default since ebe205e; timed on an
  # H100 only) against its 16-key ones (HG_KEYS=16, which also leaves the one-head kernel from
  # 65536 keys, the choice before), at the shapes issue 35's decode bar misses (batch 1-16).
  # DECODE_FP8_PARAMS: other FLASHCL_DECODE_PARAMS values to time beside them ("-": the default).
  for p in ${DECODE_FP8_PARAMS:-- HG_KEYS=16}; do
    pv=$([ "$p" = - ] || echo "$p")
    echo "== decode, e4m3 pages, FLASHCL_DECODE_PARAMS=${pv:-(default)}" | tee -a "$out/decode-fp8-params.txt"
    FLASHCL_DECODE_PARAMS=$pv timeout 90 ./build-gpu/flashcl bench --decode --device nvidia --kv-dtype e4m3 \
      --batch 1,4,16 --context 16384,65536,131072 --iters 20 2>&1 | tail -n 10 | tee -a "$out/decode-fp8-params.txt"
  done
  compare_decode_e4m3
  # The FP8 warpgroup-MMA kernel (the default for e4m3 with a 16-bit output on sm_90) is timed only
  # after test_fp8_forward (above) has passed here.
  [ $fp8_ok = 1 ] || { echo "test_fp8_forward failed: nv-wgmma-fp8 not timed"; exit 0; }
  echo "== the FP8 forward next to the float16 one (flashcl bench, each dtype's default kernel)"
  for dt in f16 e4m3; do
    ./build-gpu/flashcl bench --device nvidia ${FWD_SHAPES:---shape 4,32,4096,128 --shape 4,32,4096,64} \
      --dtype $dt --iters 5 2>&1 | tail -n 3
  done
  time_fp8_wgmma compare-fp8
  fp8_accuracy_wgmma
  exit 0
fi
if [ "$what" = decode ]; then
  for t in ${TESTS-test_serving "test_serving decode" "test_serving mma" "test_serving by-value" test_varlen_backward \
    "test_forward quick"}; do
    gpu_test "$t"
  done
  for kern in decode mma; do
    echo "== ptxas report of the $kern kernel (f16, D=128, 4 rows)"
    FLASHCL_DECODE_PARAMS=KERNEL=$kern FLASHCL_LOG=1 FLASHCL_CACHE=0 FLASHCL_BUILD_OPTIONS=-cl-nv-verbose \
      ./build-gpu/flashcl bench --decode --device nvidia --batch 1 --context 4096 --iters 2 2>&1 |
      grep -E "registers|spill|stack" | head -6
  done
  # COMPARES: the comparisons to run, each "FLASHCL_DECODE_PARAMS@page size" ("-": none), each a
  # table and a file of its own, e.g. COMPARES="-@16 META_ARGS=1@16 META_ARGS=1@256".
  for c in ${COMPARES--@16}; do
    p=${c%@*}; ps=${c#*@}; [ "$p" = - ] && p=
    tag=$(echo "${p:-defaults}-page$ps" | tr -c 'A-Za-z0-9\n-' _)
    echo "== decode vs PyTorch, ${p:-defaults}, page size $ps"
    FLASHCL_DECODE_PARAMS=$p PYTHONUNBUFFERED=1 python3 bench/compare_decode.py --flashcl build-gpu/flashcl \
      --json "$out/decode-$tag.json" -- --page-size $ps 2>&1 | tee "$out/decode-$tag.txt"
  done
  echo "== FLASHCL_DECODE_PARAMS sweep (median us)"
  for p in "" ${DECODE_SWEEP-META_ARGS=0 KERNEL=decode MIN_SPLIT_KEYS=256 MIN_SPLIT_KEYS=1024 WGS_PER_CU=8}; do
    echo "-- ${p:-defaults}"
    # An entry that changes the mma kernel's tiles (STAGES, WG, BLOCK_N) is validated first:
    # test_serving mma keeps it beside its forced keys. Where it cannot fit a head dim (STAGES=3
    # at D=256 is over 48 KB), those cases fail as refused parameters: read the lines.
    if [[ "$p" =~ STAGES|WG=|BLOCK_N ]]; then
      log="$out/serving-mma-${p//[^A-Za-z0-9]/_}.log"
      FLASHCL_DECODE_PARAMS=$p FLASHCL_TEST_DEVICE=nvidia ./build-gpu/tests/test_serving mma > "$log" 2>&1
      echo "   test_serving mma: exit $? $(tail -n 1 "$log"), $(grep -c FAILED "$log") failed checks"
      grep -m4 FAILED "$log"
    fi
    FLASHCL_DECODE_PARAMS=$p ./build-gpu/flashcl bench --decode --device nvidia --batch ${SWEEP_BATCH:-1,8,64} \
      --context ${SWEEP_CONTEXT:-4096,32768,131072} ${SWEEP_KV:+--kv-dtype $SWEEP_KV} --iters 20 2>&1 |
      grep -E '^ +[0-9]'
  done
  # DECODE_OPTIONS: build-option variants of the decode kernels ("+" for a space, e.g.
  # "-DCP_ASYNC_L2=256 -DCP_ASYNC_L2=256+-DQ_IN_LOCAL=1"): each passes test_serving mma under its
  # options before it is timed, bracketed by the defaults.
  if [ -n "${DECODE_OPTIONS:-}" ]; then
    echo "== decode build options (median us; each validated first)"
    for o in "" ${DECODE_OPTIONS} ""; do
      o=${o//+/ }
      if [ -n "$o" ]; then
        log="$out/serving-mma${o//[^A-Za-z0-9]/_}.log"
        FLASHCL_BUILD_OPTIONS="$o" FLASHCL_TEST_DEVICE=nvidia ./build-gpu/tests/test_serving mma \
          > "$log" 2>&1 || { echo "-- $o: test_serving mma FAILED"; grep -m5 FAILED "$log"; continue; }
      fi
      echo "-- ${o:-defaults}"
      FLASHCL_BUILD_OPTIONS="$o" ./build-gpu/flashcl bench --decode --device nvidia --batch 1,4,16,64 \
        --context 4096,16384,131072 --iters 20 2>&1 | grep -E '^ +[0-9]'
    done
  fi
  echo "== a whole decode step (--step: append one token per sequence, then attention; median us)"
  ./build-gpu/flashcl bench --decode --device nvidia --step --batch 1,16,64 --context 4096,131072 --iters 20 2>&1 |
    grep -E '^ +[0-9]'
  echo "-- the same with META_ARGS=1 (the description and the slot list by value)"
  FLASHCL_DECODE_PARAMS=META_ARGS=1 ./build-gpu/flashcl bench --decode --device nvidia --step --batch 1,16,64 \
    --context 4096,131072 --iters 20 2>&1 | grep -E '^ +[0-9]'
  echo "== launch costs of the OpenCL implementation (bench/launch_floor.c)"
  gcc -O2 -std=c11 bench/launch_floor.c -o build-gpu/launch_floor -lOpenCL && ./build-gpu/launch_floor nvidia
  echo "== the floor: tiny contexts"
  ./build-gpu/flashcl bench --decode --device nvidia --batch 1 --context 16,256,1024 --iters 50 2>&1 | grep -E '^ +[0-9]'
  echo "-- the same, the description by value (META_ARGS=1: no upload)"
  FLASHCL_DECODE_PARAMS=META_ARGS=1 ./build-gpu/flashcl bench --decode --device nvidia --batch 1 --context 16,256,1024 \
    --iters 50 2>&1 | grep -E '^ +[0-9]'
  FLASHCL_DECODE_PARAMS=KERNEL=tiled ./build-gpu/flashcl bench --decode --device nvidia --batch 1 --context 16 --splits 1 \
    --iters 50 2>&1 | grep -E '^ +[0-9]'
  ./build-gpu/flashcl bench --decode --device nvidia --batch 1 --context 16 --splits 1 --iters 50 2>&1 | grep -E '^ +[0-9]'
  ./build-gpu/flashcl bench --decode --device nvidia --batch 1 --context 16 --splits 2 --iters 50 2>&1 | grep -E '^ +[0-9]' 
  exit 0
fi
if [ "$what" = final ]; then
  echo "== tests on the GPU, default variants"
  for t in "test_forward quick" "test_forward mma" test_errors test_cache test_serving "test_backward quick"; do
    bin=${t%% *}
    [ -x build-gpu/tests/$bin ] || continue
    gpu_test "$t"
  done
  ./build-gpu/flashcl check --device nvidia --cases 40 > "$out/check.log" 2>&1
  echo "flashcl check --cases 40: exit $? $(tail -1 "$out/check.log")"
  PYTHONUNBUFFERED=1 python3 bench/compare_torch.py --flashcl build-gpu/flashcl --dtypes f16,bf16 \
    --json "$out/compare.json" --label "(default variants)" 2>/dev/null | tee "$out/compare.txt"
  PYTHONUNBUFFERED=1 python3 bench/compare_decode.py --flashcl build-gpu/flashcl \
    --json "$out/decode.json" 2>/dev/null | tee "$out/decode.txt"
  export FLASHCL_TUNING_FILE=$out/tuning.json
  for args in "--head-dim 128" "--head-dim 64"; do
    timeout 70 ./build-gpu/flashcl tune --device nvidia --dtype f16 --seqlen 4096 --batch 4 --heads 32 \
      --budget 35 --confirm 2 $args > "$out/tune-${args// /_}.txt" 2>&1
    echo "tune $args: exit $?"; tail -4 "$out/tune-${args// /_}.txt"
  done
  unset FLASHCL_TUNING_FILE
  ./build-gpu/flashcl bench --device nvidia --dtype f16 --batch 4 --heads 32 --head-dim 64,128 \
    --seqlen 512,1024,2048,4096,8192,16384 --iters 10 --plot "$out/h200-forward.svg" > "$out/plot-bench.txt" 2>&1
  echo "plot: exit $?"
  timeout 120 ./build-gpu/flashcl serve-sim --device nvidia --heads 32 --kv-heads 8 --head-dim 128 \
    --max-batch 32 --requests 96 --output 10,2000 --plot "$out/serve-h200.svg" 2>/dev/null | tee "$out/serve-h200.txt"
  exit 0
fi
if [ "$what" != bench ]; then
  for variant in default portable; do
    [ $variant = portable ] && export FLASHCL_VARIANT=portable || unset FLASHCL_VARIANT
    echo "== tests on the GPU, variant $variant"
    for t in test_forward test_errors test_cache; do
      gpu_test "$t quick" $variant
    done
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
