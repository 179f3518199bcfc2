//! The sync protocol as a state machine without I/O: the driver feeds it the monotonic time and
//! what happened (link up/down, a message, a commit finished, a tick) and carries out the
//! actions it returns (send, close, apply, settle, release held ACKs, report readiness).
//!
//! Per session (one authenticated connection):
//! 1. both sides send Hello with their store identity and what they want sent (full table for
//!    a new or wiped store); a side that sees a partner store it has no marks for forgets its
//!    marks and sends everything;
//! 2. both sides page their unsynced bindings to each other (`page` entries per Updates,
//!    `window` pages in flight), then CatchUpDone; live updates flow meanwhile;
//! 3. once both directions are complete, each side sends a digest (per /24) and answers a
//!    differing /24 by sending its content there (merged by the conflict rule alone).
//!
//! Every request has a deadline (`request_timeout`): a batch not acknowledged in time closes
//! the link, and catch-up starts again on the next one. A live batch that holds DHCPACKs
//! (before-ack mode) releases them after `ack_timeout` and marks the partner lagging, so later
//! ACKs do not wait until the partner keeps up again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::protocol::{Bucket, CatchUpRequest, EntryResult, MAX_ENTRIES, Message, UpdateKind};
use crate::lease::Binding;

#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub heartbeat: Duration,
    /// Nothing heard for this long: the link is dead.
    pub dead_after: Duration,
    /// Deadline for the acknowledgement of any batch.
    pub request_timeout: Duration,
    /// How long a held DHCPACK waits for the partner (before-ack mode).
    pub ack_timeout: Duration,
    pub page: usize,
    pub window: usize,
    /// A starting node reports the partner unreachable if no session is up by then.
    pub startup_wait: Duration,
}

impl Timing {
    pub fn new(ack_timeout: Duration) -> Timing {
        Timing {
            heartbeat: Duration::from_millis(500),
            dead_after: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
            ack_timeout,
            page: 1024,
            window: 4,
            startup_wait: Duration::from_secs(5),
        }
    }
}

/// Whether a starting node may enter the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Neither caught up nor sure the partner is unreachable yet.
    Waiting,
    /// Both directions of a catch-up completed at least once since start.
    CaughtUp,
    /// No session with the partner within the startup wait.
    PartnerUnreachable,
}

/// What the machine reads from the local lease table.
pub trait Table {
    fn binding(&self, addr: Ipv4Addr) -> Option<Binding>;
    /// Addresses to send in a catch-up: every touched one (`full`) or the unsynced ones.
    fn to_send(&self, full: bool) -> Vec<Ipv4Addr>;
    fn digest(&self) -> Vec<Bucket>;
    /// Every touched binding in the /24 `prefix` (address >> 8).
    fn bucket(&self, prefix: u32) -> Vec<Binding>;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncAction {
    Send(Message),
    /// Close the connection (the link dials again).
    Close(String),
    /// Merge these bindings from the partner, make the result durable, then call
    /// [`SyncSession::applied`] with the per-entry results.
    Apply {
        batch: u64,
        kind: UpdateKind,
        entries: Vec<Binding>,
    },
    /// The partner's results for one of our batches: mark Applied entries synced (version
    /// compare), merge Superseded contents.
    Settle(Vec<EntryResult>),
    /// The partner's store is one our marks do not refer to: forget every mark, remember it.
    ResetMarks {
        partner_store: u64,
    },
    /// Release DHCPACKs held for these batches.
    ReleaseGates(Vec<u64>),
    Readiness(Readiness),
    /// Whether before-ack ACKs wait for the partner now.
    Reachable(bool),
    Rtt(Duration),
    /// Catch-up finished in both directions (entries we sent, entries we received).
    CaughtUp {
        sent: u64,
        received: u64,
    },
    /// The digests differed in these /24s; their content was sent for repair.
    DigestRepair(Vec<u32>),
    /// The partner's configuration digest, from its Hello, and whether it equals ours.
    PartnerConfig {
        digest: [u8; 32],
        same: bool,
    },
}

#[derive(Debug)]
struct Pending {
    ack_deadline: Instant,
    deadline: Instant,
    gated: bool,
    catch_up: bool,
}

#[derive(Debug, Default)]
struct OutCatchUp {
    list: Vec<Ipv4Addr>,
    next: usize,
    inflight: BTreeSet<u64>,
    sent: u64,
    done_sent: bool,
}

impl OutCatchUp {
    fn complete(&self) -> bool {
        self.done_sent && self.inflight.is_empty()
    }
}

#[derive(Debug)]
struct Exchange {
    id: u64,
    last_heard: Instant,
    next_heartbeat: Instant,
    /// Set once the partner's Hello arrived.
    partner: Option<(String, u64)>,
    out: Option<OutCatchUp>,
    in_done: Option<u64>,
    in_received: u64,
    applies_outstanding: usize,
    in_complete: bool,
    digest_sent: bool,
}

pub struct SyncSession {
    t: Timing,
    node: String,
    store_id: u64,
    /// This box's configuration digest, sent in Hello.
    config_digest: [u8; 32],
    /// The partner store our marks refer to.
    partner_store: Option<u64>,
    term: Option<u64>,
    origin: Instant,
    readiness: Readiness,
    session: Option<Exchange>,
    next_batch: u64,
    pending: BTreeMap<u64, Pending>,
    reachable: bool,
    /// Set when a held ACK timed out; cleared by a timely ack of a batch sent after it.
    lagging_from: Option<u64>,
}

impl SyncSession {
    pub fn new(t: Timing, node: String, store_id: u64, partner_store: Option<u64>, now: Instant) -> SyncSession {
        SyncSession {
            t,
            node,
            store_id,
            config_digest: [0; 32],
            partner_store,
            term: None,
            origin: now,
            readiness: Readiness::Waiting,
            session: None,
            next_batch: 1,
            pending: BTreeMap::new(),
            reachable: false,
            lagging_from: None,
        }
    }

    /// Sets the configuration digest sent in Hello (see [`crate::config::ConfigDigest`]).
    pub fn set_config_digest(&mut self, digest: [u8; 32]) {
        self.config_digest = digest;
    }

    pub fn readiness(&self) -> Readiness {
        self.readiness
    }

    /// Whether a before-ack DHCPACK should wait for the partner now.
    pub fn reachable(&self) -> bool {
        self.reachable
    }

    pub fn session(&self) -> Option<u64> {
        self.session.as_ref().map(|s| s.id)
    }

    /// Whether the partner's Hello arrived on the current session (updates can flow).
    pub fn established(&self) -> bool {
        self.session.as_ref().is_some_and(|s| s.partner.is_some())
    }

    pub fn set_term(&mut self, term: Option<u64>) {
        self.term = term;
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_millis() as u64
    }

    /// Forgets which partner store the marks refer to, so the next session asks for (and
    /// sends) the whole table; closes the current one to start that now.
    pub fn forget_partner(&mut self) -> Vec<SyncAction> {
        self.partner_store = None;
        match self.session {
            Some(_) => vec![SyncAction::Close("a full re-sync was asked for".into())],
            None => Vec::new(),
        }
    }

    pub fn link_up(&mut self, now: Instant, session: u64) -> Vec<SyncAction> {
        let mut out = self.link_down(now);
        self.session = Some(Exchange {
            id: session,
            last_heard: now,
            next_heartbeat: now + self.t.heartbeat,
            partner: None,
            out: None,
            in_done: None,
            in_received: 0,
            applies_outstanding: 0,
            in_complete: false,
            digest_sent: false,
        });
        let catch_up = if self.partner_store.is_some() { CatchUpRequest::Unsynced } else { CatchUpRequest::Full };
        out.push(SyncAction::Send(Message::Hello {
            node: self.node.clone(),
            store_id: self.store_id,
            catch_up,
            term: self.term,
            config_digest: self.config_digest,
        }));
        out
    }

    /// The connection is gone: held ACKs go out, and what was in flight stays unsynced.
    pub fn link_down(&mut self, _now: Instant) -> Vec<SyncAction> {
        let mut out = Vec::new();
        if self.session.take().is_none() {
            return out;
        }
        let gated: Vec<u64> = self.pending.iter().filter(|(_, p)| p.gated).map(|(b, _)| *b).collect();
        self.pending.clear();
        if !gated.is_empty() {
            out.push(SyncAction::ReleaseGates(gated));
        }
        self.set_reachable(false, &mut out);
        out
    }

    fn set_reachable(&mut self, r: bool, out: &mut Vec<SyncAction>) {
        if self.reachable != r {
            self.reachable = r;
            out.push(SyncAction::Reachable(r));
        }
    }

    fn refresh_reachable(&mut self, out: &mut Vec<SyncAction>) {
        let r = self
            .session
            .as_ref()
            .is_some_and(|s| s.partner.is_some() && s.out.as_ref().is_some_and(OutCatchUp::complete))
            && self.lagging_from.is_none();
        self.set_reachable(r, out);
    }

    fn batch_id(&mut self) -> u64 {
        let b = self.next_batch;
        self.next_batch += 1;
        b
    }

    /// Local changes to send. Returns the batch id when the caller should hold its DHCPACK
    /// for this batch (`hold` asked for it and the partner is reachable).
    pub fn local_changes(&mut self, now: Instant, entries: Vec<Binding>, hold: bool) -> (Option<u64>, Vec<SyncAction>) {
        let mut out = Vec::new();
        if !self.established() || entries.is_empty() {
            return (None, out); // stays unsynced; the next catch-up sends it
        }
        let gated = hold && self.reachable;
        let mut held = None;
        for chunk in entries.chunks(MAX_ENTRIES) {
            let batch = self.batch_id();
            self.pending.insert(
                batch,
                Pending {
                    ack_deadline: now + self.t.ack_timeout,
                    deadline: now + self.t.request_timeout,
                    gated,
                    catch_up: false,
                },
            );
            out.push(SyncAction::Send(Message::Updates { batch, kind: UpdateKind::Live, entries: chunk.to_vec() }));
            held = Some(batch);
        }
        // A held ACK waits for its whole outcome; with more than one chunk only the last
        // one is tracked, which is acknowledged after the others (one ordered stream).
        (if gated { held } else { None }, out)
    }

    pub fn receive(&mut self, now: Instant, msg: Message, table: &dyn Table) -> Vec<SyncAction> {
        let mut out = Vec::new();
        let Some(s) = self.session.as_mut() else { return out };
        s.last_heard = now;
        match msg {
            Message::Hello { node, store_id, catch_up, term: _, config_digest } => {
                if self.on_hello(now, node, store_id, catch_up, table, &mut out) {
                    let same = config_digest == self.config_digest;
                    out.push(SyncAction::PartnerConfig { digest: config_digest, same });
                }
            }
            _ if s.partner.is_none() => out.push(SyncAction::Close(format!("{} before hello", msg.name()))),
            Message::Updates { batch, kind, entries } => {
                s.applies_outstanding += 1;
                if kind == UpdateKind::CatchUp {
                    s.in_received += entries.len() as u64;
                }
                out.push(SyncAction::Apply { batch, kind, entries });
            }
            Message::Acks { batch, results } => self.on_acks(now, batch, results, table, &mut out),
            Message::CatchUpDone { entries } => {
                s.in_done = Some(entries);
                self.check_complete(table, &mut out);
            }
            Message::Digest { buckets } => self.on_digest(now, buckets, table, &mut out),
            // The replication driver hands votes to the election; one that got here is ignored.
            Message::Vote(_) => {}
            Message::Heartbeat { sent_ms } => out.push(SyncAction::Send(Message::HeartbeatAck { echo_ms: sent_ms })),
            Message::HeartbeatAck { echo_ms } => {
                let rtt = self.ms(now).saturating_sub(echo_ms);
                out.push(SyncAction::Rtt(Duration::from_millis(rtt)));
            }
        }
        self.refresh_reachable(&mut out);
        out
    }

    fn on_hello(
        &mut self,
        now: Instant,
        node: String,
        store_id: u64,
        catch_up: CatchUpRequest,
        table: &dyn Table,
        out: &mut Vec<SyncAction>,
    ) -> bool {
        let Some(s) = self.session.as_mut() else { return false };
        if s.partner.is_some() {
            out.push(SyncAction::Close("a second hello on one session".into()));
            return false;
        }
        if node == self.node {
            let why = format!("the partner calls itself {node:?} too; give each box its own [node] name");
            out.push(SyncAction::Close(why));
            return false;
        }
        s.partner = Some((node, store_id));
        let full = catch_up == CatchUpRequest::Full || self.partner_store != Some(store_id);
        if full {
            out.push(SyncAction::ResetMarks { partner_store: store_id });
            self.partner_store = Some(store_id);
        }
        s.out = Some(OutCatchUp { list: table.to_send(full), ..OutCatchUp::default() });
        self.pump(now, table, out);
        true
    }

    fn on_acks(
        &mut self,
        now: Instant,
        batch: u64,
        results: Vec<EntryResult>,
        table: &dyn Table,
        out: &mut Vec<SyncAction>,
    ) {
        let Some(p) = self.pending.remove(&batch) else { return };
        out.push(SyncAction::Settle(results));
        if p.gated {
            out.push(SyncAction::ReleaseGates(vec![batch]));
        }
        if self.lagging_from.is_some_and(|from| batch >= from) && now <= p.ack_deadline {
            self.lagging_from = None;
        }
        if p.catch_up
            && let Some(o) = self.session.as_mut().and_then(|s| s.out.as_mut())
        {
            o.inflight.remove(&batch);
        }
        self.pump(now, table, out);
    }

    /// The partner's digest: send our content of every /24 that differs, for repair by the
    /// conflict rule on its side.
    fn on_digest(&mut self, now: Instant, buckets: Vec<Bucket>, table: &dyn Table, out: &mut Vec<SyncAction>) {
        let theirs: HashMap<u32, Bucket> = buckets.into_iter().map(|b| (b.prefix, b)).collect();
        let mine: HashMap<u32, Bucket> = table.digest().into_iter().map(|b| (b.prefix, b)).collect();
        let mut differ: Vec<u32> =
            mine.keys().chain(theirs.keys()).copied().filter(|p| mine.get(p) != theirs.get(p)).collect();
        differ.sort_unstable();
        differ.dedup();
        for p in &differ {
            let entries = table.bucket(*p);
            for chunk in entries.chunks(self.t.page.max(1)) {
                let batch = self.batch_id();
                let deadlines = (now + self.t.ack_timeout, now + self.t.request_timeout);
                let pending =
                    Pending { ack_deadline: deadlines.0, deadline: deadlines.1, gated: false, catch_up: false };
                self.pending.insert(batch, pending);
                let entries = chunk.to_vec();
                out.push(SyncAction::Send(Message::Updates { batch, kind: UpdateKind::Repair, entries }));
            }
        }
        if !differ.is_empty() {
            out.push(SyncAction::DigestRepair(differ));
        }
    }

    /// A batch from the partner is durable here: acknowledge it.
    pub fn applied(
        &mut self,
        _now: Instant,
        session: u64,
        batch: u64,
        results: Vec<EntryResult>,
        table: &dyn Table,
    ) -> Vec<SyncAction> {
        let mut out = Vec::new();
        let Some(s) = self.session.as_mut().filter(|s| s.id == session) else { return out };
        s.applies_outstanding = s.applies_outstanding.saturating_sub(1);
        out.push(SyncAction::Send(Message::Acks { batch, results }));
        self.check_complete(table, &mut out);
        out
    }

    /// Sends catch-up pages while the window has room; CatchUpDone after the last.
    fn pump(&mut self, now: Instant, table: &dyn Table, out: &mut Vec<SyncAction>) {
        let (page, window, ack, deadline) =
            (self.t.page.clamp(1, MAX_ENTRIES), self.t.window.max(1), self.t.ack_timeout, self.t.request_timeout);
        let mut batches = Vec::new();
        {
            let Some(o) = self.session.as_mut().and_then(|s| s.out.as_mut()) else { return };
            while o.inflight.len() + batches.len() < window && o.next < o.list.len() {
                let end = (o.next + page).min(o.list.len());
                let entries: Vec<Binding> = o.list[o.next..end].iter().filter_map(|a| table.binding(*a)).collect();
                o.next = end;
                o.sent += entries.len() as u64;
                batches.push(entries);
            }
        }
        for entries in batches {
            let batch = self.batch_id();
            self.pending.insert(
                batch,
                Pending { ack_deadline: now + ack, deadline: now + deadline, gated: false, catch_up: true },
            );
            if let Some(o) = self.session.as_mut().and_then(|s| s.out.as_mut()) {
                o.inflight.insert(batch);
            }
            out.push(SyncAction::Send(Message::Updates { batch, kind: UpdateKind::CatchUp, entries }));
        }
        if let Some(o) = self.session.as_mut().and_then(|s| s.out.as_mut())
            && o.next >= o.list.len()
            && !o.done_sent
        {
            o.done_sent = true;
            out.push(SyncAction::Send(Message::CatchUpDone { entries: o.sent }));
        }
        self.check_complete(table, out);
    }

    fn check_complete(&mut self, table: &dyn Table, out: &mut Vec<SyncAction>) {
        let Some(s) = self.session.as_mut() else { return };
        if !s.in_complete && s.in_done.is_some() && s.applies_outstanding == 0 {
            s.in_complete = true;
        }
        let out_complete = s.out.as_ref().is_some_and(OutCatchUp::complete);
        if s.in_complete && out_complete && !s.digest_sent {
            s.digest_sent = true;
            let sent = s.out.as_ref().map_or(0, |o| o.sent);
            out.push(SyncAction::CaughtUp { sent, received: s.in_received });
            out.push(SyncAction::Send(Message::Digest { buckets: table.digest() }));
            if self.readiness != Readiness::CaughtUp {
                self.readiness = Readiness::CaughtUp;
                out.push(SyncAction::Readiness(Readiness::CaughtUp));
            }
        }
        self.refresh_reachable(out);
    }

    /// Heartbeats, deadlines and the startup wait. Call at least every heartbeat / 2.
    pub fn tick(&mut self, now: Instant) -> Vec<SyncAction> {
        let mut out = Vec::new();
        if self.readiness == Readiness::Waiting
            && now.saturating_duration_since(self.origin) >= self.t.startup_wait
            && !self.established()
        {
            self.readiness = Readiness::PartnerUnreachable;
            out.push(SyncAction::Readiness(Readiness::PartnerUnreachable));
        }
        let ms = self.ms(now);
        let Some(s) = self.session.as_mut() else { return out };
        if now.saturating_duration_since(s.last_heard) >= self.t.dead_after {
            out.push(SyncAction::Close(format!("nothing heard from the partner for {:?}", self.t.dead_after)));
            return out;
        }
        if now >= s.next_heartbeat {
            s.next_heartbeat = now + self.t.heartbeat;
            out.push(SyncAction::Send(Message::Heartbeat { sent_ms: ms }));
        }
        if let Some((b, _)) = self.pending.iter().find(|(_, p)| now >= p.deadline) {
            out.push(SyncAction::Close(format!("batch {b} not acknowledged within {:?}", self.t.request_timeout)));
            return out;
        }
        let late: Vec<u64> =
            self.pending.iter().filter(|(_, p)| p.gated && now >= p.ack_deadline).map(|(b, _)| *b).collect();
        if !late.is_empty() {
            for b in &late {
                if let Some(p) = self.pending.get_mut(b) {
                    p.gated = false;
                }
            }
            self.lagging_from = Some(self.next_batch);
            out.push(SyncAction::ReleaseGates(late));
        }
        self.refresh_reachable(&mut out);
        out
    }
}
