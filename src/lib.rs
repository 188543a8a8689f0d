//! mxattn: quantized attention for Candle.
//!
//! * [`mx`]: OCP MX formats (MXFP8/6/4), bit-exact codecs and packed tensors.
//! * [`attention`]: one attention entry point, [`attention::attention`], whose
//!   [`attention::AttentionConfig`] picks the softmax algorithm and the operand formats.
//! * `cpu` (internal): the scalar reference and the tiled CPU path of every algorithm.

pub mod attention;
pub(crate) mod cpu;
pub mod mx;
pub mod oracle;
pub mod synth;
