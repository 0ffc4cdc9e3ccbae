# cli_lib.sh: what the CLI test scripts share (sourced, not run): pass/fail counting and .npy headers.

failures=0
ok() { printf 'ok    %s\n' "$1"; }
bad() { printf 'FAIL  %s\n' "$1"; failures=$((failures + 1)); }

# npy_header FILE DESCR SHAPE: numpy's version 1.0 layout, the dict padded with
# spaces and a '\n' so that the data starts on a 64-byte boundary.
npy_header() {
    local dict="{'descr': '$2', 'fortran_order': False, 'shape': ($3), }"
    local total=$((10 + ${#dict} + 1))
    local pad=$(((64 - total % 64) % 64))
    local hlen=$((${#dict} + pad + 1))
    printf '\x93NUMPY\x01\x00' >"$1"
    # shellcheck disable=SC2059 # the format is built to hold the two length bytes
    printf "\\x$(printf %02x $((hlen & 255)))\\x$(printf %02x $((hlen >> 8)))" >>"$1"
    printf '%s%*s\n' "$dict" "$pad" '' >>"$1"
}

# cli_start NAME BINARY TMPDIR: the start every `NAME.sh FLASHCL_BINARY TMPDIR` script shares:
# sets BIN and TMP (a missing argument ends the script with the usage line), makes a fresh
# work folder W under TMPDIR and enters it.
cli_start() {
    local usage="usage: $1.sh FLASHCL_BINARY TMPDIR"
    BIN=${2:?$usage}
    TMP=${3:?$usage}
    mkdir -p "$TMP" || exit 1
    W=$(mktemp -d "$TMP/$1.XXXXXX") || exit 1
    cd "$W" || exit 1
}

# finish: the exit status every script ends with.
finish() {
    if [ "$failures" -ne 0 ]; then
        echo "$failures test(s) failed"
        exit 1
    fi
    echo "all tests passed"
    exit 0
}
