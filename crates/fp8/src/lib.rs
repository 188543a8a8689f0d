//! FP8 linear layers: `y = x · Wᵀ + b` with W and x in FP8 E4M3, the form the FP8 tensor
//! cores multiply (Hopper's `wgmma` / cuBLASLt FP8 GEMMs), for the models' projections.
//!
//! **The definition** (what the CPU reference computes and a GPU GEMM must match):
//! * a weight group (the whole tensor, an output channel, or a 128 × 128 block) has the
//!   scale `s = amax / 448` in f32 (1 where the group is all zeros); its codes are
//!   `E4M3(w / s)` (the division in f32, round to nearest even, saturating: see
//!   [`mxattn::mx::ElemFormat::encode`]); its values `decode(code) · s`;
//! * an activation row (one token) is quantized the same way with its own scale; with
//!   block-scaled weights, each token's 128-wide groups along the input (the weight block's
//!   columns) get their own scales, as the official block-scaled checkpoints are run
//!   (DeepSeek-V3 / Qwen3-FP8: 1 × 128 activation groups against 128 × 128 weight blocks),
//!   so every partial product of one weight block has one scale pair;
//! * `y` is the exact product of those values, accumulated in f32 here (a GEMM accumulates
//!   in its own order: agreement within f32 summation), plus the bias, in x's dtype.
//!
//! Weights come from a model in f32/bf16 ([`Fp8Weight::quantize`] on the host,
//! [`Fp8Linear::quantize`] on the weight's device) or as stored by FP8 checkpoints
//! ([`Fp8Weight::from_safetensors`]): ComfyUI's scaled FP8 (`weight` E4M3 and a per-tensor
//! `scale_weight`) and the block-scaled layout of Qwen3-*-FP8 (`weight` E4M3 and
//! `weight_scale_inv` per 128 × 128 block, which despite its name multiplies the codes).
//!
//! **On CUDA** (feature `cuda`, `cuda.rs`) a layer built for the GPU keeps the codes and
//! scales there, quantizes activations with `kernels/fp8_quantize.cu` (the reference's codes
//! and scales bit for bit) and multiplies with cuBLASLt's FP8 GEMM; `GemmPath` says whether
//! cuBLASLt took the scales itself or the fallback ran.
//!
//! **Quantizing at load on the GPU.** A weight already on a CUDA device (a model loaded or
//! generated there) is quantized there too ([`Fp8Linear::quantize`], which [`Linear::new`]
//! and [`Linear::convert`] use), for every granularity, to the definition's codes and scales
//! bit for bit, straight into the padded layout the GEMM reads: a 14B-parameter model's
//! weights copied to the host, quantized by its cores and copied back took longer than a
//! load may (minutes), and a host copy of the codes would hold them twice. The host
//! [`Fp8Weight`] of such a layer is made only when asked for ([`Fp8Linear::weight`]).
//!
//! Per-channel scales are the default for quantizing at load: one outlier weight then costs
//! only its own row's precision, and the scale folds into the GEMM's epilogue as one vector;
//! 128 × 128 blocks are what the official FP8 checkpoints ship.

use candle_core::{bail, DType, Device, Result, Tensor};
use mxattn::mx::ElemFormat;
use rayon::prelude::*;
use std::path::Path;

#[cfg(feature = "cuda")]
mod cuda;
mod layer;
#[cfg(feature = "cuda")]
pub use cuda::GemmPath;

/// CUDA: up to this many tokens an all-FP8 layer (FP8 activations, tensor or channel
/// weight scales) takes the decode GEMV rather than cuBLASLt's FP8 GEMM. Measured on an H100
/// (`evals/results/wan_fp8_linear_h100/gemv_cutover.md`): the GEMV is faster at 1 and 2
/// tokens on every Qwen3-8B shape, at 4 on two of three, slower at 8 on all. Weight-only
/// layers take the GEMV up to `mxattn::fused::fp8::GEMV_MAX_TOKENS` (8): their other path
/// dequantizes the weight per call.
#[cfg(feature = "cuda")]
pub const FP8_GEMV_MAX_TOKENS: usize = 4;
pub use layer::{format_counts, Linear, LinearFormat};

/// E4M3's largest finite value: a group's amax maps to it.
pub const E4M3_MAX: f32 = 448.0;

/// How weight scales are shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    /// One scale for the whole matrix (ComfyUI's scaled FP8).
    Tensor,
    /// One scale per output channel (row of W).
    Channel,
    /// One scale per `rows × cols` block (128 × 128 in the official FP8 checkpoints).
    Block { rows: usize, cols: usize },
}

impl Granularity {
    /// The 128 × 128 blocks of the official FP8 checkpoints.
    pub const BLOCK128: Self = Self::Block {
        rows: 128,
        cols: 128,
    };

    /// Number of scales for a `[out, inp]` matrix.
    pub fn scale_count(self, out: usize, inp: usize) -> usize {
        match self {
            Self::Tensor => 1,
            Self::Channel => out,
            Self::Block { rows, cols } => out.div_ceil(rows) * inp.div_ceil(cols),
        }
    }

    /// Index of the scale of element `(o, i)` of a `[out, inp]` matrix.
    fn scale_index(self, o: usize, i: usize, inp: usize) -> usize {
        match self {
            Self::Tensor => 0,
            Self::Channel => o,
            Self::Block { rows, cols } => (o / rows) * inp.div_ceil(cols) + i / cols,
        }
    }
}

/// `amax / 448` (1 for an all-zero group).
pub fn group_scale(amax: f32) -> f32 {
    if amax > 0.0 {
        amax / E4M3_MAX
    } else {
        1.0
    }
}

/// E4M3 codes of `x / s` and the values they represent (`decode · s`).
fn quantize_with(x: f32, s: f32) -> (u8, f32) {
    let c = ElemFormat::E4M3.encode(x / s);
    (c, ElemFormat::E4M3.decode(c) * s)
}

/// `(out, in)` of a weight matrix to quantize with `granularity`, or the error saying why not.
fn weight_dims(w: &Tensor, granularity: Granularity) -> Result<(usize, usize)> {
    let dims = w.dims2().map_err(|_| {
        candle_core::Error::Msg(format!(
            "FP8 weight: expected a [out, in] matrix, got shape {:?}",
            w.dims()
        ))
    })?;
    if let Granularity::Block { rows, cols } = granularity {
        if rows == 0 || cols == 0 {
            bail!("FP8 weight: block {rows}×{cols} is empty");
        }
    }
    Ok(dims)
}

/// Errs at the first non-finite value of a row-major weight `inp` wide, naming it.
pub(crate) fn check_finite(v: &[f32], inp: usize) -> Result<()> {
    if let Some(p) = v.par_iter().position_first(|x| !x.is_finite()) {
        bail!(
            "FP8 weight: non-finite value {} at [{}, {}]",
            v[p],
            p / inp.max(1),
            p % inp.max(1)
        );
    }
    Ok(())
}

/// A weight matrix `[out, inp]` in E4M3 codes with its scales.
#[derive(Clone, Debug)]
pub struct Fp8Weight {
    out: usize,
    inp: usize,
    /// Row-major E4M3 codes.
    codes: Vec<u8>,
    granularity: Granularity,
    scales: Vec<f32>,
}

impl Fp8Weight {
    /// Quantizes `w [out, inp]` (any float dtype) with scales of `granularity`.
    ///
    /// This runs on the host (the tensor is copied there); [`Fp8Linear::quantize`] quantizes
    /// a weight on its CUDA device instead, to the same codes and scales.
    pub fn quantize(w: &Tensor, granularity: Granularity) -> Result<Self> {
        let (out, inp) = weight_dims(w, granularity)?;
        let v: Vec<f32> = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        check_finite(&v, inp)?;
        // rows in parallel (a model's weights quantize at load: billions of values); each
        // row's amax per column group, then the rows of a group combined
        let col_groups = match granularity {
            Granularity::Block { cols, .. } => inp.div_ceil(cols),
            _ => 1,
        };
        let row_amax: Vec<Vec<f32>> = v
            .par_chunks(inp.max(1))
            .map(|row| {
                let mut m = vec![0f32; col_groups];
                for (i, x) in row.iter().enumerate() {
                    let g = granularity.scale_index(0, i, inp);
                    m[g] = m[g].max(x.abs());
                }
                m
            })
            .collect();
        let mut amax = vec![0f32; granularity.scale_count(out, inp)];
        for (o, m) in row_amax.iter().enumerate() {
            let base = granularity.scale_index(o, 0, inp);
            for (g, a) in m.iter().enumerate() {
                amax[base + g] = amax[base + g].max(*a);
            }
        }
        let scales: Vec<f32> = amax.into_iter().map(group_scale).collect();
        let mut codes = vec![0u8; v.len()];
        codes
            .par_chunks_mut(inp.max(1))
            .zip(v.par_chunks(inp.max(1)))
            .enumerate()
            .for_each(|(o, (c, row))| {
                for (i, (c, &x)) in c.iter_mut().zip(row).enumerate() {
                    *c = quantize_with(x, scales[granularity.scale_index(o, i, inp)]).0;
                }
            });
        Ok(Self {
            out,
            inp,
            codes,
            granularity,
            scales,
        })
    }

    /// Codes and scales as a checkpoint stores them (checked: sizes agree, the scales are
    /// finite and positive, no code is E4M3's NaN).
    pub fn from_parts(
        out: usize,
        inp: usize,
        codes: Vec<u8>,
        granularity: Granularity,
        scales: Vec<f32>,
    ) -> Result<Self> {
        if codes.len() != out * inp {
            bail!(
                "FP8 weight: {} codes for a [{out}, {inp}] matrix",
                codes.len()
            );
        }
        let n = granularity.scale_count(out, inp);
        if scales.len() != n {
            bail!(
                "FP8 weight: {granularity:?} scales of a [{out}, {inp}] matrix are {n}, got {}",
                scales.len()
            );
        }
        if let Some(s) = scales.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            bail!("FP8 weight: scale {s} is not a finite positive number");
        }
        if let Some(p) = codes.iter().position(|c| c & 0x7F == 0x7F) {
            bail!(
                "FP8 weight: code at [{}, {}] is E4M3's NaN",
                p / inp,
                p % inp
            );
        }
        Ok(Self {
            out,
            inp,
            codes,
            granularity,
            scales,
        })
    }

    /// Reads `{prefix}.weight` (F8_E4M3) and its scale from a safetensors file: a
    /// `{prefix}.weight_scale_inv` of `[⌈out/128⌉, ⌈in/128⌉]` (Qwen3-*-FP8's blocks), or a
    /// `{prefix}.scale_weight` scalar (ComfyUI's scaled FP8). Errors name the file and the
    /// tensor.
    pub fn from_safetensors(path: &Path, prefix: &str) -> Result<Self> {
        let bytes = std::fs::read(path)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))?;
        let ctx = |what: &str| format!("{}: {prefix}.{what}", path.display());
        let name = format!("{prefix}.weight");
        let w = st
            .tensor(&name)
            .map_err(|_| candle_core::Error::Msg(format!("{}: no tensor", ctx("weight"))))?;
        if w.dtype() != safetensors::Dtype::F8_E4M3 {
            bail!("{}: dtype {:?}, expected F8_E4M3", ctx("weight"), w.dtype());
        }
        let [out, inp] = w.shape() else {
            bail!(
                "{}: shape {:?}, expected [out, in]",
                ctx("weight"),
                w.shape()
            );
        };
        let (out, inp) = (*out, *inp);
        let f32s = |t: &safetensors::tensor::TensorView, what: &str| -> Result<Vec<f32>> {
            if t.dtype() != safetensors::Dtype::F32 {
                bail!("{}: dtype {:?}, expected F32", ctx(what), t.dtype());
            }
            Ok(t.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        };
        let (granularity, scales) = if let Ok(t) = st.tensor(&format!("{prefix}.weight_scale_inv"))
        {
            let g = Granularity::BLOCK128;
            let want = [out.div_ceil(128), inp.div_ceil(128)];
            if t.shape() != want {
                bail!(
                    "{}: shape {:?}, expected {want:?} (128×128 blocks of [{out}, {inp}])",
                    ctx("weight_scale_inv"),
                    t.shape()
                );
            }
            (g, f32s(&t, "weight_scale_inv")?)
        } else if let Ok(t) = st.tensor(&format!("{prefix}.scale_weight")) {
            if t.shape().iter().product::<usize>() != 1 {
                bail!(
                    "{}: shape {:?}, expected a scalar",
                    ctx("scale_weight"),
                    t.shape()
                );
            }
            (Granularity::Tensor, f32s(&t, "scale_weight")?)
        } else {
            bail!(
                "{}: no scale (weight_scale_inv for 128×128 blocks, or ComfyUI's scale_weight)",
                ctx("weight")
            );
        };
        Self::from_parts(out, inp, w.data().to_vec(), granularity, scales)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", ctx("weight"))))
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.out, self.inp)
    }
    pub fn codes(&self) -> &[u8] {
        &self.codes
    }
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
    pub fn granularity(&self) -> Granularity {
        self.granularity
    }
    /// Bytes of codes plus scales.
    pub fn storage_bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }

    /// The represented values `[out, inp]` in f32.
    pub fn dequantize(&self, device: &Device) -> Result<Tensor> {
        let (g, inp) = (self.granularity, self.inp);
        let table = ElemFormat::E4M3.decode_table();
        let v: Vec<f32> = self
            .codes
            .iter()
            .enumerate()
            .map(|(p, &c)| table[c as usize] * self.scales[g.scale_index(p / inp, p % inp, inp)])
            .collect();
        Tensor::from_vec(v, (self.out, self.inp), device)
    }
}

/// The per-token FP8 values of `x [.., inp]` (each row with its own scale), in f32.
pub fn quantize_activations(x: &Tensor) -> Result<Tensor> {
    quantize_activations_grouped(x, None)
}

/// The FP8 values of `x [.., inp]` in f32, each row's `group`-wide slices along the last
/// axis (the whole row for `None`; the last slice may be shorter) with their own scale:
/// the decoded [`quantize_activation_codes`].
pub fn quantize_activations_grouped(x: &Tensor, group: Option<usize>) -> Result<Tensor> {
    let inp = *x.dims().last().unwrap_or(&0);
    let g = group.unwrap_or(inp).min(inp).max(1);
    let per_row = inp.div_ceil(g);
    let (codes, scales) = quantize_activation_codes(x, group)?;
    let table = ElemFormat::E4M3.decode_table();
    let q = codes
        .iter()
        .enumerate()
        .map(|(p, &c)| table[c as usize] * scales[(p / inp) * per_row + (p % inp) / g])
        .collect();
    Tensor::from_vec(q, x.dims(), &Device::Cpu)?.to_device(x.device())
}

/// The E4M3 codes and scales of `x [.., inp]` as [`quantize_activations_grouped`] defines
/// them: codes row-major `[rows, inp]`, scales row-major `[rows, groups]` (one group per
/// row for `None`). What the GPU kernel must produce bit for bit.
pub fn quantize_activation_codes(x: &Tensor, group: Option<usize>) -> Result<(Vec<u8>, Vec<f32>)> {
    let inp = *x.dims().last().unwrap_or(&0);
    let group = group.unwrap_or(inp).min(inp).max(1);
    let v: Vec<f32> = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    if let Some(p) = v.iter().position(|x| !x.is_finite()) {
        bail!(
            "FP8 linear: input holds a non-finite value ({}) at flat index {p}",
            v[p]
        );
    }
    let (mut codes, mut scales) = (Vec::with_capacity(v.len()), Vec::new());
    for row in v.chunks(inp.max(1)) {
        for g in row.chunks(group) {
            let s = group_scale(g.iter().fold(0f32, |m, x| m.max(x.abs())));
            scales.push(s);
            codes.extend(g.iter().map(|&x| quantize_with(x, s).0));
        }
    }
    Ok((codes, scales))
}

/// A bias of `out` values, or the error.
fn check_bias(bias: Option<&Tensor>, out: usize) -> Result<()> {
    if let Some(b) = bias {
        if b.dims() != [out] {
            bail!("FP8 linear: bias {:?} for {out} outputs", b.dims());
        }
    }
    Ok(())
}

/// A linear layer with FP8 weights and activations.
///
/// On the CPU it computes the reference (the weight's f32 values are made once, on the
/// first CPU call or at construction on the CPU). Built for a CUDA device (feature `cuda`),
/// it keeps the E4M3 codes and the scales on the device (no f32 copy of the weight; no host
/// copy of the codes either when quantized there, [`Fp8Linear::quantize`]) and a
/// CUDA input runs the GPU path (`cuda.rs`): activations quantized on the device, the FP8
/// GEMM by cuBLASLt. A CUDA call's non-finite-input check is deferred: it joins the
/// device's gathered checks, which `mxattn::attention::check_device` reads (the models do,
/// once per forward), so a call never waits for the GPU; [`Fp8Linear::forward_checked`]
/// reads it at the end of the call instead (one synchronization).
#[derive(Clone, Debug)]
pub struct Fp8Linear {
    out: usize,
    inp: usize,
    granularity: Granularity,
    /// The codes and scales on the host: set at construction from host weights; for a
    /// layer quantized on its CUDA device, copied back on first use ([`Self::weight`]).
    weight: std::sync::Arc<std::sync::OnceLock<Fp8Weight>>,
    /// The weight's values `[out, inp]` f32 on the CPU, for the reference product.
    values: std::sync::Arc<std::sync::OnceLock<Tensor>>,
    bias: Option<Tensor>,
    /// Activations as they come, not quantized ([`Self::weight_only`]).
    weight_only: bool,
    #[cfg(feature = "cuda")]
    gpu: Option<std::sync::Arc<cuda::GpuWeight>>,
    #[cfg(feature = "cuda")]
    force_fallback: bool,
    /// CUDA: the decode GEMV where it applies (default on; off for comparisons).
    #[cfg(feature = "cuda")]
    gemv: bool,
    /// CUDA: cuBLASLt's FP8 fast accumulation (off by default; [`Self::set_fast_accum`]).
    fast_accum: bool,
}

impl Fp8Linear {
    /// A layer from host codes and scales (quantized on the host, or an FP8 checkpoint's),
    /// uploaded to `device` if it is a CUDA device.
    pub fn new(weight: Fp8Weight, bias: Option<Tensor>, device: &Device) -> Result<Self> {
        check_bias(bias.as_ref(), weight.out)?;
        let values = std::sync::Arc::new(std::sync::OnceLock::new());
        #[cfg(feature = "cuda")]
        let gpu = match device {
            Device::Cuda(d) => Some(std::sync::Arc::new(cuda::GpuWeight::upload(
                &weight,
                bias.as_ref(),
                d,
            )?)),
            _ => None,
        };
        if device.is_cpu() {
            let _ = values.set(weight.dequantize(&Device::Cpu)?);
        }
        let bias = match bias {
            Some(b) => Some(b.to_device(device)?),
            None => None,
        };
        Ok(Self {
            out: weight.out,
            inp: weight.inp,
            granularity: weight.granularity,
            weight: std::sync::Arc::new(std::sync::OnceLock::from(weight)),
            values,
            bias,
            weight_only: false,
            #[cfg(feature = "cuda")]
            gpu,
            #[cfg(feature = "cuda")]
            force_fallback: false,
            #[cfg(feature = "cuda")]
            gemv: true,
            fast_accum: false,
        })
    }

    /// Quantizes `w [out, in]` (any float dtype) with scales of `granularity` into a layer
    /// on w's device, with [`Fp8Weight::quantize`]'s codes and scales. With the feature
    /// `cuda` and `w` on a CUDA device this runs there (`kernels/fp8_quantize.cu`, bit for
    /// bit the host's): a model's weights, billions of values made or loaded on the GPU, do
    /// not go to the host and back, and no host copy of the codes is kept unless
    /// [`Self::weight`] asks for it. A non-finite weight errs, naming its value and
    /// position (one synchronization per layer reads the device's flag). Elsewhere it is
    /// [`Fp8Weight::quantize`] and [`Self::new`].
    pub fn quantize(w: &Tensor, granularity: Granularity, bias: Option<Tensor>) -> Result<Self> {
        let (out, _) = weight_dims(w, granularity)?;
        check_bias(bias.as_ref(), out)?;
        // (an empty matrix has nothing to quantize: the host path makes its scales)
        #[cfg(feature = "cuda")]
        if let (Device::Cuda(d), true) = (w.device(), w.elem_count() > 0) {
            let gpu = cuda::GpuWeight::quantize(w, granularity, bias.as_ref(), d)?;
            return Ok(Self {
                out,
                inp: w.dim(1)?,
                granularity,
                weight: std::sync::Arc::new(std::sync::OnceLock::new()),
                values: std::sync::Arc::new(std::sync::OnceLock::new()),
                bias: match bias {
                    Some(b) => Some(b.to_device(w.device())?),
                    None => None,
                },
                weight_only: false,
                gpu: Some(std::sync::Arc::new(gpu)),
                force_fallback: false,
                gemv: true,
                fast_accum: false,
            });
        }
        Self::new(Fp8Weight::quantize(w, granularity)?, bias, w.device())
    }

    /// The layer as a weight-only one (`on`) or with FP8 activations (the default).
    ///
    /// **Weight-only** (W8A16): the weight stays in FP8 (the bytes a decode step reads, half
    /// of BF16's) and the activations are not quantized: `y = x · Wᵀ + b` with W's FP8 values,
    /// x as it comes (its dtype's values), accumulated in f32, output in x's dtype. On
    /// SmolLM2-135M it keeps perplexity within the 2 % that FP8 activations miss
    /// (`evals/results/llm_quality_smollm2/fp8_linear.md`). Like a dense layer it does not
    /// check its input for NaN/Inf. Tensor or channel weight scales only: a block-scaled
    /// weight errs (its partial sums would each need their own scale). On CUDA: a GEMV up to
    /// 8 tokens, a GEMM of x's dtype (f32 for f16) over the codes' values beyond (`cuda.rs`).
    pub fn weight_only(mut self, on: bool) -> Result<Self> {
        if on && matches!(self.granularity, Granularity::Block { .. }) {
            bail!(
                "FP8 linear [{}, {}]: weight-only layers take tensor or channel scales, not {:?}",
                self.out,
                self.inp,
                self.granularity
            );
        }
        self.weight_only = on;
        Ok(self)
    }

    /// Whether the activations stay unquantized ([`Self::weight_only`]).
    pub fn is_weight_only(&self) -> bool {
        self.weight_only
    }

    /// CUDA: cuBLASLt's FP8 GEMM with fast accumulation (`CUBLASLT_MATMUL_DESC_FAST_ACCUM`,
    /// the `fp8-fast` linear format): the tensor cores' FP8 sums are not promoted to f32 every
    /// few k-steps, which is faster on Hopper (1.19–1.24× at the A14B shapes on an H100,
    /// `evals/results/wan_fp8_linear_h100/`) and loses low bits of long sums. Off by default.
    /// It changes nothing on the CPU (whose reference sums in f32) nor on the GEMV and
    /// fallback paths, and a layer with 128 × 128 block scales keeps the promoted sums:
    /// cuBLASLt has no fast-accumulation GEMM for them (measured on an H100: the layer took
    /// its slower fallback).
    pub fn set_fast_accum(&mut self, on: bool) {
        self.fast_accum = on && !matches!(self.granularity, Granularity::Block { .. });
    }

    /// [`Self::set_fast_accum`] as a builder.
    pub fn fast_accum(mut self, on: bool) -> Self {
        self.set_fast_accum(on);
        self
    }

    pub fn is_fast_accum(&self) -> bool {
        self.fast_accum
    }

    /// The weight's f32 values on the CPU (made on first use).
    fn values(&self) -> Result<&Tensor> {
        if let Some(v) = self.values.get() {
            return Ok(v);
        }
        let v = self.weight()?.dequantize(&Device::Cpu)?;
        Ok(self.values.get_or_init(|| v))
    }

    /// The codes and scales on the host. A layer quantized on its CUDA device
    /// ([`Self::quantize`]) copies them from there on the first call (an error is the
    /// copy's); the shape, granularity and size need no copy: [`Self::shape`],
    /// [`Self::granularity`], [`Self::storage_bytes`].
    pub fn weight(&self) -> Result<&Fp8Weight> {
        if let Some(w) = self.weight.get() {
            return Ok(w);
        }
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            let w = g.download()?;
            return Ok(self.weight.get_or_init(|| w));
        }
        bail!(
            "FP8 linear [{}, {}]: internal error: no weight on the host or a device",
            self.out,
            self.inp
        )
    }

    /// `(out, in)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.out, self.inp)
    }

    pub fn granularity(&self) -> Granularity {
        self.granularity
    }

    /// Bytes of codes plus scales, as [`Fp8Weight::storage_bytes`].
    pub fn storage_bytes(&self) -> usize {
        self.out * self.inp + 4 * self.granularity.scale_count(self.out, self.inp)
    }

    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// Width of the activation groups along the input that share a scale: the whole row
    /// (`None`) with tensor or channel weight scales, the weight block's columns with blocks.
    pub fn activation_group(&self) -> Option<usize> {
        match self.granularity {
            Granularity::Block { cols, .. } => Some(cols),
            _ => None,
        }
    }

    /// `x [.., inp]` → `[.., out]` in x's dtype: on the CPU the reference of the FP8 GEMM
    /// (the product of the FP8 values accumulated in f32); on CUDA the GPU path, its
    /// non-finite-input check deferred (see the type's doc).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_impl(x, false)
    }

    /// As [`Self::forward`], but a CUDA call reads its non-finite-input check at its end
    /// (one host synchronization) and errs there, as the CPU does.
    pub fn forward_checked(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_impl(x, true)
    }

    fn forward_impl(&self, x: &Tensor, checked: bool) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let inp = *dims.last().unwrap_or(&0);
        if inp != self.inp {
            bail!(
                "FP8 linear: input {:?} has {inp} features, the layer takes {}",
                dims,
                self.inp
            );
        }
        if let Device::Cuda(_) = x.device() {
            #[cfg(feature = "cuda")]
            if let Some(g) = &self.gpu {
                if self.weight_only {
                    return g.forward_weight_only(x);
                }
                let checks = if checked {
                    mxattn::attention::DeviceChecks::PerCall
                } else {
                    mxattn::attention::DeviceChecks::Deferred
                };
                return g.forward(
                    x,
                    self.activation_group(),
                    checks,
                    self.force_fallback,
                    self.gemv,
                    self.fast_accum,
                );
            }
            bail!(
                "FP8 linear [{}, {}]: input on CUDA, but the layer was not built for a CUDA device{}",
                self.out,
                self.inp,
                if cfg!(feature = "cuda") {
                    ""
                } else {
                    " (mxattn-fp8 is built without its `cuda` feature)"
                }
            );
        }
        let _ = checked;
        let rows = x.elem_count() / inp.max(1);
        let a = if self.weight_only {
            x.to_dtype(DType::F32)?.reshape((rows, inp))?
        } else {
            quantize_activations_grouped(x, self.activation_group())?.reshape((rows, inp))?
        };
        let mut y = a.matmul(&self.values()?.t()?)?;
        if let Some(b) = &self.bias {
            y = y.broadcast_add(&b.to_device(&Device::Cpu)?.to_dtype(DType::F32)?)?;
        }
        let mut out = dims;
        *out.last_mut().expect("rank ≥ 1") = self.out;
        y.reshape(out)?.to_dtype(x.dtype())
    }
}

#[cfg(feature = "cuda")]
impl Fp8Linear {
    /// CUDA: take the fallback GEMM (scalar-scaled cuBLASLt GEMMs and mxattn's scale
    /// epilogue) even where cuBLASLt takes the scales itself: for tests and benchmarks.
    pub fn set_force_fallback(&mut self, on: bool) {
        self.force_fallback = on;
    }

    /// CUDA: whether an all-FP8 layer with tensor or channel scales takes the decode GEMV
    /// (`kernels/fp8_gemv.cu`) up to [`FP8_GEMV_MAX_TOKENS`] tokens (the default) or cuBLASLt's GEMM there: for
    /// tests and benchmarks. Weight-only layers always take it.
    pub fn set_gemv(&mut self, on: bool) {
        self.gemv = on;
    }

    /// The GEMM the last CUDA forward of this layer (or a clone of it) ran; None before one.
    pub fn last_gpu_path(&self) -> Option<GemmPath> {
        self.gpu.as_ref().and_then(|g| g.last_path())
    }

    /// Bytes the layer holds on its CUDA device (E4M3 codes, padded, and the f32 scales);
    /// None for a CPU layer.
    pub fn device_bytes(&self) -> Option<usize> {
        self.gpu.as_ref().map(|g| g.device_bytes())
    }

    /// For tests: the device codes `[out_p, in_p]` (U8, padding included) and the weight
    /// scales as the GEMM reads them (flat f32); None for a CPU layer.
    #[doc(hidden)]
    pub fn device_weight(&self) -> Option<(Tensor, Tensor)> {
        self.gpu.as_ref().map(|g| g.device_parts())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_indices_cover_ragged_edges() {
        let g = Granularity::BLOCK128;
        assert_eq!(g.scale_count(40, 136), 2);
        assert_eq!(g.scale_index(39, 127, 136), 0);
        assert_eq!(g.scale_index(39, 128, 136), 1);
        assert_eq!(g.scale_count(300, 300), 9);
        assert_eq!(g.scale_index(299, 299, 300), 8);
        assert_eq!(Granularity::Channel.scale_index(5, 9, 10), 5);
    }
}
