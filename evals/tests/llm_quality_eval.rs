//! `llm_quality` on the tiny fixture checkpoint: the code path runs end to end, a
//! schedule equal to the baseline scores as identical, and the perplexity is the one
//! computed here directly from the model's logits.

use candle_core::{DType, Device, Tensor, D};
use mxattn_llm::{loading, CheckpointFiles, Config, ScheduleSpec};
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn quality_eval_runs_on_the_tiny_checkpoint() {
    let dir = root().join("../crates/llm/tests/fixtures/qwen3/tiny");
    let out = std::env::temp_dir().join(format!("mxattn-qwen3-eval-{}.json", std::process::id()));
    // 100 byte tokens, one window: the perplexity can be recomputed below
    let text: String = root()
        .join("data/pride_and_prejudice_ch1-12.txt")
        .to_str()
        .unwrap()
        .into();
    let status = Command::new(env!("CARGO_BIN_EXE_llm_quality"))
        .args(["--model-dir", dir.to_str().unwrap()])
        .args([
            "--text",
            &text,
            "--tokenizer",
            "bytes",
            "--max-tokens",
            "100",
        ])
        .args(["--seq-len", "128", "--stride", "64"])
        .args(["--prompts", "2", "--prompt-len", "16", "--gen-len", "8"])
        .args([
            "--schedule",
            "bf16",
            "--schedule",
            "mxfp4",
            "--schedule",
            "mxfp6@layers=0;efq",
        ])
        .args(["--json", out.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(rep["text_tokens"], 100);
    assert_eq!(rep["scored_positions"], 99);
    let rows = rep["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap();

    // the baseline against itself: identical in every metric
    let same = &rows[0];
    assert_eq!(f(same, "mean_kl"), 0.0);
    assert_eq!(f(same, "top1_agreement"), 1.0);
    assert_eq!(f(same, "ppl"), f(same, "ppl_baseline"));
    assert_eq!(same["greedy_full_matches"], 2);
    assert_eq!(f(same, "greedy_match_mean"), 8.0);

    // quantized schedules differ, finitely
    for r in &rows[1..] {
        assert!(f(r, "mean_kl") > 0.0 && f(r, "mean_kl").is_finite(), "{r}");
        assert!(f(r, "max_kl") >= f(r, "mean_kl"));
        assert!(f(r, "ppl").is_finite() && f(r, "ppl") > 1.0);
        assert!((0.0..=1.0).contains(&f(r, "top1_agreement")));
        assert!(f(r, "greedy_match_mean") <= 8.0);
        assert!(r["kv_cache_bytes"].as_u64().unwrap() < same["kv_cache_bytes"].as_u64().unwrap());
    }
    assert_eq!(rows[2]["layers"], "mxfp6: 0; efq: 1");

    // perplexity of the baseline, from the logits directly
    let files = CheckpointFiles::from_dir(&dir).unwrap();
    let cfg = Config::from_file(&files.component.config).unwrap();
    let s = ScheduleSpec::parse("bf16").unwrap().resolve(2).unwrap();
    let mut m = loading::load(&cfg, &files, &s, DType::F32, &Device::Cpu).unwrap();
    let bytes: Vec<u32> = std::fs::read(&text).unwrap()[..100]
        .iter()
        .map(|&b| b as u32)
        .collect();
    let logits = m
        .forward_all(
            &Tensor::new(bytes.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap(),
        )
        .unwrap()
        .squeeze(0)
        .unwrap();
    let lp = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
    let lp = lp.to_vec2::<f32>().unwrap();
    let nll: f64 = (0..99)
        .map(|i| -(lp[i][bytes[i + 1] as usize] as f64))
        .sum();
    let ppl = (nll / 99.0).exp();
    let got = f(same, "ppl_baseline");
    assert!((got - ppl).abs() < 1e-6 * ppl, "{got} vs {ppl}");
}

/// `--fused-probs` reaches the Fused-Softmax layers and only them: the fused schedule's
/// row changes with it, the mxfp4 row does not.
#[test]
fn fused_probs_override_changes_only_fused_layers() {
    let dir = root().join("../crates/llm/tests/fixtures/qwen3/tiny");
    let text = root().join("data/pride_and_prejudice_ch1-12.txt");
    let run = |probs: &str| -> serde_json::Value {
        let out = std::env::temp_dir().join(format!(
            "mxattn-llm-eval-probs-{probs}-{}.json",
            std::process::id()
        ));
        let status = Command::new(env!("CARGO_BIN_EXE_llm_quality"))
            .args(["--model-dir", dir.to_str().unwrap()])
            .args(["--text", text.to_str().unwrap(), "--tokenizer", "bytes"])
            .args(["--max-tokens", "100", "--seq-len", "128", "--stride", "64"])
            .args(["--prompts", "1", "--prompt-len", "16", "--gen-len", "4"])
            .args(["--schedule", "fused-mxfp8", "--schedule", "mxfp4"])
            .args(["--fused-probs", probs])
            .args(["--json", out.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(status.success());
        let rep = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let _ = std::fs::remove_file(&out);
        rep
    };
    let (a, b) = (run("u8"), run("fp32"));
    let kl = |r: &serde_json::Value, i: usize| r["rows"][i]["mean_kl"].as_f64().unwrap();
    assert_ne!(
        kl(&a, 0),
        kl(&b, 0),
        "the fused row must follow --fused-probs"
    );
    assert_eq!(
        kl(&a, 1),
        kl(&b, 1),
        "the mxfp4 row has no Fused-Softmax layer"
    );
    assert_eq!(a["rows"][0]["layers"], "fused-mxfp8/u8: 0-1");
    assert_eq!(b["rows"][0]["schedule"], "fused-mxfp8 (fused P: fp32)");
}
