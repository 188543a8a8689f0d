//! Wan2.2 text-to-video: the UMT5 text encoder, the Wan diffusion transformer (T2V-A14B's two
//! experts and TI2V-5B), the causal 3-D VAE decoders (Wan2.1 and Wan2.2), the flow-matching
//! schedulers, and the pipeline that joins them with CFG and an attention schedule.
//!
//! Every attention call of the transformer and of the VAE's mid block goes through
//! [`mxattn::attention::attention`] with a config chosen per call site ([`AttnSite`]), so a
//! schedule can pick the algorithm per expert, step, layer and self/cross without the model
//! knowing which kernel runs.

use mxattn::attention::AttentionConfig;

pub mod fidelity;
pub mod generate;
pub mod pipeline;
pub mod profile;
pub mod schedule;
pub mod scheduler;
pub mod sizes;
pub mod transformer;
pub mod umt5;
pub mod vae;

/// Which attention of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnKind {
    /// Self-attention over the video tokens.
    SelfAttn,
    /// Cross-attention from the video tokens to the text.
    CrossAttn,
    /// The VAE decoder's per-frame mid-block attention.
    VaeMid,
}

/// One attention call site, as a schedule sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttnSite {
    /// 0 = the high-noise expert (or the only transformer), 1 = the low-noise expert.
    pub expert: usize,
    /// Denoising step index (0-based); 0 for the VAE.
    pub step: usize,
    /// Transformer block index; 0 for the VAE.
    pub layer: usize,
    pub kind: AttnKind,
}

/// Picks the attention config of each call site.
pub trait AttnPolicy: Send + Sync {
    fn config(&self, site: &AttnSite) -> AttentionConfig;
}

/// The same config everywhere.
impl AttnPolicy for AttentionConfig {
    fn config(&self, _site: &AttnSite) -> AttentionConfig {
        self.clone()
    }
}
