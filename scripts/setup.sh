#!/usr/bin/env bash
# scripts/setup.sh: install what flashcl needs on Debian/Ubuntu (only what is missing).
set -euo pipefail
need=()
# openmpi: the optional context-parallel library (flashcl_mpi) and its tests.
for pkg in build-essential cmake ocl-icd-opencl-dev opencl-c-headers pocl-opencl-icd openmpi-bin libopenmpi-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
