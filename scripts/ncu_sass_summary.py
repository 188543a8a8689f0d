#!/usr/bin/env python3
"""Where a kernel's warps wait, per instruction: reads the CSV of `ncu --import R --page source
--csv --print-source sass` (scripts/gpu_ncu_stalls.sh writes it) and prints the share of all
stall samples per stall reason, per opcode (beside the opcode's share of executed
instructions), and the instructions holding the most samples of each large reason, by their
offset in the kernel (branch targets in the listing are absolute addresses)."""
import collections
import csv
import re
import sys


def num(row, ix, key):
    try:
        return float(row[ix[key]].replace(",", ""))
    except (KeyError, ValueError):
        return 0.0


def main(path):
    rows = list(csv.reader(open(path)))
    hdr = next(r for r in rows if "Address" in r and "Source" in r)
    data = rows[rows.index(hdr) + 1:]
    ix = {h: i for i, h in enumerate(hdr)}
    base = int(data[0][ix["Address"]], 16)  # offsets below are from the kernel's first instruction
    samples = "Warp Stall Sampling (All Samples)"
    total = sum(num(r, ix, samples) for r in data)
    executed = sum(num(r, ix, "Instructions Executed") for r in data)
    print(f"{len(data)} instructions, {total:.0f} stall samples, {executed:.3e} warp instructions executed")
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    by_reason = {k: sum(num(r, ix, k) for r in data) for k in reasons}
    print("\nshare of samples by reason")
    for k, v in sorted(by_reason.items(), key=lambda x: -x[1])[:12]:
        print(f"  {k:22s} {v / total:6.3f}")
    by_op, ex_op = collections.Counter(), collections.Counter()
    for r in data:
        op = re.sub(r"^@!?U?P\w+\s+", "", r[ix["Source"]].strip()).split(" ")[0]
        by_op[op] += num(r, ix, samples)
        ex_op[op] += num(r, ix, "Instructions Executed")
    print("\nshare of samples by opcode (share of executed instructions)")
    for op, v in by_op.most_common(15):
        print(f"  {op:30s} {v / total:6.3f} ({ex_op[op] / executed:.3f})")
    for k in sorted(by_reason, key=lambda x: -by_reason[x])[:6]:
        if k == "stall_selected":
            continue
        print(f"\ninstructions with the most {k} samples (share of all samples)")
        for r in sorted(data, key=lambda r: -num(r, ix, k))[:5]:
            off = int(r[ix["Address"]], 16) - base
            print(f"  {num(r, ix, k) / total:6.3f}  +{off:#07x}  {r[ix['Source']].strip()[:70]}")


if __name__ == "__main__":
    main(sys.argv[1])
