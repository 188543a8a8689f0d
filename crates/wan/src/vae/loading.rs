//! Finding, checking and loading a diffusers `AutoencoderKLWan` (`vae/` of a -Diffusers
//! repository): `config.json` plus `diffusion_pytorch_model.safetensors`, or shards listed
//! by `diffusion_pytorch_model.safetensors.index.json`.
//!
//! Only the decode path is read (`post_quant_conv.*`, `decoder.*`); encoder tensors may be
//! present and are ignored. Before mapping, every file is opened and every tensor the config
//! implies is looked up, so a missing, mis-shaped or non-float tensor is an error naming the
//! file and the tensor.

use super::config::VaeConfig;
use candle_core::Result;
use mxattn_checkpoint::{ComponentFiles, TensorScan};
use std::path::Path;

const WEIGHTS: &str = "diffusion_pytorch_model.safetensors";

/// The files of one VAE.
pub type VaeFiles = ComponentFiles;

/// The files of a VAE directory, or of the `vae/` folder of a pipeline directory.
pub fn find_files(dir: impl AsRef<Path>) -> Result<VaeFiles> {
    ComponentFiles::find(dir, Some("vae"), WEIGHTS)
}

/// Every tensor the decode path of `cfg` loads, with its shape.
pub fn expected_tensors(cfg: &VaeConfig) -> Vec<(String, Vec<usize>)> {
    type List = Vec<(String, Vec<usize>)>;
    fn conv(v: &mut List, p: &str, o: usize, i: usize, kt: usize, k: usize) {
        v.push((format!("{p}.weight"), vec![o, i, kt, k, k]));
        v.push((format!("{p}.bias"), vec![o]));
    }
    fn resnet(v: &mut List, p: &str, i: usize, o: usize) {
        v.push((format!("{p}.norm1.gamma"), vec![i, 1, 1, 1]));
        conv(v, &format!("{p}.conv1"), o, i, 3, 3);
        v.push((format!("{p}.norm2.gamma"), vec![o, 1, 1, 1]));
        conv(v, &format!("{p}.conv2"), o, o, 3, 3);
        if i != o {
            conv(v, &format!("{p}.conv_shortcut"), o, i, 1, 1);
        }
    }
    let mut v: List = Vec::new();
    let z = cfg.z_dim;
    conv(&mut v, "post_quant_conv", z, z, 1, 1);
    let dims = cfg.decoder_dims();
    let n = cfg.dim_mult.len();
    conv(&mut v, "decoder.conv_in", dims[0], z, 3, 3);
    let d0 = dims[0];
    resnet(&mut v, "decoder.mid_block.resnets.0", d0, d0);
    let a = "decoder.mid_block.attentions.0";
    v.push((format!("{a}.norm.gamma"), vec![d0, 1, 1]));
    v.push((format!("{a}.to_qkv.weight"), vec![3 * d0, d0, 1, 1]));
    v.push((format!("{a}.to_qkv.bias"), vec![3 * d0]));
    v.push((format!("{a}.proj.weight"), vec![d0, d0, 1, 1]));
    v.push((format!("{a}.proj.bias"), vec![d0]));
    resnet(&mut v, "decoder.mid_block.resnets.1", d0, d0);
    for s in 0..n {
        let (mut in_dim, out_dim) = (dims[s], dims[s + 1]);
        if s > 0 && !cfg.is_residual {
            in_dim /= 2;
        }
        let p = format!("decoder.up_blocks.{s}");
        for j in 0..=cfg.num_res_blocks {
            let i = if j == 0 { in_dim } else { out_dim };
            resnet(&mut v, &format!("{p}.resnets.{j}"), i, out_dim);
        }
        if s + 1 < n {
            let (u, up_out) = if cfg.is_residual {
                (format!("{p}.upsampler"), out_dim)
            } else {
                (format!("{p}.upsamplers.0"), out_dim / 2)
            };
            v.push((
                format!("{u}.resample.1.weight"),
                vec![up_out, out_dim, 3, 3],
            ));
            v.push((format!("{u}.resample.1.bias"), vec![up_out]));
            if cfg.temporal_upsample(s) {
                v.push((
                    format!("{u}.time_conv.weight"),
                    vec![2 * out_dim, out_dim, 3, 1, 1],
                ));
                v.push((format!("{u}.time_conv.bias"), vec![2 * out_dim]));
            }
        }
    }
    let last = dims[n];
    v.push(("decoder.norm_out.gamma".into(), vec![last, 1, 1, 1]));
    conv(&mut v, "decoder.conv_out", cfg.out_channels, last, 3, 3);
    v
}

/// Opens every weight file and checks that each tensor the decoder of `cfg` needs is present
/// once, in the shard the index names, with the right shape and a float dtype.
pub fn check_files(cfg: &VaeConfig, files: &VaeFiles) -> Result<()> {
    let scan = TensorScan::open(files)?;
    for (name, shape) in expected_tensors(cfg) {
        scan.check(&name, &shape, || format!("VAE checkpoint: tensor {name}"))?;
    }
    Ok(())
}
