//! One attention entry point for every algorithm and format.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use mxattn::attention::{attention, AttentionConfig, OperandFormat, ProbFormat};
//! use mxattn::mx::ElemFormat;
//!
//! let dev = Device::Cpu;
//! let q = Tensor::randn(0f32, 1.0, (1, 4, 64, 128), &dev)?;
//! let k = Tensor::randn(0f32, 1.0, (1, 2, 64, 128), &dev)?; // GQA: 2 KV heads
//! let v = Tensor::randn(0f32, 1.0, (1, 2, 64, 128), &dev)?;
//! let cfg = AttentionConfig::exp_then_quantize(
//!     OperandFormat::mx(ElemFormat::E2M1),   // MXFP4 Q and K
//!     OperandFormat::fp8_per_channel(),      // FP8 V
//!     ProbFormat::mx(ElemFormat::E2M1),      // MXFP4 P
//! )
//! .with_causal(true);
//! let o = attention(&q, &k, &v, &cfg)?;
//! assert_eq!(o.dims(), &[1, 4, 64, 128]);
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! Semantics shared by all algorithms:
//! * q `[b, hq, sq, d]`, k and v `[b, hkv, sk, d]`, hq a multiple of hkv (GQA);
//!   f32, bf16 or f16, the output in the same dtype; arithmetic in f32.
//! * A row whose keys are all masked (causal with sq > kv_len, or a zero key length)
//!   gives O = 0 and LSE = −inf.
//! * NaN or Inf in q, k or v is an error, as is a score that overflows f32.

pub mod config;
pub mod decode;
pub mod hadamard;
pub(crate) mod op;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) mod plan;
pub mod presets;
pub(crate) mod problem;
pub(crate) mod softmax;

pub use crate::cpu::CpuPath;
pub use config::{
    fused_qk_format, Algorithm, AttentionConfig, EfqConfig, EfqRule, EfqScale, FusedProbs,
    FusedSoftmaxConfig, OperandFormat, ProbFormat, KV_TILE,
};
pub use decode::{attention_decode, attention_decode_ext, takes_as_stored, KvOperand};
pub use presets::{preset, Preset, PRESETS};
pub use softmax::efq::{efq_block, EfqBlock};

use crate::mx::pack::pack_granule;
use candle_core::{bail, DType, Result, Tensor};
use op::{AttentionOp, OpStats};
use problem::Problem;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Largest head dim accepted.
pub const MAX_HEAD_DIM: usize = 512;

/// Which CUDA kernel runs (CUDA builds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GpuPath {
    /// The fastest kernel that takes the call: `Wgmma`, else `Mma`, else `Simple`.
    #[default]
    Auto,
    /// The Hopper warpgroup-MMA kernel (head dims 64 and 128; exact softmax on BF16 operands,
    /// Fused-Softmax and exp→E4M3 on FP8 operands) where it takes the call, else `Mma`.
    Wgmma,
    /// `Wgmma` with its operands prepared in f32 first and packed in a second pass (the
    /// preparation the portable kernels share), where `Auto` and `Wgmma` pack them from
    /// the inputs in one pass. Same packed bytes, slower: the reference the one-pass
    /// packing is tested against.
    WgmmaStaged,
    /// The `mma.sync` BF16 tensor-core kernel (head dim 64 or 128) where it takes the
    /// call, else `Simple`.
    Mma,
    /// One warp per query row, the CPU reference's arithmetic step for step: any head dim
    /// up to 512, slow.
    Simple,
}

/// Whether the Hopper wgmma kernel can run on `device` in this build: a CUDA device of
/// compute capability 9.0 (H100, H200) and a build that includes sm_90a code (build.rs,
/// `MXATTN_CUDA_ARCHS`). Elsewhere the calls it would take run on the `mma.sync` kernel, and
/// [`AttentionStats::gpu_kernel`] says so. False on the CPU and in builds without `cuda`.
pub fn wgmma_available(device: &candle_core::Device) -> bool {
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        // SAFETY: reads the current device's attributes; no arguments.
        return unsafe { crate::cuda::ffi::mxa_wgmma_available() } != 0;
    }
    let _ = device;
    false
}

/// Test hook (`tests/gpu.rs`): runs the wgmma kernel's two forms of the Fused-Softmax u8
/// code on `n` generated inputs on the GPU and returns (inputs compared, codes that differ).
/// An error on a CPU device or in a build without `cuda`.
#[doc(hidden)]
pub fn wgmma_u8_code_forms_check(
    device: &candle_core::Device,
    n: usize,
    seed: u32,
) -> Result<(u64, u64)> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = device {
        return crate::cuda::attention::u8_code_forms_check(dev, n, seed);
    }
    let _ = (device, n, seed);
    bail!("the u8 code check runs on a CUDA device")
}

/// Options of one call beyond the config.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    pub cpu_path: CpuPath,
    pub gpu_path: GpuPath,
    /// Also return the log-sum-exp.
    pub lse: bool,
    /// When a CUDA call's checks are read (the CPU checks every call as it runs).
    pub checks: DeviceChecks,
}

/// When a CUDA call's on-device checks (a non-finite q, k or v, a score that overflows f32)
/// and its rollback count reach the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceChecks {
    /// Read at the end of the call, so an error belongs to the call that caused it: one
    /// host synchronization per call (a model's stream stalls there).
    #[default]
    PerCall,
    /// Left on the device and gathered per device, with no synchronization on the call
    /// path; [`check_device`] reads them (and errs if any call since the last check had
    /// bad input). The call's own [`AttentionStats::rollbacks`] reads 0; the total comes
    /// with the check. Calls on the CPU are checked as they run.
    Deferred,
}

/// What the calls with [`DeviceChecks::Deferred`] on a device found since the last check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeferredReport {
    /// Calls gathered.
    pub calls: u64,
    /// Their Fused-Softmax rollbacks, summed.
    pub rollbacks: u64,
}

/// Reads (one synchronization) and resets the gathered checks of `device`'s deferred calls:
/// an error if any of them had a non-finite input or an overflowing score, else their
/// counts. The FP8 linear layers' activation quantization (`mxattn::fused::fp8`, used by
/// `mxattn-fp8` on CUDA) gathers its non-finite-input check here too, and counts as a call.
/// Nothing to read on the CPU (its calls check as they run).
pub fn check_device(device: &candle_core::Device) -> Result<DeferredReport> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(d) = device {
        return crate::cuda::attention::check_deferred(d);
    }
    let _ = device;
    Ok(DeferredReport::default())
}

/// Counters of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttentionStats {
    /// Rows × tiles that left the frozen-max fast path (Fused-Softmax); 0 otherwise.
    pub rollbacks: u64,
    /// The CUDA kernel that ran the call; `None` on the CPU.
    pub gpu_kernel: Option<GpuKernel>,
}

/// Which CUDA kernel ran a call, and for the wgmma kernel how its operands were packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuKernel {
    Simple,
    Mma,
    /// `direct_qk` / `direct_v`: packed straight from the inputs in one pass, else
    /// prepared in f32 and packed in a second (see [`GpuPath::WgmmaStaged`]).
    Wgmma {
        direct_qk: bool,
        direct_v: bool,
    },
}

impl GpuKernel {
    /// One byte, for the op's atomic counter (0 = none). Only the CUDA backend records one.
    #[cfg(any(feature = "cuda", test))]
    pub(crate) fn code(self) -> u8 {
        match self {
            GpuKernel::Simple => 1,
            GpuKernel::Mma => 2,
            GpuKernel::Wgmma {
                direct_qk,
                direct_v,
            } => 3 + direct_qk as u8 + 2 * direct_v as u8,
        }
    }

    pub(crate) fn from_code(c: u8) -> Option<GpuKernel> {
        match c {
            1 => Some(GpuKernel::Simple),
            2 => Some(GpuKernel::Mma),
            3..=6 => Some(GpuKernel::Wgmma {
                direct_qk: (c - 3) & 1 != 0,
                direct_v: (c - 3) & 2 != 0,
            }),
            _ => None,
        }
    }
}

/// Result of [`attention_ext`].
#[derive(Clone, Debug)]
pub struct AttentionOutput {
    /// `[b, hq, sq, d]` in the input dtype.
    pub out: Tensor,
    /// `[b, hq, sq]` f32, natural log of Σ exp(scaled scores), when asked for.
    pub lse: Option<Tensor>,
    pub stats: AttentionStats,
}

/// Attention output `[b, hq, sq, d]`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, cfg: &AttentionConfig) -> Result<Tensor> {
    Ok(attention_ext(q, k, v, cfg, &RunOptions::default())?.out)
}

/// Attention output and the log-sum-exp `[b, hq, sq]` (f32, −inf for fully masked rows).
pub fn attention_with_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cfg: &AttentionConfig,
) -> Result<(Tensor, Tensor)> {
    let r = attention_ext(
        q,
        k,
        v,
        cfg,
        &RunOptions {
            lse: true,
            ..Default::default()
        },
    )?;
    Ok((r.out, r.lse.expect("lse was asked for")))
}

/// Attention with every option and the call's counters.
pub fn attention_ext(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cfg: &AttentionConfig,
    opts: &RunOptions,
) -> Result<AttentionOutput> {
    let problem = validate(q, Meta::of(k), Meta::of(v), cfg)?;
    run_op(q, problem, cfg, opts, None, |q, op| {
        q.apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, op)
    })
}

/// [`attention_ext`] with K and V as [`op::KvInput`]s (stored MX operands decoded, not
/// requantized); `k`/`v` describe them for validation.
pub(crate) fn attention_kv(
    q: &Tensor,
    (k, v): (Meta, Meta),
    kv: [op::KvInput; 2],
    cfg: &AttentionConfig,
    opts: &RunOptions,
) -> Result<AttentionOutput> {
    let problem = validate(q, k, v, cfg)?;
    run_op(q, problem, cfg, opts, Some(kv), |q, op| {
        q.apply_op1_no_bwd(op)
    })
}

/// Builds the op of a validated call, applies it and splits off the LSE.
fn run_op(
    q: &Tensor,
    problem: Problem,
    cfg: &AttentionConfig,
    opts: &RunOptions,
    kv: Option<[op::KvInput; 2]>,
    apply: impl FnOnce(&Tensor, &AttentionOp) -> Result<Tensor>,
) -> Result<AttentionOutput> {
    let supported = q.device().is_cpu() || (cfg!(feature = "cuda") && q.device().is_cuda());
    if !supported {
        bail!(
            "attention: {:?} tensors are not supported by this build (CPU{}); move them to the CPU",
            q.device(),
            if cfg!(feature = "cuda") {
                ", CUDA"
            } else {
                "; build with --features cuda for CUDA"
            }
        );
    }
    let softmax_scale = cfg.softmax_scale.unwrap_or(1.0 / (problem.d as f32).sqrt());
    let stats = Arc::new(OpStats::default());
    let op = AttentionOp {
        cfg: cfg.clone(),
        problem: problem.clone(),
        softmax_scale,
        with_lse: opts.lse,
        cpu_path: opts.cpu_path,
        gpu_path: opts.gpu_path,
        deferred: opts.checks == DeviceChecks::Deferred,
        stats: stats.clone(),
        kv,
    };
    let raw = apply(&q.contiguous()?, &op)?;
    let stats = AttentionStats {
        rollbacks: stats.rollbacks.load(Ordering::Relaxed),
        gpu_kernel: GpuKernel::from_code(stats.gpu_kernel.load(Ordering::Relaxed)),
    };
    if !opts.lse {
        return Ok(AttentionOutput {
            out: raw,
            lse: None,
            stats,
        });
    }
    let d = problem.d;
    let out = raw.narrow(3, 0, d)?.to_dtype(q.dtype())?.contiguous()?;
    let lse = raw.narrow(3, d, 1)?.squeeze(3)?.contiguous()?;
    Ok(AttentionOutput {
        out,
        lse: Some(lse),
        stats,
    })
}

/// What validation needs of a K or V operand: its logical shape, the dtype it represents
/// and its device.
#[derive(Clone, Copy)]
pub(crate) struct Meta<'a> {
    pub dims: &'a [usize],
    pub dtype: DType,
    pub device: &'a candle_core::Device,
}

impl<'a> Meta<'a> {
    fn of(t: &'a Tensor) -> Self {
        Self {
            dims: t.dims(),
            dtype: t.dtype(),
            device: t.device(),
        }
    }
}

fn check_operand_format(name: &str, f: OperandFormat, d: usize, is_v: bool) -> Result<()> {
    match f {
        OperandFormat::Native | OperandFormat::Bf16 => Ok(()),
        OperandFormat::PerChannel { elem } => {
            if !is_v {
                bail!("attention: {name} format {f} is for V only; Q/K take native, bf16 or MX formats");
            }
            if elem.bits() != 8 {
                bail!("attention: per-channel V needs an FP8 element (E4M3 or E5M2), got {elem}");
            }
            Ok(())
        }
        OperandFormat::Mx { elem, block, .. } => {
            let g = pack_granule(elem.bits());
            if block == 0 || !block.is_multiple_of(g) {
                bail!("attention: {name} MX block {block} invalid for {elem} (a positive multiple of {g})");
            }
            if !is_v && !d.is_multiple_of(block) {
                bail!(
                    "attention: head dim {d} is not supported by {name} format {f}: MX blocks run along the head dim, \
                     so it must be a multiple of {block} (e.g. 64, 128, 256)"
                );
            }
            Ok(())
        }
    }
}

/// The formats Fused-Softmax defines (AMD's aiter `mha_v4` rows, plus native/bf16 for
/// studying the softmax alone).
fn check_fused(f: &FusedSoftmaxConfig, cfg: &AttentionConfig, d: usize) -> Result<()> {
    use crate::mx::ElemFormat::*;
    let qk_ok = match cfg.qk_format {
        OperandFormat::Native | OperandFormat::Bf16 => true,
        OperandFormat::Mx { elem, .. } => matches!(elem, E4M3 | E2M3 | E3M2 | E2M1),
        OperandFormat::PerChannel { .. } => false,
    };
    if !qk_ok {
        bail!(
            "attention: Fused-Softmax does not define Q/K format {}; supported: MXFP8 E4M3, MXFP6 E2M3/E3M2,              MXFP4 E2M1 (or native/bf16)",
            cfg.qk_format
        );
    }
    let v_ok = match cfg.v_format {
        OperandFormat::Native | OperandFormat::Bf16 => true,
        OperandFormat::PerChannel { elem } => elem == E4M3,
        OperandFormat::Mx { elem, .. } => matches!(elem, E4M3 | E2M3 | E3M2 | E2M1),
    };
    if !v_ok {
        bail!(
            "attention: Fused-Softmax does not define V format {}; supported: FP8 E4M3 per channel, MXFP8/MXFP6/MXFP4              along keys (or native/bf16)",
            cfg.v_format
        );
    }
    match cfg.p_format {
        ProbFormat::F32 => {}
        ProbFormat::Mx { elem: E2M3 | E3M2 | E2M1, .. } => {}
        p => bail!(
            "attention: Fused-Softmax makes P as FP8 E4M3 codes; p_format must be F32 (keep them) or an MXFP6/MXFP4              re-quantization, got {p}"
        ),
    }
    if f.hadamard && !d.is_power_of_two() {
        bail!(
            "attention: the Hadamard rotation of Fused-Softmax needs a power-of-two head dim (e.g. 64, 128, 256),              got {d}; set hadamard: false"
        );
    }
    Ok(())
}

fn check_efq(e: &EfqConfig, cfg: &AttentionConfig) -> Result<()> {
    if let Some((tau, h)) = e.rule.tau_h() {
        if !tau.is_finite() || !h.is_finite() || h <= 0.0 {
            bail!("attention: EFQ needs a finite τ and a finite h > 0, got τ = {tau}, h = {h}");
        }
    }
    if e.block == 0 || !e.block.is_multiple_of(2) || !KV_TILE.is_multiple_of(e.block) {
        bail!(
            "attention: EFQ block {} must be even and divide the {KV_TILE}-key tile (e.g. 32)",
            e.block
        );
    }
    if cfg.p_format != ProbFormat::F32 {
        bail!(
            "attention: EFQ generates its own block-scaled E2M1 P (EfqConfig.block, .scale); p_format must stay F32, \
             got {}",
            cfg.p_format
        );
    }
    Ok(())
}

/// Shapes, dtypes, devices and config checked; the call's geometry.
fn validate(q: &Tensor, k: Meta, v: Meta, cfg: &AttentionConfig) -> Result<Problem> {
    let qm = Meta::of(q);
    for (n, t) in [("q", qm), ("k", k), ("v", v)] {
        if t.dims.len() != 4 {
            bail!(
                "attention: {n} must have rank 4 ([batch, heads, seq, head_dim]), got shape {:?}",
                t.dims
            );
        }
        if !matches!(t.dtype, DType::F32 | DType::BF16 | DType::F16) {
            bail!(
                "attention: {n} has dtype {:?}; expected f32, bf16 or f16",
                t.dtype
            );
        }
    }
    if k.dtype != q.dtype() || v.dtype != q.dtype() {
        bail!(
            "attention: q, k, v must share a dtype, got {:?}, {:?}, {:?}",
            q.dtype(),
            k.dtype,
            v.dtype
        );
    }
    if !q.device().same_device(k.device) || !q.device().same_device(v.device) {
        bail!("attention: q, k, v must be on one device");
    }
    let (b, hq, sq, d) = q.dims4()?;
    let [bk, hkv, sk, dk] = [k.dims[0], k.dims[1], k.dims[2], k.dims[3]];
    if k.dims != v.dims {
        bail!(
            "attention: k {:?} and v {:?} must have the same shape",
            k.dims,
            v.dims
        );
    }
    if bk != b {
        bail!("attention: batch of q ({b}) and k/v ({bk}) differ");
    }
    if dk != d {
        bail!("attention: head dim of q ({d}) and k/v ({dk}) differ");
    }
    if d == 0 || d > MAX_HEAD_DIM {
        bail!("attention: head dim {d} unsupported (1..={MAX_HEAD_DIM})");
    }
    if hkv == 0 || !hq.is_multiple_of(hkv) {
        bail!("attention: query heads ({hq}) must be a multiple of key/value heads ({hkv})");
    }
    let kv_lens = match &cfg.key_lengths {
        None => vec![sk; b],
        Some(l) => {
            if l.len() != b {
                bail!(
                    "attention: key_lengths has {} entries for batch {b}",
                    l.len()
                );
            }
            if let Some((i, n)) = l.iter().enumerate().find(|(_, n)| **n > sk) {
                bail!("attention: key_lengths[{i}] = {n} exceeds the key count {sk}");
            }
            l.clone()
        }
    };
    if let Some(s) = cfg.softmax_scale {
        if !s.is_finite() || s == 0.0 {
            bail!("attention: softmax_scale must be finite and non-zero, got {s}");
        }
    }
    check_operand_format("Q/K", cfg.qk_format, d, false)?;
    check_operand_format("V", cfg.v_format, d, true)?;
    match &cfg.algorithm {
        Algorithm::FusedSoftmax(f) => check_fused(f, cfg, d)?,
        Algorithm::Efq(e) => check_efq(e, cfg)?,
        _ => {}
    }
    match (&cfg.algorithm, cfg.p_format) {
        (Algorithm::Exact, p) if p != ProbFormat::F32 => {
            bail!("attention: the exact algorithm keeps P in f32 (got p format {p}); use ExpThenQuantize")
        }
        (_, ProbFormat::Mx { elem, block, .. }) => {
            let g = pack_granule(elem.bits());
            if block == 0 || !block.is_multiple_of(g) || !KV_TILE.is_multiple_of(block) {
                bail!("attention: P MX block {block} invalid for {elem}: it must divide the {KV_TILE}-key tile and be a multiple of {g}");
            }
        }
        (_, ProbFormat::Fp8 { elem }) if elem.bits() != 8 => {
            bail!("attention: P format Fp8 needs an 8-bit element (E4M3 or E5M2), got {elem}")
        }
        _ => {}
    }
    Ok(Problem {
        b,
        hq,
        hkv,
        sq,
        sk,
        d,
        kv_lens,
        causal: cfg.causal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte stored in the op's counter decodes to the kernel that stored it, and 0
    /// (the counter's initial value, what CPU calls leave) decodes to none.
    #[test]
    fn gpu_kernel_codes_round_trip() {
        let mut all = vec![GpuKernel::Simple, GpuKernel::Mma];
        for direct_qk in [false, true] {
            for direct_v in [false, true] {
                all.push(GpuKernel::Wgmma {
                    direct_qk,
                    direct_v,
                });
            }
        }
        for k in all {
            assert_ne!(k.code(), 0, "{k:?}: 0 means no kernel ran");
            assert_eq!(GpuKernel::from_code(k.code()), Some(k));
        }
        assert_eq!(GpuKernel::from_code(0), None);
    }
}
