//! Attention over a KV cache as it is stored: K and V dense, or MX codes with E8M0 scales
//! (K along the head dim, V along the keys plus an unquantized tail), so a decode step can
//! read the quantized cache directly instead of dequantizing it first.
//!
//! [`attention_decode`] computes what [`super::attention`] computes on the dequantized
//! operands. On CUDA, an exact-softmax call with few query rows per KV head (decode) and
//! head dim 128 runs the split-KV decode kernel (`kernels/attention_decode.cu`), which reads
//! the codes as stored; every other call dequantizes and runs the attention op.

use super::{Algorithm, AttentionConfig, OperandFormat, ProbFormat, RunOptions};
use crate::mx::MxTensor;
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
    Ok(super::attention_ext(q, &k.to_tensor(dt)?, &v.to_tensor(dt)?, cfg, &opts)?.out)
}
