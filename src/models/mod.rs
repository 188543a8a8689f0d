//! Models whose attention runs through [`crate::attention::attention`].

pub mod device_args;
pub mod qwen3;
pub mod wan;
