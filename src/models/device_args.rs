//! The device and dtype flags shared by the example and evaluation binaries.

use super::qwen3::loading::{parse_device, parse_dtype};
use candle_core::{DType, Device, Result};

/// `--cpu`, `--device`, `--dtype`, for `#[command(flatten)]` in a clap parser.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DeviceArgs {
    /// Run on the CPU (same as --device cpu).
    #[arg(long)]
    pub cpu: bool,
    /// cpu, cuda or cuda:N (default: cpu).
    #[arg(long)]
    pub device: Option<String>,
    /// Model dtype: f32, bf16 or f16 (default: f32 on the CPU, bf16 on a GPU).
    #[arg(long)]
    pub dtype: Option<String>,
}

impl DeviceArgs {
    pub fn device(&self) -> Result<Device> {
        if self.cpu {
            return Ok(Device::Cpu);
        }
        parse_device(self.device.as_deref().unwrap_or("cpu"))
    }

    /// `--dtype`, else the default for `device`.
    pub fn dtype(&self, device: &Device) -> Result<DType> {
        dtype_or_default(self.dtype.as_deref(), device)
    }
}

/// A dtype flag's value, else f32 on the CPU and bf16 on a GPU.
pub fn dtype_or_default(flag: Option<&str>, device: &Device) -> Result<DType> {
    match flag {
        Some(d) => parse_dtype(d),
        None if device.is_cpu() => Ok(DType::F32),
        None => Ok(DType::BF16),
    }
}
