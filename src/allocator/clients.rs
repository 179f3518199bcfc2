//! The index from a client (in one network) to its latest address.
//!
//! A map keyed by (network, client key) held a second copy of every owner's key (a heap
//! allocation each) beside the one in the slot, and every lookup cloned the key it was asked
//! about. Here the table holds addresses only: an entry's key is the owner and network of the
//! slot it names, hashed and compared from the slot itself. That holds because an entry always
//! names a slot owned by its client: `Allocator::install` (the only place a binding changes)
//! removes the entry of an owner that loses an address before it adds the new owner's.

use std::hash::{BuildHasher, RandomState};
use std::net::Ipv4Addr;

use hashbrown::HashTable;

use super::slots::SlotTable;
use crate::config::NetworkId;
use crate::lease::ClientKey;

#[derive(Debug, Clone, Default)]
pub(super) struct ClientIndex {
    table: HashTable<Ipv4Addr>,
    /// Randomly keyed: client keys come off the wire, so they must not choose their buckets.
    hasher: RandomState,
}

impl ClientIndex {
    fn hash(&self, network: NetworkId, client: &ClientKey) -> u64 {
        self.hasher.hash_one((network, client.as_bytes()))
    }

    /// The entry's key, read from its slot (every entry names an owned slot: see above).
    fn key_of(slots: &SlotTable, addr: Ipv4Addr) -> Option<(NetworkId, &ClientKey)> {
        let s = slots.get(&addr)?;
        Some((s.network(), s.b.owner.as_ref()?))
    }

    /// The address indexed for `client` in `network`.
    pub(super) fn get(&self, slots: &SlotTable, network: NetworkId, client: &ClientKey) -> Option<Ipv4Addr> {
        let h = self.hash(network, client);
        self.table.find(h, |a| Self::key_of(slots, *a) == Some((network, client))).copied()
    }

    /// Removes the entry of `client` in `network` if it names `addr` (whose slot may already
    /// hold another owner: the entry is found by its address, not by the slot).
    pub(super) fn remove_if(&mut self, network: NetworkId, client: &ClientKey, addr: Ipv4Addr) {
        let h = self.hash(network, client);
        if let Ok(e) = self.table.find_entry(h, |a| *a == addr) {
            e.remove();
        }
    }

    /// Points `client` in `network` at `addr`, whose slot must already be owned by `client`
    /// in `network`; replaces the client's previous entry.
    pub(super) fn set(&mut self, slots: &SlotTable, network: NetworkId, client: &ClientKey, addr: Ipv4Addr) {
        let h = self.hash(network, client);
        let hasher = &self.hasher;
        let rehash = |a: &Ipv4Addr| Self::key_of(slots, *a).map_or(0, |(n, c)| hasher.hash_one((n, c.as_bytes())));
        match self.table.entry(h, |a| Self::key_of(slots, *a) == Some((network, client)), rehash) {
            hashbrown::hash_table::Entry::Occupied(mut e) => *e.get_mut() = addr,
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert(addr);
            }
        }
    }
}

impl ClientIndex {
    /// Every entry names a slot owned by a client, and is the entry found for that client.
    pub(super) fn check(&self, slots: &SlotTable) -> Result<(), String> {
        for a in &self.table {
            let Some((network, client)) = Self::key_of(slots, *a) else {
                return Err(format!("client index names {a}, which has no owner"));
            };
            if self.get(slots, network, client) != Some(*a) {
                return Err(format!("client index entry {a} is not the one found for {client}"));
            }
        }
        Ok(())
    }
}
