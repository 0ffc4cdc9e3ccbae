#!/usr/bin/env bash
# test_backward_cli.sh: `flashcl attention --backward` and `flashcl bench --backward` end to end.
#
# usage: test_backward_cli.sh FLASHCL_BINARY TMPDIR
#
# Constant inputs make the gradients known: with every q and k element 0.5,
# all visible scores are equal and P is uniform, 1/n_i over row i's n_i keys;
# with dout constant, dP_j = dout . v_j is the same for every key and equals
# D_i = dout . out_i, so dS = 0: dq = dk = 0 (up to float rounding), and
# dv_j = sum over the rows i that see key j of dout / n_i.
set -u
# shellcheck source=tests/cli_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"
cli_start test_backward_cli "$@"

# const_npy FILE SHAPE COUNT BYTES: float32, COUNT copies of BYTES.
const_npy() {
    local i
    npy_header "$1" '<f4' "$2"
    # shellcheck disable=SC2059
    for ((i = 0; i < $3; i++)); do printf "$4"; done >>"$1"
}
# values FILE: the float32 data, one per line.
values() {
    od -An -v -tf4 -j $((10 + $(od -An -tu2 -j8 -N2 "$1" | tr -d ' '))) "$1" | tr -s ' ' '\n' | grep -v '^$'
}

HALF='\x00\x00\x00\x3f'                                                  # 0.5
VROW='\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x00\xbf\x00\x00\x80\x3e' # 1 2 -0.5 0.25
# (batch 1, seqlen 3, heads 1, head_dim 4)
const_npy q.npy '1, 3, 1, 4' 12 "$HALF"
const_npy k.npy '1, 3, 1, 4' 12 "$HALF"
const_npy v.npy '1, 3, 1, 4' 3 "$VROW"
const_npy do.npy '1, 3, 1, 4' 12 "$HALF"

# expect_grads NAME DV0 DV1 DV2: dq, dk ~ 0 and dv row j ~ DVj (every column).
expect_grads() {
    local name=$1
    if values dq.npy | awk '{ if ($1 > 1e-5 || $1 < -1e-5) bad = 1 } END { exit bad || NR != 12 }' &&
        values dk.npy | awk '{ if ($1 > 1e-5 || $1 < -1e-5) bad = 1 } END { exit bad || NR != 12 }' &&
        values dv.npy | awk -v a="$2" -v b="$3" -v c="$4" \
            'BEGIN { w[0] = a; w[1] = b; w[2] = c } { e = $1 - w[int((NR - 1) / 4)]; if (e > 1e-5 || e < -1e-5) bad = 1 }
             END { exit bad || NR != 12 }'; then
        ok "$name"
    else
        bad "$name"
    fi
}

if "$BIN" attention --backward --q q.npy --k k.npy --v v.npy --dout do.npy --dq dq.npy --dk dk.npy --dv dv.npy >/dev/null; then
    expect_grads "full: dq = dk = 0, dv = 3 * 0.5/3" 0.5 0.5 0.5
else
    bad "full: attention --backward ran"
fi
if "$BIN" attention --backward --causal --q q.npy --k k.npy --v v.npy --dout do.npy --dq dq.npy --dk dk.npy --dv dv.npy >/dev/null; then
    expect_grads "causal: dv_j = 0.5 * sum_{i>=j} 1/(i+1)" 0.9166667 0.4166667 0.1666667
else
    bad "causal: attention --backward ran"
fi

# The forward's out and lse from files give the same bits as running it inside
# (deterministic mode, so dq cannot differ by summation order).
"$BIN" attention --q q.npy --k k.npy --v v.npy --out o.npy --lse lse.npy --causal >/dev/null &&
    "$BIN" attention --backward --deterministic --causal --q q.npy --k k.npy --v v.npy --dout do.npy \
        --dq dq1.npy --dk dk1.npy --dv dv1.npy >/dev/null &&
    "$BIN" attention --backward --deterministic --causal --q q.npy --k k.npy --v v.npy --dout do.npy \
        --o o.npy --lse lse.npy --dq dq2.npy --dk dk2.npy --dv dv2.npy >/dev/null &&
    cmp -s dq1.npy dq2.npy && cmp -s dk1.npy dk2.npy && cmp -s dv1.npy dv2.npy &&
    ok "--o/--lse from files equal the forward run inside" || bad "--o/--lse from files equal the forward run inside"

# Usage errors, and no output left behind.
rm -f dq.npy dk.npy dv.npy
"$BIN" attention --backward --q q.npy --k k.npy --v v.npy --dout do.npy --dq dq.npy --dk dk.npy 2>/dev/null
[ $? -eq 2 ] && ok "missing --dv is a usage error" || bad "missing --dv is a usage error"
"$BIN" attention --backward --q q.npy --k k.npy --v v.npy --dout do.npy --o o.npy --dq dq.npy --dk dk.npy --dv dv.npy 2>/dev/null
[ $? -eq 2 ] && ok "--o without --lse is a usage error" || bad "--o without --lse is a usage error"
# An output that is an input by another name (./q.npy, a symlink) is refused
# by file identity, and the input is left as it was.
cp q.npy qsame.npy
ln -sf qsame.npy qsym.npy
sum_before=$(cksum <qsame.npy)
"$BIN" attention --backward --q qsame.npy --k k.npy --v v.npy --dout do.npy --dq ./qsame.npy --dk dk.npy --dv dv.npy 2>err.txt
rc=$?
[ $rc -eq 2 ] && grep -q "same file" err.txt && ok "--dq ./q.npy is refused (same file)" ||
    bad "--dq ./q.npy is refused (same file) (rc $rc: $(head -c 200 err.txt))"
"$BIN" attention --backward --q qsame.npy --k k.npy --v v.npy --dout do.npy --dq dq.npy --dk dk.npy --dv qsym.npy 2>/dev/null
rc=$?
[ $rc -eq 2 ] && ok "--dv a symlink to --q is refused" || bad "--dv a symlink to --q is refused (rc $rc)"
[ "$(cksum <qsame.npy)" = "$sum_before" ] && [ ! -e dq.npy ] && [ ! -e dk.npy ] &&
    ok "refused runs leave q and write nothing" || bad "refused runs leave q and write nothing"
rm -f qsame.npy qsym.npy
const_npy short.npy '1, 2, 1, 4' 8 "$HALF"
"$BIN" attention --backward --q q.npy --k k.npy --v v.npy --dout short.npy --dq dq.npy --dk dk.npy --dv dv.npy 2>/dev/null
rc=$?
[ $rc -eq 1 ] && [ ! -e dq.npy ] && [ ! -e dk.npy ] && [ ! -e dv.npy ] &&
    ok "dout of the wrong shape fails, writes nothing" || bad "dout of the wrong shape fails, writes nothing (rc $rc)"

# bench --backward validates its first run.
if "$BIN" bench --backward --shape 1,2,1,40,33,16 --iters 1 --warmup 0 --dtype f32 | grep -q ' valid'; then
    ok "bench --backward validates"
else
    bad "bench --backward validates"
fi

# FLASHCL_PROFILE=1: the log names each backward kernel's time.
if FLASHCL_PROFILE=1 FLASHCL_LOG=1 "$BIN" bench --backward --shape 1,2,1,40,33,16 --iters 1 --warmup 0 --dtype f32 \
    2>&1 >/dev/null | grep -Eq 'backward kernels: D_i pre-pass [0-9.]+ us, dK/dV [0-9.]+ us'; then
    ok "FLASHCL_PROFILE=1 logs the backward kernels' times"
else
    bad "FLASHCL_PROFILE=1 logs the backward kernels' times"
fi

# bench --backward --json: one JSON document on stdout (no table), a row per mask
# with the fields bench/compare_backward.py reads. Checked with python3's json
# module where there is one (CI need not have it), else key by key with grep.
if "$BIN" bench --backward --json --shape 1,2,1,40,33,16 --iters 2 --warmup 0 --dtype f32 >bj.json 2>bj.err; then
    ok "bench --backward --json ran"
else
    bad "bench --backward --json ran: $(cat bj.err)"
fi
keys_ok=1
for key in '"device": "' '"rows": \[' '"batch": 1,' '"heads_q": 2,' '"heads_k": 1,' '"seqlen_q": 40,' \
    '"seqlen_k": 33,' '"head_dim": 16,' '"dtype": "f32"' '"causal": false' '"causal": true' \
    '"deterministic": false' '"validated": "valid"' '"median_ms": [0-9]' '"min_ms": [0-9]' '"tflops": [0-9]' \
    '"error": null'; do
    grep -q "$key" bj.json || { keys_ok=0; echo "missing: $key"; }
done
if [ "$keys_ok" = 1 ] && [ "$(head -c 1 bj.json)" = '{' ] && [ "$(grep -c '"validated": "valid"' bj.json)" = 2 ] &&
    ! grep -q 'median ms' bj.json; then
    ok "bench --backward --json: the expected keys, two valid rows, no table"
else
    bad "bench --backward --json output: $(head -c 600 bj.json)"
fi
if command -v python3 >/dev/null 2>&1; then
    if python3 -c '
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["rows"]
assert isinstance(doc["device"], str) and len(rows) == 2, doc
for r, causal in zip(rows, (False, True)):
    assert (r["batch"], r["heads_q"], r["heads_k"], r["seqlen_q"], r["seqlen_k"], r["head_dim"]) == (1, 2, 1, 40, 33, 16), r
    assert r["dtype"] == "f32" and r["causal"] is causal and r["deterministic"] is False, r
    assert r["validated"] == "valid" and r["error"] is None, r
    assert 0 < r["min_ms"] <= r["median_ms"] and r["tflops"] > 0, r
' bj.json; then
        ok "bench --backward --json parses (python3 json) with the expected values"
    else
        bad "bench --backward --json does not parse as expected: $(head -c 600 bj.json)"
    fi
fi
# A row that fails is a row with an error (and a message on stderr), still one document; exit 1.
"$BIN" bench --backward --json --shape 1,2,8,300 --iters 1 --warmup 0 --causal >bj.json 2>bj.err
rc=$?
if [ $rc -eq 1 ] && [ "$(head -c 1 bj.json)" = '{' ] && grep -q '"error": "error: ' bj.json &&
    grep -q '"median_ms": null' bj.json && grep -q '"validated": "not validated"' bj.json && [ -s bj.err ] &&
    tail -n 1 bj.json | grep -q '^]}$'; then
    ok "bench --backward --json: a failed row has error set, exit 1"
else
    bad "bench --backward --json failed row (rc $rc): $(head -c 600 bj.json)"
fi

[ "$failures" -eq 0 ] && rm -rf "$W"
exit $((failures > 0))
