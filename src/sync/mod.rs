//! Lease sync between the two boxes of a pair (seed 003, with the conflict rule it left open).
//!
//! * `protocol` — the messages and their byte encoding;
//! * `merge` — the conflict rule and how a partner's binding enters the local table;
//! * `machine` — the I/O-free session state machine (catch-up, acks, deadlines, heartbeats);
//! * `frame` — length-prefixed frames authenticated with HMAC-SHA256, replay-proof;
//! * `link` — the one TCP connection to the partner (tokio).
//!
//! The driver (`server::replication`) owns a [`machine::SyncSession`], feeds it link events and the
//! engine's lease changes, and carries out its actions against the allocator and the store.

pub mod frame;
pub mod link;
pub mod machine;
pub mod merge;
pub mod protocol;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::allocator::Allocator;
use crate::lease::Binding;
use machine::Table;
use protocol::Bucket;

pub use machine::Readiness;

/// FNV-1a, 64 bit: a hash both boxes compute identically whatever build or platform they run
/// (std's hasher makes no such promise).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Per /24, a count and an order-independent sum of the content hashes of touched bindings.
pub fn digest<'a>(bindings: impl Iterator<Item = &'a Binding>) -> Vec<Bucket> {
    let mut m: BTreeMap<u32, Bucket> = BTreeMap::new();
    let mut buf = Vec::with_capacity(96);
    for b in bindings {
        if is_untouched(b) {
            continue;
        }
        buf.clear();
        protocol::content_bytes(b, &mut buf);
        let prefix = u32::from(b.addr) >> 8;
        let e = m.entry(prefix).or_insert(Bucket { prefix, count: 0, hash: 0 });
        e.count += 1;
        e.hash = e.hash.wrapping_add(fnv1a(&buf));
    }
    m.into_values().collect()
}

/// Content equal to a never-used address: both boxes treat it as absent.
fn is_untouched(b: &Binding) -> bool {
    merge::same_content(b, &Binding::fresh(b.addr))
}

impl Table for Allocator {
    fn binding(&self, addr: Ipv4Addr) -> Option<Binding> {
        Allocator::binding(self, addr).cloned()
    }

    fn to_send(&self, full: bool) -> Vec<Ipv4Addr> {
        if full { self.touched_addrs() } else { self.unsynced_addrs() }
    }

    fn digest(&self) -> Vec<Bucket> {
        digest(self.bindings())
    }

    fn bucket(&self, prefix: u32) -> Vec<Binding> {
        let mut v: Vec<Binding> =
            self.bindings().filter(|b| u32::from(b.addr) >> 8 == prefix && !is_untouched(b)).cloned().collect();
        v.sort_by_key(|b| b.addr);
        v
    }
}
