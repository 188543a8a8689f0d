//! The on-device checks of a call (non-finite inputs, overflowing scores) and its rollback
//! count: read per call, or gathered per device for [`crate::attention::check_device`].

use super::*;

/// The check flags and rollback counter of a call, `[rollbacks, flags]` in one buffer so a
/// per-call check is one read: a fresh buffer, or the device's gathered one (deferred).
pub(super) enum Checks<'a> {
    Fresh(CudaSlice<u64>),
    Gathered(std::sync::MutexGuard<'a, Vec<Gathered>>, usize),
}

impl Checks<'static> {
    pub(super) fn take(op: &AttentionOp, dev: &CudaDevice) -> Result<Self> {
        if !op.deferred {
            return Ok(Checks::Fresh(dev.alloc_zeros::<u64>(2)?));
        }
        let mut gathered = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
        let i = join_gathered(&mut gathered, dev)?;
        Ok(Checks::Gathered(gathered, i))
    }
}

impl Checks<'_> {
    fn buf(&mut self) -> &mut CudaSlice<u64> {
        match self {
            Checks::Fresh(b) => b,
            Checks::Gathered(g, i) => &mut g[*i].checks,
        }
    }

    /// Device addresses of the rollback counter and of the flags (the low half of the
    /// second word: little-endian).
    pub(super) fn ptrs(&mut self, stream: &Arc<CudaStream>) -> (u64, u64) {
        let base = self.buf().device_ptr_mut(stream).0;
        (base, base + 8)
    }

    /// A per-call check reads the buffer (the call's one synchronization) and errs on a
    /// flag; a deferred one leaves it to [`check_deferred`].
    pub(super) fn finish(mut self, op: &AttentionOp, stream: &Arc<CudaStream>) -> Result<()> {
        if let Checks::Fresh(b) = &mut self {
            let [rb, flags] = stream.clone_dtoh(&*b).map_err(candle_core::Error::wrap)?[..] else {
                bail!("attention: internal error: check buffer");
            };
            check_flags(flags as u32 as i32, "attention")?;
            op.stats.rollbacks.fetch_add(rb, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// The errors the kernels' check flags stand for.
pub(super) fn check_flags(flags: i32, what: &str) -> Result<()> {
    if flags & 1 != 0 {
        bail!("{what}: q or k holds a non-finite value (NaN or Inf)");
    }
    if flags & 2 != 0 {
        bail!("{what}: v holds a non-finite value (NaN or Inf)");
    }
    if flags & 4 != 0 {
        bail!("{what}: a score overflows f32");
    }
    if flags & 16 != 0 {
        bail!("{what}: an FP8 linear layer's input holds a non-finite value (NaN or Inf)");
    }
    if flags & 8 != 0 {
        bail!("{what}: internal error: the wgmma kernel's shared memory is not 1024-byte aligned");
    }
    Ok(())
}

/// The check flags and rollbacks of one device's deferred calls since the last check.
pub(super) struct Gathered {
    device: candle_core::cuda_backend::DeviceId,
    /// `[rollbacks, flags]`, as [`Checks`] lays them out.
    checks: CudaSlice<u64>,
    calls: u64,
}

/// The device address of `dev`'s gathered flag word (the low half of `[rollbacks, flags]`'s
/// second word), counting one call: the FP8 linear layers' activation quantization ORs its
/// flag (16: a non-finite input) into it, so [`check_deferred`] reports it with attention's.
/// The buffer lives as long as the process (entries are reset, never removed), so the
/// address stays valid for kernels queued on the device's stream.
pub(crate) fn deferred_flags_addr(dev: &CudaDevice) -> Result<u64> {
    let mut gathered = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
    let i = join_gathered(&mut gathered, dev)?;
    let stream = dev.cuda_stream();
    let base = gathered[i].checks.device_ptr_mut(&stream).0;
    Ok(base + 8)
}

pub(super) static DEFERRED: std::sync::Mutex<Vec<Gathered>> = std::sync::Mutex::new(Vec::new());

/// The index of `dev`'s gathered checks (made on its first deferred call), counting one
/// more call into them.
fn join_gathered(gathered: &mut Vec<Gathered>, dev: &CudaDevice) -> Result<usize> {
    let i = match gathered.iter().position(|g| g.device == dev.id()) {
        Some(i) => i,
        None => {
            gathered.push(Gathered {
                device: dev.id(),
                checks: dev.alloc_zeros::<u64>(2)?,
                calls: 0,
            });
            gathered.len() - 1
        }
    };
    gathered[i].calls += 1;
    Ok(i)
}

/// [`crate::attention::check_device`] on CUDA: reads (a synchronization of the device's
/// stream) and resets the gathered flags and counters.
pub(crate) fn check_deferred(
    dev: &candle_core::cuda_backend::CudaDevice,
) -> Result<crate::attention::DeferredReport> {
    let mut gathered = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
    let Some(g) = gathered.iter_mut().find(|g| g.device == dev.id()) else {
        return Ok(Default::default());
    };
    if g.calls == 0 {
        // nothing gathered since the last check: no read, no synchronization
        return Ok(Default::default());
    }
    let stream = dev.cuda_stream();
    let read = stream
        .clone_dtoh(&g.checks)
        .map_err(candle_core::Error::wrap)?;
    let (rollbacks, flags) = (read[0], read[1] as u32 as i32);
    let calls = g.calls;
    stream
        .memset_zeros(&mut g.checks)
        .map_err(candle_core::Error::wrap)?;
    g.calls = 0;
    check_flags(
        flags,
        &format!(
            "attention or FP8 linear (one of the {calls} calls with deferred checks since the last check)"
        ),
    )?;
    Ok(crate::attention::DeferredReport { calls, rollbacks })
}
