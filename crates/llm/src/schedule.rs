//! Per-layer attention schedules: which [`AttentionConfig`] and KV-cache format each
//! decoder layer uses.
//!
//! Schedules are written in the one grammar of [`mxattn::schedule`], with one site key,
//! `layers` (0-based). For example `mxfp6@layers=0-3+last;mxfp4` runs the first four and the
//! last layer in MXFP6 and the others in MXFP4; that is the `hybrid` preset.
//!
//! Linear schedules ([`LinearSpec`], `--linear`) choose the projections' format in the same
//! grammar, with the keys `layers` and `kind = attn | mlp`: `bf16@layers=0+last;fp8`.

use super::kv_cache::{CacheFormat, KvFormat};
use candle_core::Result;
use mxattn::attention::presets::preset;
use mxattn::attention::{Algorithm, AttentionConfig};
use mxattn::schedule::{format_ranges, Grammar, KeyKind, SiteKey};
use mxattn_fp8::LinearFormat;
use std::fmt;

/// What one layer runs.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpec {
    /// The config handed to [`mxattn::attention::attention`] (`causal` is set by the model).
    pub attn: AttentionConfig,
    /// How the layer's KV cache stores K and V.
    pub kv: KvFormat,
    /// The model rotates q and k by the normalized Hadamard matrix before caching, and
    /// `attn` has the op's own rotation turned off. Scores are unchanged (the rotation is
    /// orthogonal), and the cache then holds keys in the domain the op quantizes them in.
    pub rotate_qk: bool,
}

impl LayerSpec {
    /// The spec for `cfg` with the cache derived from its formats: MX Q/K → MX K cache
    /// (same element, scale rule and block), MX V → MX V cache, bf16 → bf16, anything else
    /// (native, per-channel FP8 V, whose scale spans all keys) → the model dtype. A
    /// Fused-Softmax config with the Hadamard rotation gets the rotation moved into the
    /// model (see [`LayerSpec::rotate_qk`]).
    pub fn from_config(cfg: AttentionConfig) -> Self {
        let mut attn = cfg;
        let mut rotate_qk = false;
        if let Algorithm::FusedSoftmax(f) = &mut attn.algorithm {
            if f.hadamard {
                f.hadamard = false;
                rotate_qk = true;
            }
        }
        let kv = KvFormat {
            k: CacheFormat::for_operand(attn.qk_format),
            v: CacheFormat::for_operand(attn.v_format),
        };
        Self {
            attn,
            kv,
            rotate_qk,
        }
    }

    /// `cfg` with an explicit cache format.
    pub fn with_kv(cfg: AttentionConfig, kv: KvFormat) -> Self {
        Self {
            kv,
            ..Self::from_config(cfg)
        }
    }

    /// A one-line description, e.g. `exp-then-quantize qk=… v=… p=…; K MXFP4-E2M1, V …`.
    pub fn label(&self) -> String {
        format!(
            "{}{}; cache {}",
            self.attn.label(),
            if self.rotate_qk {
                " (Hadamard in the model)"
            } else {
                ""
            },
            self.kv
        )
    }
}

/// The site keys of a decoder's attention calls.
pub const KEYS: &[SiteKey] = &[SiteKey {
    name: "layers",
    kind: KeyKind::Index,
    help: "decoder layer, 0-based",
}];

/// Named whole-model schedules: (name, definition, description). `hybrid` means the same
/// for every model: the wider MXFP6 where an error propagates furthest (here the first and
/// last layers), MXFP4 elsewhere.
pub const SCHEDULE_PRESETS: &[(&str, &str, &str)] = &[
    (
        "hybrid",
        "mxfp6@layers=0-3+last;mxfp4",
        "MXFP6 on the first four and the last layer, MXFP4 elsewhere",
    ),
    (
        "hybrid-fused",
        "fused-mxfp6@layers=0-3+last;fused-mxfp4",
        "hybrid with the Fused-Softmax kernels",
    ),
];

/// What Qwen3 schedules may say.
pub const GRAMMAR: Grammar = Grammar {
    model: "Qwen3",
    keys: KEYS,
    presets: SCHEDULE_PRESETS,
    kv_cache: true,
};

/// The layer spec an attention preset name ([`mxattn::attention::presets`]) stands for:
/// its config, and its KV cache derived from the formats (or the `kv-*` storage).
pub fn layer_preset(name: &str) -> Result<LayerSpec> {
    Ok(layer_spec(preset(name)?))
}

fn layer_spec(p: mxattn::attention::Preset) -> LayerSpec {
    match p.kv_storage {
        Some(f) => {
            let c = CacheFormat::for_operand(f);
            LayerSpec::with_kv(p.config, KvFormat { k: c, v: c })
        }
        None => LayerSpec::from_config(p.config),
    }
}

/// A parsed schedule, not yet tied to a layer count.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleSpec(mxattn::schedule::Schedule);

impl ScheduleSpec {
    /// Parses a schedule ([`mxattn::schedule`] grammar, key `layers`) or a preset
    /// ([`SCHEDULE_PRESETS`], or an attention preset name alone).
    pub fn parse(text: &str) -> Result<Self> {
        mxattn::schedule::Schedule::parse(text, &GRAMMAR).map(Self)
    }

    /// One config for every layer.
    pub fn uniform(name: &str) -> Result<Self> {
        mxattn::schedule::Schedule::uniform(name, &GRAMMAR).map(Self)
    }

    /// The text it was parsed from (or the preset's name).
    pub fn text(&self) -> &str {
        self.0.text()
    }

    /// Assigns a spec to each of `n_layers` layers.
    pub fn resolve(&self, n_layers: usize) -> Result<Schedule> {
        let r = self.0.resolve(&[("layers", n_layers)])?;
        let layers = (0..n_layers)
            .map(|l| {
                let rule = r.rule_for(&[Some(l)]);
                (rule.name.clone(), layer_spec(rule.preset.clone()))
            })
            .collect();
        Ok(Schedule { layers })
    }
}

/// A spec for every layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    layers: Vec<(String, LayerSpec)>,
}

impl Schedule {
    /// Every layer the same spec.
    pub fn uniform(spec: LayerSpec, n_layers: usize, name: &str) -> Self {
        Self {
            layers: vec![(name.to_string(), spec); n_layers],
        }
    }

    /// Explicit per-layer specs (for library users building their own).
    pub fn from_layers(layers: Vec<(String, LayerSpec)>) -> Self {
        Self { layers }
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    pub fn layer(&self, i: usize) -> &LayerSpec {
        &self.layers[i].1
    }

    /// The preset name of layer `i`.
    pub fn layer_name(&self, i: usize) -> &str {
        &self.layers[i].0
    }

    /// Layers grouped by name, e.g. `mxfp6: 0-3,35; mxfp4: 4-34`.
    pub fn summary(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for (n, _) in &self.layers {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
        names
            .iter()
            .map(|n| {
                let idx: Vec<usize> = self
                    .layers
                    .iter()
                    .enumerate()
                    .filter(|(_, (m, _))| m == n)
                    .map(|(i, _)| i)
                    .collect();
                format!("{n}: {}", format_ranges(&idx))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}

/// The `--help` text of the schedule grammar and presets.
pub fn schedule_help() -> String {
    GRAMMAR.help()
}

/// The site keys of a decoder's linear layers (`--linear`): the layer and the kind of
/// projection. The embeddings and the output head stay in the model dtype (as the official
/// FP8 checkpoints ship them).
pub const LINEAR_KEYS: &[SiteKey] = &[
    SiteKey {
        name: "layers",
        kind: KeyKind::Index,
        help: "decoder layer, 0-based",
    },
    SiteKey {
        name: "kind",
        kind: KeyKind::Named(&[("attn", 0), ("mlp", 1)]),
        help: "the attention's q/k/v/o projections, or the MLP's gate/up/down",
    },
];

/// What a decoder's linear schedules may say.
pub const LINEAR_GRAMMAR: Grammar = Grammar {
    model: "Decoder",
    keys: LINEAR_KEYS,
    presets: &[],
    kv_cache: false,
};

/// The `--help` text of linear schedules.
pub fn linear_help() -> String {
    LINEAR_GRAMMAR.help_for::<LinearFormat>()
}

/// Which projections of a decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearKind {
    Attn,
    Mlp,
}

/// A parsed linear schedule (`bf16`, `fp8`, `bf16@layers=0+last;fp8`).
#[derive(Clone, Debug, PartialEq)]
pub struct LinearSpec(mxattn::schedule::Schedule<LinearFormat>);

impl LinearSpec {
    pub fn parse(text: &str) -> Result<Self> {
        mxattn::schedule::Schedule::parse(text, &LINEAR_GRAMMAR).map(Self)
    }

    /// Every projection as loaded.
    pub fn dense() -> Self {
        Self::parse("bf16").expect("bf16 is a linear format")
    }

    pub fn text(&self) -> &str {
        self.0.text()
    }

    /// The format of each layer's (attention, MLP) projections, for `n_layers` layers.
    pub fn resolve(&self, n_layers: usize) -> Result<Vec<[LinearFormat; 2]>> {
        let r = self.0.resolve(&[("layers", n_layers)])?;
        Ok((0..n_layers)
            .map(|l| [0, 1].map(|k| r.rule_for(&[Some(l), Some(k)]).preset))
            .collect())
    }
}
