//! Accuracy of every attention algorithm on real activations: the Q, K and V of every layer
//! of a real model (default: SmolLM2-135M-Instruct, `scripts/fetch_smollm2.sh`) from one
//! forward pass over a real text window (default: the first 2048 tokens of the embedded
//! *Pride and Prejudice*), each algorithm run on them against float64 exact attention.
//!
//! Per layer and algorithm: the per-row relative output error ‖o − ref‖/‖ref‖ (mean and max
//! over rows and heads), the operand floor (exact softmax on the same quantized operands,
//! the same Hadamard rotation and Q scaling for Fused-Softmax) and the error the algorithm
//! adds to its floor, ‖o − o_floor‖/‖o_floor‖: the Fused-Softmax paper claims the added
//! error stays below the floor. Also per layer: how much attention the first key (the
//! "sink") takes, from the f64 reference.
//!
//! ```text
//! cargo run --release --bin real_attention -- --smollm2 --out evals/results/real_attention_smollm2
//! ```

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, IndexOp, Tensor};
use clap::Parser;
use mxattn::attention::presets::preset;
use mxattn::attention::{attention_ext, Algorithm, AttentionConfig, FusedProbs, RunOptions};
use mxattn::oracle::{
    exact_attention_f64, mean_max, row_relative_differences, row_relative_errors, OracleMask,
    OracleOutput,
};
use mxattn_cli::progress_bar;
use mxattn_llm::{chat, smollm2, GgufFile, ScheduleSpec};
use serde::Serialize;
use std::path::{Path, PathBuf};

const DEFAULT_TEXT: &str = include_str!("data/pride_and_prejudice_ch1-12.txt");

/// The algorithms: the presets `--attn` takes (without the `kv-*` ones, which only change
/// a KV cache), with both Fused-Softmax P generations for every format.
const VARIANTS: &[&str] = &[
    "exact",
    "bf16",
    "mxfp8",
    "mxfp6",
    "mxfp4",
    "fused-mxfp8/fp32",
    "fused-mxfp8/u8",
    "fused-mxfp6/fp32",
    "fused-mxfp6/u8",
    "fused-mxfp4/fp32",
    "fused-mxfp4/u8",
    "efq-mmlu",
    "efq-mean",
    "efq-exact",
];

#[derive(Parser, Debug)]
#[command(
    name = "real_attention",
    about = "Accuracy of every attention algorithm on a real model's Q, K, V (every layer) against float64 exact attention"
)]
struct Args {
    /// A GGUF file (default: SmolLM2 from where scripts/fetch_smollm2.sh put it).
    #[arg(long)]
    gguf: Option<PathBuf>,
    /// Text whose first --tokens tokens make the window (default: the embedded Pride and
    /// Prejudice ch. 1-12).
    #[arg(long)]
    text: Option<PathBuf>,
    /// Tokens in the window.
    #[arg(long, default_value_t = 2048)]
    tokens: usize,
    /// Only these layers (comma separated; default all).
    #[arg(long, value_delimiter = ',')]
    layers: Vec<usize>,
    /// Only these algorithms (comma separated; default all: exact, bf16, mxfp8/6/4,
    /// fused-mxfp8/6/4 with /fp32 and /u8 P, efq-mmlu, efq-mean, efq-exact; /u8w, the wide u8
    /// code, on request).
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Write report.md, report.json, error_per_layer.png and fused_claim_per_layer.png here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One algorithm on one layer.
#[derive(Serialize, Clone, Debug)]
struct LayerRow {
    layer: usize,
    variant: String,
    config: String,
    err_mean: f64,
    err_max: f64,
    floor_mean: f64,
    floor_max: f64,
    added_mean: f64,
    added_max: f64,
    rollbacks: u64,
}

/// One algorithm over the layers.
#[derive(Serialize, Clone, Debug)]
struct Summary {
    variant: String,
    mean_of_layers: f64,
    worst_layer: usize,
    worst_layer_mean: f64,
    worst_row: f64,
    floor_mean_of_layers: f64,
    added_mean_of_layers: f64,
    /// layers where the mean added error is below the mean floor
    claim_holds_layers: usize,
    layers: usize,
}

/// The config of a variant name and its operand floor (exact softmax on the same
/// quantized operands; for Fused-Softmax the same scaled, rotated operands and P in f32).
fn variant(name: &str) -> Result<(AttentionConfig, AttentionConfig)> {
    let (base, probs) = match name.split_once('/') {
        Some((b, "fp32")) => (b, Some(FusedProbs::Fp32Bits)),
        Some((b, "u8")) => (b, Some(FusedProbs::U8Code)),
        Some((b, "u8w")) => (b, Some(FusedProbs::U8CodeWide)),
        Some((_, p)) => bail!("{name}: unknown P generation {p:?} (fp32, u8 or u8w)"),
        None => (name, None),
    };
    let mut cfg = preset(base)?.config.with_causal(true);
    let floor = match &mut cfg.algorithm {
        Algorithm::FusedSoftmax(f) => {
            if let Some(p) = probs {
                f.probs = p;
            }
            let mut fl = cfg.clone();
            if let Algorithm::FusedSoftmax(ff) = &mut fl.algorithm {
                ff.probs = FusedProbs::ExactF32;
            }
            fl
        }
        _ => {
            if probs.is_some() {
                bail!("{name}: /fp32, /u8 and /u8w apply to Fused-Softmax only");
            }
            AttentionConfig::exact()
                .with_formats(
                    cfg.qk_format,
                    cfg.v_format,
                    mxattn::attention::ProbFormat::F32,
                )
                .with_causal(true)
        }
    };
    Ok((cfg, floor))
}

fn f32s(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

/// Mean over rows of the attention probability of key 0.
fn sink_mass(q: &Tensor, k: &Tensor, r: &OracleOutput) -> Result<f64> {
    let (_, hq, sq, d) = q.dims4()?;
    let hkv = k.dim(1)?;
    let k0 = k.i((0, .., 0, ..))?.to_dtype(DType::F32)?; // [hkv, d]
    let qv = f32s(q)?;
    let kv = f32s(&k0)?;
    let scale = 1.0 / (d as f64).sqrt();
    let mut sum = 0.0;
    for h in 0..hq {
        let kh = &kv[(h / (hq / hkv)) * d..][..d];
        for i in 0..sq {
            let row = h * sq + i;
            let qi = &qv[row * d..][..d];
            let s: f64 = qi.iter().zip(kh).map(|(a, b)| *a as f64 * *b as f64).sum();
            sum += (s * scale - r.lse[row]).exp();
        }
    }
    Ok(sum / (hq * sq) as f64)
}

fn main() -> Result<()> {
    let a = Args::parse();
    let path = match &a.gguf {
        Some(p) => p.clone(),
        None => smollm2::find().with_context(|| {
            format!(
                "no SmolLM2 GGUF at {:?}: run scripts/fetch_smollm2.sh, or pass --gguf FILE",
                smollm2::default_path()
            )
        })?,
    };
    let names: Vec<String> = if a.variants.is_empty() {
        VARIANTS.iter().map(|s| s.to_string()).collect()
    } else {
        a.variants.clone()
    };
    let variants: Vec<(String, AttentionConfig, AttentionConfig)> = names
        .iter()
        .map(|n| variant(n).map(|(c, f)| (n.clone(), c, f)))
        .collect::<Result<_>>()?;

    let dev = Device::Cpu;
    let g = GgufFile::open(&path)?;
    let cfg = g.config()?;
    let n_layers = cfg.num_hidden_layers;
    let layers: Vec<usize> = if a.layers.is_empty() {
        (0..n_layers).collect()
    } else {
        a.layers.clone()
    };
    if let Some(&l) = layers.iter().find(|&&l| l >= n_layers) {
        bail!("--layers: layer {l} does not exist ({n_layers} layers)");
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
    let tok = g.tokenizer()?;
    let mut ids = chat::encode(&tok, &text)?;
    if ids.len() < a.tokens {
        bail!(
            "the text has {} tokens, fewer than --tokens {}",
            ids.len(),
            a.tokens
        );
    }
    ids.truncate(a.tokens);

    // The forward pass that makes the activations: f32 weights, exact attention.
    let sched = ScheduleSpec::parse("exact")?.resolve(n_layers)?;
    let mut model = g.load(&sched, DType::F32, &dev)?;
    model.set_capture(true);
    let t0 = std::time::Instant::now();
    model.forward_hidden(&Tensor::new(ids.as_slice(), &dev)?.unsqueeze(0)?)?;
    let captured = model.take_captured();
    drop(model);
    println!(
        "# real_attention: {} ({} layers, {} q / {} kv heads, d {}), {} tokens of {text_name}; forward {:.1} s",
        path.file_name().map_or("?".into(), |f| f.to_string_lossy()),
        n_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        ids.len(),
        t0.elapsed().as_secs_f64()
    );

    let pb = progress_bar(
        (layers.len() * (1 + 2 * variants.len())) as u64,
        "layers",
        false,
    );
    let mut rows: Vec<LayerRow> = Vec::new();
    let mut sinks: Vec<(usize, f64)> = Vec::new();
    for &l in &layers {
        let qkv = captured[l]
            .as_ref()
            .with_context(|| format!("layer {l}: nothing captured"))?;
        pb.set_message(format!("layer {l}: f64 reference"));
        let mask = OracleMask {
            causal: true,
            ..Default::default()
        };
        let reference = exact_attention_f64(&qkv.q, &qkv.k, &qkv.v, &mask)?;
        sinks.push((l, sink_mass(&qkv.q, &qkv.k, &reference)?));
        pb.inc(1);
        let d = qkv.q.dim(3)?;
        for (name, c, fl) in &variants {
            pb.set_message(format!("layer {l}: {name}"));
            let run = |cfg: &AttentionConfig| -> Result<(Vec<f32>, u64)> {
                let r = attention_ext(&qkv.q, &qkv.k, &qkv.v, cfg, &RunOptions::default())
                    .with_context(|| format!("layer {l}: {name}"))?;
                Ok((f32s(&r.out)?, r.stats.rollbacks))
            };
            let (o, rollbacks) = run(c)?;
            pb.inc(1);
            let (of, _) = run(fl)?;
            pb.inc(1);
            let (err_mean, err_max) = mean_max(&row_relative_errors(&o, &reference));
            let (floor_mean, floor_max) = mean_max(&row_relative_errors(&of, &reference));
            let (added_mean, added_max) = mean_max(&row_relative_differences(&o, &of, d));
            rows.push(LayerRow {
                layer: l,
                variant: name.clone(),
                config: c.label(),
                err_mean,
                err_max,
                floor_mean,
                floor_max,
                added_mean,
                added_max,
                rollbacks,
            });
        }
    }
    pb.finish_and_clear();

    let summaries: Vec<Summary> = variants
        .iter()
        .map(|(name, _, _)| {
            let rs: Vec<&LayerRow> = rows.iter().filter(|r| &r.variant == name).collect();
            let n = rs.len().max(1) as f64;
            let worst = rs
                .iter()
                .max_by(|a, b| a.err_mean.total_cmp(&b.err_mean))
                .expect("at least one layer");
            Summary {
                variant: name.clone(),
                mean_of_layers: rs.iter().map(|r| r.err_mean).sum::<f64>() / n,
                worst_layer: worst.layer,
                worst_layer_mean: worst.err_mean,
                worst_row: rs.iter().map(|r| r.err_max).fold(0.0, f64::max),
                floor_mean_of_layers: rs.iter().map(|r| r.floor_mean).sum::<f64>() / n,
                added_mean_of_layers: rs.iter().map(|r| r.added_mean).sum::<f64>() / n,
                claim_holds_layers: rs.iter().filter(|r| r.added_mean < r.floor_mean).count(),
                layers: rs.len(),
            }
        })
        .collect();

    let header = format!(
        "{}, {} tokens of {text_name}, causal, layers {}",
        path.file_name().map_or("?".into(), |f| f.to_string_lossy()),
        ids.len(),
        if a.layers.is_empty() {
            format!("0-{}", n_layers - 1)
        } else {
            format!("{:?}", a.layers)
        }
    );
    let md = report_md(&header, &summaries, &rows, &sinks);
    println!("{md}");
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
        std::fs::write(dir.join("report.md"), &md)?;
        let js = serde_json::json!({
            "setup": header, "tokens": ids.len(), "summaries": summaries, "layers": rows,
            "sink_mass": sinks.iter().map(|(l, s)| serde_json::json!({"layer": l, "key0_mass": s})).collect::<Vec<_>>(),
        });
        std::fs::write(
            dir.join("report.json"),
            serde_json::to_string_pretty(&js)? + "\n",
        )?;
        plots(dir, &header, &variants, &rows)?;
        eprintln!("wrote {}", dir.display());
    }
    Ok(())
}

fn report_md(header: &str, sums: &[Summary], rows: &[LayerRow], sinks: &[(usize, f64)]) -> String {
    let mut s = format!("## Attention on real activations: {header}\n\n");
    s.push_str(
        "err = per-row ‖o − ref‖/‖ref‖ against float64 exact attention (mean over rows and heads of a \
         layer); floor = exact softmax on the same quantized operands; added = ‖o − o_floor‖/‖o_floor‖. \
         The claim \"added < floor\" is counted per layer (means).\n\n",
    );
    s.push_str("| algorithm | err, mean of layers | worst layer (err) | worst row | floor, mean of layers | added, mean of layers | added < floor (layers) |\n");
    s.push_str("|---|---|---|---|---|---|---|\n");
    for m in sums {
        s.push_str(&format!(
            "| {} | {:.3e} | {} ({:.3e}) | {:.3e} | {:.3e} | {:.3e} | {}/{} |\n",
            m.variant,
            m.mean_of_layers,
            m.worst_layer,
            m.worst_layer_mean,
            m.worst_row,
            m.floor_mean_of_layers,
            m.added_mean_of_layers,
            m.claim_holds_layers,
            m.layers
        ));
    }
    s.push_str("\n### Per layer: mean err (added / floor for Fused-Softmax and EFQ), key-0 attention mass\n\n");
    let names: Vec<&str> = sums.iter().map(|m| m.variant.as_str()).collect();
    s.push_str("| layer | key-0 mass |");
    for n in &names {
        s.push_str(&format!(" {n} |"));
    }
    s.push_str("\n|---|---|");
    for _ in &names {
        s.push_str("---|");
    }
    s.push('\n');
    for (l, mass) in sinks {
        s.push_str(&format!("| {l} | {mass:.3} |"));
        for n in &names {
            let r = rows
                .iter()
                .find(|r| r.layer == *l && r.variant == *n)
                .expect("every layer has every variant");
            if n.starts_with("fused") || n.starts_with("efq") {
                s.push_str(&format!(
                    " {:.2e} ({:.1e}/{:.1e}) |",
                    r.err_mean, r.added_mean, r.floor_mean
                ));
            } else {
                s.push_str(&format!(" {:.2e} |", r.err_mean));
            }
        }
        s.push('\n');
    }
    s
}

/// Distinct colours for up to 16 lines (plotters' palette has near-white entries).
const COLORS: [(u8, u8, u8); 16] = [
    (0, 0, 0),
    (128, 128, 128),
    (230, 25, 75),
    (60, 180, 75),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (128, 128, 0),
    (0, 128, 128),
    (170, 110, 40),
    (128, 0, 0),
    (0, 0, 128),
    (210, 180, 0),
    (100, 200, 130),
];

/// One line of a per-layer plot.
struct Line {
    name: String,
    points: Vec<(usize, f64)>,
    dashed: bool,
}

/// A log-scale plot of `lines` over the layers.
fn plot_lines(path: &Path, title: &str, x_desc: &str, y_desc: &str, lines: &[Line]) -> Result<()> {
    use plotters::prelude::*;
    use plotters::style::{register_font, FontStyle};
    // plotters' ab_glyph text needs a registered font: the embedded DejaVu Sans
    let _ = register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
    let vals: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let lo = vals.iter().cloned().fold(f64::INFINITY, f64::min).min(1e-3);
    let hi = vals.iter().cloned().fold(0.0, f64::max).max(lo * 10.0);
    let max_layer = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .max()
        .unwrap_or(0)
        .max(1);
    let root = BitMapBackend::new(path, (1100, 700)).into_drawing_area();
    let err = |e: String| anyhow::anyhow!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0usize..max_layer, (lo * 0.8..hi * 1.25).log_scale())
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .y_label_formatter(&|v| format!("{v:.0e}"))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, l) in lines.iter().enumerate() {
        let (r, g, b) = COLORS[i % COLORS.len()];
        let color = RGBColor(r, g, b).to_rgba();
        let pts: Vec<(usize, f64)> = l
            .points
            .iter()
            .copied()
            .filter(|(_, v)| v.is_finite() && *v > 0.0)
            .collect();
        let style = color.stroke_width(if l.dashed { 1 } else { 2 });
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .map_err(|e| err(e.to_string()))?
            .label(l.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| err(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// error_per_layer.png (every algorithm against float64) and fused_claim_per_layer.png
/// (Fused-Softmax's added error per P generation against its floor).
fn plots(
    dir: &Path,
    header: &str,
    variants: &[(String, AttentionConfig, AttentionConfig)],
    rows: &[LayerRow],
) -> Result<()> {
    let series = |name: &str, f: fn(&LayerRow) -> f64| -> Vec<(usize, f64)> {
        rows.iter()
            .filter(|r| r.variant == name)
            .map(|r| (r.layer, f(r)))
            .collect()
    };
    let lines: Vec<Line> = variants
        .iter()
        .map(|(n, _, _)| Line {
            name: n.clone(),
            points: series(n, |r| r.err_mean),
            dashed: false,
        })
        .collect();
    plot_lines(
        &dir.join("error_per_layer.png"),
        "Attention output error vs float64 exact, per layer (real Q, K, V)",
        &format!("layer  ({header})"),
        "mean row ||o - ref|| / ||ref||",
        &lines,
    )?;
    let mut fl = Vec::new();
    for f in ["fused-mxfp8", "fused-mxfp6", "fused-mxfp4"] {
        let (u8n, f32n) = (format!("{f}/u8"), format!("{f}/fp32"));
        if !rows.iter().any(|r| r.variant == u8n || r.variant == f32n) {
            continue;
        }
        let floor_of = if rows.iter().any(|r| r.variant == u8n) {
            &u8n
        } else {
            &f32n
        };
        fl.push(Line {
            name: format!("{f} floor"),
            points: series(floor_of, |r| r.floor_mean),
            dashed: true,
        });
        for n in [&u8n, &f32n] {
            if rows.iter().any(|r| &r.variant == n) {
                fl.push(Line {
                    name: format!("{n} added"),
                    points: series(n, |r| r.added_mean),
                    dashed: false,
                });
            }
        }
    }
    if !fl.is_empty() {
        plot_lines(
            &dir.join("fused_claim_per_layer.png"),
            "Fused-Softmax: error added to the operand floor, per layer (claim: added < floor)",
            &format!("layer  ({header})"),
            "mean row relative error",
            &fl,
        )?;
    }
    Ok(())
}
