//! Wan2.2 fidelity of attention schedules against a reference run (models.md §C2).
//!
//! Same pipeline, prompt, seed and initial noise for every run; the reference (default:
//! `exact` attention everywhere) runs first and keeps its latents after every step. For each
//! schedule: the latent rel-L2 and cosine against the reference after every step, then the
//! decoded videos' PSNR and SSIM per frame and the temporal consistency (correlation of the
//! two flicker series). Writes `report.md`, `report.json` and `latent_error.png` (per-step
//! latent error, one line per schedule) into `--out-dir`.
//!
//!     cargo run --release --bin wan_fidelity -- --model-dir DIR --size 832x480 --frames 33 --steps 20
//!     cargo run --release --features cuda --bin wan_fidelity -- --random-weights --variant a14b \
//!         --device cuda --size 832x480 --frames 17 --steps 8

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use clap::{CommandFactory, FromArgMatches, Parser};
use mxattn_cli::{progress_bar, DeviceArgs, VideoArgs};
use mxattn_video::RgbFrames;
use mxattn_wan::fidelity::{cosine, rel_l2, VideoFidelity};
use mxattn_wan::pipeline::{GenerateOptions, Settings, WanPipeline};
use mxattn_wan::schedule::{help as schedule_help, linear_help, LinearSpec, ScheduleSpec};
use mxattn_wan::scheduler::SamplerKind;
use mxattn_wan::sizes::{parse_size, WanVariant};
use mxattn_wan::umt5::WAN_NEGATIVE_PROMPT;
use std::path::{Path, PathBuf};

#[derive(Parser, Debug)]
#[command(
    name = "wan_fidelity",
    about = "Wan2.2: latent and video fidelity of attention schedules against a reference run"
)]
struct Args {
    /// Local diffusers-layout pipeline directory.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Random weights with the released architecture of --variant (exercises the path; the
    /// numbers then describe random networks, not the model).
    #[arg(long)]
    random_weights: bool,
    /// t2v-a14b or ti2v-5b (with --random-weights).
    #[arg(long, default_value = "t2v-a14b")]
    variant: String,
    #[arg(long, default_value_t = 0)]
    weights_seed: u64,
    #[arg(
        long,
        default_value = "A red fox trotting through fresh snow in a pine forest, morning light."
    )]
    prompt: String,
    /// --size (default: the variant's smallest released size), --frames (default 17),
    /// --steps (default 20), --guidance, --guidance-2, --shift, --sampler, --seed.
    #[command(flatten)]
    video: VideoArgs,
    /// The reference schedule.
    #[arg(long, default_value = "exact")]
    reference: String,
    /// A configuration to compare (repeatable): an attention schedule (grammar below),
    /// optionally `:LINEAR` with a linear schedule for the blocks' projections (`exact:fp8`;
    /// bf16 when not given). Default: fused-mxfp8, fused-mxfp6, fused-mxfp4, hybrid-fused,
    /// mxfp4, hybrid, exact:fp8, hybrid-fused:fp8.
    #[arg(long = "schedule")]
    schedules: Vec<String>,
    /// Latent metrics only (no VAE decode).
    #[arg(long)]
    no_decode: bool,
    /// Decode every run with exact VAE mid-attention (the schedules then differ only in the
    /// transformer); needed when the VAE is too narrow for MX blocks (tiny test models).
    #[arg(long)]
    vae_exact: bool,
    #[arg(long, default_value = "evals/results/wan_fidelity")]
    out_dir: PathBuf,
    /// --cpu, --device, --dtype.
    #[command(flatten)]
    dev: DeviceArgs,
    #[arg(long)]
    quiet: bool,
}

const DEFAULT_SCHEDULES: &[&str] = &[
    "fused-mxfp8",
    "fused-mxfp6",
    "fused-mxfp4",
    "hybrid-fused",
    "mxfp4",
    "hybrid",
    "exact:fp8",
    "hybrid-fused:fp8",
];

/// PSNR of identical frames is infinite; means count such frames at this value.
const PSNR_CAP_DB: f64 = 100.0;

struct Run {
    name: String,
    step_rel_l2: Vec<f64>,
    step_cosine: Vec<f64>,
    video: Option<VideoFidelity>,
}

fn main() -> Result<()> {
    let cmd = Args::command().after_help(format!("{}\n{}", schedule_help(), linear_help()));
    let a = Args::from_arg_matches(&cmd.get_matches())?;
    let device = a.dev.device()?;
    let dtype = a.dev.dtype(&device)?;
    let mut pipe = match (&a.model_dir, a.random_weights) {
        (Some(d), false) => WanPipeline::load(d, dtype, dtype, &device)
            .with_context(|| format!("loading {}", d.display()))?,
        (None, true) => {
            let v: WanVariant = a.variant.parse()?;
            WanPipeline::random(v, dtype, dtype, &device, a.weights_seed, 64)?
        }
        _ => bail!("give exactly one of --model-dir DIR and --random-weights"),
    };
    let variant = pipe.variant();
    let size = match &a.video.size {
        Some(t) => parse_size(t, variant, a.video.any_size)?,
        None => *variant.sizes().iter().min_by_key(|(w, h)| w * h).unwrap(),
    };
    let settings = Settings {
        size: Some(size),
        frames: Some(a.video.frames.unwrap_or(17)),
        steps: Some(a.video.steps.unwrap_or(20)),
        guidance: a.video.guidance,
        guidance_2: a.video.guidance_2,
        shift: a.video.shift,
    };
    let sampler = SamplerKind::parse(&a.video.sampler)?;
    let opts = GenerateOptions::for_variant(
        variant,
        &a.prompt,
        WAN_NEGATIVE_PROMPT,
        &settings,
        sampler,
        a.video.seed,
    );
    let (width, height) = size;
    let layers = pipe.experts[0].config().num_layers;
    let names: Vec<String> = if a.schedules.is_empty() {
        DEFAULT_SCHEDULES.iter().map(|s| s.to_string()).collect()
    } else {
        a.schedules.clone()
    };
    // parse everything before the long runs
    let reference = ScheduleSpec::parse(&a.reference)?.resolve(opts.steps, layers)?;
    // `ATTENTION[:LINEAR]`: an attention schedule, and the blocks' linear layers (bf16 when
    // not given)
    let specs = names
        .iter()
        .map(|n| -> Result<_> {
            let (attn, lin) = n.split_once(':').unwrap_or((n, "bf16"));
            let attn = ScheduleSpec::parse(attn)
                .with_context(|| format!("{n:?}"))?
                .resolve(opts.steps, layers)?;
            let lin = LinearSpec::parse(lin).with_context(|| format!("{n:?}"))?;
            Ok((attn, lin))
        })
        .collect::<Result<Vec<_>>>()?;
    println!(
        "{variant}, {width}x{height}, {} frames, {} steps, seed {}; reference {:?}, {} schedules",
        opts.frames,
        opts.steps,
        opts.seed,
        a.reference,
        specs.len()
    );
    let (cond, uncond) = pipe.encode_prompts(&opts)?;
    let init = pipe.initial_latents(&opts)?;

    let bar = |what: &str| progress_bar(opts.steps as u64, what, a.quiet);
    let decode = |pipe: &WanPipeline,
                  latents: &Tensor,
                  policy: &dyn mxattn_wan::AttnPolicy|
     -> Result<RgbFrames> {
        let mut frames: Option<RgbFrames> = None;
        pipe.decode(latents, policy, |t| {
            let f = RgbFrames::from_tensor(&t)?;
            match frames.as_mut() {
                Some(all) => all.frames.extend(f.frames),
                None => frames = Some(f),
            }
            Ok(())
        })?;
        frames.context("the VAE produced no frames")
    };

    // reference
    let pb = bar("reference");
    let mut ref_steps: Vec<Tensor> = Vec::new();
    let ref_final = pipe.denoise(
        &opts,
        init.clone(),
        &cond,
        uncond.as_ref(),
        &reference,
        |_, x| {
            ref_steps.push(x.to_device(&Device::Cpu)?);
            pb.inc(1);
            Ok(())
        },
    )?;
    pb.finish_and_clear();
    let ref_video = if a.no_decode {
        None
    } else {
        Some(decode(&pipe, &ref_final, &reference)?)
    };

    let mut runs = Vec::new();
    let dense = pipe.experts.clone();
    for (name, (sched, linear)) in names.iter().zip(&specs) {
        if *linear != LinearSpec::dense() {
            pipe.set_linears(linear)?;
        }
        let pb = bar(name);
        let (mut rl, mut cs) = (Vec::new(), Vec::new());
        let mut i = 0;
        let fin = pipe.denoise(
            &opts,
            init.clone(),
            &cond,
            uncond.as_ref(),
            sched,
            |_, x| {
                let x = x.to_device(&Device::Cpu)?;
                rl.push(rel_l2(&x, &ref_steps[i])?);
                cs.push(cosine(&x, &ref_steps[i])?);
                i += 1;
                pb.inc(1);
                Ok(())
            },
        )?;
        pb.finish_and_clear();
        let exact = mxattn::attention::AttentionConfig::exact();
        let vae_policy: &dyn mxattn_wan::AttnPolicy = if a.vae_exact { &exact } else { sched };
        let video = match &ref_video {
            Some(r) => Some(VideoFidelity::compare(
                &decode(&pipe, &fin, vae_policy)?,
                r,
            )?),
            None => None,
        };
        pipe.experts.clone_from(&dense);
        println!(
            "{name}: final latent rel-L2 {:.4}, cosine {:.5}{}",
            rl[rl.len() - 1],
            cs[cs.len() - 1],
            video.as_ref().map_or(String::new(), |v| format!(
                ", PSNR {:.2} dB, SSIM {:.4}",
                v.mean_psnr(PSNR_CAP_DB),
                v.mean_ssim()
            ))
        );
        runs.push(Run {
            name: name.clone(),
            step_rel_l2: rl,
            step_cosine: cs,
            video,
        });
    }

    std::fs::create_dir_all(&a.out_dir)
        .with_context(|| format!("creating {}", a.out_dir.display()))?;
    let header = format!(
        "{variant}, {}{}, {width}x{height}, {} frames, {} steps, seed {}, reference `{}`, dtype {dtype:?}, device {device:?}",
        if a.random_weights { "random weights" } else { "checkpoint" },
        if a.vae_exact { ", VAE attention exact in every run" } else { "" },
        opts.frames,
        opts.steps,
        opts.seed,
        a.reference
    );
    write_report(&a.out_dir, &header, &runs)?;
    plot(&a.out_dir.join("latent_error.png"), &header, &runs)?;
    println!(
        "wrote {}/report.md, report.json, latent_error.png",
        a.out_dir.display()
    );
    Ok(())
}

fn write_report(dir: &Path, header: &str, runs: &[Run]) -> Result<()> {
    let mut md = format!("# Wan2.2 fidelity against the reference run\n\n{header}\n\n");
    md.push_str("| schedule | latent rel-L2 (final) | cosine (final) | PSNR mean / min (dB) | SSIM mean / min | temporal corr. |\n|---|---|---|---|---|---|\n");
    let mut js = Vec::new();
    for r in runs {
        let last = r.step_rel_l2.len() - 1;
        let (psnr, ssim, tc) = match &r.video {
            Some(v) => (
                format!(
                    "{:.2} / {:.2}",
                    v.mean_psnr(PSNR_CAP_DB),
                    v.psnr.iter().cloned().fold(f64::INFINITY, f64::min)
                ),
                format!(
                    "{:.4} / {:.4}",
                    v.mean_ssim(),
                    v.ssim.iter().cloned().fold(f64::INFINITY, f64::min)
                ),
                v.temporal_correlation
                    .map_or("n/a".to_string(), |c| format!("{c:.4}")),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        md.push_str(&format!(
            "| {} | {:.4} | {:.5} | {psnr} | {ssim} | {tc} |\n",
            r.name, r.step_rel_l2[last], r.step_cosine[last]
        ));
        let finite = |v: &[f64]| -> Vec<Option<f64>> {
            v.iter().map(|x| x.is_finite().then_some(*x)).collect()
        };
        js.push(serde_json::json!({
            "schedule": r.name,
            "step_rel_l2": r.step_rel_l2, "step_cosine": r.step_cosine,
            "psnr": r.video.as_ref().map(|v| finite(&v.psnr)),
            "ssim": r.video.as_ref().map(|v| v.ssim.clone()),
            "flicker_reference": r.video.as_ref().map(|v| v.flicker_reference.clone()),
            "flicker_test": r.video.as_ref().map(|v| v.flicker_test.clone()),
            "temporal_correlation": r.video.as_ref().and_then(|v| v.temporal_correlation),
        }));
    }
    md.push_str(&format!(
        "\nPSNR means count identical frames at {PSNR_CAP_DB} dB. Per-step latent errors: report.json, latent_error.png.\n"
    ));
    std::fs::write(dir.join("report.md"), md)?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&serde_json::json!({"setup": header, "runs": js}))?,
    )?;
    Ok(())
}

fn plot(path: &Path, header: &str, runs: &[Run]) -> Result<()> {
    use plotters::prelude::*;
    use plotters::style::{register_font, FontStyle};
    // plotters' ab_glyph text needs a registered font: the embedded DejaVu Sans
    let _ = register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
    let steps = runs.iter().map(|r| r.step_rel_l2.len()).max().unwrap_or(1);
    let vals: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.step_rel_l2.iter().copied())
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let lo = vals.iter().cloned().fold(f64::INFINITY, f64::min).min(1e-3);
    let hi = vals.iter().cloned().fold(0.0, f64::max).max(lo * 10.0);
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    let err = |e: String| anyhow::anyhow!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Latent rel-L2 vs the reference, per denoising step",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0usize..steps.max(2) - 1, (lo * 0.8..hi * 1.25).log_scale())
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(format!("step  ({header})"))
        .y_desc("rel-L2")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, r) in runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(usize, f64)> = r
            .step_rel_l2
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite() && **v > 0.0)
            .map(|(s, v)| (s, *v))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(r.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| err(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}
