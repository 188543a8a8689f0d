//! Prompt encoding as diffusers' `WanPipeline._get_t5_prompt_embeds`: clean each prompt,
//! tokenize with padding to `max_sequence_length` (512) and truncation (`</s>` appended by the
//! tokenizer's template), run the encoder with the padding mask, then keep each prompt's true
//! length and zero the rest. Wan2.2's own `T5EncoderModel` trims the same way and its
//! transformer zero-pads back to 512, so both give the same context.

use super::clean::prompt_clean;
use super::model::Umt5Encoder;
use candle_core::{bail, DType, Device, Result, Tensor};
use std::path::Path;
use tokenizers::{
    PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer, TruncationDirection,
    TruncationParams, TruncationStrategy,
};

/// Wan's default `max_sequence_length` (`text_len`).
pub const DEFAULT_MAX_SEQUENCE_LENGTH: usize = 512;

/// The negative prompt Wan2.2 uses when none is given (`wan/configs/shared_config.py`,
/// `sample_neg_prompt`).
pub const WAN_NEGATIVE_PROMPT: &str = "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走";

/// Tokenized prompts.
#[derive(Clone, Debug)]
pub struct Tokens {
    /// `[b, max_sequence_length]` u32.
    pub input_ids: Tensor,
    /// `[b, max_sequence_length]` u32, 1 for tokens, 0 for padding.
    pub attention_mask: Tensor,
    /// Tokens of each prompt, `</s>` included.
    pub lengths: Vec<usize>,
}

/// The UMT5 tokenizer and encoder of a Wan pipeline.
pub struct TextEncoder {
    tokenizer: Tokenizer,
    model: Umt5Encoder,
    max_len: usize,
    clean: bool,
}

fn tok_err(e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("UMT5 tokenizer: {e}"))
}

impl TextEncoder {
    /// Pairs a tokenizer (`tokenizer/tokenizer.json`) with an encoder; max length 512.
    pub fn new(tokenizer: Tokenizer, model: Umt5Encoder) -> Result<Self> {
        let mut t = Self {
            tokenizer,
            model,
            max_len: 0,
            clean: true,
        };
        t.set_max_sequence_length(DEFAULT_MAX_SEQUENCE_LENGTH)?;
        Ok(t)
    }

    /// Loads `tokenizer/tokenizer.json` and `text_encoder/` of a Wan -Diffusers directory.
    pub fn load(pipeline_dir: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        let dir = pipeline_dir.as_ref();
        Self::from_paths(
            dir.join("tokenizer").join("tokenizer.json"),
            dir.join("text_encoder"),
            dtype,
            device,
        )
    }

    /// Loads a `tokenizer.json` and a text-encoder directory.
    pub fn from_paths(
        tokenizer_json: impl AsRef<Path>,
        text_encoder_dir: impl AsRef<Path>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let p = tokenizer_json.as_ref();
        if !p.is_file() {
            bail!("{}: no such tokenizer file", p.display());
        }
        let tokenizer = Tokenizer::from_file(p)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", p.display())))?;
        let model = Umt5Encoder::load(text_encoder_dir, dtype, device)?;
        Self::new(tokenizer, model)
    }

    /// Pads and truncates to `n` tokens instead of 512.
    pub fn with_max_sequence_length(mut self, n: usize) -> Result<Self> {
        self.set_max_sequence_length(n)?;
        Ok(self)
    }

    /// Whether prompts go through [`prompt_clean`] first (default true, as diffusers).
    pub fn with_cleaning(mut self, clean: bool) -> Self {
        self.clean = clean;
        self
    }

    /// Pads and truncates to `n` tokens (at least 1).
    pub fn set_max_sequence_length(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            bail!("UMT5: max_sequence_length must be positive");
        }
        let (pad_id, pad_token) = match self.tokenizer.get_padding() {
            Some(p) => (p.pad_id, p.pad_token.clone()),
            None => match self.tokenizer.token_to_id("<pad>") {
                Some(id) => (id, "<pad>".to_string()),
                None => bail!("UMT5 tokenizer: no padding configured and no <pad> token"),
            },
        };
        self.tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(n),
            direction: PaddingDirection::Right,
            pad_to_multiple_of: None,
            pad_id,
            pad_type_id: 0,
            pad_token,
        }));
        self.tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: n,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(tok_err)?;
        self.max_len = n;
        Ok(())
    }

    pub fn max_sequence_length(&self) -> usize {
        self.max_len
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn model(&self) -> &Umt5Encoder {
        &self.model
    }

    /// Cleans (unless disabled) and tokenizes `prompts` as the pipeline does.
    pub fn tokenize(&self, prompts: &[&str]) -> Result<Tokens> {
        if prompts.is_empty() {
            bail!("UMT5: no prompts to encode");
        }
        let (b, n) = (prompts.len(), self.max_len);
        let mut ids = Vec::with_capacity(b * n);
        let mut mask = Vec::with_capacity(b * n);
        let mut lengths = Vec::with_capacity(b);
        for p in prompts {
            let text = if self.clean {
                prompt_clean(p)
            } else {
                p.to_string()
            };
            let enc = self.tokenizer.encode(text, true).map_err(tok_err)?;
            if enc.get_ids().len() != n {
                bail!(
                    "UMT5 tokenizer: got {} tokens, padding to {n} expected",
                    enc.get_ids().len()
                );
            }
            ids.extend_from_slice(enc.get_ids());
            mask.extend_from_slice(enc.get_attention_mask());
            lengths.push(enc.get_attention_mask().iter().filter(|&&m| m != 0).count());
        }
        let dev = self.model.device();
        Ok(Tokens {
            input_ids: Tensor::from_vec(ids, (b, n), dev)?,
            attention_mask: Tensor::from_vec(mask, (b, n), dev)?,
            lengths,
        })
    }

    /// `[b, max_sequence_length, d_model]` in the model dtype: each prompt's encoder output
    /// over its own tokens, zeros after them.
    pub fn encode(&self, prompts: &[&str]) -> Result<Tensor> {
        let t = self.tokenize(prompts)?;
        let h = self.model.forward(&t.input_ids, Some(&t.attention_mask))?;
        trim_and_pad(&h, &t.lengths)
    }
}

/// Keeps the first `lengths[i]` rows of prompt `i` of `h` `[b, l, d]` and zeroes the rest.
pub fn trim_and_pad(h: &Tensor, lengths: &[usize]) -> Result<Tensor> {
    let (b, l, d) = h.dims3()?;
    if lengths.len() != b || lengths.iter().any(|&n| n > l) {
        bail!(
            "trim_and_pad: lengths {lengths:?} do not fit hidden states {:?}",
            h.dims()
        );
    }
    let rows = (0..b)
        .map(|i| {
            let n = lengths[i];
            let keep = h.get(i)?.narrow(0, 0, n)?;
            if n == l {
                Ok(keep)
            } else {
                Tensor::cat(
                    &[keep, Tensor::zeros((l - n, d), h.dtype(), h.device())?],
                    0,
                )
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::stack(&rows, 0)
}
