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

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from transformers import Qwen3ForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from gen_fp8_linear_fixtures import q, quantize_weight, scale, write_safetensors  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "crates", "llm", "tests", "fixtures", "qwen3")
SRC = os.path.join(ROOT, "tiny")
OUT = os.path.join(ROOT, "tiny_fp8")
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_input(x):
    """Per token and 128-wide group along the last axis."""
    a = x.detach().cpu().numpy().astype(np.float32)
    flat = a.reshape(-1, a.shape[-1])
    outv = np.zeros_like(flat)
    for t in range(flat.shape[0]):
        for c in range(0, flat.shape[1], 128):
            _, outv[t, c:c + 128] = q(flat[t, c:c + 128], scale(flat[t, c:c + 128]))
    return torch.from_numpy(outv.reshape(a.shape))


def main():
    os.makedirs(OUT, exist_ok=True)
    tensors = load_file(os.path.join(SRC, "model.safetensors"))
    model = Qwen3ForCausalLM.from_pretrained(SRC, torch_dtype=torch.float32,
                                             attn_implementation="eager").eval()
    stored = {}
    for name, t in tensors.items():
        if name.endswith(".weight") and name.split(".")[-2] in PROJ:
            codes, vals, scales = quantize_weight(t.astype(np.float32), "block128")
            grid = (-(-t.shape[0] // 128), -(-t.shape[1] // 128))
            stored[name] = ("F8_E4M3", codes.shape, codes.tobytes())
            stored[name + "_scale_inv"] = ("F32", grid, np.array(scales, np.float32).tobytes())
            mod = model.get_submodule(name[: -len(".weight")])
            with torch.no_grad():
                # code · scale is exact in f64 (4 + 24 significant bits): its f32 rounding is
                # the f32 product the Rust reference computes
                mod.weight.copy_(torch.from_numpy(vals.astype(np.float32)))
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
