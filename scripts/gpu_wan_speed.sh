#!/usr/bin/env bash
# Runs on the H200 (device tool), from the repo root, with .gpu/ unpacked (scripts/gpu_check.sh or
# the unpack line below): the Wan2.2 pipeline with random weights and the released
# architectures, BF16, timing denoising steps (both CFG branches) per attention schedule, the
# share of time in attention (--profile-attention: every attention call timed between device
# synchronizations, which costs little next to calls of tens of ms), and the VAE decode. The
# step time is the mean of the steps after the first (the first loads kernels). One process
# per row.
#   WAN_RUNS   ';'-separated "variant size frames steps" entries
#   WAN_ATTNS  ';'-separated --attn / --attn-schedule values
#   WAN_DECODE "variant size frames" of one run that also decodes (set but empty: none)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="${NV}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
IFS=';' read -ra RUNS <<< "${WAN_RUNS:-t2v-a14b 1280x720 81 2;ti2v-5b 1280x704 121 2}"
IFS=';' read -ra ATTNS <<< "${WAN_ATTNS:-exact;fused-mxfp8;fused-mxfp4;hybrid-fused}"
T=${WAN_TIMEOUT:-300}
{
echo "| model | size | frames | tokens | attention | s/step (2 CFG calls) | vs exact | attention share |"
echo "|---|---|---|---|---|---|---|---|"
for run in "${RUNS[@]}"; do
  read -r variant size frames steps <<< "$run"
  base=""
  for attn in "${ATTNS[@]}"; do
    tag="${variant}_${size}_$(echo "$attn" | tr -c 'a-z0-9' '_')"
    flag="--attn-schedule"
    timeout "$T" ./.gpu/wan22 --random-weights --variant "$variant" --device cuda --size "$size" \
      --frames "$frames" --steps "$steps" --no-decode --quiet --profile-attention $flag "$attn" \
      --json "$OUT/wan_${tag}.json" > "$OUT/wan_${tag}.txt" 2>&1
    s=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); s=[x['seconds'] for x in d['per_step']]; print('%.3f' % (sum(s[1:])/max(1,len(s)-1) if len(s)>1 else s[0]))" "$OUT/wan_${tag}.json" 2>/dev/null)
    tok=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); l=d['latents']; print(l[2]*(l[3]//2)*(l[4]//2))" "$OUT/wan_${tag}.json" 2>/dev/null)
    share=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); p=d['per_step'][-1]; print('%.0f %%' % (100*p['attention_seconds']/p['seconds']))" "$OUT/wan_${tag}.json" 2>/dev/null)
    [ -z "$base" ] && base=$s
    ratio=$(python3 -c "import sys; print('%.2fx' % (float(sys.argv[1])/float(sys.argv[2])))" "$base" "$s" 2>/dev/null)
    echo "| $variant | $size | $frames | $tok | $attn | ${s:-failed} | ${ratio:--} | ${share:--} |"
  done
done
if [ -n "${WAN_DECODE-t2v-a14b 1280x720 81}" ]; then
  read -r variant size frames <<< "${WAN_DECODE-t2v-a14b 1280x720 81}"
  timeout "$T" ./.gpu/wan22 --random-weights --variant "$variant" --device cuda --size "$size" \
    --frames "$frames" --steps 1 --quiet --attn exact -o "$OUT/wan_decode_${variant}.mp4" \
    --json "$OUT/wan_decode_${variant}.json" > "$OUT/wan_decode_${variant}.txt" 2>&1
  echo
  grep -E "VAE decode|wrote" "$OUT/wan_decode_${variant}.txt"
  rm -f "$OUT/wan_decode_${variant}.mp4"
fi
} | tee "$OUT/wan_speed.md"
