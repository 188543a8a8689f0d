#!/usr/bin/env python3
"""Golden tables for mxattn's MX codecs, made with an external oracle (ml_dtypes).

Writes tests/golden/mx_golden.json (decode tables, special encode cases, MX block
quantization cases) and tests/golden/mx_random_<fmt>.bin (codes for pseudo-random
inputs). The random inputs come from splitmix64, implemented identically in
tests/mx_golden.rs, so only the expected codes are stored.

Conventions checked here (documented in src/mx/element.rs):
  * element rounding is round-to-nearest-even (ml_dtypes' cast);
  * finite values beyond the format's max saturate to +-max (OCP "satfinite").
    ml_dtypes casts them to NaN/Inf for FP8, so the script clamps first;
  * NaN and Inf follow ml_dtypes: E4M3 NaN for both, E5M2 NaN/Inf, and the FP6/FP4
    types (no NaN/Inf) saturate Inf and give ml_dtypes' code for NaN.

Run:  python3 -m pip install ml_dtypes==0.7.0 numpy && python3 scripts/gen_mx_golden.py
"""
import json, os, struct, sys
import numpy as np
import ml_dtypes as mld

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden")
FORMATS = {  # name: (dtype, bits, max_normal, emax, min_subnormal)
    "E4M3": (mld.float8_e4m3fn, 8, 448.0, 8, 2.0**-9),
    "E5M2": (mld.float8_e5m2, 8, 57344.0, 15, 2.0**-16),
    "E2M3": (mld.float6_e2m3fn, 6, 7.5, 2, 0.125),
    "E3M2": (mld.float6_e3m2fn, 6, 28.0, 4, 0.0625),
    "E2M1": (mld.float4_e2m1fn, 4, 6.0, 2, 0.5),
}
N_RANDOM = 20000  # per format; 1e5 in all


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return state, z ^ (z >> 31)


def random_f32_bits(seed, n, exp_lo, exp_hi):
    """n f32 bit patterns: random sign and mantissa, unbiased exponent uniform in [exp_lo, exp_hi]."""
    out = np.empty(n, np.uint32)
    s = seed
    span = exp_hi - exp_lo + 1
    for i in range(n):
        s, r = splitmix64(s)
        sign = r >> 63
        mant = r & 0x7FFFFF
        e = exp_lo + ((r >> 23) & 0xFFFF) % span
        out[i] = (sign << 31) | ((e + 127) << 23) | mant
    return out


def encode(fmt, x32):
    """Oracle encode of float32 array: saturate finite overflow, then ml_dtypes RNE cast."""
    dt, bits, mx, _, _ = FORMATS[fmt]
    x = x32.astype(np.float64)
    finite = np.isfinite(x)
    sat = np.where(finite, np.clip(x, -mx, mx), x)
    codes = sat.astype(np.float32).astype(dt).view(np.uint8) & ((1 << bits) - 1)
    if bits < 8:
        codes = np.where(np.isnan(x), 0, codes).astype(np.uint8)
    return codes


def f32_bits(a):
    return [int(v) for v in np.asarray(a, np.float32).view(np.uint32)]


def decode_table(fmt):
    dt, bits, *_ = FORMATS[fmt]
    codes = np.arange(1 << bits, dtype=np.uint8)
    return f32_bits(codes.view(dt).astype(np.float32))


def special_inputs(fmt):
    """Every representable value, every midpoint (ties), neighbours of both, edges."""
    dt, bits, mx, _, mins = FORMATS[fmt]
    vals = np.array(decode_table_vals(fmt))
    pos = np.unique(vals[np.isfinite(vals) & (vals >= 0)])
    mids = (pos[:-1] + pos[1:]) / 2.0
    cand = list(pos) + list(mids)
    xs = []
    for c in cand:
        c32 = np.float32(c)
        xs += [c32, np.nextafter(c32, np.float32(np.inf)), np.nextafter(c32, np.float32(-np.inf))]
    xs += [np.float32(mins / 4), np.float32(mins / 2), np.float32(mins * 0.75), np.float32(1e-30),
           np.float32(mx * 1.03), np.float32(mx * 1.0625), np.float32(mx * 2), np.float32(3e38),
           np.float32(1e-45), np.float32(0.0)]
    xs = np.array(xs, np.float32)
    xs = np.concatenate([xs, -xs, np.array([np.inf, -np.inf, np.nan], np.float32)])
    xs = np.concatenate([xs, np.array([-0.0], np.float32)])
    return xs


def decode_table_vals(fmt):
    dt, bits, *_ = FORMATS[fmt]
    return np.arange(1 << bits, dtype=np.uint8).view(dt).astype(np.float64)


def mx_case(fmt, mode, x32, block):
    """Reference MX quantization of a 1-D float32 vector (torchao/microxcaling style)."""
    dt, bits, mx, emax, _ = FORMATS[fmt]
    mbits = {"E4M3": 3, "E5M2": 2, "E2M3": 3, "E3M2": 2, "E2M1": 1}[fmt]
    scales, codes = [], []
    for b0 in range(0, len(x32), block):
        blk = x32[b0:b0 + block].astype(np.float64)
        if not np.all(np.isfinite(blk)):
            scales.append(255)
            codes += [int(c) for c in encode(fmt, blk.astype(np.float32))]
            continue
        amax = np.max(np.abs(blk))
        if amax == 0:
            e = -127
        else:
            fl = int(np.floor(np.log2(amax)))
            if mode == "Floor":
                e = fl - emax
            elif mode == "Ceil":
                e = int(np.ceil(np.log2(amax))) - emax
            elif mode == "Even":
                frac = amax / 2.0**fl - 1.0
                e = fl + (1 if frac >= 1.0 - 2.0 ** -(mbits + 1) else 0) - emax
            elif mode == "Rceil":
                e = int(np.ceil(np.log2(amax / mx)))
                # guard log2 rounding at exact powers
                while mx * 2.0**e < amax:
                    e += 1
                while mx * 2.0 ** (e - 1) >= amax:
                    e -= 1
        e = int(np.clip(e, -127, 127))
        scales.append(e + 127)
        codes += [int(c) for c in encode(fmt, (blk / 2.0**e).astype(np.float32))]
    return scales, codes


def main():
    os.makedirs(ROOT, exist_ok=True)
    out = {"generator": "scripts/gen_mx_golden.py", "ml_dtypes": mld.__version__, "formats": {}}
    for i, fmt in enumerate(FORMATS):
        xs = special_inputs(fmt)
        out["formats"][fmt] = {
            "decode_f32_bits": f32_bits(decode_table_vals(fmt)),
            "encode_inputs_f32_bits": f32_bits(xs),
            "encode_codes": [int(c) for c in encode(fmt, xs)],
        }
        dt, bits, mx, emax, mins = FORMATS[fmt]
        lo = int(np.floor(np.log2(mins))) - 3
        hi = int(np.ceil(np.log2(mx))) + 2
        r = random_f32_bits(0x5EED0000 + i, N_RANDOM, lo, hi)
        codes = encode(fmt, r.view(np.float32))
        with open(os.path.join(ROOT, f"mx_random_{fmt}.bin"), "wb") as f:
            f.write(struct.pack("<iiI", lo, hi, N_RANDOM))
            f.write(codes.astype(np.uint8).tobytes())
    # E8M0: every byte decodes as ml_dtypes float8_e8m0fnu says.
    out["e8m0_decode_f32_bits"] = f32_bits(np.arange(256, dtype=np.uint8).view(mld.float8_e8m0fnu).astype(np.float32))
    # MX block cases: pseudo-random vectors of 70 elements (a partial last block), a zero block,
    # a block with a NaN, every format and scale mode.
    cases = []
    rng = np.random.default_rng(7)
    for fmt in FORMATS:
        for mode in ["Floor", "Ceil", "Even", "Rceil"]:
            for t in range(3):
                x = (rng.standard_normal(70) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
                if t == 1:
                    x[32:64] = 0.0
                if t == 2:
                    x[5] = np.nan
                    x[40] = 7.75 * 2.0 ** 3  # mantissa near the top: Even/Ceil/Rceil differ
                s, c = mx_case(fmt, mode, x, 32)
                cases.append({"format": fmt, "mode": mode, "block": 32, "input_f32_bits": f32_bits(x),
                              "scales": s, "codes": c})
    out["mx_cases"] = cases
    with open(os.path.join(ROOT, "mx_golden.json"), "w") as f:
        json.dump(out, f)
    print("wrote", ROOT)


if __name__ == "__main__":
    sys.exit(main())
