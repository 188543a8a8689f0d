//! The decoder's building blocks, on frames-major `[b, t, c, h, w]` tensors: residual
//! block, per-frame mid attention, up-samplers and the Wan2.2 DupUp3D shortcut.

use super::conv::{last_frames, CausalConv3d, FeatCache, RmsNorm, Slot};
use crate::{AttnKind, AttnPolicy, AttnSite};
use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{Conv2d, Conv2dConfig, VarBuilder};
use mxattn::attention::{attention, MAX_HEAD_DIM};

/// Where the VAE's attention runs, as a schedule sees it.
pub const VAE_MID_SITE: AttnSite = AttnSite {
    expert: 0,
    step: 0,
    layer: 0,
    kind: AttnKind::VaeMid,
};

/// norm → SiLU → conv → norm → SiLU → conv, plus the input (through a 1×1×1 conv when the
/// width changes). Both convs are causal and cached.
#[derive(Clone, Debug)]
pub struct ResidualBlock {
    norm1: RmsNorm,
    conv1: CausalConv3d,
    norm2: RmsNorm,
    conv2: CausalConv3d,
    shortcut: Option<CausalConv3d>,
}

impl ResidualBlock {
    pub fn new(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            norm1: RmsNorm::new(in_dim, false, vb.pp("norm1"))?,
            conv1: CausalConv3d::new(in_dim, out_dim, (3, 3), vb.pp("conv1"))?,
            norm2: RmsNorm::new(out_dim, false, vb.pp("norm2"))?,
            conv2: CausalConv3d::new(out_dim, out_dim, (3, 3), vb.pp("conv2"))?,
            shortcut: if in_dim != out_dim {
                Some(CausalConv3d::new(
                    in_dim,
                    out_dim,
                    (1, 1),
                    vb.pp("conv_shortcut"),
                )?)
            } else {
                None
            },
        })
    }

    pub fn forward(&self, x: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let h = match &self.shortcut {
            Some(s) => s.forward(x, None)?,
            None => x.clone(),
        };
        let y = self.norm1.forward(x)?.silu()?;
        let y = self.conv1.forward_cached(&y, cache)?;
        let y = self.norm2.forward(&y)?.silu()?;
        let y = self.conv2.forward_cached(&y, cache)?;
        y + h
    }
}

/// Single-head self-attention over the `h·w` positions of each frame, with a residual.
///
/// The call goes through [`mxattn::attention::attention`] with the config the policy gives
/// for [`VAE_MID_SITE`]. Its head dim is the mid block's width: 384 for the Wan2.1 VAE, but
/// 1024 for Wan2.2, above [`MAX_HEAD_DIM`]. A single head cannot be split exactly along its
/// channels (the softmax needs the full `q·k`), so widths above the limit fall back to
/// [`exact_attention`], a plain candle composition of exact softmax attention in f32 that
/// uses the config's softmax scale and nothing else of it: a quantized schedule does not
/// apply to that call ([`MidAttention::uses_fallback`] says so).
#[derive(Clone, Debug)]
pub struct MidAttention {
    norm: RmsNorm,
    to_qkv: Conv2d,
    proj: Conv2d,
    channels: usize,
}

impl MidAttention {
    pub fn new(channels: usize, vb: VarBuilder) -> Result<Self> {
        let cfg = Conv2dConfig::default();
        Ok(Self {
            norm: RmsNorm::new(channels, true, vb.pp("norm"))?,
            to_qkv: candle_nn::conv2d(channels, 3 * channels, 1, cfg, vb.pp("to_qkv"))?,
            proj: candle_nn::conv2d(channels, channels, 1, cfg, vb.pp("proj"))?,
            channels,
        })
    }

    /// Whether the head dim is above [`MAX_HEAD_DIM`], so the call bypasses the policy.
    pub fn uses_fallback(&self) -> bool {
        self.channels > MAX_HEAD_DIM
    }

    pub fn forward(&self, x: &Tensor, policy: &dyn AttnPolicy) -> Result<Tensor> {
        let (b, t, c, h, w) = x.dims5()?;
        let n = b * t;
        let y = self.norm.forward(&x.reshape((n, c, h, w))?)?;
        // [n, 3c, h, w] → [n, hw, 3c]: one token per position, q | k | v along channels
        let qkv = self
            .to_qkv
            .forward(&y)?
            .reshape((n, 3 * c, h * w))?
            .transpose(1, 2)?;
        let part =
            |i: usize| -> Result<Tensor> { qkv.narrow(2, i * c, c)?.unsqueeze(1)?.contiguous() };
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let cfg = policy.config(&VAE_MID_SITE);
        let o = if self.uses_fallback() {
            exact_attention(&q, &k, &v, cfg.softmax_scale)?
        } else {
            attention(&q, &k, &v, &cfg)
                .map_err(|e| candle_core::Error::Msg(format!("VAE mid-block attention: {e}")))?
        };
        let o = o
            .squeeze(1)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((n, c, h, w))?;
        let o = self.proj.forward(&o)?.reshape((b, t, c, h, w))?;
        o + x
    }
}

/// Exact softmax attention, `softmax(q kᵀ · scale) v`, composed from candle ops in f32;
/// `scale` defaults to `1/√d`. Any head dim; q, k, v `[b, h, s, d]` with equal heads.
pub fn exact_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: Option<f32>) -> Result<Tensor> {
    let d = q.dim(3)?;
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt()) as f64;
    let qf = q.to_dtype(DType::F32)?;
    let kf = k.to_dtype(DType::F32)?;
    let vf = v.to_dtype(DType::F32)?;
    let s = (qf.matmul(&kf.t()?.contiguous()?)? * scale)?;
    let p = candle_nn::ops::softmax_last_dim(&s)?;
    p.matmul(&vf)?.to_dtype(q.dtype())
}

/// Mid block: residual block, attention, residual block.
#[derive(Clone, Debug)]
pub struct MidBlock {
    res0: ResidualBlock,
    attn: MidAttention,
    res1: ResidualBlock,
}

impl MidBlock {
    pub fn new(dim: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            res0: ResidualBlock::new(dim, dim, vb.pp("resnets.0"))?,
            attn: MidAttention::new(dim, vb.pp("attentions.0"))?,
            res1: ResidualBlock::new(dim, dim, vb.pp("resnets.1"))?,
        })
    }

    pub fn attention(&self) -> &MidAttention {
        &self.attn
    }

    pub fn forward(
        &self,
        x: &Tensor,
        cache: &mut FeatCache,
        policy: &dyn AttnPolicy,
    ) -> Result<Tensor> {
        let x = self.res0.forward(x, cache)?;
        let x = self.attn.forward(&x, policy)?;
        self.res1.forward(&x, cache)
    }
}

/// diffusers' `WanResample` in its up modes: nearest ×2 in height and width, then a 3×3
/// Conv2d per frame; `upsample3d` first doubles the frames with a causal `time_conv`
/// (`k_t = 3`, `dim → 2·dim`, the two halves interleaved in time). The temporal step is
/// skipped on the first chunk, so the first latent frame gives one frame.
#[derive(Clone, Debug)]
pub struct Upsample {
    time_conv: Option<CausalConv3d>,
    conv: Conv2d,
}

impl Upsample {
    pub fn new(dim: usize, out_dim: usize, temporal: bool, vb: VarBuilder) -> Result<Self> {
        let cfg = Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        Ok(Self {
            time_conv: if temporal {
                Some(CausalConv3d::new(dim, 2 * dim, (3, 1), vb.pp("time_conv"))?)
            } else {
                None
            },
            conv: candle_nn::conv2d(dim, out_dim, 3, cfg, vb.pp("resample.1"))?,
        })
    }

    pub fn forward(&self, x: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let mut x = x.clone();
        if let Some(tc) = &self.time_conv {
            let slot = cache.slot();
            // after the skipped chunk the context is zeros (diffusers caches a zero frame in
            // front of it, which is the same as no past)
            let past = match slot {
                Slot::Frames(p) => Some(p.clone()),
                _ => None,
            };
            if matches!(slot, Slot::Empty) {
                *slot = Slot::Skipped;
            } else {
                let y = tc.forward(&x, past.as_ref())?;
                *slot = Slot::Frames(last_frames(past.as_ref(), &x)?);
                let (b, t, c2, h, w) = y.dims5()?;
                // channels [0, c) are frame 2j, [c, 2c) frame 2j + 1
                x = y.reshape((b, t * 2, c2 / 2, h, w))?;
            }
        }
        let (b, t, c, h, w) = x.dims5()?;
        let y = x
            .reshape((b * t, c, h, w))?
            .upsample_nearest2d(2 * h, 2 * w)?;
        let y = self.conv.forward(&y)?;
        let (_, o, ho, wo) = y.dims4()?;
        y.reshape((b, t, o, ho, wo))
    }
}

/// Wan2.2's parameter-free shortcut around a residual up-block: each input channel is
/// repeated and the copies are spread over `ft × 2 × 2` output positions (time, height,
/// width). On the first chunk the first `ft − 1` frames are dropped, as the temporal
/// upsampler skips that chunk.
#[derive(Clone, Copy, Debug)]
pub struct DupUp3d {
    in_channels: usize,
    out_channels: usize,
    factor_t: usize,
    factor_s: usize,
}

impl DupUp3d {
    pub fn new(in_channels: usize, out_channels: usize, factor_t: usize, factor_s: usize) -> Self {
        Self {
            in_channels,
            out_channels,
            factor_t,
            factor_s,
        }
    }

    pub fn forward(&self, x: &Tensor, first_chunk: bool) -> Result<Tensor> {
        let (b, t, c, h, w) = x.dims5()?;
        let (ft, fs, o) = (self.factor_t, self.factor_s, self.out_channels);
        let repeats = o * ft * fs * fs / self.in_channels;
        debug_assert_eq!(c, self.in_channels);
        // repeat_interleave on channels, then channel index = ((o·ft + a)·fs + p)·fs + q
        let y = x
            .reshape((b * t, c, 1, h, w))?
            .broadcast_as((b * t, c, repeats, h, w))?
            .reshape(vec![b * t, o, ft, fs, fs, h, w])?
            // → [bt, ft, o, h, fs(p), w, fs(q)]: frame t·ft + a, pixel (h·fs + p, w·fs + q)
            .permute([0, 2, 1, 5, 3, 6, 4])?
            .contiguous()?
            .reshape((b, t * ft, o, h * fs, w * fs))?;
        if first_chunk && ft > 1 {
            y.narrow(1, ft - 1, t * ft - (ft - 1))
        } else {
            Ok(y)
        }
    }
}

/// One decoder stage: `num_res_blocks + 1` residual blocks, then the upsampler (all but the
/// last stage), plus the DupUp3D shortcut for residual (Wan2.2) stages.
#[derive(Clone, Debug)]
pub struct UpBlock {
    resnets: Vec<ResidualBlock>,
    upsampler: Option<Upsample>,
    shortcut: Option<DupUp3d>,
}

impl UpBlock {
    /// A Wan2.1 stage (`WanUpBlock`): its upsampler halves the width it passes on.
    pub fn plain(
        in_dim: usize,
        out_dim: usize,
        num_res_blocks: usize,
        upsample: Option<bool>,
        vb: VarBuilder,
    ) -> Result<Self> {
        let resnets = Self::resnets(in_dim, out_dim, num_res_blocks, &vb)?;
        let upsampler = match upsample {
            Some(temporal) => Some(Upsample::new(
                out_dim,
                out_dim / 2,
                temporal,
                vb.pp("upsamplers.0"),
            )?),
            None => None,
        };
        Ok(Self {
            resnets,
            upsampler,
            shortcut: None,
        })
    }

    /// A Wan2.2 stage (`WanResidualUpBlock`): the upsampler keeps the width, and the stage
    /// input comes back through [`DupUp3d`].
    pub fn residual(
        in_dim: usize,
        out_dim: usize,
        num_res_blocks: usize,
        upsample: Option<bool>,
        vb: VarBuilder,
    ) -> Result<Self> {
        let resnets = Self::resnets(in_dim, out_dim, num_res_blocks, &vb)?;
        let (upsampler, shortcut) = match upsample {
            Some(temporal) => (
                Some(Upsample::new(
                    out_dim,
                    out_dim,
                    temporal,
                    vb.pp("upsampler"),
                )?),
                Some(DupUp3d::new(
                    in_dim,
                    out_dim,
                    if temporal { 2 } else { 1 },
                    2,
                )),
            ),
            None => (None, None),
        };
        Ok(Self {
            resnets,
            upsampler,
            shortcut,
        })
    }

    fn resnets(
        in_dim: usize,
        out_dim: usize,
        num_res_blocks: usize,
        vb: &VarBuilder,
    ) -> Result<Vec<ResidualBlock>> {
        (0..=num_res_blocks)
            .map(|j| {
                let d = if j == 0 { in_dim } else { out_dim };
                ResidualBlock::new(d, out_dim, vb.pp(format!("resnets.{j}")))
            })
            .collect()
    }

    pub fn forward(&self, x: &Tensor, cache: &mut FeatCache, first_chunk: bool) -> Result<Tensor> {
        let mut y = x.clone();
        for r in &self.resnets {
            y = r.forward(&y, cache)?;
        }
        if let Some(u) = &self.upsampler {
            y = u.forward(&y, cache)?;
        }
        match &self.shortcut {
            Some(s) => y + s.forward(x, first_chunk)?,
            None => Ok(y),
        }
    }
}
