//! Fused-Softmax (AMD, arXiv 2611.09225), as specified in `fused_softmax.md` §2.2.
//!
//! Scores arrive in log2 units (softmax scale · log2 e is folded into Q before Q is
//! quantized). Per row:
//!
//! 1. first KV tile: `m = max(s) − 1/8`, frozen from then on;
//! 2. every tile: the accumulator `A = G·s + (OFF − G·m)` (on the GPU the bias is the
//!    MMA's initial accumulator);
//! 3. if `max A > THR` (P would leave the FP8 range): rollback, `δ = max A − OFF`,
//!    `A −= δ`, `m += δ/G`, and O, L are rescaled by `α = 2^(−δ/G)`;
//! 4. `P = E4M3(A)`: [`FusedProbs::U8Code`] takes `clamp(RNE(A), 0, 126)` as the E4M3
//!    byte itself (G = 8, OFF = 55.5361328125, THR = 126.5); [`FusedProbs::Fp32Bits`]
//!    takes `u32(A)` as f32 bits and rounds that to E4M3 (G = 2^23, OFF = 0x4e7de250,
//!    THR = 136·2^23);
//! 5. optionally P is re-quantized to MXFP6/MXFP4 along 32-key blocks;
//! 6. the loop adds `Σ P` to L and `P·V` to O with this very P.
//!
//! Since P ≈ 2^(s − m) on average (see [`FusedSoftmax::lse`]), `LSE = ln2·(m + log2 L)`.
//! The constants OFF (u8) and the f32 bias are reconstructed from AMD's shipped code
//! objects (fused_softmax.md §1); they make the Mitchell approximation's mean error ≈ 0.

use super::{ScorePrep, SoftmaxAlgo};
use crate::attention::config::{FusedProbs, FusedSoftmaxConfig, ProbFormat};
use crate::attention::softmax::quantize_probs;
use crate::mx::ElemFormat;

/// u8-code variant: `A = 8·(s − m) + OFF_U8` is the E4M3 code of ≈2^(s − m).
pub const G_U8: f32 = 8.0;
/// 55.5361328125, the constant s91 (0x425e2500) of the shipped gfx950 kernels.
pub const OFF_U8: f32 = f32::from_bits(0x425e_2500);
pub const THR_U8: f32 = 126.5;
/// fp32-bits variant: `A = 2^23·(s − m) + OFF_F32` is the f32 bit pattern of ≈2^(s − m).
pub const G_F32: f32 = 8_388_608.0;
pub const OFF_F32_BITS: u32 = 0x4e7d_e250;
pub const THR_F32: f32 = 136.0 * 8_388_608.0;

/// Per-row state: the frozen max (log2 units) and the rollback count.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FusedState {
    pub m: f32,
    pub started: bool,
    pub rollbacks: u64,
}

pub(crate) struct FusedSoftmax {
    cfg: FusedSoftmaxConfig,
    p_format: ProbFormat,
    g: f32,
    off: f32,
    thr: f32,
    /// Binades the frozen max sits below the code of P = 1 ([`FusedProbs::U8CodeWide`]:
    /// 7; 0 otherwise): P ≈ 2^(s − m) still, with m that much lower.
    lift: f32,
}

impl FusedSoftmax {
    pub fn new(cfg: FusedSoftmaxConfig, p_format: ProbFormat) -> Self {
        let (g, off, thr) = match cfg.probs {
            FusedProbs::U8Code | FusedProbs::U8CodeWide => (G_U8, OFF_U8, THR_U8),
            FusedProbs::Fp32Bits => (G_F32, f32::from_bits(OFF_F32_BITS), THR_F32),
            // exact exp2 with the u8 variant's headroom: rollback above (126.5 − OFF)/8
            FusedProbs::ExactE4M3 => (1.0, 0.0, (THR_U8 - OFF_U8) / G_U8),
            FusedProbs::ExactF32 => (1.0, 0.0, f32::INFINITY),
        };
        let lift = if cfg.probs == FusedProbs::U8CodeWide {
            7.0
        } else {
            0.0
        };
        Self {
            cfg,
            p_format,
            g,
            off,
            thr,
            lift,
        }
    }

    /// P of one accumulator value (−inf, from a masked key, gives 0).
    #[inline]
    fn prob(&self, a: f32) -> f32 {
        match self.cfg.probs {
            FusedProbs::U8Code | FusedProbs::U8CodeWide => {
                // v_cvt_pk_u8_f32: round to nearest even, saturate to the byte range;
                // the rollback keeps A < 126.5, the clamp is the guard against code 127 (NaN).
                let code = a.round_ties_even().clamp(0.0, 126.0) as u8;
                ElemFormat::E4M3.decode(code)
            }
            FusedProbs::Fp32Bits => {
                // v_cvt_u32_f32 (truncating, saturating), reinterpret, cvt to E4M3 (RNE, sat)
                let bits = if a > 0.0 { a as u32 } else { 0 };
                let f = f32::from_bits(bits);
                ElemFormat::E4M3.decode(ElemFormat::E4M3.encode(f))
            }
            FusedProbs::ExactE4M3 => ElemFormat::E4M3.decode(ElemFormat::E4M3.encode(a.exp2())),
            FusedProbs::ExactF32 => a.exp2(),
        }
    }
}

impl FusedSoftmax {
    /// The floor: base-2 FlashAttention with a running max and f32 P.
    fn tile_running_max(&self, st: &mut FusedState, s: &[f32], p: &mut [f32]) -> f32 {
        let tmax = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m_new = st.m.max(tmax);
        if m_new == f32::NEG_INFINITY {
            p.fill(0.0);
            return 1.0;
        }
        let alpha = (st.m - m_new).exp2();
        st.m = m_new;
        for (pk, &x) in p.iter_mut().zip(s) {
            *pk = (x - m_new).exp2();
        }
        quantize_probs(self.p_format, p);
        alpha
    }
}

impl SoftmaxAlgo for FusedSoftmax {
    type State = FusedState;

    fn score_prep(&self, softmax_scale: f32) -> ScorePrep {
        ScorePrep {
            q_scale: softmax_scale * std::f32::consts::LOG2_E,
            score_scale: 1.0,
            hadamard: self.cfg.hadamard,
        }
    }

    fn init(&self) -> FusedState {
        FusedState {
            m: f32::NEG_INFINITY,
            started: false,
            rollbacks: 0,
        }
    }

    fn tile(&self, st: &mut FusedState, s: &[f32], p: &mut [f32]) -> f32 {
        if self.cfg.probs == FusedProbs::ExactF32 {
            return self.tile_running_max(st, s, p);
        }
        if !st.started {
            let tmax = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if tmax == f32::NEG_INFINITY {
                p.fill(0.0);
                return 1.0;
            }
            st.m = tmax - 0.125 - self.lift;
            st.started = true;
        }
        // The accumulator, built in p: A = G·s + bias (G·s is exact, one rounding).
        let bias = self.off - self.g * st.m;
        let mut amax = f32::NEG_INFINITY;
        for (a, &x) in p.iter_mut().zip(s) {
            *a = self.g * x + bias;
            amax = amax.max(*a);
        }
        let mut alpha = 1.0;
        if amax > self.thr {
            // the new max maps to P = 2^lift (1 but for the wide u8 code)
            let delta = amax - (self.off + self.g * self.lift);
            for a in p.iter_mut() {
                *a -= delta;
            }
            st.m += delta / self.g;
            alpha = (-delta / self.g).exp2();
            st.rollbacks += 1;
        }
        for a in p.iter_mut() {
            *a = self.prob(*a);
        }
        quantize_probs(self.p_format, p);
        alpha
    }

    fn lse(&self, st: &FusedState, l: f32) -> f32 {
        // P ≈ 2^(s − m) on average: OFF (u8: 55.536 rather than 56; f32: 127·2^23 − 0.058·2^23)
        // offsets the piecewise-linear code by −0.058 octave, which cancels the +4 % mean
        // overestimate of the linear interpolation, so no bias term is subtracted here.
        // (§2.2 of the spec subtracts (OFF − 56)/8; measured, that double counts: +0.041
        // nats at σ = 1.)
        std::f32::consts::LN_2 * (st.m + l.log2())
    }

    fn rollbacks(&self, st: &FusedState) -> u64 {
        st.rollbacks
    }
}
