//! The failure modes other FP8 attention kernels shipped with (`anchors_peers.md`, "Failure
//! modes others hit"), as checks generic over where the op runs: the CPU op (tests/
//! failure_modes.rs, reduced sizes) or one CUDA kernel (tests/gpu.rs, full sizes).
//!
//! Two yardsticks:
//! * **the CPU op on sampled rows** (`reference_rows`): attention rows are independent, so the
//!   CPU op on a Q made of some rows of a head (causal: the suffix of the head's rows from the
//!   first sampled one, which keeps the bottom-right mask) with that head's full K and V gives
//!   exactly those rows' outputs, from the same quantized operands as the full call (Q/K round
//!   per row along d, V per head along the keys or per channel over all keys);
//! * **the float64 oracle and the config's floor** (`floor`: the same operands with exact P)
//!   for the mass checks: the inputs of `structured` make scores and values every MX format
//!   holds exactly, so the floor is the f64 oracle up to f32 arithmetic and V rounding.
#![allow(dead_code)]

use candle_core::{DType, Device, Tensor};
use mxattn::attention::{
    attention_decode, attention_ext, preset, Algorithm, AttentionConfig, CpuPath, FusedProbs,
    FusedSoftmaxConfig, GpuPath, KvOperand, OperandFormat, ProbFormat, RunOptions,
};
use mxattn::mx::{self, ElemFormat, ScaleMode};
use mxattn::oracle::{
    exact_attention_f64, mean_max, rounding_budget, row_relative_differences, row_relative_errors,
    unit_roundoff, OracleMask,
};
use mxattn::synth::Rng;

/// Where a check runs, and the per-row relative difference from the CPU op it is held to:
/// for the CUDA kernels, the bounds `compare` in tests/gpu.rs holds each kernel to (its doc
/// comments say where they come from); the CPU op against itself on sampled rows is bit for
/// bit (rows are independent).
pub struct Target {
    pub dev: Device,
    pub gpu: Option<GpuPath>,
    pub mean_tol: f64,
    pub max_tol: f64,
}

impl Target {
    pub fn cpu() -> Self {
        Self {
            dev: Device::Cpu,
            gpu: None,
            mean_tol: 0.0,
            max_tol: 0.0,
        }
    }

    pub fn gpu(dev: &Device, path: GpuPath) -> Self {
        let (mean_tol, max_tol) = match path {
            GpuPath::Simple => (1e-3, 2e-2),
            GpuPath::Mma => (5e-3, 0.6),
            _ => (2e-2, 0.6),
        };
        Self {
            dev: dev.clone(),
            gpu: Some(path),
            mean_tol,
            max_tol,
        }
    }

    pub fn name(&self) -> String {
        match self.gpu {
            None => "cpu".into(),
            Some(p) => format!("{p:?}"),
        }
    }

    /// Output of the op on this target (the tensors already on its device), f32 on the CPU.
    pub fn run(&self, q: &Tensor, k: &Tensor, v: &Tensor, cfg: &AttentionConfig) -> Tensor {
        let opts = RunOptions {
            cpu_path: CpuPath::Tiled,
            gpu_path: self.gpu.unwrap_or_default(),
            ..Default::default()
        };
        let r = attention_ext(q, k, v, cfg, &opts).unwrap();
        r.out.to_dtype(DType::F32).unwrap()
    }
}

pub fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// The configs the checks cover: every prefill preset models use (exact, BF16, MXFP8/6/4
/// exp-then-quantize, Fused-Softmax fp32-bits P at MXFP8/6/4, the EFQ presets), Fused-Softmax
/// with u8-code P, and exp-then-quantize with FlashAttention-3's E4M3 ×2⁸ P.
pub fn configs() -> Vec<(String, AttentionConfig)> {
    use ElemFormat::*;
    let mut v: Vec<(String, AttentionConfig)> = [
        "exact",
        "bf16",
        "mxfp8",
        "mxfp6",
        "mxfp4",
        "fused-mxfp8",
        "fused-mxfp6",
        "fused-mxfp4",
        "efq-mmlu",
        "efq-mean",
        "efq-exact",
    ]
    .iter()
    .map(|n| (n.to_string(), preset(n).unwrap().config))
    .collect();
    v.push((
        "fused-u8-mxfp8".into(),
        AttentionConfig::fused_softmax(
            E4M3,
            OperandFormat::mx(E4M3),
            FusedSoftmaxConfig {
                probs: FusedProbs::U8Code,
                hadamard: true,
            },
        ),
    ));
    v.push((
        "etq-e4m3x256-p".into(),
        AttentionConfig::exp_then_quantize(
            OperandFormat::mx(E4M3),
            OperandFormat::fp8_per_channel(),
            ProbFormat::Fp8 { elem: E4M3 },
        ),
    ));
    v
}

/// The config's floor: the same operands, exact P (Fused-Softmax: `ExactF32`, which keeps
/// the rotation and the folded scale; the others: the exact algorithm).
pub fn floor(cfg: &AttentionConfig) -> AttentionConfig {
    let mut f = cfg.clone();
    match &mut f.algorithm {
        Algorithm::FusedSoftmax(fs) => fs.probs = FusedProbs::ExactF32,
        a => *a = Algorithm::Exact,
    }
    f.p_format = ProbFormat::F32;
    f
}

/// How far below the row max (log2 units) the config's P keeps a key at all, by design:
/// f32/bf16 P and 32-key block-scaled P (MX, EFQ: each block has its own scale) keep every
/// key; E4M3 ×2⁸ keeps P·2⁸ above half of E4M3's smallest subnormal 2⁻⁹ (P > 2⁻¹⁸; E5M2:
/// 2⁻²⁵); Fused-Softmax's u8 codes reach ≈6.9 units under the frozen max and its fp32-bits
/// and exact-E4M3 P ≈9 (the E4M3 subnormals; README, "Accuracy, measured").
pub fn p_reach_log2(cfg: &AttentionConfig) -> f64 {
    match (&cfg.algorithm, cfg.p_format) {
        (Algorithm::FusedSoftmax(f), _) => match f.probs {
            FusedProbs::U8Code => 6.9,
            FusedProbs::U8CodeWide => 13.9,
            FusedProbs::Fp32Bits | FusedProbs::ExactE4M3 => 9.0,
            FusedProbs::ExactF32 => f64::INFINITY,
        },
        (_, ProbFormat::Fp8 { elem }) => match elem {
            ElemFormat::E5M2 => 25.0,
            _ => 18.0,
        },
        _ => f64::INFINITY,
    }
}

/// Unit roundoff of the config's P (0 for f32 P; bf16 P on the tensor-core paths is within
/// the kernels' bounds). Fused-Softmax: E4M3 plus its piecewise-linear 2^x (oracle.rs).
pub fn p_roundoff(cfg: &AttentionConfig) -> f64 {
    match (&cfg.algorithm, cfg.p_format) {
        (Algorithm::FusedSoftmax(_), _) => unit_roundoff(ElemFormat::E4M3) + 0.0615,
        (Algorithm::Efq(_), _) => unit_roundoff(ElemFormat::E2M1),
        (_, ProbFormat::F32) => 0.0,
        (_, ProbFormat::Mx { elem, .. } | ProbFormat::Fp8 { elem }) => unit_roundoff(elem),
    }
}

/// Q, K, V on the CPU (f32 values every format holds).
pub struct Qkv {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
}

impl Qkv {
    pub fn to(&self, dev: &Device, dtype: DType) -> Qkv {
        let m = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(dev).unwrap();
        Qkv {
            q: m(&self.q),
            k: m(&self.k),
            v: m(&self.v),
        }
    }
}

/// Values of the form 1 or 1.5 × 2^e and 0: alone in their 32-channel block (Q/K) they are
/// exact in every element format; as V (32-key blocks, or per channel) E2M1 holds every
/// block of them whose max is at most 6 of its scale.
const GRID: [f32; 9] = [0.0, 0.25, 0.375, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0];

/// Attention inputs with one distinguished key 0 and controlled scores, for softmax scale
/// 1 and d = 128: every query is 1 in channels 0, 32, 64 and 96 (one per MX block) and 0
/// elsewhere, so key j's score is the sum of its four values in those channels, each alone
/// in its block and exact in every format (`GRID`; Fused-Softmax's Hadamard rotation and
/// folded scale aside). `key_score(rng, j)` gives key j's four values. V: channel 0 is 1
/// for every key (the output's channel 0 is the normalized mass: 1 for every normalizing
/// path); channel 1 is 0 for key 0 and 1 for the others (the output's channel 1 is the
/// share of the row's mass off key 0); the other channels are random `GRID` values, key 0's
/// all 3.
pub fn structured(
    (b, hq, hkv, sq, sk): (usize, usize, usize, usize, usize),
    seed: u64,
    key_score: impl Fn(&mut Rng, usize) -> [f32; 4],
) -> Qkv {
    let d = 128;
    let mut rng = Rng::new(seed);
    let mut q = vec![0f32; b * hq * sq * d];
    for row in q.chunks_mut(d) {
        for c in [0, 32, 64, 96] {
            row[c] = 1.0;
        }
    }
    let mut k = vec![0f32; b * hkv * sk * d];
    let mut v = vec![0f32; b * hkv * sk * d];
    for (r, (kr, vr)) in k.chunks_mut(d).zip(v.chunks_mut(d)).enumerate() {
        let j = r % sk;
        for (c, x) in [0, 32, 64, 96].into_iter().zip(key_score(&mut rng, j)) {
            kr[c] = x;
        }
        vr[0] = 1.0;
        vr[1] = if j == 0 { 0.0 } else { 1.0 };
        for x in vr[2..].iter_mut() {
            *x = if j == 0 {
                3.0
            } else {
                let g = GRID[(rng.next_u64() % GRID.len() as u64) as usize];
                if rng.next_u64() & 1 == 0 {
                    g
                } else {
                    -g
                }
            };
        }
    }
    let t = |x, h, s| Tensor::from_vec(x, (b, h, s, d), &Device::Cpu).unwrap();
    Qkv {
        q: t(q, hq, sq),
        k: t(k, hkv, sk),
        v: t(v, hkv, sk),
    }
}

/// Key 0 the row max, the other keys 12 to 16 binades below it (scores −ln 2 × [12, 16],
/// built greedily from `GRID` values within 0.05): an unscaled E4M3 P (smallest subnormal
/// 2⁻⁹) flushes every one of them. With `n` keys the tail holds ≈ n·2⁻¹³·⁴ of key 0's mass:
/// a third of the row at n ≈ 5000.
pub fn flush_scores(rng: &mut Rng, j: usize) -> [f32; 4] {
    if j == 0 {
        return [0.0; 4];
    }
    let target = -(12.0 + 4.0 * rng.uniform()) * std::f64::consts::LN_2;
    let mut out = [0f32; 4];
    out[0] = if target < -9.5 { -8.0 } else { -6.0 };
    let mut rest = target - out[0] as f64;
    for x in out[1..].iter_mut() {
        let g = GRID
            .iter()
            .copied()
            .filter(|g| (*g as f64) <= rest.abs() + 0.05)
            .fold(0f32, f32::max);
        *x = g * rest.signum() as f32;
        rest -= *x as f64;
    }
    out
}

/// An attention sink: key 0 scores `gap` (nats, from `GRID` values) above a tail of
/// keys spread around 0 (four `GRID` values of random sign: score std ≈ 1.6, within ±6).
/// A real sink holds most of a row and leaves a long tail: with 4096 tail keys a gap of 10.5
/// leaves the tail ≈ 30 % of the mass (a gap of 20 would leave it 10⁻⁴, which no output
/// check can see).
pub fn sink_scores(gap: [f32; 4]) -> impl Fn(&mut Rng, usize) -> [f32; 4] {
    move |rng, j| {
        if j == 0 {
            return gap;
        }
        let mut out = [0f32; 4];
        for x in out.iter_mut() {
            let g = GRID[(rng.next_u64() % 7) as usize];
            *x = if rng.next_u64() & 1 == 0 { g } else { -g };
        }
        out
    }
}

/// The deepest key of the inputs below key 0, in log2 units (softmax scale 1).
pub fn deepest_below_key0_log2(inp: &Qkv) -> f64 {
    let k = f32s(&inp.k);
    let rows: Vec<f64> = k
        .chunks(128)
        .map(|r| (r[0] + r[32] + r[64] + r[96]) as f64)
        .collect();
    let sk = inp.k.dims()[2];
    rows.chunks(sk)
        .map(|h| h[1..].iter().map(|s| h[0] - s).fold(0f64, f64::max))
        .fold(0f64, f64::max)
        / std::f64::consts::LN_2
}

fn mass_of(o: &[f32], d: usize, ch: usize) -> Vec<f64> {
    o.chunks(d).map(|r| r[ch] as f64).collect()
}

/// The mass checks of every config on `target` over `inp` (see `structured`), each row:
/// 1. the target's output within its bound of the CPU op's;
/// 2. channel 0 (the normalized mass) is 1: every algorithm divides by the sum of the same
///    P that enters P·V (within one step of the output dtype);
/// 3. channel 1, the share of the mass off key 0, against the floor's: within twice the P
///    format's unit roundoff (the tail sum and the row sum each round), plus, for E4M3 ×2⁸,
///    half a subnormal step per tail key (2⁻¹⁸ of key 0's P each) — where the P format
///    reaches the deepest tail key (`p_reach_log2`). Where it does not by design (Fused-
///    Softmax: its codes end ≈6.9 / 9 log2 units under the frozen max), the share may only
///    drop: it must not exceed the floor's;
/// 4. the floor against the float64 oracle within the config's rounding budget (scores
///    here are exact, so only V rounds; not for Fused-Softmax, whose rotated operands round).
///
/// Returns the failures (empty: all held) after printing one line per config.
pub fn mass_checks(
    target: &Target,
    inp: &Qkv,
    causal: bool,
    dtype: DType,
    what: &str,
) -> Vec<String> {
    let d = 128;
    let deepest = deepest_below_key0_log2(inp);
    let on = inp.to(&target.dev, dtype);
    let mask = OracleMask {
        causal,
        key_lengths: None,
        softmax_scale: Some(1.0),
    };
    let oracle = exact_attention_f64(&inp.q, &inp.k, &inp.v, &mask).unwrap();
    let tail_oracle = mass_of(
        &oracle.o.iter().map(|x| *x as f32).collect::<Vec<_>>(),
        d,
        1,
    );
    let sk = inp.k.dims()[2];
    let step = if dtype == DType::F32 {
        f32_sum_bound(sk)
    } else {
        2f64.powi(-8)
    };
    let mut failures = vec![];
    for (name, cfg) in configs() {
        let cfg = cfg.with_causal(causal).with_softmax_scale(1.0);
        let o = f32s(&target.run(&on.q, &on.k, &on.v, &cfg));
        let cpu = Target::cpu();
        let c = f32s(&cpu.run(&inp.q, &inp.k, &inp.v, &cfg));
        let f = f32s(&cpu.run(&inp.q, &inp.k, &inp.v, &floor(&cfg)));
        let tag = format!("{what} {} {name} causal={causal}", target.name());
        // 1. the target against the CPU op
        let (mean, max) = mean_max(&row_relative_differences(&o, &c, d));
        let out_step = if dtype == DType::F32 { 0.0 } else { step };
        if mean > target.mean_tol + out_step || max > target.max_tol + out_step {
            failures.push(format!(
                "{tag}: rows vs the CPU op mean {mean:.2e} max {max:.2e}"
            ));
        }
        // 2. normalization
        let norm = mass_of(&o, d, 0)
            .iter()
            .fold(0f64, |m, x| m.max((x - 1.0).abs()));
        if norm > step {
            failures.push(format!(
                "{tag}: channel 0 (normalized mass) off 1 by {norm:.2e}"
            ));
        }
        // 3. the share off key 0 against the floor's
        let (t, tf) = (mass_of(&o, d, 1), mass_of(&f, d, 1));
        let u = p_roundoff(&cfg);
        let reach = p_reach_log2(&cfg);
        let mut worst = 0f64;
        for (a, b) in t.iter().zip(&tf) {
            let sub = match cfg.p_format {
                ProbFormat::Fp8 { .. } if !matches!(cfg.algorithm, Algorithm::FusedSoftmax(_)) => {
                    // tail mass relative to key 0's P of 1: b / (1 − b)
                    (sk as f64) * 2f64.powi(-18) * (1.0 - b) / b.max(1e-30)
                }
                _ => 0.0,
            };
            let tol = 2.0 * u + sub + step;
            let rel = a / b - 1.0;
            worst = if rel.abs() > worst.abs() { rel } else { worst };
            let bad = if reach >= deepest {
                rel.abs() > tol
            } else {
                rel > tol
            };
            if bad {
                failures.push(format!(
                    "{tag}: tail share {a:.4} vs floor {b:.4} (rel {rel:+.3}, bound {tol:.3}, P reaches {reach} of {deepest:.1} log2 units)"
                ));
                break;
            }
        }
        // 4. the floor against the oracle
        let mut floor_err = 0.0;
        if !matches!(cfg.algorithm, Algorithm::FusedSoftmax(_)) {
            let budget = rounding_budget(&floor(&cfg)) + f32_sum_bound(sk);
            floor_err = mean_max(&row_relative_errors(&f, &oracle)).1;
            let tail_err = tf
                .iter()
                .zip(&tail_oracle)
                .map(|(a, b)| (a / b - 1.0).abs())
                .fold(0f64, f64::max);
            if floor_err > budget || tail_err > budget {
                failures.push(format!(
                    "{tag}: floor vs f64 oracle rows {floor_err:.2e}, tail share {tail_err:.2e} (budget {budget:.2e})"
                ));
            }
        }
        println!(
            "{tag}: vs CPU op mean {mean:.1e} max {max:.1e}; mass-1 {norm:.1e}; tail share {:.4} (floor {:.4}, oracle {:.4}, worst rel {worst:+.3}); floor vs oracle {floor_err:.1e}",
            t[t.len() - 1],
            tf[tf.len() - 1],
            tail_oracle[tail_oracle.len() - 1]
        );
    }
    failures
}

/// The rows `(b, h, i)` of `q` `[b, hq, sq, d]` the CPU op gives for `cfg` with the full
/// `k`, `v` of head h's KV head: per sampled head, one call on the head's sampled rows
/// (causal: the suffix of its rows from the first sampled one, so the bottom-right mask
/// sees the same keys). Runs where the tensors are (they are narrowed, then copied to the
/// CPU in f32: the op's arithmetic is f32 from any input dtype), returns rows of d in
/// `rows` order.
pub fn reference_rows(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cfg: &AttentionConfig,
    rows: &[(usize, usize, usize)],
) -> Vec<f32> {
    let (_, hq, sq, d) = q.dims4().unwrap();
    let hkv = k.dims()[1];
    let cpu = |t: Tensor| {
        t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    let mut heads: Vec<(usize, usize)> = rows.iter().map(|r| (r.0, r.1)).collect();
    heads.sort();
    heads.dedup();
    let mut out = vec![0f32; rows.len() * d];
    for (b, h) in heads {
        let mine: Vec<usize> = (0..rows.len())
            .filter(|&r| (rows[r].0, rows[r].1) == (b, h))
            .collect();
        let kvh = h / (hq / hkv);
        let head = |t: &Tensor, h| cpu(t.narrow(0, b, 1).unwrap().narrow(1, h, 1).unwrap());
        let (kh, vh) = (head(k, kvh), head(v, kvh));
        let qh = q.narrow(0, b, 1).unwrap().narrow(1, h, 1).unwrap();
        let first = mine.iter().map(|&r| rows[r].2).min().unwrap();
        let (qs, at): (Tensor, Vec<usize>) = if cfg.causal {
            let qs = cpu(qh.narrow(2, first, sq - first).unwrap());
            (qs, mine.iter().map(|&r| rows[r].2 - first).collect())
        } else {
            let idx: Vec<u32> = mine.iter().map(|&r| rows[r].2 as u32).collect();
            let idx = Tensor::new(idx.as_slice(), q.device()).unwrap();
            (
                cpu(qh.index_select(&idx, 2).unwrap()),
                (0..mine.len()).collect(),
            )
        };
        let o = f32s(&Target::cpu().run(&qs, &kh, &vh, cfg));
        for (&r, &a) in mine.iter().zip(&at) {
            out[r * d..(r + 1) * d].copy_from_slice(&o[a * d..(a + 1) * d]);
        }
    }
    out
}

/// Rows `(b, h, i)` of an output `[b, hq, sq, d]` on any device, in order.
pub fn gather_rows(o: &Tensor, rows: &[(usize, usize, usize)]) -> Vec<f32> {
    rows.iter()
        .flat_map(|&(b, h, i)| {
            f32s(
                &o.narrow(0, b, 1)
                    .unwrap()
                    .narrow(1, h, 1)
                    .unwrap()
                    .narrow(2, i, 1)
                    .unwrap(),
            )
        })
        .collect()
}

/// Rows to sample from `[b, hq, sq, ·]`: the first and last rows of a head and those around
/// the 64-row query tiles and the 128-row wgmma tiles, in every listed head.
pub fn sample_rows(heads: &[(usize, usize)], sq: usize) -> Vec<(usize, usize, usize)> {
    let mut at = vec![0, 1, 63, 64, 65, 127, 128, sq / 2, sq - 2, sq - 1];
    at.retain(|&i| i < sq);
    at.sort();
    at.dedup();
    heads
        .iter()
        .flat_map(|&(b, h)| at.iter().map(move |&i| (b, h, i)))
        .collect()
}

/// Bound on the relative error of an f32 softmax row over `n` keys against float64: the
/// row sum and the P·V sums each accumulate n terms in f32 (recursive summation: at most
/// (n − 1)·2⁻²⁴ each, first order; far less in practice).
pub fn f32_sum_bound(n: usize) -> f64 {
    1e-6 + 2.0 * n as f64 * 2f64.powi(-24)
}

/// Every config on each target over q, k, v (on the targets' device) against the CPU op on
/// `rows` (`reference_rows`, computed once per config): per row within the target's bound
/// (plus one bf16 step where the output is bf16), finite, and channel 0 of V (set to 1 by
/// the callers) giving a normalized mass of 1. For the exact configs also the float64
/// oracle on the same rows: the CPU op within `f32_sum_bound`, the target within bf16's
/// rounding budget (3·2⁻⁸: the tensor-core kernels round Q, K, V and P to bf16). Returns
/// the failures.
pub fn sampled_checks(
    targets: &[Target],
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    causal: bool,
    rows: &[(usize, usize, usize)],
    what: &str,
    only: Option<&[&str]>,
) -> Vec<String> {
    let d = q.dims()[3];
    let sk = k.dims()[2];
    let bf16_out = q.dtype() != DType::F32;
    let out_step = if bf16_out { 2f64.powi(-8) } else { 0.0 };
    let mut failures = vec![];
    for (name, cfg) in configs() {
        if only.is_some_and(|o| !o.contains(&name.as_str())) {
            continue;
        }
        let cfg = cfg.with_causal(causal);
        let t0 = std::time::Instant::now();
        let r = reference_rows(q, k, v, &cfg, rows);
        let t_ref = t0.elapsed().as_secs_f64();
        for target in targets {
            let t0 = std::time::Instant::now();
            let full = target.run(q, k, v, &cfg);
            let g = gather_rows(&full, rows);
            drop(full);
            let t_run = t0.elapsed().as_secs_f64();
            let tag = format!("{what} {} {name} causal={causal}", target.name());
            let (mean, max) = mean_max(&row_relative_differences(&g, &r, d));
            if !g.iter().all(|x| x.is_finite()) {
                failures.push(format!("{tag}: non-finite output"));
            }
            if mean > target.mean_tol + out_step || max > target.max_tol + out_step {
                failures.push(format!(
                    "{tag}: sampled rows vs the CPU op mean {mean:.2e} max {max:.2e}"
                ));
            }
            let norm = g
                .chunks(d)
                .fold(0f64, |m, r| m.max((r[0] as f64 - 1.0).abs()));
            if norm > out_step.max(f32_sum_bound(sk)) {
                failures.push(format!(
                    "{tag}: channel 0 (normalized mass) off 1 by {norm:.2e}"
                ));
            }
            let mut oracle_note = String::new();
            if matches!(cfg.algorithm, Algorithm::Exact) {
                let (ecpu, egpu) = oracle_rows(q, k, v, &cfg, rows, &r, &g);
                let (bc, bt) = (
                    f32_sum_bound(sk),
                    f32_sum_bound(sk) + 3.0 * 2f64.powi(-8) + out_step,
                );
                if ecpu > bc || egpu > bt {
                    failures.push(format!(
                        "{tag}: vs f64 oracle: CPU op {ecpu:.2e} (bound {bc:.1e}), target {egpu:.2e} (bound {bt:.2e})"
                    ));
                }
                oracle_note = format!("; f64 oracle: cpu {ecpu:.1e} target {egpu:.1e}");
            }
            println!(
                "{tag}: {} rows vs CPU op mean {mean:.1e} max {max:.1e}; mass-1 {norm:.1e}{oracle_note} (run {t_run:.2}s, ref {t_ref:.2}s)",
                rows.len()
            );
        }
    }
    failures
}

/// Worst row error of the CPU op's and the target's rows against the float64 oracle on the
/// same rows (each row's query alone, the keys its mask shows).
fn oracle_rows(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cfg: &AttentionConfig,
    rows: &[(usize, usize, usize)],
    cpu_rows: &[f32],
    target_rows: &[f32],
) -> (f64, f64) {
    let (_, hq, sq, d) = q.dims4().unwrap();
    let (hkv, sk) = (k.dims()[1], k.dims()[2]);
    let (mut ec, mut et) = (0f64, 0f64);
    for (n, &(b, h, i)) in rows.iter().enumerate() {
        let kvh = h / (hq / hkv);
        let vis = if cfg.causal { i + sk + 1 - sq } else { sk };
        let cut = |t: &Tensor, h, s0, len| {
            t.narrow(0, b, 1)
                .unwrap()
                .narrow(1, h, 1)
                .unwrap()
                .narrow(2, s0, len)
                .unwrap()
                .to_device(&Device::Cpu)
                .unwrap()
        };
        let o = exact_attention_f64(
            &cut(q, h, i, 1),
            &cut(k, kvh, 0, vis),
            &cut(v, kvh, 0, vis),
            &OracleMask {
                softmax_scale: cfg.softmax_scale.map(|s| s as f64),
                ..Default::default()
            },
        )
        .unwrap();
        let e = |x: &[f32]| row_relative_errors(&x[n * d..(n + 1) * d], &o)[0];
        ec = ec.max(e(cpu_rows));
        et = et.max(e(target_rows));
    }
    (ec, et)
}

/// Random inputs `[b, h, s, 128]` for the long-context checks: Q, K ~ N(0, 1) (scores of
/// std 1 at the default scale, so P spreads over every key), V ~ N(μ_c, 0.5²) with a
/// channel mean μ_c in [−1, 1] (a P·V sum that loses terms drifts visibly) and channel 0
/// all 1 (the normalized mass). Bf16-exact values, made on the CPU.
pub fn random_long(b: usize, h: usize, sq: usize, sk: usize, seed: u64) -> Qkv {
    let d = 128;
    let mut rng = Rng::new(seed);
    let bf = |x: f64| half::bf16::from_f64(x).to_f32();
    let q: Vec<f32> = (0..b * h * sq * d).map(|_| bf(rng.normal())).collect();
    let k: Vec<f32> = (0..b * h * sk * d).map(|_| bf(rng.normal())).collect();
    let mu: Vec<f64> = (0..d).map(|_| 2.0 * rng.uniform() - 1.0).collect();
    let v: Vec<f32> = (0..b * h * sk * d)
        .map(|i| {
            let c = i % d;
            if c == 0 {
                1.0
            } else {
                bf(mu[c] + 0.5 * rng.normal())
            }
        })
        .collect();
    let t = |x, s| Tensor::from_vec(x, (b, h, s, d), &Device::Cpu).unwrap();
    Qkv {
        q: t(q, sq),
        k: t(k, sk),
        v: t(v, sk),
    }
}

/// The decode kernel's storages: a bf16 cache, and MXFP8 / MXFP4 caches (K along d, V along
/// the keys over its whole 32-key blocks, the rest a dense tail), as `attention_decode`
/// takes them; q, k, v f32 on the device that runs it (CUDA: the split-KV decode kernel).
pub fn decode_checks(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: Option<f32>,
    what: &str,
    tail_share: bool,
) -> Vec<String> {
    let (b, hq, sq, d) = q.dims4().unwrap();
    let n = k.dims()[2];
    let n_full = n / 32 * 32;
    let mut failures = vec![];
    let kb = k.to_dtype(DType::BF16).unwrap();
    let vb = v.to_dtype(DType::BF16).unwrap();
    let v_tail = v.narrow(2, n_full, n - n_full).unwrap();
    for (sname, elem) in [
        ("bf16", None),
        ("MXFP8", Some(ElemFormat::E4M3)),
        ("MXFP4", Some(ElemFormat::E2M1)),
    ] {
        let (kv, vv) = match elem {
            None => (KvOperand::Dense(&kb), KvOperand::Dense(&vb)),
            Some(e) => (
                KvOperand::Mx {
                    full: Some(mx::quantize(k, e, ScaleMode::Floor, 3, 32).unwrap()),
                    tail: None,
                },
                KvOperand::Mx {
                    full: Some(
                        mx::quantize(&v.narrow(2, 0, n_full).unwrap(), e, ScaleMode::Floor, 2, 32)
                            .unwrap(),
                    ),
                    tail: Some(&v_tail),
                },
            ),
        };
        let mut cfg = AttentionConfig::exact().with_causal(true);
        cfg.softmax_scale = softmax_scale;
        let qd = q.to_dtype(DType::F32).unwrap();
        let t0 = std::time::Instant::now();
        let o = f32s(&attention_decode(&qd, &kv, &vv, &cfg).unwrap());
        let t_run = t0.elapsed().as_secs_f64();
        // the reference: the CPU op on the represented (dequantized) cache, per head
        let (kd, vd) = (
            kv.to_tensor(DType::F32).unwrap(),
            vv.to_tensor(DType::F32).unwrap(),
        );
        let rows: Vec<(usize, usize, usize)> = (0..b)
            .flat_map(|bb| (0..hq).flat_map(move |h| (0..sq).map(move |i| (bb, h, i))))
            .collect();
        let r = reference_rows(&qd, &kd, &vd, &cfg, &rows);
        let (ec, _) = oracle_rows(&qd, &kd, &vd, &cfg, &rows, &r, &o);
        let (_, max) = mean_max(&row_relative_differences(&o, &r, d));
        let tag = format!("{what} decode {sname} cache ({n} keys)");
        // the decode kernel: same arithmetic up to summation order and exp2 vs exp
        // (decode_kernel_matches_the_dequantized_reference: 1e-4 per row at 300 keys), plus
        // the two f32 summation orders over n keys drifting apart as √n·2⁻²⁴ (8σ)
        let bound = 1e-4 + 8.0 * (n as f64).sqrt() * 2f64.powi(-24);
        if max > bound || ec > f32_sum_bound(n) || !o.iter().all(|x| x.is_finite()) {
            failures.push(format!(
                "{tag}: rows vs the CPU op {max:.2e} (bound {bound:.1e}), CPU op vs f64 oracle {ec:.2e}"
            ));
        }
        let norm = o
            .chunks(d)
            .fold(0f64, |m, r| m.max((r[0] as f64 - 1.0).abs()));
        if norm > f32_sum_bound(n) {
            failures.push(format!(
                "{tag}: channel 0 (normalized mass) off 1 by {norm:.2e}"
            ));
        }
        let mut note = String::new();
        if tail_share {
            // exact softmax: the share off key 0 is the reference's within f32 rounding
            let worst = o
                .chunks(d)
                .zip(r.chunks(d))
                .map(|(a, b)| (a[1] as f64 / b[1] as f64 - 1.0).abs())
                .fold(0f64, f64::max);
            if worst > 1e-4 {
                failures.push(format!(
                    "{tag}: tail share off the reference's by {worst:.2e}"
                ));
            }
            note = format!("; tail share {:.4} (rel diff {worst:.1e})", o[1]);
        }
        println!(
            "{tag}: rows vs CPU op {max:.1e}, CPU vs f64 {ec:.1e}; mass-1 {norm:.1e}{note} ({t_run:.2}s)"
        );
    }
    failures
}
