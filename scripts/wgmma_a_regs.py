#!/usr/bin/env python3
# wgmma_a_regs.py SASS: issue 36's check on a flash_fwd_sm90 cubin's SASS (cuobjdump -sass):
# the registers the S = Q K^T HGMMA chain (A from registers, no tnspB) reads inside the
# innermost loop around it, the P V chain's A registers, and every instruction in that loop
# that writes the S chain's A registers. With Q held in registers (Q_PER_TILE=0) any such
# write is the fault: the next tile's S then reads whatever was written (P), not Q. With
# Q_PER_TILE=1 the LDSM reloads at the loop's top are the expected writes; so are LDL reloads of
# fragments ptxas spilled (a capped build). The last line is the verdict: the writes, anywhere in
# the loop, of A registers that no LDSM or LDL reloads between the loop's top and the S chain (0
# where Q is held safely or reloaded every tile). The backward's score chains (RS, no tnspB) are
# read the same way (flash_bwd_sm90.cl's OWN_REGS: K and V, or Q and dO, held).
import re, sys
lines = open(sys.argv[1]).read().splitlines()
ins = []
for l in lines:
    m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
    if m: ins.append((int(m.group(1), 16), m.group(2).strip()))
def regs(op):
    m = re.match(r'R(\d+)', op); return int(m.group(1)) if m else None
hg = [(a, t) for a, t in ins if t.startswith('HGMMA')]
# loops: backward branches
loops = []
for a, t in ins:
    m = re.search(r'BRA (0x[0-9a-f]+)', t)
    if m and int(m.group(1), 16) < a: loops.append((int(m.group(1), 16), a))
s_hg = [(a, t) for a, t in hg if 'tnspB' not in t]
pv_hg = [(a, t) for a, t in hg if 'tnspB' in t]
lo, hi = None, None
for (b, e) in loops:
    if any(b <= a <= e for a, _ in s_hg) and (lo is None or e - b < hi - lo): lo, hi = b, e
print(f"loop 0x{lo:x}..0x{hi:x}" if lo is not None else "no loop around S")
qa = set()
for a, t in s_hg:
    if lo is not None and not (lo <= a <= hi): continue
    r = regs(t.split(',')[1].strip())  # None: A from shared memory (a descriptor)
    if r is not None: qa |= set(range(r, r + 4))
pa = set()
for a, t in pv_hg:
    r = regs(t.split(',')[1].strip())
    if r is not None: pa |= set(range(r, r + 4))
print("S A regs:", sorted(qa)); print("PV A regs:", sorted(pa)); print("overlap:", sorted(qa & pa))
def width(mn):
    # registers an instruction's destination spans: 128-bit loads and 4-matrix LDSM four, 64-bit two
    if mn.startswith('LDSM'):
        return 4 if '.4' in mn else 2 if '.2' in mn else 1
    if '.128' in mn: return 4
    if '.64' in mn or 'WIDE' in mn or mn.startswith('CS2R'): return 2
    return 1
s_first = min((a for a, _ in s_hg if lo is not None and lo <= a <= hi), default=None)
reloaded = set()
writes = []  # (address, registers) of every write of an S-chain A register in the loop
n = faults = 0
for a, t in ins:
    if lo is None or not (lo <= a <= hi): continue
    op = re.sub(r'^@!?U?P\w+\s+', '', t)
    parts = op.split(None, 1)
    if len(parts) < 2: continue
    mn, rest = parts
    if mn.startswith(('ST', 'HGMMA', 'BRA', 'BAR', 'LDGSTS', 'ISETP', 'FSETP', 'WARPGROUP')): continue
    d = regs(rest.split(',')[0].strip())
    if d is None: continue
    w = set(range(d, d + width(mn)))
    if w & qa:
        n += 1
        if mn.startswith(('LDSM', 'LDL')) and s_first is not None and a < s_first:
            reloaded |= w
        if n <= 8 or mn.startswith('LDSM'): print(f"  0x{a:04x} {t}")
        writes.append((a, w))
print("writes of S A regs inside loop:", n)
faults = sum(1 for a, w in writes if w & (qa - reloaded))
print(f"verdict: {faults} writes in the loop of S-chain A registers that no LDSM or LDL reloads before the S chain"
      + (" (the Q-register fault)" if faults else ""))
