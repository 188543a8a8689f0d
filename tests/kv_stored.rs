//! The attention op takes a quantized KV cache as stored (MX codes + E8M0 scales) and
//! decodes the codes into its prepared operands instead of dequantizing the cache and
//! quantizing it again: the result must be bit for bit what the dequantizing path gives,
//! on both CPU paths, for every preset a model caches in MX.

mod common;

use candle_core::{DType, Device, Tensor};
use mxattn::attention::{
    attention_decode_ext, attention_ext, preset, takes_as_stored, Algorithm, AttentionConfig,
    CpuPath, KvOperand, OperandFormat, RunOptions, PRESETS,
};
use mxattn::mx::{self, ElemFormat, ScaleMode};

/// The config a model runs for a preset (a Fused-Softmax rotation moved into the model, as
/// the Qwen3 crate does, so the cache holds rotated keys) and its cache storage.
fn model_config(name: &str) -> (AttentionConfig, Option<mxattn::attention::OperandFormat>) {
    let p = preset(name).unwrap();
    let mut cfg = p.config;
    if let Algorithm::FusedSoftmax(f) = &mut cfg.algorithm {
        f.hadamard = false;
    }
    (cfg, p.kv_storage)
}

fn run(
    q: &Tensor,
    k: &KvOperand,
    v: &KvOperand,
    cfg: &AttentionConfig,
    path: CpuPath,
) -> (Vec<u32>, Vec<u32>) {
    let opts = RunOptions {
        cpu_path: path,
        ..Default::default()
    };
    let dt = q.dtype();
    let stored = attention_decode_ext(q, k, v, cfg, &opts).unwrap();
    let (kd, vd) = (k.to_tensor(dt).unwrap(), v.to_tensor(dt).unwrap());
    let dequantized = attention_ext(q, &kd, &vd, cfg, &opts).unwrap().out;
    let bits = |t: Tensor| {
        let v: Vec<f32> = t
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        common::bits(&v)
    };
    (bits(stored), bits(dequantized))
}

/// Every preset with an MX cache, f32 and bf16 queries, 1 and 5 query rows (causal), a
/// cache with and without a dense V tail, GQA, head dims 64 and 128, both CPU paths.
#[test]
fn stored_mx_cache_gives_the_dequantized_result_bit_for_bit() {
    let (b, hq, hkv) = (1, 4, 2);
    let mut checked = 0;
    for (name, _) in PRESETS {
        let (cfg, storage) = model_config(name);
        for (d, n, sq, dt) in [
            (64, 300, 1, DType::F32),
            (128, 256, 5, DType::BF16),
            (64, 77, 5, DType::BF16),
        ] {
            let seed = checked as u64;
            let q = common::uniform(&[b, hq, sq, d], seed, -2.0)
                .to_dtype(dt)
                .unwrap();
            let k = common::uniform(&[b, hkv, n, d], seed + 1, -2.0);
            let v = common::uniform(&[b, hkv, n, d], seed + 2, -2.0);
            let Some(c) = common::mx_cache(&k, &v, &cfg, storage) else {
                continue;
            };
            let kx = KvOperand::Mx {
                full: Some(c.k.clone()),
                tail: None,
            };
            let vx = KvOperand::Mx {
                full: Some(c.v.clone()),
                tail: c.v_tail.as_ref(),
            };
            // every cache the op made itself is taken as stored, but for AMD's round-up
            // rule, whose requantization is not a fixed point (see the next test)
            let round_up = c.k.scale_mode() == ScaleMode::RoundUp;
            assert_eq!(
                takes_as_stored(&kx, &vx, &cfg.clone().with_causal(true), dt),
                (!round_up, true),
                "{name}: the op takes its own cache as stored"
            );
            let cfg = cfg.clone().with_causal(true);
            for path in [CpuPath::Tiled, CpuPath::Reference] {
                if path == CpuPath::Reference && d == 128 {
                    continue; // the scalar reference is slow; d = 64 covers it
                }
                let (s, r) = run(&q, &kx, &vx, &cfg, path);
                assert!(
                    s == r,
                    "{name} d={d} n={n} sq={sq} {dt:?} {path:?}: stored differs"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} cases had an MX cache");
}

/// Codes in another format than the config's, a Hadamard rotation still to apply, key
/// padding or f16 queries: the op cannot take the codes as stored, dequantizes them, and the
/// result is still the dequantizing path's.
#[test]
fn other_caches_are_dequantized() {
    let (cfg4, _) = model_config("mxfp4");
    let (cfg8, _) = model_config("mxfp8");
    let fused = preset("fused-mxfp4").unwrap().config; // rotation on
    let k = common::uniform(&[1, 2, 96, 64], 7, -2.0);
    let v = common::uniform(&[1, 2, 96, 64], 8, -2.0);
    let c8 = common::mx_cache(&k, &v, &cfg8, None).unwrap();
    let c4 = common::mx_cache(&k, &v, &cfg4, None).unwrap();
    fn op(c: &common::MxCache) -> (KvOperand<'_>, KvOperand<'_>) {
        (
            KvOperand::Mx {
                full: Some(c.k.clone()),
                tail: None,
            },
            KvOperand::Mx {
                full: Some(c.v.clone()),
                tail: c.v_tail.as_ref(),
            },
        )
    }
    let padded = cfg4.clone().with_key_lengths(vec![50]);
    let cases: [(&str, &common::MxCache, &AttentionConfig, DType); 4] = [
        ("MXFP8 cache, MXFP4 config", &c8, &cfg4, DType::F32),
        ("rotation to apply", &c4, &fused, DType::F32),
        ("key padding", &c4, &padded, DType::F32),
        ("f16 queries", &c4, &cfg4, DType::F16),
    ];
    for (what, c, cfg, dt) in cases {
        let (kx, vx) = op(c);
        assert_eq!(takes_as_stored(&kx, &vx, cfg, dt), (false, false), "{what}");
        let q = common::uniform(&[1, 4, 3, 64], 9, -2.0)
            .to_dtype(dt)
            .unwrap();
        let (s, r) = run(&q, &kx, &vx, cfg, CpuPath::Tiled);
        assert!(s == r, "{what}: differs from the dequantizing path");
    }
}

/// A stored code that decodes to NaN (E4M3's 0x7F) is bad input: a clear error naming the
/// operand, as a NaN in a dense K would be.
#[test]
fn a_nan_code_in_a_stored_cache_is_an_error() {
    let (cfg, _) = model_config("mxfp8");
    let k = common::uniform(&[1, 2, 64, 64], 1, -2.0);
    let v = common::uniform(&[1, 2, 64, 64], 2, -2.0);
    let c = common::mx_cache(&k, &v, &cfg, None).unwrap();
    let mut codes: Vec<u8> = c.k.codes().flatten_all().unwrap().to_vec1().unwrap();
    codes[5] = 0x7F;
    let codes = Tensor::from_vec(codes, c.k.codes().dims(), &Device::Cpu).unwrap();
    let bad = mxattn::mx::MxTensor::from_parts(
        codes,
        c.k.scales().clone(),
        c.k.format(),
        c.k.scale_mode(),
        c.k.block(),
        c.k.dim(),
        c.k.shape().clone(),
    )
    .unwrap();
    let kx = KvOperand::Mx {
        full: Some(bad),
        tail: None,
    };
    let vx = KvOperand::Mx {
        full: Some(c.v.clone()),
        tail: None,
    };
    let q = common::uniform(&[1, 4, 1, 64], 3, -2.0);
    let e = attention_decode_ext(&q, &kx, &vx, &cfg, &RunOptions::default()).unwrap_err();
    assert!(e.to_string().contains("k holds a non-finite value"), "{e}");
}

/// Why round-up codes are not taken as stored: a block whose largest code is E4M3's 448
/// (435.2 rounds there under a scale of 2^0) re-derives a scale one binade up when quantized
/// again, and its subnormal 2^-9 halves to 2^-10, which flushes to 0. The dequantizing path
/// (what `attention_decode` is defined as) sees that flush, so the op must not skip it.
#[test]
fn round_up_requantization_is_not_a_fixed_point() {
    let mut x = vec![0f32; 32];
    x[0] = 435.2;
    x[1] = 2f32.powi(-9);
    let t = Tensor::from_vec(x, (1, 1, 1, 32), &Device::Cpu).unwrap();
    let q = mx::quantize(&t, ElemFormat::E4M3, ScaleMode::RoundUp, 3, 32).unwrap();
    let once: Vec<f32> = q
        .dequantize()
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!((once[0], once[1]), (448.0, 2f32.powi(-9)));
    let again = mx::quantize(
        &q.dequantize().unwrap(),
        ElemFormat::E4M3,
        ScaleMode::RoundUp,
        3,
        32,
    );
    let twice: Vec<f32> = again
        .unwrap()
        .dequantize()
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!((twice[0], twice[1]), (448.0, 0.0), "the subnormal flushes");
    // so such a cache is dequantized, and the result is the dequantizing path's
    let fmt = OperandFormat::Mx {
        elem: ElemFormat::E4M3,
        scale: ScaleMode::RoundUp,
        block: 32,
    };
    let cfg = AttentionConfig::exact().with_formats(
        fmt,
        OperandFormat::Native,
        mxattn::attention::ProbFormat::F32,
    );
    let kx = KvOperand::Mx {
        full: Some(q),
        tail: None,
    };
    let v = common::uniform(&[1, 1, 1, 32], 4, -2.0);
    let vx = KvOperand::Dense(&v);
    assert_eq!(takes_as_stored(&kx, &vx, &cfg, DType::F32), (false, false));
    let qq = common::uniform(&[1, 1, 1, 32], 5, -2.0);
    let (s, r) = run(&qq, &kx, &vx, &cfg, CpuPath::Tiled);
    assert!(s == r);
}
