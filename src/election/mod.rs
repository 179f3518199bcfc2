//! Who may serve: the election of seeds 000–002 against a SQL arbiter.
//!
//! * `machine` — the client algorithm, I/O-free (time and call results in, calls and role
//!   changes out), with the lease rule that closes the seed's dual-primary window;
//! * `driver` — the tokio task that runs the machine, puts a deadline on every call, publishes
//!   the role on the watch channel the DHCP path checks, and logs every role change;
//! * `peer` — the partner's votes in and out over the peer link lease sync owns;
//! * `promise` — a granted standby promise on disk, so a restarted process keeps it;
//! * `backend` — UpdateHeartBeat / GetPrimary as single SQL statements for PostgreSQL,
//!   MariaDB and SQLite, behind one trait;
//! * `model` (tests) — an exhaustive explorer that checks "at most one active" with message
//!   loss and delay, crashes, failing writes and clock drift.

pub mod backend;
pub mod driver;
pub mod machine;
#[cfg(test)]
mod model;
pub mod peer;
pub mod promise;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod three_voters;

use std::time::Duration;

pub use uuid::Uuid;

pub use backend::{ArbiterError, Beat, Claim, HolderRow};
pub use driver::{Election, ElectionCommand, ElectionError, ElectionHooks, ElectionView};
pub use machine::{Basis, Call, DemoteReason, Effect, Elector, HaltReason, PromiseAsk, Reply};

/// The two election timers. T > 2I (checked when the configuration loads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Params {
    /// I: one arbiter call per interval (plus at most one claim right after an empty read).
    pub interval: Duration,
    /// T: how long the arbiter counts a heartbeat.
    pub timeout: Duration,
}

impl Params {
    pub fn from_config(a: &crate::config::Arbiter) -> Params {
        Params { interval: a.interval, timeout: a.timeout }
    }
}
