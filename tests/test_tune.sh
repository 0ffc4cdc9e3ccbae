#!/usr/bin/env bash
# test_tune.sh: `flashcl tune` end to end on a tiny problem: it writes a valid entry that the library then uses.
#
# usage: test_tune.sh FLASHCL_BINARY TMPDIR
set -u
# shellcheck source=tests/cli_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"
cli_start test_tune "$@"
# The class `flashcl devices` shows first: f16, D=64, non-causal prefill.
SMALL=(--dtype f16 --head-dim 64 --seqlen 64 --heads 2 --iters 2 --warmup 0)

if ! "$BIN" devices >/dev/null 2>&1 || "$BIN" devices | grep -q 'No OpenCL platform'; then
    echo "no OpenCL device: nothing to tune"
    exit 0
fi

# --dry-run: lists candidates, runs and writes nothing.
if "$BIN" tune "${SMALL[@]}" --dry-run --output dry.json >out.txt 2>&1 && grep -q '(now)' out.txt &&
    [ ! -e dry.json ]; then
    ok "tune --dry-run lists the candidates and writes nothing"
else bad "tune --dry-run: $(tail -5 out.txt)"; fi
"$BIN" tune --variant warp-speed >out.txt 2>&1
[ $? -eq 2 ] && ok "unknown --variant is a usage error" || bad "unknown --variant: $(cat out.txt)"

# A tiny budget: the current parameters plus whatever fits in 2 s.
export FLASHCL_TUNING_FILE="$W/tuning.json"
if "$BIN" tune "${SMALL[@]}" --budget 2 >out.txt 2>err.txt && grep -q '^winner:' out.txt &&
    grep -q '"flashcl_tuning": 1' tuning.json; then
    ok "tune with a 2 s budget writes the tuning file"
else bad "tune: $(tail -5 out.txt) $(tail -5 err.txt)"; fi
# The winner line's speedup is the ratio of the two times it prints (timed the same way).
winner=$(grep '^winner:' out.txt | head -1)
if [ -z "$winner" ] || echo "$winner" | grep -q 'current parameters failed' ||
    echo "$winner" | awk '{
        match($0, /[0-9.]+ ms vs [0-9.]+ ms now/); split(substr($0, RSTART, RLENGTH), t, " ");
        rest = substr($0, RSTART + RLENGTH); match(rest, /: [0-9.]+x/);
        r = substr(rest, RSTART + 2, RLENGTH - 3) + 0;
        # The times are printed to 0.001 ms: the ratio they allow, widened by that rounding,
        # then by the ratio'"'"'s own two decimals.
        lo = (t[4] - 0.0005) / (t[1] + 0.0005); hi = (t[4] + 0.0005) / (t[1] - 0.0005);
        exit !(t[1] > 0.0005 && r >= lo - 0.006 && r <= hi + 0.006) }'; then
    ok "the winner's speedup is the ratio of the times it names"
else bad "winner line's speedup does not match its times: $winner"; fi
grep -q 'ok (now)' out.txt && ok "the current parameters are validated and timed first" ||
    bad "no baseline row: $(cat out.txt)"
# The library (a fresh process) reads the entry back for that class only.
"$BIN" devices >dev.txt 2>&1
if grep -E '^ *f16 +64 +none .*tuned: '"$W"'/tuning.json' dev.txt >/dev/null &&
    grep -E '^ *f16 +128 +none ' dev.txt | grep -vq 'tuned:'; then
    ok "flashcl devices: the tuned class reports 'tuned: <file>', D=128 does not"
else bad "devices after tune: $(grep -E 'f16|tuning' dev.txt)"; fi

# Tuning again replaces the entry rather than adding one.
"$BIN" tune "${SMALL[@]}" --budget 1 >/dev/null 2>&1
[ "$(grep -c '"device"' tuning.json)" -eq 1 ] && ok "a second run replaces the entry" ||
    bad "entries after two runs: $(cat tuning.json)"

# An unreadable tuning file is neither used nor overwritten.
printf '{"flashcl_tuning": 1, "entries": [' >broken.json
FLASHCL_TUNING_FILE="$W/broken.json" "$BIN" tune "${SMALL[@]}" --budget 1 >out.txt 2>&1
if [ $? -eq 1 ] && grep -q 'fix or remove' out.txt && [ "$(cat broken.json)" = '{"flashcl_tuning": 1, "entries": [' ]; then
    ok "tune refuses to overwrite a broken tuning file"
else bad "broken tuning file: $(tail -3 out.txt)"; fi

# Ctrl-C after the first candidate: still writes the best so far.
rm -f int.json
# (A longer problem and many timed runs, so that the run is still going when the signal comes.)
# A fresh progress file: an old one's "[1/" lines would send the signal
# before the tuner has installed its handler (and a background job ignores
# SIGINT until then).
rm -f int_err.txt
"$BIN" tune "${SMALL[@]}" --seqlen 256 --iters 200 --budget 600 --output int.json >out.txt 2>int_err.txt &
pid=$!
# Progress lines are printed as each candidate finishes: after "[1/" the
# current parameters have been measured and there is a best to keep.
for _ in $(seq 1 600); do grep -q '\[1/' int_err.txt 2>/dev/null && break; sleep 0.1; done
kill -INT "$pid"
wait "$pid"
status=$?
if [ $status -eq 0 ] && grep -q 'interrupted' out.txt && grep -q '"block_m"' int.json; then
    ok "Ctrl-C keeps the best so far and writes it"
else bad "after SIGINT: status $status, $(tail -3 out.txt) $(tail -2 int_err.txt)"; fi

cd / && rm -rf "$W"
finish
