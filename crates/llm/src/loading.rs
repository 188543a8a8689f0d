//! Finding, checking and loading Qwen3 checkpoints.
//!
//! A checkpoint directory holds `config.json`, usually `tokenizer.json`, and the weights
//! as `model.safetensors` or as shards listed by `model.safetensors.index.json`. Before
//! the weights are mapped, [`check_checkpoint`] opens every file and compares each tensor
//! the config implies with what the files hold, so a truncated file, a missing tensor, a
//! wrong shape or an index that points at the wrong shard is an error naming the file and
//! the tensor (candle's own messages name only one of the two).

use super::config::Config;
use super::model::CausalLm;
use super::schedule::Schedule;
use candle_core::{DType, Device, Result};
use mxattn_checkpoint::{build_from, random_var_builder, ComponentFiles, Init, TensorScan};
use std::path::{Path, PathBuf};

/// The files of one checkpoint: the weights (a [`ComponentFiles`]) and the tokenizer.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointFiles {
    /// `config.json` and the safetensors file(s), with the index when sharded.
    pub component: ComponentFiles,
    pub tokenizer: Option<PathBuf>,
}

const WEIGHTS: &str = "model.safetensors";

impl CheckpointFiles {
    /// The files of a local checkpoint directory.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let component = ComponentFiles::find(dir, None, WEIGHTS)?;
        let tok = dir.join("tokenizer.json");
        Ok(Self {
            component,
            tokenizer: tok.is_file().then_some(tok),
        })
    }

    /// Files of a Hugging Face Hub repository (`Qwen/Qwen3-8B`), through the local cache
    /// first and the network second. Needs the `hub` feature (on by default).
    #[cfg(feature = "hub")]
    pub fn from_hub(repo_id: &str, revision: Option<&str>) -> Result<Self> {
        let get = mxattn_checkpoint::hub_getter(repo_id, revision, "Qwen/Qwen3-8B")?;
        let component = mxattn_checkpoint::fetch_component(&get, None, WEIGHTS)?;
        Ok(Self {
            component,
            tokenizer: get("tokenizer.json").ok(),
        })
    }
}

/// Every tensor a decoder of `cfg` loads (Hugging Face names), with its shape.
pub fn expected_tensors(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (h, d, i) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let mut v = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let mut push = |n: &str, s: Vec<usize>| v.push((format!("{p}.{n}"), s));
        push("input_layernorm.weight", vec![h]);
        push("post_attention_layernorm.weight", vec![h]);
        push("self_attn.q_proj.weight", vec![nh * d, h]);
        push("self_attn.k_proj.weight", vec![nkv * d, h]);
        push("self_attn.v_proj.weight", vec![nkv * d, h]);
        push("self_attn.o_proj.weight", vec![h, nh * d]);
        if cfg.qkv_bias() {
            push("self_attn.q_proj.bias", vec![nh * d]);
            push("self_attn.k_proj.bias", vec![nkv * d]);
            push("self_attn.v_proj.bias", vec![nkv * d]);
        }
        if cfg.o_bias() {
            push("self_attn.o_proj.bias", vec![h]);
        }
        if cfg.qk_norm() {
            push("self_attn.q_norm.weight", vec![d]);
            push("self_attn.k_norm.weight", vec![d]);
        }
        push("mlp.gate_proj.weight", vec![i, h]);
        push("mlp.up_proj.weight", vec![i, h]);
        push("mlp.down_proj.weight", vec![h, i]);
    }
    v.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        v.push(("lm_head.weight".to_string(), vec![cfg.vocab_size, h]));
    }
    v
}

/// Opens every weight file and checks that each tensor `cfg` needs is present once, in
/// the shard the index names, with the right shape and a float dtype (FP8 codes and their
/// 128 × 128 block scales for the projections of an FP8 checkpoint).
pub fn check_checkpoint(cfg: &Config, files: &CheckpointFiles) -> Result<()> {
    let scan = TensorScan::open(&files.component)?;
    for (name, shape) in expected_tensors(cfg) {
        let what = || format!("checkpoint: tensor {name}");
        if cfg.fp8_block_weights && name.contains(".layers.") && name.ends_with("_proj.weight") {
            scan.check_fp8(&name, &shape, what)?;
            let blocks = [shape[0].div_ceil(128), shape[1].div_ceil(128)];
            let s = format!("{name}_scale_inv");
            scan.check(&s, &blocks, || format!("checkpoint: tensor {s}"))?;
        } else {
            scan.check(&name, &shape, what)?;
        }
    }
    Ok(())
}

/// Checks and loads a checkpoint in `dtype` on `device`.
pub fn load(
    cfg: &Config,
    files: &CheckpointFiles,
    schedule: &Schedule,
    dtype: DType,
    device: &Device,
) -> Result<CausalLm> {
    check_checkpoint(cfg, files)?;
    build_from(&files.component, "Qwen3", dtype, device, |vb| {
        CausalLm::new(cfg, schedule, vb)
    })
}

/// The architecture of `cfg` with random weights (for speed runs without a checkpoint).
///
/// Weights ~ N(0, 0.02²) (transformers' `initializer_range`), norms 1, biases 0. On the
/// CPU they come from [`mxattn::synth::Rng`]; on a GPU from the device's generator after
/// `set_seed(seed)` (fast for an 8B model). The values only need to be finite and of a
/// realistic scale: speed does not depend on them.
pub fn random(
    cfg: &Config,
    schedule: &Schedule,
    dtype: DType,
    device: &Device,
    seed: u64,
) -> Result<CausalLm> {
    let init = |name: &str, _: &[usize]| {
        let how = if name.ends_with("norm.weight") {
            Init::Ones
        } else if name.ends_with(".bias") {
            Init::Zeros
        } else {
            Init::Normal(0.02)
        };
        (how, dtype)
    };
    let vb = random_var_builder(expected_tensors(cfg), init, dtype, device, seed)?;
    CausalLm::new(cfg, schedule, vb)
}

/// Where the weights come from.
#[derive(Clone, Debug)]
pub enum ModelSource {
    /// A local checkpoint directory.
    Dir(PathBuf),
    /// A Hub repository such as `Qwen/Qwen3-8B` (needs the `hub` feature).
    Hub {
        repo: String,
        revision: Option<String>,
    },
    /// Random weights for `config`.
    Random { config: Box<Config>, seed: u64 },
    /// A GGUF file (weights dequantized to the dtype; tokenizer and chat template inside).
    Gguf(PathBuf),
}

/// A model ready to run, with its tokenizer file when the source has one.
pub struct Opened {
    pub model: CausalLm,
    pub tokenizer: Option<PathBuf>,
    /// The open GGUF file, when the source is one: its tokenizer and chat template.
    pub gguf: Option<crate::gguf::GgufFile>,
    /// What was loaded, for logs.
    pub description: String,
}

/// Resolves the source, checks and loads the weights, and applies `schedule`.
pub fn open(
    source: &ModelSource,
    schedule: &super::schedule::ScheduleSpec,
    dtype: DType,
    device: &Device,
) -> Result<Opened> {
    let from_files = |files: CheckpointFiles, what: String| -> Result<Opened> {
        let cfg = Config::from_file(&files.component.config)?;
        let s = schedule.resolve(cfg.num_hidden_layers)?;
        let model = load(&cfg, &files, &s, dtype, device)?;
        Ok(Opened {
            model,
            tokenizer: files.tokenizer.clone(),
            gguf: None,
            description: what,
        })
    };
    match source {
        ModelSource::Dir(d) => from_files(CheckpointFiles::from_dir(d)?, d.display().to_string()),
        ModelSource::Hub { repo, revision } => {
            #[cfg(feature = "hub")]
            {
                let files = CheckpointFiles::from_hub(repo, revision.as_deref())?;
                from_files(files, format!("{repo} (hub)"))
            }
            #[cfg(not(feature = "hub"))]
            {
                let _ = (revision, from_files);
                bail!(
                    "--model {repo}: this build has no Hub support; build with `--features hub`, \
                     or download the checkpoint and pass --model-dir DIR"
                )
            }
        }
        ModelSource::Random { config, seed } => {
            let s = schedule.resolve(config.num_hidden_layers)?;
            let model = random(config, &s, dtype, device, *seed)?;
            Ok(Opened {
                model,
                tokenizer: None,
                gguf: None,
                description: format!(
                    "random weights ({} layers, hidden {}, {:.2} B parameters, seed {seed})",
                    config.num_hidden_layers,
                    config.hidden_size,
                    config.num_parameters() as f64 / 1e9
                ),
            })
        }
        ModelSource::Gguf(p) => {
            let g = crate::gguf::GgufFile::open(p)?;
            let cfg = g.config()?;
            let s = schedule.resolve(cfg.num_hidden_layers)?;
            let model = g.load(&s, dtype, device)?;
            let name = g.get_str("general.name").unwrap_or("model").to_string();
            Ok(Opened {
                model,
                tokenizer: None,
                description: format!(
                    "{name} ({}, {} layers, hidden {}) from {}",
                    cfg.arch.name(),
                    cfg.num_hidden_layers,
                    cfg.hidden_size,
                    p.display()
                ),
                gguf: Some(g),
            })
        }
    }
}
