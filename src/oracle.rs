//! Float64 exact attention, the yardstick of every accuracy claim, and error metrics.
//!
//! Written independently of the crate's kernels: two-pass softmax per row in f64 over
//! the given f32 values, the same mask semantics as [`crate::attention`].

use candle_core::{bail, DType, Result, Tensor};
use rayon::prelude::*;

/// Masks and scale of an oracle run.
#[derive(Clone, Debug, Default)]
pub struct OracleMask {
    pub causal: bool,
    pub key_lengths: Option<Vec<usize>>,
    /// `None`: 1/√d.
    pub softmax_scale: Option<f64>,
}

/// O `[rows·d]` and natural-log LSE `[rows]` in f64 (fully masked rows: 0 and −inf).
pub struct OracleOutput {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    pub d: usize,
}

fn f32s(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

/// Exact softmax attention in f64 of q `[b, hq, sq, d]`, k/v `[b, hkv, sk, d]`.
pub fn exact_attention_f64(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &OracleMask,
) -> Result<OracleOutput> {
    let (b, hq, sq, d) = q.dims4()?;
    let (_, hkv, sk, _) = k.dims4()?;
    if hkv == 0 || !hq.is_multiple_of(hkv) {
        bail!("oracle: hq {hq} not a multiple of hkv {hkv}");
    }
    let (qv, kv, vv) = (f32s(q)?, f32s(k)?, f32s(v)?);
    let scale = mask.softmax_scale.unwrap_or(1.0 / (d as f64).sqrt());
    let rows = b * hq * sq;
    let mut o = vec![0f64; rows * d];
    let mut lse = vec![0f64; rows];
    o.par_chunks_mut(d.max(1))
        .zip(lse.par_iter_mut())
        .enumerate()
        .for_each(|(r, (orow, l))| {
            let i = r % sq;
            let h = (r / sq) % hq;
            let bb = r / (sq * hq);
            let kvh = h / (hq / hkv);
            let len = mask.key_lengths.as_ref().map_or(sk, |v| v[bb]);
            let n = if mask.causal {
                (i as i64 + len as i64 - sq as i64 + 1).clamp(0, len as i64) as usize
            } else {
                len
            };
            if n == 0 {
                *l = f64::NEG_INFINITY;
                return;
            }
            let qi = &qv[r * d..(r + 1) * d];
            let base = (bb * hkv + kvh) * sk * d;
            let s: Vec<f64> = (0..n)
                .map(|j| {
                    let kj = &kv[base + j * d..base + (j + 1) * d];
                    qi.iter()
                        .zip(kj)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0f64;
            for (j, sj) in s.iter().enumerate() {
                let p = (sj - m).exp();
                sum += p;
                let vj = &vv[base + j * d..base + (j + 1) * d];
                for (oc, vc) in orow.iter_mut().zip(vj) {
                    *oc += p * *vc as f64;
                }
            }
            for oc in orow.iter_mut() {
                *oc /= sum;
            }
            *l = m + sum.ln();
        });
    Ok(OracleOutput { o, lse, d })
}

/// Per-row relative errors ‖o − ref‖ / ‖ref‖ (rows with ‖ref‖ = 0 are skipped).
pub fn row_relative_errors(o: &[f32], reference: &OracleOutput) -> Vec<f64> {
    let d = reference.d;
    o.chunks(d)
        .zip(reference.o.chunks(d))
        .filter_map(|(a, r)| {
            let nr = r.iter().map(|x| x * x).sum::<f64>().sqrt();
            if nr == 0.0 {
                return None;
            }
            let ne = a
                .iter()
                .zip(r)
                .map(|(x, y)| (*x as f64 - y).powi(2))
                .sum::<f64>()
                .sqrt();
            Some(ne / nr)
        })
        .collect()
}

/// Per-row relative differences ‖a − b‖ / ‖b‖ of two f32 outputs with rows of `d`
/// (rows with ‖b‖ = 0 are skipped): e.g. the error an algorithm adds to its floor.
pub fn row_relative_differences(a: &[f32], b: &[f32], d: usize) -> Vec<f64> {
    let r = OracleOutput {
        o: b.iter().map(|x| *x as f64).collect(),
        lse: vec![],
        d,
    };
    row_relative_errors(a, &r)
}

/// (mean, max) of a slice; (0, 0) when empty.
pub fn mean_max(e: &[f64]) -> (f64, f64) {
    if e.is_empty() {
        return (0.0, 0.0);
    }
    (
        e.iter().sum::<f64>() / e.len() as f64,
        e.iter().copied().fold(0.0, f64::max),
    )
}

/// The largest |a − b| over all elements, both taken to f32 (any dtype, any device); the
/// shapes must match.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    if a.dims() != b.dims() {
        bail!(
            "max_abs_diff: shapes {:?} and {:?} differ",
            a.dims(),
            b.dims()
        );
    }
    (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()
}

/// The unit roundoff of an element format: half an ulp relative to the value, 2^−(m+1) for m
/// mantissa bits.
pub fn unit_roundoff(e: crate::mx::ElemFormat) -> f64 {
    2f64.powi(-(e.mbits() as i32 + 1))
}

/// The relative rounding an attention config allows, summed over what it rounds: Q and K
/// (twice the Q/K format's unit roundoff: a score is a product of both), V and P. An MX
/// block may also clip its largest element under the OCP floor scale (up to 25 % for E2M1,
/// within E2M1's own 2^−2). Fused-Softmax's P is an E4M3 code of a piecewise-linear 2^x
/// (relative error up to 6.2 %, the maximum of (1 + f)/2^f − 1, on top of E4M3's rounding);
/// EFQ's P an E2M1 code. A first-order bound of the relative change of the attention output:
/// tests bound a model's relative output change by it.
pub fn rounding_budget(cfg: &crate::attention::AttentionConfig) -> f64 {
    use crate::attention::{Algorithm, OperandFormat, ProbFormat};
    use crate::mx::ElemFormat;
    let bf16 = 2f64.powi(-8);
    let op = |f: OperandFormat| match f {
        OperandFormat::Native => 0.0,
        OperandFormat::Bf16 => bf16,
        OperandFormat::Mx { elem, .. } | OperandFormat::PerChannel { elem } => unit_roundoff(elem),
    };
    let p = match (&cfg.algorithm, cfg.p_format) {
        (Algorithm::FusedSoftmax(_), _) => unit_roundoff(ElemFormat::E4M3) + 0.0615,
        (Algorithm::Efq(_), _) => unit_roundoff(ElemFormat::E2M1),
        (_, ProbFormat::F32) => 0.0,
        (_, ProbFormat::Mx { elem, .. } | ProbFormat::Fp8 { elem }) => unit_roundoff(elem),
    };
    2.0 * op(cfg.qk_format) + op(cfg.v_format) + p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{AttentionConfig, OperandFormat, ProbFormat};
    use crate::mx::ElemFormat::*;

    #[test]
    fn rounding_budgets_follow_the_formats() {
        assert_eq!(unit_roundoff(E4M3), 1.0 / 16.0);
        assert_eq!(unit_roundoff(E3M2), 1.0 / 8.0);
        assert_eq!(unit_roundoff(E2M1), 1.0 / 4.0);
        assert_eq!(rounding_budget(&AttentionConfig::exact()), 0.0);
        let bf16 = AttentionConfig::exact().with_formats(
            OperandFormat::Bf16,
            OperandFormat::Bf16,
            ProbFormat::F32,
        );
        assert_eq!(rounding_budget(&bf16), 3.0 / 256.0);
        let mx4 = AttentionConfig::exp_then_quantize(
            OperandFormat::mx(E2M1),
            OperandFormat::mx(E2M1),
            ProbFormat::mx(E2M1),
        );
        assert_eq!(rounding_budget(&mx4), 1.0);
        let fp8_p = AttentionConfig::exp_then_quantize(
            OperandFormat::mx(E4M3),
            OperandFormat::fp8_per_channel(),
            ProbFormat::Fp8 { elem: E4M3 },
        );
        assert_eq!(rounding_budget(&fp8_p), 4.0 / 16.0);
    }
}
