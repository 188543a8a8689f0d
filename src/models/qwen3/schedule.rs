//! Per-layer attention schedules: which [`AttentionConfig`] and KV-cache format each
//! decoder layer uses.
//!
//! Grammar (whitespace is ignored, names are case-insensitive):
//!
//! ```text
//! schedule := entry (';' entry)*  |  SCHEDULE-PRESET
//! entry    := NAME ':' layers  |  NAME            (a bare NAME means NAME:*)
//! layers   := item (',' item)*
//! item     := N | N '-' M | 'last' | '*'          ('*' = every layer no other entry names)
//! ```
//!
//! Layers are 0-based. A layer named by two entries, a layer out of range, a second `*`,
//! or a layer that no entry covers is an error (the presets alone clamp their ranges to
//! the model's depth). For example `mxfp6:0-3,last;mxfp4:*` runs
//! the first four and the last layer in MXFP6 and the others in MXFP4; that is the
//! `hybrid` preset.

use super::kv_cache::{CacheFormat, KvFormat};
use crate::attention::{
    Algorithm, AttentionConfig, EfqConfig, EfqRule, FusedProbs, FusedSoftmaxConfig, OperandFormat,
    ProbFormat,
};
use crate::mx::ElemFormat;
use candle_core::{bail, Result};
use std::fmt;

/// What one layer runs.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpec {
    /// The config handed to [`crate::attention::attention`] (`causal` is set by the model).
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
        let cache_of = |f: OperandFormat| match f {
            OperandFormat::Mx { elem, scale, block } => CacheFormat::Mx { elem, scale, block },
            OperandFormat::Bf16 => CacheFormat::Bf16,
            OperandFormat::Native | OperandFormat::PerChannel { .. } => CacheFormat::Model,
        };
        let kv = KvFormat {
            k: cache_of(attn.qk_format),
            v: cache_of(attn.v_format),
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

/// Named layer configs, for `--attn` and schedule entries: (name, description).
pub const LAYER_PRESETS: &[(&str, &str)] = &[
    (
        "exact",
        "exact softmax on the operands as computed; cache in the model dtype",
    ),
    (
        "bf16",
        "exact softmax on bf16 Q/K/V; bf16 cache (the BF16 baseline)",
    ),
    (
        "mxfp8",
        "exp-then-quantize: MXFP8 E4M3 Q/K (along d), V (along keys) and P; MXFP8 cache",
    ),
    (
        "mxfp6",
        "exp-then-quantize: MXFP6 E2M3 Q/K, V and P; MXFP6 cache",
    ),
    (
        "mxfp4",
        "exp-then-quantize: MXFP4 E2M1 Q/K, V and P; MXFP4 cache",
    ),
    ("fused", "= fused-mxfp8"),
    (
        "fused-mxfp8",
        "Fused-Softmax (fp32-bits P), AMD MXFP8 Q/K rule, MXFP8 V; Hadamard",
    ),
    (
        "fused-mxfp6",
        "Fused-Softmax (u8-code P), MXFP6 E2M3 Q/K and V; Hadamard",
    ),
    (
        "fused-mxfp4",
        "Fused-Softmax (u8-code P), MXFP4 Q/K (rceil) and V; Hadamard",
    ),
    ("efq", "= efq-mmlu"),
    (
        "efq-mmlu",
        "EFQ-Softmax, MMLU point (tau -2.90, h 2.00); MXFP4 Q/K and V",
    ),
    (
        "efq-mean",
        "EFQ-Softmax, Mean point (tau -3.06, h 2.30); MXFP4 Q/K and V",
    ),
    (
        "efq-exact",
        "EFQ exact thresholds (= exp -> MXFP4 P, no exp); MXFP4 Q/K and V",
    ),
    (
        "kv-mxfp8",
        "exact softmax, unquantized Q; K/V cached in MXFP8 E4M3",
    ),
    (
        "kv-mxfp6",
        "exact softmax, unquantized Q; K/V cached in MXFP6 E2M3",
    ),
    (
        "kv-mxfp4",
        "exact softmax, unquantized Q; K/V cached in MXFP4 E2M1",
    ),
];

/// Named whole-model schedules: (name, definition).
pub const SCHEDULE_PRESETS: &[(&str, &str)] = &[
    ("hybrid", "mxfp6:0-3,last;mxfp4:*"),
    ("hybrid-fused", "fused-mxfp6:0-3,last;fused-mxfp4:*"),
];

/// The layer config a preset name stands for.
pub fn layer_preset(name: &str) -> Result<LayerSpec> {
    use ElemFormat::*;
    let mx = OperandFormat::mx;
    let n = name.trim().to_ascii_lowercase();
    let conventional = |e: ElemFormat| {
        LayerSpec::from_config(AttentionConfig::exp_then_quantize(
            mx(e),
            mx(e),
            ProbFormat::mx(e),
        ))
    };
    let fused = |e: ElemFormat| {
        let probs = if e == E4M3 {
            FusedProbs::Fp32Bits
        } else {
            FusedProbs::U8Code
        };
        LayerSpec::from_config(AttentionConfig::fused_softmax(
            e,
            mx(e),
            FusedSoftmaxConfig {
                probs,
                hadamard: true,
            },
        ))
    };
    let efq = |r: EfqRule| {
        LayerSpec::from_config(AttentionConfig::efq(EfqConfig::new(r), mx(E2M1), mx(E2M1)))
    };
    let kv_only = |e: ElemFormat| {
        let c = CacheFormat::Mx {
            elem: e,
            scale: crate::mx::ScaleMode::Floor,
            block: crate::mx::DEFAULT_BLOCK,
        };
        LayerSpec::with_kv(AttentionConfig::exact(), KvFormat { k: c, v: c })
    };
    Ok(match n.as_str() {
        "exact" => LayerSpec::from_config(AttentionConfig::exact()),
        "bf16" => LayerSpec::from_config(AttentionConfig::exact().with_formats(
            OperandFormat::Bf16,
            OperandFormat::Bf16,
            ProbFormat::F32,
        )),
        "mxfp8" => conventional(E4M3),
        "mxfp6" => conventional(E2M3),
        "mxfp4" => conventional(E2M1),
        "fused" | "fused-mxfp8" => fused(E4M3),
        "fused-mxfp6" => fused(E2M3),
        "fused-mxfp4" => fused(E2M1),
        "efq" | "efq-mmlu" => efq(EfqRule::Mmlu),
        "efq-mean" => efq(EfqRule::Mean),
        "efq-exact" => efq(EfqRule::ExactThresholds),
        "kv-mxfp8" => kv_only(E4M3),
        "kv-mxfp6" => kv_only(E2M3),
        "kv-mxfp4" => kv_only(E2M1),
        _ => bail!(
            "unknown attention config {name:?}; known: {}",
            LAYER_PRESETS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    Layer(usize),
    Range(usize, usize),
    Last,
    Rest,
}

#[derive(Clone, Debug, PartialEq)]
struct Entry {
    name: String,
    spec: LayerSpec,
    items: Vec<Item>,
}

/// A parsed schedule, not yet tied to a layer count.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleSpec {
    text: String,
    entries: Vec<Entry>,
    /// Presets clamp ranges to the model's depth (so `hybrid` fits any size); a schedule
    /// the user writes does not.
    clamp: bool,
}

fn parse_index(s: &str, entry: &str) -> Result<usize> {
    s.parse::<usize>().map_err(|_| {
        candle_core::Error::Msg(format!(
            "schedule entry {entry:?}: {s:?} is not a layer index (expected N, N-M, last or *)"
        ))
    })
}

impl ScheduleSpec {
    /// Parses the grammar in the module docs, or a schedule preset (`hybrid`, …).
    pub fn parse(text: &str) -> Result<Self> {
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let lower = compact.to_ascii_lowercase();
        if let Some((_, def)) = SCHEDULE_PRESETS.iter().find(|(n, _)| *n == lower) {
            let mut s = Self::parse(def)?;
            s.text = lower;
            s.clamp = true;
            return Ok(s);
        }
        if compact.is_empty() {
            bail!("empty attention schedule; expected e.g. \"mxfp6:0-3,last;mxfp4:*\"");
        }
        let mut entries = Vec::new();
        let mut rest_seen = false;
        for raw in compact.split(';') {
            if raw.is_empty() {
                bail!(
                    "attention schedule {text:?}: empty entry (two ';' in a row or a trailing ';')"
                );
            }
            let (name, layers) = match raw.split_once(':') {
                Some((n, l)) => (n, l),
                None => (raw, "*"),
            };
            let spec = layer_preset(name)
                .map_err(|e| candle_core::Error::Msg(format!("schedule entry {raw:?}: {e}")))?;
            if layers.is_empty() {
                bail!("schedule entry {raw:?}: no layers after ':'");
            }
            let mut items = Vec::new();
            for it in layers.split(',') {
                let item = match it.to_ascii_lowercase().as_str() {
                    "" => bail!("schedule entry {raw:?}: empty layer item"),
                    "*" => {
                        if rest_seen {
                            bail!("attention schedule {text:?}: '*' appears more than once");
                        }
                        rest_seen = true;
                        Item::Rest
                    }
                    "last" => Item::Last,
                    s => match s.split_once('-') {
                        Some((a, b)) => {
                            let (a, b) = (parse_index(a, raw)?, parse_index(b, raw)?);
                            if a > b {
                                bail!("schedule entry {raw:?}: range {a}-{b} runs backwards");
                            }
                            Item::Range(a, b)
                        }
                        None => Item::Layer(parse_index(s, raw)?),
                    },
                };
                items.push(item);
            }
            entries.push(Entry {
                name: name.to_ascii_lowercase(),
                spec,
                items,
            });
        }
        Ok(Self {
            text: text.trim().to_string(),
            entries,
            clamp: false,
        })
    }

    /// One config for every layer.
    pub fn uniform(name: &str) -> Result<Self> {
        let spec = layer_preset(name)?;
        Ok(Self {
            text: name.to_ascii_lowercase(),
            entries: vec![Entry {
                name: name.to_ascii_lowercase(),
                spec,
                items: vec![Item::Rest],
            }],
            clamp: false,
        })
    }

    /// The text it was parsed from (or the preset's name).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Assigns a spec to each of `n_layers` layers.
    pub fn resolve(&self, n_layers: usize) -> Result<Schedule> {
        if n_layers == 0 {
            bail!("attention schedule: the model has no layers");
        }
        let mut owner: Vec<Option<usize>> = vec![None; n_layers];
        let mut rest = None;
        for (ei, e) in self.entries.iter().enumerate() {
            for it in &e.items {
                let (a, mut b) = match *it {
                    Item::Rest => {
                        rest = Some(ei);
                        continue;
                    }
                    Item::Last => (n_layers - 1, n_layers - 1),
                    Item::Layer(i) => (i, i),
                    Item::Range(a, b) => (a, b),
                };
                if self.clamp {
                    if a >= n_layers {
                        continue;
                    }
                    b = b.min(n_layers - 1);
                }
                if b >= n_layers {
                    bail!(
                        "attention schedule {:?}: layer {b} of entry {:?} is out of range (the model has {n_layers} layers, 0-{})",
                        self.text,
                        e.name,
                        n_layers - 1
                    );
                }
                for (l, o) in owner.iter_mut().enumerate().take(b + 1).skip(a) {
                    if let Some(prev) = o.filter(|&p| p != ei) {
                        bail!(
                            "attention schedule {:?}: layer {l} is assigned twice ({:?} and {:?})",
                            self.text,
                            self.entries[prev].name,
                            e.name
                        );
                    }
                    *o = Some(ei);
                }
            }
        }
        let mut layers = Vec::with_capacity(n_layers);
        let mut missing = Vec::new();
        for (l, o) in owner.iter().enumerate() {
            match o.or(rest) {
                Some(ei) => {
                    layers.push((self.entries[ei].name.clone(), self.entries[ei].spec.clone()))
                }
                None => missing.push(l),
            }
        }
        if !missing.is_empty() {
            bail!(
                "attention schedule {:?}: layers {} have no entry; add e.g. \"exact:*\"",
                self.text,
                ranges(&missing)
            );
        }
        Ok(Schedule { layers })
    }
}

/// `[0,1,2,3,35]` → `0-3,35`.
fn ranges(v: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    out.join(",")
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
                format!("{n}: {}", ranges(&idx))
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
    let mut s = String::from(
        "Schedule grammar: ENTRY(;ENTRY)*, ENTRY = NAME:LAYERS or NAME (= NAME:*), LAYERS = comma list of \
         N, N-M, last, * (* = every layer no other entry names; 0-based). Example: mxfp6:0-3,last;mxfp4:*\n\
         Layer configs:\n",
    );
    for (n, d) in LAYER_PRESETS {
        s.push_str(&format!("  {n:<12} {d}\n"));
    }
    s.push_str("Schedule presets:\n");
    for (n, d) in SCHEDULE_PRESETS {
        s.push_str(&format!("  {n:<12} {d}\n"));
    }
    s
}
