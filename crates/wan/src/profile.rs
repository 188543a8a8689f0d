//! Timing hooks of a Wan run, as `tracing` spans: every transformer attention call is a span
//! `attention` (target [`ATTENTION`]), every block stage a span `stage` with the stage's
//! `name` (target [`STAGES`]; the attention spans nest inside the attention stages). With no subscriber listening they cost one disabled-span check. When
//! one listens (e.g. `mxattn_cli::spans::SpanTimes`), the device is synchronized before the
//! span is entered and before it is left, so the span's time is the kernels', not the
//! launches'; that serializes the run: listen for measurements only.

use candle_core::{Device, Result};

/// The `tracing` target of the attention-call spans.
pub const ATTENTION: &str = "mxattn_wan::profile::attention";
/// The `tracing` target of the block-stage spans.
pub const STAGES: &str = "mxattn_wan::profile::stage";

/// Runs `f` in a device-synchronized span when the span is enabled.
fn synchronized<T>(
    device: &Device,
    span: tracing::Span,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if span.is_disabled() {
        return f();
    }
    device.synchronize()?;
    let _entered = span.enter();
    let out = f()?;
    device.synchronize()?;
    Ok(out)
}

/// Runs one attention call `f` in the span `attention`.
pub fn timed<T>(device: &Device, f: impl FnOnce() -> Result<T>) -> Result<T> {
    synchronized(
        device,
        tracing::trace_span!(target: "mxattn_wan::profile::attention", "attention"),
        f,
    )
}

/// Runs `f` as the block stage `name`, in a span `stage` with that name.
pub fn stage<T>(device: &Device, name: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    synchronized(
        device,
        tracing::trace_span!(target: "mxattn_wan::profile::stage", "stage", name = name),
        f,
    )
}
