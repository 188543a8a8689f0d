//! One Wan transformer block (diffusers `WanTransformerBlock`) and its parts.
//!
//! Precision follows diffusers' `_keep_in_fp32_modules`: the LayerNorms, the block's
//! `scale_shift_table` and the modulation arithmetic (`LN(x)·(1 + scale) + shift`, the gated
//! residual adds) run in f32 whatever the model dtype; projections, attention and the FFN run
//! in the model dtype.

use super::rope::RopeTables;
use crate::attention::{attention, AttentionConfig};
use crate::models::wan::{AttnKind, AttnPolicy, AttnSite};
use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder};

/// A linear layer with bias, `weight [out, in]`.
pub(crate) fn linear(i: usize, o: usize, vb: VarBuilder) -> Result<Linear> {
    Ok(Linear::new(
        vb.get((o, i), "weight")?,
        Some(vb.get(o, "bias")?),
    ))
}

/// A LayerNorm over the last dim, run in f32 (diffusers' `FP32LayerNorm`); the norms without
/// affine parameters hold weight 1 and bias 0 so that all use candle's fused kernel.
#[derive(Clone, Debug)]
pub struct LnParams {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f32,
}

impl LnParams {
    /// No affine parameters: weight 1, bias 0 (f32).
    pub fn plain(dim: usize, eps: f64, dev: &candle_core::Device) -> Result<Self> {
        Ok(Self {
            weight: Tensor::ones(dim, DType::F32, dev)?,
            bias: Tensor::zeros(dim, DType::F32, dev)?,
            eps: eps as f32,
        })
    }

    /// `weight` and `bias` of `[dim]`, kept in f32.
    pub fn affine(dim: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        let vb = vb.set_dtype(DType::F32);
        Ok(Self {
            weight: vb.get(dim, "weight")?,
            bias: vb.get(dim, "bias")?,
            eps: eps as f32,
        })
    }

    /// `LN(x)` in f32 (x is converted).
    pub fn forward_f32(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        candle_nn::ops::layer_norm(&x, &self.weight, &self.bias, self.eps)
    }

    /// `LN(x)·(1 + scale) + shift` in f32 (scale, shift f32 and broadcastable), returned in
    /// `dtype`.
    pub fn modulate(
        &self,
        x: &Tensor,
        shift: &Tensor,
        scale: &Tensor,
        dtype: DType,
    ) -> Result<Tensor> {
        self.forward_f32(x)?
            .broadcast_mul(&(scale + 1.0)?)?
            .broadcast_add(shift)?
            .to_dtype(dtype)
    }
}

/// `(x.f32 + y.f32 · gate).to(dtype)`: diffusers' gated residual add.
pub(crate) fn gated_add(x: &Tensor, y: &Tensor, gate: &Tensor) -> Result<Tensor> {
    let dtype = x.dtype();
    x.to_dtype(DType::F32)?
        .add(&y.to_dtype(DType::F32)?.broadcast_mul(gate)?)?
        .to_dtype(dtype)
}

/// Self- or cross-attention (diffusers `WanAttention` with `WanAttnProcessor`): q, k, v, o
/// linear with bias, RMSNorm of q and k across all heads, RoPE on q and k (self-attention
/// only), no mask, scale 1/√head_dim.
#[derive(Clone, Debug)]
pub struct WanAttention {
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
    norm_q: Tensor,
    norm_k: Tensor,
    heads: usize,
    head_dim: usize,
    eps: f32,
}

impl WanAttention {
    pub fn new(dim: usize, heads: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            to_q: linear(dim, dim, vb.pp("to_q"))?,
            to_k: linear(dim, dim, vb.pp("to_k"))?,
            to_v: linear(dim, dim, vb.pp("to_v"))?,
            to_out: linear(dim, dim, vb.pp("to_out.0"))?,
            norm_q: vb.get(dim, "norm_q.weight")?,
            norm_k: vb.get(dim, "norm_k.weight")?,
            heads,
            head_dim: dim / heads,
            eps: eps as f32,
        })
    }

    /// `[b, n, dim]` → `[b, heads, n, head_dim]`, contiguous.
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, n, _) = x.dims3()?;
        x.reshape((b, n, self.heads, self.head_dim))?
            .transpose(1, 2)?
            .contiguous()
    }

    /// `x [b, n, dim]` attends to `ctx [b, l, dim]` (itself when `None`).
    pub fn forward(
        &self,
        x: &Tensor,
        ctx: Option<&Tensor>,
        rope: Option<&RopeTables>,
        cfg: &AttentionConfig,
    ) -> Result<Tensor> {
        let kv_in = ctx.unwrap_or(x);
        let q = candle_nn::ops::rms_norm(&self.to_q.forward(x)?, &self.norm_q, self.eps)?;
        let k = candle_nn::ops::rms_norm(&self.to_k.forward(kv_in)?, &self.norm_k, self.eps)?;
        let v = self.to_v.forward(kv_in)?;
        let (mut q, mut k, v) = (
            self.split_heads(&q)?,
            self.split_heads(&k)?,
            self.split_heads(&v)?,
        );
        if let Some(r) = rope {
            q = r.apply(&q)?;
            k = r.apply(&k)?;
        }
        let o = super::super::profile::timed(q.device(), || attention(&q, &k, &v, cfg))?;
        let (b, _, n, _) = o.dims4()?;
        let o = o
            .transpose(1, 2)?
            .reshape((b, n, self.heads * self.head_dim))?;
        self.to_out.forward(&o)
    }
}

/// Linear → GELU (tanh) → Linear.
#[derive(Clone, Debug)]
pub struct FeedForward {
    up: Linear,
    down: Linear,
}

impl FeedForward {
    pub fn new(dim: usize, hidden: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            up: linear(dim, hidden, vb.pp("net.0.proj"))?,
            down: linear(hidden, dim, vb.pp("net.2"))?,
        })
    }
}

impl Module for FeedForward {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.down.forward(&self.up.forward(x)?.gelu()?)
    }
}

/// Where a block's attention calls are in the denoising loop.
#[derive(Clone, Copy)]
pub struct BlockCall<'a> {
    pub policy: &'a dyn AttnPolicy,
    pub expert: usize,
    pub step: usize,
    pub layer: usize,
}

impl BlockCall<'_> {
    fn run(
        &self,
        kind: AttnKind,
        f: impl FnOnce(&AttentionConfig) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let site = AttnSite {
            expert: self.expert,
            step: self.step,
            layer: self.layer,
            kind,
        };
        let cfg = self.policy.config(&site);
        f(&cfg).map_err(|e| {
            candle_core::Error::Msg(format!(
                "Wan transformer expert {} step {} block {} {kind:?} ({}): {e}",
                self.expert,
                self.step,
                self.layer,
                cfg.label()
            ))
        })
    }
}

/// One block: modulated self-attention, cross-attention, modulated FFN.
#[derive(Clone, Debug)]
pub struct WanBlock {
    norm1: LnParams,
    attn1: WanAttention,
    /// The cross-attention's affine LayerNorm (`cross_attn_norm`), else none.
    norm2: Option<LnParams>,
    attn2: WanAttention,
    norm3: LnParams,
    ffn: FeedForward,
    /// `[1, 1, 6, dim]` f32.
    scale_shift_table: Tensor,
}

impl WanBlock {
    pub fn new(
        dim: usize,
        ffn_dim: usize,
        heads: usize,
        cross_attn_norm: bool,
        eps: f64,
        plain_ln: &LnParams,
        vb: VarBuilder,
    ) -> Result<Self> {
        let norm2 = if cross_attn_norm {
            Some(LnParams::affine(dim, eps, vb.pp("norm2"))?)
        } else {
            None
        };
        Ok(Self {
            norm1: plain_ln.clone(),
            attn1: WanAttention::new(dim, heads, eps, vb.pp("attn1"))?,
            norm2,
            attn2: WanAttention::new(dim, heads, eps, vb.pp("attn2"))?,
            norm3: plain_ln.clone(),
            ffn: FeedForward::new(dim, ffn_dim, vb.pp("ffn"))?,
            scale_shift_table: vb
                .clone()
                .set_dtype(DType::F32)
                .get((1, 6, dim), "scale_shift_table")?
                .unsqueeze(0)?,
        })
    }

    /// `x [b, n, dim]` (model dtype), `ctx [b, l, dim]` the projected text, `e0
    /// [b | 1, 1 | n, 6, dim]` f32 the timestep projection (one per sample, or per token).
    pub fn forward(
        &self,
        x: &Tensor,
        ctx: &Tensor,
        e0: &Tensor,
        rope: &RopeTables,
        call: BlockCall,
    ) -> Result<Tensor> {
        let dtype = x.dtype();
        let m = self.scale_shift_table.broadcast_add(e0)?;
        let part = |i: usize| m.narrow(2, i, 1)?.squeeze(2);
        let (shift, scale, gate) = (part(0)?, part(1)?, part(2)?);
        let (c_shift, c_scale, c_gate) = (part(3)?, part(4)?, part(5)?);

        let h = self.norm1.modulate(x, &shift, &scale, dtype)?;
        let a = call.run(AttnKind::SelfAttn, |cfg| {
            self.attn1.forward(&h, None, Some(rope), cfg)
        })?;
        let x = gated_add(x, &a, &gate)?;

        let h = match &self.norm2 {
            Some(n) => n.forward_f32(&x)?.to_dtype(dtype)?,
            None => x.clone(),
        };
        let a = call.run(AttnKind::CrossAttn, |cfg| {
            self.attn2.forward(&h, Some(ctx), None, cfg)
        })?;
        let x = (x + a)?;

        let h = self.norm3.modulate(&x, &c_shift, &c_scale, dtype)?;
        let f = self.ffn.forward(&h)?;
        gated_add(&x, &f, &c_gate)
    }
}
