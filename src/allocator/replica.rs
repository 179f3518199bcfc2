//! What lease sync needs from the allocator: which bindings the partner holds (sync marks),
//! installing a binding that came from the partner, and finding a client's other address.
//!
//! Versions are local: every change on this box, including one copied from the partner, bumps
//! this box's version of the address. The partner's version only travels back in its
//! acknowledgement, so a mark is always a compare against *this* box's version and a change
//! made while an update was in flight stays unsynced.

use std::net::Ipv4Addr;

use super::Allocator;
use crate::lease::{Binding, ClientKey, Transition};

impl Allocator {
    /// Overlays stored bindings together with their sync marks.
    pub fn load_with_marks(&mut self, stored: impl IntoIterator<Item = (Binding, u64)>) -> Vec<Binding> {
        let mut orphans = Vec::new();
        for (b, synced) in stored {
            let addr = b.addr;
            match self.slots.get(&addr) {
                Some(_) => {
                    self.install(b);
                    if let Some(s) = self.slots.get_mut(&addr) {
                        s.synced = synced;
                    }
                }
                None => orphans.push(b),
            }
        }
        orphans
    }

    /// Whether the partner holds this address's current binding. A never-touched address
    /// (version 0) counts as synced: both boxes start with it.
    pub fn is_synced(&self, addr: Ipv4Addr) -> bool {
        self.slots.get(&addr).is_some_and(|s| s.synced == s.b.version)
    }

    /// The partner acknowledged `version` of `addr`: marks it synced if it is still current.
    pub fn mark_synced(&mut self, addr: Ipv4Addr, version: u64) -> bool {
        match self.slots.get_mut(&addr) {
            Some(s) if s.b.version == version => {
                s.synced = version;
                true
            }
            _ => false,
        }
    }

    /// Forgets every mark (the partner is a new or wiped store).
    pub fn reset_marks(&mut self) {
        for s in self.slots.values_mut() {
            s.synced = 0;
        }
    }

    /// Installs `content` (from the partner) as a local change: version bumped from this box's,
    /// term and everything else as the partner sent it. `synced` records that the partner holds
    /// exactly this content. Returns the store transition.
    pub fn install_replica(&mut self, content: &Binding, synced: bool) -> Option<Transition> {
        let slot = self.slots.get(&content.addr)?;
        let old = &slot.b;
        let mut new = content.clone();
        new.version = old.version + 1;
        let t = Transition { expect_version: old.version, expect_owner: old.owner.clone(), new };
        self.install(t.new.clone());
        if synced && let Some(s) = self.slots.get_mut(&content.addr) {
            s.synced = t.new.version;
        }
        Some(t)
    }

    /// Another busy address `client` holds in the subnet of `addr`, if any.
    pub fn other_busy_of(&self, addr: Ipv4Addr, client: &ClientKey) -> Option<Ipv4Addr> {
        let subnet = self.slots.get(&addr)?.subnet();
        self.current(subnet, client).map(|b| b.addr).filter(|a| *a != addr)
    }

    /// How many addresses' bindings the partner does not hold.
    pub fn unsynced_count(&self) -> usize {
        self.slots.values().filter(|s| s.synced != s.b.version).count()
    }

    /// Addresses whose binding the partner does not hold, in address order.
    pub fn unsynced_addrs(&self) -> Vec<Ipv4Addr> {
        let mut v: Vec<Ipv4Addr> =
            self.slots.iter().filter(|(_, s)| s.synced != s.b.version).map(|(a, _)| *a).collect();
        v.sort_unstable();
        v
    }

    /// Every address with a history, with its sync mark (the inverse of
    /// [`Self::load_with_marks`]): what a fresh database needs to hold all this box knows.
    pub fn bindings_with_marks(&self) -> Vec<(Binding, u64)> {
        let mut v: Vec<(Binding, u64)> =
            self.slots.values().filter(|s| s.b.version != 0).map(|s| (s.b.clone(), s.synced)).collect();
        v.sort_unstable_by_key(|(b, _)| b.addr);
        v
    }

    /// Addresses with any history (not as they were when the pool was created), in order.
    pub fn touched_addrs(&self) -> Vec<Ipv4Addr> {
        let mut v: Vec<Ipv4Addr> = self.slots.iter().filter(|(_, s)| s.b.version != 0).map(|(a, _)| *a).collect();
        v.sort_unstable();
        v
    }
}
