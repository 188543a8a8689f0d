//! What an attention call computes: the softmax algorithm, operand formats and masks.

use crate::mx::{ElemFormat, ScaleMode, DEFAULT_BLOCK};
use std::fmt;

/// Keys per tile of the online-softmax loop (the FlashAttention KV tile). P blocks and
/// the per-tile bookkeeping of every algorithm are defined relative to these tiles.
pub const KV_TILE: usize = 128;

/// How the softmax probabilities are produced from the scores.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Algorithm {
    /// FlashAttention's online softmax in f32: `P = exp(s − m)`, P kept in f32.
    /// With quantized Q/K/V formats this is the *operand floor*: exact softmax on the
    /// quantized operands.
    Exact,
    /// The conventional low-precision path both papers improve on: `P = exp(s − m)` in
    /// f32 per tile, then P quantized to [`AttentionConfig::p_format`] (32-key MX blocks
    /// or FP8), the same decoded P feeding `P·V` and the row sum.
    ExpThenQuantize,
    /// Fused-Softmax (AMD): scale·log2(e) folded into Q, scores biased so the QK
    /// accumulator *is* the FP8 code of P, a max frozen after the first KV tile with a
    /// rollback when a tile exceeds the code range, L summed from the same P.
    FusedSoftmax(FusedSoftmaxConfig),
    /// EFQ-Softmax: per 32-key block an exponent-only scale from the block max and E2M1
    /// codes straight from the shifted scores, no exp; everything else FlashAttention.
    Efq(EfqConfig),
}

impl Algorithm {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::ExpThenQuantize => "exp-then-quantize",
            Self::FusedSoftmax(c) => match c.probs {
                FusedProbs::U8Code => "fused-softmax/u8",
                FusedProbs::U8CodeWide => "fused-softmax/u8-wide",
                FusedProbs::Fp32Bits => "fused-softmax/fp32",
                FusedProbs::ExactE4M3 => "fused-softmax/exp2-e4m3",
                FusedProbs::ExactF32 => "fused-softmax/floor",
            },
            Self::Efq(c) => match c.rule {
                EfqRule::Mmlu => "efq-mmlu",
                EfqRule::Mean => "efq-mean",
                EfqRule::Balance => "efq-balance",
                EfqRule::Custom { .. } => "efq-custom",
                EfqRule::Lut => "efq-lut",
                EfqRule::ExactThresholds => "efq-exact",
                EfqRule::TwoPiece => "efq-2piece",
            },
        }
    }
}

/// How Fused-Softmax produces P from the biased QK accumulator (fused_softmax.md §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FusedProbs {
    /// `A = 8·(s − m) + 55.536`, P = E4M3 code `clamp(RNE(A), 0, 126)`: one round-and-
    /// saturate per score (AMD's MX kernels). Below code 8 the codes are E4M3 subnormals,
    /// linear rather than exponential, and scores more than ≈6.9 log2 units under the max
    /// flush to 0.
    #[default]
    U8Code,
    /// [`Self::U8Code`] with the frozen max placed 7 binades below E4M3's top instead of at
    /// code 55.5 (`m = first tile's max − 1/8 − 7`; a rollback keeps that margin): the same
    /// code generation, no exponential, but scores down to ≈13.9 log2 units under the max
    /// keep a code, at the cost of rollbacks when a later tile rises more than ≈1.9 units over
    /// the first. For rows with an attention sink, whose max sits far above the rest (see
    /// `README`, "Real-activation accuracy"). CPU only so far.
    U8CodeWide,
    /// `A = 2^23·(s − m) + OFF`, P = E4M3(bitcast_f32(u32(A))): the f32 bit pattern of
    /// ≈2^(s−m), rounded to E4M3 (AMD's FP8 kernels); keeps the low tail to 2^-9.
    Fp32Bits,
    /// `P = E4M3(exp2(s − m))` with the same folded, rotated, quantized operands and the
    /// same frozen max and rollback: isolates what the exp-free code generation adds.
    ExactE4M3,
    /// `P = exp2(s − m)` in f32 with FlashAttention's running max, on the same operands:
    /// the *operand floor* of Fused-Softmax (exact softmax of the quantized Q, K, V).
    ExactF32,
}

/// How EFQ maps a shifted score to an E2M1 code.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EfqRule {
    /// Published point fitted on MMLU (Qwen3-8B): τ = −2.90, h = 2.00.
    Mmlu,
    /// Published point fitted on the task mean (Qwen3-8B): τ = −3.06, h = 2.30.
    Mean,
    /// Published point fitted on Qwen3-VL: τ = −2.10, h = 2.70.
    Balance,
    /// Any (τ, h), natural-log units; h > 0.
    Custom { tau: f32, h: f32 },
    /// The paper's LUT ablation: a 16-level uniform index mapped to E2M1 by a table.
    Lut,
    /// Compare the shifted score with the 7 log-domain RNE boundaries: with the Floor or
    /// Rceil scale, bit-identical to exp → MXFP4 with that scale, with no exp.
    ExactThresholds,
    /// One affine step for codes ≥ 2 and two compares for codes 0/1: within ≈1 % of exact.
    TwoPiece,
}

impl EfqRule {
    /// (τ, h) of the affine rules.
    pub fn tau_h(self) -> Option<(f32, f32)> {
        match self {
            Self::Mmlu => Some((-2.90, 2.00)),
            Self::Mean => Some((-3.06, 2.30)),
            Self::Balance => Some((-2.10, 2.70)),
            Self::Custom { tau, h } => Some((tau, h)),
            _ => None,
        }
    }
}

/// The per-block scale exponent of EFQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EfqScale {
    /// EFQ's Eq. 8: `⌊(M_b + ln(2/9)) / ln 2⌋` (block max maps to [4.5, 9)).
    Efq,
    /// OCP floor of the block's P max: `⌊M_b·log2 e⌋ − 2`.
    Floor,
    /// RCEIL: `⌈M_b·log2 e − log2 6⌉` (never clips).
    Rceil,
}

/// Options of [`Algorithm::Efq`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EfqConfig {
    pub rule: EfqRule,
    pub scale: EfqScale,
    /// Keys per block (one scale each); divides the 128-key tile.
    pub block: usize,
}

impl EfqConfig {
    /// `rule` with its natural scale: EFQ's own for the published rules and the LUT, the
    /// OCP floor for `ExactThresholds` and `TwoPiece`; 32-key blocks.
    pub fn new(rule: EfqRule) -> Self {
        let scale = match rule {
            EfqRule::ExactThresholds | EfqRule::TwoPiece => EfqScale::Floor,
            _ => EfqScale::Efq,
        };
        Self {
            rule,
            scale,
            block: DEFAULT_BLOCK,
        }
    }
    pub fn with_scale(mut self, scale: EfqScale) -> Self {
        self.scale = scale;
        self
    }
}

/// Options of [`Algorithm::FusedSoftmax`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedSoftmaxConfig {
    pub probs: FusedProbs,
    /// Rotate Q and K by the normalized Hadamard along d before quantizing (AMD's
    /// kernels do; needs a power-of-two head dim).
    pub hadamard: bool,
}

impl Default for FusedSoftmaxConfig {
    fn default() -> Self {
        Self {
            probs: FusedProbs::U8Code,
            hadamard: true,
        }
    }
}

/// Format of a Q, K or V operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandFormat {
    /// The input values as given (f32, or the bf16/f16 values widened to f32).
    Native,
    /// Rounded to bf16.
    Bf16,
    /// OCP MX blocks: along the head dim for Q/K, along the keys for V (one E8M0 scale
    /// per `block` keys × 1 channel).
    Mx {
        elem: ElemFormat,
        scale: ScaleMode,
        block: usize,
    },
    /// FP8 with one f32 scale per channel (`amax_c / max_normal` over the valid keys).
    /// V only.
    PerChannel { elem: ElemFormat },
}

impl OperandFormat {
    /// MX with OCP block 32 and the OCP floor scale.
    pub fn mx(elem: ElemFormat) -> Self {
        Self::Mx {
            elem,
            scale: ScaleMode::Floor,
            block: DEFAULT_BLOCK,
        }
    }
    pub fn mx_with(elem: ElemFormat, scale: ScaleMode) -> Self {
        Self::Mx {
            elem,
            scale,
            block: DEFAULT_BLOCK,
        }
    }
    /// FP8 E4M3 with a per-channel f32 scale.
    pub fn fp8_per_channel() -> Self {
        Self::PerChannel {
            elem: ElemFormat::E4M3,
        }
    }
}

impl fmt::Display for OperandFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Native => f.write_str("native"),
            Self::Bf16 => f.write_str("bf16"),
            Self::Mx { elem, scale, block } => {
                write!(f, "{}-{}", elem.mx_name(), elem)?;
                if *scale != ScaleMode::Floor {
                    write!(f, "/{scale}")?;
                }
                if *block != DEFAULT_BLOCK {
                    write!(f, "/b{block}")?;
                }
                Ok(())
            }
            Self::PerChannel { elem } => write!(f, "{elem}/channel"),
        }
    }
}

/// Format of the probability operand P (the left operand of `P·V`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ProbFormat {
    /// f32, unquantized.
    #[default]
    F32,
    /// MX blocks of `block` consecutive keys of one query row (within a KV tile).
    Mx {
        elem: ElemFormat,
        scale: ScaleMode,
        block: usize,
    },
    /// FP8 with the fixed scale 2^8 (P ≤ 1 maps to ≤ 256), as FlashAttention-3's FP8
    /// path does.
    Fp8 { elem: ElemFormat },
}

impl ProbFormat {
    pub fn mx(elem: ElemFormat) -> Self {
        Self::Mx {
            elem,
            scale: ScaleMode::Floor,
            block: DEFAULT_BLOCK,
        }
    }
    pub fn mx_with(elem: ElemFormat, scale: ScaleMode) -> Self {
        Self::Mx {
            elem,
            scale,
            block: DEFAULT_BLOCK,
        }
    }
}

impl fmt::Display for ProbFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::F32 => f.write_str("f32"),
            Self::Mx { elem, scale, block } => {
                write!(f, "{}-{}/{}", elem.mx_name(), elem, scale)?;
                if *block != DEFAULT_BLOCK {
                    write!(f, "/b{block}")?;
                }
                Ok(())
            }
            Self::Fp8 { elem } => write!(f, "{elem}x256"),
        }
    }
}

/// Everything an attention call needs besides the tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionConfig {
    pub algorithm: Algorithm,
    /// Multiplies the raw scores; `None` means `1/√d`.
    pub softmax_scale: Option<f32>,
    /// Causal mask, bottom-right aligned: query i sees keys `j ≤ i + (kv_len − sq)`, so a
    /// decode step (sq = 1) sees every cached key.
    pub causal: bool,
    /// Valid key count per batch entry (key-padding mask); keys at or past it are masked.
    pub key_lengths: Option<Vec<usize>>,
    /// Q and K format (MX blocks run along the head dim).
    pub qk_format: OperandFormat,
    /// V format.
    pub v_format: OperandFormat,
    /// P format (ignored by [`Algorithm::Exact`], which must leave it `F32`).
    pub p_format: ProbFormat,
}

impl Default for AttentionConfig {
    fn default() -> Self {
        Self::exact()
    }
}

impl AttentionConfig {
    /// Exact softmax attention on unquantized operands.
    pub fn exact() -> Self {
        Self {
            algorithm: Algorithm::Exact,
            softmax_scale: None,
            causal: false,
            key_lengths: None,
            qk_format: OperandFormat::Native,
            v_format: OperandFormat::Native,
            p_format: ProbFormat::F32,
        }
    }

    /// Exp-then-quantize with the given formats.
    pub fn exp_then_quantize(qk: OperandFormat, v: OperandFormat, p: ProbFormat) -> Self {
        Self {
            algorithm: Algorithm::ExpThenQuantize,
            qk_format: qk,
            v_format: v,
            p_format: p,
            ..Self::exact()
        }
    }

    /// The same configuration with another algorithm (formats, masks and scale kept).
    pub fn with_algorithm(mut self, a: Algorithm) -> Self {
        self.algorithm = a;
        self
    }
    pub fn with_causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }
    pub fn with_softmax_scale(mut self, s: f32) -> Self {
        self.softmax_scale = Some(s);
        self
    }
    pub fn with_key_lengths(mut self, lens: Vec<usize>) -> Self {
        self.key_lengths = Some(lens);
        self
    }
    pub fn with_formats(mut self, qk: OperandFormat, v: OperandFormat, p: ProbFormat) -> Self {
        self.qk_format = qk;
        self.v_format = v;
        self.p_format = p;
        self
    }

    /// Fused-Softmax with AMD's Q/K rule for `qk` (MX blocks of 32 along d, the scale
    /// rule of [`fused_qk_format`]) and the given V format; P stays E4M3.
    pub fn fused_softmax(qk: ElemFormat, v: OperandFormat, fused: FusedSoftmaxConfig) -> Self {
        Self {
            algorithm: Algorithm::FusedSoftmax(fused),
            qk_format: fused_qk_format(qk),
            v_format: v,
            p_format: ProbFormat::F32,
            ..Self::exact()
        }
    }

    /// EFQ-Softmax with the given Q/K and V formats (P is EFQ's own block-scaled E2M1).
    pub fn efq(efq: EfqConfig, qk: OperandFormat, v: OperandFormat) -> Self {
        Self {
            algorithm: Algorithm::Efq(efq),
            qk_format: qk,
            v_format: v,
            ..Self::exact()
        }
    }

    /// A short label such as `exp-then-quantize qk=MXFP4-E2M1 v=E4M3/channel p=MXFP4-E2M1/floor`.
    pub fn label(&self) -> String {
        format!(
            "{} qk={} v={} p={}",
            self.algorithm.name(),
            self.qk_format,
            self.v_format,
            self.p_format
        )
    }
}

/// AMD aiter's Q/K quantization for Fused-Softmax (`mha_v4_quant.cu`): MX blocks of 32 along
/// d with the scale rule per element: E2M1 `⌈log2(amax/6)⌉` ([`ScaleMode::Rceil`]), E2M3
/// and E3M2 `⌊log2 amax⌋ − emax` ([`ScaleMode::Floor`]), E4M3 the round-up rule
/// ([`ScaleMode::RoundUp`]).
pub fn fused_qk_format(elem: ElemFormat) -> OperandFormat {
    let scale = match elem {
        ElemFormat::E2M1 => ScaleMode::Rceil,
        ElemFormat::E4M3 | ElemFormat::E5M2 => ScaleMode::RoundUp,
        ElemFormat::E2M3 | ElemFormat::E3M2 => ScaleMode::Floor,
    };
    OperandFormat::Mx {
        elem,
        scale,
        block: DEFAULT_BLOCK,
    }
}
