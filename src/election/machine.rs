//! The election client of seeds 000–002 as an I/O-free state machine.
//!
//! Inputs: the local clock (CLOCK_BOOTTIME, passed in as a `Duration`) and the result of the last
//! arbiter call. Outputs ([`Effect`]): the next call to make, role changes, and a fatal halt. The
//! caller asks [`Elector::wake_at`] when to call [`Elector::poll`] again. A thin tokio task
//! (`driver.rs`) runs it for real; the model checker (`model.rs`) runs the very same code against
//! a simulated arbiter, network and clocks.
//!
//! Seed steps, as implemented here:
//! 1. one fresh uuid per process ([`Elector::new`]);
//! 2. a follower reads the row (GetPrimary) every I;
//! 3. an empty (expired or absent) row makes it send UpdateHeartBeat — a *claim*;
//! 4. the claim's own answer decides, in one round trip (no extra GetPrimary needed):
//!    a. applied → active; b. not applied (a rival won) → back to 2;
//!    c./d. no usable answer (error, timeout, corrupt row) → retry 3 at the next tick;
//! 5. the active sends UpdateHeartBeat every I; (a) a rival named by the arbiter — a heartbeat
//!    that did not apply, or a GetPrimary naming someone else — demotes at once, and so does
//!    the end of the lease.
//!
//! **The lease** (the fix for the seed's dual-primary window; docs/design.md, "Origins"):
//! active only until `send time of the last heartbeat the arbiter confirmed applied + (T − I)`.
//! That heartbeat's row timestamp was taken by the arbiter *after* that send, and a rival can
//! take over only once arbiter time passes that timestamp + T; the remaining I is the margin for
//! clock-rate drift and for delays between checking the role and a reply leaving the box.

use std::time::Duration;

use super::backend::{Beat, HolderRow};
use super::{Params, Uuid};

/// Which lease rule to follow. Production code can only build [`LeaseRule::ConfirmedHeartbeat`];
/// the seed's rule exists for the model checker to prove that it finds the seed's bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseRule {
    /// Lease from the send time of the last heartbeat the arbiter confirmed applied.
    ConfirmedHeartbeat,
    /// The seed's rule: a GetPrimary naming this node renews the lease from the *read's* send
    /// time, whatever happened to the heartbeats.
    #[cfg(test)]
    SeedReadSendTime,
}

/// An arbiter call the driver must make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Call {
    /// GetPrimary(utype).
    Read,
    /// UpdateHeartBeat(uuid, utype): renew, claim, or take over.
    Heartbeat,
    /// Expire the row if it holds this uuid (a hand-over: the partner may claim it at once).
    Release,
}

/// What came back from a call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reply {
    Read(Option<HolderRow>),
    Beat(Beat),
    /// Whether the release found the row still ours.
    Released(bool),
    /// Error, timeout, lost connection: nothing is known about what the arbiter did.
    Failed(String),
}

/// Why the election stops for good: something only the operator can fix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum HaltReason {
    #[error(
        "the arbiter's row for utype {utype:?} has T = {row_ms} ms but this box has timeout_ms = {ours_ms}; both boxes of a pair must use the same T (stop both, fix the config, then `twinlease arbiter init` adopts the new T once the row has expired)"
    )]
    TimeoutMismatch { utype: String, row_ms: u64, ours_ms: u64 },
}

/// Why a node stopped being active.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DemoteReason {
    /// The lease ran out without a confirmed heartbeat.
    LeaseExpired,
    /// The arbiter refused our heartbeat: the row is someone else's (or was overwritten).
    HeartbeatRejected,
    /// GetPrimary named another node, or nobody.
    ArbiterNamed(Option<Uuid>),
    /// This box cannot serve properly (its lease store cannot commit), so it stands down.
    Ineligible,
    /// The operator handed service to the partner (step-down, maintenance).
    SteppedDown,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Effect {
    /// Make this call now; feed its result to [`Elector::on_reply`] with the same id. The call
    /// must be abandoned (and reported as `Failed`) at `deadline`, at most I after sending.
    Send { id: u64, call: Call, deadline: Duration },
    /// Became active (or renewed): active for `term` until `until`.
    Active { term: u64, until: Duration, renewed: bool },
    /// No longer active.
    Demoted(DemoteReason),
    /// A configuration problem that retrying cannot fix; stop the election.
    Halt(HaltReason),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    /// Seed step 2: read every I.
    Follower,
    /// Seed 4c/4d: a claim got no usable answer; send it again at the next tick.
    Claiming,
    /// Seed step 5.
    Active { term: u64, until: Duration },
    /// A fatal mismatch (T differs from the arbiter's row): no more calls.
    Halted,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Inflight {
    id: u64,
    call: Call,
    sent: Duration,
    deadline: Duration,
}

/// Who the arbiter last named as primary (for `whois` and the status display).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Known {
    pub row: Option<HolderRow>,
    pub at: Duration,
}

/// Equality and hashing (used by the model checker to merge equal states) leave out `known`,
/// which is for display only and never influences what the machine does.
#[derive(Debug, Clone)]
pub struct Elector {
    params: Params,
    rule: LeaseRule,
    uuid: Uuid,
    utype: String,
    phase: Phase,
    next_tick: Duration,
    inflight: Option<Inflight>,
    next_id: u64,
    /// Whether this box may hold the role at all; an ineligible box never heartbeats, so it
    /// behaves like a box whose every write is lost, which the model check covers.
    eligible: bool,
    /// After a step-down: no heartbeat before this instant, so the partner gets the row
    /// (a box whose row was just released would otherwise claim it straight back).
    hold_off_until: Option<Duration>,
    known: Option<Known>,
}

impl PartialEq for Elector {
    fn eq(&self, o: &Elector) -> bool {
        let mine = (self.params, self.rule, self.uuid, &self.utype, &self.phase, self.next_tick, &self.inflight);
        let theirs = (o.params, o.rule, o.uuid, &o.utype, &o.phase, o.next_tick, &o.inflight);
        mine == theirs
            && (self.next_id, self.eligible, self.hold_off_until) == (o.next_id, o.eligible, o.hold_off_until)
    }
}

impl Eq for Elector {}

impl std::hash::Hash for Elector {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let more = (self.next_id, self.eligible, self.hold_off_until);
        (self.params, self.rule, self.uuid, &self.phase, self.next_tick, &self.inflight, more).hash(h);
    }
}

impl Elector {
    /// A node that has just started (seed step 1); its first read goes out at the first poll.
    pub fn new(params: Params, uuid: Uuid, utype: &str, now: Duration) -> Elector {
        Self::with_rule(params, uuid, utype, now, LeaseRule::ConfirmedHeartbeat)
    }

    pub fn with_rule(params: Params, uuid: Uuid, utype: &str, now: Duration, rule: LeaseRule) -> Elector {
        assert!(params.timeout > params.interval * 2, "T > 2I is checked when the configuration loads");
        Elector {
            params,
            rule,
            uuid,
            utype: utype.to_string(),
            phase: Phase::Follower,
            next_tick: now,
            inflight: None,
            next_id: 1,
            eligible: true,
            hold_off_until: None,
            known: None,
        }
    }

    /// Whether this box may be active. Turning it off demotes at once and stops every
    /// heartbeat (the row then expires T after the last one, and the partner takes over);
    /// turning it back on lets the box stand again at the next read that finds the row free.
    pub fn set_eligible(&mut self, eligible: bool) -> Vec<Effect> {
        let mut out = Vec::new();
        self.eligible = eligible;
        if !eligible && self.phase != Phase::Halted {
            self.demote(DemoteReason::Ineligible, &mut out);
        }
        out
    }

    pub fn is_eligible(&self) -> bool {
        self.eligible
    }

    /// Hands service to the partner now: demotes, releases the row, and sends no heartbeat for
    /// T, so the partner (which reads the row every I) takes it in about one interval.
    pub fn step_down(&mut self, now: Duration) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.phase == Phase::Halted {
            return out;
        }
        self.demote(DemoteReason::SteppedDown, &mut out);
        self.hold_off_until = Some(now + self.params.timeout);
        // A call in flight is abandoned: whatever it does, this box is no longer active.
        self.inflight = None;
        self.send(Call::Release, now, &mut out);
        out
    }

    /// Whether this box may send a heartbeat (claim or renew) at `now`.
    fn may_stand(&self, now: Duration) -> bool {
        self.eligible && self.hold_off_until.is_none_or(|t| now >= t)
    }

    /// The end of a step-down's hold-off, if one is running at `now`.
    pub fn holding_off(&self, now: Duration) -> Option<Duration> {
        self.hold_off_until.filter(|t| now < *t)
    }

    pub fn uuid(&self) -> Uuid {
        self.uuid
    }

    /// Active with a lease that has not ended at `now`: `Some(term)`.
    pub fn active_term(&self, now: Duration) -> Option<u64> {
        match self.phase {
            Phase::Active { term, until } if now < until => Some(term),
            _ => None,
        }
    }

    /// The lease end, if active (it may already have passed; see `active_term`).
    pub fn lease_end(&self) -> Option<Duration> {
        match self.phase {
            Phase::Active { until, .. } => Some(until),
            _ => None,
        }
    }

    pub fn known(&self) -> Option<&Known> {
        self.known.as_ref()
    }

    pub fn is_halted(&self) -> bool {
        self.phase == Phase::Halted
    }

    /// When `poll` must run next: the next tick, the in-flight call's deadline, the lease end.
    pub fn wake_at(&self) -> Duration {
        if self.phase == Phase::Halted {
            return Duration::MAX;
        }
        let mut at = self.next_tick;
        if let Some(f) = &self.inflight {
            at = at.min(f.deadline);
        }
        if let Phase::Active { until, .. } = self.phase {
            at = at.min(until);
        }
        at
    }

    /// Handles whatever is due at `now`: a call past its deadline, the lease end, the tick.
    pub fn poll(&mut self, now: Duration) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.phase == Phase::Halted {
            return out;
        }
        if self.inflight.as_ref().is_some_and(|f| now >= f.deadline) {
            let f = self.inflight.take().expect("checked");
            self.check_lease(now, &mut out);
            self.failed(now, f, &mut out);
        }
        self.check_lease(now, &mut out);
        if now >= self.next_tick {
            // Skip ticks missed while the process was not scheduled: one call per tick at most.
            while self.next_tick <= now {
                self.next_tick += self.params.interval;
            }
            if self.inflight.is_none() {
                let call = match self.phase {
                    Phase::Follower => Call::Read,
                    Phase::Claiming | Phase::Active { .. } => Call::Heartbeat,
                    Phase::Halted => return out,
                };
                self.send(call, now, &mut out);
            }
        }
        out
    }

    /// The result of call `id`. Results of calls already abandoned are ignored.
    pub fn on_reply(&mut self, now: Duration, id: u64, reply: Reply) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.phase == Phase::Halted || self.inflight.as_ref().is_none_or(|f| f.id != id) {
            return out;
        }
        let f = self.inflight.take().expect("checked");
        if now >= f.deadline {
            // Too late: the driver should have abandoned it. Treat as unknown.
            self.check_lease(now, &mut out);
            self.failed(now, f, &mut out);
            return out;
        }
        self.check_lease(now, &mut out);
        match reply {
            Reply::Failed(_) => self.failed(now, f, &mut out),
            Reply::Read(row) => self.on_read(now, f, row, &mut out),
            Reply::Beat(beat) => self.on_beat(now, f, beat, &mut out),
            // The hold-off runs whatever the release found: the row is the partner's to take.
            Reply::Released(_) => {}
        }
        out
    }

    fn send(&mut self, call: Call, now: Duration, out: &mut Vec<Effect>) {
        let id = self.next_id;
        self.next_id += 1;
        let deadline = now + self.params.interval;
        self.inflight = Some(Inflight { id, call, sent: now, deadline });
        out.push(Effect::Send { id, call, deadline });
    }

    fn check_lease(&mut self, now: Duration, out: &mut Vec<Effect>) {
        if let Phase::Active { until, .. } = self.phase
            && now >= until
        {
            self.demote(DemoteReason::LeaseExpired, out);
        }
    }

    fn demote(&mut self, why: DemoteReason, out: &mut Vec<Effect>) {
        if matches!(self.phase, Phase::Active { .. }) {
            out.push(Effect::Demoted(why));
        }
        self.phase = Phase::Follower;
    }

    fn lease_from(&self, sent: Duration) -> Duration {
        sent + (self.params.timeout - self.params.interval)
    }

    fn promote(&mut self, now: Duration, term: u64, until: Duration, out: &mut Vec<Effect>) {
        if until <= now {
            return;
        }
        let renewed = matches!(self.phase, Phase::Active { term: t, .. } if t == term);
        self.phase = Phase::Active { term, until };
        out.push(Effect::Active { term, until, renewed });
    }

    /// No usable answer: seed 4c/4d for a claim, "keep trying until the lease ends" when active.
    fn failed(&mut self, now: Duration, f: Inflight, out: &mut Vec<Effect>) {
        if f.call == Call::Heartbeat && self.phase == Phase::Follower && self.may_stand(now) {
            self.phase = Phase::Claiming;
        }
        // The seed read after every heartbeat, whatever became of it.
        #[cfg(test)]
        if self.rule == LeaseRule::SeedReadSendTime && f.call == Call::Heartbeat {
            self.send(Call::Read, now, out);
        }
        let _ = (now, out);
    }

    fn valid(&self, row: &HolderRow) -> Result<(), String> {
        if row.utype != self.utype {
            return Err(format!("row for utype {:?}, asked for {:?}", row.utype, self.utype));
        }
        if row.term < 1 {
            return Err(format!("row has term {}", row.term));
        }
        Ok(())
    }

    fn on_read(&mut self, now: Duration, f: Inflight, row: Option<HolderRow>, out: &mut Vec<Effect>) {
        if let Some(r) = &row {
            if let Err(why) = self.valid(r) {
                // Seed 4c: a corrupt answer is no answer.
                tracing::debug!(%why, "corrupt GetPrimary answer");
                return self.failed(now, f, out);
            }
            if r.timeout_ms != self.params.timeout.as_millis() as u64 {
                self.phase = Phase::Halted;
                let (row_ms, ours_ms) = (r.timeout_ms, self.params.timeout.as_millis() as u64);
                out.push(Effect::Halt(HaltReason::TimeoutMismatch { utype: self.utype.clone(), row_ms, ours_ms }));
                return;
            }
        }
        let live = row.filter(|r| r.live);
        self.known = Some(Known { row: live.clone(), at: now });
        match live {
            Some(r) if r.uuid == self.uuid => match self.rule {
                // The row is ours and alive (we were demoted, or a heartbeat's answer was lost):
                // renew it. Only the heartbeat's confirmation makes us active.
                LeaseRule::ConfirmedHeartbeat => {
                    if !matches!(self.phase, Phase::Active { .. }) && self.may_stand(now) {
                        self.send(Call::Heartbeat, now, out);
                    }
                }
                #[cfg(test)]
                LeaseRule::SeedReadSendTime => {
                    let until = self.lease_from(f.sent);
                    self.promote(now, r.term, until, out);
                }
            },
            Some(r) => self.demote(DemoteReason::ArbiterNamed(Some(r.uuid)), out),
            None => {
                // Seed 3 (and 4d): nobody holds it — claim now (if this box may serve at all).
                self.demote(DemoteReason::ArbiterNamed(None), out);
                if self.may_stand(now) {
                    self.send(Call::Heartbeat, now, out);
                }
            }
        }
    }

    fn on_beat(&mut self, now: Duration, f: Inflight, beat: Beat, out: &mut Vec<Effect>) {
        match self.rule {
            LeaseRule::ConfirmedHeartbeat => match beat {
                // A heartbeat sent before the box became ineligible does not make it active.
                Beat::Applied { term, .. } if self.may_stand(now) => {
                    let until = self.lease_from(f.sent);
                    self.promote(now, term, until, out);
                }
                Beat::Applied { .. } => {}
                Beat::NotApplied => self.demote(DemoteReason::HeartbeatRejected, out),
            },
            // The seed's heartbeat returned nothing; it confirmed with a read right after.
            #[cfg(test)]
            LeaseRule::SeedReadSendTime => {
                if self.phase == Phase::Claiming {
                    self.phase = Phase::Follower;
                }
                self.send(Call::Read, now, out);
            }
        }
    }
}
