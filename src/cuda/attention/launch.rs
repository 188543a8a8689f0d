//! Preparation, packing and launch of a planned call.

use super::*;

/// The f32 operands of the shared preparation (1-element stubs where the plan takes an
/// operand another way).
pub(super) struct Prepared {
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    /// Per-channel FP8 V's codes before their scale, for the tensor-core kernels.
    v_unscaled: CudaSlice<f32>,
    /// Per-channel V: the channel amax, then its scale.
    v_scale: CudaSlice<f32>,
}

pub(super) fn ptr_of(x: &mut CudaSlice<f32>, stream: &Arc<CudaStream>, used: bool) -> *mut f32 {
    if used {
        x.device_ptr_mut(stream).0 as *mut f32
    } else {
        std::ptr::null_mut()
    }
}

/// Runs the preparation the plan asks for: stored codes decoded, inputs rounded to their
/// formats in f32 (operands packed directly are left to the packing).
pub(super) fn prepare(
    plan: &Plan,
    prm: &AttnParams,
    dev: &CudaDevice,
    q: u64,
    [k, v]: [&Operand; 2],
    bad_p: u64,
) -> Result<Prepared> {
    let p = (prm.b * prm.hq * prm.sq * prm.d) as usize;
    let n = (prm.b * prm.hkv * prm.sk * prm.d) as usize;
    // An unused operand gets a 1-element placeholder, left uninitialized (never read).
    let alloc = |used: bool, n: usize| {
        if used {
            dev.alloc_zeros::<f32>(n.max(1))
        } else {
            // SAFETY: never read: the plan takes this operand from elsewhere.
            unsafe { dev.alloc::<f32>(1) }
        }
    };
    let mut x = Prepared {
        q: alloc(plan.q != Source::Direct, p)?,
        k: alloc(plan.k != Source::Direct, n)?,
        v: alloc(plan.v != Source::Direct, n)?,
        v_unscaled: alloc(plan.v_unscaled, n)?,
        // the direct V packing makes its own scales: no buffer (and no fill) for it here
        v_scale: alloc(
            plan.per_channel_v && plan.v != Source::Direct,
            (prm.b * prm.hkv * prm.d) as usize,
        )?,
    };
    let stream = dev.cuda_stream();
    let raw = stream.cu_stream() as ffi::Stream;
    // stored codes straight into the prepared K and V
    for (is_v, x_op, dst) in [(false, k, &mut x.k), (true, v, &mut x.v)] {
        if let Operand::Stored {
            codes,
            scales,
            fmt,
            block,
            ..
        } = x_op
        {
            let keys = if is_v {
                plan.v_stored_keys as i32
            } else {
                prm.d
            };
            let dst = dst.device_ptr_mut(&stream).0 as *mut f32;
            // SAFETY: codes/scales hold the stored operand (b·hkv·sk rows along d, or
            // b·hkv·d channels of `keys` keys); dst the prepared operand's b·hkv·sk·d f32.
            let rc = unsafe {
                ffi::mxa_attention_prep_stored(
                    prm,
                    is_v as i32,
                    *codes as *const u8,
                    *scales as *const u8,
                    *fmt,
                    *block,
                    keys,
                    dst,
                    bad_p as *mut i32,
                    raw,
                )
            };
            check(rc, "stored operand decoding")?;
        }
    }
    // what the preparation reads: the inputs, or V's dense tail after its stored keys
    let k_in = match k {
        Operand::Input(a) => *a,
        Operand::Stored { .. } => 0,
    };
    let v_in = match v {
        Operand::Input(a) => *a,
        Operand::Stored { tail, .. } => tail.unwrap_or(0),
    };
    let v_rest = plan.v == Source::Prepared || (plan.v == Source::Stored && v_in != 0);
    let qp = ptr_of(&mut x.q, &stream, plan.q == Source::Prepared);
    let kp = ptr_of(&mut x.k, &stream, plan.k == Source::Prepared);
    let vp = ptr_of(&mut x.v, &stream, v_rest);
    let vu = ptr_of(&mut x.v_unscaled, &stream, plan.v_unscaled);
    let vs = ptr_of(
        &mut x.v_scale,
        &stream,
        plan.per_channel_v && plan.v != Source::Direct,
    );
    // SAFETY: every non-null pointer is a live device allocation of the sizes the kernels
    // read and write (prm's geometry; V's tail holds sk − v_key0 keys per head), on this
    // stream.
    let rc = unsafe {
        ffi::mxa_attention_prep(
            prm,
            q as *const c_void,
            k_in as *const c_void,
            v_in as *const c_void,
            qp,
            kp,
            vp,
            plan.v_stored_keys as i32,
            vu,
            vs,
            bad_p as *mut i32,
            raw,
        )
    };
    check(rc, "operand preparation")?;
    Ok(x)
}

/// Converts a prepared operand to bf16 for the `mma.sync` kernel.
pub(super) fn to_bf16(
    dev: &CudaDevice,
    x: &CudaSlice<f32>,
    n: usize,
) -> Result<CudaSlice<half::bf16>> {
    let stream = dev.cuda_stream();
    let mut y = dev.alloc_zeros::<half::bf16>(n.max(1))?;
    {
        let (xp, _a) = x.device_ptr(&stream);
        let (yp, _b) = y.device_ptr_mut(&stream);
        // SAFETY: x holds n f32, y n bf16.
        let rc = unsafe {
            ffi::mxa_to_bf16(
                xp as *const f32,
                yp as *mut c_void,
                n as i64,
                stream.cu_stream() as ffi::Stream,
            )
        };
        check(rc, "bf16 conversion")?;
    }
    Ok(y)
}

/// Packs (wgmma) or converts (mma) the operands and launches the plan's kernel; the output
/// `[rows, d]` in the input dtype, or f32 `[rows, d + 1]` with the LSE.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch(
    plan: &Plan,
    prm: &AttnParams,
    op: &AttentionOp,
    dev: &CudaDevice,
    q: u64,
    [k, v]: [&Operand; 2],
    x: &Prepared,
    (rb_p, bad_p, amax_p): (u64, u64, u64),
) -> Result<CudaStorageSlice> {
    let p = &op.problem;
    let stream = dev.cuda_stream();
    let raw = stream.cu_stream() as ffi::Stream;
    let (nq, nk) = (p.b * p.hq * p.sq * p.d, p.b * p.hkv * p.sk * p.d);
    let v_prepared = if plan.v_unscaled { &x.v_unscaled } else { &x.v };
    enum Ready {
        Wgmma(WgmmaInputs),
        Mma([CudaSlice<half::bf16>; 3]),
        Simple,
    }
    let ready = match plan.kernel {
        Kernel::Wgmma { fp8 } => {
            let input = |o: &Operand| match o {
                Operand::Input(a) => *a,
                Operand::Stored { .. } => 0,
            };
            fn src(s: Source, addr: u64, prep: &CudaSlice<f32>) -> Src<'_> {
                if s == Source::Direct {
                    Src::Input(addr)
                } else {
                    Src::Prepared(prep)
                }
            }
            let srcs = [
                src(plan.q, q, &x.q),
                src(plan.k, input(k), &x.k),
                src(plan.v, input(v), v_prepared),
            ];
            let chscale = (plan.v_unscaled).then_some(&x.v_scale);
            Ready::Wgmma(pack_wgmma(
                prm,
                p,
                plan,
                fp8,
                dev,
                srcs,
                chscale,
                (bad_p, amax_p),
            )?)
        }
        Kernel::Mma => Ready::Mma([
            to_bf16(dev, &x.q, nq)?,
            to_bf16(dev, &x.k, nk)?,
            to_bf16(dev, v_prepared, nk)?,
        ]),
        Kernel::Simple => Ready::Simple,
    };
    let rows = p.rows();
    let out_len = rows * (p.d + op.with_lse as usize);
    let (rb, bad) = (rb_p as *mut u64, bad_p as *mut i32);
    macro_rules! launch {
        ($t:ty, $wrap:ident) => {{
            let mut out = if matches!(ready, Ready::Wgmma(_)) {
                // SAFETY: the wgmma kernel writes every row's d channels (0 for a row with
                // no visible key) and its LSE; the other kernels keep a zeroed buffer.
                unsafe { dev.alloc::<$t>(out_len.max(1))? }
            } else {
                dev.alloc_zeros::<$t>(out_len.max(1))?
            };
            {
                let (o_p, _d) = out.device_ptr_mut(&stream);
                let o_p = o_p as *mut c_void;
                // SAFETY: operands of the call's geometry (prepared, converted or packed
                // above); `out` holds rows × (d or d+1) elements of the output dtype.
                let rc = match &ready {
                    Ready::Wgmma(w) => unsafe {
                        let vs = if w.fp8 {
                            w.vscale.device_ptr(&stream).0 as *const f32
                        } else {
                            std::ptr::null()
                        };
                        ffi::mxa_attention_wgmma(
                            prm,
                            w.q.device_ptr(&stream).0 as *const c_void,
                            w.qmul.device_ptr(&stream).0 as *const f32,
                            w.k.device_ptr(&stream).0 as *const c_void,
                            w.kmul.device_ptr(&stream).0 as *const f32,
                            w.vt.device_ptr(&stream).0 as *const c_void,
                            vs,
                            w.sq_pad as i32,
                            w.sk_pad as i32,
                            o_p,
                            rb,
                            bad,
                            raw,
                        )
                    },
                    Ready::Mma([qb, kb, vb]) => unsafe {
                        let vs = if plan.v_unscaled {
                            x.v_scale.device_ptr(&stream).0 as *const f32
                        } else {
                            std::ptr::null()
                        };
                        ffi::mxa_attention_mma(
                            prm,
                            qb.device_ptr(&stream).0 as *const c_void,
                            kb.device_ptr(&stream).0 as *const c_void,
                            vb.device_ptr(&stream).0 as *const c_void,
                            vs,
                            o_p,
                            rb,
                            bad,
                            raw,
                        )
                    },
                    Ready::Simple => unsafe {
                        ffi::mxa_attention_simple(
                            prm,
                            x.q.device_ptr(&stream).0 as *const f32,
                            x.k.device_ptr(&stream).0 as *const f32,
                            x.v.device_ptr(&stream).0 as *const f32,
                            o_p,
                            rb,
                            bad,
                            raw,
                        )
                    },
                };
                check(rc, "attention kernel")?;
            }
            CudaStorageSlice::$wrap(out)
        }};
    }
    Ok(match (op.with_lse, prm.in_dtype) {
        (true, _) | (false, 0) => launch!(f32, F32),
        (false, 1) => launch!(half::bf16, BF16),
        _ => launch!(half::f16, F16),
    })
}

/// Operands of the wgmma kernel: Q and K rows padded to its tiles, Vᵀ, and their scales.
pub(super) struct WgmmaInputs {
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
pub(super) enum Src<'a> {
    /// The attention input itself (device address of the call's dtype), packed in one
    /// pass with its preparation (`mxa_pack_*_direct`).
    Input(u64),
    /// The f32 operand `mxa_attention_prep` wrote.
    Prepared(&'a CudaSlice<f32>),
}

/// Packs Q, K and V for the wgmma kernel: FP8 E4M3 with a power-of-two scale per query
/// row, per 128-key tile and per V channel (or the given per-channel FP8 scales), or bf16
/// for the exact path.
#[allow(clippy::too_many_arguments)]
pub(super) fn pack_wgmma(
    prm: &AttnParams,
    p: &crate::attention::problem::Problem,
    plan: &Plan,
    fp8: bool,
    dev: &CudaDevice,
    [q_src, k_src, v_src]: [Src<'_>; 3],
    chscale: Option<&CudaSlice<f32>>,
    (bad_p, amax_p): (u64, u64),
) -> Result<WgmmaInputs> {
    let stream = &dev.cuda_stream();
    let raw = stream.cu_stream() as ffi::Stream;
    let tiles = capabilities().wgmma;
    let (Some(t), Some((sq_pad, sk_pad))) = (tiles, plan.padded) else {
        bail!("attention: internal error: a wgmma plan without its tiles");
    };
    let (q_block, kt) = (t.rows_per_warpgroup, t.keys_per_tile);
    let es = if fp8 { 1 } else { 2 };
    let (hq, hkv) = (p.b * p.hq, p.b * p.hkv);
    // SAFETY: uninitialized on purpose (a memset of the packed operands cost ≈ 3 % of a
    // 4k call): both packing routes write every padded row of Q, K and Vᵀ and every scale
    // (Q per padded row, K per tile, V per channel: the FP8 routes fill vscale, the BF16
    // kernel never reads it); `compute-sanitizer --tool initcheck` runs on these calls in
    // scripts/gpu_check.sh.
    let (mut q, mut qmul, mut k, mut kmul, mut vt, mut vscale) = unsafe {
        (
            dev.alloc::<u8>((hq * sq_pad * p.d * es).max(1))?,
            dev.alloc::<f32>((hq * sq_pad).max(1))?,
            dev.alloc::<u8>((hkv * sk_pad * p.d * es).max(1))?,
            dev.alloc::<f32>((hkv * sk_pad / kt).max(1))?,
            dev.alloc::<u8>((hkv * sk_pad * p.d * es).max(1))?,
            dev.alloc::<f32>((hkv * p.d).max(1))?,
        )
    };
    {
        let (q_p, _d) = q.device_ptr_mut(stream);
        let (qm_p, _e) = qmul.device_ptr_mut(stream);
        let (k_p, _f) = k.device_ptr_mut(stream);
        let (km_p, _g) = kmul.device_ptr_mut(stream);
        let (vt_p, _h) = vt.device_ptr_mut(stream);
        let (vs_p, _i) = vscale.device_ptr_mut(stream);
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
                            p.d as i32,
                            dst as *mut c_void,
                            scales as *mut f32,
                            raw,
                        )
                    }
                }
            };
            check(rc, what)?;
        }
        // SAFETY: as above, for V (hkv heads × sk keys) and Vᵀ; amax_p, for the FP8 direct
        // route, hkv × d zeroed words of the call's tables (`Tables::upload`).
        let rc = match &v_src {
            Src::Input(x) => unsafe {
                ffi::mxa_pack_v_direct(
                    prm,
                    *x as *const c_void,
                    sk_pad as i32,
                    fp8,
                    vt_p as *mut c_void,
                    vs_p as *mut f32,
                    amax_p as *mut u32,
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
                        p.d as i32,
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
