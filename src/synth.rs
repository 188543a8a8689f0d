//! Synthetic attention inputs: the stress distributions of the accuracy evaluation and
//! the tests, reproducible from a seed on any platform (splitmix64 + Box–Muller).

use candle_core::{Device, Result, Tensor};
use std::fmt;
use std::str::FromStr;

/// A deterministic generator (splitmix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    pub fn normals(&mut self, n: usize, std: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * std) as f32).collect()
    }
}

/// Shape of a synthetic problem: q `[b, hq, sq, d]`, k/v `[b, hkv, sk, d]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
}

impl Shape {
    pub fn new(b: usize, hq: usize, hkv: usize, sq: usize, sk: usize, d: usize) -> Self {
        Self {
            b,
            hq,
            hkv,
            sq,
            sk,
            d,
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.hq == self.hkv {
            write!(
                f,
                "({}, {}, {}x{}, {})",
                self.b, self.hq, self.sq, self.sk, self.d
            )
        } else {
            write!(
                f,
                "({}, {}/{}, {}x{}, {})",
                self.b, self.hq, self.hkv, self.sq, self.sk, self.d
            )
        }
    }
}

/// Stress distributions. Score std is given for the default scale 1/√d.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Q, K, V ~ N(0, 1), Q scaled by σ: scores ~ N(0, σ²) (efq §A.4's setup).
    Gaussian { sigma: f32 },
    /// Transformer-like: K with a shared per-channel bias and 4 outlier channels (×12),
    /// Q with matching outliers; stresses MX block scales along d.
    Outliers,
    /// Attention sink: key 0 scores ≈ 10 nats above the rest for every query.
    Sink,
    /// Late sink: the hot key sits at index 300, after the first 128-key tile, so a max
    /// frozen on tile 0 is exceeded later.
    LateSink,
    /// Max-stair: the scores rise by ≈ 2 nats (≈ 2.9 log2 units) per 128-key tile.
    MaxStair,
    /// All zeros: uniform attention, O = 0.
    Zeros,
}

impl Distribution {
    /// Every stress case the tests run.
    pub const STRESS: [Distribution; 8] = [
        Distribution::Gaussian { sigma: 1.0 },
        Distribution::Gaussian { sigma: 2.0 },
        Distribution::Gaussian { sigma: 4.0 },
        Distribution::Outliers,
        Distribution::Sink,
        Distribution::LateSink,
        Distribution::MaxStair,
        Distribution::Zeros,
    ];
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gaussian { sigma } => write!(f, "gauss-s{sigma}"),
            Self::Outliers => f.write_str("outliers"),
            Self::Sink => f.write_str("sink"),
            Self::LateSink => f.write_str("late-sink"),
            Self::MaxStair => f.write_str("max-stair"),
            Self::Zeros => f.write_str("zeros"),
        }
    }
}

impl FromStr for Distribution {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.to_ascii_lowercase();
        if let Some(x) = s
            .strip_prefix("gauss-s")
            .or_else(|| s.strip_prefix("gauss"))
        {
            let sigma: f32 = x
                .trim_start_matches(['-', ':', '='])
                .parse()
                .map_err(|_| format!("bad sigma in '{s}'"))?;
            return Ok(Self::Gaussian { sigma });
        }
        match s.as_str() {
            "outliers" | "transformer" => Ok(Self::Outliers),
            "sink" => Ok(Self::Sink),
            "late-sink" | "latesink" => Ok(Self::LateSink),
            "max-stair" | "maxstair" => Ok(Self::MaxStair),
            "zeros" | "zero" => Ok(Self::Zeros),
            _ => Err(format!(
                "unknown distribution '{s}' (gauss-s<σ>, outliers, sink, late-sink, max-stair, zeros)"
            )),
        }
    }
}

/// f32 q, k, v tensors on the CPU.
pub struct Inputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
}

fn unit_vector(rng: &mut Rng, d: usize) -> Vec<f32> {
    let u = rng.normals(d, 1.0);
    let n = u.iter().map(|x| x * x).sum::<f32>().sqrt();
    u.iter().map(|x| x / n).collect()
}

/// Makes inputs of `dist` with shape `s` from `seed`.
pub fn make(dist: Distribution, s: Shape, seed: u64) -> Result<Inputs> {
    let mut rng = Rng::new(seed);
    let (nq, nk) = (s.b * s.hq * s.sq * s.d, s.b * s.hkv * s.sk * s.d);
    let d = s.d;
    let sqrt_d = (d as f32).sqrt();
    let (q, k, v) = match dist {
        Distribution::Zeros => (vec![0f32; nq], vec![0f32; nk], vec![0f32; nk]),
        Distribution::Gaussian { sigma } => (
            rng.normals(nq, sigma as f64),
            rng.normals(nk, 1.0),
            rng.normals(nk, 1.0),
        ),
        Distribution::Outliers => {
            let mut q = rng.normals(nq, 1.0);
            let mut k = rng.normals(nk, 1.0);
            let bias = rng.normals(d, 2.0);
            let outl: Vec<usize> = (0..4).map(|i| (i * 37 + 5) % d).collect();
            for row in k.chunks_mut(d) {
                for (x, b) in row.iter_mut().zip(&bias) {
                    *x += b;
                }
                for &c in &outl {
                    row[c] *= 12.0;
                }
            }
            for row in q.chunks_mut(d) {
                for &c in &outl {
                    row[c] *= 3.0;
                }
            }
            (q, k, rng.normals(nk, 1.0))
        }
        Distribution::Sink | Distribution::LateSink | Distribution::MaxStair => {
            let u = unit_vector(&mut rng, d);
            let mut q = rng.normals(nq, 1.0);
            let mut k = rng.normals(nk, 1.0);
            let alpha = 4.0f32;
            for row in q.chunks_mut(d) {
                for (x, ui) in row.iter_mut().zip(&u) {
                    *x += alpha * ui;
                }
            }
            for (j, row) in k.chunks_mut(d).enumerate() {
                let key = j % s.sk;
                let coef = match dist {
                    // s0 = α·β/√d ≈ 10 nats above the rest
                    Distribution::Sink if key == 0 => 10.0 * sqrt_d / alpha,
                    Distribution::LateSink if key == 300.min(s.sk - 1) => 10.0 * sqrt_d / alpha,
                    // +2 nats per 128-key tile
                    Distribution::MaxStair => 2.0 * sqrt_d / alpha * (key / 128) as f32,
                    _ => 0.0,
                };
                if coef != 0.0 {
                    for (x, ui) in row.iter_mut().zip(&u) {
                        *x += coef * ui;
                    }
                }
            }
            (q, k, rng.normals(nk, 1.0))
        }
    };
    let dev = Device::Cpu;
    Ok(Inputs {
        q: Tensor::from_vec(q, (s.b, s.hq, s.sq, s.d), &dev)?,
        k: Tensor::from_vec(k, (s.b, s.hkv, s.sk, s.d), &dev)?,
        v: Tensor::from_vec(v, (s.b, s.hkv, s.sk, s.d), &dev)?,
    })
}
