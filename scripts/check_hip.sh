#!/usr/bin/env bash
# Compile-checks the GPU sources for AMD (HIP, gfx90a and gfx940) with Debian's hipcc:
# the same .cu files and extern "C" launchers as the CUDA build, through kernels/gpu_compat.h.
# There is no AMD GPU here: this proves the sources build, not that they run.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v hipcc >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hipcc >/dev/null
fi
# hipcc picks NVIDIA's platform when it sees a CUDA toolkit (CUDA_PATH, nvcc on PATH):
# this check is for AMD targets, so say so and hide the CUDA set-up from it.
export HIP_PLATFORM=amd
unset CUDA_PATH CUDA_HOME CUDA_ROOT NVCC
out=$(mktemp -d)
for src in kernels/*.cu; do
  for arch in gfx90a gfx940; do
    # hipcc 5.2 prints a harmless rocm_agent_enumerator traceback on every call
    hipcc --offload-arch="$arch" -O3 -std=c++17 -Ikernels -fPIC -c "$src" -o "$out/$(basename "$src").$arch.o" 2>"$out/log" \
      || { cat "$out/log"; echo "hipcc failed: $src ($arch)"; exit 1; }
  done
  echo "hip ok: $src (gfx90a, gfx940)"
done
rm -rf "$out"
