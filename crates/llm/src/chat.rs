//! The Qwen3 chat template (ChatML with the thinking switch), its special tokens, and a
//! streaming detokenizer.
//!
//! The template is the one in Qwen3's `tokenizer_config.json`, restricted to system, user
//! and assistant turns (no tools):
//!
//! ```text
//! <|im_start|>system\n{system}<|im_end|>\n          (only if the first message is a system one)
//! <|im_start|>user\n{user}<|im_end|>\n
//! <|im_start|>assistant\n{answer}<|im_end|>\n         (earlier answers, reasoning stripped)
//! <|im_start|>assistant\n                            (the generation prompt)
//! <think>\n\n</think>\n\n                            (only with thinking off)
//! ```
//!
//! `tests/qwen3_tokenizer.rs` compares it with transformers' rendering of the real template.

use candle_core::{bail, Result};
use tokenizers::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
        }
    }
}

/// Renders `messages` with the generation prompt. With `thinking` off the assistant turn
/// starts with an empty `<think>` block, as `enable_thinking=False` does.
pub fn chat_prompt(messages: &[Message], thinking: bool) -> Result<String> {
    match messages.last() {
        Some(m) if m.role == Role::User => {}
        _ => bail!("chat prompt: the last message must be a user turn"),
    }
    let mut s = String::new();
    for (i, m) in messages.iter().enumerate() {
        match m.role {
            Role::System if i != 0 => bail!("chat prompt: a system message must come first"),
            Role::Assistant => {
                // Earlier answers are shown without their reasoning, as the template does.
                let content = match m.content.rsplit_once("</think>") {
                    Some((_, after)) => after.trim_start_matches('\n'),
                    None => m.content.as_str(),
                };
                s.push_str(&format!("<|im_start|>assistant\n{content}<|im_end|>\n"));
            }
            r => s.push_str(&format!(
                "<|im_start|>{}\n{}<|im_end|>\n",
                r.name(),
                m.content
            )),
        }
    }
    s.push_str("<|im_start|>assistant\n");
    if !thinking {
        s.push_str("<think>\n\n</think>\n\n");
    }
    Ok(s)
}

/// Ids of the chat-control tokens, read from the tokenizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialTokens {
    pub endoftext: u32,
    pub im_start: u32,
    pub im_end: u32,
    pub think: u32,
    pub think_end: u32,
}

impl SpecialTokens {
    pub fn from_tokenizer(t: &Tokenizer) -> Result<Self> {
        let id = |s: &str| {
            t.token_to_id(s).ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "tokenizer has no {s} token; is it a Qwen3 tokenizer?"
                ))
            })
        };
        Ok(Self {
            endoftext: id("<|endoftext|>")?,
            im_start: id("<|im_start|>")?,
            im_end: id("<|im_end|>")?,
            think: id("<think>")?,
            think_end: id("</think>")?,
        })
    }

    /// Generation stops on these (generation_config `eos_token_id`).
    pub fn stop_ids(&self) -> Vec<u32> {
        vec![self.im_end, self.endoftext]
    }
}

/// Loads a `tokenizer.json`; errors name the file.
pub fn load_tokenizer(path: impl AsRef<std::path::Path>) -> Result<Tokenizer> {
    let p = path.as_ref();
    Tokenizer::from_file(p).map_err(|e| candle_core::Error::Msg(format!("{}: {e}", p.display())))
}

/// Text ids (`add_special_tokens` off: the template already has every control token).
pub fn encode(t: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    Ok(t.encode(text, false)
        .map_err(|e| candle_core::Error::Msg(format!("tokenizer: {e}")))?
        .get_ids()
        .to_vec())
}

pub fn decode(t: &Tokenizer, ids: &[u32]) -> Result<String> {
    t.decode(ids, true)
        .map_err(|e| candle_core::Error::Msg(format!("tokenizer: {e}")))
}

/// Turns a stream of ids into text pieces. A byte-level BPE token can end inside a UTF-8
/// character, so text is released only once the decoded tail is whole (candle-examples'
/// `TokenOutputStream` does the same).
pub struct TextStream<'a> {
    tok: &'a Tokenizer,
    ids: Vec<u32>,
    prev: usize,
    cur: usize,
}

impl<'a> TextStream<'a> {
    pub fn new(tok: &'a Tokenizer) -> Self {
        Self {
            tok,
            ids: Vec::new(),
            prev: 0,
            cur: 0,
        }
    }

    /// The new text after `id`, if any is complete.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        let before = decode(self.tok, &self.ids[self.prev..self.cur])?;
        self.ids.push(id);
        let now = decode(self.tok, &self.ids[self.prev..])?;
        if now.len() > before.len() && now.starts_with(&before) && !now.ends_with('\u{FFFD}') {
            let piece = now[before.len()..].to_string();
            self.prev = self.cur;
            self.cur = self.ids.len();
            Ok(Some(piece))
        } else {
            Ok(None)
        }
    }

    /// Whatever is left undecoded at the end.
    pub fn finish(&mut self) -> Result<Option<String>> {
        let before = decode(self.tok, &self.ids[self.prev..self.cur])?;
        let now = decode(self.tok, &self.ids[self.prev..])?;
        self.prev = self.ids.len();
        self.cur = self.ids.len();
        let rest = now.strip_prefix(&before).unwrap_or(&now);
        Ok((!rest.is_empty()).then(|| rest.to_string()))
    }
}
