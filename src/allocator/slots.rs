//! The allocator's table of addresses: every slot in one vector in address order, found by
//! address through the runs of consecutive addresses it holds (one per pool, give or take
//! reservations outside them).
//!
//! A hash map from address to slot sized the table at the next power of two above 8/7 of the
//! pool, ~190 bytes per bucket: 24 MiB for a /16 whatever the number of leases, the larger part
//! of the daemon's memory. Here a slot costs its own size and the index a few bytes per run; a
//! lookup is a binary search over the runs (a handful) and a subtraction.

use std::net::Ipv4Addr;

use super::Slot;

#[derive(Debug, Clone, Default)]
pub(super) struct SlotTable {
    slots: Vec<Slot>,
    /// (first address, index of its slot), one per run of consecutive addresses, by address.
    runs: Vec<(u32, u32)>,
}

impl SlotTable {
    /// The table of `slots` (any order; each address once).
    pub(super) fn new(mut slots: Vec<Slot>) -> SlotTable {
        slots.sort_unstable_by_key(|s| s.b.addr);
        slots.shrink_to_fit();
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for (i, s) in slots.iter().enumerate() {
            let a = u32::from(s.b.addr);
            let continues = runs.last().is_some_and(|&(start, base)| a.wrapping_sub(start) == i as u32 - base);
            if !continues {
                runs.push((a, i as u32));
            }
        }
        runs.shrink_to_fit();
        SlotTable { slots, runs }
    }

    fn index(&self, addr: Ipv4Addr) -> Option<usize> {
        let a = u32::from(addr);
        let run = self.runs.partition_point(|&(start, _)| start <= a).checked_sub(1)?;
        let (start, base) = self.runs[run];
        let end = self.runs.get(run + 1).map_or(self.slots.len() as u32, |&(_, next)| next);
        let i = base + (a - start);
        (i < end).then_some(i as usize)
    }

    pub(super) fn get(&self, addr: &Ipv4Addr) -> Option<&Slot> {
        self.index(*addr).map(|i| &self.slots[i])
    }

    pub(super) fn get_mut(&mut self, addr: &Ipv4Addr) -> Option<&mut Slot> {
        self.index(*addr).map(|i| &mut self.slots[i])
    }

    #[cfg(test)]
    pub(super) fn contains_key(&self, addr: &Ipv4Addr) -> bool {
        self.index(*addr).is_some()
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Every slot, in address order.
    pub(super) fn values(&self) -> std::slice::Iter<'_, Slot> {
        self.slots.iter()
    }

    pub(super) fn values_mut(&mut self) -> std::slice::IterMut<'_, Slot> {
        self.slots.iter_mut()
    }

    /// (address, slot) for every slot, in address order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&Ipv4Addr, &Slot)> {
        self.slots.iter().map(|s| (&s.b.addr, s))
    }
}

impl std::ops::Index<&Ipv4Addr> for SlotTable {
    type Output = Slot;

    fn index(&self, addr: &Ipv4Addr) -> &Slot {
        self.get(addr).expect("an address of the slot table")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Binding;

    fn slot(a: &str) -> Slot {
        Slot::new(Binding::fresh(a.parse().unwrap()), 0, 0, None, None)
    }

    #[test]
    fn finds_every_address_and_nothing_else() {
        let addrs =
            ["198.18.0.10", "198.18.0.3", "198.18.0.4", "198.18.0.5", "198.18.1.0", "198.18.0.255", "198.18.0.9"];
        let t = SlotTable::new(addrs.iter().map(|a| slot(a)).collect());
        assert_eq!(t.len(), addrs.len());
        for a in addrs {
            let a: Ipv4Addr = a.parse().unwrap();
            assert_eq!(t.get(&a).map(|s| s.b.addr), Some(a));
        }
        for a in ["198.18.0.2", "198.18.0.6", "198.18.0.8", "198.18.0.11", "198.18.1.1", "0.0.0.0", "255.255.255.255"] {
            assert!(!t.contains_key(&a.parse().unwrap()), "{a}");
        }
        let order: Vec<Ipv4Addr> = t.iter().map(|(a, _)| *a).collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted);
    }
}
