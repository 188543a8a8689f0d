//! The GPU path of [`crate::Fp8Linear`] (feature `cuda`): activations quantized by
//! `kernels/fp8_quantize.cu` (through [`mxattn::fused::fp8`]), the FP8 E4M3 GEMM by
//! cuBLASLt (candle's `cudarc`) on the device's stream.
//!
//! **The product.** Row-major `y[T, out] = x[T, in] · W[out, in]ᵀ` is cuBLASLt's
//! column-major "TN" GEMM `D[out, T] = op(A)·B` with A = W's codes (column-major
//! `[in, out]`, `transa = T`), B = the activation codes (column-major `[in, T]`,
//! `transb = N`), D column-major `[out, T]` = row-major `[T, out]`; A and B
//! `CUDA_R_8F_E4M3`, compute `CUBLAS_COMPUTE_32F`, scale type `R_32F`, D in x's dtype.
//! cuBLASLt's FP8 kernels want every leading dimension and pointer 16-byte aligned, so
//! the layer is padded once at upload: `in` to a multiple of 16 (zero codes: they add
//! nothing), `out` to a multiple of 16 (zero rows, sliced off the output), and the token
//! count to a multiple of 4 (zero rows of activations; see the VEC128 layout below).
//!
//! **Scales** (`CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE`):
//! * tensor or channel weights: `OUTER_VEC_32F` on both, A's vector = the per-output-channel
//!   weight scales (a tensor scale is broadcast to that vector at upload), B's = the
//!   per-token activation scales; D[o, t] = sw[o] · sx[t] · Σ codes. (Hopper; cuBLAS ≥ 12.9.)
//! * 128 × 128 block weights: A `BLK128x128_32F`, B `VEC128_32F` (1 × 128 activation groups).
//!   Layouts **assumed** (cuBLAS docs "scaling factors layouts", as read by TransformerEngine's
//!   blockwise recipe and DeepGEMM, which feed the same Hopper kernels; written here because
//!   the GPU test is what settles them): the block scale tensor follows the data's storage
//!   order with its leading dimension padded to a multiple of 4 floats (16 bytes): A is
//!   column-major `[in, out]`, so its scales are column-major `[⌈in/128⌉, ⌈out/128⌉]` with
//!   leading dimension `L4 = ⌈⌈in/128⌉/4⌉·4`: scale of block (ob, kb) at `ob·L4 + kb`, the
//!   checkpoint's row-major `[⌈out/128⌉, ⌈in/128⌉]` with each row padded to L4. VEC128
//!   scales of B are "outer-dimension-major": scale of token t's group kb at `kb·Tp + t`,
//!   with Tp the token count padded to a multiple of 4 (so each group's column starts
//!   16-byte aligned). If the GPU test shows another layout, only [`GpuWeight::upload`]
//!   and the kernel's scale index change.
//!
//! **Bias** through `CUBLASLT_EPILOGUE_BIAS` with `BIAS_DATA_TYPE` = D's type (bf16, f16: the
//! bias rounded to x's dtype, as a bf16 model's bias is stored); for f32 outputs (the FP8
//! tables give a bf16 bias there) the bias is added after the GEMM in f32.
//!
//! **Decode.** Up to `FP8_GEMV_MAX_TOKENS` (4) tokens with tensor or channel scales, the product
//! is `kernels/fp8_gemv.cu`'s GEMV instead ([`GemmPath::Gemv`]): the same exact FP8 products
//! summed in f32, the weight's bytes read once, where cuBLASLt's FP8 GEMM measured no faster
//! than the BF16 one (`evals/results/bench_fp8_linear.md`). The weight-only layers
//! ([`crate::Fp8Linear::weight_only`]) take the same GEMV with their activations as they
//! come, and for more tokens a GEMM of x's dtype (f32 for f16) over the codes' values.
//!
//! **Fallback.** If cuBLASLt refuses the scale modes (the heuristic finds no algorithm or the
//! matmul fails: an Ada GPU has only scalar FP8 scaling; a block size other than 128 × 128),
//! the layer runs the GEMM with scalar scales of 1 into f32, one GEMM per weight-scale group
//! along `in` (one for tensor and channel weights, one per 128 columns for blocks), and
//! `mxattn::fused::fp8::Fp8Epilogue` applies `acc · sw[o] · sx[t]`, sums the groups and adds
//! the bias into x's dtype. [`GemmPath`] says which ran.
//!
//! **Quantizing at load.** [`GpuWeight::quantize`] makes from a weight on the device the
//! padded codes and scales that [`GpuWeight::upload`] makes from the host quantization, byte
//! for byte: per channel with the activations' row kernel (an output channel is a row of W),
//! tensor and block scales with `fp8_quantize_weight_groups` (group amax, then codes).
//!
//! **Caches.** One cuBLASLt handle and one 32 MiB workspace per device, and the matmul
//! descriptor, layouts and chosen algorithm per (path, shape, dtype), so a model's many calls
//! reuse them; a refused scaled plan is remembered, so the fallback is taken at once.

use crate::{Fp8Weight, Granularity};
use candle_core::cuda_backend::cudarc::cublaslt::{result as lt, sys};
use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtrMut};
use candle_core::cuda_backend::{CudaDevice, DeviceId};
use candle_core::{bail, DType, Result, Tensor};
use mxattn::attention::DeviceChecks;
use mxattn::fused::fp8::{
    alloc_uninit, fp8_dequant, fp8_gemv, fp8_quantize_rows, fp8_quantize_weight_groups,
    fp8_quantize_weight_rows, wrap, Fp8Epilogue, Fp8Rows, GemvInput, GEMV_MAX_TOKENS,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// Which GEMM a CUDA forward ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPath {
    /// cuBLASLt with the scales in the GEMM (outer-vector, or 128 × 128 blocks × 1 × 128
    /// groups); `bias_epilogue`: the bias added by cuBLASLt's epilogue (else after it).
    Scaled { bias_epilogue: bool },
    /// Scalar-scaled cuBLASLt GEMMs into f32 and mxattn's scale epilogue (module doc).
    Fallback,
    /// A few tokens (decode) with tensor or channel scales: `kernels/fp8_gemv.cu`, one warp
    /// per output channel, the weight's bytes read once (cuBLASLt's FP8 GEMM reaches at most
    /// the BF16 GEMM's time there).
    Gemv,
    /// Weight-only layers, many tokens: the codes' values in x's dtype and a GEMM of that
    /// dtype, the channel scales after it.
    Dequantized,
}

const WORKSPACE: usize = 32 << 20;
const MODE_OUTER_VEC: i32 = 3;
const MODE_VEC128: i32 = 4;
const MODE_BLK128: i32 = 5;

fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

fn cu(e: lt::CublasError, what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("{what}: cuBLASLt {e:?}"))
}

/// Device address of a contiguous tensor's first element.
fn addr(t: &Tensor) -> Result<u64> {
    mxattn::fused::fp8::addr(t, "FP8 linear")
}

/// The name in errors of the layer's allocations.
const OP: &str = "FP8 linear";

fn lt_type(dt: DType) -> sys::cudaDataType {
    match dt {
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        _ => sys::cudaDataType::CUDA_R_32F,
    }
}

/// Compute capability `10·major + minor` of a device.
pub(crate) fn compute_cap(dev: &CudaDevice) -> Result<u32> {
    let ctx = dev.cuda_stream().context().clone();
    let a = |k| ctx.attribute(k).map_err(candle_core::Error::wrap);
    let major = a(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = a(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok((10 * major + minor) as u32)
}

/// A layer's weight on the device: codes `[out_p, k_p]` (row-major = cuBLASLt's
/// column-major `[k_p, out_p]`), scales as the GEMM reads them, the bias.
#[derive(Debug)]
pub(crate) struct GpuWeight {
    dev: CudaDevice,
    out: usize,
    out_p: usize,
    k: usize,
    k_p: usize,
    codes: Tensor,
    /// Tensor/channel: `[out_p]` (padding 1). Blocks: `[⌈out/rows⌉, l4]`, block (ob, kb)'s
    /// scale at `ob·l4 + kb` (padding 1).
    sw: Tensor,
    l4: usize,
    granularity: Granularity,
    bias_f32: Option<Tensor>,
    /// The bias in bf16 / f16, padded to `out_p`, for cuBLASLt's bias epilogue.
    bias_cast: Mutex<Vec<(DType, Tensor)>>,
    last: Mutex<Option<GemmPath>>,
}

/// Errs on a GPU without FP8 tensor cores.
fn check_fp8_gpu(dev: &CudaDevice) -> Result<()> {
    let cc = compute_cap(dev)?;
    if cc < 89 {
        bail!(
            "FP8 linear: the GPU has compute capability {}.{}; FP8 tensor cores need 8.9 (Ada) or newer (Hopper: 9.0)",
            cc / 10,
            cc % 10
        );
    }
    Ok(())
}

/// The GEMM needs block columns that are whole 16-byte steps of the codes.
fn check_block_cols(g: Granularity, out: usize, k: usize) -> Result<()> {
    if let Granularity::Block { rows, cols } = g {
        if cols % 16 != 0 {
            bail!(
                "FP8 linear [{out}, {k}]: {rows}×{cols} weight blocks: the GPU GEMM needs block columns that are a multiple of 16"
            );
        }
    }
    Ok(())
}

impl GpuWeight {
    /// Copies host codes and scales to the device in the GEMM's layout (an FP8 checkpoint's
    /// weights, or weights quantized on the host).
    pub(crate) fn upload(w: &Fp8Weight, bias: Option<&Tensor>, dev: &CudaDevice) -> Result<Self> {
        check_fp8_gpu(dev)?;
        let (out, k) = (w.out, w.inp);
        check_block_cols(w.granularity, out, k)?;
        let (out_p, k_p) = (round_up(out, 16), round_up(k, 16));
        let codes = if out_p == out && k_p == k {
            w.codes.clone()
        } else {
            let mut c = vec![0u8; out_p * k_p];
            for (o, row) in w.codes.chunks(k).enumerate() {
                c[o * k_p..o * k_p + k].copy_from_slice(row);
            }
            c
        };
        let stream = dev.cuda_stream();
        let codes = wrap(
            stream
                .clone_htod(&codes)
                .map_err(candle_core::Error::wrap)?,
            dev,
            (out_p, k_p),
        );
        let (sw, l4) = match w.granularity {
            Granularity::Tensor => (vec![w.scales[0]; out_p], 0),
            Granularity::Channel => {
                let mut v = w.scales.clone();
                v.resize(out_p, 1.0);
                (v, 0)
            }
            Granularity::Block { rows, cols } => {
                let (nb_o, nb_k) = (out.div_ceil(rows), k.div_ceil(cols));
                let l4 = round_up(nb_k, 4);
                let mut v = vec![1f32; nb_o * l4];
                for ob in 0..nb_o {
                    v[ob * l4..ob * l4 + nb_k].copy_from_slice(&w.scales[ob * nb_k..][..nb_k]);
                }
                (v, l4)
            }
        };
        let n = sw.len();
        let sw = wrap(
            stream.clone_htod(&sw).map_err(candle_core::Error::wrap)?,
            dev,
            (1, n),
        );
        Self::assemble(dev, out, k, codes, sw, l4, w.granularity, bias)
    }

    /// Quantizes `w [out, k]` (on `dev`, nonempty) on the device straight into the layout
    /// [`Self::upload`] makes from [`Fp8Weight::quantize`]'s codes and scales, which it
    /// equals bit for bit (the kernels in `kernels/fp8_quantize.cu`): loading a large model
    /// must not copy every weight to the host and back. A non-finite weight errs as on the
    /// CPU (its value and position, found on the host: only on that error path).
    pub(crate) fn quantize(
        w: &Tensor,
        granularity: Granularity,
        bias: Option<&Tensor>,
        dev: &CudaDevice,
    ) -> Result<Self> {
        check_fp8_gpu(dev)?;
        let (out, k) = w.dims2()?;
        check_block_cols(granularity, out, k)?;
        let (out_p, k_p) = (round_up(out, 16), round_up(k, 16));
        // the kernels read f32, bf16 and f16; anything else widened as the CPU widens it
        let w = match w.dtype() {
            DType::F32 | DType::BF16 | DType::F16 => w.clone(),
            _ => w.to_dtype(DType::F32)?,
        };
        let (codes, sw, l4, nonfinite) = match granularity {
            Granularity::Channel => {
                // a channel is a row of W: the activations' row kernel, scales [1, out_p]
                // with 1 in the padded rows, as `upload` pads them
                let (q, bad) = fp8_quantize_weight_rows(&w, out_p, k_p)?;
                (q.codes, q.scales, 0, bad)
            }
            Granularity::Tensor => {
                let q = fp8_quantize_weight_groups(&w, out, k, out_p, k_p, 1)?;
                // one scale, broadcast to the per-channel vector the GEMM reads
                let sw = q.scales.reshape(1)?.broadcast_as(out_p)?.contiguous()?;
                (q.codes, sw, 0, q.nonfinite)
            }
            Granularity::Block { rows, cols } => {
                let l4 = round_up(k.div_ceil(cols), 4);
                let q = fp8_quantize_weight_groups(&w, rows, cols, out_p, k_p, l4)?;
                (q.codes, q.scales, l4, q.nonfinite)
            }
        };
        if nonfinite {
            let v: Vec<f32> = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
            crate::check_finite(&v, k)?;
            bail!("FP8 weight [{out}, {k}]: non-finite value (flagged on the GPU)");
        }
        Self::assemble(dev, out, k, codes, sw, l4, granularity, bias)
    }

    /// The layer from its device codes `[out_p, k_p]` and scales (any shape, read flat).
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        dev: &CudaDevice,
        out: usize,
        k: usize,
        codes: Tensor,
        sw: Tensor,
        l4: usize,
        granularity: Granularity,
        bias: Option<&Tensor>,
    ) -> Result<Self> {
        let bias_f32 = match bias {
            Some(b) => Some(
                b.to_device(&candle_core::Device::Cuda(dev.clone()))?
                    .to_dtype(DType::F32)?
                    .contiguous()?,
            ),
            None => None,
        };
        Ok(Self {
            dev: dev.clone(),
            out,
            out_p: round_up(out, 16),
            k,
            k_p: round_up(k, 16),
            codes,
            sw: sw.flatten_all()?,
            l4,
            granularity,
            bias_f32,
            bias_cast: Mutex::new(Vec::new()),
            last: Mutex::new(None),
        })
    }

    /// The host form of the weight, copied back from the device (codes without the
    /// padding, the granularity's scales), for a layer quantized on the device.
    pub(crate) fn download(&self) -> Result<Fp8Weight> {
        let (out, k) = (self.out, self.k);
        let codes: Vec<u8> = self
            .codes
            .narrow(0, 0, out)?
            .narrow(1, 0, k)?
            .contiguous()?
            .flatten_all()?
            .to_vec1()?;
        let scales: Vec<f32> = match self.granularity {
            Granularity::Tensor => self.sw.narrow(0, 0, 1)?.to_vec1()?,
            Granularity::Channel => self.sw.narrow(0, 0, out)?.to_vec1()?,
            Granularity::Block { rows, cols } => {
                let (nb_o, nb_k) = (out.div_ceil(rows), k.div_ceil(cols));
                self.sw
                    .reshape((nb_o, self.l4))?
                    .narrow(1, 0, nb_k)?
                    .contiguous()?
                    .flatten_all()?
                    .to_vec1()?
            }
        };
        Ok(Fp8Weight {
            out,
            inp: k,
            codes,
            granularity: self.granularity,
            scales,
        })
    }

    /// The device codes `[out_p, k_p]` and the scales as the GEMM reads them (flat).
    pub(crate) fn device_parts(&self) -> (Tensor, Tensor) {
        (self.codes.clone(), self.sw.clone())
    }

    pub(crate) fn last_path(&self) -> Option<GemmPath> {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes on the device (codes and scales; the bias not counted).
    pub(crate) fn device_bytes(&self) -> usize {
        self.codes.elem_count() + 4 * self.sw.elem_count()
    }

    fn bias_in(&self, dt: DType) -> Result<Option<Tensor>> {
        let Some(b) = &self.bias_f32 else {
            return Ok(None);
        };
        let mut cache = self.bias_cast.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, t)) = cache.iter().find(|(d, _)| *d == dt) {
            return Ok(Some(t.clone()));
        }
        let t = b
            .pad_with_zeros(0, 0, self.out_p - self.out)?
            .to_dtype(dt)?
            .contiguous()?;
        cache.push((dt, t.clone()));
        Ok(Some(t))
    }

    /// `x [.., k]` on this device → `[.., out]` in x's dtype.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        group: Option<usize>,
        checks: DeviceChecks,
        force_fallback: bool,
        gemv: bool,
        fast_accum: bool,
    ) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let dt = x.dtype();
        if !matches!(dt, DType::F32 | DType::BF16 | DType::F16) {
            bail!("FP8 linear: input dtype {dt:?} unsupported on CUDA (f32, bf16, f16)");
        }
        let t = x.elem_count() / self.k.max(1);
        let mut out_dims = dims.clone();
        *out_dims.last_mut().expect("rank ≥ 1") = self.out;
        if t == 0 {
            return Tensor::zeros(out_dims, dt, x.device());
        }
        let t_p = round_up(t, 4);
        let q = fp8_quantize_rows(x, group, t_p, self.k_p, checks)?;
        if gemv && !force_fallback && t <= crate::FP8_GEMV_MAX_TOKENS && self.per_channel() {
            return self.gemv(GemvInput::Fp8(&q), t, dt)?.reshape(out_dims);
        }
        let block128 = self.granularity == Granularity::BLOCK128;
        let scaled_ok = !force_fallback
            && match self.granularity {
                Granularity::Tensor | Granularity::Channel => true,
                Granularity::Block { .. } => block128,
            };
        if scaled_ok {
            if let Some((y, path)) = self.scaled(&q, dt, t_p, fast_accum)? {
                *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(path);
                let mut y = y.narrow(0, 0, t)?;
                if self.out_p != self.out {
                    y = y.narrow(1, 0, self.out)?.contiguous()?;
                }
                if path
                    == (GemmPath::Scaled {
                        bias_epilogue: false,
                    })
                {
                    if let Some(b) = &self.bias_f32 {
                        y = y.to_dtype(DType::F32)?.broadcast_add(b)?.to_dtype(dt)?;
                    }
                }
                return y.reshape(out_dims);
            }
        }
        let y = self.fallback(&q, dt, t_p)?;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(GemmPath::Fallback);
        y.reshape(out_dims)
    }

    /// The decode GEMV (`[t, out]` in `dt`, the bias added), recorded as the path taken.
    fn gemv(&self, x: GemvInput, t: usize, dt: DType) -> Result<Tensor> {
        let y = fp8_gemv(
            &self.codes,
            &self.sw,
            self.out,
            self.k,
            x,
            t,
            self.bias_f32.as_ref(),
            dt,
        )?;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(GemmPath::Gemv);
        Ok(y)
    }

    /// Tensor or channel scales: `sw` is one scale per output channel (what the GEMV takes).
    fn per_channel(&self) -> bool {
        matches!(self.granularity, Granularity::Tensor | Granularity::Channel)
    }

    /// The weight-only product (`crate::Fp8Linear::weight_only`): `x [.., k]` as it comes
    /// against the FP8 weight, `[.., out]` in x's dtype. Up to `GEMV_MAX_TOKENS` tokens the
    /// GEMV (the weight's bytes read once); more, the codes' values (exact in x's dtype) into
    /// a GEMM of x's dtype (f32 for f16 inputs: f16's range), then the channel scales and the bias in f32.
    pub(crate) fn forward_weight_only(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let dt = x.dtype();
        if !matches!(dt, DType::F32 | DType::BF16 | DType::F16) {
            bail!("FP8 linear: input dtype {dt:?} unsupported on CUDA (f32, bf16, f16)");
        }
        if !self.per_channel() {
            bail!("FP8 linear: weight-only layers take tensor or channel scales");
        }
        let t = x.elem_count() / self.k.max(1);
        let mut out_dims = dims.clone();
        *out_dims.last_mut().expect("rank ≥ 1") = self.out;
        if t == 0 {
            return Tensor::zeros(out_dims, dt, x.device());
        }
        let x2 = x.reshape((t, self.k))?;
        if t <= GEMV_MAX_TOKENS {
            return self.gemv(GemvInput::Values(&x2), t, dt)?.reshape(out_dims);
        }
        // f16's range (65504) can be too small for the unscaled sums (codes up to 448): f16
        // inputs multiply in f32
        let gt = if dt == DType::F16 { DType::F32 } else { dt };
        let v = fp8_dequant(&self.codes, self.out, self.k, gt)?;
        let sw = self.sw.narrow(0, 0, self.out)?.unsqueeze(0)?;
        let mut y = x2
            .to_dtype(gt)?
            .contiguous()?
            .matmul(&v.t()?)?
            .to_dtype(DType::F32)?
            .broadcast_mul(&sw)?;
        if let Some(b) = &self.bias_f32 {
            y = y.broadcast_add(b)?;
        }
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(GemmPath::Dequantized);
        y.to_dtype(dt)?.reshape(out_dims)
    }

    /// The scaled cuBLASLt GEMM into `[t_p, out_p]`, or None where cuBLASLt refuses it.
    fn scaled(
        &self,
        q: &Fp8Rows,
        dt: DType,
        t_p: usize,
        fast_accum: bool,
    ) -> Result<Option<(Tensor, GemmPath)>> {
        let bias = if dt == DType::F32 {
            None
        } else {
            self.bias_in(dt)?
        };
        let modes = if self.granularity == Granularity::BLOCK128 {
            (MODE_BLK128, MODE_VEC128)
        } else {
            (MODE_OUTER_VEC, MODE_OUTER_VEC)
        };
        let y = alloc_uninit(&self.dev, dt, t_p, self.out_p, OP)?;
        let gemm = Gemm {
            key: PlanKey {
                kind: PlanKind::Scaled {
                    a_mode: modes.0,
                    b_mode: modes.1,
                    bias: bias.is_some(),
                    fast_accum,
                },
                m: self.out_p,
                n: t_p,
                k: self.k_p,
                ld_ab: self.k_p,
                d_type: dt,
            },
            a: addr(&self.codes)?,
            b: addr(&q.codes)?,
            d: addr(&y)?,
            a_scale: addr(&self.sw)?,
            b_scale: addr(&q.scales)?,
            bias: match &bias {
                Some(b) => addr(b)?,
                None => 0,
            },
        };
        if run_gemm(&self.dev, &gemm)? {
            return Ok(Some((
                y,
                GemmPath::Scaled {
                    bias_epilogue: bias.is_some(),
                },
            )));
        }
        if bias.is_some() {
            // the scale modes may be taken without the bias epilogue
            let gemm = Gemm {
                key: PlanKey {
                    kind: PlanKind::Scaled {
                        a_mode: modes.0,
                        b_mode: modes.1,
                        bias: false,
                        fast_accum,
                    },
                    ..gemm.key
                },
                bias: 0,
                ..gemm
            };
            if run_gemm(&self.dev, &gemm)? {
                return Ok(Some((
                    y,
                    GemmPath::Scaled {
                        bias_epilogue: false,
                    },
                )));
            }
        }
        Ok(None)
    }

    /// Scalar-scaled GEMMs per weight-scale group along `k` and mxattn's epilogue.
    fn fallback(&self, q: &Fp8Rows, dt: DType, t_p: usize) -> Result<Tensor> {
        let t = q.rows;
        let (gk, groups, sw_ob, sw_ostride) = match self.granularity {
            Granularity::Tensor | Granularity::Channel => (self.k_p, 1, 1, 1),
            Granularity::Block { rows, cols } => (cols, self.k.div_ceil(cols), rows, self.l4),
        };
        if q.groups() != groups {
            bail!(
                "FP8 linear: internal error: {} activation groups for {groups} weight groups",
                q.groups()
            );
        }
        let p = alloc_uninit(&self.dev, DType::F32, t_p, self.out_p, OP)?;
        let acc = if groups > 1 {
            Some(alloc_uninit(&self.dev, DType::F32, t, self.out, OP)?)
        } else {
            None
        };
        let y = alloc_uninit(&self.dev, dt, t, self.out, OP)?;
        let (a0, b0, d) = (addr(&self.codes)?, addr(&q.codes)?, addr(&p)?);
        for g in 0..groups {
            let kg = gk.min(self.k_p - g * gk);
            let gemm = Gemm {
                key: PlanKey {
                    kind: PlanKind::Unit,
                    m: self.out_p,
                    n: t_p,
                    k: kg,
                    ld_ab: self.k_p,
                    d_type: DType::F32,
                },
                a: a0 + (g * gk) as u64,
                b: b0 + (g * gk) as u64,
                d,
                a_scale: 0,
                b_scale: 0,
                bias: 0,
            };
            if !run_gemm(&self.dev, &gemm)? {
                bail!(
                    "FP8 linear [{}, {}]: cuBLASLt has no FP8 GEMM for [{}, {}] × [{}, {}] with scalar scales on this GPU",
                    self.out,
                    self.k,
                    t_p,
                    kg,
                    kg,
                    self.out_p
                );
            }
            Fp8Epilogue {
                p: &p,
                ldp: self.out_p,
                rows: t,
                cols: self.out,
                sw: &self.sw,
                sw_offset: if groups > 1 { g } else { 0 },
                sw_ob,
                sw_ostride,
                sx: &q.scales,
                g,
                acc: acc.as_ref(),
                first: g == 0,
                last: g + 1 == groups,
                bias: self.bias_f32.as_ref(),
                out: Some(&y),
            }
            .run()?;
        }
        Ok(y)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PlanKind {
    Scaled {
        a_mode: i32,
        b_mode: i32,
        bias: bool,
        /// `CUBLASLT_MATMUL_DESC_FAST_ACCUM` (no periodic promotion of the FP8 sums).
        fast_accum: bool,
    },
    /// Scalar scales of 1 (none set).
    Unit,
}

/// One GEMM `D[m, n] = op(A)[m, k] · B[k, n]` (column-major, A stored `[k, m]`).
#[derive(Clone, Copy, Debug)]
struct Gemm {
    key: PlanKey,
    a: u64,
    b: u64,
    d: u64,
    a_scale: u64,
    b_scale: u64,
    bias: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    kind: PlanKind,
    m: usize,
    n: usize,
    k: usize,
    ld_ab: usize,
    d_type: DType,
}

/// A descriptor, its layouts and the chosen algorithm (None: cuBLASLt refused it).
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: Option<sys::cublasLtMatmulAlgo_t>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by `Plan::new`, destroyed once here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.d);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// One device's handle, workspace and plans.
struct Context {
    device: DeviceId,
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: HashMap<PlanKey, Plan>,
}

// SAFETY: the raw handles are used only under the CONTEXTS lock.
unsafe impl Send for Context {}

static CONTEXTS: Mutex<Vec<Context>> = Mutex::new(Vec::new());

/// Sets a descriptor attribute from a plain value.
unsafe fn set<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> std::result::Result<(), lt::CublasError> {
    lt::set_matmul_desc_attribute(
        desc,
        attr,
        v as *const T as *const c_void,
        std::mem::size_of::<T>(),
    )
}

use sys::cublasLtMatmulDescAttributes_t as Attr;

/// The per-call pointers of a plan's descriptor.
unsafe fn set_pointers(
    desc: sys::cublasLtMatmulDesc_t,
    g: &Gemm,
) -> std::result::Result<(), lt::CublasError> {
    if let PlanKind::Scaled { bias, .. } = g.key.kind {
        let (a, b) = (g.a_scale as *const c_void, g.b_scale as *const c_void);
        set(desc, Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a)?;
        set(desc, Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b)?;
        if bias {
            let p = g.bias as *const c_void;
            set(desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p)?;
        }
    }
    Ok(())
}

impl Plan {
    /// Descriptor and layouts; the algorithm from the heuristic (None if it finds none).
    unsafe fn new(
        handle: sys::cublasLtHandle_t,
        g: &Gemm,
    ) -> std::result::Result<Self, lt::CublasError> {
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )?;
        let e4m3 = sys::cudaDataType::CUDA_R_8F_E4M3;
        let mut plan = Plan {
            desc,
            a: lt::create_matrix_layout(e4m3, g.key.k as u64, g.key.m as u64, g.key.ld_ab as i64)?,
            b: lt::create_matrix_layout(e4m3, g.key.k as u64, g.key.n as u64, g.key.ld_ab as i64)?,
            d: lt::create_matrix_layout(
                lt_type(g.key.d_type),
                g.key.m as u64,
                g.key.n as u64,
                g.key.m as i64,
            )?,
            algo: None,
        };
        // cublasOperation_t: 1 = T, 0 = N
        set(desc, Attr::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?;
        set(desc, Attr::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?;
        if let PlanKind::Scaled {
            a_mode,
            b_mode,
            bias,
            fast_accum,
        } = g.key.kind
        {
            if fast_accum {
                set(desc, Attr::CUBLASLT_MATMUL_DESC_FAST_ACCUM, &1i8)?;
            }
            // a refused mode is a refusal of the plan, not an error of the call
            if set(desc, Attr::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode).is_err()
                || set(desc, Attr::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode).is_err()
            {
                return Ok(plan);
            }
            if bias {
                set(
                    desc,
                    Attr::CUBLASLT_MATMUL_DESC_EPILOGUE,
                    &(sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as u32),
                )?;
                set(
                    desc,
                    Attr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                    &(lt_type(g.key.d_type) as i32),
                )?;
            }
        }
        set_pointers(desc, g)?;
        let pref = lt::create_matmul_pref()?;
        let ws = WORKSPACE;
        lt::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws as *const usize as *const c_void,
            std::mem::size_of::<usize>(),
        )?;
        let h = lt::get_matmul_algo_heuristic(handle, desc, plan.a, plan.b, plan.d, plan.d, pref);
        let _ = lt::destroy_matmul_pref(pref);
        plan.algo = h.ok().map(|h| h.algo);
        Ok(plan)
    }
}

/// Runs `g` on the device's stream through its cached plan: Ok(false) where cuBLASLt
/// refuses it (no algorithm, or the matmul's status), remembered for the next call.
fn run_gemm(dev: &CudaDevice, g: &Gemm) -> Result<bool> {
    let stream = dev.cuda_stream();
    stream
        .context()
        .bind_to_thread()
        .map_err(candle_core::Error::wrap)?;
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    let i = match contexts.iter().position(|c| c.device == dev.id()) {
        Some(i) => i,
        None => {
            let handle =
                lt::create_handle().map_err(|e| cu(e, "FP8 linear: creating the handle"))?;
            let workspace = dev.alloc_zeros::<u8>(WORKSPACE)?;
            contexts.push(Context {
                device: dev.id(),
                handle,
                workspace,
                plans: HashMap::new(),
            });
            contexts.len() - 1
        }
    };
    let ctx = &mut contexts[i];
    let key = g.key;
    if !ctx.plans.contains_key(&key) {
        if ctx.plans.len() >= 512 {
            // token counts vary call to call (prefill lengths): keep the cache bounded
            ctx.plans.clear();
        }
        // SAFETY: the handle is live; the layouts describe the buffers of `g`.
        let plan = unsafe { Plan::new(ctx.handle, g) }
            .map_err(|e| cu(e, "FP8 linear: building the GEMM descriptor"))?;
        ctx.plans.insert(key, plan);
    }
    let handle = ctx.handle;
    let ws = ctx.workspace.device_ptr_mut(&stream).0;
    let plan = ctx.plans.get_mut(&key).expect("inserted above");
    let Some(algo) = plan.algo else {
        return Ok(false);
    };
    let (alpha, beta) = (1f32, 0f32);
    // SAFETY: A holds m·ld_ab codes (k ≤ ld_ab used per column), B n·ld_ab, D m·n of
    // d_type; the scale and bias pointers hold what their modes read (module doc).
    let status = unsafe {
        set_pointers(plan.desc, g).map_err(|e| cu(e, "FP8 linear: setting the GEMM's pointers"))?;
        lt::matmul(
            handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            g.a as *const c_void,
            plan.a,
            g.b as *const c_void,
            plan.b,
            g.d as *const c_void,
            plan.d,
            g.d as *mut c_void,
            plan.d,
            &algo,
            ws as *mut c_void,
            WORKSPACE,
            stream.cu_stream() as sys::cudaStream_t,
        )
    };
    match status {
        Ok(()) => Ok(true),
        Err(_) if g.key.kind != PlanKind::Unit => {
            plan.algo = None;
            Ok(false)
        }
        Err(e) => Err(cu(e, "FP8 linear: the GEMM")),
    }
}
