//! The GPU path of `Fp8Linear` against the CPU reference (feature `cuda`). Every test skips
//! (passes with a note) where there is no CUDA device, as in CI; with `MXATTN_REQUIRE_GPU=1`
//! (set by scripts/gpu_check.sh and scripts/gpu_fp8_linear.sh) a missing GPU fails it.
//!
//! * activation codes and scales bit for bit (f32, bf16, f16 inputs; zero rows, outliers,
//!   ragged groups, signed zeros, padding);
//! * the GEMM within a bound derived below, for tensor, channel and 128 × 128 block weights,
//!   at the fixture shape, at one token, at ragged shapes and at model shapes, on the path
//!   cuBLASLt takes and on the forced fallback;
//! * the decode GEMV (≤ 8 tokens, tensor and channel scales) taken where it applies;
//! * weight-only layers (`fp8-w`): the GEMV and the many-token GEMM against the CPU
//!   reference, f32, bf16 and f16 inputs, aligned and ragged widths;
//! * bad input as errors (feature count, non-finite input, per call and deferred);
//! * weights quantized on the GPU at load: the host quantization's codes and scales bit for
//!   bit, the uploaded layer's device bytes and output bit for bit, non-finite weights as
//!   errors naming the position.
#![cfg(feature = "cuda")]

use candle_core::Module;
use candle_core::{DType, Device, Tensor};
use mxattn::attention::DeviceChecks;
use mxattn::fused::fp8::fp8_quantize_rows;
use mxattn_fp8::{
    quantize_activation_codes, quantize_activations_grouped, Fp8Linear, Fp8Weight, Granularity,
    Linear, LinearFormat,
};

fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) if std::env::var_os("MXATTN_REQUIRE_GPU").is_some_and(|v| v == "1") => {
            panic!("MXATTN_REQUIRE_GPU=1 but no CUDA device: {e}")
        }
        Err(e) => {
            eprintln!("no CUDA device ({e}); skipping");
            None
        }
    }
}

/// A small deterministic generator (xorshift), values of many magnitudes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly normal (sum of uniforms), times 2^e for e in [-spread, spread].
    fn value(&mut self, spread: i32) -> f32 {
        let n: f32 = (0..4).map(|_| self.uniform()).sum::<f32>() - 2.0;
        let e = if spread > 0 {
            (self.next() % (2 * spread as u64 + 1)) as i32 - spread
        } else {
            0
        };
        n * 2f32.powi(e)
    }
}

fn host_f32(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn host_u8(t: &Tensor) -> Vec<u8> {
    t.flatten_all()
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Rows of every kind: random of many magnitudes, a zero row, an outlier row, values at
/// E4M3 rounding ties after scaling, signed zeros, tiny values (E4M3 subnormals).
fn activation_rows(rows: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut x: Vec<f32> = (0..rows * k).map(|_| rng.value(12)).collect();
    if rows > 1 {
        x[k..2 * k].fill(0.0); // a zero row
    }
    if rows > 2 && k > 0 {
        // an outlier: the rest of its row flushes toward zero (a 1-wide row is the outlier)
        x[2 * k + 3.min(k - 1)] = 3.0e4;
    }
    if rows > 3 {
        // ties: amax 448 gives scale 1, so these land halfway between E4M3 neighbours
        x[3 * k] = 448.0;
        for (j, v) in x[3 * k + 1..4 * k].iter_mut().enumerate() {
            *v = [1.0625, -1.1875, 0.0078125 * 1.5, -0.0, 17.0, 0.0][j % 6];
        }
    }
    if rows > 4 {
        for v in x[4 * k..5 * k].iter_mut() {
            *v *= 1e-30;
        }
    }
    x
}

#[test]
fn activation_codes_and_scales_match_the_cpu_bit_for_bit() {
    let Some(dev) = gpu() else { return };
    for &(rows, k) in &[(7usize, 136usize), (5, 4096), (1, 300), (9, 128)] {
        let x = activation_rows(rows, k, 11 + k as u64);
        for dt in [DType::F32, DType::BF16, DType::F16] {
            // the CPU reference sees the same values the GPU reads (x rounded to dt)
            let xc = Tensor::from_vec(x.clone(), (rows, k), &Device::Cpu)
                .unwrap()
                .to_dtype(dt)
                .unwrap();
            let xg = xc.to_device(&dev).unwrap();
            for group in [None, Some(128)] {
                let (codes, scales) = quantize_activation_codes(&xc, group).unwrap();
                let (rows_p, ldc) = (rows.div_ceil(4) * 4, k.div_ceil(16) * 16);
                let q = fp8_quantize_rows(&xg, group, rows_p, ldc, DeviceChecks::PerCall).unwrap();
                let gc = host_u8(&q.codes);
                let gs = host_f32(&q.scales);
                let groups = q.groups();
                assert_eq!(groups * rows, scales.len());
                let what = format!("[{rows}, {k}] {dt:?} group {group:?}");
                for r in 0..rows_p {
                    for j in 0..ldc {
                        let want = if r < rows && j < k {
                            codes[r * k + j]
                        } else {
                            0
                        };
                        assert_eq!(
                            gc[r * ldc + j],
                            want,
                            "{what}: code [{r}, {j}] (x = {})",
                            if r < rows && j < k { x[r * k + j] } else { 0.0 }
                        );
                    }
                    for g in 0..groups {
                        let want = if r < rows {
                            scales[r * groups + g]
                        } else {
                            1.0
                        };
                        assert_eq!(
                            gs[g * rows_p + r].to_bits(),
                            want.to_bits(),
                            "{what}: scale of row {r} group {g}"
                        );
                    }
                }
            }
        }
    }
}

/// The bound of |GPU − reference| per output (`s`: the accumulation terms below, per
/// output), the reference being the CPU layer's f32
/// product y of the same FP8 values (codes × scales). Both sum exact products (E4M3 × E4M3
/// fits f32); they differ by
/// * f32 accumulation in different orders: ≤ (n + 2)·2⁻²⁴·S each, S = Σ|aᵢ·wᵢ| (the +2: the
///   GPU's two scale multiplications);
/// * the tensor cores' FP8 accumulator, which keeps fewer bits than f32 between its
///   promotions to f32 (DeepSeek-V3 measured about 14 bits on Hopper): 2⁻¹⁰·S allows it
///   (a wrong scale layout or a wrong operand is off by about S itself);
/// * x's dtype: the output rounded (unit roundoff u: 2⁻⁸ bf16, 2⁻¹¹ f16, 0 f32) and, with
///   the cuBLASLt bias epilogue, the bias rounded to it too: u·(|y| + E + |b|), doubled
///   for the path that rounds the GEMM's output before adding the bias.
fn check_close(what: &str, got: &[f32], y: &[f32], s: &[f32], bias: &[f32], out: usize, dt: DType) {
    let u = match dt {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 0.0,
    };
    let mut worst = 0f64;
    for (i, (&g, &r)) in got.iter().zip(y).enumerate() {
        let b = bias.get(i % out).copied().unwrap_or(0.0) as f64;
        let e = s[i] as f64 + b.abs();
        // 2u: where the bias is added after a rounded GEMM output, x's dtype rounds twice;
        // 2⁻²⁵: half f16's smallest subnormal step
        let tiny = if dt == DType::F16 {
            2f64.powi(-25)
        } else {
            0.0
        };
        let bound = e + 2.0 * u * ((r as f64).abs() + e + b.abs()) + tiny + 1e-30;
        let d = (g as f64 - r as f64).abs();
        assert!(
            d <= bound,
            "{what}: y[{}, {}] = {g} vs reference {r} (|diff| {d:e} > bound {bound:e}; S term {:e})",
            i / out,
            i % out,
            s[i]
        );
        worst = worst.max(d / bound);
    }
    println!("{what}: worst |diff| / bound {worst:.3}");
}

struct Case {
    t: usize,
    inp: usize,
    out: usize,
}

/// Weight with per-row magnitudes spread over 2^±4 (so channel scales differ) and a few
/// outliers, bias, input.
fn problem(c: &Case, seed: u64) -> (Tensor, Tensor, Vec<f32>) {
    let mut rng = Rng(seed);
    let mut w: Vec<f32> = (0..c.out * c.inp).map(|_| rng.value(0) * 0.05).collect();
    for o in 0..c.out {
        let m = 2f32.powi((o % 9) as i32 - 4);
        for v in &mut w[o * c.inp..(o + 1) * c.inp] {
            *v *= m;
        }
    }
    for i in (0..w.len()).step_by(7919) {
        w[i] *= 40.0;
    }
    let bias: Vec<f32> = (0..c.out).map(|_| rng.value(2)).collect();
    let x: Vec<f32> = (0..c.t * c.inp).map(|_| rng.value(3)).collect();
    (
        Tensor::from_vec(w, (c.out, c.inp), &Device::Cpu).unwrap(),
        Tensor::from_vec(x, (c.t, c.inp), &Device::Cpu).unwrap(),
        bias,
    )
}

/// GPU forward vs the CPU reference for one weight, input dtype and path.
#[allow(clippy::too_many_arguments)]
fn check_layer(
    dev: &Device,
    name: &str,
    w: &Fp8Weight,
    x: &Tensor,
    bias: &[f32],
    dt: DType,
    force_fallback: bool,
    gemv: bool,
) {
    check_layer_accum(dev, name, w, x, bias, dt, force_fallback, gemv, false)
}

/// As [`check_layer`]; `fast_accum` runs cuBLASLt's GEMM with fast accumulation, whose bound
/// adds 2⁻¹³·S per 32-wide k-step: the FP8 MMA's sum is then never promoted to f32, and
/// Hopper's MMA keeps about 14 bits of the larger addend when it adds a k-step into its
/// accumulator (one bit of margin taken).
#[allow(clippy::too_many_arguments)]
fn check_layer_accum(
    dev: &Device,
    name: &str,
    w: &Fp8Weight,
    x: &Tensor,
    bias: &[f32],
    dt: DType,
    force_fallback: bool,
    gemv: bool,
    fast_accum: bool,
) {
    let (out, inp) = w.shape();
    let b_cpu = Tensor::new(bias, &Device::Cpu).unwrap();
    let xc = x.to_dtype(dt).unwrap(); // the values both sides quantize
    let cpu = Fp8Linear::new(w.clone(), Some(b_cpu.clone()), &Device::Cpu).unwrap();
    let y_ref = host_f32(&cpu.forward(&xc.to_dtype(DType::F32).unwrap()).unwrap());
    // S = Σ|a·w| and n per output: |A|·|W|ᵀ of the FP8 values
    let a = quantize_activations_grouped(&xc, cpu.activation_group())
        .unwrap()
        .abs()
        .unwrap();
    let wv = w.dequantize(&Device::Cpu).unwrap().abs().unwrap();
    let s_abs = host_f32(&a.matmul(&wv.t().unwrap()).unwrap());
    let mut gl = Fp8Linear::new(w.clone(), Some(Tensor::new(bias, dev).unwrap()), dev).unwrap();
    gl.set_force_fallback(force_fallback);
    gl.set_gemv(gemv);
    gl.set_fast_accum(fast_accum);
    // block scales have no fast GEMM: the layer keeps the promoted sums (and the scaled path)
    let fast_accum = gl.is_fast_accum();
    let fast = if fast_accum {
        inp.div_ceil(32) as f64 * 2f64.powi(-13)
    } else {
        0.0
    };
    let rel = (2f64.powi(-10) + (inp as f64 + 2.0) * 2f64.powi(-24) + fast) as f32;
    let s: Vec<f32> = s_abs.iter().map(|&v| rel * v).collect();
    let y = gl.forward(&xc.to_device(dev).unwrap()).unwrap();
    assert_eq!(y.dims(), &[x.dims()[0], out]);
    assert_eq!(y.dtype(), dt);
    let path = gl.last_gpu_path();
    if force_fallback {
        assert_eq!(path, Some(mxattn_fp8::GemmPath::Fallback));
    } else if !gemv {
        assert_ne!(path, Some(mxattn_fp8::GemmPath::Gemv), "{name}");
    } else if x.dims()[0] <= mxattn_fp8::FP8_GEMV_MAX_TOKENS
        && matches!(w.granularity(), Granularity::Tensor | Granularity::Channel)
    {
        // decode-shaped products take the GEMV (cuda.rs)
        assert_eq!(path, Some(mxattn_fp8::GemmPath::Gemv), "{name}");
    }
    mxattn::attention::check_device(dev).unwrap();
    let what = format!(
        "{name} [{}, {inp}]→{out} {dt:?} path {path:?}{}",
        x.dims()[0],
        if fast_accum { " fast accumulation" } else { "" }
    );
    check_close(&what, &host_f32(&y), &y_ref, &s, bias, out, dt);
}

fn granularities() -> [(&'static str, Granularity); 3] {
    [
        ("tensor", Granularity::Tensor),
        ("channel", Granularity::Channel),
        ("block128", Granularity::BLOCK128),
    ]
}

#[test]
fn gemm_matches_the_reference_at_small_and_ragged_shapes() {
    let Some(dev) = gpu() else { return };
    let cases = [
        Case {
            t: 3,
            inp: 136,
            out: 40,
        }, // the fixture's shape (tests/fixtures/tiny.json)
        Case {
            t: 1,
            inp: 512,
            out: 256,
        }, // one token (decode)
        Case {
            t: 7,
            inp: 520,
            out: 300,
        }, // ragged everywhere: padding of t, in, out, blocks
        Case {
            t: 64,
            inp: 1024,
            out: 768,
        },
    ];
    for (ci, c) in cases.iter().enumerate() {
        let (w, x, bias) = problem(c, 100 + ci as u64);
        for (name, g) in granularities() {
            let wq = Fp8Weight::quantize(&w, g).unwrap();
            for dt in [DType::BF16, DType::F16, DType::F32] {
                // the default path, cuBLASLt's instead of the decode GEMV, the fallback
                for (fb, gemv) in [(false, true), (false, false), (true, true)] {
                    check_layer(&dev, name, &wq, &x, &bias, dt, fb, gemv);
                }
            }
        }
    }
}

#[test]
fn gemm_matches_the_reference_at_model_shapes() {
    let Some(dev) = gpu() else { return };
    let cases = [
        Case {
            t: 1,
            inp: 4096,
            out: 12288,
        }, // Qwen3-8B decode, MLP up
        Case {
            t: 256,
            inp: 5120,
            out: 13824,
        }, // Wan2.2-A14B FFN in
        Case {
            t: 33,
            inp: 13824,
            out: 5120,
        }, // Wan2.2-A14B FFN out
    ];
    for (ci, c) in cases.iter().enumerate() {
        let (w, x, bias) = problem(c, 200 + ci as u64);
        for (name, g) in granularities() {
            let wq = Fp8Weight::quantize(&w, g).unwrap();
            check_layer(&dev, name, &wq, &x, &bias, DType::BF16, false, true);
            if ci == 1 {
                check_layer(&dev, name, &wq, &x, &bias, DType::BF16, true, true);
            }
            if ci > 0 {
                let (fb, gemv) = (false, true);
                check_layer_accum(&dev, name, &wq, &x, &bias, DType::BF16, fb, gemv, true);
            }
        }
    }
}

#[test]
fn fixture_checkpoints_run_on_the_gpu() {
    let Some(dev) = gpu() else { return };
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for file in ["comfyui_scaled_fp8.safetensors", "qwen_fp8.safetensors"] {
        let w = Fp8Weight::from_safetensors(&dir.join(file), "layer").unwrap();
        let (out, inp) = w.shape();
        let c = Case { t: 5, inp, out };
        let (_, x, bias) = problem(&c, 7);
        check_layer(&dev, file, &w, &x, &bias, DType::BF16, false, true);
    }
}

#[test]
fn bad_input_is_a_clear_error_on_the_gpu() {
    let Some(dev) = gpu() else { return };
    let c = Case {
        t: 4,
        inp: 256,
        out: 128,
    };
    let (w, x, _) = problem(&c, 3);
    let wq = Fp8Weight::quantize(&w, Granularity::Channel).unwrap();
    let l = Fp8Linear::new(wq, None, &dev).unwrap();
    let e = l
        .forward(&Tensor::ones((2, 255), DType::BF16, &dev).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("has 255 features, the layer takes 256"), "{e}");
    // a non-finite input: the checked call errs at its end ...
    let mut xv = host_f32(&x);
    xv[300] = f32::NAN;
    let bad = Tensor::from_vec(xv, (4, 256), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap()
        .to_device(&dev)
        .unwrap();
    mxattn::attention::check_device(&dev).unwrap();
    let e = l.forward_checked(&bad).unwrap_err().to_string();
    assert!(e.contains("non-finite"), "{e}");
    // ... the default call leaves it to the device's gathered check
    let _ = l.forward(&bad).unwrap();
    let e = mxattn::attention::check_device(&dev)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("FP8 linear layer's input holds a non-finite value"),
        "{e}"
    );
    // and a good call after the check is clean
    let _ = l
        .forward(&x.to_dtype(DType::BF16).unwrap().to_device(&dev).unwrap())
        .unwrap();
    mxattn::attention::check_device(&dev).unwrap();
    // an Inf too, through the quantizer alone
    let inf = Tensor::new(&[[1f32, f32::INFINITY, 2.0]], &dev).unwrap();
    let e = fp8_quantize_rows(&inf, None, 4, 16, DeviceChecks::PerCall)
        .unwrap_err()
        .to_string();
    assert!(e.contains("non-finite"), "{e}");
    // zero tokens: an empty output
    let y = l
        .forward(&Tensor::zeros((0, 256), DType::BF16, &dev).unwrap())
        .unwrap();
    assert_eq!(y.dims(), &[0, 128]);
}

#[test]
fn the_gpu_layer_keeps_codes_not_f32_values() {
    let Some(dev) = gpu() else { return };
    let w = Tensor::ones((1024, 4096), DType::F32, &Device::Cpu).unwrap();
    let wq = Fp8Weight::quantize(&w, Granularity::BLOCK128).unwrap();
    let l = Fp8Linear::new(wq, None, &dev).unwrap();
    // one byte per weight plus the padded block scales: 8 × 32 f32
    assert_eq!(l.device_bytes(), Some(1024 * 4096 + 4 * 8 * 32));
}

/// A weight of every kind of row for quantizing at load ([`activation_rows`]: random, an
/// all-zero row, an outlier row, rounding ties, E4M3 subnormals), plus where it fits a huge
/// outlier (f32 and bf16 hold 1e30; f16 would make it Inf) and an all-zero 128 × 128 block.
fn weight_rows(out: usize, inp: usize, dt: DType, seed: u64) -> Vec<f32> {
    let mut w = activation_rows(out, inp, seed);
    if out > 6 && dt != DType::F16 {
        w[6 * inp + inp / 2] = -1.0e30;
    }
    if out >= 256 && inp >= 256 {
        for o in 128..256 {
            w[o * inp + 128..o * inp + 256].fill(0.0);
        }
    }
    w
}

fn same_bits(what: &str, a: &Tensor, b: &Tensor) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    assert_eq!(a.dtype(), b.dtype(), "{what}: dtypes");
    let (a, b) = if a.dtype() == DType::U8 {
        (host_u8(a), host_u8(b))
    } else {
        let bits = |t: &Tensor| -> Vec<u8> {
            host_f32(t)
                .iter()
                .flat_map(|v| v.to_bits().to_le_bytes())
                .collect()
        };
        (bits(a), bits(b))
    };
    if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
        panic!("{what}: first difference at byte {i}: {} vs {}", a[i], b[i]);
    }
}

#[test]
fn weights_quantized_on_the_gpu_equal_the_host_quantization() {
    let Some(dev) = gpu() else { return };
    // ragged everywhere (not multiples of 16 or 128), one column, a single block, blocks
    // with ragged edges, and a Wan2.2-A14B FFN weight
    let shapes: &[(usize, usize, &[DType])] = &[
        (40, 136, &[DType::F32, DType::BF16, DType::F16]),
        (3, 5, &[DType::F32, DType::BF16]),
        (7, 1, &[DType::F32]),
        (300, 520, &[DType::F32, DType::BF16, DType::F16]),
        (129, 257, &[DType::BF16]),
        (256, 4096, &[DType::BF16]),
        (13824, 5120, &[DType::BF16]),
    ];
    for (si, &(out, inp, dts)) in shapes.iter().enumerate() {
        for &dt in dts {
            let w = weight_rows(out, inp, dt, 500 + si as u64);
            // both sides quantize the same values: w rounded to dt
            let wc = Tensor::from_vec(w, (out, inp), &Device::Cpu)
                .unwrap()
                .to_dtype(dt)
                .unwrap();
            let wg = wc.to_device(&dev).unwrap();
            let x = Tensor::from_vec(activation_rows(5, inp, 77), (5, inp), &Device::Cpu)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap()
                .to_device(&dev)
                .unwrap();
            for (name, g) in granularities() {
                let what = format!("[{out}, {inp}] {dt:?} {name}");
                let t0 = std::time::Instant::now();
                let host = Fp8Weight::quantize(&wc, g).unwrap();
                let t_host = t0.elapsed();
                let t0 = std::time::Instant::now();
                let mut on_dev = Fp8Linear::quantize(&wg, g, None).unwrap();
                dev.synchronize().unwrap();
                let t_dev = t0.elapsed();
                if out * inp > 1 << 24 {
                    println!(
                        "{what}: quantized on the host in {t_host:?}, on the GPU in {t_dev:?}"
                    );
                }
                assert_eq!(on_dev.shape(), (out, inp), "{what}");
                assert_eq!(on_dev.granularity(), g, "{what}");
                assert_eq!(on_dev.storage_bytes(), host.storage_bytes(), "{what}");
                let mut uploaded = Fp8Linear::new(host.clone(), None, &dev).unwrap();
                // the device buffers, padding included, as the upload of the host's codes
                let (dc, ds) = on_dev.device_weight().unwrap();
                let (uc, us) = uploaded.device_weight().unwrap();
                same_bits(&format!("{what}: device codes"), &dc, &uc);
                same_bits(&format!("{what}: device scales"), &ds, &us);
                assert_eq!(on_dev.device_bytes(), uploaded.device_bytes(), "{what}");
                // the host form copied back: the host's codes and scales
                let back = on_dev.weight().unwrap();
                assert_eq!(back.shape(), host.shape(), "{what}");
                assert_eq!(back.granularity(), g, "{what}");
                if let Some(i) = back
                    .codes()
                    .iter()
                    .zip(host.codes())
                    .position(|(a, b)| a != b)
                {
                    panic!(
                        "{what}: code [{}, {}]: GPU {:#04x}, host {:#04x}",
                        i / inp,
                        i % inp,
                        back.codes()[i],
                        host.codes()[i]
                    );
                }
                let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(back.scales()), bits(host.scales()), "{what}: scales");
                // the same GEMM on the same bytes: the same output, bit for bit
                for fb in [false, true] {
                    on_dev.set_force_fallback(fb);
                    uploaded.set_force_fallback(fb);
                    let a = on_dev.forward_checked(&x).unwrap();
                    let b = uploaded.forward_checked(&x).unwrap();
                    assert_eq!(on_dev.last_gpu_path(), uploaded.last_gpu_path(), "{what}");
                    same_bits(&format!("{what}: forward (fallback {fb})"), &a, &b);
                }
            }
            // through the models' constructor: a dense layer on the GPU converted at load
            if out * inp <= 1 << 24 {
                let bias = Tensor::from_vec(
                    (0..out).map(|o| o as f32 * 0.25 - 3.0).collect::<Vec<_>>(),
                    out,
                    &dev,
                )
                .unwrap()
                .to_dtype(dt)
                .unwrap();
                for (name, g) in granularities() {
                    let dense = candle_nn::Linear::new(wg.clone(), Some(bias.clone()));
                    let a = Linear::new(dense, LinearFormat::Fp8(g)).unwrap();
                    let host = Fp8Weight::quantize(&wc, g).unwrap();
                    let b = Linear::from_fp8(host, Some(bias.clone()), &dev).unwrap();
                    assert_eq!(a.format(), LinearFormat::Fp8(g));
                    assert_eq!(a.dims().unwrap(), (out, inp));
                    assert_eq!(a.storage_bytes(), b.storage_bytes());
                    let what = format!("[{out}, {inp}] {dt:?} {name}: Linear::new");
                    same_bits(&what, &a.forward(&x).unwrap(), &b.forward(&x).unwrap());
                }
            }
        }
    }
    mxattn::attention::check_device(&dev).unwrap();
}

#[test]
fn a_non_finite_weight_is_an_error_when_quantized_on_the_gpu() {
    let Some(dev) = gpu() else { return };
    let (out, inp) = (300, 136);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for dt in [DType::F32, DType::BF16] {
            let mut w = weight_rows(out, inp, dt, 9);
            w[133 * inp + 7] = bad;
            let wg = Tensor::from_vec(w, (out, inp), &Device::Cpu)
                .unwrap()
                .to_dtype(dt)
                .unwrap()
                .to_device(&dev)
                .unwrap();
            for (name, g) in granularities() {
                let e = Fp8Linear::quantize(&wg, g, None).unwrap_err().to_string();
                assert!(
                    e.contains("non-finite") && e.contains("at [133, 7]"),
                    "{bad} {dt:?} {name}: {e}"
                );
                let dense = candle_nn::Linear::new(wg.clone(), None);
                let e = Linear::new(dense, LinearFormat::Fp8(g))
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("non-finite"), "{bad} {dt:?} {name}: {e}");
            }
        }
    }
    // the weights' checks are their own: nothing left for the device's gathered check
    mxattn::attention::check_device(&dev).unwrap();
}

/// Weight-only layers: GPU against the CPU reference (x as given times the FP8 weight's
/// values, f32 accumulation) within `check_close`'s bound with S = Σ|x·w|: the GEMV up to 8
/// tokens, beyond it the GEMM of x's dtype over the codes' values (its output rounded to x's
/// dtype before the channel scale: the bound's doubled rounding term).
#[test]
fn weight_only_layers_match_the_reference() {
    let Some(dev) = gpu() else { return };
    let cases = [
        Case {
            t: 1,
            inp: 576,
            out: 1536,
        }, // SmolLM2 decode, MLP up
        Case {
            t: 3,
            inp: 520,
            out: 300,
        }, // ragged: element loads, padded codes
        Case {
            t: 8,
            inp: 4096,
            out: 1024,
        },
        Case {
            t: 9,
            inp: 1536,
            out: 576,
        }, // the GEMM path
        Case {
            t: 64,
            inp: 520,
            out: 300,
        },
    ];
    for (ci, c) in cases.iter().enumerate() {
        let (w, x, bias) = problem(c, 300 + ci as u64);
        for g in [Granularity::Tensor, Granularity::Channel] {
            let wq = Fp8Weight::quantize(&w, g).unwrap();
            let wv = wq.dequantize(&Device::Cpu).unwrap();
            for dt in [DType::BF16, DType::F16, DType::F32] {
                let xc = x.to_dtype(dt).unwrap();
                let b_cpu = Tensor::new(bias.as_slice(), &Device::Cpu).unwrap();
                let cpu = Fp8Linear::new(wq.clone(), Some(b_cpu), &Device::Cpu)
                    .unwrap()
                    .weight_only(true)
                    .unwrap();
                let y_ref = host_f32(&cpu.forward(&xc.to_dtype(DType::F32).unwrap()).unwrap());
                let xa = xc.to_dtype(DType::F32).unwrap().abs().unwrap();
                let s_abs = host_f32(&xa.matmul(&wv.abs().unwrap().t().unwrap()).unwrap());
                let n = c.inp as f64;
                let s: Vec<f32> = s_abs
                    .iter()
                    .map(|&v| ((n + 2.0) * 2f64.powi(-24)) as f32 * v)
                    .collect();
                let gl = Fp8Linear::new(
                    wq.clone(),
                    Some(Tensor::new(bias.as_slice(), &dev).unwrap()),
                    &dev,
                )
                .unwrap()
                .weight_only(true)
                .unwrap();
                let y = gl.forward(&xc.to_device(&dev).unwrap()).unwrap();
                assert_eq!(y.dims(), &[c.t, c.out]);
                assert_eq!(y.dtype(), dt);
                let want = if c.t <= mxattn::fused::fp8::GEMV_MAX_TOKENS {
                    mxattn_fp8::GemmPath::Gemv
                } else {
                    mxattn_fp8::GemmPath::Dequantized
                };
                assert_eq!(gl.last_gpu_path(), Some(want));
                let what = format!("weight-only {g:?} [{}, {}]→{} {dt:?}", c.t, c.inp, c.out);
                check_close(&what, &host_f32(&y), &y_ref, &s, &bias, c.out, dt);
            }
        }
    }
}
