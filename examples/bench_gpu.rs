//! GPU attention benchmark (build with `--features cuda`): every mxattn kernel and
//! candle's own CUDA attention (bf16 matmul-softmax-matmul) at the given shapes, timed with
//! CUDA events after warm-up. Run beside `../shared/bench` in the same device command so
//! the cuDNN / FlashAttention rows come from the same machine and minute.
//!
//!     bench_gpu --shapes "1,40,40,75600,128;1,32,8,4096,128,causal"

mod baselines;

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use clap::Parser;
use mxattn::attention::{
    attention_ext, check_device, AttentionConfig, DeviceChecks, EfqConfig, EfqRule, FusedProbs,
    FusedSoftmaxConfig, GpuPath, OperandFormat, ProbFormat, RunOptions,
};
use mxattn::mx::ElemFormat;
use mxattn_cli::bench::cuda_time_ms;

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
    /// Skip entries whose name contains any of these (comma separated).
    #[arg(long, default_value = "")]
    exclude: String,
    /// Decode contexts to time the split-KV decode kernel at (comma separated; empty: none):
    /// one query row per sequence, Qwen3-8B's 32/8 heads, the KV cache in BF16 and in MX.
    #[arg(long, default_value = "1024,8192,32768")]
    decode: String,
    /// Also write the rows as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// When mxattn's calls read their checks: `per-call` (the default, one host
    /// synchronization per call) or `deferred` (left on the device, read once per shape).
    #[arg(long, default_value = "per-call")]
    checks: String,
    /// After timing each entry, run it once more and print a hash of its output's f32 bits
    /// (`digest` lines, and `digest` in the JSON), with the inputs drawn from a fixed seed per
    /// shape: two builds that print the same digests computed the same outputs bit for bit.
    /// Also times the EFQ rules and scales the default list leaves out.
    #[arg(long)]
    digest: bool,
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

fn main() -> Result<()> {
    let a = Args::parse();
    let checks = match a.checks.as_str() {
        "per-call" => DeviceChecks::PerCall,
        "deferred" => DeviceChecks::Deferred,
        c => bail!("--checks {c:?}: expected per-call or deferred"),
    };
    let dev = Device::new_cuda(0)?;
    use ElemFormat::*;
    let fp8v = OperandFormat::fp8_per_channel();
    let fused = |qk: ElemFormat, v: OperandFormat, probs: FusedProbs| {
        AttentionConfig::fused_softmax(
            qk,
            v,
            FusedSoftmaxConfig {
                probs,
                hadamard: true,
            },
        )
    };
    let etq_fp8 = AttentionConfig::exp_then_quantize(
        OperandFormat::mx(E4M3),
        fp8v,
        ProbFormat::Fp8 { elem: E4M3 },
    );
    // (name, config, kernel): `Auto` takes the fastest kernel for the call (wgmma at head
    // dim 128); the `[mma.sync]` rows force the older BF16 tensor-core kernel for comparison,
    // the `[staged prep]` rows the wgmma kernel with its operands prepared in f32 and packed
    // in a second pass (the route before one-pass packing).
    let mut entries: Vec<(&str, AttentionConfig, GpuPath)> = vec![
        ("mxattn exact bf16", AttentionConfig::exact(), GpuPath::Auto),
        (
            "mxattn exact bf16 [mma.sync]",
            AttentionConfig::exact(),
            GpuPath::Mma,
        ),
        (
            "mxattn exp->E4M3 P, MXFP8 QK, FP8 V",
            etq_fp8,
            GpuPath::Auto,
        ),
        (
            "mxattn fused-softmax u8, MXFP8 QK, FP8 V",
            fused(E4M3, fp8v, FusedProbs::U8Code),
            GpuPath::Auto,
        ),
        (
            "mxattn fused-softmax u8, MXFP8 QK, FP8 V [mma.sync]",
            fused(E4M3, fp8v, FusedProbs::U8Code),
            GpuPath::Mma,
        ),
        (
            "mxattn fused-softmax fp32, MXFP8 QK, FP8 V",
            fused(E4M3, fp8v, FusedProbs::Fp32Bits),
            GpuPath::Auto,
        ),
        (
            "mxattn fused-softmax u8, MXFP6 QK, MXFP6 V",
            fused(E2M3, OperandFormat::mx(E2M3), FusedProbs::U8Code),
            GpuPath::Auto,
        ),
        (
            "mxattn fused-softmax u8, MXFP4 QK, MXFP4 V",
            fused(E2M1, OperandFormat::mx(E2M1), FusedProbs::U8Code),
            GpuPath::Auto,
        ),
        (
            "mxattn fused-softmax u8, MXFP4 QK, MXFP4 V [staged prep]",
            fused(E2M1, OperandFormat::mx(E2M1), FusedProbs::U8Code),
            GpuPath::WgmmaStaged,
        ),
        (
            "mxattn fused-softmax u8, MXFP8 QK, FP8 V [staged prep]",
            fused(E4M3, fp8v, FusedProbs::U8Code),
            GpuPath::WgmmaStaged,
        ),
        (
            "mxattn EFQ-MMLU, MXFP4 QK, FP8 V",
            AttentionConfig::efq(EfqConfig::new(EfqRule::Mmlu), OperandFormat::mx(E2M1), fp8v),
            GpuPath::Auto,
        ),
        (
            "mxattn EFQ exact thresholds, MXFP4 QK, FP8 V",
            AttentionConfig::efq(
                EfqConfig::new(EfqRule::ExactThresholds),
                OperandFormat::mx(E2M1),
                fp8v,
            ),
            GpuPath::Auto,
        ),
        (
            "mxattn exp->MXFP4 P, MXFP4 QK, FP8 V",
            AttentionConfig::exp_then_quantize(OperandFormat::mx(E2M1), fp8v, ProbFormat::mx(E2M1)),
            GpuPath::Auto,
        ),
        (
            "mxattn exp->MXFP8 P, MXFP8 QK, FP8 V",
            AttentionConfig::exp_then_quantize(OperandFormat::mx(E4M3), fp8v, ProbFormat::mx(E4M3)),
            GpuPath::Auto,
        ),
    ];
    if a.digest {
        use mxattn::attention::EfqScale;
        let efq = |rule, scale| {
            AttentionConfig::efq(
                EfqConfig::new(rule).with_scale(scale),
                OperandFormat::mx(E2M1),
                fp8v,
            )
        };
        // one entry per EFQ code path of the kernels (rule x scale) not listed above
        let extra = [
            (
                "mxattn EFQ LUT, MXFP4 QK, FP8 V",
                EfqRule::Lut,
                EfqScale::Efq,
            ),
            (
                "mxattn EFQ two-piece, MXFP4 QK, FP8 V",
                EfqRule::TwoPiece,
                EfqScale::Floor,
            ),
            (
                "mxattn EFQ exact thresholds, EFQ scale, MXFP4 QK, FP8 V",
                EfqRule::ExactThresholds,
                EfqScale::Efq,
            ),
            (
                "mxattn EFQ exact thresholds, RCEIL scale, MXFP4 QK, FP8 V",
                EfqRule::ExactThresholds,
                EfqScale::Rceil,
            ),
            (
                "mxattn EFQ-Mean, RCEIL scale, MXFP4 QK, FP8 V",
                EfqRule::Mean,
                EfqScale::Rceil,
            ),
        ];
        entries.extend(
            extra
                .into_iter()
                .map(|(name, rule, scale)| (name, efq(rule, scale), GpuPath::Auto)),
        );
    }
    println!(
        "# bench_gpu: CUDA device 0, CUDA events, mean of {} after {} warm-up",
        a.iters, a.warmup
    );
    println!(
        "| shape (b, hq/hkv, s, d) | causal | implementation | ms | TFLOP/s | vs candle bf16 |"
    );
    println!("|---|---|---|---|---|---|");
    let mut rows = vec![];
    for (si, s) in parse(&a.shapes)?.into_iter().enumerate() {
        if a.digest {
            dev.set_seed(1000 + si as u64)?;
        }
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
        let keep = |n: &str| {
            a.filter.as_ref().is_none_or(|f| n.contains(f.as_str()))
                && !a.exclude.split(',').any(|x| !x.is_empty() && n.contains(x))
        };
        // candle's composition materializes the score matrix: skip it where that would not fit
        let score_bytes = 2.0 * (s.b * s.hq) as f64 * s.s as f64 * s.sk as f64;
        let base = if score_bytes < 4e9 {
            Some(cuda_time_ms(&dev, a.warmup, a.iters, || {
                baselines::candle_matmul_attention(&q, &k, &v, s.causal)
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
        for (name, cfg, path) in &entries {
            if !keep(name) {
                continue;
            }
            let cfg = cfg.clone().with_causal(s.causal);
            let opts = RunOptions {
                gpu_path: *path,
                checks,
                ..Default::default()
            };
            let ms = cuda_time_ms(&dev, a.warmup, a.iters, || {
                Ok(attention_ext(&q, &k, &v, &cfg, &opts)?.out)
            })?;
            // deferred: the gathered checks, read outside the timed loop
            check_device(&dev)?;
            let digest = if a.digest {
                let opts = RunOptions {
                    gpu_path: *path,
                    ..Default::default()
                };
                let out = attention_ext(&q, &k, &v, &cfg, &opts)?.out;
                let d = fnv1a(&out.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?);
                println!("digest | {label} | {} | {name} | {d:016x}", s.causal);
                Some(format!("{d:016x}"))
            } else {
                None
            };
            let ratio = base.map_or("-".to_string(), |b| format!("{:.2}x", b / ms));
            println!(
                "| {label} | {} | {name} | {ms:.3} | {:.1} | {ratio} |",
                s.causal,
                flops / ms / 1e9
            );
            let mut row = serde_json::json!({"shape": label, "impl": name, "ms": ms, "tflops": flops / ms / 1e9});
            if let Some(d) = digest {
                row["digest"] = d.into();
            }
            rows.push(row);
        }
    }
    if !a.decode.trim().is_empty() {
        decode_table(&dev, &a, &mut rows)?;
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}

/// FNV-1a over the values' bits: equal outputs give equal digests, and any changed bit a
/// different one (with the odds of a 64-bit collision).
fn fnv1a(v: &[f32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for x in v {
        for b in x.to_bits().to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Decode steps over a cache of `n` tokens: the split-KV kernel reading BF16 or MX codes,
/// against the same kernel on the BF16 cache (the ratio) and the attention op on the
/// dequantized cache.
fn decode_table(dev: &Device, a: &Args, rows: &mut Vec<serde_json::Value>) -> Result<()> {
    use mxattn::attention::attention_decode;
    use mxattn::mx::ScaleMode;
    use mxattn_llm::{CacheFormat, KvFormat, LayerKvCache};
    let (b, hq, hkv, d) = (1usize, 32usize, 8usize, 128usize);
    println!();
    println!("| decode: context (b=1, hq/hkv 32/8, d 128) | KV cache | KV bytes | ms | GB/s of KV read | vs BF16 cache |");
    println!("|---|---|---|---|---|---|");
    for n in a.decode.split(',').map(|x| x.trim().parse::<usize>()) {
        let n = n?;
        let k = Tensor::randn(0f32, 1.0, (b, hkv, n, d), dev)?.to_dtype(DType::BF16)?;
        let v = Tensor::randn(0f32, 1.0, (b, hkv, n, d), dev)?.to_dtype(DType::BF16)?;
        let q = Tensor::randn(0f32, 1.0, (b, hq, 1, d), dev)?.to_dtype(DType::BF16)?;
        let cfg = AttentionConfig::exact().with_causal(true);
        let mx = |elem| CacheFormat::Mx {
            elem,
            scale: ScaleMode::Floor,
            block: 32,
        };
        let mut base = None;
        for (name, fmt) in [
            ("BF16", CacheFormat::Bf16),
            ("MXFP8", mx(ElemFormat::E4M3)),
            ("MXFP6", mx(ElemFormat::E2M3)),
            ("MXFP4", mx(ElemFormat::E2M1)),
        ] {
            let mut cache = LayerKvCache::new(KvFormat { k: fmt, v: fmt });
            cache.push(&k, &v)?;
            let (kv, vv) = (cache.k_view()?.unwrap(), cache.v_view()?.unwrap());
            let ms = cuda_time_ms(dev, a.warmup.max(3), a.iters.max(20), || {
                attention_decode(&q, &kv, &vv, &cfg)
            })?;
            let bytes = cache.bytes();
            let ratio = base.map_or(1.0, |b: f64| b / ms);
            base.get_or_insert(ms);
            println!(
                "| {n} | {name} | {:.1} MB | {ms:.4} | {:.0} | {ratio:.2}x |",
                bytes as f64 / 1e6,
                bytes as f64 / ms / 1e6
            );
            rows.push(
                serde_json::json!({"decode_context": n, "kv": name, "ms": ms, "kv_bytes": bytes}),
            );
        }
        // the path without the kernel: dequantize the MXFP4 cache, then the attention op
        let mut cache = LayerKvCache::new(KvFormat {
            k: mx(ElemFormat::E2M1),
            v: mx(ElemFormat::E2M1),
        });
        cache.push(&k, &v)?;
        let ms = cuda_time_ms(dev, a.warmup, a.iters, || {
            let (kd, vd) = cache.dequantized()?;
            mxattn::attention::attention(&q, &kd, &vd, &cfg)
        })?;
        println!(
            "| {n} | MXFP4, dequantize + attention op | - | {ms:.4} | - | {:.2}x |",
            base.unwrap() / ms
        );
        stored_rows(dev, a, (&q, &k, &v), n, rows)?;
    }
    Ok(())
}

/// Decode with a quantized softmax (no decode kernel yet): the attention op on the model's
/// MX cache as stored (codes decoded into its operands) against dequantizing the cache and
/// running the op on the values (which quantizes them again), same run.
fn stored_rows(
    dev: &Device,
    a: &Args,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    n: usize,
    rows: &mut Vec<serde_json::Value>,
) -> Result<()> {
    use mxattn::attention::{attention, attention_decode, preset, Algorithm};
    use mxattn_llm::{CacheFormat, KvFormat, LayerKvCache};
    println!();
    println!("| decode: context | config (cache in its formats) | cache as stored: ms | dequantize + op: ms | stored / dequantize |");
    println!("|---|---|---|---|---|");
    for name in ["mxfp4", "mxfp8", "fused-mxfp8", "efq"] {
        let mut cfg = preset(name)?.config.with_causal(true);
        // a model moves the rotation into its projections (as the Qwen3 crate does)
        if let Algorithm::FusedSoftmax(f) = &mut cfg.algorithm {
            f.hadamard = false;
        }
        let kv = KvFormat {
            k: CacheFormat::for_operand(cfg.qk_format),
            v: CacheFormat::for_operand(cfg.v_format),
        };
        let mut cache = LayerKvCache::new(kv);
        cache.push(k, v)?;
        let (kv, vv) = (cache.k_view()?.unwrap(), cache.v_view()?.unwrap());
        let stored = cuda_time_ms(dev, a.warmup.max(2), a.iters.max(5), || {
            attention_decode(q, &kv, &vv, &cfg)
        })?;
        let deq = cuda_time_ms(dev, a.warmup.max(2), a.iters.max(5), || {
            let (kd, vd) = cache.dequantized()?;
            attention(q, &kd, &vd, &cfg)
        })?;
        println!(
            "| {n} | {name} | {stored:.4} | {deq:.4} | {:.2}x faster |",
            deq / stored
        );
        rows.push(serde_json::json!({"decode_context": n, "config": name,
            "stored_ms": stored, "dequantize_ms": deq}));
    }
    Ok(())
}
