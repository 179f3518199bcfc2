//! The DHCP server's decisions (RFC 2131 §4.3), free of I/O: a request, where it came from and
//! the time go in; a reply (or silence) and the allocator transitions to make durable come out.

use std::net::Ipv4Addr;

use dhcproto::v4::MessageType;
use ipnet::Ipv4Net;

use super::inbound::Request;
use super::reply::{self, Destination, LeaseTimes};
use crate::allocator::{Allocator, Choice};
use crate::config::{Config, SubnetId};
use crate::lease::{ClientKey, LeaseState, Transition, UnixSecs};

/// Where a request arrived, as far as the decision needs to know.
#[derive(Debug, Clone)]
pub struct Ingress {
    /// Addresses of the interface it arrived on.
    pub iface_addrs: Vec<Ipv4Net>,
    /// The packet's destination address (from IP_PKTINFO): ours, or a broadcast.
    pub local_dst: Ipv4Addr,
    /// True if the interface is one we serve directly; false for the relay-only socket.
    pub served: bool,
}

/// A reply ready to send.
#[derive(Debug, Clone)]
pub struct Reply {
    pub kind: MessageType,
    pub bytes: Vec<u8>,
    pub dest: Destination,
    pub yiaddr: Ipv4Addr,
}

/// An offer waiting for an ICMP probe of `addr`.
#[derive(Debug, Clone)]
pub struct PendingOffer {
    pub req: Box<Request>,
    pub ingress: Ingress,
    pub addr: Ipv4Addr,
    pub attempts: u8,
}

/// Why nothing is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Silence {
    NoSubnet,
    NotForUs,
    OtherServerChosen,
    PoolExhausted,
    AliasHeldOff { group: String, holder: ClientKey },
    ReservedUnavailable(Ipv4Addr),
    ProbeInFlight,
    ProbesExhausted,
    Malformed(&'static str),
    /// RELEASE and DECLINE are never answered.
    NoReplyExpected,
}

#[derive(Debug)]
pub enum Action {
    /// Send after `transitions` are durable (immediately if `durable` is false).
    Reply { reply: Reply, durable: bool },
    /// Ping the address, then call [`after_probe`].
    Probe(PendingOffer),
    Silent(Silence),
}

#[derive(Debug)]
pub struct Outcome {
    pub transitions: Vec<Transition>,
    pub action: Action,
}

impl Outcome {
    fn silent(transitions: Vec<Transition>, why: Silence) -> Outcome {
        Outcome { transitions, action: Action::Silent(why) }
    }
}

/// A probe that found the address in use is retried with another address this many times.
const MAX_PROBES: u8 = 3;

/// The subnet a request belongs to and the server identifier to use for it.
fn locate(cfg: &Config, req: &Request, ing: &Ingress) -> Option<(SubnetId, Ipv4Addr)> {
    let m = &req.msg;
    let unicast_dst = !ing.local_dst.is_unspecified() && !ing.local_dst.is_broadcast() && !ing.local_dst.is_multicast();
    let iface_addr_in = |s: SubnetId| ing.iface_addrs.iter().map(Ipv4Net::addr).find(|a| cfg.subnets[s].contains(*a));
    let fallback_id = || if unicast_dst { Some(ing.local_dst) } else { ing.iface_addrs.first().map(Ipv4Net::addr) };
    let subnet = if !m.giaddr().is_unspecified() {
        cfg.subnet_of(m.giaddr())?
    } else if !m.ciaddr().is_unspecified() && (ing.served || unicast_dst) {
        cfg.subnet_of(m.ciaddr())?
    } else if ing.served {
        ing.iface_addrs.iter().find_map(|n| cfg.subnet_of(n.addr()))?
    } else {
        return None; // a direct broadcast on an interface we do not serve
    };
    let server_id = if !m.giaddr().is_unspecified() && unicast_dst { Some(ing.local_dst) } else { iface_addr_in(subnet).or_else(fallback_id) };
    Some((subnet, server_id?))
}

fn is_ours(sid: Ipv4Addr, server_id: Ipv4Addr, ing: &Ingress) -> bool {
    sid == server_id || ing.iface_addrs.iter().any(|n| n.addr() == sid)
}

fn times(cfg: &Config, subnet: SubnetId) -> LeaseTimes {
    let s = &cfg.subnets[subnet];
    LeaseTimes { lease: s.lease_secs, renew: s.renew_secs, rebind: s.rebind_secs }
}

fn reply_to(cfg: &Config, req: &Request, kind: MessageType, yiaddr: Ipv4Addr, server_id: Ipv4Addr, subnet: SubnetId, with_times: bool) -> Reply {
    let t = with_times.then(|| times(cfg, subnet));
    let bytes = reply::build(req, kind, yiaddr, server_id, Some(&cfg.subnets[subnet]), t);
    Reply { kind, bytes, dest: reply::destination(req, kind, yiaddr), yiaddr }
}

fn nak(cfg: &Config, req: &Request, server_id: Ipv4Addr, subnet: SubnetId, transitions: Vec<Transition>) -> Outcome {
    Outcome { transitions, action: Action::Reply { reply: reply_to(cfg, req, MessageType::Nak, Ipv4Addr::UNSPECIFIED, server_id, subnet, false), durable: false } }
}

/// Decides what to do with one request. `ping` says whether fresh addresses are probed first.
pub fn handle(cfg: &Config, alloc: &mut Allocator, req: &Request, ing: &Ingress, now: UnixSecs, ping: bool) -> Outcome {
    let Some((subnet, server_id)) = locate(cfg, req, ing) else { return Outcome::silent(vec![], Silence::NoSubnet) };
    match req.kind {
        MessageType::Discover => discover(cfg, alloc, req, ing, subnet, server_id, now, ping, 0),
        MessageType::Request => request(cfg, alloc, req, ing, subnet, server_id, now),
        MessageType::Release => {
            if req.server_id.is_some_and(|s| !is_ours(s, server_id, ing)) {
                return Outcome::silent(vec![], Silence::NotForUs);
            }
            let t = alloc.release(req.msg.ciaddr(), &req.client, now);
            Outcome::silent(t.into_iter().collect(), Silence::NoReplyExpected)
        }
        MessageType::Decline => {
            if req.server_id.is_some_and(|s| !is_ours(s, server_id, ing)) {
                return Outcome::silent(vec![], Silence::NotForUs);
            }
            let Some(addr) = req.requested else { return Outcome::silent(vec![], Silence::Malformed("DECLINE without requested address")) };
            let t = alloc.quarantine(addr, &req.client, now);
            Outcome::silent(t.into_iter().collect(), Silence::NoReplyExpected)
        }
        MessageType::Inform => {
            // No lease, no yiaddr: configuration only, straight to ciaddr (or via the relay).
            let r = reply_to(cfg, req, MessageType::Ack, Ipv4Addr::UNSPECIFIED, server_id, subnet, false);
            let dest = match r.dest {
                Destination::Relay(_) => r.dest,
                _ if !req.msg.ciaddr().is_unspecified() => Destination::Unicast(req.msg.ciaddr()),
                _ => Destination::Broadcast,
            };
            Outcome { transitions: vec![], action: Action::Reply { reply: Reply { dest, ..r }, durable: false } }
        }
        _ => Outcome::silent(vec![], Silence::Malformed("not a client message")),
    }
}

#[allow(clippy::too_many_arguments)]
fn discover(cfg: &Config, alloc: &mut Allocator, req: &Request, ing: &Ingress, subnet: SubnetId, server_id: Ipv4Addr, now: UnixSecs, ping: bool, attempts: u8) -> Outcome {
    let choice = alloc.choose(subnet, &req.client, &req.hw, req.client_id.as_deref(), req.requested, now);
    let (addr, fresh, take_over) = match choice {
        Choice::Offer { addr, fresh, take_over } => (addr, fresh, take_over),
        Choice::Exhausted => return Outcome::silent(vec![], Silence::PoolExhausted),
        Choice::HeldOff { group, holder } => return Outcome::silent(vec![], Silence::AliasHeldOff { group, holder }),
        Choice::ReservedUnavailable { addr } => return Outcome::silent(vec![], Silence::ReservedUnavailable(addr)),
    };
    if alloc.binding(addr).is_some_and(|b| b.state == LeaseState::Probing && b.is_owned_by(&req.client) && b.expires > now) {
        return Outcome::silent(vec![], Silence::ProbeInFlight); // a retransmission; the probe answers it
    }
    if ping && fresh && !take_over {
        if attempts >= MAX_PROBES {
            return Outcome::silent(vec![], Silence::ProbesExhausted);
        }
        let transitions = alloc.probe(addr, &req.client, &req.hw, now);
        return Outcome { transitions, action: Action::Probe(PendingOffer { req: Box::new(req.clone()), ingress: ing.clone(), addr, attempts: attempts + 1 }) };
    }
    let transitions = if take_over { alloc.take_over(addr, &req.client, &req.hw, now) } else { alloc.offer(addr, &req.client, &req.hw, now) };
    let reply = reply_to(cfg, req, MessageType::Offer, addr, server_id, subnet, true);
    Outcome { transitions, action: Action::Reply { reply, durable: false } }
}

/// Continues a DISCOVER once the probe of `p.addr` is done.
pub fn after_probe(cfg: &Config, alloc: &mut Allocator, p: PendingOffer, answered: bool, now: UnixSecs) -> Outcome {
    let Some((subnet, server_id)) = locate(cfg, &p.req, &p.ingress) else { return Outcome::silent(vec![], Silence::NoSubnet) };
    let still_ours = alloc.binding(p.addr).is_some_and(|b| b.state == LeaseState::Probing && b.is_owned_by(&p.req.client));
    if !still_ours {
        // The reaper or another request got there first; start over.
        return discover(cfg, alloc, &p.req, &p.ingress, subnet, server_id, now, true, p.attempts);
    }
    if answered {
        // Someone uses the address without a lease: quarantine it and try another.
        let mut transitions: Vec<Transition> = alloc.quarantine(p.addr, &p.req.client, now).into_iter().collect();
        let next = discover(cfg, alloc, &p.req, &p.ingress, subnet, server_id, now, true, p.attempts);
        transitions.extend(next.transitions);
        return Outcome { transitions, action: next.action };
    }
    let transitions = alloc.offer(p.addr, &p.req.client, &p.req.hw, now);
    let reply = reply_to(cfg, &p.req, MessageType::Offer, p.addr, server_id, subnet, true);
    Outcome { transitions, action: Action::Reply { reply, durable: false } }
}

fn request(cfg: &Config, alloc: &mut Allocator, req: &Request, ing: &Ingress, subnet: SubnetId, server_id: Ipv4Addr, now: UnixSecs) -> Outcome {
    let ciaddr = req.msg.ciaddr();
    let addr = match (req.server_id, req.requested, ciaddr.is_unspecified()) {
        // SELECTING: the client names the server it chose.
        (Some(sid), _, _) if !is_ours(sid, server_id, ing) => {
            let t = alloc.withdraw_offer(subnet, &req.client, now);
            return Outcome::silent(t.into_iter().collect(), Silence::OtherServerChosen);
        }
        (Some(_), Some(a), _) => a,
        (Some(_), None, false) => ciaddr,
        // INIT-REBOOT: no server id, requested address, no ciaddr.
        (None, Some(a), true) => a,
        // RENEWING (unicast) / REBINDING (broadcast): ciaddr is the address.
        (None, _, false) => ciaddr,
        _ => return Outcome::silent(vec![], Silence::Malformed("REQUEST without an address")),
    };
    if !cfg.subnets[subnet].contains(addr) {
        return nak(cfg, req, server_id, subnet, vec![]); // the client moved to another network
    }
    // A host with a reservation here must use it.
    if alloc.reserved_ip_for(subnet, &req.hw, req.client_id.as_deref()).is_some_and(|ip| ip != addr) {
        return nak(cfg, req, server_id, subnet, vec![]);
    }
    match alloc.may_lease(addr, &req.client, &req.hw, req.client_id.as_deref(), now) {
        Ok(()) => {
            let lease_secs = cfg.subnets[subnet].lease_secs;
            let transitions = alloc.lease(addr, &req.client, &req.hw, req.hostname.as_deref(), lease_secs, now);
            let reply = reply_to(cfg, req, MessageType::Ack, addr, server_id, subnet, true);
            Outcome { transitions, action: Action::Reply { reply, durable: true } }
        }
        Err(_) => nak(cfg, req, server_id, subnet, vec![]),
    }
}
