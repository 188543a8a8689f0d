//! `cuda_fwd` of the attention op: operand preparation and the attention kernel on the
//! tensors' device, with the same semantics (and errors) as the CPU paths.

use super::ffi::{self, AttnParams, OperandFmt};
use crate::attention::config::{
    Algorithm, AttentionConfig, EfqRule, EfqScale, FusedProbs, OperandFormat, ProbFormat,
};
use crate::attention::op::AttentionOp;
use crate::attention::softmax::fused::{G_F32, G_U8, OFF_F32_BITS, OFF_U8, THR_F32, THR_U8};
use crate::attention::softmax::log_thresholds::{exp_mxfp4_thresholds, E2M1_MIDPOINTS};
use crate::attention::{GpuKernel, GpuPath};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop,
};
use candle_core::cuda_backend::{CudaStorage, CudaStorageSlice};
use candle_core::{bail, DType, Layout, Result, Shape};
use std::ffi::c_void;
use std::sync::atomic::Ordering;

fn dtype_id(dt: DType) -> Result<i32> {
    Ok(match dt {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
        dt => bail!("attention: dtype {dt:?} unsupported on CUDA (f32, bf16, f16)"),
    })
}

/// Device address of a contiguous input (its layout's start offset applied).
fn input_ptr<'a>(
    name: &str,
    s: &'a CudaStorage,
    l: &Layout,
    stream: &'a CudaStream,
) -> Result<(u64, SyncOnDrop<'a>)> {
    let Some((start, _)) = l.contiguous_offsets() else {
        bail!("attention: {name} must be contiguous");
    };
    Ok(match &s.slice {
        CudaStorageSlice::F32(x) => {
            let (p, g) = x.device_ptr(stream);
            (p + (start * 4) as u64, g)
        }
        CudaStorageSlice::BF16(x) => {
            let (p, g) = x.device_ptr(stream);
            (p + (start * 2) as u64, g)
        }
        CudaStorageSlice::F16(x) => {
            let (p, g) = x.device_ptr(stream);
            (p + (start * 2) as u64, g)
        }
        _ => bail!("attention: {name} must be f32, bf16 or f16"),
    })
}

fn operand(f: OperandFormat) -> OperandFmt {
    match f {
        OperandFormat::Native => OperandFmt {
            kind: 0,
            ..Default::default()
        },
        OperandFormat::Bf16 => OperandFmt {
            kind: 1,
            ..Default::default()
        },
        OperandFormat::Mx { elem, scale, block } => OperandFmt {
            kind: 2,
            elem: elem as i32,
            scale: scale as i32,
            block: block as i32,
        },
        OperandFormat::PerChannel { elem } => OperandFmt {
            kind: 3,
            elem: elem as i32,
            scale: 0,
            block: 0,
        },
    }
}

/// The GPU kernels take P blocks and EFQ blocks of exactly 32 keys (one warp slot).
fn check_gpu_support(cfg: &AttentionConfig) -> Result<()> {
    if let ProbFormat::Mx { block, .. } = cfg.p_format {
        if block != 32 {
            bail!("attention: on CUDA, MX P blocks must be 32 keys (got {block})");
        }
    }
    if let Algorithm::Efq(e) = &cfg.algorithm {
        if e.block != 32 {
            bail!(
                "attention: on CUDA, EFQ blocks must be 32 keys (got {})",
                e.block
            );
        }
    }
    Ok(())
}

/// The parameter block of one call (device pointers filled in by the caller).
pub(crate) fn params(op: &AttentionOp, in_dtype: i32) -> AttnParams {
    use std::f32::consts::{LN_2, LOG2_E};
    let p = &op.problem;
    let cfg = &op.cfg;
    let prep = crate::cpu::score_prep(cfg, op.softmax_scale);
    let (mut p_kind, mut p_elem, mut p_scale, mut p_block) = (0, 0, 0, 32);
    match cfg.p_format {
        ProbFormat::F32 => {}
        ProbFormat::Mx { elem, scale, block } => {
            (p_kind, p_elem, p_scale, p_block) = (1, elem as i32, scale as i32, block as i32);
        }
        ProbFormat::Fp8 { elem } => (p_kind, p_elem) = (2, elem as i32),
    }
    let (mut algo, mut fused_kind, mut fg, mut foff, mut fthr) = (0, 0, 0.0, 0.0, 0.0);
    let (mut efq_kind, mut efq_scale, mut efq_block, mut efq_tau, mut efq_h) = (0, 0, 32, 0.0, 0.0);
    match &cfg.algorithm {
        Algorithm::Exact => {}
        Algorithm::ExpThenQuantize => algo = 1,
        Algorithm::FusedSoftmax(f) => {
            algo = 2;
            (fused_kind, fg, foff, fthr) = match f.probs {
                FusedProbs::U8Code => (0, G_U8, OFF_U8, THR_U8),
                FusedProbs::Fp32Bits => (1, G_F32, f32::from_bits(OFF_F32_BITS), THR_F32),
                FusedProbs::ExactE4M3 => (2, 1.0, 0.0, (THR_U8 - OFF_U8) / G_U8),
                FusedProbs::ExactF32 => (3, 1.0, 0.0, f32::INFINITY),
            };
        }
        Algorithm::Efq(e) => {
            algo = 3;
            efq_kind = match e.rule {
                EfqRule::Lut => 1,
                EfqRule::ExactThresholds => 2,
                EfqRule::TwoPiece => 3,
                _ => 0,
            };
            efq_scale = match e.scale {
                EfqScale::Efq => 0,
                EfqScale::Floor => 1,
                EfqScale::Rceil => 2,
            };
            efq_block = e.block as i32;
            if let Some((t, h)) = e.rule.tau_h() {
                (efq_tau, efq_h) = (t, h);
            }
        }
    }
    AttnParams {
        b: p.b as i32,
        hq: p.hq as i32,
        hkv: p.hkv as i32,
        sq: p.sq as i32,
        sk: p.sk as i32,
        d: p.d as i32,
        causal: p.causal as i32,
        in_dtype,
        out_dtype: if op.with_lse { 0 } else { in_dtype },
        with_lse: op.with_lse as i32,
        softmax_scale: op.softmax_scale,
        q_scale: prep.q_scale,
        score_scale: prep.score_scale,
        hadamard: prep.hadamard as i32,
        qk: operand(cfg.qk_format),
        v: operand(cfg.v_format),
        algo,
        p_kind,
        p_elem,
        p_scale,
        p_block,
        fused_kind,
        fused_g: fg,
        fused_off: foff,
        fused_thr: fthr,
        efq_kind,
        efq_scale,
        efq_block,
        efq_tau,
        efq_h,
        // the same expressions as the CPU code, evaluated by the same libm
        ln2: LN_2,
        log2e: LOG2_E,
        ln_2_over_9: (2.0f32 / 9.0).ln(),
        ln6: 6f32.ln(),
        log2_6: 6f32.log2(),
        lut_tau: (1.0f32 / 24.0).ln(),
        lut_h: 14.0 / 24f32.ln(),
        log2_075: 0.75f32.log2(),
        log2_125: 1.25f32.log2(),
        hadamard_scale: 1.0 / (p.d as f32).sqrt(),
        log2_mid: E2M1_MIDPOINTS.map(|(t, _)| t.log2()),
        kv_lens: std::ptr::null(),
        thr_pow2: std::ptr::null(),
        thr_six: std::ptr::null(),
        thr_code: std::ptr::null(),
    }
}

fn check(rc: i32, what: &str) -> Result<()> {
    if rc != ffi::MXA_OK {
        bail!("attention: CUDA {what} failed (status {rc})");
    }
    Ok(())
}

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
    let p = &op.problem;
    check_gpu_support(&op.cfg)?;
    if p.d > 512 {
        bail!(
            "attention: head dim {} unsupported on CUDA (at most 512)",
            p.d
        );
    }
    let dev = s1.device.clone();
    let stream = dev.cuda_stream();
    let in_dtype = dtype_id(s1.dtype())?;
    let mut prm = params(op, in_dtype);
    let (q, _gq) = input_ptr("q", s1, l1, &stream)?;
    let (k, _gk) = input_ptr("k", s2, l2, &stream)?;
    let (v, _gv) = input_ptr("v", s3, l3, &stream)?;
    let lens: Vec<i32> = p.kv_lens.iter().map(|&x| x as i32).collect();
    let lens_d = stream.clone_htod(&lens).map_err(candle_core::Error::wrap)?;
    // The exact-thresholds rule reads the log-domain tables; other calls get 1-element stubs.
    let exact_thr =
        matches!(&op.cfg.algorithm, Algorithm::Efq(e) if e.rule == EfqRule::ExactThresholds);
    let (pow2, six, code_flat) = if exact_thr {
        let t = exp_mxfp4_thresholds();
        (
            t.pow2.clone(),
            t.six.clone(),
            t.code.iter().flatten().copied().collect(),
        )
    } else {
        (vec![0f32], vec![0f32], vec![0f32])
    };
    let pow2 = stream.clone_htod(&pow2).map_err(candle_core::Error::wrap)?;
    let six = stream.clone_htod(&six).map_err(candle_core::Error::wrap)?;
    let code = stream
        .clone_htod(&code_flat)
        .map_err(candle_core::Error::wrap)?;
    let (lens_p, _g0) = lens_d.device_ptr(&stream);
    let (pow2_p, _g1) = pow2.device_ptr(&stream);
    let (six_p, _g2) = six.device_ptr(&stream);
    let (code_p, _g3) = code.device_ptr(&stream);
    prm.kv_lens = lens_p as *const i32;
    prm.thr_pow2 = pow2_p as *const f32;
    prm.thr_six = six_p as *const f32;
    prm.thr_code = code_p as *const f32;

    let nq = p.b * p.hq * p.sq * p.d;
    let nk = p.b * p.hkv * p.sk * p.d;
    // SAFETY (both queries): pure functions of the parameter block.
    let wgmma_kind = match op.gpu_path {
        GpuPath::Auto | GpuPath::Wgmma | GpuPath::WgmmaStaged => unsafe {
            ffi::mxa_attention_wgmma_supported(&prm)
        },
        _ => 0,
    };
    // Operands the wgmma kernel takes packed straight from the inputs, skipping the f32
    // preparation (bit 0: Q and K, bit 1: V).
    let direct = if wgmma_kind != 0 && op.gpu_path != GpuPath::WgmmaStaged {
        // SAFETY: a pure function of the parameter block.
        unsafe { ffi::mxa_pack_direct_supported(&prm, (wgmma_kind == 2) as i32) }
    } else {
        0
    };
    let (direct_qk, direct_v) = (direct & 1 != 0, direct & 2 != 0);
    let fast = wgmma_kind == 0
        && op.gpu_path != GpuPath::Simple
        && unsafe { ffi::mxa_attention_mma_supported(&prm) } != 0;
    let per_channel = matches!(op.cfg.v_format, OperandFormat::PerChannel { .. });
    let mut qp = dev.alloc_zeros::<f32>(if direct_qk { 1 } else { nq.max(1) })?;
    let mut kp = dev.alloc_zeros::<f32>(if direct_qk { 1 } else { nk.max(1) })?;
    let mut vp = dev.alloc_zeros::<f32>(if direct_v { 1 } else { nk.max(1) })?;
    // per-channel FP8 V's codes before their scale, for the tensor-core kernels (the
    // one-pass wgmma packing makes them itself)
    let want_unscaled = (fast || wgmma_kind == 2) && per_channel && !direct_v;
    let mut vu = dev.alloc_zeros::<f32>(if want_unscaled { nk.max(1) } else { 1 })?;
    // per-channel V: the prep gathers each channel's amax here, then its scale
    let mut vs = dev.alloc_zeros::<f32>(if per_channel {
        (p.b * p.hkv * p.d).max(1)
    } else {
        1
    })?;
    // The check flags and rollback counter the kernels OR and add into: fresh ones read at
    // the end of the call, or the device's gathered ones for deferred checks.
    let mut fresh;
    let mut gathered;
    let (bad, rollbacks): (&mut CudaSlice<i32>, &mut CudaSlice<u64>) = if op.deferred {
        gathered = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
        let i = match gathered.iter().position(|g| g.device == dev.id()) {
            Some(i) => i,
            None => {
                gathered.push(Gathered {
                    device: dev.id(),
                    bad: dev.alloc_zeros::<i32>(1)?,
                    rollbacks: dev.alloc_zeros::<u64>(1)?,
                    calls: 0,
                });
                gathered.len() - 1
            }
        };
        let g = &mut gathered[i];
        g.calls += 1;
        (&mut g.bad, &mut g.rollbacks)
    } else {
        fresh = (dev.alloc_zeros::<i32>(1)?, dev.alloc_zeros::<u64>(1)?);
        (&mut fresh.0, &mut fresh.1)
    };
    let raw = stream.cu_stream() as ffi::Stream;
    {
        let (qp_p, _a) = qp.device_ptr_mut(&stream);
        let (kp_p, _b) = kp.device_ptr_mut(&stream);
        let (vp_p, _c) = vp.device_ptr_mut(&stream);
        let (vu_p, _e) = vu.device_ptr_mut(&stream);
        let (vs_p, _f) = vs.device_ptr_mut(&stream);
        let (bad_p, _d) = bad.device_ptr_mut(&stream);
        let vu_p = if want_unscaled {
            vu_p as *mut f32
        } else {
            std::ptr::null_mut()
        };
        let vs_p = if per_channel {
            vs_p as *mut f32
        } else {
            std::ptr::null_mut()
        };
        // null: packed from the inputs below instead
        let (qp_p, kp_p) = if direct_qk {
            (std::ptr::null_mut(), std::ptr::null_mut())
        } else {
            (qp_p as *mut f32, kp_p as *mut f32)
        };
        let vp_p = if direct_v {
            std::ptr::null_mut()
        } else {
            vp_p as *mut f32
        };
        // SAFETY: every pointer is a live device allocation of the sizes the kernels read
        // and write (prm's geometry), on this stream.
        let rc = unsafe {
            ffi::mxa_attention_prep(
                &prm,
                q as *const c_void,
                k as *const c_void,
                v as *const c_void,
                qp_p,
                kp_p,
                vp_p,
                vu_p,
                vs_p,
                bad_p as *mut i32,
                raw,
            )
        };
        check(rc, "operand preparation")?;
    }
    let rows = p.rows();
    let out_len = if op.with_lse {
        rows * (p.d + 1)
    } else {
        rows * p.d
    };
    // bf16 copies of the prepared operands for the tensor-core kernel
    let to_bf16 =
        |x: &candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>, n: usize| -> Result<_> {
            let mut y = dev.alloc_zeros::<half::bf16>(n.max(1))?;
            {
                let (xp, _a) = x.device_ptr(&stream);
                let (yp, _b) = y.device_ptr_mut(&stream);
                // SAFETY: x holds n f32, y n bf16.
                check(
                    unsafe { ffi::mxa_to_bf16(xp as *const f32, yp as *mut c_void, n as i64, raw) },
                    "bf16 conversion",
                )?;
            }
            Ok(y)
        };
    let fast_inputs = if fast {
        Some((
            to_bf16(&qp, nq)?,
            to_bf16(&kp, nk)?,
            to_bf16(if want_unscaled { &vu } else { &vp }, nk)?,
        ))
    } else {
        None
    };
    let wgmma_inputs = if wgmma_kind != 0 {
        let (q_src, k_src) = if direct_qk {
            (Src::Input(q), Src::Input(k))
        } else {
            (Src::Prepared(&qp), Src::Prepared(&kp))
        };
        let v_src = match (direct_v, want_unscaled) {
            (true, _) => Src::Input(v),
            (false, true) => Src::Prepared(&vu),
            (false, false) => Src::Prepared(&vp),
        };
        Some(pack_wgmma(
            &prm,
            p,
            wgmma_kind == 2,
            (&dev, &stream, raw),
            [q_src, k_src, v_src],
            want_unscaled.then_some(&vs),
            bad,
        )?)
    } else {
        None
    };
    macro_rules! launch {
        ($t:ty, $wrap:ident) => {{
            let mut out = dev.alloc_zeros::<$t>(out_len.max(1))?;
            {
                let (o_p, _d) = out.device_ptr_mut(&stream);
                let (rb_p, _e) = rollbacks.device_ptr_mut(&stream);
                let rc = if let Some(w) = &wgmma_inputs {
                    let (qb_p, _a) = w.q.device_ptr(&stream);
                    let (qm_p, _b) = w.qmul.device_ptr(&stream);
                    let (kb_p, _c) = w.k.device_ptr(&stream);
                    let (km_p, _f) = w.kmul.device_ptr(&stream);
                    let (vb_p, _g) = w.vt.device_ptr(&stream);
                    let (vs_p, _h) = w.vscale.device_ptr(&stream);
                    let vs_p = if w.fp8 { vs_p as *const f32 } else { std::ptr::null() };
                    let (bad_p, _i) = bad.device_ptr_mut(&stream);
                    // SAFETY: packed operands of the call's geometry (pack_wgmma); `out`
                    // holds rows × (d or d+1) elements of the output dtype.
                    unsafe {
                        ffi::mxa_attention_wgmma(
                            &prm,
                            qb_p as *const c_void,
                            qm_p as *const f32,
                            kb_p as *const c_void,
                            km_p as *const f32,
                            vb_p as *const c_void,
                            vs_p,
                            w.sq_pad as i32,
                            w.sk_pad as i32,
                            o_p as *mut c_void,
                            rb_p as *mut u64,
                            bad_p as *mut i32,
                            raw,
                        )
                    }
                } else if let Some((qb, kb, vb)) = &fast_inputs {
                    let (qb_p, _a) = qb.device_ptr(&stream);
                    let (kb_p, _b) = kb.device_ptr(&stream);
                    let (vb_p, _c) = vb.device_ptr(&stream);
                    let (vs_p, _f) = vs.device_ptr(&stream);
                    let vs_p = if want_unscaled { vs_p as *const f32 } else { std::ptr::null() };
                    let (bad_p, _g) = bad.device_ptr_mut(&stream);
                    // SAFETY: bf16 operands of the call's geometry; `out` holds rows × (d or d+1).
                    unsafe {
                        ffi::mxa_attention_mma(
                            &prm,
                            qb_p as *const c_void,
                            kb_p as *const c_void,
                            vb_p as *const c_void,
                            vs_p,
                            o_p as *mut c_void,
                            rb_p as *mut u64,
                            bad_p as *mut i32,
                            raw,
                        )
                    }
                } else {
                    let (qp_p, _a) = qp.device_ptr(&stream);
                    let (kp_p, _b) = kp.device_ptr(&stream);
                    let (vp_p, _c) = vp.device_ptr(&stream);
                    let (bad_p, _f) = bad.device_ptr_mut(&stream);
                    // SAFETY: as above; `out` holds rows × (d or d+1) elements of the output dtype.
                    unsafe {
                        ffi::mxa_attention_simple(
                            &prm,
                            qp_p as *const f32,
                            kp_p as *const f32,
                            vp_p as *const f32,
                            o_p as *mut c_void,
                            rb_p as *mut u64,
                            bad_p as *mut i32,
                            raw,
                        )
                    }
                };
                check(rc, "attention kernel")?;
            }
            CudaStorageSlice::$wrap(out)
        }};
    }
    let slice = match (op.with_lse, in_dtype) {
        (true, _) | (false, 0) => launch!(f32, F32),
        (false, 1) => launch!(half::bf16, BF16),
        _ => launch!(half::f16, F16),
    };
    if !op.deferred {
        let flags = stream.clone_dtoh(&*bad).map_err(candle_core::Error::wrap)?[0];
        check_flags(flags, "attention")?;
        let rb = stream
            .clone_dtoh(&*rollbacks)
            .map_err(candle_core::Error::wrap)?[0];
        op.stats.rollbacks.fetch_add(rb, Ordering::Relaxed);
    }
    let kernel = if wgmma_kind != 0 {
        GpuKernel::Wgmma {
            direct_qk,
            direct_v,
        }
    } else if fast {
        GpuKernel::Mma
    } else {
        GpuKernel::Simple
    };
    op.stats.gpu_kernel.store(kernel.code(), Ordering::Relaxed);
    let shape = if op.with_lse {
        Shape::from((p.b, p.hq, p.sq, p.d + 1))
    } else {
        Shape::from((p.b, p.hq, p.sq, p.d))
    };
    Ok((CudaStorage { slice, device: dev }, shape))
}

/// The errors the kernels' check flags stand for.
fn check_flags(flags: i32, what: &str) -> Result<()> {
    if flags & 1 != 0 {
        bail!("{what}: q or k holds a non-finite value (NaN or Inf)");
    }
    if flags & 2 != 0 {
        bail!("{what}: v holds a non-finite value (NaN or Inf)");
    }
    if flags & 4 != 0 {
        bail!("{what}: a score overflows f32");
    }
    if flags & 8 != 0 {
        bail!("{what}: internal error: the wgmma kernel's shared memory is not 1024-byte aligned");
    }
    Ok(())
}

/// The check flags and rollbacks of one device's deferred calls since the last check.
struct Gathered {
    device: candle_core::cuda_backend::DeviceId,
    bad: CudaSlice<i32>,
    rollbacks: CudaSlice<u64>,
    calls: u64,
}

static DEFERRED: std::sync::Mutex<Vec<Gathered>> = std::sync::Mutex::new(Vec::new());

/// [`crate::attention::check_device`] on CUDA: reads (a synchronization of the device's
/// stream) and resets the gathered flags and counters.
pub(crate) fn check_deferred(
    dev: &candle_core::cuda_backend::CudaDevice,
) -> Result<crate::attention::DeferredReport> {
    let mut gathered = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
    let Some(g) = gathered.iter_mut().find(|g| g.device == dev.id()) else {
        return Ok(Default::default());
    };
    if g.calls == 0 {
        // nothing gathered since the last check: no read, no synchronization
        return Ok(Default::default());
    }
    let stream = dev.cuda_stream();
    let flags = stream
        .clone_dtoh(&g.bad)
        .map_err(candle_core::Error::wrap)?[0];
    let rollbacks = stream
        .clone_dtoh(&g.rollbacks)
        .map_err(candle_core::Error::wrap)?[0];
    let calls = g.calls;
    stream
        .memset_zeros(&mut g.bad)
        .map_err(candle_core::Error::wrap)?;
    stream
        .memset_zeros(&mut g.rollbacks)
        .map_err(candle_core::Error::wrap)?;
    g.calls = 0;
    check_flags(
        flags,
        &format!("attention (one of the {calls} calls with deferred checks since the last check)"),
    )?;
    Ok(crate::attention::DeferredReport { calls, rollbacks })
}

/// Operands of the wgmma kernel: Q and K rows padded to its tiles, Vᵀ, and their scales.
struct WgmmaInputs {
    fp8: bool,
    sq_pad: usize,
    sk_pad: usize,
    q: CudaSlice<u8>,
    qmul: CudaSlice<f32>,
    k: CudaSlice<u8>,
    kmul: CudaSlice<f32>,
    vt: CudaSlice<u8>,
    vscale: CudaSlice<f32>,
}

/// Where pack_wgmma takes an operand from.
enum Src<'a> {
    /// The attention input itself (device address of the call's dtype), packed in one
    /// pass with its preparation (`mxa_pack_*_direct`).
    Input(u64),
    /// The f32 operand `mxa_attention_prep` wrote.
    Prepared(&'a CudaSlice<f32>),
}

/// Packs Q, K and V for the wgmma kernel: FP8 E4M3 with a power-of-two scale per query
/// row, per 128-key tile and per V channel (or the given per-channel FP8 scales), or bf16
/// for the exact path.
fn pack_wgmma(
    prm: &AttnParams,
    p: &crate::attention::problem::Problem,
    fp8: bool,
    (dev, stream, raw): (
        &candle_core::cuda_backend::CudaDevice,
        &std::sync::Arc<CudaStream>,
        ffi::Stream,
    ),
    [q_src, k_src, v_src]: [Src<'_>; 3],
    chscale: Option<&CudaSlice<f32>>,
    bad: &mut CudaSlice<i32>,
) -> Result<WgmmaInputs> {
    // SAFETY: constant queries.
    let (rows, q_block, kt) = unsafe {
        (
            ffi::mxa_wgmma_rows_per_cta() as usize,
            ffi::mxa_wgmma_rows_per_warpgroup() as usize,
            ffi::mxa_wgmma_keys_per_tile() as usize,
        )
    };
    let es = if fp8 { 1 } else { 2 };
    let sq_pad = p.sq.div_ceil(rows) * rows;
    let sk_pad = p.sk.div_ceil(kt) * kt;
    let (hq, hkv) = (p.b * p.hq, p.b * p.hkv);
    let mut q = dev.alloc_zeros::<u8>((hq * sq_pad * p.d * es).max(1))?;
    let mut qmul = dev.alloc_zeros::<f32>((hq * sq_pad).max(1))?;
    let mut k = dev.alloc_zeros::<u8>((hkv * sk_pad * p.d * es).max(1))?;
    let mut kmul = dev.alloc_zeros::<f32>((hkv * sk_pad / kt).max(1))?;
    let mut vt = dev.alloc_zeros::<u8>((hkv * sk_pad * p.d * es).max(1))?;
    let mut vscale = dev.alloc_zeros::<f32>((hkv * p.d).max(1))?;
    {
        let (q_p, _d) = q.device_ptr_mut(stream);
        let (qm_p, _e) = qmul.device_ptr_mut(stream);
        let (k_p, _f) = k.device_ptr_mut(stream);
        let (km_p, _g) = kmul.device_ptr_mut(stream);
        let (vt_p, _h) = vt.device_ptr_mut(stream);
        let (vs_p, _i) = vscale.device_ptr_mut(stream);
        let (bad_p, _j) = bad.device_ptr_mut(stream);
        let cs = chscale.map(|c| c.device_ptr(stream));
        let cs_p = cs
            .as_ref()
            .map_or(std::ptr::null(), |(x, _)| *x as *const f32);
        let fp8 = fp8 as i32;
        // Q and K: (source, heads, rows, padded rows, destination, scales, is Q)
        let qk = [
            (&q_src, hq, p.sq, sq_pad, q_p, qm_p, true),
            (&k_src, hkv, p.sk, sk_pad, k_p, km_p, false),
        ];
        for (src, heads, n, n_pad, dst, scales, is_q) in qk {
            let what = if is_q { "Q packing" } else { "K packing" };
            // SAFETY: sources hold heads × rows × d values (the input's dtype, or f32 when
            // prepared); destinations were sized above for the padded rows; all on this
            // stream.
            let rc = match src {
                Src::Input(x) => unsafe {
                    ffi::mxa_pack_qk_direct(
                        prm,
                        *x as *const c_void,
                        heads as i64,
                        n as i32,
                        n_pad as i32,
                        is_q as i32,
                        fp8,
                        dst as *mut c_void,
                        scales as *mut f32,
                        bad_p as *mut i32,
                        raw,
                    )
                },
                Src::Prepared(x) => {
                    let (x_p, _x) = x.device_ptr(stream);
                    // group: rows per FP8 scale; tile: rows per packed block
                    let (group, tile) = if is_q { (1, q_block) } else { (kt, kt) };
                    unsafe {
                        ffi::mxa_pack_rows(
                            x_p as *const f32,
                            heads as i64,
                            n as i32,
                            n_pad as i32,
                            group as i32,
                            tile as i32,
                            fp8,
                            dst as *mut c_void,
                            scales as *mut f32,
                            raw,
                        )
                    }
                }
            };
            check(rc, what)?;
        }
        // SAFETY: as above, for V (hkv heads × sk keys) and Vᵀ.
        let rc = match &v_src {
            Src::Input(x) => unsafe {
                ffi::mxa_pack_v_direct(
                    prm,
                    *x as *const c_void,
                    sk_pad as i32,
                    fp8,
                    vt_p as *mut c_void,
                    vs_p as *mut f32,
                    bad_p as *mut i32,
                    raw,
                )
            },
            Src::Prepared(x) => {
                let (x_p, _x) = x.device_ptr(stream);
                unsafe {
                    ffi::mxa_pack_vt(
                        x_p as *const f32,
                        hkv as i64,
                        p.sk as i32,
                        sk_pad as i32,
                        fp8,
                        cs_p,
                        vt_p as *mut c_void,
                        vs_p as *mut f32,
                        raw,
                    )
                }
            }
        };
        check(rc, "V packing")?;
    }
    Ok(WgmmaInputs {
        fp8,
        sq_pad,
        sk_pad,
        q,
        qmul,
        k,
        kmul,
        vt,
        vscale,
    })
}
