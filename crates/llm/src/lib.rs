//! Decoder-only LLMs with a per-layer attention schedule and a KV cache that stores K/V in
//! each layer's format: one decoder that is Qwen3 (dense, 0.6B–32B), Llama (SmolLM2) or
//! Qwen2 by its config, loaded from a safetensors checkpoint or a GGUF file.
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! use mxattn_llm::{loading, CheckpointFiles, Config, GgufFile, ScheduleSpec};
//!
//! // a Hugging Face checkpoint directory
//! let files = CheckpointFiles::from_dir("path/to/Qwen3-8B")?;
//! let cfg = Config::from_file(&files.component.config)?;
//! let schedule = ScheduleSpec::parse("hybrid")?.resolve(cfg.num_hidden_layers)?;
//! let mut model = loading::load(&cfg, &files, &schedule, DType::BF16, &Device::Cpu)?;
//! let ids = Tensor::new(&[[9707u32, 11, 1207]], &Device::Cpu)?;
//! let logits = model.forward_all(&ids)?; // [1, 3, vocab], f32
//!
//! // a GGUF file: config, weights, tokenizer and chat template from the one file
//! let g = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let schedule = ScheduleSpec::parse("fused-mxfp8")?.resolve(g.config()?.num_hidden_layers)?;
//! let mut smol = g.load(&schedule, DType::F32, &Device::Cpu)?;
//! let ids = g.tokenizer()?.encode("It is a truth", false).map_err(candle_core::Error::msg)?;
//! let logits = smol.forward_all(&Tensor::new(ids.get_ids(), &Device::Cpu)?.unsqueeze(0)?)?;
//! # Ok::<(), candle_core::Error>(())
//! ```

pub mod chat;
pub mod config;
pub mod generation;
pub mod gguf;
pub mod kv_cache;
pub mod loading;
pub mod model;
pub mod profile;
pub mod schedule;
pub mod smollm2;

pub use config::{Arch, Config};
pub use gguf::GgufFile;
pub use kv_cache::{CacheFormat, CachedOperand, KvFormat, LayerKvCache};
pub use loading::CheckpointFiles;
pub use model::{CausalLm, Qkv};
pub use schedule::{layer_preset, LayerSpec, LinearSpec, Schedule, ScheduleSpec};
/// The tokenizer type the chat helpers take (re-exported so front ends need not name the crate).
pub use tokenizers::Tokenizer;
