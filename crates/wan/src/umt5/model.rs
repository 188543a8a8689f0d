//! The UMT5 encoder stack, as transformers' `UMT5EncoderModel` computes it.
//!
//! Per block: `h += o(attn(norm0(h)))`, `h += wo(gelu_new(wi_0 n) · wi_1 n)` with
//! `n = norm1(h)`; then `final_layer_norm`. T5 conventions: RMSNorm without mean or bias
//! (variance in f32), no 1/√d scaling of the scores, no biases, and an additive relative
//! position bias that **every** layer owns (UMT5; T5 shares block 0's).
//!
//! Precision: the residual stream and `wo` are f32 whatever the model dtype, as transformers
//! keeps them when it loads the model in f16/bf16 (`_keep_in_fp32_modules = ["wo"]`, and the
//! f32 `wo` output promotes the residual); norms hand the other linears the model dtype.

use super::config::Umt5Config;
use candle_core::{bail, DType, Device, Module, Result, Tensor, D};
use candle_nn::{Linear, VarBuilder};

/// transformers' `UMT5Attention._relative_position_bucket` for an encoder (bidirectional):
/// the bucket of `relative = key_pos - query_pos`.
///
/// Half the buckets hold keys after the query. Distances below a quarter of the buckets get
/// one bucket each; larger ones share logarithmically wider buckets up to `max_distance`,
/// beyond which all fall in the last. The logarithm is taken in f32 and truncated, as torch
/// does, so the bucket edges follow transformers' rounding. Bucket `num_buckets / 2` is never
/// used (distance 0 counts as "before"). For 32 buckets and distance 128: −7..=7 exact,
/// then 8 → 8 / 24, 16 → 10 / 26, 32 → 12 / 28, 64 → 14 / 30, ≥ 128 → 15 / 31.
pub fn relative_position_bucket(relative: i64, num_buckets: usize, max_distance: usize) -> u32 {
    let half = (num_buckets / 2) as i64;
    let base = if relative > 0 { half } else { 0 };
    let n = relative.unsigned_abs() as i64;
    let max_exact = half / 2;
    if n < max_exact {
        return (base + n) as u32;
    }
    let ratio = (n as f32 / max_exact as f32).ln()
        / ((max_distance as f64 / max_exact as f64).ln() as f32)
        * (half - max_exact) as f32;
    let large = (max_exact + ratio as i64).min(half - 1);
    (base + large) as u32
}

/// T5's RMSNorm: `w · x / sqrt(mean(x²) + eps)`, the mean in f32, the result in `w`'s dtype.
#[derive(Clone, Debug)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn new(d: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            weight: vb.get(d, "weight")?,
            eps,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.to_dtype(DType::F32)?;
        let var = x.sqr()?.mean_keepdim(D::Minus1)?;
        let x = x.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        x.to_dtype(self.weight.dtype())?.broadcast_mul(&self.weight)
    }
}

fn linear(i: usize, o: usize, vb: VarBuilder) -> Result<Linear> {
    Ok(Linear::new(vb.get((o, i), "weight")?, None))
}

/// Self-attention with its own relative position bias.
///
/// The relative bias is an additive `[heads, L, L]` term that [`mxattn::attention::attention`]
/// does not take, so this attention is composed from plain candle ops, in f32. It runs once
/// per prompt (512 tokens), so its cost does not matter next to the video transformer.
#[derive(Clone, Debug)]
struct SelfAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// `[num_buckets, heads]`, f32.
    rel_bias: Tensor,
    heads: usize,
    d_kv: usize,
    num_buckets: usize,
    max_distance: usize,
}

impl SelfAttention {
    fn new(cfg: &Umt5Config, vb: VarBuilder) -> Result<Self> {
        let (d, inner) = (cfg.d_model, cfg.inner_dim());
        Ok(Self {
            q: linear(d, inner, vb.pp("q"))?,
            k: linear(d, inner, vb.pp("k"))?,
            v: linear(d, inner, vb.pp("v"))?,
            o: linear(inner, d, vb.pp("o"))?,
            rel_bias: vb
                .get(
                    (cfg.relative_attention_num_buckets, cfg.num_heads),
                    "relative_attention_bias.weight",
                )?
                .to_dtype(DType::F32)?,
            heads: cfg.num_heads,
            d_kv: cfg.d_kv,
            num_buckets: cfg.relative_attention_num_buckets,
            max_distance: cfg.relative_attention_max_distance,
        })
    }

    /// `[1, heads, l, l]`: the bias of query `i` to key `j`, f32.
    fn position_bias(&self, l: usize) -> Result<Tensor> {
        let mut idx = Vec::with_capacity(l * l);
        for i in 0..l as i64 {
            for j in 0..l as i64 {
                idx.push(relative_position_bucket(
                    j - i,
                    self.num_buckets,
                    self.max_distance,
                ));
            }
        }
        let idx = Tensor::from_vec(idx, l * l, self.rel_bias.device())?;
        self.rel_bias
            .index_select(&idx, 0)?
            .reshape((l, l, self.heads))?
            .permute((2, 0, 1))?
            .unsqueeze(0)
    }

    /// `x`: `[b, l, d_model]` in the model dtype; `mask`: additive `[b, 1, 1, l]` f32.
    fn forward(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let (b, l, _) = x.dims3()?;
        let dtype = x.dtype();
        let split = |t: Tensor| -> Result<Tensor> {
            t.reshape((b, l, self.heads, self.d_kv))?
                .transpose(1, 2)?
                .to_dtype(DType::F32)?
                .contiguous()
        };
        let q = split(self.q.forward(x)?)?;
        let k = split(self.k.forward(x)?)?;
        let v = split(self.v.forward(x)?)?;
        // no 1/sqrt(d_kv): T5 folds it into the initialisation of q
        let mut scores = q
            .matmul(&k.t()?.contiguous()?)?
            .broadcast_add(&self.position_bias(l)?)?;
        if let Some(m) = mask {
            scores = scores.broadcast_add(m)?;
        }
        let p = candle_nn::ops::softmax_last_dim(&scores)?;
        let ctx = p
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((b, l, self.heads * self.d_kv))?
            .to_dtype(dtype)?;
        self.o.forward(&ctx)
    }
}

/// `wo(gelu_new(wi_0 x) · wi_1 x)`, `wo` in f32.
#[derive(Clone, Debug)]
struct GatedGelu {
    wi_0: Linear,
    wi_1: Linear,
    wo: Linear,
}

impl GatedGelu {
    fn new(cfg: &Umt5Config, vb: VarBuilder) -> Result<Self> {
        let (d, ff) = (cfg.d_model, cfg.d_ff);
        let wo = vb.pp("wo").get((d, ff), "weight")?.to_dtype(DType::F32)?;
        Ok(Self {
            wi_0: linear(d, ff, vb.pp("wi_0"))?,
            wi_1: linear(d, ff, vb.pp("wi_1"))?,
            wo: Linear::new(wo, None),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // candle's gelu is the tanh approximation, transformers' gelu_new
        let h = (self.wi_0.forward(x)?.gelu()? * self.wi_1.forward(x)?)?;
        self.wo.forward(&h.to_dtype(DType::F32)?)
    }
}

#[derive(Clone, Debug)]
struct Block {
    norm0: RmsNorm,
    attn: SelfAttention,
    norm1: RmsNorm,
    ff: GatedGelu,
}

impl Block {
    fn new(cfg: &Umt5Config, vb: VarBuilder) -> Result<Self> {
        let (d, eps) = (cfg.d_model, cfg.layer_norm_epsilon);
        let l0 = vb.pp("layer.0");
        let l1 = vb.pp("layer.1");
        Ok(Self {
            norm0: RmsNorm::new(d, eps, l0.pp("layer_norm"))?,
            attn: SelfAttention::new(cfg, l0.pp("SelfAttention"))?,
            norm1: RmsNorm::new(d, eps, l1.pp("layer_norm"))?,
            ff: GatedGelu::new(cfg, l1.pp("DenseReluDense"))?,
        })
    }

    /// `h`: the f32 residual stream.
    fn forward(&self, h: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let a = self.attn.forward(&self.norm0.forward(h)?, mask)?;
        let h = (h + a.to_dtype(DType::F32)?)?;
        let f = self.ff.forward(&self.norm1.forward(&h)?)?;
        h + f
    }
}

/// The embedding tensor's name: transformers writes `shared.weight`; some exports keep only
/// the tied copy `encoder.embed_tokens.weight`.
pub const EMBED_KEYS: [&str; 2] = ["shared.weight", "encoder.embed_tokens.weight"];

/// transformers' `UMT5EncoderModel`: token ids (and a padding mask) to `last_hidden_state`.
#[derive(Clone, Debug)]
pub struct Umt5Encoder {
    cfg: Umt5Config,
    embed: Tensor,
    blocks: Vec<Block>,
    final_norm: RmsNorm,
    dtype: DType,
    device: Device,
}

impl Umt5Encoder {
    /// Builds the encoder of `cfg` from `vb` (transformers names, see [`EMBED_KEYS`] and
    /// [`super::expected_tensors`]).
    pub fn new(cfg: &Umt5Config, vb: VarBuilder) -> Result<Self> {
        cfg.validate().map_err(candle_core::Error::Msg)?;
        let shape = (cfg.vocab_size, cfg.d_model);
        let embed = if vb.contains_tensor(EMBED_KEYS[0]) || !vb.contains_tensor(EMBED_KEYS[1]) {
            vb.get(shape, EMBED_KEYS[0])?
        } else {
            vb.get(shape, EMBED_KEYS[1])?
        };
        let enc = vb.pp("encoder");
        let blocks = (0..cfg.num_layers)
            .map(|i| Block::new(cfg, enc.pp(format!("block.{i}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            final_norm: RmsNorm::new(
                cfg.d_model,
                cfg.layer_norm_epsilon,
                enc.pp("final_layer_norm"),
            )?,
            cfg: cfg.clone(),
            embed,
            blocks,
            dtype: vb.dtype(),
            device: vb.device().clone(),
        })
    }

    pub fn config(&self) -> &Umt5Config {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// `last_hidden_state` `[b, l, d_model]` in the model dtype for `input_ids` `[b, l]`
    /// (integer ids). `attention_mask` `[b, l]` (1 = token, 0 = padding, any dtype) hides the
    /// padded keys with f32's lowest value, as transformers' additive mask does; padded
    /// positions still get (meaningless) outputs.
    pub fn forward(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        let (b, l) = match input_ids.dims() {
            &[b, l] if b > 0 && l > 0 => (b, l),
            d => bail!("UMT5: input_ids must be [batch, length] with both positive, got {d:?}"),
        };
        if input_ids.dtype().is_float() {
            bail!(
                "UMT5: input_ids must be integers, got {:?}",
                input_ids.dtype()
            );
        }
        let ids = input_ids.to_dtype(DType::U32)?.to_device(&self.device)?;
        let max = ids.flatten_all()?.max(0)?.to_scalar::<u32>()?;
        if max as usize >= self.cfg.vocab_size {
            bail!(
                "UMT5: token id {max} is outside the vocabulary ({} entries)",
                self.cfg.vocab_size
            );
        }
        let mask = match attention_mask {
            None => None,
            Some(m) => {
                if m.dims() != [b, l] {
                    bail!(
                        "UMT5: attention_mask has shape {:?}, input_ids {:?}",
                        m.dims(),
                        input_ids.dims()
                    );
                }
                // any non-zero entry is a token
                let m = m.to_device(&self.device)?;
                let keep = m.ne(&m.zeros_like()?)?.to_dtype(DType::F32)?;
                // (1 - keep) · lowest: 0 for tokens, f32::MIN for padding
                let add = keep.affine(-(f32::MIN as f64), f32::MIN as f64)?;
                Some(add.reshape((b, 1, 1, l))?)
            }
        };
        let mut h = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, l, self.cfg.d_model))?
            .to_dtype(DType::F32)?;
        for block in &self.blocks {
            h = block.forward(&h, mask.as_ref())?;
        }
        self.final_norm.forward(&h)?.to_dtype(self.dtype)
    }
}
