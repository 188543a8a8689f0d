//! `x + (y + bias)·gate`: a residual add with the projection's bias and the block's f32 gate
//! (diffusers' `(x.float() + y·gate).type_as(x)`) in one pass. CUDA kernel:
//! `kernels/bias_residual.cu`.

use super::{activation_dims, contiguous_slice, CpuRows, Float, RowParam, Rows};
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

const OP: &str = "bias_residual";

pub(crate) struct BiasResidualOp {
    pub bias: Option<Tensor>,
    pub gate: Option<RowParam>,
    pub n: usize,
    pub d: usize,
}

/// `x + (y + bias)·gate` for `x, y [b, n, d]` of one dtype, bias `[d]` (the sum `y + bias`
/// rounded to that dtype, as a projection's output), gate f32 `[b | 1, n | 1, d]` with an
/// optional added `[d]` vector ([`Rows`]); computed in f32 and rounded once.
pub fn bias_residual(
    x: &Tensor,
    y: &Tensor,
    bias: Option<&Tensor>,
    gate: Option<Rows>,
) -> Result<Tensor> {
    let (b, n, d) = activation_dims(OP, x)?;
    if y.dims() != x.dims() || y.dtype() != x.dtype() {
        bail!(
            "{OP}: y {:?} {:?} must match x {:?} {:?}",
            y.dims(),
            y.dtype(),
            x.dims(),
            x.dtype()
        );
    }
    let bias = match bias {
        Some(v) => Some(super::vector(OP, "bias", v, d, x.dtype())?),
        None => None,
    };
    let gate = match gate {
        Some(g) => Some(RowParam::new(OP, "gate", g, b, n, d)?),
        None => None,
    };
    let op = BiasResidualOp { bias, gate, n, d };
    x.contiguous()?.apply_op2_no_bwd(&y.contiguous()?, &op)
}

impl BiasResidualOp {
    fn cpu_rows<T: Float>(&self, x: &[T], y: &[T]) -> Result<Vec<T>> {
        let (n, d) = (self.n, self.d);
        let bias = match &self.bias {
            Some(b) => Some(super::host_f32(b)?),
            None => None,
        };
        let mut out = vec![T::from_f32(0.0); x.len()];
        let mut run = |gate: Option<&CpuRows>| {
            out.par_chunks_mut(d)
                .zip(x.par_chunks(d).zip(y.par_chunks(d)))
                .enumerate()
                .for_each(|(row, (o, (xr, yr)))| {
                    let (i, t) = (row / n, row % n);
                    for c in 0..d {
                        let mut v = yr[c].to_f32();
                        if let Some(b) = &bias {
                            v = T::round(v + b[c]);
                        }
                        if let Some(g) = gate {
                            v *= g.at(i, t, c);
                        }
                        o[c] = T::from_f32(xr[c].to_f32() + v);
                    }
                });
        };
        match &self.gate {
            Some(g) => g.with_cpu(|v| run(Some(v)))?,
            None => run(None),
        }
        Ok(out)
    }
}

impl CustomOp2 for BiasResidualOp {
    fn name(&self) -> &'static str {
        "mxattn-bias-residual"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(y)) => CpuStorage::F32(
                self.cpu_rows(contiguous_slice(OP, x, l1)?, contiguous_slice(OP, y, l2)?)?,
            ),
            (CpuStorage::BF16(x), CpuStorage::BF16(y)) => CpuStorage::BF16(
                self.cpu_rows(contiguous_slice(OP, x, l1)?, contiguous_slice(OP, y, l2)?)?,
            ),
            (CpuStorage::F16(x), CpuStorage::F16(y)) => CpuStorage::F16(
                self.cpu_rows(contiguous_slice(OP, x, l1)?, contiguous_slice(OP, y, l2)?)?,
            ),
            _ => bail!("{OP}: x and y must be both f32, bf16 or f16"),
        };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::fused::bias_residual(self, s1, l1, s2, l2)
    }
}
