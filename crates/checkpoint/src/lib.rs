//! Safetensors checkpoints, shared by the model crates: finding the files of one
//! component (`config.json` plus one weights file, or shards listed by an index), checking
//! every tensor a config implies before anything is mapped, and fetching from the Hugging
//! Face Hub (feature `hub`, on by default).
//!
//! A truncated file, a missing tensor, a wrong shape or dtype, a tensor in two files or an
//! index that disagrees with the files is an error naming the file and the tensor (candle's
//! own messages name only one of the two).

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{bail, DType, Device, Result};
use candle_nn::VarBuilder;
use safetensors::Dtype as StDtype;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The files of one component.
#[derive(Clone, Debug, PartialEq)]
pub struct ComponentFiles {
    pub config: PathBuf,
    /// Safetensors files, in index order (or the single file).
    pub weights: Vec<PathBuf>,
    /// The index file when the weights are sharded.
    pub index: Option<PathBuf>,
}

impl ComponentFiles {
    /// The files in `dir`, or in `dir/subdir` when `dir` has no `config.json` and the
    /// subfolder has (a pipeline directory); `weights` is the single-file name, its index
    /// `weights + ".index.json"`.
    pub fn find(dir: impl AsRef<Path>, subdir: Option<&str>, weights: &str) -> Result<Self> {
        let mut dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            bail!("{}: not a directory", dir.display());
        }
        if let Some(s) = subdir {
            if !dir.join("config.json").is_file() && dir.join(s).join("config.json").is_file() {
                dir = dir.join(s);
            }
        }
        let config = dir.join("config.json");
        if !config.is_file() {
            match subdir {
                Some(s) => bail!("{}: no config.json (nor {s}/config.json)", dir.display()),
                None => bail!("{}: no config.json", dir.display()),
            }
        }
        let index_name = format!("{weights}.index.json");
        let index = dir.join(&index_name);
        let single = dir.join(weights);
        let (weights, index) = if index.is_file() {
            let paths = shard_paths(&index, &dir)?;
            (paths, Some(index))
        } else if single.is_file() {
            (vec![single], None)
        } else {
            bail!("{}: no {weights} and no {index_name}", dir.display());
        };
        Ok(Self {
            config,
            weights,
            index,
        })
    }

    /// A `VarBuilder` over the weight files, mapped read-only (call after checking them).
    pub fn var_builder(&self, dtype: DType, device: &Device) -> Result<VarBuilder<'static>> {
        // SAFETY: read-only maps of files this program does not modify, as candle's own
        // loaders do.
        unsafe { VarBuilder::from_mmaped_safetensors(&self.weights, dtype, device) }
            .map_err(|e| msg(format!("loading {}: {e}", self.weights[0].display())))
    }
}

/// Every tensor header of a component's files, with the index's shard map.
pub struct TensorScan<'a> {
    files: &'a ComponentFiles,
    found: HashMap<String, (PathBuf, Vec<usize>, StDtype)>,
    index: Option<BTreeMap<String, String>>,
}

impl<'a> TensorScan<'a> {
    /// Opens every file (a truncated one is diagnosed) and reads the index; a tensor stored
    /// in two files is an error.
    pub fn open(files: &'a ComponentFiles) -> Result<Self> {
        let mut found: HashMap<String, (PathBuf, Vec<usize>, StDtype)> = HashMap::new();
        for f in &files.weights {
            // SAFETY: a read-only map of a file we do not modify, as candle's own loader does.
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
        let index = files.index.as_ref().map(|p| read_index(p)).transpose()?;
        Ok(Self {
            files,
            found,
            index,
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.found.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.found.keys().map(String::as_str)
    }

    /// The weight files, comma separated, for messages.
    pub fn searched(&self) -> String {
        self.files
            .weights
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Checks that `name` is present with `shape`, a float dtype, and in the shard the index
    /// names; `missing()` (e.g. "VAE checkpoint: tensor x") starts the message when it is not
    /// there.
    pub fn check(
        &self,
        name: &str,
        shape: &[usize],
        missing: impl FnOnce() -> String,
    ) -> Result<()> {
        const FLOATS: &[StDtype] = &[StDtype::F32, StDtype::F16, StDtype::BF16];
        self.check_as(
            name,
            shape,
            FLOATS,
            "only f32/f16/bf16 weights are supported",
            missing,
        )
    }

    /// Like [`Self::check`] for the FP8 E4M3 codes of an FP8 checkpoint's weight.
    pub fn check_fp8(
        &self,
        name: &str,
        shape: &[usize],
        missing: impl FnOnce() -> String,
    ) -> Result<()> {
        self.check_as(
            name,
            shape,
            &[StDtype::F8_E4M3],
            "the config's quantization_config says FP8 (F8_E4M3) weights",
            missing,
        )
    }

    fn check_as(
        &self,
        name: &str,
        shape: &[usize],
        dtypes: &[StDtype],
        why: &str,
        missing: impl FnOnce() -> String,
    ) -> Result<()> {
        let config = self.files.config.display();
        let Some((file, got, dtype)) = self.found.get(name) else {
            let index = match (&self.files.index, &self.index) {
                (Some(p), Some(m)) => match m.get(name) {
                    Some(shard) => format!("; {} maps it to {shard}, which lacks it", p.display()),
                    None => format!("; {} does not list it either", p.display()),
                },
                _ => String::new(),
            };
            bail!(
                "{} is missing (searched {}; {config} implies it{index})",
                missing(),
                self.searched()
            );
        };
        if got.as_slice() != shape {
            bail!(
                "{}: tensor {name} has shape {got:?}, but {config} implies {shape:?}",
                file.display()
            );
        }
        if !dtypes.contains(dtype) {
            bail!(
                "{}: tensor {name} has dtype {dtype:?}; {why}",
                file.display()
            );
        }
        if let (Some(p), Some(m)) = (&self.files.index, &self.index) {
            check_index_entry(p, m, name, file)?;
        }
        Ok(())
    }
}

fn msg(s: String) -> candle_core::Error {
    candle_core::Error::Msg(s)
}

/// The index `index_path` (its weight map `map`) must place tensor `name`, found in `file`, in
/// that file.
fn check_index_entry(
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

/// tensor name → shard file name, from an index file's `weight_map`.
fn read_index(path: &Path) -> Result<BTreeMap<String, String>> {
    let v: serde_json::Value = read_json(path, "valid JSON")?;
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

/// A file fetcher for a Hugging Face Hub repository: each call returns the local path of a
/// file, from the cache first and the network second (hf-hub 1.0 does not read
/// `HF_HUB_OFFLINE`). `example` names a repository id for the error on a malformed id.
#[cfg(feature = "hub")]
pub fn hub_getter<'a>(
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

/// The distinct shard files an index lists, sorted.
fn shard_names(index: &Path) -> Result<Vec<String>> {
    let mut files: Vec<String> = read_index(index)?.into_values().collect();
    files.sort();
    files.dedup();
    Ok(files)
}

/// [`shard_names`], each checked to exist in `dir`.
fn shard_paths(index: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    shard_names(index)?
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
fn diagnose_safetensors(path: &Path, err: &candle_core::Error) -> String {
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

/// Fetches one component through `get` (a [`hub_getter`]): `subdir/config.json`, then the
/// index `subdir/weights.index.json` and every shard it lists, or else the single
/// `subdir/weights`. Returns the local files, as [`ComponentFiles::find`] would for a
/// directory.
#[cfg(feature = "hub")]
pub fn fetch_component(
    get: &dyn Fn(&str) -> Result<PathBuf>,
    subdir: Option<&str>,
    weights: &str,
) -> Result<ComponentFiles> {
    let path = |f: &str| match subdir {
        Some(d) => format!("{d}/{f}"),
        None => f.to_string(),
    };
    let config = get(&path("config.json"))?;
    match get(&path(&format!("{weights}.index.json"))) {
        Ok(index) => {
            let weights = shard_names(&index)?
                .iter()
                .map(|f| get(&path(f)))
                .collect::<Result<Vec<_>>>()?;
            Ok(ComponentFiles {
                config,
                weights,
                index: Some(index),
            })
        }
        Err(_) => Ok(ComponentFiles {
            config,
            weights: vec![get(&path(weights))?],
            index: None,
        }),
    }
}

/// Builds a model from checked `files` in `dtype` on `device`: `build` gets a `VarBuilder`
/// over them, and its error names `what` and the config it came from.
pub fn build_from<M>(
    files: &ComponentFiles,
    what: &str,
    dtype: DType,
    device: &Device,
    build: impl FnOnce(VarBuilder<'static>) -> Result<M>,
) -> Result<M> {
    let vb = files.var_builder(dtype, device)?;
    build(vb).map_err(|e| {
        msg(format!(
            "building {what} from {}: {e}",
            files.config.display()
        ))
    })
}

/// How one tensor of a random-weight model is filled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    Ones,
    Zeros,
    /// N(0, std²).
    Normal(f64),
}

/// A `VarBuilder` over random weights, for speed runs without a checkpoint: each
/// `(name, shape)` of `tensors` filled as `init(name, shape)` says, in the dtype it names.
/// Normal values come from [`mxattn::synth::Rng`] seeded with `seed` on the CPU (drawn in
/// `tensors` order, so a seed gives the same model every run) and from the device's own
/// generator, seeded with `seed`, elsewhere (fast for large models).
pub fn random_var_builder(
    tensors: impl IntoIterator<Item = (String, Vec<usize>)>,
    init: impl Fn(&str, &[usize]) -> (Init, DType),
    dtype: DType,
    device: &Device,
    seed: u64,
) -> Result<VarBuilder<'static>> {
    let mut rng = mxattn::synth::Rng::new(seed);
    if !device.is_cpu() {
        device.set_seed(seed)?;
    }
    let mut out = HashMap::new();
    for (name, shape) in tensors {
        let s = shape.as_slice();
        let (how, dt) = init(&name, s);
        let t = match how {
            Init::Ones => candle_core::Tensor::ones(s, dt, device)?,
            Init::Zeros => candle_core::Tensor::zeros(s, dt, device)?,
            Init::Normal(std) if device.is_cpu() => {
                let n = s.iter().product();
                candle_core::Tensor::from_vec(rng.normals(n, std), s, device)?.to_dtype(dt)?
            }
            Init::Normal(std) => {
                candle_core::Tensor::randn(0f32, std as f32, s, device)?.to_dtype(dt)?
            }
        };
        out.insert(name, t);
    }
    Ok(VarBuilder::from_tensors(out, dtype, device))
}

/// A text file, with an error that names it.
pub fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| msg(format!("{}: {e}", path.display())))
}

/// A JSON file (a component's `config.json`) parsed as `T`; the error names the file and
/// says what it should have been (`what`, e.g. "a UMT5 encoder config").
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    serde_json::from_str(&read_text(path)?)
        .map_err(|e| msg(format!("{}: not {what}: {e}", path.display())))
}
