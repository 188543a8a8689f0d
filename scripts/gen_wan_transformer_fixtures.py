#!/usr/bin/env python3
"""Parity fixtures for mxattn's Wan diffusion transformer, made with diffusers'
WanTransformer3DModel.

Writes, under crates/wan/tests/fixtures/wan/transformer/ (run from the repository root):

  a14b/      a tiny random A14B-like expert (4 in/out channels, 2 layers, 2 heads x 32, text_dim
             16, freq_dim 256 as released), diffusers layout: config.json +
             diffusion_pytorch_model.safetensors
  ti2v5b/    a tiny random TI2V-5B-like model (6 in/out channels), run with per-token
             timesteps (the pipeline's expand_timesteps: t = 0 on the first frame's tokens)
  a14b_original/  the a14b weights re-keyed into the original Wan release's layout (WanModel
             config.json, blocks.N.self_attn.q, norm2/norm3 swapped, ...), in two shards with a
             diffusion_pytorch_model.safetensors.index.json
  expected.safetensors   per model: `<name>.latents` [2, C, 3, 4, 6], `<name>.timestep` ([2] or
             [2, 18]), `<name>.text` [2, 8, 16] (zero-padded tails, as the pipeline pads UMT5
             output), `<name>.block0` the hidden states after block 0 [2, 18, 64] and
             `<name>.out` = model(latents, timestep, text) [2, C, 3, 4, 6], all float32
  expected.json          versions and shapes, and the tensor and parameter counts of the
             released T2V-A14B expert and TI2V-5B (diffusers instantiated on the meta device)

Every parameter is random (norm weights and biases, q/k norms and scale_shift_tables
included) so that a port ignoring one fails. Weights are stored as float16 and the reference
runs in float32 on exactly those rounded values.

Set-up:  python3 -m venv .venv-py && .venv-py/bin/pip install torch diffusers safetensors numpy
Run:     .venv-py/bin/python scripts/gen_wan_transformer_fixtures.py
"""

import json
import os
import shutil

import diffusers
import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import load_file, save_file

OUT = os.path.join("crates", "wan", "tests", "fixtures", "wan", "transformer")
WEIGHTS = "diffusion_pytorch_model.safetensors"

BASE = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=32,
    text_dim=16,
    freq_dim=256,
    ffn_dim=96,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=1024,
)

MODELS = {
    # name: (extra config, per-token timesteps, seed)
    "a14b": (dict(in_channels=4, out_channels=4), False, 14),
    "ti2v5b": (dict(in_channels=6, out_channels=6), True, 5),
}

# diffusers name -> original Wan name, the inverse of TRANSFORMER_KEYS_RENAME_DICT in diffusers'
# scripts/convert_wan_to_diffusers.py (which swaps norm2 and norm3).
TO_ORIGINAL = [
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    ("proj_out", "head.head"),
    ("attn1.to_out.0", "self_attn.o"),
    ("attn2.to_out.0", "cross_attn.o"),
    ("attn1.to_", "self_attn."),
    ("attn2.to_", "cross_attn."),
    ("attn1.norm_", "self_attn.norm_"),
    ("attn2.norm_", "cross_attn.norm_"),
    ("ffn.net.0.proj", "ffn.0"),
    ("ffn.net.2", "ffn.2"),
    (".norm2.", ".norm3."),
]


def to_original(name: str) -> str:
    if name == "scale_shift_table":
        return "head.modulation"
    for d, o in TO_ORIGINAL:
        if d in name:
            name = name.replace(d, o)
    return name.replace("scale_shift_table", "modulation")


def converter_rename(name: str) -> str:
    """diffusers' converter renaming (original -> diffusers): each dict entry replaced in turn."""
    pairs = [
        ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
        ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
        ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
        ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
        ("time_projection.1", "condition_embedder.time_proj"),
        ("head.modulation", "scale_shift_table"),
        ("head.head", "proj_out"),
        ("modulation", "scale_shift_table"),
        ("ffn.0", "ffn.net.0.proj"),
        ("ffn.2", "ffn.net.2"),
        ("norm2", "norm__placeholder"),
        ("norm3", "norm2"),
        ("norm__placeholder", "norm3"),
        ("self_attn.q", "attn1.to_q"),
        ("self_attn.k", "attn1.to_k"),
        ("self_attn.v", "attn1.to_v"),
        ("self_attn.o", "attn1.to_out.0"),
        ("self_attn.norm_q", "attn1.norm_q"),
        ("self_attn.norm_k", "attn1.norm_k"),
        ("cross_attn.q", "attn2.to_q"),
        ("cross_attn.k", "attn2.to_k"),
        ("cross_attn.v", "attn2.to_v"),
        ("cross_attn.o", "attn2.to_out.0"),
        ("cross_attn.norm_q", "attn2.norm_q"),
        ("cross_attn.norm_k", "attn2.norm_k"),
    ]
    for a, b in pairs:
        name = name.replace(a, b)
    return name


def build(extra: dict, seed: int) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = WanTransformer3DModel(**BASE, **extra).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("scale_shift_table"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            # other weights keep torch's default init
            p.copy_(p.half().float())
    return model


def inputs(cin: int, per_token: bool, seed: int):
    g = torch.Generator().manual_seed(seed + 1000)
    latents = torch.randn(2, cin, 3, 4, 6, generator=g)
    text = torch.randn(2, 8, BASE["text_dim"], generator=g)
    text[0, 5:] = 0.0  # true lengths 5 and 6, zero-padded as the pipeline does
    text[1, 6:] = 0.0
    if per_token:
        tokens = 3 * 2 * 3
        ts = torch.full((2, tokens), 500.0)
        ts[0, :] = 800.0
        ts[0, :6] = 0.0  # the first frame's tokens (image-to-video)
    else:
        ts = torch.tensor([937.0, 250.0])
    return latents, ts, text


def main() -> None:
    torch.set_grad_enabled(False)
    os.makedirs(OUT, exist_ok=True)
    expected = {}
    meta = {"torch": torch.__version__, "diffusers": diffusers.__version__, "models": {}}
    for name, (extra, per_token, seed) in MODELS.items():
        model = build(extra, seed)
        latents, ts, text = inputs(extra["in_channels"], per_token, seed)
        captured = {}
        model.blocks[0].register_forward_hook(lambda m, a, o: captured.__setitem__("b0", o))
        out = model(latents, ts, text, return_dict=False)[0].float()
        d = os.path.join(OUT, name)
        shutil.rmtree(d, ignore_errors=True)
        model.half().save_pretrained(d, safe_serialization=True)
        for k, v in [("latents", latents), ("timestep", ts), ("text", text),
                     ("block0", captured["b0"].float()), ("out", out)]:
            expected[f"{name}.{k}"] = v.contiguous()
        meta["models"][name] = {
            "config": {**BASE, **extra},
            "latents": list(latents.shape),
            "timestep": list(ts.shape),
            "out": list(out.shape),
            "out_abs_mean": out.abs().mean().item(),
        }
        print(name, list(latents.shape), "->", list(out.shape), f"mean |out| {out.abs().mean():.3f}")

    # the a14b weights in the original layout, sharded
    src = load_file(os.path.join(OUT, "a14b", WEIGHTS))
    orig = {to_original(k): v for k, v in src.items()}
    assert len(orig) == len(src)
    for k in orig:  # the converter maps each original name back
        assert converter_rename(k) in src, (k, converter_rename(k))
    assert {converter_rename(k) for k in orig} == set(src)
    d = os.path.join(OUT, "a14b_original")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    names = sorted(orig)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(shards):
        fname = f"diffusion_pytorch_model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: orig[k].contiguous() for k in part}, os.path.join(d, fname),
                  metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    with open(os.path.join(d, "diffusion_pytorch_model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh, indent=2)
        fh.write("\n")
    cfg = {**BASE, **MODELS["a14b"][0]}
    dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    original_cfg = {
        "_class_name": "WanModel",
        "_diffusers_version": "0.33.0",
        "dim": dim,
        "eps": cfg["eps"],
        "ffn_dim": cfg["ffn_dim"],
        "freq_dim": cfg["freq_dim"],
        "in_dim": cfg["in_channels"],
        "model_type": "t2v",
        "num_heads": cfg["num_attention_heads"],
        "num_layers": cfg["num_layers"],
        "out_dim": cfg["out_channels"],
        "text_dim": cfg["text_dim"],
        "text_len": 512,
        "patch_size": list(cfg["patch_size"]),
    }
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(original_cfg, fh, indent=2)
        fh.write("\n")

    # the released architectures, instantiated without weights: tensor and parameter counts
    real = {
        "t2v_a14b": dict(in_channels=16, out_channels=16, num_attention_heads=40, ffn_dim=13824,
                         num_layers=40),
        "ti2v_5b": dict(in_channels=48, out_channels=48, num_attention_heads=24, ffn_dim=14336,
                        num_layers=30),
    }
    meta["released"] = {}
    for name, kw in real.items():
        with torch.device("meta"):
            m = WanTransformer3DModel(patch_size=(1, 2, 2), attention_head_dim=128, text_dim=4096,
                                      freq_dim=256, cross_attn_norm=True, eps=1e-6, **kw)
        sd = m.state_dict()
        meta["released"][name] = {
            "tensors": len(sd),
            "parameters": sum(v.numel() for v in sd.values()),
        }
        print(name, meta["released"][name])

    save_file(expected, os.path.join(OUT, "expected.safetensors"))
    with open(os.path.join(OUT, "expected.json"), "w") as fh:
        json.dump(meta, fh, indent=2)
        fh.write("\n")


if __name__ == "__main__":
    main()
