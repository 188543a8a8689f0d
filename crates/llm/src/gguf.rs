//! GGUF files (llama.cpp's format): the config from the metadata, the weights dequantized
//! to the model dtype, the tokenizer and the chat template. Read with candle's own reader
//! ([`candle_core::quantized::gguf_file`]).
//!
//! Two things differ from a Hugging Face checkpoint besides the tensor names:
//!
//! - **q/k row order.** llama.cpp's converter permutes the rows of `q_proj` and `k_proj` of
//!   Llama models, per head, so that its RoPE can rotate adjacent pairs `(x[2i], x[2i+1])`;
//!   Hugging Face's rotates `(x[i], x[i + d/2])`. We undo the permutation on loading, as
//!   transformers' GGUF loader does, so the decoder keeps one RoPE and the KV cache holds
//!   the head dims in the order every other checkpoint has (MX blocks along d group the
//!   same dims). Qwen2/Qwen3 GGUFs are not permuted (llama.cpp runs them with NeoX RoPE).
//! - **the tokenizer** is metadata: tokens, merges, token types and a pre-tokenizer name,
//!   from which [`tokenizer`] builds a `tokenizers::Tokenizer`.
//!
//! Errors name the file and the missing key or tensor.

use crate::config::{Arch, Config};
use crate::loading::expected_tensors;
use crate::model::CausalLm;
use crate::schedule::Schedule;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{bail, DType, Device, Result, Tensor};
use candle_nn::{Activation, VarBuilder};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer};

fn msg(s: String) -> candle_core::Error {
    candle_core::Error::Msg(s)
}

/// An open GGUF file: its header (metadata and tensor index), not yet its weights.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
}

impl GgufFile {
    /// Reads the header. An unknown tensor type (a quantization candle cannot read, such
    /// as the IQ formats) is an error here, naming the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut f =
            std::fs::File::open(&path).map_err(|e| msg(format!("{}: {e}", path.display())))?;
        let content = Content::read(&mut f).map_err(|e| {
            let hint = if e.to_string().contains("unknown dtype") {
                " (a tensor type candle cannot read; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, \
                 Q5_1, Q8_0, Q8_1, Q2_K..Q6_K, Q8_K)"
            } else {
                ""
            };
            msg(format!(
                "{}: not a readable GGUF file: {e}{hint}",
                path.display()
            ))
        })?;
        Ok(Self { path, content })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw metadata value of `key`.
    pub fn get(&self, key: &str) -> Result<&Value> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| msg(format!("{}: no metadata key `{key}`", self.path.display())))
    }

    fn bad(&self, key: &str, what: &str, e: impl std::fmt::Display) -> candle_core::Error {
        msg(format!(
            "{}: metadata `{key}` is not {what}: {e}",
            self.path.display()
        ))
    }

    /// An unsigned integer of any width (files differ in the width they store).
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        let v = self.get(key)?;
        let n = match v {
            Value::I8(x) => i64::from(*x),
            Value::I16(x) => i64::from(*x),
            Value::I32(x) => i64::from(*x),
            Value::I64(x) => *x,
            v => v
                .to_u64()
                .map_err(|e| self.bad(key, "an integer", e))?
                .try_into()
                .map_err(|e| self.bad(key, "a usize", e))?,
        };
        usize::try_from(n).map_err(|e| self.bad(key, "a non-negative integer", e))
    }

    fn get_usize_or(&self, key: &str, default: usize) -> Result<usize> {
        if self.content.metadata.contains_key(key) {
            self.get_usize(key)
        } else {
            Ok(default)
        }
    }

    pub fn get_f64(&self, key: &str) -> Result<f64> {
        match self.get(key)? {
            Value::F32(x) => Ok(f64::from(*x)),
            Value::F64(x) => Ok(*x),
            v => Err(self.bad(key, "a float", format!("{v:?}"))),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.get(key)?
            .to_string()
            .map(|s| s.as_str())
            .map_err(|e| self.bad(key, "a string", e))
    }

    pub fn get_bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.content.metadata.get(key) {
            None => Ok(default),
            Some(v) => v.to_bool().map_err(|e| self.bad(key, "a bool", e)),
        }
    }

    fn get_array(&self, key: &str) -> Result<&Vec<Value>> {
        self.get(key)?
            .to_vec()
            .map_err(|e| self.bad(key, "an array", e))
    }

    fn get_strings(&self, key: &str) -> Result<Vec<&str>> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.to_string()
                    .map(|s| s.as_str())
                    .map_err(|e| self.bad(key, "an array of strings", e))
            })
            .collect()
    }

    fn get_ints(&self, key: &str) -> Result<Vec<i64>> {
        self.get_array(key)?
            .iter()
            .map(|v| match v {
                Value::I32(x) => Ok(i64::from(*x)),
                Value::U32(x) => Ok(i64::from(*x)),
                Value::I8(x) => Ok(i64::from(*x)),
                Value::U8(x) => Ok(i64::from(*x)),
                Value::I64(x) => Ok(*x),
                v => Err(self.bad(key, "an array of integers", format!("{v:?}"))),
            })
            .collect()
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    /// The decoder config from the `{arch}.*` keys. Embeddings are tied when the file has
    /// no `output.weight`.
    pub fn config(&self) -> Result<Config> {
        let a = self.architecture()?;
        let arch = Arch::from_model_type(a).map_err(|e| {
            msg(format!(
                "{}: general.architecture: {e}",
                self.path.display()
            ))
        })?;
        let k = |s: &str| format!("{a}.{s}");
        let hidden = self.get_usize(&k("embedding_length"))?;
        let heads = self.get_usize(&k("attention.head_count"))?;
        if heads == 0 {
            bail!(
                "{}: {} is 0",
                self.path.display(),
                k("attention.head_count")
            );
        }
        let kv_heads = self.get_usize_or(&k("attention.head_count_kv"), heads)?;
        let head_dim = self.get_usize_or(&k("attention.key_length"), hidden / heads)?;
        let v_dim = self.get_usize_or(&k("attention.value_length"), head_dim)?;
        if v_dim != head_dim {
            bail!(
                "{}: value_length {v_dim} differs from key_length {head_dim}; not supported",
                self.path.display()
            );
        }
        let rope_dims = self.get_usize_or(&k("rope.dimension_count"), head_dim)?;
        if rope_dims != head_dim {
            bail!(
                "{}: partial RoPE ({} = {rope_dims}, head dim {head_dim}) is not supported",
                self.path.display(),
                k("rope.dimension_count")
            );
        }
        if let Ok(t) = self.get_str(&k("rope.scaling.type")) {
            if t != "none" {
                bail!(
                    "{}: {} = {t:?} is not supported (only plain RoPE)",
                    self.path.display(),
                    k("rope.scaling.type")
                );
            }
        }
        let rope_theta = if self.content.metadata.contains_key(&k("rope.freq_base")) {
            self.get_f64(&k("rope.freq_base"))?
        } else {
            10_000.0 // llama.cpp's default when the key is absent
        };
        let vocab_size = match self.get_usize(&k("vocab_size")) {
            Ok(v) => v,
            Err(_) => self.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let id = |key: &str| -> Result<Option<u32>> {
            if self.content.metadata.contains_key(key) {
                Ok(Some(self.get_usize(key)? as u32))
            } else {
                Ok(None)
            }
        };
        let cfg = Config {
            arch,
            vocab_size,
            hidden_size: hidden,
            intermediate_size: self.get_usize(&k("feed_forward_length"))?,
            num_hidden_layers: self.get_usize(&k("block_count"))?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            max_position_embeddings: self.get_usize(&k("context_length"))?,
            rope_theta,
            rms_norm_eps: self.get_f64(&k("attention.layer_norm_rms_epsilon"))?,
            tie_word_embeddings: !self.content.tensor_infos.contains_key("output.weight"),
            // llama.cpp names the o bias `attn_output.bias`; Llama files rarely have any
            attention_bias: arch != Arch::Qwen2
                && self.content.tensor_infos.contains_key("blk.0.attn_q.bias"),
            hidden_act: Activation::Silu,
            bos_token_id: id("tokenizer.ggml.bos_token_id")?,
            eos_token_ids: id("tokenizer.ggml.eos_token_id")?.into_iter().collect(),
            fp8_block_weights: false,
        };
        cfg.validate()
            .map_err(|e| msg(format!("{}: {e}", self.path.display())))?;
        Ok(cfg)
    }

    /// The GGUF name of a Hugging Face tensor name (`model.layers.3.self_attn.q_proj.weight`
    /// → `blk.3.attn_q.weight`).
    pub fn gguf_name(hf: &str) -> Option<String> {
        let top = match hf {
            "model.embed_tokens.weight" => Some("token_embd.weight"),
            "model.norm.weight" => Some("output_norm.weight"),
            "lm_head.weight" => Some("output.weight"),
            _ => None,
        };
        if let Some(t) = top {
            return Some(t.to_string());
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        let (module, kind) = rest.rsplit_once('.')?;
        let g = match module {
            "input_layernorm" => "attn_norm",
            "post_attention_layernorm" => "ffn_norm",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.o_proj" => "attn_output",
            "self_attn.q_norm" => "attn_q_norm",
            "self_attn.k_norm" => "attn_k_norm",
            "mlp.gate_proj" => "ffn_gate",
            "mlp.up_proj" => "ffn_up",
            "mlp.down_proj" => "ffn_down",
            _ => return None,
        };
        Some(format!("blk.{layer}.{g}.{kind}"))
    }

    /// Every tensor `cfg` needs, dequantized to `dtype` on `device`, under its Hugging
    /// Face name, with llama.cpp's q/k permutation undone for Llama.
    pub fn tensors(
        &self,
        cfg: &Config,
        dtype: DType,
        device: &Device,
    ) -> Result<HashMap<String, Tensor>> {
        let mut f = std::fs::File::open(&self.path)
            .map_err(|e| msg(format!("{}: {e}", self.path.display())))?;
        let mut out = HashMap::new();
        for (hf, shape) in expected_tensors(cfg) {
            let Some(g) = Self::gguf_name(&hf) else {
                bail!("no GGUF name for the tensor {hf}");
            };
            let info = self.content.tensor_infos.get(&g).ok_or_else(|| {
                msg(format!(
                    "{}: no tensor `{g}` (the model's {hf})",
                    self.path.display()
                ))
            })?;
            if info.shape.dims() != shape.as_slice() {
                bail!(
                    "{}: tensor `{g}` has shape {:?}, the config implies {shape:?}",
                    self.path.display(),
                    info.shape.dims()
                );
            }
            // Dequantized on the CPU (f32), then cast and moved: candle's CUDA dequantizers
            // would do too, but one path keeps every device's weights identical.
            let t = info
                .read(&mut f, self.content.tensor_data_offset, &Device::Cpu)
                .and_then(|q| q.dequantize(&Device::Cpu))
                .map_err(|e| msg(format!("{}: tensor `{g}`: {e}", self.path.display())))?;
            let t = if cfg.arch == Arch::Llama {
                if hf.ends_with("q_proj.weight") || hf.ends_with("q_proj.bias") {
                    unpermute_rows(&t, cfg.num_attention_heads)?
                } else if hf.ends_with("k_proj.weight") || hf.ends_with("k_proj.bias") {
                    unpermute_rows(&t, cfg.num_key_value_heads)?
                } else {
                    t
                }
            } else {
                t
            };
            out.insert(hf, t.to_dtype(dtype)?.to_device(device)?);
        }
        Ok(out)
    }

    /// The model: config from the metadata, weights dequantized to `dtype`.
    pub fn load(&self, schedule: &Schedule, dtype: DType, device: &Device) -> Result<CausalLm> {
        let cfg = self.config()?;
        let tensors = self.tensors(&cfg, dtype, device)?;
        let vb = VarBuilder::from_tensors(tensors, dtype, device);
        CausalLm::new(&cfg, schedule, vb).map_err(|e| {
            msg(format!(
                "building the model of {}: {e}",
                self.path.display()
            ))
        })
    }

    /// The tokenizer the metadata describes (see [`tokenizer`]).
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        tokenizer(self)
    }

    /// `tokenizer.chat_template`, if the file has one.
    pub fn chat_template(&self) -> Result<Option<String>> {
        match self.content.metadata.get("tokenizer.chat_template") {
            None => Ok(None),
            Some(_) => Ok(Some(self.get_str("tokenizer.chat_template")?.to_string())),
        }
    }

    /// The chat template with the file's bos/eos token texts, if the file has one.
    pub fn chat(&self) -> Result<Option<crate::chat::ChatTemplate>> {
        let Some(src) = self.chat_template()? else {
            return Ok(None);
        };
        let text = |key: &str| -> Result<String> {
            if self.content.metadata.contains_key(key) {
                self.token(self.get_usize(key)? as u32)
            } else {
                Ok(String::new())
            }
        };
        let bos = text("tokenizer.ggml.bos_token_id")?;
        let eos = text("tokenizer.ggml.eos_token_id")?;
        crate::chat::ChatTemplate::new(&src, &bos, &eos)
            .map(Some)
            .map_err(|e| {
                msg(format!(
                    "{}: tokenizer.chat_template: {e}",
                    self.path.display()
                ))
            })
    }

    /// The text of token `id` in `tokenizer.ggml.tokens`.
    pub fn token(&self, id: u32) -> Result<String> {
        let toks = self.get_strings("tokenizer.ggml.tokens")?;
        toks.get(id as usize).map(|s| s.to_string()).ok_or_else(|| {
            msg(format!(
                "{}: token id {id} is past tokenizer.ggml.tokens ({})",
                self.path.display(),
                toks.len()
            ))
        })
    }
}

/// Undoes llama.cpp's per-head row permutation of a q or k projection (`[heads·d, …]`):
/// within a head, GGUF row `2i + j` holds Hugging Face row `j·d/2 + i` (i < d/2, j < 2).
fn unpermute_rows(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let rows = dims[0];
    if heads == 0 || !rows.is_multiple_of(2 * heads) {
        bail!("q/k rows ({rows}) are not a whole number of heads ({heads}) of even size");
    }
    let half = rows / heads / 2;
    let rest: usize = dims[1..].iter().product();
    t.reshape((heads, half, 2, rest))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)
}

/// Builds the `tokenizers::Tokenizer` the metadata describes: byte-level BPE (`gpt2`)
/// with `tokenizer.ggml.tokens` / `merges`; the tokens of type 3 (control) added as
/// special tokens and those of type 4 (user-defined) as plain added tokens, so both stay
/// whole in text; the split rule of `tokenizer.ggml.pre`.
///
/// Pre-tokenizers: `smollm` is SmolLM's own tokenizer.json (each digit alone, then GPT-2's
/// byte-level split); `gpt2` and `default` are GPT-2's. Others are an error naming them.
pub fn tokenizer(g: &GgufFile) -> Result<Tokenizer> {
    let p = g.path.display();
    let model = g.get_str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        bail!(
            "{p}: tokenizer.ggml.model {model:?} is not supported (only \"gpt2\", byte-level BPE)"
        );
    }
    let tokens = g.get_strings("tokenizer.ggml.tokens")?;
    let merges = g.get_strings("tokenizer.ggml.merges")?;
    let types = g.get_ints("tokenizer.ggml.token_type")?;
    if types.len() != tokens.len() {
        bail!(
            "{p}: tokenizer.ggml.token_type has {} entries, tokenizer.ggml.tokens {}",
            types.len(),
            tokens.len()
        );
    }
    let mut vocab = Vocab::default();
    for (i, t) in tokens.iter().enumerate() {
        vocab.entry(t.to_string()).or_insert(i as u32);
    }
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| {
                    msg(format!(
                        "{p}: tokenizer.ggml.merges entry {m:?} is not \"a b\""
                    ))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| msg(format!("{p}: building the BPE model: {e}")))?;
    let pre = if g.content.metadata.contains_key("tokenizer.ggml.pre") {
        g.get_str("tokenizer.ggml.pre")?
    } else {
        "default"
    };
    let byte_level = ByteLevel::new(false, true, true);
    let pre_tok: PreTokenizerWrapper = match pre {
        "smollm" => Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into(),
        "gpt2" | "default" => byte_level.into(),
        other => bail!(
            "{p}: tokenizer.ggml.pre {other:?} is not supported (supported: smollm, gpt2, default)"
        ),
    };
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(pre_tok))
        .with_decoder(Some(byte_level));
    let added = |kind: i64, special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == kind)
            .map(|(s, _)| AddedToken::from(s.to_string(), special).normalized(false))
            .collect()
    };
    tok.add_special_tokens(added(3, true))
        .map_err(|e| msg(format!("{p}: adding control tokens: {e}")))?;
    tok.add_tokens(added(4, false))
        .map_err(|e| msg(format!("{p}: adding user-defined tokens: {e}")))?;
    Ok(tok)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The un-permutation against its definition, row by row: with rows numbered, Hugging
    /// Face row `h·d + j·d/2 + i` must be GGUF row `h·d + 2i + j`.
    #[test]
    fn unpermute_follows_the_row_rule() {
        let (heads, d, cols) = (3usize, 8usize, 2usize);
        let data: Vec<f32> = (0..heads * d * cols).map(|x| (x / cols) as f32).collect();
        let t = Tensor::from_vec(data, (heads * d, cols), &Device::Cpu).unwrap();
        let u = unpermute_rows(&t, heads).unwrap().to_vec2::<f32>().unwrap();
        for h in 0..heads {
            for j in 0..2 {
                for i in 0..d / 2 {
                    let hf = h * d + j * d / 2 + i;
                    let gg = h * d + 2 * i + j;
                    assert_eq!(u[hf], vec![gg as f32; cols], "head {h} i {i} j {j}");
                }
            }
        }
        // biases (one dim) too, and a head count that does not divide the rows is an error
        let b = Tensor::arange(0f32, (heads * d) as f32, &Device::Cpu).unwrap();
        assert_eq!(
            unpermute_rows(&b, heads).unwrap().to_vec1::<f32>().unwrap()[1],
            2.0
        );
        assert!(unpermute_rows(&t, 5).is_err());
    }

    #[test]
    fn gguf_names_cover_every_tensor_of_a_qwen3() {
        let mut cfg = crate::Config::preset("Qwen/Qwen3-0.6B").unwrap();
        cfg.tie_word_embeddings = false;
        for (hf, _) in expected_tensors(&cfg) {
            assert!(GgufFile::gguf_name(&hf).is_some(), "{hf}");
        }
        assert_eq!(
            GgufFile::gguf_name("model.layers.7.self_attn.k_norm.weight").unwrap(),
            "blk.7.attn_k_norm.weight"
        );
        assert_eq!(GgufFile::gguf_name("model.layers.7.mlp.nope.weight"), None);
    }
}
