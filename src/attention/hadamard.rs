//! Normalized Walsh–Hadamard rotation along the head dim.
//!
//! `H/√d` (Sylvester order) is orthogonal and symmetric, so rotating both Q and K leaves
//! every score `q·k` unchanged in exact arithmetic while spreading outlier channels
//! across the block, which tightens MX block scales.

/// Rotates `x` in place by `H_d / √d`; `x.len()` must be a power of two.
pub fn hadamard_rotate(x: &mut [f32]) {
    let n = x.len();
    assert!(
        n.is_power_of_two(),
        "Hadamard rotation needs a power-of-two length, got {n}"
    );
    let mut h = 1;
    while h < n {
        for i in (0..n).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (x[j], x[j + h]);
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
        h *= 2;
    }
    let s = 1.0 / (n as f32).sqrt();
    for v in x.iter_mut() {
        *v *= s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_sylvester_matrix_and_is_orthogonal() {
        let n = 8;
        // H[i][j] = (-1)^popcount(i & j) / sqrt(n)
        for j in 0..n {
            let mut e = vec![0f32; n];
            e[j] = 1.0;
            hadamard_rotate(&mut e);
            for (i, v) in e.iter().enumerate() {
                let sign = if (i & j).count_ones() % 2 == 0 {
                    1.0
                } else {
                    -1.0
                };
                assert!((v - sign / (n as f32).sqrt()).abs() < 1e-7);
            }
        }
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let y: Vec<f32> = (0..64).map(|i| (i as f32 * 1.1).cos()).collect();
        let dot0: f32 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
        let mut y2 = y.clone();
        hadamard_rotate(&mut x);
        hadamard_rotate(&mut y2);
        let dot1: f32 = x.iter().zip(&y2).map(|(a, b)| a * b).sum();
        assert!((dot0 - dot1).abs() < 1e-4);
    }
}
