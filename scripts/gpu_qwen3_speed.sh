#!/usr/bin/env bash
# Runs on the H200 (device tool), from the repo root, with .gpu/ unpacked (scripts/gpu_check.sh):
# Qwen3-8B with random weights (the real config), BF16, prefill and decode at three context
# lengths for exact attention on a BF16 cache, exact attention on an MXFP4 cache (read by the
# decode kernel), the MX configs (MX Q/K/V and P, the cache in the same format) and the hybrid
# MXFP6/4 schedule. One process per row. QWEN3_ATTNS overrides the rows (';' separated flags).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="${NV}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{
echo "| context | attention | prefill tok/s | decode tok/s | KV cache |"
echo "|---|---|---|---|---|"
for ctx in ${QWEN3_CONTEXTS:-1024 4096 32768}; do
  IFS=';' read -ra ATTNS <<< "${QWEN3_ATTNS:---attn exact;--attn kv-mxfp8;--attn kv-mxfp4;--attn mxfp8;--attn mxfp4;--attn-schedule hybrid}"
  for attn in "${ATTNS[@]}"; do
    log="$OUT/qwen3_${ctx}_$(echo "$attn" | tr -c 'a-z0-9' '_').txt"
    timeout "${QWEN3_TIMEOUT:-150}" ./.gpu/chat --random-weights --model Qwen/Qwen3-8B --device cuda --dtype bf16 \
      --prompt-len "$ctx" --max-tokens 32 --ignore-eos --greedy --quiet $attn > "$log" 2>&1
    pre=$(grep -o "prefill: .*" "$log" | sed 's/.*= //')
    dec=$(grep -o "decode: .*" "$log" | sed 's/.*= //; s/ (.*//')
    kv=$(grep -o "KV cache: .*" "$log" | sed 's/ for .*//; s/KV cache: //')
    echo "| $ctx | ${attn#--} | $pre | $dec | $kv |"
  done
done
} | tee "$OUT/qwen3_speed.md"
