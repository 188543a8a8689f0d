//! The transformer's `config.json`, in either layout: diffusers' `WanTransformer3DModel`
//! (`transformer/config.json`) or the original Wan release's `WanModel` (`config.json` next
//! to the `high_noise_model/` or root weights, fields `dim`, `num_heads`, `in_dim`, …).
//!
//! Missing fields take diffusers' defaults (the A14B experts).

use candle_core::Result;
use serde::Deserialize;
use std::path::Path;

/// Hyper-parameters of a Wan diffusion transformer, with diffusers' names.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct TransformerConfig {
    /// Patch (t, h, w) of the patch-embedding Conv3d (kernel = stride).
    pub patch_size: [usize; 3],
    pub num_attention_heads: usize,
    pub attention_head_dim: usize,
    pub in_channels: usize,
    /// diffusers: `None` means `in_channels`.
    pub out_channels: Option<usize>,
    /// Width of the text encoder's output (UMT5-XXL: 4096).
    pub text_dim: usize,
    /// Width of the sinusoidal timestep embedding.
    pub freq_dim: usize,
    pub ffn_dim: usize,
    pub num_layers: usize,
    /// Affine LayerNorm before the cross-attention (else none).
    pub cross_attn_norm: bool,
    /// diffusers builds the q/k RMSNorm whatever this says; read for completeness.
    pub qk_norm: Option<String>,
    pub eps: f64,
    /// Wan2.1 I2V's CLIP image branch; Wan2.2 has none (must be null).
    pub image_dim: Option<usize>,
    pub added_kv_proj_dim: Option<usize>,
    /// Positions per axis of the RoPE tables.
    pub rope_max_seq_len: usize,
    pub pos_embed_seq_len: Option<usize>,
}

impl Default for TransformerConfig {
    /// diffusers' defaults: one T2V-A14B expert.
    fn default() -> Self {
        Self::t2v_a14b()
    }
}

/// The original release's `WanModel` config (Wan2.2 `wan/modules/model.py` arguments).
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
struct OriginalConfig {
    patch_size: [usize; 3],
    in_dim: usize,
    dim: usize,
    ffn_dim: usize,
    freq_dim: usize,
    text_dim: usize,
    out_dim: usize,
    num_heads: usize,
    num_layers: usize,
    qk_norm: bool,
    cross_attn_norm: bool,
    eps: f64,
    model_type: String,
}

impl Default for OriginalConfig {
    fn default() -> Self {
        // WanModel's defaults
        Self {
            patch_size: [1, 2, 2],
            in_dim: 16,
            dim: 2048,
            ffn_dim: 8192,
            freq_dim: 256,
            text_dim: 4096,
            out_dim: 16,
            num_heads: 16,
            num_layers: 32,
            qk_norm: true,
            cross_attn_norm: true,
            eps: 1e-6,
            model_type: "t2v".into(),
        }
    }
}

impl TransformerConfig {
    /// One expert of Wan2.2 T2V-A14B (both experts share it): 40 × 128 heads, 40 layers.
    pub fn t2v_a14b() -> Self {
        Self {
            patch_size: [1, 2, 2],
            num_attention_heads: 40,
            attention_head_dim: 128,
            in_channels: 16,
            out_channels: Some(16),
            text_dim: 4096,
            freq_dim: 256,
            ffn_dim: 13824,
            num_layers: 40,
            cross_attn_norm: true,
            qk_norm: Some("rms_norm_across_heads".into()),
            eps: 1e-6,
            image_dim: None,
            added_kv_proj_dim: None,
            rope_max_seq_len: 1024,
            pos_embed_seq_len: None,
        }
    }

    /// One expert of Wan2.2 I2V-A14B: T2V-A14B with 36 input channels (noise, mask, image
    /// latents).
    pub fn i2v_a14b() -> Self {
        Self {
            in_channels: 36,
            ..Self::t2v_a14b()
        }
    }

    /// Wan2.2 TI2V-5B: 24 × 128 heads, 30 layers, 48 latent channels (per-token timesteps).
    pub fn ti2v_5b() -> Self {
        Self {
            num_attention_heads: 24,
            in_channels: 48,
            out_channels: Some(48),
            ffn_dim: 14336,
            num_layers: 30,
            ..Self::t2v_a14b()
        }
    }

    /// Parses a `config.json` of either layout (original if it has `dim` or `_class_name`
    /// `WanModel`).
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
        let class = v.get("_class_name").and_then(|c| c.as_str()).unwrap_or("");
        let cfg = if class == "WanModel" || (v.get("dim").is_some() && class.is_empty()) {
            let o: OriginalConfig =
                serde_json::from_value(v).map_err(|e| format!("not a WanModel config: {e}"))?;
            if o.num_heads == 0 || !o.dim.is_multiple_of(o.num_heads) {
                return Err(format!(
                    "dim {} is not a multiple of num_heads {}",
                    o.dim, o.num_heads
                ));
            }
            if !o.qk_norm {
                return Err("qk_norm false is not supported (diffusers always applies it)".into());
            }
            if !matches!(o.model_type.as_str(), "t2v" | "i2v" | "ti2v") {
                return Err(format!(
                    "model_type {:?} is not supported (t2v, i2v, ti2v)",
                    o.model_type
                ));
            }
            Self {
                patch_size: o.patch_size,
                num_attention_heads: o.num_heads,
                attention_head_dim: o.dim / o.num_heads,
                in_channels: o.in_dim,
                out_channels: Some(o.out_dim),
                text_dim: o.text_dim,
                freq_dim: o.freq_dim,
                ffn_dim: o.ffn_dim,
                num_layers: o.num_layers,
                cross_attn_norm: o.cross_attn_norm,
                qk_norm: Some("rms_norm_across_heads".into()),
                eps: o.eps,
                image_dim: None,
                added_kv_proj_dim: None,
                rope_max_seq_len: 1024,
                pos_embed_seq_len: None,
            }
        } else {
            if !class.is_empty() && class != "WanTransformer3DModel" {
                return Err(format!(
                    "_class_name is {class:?}; expected WanTransformer3DModel or WanModel"
                ));
            }
            serde_json::from_value(v)
                .map_err(|e| format!("not a WanTransformer3DModel config: {e}"))?
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and checks a `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::from_json(&mxattn_checkpoint::read_text(path)?)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))
    }

    /// Model width: heads × head dim.
    pub fn dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    pub fn out_channels(&self) -> usize {
        self.out_channels.unwrap_or(self.in_channels)
    }

    /// Values per patch: `pt·ph·pw`.
    pub fn patch_volume(&self) -> usize {
        self.patch_size.iter().product()
    }

    /// RoPE sub-dimensions (t, h, w) of a head: `h = w = 2·(d/6)`, `t = d − h − w` (44, 42,
    /// 42 for d = 128).
    pub fn rope_split(&self) -> (usize, usize, usize) {
        let d = self.attention_head_dim;
        let hw = 2 * (d / 6);
        (d - 2 * hw, hw, hw)
    }

    /// Checks everything the port relies on.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.image_dim.is_some() || self.added_kv_proj_dim.is_some() {
            return Err(
                "image_dim / added_kv_proj_dim are set: the Wan2.1 I2V CLIP image branch is not supported \
                 (Wan2.2 has none)"
                    .into(),
            );
        }
        if self.pos_embed_seq_len.is_some() {
            return Err("pos_embed_seq_len (the FLF2V image branch) is not supported".into());
        }
        if self.patch_size.contains(&0) {
            return Err(format!("patch_size {:?} has a zero entry", self.patch_size));
        }
        for (name, v) in [
            ("num_attention_heads", self.num_attention_heads),
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels()),
            ("text_dim", self.text_dim),
            ("ffn_dim", self.ffn_dim),
            ("rope_max_seq_len", self.rope_max_seq_len),
        ] {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        let d = self.attention_head_dim;
        if d < 6 || !d.is_multiple_of(2) {
            return Err(format!(
                "attention_head_dim {d}: the 3-D RoPE needs an even head dim of at least 6"
            ));
        }
        if d > mxattn::attention::MAX_HEAD_DIM {
            return Err(format!(
                "attention_head_dim {d} exceeds the attention's limit {}",
                mxattn::attention::MAX_HEAD_DIM
            ));
        }
        if self.freq_dim < 2 || !self.freq_dim.is_multiple_of(2) {
            return Err(format!(
                "freq_dim {} must be even and at least 2",
                self.freq_dim
            ));
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            return Err(format!("eps {} must be a positive number", self.eps));
        }
        if let Some(q) = &self.qk_norm {
            if q != "rms_norm_across_heads" {
                return Err(format!(
                    "qk_norm {q:?} is not supported (diffusers' Wan always uses rms_norm_across_heads)"
                ));
            }
        }
        Ok(())
    }
}
