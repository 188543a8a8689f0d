#!/usr/bin/env python3
"""Parity fixtures for SmolLM2-135M-Instruct (GGUF), made with Hugging Face transformers.

transformers reads the same GGUF (`from_pretrained(dir, gguf_file=...)`), dequantizes every
weight to float32, undoes llama.cpp's q/k row permutation and builds its own tokenizer from
the GGUF metadata: an implementation independent of ours (candle's GGUF reader, our
permutation, our tokenizer).

Writes crates/llm/tests/fixtures/smollm2/expected.json (run from the repository root):

  versions          torch, transformers, gguf; the GGUF's sha256
  tokenizer_cases   [{text, ids}]: texts (digits, punctuation, whitespace runs, non-ASCII,
                    special tokens) and the ids of transformers' GGUF tokenizer
  chat_cases        [{messages, text, ids}]: apply_chat_template(add_generation_prompt=True)
  prompts           per prompt: name, ids, and at chosen positions
                      top: the 16 largest logits (ids, values), lse: logsumexp over the
                      vocab, slice: logits[SLICE]; then `continuation`: 32 greedy tokens (no
                      stop token) and `margins`: the top-1/top-2 logit gap at each greedy step
                      (a near-tie would make any tolerance flip a token)

Everything is float32 with eager attention on the CPU (a 135M model; a few minutes on 2 cores).

Set-up:  python3 -m venv .venv-py && .venv-py/bin/pip install torch transformers gguf accelerate numpy
         scripts/fetch_smollm2.sh
Run:     .venv-py/bin/python scripts/gen_smollm2_fixtures.py --gguf "$(scripts/fetch_smollm2.sh)"
"""

import argparse
import hashlib
import json
import os

import torch
import transformers

NEW_TOKENS = 32
TOP = 16
SLICE = (1000, 1032)
# characters of the eval text that make the long prompt (≥ 600 tokens)
LONG_CHARS = 3200

TOKENIZER_TEXTS = [
    "Hello, world!",
    "In 2024, 3 quick brown foxes jumped over 1,234 lazy dogs; 0.5% of 99 is 0.495.",
    "Isn't it odd?  Two  spaces,\ttabs,\n\nnew lines\r\nand trailing   ",
    "café naïve Zürich — “quotes” 東京 😀",
    "def f(x):\n    return x**2  # square\n",
    "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name 3 colours."},
        {"role": "assistant", "content": "Red, green, blue."},
        {"role": "user", "content": "And 2 more?"},
    ],
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch_smollm2.sh)")
    ap.add_argument("--text", default="evals/data/pride_and_prejudice_ch1-12.txt")
    ap.add_argument("--out", default="crates/llm/tests/fixtures/smollm2/expected.json")
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    d, f = os.path.split(os.path.abspath(a.gguf))
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
    kw = {}
    try:  # newer transformers keep GGUF blocks packed unless told; we want plain f32 weights
        from transformers import GgufConfig

        kw["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=f, dtype=torch.float32, attn_implementation="eager", **kw
    ).eval()
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and type(p) is torch.nn.Parameter, name

    def ids_of(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    out = {
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf_sha256": sha256(a.gguf),
        },
        "top": TOP,
        "slice": list(SLICE),
        "tokenizer_cases": [{"text": t, "ids": ids_of(t)} for t in TOKENIZER_TEXTS],
        "chat_cases": [],
        "prompts": [],
    }
    for msgs in CHATS:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out["chat_cases"].append({"messages": msgs, "text": text, "ids": ids_of(text)})

    with open(a.text, encoding="utf-8") as fh:
        long_text = fh.read()[:LONG_CHARS]
    prompts = [
        ("chat", out["chat_cases"][0]["ids"]),
        ("digits", ids_of(TOKENIZER_TEXTS[1])),
        ("austen", ids_of(long_text)),
    ]
    assert len(prompts[2][1]) >= 600, len(prompts[2][1])
    for name, ids in prompts:
        x = torch.tensor([ids])
        logits = model(x).logits[0].float()
        n = len(ids)
        positions = sorted({0, 1, n // 3, n // 2, n - 2, n - 1})
        rows = []
        for p in positions:
            row = logits[p]
            v, i = row.topk(TOP)
            rows.append(
                {
                    "pos": p,
                    "top_ids": i.tolist(),
                    "top_values": v.tolist(),
                    "lse": torch.logsumexp(row.double(), 0).item(),
                    "slice": row[SLICE[0] : SLICE[1]].tolist(),
                }
            )
        # greedy, no stop token, through the KV cache
        cont, margins = [], []
        past = None
        inp = x
        for _ in range(NEW_TOKENS):
            o = model(inp, past_key_values=past, use_cache=True)
            past = o.past_key_values
            last = o.logits[0, -1].float()
            v, i = last.topk(2)
            cont.append(int(i[0]))
            margins.append(float(v[0] - v[1]))
            inp = i[:1].view(1, 1)
        out["prompts"].append(
            {
                "name": name,
                "ids": ids,
                "rows": rows,
                "continuation": cont,
                "margins": margins,
                "continuation_text": tok.decode(cont),
            }
        )
        print(f"{name}: {n} tokens, continuation {tok.decode(cont)!r}, min margin {min(margins):.3f}")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as fh:
        json.dump(out, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
