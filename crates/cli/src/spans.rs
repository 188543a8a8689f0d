//! Timing of `tracing` spans for the programs' `--profile-*` flags. The library crates mark
//! what is worth timing with spans (candle's convention) and pay nothing while no subscriber
//! listens; a program installs [`SpanTimes`] to sum each span's time by label (the span's
//! `name` field if it has one, else its name).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

struct Inner {
    target: &'static str,
    on: AtomicBool,
    /// (label, seconds, spans), in first-seen order.
    totals: Mutex<Vec<(String, f64, u64)>>,
}

/// Sums the time of the spans of one target; off (spans disabled) until [`SpanTimes::set_on`].
#[derive(Clone)]
pub struct SpanTimes(Arc<Inner>);

impl SpanTimes {
    /// Installs the process-wide subscriber timing the spans of `target` (e.g.
    /// `mxattn_wan::profile`). Fails if another subscriber is installed already.
    pub fn install(target: &'static str) -> Result<Self, String> {
        let inner = Arc::new(Inner {
            target,
            on: AtomicBool::new(false),
            totals: Mutex::new(Vec::new()),
        });
        let layer = Times(inner.clone());
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .map_err(|e| format!("installing the span timer: {e}"))?;
        Ok(Self(inner))
    }

    /// Enables or disables the spans (disabled spans cost nothing and are not timed).
    pub fn set_on(&self, on: bool) {
        self.0.on.store(on, Ordering::Relaxed);
    }

    /// `(label, seconds, spans)` since the last take, in first-seen order; resets them.
    pub fn take(&self) -> Vec<(String, f64, u64)> {
        std::mem::take(&mut *self.0.totals.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Seconds and count of the spans labelled `label` since the last take (all labels reset).
    pub fn take_label(&self, label: &str) -> (f64, u64) {
        self.take()
            .into_iter()
            .find(|(l, _, _)| l == label)
            .map_or((0.0, 0), |(_, s, n)| (s, n))
    }
}

struct Times(Arc<Inner>);
struct Label(String);
struct Entered(Instant);

struct NameField(Option<String>);

impl Visit for NameField {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "name" {
            self.0 = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "name" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Times {
    // A global filter: spans of other targets, or of this one while off, are disabled, so
    // the library skips its device synchronization.
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        // "sometimes": asked again for every span, since `on` changes at run time
        if meta.target() == self.0.target {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _cx: Context<'_, S>) -> bool {
        meta.target() == self.0.target && self.0.on.load(Ordering::Relaxed)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut v = NameField(None);
        attrs.record(&mut v);
        let label = v.0.unwrap_or_else(|| attrs.metadata().name().to_string());
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Label(label));
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Entered(Instant::now()));
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        let Some(Entered(t0)) = ext.remove::<Entered>() else {
            return;
        };
        let secs = t0.elapsed().as_secs_f64();
        let label = ext
            .get_mut::<Label>()
            .map(|l| l.0.clone())
            .unwrap_or_default();
        let mut totals = self.0.totals.lock().unwrap_or_else(|e| e.into_inner());
        match totals.iter_mut().find(|e| e.0 == label) {
            Some(e) => {
                e.1 += secs;
                e.2 += 1;
            }
            None => totals.push((label, secs, 1)),
        }
    }
}
