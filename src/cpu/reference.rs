//! The scalar reference: one query row at a time, written to be read.
//!
//! Operands are prepared through the public [`crate::mx::quantize`] /
//! [`crate::mx::MxTensor::dequantize`] path (the tiled path uses the slice codecs), and
//! the loop below is the definition of every algorithm's online softmax: for each KV
//! tile, scores, `α = algo.tile(..)`, `L = α·L + Σp`, `O = α·O + Σ p·V`.

use super::dot::{axpy, dot};
use super::operands::Operands;
use super::{Inputs, RunOutput};
use crate::attention::config::{AttentionConfig, OperandFormat, KV_TILE};
use crate::attention::hadamard::hadamard_rotate;
use crate::attention::problem::Problem;
use crate::attention::softmax::{ScorePrep, SoftmaxAlgo};
use crate::mx;
use candle_core::{bail, DType, Device, Result, Tensor};

fn round_qk(
    x: Vec<f32>,
    p: &Problem,
    heads: usize,
    seq: usize,
    fmt: OperandFormat,
) -> Result<Vec<f32>> {
    let t = Tensor::from_vec(x, (p.b, heads, seq, p.d), &Device::Cpu)?;
    let t = match fmt {
        OperandFormat::Native => t,
        OperandFormat::Bf16 => t.to_dtype(DType::BF16)?.to_dtype(DType::F32)?,
        OperandFormat::Mx { elem, scale, block } => {
            mx::quantize(&t, elem, scale, 3, block)?.dequantize()?
        }
        OperandFormat::PerChannel { .. } => bail!("per-channel scaling is for V only"),
    };
    t.flatten_all()?.to_vec1::<f32>()
}

fn round_v(v: &[f32], p: &Problem, fmt: OperandFormat) -> Result<Vec<f32>> {
    let mut out = vec![0f32; v.len()];
    for b in 0..p.b {
        let len = p.kv_lens[b];
        for h in 0..p.hkv {
            let base = p.kv_index(b, h, 0);
            let head: Vec<f32> = v[base..base + len * p.d].to_vec();
            let rounded: Vec<f32> = match fmt {
                OperandFormat::Native => head,
                OperandFormat::Bf16 => head
                    .iter()
                    .map(|x| half::bf16::from_f32(*x).to_f32())
                    .collect(),
                OperandFormat::Mx { elem, scale, block } => {
                    // [len, d] quantized along the keys (dim 0)
                    let t = Tensor::from_vec(head, (len, p.d), &Device::Cpu)?;
                    mx::quantize(&t, elem, scale, 0, block)?
                        .dequantize()?
                        .flatten_all()?
                        .to_vec1()?
                }
                OperandFormat::PerChannel { elem } => {
                    let mut r = head.clone();
                    for c in 0..p.d {
                        let amax = (0..len)
                            .map(|j| head[j * p.d + c].abs())
                            .fold(0f32, f32::max);
                        let s = if amax > 0.0 {
                            amax / elem.max_normal()
                        } else {
                            1.0
                        };
                        for j in 0..len {
                            r[j * p.d + c] = elem.decode(elem.encode(head[j * p.d + c] / s)) * s;
                        }
                    }
                    r
                }
            };
            out[base..base + len * p.d].copy_from_slice(&rounded);
        }
    }
    Ok(out)
}

pub(crate) fn prepare(
    p: &Problem,
    cfg: &AttentionConfig,
    prep: ScorePrep,
    x: Inputs,
) -> Result<Operands> {
    let mut q = x.q.to_vec();
    let mut k = x.k.to_vec();
    for row in q.chunks_mut(p.d) {
        for x in row.iter_mut() {
            if prep.q_scale != 1.0 {
                *x *= prep.q_scale;
            }
        }
        if prep.hadamard {
            hadamard_rotate(row);
        }
    }
    if prep.hadamard {
        k.chunks_mut(p.d).for_each(hadamard_rotate);
    }
    Ok(Operands {
        q: round_qk(q, p, p.hq, p.sq, cfg.qk_format)?,
        k: round_qk(k, p, p.hkv, p.sk, cfg.qk_format)?,
        v: round_v(x.v, p, cfg.v_format)?,
    })
}

pub(crate) fn run<A: SoftmaxAlgo>(
    algo: &A,
    p: &Problem,
    prep: ScorePrep,
    ops: &Operands,
) -> Result<RunOutput> {
    let d = p.d;
    let mut out = RunOutput::zeros(p);
    let mut s = vec![0f32; KV_TILE];
    let mut pr = vec![0f32; KV_TILE];
    for b in 0..p.b {
        for h in 0..p.hq {
            let kvh = p.kv_head(h);
            for i in 0..p.sq {
                let row = (b * p.hq + h) * p.sq + i;
                let n_vis = p.visible(b, i);
                if n_vis == 0 {
                    out.lse[row] = f32::NEG_INFINITY; // fully masked: O = 0
                    continue;
                }
                let qi = &ops.q[p.q_index(b, h, i)..][..d];
                let mut st = algo.init();
                let mut l = 0f32;
                let mut o = vec![0f32; d];
                for t0 in (0..n_vis).step_by(KV_TILE) {
                    let tl = KV_TILE.min(p.sk - t0);
                    for (j, sj) in s[..tl].iter_mut().enumerate() {
                        *sj = if t0 + j < n_vis {
                            let kj = &ops.k[p.kv_index(b, kvh, t0 + j)..][..d];
                            dot(qi, kj) * prep.score_scale
                        } else {
                            f32::NEG_INFINITY
                        };
                        if !sj.is_finite() && t0 + j < n_vis {
                            bail!("attention: score overflows f32 at batch {b}, head {h}, query {i}, key {}", t0 + j);
                        }
                    }
                    let alpha = algo.tile(&mut st, &s[..tl], &mut pr[..tl]);
                    l = l * alpha + pr[..tl].iter().sum::<f32>();
                    if alpha != 1.0 {
                        o.iter_mut().for_each(|x| *x *= alpha);
                    }
                    for (j, &pj) in pr[..tl].iter().enumerate() {
                        if pj != 0.0 {
                            axpy(pj, &ops.v[p.kv_index(b, kvh, t0 + j)..][..d], &mut o);
                        }
                    }
                }
                super::finish_row(&mut o, l);
                out.o[row * d..(row + 1) * d].copy_from_slice(&o);
                out.lse[row] = algo.lse(&st, l);
                out.rollbacks += algo.rollbacks(&st);
            }
        }
    }
    Ok(out)
}
