//! `gelu_tanh(t + bias)` in f32: the epilogue of an FFN's up projection in one pass (the sum
//! rounded to t's dtype first, as the projection's output would be). CUDA kernel:
//! `kernels/bias_gelu.cu`.

use super::Float;
use candle_core::{bail, DType, Result, Tensor};
use rayon::prelude::*;

const OP: &str = "bias_gelu";

pub(crate) struct BiasGeluOp {
    pub bias: Option<Tensor>,
    pub d: usize,
}

/// GELU with the tanh approximation, `0.5·v·(1 + tanh(√(2/π)·(v + 0.044715·v³)))`, of
/// `v = t + bias` (bias `[d]`, d the last dim), computed in f32 and returned in t's dtype.
pub fn bias_gelu(t: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if !matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16) {
        bail!("{OP}: dtype {:?} unsupported (f32, bf16, f16)", t.dtype());
    }
    let d = match t.dims().last() {
        Some(&d) if d > 0 && t.elem_count() > 0 => d,
        _ => bail!("{OP}: expected a non-empty tensor, got {:?}", t.dims()),
    };
    let bias = match bias {
        Some(b) => Some(super::vector(OP, "bias", b, d, t.dtype())?),
        None => None,
    };
    t.contiguous()?.apply_op1_no_bwd(&BiasGeluOp { bias, d })
}

pub(crate) fn gelu_tanh(v: f32) -> f32 {
    let inner = 0.797_884_6_f32 * (v + 0.044715 * v * v * v);
    0.5 * v * (1.0 + inner.tanh())
}

impl BiasGeluOp {
    fn cpu_rows<T: Float>(&self, x: &[T]) -> Result<Vec<T>> {
        let bias = match &self.bias {
            Some(b) => Some(super::host_f32(b)?),
            None => None,
        };
        let mut out = vec![T::from_f32(0.0); x.len()];
        out.par_chunks_mut(self.d)
            .zip(x.par_chunks(self.d))
            .for_each(|(y, xr)| {
                for c in 0..self.d {
                    let mut v = xr[c].to_f32();
                    if let Some(b) = &bias {
                        v = T::round(v + b[c]);
                    }
                    y[c] = T::from_f32(gelu_tanh(v));
                }
            });
        Ok(out)
    }
}

super::fused_op1!(BiasGeluOp, "mxattn-bias-gelu", OP, cpu_rows, bias_gelu);
