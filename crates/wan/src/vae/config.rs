//! The `vae/config.json` of diffusers' `AutoencoderKLWan`, as far as the decoder needs it.
//!
//! Missing fields take diffusers' defaults (the Wan2.1 VAE). Fields of the encoder only
//! (`base_dim`, `in_channels`, `attn_scales`, `dropout`) are read when present and not used.
//! The Wan2.2 files carry `"clip_output": false`, which diffusers ignores (its decoder always
//! clamps to [-1, 1]); so does this port.

use candle_core::Result;
use serde::Deserialize;
use std::path::Path;

/// Hyper-parameters of an `AutoencoderKLWan`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct VaeConfig {
    /// Encoder width (the decoder's too unless `decoder_base_dim` is set).
    pub base_dim: usize,
    pub decoder_base_dim: Option<usize>,
    /// Latent channels.
    pub z_dim: usize,
    pub dim_mult: Vec<usize>,
    pub num_res_blocks: usize,
    /// Per encoder stage; the decoder upsamples time in the reverse order.
    #[serde(rename = "temperal_downsample")]
    pub temporal_downsample: Vec<bool>,
    pub latents_mean: Vec<f64>,
    pub latents_std: Vec<f64>,
    /// Residual up-blocks with the DupUp3D shortcut (Wan2.2).
    pub is_residual: bool,
    pub in_channels: usize,
    pub out_channels: usize,
    /// Pixel (un)patchify factor (Wan2.2: 2); `None` or 1 = none.
    pub patch_size: Option<usize>,
    pub scale_factor_temporal: Option<usize>,
    pub scale_factor_spatial: Option<usize>,
}

const WAN21_MEAN: [f64; 16] = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
    -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
];
const WAN21_STD: [f64; 16] = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
    1.6382, 1.1253, 2.8251, 1.9160,
];
// diffusers `scripts/convert_wan_to_diffusers.py`, `vae22_diffusers_config`.
const WAN22_MEAN: [f64; 48] = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813,
    0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108,
    -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313,
    -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944,
    0.3573, -0.0548, -0.1681, -0.0667,
];
const WAN22_STD: [f64; 48] = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
];

impl Default for VaeConfig {
    /// diffusers' defaults: the Wan2.1 VAE.
    fn default() -> Self {
        Self::wan21()
    }
}

impl VaeConfig {
    /// The Wan2.1 VAE (T2V-A14B, I2V-A14B): z 16, 4×8×8, base_dim 96.
    pub fn wan21() -> Self {
        Self {
            base_dim: 96,
            decoder_base_dim: None,
            z_dim: 16,
            dim_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            temporal_downsample: vec![false, true, true],
            latents_mean: WAN21_MEAN.to_vec(),
            latents_std: WAN21_STD.to_vec(),
            is_residual: false,
            in_channels: 3,
            out_channels: 3,
            patch_size: None,
            scale_factor_temporal: Some(4),
            scale_factor_spatial: Some(8),
        }
    }

    /// The Wan2.2 VAE (TI2V-5B): z 48, 4×16×16, decoder_base_dim 256, residual up-blocks,
    /// 12 channels un-patchified by 2.
    pub fn wan22() -> Self {
        Self {
            base_dim: 160,
            decoder_base_dim: Some(256),
            z_dim: 48,
            dim_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            temporal_downsample: vec![false, true, true],
            latents_mean: WAN22_MEAN.to_vec(),
            latents_std: WAN22_STD.to_vec(),
            is_residual: true,
            in_channels: 12,
            out_channels: 12,
            patch_size: Some(2),
            scale_factor_temporal: Some(4),
            scale_factor_spatial: Some(16),
        }
    }

    /// Reads and checks a `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let cfg: Self = mxattn_checkpoint::read_json(path, "an AutoencoderKLWan config")?;
        cfg.validate()
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))?;
        Ok(cfg)
    }

    /// The decoder's base width.
    pub fn decoder_dim(&self) -> usize {
        self.decoder_base_dim.unwrap_or(self.base_dim)
    }

    /// The pixel patch size (1 = none).
    pub fn patch(&self) -> usize {
        self.patch_size.unwrap_or(1).max(1)
    }

    /// Channels of the decoded video (3 for both released VAEs).
    pub fn video_channels(&self) -> usize {
        self.out_channels / (self.patch() * self.patch())
    }

    /// Whether decoder stage `i` (of `dim_mult.len()`) upsamples time; the last never does.
    pub fn temporal_upsample(&self, i: usize) -> bool {
        let n = self.dim_mult.len();
        let t = &self.temporal_downsample;
        // diffusers reverses the encoder's list
        i + 1 < n && i < t.len() && t[t.len() - 1 - i]
    }

    /// Frames one latent frame after the first becomes (4 for both released VAEs).
    pub fn temporal_factor(&self) -> usize {
        1 << (0..self.dim_mult.len())
            .filter(|&i| self.temporal_upsample(i))
            .count()
    }

    /// Pixels per latent pixel along height and width (8 for Wan2.1, 16 for Wan2.2).
    pub fn spatial_factor(&self) -> usize {
        (1 << (self.dim_mult.len() - 1)) * self.patch()
    }

    /// Decoded frames of `latent_frames` latent frames: the first latent frame gives one
    /// frame, each later one `temporal_factor()` (21 → 81 for the released VAEs).
    pub fn num_frames(&self, latent_frames: usize) -> usize {
        if latent_frames == 0 {
            0
        } else {
            1 + self.temporal_factor() * (latent_frames - 1)
        }
    }

    /// Channel widths from the decoder input to its last stage: `[d·m_last, d·m_last, …, d·m_0]`.
    pub fn decoder_dims(&self) -> Vec<usize> {
        let d = self.decoder_dim();
        let last = *self.dim_mult.last().unwrap_or(&1);
        std::iter::once(d * last)
            .chain(self.dim_mult.iter().rev().map(|m| d * m))
            .collect()
    }

    /// Channels of the mid block, hence the head dim of its single-head attention.
    pub fn mid_channels(&self) -> usize {
        self.decoder_dims()[0]
    }

    /// Checks everything the decoder relies on.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let n = self.dim_mult.len();
        if n < 1 {
            return Err("dim_mult is empty".into());
        }
        if self.z_dim == 0 || self.decoder_dim() == 0 || self.dim_mult.contains(&0) {
            return Err(format!(
                "z_dim ({}), the decoder base dim ({}) and dim_mult ({:?}) must be positive",
                self.z_dim,
                self.decoder_dim(),
                self.dim_mult
            ));
        }
        if self.temporal_downsample.len() + 1 < n {
            return Err(format!(
                "temperal_downsample has {} entries; dim_mult {:?} needs {}",
                self.temporal_downsample.len(),
                self.dim_mult,
                n - 1
            ));
        }
        if self.latents_mean.len() != self.z_dim || self.latents_std.len() != self.z_dim {
            return Err(format!(
                "latents_mean ({}) and latents_std ({}) must have z_dim = {} values",
                self.latents_mean.len(),
                self.latents_std.len(),
                self.z_dim
            ));
        }
        if let Some(i) = self
            .latents_std
            .iter()
            .position(|s| !s.is_finite() || *s <= 0.0)
        {
            return Err(format!(
                "latents_std[{i}] = {} is not a positive number",
                self.latents_std[i]
            ));
        }
        if let Some(i) = self.latents_mean.iter().position(|m| !m.is_finite()) {
            return Err(format!("latents_mean[{i}] is not finite"));
        }
        let p = self.patch();
        if self.out_channels == 0 || !self.out_channels.is_multiple_of(p * p) {
            return Err(format!(
                "out_channels ({}) must be a positive multiple of patch_size² ({})",
                self.out_channels,
                p * p
            ));
        }
        let dims = self.decoder_dims();
        for (i, d) in dims.iter().enumerate().take(n).skip(1) {
            // a non-residual upsampler halves the channels it passes on
            if !self.is_residual && !d.is_multiple_of(2) {
                return Err(format!(
                    "decoder stage {} has {d} channels; the upsampler halves them, so they must be even",
                    i - 1
                ));
            }
        }
        if self.is_residual {
            for i in 0..n - 1 {
                let (cin, cout) = (dims[i], dims[i + 1]);
                let ft = if self.temporal_upsample(i) { 2 } else { 1 };
                if !(cout * ft * 4).is_multiple_of(cin) {
                    return Err(format!(
                        "decoder stage {i}: the DupUp3D shortcut needs {cout}·{ft}·4 divisible by {cin}"
                    ));
                }
            }
        }
        if let Some(t) = self.scale_factor_temporal {
            if t != self.temporal_factor() {
                return Err(format!(
                    "scale_factor_temporal is {t}, but temperal_downsample {:?} gives {}",
                    self.temporal_downsample,
                    self.temporal_factor()
                ));
            }
        }
        if let Some(s) = self.scale_factor_spatial {
            if s != self.spatial_factor() {
                return Err(format!(
                    "scale_factor_spatial is {s}, but dim_mult {:?} and patch_size {p} give {}",
                    self.dim_mult,
                    self.spatial_factor()
                ));
            }
        }
        Ok(())
    }
}
