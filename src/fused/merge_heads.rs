//! `[b, heads, n, hd]` → `[b, n, heads·hd]`: the attention output back to the layout of the
//! output projection, as one copy kernel (`kernels/merge_heads.cu`). The inverse of
//! [`super::split_heads`] without options.

use candle_core::{bail, DType, Result, Tensor};

const OP: &str = "merge_heads";

pub(crate) struct MergeHeadsOp {
    pub n: usize,
    pub heads: usize,
    pub hd: usize,
}

/// Merges the heads of `o [b, heads, n, hd]` into `[b, n, heads·hd]` (contiguous, o's dtype).
pub fn merge_heads(o: &Tensor) -> Result<Tensor> {
    if !matches!(o.dtype(), DType::F32 | DType::BF16 | DType::F16) {
        bail!("{OP}: dtype {:?} unsupported (f32, bf16, f16)", o.dtype());
    }
    let (b, heads, n, hd) = match o.dims() {
        [b, h, n, d] if o.elem_count() > 0 => (*b, *h, *n, *d),
        dims => bail!(
            "{OP}: expected a non-empty [batch, heads, tokens, head_dim] tensor, got {dims:?}"
        ),
    };
    o.contiguous()?
        .apply_op1_no_bwd(&MergeHeadsOp { n, heads, hd })?
        .reshape((b, n, heads * hd))
}

impl MergeHeadsOp {
    fn cpu<T: Copy>(&self, x: &[T]) -> Result<Vec<T>> {
        let (n, heads, hd) = (self.n, self.heads, self.hd);
        let mut out = Vec::with_capacity(x.len());
        for row in 0..x.len() / (heads * hd) {
            let (bi, t) = (row / n, row % n);
            for h in 0..heads {
                let s = ((bi * heads + h) * n + t) * hd;
                out.extend_from_slice(&x[s..s + hd]);
            }
        }
        Ok(out)
    }
}

super::fused_op1!(MergeHeadsOp, "mxattn-merge-heads", OP, cpu, merge_heads);
