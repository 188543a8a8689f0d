//! One video from one request: text encoding, denoising under an attention schedule, and the
//! VAE decode, with progress reported through a callback. Front ends (the `wan22` example,
//! a server, a notebook binding) only parse their input and handle the events.

use super::pipeline::{GenerateOptions, StepInfo, WanPipeline};
use super::schedule::{ScheduleSpec, WanSchedule};
use super::vae::DecodeStats;
use candle_core::{DType, Result, Tensor};
use mxattn_video::RgbFrames;
use std::hash::{DefaultHasher, Hasher};
use std::time::Instant;

/// What to generate.
#[derive(Clone, Debug)]
pub struct Request {
    pub options: GenerateOptions,
    /// The attention schedule (a preset name alone runs it everywhere).
    pub schedule: ScheduleSpec,
    /// Decode the final latents to frames (false: stop after denoising).
    pub decode: bool,
}

/// The run as planned, before any work.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Latent shape `[b, c, t, h, w]`.
    pub latent_dims: (usize, usize, usize, usize, usize),
    /// Video tokens per transformer call.
    pub tokens: usize,
    /// The first step on the low-noise expert (`steps` when there is one transformer).
    pub switch_step: usize,
    /// The schedule tied to this run.
    pub schedule: WanSchedule,
}

/// Progress of [`WanPipeline::generate`], in order.
pub enum Event<'a> {
    /// Sizes and the resolved schedule.
    Planned(&'a Plan),
    /// The prompts are encoded (device synchronized).
    TextEncoded { seconds: f64 },
    /// One denoising step is done.
    Step(&'a StepInfo),
    /// One decoded chunk of frames (the first chunk holds 1 frame, each later one 4).
    Frames(&'a RgbFrames),
}

/// What a generation produced.
#[derive(Clone, Debug)]
pub struct Generation {
    pub plan: Plan,
    /// The final (normalized) latents.
    pub latents: Tensor,
    pub text_seconds: f64,
    pub denoise_seconds: f64,
    pub steps: Vec<StepInfo>,
    /// The VAE decode's wall time and statistics, when it ran.
    pub decode: Option<(f64, DecodeStats)>,
    /// Fingerprint of the final latents (their f32 bits), to compare runs of one seed.
    pub latents_hash: u64,
    /// Fingerprint of the decoded RGB frames, when decoded.
    pub frames_hash: Option<u64>,
}

impl WanPipeline {
    /// Runs `req` end to end, handing every [`Event`] to `on_event` as it happens (an error
    /// from the callback stops the run and is returned).
    pub fn generate(
        &self,
        req: &Request,
        mut on_event: impl FnMut(Event<'_>) -> Result<()>,
    ) -> Result<Generation> {
        let o = &req.options;
        let latent_dims = self.latent_dims(o)?;
        let n_layers = self.experts[0].config().num_layers;
        let schedule = req.schedule.resolve(o.steps, n_layers)?;
        let sch = self.scheduler(o)?;
        let switch_step = self.switch_step(sch.timesteps(), sch.num_train_timesteps())?;
        let plan = Plan {
            latent_dims,
            tokens: latent_dims.2 * (latent_dims.3 / 2) * (latent_dims.4 / 2),
            switch_step,
            schedule,
        };
        on_event(Event::Planned(&plan))?;

        let t_text = Instant::now();
        let (cond, uncond) = self.encode_prompts(o)?;
        self.device.synchronize()?;
        let text_seconds = t_text.elapsed().as_secs_f64();
        on_event(Event::TextEncoded {
            seconds: text_seconds,
        })?;

        let init = self.initial_latents(o)?;
        let mut steps = Vec::with_capacity(o.steps);
        let t_den = Instant::now();
        let latents = self.denoise(
            o,
            init,
            &cond,
            uncond.as_ref(),
            &plan.schedule,
            |info, _| {
                steps.push(info.clone());
                on_event(Event::Step(info))
            },
        )?;
        let denoise_seconds = t_den.elapsed().as_secs_f64();
        let mut h = DefaultHasher::new();
        for x in latents
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?
        {
            h.write_u32(x.to_bits());
        }
        let latents_hash = h.finish();

        let (mut decode, mut frames_hash) = (None, None);
        // in a parallel run the leader alone decodes (every rank holds the same latents)
        if req.decode && self.is_leader() {
            let t_vae = Instant::now();
            let mut fh = DefaultHasher::new();
            let stats = self.decode(&latents, &plan.schedule, |t| {
                let rgb = RgbFrames::from_tensor(&t)?;
                for f in &rgb.frames {
                    fh.write(f);
                }
                on_event(Event::Frames(&rgb))
            })?;
            decode = Some((t_vae.elapsed().as_secs_f64(), stats));
            frames_hash = Some(fh.finish());
        }
        Ok(Generation {
            plan,
            latents,
            text_seconds,
            denoise_seconds,
            steps,
            decode,
            latents_hash,
            frames_hash,
        })
    }
}
