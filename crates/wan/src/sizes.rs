//! The video sizes and frame counts each Wan2.2 model supports, and the latent shapes they
//! give (models.md §A1, §A6).

use candle_core::{bail, Result};
use std::fmt;
use std::str::FromStr;

/// Which released Wan2.2 text-to-video model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WanVariant {
    /// T2V-A14B: two 14B experts, the Wan2.1 VAE (z 16, 4×8×8), 81 frames at 16 fps.
    T2vA14b,
    /// TI2V-5B: one dense model, the Wan2.2 VAE (z 48, 4×16×16), 121 frames at 24 fps.
    Ti2v5b,
}

impl WanVariant {
    /// `(width, height)` pairs of the released configs (`SUPPORTED_SIZES`).
    pub fn sizes(self) -> &'static [(usize, usize)] {
        match self {
            Self::T2vA14b => &[(1280, 720), (720, 1280), (832, 480), (480, 832)],
            Self::Ti2v5b => &[(1280, 704), (704, 1280)],
        }
    }

    pub fn default_size(self) -> (usize, usize) {
        match self {
            Self::T2vA14b => (1280, 720),
            Self::Ti2v5b => (1280, 704),
        }
    }

    pub fn default_frames(self) -> usize {
        match self {
            Self::T2vA14b => 81,
            Self::Ti2v5b => 121,
        }
    }

    pub fn fps(self) -> f64 {
        match self {
            Self::T2vA14b => 16.0,
            Self::Ti2v5b => 24.0,
        }
    }

    /// Latent channels.
    pub fn z_dim(self) -> usize {
        match self {
            Self::T2vA14b => 16,
            Self::Ti2v5b => 48,
        }
    }

    /// The VAE's spatial stride.
    pub fn spatial_stride(self) -> usize {
        match self {
            Self::T2vA14b => 8,
            Self::Ti2v5b => 16,
        }
    }

    /// The original release's sampler defaults: steps, shift, guidance (high-noise,
    /// low-noise) and the expert boundary (A14B only).
    pub fn sampler_defaults(self) -> SamplerDefaults {
        match self {
            Self::T2vA14b => SamplerDefaults {
                steps: 40,
                shift: 12.0,
                guidance_high: 4.0,
                guidance_low: 3.0,
                boundary_ratio: Some(0.875),
            },
            Self::Ti2v5b => SamplerDefaults {
                steps: 50,
                shift: 5.0,
                guidance_high: 5.0,
                guidance_low: 5.0,
                boundary_ratio: None,
            },
        }
    }

    /// The hub repository of the diffusers-layout release.
    pub fn repo(self) -> &'static str {
        match self {
            Self::T2vA14b => "Wan-AI/Wan2.2-T2V-A14B-Diffusers",
            Self::Ti2v5b => "Wan-AI/Wan2.2-TI2V-5B-Diffusers",
        }
    }
}

impl fmt::Display for WanVariant {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Self::T2vA14b => "t2v-a14b",
            Self::Ti2v5b => "ti2v-5b",
        })
    }
}

impl FromStr for WanVariant {
    type Err = candle_core::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "t2v-a14b" | "a14b" => Ok(Self::T2vA14b),
            "ti2v-5b" | "5b" => Ok(Self::Ti2v5b),
            _ => bail!("unknown Wan2.2 variant '{s}' (t2v-a14b or ti2v-5b)"),
        }
    }
}

/// Sampler settings of the original release.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerDefaults {
    pub steps: usize,
    pub shift: f64,
    pub guidance_high: f64,
    pub guidance_low: f64,
    pub boundary_ratio: Option<f64>,
}

/// Parses `WxH` (or `W*H`) and checks it against the variant's sizes. With `any_size`, any
/// size whose latent grid the patch embedding can take is accepted (tiny test models).
pub fn parse_size(text: &str, variant: WanVariant, any_size: bool) -> Result<(usize, usize)> {
    let parts: Vec<&str> = text.split(['x', 'X', '*']).map(str::trim).collect();
    let parsed = match parts.as_slice() {
        [w, h] => w.parse::<usize>().ok().zip(h.parse::<usize>().ok()),
        _ => None,
    };
    let Some((w, h)) = parsed else {
        bail!("size '{text}': expected WIDTHxHEIGHT, e.g. 1280x720");
    };
    let listed = variant.sizes();
    if !any_size && !listed.contains(&(w, h)) {
        let names: Vec<String> = listed.iter().map(|(w, h)| format!("{w}x{h}")).collect();
        bail!(
            "size {w}x{h} is not one {variant} supports ({})",
            names.join(", ")
        );
    }
    let m = variant.spatial_stride() * 2; // VAE stride times the 2×2 patch
    if w == 0 || h == 0 || w % m != 0 || h % m != 0 {
        bail!("size {w}x{h}: width and height must be positive multiples of {m} for {variant}");
    }
    Ok((w, h))
}

/// Checks a frame count (`4k + 1`, at least 1) and returns the latent frames `k + 1`.
pub fn latent_frames(frames: usize) -> Result<usize> {
    if frames == 0 || !(frames - 1).is_multiple_of(4) {
        bail!(
            "{frames} frames: the VAE makes 1 + 4k frames (e.g. 81 or 121); try {}",
            ((frames.max(1) - 1) / 4) * 4 + 1
        );
    }
    Ok((frames - 1) / 4 + 1)
}

/// `[1, z, F, H, W]` latent shape of a video.
pub fn latent_shape(
    variant: WanVariant,
    width: usize,
    height: usize,
    frames: usize,
) -> Result<(usize, usize, usize, usize, usize)> {
    let s = variant.spatial_stride();
    Ok((
        1,
        variant.z_dim(),
        latent_frames(frames)?,
        height / s,
        width / s,
    ))
}

/// Video tokens the transformer sees (`F · H/2 · W/2` of the latent grid).
pub fn tokens(shape: (usize, usize, usize, usize, usize)) -> usize {
    shape.2 * (shape.3 / 2) * (shape.4 / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_shapes() {
        // models.md §A6
        let a = latent_shape(WanVariant::T2vA14b, 1280, 720, 81).unwrap();
        assert_eq!(a, (1, 16, 21, 90, 160));
        assert_eq!(tokens(a), 75_600);
        let a = latent_shape(WanVariant::T2vA14b, 832, 480, 81).unwrap();
        assert_eq!(tokens(a), 32_760);
        let b = latent_shape(WanVariant::Ti2v5b, 1280, 704, 121).unwrap();
        assert_eq!(b, (1, 48, 31, 44, 80));
        assert_eq!(tokens(b), 27_280);
    }

    #[test]
    fn bad_sizes_and_frames() {
        assert!(parse_size("1280x720", WanVariant::Ti2v5b, false).is_err());
        assert!(parse_size("1280x704", WanVariant::Ti2v5b, false).is_ok());
        assert_eq!(
            parse_size("832*480", WanVariant::T2vA14b, false).unwrap(),
            (832, 480)
        );
        assert!(parse_size("1280", WanVariant::T2vA14b, false).is_err());
        assert!(parse_size("100x100", WanVariant::T2vA14b, true).is_err());
        assert!(parse_size("64x32", WanVariant::T2vA14b, true).is_ok());
        assert!(latent_frames(80).is_err());
        assert!(latent_frames(0).is_err());
        assert_eq!(latent_frames(1).unwrap(), 1);
        assert_eq!(latent_frames(121).unwrap(), 31);
        assert!("foo".parse::<WanVariant>().is_err());
        assert_eq!("A14B".parse::<WanVariant>().unwrap(), WanVariant::T2vA14b);
    }
}
