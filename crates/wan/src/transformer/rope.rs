//! The 3-D rotary position embedding of Wan (diffusers `WanRotaryPosEmbed`, the original's
//! `rope_params` / `rope_apply`).
//!
//! A head of dim `d` is split into a time part of `d − 4·(d/6)` channels and height and width
//! parts of `2·(d/6)` each (44/42/42 for d = 128). Each part rotates adjacent channel pairs
//! `(2i, 2i+1)` by `pos · θ^(−2i/part)` with its own axis position. The tables are built in
//! f64 and rounded to f32, as diffusers does, and rotation runs in f32.

use super::config::TransformerConfig;
use candle_core::{bail, DType, Device, Result, Tensor};

/// Per-axis frequency tables, `[max_seq_len, part/2]` for each of t, h, w.
#[derive(Clone, Debug)]
pub struct WanRope {
    split: (usize, usize, usize),
    max_seq_len: usize,
    theta: f64,
}

/// Per-token cos/sin tables for one latent grid: `[tokens, head_dim/2]` f32 each, tokens in
/// (frame, row, column) row-major order.
#[derive(Clone, Debug)]
pub struct RopeTables {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl WanRope {
    pub fn new(cfg: &TransformerConfig) -> Self {
        Self {
            split: cfg.rope_split(),
            max_seq_len: cfg.rope_max_seq_len,
            theta: 10000.0,
        }
    }

    /// Angles of one axis part of `dim` channels: `[pos][i] = pos / θ^(2i/dim)` in f64.
    fn angles(&self, dim: usize, n: usize) -> Vec<Vec<f64>> {
        let freqs: Vec<f64> = (0..dim / 2)
            .map(|i| 1.0 / self.theta.powf((2 * i) as f64 / dim as f64))
            .collect();
        (0..n)
            .map(|p| freqs.iter().map(|f| p as f64 * f).collect())
            .collect()
    }

    /// The tables of a grid of `f × h × w` patches.
    pub fn tables(&self, f: usize, h: usize, w: usize, device: &Device) -> Result<RopeTables> {
        let m = self.max_seq_len;
        if f > m || h > m || w > m {
            bail!(
                "RoPE: the patch grid {f}×{h}×{w} exceeds rope_max_seq_len {m} positions per axis"
            );
        }
        let (dt, dh, dw) = self.split;
        let (at, ah, aw) = (self.angles(dt, f), self.angles(dh, h), self.angles(dw, w));
        let half = (dt + dh + dw) / 2;
        let n = f * h * w;
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for a in &at {
            for b in &ah {
                for c in &aw {
                    for x in a.iter().chain(b).chain(c) {
                        cos.push(x.cos() as f32);
                        sin.push(x.sin() as f32);
                    }
                }
            }
        }
        Ok(RopeTables {
            cos: Tensor::from_vec(cos, (n, half), device)?,
            sin: Tensor::from_vec(sin, (n, half), device)?,
        })
    }
}

impl RopeTables {
    /// Rotates `x` `[b, heads, tokens, head_dim]` (any float dtype; computed in f32, returned
    /// in x's dtype and contiguous).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        let x32 = x.to_dtype(DType::F32)?.contiguous()?;
        let y = candle_nn::rotary_emb::rope_i(&x32, &self.cos, &self.sin)?;
        if dtype == DType::F32 {
            Ok(y)
        } else {
            y.to_dtype(dtype)
        }
    }
}
