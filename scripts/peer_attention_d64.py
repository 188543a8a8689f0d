#!/usr/bin/env python3
"""Peers of the wgmma kernel at head dim 64 (SmolLM2, Llama-3.2-1B, Qwen2.5-0.5B have it):
PyTorch SDPA's FlashAttention-2 and cuDNN backends in BF16, and cuDNN's FP8 attention through
cudnn-frontend when its wheel is importable. The shapes are `bench_gpu`'s head-dim-64 list in
`evals/results/wgmma_d64_h100/README.md`; run both in one device command.

Prints one line per (shape, backend): milliseconds (median of CUDA-event timings after
warm-up) and TFLOP/s (4·b·hq·sq·sk·d, halved for causal). `--json FILE` writes the rows.

  python3 scripts/peer_attention_d64.py [--json peers.json]
  PYTHONPATH=<site with cudnn-frontend> python3 scripts/peer_attention_d64.py   # + cuDNN FP8
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [
    # name, b, hq, hkv, s, d, causal
    ("smollm2_135m_4k_causal", 1, 9, 3, 4096, 64, True),
    ("llama32_1b_4k_causal", 1, 32, 8, 4096, 64, True),
    ("llama32_1b_32k_causal", 1, 32, 8, 32768, 64, True),
    ("b4_h32_s8k_d64", 4, 32, 32, 8192, 64, False),
    ("b1_h24_s27280_d64", 1, 24, 24, 27280, 64, False),
]


def timed(fn, iters, warm):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def flops(b, hq, s, d, causal):
    return 4 * b * hq * s * s * d * (0.5 if causal else 1.0)


def sdpa(b, hq, hkv, s, d, causal, backend, iters):
    q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel([backend]):
        return timed(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv),
            iters,
            3,
        )


def cudnn_fp8(b, hq, hkv, s, d, causal, iters):
    import cudnn  # cudnn-frontend

    qd, kd = [b, hq, s, d], [b, hkv, s, d]
    qs, ks = [hq * s * d, s * d, d, 1], [hkv * s * d, s * d, d, 1]
    f8 = cudnn.data_type.FP8_E4M3
    q = torch.randn(qd, device="cuda").to(torch.float8_e4m3fn)
    k = torch.randn(kd, device="cuda").to(torch.float8_e4m3fn)
    v = torch.randn(kd, device="cuda").to(torch.float8_e4m3fn)
    o = torch.empty(qd, device="cuda", dtype=torch.uint8)
    one = torch.ones(1, 1, 1, 1, device="cuda")
    amax = [torch.zeros(1, 1, 1, 1, device="cuda") for _ in range(2)]
    g = cudnn.pygraph(
        io_data_type=f8,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    tq = g.tensor(name="q", dim=qd, stride=qs, data_type=f8)
    tk = g.tensor(name="k", dim=kd, stride=ks, data_type=f8)
    tv = g.tensor(name="v", dim=kd, stride=ks, data_type=f8)
    unit = dict(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT)
    sc = [g.tensor(name=n, **unit) for n in ("dq", "dk", "dv", "ds", "ss", "so")]
    to, _, ta, tb = g.sdpa_fp8(
        q=tq, k=tk, v=tv, descale_q=sc[0], descale_k=sc[1], descale_v=sc[2], descale_s=sc[3],
        scale_s=sc[4], scale_o=sc[5], generate_stats=False, attn_scale=d**-0.5,
        use_causal_mask=causal,
    )
    to.set_output(True).set_dim(qd).set_stride(qs).set_data_type(f8)
    for t in (ta, tb):
        t.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(
            cudnn.data_type.FLOAT
        )
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    ws = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)
    pack = {tq: q, tk: k, tv: v, to: o, ta: amax[0], tb: amax[1]}
    pack.update({t: one for t in sc})
    return timed(lambda: g.execute(pack, ws), iters, 3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--iters", type=int, default=20, help="timed runs per shape and backend (median)")
    args = ap.parse_args()
    rows = []
    for name, b, hq, hkv, s, d, causal in SHAPES:
        runs = [
            ("sdpa_flash_bf16", lambda: sdpa(b, hq, hkv, s, d, causal, SDPBackend.FLASH_ATTENTION, args.iters)),
            ("sdpa_cudnn_bf16", lambda: sdpa(b, hq, hkv, s, d, causal, SDPBackend.CUDNN_ATTENTION, args.iters)),
            ("cudnn_fp8", lambda: cudnn_fp8(b, hq, hkv, s, d, causal, args.iters)),
        ]
        for backend, fn in runs:
            try:
                ms = fn()
                row = dict(shape=name, backend=backend, ms=ms, tflops=flops(b, hq, s, d, causal) / ms / 1e9)
                print(f"{name:26s} {backend:16s} {ms:9.3f} ms {row['tflops']:7.1f} TFLOP/s", flush=True)
            except Exception as e:  # a backend this torch/cuDNN lacks: say so, keep going
                row = dict(shape=name, backend=backend, error=repr(e)[:300])
                print(f"{name:26s} {backend:16s} unavailable: {row['error']}", flush=True)
            rows.append(row)
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
