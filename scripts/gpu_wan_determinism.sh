#!/usr/bin/env bash
# Runs on the H200 (device tool), from the repo root, with .gpu/ unpacked: the same Wan2.2
# generation (random weights, one seed) twice per attention schedule, printing the
# fingerprints wan22 writes to its JSON (final latents, decoded RGB frames) and the MP4's
# checksum, to tell GPU nondeterminism from the encoder's.
#   DET_RUN    "variant size frames steps" (default: ti2v-5b 1280x704 9 2)
#   DET_ATTNS  ';'-separated --attn-schedule values (default: exact;hybrid-fused)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="${NV}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
read -r variant size frames steps <<< "${DET_RUN:-ti2v-5b 1280x704 9 2}"
IFS=';' read -ra ATTNS <<< "${DET_ATTNS:-exact;hybrid-fused}"
T=${DET_TIMEOUT:-120}
{
echo "| attention | run | latents hash | frames hash | mp4 md5 | mp4 bytes |"
echo "|---|---|---|---|---|---|"
for attn in "${ATTNS[@]}"; do
  tag=$(echo "$attn" | tr -c 'a-z0-9' '_')
  for run in 1 2; do
    j="$OUT/det_${tag}_${run}.json"; m="/tmp/det_${tag}_${run}.mp4"
    timeout "$T" ./.gpu/wan22 --random-weights --variant "$variant" --device cuda --size "$size" \
      --frames "$frames" --steps "$steps" --seed 7 --quiet --attn-schedule "$attn" -o "$m" --json "$j" \
      > "$OUT/det_${tag}_${run}.txt" 2>&1 || tail -3 "$OUT/det_${tag}_${run}.txt"
    lh=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['latents_hash'])" "$j" 2>/dev/null)
    fh=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['frames_hash'])" "$j" 2>/dev/null)
    echo "| $attn | $run | ${lh:-failed} | ${fh:-failed} | $(md5sum < "$m" 2>/dev/null | cut -c1-16) | $(stat -c %s "$m" 2>/dev/null) |"
  done
done
} | tee "$OUT/wan_determinism.md"
