//! Chat templates and a streaming detokenizer: Qwen3's template (ChatML with the thinking
//! switch) written out below, and [`ChatTemplate`], a model's own Jinja template (a GGUF's
//! `tokenizer.chat_template`) rendered with minijinja, as transformers renders it with
//! Jinja2.
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

/// A Jinja chat template as a tokenizer ships it (transformers' `apply_chat_template`).
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts the template may use.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = minijinja::Environment::new();
        // transformers' Jinja2 environment: trim_blocks and lstrip_blocks on
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function(
            "raise_exception",
            |m: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    m,
                ))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| candle_core::Error::Msg(format!("chat template: {e}")))?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Renders `messages` (`add_generation_prompt`: end with the assistant's opening).
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let msgs: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| {
                minijinja::Value::from_iter([
                    ("role", minijinja::Value::from(m.role.name())),
                    ("content", minijinja::Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| candle_core::Error::Msg(format!("chat template: {e}")))?;
        tmpl.render(minijinja::context! {
            messages => msgs,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        })
        .map_err(|e| candle_core::Error::Msg(format!("chat template: {e}")))
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

/// Where generation stops: the config's eos ids, and the ChatML turn end and the text end
/// when the vocabulary has them (a chat model's eos is often only one of those).
pub fn stop_ids(t: &Tokenizer, eos_ids: &[u32]) -> Vec<u32> {
    let mut v = eos_ids.to_vec();
    for s in ["<|im_end|>", "<|endoftext|>"] {
        if let Some(id) = t.token_to_id(s) {
            if !v.contains(&id) {
                v.push(id);
            }
        }
    }
    v
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
