//! The attention framework: reference vs tiled, the f64 oracle, masks, GQA, bad input.

mod common;
use candle_core::{DType, Device, Tensor};
use common::bits;
use mxattn::attention::{
    attention, attention_with_lse, Algorithm, AttentionConfig, CpuPath, OperandFormat, ProbFormat,
};
use mxattn::mx::{ElemFormat, ScaleMode};
use mxattn::oracle::{exact_attention_f64, mean_max, row_relative_errors, OracleMask};
use mxattn::synth::{self, Distribution, Shape};

fn run(inp: &synth::Inputs, cfg: &AttentionConfig, path: CpuPath) -> (Vec<f32>, Vec<f32>) {
    let r = common::run_cpu(inp, cfg, path);
    (r.o, r.lse)
}

fn configs() -> Vec<AttentionConfig> {
    use ElemFormat::*;
    vec![
        AttentionConfig::exact(),
        AttentionConfig::exact().with_formats(
            OperandFormat::Bf16,
            OperandFormat::Bf16,
            ProbFormat::F32,
        ),
        // operand floor: exact softmax on MXFP4 Q/K, MXFP6 V
        AttentionConfig::exact().with_formats(
            OperandFormat::mx(E2M1),
            OperandFormat::mx(E2M3),
            ProbFormat::F32,
        ),
        AttentionConfig::exp_then_quantize(
            OperandFormat::mx(E4M3),
            OperandFormat::fp8_per_channel(),
            ProbFormat::Fp8 { elem: E4M3 },
        ),
        AttentionConfig::exp_then_quantize(
            OperandFormat::mx_with(E2M3, ScaleMode::Rceil),
            OperandFormat::mx(E2M1),
            ProbFormat::mx(E2M1),
        ),
        AttentionConfig::exp_then_quantize(
            OperandFormat::mx(E3M2),
            OperandFormat::Native,
            ProbFormat::mx_with(E2M3, ScaleMode::Even),
        ),
    ]
}

/// Reference and tiled paths agree to the bit: outputs and LSE, with ragged query and
/// key tails (not multiples of the 16-row block or the 128-key tile), GQA, causal and
/// key-padding masks. Both run the same arithmetic in the same order by construction
/// (shared `dot`, sequential sums), while operand preparation, loop order, masking and
/// the parallel split are written twice; this is what the test pins down.
#[test]
fn reference_and_tiled_paths_are_bit_identical() {
    let shapes = [
        Shape::new(2, 4, 2, 37, 300, 64),
        Shape::new(1, 3, 1, 20, 129, 32),
        Shape::new(1, 2, 2, 1, 257, 128),
    ];
    for (si, s) in shapes.iter().enumerate() {
        let inp = synth::make(Distribution::Gaussian { sigma: 2.0 }, *s, 11 + si as u64).unwrap();
        for cfg in configs() {
            for (causal, lens) in [
                (false, None),
                (true, None),
                (true, Some(vec![s.sk - 5; s.b])),
                (false, Some(vec![1; s.b])),
            ] {
                let mut c = cfg.clone().with_causal(causal);
                c.key_lengths = lens;
                let (o_ref, l_ref) = run(&inp, &c, CpuPath::Reference);
                let (o_t, l_t) = run(&inp, &c, CpuPath::Tiled);
                assert_eq!(
                    bits(&o_ref),
                    bits(&o_t),
                    "O differs: {s} {}, causal {causal}",
                    c.label()
                );
                assert_eq!(bits(&l_ref), bits(&l_t), "LSE differs: {s} {}", c.label());
                assert!(o_t.iter().all(|x| x.is_finite()));
            }
        }
    }
}

#[test]
fn exact_matches_the_f64_oracle_with_masks_and_gqa() {
    let s = Shape::new(2, 4, 2, 50, 200, 64);
    let inp = synth::make(Distribution::Gaussian { sigma: 2.0 }, s, 3).unwrap();
    for (causal, lens) in [(false, None), (true, None), (true, Some(vec![200, 77]))] {
        let mut cfg = AttentionConfig::exact().with_causal(causal);
        cfg.key_lengths = lens.clone();
        let (o, lse) = run(&inp, &cfg, CpuPath::Tiled);
        let mask = OracleMask {
            causal,
            key_lengths: lens,
            softmax_scale: None,
        };
        let r = exact_attention_f64(&inp.q, &inp.k, &inp.v, &mask).unwrap();
        let (mean, max) = mean_max(&row_relative_errors(&o, &r));
        assert!(max < 2e-6, "causal {causal}: mean {mean:e} max {max:e}");
        for (a, b) in lse.iter().zip(&r.lse) {
            assert!(
                (*a as f64 - b).abs() < 1e-5 * (1.0 + b.abs()),
                "lse {a} vs {b}"
            );
        }
    }
}

#[test]
fn exp_then_quantize_with_f32_p_equals_exact() {
    let s = Shape::new(1, 2, 2, 40, 300, 64);
    let inp = synth::make(Distribution::Sink, s, 5).unwrap();
    let e = AttentionConfig::exact().with_formats(
        OperandFormat::mx(ElemFormat::E4M3),
        OperandFormat::Native,
        ProbFormat::F32,
    );
    let t = e.clone().with_algorithm(Algorithm::ExpThenQuantize);
    assert_eq!(
        bits(&run(&inp, &e, CpuPath::Tiled).0),
        bits(&run(&inp, &t, CpuPath::Tiled).0)
    );
}

/// MXFP4 P costs accuracy, FP8 P much less, and neither is free: checks the ordering
/// against the f64 oracle on Gaussian inputs (the magnitudes are pinned by the
/// accuracy evaluation against efq §A.4).
#[test]
fn quantized_p_error_is_ordered_by_precision() {
    let s = Shape::new(1, 2, 2, 64, 1024, 128);
    let inp = synth::make(Distribution::Gaussian { sigma: 1.0 }, s, 9).unwrap();
    let r = exact_attention_f64(&inp.q, &inp.k, &inp.v, &OracleMask::default()).unwrap();
    let err = |p: ProbFormat| {
        let cfg =
            AttentionConfig::exp_then_quantize(OperandFormat::Native, OperandFormat::Native, p);
        mean_max(&row_relative_errors(&run(&inp, &cfg, CpuPath::Tiled).0, &r)).0
    };
    let (e4, e8, e32) = (
        err(ProbFormat::mx(ElemFormat::E2M1)),
        err(ProbFormat::Fp8 {
            elem: ElemFormat::E4M3,
        }),
        err(ProbFormat::F32),
    );
    assert!(e32 < 1e-5, "{e32}");
    assert!(e8 > 5e-3 && e8 < 0.05, "{e8}");
    assert!(e4 > 0.1 && e4 < 0.2, "{e4}");
}

#[test]
fn gqa_equals_repeated_kv_heads() {
    let s = Shape::new(1, 6, 2, 9, 140, 32);
    let inp = synth::make(Distribution::Gaussian { sigma: 1.0 }, s, 21).unwrap();
    let rep = |t: &Tensor| {
        // head h of q uses kv head h / 3
        let heads: Vec<Tensor> = (0..6).map(|h| t.narrow(1, h / 3, 1).unwrap()).collect();
        Tensor::cat(&heads, 1).unwrap()
    };
    let cfg = AttentionConfig::exact().with_causal(true);
    let a = attention(&inp.q, &inp.k, &inp.v, &cfg).unwrap();
    let b = attention(&inp.q, &rep(&inp.k), &rep(&inp.v), &cfg).unwrap();
    let d = (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_eq!(d, 0.0);
}

#[test]
fn causal_decode_sees_every_key() {
    let s = Shape::new(1, 2, 2, 1, 333, 64);
    let inp = synth::make(Distribution::Gaussian { sigma: 2.0 }, s, 4).unwrap();
    let a = run(
        &inp,
        &AttentionConfig::exact().with_causal(true),
        CpuPath::Tiled,
    )
    .0;
    let b = run(&inp, &AttentionConfig::exact(), CpuPath::Tiled).0;
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn fully_masked_rows_give_zeros_and_minus_inf_lse() {
    let s = Shape::new(2, 2, 1, 6, 4, 32);
    let inp = synth::make(Distribution::Gaussian { sigma: 1.0 }, s, 8).unwrap();
    // batch 1 has no valid key; causal with sq 6 > kv_len 4 masks rows 0 and 1 of batch 0
    for algo in [Algorithm::Exact, Algorithm::ExpThenQuantize] {
        let mut cfg = AttentionConfig::exact()
            .with_algorithm(algo)
            .with_causal(true)
            .with_key_lengths(vec![4, 0]);
        if cfg.algorithm == Algorithm::ExpThenQuantize {
            cfg.p_format = ProbFormat::mx(ElemFormat::E2M1);
        }
        for path in [CpuPath::Reference, CpuPath::Tiled] {
            let (o, lse) = run(&inp, &cfg, path);
            for (row, l) in lse.iter().enumerate() {
                let (bb, i) = (row / 12, row % 6);
                let masked = bb == 1 || i < 2;
                let orow = &o[row * 32..(row + 1) * 32];
                if masked {
                    assert_eq!(*l, f32::NEG_INFINITY, "row {row}");
                    assert!(orow.iter().all(|x| *x == 0.0));
                } else {
                    assert!(l.is_finite() && orow.iter().all(|x| x.is_finite()));
                }
            }
        }
    }
}

#[test]
fn every_stress_distribution_gives_finite_output() {
    let s = Shape::new(1, 2, 1, 40, 520, 128);
    for dist in Distribution::STRESS {
        let inp = synth::make(dist, s, 77).unwrap();
        for cfg in configs() {
            for causal in [false, true] {
                let (o, lse) = run(&inp, &cfg.clone().with_causal(causal), CpuPath::Tiled);
                assert!(o.iter().all(|x| x.is_finite()), "{dist} {}", cfg.label());
                assert!(lse.iter().all(|x| x.is_finite()), "{dist} {}", cfg.label());
            }
        }
        if dist == Distribution::Zeros {
            // uniform weights over zero values
            let (o, _) = run(&inp, &AttentionConfig::exact(), CpuPath::Tiled);
            assert!(o.iter().all(|x| *x == 0.0));
        }
    }
}

#[test]
fn half_precision_inputs_keep_their_dtype() {
    let s = Shape::new(1, 2, 2, 8, 64, 64);
    let inp = synth::make(Distribution::Gaussian { sigma: 1.0 }, s, 1).unwrap();
    for dt in [DType::BF16, DType::F16] {
        let (q, k, v) = (
            inp.q.to_dtype(dt).unwrap(),
            inp.k.to_dtype(dt).unwrap(),
            inp.v.to_dtype(dt).unwrap(),
        );
        let (o, lse) = attention_with_lse(&q, &k, &v, &AttentionConfig::exact()).unwrap();
        assert_eq!(o.dtype(), dt);
        assert_eq!(lse.dtype(), DType::F32);
        assert_eq!(lse.dims(), &[1, 2, 8]);
        let r = exact_attention_f64(&q, &k, &v, &OracleMask::default()).unwrap();
        let o32 = o
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert!(mean_max(&row_relative_errors(&o32, &r)).1 < 1e-2);
    }
}

fn err_of(q: &Tensor, k: &Tensor, v: &Tensor, cfg: &AttentionConfig) -> String {
    match attention(q, k, v, cfg) {
        Ok(_) => panic!("expected an error for {}", cfg.label()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let dev = Device::Cpu;
    let t = |d: &[usize]| Tensor::zeros(d, DType::F32, &dev).unwrap();
    let (q, k, v) = (t(&[1, 4, 8, 64]), t(&[1, 2, 16, 64]), t(&[1, 2, 16, 64]));
    let ex = AttentionConfig::exact();
    assert!(err_of(&t(&[4, 8, 64]), &k, &v, &ex).contains("rank 4"));
    assert!(err_of(&q, &t(&[1, 3, 16, 64]), &t(&[1, 3, 16, 64]), &ex).contains("multiple"));
    assert!(err_of(&q, &k, &t(&[1, 2, 15, 64]), &ex).contains("same shape"));
    assert!(err_of(&q, &t(&[1, 2, 16, 32]), &t(&[1, 2, 16, 32]), &ex).contains("head dim"));
    assert!(err_of(&q.to_dtype(DType::BF16).unwrap(), &k, &v, &ex).contains("dtype"));
    let u8q = Tensor::zeros((1, 4, 8, 64), DType::U8, &dev).unwrap();
    assert!(err_of(&u8q, &k, &v, &ex).contains("dtype"));
    // MX Q/K need head dims that are multiples of the block
    let (q2, k2) = (t(&[1, 4, 8, 48]), t(&[1, 2, 16, 48]));
    let mx = AttentionConfig::exact().with_formats(
        OperandFormat::mx(ElemFormat::E2M1),
        OperandFormat::Native,
        ProbFormat::F32,
    );
    let e = err_of(&q2, &k2, &k2, &mx);
    assert!(
        e.contains("head dim 48") && e.contains("multiple of 32"),
        "{e}"
    );
    // exact with a quantized P, per-channel Q/K, P blocks not dividing the tile
    let e = err_of(
        &q,
        &k,
        &v,
        &AttentionConfig::exact().with_formats(
            OperandFormat::Native,
            OperandFormat::Native,
            ProbFormat::mx(ElemFormat::E2M1),
        ),
    );
    assert!(e.contains("ExpThenQuantize"), "{e}");
    let pc = AttentionConfig::exact().with_formats(
        OperandFormat::fp8_per_channel(),
        OperandFormat::Native,
        ProbFormat::F32,
    );
    assert!(err_of(&q, &k, &v, &pc).contains("V only"));
    let badp = AttentionConfig::exp_then_quantize(
        OperandFormat::Native,
        OperandFormat::Native,
        ProbFormat::Mx {
            elem: ElemFormat::E2M1,
            scale: ScaleMode::Floor,
            block: 48,
        },
    );
    assert!(err_of(&q, &k, &v, &badp).contains("divide"));
    // key lengths
    assert!(err_of(
        &q,
        &k,
        &v,
        &AttentionConfig::exact().with_key_lengths(vec![17])
    )
    .contains("exceeds"));
    assert!(err_of(
        &q,
        &k,
        &v,
        &AttentionConfig::exact().with_key_lengths(vec![1, 2])
    )
    .contains("entries"));
    assert!(err_of(
        &q,
        &k,
        &v,
        &AttentionConfig::exact().with_softmax_scale(f32::NAN)
    )
    .contains("softmax_scale"));
    // NaN / Inf inputs are reported, with where
    let mut qv = vec![0f32; 4 * 8 * 64];
    qv[2 * 64 + 5] = f32::NAN;
    let qn = Tensor::from_vec(qv, (1, 4, 8, 64), &dev).unwrap();
    let e = err_of(&qn, &k, &v, &ex);
    assert!(
        e.contains("non-finite") && e.contains("[0, 0, 2, 5]"),
        "{e}"
    );
    let vi = (v.clone() + f64::INFINITY).unwrap();
    assert!(err_of(&q, &k, &vi, &ex).contains("v holds"));
    // finite inputs whose scores overflow f32
    let big = (t(&[1, 2, 16, 64]) + 1e30).unwrap();
    let qb = (t(&[1, 4, 8, 64]) + 1e30).unwrap();
    assert!(err_of(&qb, &big, &v, &ex).contains("overflow"));
}

/// On the CPU every call checks its inputs as it runs, deferred or not, and there is
/// nothing to gather.
#[test]
fn deferred_checks_on_the_cpu_still_fail_the_call() {
    use mxattn::attention::{attention_ext, check_device, DeviceChecks, RunOptions};
    let mut q = vec![0.5f32; 2 * 4 * 32];
    q[7] = f32::INFINITY;
    let q = Tensor::from_vec(q, (1, 2, 4, 32), &Device::Cpu).unwrap();
    let k = Tensor::ones((1, 2, 4, 32), DType::F32, &Device::Cpu).unwrap();
    let opts = RunOptions {
        checks: DeviceChecks::Deferred,
        ..Default::default()
    };
    let e = attention_ext(&q, &k, &k, &AttentionConfig::exact(), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("non-finite") || e.contains("Inf"), "{e}");
    assert_eq!(check_device(&Device::Cpu).unwrap(), Default::default());
}
