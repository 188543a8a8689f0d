//! With the `cuda` feature: compiles `kernels/*.cu` with nvcc for sm_90a (H100/H200) into
//! a static library of `extern "C"` launchers (src/cuda/ffi.rs) and links the CUDA runtime.
//! nvcc comes from `NVCC`, else `CUDA_HOME/bin`, else `PATH` (scripts/setup_cuda.sh sets
//! up a toolkit from NVIDIA's pip wheels where there is none).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Sources whose arithmetic must match the CPU reference op for op: no contraction of
/// a*b+c into FMA.
const NO_FMA: &[&str] = &[
    "mx_quantize.cu",
    "attention_simple.cu",
    "attention_wgmma_pack.cu",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let cuda_home = env::var("CUDA_HOME")
        .or_else(|_| env::var("CUDA_PATH"))
        .ok();
    let nvcc = env::var("NVCC").ok().or_else(|| {
        cuda_home
            .as_ref()
            .map(|h| format!("{h}/bin/nvcc"))
            .filter(|p| Path::new(p).exists())
    });
    let nvcc = nvcc.unwrap_or_else(|| "nvcc".to_string());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let mut sources: Vec<PathBuf> = std::fs::read_dir("kernels")
        .expect("kernels/ folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    let mut objects = vec![];
    for src in &sources {
        let name = src.file_name().unwrap().to_string_lossy().to_string();
        let obj = out.join(format!("{name}.o"));
        let mut cmd = Command::new(&nvcc);
        cmd.args([
            "-c",
            "-O3",
            "-std=c++17",
            "-gencode=arch=compute_90a,code=sm_90a",
            "-Xcompiler",
            "-fPIC",
            "-Ikernels",
            "-lineinfo",
        ]);
        if NO_FMA.contains(&name.as_str()) {
            cmd.arg("-fmad=false");
        }
        cmd.arg("-o").arg(&obj).arg(src);
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("running {nvcc}: {e} (set NVCC or CUDA_HOME)"));
        assert!(status.success(), "nvcc failed on {}", src.display());
        objects.push(obj);
    }
    let lib = out.join("libmxattn_kernels.a");
    let _ = std::fs::remove_file(&lib);
    let status = Command::new("ar")
        .arg("rcs")
        .arg(&lib)
        .args(&objects)
        .status()
        .expect("running ar");
    assert!(status.success(), "ar failed");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=mxattn_kernels");
    if let Some(h) = &cuda_home {
        for d in ["lib", "lib64", "lib/x64"] {
            if Path::new(h).join(d).exists() {
                println!("cargo:rustc-link-search=native={h}/{d}");
            }
        }
    }
    println!("cargo:rustc-link-lib=dylib=cudart");
    println!("cargo:rustc-link-lib=dylib=stdc++");
}
