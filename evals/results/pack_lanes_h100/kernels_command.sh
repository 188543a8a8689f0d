# The second device call (per-kernel times; the first call's compare_kernels.txt did not come
# back): the loop of scripts/gpu_compare_bench.sh's COMPARE_KERNELS step, at 4k causal for
# d = 128 and d = 64, old and new twice. .gpu/ held bench_gpu and bench_gpu_old as in
# device_command.sh. A third call was to run it with KPATHS="exact bf16" KOUT=kernels_bf16.txt
# after the GPU tests, on the build that packs bf16 with 4 channels per lane again; no device
# machine could be started for it (README.md).
( cd .gpu && for f in *.xz; do [ -e "$f" ] && xz -d -f "$f"; done; chmod +x ./* )
IFS=';' read -ra KP <<< "${KPATHS:-fused-softmax u8, MXFP8 QK, FP8 V;exact bf16;exp->E4M3 P, MXFP8 QK, FP8 V}"
KF="$OUT/${KOUT:-kernels.txt}"
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
for round in 1 2; do for shape in "1,32,8,4096,128,causal" "1,32,8,4096,64,causal"; do for which in old new; do
  bin=./.gpu/bench_gpu; [ "$which" = old ] && bin=./.gpu/bench_gpu_old
  for path in "${KP[@]}"; do
    echo "== round $round / $shape / $which / $path" >> "$KF"
    # warm-up and two timed calls: the last third of the kernels is one call
    timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv "$bin" --shapes "$shape" \
      --iters 2 --warmup 1 --filter "$path" --exclude "mma.sync,staged,fp32,MXFP6,MXFP4 V" --decode "" --checks deferred 2>/dev/null \
      | python3 -c "
import sys, csv
rows = [r for r in csv.reader(sys.stdin) if len(r) > 10 and r[-3] == 'gpu__time_duration.sum']
for r in rows[-(len(rows) // 3):]: print(r[4][:60].ljust(60), r[-1])" >> "$KF"
  done
done; done; done
nvidia-smi --query-gpu=name --format=csv,noheader >> "$KF"
