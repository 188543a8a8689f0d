//! FP8 linear layers on the GPU (build with `--features cuda`): `mxattn_fp8::Fp8Linear`'s
//! whole op (activation quantization + cuBLASLt FP8 GEMM, or up to 4 tokens (8 weight-only) the decode GEMV;
//! `channel-w`: the weight-only layer; bias included) against candle's
//! BF16 matmul (cuBLAS) of the same shape, in the same run, timed with CUDA events after
//! warm-up. Shapes are the models' projections: Wan2.2-A14B at 720p (75 600 tokens), Wan2.2
//! TI2V-5B at 1280 × 704, 121 frames (27 280 tokens, crates/wan/src/sizes.rs), Qwen3-8B
//! decode (1 token) and prefill (4096 tokens).
//!
//!     bench_fp8_linear [--shapes "name,tokens,in,out;..."] [--granularity channel,block128,channel-w]
//!         [--no-gemv] [--fallback] [--json out.json]

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use clap::Parser;
use mxattn_cli::bench::cuda_time_ms;
use mxattn_fp8::{Fp8Linear, Fp8Weight, Granularity};

const DEFAULT_SHAPES: &str = "wan-a14b qkvo,75600,5120,5120;wan-a14b ffn1,75600,5120,13824;\
wan-a14b ffn2,75600,13824,5120;wan-5b qkvo,27280,3072,3072;wan-5b ffn1,27280,3072,14336;\
wan-5b ffn2,27280,14336,3072;qwen3-8b decode q/o,1,4096,4096;qwen3-8b decode k/v,1,4096,1024;\
qwen3-8b decode up,1,4096,12288;qwen3-8b decode down,1,12288,4096;\
qwen3-8b prefill q/o,4096,4096,4096;qwen3-8b prefill k/v,4096,4096,1024;\
qwen3-8b prefill up,4096,4096,12288;qwen3-8b prefill down,4096,12288,4096";

#[derive(Parser, Debug)]
#[command(
    about = "Times mxattn-fp8's FP8 linear (quantize + cuBLASLt FP8 GEMM) against candle's BF16 matmul"
)]
struct Args {
    /// `name,tokens,in,out` entries, semicolon separated.
    #[arg(long, default_value = DEFAULT_SHAPES)]
    shapes: String,
    /// Weight scale granularities to time (comma separated: tensor, channel, block128;
    /// channel-w: the weight-only layer, `fp8-w`).
    #[arg(long, default_value = "channel,block128,channel-w")]
    granularity: String,
    #[arg(long, default_value_t = 10)]
    iters: usize,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Also time the fallback GEMM (scalar-scaled GEMMs + mxattn's scale epilogue).
    #[arg(long)]
    fallback: bool,
    /// Up to 8 tokens, also time cuBLASLt's FP8 GEMM where the decode GEMV is the default.
    #[arg(long)]
    no_gemv: bool,
    /// Also time cuBLASLt's FP8 GEMM with fast accumulation (`Fp8Linear::set_fast_accum`),
    /// rows marked `+fast`.
    #[arg(long)]
    fast_accum: bool,
    /// Also write the rows as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[derive(serde::Serialize)]
struct Row {
    shape: String,
    tokens: usize,
    inp: usize,
    out: usize,
    granularity: String,
    gemm_path: String,
    fp8_ms: f64,
    bf16_ms: f64,
    /// candle's BF16 matmul alone, no bias: what a caller that fuses the bias into its next
    /// op pays (Wan's blocks).
    bf16_gemm_ms: f64,
    fp8_tflops: f64,
    bf16_tflops: f64,
    /// BF16 time / FP8 time.
    speedup: f64,
    /// BF16 GEMM-alone time / FP8 time.
    speedup_gemm: f64,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let dev = Device::new_cuda(0)?;
    let grans: Vec<(String, Granularity)> = a
        .granularity
        .split(',')
        .map(|g| {
            Ok((
                g.trim().to_string(),
                match g.trim() {
                    "tensor" => Granularity::Tensor,
                    "channel" => Granularity::Channel,
                    "block128" => Granularity::BLOCK128,
                    // weight-only (`fp8-w`): channel scales, activations unquantized
                    "channel-w" => Granularity::Channel,
                    o => bail!("--granularity {o:?}: tensor, channel, block128 or channel-w"),
                },
            ))
        })
        .collect::<Result<_>>()?;
    println!(
        "# bench_fp8_linear: CUDA device 0, CUDA events, mean of {} after {} warm-up; FP8 = activation quantize + GEMM or GEMV (+ bias; channel-w: the weight-only layer, no quantize), BF16 = candle matmul (cuBLAS) + bias; BF16 GEMM = the matmul alone (the bias fused elsewhere, as Wan's blocks do)",
        a.iters, a.warmup
    );
    println!();
    println!("| shape | tokens | in → out | weights | GEMM path | FP8 ms | BF16 ms | BF16 GEMM ms | FP8 TFLOP/s | BF16 TFLOP/s | BF16 / FP8 | BF16 GEMM / FP8 |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for entry in a.shapes.split(';').filter(|s| !s.trim().is_empty()) {
        let f: Vec<&str> = entry.split(',').map(str::trim).collect();
        if f.len() != 4 {
            bail!("shape {entry:?}: expected name,tokens,in,out");
        }
        let (name, t, inp, out): (&str, usize, usize, usize) =
            (f[0], f[1].parse()?, f[2].parse()?, f[3].parse()?);
        let w = (Tensor::randn(0f32, 1.0, (out, inp), &dev)? * 0.02)?;
        let bias = Tensor::randn(0f32, 0.1, out, &dev)?;
        let x = Tensor::randn(0f32, 1.0, (t, inp), &dev)?.to_dtype(DType::BF16)?;
        let w_bf16 = w.to_dtype(DType::BF16)?;
        let b_bf16 = bias.to_dtype(DType::BF16)?;
        let bf16_ms = cuda_time_ms(&dev, a.warmup, a.iters, || {
            x.matmul(&w_bf16.t()?)?.broadcast_add(&b_bf16)
        })?;
        let bf16_gemm_ms = cuda_time_ms(&dev, a.warmup, a.iters, || x.matmul(&w_bf16.t()?))?;
        let w_cpu = w.to_device(&Device::Cpu)?;
        let flops = 2.0 * t as f64 * inp as f64 * out as f64;
        for (gname, g) in &grans {
            let wq = Fp8Weight::quantize(&w_cpu, *g)?;
            let weight_only = gname == "channel-w";
            for (fallback, gemv, fast) in [
                (false, true, false),
                (false, false, false),
                (true, true, false),
                (false, true, true),
            ] {
                if (fallback && !a.fallback)
                    || (!gemv && (!a.no_gemv || t > 8 || weight_only))
                    || (fast && (!a.fast_accum || weight_only))
                {
                    continue;
                }
                let mut l = Fp8Linear::new(wq.clone(), Some(bias.clone()), &dev)?
                    .weight_only(weight_only)?;
                l.set_force_fallback(fallback);
                l.set_gemv(gemv);
                l.set_fast_accum(fast);
                let fp8_ms = cuda_time_ms(&dev, a.warmup, a.iters, || l.forward(&x))?;
                mxattn::attention::check_device(&dev)?;
                let path = format!(
                    "{:?}{}",
                    l.last_gpu_path(),
                    if fast { " +fast" } else { "" }
                );
                let r = Row {
                    shape: name.to_string(),
                    tokens: t,
                    inp,
                    out,
                    granularity: gname.clone(),
                    gemm_path: path,
                    fp8_ms,
                    bf16_ms,
                    bf16_gemm_ms,
                    fp8_tflops: flops / fp8_ms / 1e9,
                    bf16_tflops: flops / bf16_ms / 1e9,
                    speedup: bf16_ms / fp8_ms,
                    speedup_gemm: bf16_gemm_ms / fp8_ms,
                };
                println!(
                    "| {} | {} | {} → {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} | {:.2}× | {:.2}× |",
                    r.shape,
                    r.tokens,
                    r.inp,
                    r.out,
                    r.granularity,
                    r.gemm_path,
                    r.fp8_ms,
                    r.bf16_ms,
                    r.bf16_gemm_ms,
                    r.fp8_tflops,
                    r.bf16_tflops,
                    r.speedup,
                    r.speedup_gemm
                );
                rows.push(r);
            }
        }
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
