//! Tests of the sync layer without I/O: the codec, frame authentication, the conflict rule, and
//! two simulated boxes (allocator + machine each) exchanging messages over a wire the test
//! controls: delivered in any interleaving, cut and restored.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::frame::{self, FrameError, Hello, Opener, Sealer, Side};
use super::machine::{Readiness, SyncAction, SyncSession, Table, Timing};
use super::merge::{self, Merged};
use super::protocol::{
    self, Bucket, CatchUpRequest, DecodeError, EntryOutcome, EntryResult, Message, UpdateKind, Vote,
};
use crate::allocator::{Allocator, Choice};
use crate::config::{Config, LocalAddrs};
use crate::lease::{Binding, LeaseState};

fn config() -> Config {
    let text = "[node]\nname='t'\n[dhcp]\naffinity_hold_secs=100\n[[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.10-198.18.0.29']\nlease_secs=1000\n";
    Config::parse(std::path::Path::new("t.toml"), text, &LocalAddrs::default()).unwrap()
}

use crate::testkit::{ip, key, mac};

fn leased(addr: u8, client: u8, term: u64, cltt: u64) -> Binding {
    Binding {
        addr: ip(addr),
        state: LeaseState::Leased,
        owner: Some(key(client)),
        expires: cltt + 1000,
        cltt,
        version: 7,
        term,
        seq: 1,
        hw: mac(client).to_vec(),
        hostname: Some(format!("h{client}")),
    }
}

// ---- codec -----------------------------------------------------------------------------------

#[test]
fn every_message_survives_encoding() {
    let msgs = vec![
        Message::Hello {
            node: "a".into(),
            store_id: 42,
            catch_up: CatchUpRequest::Full,
            term: Some(3),
            config_digest: [7; 32],
        },
        Message::Hello {
            node: "b".into(),
            store_id: 1,
            catch_up: CatchUpRequest::Unsynced,
            term: None,
            config_digest: [0; 32],
        },
        Message::Updates {
            batch: 9,
            kind: UpdateKind::CatchUp,
            entries: vec![leased(10, 1, 2, 100), Binding::fresh(ip(11))],
        },
        Message::Acks {
            batch: 9,
            results: vec![
                EntryResult { addr: ip(10), version: 3, outcome: EntryOutcome::Applied },
                EntryResult { addr: ip(11), version: 4, outcome: EntryOutcome::Superseded(leased(11, 2, 5, 7)) },
                EntryResult { addr: ip(12), version: 5, outcome: EntryOutcome::Unknown },
            ],
        },
        Message::CatchUpDone { entries: 77 },
        Message::Digest { buckets: vec![Bucket { prefix: 0xc61200, count: 3, hash: 99 }] },
        Message::Heartbeat { sent_ms: 5 },
        Message::HeartbeatAck { echo_ms: 5 },
        Message::Vote(Vote::Ask { uuid: u128::MAX - 3, id: 7, term: 12, active: true }),
        Message::Vote(Vote::Answer { to: 5, id: 7, granted: false, term: 13 }),
        Message::Vote(Vote::Release { from: 1 << 100, up_to: 9 }),
    ];
    for m in msgs {
        assert_eq!(protocol::decode(&protocol::encode(&m)).unwrap(), m);
    }
}

#[test]
fn malformed_messages_are_errors() {
    let good =
        protocol::encode(&Message::Updates { batch: 1, kind: UpdateKind::Live, entries: vec![leased(10, 1, 2, 100)] });
    for cut in 0..good.len() {
        assert!(protocol::decode(&good[..cut]).is_err(), "truncated at {cut} decoded");
    }
    let mut long = good.clone();
    long.push(0);
    assert_eq!(protocol::decode(&long), Err(DecodeError::Trailing(1)));
    assert_eq!(protocol::decode(&[99]), Err(DecodeError::Tag(99)));
    // A count far beyond what the frame holds is refused before anything is allocated.
    let mut huge = vec![2u8];
    huge.extend_from_slice(&1u64.to_be_bytes());
    huge.push(0);
    huge.extend_from_slice(&4000u32.to_be_bytes());
    assert_eq!(protocol::decode(&huge), Err(DecodeError::Truncated));
}

proptest! {
    #[test]
    fn garbage_never_panics_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = protocol::decode(&bytes);
    }
}

// ---- frames ----------------------------------------------------------------------------------

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

fn hello(side: Side, node: &str) -> Hello {
    Hello { side, node: node.into(), nonce: frame::random_nonce() }
}

/// Both ends of one connection: box-a dialled box-b. Returns (a's sealer, b's opener, a's
/// opener, b's sealer).
fn connection(a: &Hello, b: &Hello) -> (Sealer, Opener, Opener, Sealer) {
    let (sa, oa) = frame::session(KEY, a, b).unwrap();
    let (sb, ob) = frame::session(KEY, b, a).unwrap();
    (sa, ob, oa, sb)
}

#[test]
fn frames_open_once_in_order_and_only_with_the_key() {
    let (a, b) = (hello(Side::Dialer, "box-a"), hello(Side::Acceptor, "box-b"));
    let (mut s, mut o, mut back, _) = connection(&a, &b);
    let f1 = s.seal(b"one");
    let f2 = s.seal(b"two");
    assert_eq!(o.open(&f1[4..]).unwrap(), b"one");
    assert_eq!(o.open(&f1[4..]), Err(FrameError::Sequence { got: 1, want: 2 }), "a replayed frame must fail");
    assert_eq!(o.open(&f2[4..]).unwrap(), b"two");

    let mut altered = s.seal(b"three");
    let n = altered.len();
    altered[n - 40] ^= 1;
    assert_eq!(o.open(&altered[4..]), Err(FrameError::BadTag));

    let (mut wrong, _) = frame::session(b"another key of enough length....", &a, &b).unwrap();
    assert_eq!(o.open(&wrong.seal(b"x")[4..]), Err(FrameError::BadTag));

    // A frame of this connection replayed on another one (other nonces) fails.
    let (_, mut o2, _, _) = connection(&hello(Side::Dialer, "box-a"), &hello(Side::Acceptor, "box-b"));
    assert_eq!(o2.open(&f1[4..]), Err(FrameError::BadTag));

    // A frame reflected back to its sender fails (the direction is in the tag).
    assert_eq!(back.open(&f1[4..]), Err(FrameError::BadTag));

    // The names are bound too: same nonces, another name on one end.
    let renamed = Hello { node: "box-c".into(), ..b.clone() };
    let (_, mut o3) = frame::session(KEY, &renamed, &a).unwrap();
    assert_eq!(o3.open(&f1[4..]), Err(FrameError::BadTag));
}

#[test]
fn handshake_needs_the_key_and_opposite_sides() {
    let a = hello(Side::Dialer, "box-a");
    let h = frame::seal_handshake(KEY, &a);
    assert_eq!(frame::open_handshake(KEY, &h[4..]).unwrap(), a);
    assert_eq!(frame::open_handshake(b"not the right key at all........", &h[4..]), Err(FrameError::BadTag));
    assert!(frame::open_handshake(KEY, b"short").is_err());
    // Two acceptors (an attacker relaying between both listeners) or two diallers get no session.
    let (x, y) = (hello(Side::Acceptor, "box-a"), hello(Side::Acceptor, "box-b"));
    assert_eq!(frame::session(KEY, &x, &y).err(), Some(FrameError::SameSide(Side::Acceptor)));
    let (x, y) = (hello(Side::Dialer, "box-a"), hello(Side::Dialer, "box-b"));
    assert_eq!(frame::session(KEY, &x, &y).err(), Some(FrameError::SameSide(Side::Dialer)));
}

// ---- the conflict rule -----------------------------------------------------------------------

fn merge_one(a: &mut Allocator, b: &Binding, kind: UpdateKind, now: u64) -> (EntryOutcome, Merged) {
    let mut m = Merged::default();
    let o = merge::merge(a, b, kind, now, &mut m);
    (o, m)
}

#[test]
fn address_held_by_two_clients_goes_to_the_higher_term_then_cltt() {
    // Primary-revived (seed 003): .12 leased to 'abc' under term 1 (never synced), the backup
    // leased it to '456' under term 2.
    let mut a = Allocator::new(&config());
    a.lease(ip(12), &key(1), &mac(1), None, 1000, 100);
    a.set_term(0);
    let theirs = leased(12, 2, 2, 90);
    let (o, m) = merge_one(&mut a, &theirs, UpdateKind::CatchUp, 150);
    assert_eq!(o, EntryOutcome::Applied);
    assert_eq!(m.conflicts.len(), 1);
    assert_eq!(m.conflicts[0].winner.owner, Some(key(2)));
    assert_eq!(m.conflicts[0].loser.owner, Some(key(1)));
    assert!(a.binding(ip(12)).unwrap().is_owned_by(&key(2)));
    assert!(a.is_synced(ip(12)), "the partner holds exactly what was installed");
    // The loser asking to renew is refused (DHCPNAK) and rediscovers.
    assert!(a.may_lease(ip(12), &key(1), &mac(1), None, 160).is_err());

    // Same term: the later client transaction wins; the earlier is answered with the winner.
    let mut b = Allocator::new(&config());
    b.set_term(4);
    b.lease(ip(13), &key(3), &mac(3), None, 1000, 200);
    let older = leased(13, 4, 4, 150);
    let (o, m) = merge_one(&mut b, &older, UpdateKind::CatchUp, 210);
    assert!(matches!(o, EntryOutcome::Superseded(ref w) if w.is_owned_by(&key(3))), "{o:?}");
    assert_eq!(m.conflicts.len(), 1);
}

#[test]
fn lower_term_is_fenced_even_for_a_synced_address() {
    let mut a = Allocator::new(&config());
    a.set_term(5);
    a.lease(ip(10), &key(1), &mac(1), None, 1000, 100);
    let v = a.binding(ip(10)).unwrap().version;
    assert!(a.mark_synced(ip(10), v));
    // A deposed active (term 3) renews the address later: rejected, whatever its cltt.
    let stale = leased(10, 1, 3, 500);
    let (o, m) = merge_one(&mut a, &stale, UpdateKind::Live, 501);
    assert!(matches!(o, EntryOutcome::Superseded(_)));
    assert!(m.fenced);
    assert_eq!(a.binding(ip(10)).unwrap().term, 5);
}

#[test]
fn a_successor_change_applies_even_without_a_newer_cltt() {
    // The partner's reaper expired a lease we hold synced: same term, same cltt.
    let mut a = Allocator::new(&config());
    a.set_term(2);
    a.lease(ip(10), &key(1), &mac(1), None, 1000, 100);
    let v = a.binding(ip(10)).unwrap().version;
    a.mark_synced(ip(10), v);
    let mut reaped = a.binding(ip(10)).unwrap().clone();
    reaped.state = LeaseState::Free;
    reaped.expires = 1200;
    let (o, _) = merge_one(&mut a, &reaped, UpdateKind::Live, 1101);
    assert_eq!(o, EntryOutcome::Applied);
    assert_eq!(a.binding(ip(10)).unwrap().state, LeaseState::Free);
}

#[test]
fn mark_synced_compares_the_version() {
    let mut a = Allocator::new(&config());
    a.lease(ip(10), &key(1), &mac(1), None, 1000, 100);
    let sent = a.binding(ip(10)).unwrap().version;
    // A renewal lands while the update for `sent` is in flight.
    a.lease(ip(10), &key(1), &mac(1), None, 1000, 101);
    let mut m = Merged::default();
    let resend = merge::settle(
        &mut a,
        vec![EntryResult { addr: ip(10), version: sent, outcome: EntryOutcome::Applied }],
        102,
        &mut m,
    );
    assert!(resend.is_empty());
    assert!(m.marks.is_empty(), "the renewal must stay unsynced");
    assert!(!a.is_synced(ip(10)));
    assert_eq!(a.unsynced_addrs(), vec![ip(10)]);
}

#[test]
fn client_with_two_addresses_keeps_the_higher_rank() {
    let mut a = Allocator::new(&config());
    a.set_term(1);
    a.lease(ip(10), &key(1), &mac(1), None, 1000, 100);
    let newer = leased(11, 1, 2, 90);
    let (o, m) = merge_one(&mut a, &newer, UpdateKind::CatchUp, 120);
    assert_eq!(o, EntryOutcome::Applied);
    assert_eq!(a.binding(ip(10)).unwrap().state, LeaseState::Free, "the other address returns to the queue");
    assert!(!a.is_synced(ip(10)), "the freed address is a change to send");
    assert!(m.conflicts.iter().any(|c| c.kind == crate::store::ConflictKind::Client));
    a.check_invariants(120).unwrap();

    // The other way round: the incoming binding loses, its address is freed instead.
    let mut b = Allocator::new(&config());
    b.set_term(3);
    b.lease(ip(10), &key(1), &mac(1), None, 1000, 100);
    let older = leased(11, 1, 2, 90);
    let (o, _) = merge_one(&mut b, &older, UpdateKind::CatchUp, 120);
    assert!(matches!(o, EntryOutcome::Superseded(ref f) if f.state == LeaseState::Free && f.addr == ip(11)), "{o:?}");
    assert!(b.binding(ip(10)).unwrap().is_owned_by(&key(1)));
    b.check_invariants(120).unwrap();
}

proptest! {
    /// Whatever order the versions of one address arrive in, the conflict rule keeps the same
    /// one: the highest rank.
    #[test]
    fn conflict_rule_is_order_independent(
        versions in proptest::collection::vec((0u64..3, 0u64..4, 1u8..4, prop_oneof![Just(LeaseState::Leased), Just(LeaseState::Free), Just(LeaseState::Declined)]), 1..6),
        seed in any::<u64>(),
    ) {
        let bindings: Vec<Binding> = versions.iter().map(|(term, cltt, client, state)| {
            let mut b = leased(20, *client, *term, *cltt * 10 + 1);
            b.state = *state;
            if *state == LeaseState::Declined { b.owner = None; }
            b
        }).collect();
        let best = bindings.iter().max_by(|a, b| merge::rank(a, b)).unwrap().clone();
        let mut order: Vec<usize> = (0..bindings.len()).collect();
        let mut x = seed | 1;
        for i in (1..order.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let mut a = Allocator::new(&config());
        for i in order {
            merge_one(&mut a, &bindings[i], UpdateKind::Repair, 1);
        }
        prop_assert!(merge::same_content(a.binding(ip(20)).unwrap(), &best));
    }
}

// ---- two simulated boxes ---------------------------------------------------------------------

struct SimNode {
    alloc: Allocator,
    m: SyncSession,
    /// Partner batches merged but not yet "durable": acknowledged when the test commits them.
    commits: VecDeque<(u64, u64, Vec<EntryResult>)>,
    readiness: Readiness,
}

struct Sim {
    nodes: [SimNode; 2],
    /// wire[i]: messages on their way to node i.
    wire: [VecDeque<Message>; 2],
    connected: bool,
    session: u64,
    now: Instant,
    unix: u64,
    conflicts: usize,
}

fn timing() -> Timing {
    Timing { page: 3, window: 2, ..Timing::new(Duration::from_millis(200)) }
}

impl Sim {
    fn new() -> Sim {
        let now = Instant::now();
        let node = |name: &str, id: u64| SimNode {
            alloc: Allocator::new(&config()),
            m: SyncSession::new(timing(), name.into(), id, None, now),
            commits: VecDeque::new(),
            readiness: Readiness::Waiting,
        };
        Sim {
            nodes: [node("a", 11), node("b", 22)],
            wire: [VecDeque::new(), VecDeque::new()],
            connected: false,
            session: 0,
            now,
            unix: 1000,
            conflicts: 0,
        }
    }

    fn act(&mut self, i: usize, actions: Vec<SyncAction>) {
        for a in actions {
            match a {
                SyncAction::Send(m) if self.connected => self.wire[1 - i].push_back(m),
                SyncAction::Close(_) => self.disconnect(),
                SyncAction::Apply { batch, kind, entries } => {
                    let mut merged = Merged::default();
                    let n = &mut self.nodes[i];
                    let results = merge::apply_batch(&mut n.alloc, &entries, kind, self.unix, &mut merged);
                    self.conflicts += merged.conflicts.len();
                    let session = n.m.session().unwrap();
                    n.commits.push_back((session, batch, results));
                    let resend: Vec<Ipv4Addr> = merged.transitions.iter().map(|t| t.new.addr).collect();
                    self.resend(i, resend);
                }
                SyncAction::Settle(results) => {
                    let mut merged = Merged::default();
                    let resend = merge::settle(&mut self.nodes[i].alloc, results, self.unix, &mut merged);
                    self.conflicts += merged.conflicts.len();
                    self.resend(i, resend);
                }
                SyncAction::ResetMarks { .. } => self.nodes[i].alloc.reset_marks(),
                SyncAction::Readiness(r) => self.nodes[i].readiness = r,
                _ => {}
            }
        }
    }

    fn resend(&mut self, i: usize, addrs: Vec<Ipv4Addr>) {
        let n = &mut self.nodes[i];
        let v: Vec<Binding> =
            addrs.into_iter().filter(|a| !n.alloc.is_synced(*a)).filter_map(|a| n.alloc.binding(a).cloned()).collect();
        let (_, acts) = n.m.local_changes(self.now, v, false);
        self.act(i, acts);
    }

    fn connect(&mut self) {
        if self.connected {
            return;
        }
        self.connected = true;
        self.session += 1;
        for i in 0..2 {
            let acts = self.nodes[i].m.link_up(self.now, self.session);
            self.act(i, acts);
        }
    }

    fn disconnect(&mut self) {
        if !self.connected {
            return;
        }
        self.connected = false;
        self.wire = [VecDeque::new(), VecDeque::new()];
        for i in 0..2 {
            self.nodes[i].commits.clear(); // never acknowledged: the partner resends
            let acts = self.nodes[i].m.link_down(self.now);
            self.act(i, acts);
        }
    }

    /// Delivers one message to node `i`; false if none was waiting.
    fn deliver(&mut self, i: usize) -> bool {
        let Some(m) = self.wire[i].pop_front() else { return false };
        let n = &mut self.nodes[i];
        let acts = n.m.receive(self.now, m, &n.alloc);
        self.act(i, acts);
        true
    }

    fn commit(&mut self, i: usize) -> bool {
        let Some((s, b, r)) = self.nodes[i].commits.pop_front() else { return false };
        let n = &mut self.nodes[i];
        let acts = n.m.applied(self.now, s, b, r, &n.alloc);
        self.act(i, acts);
        true
    }

    /// A client transaction on node `i` (acting as active under its allocator's term).
    fn client(&mut self, i: usize, client: u8, release: bool) {
        let unix = self.unix;
        let n = &mut self.nodes[i];
        let ts = if release {
            match n.alloc.current(0, &key(client)).map(|b| b.addr) {
                Some(addr) => n.alloc.release(addr, &key(client), unix).into_iter().collect(),
                None => vec![],
            }
        } else {
            match n.alloc.choose(0, &key(client), &mac(client), None, None, unix) {
                Choice::Offer { addr, .. }
                    if n.alloc.may_lease(addr, &key(client), &mac(client), None, unix).is_ok() =>
                {
                    n.alloc.lease(addr, &key(client), &mac(client), None, 1000, unix)
                }
                _ => vec![],
            }
        };
        let v = ts.into_iter().map(|t| t.new).collect();
        let (_, acts) = n.m.local_changes(self.now, v, false);
        self.act(i, acts);
    }

    fn quiesce(&mut self) {
        for _ in 0..100_000 {
            let busy = self.deliver(0) | self.deliver(1) | self.commit(0) | self.commit(1);
            if !busy {
                return;
            }
        }
        panic!("the two boxes never stopped talking");
    }

    fn assert_converged(&self) {
        let (a, b) = (&self.nodes[0].alloc, &self.nodes[1].alloc);
        for last in 10..=29 {
            let (x, y) = (a.binding(ip(last)).unwrap(), b.binding(ip(last)).unwrap());
            assert!(merge::same_content(x, y), "tables differ at {}:\n a: {x:?}\n b: {y:?}", ip(last));
            assert!(a.is_synced(ip(last)) && b.is_synced(ip(last)), "{} not marked synced on both boxes", ip(last));
        }
        a.check_invariants(self.unix).unwrap();
        b.check_invariants(self.unix).unwrap();
        assert_eq!(a.digest(), b.digest());
    }
}

#[test]
fn replay_after_disconnect_loses_nothing() {
    let mut s = Sim::new();
    s.nodes[0].alloc.set_term(1);
    s.connect();
    s.quiesce();
    assert_eq!(s.nodes[0].readiness, Readiness::CaughtUp);
    for c in 1..=4 {
        s.client(0, c, false);
    }
    // Half delivered, then the link drops with updates and acks in flight.
    s.deliver(1);
    s.commit(1);
    s.disconnect();
    for c in 5..=9 {
        s.client(0, c, false);
        s.unix += 1;
    }
    s.client(0, 2, true);
    s.connect();
    s.quiesce();
    s.assert_converged();
    let b = &s.nodes[1].alloc;
    for c in [1u8, 3, 4, 5, 6, 7, 8, 9] {
        assert!(
            b.current(0, &key(c)).is_some_and(|l| l.state == LeaseState::Leased),
            "client {c}'s lease missing on the standby"
        );
    }
    assert!(b.current(0, &key(2)).is_none(), "the release reached the standby");
}

#[test]
fn a_wiped_box_gets_the_full_table() {
    let mut s = Sim::new();
    s.nodes[0].alloc.set_term(1);
    s.connect();
    for c in 1..=7 {
        s.client(0, c, false);
    }
    s.quiesce();
    s.assert_converged();
    s.disconnect();
    // Box b comes back with an empty disk: a new store identity and no partner recorded.
    s.nodes[1] = SimNode {
        alloc: Allocator::new(&config()),
        m: SyncSession::new(timing(), "b".into(), 33, None, s.now),
        commits: VecDeque::new(),
        readiness: Readiness::Waiting,
    };
    s.connect();
    s.quiesce();
    s.assert_converged();
    assert_eq!(s.nodes[1].alloc.touched_addrs().len(), 7);
    assert_eq!(s.nodes[1].readiness, Readiness::CaughtUp);
}

#[test]
fn startup_reports_an_unreachable_partner_after_the_wait() {
    let now = Instant::now();
    let mut m = SyncSession::new(timing(), "a".into(), 1, Some(2), now);
    assert!(m.tick(now + Duration::from_secs(1)).is_empty());
    assert_eq!(m.tick(now + Duration::from_secs(6)), vec![SyncAction::Readiness(Readiness::PartnerUnreachable)]);
}

#[test]
fn held_acks_are_released_by_the_timeout_and_later_ones_do_not_wait() {
    let mut s = Sim::new();
    s.connect();
    s.quiesce();
    assert!(s.nodes[0].m.reachable());
    let b = leased(10, 1, 0, 5);
    let (held, _) = s.nodes[0].m.local_changes(s.now, vec![b.clone()], true);
    let batch = held.expect("held while the partner keeps up");
    // The partner never answers: after ack_timeout the ACK goes out and the partner is behind.
    let acts = s.nodes[0].m.tick(s.now + Duration::from_millis(250));
    assert!(acts.contains(&SyncAction::ReleaseGates(vec![batch])), "{acts:?}");
    assert!(acts.contains(&SyncAction::Reachable(false)), "{acts:?}");
    let (held, _) = s.nodes[0].m.local_changes(s.now, vec![b], true);
    assert_eq!(held, None, "an unreachable partner holds nothing");
    // No acknowledgement by the request deadline closes the link.
    let acts = s.nodes[0].m.tick(s.now + Duration::from_secs(6));
    assert!(acts.iter().any(|a| matches!(a, SyncAction::Close(_))), "{acts:?}");
}

#[test]
fn primary_revived_conflict_ends_with_the_same_table_on_both_boxes() {
    let mut s = Sim::new();
    s.nodes[0].alloc.set_term(1);
    s.connect();
    s.client(0, 1, false); // synced lease (seed: '123')
    s.quiesce();
    s.disconnect();
    s.client(0, 2, false); // primary leases to 'abc', update fails
    let abc = s.nodes[0].alloc.current(0, &key(2)).unwrap().addr;
    // Primary dies; backup takes over with term 2 and leases the same address to '456'.
    s.nodes[1].alloc.set_term(2);
    s.unix += 5;
    let t = s.nodes[1].alloc.lease(abc, &key(3), &mac(3), None, 1000, s.unix);
    let (_, acts) = s.nodes[1].m.local_changes(s.now, t.into_iter().map(|t| t.new).collect(), false);
    s.act(1, acts);
    s.connect();
    s.quiesce();
    s.assert_converged();
    for n in &s.nodes {
        assert!(n.alloc.binding(abc).unwrap().is_owned_by(&key(3)), "the term-2 lease wins");
        assert!(n.alloc.may_lease(abc, &key(2), &mac(2), None, s.unix).is_err(), "'abc' is NAKed at its renewal");
    }
    assert!(s.conflicts >= 2, "both boxes record the conflict (got {})", s.conflicts);
}

#[derive(Debug, Clone)]
enum Op {
    Client {
        node: usize,
        client: u8,
        release: bool,
    },
    Deliver(usize),
    Commit(usize),
    Disconnect,
    Connect,
    /// A new election term on one box (terms only grow, as the election hands them out).
    Term {
        node: usize,
        bump: u64,
    },
    Time(u64),
    Reap(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..2, 1u8..12, proptest::bool::weighted(0.2)).prop_map(|(node, client, release)| Op::Client { node, client, release }),
        4 => (0usize..2).prop_map(Op::Deliver),
        2 => (0usize..2).prop_map(Op::Commit),
        1 => Just(Op::Disconnect),
        2 => Just(Op::Connect),
        1 => (0usize..2, 1u64..3).prop_map(|(node, bump)| Op::Term { node, bump }),
        1 => (0u64..600).prop_map(Op::Time),
        1 => (0usize..2).prop_map(Op::Reap),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    /// Any mix of client changes on either box (both may act as active, as in a partition),
    /// deliveries in any interleaving, link cuts and term changes: once the link is up and
    /// quiet, both boxes hold the same table, every binding is synced, and no client holds
    /// two live addresses.
    #[test]
    fn both_boxes_converge_whatever_the_arrival_order(ops in proptest::collection::vec(op(), 1..60)) {
        let mut s = Sim::new();
        for o in ops {
            match o {
                Op::Client { node, client, release } => s.client(node, client, release),
                Op::Deliver(i) => { s.deliver(i); }
                Op::Commit(i) => { s.commit(i); }
                Op::Disconnect => s.disconnect(),
                Op::Connect => s.connect(),
                Op::Term { node, bump } => {
                    let t = s.nodes[node].alloc.term() + bump;
                    s.nodes[node].alloc.set_term(t);
                }
                Op::Time(d) => s.unix += d,
                Op::Reap(i) => {
                    let ts = s.nodes[i].alloc.reap(s.unix, 100);
                    let (_, acts) = s.nodes[i].m.local_changes(s.now, ts.into_iter().map(|t| t.new).collect(), false);
                    s.act(i, acts);
                }
            }
        }
        s.connect();
        s.quiesce();
        s.assert_converged();
    }
}

#[test]
fn table_trait_pages_in_address_order() {
    let mut a = Allocator::new(&config());
    a.lease(ip(15), &key(1), &mac(1), None, 1000, 1);
    a.lease(ip(11), &key(2), &mac(2), None, 1000, 1);
    assert_eq!(a.to_send(false), vec![ip(11), ip(15)]);
    assert_eq!(Table::bucket(&a, u32::from(ip(0)) >> 8).len(), 2);
}

// ---- configuration digest in Hello -----------------------------------------------------------

/// Each side's Hello carries its configuration digest; each side reports the partner's and
/// whether it equals its own.
fn partner_configs(a: [u8; 32], b: [u8; 32]) -> [Vec<([u8; 32], bool)>; 2] {
    let now = Instant::now();
    let alloc = Allocator::new(&config());
    let mut m =
        [SyncSession::new(timing(), "a".into(), 1, None, now), SyncSession::new(timing(), "b".into(), 2, None, now)];
    m[0].set_config_digest(a);
    m[1].set_config_digest(b);
    let hellos: Vec<Vec<Message>> = m
        .iter_mut()
        .map(|n| {
            n.link_up(now, 1)
                .into_iter()
                .filter_map(|a| match a {
                    SyncAction::Send(msg @ Message::Hello { .. }) => Some(msg),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let mut seen = [Vec::new(), Vec::new()];
    for i in 0..2 {
        for msg in &hellos[1 - i] {
            // Through the codec, as on the wire.
            let msg = protocol::decode(&protocol::encode(msg)).unwrap();
            for act in m[i].receive(now, msg, &alloc) {
                if let SyncAction::PartnerConfig { digest, same } = act {
                    seen[i].push((digest, same));
                }
            }
        }
    }
    seen
}

#[test]
fn hello_carries_the_config_digest_and_a_difference_is_reported() {
    let (x, y) = ([1u8; 32], [2u8; 32]);
    assert_eq!(partner_configs(x, x), [vec![(x, true)], vec![(x, true)]]);
    assert_eq!(partner_configs(x, y), [vec![(y, false)], vec![(x, false)]]);
}

#[test]
fn a_partner_on_another_protocol_version_is_named_in_the_error() {
    let mut hello = protocol::encode(&Message::Hello {
        node: "a".into(),
        store_id: 1,
        catch_up: CatchUpRequest::Full,
        term: None,
        config_digest: [0; 32],
    });
    hello[1..3].copy_from_slice(&1u16.to_be_bytes());
    let err = protocol::decode(&hello).unwrap_err();
    assert_eq!(err, DecodeError::Version(1));
    assert!(err.to_string().contains("version 1, this box 3"), "{err}");
}

// ---- a partner sending valid but absurd bindings ------------------------------------------------

#[test]
fn impossible_bindings_from_the_partner_are_refused_and_the_table_kept() {
    let mut a = Allocator::new(&config());
    a.set_term(3);
    a.lease(ip(10), &key(1), &mac(1), None, 1000, 100);
    let before: Vec<Binding> = (10..30).filter_map(|n| a.binding(ip(n)).cloned()).collect();
    let now = 200;
    let year_9999 = 253_402_300_799;
    let mut far = leased(11, 2, 3, 150);
    far.expires = year_9999;
    let mut ahead = leased(12, 3, 3, now + 2 * merge::MAX_CLTT_AHEAD_SECS);
    ahead.expires = ahead.cltt + 1000;
    let mut backwards = leased(13, 4, 3, 150);
    backwards.expires = 100;
    // An address outside every subnet.
    let outside = Binding { addr: Ipv4Addr::new(203, 0, 113, 9), ..leased(10, 5, 3, 150) };
    for bad in [&far, &ahead, &backwards, &outside] {
        let (o, m) = merge_one(&mut a, bad, UpdateKind::Live, now);
        assert_eq!(o, EntryOutcome::Unknown, "{bad:?}");
        assert_eq!(m.refused.len(), 1, "a reason for the log: {bad:?}");
        assert!(m.transitions.is_empty() && m.conflicts.is_empty());
    }
    let after: Vec<Binding> = (10..30).filter_map(|n| a.binding(ip(n)).cloned()).collect();
    assert_eq!(before, after, "nothing changed, the lease of .10 kept");
    // Still serving: the refused addresses are handed out as usual.
    assert!(a.may_lease(ip(11), &key(9), &mac(9), None, now).is_ok());
}

#[test]
fn a_lease_that_ended_in_1970_is_applied_as_the_ended_lease_it_is() {
    // Long over, but possible (a partner's clock at the epoch after a dead RTC): applied, not
    // live, so the reaper frees it and no conflict is recorded.
    let mut a = Allocator::new(&config());
    a.set_term(3);
    let old = Binding { expires: 1000, ..leased(14, 6, 3, 0) };
    let (o, m) = merge_one(&mut a, &old, UpdateKind::Live, 1_795_000_000);
    assert_eq!(o, EntryOutcome::Applied);
    assert!(m.refused.is_empty() && m.conflicts.is_empty());
    assert!(!a.binding(ip(14)).unwrap().is_live(1_795_000_000));
    let reaped = a.reap(1_795_000_000, 100);
    assert!(reaped.iter().any(|t| t.new.addr == ip(14) && t.new.state == LeaseState::Free), "{reaped:?}");
}
