//! systemd readiness and status (sd_notify). Every call is a no-op without NOTIFY_SOCKET.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;

use super::engine::EngineStats;
use crate::config::Config;
use crate::role::RoleRx;
use crate::store::writer::WriterStats;

fn send(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_some()
        && let Err(e) = sd_notify::notify(false, states)
    {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

pub struct StatusReporter {
    role: RoleRx,
    engine: Arc<EngineStats>,
    writer: Arc<WriterStats>,
    started: Instant,
}

impl StatusReporter {
    pub fn new(role: RoleRx, engine: Arc<EngineStats>, writer: Arc<WriterStats>, started: Instant) -> StatusReporter {
        StatusReporter { role, engine, writer, started }
    }

    /// One line for `systemctl status`.
    pub fn line(&self) -> String {
        let role = *self.role.borrow();
        let term = role.term().map(|t| format!(" (term {t})")).unwrap_or_default();
        format!(
            "{}{}, {} leases, {} ACKs, {} store commits",
            role.name(),
            term,
            self.engine.leases.load(Ordering::Relaxed),
            self.engine.acks.load(Ordering::Relaxed),
            self.writer.commits.load(Ordering::Relaxed)
        )
    }

    pub async fn run(self, _cfg: Arc<Config>) {
        let _ = self.started;
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            send(&[NotifyState::Status(&self.line())]);
        }
    }
}
