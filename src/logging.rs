//! Logging: to the journal when its socket exists (structured fields, unprefixed: ADDRESS,
//! CLIENT, TERM, ROLE, ...), else plain stderr. The filter comes from RUST_LOG, else the
//! config's `[log] filter`, else "info". TWINLEASE_LOG_STDERR=1 forces stderr.

use std::io::IsTerminal;

use tracing_journald::{Priority, PriorityMappings};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Parses a RUST_LOG-style filter. The configuration's `[log] filter` is checked with this when
/// the file loads, so `init` never meets an invalid one there.
pub fn parse_filter(text: &str) -> Result<EnvFilter, tracing_subscriber::filter::ParseError> {
    EnvFilter::try_new(text)
}

pub fn init(config_filter: Option<&str>) {
    let from_env = std::env::var("RUST_LOG").ok().map(|text| {
        let parsed = parse_filter(&text);
        (text, parsed)
    });
    let (filter, bad_env) = match from_env {
        Some((_, Ok(f))) => (f, None),
        Some((text, Err(e))) => (fallback_filter(config_filter), Some((text, e))),
        None => (fallback_filter(config_filter), None),
    };
    let journald =
        if std::path::Path::new(JOURNAL_SOCKET).exists() && std::env::var_os("TWINLEASE_LOG_STDERR").is_none() {
            tracing_journald::layer().ok()
        } else {
            None
        };
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    // RUST_LOG set by hand (a test, a debugging session) wins over a reloaded configuration.
    if std::env::var_os("RUST_LOG").is_none() {
        let _ = RELOAD.set(handle);
    }
    let registry = tracing_subscriber::registry().with(filter);
    match journald {
        Some(j) => {
            // Fields go to the journal under their own names (ADDRESS=, CLIENT=, TERM=, ROLE=),
            // so `journalctl -u twinlease ADDRESS=198.18.0.7` finds one address's history.
            // Journal priorities as syslog means them: info is 6 (the crate's default says 5, notice).
            let priorities = PriorityMappings {
                error: Priority::Error,
                warn: Priority::Warning,
                info: Priority::Informational,
                debug: Priority::Debug,
                trace: Priority::Debug,
            };
            let _ = registry
                .with(
                    j.with_syslog_identifier("twinlease".into())
                        .with_field_prefix(None)
                        .with_priority_mappings(priorities),
                )
                .try_init();
        }
        None => {
            let _ = registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_writer(std::io::stderr)
                        .with_ansi(std::io::stderr().is_terminal())
                        .with_target(false),
                )
                .try_init();
        }
    }
    if let Some((text, error)) = bad_env {
        tracing::warn!(rust_log = %text, %error, "RUST_LOG is not a valid filter; using the [log] filter (or info)");
    }
}

type FilterHandle = tracing_subscriber::reload::Handle<EnvFilter, tracing_subscriber::Registry>;

/// Where a configuration reload puts a new `[log] filter`.
static RELOAD: std::sync::OnceLock<FilterHandle> = std::sync::OnceLock::new();

/// Replaces the running filter (a configuration reload). Ignored when RUST_LOG set it, or
/// before `init`; the filter was checked when the file loaded.
pub fn set_filter(text: &str) {
    if let (Some(handle), Ok(filter)) = (RELOAD.get(), parse_filter(text)) {
        match handle.reload(filter) {
            Ok(()) => tracing::info!(filter = text, "log filter changed"),
            Err(e) => tracing::warn!(error = %e, "cannot change the log filter"),
        }
    }
}

fn fallback_filter(config_filter: Option<&str>) -> EnvFilter {
    config_filter.and_then(|f| parse_filter(f).ok()).unwrap_or_else(|| EnvFilter::new("info"))
}

/// Keeps a repeated warning readable under attack or a fault storm: at most `burst` lines per
/// `window`; what is held back is counted and reported with the next line let through, so the
/// log says how many happened without writing each one. Time is passed in.
#[derive(Debug, Clone)]
pub struct Throttle {
    window: std::time::Duration,
    burst: u32,
    window_start: Option<std::time::Instant>,
    let_through: u32,
    held_back: u64,
}

impl Throttle {
    pub const fn new(window: std::time::Duration, burst: u32) -> Throttle {
        Throttle { window, burst, window_start: None, let_through: 0, held_back: 0 }
    }

    /// `Some(n)`: log this one, mentioning the `n` held back since the last line written.
    /// `None`: count it and stay quiet.
    pub fn admit(&mut self, now: std::time::Instant) -> Option<u64> {
        let fresh = self.window_start.is_none_or(|s| now.saturating_duration_since(s) >= self.window);
        if fresh {
            self.window_start = Some(now);
            self.let_through = 0;
        }
        if self.let_through < self.burst {
            self.let_through += 1;
            return Some(std::mem::take(&mut self.held_back));
        }
        self.held_back += 1;
        None
    }
}

/// A warning that can repeat once per packet (pool exhausted, DHCPNAK, reclaimed offers): the
/// first occurrence after a quiet window is written as it happens, the rest are only counted,
/// and [`Self::summary`] (called about once a second) hands out the count once per window for
/// one summary line ("N more in the last 10 s"). So a flood writes at most two lines per window
/// per kind, however fast it is. Time is passed in.
#[derive(Debug, Clone)]
pub struct Summarised {
    window: std::time::Duration,
    /// When the current window opened; `None` after a window with nothing held back.
    window_start: Option<std::time::Instant>,
    held_back: u64,
}

impl Summarised {
    pub const fn new(window: std::time::Duration) -> Summarised {
        Summarised { window, window_start: None, held_back: 0 }
    }

    /// True: write this occurrence now. False: it is counted for the summary.
    pub fn occurred(&mut self, now: std::time::Instant) -> bool {
        if self.window_start.is_none() {
            self.window_start = Some(now);
            return true;
        }
        self.held_back += 1;
        false
    }

    /// `Some(n)` once the window is over and `n > 0` occurrences were held back in it: write
    /// the summary. A window that held nothing back ends quietly, and the next occurrence is
    /// written at once again.
    pub fn summary(&mut self, now: std::time::Instant) -> Option<u64> {
        let start = self.window_start?;
        if now.saturating_duration_since(start) < self.window {
            return None;
        }
        let held_back = std::mem::take(&mut self.held_back);
        self.window_start = (held_back > 0).then_some(now);
        (held_back > 0).then_some(held_back)
    }

    pub fn window_secs(&self) -> u64 {
        self.window.as_secs()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Summarised, Throttle};

    #[test]
    fn a_summarised_warning_writes_two_lines_per_window_under_a_flood() {
        let t0 = Instant::now();
        let secs = |s: u64| t0 + Duration::from_millis(s * 1000);
        let mut w = Summarised::new(Duration::from_secs(10));
        let mut lines = 0;
        // 60 s of 1,000 occurrences a second, summaries asked for every second.
        for s in 0..60 {
            lines += (0..1000).filter(|_| w.occurred(secs(s))).count();
            lines += usize::from(w.summary(secs(s + 1)).is_some());
        }
        assert!(lines <= 7, "{lines} lines in a minute");
        // The flood's tail comes out when its window is over, then the log is quiet, and the
        // next occurrence is written at once.
        assert_eq!((0..5).filter(|_| w.occurred(secs(60))).count(), 0);
        assert_eq!(w.summary(secs(65)), None);
        assert_eq!(w.summary(secs(70)), Some(5));
        assert_eq!(w.summary(secs(80)), None);
        assert_eq!(w.summary(secs(100)), None);
        assert!(w.occurred(secs(101)));
        assert!(!w.occurred(secs(101)));
        assert_eq!(w.summary(secs(111)), Some(1));
    }

    #[test]
    fn a_throttle_lets_a_burst_through_per_window_and_counts_the_rest() {
        let t0 = Instant::now();
        let mut t = Throttle::new(Duration::from_secs(10), 3);
        let got: Vec<Option<u64>> = (0..1000).map(|_| t.admit(t0)).collect();
        assert_eq!(got.iter().filter(|g| g.is_some()).count(), 3);
        assert_eq!(&got[..3], &[Some(0), Some(0), Some(0)]);
        // The next window's first line reports the 997 held back.
        assert_eq!(t.admit(t0 + Duration::from_secs(10)), Some(997));
        assert_eq!(t.admit(t0 + Duration::from_secs(11)), Some(0));
    }
}
