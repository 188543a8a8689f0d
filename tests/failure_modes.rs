//! The failure modes other FP8 attention kernels shipped with (`tests/failure/mod.rs`), on
//! the CPU op: the same checks tests/gpu.rs runs on every CUDA kernel, here with the CPU op
//! as the target — the E4M3 flush and the sinks at full strength (they are small), the long
//! context at 20k keys instead of 160k, and the large-operand sampling on a small shape.

mod common;
mod failure;

use candle_core::DType;
use failure::*;

fn assert_none(f: Vec<String>) {
    assert!(f.is_empty(), "{}", f.join("\n"));
}

/// P mass that an unscaled E4M3 P flushes: key 0 the row max, 8191 keys 12–16 binades
/// below it (≈ 35 % of the row). Every config keeps the normalized mass at 1 and, where its
/// P reaches that deep, the tail's share within its P rounding of the floor's.
#[test]
fn e4m3_flush_tail_mass_is_kept() {
    let inp = structured((1, 2, 1, 4, 8192), 11, flush_scores);
    for causal in [false, true] {
        assert_none(mass_checks(
            &Target::cpu(),
            &inp,
            causal,
            DType::F32,
            "flush",
        ));
    }
}

/// An attention sink 10.5 nats above a tail of 4132 keys, prefill (70 rows, causal and
/// not) and decode-shaped (one row per head, GQA) calls of every config.
#[test]
fn sink_tail_is_kept_in_prefill_and_decode() {
    let gap = [6.0, 4.0, 0.5, 0.0];
    let prefill = structured((1, 2, 1, 70, 4133), 12, sink_scores(gap));
    for causal in [false, true] {
        assert_none(mass_checks(
            &Target::cpu(),
            &prefill,
            causal,
            DType::F32,
            "sink prefill",
        ));
    }
    let decode = structured((1, 4, 2, 1, 4133), 13, sink_scores(gap));
    assert_none(mass_checks(
        &Target::cpu(),
        &decode,
        true,
        DType::F32,
        "sink decode",
    ));
    assert_none(decode_checks(
        &decode.q,
        &decode.k,
        &decode.v,
        Some(1.0),
        "sink",
        true,
    ));
}

/// The ≥ 160k-key check at 20k keys: the full call against the CPU op on sampled rows (the
/// sampling and the causal suffix must give the full call's rows bit for bit), the exact
/// configs against float64; and decode over a 20k-key bf16 / MXFP8 / MXFP4 cache.
#[test]
fn long_context_sampled_rows_match_the_full_call() {
    let inp = random_long(1, 2, 70, 20_077, 21);
    let rows = sample_rows(&[(0, 0), (0, 1)], 70);
    for causal in [false, true] {
        assert_none(sampled_checks(
            &[Target::cpu()],
            (&inp.q, &inp.k, &inp.v),
            causal,
            &rows,
            "long 20k",
            None,
        ));
    }
    let q = random_long(1, 8, 1, 1, 22).q;
    let kv = random_long(1, 2, 1, 20_077, 23);
    assert_none(decode_checks(&q, &kv.k, &kv.v, None, "long 20k", false));
}

/// The large-operand check's sampling on a small shape: heads of both batch entries, the
/// last one included, every listed row against the full call.
#[test]
fn large_operand_sampling_matches_the_full_call() {
    let inp = random_long(2, 5, 200, 200, 31);
    let heads = [(0, 0), (0, 4), (1, 0), (1, 3), (1, 4)];
    let rows = sample_rows(&heads, 200);
    for causal in [false, true] {
        assert_none(sampled_checks(
            &[Target::cpu()],
            (&inp.q, &inp.k, &inp.v),
            causal,
            &rows,
            "large (small shape)",
            None,
        ));
    }
}
