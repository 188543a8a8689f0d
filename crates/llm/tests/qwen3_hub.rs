//! `--model OWNER/NAME` through hf-hub 1.0's local cache (no network): a cache laid out as
//! the Hub client writes it (`models--OWNER--NAME/refs/main` + `snapshots/<commit>/`)
//! holding the sharded tiny fixture. Only with `--features hub`.
#![cfg(feature = "hub")]

use candle_core::{DType, Device, Tensor};
use mxattn_llm::loading::{self, ModelSource};
use mxattn_llm::{CheckpointFiles, ScheduleSpec};
use std::path::Path;

#[test]
fn hub_source_loads_from_the_local_cache() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cache = std::env::temp_dir().join(format!("mxattn-hub-cache-{}", std::process::id()));
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = cache.join("models--mxattn-test--tiny-qwen3");
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    for e in std::fs::read_dir(root.join("tests/fixtures/qwen3/tiny_tied")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, snap.join(p.file_name().unwrap())).unwrap();
    }
    std::fs::copy(
        root.join("tests/fixtures/qwen3_tokenizer/tokenizer.json"),
        snap.join("tokenizer.json"),
    )
    .unwrap();
    // Set before the Hub client reads it (this binary has one test).
    std::env::set_var("HF_HUB_CACHE", &cache);

    let files = CheckpointFiles::from_hub("mxattn-test/tiny-qwen3", None).unwrap();
    assert_eq!(files.component.weights.len(), 4);
    assert!(files.tokenizer.is_some() && files.component.index.is_some());
    let source = ModelSource::Hub {
        repo: "mxattn-test/tiny-qwen3".into(),
        revision: None,
    };
    let spec = ScheduleSpec::parse("exact").unwrap();
    let mut m = loading::open(&source, &spec, DType::F32, &Device::Cpu)
        .unwrap()
        .model;
    let l = m
        .forward_all(&Tensor::new(&[[1u32, 2, 3]], &Device::Cpu).unwrap())
        .unwrap();
    assert_eq!(l.dims(), &[1, 3, 512]);
    let _ = std::fs::remove_dir_all(&cache);
}
