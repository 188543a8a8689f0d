//! The Candle custom op: three tensor inputs (q, k, v), everything else in the struct.

use super::config::AttentionConfig;
use super::problem::Problem;
use crate::cpu::{self, CpuPath};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape};
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
        let x = cpu::Inputs {
            q: &q,
            k: &k,
            v: &v,
        };
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
        let st = match s1.dtype() {
            DType::F32 => CpuStorage::F32(out.o),
            DType::BF16 => {
                CpuStorage::BF16(out.o.iter().map(|x| half::bf16::from_f32(*x)).collect())
            }
            DType::F16 => CpuStorage::F16(out.o.iter().map(|x| half::f16::from_f32(*x)).collect()),
            dt => bail!("attention: unsupported dtype {dt:?}"),
        };
        Ok((st, shape))
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
