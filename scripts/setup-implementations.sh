#!/usr/bin/env bash
# scripts/setup-implementations.sh: install the OpenCL implementations CI tests besides PoCL
# (docs: /work/shared/platforms/OPENCL-IMPLEMENTATIONS.md, tests/CMakeLists.txt's impl-* labels).
#   scripts/setup-implementations.sh [BUILD_DIR]      (default: build)
# - Mesa rusticl on llvmpipe: apt mesa-opencl-icd (its device appears only with RUSTICL_ENABLE=llvmpipe)
# - Intel's OpenCL CPU runtime: pip intel-opencl-rt + intel-cmplr-lib-rt into BUILD_DIR/intel-venv;
#   the wheel's own .icd names a path that does not exist, so the venv's libintelocl.so is
#   registered by absolute path: on CI (CI=true, root) in /etc/OpenCL/vendors/intel-cpu.icd;
#   elsewhere in BUILD_DIR/icd-vendors (a copy of the system's .icd files plus Intel's), which
#   scripts/test-implementations.sh hands to the loader through OCL_ICD_VENDORS, so that a shared
#   machine's other users keep their platform order (a new platform can change the default device).
# - Oclgrind: apt oclgrind (ctest -L oclgrind)
# A step that fails prints one line "setup-implementations: NAME not installed: WHY" and the
# others go on; the tests then say that NAME is missing (they never pass without it).
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(mkdir -p "${1:-build}" && cd "${1:-build}" && pwd)
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo

apt_install() { # apt_install PKG...: only what is missing
  local need=() pkg
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
  [ ${#need[@]} -eq 0 ] && return 0
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
}

apt_install mesa-opencl-icd || echo "setup-implementations: rusticl not installed: apt-get install mesa-opencl-icd failed"
apt_install oclgrind || echo "setup-implementations: oclgrind not installed: apt-get install oclgrind failed"

# Intel: the venv needs python3-venv; intel-cmplr-lib-rt carries libimf, libsvml, libirng and
# libintlc that libintelocl.so loads (the runtime alone fails to load without them).
venv=$build/intel-venv
lib=$venv/lib/libintelocl.so
intel() {
  if [ ! -f "$lib" ]; then
    python3 -m venv "$venv" >/dev/null 2>&1 || { apt_install python3-venv && python3 -m venv --clear "$venv"; } || return 1
    "$venv/bin/pip" install -q --disable-pip-version-check intel-opencl-rt "intel-cmplr-lib-rt==2026.*" || return 1
  fi
  # The wheel puts the library under the venv's lib/ (RUNPATH $ORIGIN finds its neighbours).
  [ -f "$lib" ] || lib=$(find "$venv" -name libintelocl.so -print -quit)
  [ -n "$lib" ] && [ -f "$lib" ] || return 1
  if [ "${CI:-}" = true ] && [ "$(id -u)" -eq 0 ]; then
    mkdir -p /etc/OpenCL/vendors && echo "$lib" > /etc/OpenCL/vendors/intel-cpu.icd
  else
    mkdir -p "$build/icd-vendors"
    cp /etc/OpenCL/vendors/*.icd "$build/icd-vendors/" 2>/dev/null
    echo "$lib" > "$build/icd-vendors/intel-cpu.icd"
  fi
}
intel || echo "setup-implementations: intel not installed: the pip install of intel-opencl-rt into $venv failed"
exit 0
