//! Attention schedules: which attention preset ([`crate::attention::presets`]) each attention
//! call of a model runs. One grammar and one parser for every model; a model says which
//! **site keys** its calls have (a decoder: `layers`; Wan: `expert`, `steps`, `layers`,
//! `kind`) in a [`Grammar`], and names its own schedule presets in it.
//!
//! ```text
//! schedule := rule (';' rule)*  |  PRESET
//! rule     := NAME [ '@' filter (',' filter)* ]
//! filter   := KEY '=' value ('+' value)*
//! value    := N | A '-' B | A '-' | 'last' | 'last' K      (an index key, 0-based)
//!           | WORD                                      (a named key: kind=self, expert=high)
//! ```
//!
//! Whitespace is ignored and names are case-insensitive. `NAME` is an attention preset
//! (`exact`, `bf16`, `mxfp6`, `fused-mxfp4`, `efq`, …). Ranges are inclusive, `A-` runs to the
//! end, `lastK` is the last K. A call runs the preset of the **first** rule whose filters all
//! match it; a rule without filters matches every call, so the last rule must be one (a
//! catch-all; [`Schedule::parse_with_default`] appends one) and no rule may follow it. A call
//! that lacks a key (Wan's VAE has no step or block) is matched only by rules that do not
//! filter on that key. An index past the run's count is an error when the schedule is resolved
//! ([`Schedule::resolve`]), except in the presets, which clamp theirs so they fit any depth.
//!
//! For example, with a decoder's `layers` key, `mxfp6@layers=0-3+last;mxfp4` runs MXFP6 on the
//! first four and the last layer and MXFP4 elsewhere.
//!
//! The same grammar chooses other per-site options: a [`Choice`] is what a rule's NAME
//! stands for. Attention presets ([`Preset`]) are one; the linear layers' formats of the
//! models (`bf16`, `fp8`, in the FP8 crate) are another, with the models' linear call sites
//! as keys (`bf16@layers=0+last;fp8`).

use crate::attention::presets::{preset, presets_help, Preset};
use candle_core::{bail, Result};
use std::fmt;

/// What the rules of a schedule name: an attention preset, a linear layer format, ….
pub trait Choice: Clone + fmt::Debug + PartialEq {
    /// The thing chosen, in messages and help: "attention", "linear".
    const SUBJECT: &'static str;
    /// What one NAME is called: "attention preset", "linear format".
    const NOUN: &'static str;
    /// An example NAME for messages (`mxfp4`, `fp8`).
    const EXAMPLE: &'static str;
    /// Parses a rule's NAME (lower case, no whitespace); errors list the known names.
    fn parse_name(name: &str, g: &Grammar) -> Result<Self>;
    /// One line per known NAME, for `--help`.
    fn names_help(g: &Grammar) -> String;
}

impl Choice for Preset {
    const SUBJECT: &'static str = "attention";
    const NOUN: &'static str = "attention preset";
    const EXAMPLE: &'static str = "mxfp4";
    fn parse_name(name: &str, g: &Grammar) -> Result<Self> {
        let p = preset(name)?;
        if p.kv_storage.is_some() && !g.kv_cache {
            bail!(
                "{name:?} only quantizes a KV cache, which {} does not have",
                g.model
            );
        }
        Ok(p)
    }
    fn names_help(g: &Grammar) -> String {
        presets_help(g.kv_cache)
    }
}

/// `attention` → `Attention`.
fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map_or_else(String::new, |f| f.to_uppercase().chain(c).collect())
}

/// How a site key takes its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// Indices `0..count`, the count known when the schedule is resolved for a run.
    Index,
    /// Named values, each standing for an index (several names may share one).
    Named(&'static [(&'static str, usize)]),
}

/// One key of a model's call sites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteKey {
    /// As written in a filter: `layers`, `steps`, `expert`, `kind`.
    pub name: &'static str,
    pub kind: KeyKind,
    /// One line for `--help`.
    pub help: &'static str,
}

/// What one model's schedules may say.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grammar {
    /// The model, for messages: "Qwen3", "Wan".
    pub model: &'static str,
    /// Its site keys; a site gives one value per key, in this order.
    pub keys: &'static [SiteKey],
    /// Named schedules: (name, definition in this grammar, one-line description).
    pub presets: &'static [(&'static str, &'static str, &'static str)],
    /// Whether the `kv-*` presets (KV-cache storage only) apply: a model with a KV cache.
    pub kv_cache: bool,
}

impl Grammar {
    fn key(&self, name: &str) -> Option<usize> {
        self.keys.iter().position(|k| k.name == name)
    }

    fn key_names(&self) -> String {
        self.keys
            .iter()
            .map(|k| k.name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The `--help` text of an attention schedule: the grammar, this model's keys, the
    /// attention presets and the schedule presets.
    pub fn help(&self) -> String {
        self.help_for::<Preset>()
    }

    /// The `--help` text of a schedule of `C`.
    pub fn help_for<C: Choice>(&self) -> String {
        let subject = C::SUBJECT;
        let mut s = format!(
            "{} schedule: RULE(;RULE)*{}. RULE = NAME or \
             NAME@FILTER(,FILTER)*, NAME one of the {subject} names below. The first rule whose \
             filters all match a call wins; the last rule must have no filter (a catch-all). \
             FILTER = KEY=VALUE(+VALUE)*; an index VALUE is N, A-B, A- (to the end), last or \
             lastK (the last K), 0-based. A call without a key is matched only by rules that do \
             not filter on it.\n",
            capitalized(subject),
            if self.presets.is_empty() {
                ""
            } else {
                " or a schedule preset"
            }
        );
        s.push_str(&format!("{} keys:\n", self.model));
        for k in self.keys {
            let values = match k.kind {
                KeyKind::Index => "index".to_string(),
                KeyKind::Named(v) => v.iter().map(|(n, _)| *n).collect::<Vec<_>>().join("|"),
            };
            s.push_str(&format!("  {:<8} {values}: {}\n", k.name, k.help));
        }
        s.push_str(&format!("{} names:\n", capitalized(subject)));
        s.push_str(&C::names_help(self));
        if !self.presets.is_empty() {
            s.push_str("Schedule presets:\n");
        }
        for (n, def, what) in self.presets {
            s.push_str(&format!("  {n:<12} {what}\n  {:<12} = {def}\n", ""));
        }
        if let Some((n, def, _)) = self.presets.first() {
            s.push_str(&format!(
                "Example: {def}\n  (written out, the {n} preset)\n"
            ));
        }
        s
    }
}

/// One value of a filter before the run's counts are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    /// `A-B` (`A` alone: `A-A`; `A-`: to the end).
    Range(usize, Option<usize>),
    /// `lastK`.
    Last(usize),
}

#[derive(Clone, Debug, PartialEq)]
struct Rule<C> {
    text: String,
    name: String,
    preset: C,
    /// (key index, values), at most one filter per key.
    filters: Vec<(usize, Vec<Value>)>,
}

/// A parsed schedule, not yet tied to a run's counts.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule<C: Choice = Preset> {
    grammar: Grammar,
    text: String,
    rules: Vec<Rule<C>>,
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

fn parse_index_value(it: &str, ctx: &str) -> Result<Value> {
    Ok(if let Some(k) = it.strip_prefix("last") {
        let k = if k.is_empty() {
            1
        } else {
            parse_index(k, ctx)?
        };
        if k == 0 {
            bail!("{ctx}: last0 is empty");
        }
        Value::Last(k)
    } else if let Some((a, b)) = it.split_once('-') {
        let a = parse_index(a, ctx)?;
        if b.is_empty() {
            Value::Range(a, None)
        } else {
            let b = parse_index(b, ctx)?;
            if a > b {
                bail!("{ctx}: range {a}-{b} is empty (it runs backwards)");
            }
            Value::Range(a, Some(b))
        }
    } else {
        let a = parse_index(it, ctx)?;
        Value::Range(a, Some(a))
    })
}

impl<C: Choice> Rule<C> {
    fn parse(raw: &str, g: &Grammar) -> Result<Self> {
        let (name, filters) = match raw.split_once('@') {
            Some((n, f)) => (n, Some(f)),
            None => (raw, None),
        };
        if name.is_empty() {
            bail!("schedule rule {raw:?}: no {} before '@'", C::NOUN);
        }
        let p = C::parse_name(name, g)
            .map_err(|e| candle_core::Error::Msg(format!("schedule rule {raw:?}: {e}")))?;
        let mut rule = Rule {
            text: raw.to_string(),
            name: name.to_string(),
            preset: p,
            filters: Vec::new(),
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
                bail!(
                    "{ctx}: expected KEY=VALUE with KEY one of {} ({})",
                    g.key_names(),
                    g.model
                );
            };
            let Some(ki) = g.key(key) else {
                bail!(
                    "{ctx}: unknown key {key:?}; {} call sites have {}",
                    g.model,
                    g.key_names()
                );
            };
            if value.is_empty() {
                bail!("{ctx}: no value after '='");
            }
            if rule.filters.iter().any(|(k, _)| *k == ki) {
                bail!("schedule rule {raw:?}: filter {key:?} given twice");
            }
            let mut values = Vec::new();
            for v in value.split('+') {
                if v.is_empty() {
                    bail!("{ctx}: empty value");
                }
                values.push(match g.keys[ki].kind {
                    KeyKind::Index => parse_index_value(v, &ctx)?,
                    KeyKind::Named(names) => match names.iter().find(|(n, _)| *n == v) {
                        Some(&(_, i)) => Value::Range(i, Some(i)),
                        None => bail!(
                            "{ctx}: {key} {v:?} is not one of {}",
                            names.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                        ),
                    },
                });
            }
            rule.filters.push((ki, values));
        }
        Ok(rule)
    }

    fn is_catch_all(&self) -> bool {
        self.filters.is_empty()
    }
}

impl<C: Choice> Schedule<C> {
    /// Parses the grammar in the module docs, or one of `g`'s schedule presets.
    pub fn parse(text: &str, g: &Grammar) -> Result<Self> {
        Self::parse_inner(text, None, g)
    }

    /// Like [`Schedule::parse`], with `default` (a preset name) appended as the catch-all when
    /// the last rule has filters.
    pub fn parse_with_default(text: &str, default: &str, g: &Grammar) -> Result<Self> {
        Self::parse_inner(text, Some(default), g)
    }

    /// One choice (attention preset, linear format) for every call.
    pub fn uniform(name: &str, g: &Grammar) -> Result<Self> {
        let rule = Rule::parse(&name.trim().to_ascii_lowercase(), g)?;
        if !rule.is_catch_all() {
            bail!(
                "{} {name:?}: a single name without filters is expected",
                C::NOUN
            );
        }
        Ok(Self {
            grammar: *g,
            text: name.trim().to_string(),
            rules: vec![rule],
            clamp: false,
        })
    }

    fn parse_inner(text: &str, default: Option<&str>, g: &Grammar) -> Result<Self> {
        let compact: String = text
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_lowercase();
        if let Some((name, def, _)) = g.presets.iter().find(|(n, _, _)| *n == compact) {
            let mut s = Self::parse_inner(def, None, g)?;
            s.text = name.to_string();
            s.clamp = true;
            return Ok(s);
        }
        if compact.is_empty() {
            bail!(
                "empty {} schedule; expected a name (e.g. {}), a schedule preset ({}) or rules like \"{}@{}=0;{}\"",
                C::SUBJECT,
                C::EXAMPLE,
                g.presets.iter().map(|p| p.0).collect::<Vec<_>>().join(", "),
                C::EXAMPLE,
                g.keys.first().map_or("layers", |k| k.name),
                C::EXAMPLE
            );
        }
        let mut rules: Vec<Rule<C>> = Vec::new();
        for raw in compact.split(';') {
            if raw.is_empty() {
                bail!(
                    "{} schedule {text:?}: empty rule (two ';' in a row or a trailing ';')",
                    C::SUBJECT
                );
            }
            if let Some(prev) = rules.iter().find(|r| r.is_catch_all()) {
                bail!(
                    "{} schedule {text:?}: rule {raw:?} is never reached: {:?} before it matches every call",
                    C::SUBJECT,
                    prev.text
                );
            }
            rules.push(Rule::parse(raw, g)?);
        }
        if !rules.last().is_some_and(Rule::is_catch_all) {
            match default {
                Some(d) => rules.push(Rule::parse(&d.trim().to_ascii_lowercase(), g)?),
                None => bail!(
                    "{} schedule {text:?}: the last rule has filters, so some calls match no rule; end with a catch-all such as \";{}\"",
                    C::SUBJECT,
                    if C::SUBJECT == "attention" { "exact" } else { C::EXAMPLE }
                ),
            }
        }
        Ok(Self {
            grammar: *g,
            text: text.trim().to_string(),
            rules,
            clamp: false,
        })
    }

    /// The text it was parsed from (or the preset's name).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Ties the schedule to a run: `counts` gives the number of values of each index key
    /// (e.g. `[("layers", 36)]`); a named key needs none.
    pub fn resolve(&self, counts: &[(&str, usize)]) -> Result<Resolved<C>> {
        let subject = C::SUBJECT;
        let g = &self.grammar;
        let mut count_of = vec![None; g.keys.len()];
        for &(name, n) in counts {
            let Some(ki) = g.key(name) else {
                bail!("{subject} schedule: {} has no key {name:?}", g.model);
            };
            if n == 0 {
                bail!("{subject} schedule: the run has no {name} (count 0)");
            }
            count_of[ki] = Some(n);
        }
        let mut rules = Vec::with_capacity(self.rules.len());
        for r in &self.rules {
            let mut filters = Vec::new();
            for (ki, values) in &r.filters {
                let key = &g.keys[*ki];
                // named values are closed ranges of one index; only index keys have a count
                let n = count_of[*ki];
                if key.kind == KeyKind::Index && n.is_none() {
                    bail!(
                        "{subject} schedule {:?}: no count given for {} (a bug in the caller)",
                        self.text,
                        key.name
                    );
                }
                let mut ranges = Vec::new();
                for v in values {
                    let n_or = |what| {
                        n.ok_or_else(|| {
                            candle_core::Error::Msg(format!("{}: {what} needs a count", key.name))
                        })
                    };
                    let (a, b) = match *v {
                        Value::Range(a, Some(b)) => (a, b),
                        Value::Range(a, None) => (a, (n_or("A-")? - 1).max(a)),
                        Value::Last(k) => {
                            let n = n_or("lastK")?;
                            (n.saturating_sub(k), n - 1)
                        }
                    };
                    match n {
                        Some(n) if b >= n && self.clamp => {
                            if a < n {
                                ranges.push((a, n - 1));
                            }
                        }
                        Some(n) if b >= n => bail!(
                            "{subject} schedule {:?}: rule {:?} names {} {b}, but the run has {n} (0-{})",
                            self.text,
                            r.text,
                            key.name,
                            n - 1
                        ),
                        _ => ranges.push((a, b)),
                    }
                }
                filters.push((*ki, ranges));
            }
            rules.push(ResolvedRule {
                name: r.name.clone(),
                preset: r.preset.clone(),
                filters,
            });
        }
        Ok(Resolved {
            text: self.text.clone(),
            rules,
        })
    }
}

/// One rule tied to a run.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedRule<C = Preset> {
    /// The name as written.
    pub name: String,
    /// What the name stands for (an attention preset, a linear format).
    pub preset: C,
    filters: Vec<(usize, Vec<(usize, usize)>)>,
}

impl<C> ResolvedRule<C> {
    /// Whether the rule takes a call whose keys have `site` (one entry per key of the
    /// grammar, in its order; `None` where the call lacks the key).
    pub fn matches(&self, site: &[Option<usize>]) -> bool {
        self.filters.iter().all(|(ki, ranges)| {
            site.get(*ki)
                .copied()
                .flatten()
                .is_some_and(|i| ranges.iter().any(|&(a, b)| a <= i && i <= b))
        })
    }
}

/// A schedule tied to a run's counts.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved<C = Preset> {
    text: String,
    rules: Vec<ResolvedRule<C>>,
}

impl<C> Resolved<C> {
    /// The rule that decides a call with keys `site` (see [`ResolvedRule::matches`]); the
    /// last rule catches everything.
    pub fn rule_for(&self, site: &[Option<usize>]) -> &ResolvedRule<C> {
        self.rules
            .iter()
            .find(|r| r.matches(site))
            .unwrap_or_else(|| &self.rules[self.rules.len() - 1])
    }

    /// The schedule text (or preset name).
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl<C> fmt::Display for Resolved<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// `[0,1,2,3,35]` → `0-3,35`.
pub fn format_ranges(v: &[usize]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &[SiteKey] = &[
        SiteKey {
            name: "layers",
            kind: KeyKind::Index,
            help: "decoder layer",
        },
        SiteKey {
            name: "kind",
            kind: KeyKind::Named(&[("self", 0), ("cross", 1)]),
            help: "attention kind",
        },
    ];
    const G: Grammar = Grammar {
        model: "Test",
        keys: KEYS,
        presets: &[("edges", "mxfp6@layers=0-3+last;mxfp4", "MXFP6 at the edges")],
        kv_cache: false,
    };

    fn name_at(s: &Resolved, layer: Option<usize>, kind: Option<usize>) -> String {
        s.rule_for(&[layer, kind]).name.clone()
    }

    #[test]
    fn first_match_wins_and_missing_keys_do_not_match() {
        let s = Schedule::parse("exact@kind=cross; mxfp6@layers=0+last2; mxfp4", &G)
            .unwrap()
            .resolve(&[("layers", 6)])
            .unwrap();
        assert_eq!(name_at(&s, Some(0), Some(1)), "exact");
        assert_eq!(name_at(&s, Some(0), Some(0)), "mxfp6");
        assert_eq!(name_at(&s, Some(4), Some(0)), "mxfp6");
        assert_eq!(name_at(&s, Some(3), Some(0)), "mxfp4");
        // a call without a layer is not taken by the layers rule
        assert_eq!(name_at(&s, None, Some(0)), "mxfp4");
    }

    #[test]
    fn presets_clamp_and_user_schedules_do_not() {
        let p = <Schedule>::parse("edges", &G).unwrap();
        assert_eq!(p.text(), "edges");
        let r = p.resolve(&[("layers", 2)]).unwrap();
        assert_eq!(name_at(&r, Some(1), None), "mxfp6");
        let e = <Schedule>::parse("mxfp6@layers=0-3;mxfp4", &G)
            .unwrap()
            .resolve(&[("layers", 2)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("names layers 3, but the run has 2"), "{e}");
    }

    #[test]
    fn malformed_schedules_are_errors_that_say_why() {
        let err = |t: &str| <Schedule>::parse(t, &G).unwrap_err().to_string();
        assert!(err("").contains("empty attention schedule"));
        assert!(err("mxfp4;;exact").contains("empty rule"));
        assert!(err("mxfp4;exact").contains("never reached"));
        assert!(err("mxfp4@layers=1").contains("end with a catch-all"));
        assert!(err("mxfp5").contains("unknown attention config"));
        assert!(err("mxfp4@steps=1;exact").contains("unknown key \"steps\""));
        assert!(err("mxfp4@kind=vae;exact").contains("not one of self, cross"));
        assert!(err("mxfp4@layers=3-1;exact").contains("backwards"));
        assert!(err("mxfp4@layers=x;exact").contains("not an index"));
        assert!(err("mxfp4@layers=1,layers=2;exact").contains("given twice"));
        assert!(err("mxfp4@;exact").contains("no filter after '@'"));
        assert!(err("kv-mxfp4").contains("KV cache"));
        assert!(err("mxfp4@layers=last0;exact").contains("last0"));
        let with_default = <Schedule>::parse_with_default("mxfp4@layers=1", "exact", &G).unwrap();
        let r = with_default.resolve(&[("layers", 3)]).unwrap();
        assert_eq!(name_at(&r, Some(0), None), "exact");
    }

    #[test]
    fn ranges_print_compactly() {
        assert_eq!(format_ranges(&[0, 1, 2, 3, 35]), "0-3,35");
        assert_eq!(format_ranges(&[]), "");
    }
}
