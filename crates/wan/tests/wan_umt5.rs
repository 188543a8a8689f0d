//! Wan's UMT5 text encoder: parity with transformers' `UMT5EncoderModel`, its T5 tokenizer and
//! diffusers' Wan prompt handling on a tiny random checkpoint (`scripts/gen_wan_umt5_fixtures.py`),
//! the relative-position buckets, prompt cleaning, loading (sharded, alternative embedding
//! name) and errors.

use candle_core::{DType, Device, Tensor};
use mxattn_wan::umt5::{
    expected_tensors, prompt_clean, relative_position_bucket, trim_and_pad, TextEncoder,
    Umt5Config, Umt5Encoder, DEFAULT_MAX_SEQUENCE_LENGTH, WAN_NEGATIVE_PROMPT,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod common;
use common::max_abs_diff;

const DEV: Device = Device::Cpu;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan/umt5")
}

fn expected() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixtures().join("expected.safetensors"), &DEV).unwrap()
}

fn meta() -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn max_len() -> usize {
    meta()["max_sequence_length"].as_u64().unwrap() as usize
}

fn prompts() -> Vec<String> {
    meta()["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

fn ids_vec(t: &Tensor) -> Vec<Vec<i64>> {
    t.to_dtype(DType::I64).unwrap().to_vec2::<i64>().unwrap()
}

fn text_encoder() -> TextEncoder {
    TextEncoder::from_paths(
        fixtures().join("tokenizer/tokenizer.json"),
        fixtures().join("text_encoder"),
        DType::F32,
        &DEV,
    )
    .unwrap()
    .with_max_sequence_length(max_len())
    .unwrap()
}

fn model() -> Umt5Encoder {
    Umt5Encoder::load(fixtures().join("text_encoder"), DType::F32, &DEV).unwrap()
}

/// A fresh scratch directory holding a copy of the fixture's config.json.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mxattn-umt5-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        fixtures().join("text_encoder/config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    dir
}

fn weights() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixtures().join("text_encoder/model.safetensors"), &DEV).unwrap()
}

#[test]
fn token_ids_match_transformers() {
    let e = expected();
    let te = text_encoder();
    let p = prompts();
    let refs: Vec<&str> = p.iter().map(|s| s.as_str()).collect();
    let t = te.tokenize(&refs).unwrap();
    assert_eq!(ids_vec(&t.input_ids), ids_vec(&e["input_ids"]));
    assert_eq!(ids_vec(&t.attention_mask), ids_vec(&e["attention_mask"]));
    let lens: Vec<usize> = meta()["seq_lens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(t.lengths, lens);
    // one prompt truncated to the max length with </s> last, one padded
    assert_eq!(lens[0], max_len());
    assert!(lens[1] < max_len());
    let ids = ids_vec(&t.input_ids);
    assert_eq!(ids[0][max_len() - 1], 1, "truncation keeps </s>");
    assert_eq!(ids[1][lens[1] - 1], 1);
    assert!(ids[1][lens[1]..].iter().all(|&x| x == 0));
}

#[test]
fn negative_prompt_tokens_match_at_512() {
    let e = expected();
    let te = TextEncoder::from_paths(
        fixtures().join("tokenizer/tokenizer.json"),
        fixtures().join("text_encoder"),
        DType::F32,
        &DEV,
    )
    .unwrap();
    assert_eq!(te.max_sequence_length(), DEFAULT_MAX_SEQUENCE_LENGTH);
    let t = te.tokenize(&[WAN_NEGATIVE_PROMPT]).unwrap();
    assert_eq!(t.input_ids.dims(), &[1, 512]);
    assert_eq!(ids_vec(&t.input_ids), ids_vec(&e["neg_input_ids"]));
    assert_eq!(
        ids_vec(&t.attention_mask),
        ids_vec(&e["neg_attention_mask"])
    );
}

#[test]
fn negative_prompt_is_wan_s() {
    assert_eq!(
        WAN_NEGATIVE_PROMPT,
        meta()["negative_prompt"].as_str().unwrap()
    );
}

#[test]
fn encoder_matches_transformers() {
    let e = expected();
    let m = model();
    let out = m
        .forward(&e["input_ids"], Some(&e["attention_mask"]))
        .unwrap();
    let want = &e["last_hidden_state"];
    let d = max_abs_diff(&out, want);
    let scale = want
        .abs()
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    println!(
        "last_hidden_state {:?}: max |diff| {d:.2e}, mean |x| {scale:.3}",
        out.dims()
    );
    assert!(scale > 0.1, "weak reference");
    assert!(d < 1e-4, "max |diff| {d:e} vs transformers");
}

#[test]
fn the_mask_matters_and_hides_padding() {
    let e = expected();
    let m = model();
    let ids = &e["input_ids"];
    let with = m.forward(ids, Some(&e["attention_mask"])).unwrap();
    let without = m.forward(ids, None).unwrap();
    // the short prompt sees its padding without the mask
    assert!(max_abs_diff(&with.get(1).unwrap(), &without.get(1).unwrap()) > 1e-2);
    // the full prompt has no padding: the mask changes nothing
    assert!(max_abs_diff(&with.get(0).unwrap(), &without.get(0).unwrap()) < 1e-6);
    // with the mask, the ids under the padding do not reach the real tokens
    let n = meta()["seq_lens"][1].as_u64().unwrap() as usize;
    let mut v = ids_vec(ids);
    for x in v[1][n..].iter_mut() {
        *x = 7;
    }
    let ids2 = Tensor::new(v, &DEV).unwrap();
    let other = m.forward(&ids2, Some(&e["attention_mask"])).unwrap();
    let real = |t: &Tensor| t.get(1).unwrap().narrow(0, 0, n).unwrap();
    assert!(max_abs_diff(&real(&with), &real(&other)) < 1e-6);
}

#[test]
fn prompt_embeds_match_diffusers() {
    let e = expected();
    let te = text_encoder();
    let p = prompts();
    let refs: Vec<&str> = p.iter().map(|s| s.as_str()).collect();
    let out = te.encode(&refs).unwrap();
    assert_eq!(out.dims(), &[2, max_len(), 32]);
    let want = &e["prompt_embeds"];
    let d = max_abs_diff(&out, want);
    println!("prompt_embeds: max |diff| {d:.2e}");
    assert!(d < 1e-4, "max |diff| {d:e} vs diffusers");
    // the rows after the short prompt are exactly zero, in both
    let n = meta()["seq_lens"][1].as_u64().unwrap() as usize;
    for t in [&out, want] {
        let tail = t.get(1).unwrap().narrow(0, n, max_len() - n).unwrap();
        assert_eq!(
            tail.abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            0.0
        );
    }
    // and the kept rows are the encoder's
    let h = te
        .model()
        .forward(&e["input_ids"], Some(&e["attention_mask"]))
        .unwrap();
    let kept = |t: &Tensor| t.get(1).unwrap().narrow(0, 0, n).unwrap();
    assert_eq!(max_abs_diff(&kept(&out), &kept(&h)), 0.0);
}

#[test]
fn relative_buckets_match_transformers() {
    let e = expected();
    let rel = e["relative_position"].to_vec1::<i64>().unwrap();
    let want = e["relative_bucket"].to_vec1::<i64>().unwrap();
    assert_eq!(rel.len(), 1201);
    let mut bad = Vec::new();
    for (r, w) in rel.iter().zip(&want) {
        let got = relative_position_bucket(*r, 32, 128) as i64;
        if got != *w {
            bad.push((*r, got, *w));
        }
    }
    assert!(bad.is_empty(), "(relative, ours, transformers): {bad:?}");
    // every bucket but 16 (distance 0 counts as "before") is reached
    let mut seen: Vec<i64> = want.clone();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, (0..32).filter(|&b| b != 16).collect::<Vec<_>>());
    // a few edges, by hand from the formula
    for (r, b) in [
        (0, 0),
        (-7, 7),
        (-8, 8),
        (7, 23),
        (16, 26),
        (-64, 14),
        (-63, 13),
        (128, 31),
        (-600, 15),
    ] {
        assert_eq!(relative_position_bucket(r, 32, 128), b, "distance {r}");
    }
}

#[test]
fn prompt_clean_matches_diffusers() {
    let m = meta();
    for case in m["clean_cases"].as_array().unwrap() {
        let (raw, want) = (case[0].as_str().unwrap(), case[1].as_str().unwrap());
        assert_eq!(prompt_clean(raw), want, "cleaning {raw:?}");
    }
    for (raw, want) in m["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .zip(m["cleaned"].as_array().unwrap())
    {
        assert_eq!(prompt_clean(raw.as_str().unwrap()), want.as_str().unwrap());
    }
}

#[test]
fn config_parses_and_xxl_is_umt5_xxl() {
    let cfg = Umt5Config::from_file(fixtures().join("text_encoder/config.json")).unwrap();
    assert_eq!(
        (
            cfg.d_model,
            cfg.d_ff,
            cfg.d_kv,
            cfg.num_heads,
            cfg.num_layers
        ),
        (32, 64, 6, 4, 2)
    );
    assert_eq!(cfg.inner_dim(), 24);
    let x = Umt5Config::umt5_xxl();
    assert_eq!(
        (
            x.d_model,
            x.d_ff,
            x.d_kv,
            x.num_heads,
            x.num_layers,
            x.vocab_size
        ),
        (4096, 10240, 64, 64, 24, 256384)
    );
    assert_eq!(
        (
            x.relative_attention_num_buckets,
            x.relative_attention_max_distance
        ),
        (32, 128)
    );
    x.validate().unwrap();
    // every layer has its own relative bias; 24·9 + embedding + final norm
    let names = expected_tensors(&x);
    assert_eq!(names.len(), 24 * 10 + 2);
    assert_eq!(
        names
            .iter()
            .filter(|(n, _)| n.ends_with("relative_attention_bias.weight"))
            .count(),
        24
    );
    let params: usize = names.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    assert!((5_600_000_000..5_800_000_000).contains(&params), "{params}");
}

#[test]
fn bad_configs_are_errors() {
    let dir = scratch("badcfg");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    v["feed_forward_proj"] = "relu".into();
    std::fs::write(dir.join("config.json"), v.to_string()).unwrap();
    let err = Umt5Config::from_file(dir.join("config.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("feed_forward_proj") && err.contains("config.json"),
        "{err}"
    );
    let c = Umt5Config {
        relative_attention_num_buckets: 2,
        ..Umt5Config::default()
    };
    assert!(c.validate().is_err());
    let c = Umt5Config {
        relative_attention_max_distance: 8,
        ..Umt5Config::default()
    };
    assert!(c.validate().is_err());
    let c = Umt5Config {
        d_kv: 0,
        ..Umt5Config::default()
    };
    assert!(c.validate().is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sharded_and_embed_tokens_checkpoints_load() {
    let e = expected();
    let want = model()
        .forward(&e["input_ids"], Some(&e["attention_mask"]))
        .unwrap();
    // two shards with an index, the embedding under its tied name
    let dir = scratch("sharded");
    let mut a = HashMap::new();
    let mut b = HashMap::new();
    let mut map = serde_json::Map::new();
    for (name, t) in weights() {
        let name = if name == "shared.weight" {
            "encoder.embed_tokens.weight".to_string()
        } else {
            name
        };
        let shard = if name.contains("block.1") {
            "b.safetensors"
        } else {
            "a.safetensors"
        };
        map.insert(name.clone(), shard.into());
        if shard == "a.safetensors" {
            a.insert(name, t);
        } else {
            b.insert(name, t);
        }
    }
    candle_core::safetensors::save(&a, dir.join("a.safetensors")).unwrap();
    candle_core::safetensors::save(&b, dir.join("b.safetensors")).unwrap();
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let files = mxattn_wan::umt5::find_files(&dir).unwrap();
    assert_eq!(files.weights.len(), 2);
    let got = Umt5Encoder::from_files(&files, DType::F32, &DEV)
        .unwrap()
        .forward(&e["input_ids"], Some(&e["attention_mask"]))
        .unwrap();
    assert_eq!(max_abs_diff(&got, &want), 0.0);
    // a pipeline directory finds text_encoder/
    let pipe = scratch("pipe");
    std::fs::remove_file(pipe.join("config.json")).unwrap();
    std::fs::rename(&dir, pipe.join("text_encoder")).unwrap();
    assert!(Umt5Encoder::load(&pipe, DType::F32, &DEV).is_ok());
    let _ = std::fs::remove_dir_all(&pipe);
}

#[test]
fn missing_or_misshaped_tensors_are_named() {
    let dir = scratch("missing");
    let missing = "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight";
    let mut w = weights();
    w.remove(missing);
    candle_core::safetensors::save(&w, dir.join("model.safetensors")).unwrap();
    let err = Umt5Encoder::load(&dir, DType::F32, &DEV)
        .unwrap_err()
        .to_string();
    println!("{err}");
    assert!(
        err.contains(missing) && err.contains("model.safetensors"),
        "{err}"
    );

    let mut w = weights();
    w.remove("shared.weight");
    candle_core::safetensors::save(&w, dir.join("model.safetensors")).unwrap();
    let err = Umt5Encoder::load(&dir, DType::F32, &DEV)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("shared.weight") && err.contains("encoder.embed_tokens.weight"),
        "{err}"
    );

    let name = "encoder.block.0.layer.1.DenseReluDense.wo.weight";
    let mut w = weights();
    w.insert(
        name.into(),
        Tensor::zeros((64, 32), DType::F16, &DEV).unwrap(),
    );
    candle_core::safetensors::save(&w, dir.join("model.safetensors")).unwrap();
    let err = Umt5Encoder::load(&dir, DType::F32, &DEV)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(name) && err.contains("[64, 32]") && err.contains("model.safetensors"),
        "{err}"
    );

    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let err = Umt5Encoder::load(&dir, DType::F32, &DEV)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_inputs_are_errors() {
    let m = model();
    let v = m.config().vocab_size as u32;
    let ids = Tensor::new(&[[3u32, v]], &DEV).unwrap();
    let err = m.forward(&ids, None).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    let ids = Tensor::new(&[[3u32, 1]], &DEV).unwrap();
    let mask = Tensor::new(&[[1u32, 1, 0]], &DEV).unwrap();
    assert!(m.forward(&ids, Some(&mask)).is_err());
    assert!(m
        .forward(&Tensor::new(&[3u32, 1], &DEV).unwrap(), None)
        .is_err());
    assert!(m
        .forward(&Tensor::new(&[[3f32, 1.]], &DEV).unwrap(), None)
        .is_err());
    let te = text_encoder();
    assert!(te.encode(&[]).is_err());
    assert!(text_encoder().with_max_sequence_length(0).is_err());
    assert!(trim_and_pad(&Tensor::zeros((1, 4, 2), DType::F32, &DEV).unwrap(), &[5]).is_err());
    assert!(TextEncoder::from_paths(
        fixtures().join("tokenizer/nope.json"),
        fixtures().join("text_encoder"),
        DType::F32,
        &DEV
    )
    .is_err());
}

#[test]
fn random_encoder_runs_in_f32_and_bf16() {
    let cfg = Umt5Config::from_file(fixtures().join("text_encoder/config.json")).unwrap();
    let e = expected();
    for dt in [DType::F32, DType::BF16] {
        let m = Umt5Encoder::random(&cfg, dt, &DEV, 3).unwrap();
        let out = m
            .forward(&e["input_ids"], Some(&e["attention_mask"]))
            .unwrap();
        assert_eq!(out.dtype(), dt);
        let out = out.to_dtype(DType::F32).unwrap();
        let s = out
            .abs()
            .unwrap()
            .mean_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(s.is_finite() && s > 0.1, "{dt:?}: mean |x| {s}");
    }
    // the fixture in bf16 stays close to the f32 reference
    let m = Umt5Encoder::load(fixtures().join("text_encoder"), DType::BF16, &DEV).unwrap();
    let out = m
        .forward(&e["input_ids"], Some(&e["attention_mask"]))
        .unwrap();
    let d = max_abs_diff(&out, &e["last_hidden_state"]);
    println!("bf16 fixture: max |diff| {d:.2e}");
    assert!(d < 0.1, "{d}");
}
