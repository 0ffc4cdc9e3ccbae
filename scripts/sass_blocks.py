#!/usr/bin/env python3
"""sass_blocks.py: a kernel's SASS (cuobjdump -sass) cut at its branches and votes, with the
instruction mix of each piece, to count the instructions on one path through a loop.

    sass_blocks.py FILE.sass [FROM TO]     (hex addresses; default: the largest loop holding a
                                            warpgroup MMA, QGMMA/HGMMA, or an HMMA)

Each line is one straight run: its address range, its instruction count and its commonest
opcodes, then the branch or vote that ends it. Which way a path goes at each branch is for the
reader (the kernel's source says which side a full, unmasked tile takes); docs/perf-notes-fp8.md
adds the runs of such a path. No GPU needed: the SASS comes from ptxas's cubin.
"""
import collections
import re
import sys

INSTR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BACK = re.compile(r"BRA(?:\.\S+)? (?:\S+ )?(0x[0-9a-f]+)")  # BRA 0x.., BRA.U !UP0, 0x..


def load(path):
    with open(path) as f:
        return [(int(m.group(1), 16), m.group(2)) for m in map(INSTR.match, f) if m]


def opcode(text):
    words = text.split()
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def largest_mma_loop(ins):
    """The widest backward branch's range that holds a tensor-core instruction."""
    loops = []
    for addr, text in ins:
        m = BACK.search(text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    mma = [a for a, t in ins if opcode(t) in ("QGMMA", "HGMMA", "HMMA")]
    held = [(b, e) for b, e in loops if any(b <= a <= e for a in mma)]
    if not held:
        sys.exit("no loop holding a matrix instruction: give FROM and TO")
    return max(held, key=lambda r: r[1] - r[0])


def main():
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    ins = load(sys.argv[1])
    lo, hi = (int(sys.argv[2], 16), int(sys.argv[3], 16)) if len(sys.argv) == 4 else largest_mma_loop(ins)
    print(f"{sys.argv[1]}: {lo:#x}..{hi:#x}")
    last = max(a for a, _ in ins if lo <= a <= hi)  # TO need not be an instruction's address
    start, mix = lo, collections.Counter()
    for addr, text in ins:
        if not lo <= addr <= hi:
            continue
        mix[opcode(text)] += 1
        if "BRA" in text or "VOTE" in text or addr >= last:
            top = ", ".join(f"{k} {v}" for k, v in mix.most_common(8))
            print(f"{start:#07x}..{addr:#07x} {sum(mix.values()):5d}: {top}\n{'':20}{text}")
            start, mix = addr + 16, collections.Counter()


if __name__ == "__main__":
    main()
