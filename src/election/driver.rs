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

use tokio::sync::{mpsc, watch};

use super::backend::{ArbiterError, Backend, Claim, HolderRow};
use super::machine::{Call, DemoteReason, Effect, Machine, Reply};
use super::{Params, Uuid};
use crate::clock;
use crate::role::{Role, RoleTx};

#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error(transparent)]
    Arbiter(#[from] ArbiterError),
    #[error("{0}")]
    Halted(String),
    #[error("the arbiter did not answer within {0:?}")]
    Timeout(Duration),
}

/// What the election knows, for status displays (`whois`-like data of the running process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionStatus {
    pub uuid: Uuid,
    pub role: Role,
    /// The live holder as last read from the arbiter (None: nobody, or not read yet).
    pub primary: Option<HolderRow>,
}

pub struct Election<B: Backend> {
    backend: B,
    params: Params,
    claim: Claim,
}

impl<B: Backend> Election<B> {
    /// A new participant with a fresh uuid (seed step 1: one per process start).
    pub fn new(backend: B, params: Params, utype: &str, name: &str, endpoint: &str) -> Election<B> {
        let claim = Claim { utype: utype.into(), uuid: Uuid::new_v4(), name: name.into(), endpoint: endpoint.into(), timeout_ms: params.timeout.as_millis() as u64 };
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
            Ok(Ok(Some(row))) if row.timeout_ms != self.claim.timeout_ms => Err(ElectionError::Halted(format!(
                "the arbiter's row for utype {:?} has T = {} ms but this box has timeout_ms = {}; both boxes must use the same T (`twinlease arbiter init` adopts a new T once the row has expired)",
                self.claim.utype, row.timeout_ms, self.claim.timeout_ms
            ))),
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

    /// Runs until a fatal mismatch. The role starts (and stays, on return) Standby.
    pub async fn run(self, role: RoleTx, status: Option<watch::Sender<ElectionStatus>>) -> ElectionError {
        let Election { backend, params, claim } = self;
        role.send_replace(Role::Standby);
        let (call_tx, call_rx) = mpsc::channel(4);
        let (reply_tx, mut reply_rx) = mpsc::channel(4);
        let worker = tokio::spawn(worker(backend, claim.clone(), call_rx, reply_tx));
        let mut m = Machine::new(params, claim.uuid, &claim.utype, clock::boottime());
        tracing::info!(uuid = %claim.uuid, utype = %claim.utype, interval_ms = params.interval.as_millis() as u64, timeout_ms = claim.timeout_ms, "election started");
        let result = loop {
            let effects = m.poll(clock::boottime());
            if let Err(e) = apply(effects, &role, &call_tx) {
                break e;
            }
            let wait = m.wake_at().saturating_sub(clock::boottime());
            tokio::select! {
                got = reply_rx.recv() => {
                    let Some((id, reply)) = got else { break ElectionError::Halted("election worker stopped".into()) };
                    let effects = m.on_reply(clock::boottime(), id, reply);
                    if let Err(e) = apply(effects, &role, &call_tx) {
                        break e;
                    }
                    if let Some(s) = &status {
                        s.send_replace(ElectionStatus { uuid: claim.uuid, role: *role.borrow(), primary: m.known().and_then(|k| k.row.clone()) });
                    }
                }
                _ = tokio::time::sleep(wait) => {}
            }
        };
        role.send_replace(Role::Standby);
        worker.abort();
        tracing::error!(error = %result, "election stopped; this box will not serve");
        result
    }
}

fn apply(effects: Vec<Effect>, role: &RoleTx, calls: &mpsc::Sender<(u64, Call, Duration)>) -> Result<(), ElectionError> {
    for e in effects {
        match e {
            Effect::Send { id, call, deadline } => {
                if calls.try_send((id, call, deadline)).is_err() {
                    // The worker is behind (a call stuck past its deadline). The machine treats
                    // the missing answer as a failed call when the deadline passes.
                    tracing::debug!(?call, "arbiter worker busy; call skipped");
                }
            }
            Effect::Active { term, until, renewed } => {
                let until_mono = clock::boot_to_mono(until).as_nanos() as u64;
                if renewed {
                    role.send_replace(Role::Active { term, until: Some(until) });
                    tracing::debug!(term, until_mono_ns = until_mono, "lease renewed");
                } else {
                    let mono = clock::monotonic().as_nanos() as u64;
                    role.send_replace(Role::Active { term, until: Some(until) });
                    tracing::info!(role = "active", term, mono_ns = mono, until_mono_ns = until_mono, "role change");
                }
            }
            Effect::Demoted(why) => {
                role.send_replace(Role::Standby);
                let mono = clock::monotonic().as_nanos() as u64;
                let reason = match why {
                    DemoteReason::LeaseExpired => "lease expired without a confirmed heartbeat".to_string(),
                    DemoteReason::HeartbeatRejected => "the arbiter rejected our heartbeat".to_string(),
                    DemoteReason::ArbiterNamed(Some(u)) => format!("the arbiter names {u} as primary"),
                    DemoteReason::ArbiterNamed(None) => "the arbiter names no primary".to_string(),
                };
                tracing::warn!(role = "standby", mono_ns = mono, %reason, "role change");
            }
            Effect::Halt(msg) => return Err(ElectionError::Halted(msg)),
        }
    }
    Ok(())
}

/// Runs each call under its deadline; an abandoned call drops the connection.
async fn worker<B: Backend>(mut backend: B, claim: Claim, mut calls: mpsc::Receiver<(u64, Call, Duration)>, replies: mpsc::Sender<(u64, Reply)>) {
    let mut last_error: Option<String> = None;
    while let Some((id, call, deadline)) = calls.recv().await {
        let left = deadline.saturating_sub(clock::boottime());
        let outcome = match call {
            Call::Read => tokio::time::timeout(left, backend.read(&claim.utype)).await.map(|r| r.map(Reply::Read)),
            Call::Heartbeat => tokio::time::timeout(left, backend.heartbeat(&claim)).await.map(|r| r.map(Reply::Beat)),
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
        if replies.send((id, reply)).await.is_err() {
            return;
        }
    }
}
