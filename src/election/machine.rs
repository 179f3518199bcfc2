//! The election client of seeds 000–002 as an I/O-free state machine, with the partner box as
//! a third voter.
//!
//! Inputs: the local clock (CLOCK_BOOTTIME, passed in as a `Duration`), the result of the last
//! arbiter call, and the partner's promise messages from the peer link. Outputs ([`Effect`]):
//! the next call to make, promise messages to send, role changes, and a fatal halt. The caller
//! asks [`Elector::wake_at`] when to call [`Elector::poll`] again. A thin tokio task
//! (`driver.rs`) runs it for real; the model checker (`model.rs`) runs the very same code against
//! a simulated arbiter, peer link, network and clocks.
//!
//! Seed steps, as implemented here:
//! 1. one fresh uuid per process ([`Elector::new`]);
//! 2. a follower reads the row (GetPrimary) every I;
//! 3. an empty (expired or absent) row makes it send UpdateHeartBeat — a *claim*;
//! 4. the claim's own answer decides, in one round trip (no extra GetPrimary needed):
//!    a. applied → active; b. not applied (a rival won) → back to 2;
//!    c./d. no usable answer (error, timeout, corrupt row) → retry 3 at the next tick;
//! 5. the active sends UpdateHeartBeat every I; (a) a rival named by the arbiter — a heartbeat
//!    that did not apply, or a GetPrimary naming someone else — ends the arbiter's vote at once,
//!    and so does the end of the lease.
//!
//! **The lease** (the fix for the seed's dual-primary window; docs/design.md, "Origins"):
//! the arbiter's vote counts only until `send time of the last heartbeat the arbiter confirmed
//! applied + (T − I)`. That heartbeat's row timestamp was taken by the arbiter *after* that send,
//! and a rival can take over only once arbiter time passes that timestamp + T; the remaining I
//! is the margin for clock-rate drift and for delays between checking the role and a reply
//! leaving the box.
//!
//! **Three voters** (docs/design.md, "Three voters"): a box is active only while it holds two
//! votes, its own plus the arbiter's lease or its partner's *promise*. A promise answers a
//! request sent on the peer link: "until my local time (receipt of your request) + T I will not
//! become active and will not try to take the arbiter row". The asker counts it only until its
//! request's local *send* time + T − I, exactly like the arbiter lease, so delays and clock-rate
//! drift only shorten it. A box grants only while it is not active, so two boxes can never
//! vote for each other at once; while its promise runs it neither claims the row nor counts any
//! vote for itself. When two standbys ask each other at once, an active asker wins, then the
//! lower uuid.

use std::time::Duration;

use super::backend::{Beat, HolderRow};
use super::{Params, Uuid};

/// Which lease rule to follow. Production code can only build [`LeaseRule::ConfirmedHeartbeat`];
/// the broken rules exist for the model checker to prove that it finds their bugs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseRule {
    /// Lease from the send time of the last heartbeat the arbiter confirmed applied, and a
    /// partner promise from the send time of the request it answered.
    ConfirmedHeartbeat,
    /// The seed's rule: a GetPrimary naming this node renews the lease from the *read's* send
    /// time, whatever happened to the heartbeats.
    #[cfg(test)]
    SeedReadSendTime,
    /// A partner promise counted from the time its answer *arrived* rather than from its
    /// request's send time.
    #[cfg(test)]
    PromiseFromReceiveTime,
}

/// An arbiter call the driver must make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Call {
    /// GetPrimary(utype).
    Read,
    /// UpdateHeartBeat(uuid, utype): renew, claim, or take over (never below
    /// [`Elector::heartbeat_term`]).
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

/// A promise request from the partner, as the peer link delivers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PromiseAsk {
    /// The asking process (a restarted partner has a new one).
    pub uuid: Uuid,
    pub id: u64,
    /// The highest term the asker knows.
    pub term: u64,
    /// Whether the asker is active (it keeps its role rather than lose a tie-break).
    pub active: bool,
}

/// Why a box holds the role: the votes it counts besides its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Basis {
    pub arbiter: bool,
    pub partner: bool,
    /// The operator declared the partner down (`twinlease partner-down`).
    pub operator: bool,
}

impl Basis {
    /// How status, STATUS= and whois say it.
    pub fn describe(self) -> &'static str {
        match (self.arbiter, self.partner, self.operator) {
            (_, _, true) => "operator partner-down",
            (true, true, _) => "arbiter lease + partner vote",
            (true, false, _) => "arbiter lease",
            (false, true, _) => "partner vote",
            (false, false, _) => "no vote",
        }
    }
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
    /// Neither the arbiter's lease nor a partner promise was renewed in time.
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
    /// Became active (or renewed): active for `term` until `until` (`Duration::MAX`: until
    /// the partner is heard from again, after an operator partner-down).
    Active { term: u64, until: Duration, renewed: bool },
    /// No longer active.
    Demoted(DemoteReason),
    /// A configuration problem that retrying cannot fix; stop the election.
    Halt(HaltReason),
    /// Send this promise request to the partner on the peer link.
    AskPartner(PromiseAsk),
    /// Answer the partner's request `id` (from process `to`). A grant binds this box until
    /// `promised_until` (local time): record that where a restarted process finds it *before*
    /// sending the answer, and pass it to [`Elector::with_promise`] at the next start.
    AnswerPartner { to: Uuid, id: u64, granted: bool, term: u64, promised_until: Option<Duration> },
    /// Tell the partner that its promises for our requests up to `up_to` no longer count here.
    ReleasePartner { up_to: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    /// Seed step 2: read every I.
    Follower,
    /// Seed 4c/4d: a claim got no usable answer; send it again at the next tick.
    Claiming,
    /// Holding two votes (see [`Votes`]) for this term.
    Active { term: u64 },
    /// A fatal mismatch (T differs from the arbiter's row): no more calls.
    Halted,
}

/// The votes this box counts for itself besides its own, each until a local instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
struct Votes {
    arbiter: Option<Duration>,
    partner: Option<Duration>,
    operator: bool,
}

impl Votes {
    fn end(&self) -> Option<Duration> {
        if self.operator {
            return Some(Duration::MAX);
        }
        self.arbiter.max(self.partner)
    }

    fn basis(&self, now: Duration) -> Basis {
        let live = |v: Option<Duration>| v.is_some_and(|t| now < t);
        Basis { arbiter: live(self.arbiter), partner: live(self.partner), operator: self.operator }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Inflight {
    id: u64,
    call: Call,
    sent: Duration,
    deadline: Duration,
}

/// This box's own promise request, waiting for its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Asking {
    id: u64,
    sent: Duration,
}

/// The promise this box gave: to whom, for which request, until when (local time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Promised {
    to: Option<(Uuid, u64)>,
    until: Duration,
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
    votes: Votes,
    next_tick: Duration,
    inflight: Option<Inflight>,
    next_id: u64,
    /// Whether this box may hold the role at all; an ineligible box never heartbeats, so it
    /// behaves like a box whose every write is lost, which the model check covers.
    eligible: bool,
    /// After a step-down (or an active box turned ineligible): no heartbeat before this
    /// instant, so the partner gets the row
    /// (a box whose row was just released would otherwise claim it straight back).
    hold_off_until: Option<Duration>,
    /// Whether this box sent a heartbeat since it last read a live row of another node: only
    /// then can a row naming its uuid be its own. A row naming it otherwise was written by
    /// something else (a confused or tampered arbiter) while the real holder may still be
    /// active; it is treated as another node's and left to expire.
    wrote_since_foreign: bool,
    /// Whether the last arbiter call got a usable answer (a standby asks its partner for a
    /// vote only while the arbiter cannot give one).
    arbiter_answers: bool,
    asking: Option<Asking>,
    promised: Option<Promised>,
    /// The highest term seen on either path: a term this box starts is above it.
    max_term: u64,
    /// A live arbiter row names a box that is neither this one nor its partner: a third box
    /// shares the utype, and the partner's vote could then elect a second active beside it.
    third_box: bool,
    known: Option<Known>,
}

impl PartialEq for Elector {
    fn eq(&self, o: &Elector) -> bool {
        self.key() == o.key()
    }
}

impl Eq for Elector {}

impl std::hash::Hash for Elector {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.key().hash(h);
    }
}

type Key<'a> = (
    (Params, LeaseRule, Uuid, &'a Phase, Votes, Duration, &'a Option<Inflight>),
    (u64, bool, Option<Duration>, bool, Option<Asking>, Option<Promised>, u64, bool, bool),
);

impl Elector {
    fn key(&self) -> Key<'_> {
        (
            (self.params, self.rule, self.uuid, &self.phase, self.votes, self.next_tick, &self.inflight),
            (
                self.next_id,
                self.eligible,
                self.hold_off_until,
                self.arbiter_answers,
                self.asking,
                self.promised,
                self.max_term,
                self.wrote_since_foreign,
                self.third_box,
            ),
        )
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
            votes: Votes::default(),
            next_tick: now,
            inflight: None,
            next_id: 1,
            eligible: true,
            hold_off_until: None,
            wrote_since_foreign: false,
            arbiter_answers: false,
            asking: None,
            promised: None,
            max_term: 0,
            third_box: false,
            known: None,
        }
    }

    /// A process that starts while a promise of an earlier process of this box may still run
    /// (until `until`, local time): it keeps that promise.
    pub fn with_promise(mut self, until: Option<Duration>) -> Elector {
        self.promised = until.map(|until| Promised { to: None, until });
        self
    }

    /// Whether this box may be active. Turning it off stops every heartbeat; an active box
    /// hands service over as in a step-down (the row released, no claim for T), so the partner
    /// takes over in about one interval. Turning it back on lets the box stand again at the
    /// next read that finds the row free (or still its own), once any hold-off has ended.
    ///
    /// The hold-off matters because ineligibility can be brief: a store that failed a commit
    /// on a full disk may pass its small probe write a moment later (the checkpoint gave back
    /// the log's space) and fail the next real commit again. Without it such a box took its
    /// still-live row straight back, again and again, and the partner never got it.
    pub fn set_eligible(&mut self, now: Duration, eligible: bool) -> Vec<Effect> {
        self.eligible = eligible;
        if eligible || self.phase == Phase::Halted {
            return Vec::new();
        }
        // Only an eligible box can have become active, so this is the turn to ineligible.
        if matches!(self.phase, Phase::Active { .. }) {
            return self.hand_over(now, DemoteReason::Ineligible);
        }
        let mut out = Vec::new();
        self.demote(DemoteReason::Ineligible, &mut out);
        out
    }

    pub fn is_eligible(&self) -> bool {
        self.eligible
    }

    /// Hands service to the partner now: demotes, releases the row and the partner's promise,
    /// and sends no heartbeat for T, so the partner (which reads the row every I) takes it in
    /// about one interval.
    pub fn step_down(&mut self, now: Duration) -> Vec<Effect> {
        if self.phase == Phase::Halted {
            return Vec::new();
        }
        self.hand_over(now, DemoteReason::SteppedDown)
    }

    /// Demotes for `why`, releases the row and holds off for T (see [`Elector::step_down`]).
    fn hand_over(&mut self, now: Duration, why: DemoteReason) -> Vec<Effect> {
        let mut out = Vec::new();
        self.demote(why, &mut out);
        self.hold_off_until = Some(now + self.params.timeout);
        // A call in flight is abandoned: whatever it does, this box is no longer active.
        self.inflight = None;
        self.send(Call::Release, now, &mut out);
        out
    }

    /// The operator has seen that the partner is off: count its vote until it is heard from
    /// again (a grant, or a request while this box serves). The caller checks that the peer
    /// link is down; the machine still refuses while its own promise binds it.
    pub fn partner_down(&mut self, now: Duration) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.phase == Phase::Halted || !self.may_stand(now) || self.third_box {
            return out;
        }
        self.votes.operator = true;
        let term = self.new_term(0);
        self.promote(now, term, &mut out);
        out
    }

    /// Whether the arbiter names a third box (neither this one nor its partner) for this utype.
    /// While it does, partner votes are neither given nor counted: the three-voter rule holds
    /// for a pair only, and a box elected by its partner would serve beside the third one.
    pub fn set_third_box(&mut self, now: Duration, seen: bool) -> Vec<Effect> {
        let mut out = Vec::new();
        if seen == self.third_box {
            return out;
        }
        self.third_box = seen;
        if seen {
            self.drop_partner_vote(&mut out);
            self.check_lease(now, &mut out);
        }
        out
    }

    pub fn third_box(&self) -> bool {
        self.third_box
    }

    /// Whether this box may count any vote for itself at `now`: eligible, not holding off
    /// after a step-down, and not bound by its own promise to the partner.
    fn may_stand(&self, now: Duration) -> bool {
        self.eligible && self.hold_off_until.is_none_or(|t| now >= t) && self.promised.is_none_or(|p| now >= p.until)
    }

    /// The end of a step-down's hold-off, if one is running at `now`.
    pub fn holding_off(&self, now: Duration) -> Option<Duration> {
        self.hold_off_until.filter(|t| now < *t)
    }

    /// The end of this box's promise to its partner, if one runs at `now`.
    pub fn promised_until(&self, now: Duration) -> Option<Duration> {
        self.promised.map(|p| p.until).filter(|t| now < *t)
    }

    pub fn uuid(&self) -> Uuid {
        self.uuid
    }

    /// Active with a vote that has not ended at `now`: `Some(term)`.
    pub fn active_term(&self, now: Duration) -> Option<u64> {
        match self.phase {
            Phase::Active { term } if self.votes.end().is_some_and(|end| now < end) => Some(term),
            _ => None,
        }
    }

    /// The end of the role, if active (it may already have passed; see `active_term`).
    pub fn lease_end(&self) -> Option<Duration> {
        match self.phase {
            Phase::Active { .. } => self.votes.end(),
            _ => None,
        }
    }

    /// Which votes make this box active at `now` (None: not active).
    pub fn basis(&self, now: Duration) -> Option<Basis> {
        self.active_term(now).map(|_| self.votes.basis(now))
    }

    /// The term floor for the next heartbeat: the current term while active (a renewal keeps
    /// it), otherwise above every term seen, so the arbiter row never moves a term backwards.
    pub fn heartbeat_term(&self) -> u64 {
        match self.phase {
            Phase::Active { term } => term,
            _ => self.max_term + 1,
        }
    }

    pub fn known(&self) -> Option<&Known> {
        self.known.as_ref()
    }

    pub fn is_halted(&self) -> bool {
        self.phase == Phase::Halted
    }

    /// When `poll` must run next: the next tick, the in-flight call's deadline, the role's end.
    pub fn wake_at(&self) -> Duration {
        if self.phase == Phase::Halted {
            return Duration::MAX;
        }
        let mut at = self.next_tick;
        if let Some(f) = &self.inflight {
            at = at.min(f.deadline);
        }
        if let Some(end) = self.lease_end() {
            at = at.min(end);
        }
        at
    }

    /// Handles whatever is due at `now`: a call past its deadline, the role's end, the tick.
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
                    Phase::Claiming if self.may_stand(now) => Call::Heartbeat,
                    Phase::Follower | Phase::Claiming => Call::Read,
                    Phase::Active { .. } => Call::Heartbeat,
                    Phase::Halted => return out,
                };
                self.send(call, now, &mut out);
            }
            self.ask_partner(now, &mut out);
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
        self.arbiter_answers = !matches!(reply, Reply::Failed(_));
        match reply {
            Reply::Failed(_) => self.failed(now, f, &mut out),
            Reply::Read(row) => self.on_read(now, f, row, &mut out),
            Reply::Beat(beat) => self.on_beat(now, f, beat, &mut out),
            // The hold-off runs whatever the release found: the row is the partner's to take.
            Reply::Released(_) => {}
        }
        out
    }

    /// Asks the partner for its vote at each tick while this box serves (so that losing the
    /// arbiter costs nothing) or while the arbiter cannot answer (so that a pair cut off from
    /// it can still elect one box).
    fn ask_partner(&mut self, now: Duration, out: &mut Vec<Effect>) {
        let active = self.active_term(now).is_some();
        let wanted = active || !self.arbiter_answers;
        if !wanted || !self.may_stand(now) || self.third_box {
            self.asking = None;
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.asking = Some(Asking { id, sent: now });
        out.push(Effect::AskPartner(PromiseAsk { uuid: self.uuid, id, term: self.max_term, active }));
    }

    /// The partner asks for this box's vote. Granted only while this box is not active, and,
    /// if it is asking too, only to an active asker or one with a lower uuid.
    pub fn on_partner_ask(&mut self, now: Duration, ask: PromiseAsk) -> Vec<Effect> {
        let mut out = Vec::new();
        self.max_term = self.max_term.max(ask.term);
        let rival = self.asking.is_some() && self.may_stand(now) && !ask.active && ask.uuid > self.uuid;
        let granted = self.phase != Phase::Halted && self.active_term(now).is_none() && !rival && !self.third_box;
        let mut promised_until = None;
        if granted {
            self.check_lease(now, &mut out);
            self.drop_partner_vote(&mut out);
            // Bound: no claim of the row either.
            if self.phase == Phase::Claiming {
                self.phase = Phase::Follower;
            }
            let until = (now + self.params.timeout).max(self.promised.map_or(now, |p| p.until));
            // The record names the newest request of that process it answers: a late, older
            // request (a delayed message, or one left on a closing connection) must not take
            // it back, or the partner's release of its older requests would free this box while
            // the partner still counts the newer grant.
            let newest = match self.promised.and_then(|p| p.to) {
                Some((uuid, id)) if uuid == ask.uuid => id.max(ask.id),
                _ => ask.id,
            };
            self.promised = Some(Promised { to: Some((ask.uuid, newest)), until });
            promised_until = Some(until);
        }
        out.push(Effect::AnswerPartner { to: ask.uuid, id: ask.id, granted, term: self.max_term, promised_until });
        out
    }

    /// The partner's answer to our request `id`; only the latest request's answer within I of
    /// sending it counts.
    pub fn on_partner_answer(&mut self, now: Duration, id: u64, granted: bool, term: u64) -> Vec<Effect> {
        let mut out = Vec::new();
        self.max_term = self.max_term.max(term);
        // First: a demotion now releases the partner from every request so far, this one too.
        self.check_lease(now, &mut out);
        let Some(ask) = self.asking.filter(|a| a.id == id && now < a.sent + self.params.interval) else {
            return out;
        };
        self.asking = None;
        if !granted || self.phase == Phase::Halted || !self.may_stand(now) || self.third_box {
            return out;
        }
        let from = match self.rule {
            #[cfg(test)]
            LeaseRule::PromiseFromReceiveTime => now,
            _ => ask.sent,
        };
        self.votes.partner = Some(from + (self.params.timeout - self.params.interval));
        // The partner is alive after all: its promise replaces the operator's word.
        self.votes.operator = false;
        let term = self.new_term(term);
        self.promote(now, term, &mut out);
        out
    }

    /// The partner no longer counts any promise for its requests up to `up_to` (from process
    /// `from`): a promise given to one of them ends now.
    pub fn on_partner_release(&mut self, from: Uuid, up_to: u64) {
        if self.promised.is_some_and(|p| p.to.is_some_and(|(u, id)| u == from && id <= up_to)) {
            self.promised = None;
        }
    }

    /// Stops counting the partner's promises and frees the partner from them: no answer to a
    /// request sent so far counts here any more.
    fn drop_partner_vote(&mut self, out: &mut Vec<Effect>) {
        self.votes.operator = false;
        if self.votes.partner.take().is_some() | self.asking.take().is_some() {
            out.push(Effect::ReleasePartner { up_to: self.next_id - 1 });
        }
    }

    /// The term to hold on becoming active through a vote other than the arbiter's: the
    /// current one while active, otherwise above every term either path has produced.
    fn new_term(&self, partner_term: u64) -> u64 {
        match self.phase {
            Phase::Active { term } => term,
            _ => self.max_term.max(partner_term) + 1,
        }
    }

    fn send(&mut self, call: Call, now: Duration, out: &mut Vec<Effect>) {
        let id = self.next_id;
        self.next_id += 1;
        let deadline = now + self.params.interval;
        self.inflight = Some(Inflight { id, call, sent: now, deadline });
        self.wrote_since_foreign |= matches!(call, Call::Heartbeat);
        out.push(Effect::Send { id, call, deadline });
    }

    fn check_lease(&mut self, now: Duration, out: &mut Vec<Effect>) {
        if matches!(self.phase, Phase::Active { .. }) && self.votes.end().is_none_or(|end| now >= end) {
            self.demote(DemoteReason::LeaseExpired, out);
        }
    }

    /// The arbiter's vote is gone (a rival named, a heartbeat refused): demoted unless the
    /// partner's promise still makes two votes.
    fn lose_arbiter_vote(&mut self, now: Duration, why: DemoteReason, out: &mut Vec<Effect>) {
        self.votes.arbiter = None;
        if matches!(self.phase, Phase::Active { .. }) && self.votes.end().is_none_or(|end| now >= end) {
            self.demote(why, out);
        }
    }

    fn demote(&mut self, why: DemoteReason, out: &mut Vec<Effect>) {
        if matches!(self.phase, Phase::Active { .. }) {
            out.push(Effect::Demoted(why));
        }
        self.phase = Phase::Follower;
        self.votes.arbiter = None;
        self.drop_partner_vote(out);
    }

    fn lease_from(&self, sent: Duration) -> Duration {
        sent + (self.params.timeout - self.params.interval)
    }

    /// Active for `term` if the votes counted reach past `now`.
    fn promote(&mut self, now: Duration, term: u64, out: &mut Vec<Effect>) {
        let Some(until) = self.votes.end().filter(|end| now < *end) else { return };
        let renewed = matches!(self.phase, Phase::Active { term: t } if t == term);
        self.phase = Phase::Active { term };
        self.max_term = self.max_term.max(term);
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
                self.arbiter_answers = false;
                return self.failed(now, f, out);
            }
            if r.timeout_ms != self.params.timeout.as_millis() as u64 {
                self.phase = Phase::Halted;
                let (row_ms, ours_ms) = (r.timeout_ms, self.params.timeout.as_millis() as u64);
                out.push(Effect::Halt(HaltReason::TimeoutMismatch { utype: self.utype.clone(), row_ms, ours_ms }));
                return;
            }
            self.max_term = self.max_term.max(r.term);
        }
        let live = row.filter(|r| r.live);
        self.known = Some(Known { row: live.clone(), at: now });
        match live {
            Some(r) if r.uuid == self.uuid && !self.wrote_since_foreign => {
                tracing::warn!(
                    term = r.term,
                    "the arbiter names this box as the holder of a row it never wrote; waiting for the row to expire"
                );
                self.lose_arbiter_vote(now, DemoteReason::ArbiterNamed(Some(r.uuid)), out);
            }
            Some(r) if r.uuid == self.uuid => self.on_own_row(now, f, &r, out),
            Some(r) => {
                self.wrote_since_foreign = false;
                self.lose_arbiter_vote(now, DemoteReason::ArbiterNamed(Some(r.uuid)), out);
            }
            None => {
                // Seed 3 (and 4d): nobody holds it — claim now (if this box may serve at all).
                self.lose_arbiter_vote(now, DemoteReason::ArbiterNamed(None), out);
                if self.may_stand(now) {
                    self.send(Call::Heartbeat, now, out);
                }
            }
        }
    }

    /// The row is ours and alive (we were demoted, or a heartbeat's answer was lost): renew it.
    /// Only the heartbeat's confirmation counts the arbiter's vote.
    fn on_own_row(&mut self, now: Duration, f: Inflight, r: &HolderRow, out: &mut Vec<Effect>) {
        match self.rule {
            #[cfg(test)]
            // The seed's bug is the lease's start; a promise to the partner still binds.
            LeaseRule::SeedReadSendTime if self.may_stand(now) => {
                self.votes.arbiter = Some(self.lease_from(f.sent));
                self.promote(now, r.term, out);
            }
            _ => {
                let _ = (f, r);
                if !matches!(self.phase, Phase::Active { .. }) && self.may_stand(now) {
                    self.send(Call::Heartbeat, now, out);
                }
            }
        }
    }

    fn on_beat(&mut self, now: Duration, f: Inflight, beat: Beat, out: &mut Vec<Effect>) {
        match self.rule {
            #[cfg(test)]
            // The seed's heartbeat returned nothing; it confirmed with a read right after.
            LeaseRule::SeedReadSendTime => {
                if self.phase == Phase::Claiming {
                    self.phase = Phase::Follower;
                }
                self.send(Call::Read, now, out);
            }
            _ => match beat {
                // A heartbeat sent before the box became ineligible (or bound by a promise)
                // does not make it active.
                Beat::Applied { term, .. } if self.may_stand(now) => {
                    self.votes.arbiter = Some(self.lease_from(f.sent));
                    self.promote(now, term, out);
                }
                Beat::Applied { term, .. } => self.max_term = self.max_term.max(term),
                Beat::NotApplied => self.lose_arbiter_vote(now, DemoteReason::HeartbeatRejected, out),
            },
        }
    }
}
