#!/usr/bin/env python3
"""Extracts the eval text evals/data/pride_and_prejudice_ch1-12.txt from the Debian package
r-cran-janeaustenr (1.0.0-1; MIT; Julia Silge), which ships Jane Austen's novels (public
domain) as R lazy-load data. No R needed: a minimal reader of R's serialization format.

    apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb pkg
    python3 scripts/extract_austen_text.py pkg/usr/lib/R/site-library/janeaustenr/data \
        evals/data/pride_and_prejudice_ch1-12.txt

Chapters 1-12 (24k Qwen3 tokens, ~100 KB): the text up to the line "Chapter 13".
"""
import gzip
import re
import struct
import sys
import zlib


class Reader:
    """Just enough of R's XDR serialization for the character vectors of this package."""

    def __init__(self, b):
        self.b, self.p, self.refs = b, 0, []

    def int(self):
        v = struct.unpack(">i", self.b[self.p:self.p + 4])[0]
        self.p += 4
        return v

    def header(self):
        assert self.b[:2] == b"X\n", "not XDR serialization"
        self.p = 2
        version = self.int()
        self.int()
        self.int()
        if version == 3:
            n = self.int()
            self.p += n  # native encoding name

    def item(self):
        flags = self.int()
        t, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if t in (254, 242):  # NILVALUE, EMPTYENV
            return None
        if t == 255:  # REFSXP
            idx = flags >> 8 or self.int()
            return self.refs[idx - 1]
        if t == 1:  # SYMSXP
            s = ("sym", self.item())
            self.refs.append(s)
            return s
        if t == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            v = self.b[self.p:self.p + n].decode("utf-8")
            self.p += n
            return v
        if t == 2:  # LISTSXP (pairlist)
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car, cdr = self.item(), self.item()
            return [(tag, car)] + (cdr if isinstance(cdr, list) else [])
        if t == 16:  # STRSXP
            v = [self.item() for _ in range(self.int())]
        elif t in (10, 13):  # LGLSXP, INTSXP
            v = [self.int() for _ in range(self.int())]
        elif t == 19:  # VECSXP
            v = [self.item() for _ in range(self.int())]
        else:
            raise ValueError(f"R type {t} not handled")
        if has_attr:
            return ("attr", v, self.item())
        return v


def unserialize(b):
    r = Reader(b)
    r.header()
    return r.item()


def main():
    data_dir, out = sys.argv[1], sys.argv[2]
    index = unserialize(gzip.decompress(open(f"{data_dir}/Rdata.rdx", "rb").read()))
    # index: named list (variables, references, compressed); variables: named list of
    # (offset, length) pairs into Rdata.rdb
    variables = index[1][0]
    offsets, names = variables[1], variables[2][0][1]
    off, length = offsets[names.index("prideprejudice")]
    rdb = open(f"{data_dir}/Rdata.rdb", "rb").read()
    chunk = rdb[off:off + length]
    lines = unserialize(zlib.decompress(chunk[4:]))  # 4-byte length, then zlib
    text = "\n".join(x or "" for x in lines) + "\n"
    m = re.search(r"^Chapter 13$", text, re.M)
    part = text[:m.start()].rstrip("\n") + "\n"
    with open(out, "w", encoding="utf-8") as f:
        f.write(part)
    print(f"{out}: {len(part)} characters")


if __name__ == "__main__":
    main()
