#![doc = include_str!("../README.md")]

pub mod attention;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub mod fused;
pub mod mx;
pub mod oracle;
pub mod schedule;
pub mod synth;
