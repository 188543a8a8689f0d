//! DeepSpeed-Ulysses sequence parallelism: each rank holds `1/P` of the tokens; around an
//! attention call one all-to-all gives each rank every token of `1/P` of the heads, and one
//! all-to-all after it gives the tokens back. Everything else (projections, norms, the FFN)
//! stays per token, so it runs on the local tokens unchanged.

use crate::Communicator;
use candle_core::{bail, Result, Tensor};

/// Tokens per rank when `n` tokens are split over `world` ranks, padding `n` up to a
/// multiple of `world` (the padded tokens are masked out of attention as keys and dropped
/// at the end).
pub fn local_len(n: usize, world: usize) -> usize {
    n.div_ceil(world)
}

/// `x` with `dim` zero-padded to `len`.
pub fn pad(x: &Tensor, dim: usize, len: usize) -> Result<Tensor> {
    let n = x.dim(dim)?;
    if n >= len {
        return Ok(x.clone());
    }
    let mut shape = x.dims().to_vec();
    shape[dim] = len - n;
    let z = Tensor::zeros(shape, x.dtype(), x.device())?;
    Tensor::cat(&[x, &z], dim)
}

/// This rank's share of `x` along `dim` (`x` padded to `world · local_len` first).
pub fn split(comm: &dyn Communicator, x: &Tensor, dim: usize) -> Result<Tensor> {
    let (w, r) = (comm.world(), comm.rank());
    let l = local_len(x.dim(dim)?, w);
    pad(x, dim, l * w)?.narrow(dim, r * l, l)?.contiguous()
}

/// Every rank's share along `dim`, concatenated in rank order, cut to `len` (the unpadded
/// length).
pub fn gather(comm: &dyn Communicator, x: &Tensor, dim: usize, len: usize) -> Result<Tensor> {
    let parts = comm.all_gather(&x.contiguous()?)?;
    Tensor::cat(&parts, dim)?.narrow(dim, 0, len)
}

fn check_heads(comm: &dyn Communicator, h: usize) -> Result<()> {
    if !h.is_multiple_of(comm.world()) {
        bail!(
            "sequence parallelism over {} ranks splits the {h} attention heads: {h} is not a multiple of {}",
            comm.world(),
            comm.world()
        );
    }
    Ok(())
}

/// `x [b, H, n_local, d]` (every head, this rank's tokens) → `[b, H/P, P·n_local, d]` (this
/// rank's heads, every rank's tokens in rank order).
pub fn heads_to_tokens(comm: &dyn Communicator, x: &Tensor) -> Result<Tensor> {
    let (_, h, _, _) = x.dims4()?;
    check_heads(comm, h)?;
    let hp = h / comm.world();
    let chunks = (0..comm.world())
        .map(|j| x.narrow(1, j * hp, hp)?.contiguous())
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&comm.all_to_all(&chunks)?, 2)
}

/// The inverse of [`heads_to_tokens`]: `[b, H/P, P·n_local, d]` → `[b, H, n_local, d]`.
pub fn tokens_to_heads(comm: &dyn Communicator, x: &Tensor) -> Result<Tensor> {
    let (_, _, n, _) = x.dims4()?;
    let w = comm.world();
    if !n.is_multiple_of(w) {
        bail!("tokens_to_heads: {n} tokens do not split over {w} ranks");
    }
    let l = n / w;
    let chunks = (0..w)
        .map(|j| x.narrow(2, j * l, l)?.contiguous())
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&comm.all_to_all(&chunks)?, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ThreadComm;
    use candle_core::{DType, Device};

    /// Split tokens → heads_to_tokens gives each rank its heads over all tokens, exactly the
    /// slice of the whole tensor; tokens_to_heads undoes it; gather reassembles (padding cut).
    #[test]
    fn exchanges_are_the_slices_of_the_whole() {
        let (b, h, n, d) = (2, 4, 10, 3);
        let whole = Tensor::arange(0f32, (b * h * n * d) as f32, &Device::Cpu)
            .unwrap()
            .reshape((b, h, n, d))
            .unwrap();
        for world in [1, 2, 4] {
            let handles: Vec<_> = ThreadComm::group(world)
                .into_iter()
                .map(|c| {
                    let whole = whole.clone();
                    std::thread::spawn(move || {
                        let mine = split(&c, &whole, 2).unwrap();
                        let heads = heads_to_tokens(&c, &mine).unwrap();
                        let back = tokens_to_heads(&c, &heads).unwrap();
                        let all = gather(&c, &back, 2, n).unwrap();
                        (c.rank(), mine, heads, back, all)
                    })
                })
                .collect();
            let np = local_len(n, world) * world;
            let padded = pad(&whole, 2, np).unwrap();
            for hd in handles {
                let (r, mine, heads, back, all) = hd.join().unwrap();
                let hp = h / world;
                let want = padded.narrow(1, r * hp, hp).unwrap();
                let diff = |a: &Tensor, b: &Tensor| {
                    a.sub(b)
                        .unwrap()
                        .abs()
                        .unwrap()
                        .sum_all()
                        .unwrap()
                        .to_dtype(DType::F32)
                        .unwrap()
                        .to_scalar::<f32>()
                        .unwrap()
                };
                assert_eq!(heads.dims(), want.dims());
                assert_eq!(diff(&heads, &want), 0.0, "world {world} rank {r}");
                assert_eq!(diff(&back, &mine), 0.0);
                assert_eq!(diff(&all, &whole), 0.0);
            }
        }
    }

    #[test]
    fn heads_must_divide() {
        let c = ThreadComm::group(1).pop().unwrap();
        let x = Tensor::zeros((1, 3, 2, 2), DType::F32, &Device::Cpu).unwrap();
        assert!(heads_to_tokens(&c, &x).is_ok());
        let cs = ThreadComm::group(2);
        let e = std::thread::scope(|s| {
            let hs: Vec<_> = cs
                .iter()
                .map(|c| s.spawn(|| heads_to_tokens(c, &x).map(|_| ())))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        let msg = e[0].as_ref().unwrap_err().to_string();
        assert!(msg.contains("3 is not a multiple of 2"), "{msg}");
    }
}
