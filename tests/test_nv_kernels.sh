#!/usr/bin/env bash
# test_nv_kernels.sh: the NVIDIA kernels (inline PTX) built on a machine without NVIDIA's
# OpenCL: clang's nvptx target compiles each cl/ file under the tile shapes flashcl selects
# and the ones its GPU tests force; the tensor-core kernels must contain mma.sync and keep
# their fragments in registers (no local_depot), as the portable forward (which NVIDIA runs
# too when asked) must keep its private tiles; when ptxas is at hand, it assembles the
# PTX for sm_90, which checks every inline PTX instruction; with cuobjdump as well, the sm_90a
# kernels' SASS must write no register of a warpgroup MMA in flight (scripts/wgmma_inflight.py),
# and the OWN_REGS builds and every 16-bit wgmma forward none of their held fragments inside the
# loop (scripts/wgmma_a_regs.py).
# Registers are printed, not judged: clang's PTX is not NVIDIA's, and only the GPU's own build
# log counts them.
#   test_nv_kernels.sh CL_DIR SHIM CLANG [PTXAS [CUOBJDUMP]]
set -uo pipefail
cl=$1 shim=$2 clang=$3 ptxas=${4:-} cuobjdump=${5:-}
if [ -n "$cuobjdump" ] && ! python3 "$cl/../scripts/wgmma_inflight.py" --self-test > /dev/null 2>&1; then
  echo "scripts/wgmma_inflight.py --self-test FAILED: it no longer finds planted in-flight writes"; exit 1
fi
tmp=$(mktemp -d /tmp/flashcl-nv-kernels.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failures=0 cases=0

# file | -D options (FLASHCL_NV_PTX is added) | 1: a tensor-core kernel (mma.sync, no local_depot),
# 2: a SIMT kernel whose private arrays must stay in registers (no local_depot), 3: an sm_90a
# kernel (its masked wgmma lines unmasked as src/program.c does, then wgmma, no local_depot,
# assembled for sm_90a), 0: builds
configs=(
  "flash_fwd_nv.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=128 -DBLOCK_N=64 -DWARPS=4|1"
  "flash_fwd_nv.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=128 -DBLOCK_N=64 -DWARPS=4 -DLPT_HEADS=8|1"
  "flash_fwd_nv.cl|-DDTYPE=2 -DHEAD_DIM=32 -DBLOCK_M=256 -DBLOCK_N=32 -DWARPS=8|1"
  "flash_fwd_nv.cl|-DDTYPE=2 -DHEAD_DIM=59 -DBLOCK_M=64 -DBLOCK_N=64 -DWARPS=4|1"
  "flash_fwd_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=64 -DBLOCK_N=64 -DWARPS=4|1"
  "flash_fwd_nv.cl|-DDTYPE=2 -DHEAD_DIM=96 -DBLOCK_M=64 -DBLOCK_N=48 -DWARPS=2|1"
  "flash_fwd_nv.cl|-DDTYPE=1 -DHEAD_DIM=256 -DBLOCK_M=64 -DBLOCK_N=32 -DWARPS=4|1"
  "flash_fwd_nv32.cl|-DDTYPE=0 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=32 -DWARPS=4|1"
  "flash_fwd_nv32.cl|-DDTYPE=0 -DHEAD_DIM=128 -DBLOCK_M=32 -DBLOCK_N=16 -DWARPS=2|1"
  "flash_fwd_nv32.cl|-DDTYPE=0 -DHEAD_DIM=128 -DBLOCK_M=48 -DBLOCK_N=16 -DWARPS=3|1"
  "flash_fwd_nv32.cl|-DDTYPE=0 -DHEAD_DIM=128 -DBLOCK_M=48 -DBLOCK_N=16 -DWARPS=3 -DLPT_HEADS=16|1"
  "flash_fwd_nv32.cl|-DDTYPE=0 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=32 -DWARPS=4 -DLPT_HEADS=8|1"
  "flash_fwd_nv32.cl|-DDTYPE=0 -DHEAD_DIM=1 -DBLOCK_M=16 -DBLOCK_N=32 -DWARPS=1|1"
  "flash_fwd_nv32.cl|-DDTYPE=0 -DHEAD_DIM=96 -DBLOCK_M=64 -DBLOCK_N=8 -DWARPS=4|1"
  "flash_fwd_nv32.cl|-DDTYPE=0 -DHEAD_DIM=128 -DBLOCK_M=32 -DBLOCK_N=16 -DWARPS=2 -DFAST_SPLIT=0 -DKV_SPLIT=0 -DDIM_PERM=0|1"
  "flash_fwd_nv32.cl|-DDTYPE=0 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=64 -DWARPS=4 -DDIM_PERM=1|1"
  "flash_bwd_nv.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=32 -DBLOCK_N=64 -DWG=128 -DBWD_KERNEL=2|1"
  "flash_bwd_nv.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=32 -DBLOCK_N=64 -DWG=128 -DBWD_KERNEL=3|1"
  "flash_bwd_nv.cl|-DDTYPE=2 -DHEAD_DIM=128 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=64 -DBWD_KERNEL=2|1"
  "flash_bwd_nv.cl|-DDTYPE=2 -DHEAD_DIM=128 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=64 -DBWD_KERNEL=3|1"
  "flash_bwd_nv.cl|-DDTYPE=1 -DHEAD_DIM=40 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=64 -DBWD_KERNEL=2 -DDQ_ATOMIC=1|1"
  "flash_bwd_nv.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=32 -DBLOCK_N=64 -DWG=128 -DBWD_KERNEL=2 -DLPT_HEADS=8|1"
  "flash_bwd_nv.cl|-DDTYPE=2 -DHEAD_DIM=128 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=64 -DBWD_KERNEL=3 -DLPT_HEADS=8|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=16|1"
  "paged_decode_nv.cl|-DDTYPE=2 -DHEAD_DIM=256 -DBLOCK_M=16 -DBLOCK_N=16 -DWARPS=1 -DSTAGES=2 -DPAGE_SIZE=1|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=16 -DCP_ASYNC_L2=256|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=32 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=16 -DREG_COPY=1 -DKV_FP8=3 -DSOFTMAX_CHAINS=4|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=16 -DMETA_ARG_INTS=1024|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=16 -DMERGE_VEC4=0|1"
  "paged_decode_nv.cl|-DDTYPE=2 -DHEAD_DIM=16 -DBLOCK_M=2 -DBLOCK_N=16 -DWARPS=3 -DSTAGES=2 -DPAGE_SIZE=5|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=16 -DDIAG=1|0"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=16 -DDIAG=2|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=16 -DREG_COPY=1|1"
  "paged_decode_nv.cl|-DDTYPE=2 -DHEAD_DIM=96 -DBLOCK_M=8 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=7 -DREG_COPY=1|1"
  "paged_decode_nv.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=16 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=0 -DREG_COPY=1|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=80 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=32 -DREG_COPY=1|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=8 -DSTAGES=2 -DPAGE_SIZE=16 -DHEAD_GROUP=8|1"
  "paged_decode_nv.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=8 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=7 -DHEAD_GROUP=2 -DMETA_ARG_INTS=64|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=96 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=1 -DSTAGES=2 -DPAGE_SIZE=0 -DHEAD_GROUP=1|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=8 -DSTAGES=2 -DPAGE_SIZE=16 -DHEAD_GROUP=1 -DHG_WPH=8|1"
  "paged_decode_nv.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=8 -DBLOCK_N=16 -DWARPS=8 -DSTAGES=2 -DPAGE_SIZE=7 -DHEAD_GROUP=2 -DHG_WPH=4 -DMETA_ARG_INTS=64|1"
  "paged_decode.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DLANES=16 -DWG_SIZE=128 -DUNROLL=4 -DSTAGES=2 -DPAGE_SIZE=16 -DMETA_ARG_INTS=64|0"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=32 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=16 -DREG_COPY=1 -DKV_FP8=3|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=32 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=8 -DREG_COPY=1 -DKV_FP8=4|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=8 -DSTAGES=2 -DPAGE_SIZE=16 -DHEAD_GROUP=2 -DHG_WPH=4 -DKV_FP8=3|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=32 -DWARPS=8 -DSTAGES=2 -DPAGE_SIZE=16 -DHEAD_GROUP=1 -DHG_WPH=8 -DKV_FP8=3|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=8 -DBLOCK_N=32 -DWARPS=8 -DSTAGES=2 -DPAGE_SIZE=7 -DHEAD_GROUP=2 -DHG_WPH=4 -DKV_FP8=3|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=4 -DBLOCK_N=32 -DWARPS=4 -DSTAGES=2 -DPAGE_SIZE=32 -DHEAD_GROUP=2 -DHG_WPH=2 -DKV_FP8=4|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=8|1"
  "paged_decode_nv.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DBLOCK_N=16 -DWARPS=2 -DSTAGES=2 -DPAGE_SIZE=8 -DREG_COPY=1|1"
  "paged_decode_nv.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=8 -DBLOCK_N=16 -DWARPS=8 -DSTAGES=2 -DPAGE_SIZE=8 -DHEAD_GROUP=2 -DHG_WPH=4|1"
  "flash_fwd_nv.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=128 -DBLOCK_N=64 -DWARPS=4 -DCP_ASYNC_L2=128|1"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=128 -DBLOCK_N=64 -DWARPS=8|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=64 -DWARPS=4 -DUSE_TMA=1 -DSOFTMAX_CHAINS=4|3"
  "flash_fwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=80 -DBLOCK_M=64 -DBLOCK_N=48 -DWARPS=4|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=64 -DBLOCK_N=48 -DWARPS=4|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=64 -DBLOCK_N=48 -DWARPS=4 -DOVERLAP=1|3"
  "../tests/wgmma_probe.cl|-DROWS=64 -DDPAD=64|3"
  "../tests/wgmma_probe.cl|-DROWS=48 -DDPAD=128|3"
  "flash_fwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=96 -DBLOCK_M=128 -DBLOCK_N=48 -DWARPS=8 -DOVERLAP=1|3"
  "flash_fwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=111 -DBLOCK_M=64 -DBLOCK_N=64 -DWARPS=4|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=128 -DBLOCK_N=64 -DWARPS=8|3"
  "flash_fwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=40 -DBLOCK_M=64 -DBLOCK_N=48 -DWARPS=4|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=128 -DBLOCK_N=64 -DWARPS=8 -DOVERLAP=1|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=256 -DBLOCK_N=48 -DWARPS=16 -DOVERLAP=1|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=128 -DBLOCK_N=64 -DWARPS=8 -DPINGPONG=0|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=128 -DBLOCK_N=48 -DWARPS=8|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=128 -DBLOCK_N=64 -DWARPS=8 -DUSE_TMA=1|3"
  "flash_fwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=128 -DBLOCK_N=64 -DWARPS=8 -DUSE_TMA=1|3"
  "flash_fwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=96 -DBLOCK_M=128 -DBLOCK_N=48 -DWARPS=8 -DUSE_TMA=1|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=64 -DBLOCK_N=48 -DWARPS=4 -DUSE_TMA=1|3"
  "flash_fwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=64 -DWARPS=4 -DUSE_TMA=1|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=128 -DBLOCK_N=64 -DWARPS=8 -DPINGPONG=0 -DUSE_TMA=1|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=64 -DBLOCK_N=64 -DWARPS=4 -DUSE_TMA=1 -DLPT_HEADS=8|3"
  "flash_fwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=64 -DWARPS=4 -DUSE_TMA=1 -DLPT_HEADS=8|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=128 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=2 -DQ_FP8=4 -DKV_FP8=4 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DLPT_HEADS=8|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=80 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=2 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=32 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=4 -DKV_FP8=4 -DHEAD_DIM=80 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DFP8_PROBE|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=128 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DUSE_TMA=1|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=2 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DUSE_TMA=1 -DLPT_HEADS=8|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=4 -DKV_FP8=4 -DHEAD_DIM=80 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DUSE_TMA=1|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=128 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DUSE_TMA=1 -DPV_CHAINED=1|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=2 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DUSE_TMA=1 -DSOFTMAX_CHAINS=4|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DUSE_TMA=1 -DSOFTMAX_PHASED=0|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=128 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DUSE_TMA=1 -DSOFTMAX_CHAINS=4 -DLPT_HEADS=8|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DUSE_TMA=1 -DOVERLAP=1|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=2 -DQ_FP8=4 -DKV_FP8=4 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=2 -DQ_FP8=4 -DKV_FP8=4 -DHEAD_DIM=32 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DOVERLAP=1|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DUSE_TMA=1 -DOVERLAP=1 -DEX2_FMA_EVERY=2|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=128 -DBLOCK_M=64 -DBLOCK_N=128 -DWARPS=4 -DUSE_TMA=1 -DEX2_FMA_EVERY=4|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=64 -DBLOCK_M=128 -DBLOCK_N=128 -DWARPS=8 -DUSE_TMA=1|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=2 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=64 -DBLOCK_M=128 -DBLOCK_N=128 -DWARPS=8 -DUSE_TMA=1 -DLPT_HEADS=8|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=1 -DQ_FP8=4 -DKV_FP8=4 -DHEAD_DIM=48 -DBLOCK_M=128 -DBLOCK_N=128 -DWARPS=8|3"
  "flash_fwd_sm90_fp8.cl|-DDTYPE=2 -DQ_FP8=3 -DKV_FP8=3 -DHEAD_DIM=32 -DBLOCK_M=128 -DBLOCK_N=128 -DWARPS=8 -DUSE_TMA=1 -DSOFTMAX_PHASED=0 -DOVERLAP=1|3"
  "fp8_vt_pack.cl|-DHEAD_DIM=80|0"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=64 -DWARPS=4 -DQ_PER_TILE=0|3"
  "flash_fwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=64 -DWARPS=4 -DUSE_TMA=1 -DQ_PER_TILE=0|3"
  "flash_fwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=64 -DBLOCK_N=64 -DWARPS=4 -DUSE_TMA=1 -DQ_KEEP=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=2|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=64 -DWG=128 -DBWD_KERNEL=2|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=3|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=64 -DWG=128 -DBWD_KERNEL=3|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=40 -DBLOCK_M=64 -DBLOCK_N=64 -DWG=128 -DBWD_KERNEL=2 -DLPT_HEADS=8|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=32 -DBLOCK_M=64 -DBLOCK_N=64 -DWG=128 -DBWD_KERNEL=3 -DLPT_HEADS=8|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=2 -DUSE_TMA=1 -DLPT_HEADS=8|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=40 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=3 -DUSE_TMA=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=2 -DUSE_TMA=1 -DDQ_ATOMIC=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=40 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=2 -DDQ_ATOMIC=1 -DLPT_HEADS=8|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=64 -DWG=128 -DBWD_KERNEL=2 -DDQ_ATOMIC=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=256 -DBWD_KERNEL=2 -DSTAGES=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=16 -DBLOCK_N=16 -DWG=256 -DBWD_KERNEL=2 -DUSE_TMA=1 -DSTAGES=3|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=3 -DUSE_TMA=1 -DSTAGES=3|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=16 -DBLOCK_N=16 -DWG=256 -DBWD_KERNEL=2 -DUSE_TMA=1 -DDQ_ATOMIC=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=48 -DBLOCK_M=16 -DBLOCK_N=16 -DWG=256 -DBWD_KERNEL=2 -DDQ_ATOMIC=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=16 -DBLOCK_N=16 -DWG=128 -DBWD_KERNEL=2 -DDQ_ATOMIC=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=2 -DUSE_TMA=1 -DSTAGES=4 -DOWN_REGS=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=48 -DBLOCK_M=64 -DBLOCK_N=64 -DWG=256 -DBWD_KERNEL=3 -DOWN_REGS=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=2 -DUSE_TMA=1 -DOWN_REGS=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=3 -DUSE_TMA=1 -DOWN_REGS=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=96 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=2 -DOWN_REGS=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=112 -DBLOCK_M=16 -DBLOCK_N=16 -DWG=128 -DBWD_KERNEL=2 -DUSE_TMA=1 -DSTAGES=5 -DOWN_REGS=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=80 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=2 -DUSE_TMA=1 -DOWN_REGS=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=72 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=3 -DOWN_REGS=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=77 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=2 -DOWN_REGS=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=100 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=3 -DOWN_REGS=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=48 -DBLOCK_M=16 -DBLOCK_N=16 -DWG=256 -DBWD_KERNEL=3 -DUSE_TMA=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=16 -DBLOCK_N=16 -DWG=128 -DBWD_KERNEL=2|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=128 -DBLOCK_M=16 -DBLOCK_N=16 -DWG=128 -DBWD_KERNEL=3|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=80 -DBLOCK_M=16 -DBLOCK_N=16 -DWG=128 -DBWD_KERNEL=2 -DLPT_HEADS=8|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=128 -DBWD_KERNEL=2 -DUSE_TMA=1 -DSTAGES=4 -DSMEM_LIMIT=232448 -DSMEM_DYNAMIC=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=96 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=256 -DBWD_KERNEL=3 -DUSE_TMA=1 -DSTAGES=2 -DSMEM_LIMIT=232448 -DSMEM_DYNAMIC=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=64 -DWG=256 -DBWD_KERNEL=2 -DUSE_TMA=1 -DSTAGES=4 -DSMEM_LIMIT=232448 -DSMEM_DYNAMIC=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=2 -DHEAD_DIM=64 -DBLOCK_M=32 -DBLOCK_N=32 -DWG=256 -DBWD_KERNEL=3 -DUSE_TMA=1 -DSTAGES=8 -DSMEM_LIMIT=232448 -DSMEM_DYNAMIC=1|3"
  "flash_bwd_sm90.cl|-DDTYPE=1 -DHEAD_DIM=64 -DBLOCK_M=64 -DBLOCK_N=64 -DWG=128 -DBWD_KERNEL=3 -DUSE_TMA=1 -DSTAGES=3 -DSMEM_LIMIT=232448 -DSMEM_DYNAMIC=1|3"
  "flash_fwd.cl|-DDTYPE=0 -DHEAD_DIM=64 -DBLOCK_M=16 -DBLOCK_N=32 -DTPR=8|2"
  "flash_fwd.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=16 -DBLOCK_N=32 -DTPR=8|2"
  "flash_fwd.cl|-DDTYPE=2 -DHEAD_DIM=256 -DBLOCK_M=16 -DBLOCK_N=16 -DTPR=8|2"
  "paged_decode.cl|-DDTYPE=1 -DHEAD_DIM=128 -DBLOCK_M=4 -DLANES=16 -DWG_SIZE=128 -DUNROLL=4 -DSTAGES=2 -DPAGE_SIZE=16|0"
  "paged_decode.cl|-DDTYPE=0 -DHEAD_DIM=80 -DBLOCK_M=8 -DLANES=8 -DWG_SIZE=64 -DUNROLL=2 -DSTAGES=2 -DPAGE_SIZE=7 -DCP_ASYNC_L2=64|0"
)

for c in "${configs[@]}"; do
  IFS='|' read -r file defs mma <<< "$c"
  cases=$((cases + 1))
  name="$file $defs"
  # The files every kernel is built on, in src/program.c's order.
  cat "$shim" "$cl/common.cl" "$cl/common_nv.cl" "$cl/common_nv_bwd.cl" "$cl/common_serving.cl" "$cl/$file" > "$tmp/k.cl"
  # shellcheck disable=SC2086 # defs is a list of options
  # -Werror=shadow: a loop counter named like a fragment index (t, g) would silently change
  # what the shared fragment macros compute.
  if ! "$clang" -O2 -target nvptx64-nvidia-cuda -x cl -cl-std=CL1.2 -DFLASHCL_NV_PTX $defs \
      -Werror=shadow -Xclang -finclude-default-header -S -o "$tmp/k.ptx" "$tmp/k.cl" 2> "$tmp/err"; then
    echo "$name: FAILED (clang)"; head -n 20 "$tmp/err"; failures=$((failures + 1)); continue
  fi
  target=sm_90
  if [ "$mma" = 3 ]; then
    # What flashcl_ptx_enable_sm90a does to NVIDIA's PTX.
    sed -i 's#//@sm90a ##g' "$tmp/k.ptx"; target=sm_90a
  fi
  n_mma=$(grep -c 'mma\.sync\|wgmma\.mma_async' "$tmp/k.ptx")
  n_depot=$(grep -c 'local_depot' "$tmp/k.ptx")
  if { [ "$mma" = 1 ] || [ "$mma" = 3 ]; } && [ "$n_mma" -eq 0 ] || { [ "$mma" != 0 ] && [ "$n_depot" -ne 0 ]; }; then
    echo "$name: FAILED ($n_mma mma.sync, $n_depot local_depot: fragments and private arrays stay in registers)"
    failures=$((failures + 1)); continue
  fi
  regs=""
  if [ -n "$ptxas" ]; then
    # clang labels its PTX for an older target; the instructions are sm_80+, checked for sm_90.
    sed -i "s/^\.target sm_[0-9]*/.target $target/; s/^\.version [0-9.]*/.version 8.3/" "$tmp/k.ptx"
    if ! "$ptxas" -arch=$target -v "$tmp/k.ptx" -o "$tmp/k.cubin" > "$tmp/log" 2>&1; then
      echo "$name: FAILED (ptxas)"; grep -v '^ptxas info' "$tmp/log" | head -n 20; failures=$((failures + 1)); continue
    fi
    regs=", ptxas: $(grep -o 'Used [0-9]* registers' "$tmp/log" | tr '\n' ' ')"
    if [ "$mma" = 3 ] && [ -n "$cuobjdump" ]; then
      if ! "$cuobjdump" -sass "$tmp/k.cubin" > "$tmp/k.sass" 2>&1; then
        echo "$name: FAILED (cuobjdump -sass)"; head -n 3 "$tmp/k.sass"; failures=$((failures + 1)); continue
      fi
      # (wgmma_inflight.py fails a listing without a warpgroup MMA too: nothing would be checked)
      if ! python3 "$cl/../scripts/wgmma_inflight.py" "$tmp/k.sass" > "$tmp/inflight" 2>&1; then
        echo "$name: FAILED (a warpgroup MMA's register written in flight)"; head -n 5 "$tmp/inflight"
        failures=$((failures + 1)); continue
      fi
      regs="$regs, SASS: $(tail -n 1 "$tmp/inflight" | sed 's/^[^:]*: //')"
      # Held A fragments (the backward's OWN_REGS, every 16-bit wgmma forward: Q held at one
      # panel, reloaded or held above): no write of them in the loop that no reload precedes.
      if [[ " $defs " == *" -DOWN_REGS=1 "* ]] || [ "$file" = flash_fwd_sm90.cl ]; then
        verdict=$(python3 "$cl/../scripts/wgmma_a_regs.py" "$tmp/k.sass" 2>&1 | tail -n 1)
        if [[ "$verdict" != "verdict: 0 writes"* ]]; then
          echo "$name: FAILED (held fragments written in the loop: $verdict)"; failures=$((failures + 1)); continue
        fi
        regs="$regs, held fragments kept"
      fi
    fi
  fi
  echo "$name: ok ($n_mma mma$regs)"
done
echo "$((cases - failures)) of $cases kernel builds passed${ptxas:+ (assembled by ptxas)}${cuobjdump:+ (SASS checked)}"
[ "$failures" -eq 0 ]
