//! Helpers shared by the Wan test files: a tensor difference and a recording attention
//! policy.
#![allow(dead_code)]

use candle_core::Tensor;
use mxattn::attention::AttentionConfig;
use mxattn_wan::{AttnPolicy, AttnSite};
use std::sync::Mutex;

/// [`mxattn::oracle::max_abs_diff`], for tests.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    mxattn::oracle::max_abs_diff(a, b).unwrap()
}

/// An attention policy that records every call site a model asks about and answers `cfg`.
pub struct Recorder {
    pub cfg: AttentionConfig,
    sites: Mutex<Vec<AttnSite>>,
}

impl Recorder {
    pub fn new(cfg: AttentionConfig) -> Self {
        Self {
            cfg,
            sites: Mutex::new(Vec::new()),
        }
    }

    /// Answers exact attention.
    pub fn exact() -> Self {
        Self::new(AttentionConfig::exact())
    }

    /// The sites asked about so far, in order.
    pub fn sites(&self) -> Vec<AttnSite> {
        self.sites.lock().unwrap().clone()
    }
}

impl AttnPolicy for Recorder {
    fn config(&self, site: &AttnSite) -> AttentionConfig {
        self.sites.lock().unwrap().push(*site);
        self.cfg.clone()
    }
}
