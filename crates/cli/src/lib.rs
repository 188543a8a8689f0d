//! Command-line support shared by the example and evaluation programs: the device and dtype
//! flags (one parser for every program), one progress-bar style, and the timing of the
//! library crates' `tracing` spans for `--profile-*` flags ([`spans::SpanTimes`]).

#[cfg(feature = "cuda")]
pub mod bench;
pub mod spans;

use candle_core::{bail, DType, Device, Result};
use indicatif::{ProgressBar, ProgressStyle};

/// `--cpu`, `--device`, `--dtype`, for `#[command(flatten)]` in a clap parser.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DeviceArgs {
    /// Run on the CPU (same as --device cpu).
    #[arg(long)]
    pub cpu: bool,
    /// cpu, cuda or cuda:N (default: cuda:0 when this build has CUDA and a GPU is present,
    /// else cpu).
    #[arg(long)]
    pub device: Option<String>,
    /// Model dtype: f32, bf16 or f16 (default: f32 on the CPU, bf16 on a GPU).
    #[arg(long)]
    pub dtype: Option<String>,
}

impl DeviceArgs {
    /// `--device`, else [`default_device`].
    pub fn device(&self) -> Result<Device> {
        if self.cpu {
            return Ok(Device::Cpu);
        }
        match self.device.as_deref() {
            Some(d) => parse_device(d),
            None => Ok(default_device()),
        }
    }

    /// `--dtype`, else the default for `device`.
    pub fn dtype(&self, device: &Device) -> Result<DType> {
        dtype_or_default(self.dtype.as_deref(), device)
    }
}

/// Where a program's weights come from: `--model`, `--revision`, `--model-dir`,
/// `--random-weights`, `--weights-seed`, for `#[command(flatten)]` in a clap parser.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ModelArgs {
    /// Hugging Face Hub repository id, fetched through the local cache first (default: the
    /// program's; see its --help). With --random-weights: the architecture to build.
    #[arg(long)]
    pub model: Option<String>,
    /// Hub revision (with --model).
    #[arg(long)]
    pub revision: Option<String>,
    /// A local checkpoint directory instead of the Hub (its layout: the program's --help).
    #[arg(long)]
    pub model_dir: Option<std::path::PathBuf>,
    /// Random weights with the model's architecture, for speed runs without a checkpoint.
    #[arg(long)]
    pub random_weights: bool,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    pub weights_seed: u64,
}

impl ModelArgs {
    /// `--model`, else the program's `default`.
    pub fn model_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.model.as_deref().unwrap_or(default)
    }
}

/// `--attn NAME` (one attention preset for every call) and `--attn-schedule TEXT` (a schedule
/// in the one grammar, `mxattn::schedule`), for `#[command(flatten)]`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct AttnArgs {
    /// One attention preset for every call (default: the program's; the names are listed
    /// below).
    #[arg(long)]
    pub attn: Option<String>,
    /// An attention schedule (grammar below), e.g. "hybrid"; overrides --attn.
    #[arg(long)]
    pub attn_schedule: Option<String>,
}

/// What [`AttnArgs`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnChoice<'a> {
    /// A schedule's text (`--attn-schedule`).
    Schedule(&'a str),
    /// One preset everywhere (`--attn`, or the program's default).
    Uniform(&'a str),
}

impl AttnArgs {
    /// `--attn-schedule`, else `--attn`, else the program's `default` preset.
    pub fn choice<'a>(&'a self, default: &'a str) -> AttnChoice<'a> {
        match (&self.attn_schedule, &self.attn) {
            (Some(s), _) => AttnChoice::Schedule(s),
            (None, Some(n)) => AttnChoice::Uniform(n),
            (None, None) => AttnChoice::Uniform(default),
        }
    }
}

/// The sampling flags of the text-to-video programs, for `#[command(flatten)]`: unset ones
/// take the model's defaults (the program's --help says which).
#[derive(clap::Args, Clone, Debug)]
pub struct VideoArgs {
    /// WIDTHxHEIGHT (Wan A14B: 1280x720, 720x1280, 832x480, 480x832; TI2V-5B: 1280x704,
    /// 704x1280).
    #[arg(long)]
    pub size: Option<String>,
    /// Accept any size the latent grid allows (tiny test models).
    #[arg(long)]
    pub any_size: bool,
    /// Frames, 4k+1.
    #[arg(long)]
    pub frames: Option<usize>,
    /// Denoising steps.
    #[arg(long)]
    pub steps: Option<usize>,
    /// Guidance of the high-noise expert (TI2V-5B: the only one).
    #[arg(long)]
    pub guidance: Option<f64>,
    /// Guidance of the low-noise expert (default: --guidance when given).
    #[arg(long)]
    pub guidance_2: Option<f64>,
    /// Flow shift (default: the original release's, 12 for A14B and 5 for 5B; diffusers'
    /// configs ship 3.0 and 5.0).
    #[arg(long)]
    pub shift: Option<f64>,
    /// unipc or euler.
    #[arg(long, default_value = "unipc")]
    pub sampler: String,
    /// Seed of the initial noise.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// The first GPU when this build has CUDA and one is present, else the CPU (a build with
/// CUDA on a machine without a GPU says so on stderr and runs on the CPU).
pub fn default_device() -> Device {
    if !candle_core::utils::cuda_is_available() {
        return Device::Cpu;
    }
    match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("note: no usable GPU ({e}); running on the CPU");
            Device::Cpu
        }
    }
}

/// `cpu`, `cuda` (= `cuda:0`, also `gpu`) or `cuda:N`.
pub fn parse_device(s: &str) -> Result<Device> {
    match s.trim().to_ascii_lowercase().as_str() {
        "cpu" => Ok(Device::Cpu),
        "cuda" | "gpu" => Device::new_cuda(0),
        d => match d.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => Device::new_cuda(i),
            _ => bail!("unknown device {s:?}; expected cpu, cuda or cuda:N"),
        },
    }
}

/// `f32`, `bf16` or `f16` (also `float32`, `bfloat16`, `float16`).
pub fn parse_dtype(s: &str) -> Result<DType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" => Ok(DType::F16),
        _ => bail!("unknown dtype {s:?}; expected f32, bf16 or f16"),
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

/// A progress bar over `len` items labelled `what` (hidden when `quiet`), in the one style
/// the programs share: `label [=====>    ] pos/len elapsed eta`.
pub fn progress_bar(len: u64, what: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len);
    b.set_style(
        ProgressStyle::with_template(
            "{msg:>12} [{bar:30}] {pos}/{len} {elapsed_precise} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    b.set_message(what.to_string());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_and_dtype_names() {
        assert!(parse_device(" CPU ").unwrap().is_cpu());
        let e = parse_device("tpu").unwrap_err().to_string();
        assert!(e.contains("expected cpu, cuda or cuda:N"), "{e}");
        assert!(parse_device("cuda:x").is_err());
        assert_eq!(parse_dtype("bfloat16").unwrap(), DType::BF16);
        assert_eq!(parse_dtype("F16").unwrap(), DType::F16);
        assert!(parse_dtype("f8")
            .unwrap_err()
            .to_string()
            .contains("f32, bf16 or f16"));
        assert_eq!(dtype_or_default(None, &Device::Cpu).unwrap(), DType::F32);
        let a = DeviceArgs {
            cpu: true,
            device: Some("cuda".into()),
            dtype: None,
        };
        assert!(a.device().unwrap().is_cpu(), "--cpu wins over --device");
    }

    #[test]
    fn attention_flags_pick_schedule_then_preset_then_default() {
        let mut a = AttnArgs::default();
        assert_eq!(a.choice("bf16"), AttnChoice::Uniform("bf16"));
        a.attn = Some("mxfp4".into());
        assert_eq!(a.choice("bf16"), AttnChoice::Uniform("mxfp4"));
        a.attn_schedule = Some("hybrid".into());
        assert_eq!(a.choice("bf16"), AttnChoice::Schedule("hybrid"));
    }
}
