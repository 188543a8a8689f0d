//! EFQ-Softmax (arXiv 2609.09721): shifted scores mapped straight to block-scaled E2M1
//! probability codes, with no exponential (efq_softmax_and_mx_formats.md §A).
//!
//! FlashAttention is otherwise unchanged: running row max, `α = e^(m_old − m_new)`,
//! f32 accumulation, masks applied before the shift. Per block of `block` keys of a
//! row's KV tile, from the shifted scores `x = s − m ≤ 0` (natural log):
//!
//! * scale exponent k: EFQ's own `⌊(M_b + ln(2/9)) / ln 2⌋` (Eq. 8), or the OCP floor
//!   `⌊M_b·log2 e⌋ − 2`, or RCEIL `⌈M_b·log2 e − log2 6⌉`, M_b the block max;
//! * a code rule (below) gives `c ∈ 0..=7`, the E2M1 bit pattern;
//! * `P = C8[c]·2^k` with `C8 = {0, .5, 1, 1.5, 2, 3, 4, 6}` feeds both `P·V` and `Σ P`.
//!
//! Rules: the published affine rule `c = clip(⌊(z − τ)·h⌋ + 1, 0, 7)` with
//! `z = x − k·ln 2 − ln 6` (Eqs. 10, 11; presets MMLU, Mean, Balance); the LUT ablation;
//! and two variants of ours: `ExactThresholds` (compares x with the exact log-domain
//! boundaries of exp → MXFP4, bit-identical to it) and `TwoPiece` (one affine step and
//! two compares, within ≈1 % of exact).

use super::log_thresholds::{exp_mxfp4_thresholds, E_MAX, E_MIN};
use super::{update_running_max, RunningMax, SoftmaxAlgo};
use crate::attention::config::{EfqConfig, EfqRule, EfqScale};
use crate::mx::scale::{E8M0_MAX_EXP, E8M0_MIN_EXP};
use std::f32::consts::{LN_2, LOG2_E};

/// E2M1 values of the codes 0..=7.
pub const C8: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
/// EFQ-LUT: 16-level index to E2M1 code.
pub const C16: [u8; 16] = [0, 1, 1, 1, 1, 1, 2, 2, 3, 3, 4, 5, 5, 6, 7, 7];

/// Codes and scale exponent of one block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EfqBlock {
    /// Scale exponent: P = C8[code]·2^k.
    pub k: i32,
    pub codes: Vec<u8>,
}

fn pow2(k: i32) -> f32 {
    crate::mx::element::pow2_f64(k) as f32
}

/// EFQ codes of one block of shifted scores `x ≤ 0` (natural log; −inf where masked).
/// A fully masked block gives k = −127 and all codes 0.
pub fn efq_block(x: &[f32], cfg: &EfqConfig) -> EfqBlock {
    let mut codes = vec![0u8; x.len()];
    let k = block_codes(x, cfg, &mut codes);
    EfqBlock { k, codes }
}

/// The published scale of Eq. 8 and the two alternatives, from the block max.
fn scale_exp(mb: f32, scale: EfqScale) -> i32 {
    if mb == f32::NEG_INFINITY {
        return E8M0_MIN_EXP;
    }
    let k = match scale {
        EfqScale::Efq => ((mb + (2.0f32 / 9.0).ln()) / LN_2).floor(),
        EfqScale::Floor => (mb * LOG2_E).floor() - 2.0,
        EfqScale::Rceil => (mb * LOG2_E - 6f32.log2()).ceil(),
    };
    (k as i32).clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
}

/// Writes the codes of one block, returns k.
fn block_codes(x: &[f32], cfg: &EfqConfig, codes: &mut [u8]) -> i32 {
    let mb = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    match cfg.rule {
        EfqRule::ExactThresholds if cfg.scale != EfqScale::Efq => {
            // exp → MXFP4 decided by comparisons with calibrated log-domain boundaries
            let t = exp_mxfp4_thresholds();
            let e = match cfg.scale {
                EfqScale::Floor => t.floor_log2_exp(mb).map_or(E8M0_MIN_EXP, |f| f - 2),
                _ => t.rceil_exp(mb),
            }
            .clamp(E_MIN, E_MAX);
            for (c, &xi) in codes.iter_mut().zip(x) {
                *c = t.code(xi, e);
            }
            e
        }
        _ => {
            let k = scale_exp(mb, cfg.scale);
            let kf = k as f32;
            match cfg.rule {
                EfqRule::Lut => {
                    let tau = (1.0f32 / 24.0).ln();
                    let h = 14.0 / 24f32.ln();
                    let shift = kf * LN_2 + 6f32.ln();
                    for (c, &xi) in codes.iter_mut().zip(x) {
                        let z = xi - shift;
                        let j = (((z - tau) * h).floor() + 1.0).clamp(0.0, 15.0);
                        *c = C16[j as usize];
                    }
                }
                EfqRule::TwoPiece => {
                    // base 2: w = x·log2 e − k, the log2 of v = p / 2^k
                    let lo = 0.75f32.log2();
                    let mid = 1.25f32.log2();
                    for (c, &xi) in codes.iter_mut().zip(x) {
                        let w = xi * LOG2_E - kf;
                        *c = if w >= lo {
                            ((2.0 * (w - mid)).floor() + 3.0).clamp(2.0, 7.0) as u8
                        } else {
                            (w > -2.0) as u8
                        };
                    }
                }
                EfqRule::ExactThresholds => {
                    // with EFQ's own scale: compare the base-2 residual with log2 of the
                    // RNE midpoints (exact in real arithmetic, no exp-then-round twin)
                    const MID: [(f32, bool); 7] = super::log_thresholds::E2M1_MIDPOINTS;
                    for (c, &xi) in codes.iter_mut().zip(x) {
                        let w = xi * LOG2_E - kf;
                        *c = MID.iter().map(|&(t, strict)| if strict { w > t.log2() } else { w >= t.log2() } as u8).sum();
                    }
                }
                _ => {
                    let (tau, h) = cfg.rule.tau_h().expect("affine rule");
                    let shift = kf * LN_2 + 6f32.ln();
                    for (c, &xi) in codes.iter_mut().zip(x) {
                        let z = xi - shift;
                        *c = (((z - tau) * h).floor() + 1.0).clamp(0.0, 7.0) as u8;
                    }
                }
            }
            k
        }
    }
}

pub(crate) struct Efq {
    pub cfg: EfqConfig,
}

impl SoftmaxAlgo for Efq {
    type State = RunningMax;

    fn init(&self) -> RunningMax {
        RunningMax {
            m: f32::NEG_INFINITY,
        }
    }

    fn tile(&self, st: &mut RunningMax, s: &[f32], p: &mut [f32]) -> f32 {
        let (m, alpha) = update_running_max(st, s);
        if m == f32::NEG_INFINITY {
            p.fill(0.0);
            return alpha;
        }
        let mut codes = [0u8; 256];
        let mut x = [0f32; 256];
        for (sb, pb) in s.chunks(self.cfg.block).zip(p.chunks_mut(self.cfg.block)) {
            let n = sb.len();
            for (xi, &si) in x[..n].iter_mut().zip(sb) {
                *xi = si - m; // the shift of FlashAttention, masks (−inf) kept
            }
            let k = block_codes(&x[..n], &self.cfg, &mut codes[..n]);
            let scale = pow2(k);
            for (pi, &c) in pb.iter_mut().zip(&codes[..n]) {
                *pi = C8[c as usize] * scale;
            }
        }
        alpha
    }

    fn lse(&self, st: &RunningMax, l: f32) -> f32 {
        st.m + l.ln()
    }
}
