//! Fused elementwise ops for the layers around attention in the model code: each replaces a
//! chain of Candle ops (casts, norms, broadcast mul/add, layout copies) that would each read
//! and write the whole activation, by one pass. Each op has a CPU implementation, the
//! reference, and a CUDA kernel of the same name in `kernels/` (`ada_layer_norm.cu`,
//! `split_heads.cu`, `merge_heads.cu`, `bias_residual.cu`, `bias_gelu.cu`).
//!
//! Arithmetic is f32 whatever the storage dtype; where the unfused chain would store an
//! intermediate in the tensor dtype (a projection plus its bias, an RMSNorm output), the fused
//! op rounds it there too, so both agree to rounding of the f32 sums (the CPU sums in f64).

mod ada_layer_norm;
mod bias_gelu;
mod bias_residual;
#[cfg(feature = "cuda")]
pub mod fp8;
mod merge_heads;
mod split_heads;

pub use ada_layer_norm::ada_layer_norm;
pub use bias_gelu::bias_gelu;
pub use bias_residual::bias_residual;
pub use merge_heads::merge_heads;
pub use split_heads::{split_heads, SplitHeads};

/// An f32 per-row parameter of a fused op (a modulation shift or scale, a gate): `rows`
/// `[b | 1, n | 1, d]` (views allowed), plus `add`, a `[d]` vector added to every row in f32 if
/// given. The Wan blocks pass the timestep projection as `rows` and their `scale_shift_table` row
/// as `add`, so the per-token `[tokens, 6, dim]` sum is never written.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    pub rows: &'a Tensor,
    pub add: Option<&'a Tensor>,
}

impl<'a> Rows<'a> {
    pub fn of(rows: &'a Tensor) -> Self {
        Self { rows, add: None }
    }

    pub fn plus(rows: &'a Tensor, add: &'a Tensor) -> Self {
        Self {
            rows,
            add: Some(add),
        }
    }
}

#[cfg(feature = "cuda")]
pub(crate) use ada_layer_norm::AdaLayerNormOp;
#[cfg(feature = "cuda")]
pub(crate) use bias_gelu::BiasGeluOp;
#[cfg(feature = "cuda")]
pub(crate) use bias_residual::BiasResidualOp;
#[cfg(feature = "cuda")]
pub(crate) use merge_heads::MergeHeadsOp;
#[cfg(feature = "cuda")]
pub(crate) use split_heads::SplitHeadsOp;

use candle_core::{bail, CpuStorage, DType, Layout, Result, Storage, Tensor};

/// The float element types the ops take, converted through f32.
pub(crate) trait Float: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    /// The value after a store in this type and a load back.
    fn round(v: f32) -> f32 {
        Self::from_f32(v).to_f32()
    }
}

impl Float for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Float for half::bf16 {
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v)
    }
}

impl Float for half::f16 {
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

/// Calls `$body` with `$x` the typed slice of a float CPU storage and `$T` its element type,
/// wrapping the returned `Vec<$T>` back into a storage.
macro_rules! cpu_float_dispatch {
    ($op:expr, $storage:expr, |$x:ident : $T:ident| $body:expr) => {
        match $storage {
            candle_core::CpuStorage::F32($x) => {
                type $T = f32;
                candle_core::CpuStorage::F32($body)
            }
            candle_core::CpuStorage::BF16($x) => {
                type $T = half::bf16;
                candle_core::CpuStorage::BF16($body)
            }
            candle_core::CpuStorage::F16($x) => {
                type $T = half::f16;
                candle_core::CpuStorage::F16($body)
            }
            s => candle_core::bail!(
                "{}: dtype {:?} unsupported (f32, bf16, f16)",
                $op,
                candle_core::backend::BackendStorage::dtype(s)
            ),
        }
    };
}
pub(crate) use cpu_float_dispatch;

/// `CustomOp1` for a one-input fused op `$ty`: on the CPU, `self.$cpu::<T>(contiguous input)`
/// (`-> Result<Vec<T>>`, same shape) for each float dtype; on CUDA, `crate::cuda::fused::$cuda`.
macro_rules! fused_op1 {
    ($ty:ty, $name:literal, $op:expr, $cpu:ident, $cuda:ident) => {
        impl candle_core::CustomOp1 for $ty {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                s: &candle_core::CpuStorage,
                l: &candle_core::Layout,
            ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
                let out = $crate::fused::cpu_float_dispatch!($op, s, |x: T| {
                    self.$cpu::<T>($crate::fused::contiguous_slice($op, x, l)?)?
                });
                Ok((out, l.shape().clone()))
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self,
                s: &candle_core::CudaStorage,
                l: &candle_core::Layout,
            ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
                $crate::cuda::fused::$cuda(self, s, l)
            }
        }
    };
}
pub(crate) use fused_op1;

/// The elements of a contiguous CPU storage from its layout's start.
pub(crate) fn contiguous_slice<'a, T>(op: &str, x: &'a [T], l: &Layout) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&x[a..b]),
        None => bail!("{op}: internal error: non-contiguous input"),
    }
}

/// An f32 per-row parameter of `[b | 1, n | 1, d]` (a modulation shift, scale or gate), read
/// in place from a possibly strided view: element `(i, t, c)` sits at `start + i·s_b + t·s_n + c`.
#[derive(Clone, Debug)]
pub(crate) struct RowParam {
    pub t: Tensor,
    pub s_b: usize,
    pub s_n: usize,
    /// f32 `[d]`, contiguous.
    pub add: Option<Tensor>,
}

impl RowParam {
    pub fn new(op: &str, what: &str, r: Rows, b: usize, n: usize, d: usize) -> Result<Self> {
        let add = match r.add {
            Some(a) => Some(vector(
                op,
                &format!("{what}'s added vector"),
                a,
                d,
                DType::F32,
            )?),
            None => None,
        };
        let p = r.rows;
        let p = if p.dtype() == DType::F32 {
            p.clone()
        } else {
            p.to_dtype(DType::F32)?
        };
        let dims = p.dims().to_vec();
        let fits = dims.len() == 3
            && (dims[0] == b || dims[0] == 1)
            && (dims[1] == n || dims[1] == 1)
            && dims[2] == d;
        if !fits {
            bail!("{op}: {what} must be [{b} | 1, {n} | 1, {d}], got {dims:?}");
        }
        let p = if p.stride()[2] == 1 {
            p
        } else {
            p.contiguous()?
        };
        let st = p.stride();
        let s_b = if dims[0] == 1 { 0 } else { st[0] };
        let s_n = if dims[1] == 1 { 0 } else { st[1] };
        Ok(Self {
            t: p,
            s_b,
            s_n,
            add,
        })
    }

    /// The values on the CPU as an accessor: `f(&CpuRows)`.
    pub fn with_cpu<R>(&self, f: impl FnOnce(&CpuRows) -> R) -> Result<R> {
        let add = match &self.add {
            Some(a) => Some(host_f32(a)?),
            None => None,
        };
        let (st, l) = self.t.storage_and_layout();
        match &*st {
            Storage::Cpu(CpuStorage::F32(v)) => Ok(f(&CpuRows {
                v: &v[l.start_offset()..],
                add: add.as_deref(),
                s_b: self.s_b,
                s_n: self.s_n,
            })),
            _ => bail!("internal error: CPU row parameter not on the CPU as f32"),
        }
    }
}

/// A [`RowParam`]'s values on the CPU.
pub(crate) struct CpuRows<'a> {
    v: &'a [f32],
    add: Option<&'a [f32]>,
    s_b: usize,
    s_n: usize,
}

impl CpuRows<'_> {
    /// Element `c` of row `(i, t)`: the row value plus the added vector's.
    #[inline]
    pub fn at(&self, i: usize, t: usize, c: usize) -> f32 {
        let v = self.v[i * self.s_b + t * self.s_n + c];
        match self.add {
            Some(a) => v + a[c],
            None => v,
        }
    }
}

/// A `[d]` vector (bias, norm weight) in `dtype`, contiguous, checked.
pub(crate) fn vector(op: &str, what: &str, v: &Tensor, d: usize, dtype: DType) -> Result<Tensor> {
    if v.dims() != [d] {
        bail!("{op}: {what} must be [{d}], got {:?}", v.dims());
    }
    v.to_dtype(dtype)?.contiguous()
}

/// A small tensor's values as f32 on the host (biases, norm weights, RoPE tables: CPU path only).
pub(crate) fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

/// The `[b, n, d]` dims of a float activation, with a clear error otherwise.
pub(crate) fn activation_dims(op: &str, x: &Tensor) -> Result<(usize, usize, usize)> {
    if !matches!(x.dtype(), DType::F32 | DType::BF16 | DType::F16) {
        bail!("{op}: dtype {:?} unsupported (f32, bf16, f16)", x.dtype());
    }
    match x.dims() {
        [b, n, d] if *b > 0 && *n > 0 && *d > 0 => Ok((*b, *n, *d)),
        dims => bail!("{op}: expected a non-empty [batch, tokens, dim] tensor, got {dims:?}"),
    }
}
