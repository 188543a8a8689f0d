//! The fast CPU path: blocks of query rows against KV tiles, parallel over
//! (batch, head, query block) with rayon.
//!
//! Per row it performs exactly the arithmetic of [`super::reference::run`], in the same
//! order (scores through the shared [`dot`], the algorithm's tile step, sequential
//! `Σp`, `O += p·V` in key order), so the two agree to the bit. What differs is the
//! schedule: one K/V tile is read once for a whole block of rows, the working set
//! stays in cache, and blocks run on all cores.

use super::dot::{axpy, dot};
use super::operands::Operands;
use super::RunOutput;
use crate::attention::config::KV_TILE;
use crate::attention::problem::Problem;
use crate::attention::softmax::{ScorePrep, SoftmaxAlgo};
use candle_core::{bail, Result};
use rayon::prelude::*;

/// Query rows per block.
const QB: usize = 16;

struct BlockOut {
    rollbacks: u64,
}

#[allow(clippy::too_many_arguments)]
fn run_block<A: SoftmaxAlgo>(
    algo: &A,
    p: &Problem,
    prep: ScorePrep,
    ops: &Operands,
    b: usize,
    h: usize,
    i0: usize,
    o_blk: &mut [f32],
    lse_blk: &mut [f32],
) -> Result<BlockOut> {
    let d = p.d;
    let n = lse_blk.len();
    let kvh = p.kv_head(h);
    let vis: Vec<usize> = (0..n).map(|r| p.visible(b, i0 + r)).collect();
    let max_vis = vis.iter().copied().max().unwrap_or(0);
    let mut st: Vec<A::State> = (0..n).map(|_| algo.init()).collect();
    let mut l = vec![0f32; n];
    let mut s = vec![0f32; n * KV_TILE];
    let mut pr = vec![0f32; n * KV_TILE];
    o_blk.fill(0.0);
    let k_head = &ops.k[p.kv_index(b, kvh, 0)..][..p.sk * d];
    let v_head = &ops.v[p.kv_index(b, kvh, 0)..][..p.sk * d];
    for t0 in (0..max_vis).step_by(KV_TILE) {
        let tl = KV_TILE.min(p.sk - t0);
        for r in 0..n {
            if vis[r] <= t0 {
                continue;
            }
            let qi = &ops.q[p.q_index(b, h, i0 + r)..][..d];
            let sr = &mut s[r * KV_TILE..r * KV_TILE + tl];
            let live = (vis[r] - t0).min(tl);
            for (j, sj) in sr[..live].iter_mut().enumerate() {
                *sj = dot(qi, &k_head[(t0 + j) * d..][..d]) * prep.score_scale;
            }
            sr[live..].fill(f32::NEG_INFINITY);
            if let Some(j) = sr[..live].iter().position(|x| !x.is_finite()) {
                bail!(
                    "attention: score overflows f32 at batch {b}, head {h}, query {}, key {}",
                    i0 + r,
                    t0 + j
                );
            }
            let prr = &mut pr[r * KV_TILE..r * KV_TILE + tl];
            let alpha = algo.tile(&mut st[r], sr, prr);
            l[r] = l[r] * alpha + prr.iter().sum::<f32>();
            let orow = &mut o_blk[r * d..(r + 1) * d];
            if alpha != 1.0 {
                orow.iter_mut().for_each(|x| *x *= alpha);
            }
            for (j, &pj) in prr.iter().enumerate() {
                if pj != 0.0 {
                    axpy(pj, &v_head[(t0 + j) * d..][..d], orow);
                }
            }
        }
    }
    let mut rollbacks = 0;
    for r in 0..n {
        let orow = &mut o_blk[r * d..(r + 1) * d];
        if vis[r] == 0 {
            lse_blk[r] = f32::NEG_INFINITY;
            continue;
        }
        super::finish_row(orow, l[r]);
        lse_blk[r] = algo.lse(&st[r], l[r]);
        rollbacks += algo.rollbacks(&st[r]);
    }
    Ok(BlockOut { rollbacks })
}

pub(crate) fn run<A: SoftmaxAlgo>(
    algo: &A,
    p: &Problem,
    prep: ScorePrep,
    ops: &Operands,
) -> Result<RunOutput> {
    let mut out = RunOutput::zeros(p);
    let (d, sq) = (p.d, p.sq);
    if p.rows() == 0 {
        return Ok(out);
    }
    let rollbacks: Result<u64> = out
        .o
        .par_chunks_mut(sq * d)
        .zip(out.lse.par_chunks_mut(sq))
        .enumerate()
        .map(|(bh, (o_head, lse_head))| {
            let (b, h) = (bh / p.hq, bh % p.hq);
            o_head
                .par_chunks_mut(QB * d)
                .zip(lse_head.par_chunks_mut(QB))
                .enumerate()
                .map(|(qb, (o_blk, lse_blk))| {
                    run_block(algo, p, prep, ops, b, h, qb * QB, o_blk, lse_blk)
                        .map(|r| r.rollbacks)
                })
                .sum::<Result<u64>>()
        })
        .sum();
    out.rollbacks = rollbacks?;
    Ok(out)
}
