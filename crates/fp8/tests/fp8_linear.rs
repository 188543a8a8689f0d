//! FP8 linear layers against `scripts/gen_fp8_linear_fixtures.py` (numpy + ml_dtypes'
//! float8_e4m3fn, float64 products): codes and scales bit for bit for each granularity, the
//! product within f32 accumulation, the two FP8 checkpoint layouts read from safetensors,
//! the error against the f32 layer within what E4M3 allows, and bad input as errors.

use candle_core::{Device, Tensor};
use mxattn_fp8::{group_scale, Fp8Linear, Fp8Weight, Granularity};
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

struct Fx {
    out: usize,
    inp: usize,
    w: Tensor,
    x: Tensor,
    bias: Tensor,
    json: serde_json::Value,
}

fn fx() -> Fx {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("tiny.json")).unwrap())
            .unwrap();
    let v = |k: &str| -> Vec<f32> {
        json[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    let (out, inp, t) = (
        json["out"].as_u64().unwrap() as usize,
        json["in"].as_u64().unwrap() as usize,
        json["tokens"].as_u64().unwrap() as usize,
    );
    let dev = Device::Cpu;
    Fx {
        out,
        inp,
        w: Tensor::from_vec(v("w"), (out, inp), &dev).unwrap(),
        x: Tensor::from_vec(v("x"), (t, inp), &dev).unwrap(),
        bias: Tensor::from_vec(v("bias"), out, &dev).unwrap(),
        json,
    }
}

/// A fixture's array of numbers.
fn f64s(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn vec2(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_vec2().unwrap()
}

/// |ours − oracle| per output within f32 accumulation: n·2⁻²⁴·Σ|a·w| (+ the bias's rounding).
fn check_product(what: &str, y: &Tensor, want: &[f64], a: &Tensor, wv: &Tensor, out: usize) {
    let (y, a, wv) = (vec2(y), vec2(a), vec2(wv));
    let n = a[0].len() as f64;
    for (t, row) in y.iter().enumerate() {
        for o in 0..out {
            let s: f64 = (0..a[0].len())
                .map(|i| (a[t][i] as f64 * wv[o][i] as f64).abs())
                .sum();
            let bound = (n + 2.0) * 2f64.powi(-24) * (s + want[t * out + o].abs()) + 1e-30;
            let d = (row[o] as f64 - want[t * out + o]).abs();
            assert!(
                d <= bound,
                "{what}: y[{t}, {o}] = {} vs {} (bound {bound:e})",
                row[o],
                want[t * out + o]
            );
        }
    }
}

fn granularities() -> [(&'static str, Granularity); 3] {
    [
        ("tensor", Granularity::Tensor),
        ("channel", Granularity::Channel),
        ("block128", Granularity::BLOCK128),
    ]
}

#[test]
fn codes_scales_and_product_match_the_oracle() {
    let f = fx();
    for (name, g) in granularities() {
        let want = &f.json["granularity"][name];
        let w = Fp8Weight::quantize(&f.w, g).unwrap();
        assert_eq!(
            hex(w.codes()),
            want["codes_hex"].as_str().unwrap(),
            "{name} codes"
        );
        let scales: Vec<f32> = want["scales"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(w.scales(), scales.as_slice(), "{name} scales");
        let ys: Vec<f64> = f64s(&want["y"]);
        let wv = w.dequantize(&Device::Cpu).unwrap();
        let l = Fp8Linear::new(w, Some(f.bias.clone()), &Device::Cpu).unwrap();
        let y = l.forward(&f.x).unwrap();
        let a = mxattn_fp8::quantize_activations_grouped(&f.x, l.activation_group()).unwrap();
        check_product(name, &y, &ys, &a, &wv, f.out);
    }
}

#[test]
fn fp8_checkpoints_load_as_stored() {
    let f = fx();
    for (file, name) in [
        ("comfyui_scaled_fp8.safetensors", "tensor"),
        ("qwen_fp8.safetensors", "block128"),
    ] {
        let w = Fp8Weight::from_safetensors(&fixtures().join(file), "layer").unwrap();
        let want = &f.json["granularity"][name];
        assert_eq!(w.shape(), (f.out, f.inp));
        assert_eq!(
            hex(w.codes()),
            want["codes_hex"].as_str().unwrap(),
            "{file}"
        );
        let ys: Vec<f64> = f64s(&want["y"]);
        let wv = w.dequantize(&Device::Cpu).unwrap();
        let l = Fp8Linear::new(w, Some(f.bias.clone()), &Device::Cpu).unwrap();
        let a = mxattn_fp8::quantize_activations_grouped(&f.x, l.activation_group()).unwrap();
        check_product(file, &l.forward(&f.x).unwrap(), &ys, &a, &wv, f.out);
    }
}

/// Against the f32 layer: E4M3 keeps 3 mantissa bits, so a normal value moves by at most
/// u = 2⁻⁴ of itself, a subnormal one by at most half the smallest step, 2⁻¹⁰ of its group's
/// scale. With ex, ew those per-element bounds, |x̂ŵ − xw| ≤ ex·(|w| + ew) + |x|·ew, summed
/// over the inputs (plus f32 accumulation).
#[test]
fn error_against_f32_is_within_what_e4m3_allows() {
    let f = fx();
    let xs = vec2(&f.x);
    let ws = vec2(&f.w);
    let u = 2f64.powi(-4);
    let sub = 2f64.powi(-10);
    let exact = vec2(&f.x.matmul(&f.w.t().unwrap()).unwrap());
    for (name, g) in granularities() {
        let w = Fp8Weight::quantize(&f.w, g).unwrap();
        let sw: Vec<f32> = w.scales().to_vec();
        let l = Fp8Linear::new(w.clone(), None, &Device::Cpu).unwrap();
        let y = vec2(&l.forward(&f.x).unwrap());
        let mut worst = 0f64;
        for (t, xr) in xs.iter().enumerate() {
            let sx = group_scale(xr.iter().fold(0f32, |m, v| m.max(v.abs()))) as f64;
            for o in 0..f.out {
                let swo = match g {
                    Granularity::Tensor => sw[0],
                    Granularity::Channel => sw[o],
                    _ => 0.0,
                } as f64;
                let mut bound = 0f64;
                for (i, &xv) in xr.iter().enumerate() {
                    let s_w = if let Granularity::Block { cols, .. } = g {
                        sw[i / cols] as f64
                    } else {
                        swo
                    };
                    let (xa, wa) = ((xv as f64).abs(), (ws[o][i] as f64).abs());
                    let ex = (u * xa).max(sub * sx);
                    let ew = (u * wa).max(sub * s_w);
                    bound += ex * (wa + ew) + xa * ew;
                }
                let d = (y[t][o] - exact[t][o]).abs() as f64;
                assert!(
                    d <= bound * (1.0 + 1e-3) + 1e-6,
                    "{name}: y[{t}, {o}] off by {d:e} > {bound:e}"
                );
                worst = worst.max(d / bound.max(1e-30));
            }
        }
        println!("{name}: worst error / bound {worst:.3}");
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let dev = Device::Cpu;
    let nan = Tensor::new(&[[1f32, f32::NAN]], &dev).unwrap();
    let e = Fp8Weight::quantize(&nan, Granularity::Channel)
        .unwrap_err()
        .to_string();
    assert!(e.contains("non-finite value NaN at [0, 1]"), "{e}");
    let e = Fp8Weight::quantize(
        &Tensor::zeros(3, candle_core::DType::F32, &dev).unwrap(),
        Granularity::Tensor,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("expected a [out, in] matrix"), "{e}");
    let e = Fp8Weight::from_parts(2, 2, vec![0; 4], Granularity::Channel, vec![1.0, 0.0])
        .unwrap_err()
        .to_string();
    assert!(e.contains("scale 0 is not a finite positive"), "{e}");
    let e = Fp8Weight::from_parts(2, 2, vec![0, 0x7F, 0, 0], Granularity::Tensor, vec![1.0])
        .unwrap_err()
        .to_string();
    assert!(e.contains("[0, 1] is E4M3's NaN"), "{e}");
    let e = Fp8Weight::from_safetensors(&fixtures().join("qwen_fp8.safetensors"), "other")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("qwen_fp8.safetensors: other.weight: no tensor"),
        "{e}"
    );
    let w = Fp8Weight::quantize(
        &Tensor::ones((3, 4), candle_core::DType::F32, &dev).unwrap(),
        Granularity::Tensor,
    )
    .unwrap();
    let l = Fp8Linear::new(w, None, &dev).unwrap();
    let e = l
        .forward(&Tensor::ones((2, 5), candle_core::DType::F32, &dev).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("has 5 features, the layer takes 4"), "{e}");
}

/// Weight-only layers (`fp8-w`): the oracle's `y_weight_only` (x as given times the FP8
/// weight's values, float64) within f32 accumulation, for tensor and channel scales; the
/// activations really are left alone (the all-FP8 layer's output differs where a token's
/// values are not E4M3 values); a block-scaled weight is refused; the linear schedule's
/// `fp8-w` builds such a layer and converts an FP8 layer back and forth.
#[test]
fn weight_only_layers_match_the_oracle() {
    use mxattn_fp8::{Linear, LinearFormat};
    let f = fx();
    let xs = vec2(&f.x);
    for name in ["tensor", "channel"] {
        let g = if name == "tensor" {
            Granularity::Tensor
        } else {
            Granularity::Channel
        };
        let want = &f.json["granularity"][name];
        let ys: Vec<f64> = f64s(&want["y_weight_only"]);
        let w = Fp8Weight::quantize(&f.w, g).unwrap();
        let wv = w.dequantize(&Device::Cpu).unwrap();
        let l = Fp8Linear::new(w.clone(), Some(f.bias.clone()), &Device::Cpu)
            .unwrap()
            .weight_only(true)
            .unwrap();
        assert!(l.is_weight_only());
        let y = l.forward(&f.x).unwrap();
        check_product(&format!("{name} weight-only"), &y, &ys, &f.x, &wv, f.out);
        // token 1 holds a 40 among N(0, 1) values: quantized, they move by up to 2⁻⁴ of
        // themselves, far more than f32 accumulation allows
        let both = vec2(
            &Fp8Linear::new(w, Some(f.bias.clone()), &Device::Cpu)
                .unwrap()
                .forward(&f.x)
                .unwrap(),
        );
        let yv = vec2(&y);
        let moved = (0..f.out)
            .map(|o| (yv[1][o] - both[1][o]).abs() as f64)
            .fold(0f64, f64::max);
        let scale: f64 = xs[1].iter().map(|v| (*v as f64).abs()).sum::<f64>() / xs[1].len() as f64;
        assert!(
            moved > 1e-4 * scale,
            "{name}: weight-only equals the FP8-activation layer"
        );
    }
    let e = Fp8Linear::new(
        Fp8Weight::quantize(&f.w, Granularity::BLOCK128).unwrap(),
        None,
        &Device::Cpu,
    )
    .unwrap()
    .weight_only(true)
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("weight-only layers take tensor or channel scales"),
        "{e}"
    );

    let dense = candle_nn::Linear::new(f.w.clone(), Some(f.bias.clone()));
    let g = mxattn::schedule::Grammar {
        model: "test",
        keys: &[],
        presets: &[],
        kv_cache: false,
    };
    let fmt: LinearFormat = mxattn::schedule::Choice::parse_name("fp8-w", &g).unwrap();
    assert_eq!(fmt, LinearFormat::Fp8WeightOnly);
    let mut l = Linear::new(dense, fmt).unwrap();
    assert_eq!(l.format().name(), "fp8-w");
    let ys: Vec<f64> = f64s(&f.json["granularity"]["channel"]["y_weight_only"]);
    let wv = Fp8Weight::quantize(&f.w, Granularity::Channel)
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap();
    use candle_core::Module;
    check_product(
        "Linear fp8-w",
        &l.forward(&f.x).unwrap(),
        &ys,
        &f.x,
        &wv,
        f.out,
    );
    l.convert(LinearFormat::Fp8(Granularity::Channel)).unwrap();
    assert_eq!(l.format(), LinearFormat::Fp8(Granularity::Channel));
    let ys: Vec<f64> = f64s(&f.json["granularity"]["channel"]["y"]);
    let a = mxattn_fp8::quantize_activations_grouped(&f.x, None).unwrap();
    check_product(
        "Linear fp8 after fp8-w",
        &l.forward(&f.x).unwrap(),
        &ys,
        &a,
        &wv,
        f.out,
    );

    // fp8-fast: channel scales with CUDA's fast accumulation; on the CPU the same oracle as fp8
    let fmt: LinearFormat = mxattn::schedule::Choice::parse_name("fp8-fast", &g).unwrap();
    assert_eq!(fmt, LinearFormat::Fp8Fast);
    l.convert(fmt).unwrap();
    assert_eq!(l.format().name(), "fp8-fast");
    check_product(
        "Linear fp8-fast",
        &l.forward(&f.x).unwrap(),
        &ys,
        &a,
        &wv,
        f.out,
    );
    l.convert(LinearFormat::Fp8(Granularity::Channel)).unwrap();
    assert_eq!(l.format(), LinearFormat::Fp8(Granularity::Channel));
    let dense = candle_nn::Linear::new(f.w.clone(), Some(f.bias.clone()));
    assert_eq!(
        Linear::new(dense, LinearFormat::Fp8Fast).unwrap().format(),
        LinearFormat::Fp8Fast
    );
    // block scales have no fast-accumulation GEMM: such a layer keeps the promoted sums
    let blocks = Fp8Weight::quantize(&f.w, Granularity::BLOCK128).unwrap();
    let mut l = Linear::from_fp8(blocks, None, &Device::Cpu).unwrap();
    l.convert(LinearFormat::Fp8Fast).unwrap();
    assert_eq!(l.format(), LinearFormat::Fp8(Granularity::BLOCK128));
}
