//! Helpers shared by the test files: attention runs, seeded inputs, a tensor difference.
#![allow(dead_code)]

use candle_core::Tensor;
use mxattn::attention::{attention_ext, AttentionConfig, CpuPath, RunOptions};
use mxattn::synth;

/// Output, LSE and rollback count of one CPU call.
pub struct Out {
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
    pub rollbacks: u64,
}

pub fn run_cpu(inp: &synth::Inputs, cfg: &AttentionConfig, path: CpuPath) -> Out {
    let opts = RunOptions {
        cpu_path: path,
        lse: true,
        ..Default::default()
    };
    let r = attention_ext(&inp.q, &inp.k, &inp.v, cfg, &opts).unwrap();
    Out {
        o: r.out.flatten_all().unwrap().to_vec1().unwrap(),
        lse: r.lse.unwrap().flatten_all().unwrap().to_vec1().unwrap(),
        rollbacks: r.stats.rollbacks,
    }
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A CPU f32 tensor of uniform values in [lo, lo + 4) from a fixed LCG seeded by `seed`.
pub fn uniform(shape: &[usize], seed: u64, lo: f32) -> Tensor {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + 4.0 * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect();
    Tensor::from_vec(v, shape, &candle_core::Device::Cpu).unwrap()
}

/// [`mxattn::oracle::max_abs_diff`], for tests.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    mxattn::oracle::max_abs_diff(a, b).unwrap()
}

/// A KV cache as a model keeps it for a config: K quantized along d and V along the keys over
/// its whole blocks (the rest a dense tail), in the config's MX formats, or in `storage`
/// where the config's operands are native (the `kv-*` presets). `None` where the config
/// stores nothing in MX.
pub struct MxCache {
    pub k: mxattn::mx::MxTensor,
    pub v: mxattn::mx::MxTensor,
    pub v_tail: Option<Tensor>,
}

pub fn mx_cache(
    k: &Tensor,
    v: &Tensor,
    cfg: &AttentionConfig,
    storage: Option<mxattn::attention::OperandFormat>,
) -> Option<MxCache> {
    use mxattn::attention::OperandFormat;
    let mx_of = |f: OperandFormat| match f {
        OperandFormat::Mx { elem, scale, block } => Some((elem, scale, block)),
        _ => storage.and_then(|s| match s {
            OperandFormat::Mx { elem, scale, block } => Some((elem, scale, block)),
            _ => None,
        }),
    };
    let (ke, ks, kb) = mx_of(cfg.qk_format)?;
    let (ve, vs, vb) = mx_of(cfg.v_format)?;
    let n = v.dims()[2];
    let full = n / vb * vb;
    let kq = mxattn::mx::quantize(k, ke, ks, 3, kb).unwrap();
    let vq = mxattn::mx::quantize(&v.narrow(2, 0, full).unwrap(), ve, vs, 2, vb).unwrap();
    let v_tail = (full < n).then(|| v.narrow(2, full, n - full).unwrap());
    Some(MxCache {
        k: kq,
        v: vq,
        v_tail,
    })
}
