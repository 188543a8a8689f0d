//! The Candle custom op: three tensor inputs (q, k, v), everything else in the struct; or,
//! for K/V handed over as stored MX codes, one input (q) with K and V held in the struct.

use super::config::AttentionConfig;
use super::plan::StoredKv;
use super::problem::Problem;
use crate::cpu::{self, CpuPath};
use crate::mx::MxTensor;
use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor,
};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Counters an op fills while it runs.
#[derive(Debug, Default)]
pub(crate) struct OpStats {
    pub rollbacks: AtomicU64,
    /// `GpuKernel::code` of the kernel that ran (CUDA), 0 before.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub gpu_kernel: AtomicU8,
}

pub(crate) struct AttentionOp {
    pub cfg: AttentionConfig,
    pub problem: Problem,
    pub softmax_scale: f32,
    /// Output f32 `[b, hq, sq, d + 1]` with the LSE in the last column instead of
    /// `[b, hq, sq, d]` in the input dtype.
    pub with_lse: bool,
    pub cpu_path: CpuPath,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub gpu_path: super::GpuPath,
    /// CUDA: leave the checks on the device ([`super::DeviceChecks::Deferred`]).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub deferred: bool,
    pub stats: Arc<OpStats>,
    /// K and V when the op runs on q alone ([`CustomOp1`]): a stored operand's codes are
    /// decoded into the prepared operand instead of being requantized.
    pub kv: Option<[KvInput; 2]>,
}

/// K or V of a [`CustomOp1`] call.
#[derive(Clone, Debug)]
pub(crate) enum KvInput {
    /// `[b, hkv, sk, d]` in q's dtype, contiguous, prepared as the op's tensor inputs are.
    Dense(Tensor),
    /// MX codes in the config's format (K along d, V along the keys over `full`'s keys)
    /// and, for V, the dense tail in q's dtype, contiguous.
    Stored {
        full: MxTensor,
        tail: Option<Tensor>,
    },
}

impl KvInput {
    /// What the plan needs to know of the stored operands.
    pub fn stored(kv: &Option<[KvInput; 2]>) -> StoredKv {
        let Some([k, v]) = kv else {
            return StoredKv::default();
        };
        StoredKv {
            k: matches!(k, KvInput::Stored { .. }),
            v_keys: match v {
                KvInput::Stored { full, .. } => full.shape().dims()[2],
                KvInput::Dense(_) => 0,
            },
        }
    }

    /// The represented values in `dtype` (f32 or bf16, where MX values are exact up to
    /// bf16's subnormals): what [`super::decode::KvOperand::to_tensor`] gives.
    fn values(&self, dtype: DType) -> Result<Tensor> {
        match self {
            KvInput::Dense(t) => Ok(t.clone()),
            KvInput::Stored { full, tail } => {
                let f = full.dequantize()?.to_dtype(dtype)?;
                match tail {
                    Some(t) => Tensor::cat(&[&f, t], 2),
                    None => Ok(f),
                }
            }
        }
    }
}

/// The storage as f32 values (input dtypes f32, bf16, f16), with a NaN/Inf check.
fn to_f32(name: &str, s: &CpuStorage, l: &Layout, dims: [usize; 4]) -> Result<Vec<f32>> {
    let (a, b) = match l.contiguous_offsets() {
        Some(o) => o,
        None => bail!("attention: {name} must be contiguous"),
    };
    let v: Vec<f32> = match s {
        CpuStorage::F32(x) => x[a..b].to_vec(),
        CpuStorage::BF16(x) => x[a..b].iter().map(|v| v.to_f32()).collect(),
        CpuStorage::F16(x) => x[a..b].iter().map(|v| v.to_f32()).collect(),
        _ => bail!(
            "attention: {name} has dtype {:?}; expected f32, bf16 or f16",
            s.dtype()
        ),
    };
    if let Some(idx) = v.iter().position(|x| !x.is_finite()) {
        let d3 = idx % dims[3];
        let d2 = (idx / dims[3]) % dims[2];
        let d1 = (idx / (dims[3] * dims[2])) % dims[1];
        let d0 = idx / (dims[3] * dims[2] * dims[1]);
        bail!(
            "attention: {name} holds a non-finite value ({}) at [{d0}, {d1}, {d2}, {d3}]",
            v[idx]
        );
    }
    Ok(v)
}

impl CustomOp3 for AttentionOp {
    fn name(&self) -> &'static str {
        "mxattn-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let p = &self.problem;
        let q = to_f32("q", s1, l1, [p.b, p.hq, p.sq, p.d])?;
        let k = to_f32("k", s2, l2, [p.b, p.hkv, p.sk, p.d])?;
        let v = to_f32("v", s3, l3, [p.b, p.hkv, p.sk, p.d])?;
        self.cpu_run(cpu::Inputs::raw(&q, &k, &v), s1.dtype())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::attention::cuda_fwd(self, s1, l1, s2, l2, s3, l3)
    }
}

impl AttentionOp {
    /// Runs the CPU path on the call's f32 inputs; the output in `dtype` (or f32 with the
    /// LSE column).
    fn cpu_run(&self, x: cpu::Inputs, dtype: DType) -> Result<(CpuStorage, Shape)> {
        let p = &self.problem;
        let out = cpu::run(self.cpu_path, p, &self.cfg, self.softmax_scale, x)?;
        self.stats
            .rollbacks
            .fetch_add(out.rollbacks, Ordering::Relaxed);
        if self.with_lse {
            let mut packed = Vec::with_capacity(p.rows() * (p.d + 1));
            for (row, lse) in out.o.chunks(p.d.max(1)).zip(&out.lse) {
                packed.extend_from_slice(row);
                packed.push(*lse);
            }
            return Ok((
                CpuStorage::F32(packed),
                Shape::from((p.b, p.hq, p.sq, p.d + 1)),
            ));
        }
        let shape = Shape::from((p.b, p.hq, p.sq, p.d));
        let st = match dtype {
            DType::F32 => CpuStorage::F32(out.o),
            DType::BF16 => {
                CpuStorage::BF16(out.o.iter().map(|x| half::bf16::from_f32(*x)).collect())
            }
            DType::F16 => CpuStorage::F16(out.o.iter().map(|x| half::f16::from_f32(*x)).collect()),
            dt => bail!("attention: unsupported dtype {dt:?}"),
        };
        Ok((st, shape))
    }
}

/// The f32 values of a CPU tensor (checked as the op's inputs are).
fn tensor_f32(name: &str, t: &Tensor, dims: [usize; 4]) -> Result<Vec<f32>> {
    let (st, l) = t.storage_and_layout();
    let Storage::Cpu(s) = &*st else {
        bail!("attention: {name} is not on the CPU like q");
    };
    to_f32(name, s, l, dims)
}

/// q alone as the input, K and V from [`AttentionOp::kv`].
impl CustomOp1 for AttentionOp {
    fn name(&self) -> &'static str {
        "mxattn-attention-kv"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> Result<(CpuStorage, Shape)> {
        let p = &self.problem;
        let Some([kin, vin]) = &self.kv else {
            bail!("attention: internal error: K and V missing");
        };
        let q = to_f32("q", s1, l1, [p.b, p.hq, p.sq, p.d])?;
        let kv_dims = [p.b, p.hkv, p.sk, p.d];
        let k = tensor_f32("k", &kin.values(s1.dtype())?, kv_dims)?;
        let v = tensor_f32("v", &vin.values(s1.dtype())?, kv_dims)?;
        let stored = KvInput::stored(&self.kv);
        let x = cpu::Inputs {
            k_ready: stored.k,
            v_ready_keys: stored.v_keys,
            ..cpu::Inputs::raw(&q, &k, &v)
        };
        self.cpu_run(x, s1.dtype())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::attention::cuda_fwd_kv(self, s1, l1)
    }
}
