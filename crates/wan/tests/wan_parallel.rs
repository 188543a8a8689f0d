//! The pipeline on several ranks (threads with `mxattn_dist::ThreadComm`, the CPU stand-in
//! for NCCL) against one process: Ulysses sequence parallelism over 2, 3 and 4 ranks
//! (30 tokens: 4 ranks pad them to 32), CFG parallelism over 2, and both (2 × 2). Every rank must hold the
//! single-process latents after every step, and the leader's decoded video must be the
//! single-process video, up to f32 summation order; a quantized schedule runs unchanged.

use candle_core::{DType, Device, Tensor};
use mxattn_dist::{Communicator, Layout};
use mxattn_wan::pipeline::{GenerateOptions, Parallel, WanPipeline};
use mxattn_wan::schedule::ScheduleSpec;
use mxattn_wan::scheduler::SamplerKind;
use mxattn_wan::transformer::{TransformerConfig, WanTransformer};
use std::path::PathBuf;
use std::sync::Arc;

mod common;
use common::max_abs_diff;

/// The tiny fixture pipeline (UMT5, Wan2.1 VAE, UniPC, two experts) with its experts
/// replaced by random ones of 12 heads of 32 (MX blocks need a head dim of 32), so 2, 3 and 4
/// ranks each take whole heads.
fn pipeline() -> WanPipeline {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan/pipeline");
    let mut p = WanPipeline::load(dir, DType::F32, DType::F32, &Device::Cpu).unwrap();
    p.set_max_sequence_length(32).unwrap();
    let cfg = TransformerConfig {
        num_attention_heads: 12,
        attention_head_dim: 32,
        ..p.experts[0].config().clone()
    };
    p.experts = (0..2)
        .map(|i| WanTransformer::random(&cfg, DType::F32, &Device::Cpu, 7 + i).unwrap())
        .collect();
    p
}

fn options() -> GenerateOptions {
    GenerateOptions {
        prompt: "a red fox running through snow".into(),
        negative_prompt: "blurry, low quality".into(),
        // 10 × 6 latents, 2 × 2 patches, 2 latent frames: 30 tokens (4 ranks pad to 32)
        width: 80,
        height: 48,
        frames: 5,
        steps: 4,
        guidance_high: 4.0,
        guidance_low: 3.0,
        shift: None,
        sampler: SamplerKind::UniPc,
        seed: 3,
    }
}

/// Latents after every step and, on the leader, the decoded video.
fn run(p: &WanPipeline, schedule: &str) -> (Vec<Tensor>, Option<Tensor>) {
    let o = options();
    let sched = ScheduleSpec::parse(schedule)
        .unwrap()
        .resolve(o.steps, p.experts[0].config().num_layers)
        .unwrap();
    let (cond, uncond) = p.encode_prompts(&o).unwrap();
    let mut steps = vec![];
    let fin = p
        .denoise(
            &o,
            p.initial_latents(&o).unwrap(),
            &cond,
            uncond.as_ref(),
            &sched,
            |_, x| {
                steps.push(x.clone());
                Ok(())
            },
        )
        .unwrap();
    let video = p.is_leader().then(|| {
        let mut frames = vec![];
        p.decode(&fin, &sched, |t| {
            frames.push(t);
            Ok(())
        })
        .unwrap();
        Tensor::cat(&frames, 2).unwrap()
    });
    (steps, video)
}

fn parallel_runs(layout: Layout, schedule: &'static str) -> Vec<(Vec<Tensor>, Option<Tensor>)> {
    let handles: Vec<_> = layout
        .thread_groups()
        .into_iter()
        .map(|(sp, cfg)| {
            std::thread::spawn(move || {
                let mut p = pipeline();
                let (sp, cfg): (Arc<dyn Communicator>, Arc<dyn Communicator>) =
                    (Arc::new(sp), Arc::new(cfg));
                p.set_parallel(Parallel {
                    sp: Some(sp),
                    cfg: Some(cfg),
                })
                .unwrap();
                run(&p, schedule)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Exact attention: every rank's latents equal the single process's up to f32 summation
/// order (CPU matmuls of fewer rows round differently in the last bits: 1e-5 of the
/// latents' scale). A quantized schedule (`hybrid`: MXFP6/MXFP4) turns such a last-bit
/// difference into a flipped code now and then, so its parallel run is another draw of the
/// config's quantization error e: with |e| the single run's distance from the exact run,
/// two draws lie within 2|e| (+ the exact tolerance) of each other, at every step.
#[test]
fn parallel_pipelines_match_one_process() {
    let (exact, _) = run(&pipeline(), "exact");
    for schedule in ["exact", "hybrid"] {
        let (want, want_video) = run(&pipeline(), schedule);
        let want_video = want_video.unwrap();
        let scale = want
            .last()
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let bound: Vec<f32> = if schedule == "exact" {
            vec![1e-5 * scale; want.len()]
        } else {
            want.iter()
                .zip(&exact)
                .map(|(q, e)| 2.0 * max_abs_diff(q, e) + 1e-5 * scale)
                .collect()
        };
        println!("{schedule}: per-step bounds {bound:?}");
        for (cfg_par, world) in [(false, 2), (false, 3), (false, 4), (true, 2), (true, 4)] {
            let layout = Layout::new(world, cfg_par).unwrap();
            let runs = parallel_runs(layout, schedule);
            let mut worst = 0f32;
            let mut leaders = 0;
            for (rank, (steps, video)) in runs.iter().enumerate() {
                assert_eq!(steps.len(), want.len());
                for (i, (a, b)) in steps.iter().zip(&want).enumerate() {
                    let d = max_abs_diff(a, b);
                    worst = worst.max(d);
                    assert!(
                        d <= bound[i],
                        "{schedule} {layout:?} rank {rank} step {i}: {d:e} > {:e}",
                        bound[i]
                    );
                }
                if let Some(v) = video {
                    leaders += 1;
                    let d = max_abs_diff(v, &want_video);
                    let vb = if schedule == "exact" { 1e-4 } else { 2e-2 };
                    assert!(d <= vb, "{schedule} {layout:?} video: {d:e}");
                }
            }
            assert_eq!(leaders, 1, "one rank decodes");
            println!("{schedule} {layout:?}: worst step difference {worst:e}");
        }
    }
}

/// Heads that do not split over the ranks are a clear error, before any work.
#[test]
fn heads_must_divide_the_ranks() {
    let mut p = pipeline();
    let comm: Arc<dyn Communicator> = Arc::new(mxattn_dist::ThreadComm::group(5).remove(0));
    let e = p
        .set_parallel(Parallel {
            sp: Some(comm),
            cfg: None,
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("5 ranks splits the 12 attention heads"), "{e}");
}
