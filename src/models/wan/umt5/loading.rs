//! Finding, checking and loading a transformers `UMT5EncoderModel` (`text_encoder/` of a Wan
//! -Diffusers repository): `config.json` plus `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`.
//!
//! Before mapping, every file is opened and every tensor the config implies is looked up, so
//! a missing, mis-shaped or non-float tensor is an error naming the file and the tensor.
//! Tensors the encoder does not use (a decoder, an `lm_head`) are ignored.

use super::config::Umt5Config;
use super::model::EMBED_KEYS;
use crate::models::qwen3::loading::{diagnose_safetensors, read_index};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{bail, Result};
use safetensors::Dtype as StDtype;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const WEIGHTS: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

fn msg(s: String) -> candle_core::Error {
    candle_core::Error::Msg(s)
}

/// The files of one text encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct Umt5Files {
    pub config: PathBuf,
    /// Safetensors files, in index order (or the single file).
    pub weights: Vec<PathBuf>,
    /// The index file when the weights are sharded.
    pub index: Option<PathBuf>,
}

impl Umt5Files {
    /// The files of a text-encoder directory, or of the `text_encoder/` folder of a pipeline
    /// directory.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let mut dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            bail!("{}: not a directory", dir.display());
        }
        let sub = dir.join("text_encoder");
        if !dir.join("config.json").is_file() && sub.join("config.json").is_file() {
            dir = sub;
        }
        let config = dir.join("config.json");
        if !config.is_file() {
            bail!(
                "{}: no config.json (nor text_encoder/config.json)",
                dir.display()
            );
        }
        let index = dir.join(INDEX);
        let single = dir.join(WEIGHTS);
        let (weights, index) = if index.is_file() {
            let mut files: Vec<String> = read_index(&index)?.into_values().collect();
            files.sort();
            files.dedup();
            let mut paths = Vec::new();
            for f in files {
                let p = dir.join(&f);
                if !p.is_file() {
                    bail!(
                        "{}: lists shard {f}, which is not in {}",
                        index.display(),
                        dir.display()
                    );
                }
                paths.push(p);
            }
            (paths, Some(index))
        } else if single.is_file() {
            (vec![single], None)
        } else {
            bail!("{}: no {WEIGHTS} and no {INDEX}", dir.display());
        };
        Ok(Self {
            config,
            weights,
            index,
        })
    }
}

/// Every tensor the encoder of `cfg` loads, with its shape; the embedding under its first
/// name, [`EMBED_KEYS`]`[0]` (the loader also takes the second).
pub fn expected_tensors(cfg: &Umt5Config) -> Vec<(String, Vec<usize>)> {
    let (d, inner, ff) = (cfg.d_model, cfg.inner_dim(), cfg.d_ff);
    let mut v = vec![(EMBED_KEYS[0].to_string(), vec![cfg.vocab_size, d])];
    for i in 0..cfg.num_layers {
        let a = format!("encoder.block.{i}.layer.0");
        v.push((format!("{a}.layer_norm.weight"), vec![d]));
        for n in ["q", "k", "v"] {
            v.push((format!("{a}.SelfAttention.{n}.weight"), vec![inner, d]));
        }
        v.push((format!("{a}.SelfAttention.o.weight"), vec![d, inner]));
        v.push((
            format!("{a}.SelfAttention.relative_attention_bias.weight"),
            vec![cfg.relative_attention_num_buckets, cfg.num_heads],
        ));
        let f = format!("encoder.block.{i}.layer.1");
        v.push((format!("{f}.layer_norm.weight"), vec![d]));
        v.push((format!("{f}.DenseReluDense.wi_0.weight"), vec![ff, d]));
        v.push((format!("{f}.DenseReluDense.wi_1.weight"), vec![ff, d]));
        v.push((format!("{f}.DenseReluDense.wo.weight"), vec![d, ff]));
    }
    v.push(("encoder.final_layer_norm.weight".into(), vec![d]));
    v
}

/// Opens every weight file and checks that each tensor the encoder of `cfg` needs is present
/// once, in the shard the index names, with the right shape and a float dtype.
pub fn check_files(cfg: &Umt5Config, files: &Umt5Files) -> Result<()> {
    let mut found: HashMap<String, (PathBuf, Vec<usize>, StDtype)> = HashMap::new();
    for f in &files.weights {
        // SAFETY: a read-only map of a file we do not modify, as candle's own loader does.
        let st = unsafe { MmapedSafetensors::new(f) }
            .map_err(|e| msg(format!("{}: {}", f.display(), diagnose_safetensors(f, &e))))?;
        for (name, view) in st.tensors() {
            if let Some((prev, _, _)) = found.get(&name) {
                bail!(
                    "tensor {name} is in both {} and {}",
                    prev.display(),
                    f.display()
                );
            }
            found.insert(name, (f.clone(), view.shape().to_vec(), view.dtype()));
        }
    }
    let index = match &files.index {
        Some(p) => Some((p, read_index(p)?)),
        None => None,
    };
    let searched = || {
        files
            .weights
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (mut name, shape) in expected_tensors(cfg) {
        if name == EMBED_KEYS[0] && !found.contains_key(&name) && found.contains_key(EMBED_KEYS[1])
        {
            name = EMBED_KEYS[1].to_string();
        }
        let Some((file, got, dtype)) = found.get(&name) else {
            let also = if name == EMBED_KEYS[0] {
                format!(" (nor {})", EMBED_KEYS[1])
            } else {
                String::new()
            };
            bail!(
                "UMT5 checkpoint: tensor {name}{also} is missing (searched {}; {} implies it)",
                searched(),
                files.config.display()
            );
        };
        if *got != shape {
            bail!(
                "{}: tensor {name} has shape {got:?}, but {} implies {shape:?}",
                file.display(),
                files.config.display()
            );
        }
        if !matches!(dtype, StDtype::F32 | StDtype::F16 | StDtype::BF16) {
            bail!(
                "{}: tensor {name} has dtype {dtype:?}; only f32/f16/bf16 weights are supported",
                file.display()
            );
        }
        if let Some((p, m)) = &index {
            let fname = file.file_name().and_then(|s| s.to_str()).unwrap_or("");
            match m.get(&name) {
                Some(shard) if shard == fname => {}
                Some(shard) => bail!(
                    "{}: maps tensor {name} to {shard}, but it is in {}",
                    p.display(),
                    file.display()
                ),
                None => bail!(
                    "{}: does not list tensor {name} (found in {})",
                    p.display(),
                    file.display()
                ),
            }
        }
    }
    Ok(())
}
