//! A per-layer KV cache that stores K and V in the layer's format.
//!
//! * `Model` / `Bf16`: plain tensors (the model dtype, or bf16), concatenated along the
//!   sequence.
//! * `Mx`: OCP MX codes plus E8M0 scales ([`mxattn::mx::quantize`]).
//!   - K is quantized **along the head dim**, one token at a time, exactly as the attention
//!     op quantizes Q/K (blocks of 32 channels of one token), so a cached key never
//!     depends on other tokens.
//!   - V is quantized **along the keys** in blocks of `block` (32) consecutive tokens per
//!     channel, as the op quantizes V. A block is quantized only once it is full; the last,
//!     partial block stays unquantized (model dtype) until it fills. So the cache after n
//!     tokens is the same function of the n tokens whether they arrived in one prefill or
//!     one by one, and the blocks sit where the op puts them (from key 0).
//!
//! Attention then runs on the dequantized cache with the layer's own formats. The op
//! quantizes its inputs again, and that is harmless: MX quantize∘dequantize is a fixed
//! point. Under the OCP Floor rule the block max code lies in [2^emax, max], so the
//! re-derived scale is the same and every value is already on the grid (codes and scales
//! come back identical); under Ceil, Rceil and Even the represented values come back
//! identical (a re-derived scale can only drop, and a finer grid holds the coarser one);
//! `tests/mx_tensor.rs` checks all four. With AMD's MXFP8 round-up rule a block whose max
//! code is 448 re-derives a scale one binade up, which can flush its E4M3 subnormals
//! (below 2^-9 of 448, ~5·10^-6 of the block max). A partial V block is quantized by the
//! op over the keys present, exactly as if the sequence ended there. Net effect: a decode
//! step computes what the op computes on the unquantized K/V it has seen
//! (`tests/qwen3.rs` checks this bit for bit). Setting the op's K/V formats to Native
//! instead would be wrong twice over: Q/K share one format, and the raw V tail would
//! escape quantization.
//!
//! One difference from a causal prefill is inherent to MX V along keys: in a prefill, the
//! scale of a V block is taken over all of its 32 keys, so a query sees a scale that
//! includes keys after it (whose probabilities are masked to zero), while in decode the
//! block is still partial. Prefill and step-by-step logits of MX-V layers therefore differ
//! at the quantization-noise level.

use candle_core::{bail, DType, Result, Shape, Tensor};
use mxattn::attention::OperandFormat;
use mxattn::mx::{quantize, ElemFormat, MxTensor, ScaleMode};
use std::fmt;

/// How one operand (K or V) is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheFormat {
    /// The model dtype, as computed.
    Model,
    /// Rounded to bf16 (half of f32 storage; the same values for a bf16 model).
    Bf16,
    /// MX codes and E8M0 scales, in blocks of `block` (along d for K, along keys for V).
    Mx {
        elem: ElemFormat,
        scale: ScaleMode,
        block: usize,
    },
}

impl CacheFormat {
    /// How a cache keeps an operand the op quantizes to `f`: MX → the same MX codes (element,
    /// scale rule, block), bf16 → bf16, anything else (native; per-channel FP8 V, whose
    /// scale spans all keys) → the model dtype.
    pub fn for_operand(f: OperandFormat) -> Self {
        match f {
            OperandFormat::Mx { elem, scale, block } => Self::Mx { elem, scale, block },
            OperandFormat::Bf16 => Self::Bf16,
            OperandFormat::Native | OperandFormat::PerChannel { .. } => Self::Model,
        }
    }
}

impl fmt::Display for CacheFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Model => f.write_str("model dtype"),
            Self::Bf16 => f.write_str("bf16"),
            Self::Mx { elem, scale, block } => {
                write!(f, "{}-{}", elem.mx_name(), elem)?;
                if *scale != ScaleMode::Floor {
                    write!(f, "/{scale}")?;
                }
                if *block != mxattn::mx::DEFAULT_BLOCK {
                    write!(f, "/b{block}")?;
                }
                Ok(())
            }
        }
    }
}

/// The storage of one layer's K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvFormat {
    pub k: CacheFormat,
    pub v: CacheFormat,
}

impl KvFormat {
    pub const MODEL: KvFormat = KvFormat {
        k: CacheFormat::Model,
        v: CacheFormat::Model,
    };
}

impl fmt::Display for KvFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "K {}, V {}", self.k, self.v)
    }
}

fn cat_opt(a: &Option<Tensor>, b: &Tensor, dim: usize) -> Result<Tensor> {
    match a {
        None => Ok(b.clone()),
        Some(a) => Tensor::cat(&[a, b], dim),
    }
}

fn bytes_of(t: &Option<Tensor>) -> usize {
    t.as_ref()
        .map_or(0, |t| t.elem_count() * t.dtype().size_in_bytes())
}

/// K: one entry per token.
#[derive(Clone, Debug)]
enum KStore {
    Dense(Option<Tensor>),
    /// codes `[b, h, s, packed(d)]`, scales `[b, h, s, d/block]`
    Mx {
        codes: Option<Tensor>,
        scales: Option<Tensor>,
    },
}

/// V: full blocks quantized along the keys, the partial block raw.
#[derive(Clone, Debug)]
enum VStore {
    Dense(Option<Tensor>),
    /// codes `[b, h, d, packed(n_full)]`, scales `[b, h, d, n_full/block]`, tail
    /// `[b, h, < block, d]` in the model dtype
    Mx {
        codes: Option<Tensor>,
        scales: Option<Tensor>,
        n_full: usize,
        tail: Option<Tensor>,
    },
}

/// The cache of one attention layer. K and V come in as `[b, hkv, t, d]`.
#[derive(Clone, Debug)]
pub struct LayerKvCache {
    format: KvFormat,
    k: KStore,
    v: VStore,
    len: usize,
    /// `[b, hkv, d]` and dtype of the first append, to check later ones
    geometry: Option<(usize, usize, usize, DType)>,
}

/// Appends `x` along the sequence dim of a dense (bf16 or model-dtype) store.
fn push_dense(store: &mut Option<Tensor>, x: &Tensor, fmt: CacheFormat) -> Result<()> {
    let stored = if fmt == CacheFormat::Bf16 {
        x.to_dtype(DType::BF16)?
    } else {
        x.clone()
    };
    *store = Some(cat_opt(store, &stored, 2)?);
    Ok(())
}

impl LayerKvCache {
    pub fn new(format: KvFormat) -> Self {
        let k = match format.k {
            CacheFormat::Mx { .. } => KStore::Mx {
                codes: None,
                scales: None,
            },
            _ => KStore::Dense(None),
        };
        let v = match format.v {
            CacheFormat::Mx { .. } => VStore::Mx {
                codes: None,
                scales: None,
                n_full: 0,
                tail: None,
            },
            _ => VStore::Dense(None),
        };
        Self {
            format,
            k,
            v,
            len: 0,
            geometry: None,
        }
    }

    pub fn format(&self) -> KvFormat {
        self.format
    }

    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn reset(&mut self) {
        *self = Self::new(self.format);
    }

    /// Elements of the cached K (the same for V): b · hkv · len · d.
    pub fn elements(&self) -> usize {
        self.geometry.map_or(0, |(b, h, d, _)| b * h * d * self.len)
    }

    /// Bytes held: codes, scales, the unquantized V tail and plain tensors.
    pub fn bytes(&self) -> usize {
        let k = match &self.k {
            KStore::Dense(t) => bytes_of(t),
            KStore::Mx { codes, scales } => bytes_of(codes) + bytes_of(scales),
        };
        let v = match &self.v {
            VStore::Dense(t) => bytes_of(t),
            VStore::Mx {
                codes,
                scales,
                tail,
                ..
            } => bytes_of(codes) + bytes_of(scales) + bytes_of(tail),
        };
        k + v
    }

    /// Appends `k`, `v` (`[b, hkv, t, d]`, the model dtype) and returns the whole cached
    /// K and V, dequantized to that dtype.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        self.push(k, v)?;
        self.dequantized()
    }

    /// Appends `k`, `v` (`[b, hkv, t, d]`, the model dtype), storing them in the cache's
    /// format. A kernel that reads codes directly follows this with [`Self::k_view`] and
    /// [`Self::v_view`] instead of [`Self::dequantized`].
    pub fn push(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let (b, h, t, d) = k.dims4()?;
        if v.dims() != k.dims() {
            bail!(
                "kv cache: k {:?} and v {:?} differ in shape",
                k.dims(),
                v.dims()
            );
        }
        let dtype = k.dtype();
        if v.dtype() != dtype {
            bail!("kv cache: k is {dtype:?} but v is {:?}", v.dtype());
        }
        match self.geometry {
            None => self.geometry = Some((b, h, d, dtype)),
            Some(g) if g != (b, h, d, dtype) => bail!(
                "kv cache: appending [{b}, {h}, _, {d}] {dtype:?} to a cache of [{}, {}, _, {}] {:?}",
                g.0,
                g.1,
                g.2,
                g.3
            ),
            _ => {}
        }
        if t == 0 {
            bail!("kv cache: nothing to append (0 tokens)");
        }
        self.push_k(&k.contiguous()?)?;
        self.push_v(&v.contiguous()?)?;
        self.len += t;
        Ok(())
    }

    fn push_k(&mut self, k: &Tensor) -> Result<()> {
        let fmt = self.format.k;
        match (&mut self.k, fmt) {
            (KStore::Dense(store), _) => push_dense(store, k, fmt)?,
            (KStore::Mx { codes, scales }, CacheFormat::Mx { elem, scale, block }) => {
                let q = quantize(k, elem, scale, 3, block)?;
                *codes = Some(cat_opt(codes, q.codes(), 2)?);
                *scales = Some(cat_opt(scales, q.scales(), 2)?);
            }
            (KStore::Mx { .. }, _) => unreachable!("store built from the format"),
        }
        Ok(())
    }

    fn push_v(&mut self, v: &Tensor) -> Result<()> {
        let fmt = self.format.v;
        match (&mut self.v, fmt) {
            (VStore::Dense(store), _) => push_dense(store, v, fmt)?,
            (
                VStore::Mx {
                    codes,
                    scales,
                    n_full,
                    tail,
                },
                CacheFormat::Mx { elem, scale, block },
            ) => {
                let pending = cat_opt(tail, v, 2)?;
                let np = pending.dim(2)?;
                let ready = np / block * block;
                if ready > 0 {
                    let chunk = pending.narrow(2, 0, ready)?;
                    let q = quantize(&chunk, elem, scale, 2, block)?;
                    // Whole blocks fill whole bytes, so packed rows concatenate.
                    *codes = Some(cat_opt(codes, q.codes(), 3)?);
                    *scales = Some(cat_opt(scales, q.scales(), 3)?);
                    *n_full += ready;
                }
                *tail = if np > ready {
                    Some(pending.narrow(2, ready, np - ready)?.contiguous()?)
                } else {
                    None
                };
            }
            (VStore::Mx { .. }, _) => unreachable!("store built from the format"),
        }
        Ok(())
    }

    /// The cached K as stored: a tensor (`[b, hkv, len, d]`), or MX along d over all
    /// tokens. `None` while empty.
    pub fn k_view(&self) -> Result<Option<CachedOperand<'_>>> {
        let Some((b, h, d, _)) = self.geometry else {
            return Ok(None);
        };
        Ok(match (&self.k, self.format.k) {
            (KStore::Dense(t), _) => t.as_ref().map(CachedOperand::Dense),
            (KStore::Mx { codes, scales }, CacheFormat::Mx { elem, scale, block }) => {
                match (codes, scales) {
                    (Some(c), Some(s)) => Some(CachedOperand::Mx {
                        full: Some(MxTensor::from_parts(
                            c.clone(),
                            s.clone(),
                            elem,
                            scale,
                            block,
                            3,
                            Shape::from_dims(&[b, h, self.len, d]),
                        )?),
                        tail: None,
                    }),
                    _ => None,
                }
            }
            (KStore::Mx { .. }, _) => unreachable!("store built from the format"),
        })
    }

    /// The cached V as stored: a tensor, or MX along the keys over the full blocks
    /// (`[b, hkv, n_full, d]`) followed by the unquantized tail (`[b, hkv, < block, d]`).
    pub fn v_view(&self) -> Result<Option<CachedOperand<'_>>> {
        let Some((b, h, d, _)) = self.geometry else {
            return Ok(None);
        };
        Ok(match (&self.v, self.format.v) {
            (VStore::Dense(t), _) => t.as_ref().map(CachedOperand::Dense),
            (
                VStore::Mx {
                    codes,
                    scales,
                    n_full,
                    tail,
                },
                CacheFormat::Mx { elem, scale, block },
            ) => {
                let full = match (codes, scales) {
                    (Some(c), Some(s)) => Some(MxTensor::from_parts(
                        c.clone(),
                        s.clone(),
                        elem,
                        scale,
                        block,
                        2,
                        Shape::from_dims(&[b, h, *n_full, d]),
                    )?),
                    _ => None,
                };
                Some(CachedOperand::Mx {
                    full,
                    tail: tail.as_ref(),
                })
            }
            (VStore::Mx { .. }, _) => unreachable!("store built from the format"),
        })
    }

    /// The whole cached K and V, dequantized to the dtype they were appended in.
    pub fn dequantized(&self) -> Result<(Tensor, Tensor)> {
        let Some((_, _, _, dtype)) = self.geometry else {
            bail!("kv cache: empty");
        };
        let k = self.k_view()?.expect("non-empty").to_tensor(dtype)?;
        let v = self.v_view()?.expect("non-empty").to_tensor(dtype)?;
        Ok((k, v))
    }
}

/// One cached operand as stored (see [`LayerKvCache::k_view`], [`LayerKvCache::v_view`]):
/// the attention module's [`KvOperand`], which `attention_decode` reads directly.
pub use mxattn::attention::KvOperand as CachedOperand;
