//! Wan2.1/2.2's text encoder: the encoder of UMT5-XXL, as transformers' `UMT5EncoderModel`
//! (`src/transformers/models/umt5/modeling_umt5.py`), with diffusers' Wan prompt handling.
//!
//! - [`Umt5Encoder`]: token ids and a padding mask to `last_hidden_state`. Its attention has an
//!   additive per-layer relative position bias, which [`mxattn::attention::attention`] does not
//!   take, so it is plain candle ops in f32 (it runs once per prompt).
//! - [`TextEncoder`]: tokenizer + encoder; `encode(prompts)` gives the `[b, 512, 4096]` context
//!   of the Wan transformer (each prompt's tokens, then zeros).
//! - [`WAN_NEGATIVE_PROMPT`]: Wan's default negative prompt.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use mxattn_wan::umt5::{Umt5Config, Umt5Encoder};
//!
//! let cfg = Umt5Config { vocab_size: 100, d_model: 16, d_kv: 4, d_ff: 32, num_layers: 2,
//!                        num_heads: 4, ..Umt5Config::default() };
//! let enc = Umt5Encoder::random(&cfg, DType::F32, &Device::Cpu, 0)?;
//! let ids = Tensor::new(&[[5u32, 7, 1, 0]], &Device::Cpu)?;
//! let mask = Tensor::new(&[[1u32, 1, 1, 0]], &Device::Cpu)?;
//! assert_eq!(enc.forward(&ids, Some(&mask))?.dims(), &[1, 4, 16]);
//! # Ok::<(), candle_core::Error>(())
//! ```

pub mod clean;
pub mod config;
pub mod loading;
pub mod model;
pub mod text;

pub use clean::prompt_clean;
pub use config::Umt5Config;
pub use loading::{check_files, expected_tensors, find_files, Umt5Files};
pub use model::{relative_position_bucket, Umt5Encoder};
pub use text::{
    trim_and_pad, TextEncoder, Tokens, DEFAULT_MAX_SEQUENCE_LENGTH, WAN_NEGATIVE_PROMPT,
};

use candle_core::{DType, Device, Result};
use mxattn_checkpoint::{build_from, random_var_builder, Init};
use std::path::Path;

impl Umt5Encoder {
    /// Loads a text-encoder directory (or a pipeline directory with `text_encoder/`) in
    /// `dtype` on `device`, after checking every file and tensor.
    pub fn load(dir: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        Self::from_files(&find_files(dir)?, dtype, device)
    }

    /// Loads checked files.
    pub fn from_files(files: &Umt5Files, dtype: DType, device: &Device) -> Result<Self> {
        let cfg = Umt5Config::from_file(&files.config)?;
        check_files(&cfg, files)?;
        build_from(files, "the UMT5 encoder", dtype, device, |vb| {
            Self::new(&cfg, vb)
        })
    }

    /// The architecture of `cfg` with random weights, scaled as transformers initialises
    /// UMT5 (embedding N(0, 1), q N(0, 1/(d_model·d_kv)), k/v/wi N(0, 1/d_model),
    /// o N(0, 1/inner), wo N(0, 1/d_ff), relative biases N(0, 1/d_model), norms 1), for speed
    /// runs. On the CPU from [`mxattn::synth::Rng`], elsewhere from the device's generator.
    pub fn random(cfg: &Umt5Config, dtype: DType, device: &Device, seed: u64) -> Result<Self> {
        cfg.validate().map_err(candle_core::Error::Msg)?;
        let (d, kv, inner, ff) = (
            cfg.d_model as f64,
            cfg.d_kv as f64,
            cfg.inner_dim() as f64,
            cfg.d_ff as f64,
        );
        let init = |name: &str, _: &[usize]| {
            let how = if name.ends_with("layer_norm.weight") {
                Init::Ones
            } else {
                let var = if name == model::EMBED_KEYS[0] {
                    1.0
                } else if name.ends_with(".q.weight") {
                    1.0 / (d * kv)
                } else if name.ends_with(".o.weight") {
                    1.0 / inner
                } else if name.ends_with(".wo.weight") {
                    1.0 / ff
                } else {
                    1.0 / d
                };
                Init::Normal(f64::sqrt(var))
            };
            (how, dtype)
        };
        let vb = random_var_builder(expected_tensors(cfg), init, dtype, device, seed)?;
        Self::new(cfg, vb)
    }
}
