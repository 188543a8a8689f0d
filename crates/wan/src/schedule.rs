//! Wan attention schedules: which attention preset each call runs, by expert, denoising
//! step, block and kind (self-, cross- or VAE mid-attention).
//!
//! Schedules are written in the one grammar of [`mxattn::schedule`] with Wan's site keys:
//!
//! ```text
//! expert = high | low | 0 | 1     the A14B expert (TI2V-5B's single transformer is high, 0)
//! steps  = index                  denoising step, 0-based
//! layers = index                  transformer block, 0-based
//! kind   = self | cross | vae     self-attention, cross-attention to the text, VAE mid-block
//! ```
//!
//! The VAE's mid-attention has no expert, step or block: only rules without those filters
//! reach it. The `kv-*` presets do not apply (Wan has no KV cache). The [`HYBRID`] preset:
//!
//! ```text
//! exact@kind=vae+cross; mxfp6@layers=0-1+last2; mxfp6@steps=0-2+last3; mxfp4
//! ```
//!
//! i.e. MXFP6 self-attention where errors matter most (the first and last two blocks of each
//! expert, the first high-noise steps that lay out the scene and the last low-noise steps that
//! settle detail), MXFP4 self-attention elsewhere, and the cross-attention to the text and the
//! VAE exact. Cross-attention has 512 keys against the 75 600 of self-attention at 720p
//! (under 1 % of the attention work): quantizing it saves nothing, and on the H200 its
//! operand preparation made it 2.2× slower than BF16 (`evals/results/wan_profile.md`).
//!
//! Linear schedules (`--linear`) use the same grammar for the blocks' projections, with the
//! keys `expert`, `layers` and `kind = self | cross | ffn` and the names `bf16` (as loaded),
//! `fp8` (per-channel weight scales), `fp8-tensor`, `fp8-block`: e.g.
//! `bf16@layers=0+last;fp8`.

use super::{AttnKind, AttnPolicy, AttnSite};
use crate::transformer::LinearKind;
use candle_core::{bail, Result};
use mxattn::attention::AttentionConfig;
use mxattn::schedule::{Grammar, KeyKind, Resolved, ResolvedRule, SiteKey};
use mxattn_fp8::LinearFormat;
use std::fmt;

/// The `hybrid` preset (see the module docs).
pub const HYBRID: &str = "exact@kind=vae+cross;mxfp6@layers=0-1+last2;mxfp6@steps=0-2+last3;mxfp4";

/// `hybrid` with the Fused-Softmax kernels.
pub const HYBRID_FUSED: &str =
    "exact@kind=vae+cross;fused-mxfp6@layers=0-1+last2;fused-mxfp6@steps=0-2+last3;fused-mxfp4";

/// Named schedules: (name, definition, description). `hybrid` means the same for every
/// model: the wider MXFP6 where an error propagates furthest (here the edge blocks and the
/// edge steps), MXFP4 elsewhere, non-self attention exact.
pub const SCHEDULE_PRESETS: &[(&str, &str, &str)] = &[
    (
        "hybrid",
        HYBRID,
        "MXFP6 self-attention on the first/last two blocks and the first 3/last 3 steps, MXFP4 elsewhere; cross and VAE exact",
    ),
    (
        "hybrid-fused",
        HYBRID_FUSED,
        "hybrid with the Fused-Softmax kernels",
    ),
];

/// Wan's site keys, in the order [`site_values`] gives them.
pub const KEYS: &[SiteKey] = &[
    SiteKey {
        name: "expert",
        kind: KeyKind::Named(&[("high", 0), ("low", 1), ("0", 0), ("1", 1)]),
        help: "the A14B expert (high noise first; TI2V-5B has only high)",
    },
    SiteKey {
        name: "steps",
        kind: KeyKind::Index,
        help: "denoising step, 0-based",
    },
    SiteKey {
        name: "layers",
        kind: KeyKind::Index,
        help: "transformer block, 0-based",
    },
    SiteKey {
        name: "kind",
        kind: KeyKind::Named(&[("self", 0), ("cross", 1), ("vae", 2)]),
        help: "self-attention, cross-attention to the text, or the VAE mid-block",
    },
];

/// What Wan schedules may say.
pub const GRAMMAR: Grammar = Grammar {
    model: "Wan",
    keys: KEYS,
    presets: SCHEDULE_PRESETS,
    kv_cache: false,
};

/// The `--help` text of the grammar, Wan's keys, the presets.
pub fn help() -> String {
    GRAMMAR.help()
}

/// The attention config a preset name stands for, as Wan runs it; the `kv-*` cache-only
/// presets are refused (Wan has no KV cache).
pub fn attention_config(name: &str) -> Result<AttentionConfig> {
    let p = mxattn::attention::preset(name)?;
    if p.kv_storage.is_some() {
        bail!("attention config {name:?} only quantizes a KV cache, which Wan does not have");
    }
    Ok(p.config)
}

/// A site's key values in [`KEYS`] order; the VAE's mid-attention has only its kind.
pub fn site_values(site: &AttnSite) -> [Option<usize>; 4] {
    let kind = match site.kind {
        AttnKind::SelfAttn => 0,
        AttnKind::CrossAttn => 1,
        AttnKind::VaeMid => 2,
    };
    if site.kind == AttnKind::VaeMid {
        [None, None, None, Some(kind)]
    } else {
        [
            Some(site.expert),
            Some(site.step),
            Some(site.layer),
            Some(kind),
        ]
    }
}

/// A parsed schedule, not yet tied to a step count and depth.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleSpec(mxattn::schedule::Schedule);

impl ScheduleSpec {
    /// Parses a schedule or a preset name.
    pub fn parse(text: &str) -> Result<Self> {
        mxattn::schedule::Schedule::parse(text, &GRAMMAR).map(Self)
    }

    /// Like [`ScheduleSpec::parse`], with `default` (a preset name) appended as the
    /// catch-all when the last rule has filters.
    pub fn parse_with_default(text: &str, default: &str) -> Result<Self> {
        mxattn::schedule::Schedule::parse_with_default(text, default, &GRAMMAR).map(Self)
    }

    /// One config for every call.
    pub fn uniform(name: &str) -> Result<Self> {
        mxattn::schedule::Schedule::uniform(name, &GRAMMAR).map(Self)
    }

    /// The text it was parsed from (or the preset's name).
    pub fn text(&self) -> &str {
        self.0.text()
    }

    /// Ties the schedule to a run of `num_steps` denoising steps through `num_layers` blocks
    /// per expert.
    pub fn resolve(&self, num_steps: usize, num_layers: usize) -> Result<WanSchedule> {
        Ok(WanSchedule {
            resolved: self
                .0
                .resolve(&[("steps", num_steps), ("layers", num_layers)])?,
            num_steps,
            num_layers,
        })
    }
}

/// A schedule tied to a run; the [`AttnPolicy`] of the pipeline.
#[derive(Clone, Debug, PartialEq)]
pub struct WanSchedule {
    resolved: Resolved,
    num_steps: usize,
    num_layers: usize,
}

impl WanSchedule {
    fn rule_of(&self, site: &AttnSite) -> &ResolvedRule {
        self.resolved.rule_for(&site_values(site))
    }

    /// The config name `site` runs.
    pub fn name_of(&self, site: &AttnSite) -> &str {
        &self.rule_of(site).name
    }

    /// The schedule text (or preset name).
    pub fn text(&self) -> &str {
        self.resolved.text()
    }

    /// Calls per config name over the run: self- and cross-attention of every step and
    /// block, steps before `switch_step` on the high-noise expert and the rest on the
    /// low-noise one ([`super::scheduler::expert_switch_step`]; the step count for a single
    /// transformer), plus one VAE call. E.g. `mxfp6: 1400, mxfp4: 1799, exact: 1`.
    pub fn summary(&self, switch_step: usize) -> String {
        let mut counts: Vec<(String, usize)> = Vec::new();
        let mut add = |n: &str| match counts.iter_mut().find(|(m, _)| m == n) {
            Some((_, c)) => *c += 1,
            None => counts.push((n.to_string(), 1)),
        };
        for step in 0..self.num_steps {
            let expert = usize::from(step >= switch_step);
            for layer in 0..self.num_layers {
                for kind in [AttnKind::SelfAttn, AttnKind::CrossAttn] {
                    add(self.name_of(&AttnSite {
                        expert,
                        step,
                        layer,
                        kind,
                    }));
                }
            }
        }
        add(self.name_of(&super::vae::VAE_MID_SITE));
        counts
            .iter()
            .map(|(n, c)| format!("{n}: {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl AttnPolicy for WanSchedule {
    fn config(&self, site: &AttnSite) -> AttentionConfig {
        self.rule_of(site).preset.config.clone()
    }
}

impl fmt::Display for WanSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

/// The site keys of Wan's linear layers: the transformer blocks' projections (the embedders
/// and the output head stay in the model dtype: a few small matrices, where the timestep
/// and text conditioning enter).
pub const LINEAR_KEYS: &[SiteKey] = &[
    KEYS[0], // expert
    KEYS[2], // layers
    SiteKey {
        name: "kind",
        kind: KeyKind::Named(&[("self", 0), ("cross", 1), ("ffn", 2)]),
        help: "self-attention's q/k/v/out projections, cross-attention's, or the FFN's",
    },
];

/// What Wan's linear schedules may say (`--linear`); they are applied at load, so they have
/// no step key.
pub const LINEAR_GRAMMAR: Grammar = Grammar {
    model: "Wan",
    keys: LINEAR_KEYS,
    presets: &[],
    kv_cache: false,
};

/// The `--help` text of linear schedules.
pub fn linear_help() -> String {
    LINEAR_GRAMMAR.help_for::<LinearFormat>()
}

/// A parsed linear schedule (`fp8`, `bf16`, `bf16@layers=0+last;fp8`).
#[derive(Clone, Debug, PartialEq)]
pub struct LinearSpec(mxattn::schedule::Schedule<LinearFormat>);

impl LinearSpec {
    pub fn parse(text: &str) -> Result<Self> {
        mxattn::schedule::Schedule::parse(text, &LINEAR_GRAMMAR).map(Self)
    }

    /// Every projection dense, as loaded.
    pub fn dense() -> Self {
        Self::parse("bf16").expect("bf16 is a linear format")
    }

    pub fn text(&self) -> &str {
        self.0.text()
    }

    /// Ties it to transformers of `num_layers` blocks.
    pub fn resolve(&self, num_layers: usize) -> Result<WanLinears> {
        Ok(WanLinears {
            resolved: self.0.resolve(&[("layers", num_layers)])?,
        })
    }
}

/// A linear schedule tied to a depth.
#[derive(Clone, Debug, PartialEq)]
pub struct WanLinears {
    resolved: Resolved<LinearFormat>,
}

impl WanLinears {
    /// The format of `kind`'s projections in block `layer` of `expert`.
    pub fn format(&self, expert: usize, layer: usize, kind: LinearKind) -> LinearFormat {
        let k = match kind {
            LinearKind::SelfAttn => 0,
            LinearKind::CrossAttn => 1,
            LinearKind::Ffn => 2,
        };
        self.resolved
            .rule_for(&[Some(expert), Some(layer), Some(k)])
            .preset
    }

    pub fn text(&self) -> &str {
        self.resolved.text()
    }
}
