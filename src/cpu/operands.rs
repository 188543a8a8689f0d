//! Operand preparation for the tiled CPU path: Q/K/V as the values their formats
//! represent ("fake quantization"), in f32, laid out like the inputs.

use super::Inputs;
use crate::attention::config::{AttentionConfig, OperandFormat};
use crate::attention::hadamard::hadamard_rotate;
use crate::attention::problem::Problem;
use crate::attention::softmax::ScorePrep;
use crate::mx::{fake_quantize, fake_quantize_per_tensor};
use rayon::prelude::*;

pub(crate) struct Operands {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// Rounds one head-dim vector to a Q/K format.
fn round_row(fmt: OperandFormat, x: &mut [f32]) {
    match fmt {
        OperandFormat::Native => {}
        OperandFormat::Bf16 => {
            for v in x.iter_mut() {
                *v = half::bf16::from_f32(*v).to_f32();
            }
        }
        OperandFormat::Mx { elem, scale, block } => {
            let src = x.to_vec();
            fake_quantize(&src, elem, scale, block, x);
        }
        OperandFormat::PerChannel { .. } => unreachable!("validated: per-channel is for V only"),
    }
}

fn prepare_qk(x: &[f32], d: usize, q_scale: f32, hadamard: bool, fmt: OperandFormat) -> Vec<f32> {
    let mut out = x.to_vec();
    out.par_chunks_mut(d).for_each(|row| {
        if q_scale != 1.0 {
            for v in row.iter_mut() {
                *v *= q_scale;
            }
        }
        if hadamard {
            hadamard_rotate(row);
        }
        round_row(fmt, row);
    });
    out
}

/// V rounded along the keys (MX, per channel) or elementwise; keys past a batch entry's
/// valid length are zeroed so they cannot touch the scales of valid keys. The first
/// `ready` keys (whole MX blocks) are already in the format and kept as they are.
fn prepare_v(p: &Problem, v: &[f32], fmt: OperandFormat, ready: usize) -> Vec<f32> {
    let (sk, d) = (p.sk, p.d);
    let mut out = v.to_vec();
    out.par_chunks_mut(sk * d)
        .enumerate()
        .for_each(|(bh, head)| {
            let len = p.kv_lens[bh / p.hkv];
            head[len * d..].fill(0.0);
            match fmt {
                OperandFormat::Native => {}
                OperandFormat::Bf16 => round_row(fmt, &mut head[..len * d]),
                OperandFormat::Mx { .. } | OperandFormat::PerChannel { .. } => {
                    // ready keys are whole blocks from key 0, so the rest starts a block
                    let ready = ready.min(len);
                    let mut col = vec![0f32; len - ready];
                    let mut res = vec![0f32; len - ready];
                    for c in 0..d {
                        for (j, x) in col.iter_mut().enumerate() {
                            *x = head[(ready + j) * d + c];
                        }
                        match fmt {
                            OperandFormat::Mx { elem, scale, block } => {
                                fake_quantize(&col, elem, scale, block, &mut res)
                            }
                            OperandFormat::PerChannel { elem } => {
                                fake_quantize_per_tensor(&col, elem, &mut res);
                            }
                            _ => unreachable!(),
                        }
                        for (j, x) in res.iter().enumerate() {
                            head[(ready + j) * d + c] = *x;
                        }
                    }
                }
            }
        });
    out
}

pub(crate) fn prepare(p: &Problem, cfg: &AttentionConfig, prep: ScorePrep, x: Inputs) -> Operands {
    // a ready K was decoded from codes of this very format, with no rotation to apply
    // (the op takes stored K only then)
    let k = if x.k_ready {
        debug_assert!(!prep.hadamard);
        x.k.to_vec()
    } else {
        prepare_qk(x.k, p.d, 1.0, prep.hadamard, cfg.qk_format)
    };
    Operands {
        q: prepare_qk(x.q, p.d, prep.q_scale, prep.hadamard, cfg.qk_format),
        k,
        v: prepare_v(p, x.v, cfg.v_format, x.v_ready_keys),
    }
}
