#!/usr/bin/env python3
"""A tiny Wan transformer in the layout of ComfyUI's scaled-FP8 checkpoints
(`wan2.2_*_fp8_scaled.safetensors`): the original Wan names (`blocks.N.self_attn.q.weight`),
every block projection's `weight` as F8_E4M3 codes with a per-tensor `scale_weight` F32
scalar beside it (the dequantization multiplier), a `scaled_fp8` marker, everything else as
the source stores it. Made from the tiny A14B-like fixture of
scripts/gen_wan_transformer_fixtures.py, with its config.json (original layout).

The expected output comes from diffusers' WanTransformer3DModel (f32) with each block
projection's weight set to its dequantized FP8 values and a forward pre-hook quantizing the
projection's input per token as the FP8 path defines it (scale amax / 448 in f32, E4M3 codes
of x / scale with ml_dtypes' float8_e4m3fn, round to nearest even): an oracle independent of
the Rust code.

  crates/wan/tests/fixtures/wan/transformer/a14b_comfyui_fp8/{config.json,
      diffusion_pytorch_model.safetensors, expected.safetensors}

    python3 -m venv v && v/bin/pip install torch diffusers transformers safetensors numpy ml_dtypes
    v/bin/python scripts/gen_wan_fp8_fixtures.py
"""
import os
import shutil
import sys

import numpy as np
import torch
from diffusers import WanTransformer3DModel
from safetensors.numpy import load_file
from safetensors.torch import load_file as load_torch, save_file

sys.path.insert(0, os.path.dirname(__file__))
from gen_fp8_linear_fixtures import q, quantize_weight, scale, write_safetensors  # noqa: E402
from gen_wan_transformer_fixtures import to_original  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "crates", "wan", "tests", "fixtures", "wan",
                    "transformer")
OUT = os.path.join(ROOT, "a14b_comfyui_fp8")
PROJ = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
        "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2")
ST_DTYPE = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}


def quantize_input(x):
    """Per token: each row of the last axis with its own scale."""
    a = x.detach().cpu().numpy().astype(np.float32)
    flat = a.reshape(-1, a.shape[-1])
    outv = np.zeros_like(flat)
    for t in range(flat.shape[0]):
        _, outv[t] = q(flat[t], scale(flat[t]))
    return torch.from_numpy(outv.reshape(a.shape))


def main():
    torch.set_grad_enabled(False)
    src_dir = os.path.join(ROOT, "a14b")
    tensors = load_file(os.path.join(src_dir, "diffusion_pytorch_model.safetensors"))
    # built from the config and loaded by hand in f32 (from_pretrained would need accelerate)
    model = WanTransformer3DModel.from_config(WanTransformer3DModel.load_config(src_dir)).float().eval()
    model.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in tensors.items()})
    stored = {}
    n_fp8 = 0
    for name, t in tensors.items():
        stem = name[: -len(".weight")] if name.endswith(".weight") else None
        if stem and name.startswith("blocks.") and stem.split(".", 2)[2] in PROJ:
            codes, vals, (s,) = quantize_weight(t.astype(np.float32), "tensor")
            o = to_original(name)
            stored[o] = ("F8_E4M3", codes.shape, codes.tobytes())
            stored[o[: -len(".weight")] + ".scale_weight"] = ("F32", (), np.float32(s).tobytes())
            mod = model.get_submodule(stem)
            # code · scale is exact in f64: its f32 rounding is the Rust reference's product
            mod.weight.copy_(torch.from_numpy(vals.astype(np.float32)))
            mod.register_forward_pre_hook(lambda m, args: (quantize_input(args[0]),) + args[1:])
            n_fp8 += 1
        else:
            stored[to_original(name)] = (ST_DTYPE[t.dtype], t.shape, t.tobytes())
    stored["scaled_fp8"] = ("F8_E4M3", (0,), b"")
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    write_safetensors(os.path.join(OUT, "diffusion_pytorch_model.safetensors"), stored)
    shutil.copy(os.path.join(ROOT, "a14b_original", "config.json"), os.path.join(OUT, "config.json"))
    e = load_torch(os.path.join(ROOT, "expected.safetensors"))
    out = model(e["a14b.latents"], e["a14b.timestep"], e["a14b.text"], return_dict=False)[0].float()
    save_file({"out": out.contiguous()}, os.path.join(OUT, "expected.safetensors"))
    print("wrote", OUT, f"({n_fp8} FP8 projections), out", list(out.shape))


if __name__ == "__main__":
    main()
