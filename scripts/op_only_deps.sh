#!/usr/bin/env bash
# What a crate that depends on the op alone compiles: makes a throwaway dependent of
# `mxattn` (a path dependency, default features, the workspace's lockfile) and prints its
# `cargo tree -e normal`. Fails if a front-end crate (CLI, progress bars, video, plots, Hub)
# appears in it. Run from anywhere; CI runs it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/src"
cat > "$TMP/Cargo.toml" <<TOML
[package]
name = "op-only"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
mxattn = { path = "$ROOT" }

[workspace]
TOML
echo 'pub use mxattn::attention::attention;' > "$TMP/src/lib.rs"
cp "$ROOT/Cargo.lock" "$TMP/Cargo.lock"
cd "$TMP"
tree=$(cargo tree -e normal --prefix none 2>/dev/null || cargo tree -e normal --prefix none --offline)
echo "$tree" | sed 's| (/.*)||; s/ (\*)//' | sort -u > deps.txt
echo "op-only dependent: $(($(wc -l < deps.txt) - 1)) crates besides itself; direct:"
cargo tree -e normal --depth 2 2>/dev/null | sed "s| ($ROOT)||; s|(/[^)]*)||"
bad=$(grep -E '^(clap|indicatif|openh264|mp4|gif|png|plotters|dejavu|hf-hub|tracing-subscriber|mxattn-[a-z]+) ' deps.txt || true)
if [ -n "$bad" ]; then
  echo "front-end crates in an op-only build:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "no CLI, progress-bar, video, plot or Hub crates"
