//! MX codecs against golden tables made by `scripts/gen_mx_golden.py` with `ml_dtypes`.

use candle_core::{Device, Tensor};
use mxattn::mx::{self, e8m0_decode, ElemFormat, ScaleMode, ALL_FORMATS};
use serde_json::Value;

fn golden() -> Value {
    serde_json::from_str(include_str!("golden/mx_golden.json")).expect("golden json")
}

fn fmt_by_name(n: &str) -> ElemFormat {
    n.parse().unwrap()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn same_f32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

#[test]
fn every_code_of_every_format_decodes_like_ml_dtypes() {
    let g = golden();
    for f in ALL_FORMATS {
        let want = u32s(&g["formats"][f.name()]["decode_f32_bits"]);
        assert_eq!(want.len(), 1 << f.bits());
        for (c, w) in want.iter().enumerate() {
            let got = f.decode(c as u8);
            assert!(
                same_f32(got, f32::from_bits(*w)),
                "{f} code {c:#x}: got {got}, want {}",
                f32::from_bits(*w)
            );
        }
    }
}

#[test]
fn ties_subnormals_saturation_zero_nan_inf_encode_like_ml_dtypes() {
    let g = golden();
    for f in ALL_FORMATS {
        let e = &g["formats"][f.name()];
        let xs = u32s(&e["encode_inputs_f32_bits"]);
        let want = u32s(&e["encode_codes"]);
        assert!(xs.len() > 100);
        let mut failures = vec![];
        for (x, w) in xs.iter().zip(&want) {
            let x = f32::from_bits(*x);
            let c = f.encode(x) as u32;
            if c != *w {
                failures.push(format!("{x:e}: got {c:#x} want {w:#x}"));
            }
        }
        assert!(
            failures.is_empty(),
            "{f}: {} mismatches, e.g. {:?}",
            failures.len(),
            &failures[..failures.len().min(8)]
        );
    }
}

/// splitmix64, as in the generator script.
struct SplitMix(u64);
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
}

#[test]
fn random_values_of_every_magnitude_encode_like_ml_dtypes() {
    let files: [(ElemFormat, &[u8]); 5] = [
        (
            ElemFormat::E4M3,
            include_bytes!("golden/mx_random_E4M3.bin"),
        ),
        (
            ElemFormat::E5M2,
            include_bytes!("golden/mx_random_E5M2.bin"),
        ),
        (
            ElemFormat::E2M3,
            include_bytes!("golden/mx_random_E2M3.bin"),
        ),
        (
            ElemFormat::E3M2,
            include_bytes!("golden/mx_random_E3M2.bin"),
        ),
        (
            ElemFormat::E2M1,
            include_bytes!("golden/mx_random_E2M1.bin"),
        ),
    ];
    let mut total = 0;
    for (i, (f, bytes)) in files.iter().enumerate() {
        let lo = i32::from_le_bytes(bytes[0..4].try_into().unwrap());
        let hi = i32::from_le_bytes(bytes[4..8].try_into().unwrap());
        let n = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        let codes = &bytes[12..];
        assert_eq!(codes.len(), n);
        let mut rng = SplitMix(0x5EED0000 + i as u64);
        let span = (hi - lo + 1) as u64;
        for (k, want) in codes.iter().enumerate() {
            let r = rng.next();
            let sign = (r >> 63) as u32;
            let mant = (r & 0x7FFFFF) as u32;
            let e = lo + (((r >> 23) & 0xFFFF) % span) as i32;
            let x = f32::from_bits((sign << 31) | (((e + 127) as u32) << 23) | mant);
            assert_eq!(f.encode(x), *want, "{f} value #{k} = {x:e}");
        }
        total += n;
    }
    assert!(total >= 100_000);
}

#[test]
fn every_e8m0_byte_decodes_like_ml_dtypes() {
    let want = u32s(&golden()["e8m0_decode_f32_bits"]);
    for (b, w) in want.iter().enumerate() {
        assert!(
            same_f32(e8m0_decode(b as u8), f32::from_bits(*w)),
            "byte {b}"
        );
    }
}

#[test]
fn mx_block_quantization_matches_the_numpy_reference() {
    let g = golden();
    let cases = g["mx_cases"].as_array().unwrap();
    assert_eq!(cases.len(), 5 * 4 * 3);
    for c in cases {
        let f = fmt_by_name(c["format"].as_str().unwrap());
        let mode: ScaleMode = c["mode"].as_str().unwrap().parse().unwrap();
        let block = c["block"].as_u64().unwrap() as usize;
        let x: Vec<f32> = u32s(&c["input_f32_bits"])
            .into_iter()
            .map(f32::from_bits)
            .collect();
        let t = Tensor::from_vec(x.clone(), x.len(), &Device::Cpu).unwrap();
        let q = mx::quantize(&t, f, mode, 0, block).unwrap();
        let scales: Vec<u32> = q
            .scales()
            .to_vec1::<u8>()
            .unwrap()
            .into_iter()
            .map(u32::from)
            .collect();
        assert_eq!(scales, u32s(&c["scales"]), "{f} {mode} scales for {x:?}");
        let codes: Vec<u32> = q
            .unpacked_codes()
            .unwrap()
            .into_iter()
            .map(u32::from)
            .collect();
        assert_eq!(codes, u32s(&c["codes"]), "{f} {mode} codes");
        // The NaN block dequantizes to NaN whole; the others to code·scale.
        let deq = q.dequantize().unwrap().to_vec1::<f32>().unwrap();
        for (i, d) in deq.iter().enumerate() {
            let s = scales[i / block];
            if s == 255 {
                assert!(d.is_nan());
            } else {
                let want = f.decode(codes[i] as u8) as f64 * 2f64.powi(s as i32 - 127);
                assert_eq!(*d, want as f32);
            }
        }
    }
}
