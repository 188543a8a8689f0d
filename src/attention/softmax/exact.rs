//! Exact online softmax (FlashAttention-2), P kept in f32.

use super::{exp_shifted, update_running_max, RunningMax, SoftmaxAlgo};

/// Exact online softmax: P in f32.
pub(crate) struct Exact;

impl SoftmaxAlgo for Exact {
    type State = RunningMax;
    fn init(&self) -> RunningMax {
        RunningMax {
            m: f32::NEG_INFINITY,
        }
    }
    fn tile(&self, st: &mut RunningMax, s: &[f32], p: &mut [f32]) -> f32 {
        let (m, alpha) = update_running_max(st, s);
        exp_shifted(s, m, p);
        alpha
    }
    fn lse(&self, st: &RunningMax, l: f32) -> f32 {
        st.m + l.ln()
    }
}
