//! Fused-Softmax: bit identity of the two CPU paths, the frozen max and its rollback,
//! the hand-worked P codes, masks, Hadamard, and what it refuses.

mod common;
use candle_core::{Device, Tensor};
use common::{bits, run_cpu as run};
use mxattn::attention::{
    attention, AttentionConfig, CpuPath, FusedProbs, FusedSoftmaxConfig, OperandFormat, ProbFormat,
};
use mxattn::mx::{ElemFormat, ScaleMode};
use mxattn::oracle::{exact_attention_f64, mean_max, row_relative_errors, OracleMask};
use mxattn::synth::{self, Distribution, Shape};

fn fused(qk: ElemFormat, v: OperandFormat, probs: FusedProbs, hadamard: bool) -> AttentionConfig {
    AttentionConfig::fused_softmax(qk, v, FusedSoftmaxConfig { probs, hadamard })
}

const PROBS: [FusedProbs; 5] = [
    FusedProbs::U8Code,
    FusedProbs::U8CodeWide,
    FusedProbs::Fp32Bits,
    FusedProbs::ExactE4M3,
    FusedProbs::ExactF32,
];

fn sweep_configs() -> Vec<AttentionConfig> {
    use ElemFormat::*;
    let mut v = vec![];
    for (qk, vf) in [
        (E4M3, OperandFormat::fp8_per_channel()),
        (E2M3, OperandFormat::mx(E2M3)),
        (E3M2, OperandFormat::mx(E2M1)),
        (E2M1, OperandFormat::mx(E2M1)),
    ] {
        for probs in PROBS {
            v.push(fused(qk, vf, probs, true));
        }
    }
    // P re-quantized to MXFP4 / MXFP6, and no Hadamard
    let mut c = fused(E2M1, OperandFormat::mx(E2M1), FusedProbs::U8Code, true);
    c.p_format = ProbFormat::mx(E2M1);
    v.push(c);
    let mut c = fused(
        E4M3,
        OperandFormat::fp8_per_channel(),
        FusedProbs::Fp32Bits,
        false,
    );
    c.p_format = ProbFormat::mx_with(E2M3, ScaleMode::Rceil);
    v.push(c);
    v
}

#[test]
fn reference_and_tiled_paths_are_bit_identical() {
    let shapes = [
        Shape::new(2, 4, 2, 19, 300, 64),
        Shape::new(1, 2, 1, 33, 129, 128),
    ];
    for (si, s) in shapes.iter().enumerate() {
        for dist in [
            Distribution::Gaussian { sigma: 4.0 },
            Distribution::LateSink,
        ] {
            let inp = synth::make(dist, *s, 100 + si as u64).unwrap();
            for cfg in sweep_configs() {
                for (causal, lens) in [(false, None), (true, Some(vec![s.sk - 7; s.b]))] {
                    let mut c = cfg.clone().with_causal(causal);
                    c.key_lengths = lens;
                    let a = run(&inp, &c, CpuPath::Reference);
                    let b = run(&inp, &c, CpuPath::Tiled);
                    assert_eq!(bits(&a.o), bits(&b.o), "O: {s} {dist} {}", c.label());
                    assert_eq!(bits(&a.lse), bits(&b.lse), "LSE: {s} {dist} {}", c.label());
                    assert_eq!(a.rollbacks, b.rollbacks);
                }
            }
        }
    }
}

#[test]
fn every_stress_distribution_is_finite_and_late_peaks_take_the_rollback_path() {
    let s = Shape::new(1, 2, 1, 32, 1024, 128);
    for dist in Distribution::STRESS {
        let inp = synth::make(dist, s, 7).unwrap();
        for cfg in sweep_configs() {
            for causal in [false, true] {
                let r = run(&inp, &cfg.clone().with_causal(causal), CpuPath::Tiled);
                assert!(r.o.iter().all(|x| x.is_finite()), "{dist} {}", cfg.label());
                assert!(
                    r.lse.iter().all(|x| x.is_finite()),
                    "{dist} {}",
                    cfg.label()
                );
                let frozen = !matches!(cfg.algorithm, mxattn::attention::Algorithm::FusedSoftmax(f) if f.probs == FusedProbs::ExactF32);
                let rows = (s.hq * s.sq) as u64;
                match dist {
                    // scores rising ≈2.9 log2 units per tile pass the 8.87-unit headroom of
                    // the frozen max within the 8 tiles: every row rolls back
                    Distribution::MaxStair if frozen && !causal => {
                        assert!(
                            r.rollbacks >= rows,
                            "{dist} {}: {} rollbacks",
                            cfg.label(),
                            r.rollbacks
                        )
                    }
                    // the hot key at 300 sits ≈14 log2 units above the rest on average
                    // (spread 3.6): many rows must roll back when they reach it
                    Distribution::LateSink if frozen && !causal => {
                        assert!(
                            r.rollbacks >= rows / 3,
                            "{dist} {}: {} rollbacks",
                            cfg.label(),
                            r.rollbacks
                        )
                    }
                    // the hot key is in the first tile: the frozen max already holds it
                    Distribution::Sink | Distribution::Zeros => {
                        assert_eq!(r.rollbacks, 0, "{dist} {}", cfg.label())
                    }
                    _ => {}
                }
                if !frozen {
                    assert_eq!(r.rollbacks, 0);
                }
            }
        }
    }
}

/// The P codes of a 4×4 example, worked by hand from `A = 8·(s − m) + 55.5361328125`,
/// `m = max(tile 0) − 1/8`, code = clamp(RNE(A), 0, 126), E4M3 value 2^(e−7)·(1 + f/8)
/// (subnormal below code 8). With V = I (v_j = e_j) row i of O is P_i / Σ_j P_ij.
#[test]
fn hand_computed_4x4_codes() {
    let dev = Device::Cpu;
    // scores in log2 units: s_ij = a_i · x_j (softmax scale ln 2 folds to c = 1)
    let a = [1.0f32, 0.5, -1.0, 2.0];
    let x = [3.0f32, 0.0, -1.0, -2.5];
    let q: Vec<f32> = a.iter().flat_map(|ai| [*ai, 0.0, 0.0, 0.0]).collect();
    let k: Vec<f32> = x.iter().flat_map(|xj| [*xj, 0.0, 0.0, 0.0]).collect();
    let v: Vec<f32> = (0..4)
        .flat_map(|j| (0..4).map(move |c| if c == j { 1.0 } else { 0.0 }))
        .collect();
    let q = Tensor::from_vec(q, (1, 1, 4, 4), &dev).unwrap();
    let k = Tensor::from_vec(k, (1, 1, 4, 4), &dev).unwrap();
    let v = Tensor::from_vec(v, (1, 1, 4, 4), &dev).unwrap();
    let cfg = AttentionConfig::exact()
        .with_algorithm(mxattn::attention::Algorithm::FusedSoftmax(
            FusedSoftmaxConfig {
                probs: FusedProbs::U8Code,
                hadamard: false,
            },
        ))
        .with_softmax_scale(std::f32::consts::LN_2);
    // row 0: s = [3, 0, -1, -2.5], m = 2.875: A = 56.54, 32.54, 24.54, 12.54
    //   codes 57, 33, 25, 13 = 1.125, 2^-3·1.125, 2^-4·1.125, 2^-6·1.625
    // row 1: s = [1.5, 0, -0.5, -1.25], m = 1.375: A = 56.54, 44.54, 40.54, 34.54
    //   codes 57, 45, 41, 35 = 1.125, 2^-2·1.625, 2^-2·1.125, 2^-3·1.375
    // row 2: s = [-3, 0, 1, 2.5], m = 2.375: A = 12.54, 36.54, 44.54, 56.54
    //   codes 13, 37, 45, 57 = 2^-6·1.625, 2^-3·1.625, 2^-2·1.625, 1.125
    // row 3: s = [6, 0, -2, -5], m = 5.875: A = 56.54, 8.54, -7.46, -31.46
    //   codes 57, 9, 0, 0 = 1.125, 2^-6·1.125, 0, 0 (2^-7.875 flushes: the u8 low tail)
    let p: [[f32; 4]; 4] = [
        [1.125, 0.140625, 0.0703125, 0.025390625],
        [1.125, 0.40625, 0.28125, 0.171875],
        [0.025390625, 0.203125, 0.40625, 1.125],
        [1.125, 0.017578125, 0.0, 0.0],
    ];
    let o = attention(&q, &k, &v, &cfg)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    for i in 0..4 {
        let l: f32 = p[i].iter().sum();
        for j in 0..4 {
            assert_eq!(o[i * 4 + j], p[i][j] / l, "row {i} key {j}");
        }
    }
}

#[test]
fn masked_keys_do_not_enter_the_row_sum() {
    // key lengths vs the same keys cut off: identical bits (native operands, so the cut
    // cannot change any scale), with every probability variant
    let s = Shape::new(2, 2, 2, 8, 200, 64);
    let inp = synth::make(Distribution::Gaussian { sigma: 2.0 }, s, 3).unwrap();
    for probs in PROBS {
        let mut cfg = AttentionConfig::exact().with_algorithm(
            mxattn::attention::Algorithm::FusedSoftmax(FusedSoftmaxConfig {
                probs,
                hadamard: true,
            }),
        );
        cfg.key_lengths = Some(vec![150, 150]);
        let full = run(&inp, &cfg, CpuPath::Tiled);
        cfg.key_lengths = None;
        let cut = synth::Inputs {
            q: inp.q.clone(),
            k: inp.k.narrow(2, 0, 150).unwrap(),
            v: inp.v.narrow(2, 0, 150).unwrap(),
        };
        let short = run(&cut, &cfg, CpuPath::Tiled);
        assert_eq!(bits(&full.o), bits(&short.o), "{probs:?}");
        assert_eq!(bits(&full.lse), bits(&short.lse));
    }
}

#[test]
fn hadamard_is_exact_and_keeps_quantized_error_near_the_floor() {
    let s = Shape::new(1, 2, 2, 64, 512, 128);
    let inp = synth::make(Distribution::Outliers, s, 5).unwrap();
    let r = exact_attention_f64(&inp.q, &inp.k, &inp.v, &OracleMask::default()).unwrap();
    let err = |cfg: &AttentionConfig| {
        mean_max(&row_relative_errors(&run(&inp, cfg, CpuPath::Tiled).o, &r))
    };
    let floor = |qk: OperandFormat, had: bool| {
        let mut c = AttentionConfig::exact().with_algorithm(
            mxattn::attention::Algorithm::FusedSoftmax(FusedSoftmaxConfig {
                probs: FusedProbs::ExactF32,
                hadamard: had,
            }),
        );
        c.qk_format = qk;
        c
    };
    // unquantized operands: the rotation changes nothing beyond f32 rounding
    let (on, off) = (
        err(&floor(OperandFormat::Native, true)).1,
        err(&floor(OperandFormat::Native, false)).1,
    );
    assert!(on < 1e-5 && off < 1e-5, "{on:e} {off:e}");
    // quantized: both within the MXFP4 quantization error, and the rotation helps with
    // outlier channels (the reason AMD applies it)
    let q4 = mxattn::attention::fused_qk_format(ElemFormat::E2M1);
    let (on, off) = (err(&floor(q4, true)).0, err(&floor(q4, false)).0);
    assert!(
        on < 0.4 && off < 1.0,
        "MXFP4 floor with/without Hadamard: {on} {off}"
    );
    assert!(
        on < off,
        "Hadamard should tighten MXFP4 blocks on outlier channels: {on} vs {off}"
    );
    for probs in [FusedProbs::U8Code, FusedProbs::Fp32Bits] {
        let mut c = floor(q4, true);
        c.algorithm = mxattn::attention::Algorithm::FusedSoftmax(FusedSoftmaxConfig {
            probs,
            hadamard: true,
        });
        let e = err(&c).0;
        assert!(e < on + 0.06, "{probs:?}: {e} vs floor {on}");
    }
}

#[test]
fn lse_follows_the_frozen_max_bookkeeping() {
    let s = Shape::new(1, 2, 2, 16, 700, 64);
    // Gaussian σ = 1 loses < 0.5 % of the mass to the u8 low tail; max-stair rolls back in
    // every row, so m, the rescales and the bias all enter the LSE.
    for dist in [
        Distribution::Gaussian { sigma: 1.0 },
        Distribution::MaxStair,
    ] {
        let inp = synth::make(dist, s, 9).unwrap();
        let r = exact_attention_f64(&inp.q, &inp.k, &inp.v, &OracleMask::default()).unwrap();
        // tolerances in nats (≈ relative error of L) on the mean and the worst row. The
        // exact-exp2 variants pin the bookkeeping (m, rescales); the u8 codes carry ≈3 % rms
        // error and flush scores > 6.9 log2 units under the frozen max, which costs a row
        // whose first tile holds an outlier up to ≈10 % of its mass.
        for (probs, mean_tol, max_tol) in [
            (FusedProbs::U8Code, 0.02, 0.15),
            (FusedProbs::Fp32Bits, 0.005, 0.04),
            (FusedProbs::ExactE4M3, 0.005, 0.04),
            (FusedProbs::ExactF32, 1e-5, 1e-4),
        ] {
            let mut c = AttentionConfig::exact().with_algorithm(
                mxattn::attention::Algorithm::FusedSoftmax(FusedSoftmaxConfig {
                    probs,
                    hadamard: false,
                }),
            );
            c.qk_format = OperandFormat::Native;
            let out = run(&inp, &c, CpuPath::Tiled);
            let d: Vec<f64> = out
                .lse
                .iter()
                .zip(&r.lse)
                .map(|(a, b)| *a as f64 - b)
                .collect();
            let mean = d.iter().sum::<f64>() / d.len() as f64;
            let max = d.iter().fold(0f64, |m, x| m.max(x.abs()));
            assert!(
                mean.abs() < mean_tol && max < max_tol,
                "{dist} {probs:?}: lse error mean {mean} max {max}"
            );
        }
    }
}

#[test]
fn unsupported_fused_configurations_are_errors() {
    let s = Shape::new(1, 1, 1, 4, 64, 96);
    let inp = synth::make(Distribution::Gaussian { sigma: 1.0 }, s, 1).unwrap();
    let f = |c: &AttentionConfig| {
        attention(&inp.q, &inp.k, &inp.v, c)
            .unwrap_err()
            .to_string()
    };
    let base = AttentionConfig::exact().with_algorithm(mxattn::attention::Algorithm::FusedSoftmax(
        FusedSoftmaxConfig::default(),
    ));
    assert!(f(&base).contains("power-of-two head dim"), "{}", f(&base));
    let mut c = base.clone();
    c.algorithm = mxattn::attention::Algorithm::FusedSoftmax(FusedSoftmaxConfig {
        hadamard: false,
        ..Default::default()
    });
    assert!(attention(&inp.q, &inp.k, &inp.v, &c).is_ok());
    let mut e = c.clone();
    e.qk_format = OperandFormat::mx(ElemFormat::E5M2);
    assert!(f(&e).contains("Q/K format"), "{}", f(&e));
    let mut e = c.clone();
    e.v_format = OperandFormat::PerChannel {
        elem: ElemFormat::E5M2,
    };
    assert!(f(&e).contains("V format"));
    let mut e = c.clone();
    e.p_format = ProbFormat::Fp8 {
        elem: ElemFormat::E4M3,
    };
    assert!(f(&e).contains("p_format"));
}

/// A row with an attention sink: key 0 scores 12 log2 units above 2047 keys spread around 0
/// (together about half the sink's mass). The u8 code maps every score more than ≈6.9 units
/// under the frozen max to code 0 (the fp32-bits P: ≈9 units), so both drop the whole tail
/// and the output is the sink's value alone: relative error ≈ 0.5. The wide u8 code keeps
/// the tail (≈13.9 units of range), and its error is what an E4M3 P with the Mitchell code
/// allows: each P within ≈6 % (3 mantissa bits plus the linear interpolation).
#[test]
fn the_wide_u8_code_keeps_the_tail_under_a_sink() {
    let (n, d) = (2048usize, 64usize);
    let l2e = std::f32::consts::LOG2_E;
    // scores s_j = q·k_j·scale·log2 e with q = e_0, scale 1: k_j[0] = s_j / log2 e
    let mut q = vec![0f32; d];
    q[0] = 1.0;
    let mut rng = mxattn::synth::Rng::new(5);
    let mut k = vec![0f32; n * d];
    let mut v = vec![0f32; n * d];
    for j in 0..n {
        let s = if j == 0 {
            12.0
        } else {
            0.5 * rng.normal() as f32
        };
        k[j * d] = s / l2e;
        for c in 0..d {
            v[j * d + c] = rng.normal() as f32;
        }
    }
    let dev = Device::Cpu;
    let q = Tensor::from_vec(q, (1, 1, 1, d), &dev).unwrap();
    let k = Tensor::from_vec(k, (1, 1, n, d), &dev).unwrap();
    let v = Tensor::from_vec(v, (1, 1, n, d), &dev).unwrap();
    let mask = OracleMask {
        softmax_scale: Some(1.0),
        ..Default::default()
    };
    let exact = exact_attention_f64(&q, &k, &v, &mask).unwrap();
    let err = |probs| {
        let mut c = fused(ElemFormat::E4M3, OperandFormat::Native, probs, false);
        c.qk_format = OperandFormat::Native;
        c.softmax_scale = Some(1.0);
        let o = attention(&q, &k, &v, &c).unwrap();
        let o: Vec<f32> = o.flatten_all().unwrap().to_vec1().unwrap();
        row_relative_errors(&o, &exact)[0]
    };
    let (u8c, wide, f32b) = (
        err(FusedProbs::U8Code),
        err(FusedProbs::U8CodeWide),
        err(FusedProbs::Fp32Bits),
    );
    println!("sink row: relative error u8 {u8c:.3}, u8-wide {wide:.4}, fp32-bits {f32b:.4}");
    assert!(
        u8c > 0.25 && f32b > 0.25,
        "u8 {u8c} and fp32-bits {f32b} should lose the tail"
    );
    assert!(wide < 0.06, "the wide u8 code keeps it: {wide}");
}
