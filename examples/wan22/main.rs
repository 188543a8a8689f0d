//! Wan2.2 text-to-video with mxattn's quantized attention.
//!
//!     cargo run --release --features cuda --example wan22 -- \
//!         --prompt "A red fox running through fresh snow" --attn-schedule hybrid -o fox.mp4
//!     cargo run --release --example wan22 -- --model-dir DIR --size 832x480 --steps 30 -o out.mp4
//!     cargo run --release --features cuda --example wan22 -- --random-weights --variant a14b \
//!         --device cuda --steps 2 --no-decode --profile-attention --attn fused-mxfp8
//!
//! `--help` documents every flag, the attention-schedule grammar and the config names.

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser};
use mxattn_cli::spans::SpanTimes;
use mxattn_cli::{
    dtype_or_default, progress_bar, AttnArgs, AttnChoice, DeviceArgs, ModelArgs, VideoArgs,
};

/// The repository `--model` names when it is not given.
const DEFAULT_MODEL: &str = "Wan-AI/Wan2.2-T2V-A14B-Diffusers";
use mxattn_video as video;
use mxattn_video::{GifWriter, Mp4Writer};
use mxattn_wan::generate::{Event, Request};
use mxattn_wan::pipeline::{GenerateOptions, Settings, WanPipeline};
use mxattn_wan::profile;
use mxattn_wan::schedule::{help as schedule_help, linear_help, LinearSpec, ScheduleSpec};
use mxattn_wan::scheduler::SamplerKind;
use mxattn_wan::sizes::{parse_size, WanVariant};
use mxattn_wan::umt5::WAN_NEGATIVE_PROMPT;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "wan22",
    about = "Wan2.2 text-to-video (T2V-A14B, TI2V-5B) with quantized (MX) attention",
    long_about = "Wan2.2 text-to-video in Candle: UMT5 prompt encoding, the Wan transformer \
(T2V-A14B's two experts switched at the boundary timestep, or TI2V-5B), UniPC flow matching with \
classifier-free guidance, and the causal 3-D VAE, writing an H.264 .mp4 (or .gif, or PNG frames). \
Every attention call (self, cross, VAE mid) goes through mxattn::attention with the config the \
attention schedule picks for its (expert, step, layer, kind). Defaults follow the original \
release: 40 steps, shift 12, guidance 4.0/3.0 for A14B; 50 steps, shift 5, guidance 5 for 5B.\n\n\
Weights: --model OWNER/NAME through the Hugging Face cache (diffusers layout; default \
Wan-AI/Wan2.2-T2V-A14B-Diffusers), or --model-dir DIR holding model_index.json, tokenizer/, \
text_encoder/, transformer/ (+ transformer_2/), vae/ and scheduler/, or --random-weights with \
the released architecture of --variant (speed runs)."
)]
struct Args {
    #[command(flatten)]
    src: ModelArgs,
    /// t2v-a14b or ti2v-5b (default: from --model's name).
    #[arg(long)]
    variant: Option<String>,
    /// With --random-weights: length of the pseudo-random prompt (tokens).
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,

    #[arg(
        long,
        default_value = "Two anthropomorphic cats in comfy boxing gear fight on a spotlighted stage."
    )]
    prompt: String,
    /// Default: the original release's negative prompt.
    #[arg(long)]
    negative_prompt: Option<String>,
    /// --size, --frames (default 81 for A14B, 121 for 5B), --steps (default 40 A14B, 50 5B),
    /// --guidance, --guidance-2, --shift, --sampler, --seed.
    #[command(flatten)]
    video: VideoArgs,

    /// --attn (default exact) and --attn-schedule, e.g. "hybrid-fused".
    #[command(flatten)]
    attn: AttnArgs,

    /// The transformer blocks' projections: bf16 (as loaded, in --dtype), fp8 (FP8 E4M3
    /// weights with a scale per output channel, quantized at load, and per-token FP8
    /// activations), fp8-tensor, fp8-block, or a linear schedule over expert, layers and kind
    /// (self|cross|ffn), e.g. "bf16@layers=0+last;fp8" (see below).
    #[arg(long, default_value = "bf16")]
    linear: String,

    /// Output video: .mp4 (H.264) or .gif.
    #[arg(short, long, default_value = "wan22.mp4")]
    output: PathBuf,
    /// Also write a GIF next to the MP4.
    #[arg(long)]
    gif: bool,
    /// Also write every frame as PNG into this directory.
    #[arg(long)]
    png_dir: Option<PathBuf>,
    /// The MLPerf Inference Wan2.2 setting: T2V-A14B at 1280x720, 81 frames, 20 steps,
    /// guidance 4.0 / 3.0 (boundary 0.875), for comparing with those submissions; flags
    /// given beside it still win.
    #[arg(long)]
    mlperf: bool,
    /// Skip the VAE decode (speed runs of the denoiser).
    #[arg(long)]
    no_decode: bool,
    /// Record the largest |value| after each VAE decoder stage (a device synchronization per
    /// stage), print them, and name the first stage that produces a non-finite value.
    #[arg(long)]
    vae_trace: bool,
    /// Time every transformer attention call (synchronizes the device) for the share of
    /// time spent in attention.
    #[arg(long)]
    profile_attention: bool,
    /// Write a JSON report (timings, settings) here.
    #[arg(long)]
    json: Option<PathBuf>,

    /// --cpu, --device, --dtype (the transformer's and the text encoder's).
    #[command(flatten)]
    dev: DeviceArgs,
    /// VAE dtype (default: f32 on the CPU, bf16 on a GPU).
    #[arg(long)]
    vae_dtype: Option<String>,
    /// Run on N GPUs of this host: starts N ranks of this program (rank r on cuda:r) that
    /// split every transformer forward's video tokens (Ulysses sequence parallelism: the
    /// attention heads must be a multiple of the ranks of a group; tokens are padded). Rank
    /// 0 decodes and writes the video. On several hosts, start one process per GPU with
    /// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set (torchrun's variables)
    /// instead. Needs a build with `--features nccl`.
    #[arg(long, default_value_t = 1)]
    gpus: usize,
    /// In a parallel run, compute the conditional and the unconditional branch on two
    /// halves of the ranks (CFG parallelism; an even rank count), each half sequence
    /// parallel over its ranks.
    #[arg(long)]
    cfg_parallel: bool,
    /// Hide progress bars.
    #[arg(long)]
    quiet: bool,
}

fn main() -> Result<()> {
    let cmd = Args::command().after_help(format!("{}\n{}", schedule_help(), linear_help()));
    let args = Args::from_arg_matches(&cmd.get_matches())?;
    let rank = mxattn_dist::launch::RankEnv::from_env()?;
    if rank.is_none() && args.gpus > 1 {
        // the launcher: this program again as ranks 0..N of this host
        let argv: Vec<String> = std::env::args().skip(1).collect();
        return Ok(mxattn_dist::launch::spawn_local(args.gpus, &argv)?);
    }
    run(args, rank)
}

/// This rank's communicators in the run `env` describes (NCCL).
#[cfg(feature = "nccl")]
fn join(
    env: &mxattn_dist::launch::RankEnv,
    device: &candle_core::Device,
    cfg_parallel: bool,
) -> Result<mxattn_wan::pipeline::Parallel> {
    use std::sync::Arc;
    let layout = mxattn_dist::Layout::new(env.world, cfg_parallel)?;
    let (sp, cfg) = mxattn_dist::nccl::NcclComm::join(env, device, layout)?;
    println!(
        "rank {} of {}: sequence parallel over {}, CFG parallel over {}",
        env.rank, env.world, layout.sp, layout.cfg
    );
    Ok(mxattn_wan::pipeline::Parallel {
        sp: Some(Arc::new(sp)),
        cfg: Some(Arc::new(cfg)),
    })
}

#[cfg(not(feature = "nccl"))]
fn join(
    env: &mxattn_dist::launch::RankEnv,
    _: &candle_core::Device,
    _: bool,
) -> Result<mxattn_wan::pipeline::Parallel> {
    bail!(
        "rank {} of {}: a parallel run needs NCCL; build with --features nccl",
        env.rank,
        env.world
    )
}

fn run(a: Args, rank: Option<mxattn_dist::launch::RankEnv>) -> Result<()> {
    // a rank of a parallel run takes the GPU of its local rank; rank 0 alone writes
    let leader = rank.as_ref().is_none_or(|r| r.rank == 0);
    let device = match &rank {
        Some(r) if !a.dev.cpu => mxattn_cli::parse_device(&format!("cuda:{}", r.local_rank))?,
        Some(_) => bail!("a parallel run (--gpus, RANK) runs on GPUs, not --cpu"),
        None => a.dev.device()?,
    };
    let quiet = a.quiet || !leader;
    let dtype = a.dev.dtype(&device)?;
    let vae_dtype = dtype_or_default(a.vae_dtype.as_deref(), &device)?;
    let variant: WanVariant = match &a.variant {
        Some(v) => v.parse()?,
        None if a
            .src
            .model_or(DEFAULT_MODEL)
            .to_ascii_lowercase()
            .contains("5b") =>
        {
            WanVariant::Ti2v5b
        }
        None => WanVariant::T2vA14b,
    };
    let sampler = SamplerKind::parse(&a.video.sampler)?;
    let spec = match a.attn.choice("exact") {
        AttnChoice::Schedule(t) => ScheduleSpec::parse(t)?,
        AttnChoice::Uniform(n) => ScheduleSpec::uniform(n)?,
    };

    let linear = LinearSpec::parse(&a.linear).context("--linear")?;

    let t_load = Instant::now();
    let mut pipe = if a.src.random_weights {
        println!("building {variant} with random weights on {device:?} in {dtype:?} …");
        WanPipeline::random(
            variant,
            dtype,
            vae_dtype,
            &device,
            a.src.weights_seed,
            a.prompt_tokens,
        )?
    } else {
        let dir = match &a.src.model_dir {
            Some(d) => d.clone(),
            None => hub_dir(a.src.model_or(DEFAULT_MODEL), a.src.revision.as_deref())?,
        };
        println!("loading {} on {device:?} in {dtype:?} …", dir.display());
        WanPipeline::load(&dir, dtype, vae_dtype, &device)
            .with_context(|| format!("loading the pipeline from {}", dir.display()))?
    };
    if linear != LinearSpec::dense() {
        let t = Instant::now();
        pipe.set_linears(&linear).context("--linear")?;
        println!(
            "linear layers {}: {} (converted in {:.1} s)",
            linear.text(),
            pipe.experts[0].linear_summary(),
            t.elapsed().as_secs_f64()
        );
    }
    pipe.vae.set_trace(a.vae_trace);
    if let Some(r) = &rank {
        pipe.set_parallel(join(r, &device, a.cfg_parallel)?)?;
    }
    let variant = pipe.variant();
    println!(
        "loaded {variant} ({} expert(s)) in {:.1} s",
        pipe.experts.len(),
        t_load.elapsed().as_secs_f64()
    );
    let mut settings = Settings {
        size: a
            .video
            .size
            .as_deref()
            .map(|t| parse_size(t, variant, a.video.any_size))
            .transpose()?,
        frames: a.video.frames,
        steps: a.video.steps,
        guidance: a.video.guidance,
        guidance_2: a.video.guidance_2,
        shift: a.video.shift,
    };
    if a.mlperf {
        if variant != WanVariant::T2vA14b {
            bail!("--mlperf is the T2V-A14B setting; this run is {variant}");
        }
        settings = settings.over(Settings::mlperf());
    }
    let negative = a.negative_prompt.as_deref().unwrap_or(WAN_NEGATIVE_PROMPT);
    let opts = GenerateOptions::for_variant(
        variant,
        &a.prompt,
        negative,
        &settings,
        sampler,
        a.video.seed,
    );
    let (width, height) = (opts.width, opts.height);
    let req = Request {
        options: opts,
        schedule: spec,
        decode: !a.no_decode && leader,
    };
    let opts = &req.options;
    let (w, h, fps) = (width, height, variant.fps());
    // the writers, opened before any work so a bad --output fails at once
    let ext = a
        .output
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let (mut mp4, mut gif) = (None, None);
    if req.decode {
        match ext.as_deref() {
            Some("mp4") => {
                mp4 = Some(Mp4Writer::create(&a.output, w, h, fps)?);
                if a.gif {
                    gif = Some(GifWriter::create(
                        a.output.with_extension("gif"),
                        w,
                        h,
                        fps,
                    )?);
                }
            }
            Some("gif") => gif = Some(GifWriter::create(&a.output, w, h, fps)?),
            _ => bail!("--output {}: use a .mp4 or .gif name", a.output.display()),
        }
        if let Some(dir) = &a.png_dir {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }

    // --profile-attention: time the transformer's attention spans (device-synchronized)
    let times = if a.profile_attention {
        let t = SpanTimes::install(profile::ATTENTION).map_err(anyhow::Error::msg)?;
        t.set_on(true);
        Some(t)
    } else {
        None
    };
    let take_attention = || {
        times
            .as_ref()
            .map_or((0.0, 0), |t| t.take_label("attention"))
    };
    let pb = progress_bar(opts.steps as u64, "denoise", quiet);
    // the whole video's wall time, and the device memory in use (sampled after every step
    // and decoded chunk: the driver's count for the whole GPU)
    let t_video = Instant::now();
    let mut peak_mem = 0usize;
    let mut sample_mem = || {
        if let Some(used) = device_memory_in_use(&device) {
            peak_mem = peak_mem.max(used);
        }
    };
    // the VAE's bar: one tick per latent frame it decodes, made when the first frames come
    let (mut vb, mut vae_chunks) = (None, 0u64);
    let mut per_step = Vec::new();
    let mut frame_no = 0usize;
    let gen = pipe.generate(&req, |event| {
        match event {
            Event::Planned(plan) => {
                let dims = plan.latent_dims;
                vae_chunks = dims.2 as u64;
                println!(
                    "{width}x{height}, {} frames (latents {dims:?}, {} tokens), {} steps, shift {}, guidance {}/{}, {} sampler, seed {}",
                    opts.frames,
                    plan.tokens,
                    opts.steps,
                    opts.shift.unwrap_or_default(),
                    opts.guidance_high,
                    opts.guidance_low,
                    a.video.sampler,
                    opts.seed
                );
                if pipe.experts.len() == 2 {
                    println!(
                        "experts: high-noise for steps 0..{}, low-noise for {}..{}",
                        plan.switch_step, plan.switch_step, opts.steps
                    );
                }
                println!("attention: {}", plan.schedule.summary(plan.switch_step));
                if pipe.vae.mid_attention_uses_fallback() {
                    println!("  (the Wan2.2 VAE's mid attention is 1024 wide: it runs exact attention whatever the schedule)");
                }
            }
            Event::TextEncoded { .. } => {
                let _ = take_attention();
            }
            Event::Step(info) => {
                sample_mem();
                let (att_s, calls) = take_attention();
                pb.inc(1);
                per_step.push(serde_json::json!({
                    "step": info.step, "timestep": info.timestep, "expert": info.expert,
                    "guidance": info.guidance, "seconds": info.seconds,
                    "attention_seconds": att_s, "attention_calls": calls,
                }));
                if info.step + 1 == opts.steps {
                    pb.finish_and_clear();
                }
            }
            Event::Frames(rgb) => {
                sample_mem();
                let bar = vb.get_or_insert_with(|| progress_bar(vae_chunks, "VAE", quiet));
                for f in &rgb.frames {
                    if let Some(m) = mp4.as_mut() {
                        m.push_rgb(f)?;
                    }
                    if let Some(g) = gif.as_mut() {
                        g.push_rgb(f)?;
                    }
                    if let Some(dir) = &a.png_dir {
                        video::write_png(dir.join(format!("frame_{frame_no:04}.png")), w, h, f)?;
                    }
                    frame_no += 1;
                }
                bar.inc(1);
            }
        }
        Ok(())
    })?;
    pb.finish_and_clear();
    if let Some(b) = &vb {
        b.finish_and_clear();
    }
    let dims = gen.plan.latent_dims;
    let denoise_s = gen.denoise_seconds;
    let text_s = gen.text_seconds;
    let step_s: Vec<f64> = gen.steps.iter().map(|s| s.seconds).collect();
    let att_s: f64 = per_step
        .iter()
        .map(|s| s["attention_seconds"].as_f64().unwrap_or(0.0))
        .sum();
    println!(
        "denoising: {:.2} s total, {:.3} s/step (mean of {}; first {:.3}, last {:.3})",
        denoise_s,
        step_s.iter().sum::<f64>() / step_s.len() as f64,
        step_s.len(),
        step_s[0],
        step_s[step_s.len() - 1]
    );
    if a.profile_attention {
        println!(
            "attention (transformer self + cross): {:.2} s = {:.1} % of denoising",
            att_s,
            100.0 * att_s / denoise_s
        );
    }
    let mut written = Vec::new();
    if let Some(m) = mp4 {
        let s = m.finish()?;
        written.push(format!("{} ({s:?})", a.output.display()));
    }
    if let Some(g) = gif {
        let n = g.finish()?;
        written.push(format!("GIF, {n} frames"));
    }
    if let Some(dir) = a.png_dir.as_ref().filter(|_| req.decode) {
        written.push(format!("{frame_no} PNG frames in {}", dir.display()));
    }
    let vae_s = gen.decode.as_ref().map(|(s, _)| *s);
    if let Some((s, stats)) = &gen.decode {
        println!(
            "VAE decode: {:.2} s, {} frames, peak activation {:.1} MiB, feature cache {:.1} MiB",
            s,
            stats.frames,
            stats.peak_activation_bytes as f64 / 1048576.0,
            stats.cache_bytes as f64 / 1048576.0
        );
        if a.vae_trace {
            println!("VAE stages, largest |value| over all frames:");
            for (stage, m) in &stats.stage_absmax {
                println!("  {stage:<16} {m:.4e}");
            }
        }
    }
    for w in &written {
        println!("wrote {w}");
    }
    let total_s = t_video.elapsed().as_secs_f64();
    println!(
        "video: text {text_s:.2} s + denoising {denoise_s:.2} s + VAE {:.2} s = {total_s:.2} s wall (with writing){}",
        vae_s.unwrap_or(0.0),
        if peak_mem > 0 {
            format!(", peak device memory in use {:.2} GiB", peak_mem as f64 / (1u64 << 30) as f64)
        } else {
            String::new()
        }
    );
    let schedule = &gen.plan.schedule;
    let steps = per_step;
    let latents_hash = format!("{:016x}", gen.latents_hash);
    if let Some(p) = a.json.as_ref().filter(|_| leader) {
        let report = serde_json::json!({
            "variant": variant.to_string(), "random_weights": a.src.random_weights,
            "width": width, "height": height, "frames": opts.frames, "steps": opts.steps,
            "latents": [dims.0, dims.1, dims.2, dims.3, dims.4],
            "attention": schedule.text(), "linear": linear.text(), "dtype": format!("{dtype:?}"),
            "text_seconds": text_s, "denoise_seconds": denoise_s,
            "step_seconds_mean": step_s.iter().sum::<f64>() / step_s.len() as f64,
            "attention_seconds": if a.profile_attention { Some(att_s) } else { None },
            "vae_seconds": vae_s, "total_seconds": total_s,
            "peak_device_memory_bytes": (peak_mem > 0).then_some(peak_mem),
            "mlperf_setting": a.mlperf, "per_step": steps,
            "latents_hash": latents_hash,
            "frames_hash": gen.frames_hash.map(|h| format!("{h:016x}")),
        });
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

#[cfg(feature = "hub")]
fn hub_dir(model: &str, revision: Option<&str>) -> Result<PathBuf> {
    Ok(mxattn_wan::pipeline::hub_snapshot(model, revision)?)
}

#[cfg(not(feature = "hub"))]
fn hub_dir(model: &str, _revision: Option<&str>) -> Result<PathBuf> {
    bail!(
        "--model {model}: this build has no Hub support; build with `--features hub`, or \
         download the repository and pass --model-dir DIR (or use --random-weights)"
    )
}

/// Bytes in use on `device`'s GPU (total − free, as the driver counts them), `None` on the
/// CPU.
fn device_memory_in_use(device: &candle_core::Device) -> Option<usize> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(d) = device {
        let (free, total) = d.cuda_stream().context().mem_get_info().ok()?;
        return Some(total - free);
    }
    let _ = device;
    None
}
