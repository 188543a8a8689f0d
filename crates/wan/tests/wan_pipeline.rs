//! The whole Wan pipeline against diffusers' `WanPipeline` on a tiny random A14B-like model
//! (two experts, UMT5, Wan2.1 VAE, UniPC), made by `scripts/gen_wan_pipeline_fixtures.py`:
//! the same initial latents give the same latents after every step and the same video; the
//! example writes a valid MP4.

use candle_core::{DType, Device, Tensor};
use mxattn::attention::AttentionConfig;
use mxattn_wan::pipeline::{GenerateOptions, WanPipeline};
use mxattn_wan::schedule::ScheduleSpec;
use mxattn_wan::scheduler::SamplerKind;
use mxattn_wan::AttnKind;
use std::collections::HashMap;
use std::path::PathBuf;

mod common;
use common::{max_abs_diff, Recorder};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan")
}

struct Expected {
    tensors: HashMap<String, Tensor>,
    json: serde_json::Value,
}

fn expected() -> Expected {
    let tensors = candle_core::safetensors::load(
        fixtures().join("pipeline_expected.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let json = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("pipeline_expected.json")).unwrap(),
    )
    .unwrap();
    Expected { tensors, json }
}

fn options(e: &Expected) -> GenerateOptions {
    let j = &e.json;
    let init = &e.tensors["latents_init"];
    let (_, _, f, h, w) = init.dims5().unwrap();
    let s = 8; // the tiny Wan2.1 VAE's spatial stride
    GenerateOptions {
        prompt: j["prompt"].as_str().unwrap().to_string(),
        negative_prompt: j["negative_prompt"].as_str().unwrap().to_string(),
        width: w * s,
        height: h * s,
        frames: 1 + 4 * (f - 1),
        steps: j["num_inference_steps"].as_u64().unwrap() as usize,
        guidance_high: j["guidance_scale"].as_f64().unwrap(),
        guidance_low: j["guidance_scale_2"].as_f64().unwrap(),
        shift: None,
        sampler: SamplerKind::UniPc,
        seed: 0,
    }
}

fn load() -> WanPipeline {
    let e = expected();
    let n = e.json["max_sequence_length"].as_u64().unwrap() as usize;
    let mut p = WanPipeline::load(
        fixtures().join("pipeline"),
        DType::F32,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    p.set_max_sequence_length(n).unwrap();
    p
}

#[test]
fn tiny_pipeline_matches_diffusers_step_by_step() {
    let e = expected();
    let pipe = load();
    assert_eq!(pipe.experts.len(), 2);
    assert_eq!(
        pipe.boundary_ratio,
        e.json["boundary_ratio"].as_f64(),
        "model_index.json boundary_ratio"
    );
    let o = options(&e);
    let (cond, uncond) = pipe.encode_prompts(&o).unwrap();
    // the text the transformers see: cleaned, tokenized, encoded, trimmed and zero-padded
    let d = max_abs_diff(&cond, &e.tensors["prompt_embeds"]);
    assert!(d < 1e-5, "prompt embeddings: {d:e}");
    let d = max_abs_diff(
        uncond.as_ref().unwrap(),
        &e.tensors["negative_prompt_embeds"],
    );
    assert!(d < 1e-5, "negative prompt embeddings: {d:e}");
    let sch = pipe.scheduler(&o).unwrap();
    let want_ts: Vec<f64> = e.json["timesteps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_f64().unwrap())
        .collect();
    assert_eq!(sch.timesteps(), want_ts.as_slice());
    let want_experts: Vec<usize> = e.json["expert_per_step"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    let exact = AttentionConfig::exact();
    let mut worst = 0f32;
    let mut experts = Vec::new();
    let fin = pipe
        .denoise(
            &o,
            e.tensors["latents_init"].clone(),
            &cond,
            uncond.as_ref(),
            &exact,
            |info, x| {
                let want = &e.tensors[&format!("latents_step{}", info.step)];
                let d = max_abs_diff(x, want);
                worst = worst.max(d);
                assert!(d < 1e-4, "step {}: max diff {d:e}", info.step);
                experts.push(info.expert);
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(experts, want_experts, "expert of each step");
    assert!(
        experts.contains(&0) && experts.contains(&1),
        "the fixture must exercise both experts"
    );
    let d = max_abs_diff(&fin, &e.tensors["latents_final"]);
    assert!(d < 1e-4, "final latents: {d:e}");
    // the video
    let mut frames = Vec::new();
    pipe.decode(&fin, &exact, |t| {
        frames.push(t);
        Ok(())
    })
    .unwrap();
    let video = Tensor::cat(&frames, 2).unwrap();
    let want = &e.tensors["video"];
    assert_eq!(video.dims(), want.dims());
    let d = max_abs_diff(&video, want);
    assert!(d < 1e-4, "video: {d:e}");
    println!("worst step diff {worst:e}, video {d:e}");
}

#[test]
fn schedules_see_every_site_and_quantized_runs_stay_finite() {
    let e = expected();
    let pipe = load();
    let o = options(&e);
    let (cond, uncond) = pipe.encode_prompts(&o).unwrap();
    let rec = Recorder::exact();
    pipe.denoise(
        &o,
        e.tensors["latents_init"].clone(),
        &cond,
        uncond.as_ref(),
        &rec,
        |_, _| Ok(()),
    )
    .unwrap();
    let sites = rec.sites();
    let layers = pipe.experts[0].config().num_layers;
    // steps × (cond + uncond) × layers × (self + cross)
    assert_eq!(sites.len(), o.steps * 2 * layers * 2);
    for kind in [AttnKind::SelfAttn, AttnKind::CrossAttn] {
        assert!(sites.iter().any(|s| s.kind == kind));
    }
    // a quantized schedule changes the result but keeps it finite
    let hybrid = ScheduleSpec::parse("hybrid-fused")
        .unwrap()
        .resolve(o.steps, layers)
        .unwrap();
    let q = pipe
        .denoise(
            &o,
            e.tensors["latents_init"].clone(),
            &cond,
            uncond.as_ref(),
            &hybrid,
            |_, _| Ok(()),
        )
        .unwrap();
    let v: Vec<f32> = q.flatten_all().unwrap().to_vec1().unwrap();
    assert!(v.iter().all(|x| x.is_finite()));
    let d = max_abs_diff(&q, &e.tensors["latents_final"]);
    assert!(
        d > 1e-5,
        "the quantized schedule must differ from exact ({d:e})"
    );
    // bounded by what the formats allow: each step's prediction moves by at most the
    // rounding budget of the coarsest config the schedule runs (mxattn::oracle), and since
    // the flow sigmas fall from 1 to 0 the steps' moves add up to at most one prediction's
    let fin = &e.tensors["latents_final"];
    let rel = mxattn_wan::fidelity::rel_l2(&q, fin).unwrap();
    let budget = ["fused-mxfp6", "fused-mxfp4"]
        .iter()
        .map(|n| {
            mxattn::oracle::rounding_budget(&mxattn_wan::schedule::attention_config(n).unwrap())
        })
        .fold(0f64, f64::max);
    println!("hybrid-fused: relative change of the final latents {rel:.3e}, budget {budget:.3e}");
    assert!(rel <= budget, "{rel:.3e} > {budget:.3e}");
}

#[test]
fn bad_requests_are_errors() {
    let e = expected();
    let pipe = load();
    let mut o = options(&e);
    o.frames = 4;
    assert!(pipe.latent_dims(&o).is_err(), "frames must be 4k+1");
    let mut o = options(&e);
    o.width = 20;
    assert!(pipe.latent_dims(&o).is_err(), "width not a multiple of 16");
    let o = options(&e);
    let (cond, uncond) = pipe.encode_prompts(&o).unwrap();
    let wrong = Tensor::zeros((1, 4, 1, 2, 2), DType::F32, &Device::Cpu).unwrap();
    let r = pipe.denoise(
        &o,
        wrong,
        &cond,
        uncond.as_ref(),
        &AttentionConfig::exact(),
        |_, _| Ok(()),
    );
    assert!(r.is_err(), "latents of the wrong shape");
    let mut o = options(&e);
    o.shift = Some(-1.0);
    assert!(pipe.scheduler(&o).is_err());
    assert!(WanPipeline::load(
        fixtures().join("nope"),
        DType::F32,
        DType::F32,
        &Device::Cpu
    )
    .is_err());
}

#[test]
fn tiny_pipeline_streams_a_playable_mp4() {
    use mxattn_video::Mp4Writer;
    let e = expected();
    let pipe = load();
    let o = options(&e);
    let (cond, uncond) = pipe.encode_prompts(&o).unwrap();
    let fin = pipe
        .denoise(
            &o,
            pipe.initial_latents(&o).unwrap(),
            &cond,
            uncond.as_ref(),
            &AttentionConfig::exact(),
            |_, _| Ok(()),
        )
        .unwrap();
    let path = std::env::temp_dir().join(format!("mxattn-wan-pipeline-{}.mp4", std::process::id()));
    let mut w = Mp4Writer::create(&path, o.width, o.height, 16.0).unwrap();
    let stats = pipe
        .decode(&fin, &AttentionConfig::exact(), |t| w.push_tensor(&t))
        .unwrap();
    let summary = w.finish().unwrap();
    assert_eq!(stats.frames, o.frames);
    assert_eq!(summary.frames, o.frames);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let size = bytes.len() as u64;
    let mp4 = mp4::Mp4Reader::read_header(std::io::Cursor::new(bytes), size).unwrap();
    let track = mp4.tracks().values().next().unwrap();
    assert_eq!(track.media_type().unwrap(), mp4::MediaType::H264);
    assert_eq!(track.sample_count() as usize, o.frames);
    assert_eq!(
        (track.width() as usize, track.height() as usize),
        (o.width, o.height)
    );
}

/// `generate` is the pipeline's steps joined: its latents equal encode → seeded initial
/// latents → denoise run by hand, its frames equal `decode`'s, and it reports the plan, the
/// text encoding, every step and every frame chunk, in that order.
#[test]
fn generate_runs_the_pipeline_and_reports_in_order() {
    use mxattn_video::RgbFrames;
    use mxattn_wan::generate::{Event, Request};
    let e = expected();
    let pipe = load();
    let o = options(&e);
    let schedule = ScheduleSpec::parse("hybrid").unwrap();
    let req = Request {
        options: o.clone(),
        schedule: schedule.clone(),
        decode: true,
    };
    let mut log: Vec<String> = Vec::new();
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let g = pipe
        .generate(&req, |ev| {
            log.push(match ev {
                Event::Planned(p) => format!("plan {}", p.switch_step),
                Event::TextEncoded { .. } => "text".into(),
                Event::Step(s) => format!("step {} expert {}", s.step, s.expert),
                Event::Frames(f) => {
                    frames.extend(f.frames.iter().cloned());
                    "frames".into()
                }
            });
            Ok(())
        })
        .unwrap();
    // by hand
    let resolved = schedule
        .resolve(o.steps, pipe.experts[0].config().num_layers)
        .unwrap();
    let (cond, uncond) = pipe.encode_prompts(&o).unwrap();
    let init = pipe.initial_latents(&o).unwrap();
    let want = pipe
        .denoise(&o, init, &cond, uncond.as_ref(), &resolved, |_, _| Ok(()))
        .unwrap();
    assert_eq!(max_abs_diff(&g.latents, &want), 0.0);
    let mut want_frames = Vec::new();
    pipe.decode(&want, &resolved, |t| {
        want_frames.extend(RgbFrames::from_tensor(&t)?.frames);
        Ok(())
    })
    .unwrap();
    assert_eq!(frames, want_frames);
    assert_eq!(frames.len(), o.frames);
    // the event order
    let switch = g.plan.switch_step;
    let mut expect = vec![format!("plan {switch}"), "text".to_string()];
    for s in 0..o.steps {
        expect.push(format!("step {s} expert {}", usize::from(s >= switch)));
    }
    let chunks = log.len() - expect.len();
    assert_eq!(
        chunks, g.plan.latent_dims.2,
        "one frame chunk per latent frame"
    );
    expect.extend(std::iter::repeat_n("frames".to_string(), chunks));
    assert_eq!(log, expect);
    assert_eq!(g.steps.len(), o.steps);
    assert!(g.decode.is_some() && g.frames_hash.is_some());
    // without decoding: no frames, the same latents
    let g2 = pipe
        .generate(
            &Request {
                decode: false,
                ..req
            },
            |ev| match ev {
                Event::Frames(_) => panic!("no decode was asked for"),
                _ => Ok(()),
            },
        )
        .unwrap();
    assert_eq!(g2.latents_hash, g.latents_hash);
    assert!(g2.decode.is_none() && g2.frames_hash.is_none());
}
