//! Logging: to the journal when its socket exists (structured fields, unprefixed: ADDRESS,
//! CLIENT, TERM, ROLE, ...), else plain stderr. The filter comes from RUST_LOG, else the
//! config's `[log] filter`, else "info". TWINLEASE_LOG_STDERR=1 forces stderr.

use std::io::IsTerminal;

use tracing_journald::{Priority, PriorityMappings};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

pub fn init(config_filter: Option<&str>) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .or_else(|| config_filter.and_then(|f| EnvFilter::try_new(f).ok()))
        .unwrap_or_else(|| EnvFilter::new("info"));
    let journald = if std::path::Path::new(JOURNAL_SOCKET).exists() && std::env::var_os("TWINLEASE_LOG_STDERR").is_none() {
        tracing_journald::layer().ok()
    } else {
        None
    };
    let registry = tracing_subscriber::registry().with(filter);
    match journald {
        Some(j) => {
            // Fields go to the journal under their own names (ADDRESS=, CLIENT=, TERM=, ROLE=),
            // so `journalctl -u twinlease ADDRESS=198.18.0.7` finds one address's history.
            // Journal priorities as syslog means them: info is 6 (the crate's default says 5, notice).
            let priorities = PriorityMappings { error: Priority::Error, warn: Priority::Warning, info: Priority::Informational, debug: Priority::Debug, trace: Priority::Debug };
            let _ = registry.with(j.with_syslog_identifier("twinlease".into()).with_field_prefix(None).with_priority_mappings(priorities)).try_init();
        }
        None => {
            let _ = registry.with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal()).with_target(false)).try_init();
        }
    }
}
