//! Offline fidelity of a video run against a reference run of the same seed and prompt
//! (models.md §C2): latent rel-L2 and cosine, PSNR and SSIM per frame, and temporal
//! consistency. All of it is arithmetic on the two outputs, no pretrained network.
//!
//! * PSNR on the RGB8 frames, peak 255; identical frames give `+inf`.
//! * SSIM on luma `Y = 0.299 R + 0.587 G + 0.114 B` (BT.601, unrounded), with the Gaussian
//!   window of Wang et al. (σ 1.5, 11 taps), `K1 = 0.01`, `K2 = 0.03`, `L = 255`, population
//!   (co)variances, averaged over the pixels whose window lies inside the frame. These are
//!   the settings of `skimage.metrics.structural_similarity(gaussian_weights=True,
//!   sigma=1.5, use_sample_covariance=False, data_range=255)`, which the tests check against.
//! * Temporal consistency: the flicker series of a video is the mean absolute difference of
//!   consecutive frames (one value per frame pair); the two runs are compared by the Pearson
//!   correlation of their series, so a run whose motion follows the reference scores near 1.

use candle_core::{bail, DType, Result, Tensor};
use mxattn_video::RgbFrames;

/// Relative L2 distance `‖a − b‖ / ‖b‖` (b the reference), in f64.
pub fn rel_l2(a: &Tensor, reference: &Tensor) -> Result<f64> {
    let (a, b) = flat_pair(a, reference)?;
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(&b) {
        num += (x - y) * (x - y);
        den += y * y;
    }
    if den == 0.0 {
        return Ok(if num == 0.0 { 0.0 } else { f64::INFINITY });
    }
    Ok((num / den).sqrt())
}

/// Cosine similarity of two tensors seen as vectors, in f64 (1 for two zero tensors).
pub fn cosine(a: &Tensor, b: &Tensor) -> Result<f64> {
    let (a, b) = flat_pair(a, b)?;
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(&b) {
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    Ok(match (aa == 0.0, bb == 0.0) {
        (true, true) => 1.0,
        (true, false) | (false, true) => 0.0,
        _ => ab / (aa.sqrt() * bb.sqrt()),
    })
}

fn flat_pair(a: &Tensor, b: &Tensor) -> Result<(Vec<f64>, Vec<f64>)> {
    if a.dims() != b.dims() {
        bail!("fidelity: shapes differ, {:?} vs {:?}", a.dims(), b.dims());
    }
    let f = |t: &Tensor| -> Result<Vec<f64>> {
        let v = t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        if v.iter().any(|x| !x.is_finite()) {
            bail!("fidelity: the tensor holds NaN or Inf");
        }
        Ok(v)
    };
    Ok((f(a)?, f(b)?))
}

fn check_pair(a: &RgbFrames, b: &RgbFrames) -> Result<()> {
    if (a.width, a.height, a.len()) != (b.width, b.height, b.len()) {
        bail!(
            "fidelity: videos differ in size: {}x{}x{} frames vs {}x{}x{}",
            a.width,
            a.height,
            a.len(),
            b.width,
            b.height,
            b.len()
        );
    }
    Ok(())
}

/// PSNR in dB of one RGB8 frame against another (`+inf` when equal).
pub fn psnr_u8(a: &[u8], b: &[u8]) -> Result<f64> {
    if a.len() != b.len() || a.is_empty() {
        bail!("psnr: frames of {} and {} bytes", a.len(), b.len());
    }
    let se: u64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| {
            let d = x as i64 - y as i64;
            (d * d) as u64
        })
        .sum();
    if se == 0 {
        return Ok(f64::INFINITY);
    }
    let mse = se as f64 / a.len() as f64;
    Ok(10.0 * (255.0f64 * 255.0 / mse).log10())
}

/// Luma plane of a packed RGB8 frame.
pub fn luma(rgb: &[u8]) -> Vec<f64> {
    rgb.chunks_exact(3)
        .map(|p| 0.299 * p[0] as f64 + 0.587 * p[1] as f64 + 0.114 * p[2] as f64)
        .collect()
}

const SSIM_SIGMA: f64 = 1.5;
const SSIM_RADIUS: usize = 5; // 11 taps: skimage's int(3.5 σ + 0.5)

fn gaussian_taps() -> [f64; 2 * SSIM_RADIUS + 1] {
    let mut w = [0f64; 2 * SSIM_RADIUS + 1];
    for (i, t) in w.iter_mut().enumerate() {
        let x = i as f64 - SSIM_RADIUS as f64;
        *t = (-x * x / (2.0 * SSIM_SIGMA * SSIM_SIGMA)).exp();
    }
    let s: f64 = w.iter().sum();
    w.iter_mut().for_each(|t| *t /= s);
    w
}

/// Separable Gaussian filter, "valid" part only: `[(h−10) · (w−10)]`.
fn blur_valid(x: &[f64], w: usize, h: usize, taps: &[f64]) -> Vec<f64> {
    let r = SSIM_RADIUS;
    let (vw, vh) = (w - 2 * r, h - 2 * r);
    let mut rows = vec![0f64; h * vw];
    for y in 0..h {
        for xo in 0..vw {
            rows[y * vw + xo] = taps
                .iter()
                .enumerate()
                .map(|(i, t)| t * x[y * w + xo + i])
                .sum();
        }
    }
    let mut out = vec![0f64; vh * vw];
    for yo in 0..vh {
        for xo in 0..vw {
            out[yo * vw + xo] = taps
                .iter()
                .enumerate()
                .map(|(i, t)| t * rows[(yo + i) * vw + xo])
                .sum();
        }
    }
    out
}

/// Mean SSIM of two luma planes `w × h` (both at least 11 × 11).
pub fn ssim_plane(a: &[f64], b: &[f64], w: usize, h: usize) -> Result<f64> {
    let n = 2 * SSIM_RADIUS + 1;
    if w < n || h < n {
        bail!("ssim: frames must be at least {n}x{n}, got {w}x{h}");
    }
    if a.len() != w * h || b.len() != w * h {
        bail!("ssim: planes are not {w}x{h}");
    }
    let taps = gaussian_taps();
    let prod = |x: &[f64], y: &[f64]| -> Vec<f64> { x.iter().zip(y).map(|(p, q)| p * q).collect() };
    let mu_a = blur_valid(a, w, h, &taps);
    let mu_b = blur_valid(b, w, h, &taps);
    let aa = blur_valid(&prod(a, a), w, h, &taps);
    let bb = blur_valid(&prod(b, b), w, h, &taps);
    let ab = blur_valid(&prod(a, b), w, h, &taps);
    let (c1, c2) = ((0.01f64 * 255.0).powi(2), (0.03f64 * 255.0).powi(2));
    let mut sum = 0f64;
    for i in 0..mu_a.len() {
        let (ma, mb) = (mu_a[i], mu_b[i]);
        let (va, vb, cov) = (aa[i] - ma * ma, bb[i] - mb * mb, ab[i] - ma * mb);
        sum +=
            ((2.0 * ma * mb + c1) * (2.0 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2));
    }
    Ok(sum / mu_a.len() as f64)
}

/// SSIM of one RGB8 frame against another, on luma.
pub fn ssim_u8(a: &[u8], b: &[u8], w: usize, h: usize) -> Result<f64> {
    ssim_plane(&luma(a), &luma(b), w, h)
}

/// Mean absolute difference of consecutive frames, one value per pair (empty for < 2 frames).
pub fn flicker_series(v: &RgbFrames) -> Vec<f64> {
    v.frames
        .windows(2)
        .map(|p| {
            let s: u64 = p[0]
                .iter()
                .zip(&p[1])
                .map(|(&x, &y)| (x as i64 - y as i64).unsigned_abs())
                .sum();
            s as f64 / p[0].len() as f64
        })
        .collect()
}

/// Pearson correlation; `None` for fewer than 2 values or a constant series.
pub fn pearson(x: &[f64], y: &[f64]) -> Option<f64> {
    if x.len() != y.len() || x.len() < 2 {
        return None;
    }
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0f64, 0f64, 0f64);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    if sxx == 0.0 || syy == 0.0 {
        return None;
    }
    Some(sxy / (sxx * syy).sqrt())
}

/// Per-frame and temporal fidelity of `test` against `reference`.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoFidelity {
    pub psnr: Vec<f64>,
    pub ssim: Vec<f64>,
    /// Flicker series of the reference and of the test video.
    pub flicker_reference: Vec<f64>,
    pub flicker_test: Vec<f64>,
    /// Pearson correlation of the two flicker series (`None` when undefined).
    pub temporal_correlation: Option<f64>,
}

impl VideoFidelity {
    pub fn compare(test: &RgbFrames, reference: &RgbFrames) -> Result<Self> {
        check_pair(test, reference)?;
        if test.is_empty() {
            bail!("fidelity: the videos have no frames");
        }
        let (w, h) = (test.width, test.height);
        let psnr = test
            .frames
            .iter()
            .zip(&reference.frames)
            .map(|(a, b)| psnr_u8(a, b))
            .collect::<Result<Vec<_>>>()?;
        let ssim = test
            .frames
            .iter()
            .zip(&reference.frames)
            .map(|(a, b)| ssim_u8(a, b, w, h))
            .collect::<Result<Vec<_>>>()?;
        let flicker_reference = flicker_series(reference);
        let flicker_test = flicker_series(test);
        let temporal_correlation = pearson(&flicker_test, &flicker_reference);
        Ok(Self {
            psnr,
            ssim,
            flicker_reference,
            flicker_test,
            temporal_correlation,
        })
    }

    /// Mean PSNR over frames, with identical frames counted at `cap` dB (so one identical
    /// frame does not make the mean infinite).
    pub fn mean_psnr(&self, cap: f64) -> f64 {
        mean(self.psnr.iter().map(|p| p.min(cap)))
    }

    pub fn mean_ssim(&self) -> f64 {
        mean(self.ssim.iter().copied())
    }
}

// `compare` refuses empty videos, so n > 0 here
fn mean(it: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = it.fold((0f64, 0usize), |(s, n), x| (s + x, n + 1));
    s / n.max(1) as f64
}
