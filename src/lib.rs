#![doc = include_str!("../README.md")]

pub mod attention;
pub mod baselines;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub mod fused;
pub mod models;
pub mod mx;
pub mod oracle;
pub mod synth;
