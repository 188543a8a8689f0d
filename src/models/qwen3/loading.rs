//! Finding, checking and loading Qwen3 checkpoints.
//!
//! A checkpoint directory holds `config.json`, usually `tokenizer.json`, and the weights
//! as `model.safetensors` or as shards listed by `model.safetensors.index.json`. Before
//! the weights are mapped, [`check_checkpoint`] opens every file and compares each tensor
//! the config implies with what the files hold, so a truncated file, a missing tensor, a
//! wrong shape or an index that points at the wrong shard is an error naming the file and
//! the tensor (candle's own messages name only one of the two).

use super::config::Config;
use super::model::Qwen3;
use super::schedule::Schedule;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{bail, DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use safetensors::Dtype as StDtype;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The files of one checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointFiles {
    pub config: PathBuf,
    pub tokenizer: Option<PathBuf>,
    /// Safetensors files, in index order (or the single file).
    pub weights: Vec<PathBuf>,
    /// `model.safetensors.index.json` when the checkpoint is sharded.
    pub index: Option<PathBuf>,
}

fn msg(s: String) -> candle_core::Error {
    candle_core::Error::Msg(s)
}

/// tensor name → shard file name, from an index file.
/// The index `index_path` (its weight map `map`) must place tensor `name`, found in `file`, in
/// that file.
pub(crate) fn check_index_entry(
    index_path: &Path,
    map: &BTreeMap<String, String>,
    name: &str,
    file: &Path,
) -> Result<()> {
    let fname = file.file_name().and_then(|s| s.to_str()).unwrap_or("");
    match map.get(name) {
        Some(shard) if shard == fname => Ok(()),
        Some(shard) => bail!(
            "{}: maps tensor {name} to {shard}, but it is in {}",
            index_path.display(),
            file.display()
        ),
        None => bail!(
            "{}: does not list tensor {name} (found in {})",
            index_path.display(),
            file.display()
        ),
    }
}

pub(crate) fn read_index(path: &Path) -> Result<BTreeMap<String, String>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| msg(format!("{}: {e}", path.display())))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| msg(format!("{}: not valid JSON: {e}", path.display())))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| msg(format!("{}: no \"weight_map\" object", path.display())))?;
    let mut out = BTreeMap::new();
    for (k, f) in map {
        let f = f.as_str().ok_or_else(|| {
            msg(format!(
                "{}: weight_map[{k:?}] is not a file name",
                path.display()
            ))
        })?;
        out.insert(k.clone(), f.to_string());
    }
    Ok(out)
}

impl CheckpointFiles {
    /// The files of a local checkpoint directory.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            bail!("{}: not a directory", dir.display());
        }
        let config = dir.join("config.json");
        if !config.is_file() {
            bail!("{}: no config.json", dir.display());
        }
        let tok = dir.join("tokenizer.json");
        let tokenizer = tok.is_file().then_some(tok);
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let (weights, index) = if index.is_file() {
            let paths = shard_paths(&index, dir)?;
            (paths, Some(index))
        } else if single.is_file() {
            (vec![single], None)
        } else {
            bail!(
                "{}: no model.safetensors and no model.safetensors.index.json",
                dir.display()
            );
        };
        Ok(Self {
            config,
            tokenizer,
            weights,
            index,
        })
    }

    /// Files of a Hugging Face Hub repository (`Qwen/Qwen3-8B`), through the local cache
    /// first and the network second. Needs the `hub` feature.
    #[cfg(feature = "hub")]
    pub fn from_hub(repo_id: &str, revision: Option<&str>) -> Result<Self> {
        let get = hub_getter(repo_id, revision, "Qwen/Qwen3-8B")?;
        let config = get("config.json")?;
        let tokenizer = get("tokenizer.json").ok();
        let (weights, index) = match get("model.safetensors.index.json") {
            Ok(index) => {
                let map = read_index(&index)?;
                let mut files: Vec<String> = map.values().cloned().collect();
                files.sort();
                files.dedup();
                let mut paths = Vec::new();
                for f in files {
                    paths.push(get(&f)?);
                }
                (paths, Some(index))
            }
            Err(_) => (vec![get("model.safetensors")?], None),
        };
        Ok(Self {
            config,
            tokenizer,
            weights,
            index,
        })
    }
}

/// A file fetcher for a Hugging Face Hub repository: each call returns the local path of a
/// file, from the cache first and the network second (hf-hub 1.0 does not read
/// `HF_HUB_OFFLINE`). `example` names a repository id for the error on a malformed id.
#[cfg(feature = "hub")]
pub(crate) fn hub_getter<'a>(
    repo_id: &'a str,
    revision: Option<&'a str>,
    example: &str,
) -> Result<impl Fn(&str) -> Result<PathBuf> + 'a> {
    let (owner, name) = hf_hub::split_id(repo_id);
    if owner.is_empty() {
        bail!("--model {repo_id:?}: expected OWNER/NAME, e.g. {example}");
    }
    let client = hf_hub::HFClientSync::new().map_err(|e| msg(format!("hf-hub: {e}")))?;
    let repo = client.model(owner, name);
    Ok(move |file: &str| -> Result<PathBuf> {
        let fetch = |local: bool| {
            repo.download_file()
                .filename(file)
                .maybe_revision(revision.map(str::to_string))
                .local_files_only(local)
                .send()
        };
        fetch(true)
            .or_else(|_| fetch(false))
            .map_err(|e| msg(format!("{repo_id}: {file}: {e}")))
    })
}

/// The distinct shard files an index lists, sorted, each checked to exist in `dir`.
pub(crate) fn shard_paths(index: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<String> = read_index(index)?.into_values().collect();
    files.sort();
    files.dedup();
    files
        .into_iter()
        .map(|f| {
            let p = dir.join(&f);
            if !p.is_file() {
                bail!(
                    "{}: lists shard {f}, which is not in {}",
                    index.display(),
                    dir.display()
                );
            }
            Ok(p)
        })
        .collect()
}

/// Why a safetensors file did not open, naming the first tensor whose bytes lie past the
/// end of a truncated file when the header is intact.
pub(crate) fn diagnose_safetensors(path: &Path, err: &candle_core::Error) -> String {
    let generic = format!("cannot read as safetensors: {err}");
    let Ok(bytes) = std::fs::read(path) else {
        return generic;
    };
    if bytes.len() < 8 {
        return format!(
            "truncated: {} bytes, shorter than the 8-byte header length",
            bytes.len()
        );
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    if n > bytes.len() - 8 {
        return format!(
            "truncated inside the header: it declares {n} header bytes, the file has {} after the length",
            bytes.len() - 8
        );
    }
    let Ok(header) = serde_json::from_slice::<serde_json::Value>(&bytes[8..8 + n]) else {
        return generic;
    };
    let data_len = bytes.len() - 8 - n;
    let mut past: Vec<(usize, String)> = header
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .filter_map(|(k, v)| {
            let end = v.get("data_offsets")?.get(1)?.as_u64()? as usize;
            (end > data_len).then(|| (end, k.clone()))
        })
        .collect();
    past.sort();
    match past.first() {
        Some((end, name)) => format!(
            "truncated: tensor {name} needs data up to byte {end}, the file holds {data_len} data bytes \
             ({} tensors cut off); {generic}",
            past.len()
        ),
        None => generic,
    }
}

/// Every tensor a Qwen3 of `cfg` loads, with its shape.
pub fn expected_tensors(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (h, d, i) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let mut v = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let mut push = |n: &str, s: Vec<usize>| v.push((format!("{p}.{n}"), s));
        push("input_layernorm.weight", vec![h]);
        push("post_attention_layernorm.weight", vec![h]);
        push("self_attn.q_proj.weight", vec![nh * d, h]);
        push("self_attn.k_proj.weight", vec![nkv * d, h]);
        push("self_attn.v_proj.weight", vec![nkv * d, h]);
        push("self_attn.o_proj.weight", vec![h, nh * d]);
        if cfg.attention_bias {
            push("self_attn.q_proj.bias", vec![nh * d]);
            push("self_attn.k_proj.bias", vec![nkv * d]);
            push("self_attn.v_proj.bias", vec![nkv * d]);
            push("self_attn.o_proj.bias", vec![h]);
        }
        push("self_attn.q_norm.weight", vec![d]);
        push("self_attn.k_norm.weight", vec![d]);
        push("mlp.gate_proj.weight", vec![i, h]);
        push("mlp.up_proj.weight", vec![i, h]);
        push("mlp.down_proj.weight", vec![h, i]);
    }
    v.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        v.push(("lm_head.weight".to_string(), vec![cfg.vocab_size, h]));
    }
    v
}

/// Opens every weight file and checks that each tensor `cfg` needs is present once, in
/// the shard the index names, with the right shape and a float dtype.
pub fn check_checkpoint(cfg: &Config, files: &CheckpointFiles) -> Result<()> {
    // name → (file, shape, dtype)
    let mut found: HashMap<String, (PathBuf, Vec<usize>, StDtype)> = HashMap::new();
    for f in &files.weights {
        // SAFETY: the file is mapped read-only; a file changed underneath is the same
        // hazard every mmap loader (candle's included) accepts.
        let st = unsafe { MmapedSafetensors::new(f) }
            .map_err(|e| msg(format!("{}: {}", f.display(), diagnose_safetensors(f, &e))))?;
        for (name, view) in st.tensors() {
            if let Some((prev, _, _)) = found.get(&name) {
                bail!(
                    "tensor {name} is in both {} and {}",
                    prev.display(),
                    f.display()
                );
            }
            found.insert(name, (f.clone(), view.shape().to_vec(), view.dtype()));
        }
    }
    let index = match &files.index {
        Some(p) => Some((p, read_index(p)?)),
        None => None,
    };
    for (name, shape) in expected_tensors(cfg) {
        let Some((file, got, dtype)) = found.get(&name) else {
            let hint = match &index {
                Some((p, m)) => match m.get(&name) {
                    Some(shard) => format!("{} maps it to {shard}, which lacks it", p.display()),
                    None => format!("{} does not list it either", p.display()),
                },
                None => format!(
                    "searched {}",
                    files
                        .weights
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            bail!("checkpoint: tensor {name} is missing ({hint})");
        };
        if *got != shape {
            bail!(
                "{}: tensor {name} has shape {got:?}, but {} implies {shape:?}",
                file.display(),
                files.config.display()
            );
        }
        if !matches!(dtype, StDtype::F32 | StDtype::F16 | StDtype::BF16) {
            bail!(
                "{}: tensor {name} has dtype {dtype:?}; only f32/f16/bf16 checkpoints are supported \
                 (quantized checkpoints carry scales this loader does not apply)",
                file.display()
            );
        }
        if let Some((p, m)) = &index {
            check_index_entry(p, m, &name, file)?;
        }
    }
    Ok(())
}

/// Checks and loads a checkpoint in `dtype` on `device`.
pub fn load(
    cfg: &Config,
    files: &CheckpointFiles,
    schedule: &Schedule,
    dtype: DType,
    device: &Device,
) -> Result<Qwen3> {
    check_checkpoint(cfg, files)?;
    // SAFETY: as above, read-only maps of the checked files.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files.weights, dtype, device) }
        .map_err(|e| msg(format!("loading {}: {e}", files.weights[0].display())))?;
    Qwen3::new(cfg, schedule, vb).map_err(|e| {
        msg(format!(
            "building Qwen3 from {}: {e}",
            files
                .weights
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// The architecture of `cfg` with random weights (for speed runs without a checkpoint).
///
/// Weights ~ N(0, 0.02²) (transformers' `initializer_range`), norms 1, biases 0. On the
/// CPU they come from [`crate::synth::Rng`]; on a GPU from the device's generator after
/// `set_seed(seed)` (fast for an 8B model). The values only need to be finite and of a
/// realistic scale: speed does not depend on them.
pub fn random(
    cfg: &Config,
    schedule: &Schedule,
    dtype: DType,
    device: &Device,
    seed: u64,
) -> Result<Qwen3> {
    let mut rng = crate::synth::Rng::new(seed);
    if !device.is_cpu() {
        device.set_seed(seed)?;
    }
    let mut tensors = HashMap::new();
    for (name, shape) in expected_tensors(cfg) {
        let s = shape.as_slice();
        let t = if name.ends_with("norm.weight") {
            Tensor::ones(s, dtype, device)?
        } else if name.ends_with(".bias") {
            Tensor::zeros(s, dtype, device)?
        } else if device.is_cpu() {
            let n = s.iter().product();
            Tensor::from_vec(rng.normals(n, 0.02), s, device)?.to_dtype(dtype)?
        } else {
            Tensor::randn(0f32, 0.02, s, device)?.to_dtype(dtype)?
        };
        tensors.insert(name, t);
    }
    let vb = VarBuilder::from_tensors(tensors, dtype, device);
    Qwen3::new(cfg, schedule, vb)
}

/// Where the weights come from.
#[derive(Clone, Debug)]
pub enum ModelSource {
    /// A local checkpoint directory.
    Dir(PathBuf),
    /// A Hub repository such as `Qwen/Qwen3-8B` (needs the `hub` feature).
    Hub {
        repo: String,
        revision: Option<String>,
    },
    /// Random weights for `config`.
    Random { config: Box<Config>, seed: u64 },
}

/// A model ready to run, with its tokenizer file when the source has one.
pub struct Opened {
    pub model: Qwen3,
    pub tokenizer: Option<PathBuf>,
    /// What was loaded, for logs.
    pub description: String,
}

/// Resolves the source, checks and loads the weights, and applies `schedule`.
pub fn open(
    source: &ModelSource,
    schedule: &super::schedule::ScheduleSpec,
    dtype: DType,
    device: &Device,
) -> Result<Opened> {
    let from_files = |files: CheckpointFiles, what: String| -> Result<Opened> {
        let cfg = Config::from_file(&files.config)?;
        let s = schedule.resolve(cfg.num_hidden_layers)?;
        let model = load(&cfg, &files, &s, dtype, device)?;
        Ok(Opened {
            model,
            tokenizer: files.tokenizer.clone(),
            description: what,
        })
    };
    match source {
        ModelSource::Dir(d) => from_files(CheckpointFiles::from_dir(d)?, d.display().to_string()),
        ModelSource::Hub { repo, revision } => {
            #[cfg(feature = "hub")]
            {
                let files = CheckpointFiles::from_hub(repo, revision.as_deref())?;
                from_files(files, format!("{repo} (hub)"))
            }
            #[cfg(not(feature = "hub"))]
            {
                let _ = (revision, from_files);
                bail!(
                    "--model {repo}: this build has no Hub support; build with `--features hub`, \
                     or download the checkpoint and pass --model-dir DIR"
                )
            }
        }
        ModelSource::Random { config, seed } => {
            let s = schedule.resolve(config.num_hidden_layers)?;
            let model = random(config, &s, dtype, device, *seed)?;
            Ok(Opened {
                model,
                tokenizer: None,
                description: format!(
                    "random weights ({} layers, hidden {}, {:.2} B parameters, seed {seed})",
                    config.num_hidden_layers,
                    config.hidden_size,
                    config.num_parameters() as f64 / 1e9
                ),
            })
        }
    }
}

/// `cpu`, `cuda` or `cuda:N`.
pub fn parse_device(s: &str) -> Result<Device> {
    match s.trim().to_ascii_lowercase().as_str() {
        "cpu" => Ok(Device::Cpu),
        "cuda" | "gpu" => Device::new_cuda(0),
        d => match d.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => Device::new_cuda(i),
            _ => bail!("unknown device {s:?}; expected cpu, cuda or cuda:N"),
        },
    }
}

/// `f32`, `bf16` or `f16`.
pub fn parse_dtype(s: &str) -> Result<DType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" => Ok(DType::F16),
        _ => bail!("unknown dtype {s:?}; expected f32, bf16 or f16"),
    }
}
