#!/usr/bin/env bash
# Runs on the GPU machine (device tool) after .gpu/ is unpacked: where the wgmma attention
# kernel's warps wait. Nsight Compute on one launch of one path, with the stall reasons per
# issued instruction (the whole kernel) and per SASS instruction (the source page: which
# instruction each stall sample sat on). Clocks left alone (--clock-control none).
#   NCU_FILTER   bench_gpu's --filter (default: Fused-Softmax u8, MXFP8 Q/K, FP8 V)
#   NCU_SHAPE    the shape (default 1,40,40,32768,128: A14B's heads, a shorter sequence so
#                the replayed passes stay short; the loop is the same as at 75 600 keys)
#   NCU_TAG      file name tag (default fused_u8)
# Output in $OUT: ncu_<tag>.ncu-rep, ncu_<tag>_details.txt (sections, stall table),
# ncu_<tag>_sass.csv (per-instruction samples), ncu_<tag>_by_instruction.txt (its summary by
# scripts/ncu_sass_summary.py: shares by stall reason, by opcode, the top instructions).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FILTER=${NCU_FILTER:-"fused-softmax u8, MXFP8 QK, FP8 V"}
SHAPE=${NCU_SHAPE:-"1,40,40,32768,128"}
TAG=${NCU_TAG:-fused_u8}
timeout 300 ncu --clock-control none -k regex:attention_wgmma_kernel --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
  --section WarpStateStats --section SourceCounters --section Occupancy --section LaunchStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  --import-source no -f -o "$OUT/ncu_$TAG" \
  ./.gpu/bench_gpu --shapes "$SHAPE" --iters 1 --warmup 1 --filter "$FILTER" \
  --exclude "mma.sync,staged" --decode "" > "$OUT/ncu_${TAG}_run.txt" 2>&1
echo "ncu exit $? (log: ncu_${TAG}_run.txt)"
ncu --import "$OUT/ncu_$TAG.ncu-rep" --page details --print-details all > "$OUT/ncu_${TAG}_details.txt" 2>&1
ncu --import "$OUT/ncu_$TAG.ncu-rep" --page raw --csv \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" > "$OUT/ncu_${TAG}_stalls.csv" 2>&1
ncu --import "$OUT/ncu_$TAG.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_${TAG}_sass.csv" 2>&1
# The stall reasons, largest first (cycles a warp waits per issued instruction).
python3 - "$OUT/ncu_${TAG}_stalls.csv" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((r for r in rows if any("issue_stalled" in c for c in r)), None)
if hdr is None:
    print(open(sys.argv[1]).read()[:2000]); sys.exit(0)
i = rows.index(hdr)
vals = rows[i + 2] if len(rows) > i + 2 else rows[-1]
out = []
for h, v in zip(hdr, vals):
    if "issue_stalled" in h:
        try: out.append((float(v.replace(",", "")), h))
        except ValueError: pass
for v, h in sorted(out, reverse=True)[:14]:
    print(f"{v:8.3f}  {h.replace('smsp__average_warps_issue_stalled_', '').replace('_per_issue_active.ratio', '')}")
EOF
python3 scripts/ncu_sass_summary.py "$OUT/ncu_${TAG}_sass.csv" > "$OUT/ncu_${TAG}_by_instruction.txt" 2>&1
grep -E "Duration|Warp Cycles Per Issued|Eligible Warps|Issued Warp|Registers Per" "$OUT/ncu_${TAG}_details.txt" | head -12
