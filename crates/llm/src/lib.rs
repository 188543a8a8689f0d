//! Qwen3 (dense, 0.6B–32B) with a per-layer attention schedule and a KV cache that stores
//! K/V in each layer's format.
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! use mxattn_llm::{loading, CheckpointFiles, Config, ScheduleSpec};
//!
//! let files = CheckpointFiles::from_dir("path/to/Qwen3-8B")?;
//! let cfg = Config::from_file(&files.component.config)?;
//! let schedule = ScheduleSpec::parse("hybrid")?.resolve(cfg.num_hidden_layers)?;
//! let mut model = loading::load(&cfg, &files, &schedule, DType::BF16, &Device::Cpu)?;
//! let ids = Tensor::new(&[[9707u32, 11, 1207]], &Device::Cpu)?;
//! let logits = model.forward_all(&ids)?; // [1, 3, vocab], f32
//! # Ok::<(), candle_core::Error>(())
//! ```

pub mod chat;
pub mod config;
pub mod generation;
pub mod gguf;
pub mod kv_cache;
pub mod loading;
pub mod model;
pub mod schedule;
pub mod smollm2;

pub use config::{Arch, Config};
pub use gguf::GgufFile;
pub use kv_cache::{CacheFormat, CachedOperand, KvFormat, LayerKvCache};
pub use loading::CheckpointFiles;
pub use model::{CausalLm, Qkv};
pub use schedule::{layer_preset, LayerSpec, Schedule, ScheduleSpec};
/// The tokenizer type the chat helpers take (re-exported so front ends need not name the crate).
pub use tokenizers::Tokenizer;
