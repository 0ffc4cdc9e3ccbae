#!/usr/bin/env bash
# test_sim_cli.sh: `flashcl serve-sim --trace` and `flashcl spec-sim` end to end, with known answers.
#
# usage: test_sim_cli.sh FLASHCL_BINARY TMPDIR
set -u
# shellcheck source=tests/cli_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"
cli_start test_sim_cli "$@"

# ---- serve-sim --trace ------------------------------------------------------------
# Three requests with 10 + 20 + 5 output tokens: both modes must emit exactly 35.
printf '0,16,10\n0,32,20\n0.01,8,5\n' >trace.csv
if "$BIN" serve-sim --trace trace.csv --json >sim.json 2>err.txt; then
    n_static=$(grep -c '"mode": "static"' sim.json)
    n_cont=$(grep -c '"mode": "continuous"' sim.json)
    if grep -q '"requests": 3' sim.json && grep -q '"output_tokens": 35' sim.json && [ "$n_static" = 1 ] &&
        [ "$n_cont" = 1 ]; then
        ok "serve-sim --trace: 3 requests, 35 output tokens, both modes reported"
    else bad "serve-sim --trace JSON: $(head -c 400 sim.json)"; fi
else bad "serve-sim --trace failed: $(cat err.txt)"; fi

# The plot: lines without thousands of markers, the y axis ending at the slot count (16, not 20).
if "$BIN" serve-sim --trace trace.csv --max-batch 16 --plot busy.svg >out.txt 2>err.txt && [ -s busy.svg ]; then
    circles=$(grep -c '<circle' busy.svg)
    top=$(grep -o 'text-anchor="end" fill="#333">[0-9.]*<' busy.svg | grep -o '>[0-9.]*<' | tr -d '<>' | sort -n | tail -1)
    if [ "$circles" -le 128 ] && [ "$top" = 16 ] && grep -q '<polyline' busy.svg; then
        ok "serve-sim --plot: lines, $circles markers, y axis 0..16"
    else bad "serve-sim --plot: $circles markers, y axis to $top"; fi
else bad "serve-sim --plot failed: $(cat err.txt)"; fi

# --kv-dtype e4m3: FP8 pages in the bytes of the f16 pool, so twice its pages; same tokens out.
if "$BIN" serve-sim --trace trace.csv --kv-dtype f16 --json >f16.json 2>err.txt &&
    "$BIN" serve-sim --trace trace.csv --kv-dtype e4m3 --json >fp8.json 2>>err.txt &&
    "$BIN" serve-sim --trace trace.csv --kv-dtype e4m3 >fp8.txt 2>>err.txt; then
    p16=$(grep -o '"pages": [0-9]*' f16.json | grep -o '[0-9]*')
    p8=$(grep -o '"pages": [0-9]*' fp8.json | grep -o '[0-9]*')
    if [ -n "$p16" ] && [ "$p8" = $((2 * p16)) ] && grep -q '"kv_dtype": "e4m3"' fp8.json &&
        grep -q '"output_tokens": 35' fp8.json && grep -q 'holds twice the tokens' fp8.txt; then
        ok "serve-sim --kv-dtype e4m3: $p8 pages in the bytes of $p16 f16 pages, 35 tokens, said in the output"
    else bad "serve-sim --kv-dtype e4m3: pages $p8 vs $p16: $(cat fp8.txt)"; fi
else bad "serve-sim --kv-dtype failed: $(cat err.txt)"; fi
"$BIN" serve-sim --trace trace.csv --kv-dtype e2m5 >out.txt 2>err.txt
[ $? -eq 2 ] && grep -q 'e4m3 or e5m2' err.txt && ok "serve-sim --kv-dtype e2m5 refused" ||
    bad "serve-sim --kv-dtype e2m5: $(cat err.txt)"

printf '0,16,10\n0,abc,5\n' >bad.csv
"$BIN" serve-sim --trace bad.csv >out.txt 2>err.txt
if [ $? -ne 0 ] && grep -q 'bad.csv:2' err.txt; then
    ok "a malformed trace row is an error naming the line"
else bad "malformed trace: $(cat err.txt)"; fi
printf '1,16,10\n0,16,10\n' >order.csv
"$BIN" serve-sim --trace order.csv >out.txt 2>err.txt
[ $? -ne 0 ] && grep -q 'must not decrease' err.txt && ok "decreasing arrival times are refused" ||
    bad "decreasing arrivals: $(cat err.txt)"

# ---- spec-sim ------------------------------------------------------------------------
# npy_f32 FILE ROWS COLS VALUES...: a float32 .npy, values given as hex bit patterns.
npy_f32() {
    local file=$1 rows=$2 cols=$3
    shift 3
    npy_header "$file" '<f4' "$rows, $cols"
    for v in "$@"; do
        # shellcheck disable=SC2059 # little-endian bytes of a 32-bit pattern
        printf "\\x${v:6:2}\\x${v:4:2}\\x${v:2:2}\\x${v:0:2}" >>"$file"
    done
}
ONE=3f800000
ZERO=00000000
# Draft and target agree and put all mass on token 2 (vocab 4, k = 2): every
# draft is accepted and the first emitted token is always 2.
npy_f32 q.npy 2 4 $ZERO $ZERO $ONE $ZERO $ZERO $ZERO $ONE $ZERO
npy_f32 p.npy 3 4 $ZERO $ZERO $ONE $ZERO $ZERO $ZERO $ONE $ZERO $ZERO $ZERO $ONE $ZERO
if "$BIN" spec-sim --target p.npy --draft q.npy --trials 1000 --seed 5 --out h.npy >out.txt 2>err.txt; then
    off=$((10 + $(od -An -tu2 -j8 -N2 h.npy | tr -d ' ')))
    counts=$(od -An -tf8 -j"$off" h.npy | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
    read -r c0 c1 c2 c3 <<<"$counts"
    if [ "${c2%%.*}" = 1000 ] && [ "${c0%%.*}" = 0 ] && [ "${c1%%.*}" = 0 ] && [ "${c3%%.*}" = 0 ]; then
        ok "spec-sim: identical one-hot p and q emit token 2 in all 1000 trials (float64 histogram)"
    else bad "spec-sim histogram: '$counts'"; fi
    grep -q 'mean accepted drafts 2.0000' out.txt && ok "spec-sim: all k = 2 drafts accepted" ||
        bad "spec-sim mean accepted: $(cat out.txt)"
else bad "spec-sim failed: $(cat err.txt)"; fi

# A target row that does not sum to 1 is refused and writes no histogram.
npy_f32 pbad.npy 3 4 $ONE $ONE $ZERO $ZERO $ZERO $ZERO $ONE $ZERO $ZERO $ZERO $ONE $ZERO
rm -f hbad.npy
"$BIN" spec-sim --target pbad.npy --draft q.npy --trials 10 --out hbad.npy >out.txt 2>err.txt
if [ $? -ne 0 ] && [ ! -e hbad.npy ] && [ -s err.txt ]; then
    ok "spec-sim: a probability row summing to 2 is an error, no output file"
else bad "spec-sim bad row: $(cat out.txt err.txt)"; fi

cd / && rm -rf "$W"
finish
