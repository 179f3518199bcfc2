//! The decision function for every message type and state, plus bad input.

use std::net::Ipv4Addr;
use std::path::Path;

use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use proptest::prelude::*;

use super::*;
use crate::allocator::Allocator;
use crate::config::{Config, LocalAddrs};
use crate::lease::LeaseState;

const SERVER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

fn config(extra: &str) -> Config {
    let text = format!(
        "[node]\nname='t'\n[dhcp]\ninterfaces=['lan0']\n{extra}\n\
         [[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.100-198.18.0.102']\nlease_secs=3600\n\
         routers=['198.18.0.1']\ndns_servers=['198.18.0.1']\ndomain_name='branch.example'\nntp_servers=['198.18.0.1']\n\
         [[subnet]]\ncidr='198.18.8.0/24'\npools=['198.18.8.10-198.18.8.20']\nlease_secs=600\nrouters=['198.18.8.1']\n\
         [[reservation]]\nname='anna'\nhw=['02:00:00:00:00:01','02:00:00:00:00:02']\nip='198.18.0.50'\n"
    );
    Config::parse(Path::new("t.toml"), &text, &LocalAddrs::default()).unwrap()
}

use crate::testkit::{Msg, lan, mac};

fn decoded(r: &Reply) -> Message {
    Message::decode(&mut Decoder::new(&r.bytes)).unwrap()
}

fn reply(o: &Decision) -> &Reply {
    match &o.answer {
        Answer::Reply { reply, .. } | Answer::Nak { reply, .. } | Answer::Reclaimed { reply, .. } => reply,
        other => panic!("expected a reply, got {other:?}"),
    }
}

/// Why a NAK was sent.
fn refused(o: &Decision) -> Refused {
    match &o.answer {
        Answer::Nak { refused, .. } => *refused,
        other => panic!("expected a NAK, got {other:?}"),
    }
}

fn kind(o: &Decision) -> MessageType {
    decoded(reply(o)).opts().msg_type().unwrap()
}

struct Lab {
    cfg: Config,
    alloc: Allocator,
    now: u64,
}

impl Lab {
    fn new(extra: &str) -> Lab {
        let cfg = config(extra);
        let alloc = Allocator::new(&cfg);
        Lab { cfg, alloc, now: 1_000_000 }
    }
    fn send(&mut self, m: &Msg) -> Decision {
        handle(&self.cfg, &mut self.alloc, &m.req(), &lan(), self.now, false)
    }
    fn dora(&mut self, n: u8) -> Ipv4Addr {
        let offer = self.send(&Msg::new(MessageType::Discover, n));
        let addr = reply(&offer).yiaddr;
        let ack = self.send(
            &Msg::new(MessageType::Request, n)
                .opt(DhcpOption::ServerIdentifier(SERVER))
                .opt(DhcpOption::RequestedIpAddress(addr)),
        );
        assert_eq!(kind(&ack), MessageType::Ack);
        addr
    }
}

#[test]
fn dora_gives_a_lease_with_the_configured_options() {
    let mut lab = Lab::new("");
    let offer = lab.send(&Msg::new(MessageType::Discover, 10).opt(DhcpOption::Hostname("pc10".into())));
    let r = reply(&offer);
    assert!(matches!(offer.answer, Answer::Reply { durable: false, .. }), "an offer need not wait for the disk");
    let m = decoded(r);
    assert_eq!(m.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(m.yiaddr(), Ipv4Addr::new(198, 18, 0, 100));
    assert_eq!(m.xid(), 0x1234_5600 + 10);
    assert_eq!(m.opts().get(OptionCode::ServerIdentifier), Some(&DhcpOption::ServerIdentifier(SERVER)));
    assert_eq!(m.opts().get(OptionCode::AddressLeaseTime), Some(&DhcpOption::AddressLeaseTime(3600)));
    assert_eq!(m.opts().get(OptionCode::Renewal), Some(&DhcpOption::Renewal(1800)));
    assert_eq!(m.opts().get(OptionCode::Rebinding), Some(&DhcpOption::Rebinding(3150)));
    assert_eq!(m.opts().get(OptionCode::SubnetMask), Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0))));
    assert_eq!(
        m.opts().get(OptionCode::BroadcastAddr),
        Some(&DhcpOption::BroadcastAddr(Ipv4Addr::new(198, 18, 0, 255)))
    );
    assert_eq!(m.opts().get(OptionCode::DomainName), Some(&DhcpOption::DomainName("branch.example".into())));
    assert!(r.bytes.len() >= 300);
    assert_eq!(r.dest, Destination::Hardware { addr: m.yiaddr(), hw: mac(10) });

    let ack = lab.send(
        &Msg::new(MessageType::Request, 10)
            .opt(DhcpOption::ServerIdentifier(SERVER))
            .opt(DhcpOption::RequestedIpAddress(m.yiaddr()))
            .opt(DhcpOption::Hostname("pc10".into())),
    );
    assert!(matches!(ack.answer, Answer::Reply { durable: true, .. }), "an ACK waits for the lease to be durable");
    assert_eq!(kind(&ack), MessageType::Ack);
    let t = ack.transitions.last().unwrap();
    assert_eq!(t.new.state, LeaseState::Leased);
    assert_eq!(t.new.expires, lab.now + 3600);
    assert_eq!(t.new.hostname.as_deref(), Some("pc10"));
}

#[test]
fn parameter_request_list_order_decides_what_fits() {
    let many: Vec<String> = (1..=60).map(|i| format!("'198.18.1.{i}'")).collect();
    let list = many.join(",");
    let text = format!(
        "[node]\nname='t'\n[dhcp]\ninterfaces=['lan0']\n[[subnet]]\ncidr='198.18.0.0/16'\npools=['198.18.0.100-198.18.0.102']\n\
         dns_servers=[{list}]\nntp_servers=[{list}]\n"
    );
    let cfg = Config::parse(Path::new("t.toml"), &text, &LocalAddrs::default()).unwrap();
    let ing = lan();
    for (first, second) in
        [(OptionCode::NtpServers, OptionCode::DomainNameServer), (OptionCode::DomainNameServer, OptionCode::NtpServers)]
    {
        let mut alloc = Allocator::new(&cfg);
        let m = Msg::new(MessageType::Discover, 3).opt(DhcpOption::ParameterRequestList(vec![
            first,
            second,
            OptionCode::SubnetMask,
        ]));
        let o = handle(&cfg, &mut alloc, &m.req(), &ing, 1, false);
        let r = decoded(reply(&o));
        assert!(r.opts().get(first).is_some(), "{first:?} was asked for first");
        assert!(r.opts().get(second).is_none(), "{second:?} does not fit in 576 bytes as well");
        assert!(r.opts().get(OptionCode::SubnetMask).is_some(), "a small option later in the list still fits");
        assert!(reply(&o).bytes.len() <= 548);
    }
    // A client that accepts 1500-byte messages gets both.
    let mut alloc = Allocator::new(&cfg);
    let m = Msg::new(MessageType::Discover, 3)
        .opt(DhcpOption::ParameterRequestList(vec![OptionCode::NtpServers, OptionCode::DomainNameServer]))
        .opt(DhcpOption::MaxMessageSize(1500));
    let r = decoded(reply(&handle(&cfg, &mut alloc, &m.req(), &ing, 1, false)));
    assert!(r.opts().get(OptionCode::NtpServers).is_some() && r.opts().get(OptionCode::DomainNameServer).is_some());
}

#[test]
fn renew_and_rebind_extend_the_lease_and_unicast_to_ciaddr() {
    let mut lab = Lab::new("");
    let addr = lab.dora(10);
    lab.now += 1800;
    let renew = lab.send(&Msg::new(MessageType::Request, 10).ciaddr(addr));
    assert_eq!(kind(&renew), MessageType::Ack);
    assert_eq!(reply(&renew).dest, Destination::Unicast(addr));
    assert_eq!(decoded(reply(&renew)).ciaddr(), addr);
    assert_eq!(lab.alloc.binding(addr).unwrap().expires, lab.now + 3600);
    lab.now += 3200;
    let rebind = lab.send(&Msg::new(MessageType::Request, 10).ciaddr(addr).broadcast());
    assert_eq!(kind(&rebind), MessageType::Ack);
    assert_eq!(lab.alloc.binding(addr).unwrap().expires, lab.now + 3600);
}

#[test]
fn init_reboot_is_acked_for_its_own_address_and_naked_elsewhere() {
    let mut lab = Lab::new("");
    let addr = lab.dora(10);
    let reboot = lab.send(&Msg::new(MessageType::Request, 10).opt(DhcpOption::RequestedIpAddress(addr)));
    assert_eq!(kind(&reboot), MessageType::Ack);
    // Someone else's address.
    let other = lab.send(&Msg::new(MessageType::Request, 11).opt(DhcpOption::RequestedIpAddress(addr)));
    assert_eq!(kind(&other), MessageType::Nak);
    assert_eq!(refused(&other), Refused { addr, reason: "address leased to another client" });
    assert_eq!(reply(&other).dest, Destination::Broadcast);
    assert!(lab.alloc.binding(addr).unwrap().is_owned_by(&Msg::new(MessageType::Request, 10).req().client));
    // An address from the network the client came from.
    let moved = lab
        .send(&Msg::new(MessageType::Request, 12).opt(DhcpOption::RequestedIpAddress(Ipv4Addr::new(198, 18, 8, 15))));
    assert_eq!(kind(&moved), MessageType::Nak);
    assert_eq!(refused(&moved).reason, "address not in the client's subnet (it moved)");
}

#[test]
fn a_lost_store_is_repopulated_by_renewals() {
    // After a wiped disk the client renews an address we have no record of: grant it if free.
    let mut lab = Lab::new("");
    let addr = Ipv4Addr::new(198, 18, 0, 101);
    let renew = lab.send(&Msg::new(MessageType::Request, 10).ciaddr(addr));
    assert_eq!(kind(&renew), MessageType::Ack);
    assert_eq!(lab.alloc.binding(addr).unwrap().state, LeaseState::Leased);
}

#[test]
fn selecting_another_server_withdraws_our_offer() {
    let mut lab = Lab::new("");
    let offer = lab.send(&Msg::new(MessageType::Discover, 10));
    let addr = reply(&offer).yiaddr;
    let o = lab.send(
        &Msg::new(MessageType::Request, 10)
            .opt(DhcpOption::ServerIdentifier(Ipv4Addr::new(198, 18, 0, 9)))
            .opt(DhcpOption::RequestedIpAddress(addr)),
    );
    assert!(matches!(o.answer, Answer::Silent(Silence::OtherServerChosen)));
    assert_eq!(lab.alloc.binding(addr).unwrap().state, LeaseState::Free);
}

#[test]
fn release_frees_only_the_owners_address() {
    let mut lab = Lab::new("");
    let addr = lab.dora(10);
    let foreign = lab.send(&Msg::new(MessageType::Release, 11).ciaddr(addr).opt(DhcpOption::ServerIdentifier(SERVER)));
    assert!(foreign.transitions.is_empty());
    assert_eq!(lab.alloc.binding(addr).unwrap().state, LeaseState::Leased);
    let own = lab.send(&Msg::new(MessageType::Release, 10).ciaddr(addr).opt(DhcpOption::ServerIdentifier(SERVER)));
    assert!(matches!(own.answer, Answer::Silent(Silence::NoReplyExpected)));
    assert_eq!(lab.alloc.binding(addr).unwrap().state, LeaseState::Free);
}

#[test]
fn decline_quarantines_and_the_client_gets_another_address() {
    let mut lab = Lab::new("");
    let addr = lab.dora(10);
    lab.send(
        &Msg::new(MessageType::Decline, 10)
            .opt(DhcpOption::RequestedIpAddress(addr))
            .opt(DhcpOption::ServerIdentifier(SERVER)),
    );
    let b = lab.alloc.binding(addr).unwrap();
    assert_eq!((b.state, b.expires), (LeaseState::Declined, lab.now + 600));
    assert_ne!(lab.dora(10), addr);
}

#[test]
fn inform_gets_options_without_a_lease() {
    let mut lab = Lab::new("");
    let ci = Ipv4Addr::new(198, 18, 0, 33);
    let o = lab.send(&Msg::new(MessageType::Inform, 10).ciaddr(ci));
    let r = reply(&o);
    let m = decoded(r);
    assert_eq!(m.opts().msg_type(), Some(MessageType::Ack));
    assert_eq!(m.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert!(m.opts().get(OptionCode::AddressLeaseTime).is_none());
    assert!(m.opts().get(OptionCode::Router).is_some());
    assert_eq!(r.dest, Destination::Unicast(ci));
    assert!(o.transitions.is_empty());
}

#[test]
fn relayed_requests_use_the_giaddr_subnet_and_echo_option_82() {
    let mut lab = Lab::new("");
    let relay = Ipv4Addr::new(198, 18, 8, 1);
    let mut bytes = Msg::new(MessageType::Discover, 10).giaddr(relay).bytes();
    // Insert option 82 (circuit id "eth3", remote id 0xAA 0xBB) before End, as a relay does.
    let raw82 = [82u8, 10, 1, 4, b'e', b't', b'h', b'3', 2, 2, 0xAA, 0xBB];
    assert_eq!(bytes.pop(), Some(255));
    bytes.extend_from_slice(&raw82);
    bytes.push(255);
    let req = parse(&bytes).unwrap();
    let ing = Ingress {
        iface_addrs: vec!["198.18.0.1/24".parse().unwrap()],
        local_dst: SERVER,
        served: false,
        interface: None,
    };
    let o = handle(&lab.cfg, &mut lab.alloc, &req, &ing, lab.now, false);
    let r = reply(&o);
    assert_eq!(r.dest, Destination::Relay(relay));
    assert!(cfg_subnet(&lab.cfg, 1).contains(r.yiaddr), "giaddr selects the subnet");
    let m = decoded(r);
    assert_eq!(m.giaddr(), relay);
    assert_eq!(m.opts().get(OptionCode::AddressLeaseTime), Some(&DhcpOption::AddressLeaseTime(600)));
    assert_eq!(m.opts().get(OptionCode::ServerIdentifier), Some(&DhcpOption::ServerIdentifier(SERVER)));
    let pos = r.bytes.windows(raw82.len()).position(|w| w == raw82).expect("option 82 echoed byte for byte");
    assert_eq!(r.bytes[pos + raw82.len()], 255, "option 82 is the last option");
    // A relayed NAK asks the relay to broadcast.
    let nak = handle(
        &lab.cfg,
        &mut lab.alloc,
        &Msg::new(MessageType::Request, 11)
            .giaddr(relay)
            .opt(DhcpOption::RequestedIpAddress(Ipv4Addr::new(198, 18, 0, 100)))
            .req(),
        &ing,
        lab.now,
        false,
    );
    assert_eq!(kind(&nak), MessageType::Nak);
    assert!(decoded(reply(&nak)).flags().broadcast());
}

fn cfg_subnet(cfg: &Config, i: usize) -> &crate::config::Subnet {
    &cfg.subnets[i]
}

#[test]
fn direct_broadcast_on_an_unserved_interface_is_ignored() {
    let mut lab = Lab::new("");
    let ing = Ingress { served: false, interface: None, ..lan() };
    let o = handle(&lab.cfg, &mut lab.alloc, &Msg::new(MessageType::Discover, 10).req(), &ing, lab.now, false);
    assert!(matches!(o.answer, Answer::Silent(Silence::NoSubnet)));
}

#[test]
fn broadcast_flag_means_broadcast() {
    let mut lab = Lab::new("");
    let o = lab.send(&Msg::new(MessageType::Discover, 10).broadcast());
    assert_eq!(reply(&o).dest, Destination::Broadcast);
}

#[test]
fn a_probe_precedes_a_fresh_offer_and_an_answer_moves_on() {
    let mut lab = Lab::new("");
    let req = Msg::new(MessageType::Discover, 10).req();
    let o = handle(&lab.cfg, &mut lab.alloc, &req, &lan(), lab.now, true);
    let Answer::Probe(p) = o.answer else { panic!("expected a probe") };
    assert_eq!(lab.alloc.binding(p.addr).unwrap().state, LeaseState::Probing);
    // The retransmitted DISCOVER while the probe runs is not answered twice.
    let again = handle(&lab.cfg, &mut lab.alloc, &req, &lan(), lab.now, true);
    assert!(matches!(again.answer, Answer::Silent(Silence::ProbeInFlight)));
    let first = p.addr;
    // Somebody answers: quarantine, probe the next one.
    let o = after_probe(&lab.cfg, &mut lab.alloc, p, true, lab.now);
    assert_eq!(lab.alloc.binding(first).unwrap().state, LeaseState::Declined);
    let Answer::Probe(p2) = o.answer else { panic!("expected a second probe") };
    assert_ne!(p2.addr, first);
    let o = after_probe(&lab.cfg, &mut lab.alloc, p2.clone(), false, lab.now);
    assert_eq!(kind(&o), MessageType::Offer);
    assert_eq!(reply(&o).yiaddr, p2.addr);
    // The client's own address is not probed again later.
    let ack = lab.send(
        &Msg::new(MessageType::Request, 10)
            .opt(DhcpOption::ServerIdentifier(SERVER))
            .opt(DhcpOption::RequestedIpAddress(p2.addr)),
    );
    assert_eq!(kind(&ack), MessageType::Ack);
    let o = handle(&lab.cfg, &mut lab.alloc, &req, &lan(), lab.now, true);
    assert_eq!(kind(&o), MessageType::Offer);
}

#[test]
fn reservation_by_mac_and_alias_hold_off() {
    let mut lab = Lab::new("");
    assert_eq!(lab.dora(1), Ipv4Addr::new(198, 18, 0, 50));
    let o = lab.send(&Msg::new(MessageType::Discover, 2));
    assert!(matches!(o.answer, Answer::Silent(Silence::AliasHeldOff { .. })), "{:?}", o.answer);
    // A member asking for a pool address is told to use its reservation.
    let o = lab
        .send(&Msg::new(MessageType::Request, 2).opt(DhcpOption::RequestedIpAddress(Ipv4Addr::new(198, 18, 0, 100))));
    assert_eq!(kind(&o), MessageType::Nak);
    // The first member releases; the second gets the address.
    lab.send(&Msg::new(MessageType::Release, 1).ciaddr(Ipv4Addr::new(198, 18, 0, 50)));
    assert_eq!(lab.dora(2), Ipv4Addr::new(198, 18, 0, 50));
}

#[test]
fn alias_take_over_naks_the_old_holder() {
    let mut lab = Lab::new("on_alias_busy='take-over'");
    let ip = lab.dora(1);
    assert_eq!(lab.dora(2), ip);
    let o = lab.send(&Msg::new(MessageType::Request, 1).ciaddr(ip));
    assert_eq!(kind(&o), MessageType::Nak);
}

#[test]
fn exhaustion_means_no_offer() {
    let mut lab = Lab::new("");
    for n in 10..13 {
        lab.dora(n);
    }
    let o = lab.send(&Msg::new(MessageType::Discover, 20));
    assert!(matches!(o.answer, Answer::Silent(Silence::PoolExhausted)));
}

#[test]
fn a_flood_of_discovers_cannot_keep_a_new_client_from_an_offer() {
    let mut lab = Lab::new("");
    lab.dora(10); // a real lease: never touched by the flood
    // Strangers (50 of them, one DISCOVER each, a second apart) hold both other addresses in
    // turn: each new one takes the offer made longest ago.
    for n in 0..50u8 {
        lab.now += 1;
        let o = lab.send(&Msg::new(MessageType::Discover, 100 + n));
        assert_eq!(kind(&o), MessageType::Offer, "stranger {n}");
        if n >= 2 {
            let Answer::Reclaimed { from, .. } = &o.answer else { panic!("expected a reclaimed offer: {o:?}") };
            assert_eq!(from, &Msg::new(MessageType::Discover, 100 + n - 2).req().client);
        }
    }
    let leased = lab.alloc.bindings().filter(|b| b.state == LeaseState::Leased).count();
    assert_eq!(leased, 1, "the flood took a leased address");
    // A real client then completes DORA, and a reserved host still gets its address.
    let addr = lab.dora(20);
    assert_eq!(lab.alloc.binding(addr).unwrap().state, LeaseState::Leased);
    assert_eq!(lab.dora(1), Ipv4Addr::new(198, 18, 0, 50));
    lab.alloc.check_invariants(lab.now).unwrap();
}

#[test]
fn a_client_that_discovers_again_gets_its_earlier_offer_back() {
    let mut lab = Lab::new("");
    let first = reply(&lab.send(&Msg::new(MessageType::Discover, 20))).yiaddr;
    lab.now += 1;
    lab.send(&Msg::new(MessageType::Discover, 21));
    lab.now += 1;
    lab.send(&Msg::new(MessageType::Discover, 22));
    // Client 20 retransmits: its own offer again, refreshed, so the next stranger reclaims
    // client 21's (now the oldest) instead.
    lab.now += 1;
    let again = lab.send(&Msg::new(MessageType::Discover, 20));
    assert!(matches!(again.answer, Answer::Reply { .. }), "{again:?}");
    assert_eq!(reply(&again).yiaddr, first);
    lab.now += 1;
    let o = lab.send(&Msg::new(MessageType::Discover, 23));
    let Answer::Reclaimed { from, .. } = &o.answer else { panic!("expected a reclaimed offer: {o:?}") };
    assert_eq!(from, &Msg::new(MessageType::Discover, 21).req().client);
    // The client whose offer was taken is refused if it asks for it now, and offered another.
    let late = lab.send(
        &Msg::new(MessageType::Request, 21)
            .opt(DhcpOption::ServerIdentifier(SERVER))
            .opt(DhcpOption::RequestedIpAddress(reply(&o).yiaddr)),
    );
    assert_eq!(kind(&late), MessageType::Nak);
}

#[test]
fn client_identifier_is_the_identity_and_is_echoed() {
    let mut lab = Lab::new("");
    let id = vec![0xff, 1, 2, 3, 4];
    let o = lab.send(&Msg::new(MessageType::Discover, 10).opt(DhcpOption::ClientIdentifier(id.clone())));
    assert_eq!(
        decoded(reply(&o)).opts().get(OptionCode::ClientIdentifier),
        Some(&DhcpOption::ClientIdentifier(id.clone()))
    );
    let addr = reply(&o).yiaddr;
    // Same client id from another NIC: same binding.
    let o = lab.send(&Msg::new(MessageType::Discover, 11).opt(DhcpOption::ClientIdentifier(id)));
    assert_eq!(reply(&o).yiaddr, addr);
}

#[test]
fn malformed_packets_are_rejected_with_a_reason() {
    let good = Msg::new(MessageType::Discover, 1).bytes();
    assert!(matches!(parse(&good[..100]), Err(Rejected::TooShort(100))));
    let mut reply_op = good.clone();
    reply_op[0] = 2;
    assert_eq!(parse(&reply_op).unwrap_err(), Rejected::NotRequest);
    let mut hlen = good.clone();
    hlen[2] = 200;
    assert_eq!(parse(&hlen).unwrap_err(), Rejected::BadHlen(200));
    let mut magic = good.clone();
    magic[236] = 0;
    assert_eq!(parse(&magic).unwrap_err(), Rejected::BadMagic);
    let offer = Msg::new(MessageType::Offer, 1).bytes();
    assert!(matches!(parse(&offer), Err(Rejected::NotClientMessage(MessageType::Offer))));
    let mut bogus_len = good.clone();
    bogus_len.truncate(bogus_len.len() - 1); // drop End
    bogus_len.extend_from_slice(&[12, 200, b'x']); // hostname claiming 200 bytes
    assert!(parse(&bogus_len).is_err());
    let mut no_type = Message::new_with_id(
        1,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &mac(1),
    );
    no_type.opts_mut().insert(DhcpOption::Hostname("x".into()));
    let mut v = Vec::new();
    no_type.encode(&mut Encoder::new(&mut v)).unwrap();
    assert_eq!(parse(&v).unwrap_err(), Rejected::NoMessageType);
}

fn run_any(bytes: &[u8], lab: &mut Lab) {
    if let Ok(req) = parse(bytes) {
        for ing in [lan(), Ingress { iface_addrs: vec![], local_dst: SERVER, served: false, interface: None }] {
            let o = handle(&lab.cfg, &mut lab.alloc, &req, &ing, lab.now, true);
            if let Answer::Probe(p) = o.answer {
                let _ = after_probe(&lab.cfg, &mut lab.alloc, p, bytes.len().is_multiple_of(2), lab.now);
            }
        }
        lab.alloc.check_invariants(lab.now).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..700)) {
        let mut lab = Lab::new("");
        run_any(&bytes, &mut lab);
    }

    #[test]
    fn mutated_valid_packets_never_panic(kind in 0usize..5, n in 0u8..20, flips in prop::collection::vec((0usize..400, any::<u8>()), 1..12), cut in 200usize..420) {
        let kinds = [MessageType::Discover, MessageType::Request, MessageType::Release, MessageType::Decline, MessageType::Inform];
        let mut bytes = Msg::new(kinds[kind], n)
            .opt(DhcpOption::RequestedIpAddress(Ipv4Addr::new(198, 18, 0, 100 + n % 4)))
            .opt(DhcpOption::ServerIdentifier(SERVER))
            .opt(DhcpOption::ParameterRequestList(vec![OptionCode::Router, OptionCode::DomainNameServer]))
            .opt(DhcpOption::Hostname("host".into()))
            .bytes();
        for (i, b) in flips {
            if let Some(x) = bytes.get_mut(i) { *x = b; }
        }
        bytes.truncate(cut);
        let mut lab = Lab::new("");
        lab.dora(n.wrapping_add(1));
        run_any(&bytes, &mut lab);
    }
}
