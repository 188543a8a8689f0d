#!/usr/bin/env python3
"""Parity fixtures for mxattn's Wan VAE decoders, made with diffusers' AutoencoderKLWan.

Writes, under crates/wan/tests/fixtures/wan/vae/ (run from the repository root):

  wan21/   a tiny random Wan2.1-like VAE (z 4, base_dim 4, dim_mult [1,2,4,4], plain up-blocks,
           3 output channels, 8x spatial): config.json + diffusion_pytorch_model.safetensors
  wan22/   a tiny random Wan2.2-like VAE (z 6, decoder_base_dim 4, residual up-blocks with the
           DupUp3D shortcut, 12 output channels un-patchified with patch_size 2, 16x spatial)
  expected.safetensors   per model: `<name>.latents` [1, z, F, h, w] f32 and `<name>.video`
           [1, 3, 1 + 4 (F - 1), H, W] f32 = `vae.decode(latents)` (raw latents, no mean/std)
  expected.json          versions, shapes and the share of clamped output values

To keep the files small, each model has num_res_blocks 1, its weights are stored as float16 (the
reference runs in float32 on exactly those rounded values) and the encoder and quant_conv
tensors are dropped: the decoder needs only `post_quant_conv.*` and `decoder.*`. All parameters
are random, norm gammas and biases included, so a port that ignores one of them fails.

Set-up:  python3 -m venv .venv-py && .venv-py/bin/pip install torch diffusers safetensors numpy
Run:     .venv-py/bin/python scripts/gen_wan_vae_fixtures.py
"""

import json
import os
import shutil

import diffusers
import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import load_file, save_file

OUT = os.path.join("crates", "wan", "tests", "fixtures", "wan", "vae")

MODELS = {
    # name: (config kwargs, latent frames, latent height, latent width, seed)
    "wan21": (
        dict(
            base_dim=4,
            z_dim=4,
            dim_mult=[1, 2, 4, 4],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
        ),
        4,
        3,
        2,
        21,
    ),
    "wan22": (
        dict(
            base_dim=2,
            decoder_base_dim=4,
            z_dim=6,
            dim_mult=[1, 2, 4, 4],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
            is_residual=True,
            in_channels=12,
            out_channels=12,
            patch_size=2,
            scale_factor_temporal=4,
            scale_factor_spatial=16,
        ),
        3,
        3,
        2,
        22,
    ),
}


def build(kwargs: dict, seed: int) -> AutoencoderKLWan:
    g = torch.Generator().manual_seed(seed)
    z = kwargs["z_dim"]
    kwargs = dict(kwargs)
    kwargs["latents_mean"] = [round(float(x), 4) for x in torch.randn(z, generator=g) * 0.5]
    kwargs["latents_std"] = [round(float(x), 4) for x in 1.0 + torch.rand(z, generator=g) * 2.0]
    torch.manual_seed(seed)
    vae = AutoencoderKLWan(**kwargs).eval()
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            # conv weights keep diffusers' (torch's) default init
            if name.startswith("decoder.conv_out."):
                # a smaller head so that few output values reach the [-1, 1] clamp
                p.mul_(0.5)
            # the stored fixture is float16: run the reference on the rounded values
            p.copy_(p.half().float())
    return vae


def main() -> None:
    torch.set_grad_enabled(False)
    os.makedirs(OUT, exist_ok=True)
    expected = {}
    meta = {
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "models": {},
    }
    for name, (kwargs, f, h, w, seed) in MODELS.items():
        vae = build(kwargs, seed)
        g = torch.Generator().manual_seed(seed + 1000)
        latents = torch.randn(1, kwargs["z_dim"], f, h, w, generator=g)
        video = vae.decode(latents).sample.float()
        d = os.path.join(OUT, name)
        shutil.rmtree(d, ignore_errors=True)
        vae.half().save_pretrained(d, safe_serialization=True)
        # keep only the decode path
        st = os.path.join(d, "diffusion_pytorch_model.safetensors")
        tensors = load_file(st)
        kept = {
            k: v.contiguous()
            for k, v in tensors.items()
            if k.startswith("decoder.") or k.startswith("post_quant_conv.")
        }
        save_file(kept, st, metadata={"format": "pt"})
        expected[f"{name}.latents"] = latents.contiguous()
        expected[f"{name}.video"] = video.contiguous()
        clamped = (video.abs() >= 1.0).float().mean().item()
        meta["models"][name] = {
            "latents": list(latents.shape),
            "video": list(video.shape),
            "decoder_tensors": len(kept),
            "clamped_fraction": clamped,
            "video_abs_mean": video.abs().mean().item(),
        }
        print(name, list(latents.shape), "->", list(video.shape), f"clamped {clamped:.3f}")
    save_file(expected, os.path.join(OUT, "expected.safetensors"))
    with open(os.path.join(OUT, "expected.json"), "w") as fh:
        json.dump(meta, fh, indent=2)
        fh.write("\n")


if __name__ == "__main__":
    main()
