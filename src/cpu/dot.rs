//! The f32 vector primitives both CPU paths share, with one fixed summation order.
//!
//! `dot` sums in 8 interleaved lanes, combined pairwise, then the tail: this order *is*
//! the definition of a score on the CPU, so the reference and the tiled path agree to
//! the bit. On x86-64 with AVX2 the same order runs in one 8-wide register (no FMA, so
//! the rounding is unchanged).

#[inline(always)]
fn dot_body(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ta.iter().zip(tb) {
        tail += x * y;
    }
    (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) + tail
}

#[inline(always)]
fn axpy_body(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_body(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn axpy_avx2(alpha: f32, x: &[f32], y: &mut [f32]) {
    axpy_body(alpha, x, y)
}

/// `Σ a_i·b_i` in the fixed lane order above.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_body(a, b)
}

/// `y += alpha·x` elementwise.
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { axpy_avx2(alpha, x, y) };
        }
    }
    axpy_body(alpha, x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatched_and_portable_paths_agree_to_the_bit() {
        for n in [1usize, 7, 8, 9, 64, 127, 128, 130] {
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 113) as f32 * 0.013 - 0.7)
                .collect();
            let b: Vec<f32> = (0..n)
                .map(|i| ((i * 104729) % 97) as f32 * 0.021 - 1.0)
                .collect();
            assert_eq!(dot(&a, &b).to_bits(), dot_body(&a, &b).to_bits(), "n={n}");
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - exact).abs() < 1e-4 * (1.0 + exact.abs()));
        }
    }
}
