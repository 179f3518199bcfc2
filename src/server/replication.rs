//! The replication driver: owns the lease-sync session machine and the link to the partner,
//! turns local lease changes into updates, carries out the machine's actions against the
//! allocator and the store writer it is handed, and holds DHCPACKs in before-ack mode.
//!
//! It runs on the engine task, which owns the allocator and passes it in, so a partner's
//! binding and a client's request never race: each is merged into the one table in arrival
//! order, and the store writer commits them in that order.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::allocator::Allocator;
use crate::clock::unix_now;
use crate::config::{ConfigDigest, Peer, SyncMode};
use crate::election::peer::PeerPort;
use crate::events::{EventKind, Events};
use crate::lease::{Binding, LeaseState, Transition};
use crate::store::writer::AfterCommit;
use crate::store::{Batch, ConflictKind, ConflictRecord, StoreIdentity, StoreWriter};
use crate::sync::link::{self, LinkConfig, LinkEvent, LinkHandle, LinkStats};
use crate::sync::machine::{Readiness, SyncAction, SyncSession, Timing};
use crate::sync::merge::{self, Merged};
use crate::sync::protocol::{EntryOutcome, EntryResult, Message, UpdateKind};

/// Counters for status displays, tests and the benchmark.
#[derive(Debug, Default)]
pub struct SyncStats {
    pub conflicts: AtomicU64,
    pub fenced: AtomicU64,
    pub sent: AtomicU64,
    pub applied: AtomicU64,
    pub held_timeouts: AtomicU64,
    pub rtt_us: AtomicU64,
    pub reachable: AtomicBool,
    /// A session with the partner is up.
    pub link_up: AtomicBool,
    /// When the last catch-up completed, in milliseconds since the Unix epoch (0: never).
    pub last_catch_up_ms: AtomicU64,
    pub catch_ups: AtomicU64,
    /// The partner's configuration digest from its last Hello (None before the first one).
    pub partner_config: Mutex<Option<ConfigDigest>>,
    /// Whether that digest differs from this box's.
    pub config_differs: AtomicBool,
}

impl SyncStats {
    /// The partner's configuration digest, as last heard, for status displays.
    pub fn partner_config(&self) -> Option<ConfigDigest> {
        *self.partner_config.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A partner's batch is durable here; acknowledge it on the session it came in on.
pub struct Applied {
    session: u64,
    batch: u64,
    results: Vec<EntryResult>,
}

/// What the replication driver waits on; the engine's loop selects over these.
pub struct ReplicationInputs {
    pub link_events: mpsc::UnboundedReceiver<LinkEvent>,
    pub applied: mpsc::UnboundedReceiver<Applied>,
}

/// A DHCPACK waiting for two things: its lease on local disk and the partner's acknowledgement
/// (or the ack timeout). Whichever comes last sends it.
struct Gate {
    left: AtomicU8,
    send: Mutex<Option<AfterCommit>>,
}

impl Gate {
    fn new(send: AfterCommit) -> Arc<Gate> {
        Arc::new(Gate { left: AtomicU8::new(2), send: Mutex::new(Some(send)) })
    }

    fn done(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1
            && let Some(f) = self.send.lock().unwrap_or_else(|e| e.into_inner()).take()
        {
            f();
        }
    }
}

pub struct Replication {
    session: SyncSession,
    link: LinkHandle,
    events: Events,
    mode: SyncMode,
    readiness: watch::Sender<Readiness>,
    stats: Arc<SyncStats>,
    applied_tx: mpsc::UnboundedSender<Applied>,
    gates: HashMap<u64, Vec<Arc<Gate>>>,
    /// This box's configuration digest, sent in Hello and compared with the partner's.
    config_digest: ConfigDigest,
    /// Bindings of the partner refused as impossible: a bad partner could send thousands.
    refused_log: crate::logging::Throttle,
    /// The same for the partner's refusals of this box's bindings.
    refused_by_partner_log: crate::logging::Throttle,
    /// The election's votes ride on this link (None: no election listens).
    votes: Option<PeerPort>,
}

impl Replication {
    /// Starts the link to the partner and the session machine. `identity` is this store's and
    /// the partner store its sync marks refer to.
    pub fn start(
        node: &str,
        peer: &Peer,
        key: Vec<u8>,
        identity: StoreIdentity,
        readiness: watch::Sender<Readiness>,
        events: Events,
    ) -> (Replication, ReplicationInputs) {
        let config =
            LinkConfig { node: node.to_string(), listen: peer.listen, partner: peer.address, key: Arc::new(key) };
        let (link, link_events) = link::spawn(config);
        Self::with_link(node, peer, (link, link_events), identity, readiness, events)
    }

    /// Like [`Self::start`], over a link the caller made (in-process tests join two boxes).
    pub fn with_link(
        node: &str,
        peer: &Peer,
        (link, link_events): (LinkHandle, mpsc::UnboundedReceiver<LinkEvent>),
        identity: StoreIdentity,
        readiness: watch::Sender<Readiness>,
        events: Events,
    ) -> (Replication, ReplicationInputs) {
        let timing = Timing::new(Duration::from_millis(peer.ack_timeout_ms));
        let store = identity.store.expect("the store's identity is created when it opens");
        let session = SyncSession::new(timing, node.to_string(), store, identity.partner_store, Instant::now());
        let (applied_tx, applied) = mpsc::unbounded_channel();
        let stats = Arc::new(SyncStats::default());
        let r = Replication {
            session,
            link,
            events,
            mode: peer.sync_mode,
            readiness,
            stats,
            applied_tx,
            gates: HashMap::new(),
            config_digest: ConfigDigest::default(),
            refused_log: crate::logging::Throttle::new(Duration::from_secs(10), 5),
            refused_by_partner_log: crate::logging::Throttle::new(Duration::from_secs(10), 5),
            votes: None,
        };
        (r, ReplicationInputs { link_events, applied })
    }

    pub fn stats(&self) -> Arc<SyncStats> {
        self.stats.clone()
    }

    /// The link's own counters (rejected connections, bad frames, sessions).
    pub fn link_stats(&self) -> Arc<LinkStats> {
        self.link.stats.clone()
    }

    /// Starts a full re-sync with the partner (both tables, merged by the conflict rule).
    pub fn sync_from_partner(&mut self) {
        tracing::warn!("full re-sync with the partner asked for");
        let actions = self.session.forget_partner();
        for a in actions {
            if let SyncAction::Close(reason) = a {
                self.link.close(self.session.session().unwrap_or(0), reason);
            }
        }
    }

    /// This box's configuration digest: sent to the partner in Hello, which answers with its own.
    pub fn set_config_digest(&mut self, digest: ConfigDigest) {
        self.config_digest = digest;
        self.session.set_config_digest(digest.0);
    }

    /// Hands the election's votes to `port` and lets it send its own on this link.
    pub fn set_peer_votes(&mut self, port: PeerPort) {
        self.votes = Some(port);
    }

    /// The election term stamped on this box's changes (None while standby).
    pub fn set_term(&mut self, term: Option<u64>) {
        self.session.set_term(term);
    }

    /// Sends lease changes to the partner. With `reply`, a DHCPACK to hold in before-ack mode:
    /// returns the reply wrapped so it leaves once both the local commit and the partner's
    /// acknowledgement (or the ack timeout) have happened.
    pub fn replicate(
        &mut self,
        alloc: &mut Allocator,
        writer: &StoreWriter,
        transitions: &[Transition],
        reply: Option<AfterCommit>,
    ) -> Option<AfterCommit> {
        let entries: Vec<Binding> = transitions.iter().filter(|t| replicated(t)).map(|t| t.new.clone()).collect();
        let hold = reply.is_some() && self.mode == SyncMode::BeforeAck;
        self.stats.sent.fetch_add(entries.len() as u64, Ordering::Relaxed);
        let (held, actions) = self.session.local_changes(Instant::now(), entries, hold);
        let out = match (held, reply) {
            (Some(batch), Some(send)) => {
                let gate = Gate::new(send);
                self.gates.entry(batch).or_default().push(gate.clone());
                Some(Box::new(move || gate.done()) as AfterCommit)
            }
            (_, reply) => reply,
        };
        self.carry_out(alloc, writer, actions);
        out
    }

    pub fn on_link_event(&mut self, alloc: &mut Allocator, writer: &StoreWriter, ev: LinkEvent) {
        let now = Instant::now();
        let actions = match ev {
            LinkEvent::Up { session, partner } => {
                tracing::info!(%partner, session, "lease sync session starting");
                self.stats.link_up.store(true, Ordering::Relaxed);
                self.events.record(EventKind::Partner, format!("link to {partner} up (session {session})"));
                if let Some(v) = &self.votes {
                    v.up(&self.link, session, &partner);
                }
                self.session.link_up(now, session)
            }
            LinkEvent::Down { session, reason } => {
                if self.session.session() != Some(session) {
                    return;
                }
                tracing::warn!(%reason, "lease sync session ended; changes stay unsynced until the next catch-up");
                self.stats.link_up.store(false, Ordering::Relaxed);
                self.events.record(EventKind::Partner, format!("link down: {reason}"));
                if let Some(v) = &self.votes {
                    v.down(session);
                }
                self.session.link_down(now)
            }
            LinkEvent::Message { session, msg } => {
                if self.session.session() != Some(session) {
                    return;
                }
                if let Message::Vote(vote) = msg {
                    if let Some(v) = &self.votes {
                        v.deliver(vote);
                    }
                    return;
                }
                self.session.receive(now, msg, alloc)
            }
        };
        self.carry_out(alloc, writer, actions);
    }

    pub fn on_applied(&mut self, alloc: &mut Allocator, writer: &StoreWriter, a: Applied) {
        let actions = self.session.applied(Instant::now(), a.session, a.batch, a.results, alloc);
        self.carry_out(alloc, writer, actions);
    }

    pub fn tick(&mut self, alloc: &mut Allocator, writer: &StoreWriter) {
        let actions = self.session.tick(Instant::now());
        self.carry_out(alloc, writer, actions);
    }

    /// Carries out the session's actions, in order, in this one place.
    fn carry_out(&mut self, alloc: &mut Allocator, writer: &StoreWriter, actions: Vec<SyncAction>) {
        for a in actions {
            self.carry_out_one(alloc, writer, a);
        }
    }

    fn carry_out_one(&mut self, alloc: &mut Allocator, writer: &StoreWriter, a: SyncAction) {
        let session = self.session.session().unwrap_or(0);
        match a {
            SyncAction::Send(m) => self.link.send(session, m),
            SyncAction::Close(reason) => self.link.close(session, reason),
            SyncAction::Apply { batch, kind, entries } => self.apply(alloc, writer, session, batch, kind, entries),
            SyncAction::Settle(results) => {
                for r in results.iter().filter(|r| r.outcome == EntryOutcome::Unknown) {
                    if let Some(held_back) = self.refused_by_partner_log.admit(Instant::now()) {
                        tracing::warn!(address = %r.addr, held_back, "the partner refused this binding (an address it does not manage, or content it found impossible; its log says which)");
                    }
                }
                let mut merged = Merged::default();
                let resend = merge::settle(alloc, results, unix_now(), &mut merged);
                self.commit_merged(writer, merged, None);
                self.resend_unsynced(alloc, writer, resend);
            }
            SyncAction::ResetMarks { partner_store } => {
                tracing::info!(partner_store, "the partner's store is new or wiped: sending it the full table");
                alloc.reset_marks();
                writer.exec(move |s| {
                    if let Err(e) = s.reset_partner(partner_store) {
                        tracing::error!(error = %e, "cannot record the partner's store identity");
                    }
                });
            }
            SyncAction::ReleaseGates(batches) => {
                for b in batches {
                    for g in self.gates.remove(&b).unwrap_or_default() {
                        g.done();
                    }
                }
            }
            SyncAction::Readiness(r) => self.report_readiness(r),
            SyncAction::Reachable(r) => self.report_reachable(r),
            SyncAction::Rtt(d) => self.stats.rtt_us.store(d.as_micros() as u64, Ordering::Relaxed),
            SyncAction::PartnerConfig { digest, same } => self.report_partner_config(ConfigDigest(digest), same),
            SyncAction::CaughtUp { sent, received } => {
                tracing::info!(sent, received, "catch-up with the partner complete in both directions");
                let wall_ms = unix_now().saturating_mul(1000);
                self.stats.last_catch_up_ms.store(wall_ms, Ordering::Relaxed);
                self.stats.catch_ups.fetch_add(1, Ordering::Relaxed);
                self.events.record(EventKind::CatchUp, format!("caught up: {sent} sent, {received} received"));
            }
            SyncAction::DigestRepair(prefixes) => {
                let nets: Vec<String> = prefixes.iter().map(|p| format!("{}/24", Ipv4Addr::from(p << 8))).collect();
                tracing::warn!(networks = ?nets, "lease tables differed after catch-up; repairing by the conflict rule");
            }
        }
    }

    /// Both boxes must give clients the same answers: a partner with another configuration is
    /// logged loudly (and shown in STATUS=) at every session start.
    fn report_partner_config(&self, partner: ConfigDigest, same: bool) {
        *self.stats.partner_config.lock().unwrap_or_else(|e| e.into_inner()) = Some(partner);
        self.stats.config_differs.store(!same, Ordering::Relaxed);
        let own = self.config_digest;
        if same {
            tracing::info!(config_digest = %own, "the partner loaded the same configuration");
        } else {
            tracing::warn!(
                config_digest = %own,
                partner_config_digest = %partner,
                "CONFIGURATION DIFFERS FROM THE PARTNER'S: after a failover clients may get other options, \
                 pools or classes; install the same file on both boxes (`twinlease check-config` prints its digest)"
            );
        }
    }

    /// Merges a batch from the partner and acknowledges it once the result is durable.
    fn apply(
        &mut self,
        alloc: &mut Allocator,
        writer: &StoreWriter,
        session: u64,
        batch: u64,
        kind: UpdateKind,
        entries: Vec<Binding>,
    ) {
        let mut merged = Merged::default();
        let results = merge::apply_batch(alloc, &entries, kind, unix_now(), &mut merged);
        let applied = results.iter().filter(|r| r.outcome == EntryOutcome::Applied).count();
        self.stats.applied.fetch_add(applied as u64, Ordering::Relaxed);
        if kind == UpdateKind::Live {
            for e in &entries {
                tracing::debug!(address = %e.addr, state = e.state.name(), term = e.term, "partner's lease change applied");
            }
        }
        let resend: Vec<Ipv4Addr> = merged.transitions.iter().map(|t| t.new.addr).collect();
        let tx = self.applied_tx.clone();
        let reply = Applied { session, batch, results };
        self.commit_merged(
            writer,
            merged,
            Some(Box::new(move || {
                let _ = tx.send(reply);
            })),
        );
        self.resend_unsynced(alloc, writer, resend);
    }

    /// Sends back local changes the partner does not hold (freed addresses, bindings that won).
    fn resend_unsynced(&mut self, alloc: &mut Allocator, writer: &StoreWriter, addrs: Vec<Ipv4Addr>) {
        let mut v: Vec<Binding> =
            addrs.into_iter().filter(|a| !alloc.is_synced(*a)).filter_map(|a| alloc.binding(a).cloned()).collect();
        v.sort_by_key(|b| b.addr);
        v.dedup_by_key(|b| b.addr);
        if v.is_empty() {
            return;
        }
        let (_, actions) = self.session.local_changes(Instant::now(), v, false);
        self.carry_out(alloc, writer, actions);
    }

    fn report_readiness(&self, r: Readiness) {
        match r {
            Readiness::CaughtUp => tracing::info!("caught up with the partner: eligible for election"),
            Readiness::PartnerUnreachable => {
                tracing::warn!("partner unreachable at startup: eligible for election without catch-up");
            }
            Readiness::Waiting => {}
        }
        self.readiness.send_replace(r);
    }

    fn report_reachable(&self, reachable: bool) {
        self.stats.reachable.store(reachable, Ordering::Relaxed);
        if reachable {
            tracing::info!("partner in sync: DHCPACKs wait for it (before-ack)");
            self.events.record(EventKind::Partner, "partner in sync");
        } else if self.mode == SyncMode::BeforeAck {
            self.stats.held_timeouts.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "partner unreachable or behind: DHCPACKs no longer wait for it; leases stay unsynced until it catches up"
            );
            self.events.record(EventKind::Partner, "partner unreachable or behind: ACKs no longer wait for it");
        }
    }

    fn commit_merged(&mut self, writer: &StoreWriter, merged: Merged, after: Option<AfterCommit>) {
        let Merged { transitions, marks, conflicts, fenced, refused } = merged;
        for (address, why) in refused {
            if let Some(held_back) = self.refused_log.admit(Instant::now()) {
                tracing::warn!(%address, held_back, "refused the partner's binding: {why}; the table here keeps its own");
            }
        }
        self.stats.conflicts.fetch_add(conflicts.len() as u64, Ordering::Relaxed);
        if fenced {
            self.stats.fenced.fetch_add(1, Ordering::Relaxed);
        }
        for c in &conflicts {
            log_conflict(c);
            let text =
                format!("{} conflict: kept {} for the binding of term {}", c.kind.name(), c.winner.addr, c.winner.term);
            self.events.record(EventKind::Conflict, text);
        }
        writer.commit_batch(Batch { transitions, marks, conflicts }, after);
    }
}

/// Offers and probes live for seconds and are never honoured across a failover (the client
/// asks again); only the changes a client relies on travel as live updates. Catch-up and
/// digest repair still carry every binding.
fn replicated(t: &Transition) -> bool {
    !matches!(t.new.state, LeaseState::Offered | LeaseState::Probing)
}

fn log_conflict(c: &ConflictRecord) {
    let who = |b: &Binding| b.owner.as_ref().map(|o| o.to_string()).unwrap_or_default();
    let (w, l) = (&c.winner, &c.loser);
    let consequence = if c.kind == ConflictKind::Address {
        "the losing client is NAKed at its next renewal"
    } else {
        "the other address returns to the queue"
    };
    tracing::warn!(
        kind = c.kind.name(),
        winner_address = %w.addr, winner_client = %who(w), winner_state = w.state.name(),
        winner_term = w.term, winner_cltt = w.cltt, winner_expires = w.expires,
        loser_address = %l.addr, loser_client = %who(l), loser_state = l.state.name(),
        loser_term = l.term, loser_cltt = l.cltt, loser_expires = l.expires,
        consequence,
        "lease conflict resolved: higher (term, cltt) kept"
    );
}
