//! The `text_encoder/config.json` of transformers' `UMT5EncoderModel`.
//!
//! Missing fields take transformers' `UMT5Config` defaults (umt5-small); fields of the decoder
//! and of training (`num_decoder_layers`, `dropout_rate`, …) are ignored.

use candle_core::Result;
use serde::Deserialize;
use std::path::Path;

/// Hyper-parameters of a UMT5 encoder.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct Umt5Config {
    pub vocab_size: usize,
    pub d_model: usize,
    /// Width of one head (`d_model / num_heads` need not hold).
    pub d_kv: usize,
    pub d_ff: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub relative_attention_num_buckets: usize,
    pub relative_attention_max_distance: usize,
    pub layer_norm_epsilon: f64,
    /// `"gated-gelu"` (UMT5): `wo(gelu_new(wi_0 x) · wi_1 x)`; nothing else is supported.
    pub feed_forward_proj: String,
    pub pad_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
}

impl Default for Umt5Config {
    /// transformers' `UMT5Config()` defaults.
    fn default() -> Self {
        Self {
            vocab_size: 250112,
            d_model: 512,
            d_kv: 64,
            d_ff: 1024,
            num_layers: 8,
            num_heads: 6,
            relative_attention_num_buckets: 32,
            relative_attention_max_distance: 128,
            layer_norm_epsilon: 1e-6,
            feed_forward_proj: "gated-gelu".into(),
            pad_token_id: Some(0),
            eos_token_id: Some(1),
        }
    }
}

impl Umt5Config {
    /// UMT5-XXL's encoder, Wan2.1/2.2's text encoder (`google/umt5-xxl`; the Wan -Diffusers
    /// repositories' `text_encoder/config.json`): 4096 wide, 24 layers of 64 heads of 64.
    pub fn umt5_xxl() -> Self {
        Self {
            vocab_size: 256384,
            d_model: 4096,
            d_kv: 64,
            d_ff: 10240,
            num_layers: 24,
            num_heads: 64,
            ..Self::default()
        }
    }

    /// Reads and checks a `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let cfg: Self = mxattn_checkpoint::read_json(path, "a UMT5 encoder config")?;
        cfg.validate()
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))?;
        Ok(cfg)
    }

    /// Query/key/value width, `num_heads · d_kv`.
    pub fn inner_dim(&self) -> usize {
        self.num_heads * self.d_kv
    }

    /// Checks everything the encoder relies on.
    pub fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("d_kv", self.d_kv),
            ("d_ff", self.d_ff),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
        ] {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        // transformers: "gated-gelu" means gated gelu_new; "gated-gelu_new" spells it out
        if !matches!(
            self.feed_forward_proj.as_str(),
            "gated-gelu" | "gated-gelu_new"
        ) {
            return Err(format!(
                "feed_forward_proj {:?} is not supported (only UMT5's \"gated-gelu\")",
                self.feed_forward_proj
            ));
        }
        // bidirectional: half the buckets per direction, half of those exact
        let max_exact = self.relative_attention_num_buckets / 4;
        if max_exact == 0 {
            return Err(format!(
                "relative_attention_num_buckets ({}) must be at least 4",
                self.relative_attention_num_buckets
            ));
        }
        if self.relative_attention_max_distance <= max_exact {
            return Err(format!(
                "relative_attention_max_distance ({}) must exceed num_buckets / 4 ({max_exact})",
                self.relative_attention_max_distance
            ));
        }
        if !(self.layer_norm_epsilon.is_finite() && self.layer_norm_epsilon >= 0.0) {
            return Err(format!(
                "layer_norm_epsilon {} is not a non-negative number",
                self.layer_norm_epsilon
            ));
        }
        if let Some(id) = self.pad_token_id {
            if id as usize >= self.vocab_size {
                return Err(format!(
                    "pad_token_id {id} is outside the vocabulary ({})",
                    self.vocab_size
                ));
            }
        }
        Ok(())
    }
}
