//! Attention over a KV cache as it is stored: K and V dense, or MX codes with E8M0 scales
//! (K along the head dim, V along the keys plus an unquantized tail), so a decode step can
//! read the quantized cache directly instead of dequantizing it first.
//!
//! [`attention_decode`] computes what [`super::attention`] computes on the dequantized
//! operands, bit for bit. On CUDA, an exact-softmax call with few query rows per KV head
//! (decode) and head dim 128 runs the split-KV decode kernel (`kernels/attention_decode.cu`),
//! which reads the codes as stored. Every other call runs the attention op, which takes an
//! MX operand as stored when its codes are what the op would make (the config's format, or
//! a native one, with no rotation to apply): it decodes them into its prepared operand
//! instead of dequantizing the cache and quantizing it again. Other operands are dequantized.

use super::op::KvInput;
use super::{Algorithm, AttentionConfig, Meta, OperandFormat, ProbFormat, RunOptions};
use crate::mx::{MxTensor, ScaleMode};
use candle_core::{bail, DType, Result, Tensor};

/// K or V of one attention layer's cache, `[b, hkv, n, d]` as represented.
#[derive(Clone, Debug)]
pub enum KvOperand<'a> {
    /// A plain tensor.
    Dense(&'a Tensor),
    /// MX codes and scales of the quantized part (K: along d over every token; V: along
    /// the keys over the first `n_full` tokens), then the tokens kept unquantized (V's
    /// partial last block).
    Mx {
        full: Option<MxTensor>,
        tail: Option<&'a Tensor>,
    },
}

impl KvOperand<'_> {
    /// The logical shape `[b, hkv, n, d]`; a V's codes and tail must agree but for n.
    pub fn dims(&self) -> Result<Vec<usize>> {
        match self {
            Self::Dense(t) => Ok(t.dims().to_vec()),
            Self::Mx { full, tail } => {
                let f = full.as_ref().map(|m| m.shape().dims().to_vec());
                let t = tail.map(|t| t.dims().to_vec());
                match (f, t) {
                    (Some(f), Some(t)) => {
                        if f.len() != 4 || t.len() != 4 || f[..2] != t[..2] || f[3] != t[3] {
                            bail!(
                                "attention_decode: MX part {f:?} and tail {t:?} of one operand differ"
                            );
                        }
                        Ok(vec![f[0], f[1], f[2] + t[2], f[3]])
                    }
                    (Some(d), None) | (None, Some(d)) => Ok(d),
                    (None, None) => bail!("attention_decode: empty MX operand"),
                }
            }
        }
    }

    /// The represented values, `[b, hkv, n, d]` in `dtype`.
    pub fn to_tensor(&self, dtype: DType) -> Result<Tensor> {
        match self {
            Self::Dense(t) => t.to_dtype(dtype),
            Self::Mx { full, tail } => {
                let full = full
                    .as_ref()
                    .map(|m| m.dequantize()?.to_dtype(dtype))
                    .transpose()?;
                match (full, tail) {
                    (Some(f), Some(t)) => Tensor::cat(&[&f, &t.to_dtype(dtype)?], 2),
                    (Some(f), None) => Ok(f),
                    (None, Some(t)) => t.to_dtype(dtype),
                    (None, None) => bail!("attention_decode: empty MX operand"),
                }
            }
        }
    }
}

/// Whether the CUDA decode kernel computes this call (else it is dequantized).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn kernel_takes(cfg: &AttentionConfig) -> bool {
    matches!(cfg.algorithm, Algorithm::Exact)
        && cfg.qk_format == OperandFormat::Native
        && cfg.v_format == OperandFormat::Native
        && cfg.p_format == ProbFormat::F32
        && cfg.key_lengths.is_none()
}

/// Attention of `q` (`[b, hq, sq, d]`) over cached `k` and `v`: the same result as
/// [`super::attention`] on `k.to_tensor(q.dtype())` and `v.to_tensor(q.dtype())`.
pub fn attention_decode(
    q: &Tensor,
    k: &KvOperand,
    v: &KvOperand,
    cfg: &AttentionConfig,
) -> Result<Tensor> {
    attention_decode_ext(q, k, v, cfg, &RunOptions::default())
}

/// [`attention_decode`] with the options of [`super::attention_ext`] for the calls the decode
/// kernel does not take (e.g. [`super::DeviceChecks::Deferred`]); the output only (`lse` is
/// ignored).
pub fn attention_decode_ext(
    q: &Tensor,
    k: &KvOperand,
    v: &KvOperand,
    cfg: &AttentionConfig,
    opts: &RunOptions,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if q.device().is_cuda() && kernel_takes(cfg) {
        if let Some(o) = crate::cuda::decode::attention_decode(q, k, v, cfg)? {
            return Ok(o);
        }
    }
    let dt = q.dtype();
    let opts = RunOptions {
        lse: false,
        ..*opts
    };
    let (kin, vin) = (kv_input(k, cfg, dt, true)?, kv_input(v, cfg, dt, false)?);
    if let (KvInput::Dense(k), KvInput::Dense(v)) = (&kin, &vin) {
        return Ok(super::attention_ext(q, k, v, cfg, &opts)?.out);
    }
    let (kd, vd) = (k.dims()?, v.dims()?);
    let dev = q.device();
    let meta = |dims| Meta {
        dims,
        dtype: dt,
        device: dev,
    };
    let (kd, vd) = (kd.as_slice(), vd.as_slice());
    Ok(super::attention_kv(q, (meta(kd), meta(vd)), [kin, vin], cfg, &opts)?.out)
}

/// Whether [`attention_decode`] hands `k` and `v` to the attention op as stored codes
/// (`true`) or dequantizes them first, for queries of `dtype` (calls the CUDA decode kernel
/// takes aside).
pub fn takes_as_stored(
    k: &KvOperand,
    v: &KvOperand,
    cfg: &AttentionConfig,
    dtype: DType,
) -> (bool, bool) {
    (
        stored_parts(k, cfg, dtype, true).is_some(),
        stored_parts(v, cfg, dtype, false).is_some(),
    )
}

/// The codes (and V's tail) of `x` where the op takes them as stored ([`takes_stored`]; a K
/// has no tail).
fn stored_parts<'a>(
    x: &KvOperand<'a>,
    cfg: &AttentionConfig,
    dt: DType,
    is_k: bool,
) -> Option<(MxTensor, Option<&'a Tensor>)> {
    match x {
        KvOperand::Mx {
            full: Some(m),
            tail,
        } if takes_stored(m, cfg, dt, is_k) && (!is_k || tail.is_none()) => {
            Some((m.clone(), *tail))
        }
        _ => None,
    }
}

/// Whether the op takes MX codes `m` of K (`is_k`: along d) or V (along the keys, whole
/// blocks) as stored: they must be what the op's own preparation would make of their values,
/// so that skipping it changes nothing. The config's format (a scale rule under which
/// requantization is a fixed point) or a native one (no rounding);
/// no Hadamard rotation (it would rotate before quantizing); every key valid (padding keys
/// are zeroed before V's scales are taken); q in f32 or bf16 (the dtypes every MX value
/// converts to as it is, as the dequantizing path converts them).
fn takes_stored(m: &MxTensor, cfg: &AttentionConfig, dt: DType, is_k: bool) -> bool {
    let fmt = if is_k { cfg.qk_format } else { cfg.v_format };
    let same = match fmt {
        OperandFormat::Native => true,
        // Quantizing dequantized MX values again gives them back under Floor, Ceil, Rceil
        // and Even (`tests/mx_tensor.rs`), so skipping it changes nothing. Not under AMD's
        // round-up rule: a block whose largest code is 448 re-derives a scale one binade
        // up and can flush its E4M3 subnormals, so those codes take the dequantizing path.
        OperandFormat::Mx { elem, scale, block } => {
            elem == m.format()
                && scale == m.scale_mode()
                && block == m.block()
                && scale != ScaleMode::RoundUp
        }
        _ => false,
    };
    let rotates = matches!(&cfg.algorithm, Algorithm::FusedSoftmax(f) if f.hadamard);
    let dim = if is_k { 3 } else { 2 };
    let whole_blocks = m.shape().dims()[dim].is_multiple_of(m.block());
    same && !rotates
        && cfg.key_lengths.is_none()
        && matches!(dt, DType::F32 | DType::BF16)
        && m.dim() == dim
        && (is_k || whole_blocks)
}

/// K or V as the op takes it: stored codes where [`takes_stored`], else the dequantized
/// values in `dt`.
fn kv_input(x: &KvOperand, cfg: &AttentionConfig, dt: DType, is_k: bool) -> Result<KvInput> {
    match stored_parts(x, cfg, dt, is_k) {
        Some((m, tail)) => {
            let full = MxTensor::from_parts(
                m.codes().contiguous()?,
                m.scales().contiguous()?,
                m.format(),
                m.scale_mode(),
                m.block(),
                m.dim(),
                m.shape().clone(),
            )?;
            let tail = tail.map(|t| t.to_dtype(dt)?.contiguous()).transpose()?;
            Ok(KvInput::Stored { full, tail })
        }
        None => Ok(KvInput::Dense(x.to_tensor(dt)?.contiguous()?)),
    }
}
