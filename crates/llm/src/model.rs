//! The decoder (Qwen3, Llama, Qwen2: [`crate::config::Arch`]) with mxattn attention in every layer.
//!
//! Adapted from candle-transformers 0.11.1 `src/models/qwen3.rs` (Apache-2.0 / MIT,
//! Copyright the Candle authors; <https://github.com/huggingface/candle>). Changes:
//! attention goes through [`mxattn::attention::attention`] with one [`LayerSpec`] per layer
//! instead of candle's flash/matmul dispatch; the KV cache is [`LayerKvCache`] (K/V in
//! the layer's format) instead of `ConcatKvCache`; positions come from the cache length;
//! logits are available for every position, not only the last; RoPE frequencies are
//! computed in f32 as transformers does; optional Hadamard rotation of q/k for
//! Fused-Softmax layers; errors instead of panics for out-of-range positions; the q/k norm
//! and the q/k/v biases are switches of the config, so one decoder serves Qwen3, Llama and
//! Qwen2.
//!
//! Architecture (transformers `modeling_qwen3.py` / `modeling_llama.py` /
//! `modeling_qwen2.py`): pre-RMSNorm blocks; q/k/v/o projections (q/k/v biases in Qwen2);
//! in Qwen3 only, RMSNorm over head_dim on each q and k head **before** RoPE;
//! non-interleaved (`rotate_half`) RoPE (GGUF files are converted to it on loading); GQA;
//! SwiGLU MLP `down(silu(gate x) · up x)`; final RMSNorm; `lm_head` (tied to the
//! embeddings in the small sizes).

use super::config::Config;
use super::kv_cache::LayerKvCache;
use super::profile::stage;
use super::schedule::{LayerSpec, LinearSpec, Schedule};
use candle_core::{bail, DType, Device, Module, Result, Tensor};
use candle_nn::{linear_no_bias, rms_norm, Embedding, Linear, RmsNorm, VarBuilder};
use mxattn::attention::{attention_decode_ext, DeviceChecks, RunOptions};
use mxattn_fp8::Linear as Proj;
use std::sync::Arc;

#[derive(Debug)]
struct Rotary {
    sin: Tensor,
    cos: Tensor,
    max_pos: usize,
}

impl Rotary {
    fn new(dtype: DType, cfg: &Config, dev: &Device) -> Result<Self> {
        let dim = cfg.head_dim;
        // transformers: inv_freq = 1 / base^(arange(0, d, 2) / d), in f32
        let base = cfg.rope_theta as f32;
        let inv_freq: Vec<f32> = (0..dim)
            .step_by(2)
            .map(|i| 1f32 / base.powf(i as f32 / dim as f32))
            .collect();
        let n = inv_freq.len();
        let inv_freq = Tensor::from_vec(inv_freq, (1, n), dev)?;
        let max_pos = cfg.max_position_embeddings;
        let t = Tensor::arange(0u32, max_pos as u32, dev)?
            .to_dtype(DType::F32)?
            .reshape((max_pos, 1))?;
        let freqs = t.matmul(&inv_freq)?;
        Ok(Self {
            sin: freqs.sin()?.to_dtype(dtype)?,
            cos: freqs.cos()?.to_dtype(dtype)?,
            max_pos,
        })
    }

    /// q, k: `[b, h, l, d]` at positions `offset..offset+l`.
    fn apply(&self, q: &Tensor, k: &Tensor, offset: usize) -> Result<(Tensor, Tensor)> {
        let l = q.dim(2)?;
        if offset + l > self.max_pos {
            bail!(
                "decoder: positions {offset}..{} exceed max_position_embeddings ({})",
                offset + l,
                self.max_pos
            );
        }
        let cos = self.cos.narrow(0, offset, l)?;
        let sin = self.sin.narrow(0, offset, l)?;
        let q = candle_nn::rotary_emb::rope(&q.contiguous()?, &cos, &sin)?;
        let k = candle_nn::rotary_emb::rope(&k.contiguous()?, &cos, &sin)?;
        Ok((q, k))
    }
}

/// `H_d / √d` as a matrix, built from the op's own transform
/// ([`mxattn::attention::hadamard::hadamard_rotate`]) so both rotations are one definition.
/// It is symmetric, so `x · H` rotates the rows of `x`.
fn hadamard_matrix(d: usize, dev: &Device) -> Result<Tensor> {
    if !d.is_power_of_two() {
        bail!("decoder: the Hadamard rotation needs a power-of-two head dim, got {d}");
    }
    let mut data = vec![0f32; d * d];
    for (j, row) in data.chunks_mut(d).enumerate() {
        row[j] = 1.0;
        mxattn::attention::hadamard::hadamard_rotate(row);
    }
    Tensor::from_vec(data, (d, d), dev)
}

/// Projections load as the checkpoint stores them (dense, or an FP8 checkpoint's codes and
/// block scales kept as they are); `--linear` converts dense ones afterwards.
#[derive(Debug)]
struct Mlp {
    gate_proj: Proj,
    up_proj: Proj,
    down_proj: Proj,
    act: candle_nn::Activation,
}

impl Mlp {
    fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            gate_proj: Proj::load(h, i, false, vb.pp("gate_proj"))?,
            up_proj: Proj::load(h, i, false, vb.pp("up_proj"))?,
            down_proj: Proj::load(i, h, false, vb.pp("down_proj"))?,
            act: cfg.hidden_act,
        })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dev = x.device();
        let (g, u) = stage(dev, "MLP gate/up projections", || {
            Ok((x.apply(&self.gate_proj)?, x.apply(&self.up_proj)?))
        })?;
        let h = stage(dev, "MLP SiLU × up", || g.apply(&self.act)? * u)?;
        stage(dev, "MLP down projection", || h.apply(&self.down_proj))
    }
}

#[derive(Debug)]
struct Attention {
    q_proj: Proj,
    k_proj: Proj,
    v_proj: Proj,
    o_proj: Proj,
    /// Where the layer lives (for the Hadamard matrix of a new spec).
    device: Device,
    /// Qwen3's per-head norms (none in Llama and Qwen2).
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    rotary: Arc<Rotary>,
    spec: LayerSpec,
    /// `H/√d` in f32 when `spec.rotate_qk`
    hadamard: Option<Tensor>,
    cache: LayerKvCache,
    /// layer index, for error messages
    index: usize,
    /// When on, the last forward's attention inputs (real-activation evals).
    capture: bool,
    captured: Option<Qkv>,
}

/// One layer's attention inputs from one forward call, as the attention op received them:
/// q `[b, hq, l, d]` and k `[b, hkv, l, d]` after RoPE (and after the model-side Hadamard
/// rotation of Fused-Softmax layers), v `[b, hkv, l, d]`. These are the new tokens only;
/// after a prefill from an empty cache they are the whole sequence.
#[derive(Clone, Debug)]
pub struct Qkv {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
}

impl Attention {
    fn new(
        cfg: &Config,
        rotary: Arc<Rotary>,
        spec: LayerSpec,
        index: usize,
        vb: VarBuilder,
    ) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let (qkv_bias, o_bias) = (cfg.qkv_bias(), cfg.o_bias());
        let hadamard = Self::hadamard_for(&spec, d, vb.device())?;
        let qk_norm = if cfg.qk_norm() {
            Some((
                rms_norm(d, cfg.rms_norm_eps, vb.pp("q_norm"))?,
                rms_norm(d, cfg.rms_norm_eps, vb.pp("k_norm"))?,
            ))
        } else {
            None
        };
        Ok(Self {
            q_proj: Proj::load(h, nh * d, qkv_bias, vb.pp("q_proj"))?,
            k_proj: Proj::load(h, nkv * d, qkv_bias, vb.pp("k_proj"))?,
            v_proj: Proj::load(h, nkv * d, qkv_bias, vb.pp("v_proj"))?,
            o_proj: Proj::load(nh * d, h, o_bias, vb.pp("o_proj"))?,
            device: vb.device().clone(),
            qk_norm,
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: d,
            rotary,
            cache: LayerKvCache::new(spec.kv),
            spec,
            hadamard,
            index,
            capture: false,
            captured: None,
        })
    }

    fn hadamard_for(spec: &LayerSpec, d: usize, dev: &Device) -> Result<Option<Tensor>> {
        if spec.rotate_qk {
            Ok(Some(hadamard_matrix(d, dev)?))
        } else {
            Ok(None)
        }
    }

    fn set_spec(&mut self, spec: LayerSpec) -> Result<()> {
        self.hadamard = Self::hadamard_for(&spec, self.head_dim, &self.device)?;
        self.cache = LayerKvCache::new(spec.kv);
        self.spec = spec;
        Ok(())
    }

    /// Rotates the last dim by `H/√d`, in f32.
    fn rotate(&self, x: &Tensor) -> Result<Tensor> {
        match &self.hadamard {
            None => Ok(x.clone()),
            Some(h) => x
                .to_dtype(DType::F32)?
                .broadcast_matmul(h)?
                .to_dtype(x.dtype()),
        }
    }

    fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        let (b, l, _) = x.dims3()?;
        let offset = self.cache.len();
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let dev = x.device();
        let (q, k, v) = stage(dev, "q/k/v projections", || {
            let heads = |p: &Proj, n: usize| x.apply(p)?.reshape((b, l, n, d))?.transpose(1, 2);
            Ok((
                heads(&self.q_proj, nh)?,
                heads(&self.k_proj, nkv)?,
                heads(&self.v_proj, nkv)?,
            ))
        })?;
        let (q, k, v) = stage(dev, "q/k norm, RoPE", || {
            // Qwen3: per-head RMSNorm over head_dim, before RoPE
            let (q, k) = match &self.qk_norm {
                Some((q_norm, k_norm)) => (
                    q_norm
                        .forward(&q.contiguous()?.flatten(0, 2)?)?
                        .reshape((b, nh, l, d))?,
                    k_norm
                        .forward(&k.contiguous()?.flatten(0, 2)?)?
                        .reshape((b, nkv, l, d))?,
                ),
                None => (q, k),
            };
            let (q, k) = self.rotary.apply(&q, &k, offset)?;
            Ok((self.rotate(&q)?, self.rotate(&k)?, v.contiguous()?))
        })?;
        if self.capture {
            self.captured = Some(Qkv {
                q: q.clone(),
                k: k.clone(),
                v: v.clone(),
            });
        }
        stage(dev, "KV-cache append", || self.cache.push(&k, &v))?;
        let cfg = self.spec.attn.clone().with_causal(true);
        // The cache as stored: a decode step on CUDA reads MX codes directly; otherwise
        // the views are dequantized and the attention op runs on them.
        let (kv, vv) = (self.cache.k_view()?, self.cache.v_view()?);
        let (Some(kv), Some(vv)) = (kv, vv) else {
            bail!("layer {}: empty KV cache after an append", self.index);
        };
        // The op's checks stay on the device (no synchronization per layer); the model's
        // forward reads them once at its end.
        let opts = RunOptions {
            checks: DeviceChecks::Deferred,
            ..Default::default()
        };
        let o = stage(dev, "attention", || {
            attention_decode_ext(&q, &kv, &vv, &cfg, &opts).map_err(|e| {
                candle_core::Error::Msg(format!("layer {} ({}): {e}", self.index, cfg.label()))
            })
        })?;
        stage(dev, "o projection", || {
            o.transpose(1, 2)?
                .reshape((b, l, nh * d))?
                .apply(&self.o_proj)
        })
    }
}

#[derive(Debug)]
struct DecoderLayer {
    attn: Attention,
    mlp: Mlp,
    ln1: RmsNorm,
    ln2: RmsNorm,
}

impl DecoderLayer {
    fn new(
        cfg: &Config,
        rotary: Arc<Rotary>,
        spec: LayerSpec,
        index: usize,
        vb: VarBuilder,
    ) -> Result<Self> {
        Ok(Self {
            attn: Attention::new(cfg, rotary, spec, index, vb.pp("self_attn"))?,
            mlp: Mlp::new(cfg, vb.pp("mlp"))?,
            ln1: rms_norm(cfg.hidden_size, cfg.rms_norm_eps, vb.pp("input_layernorm"))?,
            ln2: rms_norm(
                cfg.hidden_size,
                cfg.rms_norm_eps,
                vb.pp("post_attention_layernorm"),
            )?,
        })
    }

    fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        let dev = x.device();
        let n = stage(dev, "RMSNorm", || self.ln1.forward(x))?;
        let h = self.attn.forward(&n)?;
        let x = stage(dev, "residual add", || x + h)?;
        let n = stage(dev, "RMSNorm", || self.ln2.forward(&x))?;
        let h = self.mlp.forward(&n)?;
        stage(dev, "residual add", || x + h)
    }
}

/// The decoder for causal LM, with a KV cache per layer. Each forward call continues the
/// sequence the caches hold (positions start at [`CausalLm::seq_len`]); call
/// [`CausalLm::clear_kv_cache`] to start a new one.
#[derive(Debug)]
pub struct CausalLm {
    cfg: Config,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    device: Device,
    dtype: DType,
}

impl CausalLm {
    /// Builds the model from `vb` (weights under `model.*` and `lm_head`) with one spec
    /// per layer.
    pub fn new(cfg: &Config, schedule: &Schedule, vb: VarBuilder) -> Result<Self> {
        if !matches!(vb.dtype(), DType::F32 | DType::BF16 | DType::F16) {
            bail!(
                "decoder: dtype {:?} is not supported (use f32, bf16 or f16)",
                vb.dtype()
            );
        }
        if schedule.len() != cfg.num_hidden_layers {
            bail!(
                "decoder: the schedule has {} layers, the model {}",
                schedule.len(),
                cfg.num_hidden_layers
            );
        }
        let embed_tokens =
            candle_nn::embedding(cfg.vocab_size, cfg.hidden_size, vb.pp("model.embed_tokens"))?;
        let rotary = Arc::new(Rotary::new(vb.dtype(), cfg, vb.device())?);
        let vb_l = vb.pp("model.layers");
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            layers.push(DecoderLayer::new(
                cfg,
                rotary.clone(),
                schedule.layer(i).clone(),
                i,
                vb_l.pp(i),
            )?);
        }
        let lm_head = if cfg.tie_word_embeddings {
            Linear::new(embed_tokens.embeddings().clone(), None)
        } else {
            linear_no_bias(cfg.hidden_size, cfg.vocab_size, vb.pp("lm_head"))?
        };
        Ok(Self {
            cfg: cfg.clone(),
            embed_tokens,
            layers,
            norm: rms_norm(cfg.hidden_size, cfg.rms_norm_eps, vb.pp("model.norm"))?,
            lm_head,
            device: vb.device().clone(),
            dtype: vb.dtype(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Tokens in the caches (the position of the next token).
    pub fn seq_len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.attn.cache.len())
    }

    pub fn clear_kv_cache(&mut self) {
        for l in &mut self.layers {
            l.attn.cache.reset();
        }
    }

    /// Replaces the per-layer specs (and empties the caches).
    pub fn set_schedule(&mut self, schedule: &Schedule) -> Result<()> {
        if schedule.len() != self.layers.len() {
            bail!(
                "decoder: the schedule has {} layers, the model {}",
                schedule.len(),
                self.layers.len()
            );
        }
        for (i, l) in self.layers.iter_mut().enumerate() {
            l.attn.set_spec(schedule.layer(i).clone())?;
        }
        Ok(())
    }

    /// Runs the layers' projections as the linear schedule `spec` says, converting dense
    /// ones now (an FP8 projection converts back only by reloading).
    pub fn set_linears(&mut self, spec: &LinearSpec) -> Result<()> {
        let plan = spec.resolve(self.layers.len())?;
        for (l, [attn, mlp]) in self.layers.iter_mut().zip(plan) {
            let a = &mut l.attn;
            for p in [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj] {
                p.convert(attn)?;
            }
            let m = &mut l.mlp;
            for p in [&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj] {
                p.convert(mlp)?;
            }
        }
        Ok(())
    }

    /// The formats of the layers' projections, counted per format name over (attention, MLP)
    /// groups: `"fp8: 60"`.
    pub fn linear_summary(&self) -> String {
        mxattn_fp8::format_counts(
            self.layers
                .iter()
                .flat_map(|l| [l.attn.q_proj.format(), l.mlp.up_proj.format()]),
        )
    }

    /// The spec of layer `i`.
    pub fn layer_spec(&self, i: usize) -> &LayerSpec {
        &self.layers[i].attn.spec
    }

    /// Keeps (`on`) or stops keeping each layer's attention inputs of the latest forward
    /// call (see [`Qkv`]); off drops what was kept.
    pub fn set_capture(&mut self, on: bool) {
        for l in &mut self.layers {
            l.attn.capture = on;
            if !on {
                l.attn.captured = None;
            }
        }
    }

    /// The attention inputs of every layer from the latest forward call with capture on
    /// (`None` for a layer that has none), leaving none kept.
    pub fn take_captured(&mut self) -> Vec<Option<Qkv>> {
        self.layers
            .iter_mut()
            .map(|l| l.attn.captured.take())
            .collect()
    }

    /// The KV cache of layer `i` (for kernels that read its codes directly).
    pub fn layer_cache(&self, i: usize) -> &LayerKvCache {
        &self.layers[i].attn.cache
    }

    /// Bytes held by all KV caches.
    pub fn kv_cache_bytes(&self) -> usize {
        self.layers.iter().map(|l| l.attn.cache.bytes()).sum()
    }

    /// Weight bytes a batch-1 decode step reads: every projection as held (FP8: codes and
    /// scales) and the output head; the input embedding is a row lookup and the norms'
    /// kilobytes are left out. With [`Self::kv_cache_bytes`] the bytes a step must move,
    /// whose time at the memory bandwidth bounds decode speed.
    pub fn decode_weight_bytes(&self) -> usize {
        let head = self.lm_head.weight();
        let mut total = head.elem_count() * head.dtype().size_in_bytes();
        for l in &self.layers {
            let (a, m) = (&l.attn, &l.mlp);
            total += [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj]
                .into_iter()
                .chain([&m.gate_proj, &m.up_proj, &m.down_proj])
                .map(|p| p.storage_bytes())
                .sum::<usize>();
        }
        total
    }

    /// What the caches would hold in bf16 (2 bytes per K and V element), for comparison.
    pub fn kv_cache_bytes_as_bf16(&self) -> usize {
        self.layers
            .iter()
            .map(|l| 2 * 2 * l.attn.cache.elements())
            .sum()
    }

    /// Final hidden states `[b, l, hidden]` for `input` (`[b, l]` token ids, u32), which
    /// continues the cached sequence.
    pub fn forward_hidden(&mut self, input: &Tensor) -> Result<Tensor> {
        let (_, l) = input.dims2()?;
        if l == 0 {
            bail!("decoder: empty input");
        }
        self.check_ids(input)?;
        self.forward_hidden_checked(input)
    }

    /// [`Self::forward_hidden`] of ids already checked against the vocabulary.
    fn forward_hidden_checked(&mut self, input: &Tensor) -> Result<Tensor> {
        let dev = input.device().clone();
        let mut h = stage(&dev, "embedding", || self.embed_tokens.forward(input))?;
        for layer in &mut self.layers {
            h = layer.forward(&h)?;
        }
        // the layers' deferred attention checks (non-finite inputs, overflow): one read per
        // forward, none when every layer ran the decode kernel
        stage(&dev, "deferred attention checks", || {
            mxattn::attention::check_device(&dev)
                .map_err(|e| candle_core::Error::Msg(format!("forward: {e}")))
        })?;
        stage(&dev, "final RMSNorm", || self.norm.forward(&h))
    }

    /// Logits `[b, l, vocab]` (f32) for every position of `input`.
    pub fn forward_all(&mut self, input: &Tensor) -> Result<Tensor> {
        self.forward_hidden(input)?
            .apply(&self.lm_head)?
            .to_dtype(DType::F32)
    }

    /// Logits `[b, vocab]` (f32) of the last position only (generation).
    pub fn forward_last(&mut self, input: &Tensor) -> Result<Tensor> {
        let h = self.forward_hidden(input)?;
        self.head_of_last(&h)
    }

    /// Logits `[1, vocab]` (f32) of the last of `ids` (one sequence), which continue the
    /// cached sequence. The ids are checked on the host, so a GPU decode step does not read
    /// back from the device for it (as [`Self::forward_last`] on a device tensor must).
    pub fn forward_last_ids(&mut self, ids: &[u32]) -> Result<Tensor> {
        if ids.is_empty() {
            bail!("decoder: empty input");
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            bail!(
                "decoder: token id {bad} is outside the vocabulary (vocab_size {})",
                self.cfg.vocab_size
            );
        }
        let input = Tensor::new(ids, &self.device)?.unsqueeze(0)?;
        let h = self.forward_hidden_checked(&input)?;
        self.head_of_last(&h)
    }

    fn head_of_last(&self, h: &Tensor) -> Result<Tensor> {
        let l = h.dim(1)?;
        stage(h.device(), "output head", || {
            h.narrow(1, l - 1, 1)?
                .squeeze(1)?
                .apply(&self.lm_head)?
                .to_dtype(DType::F32)
        })
    }

    /// An id past the vocabulary would read past the embedding table.
    fn check_ids(&self, input: &Tensor) -> Result<()> {
        let max = input.flatten_all()?.max(0)?.to_dtype(DType::U32)?;
        let max = max.to_scalar::<u32>()? as usize;
        if max >= self.cfg.vocab_size {
            bail!(
                "decoder: token id {max} is outside the vocabulary (vocab_size {})",
                self.cfg.vocab_size
            );
        }
        Ok(())
    }
}
