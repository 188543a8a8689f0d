//! Where a forward's time goes: each stage of a decoder layer (projections, norms, RoPE,
//! cache append, attention, MLP) and of the model (embedding, output head) runs in a
//! `tracing` span `stage` with the stage's `name` (target [`STAGES`]); sampling in one named
//! `sampling`. With no subscriber listening a span costs one disabled-span check. When one
//! listens (e.g. `mxattn_cli::spans::SpanTimes`, `chat --profile`), the device is
//! synchronized before the span is entered and before it is left, so a span's time is its
//! kernels', not their launches': that serializes the run, so listen for measurements only.

use candle_core::{Device, Result};

/// The `tracing` target of the stage spans.
pub const STAGES: &str = "mxattn_llm::profile::stage";

/// Runs `f` as the stage `name`, device-synchronized when the span is enabled.
pub fn stage<T>(device: &Device, name: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let span = tracing::trace_span!(target: "mxattn_llm::profile::stage", "stage", name = name);
    if span.is_disabled() {
        return f();
    }
    device.synchronize()?;
    let _entered = span.enter();
    let out = f()?;
    device.synchronize()?;
    Ok(out)
}
