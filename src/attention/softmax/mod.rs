//! The seam between the online-softmax loop and a softmax algorithm.
//!
//! The loop (reference or tiled) computes one KV tile of scores for one query row, hands
//! it to [`SoftmaxAlgo::tile`], which writes the *decoded P operand* and returns the
//! factor α by which the row's O and L are rescaled before the tile is added:
//!
//! ```text
//! α = algo.tile(state, s, p);   L = α·L + Σ_k p_k;   O = α·O + Σ_k p_k·V_k
//! ```
//!
//! The same `p` feeds both sums, so numerator and denominator always agree (both papers'
//! point). Masked scores arrive as −inf and must give p = 0.

pub mod efq;
mod exact;
mod exp_then_quantize;
pub mod fused;
pub(crate) mod log_thresholds;

pub(crate) use efq::Efq;
pub(crate) use exact::Exact;
pub(crate) use exp_then_quantize::{quantize_probs, ExpThenQuantize};
pub(crate) use fused::FusedSoftmax;

/// How the scores are formed for an algorithm: Q is multiplied by `q_scale` (and rotated
/// by a normalized Hadamard if `hadamard`) before it is quantized, and the raw dot
/// products are multiplied by `score_scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ScorePrep {
    pub q_scale: f32,
    pub score_scale: f32,
    pub hadamard: bool,
}

pub(crate) trait SoftmaxAlgo: Send + Sync {
    /// Per-row state beyond L and O (the running or frozen max, counters).
    type State: Clone + Send;

    /// How scores are formed given the softmax scale.
    fn score_prep(&self, softmax_scale: f32) -> ScorePrep {
        ScorePrep {
            q_scale: 1.0,
            score_scale: softmax_scale,
            hadamard: false,
        }
    }
    fn init(&self) -> Self::State;
    /// One KV tile of one row: scores `s` (−inf where masked) in, decoded P out.
    /// Returns α, the rescale of the row's previous O and L.
    fn tile(&self, st: &mut Self::State, s: &[f32], p: &mut [f32]) -> f32;
    /// Natural-log log-sum-exp of the row's scaled scores, from the final state and L.
    fn lse(&self, st: &Self::State, l: f32) -> f32;
    /// Times the row left the algorithm's fast path (Fused-Softmax rollbacks).
    fn rollbacks(&self, _st: &Self::State) -> u64 {
        0
    }
}

/// Running row max of FlashAttention: the state of [`Exact`] and [`ExpThenQuantize`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunningMax {
    pub m: f32,
}

/// Raises the running max with a tile's scores and returns (m_new, α = e^(m_old − m_new)).
/// A row that has seen only masked keys keeps m = −inf and α = 1.
#[inline]
pub(crate) fn update_running_max(st: &mut RunningMax, s: &[f32]) -> (f32, f32) {
    let tmax = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let m_new = st.m.max(tmax);
    let alpha = if m_new == f32::NEG_INFINITY {
        1.0
    } else {
        (st.m - m_new).exp()
    };
    st.m = m_new;
    (m_new, alpha)
}

/// `exp(s − m)` for every score; 0 where s = −inf or the row has no max yet.
#[inline]
pub(crate) fn exp_shifted(s: &[f32], m: f32, p: &mut [f32]) {
    if m == f32::NEG_INFINITY {
        p.fill(0.0);
        return;
    }
    for (pk, &sk) in p.iter_mut().zip(s) {
        *pk = (sk - m).exp();
    }
}
