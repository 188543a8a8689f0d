//! Quality of attention schedules on a decoder LLM (a Qwen3/Llama checkpoint directory, or
//! a GGUF such as SmolLM2), each against the BF16 exact run of the same model (models.md
//! §C1):
//!
//! * perplexity on a public-domain English text (default: *Pride and Prejudice* ch. 1–12,
//!   23,931 Qwen3 tokens, embedded; `evals/data/README.md`), teacher forced in windows of
//!   `--seq-len` tokens advancing by `--stride`, every token scored once;
//! * mean KL(P_baseline ‖ P_schedule) of the next-token distributions, per scored position;
//! * top-1 agreement: the share of positions where both argmaxes agree;
//! * greedy-continuation match length: `--prompts` prompts of `--prompt-len` tokens cut from
//!   the text, `--gen-len` greedy tokens each; how many leading tokens equal the baseline's.
//!
//! ```text
//! cargo run --release --bin llm_quality -- --smollm2          # after scripts/fetch_smollm2.sh
//! cargo run --release --bin llm_quality -- --model-dir DIR
//! cargo run --release --bin llm_quality -- --model-dir DIR --schedule hybrid --schedule mxfp4
//! ```
//!
//! On the tiny test checkpoints (vocab 512) use `--tokenizer bytes` (one token per UTF-8
//! byte): it exercises the code path, it measures nothing about real models.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor, D};
use clap::{CommandFactory, FromArgMatches, Parser};
use mxattn::attention::{Algorithm, FusedProbs};
use mxattn_cli::{progress_bar, DeviceArgs};
use mxattn_llm::generation::greedy;
use mxattn_llm::loading::{self, ModelSource};
use mxattn_llm::schedule::{linear_help, schedule_help};
use mxattn_llm::{chat, smollm2, CausalLm, LinearSpec, Schedule, ScheduleSpec};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

const DEFAULT_TEXT: &str = include_str!("data/pride_and_prejudice_ch1-12.txt");
const DEFAULT_SCHEDULES: &[&str] = &[
    "kv-mxfp8",
    "kv-mxfp4",
    "mxfp8",
    "mxfp6",
    "mxfp4",
    "hybrid",
    "fused-mxfp8",
    "fused-mxfp4",
    "efq",
];

#[derive(Parser, Debug)]
#[command(
    name = "llm_quality",
    about = "Perplexity, KL, top-1 agreement and greedy match of attention schedules vs the BF16 exact run of a decoder LLM"
)]
struct Args {
    /// Checkpoint directory (config.json, safetensors, tokenizer.json).
    #[arg(long, required_unless_present_any = ["gguf", "smollm2"], conflicts_with_all = ["gguf", "smollm2"])]
    model_dir: Option<PathBuf>,
    /// A GGUF file instead (tokenizer from the file).
    #[arg(long, conflicts_with = "smollm2")]
    gguf: Option<PathBuf>,
    /// SmolLM2-135M-Instruct from where scripts/fetch_smollm2.sh put it.
    #[arg(long)]
    smollm2: bool,
    /// Text to score (default: the embedded Pride and Prejudice ch. 1-12).
    #[arg(long)]
    text: Option<PathBuf>,
    /// tokenizer.json, or `bytes` (one token per UTF-8 byte; vocab ≥ 256). Default: the
    /// checkpoint's tokenizer.json, or the GGUF's tokenizer.
    #[arg(long)]
    tokenizer: Option<String>,
    /// A configuration to evaluate (repeatable): an attention schedule (grammar below),
    /// optionally `:LINEAR` with a linear schedule for the projections (`bf16:fp8`: BF16
    /// attention, FP8 projections; dense when not given). Default: kv-mxfp8, kv-mxfp4, mxfp8,
    /// mxfp6, mxfp4, hybrid, fused-mxfp8, fused-mxfp4, efq.
    #[arg(long = "schedule")]
    schedules: Vec<String>,
    /// The reference schedule.
    #[arg(long, default_value = "bf16")]
    baseline: String,
    /// Tokens per perplexity window.
    #[arg(long, default_value_t = 1024)]
    seq_len: usize,
    /// Window advance, < --seq-len (each window scores its last `stride` tokens; the first
    /// scores all).
    #[arg(long, default_value_t = 512)]
    stride: usize,
    /// Use only the first N tokens of the text.
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Greedy-continuation prompts.
    #[arg(long, default_value_t = 8)]
    prompts: usize,
    /// Tokens per prompt.
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Greedy tokens per prompt.
    #[arg(long, default_value_t = 32)]
    gen_len: usize,
    #[command(flatten)]
    dev: DeviceArgs,
    /// Override the P generation of every Fused-Softmax layer of the evaluated schedules
    /// (not the baseline): `u8` (the 8-bit code) or `fp32` (the f32 bit pattern). Default:
    /// each preset's own (fp32 for fused-mxfp8, u8 for fused-mxfp6/4).
    #[arg(long, value_parser = ["u8", "fp32"])]
    fused_probs: Option<String>,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// `s` with every Fused-Softmax layer's P generation set to `p` (its name tagged).
fn with_fused_probs(s: &Schedule, p: FusedProbs, tag: &str) -> Schedule {
    Schedule::from_layers(
        (0..s.len())
            .map(|i| {
                let mut spec = s.layer(i).clone();
                let mut name = s.layer_name(i).to_string();
                if let Algorithm::FusedSoftmax(f) = &mut spec.attn.algorithm {
                    f.probs = p;
                    name.push_str(tag);
                }
                (name, spec)
            })
            .collect(),
    )
}

#[derive(Serialize, Clone, Debug)]
struct Row {
    schedule: String,
    layers: String,
    ppl: f64,
    ppl_baseline: f64,
    /// mean over scored positions of KL(baseline ‖ schedule), nats
    mean_kl: f64,
    /// largest per-position KL
    max_kl: f64,
    top1_agreement: f64,
    greedy_match_mean: f64,
    greedy_full_matches: usize,
    kv_cache_bytes: usize,
    seconds: f64,
}

#[derive(Serialize)]
struct Report {
    model: String,
    text: String,
    text_tokens: usize,
    scored_positions: usize,
    seq_len: usize,
    stride: usize,
    baseline: String,
    dtype: String,
    device: String,
    prompts: usize,
    prompt_len: usize,
    gen_len: usize,
    rows: Vec<Row>,
}

/// Per-schedule sums over the windows.
#[derive(Default, Clone)]
struct Acc {
    nll: f64,
    kl: f64,
    max_kl: f64,
    agree: usize,
    n: usize,
    kv_bytes: usize,
    secs: f64,
}

/// Token windows `[start, end)` and the first scored target of each (every target once).
fn windows(n: usize, seq_len: usize, stride: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut prev_end = 0;
    let mut s = 0;
    loop {
        let e = (s + seq_len).min(n);
        let first_target = (s + 1).max(prev_end);
        if first_target < e {
            out.push((s, e, first_target));
        }
        prev_end = e;
        if e == n {
            break;
        }
        s += stride;
    }
    out
}

/// Log-probabilities `[rows, vocab]` of the rows predicting targets `first..end`.
fn window_logprobs(model: &mut CausalLm, ids: &[u32], w: (usize, usize, usize)) -> Result<Tensor> {
    let (s, e, first) = w;
    model.clear_kv_cache();
    let input = Tensor::new(&ids[s..e], model.device())?.unsqueeze(0)?;
    let logits = model.forward_all(&input)?.squeeze(0)?;
    // row r predicts token s + r + 1; keep the rows whose target is in first..e
    let rows = logits.narrow(0, first - 1 - s, e - first)?;
    Ok(candle_nn::ops::log_softmax(&rows, D::Minus1)?)
}

fn nll_sum(lp: &Tensor, targets: &[u32]) -> Result<f64> {
    let idx = Tensor::new(targets, lp.device())?.unsqueeze(1)?;
    let picked = lp.gather(&idx, 1)?.squeeze(1)?;
    Ok(-(picked.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?))
}

fn main() -> Result<()> {
    let cmd = Args::command().after_help(format!("{}\n{}", schedule_help(), linear_help()));
    let a = Args::from_arg_matches(&cmd.get_matches())?;
    if a.seq_len < 2 || a.stride == 0 || a.stride >= a.seq_len {
        // windows must overlap: the first token of a window is predicted by the last row
        // of the previous one
        bail!("need seq_len ≥ 2 and 0 < stride < seq_len");
    }
    let device = a.dev.device()?;
    let dtype = a.dev.dtype(&device)?;
    let baseline = ScheduleSpec::parse(&a.baseline)?;
    let names: Vec<String> = if a.schedules.is_empty() {
        DEFAULT_SCHEDULES.iter().map(|s| s.to_string()).collect()
    } else {
        a.schedules.clone()
    };
    // `ATTENTION[:LINEAR]`
    let mut specs: Vec<ScheduleSpec> = Vec::new();
    let mut linears: Vec<LinearSpec> = Vec::new();
    for n in &names {
        let (attn, lin) = n.split_once(':').unwrap_or((n, "bf16"));
        specs.push(ScheduleSpec::parse(attn).with_context(|| format!("{n:?}"))?);
        linears.push(LinearSpec::parse(lin).with_context(|| format!("{n:?}"))?);
    }

    let source = match (&a.model_dir, &a.gguf, a.smollm2) {
        (Some(d), _, _) => ModelSource::Dir(d.clone()),
        (None, Some(g), _) => ModelSource::Gguf(g.clone()),
        (None, None, true) => ModelSource::Gguf(smollm2::find().with_context(|| {
            format!(
                "--smollm2: no GGUF at {:?}; run scripts/fetch_smollm2.sh first",
                smollm2::default_path()
            )
        })?),
        (None, None, false) => bail!("give --model-dir DIR, --gguf FILE or --smollm2"),
    };
    // the last path component: reports name the model, not this machine's folders
    let model_name = match &source {
        ModelSource::Dir(p) | ModelSource::Gguf(p) => p.file_name().map_or_else(
            || p.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        ),
        _ => unreachable!("only directories and GGUF files are evaluated"),
    };
    let opened = loading::open(&source, &baseline, dtype, &device)?;
    // models[0] as loaded; one more per distinct linear schedule, which each run picks
    let mut models = vec![(LinearSpec::dense(), opened.model)];
    let mut which = Vec::with_capacity(linears.len());
    for l in &linears {
        let i = match models.iter().position(|(m, _)| m == l) {
            Some(i) => i,
            None => {
                let mut m = loading::open(&source, &baseline, dtype, &device)?.model;
                m.set_linears(l)?;
                println!("linear {}: {}", l.text(), m.linear_summary());
                models.push((l.clone(), m));
                models.len() - 1
            }
        };
        which.push(i);
    }
    let cfg = models[0].1.config().clone();
    let n_layers = cfg.num_hidden_layers;
    let vocab = cfg.vocab_size;
    let base_sched = baseline.resolve(n_layers)?;
    let mut scheds: Vec<Schedule> = specs
        .iter()
        .map(|s| s.resolve(n_layers))
        .collect::<candle_core::Result<_>>()?;
    let mut names = names;
    if let Some(p) = a.fused_probs.as_deref() {
        let (probs, tag) = match p {
            "u8" => (FusedProbs::U8Code, "/u8"),
            _ => (FusedProbs::Fp32Bits, "/fp32"),
        };
        scheds = scheds
            .iter()
            .map(|s| with_fused_probs(s, probs, tag))
            .collect();
        for n in &mut names {
            n.push_str(&format!(" (fused P: {p})"));
        }
    }

    let (text, text_name) = match &a.text {
        Some(p) => (
            std::fs::read_to_string(p).with_context(|| format!("{}", p.display()))?,
            p.display().to_string(),
        ),
        None => (
            DEFAULT_TEXT.to_string(),
            "Pride and Prejudice ch. 1-12 (embedded)".to_string(),
        ),
    };
    let mut ids: Vec<u32> = match a.tokenizer.as_deref() {
        Some("bytes") => text.bytes().map(u32::from).collect(),
        Some(p) => chat::encode(&chat::load_tokenizer(p)?, &text)?,
        None => match (&opened.tokenizer, &opened.gguf) {
            (Some(p), _) => chat::encode(&chat::load_tokenizer(p)?, &text)?,
            (None, Some(g)) => chat::encode(&g.tokenizer()?, &text)?,
            (None, None) => {
                bail!("{model_name}: no tokenizer.json; pass --tokenizer PATH (or `bytes`)")
            }
        },
    };
    if let Some(m) = a.max_tokens {
        ids.truncate(m);
    }
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        bail!("text token {bad} is outside the model's vocabulary ({vocab}); wrong tokenizer?");
    }
    if ids.len() < 2 {
        bail!("the text has fewer than 2 tokens");
    }
    let ctx_max = cfg.max_position_embeddings;
    if a.seq_len.min(ids.len()) > ctx_max {
        bail!(
            "--seq-len {} exceeds the model's max_position_embeddings ({ctx_max}); pass a smaller one",
            a.seq_len
        );
    }
    if a.prompt_len + a.gen_len > ctx_max {
        bail!(
            "--prompt-len {} + --gen-len {} exceeds the model's max_position_embeddings ({ctx_max})",
            a.prompt_len,
            a.gen_len
        );
    }
    let wins = windows(ids.len(), a.seq_len, a.stride);
    let scored: usize = wins.iter().map(|w| w.1 - w.2).sum();
    println!(
        "{}: {} layers, {dtype:?} on {device:?}; text: {text_name}, {} tokens, {} windows of ≤ {} (stride {}), {scored} scored",
        model_name,
        n_layers,
        ids.len(),
        wins.len(),
        a.seq_len,
        a.stride
    );

    let total = (wins.len() + a.prompts) as u64 * (1 + scheds.len()) as u64;
    let pb = progress_bar(total, "scoring", false);
    let mut base = Acc::default();
    let mut accs = vec![Acc::default(); scheds.len()];
    for &w in &wins {
        let targets = &ids[w.2..w.1];
        pb.set_message(format!("{} window {}..{}", a.baseline, w.0, w.1));
        let model = &mut models[0].1;
        model.set_schedule(&base_sched)?;
        let t0 = Instant::now();
        let lb = window_logprobs(model, &ids, w)?;
        base.secs += t0.elapsed().as_secs_f64();
        base.nll += nll_sum(&lb, targets)?;
        base.n += targets.len();
        base.kv_bytes = base.kv_bytes.max(model.kv_cache_bytes());
        let pb_base = lb.exp()?;
        let arg_b = lb.argmax(D::Minus1)?;
        pb.inc(1);
        for (i, s) in scheds.iter().enumerate() {
            pb.set_message(format!("{} window {}..{}", names[i], w.0, w.1));
            let model = &mut models[which[i]].1;
            model.set_schedule(s)?;
            let t0 = Instant::now();
            let lq = window_logprobs(model, &ids, w)?;
            let acc = &mut accs[i];
            acc.secs += t0.elapsed().as_secs_f64();
            acc.nll += nll_sum(&lq, targets)?;
            let kl = (&pb_base * (&lb - &lq)?)?.sum(D::Minus1)?;
            let kl = kl.to_dtype(DType::F64)?.to_vec1::<f64>()?;
            acc.kl += kl.iter().sum::<f64>();
            acc.max_kl = kl.iter().fold(acc.max_kl, |m, &x| m.max(x));
            let agree = arg_b
                .eq(&lq.argmax(D::Minus1)?)?
                .to_dtype(DType::F32)?
                .sum_all()?
                .to_scalar::<f32>()?;
            acc.agree += agree as usize;
            acc.n += targets.len();
            acc.kv_bytes = acc.kv_bytes.max(model.kv_cache_bytes());
            pb.inc(1);
        }
    }

    // greedy continuations from evenly spaced prompts
    let mut matches = vec![Vec::new(); scheds.len()];
    let span = ids.len().saturating_sub(a.prompt_len);
    for p in 0..a.prompts {
        if ids.len() < a.prompt_len || a.prompt_len == 0 {
            break;
        }
        let start = if a.prompts > 1 {
            span * p / (a.prompts - 1)
        } else {
            0
        };
        let prompt = &ids[start..start + a.prompt_len];
        let model = &mut models[0].1;
        model.set_schedule(&base_sched)?;
        let want = greedy(model, prompt, a.gen_len)?;
        pb.inc(1);
        for (i, s) in scheds.iter().enumerate() {
            pb.set_message(format!("{} greedy prompt {p}", names[i]));
            let model = &mut models[which[i]].1;
            model.set_schedule(s)?;
            let got = greedy(model, prompt, a.gen_len)?;
            let m = want.iter().zip(&got).take_while(|(x, y)| x == y).count();
            matches[i].push(m);
            pb.inc(1);
        }
    }
    pb.finish_and_clear();

    let ppl_b = (base.nll / base.n as f64).exp();
    let rows: Vec<Row> = scheds
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let acc = &accs[i];
            let m = &matches[i];
            Row {
                schedule: names[i].clone(),
                layers: s.summary(),
                ppl: (acc.nll / acc.n as f64).exp(),
                ppl_baseline: ppl_b,
                mean_kl: acc.kl / acc.n as f64,
                max_kl: acc.max_kl,
                top1_agreement: acc.agree as f64 / acc.n as f64,
                greedy_match_mean: if m.is_empty() {
                    0.0
                } else {
                    m.iter().sum::<usize>() as f64 / m.len() as f64
                },
                greedy_full_matches: m.iter().filter(|&&x| x == a.gen_len).count(),
                kv_cache_bytes: acc.kv_bytes,
                seconds: acc.secs,
            }
        })
        .collect();

    println!(
        "\nbaseline {}: perplexity {ppl_b:.4} over {} positions; KV cache {} bytes at {} tokens\n",
        a.baseline,
        base.n,
        base.kv_bytes,
        a.seq_len.min(ids.len())
    );
    println!("| schedule | perplexity | Δ vs baseline | mean KL (nats) | max KL | top-1 agree | greedy match (of {}) | full matches (of {}) | KV bytes | s |", a.gen_len, matches.first().map_or(0, |m| m.len()));
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.4} | {:+.4} | {:.3e} | {:.3e} | {:.4} | {:.2} | {} | {} | {:.1} |",
            r.schedule,
            r.ppl,
            r.ppl - r.ppl_baseline,
            r.mean_kl,
            r.max_kl,
            r.top1_agreement,
            r.greedy_match_mean,
            r.greedy_full_matches,
            r.kv_cache_bytes,
            r.seconds
        );
    }
    if let Some(p) = &a.json {
        let rep = Report {
            model: model_name.clone(),
            text: text_name,
            text_tokens: ids.len(),
            scored_positions: base.n,
            seq_len: a.seq_len,
            stride: a.stride,
            baseline: a.baseline.clone(),
            dtype: format!("{dtype:?}"),
            device: format!("{device:?}"),
            prompts: matches.first().map_or(0, |m| m.len()),
            prompt_len: a.prompt_len,
            gen_len: a.gen_len,
            rows,
        };
        std::fs::write(p, serde_json::to_string_pretty(&rep)? + "\n")
            .with_context(|| format!("{}", p.display()))?;
        println!("\nwrote {}", p.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::windows;

    /// Every target 1..n is scored exactly once, each with its window's context.
    #[test]
    fn windows_score_every_target_once() {
        for (n, l, s) in [
            (10, 4, 2),
            (2, 4, 1),
            (100, 32, 31),
            (101, 32, 7),
            (5, 5, 4),
            (3, 2, 1),
        ] {
            let w = windows(n, l, s);
            let mut seen = vec![0; n];
            for &(a, e, f) in &w {
                assert!(e - a <= l && a < f && f < e.max(f + 1));
                for c in &mut seen[f..e] {
                    *c += 1;
                }
            }
            assert_eq!(seen[0], 0);
            assert!(seen[1..].iter().all(|&c| c == 1), "{n} {l} {s}: {seen:?}");
        }
    }
}
