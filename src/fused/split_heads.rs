//! `[b, n, heads·hd]` projection output → `[b, heads, n, hd]` attention operand with the
//! projection bias, an RMSNorm across all heads (Wan's `norm_q`/`norm_k`) and the interleaved
//! RoPE (pairs `(2i, 2i+1)`, Candle's `rope_i`) folded in: one pass instead of five. CUDA kernel:
//! `kernels/split_heads.cu`.

use super::{activation_dims, Float};
use candle_core::{bail, DType, Result, Tensor};
use rayon::prelude::*;

const OP: &str = "split_heads";

/// What [`split_heads`] folds in; all optional (none: a plain head split).
#[derive(Clone, Copy, Debug, Default)]
pub struct SplitHeads<'a> {
    /// `[dim]`, added first (the sum rounded to the input dtype).
    pub bias: Option<&'a Tensor>,
    /// `[dim]`: `u / sqrt(mean(u²) + eps) · w` over the whole row, rounded to the input dtype.
    pub rms_weight: Option<&'a Tensor>,
    pub eps: f32,
    /// `(cos, sin)`, f32 `[tokens, head_dim / 2]`: rotation of each pair in f32.
    pub rope: Option<(&'a Tensor, &'a Tensor)>,
}

pub(crate) struct SplitHeadsOp {
    pub bias: Option<Tensor>,
    pub rms_weight: Option<Tensor>,
    pub eps: f32,
    pub rope: Option<(Tensor, Tensor)>,
    pub n: usize,
    pub heads: usize,
    pub hd: usize,
}

/// Splits `t [b, n, heads·hd]` into `[b, heads, n, hd]` (contiguous, t's dtype), applying
/// bias, RMSNorm and RoPE as `opts` says.
pub fn split_heads(t: &Tensor, heads: usize, opts: &SplitHeads) -> Result<Tensor> {
    let (b, n, d) = activation_dims(OP, t)?;
    if heads == 0 || !d.is_multiple_of(heads) || !(d / heads).is_multiple_of(2) {
        bail!("{OP}: dim {d} does not split into {heads} heads of an even size");
    }
    let hd = d / heads;
    let dt = t.dtype();
    let bias = match opts.bias {
        Some(v) => Some(super::vector(OP, "bias", v, d, dt)?),
        None => None,
    };
    let rms_weight = match opts.rms_weight {
        Some(v) => {
            if !(opts.eps.is_finite() && opts.eps > 0.0) {
                bail!("{OP}: eps must be positive and finite, got {}", opts.eps);
            }
            Some(super::vector(OP, "RMSNorm weight", v, d, dt)?)
        }
        None => None,
    };
    let rope = match opts.rope {
        Some((c, s)) => {
            for (what, x) in [("cos", c), ("sin", s)] {
                if x.dims() != [n, hd / 2] {
                    bail!(
                        "{OP}: RoPE {what} must be [{n}, {}], got {:?}",
                        hd / 2,
                        x.dims()
                    );
                }
            }
            Some((
                c.to_dtype(DType::F32)?.contiguous()?,
                s.to_dtype(DType::F32)?.contiguous()?,
            ))
        }
        None => None,
    };
    let op = SplitHeadsOp {
        bias,
        rms_weight,
        eps: opts.eps,
        rope,
        n,
        heads,
        hd,
    };
    t.contiguous()?
        .apply_op1_no_bwd(&op)?
        .reshape((b, heads, n, hd))
}

impl SplitHeadsOp {
    fn cpu_rows<T: Float>(&self, x: &[T]) -> Result<Vec<T>> {
        let (n, heads, hd) = (self.n, self.heads, self.hd);
        let d = heads * hd;
        let rows = x.len() / d;
        let bias = match &self.bias {
            Some(b) => Some(super::host_f32(b)?),
            None => None,
        };
        let w = match &self.rms_weight {
            Some(w) => Some(super::host_f32(w)?),
            None => None,
        };
        let rope = match &self.rope {
            Some((c, s)) => Some((super::host_f32(c)?, super::host_f32(s)?)),
            None => None,
        };
        // each row's values after bias and norm, in the input dtype's precision
        let normed: Vec<Vec<f32>> = x
            .par_chunks(d)
            .map(|xr| {
                let mut u: Vec<f32> = xr.iter().map(|v| v.to_f32()).collect();
                if let Some(b) = &bias {
                    u.iter_mut().zip(b).for_each(|(u, b)| *u = T::round(*u + b));
                }
                if let Some(w) = &w {
                    let ms = u.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / d as f64;
                    let norm = (ms + self.eps as f64).sqrt() as f32;
                    u.iter_mut()
                        .zip(w)
                        .for_each(|(u, w)| *u = T::round(*u / norm * w));
                }
                u
            })
            .collect();
        let mut out = vec![T::from_f32(0.0); x.len()];
        // output rows [(b·heads + h)·n + t] of hd values
        out.par_chunks_mut(hd).enumerate().for_each(|(orow, y)| {
            let (bh, t) = (orow / n, orow % n);
            let (bi, h) = (bh / heads, bh % heads);
            let u = &normed[bi * n + t][h * hd..(h + 1) * hd];
            for i in 0..hd / 2 {
                let (u0, u1) = (u[2 * i], u[2 * i + 1]);
                let (o0, o1) = match &rope {
                    Some((cs, sn)) => {
                        let (c, s) = (cs[t * hd / 2 + i], sn[t * hd / 2 + i]);
                        (u0 * c - u1 * s, u0 * s + u1 * c)
                    }
                    None => (u0, u1),
                };
                y[2 * i] = T::from_f32(o0);
                y[2 * i + 1] = T::from_f32(o1);
            }
        });
        debug_assert_eq!(out.len(), rows * d);
        Ok(out)
    }
}

super::fused_op1!(
    SplitHeadsOp,
    "mxattn-split-heads",
    OP,
    cpu_rows,
    split_heads
);
