//! The tokio task that runs the election machine against a real backend.
//!
//! Two tasks: the *driver* owns the machine and the role channel and never waits on the network;
//! the *worker* owns the backend and runs one call at a time under the deadline the machine set
//! (at most I). A late or hung arbiter therefore can never delay a demotion: the driver wakes at
//! the lease end whatever the worker is doing. The role itself also carries the lease end, so
//! the DHCP path stops on time even if this task is late (see `role.rs`).
//!
//! The partner's votes travel on the peer link (`peer.rs`): the driver feeds the machine what
//! arrives and sends what the machine asks, recording a granted promise on disk
//! (`promise.rs`) before its answer leaves. The driver decides nothing itself; the only check
//! it adds is the one the machine leaves to its caller, that `partner-down` is refused while the
//! peer link is up.
//!
//! Every role change is logged with CLOCK_MONOTONIC timestamps (`mono_ns`, the same kernel clock
//! in every network namespace): a promotion's stamp is read *before* the role is published and
//! a demotion's *after*, so the logged interval always contains the real one.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::backend::{ArbiterError, Backend, Beat, Claim, HolderRow};
use super::machine::{Call, DemoteReason, Effect, Elector, HaltReason, PromiseAsk, Reply};
use super::peer::{PeerEvent, PeerVotes};
use super::promise::{PromiseFile, PromiseWriter};
use super::{Params, Uuid};
use crate::clock;
use crate::events::{EventKind, Events};
use crate::role::{Role, RoleTx};
use crate::sync::protocol::Vote;

#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error(transparent)]
    Arbiter(#[from] ArbiterError),
    #[error(transparent)]
    Halted(#[from] HaltReason),
    #[error("the election's arbiter worker stopped")]
    WorkerStopped,
}

pub struct Election<B: Backend> {
    backend: B,
    params: Params,
    claim: Claim,
}

impl<B: Backend> Election<B> {
    /// A new participant with a fresh uuid (seed step 1: one per process start).
    pub fn new(backend: B, params: Params, utype: &str, name: &str, endpoint: &str) -> Election<B> {
        let claim = Claim {
            utype: utype.into(),
            uuid: Uuid::new_v4(),
            name: name.into(),
            endpoint: endpoint.into(),
            timeout_ms: params.timeout.as_millis() as u64,
            min_term: 0,
        };
        Election { backend, params, claim }
    }

    pub fn uuid(&self) -> Uuid {
        self.claim.uuid
    }

    /// At start-up: the row's T must equal ours. An unreachable arbiter is not an error here
    /// (the box stays standby and keeps trying); a mismatch is.
    pub async fn startup_check(&mut self) -> Result<(), ElectionError> {
        // Bounded by T as well: an unreachable arbiter must not hold up the DHCP service start.
        let limit = super::backend::CONNECT_TIMEOUT.min(self.params.timeout);
        match tokio::time::timeout(limit, self.backend.read(&self.claim.utype)).await {
            Ok(Ok(Some(row))) if row.timeout_ms != self.claim.timeout_ms => {
                let (utype, row_ms, ours_ms) = (self.claim.utype.clone(), row.timeout_ms, self.claim.timeout_ms);
                Err(HaltReason::TimeoutMismatch { utype, row_ms, ours_ms }.into())
            }
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "arbiter unreachable at start-up; standing by until it answers");
                Ok(())
            }
            Err(_) => {
                self.backend.reset();
                tracing::warn!("arbiter did not answer at start-up; standing by until it does");
                Ok(())
            }
        }
    }

    /// Runs until a fatal mismatch. The role starts (and stays, on return) Standby. While
    /// `hooks.eligible` says false this box does not stand (and steps down if active).
    pub async fn run(self, hooks: ElectionHooks) -> ElectionError {
        let Election { backend, params, claim } = self;
        let ElectionHooks { role, mut eligible, mut commands, view, events, mut peer, mut promises } = hooks;
        role.send_replace(Role::Standby);
        let (call_tx, call_rx) = mpsc::channel(4);
        let (reply_tx, mut reply_rx) = mpsc::channel(4);
        let worker = tokio::spawn(worker(backend, claim.clone(), call_rx, reply_tx));
        let now = clock::boottime();
        let bound = bound_at_start(&mut promises, now, params.timeout);
        let machine = Elector::new(params, claim.uuid, &claim.utype, now).with_promise(bound);
        let mut d = Driver {
            machine,
            claim: claim.clone(),
            role,
            calls: call_tx,
            view,
            events,
            peer: peer.as_ref().map(|_| PeerState::default()),
            promises: promises.map(PromiseWriter::spawn),
            timeout: params.timeout,
            basis: None,
        };
        let (timeout_ms, interval_ms) = (claim.timeout_ms, params.interval.as_millis() as u64);
        tracing::info!(uuid = %claim.uuid, utype = %claim.utype, interval_ms, timeout_ms, partner_votes = peer.is_some(), "election started");
        let (mut watching, mut listening) = (true, true);
        d.machine.set_eligible(clock::boottime(), *eligible.borrow_and_update());
        let result = loop {
            let effects = d.machine.poll(clock::boottime());
            if let Err(e) = d.apply(effects) {
                break e;
            }
            let wait = d.machine.wake_at().saturating_sub(clock::boottime());
            let effects = tokio::select! {
                got = reply_rx.recv() => {
                    let Some(done) = got else { break ElectionError::WorkerStopped };
                    d.observe(&done);
                    let third = d.third_box(&done.reply);
                    let mut fx = d.machine.on_reply(clock::boottime(), done.id, done.reply);
                    if let Some(third) = third {
                        fx.extend(d.machine.set_third_box(clock::boottime(), third));
                    }
                    fx
                }
                got = next_peer_event(&mut peer) => match got {
                    Some(ev) => d.on_peer(ev),
                    None => {
                        // The replication driver is gone (the service is stopping): no more votes.
                        peer = None;
                        d.on_peer(PeerEvent::Down)
                    }
                },
                changed = eligible.changed(), if watching => {
                    // A dropped sender leaves the last value in force.
                    watching = changed.is_ok();
                    d.machine.set_eligible(clock::boottime(), *eligible.borrow_and_update())
                }
                command = commands.recv(), if listening => match command {
                    Some(ElectionCommand::StepDown { reply }) => {
                        let was_active = d.machine.active_term(clock::boottime()).is_some();
                        let _ = reply.send(was_active);
                        d.machine.step_down(clock::boottime())
                    }
                    Some(ElectionCommand::PartnerDown { by, reply }) => d.partner_down(&by, reply),
                    None => {
                        listening = false;
                        Vec::new()
                    }
                },
                _ = tokio::time::sleep(wait) => Vec::new(),
            };
            if let Err(e) = d.apply(effects) {
                break e;
            }
            if let Some(p) = &peer {
                d.send_votes(p);
            }
        };
        d.role.send_replace(Role::Standby);
        worker.abort();
        tracing::error!(error = %result, "election stopped; this box will not serve");
        result
    }
}

/// What the election shares with the rest of the daemon.
pub struct ElectionHooks {
    /// The role the DHCP path checks before every reply.
    pub role: RoleTx,
    /// Whether this box may stand (its store commits, it is not in maintenance).
    pub eligible: watch::Receiver<bool>,
    /// Operator actions (the control socket).
    pub commands: mpsc::Receiver<ElectionCommand>,
    /// What the election knows, for the status socket.
    pub view: watch::Sender<ElectionView>,
    pub events: Events,
    /// The partner's votes on the peer link (None: no partner, the arbiter alone decides).
    pub peer: Option<PeerVotes>,
    /// Where granted promises are recorded (None: this box never grants one).
    pub promises: Option<PromiseFile>,
}

/// An operator action for the election.
#[derive(Debug)]
pub enum ElectionCommand {
    /// Hand service to the partner now (demote, release the row, hold off for T). Answers
    /// whether this box was active.
    StepDown { reply: oneshot::Sender<bool> },
    /// The operator (`by`) has seen that the partner is off: become active without its vote or
    /// the arbiter's. Refused while the peer link is up. Answers what happened, or why not.
    PartnerDown { by: String, reply: oneshot::Sender<Result<String, String>> },
}

/// The election as the status socket shows it. Instants are CLOCK_BOOTTIME.
#[derive(Debug, Clone, Default)]
pub struct ElectionView {
    pub eligible: bool,
    pub lease_until: Option<Duration>,
    pub hold_off_until: Option<Duration>,
    /// When the last heartbeat the arbiter confirmed came back.
    pub last_confirmed: Option<Duration>,
    pub last_rtt: Option<Duration>,
    pub calls: u64,
    pub failed_calls: u64,
    /// Whether the last call got an answer.
    pub reachable: bool,
    pub last_error: Option<String>,
    /// The holder as last read from the arbiter (None: nobody, or not read yet).
    pub primary: Option<HolderRow>,
    /// Times this box became active.
    pub promotions: u64,
    /// Why this box is active ([`super::Basis::describe`]); None while standby.
    pub basis: Option<&'static str>,
    /// Whether a session with the partner is up on the peer link.
    pub partner_link: bool,
    /// The end of this box's promise not to become active, while one runs.
    pub promised_until: Option<Duration>,
    /// A third box holding this utype's row (neither this box nor its partner), by name.
    pub third_box: Option<String>,
}

/// A finished arbiter call, as the worker reports it.
struct Done {
    id: u64,
    reply: Reply,
    rtt: Duration,
}

/// An arbiter call for the worker: the machine's call, its deadline, and the heartbeat's term
/// floor at the moment the machine asked for it.
struct Outgoing {
    id: u64,
    call: Call,
    deadline: Duration,
    min_term: u64,
}

/// What the driver knows of the peer link.
#[derive(Default)]
struct PeerState {
    up: bool,
    /// The partner's node name, as it proved it on the link.
    partner: Option<String>,
    /// Votes the machine asked for, sent after its effects are carried out.
    outbox: Vec<Vote>,
}

/// The driver's side: the machine, and where its effects go.
struct Driver {
    machine: Elector,
    /// What this box writes into the row (it is the holder the view names while active).
    claim: Claim,
    role: RoleTx,
    calls: mpsc::Sender<Outgoing>,
    view: watch::Sender<ElectionView>,
    events: Events,
    peer: Option<PeerState>,
    promises: Option<PromiseWriter>,
    timeout: Duration,
    /// The basis last logged, to log its changes while the role stays.
    basis: Option<&'static str>,
}

/// How long a starting process stays bound by what an earlier one may have promised (see
/// `promise.rs`); records that, so a later restart in this boot finds a record. A box whose
/// record cannot be written gives no promises at all.
fn bound_at_start(promises: &mut Option<PromiseFile>, now: Duration, timeout: Duration) -> Option<Duration> {
    let bound = promises.as_ref().and_then(|p| p.load().bound_until(now, timeout));
    if let Some(p) = promises.as_mut()
        && let Err(e) = p.record(bound.unwrap_or(now), Duration::ZERO)
    {
        tracing::error!(error = %e, "the standby promise cannot be recorded: this box gives the partner no vote");
        *promises = None;
    }
    if let Some(until) = bound {
        let wait_ms = (until - now).as_millis() as u64;
        tracing::info!(wait_ms, "bound by an earlier process's promise (or none recorded): not standing until it ends");
    }
    bound
}

async fn next_peer_event(peer: &mut Option<PeerVotes>) -> Option<PeerEvent> {
    match peer {
        Some(p) => p.recv().await,
        None => std::future::pending().await,
    }
}

impl Driver {
    /// Records a finished call in the view.
    fn observe(&self, done: &Done) {
        let now = clock::boottime();
        self.view.send_modify(|v| {
            v.calls += 1;
            v.last_rtt = Some(done.rtt);
            match &done.reply {
                Reply::Failed(why) => {
                    v.failed_calls += 1;
                    v.reachable = false;
                    v.last_error = Some(why.clone());
                }
                Reply::Read(row) => {
                    v.reachable = true;
                    v.primary = row.clone().filter(|r| r.live);
                }
                Reply::Beat(Beat::Applied { term, ts_us }) => {
                    v.reachable = true;
                    v.last_confirmed = Some(now);
                    let c = &self.claim;
                    v.primary = Some(HolderRow {
                        utype: c.utype.clone(),
                        uuid: c.uuid,
                        name: c.name.clone(),
                        endpoint: c.endpoint.clone(),
                        term: *term,
                        timeout_ms: c.timeout_ms,
                        ts_us: *ts_us,
                        age_ms: 0,
                        live: true,
                    });
                }
                Reply::Beat(_) | Reply::Released(_) => v.reachable = true,
            }
        });
    }

    fn apply(&mut self, effects: Vec<Effect>) -> Result<(), ElectionError> {
        for e in effects {
            match e {
                Effect::Send { id, call, deadline } => {
                    let min_term = self.machine.heartbeat_term();
                    if self.calls.try_send(Outgoing { id, call, deadline, min_term }).is_err() {
                        // The worker is behind (a call stuck past its deadline). The machine
                        // treats the missing answer as a failed call when the deadline passes.
                        tracing::debug!(?call, "arbiter worker busy; call skipped");
                    }
                }
                Effect::Active { term, until, renewed } => self.activate(term, until, renewed),
                Effect::Demoted(why) => self.demote(&why),
                Effect::Halt(why) => return Err(why.into()),
                Effect::AskPartner(PromiseAsk { uuid, id, term, active }) => {
                    self.queue(Vote::Ask { uuid: uuid.as_u128(), id, term, active });
                }
                Effect::AnswerPartner { to, id, granted, term, promised_until } => {
                    let granted = granted && self.record_promise(promised_until);
                    self.queue(Vote::Answer { to: to.as_u128(), id, granted, term });
                }
                Effect::ReleasePartner { up_to } => {
                    self.queue(Vote::Release { from: self.claim.uuid.as_u128(), up_to })
                }
            }
        }
        let now = clock::boottime();
        let basis = self.machine.basis(now).map(|b| b.describe());
        if basis.is_some() && self.basis.is_some() && basis != self.basis {
            let (was, now_why) = (self.basis.unwrap_or_default(), basis.unwrap_or_default());
            tracing::info!(
                was,
                why = now_why,
                mono_ns = clock::monotonic().as_nanos() as u64,
                "still active, on another basis"
            );
            self.events.record(EventKind::Role, format!("active on {now_why} (was {was})"));
        }
        self.basis = basis;
        let third = self.machine.third_box().then(|| {
            let v = self.view.borrow();
            v.primary.as_ref().map(|p| p.name.clone()).unwrap_or_default()
        });
        let now_view = (
            self.machine.lease_end(),
            self.machine.holding_off(now),
            self.machine.is_eligible(),
            basis,
            self.peer.as_ref().is_some_and(|p| p.up),
            self.machine.promised_until(now),
            third,
        );
        self.view.send_if_modified(|v| {
            let old = (
                v.lease_until,
                v.hold_off_until,
                v.eligible,
                v.basis,
                v.partner_link,
                v.promised_until,
                v.third_box.clone(),
            );
            let changed = old != now_view;
            (v.lease_until, v.hold_off_until, v.eligible, v.basis, v.partner_link, v.promised_until, v.third_box) =
                now_view;
            changed
        });
        Ok(())
    }

    fn queue(&mut self, vote: Vote) {
        if let Some(p) = self.peer.as_mut().filter(|p| p.up) {
            p.outbox.push(vote);
        }
    }

    fn send_votes(&mut self, link: &PeerVotes) {
        if let Some(p) = self.peer.as_mut() {
            for v in p.outbox.drain(..) {
                link.send(v);
            }
        }
    }

    /// A grant binds this box until `until`: on disk before the answer leaves, or no grant
    /// (the machine stays bound all the same, which only errs on the safe side). The record
    /// runs up to 2T ahead, so the partner's requests every I usually find it written.
    fn record_promise(&mut self, until: Option<Duration>) -> bool {
        let (Some(until), Some(file)) = (until, self.promises.as_mut()) else { return false };
        let covered = file.covers(until, self.timeout * 2);
        if !covered {
            tracing::debug!("standby promise not on disk yet: this answer is a refusal");
        }
        covered
    }

    /// A peer-link event for the machine.
    fn on_peer(&mut self, ev: PeerEvent) -> Vec<Effect> {
        let now = clock::boottime();
        let Some(p) = self.peer.as_mut() else { return Vec::new() };
        match ev {
            PeerEvent::Up { partner } => {
                p.up = true;
                p.partner = Some(partner);
                // The partner will ask at once: have a record ready so the first answer can
                // be a grant.
                if let Some(file) = self.promises.as_mut() {
                    file.covers(now + self.timeout, self.timeout * 2);
                }
                Vec::new()
            }
            PeerEvent::Down => {
                p.up = false;
                p.outbox.clear();
                Vec::new()
            }
            PeerEvent::Vote(Vote::Ask { uuid, id, term, active }) => {
                self.machine.on_partner_ask(now, PromiseAsk { uuid: Uuid::from_u128(uuid), id, term, active })
            }
            PeerEvent::Vote(Vote::Answer { to, id, granted, term }) if to == self.claim.uuid.as_u128() => {
                self.machine.on_partner_answer(now, id, granted, term)
            }
            // An answer to an earlier process of this box.
            PeerEvent::Vote(Vote::Answer { .. }) => Vec::new(),
            PeerEvent::Vote(Vote::Release { from, up_to }) => {
                self.machine.on_partner_release(Uuid::from_u128(from), up_to);
                Vec::new()
            }
        }
    }

    /// Whether the live row `reply` read names a third box (None: the reply says nothing new).
    fn third_box(&self, reply: &Reply) -> Option<bool> {
        let Reply::Read(row) = reply else { return None };
        let Some(r) = row.as_ref().filter(|r| r.live) else { return Some(false) };
        let partner = self.peer.as_ref().and_then(|p| p.partner.as_deref());
        let third = r.name != self.claim.name && partner.is_some_and(|p| r.name != p);
        if third && !self.machine.third_box() {
            tracing::error!(
                holder = %r.name, utype = %r.utype,
                "the arbiter names a third box for this utype (neither this box nor its partner): partner votes are off until it goes; give each pair its own utype"
            );
        }
        Some(third)
    }

    /// The operator says the partner is off. Refused while the peer link is up: the partner is
    /// evidently not off, and two boxes would serve.
    fn partner_down(&mut self, by: &str, reply: oneshot::Sender<Result<String, String>>) -> Vec<Effect> {
        let now = clock::boottime();
        if self.peer.as_ref().is_some_and(|p| p.up) {
            let _ = reply.send(Err(
                "refused: the partner is reachable on the peer link, so it is not off; nothing was changed".into(),
            ));
            return Vec::new();
        }
        let effects = self.machine.partner_down(now);
        let answer = match self.machine.basis(now) {
            Some(b) if b.operator => {
                tracing::warn!(%by, mono_ns = clock::monotonic().as_nanos() as u64, "partner declared down by the operator: active without the partner's or the arbiter's vote");
                self.events.record(EventKind::Role, format!("partner declared down by {by}"));
                Ok("this box is active on the operator's word (partner-down) until the partner is heard from again".into())
            }
            _ if self.machine.third_box() => Err("refused: the arbiter names a third box for this utype".into()),
            _ => Err("refused: this box may not stand now (bound by its promise to the partner, holding off after a step-down, or not eligible); try again in T".into()),
        };
        let _ = reply.send(answer);
        effects
    }

    fn activate(&mut self, term: u64, until: Duration, renewed: bool) {
        // Duration::MAX: on the operator's word, without a lease end.
        let lease = (until != Duration::MAX).then_some(until);
        let until_mono = lease.map_or(u64::MAX, |u| clock::boot_to_mono(u).as_nanos() as u64);
        if renewed {
            self.role.send_replace(Role::Active { term, until: lease });
            tracing::debug!(term, until_mono_ns = until_mono, "lease renewed");
            return;
        }
        let current = *self.role.borrow();
        if let Role::Active { term: was, .. } = current {
            // Active all along (the arbiter came back and its row took a new term): no gap,
            // and no role change; lease sync stamps the new term from here on.
            self.role.send_replace(Role::Active { term, until: lease });
            tracing::info!(term, was, until_mono_ns = until_mono, "lease renewed, term advanced while active");
            self.events.record(EventKind::Role, format!("still active, term {was} → {term}"));
            return;
        }
        let mono = clock::monotonic().as_nanos() as u64;
        self.role.send_replace(Role::Active { term, until: lease });
        let why = self.machine.basis(clock::boottime()).map_or("no vote", |b| b.describe());
        tracing::info!(role = "active", term, mono_ns = mono, until_mono_ns = until_mono, why, "role change");
        self.events.record(EventKind::Role, format!("active, term {term} ({why})"));
        self.view.send_modify(|v| v.promotions += 1);
    }

    fn demote(&mut self, why: &DemoteReason) {
        self.role.send_replace(Role::Standby);
        let mono = clock::monotonic().as_nanos() as u64;
        let reason = match why {
            DemoteReason::LeaseExpired => "lease expired without a confirmed heartbeat".to_string(),
            DemoteReason::HeartbeatRejected => "the arbiter rejected our heartbeat".to_string(),
            DemoteReason::ArbiterNamed(Some(u)) => format!("the arbiter names {u} as primary"),
            DemoteReason::ArbiterNamed(None) => "the arbiter names no primary".to_string(),
            DemoteReason::Ineligible => "this box may not serve (lease store failing, or maintenance)".to_string(),
            DemoteReason::SteppedDown => "stepped down: service handed to the partner".to_string(),
        };
        tracing::warn!(role = "standby", mono_ns = mono, %reason, "role change");
        self.events.record(EventKind::Role, format!("standby: {reason}"));
    }
}

/// Runs each call under its deadline; an abandoned call drops the connection.
async fn worker<B: Backend>(
    mut backend: B,
    claim: Claim,
    mut calls: mpsc::Receiver<Outgoing>,
    replies: mpsc::Sender<Done>,
) {
    let mut last_error: Option<String> = None;
    let mut claim = claim;
    while let Some(Outgoing { id, call, deadline, min_term }) = calls.recv().await {
        claim.min_term = min_term;
        let started = clock::boottime();
        let left = deadline.saturating_sub(started);
        let (utype, uuid) = (&claim.utype, claim.uuid);
        let outcome = match call {
            Call::Read => tokio::time::timeout(left, backend.read(utype)).await.map(|r| r.map(Reply::Read)),
            Call::Heartbeat => tokio::time::timeout(left, backend.heartbeat(&claim)).await.map(|r| r.map(Reply::Beat)),
            Call::Release => {
                tokio::time::timeout(left, backend.release(utype, uuid)).await.map(|r| r.map(Reply::Released))
            }
        };
        let reply = match outcome {
            Ok(Ok(r)) => {
                if last_error.take().is_some() {
                    tracing::info!("arbiter reachable again");
                }
                r
            }
            Ok(Err(e)) => {
                let msg = e.to_string();
                if last_error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(error = %msg, ?call, "arbiter call failed");
                }
                last_error = Some(msg.clone());
                Reply::Failed(msg)
            }
            Err(_) => {
                backend.reset();
                let msg = "no answer before the call's deadline".to_string();
                if last_error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(?call, "arbiter call timed out");
                }
                last_error = Some(msg.clone());
                Reply::Failed(msg)
            }
        };
        let rtt = clock::boottime().saturating_sub(started);
        if replies.send(Done { id, reply, rtt }).await.is_err() {
            return;
        }
    }
}
