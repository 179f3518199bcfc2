//! twinlease: a DHCPv4 server for a pair of branch-office boxes. docs/design.md has the map,
//! the origin documents ("seeds") and the safety rules; in short:
//!
//! * vocabulary: `lease` (bindings and compare-and-swap transitions), `clock`, `role`, `config`;
//! * machines, I/O-free (time and input in, actions out): `allocator` (seed 004's queue, busy
//!   entries, aliases, reaper), `dhcp` (RFC 2131 decisions), `sync::machine` (lease sync, seed
//!   003), `election::machine` (seeds 000–002);
//! * drivers: `store` (SQLite, one writer thread, group commit, file checks), `sync::link`
//!   (the authenticated connection to the partner), `election::driver` and its backends,
//!   `server` (sockets, engine, replication, sd_notify), `logging`;
//! * the console: `tui` (state and views I/O-free, a thin driver reading the sockets).

pub mod allocator;
pub mod clock;
pub mod config;
pub mod dhcp;
pub mod election;
pub mod events;
pub mod fuzzing;
pub mod lease;
pub mod logging;
pub mod role;
pub mod server;
pub mod store;
pub mod sync;
#[cfg(test)]
mod testkit;
pub mod tui;
pub mod update;
