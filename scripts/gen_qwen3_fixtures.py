#!/usr/bin/env python3
"""Parity fixtures for mxattn's Qwen3 port, made with Hugging Face transformers.

Writes, under crates/llm/tests/fixtures/ (run from the repository root):

  qwen3/tiny/        a tiny random Qwen3 (untied embeddings), save_pretrained: config.json
                     + model.safetensors
  qwen3/tiny_tied/   the same shape with tied embeddings, saved in shards with
                     model.safetensors.index.json
  qwen3/expected.safetensors   per model: `<name>.prompt` (i64 token ids),
                     `<name>.prompt_logits` [L, V] f32 (one forward over the prompt),
                     `<name>.continuation` (16 greedy tokens from generate()),
                     `<name>.full_logits` [L+16, V] f32 (teacher-forced over prompt+continuation)
  qwen3/expected.json          versions, shapes and the smallest top-1/top-2 logit gap of
                     every greedy step (so a test tolerance cannot flip a token)
  qwen3_tokenizer/hf_cases.json  (with --tokenizer-dir) token ids of multilingual texts and
                     rendered chat templates, from the Qwen3 tokenizer and its chat template

Everything is float32 with eager attention. The tiny vocab (512) cannot go with the real
tokenizer, so prompts are token ids.

Set-up:  python3 -m venv .venv-py && .venv-py/bin/pip install torch transformers safetensors numpy
Run:     .venv-py/bin/python scripts/gen_qwen3_fixtures.py \
             --tokenizer-dir crates/llm/tests/fixtures/qwen3_tokenizer
"""

import argparse
import json
import os
import shutil

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

PROMPT_LEN = 12
NEW_TOKENS = 16
VOCAB = 512


def build(tied: bool, seed: int) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        attention_bias=False,
        # larger than the default 0.02 so logits are spread and greedy steps are decisive
        initializer_range=0.25,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    cfg._attn_implementation = "eager"
    model = Qwen3ForCausalLM(cfg).eval()
    # RMSNorm weights start at 1; perturb them so a missed q_norm/k_norm/layer norm shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    return model


def run(model, prompt):
    ids = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        prompt_logits = model(ids).logits[0].float()
        out = model.generate(
            ids,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        cont = out[0, len(prompt):]
        full_logits = model(out).logits[0].float()
    assert len(cont) == NEW_TOKENS
    # The greedy tokens must be the argmax of the teacher-forced logits, with a margin.
    gaps = []
    for i in range(NEW_TOKENS):
        row = full_logits[len(prompt) - 1 + i]
        top2 = torch.topk(row, 2).values
        assert int(row.argmax()) == int(cont[i])
        gaps.append(float(top2[0] - top2[1]))
    return prompt_logits, cont, full_logits, gaps


def tokenizer_cases(tok_dir, out_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    texts = [
        "Hello, Qwen3! <think>",
        "The quick brown fox jumps over the lazy dog.",
        "你好，世界！今天天气很好。",
        "日本語のテキストも正しく扱えますか？",
        "한국어 문장도 테스트합니다.",
        "Привет, как дела? Всё хорошо.",
        "مرحبا بالعالم",
        "नमस्ते दुनिया",
        "Grüße aus Köln: Straße, Äpfel, naïve café, ½ × π ≈ 1.57",
        "emoji 🦀🚀 and tabs\tand\nnewlines  with   spaces",
        "fn main() { println!(\"{}\", 1 + 2); }",
    ]
    enc = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False)
        assert tok.decode(ids) == t, t
        enc.append({"text": t, "ids": ids})
    chats = [
        ([{"role": "user", "content": "What is 2+2?"}], True),
        ([{"role": "user", "content": "What is 2+2?"}], False),
        (
            [
                {"role": "system", "content": "You are a terse assistant."},
                {"role": "user", "content": "Übersetze: 猫"},
            ],
            False,
        ),
        (
            [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "<think>\nGreeting.\n</think>\n\nHello!"},
                {"role": "user", "content": "Name a prime."},
            ],
            True,
        ),
    ]
    chat = []
    for msgs, think in chats:
        text = tok.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=True, enable_thinking=think
        )
        ids = tok.encode(text, add_special_tokens=False)
        chat.append({"messages": msgs, "enable_thinking": think, "text": text, "ids": ids})
    special = {
        t: tok.convert_tokens_to_ids(t)
        for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(
            {
                "transformers": transformers.__version__,
                "encode": enc,
                "chat": chat,
                "special": special,
            },
            f,
            ensure_ascii=False,
            indent=1,
        )
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="crates/llm/tests/fixtures/qwen3")
    ap.add_argument("--tokenizer-dir", help="directory with tokenizer.json and tokenizer_config.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    tensors = {}
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "models": {}}
    rng = np.random.default_rng(7)
    prompt = [int(x) for x in rng.integers(0, VOCAB, PROMPT_LEN)]
    for name, tied, seed, shard in [("tiny", False, 1, None), ("tiny_tied", True, 2, "150KB")]:
        model = build(tied, seed)
        d = os.path.join(a.out, name)
        shutil.rmtree(d, ignore_errors=True)
        kw = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(d, **kw)
        for extra in ["generation_config.json"]:
            p = os.path.join(d, extra)
            if os.path.exists(p):
                os.remove(p)
        pl, cont, fl, gaps = run(model, prompt)
        tensors[f"{name}.prompt"] = torch.tensor(prompt, dtype=torch.long)
        tensors[f"{name}.prompt_logits"] = pl.contiguous()
        tensors[f"{name}.continuation"] = cont.to(torch.long).contiguous()
        tensors[f"{name}.full_logits"] = fl.contiguous()
        meta["models"][name] = {
            "tied": tied,
            "files": sorted(os.listdir(d)),
            "prompt": prompt,
            "continuation": [int(x) for x in cont],
            "min_greedy_gap": min(gaps),
            "logit_std": float(pl.std()),
        }
        print(name, "min greedy gap", min(gaps), "logit std", float(pl.std()), sorted(os.listdir(d)))
    save_file(tensors, os.path.join(a.out, "expected.safetensors"))
    with open(os.path.join(a.out, "expected.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    if a.tokenizer_dir:
        tokenizer_cases(a.tokenizer_dir, os.path.join(a.tokenizer_dir, "hf_cases.json"))


if __name__ == "__main__":
    main()
