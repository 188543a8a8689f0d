#![doc = include_str!("../README.md")]

pub mod attention;
pub(crate) mod cpu;
pub mod models;
pub mod mx;
pub mod oracle;
pub mod synth;
