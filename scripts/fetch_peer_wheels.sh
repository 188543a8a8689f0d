#!/usr/bin/env bash
# Downloads, here (pip reaches the package registries), the wheels that the peer measurement
# (scripts/peer_diffusers_wan.py, issue 17) needs on the GPU machine, into .gpu/wheels/
# (git-ignored; the device tool carries it). That machine has no internet; its stock Python
# 3.12 environment has torch, transformers and every runtime dependency of diffusers
# (huggingface-hub, safetensors, regex, requests, Pillow, filelock, numpy, httpx: see
# /work/.library/device/KINDS.md, "Python packages already there") except diffusers itself.
# diffusers also lists importlib_metadata, which it imports only on Python < 3.8, so only the
# diffusers wheel (pure Python, about 5 MB) travels, fetched with --no-deps.
#   DIFFUSERS_VERSION   the version to fetch (default 0.42.1, the one tested here: it asks
#                       for huggingface-hub >= 1.32, < 3; the GPU machine had 1.33.0)
#   PEER_EXTRA_WHEELS   more NAME==VERSION specs to fetch the same way (space-separated)
# On the GPU machine (scripts/gpu_wan_speed.sh does this when .gpu/wheels holds diffusers):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
#   PYTHONPATH=/tmp/site python3 scripts/peer_diffusers_wan.py ...
set -euo pipefail
cd "$(dirname "$0")/.."
V=${DIFFUSERS_VERSION:-0.42.1}
mkdir -p .gpu/wheels
rm -f .gpu/wheels/*.whl
specs=("diffusers==$V")
read -ra extra <<< "${PEER_EXTRA_WHEELS:-}"
specs+=("${extra[@]}")
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
  -d .gpu/wheels "${specs[@]}"
echo "Requires-Dist of diffusers $V (the GPU machine must already have these, or carry them):"
unzip -p .gpu/wheels/diffusers-*.whl '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' || true
ls -la .gpu/wheels
du -sh .gpu/wheels
