#!/usr/bin/env python3
"""The prompt-cleaning cases of the Wan UMT5 fixtures: inputs and what diffusers'
`prompt_clean` (ftfy.fix_text, html.unescape twice, whitespace collapsed) makes of them.

Writes the "clean_cases" entry of crates/wan/tests/fixtures/wan/umt5/expected.json (run from
the repository root); gen_wan_umt5_fixtures.py writes the whole file and takes the cases from
here. Needs only ftfy (the fixtures were made with 6.3.1); diffusers' own prompt_clean is used
when diffusers is installed, else the same three steps written out below.

Set-up:  python3 -m venv .venv-py && .venv-py/bin/pip install ftfy==6.3.1
Run:     .venv-py/bin/python scripts/gen_wan_clean_cases.py
"""

import html
import json
import os
import re

import ftfy

# whitespace runs, html entities (numeric, named from the whole HTML5 table, ftfy's uppercase
# spellings, legacy ones without ';', a line with '<' where ftfy leaves entities alone),
# curly quotes, full-width forms, ligatures, decomposed accents (NFC), the Wan negative
# prompt (appended by gen_wan_umt5_fixtures.py, which knows it)
CLEAN_CASES = [
    "  a   b\t\nc  ",
    "Tom &amp; Jerry &lt;3 &quot;x&quot; &#39;y&#39; &#x41;&#66; &amp;amp;",
    "\u201cquoted\u201d and \u2018single\u2019",
    "ｆｕｌｌ　ｗｉｄｔｈ！（１２３）",
    "\ufb01ne \ufb02ow",
    "Cafe\u0301 noe\u0308l, \u212b",
    "caf&eacute; &copy; 2024 &hellip; &rarr; &NotEqualTilde; &frac12;",
    "a &lt;b&gt; <tag> &amp; &eacute;",
    "&amp;eacute; &amp;amp;hellip;",
    "x &ampy &eacute y",
    "&EACUTE; &AMP; &Eacute; &COPY;",
    "&#128; &#x80; &#0; &#xD800; &#1114112;",
    "fi\u0301 \ufb01\u0301",
]

OUT = os.path.join("crates", "wan", "tests", "fixtures", "wan", "umt5", "expected.json")

try:
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean
except ImportError:  # the same steps as diffusers' basic_clean + whitespace_clean

    def prompt_clean(text: str) -> str:
        text = ftfy.fix_text(text)
        text = html.unescape(html.unescape(text))
        text = text.strip()
        return re.sub(r"\s+", " ", text).strip()


def cases(neg: str):
    return [[c, prompt_clean(c)] for c in CLEAN_CASES + [neg]]


def main() -> None:
    with open(OUT, encoding="utf-8") as f:
        meta = json.load(f)
    neg = meta["clean_cases"][-1][0]  # the negative prompt, always last
    meta["clean_cases"] = cases(neg)
    meta["versions"]["ftfy"] = ftfy.__version__
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
    for raw, clean in meta["clean_cases"]:
        print(repr(raw), "->", repr(clean))


if __name__ == "__main__":
    main()
