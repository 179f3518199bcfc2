//! The address allocator: seed 004's host reservation service, done right.
//!
//! Seed 004 keeps hosts in a queue ordered by next-fetch time, marks a taken host busy with a
//! timeout, groups hosts under aliases that may hold one reservation at a time, and frees
//! timed-out entries in a background reaper. Here a "host" is an address:
//!
//! * free addresses form a queue per subnet ordered by next-available time; a released or
//!   expired address re-enters at `now + affinity_hold`, so the address free longest goes first
//!   and a returning client finds its old address untouched;
//! * busy entries (probing, offered, leased, declined) carry an owner and a version, and every
//!   change is a compare-and-swap on both ([`Transition`]), so a late or foreign release can
//!   never clear someone else's binding (the seed's release had no owner check);
//! * an alias group is a reservation with several members; one member at a time holds its
//!   address, a second one is held off (or takes over, by policy);
//! * the reaper frees every busy entry whose expiry has *passed* (the seed's predicate was
//!   inverted), walking all of them in bounded batches.
//!
//! The allocator is pure: time comes in as an argument, and the transitions it returns are what
//! the lease store must make durable. It is the in-memory mirror of the store; if a commit
//! fails the driver rebuilds it from the store.

mod choose;
mod clients;
mod reaper;
mod replica;
mod slots;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;

pub use choose::Choice;
use clients::ClientIndex;
use slots::SlotTable;

use crate::config::{AliasBusyPolicy, ClassSet, Config, NetworkId, PoolId, SubnetId};
use crate::lease::{Binding, ClientKey, LeaseState, Transition, UnixSecs};

/// Timing rules from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub offer_hold_secs: u64,
    pub decline_probation_secs: u64,
    pub affinity_hold_secs: u64,
    /// How long a probe may take before the reaper gives the address back.
    pub probe_hold_secs: u64,
}

impl Policy {
    pub fn from_config(c: &Config) -> Policy {
        Policy {
            offer_hold_secs: c.dhcp.offer_hold_secs,
            decline_probation_secs: c.dhcp.decline_probation_secs,
            affinity_hold_secs: c.dhcp.affinity_hold_secs,
            probe_hold_secs: c.dhcp.ping_timeout_ms.div_ceil(1000) + 1,
        }
    }
}

/// A reservation as the allocator sees it.
#[derive(Debug, Clone)]
struct Reserved {
    name: String,
    ip: Ipv4Addr,
    subnet: SubnetId,
    policy: AliasBusyPolicy,
}

/// One address. Ids are stored as `u32` (configurations are far smaller) and the offer's time
/// is the binding's `cltt`: a slot is the bulk of the daemon's memory per address (see
/// `slots.rs`), so its fields are kept narrow.
#[derive(Debug, Clone)]
struct Slot {
    b: Binding,
    subnet: u32,
    /// The network (shared or a lone subnet) of `subnet`: a client holds one address per network.
    network: u32,
    /// The pool whose range holds the address (for its queue, its classes and its options).
    pool: Option<u32>,
    /// Index into `reservations` if this address is reserved (never in the dynamic queue).
    reserved: Option<u32>,
    /// The version of this binding the partner is known to hold (synced iff equal to
    /// `b.version`); mirrors the store's `peer_synced_version`.
    synced: u64,
    /// While offered: its order among the offers of its second (see `offer_key`).
    offer_order: u64,
}

impl Slot {
    fn new(b: Binding, subnet: SubnetId, network: NetworkId, pool: Option<PoolId>, reserved: Option<usize>) -> Slot {
        let narrow = |i: usize| u32::try_from(i).expect("configuration ids fit in 32 bits");
        Slot {
            b,
            subnet: narrow(subnet),
            network: narrow(network),
            pool: pool.map(narrow),
            reserved: reserved.map(narrow),
            synced: 0,
            offer_order: 0,
        }
    }

    fn subnet(&self) -> SubnetId {
        self.subnet as usize
    }

    fn network(&self) -> NetworkId {
        self.network as usize
    }

    fn pool(&self) -> Option<PoolId> {
        self.pool.map(|p| p as usize)
    }

    fn reserved(&self) -> Option<usize> {
        self.reserved.map(|r| r as usize)
    }

    /// While offered: its key in the offer index (time offered, then order within the second).
    fn offer_key(&self) -> (UnixSecs, u64) {
        (self.b.cltt, self.offer_order)
    }
}

/// Why a transition could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("{0} is not an address this server manages")]
    Unknown(Ipv4Addr),
    #[error("{addr} changed underneath (expected version {expected}, found {found})")]
    VersionMismatch { addr: Ipv4Addr, expected: u64, found: u64 },
    #[error("{addr} is owned by someone else")]
    OwnerMismatch { addr: Ipv4Addr },
}

#[derive(Debug, Clone)]
pub struct Allocator {
    policy: Policy,
    /// Every configured address (pools and reservations).
    slots: SlotTable,
    /// Number of addresses in each state, kept by `install`.
    /// Addresses per lease state (by [`LeaseState::code`]), per subnet.
    state_counts: Vec<[usize; 5]>,
    /// Per pool: free dynamic addresses by (next-available, address).
    free: Vec<BTreeSet<(UnixSecs, Ipv4Addr)>>,
    /// Per pool: who may use it.
    pools: Vec<PoolRule>,
    /// Per network: its pools in the order they are tried.
    network_pools: Vec<Vec<PoolId>>,
    /// Per subnet: its network.
    subnet_network: Vec<NetworkId>,
    /// Every busy address by (expiry, address), for the reaper.
    busy: BTreeSet<(UnixSecs, Ipv4Addr)>,
    /// Per pool: dynamic addresses on offer (never requested) by (time offered, order of the
    /// offer): when a pool is exhausted the one offered longest ago goes to a new client (see
    /// `choose.rs`). Times are whole seconds, and a flood makes hundreds of offers a second.
    offered: Vec<BTreeMap<(UnixSecs, u64), Ipv4Addr>>,
    /// Offers made so far: orders the offers of one second.
    offers_made: u64,
    /// The client's latest address in a network (current or previous binding); validated
    /// against the slot's owner on use, so a stale entry is harmless.
    by_client: ClientIndex,
    reservations: Vec<Reserved>,
    by_mac: HashMap<[u8; 6], usize>,
    by_client_id: HashMap<Box<[u8]>, usize>,
    /// Election term stamped on every change.
    term: u64,
    /// Where the queue consistency check resumes (see `reaper.rs`).
    repair_cursor: Vec<Option<(UnixSecs, Ipv4Addr)>>,
    /// When each client's accepted DECLINEs happened, within the probation period (not
    /// stored: a restart forgets them, which only lets a client decline its share again).
    declines: HashMap<ClientKey, Vec<UnixSecs>>,
}

/// Which clients may take addresses from a pool (see [`crate::config::Pool::admits`]).
#[derive(Debug, Clone, Copy)]
struct PoolRule {
    allow: ClassSet,
    deny: ClassSet,
}

impl PoolRule {
    fn admits(&self, classes: ClassSet) -> bool {
        ClassSet::admits(self.allow, self.deny, classes)
    }
}

/// DECLINEs one client may make within the probation period; later ones are ignored, so a
/// broken or hostile client cannot quarantine the whole pool one address at a time.
pub const DECLINES_PER_CLIENT: usize = 3;

/// What became of a DHCPDECLINE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decline {
    /// The address is quarantined for the probation period.
    Quarantined(Transition),
    /// The client does not hold the address: nothing to do.
    NotHolder,
    /// The client already declined [`DECLINES_PER_CLIENT`] addresses within the probation
    /// period: its binding is left as it is.
    OverLimit,
}

impl Allocator {
    /// An allocator for `config` with every address free; overlay the store with [`Self::load`].
    pub fn new(config: &Config) -> Allocator {
        let mut a = Allocator {
            policy: Policy::from_config(config),
            slots: SlotTable::default(),
            state_counts: vec![[0; 5]; config.subnets.len()],
            free: vec![BTreeSet::new(); config.pools.len()],
            pools: config.pools.iter().map(|p| PoolRule { allow: p.allow, deny: p.deny }).collect(),
            network_pools: config.networks.iter().map(|n| n.pools.clone()).collect(),
            subnet_network: config.subnets.iter().map(|s| s.network).collect(),
            busy: BTreeSet::new(),
            offered: vec![BTreeMap::new(); config.pools.len()],
            offers_made: 0,
            by_client: ClientIndex::default(),
            reservations: Vec::new(),
            by_mac: HashMap::new(),
            by_client_id: HashMap::new(),
            term: 0,
            repair_cursor: vec![None; config.pools.len()],
            declines: HashMap::new(),
        };
        let mut slots = Vec::new();
        let mut reserved = std::collections::HashSet::new();
        for (i, r) in config.reservations.iter().enumerate() {
            a.reservations.push(Reserved { name: r.name.clone(), ip: r.ip, subnet: r.subnet, policy: r.on_alias_busy });
            for mac in &r.hw {
                a.by_mac.insert(*mac, i);
            }
            for id in &r.client_ids {
                a.by_client_id.insert(id.clone().into(), i);
            }
            let pool = config.subnets[r.subnet].pools.iter().copied().find(|p| config.pools[*p].addrs.contains(r.ip));
            let network = config.subnets[r.subnet].network;
            reserved.insert(r.ip);
            slots.push(Slot::new(Binding::fresh(r.ip), r.subnet, network, pool, Some(i)));
            a.state_counts[r.subnet][0] += 1;
        }
        for pool in &config.pools {
            let network = config.subnets[pool.subnet].network;
            for addr in pool.addrs.iter() {
                if reserved.contains(&addr) {
                    continue; // reserved: never handed out dynamically
                }
                slots.push(Slot::new(Binding::fresh(addr), pool.subnet, network, Some(pool.id), None));
                a.free[pool.id].insert((0, addr));
                a.state_counts[pool.subnet][0] += 1;
            }
        }
        a.slots = SlotTable::new(slots);
        a
    }

    /// The pool whose range holds `addr`.
    pub fn pool_of(&self, addr: Ipv4Addr) -> Option<PoolId> {
        self.slots.get(&addr)?.pool()
    }

    /// Whether a client in `classes` may hold `addr`: reserved addresses go by the
    /// reservation; dynamic ones by their pool's classes.
    pub fn pool_admits(&self, addr: Ipv4Addr, classes: ClassSet) -> bool {
        match self.slots.get(&addr) {
            Some(s) if s.reserved.is_none() => s.pool().is_none_or(|p| self.pools[p].admits(classes)),
            _ => true,
        }
    }

    pub fn set_term(&mut self, term: u64) {
        self.term = term;
    }

    /// New hold and probation times (a configuration reload); bindings already made keep the
    /// times they were given.
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn binding(&self, addr: Ipv4Addr) -> Option<&Binding> {
        self.slots.get(&addr).map(|s| &s.b)
    }

    pub fn subnet_of(&self, addr: Ipv4Addr) -> Option<SubnetId> {
        self.slots.get(&addr).map(Slot::subnet)
    }

    /// Name of the reservation `addr` belongs to, if any.
    pub fn reservation_of(&self, addr: Ipv4Addr) -> Option<&str> {
        self.slots.get(&addr)?.reserved().map(|i| self.reservations[i].name.as_str())
    }

    /// The reservation this client belongs to (by client id, then hardware address).
    fn reservation_for(&self, hw: &[u8], client_id: Option<&[u8]>) -> Option<usize> {
        if let Some(i) = client_id.and_then(|id| self.by_client_id.get(id)) {
            return Some(*i);
        }
        let mac: [u8; 6] = hw.try_into().ok()?;
        self.by_mac.get(&mac).copied()
    }

    /// The address reserved for this client in the network of `subnet`, if it has one.
    pub fn reserved_ip_for(&self, subnet: SubnetId, hw: &[u8], client_id: Option<&[u8]>) -> Option<Ipv4Addr> {
        self.reservation_in(subnet, hw, client_id).map(|r| self.reservations[r].ip)
    }

    /// The index (in the configuration's list) of this client's reservation in the network of
    /// `subnet`, if it has one.
    pub fn reservation_in(&self, subnet: SubnetId, hw: &[u8], client_id: Option<&[u8]>) -> Option<usize> {
        let r = self.reservation_for(hw, client_id)?;
        (self.subnet_network[self.reservations[r].subnet] == self.subnet_network[subnet]).then_some(r)
    }

    /// Is `addr` reserved for a group this client is not in?
    fn reserved_for_other(&self, addr: Ipv4Addr, hw: &[u8], client_id: Option<&[u8]>) -> bool {
        match self.slots.get(&addr).and_then(Slot::reserved) {
            Some(r) => self.reservation_for(hw, client_id) != Some(r),
            None => false,
        }
    }

    /// The client's busy binding in the network of `subnet`, if it has one.
    pub fn current(&self, subnet: SubnetId, client: &ClientKey) -> Option<&Binding> {
        let addr = self.by_client.get(&self.slots, self.subnet_network[subnet], client)?;
        let b = &self.slots.get(&addr)?.b;
        (b.state.is_busy() && b.is_owned_by(client)).then_some(b)
    }

    /// Number of addresses in `state` (expired but not yet reaped ones still count as busy).
    pub fn count(&self, state: LeaseState) -> usize {
        self.state_counts.iter().map(|c| c[state.code() as usize]).sum()
    }

    /// Per subnet (in configuration order): addresses in each lease state, indexed by
    /// [`LeaseState::code`], reserved addresses included.
    pub fn usage(&self) -> &[[usize; 5]] {
        &self.state_counts
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn bindings(&self) -> impl Iterator<Item = &Binding> {
        self.slots.values().map(|s| &s.b)
    }

    // ---- compare-and-swap core -------------------------------------------------------------

    /// Applies a transition if the slot still has the expected (owner, version).
    pub fn apply(&mut self, t: &Transition) -> Result<(), AllocError> {
        let addr = t.new.addr;
        let slot = self.slots.get(&addr).ok_or(AllocError::Unknown(addr))?;
        if slot.b.version != t.expect_version {
            return Err(AllocError::VersionMismatch { addr, expected: t.expect_version, found: slot.b.version });
        }
        if slot.b.owner != t.expect_owner {
            return Err(AllocError::OwnerMismatch { addr });
        }
        self.install(t.new.clone());
        Ok(())
    }

    /// Replaces a slot's binding and keeps every index in step with it.
    pub(crate) fn install(&mut self, new: Binding) {
        let addr = new.addr;
        let Some(slot) = self.slots.get_mut(&addr) else { return };
        let old = std::mem::replace(&mut slot.b, new);
        let (network, subnet) = (slot.network(), slot.subnet());
        let queue = if slot.reserved.is_none() { slot.pool() } else { None };
        let new = &slot.b;
        self.state_counts[subnet][old.state.code() as usize] -= 1;
        self.state_counts[subnet][new.state.code() as usize] += 1;
        if old.state.is_busy() {
            self.busy.remove(&(old.expires, addr));
        } else if let Some(q) = queue {
            self.free[q].remove(&(old.expires, addr));
        }
        if new.state.is_busy() {
            self.busy.insert((new.expires, addr));
        } else if let Some(q) = queue {
            self.free[q].insert((new.expires, addr));
        }
        if let Some(q) = queue {
            if old.state == LeaseState::Offered {
                self.offered[q].remove(&(old.cltt, slot.offer_order));
            }
            if new.state == LeaseState::Offered {
                self.offers_made += 1;
                slot.offer_order = self.offers_made;
                self.offered[q].insert(slot.offer_key(), addr);
            }
        }
        if let Some(o) = &old.owner
            && new.owner.as_ref() != Some(o)
        {
            self.by_client.remove_if(network, o, addr);
        }
        if let Some(n) = &self.slots[&addr].b.owner {
            let busy = self.slots[&addr].b.state.is_busy();
            // A free binding remembers its last client (affinity) but must not hide a busy
            // binding the client holds elsewhere (lease sync frees a client's losing address).
            let holds_other = !busy
                && self.by_client.get(&self.slots, network, n).is_some_and(|a| {
                    a != addr && self.slots.get(&a).is_some_and(|s| s.b.state.is_busy() && s.b.is_owned_by(n))
                });
            if !holds_other {
                self.by_client.set(&self.slots, network, n, addr);
            }
        }
    }

    /// Builds and applies the change of `addr` to `state`/`owner`/`expires`.
    fn change(&mut self, addr: Ipv4Addr, edit: impl FnOnce(&mut Binding)) -> Transition {
        let old = &self.slots[&addr].b;
        let mut new = old.clone();
        edit(&mut new);
        new.version = old.version + 1;
        new.seq = old.seq + 1;
        new.term = self.term;
        let t = Transition { expect_version: old.version, expect_owner: old.owner.clone(), new };
        self.install(t.new.clone());
        t
    }

    /// Frees the client's other busy address in the network so it never holds two. Every busy
    /// binding is indexed in `by_client` when made, so the index finds it without a scan.
    fn release_others(&mut self, addr: Ipv4Addr, client: &ClientKey, now: UnixSecs, out: &mut Vec<Transition>) {
        let subnet = self.slots[&addr].subnet();
        let Some(other) = self.current(subnet, client).map(|b| b.addr).filter(|a| *a != addr) else { return };
        let hold = self.policy.affinity_hold_secs;
        out.push(self.change(other, |b| {
            b.state = LeaseState::Free;
            b.expires = now + hold;
        }));
    }

    // ---- operations the DHCP decisions use -------------------------------------------------

    /// Holds `addr` for `client` in a short-lived busy `state` (probing or offered) for `secs`,
    /// freeing whatever else the client holds in the subnet.
    fn hold_for(
        &mut self,
        addr: Ipv4Addr,
        client: &ClientKey,
        hw: &[u8],
        now: UnixSecs,
        state: LeaseState,
        secs: u64,
    ) -> Vec<Transition> {
        let mut out = Vec::new();
        self.release_others(addr, client, now, &mut out);
        out.push(self.change(addr, |b| {
            b.state = state;
            b.owner = Some(client.clone());
            b.expires = now + secs;
            b.cltt = now;
            b.hw = hw.to_vec();
        }));
        out
    }

    /// Marks `addr` as being probed (ICMP echo in flight) for `client`.
    pub fn probe(&mut self, addr: Ipv4Addr, client: &ClientKey, hw: &[u8], now: UnixSecs) -> Vec<Transition> {
        self.hold_for(addr, client, hw, now, LeaseState::Probing, self.policy.probe_hold_secs)
    }

    /// Holds `addr` for `client` for the offer time. An address already leased to the client
    /// stays leased (offering it again must not shorten the lease).
    pub fn offer(&mut self, addr: Ipv4Addr, client: &ClientKey, hw: &[u8], now: UnixSecs) -> Vec<Transition> {
        let b = &self.slots[&addr].b;
        if b.state == LeaseState::Leased && b.is_owned_by(client) && b.expires > now {
            return Vec::new();
        }
        self.hold_for(addr, client, hw, now, LeaseState::Offered, self.policy.offer_hold_secs)
    }

    /// Whether `client` may be given `addr` now (REQUEST): it holds it, or it is free and not
    /// reserved for someone else. `Err` names who holds it.
    pub fn may_lease(
        &self,
        addr: Ipv4Addr,
        client: &ClientKey,
        hw: &[u8],
        client_id: Option<&[u8]>,
        now: UnixSecs,
    ) -> Result<(), LeaseRefusal> {
        let Some(slot) = self.slots.get(&addr) else { return Err(LeaseRefusal::NotOurs) };
        if self.reserved_for_other(addr, hw, client_id) {
            return Err(LeaseRefusal::ReservedForOther);
        }
        let b = &slot.b;
        if b.is_owned_by(client) && b.state != LeaseState::Declined {
            return Ok(());
        }
        if b.is_live(now) {
            return Err(if b.state == LeaseState::Declined {
                LeaseRefusal::Quarantined
            } else {
                LeaseRefusal::HeldByOther
            });
        }
        // Free (or expired and not yet reaped): the client may have it. Affinity only steers
        // what we offer, not what a client that already uses an address may keep.
        Ok(())
    }

    /// Leases `addr` to `client` until `now + lease_secs`. Call [`Self::may_lease`] first.
    pub fn lease(
        &mut self,
        addr: Ipv4Addr,
        client: &ClientKey,
        hw: &[u8],
        hostname: Option<&str>,
        lease_secs: u32,
        now: UnixSecs,
    ) -> Vec<Transition> {
        let mut out = Vec::new();
        self.release_others(addr, client, now, &mut out);
        out.push(self.change(addr, |b| {
            b.state = LeaseState::Leased;
            b.owner = Some(client.clone());
            b.expires = now + u64::from(lease_secs);
            b.cltt = now;
            b.hw = hw.to_vec();
            if let Some(h) = hostname {
                b.hostname = Some(h.to_string());
            }
        }));
        out
    }

    /// DHCPRELEASE: frees `addr` only if `client` holds it.
    pub fn release(&mut self, addr: Ipv4Addr, client: &ClientKey, now: UnixSecs) -> Option<Transition> {
        let b = &self.slots.get(&addr)?.b;
        if !(b.is_owned_by(client) && matches!(b.state, LeaseState::Leased | LeaseState::Offered)) {
            return None;
        }
        let hold = self.policy.affinity_hold_secs;
        Some(self.change(addr, |b| {
            b.state = LeaseState::Free;
            b.expires = now + hold;
            b.cltt = now;
        }))
    }

    /// A client that chose another server's offer: give back what we offered it.
    pub fn withdraw_offer(&mut self, subnet: SubnetId, client: &ClientKey, now: UnixSecs) -> Option<Transition> {
        let b = self.current(subnet, client)?;
        if b.state != LeaseState::Offered {
            return None;
        }
        let addr = b.addr;
        Some(self.change(addr, |b| {
            b.state = LeaseState::Free;
            b.expires = now;
        }))
    }

    /// DHCPDECLINE from the holder, or a probe that got an answer: quarantine the address.
    pub fn quarantine(&mut self, addr: Ipv4Addr, client: &ClientKey, now: UnixSecs) -> Option<Transition> {
        let b = &self.slots.get(&addr)?.b;
        if !(b.is_owned_by(client) && matches!(b.state, LeaseState::Leased | LeaseState::Offered | LeaseState::Probing))
        {
            return None;
        }
        let probation = self.policy.decline_probation_secs;
        Some(self.change(addr, |b| {
            b.state = LeaseState::Declined;
            b.owner = None;
            b.expires = now + probation;
            b.cltt = now;
            b.hostname = None;
        }))
    }

    /// DHCPDECLINE: quarantine the address, unless this client has already declined its share
    /// within the probation period.
    pub fn decline(&mut self, addr: Ipv4Addr, client: &ClientKey, now: UnixSecs) -> Decline {
        let probation = self.policy.decline_probation_secs;
        let live = |at: &UnixSecs| at.saturating_add(probation) > now;
        let recent = self.declines.get_mut(client).map_or(0, |v| {
            v.retain(live);
            v.len()
        });
        if recent >= DECLINES_PER_CLIENT {
            return Decline::OverLimit;
        }
        let Some(t) = self.quarantine(addr, client, now) else { return Decline::NotHolder };
        // Only a decline that quarantined something is remembered, so entries are bounded by
        // the pool; the expired ones go whenever the map has grown.
        if self.declines.len() >= 1024 {
            self.declines.retain(|_, v| {
                v.retain(live);
                !v.is_empty()
            });
        }
        self.declines.entry(client.clone()).or_default().push(now);
        Decline::Quarantined(t)
    }
}

/// Why a REQUEST cannot be granted (the DHCP layer answers with DHCPNAK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseRefusal {
    NotOurs,
    ReservedForOther,
    HeldByOther,
    Quarantined,
}

impl LeaseRefusal {
    pub fn reason(self) -> &'static str {
        match self {
            LeaseRefusal::NotOurs => "address not in any pool",
            LeaseRefusal::ReservedForOther => "address reserved for another host",
            LeaseRefusal::HeldByOther => "address leased to another client",
            LeaseRefusal::Quarantined => "address declined and in probation",
        }
    }
}
