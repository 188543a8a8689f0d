//! Chat with a decoder LLM (Qwen3, Llama/SmolLM2, Qwen2) through mxattn's quantized attention.
//!
//!     scripts/fetch_smollm2.sh && cargo run --release --example chat -- --smollm2 -i
//!     cargo run --release --example chat -- --gguf FILE --attn mxfp6 --prompt "Why is the sky blue?"
//!     cargo run --release --example chat -- --model Qwen/Qwen3-0.6B --prompt "Why is the sky blue?"
//!     cargo run --release --example chat -- --model-dir DIR --attn-schedule hybrid --no-think
//!     cargo run --release --example chat -- --random-weights --model Qwen/Qwen3-8B \
//!         --device cuda --dtype bf16 --prompt-len 4096 --max-tokens 128 --ignore-eos --attn mxfp4
//!
//! `--help` documents every flag and the schedule grammar.

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser};
use mxattn_cli::spans::SpanTimes;
use mxattn_cli::{AttnArgs, AttnChoice, DeviceArgs, ModelArgs};

/// The model `--model` names when it is not given.
const DEFAULT_MODEL: &str = "Qwen/Qwen3-8B";
use mxattn_llm::chat::{self, ChatTemplate, Message, Role, TextStream};
use mxattn_llm::generation::{generate, Sampler, SamplingParams};
use mxattn_llm::loading::{self, ModelSource};
use mxattn_llm::schedule::{linear_help, schedule_help};
use mxattn_llm::{smollm2, CausalLm, Config, LinearSpec, ScheduleSpec, Tokenizer};
use std::io::{BufRead, Write};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "chat",
    about = "Chat with a decoder LLM (Qwen3, Llama/SmolLM2, Qwen2) with quantized (MX) attention and a KV cache in each layer's format",
    long_about = "Chat with a decoder LLM (Qwen3, Llama/SmolLM2, Qwen2) with quantized (MX) attention: \
every layer's attention goes through mxattn::attention with the config of --attn or --attn-schedule, \
and its KV cache stores K/V in that layer's format (bf16, or MX codes + E8M0 scales). Streams the \
answer, then prints prefill and decode tokens/s and the KV-cache size. With -i, a conversation: one \
user turn per line of standard input, until an empty line or end of input.\n\n\
Quick start on a CPU (SmolLM2-135M-Instruct, 98 MB, runs on 2 cores):\n  \
scripts/fetch_smollm2.sh\n  \
cargo run --release --example chat -- --smollm2 -i\n\n\
Weights: --smollm2 (the GGUF scripts/fetch_smollm2.sh fetched), or --gguf FILE (a llama.cpp GGUF of the \
Llama, Qwen2 or Qwen3 architecture with a byte-level BPE tokenizer, pre-tokenizer smollm or gpt2; \
weights dequantized to --dtype; the tokenizer and the chat template come from the file), or --model OWNER/NAME through the Hugging Face cache (default Qwen/Qwen3-8B), or \
--model-dir DIR holding config.json, tokenizer.json and model.safetensors (or shards with \
model.safetensors.index.json), or --random-weights for the architecture of --config, of \
--model-dir's config.json, or the built-in config of --model."
)]
struct Args {
    /// A GGUF file (llama.cpp's format; tested with SmolLM2, a Llama); the tokenizer and
    /// the chat template are read from it.
    #[arg(long, conflicts_with_all = ["model", "model_dir", "random_weights", "smollm2"])]
    gguf: Option<PathBuf>,
    /// SmolLM2-135M-Instruct from where scripts/fetch_smollm2.sh put it
    /// ($MXATTN_SMOLLM2_DIR, else ~/.cache/mxattn/smollm2).
    #[arg(long, conflicts_with_all = ["model", "model_dir", "random_weights"])]
    smollm2: bool,
    #[command(flatten)]
    src: ModelArgs,
    /// config.json for --random-weights (else --model-dir's, else the built-in config of
    /// --model).
    #[arg(long)]
    config: Option<PathBuf>,
    /// tokenizer.json (default: the checkpoint's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,

    /// The user message (default: "Give me a short introduction to large language
    /// models.", except with -i, which then starts with the first line of input).
    #[arg(long)]
    prompt: Option<String>,
    /// An optional system message.
    #[arg(long)]
    system: Option<String>,
    /// Qwen3 checkpoints: thinking off, the assistant turn starts with an empty
    /// <think></think> block (enable_thinking=False). GGUF models use their own template.
    #[arg(long)]
    no_think: bool,
    /// A conversation: read one user turn per line of standard input (after --prompt, if
    /// given explicitly) until an empty line or the end of input.
    #[arg(short, long)]
    interactive: bool,
    /// Use --prompt as it is, without the chat template.
    #[arg(long)]
    raw_prompt: bool,
    /// Instead of --prompt, N pseudo-random token ids (speed runs; no tokenizer needed).
    #[arg(long)]
    prompt_len: Option<usize>,

    /// Most tokens to generate.
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// Keep generating past <|im_end|> / <|endoftext|> (speed runs).
    #[arg(long)]
    ignore_eos: bool,
    /// Sampling temperature; 0 = greedy. Default: Qwen3's model card, 0.6 with thinking
    /// and 0.7 without; SmolLM2's (GGUF), 0.2.
    #[arg(long)]
    temperature: Option<f64>,
    /// Nucleus sampling (default 0.95 thinking, 0.8 not; GGUF 0.9).
    #[arg(long)]
    top_p: Option<f64>,
    /// Top-k sampling (default 20).
    #[arg(long)]
    top_k: Option<usize>,
    /// Greedy decoding (= --temperature 0), for A/B comparisons of schedules.
    #[arg(long)]
    greedy: bool,
    /// Sampling seed.
    #[arg(long, default_value_t = 299792458)]
    seed: u64,
    /// Repeat penalty (1.0 = off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Tokens the repeat penalty looks back on.
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,

    /// --cpu, --device, --dtype.
    #[command(flatten)]
    dev: DeviceArgs,

    /// --attn (default bf16) and --attn-schedule, e.g. "mxfp6@layers=0-3+last;mxfp4" or
    /// "hybrid".
    #[command(flatten)]
    attn: AttnArgs,
    /// The decoder layers' projections: bf16 (as loaded, in --dtype), fp8 (FP8 E4M3
    /// weights with a scale per output channel, quantized at load, per-token FP8
    /// activations), fp8-tensor, fp8-block, or a linear schedule over layers and kind
    /// (attn|mlp), e.g. "bf16@layers=0+last;fp8" (see below). The embeddings and the
    /// output head stay in --dtype.
    #[arg(long, default_value = "bf16")]
    linear: String,
    /// Print only the statistics, not the text.
    #[arg(long)]
    quiet: bool,
    /// Time each stage of the decode steps (projections, norms, RoPE, cache append,
    /// attention, MLP, output head, sampling) and print where a token's time goes. Every
    /// stage synchronizes the device before and after, so the steps run slower than
    /// without it: the shares are the measurement, not the tokens/s.
    #[arg(long)]
    profile: bool,
    /// Write the run's statistics as JSON here (load time, per turn: prompt tokens, time to
    /// first token, prefill and decode tokens/s, KV-cache bytes).
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> Result<()> {
    let cmd = Args::command().after_help(format!("{}\n{}", schedule_help(), linear_help()));
    let args = Args::from_arg_matches(&cmd.get_matches())?;
    run(args)
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

const DEFAULT_PROMPT: &str = "Give me a short introduction to large language models.";

/// How a conversation becomes prompt text.
enum Format {
    /// `--raw-prompt`: the user text as it is.
    Raw,
    /// The model's own Jinja template (GGUF).
    Template(Box<ChatTemplate>),
    /// Qwen3's template, written out in `mxattn_llm::chat`.
    Qwen3 { thinking: bool },
}

impl Format {
    fn render(&self, msgs: &[Message]) -> Result<String> {
        Ok(match self {
            Self::Raw => msgs.last().map(|m| m.content.clone()).unwrap_or_default(),
            Self::Template(t) => t.render(msgs, true)?,
            Self::Qwen3 { thinking } => chat::chat_prompt(msgs, *thinking)?,
        })
    }
}

fn run(a: Args) -> Result<()> {
    let device = a.dev.device()?;
    let dtype = a.dev.dtype(&device)?;
    let schedule = match a.attn.choice("bf16") {
        AttnChoice::Schedule(t) => ScheduleSpec::parse(t)?,
        AttnChoice::Uniform(n) => ScheduleSpec::uniform(n)?,
    };
    let linear = LinearSpec::parse(&a.linear).context("--linear")?;
    let source = if a.smollm2 {
        let p = smollm2::find().with_context(|| {
            format!(
                "--smollm2: no GGUF at {:?}; run scripts/fetch_smollm2.sh first",
                smollm2::default_path()
            )
        })?;
        ModelSource::Gguf(p)
    } else if let Some(g) = &a.gguf {
        ModelSource::Gguf(g.clone())
    } else if a.src.random_weights {
        let config = match (&a.config, &a.src.model_dir) {
            (Some(c), _) => Config::from_file(c)?,
            (None, Some(d)) => Config::from_file(d.join("config.json"))?,
            (None, None) => Config::preset(a.src.model_or(DEFAULT_MODEL))?,
        };
        ModelSource::Random {
            config: Box::new(config),
            seed: a.src.weights_seed,
        }
    } else if let Some(d) = &a.src.model_dir {
        ModelSource::Dir(d.clone())
    } else {
        ModelSource::Hub {
            repo: a.src.model_or(DEFAULT_MODEL).to_string(),
            revision: a.src.revision.clone(),
        }
    };
    println!(
        "loading {} on {:?} in {:?} …",
        source_name(&source, &a),
        device,
        dtype
    );
    let t0 = std::time::Instant::now();
    let opened = loading::open(&source, &schedule, dtype, &device)?;
    let mut model = opened.model;
    if linear != LinearSpec::dense() {
        model.set_linears(&linear).context("--linear")?;
    }
    let load_secs = t0.elapsed().as_secs_f64();
    println!("loaded {} in {load_secs:.1} s", opened.description);
    if linear != LinearSpec::dense() {
        println!("linear {}: {}", linear.text(), model.linear_summary());
    }
    let mut report = Report {
        path: a.json.clone(),
        head: serde_json::json!({
            "model": opened.description, "attention": schedule.text(), "linear": linear.text(),
            "dtype": format!("{dtype:?}"), "device": format!("{device:?}"), "load_s": load_secs,
            "decode_weight_bytes": model.decode_weight_bytes(),
        }),
        turns: Vec::new(),
        times: if a.profile {
            Some(SpanTimes::install(mxattn_llm::profile::STAGES).map_err(anyhow::Error::msg)?)
        } else {
            None
        },
    };
    let n_layers = model.config().num_hidden_layers;
    let resolved = schedule.resolve(n_layers)?;
    println!("attention: {} ({n_layers} layers)", resolved.summary());
    let mut shown: Vec<&str> = Vec::new();
    for i in 0..n_layers {
        let name = resolved.layer_name(i);
        if !shown.contains(&name) {
            shown.push(name);
            println!("  {name}: {}", model.layer_spec(i).label());
        }
    }

    // The tokenizer: --tokenizer, else the GGUF's, else the checkpoint's tokenizer.json.
    let gguf = opened.gguf.as_ref();
    let tok_path = a
        .tokenizer
        .clone()
        .or(opened.tokenizer)
        .or_else(|| a.src.model_dir.as_ref().map(|d| d.join("tokenizer.json")))
        .filter(|p| p.is_file());
    let tokenizer = match (&tok_path, gguf) {
        (Some(p), _) => Some(chat::load_tokenizer(p)?),
        (None, Some(g)) => Some(g.tokenizer()?),
        (None, None) => None,
    };
    let thinking = !a.no_think && gguf.is_none();
    let format = if a.raw_prompt {
        Format::Raw
    } else if let Some(t) = gguf.map(|g| g.chat()).transpose()?.flatten() {
        Format::Template(Box::new(t))
    } else {
        Format::Qwen3 { thinking }
    };
    let stop = match (&tokenizer, a.ignore_eos) {
        (Some(t), false) => chat::stop_ids(t, &model.config().eos_token_ids),
        _ => vec![],
    };

    let (temperature, top_p) = match (gguf.is_some(), thinking) {
        (true, _) => (0.2, 0.9), // SmolLM2's model card
        (false, true) => (0.6, 0.95),
        (false, false) => (0.7, 0.8),
    };
    let mut params = SamplingParams {
        temperature: a.temperature.unwrap_or(temperature),
        top_p: Some(a.top_p.unwrap_or(top_p)),
        top_k: Some(a.top_k.unwrap_or(20)),
        seed: a.seed,
        repeat_penalty: a.repeat_penalty,
        repeat_last_n: a.repeat_last_n,
    };
    if a.greedy {
        params.temperature = 0.0;
    }
    let mut sampler = Sampler::new(&params)?;
    println!(
        "sampling: {}",
        if params.temperature == 0.0 {
            "greedy".to_string()
        } else {
            format!(
                "T {} top-p {:?} top-k {:?} seed {}",
                params.temperature, params.top_p, params.top_k, params.seed
            )
        }
    );

    if let Some(n) = a.prompt_len {
        // token-id prompt (speed runs; no tokenizer needed)
        if n == 0 {
            bail!("--prompt-len must be ≥ 1");
        }
        if a.interactive {
            bail!("--prompt-len and -i do not go together");
        }
        // ordinary text ids (below the special tokens when the vocab has them)
        let hi = model.config().vocab_size.min(151643) as u64;
        let mut rng = mxattn::synth::Rng::new(a.seed);
        let ids: Vec<u32> = (0..n).map(|_| (rng.next_u64() % hi) as u32).collect();
        turn(
            &mut model,
            &ids,
            &a,
            &stop,
            &mut sampler,
            tokenizer.as_ref(),
            &mut report,
        )?;
        return Ok(());
    }
    let Some(tok) = tokenizer.as_ref() else {
        bail!(
            "no tokenizer.json found: pass --tokenizer PATH, or --prompt-len N for a token-id prompt"
        )
    };

    let mut msgs = Vec::new();
    if let Some(s) = &a.system {
        msgs.push(Message::new(Role::System, s.clone()));
    }
    let mut next_user = match (&a.prompt, a.interactive) {
        (Some(p), _) => Some(p.clone()),
        (None, false) => Some(DEFAULT_PROMPT.to_string()),
        (None, true) => None,
    };
    let stdin = std::io::stdin();
    loop {
        let user = match next_user.take() {
            Some(u) => u,
            None => {
                print!("\n> ");
                std::io::stdout().flush()?;
                let mut line = String::new();
                if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
                    break;
                }
                line.trim_end_matches(['\n', '\r']).to_string()
            }
        };
        msgs.push(Message::new(Role::User, user));
        let text = format.render(&msgs)?;
        let ids = chat::encode(tok, &text)?;
        let answer = turn(
            &mut model,
            &ids,
            &a,
            &stop,
            &mut sampler,
            Some(tok),
            &mut report,
        )?;
        if !a.interactive {
            break;
        }
        let answer: Vec<u32> = answer.into_iter().filter(|t| !stop.contains(t)).collect();
        msgs.push(Message::new(Role::Assistant, chat::decode(tok, &answer)?));
    }
    Ok(())
}

/// `--json`: the run's settings and one entry per turn, rewritten after every turn (an
/// interactive session killed midway keeps what it did).
struct Report {
    path: Option<PathBuf>,
    head: serde_json::Value,
    turns: Vec<serde_json::Value>,
    /// `--profile`: the stage timer, on during decode steps only.
    times: Option<SpanTimes>,
}

impl Report {
    fn push(&mut self, turn: serde_json::Value) -> Result<()> {
        self.turns.push(turn);
        if let Some(p) = &self.path {
            let mut v = self.head.clone();
            v["turns"] = serde_json::Value::from(self.turns.clone());
            std::fs::write(p, serde_json::to_string_pretty(&v)?)
                .with_context(|| format!("--json {}", p.display()))?;
        }
        Ok(())
    }
}

/// One generation: streams the answer, prints the statistics, returns the ids.
fn turn(
    model: &mut CausalLm,
    prompt_ids: &[u32],
    a: &Args,
    stop: &[u32],
    sampler: &mut Sampler,
    tokenizer: Option<&Tokenizer>,
    report: &mut Report,
) -> Result<Vec<u32>> {
    let vocab = model.config().vocab_size;
    if let Some(&bad) = prompt_ids.iter().find(|&&t| t as usize >= vocab) {
        bail!(
            "prompt token id {bad} is outside the model's vocabulary ({vocab}): the tokenizer does not \
             belong to this checkpoint (use --prompt-len N for token-id prompts)"
        );
    }
    println!("prompt: {} tokens\n", prompt_ids.len());
    let mut stream = tokenizer.map(TextStream::new);
    let mut stdout = std::io::stdout();
    let show = !a.quiet && stream.is_some();
    if let Some(t) = &report.times {
        t.set_on(false);
        t.take();
    }
    let times = report.times.clone();
    let (generated, stats) = generate(model, prompt_ids, a.max_tokens, stop, sampler, |id| {
        // the first token ends the prefill: time the decode steps from here
        if let Some(t) = &times {
            t.set_on(true);
        }
        if stop.contains(&id) || !show {
            return Ok(());
        }
        if let Some(s) = stream.as_mut() {
            if let Some(piece) = s.push(id)? {
                print!("{piece}");
                stdout.flush().map_err(candle_core::Error::wrap)?;
            }
        }
        Ok(())
    })
    .context("generation")?;
    if show {
        if let Some(rest) = stream.as_mut().map(|s| s.finish()).transpose()?.flatten() {
            print!("{rest}");
        }
    }
    if !a.quiet && stream.is_none() {
        println!("(no tokenizer) generated ids: {generated:?}");
    }
    println!("\n");
    let stop_name = match (stats.stopped_on, tokenizer) {
        (Some(id), Some(t)) => t.id_to_token(id).unwrap_or_else(|| "a stop token".into()),
        (Some(_), None) => "a stop token".into(),
        (None, _) => "--max-tokens".into(),
    };
    println!(
        "prefill: {} tokens in {:.3} s = {:.1} tok/s; time to first token {:.1} ms",
        stats.prompt_tokens,
        stats.prefill_secs,
        stats.prefill_tok_per_s(),
        1e3 * stats.prefill_secs
    );
    println!(
        "decode:  {} tokens in {:.3} s = {:.2} tok/s (stopped on {stop_name})",
        stats.decode_steps,
        stats.decode_secs,
        stats.decode_tok_per_s()
    );
    let bf16 = model.kv_cache_bytes_as_bf16();
    println!(
        "KV cache: {} bytes ({:.2} MiB) for {} tokens; bf16 would be {:.2} MiB ({:.2}x)",
        stats.kv_cache_bytes,
        mib(stats.kv_cache_bytes),
        model.seq_len(),
        mib(bf16),
        bf16 as f64 / stats.kv_cache_bytes.max(1) as f64
    );
    let mut profile = Vec::new();
    if let Some(t) = &report.times {
        t.set_on(false);
        let rows = t.take();
        let steps = stats.decode_steps.max(1) as f64;
        let total: f64 = rows.iter().map(|r| r.1).sum();
        println!(
            "decode profile over {} steps (device-synchronized stages; {:.2} ms per token in them):",
            stats.decode_steps,
            1e3 * total / steps
        );
        println!("| stage | ms per token | calls per token | share |\n|---|---|---|---|");
        for (label, secs, n) in &rows {
            println!(
                "| {label} | {:.3} | {:.0} | {:.1} % |",
                1e3 * secs / steps,
                *n as f64 / steps,
                100.0 * secs / total.max(1e-12)
            );
            profile.push(serde_json::json!({
                "stage": label, "ms_per_token": 1e3 * secs / steps,
                "calls_per_token": *n as f64 / steps,
            }));
        }
    }
    let weights = model.decode_weight_bytes();
    println!(
        "bytes a decode step reads: weights {:.2} GB + KV cache {:.2} GB = {:.2} GB",
        weights as f64 / 1e9,
        stats.kv_cache_bytes as f64 / 1e9,
        (weights + stats.kv_cache_bytes) as f64 / 1e9
    );
    report.push(serde_json::json!({
        "profile": profile,
        "prompt_tokens": stats.prompt_tokens,
        // the prompt's forward and the first token's sampling
        "time_to_first_token_s": stats.prefill_secs,
        "prefill_tok_per_s": stats.prefill_tok_per_s(),
        "decode_steps": stats.decode_steps, "decode_s": stats.decode_secs,
        "decode_tok_per_s": stats.decode_tok_per_s(),
        "generated_tokens": stats.generated_tokens,
        "stopped_on": stats.stopped_on, "kv_cache_bytes": stats.kv_cache_bytes,
    }))?;
    Ok(generated)
}

fn source_name(s: &ModelSource, a: &Args) -> String {
    match s {
        ModelSource::Dir(d) | ModelSource::Gguf(d) => d.display().to_string(),
        ModelSource::Hub { repo, .. } => repo.clone(),
        ModelSource::Random { .. } => {
            format!("random weights for {}", a.src.model_or(DEFAULT_MODEL))
        }
    }
}
