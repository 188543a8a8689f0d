//! One Wan transformer block (diffusers `WanTransformerBlock`) and its parts.
//!
//! Precision follows diffusers' `_keep_in_fp32_modules`: the LayerNorms, the block's
//! `scale_shift_table` and the modulation arithmetic (`LN(x)·(1 + scale) + shift`, the gated
//! residual adds) run in f32 whatever the model dtype; projections, attention and the FFN run
//! in the model dtype.

use super::rope::RopeTables;
use crate::profile::stage;
use crate::{AttnKind, AttnPolicy, AttnSite};
use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder};
use mxattn::attention::{attention_ext, AttentionConfig, DeviceChecks, RunOptions};
use mxattn::fused::{
    ada_layer_norm, bias_gelu, bias_residual, merge_heads, split_heads, Rows, SplitHeads,
};
use mxattn_dist::{ulysses, Communicator};
use mxattn_fp8::{Linear as Proj, LinearFormat};

/// Ulysses sequence parallelism inside a block: this rank holds `1/P` of the `tokens`
/// video tokens (padded to a multiple of P); self-attention exchanges them for `1/P` of the
/// heads around the attention call, and masks the padding keys.
#[derive(Clone, Copy)]
pub struct SeqParallel<'a> {
    pub comm: &'a dyn Communicator,
    /// The sequence length before padding.
    pub tokens: usize,
}

/// A linear layer with bias, `weight [out, in]`.
pub(crate) fn linear(i: usize, o: usize, vb: VarBuilder) -> Result<Linear> {
    Ok(Linear::new(
        vb.get((o, i), "weight")?,
        Some(vb.get(o, "bias")?),
    ))
}

/// A block's projection as the checkpoint stores it: dense, or FP8 (ComfyUI's scaled FP8:
/// E4M3 `weight` and a per-tensor `scale_weight`) kept as stored; a linear schedule then
/// makes dense ones FP8 ([`WanBlock::set_linears`]).
fn proj(i: usize, o: usize, vb: VarBuilder) -> Result<Proj> {
    Proj::load(i, o, true, vb)
}

/// `x [b, n, in] · Wᵀ` of a projection, without its bias (the fused ops add it).
pub(crate) fn matmul(x: &Tensor, l: &Proj) -> Result<Tensor> {
    l.matmul(x)
}

/// The linear layers of a block, as a linear schedule names them (`kind=self|cross|ffn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearKind {
    /// Self-attention's q, k, v and output projections.
    SelfAttn,
    /// Cross-attention's q, k, v and output projections.
    CrossAttn,
    /// The feed-forward up and down projections.
    Ffn,
}

/// A LayerNorm over the last dim, run in f32 (diffusers' `FP32LayerNorm`); the norms without
/// affine parameters hold weight 1 and bias 0 so that all use candle's fused kernel.
#[derive(Clone, Debug)]
pub struct LnParams {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f32,
    /// False for the plain norms (weight 1, bias 0), which the fused op skips.
    pub affine: bool,
}

impl LnParams {
    /// No affine parameters: weight 1, bias 0 (f32).
    pub fn plain(dim: usize, eps: f64, dev: &candle_core::Device) -> Result<Self> {
        Ok(Self {
            weight: Tensor::ones(dim, DType::F32, dev)?,
            bias: Tensor::zeros(dim, DType::F32, dev)?,
            eps: eps as f32,
            affine: false,
        })
    }

    /// `weight` and `bias` of `[dim]`, kept in f32.
    pub fn affine(dim: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        let vb = vb.set_dtype(DType::F32);
        Ok(Self {
            weight: vb.get(dim, "weight")?,
            bias: vb.get(dim, "bias")?,
            eps: eps as f32,
            affine: true,
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

impl LnParams {
    /// The fused [`LnParams::modulate`] (or, without `shift`/`scale`, `LN(x)` in x's dtype).
    pub fn forward_fused(&self, x: &Tensor, modulation: Option<(Rows, Rows)>) -> Result<Tensor> {
        let affine = self.affine.then_some((&self.weight, &self.bias));
        ada_layer_norm(x, affine, modulation, self.eps)
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
    to_q: Proj,
    to_k: Proj,
    to_v: Proj,
    to_out: Proj,
    norm_q: Tensor,
    norm_k: Tensor,
    heads: usize,
    head_dim: usize,
    eps: f32,
}

impl WanAttention {
    pub fn new(dim: usize, heads: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            to_q: proj(dim, dim, vb.pp("to_q"))?,
            to_k: proj(dim, dim, vb.pp("to_k"))?,
            to_v: proj(dim, dim, vb.pp("to_v"))?,
            to_out: proj(dim, dim, vb.pp("to_out.0"))?,
            norm_q: vb.get(dim, "norm_q.weight")?,
            norm_k: vb.get(dim, "norm_k.weight")?,
            heads,
            head_dim: dim / heads,
            eps: eps as f32,
        })
    }

    /// Runs the four projections in `format`.
    fn set_linears(&mut self, format: LinearFormat) -> Result<()> {
        for l in [
            &mut self.to_q,
            &mut self.to_k,
            &mut self.to_v,
            &mut self.to_out,
        ] {
            l.convert(format)?;
        }
        Ok(())
    }

    /// `[b, n, dim]` → `[b, heads, n, head_dim]`, contiguous.
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, n, _) = x.dims3()?;
        x.reshape((b, n, self.heads, self.head_dim))?
            .transpose(1, 2)?
            .contiguous()
    }

    /// `x [b, n, dim]` attends to `ctx [b, l, dim]` (itself when `None`) through the fused
    /// elementwise ops ([`mxattn::fused`]). The output projection's bias is left to the caller's
    /// residual add: returns `o·W_outᵀ` without it.
    pub fn forward_fused(
        &self,
        x: &Tensor,
        ctx: Option<&Tensor>,
        rope: Option<&RopeTables>,
        cfg: &AttentionConfig,
        sp: Option<SeqParallel>,
    ) -> Result<Tensor> {
        let dev = x.device();
        let kv_in = ctx.unwrap_or(x);
        let (q, k, v) = stage(dev, "q/k/v projections", || {
            Ok((
                matmul(x, &self.to_q)?,
                matmul(kv_in, &self.to_k)?,
                matmul(kv_in, &self.to_v)?,
            ))
        })?;
        let (q, k, v) = stage(dev, "head split (bias, RMSNorm, RoPE)", || {
            let normed = |t: &Tensor, l: &Proj, w: &Tensor| {
                let opts = SplitHeads {
                    bias: l.bias(),
                    rms_weight: Some(w),
                    eps: self.eps,
                    rope: rope.map(|r| (&r.cos, &r.sin)),
                };
                split_heads(t, self.heads, &opts)
            };
            let plain = SplitHeads {
                bias: self.to_v.bias(),
                ..Default::default()
            };
            Ok((
                normed(&q, &self.to_q, &self.norm_q)?,
                normed(&k, &self.to_k, &self.norm_k)?,
                split_heads(&v, self.heads, &plain)?,
            ))
        })?;
        let o = attend(ctx.is_some(), &q, &k, &v, cfg, sp)?;
        let o = stage(dev, "merge heads", || merge_heads(&o))?;
        stage(dev, "output projection", || matmul(&o, &self.to_out))
    }

    /// `[b, heads, n, head_dim]` → `[b, n, dim]`, contiguous.
    fn merge_heads(&self, o: &Tensor) -> Result<Tensor> {
        let (b, _, n, _) = o.dims4()?;
        o.transpose(1, 2)?
            .reshape((b, n, self.heads * self.head_dim))
    }

    /// `x [b, n, dim]` attends to `ctx [b, l, dim]` (itself when `None`).
    pub fn forward(
        &self,
        x: &Tensor,
        ctx: Option<&Tensor>,
        rope: Option<&RopeTables>,
        cfg: &AttentionConfig,
        sp: Option<SeqParallel>,
    ) -> Result<Tensor> {
        let dev = x.device();
        let kv_in = ctx.unwrap_or(x);
        let (q, k, v) = stage(dev, "q/k/v projections", || {
            Ok((
                self.to_q.forward(x)?,
                self.to_k.forward(kv_in)?,
                self.to_v.forward(kv_in)?,
            ))
        })?;
        let (q, k) = stage(dev, "RMSNorm q, k", || {
            Ok((
                candle_nn::ops::rms_norm(&q, &self.norm_q, self.eps)?,
                candle_nn::ops::rms_norm(&k, &self.norm_k, self.eps)?,
            ))
        })?;
        let (mut q, mut k, v) = stage(dev, "head split copies", || {
            Ok((
                self.split_heads(&q)?,
                self.split_heads(&k)?,
                self.split_heads(&v)?,
            ))
        })?;
        if let Some(r) = rope {
            (q, k) = stage(dev, "RoPE (f32)", || Ok((r.apply(&q)?, r.apply(&k)?)))?;
        }
        let o = attend(ctx.is_some(), &q, &k, &v, cfg, sp)?;
        let o = stage(dev, "merge heads", || self.merge_heads(&o))?;
        stage(dev, "output projection", || self.to_out.forward(&o))
    }
}

/// The attention call of a [`WanAttention`], timed as its own stage (and in the attention
/// total of `--profile-attention`).
fn attend(
    cross: bool,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cfg: &AttentionConfig,
    sp: Option<SeqParallel>,
) -> Result<Tensor> {
    // sequence parallel self-attention: every token of this rank's heads, the padding keys
    // masked, the output handed back to the tokens' ranks
    if let (Some(sp), false) = (sp, cross) {
        let dev = q.device();
        let (q, k, v) = stage(dev, "all-to-all (Ulysses)", || {
            Ok((
                ulysses::heads_to_tokens(sp.comm, q)?,
                ulysses::heads_to_tokens(sp.comm, k)?,
                ulysses::heads_to_tokens(sp.comm, v)?,
            ))
        })?;
        let (b, _, n_pad, _) = q.dims4()?;
        let cfg = if n_pad > sp.tokens {
            cfg.clone().with_key_lengths(vec![sp.tokens; b])
        } else {
            cfg.clone()
        };
        let o = attend(false, &q, &k, &v, &cfg, None)?;
        return stage(dev, "all-to-all (Ulysses)", || {
            ulysses::tokens_to_heads(sp.comm, &o)
        });
    }
    let name = if cross {
        "cross-attention"
    } else {
        "self-attention"
    };
    let dev = q.device();
    // The op's checks stay on the device (no synchronization per call): the transformer's
    // forward reads them once at its end (`WanTransformer::forward`).
    let opts = RunOptions {
        checks: DeviceChecks::Deferred,
        ..Default::default()
    };
    stage(dev, name, || {
        super::super::profile::timed(dev, || Ok(attention_ext(q, k, v, cfg, &opts)?.out))
    })
}

/// Linear → GELU (tanh) → Linear.
#[derive(Clone, Debug)]
pub struct FeedForward {
    up: Proj,
    down: Proj,
}

impl FeedForward {
    pub fn new(dim: usize, hidden: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            up: proj(dim, hidden, vb.pp("net.0.proj"))?,
            down: proj(hidden, dim, vb.pp("net.2"))?,
        })
    }
}

impl FeedForward {
    /// Up projection, bias + GELU fused, down projection without its bias (returned for the
    /// caller's residual add).
    fn forward_fused(&self, x: &Tensor) -> Result<(Tensor, Option<&Tensor>)> {
        let dev = x.device();
        let u = stage(dev, "FFN up projection", || matmul(x, &self.up))?;
        let u = stage(dev, "FFN bias + GELU", || bias_gelu(&u, self.up.bias()))?;
        let y = stage(dev, "FFN down projection", || matmul(&u, &self.down))?;
        Ok((y, self.down.bias()))
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
    /// Sequence parallelism, when the tokens are split across ranks.
    pub sp: Option<SeqParallel<'a>>,
    pub expert: usize,
    pub step: usize,
    pub layer: usize,
    /// The fused elementwise ops ([`mxattn::fused`]) rather than Candle's op-by-op chain.
    pub fused: bool,
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

    /// Runs each kind of its linear layers in the format `format_of` gives.
    pub fn set_linears(&mut self, format_of: impl Fn(LinearKind) -> LinearFormat) -> Result<()> {
        self.attn1.set_linears(format_of(LinearKind::SelfAttn))?;
        self.attn2.set_linears(format_of(LinearKind::CrossAttn))?;
        let f = format_of(LinearKind::Ffn);
        self.ffn.up.convert(f)?;
        self.ffn.down.convert(f)
    }

    /// The formats its linear layers run in: self-attention, cross-attention, FFN.
    pub fn linear_formats(&self) -> [LinearFormat; 3] {
        [
            self.attn1.to_q.format(),
            self.attn2.to_q.format(),
            self.ffn.up.format(),
        ]
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
        if call.fused {
            return self.forward_fused(x, ctx, e0, rope, call);
        }
        let dtype = x.dtype();
        let m = self.scale_shift_table.broadcast_add(e0)?;
        let part = |i: usize| m.narrow(2, i, 1)?.squeeze(2);
        let (shift, scale, gate) = (part(0)?, part(1)?, part(2)?);
        let (c_shift, c_scale, c_gate) = (part(3)?, part(4)?, part(5)?);
        let dev = x.device();

        let h = stage(dev, "norm + modulation", || {
            self.norm1.modulate(x, &shift, &scale, dtype)
        })?;
        let a = call.run(AttnKind::SelfAttn, |cfg| {
            self.attn1.forward(&h, None, Some(rope), cfg, call.sp)
        })?;
        let x = stage(dev, "residual adds", || gated_add(x, &a, &gate))?;

        let h = stage(dev, "norm + modulation", || match &self.norm2 {
            Some(n) => n.forward_f32(&x)?.to_dtype(dtype),
            None => Ok(x.clone()),
        })?;
        let a = call.run(AttnKind::CrossAttn, |cfg| {
            self.attn2.forward(&h, Some(ctx), None, cfg, None)
        })?;
        let x = stage(dev, "residual adds", || x + a)?;

        let h = stage(dev, "norm + modulation", || {
            self.norm3.modulate(&x, &c_shift, &c_scale, dtype)
        })?;
        let f = stage(dev, "FFN (unfused)", || self.ffn.forward(&h))?;
        stage(dev, "residual adds", || gated_add(&x, &f, &c_gate))
    }

    /// [`WanBlock::forward`] through the fused elementwise ops: LayerNorm and modulation, the
    /// heads' bias/RMSNorm/RoPE/split, the FFN's bias + GELU and the biased, gated residual
    /// adds each take one pass.
    fn forward_fused(
        &self,
        x: &Tensor,
        ctx: &Tensor,
        e0: &Tensor,
        rope: &RopeTables,
        call: BlockCall,
    ) -> Result<Tensor> {
        let dev = x.device();
        // (e0 part i, table row i): the fused ops add them per element (for TI2V-5B's per-token
        // e0 the sum would be a [tokens, 6, dim] f32 tensor per block)
        let rows: Vec<Tensor> = (0..6)
            .map(|i| e0.narrow(2, i, 1)?.squeeze(2))
            .collect::<Result<_>>()?;
        let adds: Vec<Tensor> = (0..6)
            .map(|i| self.scale_shift_table.narrow(2, i, 1)?.flatten_all())
            .collect::<Result<_>>()?;
        let part = |i: usize| Rows::plus(&rows[i], &adds[i]);
        let (shift, scale, gate) = (part(0), part(1), part(2));
        let (c_shift, c_scale, c_gate) = (part(3), part(4), part(5));

        let h = stage(dev, "norm + modulation", || {
            self.norm1.forward_fused(x, Some((shift, scale)))
        })?;
        let a = call.run(AttnKind::SelfAttn, |cfg| {
            self.attn1.forward_fused(&h, None, Some(rope), cfg, call.sp)
        })?;
        let x = stage(dev, "residual adds", || {
            bias_residual(x, &a, self.attn1.to_out.bias(), Some(gate))
        })?;

        let h = match &self.norm2 {
            Some(n) => stage(dev, "norm + modulation", || n.forward_fused(&x, None))?,
            None => x.clone(),
        };
        let a = call.run(AttnKind::CrossAttn, |cfg| {
            self.attn2.forward_fused(&h, Some(ctx), None, cfg, None)
        })?;
        let x = stage(dev, "residual adds", || {
            bias_residual(&x, &a, self.attn2.to_out.bias(), None)
        })?;

        let h = stage(dev, "norm + modulation", || {
            self.norm3.forward_fused(&x, Some((c_shift, c_scale)))
        })?;
        let (f, f_bias) = self.ffn.forward_fused(&h)?;
        stage(dev, "residual adds", || {
            bias_residual(&x, &f, f_bias, Some(c_gate))
        })
    }
}
