//! Qwen3: parity with Hugging Face transformers on tiny random checkpoints
//! (`scripts/gen_qwen3_fixtures.py`), every attention schedule end to end, the KV cache,
//! schedules, configs and loading errors.

use candle_core::{DType, Device, IndexOp, Tensor};
use mxattn::attention::PRESETS as LAYER_PRESETS;
use mxattn::attention::{attention, AttentionConfig};
use mxattn::mx::{ElemFormat, ScaleMode};
use mxattn_llm::generation::greedy;
use mxattn_llm::kv_cache::{CacheFormat, KvFormat, LayerKvCache};
use mxattn_llm::schedule::SCHEDULE_PRESETS;
use mxattn_llm::{
    layer_preset, loading, CausalLm, CheckpointFiles, Config, Schedule, ScheduleSpec,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    mxattn::oracle::max_abs_diff(a, b).unwrap()
}

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/qwen3")
        .join(name)
}

struct Expected {
    prompt: Vec<u32>,
    prompt_logits: Tensor,
    continuation: Vec<u32>,
    full_logits: Tensor,
}

fn expected(model: &str) -> Expected {
    let all =
        candle_core::safetensors::load(fixture_dir("expected.safetensors"), &Device::Cpu).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        all[&format!("{model}.{k}")]
            .to_vec1::<i64>()
            .unwrap()
            .into_iter()
            .map(|x| x as u32)
            .collect()
    };
    Expected {
        prompt: ids("prompt"),
        prompt_logits: all[&format!("{model}.prompt_logits")].clone(),
        continuation: ids("continuation"),
        full_logits: all[&format!("{model}.full_logits")].clone(),
    }
}

fn load(model: &str, schedule: &str, dtype: DType) -> CausalLm {
    let files = CheckpointFiles::from_dir(fixture_dir(model)).unwrap();
    let cfg = Config::from_file(&files.component.config).unwrap();
    let s = ScheduleSpec::parse(schedule)
        .unwrap()
        .resolve(cfg.num_hidden_layers)
        .unwrap();
    loading::load(&cfg, &files, &s, dtype, &Device::Cpu).unwrap()
}

fn ids(v: &[u32]) -> Tensor {
    Tensor::new(v, &Device::Cpu).unwrap().unsqueeze(0).unwrap()
}

fn all_finite(t: &Tensor) -> bool {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .all(|x| x.is_finite())
}

// ---------------------------------------------------------------- parity with HF

#[test]
fn exact_prefill_logits_match_transformers() {
    for model in ["tiny", "tiny_tied"] {
        let e = expected(model);
        let mut m = load(model, "exact", DType::F32);
        let logits = m.forward_all(&ids(&e.prompt)).unwrap().squeeze(0).unwrap();
        let d = max_abs_diff(&logits, &e.prompt_logits);
        println!("{model}: max |Δlogit| vs transformers = {d:.2e}");
        assert!(d < 1e-4, "{model}: max |Δlogit| = {d}");
        // not vacuous: the logits are spread (std ≈ 2) so a wrong layer would show
        let std = e.prompt_logits.flatten_all().unwrap().var(0).unwrap();
        assert!(std.to_scalar::<f32>().unwrap() > 1.0);
    }
}

#[test]
fn exact_greedy_continuation_matches_transformers() {
    for model in ["tiny", "tiny_tied"] {
        let e = expected(model);
        let mut m = load(model, "exact", DType::F32);
        let got = greedy(&mut m, &e.prompt, e.continuation.len()).unwrap();
        assert_eq!(got, e.continuation, "{model}");
    }
}

/// Decode steps through the KV cache, and a prefill split in two chunks, give the logits
/// transformers computes over the whole sequence at once.
#[test]
fn exact_decode_steps_and_chunked_prefill_match_transformers() {
    for model in ["tiny", "tiny_tied"] {
        let e = expected(model);
        let mut m = load(model, "exact", DType::F32);
        let l = e.prompt.len();
        let first = m
            .forward_all(&ids(&e.prompt[..5]))
            .unwrap()
            .squeeze(0)
            .unwrap();
        let second = m
            .forward_all(&ids(&e.prompt[5..]))
            .unwrap()
            .squeeze(0)
            .unwrap();
        let pre = Tensor::cat(&[&first, &second], 0).unwrap();
        assert!(max_abs_diff(&pre, &e.full_logits.narrow(0, 0, l).unwrap()) < 1e-4);
        for (i, &t) in e
            .continuation
            .iter()
            .enumerate()
            .take(e.continuation.len() - 1)
        {
            let step = m.forward_last(&ids(&[t])).unwrap().squeeze(0).unwrap();
            let want = e.full_logits.i(l + i).unwrap();
            let d = max_abs_diff(&step, &want);
            assert!(d < 1e-4, "{model} step {i}: {d}");
        }
        assert_eq!(m.seq_len(), l + e.continuation.len() - 1);
    }
}

/// In bf16 the model still follows transformers' f32 logits closely (a loose check of the
/// bf16 path; the exact bound is set by bf16 weights and activations).
#[test]
fn bf16_model_stays_near_the_f32_reference() {
    let e = expected("tiny");
    let mut m = load("tiny", "bf16", DType::BF16);
    let logits = m.forward_all(&ids(&e.prompt)).unwrap().squeeze(0).unwrap();
    let d = max_abs_diff(&logits, &e.prompt_logits);
    assert!(d < 0.25, "bf16 max |Δlogit| = {d}");
    assert!(d > 0.0);
}

// ---------------------------------------------------------------- every schedule

#[test]
fn every_preset_and_schedule_runs_end_to_end_with_finite_logits() {
    let e = expected("tiny");
    let mut base = load("tiny", "exact", DType::F32);
    let base_logits = base.forward_all(&ids(&e.prompt)).unwrap();
    let base_bytes = base.kv_cache_bytes();
    let n_layers = Config::from_file(
        &CheckpointFiles::from_dir(fixture_dir("tiny"))
            .unwrap()
            .component
            .config,
    )
    .unwrap()
    .num_hidden_layers;
    let mut names: Vec<String> = LAYER_PRESETS.iter().map(|(n, _)| n.to_string()).collect();
    names.extend(SCHEDULE_PRESETS.iter().map(|(n, _, _)| n.to_string()));
    names.push("mxfp6@layers=0;mxfp4".into());
    for name in &names {
        let mut m = load("tiny", name, DType::F32);
        let logits = m.forward_all(&ids(&e.prompt)).unwrap();
        assert!(all_finite(&logits), "{name}: non-finite prefill logits");
        // decode 8 more tokens through the (quantized) cache
        for &t in &e.continuation[..8] {
            let s = m.forward_last(&ids(&[t])).unwrap();
            assert!(all_finite(&s), "{name}: non-finite decode logits");
        }
        let d = max_abs_diff(&logits, &base_logits);
        match name.as_str() {
            "exact" => assert_eq!(d, 0.0),
            // every other config changes the arithmetic, so the logits must move: this
            // shows the schedule reaches the attention op
            _ => assert!(d > 0.0, "{name}: logits identical to exact"),
        }
        // The change is bounded by what the formats allow: the relative change of the
        // logits at most the sum of the relative roundings the config applies (Q, K, V, P and
        // the cache; see `rounding_budget`). Attention adds into the residual stream, so its
        // relative error does not grow on the way to the logits of this 2-layer model.
        let rel = rel_diff(&logits, &base_logits);
        let sched = ScheduleSpec::parse(name)
            .unwrap()
            .resolve(n_layers)
            .unwrap();
        let budget = (0..sched.len())
            .map(|l| rounding_budget(sched.layer(l)))
            .fold(0f64, f64::max);
        println!("{name:<14} relative logit change {rel:.2e}, budget {budget:.2e}");
        assert!(
            rel <= budget,
            "{name}: relative logit change {rel:.3e} exceeds its formats' budget {budget:.3e}"
        );
        let bytes = m.kv_cache_bytes();
        // bf16 halves f32, MX formats cut further (the cache holds 20 tokens here)
        if name != "exact" {
            assert!(
                bytes < base_bytes * 20 / 12,
                "{name}: {bytes} vs {base_bytes}"
            );
        }
    }
}

/// ‖a − b‖ / ‖b‖ over all elements.
fn rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let d = (a - b).unwrap().sqr().unwrap().sum_all().unwrap();
    let n = b.sqr().unwrap().sum_all().unwrap();
    (d.to_scalar::<f32>().unwrap() as f64 / n.to_scalar::<f32>().unwrap() as f64).sqrt()
}

/// [`mxattn::oracle::rounding_budget`] of the layer's config, plus a cache's K and V stored
/// in another format than the op quantizes them to (a cache in the op's own operand format
/// rounds nothing more: MX quantization is a fixed point of itself; see
/// crates/llm/src/kv_cache.rs).
fn rounding_budget(spec: &mxattn_llm::LayerSpec) -> f64 {
    use mxattn::attention::OperandFormat;
    use mxattn_llm::CacheFormat;
    let a = &spec.attn;
    let cache = |c: CacheFormat, f: OperandFormat| match (c, f) {
        (CacheFormat::Mx { elem, .. }, OperandFormat::Mx { elem: e, .. }) if elem == e => 0.0,
        (CacheFormat::Mx { elem, .. }, _) => mxattn::oracle::unit_roundoff(elem),
        (CacheFormat::Bf16, OperandFormat::Bf16) | (CacheFormat::Model, _) => 0.0,
        (CacheFormat::Bf16, _) => 2f64.powi(-8),
    };
    mxattn::oracle::rounding_budget(a)
        + cache(spec.kv.k, a.qk_format)
        + cache(spec.kv.v, a.v_format)
}

// ---------------------------------------------------------------- KV cache

fn rand(shape: (usize, usize, usize, usize), seed: u64) -> Tensor {
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    let v = mxattn::synth::Rng::new(seed).normals(n, 1.0);
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

fn mx(elem: ElemFormat, scale: ScaleMode) -> CacheFormat {
    CacheFormat::Mx {
        elem,
        scale,
        block: 32,
    }
}

/// The cache after n tokens does not depend on how they arrived (one prefill, one by
/// one, or uneven chunks across V block boundaries).
#[test]
fn cache_contents_do_not_depend_on_arrival() {
    let (b, h, n, d) = (1, 2, 77, 64);
    let k = rand((b, h, n, d), 1);
    let v = rand((b, h, n, d), 2);
    for elem in [ElemFormat::E4M3, ElemFormat::E2M3, ElemFormat::E2M1] {
        let f = KvFormat {
            k: mx(elem, ScaleMode::Floor),
            v: mx(elem, ScaleMode::Floor),
        };
        let run = |chunks: &[usize]| {
            let mut c = LayerKvCache::new(f);
            let mut at = 0;
            let mut out = None;
            for &len in chunks {
                out = Some(
                    c.append(
                        &k.narrow(2, at, len).unwrap(),
                        &v.narrow(2, at, len).unwrap(),
                    )
                    .unwrap(),
                );
                at += len;
            }
            assert_eq!(at, n);
            assert_eq!(c.len(), n);
            let (kk, vv) = out.unwrap();
            (bits(&kk), bits(&vv), c.bytes())
        };
        let whole = run(&[n]);
        assert_eq!(whole, run(&[1; 77]), "{elem}: one by one");
        assert_eq!(whole, run(&[5, 30, 1, 33, 8]), "{elem}: chunks");
    }
}

/// Attention on the dequantized cache equals attention on the unquantized K/V with the
/// same config: the op's own re-quantization of the cached values changes nothing.
#[test]
fn attention_on_the_cache_equals_attention_on_raw_kv() {
    let (b, hq, hkv, n, d) = (1, 4, 2, 70, 64);
    let k = rand((b, hkv, n, d), 3);
    let v = rand((b, hkv, n, d), 4);
    let q = rand((b, hq, 1, d), 5);
    for name in [
        "mxfp8",
        "mxfp6",
        "mxfp4",
        "efq",
        "efq-exact",
        "fused-mxfp6",
        "fused-mxfp4",
    ] {
        let spec = layer_preset(name).unwrap();
        let cfg = spec.attn.clone().with_causal(true);
        let mut c = LayerKvCache::new(spec.kv);
        // prefill 40, then one by one
        let (mut kk, mut vv) = c
            .append(&k.narrow(2, 0, 40).unwrap(), &v.narrow(2, 0, 40).unwrap())
            .unwrap();
        for i in 40..n {
            (kk, vv) = c
                .append(&k.narrow(2, i, 1).unwrap(), &v.narrow(2, i, 1).unwrap())
                .unwrap();
        }
        let cached = attention(&q, &kk, &vv, &cfg).unwrap();
        let raw = attention(&q, &k, &v, &cfg).unwrap();
        assert_eq!(bits(&cached), bits(&raw), "{name}");
    }
    // AMD's MXFP8 round-up rule is a fixed point except for E4M3 subnormals of a block
    // whose max code is 448; the output moves by far less than the quantization itself.
    let spec = layer_preset("fused-mxfp8").unwrap();
    let cfg = spec.attn.clone().with_causal(true);
    let mut c = LayerKvCache::new(spec.kv);
    let (kk, vv) = c.append(&k, &v).unwrap();
    let cached = attention(&q, &kk, &vv, &cfg).unwrap();
    let raw = attention(&q, &k, &v, &cfg).unwrap();
    assert!(max_abs_diff(&cached, &raw) < 1e-5);
}

#[test]
fn cache_bytes_count_codes_scales_and_the_raw_tail() {
    let (b, h, n, d) = (1, 2, 40, 32);
    let k = rand((b, h, n, d), 6);
    let v = rand((b, h, n, d), 7);
    let cases = [
        // (K format, V format, expected bytes)
        (CacheFormat::Model, CacheFormat::Model, 2 * h * n * d * 4),
        (CacheFormat::Bf16, CacheFormat::Bf16, 2 * h * n * d * 2),
        // MXFP4 K: 16 code bytes + 1 scale per token and head; V: 32 keys in one full
        // block (16 bytes of codes per channel + 1 scale), 8 tail keys in f32
        (
            mx(ElemFormat::E2M1, ScaleMode::Floor),
            mx(ElemFormat::E2M1, ScaleMode::Floor),
            h * n * 17 + h * d * 17 + h * 8 * d * 4,
        ),
        // MXFP6: 24 code bytes per 32 elements
        (
            mx(ElemFormat::E2M3, ScaleMode::Floor),
            mx(ElemFormat::E2M3, ScaleMode::Floor),
            h * n * 25 + h * d * 25 + h * 8 * d * 4,
        ),
    ];
    for (kf, vf, want) in cases {
        let mut c = LayerKvCache::new(KvFormat { k: kf, v: vf });
        c.append(&k, &v).unwrap();
        assert_eq!(c.bytes(), want, "{kf} / {vf}");
    }
}

#[test]
fn cache_rejects_mismatched_appends() {
    let mut c = LayerKvCache::new(KvFormat::MODEL);
    c.append(&rand((1, 2, 3, 32), 1), &rand((1, 2, 3, 32), 2))
        .unwrap();
    assert!(c
        .append(&rand((1, 4, 1, 32), 1), &rand((1, 4, 1, 32), 2))
        .is_err());
    assert!(c
        .append(&rand((1, 2, 1, 32), 1), &rand((1, 2, 2, 32), 2))
        .is_err());
}

// ---------------------------------------------------------------- schedules

fn names_of(s: &Schedule) -> Vec<String> {
    (0..s.len()).map(|i| s.layer_name(i).to_string()).collect()
}

#[test]
fn schedule_grammar_assigns_layers() {
    let s = ScheduleSpec::parse("mxfp6@layers=0-3+35;mxfp4")
        .unwrap()
        .resolve(36)
        .unwrap();
    let n = names_of(&s);
    for (i, name) in n.iter().enumerate() {
        let want = if i <= 3 || i == 35 { "mxfp6" } else { "mxfp4" };
        assert_eq!(name, want, "layer {i}");
    }
    assert_eq!(s.summary(), "mxfp6: 0-3,35; mxfp4: 4-34");
    assert_eq!(s.layer(0), &layer_preset("mxfp6").unwrap());
    // the preset, with `last` resolving to the model's last layer
    let h = ScheduleSpec::parse("hybrid").unwrap().resolve(28).unwrap();
    assert_eq!(h.summary(), "mxfp6: 0-3,27; mxfp4: 4-26");
    // presets clamp to shallow models; a layer named twice by one rule is fine
    let h = ScheduleSpec::parse("hybrid").unwrap().resolve(2).unwrap();
    assert_eq!(names_of(&h), ["mxfp6", "mxfp6"]);
    let s = ScheduleSpec::parse("mxfp6@layers=0-2+2;mxfp4")
        .unwrap()
        .resolve(4)
        .unwrap();
    assert_eq!(s.summary(), "mxfp6: 0-2; mxfp4: 3");
    // the first matching rule wins; whitespace and case are ignored; lastK, A- ranges
    let s = ScheduleSpec::parse(" mxfp8 @ layers = 1 ; MXFP6@layers=0-1 ; EXACT ")
        .unwrap()
        .resolve(3)
        .unwrap();
    assert_eq!(names_of(&s), ["mxfp6", "mxfp8", "exact"]);
    let s = ScheduleSpec::parse("mxfp6@layers=last2;mxfp8@layers=1-;exact")
        .unwrap()
        .resolve(5)
        .unwrap();
    assert_eq!(names_of(&s), ["exact", "mxfp8", "mxfp8", "mxfp6", "mxfp6"]);
    let s = ScheduleSpec::parse("efq").unwrap().resolve(2).unwrap();
    assert_eq!(names_of(&s), ["efq", "efq"]);
}

/// The example `--help` shows is generated from the `hybrid` preset's definition (so it cannot
/// drift from it, as the old hand-written example did); this checks that the help shows it and
/// that, written out and so not clamped, it picks what the preset picks at 5 and 36 layers.
#[test]
fn the_help_example_is_what_it_says() {
    let help = mxattn_llm::schedule::schedule_help();
    let line = help
        .lines()
        .find_map(|l| l.strip_prefix("Example: "))
        .expect("the help shows an example");
    assert!(help.contains("(written out, the hybrid preset)"), "{help}");
    for n in [5, 36] {
        let ex = ScheduleSpec::parse(line).unwrap().resolve(n).unwrap();
        let preset = ScheduleSpec::parse("hybrid").unwrap().resolve(n).unwrap();
        assert_eq!(ex.summary(), preset.summary(), "{n} layers");
    }
}

#[test]
fn schedule_errors_say_what_is_wrong() {
    let err = |text: &str, n: usize| -> String {
        match ScheduleSpec::parse(text).and_then(|s| s.resolve(n)) {
            Ok(_) => panic!("{text:?} should fail"),
            Err(e) => e.to_string(),
        }
    };
    assert!(err("mxfp5", 4).contains("unknown attention config \"mxfp5\""));
    let e = err("mxfp4@layers=0-9;exact", 4);
    assert!(
        e.contains("layers 9") && e.contains("the run has 4 (0-3)"),
        "{e}"
    );
    assert!(err("mxfp4;mxfp6@layers=2", 4).contains("never reached"));
    assert!(err("mxfp4@layers=0+1", 4).contains("end with a catch-all"));
    assert!(err("mxfp4@layers=a;exact", 4).contains("not an index"));
    assert!(err("mxfp4@layers=3-1;exact", 4).contains("backwards"));
    assert!(err("mxfp4@layers=0;;mxfp6", 4).contains("empty rule"));
    assert!(err("mxfp4@layers=;exact", 4).contains("no value"));
    assert!(err("mxfp4@layers=0++1;exact", 4).contains("empty value"));
    assert!(err("mxfp4@steps=1;exact", 4).contains("Qwen3 call sites have layers"));
    // the grammar of other schedules before it: a clear error, not a silent misreading
    assert!(err("mxfp6:0-3,last;mxfp4:*", 4).contains("unknown attention config"));
    assert!(err("", 4).contains("empty"));
}

#[test]
fn fused_layers_move_the_hadamard_rotation_into_the_model() {
    use mxattn::attention::Algorithm;
    let s = layer_preset("fused-mxfp4").unwrap();
    assert!(s.rotate_qk);
    match &s.attn.algorithm {
        Algorithm::FusedSoftmax(f) => assert!(!f.hadamard),
        a => panic!("{a:?}"),
    }
    // the cache uses the op's own Q/K rule (MXFP4: rceil)
    assert_eq!(s.kv.k, mx(ElemFormat::E2M1, ScaleMode::Rceil));
    let k = layer_preset("kv-mxfp4").unwrap();
    assert_eq!(k.attn, AttentionConfig::exact());
    assert_eq!(k.kv.v, mx(ElemFormat::E2M1, ScaleMode::Floor));
}

// ---------------------------------------------------------------- config

const BASE: &str = r#""vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
  "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "hidden_act": "silu""#;

fn cfg(extra: &str) -> candle_core::Result<Config> {
    Config::from_json_str(&format!("{{{BASE}{extra}}}"))
}

#[test]
fn config_accepts_both_rope_forms() {
    let a =
        cfg(r#", "rope_theta": 1000000.0, "tie_word_embeddings": true, "eos_token_id": 151645"#)
            .unwrap();
    let b = cfg(
        r#", "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
             "tie_word_embeddings": true, "eos_token_id": [151645]"#,
    )
    .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.rope_theta, 1e6);
    assert!(a.tie_word_embeddings);
    assert_eq!(a.eos_token_ids, vec![151645]);
    // both present and equal is fine; untied is the default
    let c = cfg(r#", "rope_theta": 5e5, "rope_parameters": {"rope_theta": 5e5}"#).unwrap();
    assert_eq!(c.rope_theta, 5e5);
    assert!(!c.tie_word_embeddings);
    // the fixture transformers wrote uses the nested form
    let f = Config::from_file(fixture_dir("tiny").join("config.json")).unwrap();
    assert_eq!(f.rope_theta, 10000.0);
    assert_eq!(f.head_dim, 32);
    let t = Config::from_file(fixture_dir("tiny_tied").join("config.json")).unwrap();
    assert!(t.tie_word_embeddings);
}

#[test]
fn config_errors() {
    let e = |extra: &str| cfg(extra).unwrap_err().to_string();
    assert!(e("").contains("no RoPE base"));
    assert!(
        e(r#", "rope_theta": 1.0, "rope_parameters": {"rope_theta": 2.0}"#).contains("disagree")
    );
    assert!(e(r#", "rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn"}"#).contains("yarn"));
    assert!(
        e(r#", "rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4.0}"#)
            .contains("rope_scaling")
    );
    assert!(e(r#", "rope_theta": 1e6, "use_sliding_window": true"#).contains("sliding"));
    let bad = Config::from_json_str(r#"{"vocab_size": 10}"#)
        .unwrap_err()
        .to_string();
    assert!(bad.contains("missing field"), "{bad}");
    let p = fixture_dir("no-such-dir").join("config.json");
    assert!(Config::from_file(&p)
        .unwrap_err()
        .to_string()
        .contains("no-such-dir"));
    assert_eq!(
        Config::preset("Qwen/Qwen3-8B").unwrap().num_hidden_layers,
        36
    );
    assert!(!Config::preset("Qwen/Qwen3-8B").unwrap().tie_word_embeddings);
    assert!(
        Config::preset("Qwen/Qwen3-0.6B")
            .unwrap()
            .tie_word_embeddings
    );
    assert!(Config::preset("Qwen/Qwen2-7B").is_err());
}

// ---------------------------------------------------------------- loading errors

/// A scratch copy of a fixture checkpoint.
struct Scratch(PathBuf);

impl Scratch {
    fn of(model: &str, tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("mxattn-qwen3-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(fixture_dir(model)).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
        Self(dir)
    }
    fn load_err(&self) -> String {
        let files = match CheckpointFiles::from_dir(&self.0) {
            Ok(f) => f,
            Err(e) => return e.to_string(),
        };
        let cfg = Config::from_file(&files.component.config).unwrap();
        let s = ScheduleSpec::parse("exact")
            .unwrap()
            .resolve(cfg.num_hidden_layers)
            .unwrap();
        match loading::load(&cfg, &files, &s, DType::F32, &Device::Cpu) {
            Ok(_) => panic!("loading {} should fail", self.0.display()),
            Err(e) => e.to_string(),
        }
    }
    /// Rewrites one safetensors file with `edit` applied to its tensors.
    fn edit(&self, file: &str, edit: impl FnOnce(&mut HashMap<String, Tensor>)) {
        let p = self.0.join(file);
        let mut t = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
        edit(&mut t);
        candle_core::safetensors::save(&t, &p).unwrap();
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn truncated_checkpoint_names_the_file_and_tensor() {
    let s = Scratch::of("tiny", "trunc");
    let p = s.0.join("model.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 1000).unwrap();
    let e = s.load_err();
    assert!(e.contains("model.safetensors"), "{e}");
    assert!(e.contains("truncated: tensor "), "{e}");
    // the tensor stored last (highest offsets) is the one cut off
    assert!(e.contains("model."), "{e}");
    // a file cut inside its header
    f.set_len(100).unwrap();
    let e = s.load_err();
    assert!(
        e.contains("model.safetensors") && e.contains("truncated inside the header"),
        "{e}"
    );
}

#[test]
fn wrong_shape_names_the_file_tensor_and_shapes() {
    let s = Scratch::of("tiny", "shape");
    s.edit("model.safetensors", |t| {
        let w = t["model.layers.1.self_attn.k_norm.weight"]
            .narrow(0, 0, 16)
            .unwrap();
        t.insert("model.layers.1.self_attn.k_norm.weight".into(), w);
    });
    let e = s.load_err();
    assert!(e.contains("model.safetensors"), "{e}");
    assert!(e.contains("model.layers.1.self_attn.k_norm.weight"), "{e}");
    assert!(e.contains("[16]") && e.contains("[32]"), "{e}");
}

#[test]
fn missing_tensor_and_bad_index_are_named() {
    // single file: a missing lm_head (the untied model needs it)
    let s = Scratch::of("tiny", "missing");
    s.edit("model.safetensors", |t| {
        t.remove("lm_head.weight");
    });
    let e = s.load_err();
    assert!(e.contains("lm_head.weight") && e.contains("missing"), "{e}");
    assert!(e.contains("model.safetensors"), "{e}");

    // sharded: a tensor removed from the shard the index names
    let s = Scratch::of("tiny_tied", "shard");
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(s.0.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let name = "model.layers.0.mlp.up_proj.weight";
    let shard = index["weight_map"][name].as_str().unwrap().to_string();
    s.edit(&shard, |t| {
        t.remove(name);
    });
    let e = s.load_err();
    assert!(e.contains(name) && e.contains(&shard), "{e}");

    // an index that points a tensor at the wrong shard
    let s = Scratch::of("tiny_tied", "index");
    let mut index = index.clone();
    let other = if shard.contains("00001") {
        "model-00002-of-00004.safetensors"
    } else {
        "model-00001-of-00004.safetensors"
    };
    index["weight_map"][name] = serde_json::Value::String(other.into());
    std::fs::write(
        s.0.join("model.safetensors.index.json"),
        serde_json::to_string(&index).unwrap(),
    )
    .unwrap();
    let e = s.load_err();
    assert!(
        e.contains(name) && e.contains(other) && e.contains(&shard),
        "{e}"
    );

    // an index listing a shard that is not there
    let s = Scratch::of("tiny_tied", "noshard");
    std::fs::remove_file(s.0.join("model-00003-of-00004.safetensors")).unwrap();
    let e = s.load_err();
    assert!(e.contains("model-00003-of-00004.safetensors"), "{e}");

    // no weights at all, no config
    let s = Scratch::of("tiny", "noweights");
    std::fs::remove_file(s.0.join("model.safetensors")).unwrap();
    assert!(s.load_err().contains("no model.safetensors"));
    std::fs::remove_file(s.0.join("config.json")).unwrap();
    assert!(s.load_err().contains("no config.json"));
}

#[test]
fn random_weights_build_any_config() {
    let c = Config::from_file(fixture_dir("tiny_tied").join("config.json")).unwrap();
    let s = ScheduleSpec::parse("hybrid")
        .unwrap()
        .resolve(c.num_hidden_layers)
        .unwrap();
    let mut m = loading::random(&c, &s, DType::F32, &Device::Cpu, 1).unwrap();
    let l = m.forward_all(&ids(&[1, 2, 3, 4])).unwrap();
    assert_eq!(l.dims(), &[1, 4, 512]);
    assert!(all_finite(&l));
    // positions past max_position_embeddings and ids past the vocabulary are errors
    assert!(m
        .forward_all(&ids(&[600]))
        .unwrap_err()
        .to_string()
        .contains("vocabulary"));
    let long: Vec<u32> = (0..200).map(|i| i % 500).collect();
    m.clear_kv_cache();
    assert!(m
        .forward_all(&ids(&long))
        .unwrap_err()
        .to_string()
        .contains("max_position_embeddings"));
}

/// Rotating q and k in the model (what Fused-Softmax layers do, so the cache holds rotated
/// keys) computes the op's own Hadamard variant up to float rounding before quantization.
#[test]
fn model_side_hadamard_matches_the_ops_rotation() {
    use mxattn::attention::{Algorithm, FusedSoftmaxConfig};
    let (b, hq, hkv, n, d) = (1, 4, 2, 300, 128);
    let q = rand((b, hq, n, d), 11);
    let k = rand((b, hkv, n, d), 12);
    let v = rand((b, hkv, n, d), 13);
    // H/√d by the op's own fast transform applied to the identity
    let mut h = vec![0f32; d * d];
    for j in 0..d {
        let mut e = vec![0f32; d];
        e[j] = 1.0;
        mxattn::attention::hadamard::hadamard_rotate(&mut e);
        for i in 0..d {
            h[i * d + j] = e[i];
        }
    }
    let h = Tensor::from_vec(h, (d, d), &Device::Cpu).unwrap();
    let rot = |x: &Tensor| x.broadcast_matmul(&h.t().unwrap()).unwrap();
    let exact = attention(&q, &k, &v, &AttentionConfig::exact().with_causal(true)).unwrap();
    for name in ["fused-mxfp8", "fused-mxfp6", "fused-mxfp4"] {
        let spec = layer_preset(name).unwrap();
        assert!(spec.rotate_qk);
        let model_side =
            attention(&rot(&q), &rot(&k), &v, &spec.attn.clone().with_causal(true)).unwrap();
        let mut op_side_cfg = spec.attn.clone().with_causal(true);
        if let Algorithm::FusedSoftmax(f) = &mut op_side_cfg.algorithm {
            *f = FusedSoftmaxConfig {
                hadamard: true,
                ..*f
            };
        }
        let op_side = attention(&q, &k, &v, &op_side_cfg).unwrap();
        let rel = |a: &Tensor, b: &Tensor| {
            let num = (a - b)
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            let den = b
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            (num / den).sqrt()
        };
        let e_model = rel(&model_side, &exact);
        let e_op = rel(&op_side, &exact);
        let between = rel(&model_side, &op_side);
        println!("{name}: model-side {e_model:.4e} op-side {e_op:.4e} between {between:.4e}");
        // the same algorithm: equal error level, and far closer to each other than to exact
        assert!((e_model - e_op).abs() < 0.05 * e_op, "{name}");
        assert!(between < 0.2 * e_op, "{name}");
    }
}

/// A batch of two different prompts gives each row the logits it gets alone.
#[test]
fn batched_prompts_match_single_runs() {
    let e = expected("tiny");
    let a = e.prompt.clone();
    let b: Vec<u32> = e.prompt.iter().rev().copied().collect();
    for sched in ["exact", "mxfp4", "fused-mxfp6"] {
        let mut m = load("tiny", sched, DType::F32);
        let both = Tensor::new(vec![a.clone(), b.clone()], &Device::Cpu).unwrap();
        let lb = m.forward_all(&both).unwrap();
        let step = m
            .forward_last(&Tensor::new(&[[1u32], [2]], &Device::Cpu).unwrap())
            .unwrap();
        for (row, p, next) in [(0, &a, 1u32), (1, &b, 2)] {
            m.clear_kv_cache();
            let single = m.forward_all(&ids(p)).unwrap().squeeze(0).unwrap();
            assert!(
                max_abs_diff(&lb.i(row).unwrap(), &single) < 1e-5,
                "{sched} row {row}"
            );
            let s = m.forward_last(&ids(&[next])).unwrap().squeeze(0).unwrap();
            assert!(
                max_abs_diff(&step.i(row).unwrap(), &s) < 1e-5,
                "{sched} step {row}"
            );
        }
    }
}

/// What a kernel reading codes directly would see: MX K over all tokens, MX V over the
/// full 32-key blocks plus the raw tail, and the same values `dequantized` gives.
#[test]
fn cache_views_expose_codes_scales_and_the_tail() {
    use mxattn_llm::CachedOperand;
    let (b, h, n, d) = (1, 2, 77, 64);
    let k = rand((b, h, n, d), 21);
    let v = rand((b, h, n, d), 22);
    let f = mx(ElemFormat::E2M1, ScaleMode::Floor);
    let mut c = LayerKvCache::new(KvFormat { k: f, v: f });
    assert!(c.k_view().unwrap().is_none());
    c.push(&k, &v).unwrap();
    let (kd, vd) = c.dequantized().unwrap();
    match c.k_view().unwrap().unwrap() {
        CachedOperand::Mx {
            full: Some(m),
            tail: None,
        } => {
            assert_eq!(m.shape().dims(), &[b, h, n, d]);
            assert_eq!(m.codes().dims(), &[b, h, n, d / 2]);
            assert_eq!(bits(&m.dequantize().unwrap()), bits(&kd));
        }
        o => panic!("{o:?}"),
    }
    match c.v_view().unwrap().unwrap() {
        CachedOperand::Mx {
            full: Some(m),
            tail: Some(t),
        } => {
            assert_eq!(m.shape().dims(), &[b, h, 64, d]);
            assert_eq!(m.scales().dims(), &[b, h, d, 2]);
            // the tail is the raw input
            assert_eq!(bits(t), bits(&v.narrow(2, 64, 13).unwrap()));
            assert_eq!(bits(&vd.narrow(2, 64, 13).unwrap()), bits(t));
            assert_eq!(
                bits(&m.dequantize().unwrap()),
                bits(&vd.narrow(2, 0, 64).unwrap())
            );
        }
        o => panic!("{o:?}"),
    }
}

/// `--linear`: the schedule places FP8 projections where it says, and FP8 E4M3 projections
/// move the tiny model's logits from transformers' by what E4M3 allows. Rounding both
/// operands to 3 mantissa bits leaves about 2⁻⁴/√3 relative rms per operand, so ≈ 0.051 per
/// product and (with random signs) per GEMM output; the longest path crosses 4 GEMMs per
/// layer (q/k/v, o, gate/up, down), the errors adding in quadrature: 0.051·√(4n), doubled
/// for what the softmax and SiLU amplify. A wrong scale gives errors of order 1 or more; a
/// layer that silently stayed dense the f32 parity (< 1e-5).
#[test]
fn fp8_projections_follow_the_linear_schedule_within_e4m3_error() {
    use mxattn_llm::LinearSpec;
    let e = expected("tiny");
    let mut part = load("tiny", "exact", DType::F32);
    let n = part.config().num_hidden_layers;
    assert!(n >= 2);
    part.set_linears(&LinearSpec::parse("bf16@layers=0,kind=mlp;fp8").unwrap())
        .unwrap();
    // layer 0: attention FP8, MLP dense; the others all FP8
    assert_eq!(
        part.linear_summary(),
        format!("fp8: {}, bf16: 1", 2 * n - 1)
    );
    let mut all = load("tiny", "exact", DType::F32);
    all.set_linears(&LinearSpec::parse("fp8-block").unwrap())
        .unwrap();
    assert_eq!(all.linear_summary(), format!("fp8-block: {}", 2 * n));
    for (name, m) in [("part", &mut part), ("fp8-block", &mut all)] {
        let logits = m.forward_all(&ids(&e.prompt)).unwrap().squeeze(0).unwrap();
        let r = rel_diff(&logits, &e.prompt_logits);
        println!("{name}: logits rel-L2 vs transformers {r:.2e}");
        let bound = 2.0 * 0.051 * (4.0 * n as f64).sqrt();
        assert!(r > 1e-3, "{name}: the FP8 layers changed nothing");
        assert!(r < bound, "{name}: {r} is beyond E4M3's error ({bound})");
    }
    // FP8 does not convert back; unknown names and keys are errors that say so
    let err = all
        .set_linears(&LinearSpec::parse("bf16").unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot become dense"), "{err}");
    let err = LinearSpec::parse("fp8@kind=ffn;bf16")
        .unwrap_err()
        .to_string();
    assert!(err.contains("not one of attn, mlp"), "{err}");
}

/// A checkpoint in the layout of the official FP8 checkpoints (Qwen3-*-FP8: F8_E4M3 weights,
/// `weight_scale_inv` per 128 × 128 block, `quantization_config` fp8) loads as stored and
/// gives transformers' logits for the same FP8 arithmetic
/// (`scripts/gen_qwen3_fp8_fixtures.py`: the dequantized weights, and each projection's
/// input quantized per token and 128-wide group by a pre-hook with ml_dtypes' E4M3).
#[test]
fn fp8_checkpoint_loads_as_stored_and_matches_transformers() {
    let dir = fixture_dir("tiny_fp8");
    let want =
        candle_core::safetensors::load(dir.join("expected.safetensors"), &Device::Cpu).unwrap();
    let prompt: Vec<u32> = want["prompt"]
        .to_vec1::<i64>()
        .unwrap()
        .into_iter()
        .map(|x| x as u32)
        .collect();
    let files = CheckpointFiles::from_dir(&dir).unwrap();
    let cfg = Config::from_file(&files.component.config).unwrap();
    assert!(cfg.fp8_block_weights);
    let s = ScheduleSpec::parse("exact")
        .unwrap()
        .resolve(cfg.num_hidden_layers)
        .unwrap();
    let mut m = loading::load(&cfg, &files, &s, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(m.linear_summary(), "fp8-block: 4");
    let logits = m.forward_all(&ids(&prompt)).unwrap().squeeze(0).unwrap();
    let d = max_abs_diff(&logits, &want["prompt_logits"]);
    // the FP8 model is far from the dense one, so agreement is not vacuous
    let dense = expected("tiny");
    assert_eq!(dense.prompt, prompt);
    let apart = rel_diff(&want["prompt_logits"], &dense.prompt_logits);
    println!("FP8 checkpoint: max |Δlogit| vs transformers {d:.2e}; FP8 vs dense {apart:.2e}");
    assert!(
        apart > 1e-2,
        "the FP8 oracle is too close to the dense model: {apart}"
    );
    // f32 in both, summed in different orders; a code flipped by that would move a logit
    // by far more
    assert!(d < 1e-3, "max |Δlogit| {d}");
}

/// What a wrong FP8 checkpoint gets: errors that name the tensor and the file.
#[test]
fn fp8_checkpoint_errors_name_the_tensor() {
    let cfg_with = |q: &str| {
        let mut v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixture_dir("tiny").join("config.json")).unwrap(),
        )
        .unwrap();
        v["quantization_config"] = serde_json::from_str(q).unwrap();
        Config::from_json_str(&v.to_string())
    };
    let e = cfg_with(r#"{"quant_method": "awq"}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"awq\" is not supported"), "{e}");
    let e = cfg_with(r#"{"quant_method": "fp8", "weight_block_size": [64, 64]}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("[64,64] is not supported"), "{e}");
    // a dense checkpoint under an FP8 config: the weight's dtype is named
    let files = CheckpointFiles::from_dir(fixture_dir("tiny")).unwrap();
    let cfg = cfg_with(
        r#"{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}"#,
    )
    .unwrap();
    let e = loading::check_checkpoint(&cfg, &files)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("q_proj.weight has dtype F32") && e.contains("F8_E4M3"),
        "{e}"
    );
}
