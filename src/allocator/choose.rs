//! Which address to offer a client (RFC 2131 §4.3.1, with reservations and alias groups first).

use std::net::Ipv4Addr;

use super::Allocator;
use crate::config::{AliasBusyPolicy, ClassSet, NetworkId, SubnetId};
use crate::lease::{ClientKey, LeaseState, UnixSecs};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Offer `addr`. `fresh` is true when the client has never held it (worth a ping first);
    /// `take_over` when another alias member's binding is being abandoned.
    Offer { addr: Ipv4Addr, fresh: bool, take_over: bool },
    /// Another member of the client's alias group holds the group's address.
    HeldOff { group: String, holder: ClientKey },
    /// The client's reserved address is quarantined (declined or answered a ping).
    ReservedUnavailable { addr: Ipv4Addr },
    /// No free address, but `addr` has been on offer to `from` longest of all and was never
    /// requested: an OFFER is not a promise, so it goes to this client instead (a flood of
    /// DISCOVERs cannot lock out a real client by holding every address in an offer).
    Reclaim { addr: Ipv4Addr, from: ClientKey },
    /// No free address in a pool the client may use, and none on offer to reclaim.
    Exhausted,
}

impl Allocator {
    /// [`Self::choose_for`] a client in no class.
    pub fn choose(
        &self,
        subnet: SubnetId,
        client: &ClientKey,
        hw: &[u8],
        client_id: Option<&[u8]>,
        requested: Option<Ipv4Addr>,
        now: UnixSecs,
    ) -> Choice {
        self.choose_for(subnet, ClassSet::EMPTY, client, hw, client_id, requested, now)
    }

    /// Chooses the address to offer in the network of `subnet` to a client in `classes`, in
    /// this order: the client's reservation; its current binding; its previous binding; the
    /// address it asked for, if free and not held back for another client; then the pools it
    /// may use (those that allow one of its classes first, then those open to all, each group
    /// in order): the first one whose queue head is available now, else (every such address
    /// is held for a returning client) the head free longest among them; else (none is free)
    /// the address offered longest ago in those pools and never requested.
    #[allow(clippy::too_many_arguments)]
    pub fn choose_for(
        &self,
        subnet: SubnetId,
        classes: ClassSet,
        client: &ClientKey,
        hw: &[u8],
        client_id: Option<&[u8]>,
        requested: Option<Ipv4Addr>,
        now: UnixSecs,
    ) -> Choice {
        if let Some(r) = self.reservation_in(subnet, hw, client_id) {
            return self.choose_reserved(r, client, now);
        }
        let network = self.subnet_network[subnet];
        let dynamic_here = |a: &Ipv4Addr| {
            self.slots.get(a).is_some_and(|s| {
                s.network() == network
                    && s.reserved.is_none()
                    && s.pool().is_some_and(|p| self.pools[p].admits(classes))
            })
        };

        if let Some(addr) = self.by_client.get(&self.slots, network, client).filter(dynamic_here) {
            let b = &self.slots[&addr].b;
            if b.is_owned_by(client) && b.state != LeaseState::Declined {
                // Current binding (busy) or previous binding (free, still marked as its own).
                return Choice::Offer { addr, fresh: false, take_over: false };
            }
        }
        if let Some(addr) = requested.filter(dynamic_here) {
            let b = &self.slots[&addr].b;
            let held_for_other = b.owner.as_ref().is_some_and(|o| o != client) && b.expires > now;
            if b.state == LeaseState::Free && !held_for_other {
                return Choice::Offer { addr, fresh: !b.is_owned_by(client), take_over: false };
            }
        }
        // Each queue's head, skipping (a bounded number of) entries that are not really free:
        // an address should never be both queued and busy, and the reaper repairs it if it is.
        // Pools reserved for one of the client's classes come first (that is how a class
        // selects its pools), then the pools open to every client; each group in order.
        let mut oldest: Option<(UnixSecs, Ipv4Addr)> = None;
        let selected = |p: &&usize| !self.pools[**p].allow.is_empty();
        let order = self.network_pools[network]
            .iter()
            .filter(selected)
            .chain(self.network_pools[network].iter().filter(|p| !selected(p)));
        for &p in order {
            if !self.pools[p].admits(classes) {
                continue;
            }
            let head = self.free[p].iter().take(64).copied().find(|(_, a)| self.slots[a].b.state == LeaseState::Free);
            match head {
                Some((at, addr)) if at <= now => return Choice::Offer { addr, fresh: true, take_over: false },
                Some(h) if oldest.is_none_or(|o| h < o) => oldest = Some(h),
                _ => {}
            }
        }
        match oldest {
            Some((_, addr)) => Choice::Offer { addr, fresh: true, take_over: false },
            None => self.oldest_offer(network, classes),
        }
    }

    /// The dynamic address offered longest ago (and never requested) in the pools of `network`
    /// a client in `classes` may use: [`Choice::Reclaim`], or [`Choice::Exhausted`] if none is
    /// on offer. Reserved addresses are never on this list, nor is anything leased.
    fn oldest_offer(&self, network: NetworkId, classes: ClassSet) -> Choice {
        let oldest = self.network_pools[network]
            .iter()
            .filter(|p| self.pools[**p].admits(classes))
            .filter_map(|p| self.offered[*p].first_key_value())
            .min();
        let reclaim = oldest.and_then(|(_, addr)| {
            let b = &self.slots[addr].b;
            let from = b.owner.clone().filter(|_| b.state == LeaseState::Offered)?;
            Some(Choice::Reclaim { addr: *addr, from })
        });
        reclaim.unwrap_or(Choice::Exhausted)
    }

    fn choose_reserved(&self, r: usize, client: &ClientKey, now: UnixSecs) -> Choice {
        let res = &self.reservations[r];
        let b = &self.slots[&res.ip].b;
        if !b.is_live(now) || b.is_owned_by(client) && b.state != LeaseState::Declined {
            return Choice::Offer { addr: res.ip, fresh: !b.is_owned_by(client), take_over: false };
        }
        match (&b.owner, b.state) {
            (_, LeaseState::Declined) | (None, _) => Choice::ReservedUnavailable { addr: res.ip },
            (Some(holder), _) => match res.policy {
                AliasBusyPolicy::HoldOff => Choice::HeldOff { group: res.name.clone(), holder: holder.clone() },
                AliasBusyPolicy::TakeOver => Choice::Offer { addr: res.ip, fresh: false, take_over: true },
            },
        }
    }
}
