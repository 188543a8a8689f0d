//! GPU timing for the benchmarks: CUDA events on the device's stream after warm-up.

use candle_core::{bail, Device, Result, Tensor};

/// Mean milliseconds of `f` over `iters` calls, timed with CUDA events on `dev`'s stream
/// after `warmup` calls and a synchronization (the launches queue back to back, so the time
/// is the device's, not the host's).
pub fn cuda_time_ms(
    dev: &Device,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<Tensor>,
) -> Result<f64> {
    let Device::Cuda(cd) = dev else {
        bail!("timing needs a CUDA device, got {dev:?}")
    };
    if iters == 0 {
        bail!("timing needs at least one timed iteration");
    }
    let stream = cd.cuda_stream();
    for _ in 0..warmup {
        f()?;
    }
    let e = candle_core::Error::wrap;
    stream.synchronize().map_err(e)?;
    let flags =
        Some(candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(flags).map_err(e)?;
    for _ in 0..iters {
        f()?;
    }
    let end = stream.record_event(flags).map_err(e)?;
    Ok(start.elapsed_ms(&end).map_err(e)? as f64 / iters as f64)
}
