//! Helpers shared by the attention test files.
#![allow(dead_code)]

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
