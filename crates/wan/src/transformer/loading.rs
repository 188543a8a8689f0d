//! Finding, checking and loading Wan transformer checkpoints in either layout:
//!
//! * diffusers (`transformer/`, and `transformer_2/` = the low-noise A14B expert):
//!   `config.json` of a `WanTransformer3DModel`, names such as `blocks.N.attn1.to_q.weight`;
//! * the original Wan release (`high_noise_model/`, `low_noise_model/`, or the root for
//!   TI2V-5B): `config.json` of a `WanModel`, names such as `blocks.N.self_attn.q.weight`.
//!
//! Both store `diffusion_pytorch_model.safetensors` or shards listed by
//! `diffusion_pytorch_model.safetensors.index.json`. The layout is told from the tensor names.
//! The model is written against diffusers' names; an original checkpoint is read through a
//! renaming [`VarBuilder`] ([`original_name`]), which also swaps `norm2`/`norm3` (the
//! original calls its norms in the order norm1, norm3, norm2). Before mapping, every file is
//! opened and every tensor the config implies looked up, so a missing, mis-shaped or non-float
//! tensor is an error naming the file and the tensor. A projection may be stored in FP8
//! (ComfyUI's scaled FP8 checkpoints: F8_E4M3 `weight` with a per-tensor `scale_weight`; or
//! 128 × 128 `weight_scale_inv` blocks): it then loads and runs as stored.

use super::config::TransformerConfig;
use candle_core::{bail, Result};
use mxattn_checkpoint::{ComponentFiles, TensorScan};
use std::path::{Path, PathBuf};

const WEIGHTS: &str = "diffusion_pytorch_model.safetensors";
const INDEX: &str = "diffusion_pytorch_model.safetensors.index.json";

/// The naming scheme of a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// diffusers' `WanTransformer3DModel`.
    Diffusers,
    /// The original Wan release's `WanModel`.
    Original,
}

/// The files of one transformer (one expert).
pub type TransformerFiles = ComponentFiles;

/// The files of one transformer directory (`config.json` plus the weights).
pub fn find_files(dir: impl AsRef<Path>) -> Result<TransformerFiles> {
    ComponentFiles::find(dir, None, WEIGHTS)
}

/// The transformer directories of a model directory, high-noise expert first: diffusers'
/// `transformer/` (+ `transformer_2/`), the original's `high_noise_model/` +
/// `low_noise_model/`, or the directory itself when it holds one transformer (TI2V-5B, or a
/// component directory).
pub fn expert_dirs(root: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
    let root = root.as_ref();
    let has = |d: &Path| d.join("config.json").is_file();
    for pair in [
        ["transformer", "transformer_2"],
        ["high_noise_model", "low_noise_model"],
    ] {
        let first = root.join(pair[0]);
        if has(&first) {
            let second = root.join(pair[1]);
            return Ok(if has(&second) {
                vec![first, second]
            } else {
                vec![first]
            });
        }
    }
    if has(root) && (root.join(WEIGHTS).is_file() || root.join(INDEX).is_file()) {
        return Ok(vec![root.to_path_buf()]);
    }
    bail!(
        "{}: no transformer found (transformer/, high_noise_model/, or config.json with {WEIGHTS} or {INDEX})",
        root.display()
    )
}

/// Modules diffusers keeps in f32 whatever the model dtype (`_keep_in_fp32_modules`).
pub fn keeps_f32(name: &str) -> bool {
    name.starts_with("condition_embedder.time_embedder.")
        || name.ends_with("scale_shift_table")
        || name.contains(".norm1.")
        || name.contains(".norm2.")
        || name.contains(".norm3.")
}

/// Every tensor a transformer of `cfg` loads, with its shape, in diffusers' names.
pub fn expected_tensors(cfg: &TransformerConfig) -> Vec<(String, Vec<usize>)> {
    let dim = cfg.dim();
    let mut v: Vec<(String, Vec<usize>)> = Vec::new();
    let lin = |v: &mut Vec<(String, Vec<usize>)>, p: &str, i: usize, o: usize| {
        v.push((format!("{p}.weight"), vec![o, i]));
        v.push((format!("{p}.bias"), vec![o]));
    };
    let [pt, ph, pw] = cfg.patch_size;
    v.push((
        "patch_embedding.weight".into(),
        vec![dim, cfg.in_channels, pt, ph, pw],
    ));
    v.push(("patch_embedding.bias".into(), vec![dim]));
    let c = "condition_embedder";
    lin(
        &mut v,
        &format!("{c}.time_embedder.linear_1"),
        cfg.freq_dim,
        dim,
    );
    lin(&mut v, &format!("{c}.time_embedder.linear_2"), dim, dim);
    lin(&mut v, &format!("{c}.time_proj"), dim, 6 * dim);
    lin(
        &mut v,
        &format!("{c}.text_embedder.linear_1"),
        cfg.text_dim,
        dim,
    );
    lin(&mut v, &format!("{c}.text_embedder.linear_2"), dim, dim);
    for l in 0..cfg.num_layers {
        let b = format!("blocks.{l}");
        for a in ["attn1", "attn2"] {
            for p in ["to_q", "to_k", "to_v", "to_out.0"] {
                lin(&mut v, &format!("{b}.{a}.{p}"), dim, dim);
            }
            v.push((format!("{b}.{a}.norm_q.weight"), vec![dim]));
            v.push((format!("{b}.{a}.norm_k.weight"), vec![dim]));
        }
        if cfg.cross_attn_norm {
            v.push((format!("{b}.norm2.weight"), vec![dim]));
            v.push((format!("{b}.norm2.bias"), vec![dim]));
        }
        lin(&mut v, &format!("{b}.ffn.net.0.proj"), dim, cfg.ffn_dim);
        lin(&mut v, &format!("{b}.ffn.net.2"), cfg.ffn_dim, dim);
        v.push((format!("{b}.scale_shift_table"), vec![1, 6, dim]));
    }
    lin(
        &mut v,
        "proj_out",
        dim,
        cfg.out_channels() * cfg.patch_volume(),
    );
    v.push(("scale_shift_table".into(), vec![1, 2, dim]));
    v
}

/// The original release's name of a diffusers tensor name (the inverse of diffusers'
/// `convert_wan_to_diffusers.py` renaming, norm2/norm3 swap included).
pub fn original_name(name: &str) -> String {
    const TOP: [(&str, &str); 7] = [
        (
            "condition_embedder.time_embedder.linear_1.",
            "time_embedding.0.",
        ),
        (
            "condition_embedder.time_embedder.linear_2.",
            "time_embedding.2.",
        ),
        (
            "condition_embedder.text_embedder.linear_1.",
            "text_embedding.0.",
        ),
        (
            "condition_embedder.text_embedder.linear_2.",
            "text_embedding.2.",
        ),
        ("condition_embedder.time_proj.", "time_projection.1."),
        ("proj_out.", "head.head."),
        ("scale_shift_table", "head.modulation"),
    ];
    for (d, o) in TOP {
        if let Some(rest) = name.strip_prefix(d) {
            return format!("{o}{rest}");
        }
    }
    let Some(rest) = name.strip_prefix("blocks.") else {
        return name.to_string();
    };
    let Some((layer, rest)) = rest.split_once('.') else {
        return name.to_string();
    };
    const BLOCK: [(&str, &str); 16] = [
        ("attn1.to_q.", "self_attn.q."),
        ("attn1.to_k.", "self_attn.k."),
        ("attn1.to_v.", "self_attn.v."),
        ("attn1.to_out.0.", "self_attn.o."),
        ("attn1.norm_q.", "self_attn.norm_q."),
        ("attn1.norm_k.", "self_attn.norm_k."),
        ("attn2.to_q.", "cross_attn.q."),
        ("attn2.to_k.", "cross_attn.k."),
        ("attn2.to_v.", "cross_attn.v."),
        ("attn2.to_out.0.", "cross_attn.o."),
        ("attn2.norm_q.", "cross_attn.norm_q."),
        ("attn2.norm_k.", "cross_attn.norm_k."),
        ("norm2.", "norm3."),
        ("ffn.net.0.proj.", "ffn.0."),
        ("ffn.net.2.", "ffn.2."),
        ("scale_shift_table", "modulation"),
    ];
    for (d, o) in BLOCK {
        if let Some(tail) = rest.strip_prefix(d) {
            return format!("blocks.{layer}.{o}{tail}");
        }
    }
    name.to_string()
}

/// The layout of a checkpoint from its tensor names.
pub fn detect_layout<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<Layout> {
    for n in names {
        if n.starts_with("condition_embedder.") || n.contains(".attn1.") {
            return Some(Layout::Diffusers);
        }
        if n.starts_with("time_projection.") || n.contains(".self_attn.") {
            return Some(Layout::Original);
        }
    }
    None
}

/// Opens every weight file, tells the layout from the names, and checks that each tensor the
/// transformer of `cfg` needs is present once, in the shard the index names, with the right
/// shape and a float dtype.
pub fn check_files(cfg: &TransformerConfig, files: &TransformerFiles) -> Result<Layout> {
    let scan = TensorScan::open(files)?;
    let Some(layout) = detect_layout(scan.names()) else {
        bail!(
            "{}: neither diffusers (condition_embedder.*, blocks.N.attn1.*) nor original Wan \
             (time_projection.*, blocks.N.self_attn.*) tensor names",
            scan.searched()
        );
    };
    for (dname, shape) in expected_tensors(cfg) {
        let name = match layout {
            Layout::Diffusers => dname,
            Layout::Original => original_name(&dname),
        };
        let what = || format!("Wan transformer checkpoint ({layout:?} layout): tensor {name}");
        // a block's projection in FP8 (ComfyUI's scaled FP8): E4M3 codes and a scale beside
        // them (the blocks' only 2-D weights are projections; the embedders and the head
        // must be dense, the model reads them so)
        let stem = name
            .strip_suffix(".weight")
            .filter(|_| shape.len() == 2 && name.starts_with("blocks."));
        let scale = stem.and_then(|s| {
            ["scale_weight", "weight_scale_inv"]
                .map(|k| format!("{s}.{k}"))
                .into_iter()
                .find(|n| scan.contains(n))
        });
        match scale {
            Some(sname) => {
                scan.check_fp8(&name, &shape, what)?;
                let grid = [shape[0].div_ceil(128), shape[1].div_ceil(128)];
                let shapes: [&[usize]; 3] = [&[], &[1], &grid];
                if !shapes
                    .iter()
                    .any(|s| scan.check(&sname, s, String::new).is_ok())
                {
                    bail!(
                        "{}: tensor {sname} is not a float scale of shape [], [1] or {grid:?} (128×128 blocks of {name})",
                        scan.searched()
                    );
                }
            }
            None => scan.check(&name, &shape, what)?,
        }
    }
    Ok(layout)
}
