#!/usr/bin/env bash
# Runs on the H200 (device tool), from the repo root, with .gpu/ unpacked (scripts/gpu_check.sh):
# Qwen3-8B with random weights (the real config), BF16, batch 1: time to first token, prefill
# and decode tokens/s per context length and configuration (attention preset or schedule, KV
# cache format, linear layers), each decode rate against the memory-bandwidth bound measured in
# the same command (a 4 GiB device-to-device copy: bytes moved / time), the bytes a decode step
# reads being the model's weights as held (chat's decode_weight_bytes: projections, output head)
# plus the KV cache. Then where a decode token's time goes (chat --profile, device-synchronized
# stages) for the first rows at the first context. One process per row.
#   QWEN3_CONTEXTS  prompt lengths (default: 1024 4096 32768)
#   QWEN3_ATTNS     ';'-separated chat flags per row
#   QWEN3_PROFILE   ';'-separated chat flags of the profiled rows ("" for none)
#   QWEN3_TIMEOUT   seconds per row (default 150)
# Files in $OUT (the device tool brings back 8 at most): qwen3_speed.md, qwen3_speed.json (every
# row's chat --json), qwen3_speed_logs.txt.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${QWEN3_WORK:-/tmp/qwen3_speed_work}; rm -rf "$W"; mkdir -p "$W"
LDP_ORIG=${LD_LIBRARY_PATH:-}
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="${NV}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# the copy bandwidth: read + write of a 4 GiB buffer, best of 20 after warm-up (torch loads its
# own CUDA libraries: the environment from before this script's additions)
BW=$(LD_LIBRARY_PATH="$LDP_ORIG" python3 - <<'PY'
import torch
n = 4 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
best = 1e9
for _ in range(20):
    s.record(); b.copy_(a); e.record(); e.synchronize(); best = min(best, s.elapsed_time(e))
print("%.1f" % (2 * n / (best * 1e-3) / 1e9))
PY
)
IFS=';' read -ra ATTNS <<< "${QWEN3_ATTNS:---attn exact;--attn kv-mxfp4;--attn mxfp4;--attn-schedule hybrid;--attn exact --linear fp8;--attn kv-mxfp4 --linear fp8}"
{
echo "Copy bandwidth (4 GiB device-to-device, read + write): ${BW:-?} GB/s"
echo
echo "| context | configuration | time to first token (ms) | prefill tok/s | decode tok/s | GB per decode token | bound tok/s | share of bound |"
echo "|---|---|---|---|---|---|---|---|"
for ctx in ${QWEN3_CONTEXTS:-1024 4096 32768}; do
  for attn in "${ATTNS[@]}"; do
    tag="${ctx}_$(echo "$attn" | tr -c 'a-z0-9' '_')"
    # shellcheck disable=SC2086
    timeout "${QWEN3_TIMEOUT:-150}" ./.gpu/chat --random-weights --model Qwen/Qwen3-8B --device cuda \
      --dtype bf16 --prompt-len "$ctx" --max-tokens 64 --ignore-eos --greedy --quiet $attn \
      --json "$W/$tag.json" > "$W/$tag.txt" 2>&1
    python3 - "$W/$tag.json" "$ctx" "$attn" "${BW:-0}" <<'PY'
import json, sys
path, ctx, attn, bw = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4] or 0)
try:
    d = json.load(open(path)); t = d["turns"][-1]
except Exception:
    print(f"| {ctx} | {attn} | failed | | | | | |"); sys.exit(0)
gb = (d["decode_weight_bytes"] + t["kv_cache_bytes"]) / 1e9
bound = bw / gb if bw else 0
share = t["decode_tok_per_s"] / bound if bound else 0
print(f"| {ctx} | {attn} | {1e3 * t['time_to_first_token_s']:.0f} | {t['prefill_tok_per_s']:.0f} | "
      f"{t['decode_tok_per_s']:.1f} | {gb:.2f} | {bound:.0f} | {100 * share:.0f} % |")
PY
  done
done
IFS=';' read -ra PROF <<< "${QWEN3_PROFILE---attn exact;--attn exact --linear fp8}"
ctx0=$(echo "${QWEN3_CONTEXTS:-1024 4096 32768}" | awk '{print $1}')
for attn in "${PROF[@]}"; do
  [ -z "$attn" ] && continue
  tag="profile_${ctx0}_$(echo "$attn" | tr -c 'a-z0-9' '_')"
  echo
  echo "Decode profile at context $ctx0, $attn (chat --profile: every stage between device synchronizations):"
  echo
  # shellcheck disable=SC2086
  timeout "${QWEN3_TIMEOUT:-150}" ./.gpu/chat --random-weights --model Qwen/Qwen3-8B --device cuda \
    --dtype bf16 --prompt-len "$ctx0" --max-tokens 32 --ignore-eos --greedy --quiet --profile $attn \
    --json "$W/$tag.json" > "$W/$tag.txt" 2>&1
  grep '^|' "$W/$tag.txt" || echo "(profile run failed; see qwen3_speed_logs.txt)"
done
} | tee "$OUT/qwen3_speed.md"
python3 - "$W" "$OUT/qwen3_speed.json" <<'PY'
import glob, json, os, sys
rows = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    try:
        rows[os.path.basename(p)[:-5]] = json.load(open(p))
    except Exception as e:
        rows[os.path.basename(p)[:-5]] = {"error": str(e)}
json.dump(rows, open(sys.argv[2], "w"), indent=1)
PY
for f in "$W"/*.txt; do echo "== $(basename "$f")"; cat "$f"; done > "$OUT/qwen3_speed_logs.txt"
