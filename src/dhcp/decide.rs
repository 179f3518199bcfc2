//! The DHCP server's decisions (RFC 2131 §4.3), free of I/O: a request, where it came from and
//! the time go in; a reply (or silence) and the allocator transitions to make durable come out.

use std::net::Ipv4Addr;

use dhcproto::v4::MessageType;
use ipnet::Ipv4Net;

use super::classify::{Facts, classify};
use super::inbound::Request;
use super::reply::{self, Destination, LeaseTimes, Scope};
use crate::allocator::{Allocator, Choice, Decline};
use crate::config::{ClassSet, Config, SubnetId};
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
    /// Which of `[dhcp] interfaces` it arrived on (None for the relay-only socket).
    pub interface: Option<usize>,
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
    AliasHeldOff {
        group: String,
        holder: ClientKey,
    },
    ReservedUnavailable(Ipv4Addr),
    ProbeInFlight,
    ProbesExhausted,
    Malformed(&'static str),
    /// RELEASE and DECLINE are never answered.
    NoReplyExpected,
    /// A DECLINE quarantined the address (logged with the client that said it is in use).
    Declined {
        addr: Ipv4Addr,
        client: ClientKey,
    },
    /// A DECLINE from a client that already declined its share within the probation period:
    /// ignored, so one client cannot quarantine the whole pool.
    DeclineIgnored {
        addr: Ipv4Addr,
        client: ClientKey,
    },
}

#[derive(Debug)]
pub enum Answer {
    /// Send after `transitions` are durable (immediately if `durable` is false).
    Reply {
        reply: Reply,
        durable: bool,
    },
    /// DHCPNAK, sent at once; `refused` says which address and why (for the log).
    Nak {
        reply: Reply,
        refused: Refused,
    },
    /// An OFFER of an address taken from another client's unrequested offer (the pool is
    /// exhausted); sent at once like any OFFER, and counted and summarised in the log.
    Reclaimed {
        reply: Reply,
        from: ClientKey,
    },
    /// Ping the address, then call [`after_probe`].
    Probe(PendingOffer),
    Silent(Silence),
}

/// Why a REQUEST was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub addr: Ipv4Addr,
    pub reason: &'static str,
}

#[derive(Debug)]
pub struct Decision {
    pub transitions: Vec<Transition>,
    pub answer: Answer,
}

impl Decision {
    fn silent(transitions: Vec<Transition>, why: Silence) -> Decision {
        Decision { transitions, answer: Answer::Silent(why) }
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
    let server_id = if !m.giaddr().is_unspecified() && unicast_dst {
        Some(ing.local_dst)
    } else {
        iface_addr_in(subnet).or_else(fallback_id)
    };
    Some((subnet, server_id?))
}

fn is_ours(sid: Ipv4Addr, server_id: Ipv4Addr, ing: &Ingress) -> bool {
    sid == server_id || ing.iface_addrs.iter().any(|n| n.addr() == sid)
}

/// The server identifier for a reply about an address in `subnet`: our address in that subnet
/// on the interface the request came in on, when we have one (a shared network may give the
/// server an address in each subnet), else the one found for the request.
fn server_id_in(cfg: &Config, req: &Request, ing: &Ingress, subnet: SubnetId, found: Ipv4Addr) -> Ipv4Addr {
    if !req.msg.giaddr().is_unspecified() {
        return found;
    }
    ing.iface_addrs.iter().map(Ipv4Net::addr).find(|a| cfg.subnets[subnet].contains(*a)).unwrap_or(found)
}

fn times(cfg: &Config, subnet: SubnetId) -> LeaseTimes {
    let s = &cfg.subnets[subnet];
    LeaseTimes { lease: s.lease_secs, renew: s.renew_secs, rebind: s.rebind_secs }
}

/// What a reply is about: the subnet of its address, the server identifier to use and the
/// client's classes.
#[derive(Clone, Copy)]
struct About {
    subnet: SubnetId,
    server_id: Ipv4Addr,
    classes: ClassSet,
}

fn reply_to(
    cfg: &Config,
    alloc: &Allocator,
    req: &Request,
    kind: MessageType,
    yiaddr: Ipv4Addr,
    about: About,
    with_times: bool,
) -> Reply {
    let t = with_times.then(|| times(cfg, about.subnet));
    // The options of the pool that holds the address (for INFORM, the client's own one).
    let addr = if yiaddr.is_unspecified() { req.msg.ciaddr() } else { yiaddr };
    let scope = Scope {
        reservation: alloc
            .reservation_in(about.subnet, &req.hw, req.client_id.as_deref())
            .and_then(|r| cfg.reservations.get(r))
            .map(|r| &r.options),
        classes: about.classes,
        all_classes: &cfg.classes,
        pool: alloc.pool_of(addr).map(|p| &cfg.pools[p].options),
        subnet: Some(&cfg.subnets[about.subnet].options),
        global: &cfg.options,
    };
    let bytes = reply::build(req, kind, yiaddr, about.server_id, Some(&scope), t);
    Reply { kind, bytes, dest: reply::destination(req, kind, yiaddr), yiaddr }
}

fn nak(cfg: &Config, alloc: &Allocator, req: &Request, about: About, refused: Refused) -> Decision {
    let reply = reply_to(cfg, alloc, req, MessageType::Nak, Ipv4Addr::UNSPECIFIED, about, false);
    Decision { transitions: vec![], answer: Answer::Nak { reply, refused } }
}

/// The classes of the client that sent `req`.
fn classes_of(cfg: &Config, req: &Request, ing: &Ingress) -> ClassSet {
    if cfg.classes.is_empty() {
        return ClassSet::EMPTY;
    }
    classify(&cfg.classes, &Facts::of(req, ing))
}

/// Decides what to do with one request. `ping` says whether fresh addresses are probed first.
pub fn handle(
    cfg: &Config,
    alloc: &mut Allocator,
    req: &Request,
    ing: &Ingress,
    now: UnixSecs,
    ping: bool,
) -> Decision {
    let Some((subnet, server_id)) = locate(cfg, req, ing) else { return Decision::silent(vec![], Silence::NoSubnet) };
    let about = About { subnet, server_id, classes: classes_of(cfg, req, ing) };
    match req.kind {
        MessageType::Discover => discover(cfg, alloc, req, ing, about, now, ping, 0),
        MessageType::Request => request(cfg, alloc, req, ing, about, now),
        MessageType::Release => {
            if req.server_id.is_some_and(|s| !is_ours(s, server_id, ing)) {
                return Decision::silent(vec![], Silence::NotForUs);
            }
            let t = alloc.release(req.msg.ciaddr(), &req.client, now);
            Decision::silent(t.into_iter().collect(), Silence::NoReplyExpected)
        }
        MessageType::Decline => {
            if req.server_id.is_some_and(|s| !is_ours(s, server_id, ing)) {
                return Decision::silent(vec![], Silence::NotForUs);
            }
            let Some(addr) = req.requested else {
                return Decision::silent(vec![], Silence::Malformed("DECLINE without requested address"));
            };
            let client = req.client.clone();
            match alloc.decline(addr, &req.client, now) {
                Decline::Quarantined(t) => Decision::silent(vec![t], Silence::Declined { addr, client }),
                Decline::OverLimit => Decision::silent(vec![], Silence::DeclineIgnored { addr, client }),
                Decline::NotHolder => Decision::silent(vec![], Silence::NoReplyExpected),
            }
        }
        MessageType::Inform => {
            // No lease, no yiaddr: configuration only, straight to ciaddr (or via the relay),
            // with the options of the client's own subnet when it is in this network.
            let ciaddr = req.msg.ciaddr();
            let own = cfg.subnet_of(ciaddr).filter(|s| cfg.subnets[*s].network == cfg.subnets[subnet].network);
            let about = match own {
                Some(s) => About { subnet: s, server_id: server_id_in(cfg, req, ing, s, server_id), ..about },
                None => about,
            };
            let r = reply_to(cfg, alloc, req, MessageType::Ack, Ipv4Addr::UNSPECIFIED, about, false);
            let dest = match r.dest {
                Destination::Relay(_) => r.dest,
                _ if !req.msg.ciaddr().is_unspecified() => Destination::Unicast(req.msg.ciaddr()),
                _ => Destination::Broadcast,
            };
            Decision { transitions: vec![], answer: Answer::Reply { reply: Reply { dest, ..r }, durable: false } }
        }
        _ => Decision::silent(vec![], Silence::Malformed("not a client message")),
    }
}

#[allow(clippy::too_many_arguments)]
fn discover(
    cfg: &Config,
    alloc: &mut Allocator,
    req: &Request,
    ing: &Ingress,
    about: About,
    now: UnixSecs,
    ping: bool,
    attempts: u8,
) -> Decision {
    let choice = alloc.choose_for(
        about.subnet,
        about.classes,
        &req.client,
        &req.hw,
        req.client_id.as_deref(),
        req.requested,
        now,
    );
    let (addr, fresh, take_over) = match choice {
        Choice::Offer { addr, fresh, take_over } => (addr, fresh, take_over),
        // Never probed: it was checked when first offered, and nobody took it since.
        Choice::Reclaim { addr, from } => {
            let transitions = alloc.offer(addr, &req.client, &req.hw, now);
            let about = about_addr(cfg, alloc, req, ing, about, addr);
            let reply = reply_to(cfg, alloc, req, MessageType::Offer, addr, about, true);
            return Decision { transitions, answer: Answer::Reclaimed { reply, from } };
        }
        Choice::Exhausted => return Decision::silent(vec![], Silence::PoolExhausted),
        Choice::HeldOff { group, holder } => return Decision::silent(vec![], Silence::AliasHeldOff { group, holder }),
        Choice::ReservedUnavailable { addr } => return Decision::silent(vec![], Silence::ReservedUnavailable(addr)),
    };
    if alloc
        .binding(addr)
        .is_some_and(|b| b.state == LeaseState::Probing && b.is_owned_by(&req.client) && b.expires > now)
    {
        return Decision::silent(vec![], Silence::ProbeInFlight); // a retransmission; the probe answers it
    }
    if ping && fresh && !take_over {
        if attempts >= MAX_PROBES {
            return Decision::silent(vec![], Silence::ProbesExhausted);
        }
        let transitions = alloc.probe(addr, &req.client, &req.hw, now);
        return Decision {
            transitions,
            answer: Answer::Probe(PendingOffer {
                req: Box::new(req.clone()),
                ingress: ing.clone(),
                addr,
                attempts: attempts + 1,
            }),
        };
    }
    // An alias take-over is an ordinary offer: it abandons the current holder's binding, whose
    // client is NAKed at its next renewal.
    let transitions = alloc.offer(addr, &req.client, &req.hw, now);
    let about = about_addr(cfg, alloc, req, ing, about, addr);
    let reply = reply_to(cfg, alloc, req, MessageType::Offer, addr, about, true);
    Decision { transitions, answer: Answer::Reply { reply, durable: false } }
}

/// `about`, moved to the subnet of `addr` (another subnet of a shared network).
fn about_addr(cfg: &Config, alloc: &Allocator, req: &Request, ing: &Ingress, about: About, addr: Ipv4Addr) -> About {
    match alloc.subnet_of(addr).or_else(|| cfg.subnet_of(addr)) {
        Some(s) if s != about.subnet => {
            About { subnet: s, server_id: server_id_in(cfg, req, ing, s, about.server_id), ..about }
        }
        _ => about,
    }
}

/// Continues a DISCOVER once the probe of `p.addr` is done.
pub fn after_probe(cfg: &Config, alloc: &mut Allocator, p: PendingOffer, answered: bool, now: UnixSecs) -> Decision {
    let Some((subnet, server_id)) = locate(cfg, &p.req, &p.ingress) else {
        return Decision::silent(vec![], Silence::NoSubnet);
    };
    let about = About { subnet, server_id, classes: classes_of(cfg, &p.req, &p.ingress) };
    let still_ours =
        alloc.binding(p.addr).is_some_and(|b| b.state == LeaseState::Probing && b.is_owned_by(&p.req.client));
    if !still_ours {
        // The reaper or another request got there first; start over.
        return discover(cfg, alloc, &p.req, &p.ingress, about, now, true, p.attempts);
    }
    if answered {
        // Someone uses the address without a lease: quarantine it and try another.
        let mut transitions: Vec<Transition> = alloc.quarantine(p.addr, &p.req.client, now).into_iter().collect();
        let next = discover(cfg, alloc, &p.req, &p.ingress, about, now, true, p.attempts);
        transitions.extend(next.transitions);
        return Decision { transitions, answer: next.answer };
    }
    let transitions = alloc.offer(p.addr, &p.req.client, &p.req.hw, now);
    let about = about_addr(cfg, alloc, &p.req, &p.ingress, about, p.addr);
    let reply = reply_to(cfg, alloc, &p.req, MessageType::Offer, p.addr, about, true);
    Decision { transitions, answer: Answer::Reply { reply, durable: false } }
}

fn request(cfg: &Config, alloc: &mut Allocator, req: &Request, ing: &Ingress, about: About, now: UnixSecs) -> Decision {
    let (subnet, server_id) = (about.subnet, about.server_id);
    let ciaddr = req.msg.ciaddr();
    let addr = match (req.server_id, req.requested, ciaddr.is_unspecified()) {
        // SELECTING: the client names the server it chose.
        (Some(sid), _, _) if !is_ours(sid, server_id, ing) => {
            let t = alloc.withdraw_offer(subnet, &req.client, now);
            return Decision::silent(t.into_iter().collect(), Silence::OtherServerChosen);
        }
        (Some(_), Some(a), _) => a,
        (Some(_), None, false) => ciaddr,
        // INIT-REBOOT: no server id, requested address, no ciaddr.
        (None, Some(a), true) => a,
        // RENEWING (unicast) / REBINDING (broadcast): ciaddr is the address.
        (None, _, false) => ciaddr,
        _ => return Decision::silent(vec![], Silence::Malformed("REQUEST without an address")),
    };
    let network = cfg.subnets[subnet].network;
    let Some(own) = cfg.subnet_of(addr).filter(|s| cfg.subnets[*s].network == network) else {
        let reason = "address not in the client's subnet (it moved)";
        return nak(cfg, alloc, req, about, Refused { addr, reason });
    };
    // A host with a reservation here must use it.
    if alloc.reserved_ip_for(subnet, &req.hw, req.client_id.as_deref()).is_some_and(|ip| ip != addr) {
        let reason = "the client has a reservation for another address";
        return nak(cfg, alloc, req, about, Refused { addr, reason });
    }
    // An address from a pool the client's classes may not use (a laptop asking for an address
    // of the phones' pool it held before, say) is refused like one held by someone else.
    if !alloc.pool_admits(addr, about.classes) {
        let reason = "address in a pool the client's classes may not use";
        return nak(cfg, alloc, req, about, Refused { addr, reason });
    }
    match alloc.may_lease(addr, &req.client, &req.hw, req.client_id.as_deref(), now) {
        Ok(()) => {
            let about = About { subnet: own, server_id: server_id_in(cfg, req, ing, own, server_id), ..about };
            let lease_secs = cfg.subnets[own].lease_secs;
            let transitions = alloc.lease(addr, &req.client, &req.hw, req.hostname.as_deref(), lease_secs, now);
            let reply = reply_to(cfg, alloc, req, MessageType::Ack, addr, about, true);
            Decision { transitions, answer: Answer::Reply { reply, durable: true } }
        }
        Err(why) => nak(cfg, alloc, req, about, Refused { addr, reason: why.reason() }),
    }
}
