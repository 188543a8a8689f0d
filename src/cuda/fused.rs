//! CUDA side of [`crate::fused`]: launches of `kernels/{ada_layer_norm, split_heads,
//! bias_residual, bias_gelu}.cu` on the device's stream.

use super::ffi;
use crate::fused::{
    AdaLayerNormOp, BiasGeluOp, BiasResidualOp, MergeHeadsOp, RowParam, SplitHeadsOp,
};
use candle_core::cuda_backend::cudarc::driver::DevicePtr;
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice};
use candle_core::{bail, DType, Layout, Result, Shape, Storage, Tensor};
use std::ffi::c_void;

fn dtype_code(dt: DType) -> Result<i32> {
    Ok(match dt {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
        dt => bail!("fused op: dtype {dt:?} unsupported on CUDA (f32, bf16, f16)"),
    })
}

/// Address of element `offset` of a float storage. The kernels run on the device's one stream,
/// after whatever wrote these buffers, so the access guards are not kept.
fn slice_addr(s: &CudaStorage, offset: usize) -> Result<u64> {
    let stream = s.device.cuda_stream();
    Ok(match &s.slice {
        CudaStorageSlice::F32(x) => x.device_ptr(&stream).0 + 4 * offset as u64,
        CudaStorageSlice::BF16(x) => x.device_ptr(&stream).0 + 2 * offset as u64,
        CudaStorageSlice::F16(x) => x.device_ptr(&stream).0 + 2 * offset as u64,
        _ => bail!("fused op: storage must be f32, bf16 or f16"),
    })
}

/// The main input: contiguous, its address and dtype code.
fn input(op: &str, s: &CudaStorage, l: &Layout) -> Result<(u64, i32)> {
    let Some((start, _)) = l.contiguous_offsets() else {
        bail!("{op}: internal error: non-contiguous input")
    };
    let dt = match &s.slice {
        CudaStorageSlice::F32(_) => DType::F32,
        CudaStorageSlice::BF16(_) => DType::BF16,
        CudaStorageSlice::F16(_) => DType::F16,
        _ => bail!("{op}: dtype unsupported on CUDA (f32, bf16, f16)"),
    };
    Ok((slice_addr(s, start)?, dtype_code(dt)?))
}

/// Address of an auxiliary tensor's first element (on this device).
fn aux_addr(op: &str, t: &Tensor) -> Result<u64> {
    let (st, l) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*st else {
        bail!("{op}: all tensors must be on the CUDA device")
    };
    slice_addr(cs, l.start_offset())
}

fn opt_addr(op: &str, t: Option<&Tensor>) -> Result<u64> {
    t.map_or(Ok(0), |t| aux_addr(op, t))
}

/// (rows address, s_b, s_n, added vector address or 0).
fn row_param(op: &str, p: Option<&RowParam>) -> Result<(u64, i64, i64, u64)> {
    match p {
        Some(p) => Ok((
            aux_addr(op, &p.t)?,
            p.s_b as i64,
            p.s_n as i64,
            opt_addr(op, p.add.as_ref())?,
        )),
        None => Ok((0, 0, 0, 0)),
    }
}

/// An uninitialized output of `len` elements (every kernel writes all of them).
fn alloc_out(dev: &CudaDevice, code: i32, len: usize) -> Result<CudaStorage> {
    // SAFETY: the kernel that receives the buffer writes every element before any read.
    let slice = unsafe {
        match code {
            0 => CudaStorageSlice::F32(dev.alloc::<f32>(len)?),
            1 => CudaStorageSlice::BF16(dev.alloc::<half::bf16>(len)?),
            _ => CudaStorageSlice::F16(dev.alloc::<half::f16>(len)?),
        }
    };
    Ok(CudaStorage {
        slice,
        device: dev.clone(),
    })
}

fn check(op: &str, rc: i32) -> Result<()> {
    if rc != ffi::MXA_OK {
        bail!("{op}: CUDA kernel failed (status {rc})");
    }
    Ok(())
}

fn stream_of(dev: &CudaDevice) -> ffi::Stream {
    dev.cuda_stream().cu_stream() as ffi::Stream
}

/// Runs `launch(input, dtype code, output, elements, stream)`, the kernel's status out, into a
/// new output of the input's shape and dtype.
fn into_new_output(
    op: &str,
    s: &CudaStorage,
    l: &Layout,
    launch: impl FnOnce(u64, i32, u64, usize, ffi::Stream) -> Result<i32>,
) -> Result<(CudaStorage, Shape)> {
    let (x, code) = input(op, s, l)?;
    let len = l.shape().elem_count();
    let out = alloc_out(&s.device, code, len)?;
    let y = slice_addr(&out, 0)?;
    check(op, launch(x, code, y, len, stream_of(&s.device))?)?;
    Ok((out, l.shape().clone()))
}

pub(crate) fn ada_layer_norm(
    op: &AdaLayerNormOp,
    s: &CudaStorage,
    l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "ada_layer_norm";
    let (w, b) = match &op.affine {
        Some((w, b)) => (aux_addr(OP, w)?, aux_addr(OP, b)?),
        None => (0, 0),
    };
    let (sh, sh_b, sh_n, sh_add) = row_param(OP, op.modulation.as_ref().map(|m| &m.0))?;
    let (sc, sc_b, sc_n, sc_add) = row_param(OP, op.modulation.as_ref().map(|m| &m.1))?;
    into_new_output(OP, s, l, |x, code, y, len, stream| {
        // SAFETY: x and y hold rows·d elements of the dtype `code`; w, b hold d f32; shift and
        // scale rows are addressed within their tensors by the strides RowParam checked, their
        // added vectors hold d f32.
        Ok(unsafe {
            ffi::mxa_ada_layer_norm(
                x as *const c_void,
                y as *mut c_void,
                code,
                (len / op.d) as i64,
                op.n as i64,
                op.d as i64,
                w as *const f32,
                b as *const f32,
                sh as *const f32,
                sh_b,
                sh_n,
                sh_add as *const f32,
                sc as *const f32,
                sc_b,
                sc_n,
                sc_add as *const f32,
                op.eps,
                stream,
            )
        })
    })
}

pub(crate) fn split_heads(
    op: &SplitHeadsOp,
    s: &CudaStorage,
    l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "split_heads";
    let bias = opt_addr(OP, op.bias.as_ref())?;
    let w = opt_addr(OP, op.rms_weight.as_ref())?;
    let (c, sn) = match &op.rope {
        Some((c, sn)) => (aux_addr(OP, c)?, aux_addr(OP, sn)?),
        None => (0, 0),
    };
    let d = op.heads * op.hd;
    into_new_output(OP, s, l, |t, code, y, len, stream| {
        // SAFETY: t and y hold rows·d elements; bias and w hold d elements of t's dtype; cos
        // and sin hold n·hd/2 f32.
        Ok(unsafe {
            ffi::mxa_split_heads(
                t as *const c_void,
                y as *mut c_void,
                code,
                (len / d) as i64,
                op.n as i64,
                op.heads as i64,
                op.hd as i64,
                bias as *const c_void,
                w as *const c_void,
                op.eps,
                c as *const f32,
                sn as *const f32,
                stream,
            )
        })
    })
}

pub(crate) fn bias_residual(
    op: &BiasResidualOp,
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "bias_residual";
    let (y, code2) = input(OP, s2, l2)?;
    let bias = opt_addr(OP, op.bias.as_ref())?;
    let (g, g_b, g_n, g_add) = row_param(OP, op.gate.as_ref())?;
    into_new_output(OP, s1, l1, |x, code, o, len, stream| {
        if code != code2 {
            bail!("{OP}: x and y must have one dtype");
        }
        // SAFETY: x, y and out hold rows·d elements; bias d; gate rows addressed by checked
        // strides, its added vector d f32.
        Ok(unsafe {
            ffi::mxa_bias_residual(
                x as *const c_void,
                y as *const c_void,
                o as *mut c_void,
                code,
                (len / op.d) as i64,
                op.n as i64,
                op.d as i64,
                bias as *const c_void,
                g as *const f32,
                g_b,
                g_n,
                g_add as *const f32,
                stream,
            )
        })
    })
}

pub(crate) fn bias_gelu(
    op: &BiasGeluOp,
    s: &CudaStorage,
    l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "bias_gelu";
    let bias = opt_addr(OP, op.bias.as_ref())?;
    into_new_output(OP, s, l, |t, code, o, len, stream| {
        // SAFETY: t and out hold rows·d elements, bias d.
        Ok(unsafe {
            ffi::mxa_bias_gelu(
                t as *const c_void,
                o as *mut c_void,
                code,
                (len / op.d) as i64,
                op.d as i64,
                bias as *const c_void,
                stream,
            )
        })
    })
}

pub(crate) fn merge_heads(
    op: &MergeHeadsOp,
    s: &CudaStorage,
    l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    into_new_output("merge_heads", s, l, |o, code, y, len, stream| {
        // SAFETY: o and y hold b·heads·n·hd elements of the dtype `code`.
        Ok(unsafe {
            ffi::mxa_merge_heads(
                o as *const c_void,
                y as *mut c_void,
                code,
                (len / (op.heads * op.hd)) as i64,
                op.n as i64,
                op.heads as i64,
                op.hd as i64,
                stream,
            )
        })
    })
}
