//! The partner box as the third voter, one row of the failure table at a time (README,
//! "Failover"), plus the promise rules themselves.
//!
//! `Pair` runs two real machines in 10 ms steps against a simulated arbiter and peer link that
//! answer at once; each row cuts what it names and checks who serves, and every step checks
//! that the two boxes are never active at the same instant.

use std::time::Duration;

use super::machine::{Basis, Call, DemoteReason, Effect, Elector, PromiseAsk, Reply};
use super::{Beat, HolderRow, Params, Uuid};

const I: Duration = Duration::from_secs(1);
const T: Duration = Duration::from_secs(5);
const STEP: Duration = Duration::from_millis(10);
const UTYPE: &str = "branch42/dhcp";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The arbiter row: holder, arbiter timestamp (None: released, expired at once), term.
type Row = (Uuid, Option<Duration>, u64);

struct Pair {
    now: Duration,
    boxes: [Option<Elector>; 2],
    row: Option<Row>,
    /// Whether each box reaches the arbiter.
    arbiter: [bool; 2],
    link: bool,
    /// Per box: the instants it was first and last seen active.
    served: [Option<(Duration, Duration)>; 2],
    demotions: [Vec<DemoteReason>; 2],
    /// The promises each box recorded for its successor.
    promised: [Option<Duration>; 2],
}

impl Pair {
    /// Box 0 has the lower uuid; both start at `now` = 0.
    fn new() -> Pair {
        let params = Params { interval: I, timeout: T };
        let boxes = [0xa, 0xb].map(|u| Some(Elector::new(params, Uuid::from_u128(u), UTYPE, ms(0))));
        Pair {
            now: ms(0),
            boxes,
            row: None,
            arbiter: [true; 2],
            link: true,
            served: [None; 2],
            demotions: [Vec::new(), Vec::new()],
            promised: [None; 2],
        }
    }

    fn live(&self, r: &Row) -> bool {
        r.1.is_some_and(|ts| self.now - ts <= T)
    }

    fn call(&mut self, i: usize, call: Call, uuid: Uuid, min_term: u64) -> Reply {
        if !self.arbiter[i] {
            return Reply::Failed("unreachable".into());
        }
        match call {
            Call::Read => Reply::Read(self.row.map(|r| holder(r, self.live(&r)))),
            Call::Heartbeat => {
                let term = match self.row {
                    None => min_term.max(1),
                    Some(r) if r.0 == uuid && self.live(&r) => r.2.max(min_term),
                    Some(r) if !self.live(&r) => (r.2 + 1).max(min_term),
                    Some(_) => return Reply::Beat(Beat::NotApplied),
                };
                self.row = Some((uuid, Some(self.now), term));
                Reply::Beat(Beat::Applied { ts_us: 0, term })
            }
            Call::Release => {
                let ours = self.row.is_some_and(|r| r.0 == uuid);
                if ours {
                    self.row = self.row.map(|r| (r.0, None, r.2));
                }
                Reply::Released(ours)
            }
        }
    }

    /// Carries out box `i`'s effects: calls answered at once, peer messages delivered at once.
    fn run(&mut self, i: usize, effects: Vec<Effect>) {
        let mut queue: Vec<(usize, Effect)> = effects.into_iter().map(|e| (i, e)).collect();
        while let Some((i, e)) = queue.pop() {
            let now = self.now;
            let (j, peer_up) = (1 - i, self.link && self.boxes[1 - i].is_some());
            let Some(m) = self.boxes[i].as_ref() else { continue };
            let (uuid, min_term) = (m.uuid(), m.heartbeat_term());
            let more = match e {
                Effect::Send { id, call, .. } => {
                    let reply = self.call(i, call, uuid, min_term);
                    self.boxes[i].as_mut().expect("alive").on_reply(now, id, reply)
                }
                Effect::Demoted(why) => {
                    self.demotions[i].push(why);
                    Vec::new()
                }
                Effect::AskPartner(ask) if peer_up => {
                    let fx = self.boxes[j].as_mut().expect("alive").on_partner_ask(now, ask);
                    queue.extend(fx.into_iter().map(|e| (j, e)));
                    Vec::new()
                }
                Effect::AnswerPartner { id, granted, term, promised_until, .. } => {
                    self.promised[i] = promised_until.or(self.promised[i]);
                    if !peer_up {
                        continue;
                    }
                    let fx = self.boxes[j].as_mut().expect("alive").on_partner_answer(now, id, granted, term);
                    queue.extend(fx.into_iter().map(|e| (j, e)));
                    Vec::new()
                }
                Effect::ReleasePartner { up_to } if peer_up => {
                    self.boxes[j].as_mut().expect("alive").on_partner_release(uuid, up_to);
                    Vec::new()
                }
                _ => Vec::new(),
            };
            queue.extend(more.into_iter().map(|e| (i, e)));
        }
    }

    fn active(&self, i: usize) -> bool {
        self.boxes[i].as_ref().is_some_and(|m| m.active_term(self.now).is_some())
    }

    fn term(&self, i: usize) -> Option<u64> {
        self.boxes[i].as_ref().and_then(|m| m.active_term(self.now))
    }

    fn basis(&self, i: usize) -> Option<Basis> {
        self.boxes[i].as_ref().and_then(|m| m.basis(self.now))
    }

    /// Runs until `until`, checking at every step that at most one box is active.
    fn until(&mut self, until: Duration) {
        while self.now < until {
            for i in 0..2 {
                if let Some(m) = self.boxes[i].as_mut()
                    && m.wake_at() <= self.now
                {
                    let fx = m.poll(self.now);
                    self.run(i, fx);
                }
            }
            assert!(!(self.active(0) && self.active(1)), "two active at {:?}", self.now);
            for i in 0..2 {
                if self.active(i) {
                    let first = self.served[i].map_or(self.now, |s| s.0);
                    self.served[i] = Some((first, self.now));
                }
            }
            self.now += STEP;
        }
    }

    /// The box that is active now (exactly one).
    fn the_active(&self) -> usize {
        match (self.active(0), self.active(1)) {
            (true, false) => 0,
            (false, true) => 1,
            other => panic!("expected exactly one active at {:?}: {other:?}", self.now),
        }
    }

    fn kill(&mut self, i: usize) {
        self.boxes[i] = None;
    }

    fn operator_partner_down(&mut self, i: usize) {
        let fx = self.boxes[i].as_mut().expect("alive").partner_down(self.now);
        self.run(i, fx);
    }
}

fn holder(r: Row, live: bool) -> HolderRow {
    HolderRow {
        utype: UTYPE.into(),
        uuid: r.0,
        name: String::new(),
        endpoint: String::new(),
        term: r.2,
        timeout_ms: T.as_millis() as u64,
        ts_us: 0,
        age_ms: 0,
        live,
    }
}

/// A settled pair: one box active on the arbiter's lease plus its partner's vote.
fn settled() -> (Pair, usize) {
    let mut p = Pair::new();
    p.until(ms(3000));
    let a = p.the_active();
    let basis = p.basis(a).expect("active");
    assert!(basis.arbiter && basis.partner, "{basis:?}");
    assert_eq!(basis.describe(), "arbiter lease + partner vote");
    (p, a)
}

#[test]
fn row_1_the_active_dies_with_the_arbiter_reachable_the_standby_serves_within_t_plus_i() {
    let (mut p, a) = settled();
    let b = 1 - a;
    let died = p.now;
    p.kill(a);
    p.until(died + T + I + ms(100));
    let (first, _) = p.served[b].expect("the standby took over");
    assert!(first <= died + T + I, "took over at {first:?}, died at {died:?}");
    assert!(p.basis(b).expect("active").arbiter);
}

#[test]
fn row_2_the_arbiter_unreachable_from_both_the_active_keeps_serving() {
    let (mut p, a) = settled();
    let term = p.term(a);
    p.arbiter = [false, false];
    p.until(ms(30_000));
    assert_eq!(p.served[a].expect("served").1, p.now - STEP, "served to the end");
    assert!(p.demotions[a].is_empty(), "no role change: {:?}", p.demotions[a]);
    assert_eq!(p.term(a), term, "same term");
    assert!(p.served[1 - a].is_none());
    assert_eq!(p.basis(a).expect("active").describe(), "partner vote");
}

#[test]
fn row_3_both_boot_with_the_arbiter_unreachable_one_serves_within_t_plus_i() {
    let mut p = Pair::new();
    p.arbiter = [false, false];
    p.until(T + I + STEP);
    let a = p.the_active();
    assert!(p.served[a].expect("served").0 <= T + I);
    assert_eq!(p.basis(a).expect("active").describe(), "partner vote");
    assert_eq!(p.term(a), Some(1), "the first term either path hands out");
    p.until(ms(20_000));
    assert_eq!(p.the_active(), a, "it stays");
}

#[test]
fn row_4_the_peer_link_down_with_the_arbiter_reachable_the_arbiter_decides() {
    let (mut p, a) = settled();
    p.link = false;
    p.until(ms(30_000));
    assert_eq!(p.the_active(), a);
    assert!(p.demotions[a].is_empty());
    assert_eq!(p.basis(a).expect("active").describe(), "arbiter lease");
    assert!(p.served[1 - a].is_none());
}

#[test]
fn row_5_the_active_isolated_from_both_stops_before_the_standby_starts() {
    let (mut p, a) = settled();
    let cut = p.now;
    p.link = false;
    p.arbiter[a] = false;
    p.until(cut + 3 * T);
    let (_, last_a) = p.served[a].expect("served");
    let (first_b, _) = p.served[1 - a].expect("the standby took over");
    assert!(last_a < first_b, "active until {last_a:?}, partner from {first_b:?}");
    assert!(last_a < cut + T - I + STEP, "stopped by its lease end");
    assert_eq!(p.demotions[a], vec![DemoteReason::LeaseExpired]);
}

#[test]
fn row_6_the_arbiter_unreachable_and_the_active_dies_nobody_serves_until_the_operator_says() {
    let (mut p, a) = settled();
    let b = 1 - a;
    p.arbiter = [false, false];
    p.kill(a);
    p.until(ms(60_000));
    assert!(p.served[b].is_none(), "a single box cannot tell a dead partner from a cut cable");
    p.link = false;
    p.operator_partner_down(b);
    p.until(p.now + STEP);
    assert_eq!(p.basis(b).expect("active").describe(), "operator partner-down");
    p.until(ms(90_000));
    assert!(p.active(b), "until the partner is heard from again");
}

#[test]
fn row_7_the_arbiter_returns_the_serving_box_stays_and_takes_its_row_back() {
    let (mut p, a) = settled();
    p.arbiter = [false, false];
    p.until(ms(20_000));
    let term = p.term(a).expect("active");
    assert!(!p.live(&p.row.expect("row")), "the old row has expired meanwhile");
    p.arbiter = [true, true];
    p.until(ms(30_000));
    assert!(p.demotions[a].is_empty(), "no gap: {:?}", p.demotions[a]);
    assert!(p.served[1 - a].is_none(), "no overlap, no move");
    let row = p.row.expect("row");
    assert_eq!(row.0, p.boxes[a].as_ref().unwrap().uuid(), "its row again");
    assert!(row.2 >= term && p.term(a) == Some(row.2), "term {term} -> row {}", row.2);
    assert_eq!(p.basis(a).expect("active").describe(), "arbiter lease + partner vote");
}

#[test]
fn asymmetric_cut_only_the_standby_loses_the_arbiter_nothing_moves() {
    let (mut p, a) = settled();
    p.arbiter[1 - a] = false;
    p.until(ms(30_000));
    assert!(p.demotions[a].is_empty());
    assert!(p.served[1 - a].is_none());
}

#[test]
fn a_revived_partner_rejoins_as_standby_after_an_operator_partner_down() {
    let (mut p, a) = settled();
    let b = 1 - a;
    p.arbiter = [false, false];
    p.kill(a);
    p.link = false;
    p.until(ms(10_000));
    p.operator_partner_down(b);
    p.until(ms(20_000));
    let params = Params { interval: I, timeout: T };
    p.boxes[a] = Some(Elector::new(params, Uuid::from_u128(0xc), UTYPE, p.now).with_promise(p.promised[a]));
    p.link = true;
    p.until(ms(40_000));
    assert!(p.active(b) && p.demotions[b].is_empty());
    assert_eq!(p.basis(b).expect("active").describe(), "partner vote", "the revived partner's vote replaced it");
}

// ---- the promise rules, one machine at a time ------------------------------------------------

fn machine(u: u128) -> Elector {
    Elector::new(Params { interval: I, timeout: T }, Uuid::from_u128(u), UTYPE, ms(0))
}

fn ask(u: u128, id: u64, term: u64, active: bool) -> PromiseAsk {
    PromiseAsk { uuid: Uuid::from_u128(u), id, term, active }
}

fn answer(effects: &[Effect]) -> (bool, Option<Duration>) {
    effects
        .iter()
        .find_map(|e| match e {
            Effect::AnswerPartner { granted, promised_until, .. } => Some((*granted, *promised_until)),
            _ => None,
        })
        .expect("an answer")
}

fn asked(effects: &[Effect]) -> PromiseAsk {
    effects
        .iter()
        .find_map(|e| match e {
            Effect::AskPartner(a) => Some(*a),
            _ => None,
        })
        .expect("a request")
}

/// A standby whose arbiter does not answer: it asks its partner at every tick.
fn asking_standby(u: u128) -> (Elector, PromiseAsk) {
    let mut m = machine(u);
    let fx = m.poll(ms(0));
    let a = asked(&fx);
    assert!(!a.active);
    (m, a)
}

#[test]
fn a_promise_counts_from_the_requests_send_time_for_t_minus_i() {
    let (mut m, a) = asking_standby(0xa);
    let fx = m.on_partner_answer(ms(300), a.id, true, 0);
    assert_eq!(fx, vec![Effect::Active { term: 1, until: T - I, renewed: false }], "sent at 0, not answered at 300");
    assert_eq!(m.active_term(T - I - ms(1)), Some(1));
    assert_eq!(m.active_term(T - I), None);
}

#[test]
fn an_answer_to_an_older_request_or_after_i_does_not_count() {
    let (mut m, a) = asking_standby(0xa);
    assert!(m.on_partner_answer(I, a.id, true, 0).is_empty(), "after I");
    let (mut m, a) = asking_standby(0xa);
    let b = asked(&m.poll(I));
    assert!(m.on_partner_answer(I + ms(5), a.id, true, 0).is_empty(), "an older request");
    assert!(!m.on_partner_answer(I + ms(5), b.id, true, 0).is_empty());
}

#[test]
fn an_active_box_never_grants() {
    let (mut p, a) = settled();
    let now = p.now;
    let m = p.boxes[a].as_mut().unwrap();
    assert_eq!(answer(&m.on_partner_ask(now, ask(0xf, 1, 0, false))), (false, None));
    assert_eq!(answer(&m.on_partner_ask(now, ask(0xf, 2, 0, true))), (false, None), "nor to an active asker");
}

#[test]
fn a_granted_promise_binds_for_t_no_claim_no_vote_counted() {
    let mut m = machine(0xb);
    let (granted, until) = answer(&m.on_partner_ask(ms(100), ask(0xa, 1, 4, true)));
    assert_eq!((granted, until), (true, Some(ms(100) + T)));
    assert_eq!(m.promised_until(ms(200)), Some(ms(100) + T));
    // A free row is read, not claimed, while the promise runs.
    let id = m
        .poll(ms(200))
        .iter()
        .find_map(|e| if let Effect::Send { id, call: Call::Read, .. } = e { Some(*id) } else { None });
    let fx = m.on_reply(ms(210), id.expect("a read"), Reply::Read(None));
    assert!(!fx.iter().any(|e| matches!(e, Effect::Send { call: Call::Heartbeat, .. })), "{fx:?}");
    assert!(!fx.iter().any(|e| matches!(e, Effect::AskPartner(_))), "and it asks for nothing");
    // After the promise it claims at the next free read.
    let fx = m.poll(ms(100) + T + ms(900));
    let id = fx.iter().find_map(|e| if let Effect::Send { id, .. } = e { Some(*id) } else { None }).expect("a read");
    let fx = m.on_reply(ms(100) + T + ms(910), id, Reply::Read(None));
    assert!(fx.iter().any(|e| matches!(e, Effect::Send { call: Call::Heartbeat, .. })), "{fx:?}");
}

#[test]
fn a_box_bound_by_its_promise_counts_no_grant_and_no_heartbeat() {
    let (mut m, mine) = asking_standby(0xb);
    // The partner's request crosses ours; it has the lower uuid, so we grant.
    assert!(answer(&m.on_partner_ask(ms(5), ask(0xa, 1, 0, false))).0);
    assert!(m.on_partner_answer(ms(10), mine.id, true, 0).is_empty(), "bound: its grant does not count");
    let mut m = machine(0xb);
    let id = m.poll(ms(0)).iter().find_map(|e| if let Effect::Send { id, .. } = e { Some(*id) } else { None });
    let id2 = m
        .on_reply(ms(5), id.unwrap(), Reply::Read(None))
        .iter()
        .find_map(|e| if let Effect::Send { id, .. } = e { Some(*id) } else { None });
    assert!(answer(&m.on_partner_ask(ms(6), ask(0xa, 1, 0, true))).0);
    let fx = m.on_reply(ms(10), id2.expect("a claim"), Reply::Beat(Beat::Applied { ts_us: 0, term: 3 }));
    assert!(fx.is_empty() && m.active_term(ms(10)).is_none(), "a claim applied after the grant does not count: {fx:?}");
}

#[test]
fn crossing_requests_go_to_the_lower_uuid_unless_the_other_is_active() {
    let (mut low, low_ask) = asking_standby(0xa);
    let (mut high, high_ask) = asking_standby(0xb);
    assert!(!answer(&low.on_partner_ask(ms(5), high_ask)).0, "the lower uuid keeps its own request");
    assert!(answer(&high.on_partner_ask(ms(5), low_ask)).0);
    let (mut low, _) = asking_standby(0xa);
    assert!(answer(&low.on_partner_ask(ms(5), PromiseAsk { active: true, ..high_ask })).0, "an active asker wins");
}

#[test]
fn a_release_frees_the_promise_for_that_process_and_requests_up_to_the_id() {
    let mut m = machine(0xb);
    assert!(answer(&m.on_partner_ask(ms(0), ask(0xa, 7, 0, true))).0);
    m.on_partner_release(Uuid::from_u128(0xa), 6);
    assert!(m.promised_until(ms(1)).is_some(), "an older request's release does not free a newer grant");
    m.on_partner_release(Uuid::from_u128(0xc), 7);
    assert!(m.promised_until(ms(1)).is_some(), "another process's release does not either");
    m.on_partner_release(Uuid::from_u128(0xa), 9);
    assert_eq!(m.promised_until(ms(1)), None);
}

/// Found by `make model-check`: a delayed, older request granted after a newer one.
#[test]
fn a_late_older_request_does_not_take_the_promise_back_from_a_newer_one() {
    let mut m = machine(0xb);
    assert!(answer(&m.on_partner_ask(ms(0), ask(0xa, 6, 0, false))).0);
    assert!(answer(&m.on_partner_ask(ms(1), ask(0xa, 4, 0, true))).0, "granted: it only binds this box more");
    m.on_partner_release(Uuid::from_u128(0xa), 4);
    assert!(m.promised_until(ms(2)).is_some(), "still bound by the grant for request 6");
    m.on_partner_release(Uuid::from_u128(0xa), 6);
    assert_eq!(m.promised_until(ms(2)), None);
}

#[test]
fn a_step_down_releases_the_partner_so_it_takes_over_in_about_i() {
    let (mut p, a) = settled();
    let fx = p.boxes[a].as_mut().unwrap().step_down(p.now);
    assert!(fx.iter().any(|e| matches!(e, Effect::ReleasePartner { .. })), "{fx:?}");
    let at = p.now;
    p.run(a, fx);
    p.until(at + 2 * I + STEP);
    assert!(p.active(1 - a), "the partner serves within 2 I of the step-down");
}

#[test]
fn terms_only_grow_across_both_paths() {
    // Elected by the partner above every term it has seen, on either side.
    let (mut m, a) = asking_standby(0xa);
    m.on_partner_ask(ms(1), ask(0xb, 1, 9, false));
    let fx = m.on_partner_answer(ms(2), a.id, true, 4);
    assert!(matches!(fx[..], [Effect::Active { term: 10, .. }]), "{fx:?}");
    assert_eq!(m.heartbeat_term(), 10, "the row is taken at its term at least");
    // A standby's claim floor is above the row's term it read.
    let mut m = machine(0xa);
    let id = m.poll(ms(0)).iter().find_map(|e| if let Effect::Send { id, .. } = e { Some(*id) } else { None });
    let r = HolderRow { term: 12, ..holder((Uuid::from_u128(0xb), None, 12), false) };
    m.on_reply(ms(5), id.unwrap(), Reply::Read(Some(r)));
    assert_eq!(m.heartbeat_term(), 13);
}

#[test]
fn a_restarted_process_keeps_its_predecessors_promise() {
    let params = Params { interval: I, timeout: T };
    let mut m = Elector::new(params, Uuid::from_u128(0xd), UTYPE, ms(1000)).with_promise(Some(ms(4000)));
    let id = m.poll(ms(1000)).iter().find_map(|e| if let Effect::Send { id, .. } = e { Some(*id) } else { None });
    let fx = m.on_reply(ms(1010), id.unwrap(), Reply::Read(None));
    assert!(!fx.iter().any(|e| matches!(e, Effect::Send { call: Call::Heartbeat, .. })), "{fx:?}");
    assert!(m.partner_down(ms(1020)).is_empty(), "nor may the operator override it");
    assert_eq!(m.basis(ms(1020)), None);
}

#[test]
fn a_third_box_of_the_same_utype_switches_the_partner_vote_off() {
    let mut m = machine(0xa);
    m.poll(ms(0));
    let fx = m.on_partner_answer(ms(10), 2, true, 0);
    assert!(fx.iter().any(|e| matches!(e, Effect::Active { .. })), "{fx:?}");
    let fx = m.set_third_box(ms(20), true);
    assert!(fx.contains(&Effect::Demoted(DemoteReason::LeaseExpired)), "only the partner's vote held it: {fx:?}");
    assert!(fx.iter().any(|e| matches!(e, Effect::ReleasePartner { .. })), "{fx:?}");
    assert!(!answer(&m.on_partner_ask(ms(30), ask(0xb, 1, 0, false))).0, "no vote for the partner either");
    assert!(m.partner_down(ms(40)).is_empty(), "nor an operator's word");
    m.set_third_box(ms(50), false);
    assert!(answer(&m.on_partner_ask(ms(60), ask(0xb, 2, 0, false))).0);
}
