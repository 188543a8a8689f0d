#!/usr/bin/env python3
"""Parity fixtures for mxattn's UMT5 text encoder (Wan2.2), made with transformers'
UMT5EncoderModel and T5 tokenizer and diffusers' Wan prompt handling.

Writes, under crates/wan/tests/fixtures/wan/umt5/ (run from the repository root):

  text_encoder/  a tiny random UMT5EncoderModel (d_model 32, d_ff 64, d_kv 6, 4 heads, 2 layers,
                 gated-gelu), written by save_pretrained with float16 weights
  tokenizer/     tokenizer.json (+ tokenizer_config.json) of a T5 tokenizer built by transformers
                 from a small SentencePiece unigram model trained here (see below)
  expected.safetensors
      input_ids, attention_mask   [2, 16] int64: the tokenizer on the two cleaned prompts with
                                  padding="max_length", max_length=16, truncation, </s> appended
      last_hidden_state           [2, 16, 32] f32: the encoder on those ids with that mask
      prompt_embeds               [2, 16, 32] f32: diffusers' WanPipeline._get_t5_prompt_embeds
                                  with max_sequence_length=16 (trimmed to each prompt's length,
                                  zero-padded)
      neg_input_ids, neg_attention_mask [1, 512] int64: the cleaned Wan negative prompt, padded
                                  to the default 512
      relative_position, relative_bucket [1201] int64: HF's _relative_position_bucket for
                                  distances -600..600 (32 buckets, max distance 128, bidirectional)
  expected.json  versions, the raw and cleaned prompts (diffusers' prompt_clean, which runs
                 ftfy and html.unescape), and cleaning cases for the Rust prompt cleaner

The tokenizer: no real T5/UMT5 vocabulary ships in a package we can install, so a 181-piece
SentencePiece unigram model is trained on a few sentences (pad 0, eos 1, unk 2, nmt_nfkc
normalization, as T5's spiece.model) and loaded with transformers' T5Tokenizer, which converts
it exactly as google/umt5-xxl's tokenizer.json was made: Precompiled normalizer, WhitespaceSplit
+ Metaspace pre-tokenizer, Unigram model, `$A </s>` template, 100 <extra_id_*> tokens.

All parameters are random (norm weights around 1, relative biases of std 1 so they matter).
The reference runs in float32 on the float16-rounded weights.

Set-up:  python3 -m venv .venv-py && .venv-py/bin/pip install torch transformers diffusers \
             safetensors numpy sentencepiece protobuf ftfy
Run:     .venv-py/bin/python scripts/gen_wan_umt5_fixtures.py
"""

import io
import json
import os
import shutil

import diffusers
import ftfy
import sentencepiece as spm
import tokenizers
import torch
import transformers
from diffusers.pipelines.wan.pipeline_wan import prompt_clean
from safetensors.torch import save_file
from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

from gen_wan_clean_cases import cases as clean_cases  # noqa: E402

OUT = os.path.join("crates", "wan", "tests", "fixtures", "wan", "umt5")
MAX_LEN = 16

# Wan2.2 wan/configs/shared_config.py, sample_neg_prompt
NEG = (
    "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，"
    "JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，"
    "手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走"
)

CORPUS = [
    "A cat walks on the grass, realistic style, warm light.",
    "Two anthropomorphic cats in comfy boxing gear and bright gloves fight intensely on a stage.",
    "A panoramic view of a mountain lake at sunrise, mist over the water, birds flying.",
    NEG,
    "The quick brown fox jumps over the lazy dog. Numbers 0123456789 and symbols: (a) [b] {c}!?",
]

PROMPTS = [
    # long: truncated to 15 tokens + </s>
    "Two  anthropomorphic cats in comfy boxing gear &amp; bright gloves fight\tintensely on a stage.",
    # short: padded
    "A cat, 色调艳丽！",
]

def make_tokenizer(tmp: str) -> T5Tokenizer:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20),
        model_writer=model,
        vocab_size=300,
        hard_vocab_limit=False,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=1.0,
        normalization_rule_name="nmt_nfkc",
        num_threads=1,
        minloglevel=2,
    )
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, "spiece.model"), "wb") as f:
        f.write(model.getvalue())
    return T5Tokenizer.from_pretrained(tmp)


def main() -> None:
    torch.manual_seed(0)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    tmp = os.path.join(OUT, "_spm")
    tok = make_tokenizer(tmp)
    shutil.rmtree(tmp)
    tok_dir = os.path.join(OUT, "tokenizer")
    tok.save_pretrained(tok_dir)
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)  # what the pipeline loads

    cfg = UMT5Config(
        vocab_size=len(tok),
        d_model=32,
        d_kv=6,  # inner dim 24 != d_model, so a port that confuses them fails
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
        layer_norm_epsilon=1e-6,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    model = UMT5EncoderModel(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("relative_attention_bias.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.dim() == 2 and "shared" not in name else 1
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
    te_dir = os.path.join(OUT, "text_encoder")
    model.to(torch.float16).save_pretrained(te_dir)
    model = UMT5EncoderModel.from_pretrained(te_dir, dtype=torch.float32).eval()
    assert all(p.dtype == torch.float32 for p in model.parameters())

    cleaned = [prompt_clean(p) for p in PROMPTS]
    enc = tok(
        cleaned,
        padding="max_length",
        max_length=MAX_LEN,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    ids, mask = enc.input_ids, enc.attention_mask
    assert mask[0].sum() == MAX_LEN and mask[1].sum() < MAX_LEN - 2, mask
    with torch.no_grad():
        hidden = model(ids, mask).last_hidden_state.float()

    # diffusers' WanPipeline._get_t5_prompt_embeds, run on the real pipeline class
    pipe = diffusers.WanPipeline.__new__(diffusers.WanPipeline)
    object.__setattr__(pipe, "tokenizer", tok)
    object.__setattr__(pipe, "text_encoder", model)
    with torch.no_grad():
        embeds = diffusers.WanPipeline._get_t5_prompt_embeds(
            pipe, PROMPTS, max_sequence_length=MAX_LEN, device=torch.device("cpu"), dtype=torch.float32
        )

    neg = tok(
        [prompt_clean(NEG)],
        padding="max_length",
        max_length=512,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )

    attn = model.encoder.block[0].layer[0].SelfAttention
    rel = torch.arange(-600, 601, dtype=torch.long)
    buckets = attn._relative_position_bucket(rel)

    save_file(
        {
            "input_ids": ids.contiguous(),
            "attention_mask": mask.contiguous(),
            "last_hidden_state": hidden.contiguous(),
            "prompt_embeds": embeds.float().contiguous(),
            "neg_input_ids": neg.input_ids.contiguous(),
            "neg_attention_mask": neg.attention_mask.contiguous(),
            "relative_position": rel.contiguous(),
            "relative_bucket": buckets.contiguous(),
        },
        os.path.join(OUT, "expected.safetensors"),
    )
    meta = {
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "diffusers": diffusers.__version__,
            "tokenizers": tokenizers.__version__,
            "sentencepiece": spm.__version__,
            "ftfy": ftfy.__version__,
        },
        "max_sequence_length": MAX_LEN,
        "prompts": PROMPTS,
        "cleaned": cleaned,
        "negative_prompt": NEG,
        "negative_cleaned": prompt_clean(NEG),
        "clean_cases": clean_cases(NEG),
        "seq_lens": mask.sum(1).tolist(),
        "mean_abs_hidden": float(hidden.abs().mean()),
    }
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
    print(json.dumps(meta, ensure_ascii=False, indent=1))
    print("ids", ids.tolist())


if __name__ == "__main__":
    main()
