//! Optional timing of the attention calls of a Wan run, for the share of time spent in
//! attention. Off by default; when on, each timed call synchronizes the device before and
//! after (so the time is the kernel's, not the launch's), which also serializes the run:
//! enable it for measurements only.

use candle_core::{Device, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

static ENABLED: AtomicBool = AtomicBool::new(false);
static NANOS: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Turns timing on or off.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Seconds spent in timed calls and their count since the last reset.
pub fn take() -> (f64, u64) {
    (
        NANOS.swap(0, Ordering::Relaxed) as f64 * 1e-9,
        CALLS.swap(0, Ordering::Relaxed),
    )
}

/// Runs `f`, adding its (device-synchronized) time to the total when timing is on.
pub fn timed<T>(device: &Device, f: impl FnOnce() -> Result<T>) -> Result<T> {
    if !enabled() {
        return f();
    }
    let (out, secs) = synchronized(device, f)?;
    NANOS.fetch_add((secs * 1e9) as u64, Ordering::Relaxed);
    CALLS.fetch_add(1, Ordering::Relaxed);
    Ok(out)
}

/// `f`'s result and its seconds between device synchronizations (so the time is the kernels',
/// not the launches').
fn synchronized<T>(device: &Device, f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    device.synchronize()?;
    let t0 = Instant::now();
    let out = f()?;
    device.synchronize()?;
    Ok((out, t0.elapsed().as_secs_f64()))
}

static STAGES_ON: AtomicBool = AtomicBool::new(false);
static STAGES: std::sync::Mutex<Vec<(&'static str, f64, u64)>> = std::sync::Mutex::new(Vec::new());

/// Turns the per-stage timing of the transformer blocks ([`stage`]) on or off.
pub fn set_stages(on: bool) {
    STAGES_ON.store(on, Ordering::Relaxed);
}

/// Runs `f` as the stage `name` of a block: when stage timing is on, its device-synchronized
/// time is added to that stage's total (in first-seen order).
pub fn stage<T>(device: &Device, name: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    if !STAGES_ON.load(Ordering::Relaxed) {
        return f();
    }
    let (out, dt) = synchronized(device, f)?;
    let mut s = STAGES.lock().unwrap_or_else(|e| e.into_inner());
    match s.iter_mut().find(|e| e.0 == name) {
        Some(e) => {
            e.1 += dt;
            e.2 += 1;
        }
        None => s.push((name, dt, 1)),
    }
    Ok(out)
}

/// `(stage, seconds, calls)` since the last call, in first-seen order; resets them.
pub fn take_stages() -> Vec<(&'static str, f64, u64)> {
    std::mem::take(&mut *STAGES.lock().unwrap_or_else(|e| e.into_inner()))
}
