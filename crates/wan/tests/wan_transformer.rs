//! Wan diffusion transformer: parity with diffusers' `WanTransformer3DModel` on tiny random
//! A14B-like (one timestep per sample) and TI2V-5B-like (per-token timesteps) checkpoints
//! (`scripts/gen_wan_transformer_fixtures.py`), the original-layout loader, loading errors,
//! the attention policy seam with a quantized config, and input errors.

use candle_core::{DType, Device, Tensor};
use mxattn::attention::{AttentionConfig, FusedSoftmaxConfig, OperandFormat};
use mxattn::mx::ElemFormat;
use mxattn_wan::transformer::{
    check_files, expected_tensors, expert_dirs, original_name, Layout, TransformerConfig,
    WanTransformer,
};
use mxattn_wan::{AttnKind, AttnPolicy};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

mod common;
use common::{max_abs_diff, Recorder};

const DEV: Device = Device::Cpu;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan/transformer")
}

struct Case {
    latents: Tensor,
    timestep: Tensor,
    text: Tensor,
    out: Tensor,
}

fn case(name: &str) -> Case {
    let all =
        candle_core::safetensors::load(fixtures().join("expected.safetensors"), &DEV).unwrap();
    let get = |k: &str| all[&format!("{name}.{k}")].clone();
    Case {
        latents: get("latents"),
        timestep: get("timestep"),
        text: get("text"),
        out: get("out"),
    }
}

fn mean_abs(a: &Tensor) -> f32 {
    a.to_dtype(DType::F32)
        .unwrap()
        .abs()
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn exact() -> AttentionConfig {
    AttentionConfig::exact()
}

fn load(name: &str) -> WanTransformer {
    WanTransformer::load(fixtures().join(name), DType::F32, &DEV).unwrap()
}

fn run(m: &WanTransformer, c: &Case, policy: &dyn AttnPolicy) -> Tensor {
    m.forward(&c.latents, &c.timestep, &c.text, policy, 0, 0)
        .unwrap()
}

fn parity(name: &str) {
    let m = load(name);
    let c = case(name);
    let out = run(&m, &c, &exact());
    let d = max_abs_diff(&out, &c.out);
    let scale = mean_abs(&c.out);
    println!(
        "{name}: out {:?}, max |diff| = {d:.2e} (mean |x| = {scale:.3})",
        out.dims()
    );
    assert!(scale > 0.1, "the reference is nearly zero: a weak test");
    assert!(d < 1e-4, "{name}: max |diff| {d:e} vs diffusers");
}

#[test]
fn a14b_like_matches_diffusers() {
    parity("a14b");
}

/// Per-token timesteps (TI2V-5B's `expand_timesteps`; t = 0 on the first frame of sample 0).
#[test]
fn ti2v5b_like_per_token_timesteps_match_diffusers() {
    let c = case("ti2v5b");
    assert_eq!(c.timestep.dims(), &[2, 18]);
    parity("ti2v5b");
}

/// A per-token timestep that is the same on every token gives the per-sample result, and
/// the per-token path is really per token (the first frame's t = 0 changes the output).
#[test]
fn per_token_and_per_sample_timesteps_agree() {
    let m = load("a14b");
    let c = case("a14b");
    let per_sample = run(&m, &c, &exact());
    let t = c.timestep.to_vec1::<f32>().unwrap();
    let n = m.num_tokens(3, 4, 6);
    assert_eq!(n, 18);
    let rows: Vec<f32> = t.iter().flat_map(|&v| vec![v; n]).collect();
    let tt = Tensor::from_vec(rows.clone(), (2, n), &DEV).unwrap();
    let per_token = m.forward(&c.latents, &tt, &c.text, &exact(), 0, 0).unwrap();
    let d = max_abs_diff(&per_sample, &per_token);
    assert!(d < 1e-5, "{d:e}");
    let mut first0 = rows;
    first0[..6].iter_mut().for_each(|v| *v = 0.0);
    let tt = Tensor::from_vec(first0, (2, n), &DEV).unwrap();
    let other = m.forward(&c.latents, &tt, &c.text, &exact(), 0, 0).unwrap();
    assert!(
        max_abs_diff(
            &per_sample.narrow(0, 0, 1).unwrap(),
            &other.narrow(0, 0, 1).unwrap()
        ) > 1e-2
    );
    // sample 1 is untouched (up to the summation order of differently shaped matmuls)
    assert!(
        max_abs_diff(
            &per_sample.narrow(0, 1, 1).unwrap(),
            &other.narrow(0, 1, 1).unwrap()
        ) < 1e-5
    );
    // a batch of one timestep broadcasts
    let one = Tensor::new(&[t[0]], &DEV).unwrap();
    let b = m
        .forward(&c.latents, &one, &c.text, &exact(), 0, 0)
        .unwrap();
    let d = max_abs_diff(
        &b.narrow(0, 0, 1).unwrap(),
        &per_sample.narrow(0, 0, 1).unwrap(),
    );
    assert!(d < 1e-5, "{d:e}");
}

/// The same weights re-keyed into the original Wan layout (sharded, norm2/norm3 swapped, a
/// `WanModel` config.json) load to the same model.
#[test]
fn original_layout_gives_identical_output() {
    let files = mxattn_wan::transformer::find_files(fixtures().join("a14b_original")).unwrap();
    assert_eq!(files.weights.len(), 2);
    assert!(files.index.is_some());
    let cfg = TransformerConfig::from_file(&files.config).unwrap();
    let dcfg = TransformerConfig::from_file(fixtures().join("a14b/config.json")).unwrap();
    assert_eq!(cfg.dim(), dcfg.dim());
    assert_eq!(cfg.num_layers, dcfg.num_layers);
    assert_eq!(cfg.in_channels, dcfg.in_channels);
    assert_eq!(cfg.text_dim, dcfg.text_dim);
    assert_eq!(check_files(&cfg, &files).unwrap(), Layout::Original);
    let dfiles = mxattn_wan::transformer::find_files(fixtures().join("a14b")).unwrap();
    assert_eq!(check_files(&dcfg, &dfiles).unwrap(), Layout::Diffusers);

    let c = case("a14b");
    let a = run(&load("a14b"), &c, &exact());
    let b = run(&load("a14b_original"), &c, &exact());
    assert_eq!(max_abs_diff(&a, &b), 0.0);
    assert!(max_abs_diff(&b, &c.out) < 1e-4);
}

#[test]
fn original_names_follow_the_converter() {
    for (d, o) in [
        (
            "blocks.3.attn1.to_out.0.weight",
            "blocks.3.self_attn.o.weight",
        ),
        (
            "blocks.3.attn2.norm_k.weight",
            "blocks.3.cross_attn.norm_k.weight",
        ),
        ("blocks.0.norm2.bias", "blocks.0.norm3.bias"),
        ("blocks.12.ffn.net.0.proj.weight", "blocks.12.ffn.0.weight"),
        ("blocks.12.scale_shift_table", "blocks.12.modulation"),
        ("scale_shift_table", "head.modulation"),
        ("proj_out.bias", "head.head.bias"),
        (
            "condition_embedder.time_proj.weight",
            "time_projection.1.weight",
        ),
        (
            "condition_embedder.text_embedder.linear_2.bias",
            "text_embedding.2.bias",
        ),
        ("patch_embedding.weight", "patch_embedding.weight"),
    ] {
        assert_eq!(original_name(d), o);
    }
}

/// A copy of a fixture directory in a fresh temporary directory, with the weights passed
/// through `edit`.
fn edited_copy(name: &str, tag: &str, edit: impl Fn(&mut HashMap<String, Tensor>)) -> PathBuf {
    let src = fixtures().join(name);
    let dst = std::env::temp_dir().join(format!("mxattn-wan-dit-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let to = dst.join(p.file_name().unwrap());
        if p.extension().is_some_and(|x| x == "safetensors") {
            let mut t = candle_core::safetensors::load(&p, &DEV).unwrap();
            edit(&mut t);
            candle_core::safetensors::save(&t, &to).unwrap();
        } else {
            std::fs::copy(&p, &to).unwrap();
        }
    }
    dst
}

fn load_err(dir: &Path) -> String {
    match WanTransformer::load(dir, DType::F32, &DEV) {
        Ok(_) => panic!("{} loaded; expected an error", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_or_misshapen_tensors_are_named() {
    let dir = edited_copy("a14b", "missing", |t| {
        t.remove("blocks.1.attn2.norm_k.weight").unwrap();
    });
    let e = load_err(&dir);
    assert!(
        e.contains("blocks.1.attn2.norm_k.weight")
            && e.contains("missing")
            && e.contains("diffusion_pytorch_model.safetensors"),
        "{e}"
    );
    let dir2 = edited_copy("a14b", "shape", |t| {
        let w = t["blocks.0.ffn.net.2.weight"]
            .t()
            .unwrap()
            .contiguous()
            .unwrap();
        t.insert("blocks.0.ffn.net.2.weight".into(), w);
    });
    let e = load_err(&dir2);
    assert!(
        e.contains("blocks.0.ffn.net.2.weight")
            && e.contains("[96, 64]")
            && e.contains("[64, 96]")
            && e.contains("diffusion_pytorch_model.safetensors"),
        "{e}"
    );
    // the original layout names its own tensors (the cross-attention norm is norm3 there)
    let dir3 = edited_copy("a14b_original", "orig", |t| {
        t.remove("blocks.1.norm3.weight");
    });
    let e = load_err(&dir3);
    assert!(
        e.contains("blocks.1.norm3.weight") && e.contains("Original"),
        "{e}"
    );
    for d in [dir, dir2, dir3] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// A Fused-Softmax MXFP8 schedule reaches every attention: the output is finite, differs from
/// exact attention by a quantization-sized amount, and the policy saw each (layer, kind) once.
#[test]
fn quantized_policy_runs_and_sees_every_site() {
    let cfg = AttentionConfig::fused_softmax(
        ElemFormat::E4M3,
        OperandFormat::fp8_per_channel(),
        FusedSoftmaxConfig::default(),
    );
    for name in ["a14b", "ti2v5b"] {
        let m = load(name);
        let c = case(name);
        let rec = Recorder::new(cfg.clone());
        let out = m
            .forward(&c.latents, &c.timestep, &c.text, &rec, 1, 7)
            .unwrap();
        let v = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(v.iter().all(|x| x.is_finite()));
        let d = max_abs_diff(&out, &c.out);
        println!("{name}: {} vs exact: max |diff| {d:.3e}", cfg.label());
        assert!(
            d > 1e-6,
            "quantized attention gave the exact result: was it used?"
        );
        // bounded by what the formats allow (mxattn::oracle::rounding_budget): attention
        // adds into the residual stream, so its relative change bounds the block output's
        let rel = mxattn_wan::fidelity::rel_l2(&out, &c.out).unwrap();
        let budget = mxattn::oracle::rounding_budget(&cfg);
        println!("{name}: relative change {rel:.3e}, budget {budget:.3e}");
        assert!(
            rel <= budget,
            "{name}: relative change {rel:.3e} > budget {budget:.3e}"
        );
        let sites = rec.sites();
        assert_eq!(sites.len(), 4, "{sites:?}");
        let got: BTreeSet<(usize, usize, usize, bool)> = sites
            .iter()
            .map(|s| (s.expert, s.step, s.layer, s.kind == AttnKind::SelfAttn))
            .collect();
        let want: BTreeSet<_> = (0..2)
            .flat_map(|l| [(1, 7, l, true), (1, 7, l, false)])
            .collect();
        assert_eq!(got, want);
        assert!(sites.iter().all(|s| s.kind != AttnKind::VaeMid));
    }
}

/// A config the attention refuses (MX blocks of 64 along a head dim of 32) is an error that
/// says where it happened.
#[test]
fn attention_errors_name_the_site() {
    let m = load("a14b");
    let c = case("a14b");
    let bad = AttentionConfig::exp_then_quantize(
        OperandFormat::Mx {
            elem: ElemFormat::E4M3,
            scale: mxattn::mx::ScaleMode::Floor,
            block: 64,
        },
        OperandFormat::Native,
        Default::default(),
    );
    let e = match m.forward(&c.latents, &c.timestep, &c.text, &bad, 0, 3) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("step 3")
            && e.contains("block 0")
            && e.contains("SelfAttn")
            && e.contains("head dim 32"),
        "{e}"
    );
}

fn err_of(r: candle_core::Result<Tensor>) -> String {
    match r {
        Ok(t) => panic!("expected an error, got a tensor {:?}", t.dims()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_inputs_are_errors() {
    let m = load("a14b");
    let c = case("a14b");
    let z = |s: &[usize]| Tensor::zeros(s, DType::F32, &DEV).unwrap();
    let e = err_of(m.forward(&z(&[2, 6, 3, 4, 6]), &c.timestep, &c.text, &exact(), 0, 0));
    assert!(e.contains("6 channels") && e.contains("takes 4"), "{e}");
    let e = err_of(m.forward(&z(&[2, 4, 3, 5, 6]), &c.timestep, &c.text, &exact(), 0, 0));
    assert!(e.contains("not a multiple of the patch"), "{e}");
    let e = err_of(m.forward(&z(&[4, 3, 4, 6]), &c.timestep, &c.text, &exact(), 0, 0));
    assert!(e.contains("[batch, 4, frames, height, width]"), "{e}");
    let e = err_of(m.forward(&c.latents, &z(&[3]), &c.text, &exact(), 0, 0));
    assert!(
        e.contains("timestep must be [2]") && e.contains("[2, 18]"),
        "{e}"
    );
    let e = err_of(m.forward(&c.latents, &z(&[2, 17]), &c.text, &exact(), 0, 0));
    assert!(e.contains("[2, 17]"), "{e}");
    let e = err_of(m.forward(&c.latents, &c.timestep, &z(&[2, 8, 15]), &exact(), 0, 0));
    assert!(e.contains("[2, length, 16]"), "{e}");
    let e = err_of(m.forward(&c.latents, &c.timestep, &z(&[1, 8, 16]), &exact(), 0, 0));
    assert!(e.contains("[2, length, 16]"), "{e}");
}

/// The released configs give diffusers' tensor and parameter counts (from diffusers on the
/// meta device, in expected.json) and the 44/42/42 RoPE split of a 128 head.
#[test]
fn released_configs_match_diffusers_counts() {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap())
            .unwrap();
    for (name, cfg) in [
        ("t2v_a14b", TransformerConfig::t2v_a14b()),
        ("ti2v_5b", TransformerConfig::ti2v_5b()),
    ] {
        let t = expected_tensors(&cfg);
        let params: u64 = t
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum();
        let r = &meta["released"][name];
        assert_eq!(t.len() as u64, r["tensors"].as_u64().unwrap(), "{name}");
        assert_eq!(params, r["parameters"].as_u64().unwrap(), "{name}");
        assert_eq!(cfg.rope_split(), (44, 42, 42));
    }
    assert_eq!(TransformerConfig::t2v_a14b().dim(), 5120);
    assert_eq!(TransformerConfig::ti2v_5b().dim(), 3072);
    assert_eq!(TransformerConfig::i2v_a14b().in_channels, 36);
}

#[test]
fn config_errors() {
    let e = TransformerConfig::from_json(
        r#"{"_class_name": "WanTransformer3DModel", "image_dim": 1280}"#,
    )
    .unwrap_err();
    assert!(e.contains("image"), "{e}");
    let e = TransformerConfig::from_json(r#"{"attention_head_dim": 31}"#).unwrap_err();
    assert!(e.contains("even"), "{e}");
    let e =
        TransformerConfig::from_json(r#"{"_class_name": "WanModel", "dim": 100, "num_heads": 3}"#)
            .unwrap_err();
    assert!(e.contains("multiple of num_heads"), "{e}");
    let c = TransformerConfig::from_json(
        r#"{"_class_name": "WanModel", "dim": 3072, "num_heads": 24, "ffn_dim": 14336, "in_dim": 48,
            "out_dim": 48, "num_layers": 30, "model_type": "ti2v"}"#,
    )
    .unwrap();
    assert_eq!(c, TransformerConfig::ti2v_5b());
}

#[test]
fn expert_dirs_finds_the_layouts() {
    let dirs = expert_dirs(fixtures().join("a14b")).unwrap();
    assert_eq!(dirs, vec![fixtures().join("a14b")]);
    let e = expert_dirs(fixtures()).unwrap_err().to_string();
    assert!(e.contains("no transformer found"), "{e}");
}

/// f16 and bf16 (the modulation still in f32) run close to the f32 reference; random weights give a deterministic model.
#[test]
fn f16_and_random_models() {
    let c = case("a14b");
    for (dt, tol) in [(DType::F16, 0.01), (DType::BF16, 0.05)] {
        let m = WanTransformer::load(fixtures().join("a14b"), dt, &DEV).unwrap();
        let out = run(&m, &c, &exact());
        assert_eq!(out.dtype(), dt);
        let d = max_abs_diff(&out, &c.out);
        println!("{dt:?} vs the f32 reference: max |diff| {d:.3e}");
        assert!(d < tol, "{dt:?} vs f32 reference: {d}");
    }

    let cfg = TransformerConfig::from_file(fixtures().join("ti2v5b/config.json")).unwrap();
    let a = WanTransformer::random(&cfg, DType::F32, &DEV, 3).unwrap();
    let b = WanTransformer::random(&cfg, DType::F32, &DEV, 3).unwrap();
    let c5 = case("ti2v5b");
    let (x, y) = (run(&a, &c5, &exact()), run(&b, &c5, &exact()));
    assert_eq!(max_abs_diff(&x, &y), 0.0);
    assert!(mean_abs(&x) > 1e-3);
}

/// The fused elementwise ops (the default) against Candle's op-by-op chain on both fixture
/// models: equal up to f32 rounding in f32. In bf16 both round to bf16 at the same points
/// (projection outputs, norm outputs, block outputs), so they sit at the same distance from the
/// f32 output up to which way single roundings fall: within 10 % of each other.
#[test]
fn fused_elementwise_matches_the_op_by_op_chain() {
    for name in ["a14b", "ti2v5b"] {
        let c = case(name);
        let mut m = load(name);
        let fused = run(&m, &c, &exact());
        m.set_fused_elementwise(false);
        let chain = run(&m, &c, &exact());
        let d = max_abs_diff(&fused, &chain);
        assert!(d < 1e-5, "{name} f32: max |fused − chain| = {d:e}");

        let mut m16 = WanTransformer::load(fixtures().join(name), DType::BF16, &DEV).unwrap();
        let fused16 = run(&m16, &c, &exact());
        m16.set_fused_elementwise(false);
        let chain16 = run(&m16, &c, &exact());
        let rel = |a: &Tensor| {
            let a = a.to_dtype(DType::F32).unwrap();
            let num = (&a - &fused).unwrap().sqr().unwrap().sum_all().unwrap();
            let den = fused.sqr().unwrap().sum_all().unwrap();
            (num.to_scalar::<f32>().unwrap() / den.to_scalar::<f32>().unwrap()).sqrt()
        };
        let (ef, ec) = (rel(&fused16), rel(&chain16));
        println!("{name} bf16 rel. L2 vs f32: fused {ef:.3e}, op-by-op {ec:.3e}");
        assert!(
            ef <= ec * 1.1 && ec <= ef * 1.1,
            "{name}: fused bf16 {ef:e} vs op-by-op bf16 {ec:e}"
        );
    }
}

fn rel_l2(a: &Tensor, b: &Tensor) -> f32 {
    let n = |t: &Tensor| {
        t.sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            .sqrt()
    };
    n(&(a - b).unwrap()) / n(b)
}

/// `--linear`: the schedule puts each block's projections where it says, and FP8 E4M3
/// projections move the output from diffusers' by what E4M3 allows. Each GEMM rounds both
/// operands to 3 mantissa bits (relative error ≤ 2⁻⁴, about 2⁻⁴/√3 rms each when uniform);
/// a path through the 2-block model passes about a dozen GEMMs, so the output's rel-L2 stays
/// well under 0.1, while a wrong scale would give errors of order 1 and a layer that
/// silently stayed dense an error of 0.
#[test]
fn fp8_linears_follow_the_schedule_within_e4m3_error() {
    use mxattn_wan::schedule::LinearSpec;
    let c = case("a14b");
    let mut m = load("a14b");
    let dense = run(&m, &c, &exact());
    let layers = m.config().num_layers;
    assert_eq!(layers, 2);
    let plan = LinearSpec::parse("bf16@layers=0,kind=ffn;fp8")
        .unwrap()
        .resolve(layers)
        .unwrap();
    m.set_linears(|l, k| plan.format(0, l, k)).unwrap();
    // block 0: self and cross FP8, FFN dense; block 1: all FP8
    assert_eq!(m.linear_summary(), "fp8: 5, bf16: 1");
    let mut all = load("a14b");
    let plan = LinearSpec::parse("fp8").unwrap().resolve(layers).unwrap();
    all.set_linears(|l, k| plan.format(0, l, k)).unwrap();
    assert_eq!(all.linear_summary(), "fp8: 6");
    let e_part = rel_l2(&run(&m, &c, &exact()), &c.out);
    let e_all = rel_l2(&run(&all, &c, &exact()), &c.out);
    let e_dense = rel_l2(&dense, &c.out);
    println!(
        "rel-L2 vs diffusers: dense {e_dense:.2e}, part FP8 {e_part:.2e}, all FP8 {e_all:.2e}"
    );
    assert!(e_dense < 1e-5);
    assert!(e_part > 1e-4 && e_all > 1e-4, "FP8 layers changed nothing");
    assert!(e_part < 0.1 && e_all < 0.1, "beyond E4M3's error");
    // a block's projections convert once; a schedule with a step key is refused
    let e = LinearSpec::parse("fp8@steps=1;bf16")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown key \"steps\""), "{e}");
    let e = LinearSpec::parse("fp9").unwrap_err().to_string();
    assert!(e.contains("unknown linear format"), "{e}");
}

/// A checkpoint in ComfyUI's scaled-FP8 layout (original Wan names, each block projection an
/// F8_E4M3 `weight` with a per-tensor `scale_weight`, a `scaled_fp8` marker) loads with its
/// projections FP8 as stored and gives diffusers' output for the same FP8 arithmetic
/// (`scripts/gen_wan_fp8_fixtures.py`: the dequantized weights, and each projection's input
/// quantized per token by a pre-hook with ml_dtypes' E4M3).
#[test]
fn comfyui_scaled_fp8_checkpoint_matches_diffusers() {
    let dir = fixtures().join("a14b_comfyui_fp8");
    let m = WanTransformer::load(&dir, DType::F32, &DEV).unwrap();
    assert_eq!(m.linear_summary(), "fp8-tensor: 6");
    let want = candle_core::safetensors::load(dir.join("expected.safetensors"), &DEV).unwrap();
    let c = case("a14b");
    let out = run(&m, &c, &exact());
    let d = max_abs_diff(&out, &want["out"]);
    let apart = rel_l2(&want["out"], &c.out);
    println!("ComfyUI FP8: max |diff| vs diffusers {d:.2e}; FP8 vs dense rel-L2 {apart:.2e}");
    // not vacuous: FP8 moves the output well beyond the f32 parity of the dense model
    assert!(apart > 1e-3, "{apart}");
    assert!(d < 1e-4, "max |diff| {d}");
    // its projections stay as stored under any FP8 schedule and refuse to become dense
    let mut m = m;
    m.set_linears(|_, _| mxattn_fp8::LinearFormat::Fp8(mxattn_fp8::Granularity::Channel))
        .unwrap();
    assert_eq!(m.linear_summary(), "fp8-tensor: 6");
    let e = m
        .set_linears(|_, _| mxattn_fp8::LinearFormat::Dense)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot become dense"), "{e}");
}
