//! Runs the Wan diffusion transformer: parity with the diffusers fixtures on any device, and
//! timing of one forward with random weights at a real shape.
//!
//! ```text
//! # fixtures (f32, exact attention) on the GPU
//! cargo run --release --features cuda --example wan_transformer -- --device cuda --check-fixtures
//! # one TI2V-5B forward at 1280×704, 121 frames (latent 31×44×80), first 4 of 30 layers
//! cargo run --release --features cuda --example wan_transformer -- --device cuda \
//!     --model ti2v-5b --layers 4 --grid 31x44x80 --attn exact,fused-mxfp8
//! # where a block's time goes, fused vs Candle's op-by-op elementwise chain
//! cargo run --release --features cuda --example wan_transformer -- --device cuda \
//!     --model t2v-a14b --layers 2 --grid 21x90x160 --elementwise both --profile-stages
//! ```

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use clap::Parser;
use mxattn::attention::AttentionConfig;
use mxattn_cli::spans::SpanTimes;
use mxattn_cli::DeviceArgs;
use mxattn_wan::profile;
use mxattn_wan::schedule::attention_config;
use mxattn_wan::transformer::{TransformerConfig, WanTransformer};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Compare with the diffusers outputs in crates/wan/tests/fixtures/wan/transformer (f32, exact).
    #[arg(long)]
    check_fixtures: bool,
    /// The fixture directory (default: the one in this source tree).
    #[arg(long)]
    fixtures: Option<PathBuf>,
    /// Random-weight timing: t2v-a14b or ti2v-5b.
    #[arg(long)]
    model: Option<String>,
    /// Keep only the first N blocks (time scales linearly in blocks).
    #[arg(long)]
    layers: Option<usize>,
    /// Latent grid FxHxW (A14B 480p 81 frames: 21x60x104; 720p: 21x90x160; 5B 720p: 31x44x80).
    #[arg(long, default_value = "21x60x104")]
    grid: String,
    /// Text length (the pipeline pads to 512).
    #[arg(long, default_value_t = 512)]
    text_len: usize,
    /// Comma-separated attention presets (exact, bf16, mxfp8, fused-mxfp8, …; `kv-*` do not apply).
    #[arg(long, default_value = "exact")]
    attn: String,
    #[arg(long, default_value_t = 2)]
    reps: usize,
    /// Elementwise ops around attention: fused (mxattn::fused, the default), unfused (Candle's
    /// op-by-op chain) or both (each timed; outputs compared).
    #[arg(long, default_value = "fused", value_parser = ["fused", "unfused", "both"])]
    elementwise: String,
    /// After the timed reps, run one more forward with every block stage timed between device
    /// synchronizations and print the table (seconds per forward, share).
    #[arg(long)]
    profile_stages: bool,
    /// Linear schedule of the projections (bf16, fp8, fp8-w, …; wan22's `--linear`).
    #[arg(long, default_value = "bf16")]
    linear: String,
}

fn sync(d: &Device) -> Result<()> {
    d.synchronize()?;
    Ok(())
}

fn check_fixtures(dev: &Device, dir: Option<PathBuf>) -> Result<()> {
    let dir = dir.unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../crates/wan/tests/fixtures/wan/transformer")
    });
    let all = candle_core::safetensors::load(dir.join("expected.safetensors"), dev)?;
    for name in ["a14b", "ti2v5b", "a14b_original"] {
        let key = name.trim_end_matches("_original");
        let m = WanTransformer::load(dir.join(name), DType::F32, dev)?;
        let g = |k: &str| all[&format!("{key}.{k}")].clone();
        let out = m.forward(
            &g("latents"),
            &g("timestep"),
            &g("text"),
            &AttentionConfig::exact(),
            0,
            0,
        )?;
        let d = (out - g("out"))?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_scalar::<f32>()?;
        println!("fixture {name} on {dev:?}: max |diff| vs diffusers = {d:.3e}");
        if d >= 1e-4 {
            bail!("fixture {name}: {d:e} ≥ 1e-4");
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let a = Args::parse();
    let dev = a.dev.device()?;
    if a.check_fixtures {
        check_fixtures(&dev, a.fixtures.clone())?;
    }
    let Some(model) = &a.model else {
        return Ok(());
    };
    let mut cfg = match model.as_str() {
        "t2v-a14b" | "a14b" => TransformerConfig::t2v_a14b(),
        "ti2v-5b" | "5b" => TransformerConfig::ti2v_5b(),
        m => bail!("unknown model {m:?} (t2v-a14b, ti2v-5b)"),
    };
    let full_layers = cfg.num_layers;
    if let Some(l) = a.layers {
        cfg.num_layers = l.min(full_layers);
    }
    let grid: Vec<usize> = a
        .grid
        .split('x')
        .map(|s| s.trim().parse::<usize>())
        .collect::<std::result::Result<_, _>>()?;
    let [f, h, w] = grid[..] else {
        bail!("--grid must be FxHxW, got {:?}", a.grid)
    };
    let dtype = a.dev.dtype(&dev)?;
    let t0 = Instant::now();
    let mut m = WanTransformer::random(&cfg, dtype, &dev, 0)?;
    let plan = mxattn_wan::schedule::LinearSpec::parse(&a.linear)
        .map_err(|e| anyhow::anyhow!("--linear: {e}"))?
        .resolve(cfg.num_layers)?;
    m.set_linears(|layer, kind| plan.format(0, layer, kind))?;
    sync(&dev)?;
    let n = m.num_tokens(f, h, w);
    println!(
        "{model}: {} of {full_layers} layers, dim {}, random weights in {:.1}s; latent {f}x{h}x{w} = {n} tokens, text {}; linear layers {}",
        cfg.num_layers,
        cfg.dim(),
        t0.elapsed().as_secs_f64(),
        a.text_len,
        m.linear_summary()
    );
    let latents = Tensor::randn(0f32, 1.0, (1, cfg.in_channels, f, h, w), &dev)?;
    let text = Tensor::randn(0f32, 1.0, (1, a.text_len, cfg.text_dim), &dev)?;
    let t = if cfg.in_channels == 48 {
        Tensor::full(800f32, (1, n), &dev)? // TI2V-5B: per-token timesteps
    } else {
        Tensor::new(&[800f32], &dev)?
    };
    let mut reference: Option<Tensor> = None;
    let variants: &[bool] = match a.elementwise.as_str() {
        "fused" => &[true],
        "unfused" => &[false],
        _ => &[false, true],
    };
    // --profile-stages: the block stages' spans, on for one extra forward per config
    let stage_times = if a.profile_stages {
        Some(SpanTimes::install(profile::STAGES).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    for (name, fused) in a
        .attn
        .split(',')
        .flat_map(|n| variants.iter().map(move |f| (n, *f)))
    {
        m.set_fused_elementwise(fused);
        let label = format!("{name}{}", if fused { "" } else { " unfused" });
        let cfg_attn = attention_config(name)?;
        let mut times = Vec::new();
        let mut out = None;
        for _ in 0..a.reps.max(1) {
            sync(&dev)?;
            let s = Instant::now();
            let o = m.forward(&latents, &t, &text, &cfg_attn, 0, 0)?;
            sync(&dev)?;
            times.push(s.elapsed().as_secs_f64());
            out = Some(o);
        }
        let out = out.expect("one rep").to_dtype(DType::F32)?;
        let finite = out
            .flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .all(|x| x.is_finite());
        let best = times.iter().cloned().fold(f64::INFINITY, f64::min);
        let rel = match &reference {
            Some(r) => {
                let num = (&out - r)?.sqr()?.sum_all()?.to_scalar::<f32>()?;
                let den = r.sqr()?.sum_all()?.to_scalar::<f32>()?;
                format!(", rel. L2 vs first = {:.3e}", (num / den).sqrt())
            }
            None => String::new(),
        };
        println!(
            "  {label:>20}: forward {best:.3}s ({:.3}s/block, ~{:.1}s for all {full_layers} blocks), finite {finite}{rel}",
            best / cfg.num_layers as f64,
            best / cfg.num_layers as f64 * full_layers as f64
        );
        if reference.is_none() {
            reference = Some(out);
        }
        if let Some(times) = &stage_times {
            times.set_on(true);
            let s = Instant::now();
            m.forward(&latents, &t, &text, &cfg_attn, 0, 0)?;
            sync(&dev)?;
            let total = s.elapsed().as_secs_f64();
            times.set_on(false);
            let stages = times.take();
            let staged: f64 = stages.iter().map(|s| s.1).sum();
            println!("    | stage | s per forward | calls | share |\n    |---|---|---|---|");
            for (stage, secs, calls) in &stages {
                println!(
                    "    | {stage} | {secs:.4} | {calls} | {:.1} % |",
                    100.0 * secs / total
                );
            }
            println!(
                "    | outside the stages (embeddings, head, launch gaps) | {:.4} | | {:.1} % |",
                total - staged,
                100.0 * (total - staged) / total
            );
        }
    }
    Ok(())
}
