//! CUDA side of [`crate::attention::decode`]: the split-KV decode kernel over the cache's
//! own storage (dense or MX codes + E8M0 scales).

use super::ffi::{self, DecodeParams};
use crate::attention::decode::KvOperand;
use crate::attention::AttentionConfig;
use crate::mx::ElemFormat;
use candle_core::cuda_backend::cudarc::driver::DevicePtr;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{bail, DType, Result, Storage, Tensor};
use std::ffi::c_void;

const MX: i32 = 3;

fn dense_kind(dt: DType) -> Option<i32> {
    match dt {
        DType::F32 => Some(0),
        DType::BF16 => Some(1),
        DType::F16 => Some(2),
        _ => None,
    }
}

/// Device address of a contiguous tensor's first element. The kernels run on the
/// device's one stream, after whatever wrote these tensors.
fn ptr(t: &Tensor) -> Result<u64> {
    let (st, l) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*st else {
        bail!("attention_decode: tensors must be on the CUDA device")
    };
    if !l.is_contiguous() {
        bail!("attention_decode: internal error: non-contiguous operand");
    }
    let stream = cs.device.cuda_stream();
    let off = l.start_offset() as u64;
    Ok(match &cs.slice {
        CudaStorageSlice::U8(x) => x.device_ptr(&stream).0 + off,
        CudaStorageSlice::BF16(x) => x.device_ptr(&stream).0 + 2 * off,
        CudaStorageSlice::F16(x) => x.device_ptr(&stream).0 + 2 * off,
        CudaStorageSlice::F32(x) => x.device_ptr(&stream).0 + 4 * off,
        _ => bail!(
            "attention_decode: unsupported storage dtype {:?}",
            t.dtype()
        ),
    })
}

fn fmt_id(e: ElemFormat) -> i32 {
    e as i32
}

/// `None` where the kernel does not take the call (the caller dequantizes instead).
pub(crate) fn attention_decode(
    q: &Tensor,
    k: &KvOperand,
    v: &KvOperand,
    cfg: &AttentionConfig,
) -> Result<Option<Tensor>> {
    let (b, hq, sq, d) = q.dims4()?;
    let Some(q_kind) = dense_kind(q.dtype()) else {
        return Ok(None);
    };
    if d != 128 {
        return Ok(None);
    }
    let q = q.contiguous()?;
    // K: dense, or MX along d over every token
    let mut keep: Vec<Tensor> = vec![];
    let (hkv, n, k_kind, k_fmt, k_p, k_sc) = match k {
        KvOperand::Dense(t) => {
            let (kb, h, n, kd) = t.dims4()?;
            if kb != b || kd != d {
                bail!(
                    "attention_decode: k {:?} does not fit q {:?}",
                    t.dims(),
                    q.dims()
                );
            }
            let Some(kind) = dense_kind(t.dtype()) else {
                return Ok(None);
            };
            let t = t.contiguous()?;
            let p = ptr(&t)?;
            keep.push(t);
            (h, n, kind, 0, p, 0)
        }
        KvOperand::Mx {
            full: Some(m),
            tail: None,
        } if m.dim() == 3 && m.block() == 32 => {
            let (kb, h, n, kd) = m.shape().dims4()?;
            if kb != b || kd != d {
                bail!(
                    "attention_decode: k {:?} does not fit q {:?}",
                    m.shape(),
                    q.dims()
                );
            }
            let (c, s) = (m.codes().contiguous()?, m.scales().contiguous()?);
            let (cp, sp) = (ptr(&c)?, ptr(&s)?);
            keep.extend([c, s]);
            (h, n, MX, fmt_id(m.format()), cp, sp)
        }
        _ => return Ok(None),
    };
    // SAFETY: pure query.
    if unsafe { ffi::mxa_decode_supported(d as i32, hq as i32, hkv as i32, sq as i32) } == 0
        || n < sq
    {
        return Ok(None);
    }
    // V: dense, or MX along the keys over n_full tokens plus a dense tail
    let (v_kind, v_fmt, v_p, v_sc, v_full, v_row_bytes, tail_kind, tail_p) = match v {
        KvOperand::Dense(t) => {
            if t.dims() != [b, hkv, n, d] {
                bail!(
                    "attention_decode: v {:?} differs from k [{b}, {hkv}, {n}, {d}]",
                    t.dims()
                );
            }
            let Some(kind) = dense_kind(t.dtype()) else {
                return Ok(None);
            };
            let t = t.contiguous()?;
            let p = ptr(&t)?;
            keep.push(t);
            (kind, 0, p, 0, 0, 0, 0, 0)
        }
        KvOperand::Mx { full, tail } => {
            let (vf, fmt, vp, vs, row_bytes) = match full {
                Some(m) if m.dim() == 2 && m.block() == 32 => {
                    let nf = m.shape().dims()[2];
                    let (c, s) = (m.codes().contiguous()?, m.scales().contiguous()?);
                    let row_bytes = c.dims()[3];
                    let (cp, sp) = (ptr(&c)?, ptr(&s)?);
                    keep.extend([c, s]);
                    (nf, fmt_id(m.format()), cp, sp, row_bytes)
                }
                Some(_) => return Ok(None),
                None => (0, 0, 0, 0, 0),
            };
            let (tk, tp) = match tail {
                Some(t) => {
                    let Some(kind) = dense_kind(t.dtype()) else {
                        return Ok(None);
                    };
                    let t = t.contiguous()?;
                    let p = ptr(&t)?;
                    keep.push(t);
                    (kind, p)
                }
                None => (0, 0),
            };
            if vf % 32 != 0 || vf > n {
                return Ok(None);
            }
            (MX, fmt, vp, vs, vf, row_bytes, tk, tp)
        }
    };
    // SAFETY: pure query.
    let splits = unsafe { ffi::mxa_decode_splits(n as i32) } as usize;
    // the merge kernel keeps one weight per split in shared memory (MERGE_MAX_SPLITS in
    // kernels/attention_decode.cu): longer contexts (> 512k keys) take the dequantizing path
    if splits > 2048 {
        return Ok(None);
    }
    let rows = b * hq * sq;
    let dev = q.device();
    let out = Tensor::zeros((b, hq, sq, d), q.dtype(), dev)?;
    let part_o = Tensor::zeros((splits, rows, d), DType::F32, dev)?;
    let part_ml = Tensor::zeros((splits, rows, 2), DType::F32, dev)?;
    let softmax_scale = cfg.softmax_scale.unwrap_or(1.0 / (d as f32).sqrt());
    let prm = DecodeParams {
        b: b as i32,
        hq: hq as i32,
        hkv: hkv as i32,
        sq: sq as i32,
        n: n as i32,
        causal: cfg.causal as i32,
        scale_log2: softmax_scale * std::f32::consts::LOG2_E,
        q_dtype: q_kind,
        out_dtype: q_kind,
        k_kind,
        k_fmt,
        v_kind,
        v_fmt,
        v_full: v_full as i32,
        v_row_bytes: v_row_bytes as i32,
        v_tail_kind: tail_kind,
        splits: splits as i32,
        q: ptr(&q)? as *const c_void,
        k: k_p as *const c_void,
        k_sc: k_sc as *const u8,
        v: v_p as *const c_void,
        v_sc: v_sc as *const u8,
        v_tail: tail_p as *const c_void,
        part_o: ptr(&part_o)? as *mut f32,
        part_ml: ptr(&part_ml)? as *mut f32,
        out: ptr(&out)? as *mut c_void,
    };
    let candle_core::Device::Cuda(cd) = dev else {
        bail!("attention_decode: not a CUDA device")
    };
    let stream = cd.cuda_stream();
    // SAFETY: every pointer is a live device allocation (held in `keep`, `q`, `out`,
    // `part_o`, `part_ml`) of the sizes the parameter block describes, on this stream.
    let rc = unsafe { ffi::mxa_attention_decode(&prm, stream.cu_stream() as ffi::Stream) };
    if rc != ffi::MXA_OK {
        bail!("attention_decode: CUDA decode kernel failed (status {rc})");
    }
    drop(keep); // stream-ordered frees: after the kernels
    Ok(Some(out))
}
