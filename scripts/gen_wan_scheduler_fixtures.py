#!/usr/bin/env python3
"""Parity fixtures for mxattn's Wan schedulers, made with diffusers' UniPCMultistepScheduler
(as the Wan2.x diffusers repos configure it) and FlowMatchEulerDiscreteScheduler.

Writes, under crates/wan/tests/fixtures/wan/scheduler/ (run from the repository root):

  scheduler_config.json   the Wan UniPC config as diffusers saves it (flow_shift 3.0, as in the
                          A14B repos)
  expected.safetensors    for each (steps, shift) in SCHEDULES:
                            `unipc.n{steps}_s{shift}.timesteps` i64, `.sigmas` f32 [steps + 1]
                            `euler.n{steps}_s{shift}.timesteps` f32, `.sigmas` f32 [steps + 1]
                          for each trajectory in TRAJECTORIES (6 steps):
                            `<name>.sample0` [1,4,2,3,3] f32, the initial sample
                            `<name>.outputs` [6,1,4,2,3,3] the "model outputs", fixed random
                            `<name>.samples` [6,1,4,2,3,3] f32, the sample after each step
                            `<name>.timesteps`, `<name>.sigmas`
  expected.json           versions, the schedule list, each trajectory's scheduler kwargs, and
                          the high/low-noise expert split of the UniPC timesteps for SPLITS

With `--wan-repo DIR` (a checkout of https://github.com/Wan-Video/Wan2.2) it also writes
  wan_original.safetensors  the original `FlowUniPCMultistepScheduler` (wan/utils/
                          fm_solvers_unipc.py, built as wan/text2video.py builds it: shift 1 at
                          construction, the shift passed to set_timesteps):
                            `n{steps}_s{shift}.timesteps` i64, `.sigmas` f32 for SCHEDULES, and
                            a 6-step trajectory `traj.{sample0,outputs,samples}` with shift 12
Without it, that file is left as it is.

The trajectories call `scheduler.step(outputs[i], timesteps[i], sample)` the way
`pipeline_wan.py` does. Outputs are stored in the dtype they were passed in (`unipc_bf16` uses
bfloat16 model outputs with a float32 sample, as the pipeline does with a bf16 transformer).

Set-up:  python3 -m venv .venv-py && .venv-py/bin/pip install torch diffusers safetensors numpy
Run:     .venv-py/bin/python scripts/gen_wan_scheduler_fixtures.py [--wan-repo DIR]
"""

import argparse
import importlib.util
import json
import os

import diffusers
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler
from safetensors.torch import save_file

OUT = os.path.join("crates", "wan", "tests", "fixtures", "wan", "scheduler")

# What scripts/convert_wan_to_diffusers.py gives the Wan2.x repos (flow_shift varies).
WAN_UNIPC = dict(
    num_train_timesteps=1000,
    prediction_type="flow_prediction",
    use_flow_sigmas=True,
    flow_shift=3.0,
    solver_order=2,
    solver_type="bh2",
    predict_x0=True,
    lower_order_final=True,
    final_sigmas_type="zero",
    disable_corrector=[],
)

SCHEDULES = [(1, 5.0), (2, 3.0), (4, 3.0), (10, 5.0), (40, 12.0), (40, 5.0), (50, 3.0), (50, 12.0)]

# (steps, shift, boundary_ratio): T2V-A14B original settings, I2V-A14B, the diffusers defaults.
SPLITS = [(40, 12.0, 0.875), (40, 5.0, 0.9), (50, 3.0, 0.875), (40, 3.0, 0.875), (4, 3.0, 0.875)]

STEPS = 6
SHAPE = (1, 4, 2, 3, 3)

TRAJECTORIES = {
    # name: (kind, scheduler kwargs over WAN_UNIPC (unipc) or {} (euler), output dtype, seed)
    "unipc_s5": ("unipc", dict(flow_shift=5.0), torch.float32, 1),
    "unipc_s12": ("unipc", dict(flow_shift=12.0), torch.float32, 2),
    "unipc_s3_bf16": ("unipc", dict(flow_shift=3.0), torch.bfloat16, 3),
    # With a final sigma of zero, bh1 and a second-order last step divide by an infinite h and
    # give NaN in diffusers; these two end at sigma_min instead.
    "unipc_o3_bh1": (
        "unipc",
        dict(flow_shift=5.0, solver_order=3, solver_type="bh1", final_sigmas_type="sigma_min"),
        torch.float32,
        4,
    ),
    "unipc_nolof_dc": (
        "unipc",
        dict(flow_shift=5.0, lower_order_final=False, disable_corrector=[0, 3], final_sigmas_type="sigma_min"),
        torch.float32,
        5,
    ),
    "unipc_sigma_min": ("unipc", dict(flow_shift=5.0, final_sigmas_type="sigma_min"), torch.float32, 6),
    "euler_s5": ("euler", dict(shift=5.0), torch.float32, 7),
    "euler_s12": ("euler", dict(shift=12.0), torch.float32, 8),
}


def unipc(**kw):
    return UniPCMultistepScheduler(**{**WAN_UNIPC, **kw})


def euler(**kw):
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, **kw)


def key(steps, shift):
    return f"n{steps}_s{shift:g}"


def wan_original(repo):
    """The original Wan2.2 UniPC schedules and a trajectory."""
    path = os.path.join(repo, "wan", "utils", "fm_solvers_unipc.py")
    spec = importlib.util.spec_from_file_location("fm_solvers_unipc", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def make(steps, shift):
        s = mod.FlowUniPCMultistepScheduler(num_train_timesteps=1000, shift=1, use_dynamic_shifting=False)
        s.set_timesteps(steps, device="cpu", shift=shift)
        return s

    tensors = {}
    for steps, shift in SCHEDULES:
        s = make(steps, shift)
        tensors[f"{key(steps, shift)}.timesteps"] = s.timesteps.clone()
        tensors[f"{key(steps, shift)}.sigmas"] = s.sigmas.clone()
    g = torch.Generator().manual_seed(9)
    sample = torch.randn(SHAPE, generator=g)
    outputs = torch.randn((STEPS, *SHAPE), generator=g)
    s = make(STEPS, 12.0)
    x = sample
    samples = []
    for i, t in enumerate(s.timesteps):
        x = s.step(outputs[i], t, x, return_dict=False)[0]
        samples.append(x.clone())
    tensors["traj.sample0"] = sample
    tensors["traj.outputs"] = outputs
    tensors["traj.samples"] = torch.stack(samples)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "wan_original.safetensors"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wan-repo", help="a Wan2.2 checkout, for wan_original.safetensors")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if args.wan_repo:
        wan_original(args.wan_repo)
    unipc(flow_shift=3.0).save_config(OUT)
    tensors = {}
    for steps, shift in SCHEDULES:
        u = unipc(flow_shift=shift)
        u.set_timesteps(steps)
        tensors[f"unipc.{key(steps, shift)}.timesteps"] = u.timesteps.clone()
        tensors[f"unipc.{key(steps, shift)}.sigmas"] = u.sigmas.clone()
        e = euler(shift=shift)
        e.set_timesteps(steps)
        tensors[f"euler.{key(steps, shift)}.timesteps"] = e.timesteps.clone()
        tensors[f"euler.{key(steps, shift)}.sigmas"] = e.sigmas.clone()

    # pipeline_wan.py: `transformer` (high noise) runs while t >= boundary_ratio * 1000.
    splits = []
    for steps, shift, ratio in SPLITS:
        u = unipc(flow_shift=shift)
        u.set_timesteps(steps)
        high = int((u.timesteps >= ratio * u.config.num_train_timesteps).sum())
        splits.append(dict(steps=steps, shift=shift, boundary_ratio=ratio, high=high, low=steps - high))

    meta = {}
    for name, (kind, kw, dtype, seed) in TRAJECTORIES.items():
        g = torch.Generator().manual_seed(seed)
        sample = torch.randn(SHAPE, generator=g, dtype=torch.float32)
        outputs = torch.randn((STEPS, *SHAPE), generator=g, dtype=torch.float32).to(dtype)
        sched = unipc(**kw) if kind == "unipc" else euler(**kw)
        sched.set_timesteps(STEPS)
        tensors[f"{name}.sample0"] = sample.clone()
        tensors[f"{name}.outputs"] = outputs.clone()
        tensors[f"{name}.timesteps"] = sched.timesteps.clone()
        tensors[f"{name}.sigmas"] = sched.sigmas.clone()
        x = sample
        samples = []
        for i, t in enumerate(sched.timesteps):
            x = sched.step(outputs[i], t, x, return_dict=False)[0]
            samples.append(x.float().clone())
        tensors[f"{name}.samples"] = torch.stack(samples)
        assert tensors[f"{name}.samples"].isfinite().all(), name
        meta[name] = dict(kind=kind, kwargs=kw, output_dtype=str(dtype), seed=seed)

    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "expected.safetensors"))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(
            dict(
                diffusers=diffusers.__version__,
                torch=torch.__version__,
                wan_unipc=WAN_UNIPC,
                schedules=[key(n, s) for n, s in SCHEDULES],
                trajectories=meta,
                splits=splits,
            ),
            f,
            indent=1,
        )
        f.write("\n")


if __name__ == "__main__":
    main()
