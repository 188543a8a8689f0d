//! The span timer: off, spans are disabled (what the library checks before synchronizing a
//! device); on, each span's time is summed under its `name` field or its span name, and only
//! for the chosen target.

use mxattn_cli::spans::SpanTimes;
use std::time::Duration;

#[test]
fn spans_are_timed_by_label_only_when_on() {
    let t = SpanTimes::install("timer_test::hot").unwrap();
    // a second install fails: one process-wide subscriber
    assert!(SpanTimes::install("timer_test::hot").is_err());
    let off = tracing::trace_span!(target: "timer_test::hot", "attention");
    assert!(off.is_disabled(), "off: spans are disabled");
    t.set_on(true);
    for _ in 0..3 {
        let s = tracing::trace_span!(target: "timer_test::hot", "attention");
        assert!(!s.is_disabled());
        let _e = s.enter();
        std::thread::sleep(Duration::from_millis(5));
    }
    {
        let s = tracing::trace_span!(target: "timer_test::hot", "stage", name = "ffn");
        let _e = s.enter();
        std::thread::sleep(Duration::from_millis(2));
    }
    let other = tracing::trace_span!(target: "timer_test::cold", "attention");
    assert!(other.is_disabled(), "other targets are not listened to");
    let got = t.take();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((got[0].0.as_str(), got[0].2), ("attention", 3));
    assert!(got[0].1 >= 0.015 && got[0].1 < 1.0, "{got:?}");
    assert_eq!((got[1].0.as_str(), got[1].2), ("ffn", 1));
    assert!(t.take().is_empty(), "take resets");
    t.set_on(false);
    assert!(tracing::trace_span!(target: "timer_test::hot", "attention").is_disabled());
    assert_eq!(t.take_label("attention"), (0.0, 0));
}
