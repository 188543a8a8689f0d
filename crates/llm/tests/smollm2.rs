//! SmolLM2-135M-Instruct (GGUF, `scripts/fetch_smollm2.sh`) against Hugging Face
//! transformers on the same file (`scripts/gen_smollm2_fixtures.py`): the tokenizer built
//! from the metadata, the chat template, exact-path logits, greedy continuations; every
//! attention config end to end; GGUF errors.
//!
//! Without the GGUF the model tests print why and pass, unless `MXATTN_REQUIRE_SMOLLM2` is
//! set (CI sets it), when they fail.

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, IndexOp, Tensor};
use mxattn::attention::PRESETS as LAYER_PRESETS;
use mxattn_llm::chat::{ChatTemplate, Message, Role};
use mxattn_llm::generation::greedy;
use mxattn_llm::schedule::SCHEDULE_PRESETS;
use mxattn_llm::{smollm2, Arch, CausalLm, GgufFile, ScheduleSpec};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

fn gguf_path() -> Option<PathBuf> {
    match smollm2::find() {
        Some(p) => Some(p),
        None if std::env::var_os(smollm2::REQUIRE_ENV).is_some() => panic!(
            "{} is set but the SmolLM2 GGUF is not at {:?}: run scripts/fetch_smollm2.sh",
            smollm2::REQUIRE_ENV,
            smollm2::default_path()
        ),
        None => {
            eprintln!(
                "SKIPPED: the SmolLM2 GGUF is not at {:?}; run scripts/fetch_smollm2.sh (set {} to \
                 make this an error)",
                smollm2::default_path(),
                smollm2::REQUIRE_ENV
            );
            None
        }
    }
}

fn fixtures() -> Json {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2/expected.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn u32s(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn f32s(v: &Json) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn load(g: &GgufFile, schedule: &str, dtype: DType) -> CausalLm {
    let cfg = g.config().unwrap();
    let s = ScheduleSpec::parse(schedule)
        .unwrap()
        .resolve(cfg.num_hidden_layers)
        .unwrap();
    g.load(&s, dtype, &Device::Cpu).unwrap()
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

fn lse(row: &[f32]) -> f64 {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
}

// ---------------------------------------------------------------- metadata, tokenizer

#[test]
fn config_comes_from_the_metadata() {
    let Some(p) = gguf_path() else { return };
    let cfg = GgufFile::open(&p).unwrap().config().unwrap();
    // the published architecture of SmolLM2-135M (its model card / config.json)
    assert_eq!(cfg.arch, Arch::Llama);
    assert_eq!(cfg.num_hidden_layers, 30);
    assert_eq!(cfg.hidden_size, 576);
    assert_eq!(cfg.intermediate_size, 1536);
    assert_eq!(
        (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim
        ),
        (9, 3, 64)
    );
    assert_eq!(cfg.rope_theta, 100_000.0);
    assert_eq!(cfg.vocab_size, 49152);
    assert!(cfg.tie_word_embeddings);
    assert!(!cfg.qk_norm() && !cfg.qkv_bias() && !cfg.o_bias());
    assert!((cfg.rms_norm_eps - 1e-5).abs() < 1e-12);
}

#[test]
fn tokenizer_ids_match_transformers() {
    let Some(p) = gguf_path() else { return };
    let tok = GgufFile::open(&p).unwrap().tokenizer().unwrap();
    let fx = fixtures();
    let cases = fx["tokenizer_cases"]
        .as_array()
        .unwrap()
        .iter()
        .chain(fx["chat_cases"].as_array().unwrap());
    let mut n = 0;
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want = u32s(&c["ids"]);
        let got = tok.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(got, want, "ids of {text:?}");
        // byte-level BPE decodes back to the text, special tokens included
        assert_eq!(tok.decode(&got, false).unwrap(), text);
        n += 1;
    }
    assert!(n >= 8);
}

#[test]
fn chat_template_renders_as_transformers() {
    let Some(p) = gguf_path() else { return };
    let g = GgufFile::open(&p).unwrap();
    let src = g
        .chat_template()
        .unwrap()
        .expect("the GGUF has a chat template");
    let t = ChatTemplate::new(&src, "<|im_start|>", "<|im_end|>").unwrap();
    for c in fixtures()["chat_cases"].as_array().unwrap() {
        let msgs: Vec<Message> = c["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let role = match m["role"].as_str().unwrap() {
                    "system" => Role::System,
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    r => panic!("role {r}"),
                };
                Message::new(role, m["content"].as_str().unwrap())
            })
            .collect();
        assert_eq!(t.render(&msgs, true).unwrap(), c["text"].as_str().unwrap());
    }
}

// ---------------------------------------------------------------- parity with HF

/// The exact path in f32 against transformers in f32 on the same dequantized weights.
///
/// Tolerance: both sides compute the same f32 function in a different order (matmul
/// blocking, softmax, RMSNorm reductions), each op differing by a few ulp (~1e-7
/// relative). Through 30 layers we measure at most 5e-6 of the row's largest |logit|
/// (≈ 20, so ~1e-4 absolute) over all three prompts, the 874-token one included. We allow
/// 1e-4 of that scale (0.002 absolute): 20× above what we see, and far below a real error
/// (without the q/k un-permutation the first rows are already off by 3e-2 of the scale; a
/// wrong norm or RoPE moves logits by whole units). The greedy check below is the sharper
/// one: its smallest top-1/top-2 gap is 0.014.
#[test]
fn exact_logits_match_transformers() {
    let Some(p) = gguf_path() else { return };
    let g = GgufFile::open(&p).unwrap();
    let mut m = load(&g, "exact", DType::F32);
    let fx = fixtures();
    let (s0, s1) = (
        fx["slice"][0].as_u64().unwrap() as usize,
        fx["slice"][1].as_u64().unwrap() as usize,
    );
    for pr in fx["prompts"].as_array().unwrap() {
        let name = pr["name"].as_str().unwrap();
        let prompt = u32s(&pr["ids"]);
        m.clear_kv_cache();
        let logits = m.forward_all(&ids(&prompt)).unwrap().squeeze(0).unwrap();
        let mut worst = 0f64;
        for row in pr["rows"].as_array().unwrap() {
            let pos = row["pos"].as_u64().unwrap() as usize;
            let got = logits.i(pos).unwrap().to_vec1::<f32>().unwrap();
            let top_ids = u32s(&row["top_ids"]);
            let top_vals = f32s(&row["top_values"]);
            let scale = top_vals[0].abs().max(1.0) as f64;
            let mut d = 0f64;
            for (&i, &v) in top_ids.iter().zip(&top_vals) {
                d = d.max((got[i as usize] - v).abs() as f64);
            }
            for (j, &v) in f32s(&row["slice"]).iter().enumerate() {
                d = d.max((got[s0 + j] - v).abs() as f64);
            }
            assert_eq!(s1 - s0, f32s(&row["slice"]).len());
            d = d.max((lse(&got) - row["lse"].as_f64().unwrap()).abs());
            // the argmax agrees (the fixture's top-1 is at least 0.01 above the rest)
            let argmax = got
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |a, (i, &v)| if v > a.1 { (i, v) } else { a },
                )
                .0;
            if (top_vals[0] - top_vals[1]) > 0.01 {
                assert_eq!(argmax as u32, top_ids[0], "{name} pos {pos}: argmax");
            }
            let rel = d / scale;
            worst = worst.max(rel);
            assert!(
                rel <= 1e-4,
                "{name} pos {pos}: max |Δlogit| {d:.3e} = {rel:.2e} of the row's scale"
            );
        }
        println!(
            "{name}: {} tokens, worst |Δlogit| / max|logit| vs transformers = {worst:.2e}",
            prompt.len()
        );
    }
}

#[test]
fn greedy_continuations_match_transformers() {
    let Some(p) = gguf_path() else { return };
    let g = GgufFile::open(&p).unwrap();
    let mut m = load(&g, "exact", DType::F32);
    for pr in fixtures()["prompts"].as_array().unwrap() {
        let want = u32s(&pr["continuation"]);
        let got = greedy(&mut m, &u32s(&pr["ids"]), want.len()).unwrap();
        assert_eq!(got, want, "{}", pr["name"]);
    }
}

// ---------------------------------------------------------------- every config

#[test]
fn every_preset_and_schedule_runs_on_smollm2_with_finite_logits() {
    let Some(p) = gguf_path() else { return };
    let g = GgufFile::open(&p).unwrap();
    let fx = fixtures();
    let pr = &fx["prompts"][1];
    let prompt = u32s(&pr["ids"]);
    let cont = u32s(&pr["continuation"]);
    let mut m = load(&g, "exact", DType::F32);
    let base = m.forward_all(&ids(&prompt)).unwrap();
    let n_layers = m.config().num_hidden_layers;
    let mut names: Vec<String> = LAYER_PRESETS.iter().map(|(n, _)| n.to_string()).collect();
    names.extend(SCHEDULE_PRESETS.iter().map(|(n, _, _)| n.to_string()));
    for name in &names {
        let s = ScheduleSpec::parse(name)
            .unwrap()
            .resolve(n_layers)
            .unwrap();
        m.set_schedule(&s).unwrap();
        let logits = m.forward_all(&ids(&prompt)).unwrap();
        assert!(all_finite(&logits), "{name}: non-finite prefill logits");
        for &t in &cont[..4] {
            let l = m.forward_last(&ids(&[t])).unwrap();
            assert!(all_finite(&l), "{name}: non-finite decode logits");
        }
        let d = mxattn::oracle::max_abs_diff(&logits, &base).unwrap();
        if name == "exact" {
            assert_eq!(d, 0.0);
        } else {
            assert!(d > 0.0, "{name}: logits identical to exact");
        }
        println!("{name:<16} max |Δlogit| vs exact {d:.3e}");
    }
}

#[test]
fn bf16_weights_stay_near_f32() {
    let Some(p) = gguf_path() else { return };
    let g = GgufFile::open(&p).unwrap();
    let pr = &fixtures()["prompts"][0];
    let prompt = u32s(&pr["ids"]);
    let a = load(&g, "exact", DType::F32)
        .forward_all(&ids(&prompt))
        .unwrap();
    let mut m = load(&g, "exact", DType::BF16);
    assert_eq!(m.dtype(), DType::BF16);
    let b = m.forward_all(&ids(&prompt)).unwrap();
    assert!(all_finite(&b));
    // bf16 keeps 8 bits: the last position's argmax (the answer's first token) survives
    let am = |t: &Tensor| {
        t.i((0, prompt.len() - 1))
            .unwrap()
            .argmax(0)
            .unwrap()
            .to_scalar::<u32>()
            .unwrap()
    };
    assert_eq!(am(&a), am(&b));
}

// ---------------------------------------------------------------- errors

/// A tiny Llama GGUF (2 layers, hidden 64) written with candle's writer, minus `drop_key`
/// and `drop_tensor`.
fn tiny_gguf(path: &Path, drop_key: Option<&str>, drop_tensor: Option<&str>) {
    let (h, i, nh, nkv, d, v) = (64usize, 128usize, 2usize, 1usize, 32usize, 16usize);
    let md: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(2)),
        ("llama.context_length", Value::U32(64)),
        ("llama.embedding_length", Value::U32(h as u32)),
        ("llama.feed_forward_length", Value::U32(i as u32)),
        ("llama.attention.head_count", Value::U32(nh as u32)),
        ("llama.attention.head_count_kv", Value::U32(nkv as u32)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.vocab_size", Value::U32(v as u32)),
    ];
    let md: Vec<(&str, Value)> = md
        .into_iter()
        .filter(|(k, _)| Some(*k) != drop_key)
        .collect();
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("token_embd.weight".into(), vec![v, h]),
        ("output_norm.weight".into(), vec![h]),
    ];
    for l in 0..2 {
        for (n, s) in [
            ("attn_norm", vec![h]),
            ("ffn_norm", vec![h]),
            ("attn_q", vec![nh * d, h]),
            ("attn_k", vec![nkv * d, h]),
            ("attn_v", vec![nkv * d, h]),
            ("attn_output", vec![h, nh * d]),
            ("ffn_gate", vec![i, h]),
            ("ffn_up", vec![i, h]),
            ("ffn_down", vec![h, i]),
        ] {
            shapes.push((format!("blk.{l}.{n}.weight"), s));
        }
    }
    let tensors: Vec<(String, QTensor)> = shapes
        .into_iter()
        .filter(|(n, _)| Some(n.as_str()) != drop_tensor)
        .map(|(n, s)| {
            let t = Tensor::randn(0f32, 0.1, s, &Device::Cpu).unwrap();
            (n, QTensor::quantize(&t, GgmlDType::F32).unwrap())
        })
        .collect();
    let mdr: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (*k, v)).collect();
    let tr: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &mdr, &tr).unwrap();
}

fn scratch(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("mxattn-gguf-{tag}-{}.gguf", std::process::id()))
}

#[test]
fn a_tiny_gguf_loads_and_runs() {
    let p = scratch("ok");
    tiny_gguf(&p, None, None);
    let g = GgufFile::open(&p).unwrap();
    let cfg = g.config().unwrap();
    assert_eq!((cfg.head_dim, cfg.num_hidden_layers), (32, 2));
    assert!(cfg.tie_word_embeddings);
    let mut m = load(&g, "mxfp4", DType::F32);
    let l = m.forward_all(&ids(&[1, 2, 3])).unwrap();
    assert!(all_finite(&l));
    // no tokenizer in this file: an error naming the key
    let e = g.tokenizer().unwrap_err().to_string();
    assert!(e.contains("tokenizer.ggml.model"), "{e}");
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn missing_keys_and_tensors_are_named() {
    let p = scratch("nokey");
    tiny_gguf(&p, Some("llama.block_count"), None);
    let e = GgufFile::open(&p)
        .unwrap()
        .config()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("llama.block_count") && e.contains("mxattn-gguf-nokey"),
        "{e}"
    );
    std::fs::remove_file(&p).unwrap();

    let p = scratch("notensor");
    tiny_gguf(&p, None, Some("blk.1.attn_k.weight"));
    let g = GgufFile::open(&p).unwrap();
    let s = ScheduleSpec::parse("exact").unwrap().resolve(2).unwrap();
    let e = g
        .load(&s, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("blk.1.attn_k.weight") && e.contains("model.layers.1.self_attn.k_proj.weight"),
        "{e}"
    );
    std::fs::remove_file(&p).unwrap();

    let e = GgufFile::open(scratch("absent")).err().unwrap().to_string();
    assert!(e.contains("mxattn-gguf-absent"), "{e}");
}

#[test]
fn an_unsupported_tensor_type_is_a_clear_error() {
    let p = scratch("iq");
    tiny_gguf(&p, None, None);
    // Rewrite the type of `output_norm.weight` (F32 = 0) to 20 (IQ4_NL), which candle does
    // not read: in the tensor index the name is followed by n_dims (u32), the dims (u64
    // each) and the type (u32).
    let mut bytes = std::fs::read(&p).unwrap();
    let name = b"output_norm.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap();
    let ty = at + name.len() + 4 + 8;
    assert_eq!(&bytes[ty..ty + 4], &0u32.to_le_bytes());
    bytes[ty..ty + 4].copy_from_slice(&20u32.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let e = GgufFile::open(&p).err().unwrap().to_string();
    assert!(
        e.contains("20") && e.contains("Q4_1") && e.contains("mxattn-gguf-iq"),
        "{e}"
    );
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn a_qwen3_config_json_still_has_its_norms_and_a_llama_one_has_none() {
    let base = r#""vocab_size": 16, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64,
      "rms_norm_eps": 1e-6, "rope_theta": 10000.0"#;
    let c = |t: &str| mxattn_llm::Config::from_json_str(&format!("{{{base}{t}}}"));
    let q3 = c("").unwrap();
    assert!(q3.arch == Arch::Qwen3 && q3.qk_norm() && !q3.qkv_bias());
    let ll = c(r#", "model_type": "llama""#).unwrap();
    assert!(ll.arch == Arch::Llama && !ll.qk_norm() && !ll.qkv_bias());
    let q2 = c(r#", "model_type": "qwen2""#).unwrap();
    assert!(!q2.qk_norm() && q2.qkv_bias() && !q2.o_bias());
    let e = c(r#", "model_type": "mamba""#).unwrap_err().to_string();
    assert!(e.contains("mamba"), "{e}");
    // every architecture builds and runs on random weights
    for cfg in [q3, ll, q2] {
        let s = ScheduleSpec::parse("exact").unwrap().resolve(1).unwrap();
        let mut m = mxattn_llm::loading::random(&cfg, &s, DType::F32, &Device::Cpu, 1).unwrap();
        assert!(all_finite(&m.forward_all(&ids(&[1, 2])).unwrap()));
    }
}
