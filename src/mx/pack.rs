//! Bit packing of element codes into bytes.
//!
//! * FP8: one code per byte.
//! * FP6: four codes in three bytes, LSB first: code i occupies bits `[6i, 6i+6)` of the
//!   little-endian 24-bit group (the CUTLASS-targeted layout).
//! * FP4: two codes per byte, element 2i in the low nibble (PyTorch `float4_e2m1fn_x2`,
//!   torchao `pack_uint4`).

/// Number of bytes that hold `n` codes of `bits` bits (n must fill whole bytes: even for
/// FP4, a multiple of 4 for FP6).
pub fn packed_len(n: usize, bits: u32) -> usize {
    match bits {
        8 => n,
        6 => n / 4 * 3,
        4 => n / 2,
        _ => unreachable!("no {bits}-bit element format"),
    }
}

/// Smallest count ≥ n that packs into whole bytes.
pub fn pack_granule(bits: u32) -> usize {
    match bits {
        8 => 1,
        6 => 4,
        4 => 2,
        _ => unreachable!("no {bits}-bit element format"),
    }
}

/// Pack `codes` (low `bits` bits each) into `out` (`packed_len(codes.len(), bits)` bytes).
pub fn pack(codes: &[u8], bits: u32, out: &mut [u8]) {
    assert_eq!(
        codes.len() % pack_granule(bits),
        0,
        "code count must fill whole bytes"
    );
    assert_eq!(out.len(), packed_len(codes.len(), bits));
    match bits {
        8 => out.copy_from_slice(codes),
        4 => {
            for (o, c) in out.iter_mut().zip(codes.chunks_exact(2)) {
                *o = (c[0] & 0xF) | ((c[1] & 0xF) << 4);
            }
        }
        6 => {
            for (o, c) in out.chunks_exact_mut(3).zip(codes.chunks_exact(4)) {
                let w = (c[0] as u32 & 0x3F)
                    | ((c[1] as u32 & 0x3F) << 6)
                    | ((c[2] as u32 & 0x3F) << 12)
                    | ((c[3] as u32 & 0x3F) << 18);
                o.copy_from_slice(&w.to_le_bytes()[..3]);
            }
        }
        _ => unreachable!(),
    }
}

/// Inverse of [`pack`].
pub fn unpack(bytes: &[u8], bits: u32, out: &mut [u8]) {
    assert_eq!(bytes.len(), packed_len(out.len(), bits));
    match bits {
        8 => out.copy_from_slice(bytes),
        4 => {
            for (b, o) in bytes.iter().zip(out.chunks_exact_mut(2)) {
                o[0] = b & 0xF;
                o[1] = b >> 4;
            }
        }
        6 => {
            for (b, o) in bytes.chunks_exact(3).zip(out.chunks_exact_mut(4)) {
                let w = b[0] as u32 | ((b[1] as u32) << 8) | ((b[2] as u32) << 16);
                for (i, oi) in o.iter_mut().enumerate() {
                    *oi = ((w >> (6 * i)) & 0x3F) as u8;
                }
            }
        }
        _ => unreachable!(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp4_low_nibble_first() {
        let mut out = [0u8; 1];
        pack(&[0x3, 0xA], 4, &mut out);
        assert_eq!(out, [0xA3]);
    }

    #[test]
    fn fp6_lsb_first() {
        let mut out = [0u8; 3];
        pack(&[0b000001, 0b000010, 0b000011, 0b111111], 6, &mut out);
        // bits: c0 at 0..6, c1 at 6..12, c2 at 12..18, c3 at 18..24
        let w = 1u32 | (2 << 6) | (3 << 12) | (63 << 18);
        assert_eq!(out, [w as u8, (w >> 8) as u8, (w >> 16) as u8]);
        let mut back = [0u8; 4];
        unpack(&out, 6, &mut back);
        assert_eq!(back, [1, 2, 3, 63]);
    }
}
