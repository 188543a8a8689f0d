#!/usr/bin/env python3
"""Parity fixtures for mxattn's Wan pipeline, made with diffusers' WanPipeline.

Writes (run from the repository root, after gen_wan_umt5_fixtures.py, gen_wan_transformer_fixtures.py
and gen_wan_vae_fixtures.py, whose outputs it reuses):

  tests/fixtures/wan/pipeline/   a tiny random A14B-like diffusers pipeline directory that
      WanPipeline.from_pretrained loads: model_index.json (boundary_ratio 0.875,
      expand_timesteps false), tokenizer/ (the tiny SentencePiece tokenizer of the UMT5
      fixtures), text_encoder/ (a new tiny random UMT5EncoderModel with d_model 16 = the
      transformers' text_dim), transformer/ and transformer_2/ (two tiny random
      WanTransformer3DModel, the a14b fixture config, different seeds), vae/ (the tiny Wan2.1
      VAE fixture), scheduler/ (UniPC with Wan's settings, flow_shift 3.0)
  tests/fixtures/wan/pipeline_expected.safetensors  float32: latents_init [1,4,2,4,4] (given to
      the pipeline as `latents`), latents_step{i} after each step, latents_final
      (output_type="latent"), video [1,3,5,32,32] = vae.decode(latents / (1/std) + mean), in
      [-1, 1] before the pipeline's postprocessing
  tests/fixtures/wan/pipeline_expected.json  the settings, timesteps, the expert of each step

Weights are float16 on disk; the pipeline runs in float32 on exactly those values.

Set-up:  python3 -m venv .venv-py && .venv-py/bin/pip install torch transformers diffusers safetensors numpy sentencepiece ftfy
Run:     .venv-py/bin/python scripts/gen_wan_pipeline_fixtures.py
"""

import json
import os
import shutil
import sys

import diffusers
import torch
import transformers
from diffusers import (AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline,
                       WanTransformer3DModel)
from safetensors.torch import save_file
from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

sys.path.insert(0, os.path.dirname(__file__))
from gen_wan_transformer_fixtures import build as build_transformer  # noqa: E402

FIX = os.path.join("tests", "fixtures", "wan")
OUT = os.path.join(FIX, "pipeline")
PROMPT = "a red fox running through snow"
NEGATIVE = "blurry, low quality"
MAX_LEN = 16
STEPS = 4
GUIDANCE, GUIDANCE_2 = 4.0, 3.0
BOUNDARY = 0.875
H = W = 32
FRAMES = 5


def text_encoder(vocab: int) -> UMT5EncoderModel:
    cfg = UMT5Config(vocab_size=vocab, d_model=16, d_kv=6, d_ff=32, num_layers=2, num_heads=4,
                     relative_attention_num_buckets=32, relative_attention_max_distance=128,
                     feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, pad_token_id=0,
                     eos_token_id=1, decoder_start_token_id=0)
    model = UMT5EncoderModel(cfg).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("relative_attention_bias.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.dim() == 2 and "shared" not in name else 1
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
    return model


def main() -> None:
    torch.set_grad_enabled(False)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    # components saved in float16 (small), then the pipeline loads them in float32
    shutil.copytree(os.path.join(FIX, "umt5", "tokenizer"), os.path.join(OUT, "tokenizer"))
    tok = AutoTokenizer.from_pretrained(os.path.join(OUT, "tokenizer"))
    text_encoder(len(tok)).to(torch.float16).save_pretrained(os.path.join(OUT, "text_encoder"))
    for sub, seed in (("transformer", 101), ("transformer_2", 202)):
        build_transformer(dict(in_channels=4, out_channels=4), seed).to(torch.float16).save_pretrained(
            os.path.join(OUT, sub))
    shutil.copytree(os.path.join(FIX, "vae", "wan21"), os.path.join(OUT, "vae"))
    sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                    num_train_timesteps=1000, flow_shift=3.0, solver_order=2,
                                    solver_type="bh2", predict_x0=True, lower_order_final=True)
    sched.save_pretrained(os.path.join(OUT, "scheduler"))
    index = {
        "_class_name": "WanPipeline",
        "_diffusers_version": diffusers.__version__,
        "boundary_ratio": BOUNDARY,
        "expand_timesteps": False,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    with open(os.path.join(OUT, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2)

    pipe = WanPipeline.from_pretrained(OUT, torch_dtype=torch.float32)
    assert isinstance(pipe.transformer_2, WanTransformer3DModel)
    assert isinstance(pipe.vae, AutoencoderKLWan)
    assert pipe.config.boundary_ratio == BOUNDARY
    for m in (pipe.transformer, pipe.transformer_2, pipe.text_encoder, pipe.vae):
        assert all(p.dtype == torch.float32 for p in m.parameters())

    g = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 4, (FRAMES - 1) // 4 + 1, H // 8, W // 8, generator=g)
    steps, experts = [], []
    boundary_t = BOUNDARY * pipe.scheduler.config.num_train_timesteps

    def on_step(p, i, t, kw):
        steps.append(kw["latents"].detach().clone().float())
        experts.append(0 if float(t) >= boundary_t else 1)
        return kw

    out = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=H, width=W, num_frames=FRAMES,
               num_inference_steps=STEPS, guidance_scale=GUIDANCE, guidance_scale_2=GUIDANCE_2,
               latents=latents.clone(), max_sequence_length=MAX_LEN, output_type="latent",
               callback_on_step_end=on_step, callback_on_step_end_tensor_inputs=["latents"])
    final = out.frames.float()
    timesteps = [float(t) for t in pipe.scheduler.timesteps]
    assert torch.equal(final, steps[-1])
    assert 0 in experts and 1 in experts, experts

    # the pipeline's decode, before postprocessing to [0, 1]
    mean = torch.tensor(pipe.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(pipe.vae.config.latents_std).view(1, -1, 1, 1, 1)
    video = pipe.vae.decode(final / inv_std + mean, return_dict=False)[0].float()

    tensors = {"latents_init": latents, "latents_final": final, "video": video}
    for i, s in enumerate(steps):
        tensors[f"latents_step{i}"] = s
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(FIX, "pipeline_expected.safetensors"))
    with open(os.path.join(FIX, "pipeline_expected.json"), "w") as f:
        json.dump({
            "diffusers": diffusers.__version__, "transformers": transformers.__version__,
            "torch": torch.__version__,
            "prompt": PROMPT, "negative_prompt": NEGATIVE, "max_sequence_length": MAX_LEN,
            "num_inference_steps": STEPS, "guidance_scale": GUIDANCE,
            "guidance_scale_2": GUIDANCE_2, "boundary_ratio": BOUNDARY,
            "height": H, "width": W, "num_frames": FRAMES, "timesteps": timesteps,
            "expert_per_step": experts,
            "note": "transformer (expert 0) with guidance_scale while t >= boundary_ratio*1000, "
                    "else transformer_2 with guidance_scale_2 (pipeline_wan.py); CFG runs for "
                    "both experts; the initial latents are passed in",
            "video": "vae.decode(latents / (1/std) + mean) in [-1, 1], before postprocessing",
        }, f, indent=1)
    print("timesteps", timesteps, "experts", experts)


if __name__ == "__main__":
    main()
