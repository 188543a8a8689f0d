#!/usr/bin/env python3
"""Oracle values for mxattn's video fidelity metrics (src/models/wan/fidelity.rs).

Makes two small RGB8 videos (a smooth moving pattern, and the same with noise and a brightness
drift), then records, per frame, PSNR (skimage.metrics.peak_signal_noise_ratio, data_range 255)
and SSIM on BT.601 luma (skimage.metrics.structural_similarity with gaussian_weights=True,
sigma=1.5, use_sample_covariance=False, data_range=255), the flicker series (mean absolute
difference of consecutive frames) of each video and their Pearson correlation (numpy.corrcoef).

Writes crates/wan/tests/fixtures/wan/fidelity/{videos.safetensors, expected.json} (run from the repo root).
Set-up:  python3 -m venv .venv-py && .venv-py/bin/pip install numpy scikit-image safetensors
"""

import json
import os

import numpy as np
import skimage
from safetensors.numpy import save_file
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

OUT = "crates/wan/tests/fixtures/wan/fidelity"
F, H, W = 5, 24, 32


def main():
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
    ref = np.zeros((F, H, W, 3), np.uint8)
    test = np.zeros((F, H, W, 3), np.uint8)
    for f in range(F):
        base = np.stack(
            [
                128 + 100 * np.sin((xx + 3 * f) / 5.0),
                128 + 90 * np.cos((yy - 2 * f) / 4.0),
                128 + 60 * np.sin((xx + yy + f * f) / 7.0),
            ],
            -1,
        )
        ref[f] = np.clip(np.round(base), 0, 255).astype(np.uint8)
        noisy = base + rng.normal(0, 6 + 3 * f, base.shape) + 4 * f
        test[f] = np.clip(np.round(noisy), 0, 255).astype(np.uint8)
    test[2] = ref[2]  # one identical frame: PSNR +inf, SSIM 1

    def luma(x):
        x = x.astype(np.float64)
        return 0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]

    psnr, ssim = [], []
    for f in range(F):
        p = peak_signal_noise_ratio(ref[f], test[f], data_range=255)
        psnr.append(None if np.isinf(p) else float(p))
        ssim.append(
            float(
                structural_similarity(
                    luma(ref[f]),
                    luma(test[f]),
                    gaussian_weights=True,
                    sigma=1.5,
                    use_sample_covariance=False,
                    data_range=255,
                )
            )
        )

    def flicker(v):
        v = v.astype(np.int64)
        return [float(np.abs(v[i + 1] - v[i]).mean()) for i in range(len(v) - 1)]

    fr, ft = flicker(ref), flicker(test)
    os.makedirs(OUT, exist_ok=True)
    save_file({"reference": ref, "test": test}, os.path.join(OUT, "videos.safetensors"))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(
            {
                "skimage": skimage.__version__,
                "numpy": np.__version__,
                "psnr": psnr,
                "ssim": ssim,
                "flicker_reference": fr,
                "flicker_test": ft,
                "temporal_correlation": float(np.corrcoef(ft, fr)[0, 1]),
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
