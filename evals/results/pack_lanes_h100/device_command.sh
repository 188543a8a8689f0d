# The device command of the A/B in this folder (one call). .gpu/ held, xz-compressed and
# stripped: gpu (the GPU test binary) and bench_gpu of the change (kernels/NOTES.md v3 item 22),
# bench_gpu_old of ecffd5a (main before it), both built here with
#   source .venv-cuda/env.sh; MXATTN_CUDA_ARCHS=90a CARGO_TARGET_DIR=target/cuda \
#     cargo build --release --features cuda --example bench_gpu --tests
export OUT; GPU_CHECK_ONLY='^GPU tests$|memcheck|racecheck|initcheck' bash scripts/gpu_check.sh > $OUT/check.txt 2>&1; echo "check rc=$?"
grep -E "^test result|FAILED|panicked|ERROR SUMMARY|RACECHECK SUMMARY|H100|H200|one-pass vs staged" $OUT/check.txt | head -20
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
COMPARE_WHAT=bench COMPARE_SHAPES="1,32,8,4096,128,causal;1,32,8,4096,64,causal;1,32,8,32768,128,causal;4,32,32,8192,128" \
  COMPARE_ITERS=10 COMPARE_WARMUP=2 COMPARE_CHECKS=deferred COMPARE_DECODE="" COMPARE_EXCLUDE="mma.sync,staged,fp32,MXFP6,MXFP4 V" \
  COMPARE_JSON=1 COMPARE_DIGEST=1 COMPARE_TIMEOUT=120 COMPARE_KERNELS="fused-softmax u8, MXFP8 QK, FP8 V;exact bf16" \
  bash scripts/gpu_compare_bench.sh > $OUT/compare_console.txt 2>&1
echo "compare rc=$?"; tail -2 $OUT/compare_digest.txt; grep "| NO" $OUT/compare_digest.txt | head
cd $OUT && tar czf extras.tgz --exclude=extras.tgz --exclude=check.txt --exclude=compare_bench.md --exclude=compare_digest.txt --exclude=compare_kernels.txt * ; ls
