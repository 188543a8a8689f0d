//! The parameter block of a call (`AttnParams`, mirrored in `kernels/attention_params.h`)
//! and the tables it points to.

use super::*;

pub(super) fn dtype_id(dt: DType) -> Result<i32> {
    Ok(match dt {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
        dt => bail!("attention: dtype {dt:?} unsupported on CUDA (f32, bf16, f16)"),
    })
}

pub(super) fn operand(f: OperandFormat) -> OperandFmt {
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

/// The parameter block of one call (device pointers filled in by the caller).
pub(super) fn params(op: &AttentionOp, in_dtype: i32) -> AttnParams {
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
                // the wide variant is refused by the plan before parameters are made
                FusedProbs::U8Code | FusedProbs::U8CodeWide => (0, G_U8, OFF_U8, THR_U8),
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

/// The device copy of the key lengths and, for EFQ's exact-thresholds rule, its log-domain
/// tables, their addresses written into the parameter block, then `zeroed` zero words for the
/// kernels that gather into them (the FP8 V channel amax of the direct V packing). One buffer
/// and one copy per call: each host-to-device copy or memset is a step of its own on the
/// stream, between the previous call's kernel and this call's first (`kernels/NOTES.md` v3
/// items 21, 22). The other rules never read the tables (`efq_table` in
/// `kernels/softmax_algos.cuh`), so they get null pointers.
pub(super) struct Tables {
    buf: CudaSlice<u32>,
    /// Offset of the zeroed words (in words); None where none were asked for.
    zeroed: Option<usize>,
}

impl Tables {
    pub(super) fn upload(
        op: &AttentionOp,
        stream: &Arc<CudaStream>,
        prm: &mut AttnParams,
        zeroed: usize,
    ) -> Result<Self> {
        let w = candle_core::Error::wrap;
        // i32 lengths and f32 tables share one u32 buffer: both are 4-byte words
        let mut words: Vec<u32> = op
            .problem
            .kv_lens
            .iter()
            .map(|&x| x as i32 as u32)
            .collect();
        let exact_thr =
            matches!(&op.cfg.algorithm, Algorithm::Efq(e) if e.rule == EfqRule::ExactThresholds);
        let mut offsets = None;
        if exact_thr {
            let t = exp_mxfp4_thresholds();
            let pow2 = words.len();
            words.extend(t.pow2.iter().map(|x| x.to_bits()));
            let six = words.len();
            words.extend(t.six.iter().map(|x| x.to_bits()));
            let code = words.len();
            words.extend(t.code.iter().flatten().map(|x| x.to_bits()));
            offsets = Some((pow2, six, code));
        }
        let zeroed = (zeroed > 0).then(|| {
            let at = words.len();
            words.resize(at + zeroed, 0);
            at
        });
        if words.is_empty() {
            words.push(0); // no zero-length allocation (a call of no batch entries)
        }
        let buf = stream.clone_htod(&words).map_err(w)?;
        let base = buf.device_ptr(stream).0;
        let at = |i: usize| base + 4 * i as u64;
        // one length per batch entry, first in the buffer
        prm.kv_lens = at(0) as *const i32;
        (prm.thr_pow2, prm.thr_six, prm.thr_code) = match offsets {
            Some((a, b, c)) => (
                at(a) as *const f32,
                at(b) as *const f32,
                at(c) as *const f32,
            ),
            None => (std::ptr::null(), std::ptr::null(), std::ptr::null()),
        };
        Ok(Self { buf, zeroed })
    }

    /// The device address of the zeroed words, or null.
    pub(super) fn zeroed_ptr(&self, stream: &Arc<CudaStream>) -> *mut u32 {
        match self.zeroed {
            Some(i) => (self.buf.device_ptr(stream).0 + 4 * i as u64) as *mut u32,
            None => std::ptr::null_mut(),
        }
    }
}
