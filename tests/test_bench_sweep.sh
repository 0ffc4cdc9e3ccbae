#!/usr/bin/env bash
# test_bench_sweep.sh: `flashcl bench` sweeps, --csv, --json keys and --plot SVG on tiny shapes.
#
# usage: test_bench_sweep.sh FLASHCL_BINARY TMPDIR
set -u
# shellcheck source=tests/cli_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../bench" && pwd)
cli_start test_bench_sweep "$@"
FAST=(--iters 1 --warmup 0 --heads 2 --head-dim 16)

# CSV: a header and one line per (seqlen, mask), every row validated.
"$BIN" bench "${FAST[@]}" --seqlen 17,48 --csv >out.csv 2>err.txt
status=$?
lines=$(wc -l <out.csv)
if [ $status -eq 0 ] && [ "$lines" -eq 5 ] && head -1 out.csv | grep -q '^dtype,batch,heads_q,' &&
    [ "$(grep -c ',pass,' out.csv)" -eq 4 ] && grep -q '^f16,1,2,2,17,17,16,1,pass,' out.csv; then
    ok "bench --seqlen 17,48 --csv: 4 validated rows (2 lengths x 2 masks)"
else bad "bench --csv: status $status, $(cat out.csv err.txt)"; fi

# JSON: the keys bench/compare_torch.py reads, plus gbps, for every sweep row.
"$BIN" bench "${FAST[@]}" --seqlen 17 --batch 1,2 --no-causal --json >out.json 2>err.txt
rows=$(grep -o '"seqlen_q": 17' out.json | wc -l)
keys_ok=1
for key in batch heads_q seqlen_q head_dim causal tflops gbps validated error; do
    [ "$(grep -o "\"$key\": " out.json | wc -l)" -eq 2 ] || keys_ok=0
done
if [ "$rows" -eq 2 ] && [ $keys_ok -eq 1 ] && grep -q '"batch": 2' out.json &&
    ! grep -q '"causal": true' out.json; then
    ok "bench --batch 1,2 --no-causal --json: 2 rows with the documented keys"
else bad "bench --json sweep: $(head -c 600 out.json) $(cat err.txt)"; fi

# The plot: one line per configuration (here one per dtype), axes, legend.
"$BIN" bench "${FAST[@]}" --seqlen 17,33,48 --dtype f16,f32 --no-causal --plot plot.svg >out.txt 2>err.txt
status=$?
if [ $status -eq 0 ] && head -c 4 plot.svg | grep -q '<svg' && tail -1 plot.svg | grep -q '</svg>' &&
    [ "$(grep -c '<polyline' plot.svg)" -eq 2 ] && [ "$(grep -c '<circle' plot.svg)" -eq 6 ] &&
    grep -q '>f16 B=1 H=2 D=16<' plot.svg && grep -q '>f32 B=1 H=2 D=16<' plot.svg &&
    grep -q 'TFLOP/s' plot.svg && grep -q 'sequence length' plot.svg && grep -q 'wrote plot.svg' out.txt; then
    ok "bench --plot: an SVG with 2 lines of 3 points, axis labels and a legend"
else bad "bench --plot: status $status, $(cat err.txt) $(head -c 400 plot.svg 2>/dev/null)"; fi

# bench/compare_decode.py's reading of `flashcl bench --decode`: its columns by the header's names
# (reading fields by position once took host_us for last_us and last_us for pipe_us). Its
# flashcl_rows runs a wrapper that prints the header a tiny decode bench printed here and a row
# of a distinct value a column, so each value it returns names the column it came from.
if command -v python3 >/dev/null 2>&1; then
    "$BIN" bench --decode --batch 1 --context 40 --heads 2,1 --head-dim 16 --iters 2 >decode.txt 2>err.txt
    if PYTHONDONTWRITEBYTECODE=1 python3 - "$BENCH_DIR" decode.txt <<'PY'; then
import os, sys
sys.path.insert(0, sys.argv[1])
import compare_decode
head = next(l.split() for l in open(sys.argv[2]) if "pipe_us" in l.split())
fixed = {"batch": "1", "context": "40", "splits": "3", "kernel": "decode"}
row = [fixed.get(n, "%d.5" % (100 + i)) for i, n in enumerate(head)]
with open("decode.sh", "w") as f:
    f.write("#!/bin/sh\necho '%s'\necho '%s'\n" % (" ".join(head), " ".join(row)))
os.chmod("decode.sh", 0o755)
rows = compare_decode.flashcl_rows("./decode.sh", "", [1], [40], 2, [])
col = lambda n: float(row[head.index(n)])
sys.exit(0 if rows == {(1, 40): (col("median_us"), col("min_us"), 3, col("last_us"), col("pipe_us"))} else 1)
PY
        ok "compare_decode.py reads bench --decode's median, splits, last_us and pipe_us by name"
    else bad "compare_decode.py's reading of bench --decode: $(cat decode.txt err.txt)"; fi
fi

# Usage errors.
for args in "--seqlen 0" "--seqlen 1,x" "--causal --no-causal" "--dtype f64" "--head-dim 300"; do
    # shellcheck disable=SC2086 # the arguments are meant to split
    "$BIN" bench $args >out.txt 2>&1
    [ $? -eq 2 ] && ok "bench $args is a usage error" || bad "bench $args: $(head -3 out.txt)"
done
[ ! -e plot.svg.tmp.* ] 2>/dev/null || bad "a temporary SVG was left behind"

cd / && rm -rf "$W"
finish
