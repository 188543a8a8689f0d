#!/usr/bin/env bash
# Builds the CUDA test and benchmark binaries here (no GPU needed) and packs them,
# stripped and xz-compressed, into .gpu/ (git-ignored) for the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .venv-cuda/env.sh ] || scripts/setup_cuda.sh
# shellcheck disable=SC1091
source .venv-cuda/env.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
mkdir -p .gpu
bin=$(cargo test --release --features cuda --test gpu --no-run --message-format=json 2>/dev/null \
  | python3 -c "import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['name'] == 'gpu':
        print(m['executable'])")
cp "$bin" .gpu/gpu
cargo build --release --features cuda --example bench_gpu --example qwen3 --example wan22 --example wan_transformer --bin wan_fidelity
for e in bench_gpu qwen3 wan22 wan_transformer; do cp "$CARGO_TARGET_DIR/release/examples/$e" ".gpu/$e"; done
cp "$CARGO_TARGET_DIR/release/wan_fidelity" .gpu/wan_fidelity
strip .gpu/gpu .gpu/bench_gpu .gpu/qwen3 .gpu/wan22 .gpu/wan_transformer .gpu/wan_fidelity
xz -T2 -6 -f .gpu/gpu .gpu/bench_gpu .gpu/qwen3 .gpu/wan22 .gpu/wan_transformer .gpu/wan_fidelity
ls -la .gpu
