//! [`Communicator`] over NCCL (feature `nccl`): one process per GPU, the collectives on the
//! device's stream, so they order with the model's kernels without a host synchronization.

use crate::launch::{share_from_rank0, RankEnv};
use crate::{check_chunks, Communicator, Layout};
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::cuda_backend::cudarc::nccl::{Comm, Id};
use candle_core::cuda_backend::{CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{bail, Device, Result, Storage, Tensor};
use std::sync::Mutex;
use std::time::Duration;

/// NCCL's communicator handle is a raw pointer, so cudarc's `Comm` is not `Send`. NCCL
/// allows a communicator to be used from any thread as long as calls do not overlap; the
/// mutex in [`NcclComm`] serializes them.
struct SendComm(Comm);
// SAFETY: see above; every use goes through `NcclComm::comm`'s mutex.
unsafe impl Send for SendComm {}

/// One rank of an NCCL group.
pub struct NcclComm {
    comm: Mutex<SendComm>,
    device: CudaDevice,
    rank: usize,
    world: usize,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclComm(rank {} of {})", self.rank, self.world)
    }
}

fn nccl_err(
    what: &str,
) -> impl Fn(candle_core::cuda_backend::cudarc::nccl::result::NcclError) -> candle_core::Error + '_
{
    move |e| candle_core::Error::Msg(format!("NCCL {what}: {e:?}"))
}

impl NcclComm {
    /// Joins the run `env` describes on `device` (the rank's GPU) and returns this rank's
    /// communicators of `layout`: its sequence-parallel group's and its CFG group's. Rank 0
    /// makes one NCCL id per group and serves them at the master address; every rank then
    /// initializes its two communicators, sequence groups first (the groups of one kind are
    /// disjoint, so each initialization is one collective of its members).
    pub fn join(env: &RankEnv, device: &Device, layout: Layout) -> Result<(Self, Self)> {
        let Device::Cuda(dev) = device else {
            bail!("NCCL needs a CUDA device, got {device:?}");
        };
        if layout.world() != env.world {
            bail!(
                "the layout {layout:?} has {} ranks, WORLD_SIZE is {}",
                layout.world(),
                env.world
            );
        }
        let groups = layout.cfg + layout.sp;
        let bytes = share_from_rank0(
            env,
            || {
                let mut b = Vec::with_capacity(128 * groups);
                for _ in 0..groups {
                    let id = Id::new().map_err(nccl_err("unique id"))?;
                    b.extend(id.internal().iter().map(|&c| c as u8));
                }
                Ok(b)
            },
            Duration::from_secs(120),
        )?;
        if bytes.len() != 128 * groups {
            bail!(
                "rendezvous: expected {groups} NCCL ids of 128 bytes, got {} bytes",
                bytes.len()
            );
        }
        let id = |i: usize| {
            let mut internal = [0 as std::ffi::c_char; 128];
            for (d, s) in internal.iter_mut().zip(&bytes[128 * i..128 * (i + 1)]) {
                *d = *s as std::ffi::c_char;
            }
            Id::uninit(internal)
        };
        let (g, s) = (env.rank / layout.sp, env.rank % layout.sp);
        let make = |rank: usize, world: usize, id: Id| -> Result<Self> {
            let comm =
                Comm::from_rank(dev.cuda_stream(), rank, world, id).map_err(nccl_err("init"))?;
            Ok(Self {
                comm: Mutex::new(SendComm(comm)),
                device: dev.clone(),
                rank,
                world,
            })
        };
        let sp = make(s, layout.sp, id(g))?;
        let cfg = make(g, layout.cfg, id(layout.cfg + s))?;
        Ok((sp, cfg))
    }
}

impl NcclComm {
    fn tensor_of<T: candle_core::cuda_backend::CudaDType>(
        &self,
        s: CudaSlice<T>,
        shape: Vec<usize>,
    ) -> Tensor {
        let st = Storage::Cuda(CudaStorage::wrap_cuda_slice(s, self.device.clone()));
        Tensor::from_storage(st, shape, BackpropOp::none(), false)
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }

    /// Grouped sends and receives (NCCL's all-to-all recipe), one buffer per peer.
    fn all_to_all(&self, chunks: &[Tensor]) -> Result<Vec<Tensor>> {
        check_chunks("NCCL", self.world, chunks)?;
        let shape = chunks[0].dims().to_vec();
        let n = chunks[0].elem_count();
        let sends = chunks
            .iter()
            .map(|c| c.contiguous())
            .collect::<Result<Vec<_>>>()?;
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        let comm = &guard.0;
        macro_rules! run {
            ($t:ty) => {{
                let mut bufs = (0..self.world)
                    .map(|_| self.device.alloc_zeros::<$t>(n.max(1)))
                    .collect::<Result<Vec<_>>>()?;
                let held: Vec<_> = sends.iter().map(|c| c.storage_and_layout()).collect();
                {
                    let mut g = comm.group();
                    for (peer, ((st, l), buf)) in held.iter().zip(bufs.iter_mut()).enumerate() {
                        let Storage::Cuda(cs) = &**st else {
                            bail!("NCCL: tensors must be on the CUDA device")
                        };
                        let (a, b) = l.contiguous_offsets().expect("contiguous");
                        let src = cs.as_cuda_slice::<$t>()?.slice(a..b);
                        g.send(src, peer as i32).map_err(nccl_err("send"))?;
                        g.recv(buf.slice_mut(0..n), peer as i32)
                            .map_err(nccl_err("recv"))?;
                    }
                }
                drop(held);
                bufs.into_iter()
                    .map(|b| self.tensor_of(b, shape.clone()))
                    .collect::<Vec<_>>()
            }};
        }
        Ok(match chunks[0].dtype() {
            candle_core::DType::F32 => run!(f32),
            candle_core::DType::BF16 => run!(half::bf16),
            candle_core::DType::F16 => run!(half::f16),
            dt => bail!("NCCL: dtype {dt:?} not supported (f32, bf16, f16)"),
        })
    }

    fn all_gather(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let shape = x.dims().to_vec();
        let n = x.elem_count();
        let w = self.world;
        let x = x.contiguous()?;
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        let comm = &guard.0;
        macro_rules! run {
            ($t:ty) => {{
                let mut out = self.device.alloc_zeros::<$t>((n * w).max(1))?;
                {
                    let (st, l) = x.storage_and_layout();
                    let Storage::Cuda(cs) = &*st else {
                        bail!("NCCL: tensors must be on the CUDA device")
                    };
                    let (a, b) = l.contiguous_offsets().expect("contiguous");
                    let src = cs.as_cuda_slice::<$t>()?.slice(a..b);
                    comm.all_gather(&src, &mut out)
                        .map_err(nccl_err("all_gather"))?;
                }
                let all = self.tensor_of(out, vec![(n * w).max(1)]);
                (0..w)
                    .map(|r| all.narrow(0, r * n, n)?.reshape(shape.clone()))
                    .collect::<Result<Vec<_>>>()?
            }};
        }
        Ok(match x.dtype() {
            candle_core::DType::F32 => run!(f32),
            candle_core::DType::BF16 => run!(half::bf16),
            candle_core::DType::F16 => run!(half::f16),
            dt => bail!("NCCL: dtype {dt:?} not supported (f32, bf16, f16)"),
        })
    }
}
