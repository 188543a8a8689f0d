//! Wan attention schedules: parsing, first-match resolution per (expert, step, block, kind),
//! the presets, and the errors of malformed schedules.

use mxattn::attention::preset;
use mxattn::attention::{Algorithm, AttentionConfig};
use mxattn_wan::schedule::{
    attention_config, help, ScheduleSpec, WanSchedule, HYBRID, SCHEDULE_PRESETS,
};
use mxattn_wan::vae::VAE_MID_SITE;
use mxattn_wan::{AttnKind, AttnPolicy, AttnSite};

fn site(expert: usize, step: usize, layer: usize, kind: AttnKind) -> AttnSite {
    AttnSite {
        expert,
        step,
        layer,
        kind,
    }
}

fn sa(expert: usize, step: usize, layer: usize) -> AttnSite {
    site(expert, step, layer, AttnKind::SelfAttn)
}

fn cfg(name: &str) -> AttentionConfig {
    attention_config(name).unwrap()
}

fn resolved(text: &str, steps: usize, layers: usize) -> WanSchedule {
    ScheduleSpec::parse(text)
        .unwrap()
        .resolve(steps, layers)
        .unwrap()
}

fn err(text: &str) -> String {
    match ScheduleSpec::parse(text).and_then(|s| s.resolve(40, 40)) {
        Ok(_) => panic!("{text:?} parsed"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn config_names_come_from_the_shared_presets() {
    for name in [
        "exact", "bf16", "mxfp8", "mxfp6", "mxfp4", "efq", "efq-mean",
    ] {
        assert_eq!(cfg(name), preset(name).unwrap().config, "{name}");
    }
    // Fused-Softmax keeps its Hadamard rotation inside the op
    for name in ["fused", "fused-mxfp6", "fused-mxfp4"] {
        match cfg(name).algorithm {
            Algorithm::FusedSoftmax(f) => assert!(f.hadamard, "{name}"),
            a => panic!("{name}: {a:?}"),
        }
    }
    assert_ne!(cfg("mxfp6"), cfg("mxfp4"));
    assert_eq!(cfg(" MXFP4 "), cfg("mxfp4"));
    let e = attention_config("kv-mxfp4").unwrap_err().to_string();
    assert!(e.contains("KV cache"), "{e}");
    assert!(attention_config("mxfp5").is_err());
}

#[test]
fn uniform_name_runs_everywhere() {
    let s = resolved("mxfp4", 40, 40);
    for site in [
        sa(0, 0, 0),
        sa(1, 39, 39),
        site(1, 20, 7, AttnKind::CrossAttn),
        VAE_MID_SITE,
    ] {
        assert_eq!(s.config(&site), cfg("mxfp4"), "{site:?}");
        assert_eq!(s.name_of(&site), "mxfp4");
    }
    let u = ScheduleSpec::uniform("exact")
        .unwrap()
        .resolve(4, 2)
        .unwrap();
    assert_eq!(u.config(&sa(0, 3, 1)), AttentionConfig::exact());
}

#[test]
fn first_matching_rule_wins() {
    let s = resolved(
        "bf16@expert=low,layers=3;mxfp8@steps=0-1+last;mxfp6@layers=2-4,kind=self;exact@kind=vae;mxfp4",
        10,
        8,
    );
    // expert + layer
    assert_eq!(s.name_of(&sa(1, 5, 3)), "bf16");
    assert_eq!(s.name_of(&site(1, 5, 3, AttnKind::CrossAttn)), "bf16");
    // expert=low does not match the high-noise expert, which falls to the next rules
    assert_eq!(s.name_of(&sa(0, 5, 3)), "mxfp6");
    assert_eq!(s.name_of(&site(0, 5, 3, AttnKind::CrossAttn)), "mxfp4");
    // steps 0, 1 and the last (9)
    assert_eq!(s.name_of(&sa(0, 0, 0)), "mxfp8");
    assert_eq!(s.name_of(&sa(0, 1, 7)), "mxfp8");
    assert_eq!(s.name_of(&sa(1, 9, 0)), "mxfp8");
    assert_eq!(s.name_of(&sa(1, 8, 0)), "mxfp4");
    // layers 2-4 inclusive, self only
    assert_eq!(s.name_of(&sa(0, 4, 2)), "mxfp6");
    assert_eq!(s.name_of(&sa(0, 4, 4)), "mxfp6");
    assert_eq!(s.name_of(&sa(0, 4, 5)), "mxfp4");
    // the VAE skips rules with expert/steps/layers filters even though its site is (0, 0, 0)
    assert_eq!(s.name_of(&VAE_MID_SITE), "exact");
    assert_eq!(s.config(&VAE_MID_SITE), cfg("exact"));
    // steps past the run fall to the catch-all
    assert_eq!(s.name_of(&sa(0, 50, 0)), "mxfp4");
}

#[test]
fn open_ranges_lists_and_expert_aliases() {
    let s = resolved(
        "mxfp6@layers=30-+1,expert=0+1;mxfp8@expert=1;bf16@kind=self+cross;exact",
        4,
        40,
    );
    for l in [1, 30, 35, 39] {
        assert_eq!(s.name_of(&sa(0, 0, l)), "mxfp6", "layer {l}");
        assert_eq!(s.name_of(&sa(1, 0, l)), "mxfp6", "layer {l}");
    }
    assert_eq!(s.name_of(&sa(1, 0, 29)), "mxfp8");
    assert_eq!(s.name_of(&sa(0, 0, 29)), "bf16");
    assert_eq!(s.name_of(&VAE_MID_SITE), "exact");
    // case and whitespace
    let t = resolved(" MXFP6 @ Expert=HIGH ; mxfp4 ", 4, 4);
    assert_eq!(t.name_of(&sa(0, 0, 0)), "mxfp6");
    assert_eq!(t.name_of(&sa(1, 0, 0)), "mxfp4");
}

#[test]
fn hybrid_preset_resolves() {
    assert_eq!(
        (SCHEDULE_PRESETS[0].0, SCHEDULE_PRESETS[0].1),
        ("hybrid", HYBRID)
    );
    // T2V-A14B: 40 steps, 40 blocks per expert
    let s = resolved("hybrid", 40, 40);
    assert_eq!(s.text(), "hybrid");
    assert_eq!(s.name_of(&VAE_MID_SITE), "exact");
    for (e, step) in [(0, 10), (1, 30)] {
        assert_eq!(s.name_of(&site(e, step, 20, AttnKind::CrossAttn)), "exact");
        for l in [0, 1, 38, 39] {
            assert_eq!(s.name_of(&sa(e, step, l)), "mxfp6", "expert {e} layer {l}");
        }
        for l in [2, 20, 37] {
            assert_eq!(s.name_of(&sa(e, step, l)), "mxfp4", "expert {e} layer {l}");
        }
    }
    for step in [0, 1, 2, 37, 38, 39] {
        assert_eq!(
            s.name_of(&sa(usize::from(step > 20), step, 20)),
            "mxfp6",
            "step {step}"
        );
    }
    for step in [3, 36] {
        assert_eq!(
            s.name_of(&sa(usize::from(step > 20), step, 20)),
            "mxfp4",
            "step {step}"
        );
    }
    assert_eq!(s.config(&sa(0, 10, 20)), cfg("mxfp4"));
    assert_eq!(s.config(&sa(0, 10, 0)), cfg("mxfp6"));
    // 26 high-noise steps (the T2V original split): 2 kinds x 40 blocks x 40 steps + VAE
    let sum = s.summary(26);
    // exact: every cross call (1600) + the VAE; mxfp6: self in layers 0,1,38,39 on the 34
    // middle steps (136) + self in all 40 layers on the 6 edge steps (240)
    assert_eq!(sum, "mxfp6: 376, exact: 1601, mxfp4: 1224");
    // the preset fits a small run (TI2V-5B depth 30, 4 steps) by clamping
    let small = resolved("HYBRID", 2, 3);
    assert_eq!(small.name_of(&sa(0, 0, 1)), "mxfp6");
    let fused = resolved("hybrid-fused", 40, 30);
    assert_eq!(fused.config(&sa(0, 10, 10)), cfg("fused-mxfp4"));
    assert_eq!(
        fused.config(&site(0, 10, 10, AttnKind::CrossAttn)),
        cfg("exact")
    );
}

#[test]
fn default_catch_all() {
    let s = ScheduleSpec::parse_with_default("mxfp6@kind=cross", "mxfp4")
        .unwrap()
        .resolve(4, 4)
        .unwrap();
    assert_eq!(s.name_of(&site(0, 0, 0, AttnKind::CrossAttn)), "mxfp6");
    assert_eq!(s.name_of(&sa(0, 0, 0)), "mxfp4");
    // a schedule that already ends with a catch-all keeps it
    let t = ScheduleSpec::parse_with_default("mxfp6", "mxfp4")
        .unwrap()
        .resolve(4, 4)
        .unwrap();
    assert_eq!(t.name_of(&sa(0, 0, 0)), "mxfp6");
    assert!(ScheduleSpec::parse_with_default("mxfp6@kind=cross", "nope").is_err());
}

#[test]
fn errors_are_clear() {
    for (text, needle) in [
        ("", "empty attention schedule"),
        ("mxfp6@kind=cross", "catch-all"),
        ("mxfp4;mxfp6@kind=cross", "never reached"),
        ("mxfp4;exact", "never reached"),
        ("nope", "unknown attention config"),
        ("mxfp6@speed=3;exact", "unknown key"),
        ("mxfp6@steps;exact", "KEY=VALUE"),
        ("mxfp6@steps=;exact", "no value"),
        ("mxfp6@;exact", "no filter"),
        ("@steps=1;exact", "no attention preset"),
        ("mxfp6@steps=5-2;exact", "empty"),
        ("mxfp6@steps=last0;exact", "last0"),
        ("mxfp6@steps=1++2;exact", "empty value"),
        ("mxfp6@steps=x;exact", "not an index"),
        ("mxfp6@expert=mid;exact", "expert"),
        ("mxfp6@kind=ffn;exact", "kind"),
        ("mxfp6@steps=1,steps=2;exact", "twice"),
        ("mxfp6;;exact", "empty rule"),
        (
            "mxfp6@steps=40;exact",
            "names steps 40, but the run has 40 (0-39)",
        ),
        ("mxfp6@layers=3-40;exact", "layers 40"),
        ("mxfp6@layers=45-;exact", "layers 45"),
        ("kv-mxfp4", "KV cache"),
    ] {
        let e = err(text);
        assert!(e.contains(needle), "{text:?}: {e}");
    }
    assert!(ScheduleSpec::parse("mxfp4")
        .unwrap()
        .resolve(0, 40)
        .is_err());
    assert!(ScheduleSpec::parse("mxfp4")
        .unwrap()
        .resolve(40, 0)
        .is_err());
}

#[test]
fn help_lists_grammar_configs_and_presets() {
    let h = help();
    for s in [
        "expert",
        "high|low",
        "steps",
        "layers",
        "kind",
        "self|cross|vae",
        "lastK",
        "mxfp6",
        "fused-mxfp4",
        "hybrid",
        HYBRID,
    ] {
        assert!(h.contains(s), "{s}");
    }
    assert!(!h.contains("kv-mxfp4"));
}

/// The example `--help` shows is generated from the `hybrid` preset's definition (so it cannot
/// drift from it, as the old hand-written example did); this checks that the help shows it and
/// that, written out and so not clamped, it picks what the preset picks at every site of a
/// full A14B run.
#[test]
fn the_help_example_is_what_it_says() {
    let h = help();
    let line = h
        .lines()
        .find_map(|l| l.strip_prefix("Example: "))
        .expect("the help shows an example");
    assert!(h.contains("(written out, the hybrid preset)"), "{h}");
    let (ex, preset) = (resolved(line, 40, 40), resolved("hybrid", 40, 40));
    for expert in 0..2 {
        for step in 0..40 {
            for layer in 0..40 {
                for kind in [AttnKind::SelfAttn, AttnKind::CrossAttn] {
                    let s = site(expert, step, layer, kind);
                    assert_eq!(ex.name_of(&s), preset.name_of(&s), "{s:?}");
                }
            }
        }
    }
    assert_eq!(ex.name_of(&VAE_MID_SITE), preset.name_of(&VAE_MID_SITE));
}
