//! An exhaustive explorer of the election: N nodes running the real [`Elector`] against a
//! simulated arbiter and, between nodes 0 and 1 (the pair), a simulated peer link carrying the
//! partner's promises — three voters. Every interleaving of message delivery, delay, loss and
//! duplication on both channels, node crashes and restarts (new uuid, keeping the promise its
//! predecessor recorded), arbiter link cuts, the whole arbiter going away and coming back, peer
//! link cuts, writes failing while reads succeed, and each node's clock running fast or slow by a
//! bounded rate. Property: at most one node is active at any real instant. Breadth-first, so a
//! violation comes with the shortest trace that produces it.
//!
//! Real time advances in whole units; every other action happens at an instant. Time may only
//! advance when nothing is due: no node timer has fired unhandled and no message has reached
//! the end of its delivery window. A node's role is judged by its own clock (`active_term` at
//! its local time), exactly as the DHCP path judges it, so a node whose clock runs slow really
//! does stay active longer in real time.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use super::machine::{Call, Effect, Elector, LeaseRule, PromiseAsk, Reply};
use super::{Beat, HolderRow, Params, Uuid};

const UTYPE: &str = "model/dhcp";

/// The bounds of one exploration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub nodes: usize,
    /// Real time per unit.
    pub unit: Duration,
    /// I and T, multiples of `unit`.
    pub params: Params,
    /// Explore up to this many units of real time.
    pub horizon: u32,
    /// Messages that may be lost / delayed (up to `max_delay` units instead of at once).
    pub losses: u8,
    pub delays: u8,
    /// Messages that may be delivered twice.
    pub dups: u8,
    pub max_delay: u32,
    pub crashes: u8,
    /// Times a node's link to the arbiter may be cut or restored.
    pub link_toggles: u8,
    /// Times the arbiter may start or stop failing writes (reads keep working).
    pub write_toggles: u8,
    /// Times the arbiter may become unreachable from every node, or come back.
    pub arbiter_toggles: u8,
    /// Times the peer link between nodes 0 and 1 may be cut or restored.
    pub peer_toggles: u8,
    /// Whether a pair has its peer link at all (off: the arbiter's lease alone, as in the seed).
    pub peer_link: bool,
    /// Clock-rate error of each node in parts per thousand: a node runs at 1 − d, 1, or 1 + d.
    pub drift_permille: u32,
    pub rule: LeaseRule,
    /// Give up (panic) beyond this many states, rather than eat the machine's memory.
    pub max_states: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Payload {
    Request {
        call: Call,
        uuid: u128,
        min_term: u64,
    },
    Response(ReplyKey),
    /// Peer link, to `node`: a promise request from process `uuid`.
    Ask {
        uuid: u128,
        id: u64,
        term: u64,
        active: bool,
    },
    /// Peer link, to `node` (process `generation` only): the answer to its request `id`.
    Answer {
        id: u64,
        granted: bool,
        term: u64,
    },
    /// Peer link, to `node`: process `from` no longer counts promises up to `up_to`.
    Release {
        from: u128,
        up_to: u64,
    },
}

impl Payload {
    fn on_peer_link(&self) -> bool {
        matches!(self, Payload::Ask { .. } | Payload::Answer { .. } | Payload::Release { .. })
    }
}

/// A reply in a hashable, ordered form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum ReplyKey {
    Row(Option<(u128, u64, bool)>),
    Applied(u64),
    NotApplied,
    Released(bool),
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Msg {
    /// Last instant it may be delivered at.
    latest: u32,
    node: usize,
    generation: u32,
    id: u64,
    payload: Payload,
    delayed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Node {
    machine: Option<Elector>,
    generation: u32,
    /// Local clock reading at real time `since` and its rate (permille of real time).
    base_local: u64,
    since: u32,
    rate: u32,
    cut: bool,
    /// The promise this box recorded for its next process (local nanoseconds).
    promised: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct World {
    now: u32,
    nodes: Vec<Node>,
    msgs: Vec<Msg>,
    /// (uuid, ts in real units, term)
    row: Option<(u128, u32, u64)>,
    writes_fail: bool,
    arbiter_down: bool,
    peer_cut: bool,
    losses: u8,
    delays: u8,
    dups: u8,
    crashes: u8,
    link_toggles: u8,
    write_toggles: u8,
    arbiter_toggles: u8,
    peer_toggles: u8,
}

/// A violation: the actions from the start that lead to two active nodes.
#[derive(Debug)]
pub(super) struct Counterexample {
    pub trace: Vec<String>,
}

#[derive(Debug)]
pub(super) struct Report {
    pub states: usize,
    pub violation: Option<Counterexample>,
}

struct Explorer {
    b: Bounds,
}

impl Explorer {
    fn local(&self, n: &Node, now: u32) -> Duration {
        let real_ns = u64::from(now - n.since) * self.b.unit.as_nanos() as u64;
        Duration::from_nanos(n.base_local + real_ns * u64::from(n.rate) / 1000)
    }

    fn uuid(node: usize, generation: u32) -> u128 {
        ((node as u128 + 1) << 32) | u128::from(generation)
    }

    fn rates(&self) -> Vec<u32> {
        let d = self.b.drift_permille;
        // The extremes: a node whose clock is as slow, or as fast, as the bound allows.
        if d == 0 { vec![1000] } else { vec![1000 - d, 1000 + d] }
    }

    fn start_node(&self, w: &mut World, i: usize, rate: u32) {
        let n = &mut w.nodes[i];
        n.generation += 1;
        // The local clock is continuous across restarts (it is the host's clock).
        let local =
            if n.machine.is_none() && n.generation == 1 { Duration::from_secs(1) } else { self.local(n, w.now) };
        n.base_local = local.as_nanos() as u64;
        n.since = w.now;
        n.rate = rate;
        let promised = n.promised.map(Duration::from_nanos);
        n.machine = Some(
            Elector::with_rule(self.b.params, Uuid::from_u128(Self::uuid(i, n.generation)), UTYPE, local, self.b.rule)
                .with_promise(promised),
        );
    }

    fn initial(&self) -> Vec<World> {
        let mut out = vec![World {
            now: 0,
            nodes: (0..self.b.nodes)
                .map(|_| Node {
                    machine: None,
                    generation: 0,
                    base_local: 0,
                    since: 0,
                    rate: 1000,
                    cut: false,
                    promised: None,
                })
                .collect(),
            msgs: Vec::new(),
            row: None,
            writes_fail: false,
            arbiter_down: false,
            peer_cut: false,
            losses: self.b.losses,
            delays: self.b.delays,
            dups: self.b.dups,
            crashes: self.b.crashes,
            link_toggles: self.b.link_toggles,
            write_toggles: self.b.write_toggles,
            arbiter_toggles: self.b.arbiter_toggles,
            peer_toggles: self.b.peer_toggles,
        }];
        for i in 0..self.b.nodes {
            let mut next = Vec::new();
            for w in &out {
                for r in self.rates() {
                    let mut w = w.clone();
                    self.start_node(&mut w, i, r);
                    next.push(w);
                }
            }
            out = next;
        }
        out
    }

    /// The partner of node `i` on the peer link. Only a pair has one: with three or more
    /// contenders for one row the explorer checks the arbiter's lease alone (two boxes that
    /// vote for each other are a pair by definition; a third box of the same utype is a
    /// configuration error the three-voter rule does not cover).
    fn partner(&self, i: usize) -> Option<usize> {
        (self.b.peer_link && self.b.nodes == 2).then(|| 1 - i)
    }

    fn apply_effects(&self, w: &mut World, i: usize, effects: Vec<Effect>) {
        for e in effects {
            let n = &w.nodes[i];
            let uuid = Self::uuid(i, n.generation);
            let (to, generation, id, payload) = match e {
                Effect::Send { id, call, .. } => {
                    if n.cut || w.arbiter_down {
                        continue;
                    }
                    let min_term = n.machine.as_ref().expect("alive").heartbeat_term();
                    (i, n.generation, id, Payload::Request { call, uuid, min_term })
                }
                Effect::AskPartner(a) => {
                    let Some(p) = self.partner(i) else { continue };
                    (p, 0, 0, Payload::Ask { uuid, id: a.id, term: a.term, active: a.active })
                }
                Effect::AnswerPartner { to, id, granted, term, promised_until } => {
                    // Recorded before it is sent, where the next process finds it.
                    if let Some(until) = promised_until {
                        w.nodes[i].promised = Some(until.as_nanos() as u64);
                    }
                    let Some(p) = self.partner(i) else { continue };
                    // Only the process that asked can take the answer.
                    let to_gen = (to.as_u128() & 0xffff_ffff) as u32;
                    if (to.as_u128() >> 32) as usize != p + 1 {
                        continue;
                    }
                    (p, to_gen, 0, Payload::Answer { id, granted, term })
                }
                Effect::ReleasePartner { up_to } => {
                    let Some(p) = self.partner(i) else { continue };
                    (p, 0, 0, Payload::Release { from: uuid, up_to })
                }
                Effect::Active { .. } | Effect::Demoted(_) | Effect::Halt(_) => continue,
            };
            if payload.on_peer_link() && w.peer_cut {
                continue;
            }
            w.msgs.push(Msg { latest: w.now, node: to, generation, id, payload, delayed: false });
        }
        w.msgs.sort();
    }

    /// The arbiter executes a request at real time `now`.
    fn arbiter(&self, w: &mut World, call: Call, uuid: u128, min_term: u64) -> ReplyKey {
        let t_units = (self.b.params.timeout.as_nanos() / self.b.unit.as_nanos()) as u32;
        let live = |ts: u32| w.now - ts <= t_units;
        match call {
            Call::Read => ReplyKey::Row(w.row.map(|(u, ts, term)| (u, term, live(ts)))),
            Call::Heartbeat if w.writes_fail => ReplyKey::Failed,
            Call::Heartbeat => match w.row {
                None => {
                    w.row = Some((uuid, w.now, min_term.max(1)));
                    ReplyKey::Applied(min_term.max(1))
                }
                Some((u, ts, term)) if u == uuid && live(ts) => {
                    w.row = Some((uuid, w.now, term.max(min_term)));
                    ReplyKey::Applied(term.max(min_term))
                }
                Some((_, ts, term)) if !live(ts) => {
                    w.row = Some((uuid, w.now, (term + 1).max(min_term)));
                    ReplyKey::Applied((term + 1).max(min_term))
                }
                Some(_) => ReplyKey::NotApplied,
            },
            Call::Release if w.writes_fail => ReplyKey::Failed,
            Call::Release => match w.row {
                Some((u, _, term)) if u == uuid => {
                    // Expired: older than any live timestamp can be.
                    w.row = Some((u, w.now.saturating_sub(t_units + 1), term));
                    ReplyKey::Released(true)
                }
                _ => ReplyKey::Released(false),
            },
        }
    }

    fn reply(&self, k: &ReplyKey) -> Reply {
        match k {
            ReplyKey::Row(None) => Reply::Read(None),
            ReplyKey::Row(Some((u, term, live))) => Reply::Read(Some(HolderRow {
                utype: UTYPE.into(),
                uuid: Uuid::from_u128(*u),
                name: String::new(),
                endpoint: String::new(),
                term: *term,
                timeout_ms: self.b.params.timeout.as_millis() as u64,
                ts_us: 0,
                age_ms: 0,
                live: *live,
            })),
            ReplyKey::Applied(term) => Reply::Beat(Beat::Applied { ts_us: 0, term: *term }),
            ReplyKey::NotApplied => Reply::Beat(Beat::NotApplied),
            ReplyKey::Released(held) => Reply::Released(*held),
            ReplyKey::Failed => Reply::Failed("writes fail".into()),
        }
    }

    fn active_count(&self, w: &World) -> usize {
        w.nodes
            .iter()
            .filter(|n| n.machine.as_ref().is_some_and(|m| m.active_term(self.local(n, w.now)).is_some()))
            .count()
    }

    /// One message arrives: at the arbiter, or at a node from the arbiter or the peer link.
    fn deliver(&self, w: &mut World, msg: Msg) {
        let i = msg.node;
        let n = &w.nodes[i];
        let local = self.local(n, w.now);
        let alive = n.machine.is_some();
        let fx = match msg.payload {
            Payload::Request { call, uuid, min_term } => {
                let r = self.arbiter(w, call, uuid, min_term);
                if !w.nodes[i].cut && !w.arbiter_down {
                    let (generation, id) = (msg.generation, msg.id);
                    let payload = Payload::Response(r);
                    w.msgs.push(Msg { latest: w.now, node: i, generation, id, payload, delayed: false });
                }
                return;
            }
            Payload::Response(r) if alive && n.generation == msg.generation && !n.cut => {
                w.nodes[i].machine.as_mut().expect("alive").on_reply(local, msg.id, self.reply(&r))
            }
            Payload::Ask { uuid, id, term, active } if alive => {
                let ask = PromiseAsk { uuid: Uuid::from_u128(uuid), id, term, active };
                w.nodes[i].machine.as_mut().expect("alive").on_partner_ask(local, ask)
            }
            Payload::Answer { id, granted, term } if alive && n.generation == msg.generation => {
                w.nodes[i].machine.as_mut().expect("alive").on_partner_answer(local, id, granted, term)
            }
            Payload::Release { from, up_to } if alive => {
                w.nodes[i].machine.as_mut().expect("alive").on_partner_release(Uuid::from_u128(from), up_to);
                return;
            }
            _ => return,
        };
        self.apply_effects(w, i, fx);
    }

    /// Every successor of `w`, each with a label for traces.
    #[expect(clippy::too_many_lines, reason = "one block per kind of event the explorer injects, in one place")]
    fn successors(&self, w: &World) -> Vec<(String, World)> {
        let mut out = Vec::new();
        // Node timers.
        for i in 0..w.nodes.len() {
            let n = &w.nodes[i];
            let Some(m) = &n.machine else { continue };
            let local = self.local(n, w.now);
            if local >= m.wake_at() {
                let mut w2 = w.clone();
                let fx = w2.nodes[i].machine.as_mut().expect("alive").poll(local);
                self.apply_effects(&mut w2, i, fx);
                out.push((format!("t={} node {i} timer", w.now), w2));
            }
        }
        // Messages: deliver, lose, delay.
        for (k, msg) in w.msgs.iter().enumerate() {
            if k > 0 && w.msgs[k - 1] == *msg {
                continue;
            }
            let mut w2 = w.clone();
            let msg = w2.msgs.remove(k);
            let label = format!("t={} deliver {:?} node {}", w.now, msg.payload, msg.node);
            self.deliver(&mut w2, msg.clone());
            w2.msgs.sort();
            out.push((label, w2));
            if w.losses > 0 {
                let mut w3 = w.clone();
                w3.msgs.remove(k);
                w3.losses -= 1;
                out.push((format!("t={} lose {:?} node {}", w.now, msg.payload, msg.node), w3));
            }
            if w.dups > 0 {
                let mut w3 = w.clone();
                w3.msgs.push(msg.clone());
                w3.dups -= 1;
                w3.msgs.sort();
                out.push((format!("t={} duplicate {:?} node {}", w.now, msg.payload, msg.node), w3));
            }
            if w.delays > 0 && !msg.delayed {
                let mut w3 = w.clone();
                w3.msgs[k].latest = w.now + self.b.max_delay;
                w3.msgs[k].delayed = true;
                w3.delays -= 1;
                w3.msgs.sort();
                out.push((format!("t={} delay {:?} node {}", w.now, msg.payload, msg.node), w3));
            }
        }
        // Faults strike between instants, when nothing is due: a fault "during" an instant is
        // the same as one just before or after it, combined with a lost or delayed message.
        let due = w.msgs.iter().any(|m| m.latest <= w.now)
            || w.nodes.iter().any(|n| n.machine.as_ref().is_some_and(|m| self.local(n, w.now) >= m.wake_at()));
        if due {
            return out;
        }
        for i in 0..w.nodes.len() {
            if w.crashes > 0 && w.nodes[i].machine.is_some() {
                let mut w2 = w.clone();
                let n = &mut w2.nodes[i];
                let local = self.local(n, w.now);
                n.base_local = local.as_nanos() as u64;
                n.since = w.now;
                n.machine = None;
                w2.crashes -= 1;
                out.push((format!("t={} crash node {i}", w.now), w2));
            }
            if w.nodes[i].machine.is_none() {
                for r in self.rates() {
                    let mut w2 = w.clone();
                    self.start_node(&mut w2, i, r);
                    out.push((format!("t={} restart node {i} (rate {r}‰) with a new uuid", w.now), w2));
                }
            }
            if w.link_toggles > 0 {
                let mut w2 = w.clone();
                w2.nodes[i].cut = !w2.nodes[i].cut;
                w2.link_toggles -= 1;
                if w2.nodes[i].cut {
                    w2.msgs.retain(|m| m.node != i || m.payload.on_peer_link());
                }
                out.push((
                    format!("t={} node {i} link {}", w.now, if w2.nodes[i].cut { "cut" } else { "restored" }),
                    w2,
                ));
            }
        }
        if w.arbiter_toggles > 0 {
            let mut w2 = w.clone();
            w2.arbiter_down = !w2.arbiter_down;
            w2.arbiter_toggles -= 1;
            if w2.arbiter_down {
                w2.msgs.retain(|m| m.payload.on_peer_link());
            }
            let what = if w2.arbiter_down { "unreachable from every node" } else { "reachable again" };
            out.push((format!("t={} arbiter {what}", w.now), w2));
        }
        if w.peer_toggles > 0 {
            let mut w2 = w.clone();
            w2.peer_cut = !w2.peer_cut;
            w2.peer_toggles -= 1;
            if w2.peer_cut {
                w2.msgs.retain(|m| !m.payload.on_peer_link());
            }
            out.push((format!("t={} peer link {}", w.now, if w2.peer_cut { "cut" } else { "restored" }), w2));
        }
        if w.write_toggles > 0 {
            let mut w2 = w.clone();
            w2.writes_fail = !w2.writes_fail;
            w2.write_toggles -= 1;
            out.push((
                format!("t={} arbiter writes {}", w.now, if w2.writes_fail { "start failing" } else { "work again" }),
                w2,
            ));
        }
        // Time, when nothing is due.
        if w.now < self.b.horizon {
            let mut w2 = w.clone();
            w2.now += 1;
            out.push((format!("t={} time passes", w2.now), w2));
        }
        out
    }
}

/// A 128-bit fingerprint of a state. The explorer keeps fingerprints, not states: a state
/// costs ~1.6 kB, its fingerprint 16 bytes, which is what lets the pair's deep bounds run in a
/// few GB. Two different states sharing one (which would hide the second) has a probability
/// of about n² / 2¹²⁹, some 10⁻²³ at 10 million states.
fn fingerprint(w: &World) -> u128 {
    // Two SipHash runs with fixed keys (the same on every run, so counts repeat), the second
    // salted so the halves are independent.
    let mut low = std::hash::DefaultHasher::new();
    w.hash(&mut low);
    let mut high = std::hash::DefaultHasher::new();
    0x5eed_u16.hash(&mut high);
    w.hash(&mut high);
    (u128::from(high.finish()) << 64) | u128::from(low.finish())
}

/// Explores every behaviour within `b`; stops at the first violation.
pub(super) fn check(b: Bounds) -> Report {
    let ex = Explorer { b };
    let mut seen: HashSet<u128> = HashSet::new();
    let mut parent: Vec<(usize, String)> = Vec::new();
    let mut queue: VecDeque<(usize, World)> = VecDeque::new();
    for w in ex.initial() {
        let rates: Vec<u32> = w.nodes.iter().map(|n| n.rate).collect();
        let idx = parent.len();
        parent.push((usize::MAX, format!("start, clock rates {rates:?}‰")));
        seen.insert(fingerprint(&w));
        queue.push_back((idx, w));
    }
    while let Some((idx, w)) = queue.pop_front() {
        for (label, next) in ex.successors(&w) {
            if !seen.insert(fingerprint(&next)) {
                continue;
            }
            let nidx = parent.len();
            parent.push((idx, label));
            if ex.active_count(&next) > 1 {
                let mut trace = Vec::new();
                let mut at = nidx;
                while at != usize::MAX {
                    trace.push(parent[at].1.clone());
                    at = parent[at].0;
                }
                trace.reverse();
                return Report { states: seen.len(), violation: Some(Counterexample { trace }) };
            }
            queue.push_back((nidx, next));
            assert!(seen.len() <= ex.b.max_states, "more than {} states: tighten the bounds", ex.b.max_states);
        }
    }
    Report { states: seen.len(), violation: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// I = 1 s, T = 3 s in 500 ms units, clocks 10 % slow or fast, no faults: each scenario
    /// below adds its own.
    fn base(rule: LeaseRule) -> Bounds {
        Bounds {
            nodes: 2,
            unit: Duration::from_millis(500),
            params: Params { interval: Duration::from_secs(1), timeout: Duration::from_secs(3) },
            horizon: 14,
            losses: 0,
            delays: 0,
            dups: 0,
            max_delay: 3,
            crashes: 0,
            link_toggles: 0,
            write_toggles: 0,
            arbiter_toggles: 0,
            peer_toggles: 0,
            peer_link: true,
            drift_permille: 100,
            rule,
            max_states: 4_000_000,
        }
    }

    /// The pair's checks in `make test`: 5 s of real time (the deep runs add faults, not time).
    fn pair() -> Bounds {
        Bounds { horizon: 10, ..base(LeaseRule::ConfirmedHeartbeat) }
    }

    /// Explores `b` and prints its states and time; a violation comes back as its trace.
    fn explore(name: &str, b: Bounds) -> (usize, Option<String>) {
        let started = std::time::Instant::now();
        let r = check(b);
        let took = started.elapsed();
        let Some(cx) = r.violation else {
            eprintln!("{name}: {} states in {took:.1?}, at most one active", r.states);
            return (r.states, None);
        };
        let found =
            format!("{name}: two active nodes after {} states in {took:.1?}:\n  {}", r.states, cx.trace.join("\n  "));
        eprintln!("{found}");
        (r.states, Some(found))
    }

    fn holds(name: &str, b: Bounds) -> usize {
        let (states, violation) = explore(name, b);
        if let Some(found) = violation {
            panic!("{found}");
        }
        states
    }

    /// The seed's rule: writes fail while reads still succeed, then the active's link goes.
    #[test]
    fn the_seeds_rule_lets_two_nodes_be_active() {
        let r =
            // The seed had no peer link: its bug is in the arbiter's lease alone.
            check(Bounds {
                write_toggles: 2,
                link_toggles: 1,
                drift_permille: 0,
                peer_link: false,
                ..base(LeaseRule::SeedReadSendTime)
            });
        let cx = r.violation.expect("the checker must find the seed's dual-primary window");
        eprintln!("seed rule: two active after {} states:\n  {}", r.states, cx.trace.join("\n  "));
        assert!(cx.trace.iter().any(|s| s.contains("writes start failing")), "{:?}", cx.trace);
    }

    #[test]
    fn ours_holds_when_writes_fail_while_reads_succeed_and_links_break() {
        assert!(
            holds(
                "writes fail + link cut",
                Bounds { write_toggles: 2, link_toggles: 1, ..base(LeaseRule::ConfirmedHeartbeat) }
            ) > 1000
        );
    }

    #[test]
    fn ours_holds_with_message_loss_and_delay() {
        assert!(holds("loss + delay", Bounds { losses: 1, delays: 1, ..base(LeaseRule::ConfirmedHeartbeat) }) > 1000);
    }

    #[test]
    fn ours_holds_with_crash_and_restart_under_a_new_uuid() {
        assert!(holds("crash + restart", Bounds { crashes: 1, ..base(LeaseRule::ConfirmedHeartbeat) }) > 1000);
    }

    /// The arbiter's lease alone (no peer link: the protocol the seed had, and a box's without
    /// a partner) at 7 s of real time.
    fn arbiter_only() -> Bounds {
        Bounds { peer_link: false, ..base(LeaseRule::ConfirmedHeartbeat) }
    }

    /// The pair with its peer link, at the 5 s of `pair()` but with more faults. The peer link's
    /// messages multiply the states (the largest case below has 27.5 million); the explorer
    /// keeps fingerprints, so memory goes to the frontier of states still to expand (~5 GB).
    fn deep_pair() -> Bounds {
        Bounds { max_states: 40_000_000, ..pair() }
    }

    /// Deeper bounds (minutes, up to ~8 GB; figures in the README): `make model-check`. Every
    /// case runs, one after the other, and every violation is reported, not just the first.
    #[test]
    #[ignore = "slow; run with `make model-check`"]
    fn deep_ours_holds_with_more_faults() {
        let cases = [
            ("deep: 2 losses + 2 delays", Bounds { losses: 2, delays: 2, ..arbiter_only() }),
            ("deep: crash + delay", Bounds { crashes: 1, delays: 1, ..arbiter_only() }),
            ("deep: writes + link + loss", Bounds { write_toggles: 2, link_toggles: 2, losses: 1, ..arbiter_only() }),
            ("deep: three nodes, crash", Bounds { nodes: 3, horizon: 12, crashes: 1, ..arbiter_only() }),
            (
                "deep: three nodes, loss + delay",
                Bounds { nodes: 3, horizon: 10, losses: 1, delays: 1, ..arbiter_only() },
            ),
            // A loss and a duplicate together pass 5 million states (8 GB) here: one each.
            (
                "deep: pair, arbiter x2 + peer x2 + loss",
                Bounds { arbiter_toggles: 2, peer_toggles: 2, losses: 1, ..deep_pair() },
            ),
            (
                "deep: pair, arbiter x2 + peer x2 + dup",
                Bounds { arbiter_toggles: 2, peer_toggles: 2, dups: 1, ..deep_pair() },
            ),
            (
                "deep: pair, arbiter x2 + crash + delay",
                Bounds { arbiter_toggles: 2, crashes: 1, delays: 1, ..deep_pair() },
            ),
            (
                "deep: pair, link + writes + peer + loss",
                Bounds { link_toggles: 1, write_toggles: 2, peer_toggles: 1, losses: 1, ..deep_pair() },
            ),
        ];
        let violations: Vec<String> = cases.into_iter().filter_map(|(name, b)| explore(name, b).1).collect();
        assert!(violations.is_empty(), "{}", violations.join("\n"));
    }

    /// The pair's branch WAN fails and returns: the arbiter goes away from both boxes and comes
    /// back, the peer link breaks once, and a message is lost.
    #[test]
    fn the_pair_holds_when_the_arbiter_goes_and_returns_and_the_peer_link_breaks() {
        let b = Bounds { arbiter_toggles: 2, peer_toggles: 1, losses: 1, ..pair() };
        assert!(holds("arbiter away and back + peer cut + loss", b) > 1000);
    }

    #[test]
    fn the_pair_holds_with_duplicated_and_delayed_messages_on_both_channels() {
        let b = Bounds { arbiter_toggles: 1, dups: 1, delays: 1, ..pair() };
        assert!(holds("arbiter away + duplicate + delay", b) > 1000);
    }

    /// A box that promised its vote crashes and restarts with a new uuid while the arbiter is
    /// away: the new process keeps the promise its predecessor recorded.
    #[test]
    fn the_pair_holds_when_a_box_restarts_under_a_new_uuid_while_bound_by_its_promise() {
        let b = Bounds { arbiter_toggles: 1, crashes: 1, ..pair() };
        assert!(holds("arbiter away + crash + restart", b) > 1000);
    }

    /// Counting a promise from the time its answer arrives lets a slow answer outlive the
    /// promise that backs it; the checker finds the overlap (and the real rule holds under the
    /// very same bounds).
    #[test]
    fn counting_a_promise_from_its_receive_time_is_caught() {
        // A slow asker gets a grant late in its I from a fast partner, then the peer link goes,
        // and the partner (free at the end of its promise) takes the arbiter row.
        let b = Bounds {
            link_toggles: 1,
            peer_toggles: 1,
            delays: 1,
            drift_permille: 150,
            rule: LeaseRule::PromiseFromReceiveTime,
            ..pair()
        };
        let r = check(b);
        let cx = r.violation.expect("the checker must find the receive-time promise overlap");
        eprintln!("receive-time promise: two active after {} states:\n  {}", r.states, cx.trace.join("\n  "));
        assert!(cx.trace.iter().any(|s| s.contains("Answer")), "{:?}", cx.trace);
        holds("the same bounds, send-time rule", Bounds { rule: LeaseRule::ConfirmedHeartbeat, ..b });
    }

    #[test]
    fn ours_holds_with_three_nodes() {
        assert!(
            holds("three nodes", Bounds { nodes: 3, horizon: 12, losses: 1, ..base(LeaseRule::ConfirmedHeartbeat) })
                > 1000
        );
    }

    /// The margin is I: a clock so slow that T − I of its seconds outlast T real ones breaks the
    /// rule, and the checker says so (the bound in the tests above is well inside the margin).
    #[test]
    fn drift_beyond_the_margin_is_caught() {
        let r = check(Bounds { drift_permille: 500, write_toggles: 2, ..base(LeaseRule::ConfirmedHeartbeat) });
        let cx = r.violation.expect("a clock at half speed turns a 2 s lease into 4 s real: must overlap");
        eprintln!("drift 50 %: two active after {} states:\n  {}", r.states, cx.trace.join("\n  "));
    }
}
