//! `(LN(x)·w + b)·(1 + scale) + shift`: the LayerNorm plus adaptive modulation of diffusion
//! transformer blocks (diffusers' `FP32LayerNorm` then `norm·(1 + scale) + shift`, all in f32),
//! in one pass. CUDA kernel: `kernels/ada_layer_norm.cu`.

use super::{activation_dims, CpuRows, Float, RowParam, Rows};
use candle_core::{bail, DType, Result, Tensor};
use rayon::prelude::*;

const OP: &str = "ada_layer_norm";

pub(crate) struct AdaLayerNormOp {
    /// f32 `[d]` weight and bias.
    pub affine: Option<(Tensor, Tensor)>,
    /// (shift, scale).
    pub modulation: Option<(RowParam, RowParam)>,
    pub eps: f32,
    pub n: usize,
    pub d: usize,
}

/// LayerNorm of `x [b, n, d]` (f32, bf16 or f16) over `d`, computed in f32, then the affine
/// `·weight + bias` (f32 `[d]`) if given, then `·(1 + scale) + shift` if given (f32,
/// `[b | 1, n | 1, d]`, views allowed, each with an optional added `[d]` vector: [`Rows`]),
/// returned in x's dtype.
pub fn ada_layer_norm(
    x: &Tensor,
    affine: Option<(&Tensor, &Tensor)>,
    modulation: Option<(Rows, Rows)>,
    eps: f32,
) -> Result<Tensor> {
    let (b, n, d) = activation_dims(OP, x)?;
    if !(eps.is_finite() && eps > 0.0) {
        bail!("{OP}: eps must be positive and finite, got {eps}");
    }
    let affine = match affine {
        Some((w, bias)) => Some((
            super::vector(OP, "weight", w, d, DType::F32)?,
            super::vector(OP, "bias", bias, d, DType::F32)?,
        )),
        None => None,
    };
    let modulation = match modulation {
        Some((shift, scale)) => Some((
            RowParam::new(OP, "shift", shift, b, n, d)?,
            RowParam::new(OP, "scale", scale, b, n, d)?,
        )),
        None => None,
    };
    let op = AdaLayerNormOp {
        affine,
        modulation,
        eps,
        n,
        d,
    };
    x.contiguous()?.apply_op1_no_bwd(&op)
}

impl AdaLayerNormOp {
    fn cpu_rows<T: Float>(&self, x: &[T]) -> Result<Vec<T>> {
        let (n, d) = (self.n, self.d);
        let affine = match &self.affine {
            Some((w, b)) => Some((super::host_f32(w)?, super::host_f32(b)?)),
            None => None,
        };
        let mut out = vec![T::from_f32(0.0); x.len()];
        let mut run = |shift: Option<(&CpuRows, &CpuRows)>| {
            out.par_chunks_mut(d)
                .zip(x.par_chunks(d))
                .enumerate()
                .for_each(|(row, (y, xr))| {
                    let mean = xr.iter().map(|v| v.to_f32() as f64).sum::<f64>() / d as f64;
                    let var = xr
                        .iter()
                        .map(|v| (v.to_f32() as f64 - mean).powi(2))
                        .sum::<f64>()
                        / d as f64;
                    let rstd = 1.0 / (var + self.eps as f64).sqrt();
                    let (mean, rstd) = (mean as f32, rstd as f32);
                    let (i, t) = (row / n, row % n);
                    for c in 0..d {
                        let mut z = (xr[c].to_f32() - mean) * rstd;
                        if let Some((w, b)) = &affine {
                            z = z * w[c] + b[c];
                        }
                        if let Some((sh, sc)) = shift {
                            z = z * (1.0 + sc.at(i, t, c)) + sh.at(i, t, c);
                        }
                        y[c] = T::from_f32(z);
                    }
                });
        };
        match &self.modulation {
            Some((sh, sc)) => sh.with_cpu(|vs| sc.with_cpu(|vc| run(Some((vs, vc)))))??,
            None => run(None),
        }
        Ok(out)
    }
}

super::fused_op1!(
    AdaLayerNormOp,
    "mxattn-ada-layer-norm",
    OP,
    cpu_rows,
    ada_layer_norm
);
