//! E8M0 block scales and the rules that pick them from a block's absolute maximum.

use super::element::ElemFormat;
use std::fmt;
use std::str::FromStr;

/// Smallest and largest shared exponent an E8M0 scale holds (byte 0 and byte 254).
pub const E8M0_MIN_EXP: i32 = -127;
pub const E8M0_MAX_EXP: i32 = 127;
/// The E8M0 NaN byte: marks a block that held a NaN or an Inf.
pub const E8M0_NAN: u8 = 0xFF;

/// How a block's shared exponent is chosen from its absolute maximum `amax`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ScaleMode {
    /// OCP MX v1.0: `⌊log2 amax⌋ − emax`. Values in `(max, 2^(emax+1))` clip (up to −25 %
    /// for E2M1).
    #[default]
    Floor,
    /// `⌈log2 amax⌉ − emax`: never clips, may waste a binade.
    Ceil,
    /// torchao `EVEN`: amax rounded to the element's mantissa width first, then Floor;
    /// the exponent rises where amax would round into the next binade.
    Even,
    /// `⌈log2(amax / max_normal)⌉`: the smallest scale that never clips (cuBLAS, Blackwell
    /// `cvt.rp.ue8m0`).
    Rceil,
    /// AMD aiter's MXFP8 rule: the exponent of amax, rounded up when amax's mantissa is
    /// ≥ 0.75, minus emax. For E4M3 it never clips (block max in [224, 448)).
    RoundUp,
}

impl ScaleMode {
    /// The four rules of OCP / torchao (checked against the numpy reference).
    pub const ALL: [ScaleMode; 4] = [Self::Floor, Self::Ceil, Self::Even, Self::Rceil];

    /// Shared exponent for a block of `fmt` elements with absolute maximum `amax`
    /// (finite, ≥ 0), clamped to the E8M0 range. An all-zero block gets −127 (byte 0):
    /// E8M0 has no zero, and the codes are all zero anyway.
    pub fn shared_exp(self, amax: f32, fmt: ElemFormat) -> i32 {
        debug_assert!(amax.is_finite() && amax >= 0.0);
        if amax == 0.0 {
            return E8M0_MIN_EXP;
        }
        let (fl, exact_pow2) = floor_log2(amax);
        let e = match self {
            Self::Floor => fl - fmt.emax(),
            Self::Ceil => fl + (!exact_pow2) as i32 - fmt.emax(),
            Self::Even => {
                // fraction ≥ 1 − 2^-(mbits+1) rounds up into the next binade.
                let frac_bits = mantissa_fraction_bits(amax);
                let thr = (1u32 << 23) - (1u32 << (22 - fmt.mbits()));
                fl + (frac_bits >= thr) as i32 - fmt.emax()
            }
            Self::Rceil => {
                // smallest e with max·2^e ≥ amax, in exact f64 arithmetic
                let a = amax as f64;
                let mx = fmt.max_normal() as f64;
                let mut e = fl - fmt.emax() - 1;
                while mx * 2f64.powi(e) < a {
                    e += 1;
                }
                e
            }
            Self::RoundUp => fl + (mantissa_fraction_bits(amax) >= 3 << 21) as i32 - fmt.emax(),
        };
        e.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Floor => "floor",
            Self::Ceil => "ceil",
            Self::Even => "even",
            Self::Rceil => "rceil",
            Self::RoundUp => "roundup",
        }
    }
}

impl fmt::Display for ScaleMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScaleMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "floor" | "ocp" => Ok(Self::Floor),
            "ceil" => Ok(Self::Ceil),
            "even" => Ok(Self::Even),
            "rceil" => Ok(Self::Rceil),
            "roundup" | "amd" => Ok(Self::RoundUp),
            _ => Err(format!(
                "unknown scale mode '{s}' (expected floor, ceil, even, rceil, roundup)"
            )),
        }
    }
}

/// `(⌊log2 x⌋, x is a power of two)` for finite x > 0, exact (subnormals included).
pub(crate) fn floor_log2(x: f32) -> (i32, bool) {
    let b = x.to_bits() & 0x7FFF_FFFF;
    let ef = (b >> 23) as i32;
    let m = b & 0x7F_FFFF;
    if ef == 0 {
        // subnormal: value = m · 2^-149
        let top = 31 - m.leading_zeros() as i32;
        (top - 149, m.is_power_of_two())
    } else {
        (ef - 127, m == 0)
    }
}

/// The 23 fraction bits of x normalised to [1, 2).
fn mantissa_fraction_bits(x: f32) -> u32 {
    let b = x.to_bits() & 0x7FFF_FFFF;
    if b >> 23 == 0 {
        let m = b & 0x7F_FFFF;
        let top = 31 - m.leading_zeros();
        (m << (23 - top)) & 0x7F_FFFF
    } else {
        b & 0x7F_FFFF
    }
}

/// E8M0 byte for a shared exponent; out-of-range exponents clamp to byte 0 / 254.
pub fn e8m0_encode(exp: i32) -> u8 {
    (exp.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP) + 127) as u8
}

/// Value of an E8M0 byte: `2^(byte−127)`; 0xFF is NaN. Byte 0 is 2^-127, an f32 subnormal.
pub fn e8m0_decode(byte: u8) -> f32 {
    if byte == E8M0_NAN {
        return f32::NAN;
    }
    super::element::pow2_f64(byte as i32 - 127) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use ElemFormat::*;

    #[test]
    fn hand_checked_blocks() {
        // amax = 6.5 for E2M1 (emax 2): floor log2 = 2.
        assert_eq!(ScaleMode::Floor.shared_exp(6.5, E2M1), 0); // 6.5 clips to 6
        assert_eq!(ScaleMode::Ceil.shared_exp(6.5, E2M1), 1);
        assert_eq!(ScaleMode::Rceil.shared_exp(6.5, E2M1), 1); // 6.5/6 > 1
        assert_eq!(ScaleMode::Rceil.shared_exp(6.0, E2M1), 0); // exactly max: no clip at 2^0
        assert_eq!(ScaleMode::Rceil.shared_exp(3.0, E2M1), -1); // 3/6 = 0.5 -> 2^-1
                                                                // EVEN for E2M1 (1 mantissa bit): 1.75·2^2 = 7 rounds to 8 -> exponent 3 - 2 = 1.
        assert_eq!(ScaleMode::Even.shared_exp(7.0, E2M1), 1);
        assert_eq!(ScaleMode::Even.shared_exp(6.99, E2M1), 0);
        // Ceil at an exact power of two keeps it.
        assert_eq!(ScaleMode::Ceil.shared_exp(4.0, E2M1), 0);
        // E4M3: amax 300 -> floor log2 = 8 -> 0; Rceil: 300/448 < 1 -> 0; amax 500 -> 1.
        assert_eq!(ScaleMode::Floor.shared_exp(300.0, E4M3), 0);
        assert_eq!(ScaleMode::Rceil.shared_exp(500.0, E4M3), 1);
        assert_eq!(ScaleMode::Floor.shared_exp(500.0, E4M3), 0);
        // RoundUp (aiter MXFP8): 1.75·2^8 = 448 has mantissa 0.75 -> rounds up to 2^9 -> 1;
        // 447 stays at 2^8 -> 0 and scales to 447 ≤ 448 (no clip).
        assert_eq!(ScaleMode::RoundUp.shared_exp(448.0, E4M3), 1);
        assert_eq!(ScaleMode::RoundUp.shared_exp(447.0, E4M3), 0);
        assert_eq!(ScaleMode::RoundUp.shared_exp(500.0, E4M3), 1);
        assert_eq!(ScaleMode::RoundUp.shared_exp(1.5, E2M1), -2);
        // clamps and zero
        assert_eq!(ScaleMode::Floor.shared_exp(0.0, E2M1), -127);
        assert_eq!(ScaleMode::Floor.shared_exp(f32::MAX, E2M1), 125);
        assert_eq!(ScaleMode::Floor.shared_exp(1e-45, E2M1), -127);
    }

    #[test]
    fn e8m0_round_trip() {
        for e in -127..=127 {
            assert_eq!(e8m0_decode(e8m0_encode(e)), 2f64.powi(e) as f32);
        }
        assert_eq!(e8m0_encode(-300), 0);
        assert_eq!(e8m0_encode(300), 254);
        assert!(e8m0_decode(0xFF).is_nan());
    }

    #[test]
    fn floor_log2_is_exact() {
        assert_eq!(floor_log2(1.0), (0, true));
        assert_eq!(floor_log2(1.5), (0, false));
        assert_eq!(floor_log2(0.999_999_94), (-1, false));
        assert_eq!(floor_log2(f32::from_bits(1)), (-149, true));
        assert_eq!(floor_log2(f32::from_bits(3)), (-148, false));
    }
}
