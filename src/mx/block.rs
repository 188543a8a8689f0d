//! MX block quantization of one vector: the arithmetic every other path builds on.
//!
//! A vector of n elements is cut into blocks of `block` elements along it; the last
//! block may be shorter (its scale is taken over the elements present). Each block gets
//! one E8M0 scale from its absolute maximum by a [`ScaleMode`], and each element the code
//! of `x / 2^shared_exp`, rounded once in exact arithmetic.
//!
//! Special blocks:
//! * all zeros: scale byte 0 (2^-127; E8M0 has no zero), codes keep the sign of zero;
//! * any NaN or ±Inf: scale byte 0xFF (NaN, as torchao does); the codes are the element
//!   encodings of the unscaled values, and the whole block dequantizes to NaN, as the
//!   MX spec says for a NaN scale.

use super::element::{pow2_f64, ElemFormat};
use super::scale::{e8m0_decode, ScaleMode, E8M0_NAN};

/// Quantize one block. Writes `x.len()` codes and returns the E8M0 scale byte.
pub fn quantize_block(x: &[f32], fmt: ElemFormat, mode: ScaleMode, codes: &mut [u8]) -> u8 {
    debug_assert_eq!(x.len(), codes.len());
    let mut amax = 0f32;
    let mut finite = true;
    for &v in x {
        finite &= v.is_finite();
        amax = amax.max(v.abs());
    }
    if !finite {
        for (c, &v) in codes.iter_mut().zip(x) {
            *c = fmt.encode(v);
        }
        return E8M0_NAN;
    }
    let e = mode.shared_exp(amax, fmt);
    // x / 2^e in f32 is exact wherever it can round to a non-zero code (a result below
    // 2^-126 is under half of every format's smallest subnormal), so one f32 product and
    // one element rounding reproduce the exact-arithmetic definition.
    let inv = pow2_f64(-e) as f32;
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = fmt.encode(v * inv);
    }
    (e + 127) as u8
}

/// Dequantize one block of codes with its scale byte.
pub fn dequantize_block(codes: &[u8], scale: u8, fmt: ElemFormat, out: &mut [f32]) {
    debug_assert_eq!(codes.len(), out.len());
    let s = e8m0_decode(scale);
    for (o, &c) in out.iter_mut().zip(codes) {
        // one f32 product of two f32 values is the exact product rounded once
        *o = fmt.decode(c) * s;
    }
}

/// Quantize then dequantize a contiguous vector block by block ("fake quantization"):
/// the values an MX operand of this vector represents.
pub fn fake_quantize(x: &[f32], fmt: ElemFormat, mode: ScaleMode, block: usize, out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    let mut codes = [0u8; 256];
    for (xb, ob) in x.chunks(block).zip(out.chunks_mut(block)) {
        if xb.len() <= 256 {
            let c = &mut codes[..xb.len()];
            let s = quantize_block(xb, fmt, mode, c);
            dequantize_block(c, s, fmt, ob);
        } else {
            let mut c = vec![0u8; xb.len()];
            let s = quantize_block(xb, fmt, mode, &mut c);
            dequantize_block(&c, s, fmt, ob);
        }
    }
}

/// FP8 with one f32 scale for the whole slice (per-channel V): `scale = amax / max_normal`,
/// values `decode(encode(x / scale)) · scale`. A zero channel keeps scale 1. Returns the scale.
pub fn fake_quantize_per_tensor(x: &[f32], fmt: ElemFormat, out: &mut [f32]) -> f32 {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let scale = if amax > 0.0 {
        amax / fmt.max_normal()
    } else {
        1.0
    };
    for (o, &v) in out.iter_mut().zip(x) {
        *o = fmt.decode(fmt.encode(v / scale)) * scale;
    }
    scale
}
