//! CPU attention benchmark: mxattn's paths against candle's own CPU attention, timed in
//! the same run. Prints milliseconds (median of --iters after --warmup) and the ratio
//! to candle's CPU flash attention.
//!
//!     cargo run --release --example bench_attention [-- --iters 5]

mod baselines;

use anyhow::Result;
use candle_core::{Tensor, D};
use clap::Parser;
use mxattn::attention::{
    attention_ext, AttentionConfig, CpuPath, EfqConfig, EfqRule, FusedProbs, FusedSoftmaxConfig,
    OperandFormat, ProbFormat, RunOptions,
};
use mxattn::mx::ElemFormat;
use mxattn::synth::{self, Distribution, Shape};
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    about = "Times mxattn's CPU attention against candle's CPU flash attention and matmul-softmax-matmul"
)]
struct Args {
    /// Timed iterations per entry (the median is reported).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Untimed warm-up iterations per entry.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Shapes as b,hq,hkv,s,d (semicolon separated).
    #[arg(long, default_value = "1,8,8,2048,128;1,32,8,1024,128")]
    shapes: String,
    /// Causal masking.
    #[arg(long)]
    causal: bool,
    /// Only entries whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Include the scalar reference path (slow).
    #[arg(long)]
    reference: bool,
}

fn time_it(warmup: usize, iters: usize, mut f: impl FnMut() -> Result<Tensor>) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    let mut ts = vec![];
    for _ in 0..iters {
        let t0 = Instant::now();
        let o = f()?;
        // make sure the result is materialized
        let _ = o.dims();
        ts.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(ts[ts.len() / 2])
}

fn parse_shapes(s: &str) -> Result<Vec<Shape>> {
    s.split(';')
        .map(|p| {
            let v: Vec<usize> = p
                .split(',')
                .map(|x| x.trim().parse())
                .collect::<Result<_, _>>()?;
            anyhow::ensure!(v.len() == 5, "shape '{p}' must be b,hq,hkv,s,d");
            Ok(Shape::new(v[0], v[1], v[2], v[3], v[3], v[4]))
        })
        .collect()
}

fn candle_flash(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Result<Tensor> {
    let d = q.dim(D::Minus1)?;
    // candle's CPU flash takes (B, S, H, D)
    let (qt, kt, vt) = (
        q.transpose(1, 2)?.contiguous()?,
        k.transpose(1, 2)?.contiguous()?,
        v.transpose(1, 2)?.contiguous()?,
    );
    let mask = if causal {
        candle_nn::attention::AttnMask::causal()
    } else {
        candle_nn::attention::AttnMask::None
    };
    Ok(candle_nn::attention::flash_attn::<f32>(
        &qt,
        &kt,
        &vt,
        1.0 / (d as f32).sqrt(),
        mask,
        None,
        None,
    )?)
}

fn main() -> Result<()> {
    let a = Args::parse();
    let threads = rayon::current_num_threads();
    println!(
        "# bench_attention: CPU, f32 inputs, {threads} threads, median of {} after {} warm-up",
        a.iters, a.warmup
    );
    println!("| shape (b, hq/hkv, s, d) | implementation | ms | vs candle flash |");
    println!("|---|---|---|---|");
    use ElemFormat::*;
    for s in parse_shapes(&a.shapes)? {
        let inp = synth::make(Distribution::Gaussian { sigma: 1.0 }, s, 42)?;
        let (q, k, v) = (&inp.q, &inp.k, &inp.v);
        let causal = a.causal;
        let base = time_it(a.warmup, a.iters, || candle_flash(q, k, v, causal))?;
        let mut rows: Vec<(String, f64)> = vec![("candle flash_attn (cpu)".into(), base)];
        let keep = |n: &str| a.filter.as_ref().is_none_or(|f| n.contains(f.as_str()));
        if keep("candle matmul") {
            rows.push((
                "candle matmul-softmax-matmul".into(),
                time_it(a.warmup, a.iters, || {
                    Ok(baselines::candle_matmul_attention(q, k, v, causal)?)
                })?,
            ));
        }
        let fp4 = OperandFormat::mx(E2M1);
        let fp8v = OperandFormat::fp8_per_channel();
        let e4m3p = ProbFormat::Fp8 { elem: E4M3 };
        let fused = |qk: ElemFormat, probs: FusedProbs| {
            AttentionConfig::fused_softmax(
                qk,
                fp8v,
                FusedSoftmaxConfig {
                    probs,
                    hadamard: true,
                },
            )
        };
        let mut entries: Vec<(String, AttentionConfig)> = vec![
            ("mxattn exact".into(), AttentionConfig::exact()),
            (
                "mxattn exp->MXFP4 P, MXFP4 QK, FP8 V".into(),
                AttentionConfig::exp_then_quantize(fp4, fp8v, ProbFormat::mx(E2M1)),
            ),
        ];
        // EFQ next to exp-then-quantize with MXFP4 P (above), same Q/K and V formats
        for (n, rule) in [
            ("EFQ-MMLU", EfqRule::Mmlu),
            ("EFQ-LUT", EfqRule::Lut),
            ("EFQ exact thresholds", EfqRule::ExactThresholds),
            ("EFQ-2piece", EfqRule::TwoPiece),
        ] {
            entries.push((
                format!("mxattn {n}, MXFP4 QK, FP8 V"),
                AttentionConfig::efq(EfqConfig::new(rule), fp4, fp8v),
            ));
        }
        // Fused-Softmax next to exp-then-quantize with the same formats (E4M3 P)
        for qk in [E4M3, E2M1] {
            let qkf = mxattn::attention::fused_qk_format(qk);
            let tag = format!("{} QK, FP8 V, E4M3 P", qk.mx_name());
            entries.push((
                format!("mxattn exp-then-quantize, {tag}"),
                AttentionConfig::exp_then_quantize(qkf, fp8v, e4m3p),
            ));
            entries.push((
                format!("mxattn fused-softmax u8, {tag}"),
                fused(qk, FusedProbs::U8Code),
            ));
            entries.push((
                format!("mxattn fused-softmax fp32, {tag}"),
                fused(qk, FusedProbs::Fp32Bits),
            ));
        }
        for (_, c) in entries.iter_mut() {
            c.causal = causal;
        }
        for (name, cfg) in &entries {
            if !keep(name) {
                continue;
            }
            let paths: &[CpuPath] = if a.reference {
                &[CpuPath::Tiled, CpuPath::Reference]
            } else {
                &[CpuPath::Tiled]
            };
            for &path in paths {
                let opts = RunOptions {
                    cpu_path: path,
                    lse: false,
                    ..Default::default()
                };
                let ms = time_it(a.warmup, a.iters, || {
                    Ok(attention_ext(q, k, v, cfg, &opts)?.out)
                })?;
                let suffix = if path == CpuPath::Reference {
                    " [reference]"
                } else {
                    ""
                };
                rows.push((format!("{name}{suffix}"), ms));
            }
        }
        for (name, ms) in rows {
            println!("| {s} | {name} | {ms:.1} | {:.2}x |", base / ms);
        }
    }
    println!(
        "\nratio = candle flash ms / this ms (above 1: faster than candle's CPU flash attention)"
    );
    Ok(())
}
