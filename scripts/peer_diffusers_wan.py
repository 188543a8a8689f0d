#!/usr/bin/env python3
"""Peer measurement for issue 17: diffusers' Wan2.2 transformer on the same GPU as ours.

Builds diffusers' WanTransformer3DModel with the released architecture of Wan2.2-T2V-A14B
(one of its two experts; both share one config) and of Wan2.2-TI2V-5B, with random BF16
weights, and times one classifier-free-guidance denoising step the way diffusers' WanPipeline
runs it: two batch-1 forward passes (conditional and unconditional umT5 embeddings, 512 tokens
of width 4096 each) and the guidance combine, eager mode. This is the transformer part of the
step that scripts/gpu_wan_speed.sh times for our wan22 (s/step, 2 CFG calls); the sampler's
update, which ours includes, is a few elementwise ops on the latents.

Weights: no download. The model is constructed directly on the device under
torch.device(DEV) with torch's default dtype set to bfloat16 (what diffusers' from_pretrained
does while it builds the model: ModelMixin._set_default_torch_dtype), so every parameter is
allocated once, in BF16, and filled by its module's default initialiser by kernels on the
device (no host-side initialisation or copy; the build time is printed). Then the
parameters of WanTransformer3DModel._keep_in_fp32_modules (rope, time_embedder,
scale_shift_table, norm1/2/3) are cast to FP32 with the rule from_pretrained applies
(diffusers/models/model_loading_utils.py: a module name equal to one component of the
parameter's dotted name). The RoPE tables are non-persistent float64
buffers in diffusers and stay so, as after from_pretrained. Values do not change what a step
costs: the same kernels run on the same shapes.

Backends (--backends): 'default' = diffusers' default attention backend ('native', i.e.
torch.nn.functional.scaled_dot_product_attention with PyTorch's own kernel choice; the kernel
PyTorch picks for the self- and cross-attention shapes is reported, via torch._fused_sdp_choice);
'cudnn' / 'flash' / 'efficient' / 'math' = the same calls inside
torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION / FLASH_ATTENTION /
EFFICIENT_ATTENTION / MATH), which raises rather than falling back if that kernel cannot run.
'flash' is PyTorch's built-in FlashAttention-2, not the flash-attn package.

Timing: per (model, backend), --warmup steps, then --steps timed steps, each between CUDA
events (time.perf_counter on CPU); mean and min reported. Peak memory:
torch.cuda.max_memory_allocated over the warm-up and timed steps (weights included; reset
before each backend).

Output: a markdown table (one row per model and backend) on stdout; --json PATH writes the
rows and the environment (torch, CUDA, cuDNN, diffusers versions, GPU name), rewritten after
every row. On a CPU, 'cudnn' and 'efficient' rows are skipped (CUDA only). Exit status 1 when
a row failed (its error is in the JSON and in an HTML comment under the table).

On the GPU machine (no internet; diffusers travels as a wheel, scripts/fetch_peer_wheels.sh):
    pip install --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
    PYTHONPATH=/tmp/site python3 scripts/peer_diffusers_wan.py --json /tmp/peer.json
Smoke test anywhere (CPU is fine):
    python3 scripts/peer_diffusers_wan.py --tiny
"""

import argparse
import json
import os
import platform
import sys
import time

# The released transformer configs. Source file on the hub:
#   Wan-AI/Wan2.2-T2V-A14B-Diffusers  transformer/config.json  (transformer_2/config.json, the
#   low-noise expert, is the same architecture)
#   Wan-AI/Wan2.2-TI2V-5B-Diffusers   transformer/config.json
# Checked against diffusers' scripts/convert_wan_to_diffusers.py (model types
# "Wan2.2-T2V-A14B" and "Wan2.2-TI2V-5B", which wrote those configs) and the defaults of
# WanTransformer3DModel.__init__ in src/diffusers/models/transformers/transformer_wan.py
# (diffusers main 58eb52c, 0.42.1) for the keys the conversion leaves at their defaults
# (image_dim, rope_max_seq_len, pos_embed_seq_len); and against ours,
# crates/wan/src/transformer/config.rs (t2v_a14b, ti2v_5b).
A14B_TRANSFORMER = {
    "added_kv_proj_dim": None,
    "attention_head_dim": 128,
    "cross_attn_norm": True,
    "eps": 1e-06,
    "ffn_dim": 13824,
    "freq_dim": 256,
    "image_dim": None,
    "in_channels": 16,
    "num_attention_heads": 40,
    "num_layers": 40,
    "out_channels": 16,
    "patch_size": [1, 2, 2],
    "pos_embed_seq_len": None,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 1024,
    "text_dim": 4096,
}
TI2V_5B_TRANSFORMER = dict(
    A14B_TRANSFORMER,
    ffn_dim=14336,
    in_channels=48,
    num_attention_heads=24,
    num_layers=30,
    out_channels=48,
)
# --tiny: a few layers and small dims, for a smoke test of the whole script on any device.
TINY_TRANSFORMER = dict(
    A14B_TRANSFORMER,
    attention_head_dim=32,
    ffn_dim=128,
    freq_dim=32,
    in_channels=4,
    num_attention_heads=2,
    num_layers=2,
    out_channels=4,
    text_dim=64,
)

# model key -> (name as our wan22 --variant spells it, config, VAE spatial stride, default
# WxH, default frames, latents we expect at that default (crates/wan/src/sizes.rs tests),
# timestep per token (diffusers' expand_timesteps, TI2V-5B), text tokens)
MODELS = {
    "a14b": ("t2v-a14b", A14B_TRANSFORMER, 8, "1280x720", 81, (16, 21, 90, 160), False, 512),
    "5b": ("ti2v-5b", TI2V_5B_TRANSFORMER, 16, "1280x704", 121, (48, 31, 44, 80), True, 512),
    "tiny": ("tiny", TINY_TRANSFORMER, 8, "96x64", 9, (4, 3, 8, 12), True, 16),
}
ALIASES = {"t2v-a14b": "a14b", "a14b": "a14b", "ti2v-5b": "5b", "5b": "5b", "tiny": "tiny"}
BACKENDS = ("default", "cudnn", "flash", "efficient", "math")
GUIDANCE = 4.0  # the value does not change the cost
TIMESTEP = 900.0


def latent_shape(z_dim, stride, width, height, frames):
    """[C, F, H, W] latents of a video, as crates/wan/src/sizes.rs::latent_shape computes them:
    frames = 4k + 1 -> k + 1 latent frames, the VAE's spatial stride on H and W."""
    if frames < 1 or (frames - 1) % 4:
        raise ValueError(f"{frames} frames: the VAE makes 1 + 4k frames")
    m = stride * 2  # VAE stride times the 2x2 patch
    if width % m or height % m:
        raise ValueError(f"{width}x{height}: width and height must be multiples of {m}")
    return (z_dim, (frames - 1) // 4 + 1, height // stride, width // stride)


def parse_models(text, tiny):
    """'a14b,5b' or entries 'MODEL[:WxH[:FRAMES]]' -> list of run dicts."""
    runs = []
    for entry in [e.strip() for e in text.split(",") if e.strip()]:
        parts = entry.split(":")
        key = ALIASES.get(parts[0].lower())
        if key is None:
            raise SystemExit(f"unknown model '{parts[0]}' (a14b / t2v-a14b, 5b / ti2v-5b)")
        per_token = MODELS[key][6]  # --tiny keeps the model's timestep layout
        if tiny:
            key = "tiny"
        name, cfg, stride, size, frames, expect, _, text_len = MODELS[key]
        if len(parts) > 1 and not tiny:
            size = parts[1]
        if len(parts) > 2 and not tiny:
            frames = int(parts[2])
        w, h = (int(x) for x in size.lower().split("x"))
        lat = latent_shape(cfg["in_channels"], stride, w, h, frames)
        if size == MODELS[key][3] and frames == MODELS[key][4] and lat != expect:
            raise SystemExit(f"{name}: latents {lat}, expected {expect} (sizes.rs)")
        runs.append(
            dict(
                model=name if not tiny else f"tiny({parts[0]})",
                config=cfg,
                size=f"{w}x{h}",
                frames=frames,
                latents=list(lat),
                tokens=lat[1] * (lat[2] // 2) * (lat[3] // 2),
                per_token_timestep=per_token,
                text_len=text_len,
            )
        )
    return runs


def build_model(cfg, device):
    import torch
    from diffusers import WanTransformer3DModel

    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = WanTransformer3DModel(**cfg)
    finally:
        torch.set_default_dtype(prev)
    keep = WanTransformer3DModel._keep_in_fp32_modules or []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(m in name.split(".") for m in keep):
                p.data = p.data.float()
    model.eval().requires_grad_(False)
    return model


def sdpa_context(backend):
    import contextlib

    if backend == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]
    return sdpa_kernel(kind)


def default_kernel(run, device):
    """The SDPA kernel PyTorch picks by itself for the self- and cross-attention shapes."""
    import torch

    try:
        from torch.nn.attention import SDPBackend

        names = {int(v.value) if hasattr(v, "value") else int(v): k
                 for k, v in SDPBackend.__members__.items()}
        c = run["config"]
        h, d = c["num_attention_heads"], c["attention_head_dim"]
        q = torch.empty(1, h, run["tokens"], d, dtype=torch.bfloat16, device=device)
        kv = torch.empty(1, h, run["text_len"], d, dtype=torch.bfloat16, device=device)
        s = names.get(int(torch._fused_sdp_choice(q, q, q)), "?")
        x = names.get(int(torch._fused_sdp_choice(q, kv, kv)), "?")
        return s.lower() if s == x else f"self {s.lower()}, cross {x.lower()}"
    except Exception as e:  # private API: report, do not fail the measurement
        return f"unknown ({type(e).__name__})"


def time_run(model, run, backend, device, warmup, steps, seed):
    import torch

    cuda = device.type == "cuda"
    g = torch.Generator(device=device).manual_seed(seed)
    c, f, hh, ww = run["latents"]
    x = torch.randn(1, c, f, hh, ww, generator=g, device=device, dtype=torch.float32)
    tdim = run["config"]["text_dim"]
    cond = torch.randn(1, run["text_len"], tdim, generator=g, device=device).to(torch.bfloat16)
    uncond = torch.randn(1, run["text_len"], tdim, generator=g, device=device).to(torch.bfloat16)
    if run["per_token_timestep"]:
        # WanPipeline with expand_timesteps (TI2V-5B): one timestep per video token
        ts = torch.full((1, run["tokens"]), TIMESTEP, device=device)
    else:
        ts = torch.full((1,), TIMESTEP, device=device)

    def step():
        xin = x.to(torch.bfloat16)
        v = model(hidden_states=xin, timestep=ts, encoder_hidden_states=cond, return_dict=False)[0]
        vu = model(hidden_states=xin, timestep=ts, encoder_hidden_states=uncond, return_dict=False)[0]
        return vu.float() + GUIDANCE * (v.float() - vu.float())

    times = []
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode(), sdpa_context(backend):
        for i in range(warmup + steps):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                out = step()
                b.record()
                b.synchronize()
                dt = a.elapsed_time(b) / 1000.0
            else:
                t0 = time.perf_counter()
                out = step()
                dt = time.perf_counter() - t0
            if i >= warmup:
                times.append(dt)
            if not torch.isfinite(out).all():
                print(f"warning: {run['model']} {backend}: non-finite output", file=sys.stderr)
            del out
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    return times, peak


def write_json(path, env, rows):
    if path:
        with open(path + ".tmp", "w") as fh:
            json.dump({"environment": env, "rows": rows}, fh, indent=1)
        os.replace(path + ".tmp", path)


def environment(device):
    import torch

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": str(device),
    }
    try:
        import diffusers

        env["diffusers"] = diffusers.__version__
    except Exception:
        env["diffusers"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    else:
        env["gpu"] = None
        env["cpu_threads"] = torch.get_num_threads()
    return env


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--models", default="a14b,5b",
                    help="comma-separated MODEL[:WxH[:FRAMES]]; MODEL is a14b (t2v-a14b, default "
                         "1280x720, 81 frames: latents 16x21x90x160) or 5b (ti2v-5b, default "
                         "1280x704, 121 frames: latents 48x31x44x80) (default: %(default)s)")
    ap.add_argument("--backends", default="default,cudnn",
                    help="comma-separated attention backends: " + ", ".join(BACKENDS) +
                         " (default: %(default)s; flash is optional)")
    ap.add_argument("--steps", type=int, default=3, help="timed CFG steps per row (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed CFG steps before them, per row, at least 1 (default: %(default)s)")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--seed", type=int, default=0, help="inputs' seed (default: %(default)s)")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke test: a 2-layer, width-64 model at latents 4x3x8x12 with 16 text "
                         "tokens, for each --models entry (runs on CPU in seconds)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows and environment as JSON")
    ap.add_argument("--no-header", action="store_true", help="print the table rows only")
    args = ap.parse_args()
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be at least 1")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in BACKENDS:
            ap.error(f"unknown backend '{b}' ({', '.join(BACKENDS)})")
    runs = parse_models(args.models, args.tiny)

    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    env = environment(device)
    print(
        "<!-- torch {torch} (CUDA {torch_cuda}, cuDNN {cudnn}), diffusers {diffusers}, "
        "{where} -->".format(where=env["gpu"] or f"CPU, {env.get('cpu_threads')} threads", **env),
        flush=True,
    )
    if not args.no_header:
        print("| model | size | frames | tokens | implementation | attention | s/step (2 CFG calls) "
              "| min | peak GiB |")
        print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for run in runs:
        t0 = time.perf_counter()
        model = build_model(run["config"], device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        params = sum(p.numel() for p in model.parameters())
        build_s = time.perf_counter() - t0
        print(f"<!-- {run['model']}: {params / 1e6:,.2f}M parameters built in {build_s:.1f} s "
              f"on {device} -->", flush=True)
        for backend in backends:
            label = backend
            if backend == "default":
                label = "default: sdpa " + (default_kernel(run, device) if device.type == "cuda"
                                           else "cpu")
            row = dict(
                model=run["model"], size=run["size"], frames=run["frames"], tokens=run["tokens"],
                latents=run["latents"], backend=backend, attention=label,
                implementation="diffusers", parameters=params, warmup=args.warmup,
            )
            if backend in ("cudnn", "efficient") and device.type != "cuda":
                row.update(skipped=f"{backend} attention runs on CUDA only")
                print(f"<!-- {run['model']} {backend}: skipped on {device} (CUDA only) -->",
                      flush=True)
                rows.append(row)
                write_json(args.json, env, rows)
                continue
            try:
                times, peak = time_run(model, run, backend, device, args.warmup, args.steps,
                                       args.seed)
                row.update(per_step=times, seconds=sum(times) / len(times), min_seconds=min(times),
                           peak_bytes=peak)
                pk = f"{peak / 2**30:.1f}" if peak is not None else "-"
                print(f"| {run['model']} | {run['size']} | {run['frames']} | {run['tokens']} "
                      f"| diffusers | {label} | {row['seconds']:.3f} | {row['min_seconds']:.3f} "
                      f"| {pk} |", flush=True)
            except Exception as e:
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
                row.update(error=msg)
                print(f"| {run['model']} | {run['size']} | {run['frames']} | {run['tokens']} "
                      f"| diffusers | {label} | failed | - | - |", flush=True)
                print(f"<!-- {run['model']} {backend}: {msg} -->", flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            write_json(args.json, env, rows)  # after every row: a timeout keeps what was measured
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    write_json(args.json, env, rows)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
