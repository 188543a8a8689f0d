//! (A module of the benchmark examples.) Candle's own attention, composed the way Candle users write it, for the benchmarks to
//! measure against in the same run.

use candle_core::{Result, Tensor};

/// `softmax(q·kᵀ/√d [+ causal mask])·v` with the KV heads repeated for GQA
/// (`candle_transformers::utils::repeat_kv`), in the inputs' dtype and device. The causal
/// mask is bottom-right aligned like [`crate::attention`]'s and is built on the host, as
/// candle-transformers' models do.
pub fn candle_matmul_attention(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Result<Tensor> {
    let (_, hq, sq, d) = q.dims4()?;
    let (_, hkv, sk, _) = k.dims4()?;
    let k = candle_transformers::utils::repeat_kv(k.clone(), hq / hkv)?.contiguous()?;
    let v = candle_transformers::utils::repeat_kv(v.clone(), hq / hkv)?.contiguous()?;
    let mut s = (q.matmul(&k.t()?)? * (1.0 / (d as f64).sqrt()))?;
    if causal {
        let m: Vec<f32> = (0..sq)
            .flat_map(|i| {
                (0..sk).map(move |j| {
                    if j + sq > i + sk {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        let m = Tensor::from_vec(m, (sq, sk), q.device())?.to_dtype(q.dtype())?;
        s = s.broadcast_add(&m)?;
    }
    candle_nn::ops::softmax_last_dim(&s)?.matmul(&v)
}
