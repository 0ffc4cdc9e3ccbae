#!/usr/bin/env bash
# test_cp_cli.sh: `flashcl attention --context-parallel` (forward, --backward) and `bench --context-parallel` under mpirun.
#
# usage: test_cp_cli.sh FLASHCL_BINARY TMPDIR MPIEXEC [MPIEXEC FLAGS...]
#
# Random float32 inputs (python3's own PRNG, written as .npy); the single-device
# CLI's outputs are the reference: the context-parallel ones must equal them
# within float32 rounding, NaN never passing.
set -u
# shellcheck source=tests/cli_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"
BIN=${1:?usage: test_cp_cli.sh FLASHCL_BINARY TMPDIR MPIEXEC [FLAGS...]}
TMP=${2:?}
shift 2
MPI=("$@")
mkdir -p "$TMP" || exit 1
W=$(mktemp -d "$TMP/test_cp_cli.XXXXXX") || exit 1
cd "$W" || exit 1

# rand_npy FILE B N H D SEED: float32 N(0,1) of shape (B, N, H, D).
rand_npy() {
    python3 - "$@" <<'PY'
import random, struct, sys
path, b, n, h, d, seed = sys.argv[1], *map(int, sys.argv[2:])
rng = random.Random(seed)
count = b * n * h * d
head = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d, %d), }" % (b, n, h, d)
pad = (64 - (10 + len(head) + 1) % 64) % 64
head += ' ' * pad + '\n'
with open(path, 'wb') as f:
    f.write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(head)) + head.encode())
    f.write(struct.pack('<%df' % count, *[rng.gauss(0, 1) for _ in range(count)]))
PY
}
# max_diff A B: max |a - b| over two .npy files of float32 ("inf" on NaN or a shape mismatch).
max_diff() {
    python3 - "$1" "$2" <<'PY'
import math, struct, sys
def load(p):
    raw = open(p, 'rb').read()
    hl = struct.unpack('<H', raw[8:10])[0]
    data = raw[10 + hl:]
    return raw[10:10 + hl], struct.unpack('<%df' % (len(data) // 4), data)
ha, a = load(sys.argv[1]); hb, b = load(sys.argv[2])
m = 0.0 if ha == hb and len(a) == len(b) else math.inf
for x, y in zip(a, b):
    if math.isinf(x) and x == y:
        continue
    e = abs(x - y)
    m = e if not e <= m else m
print(m)
PY
}
within() { python3 -c "import sys; sys.exit(0 if float('$1') <= $2 else 1)"; }

# Nq = 13, Nk = 21: neither divides into 2P = 4 chunks; GQA 4/2 heads.
rand_npy q.npy 1 13 4 8 1
rand_npy k.npy 1 21 2 8 2
rand_npy v.npy 1 21 2 8 3
rand_npy do.npy 1 13 4 8 4
for mask in "" "--causal"; do
    name="forward ${mask:-full}"
    rm -f ref.npy ref_lse.npy cp.npy cp_lse.npy
    "$BIN" attention --q q.npy --k k.npy --v v.npy --out ref.npy --lse ref_lse.npy $mask >/dev/null &&
        "${MPI[@]}" -np 2 "$BIN" attention --context-parallel --q q.npy --k k.npy --v v.npy --out cp.npy \
            --lse cp_lse.npy $mask >log 2>&1
    rc=$?
    e=$(max_diff cp.npy ref.npy 2>/dev/null || echo inf)
    l=$(max_diff cp_lse.npy ref_lse.npy 2>/dev/null || echo inf)
    if [ $rc -eq 0 ] && within "$e" 1e-5 && within "$l" 1e-5; then ok "$name (out $e, lse $l)"; else bad "$name (rc $rc, out $e, lse $l)"; cat log; fi

    name="backward ${mask:-full}"
    rm -f dq*.npy dk*.npy dv*.npy
    "$BIN" attention --backward --q q.npy --k k.npy --v v.npy --dout do.npy --dq dq_ref.npy --dk dk_ref.npy \
        --dv dv_ref.npy $mask >/dev/null &&
        "${MPI[@]}" -np 2 "$BIN" attention --context-parallel --backward --q q.npy --k k.npy --v v.npy --dout do.npy \
            --dq dq.npy --dk dk.npy --dv dv.npy $mask >log 2>&1
    rc=$?
    good=$rc
    msg=""
    for t in dq dk dv; do
        e=$(max_diff $t.npy ${t}_ref.npy 2>/dev/null || echo inf)
        msg="$msg $t $e"
        within "$e" 1e-5 || good=1
    done
    if [ $good -eq 0 ]; then ok "$name ($msg)"; else bad "$name (rc $rc,$msg)"; cat log; fi
done

# Mismatched inputs are refused before any rank computes: a usage error on every rank, no output.
rm -f cp.npy
"${MPI[@]}" -np 2 "$BIN" attention --context-parallel --q q.npy --k q.npy --v v.npy --out cp.npy >log 2>&1
rc=$?
if [ $rc -ne 0 ] && [ ! -e cp.npy ] && grep -q "disagree" log; then ok "mismatched inputs refused"; else bad "mismatched inputs (rc $rc)"; cat log; fi

# The bench: one tiny shape, validated against the single-device forward, its columns present.
"${MPI[@]}" -np 2 "$BIN" bench --context-parallel --shape 1,2,2,40,40,16 --iters 2 --warmup 1 >log 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "TFLOP/s" log && grep -q "comm hidden" log && grep -q "scaling eff" log &&
    [ "$(grep -c ' ok$' log)" -eq 2 ]; then
    ok "bench --context-parallel"
else
    bad "bench --context-parallel (rc $rc)"
    cat log
fi
"${MPI[@]}" -np 2 "$BIN" bench --context-parallel --backward --shape 1,2,1,30,40,16 --iters 2 --warmup 1 >log 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "backward median" log && [ "$(grep -c ' ok$' log)" -eq 2 ]; then
    ok "bench --context-parallel --backward"
else
    bad "bench --context-parallel --backward (rc $rc)"
    cat log
fi
finish
