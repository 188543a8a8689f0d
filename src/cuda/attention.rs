//! `cuda_fwd` of the attention op: a leaf that runs the plan `attention/plan.rs` makes for a
//! call, with the same semantics (and errors) as the CPU paths. [`run`] reads as a call goes:
//! plan, parameter block and tables, checks buffer, preparation (stored codes decoded, inputs
//! rounded in f32), packing and launch (`launch.rs`), the check (`checks.rs`).

mod checks;
mod launch;
mod params;

use checks::Checks;
pub(crate) use checks::{check_deferred, deferred_flags_addr};
use launch::{launch, prepare};
use params::{dtype_id, params, Tables};

use super::ffi::{self, AttnParams, OperandFmt};
use crate::attention::config::{
    Algorithm, EfqRule, EfqScale, FusedProbs, OperandFormat, ProbFormat,
};
use crate::attention::op::{AttentionOp, KvInput};
use crate::attention::plan::{self, Capabilities, Kernel, Plan, Source, WgmmaTiles};
use crate::attention::softmax::fused::{G_F32, G_U8, OFF_F32_BITS, OFF_U8, THR_F32, THR_U8};
use crate::attention::softmax::log_thresholds::{exp_mxfp4_thresholds, E2M1_MIDPOINTS};
use crate::attention::{GpuKernel, GpuPath};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice};
use candle_core::{bail, DType, Layout, Result, Shape};
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Device address of a contiguous input (its layout's start offset applied). The op runs
/// on the device's one stream, after whatever wrote its inputs.
fn input_ptr(name: &str, s: &CudaStorage, l: &Layout, stream: &Arc<CudaStream>) -> Result<u64> {
    let Some((start, _)) = l.contiguous_offsets() else {
        bail!("attention: {name} must be contiguous");
    };
    Ok(match &s.slice {
        CudaStorageSlice::F32(x) => x.device_ptr(stream).0 + (start * 4) as u64,
        CudaStorageSlice::BF16(x) => x.device_ptr(stream).0 + (start * 2) as u64,
        CudaStorageSlice::F16(x) => x.device_ptr(stream).0 + (start * 2) as u64,
        _ => bail!("attention: {name} must be f32, bf16 or f16"),
    })
}

fn check(rc: i32, what: &str) -> Result<()> {
    if rc != ffi::MXA_OK {
        bail!("attention: CUDA {what} failed (status {rc})");
    }
    Ok(())
}

/// The wgmma kernel's two forms of the Fused-Softmax u8 code (the general one and the
/// common case's scaled FFMA with saturation) on `n` generated inputs, on the GPU:
/// (inputs compared, codes that differ). See `mxa_wgmma_u8_code_check`.
pub(crate) fn u8_code_forms_check(dev: &CudaDevice, n: usize, seed: u32) -> Result<(u64, u64)> {
    let stream = dev.cuda_stream();
    let mut counts = dev.alloc_zeros::<u64>(2)?;
    {
        let (cp, _g) = counts.device_ptr_mut(&stream);
        // SAFETY: counts holds two u64 on this device; the kernel adds to them.
        let rc = unsafe {
            ffi::mxa_wgmma_u8_code_check(
                n as i64,
                seed,
                G_U8,
                THR_U8,
                cp as *mut u64,
                stream.cu_stream() as ffi::Stream,
            )
        };
        check(rc, "u8 code check")?;
    }
    let c = stream
        .clone_dtoh(&counts)
        .map_err(candle_core::Error::wrap)?;
    Ok((c[0], c[1]))
}

/// What this device and build run, for the plan.
fn capabilities() -> Capabilities {
    // SAFETY: constant queries, and one of the current device's attributes.
    let wgmma = unsafe {
        (ffi::mxa_wgmma_available() != 0).then(|| WgmmaTiles {
            // kernels/attention_wgmma.cu is instantiated for these; check_plan holds it to that
            head_dims: &[64, 128],
            rows_per_cta: ffi::mxa_wgmma_rows_per_cta() as usize,
            rows_per_warpgroup: ffi::mxa_wgmma_rows_per_warpgroup() as usize,
            keys_per_tile: ffi::mxa_wgmma_keys_per_tile() as usize,
        })
    };
    Capabilities {
        wgmma,
        // kernels/attention_mma.cu is instantiated for these; check_plan holds it to that
        mma_head_dims: &[64, 128],
        max_head_dim: crate::attention::MAX_HEAD_DIM,
    }
}

/// The plan against the kernels' own predicates: the kernel the plan names must be the one
/// they would take, and a one-pass packing must be one they support. A disagreement is a
/// bug between `attention/plan.rs` and `kernels/`, reported instead of launched.
fn check_plan(plan: &Plan, prm: &AttnParams, path: GpuPath) -> Result<()> {
    // SAFETY: pure functions of the parameter block.
    let (wgmma, mma) = unsafe {
        (
            ffi::mxa_attention_wgmma_supported(prm),
            ffi::mxa_attention_mma_supported(prm),
        )
    };
    let wgmma = match path {
        GpuPath::Auto | GpuPath::Wgmma | GpuPath::WgmmaStaged => wgmma,
        _ => 0,
    };
    let kernels = match (wgmma, path) {
        (1, _) => Kernel::Wgmma { fp8: false },
        (2, _) => Kernel::Wgmma { fp8: true },
        (_, GpuPath::Simple) => Kernel::Simple,
        _ if mma != 0 => Kernel::Mma,
        _ => Kernel::Simple,
    };
    let mut ok = kernels == plan.kernel;
    if let Kernel::Wgmma { fp8 } = plan.kernel {
        // SAFETY: as above.
        let direct = unsafe { ffi::mxa_pack_direct_supported(prm, fp8 as i32) };
        ok &= plan.q != Source::Direct || direct & 1 != 0;
        ok &= plan.v != Source::Direct || direct & 2 != 0;
    }
    if !ok {
        bail!(
            "attention: internal error: the plan ({plan:?}) disagrees with the kernels (wgmma {wgmma}, mma {mma})"
        );
    }
    Ok(())
}

/// K or V of a call as the device holds it (device addresses; the tensors behind them
/// outlive the call).
enum Operand {
    /// A contiguous tensor of the call's dtype.
    Input(u64),
    /// MX codes and E8M0 scales as stored, in the config's format (or for a native one, any
    /// MX format), and V's dense tail.
    Stored {
        codes: u64,
        scales: u64,
        fmt: i32,
        block: i32,
        tail: Option<u64>,
    },
}

/// Device address of a contiguous CUDA tensor's first element.
fn tensor_ptr(name: &str, t: &candle_core::Tensor) -> Result<u64> {
    let (st, l) = t.storage_and_layout();
    let candle_core::Storage::Cuda(cs) = &*st else {
        bail!("attention: {name} is not on the CUDA device like q");
    };
    let stream = cs.device.cuda_stream();
    let Some((start, _)) = l.contiguous_offsets() else {
        bail!("attention: internal error: {name} is not contiguous");
    };
    let off = start as u64;
    Ok(match &cs.slice {
        CudaStorageSlice::U8(x) => x.device_ptr(&stream).0 + off,
        CudaStorageSlice::BF16(x) => x.device_ptr(&stream).0 + 2 * off,
        CudaStorageSlice::F16(x) => x.device_ptr(&stream).0 + 2 * off,
        CudaStorageSlice::F32(x) => x.device_ptr(&stream).0 + 4 * off,
        _ => bail!("attention: {name} has unsupported dtype {:?}", t.dtype()),
    })
}

/// `cuda_fwd` of the three-input op: q, k and v as tensors.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cuda_fwd(
    op: &AttentionOp,
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
    s3: &CudaStorage,
    l3: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let stream = s1.device.cuda_stream();
    let q = input_ptr("q", s1, l1, &stream)?;
    let k = Operand::Input(input_ptr("k", s2, l2, &stream)?);
    let v = Operand::Input(input_ptr("v", s3, l3, &stream)?);
    run(op, &s1.device, dtype_id(s1.dtype())?, q, [k, v])
}

/// `cuda_fwd` of the op on q alone, K and V held by the op (stored codes or tensors).
pub(crate) fn cuda_fwd_kv(
    op: &AttentionOp,
    s1: &CudaStorage,
    l1: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let Some(kv) = &op.kv else {
        bail!("attention: internal error: K and V missing");
    };
    let stream = s1.device.cuda_stream();
    let q = input_ptr("q", s1, l1, &stream)?;
    let operand = |name: &str, x: &KvInput| -> Result<Operand> {
        Ok(match x {
            KvInput::Dense(t) => Operand::Input(tensor_ptr(name, t)?),
            KvInput::Stored { full, tail } => Operand::Stored {
                codes: tensor_ptr(name, full.codes())?,
                scales: tensor_ptr(name, full.scales())?,
                fmt: full.format() as i32,
                block: full.block() as i32,
                tail: tail.as_ref().map(|t| tensor_ptr(name, t)).transpose()?,
            },
        })
    };
    let (k, v) = (operand("k", &kv[0])?, operand("v", &kv[1])?);
    run(op, &s1.device, dtype_id(s1.dtype())?, q, [k, v])
}

/// One call: plan, prepare, pack, launch, check.
fn run(
    op: &AttentionOp,
    dev: &CudaDevice,
    in_dtype: i32,
    q: u64,
    [k, v]: [Operand; 2],
) -> Result<(CudaStorage, Shape)> {
    let p = &op.problem;
    let stream = dev.cuda_stream();
    let plan = plan::plan(
        p,
        &op.cfg,
        op.gpu_path,
        &capabilities(),
        KvInput::stored(&op.kv),
    )?;
    let mut prm = params(op, in_dtype);
    check_plan(&plan, &prm, op.gpu_path)?;
    // the FP8 direct V packing gathers each channel's amax into zeroed words
    let v_amax = match plan.kernel {
        Kernel::Wgmma { fp8: true } if plan.v == Source::Direct => p.b * p.hkv * p.d,
        _ => 0,
    };
    // kept alive until the launches are queued (stream-ordered frees after them)
    let tables = Tables::upload(op, &stream, &mut prm, v_amax)?;
    let mut checks = Checks::take(op, dev)?;
    let (rb_p, bad_p) = checks.ptrs(&stream);
    let prepared = prepare(&plan, &prm, dev, q, [&k, &v], bad_p)?;
    let amax_p = tables.zeroed_ptr(&stream) as u64;
    let slice = launch(
        &plan,
        &prm,
        op,
        dev,
        q,
        [&k, &v],
        &prepared,
        (rb_p, bad_p, amax_p),
    )?;
    checks.finish(op, &stream)?;
    let kernel = match plan.kernel {
        Kernel::Wgmma { .. } => GpuKernel::Wgmma {
            direct_qk: plan.q == Source::Direct,
            direct_v: plan.v == Source::Direct,
        },
        Kernel::Mma => GpuKernel::Mma,
        Kernel::Simple => GpuKernel::Simple,
    };
    op.stats.gpu_kernel.store(kernel.code(), Ordering::Relaxed);
    let shape = if op.with_lse {
        Shape::from((p.b, p.hq, p.sq, p.d + 1))
    } else {
        Shape::from((p.b, p.hq, p.sq, p.d))
    };
    Ok((
        CudaStorage {
            slice,
            device: dev.clone(),
        },
        shape,
    ))
}
