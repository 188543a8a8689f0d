//! CPU backend: the scalar reference and the tiled fast path of every algorithm.

pub(crate) mod dot;
pub(crate) mod operands;
pub(crate) mod reference;
pub(crate) mod tiled;

use crate::attention::config::{Algorithm, AttentionConfig};
use crate::attention::problem::Problem;
use crate::attention::softmax::{self, SoftmaxAlgo};
use candle_core::Result;

/// Which CPU implementation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CpuPath {
    /// The tiled, parallel path (the default).
    #[default]
    Tiled,
    /// The scalar reference: slow, single-threaded, the definition the tiled path matches.
    Reference,
}

/// The f32 input values of one call, laid out as the tensors.
#[derive(Clone, Copy)]
pub(crate) struct Inputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    /// K holds values decoded from codes already in the Q/K format (a cache as stored):
    /// the tiled path does not round them again. The reference rounds every operand (the
    /// rounding is idempotent on such values), so it stays the definition.
    pub k_ready: bool,
    /// V's first keys (whole blocks) hold values already in the V format, likewise.
    pub v_ready_keys: usize,
}

impl<'a> Inputs<'a> {
    /// Inputs to round as a whole (the op's tensor inputs).
    pub fn raw(q: &'a [f32], k: &'a [f32], v: &'a [f32]) -> Self {
        Self {
            q,
            k,
            v,
            k_ready: false,
            v_ready_keys: 0,
        }
    }
}

/// O `[rows·d]`, LSE `[rows]`, and counters.
pub(crate) struct RunOutput {
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
    pub rollbacks: u64,
}

impl RunOutput {
    fn zeros(p: &Problem) -> Self {
        Self {
            o: vec![0.0; p.rows() * p.d],
            lse: vec![0.0; p.rows()],
            rollbacks: 0,
        }
    }
}

/// O ← O / L. A row whose P operand was all zeros (L = 0) keeps O = 0 instead of NaN.
#[inline]
pub(crate) fn finish_row(o: &mut [f32], l: f32) {
    if l > 0.0 {
        o.iter_mut().for_each(|x| *x /= l);
    } else {
        o.fill(0.0);
    }
}

fn run_algo<A: SoftmaxAlgo>(
    algo: &A,
    path: CpuPath,
    p: &Problem,
    cfg: &AttentionConfig,
    softmax_scale: f32,
    x: Inputs,
) -> Result<RunOutput> {
    let prep = algo.score_prep(softmax_scale);
    match path {
        CpuPath::Tiled => {
            let ops = operands::prepare(p, cfg, prep, x);
            tiled::run(algo, p, prep, &ops)
        }
        CpuPath::Reference => {
            let ops = reference::prepare(p, cfg, prep, x)?;
            reference::run(algo, p, prep, &ops)
        }
    }
}

/// How scores are formed for `cfg`'s algorithm (Q pre-scale, Hadamard, score scale).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn score_prep(cfg: &AttentionConfig, softmax_scale: f32) -> softmax::ScorePrep {
    match &cfg.algorithm {
        Algorithm::FusedSoftmax(f) => {
            softmax::FusedSoftmax::new(*f, cfg.p_format).score_prep(softmax_scale)
        }
        _ => softmax::Exact.score_prep(softmax_scale),
    }
}

/// Runs `cfg` on f32 inputs laid out as `p` says.
pub(crate) fn run(
    path: CpuPath,
    p: &Problem,
    cfg: &AttentionConfig,
    softmax_scale: f32,
    x: Inputs,
) -> Result<RunOutput> {
    match &cfg.algorithm {
        Algorithm::Exact => run_algo(&softmax::Exact, path, p, cfg, softmax_scale, x),
        Algorithm::ExpThenQuantize => {
            let a = softmax::ExpThenQuantize {
                p_format: cfg.p_format,
            };
            run_algo(&a, path, p, cfg, softmax_scale, x)
        }
        Algorithm::Efq(e) => run_algo(&softmax::Efq { cfg: *e }, path, p, cfg, softmax_scale, x),
        Algorithm::FusedSoftmax(f) => {
            let a = softmax::FusedSoftmax::new(*f, cfg.p_format);
            run_algo(&a, path, p, cfg, softmax_scale, x)
        }
    }
}
