#!/usr/bin/env python3
"""Parity fixtures for mxattn's Wan pipeline, made with diffusers' WanPipeline.

Writes (run from the repository root, after gen_wan_umt5_fixtures.py, gen_wan_transformer_fixtures.py
and gen_wan_vae_fixtures.py, whose outputs it reuses):

  crates/wan/tests/fixtures/wan/pipeline/   a tiny random A14B-like diffusers pipeline directory that
      WanPipeline.from_pretrained loads: model_index.json (boundary_ratio 0.875,
      expand_timesteps false), tokenizer/ (the tiny SentencePiece tokenizer of the UMT5
      fixtures), text_encoder/ (a new tiny random UMT5EncoderModel with d_model 16 = the
      transformers' text_dim), transformer/ and transformer_2/ (two tiny random
      WanTransformer3DModel, the a14b fixture config, different seeds), vae/ (the tiny Wan2.1
      VAE fixture of vae/wan21 — same decoder tensors — but saved with its encoder too, so that
      the pipeline's own decode works), scheduler/ (UniPC with Wan's settings, flow_shift 3.0)
  crates/wan/tests/fixtures/wan/pipeline_expected.safetensors  float32: latents_init [1,4,2,4,4] (given to
      the pipeline as `latents`), latents_step{i} after each step, latents_final
      (output_type="latent"), video [1,3,5,32,32] = vae.decode(latents / (1/std) + mean), in
      [-1, 1] before the pipeline's postprocessing (output_type="np" gives (video + 1) / 2
      clamped to [0, 1], frames last: checked here), prompt_embeds / negative_prompt_embeds
      [1,32,16] = what the transformers get as encoder_hidden_states
  crates/wan/tests/fixtures/wan/pipeline_expected.json  the settings, timesteps, sigmas, the expert of each
      step (checked with forward hooks: each step calls its expert twice, cond then uncond), the
      token ids and real lengths of both prompts, shapes, versions

max_sequence_length is 32, above both prompts' token counts (23 and 18), so the zero rows the
pipeline appends after the real tokens are exercised (the transformers attend to them unmasked).

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
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

sys.path.insert(0, os.path.dirname(__file__))
from gen_wan_transformer_fixtures import build as build_transformer  # noqa: E402
from gen_wan_vae_fixtures import MODELS as VAE_MODELS  # noqa: E402
from gen_wan_vae_fixtures import build as build_vae  # noqa: E402

FIX = os.path.join("crates", "wan", "tests", "fixtures", "wan")
OUT = os.path.join(FIX, "pipeline")
PROMPT = "a red fox running through snow"
NEGATIVE = "blurry, low quality"
MAX_LEN = 32  # > both prompts' token counts, so the zero-padding is exercised
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
    # the wan21 VAE fixture, rebuilt WITH its encoder: that fixture keeps only the decode path,
    # and from_pretrained leaves the missing encoder on the meta device, where the pipeline's
    # decode (which moves latents to the VAE's first parameter's device) then fails
    kwargs, *_, vae_seed = VAE_MODELS["wan21"]
    vae = build_vae(kwargs, vae_seed).half()
    dec = load_file(os.path.join(FIX, "vae", "wan21", "diffusion_pytorch_model.safetensors"))
    state = vae.state_dict()
    assert all(torch.equal(state[k], v) for k, v in dec.items()), "wan21 VAE fixture changed"
    vae.save_pretrained(os.path.join(OUT, "vae"))
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

    # which expert runs each step: hook the two transformers (cond + uncond calls each step)
    calls = []
    hooks = [m.register_forward_pre_hook(lambda mod, args, kw, e=e: calls.append(e), with_kwargs=True)
             for e, m in enumerate((pipe.transformer, pipe.transformer_2))]

    def on_step(p, i, t, kw):
        steps.append(kw["latents"].detach().clone().float())
        experts.append(0 if float(t) >= boundary_t else 1)
        return kw

    out = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=H, width=W, num_frames=FRAMES,
               num_inference_steps=STEPS, guidance_scale=GUIDANCE, guidance_scale_2=GUIDANCE_2,
               latents=latents.clone(), max_sequence_length=MAX_LEN, output_type="latent",
               callback_on_step_end=on_step, callback_on_step_end_tensor_inputs=["latents"])
    for h in hooks:
        h.remove()
    final = out.frames.float()
    timesteps = [float(t) for t in pipe.scheduler.timesteps]
    timestep_dtype = str(pipe.scheduler.timesteps.dtype)
    sigmas = [float(s) for s in pipe.scheduler.sigmas]
    assert torch.equal(final, steps[-1])
    assert 0 in experts and 1 in experts, experts
    # CFG: each step calls its expert twice (cond, then uncond)
    assert calls == [e for e in experts for _ in range(2)], (calls, experts)

    # the text conditioning the transformers saw (cleaned, tokenized to MAX_LEN, encoded, cut to
    # the real tokens and zero-padded back to MAX_LEN)
    pos, neg = pipe.encode_prompt(PROMPT, NEGATIVE, do_classifier_free_guidance=True,
                                  max_sequence_length=MAX_LEN, dtype=torch.float32)
    ids = {k: pipe.tokenizer(v, padding="max_length", max_length=MAX_LEN, truncation=True,
                             add_special_tokens=True, return_attention_mask=True)
           for k, v in (("prompt", PROMPT), ("negative_prompt", NEGATIVE))}

    # the pipeline's decode, before postprocessing to [0, 1]
    mean = torch.tensor(pipe.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(pipe.vae.config.latents_std).view(1, -1, 1, 1, 1)
    video = pipe.vae.decode(final / inv_std + mean, return_dict=False)[0].float()
    # cross-check with the pipeline's own decode + postprocess ((v + 1) / 2 clamped, frames last)
    np_out = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=H, width=W, num_frames=FRAMES,
                  num_inference_steps=STEPS, guidance_scale=GUIDANCE, guidance_scale_2=GUIDANCE_2,
                  latents=latents.clone(), max_sequence_length=MAX_LEN, output_type="np").frames
    ref = (video / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1).numpy()  # [1, F, H, W, 3]
    assert np_out.shape == ref.shape and abs(np_out - ref).max() < 1e-5, abs(np_out - ref).max()

    tensors = {"latents_init": latents, "latents_final": final, "video": video,
               "prompt_embeds": pos, "negative_prompt_embeds": neg}
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
            "timestep_dtype": timestep_dtype, "sigmas": sigmas,
            "expert_per_step": experts,
            "expert_calls": calls,
            "cfg_both_experts": True,
            "guidance_per_expert": {"transformer": GUIDANCE, "transformer_2": GUIDANCE_2},
            "input_ids": {k: v["input_ids"] for k, v in ids.items()},
            "seq_lens": {k: sum(v["attention_mask"]) for k, v in ids.items()},
            "shapes": {k: list(v.shape) for k, v in tensors.items()},
            "dtype": "float32 (tensors and the run; weights on disk float16)",
            "note": "transformer (expert 0) with guidance_scale while t >= boundary_ratio*1000, "
                    "else transformer_2 with guidance_scale_2 (pipeline_wan.py); CFG runs for "
                    "both experts (CFG is on iff guidance_scale > 1; guidance_scale_2 is not "
                    "consulted for that); noise = uncond + g * (cond - uncond); the initial "
                    "latents are passed in (kept float32); the transformers run in their load "
                    "dtype (float32 here) and get the int64 scheduler timestep",
            "text": "prompt_clean (ftfy, html unescape, whitespace collapse), tokenized with EOS, "
                    "padded/truncated to max_sequence_length; UMT5 runs with the attention mask; "
                    "rows >= seq_len are zeroed and the transformers' cross-attention sees all "
                    "max_sequence_length rows (no mask)",
            "video": "vae.decode(latents / (1/std) + mean) in [-1, 1], before postprocessing "
                     "(the pipeline's np output is (video + 1) / 2 clamped to [0, 1], frames last)",
            "prompt_embeds": "UMT5 last_hidden_state for the cleaned prompt, rows >= seq_len set "
                             "to zero; the pipeline passes [1, max_sequence_length, 16]",
        }, f, indent=1)
    print("timesteps", timesteps, "experts", experts)


if __name__ == "__main__":
    main()
