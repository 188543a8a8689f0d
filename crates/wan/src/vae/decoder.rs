//! diffusers' `WanDecoder3d`: conv_in → mid block → up-blocks → norm → SiLU → conv_out, run
//! on one latent frame at a time with the causal feature cache.

use super::blocks::{MidBlock, UpBlock};
use super::config::VaeConfig;
use super::conv::{CausalConv3d, FeatCache, RmsNorm};
use super::DecodeStats;
use crate::AttnPolicy;
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

#[derive(Clone, Debug)]
pub struct Decoder3d {
    conv_in: CausalConv3d,
    mid: MidBlock,
    up_blocks: Vec<UpBlock>,
    norm_out: RmsNorm,
    conv_out: CausalConv3d,
}

impl Decoder3d {
    /// Loads the tensors under `decoder.`.
    pub fn new(cfg: &VaeConfig, vb: VarBuilder) -> Result<Self> {
        let dims = cfg.decoder_dims();
        let n = cfg.dim_mult.len();
        let conv_in = CausalConv3d::new(cfg.z_dim, dims[0], (3, 3), vb.pp("conv_in"))?;
        let mid = MidBlock::new(dims[0], vb.pp("mid_block"))?;
        let mut up_blocks = Vec::with_capacity(n);
        for i in 0..n {
            let (mut in_dim, out_dim) = (dims[i], dims[i + 1]);
            // the previous plain stage's upsampler halved its width
            if i > 0 && !cfg.is_residual {
                in_dim /= 2;
            }
            let upsample = (i + 1 < n).then(|| cfg.temporal_upsample(i));
            let vb = vb.pp(format!("up_blocks.{i}"));
            up_blocks.push(if cfg.is_residual {
                UpBlock::residual(in_dim, out_dim, cfg.num_res_blocks, upsample, vb)?
            } else {
                UpBlock::plain(in_dim, out_dim, cfg.num_res_blocks, upsample, vb)?
            });
        }
        let last = dims[n];
        Ok(Self {
            conv_in,
            mid,
            up_blocks,
            norm_out: RmsNorm::new(last, false, vb.pp("norm_out"))?,
            conv_out: CausalConv3d::new(last, cfg.out_channels, (3, 3), vb.pp("conv_out"))?,
        })
    }

    pub fn mid(&self) -> &MidBlock {
        &self.mid
    }

    /// One chunk `[b, t, z, h, w]` → `[b, t', out_channels, H, W]`; `stats` gets the largest
    /// activation (bytes) between blocks and, when tracing, each stage's largest |value|.
    pub fn forward(
        &self,
        x: &Tensor,
        cache: &mut FeatCache,
        first_chunk: bool,
        policy: &dyn AttnPolicy,
        stats: &mut DecodeStats,
    ) -> Result<Tensor> {
        let x = self.conv_in.forward_cached(x, cache)?;
        stats.note("conv_in", &x)?;
        let mut x = self.mid.forward(&x, cache, policy)?;
        stats.note("mid block", &x)?;
        for (i, b) in self.up_blocks.iter().enumerate() {
            x = b.forward(&x, cache, first_chunk)?;
            stats.note(UP_NAMES.get(i).copied().unwrap_or("up block"), &x)?;
        }
        let x = self.norm_out.forward(&x)?.silu()?;
        stats.note("norm_out + SiLU", &x)?;
        let x = self.conv_out.forward_cached(&x, cache)?;
        stats.note("conv_out", &x)?;
        Ok(x)
    }
}

const UP_NAMES: [&str; 6] = [
    "up block 0",
    "up block 1",
    "up block 2",
    "up block 3",
    "up block 4",
    "up block 5",
];
