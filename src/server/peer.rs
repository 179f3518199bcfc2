//! The engine's side of lease sync: carries out the sync machine's actions against the
//! allocator and the store writer, turns lease changes into updates, and holds DHCPACKs in
//! before-ack mode.
//!
//! Everything runs on the engine task, which owns the allocator, so a partner's binding and a
//! client's request never race: each is merged into the one table in arrival order, and the
//! store writer commits them in that order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{mpsc, watch};

use super::engine::{Engine, unix_now};
use crate::config::SyncMode;
use crate::lease::{Binding, LeaseState, Transition};
use crate::store::{Batch, ConflictKind, ConflictRecord};
use crate::sync::link::{LinkEvent, LinkHandle};
use crate::sync::machine::{Action, Machine, Readiness};
use crate::sync::merge::{self, Merged};
use crate::sync::protocol::{EntryOutcome, EntryResult, UpdateKind};

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
}

/// A partner's batch is durable here; acknowledge it on the session it came in on.
pub struct Applied {
    session: u64,
    batch: u64,
    results: Vec<EntryResult>,
}

/// A DHCPACK waiting for two things: its lease on local disk and the partner's acknowledgement
/// (or the ack timeout). Whichever comes last sends it.
pub struct Gate {
    left: AtomicU8,
    send: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Gate {
    fn new(send: Box<dyn FnOnce() + Send>) -> Arc<Gate> {
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

pub struct PeerSide {
    pub machine: Machine,
    pub link: LinkHandle,
    /// Taken by the engine loop, which waits on them.
    pub events: Option<mpsc::UnboundedReceiver<LinkEvent>>,
    pub applied_tx: mpsc::UnboundedSender<Applied>,
    pub applied_rx: Option<mpsc::UnboundedReceiver<Applied>>,
    pub mode: SyncMode,
    pub readiness: watch::Sender<Readiness>,
    pub stats: Arc<SyncStats>,
    gates: HashMap<u64, Vec<Arc<Gate>>>,
}

impl PeerSide {
    pub fn new(machine: Machine, link: LinkHandle, events: mpsc::UnboundedReceiver<LinkEvent>, mode: SyncMode, readiness: watch::Sender<Readiness>) -> PeerSide {
        let (applied_tx, applied_rx) = mpsc::unbounded_channel();
        PeerSide { machine, link, events: Some(events), applied_tx, applied_rx: Some(applied_rx), mode, readiness, stats: Arc::new(SyncStats::default()), gates: HashMap::new() }
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
    tracing::warn!(
        kind = c.kind.name(),
        winner_address = %c.winner.addr, winner_client = %who(&c.winner), winner_state = c.winner.state.name(), winner_term = c.winner.term, winner_cltt = c.winner.cltt, winner_expires = c.winner.expires,
        loser_address = %c.loser.addr, loser_client = %who(&c.loser), loser_state = c.loser.state.name(), loser_term = c.loser.term, loser_cltt = c.loser.cltt, loser_expires = c.loser.expires,
        "lease conflict resolved: higher (term, cltt) kept{}",
        if c.kind == ConflictKind::Address { "; the losing client is NAKed at its next renewal" } else { "; the other address returns to the queue" }
    );
}

impl Engine {
    /// Sends lease changes to the partner. With `reply`, a DHCPACK to hold in before-ack mode:
    /// returns the reply wrapped so it leaves once both the local commit and the partner's
    /// acknowledgement (or the ack timeout) have happened.
    pub(super) fn replicate(&mut self, transitions: &[Transition], reply: Option<Box<dyn FnOnce() + Send>>) -> Option<Box<dyn FnOnce() + Send>> {
        let Some(peer) = self.peer.as_mut() else { return reply };
        let entries: Vec<Binding> = transitions.iter().filter(|t| replicated(t)).map(|t| t.new.clone()).collect();
        let hold = reply.is_some() && peer.mode == SyncMode::BeforeAck;
        peer.stats.sent.fetch_add(entries.len() as u64, Ordering::Relaxed);
        let (held, actions) = peer.machine.local_changes(Instant::now(), entries, hold);
        let out = match (held, reply) {
            (Some(batch), Some(send)) => {
                let gate = Gate::new(send);
                peer.gates.entry(batch).or_default().push(gate.clone());
                Some(Box::new(move || gate.done()) as Box<dyn FnOnce() + Send>)
            }
            (_, reply) => reply,
        };
        self.act(actions);
        out
    }

    /// Sends back local changes the partner does not hold (freed addresses, bindings that won).
    fn resend_unsynced(&mut self, addrs: impl IntoIterator<Item = std::net::Ipv4Addr>) {
        let mut v: Vec<Binding> = addrs.into_iter().filter(|a| !self.alloc.is_synced(*a)).filter_map(|a| self.alloc.binding(a).cloned()).collect();
        v.sort_by_key(|b| b.addr);
        v.dedup_by_key(|b| b.addr);
        if v.is_empty() {
            return;
        }
        let Some(peer) = self.peer.as_mut() else { return };
        let (_, actions) = peer.machine.local_changes(Instant::now(), v, false);
        self.act(actions);
    }

    pub(super) fn on_link_event(&mut self, ev: LinkEvent) {
        let Some(peer) = self.peer.as_mut() else { return };
        let now = Instant::now();
        let actions = match ev {
            LinkEvent::Up { session, peer: name } => {
                tracing::info!(partner = %name, session, "lease sync session starting");
                peer.machine.link_up(now, session)
            }
            LinkEvent::Down { session, reason } => {
                if peer.machine.session() != Some(session) {
                    return;
                }
                tracing::warn!(%reason, "lease sync session ended; changes stay unsynced until the next catch-up");
                peer.machine.link_down(now)
            }
            LinkEvent::Message { session, msg } => {
                if peer.machine.session() != Some(session) {
                    return;
                }
                peer.machine.receive(now, msg, &self.alloc)
            }
        };
        self.act(actions);
    }

    pub(super) fn on_applied(&mut self, a: Applied) {
        let Some(peer) = self.peer.as_mut() else { return };
        let actions = peer.machine.applied(Instant::now(), a.session, a.batch, a.results, &self.alloc);
        self.act(actions);
    }

    pub(super) fn sync_tick(&mut self) {
        let Some(peer) = self.peer.as_mut() else { return };
        let actions = peer.machine.tick(Instant::now());
        self.act(actions);
    }

    fn act(&mut self, actions: Vec<Action>) {
        for a in actions {
            self.act_one(a);
        }
    }

    fn act_one(&mut self, a: Action) {
        let Some(peer) = self.peer.as_mut() else { return };
        let session = peer.machine.session().unwrap_or(0);
        match a {
            Action::Send(m) => peer.link.send(session, m),
            Action::Close(reason) => peer.link.close(session, reason),
            Action::Apply { batch, kind, entries } => {
                let mut merged = Merged::default();
                let results = merge::apply_batch(&mut self.alloc, &entries, kind, unix_now(), &mut merged);
                let applied = results.iter().filter(|r| r.outcome == EntryOutcome::Applied).count();
                peer.stats.applied.fetch_add(applied as u64, Ordering::Relaxed);
                if kind == UpdateKind::Live {
                    for e in &entries {
                        tracing::debug!(address = %e.addr, state = e.state.name(), term = e.term, "partner's lease change applied");
                    }
                }
                let resend: Vec<std::net::Ipv4Addr> = merged.transitions.iter().map(|t| t.new.addr).collect();
                let tx = peer.applied_tx.clone();
                let reply = Applied { session, batch, results };
                self.commit_merged(merged, Some(Box::new(move || {
                    let _ = tx.send(reply);
                })));
                self.resend_unsynced(resend);
            }
            Action::Settle(results) => {
                for r in &results {
                    if r.outcome == EntryOutcome::Unknown {
                        tracing::warn!(address = %r.addr, "the partner does not manage this address; the two boxes' pools differ");
                    }
                }
                let mut merged = Merged::default();
                let resend = merge::settle(&mut self.alloc, results, unix_now(), &mut merged);
                self.commit_merged(merged, None);
                self.resend_unsynced(resend);
            }
            Action::ResetMarks { peer_store_id } => {
                tracing::info!(peer_store_id, "the partner's store is new or wiped: sending it the full table");
                self.alloc.reset_marks();
                self.writer.exec(move |s| {
                    if let Err(e) = s.reset_peer(peer_store_id) {
                        tracing::error!(error = %e, "cannot record the partner's store identity");
                    }
                });
            }
            Action::ReleaseGates(batches) => {
                for b in batches {
                    for g in peer.gates.remove(&b).unwrap_or_default() {
                        g.done();
                    }
                }
            }
            Action::Readiness(r) => {
                match r {
                    Readiness::CaughtUp => tracing::info!("caught up with the partner: eligible for election"),
                    Readiness::PeerUnreachable => tracing::warn!("partner unreachable at startup: eligible for election without catch-up"),
                    Readiness::Waiting => {}
                }
                peer.readiness.send_replace(r);
            }
            Action::Reachable(r) => {
                peer.stats.reachable.store(r, Ordering::Relaxed);
                if r {
                    tracing::info!("partner in sync: DHCPACKs wait for it (before-ack)");
                } else if peer.mode == SyncMode::BeforeAck {
                    peer.stats.held_timeouts.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("partner unreachable or behind: DHCPACKs no longer wait for it; leases stay unsynced until it catches up");
                }
            }
            Action::Rtt(d) => {
                peer.stats.rtt_us.store(d.as_micros() as u64, Ordering::Relaxed);
            }
            Action::CaughtUp { sent, received } => tracing::info!(sent, received, "catch-up with the partner complete in both directions"),
            Action::DigestRepair(prefixes) => {
                let nets: Vec<String> = prefixes.iter().map(|p| format!("{}/24", std::net::Ipv4Addr::from(p << 8))).collect();
                tracing::warn!(networks = ?nets, "lease tables differed after catch-up; repairing by the conflict rule");
            }
        }
    }

    fn commit_merged(&mut self, merged: Merged, after: Option<Box<dyn FnOnce() + Send>>) {
        let Merged { transitions, marks, conflicts, fenced } = merged;
        if let Some(peer) = self.peer.as_ref() {
            peer.stats.conflicts.fetch_add(conflicts.len() as u64, Ordering::Relaxed);
            if fenced {
                peer.stats.fenced.fetch_add(1, Ordering::Relaxed);
            }
        }
        for c in &conflicts {
            log_conflict(c);
        }
        self.writer.commit_batch(Batch { transitions, marks, conflicts }, after);
    }
}
