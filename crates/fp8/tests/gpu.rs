//! The GPU path of `Fp8Linear` against the CPU reference (feature `cuda`). Every test skips
//! (passes with a note) where there is no CUDA device, as in CI; with `MXATTN_REQUIRE_GPU=1`
//! (set by scripts/gpu_check.sh and scripts/gpu_fp8_linear.sh) a missing GPU fails it.
//!
//! * activation codes and scales bit for bit (f32, bf16, f16 inputs; zero rows, outliers,
//!   ragged groups, signed zeros, padding);
//! * the GEMM within a bound derived below, for tensor, channel and 128 × 128 block weights,
//!   at the fixture shape, at one token, at ragged shapes and at model shapes, on the path
//!   cuBLASLt takes and on the forced fallback;
//! * bad input as errors (feature count, non-finite input, per call and deferred).
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};
use mxattn::attention::DeviceChecks;
use mxattn::fused::fp8::fp8_quantize_rows;
use mxattn_fp8::{
    quantize_activation_codes, quantize_activations_grouped, Fp8Linear, Fp8Weight, Granularity,
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
    if rows > 2 {
        x[2 * k + 3] = 3.0e4; // an outlier: the rest of its row flushes toward zero
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
fn check_layer(
    dev: &Device,
    name: &str,
    w: &Fp8Weight,
    x: &Tensor,
    bias: &[f32],
    dt: DType,
    force_fallback: bool,
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
    let n = inp as f32;
    let s: Vec<f32> = s_abs
        .iter()
        .map(|&v| (2f64.powi(-10) + (n as f64 + 2.0) * 2f64.powi(-24)) as f32 * v)
        .collect();
    let mut gl = Fp8Linear::new(w.clone(), Some(Tensor::new(bias, dev).unwrap()), dev).unwrap();
    gl.set_force_fallback(force_fallback);
    let y = gl.forward(&xc.to_device(dev).unwrap()).unwrap();
    assert_eq!(y.dims(), &[x.dims()[0], out]);
    assert_eq!(y.dtype(), dt);
    let path = gl.last_gpu_path();
    if force_fallback {
        assert_eq!(path, Some(mxattn_fp8::GemmPath::Fallback));
    }
    mxattn::attention::check_device(dev).unwrap();
    let what = format!("{name} [{}, {inp}]→{out} {dt:?} path {path:?}", x.dims()[0]);
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
                for fb in [false, true] {
                    check_layer(&dev, name, &wq, &x, &bias, dt, fb);
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
            check_layer(&dev, name, &wq, &x, &bias, DType::BF16, false);
            if ci == 1 {
                check_layer(&dev, name, &wq, &x, &bias, DType::BF16, true);
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
        check_layer(&dev, file, &w, &x, &bias, DType::BF16, false);
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
