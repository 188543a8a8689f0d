//! Wan VAE decoders: parity with diffusers' `AutoencoderKLWan` on tiny random Wan2.1-like and
//! Wan2.2-like checkpoints (`scripts/gen_wan_vae_fixtures.py`), the frame-count rule, chunked
//! decoding with bounded memory, the mid-attention seam and its wide-head fallback, loading
//! and input errors.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use mxattn::attention::{AttentionConfig, OperandFormat, ProbFormat};
use mxattn::mx::ElemFormat;
use mxattn_wan::vae::blocks::MidAttention;
use mxattn_wan::vae::{exact_attention, expected_tensors, VaeConfig, WanVae, VAE_MID_SITE};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

mod common;
use common::{max_abs_diff, Recorder};

const DEV: Device = Device::Cpu;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan/vae")
}

fn expected(name: &str) -> (Tensor, Tensor) {
    let all =
        candle_core::safetensors::load(fixtures().join("expected.safetensors"), &DEV).unwrap();
    (
        all[&format!("{name}.latents")].clone(),
        all[&format!("{name}.video")].clone(),
    )
}

fn exact() -> AttentionConfig {
    AttentionConfig::exact()
}

fn tiny21() -> VaeConfig {
    VaeConfig::from_file(fixtures().join("wan21/config.json")).unwrap()
}

fn tiny22() -> VaeConfig {
    VaeConfig::from_file(fixtures().join("wan22/config.json")).unwrap()
}

fn parity(name: &str) {
    let vae = WanVae::load(fixtures().join(name), DType::F32, &DEV).unwrap();
    let (z, video) = expected(name);
    let out = vae.decode(&z, &exact()).unwrap();
    let d = max_abs_diff(&out, &video);
    let scale = video
        .abs()
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    println!(
        "{name}: video {:?}, max |diff| = {d:.2e} (mean |x| = {scale:.3})",
        out.dims()
    );
    assert!(
        scale > 0.05,
        "the reference video is nearly zero: a weak test"
    );
    assert!(d < 1e-4, "{name}: max |diff| {d:e} vs diffusers");
}

#[test]
fn wan21_matches_diffusers() {
    parity("wan21");
}

#[test]
fn wan22_matches_diffusers() {
    parity("wan22");
}

/// Pipeline latents are normalised; `decode_normalized` undoes it with the config's mean/std.
#[test]
fn decode_normalized_undoes_the_latent_statistics() {
    for name in ["wan21", "wan22"] {
        let vae = WanVae::load(fixtures().join(name), DType::F32, &DEV).unwrap();
        let cfg = vae.config().clone();
        let (z, video) = expected(name);
        let col = |v: &[f64]| {
            Tensor::from_vec(
                v.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                (1, cfg.z_dim, 1, 1, 1),
                &DEV,
            )
            .unwrap()
        };
        let normed = z
            .broadcast_sub(&col(&cfg.latents_mean))
            .unwrap()
            .broadcast_div(&col(&cfg.latents_std))
            .unwrap();
        let out = vae.decode_normalized(&normed, &exact()).unwrap();
        let d = max_abs_diff(&out, &video);
        assert!(d < 1e-4, "{name}: {d:e}");
        // and without the un-normalisation the video differs
        let wrong = vae.decode(&normed, &exact()).unwrap();
        assert!(max_abs_diff(&wrong, &video) > 1e-2);
    }
}

#[test]
fn frame_count_rule_and_sizes() {
    for (cfg, s) in [(tiny21(), 8), (tiny22(), 16)] {
        assert_eq!(cfg.spatial_factor(), s);
        assert_eq!(cfg.temporal_factor(), 4);
        let vae = WanVae::random(&cfg, DType::F32, &DEV, 7).unwrap();
        for f in 1..=4 {
            let z = Tensor::randn(0f32, 1.0, (1, cfg.z_dim, f, 2, 3), &DEV).unwrap();
            let v = vae.decode(&z, &exact()).unwrap();
            assert_eq!(v.dims(), &[1, 3, 1 + 4 * (f - 1), 2 * s, 3 * s]);
            assert_eq!(cfg.num_frames(f), 1 + 4 * (f - 1));
            let (lo, hi) = (
                v.min_keepdim(0)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .min(0)
                    .unwrap(),
                v.flatten_all().unwrap().max(0).unwrap(),
            );
            assert!(lo.to_scalar::<f32>().unwrap() >= -1.0);
            assert!(hi.to_scalar::<f32>().unwrap() <= 1.0);
        }
    }
    assert_eq!(VaeConfig::wan21().num_frames(21), 81);
    assert_eq!(VaeConfig::wan22().num_frames(31), 121);
    assert_eq!(VaeConfig::wan21().spatial_factor(), 8);
    assert_eq!(VaeConfig::wan22().spatial_factor(), 16);
    assert_eq!(VaeConfig::wan21().mid_channels(), 384);
    assert_eq!(VaeConfig::wan22().mid_channels(), 1024);
}

/// Chunks come out as 1 frame then 4 per latent frame, their concatenation is `decode`, and
/// the cache and the working set do not grow with the video length.
#[test]
fn chunked_decoding_is_streamed_and_bounded() {
    let vae = WanVae::load(fixtures().join("wan22"), DType::F32, &DEV).unwrap();
    let z = Tensor::randn(0f32, 1.0, (1, 6, 6, 2, 2), &DEV).unwrap();
    let mut sizes = Vec::new();
    let mut parts = Vec::new();
    let long = vae
        .decode_chunks(&z, &exact(), |f| {
            sizes.push(f.dim(2)?);
            parts.push(f);
            Ok(())
        })
        .unwrap();
    assert_eq!(sizes, vec![1, 4, 4, 4, 4, 4]);
    assert_eq!(long.frames, 21);
    let joined = Tensor::cat(&parts, 2).unwrap();
    assert_eq!(
        max_abs_diff(&joined, &vae.decode(&z, &exact()).unwrap()),
        0.0
    );
    let short = vae
        .decode_chunks(&z.narrow(2, 0, 3).unwrap(), &exact(), |_| Ok(()))
        .unwrap();
    assert_eq!(short.cache_bytes, long.cache_bytes);
    assert_eq!(short.peak_activation_bytes, long.peak_activation_bytes);
    assert_eq!(short.cache_slots, long.cache_slots);
    assert!(long.cache_bytes > 0 && long.peak_activation_bytes > 0);
    println!("{long:?}");
    // causality: the first 9 frames do not depend on later latent frames
    let head = parts[..3].to_vec();
    let head = Tensor::cat(&head, 2).unwrap();
    let again = vae.decode(&z.narrow(2, 0, 3).unwrap(), &exact()).unwrap();
    assert_eq!(max_abs_diff(&head, &again), 0.0);
}

#[test]
fn batch_decodes_like_single_videos() {
    let vae = WanVae::load(fixtures().join("wan21"), DType::F32, &DEV).unwrap();
    let z = Tensor::randn(0f32, 1.0, (2, 4, 3, 2, 2), &DEV).unwrap();
    let both = vae.decode(&z, &exact()).unwrap();
    for i in 0..2 {
        let one = vae.decode(&z.narrow(0, i, 1).unwrap(), &exact()).unwrap();
        let d = max_abs_diff(&both.narrow(0, i, 1).unwrap(), &one);
        assert!(d < 1e-5, "batch entry {i}: {d:e}");
    }
}

/// Half precision runs (f16 on the CPU; candle's CPU convs have no bf16, which is an error
/// that says so).
#[test]
fn f16_decode_is_close_to_f32() {
    let (z, video) = expected("wan21");
    let vae = WanVae::load(fixtures().join("wan21"), DType::F16, &DEV).unwrap();
    let out = vae.decode(&z, &exact()).unwrap();
    assert_eq!(out.dtype(), DType::F16);
    let d = max_abs_diff(&out.to_dtype(DType::F32).unwrap(), &video);
    assert!(d < 0.05, "f16 vs f32 reference: {d}");
    let e = match WanVae::load(fixtures().join("wan21"), DType::BF16, &DEV) {
        Ok(_) => panic!("bf16 on the CPU should be refused"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("bf16") && e.contains("CPU"), "{e}");
}

fn err_of(r: candle_core::Result<Tensor>) -> String {
    match r {
        Ok(t) => panic!("expected an error, got a tensor {:?}", t.dims()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_latents_are_errors() {
    let vae = WanVae::load(fixtures().join("wan21"), DType::F32, &DEV).unwrap();
    let e = err_of(vae.decode(
        &Tensor::zeros((4, 3, 2, 2), DType::F32, &DEV).unwrap(),
        &exact(),
    ));
    assert!(e.contains("[batch, 4, frames, height, width]"), "{e}");
    let e = err_of(vae.decode(
        &Tensor::zeros((1, 16, 3, 2, 2), DType::F32, &DEV).unwrap(),
        &exact(),
    ));
    assert!(e.contains("16 channels") && e.contains("z_dim 4"), "{e}");
    let e = err_of(vae.decode(
        &Tensor::zeros((1, 4, 0, 2, 2), DType::F32, &DEV).unwrap(),
        &exact(),
    ));
    assert!(e.contains("empty"), "{e}");
    let e = err_of(vae.decode(
        &Tensor::zeros((1, 4, 1, 2, 2), DType::U32, &DEV).unwrap(),
        &exact(),
    ));
    assert!(e.contains("U32"), "{e}");
    let mut v = vec![0f32; 16];
    v[5] = f32::NAN;
    let z = Tensor::from_vec(v, (1, 4, 1, 2, 2), &DEV).unwrap();
    let e = err_of(vae.decode(&z, &exact()));
    assert!(e.contains("NaN") && e.contains("index 5"), "{e}");
    let mut v = vec![0f32; 16];
    v[9] = f32::INFINITY;
    let z = Tensor::from_vec(v, (1, 4, 1, 2, 2), &DEV).unwrap();
    let e = err_of(vae.decode_normalized(&z, &exact()));
    assert!(e.contains("inf") && e.contains("index 9"), "{e}");
}

#[test]
fn mid_attention_asks_the_policy_once_per_chunk() {
    let vae = WanVae::load(fixtures().join("wan21"), DType::F32, &DEV).unwrap();
    let (z, _) = expected("wan21");
    let rec = Recorder::exact();
    vae.decode(&z, &rec).unwrap();
    let sites = rec.sites();
    assert_eq!(sites.len(), z.dim(2).unwrap());
    assert!(sites.iter().all(|s| *s == VAE_MID_SITE));
    assert!(!vae.mid_attention_uses_fallback());
    // a quantized policy reaches the kernel and changes the output
    // (the tiny mid block has 16 channels, under the MX block of 32: bf16 Q/K, FP8 V, MXFP4 P)
    let q = AttentionConfig::exp_then_quantize(
        OperandFormat::Bf16,
        OperandFormat::fp8_per_channel(),
        ProbFormat::mx(ElemFormat::E2M1),
    );
    let a = vae.decode(&z, &exact()).unwrap();
    let b = vae.decode(&z, &q).unwrap();
    let d = max_abs_diff(&a, &b);
    assert!(
        d > 0.0 && d < 0.5,
        "quantized mid attention changed the video by {d}"
    );
    // a config the kernel rejects for this head dim is an error that names the call site
    let mx = AttentionConfig::exp_then_quantize(
        OperandFormat::mx(ElemFormat::E2M1),
        OperandFormat::mx(ElemFormat::E2M1),
        ProbFormat::mx(ElemFormat::E2M1),
    );
    let e = err_of(vae.decode(&z, &mx));
    assert!(e.contains("VAE mid-block attention"), "{e}");
}

fn random_mid(channels: usize, seed: u64) -> MidAttention {
    let mut rng = mxattn::synth::Rng::new(seed);
    let mut t = HashMap::new();
    let mut put = |name: &str, shape: &[usize], std: f64| {
        let n = shape.iter().product();
        t.insert(
            name.to_string(),
            Tensor::from_vec(rng.normals(n, std), shape, &DEV).unwrap(),
        );
    };
    let c = channels;
    put("norm.gamma", &[c, 1, 1], 1.0);
    put("to_qkv.weight", &[3 * c, c, 1, 1], 1.0 / (c as f64).sqrt());
    put("to_qkv.bias", &[3 * c], 0.1);
    put("proj.weight", &[c, c, 1, 1], 1.0 / (c as f64).sqrt());
    put("proj.bias", &[c], 0.1);
    MidAttention::new(c, VarBuilder::from_tensors(t, DType::F32, &DEV)).unwrap()
}

/// The fallback composition is exact attention: it matches mxattn's `Exact` kernel where both
/// apply, and above MAX_HEAD_DIM it runs whatever the policy asks.
#[test]
fn wide_mid_attention_falls_back_to_exact_attention() {
    let q = Tensor::randn(0f32, 1.0, (2, 1, 12, 64), &DEV).unwrap();
    let k = Tensor::randn(0f32, 1.0, (2, 1, 12, 64), &DEV).unwrap();
    let v = Tensor::randn(0f32, 1.0, (2, 1, 12, 64), &DEV).unwrap();
    let a = mxattn::attention::attention(&q, &k, &v, &exact()).unwrap();
    let b = exact_attention(&q, &k, &v, None).unwrap();
    assert!(max_abs_diff(&a, &b) < 1e-5);

    let narrow = random_mid(64, 1);
    assert!(!narrow.uses_fallback());
    let wide = random_mid(520, 2);
    assert!(wide.uses_fallback());
    let x = Tensor::randn(0f32, 1.0, (1, 2, 520, 3, 2), &DEV).unwrap();
    let quant = AttentionConfig::exp_then_quantize(
        OperandFormat::mx(ElemFormat::E4M3),
        OperandFormat::mx(ElemFormat::E4M3),
        ProbFormat::mx(ElemFormat::E4M3),
    );
    let ya = wide.forward(&x, &exact()).unwrap();
    let yb = wide.forward(&x, &quant).unwrap();
    assert_eq!(max_abs_diff(&ya, &yb), 0.0);
    assert_eq!(ya.dims(), x.dims());
    // and the narrow block does apply a quantized policy
    let x = Tensor::randn(0f32, 1.0, (1, 2, 64, 3, 2), &DEV).unwrap();
    let ya = narrow.forward(&x, &exact()).unwrap();
    let yb = narrow.forward(&x, &quant).unwrap();
    assert!(max_abs_diff(&ya, &yb) > 0.0);
}

#[test]
fn expected_tensors_are_exactly_the_decoder_tensors_diffusers_saves() {
    for name in ["wan21", "wan22"] {
        let files = mxattn_wan::vae::find_files(fixtures().join(name)).unwrap();
        let cfg = VaeConfig::from_file(&files.config).unwrap();
        let st = candle_core::safetensors::load(&files.weights[0], &DEV).unwrap();
        let saved: BTreeSet<String> = st.keys().cloned().collect();
        let ours: BTreeSet<String> = expected_tensors(&cfg).into_iter().map(|(n, _)| n).collect();
        assert_eq!(saved, ours, "{name}");
        for (n, shape) in expected_tensors(&cfg) {
            assert_eq!(st[&n].dims(), shape.as_slice(), "{name}: {n}");
        }
    }
}

#[test]
fn presets_validate_and_random_weights_build() {
    assert_eq!(VaeConfig::wan21().validate(), Ok(()));
    assert_eq!(VaeConfig::wan22().validate(), Ok(()));
    let mut bad = tiny21();
    bad.latents_std.pop();
    assert!(bad.validate().unwrap_err().contains("latents_std"));
    let mut bad = tiny21();
    bad.scale_factor_spatial = Some(16);
    assert!(bad.validate().unwrap_err().contains("scale_factor_spatial"));
    let mut bad = tiny22();
    bad.out_channels = 10;
    assert!(bad.validate().unwrap_err().contains("patch_size"));
    assert!(WanVae::random(&bad, DType::F32, &DEV, 0).is_err());
}

/// A copy of a fixture checkpoint in a temp dir, for breaking.
fn scratch(name: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mxattn-wan-vae-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "diffusion_pytorch_model.safetensors"] {
        std::fs::copy(fixtures().join(name).join(f), dir.join(f)).unwrap();
    }
    dir
}

fn load_err(dir: &Path) -> String {
    match WanVae::load(dir, DType::F32, &DEV) {
        Ok(_) => panic!("{}: expected a loading error", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn rewrite(dir: &Path, edit: impl Fn(&mut HashMap<String, Tensor>)) {
    let p = dir.join("diffusion_pytorch_model.safetensors");
    let mut t = candle_core::safetensors::load(&p, &DEV).unwrap();
    edit(&mut t);
    candle_core::safetensors::save(&t, &p).unwrap();
}

#[test]
fn loading_errors_name_the_file_and_tensor() {
    let dir = scratch("wan21", "missing");
    let gone = "decoder.up_blocks.1.upsamplers.0.time_conv.weight";
    rewrite(&dir, |t| {
        t.remove(gone);
    });
    let e = load_err(&dir);
    assert!(e.contains(gone) && e.contains("missing"), "{e}");

    let dir = scratch("wan22", "shape");
    let n = "decoder.mid_block.attentions.0.to_qkv.weight";
    rewrite(&dir, |t| {
        t.insert(
            n.to_string(),
            Tensor::zeros((3, 16, 1, 1), DType::F32, &DEV).unwrap(),
        );
    });
    let e = load_err(&dir);
    assert!(
        e.contains(n) && e.contains("diffusion_pytorch_model.safetensors"),
        "{e}"
    );

    let dir = scratch("wan21", "truncated");
    let p = dir.join("diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 100]).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains("truncated") && e.contains("diffusion_pytorch_model.safetensors"),
        "{e}"
    );

    let dir = scratch("wan21", "config");
    let c = dir.join("config.json");
    let text = std::fs::read_to_string(&c)
        .unwrap()
        .replace("\"z_dim\": 4", "\"z_dim\": 5");
    std::fs::write(&c, text).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains("config.json") && e.contains("latents_mean"),
        "{e}"
    );

    let dir = scratch("wan21", "noweights");
    std::fs::remove_file(dir.join("diffusion_pytorch_model.safetensors")).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("diffusion_pytorch_model.safetensors"), "{e}");
}

/// A pipeline directory with the VAE in `vae/`, sharded with an index.
#[test]
fn loads_sharded_weights_from_a_pipeline_dir() {
    let root = std::env::temp_dir().join(format!("mxattn-wan-vae-pipe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.join("vae");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        fixtures().join("wan22/config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let all = candle_core::safetensors::load(
        fixtures().join("wan22/diffusion_pytorch_model.safetensors"),
        &DEV,
    )
    .unwrap();
    let mut shards: [HashMap<String, Tensor>; 2] = Default::default();
    let mut map = serde_json::Map::new();
    for (i, (k, v)) in all.into_iter().enumerate() {
        let s = i % 2;
        let f = format!("diffusion_pytorch_model-0000{}-of-00002.safetensors", s + 1);
        map.insert(k.clone(), serde_json::Value::String(f));
        shards[s].insert(k, v);
    }
    for (s, t) in shards.iter().enumerate() {
        let f = format!("diffusion_pytorch_model-0000{}-of-00002.safetensors", s + 1);
        candle_core::safetensors::save(t, dir.join(f)).unwrap();
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(
        dir.join("diffusion_pytorch_model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let vae = WanVae::load(&root, DType::F32, &DEV).unwrap();
    let (z, video) = expected("wan22");
    assert!(max_abs_diff(&vae.decode(&z, &exact()).unwrap(), &video) < 1e-4);
}

/// Memory of the released architectures (random weights) on a 4×4 latent, 3 latent frames;
/// activations and cache scale with the latent area. Slow-ish (builds ~100 M parameters):
/// `cargo test --release --test wan_vae -- --ignored --nocapture`.
#[test]
#[ignore]
fn real_architecture_memory_report() {
    for (name, cfg) in [("wan21", VaeConfig::wan21()), ("wan22", VaeConfig::wan22())] {
        let t0 = std::time::Instant::now();
        let vae = WanVae::random(&cfg, DType::F32, &DEV, 1).unwrap();
        let built = t0.elapsed();
        let z = Tensor::randn(0f32, 1.0, (1, cfg.z_dim, 3, 4, 4), &DEV).unwrap();
        let t1 = std::time::Instant::now();
        let stats = vae.decode_chunks(&z, &exact(), |_| Ok(())).unwrap();
        let area_720p = (720 / cfg.spatial_factor()) * (1280 / cfg.spatial_factor());
        let k = area_720p as f64 / 16.0;
        println!(
            "{name}: built in {built:.1?}, decoded 3 latent frames of 4x4 in {:.1?}: {stats:?}; \
             at 1280x720 (latent area x{k:.0}): peak activation {:.0} MiB, cache {:.0} MiB",
            t1.elapsed(),
            stats.peak_activation_bytes as f64 * k / (1 << 20) as f64,
            stats.cache_bytes as f64 * k / (1 << 20) as f64,
        );
        assert_eq!(stats.frames, 9);
    }
}

/// Decoded chunks go straight into the video writers, frame by frame.
#[test]
fn decoded_chunks_stream_into_an_mp4_and_a_gif() {
    use mxattn_video::{GifWriter, Mp4Writer};
    let vae = WanVae::load(fixtures().join("wan22"), DType::F32, &DEV).unwrap();
    let (z, video) = expected("wan22");
    let (h, w) = (video.dim(3).unwrap(), video.dim(4).unwrap());
    let dir = std::env::temp_dir().join(format!("mxattn-wan-vae-video-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut mp4 = Mp4Writer::create(dir.join("vae.mp4"), w, h, 16.0).unwrap();
    let mut gif = GifWriter::create(dir.join("vae.gif"), w, h, 16.0).unwrap();
    vae.decode_chunks(&z, &exact(), |frames| {
        mp4.push_tensor(&frames)?;
        gif.push_tensor(&frames)
    })
    .unwrap();
    let summary = mp4.finish().unwrap();
    assert_eq!((summary.frames, summary.width, summary.height), (9, w, h));
    assert_eq!(gif.finish().unwrap(), 9);
}
