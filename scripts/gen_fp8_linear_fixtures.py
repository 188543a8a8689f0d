#!/usr/bin/env python3
"""Fixtures of mxattn-fp8 (FP8 linear layers), computed with numpy and ml_dtypes' float8_e4m3fn
(an independent E4M3 implementation) in float64:

  tiny.json                  inputs, the E4M3 codes and scales of each weight granularity, and
                             y = (per-token FP8 x) · (FP8 W)ᵀ + b for each, and for tensor and
                             channel scales `y_weight_only` = x · (FP8 W)ᵀ + b (the `fp8-w` layer)
  comfyui_scaled_fp8.safetensors   ComfyUI's scaled-FP8 layout: `layer.weight` F8_E4M3,
                             `layer.scale_weight` F32 scalar, `layer.bias`
  qwen_fp8.safetensors       the block-scaled layout of Qwen3-*-FP8: `layer.weight` F8_E4M3,
                             `layer.weight_scale_inv` F32 [⌈out/128⌉, ⌈in/128⌉] (the
                             dequantization multiplier, despite the name)

The definition: a group's scale is s = amax / 448 in f32 (1 where amax = 0), its codes
E4M3(RNE(w / s)) with the division in f32, its values code · s; activations likewise per
token (per token and 128-wide group with 128 × 128 weight blocks); the product accumulated exactly (float64 here).

    python3 -m venv v && v/bin/pip install numpy ml_dtypes && v/bin/python scripts/gen_fp8_linear_fixtures.py
"""
import json
import os
import struct

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "fp8", "tests", "fixtures")


def q(x, s):
    """E4M3 codes (uint8) and values (f64) of f32 `x` divided by f32 `s`."""
    y = (x.astype(np.float32) / np.float32(s)).astype(np.float32).astype(E4M3)
    return y.view(np.uint8), y.astype(np.float64) * np.float64(np.float32(s))


def scale(a):
    m = np.float32(np.max(np.abs(a))) if a.size else np.float32(0)
    return np.float32(1.0) if m == 0 else np.float32(m / np.float32(448.0))


def quantize_weight(w, kind):
    out, inp = w.shape
    codes = np.zeros((out, inp), np.uint8)
    vals = np.zeros((out, inp), np.float64)
    if kind == "tensor":
        s = scale(w)
        codes[:], vals[:] = q(w, s)
        scales = [float(s)]
    elif kind == "channel":
        scales = []
        for o in range(out):
            s = scale(w[o])
            codes[o], vals[o] = q(w[o], s)
            scales.append(float(s))
    else:  # 128 x 128 blocks
        scales = []
        for bo in range(0, out, 128):
            for bi in range(0, inp, 128):
                blk = w[bo:bo + 128, bi:bi + 128]
                s = scale(blk)
                c, v = q(blk, s)
                codes[bo:bo + 128, bi:bi + 128] = c
                vals[bo:bo + 128, bi:bi + 128] = v
                scales.append(float(s))
    return codes, vals, scales


def linear(x, wv, b, group=None):
    """Per-token FP8 activations (per token and `group`-wide slice with block weights)."""
    xv = np.zeros(x.shape, np.float64)
    g = group or x.shape[1]
    for t in range(x.shape[0]):
        for c in range(0, x.shape[1], g):
            _, xv[t, c:c + g] = q(x[t, c:c + g], scale(x[t, c:c + g]))
    return xv @ wv.T + b.astype(np.float64)


def write_safetensors(path, tensors):
    """A minimal safetensors writer (the format: u64 header length, JSON header, data)."""
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    rng = np.random.default_rng(7)
    out, inp, tokens = 40, 136, 3  # not multiples of 128: ragged blocks
    w = (rng.standard_normal((out, inp)) * 0.05).astype(np.float32)
    w[3, 5] = 1.7  # an outlier: per-tensor scales flush the small weights
    w[7] = 0.0  # an all-zero row: scale 1
    x = rng.standard_normal((tokens, inp)).astype(np.float32)
    x[1, 2] = 40.0
    x[2] = 0.0  # an all-zero token
    b = (rng.standard_normal(out) * 0.1).astype(np.float32)
    fx = {"out": out, "in": inp, "tokens": tokens, "w": w.ravel().tolist(), "x": x.ravel().tolist(),
          "bias": b.tolist(), "granularity": {}}
    for kind in ["tensor", "channel", "block128"]:
        codes, vals, scales = quantize_weight(w, kind)
        y = linear(x, vals, b, 128 if kind == "block128" else None)
        fx["granularity"][kind] = {"codes_hex": codes.tobytes().hex(), "scales": scales,
                                   "y": y.ravel().tolist()}
        if kind != "block128":
            # weight-only (`fp8-w`): the activations as given, the FP8 weight's values
            yw = x.astype(np.float64) @ vals.T + b.astype(np.float64)
            fx["granularity"][kind]["y_weight_only"] = yw.ravel().tolist()
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "tiny.json"), "w") as f:
        json.dump(fx, f)
    t = fx["granularity"]["tensor"]
    write_safetensors(os.path.join(OUT, "comfyui_scaled_fp8.safetensors"), {
        "layer.weight": ("F8_E4M3", (out, inp), bytes.fromhex(t["codes_hex"])),
        "layer.scale_weight": ("F32", (), np.float32(t["scales"][0]).tobytes()),
        "layer.bias": ("F32", (out,), b.tobytes()),
    })
    k = fx["granularity"]["block128"]
    write_safetensors(os.path.join(OUT, "qwen_fp8.safetensors"), {
        "layer.weight": ("F8_E4M3", (out, inp), bytes.fromhex(k["codes_hex"])),
        "layer.weight_scale_inv": ("F32", (1, 2), np.array(k["scales"], np.float32).tobytes()),
        "layer.bias": ("F32", (out,), b.tobytes()),
    })
    print("wrote", OUT)


if __name__ == "__main__":
    main()
