//! FP8 (E4M3) activations on CUDA for the FP8 linear layers of `mxattn-fp8` (feature
//! `cuda`): the per-token (or per-token-and-group) quantization `kernels/fp8_quantize.cu`
//! runs, laid out as cuBLASLt's FP8 GEMM reads it, and the epilogue of that crate's fallback
//! GEMM. The definition and its CPU reference live in `mxattn-fp8`
//! (`quantize_activations_grouped`); the kernel's codes and scales equal it bit for bit.
//!
//! A non-finite input is caught on the device: with [`DeviceChecks::PerCall`] the call
//! reads the flag (one host synchronization) and errs; with [`DeviceChecks::Deferred`] the
//! flag joins the device's gathered attention checks and
//! [`crate::attention::check_device`] reports it (no synchronization on the call path).
//!
//! The layers' weights are quantized here too when they are loaded on the device
//! ([`fp8_quantize_weight_rows`] per output channel, [`fp8_quantize_weight_groups`] for
//! 128 × 128 blocks and tensor scales), so a large model's weights never round-trip through
//! the host; those calls read their non-finite flag at once and return it.

use crate::attention::DeviceChecks;
use crate::cuda::ffi;
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice};
use candle_core::op::BackpropOp;
use candle_core::{bail, DType, Result, Storage, Tensor};
use std::ffi::c_void;

/// FP8 activation codes and scales as the GEMM reads them.
#[derive(Clone, Debug)]
pub struct Fp8Rows {
    /// `[rows_p, ldc]` U8: row `r`'s E4M3 codes, zeros in the padded columns and rows.
    pub codes: Tensor,
    /// `[groups, rows_p]` f32: the scale of row `r`'s group `g` at `[g, r]` (token-major);
    /// 1 in the padded rows.
    pub scales: Tensor,
    /// Rows (tokens) quantized; `codes` holds `rows_p ≥ rows`.
    pub rows: usize,
    /// Features per row; `codes` rows are `ldc ≥ k` wide.
    pub k: usize,
    /// Width of the groups sharing a scale (`k` for one per row).
    pub group: usize,
}

impl Fp8Rows {
    pub fn groups(&self) -> usize {
        self.k.div_ceil(self.group)
    }
}

fn cuda_dev(t: &Tensor, what: &str) -> Result<CudaDevice> {
    match t.device() {
        candle_core::Device::Cuda(d) => Ok(d.clone()),
        _ => bail!("{what}: the tensor must be on a CUDA device"),
    }
}

/// Device address of a contiguous CUDA tensor's first element (u8, f32, bf16 or f16), for
/// handing it to a library such as cuBLASLt; `what` names the caller in errors. The tensor
/// must outlive the work queued on the device's stream that reads it.
pub fn addr(t: &Tensor, what: &str) -> Result<u64> {
    let (st, l) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*st else {
        bail!("{what}: the tensor must be on a CUDA device")
    };
    let Some((start, _)) = l.contiguous_offsets() else {
        bail!("{what}: the tensor must be contiguous")
    };
    let stream = cs.device.cuda_stream();
    let start = start as u64;
    // The kernels run on the device's one stream, after whatever wrote these buffers.
    Ok(match &cs.slice {
        CudaStorageSlice::U8(x) => x.device_ptr(&stream).0 + start,
        CudaStorageSlice::F32(x) => x.device_ptr(&stream).0 + 4 * start,
        CudaStorageSlice::BF16(x) => x.device_ptr(&stream).0 + 2 * start,
        CudaStorageSlice::F16(x) => x.device_ptr(&stream).0 + 2 * start,
        _ => bail!("{what}: dtype {:?} unsupported here", t.dtype()),
    })
}

fn dtype_code(dt: DType, what: &str) -> Result<i32> {
    Ok(match dt {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
        dt => bail!("{what}: dtype {dt:?} unsupported (f32, bf16, f16)"),
    })
}

/// A device buffer as a `[rows, cols]` tensor of the device (no copy).
pub fn wrap<T: candle_core::cuda_backend::CudaDType>(
    s: candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
    dev: &CudaDevice,
    shape: (usize, usize),
) -> Tensor {
    Tensor::from_storage(
        Storage::Cuda(CudaStorage::wrap_cuda_slice(s, dev.clone())),
        shape,
        BackpropOp::none(),
        false,
    )
}

/// Quantizes `x [.., k]` (f32, bf16 or f16, on a CUDA device) to E4M3 per row, or per row
/// and `group`-wide slice along it (the last one may be shorter): codes `[rows_p, ldc]`
/// (`rows_p ≥ rows`, `ldc ≥ k`: the GEMM's padding, zeros there) and scales
/// `[groups, rows_p]`. `checks` says when a non-finite input becomes an error (module doc).
pub fn fp8_quantize_rows(
    x: &Tensor,
    group: Option<usize>,
    rows_p: usize,
    ldc: usize,
    checks: DeviceChecks,
) -> Result<Fp8Rows> {
    let (rows, nonfinite) = quantize_rows(x, group, rows_p, ldc, checks)?;
    if nonfinite {
        bail!("FP8 linear: the input holds a non-finite value (NaN or Inf)");
    }
    Ok(rows)
}

/// A weight `w [rows, k]` quantized per row (per output channel) as
/// [`fp8_quantize_rows`] does activations, the layout the GEMM reads; the flag of a
/// non-finite weight is read at the end (one synchronization) and returned rather than
/// raised, so that the caller can name the value and its position.
pub fn fp8_quantize_weight_rows(w: &Tensor, rows_p: usize, ldc: usize) -> Result<(Fp8Rows, bool)> {
    quantize_rows(w, None, rows_p, ldc, DeviceChecks::PerCall)
}

/// Codes, scales and whether the input held a non-finite value (read only for
/// [`DeviceChecks::PerCall`]; deferred checks leave it to the device's gathered word).
fn quantize_rows(
    x: &Tensor,
    group: Option<usize>,
    rows_p: usize,
    ldc: usize,
    checks: DeviceChecks,
) -> Result<(Fp8Rows, bool)> {
    const OP: &str = "fp8_quantize_rows";
    let dev = cuda_dev(x, OP)?;
    let k = *x.dims().last().unwrap_or(&0);
    if k == 0 {
        bail!("{OP}: input {:?} has no features", x.dims());
    }
    let rows = x.elem_count() / k;
    let group = group.unwrap_or(k).clamp(1, k);
    if rows_p < rows || ldc < k {
        bail!("{OP}: padding [{rows_p}, {ldc}] smaller than the input [{rows}, {k}]");
    }
    let code = dtype_code(x.dtype(), OP)?;
    let x = x.contiguous()?;
    let groups = k.div_ceil(group);
    let stream = dev.cuda_stream();
    // SAFETY: the kernel writes every code of [rows_p, ldc] and every scale of
    // [groups, rows_p] (padded ones included) before anything reads them.
    let mut codes = unsafe { dev.alloc::<u8>((rows_p * ldc).max(1))? };
    let mut scales = unsafe { dev.alloc::<f32>((groups * rows_p).max(1))? };
    let mut fresh = match checks {
        DeviceChecks::PerCall => Some(dev.alloc_zeros::<u32>(1)?),
        DeviceChecks::Deferred => None,
    };
    let flags = match &mut fresh {
        Some(f) => f.device_ptr_mut(&stream).0,
        None => crate::cuda::attention::deferred_flags_addr(&dev)?,
    };
    let xa = addr(&x, OP)?;
    {
        let (c, _gc) = codes.device_ptr_mut(&stream);
        let (s, _gs) = scales.device_ptr_mut(&stream);
        // SAFETY: x holds rows·k elements of the dtype `code`; codes rows_p·ldc bytes;
        // scales groups·rows_p f32; flags one u32 on this device.
        let rc = unsafe {
            ffi::mxa_fp8_quantize(
                xa as *const c_void,
                code,
                rows as i64,
                rows_p as i64,
                k as i64,
                ldc as i64,
                group as i64,
                c as *mut u8,
                s as *mut f32,
                flags as *mut u32,
                stream.cu_stream() as ffi::Stream,
            )
        };
        if rc != ffi::MXA_OK {
            bail!("{OP}: CUDA kernel failed (status {rc})");
        }
    }
    let nonfinite = match &fresh {
        Some(f) => {
            let v = stream.clone_dtoh(f).map_err(candle_core::Error::wrap)?;
            v[0] & 16 != 0
        }
        None => false,
    };
    Ok((
        Fp8Rows {
            codes: wrap(codes, &dev, (rows_p, ldc)),
            scales: wrap(scales, &dev, (groups, rows_p)),
            rows,
            k,
            group,
        },
        nonfinite,
    ))
}

/// A weight quantized with one scale per group of rows and columns (from
/// [`fp8_quantize_weight_groups`]).
#[derive(Clone, Debug)]
pub struct Fp8WeightGroups {
    /// `[rows_p, ldc]` U8: row `r`'s E4M3 codes, zeros in the padded columns and rows.
    pub codes: Tensor,
    /// `[⌈rows / brows⌉, lds]` f32: group `(rb, cb)`'s scale at `[rb, cb]`, 1 in the padded
    /// columns.
    pub scales: Tensor,
    /// The input held a non-finite value (its codes are then meaningless).
    pub nonfinite: bool,
}

/// Quantizes a weight `w [rows, k]` (f32, bf16 or f16, on a CUDA device) with one scale per
/// `brows × bcols` group (128 × 128 blocks; `[rows, k]` itself for one tensor scale; the
/// last groups may be smaller), as `mxattn-fp8`'s `Fp8Weight::quantize` does on the CPU, bit
/// for bit: codes padded to `[rows_p, ldc]`, scales `[⌈rows / brows⌉, lds]` (`lds` ≥ the
/// column groups). Two kernel passes (group amax, then codes); the non-finite flag is read
/// at the end (one synchronization) and returned for the caller to report.
pub fn fp8_quantize_weight_groups(
    w: &Tensor,
    brows: usize,
    bcols: usize,
    rows_p: usize,
    ldc: usize,
    lds: usize,
) -> Result<Fp8WeightGroups> {
    const OP: &str = "fp8_quantize_weight_groups";
    let dev = cuda_dev(w, OP)?;
    let (rows, k) = w.dims2()?;
    if rows == 0 || k == 0 || brows == 0 || bcols == 0 {
        bail!("{OP}: weight [{rows}, {k}] or group {brows}×{bcols} is empty");
    }
    let (groups_r, groups_c) = (rows.div_ceil(brows), k.div_ceil(bcols));
    if rows_p < rows || ldc < k || lds < groups_c {
        bail!("{OP}: padding [{rows_p}, {ldc}] (scales {lds} wide) smaller than the weight [{rows}, {k}] ({groups_c} column groups)");
    }
    let code = dtype_code(w.dtype(), OP)?;
    let w = w.contiguous()?;
    let stream = dev.cuda_stream();
    // SAFETY: the encode pass writes every code of [rows_p, ldc] and every scale of
    // [groups_r, lds] (each group's first row its scale, padding included).
    let mut codes = unsafe { dev.alloc::<u8>(rows_p * ldc)? };
    let mut scales = unsafe { dev.alloc::<f32>(groups_r * lds)? };
    let mut amax = dev.alloc_zeros::<u32>(groups_r * groups_c)?;
    let mut flags = dev.alloc_zeros::<u32>(1)?;
    let wa = addr(&w, OP)?;
    {
        let (c, _gc) = codes.device_ptr_mut(&stream);
        let (s, _gs) = scales.device_ptr_mut(&stream);
        let (a, _ga) = amax.device_ptr_mut(&stream);
        let (f, _gf) = flags.device_ptr_mut(&stream);
        // SAFETY: w holds rows·k elements of the dtype `code`; codes rows_p·ldc bytes;
        // scales groups_r·lds f32; amax groups_r·groups_c zeroed words; flags one word.
        let rc = unsafe {
            ffi::mxa_fp8_quantize_groups(
                wa as *const c_void,
                code,
                rows as i64,
                rows_p as i64,
                k as i64,
                ldc as i64,
                brows as i64,
                bcols as i64,
                lds as i64,
                a as *mut u32,
                c as *mut u8,
                s as *mut f32,
                f as *mut u32,
                stream.cu_stream() as ffi::Stream,
            )
        };
        if rc != ffi::MXA_OK {
            bail!("{OP}: CUDA kernel failed (status {rc})");
        }
    }
    let v = stream
        .clone_dtoh(&flags)
        .map_err(candle_core::Error::wrap)?;
    Ok(Fp8WeightGroups {
        codes: wrap(codes, &dev, (rows_p, ldc)),
        scales: wrap(scales, &dev, (groups_r, lds)),
        nonfinite: v[0] & 16 != 0,
    })
}

/// One step of the fallback FP8 GEMM's epilogue (`kernels/fp8_quantize.cu`), for the
/// GEMM of one group `g` of the inputs with unit scales, `p` (f32, row `t` at `t · ldp`):
/// `v = p[t, o] · sw[(o / sw_ob) · sw_ostride + sw_offset] · sx[g, t]`, plus `acc[t, o]`
/// unless `first`; written to `acc` (f32 `[rows, cols]`) unless `last`, else to `out`
/// (`[rows, cols]`, f32, bf16 or f16) with `bias[o]` (f32) added. `acc` and `out` are
/// written in place: pass buffers the caller made for this and nothing else reads.
pub struct Fp8Epilogue<'a> {
    pub p: &'a Tensor,
    pub ldp: usize,
    pub rows: usize,
    pub cols: usize,
    pub sw: &'a Tensor,
    pub sw_offset: usize,
    pub sw_ob: usize,
    pub sw_ostride: usize,
    pub sx: &'a Tensor,
    pub g: usize,
    pub acc: Option<&'a Tensor>,
    pub first: bool,
    pub last: bool,
    pub bias: Option<&'a Tensor>,
    pub out: Option<&'a Tensor>,
}

impl Fp8Epilogue<'_> {
    pub fn run(&self) -> Result<()> {
        const OP: &str = "fp8 epilogue";
        let dev = cuda_dev(self.p, OP)?;
        let f32_of = |t: &Tensor, what: &str| -> Result<u64> {
            if t.dtype() != DType::F32 {
                bail!("{OP}: {what} must be f32");
            }
            addr(t, OP)
        };
        let rows_p = self.sx.dims().last().copied().unwrap_or(0);
        if self.p.elem_count() < self.rows.saturating_sub(1) * self.ldp + self.cols
            || self.ldp < self.cols
            || (self.g + 1) * rows_p > self.sx.elem_count()
            || self.rows > rows_p
            || self.sw_ob == 0
            || self.cols == 0
            || ((self.cols - 1) / self.sw_ob) * self.sw_ostride + self.sw_offset
                >= self.sw.elem_count()
        {
            bail!("{OP}: internal error: inconsistent sizes");
        }
        let p = f32_of(self.p, "p")?;
        let sw = f32_of(self.sw, "sw")? + 4 * self.sw_offset as u64;
        let sx = f32_of(self.sx, "sx")? + 4 * (self.g * rows_p) as u64;
        let acc = match self.acc {
            Some(a) => {
                if a.elem_count() < self.rows * self.cols {
                    bail!("{OP}: internal error: acc too small");
                }
                f32_of(a, "acc")?
            }
            None => 0,
        };
        let bias = match self.bias {
            Some(b) => f32_of(b, "bias")?,
            None => 0,
        };
        let (out, out_code) = match self.out {
            Some(o) => {
                if o.elem_count() < self.rows * self.cols {
                    bail!("{OP}: internal error: out too small");
                }
                (addr(o, OP)?, dtype_code(o.dtype(), OP)?)
            }
            None => (0, 0),
        };
        // SAFETY: sizes checked above; every pointer is on this device; the kernel checks
        // that acc/out are present where the flags need them.
        let rc = unsafe {
            ffi::mxa_fp8_epilogue(
                p as *const f32,
                self.ldp as i64,
                self.rows as i64,
                self.cols as i64,
                sw as *const f32,
                self.sw_ob as i64,
                self.sw_ostride as i64,
                sx as *const f32,
                acc as *mut f32,
                self.first as i32,
                self.last as i32,
                bias as *const f32,
                out as *mut c_void,
                out_code,
                dev.cuda_stream().cu_stream() as ffi::Stream,
            )
        };
        if rc != ffi::MXA_OK {
            bail!("{OP}: CUDA kernel failed (status {rc})");
        }
        Ok(())
    }
}

/// Most tokens one [`fp8_gemv`] call takes (the kernel keeps one accumulator per token).
pub const GEMV_MAX_TOKENS: usize = 8;

/// The activations of [`fp8_gemv`].
#[derive(Clone, Copy, Debug)]
pub enum GemvInput<'a> {
    /// As they come: `x [t, k]`, f32, bf16 or f16 (the weight-only layer); the output in
    /// the same dtype.
    Values(&'a Tensor),
    /// E4M3 codes and per-token scales from [`fp8_quantize_rows`] (one group per row), its
    /// codes padded like the weight's.
    Fp8(&'a Fp8Rows),
}

/// An uninitialized `[rows, cols]` tensor of `dt` (f32, bf16 or f16) on `dev`, for a kernel
/// or GEMM that writes every element; `what` names the caller in errors.
pub fn alloc_uninit(
    dev: &CudaDevice,
    dt: DType,
    rows: usize,
    cols: usize,
    what: &str,
) -> Result<Tensor> {
    let n = (rows * cols).max(1);
    // SAFETY: every caller has a kernel write all rows × cols elements before any read.
    Ok(unsafe {
        match dt {
            DType::F32 => wrap(dev.alloc::<f32>(n)?, dev, (rows, cols)),
            DType::BF16 => wrap(dev.alloc::<half::bf16>(n)?, dev, (rows, cols)),
            DType::F16 => wrap(dev.alloc::<half::f16>(n)?, dev, (rows, cols)),
            dt => bail!("{what}: dtype {dt:?} unsupported (f32, bf16, f16)"),
        }
    })
}

/// The decode-shaped product of an FP8 layer with one scale per output channel
/// (`kernels/fp8_gemv.cu`): `y [t, out]` in `out_dtype` with
/// `y[t, o] = sw[o] · (sx[t]) · Σ_k a[t, k] · E4M3(w[o, k]) (+ bias[o])`, for
/// `t ≤ GEMV_MAX_TOKENS` tokens, the weight's bytes read once. `w`: codes `[≥ out, ldw]` U8
/// (`ldw` a multiple of 16, zero codes past `k`); `sw`: f32 `[≥ out]`; `bias`: f32 `[out]`.
#[allow(clippy::too_many_arguments)]
pub fn fp8_gemv(
    w: &Tensor,
    sw: &Tensor,
    out: usize,
    k: usize,
    x: GemvInput,
    t: usize,
    bias: Option<&Tensor>,
    out_dtype: DType,
) -> Result<Tensor> {
    const OP: &str = "fp8_gemv";
    let dev = cuda_dev(w, OP)?;
    let ldw = w.dims().last().copied().unwrap_or(0);
    if w.dtype() != DType::U8
        || w.dims().len() != 2
        || w.dim(0)? < out
        || ldw < k
        || ldw % 16 != 0
        || sw.dtype() != DType::F32
        || sw.elem_count() < out
        || t > GEMV_MAX_TOKENS
    {
        bail!("{OP}: internal error: inconsistent operands");
    }
    if let Some(b) = bias {
        if b.dtype() != DType::F32 || b.elem_count() != out {
            bail!("{OP}: internal error: the bias must be f32 [{out}]");
        }
    }
    let y = alloc_uninit(&dev, out_dtype, t, out, OP)?;
    if t == 0 || out == 0 {
        return Ok(y);
    }
    let keep; // a contiguous copy of the input lives until the kernel is queued
    let (xa, x_dtype, ldx, sx) = match x {
        GemvInput::Values(x) => {
            if x.elem_count() != t * k || x.dtype() != out_dtype {
                bail!(
                    "{OP}: internal error: input {:?} {:?} for {t} × {k} into {out_dtype:?}",
                    x.dims(),
                    x.dtype()
                );
            }
            keep = x.contiguous()?;
            (addr(&keep, OP)?, dtype_code(keep.dtype(), OP)?, k, 0u64)
        }
        GemvInput::Fp8(q) => {
            if q.k != k || q.codes.dims().last() != Some(&ldw) || q.groups() != 1 || q.rows < t {
                bail!("{OP}: internal error: activation codes do not match the weight");
            }
            (addr(&q.codes, OP)?, 3, ldw, addr(&q.scales, OP)?)
        }
    };
    let ba = match bias {
        Some(b) => addr(b, OP)?,
        None => 0,
    };
    // SAFETY: sizes checked above; every pointer is on this device and its buffer lives
    // until the kernel, queued on the device's stream, has run.
    let rc = unsafe {
        ffi::mxa_fp8_gemv(
            addr(w, OP)? as *const u8,
            ldw as i64,
            addr(sw, OP)? as *const f32,
            xa as *const c_void,
            x_dtype,
            ldx as i64,
            sx as *const f32,
            ba as *const f32,
            addr(&y, OP)? as *mut c_void,
            dtype_code(out_dtype, OP)?,
            t as i64,
            out as i64,
            k as i64,
            dev.cuda_stream().cu_stream() as ffi::Stream,
        )
    };
    if rc != ffi::MXA_OK {
        bail!("{OP}: CUDA kernel failed (status {rc})");
    }
    Ok(y)
}

/// The unscaled values of the codes `w [≥ rows, ldw]` (U8 E4M3), `[rows, k]` in `dtype`
/// (exact in f32, bf16 and f16), for a GEMM in that dtype whose output the caller scales.
pub fn fp8_dequant(w: &Tensor, rows: usize, k: usize, dtype: DType) -> Result<Tensor> {
    const OP: &str = "fp8_dequant";
    let dev = cuda_dev(w, OP)?;
    let ldw = w.dims().last().copied().unwrap_or(0);
    if w.dtype() != DType::U8 || w.dims().len() != 2 || w.dim(0)? < rows || ldw < k {
        bail!("{OP}: internal error: inconsistent operands");
    }
    let dst = alloc_uninit(&dev, dtype, rows, k, OP)?;
    // SAFETY: w holds ≥ rows·ldw bytes, dst rows·k elements of `dtype`, both on this device.
    let rc = unsafe {
        ffi::mxa_fp8_dequant(
            addr(w, OP)? as *const u8,
            ldw as i64,
            rows as i64,
            k as i64,
            addr(&dst, OP)? as *mut c_void,
            dtype_code(dtype, OP)?,
            dev.cuda_stream().cu_stream() as ffi::Stream,
        )
    };
    if rc != ffi::MXA_OK {
        bail!("{OP}: CUDA kernel failed (status {rc})");
    }
    Ok(dst)
}
