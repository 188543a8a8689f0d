//! GPU attention benchmark (build with `--features cuda`): every mxattn kernel and
//! candle's own CUDA attention (bf16 matmul-softmax-matmul) at the given shapes, timed with
//! CUDA events after warm-up. Run beside `../shared/bench` in the same device command so
//! the cuDNN / FlashAttention rows come from the same machine and minute.
//!
//!     bench_gpu --shapes "1,40,40,75600,128;1,32,8,4096,128,causal"

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use clap::Parser;
use mxattn::attention::{
    attention_ext, AttentionConfig, EfqConfig, EfqRule, FusedProbs, FusedSoftmaxConfig,
    OperandFormat, ProbFormat, RunOptions,
};
use mxattn::mx::ElemFormat;

#[derive(Parser, Debug)]
#[command(
    about = "Times mxattn's CUDA attention kernels (CUDA events) against candle's CUDA attention"
)]
struct Args {
    /// Shapes `b,hq,hkv,s,d[,causal][,kv=N]` (N keys, default s), semicolon separated.
    #[arg(long, default_value = "1,8,8,2048,128;1,32,8,4096,128,causal")]
    shapes: String,
    #[arg(long, default_value_t = 5)]
    iters: usize,
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Only entries whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Also write the rows as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

struct ShapeArg {
    b: usize,
    hq: usize,
    hkv: usize,
    s: usize,
    sk: usize,
    d: usize,
    causal: bool,
}

fn parse(s: &str) -> Result<Vec<ShapeArg>> {
    s.split(';')
        .map(|p| {
            let f: Vec<&str> = p.split(',').map(str::trim).collect();
            if f.len() < 5 {
                bail!("shape '{p}' must be b,hq,hkv,s,d[,causal]");
            }
            let n: Vec<usize> = f[..5].iter().map(|x| x.parse()).collect::<Result<_, _>>()?;
            let causal = f[5..].contains(&"causal");
            let sk = match f[5..].iter().find_map(|x| x.strip_prefix("kv=")) {
                Some(v) => v.parse()?,
                None => n[3],
            };
            Ok(ShapeArg {
                b: n[0],
                hq: n[1],
                hkv: n[2],
                s: n[3],
                sk,
                d: n[4],
                causal,
            })
        })
        .collect()
}

fn time_ms(
    dev: &Device,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<Tensor>,
) -> Result<f64> {
    let Device::Cuda(cd) = dev else {
        bail!("not a CUDA device")
    };
    let stream = cd.cuda_stream();
    for _ in 0..warmup {
        f()?;
    }
    stream.synchronize()?;
    let flags =
        Some(candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(flags)?;
    for _ in 0..iters {
        f()?;
    }
    let end = stream.record_event(flags)?;
    Ok(start.elapsed_ms(&end)? as f64 / iters as f64)
}

fn main() -> Result<()> {
    let a = Args::parse();
    let dev = Device::new_cuda(0)?;
    use ElemFormat::*;
    let fp8v = OperandFormat::fp8_per_channel();
    let entries: Vec<(&str, AttentionConfig)> = vec![
        ("mxattn exact bf16", AttentionConfig::exact()),
        (
            "mxattn exp->E4M3 P, MXFP8 QK, FP8 V",
            AttentionConfig::exp_then_quantize(
                OperandFormat::mx(E4M3),
                fp8v,
                ProbFormat::Fp8 { elem: E4M3 },
            ),
        ),
        (
            "mxattn fused-softmax u8, MXFP8 QK, FP8 V",
            AttentionConfig::fused_softmax(E4M3, fp8v, FusedSoftmaxConfig::default()),
        ),
        (
            "mxattn fused-softmax u8, MXFP4 QK, MXFP4 V",
            AttentionConfig::fused_softmax(
                E2M1,
                OperandFormat::mx(E2M1),
                FusedSoftmaxConfig::default(),
            ),
        ),
        (
            "mxattn fused-softmax fp32, MXFP6 QK, FP8 V",
            AttentionConfig::fused_softmax(
                E2M3,
                fp8v,
                FusedSoftmaxConfig {
                    probs: FusedProbs::Fp32Bits,
                    hadamard: true,
                },
            ),
        ),
        (
            "mxattn EFQ-MMLU, MXFP4 QK, FP8 V",
            AttentionConfig::efq(EfqConfig::new(EfqRule::Mmlu), OperandFormat::mx(E2M1), fp8v),
        ),
    ];
    println!(
        "# bench_gpu: CUDA device 0, CUDA events, mean of {} after {} warm-up",
        a.iters, a.warmup
    );
    println!(
        "| shape (b, hq/hkv, s, d) | causal | implementation | ms | TFLOP/s | vs candle bf16 |"
    );
    println!("|---|---|---|---|---|---|");
    let mut rows = vec![];
    for s in parse(&a.shapes)? {
        let q = Tensor::randn(0f32, 1.0, (s.b, s.hq, s.s, s.d), &dev)?.to_dtype(DType::BF16)?;
        let k = Tensor::randn(0f32, 1.0, (s.b, s.hkv, s.sk, s.d), &dev)?.to_dtype(DType::BF16)?;
        let v = Tensor::randn(0f32, 1.0, (s.b, s.hkv, s.sk, s.d), &dev)?.to_dtype(DType::BF16)?;
        let causal_frac = if s.causal && s.s == s.sk { 0.5 } else { 1.0 };
        let flops = 4.0 * (s.b * s.hq * s.s * s.sk * s.d) as f64 * causal_frac;
        let label = if s.sk == s.s {
            format!("({}, {}/{}, {}, {})", s.b, s.hq, s.hkv, s.s, s.d)
        } else {
            format!("({}, {}/{}, {}x{}, {})", s.b, s.hq, s.hkv, s.s, s.sk, s.d)
        };
        let keep = |n: &str| a.filter.as_ref().is_none_or(|f| n.contains(f.as_str()));
        // candle's composition materializes the score matrix: skip it where that would not fit
        let score_bytes = 2.0 * (s.b * s.hq) as f64 * s.s as f64 * s.sk as f64;
        let base = if score_bytes < 4e9 {
            Some(time_ms(&dev, a.warmup, a.iters, || {
                Ok(mxattn::baselines::candle_matmul_attention(
                    &q, &k, &v, s.causal,
                )?)
            })?)
        } else {
            None
        };
        if let Some(ms) = base {
            println!(
                "| {label} | {} | candle bf16 matmul-softmax-matmul | {ms:.3} | {:.1} | 1.00x |",
                s.causal,
                flops / ms / 1e9
            );
            rows.push(serde_json::json!({"shape": label, "impl": "candle", "ms": ms}));
        }
        for (name, cfg) in &entries {
            if !keep(name) {
                continue;
            }
            let cfg = cfg.clone().with_causal(s.causal);
            let ms = time_ms(&dev, a.warmup, a.iters, || {
                Ok(attention_ext(&q, &k, &v, &cfg, &RunOptions::default())?.out)
            })?;
            let ratio = base.map_or("-".to_string(), |b| format!("{:.2}x", b / ms));
            println!(
                "| {label} | {} | {name} | {ms:.3} | {:.1} | {ratio} |",
                s.causal,
                flops / ms / 1e9
            );
            rows.push(serde_json::json!({"shape": label, "impl": name, "ms": ms, "tflops": flops / ms / 1e9}));
        }
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
