//! twinlease: a DHCPv4 server for a pair of branch-office boxes.
//!
//! Where each design seed lives:
//! * `allocator` — seed 004, the queue/busy/alias/compare-and-swap address allocator;
//! * `store` — the durable SQLite lease store (one writer thread, group commit);
//! * `dhcp` — RFC 2131 decisions: message + context + now → reply + store operations (no I/O);
//! * `server` — the tokio driver: sockets, ping checks, reaper, readiness;
//! * `election` — seeds 000–002, who may serve: an I/O-free state machine against a SQL arbiter.

pub mod allocator;
pub mod clock;
pub mod config;
pub mod dhcp;
pub mod election;
pub mod lease;
pub mod store;
pub mod sync;
pub mod logging;
pub mod role;
pub mod server;
#[cfg(test)]
mod testkit;
