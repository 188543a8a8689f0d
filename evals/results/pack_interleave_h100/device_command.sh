#!/usr/bin/env bash
# One device command: unpack, tests, per-kernel times (old/new), ncu details of the new Q pack, A/B bench alternating.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NV=$(python3 -c "import nvidia, os, glob; print(':'.join(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'lib'))))" 2>/dev/null)
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MXATTN_REQUIRE_GPU=1
cd .gpu
for f in *.xz; do xz -d -T4 -k -f "$f"; done; chmod +x gpu bench_gpu bench_old
{
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
echo "== ./gpu wgmma"; ./gpu wgmma --test-threads=1 --nocapture 2>&1 | grep -v "identical 100.0%" | tail -30
echo "== memcheck"; compute-sanitizer --tool memcheck --error-exitcode 1 ./gpu sanitizer_small --test-threads=1 2>&1 | tail -4
echo "== initcheck"; compute-sanitizer --tool initcheck --error-exitcode 1 --print-limit 20 ./gpu sanitizer_small --test-threads=1 2>&1 | tail -4
echo "== racecheck"; compute-sanitizer --tool racecheck --error-exitcode 1 ./gpu sanitizer_small --test-threads=1 2>&1 | tail -3
} > "$OUT/tests.txt" 2>&1
SH="1,32,8,4096,128,causal;1,32,8,4096,64,causal;1,32,8,32768,128,causal"
EXC="mma.sync,staged,fp32,MXFP6,candle"
: > "$OUT/kernels.txt"
for b in bench_old bench_gpu; do
  for f in "fused-softmax u8, MXFP8 QK, FP8 V" "fused-softmax u8, MXFP4 QK, MXFP4 V" "exp->E4M3 P, MXFP8 QK, FP8 V" "exact bf16"; do
    echo "== $b / $f" >> "$OUT/kernels.txt"
    timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv ./$b --shapes "1,32,8,4096,128,causal" \
      --iters 2 --warmup 1 --filter "$f" --exclude "$EXC" --decode "" --checks deferred 2>/dev/null \
      | python3 -c "
import sys, csv
rows=[r for r in csv.reader(sys.stdin) if len(r)>10 and r[-3]=='gpu__time_duration.sum']
n=len(rows)//3
for r in rows[-n:]: print(r[4][:60].ljust(60), r[-1])" >> "$OUT/kernels.txt"
  done
done
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters"
timeout 200 ncu --clock-control none -k regex:pack_qk_direct_kernel --launch-skip 2 --launch-count 1 $S -o /tmp/q1 ./bench_gpu --shapes "1,32,8,4096,128,causal" \
  --iters 2 --warmup 1 --filter "fused-softmax u8, MXFP8 QK, FP8 V" --exclude "$EXC" --decode "" --checks deferred > /dev/null 2>&1
ncu -i /tmp/q1.ncu-rep --page details > "$OUT/ncu_qpack_details.txt" 2>&1
for rep in 1 2; do
  for b in bench_old bench_gpu; do
    echo "== $b rep $rep" >> "$OUT/ab.txt"
    ./$b --shapes "$SH" --iters 20 --warmup 3 --checks deferred --decode "" --exclude "$EXC" --json "$OUT/${b}_r$rep.json" >> "$OUT/ab.txt" 2>&1
  done
done
echo done
