//! MX quantize / dequantize on the GPU, as Candle custom ops (codes and scales packed
//! into one `U8` output row `[codes… | scales…]`, split by the caller).

use super::ffi;
use crate::mx::{ElemFormat, ScaleMode};
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::{CudaStorage, CudaStorageSlice};
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape};
use std::ffi::c_void;

pub(crate) struct QuantizeOp {
    pub fmt: ElemFormat,
    pub mode: ScaleMode,
    pub block: usize,
    /// rows × n input (quantized dim last), row_bytes of codes and nb scales per row
    pub rows: usize,
    pub n: usize,
    pub row_bytes: usize,
    pub nb: usize,
}

impl CustomOp1 for QuantizeOp {
    fn name(&self) -> &'static str {
        "mxattn-mx-quantize"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("mx-quantize op is the CUDA path; CPU tensors take mx::quantize's CPU code")
    }
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = s.device.clone();
        let stream = dev.cuda_stream();
        let Some((start, _)) = l.contiguous_offsets() else {
            bail!("mx::quantize: input must be contiguous")
        };
        let (ptr, dtype, _g) = match &s.slice {
            CudaStorageSlice::F32(x) => {
                let (p, g) = x.device_ptr(&stream);
                (p + 4 * start as u64, 0, g)
            }
            CudaStorageSlice::BF16(x) => {
                let (p, g) = x.device_ptr(&stream);
                (p + 2 * start as u64, 1, g)
            }
            CudaStorageSlice::F16(x) => {
                let (p, g) = x.device_ptr(&stream);
                (p + 2 * start as u64, 2, g)
            }
            _ => bail!("mx::quantize on CUDA takes f32, bf16 or f16"),
        };
        let w = self.row_bytes + self.nb;
        let mut out = dev.alloc_zeros::<u8>((self.rows * w).max(1))?;
        {
            let (o, _a) = out.device_ptr_mut(&stream);
            // SAFETY: input holds rows×n elements; `out` holds rows × (row_bytes + nb) bytes,
            // codes at the start of each row and scales after them.
            let rc = unsafe {
                ffi::mxa_mx_quantize(
                    ptr as *const c_void,
                    dtype,
                    self.rows as i64,
                    self.n as i64,
                    self.fmt as i32,
                    self.mode as i32,
                    self.block as i32,
                    o as *mut u8,
                    w as i64,
                    (o + self.row_bytes as u64) as *mut u8,
                    w as i64,
                    stream.cu_stream() as ffi::Stream,
                )
            };
            if rc != ffi::MXA_OK {
                bail!("mx::quantize: CUDA kernel failed (status {rc})");
            }
        }
        Ok((
            CudaStorage {
                slice: CudaStorageSlice::U8(out),
                device: dev,
            },
            Shape::from((self.rows, w)),
        ))
    }
}

pub(crate) struct DequantizeOp {
    pub fmt: ElemFormat,
    pub block: usize,
    pub rows: usize,
    pub n: usize,
}

impl CustomOp2 for DequantizeOp {
    fn name(&self) -> &'static str {
        "mxattn-mx-dequantize"
    }
    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("mx-dequantize op is the CUDA path")
    }
    fn cuda_fwd(
        &self,
        c: &CudaStorage,
        lc: &Layout,
        s: &CudaStorage,
        ls: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = c.device.clone();
        let stream = dev.cuda_stream();
        let (Some((c0, _)), Some((s0, _))) = (lc.contiguous_offsets(), ls.contiguous_offsets())
        else {
            bail!("mx dequantize: codes and scales must be contiguous")
        };
        let (CudaStorageSlice::U8(cs), CudaStorageSlice::U8(ss)) = (&c.slice, &s.slice) else {
            bail!("mx dequantize: codes and scales must be U8")
        };
        let mut out = dev.alloc_zeros::<f32>((self.rows * self.n).max(1))?;
        {
            let (cp, _a) = cs.device_ptr(&stream);
            let (sp, _b) = ss.device_ptr(&stream);
            let (op, _c) = out.device_ptr_mut(&stream);
            // SAFETY: codes/scales hold the rows of an MxTensor of this geometry.
            let rc = unsafe {
                ffi::mxa_mx_dequantize(
                    (cp + c0 as u64) as *const u8,
                    (sp + s0 as u64) as *const u8,
                    self.rows as i64,
                    self.n as i64,
                    self.fmt as i32,
                    self.block as i32,
                    op as *mut f32,
                    stream.cu_stream() as ffi::Stream,
                )
            };
            if rc != ffi::MXA_OK {
                bail!("mx dequantize: CUDA kernel failed (status {rc})");
            }
        }
        Ok((
            CudaStorage {
                slice: CudaStorageSlice::F32(out),
                device: dev,
            },
            Shape::from((self.rows, self.n)),
        ))
    }
}
