//! The causal 3-D VAE decoders of Wan2.1 (z 16, 4×8×8) and Wan2.2 (z 48, 4×16×16), as in
//! diffusers' `AutoencoderKLWan` (`src/diffusers/models/autoencoders/autoencoder_kl_wan.py`).
//!
//! Decoding runs one latent frame per call, each causal conv keeping the last
//! [`conv::CACHE_T`] frames of its input in a [`conv::FeatCache`]; the temporal upsamplers
//! skip the first chunk, so `F` latent frames give `1 + 4 (F − 1)` frames (21 → 81). Memory
//! is that of one chunk plus the cache, whatever the video length; [`WanVae::decode_chunks`]
//! hands each chunk's frames to the caller so that not even the whole video need be held.
//!
//! The mid block's attention goes through [`mxattn::attention::attention`] with the config an
//! [`AttnPolicy`] gives for [`VAE_MID_SITE`], except above [`mxattn::attention::MAX_HEAD_DIM`]
//! channels (the Wan2.2 VAE's 1024), where it falls back to exact attention composed from
//! candle ops ([`blocks::MidAttention`] explains why).
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use mxattn::attention::AttentionConfig;
//! use mxattn_wan::vae::{VaeConfig, WanVae};
//!
//! let mut cfg = VaeConfig::wan21();
//! cfg.base_dim = 4; // a tiny random VAE
//! let vae = WanVae::random(&cfg, DType::F32, &Device::Cpu, 0)?;
//! let z = Tensor::randn(0f32, 1.0, (1, 16, 3, 2, 2), &Device::Cpu)?; // [b, z, F, h, w]
//! let video = vae.decode(&z, &AttentionConfig::exact())?;
//! assert_eq!(video.dims(), &[1, 3, 9, 16, 16]); // [b, 3, 1 + 4 (F − 1), 8h, 8w]
//! # Ok::<(), candle_core::Error>(())
//! ```

pub mod blocks;
pub mod config;
pub mod conv;
pub mod decoder;
pub mod loading;

pub use blocks::{exact_attention, VAE_MID_SITE};
pub use config::VaeConfig;
pub use loading::{check_files, expected_tensors, find_files, VaeFiles};

use crate::AttnPolicy;
use candle_core::{bail, DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use conv::{CausalConv3d, FeatCache};
use decoder::Decoder3d;
use mxattn_checkpoint::{build_from, random_var_builder, Init};
use std::path::Path;

/// What one decode did, for memory reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodeStats {
    /// Latent frames decoded (one chunk each).
    pub chunks: usize,
    /// Video frames produced.
    pub frames: usize,
    /// Largest activation between decoder blocks, in bytes (the per-chunk working set is a
    /// small multiple of it).
    pub peak_activation_bytes: usize,
    /// Largest size of the feature cache after a chunk, in bytes.
    pub cache_bytes: usize,
    /// Cached layers.
    pub cache_slots: usize,
    /// With [`WanVae::set_trace`]: each decoder stage's largest |value| over the chunks, in
    /// stage order (NaN once a stage produced a non-finite value).
    pub stage_absmax: Vec<(&'static str, f32)>,
    /// With tracing: the first `(chunk, stage)` whose output held a non-finite value.
    pub first_non_finite: Option<(usize, &'static str)>,
    tracing: bool,
}

impl DecodeStats {
    /// Records a stage's output: its size, and when tracing its largest |value| (a device
    /// synchronization per stage, so only on request).
    pub(crate) fn note(&mut self, stage: &'static str, t: &Tensor) -> Result<()> {
        self.peak_activation_bytes = self
            .peak_activation_bytes
            .max(t.elem_count() * t.dtype().size_in_bytes());
        if !self.tracing {
            return Ok(());
        }
        let t32 = t.to_dtype(DType::F32)?;
        // 0·x is 0 for finite x and NaN otherwise
        let finite = (&t32 * 0.0)?.abs()?.sum_all()?.to_scalar::<f32>()? == 0.0;
        let m = if finite {
            t32.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?
        } else {
            if self.first_non_finite.is_none() {
                self.first_non_finite = Some((self.chunks, stage));
            }
            f32::NAN
        };
        match self.stage_absmax.iter_mut().find(|e| e.0 == stage) {
            Some(e) => {
                e.1 = if e.1.is_nan() || m.is_nan() {
                    f32::NAN
                } else {
                    e.1.max(m)
                }
            }
            None => self.stage_absmax.push((stage, m)),
        }
        Ok(())
    }
}

/// A Wan VAE decoder with its `post_quant_conv` and latent statistics.
#[derive(Clone, Debug)]
pub struct WanVae {
    cfg: VaeConfig,
    post_quant_conv: CausalConv3d,
    decoder: Decoder3d,
    /// `[1, z, 1, 1, 1]` in the model dtype.
    mean: Tensor,
    /// `1 / std`, `[1, z, 1, 1, 1]` (the pipeline divides by it).
    inv_std: Tensor,
    dtype: DType,
    device: Device,
    trace: bool,
}

impl WanVae {
    /// Records each decoder stage's largest |value| and the first non-finite one in the
    /// [`DecodeStats`] of later decodes (costs a synchronization per stage).
    pub fn set_trace(&mut self, on: bool) {
        self.trace = on;
    }

    /// Builds the decode path of `cfg` from `vb` (diffusers names: `post_quant_conv.*`,
    /// `decoder.*`).
    pub fn new(cfg: &VaeConfig, vb: VarBuilder) -> Result<Self> {
        cfg.validate().map_err(candle_core::Error::Msg)?;
        let (dtype, device) = (vb.dtype(), vb.device().clone());
        if dtype == DType::BF16 && device.is_cpu() {
            bail!("VAE: candle's CPU convolutions have no bf16; use f32 or f16 on the CPU, bf16 on a GPU");
        }
        let z = cfg.z_dim;
        let stat = |v: &[f64]| -> Result<Tensor> {
            Tensor::from_vec(
                v.iter().map(|&x| x as f32).collect(),
                (1, z, 1, 1, 1),
                &device,
            )?
            .to_dtype(dtype)
        };
        let inv: Vec<f64> = cfg.latents_std.iter().map(|s| 1.0 / s).collect();
        Ok(Self {
            post_quant_conv: CausalConv3d::new(z, z, (1, 1), vb.pp("post_quant_conv"))?,
            decoder: Decoder3d::new(cfg, vb.pp("decoder"))?,
            mean: stat(&cfg.latents_mean)?,
            inv_std: stat(&inv)?,
            cfg: cfg.clone(),
            dtype,
            device,
            trace: false,
        })
    }

    /// Loads a VAE directory (or a pipeline directory with `vae/`) in `dtype` on `device`,
    /// after checking every file and tensor.
    pub fn load(dir: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        Self::from_files(&find_files(dir)?, dtype, device)
    }

    /// Loads checked files.
    pub fn from_files(files: &VaeFiles, dtype: DType, device: &Device) -> Result<Self> {
        let cfg = VaeConfig::from_file(&files.config)?;
        check_files(&cfg, files)?;
        build_from(files, "the VAE decoder", dtype, device, |vb| {
            Self::new(&cfg, vb)
        })
    }

    /// The architecture of `cfg` with random weights: convs `N(0, 1/fan_in)`, norm gains 1,
    /// biases 0. On the CPU from [`mxattn::synth::Rng`], elsewhere from the device's generator.
    pub fn random(cfg: &VaeConfig, dtype: DType, device: &Device, seed: u64) -> Result<Self> {
        cfg.validate().map_err(candle_core::Error::Msg)?;
        let init = |name: &str, s: &[usize]| {
            let how = if name.ends_with(".gamma") {
                Init::Ones
            } else if name.ends_with(".bias") {
                Init::Zeros
            } else {
                Init::Normal(1.0 / (s[1..].iter().product::<usize>() as f64).sqrt())
            };
            (how, dtype)
        };
        let vb = random_var_builder(expected_tensors(cfg), init, dtype, device, seed)?;
        Self::new(cfg, vb)
    }

    pub fn config(&self) -> &VaeConfig {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether the mid attention is wider than [`mxattn::attention::MAX_HEAD_DIM`] and so runs
    /// exact attention whatever the policy says (true for the Wan2.2 VAE).
    pub fn mid_attention_uses_fallback(&self) -> bool {
        self.decoder.mid().attention().uses_fallback()
    }

    /// Checks `z` is `[b, z_dim, F, h, w]` float latents with no NaN or Inf.
    pub fn check_latents(&self, z: &Tensor) -> Result<()> {
        let dims = z.dims();
        if dims.len() != 5 {
            bail!(
                "VAE decode: latents must be [batch, {}, frames, height, width], got shape {:?}",
                self.cfg.z_dim,
                dims
            );
        }
        if dims[1] != self.cfg.z_dim {
            bail!(
                "VAE decode: latents have {} channels, this VAE has z_dim {} (shape {dims:?})",
                dims[1],
                self.cfg.z_dim
            );
        }
        if dims.contains(&0) {
            bail!("VAE decode: latents shape {dims:?} has an empty dimension");
        }
        if !matches!(z.dtype(), DType::F32 | DType::F16 | DType::BF16) {
            bail!(
                "VAE decode: latents are {:?}; expected f32, f16 or bf16",
                z.dtype()
            );
        }
        // 0·x is 0 for finite x and NaN otherwise
        let bad = (z * 0.0)?
            .to_dtype(DType::F32)?
            .abs()?
            .sum_all()?
            .to_scalar::<f32>()?;
        if bad != 0.0 {
            let v = z.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let i = v.iter().position(|x| !x.is_finite()).unwrap_or(0);
            bail!(
                "VAE decode: latents hold {} at flat index {i} (shape {dims:?})",
                v[i]
            );
        }
        Ok(())
    }

    /// Pipeline latents → VAE latents: `z / (1 / std) + mean` per channel, as diffusers'
    /// `WanPipeline` does before `vae.decode`.
    pub fn denormalize(&self, z: &Tensor) -> Result<Tensor> {
        self.check_latents(z)?;
        z.to_dtype(self.dtype)?
            .broadcast_div(&self.inv_std)?
            .broadcast_add(&self.mean)
    }

    /// Decodes VAE latents `[b, z, F, h, w]` (what diffusers' `AutoencoderKLWan.decode` takes)
    /// to a video `[b, 3, 1 + 4 (F − 1), H, W]` in [-1, 1], in the model dtype.
    pub fn decode(&self, z: &Tensor, policy: &dyn AttnPolicy) -> Result<Tensor> {
        self.check_latents(z)?;
        let (b, _, f, h, w) = z.dims5()?;
        let s = self.cfg.spatial_factor();
        let c = self.cfg.video_channels();
        let out = Tensor::zeros(
            (b, c, self.cfg.num_frames(f), h * s, w * s),
            self.dtype,
            &self.device,
        )?;
        let mut at = 0;
        self.decode_chunks(z, policy, |frames| {
            out.slice_set(&frames, 2, at)?;
            at += frames.dim(2)?;
            Ok(())
        })?;
        Ok(out)
    }

    /// Decodes latents as the pipeline produces them (normalised): [`Self::denormalize`],
    /// then [`Self::decode`].
    pub fn decode_normalized(&self, z: &Tensor, policy: &dyn AttnPolicy) -> Result<Tensor> {
        self.decode(&self.denormalize(z)?, policy)
    }

    /// Decodes one latent frame at a time, handing each chunk's frames `[b, 3, t, H, W]` (1
    /// frame for the first chunk, 4 for the others) to `on_frames` as soon as they exist.
    pub fn decode_chunks(
        &self,
        z: &Tensor,
        policy: &dyn AttnPolicy,
        mut on_frames: impl FnMut(Tensor) -> Result<()>,
    ) -> Result<DecodeStats> {
        self.check_latents(z)?;
        let z = z.to_dtype(self.dtype)?;
        let f = z.dim(2)?;
        let mut cache = FeatCache::new();
        let mut stats = DecodeStats {
            tracing: self.trace,
            ..Default::default()
        };
        stats.note("latents", &z)?;
        for i in 0..f {
            cache.begin_chunk();
            // [b, z, 1, h, w] → frames-major [b, 1, z, h, w]
            let x = z.narrow(2, i, 1)?.transpose(1, 2)?.contiguous()?;
            let x = self.post_quant_conv.forward(&x, None)?;
            stats.note("post_quant_conv", &x)?;
            let y = self
                .decoder
                .forward(&x, &mut cache, i == 0, policy, &mut stats)?;
            if let Some((chunk, stage)) = stats.first_non_finite {
                let seen: Vec<String> = stats
                    .stage_absmax
                    .iter()
                    .map(|(s, m)| format!("{s} {m:.3e}"))
                    .collect();
                bail!(
                    "VAE decode: latent frame {chunk}: the decoder's {stage} produced non-finite \
                     values (largest |value| per stage over the frames so far: {})",
                    seen.join(", ")
                );
            }
            let y = unpatchify(&y, self.cfg.patch())?
                .clamp(-1f32, 1f32)?
                .transpose(1, 2)?
                .contiguous()?;
            stats.chunks += 1;
            stats.frames += y.dim(2)?;
            stats.cache_bytes = stats.cache_bytes.max(cache.bytes());
            stats.cache_slots = cache.len();
            on_frames(y)?;
        }
        Ok(stats)
    }
}

/// `[b, t, c·p·p, h, w]` → `[b, t, c, h·p, w·p]`, diffusers' `unpatchify`: channel
/// `(c, i, j)` goes to pixel `(h·p + j, w·p + i)`.
pub fn unpatchify(x: &Tensor, p: usize) -> Result<Tensor> {
    if p == 1 {
        return Ok(x.clone());
    }
    let (b, t, cp, h, w) = x.dims5()?;
    let c = cp / (p * p);
    x.reshape((b * t, c, p, p, h, w))?
        .permute((0, 1, 4, 3, 5, 2))?
        .contiguous()?
        .reshape((b, t, c, h * p, w * p))
}
