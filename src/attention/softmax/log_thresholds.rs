//! Log-domain thresholds that reproduce `exp` followed by a comparison, exactly.
//!
//! `fl(exp(x)) ≥ y` holds exactly when `x ≥ T(y)`, where `T(y)` is the smallest f32 with
//! `fl(exp(T)) ≥ y` (the f32 `exp` is monotone, so the set of such x is a ray). Finding
//! T by bisection over the ordered f32 bit patterns, once, lets a kernel decide every
//! comparison of an exp-then-quantize pipeline from the shifted score alone: no exp per
//! element, and the result is bit-identical to computing the exp.

use std::sync::OnceLock;

/// Maps f32 to an integer key that orders like the floats (total order, −0 < +0).
fn key(x: f32) -> i64 {
    let b = x.to_bits() as i32 as i64;
    if b < 0 {
        -(b & 0x7FFF_FFFF) - 1
    } else {
        b
    }
}

fn from_key(k: i64) -> f32 {
    if k < 0 {
        f32::from_bits(((-(k + 1)) as u32) | 0x8000_0000)
    } else {
        f32::from_bits(k as u32)
    }
}

/// Smallest x in `[lo, hi]` with `pred(x)` for a predicate monotone in x (false … true);
/// `hi` if none.
fn bisect(lo: f32, hi: f32, pred: impl Fn(f32) -> bool) -> f32 {
    let (mut a, mut b) = (key(lo), key(hi));
    if pred(lo) {
        return lo;
    }
    // invariant: pred(a) false, pred(b) true (or b = hi)
    while b - a > 1 {
        let mid = a + (b - a) / 2;
        if pred(from_key(mid)) {
            b = mid;
        } else {
            a = mid;
        }
    }
    from_key(b)
}

/// Smallest x ≤ 0 with `fl(exp(x)) ≥ y` (strict: `> y`); +inf if none below 0.
pub(crate) fn exp_threshold(y: f32, strict: bool) -> f32 {
    let pred = |x: f32| {
        let p = x.exp();
        if strict {
            p > y
        } else {
            p >= y
        }
    };
    if !pred(0.0) {
        return f32::INFINITY;
    }
    bisect(-200.0, 0.0, pred)
}

/// The E2M1 round-to-nearest-even midpoints of `v = p / 2^e` and whether reaching the next
/// code needs `v > t` (ties go down to the even code) or `v ≥ t` (ties go up).
pub(crate) const E2M1_MIDPOINTS: [(f32, bool); 7] = [
    (0.25, true),
    (0.75, false),
    (1.25, true),
    (1.75, false),
    (2.5, true),
    (3.5, false),
    (5.0, true),
];

/// Lowest and highest block exponent the tables cover. Shifted scores are ≤ 0, so
/// `p ≤ 1`, and Floor / Rceil exponents of a block of P never exceed 0.
pub(crate) const E_MIN: i32 = -127;
pub(crate) const E_MAX: i32 = 0;

/// Per-exponent thresholds of exp → MXFP4.
pub(crate) struct ExpMxfp4Thresholds {
    /// `pow2[k + 149]`: smallest x with fl(exp(x)) ≥ 2^k, k ∈ [−149, 0].
    pub pow2: Vec<f32>,
    /// `six[e − E_MIN]`: smallest x with fl(exp(x)) > 6·2^e.
    pub six: Vec<f32>,
    /// `code[e − E_MIN][i]`: the x that code i+1 needs at block exponent e.
    pub code: Vec<[f32; 7]>,
}

pub(crate) fn exp_mxfp4_thresholds() -> &'static ExpMxfp4Thresholds {
    static T: OnceLock<ExpMxfp4Thresholds> = OnceLock::new();
    T.get_or_init(|| {
        let p2 = |k: i32| (2f64).powi(k) as f32;
        let pow2 = (-149..=0).map(|k| exp_threshold(p2(k), false)).collect();
        let six = (E_MIN..=E_MAX)
            .map(|e| exp_threshold(6.0 * p2(e), true))
            .collect();
        let code = (E_MIN..=E_MAX)
            .map(|e| E2M1_MIDPOINTS.map(|(t, strict)| exp_threshold(t * p2(e), strict)))
            .collect();
        ExpMxfp4Thresholds { pow2, six, code }
    })
}

impl ExpMxfp4Thresholds {
    /// ⌊log2 fl(exp(m))⌋, or None when fl(exp(m)) = 0.
    pub fn floor_log2_exp(&self, m: f32) -> Option<i32> {
        // largest k with m ≥ pow2[k]
        let n = self.pow2.partition_point(|&t| t <= m);
        if n == 0 {
            None
        } else {
            Some(n as i32 - 1 - 149)
        }
    }

    /// ⌈log2(fl(exp(m)) / 6)⌉: the smallest e with fl(exp(m)) ≤ 6·2^e, within the table.
    pub fn rceil_exp(&self, m: f32) -> i32 {
        // fl(exp(m)) ≤ 6·2^e  ⇔  m < six[e]
        let n = self.six.partition_point(|&t| t <= m);
        (E_MIN + n as i32).min(E_MAX)
    }

    /// E2M1 code of fl(exp(x)) / 2^e, from comparisons only.
    #[inline]
    pub fn code(&self, x: f32, e: i32) -> u8 {
        let t = &self.code[(e - E_MIN) as usize];
        t.iter().map(|&ti| (x >= ti) as u8).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_are_the_exact_boundaries() {
        for y in [0.25f32, 0.75, 1.0, 1e-3, 2f32.powi(-100), 2f32.powi(-130)] {
            for strict in [false, true] {
                let t = exp_threshold(y, strict);
                let below = f32::from_bits(t.to_bits() + 1); // t is negative: +1 bit is more negative
                let ok = |x: f32| if strict { x.exp() > y } else { x.exp() >= y };
                assert!(ok(t), "{y} {strict}");
                assert!(!ok(below), "{y} {strict}");
            }
        }
        assert_eq!(exp_threshold(2.0, false), f32::INFINITY);
    }

    /// The GPU kernels count a code's passed thresholds by binary search (`count7` in
    /// kernels/softmax_algos.cuh), which equals the linear count only if every block
    /// exponent's seven thresholds are non-decreasing and none is NaN.
    #[test]
    fn code_thresholds_ascend_for_every_block_exponent() {
        let t = exp_mxfp4_thresholds();
        assert_eq!(t.code.len(), (E_MAX - E_MIN + 1) as usize);
        for (i, row) in t.code.iter().enumerate() {
            assert!(
                row.iter().all(|x| !x.is_nan()),
                "exponent {}",
                E_MIN + i as i32
            );
            for w in row.windows(2) {
                assert!(w[0] <= w[1], "exponent {}: {row:?}", E_MIN + i as i32);
            }
        }
        let mids = E2M1_MIDPOINTS.map(|(m, _)| m);
        assert!(mids.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn key_orders_like_floats() {
        let xs = [-3.0f32, -1.0, -1e-40, -0.0, 0.0, 1e-40, 2.0];
        for w in xs.windows(2) {
            assert!(key(w[0]) < key(w[1]));
            assert_eq!(from_key(key(w[0])).to_bits(), w[0].to_bits());
        }
    }
}
