//! Qwen3 text generation with mxattn's quantized attention.
//!
//!     cargo run --release --example chat -- --model Qwen/Qwen3-0.6B --prompt "Why is the sky blue?"
//!     cargo run --release --example chat -- --model-dir DIR --attn-schedule hybrid --no-think
//!     cargo run --release --example chat -- --random-weights --model Qwen/Qwen3-8B \
//!         --device cuda --dtype bf16 --prompt-len 4096 --max-tokens 128 --ignore-eos --attn mxfp4
//!
//! `--help` documents every flag and the schedule grammar.

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser};
use mxattn_cli::{AttnArgs, AttnChoice, DeviceArgs, ModelArgs};

/// The model `--model` names when it is not given.
const DEFAULT_MODEL: &str = "Qwen/Qwen3-8B";
use mxattn_llm::chat::{self, Message, Role, SpecialTokens, TextStream};
use mxattn_llm::generation::{generate, Sampler, SamplingParams};
use mxattn_llm::loading::{self, ModelSource};
use mxattn_llm::schedule::schedule_help;
use mxattn_llm::{Config, ScheduleSpec};
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "qwen3",
    about = "Qwen3 generation with quantized (MX) attention and a KV cache in each layer's format",
    long_about = "Qwen3 generation with quantized (MX) attention: every layer's attention goes through \
mxattn::attention with the config of --attn or --attn-schedule, and its KV cache stores K/V in that \
layer's format (bf16, or MX codes + E8M0 scales). Prints the streamed answer, then prefill and decode \
tokens/s and the KV-cache size.\n\n\
Weights: --model OWNER/NAME through the Hugging Face cache (default Qwen/Qwen3-8B), or --model-dir \
DIR holding config.json, tokenizer.json and model.safetensors (or shards with \
model.safetensors.index.json), or --random-weights for the architecture of --config, of \
--model-dir's config.json, or the built-in config of --model."
)]
struct Args {
    #[command(flatten)]
    src: ModelArgs,
    /// config.json for --random-weights (else --model-dir's, else the built-in config of
    /// --model).
    #[arg(long)]
    config: Option<PathBuf>,
    /// tokenizer.json (default: the checkpoint's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,

    /// The user message.
    #[arg(
        long,
        default_value = "Give me a short introduction to large language models."
    )]
    prompt: String,
    /// An optional system message.
    #[arg(long)]
    system: Option<String>,
    /// Thinking off: the assistant turn starts with an empty <think></think> block
    /// (enable_thinking=False).
    #[arg(long)]
    no_think: bool,
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
    /// Sampling temperature; 0 = greedy. Default: the model card's 0.6 with thinking,
    /// 0.7 without.
    #[arg(long)]
    temperature: Option<f64>,
    /// Nucleus sampling (default 0.95 thinking, 0.8 not).
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
    /// Print only the statistics, not the text.
    #[arg(long)]
    quiet: bool,
}

fn main() -> Result<()> {
    let cmd = Args::command().after_help(schedule_help());
    let args = Args::from_arg_matches(&cmd.get_matches())?;
    run(args)
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn run(a: Args) -> Result<()> {
    let device = a.dev.device()?;
    let dtype = a.dev.dtype(&device)?;
    let schedule = match a.attn.choice("bf16") {
        AttnChoice::Schedule(t) => ScheduleSpec::parse(t)?,
        AttnChoice::Uniform(n) => ScheduleSpec::uniform(n)?,
    };
    let source = if a.src.random_weights {
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
    println!(
        "loaded {} in {:.1} s",
        opened.description,
        t0.elapsed().as_secs_f64()
    );
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

    let tok_path = a
        .tokenizer
        .clone()
        .or(opened.tokenizer)
        .or_else(|| a.src.model_dir.as_ref().map(|d| d.join("tokenizer.json")))
        .filter(|p| p.is_file());
    let tokenizer = match &tok_path {
        Some(p) => Some(chat::load_tokenizer(p)?),
        None => None,
    };
    let specials = match &tokenizer {
        Some(t) => Some(SpecialTokens::from_tokenizer(t)?),
        None => None,
    };

    let vocab = model.config().vocab_size;
    let prompt_ids: Vec<u32> = match (a.prompt_len, &tokenizer) {
        (Some(n), _) => {
            if n == 0 {
                bail!("--prompt-len must be ≥ 1");
            }
            // ordinary text ids (below the special tokens when the vocab has them)
            let hi = vocab.min(151643) as u64;
            let mut rng = mxattn::synth::Rng::new(a.seed);
            (0..n).map(|_| (rng.next_u64() % hi) as u32).collect()
        }
        (None, Some(t)) => {
            let text = if a.raw_prompt {
                a.prompt.clone()
            } else {
                let mut msgs = Vec::new();
                if let Some(s) = &a.system {
                    msgs.push(Message::new(Role::System, s.clone()));
                }
                msgs.push(Message::new(Role::User, a.prompt.clone()));
                chat::chat_prompt(&msgs, !a.no_think)?
            };
            chat::encode(t, &text)?
        }
        (None, None) => bail!(
            "no tokenizer.json found: pass --tokenizer PATH, or --prompt-len N for a token-id prompt"
        ),
    };

    if let Some(&bad) = prompt_ids.iter().find(|&&t| t as usize >= vocab) {
        bail!(
            "prompt token id {bad} is outside the model's vocabulary ({vocab}): the tokenizer does not \
             belong to this checkpoint (use --prompt-len N for token-id prompts)"
        );
    }
    let thinking = !a.no_think;
    let mut params = SamplingParams {
        temperature: a.temperature.unwrap_or(if thinking { 0.6 } else { 0.7 }),
        top_p: Some(a.top_p.unwrap_or(if thinking { 0.95 } else { 0.8 })),
        top_k: Some(a.top_k.unwrap_or(20)),
        seed: a.seed,
        repeat_penalty: a.repeat_penalty,
        repeat_last_n: a.repeat_last_n,
    };
    if a.greedy {
        params.temperature = 0.0;
    }
    let mut sampler = Sampler::new(&params)?;
    let stop = match (&specials, a.ignore_eos) {
        (Some(s), false) => s.stop_ids(),
        _ => vec![],
    };
    println!(
        "prompt: {} tokens; sampling: {}",
        prompt_ids.len(),
        if params.temperature == 0.0 {
            "greedy".to_string()
        } else {
            format!(
                "T {} top-p {:?} top-k {:?} seed {}",
                params.temperature, params.top_p, params.top_k, params.seed
            )
        }
    );
    println!();

    let mut stream = tokenizer.as_ref().map(TextStream::new);
    let mut stdout = std::io::stdout();
    let show = !a.quiet && stream.is_some();
    let (generated, stats) = generate(
        &mut model,
        &prompt_ids,
        a.max_tokens,
        &stop,
        &mut sampler,
        |id| {
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
        },
    )
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
    let stop_name = match (stats.stopped_on, &specials) {
        (Some(id), Some(s)) if id == s.im_end => "<|im_end|>",
        (Some(id), Some(s)) if id == s.endoftext => "<|endoftext|>",
        (Some(_), _) => "a stop token",
        (None, _) => "--max-tokens",
    };
    println!(
        "prefill: {} tokens in {:.3} s = {:.1} tok/s",
        stats.prompt_tokens,
        stats.prefill_secs,
        stats.prefill_tok_per_s()
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
    Ok(())
}

fn source_name(s: &ModelSource, a: &Args) -> String {
    match s {
        ModelSource::Dir(d) => d.display().to_string(),
        ModelSource::Hub { repo, .. } => repo.clone(),
        ModelSource::Random { .. } => {
            format!("random weights for {}", a.src.model_or(DEFAULT_MODEL))
        }
    }
}
