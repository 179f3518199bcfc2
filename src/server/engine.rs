//! The task that owns the allocator: it feeds requests to the decision code with the current
//! time, hands the resulting transitions to the store writer, and sends (or schedules) replies.
//! Also runs the reaper and rebuilds the allocator from disk when a commit fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dhcproto::v4::MessageType;
use tokio::sync::mpsc;

use super::ping::Pinger;
use super::socket::ReplySender;
use crate::allocator::Allocator;
use crate::config::Config;
use crate::dhcp::{self, Action, Ingress, Outcome, PendingOffer, Request, Silence};
use crate::lease::{LeaseState, UnixSecs};
use crate::role::{Role, RoleRx};
use crate::store::{StoreWriter, WriterEvent};

pub enum Input {
    Packet { req: Box<Request>, ingress: Ingress, socket: usize },
    ProbeDone { pending: PendingOffer, socket: usize, answered: bool },
}

/// Counters for status displays, the watchdog and the benchmark.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub received: AtomicU64,
    pub dropped_not_active: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub offers: AtomicU64,
    pub acks: AtomicU64,
    pub naks: AtomicU64,
    pub exhausted: AtomicU64,
    pub leases: AtomicU64,
    /// Monotonic milliseconds since start when the engine loop last went round.
    pub alive_ms: AtomicU64,
}

pub struct Engine {
    pub cfg: Arc<Config>,
    pub alloc: Allocator,
    pub writer: StoreWriter,
    pub senders: Vec<Arc<ReplySender>>,
    pub pinger: Option<Arc<Pinger>>,
    pub role: RoleRx,
    pub inbox: mpsc::Receiver<Input>,
    pub inbox_tx: mpsc::Sender<Input>,
    pub writer_events: mpsc::UnboundedReceiver<WriterEvent>,
    pub stats: Arc<EngineStats>,
    pub started: std::time::Instant,
    /// Fires when the daemon stops; the engine then returns, dropping its store writer handle.
    pub shutdown: tokio::sync::oneshot::Receiver<()>,
    pub ticks: u64,
    /// Lease sync with the partner box, when `[peer]` is configured.
    pub peer: Option<super::peer::PeerSide>,
}

/// Waits on an optional receiver; never resolves without one.
async fn recv_opt<T>(rx: Option<&mut mpsc::UnboundedReceiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

pub fn unix_now() -> UnixSecs {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Reaper batch: bounded so one transaction stays short.
const REAP_BATCH: usize = 1024;

impl Engine {
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Heartbeats and sync deadlines are checked this often (a tenth of the shortest one).
        let mut sync_tick = tokio::time::interval(Duration::from_millis(20));
        sync_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.apply_role();
        let mut link_events = self.peer.as_mut().and_then(|p| p.events.take());
        let mut applied = self.peer.as_mut().and_then(|p| p.applied_rx.take());
        loop {
            #[cfg(feature = "fault-injection")]
            super::fault::engine_checkpoint();
            self.stats.alive_ms.store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
            tokio::select! {
                _ = &mut self.shutdown => break,
                input = self.inbox.recv() => match input {
                    Some(i) => self.on_input(i),
                    None => break,
                },
                Some(ev) = self.writer_events.recv() => self.on_store_failure(ev).await,
                changed = self.role.changed() => {
                    if changed.is_err() { break; }
                    self.apply_role();
                }
                _ = tick.tick() => self.housekeeping(),
                Some(ev) = recv_opt(link_events.as_mut()) => self.on_link_event(ev),
                Some(a) = recv_opt(applied.as_mut()) => self.on_applied(a),
                _ = sync_tick.tick(), if self.peer.is_some() => self.sync_tick(),
            }
        }
    }

    fn apply_role(&mut self) {
        let role = *self.role.borrow_and_update();
        if let Role::Active { term, .. } = role {
            self.alloc.set_term(term);
        }
        if let Some(p) = self.peer.as_mut() {
            p.machine.set_term(role.term());
        }
    }

    fn on_input(&mut self, input: Input) {
        if !self.role.borrow().is_active() {
            self.stats.dropped_not_active.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let now = unix_now();
        let ping = self.pinger.is_some();
        let (outcome, socket) = match input {
            Input::Packet { req, ingress, socket } => (dhcp::handle(&self.cfg, &mut self.alloc, &req, &ingress, now, ping), socket),
            Input::ProbeDone { pending, socket, answered } => {
                if answered {
                    tracing::warn!(address = %pending.addr, "address answered a ping but has no lease; quarantined");
                }
                (dhcp::after_probe(&self.cfg, &mut self.alloc, pending, answered, now), socket)
            }
        };
        self.carry_out(outcome, socket);
    }

    fn carry_out(&mut self, outcome: Outcome, socket: usize) {
        let Outcome { transitions, action } = outcome;
        for t in &transitions {
            log_transition(t);
        }
        match action {
            Action::Reply { reply, durable } => {
                self.count_reply(reply.kind);
                let sender = self.senders[socket].clone();
                let role = self.role.clone();
                let send = move || {
                    // Re-checked at the last moment: a demotion during the commit wins.
                    if role.borrow().is_active() {
                        sender.send(&reply);
                    }
                };
                if durable {
                    // In before-ack mode the reply also waits for the partner (bounded).
                    let send = self.replicate(&transitions, Some(Box::new(send)));
                    self.writer.commit(transitions, send);
                } else {
                    if !transitions.is_empty() {
                        self.replicate(&transitions, None);
                        self.writer.commit(transitions, None);
                    }
                    send();
                }
            }
            Action::Probe(pending) => {
                if !transitions.is_empty() {
                    self.replicate(&transitions, None);
                    self.writer.commit(transitions, None);
                }
                let (Some(pinger), tx) = (self.pinger.clone(), self.inbox_tx.clone()) else { return };
                let timeout = Duration::from_millis(self.cfg.dhcp.ping_timeout_ms);
                tokio::spawn(async move {
                    let answered = pinger.probe(pending.addr, timeout).await;
                    let _ = tx.send(Input::ProbeDone { pending, socket, answered }).await;
                });
            }
            Action::Silent(why) => {
                if !transitions.is_empty() {
                    self.replicate(&transitions, None);
                    self.writer.commit(transitions, None);
                }
                match why {
                    Silence::PoolExhausted => {
                        self.stats.exhausted.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("pool exhausted: no address to offer");
                    }
                    Silence::AliasHeldOff { group, holder } => tracing::info!(%group, %holder, "alias group busy; request held off"),
                    Silence::ReservedUnavailable(a) => tracing::warn!(address = %a, "reserved address is quarantined; not offered"),
                    other => tracing::debug!(reason = ?other, "no reply"),
                }
            }
        }
    }

    fn count_reply(&self, kind: MessageType) {
        let c = match kind {
            MessageType::Offer => &self.stats.offers,
            MessageType::Ack => &self.stats.acks,
            MessageType::Nak => &self.stats.naks,
            _ => return,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn housekeeping(&mut self) {
        let now = unix_now();
        // Only the active box expires leases; a standby mirrors the active's table and would
        // otherwise race it with changes of its own.
        let mut more = self.role.borrow().is_active();
        while more {
            let batch = self.alloc.reap(now, REAP_BATCH);
            let full = batch.len() == REAP_BATCH;
            for t in &batch {
                tracing::debug!(address = %t.new.addr, "expired; back in the queue");
            }
            if !batch.is_empty() {
                self.replicate(&batch, None);
                self.writer.commit(batch, None);
            }
            more = full;
        }
        // The consistency walk is a safety net, not a hot path: a slice every ten seconds.
        self.ticks += 1;
        if self.ticks.is_multiple_of(10) {
            let repaired = self.alloc.repair_queue(4096);
            if repaired > 0 {
                tracing::error!(repaired, "allocator queue held busy addresses; repaired");
            }
        }
        // Everything expired was just reaped, so every Leased entry is live.
        self.stats.leases.store(self.alloc.count(LeaseState::Leased) as u64, Ordering::Relaxed);
    }

    /// A commit failed: the allocator is ahead of the disk. Rebuild it from what is durable.
    async fn on_store_failure(&mut self, ev: WriterEvent) {
        let WriterEvent::Failed(err) = ev;
        tracing::error!(error = %err, "lease store commit failed; unacknowledged changes discarded, reloading from disk");
        let mut delay = Duration::from_millis(200);
        loop {
            match self.writer.resync().await {
                Ok(rows) => {
                    let mut alloc = Allocator::new(&self.cfg);
                    alloc.set_term(self.alloc.term());
                    alloc.load_with_marks(rows.into_iter().map(|r| (r.binding, r.peer_synced_version)));
                    self.alloc = alloc;
                    // Failures queued behind this one are covered by the reload.
                    while self.writer_events.try_recv().is_ok() {}
                    return;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the lease store; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// Displays an optional client lazily (formatted only if the log line is enabled).
struct Owner<'a>(Option<&'a crate::lease::ClientKey>);

impl std::fmt::Display for Owner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(c) => c.fmt(f),
            None => f.write_str("-"),
        }
    }
}

fn log_transition(t: &crate::lease::Transition) {
    let b = &t.new;
    let client = Owner(b.owner.as_ref());
    match b.state {
        LeaseState::Leased => tracing::info!(address = %b.addr, %client, expires = b.expires, term = b.term, hostname = b.hostname.as_deref().unwrap_or("-"), "lease granted"),
        LeaseState::Declined => tracing::warn!(address = %b.addr, until = b.expires, "address quarantined (declined or in use)"),
        LeaseState::Free if t.expect_owner.is_some() => tracing::debug!(address = %b.addr, %client, "address freed"),
        _ => tracing::trace!(address = %b.addr, state = b.state.name(), "transition"),
    }
}
