//! Causal 3-D convolution over `[b, t, c, h, w]` tensors, and the per-layer cache of past
//! frames that lets the decoder run one latent frame at a time.
//!
//! candle has no Conv3d. A `k_t × k × k` kernel is `k_t` Conv2d kernels, one per time tap:
//! output frame `j` is `Σ_i conv2d(input[j + i], W[:, :, i])` over the input padded on the
//! left (the past) only. The frames-major layout `[b, t, c, h, w]` makes each tap one Conv2d
//! call over `b·t` images with no transposes.

use candle_core::{DType, Result, Tensor, D};
use candle_nn::VarBuilder;

/// Frames of its input each cached layer keeps from the previous chunk (diffusers `CACHE_T`).
pub const CACHE_T: usize = 2;

/// What one cached layer remembers between chunks.
#[derive(Clone, Debug, Default)]
pub enum Slot {
    /// Nothing yet (before the first chunk).
    #[default]
    Empty,
    /// A temporal upsampler that skipped the first chunk (diffusers' `"Rep"`).
    Skipped,
    /// The last (up to [`CACHE_T`]) input frames, `[b, ≤2, c, h, w]`.
    Frames(Tensor),
}

/// The causal state of a whole decoder: one [`Slot`] per cached layer, taken in call order
/// (the flat `feat_cache` / `feat_idx` of diffusers).
#[derive(Debug, Default)]
pub struct FeatCache {
    slots: Vec<Slot>,
    next: usize,
}

impl FeatCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a chunk: layers take their slots from the first again.
    pub fn begin_chunk(&mut self) {
        self.next = 0;
    }

    /// The next layer's slot (created on the first chunk).
    pub fn slot(&mut self) -> &mut Slot {
        if self.next == self.slots.len() {
            self.slots.push(Slot::Empty);
        }
        self.next += 1;
        &mut self.slots[self.next - 1]
    }

    /// Bytes held by the cached frames.
    pub fn bytes(&self) -> usize {
        self.slots
            .iter()
            .map(|s| match s {
                Slot::Frames(t) => t.elem_count() * t.dtype().size_in_bytes(),
                _ => 0,
            })
            .sum()
    }

    /// Number of slots (cached layers).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// The last [`CACHE_T`] frames of `past ++ x` along dim 1, in their own buffer (a narrow view
/// would keep the whole activation alive).
pub fn last_frames(past: Option<&Tensor>, x: &Tensor) -> Result<Tensor> {
    let t = x.dim(1)?;
    let joined = match past {
        Some(p) if t < CACHE_T => Tensor::cat(&[p, x], 1)?,
        _ => x.clone(),
    };
    let n = joined.dim(1)?;
    let keep = n.min(CACHE_T);
    joined.narrow(1, n - keep, keep)?.force_contiguous()
}

/// A Conv3d whose time axis is causal: `k_t − 1` frames of left context, from the cache or
/// zeros; height and width padded symmetrically by `(k − 1) / 2`.
#[derive(Clone, Debug)]
pub struct CausalConv3d {
    /// One `[out, in, k, k]` kernel per time tap, oldest first.
    taps: Vec<Tensor>,
    bias: Tensor,
    pad_hw: usize,
    in_channels: usize,
    out_channels: usize,
}

impl CausalConv3d {
    /// Loads `weight [out, in, kt, k, k]` and `bias [out]` under `vb`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        (kt, k): (usize, usize),
        vb: VarBuilder,
    ) -> Result<Self> {
        let w = vb.get((out_channels, in_channels, kt, k, k), "weight")?;
        let bias = vb.get(out_channels, "bias")?;
        let taps = (0..kt)
            .map(|i| w.narrow(2, i, 1)?.squeeze(2)?.contiguous())
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            taps,
            bias: bias.reshape((1, out_channels, 1, 1))?,
            pad_hw: (k - 1) / 2,
            in_channels,
            out_channels,
        })
    }

    pub fn out_channels(&self) -> usize {
        self.out_channels
    }

    /// `x [b, t, in, h, w]` → `[b, t, out, h, w]`, with `past` (the previous chunk's last
    /// input frames) as left context; missing context is zeros.
    pub fn forward(&self, x: &Tensor, past: Option<&Tensor>) -> Result<Tensor> {
        let (b, t, c, h, w) = x.dims5()?;
        if c != self.in_channels {
            candle_core::bail!(
                "causal conv: input has {c} channels, the kernel expects {}",
                self.in_channels
            );
        }
        let ctx = self.taps.len() - 1;
        let input = match past {
            Some(p) if ctx > 0 => {
                let n = p.dim(1)?.min(ctx);
                Tensor::cat(&[&p.narrow(1, p.dim(1)? - n, n)?, x], 1)?
            }
            _ => x.clone(),
        };
        // zero frames in front of `input`; their taps contribute nothing and are skipped
        let zeros = ctx + t - input.dim(1)?;
        let mut acc: Option<Tensor> = None;
        for (i, kernel) in self.taps.iter().enumerate() {
            // output frame j reads padded frame j + i, i.e. input frame j + i − zeros
            let j0 = zeros.saturating_sub(i);
            if j0 >= t {
                continue;
            }
            let len = t - j0;
            let frames = input
                .narrow(1, j0 + i - zeros, len)?
                .reshape((b * len, c, h, w))?;
            let y = frames.conv2d(kernel, self.pad_hw, 1, 1, 1)?;
            let (_, o, ho, wo) = y.dims4()?;
            let y = y.reshape((b, len, o, ho, wo))?;
            let y = if j0 > 0 {
                y.pad_with_zeros(1, j0, 0)?
            } else {
                y
            };
            acc = Some(match acc {
                None => y,
                Some(a) => (a + y)?,
            });
        }
        let acc = acc.expect("the last tap always reads real frames");
        let (_, _, o, ho, wo) = acc.dims5()?;
        acc.reshape((b * t, o, ho, wo))?
            .broadcast_add(&self.bias)?
            .reshape((b, t, o, ho, wo))
    }

    /// [`Self::forward`] with the layer's cache slot: reads the past frames, then stores the
    /// last [`CACHE_T`] frames of this input for the next chunk.
    pub fn forward_cached(&self, x: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let slot = cache.slot();
        let past = match slot {
            Slot::Frames(p) => Some(p.clone()),
            _ => None,
        };
        let y = self.forward(x, past.as_ref())?;
        *slot = Slot::Frames(last_frames(past.as_ref(), x)?);
        Ok(y)
    }
}

/// diffusers' `WanRMS_norm`: `x / max(‖x‖₂, 1e-12) · √C · γ` over the channel dim, the
/// normalisation in f32 for half inputs.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// `[c, 1, 1]`: broadcasts over the trailing `[c, h, w]` of any layout used here.
    gamma: Tensor,
    scale: f64,
}

impl RmsNorm {
    /// Loads `gamma`, stored as `[c, 1, 1, 1]` (`images=False`) or `[c, 1, 1]` (`images=True`).
    pub fn new(channels: usize, images: bool, vb: VarBuilder) -> Result<Self> {
        let gamma = if images {
            vb.get((channels, 1, 1), "gamma")?
        } else {
            vb.get((channels, 1, 1, 1), "gamma")?
                .reshape((channels, 1, 1))?
        };
        Ok(Self {
            gamma,
            scale: (channels as f64).sqrt(),
        })
    }

    /// Normalises over dim `D::Minus(3)` (the `c` of `[.., c, h, w]`).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let xf = x.to_dtype(DType::F32)?;
        let norm = xf.sqr()?.sum_keepdim(D::Minus(3))?.sqrt()?.maximum(1e-12)?;
        let y = xf.broadcast_div(&norm)?.to_dtype(x.dtype())?;
        (y * self.scale)?.broadcast_mul(&self.gamma)
    }
}
