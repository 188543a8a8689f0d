//! Finding and checking the safetensors files of one diffusers / transformers component
//! (`config.json` plus one weights file or shards listed by an index), shared by the Wan
//! text encoder, transformer and VAE loaders. Every file is opened and every tensor a config
//! implies looked up before any mapping, so a missing, mis-shaped or non-float tensor, or an
//! index that disagrees with the files, is an error naming the file and the tensor.

use crate::models::qwen3::loading::{
    check_index_entry, diagnose_safetensors, read_index, shard_paths,
};
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
        unsafe { VarBuilder::from_mmaped_safetensors(&self.weights, dtype, device) }.map_err(|e| {
            candle_core::Error::Msg(format!("loading {}: {e}", self.weights[0].display()))
        })
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
            let st = unsafe { MmapedSafetensors::new(f) }.map_err(|e| {
                candle_core::Error::Msg(format!("{}: {}", f.display(), diagnose_safetensors(f, &e)))
            })?;
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
    /// names; `what` (e.g. "VAE checkpoint: tensor x") starts the message when it is missing.
    pub fn check(
        &self,
        name: &str,
        shape: &[usize],
        missing: impl FnOnce() -> String,
    ) -> Result<()> {
        let config = self.files.config.display();
        let Some((file, got, dtype)) = self.found.get(name) else {
            bail!(
                "{} is missing (searched {}; {config} implies it)",
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
        if !matches!(dtype, StDtype::F32 | StDtype::F16 | StDtype::BF16) {
            bail!(
                "{}: tensor {name} has dtype {dtype:?}; only f32/f16/bf16 weights are supported",
                file.display()
            );
        }
        if let (Some(p), Some(m)) = (&self.files.index, &self.index) {
            check_index_entry(p, m, name, file)?;
        }
        Ok(())
    }
}
