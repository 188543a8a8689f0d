#!/usr/bin/env python3
"""A tiny checkpoint in the layout of the official block-scaled FP8 checkpoints
(Qwen/Qwen3-8B-FP8): every decoder projection's `weight` as F8_E4M3 codes with a
`weight_scale_inv` F32 [⌈out/128⌉, ⌈in/128⌉] beside it (the dequantization multiplier,
despite the name), and `quantization_config` {quant_method fp8, fmt e4m3,
weight_block_size [128, 128], activation_scheme dynamic} in config.json; embeddings, norms
and lm_head stay f32. Made from the tiny Qwen3 fixture (scripts/gen_qwen3_fixtures.py).

The expected logits come from Hugging Face transformers' Qwen3ForCausalLM (f32, eager
attention) with each projection's weight set to its dequantized FP8 values and a forward
pre-hook that quantizes the projection's input as the FP8 path defines it (per token and
128-wide group: scale amax / 448 in f32, E4M3 codes of x / scale with ml_dtypes'
float8_e4m3fn, round to nearest even) — an oracle independent of the Rust code.

  crates/llm/tests/fixtures/qwen3/tiny_fp8/{config.json, model.safetensors, expected.safetensors}

    python3 -m venv v && v/bin/pip install torch transformers safetensors numpy ml_dtypes
    v/bin/python scripts/gen_qwen3_fp8_fixtures.py
"""
import json
import os
import sys

import ml_dtypes
import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from transformers import Qwen3ForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from gen_fp8_linear_fixtures import write_safetensors  # noqa: E402

E4M3 = ml_dtypes.float8_e4m3fn
ROOT = os.path.join(os.path.dirname(__file__), "..", "crates", "llm", "tests", "fixtures", "qwen3")
SRC = os.path.join(ROOT, "tiny")
OUT = os.path.join(ROOT, "tiny_fp8")
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def scale(a):
    m = np.float32(np.max(np.abs(a))) if a.size else np.float32(0)
    return np.float32(1.0) if m == 0 else np.float32(m / np.float32(448.0))


def quantize(x, s):
    """E4M3 codes of f32 x / f32 s and their values code · s in f32."""
    c = (x.astype(np.float32) / np.float32(s)).astype(np.float32).astype(E4M3)
    return c, (c.astype(np.float32) * np.float32(s)).astype(np.float32)


def quantize_blocks(w):
    out, inp = w.shape
    codes = np.zeros((out, inp), E4M3)
    vals = np.zeros((out, inp), np.float32)
    scales = np.zeros((-(-out // 128), -(-inp // 128)), np.float32)
    for bo in range(0, out, 128):
        for bi in range(0, inp, 128):
            blk = w[bo:bo + 128, bi:bi + 128]
            s = scale(blk)
            c, v = quantize(blk, s)
            codes[bo:bo + 128, bi:bi + 128] = c
            vals[bo:bo + 128, bi:bi + 128] = v
            scales[bo // 128, bi // 128] = s
    return codes, vals, scales


def quantize_input(x):
    """Per token and 128-wide group along the last axis."""
    a = x.detach().cpu().numpy().astype(np.float32)
    flat = a.reshape(-1, a.shape[-1])
    outv = np.zeros_like(flat)
    for t in range(flat.shape[0]):
        for c in range(0, flat.shape[1], 128):
            _, outv[t, c:c + 128] = quantize(flat[t, c:c + 128], scale(flat[t, c:c + 128]))
    return torch.from_numpy(outv.reshape(a.shape))


def main():
    os.makedirs(OUT, exist_ok=True)
    tensors = load_file(os.path.join(SRC, "model.safetensors"))
    model = Qwen3ForCausalLM.from_pretrained(SRC, torch_dtype=torch.float32,
                                             attn_implementation="eager").eval()
    stored = {}
    for name, t in tensors.items():
        if name.endswith(".weight") and name.split(".")[-2] in PROJ:
            codes, vals, scales = quantize_blocks(t.astype(np.float32))
            stored[name] = ("F8_E4M3", codes.shape, codes.view(np.uint8).tobytes())
            stored[name + "_scale_inv"] = ("F32", scales.shape, scales.tobytes())
            mod = model.get_submodule(name[: -len(".weight")])
            with torch.no_grad():
                mod.weight.copy_(torch.from_numpy(vals))
            mod.register_forward_pre_hook(lambda m, args: (quantize_input(args[0]),) + args[1:])
        else:
            stored[name] = ("F32", t.shape, t.astype(np.float32).tobytes())
    write_safetensors(os.path.join(OUT, "model.safetensors"), stored)
    cfg = json.load(open(os.path.join(SRC, "config.json")))
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                  "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    expected = load_file(os.path.join(ROOT, "expected.safetensors"))
    prompt = expected["tiny.prompt"]
    with torch.no_grad():
        logits = model(torch.from_numpy(prompt.astype(np.int64))[None]).logits[0].float().numpy()
    save_file({"prompt": prompt, "prompt_logits": logits},
              os.path.join(OUT, "expected.safetensors"))
    print("wrote", OUT, "logits", logits.shape)


if __name__ == "__main__":
    main()
