//! Finding, checking and loading a transformers `UMT5EncoderModel` (`text_encoder/` of a Wan
//! -Diffusers repository): `config.json` plus `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`.
//!
//! Before mapping, every file is opened and every tensor the config implies is looked up, so
//! a missing, mis-shaped or non-float tensor is an error naming the file and the tensor.
//! Tensors the encoder does not use (a decoder, an `lm_head`) are ignored.

use super::config::Umt5Config;
use super::model::EMBED_KEYS;
use candle_core::Result;
use mxattn_checkpoint::{ComponentFiles, TensorScan};
use std::path::Path;

const WEIGHTS: &str = "model.safetensors";

/// The files of one text encoder.
pub type Umt5Files = ComponentFiles;

/// The files of a text-encoder directory, or of the `text_encoder/` folder of a pipeline
/// directory.
pub fn find_files(dir: impl AsRef<Path>) -> Result<Umt5Files> {
    ComponentFiles::find(dir, Some("text_encoder"), WEIGHTS)
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
    let scan = TensorScan::open(files)?;
    for (mut name, shape) in expected_tensors(cfg) {
        let mut also = String::new();
        if name == EMBED_KEYS[0] && !scan.contains(&name) {
            if scan.contains(EMBED_KEYS[1]) {
                name = EMBED_KEYS[1].to_string();
            } else {
                also = format!(" (nor {})", EMBED_KEYS[1]);
            }
        }
        scan.check(&name, &shape, || {
            format!("UMT5 checkpoint: tensor {name}{also}")
        })?;
    }
    Ok(())
}
