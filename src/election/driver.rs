//! The tokio task that runs the election machine against a real backend.
//!
//! Two tasks: the *driver* owns the machine and the role channel and never waits on the network;
//! the *worker* owns the backend and runs one call at a time under the deadline the machine set
//! (at most I). A late or hung arbiter therefore can never delay a demotion: the driver wakes at
//! the lease end whatever the worker is doing. The role itself also carries the lease end, so
//! the DHCP path stops on time even if this task is late (see `role.rs`).
//!
//! Every role change is logged with CLOCK_MONOTONIC timestamps (`mono_ns`, the same kernel clock
//! in every network namespace): a promotion's stamp is read *before* the role is published and
//! a demotion's *after*, so the logged interval always contains the real one.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::backend::{ArbiterError, Backend, Beat, Claim, HolderRow};
use super::machine::{Call, DemoteReason, Effect, Elector, HaltReason, Reply};
use super::{Params, Uuid};
use crate::clock;
use crate::events::{EventKind, Events};
use crate::role::{Role, RoleTx};

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
        let ElectionHooks { role, mut eligible, mut commands, view, events } = hooks;
        role.send_replace(Role::Standby);
        let (call_tx, call_rx) = mpsc::channel(4);
        let (reply_tx, mut reply_rx) = mpsc::channel(4);
        let worker = tokio::spawn(worker(backend, claim.clone(), call_rx, reply_tx));
        let machine = Elector::new(params, claim.uuid, &claim.utype, clock::boottime());
        let mut d = Driver { machine, claim: claim.clone(), role, calls: call_tx, view, events };
        let (timeout_ms, interval_ms) = (claim.timeout_ms, params.interval.as_millis() as u64);
        tracing::info!(uuid = %claim.uuid, utype = %claim.utype, interval_ms, timeout_ms, "election started");
        let (mut watching, mut listening) = (true, true);
        d.machine.set_eligible(*eligible.borrow_and_update());
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
                    d.machine.on_reply(clock::boottime(), done.id, done.reply)
                }
                changed = eligible.changed(), if watching => {
                    // A dropped sender leaves the last value in force.
                    watching = changed.is_ok();
                    d.machine.set_eligible(*eligible.borrow_and_update())
                }
                command = commands.recv(), if listening => match command {
                    Some(ElectionCommand::StepDown { reply }) => {
                        let was_active = d.machine.active_term(clock::boottime()).is_some();
                        let _ = reply.send(was_active);
                        d.machine.step_down(clock::boottime())
                    }
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
}

/// An operator action for the election.
#[derive(Debug)]
pub enum ElectionCommand {
    /// Hand service to the partner now (demote, release the row, hold off for T). Answers
    /// whether this box was active.
    StepDown { reply: oneshot::Sender<bool> },
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
}

/// A finished arbiter call, as the worker reports it.
struct Done {
    id: u64,
    reply: Reply,
    rtt: Duration,
}

/// The driver's side: the machine, and where its effects go.
struct Driver {
    machine: Elector,
    /// What this box writes into the row (it is the holder the view names while active).
    claim: Claim,
    role: RoleTx,
    calls: mpsc::Sender<(u64, Call, Duration)>,
    view: watch::Sender<ElectionView>,
    events: Events,
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
                    if self.calls.try_send((id, call, deadline)).is_err() {
                        // The worker is behind (a call stuck past its deadline). The machine
                        // treats the missing answer as a failed call when the deadline passes.
                        tracing::debug!(?call, "arbiter worker busy; call skipped");
                    }
                }
                Effect::Active { term, until, renewed } => self.activate(term, until, renewed),
                Effect::Demoted(why) => self.demote(&why),
                Effect::Halt(why) => return Err(why.into()),
            }
        }
        let now = clock::boottime();
        let now_view = (self.machine.lease_end(), self.machine.holding_off(now), self.machine.is_eligible());
        self.view.send_if_modified(|v| {
            let changed = (v.lease_until, v.hold_off_until, v.eligible) != now_view;
            (v.lease_until, v.hold_off_until, v.eligible) = now_view;
            changed
        });
        Ok(())
    }

    fn activate(&mut self, term: u64, until: Duration, renewed: bool) {
        let until_mono = clock::boot_to_mono(until).as_nanos() as u64;
        if renewed {
            self.role.send_replace(Role::Active { term, until: Some(until) });
            tracing::debug!(term, until_mono_ns = until_mono, "lease renewed");
            return;
        }
        let mono = clock::monotonic().as_nanos() as u64;
        self.role.send_replace(Role::Active { term, until: Some(until) });
        tracing::info!(role = "active", term, mono_ns = mono, until_mono_ns = until_mono, "role change");
        self.events.record(EventKind::Role, format!("active, term {term} (arbiter lease)"));
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
    mut calls: mpsc::Receiver<(u64, Call, Duration)>,
    replies: mpsc::Sender<Done>,
) {
    let mut last_error: Option<String> = None;
    while let Some((id, call, deadline)) = calls.recv().await {
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
