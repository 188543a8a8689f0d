//! The Wan2.2 diffusion transformer (diffusers `WanTransformer3DModel`,
//! `src/diffusers/models/transformers/transformer_wan.py`; the original `WanModel` of
//! `wan/modules/model.py`): one expert of T2V-A14B / I2V-A14B, or TI2V-5B.
//!
//! `forward` takes latents `[b, c, F, H, W]`, the timestep and the UMT5 text embeddings and
//! returns the predicted flow `[b, c_out, F, H, W]`. The timestep is one value per sample
//! (`[b]`, the A14B experts) or one per token (`[b, tokens]`, TI2V-5B's `expand_timesteps`,
//! where the first frame's tokens get t = 0 in image-to-video); in the per-token case the
//! modulation is per token too, as in diffusers' `temb.ndim == 4` branch.
//!
//! Every self- and cross-attention goes through [`mxattn::attention::attention`] with the
//! config the [`AttnPolicy`] gives for its [`AttnSite`] (expert, step, layer, kind).
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use mxattn::attention::AttentionConfig;
//! use mxattn_wan::transformer::{TransformerConfig, WanTransformer};
//!
//! let cfg = TransformerConfig {
//!     num_attention_heads: 2,
//!     attention_head_dim: 32,
//!     in_channels: 4,
//!     out_channels: Some(4),
//!     text_dim: 16,
//!     ffn_dim: 96,
//!     num_layers: 2,
//!     ..TransformerConfig::t2v_a14b()
//! };
//! let dev = Device::Cpu;
//! let model = WanTransformer::random(&cfg, DType::F32, &dev, 0)?;
//! let latents = Tensor::randn(0f32, 1.0, (1, 4, 3, 4, 6), &dev)?; // [b, c, F, H, W]
//! let t = Tensor::new(&[900f32], &dev)?; // one timestep per sample
//! let text = Tensor::randn(0f32, 1.0, (1, 8, 16), &dev)?; // [b, L, text_dim]
//! let v = model.forward(&latents, &t, &text, &AttentionConfig::exact(), 0, 0)?;
//! assert_eq!(v.dims(), &[1, 4, 3, 4, 6]);
//! # Ok::<(), candle_core::Error>(())
//! ```

pub mod block;
pub mod config;
pub mod loading;
pub mod rope;

pub use block::{BlockCall, LinearKind, WanBlock};
pub use config::TransformerConfig;
pub use loading::{
    check_files, detect_layout, expected_tensors, expert_dirs, find_files, original_name, Layout,
    TransformerFiles,
};
pub use rope::{RopeTables, WanRope};

use crate::AttnPolicy;
use block::{linear, LnParams, SeqParallel};
use candle_core::{bail, DType, Device, Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder};
use mxattn_checkpoint::{build_from, random_var_builder, Init};
use mxattn_dist::{ulysses, Communicator};
use std::path::Path;

/// The RoPE tables of one latent grid `(f, h, w)`, shared by the clones of a transformer.
type RopeCache = std::sync::Arc<std::sync::Mutex<Option<((usize, usize, usize), RopeTables)>>>;

/// A Wan diffusion transformer.
#[derive(Clone, Debug)]
pub struct WanTransformer {
    cfg: TransformerConfig,
    /// The patch-embedding Conv3d as a matrix `[dim, c·pt·ph·pw]` (kernel = stride, so the
    /// conv is one matmul over non-overlapping patches).
    patch_weight: Tensor,
    patch_bias: Tensor,
    /// f32.
    time_1: Linear,
    time_2: Linear,
    time_proj: Linear,
    text_1: Linear,
    text_2: Linear,
    blocks: Vec<WanBlock>,
    norm_out: LnParams,
    proj_out: Linear,
    /// `[1, 1, 2, dim]` f32.
    scale_shift_table: Tensor,
    /// `[1, freq_dim/2]` f32 frequencies of the sinusoidal timestep embedding.
    time_freqs: Tensor,
    rope: WanRope,
    /// The RoPE tables of the last latent grid: every step of a run uses the same grid, and
    /// building them on the host took ≈0.1 s per forward at 720p.
    rope_cache: RopeCache,
    /// Whether the blocks run the fused elementwise ops ([`mxattn::fused`]); on by default.
    fused: bool,
    /// Ulysses sequence parallelism: the ranks that share each forward's tokens.
    sp: Option<std::sync::Arc<dyn Communicator>>,
    dtype: DType,
    device: Device,
}

/// diffusers' `get_timestep_embedding` frequencies in f32: `exp(−ln(10⁴)·i / half)`.
fn timestep_freqs(freq_dim: usize) -> Vec<f32> {
    let half = freq_dim / 2;
    let c = -(10000f64.ln()) as f32;
    (0..half)
        .map(|i| ((c * i as f32) / half as f32).exp())
        .collect()
}

impl WanTransformer {
    /// Builds the transformer of `cfg` from `vb` (diffusers names). Weights load in the
    /// builder's dtype, except the modules diffusers keeps in f32 ([`loading::keeps_f32`]).
    pub fn new(cfg: &TransformerConfig, vb: VarBuilder) -> Result<Self> {
        cfg.validate().map_err(candle_core::Error::Msg)?;
        let (dtype, device) = (vb.dtype(), vb.device().clone());
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            bail!("Wan transformer: dtype {dtype:?} is not supported (f32, f16 or bf16)");
        }
        let dim = cfg.dim();
        let [pt, ph, pw] = cfg.patch_size;
        let patch_in = cfg.in_channels * pt * ph * pw;
        let vb32 = vb.clone().set_dtype(DType::F32);
        let c = vb.pp("condition_embedder");
        let c32 = vb32.pp("condition_embedder");
        let plain = LnParams::plain(dim, cfg.eps, &device)?;
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            blocks.push(WanBlock::new(
                dim,
                cfg.ffn_dim,
                cfg.num_attention_heads,
                cfg.cross_attn_norm,
                cfg.eps,
                &plain,
                vb.pp(format!("blocks.{l}")),
            )?);
        }
        let time_freqs =
            Tensor::from_vec(timestep_freqs(cfg.freq_dim), (1, cfg.freq_dim / 2), &device)?;
        Ok(Self {
            patch_weight: vb
                .get((dim, cfg.in_channels, pt, ph, pw), "patch_embedding.weight")?
                .reshape((dim, patch_in))?,
            patch_bias: vb.get(dim, "patch_embedding.bias")?,
            time_1: linear(cfg.freq_dim, dim, c32.pp("time_embedder.linear_1"))?,
            time_2: linear(dim, dim, c32.pp("time_embedder.linear_2"))?,
            time_proj: linear(dim, 6 * dim, c.pp("time_proj"))?,
            text_1: linear(cfg.text_dim, dim, c.pp("text_embedder.linear_1"))?,
            text_2: linear(dim, dim, c.pp("text_embedder.linear_2"))?,
            blocks,
            norm_out: plain,
            proj_out: linear(
                dim,
                cfg.out_channels() * cfg.patch_volume(),
                vb.pp("proj_out"),
            )?,
            scale_shift_table: vb32.get((1, 2, dim), "scale_shift_table")?.unsqueeze(0)?,
            time_freqs,
            rope: WanRope::new(cfg),
            rope_cache: Default::default(),
            fused: true,
            sp: None,
            cfg: cfg.clone(),
            dtype,
            device,
        })
    }

    /// Loads one transformer directory of either layout in `dtype` on `device`, after
    /// checking every file and tensor.
    pub fn load(dir: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        Self::from_files(&find_files(dir)?, dtype, device)
    }

    /// Loads checked files.
    pub fn from_files(files: &TransformerFiles, dtype: DType, device: &Device) -> Result<Self> {
        let cfg = TransformerConfig::from_file(&files.config)?;
        let layout = check_files(&cfg, files)?;
        let what = format!("the Wan transformer ({layout:?} layout)");
        build_from(files, &what, dtype, device, |vb| match layout {
            Layout::Diffusers => Self::new(&cfg, vb),
            Layout::Original => Self::new(&cfg, vb.rename_f(original_name)),
        })
    }

    /// The architecture of `cfg` with random weights, for speed runs: matrices
    /// `N(0, 1/fan_in)`, `scale_shift_table`s `N(0, 1/dim)` (diffusers' init), norm weights 1,
    /// biases 0. On the CPU from [`mxattn::synth::Rng`], elsewhere from the device's generator.
    pub fn random(
        cfg: &TransformerConfig,
        dtype: DType,
        device: &Device,
        seed: u64,
    ) -> Result<Self> {
        cfg.validate().map_err(candle_core::Error::Msg)?;
        let dim = cfg.dim();
        let init = |name: &str, s: &[usize]| {
            let dt = if loading::keeps_f32(name) {
                DType::F32
            } else {
                dtype
            };
            let how = if name.ends_with(".bias") {
                Init::Zeros
            } else if name.ends_with("norm_q.weight")
                || name.ends_with("norm_k.weight")
                || name.ends_with("norm2.weight")
            {
                Init::Ones
            } else if name.ends_with("scale_shift_table") {
                Init::Normal(1.0 / (dim as f64).sqrt())
            } else {
                Init::Normal(1.0 / (s[1..].iter().product::<usize>() as f64).sqrt())
            };
            (how, dt)
        };
        let vb = random_var_builder(expected_tensors(cfg), init, dtype, device, seed)?;
        Self::new(cfg, vb)
    }

    /// Runs block `l`'s projections of each [`LinearKind`] in the format `format_of(l, kind)`
    /// gives (dense ones are quantized now, on the model's device).
    pub fn set_linears(
        &mut self,
        format_of: impl Fn(usize, LinearKind) -> mxattn_fp8::LinearFormat,
    ) -> Result<()> {
        for (l, b) in self.blocks.iter_mut().enumerate() {
            b.set_linears(|k| format_of(l, k))?;
        }
        Ok(())
    }

    /// How many of the blocks' projection groups (self, cross, FFN) run in each format:
    /// `"fp8: 120"`.
    pub fn linear_summary(&self) -> String {
        mxattn_fp8::format_counts(self.blocks.iter().flat_map(|b| b.linear_formats()))
    }

    /// Runs the blocks with Candle's op-by-op elementwise chain (`false`) instead of the fused
    /// ops (`true`, the default): for measuring what the fusion saves, and as its reference.
    pub fn set_fused_elementwise(&mut self, on: bool) {
        self.fused = on;
    }

    /// Splits every forward's video tokens across the ranks of `comm` (Ulysses sequence
    /// parallelism; `None` or a group of one: this process computes all of them). Every rank
    /// calls [`Self::forward`] with the same inputs and gets the whole output; the heads must
    /// be a multiple of the ranks, the tokens are padded to one.
    pub fn set_sequence_parallel(
        &mut self,
        comm: Option<std::sync::Arc<dyn Communicator>>,
    ) -> Result<()> {
        if let Some(c) = &comm {
            let h = self.cfg.num_attention_heads;
            if !h.is_multiple_of(c.world()) {
                bail!(
                    "Wan transformer: sequence parallelism over {} ranks splits the {h} attention heads; use a rank count that divides {h}",
                    c.world()
                );
            }
        }
        self.sp = comm.filter(|c| c.world() > 1);
        Ok(())
    }

    /// This process's rank in the sequence-parallel group (0 without one).
    pub fn sequence_rank(&self) -> usize {
        self.sp.as_ref().map_or(0, |c| c.rank())
    }

    pub fn config(&self) -> &TransformerConfig {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Tokens of a latent grid `F × H × W`: `(F/pt)·(H/ph)·(W/pw)`.
    pub fn num_tokens(&self, f: usize, h: usize, w: usize) -> usize {
        let [pt, ph, pw] = self.cfg.patch_size;
        (f / pt) * (h / ph) * (w / pw)
    }

    /// Checks the inputs; returns the patch grid `(F', H', W')`.
    fn check_inputs(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &Tensor,
    ) -> Result<(usize, usize, usize)> {
        let cin = self.cfg.in_channels;
        let dims = latents.dims();
        if dims.len() != 5 {
            bail!("Wan transformer: latents must be [batch, {cin}, frames, height, width], got shape {dims:?}");
        }
        let (b, c, f, h, w) = latents.dims5()?;
        if c != cin {
            bail!("Wan transformer: latents have {c} channels, the model takes {cin} (shape {dims:?})");
        }
        if dims.contains(&0) {
            bail!("Wan transformer: latents shape {dims:?} has an empty dimension");
        }
        let [pt, ph, pw] = self.cfg.patch_size;
        if f % pt != 0 || h % ph != 0 || w % pw != 0 {
            bail!(
                "Wan transformer: latent grid {f}×{h}×{w} is not a multiple of the patch {pt}×{ph}×{pw}"
            );
        }
        for (n, t) in [
            ("latents", latents),
            ("timestep", timestep),
            ("text embeddings", text),
        ] {
            if !t.device().same_device(&self.device) {
                bail!(
                    "Wan transformer: {n} are on {:?}, the model on {:?}",
                    t.device(),
                    self.device
                );
            }
        }
        for (n, t) in [("latents", latents), ("text embeddings", text)] {
            if !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
                bail!(
                    "Wan transformer: {n} are {:?}; expected f32, f16 or bf16",
                    t.dtype()
                );
            }
        }
        let n = (f / pt) * (h / ph) * (w / pw);
        match timestep.dims() {
            [bt] if *bt == 1 || *bt == b => {}
            [bt, nt] if (*bt == 1 || *bt == b) && *nt == n => {}
            d => bail!(
                "Wan transformer: timestep must be [{b}] (one per sample) or [{b}, {n}] (one per token), got shape {d:?}"
            ),
        }
        match text.dims() {
            [bt, l, d] if *bt == b && *l > 0 && *d == self.cfg.text_dim => {}
            d => bail!(
                "Wan transformer: text embeddings must be [{b}, length, {}], got shape {d:?}",
                self.cfg.text_dim
            ),
        }
        Ok((f / pt, h / ph, w / pw))
    }

    /// `[b, c, F, H, W]` → tokens `[b, N, dim]` (the patch-embedding Conv3d).
    fn patchify(&self, x: &Tensor, grid: (usize, usize, usize)) -> Result<Tensor> {
        let (b, c, _, _, _) = x.dims5()?;
        let (f, h, w) = grid;
        let [pt, ph, pw] = self.cfg.patch_size;
        let patches = x
            .reshape(vec![b, c, f, pt, h, ph, w, pw])?
            .permute(vec![0, 2, 4, 6, 1, 3, 5, 7])?
            .contiguous()?
            .reshape((b, f * h * w, c * pt * ph * pw))?;
        patches
            .broadcast_matmul(&self.patch_weight.t()?)?
            .broadcast_add(&self.patch_bias)
    }

    /// Tokens `[b, N, c_out·pt·ph·pw]` → `[b, c_out, F, H, W]` (diffusers' unpatchify).
    fn unpatchify(&self, x: &Tensor, grid: (usize, usize, usize)) -> Result<Tensor> {
        let b = x.dim(0)?;
        let (f, h, w) = grid;
        let [pt, ph, pw] = self.cfg.patch_size;
        let c = self.cfg.out_channels();
        x.reshape(vec![b, f, h, w, pt, ph, pw, c])?
            .permute(vec![0, 7, 1, 4, 2, 5, 3, 6])?
            .contiguous()?
            .reshape((b, c, f * pt, h * ph, w * pw))
    }

    /// The time embedding `temb [bt, T, dim]` (model dtype) and the block modulation input
    /// `e0 [bt, T, 6, dim]` (f32), T = 1 or the token count.
    fn time_embedding(&self, timestep: &Tensor) -> Result<(Tensor, Tensor)> {
        let (bt, t) = match timestep.dims() {
            [bt] => (*bt, 1),
            [bt, t] => (*bt, *t),
            _ => unreachable!("checked by check_inputs"),
        };
        let dim = self.cfg.dim();
        let ts = timestep.flatten_all()?.to_dtype(DType::F32)?.unsqueeze(1)?;
        let args = ts.broadcast_mul(&self.time_freqs)?;
        // flip_sin_to_cos: [cos | sin]
        let sinus = Tensor::cat(&[args.cos()?, args.sin()?], 1)?;
        let temb = self
            .time_2
            .forward(&candle_nn::ops::silu(&self.time_1.forward(&sinus)?)?)?
            .to_dtype(self.dtype)?;
        let e0 = self
            .time_proj
            .forward(&candle_nn::ops::silu(&temb)?)?
            .to_dtype(DType::F32)?
            .reshape((bt, t, 6, dim))?;
        Ok((temb.reshape((bt, t, dim))?, e0))
    }

    /// The predicted flow `[b, c_out, F, H, W]` (model dtype) of `latents [b, c_in, F, H, W]`
    /// at `timestep` (`[b]` or `[b, tokens]`; a leading 1 broadcasts) given `text [b, L,
    /// text_dim]`; `expert` and `step` only label the attention call sites. On CUDA the
    /// attention calls' input checks are read once, at the end (a non-finite value in any
    /// of them is an error of the forward).
    pub fn forward(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &Tensor,
        policy: &dyn AttnPolicy,
        expert: usize,
        step: usize,
    ) -> Result<Tensor> {
        let grid = self.check_inputs(latents, timestep, text)?;
        let x = self.patchify(&latents.to_dtype(self.dtype)?, grid)?;
        let rope = {
            let mut c = self.rope_cache.lock().unwrap_or_else(|e| e.into_inner());
            match &*c {
                Some((g, t)) if *g == grid => t.clone(),
                _ => {
                    let t = self.rope.tables(grid.0, grid.1, grid.2, &self.device)?;
                    *c = Some((grid, t.clone()));
                    t
                }
            }
        };
        let (temb, e0) = self.time_embedding(timestep)?;
        let ctx = self
            .text_2
            .forward(&self.text_1.forward(&text.to_dtype(self.dtype)?)?.gelu()?)?;
        // sequence parallel: this rank's tokens, their RoPE rows and (per-token timesteps)
        // their modulation
        let n = x.dim(1)?;
        let sp = self
            .sp
            .as_deref()
            .map(|comm| SeqParallel { comm, tokens: n });
        let (mut x, rope, temb, e0) = match sp {
            None => (x, rope, temb, e0),
            Some(sp) => {
                let c = sp.comm;
                let per_token = |t: Tensor| -> Result<Tensor> {
                    if t.dim(1)? > 1 {
                        ulysses::split(c, &t, 1)
                    } else {
                        Ok(t)
                    }
                };
                let rope = RopeTables {
                    cos: ulysses::split(c, &rope.cos, 0)?,
                    sin: ulysses::split(c, &rope.sin, 0)?,
                };
                (
                    ulysses::split(c, &x, 1)?,
                    rope,
                    per_token(temb)?,
                    per_token(e0)?,
                )
            }
        };
        for (layer, block) in self.blocks.iter().enumerate() {
            let call = BlockCall {
                policy,
                sp,
                expert,
                step,
                layer,
                fused: self.fused,
            };
            x = block.forward(&x, &ctx, &e0, &rope, call)?;
        }
        let m = self
            .scale_shift_table
            .broadcast_add(&temb.to_dtype(DType::F32)?.unsqueeze(2)?)?;
        let (shift, scale) = (
            m.narrow(2, 0, 1)?.squeeze(2)?,
            m.narrow(2, 1, 1)?.squeeze(2)?,
        );
        let x = if self.fused {
            let m = |t| mxattn::fused::Rows::of(t);
            self.norm_out
                .forward_fused(&x, Some((m(&shift), m(&scale))))?
        } else {
            self.norm_out.modulate(&x, &shift, &scale, self.dtype)?
        };
        let mut y = self.proj_out.forward(&x)?;
        if let Some(sp) = sp {
            y = ulysses::gather(sp.comm, &y, 1, n)?;
        }
        let out = self.unpatchify(&y, grid)?;
        // the attention calls' deferred checks (non-finite inputs, overflow): one
        // synchronization per forward instead of one per call
        mxattn::attention::check_device(&self.device)?;
        Ok(out)
    }
}
