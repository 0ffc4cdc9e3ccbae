#!/usr/bin/env python3
# wgmma_inflight.py SASS... | --self-test: for every HGMMA or QGMMA (warpgroup MMA, 16- or 8-bit) in
# a `cuobjdump -sass` listing, the registers it reads (A from registers: R..R+3; none when A is a
# descriptor) and the accumulator it writes (64xN f32: N/2 registers a thread), then every
# instruction between it and the next WARPGROUP.DEPBAR (the wait) that writes one of them: while
# the wgmma is in flight such a write races with it (the PTX ISA leaves the result undefined).
# Destinations are read from the first operand with the width its opcode gives (.64, .128, .WIDE,
# double precision: 2 or 4; LDSM: the matrices it loads, .4/.2/.X4/.X2); stores, barriers, branches
# and TMA issue have none. Prints each hazard, then one line per file: its count and the MMA count.
# Exit status 1 when any file has a hazard or no warpgroup MMA at all (nothing checked: a failed
# cuobjdump, say). --self-test runs it on a planted listing (an LDSM and an IMAD.WIDE in flight).
# It does not see the other fault class, registers read only by wgmma not kept live around a loop
# (scripts/wgmma_a_regs.py checks that one).
import re
import sys

NO_DEST = ('ST', 'HGMMA', 'QGMMA', 'IGMMA', 'RED', 'ATOM', 'BAR', 'WARPGROUP', 'BRA', 'EXIT', 'SYNCS', 'UTMA', 'LDGDEPBAR',
           'DEPBAR', 'RET', 'CALL', 'NOP', 'FENCE', 'MEMBAR', 'ERRBAR', 'CCTL')


def listing(path):
    out = []
    for line in open(path).read().splitlines():
        m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?);', line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def opcode_and_operands(text):
    words = text.split(None, 1)
    if words and words[0].startswith('@'):  # a predicate guard
        words = words[1].split(None, 1)
    return words[0], (words[1] if len(words) > 1 else '')


def destinations(text):
    op, rest = opcode_and_operands(text)
    m = re.match(r'R(\d+)', rest)
    if not m or op.startswith(NO_DEST):
        return set()
    n = 4 if '.128' in op else 2 if '.64' in op or '.WIDE' in op or '.F64' in op or op.startswith(('DADD', 'DMUL', 'DFMA')) else 1
    if op.startswith('LDSM'):  # LDSM.16.M88.4 / .MT88.2 (older listings: .X4): the matrices it loads
        tail = op.upper().split('.')[-1]
        n = 4 if tail in ('4', 'X4') else 2 if tail in ('2', 'X2') else 1
    return set(range(int(m.group(1)), int(m.group(1)) + n))


def check(path):
    ins, hazards, count = listing(path), 0, 0
    for i, (at, text) in enumerate(ins):
        op, rest = opcode_and_operands(text)
        if not op.startswith(('HGMMA', 'QGMMA', 'IGMMA')):
            continue
        count += 1
        ops = [o.strip() for o in rest.split(',')]
        watched = set()
        a = re.match(r'R(\d+)', ops[1]) if len(ops) > 1 else None
        if a:
            watched |= set(range(int(a.group(1)), int(a.group(1)) + 4))
        acc, shape = re.match(r'R(\d+)', ops[0]), re.search(r'\.64x(\d+)x', op)
        if acc and shape:
            watched |= set(range(int(acc.group(1)), int(acc.group(1)) + int(shape.group(1)) // 2))
        for at2, text2 in ins[i + 1:]:
            if 'WARPGROUP.DEPBAR' in text2:
                break
            hit = destinations(text2) & watched
            if hit:
                hazards += 1
                print(f"{path}: 0x{at2:x} {text2}: writes R{sorted(hit)} of the MMA at 0x{at:x} in flight")
    print(f"{path}: {hazards} in-flight writes, {count} warpgroup MMAs")
    if count == 0:  # nothing was checked: not a listing of a wgmma kernel (or cuobjdump failed)
        print(f"{path}: no warpgroup MMA found: nothing checked")
        return 1
    return hazards


SELF_TEST = """
        /*0010*/                   HGMMA.64x16x16.F32 R160, R12, gdesc[UR20], RZ, !UPT ;
        /*0020*/                   LDSM.16.M88.4 R10, [R3] ;
        /*0030*/                   IMAD.WIDE R166, R1, R2, R4 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/                   LDSM.16.M88.4 R12, [R3] ;
"""


def self_test():
    # The LDSM writes R10..R13 (R12, R13 of the A operand), the IMAD.WIDE R166..R167 (the
    # accumulator's last two): two hazards; the LDSM after the wait is none.
    import tempfile
    with tempfile.NamedTemporaryFile('w', suffix='.sass', delete=False) as f:
        f.write(SELF_TEST)
    found = check(f.name)
    return 0 if found == 2 else 1


if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit("usage: wgmma_inflight.py SASS... | --self-test")
    if sys.argv[1] == '--self-test':
        sys.exit(self_test())
    sys.exit(1 if sum(check(p) for p in sys.argv[1:]) else 0)
