//! OCP Microscaling (MX v1.0) formats: element codecs, E8M0 scales, block quantization
//! and the packed [`MxTensor`].
//!
//! | format | elements | bits | max | scale |
//! |---|---|---|---|---|
//! | MXFP8 | E4M3 / E5M2 | 8 | 448 / 57344 | E8M0 per 32 |
//! | MXFP6 | E2M3 / E3M2 | 6 | 7.5 / 28 | E8M0 per 32 |
//! | MXFP4 | E2M1 | 4 | 6 | E8M0 per 32 |

pub mod block;
pub mod element;
pub mod pack;
pub mod scale;
pub mod tensor;

pub use block::{dequantize_block, fake_quantize, fake_quantize_per_tensor, quantize_block};
pub use element::{ElemFormat, ALL_FORMATS};
pub use scale::{e8m0_decode, e8m0_encode, ScaleMode, E8M0_NAN};
pub use tensor::{quantize, MxTensor, DEFAULT_BLOCK};
