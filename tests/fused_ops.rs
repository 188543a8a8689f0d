//! The fused elementwise ops (`mxattn::fused`) against independent references: Candle's own
//! ops chained as the unfused model code chains them (layer_norm, rms_norm, rope_i, broadcast
//! mul/add) and f64 formulas; bf16 outputs within the rounding the fused arithmetic implies;
//! and clear errors for bad input.

use candle_core::{DType, Device, Tensor};
use mxattn::fused::{
    ada_layer_norm, bias_gelu, bias_residual, merge_heads, split_heads, Rows, SplitHeads,
};

mod common;
use common::{max_abs_diff, uniform as vals};

const DEV: Device = Device::Cpu;

fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

const B: usize = 2;
const N: usize = 5;
const HEADS: usize = 3;
const HD: usize = 10;
const D: usize = HEADS * HD;

#[test]
fn ada_layer_norm_matches_candle_layer_norm_then_modulation() {
    let x = vals(&[B, N, D], 1, -1.0);
    let (w, b) = (vals(&[D], 2, -2.0), vals(&[D], 3, -2.0));
    // per-sample modulation as the Wan block slices it: a strided view of [B, 1, 6, D]
    let table = vals(&[B, 1, 6, D], 4, -2.0);
    let shift = table.narrow(2, 0, 1).unwrap().squeeze(2).unwrap();
    let scale = table.narrow(2, 1, 1).unwrap().squeeze(2).unwrap();
    let per_token = vals(&[B, N, D], 5, -2.0);
    let ones = Tensor::ones(D, DType::F32, &DEV).unwrap();
    let zeros = Tensor::zeros(D, DType::F32, &DEV).unwrap();
    let ln = |w: &Tensor, b: &Tensor| candle_nn::ops::layer_norm(&x, w, b, 1e-6).unwrap();
    let modulate = |y: Tensor, sh: &Tensor, sc: &Tensor| {
        y.broadcast_mul(&(sc + 1.0).unwrap())
            .unwrap()
            .broadcast_add(sh)
            .unwrap()
    };
    let cases = [
        (ada_layer_norm(&x, None, None, 1e-6), ln(&ones, &zeros)),
        (ada_layer_norm(&x, Some((&w, &b)), None, 1e-6), ln(&w, &b)),
        (
            ada_layer_norm(&x, None, Some((Rows::of(&shift), Rows::of(&scale))), 1e-6),
            modulate(ln(&ones, &zeros), &shift, &scale),
        ),
        (
            ada_layer_norm(
                &x,
                Some((&w, &b)),
                Some((Rows::of(&per_token), Rows::of(&scale))),
                1e-6,
            ),
            modulate(ln(&w, &b), &per_token, &scale),
        ),
        // rows plus a per-channel vector (the Wan block's e0 + scale_shift_table)
        (
            ada_layer_norm(
                &x,
                None,
                Some((Rows::plus(&per_token, &w), Rows::plus(&scale, &b))),
                1e-6,
            ),
            modulate(
                ln(&ones, &zeros),
                &per_token.broadcast_add(&w).unwrap(),
                &scale.broadcast_add(&b).unwrap(),
            ),
        ),
    ];
    for (i, (got, want)) in cases.into_iter().enumerate() {
        let d = max_abs_diff(&got.unwrap(), &want);
        assert!(d < 2e-5, "case {i}: max |fused − candle| = {d}");
    }
}

#[test]
fn split_heads_matches_bias_rms_norm_transpose_and_rope() {
    let t = vals(&[B, N, D], 11, -2.0);
    let bias = vals(&[D], 12, -1.0);
    let w = vals(&[D], 13, -2.0);
    let ang = vals(&[N, HD / 2], 14, 0.0);
    let (cos, sin) = (ang.cos().unwrap(), ang.sin().unwrap());
    let opts = SplitHeads {
        bias: Some(&bias),
        rms_weight: Some(&w),
        eps: 1e-6,
        rope: Some((&cos, &sin)),
    };
    let got = split_heads(&t, HEADS, &opts).unwrap();
    let u = t.broadcast_add(&bias).unwrap();
    let u = candle_nn::ops::rms_norm(&u, &w, 1e-6).unwrap();
    let u = u
        .reshape((B, N, HEADS, HD))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap();
    let want = candle_nn::rotary_emb::rope_i(&u, &cos, &sin).unwrap();
    let d = max_abs_diff(&got, &want);
    assert!(d < 2e-5, "max |fused − candle| = {d}");
    // no options: the plain transpose copy, exact
    let plain = split_heads(&t, HEADS, &SplitHeads::default()).unwrap();
    let want = t
        .reshape((B, N, HEADS, HD))
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    assert_eq!(max_abs_diff(&plain, &want), 0.0);
}

#[test]
fn merge_heads_is_the_transpose_and_undoes_a_plain_split() {
    let o = vals(&[B, HEADS, N, HD], 15, -2.0);
    let got = merge_heads(&o).unwrap();
    let want = o.transpose(1, 2).unwrap().reshape((B, N, D)).unwrap();
    assert_eq!(max_abs_diff(&got, &want), 0.0);
    let back = split_heads(&got, HEADS, &SplitHeads::default()).unwrap();
    assert_eq!(max_abs_diff(&back, &o), 0.0);
    let e = merge_heads(&vals(&[B, N, D], 16, 0.0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("[batch, heads, tokens, head_dim]"), "{e}");
}

#[test]
fn bias_residual_matches_broadcast_ops() {
    let x = vals(&[B, N, D], 21, -2.0);
    let y = vals(&[B, N, D], 22, -2.0);
    let bias = vals(&[D], 23, -2.0);
    let gate = vals(&[B, 1, D], 24, -2.0);
    let got = bias_residual(&x, &y, Some(&bias), Some(Rows::of(&gate))).unwrap();
    let want = (&x
        + y.broadcast_add(&bias)
            .unwrap()
            .broadcast_mul(&gate)
            .unwrap())
    .unwrap();
    assert!(max_abs_diff(&got, &want) < 1e-6);
    let got = bias_residual(&x, &y, None, Some(Rows::plus(&gate, &bias))).unwrap();
    let want = (&x
        + y.broadcast_mul(&gate.broadcast_add(&bias).unwrap())
            .unwrap())
    .unwrap();
    assert!(max_abs_diff(&got, &want) < 1e-6);
    let got = bias_residual(&x, &y, None, None).unwrap();
    assert_eq!(max_abs_diff(&got, &(&x + &y).unwrap()), 0.0);
}

#[test]
fn bias_gelu_matches_the_f64_formula() {
    let t = vals(&[3, 7, 33], 31, -2.5);
    let bias = vals(&[33], 32, -1.0);
    let got = flat(&bias_gelu(&t, Some(&bias)).unwrap());
    let tv = flat(&t);
    let bv = flat(&bias);
    for (i, g) in got.iter().enumerate() {
        let v = (tv[i] + bv[i % 33]) as f64;
        let want = 0.5
            * v
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh());
        assert!((*g as f64 - want).abs() < 2e-6, "{v}: {g} vs {want}");
    }
}

/// In bf16 each op computes in f32 and rounds where its documentation says: the output is
/// within that many bf16 steps of the same op in f32 on the same (bf16) inputs.
#[test]
fn bf16_outputs_round_the_f32_result() {
    let bf = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
    let x = bf(&vals(&[B, N, D], 41, -2.0));
    let y = bf(&vals(&[B, N, D], 42, -2.0));
    let bias = bf(&vals(&[D], 43, -1.0));
    let w = bf(&vals(&[D], 44, -2.0));
    let gate = vals(&[B, N, D], 45, -2.0);
    let ang = vals(&[N, HD / 2], 46, 0.0);
    let (cos, sin) = (ang.cos().unwrap(), ang.sin().unwrap());
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let (b32, w32) = (f(&bias), f(&w));
    let split = |t: &Tensor, b: &Tensor, w: &Tensor| {
        split_heads(
            t,
            HEADS,
            &SplitHeads {
                bias: Some(b),
                rms_weight: Some(w),
                eps: 1e-6,
                rope: Some((&cos, &sin)),
            },
        )
        .unwrap()
    };
    // (bf16 output, f32 output, rounding steps allowed)
    let cases = [
        (
            ada_layer_norm(&x, None, Some((Rows::of(&gate), Rows::of(&gate))), 1e-6).unwrap(),
            ada_layer_norm(&f(&x), None, Some((Rows::of(&gate), Rows::of(&gate))), 1e-6).unwrap(),
            1.0,
        ),
        // the bias sum and the norm output are rounded to bf16 before the rotation
        (split(&x, &bias, &w), split(&f(&x), &b32, &w32), 4.0),
        (
            bias_residual(&x, &y, Some(&bias), Some(Rows::of(&gate))).unwrap(),
            bias_residual(&f(&x), &f(&y), Some(&b32), Some(Rows::of(&gate))).unwrap(),
            3.0,
        ),
        (
            bias_gelu(&x, Some(&bias)).unwrap(),
            bias_gelu(&f(&x), Some(&b32)).unwrap(),
            2.0,
        ),
    ];
    for (i, (got, want, steps)) in cases.into_iter().enumerate() {
        assert_eq!(got.dtype(), DType::BF16);
        let scale = flat(&want).iter().fold(0f32, |m, v| m.max(v.abs()));
        for (g, w) in flat(&got).iter().zip(flat(&want)) {
            let bound = steps * (w.abs() / 128.0) + 1e-3 * scale;
            assert!((g - w).abs() <= bound, "case {i}: bf16 {g} vs f32 {w}");
        }
    }
}

#[test]
fn bad_input_gets_a_clear_error() {
    let x = vals(&[B, N, D], 51, -2.0);
    let err = |r: candle_core::Result<Tensor>| r.unwrap_err().to_string();
    let e = err(ada_layer_norm(&x.flatten_all().unwrap(), None, None, 1e-6));
    assert!(e.contains("[batch, tokens, dim]"), "{e}");
    let e = err(ada_layer_norm(&x, None, None, 0.0));
    assert!(e.contains("eps"), "{e}");
    let bad = vals(&[B, 2, D], 52, 0.0);
    let e = err(ada_layer_norm(
        &x,
        None,
        Some((Rows::of(&bad), Rows::of(&bad))),
        1e-6,
    ));
    assert!(e.contains("shift must be"), "{e}");
    let short = vals(&[D - 1], 55, 0.0);
    let gate = vals(&[B, 1, D], 56, 0.0);
    let e = err(bias_residual(&x, &x, None, Some(Rows::plus(&gate, &short))));
    assert!(e.contains("gate's added vector must be"), "{e}");
    let e = err(split_heads(&x, 4, &SplitHeads::default()));
    assert!(e.contains("does not split into 4 heads"), "{e}");
    let cos = vals(&[N + 1, HD / 2], 53, 0.0);
    let rope = SplitHeads {
        rope: Some((&cos, &cos)),
        ..Default::default()
    };
    let e = err(split_heads(&x, HEADS, &rope));
    assert!(e.contains("RoPE cos must be"), "{e}");
    let e = err(bias_residual(
        &x,
        &x.to_dtype(DType::BF16).unwrap(),
        None,
        None,
    ));
    assert!(e.contains("must match x"), "{e}");
    let e = err(bias_gelu(&x, Some(&vals(&[D + 1], 54, 0.0))));
    assert!(e.contains("bias must be"), "{e}");
    let e = err(bias_gelu(&x.to_dtype(DType::U32).unwrap(), None));
    assert!(e.contains("unsupported"), "{e}");
}
