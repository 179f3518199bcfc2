//! The background half of seed 004: free every busy entry whose time is up, and keep the queue
//! and busy indexes consistent with the entries themselves.

use std::net::Ipv4Addr;

use super::Allocator;
use crate::lease::{LeaseState, Transition, UnixSecs};

impl Allocator {
    /// Frees up to `max` busy entries whose expiry is at or before `now` (and nothing else).
    /// A full batch means there may be more: call again. Leases re-enter the queue after the
    /// affinity hold; lapsed offers and probes at once (the client never used them); declined
    /// addresses at once, with no owner.
    pub fn reap(&mut self, now: UnixSecs, max: usize) -> Vec<Transition> {
        let due: Vec<(UnixSecs, Ipv4Addr)> =
            self.busy.range(..=(now, Ipv4Addr::BROADCAST)).take(max).copied().collect();
        let hold = self.policy.affinity_hold_secs;
        let mut out = Vec::with_capacity(due.len());
        for (expires, addr) in due {
            let Some(slot) = self.slots.get(&addr) else {
                self.busy.remove(&(expires, addr));
                continue;
            };
            if !slot.b.state.is_busy() || slot.b.expires != expires {
                // Stale index entry: the slot changed without the index following. Drop it.
                self.busy.remove(&(expires, addr));
                continue;
            }
            let state = slot.b.state;
            out.push(self.change(addr, |b| {
                b.expires = match state {
                    LeaseState::Leased => expires + hold,
                    _ => now,
                };
                if state == LeaseState::Declined {
                    b.owner = None;
                }
                b.state = LeaseState::Free;
            }));
        }
        out
    }

    /// Walks up to `max` queue entries per pool (resuming where the last call stopped) and
    /// removes any whose address is not free with that key: an address found both queued and
    /// busy is repaired in favour of the busy entry, which is what the store holds. Returns the
    /// number of entries repaired.
    pub fn repair_queue(&mut self, max: usize) -> usize {
        let mut repaired = 0;
        for pool in 0..self.free.len() {
            let start = self.repair_cursor[pool];
            let batch: Vec<(UnixSecs, Ipv4Addr)> = match start {
                Some(c) => self.free[pool]
                    .range((std::ops::Bound::Excluded(c), std::ops::Bound::Unbounded))
                    .take(max)
                    .copied()
                    .collect(),
                None => self.free[pool].iter().take(max).copied().collect(),
            };
            self.repair_cursor[pool] = if batch.len() < max { None } else { batch.last().copied() };
            for (key, addr) in batch {
                let ok = self.slots.get(&addr).is_some_and(|s| {
                    s.reserved.is_none()
                        && s.pool() == Some(pool)
                        && s.b.state == LeaseState::Free
                        && s.b.expires == key
                });
                if !ok {
                    self.free[pool].remove(&(key, addr));
                    repaired += 1;
                    if let Some(s) = self.slots.get(&addr)
                        && s.reserved.is_none()
                        && s.pool() == Some(pool)
                        && s.b.state == LeaseState::Free
                    {
                        let k = s.b.expires;
                        self.free[pool].insert((k, addr)); // re-key a free entry queued under a stale time
                    }
                }
            }
        }
        repaired
    }

    /// Test hook: put a busy address into the free queue, as a crashed multi-step update in the
    /// seed's design could leave it.
    #[cfg(test)]
    pub(crate) fn corrupt_enqueue(&mut self, addr: Ipv4Addr) {
        let s = &self.slots[&addr];
        self.free[s.pool().expect("a pool address")].insert((0, addr));
    }

    /// Checks every index against the slots; used by tests and debug assertions.
    pub fn check_invariants(&self, now: UnixSecs) -> Result<(), String> {
        use std::collections::HashMap;
        let mut live_per_client: HashMap<(usize, &crate::lease::ClientKey), Ipv4Addr> = HashMap::new();
        for (addr, s) in self.slots.iter() {
            let queued = s.pool().is_some_and(|p| self.free[p].contains(&(s.b.expires, *addr)));
            let indexed_busy = self.busy.contains(&(s.b.expires, *addr));
            if s.b.state.is_busy() {
                if !indexed_busy {
                    return Err(format!("{addr} busy but not in the busy index"));
                }
                if queued {
                    return Err(format!("{addr} both queued and busy"));
                }
                if let (Some(o), true) = (&s.b.owner, s.b.is_live(now))
                    && let Some(prev) = live_per_client.insert((s.network(), o), *addr)
                {
                    return Err(format!("client {o} holds both {prev} and {addr}"));
                }
            } else if s.reserved.is_none() && !queued {
                return Err(format!("{addr} free but not queued"));
            }
        }
        let queued_total: usize = self.free.iter().map(|q| q.len()).sum();
        let free_dynamic = self.slots.values().filter(|s| s.reserved.is_none() && !s.b.state.is_busy()).count();
        if queued_total != free_dynamic {
            return Err(format!("{queued_total} queued entries for {free_dynamic} free addresses"));
        }
        let offered_dynamic = |s: &&super::Slot| s.reserved.is_none() && s.b.state == LeaseState::Offered;
        let on_offer: Vec<&super::Slot> = self.slots.values().filter(offered_dynamic).collect();
        let offered_indexed =
            on_offer.iter().all(|s| s.pool().is_some_and(|p| self.offered[p].get(&s.offer_key()) == Some(&s.b.addr)));
        if !offered_indexed || on_offer.len() != self.offered.iter().map(|q| q.len()).sum::<usize>() {
            return Err("the offer index differs from the offered slots".into());
        }
        self.by_client.check(&self.slots)?;
        if self.busy.len() != self.slots.values().filter(|s| s.b.state.is_busy()).count() {
            return Err("busy index size differs from busy slots".into());
        }
        for st in [LeaseState::Free, LeaseState::Probing, LeaseState::Offered, LeaseState::Leased, LeaseState::Declined]
        {
            let n = self.slots.values().filter(|s| s.b.state == st).count();
            if self.count(st) != n {
                return Err(format!("{} {st:?} counted, {n} present", self.count(st)));
            }
        }
        Ok(())
    }
}
