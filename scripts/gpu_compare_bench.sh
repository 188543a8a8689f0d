#!/usr/bin/env bash
# Runs on the H200 (device tool), from the repo root, after scripts/gpu_check.sh has unpacked
# .gpu/ (built with BUNDLE_OLD=REV, see scripts/build_gpu_bundle.sh): this build's bench_gpu
# and the older revision's, alternating (old, new, old, new) in one command, so a slowdown
# of this build shows against the same machine and minute. Output: $OUT/compare_bench.md and
# $OUT/compare_wan.txt.
# COMPARE_JSON=1: also bench_gpu's JSON of each run ($OUT/bench_{old,new}_r{1,2}.json).
# COMPARE_KERNELS="path;path": before the timed runs, each kernel of one whole-op call of these
# bench_gpu paths (--filter) at the first shape, old and new, from Nsight Compute
# (gpu__time_duration.sum, ns) into $OUT/compare_kernels.txt.
# COMPARE_DIGEST=1: both builds print a hash of each output (bench_gpu --digest, fixed inputs);
# $OUT/compare_digest.txt then lists, per shape and implementation, whether the four runs'
# outputs were bit-identical (old = new shows a change kept every output bit; old r1 = old r2
# that the kernels are deterministic). Needs both builds to know --digest.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SHAPES=${COMPARE_SHAPES:-"1,40,40,75600,128;1,32,8,4096,128,causal;4,32,32,8192,128"}
ARGS=(--shapes "$SHAPES" --iters "${COMPARE_ITERS:-3}" --warmup "${COMPARE_WARMUP:-1}" --exclude "${COMPARE_EXCLUDE:-mma.sync,EFQ}" --decode "${COMPARE_DECODE-32768}")
[ -n "${COMPARE_CHECKS:-}" ] && ARGS+=(--checks "$COMPARE_CHECKS")
[ -n "${COMPARE_DIGEST:-}" ] && ARGS+=(--digest)
# COMPARE_WHAT: bench, wan or both (default), for device calls that carry only some binaries
WHAT=${COMPARE_WHAT:-both}
if [ "$WHAT" != wan ] && [ -n "${COMPARE_KERNELS:-}" ]; then
  IFS=';' read -ra paths <<< "$COMPARE_KERNELS"
  for which in old new; do
    bin=./.gpu/bench_gpu; [ "$which" = old ] && bin=./.gpu/bench_gpu_old
    for path in "${paths[@]}"; do
      echo "== $which / $path" >> "$OUT/compare_kernels.txt"
      # warm-up and two timed calls: the last third of the kernels is one call
      timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv "$bin" --shapes "${SHAPES%%;*}" \
        --iters 2 --warmup 1 --filter "$path" --exclude "${COMPARE_EXCLUDE:-mma.sync,EFQ}" --decode "" --checks deferred 2>/dev/null \
        | python3 -c "
import sys, csv
rows = [r for r in csv.reader(sys.stdin) if len(r) > 10 and r[-3] == 'gpu__time_duration.sum']
for r in rows[-(len(rows) // 3):]: print(r[4][:60].ljust(60), r[-1])" >> "$OUT/compare_kernels.txt"
    done
  done
fi
[ "$WHAT" = wan ] || for round in 1 2; do
  for which in old new; do
    bin=./.gpu/bench_gpu; [ "$which" = old ] && bin=./.gpu/bench_gpu_old
    json=(); [ -n "${COMPARE_JSON:-}" ] && json=(--json "$OUT/bench_${which}_r$round.json")
    echo "== round $round: $which"
    { echo "== bench_gpu round $round: $which"; timeout "${COMPARE_TIMEOUT:-240}" "$bin" "${ARGS[@]}" "${json[@]}" 2>&1 || echo "!! $which round $round exit $?"; } > "$OUT/run.txt"
    cat "$OUT/run.txt" >> "$OUT/compare_bench.md"
    grep -E "^\|" "$OUT/run.txt" | head -60
  done
done
if [ "$WHAT" != wan ] && [ -n "${COMPARE_DIGEST:-}" ]; then
python3 - "$OUT/compare_bench.md" > "$OUT/compare_digest.txt" <<'PY'
import re, sys
runs, cur = {}, None
for line in open(sys.argv[1]):
    m = re.match(r"== bench_gpu round (\d): (\w+)", line)
    if m:
        cur = runs.setdefault(f"{m.group(2)} r{m.group(1)}", {})
    elif line.startswith("digest |") and cur is not None:
        f = [x.strip() for x in line.split("|")]
        cur[(f[1], f[2], f[3])] = f[4]
names = ["old r1", "new r1", "old r2", "new r2"]
keys = sorted({k for r in runs.values() for k in r})
same = 0
print("| shape | causal | implementation | " + " | ".join(names) + " | all equal |")
print("|---|---|---|" + "---|" * (len(names) + 1))
for k in keys:
    d = [runs.get(n, {}).get(k, "-") for n in names]
    eq = len(set(d)) == 1 and d[0] != "-"
    same += eq
    print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(d) + f" | {'yes' if eq else 'NO'} |")
print(f"\n{same} of {len(keys)} outputs bit-identical in all four runs")
PY
tail -1 "$OUT/compare_digest.txt"
fi
# The Wan transformer (2 A14B blocks at 720p, exact and Fused-Softmax MXFP8): the model-level
# path (fused ops, the attention calls, the deferred checks) against the older build.
[ "$WHAT" = bench ] && { rm -f "$OUT/run.txt"; exit 0; }
WT=(--device cuda --model t2v-a14b --layers 2 --grid 21x90x160 --attn "${COMPARE_WAN_ATTN:-exact,fused-mxfp8}" --reps 3)
for round in 1 2; do
  for which in old new; do
    bin=./.gpu/wan_transformer; [ "$which" = old ] && bin=./.gpu/wan_transformer_old
    echo "== wan_transformer round $round: $which"
    { echo "== wan_transformer round $round: $which"; timeout 120 "$bin" "${WT[@]}" 2>&1; } | tee -a "$OUT/compare_wan.txt" | grep -E "forward" || echo "!! $which exit"
  done
done
rm -f "$OUT/run.txt"
