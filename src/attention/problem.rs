//! The validated geometry of one attention call and its masks.

/// Shapes and masks of a call: q `[b, hq, sq, d]`, k/v `[b, hkv, sk, d]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    /// Valid keys per batch entry (sk where no key-padding mask is given).
    pub kv_lens: Vec<usize>,
    pub causal: bool,
}

impl Problem {
    /// KV head read by query head `h` (GQA: hq/hkv query heads share one KV head).
    #[inline]
    pub fn kv_head(&self, h: usize) -> usize {
        h / (self.hq / self.hkv)
    }

    /// Keys visible to query row `i` of batch `b`: always a prefix `[0, n)` of the keys.
    /// Causal is bottom-right aligned: row i sees keys `j ≤ i + (kv_len − sq)`.
    #[inline]
    pub fn visible(&self, b: usize, i: usize) -> usize {
        let len = self.kv_lens[b];
        if !self.causal {
            return len;
        }
        let last = i as i64 + len as i64 - self.sq as i64; // last visible key index
        (last + 1).clamp(0, len as i64) as usize
    }

    pub fn q_index(&self, b: usize, h: usize, i: usize) -> usize {
        ((b * self.hq + h) * self.sq + i) * self.d
    }
    pub fn kv_index(&self, b: usize, h: usize, j: usize) -> usize {
        ((b * self.hkv + h) * self.sk + j) * self.d
    }
    pub fn rows(&self) -> usize {
        self.b * self.hq * self.sq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_is_bottom_right_aligned() {
        let p = Problem {
            b: 2,
            hq: 4,
            hkv: 2,
            sq: 3,
            sk: 5,
            d: 8,
            kv_lens: vec![5, 2],
            causal: true,
        };
        // batch 0, kv_len 5, sq 3: row 0 sees keys 0..=2, row 2 sees all 5.
        assert_eq!(
            (p.visible(0, 0), p.visible(0, 1), p.visible(0, 2)),
            (3, 4, 5)
        );
        // batch 1, kv_len 2 < sq 3: row 0 sees nothing, row 2 sees both keys.
        assert_eq!(
            (p.visible(1, 0), p.visible(1, 1), p.visible(1, 2)),
            (0, 1, 2)
        );
        assert_eq!(
            (p.kv_head(0), p.kv_head(1), p.kv_head(2), p.kv_head(3)),
            (0, 0, 1, 1)
        );
        let nc = Problem { causal: false, ..p };
        assert_eq!(nc.visible(1, 0), 2);
    }
}
