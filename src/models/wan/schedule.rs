//! Wan attention schedules: which [`AttentionConfig`] each attention call runs, by expert,
//! denoising step, block and kind (self-, cross- or VAE mid-attention).
//!
//! Grammar (whitespace is ignored, names are case-insensitive):
//!
//! ```text
//! schedule := rule (';' rule)*  |  PRESET
//! rule     := NAME [ '@' filter (',' filter)* ]
//! filter   := 'expert=' E ('+' E)*       E = high | low | 0 | 1
//!           | 'steps='  item ('+' item)*  denoising steps, 0-based
//!           | 'layers=' item ('+' item)*  transformer blocks, 0-based
//!           | 'kind='   K ('+' K)*       K = self | cross | vae
//! item     := N | A '-' B | A '-' | 'last' | 'last' K
//! ```
//!
//! `NAME` is an attention config of [`crate::models::qwen3::schedule::LAYER_PRESETS`]
//! (`exact`, `bf16`, `mxfp6`, `fused-mxfp4`, `efq`, …; the `kv-*` cache-only configs do not
//! apply, Wan has no KV cache). Ranges are inclusive; `A-` runs to the end, `lastK` is the
//! last K steps or blocks. A call runs the config of the **first** rule whose filters all
//! match; a rule without filters matches everything, so the last rule must be one (a
//! catch-all) unless a default is given ([`ScheduleSpec::parse_with_default`]), and no rule may
//! follow it. The VAE's mid-attention has no expert, step or block: only rules without those
//! filters reach it. TI2V-5B's single transformer is expert `high` (0).
//!
//! A bare `NAME` runs one config everywhere (`--attn mxfp4`). The [`HYBRID`] preset:
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
//! Step and block indices out of range are errors when the schedule is resolved for a run
//! ([`ScheduleSpec::resolve`]); the presets clamp theirs, so they fit any step count and depth.

use super::{AttnKind, AttnPolicy, AttnSite};
use crate::attention::{Algorithm, AttentionConfig};
use crate::models::qwen3::schedule::{layer_preset, LAYER_PRESETS};
use candle_core::{bail, Result};
use std::fmt;

/// The `hybrid` preset (see the module docs).
pub const HYBRID: &str = "exact@kind=vae+cross;mxfp6@layers=0-1+last2;mxfp6@steps=0-2+last3;mxfp4";

/// `hybrid` with the Fused-Softmax kernels.
pub const HYBRID_FUSED: &str =
    "exact@kind=vae+cross;fused-mxfp6@layers=0-1+last2;fused-mxfp6@steps=0-2+last3;fused-mxfp4";

/// Named schedules: (name, definition).
pub const SCHEDULE_PRESETS: &[(&str, &str)] = &[("hybrid", HYBRID), ("hybrid-fused", HYBRID_FUSED)];

/// The `--help` text of the grammar (config names: [`help`]).
pub const HELP: &str = "Attention schedule: RULE(;RULE)* or a preset. RULE = NAME or \
NAME@FILTER(,FILTER)*; the first rule whose filters all match a call wins, and the last rule \
must have no filter (a catch-all). FILTER = expert=high|low|0|1, steps=ITEMS, layers=ITEMS \
(0-based denoising steps / transformer blocks), kind=self|cross|vae; several values join with \
'+'. ITEM = N, A-B, A- (to the end), last, lastK (the last K). The VAE mid-attention is only \
reached by rules without expert/steps/layers filters. Example: \
exact@kind=vae;mxfp6@kind=cross;mxfp6@layers=0-1+last2;mxfp6@steps=0-2+last3;mxfp4 \
(= the hybrid preset).";

/// [`HELP`] plus the config names and the presets.
pub fn help() -> String {
    let mut s = format!("{HELP}\nAttention configs:\n");
    for (n, d) in LAYER_PRESETS.iter().filter(|(n, _)| !n.starts_with("kv-")) {
        s.push_str(&format!("  {n:<12} {d}\n"));
    }
    s.push_str("Schedule presets:\n");
    for (n, d) in SCHEDULE_PRESETS {
        s.push_str(&format!("  {n:<12} {d}\n"));
    }
    s
}

/// The attention config a name of [`LAYER_PRESETS`] stands for, as Wan runs it: the
/// Fused-Softmax configs keep their Hadamard rotation inside the op (Qwen3 moves it into
/// the model for its KV cache), and the `kv-*` cache-only configs are refused.
pub fn attention_config(name: &str) -> Result<AttentionConfig> {
    let n = name.trim().to_ascii_lowercase();
    if n.starts_with("kv-") {
        bail!("attention config {name:?} only quantizes a KV cache, which Wan does not have");
    }
    let spec = layer_preset(&n)?;
    let mut cfg = spec.attn;
    if spec.rotate_qk {
        if let Algorithm::FusedSoftmax(f) = &mut cfg.algorithm {
            f.hadamard = true;
        }
    }
    Ok(cfg)
}

/// One index item before the run's sizes are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    /// `A-B` (`A` alone: `A-A`; `A-`: `B` = None, to the end).
    Range(usize, Option<usize>),
    /// `lastK`.
    Last(usize),
}

#[derive(Clone, Debug, PartialEq)]
struct Rule {
    text: String,
    name: String,
    config: AttentionConfig,
    experts: Option<Vec<usize>>,
    steps: Option<Vec<Item>>,
    layers: Option<Vec<Item>>,
    kinds: Option<Vec<AttnKind>>,
}

impl Rule {
    fn is_catch_all(&self) -> bool {
        self.experts.is_none()
            && self.steps.is_none()
            && self.layers.is_none()
            && self.kinds.is_none()
    }
}

/// A parsed schedule, not yet tied to a step count and depth.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleSpec {
    text: String,
    rules: Vec<Rule>,
    /// Presets clamp their indices to the run; user schedules do not.
    clamp: bool,
}

fn parse_index(s: &str, ctx: &str) -> Result<usize> {
    s.parse::<usize>().map_err(|_| {
        candle_core::Error::Msg(format!(
            "{ctx}: {s:?} is not an index (expected N, A-B, A-, last or lastK)"
        ))
    })
}

fn parse_items(value: &str, ctx: &str) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    for it in value.split('+') {
        let item = if it.is_empty() {
            bail!("{ctx}: empty item");
        } else if let Some(k) = it.strip_prefix("last") {
            let k = if k.is_empty() {
                1
            } else {
                parse_index(k, ctx)?
            };
            if k == 0 {
                bail!("{ctx}: last0 is empty");
            }
            Item::Last(k)
        } else if let Some((a, b)) = it.split_once('-') {
            let a = parse_index(a, ctx)?;
            if b.is_empty() {
                Item::Range(a, None)
            } else {
                let b = parse_index(b, ctx)?;
                if a > b {
                    bail!("{ctx}: range {a}-{b} is empty (it runs backwards)");
                }
                Item::Range(a, Some(b))
            }
        } else {
            let a = parse_index(it, ctx)?;
            Item::Range(a, Some(a))
        };
        items.push(item);
    }
    Ok(items)
}

fn parse_rule(raw: &str) -> Result<Rule> {
    let (name, filters) = match raw.split_once('@') {
        Some((n, f)) => (n, Some(f)),
        None => (raw, None),
    };
    if name.is_empty() {
        bail!("schedule rule {raw:?}: no config name before '@'");
    }
    let config = attention_config(name)
        .map_err(|e| candle_core::Error::Msg(format!("schedule rule {raw:?}: {e}")))?;
    let mut rule = Rule {
        text: raw.to_string(),
        name: name.to_string(),
        config,
        experts: None,
        steps: None,
        layers: None,
        kinds: None,
    };
    let Some(filters) = filters else {
        return Ok(rule);
    };
    if filters.is_empty() {
        bail!("schedule rule {raw:?}: no filter after '@'");
    }
    for f in filters.split(',') {
        let ctx = format!("schedule rule {raw:?}, filter {f:?}");
        let Some((key, value)) = f.split_once('=') else {
            bail!("{ctx}: expected KEY=VALUE with KEY one of expert, steps, layers, kind");
        };
        if value.is_empty() {
            bail!("{ctx}: no value after '='");
        }
        let dup = match key {
            "expert" => {
                let mut v = Vec::new();
                for e in value.split('+') {
                    v.push(match e {
                        "high" | "0" => 0,
                        "low" | "1" => 1,
                        _ => bail!("{ctx}: expert {e:?} is not one of high, low, 0, 1"),
                    });
                }
                rule.experts.replace(v).is_some()
            }
            "steps" => rule.steps.replace(parse_items(value, &ctx)?).is_some(),
            "layers" => rule.layers.replace(parse_items(value, &ctx)?).is_some(),
            "kind" => {
                let mut v = Vec::new();
                for k in value.split('+') {
                    v.push(match k {
                        "self" => AttnKind::SelfAttn,
                        "cross" => AttnKind::CrossAttn,
                        "vae" => AttnKind::VaeMid,
                        _ => bail!("{ctx}: kind {k:?} is not one of self, cross, vae"),
                    });
                }
                rule.kinds.replace(v).is_some()
            }
            _ => bail!("{ctx}: unknown key {key:?}; known: expert, steps, layers, kind"),
        };
        if dup {
            bail!("schedule rule {raw:?}: filter {key:?} given twice");
        }
    }
    let transformer_only = rule.experts.is_some() || rule.steps.is_some() || rule.layers.is_some();
    if transformer_only
        && rule
            .kinds
            .as_ref()
            .is_some_and(|k| k == &[AttnKind::VaeMid])
    {
        bail!("schedule rule {raw:?}: kind=vae cannot take expert, steps or layers filters (the VAE has none)");
    }
    Ok(rule)
}

impl ScheduleSpec {
    /// Parses the grammar in the module docs, or a preset name.
    pub fn parse(text: &str) -> Result<Self> {
        Self::parse_inner(text, None)
    }

    /// Like [`ScheduleSpec::parse`], with `default` (a config name) appended as the
    /// catch-all when the last rule has filters.
    pub fn parse_with_default(text: &str, default: &str) -> Result<Self> {
        Self::parse_inner(text, Some(default))
    }

    fn parse_inner(text: &str, default: Option<&str>) -> Result<Self> {
        let compact: String = text
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_lowercase();
        if let Some((name, def)) = SCHEDULE_PRESETS.iter().find(|(n, _)| *n == compact) {
            let mut s = Self::parse_inner(def, None)?;
            s.text = name.to_string();
            s.clamp = true;
            return Ok(s);
        }
        if compact.is_empty() {
            bail!("empty attention schedule; expected a config name (e.g. mxfp4), a preset (hybrid) or rules like \"mxfp6@kind=cross;mxfp4\"");
        }
        let mut rules = Vec::new();
        for raw in compact.split(';') {
            if raw.is_empty() {
                bail!(
                    "attention schedule {text:?}: empty rule (two ';' in a row or a trailing ';')"
                );
            }
            if let Some(prev) = rules.iter().find(|r: &&Rule| r.is_catch_all()) {
                bail!(
                    "attention schedule {text:?}: rule {raw:?} is never reached: {:?} before it matches every call",
                    prev.text
                );
            }
            rules.push(parse_rule(raw)?);
        }
        if !rules.last().is_some_and(Rule::is_catch_all) {
            match default {
                Some(d) => rules.push(parse_rule(&d.trim().to_ascii_lowercase())?),
                None => bail!(
                    "attention schedule {text:?}: the last rule has filters, so some calls match no rule; end with a catch-all such as \";exact\""
                ),
            }
        }
        Ok(Self {
            text: text.trim().to_string(),
            rules,
            clamp: false,
        })
    }

    /// One config for every call.
    pub fn uniform(name: &str) -> Result<Self> {
        let rule = parse_rule(&name.trim().to_ascii_lowercase())?;
        Ok(Self {
            text: name.trim().to_string(),
            rules: vec![rule],
            clamp: false,
        })
    }

    /// The text it was parsed from (or the preset's name).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Ties the schedule to a run of `num_steps` denoising steps through `num_layers` blocks
    /// per expert.
    pub fn resolve(&self, num_steps: usize, num_layers: usize) -> Result<WanSchedule> {
        if num_steps == 0 || num_layers == 0 {
            bail!("attention schedule: the run needs at least one step and one block (got {num_steps} steps, {num_layers} blocks)");
        }
        let resolve_items = |items: &Option<Vec<Item>>, count: usize, what: &str, rule: &Rule| {
            let Some(items) = items else {
                return Ok(None);
            };
            let mut out = Vec::new();
            for it in items {
                let (a, b) = match *it {
                    Item::Last(k) => (count.saturating_sub(k), count - 1),
                    Item::Range(a, b) => (a, b.unwrap_or(count - 1).max(a)),
                };
                if b >= count {
                    if self.clamp {
                        if a < count {
                            out.push((a, count - 1));
                        }
                        continue;
                    }
                    bail!(
                        "attention schedule {:?}: rule {:?} names {what} {b}, but the run has {count} {what} (0-{})",
                        self.text,
                        rule.text,
                        count - 1
                    );
                }
                out.push((a, b));
            }
            Ok(Some(out))
        };
        let mut rules = Vec::with_capacity(self.rules.len());
        for r in &self.rules {
            rules.push(Resolved {
                name: r.name.clone(),
                config: r.config.clone(),
                experts: r.experts.clone(),
                steps: resolve_items(&r.steps, num_steps, "steps", r)?,
                layers: resolve_items(&r.layers, num_layers, "layers", r)?,
                kinds: r.kinds.clone(),
            });
        }
        Ok(WanSchedule {
            text: self.text.clone(),
            num_steps,
            num_layers,
            rules,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Resolved {
    name: String,
    config: AttentionConfig,
    experts: Option<Vec<usize>>,
    steps: Option<Vec<(usize, usize)>>,
    layers: Option<Vec<(usize, usize)>>,
    kinds: Option<Vec<AttnKind>>,
}

fn in_ranges(r: &Option<Vec<(usize, usize)>>, i: usize) -> bool {
    r.as_ref()
        .is_none_or(|v| v.iter().any(|&(a, b)| a <= i && i <= b))
}

impl Resolved {
    fn matches(&self, site: &AttnSite) -> bool {
        if site.kind == AttnKind::VaeMid
            && (self.experts.is_some() || self.steps.is_some() || self.layers.is_some())
        {
            return false;
        }
        self.kinds.as_ref().is_none_or(|k| k.contains(&site.kind))
            && self
                .experts
                .as_ref()
                .is_none_or(|e| e.contains(&site.expert))
            && in_ranges(&self.steps, site.step)
            && in_ranges(&self.layers, site.layer)
    }
}

/// A schedule tied to a run; the [`AttnPolicy`] of the pipeline.
#[derive(Clone, Debug, PartialEq)]
pub struct WanSchedule {
    text: String,
    num_steps: usize,
    num_layers: usize,
    rules: Vec<Resolved>,
}

impl WanSchedule {
    /// The rule that decides `site` (the last rule catches everything).
    fn rule_of(&self, site: &AttnSite) -> &Resolved {
        self.rules
            .iter()
            .find(|r| r.matches(site))
            .unwrap_or_else(|| &self.rules[self.rules.len() - 1])
    }

    /// The config name `site` runs.
    pub fn name_of(&self, site: &AttnSite) -> &str {
        &self.rule_of(site).name
    }

    /// The schedule text (or preset name).
    pub fn text(&self) -> &str {
        &self.text
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
        self.rule_of(site).config.clone()
    }
}

impl fmt::Display for WanSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}
