//! [`MxTensor`]: a Candle tensor quantized to an OCP MX format along one dimension.

use super::block::{dequantize_block, quantize_block};
use super::element::ElemFormat;
use super::pack::{pack, pack_granule, packed_len, unpack};
use super::scale::ScaleMode;
use candle_core::{bail, DType, Device, Result, Shape, Tensor};
use rayon::prelude::*;

/// The block size of OCP MX v1.0.
pub const DEFAULT_BLOCK: usize = 32;

/// A tensor in MX form.
///
/// Layout: the quantized dimension `dim` is moved last, the other dimensions keep their
/// order. With `n` the length of `dim` and `n_pad = ⌈n / block⌉·block`,
/// * `codes` is `U8` of shape `[other dims…, packed_len(n_pad)]` (see [`super::pack`]),
///   the padding codes being zero;
/// * `scales` is `U8` (E8M0 bytes) of shape `[other dims…, ⌈n / block⌉]`.
///
/// A last partial block (n not a multiple of `block`) is scaled over its own elements.
#[derive(Clone, Debug)]
pub struct MxTensor {
    codes: Tensor,
    scales: Tensor,
    format: ElemFormat,
    scale_mode: ScaleMode,
    block: usize,
    dim: usize,
    shape: Shape,
}

impl MxTensor {
    /// Reassembles an `MxTensor` from codes and scales laid out as [`quantize`] makes them
    /// (for example rows of several quantized tensors concatenated, as a KV cache does).
    /// Checks dtypes and shapes against `shape`, `dim` and `block`.
    pub fn from_parts(
        codes: Tensor,
        scales: Tensor,
        format: ElemFormat,
        scale_mode: ScaleMode,
        block: usize,
        dim: usize,
        shape: Shape,
    ) -> Result<Self> {
        let dims = shape.dims();
        if dim >= dims.len() {
            bail!(
                "MxTensor::from_parts: dim {dim} out of range for shape {:?}",
                dims
            );
        }
        let g = pack_granule(format.bits());
        if block == 0 || !block.is_multiple_of(g) {
            bail!("MxTensor::from_parts: block size {block} invalid for {format}");
        }
        if codes.dtype() != DType::U8 || scales.dtype() != DType::U8 {
            bail!(
                "MxTensor::from_parts: codes and scales must be U8, got {:?} and {:?}",
                codes.dtype(),
                scales.dtype()
            );
        }
        let nb = dims[dim].div_ceil(block);
        let mut cshape = moved_dims(dims, dim);
        let last = cshape.len() - 1;
        cshape[last] = packed_len(nb * block, format.bits());
        let mut sshape = cshape.clone();
        sshape[last] = nb;
        if codes.dims() != cshape.as_slice() || scales.dims() != sshape.as_slice() {
            bail!(
                "MxTensor::from_parts: for shape {:?} along dim {dim} ({format}, block {block}) codes must be {:?} \
                 and scales {:?}, got {:?} and {:?}",
                dims,
                cshape,
                sshape,
                codes.dims(),
                scales.dims()
            );
        }
        Ok(Self {
            codes,
            scales,
            format,
            scale_mode,
            block,
            dim,
            shape,
        })
    }

    /// Packed element codes (`U8`).
    pub fn codes(&self) -> &Tensor {
        &self.codes
    }
    /// E8M0 scale bytes (`U8`).
    pub fn scales(&self) -> &Tensor {
        &self.scales
    }
    pub fn format(&self) -> ElemFormat {
        self.format
    }
    pub fn scale_mode(&self) -> ScaleMode {
        self.scale_mode
    }
    pub fn block(&self) -> usize {
        self.block
    }
    /// The quantized dimension of the logical tensor.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// The logical shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// Bytes of codes plus scales.
    pub fn storage_bytes(&self) -> usize {
        self.codes.elem_count() + self.scales.elem_count()
    }

    /// Unpacked codes, one `u8` per element, of the logical tensor with `dim` moved last
    /// (padding dropped). Mostly for tests and tools.
    pub fn unpacked_codes(&self) -> Result<Vec<u8>> {
        let (rows, n, n_pad, _) = self.geometry();
        let bits = self.format.bits();
        let packed = self.codes.flatten_all()?.to_vec1::<u8>()?;
        let row_bytes = packed_len(n_pad, bits);
        let mut out = Vec::with_capacity(rows * n);
        let mut buf = vec![0u8; n_pad];
        for r in 0..rows {
            unpack(&packed[r * row_bytes..(r + 1) * row_bytes], bits, &mut buf);
            out.extend_from_slice(&buf[..n]);
        }
        Ok(out)
    }

    /// (rows, n, n_pad, n_blocks)
    fn geometry(&self) -> (usize, usize, usize, usize) {
        let n = self.shape.dims()[self.dim];
        let rows = self.shape.elem_count() / n.max(1);
        let nb = n.div_ceil(self.block);
        (rows, n, nb * self.block, nb)
    }

    /// The represented values as an `F32` tensor of the logical shape, on the codes' device.
    pub fn dequantize(&self) -> Result<Tensor> {
        let (rows, n, n_pad, nb) = self.geometry();
        #[cfg(feature = "cuda")]
        if self.codes.device().is_cuda() {
            let op = crate::cuda::mx::DequantizeOp {
                fmt: self.format,
                block: self.block,
                rows,
                n,
            };
            let bits = self.format.bits();
            let codes = self.codes.reshape((rows, packed_len(n_pad, bits)))?;
            let scales = self.scales.reshape((rows, nb))?;
            let flat = codes.apply_op2_no_bwd(&scales, &op)?;
            let moved = moved_dims(self.shape.dims(), self.dim);
            return restore_dim(&flat.reshape(moved)?, self.dim);
        }
        let bits = self.format.bits();
        let row_bytes = packed_len(n_pad, bits);
        let packed = self.codes.flatten_all()?.to_vec1::<u8>()?;
        let scales = self.scales.flatten_all()?.to_vec1::<u8>()?;
        let mut vals = vec![0f32; rows * n];
        let (fmt, block) = (self.format, self.block);
        if n > 0 {
            vals.par_chunks_mut(n).enumerate().for_each(|(r, out)| {
                let mut codes = vec![0u8; n_pad];
                unpack(
                    &packed[r * row_bytes..(r + 1) * row_bytes],
                    bits,
                    &mut codes,
                );
                for (b, ob) in out.chunks_mut(block).enumerate() {
                    let cb = &codes[b * block..b * block + ob.len()];
                    dequantize_block(cb, scales[r * nb + b], fmt, ob);
                }
            });
        }
        let moved = moved_dims(self.shape.dims(), self.dim);
        let t = Tensor::from_vec(vals, moved, &Device::Cpu)?;
        let t = restore_dim(&t, self.dim)?;
        t.to_device(self.codes.device())
    }
}

/// Quantize `t` (F32, BF16, F16 or F64) to `fmt` in blocks of `block` elements along `dim`.
///
/// `block` must be positive and fill whole bytes (even for FP4, a multiple of 4 for FP6).
/// The arithmetic runs on the CPU; the result lives on `t`'s device.
pub fn quantize(
    t: &Tensor,
    fmt: ElemFormat,
    mode: ScaleMode,
    dim: usize,
    block: usize,
) -> Result<MxTensor> {
    let dims = t.dims().to_vec();
    if dim >= dims.len() {
        bail!(
            "mx::quantize: dim {dim} out of range for a rank-{} tensor",
            dims.len()
        );
    }
    if !matches!(
        t.dtype(),
        DType::F32 | DType::BF16 | DType::F16 | DType::F64
    ) {
        bail!(
            "mx::quantize: expected a float tensor (f32, bf16, f16, f64), got {:?}",
            t.dtype()
        );
    }
    let g = pack_granule(fmt.bits());
    if block == 0 || !block.is_multiple_of(g) {
        bail!(
            "mx::quantize: block size {block} invalid for {fmt} ({}-bit codes need a positive multiple of {g})",
            fmt.bits()
        );
    }
    let n = dims[dim];
    let rows = t.elem_count() / n.max(1);
    let nb = n.div_ceil(block);
    let n_pad = nb * block;
    let bits = fmt.bits();
    let row_bytes = packed_len(n_pad, bits);

    #[cfg(feature = "cuda")]
    if t.device().is_cuda() {
        let op = crate::cuda::mx::QuantizeOp {
            fmt,
            mode,
            block,
            rows,
            n,
            row_bytes,
            nb,
        };
        let packed = move_dim_last(t, dim)?
            .reshape((rows, n))?
            .apply_op1_no_bwd(&op)?;
        let mut cshape = moved_dims(&dims, dim);
        let last = cshape.len() - 1;
        cshape[last] = row_bytes;
        let mut sshape = cshape.clone();
        sshape[last] = nb;
        return Ok(MxTensor {
            codes: packed
                .narrow(1, 0, row_bytes)?
                .contiguous()?
                .reshape(cshape)?,
            scales: packed
                .narrow(1, row_bytes, nb)?
                .contiguous()?
                .reshape(sshape)?,
            format: fmt,
            scale_mode: mode,
            block,
            dim,
            shape: Shape::from_dims(&dims),
        });
    }
    let moved = move_dim_last(t, dim)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_device(&Device::Cpu)?
        .to_vec1::<f32>()?;
    let mut packed = vec![0u8; rows * row_bytes];
    let mut scales = vec![0u8; rows * nb];
    if n > 0 && rows > 0 {
        packed
            .par_chunks_mut(row_bytes)
            .zip(scales.par_chunks_mut(nb))
            .enumerate()
            .for_each(|(r, (prow, srow))| {
                let x = &moved[r * n..(r + 1) * n];
                let mut codes = vec![0u8; n_pad];
                for (b, xb) in x.chunks(block).enumerate() {
                    srow[b] =
                        quantize_block(xb, fmt, mode, &mut codes[b * block..b * block + xb.len()]);
                }
                pack(&codes, bits, prow);
            });
    }
    let mut cshape = moved_dims(&dims, dim);
    let last = cshape.len() - 1;
    cshape[last] = row_bytes;
    let mut sshape = cshape.clone();
    sshape[last] = nb;
    let dev = t.device();
    Ok(MxTensor {
        codes: Tensor::from_vec(packed, cshape, &Device::Cpu)?.to_device(dev)?,
        scales: Tensor::from_vec(scales, sshape, &Device::Cpu)?.to_device(dev)?,
        format: fmt,
        scale_mode: mode,
        block,
        dim,
        shape: Shape::from_dims(&dims),
    })
}

fn moved_dims(dims: &[usize], dim: usize) -> Vec<usize> {
    let mut d: Vec<usize> = dims.to_vec();
    let n = d.remove(dim);
    d.push(n);
    d
}

fn move_dim_last(t: &Tensor, dim: usize) -> Result<Tensor> {
    let r = t.rank();
    if dim == r - 1 {
        return t.contiguous();
    }
    let mut perm: Vec<usize> = (0..r).filter(|&i| i != dim).collect();
    perm.push(dim);
    t.permute(perm)?.contiguous()
}

fn restore_dim(t: &Tensor, dim: usize) -> Result<Tensor> {
    let r = t.rank();
    if dim == r - 1 {
        return Ok(t.clone());
    }
    // t's axes are [others…, dim]; put the last axis back at `dim`.
    let mut perm: Vec<usize> = (0..r - 1).collect();
    perm.insert(dim, r - 1);
    t.permute(perm)?.contiguous()
}
