//! The models' linear layers: dense as loaded, or FP8, chosen per call site by a linear
//! schedule in the grammar of [`mxattn::schedule`] (`--linear fp8`,
//! `--linear "bf16@layers=0+last;fp8"`).

use crate::{Fp8Linear, Fp8Weight, Granularity};
use candle_core::{bail, DType, Module, Result, Tensor};
use mxattn::schedule::{Choice, Grammar};

/// How a linear layer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearFormat {
    /// As loaded: the model's dtype (BF16 on the GPU), the GEMM of candle.
    Dense,
    /// FP8 E4M3 weights with scales of this granularity, per-token FP8 activations
    /// (1 × 128 groups with 128 × 128 weight blocks); output in the input's dtype.
    Fp8(Granularity),
    /// FP8 E4M3 weights with a scale per output channel, activations as they come
    /// ([`Fp8Linear::weight_only`]).
    Fp8WeightOnly,
    /// As `Fp8(Channel)`, with cuBLASLt's fast accumulation on CUDA
    /// ([`Fp8Linear::set_fast_accum`]).
    Fp8Fast,
}

/// Names, as written in a linear schedule, and what they mean.
const NAMES: &[(&str, LinearFormat, &str)] = &[
    (
        "bf16",
        LinearFormat::Dense,
        "as loaded, in the model dtype (BF16 on the GPU); also `dense`",
    ),
    (
        "fp8",
        LinearFormat::Fp8(Granularity::Channel),
        "FP8 E4M3 weights with a scale per output channel, activations per token",
    ),
    (
        "fp8-tensor",
        LinearFormat::Fp8(Granularity::Tensor),
        "FP8 E4M3 with one weight scale per matrix (ComfyUI's scaled FP8)",
    ),
    (
        "fp8-block",
        LinearFormat::Fp8(Granularity::BLOCK128),
        "FP8 E4M3 with 128×128 weight blocks and 1×128 activation groups (the official FP8 checkpoints)",
    ),
    (
        "fp8-fast",
        LinearFormat::Fp8Fast,
        "as fp8, with cuBLASLt's fast accumulation on CUDA (FP8 sums not promoted to f32: faster, less exact; the CPU computes fp8)",
    ),
    (
        "fp8-w",
        LinearFormat::Fp8WeightOnly,
        "weight-only FP8: E4M3 weights with a scale per output channel, activations unquantized (W8A16)",
    ),
];

impl LinearFormat {
    /// The name a schedule writes for it.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(_, f, _)| *f == self)
            .map_or("fp8-custom", |(n, _, _)| n)
    }
}

impl Choice for LinearFormat {
    const SUBJECT: &'static str = "linear";
    const NOUN: &'static str = "linear format";
    const EXAMPLE: &'static str = "fp8";
    fn parse_name(name: &str, _g: &Grammar) -> Result<Self> {
        let name = name.trim().to_ascii_lowercase();
        let name = if name == "dense" { "bf16" } else { &name };
        match NAMES.iter().find(|(n, _, _)| *n == name) {
            Some((_, f, _)) => Ok(*f),
            None => bail!(
                "unknown linear format {name:?}; known: {}",
                NAMES.iter().map(|n| n.0).collect::<Vec<_>>().join(", ")
            ),
        }
    }
    fn names_help(_g: &Grammar) -> String {
        NAMES
            .iter()
            .map(|(n, _, d)| format!("  {n:<12} {d}\n"))
            .collect()
    }
}

/// `"fp8: 5, bf16: 1"`: how many of `formats` run in each format, in first-seen order (a
/// model's summary of its projections).
pub fn format_counts(formats: impl IntoIterator<Item = LinearFormat>) -> String {
    let mut counts: Vec<(&'static str, usize)> = Vec::new();
    for f in formats {
        match counts.iter_mut().find(|(n, _)| *n == f.name()) {
            Some((_, c)) => *c += 1,
            None => counts.push((f.name(), 1)),
        }
    }
    counts
        .iter()
        .map(|(n, c)| format!("{n}: {c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A linear layer `y = x · Wᵀ + b`, dense or FP8.
#[derive(Clone, Debug)]
pub enum Linear {
    Dense(candle_nn::Linear),
    /// The FP8 product without its bias, and the bias (kept apart so that callers which fuse
    /// the bias into their next op, as Wan's blocks do, can take the product alone).
    Fp8 {
        layer: Fp8Linear,
        bias: Option<Tensor>,
    },
}

impl Linear {
    /// `dense` as `format` says: kept, or quantized to FP8 on `dense`'s device
    /// ([`Fp8Linear::quantize`]).
    pub fn new(dense: candle_nn::Linear, format: LinearFormat) -> Result<Self> {
        match format {
            LinearFormat::Dense => Ok(Self::Dense(dense)),
            LinearFormat::Fp8(_) | LinearFormat::Fp8WeightOnly | LinearFormat::Fp8Fast => {
                let (g, weight_only) = match format {
                    LinearFormat::Fp8(g) => (g, false),
                    LinearFormat::Fp8Fast => (Granularity::Channel, false),
                    _ => (Granularity::Channel, true),
                };
                // on the weight's device: a CUDA weight never goes through the host
                let layer = Fp8Linear::quantize(dense.weight(), g, None)?
                    .weight_only(weight_only)?
                    .fast_accum(format == LinearFormat::Fp8Fast);
                let bias = dense.bias().cloned();
                if let Some(b) = &bias {
                    if b.dims() != [layer.shape().0] {
                        bail!(
                            "FP8 linear: bias {:?} for {} outputs",
                            b.dims(),
                            layer.shape().0
                        );
                    }
                }
                Ok(Self::Fp8 { layer, bias })
            }
        }
    }

    /// An FP8 layer from weights as stored (an FP8 checkpoint), on `device`.
    pub fn from_fp8(
        weight: Fp8Weight,
        bias: Option<Tensor>,
        device: &candle_core::Device,
    ) -> Result<Self> {
        if let Some(b) = &bias {
            if b.dims() != [weight.shape().0] {
                bail!(
                    "FP8 linear: bias {:?} for {} outputs",
                    b.dims(),
                    weight.shape().0
                );
            }
        }
        Ok(Self::Fp8 {
            layer: Fp8Linear::new(weight, None, device)?,
            bias,
        })
    }

    /// Runs a dense layer in `format` from now on (quantizing it now). An FP8 layer keeps
    /// its codes for any FP8 format (re-quantizing FP8 values to other scales would only
    /// lose precision: an FP8 checkpoint runs as stored), switching only whether its
    /// activations are quantized (`fp8-w`: not) and whether CUDA's GEMM accumulates fast
    /// (`fp8-fast`; not for block scales), and cannot become dense (its dense weights are
    /// gone).
    pub fn convert(&mut self, format: LinearFormat) -> Result<()> {
        match (&mut *self, format) {
            (Self::Dense(_), LinearFormat::Dense) => Ok(()),
            (
                Self::Fp8 { layer, .. },
                LinearFormat::Fp8(_) | LinearFormat::Fp8WeightOnly | LinearFormat::Fp8Fast,
            ) => {
                let on = format == LinearFormat::Fp8WeightOnly;
                let fast = format == LinearFormat::Fp8Fast; // block scales keep promoted sums
                *layer = layer.clone().weight_only(on)?.fast_accum(fast);
                Ok(())
            }
            (Self::Dense(d), f) => {
                *self = Self::new(d.clone(), f)?;
                Ok(())
            }
            (Self::Fp8 { .. }, LinearFormat::Dense) => bail!(
                "linear layer is {} (an FP8 checkpoint, or converted before) and cannot become dense; load a dense checkpoint instead",
                self.format().name()
            ),
        }
    }

    /// The format it runs in (an FP8 checkpoint's as stored).
    pub fn format(&self) -> LinearFormat {
        match self {
            Self::Dense(_) => LinearFormat::Dense,
            Self::Fp8 { layer, .. } if layer.is_weight_only() => LinearFormat::Fp8WeightOnly,
            Self::Fp8 { layer, .. } if layer.is_fast_accum() => LinearFormat::Fp8Fast,
            Self::Fp8 { layer, .. } => LinearFormat::Fp8(layer.granularity()),
        }
    }

    /// `(out, in)`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Self::Dense(l) => l.weight().dims2(),
            Self::Fp8 { layer, .. } => Ok(layer.shape()),
        }
    }

    pub fn bias(&self) -> Option<&Tensor> {
        match self {
            Self::Dense(l) => l.bias(),
            Self::Fp8 { bias, .. } => bias.as_ref(),
        }
    }

    /// Bytes of the weight and bias as held: what a batch-1 forward reads (FP8: codes and
    /// scales).
    pub fn storage_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let w = match self {
            Self::Dense(l) => bytes(l.weight()),
            Self::Fp8 { layer, .. } => layer.storage_bytes(),
        };
        w + self.bias().map_or(0, bytes)
    }

    /// `x [.., in] · Wᵀ` without the bias, in x's dtype (a dense layer as one 2-D matmul).
    pub fn matmul(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Dense(l) => {
                let dims = x.dims().to_vec();
                let i = *dims.last().unwrap_or(&0);
                let w = l.weight();
                let mut out = dims.clone();
                *out.last_mut().expect("rank ≥ 1") = w.dim(0)?;
                x.reshape((x.elem_count() / i.max(1), i))?
                    .matmul(&w.t()?)?
                    .reshape(out)
            }
            Self::Fp8 { layer, .. } => layer.forward(x),
        }
    }
}

impl Module for Linear {
    /// `x · Wᵀ + b`; a dense layer exactly as candle's `Linear`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Dense(l) => l.forward(x),
            Self::Fp8 { layer, bias } => {
                let y = layer.forward(x)?;
                match bias {
                    Some(b) => y.broadcast_add(&b.to_dtype(y.dtype())?),
                    None => Ok(y),
                }
            }
        }
    }
}

impl Fp8Weight {
    /// Codes as a checkpoint tensor (`F8E4M3 [out, in]`, any device) and its scales:
    /// `[⌈out/128⌉, ⌈in/128⌉]` blocks (Qwen3-*-FP8's `weight_scale_inv`), `[out]` or
    /// `[out, 1]` per channel, or one value (ComfyUI's `scale_weight`).
    pub fn from_tensors(codes: &Tensor, scales: &Tensor) -> Result<Self> {
        if codes.dtype() != DType::F8E4M3 {
            bail!("FP8 weight: dtype {:?}, expected F8E4M3", codes.dtype());
        }
        let (out, inp) = codes.dims2()?;
        let bits: Vec<u8> = codes
            .flatten_all()?
            .to_vec1::<float8::F8E4M3>()?
            .into_iter()
            .map(|c| c.to_bits())
            .collect();
        let n = scales.elem_count();
        // a 2-D grid is blocks even when it is one block (a matrix of ≤ 128 × 128)
        let g = if scales.dims() == [out.div_ceil(128), inp.div_ceil(128)] {
            Granularity::BLOCK128
        } else if n == 1 {
            Granularity::Tensor
        } else if n == out && scales.dims()[0] == out {
            Granularity::Channel
        } else {
            bail!(
                "FP8 weight [{out}, {inp}]: scales of shape {:?} are neither one value, one per output channel nor 128×128 blocks",
                scales.dims()
            );
        };
        let s: Vec<f32> = scales.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        Self::from_parts(out, inp, bits, g, s)
    }
}

impl Linear {
    /// Loads `{vb}.weight [out, in]` (and `{vb}.bias [out]` when `bias`) as stored: FP8 when
    /// the checkpoint holds it so (a `weight_scale_inv` or ComfyUI `scale_weight` beside an
    /// F8E4M3 weight), otherwise dense in the model dtype ([`Self::convert`] then chooses).
    pub fn load(
        in_dim: usize,
        out_dim: usize,
        bias: bool,
        vb: candle_nn::VarBuilder,
    ) -> Result<Self> {
        let b = if bias {
            Some(vb.get(out_dim, "bias")?)
        } else {
            None
        };
        let scale = ["weight_scale_inv", "scale_weight"]
            .into_iter()
            .find(|n| vb.contains_tensor(n));
        if let Some(scale) = scale {
            let ctx = |e: candle_core::Error| {
                candle_core::Error::Msg(format!("{}.weight (FP8): {e}", vb.prefix()))
            };
            let codes = vb
                .get_unchecked_dtype("weight", DType::F8E4M3)
                .map_err(ctx)?;
            if codes.dims() != [out_dim, in_dim] {
                bail!(
                    "{}.weight: shape {:?}, expected [{out_dim}, {in_dim}]",
                    vb.prefix(),
                    codes.dims()
                );
            }
            let s = vb.get_unchecked_dtype(scale, DType::F32).map_err(ctx)?;
            let w = Fp8Weight::from_tensors(&codes, &s).map_err(ctx)?;
            return Self::from_fp8(w, b, vb.device());
        }
        let w = vb.get((out_dim, in_dim), "weight")?;
        Ok(Self::Dense(candle_nn::Linear::new(w, b)))
    }
}
