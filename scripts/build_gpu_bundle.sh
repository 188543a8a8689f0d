#!/usr/bin/env bash
# Builds the CUDA test and benchmark binaries here (no GPU needed) and packs them,
# stripped and xz-compressed, into .gpu/ (git-ignored) for the device tool's `carry`.
#   MXATTN_CUDA_ARCHS   mxattn's kernel architectures (default: 90a, what the H200 runs)
#   BUNDLE_SM80=1       also .gpu/gpu_sm80: the GPU tests with mxattn's kernels built for
#                       compute capability 8.0 only (no wgmma), run on the H200 through the
#                       PTX JIT by scripts/gpu_check.sh
#   BUNDLE_NCCL=1       also .gpu/wan22_nccl: wan22 with the nccl feature (--gpus N, RANK...),
#                       linked against the libnccl stub; the GPU machine's libnccl.so.2 loads
#   BUNDLE_OLD=REV      also .gpu/bench_gpu_old and .gpu/wan_transformer_old: those programs
#                       at git revision REV, for a same-run comparison with this build
#                       (scripts/gpu_compare_bench.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .venv-cuda/env.sh ] || scripts/setup_cuda.sh
# shellcheck disable=SC1091
source .venv-cuda/env.sh
CARGO_TARGET_DIR=$(realpath -m "${CARGO_TARGET_DIR:-target/cuda}")
export CARGO_TARGET_DIR
mkdir -p .gpu
# The path of the `gpu` test binary a `cargo test --no-run` builds.
gpu_test_bin() {
  cargo test --release --features cuda --test gpu --no-run --message-format=json 2>/dev/null \
    | python3 -c "import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['name'] == 'gpu':
        print(m['executable'])"
}
# The FP8 linear layer's GPU tests (crates/fp8/tests/gpu.rs, test target `fp8_gpu`).
fp8_test_bin() {
  cargo test --release -p mxattn-fp8 --features cuda --test fp8_gpu --no-run --message-format=json 2>/dev/null \
    | python3 -c "import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['name'] == 'fp8_gpu':
        print(m['executable'])"
}
packed=()
cp "$(gpu_test_bin)" .gpu/gpu; packed+=(.gpu/gpu)
cp "$(fp8_test_bin)" .gpu/fp8_gpu; packed+=(.gpu/fp8_gpu)
cargo build --release --features cuda --example bench_gpu --example chat --example wan22 --example wan_transformer --bin wan_fidelity --bin bench_fp8_linear
for e in bench_gpu chat wan22 wan_transformer; do cp "$CARGO_TARGET_DIR/release/examples/$e" ".gpu/$e"; packed+=(".gpu/$e"); done
for b in wan_fidelity bench_fp8_linear; do cp "$CARGO_TARGET_DIR/release/$b" ".gpu/$b"; packed+=(".gpu/$b"); done
if [ "${BUNDLE_NCCL:-0}" = 1 ]; then
  cargo build --release -p mxattn-examples --features nccl --example wan22
  cp "$CARGO_TARGET_DIR/release/examples/wan22" .gpu/wan22_nccl; packed+=(.gpu/wan22_nccl)
fi
if [ "${BUNDLE_SM80:-0}" = 1 ]; then
  cp "$(MXATTN_CUDA_ARCHS=80 gpu_test_bin)" .gpu/gpu_sm80; packed+=(.gpu/gpu_sm80)
fi
if [ -n "${BUNDLE_OLD:-}" ]; then
  old=$(mktemp -d)
  git worktree add -f "$old" "$BUNDLE_OLD" >/dev/null
  ( cd "$old" && cargo build --release --features cuda --example bench_gpu --example wan_transformer )
  for e in bench_gpu wan_transformer; do
    cp "$CARGO_TARGET_DIR/release/examples/$e" ".gpu/${e}_old"; packed+=(".gpu/${e}_old")
  done
  git worktree remove --force "$old"
fi
strip "${packed[@]}"
xz -T2 -6 -f "${packed[@]}"
ls -la .gpu
