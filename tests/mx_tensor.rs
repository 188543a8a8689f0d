//! MxTensor layout, packing and round-trip properties.

use candle_core::{DType, Device, Tensor};
use mxattn::mx::{self, pack, ElemFormat, ScaleMode, ALL_FORMATS};
use proptest::prelude::*;

fn vals(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

#[test]
fn layout_moves_the_quantized_dim_last() {
    let t = Tensor::randn(0f32, 1.0, (2, 3, 70, 5), &Device::Cpu).unwrap();
    let q = mx::quantize(&t, ElemFormat::E2M1, ScaleMode::Floor, 2, 32).unwrap();
    // 70 keys -> 3 blocks (the last partial), padded to 96 codes = 48 bytes
    assert_eq!(q.codes().dims(), &[2, 3, 5, 48]);
    assert_eq!(q.scales().dims(), &[2, 3, 5, 3]);
    assert_eq!(q.codes().dtype(), DType::U8);
    let back = q.dequantize().unwrap();
    assert_eq!(back.dims(), t.dims());
    // Element [i, j, k, l] must come back as block quantization of the 70-key column
    // t[i, j, :, l] (blocks of 32 along dim 2): a wrong permutation or padding fails here.
    let (a, b) = (vals(&t), vals(&back));
    let at = |i: usize, j: usize, k: usize, l: usize| ((i * 3 + j) * 70 + k) * 5 + l;
    for i in 0..2 {
        for j in 0..3 {
            for l in 0..5 {
                let col: Vec<f32> = (0..70).map(|k| a[at(i, j, k, l)]).collect();
                let mut want = vec![0f32; 70];
                mx::fake_quantize(&col, ElemFormat::E2M1, ScaleMode::Floor, 32, &mut want);
                for k in 0..70 {
                    assert_eq!(
                        b[at(i, j, k, l)].to_bits(),
                        want[k].to_bits(),
                        "[{i}, {j}, {k}, {l}]"
                    );
                }
            }
        }
    }
}

#[test]
fn fp6_and_fp4_packing_round_trips() {
    let codes6: Vec<u8> = (0..64u32).map(|i| ((i * 37) % 64) as u8).collect();
    let mut packed = vec![0u8; 48];
    pack::pack(&codes6, 6, &mut packed);
    let mut back = vec![0u8; 64];
    pack::unpack(&packed, 6, &mut back);
    assert_eq!(back, codes6);
    let codes4: Vec<u8> = (0..64u32).map(|i| ((i * 7) % 16) as u8).collect();
    let mut p4 = vec![0u8; 32];
    pack::pack(&codes4, 4, &mut p4);
    assert_eq!(p4[0], codes4[0] | (codes4[1] << 4));
    pack::unpack(&p4, 4, &mut back[..64]);
    assert_eq!(&back[..64], &codes4[..]);
}

#[test]
fn packed_codes_match_elementwise_encoding() {
    // A block whose max is exactly 6·2^3 = 48: Floor picks 2^3, every value is x/8 rounded.
    let x: Vec<f32> = (0..32)
        .map(|i| if i == 0 { 48.0 } else { i as f32 * 0.7 })
        .collect();
    let t = Tensor::from_vec(x.clone(), 32, &Device::Cpu).unwrap();
    let q = mx::quantize(&t, ElemFormat::E2M1, ScaleMode::Floor, 0, 32).unwrap();
    assert_eq!(q.scales().to_vec1::<u8>().unwrap(), vec![127 + 3]);
    let codes = q.unpacked_codes().unwrap();
    for (c, v) in codes.iter().zip(&x) {
        assert_eq!(*c, ElemFormat::E2M1.encode(v / 8.0));
    }
}

#[test]
fn bad_arguments_are_errors() {
    let t = Tensor::zeros((4, 8), DType::F32, &Device::Cpu).unwrap();
    assert!(mx::quantize(&t, ElemFormat::E2M1, ScaleMode::Floor, 2, 32).is_err());
    assert!(mx::quantize(&t, ElemFormat::E2M3, ScaleMode::Floor, 1, 6).is_err()); // not 4-aligned
    assert!(mx::quantize(&t, ElemFormat::E2M1, ScaleMode::Floor, 1, 0).is_err());
    let u = Tensor::zeros((4, 8), DType::U8, &Device::Cpu).unwrap();
    assert!(mx::quantize(&u, ElemFormat::E2M1, ScaleMode::Floor, 1, 8).is_err());
}

#[test]
fn zero_and_nan_blocks() {
    let mut x = vec![0f32; 64];
    x[40] = f32::NAN;
    let t = Tensor::from_vec(x, 64, &Device::Cpu).unwrap();
    let q = mx::quantize(&t, ElemFormat::E4M3, ScaleMode::Floor, 0, 32).unwrap();
    assert_eq!(q.scales().to_vec1::<u8>().unwrap(), vec![0, 0xFF]);
    let d = vals(&q.dequantize().unwrap());
    assert!(d[..32].iter().all(|v| *v == 0.0));
    assert!(d[32..].iter().all(|v| v.is_nan()));
}

/// Codes and scales of pieces, concatenated the way a KV cache appends them, make the
/// MxTensor of the whole: rows of other dims concatenate freely, and along the quantized
/// dim whole blocks concatenate as packed bytes.
#[test]
fn from_parts_reassembles_concatenated_pieces() {
    let t = Tensor::randn(0f32, 1.0, (1, 2, 96, 64), &Device::Cpu).unwrap();
    for f in [ElemFormat::E4M3, ElemFormat::E2M3, ElemFormat::E2M1] {
        // along d (dim 3), split over tokens (dim 2)
        let whole = mx::quantize(&t, f, ScaleMode::Floor, 3, 32).unwrap();
        let a = mx::quantize(&t.narrow(2, 0, 40).unwrap(), f, ScaleMode::Floor, 3, 32).unwrap();
        let b = mx::quantize(&t.narrow(2, 40, 56).unwrap(), f, ScaleMode::Floor, 3, 32).unwrap();
        let c = Tensor::cat(&[a.codes(), b.codes()], 2).unwrap();
        let s = Tensor::cat(&[a.scales(), b.scales()], 2).unwrap();
        let m =
            mx::MxTensor::from_parts(c, s, f, ScaleMode::Floor, 32, 3, t.shape().clone()).unwrap();
        assert_eq!(
            vals(&m.dequantize().unwrap()),
            vals(&whole.dequantize().unwrap())
        );
        // along tokens (dim 2) in whole 32-blocks, split over tokens
        let whole = mx::quantize(&t, f, ScaleMode::Floor, 2, 32).unwrap();
        let a = mx::quantize(&t.narrow(2, 0, 32).unwrap(), f, ScaleMode::Floor, 2, 32).unwrap();
        let b = mx::quantize(&t.narrow(2, 32, 64).unwrap(), f, ScaleMode::Floor, 2, 32).unwrap();
        let c = Tensor::cat(&[a.codes(), b.codes()], 3).unwrap();
        let s = Tensor::cat(&[a.scales(), b.scales()], 3).unwrap();
        let m =
            mx::MxTensor::from_parts(c, s, f, ScaleMode::Floor, 32, 2, t.shape().clone()).unwrap();
        assert_eq!(
            vals(&m.dequantize().unwrap()),
            vals(&whole.dequantize().unwrap())
        );
    }
    // wrong shapes and dtypes are errors
    let q = mx::quantize(&t, ElemFormat::E2M1, ScaleMode::Floor, 3, 32).unwrap();
    let bad = |codes: Tensor, scales: Tensor, shape: (usize, usize, usize, usize)| {
        mx::MxTensor::from_parts(
            codes,
            scales,
            ElemFormat::E2M1,
            ScaleMode::Floor,
            32,
            3,
            shape.into(),
        )
        .unwrap_err()
        .to_string()
    };
    assert!(bad(q.codes().clone(), q.scales().clone(), (1, 2, 95, 64)).contains("codes must be"));
    let f32codes = q.codes().to_dtype(DType::F32).unwrap();
    assert!(bad(f32codes, q.scales().clone(), (1, 2, 96, 64)).contains("U8"));
}

fn arb_block() -> impl Strategy<Value = (Vec<f32>, f32)> {
    (prop::collection::vec(-1.0f32..1.0, 1..100), -30i32..30).prop_map(|(v, e)| (v, 2f32.powi(e)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Under the OCP floor rule quantize∘dequantize∘quantize reproduces codes and scales;
    /// under every rule the represented values are a fixed point.
    #[test]
    fn quantize_dequantize_quantize_is_a_fixed_point((v, s) in arb_block(), fi in 0usize..5, mi in 0usize..4) {
        let f = ALL_FORMATS[fi];
        let mode = ScaleMode::ALL[mi];
        let x: Vec<f32> = v.iter().map(|a| a * s).collect();
        let n = x.len();
        let t = Tensor::from_vec(x, n, &Device::Cpu).unwrap();
        let q1 = mx::quantize(&t, f, mode, 0, 4).unwrap();
        let d1 = q1.dequantize().unwrap();
        let q2 = mx::quantize(&d1, f, mode, 0, 4).unwrap();
        let d2 = q2.dequantize().unwrap();
        prop_assert_eq!(vals(&d1), vals(&d2));
        if mode == ScaleMode::Floor {
            prop_assert_eq!(q1.unpacked_codes().unwrap(), q2.unpacked_codes().unwrap());
            prop_assert_eq!(q1.scales().to_vec1::<u8>().unwrap(), q2.scales().to_vec1::<u8>().unwrap());
        }
    }

    #[test]
    fn encode_decode_is_identity_on_representable_values(c in 0u8..=255, fi in 0usize..5) {
        let f = ALL_FORMATS[fi];
        let c = c & ((1u16 << f.bits()) - 1) as u8;
        let v = f.decode(c);
        prop_assume!(v.is_finite());
        prop_assert_eq!(f.decode(f.encode(v)).to_bits(), v.to_bits());
    }
}
