//! Collectives between the ranks of a parallel run, for the models above the attention op.
//!
//! * [`Communicator`]: the two collectives sequence and CFG parallelism need (all-to-all and
//!   all-gather of equally shaped tensors), with two implementations: [`ThreadComm`] (ranks
//!   as threads of one process, on any device; what the CPU tests use) and, with the `nccl`
//!   feature, [`nccl::NcclComm`] (one process per GPU, NCCL through candle's `cudarc`).
//! * [`ulysses`]: DeepSpeed-Ulysses' two exchanges around an attention call (tokens split
//!   across ranks ↔ heads split across ranks) and the final gather of tokens.
//! * [`launch`]: the rank layout of a run (`--gpus N` children or torchrun-style `RANK`,
//!   `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) and the rendezvous that hands
//!   rank 0's NCCL id to the others over TCP.

pub mod launch;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod ulysses;

use candle_core::{bail, Result, Tensor};
use std::sync::{Arc, Barrier, Mutex};

/// Collectives among `world()` ranks. Every rank of the group makes the same calls in the
/// same order (a collective blocks until all have joined it).
pub trait Communicator: Send + Sync + std::fmt::Debug {
    /// This rank, `0..world()`.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn world(&self) -> usize;
    /// Sends `chunks[j]` to rank `j` and returns what every rank sent to this one, in rank
    /// order. All chunks of all ranks have one shape and dtype (what NCCL needs to size the
    /// receiving buffers).
    fn all_to_all(&self, chunks: &[Tensor]) -> Result<Vec<Tensor>>;
    /// Every rank's `x` (one shape and dtype on all ranks), in rank order.
    fn all_gather(&self, x: &Tensor) -> Result<Vec<Tensor>>;
}

/// The checks every implementation makes of an all-to-all's chunks.
fn check_chunks(what: &str, world: usize, chunks: &[Tensor]) -> Result<()> {
    if chunks.len() != world {
        bail!(
            "{what}: all_to_all takes one chunk per rank ({world}), got {}",
            chunks.len()
        );
    }
    if let Some(c) = chunks
        .iter()
        .find(|c| c.dims() != chunks[0].dims() || c.dtype() != chunks[0].dtype())
    {
        bail!(
            "{what}: all_to_all chunks must share one shape and dtype, got {:?} {:?} and {:?} {:?}",
            chunks[0].dims(),
            chunks[0].dtype(),
            c.dims(),
            c.dtype()
        );
    }
    Ok(())
}

/// Ranks as threads of one process: every collective meets at a barrier and hands tensors
/// over through shared slots (no copy: Candle tensors are shared, immutable storage).
#[derive(Debug)]
pub struct ThreadComm {
    rank: usize,
    world: usize,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// What each rank put in for the current collective.
    slots: Mutex<Vec<Vec<Tensor>>>,
    barrier: Barrier,
}

impl ThreadComm {
    /// The `world` communicators of one group, rank order; hand one to each thread.
    pub fn group(world: usize) -> Vec<ThreadComm> {
        let shared = Arc::new(Shared {
            slots: Mutex::new(vec![Vec::new(); world]),
            barrier: Barrier::new(world),
        });
        (0..world)
            .map(|rank| ThreadComm {
                rank,
                world,
                shared: shared.clone(),
            })
            .collect()
    }

    /// Puts `mine` in this rank's slot, waits for every rank, reads with `take`, and waits
    /// again so no rank overwrites a slot another is still reading.
    fn exchange<T>(&self, mine: Vec<Tensor>, take: impl FnOnce(&[Vec<Tensor>]) -> T) -> T {
        self.shared.slots.lock().unwrap_or_else(|e| e.into_inner())[self.rank] = mine;
        self.shared.barrier.wait();
        let out = take(&self.shared.slots.lock().unwrap_or_else(|e| e.into_inner()));
        self.shared.barrier.wait();
        out
    }
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn all_to_all(&self, chunks: &[Tensor]) -> Result<Vec<Tensor>> {
        check_chunks("thread communicator", self.world, chunks)?;
        let r = self.rank;
        Ok(self.exchange(chunks.to_vec(), |slots| {
            slots.iter().map(|s| s[r].clone()).collect()
        }))
    }
    fn all_gather(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let got = self.exchange(vec![x.clone()], |slots| {
            slots.iter().map(|s| s[0].clone()).collect::<Vec<_>>()
        });
        if let Some(t) = got
            .iter()
            .find(|t| t.dims() != x.dims() || t.dtype() != x.dtype())
        {
            bail!(
                "thread communicator: all_gather of {:?} {:?} met {:?} {:?} on another rank",
                x.dims(),
                x.dtype(),
                t.dims(),
                t.dtype()
            );
        }
        Ok(got)
    }
}

/// How a run's ranks divide the work: `cfg` groups (1, or 2 for the two classifier-free
/// guidance branches) × `sp` ranks of sequence parallelism each. Rank `r` is rank `r % sp`
/// of sequence group `r / sp`, and rank `r / sp` of CFG group `r % sp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub cfg: usize,
    pub sp: usize,
}

impl Layout {
    /// The layout of `world` ranks: CFG parallel across 2 groups when `cfg_parallel` (and
    /// `world` is even), sequence parallel over the rest.
    pub fn new(world: usize, cfg_parallel: bool) -> Result<Self> {
        if world == 0 {
            bail!("a parallel run needs at least one rank");
        }
        if cfg_parallel && !world.is_multiple_of(2) {
            bail!("CFG parallelism splits the ranks in two groups: {world} ranks is odd");
        }
        let cfg = if cfg_parallel { 2 } else { 1 };
        Ok(Self {
            cfg,
            sp: world / cfg,
        })
    }

    pub fn world(&self) -> usize {
        self.cfg * self.sp
    }

    /// Thread communicators of every rank: `(sequence group's, CFG group's)` per rank, rank
    /// order (a group of one rank where that parallelism is off).
    pub fn thread_groups(&self) -> Vec<(ThreadComm, ThreadComm)> {
        // one sequence group per CFG index g, one CFG group per sequence index s; rank
        // r = g·sp + s takes member s of the first and member g of the second
        let mut sp: Vec<_> = (0..self.cfg)
            .map(|_| ThreadComm::group(self.sp).into_iter())
            .collect();
        let mut cfg: Vec<_> = (0..self.sp)
            .map(|_| ThreadComm::group(self.cfg).into_iter())
            .collect();
        let mut out = Vec::with_capacity(self.world());
        for sp_group in sp.iter_mut() {
            for cfg_group in cfg.iter_mut() {
                let a = sp_group.next().expect("one per rank");
                let b = cfg_group.next().expect("one per rank");
                out.push((a, b));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn thread_all_to_all_transposes_chunks() {
        let world = 3;
        let handles: Vec<_> = ThreadComm::group(world)
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    let r = c.rank() as f32;
                    let chunks: Vec<Tensor> = (0..world)
                        .map(|j| Tensor::new(&[10.0 * r + j as f32], &Device::Cpu).unwrap())
                        .collect();
                    let got = c.all_to_all(&chunks).unwrap();
                    let g: Vec<f32> = got.iter().map(|t| t.to_vec1::<f32>().unwrap()[0]).collect();
                    let all = c
                        .all_gather(&Tensor::new(&[r], &Device::Cpu).unwrap())
                        .unwrap();
                    let a: Vec<f32> = all.iter().map(|t| t.to_vec1::<f32>().unwrap()[0]).collect();
                    (c.rank(), g, a)
                })
            })
            .collect();
        for h in handles {
            let (r, g, a) = h.join().unwrap();
            // rank r receives chunk r of every rank j: 10·j + r
            let want: Vec<f32> = (0..world).map(|j| 10.0 * j as f32 + r as f32).collect();
            assert_eq!(g, want);
            assert_eq!(a, vec![0.0, 1.0, 2.0]);
        }
    }

    #[test]
    fn unequal_chunks_are_an_error() {
        let c = ThreadComm::group(1).pop().unwrap();
        let a = Tensor::zeros(2, candle_core::DType::F32, &Device::Cpu).unwrap();
        let e = c.all_to_all(&[a.clone(), a]).unwrap_err().to_string();
        assert!(e.contains("one chunk per rank (1)"), "{e}");
    }

    #[test]
    fn layouts_place_ranks_in_both_groups() {
        let l = Layout::new(8, true).unwrap();
        assert_eq!((l.cfg, l.sp), (2, 4));
        let groups = l.thread_groups();
        for (r, (sp, cfg)) in groups.iter().enumerate() {
            assert_eq!((sp.rank(), sp.world()), (r % 4, 4));
            assert_eq!((cfg.rank(), cfg.world()), (r / 4, 2));
        }
        assert!(Layout::new(3, true)
            .unwrap_err()
            .to_string()
            .contains("odd"));
        assert_eq!(Layout::new(3, false).unwrap(), Layout { cfg: 1, sp: 3 });
    }
}
