//! The generation loop: prefill the prompt, then one token per step through the KV cache.

use super::model::CausalLm;
use super::profile::stage;
use candle_core::{bail, Result, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use std::time::Instant;

/// How the next token is picked.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f64,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
    pub seed: u64,
    /// 1.0 means off.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repeat_last_n: usize,
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_p: None,
            top_k: None,
            seed: 0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
        }
    }
}

/// Picks tokens from logits.
pub struct Sampler {
    lp: LogitsProcessor,
    repeat_penalty: f32,
    repeat_last_n: usize,
}

impl Sampler {
    pub fn new(p: &SamplingParams) -> Result<Self> {
        if !(p.temperature >= 0.0 && p.temperature.is_finite()) {
            bail!("temperature must be ≥ 0, got {}", p.temperature);
        }
        if let Some(tp) = p.top_p {
            if !(tp > 0.0 && tp <= 1.0) {
                bail!("top-p must be in (0, 1], got {tp}");
            }
        }
        if p.top_k == Some(0) {
            bail!("top-k must be ≥ 1");
        }
        if !(p.repeat_penalty > 0.0 && p.repeat_penalty.is_finite()) {
            bail!("repeat penalty must be > 0, got {}", p.repeat_penalty);
        }
        let sampling = if p.temperature == 0.0 {
            Sampling::ArgMax
        } else {
            let temperature = p.temperature;
            match (p.top_k, p.top_p) {
                (None, None) => Sampling::All { temperature },
                (Some(k), None) => Sampling::TopK { k, temperature },
                (None, Some(p)) => Sampling::TopP { p, temperature },
                (Some(k), Some(p)) => Sampling::TopKThenTopP { k, p, temperature },
            }
        };
        Ok(Self {
            lp: LogitsProcessor::from_sampling(p.seed, sampling),
            repeat_penalty: p.repeat_penalty,
            repeat_last_n: p.repeat_last_n,
        })
    }

    /// `logits`: `[vocab]` f32; `history`: the tokens so far (for the repeat penalty).
    pub fn sample(&mut self, logits: &Tensor, history: &[u32]) -> Result<u32> {
        let logits = if self.repeat_penalty == 1.0 {
            logits.clone()
        } else {
            let start = history.len().saturating_sub(self.repeat_last_n);
            candle_transformers::utils::apply_repeat_penalty(
                logits,
                self.repeat_penalty,
                &history[start..],
            )?
        };
        self.lp.sample(&logits)
    }
}

/// Timings of one generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    /// Tokens produced, the stop token included if one was hit.
    pub generated_tokens: usize,
    /// Prompt forward plus the first token's sampling.
    pub prefill_secs: f64,
    /// Decode forwards (one per token after the first).
    pub decode_steps: usize,
    pub decode_secs: f64,
    /// The stop token that ended generation, if any.
    pub stopped_on: Option<u32>,
    /// KV-cache bytes at the end.
    pub kv_cache_bytes: usize,
}

impl GenerationStats {
    pub fn prefill_tok_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_secs.max(1e-12)
    }
    pub fn decode_tok_per_s(&self) -> f64 {
        if self.decode_steps == 0 {
            0.0
        } else {
            self.decode_steps as f64 / self.decode_secs.max(1e-12)
        }
    }
}

/// Generates up to `max_new` tokens after `prompt` (the caches are cleared first),
/// calling `on_token` with each one as soon as it is picked. Stops after a token in
/// `stop` (which is returned and counted, but not fed back).
pub fn generate(
    model: &mut CausalLm,
    prompt: &[u32],
    max_new: usize,
    stop: &[u32],
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<(Vec<u32>, GenerationStats)> {
    if prompt.is_empty() {
        bail!("generate: empty prompt");
    }
    model.clear_kv_cache();
    let dev = model.device().clone();
    let mut stats = GenerationStats {
        prompt_tokens: prompt.len(),
        ..Default::default()
    };
    let mut history = prompt.to_vec();
    let mut out = Vec::new();
    if max_new == 0 {
        return Ok((out, stats));
    }
    let t0 = Instant::now();
    let logits = model.forward_last_ids(prompt)?.squeeze(0)?;
    let mut next = stage(&dev, "sampling", || sampler.sample(&logits, &history))?;
    stats.prefill_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    loop {
        out.push(next);
        history.push(next);
        on_token(next)?;
        if stop.contains(&next) {
            stats.stopped_on = Some(next);
            break;
        }
        if out.len() >= max_new {
            break;
        }
        let logits = model.forward_last_ids(&[next])?.squeeze(0)?;
        next = stage(&dev, "sampling", || sampler.sample(&logits, &history))?;
        stats.decode_steps += 1;
    }
    // on_token's time (printing) is small next to a forward; it is not subtracted.
    stats.decode_secs = t1.elapsed().as_secs_f64();
    stats.generated_tokens = out.len();
    stats.kv_cache_bytes = model.kv_cache_bytes();
    Ok((out, stats))
}

/// Greedy continuation without stop tokens (evals and parity tests).
pub fn greedy(model: &mut CausalLm, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
    let mut s = Sampler::new(&SamplingParams::greedy())?;
    Ok(generate(model, prompt, n, &[], &mut s, |_| Ok(()))?.0)
}
