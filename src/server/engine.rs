//! The task that owns the allocator: it feeds requests to the decision code with the current
//! time, hands the resulting transitions to the store writer (and, through the replication
//! driver, to the partner), and sends or schedules the replies. It also runs the reaper and
//! recovers from store failures (`recovery.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dhcproto::v4::MessageType;
use tokio::sync::{mpsc, oneshot, watch};

use super::ping::Pinger;
use super::replication::{Replication, ReplicationInputs};
use crate::allocator::Allocator;
use crate::clock::unix_now;
use crate::config::Config;
use crate::dhcp::{self, Answer, Decision, Ingress, PendingOffer, Reply, Request, Silence};
use crate::events::Events;
use crate::lease::{Binding, ClientKey, LeaseState, Transition};
use crate::logging::Summarised;
use crate::role::{Role, RoleRx};
use crate::store::writer::AfterCommit;
use crate::store::{StoreWriter, WriterEvent};

pub enum Input {
    Packet { req: Box<Request>, ingress: Ingress, socket: usize },
    ProbeDone { pending: PendingOffer, socket: usize, answered: bool },
}

/// The engine's two input lanes. DISCOVERs wait in a lane of their own, and everything else
/// (REQUESTs, RELEASEs, DECLINEs, INFORMs, probe results) goes first: a REQUEST completes a
/// handshake an OFFER began, so under a DISCOVER flood it must not queue behind the flood
/// (its offer would be reclaimed for the flood before it got its turn). Order within a lane,
/// and so per client, is kept: a client sends its REQUEST only after our OFFER.
#[derive(Clone)]
pub struct Inbox {
    first: mpsc::Sender<Input>,
    discovers: mpsc::Sender<Input>,
}

impl Inbox {
    fn lane(&self, input: &Input) -> &mpsc::Sender<Input> {
        match input {
            Input::Packet { req, .. } if req.kind == MessageType::Discover => &self.discovers,
            _ => &self.first,
        }
    }

    /// Queues `input` unless its lane is full.
    pub fn try_send(&self, input: Input) -> Result<(), mpsc::error::TrySendError<Input>> {
        self.lane(&input).try_send(input)
    }

    /// Whether the engine has gone (nothing will read what is queued).
    pub fn is_closed(&self) -> bool {
        self.first.is_closed()
    }

    /// Queues `input`, waiting for room.
    pub async fn send(&self, input: Input) -> Result<(), mpsc::error::SendError<Input>> {
        self.lane(&input).send(input).await
    }
}

/// The receiving ends of an [`Inbox`].
struct Lanes {
    first: mpsc::Receiver<Input>,
    discovers: mpsc::Receiver<Input>,
}

impl Lanes {
    /// The next input, from the first lane whenever it has one.
    async fn next(&mut self) -> Option<Input> {
        if let Ok(i) = self.first.try_recv() {
            return Some(i);
        }
        tokio::select! {
            biased;
            i = self.first.recv() => i,
            i = self.discovers.recv() => i,
        }
    }

    /// The next input if one is queued, from the first lane whenever it has one.
    fn try_next(&mut self) -> Option<Input> {
        self.first.try_recv().or_else(|_| self.discovers.try_recv()).ok()
    }
}

/// Where a reply leaves: a DHCP socket (`socket::ReplySender`), or a capture in tests.
pub trait Transmit: Send + Sync {
    /// Sends `reply`; `false` if it could not be sent.
    fn transmit(&self, reply: &Reply) -> bool;
}

/// Counters for status displays, the watchdog and the benchmark.
#[derive(Debug)]
pub struct EngineStats {
    pub received: AtomicU64,
    /// Broadcasts on a served interface that reached the relay socket as well (skipped there;
    /// the socket filter keeps this near 0).
    pub duplicates: AtomicU64,
    /// Datagrams that were not a usable DHCP request.
    pub malformed: AtomicU64,
    /// Requests by message type.
    pub requests: [(&'static str, AtomicU64); 6],
    pub dropped_not_active: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub offers: AtomicU64,
    pub acks: AtomicU64,
    pub naks: AtomicU64,
    pub exhausted: AtomicU64,
    /// OFFERs of an address taken from another client's unrequested offer (pool exhausted).
    pub reclaimed: AtomicU64,
    pub leases: AtomicU64,
    /// Monotonic milliseconds since start when the engine loop last went round.
    pub alive_ms: AtomicU64,
}

impl Default for EngineStats {
    fn default() -> Self {
        let zero = AtomicU64::default;
        EngineStats {
            received: zero(),
            duplicates: zero(),
            malformed: zero(),
            requests: ["discover", "request", "decline", "release", "inform", "other"].map(|k| (k, zero())),
            dropped_not_active: zero(),
            dropped_queue_full: zero(),
            offers: zero(),
            acks: zero(),
            naks: zero(),
            exhausted: zero(),
            reclaimed: zero(),
            leases: zero(),
            alive_ms: zero(),
        }
    }
}

impl EngineStats {
    pub fn count_request(&self, kind: MessageType) {
        let i = match kind {
            MessageType::Discover => 0,
            MessageType::Request => 1,
            MessageType::Decline => 2,
            MessageType::Release => 3,
            MessageType::Inform => 4,
            _ => 5,
        };
        self.requests[i].1.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the engine publishes once a second for the status socket.
#[derive(Debug, Clone, Default)]
pub struct EngineSnapshot {
    /// Per subnet, in configuration order: addresses per lease state (by `LeaseState::code`).
    pub usage: Vec<[usize; 5]>,
    /// Bindings the partner does not hold yet (0 without a partner).
    pub unsynced: usize,
}

/// An operator action carried out on the engine task.
#[derive(Debug)]
pub enum EngineCommand {
    /// Forget what the partner is known to hold and fetch its whole table again.
    SyncFromPartner { reply: oneshot::Sender<bool> },
    /// Serve with this configuration from now on (only the parts that can change live differ).
    Reload { cfg: Arc<Config>, reply: oneshot::Sender<()> },
}

/// What the rest of the daemon keeps of a spawned engine.
pub struct EngineHandle {
    pub inbox: Inbox,
    pub stats: Arc<EngineStats>,
    pub snapshot: watch::Receiver<EngineSnapshot>,
    pub commands: mpsc::Sender<EngineCommand>,
    /// Stops the engine, which then drops its store writer handle.
    pub stop: oneshot::Sender<()>,
}

pub struct Engine {
    pub(super) cfg: Arc<Config>,
    pub(super) alloc: Allocator,
    pub(super) writer: StoreWriter,
    pub(super) writer_events: mpsc::UnboundedReceiver<WriterEvent>,
    senders: Vec<Arc<dyn Transmit>>,
    pinger: Option<Arc<Pinger>>,
    role: RoleRx,
    inbox: Lanes,
    inbox_tx: Inbox,
    stats: Arc<EngineStats>,
    snapshot: watch::Sender<EngineSnapshot>,
    commands: mpsc::Receiver<EngineCommand>,
    pub(super) events: Events,
    started: Instant,
    stop: oneshot::Receiver<()>,
    ticks: u64,
    /// Lease sync with the partner box, when `[peer]` is configured.
    pub(super) replication: Option<Replication>,
    replication_inputs: Option<ReplicationInputs>,
    flood_log: FloodLog,
}

/// The warnings a flood of requests repeats once per packet, each written once and then
/// summarised per window (the status counters keep the exact numbers).
struct FloodLog {
    exhausted: Summarised,
    reclaimed: Summarised,
    nak: Summarised,
}

/// The summary window of [`FloodLog`]: at most two lines per kind per window.
const FLOOD_LOG_WINDOW: Duration = Duration::from_secs(10);

impl FloodLog {
    fn new() -> FloodLog {
        let w = || Summarised::new(FLOOD_LOG_WINDOW);
        FloodLog { exhausted: w(), reclaimed: w(), nak: w() }
    }

    /// Writes the summary of every kind whose window is over.
    fn summarise(&mut self, now: Instant) {
        let secs = FLOOD_LOG_WINDOW.as_secs();
        if let Some(n) = self.exhausted.summary(now) {
            tracing::warn!(refused = n, "pool exhausted: {n} DISCOVERs refused in the last {secs} s");
        }
        if let Some(n) = self.reclaimed.summary(now) {
            tracing::warn!(
                reclaimed = n,
                "pool full of unrequested offers: {n} offers reclaimed for new clients in the last {secs} s"
            );
        }
        if let Some(n) = self.nak.summary(now) {
            tracing::info!(naks = n, "DHCPNAK: {n} more REQUESTs refused in the last {secs} s");
        }
    }
}

/// Requests waiting for the engine, per lane; beyond this the receive threads drop (clients retry). Kept
/// short on purpose: under overload a long queue only means answering requests whose clients
/// have given up (≈0.2 s of work at 10,000 requests/s).
pub const INBOX: usize = 2048;

/// Inputs handled in one turn of the engine's loop before it looks at its other events (role
/// changes, the writer's reports, commands): about 2 ms of work at most.
const INPUTS_PER_TURN: usize = 64;

/// Reaper batch: bounded so one transaction stays short.
const REAP_BATCH: usize = 1024;

/// Heartbeats and sync deadlines are checked this often (a tenth of the shortest one).
const SYNC_TICK: Duration = Duration::from_millis(20);

impl Engine {
    /// An engine over `alloc` (loaded from the store `writer` writes), replying through
    /// `senders` (indexed by the socket a request came in on).
    pub fn new(
        cfg: Arc<Config>,
        alloc: Allocator,
        (writer, writer_events): (StoreWriter, mpsc::UnboundedReceiver<WriterEvent>),
        senders: Vec<Arc<dyn Transmit>>,
        role: RoleRx,
    ) -> (Engine, EngineHandle) {
        let (first, first_rx) = mpsc::channel(INBOX);
        let (discovers, discovers_rx) = mpsc::channel(INBOX);
        let (inbox_tx, inbox) = (Inbox { first, discovers }, Lanes { first: first_rx, discovers: discovers_rx });
        let (stop_tx, stop) = oneshot::channel();
        let (commands_tx, commands) = mpsc::channel(4);
        let (snapshot, snapshot_rx) = watch::channel(EngineSnapshot::default());
        let stats = Arc::new(EngineStats::default());
        let engine = Engine {
            cfg,
            alloc,
            writer,
            writer_events,
            senders,
            pinger: None,
            role,
            inbox,
            inbox_tx: inbox_tx.clone(),
            stats: stats.clone(),
            snapshot,
            commands,
            events: Events::default(),
            started: Instant::now(),
            stop,
            ticks: 0,
            replication: None,
            replication_inputs: None,
            flood_log: FloodLog::new(),
        };
        let handle =
            EngineHandle { inbox: inbox_tx, stats, snapshot: snapshot_rx, commands: commands_tx, stop: stop_tx };
        (engine, handle)
    }

    /// Probes fresh addresses with ICMP before offering them.
    pub fn with_pinger(mut self, pinger: Arc<Pinger>) -> Engine {
        self.pinger = Some(pinger);
        self
    }

    /// Records store faults and operator actions in this ring.
    pub fn with_events(mut self, events: Events) -> Engine {
        self.events = events;
        self
    }

    /// Replicates to the partner.
    pub fn with_replication(mut self, (replication, inputs): (Replication, ReplicationInputs)) -> Engine {
        self.replication = Some(replication);
        self.replication_inputs = Some(inputs);
        self
    }

    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sync_tick = tokio::time::interval(SYNC_TICK);
        sync_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut link_events, mut applied) = match self.replication_inputs.take() {
            Some(i) => (Some(i.link_events), Some(i.applied)),
            None => (None, None),
        };
        self.apply_role();
        loop {
            #[cfg(feature = "fault-injection")]
            super::fault::engine_checkpoint();
            self.stats.alive_ms.store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
            tokio::select! {
                _ = &mut self.stop => break,
                input = self.inbox.next() => match input {
                    Some(i) => {
                        self.on_input(i);
                        // What queued meanwhile (the receive threads hand requests over in
                        // bunches under load), without going round every branch for each.
                        for _ in 1..INPUTS_PER_TURN {
                            let Some(i) = self.inbox.try_next() else { break };
                            self.on_input(i);
                        }
                    }
                    None => break,
                },
                Some(ev) = self.writer_events.recv() => self.on_writer_event(ev).await,
                changed = self.role.changed() => {
                    if changed.is_err() { break; }
                    self.apply_role();
                }
                _ = tick.tick() => self.housekeeping(),
                Some(c) = self.commands.recv() => self.on_command(c),
                Some(ev) = recv_opt(link_events.as_mut()) => {
                    if let Some(r) = self.replication.as_mut() {
                        r.on_link_event(&mut self.alloc, &self.writer, ev);
                    }
                }
                Some(a) = recv_opt(applied.as_mut()) => {
                    if let Some(r) = self.replication.as_mut() {
                        r.on_applied(&mut self.alloc, &self.writer, a);
                    }
                }
                _ = sync_tick.tick(), if self.replication.is_some() => {
                    if let Some(r) = self.replication.as_mut() {
                        r.tick(&mut self.alloc, &self.writer);
                    }
                }
            }
        }
    }

    fn apply_role(&mut self) {
        let role = *self.role.borrow_and_update();
        if let Role::Active { term, .. } = role {
            self.alloc.set_term(term);
        }
        if let Some(r) = self.replication.as_mut() {
            r.set_term(role.term());
        }
    }

    fn on_input(&mut self, input: Input) {
        if !self.role.borrow().is_active() {
            self.stats.dropped_not_active.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let now = unix_now();
        let ping = self.pinger.is_some();
        let (decision, socket) = match input {
            Input::Packet { req, ingress, socket } => {
                (dhcp::handle(&self.cfg, &mut self.alloc, &req, &ingress, now, ping), socket)
            }
            Input::ProbeDone { pending, socket, answered } => {
                if answered {
                    tracing::warn!(address = %pending.addr, "address answered a ping but has no lease; quarantined");
                }
                (dhcp::after_probe(&self.cfg, &mut self.alloc, pending, answered, now), socket)
            }
        };
        self.carry_out(decision, socket);
    }

    fn carry_out(&mut self, decision: Decision, socket: usize) {
        let Decision { transitions, answer } = decision;
        for t in &transitions {
            log_transition(t);
        }
        match answer {
            Answer::Reply { reply, durable: true } => {
                let send = self.send_later(reply, socket, &transitions);
                // In before-ack mode the reply also waits for the partner (bounded).
                let send = self.replicate(&transitions, Some(send));
                self.writer.commit(transitions, send);
            }
            Answer::Reply { reply, durable: false } => {
                self.commit(transitions);
                self.send_later(reply, socket, &[])();
            }
            Answer::Reclaimed { reply, from } => {
                self.stats.reclaimed.fetch_add(1, Ordering::Relaxed);
                if self.flood_log.reclaimed.occurred(Instant::now()) {
                    let (address, to) = (reply.yiaddr, transitions_owner(&transitions, reply.yiaddr));
                    tracing::warn!(%address, %from, client = %to, "pool exhausted: an unrequested offer reclaimed for a new client");
                }
                self.commit(transitions);
                self.send_later(reply, socket, &[])();
            }
            Answer::Nak { reply, refused } => {
                self.commit(transitions);
                if self.flood_log.nak.occurred(Instant::now()) {
                    tracing::info!(address = %refused.addr, reason = refused.reason, "DHCPNAK");
                }
                self.send_later(reply, socket, &[])();
            }
            Answer::Probe(pending) => {
                self.commit(transitions);
                self.probe(pending, socket);
            }
            Answer::Silent(why) => {
                self.commit(transitions);
                self.log_silence(why);
            }
        }
    }

    /// Makes changes durable and sends them to the partner; nothing waits on them.
    fn commit(&mut self, transitions: Vec<Transition>) {
        if !transitions.is_empty() {
            self.replicate(&transitions, None);
            self.writer.commit(transitions, None);
        }
    }

    fn replicate(&mut self, transitions: &[Transition], reply: Option<AfterCommit>) -> Option<AfterCommit> {
        match self.replication.as_mut() {
            Some(r) => r.replicate(&mut self.alloc, &self.writer, transitions, reply),
            None => reply,
        }
    }

    /// The reply as an action to run later (after a commit, or now). It is counted and logged
    /// when, and only if, it leaves: an ACK whose commit fails, or that a demotion stops, was
    /// never granted.
    fn send_later(&self, reply: Reply, socket: usize, transitions: &[Transition]) -> AfterCommit {
        let sender = self.senders[socket].clone();
        let (role, stats) = (self.role.clone(), self.stats.clone());
        let granted = (reply.kind == MessageType::Ack)
            .then(|| transitions.iter().find(|t| t.new.addr == reply.yiaddr && t.new.state == LeaseState::Leased))
            .flatten()
            .map(|t| t.new.clone());
        Box::new(move || {
            // Re-checked at the last moment: a demotion during the commit wins.
            if !role.borrow().is_active() {
                stats.dropped_not_active.fetch_add(1, Ordering::Relaxed);
            } else if sender.transmit(&reply) {
                count_reply(&stats, reply.kind);
                if let Some(b) = granted {
                    log_granted(&b);
                }
            }
        })
    }

    fn probe(&self, pending: PendingOffer, socket: usize) {
        let (Some(pinger), tx) = (self.pinger.clone(), self.inbox_tx.clone()) else { return };
        let timeout = Duration::from_millis(self.cfg.dhcp.ping_timeout_ms);
        tokio::spawn(async move {
            let answered = pinger.probe(pending.addr, timeout).await;
            let _ = tx.send(Input::ProbeDone { pending, socket, answered }).await;
        });
    }

    fn log_silence(&mut self, why: Silence) {
        match why {
            Silence::PoolExhausted => {
                self.stats.exhausted.fetch_add(1, Ordering::Relaxed);
                if self.flood_log.exhausted.occurred(Instant::now()) {
                    tracing::warn!("pool exhausted: no address to offer");
                }
            }
            Silence::AliasHeldOff { group, holder } => {
                tracing::info!(%group, %holder, "alias group busy; request held off");
            }
            Silence::Declined { addr, client } => {
                tracing::warn!(address = %addr, %client, "address declined by the client (in use?): quarantined");
            }
            Silence::DeclineIgnored { addr, client } => {
                let limit = crate::allocator::DECLINES_PER_CLIENT;
                tracing::warn!(
                    address = %addr, %client, limit,
                    "DECLINE ignored: this client already declined its share of addresses within the probation period"
                );
            }
            Silence::ReservedUnavailable(a) => {
                tracing::warn!(address = %a, "reserved address is quarantined; not offered");
            }
            other => tracing::debug!(reason = ?other, "no reply"),
        }
    }

    fn housekeeping(&mut self) {
        self.flood_log.summarise(Instant::now());
        let now = unix_now();
        // Only the active box expires leases; a standby mirrors the active's table and would
        // otherwise race it with changes of its own.
        let mut more = self.role.borrow().is_active();
        while more {
            let batch = self.alloc.reap(now, REAP_BATCH);
            more = batch.len() == REAP_BATCH;
            for t in &batch {
                tracing::debug!(address = %t.new.addr, "expired; back in the queue");
            }
            self.commit(batch);
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
        let unsynced = if self.replication.is_some() { self.alloc.unsynced_count() } else { 0 };
        self.snapshot.send_replace(EngineSnapshot { usage: self.alloc.usage().to_vec(), unsynced });
    }

    fn on_command(&mut self, c: EngineCommand) {
        match c {
            EngineCommand::SyncFromPartner { reply } => {
                let started = self.replication.as_mut().map(Replication::sync_from_partner).is_some();
                let _ = reply.send(started);
            }
            EngineCommand::Reload { cfg, reply } => {
                self.alloc.set_policy(crate::allocator::Policy::from_config(&cfg));
                self.cfg = cfg;
                let _ = reply.send(());
            }
        }
    }
}

/// Waits on an optional receiver; never resolves without one.
async fn recv_opt<T>(rx: Option<&mut mpsc::UnboundedReceiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Displays an optional client lazily (formatted only if the log line is enabled).
struct Owner<'a>(Option<&'a ClientKey>);

impl std::fmt::Display for Owner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(c) => c.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// The client a change of `addr` among `transitions` gives it to (for the log).
fn transitions_owner(transitions: &[Transition], addr: std::net::Ipv4Addr) -> Owner<'_> {
    Owner(transitions.iter().rev().find(|t| t.new.addr == addr).and_then(|t| t.new.owner.as_ref()))
}

fn count_reply(stats: &EngineStats, kind: MessageType) {
    let c = match kind {
        MessageType::Offer => &stats.offers,
        MessageType::Ack => &stats.acks,
        MessageType::Nak => &stats.naks,
        _ => return,
    };
    c.fetch_add(1, Ordering::Relaxed);
}

fn log_granted(b: &Binding) {
    let (client, hostname) = (Owner(b.owner.as_ref()), b.hostname.as_deref().unwrap_or("-"));
    tracing::info!(address = %b.addr, %client, expires = b.expires, term = b.term, hostname, "lease granted");
}

fn log_transition(t: &Transition) {
    let b = &t.new;
    let client = Owner(b.owner.as_ref());
    match b.state {
        LeaseState::Leased => tracing::debug!(address = %b.addr, %client, expires = b.expires, "lease recorded"),
        LeaseState::Declined => {
            tracing::warn!(address = %b.addr, until = b.expires, "address quarantined (declined or in use)");
        }
        LeaseState::Free if t.expect_owner.is_some() => tracing::debug!(address = %b.addr, %client, "address freed"),
        _ => tracing::trace!(address = %b.addr, state = b.state.name(), "transition"),
    }
}
