# The device command of this folder (one call, NVIDIA H100 80GB HBM3). .gpu/ held, xz-compressed
# and stripped: gpu (the GPU test binary) and bench_gpu with the one-copy upload, bench_gpu_old
# of 2d91af9 (main before it), both built here with
#   source .venv-cuda/env.sh; MXATTN_CUDA_ARCHS=90a CARGO_TARGET_DIR=target/cuda \
#     cargo build --release --features cuda --example bench_gpu --tests
export OUT; GPU_CHECK_ONLY='^GPU tests$|memcheck|racecheck|initcheck' bash scripts/gpu_check.sh > $OUT/check.txt 2>&1; echo "check rc=$?"
grep -E "^test result|FAILED|panicked|ERROR SUMMARY|RACECHECK SUMMARY|H100|H200" $OUT/check.txt | head -20
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
COMPARE_WHAT=bench COMPARE_SHAPES="1,32,8,4096,128,causal;1,32,8,32768,128,causal" COMPARE_ITERS=10 COMPARE_WARMUP=2 \
  COMPARE_CHECKS=deferred COMPARE_DECODE="" COMPARE_EXCLUDE="mma.sync,staged,fp32,MXFP6,MXFP4 V" COMPARE_JSON=1 \
  COMPARE_DIGEST=1 COMPARE_TIMEOUT=100 bash scripts/gpu_compare_bench.sh > $OUT/compare_console.txt 2>&1
echo "compare rc=$?"; tail -2 $OUT/compare_digest.txt; grep "| NO" $OUT/compare_digest.txt | head
# (the same call then looked for nsys for a timeline: the machine has none)
