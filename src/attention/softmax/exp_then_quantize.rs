//! Exp-then-quantize: the conventional low-precision probability path.

use super::{exp_shifted, update_running_max, RunningMax, SoftmaxAlgo};
use crate::attention::config::ProbFormat;
use crate::mx::{dequantize_block, quantize_block};

/// Exp-then-quantize: exact `exp(s − m)` in f32, then P rounded to a low-precision
/// format; the decoded values are the operand.
pub(crate) struct ExpThenQuantize {
    pub p_format: ProbFormat,
}

impl SoftmaxAlgo for ExpThenQuantize {
    type State = RunningMax;
    fn init(&self) -> RunningMax {
        RunningMax {
            m: f32::NEG_INFINITY,
        }
    }
    fn tile(&self, st: &mut RunningMax, s: &[f32], p: &mut [f32]) -> f32 {
        let (m, alpha) = update_running_max(st, s);
        exp_shifted(s, m, p);
        quantize_probs(self.p_format, p);
        alpha
    }
    fn lse(&self, st: &RunningMax, l: f32) -> f32 {
        st.m + l.ln()
    }
}

/// Rounds one tile of probabilities (values in [0, 1]) in place to `fmt`.
pub(crate) fn quantize_probs(fmt: ProbFormat, p: &mut [f32]) {
    match fmt {
        ProbFormat::F32 => {}
        ProbFormat::Mx { elem, scale, block } => {
            let mut codes = [0u8; 256];
            for pb in p.chunks_mut(block) {
                let c = &mut codes[..pb.len()];
                let sb = quantize_block(pb, elem, scale, c);
                dequantize_block(c, sb, elem, pb);
            }
        }
        ProbFormat::Fp8 { elem } => {
            for v in p.iter_mut() {
                *v = elem.decode(elem.encode(*v * 256.0)) / 256.0;
            }
        }
    }
}
