//! The decoder's config: a `config.json` as Hugging Face transformers writes it (Qwen3,
//! Llama, Qwen2), or the metadata of a GGUF file ([`crate::gguf`]).
//!
//! The three architectures are one decoder with two switches: Qwen3 has an RMSNorm over
//! head_dim on every q and k head; Qwen2 has biases on the q, k and v projections (not on
//! o); Llama has neither (its `attention_bias` puts biases on all four, as Qwen3's does).
//! `model_type` picks the architecture; a config without one is read as Qwen3.
//!
//! Two spellings of the RoPE base exist in the wild: the top-level `rope_theta` of the
//! original checkpoints, and `rope_parameters: {"rope_theta": …, "rope_type": "default"}`
//! of configs re-saved by newer transformers. Both are accepted (and must agree when a
//! file has both). Embeddings may be tied (0.6B–4B) or not (8B and up).

use candle_core::{bail, Result};
use candle_nn::Activation;
use serde::Deserialize;
use std::path::Path;

/// The member of the decoder family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// q/k RMSNorm per head.
    Qwen3,
    /// Llama, SmolLM2: no q/k norm.
    Llama,
    /// q/k/v biases, no q/k norm.
    Qwen2,
}

impl Arch {
    /// From `model_type` (config.json) or `general.architecture` (GGUF).
    pub fn from_model_type(t: &str) -> Result<Self> {
        Ok(match t {
            "qwen3" => Self::Qwen3,
            "llama" => Self::Llama,
            "qwen2" => Self::Qwen2,
            _ => bail!(
                "model type {t:?} is not supported (supported: qwen3, llama, qwen2: dense decoders)"
            ),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }
}

/// The architecture hyper-parameters of a dense decoder checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// Biases on q, k, v and o (Llama's and Qwen3's `attention_bias`); Qwen2's q/k/v
    /// biases come with [`Arch::Qwen2`] whatever this says.
    pub attention_bias: bool,
    pub hidden_act: Activation,
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` as a list (config.json has one id or a list).
    pub eos_token_ids: Vec<u32>,
    /// The projections are stored in FP8 E4M3 with 128 × 128 block scales
    /// (`quantization_config` of Qwen3-*-FP8: `quant_method` "fp8", `weight_block_size`
    /// [128, 128], `weight_scale_inv` beside each weight); the embeddings, norms and output
    /// head are not.
    pub fp8_block_weights: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Deserialize)]
struct RopeParameters {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
}

#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: usize,
    rope_theta: Option<f64>,
    rope_parameters: Option<RopeParameters>,
    rope_scaling: Option<serde_json::Value>,
    rms_norm_eps: f64,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default = "default_act")]
    hidden_act: Activation,
    #[serde(default)]
    use_sliding_window: bool,
    bos_token_id: Option<u32>,
    eos_token_id: Option<OneOrMany>,
    quantization_config: Option<serde_json::Value>,
}

/// Whether `quantization_config` describes the block-scaled FP8 checkpoints this crate reads
/// (Qwen3-*-FP8, DeepSeek-style: E4M3 weights, 128 × 128 blocks, dynamic activations);
/// another quantization is an error naming it rather than weights read wrongly.
fn fp8_block_weights(q: Option<&serde_json::Value>) -> Result<bool> {
    let Some(q) = q.filter(|q| !q.is_null()) else {
        return Ok(false);
    };
    let method = q
        .get("quant_method")
        .and_then(|m| m.as_str())
        .unwrap_or("?");
    if method != "fp8" {
        bail!("config: quantization_config.quant_method {method:?} is not supported (only \"fp8\" with 128×128 blocks)");
    }
    if let Some(f) = q.get("fmt").and_then(|f| f.as_str()) {
        if f != "e4m3" {
            bail!("config: FP8 format {f:?} is not supported (only e4m3)");
        }
    }
    let block = q.get("weight_block_size");
    if block != Some(&serde_json::json!([128, 128])) {
        bail!(
            "config: FP8 weight_block_size {} is not supported (only [128, 128])",
            block.map_or("(none)".to_string(), |b| b.to_string())
        );
    }
    if let Some(a) = q.get("activation_scheme").and_then(|a| a.as_str()) {
        if a != "dynamic" {
            bail!("config: FP8 activation_scheme {a:?} is not supported (only dynamic: activations are quantized per token and 128-wide group at run time)");
        }
    }
    Ok(true)
}

fn default_act() -> Activation {
    Activation::Silu
}

impl Config {
    /// Parses and checks a `config.json` text.
    pub fn from_json_str(s: &str) -> Result<Self> {
        let raw: RawConfig =
            serde_json::from_str(s).map_err(|e| candle_core::Error::Msg(format!("config: {e}")))?;
        Self::from_raw(raw)
    }

    /// Reads a `config.json`; errors name the file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let p = path.as_ref();
        Self::from_json_str(&mxattn_checkpoint::read_text(p)?)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", p.display())))
    }

    fn from_raw(r: RawConfig) -> Result<Self> {
        let arch = Arch::from_model_type(r.model_type.as_deref().unwrap_or("qwen3"))?;
        let nested = match &r.rope_parameters {
            Some(p) => {
                if let Some(t) = p.rope_type.as_deref() {
                    if t != "default" {
                        bail!("config: rope_parameters.rope_type {t:?} is not supported (only \"default\" RoPE)");
                    }
                }
                p.rope_theta
            }
            None => None,
        };
        let rope_theta = match (r.rope_theta, nested) {
            (Some(a), Some(b)) if a != b => {
                bail!("config: rope_theta ({a}) and rope_parameters.rope_theta ({b}) disagree")
            }
            (Some(a), _) => a,
            (None, Some(b)) => b,
            (None, None) => {
                bail!("config: no RoPE base; expected `rope_theta` or `rope_parameters.rope_theta`")
            }
        };
        if let Some(v) = &r.rope_scaling {
            let kind = v
                .get("rope_type")
                .or_else(|| v.get("type"))
                .and_then(|t| t.as_str());
            if !v.is_null() && kind != Some("default") {
                bail!("config: rope_scaling {v} is not supported (only plain RoPE)");
            }
        }
        if r.use_sliding_window {
            bail!("config: use_sliding_window is true; sliding-window attention is not supported");
        }
        let num_key_value_heads = r.num_key_value_heads.unwrap_or(r.num_attention_heads);
        if r.num_attention_heads == 0 || r.hidden_size == 0 || r.vocab_size == 0 {
            bail!("config: hidden_size, vocab_size and num_attention_heads must be positive");
        }
        let head_dim = r.head_dim.unwrap_or(r.hidden_size / r.num_attention_heads);
        let eos_token_ids = match r.eos_token_id {
            None => vec![],
            Some(OneOrMany::One(x)) => vec![x],
            Some(OneOrMany::Many(v)) => v,
        };
        let c = Self {
            arch,
            vocab_size: r.vocab_size,
            hidden_size: r.hidden_size,
            intermediate_size: r.intermediate_size,
            num_hidden_layers: r.num_hidden_layers,
            num_attention_heads: r.num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings: r.max_position_embeddings,
            rope_theta,
            rms_norm_eps: r.rms_norm_eps,
            tie_word_embeddings: r.tie_word_embeddings,
            attention_bias: r.attention_bias,
            hidden_act: r.hidden_act,
            bos_token_id: r.bos_token_id,
            eos_token_ids,
            fp8_block_weights: fp8_block_weights(r.quantization_config.as_ref())?,
        };
        c.validate()?;
        Ok(c)
    }

    /// The checks every source of a config (JSON, GGUF metadata) goes through.
    pub fn validate(&self) -> Result<()> {
        let (nh, nkv, d) = (
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
        );
        if nh == 0 || self.hidden_size == 0 || self.vocab_size == 0 {
            bail!("config: hidden_size, vocab_size and num_attention_heads must be positive");
        }
        if nkv == 0 || !nh.is_multiple_of(nkv) {
            bail!(
                "config: num_attention_heads ({nh}) must be a multiple of num_key_value_heads ({nkv})"
            );
        }
        if d == 0 || !d.is_multiple_of(2) {
            bail!("config: head_dim must be even and positive for RoPE, got {d}");
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            bail!(
                "config: rope_theta must be positive, got {}",
                self.rope_theta
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            bail!(
                "config: rms_norm_eps must be positive, got {}",
                self.rms_norm_eps
            );
        }
        if self.max_position_embeddings == 0 {
            bail!("config: max_position_embeddings must be positive");
        }
        Ok(())
    }

    /// RMSNorm over head_dim on each q and k head, before RoPE (Qwen3).
    pub fn qk_norm(&self) -> bool {
        self.arch == Arch::Qwen3
    }

    /// Biases on the q, k and v projections.
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias || self.arch == Arch::Qwen2
    }

    /// A bias on the output projection.
    pub fn o_bias(&self) -> bool {
        self.attention_bias && self.arch != Arch::Qwen2
    }

    /// The published configs of the dense sizes the design notes list (models.md §B1),
    /// for `--random-weights` runs where no `config.json` is at hand. Accepts
    /// `Qwen/Qwen3-8B` or `Qwen3-8B` (case-insensitive).
    pub fn preset(name: &str) -> Result<Self> {
        let short = name.rsplit('/').next().unwrap_or(name).to_ascii_lowercase();
        let (hidden, inter, layers, heads, tie) = match short.as_str() {
            "qwen3-0.6b" => (1024, 3072, 28, 16, true),
            "qwen3-1.7b" => (2048, 6144, 28, 16, true),
            "qwen3-4b" => (2560, 9728, 36, 32, true),
            "qwen3-8b" => (4096, 12288, 36, 32, false),
            _ => bail!(
                "no built-in config for {name:?}; known: Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B, Qwen/Qwen3-4B, \
                 Qwen/Qwen3-8B (or give a config.json)"
            ),
        };
        Ok(Self {
            arch: Arch::Qwen3,
            vocab_size: 151936,
            hidden_size: hidden,
            intermediate_size: inter,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: 8,
            head_dim: 128,
            max_position_embeddings: 40960,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: tie,
            attention_bias: false,
            hidden_act: Activation::Silu,
            bos_token_id: Some(151643),
            eos_token_ids: vec![151645],
            fp8_block_weights: false,
        })
    }

    /// Parameters of the architecture (embeddings counted once when tied).
    pub fn num_parameters(&self) -> usize {
        let (h, d) = (self.hidden_size, self.head_dim);
        let qk_norm = if self.qk_norm() { 2 * d } else { 0 };
        let attn = h * d * (2 * self.num_attention_heads + 2 * self.num_key_value_heads) + qk_norm;
        let mlp = 3 * h * self.intermediate_size;
        let layer = attn + mlp + 2 * h;
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        embed + head + h + self.num_hidden_layers * layer
    }
}
