//! The Wan2.2 text-to-video pipeline: prompt encoding, classifier-free guidance with the
//! A14B expert switch, the flow-matching sampler, and the VAE decode, as diffusers'
//! `WanPipeline` runs them (`pipeline_wan.py`), with every attention call routed through an
//! [`AttnPolicy`] (an attention schedule).
//!
//! Per step `i` with timestep `t`: the high-noise expert (`transformer/`) and guidance
//! `guidance_high` while `t ≥ boundary_ratio · 1000`, else the low-noise expert
//! (`transformer_2/`) and `guidance_low`; `v = v_uncond + g · (v_cond − v_uncond)` (the two
//! branches run as two batch-1 calls, in the transformer's dtype, as diffusers does); then the
//! sampler's step on f32 latents. TI2V-5B (`expand_timesteps`) gets the timestep per token.
//! The initial noise comes from [`mxattn::synth::Rng`] (seeded, device-independent); torch's
//! generator cannot be reproduced, so parity tests pass the initial latents in.

use super::schedule::LinearSpec;
use super::scheduler::{expert_switch_step, FlowScheduler, SamplerKind, UniPcConfig};
use super::sizes::{latent_shape, WanVariant};
use super::transformer::{expert_dirs, TransformerConfig, WanTransformer};
use super::umt5::{trim_and_pad, TextEncoder, Umt5Config, Umt5Encoder};
use super::vae::{DecodeStats, VaeConfig, WanVae};
use super::AttnPolicy;
use candle_core::{bail, DType, Device, Result, Tensor};
use mxattn_dist::Communicator;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// How prompts become text embeddings.
pub enum TextSource {
    /// UMT5 with its tokenizer.
    Encoder(Box<TextEncoder>),
    /// A (random-weights) UMT5 without a tokenizer: prompts are replaced by pseudo-random
    /// token ids of `tokens` length, for speed runs where no tokenizer file exists.
    RandomIds {
        model: Box<Umt5Encoder>,
        tokens: usize,
        max_len: usize,
    },
}

impl TextSource {
    fn encode(&self, prompt: &str, seed: u64) -> Result<Tensor> {
        match self {
            Self::Encoder(t) => t.encode(&[prompt]),
            Self::RandomIds {
                model,
                tokens,
                max_len,
            } => {
                let vocab = model.config().vocab_size as u64;
                let mut rng = mxattn::synth::Rng::new(seed ^ prompt.len() as u64);
                let n = (*tokens).min(*max_len);
                let ids: Vec<u32> = (0..*max_len)
                    .map(|i| {
                        if i + 1 < n {
                            2 + (rng.next_u64() % (vocab - 2)) as u32
                        } else if i + 1 == n {
                            1 // </s>
                        } else {
                            0 // <pad>
                        }
                    })
                    .collect();
                let mask: Vec<u32> = (0..*max_len).map(|i| u32::from(i < n)).collect();
                let dev = model.device();
                let ids = Tensor::from_vec(ids, (1, *max_len), dev)?;
                let mask = Tensor::from_vec(mask, (1, *max_len), dev)?;
                let h = model.forward(&ids, Some(&mask))?;
                trim_and_pad(&h, &[n])
            }
        }
    }
}

/// Options of one generation.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub prompt: String,
    pub negative_prompt: String,
    pub width: usize,
    pub height: usize,
    pub frames: usize,
    pub steps: usize,
    /// Guidance of the high-noise expert (and of the only transformer of TI2V-5B).
    pub guidance_high: f64,
    /// Guidance of the low-noise expert.
    pub guidance_low: f64,
    /// Overrides the scheduler config's `flow_shift`.
    pub shift: Option<f64>,
    pub sampler: SamplerKind,
    pub seed: u64,
}

/// The settings of a generation a caller may leave to the model; `None` takes the
/// variant's default (the original release's: [`WanVariant::sampler_defaults`],
/// [`WanVariant::default_size`], [`WanVariant::default_frames`]).
#[derive(Clone, Debug, Default)]
pub struct Settings {
    pub size: Option<(usize, usize)>,
    pub frames: Option<usize>,
    pub steps: Option<usize>,
    /// Guidance of the high-noise expert (and of TI2V-5B's only transformer).
    pub guidance: Option<f64>,
    /// Guidance of the low-noise expert (default: `guidance` when given).
    pub guidance_2: Option<f64>,
    pub shift: Option<f64>,
}

impl Settings {
    /// The MLPerf Inference Wan2.2 text-to-video setting (T2V-A14B): 1280×720, 81 frames,
    /// 20 steps, guidance 4.0 on the high-noise expert and 3.0 on the low-noise one (the
    /// expert boundary 0.875 is A14B's own). The flow shift stays the variant's default.
    pub fn mlperf() -> Self {
        Self {
            size: Some((1280, 720)),
            frames: Some(81),
            steps: Some(20),
            guidance: Some(4.0),
            guidance_2: Some(3.0),
            shift: None,
        }
    }

    /// The fields given in `self`, the others from `base` (explicit flags over a preset).
    pub fn over(self, base: Settings) -> Settings {
        Settings {
            size: self.size.or(base.size),
            frames: self.frames.or(base.frames),
            steps: self.steps.or(base.steps),
            guidance: self.guidance.or(base.guidance),
            guidance_2: self.guidance_2.or(base.guidance_2),
            shift: self.shift.or(base.shift),
        }
    }
}

impl GenerateOptions {
    /// The options of `prompt` for `variant`, with `s` over the variant's defaults.
    pub fn for_variant(
        variant: WanVariant,
        prompt: &str,
        negative_prompt: &str,
        s: &Settings,
        sampler: SamplerKind,
        seed: u64,
    ) -> Self {
        let d = variant.sampler_defaults();
        let (width, height) = s.size.unwrap_or(variant.default_size());
        Self {
            prompt: prompt.to_string(),
            negative_prompt: negative_prompt.to_string(),
            width,
            height,
            frames: s.frames.unwrap_or(variant.default_frames()),
            steps: s.steps.unwrap_or(d.steps),
            guidance_high: s.guidance.unwrap_or(d.guidance_high),
            guidance_low: s.guidance_2.or(s.guidance).unwrap_or(d.guidance_low),
            shift: Some(s.shift.unwrap_or(d.shift)),
            sampler,
            seed,
        }
    }
}

/// What happened at one denoising step.
#[derive(Clone, Debug)]
pub struct StepInfo {
    pub step: usize,
    pub timestep: f64,
    /// 0 = high-noise expert (or the only transformer), 1 = low-noise expert.
    pub expert: usize,
    pub guidance: f64,
    /// Wall time of the step (device synchronized at its end).
    pub seconds: f64,
}

/// The loaded components.
pub struct WanPipeline {
    pub text: TextSource,
    /// High-noise expert first.
    pub experts: Vec<WanTransformer>,
    pub vae: WanVae,
    pub scheduler: UniPcConfig,
    /// A14B's expert switch (`None`: one transformer for every step).
    pub boundary_ratio: Option<f64>,
    /// TI2V-5B: the timestep is given per token.
    pub expand_timesteps: bool,
    pub device: Device,
    /// CFG parallelism: two ranks (or rank groups) compute the conditional and the
    /// unconditional branch of each step side by side ([`Self::set_parallel`]).
    cfg_comm: Option<Arc<dyn Communicator>>,
}

/// How one process takes part in a parallel run: `sp` splits each transformer forward's
/// tokens across its ranks (Ulysses), `cfg` pairs it with the rank of the same place in the
/// other guidance branch. Either is `None` (or a group of one) where that parallelism is
/// off.
#[derive(Clone, Debug, Default)]
pub struct Parallel {
    pub sp: Option<Arc<dyn Communicator>>,
    pub cfg: Option<Arc<dyn Communicator>>,
}

fn read_model_index(dir: &Path) -> Result<(Option<f64>, bool)> {
    let p = dir.join("model_index.json");
    if !p.is_file() {
        return Ok((None, false));
    }
    let v: serde_json::Value = mxattn_checkpoint::read_json(&p, "valid JSON")?;
    let boundary = match v.get("boundary_ratio") {
        None | Some(serde_json::Value::Null) => None,
        Some(x) => Some(x.as_f64().ok_or_else(|| {
            candle_core::Error::Msg(format!("{}: boundary_ratio is not a number", p.display()))
        })?),
    };
    let expand = v
        .get("expand_timesteps")
        .and_then(|x| x.as_bool())
        .unwrap_or(false);
    Ok((boundary, expand))
}

impl WanPipeline {
    /// Loads a diffusers-layout pipeline directory: `model_index.json` (boundary_ratio,
    /// expand_timesteps), `tokenizer/`, `text_encoder/`, `transformer/` (+ `transformer_2/`),
    /// `vae/`, `scheduler/`. Transformer and text encoder in `dtype`; the VAE in `vae_dtype`.
    pub fn load(
        dir: impl AsRef<Path>,
        dtype: DType,
        vae_dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            bail!("{}: not a directory", dir.display());
        }
        let (boundary_ratio, expand_timesteps) = read_model_index(dir)?;
        let text = TextSource::Encoder(Box::new(TextEncoder::load(dir, dtype, device)?));
        let experts = expert_dirs(dir)?
            .iter()
            .map(|d| WanTransformer::load(d, dtype, device))
            .collect::<Result<Vec<_>>>()?;
        if boundary_ratio.is_some() && experts.len() != 2 {
            bail!(
                "{}: model_index.json sets boundary_ratio but {} transformer(s) found (transformer/ and transformer_2/ expected)",
                dir.display(),
                experts.len()
            );
        }
        let vae = WanVae::load(dir, vae_dtype, device)?;
        let scheduler = UniPcConfig::from_repo(dir)?;
        Ok(Self {
            text,
            experts,
            vae,
            scheduler,
            boundary_ratio,
            expand_timesteps,
            cfg_comm: None,
            device: device.clone(),
        })
    }

    /// The released architecture of `variant` with random weights (speed runs), with the
    /// original sampler defaults (shift, boundary). Prompts become pseudo-random ids of
    /// `prompt_tokens` tokens.
    pub fn random(
        variant: WanVariant,
        dtype: DType,
        vae_dtype: DType,
        device: &Device,
        seed: u64,
        prompt_tokens: usize,
    ) -> Result<Self> {
        let d = variant.sampler_defaults();
        let (tcfg, vcfg, n_experts) = match variant {
            WanVariant::T2vA14b => (TransformerConfig::t2v_a14b(), VaeConfig::wan21(), 2),
            WanVariant::Ti2v5b => (TransformerConfig::ti2v_5b(), VaeConfig::wan22(), 1),
        };
        let experts = (0..n_experts)
            .map(|i| WanTransformer::random(&tcfg, dtype, device, seed + 1 + i as u64))
            .collect::<Result<Vec<_>>>()?;
        let model = Box::new(Umt5Encoder::random(
            &Umt5Config::umt5_xxl(),
            dtype,
            device,
            seed + 10,
        )?);
        Ok(Self {
            text: TextSource::RandomIds {
                model,
                tokens: prompt_tokens.max(1),
                max_len: super::umt5::DEFAULT_MAX_SEQUENCE_LENGTH,
            },
            experts,
            vae: WanVae::random(&vcfg, vae_dtype, device, seed + 20)?,
            scheduler: UniPcConfig::wan(d.shift),
            boundary_ratio: d.boundary_ratio,
            expand_timesteps: variant == WanVariant::Ti2v5b,
            cfg_comm: None,
            device: device.clone(),
        })
    }

    /// Pads and truncates prompts to `n` tokens instead of 512 (tiny test models).
    pub fn set_max_sequence_length(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            bail!("max sequence length must be at least 1");
        }
        match &mut self.text {
            TextSource::Encoder(t) => t.set_max_sequence_length(n)?,
            TextSource::RandomIds {
                tokens, max_len, ..
            } => {
                *tokens = (*tokens).min(n);
                *max_len = n;
            }
        }
        Ok(())
    }

    /// The variant these components look like (by latent channels).
    pub fn variant(&self) -> WanVariant {
        if self.experts[0].config().in_channels == 48 {
            WanVariant::Ti2v5b
        } else {
            WanVariant::T2vA14b
        }
    }

    /// `[1, C, F, H/s, W/s]` for the options (any size the grid allows; the caller checks
    /// the released sizes).
    pub fn latent_dims(&self, o: &GenerateOptions) -> Result<(usize, usize, usize, usize, usize)> {
        let c = self.experts[0].config().in_channels;
        let s = self.vae.config().spatial_factor();
        if !o.width.is_multiple_of(2 * s)
            || !o.height.is_multiple_of(2 * s)
            || o.width == 0
            || o.height == 0
        {
            bail!(
                "size {}x{}: width and height must be positive multiples of {} (VAE stride {s} × patch 2)",
                o.width,
                o.height,
                2 * s
            );
        }
        let (_, _, f, _, _) = latent_shape(self.variant(), o.width, o.height, o.frames)?;
        Ok((1, c, f, o.height / s, o.width / s))
    }

    /// Seeded N(0, 1) initial latents, f32.
    pub fn initial_latents(&self, o: &GenerateOptions) -> Result<Tensor> {
        let shape = self.latent_dims(o)?;
        let n = shape.0 * shape.1 * shape.2 * shape.3 * shape.4;
        let v = mxattn::synth::Rng::new(o.seed).normals(n, 1.0);
        Tensor::from_vec(v, shape, &Device::Cpu)?.to_device(&self.device)
    }

    /// The sampler for the options (steps set).
    pub fn scheduler(&self, o: &GenerateOptions) -> Result<Box<dyn FlowScheduler>> {
        let mut cfg = self.scheduler.clone();
        if let Some(s) = o.shift {
            if !(s.is_finite() && s > 0.0) {
                bail!("shift must be a positive number, got {s}");
            }
            cfg.flow_shift = s;
        }
        let mut sch = o.sampler.build(&cfg)?;
        sch.set_timesteps(o.steps)?;
        Ok(sch)
    }

    /// The step at which the low-noise expert takes over (`steps` when it never does).
    pub fn switch_step(&self, timesteps: &[f64], train_steps: usize) -> Result<usize> {
        match self.boundary_ratio {
            Some(b) if self.experts.len() == 2 => expert_switch_step(timesteps, b, train_steps),
            _ => Ok(timesteps.len()),
        }
    }

    /// Prompt and negative-prompt embeddings, in the transformer dtype.
    pub fn encode_prompts(&self, o: &GenerateOptions) -> Result<(Tensor, Option<Tensor>)> {
        let dt = self.experts[0].dtype();
        let cond = self.text.encode(&o.prompt, o.seed)?.to_dtype(dt)?;
        let uncond = if self.uses_cfg(o) {
            Some(
                self.text
                    .encode(&o.negative_prompt, o.seed.wrapping_add(1))?
                    .to_dtype(dt)?,
            )
        } else {
            None
        };
        Ok((cond, uncond))
    }

    /// Runs this process as one rank of `p`: sequence parallel inside each transformer
    /// forward, and/or one guidance branch per CFG rank (the two exchange their predictions
    /// every step, so every rank holds the same latents). The VAE decode runs on the leader
    /// alone ([`Self::is_leader`]).
    pub fn set_parallel(&mut self, p: Parallel) -> Result<()> {
        if let Some(c) = &p.cfg {
            if c.world() > 2 {
                bail!(
                    "CFG parallelism pairs the two guidance branches: its group has 2 ranks, got {}",
                    c.world()
                );
            }
        }
        for e in &mut self.experts {
            e.set_sequence_parallel(p.sp.clone())?;
        }
        self.cfg_comm = p.cfg.filter(|c| c.world() > 1);
        Ok(())
    }

    /// Runs the transformers' projections as the linear schedule `spec` says (e.g. `fp8`:
    /// every block's projections in FP8 E4M3 with per-channel weight scales), quantizing
    /// them now.
    pub fn set_linears(&mut self, spec: &LinearSpec) -> Result<()> {
        for (expert, t) in self.experts.iter_mut().enumerate() {
            let plan = spec.resolve(t.config().num_layers)?;
            t.set_linears(|layer, kind| plan.format(expert, layer, kind))?;
        }
        Ok(())
    }

    /// Rank 0 of a parallel run (or a single process): the one that decodes and writes.
    pub fn is_leader(&self) -> bool {
        let sp0 = self.experts.iter().all(|e| e.sequence_rank() == 0);
        sp0 && self.cfg_comm.as_ref().is_none_or(|c| c.rank() == 0)
    }

    /// diffusers runs the unconditional branch when the guidance scale is above 1.
    pub fn uses_cfg(&self, o: &GenerateOptions) -> bool {
        o.guidance_high > 1.0
    }

    /// Denoises `latents` (f32 `[1, C, F, h, w]`, e.g. [`Self::initial_latents`]) through all
    /// steps; `on_step` sees each step's info and the latents after it.
    pub fn denoise(
        &self,
        o: &GenerateOptions,
        latents: Tensor,
        cond: &Tensor,
        uncond: Option<&Tensor>,
        policy: &dyn AttnPolicy,
        mut on_step: impl FnMut(&StepInfo, &Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        let want = self.latent_dims(o)?;
        if latents.dims() != [want.0, want.1, want.2, want.3, want.4] {
            bail!(
                "initial latents {:?}, expected {:?} for {}x{} and {} frames",
                latents.dims(),
                want,
                o.width,
                o.height,
                o.frames
            );
        }
        if o.steps == 0 {
            bail!("steps must be at least 1");
        }
        let mut sch = self.scheduler(o)?;
        let timesteps = sch.timesteps().to_vec();
        let switch = self.switch_step(&timesteps, sch.num_train_timesteps())?;
        let mut latents = latents.to_dtype(DType::F32)?;
        let tokens = want.2 * (want.3 / 2) * (want.4 / 2);
        for (i, &t) in timesteps.iter().enumerate() {
            let t0 = Instant::now();
            let expert = usize::from(i >= switch);
            let (model, g) = if expert == 0 {
                (&self.experts[0], o.guidance_high)
            } else {
                (&self.experts[1], o.guidance_low)
            };
            let ts = if self.expand_timesteps {
                Tensor::full(t as f32, (1, tokens), &self.device)?
            } else {
                Tensor::full(t as f32, 1, &self.device)?
            };
            let x = latents.to_dtype(model.dtype())?;
            let v = match (uncond, &self.cfg_comm) {
                // CFG parallel: this rank's branch, then both branches' predictions on
                // every rank, combined exactly as below
                (Some(u), Some(c)) => {
                    let mine = if c.rank() == 0 { cond } else { u };
                    let vm = model.forward(&x, &ts, mine, policy, expert, i)?;
                    let both = c.all_gather(&vm.contiguous()?)?;
                    let (v, vu) = (&both[0], &both[1]);
                    (vu + ((v - vu)? * g)?)?
                }
                (Some(u), None) => {
                    let v = model.forward(&x, &ts, cond, policy, expert, i)?;
                    let vu = model.forward(&x, &ts, u, policy, expert, i)?;
                    (&vu + ((&v - &vu)? * g)?)?
                }
                (None, _) => model.forward(&x, &ts, cond, policy, expert, i)?,
            };
            latents = sch.step(&v, i, &latents)?;
            self.device.synchronize()?;
            let info = StepInfo {
                step: i,
                timestep: t,
                expert,
                guidance: g,
                seconds: t0.elapsed().as_secs_f64(),
            };
            on_step(&info, &latents)?;
        }
        Ok(latents)
    }

    /// Decodes final (normalized) latents chunk by chunk, handing frames `[1, 3, t, H, W]`
    /// in [-1, 1] to `on_frames`.
    pub fn decode(
        &self,
        latents: &Tensor,
        policy: &dyn AttnPolicy,
        on_frames: impl FnMut(Tensor) -> Result<()>,
    ) -> Result<DecodeStats> {
        let z = self.vae.denormalize(&latents.to_dtype(self.vae.dtype())?)?;
        self.vae.decode_chunks(&z, policy, on_frames)
    }
}

/// Downloads (or finds in the local Hugging Face cache) the files of a diffusers-layout Wan
/// repository that [`WanPipeline::load`] reads, and returns the snapshot directory holding
/// them. Needs the `hub` feature.
#[cfg(feature = "hub")]
pub fn hub_snapshot(repo_id: &str, revision: Option<&str>) -> Result<std::path::PathBuf> {
    use mxattn_checkpoint::{fetch_component, hub_getter};
    let msg = |s: String| candle_core::Error::Msg(s);
    let get = hub_getter(repo_id, revision, "Wan-AI/Wan2.2-T2V-A14B-Diffusers")?;
    let index = get("model_index.json")?;
    let root = index
        .parent()
        .ok_or_else(|| msg(format!("{}: no parent directory", index.display())))?
        .to_path_buf();
    let (boundary, _) = read_model_index(&root)?;
    get("tokenizer/tokenizer.json")?;
    get("scheduler/scheduler_config.json")?;
    let mut comps = vec![
        ("text_encoder", "model.safetensors"),
        ("transformer", "diffusion_pytorch_model.safetensors"),
        ("vae", "diffusion_pytorch_model.safetensors"),
    ];
    if boundary.is_some() {
        comps.push(("transformer_2", "diffusion_pytorch_model.safetensors"));
    }
    for (dir, weights) in comps {
        fetch_component(&get, Some(dir), weights)?;
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MLPerf setting gives the benchmark's options, and flags given beside it win.
    #[test]
    fn mlperf_setting_and_flags_over_it() {
        let o = |s: &Settings| {
            GenerateOptions::for_variant(WanVariant::T2vA14b, "p", "n", s, SamplerKind::UniPc, 0)
        };
        let m = o(&Settings::default().over(Settings::mlperf()));
        assert_eq!((m.width, m.height, m.frames, m.steps), (1280, 720, 81, 20));
        assert_eq!((m.guidance_high, m.guidance_low), (4.0, 3.0));
        let d = o(&Settings::default());
        assert_eq!(m.shift, d.shift, "the shift stays the variant's");
        let given = Settings {
            steps: Some(2),
            guidance_2: Some(5.0),
            ..Default::default()
        };
        let g = o(&given.over(Settings::mlperf()));
        assert_eq!(
            (g.steps, g.guidance_high, g.guidance_low, g.frames),
            (2, 4.0, 5.0, 81)
        );
    }
}
