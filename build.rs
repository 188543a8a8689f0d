//! With the `cuda` feature: compiles `kernels/*.cu` with nvcc into a static library of
//! `extern "C"` launchers (src/cuda/ffi.rs) and links the CUDA runtime.
//!
//! * nvcc comes from `NVCC`, else `CUDA_HOME/bin`, else `PATH` (scripts/setup_cuda.sh sets
//!   up a toolkit from NVIDIA's pip wheels where there is none).
//! * The GPU architectures come from `MXATTN_CUDA_ARCHS` (several at once: `80,89,90a`), else
//!   from `CUDA_COMPUTE_CAP` (candle's variable, one value: `90`), else from the GPU
//!   `nvidia-smi` reports, else 90a (H100/H200).
//!   Each gets its machine code; the newest also gets PTX, so a newer GPU can JIT it. `90`
//!   means `90a`, the Hopper variant with wgmma. The wgmma kernel exists only in sm_90a code
//!   and is chosen at run time only there; every other GPU runs the `mma.sync` and portable
//!   kernels. The kernels need compute capability 8.0 or newer (bf16 `mma.sync`, `cp.async`).
//! * nvcc runs once per source file, in parallel (cargo's job count).
//! * The parameter blocks shared with the kernels (`src/cuda/ffi.rs` ↔ `kernels/*_params.h`)
//!   are checked field by field at build time ([`abi_check_source`]).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Sources whose arithmetic must match the CPU reference op for op: no contraction of
/// a*b+c into FMA.
const NO_FMA: &[&str] = &[
    "mx_quantize.cu",
    "attention_simple.cu",
    "attention_wgmma_pack.cu",
    "fp8_quantize.cu",
];

/// One target: the compute capability as a number (90) and whether it is the
/// architecture-specific variant (`90a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Arch {
    cc: u32,
    specific: bool,
}

impl Arch {
    fn name(&self) -> String {
        format!("{}{}", self.cc, if self.specific { "a" } else { "" })
    }
}

/// `90`, `90a`, `sm_90`, `9.0`, `8.9` → an [`Arch`]; 90 becomes 90a (wgmma).
fn parse_arch(tok: &str) -> Result<Arch, String> {
    let t = tok.trim().to_ascii_lowercase();
    let t = t
        .strip_prefix("sm_")
        .or_else(|| t.strip_prefix("compute_"))
        .unwrap_or(&t);
    let (digits, specific) = match t.strip_suffix('a') {
        Some(d) => (d, true),
        None => (t, false),
    };
    let cc: u32 = match digits.split_once('.') {
        Some((maj, min)) => maj
            .parse::<u32>()
            .ok()
            .zip(min.parse::<u32>().ok())
            .map(|(a, b)| 10 * a + b),
        None => digits.parse().ok(),
    }
    .ok_or_else(|| format!("{tok:?} is not a compute capability (e.g. 80, 89, 90a, 8.9)"))?;
    if cc < 80 {
        return Err(format!(
            "compute capability {tok:?}: mxattn's kernels need 8.0 or newer (bf16 mma.sync, cp.async)"
        ));
    }
    Ok(Arch {
        cc,
        specific: specific || cc == 90,
    })
}

fn archs() -> Vec<Arch> {
    let var = |k: &str| env::var(k).ok().filter(|s| !s.trim().is_empty());
    let from_env = var("MXATTN_CUDA_ARCHS").or_else(|| var("CUDA_COMPUTE_CAP"));
    let detected = || {
        let out = Command::new("nvidia-smi")
            .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
            .output()
            .ok()?;
        let s = String::from_utf8(out.stdout).ok()?;
        let first = s.lines().next()?.trim().to_string();
        (!first.is_empty()).then_some(first)
    };
    let list = from_env
        .or_else(detected)
        .unwrap_or_else(|| "90a".to_string());
    let mut v: Vec<Arch> = list
        .split(|c: char| c == ',' || c == ';' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| {
            parse_arch(t).unwrap_or_else(|e| panic!("MXATTN_CUDA_ARCHS / CUDA_COMPUTE_CAP: {e}"))
        })
        .collect();
    v.sort();
    v.dedup();
    assert!(
        !v.is_empty(),
        "MXATTN_CUDA_ARCHS / CUDA_COMPUTE_CAP {list:?} names no architecture"
    );
    v
}

/// The `#[repr(C)]` structs `src/cuda/ffi.rs` shares with the kernels, and the header that
/// declares each on the C side.
const SHARED_STRUCTS: &[(&str, &str)] = &[
    ("OperandFmt", "attention_params.h"),
    ("AttnParams", "attention_params.h"),
    ("DecodeParams", "decode_params.h"),
];

/// Size and alignment of a field type as `#[repr(C)]` lays it out on a 64-bit target.
fn type_layout(ty: &str, known: &[(String, usize, usize)]) -> (usize, usize) {
    let ty = ty.trim();
    if let Some(inner) = ty.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        let (elem, n) = inner.split_once(';').expect("[T; N]");
        let (size, align) = type_layout(elem, known);
        return (
            size * n.trim().parse::<usize>().expect("array length"),
            align,
        );
    }
    if ty.starts_with("*const") || ty.starts_with("*mut") {
        return (8, 8);
    }
    match ty {
        "i32" | "u32" | "f32" => (4, 4),
        "i64" | "u64" | "f64" => (8, 8),
        "u8" | "i8" => (1, 1),
        other => known
            .iter()
            .find(|(n, _, _)| n == other)
            .map(|(_, s, a)| (*s, *a))
            .unwrap_or_else(|| panic!("ffi.rs: field type {other} has no known C layout")),
    }
}

/// `static_assert`s of every field offset and the size of the shared structs, computed from
/// their Rust declarations: a field added, removed, renamed, retyped or moved on one side only
/// fails the build (checked by nvcc against the C headers).
fn abi_check_source() -> String {
    let rust = std::fs::read_to_string("src/cuda/ffi.rs").expect("src/cuda/ffi.rs");
    let mut known: Vec<(String, usize, usize)> = Vec::new();
    let mut out = String::from(
        "// Generated by build.rs from src/cuda/ffi.rs: the C layout must equal the Rust one.\n\
         #include <stddef.h>\n",
    );
    for (name, header) in SHARED_STRUCTS {
        out.push_str(&format!("#include \"{header}\"\n"));
        let start = rust
            .find(&format!("pub struct {name} {{"))
            .unwrap_or_else(|| panic!("ffi.rs: no struct {name}"));
        let body = &rust[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find("\n}").unwrap()];
        let (mut offset, mut max_align) = (0usize, 1usize);
        for line in body.lines() {
            let line = line.trim();
            let Some(field) = line.strip_prefix("pub ") else {
                continue;
            };
            let (fname, ty) = field.split_once(':').expect("field: type");
            let (size, align) = type_layout(ty.trim_end_matches(','), &known);
            offset = offset.div_ceil(align) * align;
            out.push_str(&format!(
                "static_assert(offsetof({name}, {f}) == {offset}, \"{name}.{f}: the C offset differs from src/cuda/ffi.rs ({offset})\");\n",
                f = fname.trim()
            ));
            offset += size;
            max_align = max_align.max(align);
        }
        let size = offset.div_ceil(max_align) * max_align;
        out.push_str(&format!(
            "static_assert(sizeof({name}) == {size}, \"sizeof({name}): C and src/cuda/ffi.rs differ ({size})\");\n"
        ));
        known.push((name.to_string(), size, max_align));
    }
    out
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=src/cuda/ffi.rs");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=MXATTN_CUDA_ARCHS");
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
    let archs = archs();
    let mut gencode: Vec<String> = archs
        .iter()
        .map(|a| format!("-gencode=arch=compute_{0},code=sm_{0}", a.name()))
        .collect();
    // PTX of the newest architecture without its `a` features: newer GPUs JIT it.
    let newest = archs.iter().map(|a| a.cc).max().expect("one arch");
    gencode.push(format!(
        "-gencode=arch=compute_{newest},code=compute_{newest}"
    ));
    let have_sm90a = archs.iter().any(|a| a.cc == 90 && a.specific);
    println!(
        "cargo:warning=mxattn kernels for {} (+ PTX compute_{newest}){}",
        archs.iter().map(Arch::name).collect::<Vec<_>>().join(", "),
        if have_sm90a {
            ""
        } else {
            "; no sm_90a: the wgmma kernel is left out"
        }
    );

    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let mut sources: Vec<PathBuf> = std::fs::read_dir("kernels")
        .expect("kernels/ folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    // The layout check compiles with the kernels (an empty object when it holds).
    let abi = out.join("abi_check.cu");
    std::fs::write(&abi, abi_check_source()).expect("writing abi_check.cu");
    sources.push(abi);
    let compile = |src: &PathBuf| -> PathBuf {
        let name = src.file_name().unwrap().to_string_lossy().to_string();
        let obj = out.join(format!("{name}.o"));
        let mut cmd = Command::new(&nvcc);
        cmd.args(["-c", "-O3", "-std=c++17"]).args(&gencode).args([
            "-Xcompiler",
            "-fPIC",
            "-Ikernels",
            "-lineinfo",
        ]);
        if have_sm90a {
            cmd.arg("-DMXA_HAVE_SM90A=1");
        }
        if NO_FMA.contains(&name.as_str()) {
            cmd.arg("-fmad=false");
        }
        cmd.arg("-o").arg(&obj).arg(src);
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("running {nvcc}: {e} (set NVCC or CUDA_HOME)"));
        assert!(status.success(), "nvcc failed on {}", src.display());
        obj
    };
    // One nvcc per source, as many at once as cargo allows.
    let jobs: usize = env::var("NUM_JOBS")
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or(1)
        .max(1);
    // Workers take the next source until none is left; the archive keeps the sorted order.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut objects: Vec<(usize, PathBuf)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..jobs.min(sources.len()))
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(src) = sources.get(i) else {
                            break done;
                        };
                        done.push((i, compile(src)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("an nvcc worker panicked"))
            .collect()
    });
    objects.sort();
    let objects: Vec<PathBuf> = objects.into_iter().map(|(_, o)| o).collect();

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
