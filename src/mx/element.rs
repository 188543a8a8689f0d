//! OCP element codecs: FP8 (E4M3, E5M2), FP6 (E2M3, E3M2) and FP4 (E2M1).
//!
//! Conventions (checked against `ml_dtypes` by `tests/mx_golden.rs`):
//! * rounding is round-to-nearest, ties to even (hardware `cvt.rn`);
//! * a finite value beyond the largest normal saturates to ±max (`satfinite`), as the
//!   MX spec's conversion does for normals;
//! * E4M3 has no infinity: ±Inf and NaN encode to NaN (`S.1111.111`, sign kept);
//! * E5M2 keeps IEEE-style ±Inf and NaN (`0x7E` for a positive NaN);
//! * the FP6/FP4 types have neither: ±Inf saturates to ±max (as `ml_dtypes` does), and
//!   NaN, whose conversion OCP leaves to the implementation, encodes to code 0 (+0).
//!   An MX block holding a NaN or Inf is flagged by its E8M0 NaN scale instead (see
//!   [`super::block`]), so the NaN survives dequantization.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// An OCP element format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemFormat {
    /// FP8, bias 7, max 448, no Inf.
    E4M3,
    /// FP8, bias 15, max 57344, IEEE Inf/NaN.
    E5M2,
    /// FP6, bias 1, max 7.5.
    E2M3,
    /// FP6, bias 3, max 28.
    E3M2,
    /// FP4, bias 1, max 6.
    E2M1,
}

pub const ALL_FORMATS: [ElemFormat; 5] = [
    ElemFormat::E4M3,
    ElemFormat::E5M2,
    ElemFormat::E2M3,
    ElemFormat::E3M2,
    ElemFormat::E2M1,
];

impl ElemFormat {
    /// Exponent bits.
    pub const fn ebits(self) -> u32 {
        match self {
            Self::E4M3 => 4,
            Self::E5M2 => 5,
            Self::E2M3 => 2,
            Self::E3M2 => 3,
            Self::E2M1 => 2,
        }
    }

    /// Mantissa bits.
    pub const fn mbits(self) -> u32 {
        match self {
            Self::E4M3 => 3,
            Self::E5M2 => 2,
            Self::E2M3 => 3,
            Self::E3M2 => 2,
            Self::E2M1 => 1,
        }
    }

    /// Total bits of one code, sign included.
    pub const fn bits(self) -> u32 {
        1 + self.ebits() + self.mbits()
    }

    pub const fn bias(self) -> i32 {
        (1 << (self.ebits() - 1)) - 1
    }

    /// Unbiased exponent of the smallest normal (subnormals share it).
    pub const fn emin(self) -> i32 {
        1 - self.bias()
    }

    /// Unbiased exponent of the largest normal: the `emax_elem` of the MX scale rule.
    pub const fn emax(self) -> i32 {
        match self {
            // S.1111.111 is NaN, so the top binade still holds normals (up to 1.75·2^8).
            Self::E4M3 => 8,
            // The top exponent field is Inf/NaN.
            Self::E5M2 => 15,
            _ => (1 << self.ebits()) - 1 - self.bias(),
        }
    }

    /// Largest finite value.
    pub fn max_normal(self) -> f32 {
        match self {
            Self::E4M3 => 448.0,
            Self::E5M2 => 57344.0,
            Self::E2M3 => 7.5,
            Self::E3M2 => 28.0,
            Self::E2M1 => 6.0,
        }
    }

    /// Smallest positive (subnormal) value.
    pub fn min_subnormal(self) -> f32 {
        (2.0f64).powi(self.emin() - self.mbits() as i32) as f32
    }

    /// Code of the largest finite magnitude (sign bit clear).
    pub const fn max_code(self) -> u8 {
        match self {
            Self::E4M3 => 0x7E,
            Self::E5M2 => 0x7B,
            _ => ((1u32 << (self.bits() - 1)) - 1) as u8,
        }
    }

    const fn sign_bit(self) -> u8 {
        1 << (self.bits() - 1)
    }

    /// Round `x` to this format (RNE, saturating) and return its code in the low `bits()` bits.
    ///
    /// Works on the f32 bits directly (the hot path of every quantizer); equal to
    /// [`Self::encode_f64`] of the same value, which the golden tests check both of.
    #[inline]
    pub fn encode(self, x: f32) -> u8 {
        let sign = if x.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        let a = x.abs();
        if a.is_nan() || a >= self.max_normal() {
            // NaN, Inf and saturation share the slow path's rules
            return self.encode_f64(x as f64);
        }
        let m = self.mbits();
        let emin = self.emin();
        let b = a.to_bits();
        let e = (b >> 23) as i32 - 127;
        if e < emin {
            // a target subnormal (or zero): q = a / 2^(emin - m), exact, then RNE
            let q = (a * pow2_f64(m as i32 - emin) as f32).round_ties_even();
            return sign | q as u8;
        }
        // normal: keep m mantissa bits, round the rest to nearest even; a carry moves
        // into the exponent field by itself
        let shift = 23 - m;
        let keep = (b & 0x7F_FFFF) >> shift;
        let rem = b & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        let up = (rem > half || (rem == half && keep & 1 == 1)) as u32;
        let code = ((((e - emin + 1) as u32) << m) | keep) + up;
        sign | code.min(self.max_code() as u32) as u8
    }

    /// As [`Self::encode`] for an f64 input. `x / 2^k` computed in f64 is exact, so MX
    /// quantization rounds the exact scaled value once.
    pub fn encode_f64(self, x: f64) -> u8 {
        let sign = if x.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        if x.is_nan() {
            return match self {
                Self::E4M3 => sign | 0x7F,
                Self::E5M2 => sign | 0x7E,
                _ => 0,
            };
        }
        let a = x.abs();
        if a.is_infinite() {
            return match self {
                Self::E4M3 => sign | 0x7F,
                Self::E5M2 => sign | 0x7C,
                _ => sign | self.max_code(),
            };
        }
        if a >= self.max_normal() as f64 {
            return sign | self.max_code();
        }
        sign | self.encode_magnitude(a)
    }

    /// Code of a finite magnitude `a` in `[0, max_normal)`.
    #[inline]
    fn encode_magnitude(self, a: f64) -> u8 {
        if a == 0.0 {
            return 0;
        }
        let m = self.mbits() as i32;
        let emin = self.emin();
        // floor(log2 a) from the f64 exponent field (a is normal in f64 here: a ≥ 2^-149).
        let e = ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023;
        let e = e.max(emin);
        // q = a / 2^(e-m), exact; rounding it to an integer is the element rounding.
        let q = (a * pow2_f64(m - e)).round_ties_even();
        // One formula covers subnormals (e == emin, q < 2^m), normals and the carry into
        // the next binade (q == 2^(m+1)): code = (e - emin)·2^m + q.
        let code = ((e - emin) as i64) * (1i64 << m) + q as i64;
        code.min(self.max_code() as i64) as u8
    }

    /// Value of a code (only the low `bits()` bits are read), from a table.
    #[inline]
    pub fn decode(self, code: u8) -> f32 {
        static TABLES: OnceLock<[[f32; 256]; 5]> = OnceLock::new();
        let t = TABLES
            .get_or_init(|| ALL_FORMATS.map(|f| std::array::from_fn(|c| f.decode_bits(c as u8))));
        t[self as usize][code as usize]
    }

    /// Value of a code computed from its fields (builds the tables).
    fn decode_bits(self, code: u8) -> f32 {
        let code = code & ((1u16 << self.bits()) - 1) as u8;
        let neg = code & self.sign_bit() != 0;
        let mag = code & !self.sign_bit();
        let m = self.mbits();
        let efield = (mag >> m) as i32;
        let mant = (mag & ((1 << m) - 1)) as i32;
        let v = match self {
            Self::E4M3 if mag == 0x7F => f32::NAN,
            Self::E5M2 if efield == 31 => {
                if mant == 0 {
                    f32::INFINITY
                } else {
                    f32::NAN
                }
            }
            _ => {
                if efield == 0 {
                    (mant as f64 * pow2_f64(self.emin() - m as i32)) as f32
                } else {
                    (((1 << m) + mant) as f64 * pow2_f64(efield - self.bias() - m as i32)) as f32
                }
            }
        };
        if neg {
            -v
        } else {
            v
        }
    }

    /// A 256-entry decode table (codes beyond `bits()` repeat the low bits).
    pub fn decode_table(self) -> [f32; 256] {
        std::array::from_fn(|c| self.decode(c as u8))
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::E4M3 => "E4M3",
            Self::E5M2 => "E5M2",
            Self::E2M3 => "E2M3",
            Self::E3M2 => "E3M2",
            Self::E2M1 => "E2M1",
        }
    }

    /// The usual MX name of a block format built on this element.
    pub fn mx_name(self) -> &'static str {
        match self {
            Self::E4M3 | Self::E5M2 => "MXFP8",
            Self::E2M3 | Self::E3M2 => "MXFP6",
            Self::E2M1 => "MXFP4",
        }
    }
}

impl fmt::Display for ElemFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ElemFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "e4m3" | "fp8" | "mxfp8" => Ok(Self::E4M3),
            "e5m2" => Ok(Self::E5M2),
            "e2m3" | "fp6" | "mxfp6" => Ok(Self::E2M3),
            "e3m2" => Ok(Self::E3M2),
            "e2m1" | "fp4" | "mxfp4" => Ok(Self::E2M1),
            _ => Err(format!(
                "unknown element format '{s}' (expected e4m3, e5m2, e2m3, e3m2, e2m1)"
            )),
        }
    }
}

/// 2^e as f64 for |e| within the normal f64 range, exactly.
#[inline]
pub(crate) fn pow2_f64(e: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&e));
    f64::from_bits(((e + 1023) as u64) << 52)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_match_the_ocp_table() {
        // (format, max normal, emax, min subnormal) from OCP MX v1.0 §5.3.
        let rows = [
            (ElemFormat::E4M3, 448.0, 8, 2f32.powi(-9)),
            (ElemFormat::E5M2, 57344.0, 15, 2f32.powi(-16)),
            (ElemFormat::E2M3, 7.5, 2, 0.125),
            (ElemFormat::E3M2, 28.0, 4, 0.0625),
            (ElemFormat::E2M1, 6.0, 2, 0.5),
        ];
        for (f, max, emax, mins) in rows {
            assert_eq!(f.max_normal(), max, "{f}");
            assert_eq!(f.decode(f.max_code()), max, "{f}");
            assert_eq!(f.emax(), emax, "{f}");
            assert_eq!(f.min_subnormal(), mins, "{f}");
            assert_eq!(f.decode(1), mins, "{f}");
        }
    }

    #[test]
    fn e2m1_values_by_hand() {
        let c8 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for (c, v) in c8.iter().enumerate() {
            assert_eq!(ElemFormat::E2M1.decode(c as u8), *v);
            assert_eq!(ElemFormat::E2M1.decode(c as u8 | 8), -*v);
        }
        // ties to even: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2, 3.5 -> 4, 5 -> 4
        let ties = [
            (0.25, 0),
            (0.75, 2),
            (1.25, 2),
            (1.75, 4),
            (2.5, 4),
            (3.5, 6),
            (5.0, 6),
        ];
        for (x, c) in ties {
            assert_eq!(ElemFormat::E2M1.encode(x), c, "{x}");
        }
    }
}

#[cfg(test)]
mod fast_path_tests {
    use super::*;

    /// The f32 bit path against the f64 path: every f32 with a mantissa stride of 97 over
    /// the whole exponent range (≈ 2.2·10^7 values a format), both signs.
    #[test]
    fn f32_and_f64_encoders_agree() {
        for f in ALL_FORMATS {
            let mut n = 0u64;
            let mut bits = 0u32;
            while bits < 0x7F80_0000 {
                for s in [0u32, 0x8000_0000] {
                    let x = f32::from_bits(bits | s);
                    assert_eq!(f.encode(x), f.encode_f64(x as f64), "{f} {x:e}");
                }
                n += 1;
                bits += 97;
            }
            assert!(n > 20_000_000);
        }
    }
}
