//! Models whose attention runs through [`crate::attention::attention`].

pub mod qwen3;
