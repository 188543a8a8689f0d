#!/usr/bin/env bash
# Runs on the H200 (device tool), from the repo root, with .gpu/ unpacked (scripts/gpu_check.sh,
# or `xz -d -f .gpu/wan22.xz && chmod +x .gpu/wan22`): the Wan2.2 pipeline with random weights
# and the released architectures, BF16, timing denoising steps (both CFG branches) per attention
# schedule, the share of time in attention (--profile-attention: every attention call timed
# between device synchronizations, which costs little next to calls of tens of ms), and the VAE
# decode. The step time is the mean of the steps after the first (the first loads kernels). One
# process per row.
#   WAN_RUNS   ';'-separated "variant size frames steps" entries
#   WAN_ATTNS  ';'-separated --attn-schedule values, each optionally ATTN:LINEAR with a --linear
#              schedule (e.g. hybrid-fused:fp8: FP8 E4M3 projections)
#   WAN_DECODE "variant size frames" of one run that also decodes (set but empty: none)
# Peer (issue 17): after our rows, diffusers' WanTransformer3DModel at the same runs' shapes
# (scripts/peer_diffusers_wan.py: random BF16 weights, one CFG step = two forward passes, CUDA
# events), its rows appended to the same table, then each of our rows against diffusers'
# default attention (speed-up = diffusers' s/step / ours).
#   WAN_PEER           1 runs it, 0 does not (default: 1 when .gpu/wheels holds a diffusers
#                      wheel, from scripts/fetch_peer_wheels.sh)
#   WAN_PEER_BACKENDS  ','-separated backends of the peer script (default: default,cudnn)
#   WAN_PEER_STEPS     timed steps per peer row, after 1 warm-up step (default: 2)
#   WAN_PEER_TIMEOUT   seconds for the whole peer process (default: 540)
#   WAN_PEER_ARGS      more arguments for it (e.g. --tiny: the plumbing only, in seconds)
# Files in $OUT (the device tool brings back 8 at most): wan_speed.md (the table), wan_speed.json
# (every row's JSON: ours by tag, the peer's), wan_speed_logs.txt (every process's output).
# The per-row files are written under WAN_WORK (default /tmp/wan_speed_work) and combined.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${WAN_WORK:-/tmp/wan_speed_work}; rm -rf "$W"; mkdir -p "$W"
LDP_ORIG=${LD_LIBRARY_PATH:-}
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="${NV}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
IFS=';' read -ra RUNS <<< "${WAN_RUNS:-t2v-a14b 1280x720 81 2;ti2v-5b 1280x704 121 2}"
IFS=';' read -ra ATTNS <<< "${WAN_ATTNS:-exact;fused-mxfp8;fused-mxfp4;hybrid-fused;exact:fp8;hybrid-fused:fp8}"
T=${WAN_TIMEOUT:-300}
if [ -z "${WAN_PEER:-}" ]; then
  WAN_PEER=0
  compgen -G ".gpu/wheels/diffusers-*.whl" > /dev/null && WAN_PEER=1
fi
{
echo "| model | size | frames | tokens | attention | s/step (2 CFG calls) | vs exact | attention share |"
echo "|---|---|---|---|---|---|---|---|"
for run in "${RUNS[@]}"; do
  read -r variant size frames steps <<< "$run"
  base=""
  for attn in "${ATTNS[@]}"; do
    tag="${variant}_${size}_$(echo "$attn" | tr -c 'a-z0-9' '_')"
    linear=bf16; sched=$attn
    [[ "$attn" == *:* ]] && { sched=${attn%%:*}; linear=${attn#*:}; }
    timeout "$T" ./.gpu/wan22 --random-weights --variant "$variant" --device cuda --size "$size" \
      --frames "$frames" --steps "$steps" --no-decode --quiet --profile-attention \
      --attn-schedule "$sched" --linear "$linear" \
      --json "$W/wan_${tag}.json" > "$W/wan_${tag}.txt" 2>&1
    s=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); s=[x['seconds'] for x in d['per_step']]; print('%.3f' % (sum(s[1:])/max(1,len(s)-1) if len(s)>1 else s[0]))" "$W/wan_${tag}.json" 2>/dev/null)
    tok=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); l=d['latents']; print(l[2]*(l[3]//2)*(l[4]//2))" "$W/wan_${tag}.json" 2>/dev/null)
    share=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); p=d['per_step'][-1]; print('%.0f %%' % (100*p['attention_seconds']/p['seconds']))" "$W/wan_${tag}.json" 2>/dev/null)
    [ -z "$base" ] && base=$s
    ratio=$(python3 -c "import sys; print('%.2fx' % (float(sys.argv[1])/float(sys.argv[2])))" "$base" "$s" 2>/dev/null)
    echo "| $variant | $size | $frames | $tok | $attn | ${s:-failed} | ${ratio:--} | ${share:--} |"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$variant" "$size" "$frames" "$attn" "${s:-}" "$tag" >> "$W/ours.tsv"
  done
done
if [ "$WAN_PEER" = 1 ]; then
  PEER_SITE=${WAN_PEER_SITE:-/tmp/peer_site}
  if compgen -G ".gpu/wheels/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$PEER_SITE" .gpu/wheels/*.whl > "$W/peer_install.txt" 2>&1
  fi
  read -ra PEER_ARGS <<< "${WAN_PEER_ARGS:-}"
  models=$(for run in "${RUNS[@]}"; do read -r v s f _ <<< "$run"; echo "$v:$s:$f"; done | awk '!seen[$0]++' | paste -sd, -)
  # torch loads its own CUDA libraries: the environment from before this script's additions
  LD_LIBRARY_PATH="$LDP_ORIG" PYTHONPATH="$PEER_SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
    timeout "${WAN_PEER_TIMEOUT:-540}" python3 scripts/peer_diffusers_wan.py --models "$models" \
    --backends "${WAN_PEER_BACKENDS:-default,cudnn}" --steps "${WAN_PEER_STEPS:-2}" --warmup 1 \
    --json "$W/peer.json" "${PEER_ARGS[@]}" > "$W/peer.txt" 2>&1
  echo "peer exit status $?" >> "$W/peer.txt"
  # the peer's rows in our table's columns, then ours against diffusers' default
  python3 - "$W/peer.json" "$W/ours.tsv" <<'EOF'
import json, os, sys
try:
    peer = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"| diffusers | - | - | - | peer run failed ({type(e).__name__}; see wan_speed_logs.txt) | failed | - | - |")
    sys.exit(0)
env, rows = peer["environment"], peer["rows"]
names = {"a14b": "t2v-a14b", "5b": "ti2v-5b"}
def key(model, size, frames):
    m = model.lower().replace("_", "-")
    return (names.get(m, m), size.lower(), str(frames))
timed = {}  # (model, size, frames) -> {backend: row}
for r in rows:
    s = f"{r['seconds']:.3f}" if "seconds" in r else ("skipped" if "skipped" in r else "failed")
    print(f"| {r['model']} | {r['size']} | {r['frames']} | {r['tokens']} | diffusers, {r['attention']} | {s} | - | - |")
    if "seconds" in r:
        timed.setdefault(key(r["model"], r["size"], r["frames"]), {})[r["backend"]] = r
others = [b for b in dict.fromkeys(r["backend"] for r in rows) if b != "default"]
print()
print(f"Peer: diffusers {env.get('diffusers')}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')}, "
      f"cuDNN {env.get('cudnn')}), {env.get('gpu') or 'CPU'}; one CFG step = two forward passes "
      f"of WanTransformer3DModel, mean of the timed steps after 1 warm-up. Peak GiB: "
      + (", ".join(f"{r['model']} {r['backend']} {r['peak_bytes'] / 2**30:.1f}"
                   for r in rows if r.get("peak_bytes")) or "-") + ".")
print()
print("| model | size | frames | ours: attention | ours s/step | diffusers default s/step "
      "| speed-up vs diffusers default |" + "".join(f" vs diffusers {b} |" for b in others))
print("|---|---|---|---|---|---|---|" + "---|" * len(others))
for line in (open(sys.argv[2]) if os.path.exists(sys.argv[2]) else []):
    v, size, frames, attn, s, _ = line.rstrip("\n").split("\t")
    t = timed.get(key(v, size, frames), {})
    def ratio(b):
        return f"{t[b]['seconds'] / float(s):.2f}x" if b in t and s else "-"
    ds = f"{t['default']['seconds']:.3f}" if "default" in t else "-"
    print(f"| {v} | {size} | {frames} | {attn} | {s or 'failed'} | {ds} | {ratio('default')} |"
          + "".join(f" {ratio(b)} |" for b in others))
EOF
fi
if [ -n "${WAN_DECODE-t2v-a14b 1280x720 81}" ]; then
  read -r variant size frames <<< "${WAN_DECODE-t2v-a14b 1280x720 81}"
  timeout "$T" ./.gpu/wan22 --random-weights --variant "$variant" --device cuda --size "$size" \
    --frames "$frames" --steps 1 --quiet --attn exact -o "$W/wan_decode_${variant}.mp4" \
    --json "$W/wan_decode_${variant}.json" > "$W/wan_decode_${variant}.txt" 2>&1
  echo
  grep -E "VAE decode|wrote" "$W/wan_decode_${variant}.txt"
  rm -f "$W/wan_decode_${variant}.mp4"
fi
} | tee "$OUT/wan_speed.md"
# the per-row files, combined: one JSON, one log
python3 - "$W" "$OUT/wan_speed.json" <<'EOF'
import glob, json, os, sys
w, out = sys.argv[1], sys.argv[2]
combined = {"ours": {}, "peer": None}
for p in sorted(glob.glob(os.path.join(w, "wan_*.json"))):
    try:
        combined["ours"][os.path.basename(p)[4:-5]] = json.load(open(p))
    except Exception as e:
        combined["ours"][os.path.basename(p)[4:-5]] = {"error": f"{type(e).__name__}: {e}"}
if os.path.exists(os.path.join(w, "peer.json")):
    combined["peer"] = json.load(open(os.path.join(w, "peer.json")))
json.dump(combined, open(out, "w"), indent=1)
EOF
for f in "$W"/*.txt; do
  [ -e "$f" ] || continue
  echo "==== $(basename "$f") ===="
  cat "$f"
done > "$OUT/wan_speed_logs.txt"
