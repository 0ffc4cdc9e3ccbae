#!/usr/bin/env bash
# test_cli.sh: end-to-end tests of the flashcl tool, with .npy files built by printf (no numpy).
#
# usage: test_cli.sh FLASHCL_BINARY TMPDIR
#
# The inputs are constant, so the answers are known exactly: when every q and k
# element is equal, every visible key gets the same score, the softmax is
# uniform, and each output row equals the (shared) v row; the log-sum-exp is
# score + ln(number of visible keys). Rows that see no key must give 0 and -inf.
set -u
# shellcheck source=tests/cli_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"
cli_start test_cli "$@"


# ---- building .npy files ------------------------------------------------------

# repeat FILE COUNT BYTES: appends COUNT copies of a printf escape string.
repeat() {
    local i
    # shellcheck disable=SC2059 # $3 is a string of \x escapes, meant as the format
    for ((i = 0; i < $2; i++)); do printf "$3"; done >>"$1"
}

# Little-endian element bytes.
F32_HALF='\x00\x00\x00\x3f'                                                  # 0.5
F32_VROW='\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x00\xbf\x00\x00\x80\x3e' # 1 2 -0.5 0.25
F16_HALF='\x00\x38'                                                          # 0.5
F16_VROW='\x00\x3c\x00\x40\x00\xb8\x00\x34'                                  # 1 2 -0.5 0.25

# const_npy FILE DESCR SHAPE COUNT BYTES
const_npy() {
    npy_header "$1" "$2" "$3"
    repeat "$1" "$4" "$5"
}

# data_offset FILE: 10 + the header length stored at bytes 8..9.
data_offset() {
    echo $((10 + $(od -An -tu2 -j8 -N2 "$1" | tr -d ' ')))
}

# ---- reading results back -----------------------------------------------------
# check_out FILE DTYPE H D SEES: every output element (b, i, h, d) must equal the
# v row's element d, or 0 for rows i with SEES[i] == 0 (SEES: space-separated
# number of visible keys per query row).
check_out() {
    local file=$1 dtype=$2 heads=$3 dim=$4 sees=$5 off fmt
    off=$(data_offset "$file")
    if [ "$dtype" = f4 ]; then fmt=-tf4; else fmt=-tu2; fi
    od -An -v $fmt -j "$off" "$file" | awk -v dtype="$dtype" -v H="$heads" -v D="$dim" \
        -v sees="$sees" '
        function half(u,   s, e, m) {
            s = u >= 32768 ? -1 : 1; u = u % 32768; e = int(u / 1024); m = u % 1024
            if (e == 0) return s * m * 2 ^ -24
            if (e == 31) return "nan"
            return s * (1 + m / 1024) * 2 ^ (e - 15)
        }
        BEGIN { split("1 2 -0.5 0.25", row, " "); n = split(sees, seen, " "); bad = 0; count = 0 }
        {
            for (f = 1; f <= NF; f++) {
                x = dtype == "f4" ? $f : half($f)
                d = count % D; i = int(count / (D * H))
                want = seen[i + 1] > 0 ? row[d + 1] : 0
                if (x == "nan" || x ~ /nan|inf/ || (x - want > 1e-3) || (want - x > 1e-3)) {
                    if (bad < 3) printf "  element %d: got %s, want %s\n", count, $f, want
                    bad++
                }
                count++
            }
        }
        END { if (count != n * H * D) { printf "  %d elements, want %d\n", count, n * H * D; bad++ }
              exit bad > 0 }'
}

# check_lse FILE H SCORE SEES: lse[b][h][i] = SCORE + ln(SEES[i]), -inf where SEES[i] == 0.
check_lse() {
    local file=$1 heads=$2 score=$3 sees=$4 off
    off=$(data_offset "$file")
    od -An -v -tf4 -j "$off" "$file" | awk -v H="$heads" -v score="$score" -v sees="$sees" '
        BEGIN { n = split(sees, seen, " "); bad = 0; count = 0 }
        {
            for (f = 1; f <= NF; f++) {
                i = count % n; k = seen[i + 1]
                if (k == 0) { if ($f != "-inf") { bad++; printf "  lse %d: got %s, want -inf\n", count, $f } }
                else { want = score + log(k); x = $f
                       if (x ~ /nan|inf/ || x - want > 1e-4 || want - x > 1e-4) {
                           bad++; printf "  lse %d: got %s, want %.6f\n", count, $f, want } }
                count++
            }
        }
        END { if (count != n * H) { printf "  %d lse values, want %d\n", count, n * H; bad++ }
              exit bad > 0 }'
}

# True when no output and no temporary file (NAME.tmp-XXXXXX) exists.
no_outputs_left() {
    local f
    for f in o.npy* lse.npy* ./*.tmp-*; do
        [ -e "$f" ] && return 1
    done
    return 0
}

# ---- inputs -------------------------------------------------------------------
# f32: q (1,5,4,4), k and v (1,7,2,4): GQA 2:1, seqlen_q < seqlen_k.
const_npy q32.npy '<f4' '1, 5, 4, 4' 80 "$F32_HALF"
const_npy k32.npy '<f4' '1, 7, 2, 4' 56 "$F32_HALF"
npy_header v32.npy '<f4' '1, 7, 2, 4'
repeat v32.npy 14 "$F32_VROW"
# f16: q (1,6,2,4), k and v (1,4,2,4): seqlen_q > seqlen_k, so causal rows 0, 1 see nothing.
const_npy q16.npy '<f2' '1, 6, 2, 4' 48 "$F16_HALF"
const_npy k16.npy '<f2' '1, 4, 2, 4' 32 "$F16_HALF"
npy_header v16.npy '<f2' '1, 4, 2, 4'
repeat v16.npy 8 "$F16_VROW"
# score = scale * q.k = (1/sqrt(4)) * 4 * 0.25 = 0.5

# ---- attention: known answers -------------------------------------------------
run_attention() { # NAME ARGS...: runs, expects success
    local name=$1
    shift
    rm -f o.npy lse.npy
    if "$BIN" attention "$@" --out o.npy --lse lse.npy >out.txt 2>err.txt; then
        return 0
    fi
    bad "$name: exit status $? ($(head -c 300 err.txt))"
    return 1
}

if run_attention "f32 GQA" --q q32.npy --k k32.npy --v v32.npy; then
    if check_out o.npy f4 4 4 "7 7 7 7 7" && check_lse lse.npy 4 0.5 "7 7 7 7 7"; then
        ok "attention f32 GQA: out = v row, lse = 0.5 + ln 7"
    else bad "attention f32 GQA: wrong values"; fi
grep -q 'ms on .*untimed first run of [0-9.]* ms' out.txt &&
    ok "attention: the printed time leaves out the first run's kernel build, and says so" ||
    bad "attention's time line: $(cat out.txt)"
"$BIN" attention --help | grep -q 'dense one' && "$BIN" attention --help | grep -q 'within rounding' &&
    ok "--paged's help says within rounding" || bad "--paged help: $("$BIN" attention --help | grep -A2 -- --paged)"
fi

if run_attention "f32 host path" --q q32.npy --k k32.npy --v v32.npy --device host; then
    if check_out o.npy f4 4 4 "7 7 7 7 7" && check_lse lse.npy 4 0.5 "7 7 7 7 7"; then
        ok "attention --device host"
    else bad "attention --device host: wrong values"; fi
fi

# Causal with seqlen_q 6 > seqlen_k 4, bottom-right aligned: row i sees keys
# 0..i-2, so rows 0 and 1 see none (output 0, lse -inf).
if run_attention "f16 causal" --q q16.npy --k k16.npy --v v16.npy --causal; then
    if check_out o.npy f2 2 4 "0 0 1 2 3 4" && check_lse lse.npy 2 0.5 "0 0 1 2 3 4"; then
        ok "attention f16 causal, seqlen_q > seqlen_k: empty rows are 0 / -inf"
    else bad "attention f16 causal: wrong values"; fi
fi

# Window (1,1) with the offset seqlen_k - seqlen_q = 2: row i sees i+1 .. i+3,
# clipped to 0..6: 3 keys, except row 4 (keys 5, 6). Softcap 5: 5*tanh(0.5/5).
if run_attention "f32 window+softcap" --q q32.npy --k k32.npy --v v32.npy --window 1,1 \
    --softcap 5; then
    capped=$(awk 'BEGIN { x = 0.1; printf "%.9f", 5 * (exp(2 * x) - 1) / (exp(2 * x) + 1) }')
    if check_out o.npy f4 4 4 "3 3 3 3 2" && check_lse lse.npy 4 "$capped" "3 3 3 3 2"; then
        ok "attention --window 1,1 --softcap 5"
    else bad "attention --window --softcap: wrong values"; fi
fi

# '|f4' and '=f4' mean native order: accepted on little-endian hosts.
sed "s/'<f4'/'|f4'/" q32.npy >qpipe.npy
sed "s/'<f4'/'=f4'/" k32.npy >keq.npy
if run_attention "native-order descr" --q qpipe.npy --k keq.npy --v v32.npy; then
    ok "attention accepts '|f4' and '=f4'"
fi

# ---- attention --dtype e4m3|e5m2: FP8 --------------------------------------------
# The constant inputs quantize exactly (q, k: 0.5 -> 448 * (0.5/448); v's row
# 1 2 -0.5 0.25 -> 224 448 -112 56 times 2/448), so the known answers hold,
# written as float32 whatever the inputs' dtype, and the RMSE against float64
# on the unquantized inputs is tiny.
rmse_small() { # the printed RMSE is below 1e-5
    awk '/RMSE/ { for (i = 1; i <= NF; i++) if ($i == "RMSE") r = $(i + 1) } END { exit !(r != "" && r + 0 < 1e-5) }' out.txt
}
if run_attention "e4m3" --q q32.npy --k k32.npy --v v32.npy --dtype e4m3; then
    if check_out o.npy f4 4 4 "7 7 7 7 7" && check_lse lse.npy 4 0.5 "7 7 7 7 7" && rmse_small &&
        grep -q 'e4m3, per-tensor quantization, out float32' out.txt; then
        ok "attention --dtype e4m3: out = v row as float32, lse, the RMSE printed"
    else bad "attention --dtype e4m3: $(cat out.txt)"; fi
fi
if run_attention "e5m2 block causal" --q q16.npy --k k16.npy --v v16.npy --causal --dtype e5m2 --block-quant; then
    if check_out o.npy f4 2 4 "0 0 1 2 3 4" && check_lse lse.npy 2 0.5 "0 0 1 2 3 4" && rmse_small &&
        grep -q 'per-head 64-row block quantization' out.txt; then
        ok "attention --dtype e5m2 --block-quant from float16 inputs, causal: float32 out, empty rows 0 / -inf"
    else bad "attention --dtype e5m2 --block-quant: $(cat out.txt)"; fi
fi
if run_attention "e4m3 hadamard" --q q32.npy --k k32.npy --v v32.npy --dtype e4m3 --block-quant --hadamard \
    --device host; then
    if check_out o.npy f4 4 4 "7 7 7 7 7" && check_lse lse.npy 4 0.5 "7 7 7 7 7" &&
        grep -q 'with Hadamard rotation of q and k' out.txt; then
        ok "attention --dtype e4m3 --block-quant --hadamard on the host path: q k^T unchanged"
    else bad "attention --dtype e4m3 --hadamard: $(cat out.txt)"; fi
fi
# ---- attention: malformed and inconsistent inputs -----------------------------
good_size=$(wc -c <q32.npy)
printf 'NOTNUMPY and some more bytes to make it long enough\n' >badmagic.npy
head -c 8 q32.npy >trunc_pre.npy
head -c 40 q32.npy >trunc_hdr.npy
head -c $((good_size - 3)) q32.npy >trunc_data.npy
{ cat q32.npy; printf 'xx'; } >trailing.npy
npy_header badhdr.npy '<f4' '1, 5, 4, 4'
sed "s/'shape': (1, 5, 4, 4)/'shape': [1, 5, 4, 4]/" badhdr.npy >badhdr2.npy
repeat badhdr2.npy 80 "$F32_HALF"
npy_header zero.npy '<f4' '1, 0, 4, 4'
const_npy dims3.npy '<f4' '5, 4, 4' 80 "$F32_HALF"
const_npy dims5.npy '<f4' '1, 1, 5, 4, 4' 80 "$F32_HALF"
const_npy bigend.npy '>f4' '1, 5, 4, 4' 80 "$F32_HALF"
npy_header fortran.npy '<f4' '1, 5, 4, 4'
sed "s/'fortran_order': False/'fortran_order': True /" fortran.npy >fortran2.npy
repeat fortran2.npy 80 "$F32_HALF"
const_npy f8.npy '<f8' '1, 5, 4, 4' 80 "$F32_HALF$F32_HALF"
const_npy i4.npy '<i4' '1, 5, 4, 4' 80 "$F32_HALF"
: >empty.npy
const_npy kbatch.npy '<f4' '2, 7, 2, 4' 112 "$F32_HALF"
const_npy kheads.npy '<f4' '1, 7, 3, 4' 84 "$F32_HALF"
const_npy kdim.npy '<f4' '1, 7, 2, 8' 112 "$F32_HALF"
const_npy vlen.npy '<f4' '1, 6, 2, 4' 48 "$F32_HALF"

# expect_error NAME PATTERN ARGS...: exit status 1, exactly one stderr line that
# starts with "flashcl: " and matches PATTERN, and no output or temp file left.
expect_error() {
    local name=$1 pattern=$2 status lines
    shift 2
    rm -f o.npy lse.npy
    "$BIN" attention "$@" --out o.npy --lse lse.npy >out.txt 2>err.txt
    status=$?
    lines=$(wc -l <err.txt)
    if [ "$status" -ne 1 ]; then
        bad "$name: exit status $status, want 1"
    elif [ "$lines" -ne 1 ]; then
        bad "$name: $lines lines on stderr, want 1: $(head -c 300 err.txt)"
    elif ! grep -q -e '^flashcl: ' err.txt || ! grep -q -e "$pattern" err.txt; then
        bad "$name: message does not match '$pattern': $(cat err.txt)"
    elif ! no_outputs_left; then
        bad "$name: output or temporary file left behind: $(echo o.npy* lse.npy* ./*.tmp-*)"
    else
        ok "$name: $(cat err.txt)"
    fi
}

k=(--k k32.npy --v v32.npy)
expect_error "bad magic" 'badmagic.npy: .*magic' --q badmagic.npy "${k[@]}"
expect_error "truncated preamble" 'trunc_pre.npy: .*truncated' --q trunc_pre.npy "${k[@]}"
expect_error "truncated header" 'trunc_hdr.npy: .*truncated' --q trunc_hdr.npy "${k[@]}"
expect_error "short data" 'trunc_data.npy: .*truncated' --q trunc_data.npy "${k[@]}"
expect_error "trailing data" 'trailing.npy: .*trailing' --q trailing.npy "${k[@]}"
expect_error "header not parsable" 'badhdr2.npy: header not parsable' --q badhdr2.npy "${k[@]}"
expect_error "zero dimension" 'zero.npy: .*zero dimension' --q zero.npy "${k[@]}"
expect_error "3 dimensions" 'dims3.npy: .*3 dimensions' --q dims3.npy "${k[@]}"
expect_error "5 dimensions" 'dims5.npy: .*5 dimensions' --q dims5.npy "${k[@]}"
expect_error "big-endian" 'bigend.npy: big-endian' --q bigend.npy "${k[@]}"
expect_error "fortran order" 'fortran2.npy: fortran_order' --q fortran2.npy "${k[@]}"
expect_error "float64" "f8.npy: dtype '<f8' not supported" --q f8.npy "${k[@]}"
expect_error "int32" "i4.npy: dtype '<i4' not supported" --q i4.npy "${k[@]}"
expect_error "empty file" 'empty.npy: ' --q empty.npy "${k[@]}"
expect_error "missing file" 'nonexistent.npy: cannot open' --q nonexistent.npy "${k[@]}"
expect_error "k batch" "kbatch.npy: shape (2,7,2,4) does not match q's batch 1" \
    --q q32.npy --k kbatch.npy --v v32.npy
expect_error "k heads" 'kheads.npy: .*heads' --q q32.npy --k kheads.npy --v v32.npy
expect_error "k head_dim" "kdim.npy: .*head_dim" --q q32.npy --k kdim.npy --v v32.npy
expect_error "k dtype" 'k16.npy: dtype float16 does not match' --q q32.npy --k k16.npy --v v32.npy
expect_error "v shape" "vlen.npy: shape (1,6,2,4) does not match k's" \
    --q q32.npy --k k32.npy --v vlen.npy

# A failed run must not touch an existing output file.
printf 'precious' >o.npy
"$BIN" attention --q trunc_data.npy --k k32.npy --v v32.npy --out o.npy >/dev/null 2>&1
if [ "$(cat o.npy)" = precious ] && ! compgen -G './*.tmp-*' >/dev/null; then
    ok "a failed run leaves an existing output untouched"
else bad "a failed run changed the existing output"; fi
rm -f o.npy

# ---- usage --------------------------------------------------------------------
expect_status() { # WANT NAME ARGS...
    local want=$1 name=$2 status
    shift 2
    "$BIN" "$@" >out.txt 2>err.txt
    status=$?
    if [ "$status" -eq "$want" ]; then ok "$name (exit $status)"; else
        bad "$name: exit status $status, want $want: $(head -c 300 err.txt)"; fi
}
expect_status 0 "--version" --version
grep -q '^flashcl [0-9]' out.txt || bad "--version prints no version"
expect_status 0 "--help" --help
expect_status 0 "help attention" help attention
expect_status 0 "attention --help" attention --help
expect_status 2 "no arguments"
expect_status 2 "unknown command" frobnicate
# A usage error is two lines: the message and a pointer to --help, not the whole help text.
short_usage_error() { # NAME
    if [ "$(wc -l <err.txt)" -eq 2 ] && grep -q "^Try 'flashcl.* --help'" err.txt && ! grep -q '^usage:' err.txt; then
        ok "$1: the error and a --help hint, no help text"
    else bad "$1: stderr is not the error and a hint: $(head -c 300 err.txt)"; fi
}
grep -q "unknown command 'frobnicate'" err.txt || bad "unknown command: no message on stderr"
short_usage_error "unknown command"
expect_status 2 "unknown option" attention --bogus
short_usage_error "unknown option"
expect_status 2 "misspelt option" attention --casual
if grep -q "did you mean '--causal'" err.txt; then ok "--casual: did you mean '--causal'"; else
    bad "--casual: no suggestion: $(cat err.txt)"; fi
short_usage_error "misspelt option"
expect_status 2 "misspelt command" atention
grep -q "did you mean 'attention'" err.txt && ok "atention: did you mean 'attention'" ||
    bad "atention: no suggestion: $(cat err.txt)"
expect_status 2 "misspelt bench --decode option" bench --decode --stpe
grep -q "did you mean '--step'" err.txt && grep -q "flashcl bench --decode --help" err.txt &&
    ok "bench --decode --stpe: suggestion and the mode's own --help" || bad "bench --decode --stpe: $(cat err.txt)"
expect_status 2 "help for an unknown command" help frobnicate
expect_status 2 "attention without inputs" attention --out o.npy
expect_status 2 "option without its value" attention --q
expect_status 2 "bad --window" attention --q q32.npy --k k32.npy --v v32.npy --out o.npy \
    --window 3
expect_status 2 "bad --cases" check --cases zero
short_usage_error "bad --cases"
expect_status 2 "bad --shape" bench --shape 1,2,3
no_outputs_left || bad "usage errors left output files"

# Messages that name what was wrong: the option and its range, the variable.
expect_status 2 "--scale -1 refused" attention --q q32.npy --k k32.npy --v v32.npy --out o.npy --scale -1
grep -q -- "--scale wants a number in \[0," err.txt || bad "--scale -1: no range in '$(head -c 300 err.txt)'"
expect_status 2 "--softcap 1e39 refused" attention --q q32.npy --k k32.npy --v v32.npy --out o.npy \
    --softcap 1e39
grep -q -- "--softcap wants a number in \[0," err.txt || bad "--softcap 1e39: no range in '$(head -c 300 err.txt)'"
FLASHCL_DEVICE=nonexistent expect_status 1 "FLASHCL_DEVICE=nonexistent fails" attention --q q32.npy \
    --k k32.npy --v v32.npy --out o.npy
grep -q "'nonexistent'.*(from FLASHCL_DEVICE)" err.txt ||
    bad "FLASHCL_DEVICE=nonexistent: the message does not name it: '$(head -c 300 err.txt)'"
FLASHCL_PARAMS=BLOCK_M expect_status 1 "FLASHCL_PARAMS=BLOCK_M fails" attention --q q32.npy --k k32.npy \
    --v v32.npy --out o.npy
if ! grep -q "malformed FLASHCL_\* environment variable" err.txt || ! grep -q "FLASHCL_PARAMS" err.txt; then
    bad "FLASHCL_PARAMS=BLOCK_M: not reported as a malformed variable: '$(head -c 300 err.txt)'"
fi
no_outputs_left || bad "refused runs left output files"

# An output that is an input under another name (./, a hard link, a symlink)
# is refused by file identity, and the input stays as it was.
cp q32.npy qcopy.npy
ln -f qcopy.npy qlink.npy
ln -sf qcopy.npy qsym.npy
sum_before=$(cksum <qcopy.npy)
expect_status 2 "--out ./q (same file, other name)" attention --q qcopy.npy --k k32.npy --v v32.npy \
    --out ./qcopy.npy
grep -q "same file" err.txt || bad "--out ./q: no 'same file' message: $(head -c 300 err.txt)"
expect_status 2 "--out hard link of --q" attention --q qcopy.npy --k k32.npy --v v32.npy --out qlink.npy
expect_status 2 "--lse symlink to --q" attention --q qcopy.npy --k k32.npy --v v32.npy --out o.npy \
    --lse qsym.npy
expect_status 2 "--lse ./o with --out o" attention --q qcopy.npy --k k32.npy --v v32.npy --out o.npy \
    --lse ./o.npy
[ "$(cksum <qcopy.npy)" = "$sum_before" ] || bad "a refused run changed its input"
no_outputs_left || bad "refused same-file runs left output files"
rm -f qcopy.npy qlink.npy qsym.npy

# ---- attention --dtype: refusals, and bench --dtype e4m3,e5m2 ------------------
expect_status 2 "--block-quant without --dtype" attention --q q32.npy --k k32.npy --v v32.npy --out o.npy --block-quant
grep -q 'needs --dtype e4m3 or e5m2' err.txt && ok "  says it needs --dtype" || bad "--block-quant alone: $(cat err.txt)"
expect_status 2 "--dtype f16 refused" attention --q q32.npy --k k32.npy --v v32.npy --out o.npy --dtype f16
grep -q 'wants e4m3 or e5m2' err.txt && ok "  names the choices" || bad "--dtype f16: $(cat err.txt)"
expect_status 2 "--dtype e4m3 --paged refused" attention --q q32.npy --k k32.npy --v v32.npy --out o.npy \
    --dtype e4m3 --paged 4
const_npy q6.npy '<f4' '1, 2, 1, 6' 12 "$F32_HALF"
expect_status 1 "--hadamard on head_dim 6 fails" attention --q q6.npy --k q6.npy --v q6.npy --out o.npy --lse lse.npy \
    --dtype e4m3 --hadamard
grep -q 'power of two' err.txt && no_outputs_left && ok "  says why, writes nothing" ||
    bad "--hadamard head_dim 6: $(cat err.txt)"
expect_status 0 "bench --dtype e4m3,e5m2, one small shape" bench --dtype e4m3,e5m2 --shape 1,2,64,32 --iters 1 --warmup 0
[ "$(grep -Ec '^(e4m3|e5m2) .* pass ' out.txt)" -eq 4 ] && ok "  four validated FP8 rows" ||
    bad "bench --dtype e4m3,e5m2: $(cat out.txt)"
# --v-packed: V packed once by flashcl_fp8_pack_v, the calls read it (desc.v_packed); the
# reference reads V as it was, so a misread packed V fails the check. Not tile multiples.
expect_status 0 "bench --dtype e4m3 --v-packed, one small shape" bench --dtype e4m3 --v-packed \
    --shape 1,2,1,33,47,48 --iters 1 --warmup 0
[ "$(grep -Ec '^e4m3 .* pass .* v-packed$' out.txt)" -eq 2 ] && grep -q 'V packed once' out.txt &&
    ok "  two validated e4m3 rows marked v-packed" || bad "bench --dtype e4m3 --v-packed: $(cat out.txt)"
expect_status 2 "bench --v-packed --dtype f16 refused" bench --v-packed --dtype f16 --shape 1,2,64,32
grep -q -- '--v-packed .*e4m3' err.txt && ok "  says it needs an FP8 dtype" ||
    bad "--v-packed --dtype f16: $(cat err.txt)"

# ---- the other subcommands ----------------------------------------------------
expect_status 0 "devices" devices
[ -s out.txt ] || bad "devices printed nothing"
expect_status 0 "devices --device host" devices --device host
grep -q 'spec "host": .*\[host path\]' out.txt && ok "  names the host path and its parameters" ||
    bad "devices --device host: $(head -c 300 out.txt)"
expect_status 1 "devices --device no-such-platform-anywhere: picks nothing" devices \
    --device no-such-platform-anywhere:
grep -q "no OpenCL platform" out.txt && ok "  and says why" || bad "devices --device no-such-platform-anywhere: $(head -c 300 out.txt)"
expect_status 0 "check --cases 4" check --cases 4
[ "$(grep -c ' PASS$' out.txt)" -eq 4 ] || bad "check --cases 4: not 4 PASS rows"
expect_status 0 "bench --json, one small shape" bench --shape 1,2,64,32 --iters 2 --warmup 1 --json
if head -c 1 out.txt | grep -q '{' && grep -q '"validated": "pass"' out.txt; then
    ok "bench --json prints a validated JSON object"
else bad "bench --json output: $(head -c 300 out.txt)"; fi
grep -q '"params": {"variant": "[a-z0-9-]*", "block_m": [0-9]*, .*"source": "' out.txt &&
    ok "bench --json names the parameters each row ran and their source" ||
    bad "bench --json has no params/source: $(head -c 300 out.txt)"
expect_status 0 "bench table, one small shape" bench --shape 1,2,64,32 --iters 1 --warmup 0
grep -Eq 'params \(source\)' out.txt && grep -Eq ' [0-9]+x[0-9]+ wg [0-9]+ \((default|built-in|tuned|set|FLASHCL_PARAMS)' out.txt &&
    ok "the bench table names the parameters and their source" || bad "bench table: $(cat out.txt)"

# bench --decode: a row per shape naming the serving kernel; FLASHCL_DECODE_PARAMS
# picks it, and a malformed one stops the run with a message.
expect_status 0 "bench --decode" bench --decode --batch 1 --context 64 --head-dim 64 --iters 1 --warmup 0
# The kernel is the device's choice: the tiled one on a CPU, a decode kernel on a GPU.
grep -Eq '^ +1 +64 +[0-9]+ .* (paged|decode)' out.txt && ok "bench --decode: a row naming its kernel" ||
    bad "bench --decode output: $(cat out.txt)"
FLASHCL_DECODE_PARAMS=KERNEL=decode expect_status 0 "bench --decode, the decode kernel" \
    bench --decode --batch 1 --context 64 --head-dim 64 --iters 1 --warmup 0
grep -Eq '^ +1 +64 +[0-9]+ .* decode' out.txt && ok "FLASHCL_DECODE_PARAMS=KERNEL=decode is used" ||
    bad "bench --decode with KERNEL=decode: $(cat out.txt)"
FLASHCL_DECODE_PARAMS=KERNEL=fast expect_status 1 "bench --decode, KERNEL=fast refused" \
    bench --decode --batch 1 --context 64 --head-dim 64 --iters 1 --warmup 0
grep -q 'KERNEL must be' err.txt && ok "the refusal names the key" || bad "KERNEL=fast: $(cat err.txt)"
expect_status 0 "bench --decode --page-order sequential" \
    bench --decode --batch 2 --context 40 --head-dim 64 --page-size 8 --page-order sequential --iters 1 --warmup 0
grep -q '(sequential)' out.txt && grep -Eq '^ +2 +40 ' out.txt && ok "sequential pages: named, and a row" ||
    bad "bench --decode --page-order sequential: $(cat out.txt)"
expect_status 0 "bench --decode --step" bench --decode --batch 3 --context 31 --head-dim 64 --page-size 8 --step --iters 3 --warmup 1
grep -q 'timed: an append of one token per sequence' out.txt && grep -Eq '^ +3 +31 ' out.txt &&
    ok "--step: named, and a row (pages grown past the context)" || bad "bench --decode --step: $(cat out.txt) $(cat err.txt)"
expect_status 2 "bench --decode --page-order random refused" bench --decode --page-order random
grep -q 'shuffled or sequential' err.txt && ok "the refusal names the choices" || bad "--page-order random: $(cat err.txt)"
# --kv-dtype e4m3|e5m2: FP8 pages, half the bytes a step reads (KV_MB, the 6th column:
# 1024 keys x 8 heads x 64 x 2 (K, V) x 1 byte = 1.0 MB against f16's 2.1), output checked.
expect_status 0 "bench --decode f16 pages" bench --decode --batch 1 --context 1024 --head-dim 64 --iters 1 --warmup 0
f16_mb=$(awk '$1 == 1 && $2 == 1024 { print $6 }' out.txt)
expect_status 0 "bench --decode --kv-dtype e4m3" bench --decode --batch 1 --context 1024 --head-dim 64 --kv-dtype e4m3 \
    --iters 1 --warmup 0
e4m3_mb=$(awk '$1 == 1 && $2 == 1024 { print $6 }' out.txt)
grep -q 'K/V pages e4m3 (1 byte an element' out.txt && [ "$f16_mb" = 2.1 ] && [ "$e4m3_mb" = 1.0 ] &&
    ok "--kv-dtype e4m3: named, a valid row reading half the bytes ($e4m3_mb MB against $f16_mb)" ||
    bad "bench --decode --kv-dtype e4m3 ($e4m3_mb, f16 $f16_mb): $(cat out.txt)"
expect_status 0 "bench --decode --kv-dtype e5m2, bf16 queries" bench --decode --batch 2 --context 50 --head-dim 64 \
    --dtype bf16 --kv-dtype e5m2 --iters 1 --warmup 0
grep -q 'bf16, K/V pages e5m2' out.txt && grep -Eq '^ +2 +50 ' out.txt && ! grep -q INVALID out.txt &&
    ok "--kv-dtype e5m2: named, and a valid row" || bad "bench --decode --kv-dtype e5m2: $(cat out.txt)"
expect_status 2 "bench --decode --kv-dtype e3m4 refused" bench --decode --kv-dtype e3m4
grep -q 'e4m3 or e5m2' err.txt && ok "the refusal names the choices" || bad "--kv-dtype e3m4: $(cat err.txt)"
expect_status 2 "bench --decode --kv-dtype f32 with --dtype f16 refused" bench --decode --kv-dtype f32

cd / && rm -rf "$W"
finish
