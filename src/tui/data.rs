//! What the console shows, as plain values: one [`Snapshot`] per refresh, read by the
//! [`source`](super::source) driver from the status socket and the lease store. The views only
//! ever see these, so every screen can be rendered from a fixed snapshot.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use crate::server::control::Status;

/// One refresh: the box's status (or why there is none) and, when re-read, the store's tables.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Wall clock of the reading, seconds since the epoch (lease countdowns count from it).
    pub taken_unix: u64,
    /// `Err`: why the daemon did not answer (not running, permission, ...).
    pub status: Result<Status, String>,
    /// `None`: not re-read this time (nothing changed); `Err`: why the store could not be read.
    pub leases: Option<Result<Vec<LeaseRow>, String>>,
    pub conflicts: Option<Result<Vec<ConflictRow>, String>>,
    /// `Ok`: the control socket takes actions from us; `Err`: why not.
    pub control: Result<(), String>,
    /// The answer to the update this console started, once it has come (`Err`: refused).
    pub update_answer: Option<Result<String, String>>,
}

/// A bundle in the console's bundle directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleRow {
    pub path: PathBuf,
    pub file: String,
    pub bytes: u64,
    /// The version its signed manifest names, or why it cannot go into this box (bad
    /// signature, another architecture, not a bundle).
    pub version: Result<String, String>,
}

/// What the update dialog offers: this box's slots and the bundles to choose from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateChoices {
    /// Where bundles are looked for.
    pub dir: String,
    /// `update-status`'s summary, or why there is none.
    pub slots: Result<String, String>,
    pub bundles: Result<Vec<BundleRow>, String>,
}

/// One row of the lease table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub address: Ipv4Addr,
    pub state: String,
    /// Client identifier (or "-").
    pub client: String,
    pub hw: String,
    pub hostname: String,
    pub expires: u64,
    /// Client's last transaction time.
    pub cltt: u64,
    pub term: u64,
    /// Local change counter.
    pub version: u64,
    /// The partner holds this version.
    pub synced: bool,
}

impl LeaseRow {
    /// Whether `needle` (lower case) is part of the address, MAC or hostname.
    pub fn matches(&self, needle: &str) -> bool {
        needle.is_empty()
            || self.address.to_string().contains(needle)
            || self.hw.to_ascii_lowercase().contains(needle)
            || self.hostname.to_ascii_lowercase().contains(needle)
    }
}

/// One side of a resolved conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictSide {
    pub address: Ipv4Addr,
    pub state: String,
    pub client: String,
    pub term: u64,
    pub cltt: u64,
}

/// A conflict lease sync resolved: both bindings and which one was kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictRow {
    pub at: u64,
    /// "address" (one address, two clients) or "client" (one client, two addresses).
    pub kind: String,
    pub kept: ConflictSide,
    pub lost: ConflictSide,
}

impl ConflictRow {
    pub fn involves(&self, address: Ipv4Addr) -> bool {
        self.kept.address == address || self.lost.address == address
    }
}

/// Seconds since the epoch as "2026-11-22 15:40:02" (UTC).
pub fn utc(secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    humantime::format_rfc3339_seconds(t).to_string().replace('T', " ").trim_end_matches('Z').to_string()
}

/// A span of seconds in the largest unit that reads well: "45 s", "12 min", "3 h 5 min", "2 d 4 h".
pub fn span(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        s => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}
