//! Prompt cleaning as diffusers' Wan pipelines (`prompt_clean`) and Wan2.2's tokenizer
//! wrapper (`clean='whitespace'`) do it: `ftfy.fix_text`, `html.unescape` twice, then every run
//! of whitespace becomes one space and the ends are stripped.
//!
//! Of ftfy's default fixes this ports the ones that change clean UTF-8 text: HTML entities
//! (while a line has no `<`, repeated until nothing changes), Latin ligatures, full- and
//! half-width forms (the Wan negative prompt's `，` becomes `,`), curly quotes, line breaks,
//! control characters, and NFC normalization. Not ported: mojibake repair (`fix_encoding`,
//! `fix_c1_controls`) and terminal escapes; mis-decoded text may tokenize differently from
//! diffusers. Entities come from the whole HTML5 table and NFC from the Unicode tables,
//! through well-kept crates (`htmlize`, `unicode-normalization`), not copies of them.

use unicode_normalization::UnicodeNormalization;

/// ftfy's `fix_character_width` table: (first, last, replacement of first), consecutive.
const WIDTH_RUNS: [(u32, u32, u32); 73] = [
    (0x3000, 0x3000, 0x20),
    (0xff01, 0xff5e, 0x21),
    (0xff5f, 0xff60, 0x2985),
    (0xff61, 0xff61, 0x3002),
    (0xff62, 0xff63, 0x300c),
    (0xff64, 0xff64, 0x3001),
    (0xff65, 0xff65, 0x30fb),
    (0xff66, 0xff66, 0x30f2),
    (0xff67, 0xff67, 0x30a1),
    (0xff68, 0xff68, 0x30a3),
    (0xff69, 0xff69, 0x30a5),
    (0xff6a, 0xff6a, 0x30a7),
    (0xff6b, 0xff6b, 0x30a9),
    (0xff6c, 0xff6c, 0x30e3),
    (0xff6d, 0xff6d, 0x30e5),
    (0xff6e, 0xff6e, 0x30e7),
    (0xff6f, 0xff6f, 0x30c3),
    (0xff70, 0xff70, 0x30fc),
    (0xff71, 0xff71, 0x30a2),
    (0xff72, 0xff72, 0x30a4),
    (0xff73, 0xff73, 0x30a6),
    (0xff74, 0xff74, 0x30a8),
    (0xff75, 0xff76, 0x30aa),
    (0xff77, 0xff77, 0x30ad),
    (0xff78, 0xff78, 0x30af),
    (0xff79, 0xff79, 0x30b1),
    (0xff7a, 0xff7a, 0x30b3),
    (0xff7b, 0xff7b, 0x30b5),
    (0xff7c, 0xff7c, 0x30b7),
    (0xff7d, 0xff7d, 0x30b9),
    (0xff7e, 0xff7e, 0x30bb),
    (0xff7f, 0xff7f, 0x30bd),
    (0xff80, 0xff80, 0x30bf),
    (0xff81, 0xff81, 0x30c1),
    (0xff82, 0xff82, 0x30c4),
    (0xff83, 0xff83, 0x30c6),
    (0xff84, 0xff84, 0x30c8),
    (0xff85, 0xff8a, 0x30ca),
    (0xff8b, 0xff8b, 0x30d2),
    (0xff8c, 0xff8c, 0x30d5),
    (0xff8d, 0xff8d, 0x30d8),
    (0xff8e, 0xff8e, 0x30db),
    (0xff8f, 0xff93, 0x30de),
    (0xff94, 0xff94, 0x30e4),
    (0xff95, 0xff95, 0x30e6),
    (0xff96, 0xff9b, 0x30e8),
    (0xff9c, 0xff9c, 0x30ef),
    (0xff9d, 0xff9d, 0x30f3),
    (0xff9e, 0xff9f, 0x3099),
    (0xffa0, 0xffa0, 0x1160),
    (0xffa1, 0xffa2, 0x1100),
    (0xffa3, 0xffa3, 0x11aa),
    (0xffa4, 0xffa4, 0x1102),
    (0xffa5, 0xffa6, 0x11ac),
    (0xffa7, 0xffa9, 0x1103),
    (0xffaa, 0xffaf, 0x11b0),
    (0xffb0, 0xffb0, 0x111a),
    (0xffb1, 0xffb3, 0x1106),
    (0xffb4, 0xffb4, 0x1121),
    (0xffb5, 0xffbe, 0x1109),
    (0xffc2, 0xffc7, 0x1161),
    (0xffca, 0xffcf, 0x1167),
    (0xffd2, 0xffd7, 0x116d),
    (0xffda, 0xffdc, 0x1173),
    (0xffe0, 0xffe1, 0xa2),
    (0xffe2, 0xffe2, 0xac),
    (0xffe4, 0xffe4, 0xa6),
    (0xffe5, 0xffe5, 0xa5),
    (0xffe6, 0xffe6, 0x20a9),
    (0xffe8, 0xffe8, 0x2502),
    (0xffe9, 0xffec, 0x2190),
    (0xffed, 0xffed, 0x25a0),
    (0xffee, 0xffee, 0x25cb),
];

/// ftfy's `LIGATURES`.
const LIGATURES: [(char, &str); 22] = [
    ('\u{132}', "IJ"),
    ('\u{133}', "ij"),
    ('\u{149}', "\u{2bc}n"),
    ('\u{1f1}', "DZ"),
    ('\u{1f2}', "Dz"),
    ('\u{1f3}', "dz"),
    ('\u{1c4}', "D\u{17d}"),
    ('\u{1c5}', "D\u{17e}"),
    ('\u{1c6}', "d\u{17e}"),
    ('\u{1c7}', "LJ"),
    ('\u{1c8}', "Lj"),
    ('\u{1c9}', "lj"),
    ('\u{1ca}', "NJ"),
    ('\u{1cb}', "Nj"),
    ('\u{1cc}', "nj"),
    ('\u{fb00}', "ff"),
    ('\u{fb01}', "fi"),
    ('\u{fb02}', "fl"),
    ('\u{fb03}', "ffi"),
    ('\u{fb04}', "ffl"),
    ('\u{fb05}', "\u{17f}t"),
    ('\u{fb06}', "st"),
];

fn push_fixed_char(out: &mut String, c: char) {
    let u = c as u32;
    // ftfy's remove_control_chars
    if matches!(u, 0..=8 | 0xb | 0xe..=0x1f | 0x7f | 0x206a..=0x206f | 0xfeff | 0xfff9..=0xfffc) {
        return;
    }
    if let Some((_, s)) = LIGATURES.iter().find(|(l, _)| *l == c) {
        out.push_str(s);
        return;
    }
    if u == 0xffe3 {
        out.push_str(" \u{304}");
        return;
    }
    if let Some(&(a, _, to)) = WIDTH_RUNS.iter().find(|(a, b, _)| (*a..=*b).contains(&u)) {
        out.push(char::from_u32(to + (u - a)).unwrap_or(c));
        return;
    }
    out.push(match u {
        0x2bc | 0x2018..=0x201b => '\'',
        0x201c..=0x201f => '"',
        // fix_line_breaks (after "\r\n" was folded)
        0xd | 0x2028 | 0x2029 | 0x85 => '\n',
        _ => c,
    });
}

/// One pass of the ported ftfy fixers over one line.
fn fix_pass(s: &str, unescape: bool) -> String {
    let s = if unescape {
        unescape_entities(s)
    } else {
        s.to_string()
    };
    let s = s.replace("\r\n", "\n");
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        push_fixed_char(&mut out, c);
    }
    // ftfy ends each pass with its `normalization` (NFC)
    out.nfc().collect()
}

/// `&name;` decoded as ftfy's entity table has it: every HTML5 name that ends in `;`, plus
/// the all-uppercase spelling of a lowercase name that is not an entity itself, standing
/// for the uppercased text (`&EACUTE;` → `É`).
fn named_entity(name: &str) -> Option<String> {
    // The attribute context decodes only a whole `&name;` here: a legacy prefix such as
    // `&amp` followed by more letters is left alone, as in ftfy's table lookup.
    let decode = |n: &str| {
        let e = format!("&{n};");
        let d = htmlize::unescape_attribute(e.as_str());
        (d != e).then(|| d.into_owned())
    };
    if let Some(d) = decode(name) {
        return Some(d);
    }
    let upper_only = name.chars().any(|c| c.is_ascii_uppercase())
        && !name.chars().any(|c| c.is_ascii_lowercase());
    if upper_only {
        return decode(&name.to_ascii_lowercase()).map(|d| d.to_uppercase());
    }
    None
}

/// `&#N;` / `&#xH;` decoded as Python's `html.unescape` does (the HTML5 rules: NUL,
/// surrogates and values past U+10FFFF become U+FFFD, 0x80–0x9F the Windows-1252 characters).
fn numeric_entity(body: &str) -> Option<String> {
    let e = format!("&#{body};");
    let d = htmlize::unescape(e.as_str());
    // ftfy keeps the reference when the decoder did not take all of it
    (d != e && !d.contains(';')).then(|| d.into_owned())
}

/// ftfy's `unescape_html`: each `&#?[0-9A-Za-z]{1,24};` that is an entity is decoded
/// (references without `;` are left alone).
fn unescape_entities(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let decoded = tail[1..].find(';').and_then(|j| {
            let body = &tail[1..1 + j];
            let name = body.strip_prefix('#').unwrap_or(body);
            if name.is_empty()
                || name.len() > 24
                || !name.chars().all(|c| c.is_ascii_alphanumeric())
            {
                return None;
            }
            let text = if body.starts_with('#') {
                numeric_entity(name)?
            } else {
                named_entity(name)?
            };
            Some((text, j + 2))
        });
        match decoded {
            Some((text, n)) => {
                out.push_str(&text);
                rest = &tail[n..];
            }
            None => {
                out.push('&');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The ported part of `ftfy.fix_text`: line by line, fixers repeated until stable; HTML
/// entities only until the first line that contains `<`.
pub fn fix_text(text: &str) -> String {
    let mut unescape = true;
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        if line.contains('<') {
            unescape = false;
        }
        let mut s = line.to_string();
        loop {
            let next = fix_pass(&s, unescape);
            if next == s {
                break;
            }
            s = next;
        }
        out.push_str(&s);
    }
    out
}

/// Python's `str.isspace` (what `\s` and `strip()` match).
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// diffusers' `prompt_clean`: [`fix_text`], HTML-unescape twice (Python's `html.unescape`:
/// the HTML5 rules, legacy references without `;` included), collapse whitespace, strip.
pub fn prompt_clean(text: &str) -> String {
    let s = fix_text(text);
    let s = htmlize::unescape(htmlize::unescape(s.as_str()).into_owned()).into_owned();
    s.split(is_py_space)
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
