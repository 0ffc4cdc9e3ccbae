#!/usr/bin/env bash
# test_install.sh BUILD_DIR CMAKE CC EXAMPLE TMP: installs the build to a prefix under TMP, then builds
# README's example (examples/example.c) against it as a user would, through pkg-config (shared
# library) and through a CMake project's find_package (flashcl::flashcl and flashcl::flashcl_static),
# and runs each program.
set -u
build=$1 cmake=$2 cc=$3 example=$4 tmp=$5
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cli_lib.sh
. "$here/cli_lib.sh"

rm -rf "$tmp" && mkdir -p "$tmp"
prefix=$tmp/prefix
if "$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1; then
    ok "cmake --install --prefix $prefix"
else
    bad "cmake --install failed:"; cat "$tmp/install.log"; finish
fi

# pkg-config, the README's command plus the run path a non-system prefix needs.
if command -v pkg-config >/dev/null; then
    pcdir=$(dirname "$(find "$prefix" -name flashcl.pc | head -1)")
    export PKG_CONFIG_PATH=$pcdir
    libdir=$(pkg-config --variable=libdir flashcl)
    real_libdir=$(cd "$libdir" 2>/dev/null && pwd -P)
    real_prefix=$(cd "$prefix" && pwd -P)
    if [ -e "$libdir/libflashcl.so" ] && [ "${real_libdir#"$real_prefix"/}" != "$real_libdir" ]; then
        ok "flashcl.pc's libdir follows the install prefix ($libdir)"
    else
        bad "flashcl.pc's libdir is $libdir, not under $prefix"
    fi
    # shellcheck disable=SC2046 # pkg-config's words are separate arguments
    if "$cc" "$example" $(pkg-config --cflags --libs flashcl) -Wl,-rpath,"$libdir" -o "$tmp/example_pc" \
        >"$tmp/pc.log" 2>&1; then
        ok "cc example.c \$(pkg-config --cflags --libs flashcl)"
        if "$tmp/example_pc" >"$tmp/pc.out" 2>&1 && grep -q '^out' "$tmp/pc.out"; then
            ok "the pkg-config build runs: $(head -1 "$tmp/pc.out")"
        else
            bad "the pkg-config build does not run:"; cat "$tmp/pc.out"
        fi
    else
        bad "the pkg-config build fails:"; cat "$tmp/pc.log"
    fi
else
    echo "skip  pkg-config is not installed"
fi

# A CMake project that finds the installed package.
mkdir -p "$tmp/app"
cat >"$tmp/app/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(flashcl_example C)
find_package(flashcl REQUIRED)
add_executable(example_shared "$example")
target_link_libraries(example_shared PRIVATE flashcl::flashcl)
add_executable(example_static "$example")
target_link_libraries(example_static PRIVATE flashcl::flashcl_static)
CMAKE
if "$cmake" -S "$tmp/app" -B "$tmp/app/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_BUILD_TYPE=Release >"$tmp/app.log" 2>&1 && "$cmake" --build "$tmp/app/build" >>"$tmp/app.log" 2>&1; then
    ok "find_package(flashcl) with flashcl::flashcl and flashcl::flashcl_static"
    for kind in shared static; do
        if "$tmp/app/build/example_$kind" >"$tmp/$kind.out" 2>&1 && grep -q '^out' "$tmp/$kind.out"; then
            ok "the CMake build against flashcl::flashcl ($kind) runs"
        else
            bad "the $kind CMake build does not run:"; cat "$tmp/$kind.out"
        fi
    done
else
    bad "the CMake project fails:"; tail -30 "$tmp/app.log"
fi
finish
