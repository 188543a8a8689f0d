//! The plan of one accelerator call, decided here and not in a backend: which kernel runs,
//! where each operand comes from (packed straight from the input, prepared in f32 first,
//! or decoded from MX codes as stored) and the padded layout the kernel reads.
//!
//! A backend describes what its device can run ([`Capabilities`]); [`plan`] turns the
//! problem, the config and the requested [`GpuPath`] into a [`Plan`]; the backend prepares,
//! packs and launches exactly that. The kernels keep their own argument checks (a call
//! they do not take fails with an error), and the CUDA backend checks each plan against
//! them, so the two cannot drift apart silently.

use super::config::{Algorithm, AttentionConfig, FusedProbs, OperandFormat, ProbFormat};
use super::problem::Problem;
use super::GpuPath;
use crate::mx::ElemFormat;
use candle_core::{bail, Result};

/// What a device and build can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// The warpgroup-MMA kernel's tiles, where it runs (Hopper, with sm_90a code built).
    pub wgmma: Option<WgmmaTiles>,
    /// Head dims the `mma.sync` tensor-core kernel is built for.
    pub mma_head_dims: &'static [usize],
    /// Largest head dim of the portable one-warp-per-row kernel.
    pub max_head_dim: usize,
}

/// The wgmma kernel's fixed geometry (constants of `kernels/attention_wgmma.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WgmmaTiles {
    /// Head dims it is instantiated for.
    pub head_dims: &'static [usize],
    /// Query rows per CTA: Q rows are padded to a multiple.
    pub rows_per_cta: usize,
    /// Query rows of one consumer warpgroup: Q's packed block.
    pub rows_per_warpgroup: usize,
    /// Keys per tile: K and V rows are padded to a multiple; K's FP8 scale is per tile.
    pub keys_per_tile: usize,
}

/// The kernel of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// Warpgroup MMA on FP8 E4M3 operands (`fp8`) or BF16 operands (exact softmax).
    Wgmma { fp8: bool },
    /// `mma.sync` on BF16 operands.
    Mma,
    /// One warp per query row: the CPU reference's arithmetic step for step.
    Simple,
}

/// Where an operand's kernel input comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// Packed for the wgmma kernel straight from the attention input, in one pass.
    Direct,
    /// The input rounded to its format in f32 by the shared preparation (then converted
    /// or packed for the tensor-core kernels).
    Prepared,
    /// Decoded from MX codes and scales as the caller stores them, into the f32 prepared
    /// operand: no requantization (the codes are already in the config's format).
    Stored,
}

/// MX operands the caller hands over as stored (see [`super::decode::KvOperand`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StoredKv {
    /// K's codes are in the config's Q/K format, along the head dim.
    pub k: bool,
    /// V's first `v_keys` keys are codes in the config's V format, along the keys (a whole
    /// number of blocks); the rest is a dense tail the preparation rounds.
    pub v_keys: usize,
}

/// Everything a backend needs to run one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub kernel: Kernel,
    pub q: Source,
    pub k: Source,
    pub v: Source,
    /// V's first keys decoded from stored codes (the rest prepared from the tail).
    pub v_stored_keys: usize,
    /// V is FP8 with a scale per channel: the preparation gathers the scales.
    pub per_channel_v: bool,
    /// The tensor-core kernels take per-channel V's codes before their scale (applied in
    /// the epilogue), prepared beside the scaled values.
    pub v_unscaled: bool,
    /// Padded query rows and keys of the wgmma kernel's packed operands.
    pub padded: Option<(usize, usize)>,
}

fn fp8_operand(f: OperandFormat) -> bool {
    // MX elements (any) and E4M3 per-channel codes have at most 4 significant bits: exact
    // in E4M3 once their power-of-two scale is taken out.
    matches!(f, OperandFormat::Mx { .. })
        || matches!(
            f,
            OperandFormat::PerChannel {
                elem: ElemFormat::E4M3
            }
        )
}

fn bf16_exact(f: OperandFormat) -> bool {
    matches!(f, OperandFormat::Native | OperandFormat::Bf16)
}

/// The wgmma kernel's operand type for this config, if it takes it: BF16 for exact softmax
/// on native/bf16 operands; FP8 on FP8 operands for Fused-Softmax (u8 or fp32-bits P),
/// exp→E4M3 P, exp→MX P in 32-key blocks and EFQ in 32-key blocks (P re-expressed as E4M3
/// or E5M2 bytes: `kernels/attention_wgmma.cu`, `PBytes`).
fn wgmma_kind(cfg: &AttentionConfig) -> Option<bool> {
    let p_f32 = cfg.p_format == ProbFormat::F32;
    if matches!(cfg.algorithm, Algorithm::Exact)
        && p_f32
        && bf16_exact(cfg.qk_format)
        && bf16_exact(cfg.v_format)
    {
        return Some(false);
    }
    if !(fp8_operand(cfg.qk_format) && fp8_operand(cfg.v_format)) {
        return None;
    }
    let takes = match &cfg.algorithm {
        Algorithm::FusedSoftmax(f) => {
            p_f32 && matches!(f.probs, FusedProbs::U8Code | FusedProbs::Fp32Bits)
        }
        Algorithm::ExpThenQuantize => match cfg.p_format {
            ProbFormat::Fp8 { elem } => elem == ElemFormat::E4M3,
            ProbFormat::Mx { block, .. } => block == 32,
            ProbFormat::F32 => false,
        },
        Algorithm::Efq(e) => p_f32 && e.block == 32,
        _ => false,
    };
    takes.then_some(true)
}

/// Whether Q/K (first) and V (second) can be packed straight from the inputs: Q/K MX blocks
/// that tile a row on whole lanes (or no MX), V native/bf16 for the BF16 kernel, MX in
/// blocks of 32 keys or per-channel E4M3 for the FP8 kernel.
fn direct(cfg: &AttentionConfig, d: usize, fp8: bool) -> (bool, bool) {
    let qk = match cfg.qk_format {
        OperandFormat::Mx { block, .. } => block >= 4 && block <= d && block.is_power_of_two(),
        _ => true,
    };
    let v = if fp8 {
        matches!(cfg.v_format, OperandFormat::Mx { block: 32, .. })
            || matches!(
                cfg.v_format,
                OperandFormat::PerChannel {
                    elem: ElemFormat::E4M3
                }
            )
    } else {
        bf16_exact(cfg.v_format)
    };
    (qk, v)
}

/// The plan of a validated call on a device with `caps`. Errors for what no kernel takes.
pub(crate) fn plan(
    p: &Problem,
    cfg: &AttentionConfig,
    path: GpuPath,
    caps: &Capabilities,
    stored: StoredKv,
) -> Result<Plan> {
    // the GPU kernels give P blocks and EFQ blocks one warp slot of 32 keys
    if let ProbFormat::Mx { block, .. } = cfg.p_format {
        if block != 32 {
            bail!("attention: on CUDA, MX P blocks must be 32 keys (got {block})");
        }
    }
    if let Algorithm::Efq(e) = &cfg.algorithm {
        if e.block != 32 {
            bail!(
                "attention: on CUDA, EFQ blocks must be 32 keys (got {})",
                e.block
            );
        }
    }
    if let Algorithm::FusedSoftmax(f) = &cfg.algorithm {
        if f.probs == FusedProbs::U8CodeWide {
            bail!(
                "attention: the wide-range u8 Fused-Softmax P (FusedProbs::U8CodeWide) runs on the CPU only so far"
            );
        }
    }
    if p.d > caps.max_head_dim {
        bail!(
            "attention: head dim {} unsupported on CUDA (at most {})",
            p.d,
            caps.max_head_dim
        );
    }
    let per_channel_v = matches!(cfg.v_format, OperandFormat::PerChannel { .. });
    let wgmma = match (path, caps.wgmma) {
        (GpuPath::Auto | GpuPath::Wgmma | GpuPath::WgmmaStaged, Some(t))
            if t.head_dims.contains(&p.d) && p.hq.is_multiple_of(p.hkv) =>
        {
            wgmma_kind(cfg).map(|fp8| (fp8, t))
        }
        _ => None,
    };
    let k_src = if stored.k {
        Source::Stored
    } else {
        Source::Prepared
    };
    let v_src = if stored.v_keys > 0 {
        Source::Stored
    } else {
        Source::Prepared
    };
    if let Some((fp8, t)) = wgmma {
        let (dqk, dv) = if path == GpuPath::WgmmaStaged {
            (false, false)
        } else {
            direct(cfg, p.d, fp8)
        };
        // Q and K are packed directly together or not at all (one packing scheme for both)
        let qk_direct = dqk && !stored.k;
        let v_direct = dv && stored.v_keys == 0;
        let pick = |direct: bool, other: Source| if direct { Source::Direct } else { other };
        return Ok(Plan {
            kernel: Kernel::Wgmma { fp8 },
            q: pick(qk_direct, Source::Prepared),
            k: pick(qk_direct, k_src),
            v: pick(v_direct, v_src),
            v_stored_keys: stored.v_keys,
            per_channel_v,
            v_unscaled: fp8 && per_channel_v && !v_direct,
            padded: Some((
                p.sq.div_ceil(t.rows_per_cta) * t.rows_per_cta,
                p.sk.div_ceil(t.keys_per_tile) * t.keys_per_tile,
            )),
        });
    }
    let mma = path != GpuPath::Simple && caps.mma_head_dims.contains(&p.d);
    Ok(Plan {
        kernel: if mma { Kernel::Mma } else { Kernel::Simple },
        q: Source::Prepared,
        k: k_src,
        v: v_src,
        v_stored_keys: stored.v_keys,
        per_channel_v,
        v_unscaled: mma && per_channel_v,
        padded: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::presets::{preset, PRESETS};

    const HOPPER: Capabilities = Capabilities {
        wgmma: Some(WgmmaTiles {
            head_dims: &[64, 128],
            rows_per_cta: 128,
            rows_per_warpgroup: 64,
            keys_per_tile: 128,
        }),
        mma_head_dims: &[64, 128],
        max_head_dim: 512,
    };
    const AMPERE: Capabilities = Capabilities {
        wgmma: None,
        ..HOPPER
    };

    fn problem(d: usize, sq: usize, sk: usize) -> Problem {
        Problem {
            b: 1,
            hq: 4,
            hkv: 2,
            sq,
            sk,
            d,
            kv_lens: vec![sk],
            causal: false,
        }
    }

    fn plan_of(name: &str, d: usize, path: GpuPath, caps: &Capabilities) -> Plan {
        let cfg = preset(name).unwrap().config;
        plan(&problem(d, 100, 300), &cfg, path, caps, StoredKv::default()).unwrap()
    }

    /// The kernel each preset gets on Hopper at head dims 64 and 128: the list the README's
    /// kernel table states (BF16 wgmma for exact, FP8 wgmma for Fused-Softmax u8/fp32-bits,
    /// exp→E4M3, exp→MX P and EFQ, mma.sync for the rest).
    #[test]
    fn kernel_choice_follows_the_kernel_table() {
        let want = |name: &str| -> Kernel {
            match name {
                "exact" | "bf16" | "kv-mxfp8" | "kv-mxfp6" | "kv-mxfp4" => {
                    Kernel::Wgmma { fp8: false }
                }
                "fused" | "fused-mxfp8" | "fused-mxfp6" | "fused-mxfp4" | "mxfp8" | "mxfp6"
                | "mxfp4" | "efq" | "efq-mmlu" | "efq-mean" | "efq-exact" => {
                    Kernel::Wgmma { fp8: true }
                }
                _ => Kernel::Mma,
            }
        };
        for (name, _) in PRESETS {
            let got = plan_of(name, 128, GpuPath::Auto, &HOPPER).kernel;
            assert_eq!(got, want(name), "preset {name}");
            // head dim 64 takes the same kernel; GPUs without wgmma: mma.sync; Simple when asked
            assert_eq!(
                plan_of(name, 64, GpuPath::Auto, &HOPPER).kernel,
                want(name),
                "preset {name} at head dim 64"
            );
            assert_eq!(
                plan_of(name, 64, GpuPath::Auto, &AMPERE).kernel,
                Kernel::Mma
            );
            assert_eq!(
                plan_of(name, 128, GpuPath::Auto, &AMPERE).kernel,
                Kernel::Mma
            );
            assert_eq!(
                plan_of(name, 96, GpuPath::Auto, &HOPPER).kernel,
                Kernel::Simple
            );
            assert_eq!(
                plan_of(name, 128, GpuPath::Simple, &HOPPER).kernel,
                Kernel::Simple
            );
        }
    }

    /// exp→E4M3 P on FP8 operands is the one exp-then-quantize config on the FP8 wgmma path.
    #[test]
    fn exp_then_e4m3_takes_the_fp8_kernel() {
        use crate::attention::config::OperandFormat as F;
        let cfg = AttentionConfig::exp_then_quantize(
            F::mx(ElemFormat::E4M3),
            F::fp8_per_channel(),
            ProbFormat::Fp8 {
                elem: ElemFormat::E4M3,
            },
        );
        let pl = plan(
            &problem(128, 9, 9),
            &cfg,
            GpuPath::Auto,
            &HOPPER,
            StoredKv::default(),
        );
        let pl = pl.unwrap();
        assert_eq!(pl.kernel, Kernel::Wgmma { fp8: true });
        assert!(
            pl.per_channel_v && !pl.v_unscaled,
            "direct V packing scales itself"
        );
        let staged = plan(
            &problem(128, 9, 9),
            &cfg,
            GpuPath::WgmmaStaged,
            &HOPPER,
            StoredKv::default(),
        );
        assert!(staged.unwrap().v_unscaled);
    }

    #[test]
    fn staged_path_prepares_everything_and_pads_to_tiles() {
        let pl = plan_of("fused-mxfp8", 128, GpuPath::WgmmaStaged, &HOPPER);
        assert_eq!(
            (pl.q, pl.k, pl.v),
            (Source::Prepared, Source::Prepared, Source::Prepared)
        );
        assert_eq!(pl.padded, Some((128, 384)));
        let pl = plan_of("fused-mxfp8", 128, GpuPath::Auto, &HOPPER);
        assert_eq!(
            (pl.q, pl.k, pl.v),
            (Source::Direct, Source::Direct, Source::Direct)
        );
    }

    #[test]
    fn stored_operands_are_decoded_not_packed_from_the_input() {
        let cfg = preset("fused-mxfp8").unwrap().config;
        let stored = StoredKv {
            k: true,
            v_keys: 256,
        };
        for caps in [HOPPER, AMPERE] {
            let pl = plan(&problem(128, 1, 300), &cfg, GpuPath::Auto, &caps, stored).unwrap();
            assert_eq!((pl.k, pl.v), (Source::Stored, Source::Stored));
            assert_ne!(pl.q, Source::Direct, "Q and K share one packing scheme");
            assert_eq!(pl.v_stored_keys, 256);
        }
    }

    #[test]
    fn gpu_limits_are_errors() {
        let mut cfg = preset("mxfp4").unwrap().config;
        if let ProbFormat::Mx { block, .. } = &mut cfg.p_format {
            *block = 16;
        }
        let e = plan(
            &problem(128, 1, 8),
            &cfg,
            GpuPath::Auto,
            &HOPPER,
            StoredKv::default(),
        );
        assert!(e.unwrap_err().to_string().contains("32 keys"));
        let cfg = preset("exact").unwrap().config;
        let e = plan(
            &problem(1024, 1, 8),
            &cfg,
            GpuPath::Auto,
            &HOPPER,
            StoredKv::default(),
        );
        assert!(e.unwrap_err().to_string().contains("at most 512"));
        // the wide u8 code: the kernels hard-code the paper's margin
        let mut cfg = preset("fused-mxfp6").unwrap().config;
        if let Algorithm::FusedSoftmax(f) = &mut cfg.algorithm {
            f.probs = FusedProbs::U8CodeWide;
        }
        let e = plan(
            &problem(128, 1, 8),
            &cfg,
            GpuPath::Auto,
            &HOPPER,
            StoredKv::default(),
        );
        assert!(e.unwrap_err().to_string().contains("CPU only"));
    }
}
