//! The election machine, one seed step at a time, plus a property test of its two promises:
//! the lease never outlives (confirmed heartbeat send + T − I), and at most two calls per I.

use std::time::Duration;

use proptest::prelude::*;

use super::machine::{Call, DemoteReason, Effect, Elector, Reply};
use super::{Beat, HolderRow, Params, Uuid};

const I: Duration = Duration::from_secs(1);
const T: Duration = Duration::from_secs(5);
const UTYPE: &str = "branch42/dhcp";

fn params() -> Params {
    Params { interval: I, timeout: T }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn me() -> Uuid {
    Uuid::from_u128(0xa)
}

fn other() -> Uuid {
    Uuid::from_u128(0xb)
}

fn row(uuid: Uuid, live: bool) -> HolderRow {
    HolderRow {
        utype: UTYPE.into(),
        uuid,
        name: "n".into(),
        endpoint: "e".into(),
        term: 7,
        timeout_ms: 5000,
        ts_us: 0,
        age_ms: if live { 100 } else { 9000 },
        live,
    }
}

fn sent(effects: &[Effect]) -> Option<(u64, Call)> {
    effects.iter().find_map(|e| match e {
        Effect::Send { id, call, .. } => Some((*id, *call)),
        _ => None,
    })
}

/// The effects that concern the arbiter and the role: an active box also asks its partner
/// for a vote at every tick, and releases it on demotion.
fn arbiter_side(effects: Vec<Effect>) -> Vec<Effect> {
    effects
        .into_iter()
        .filter(|e| !matches!(e, Effect::AskPartner(_) | Effect::AnswerPartner { .. } | Effect::ReleasePartner { .. }))
        .collect()
}

fn one_send(effects: &[Effect], want: Call) -> u64 {
    let (id, call) = sent(effects).unwrap_or_else(|| panic!("expected a {want:?} call in {effects:?}"));
    assert_eq!(call, want, "{effects:?}");
    id
}

/// A machine that became active at t = 0 (read empty, claim applied), term 1.
fn active() -> Elector {
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    let id = one_send(&m.on_reply(ms(10), id, Reply::Read(None)), Call::Heartbeat);
    let fx = m.on_reply(ms(20), id, Reply::Beat(Beat::Applied { ts_us: 1, term: 1 }));
    assert_eq!(fx, vec![Effect::Active { term: 1, until: ms(10) + T - I, renewed: false }]);
    m
}

#[test]
fn step_1_2_a_new_node_reads_once_per_interval() {
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    assert_eq!(m.uuid(), me());
    let id = one_send(&m.poll(ms(0)), Call::Read);
    assert!(m.poll(ms(500)).is_empty(), "nothing until the next tick");
    assert!(m.on_reply(ms(30), id, Reply::Read(Some(row(other(), true)))).is_empty(), "someone else is primary: wait");
    assert_eq!(m.wake_at(), ms(1000));
    one_send(&m.poll(ms(1000)), Call::Read);
    assert_eq!(m.active_term(ms(1000)), None);
}

#[test]
fn step_3_an_empty_answer_makes_it_claim_at_once() {
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    one_send(&m.on_reply(ms(10), id, Reply::Read(None)), Call::Heartbeat);
    // An expired row is as good as none.
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    one_send(&m.on_reply(ms(10), id, Reply::Read(Some(row(other(), false)))), Call::Heartbeat);
}

#[test]
fn step_4a_an_applied_claim_makes_it_active_from_the_claims_send_time() {
    let m = active();
    assert_eq!(m.active_term(ms(3999)), Some(1));
    assert_eq!(m.active_term(ms(4010)), None, "claim sent at 10 ms: active until 10 ms + T - I");
}

#[test]
fn step_4b_a_rejected_claim_goes_back_to_reading() {
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    let id = one_send(&m.on_reply(ms(10), id, Reply::Read(None)), Call::Heartbeat);
    assert!(m.on_reply(ms(20), id, Reply::Beat(Beat::NotApplied)).is_empty());
    one_send(&m.poll(ms(1000)), Call::Read);
}

#[test]
fn step_4c_a_failed_or_corrupt_claim_is_retried_at_the_next_tick() {
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    let id = one_send(&m.on_reply(ms(10), id, Reply::Read(None)), Call::Heartbeat);
    assert!(m.on_reply(ms(20), id, Reply::Failed("the arbiter returned a corrupt row".into())).is_empty());
    assert_eq!(m.active_term(ms(21)), None);
    let id = one_send(&m.poll(ms(1000)), Call::Heartbeat);
    // A claim that gets no answer at all is retried too.
    assert!(m.poll(ms(1999)).is_empty());
    let fx = m.poll(ms(2000));
    one_send(&fx, Call::Heartbeat);
    assert!(
        m.on_reply(ms(2001), id, Reply::Beat(Beat::Applied { ts_us: 1, term: 1 })).is_empty(),
        "the abandoned call's answer is ignored"
    );
}

#[test]
fn step_4c_a_read_for_another_utype_is_no_answer() {
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    let mut wrong = row(me(), true);
    wrong.utype = "branch43/dhcp".into();
    assert!(m.on_reply(ms(10), id, Reply::Read(Some(wrong))).is_empty(), "neither claim nor promote");
    assert_eq!(m.active_term(ms(11)), None);
    one_send(&m.poll(ms(1000)), Call::Read);
}

#[test]
fn step_4d_an_empty_answer_after_a_lost_claim_claims_again() {
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    let id = one_send(&m.on_reply(ms(10), id, Reply::Read(None)), Call::Heartbeat);
    assert!(m.on_reply(ms(20), id, Reply::Beat(Beat::NotApplied)).is_empty());
    let id = one_send(&m.poll(ms(1000)), Call::Read);
    one_send(&m.on_reply(ms(1010), id, Reply::Read(None)), Call::Heartbeat);
}

#[test]
fn seeing_its_own_row_does_not_make_a_node_active_only_a_confirmed_heartbeat_does() {
    // The seed's bug: "GetPrimary returned me" was taken as a lease. Here it only triggers a
    // renewal, and the renewal's confirmation starts the lease.
    // It claimed the free row, and the claim's answer was lost or came back wrong: the row it
    // then reads may be its own.
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    let id = one_send(&m.on_reply(ms(5), id, Reply::Read(None)), Call::Heartbeat);
    m.on_reply(ms(8), id, Reply::Beat(Beat::NotApplied));
    let (id, t) = next_send(&mut m, ms(9), Call::Read);
    let fx = m.on_reply(t + ms(1), id, Reply::Read(Some(row(me(), true))));
    let id = one_send(&fx, Call::Heartbeat);
    assert!(!fx.iter().any(|e| matches!(e, Effect::Active { .. })));
    assert_eq!(m.active_term(t + ms(2)), None);
    let fx = m.on_reply(t + ms(10), id, Reply::Beat(Beat::Applied { ts_us: 5, term: 7 }));
    assert_eq!(fx, vec![Effect::Active { term: 7, until: t + ms(1) + T - I, renewed: false }]);
}

/// Polls every millisecond from `from` until the machine sends `want`; its id and the time.
fn next_send(m: &mut Elector, from: Duration, want: Call) -> (u64, Duration) {
    (0..10_000u64)
        .map(|k| from + ms(k))
        .find_map(|t| sent(&m.poll(t)).map(|(id, call)| (id, call, t)))
        .map(|(id, call, t)| {
            assert_eq!(call, want);
            (id, t)
        })
        .expect("a call within 10 s")
}

#[test]
fn a_row_naming_this_node_that_it_never_wrote_is_left_to_expire() {
    // A confused or tampered arbiter rewrites the active's row with this standby's uuid. The
    // standby never claimed it since it saw the other's row, so it does not renew it (the other
    // may still be serving); once the row expires it claims it like any free row.
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    assert!(
        m.on_reply(ms(5), id, Reply::Read(Some(row(other(), true)))).iter().all(|e| !matches!(e, Effect::Send { .. }))
    );
    let (id, t) = next_send(&mut m, ms(6), Call::Read);
    let fx = m.on_reply(t + ms(1), id, Reply::Read(Some(row(me(), true))));
    assert!(sent(&fx).is_none() && m.active_term(t + ms(2)).is_none(), "{fx:?}");
    let (id, t) = next_send(&mut m, t + ms(2), Call::Read);
    let fx = m.on_reply(t + ms(1), id, Reply::Read(Some(row(me(), false))));
    one_send(&fx, Call::Heartbeat);
}

#[test]
fn step_5_the_active_renews_every_interval_and_the_lease_follows_the_send_time() {
    let mut m = active();
    let id = one_send(&m.poll(ms(1000)), Call::Heartbeat);
    let fx = m.on_reply(ms(1400), id, Reply::Beat(Beat::Applied { ts_us: 2, term: 1 }));
    assert_eq!(
        fx,
        vec![Effect::Active { term: 1, until: ms(1000) + T - I, renewed: true }],
        "from the send (1000 ms), not the answer (1400 ms)"
    );
    assert_eq!(m.lease_end(), Some(ms(5000)));
}

#[test]
fn step_5a_a_rejected_heartbeat_demotes_at_once() {
    let mut m = active();
    let id = one_send(&m.poll(ms(1000)), Call::Heartbeat);
    assert_eq!(
        arbiter_side(m.on_reply(ms(1010), id, Reply::Beat(Beat::NotApplied))),
        vec![Effect::Demoted(DemoteReason::HeartbeatRejected)]
    );
    assert_eq!(m.active_term(ms(1011)), None);
    one_send(&m.poll(ms(2000)), Call::Read);
}

#[test]
fn step_5a_no_confirmed_heartbeat_for_t_minus_i_demotes_on_time() {
    let mut m = active();
    // Writes fail from now on; every heartbeat errors or times out.
    let mut t = 1000;
    let mut demoted_at = None;
    while t <= 6000 {
        for e in m.poll(ms(t)) {
            match e {
                Effect::Send { id, .. } if t % 2000 == 0 => {
                    assert!(m.on_reply(ms(t + 5), id, Reply::Failed("read-only".into())).is_empty());
                }
                Effect::Demoted(DemoteReason::LeaseExpired) => demoted_at = Some(t),
                _ => {}
            }
        }
        t = m.wake_at().as_millis() as u64;
    }
    assert_eq!(demoted_at, Some(4010), "claim sent at 10 ms, T - I = 4 s");
    assert_eq!(m.active_term(ms(4010)), None);
}

#[test]
fn the_lease_end_is_a_wake_up_even_with_a_call_in_flight() {
    let mut m = active();
    for t in [1000, 2000, 3000] {
        let id = one_send(&m.poll(ms(t)), Call::Heartbeat);
        m.on_reply(ms(t + 1), id, Reply::Failed("x".into()));
    }
    one_send(&m.poll(ms(4000)), Call::Heartbeat);
    assert_eq!(m.wake_at(), ms(4010), "lease end (4010) before the call deadline (5000)");
    assert_eq!(arbiter_side(m.poll(ms(4010))), vec![Effect::Demoted(DemoteReason::LeaseExpired)]);
}

#[test]
fn an_answer_after_the_deadline_does_not_count() {
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    let id = one_send(&m.on_reply(ms(10), id, Reply::Read(None)), Call::Heartbeat);
    // Deadline is 10 ms + I; the answer arrives later (the driver should have dropped it).
    assert!(m.on_reply(ms(1011), id, Reply::Beat(Beat::Applied { ts_us: 1, term: 1 })).is_empty());
    assert_eq!(m.active_term(ms(1012)), None);
}

#[test]
fn a_term_change_is_a_new_promotion_not_a_renewal() {
    let mut m = active();
    let id = one_send(&m.poll(ms(1000)), Call::Heartbeat);
    assert_eq!(
        m.on_reply(ms(1010), id, Reply::Beat(Beat::Applied { ts_us: 3, term: 2 })),
        vec![Effect::Active { term: 2, until: ms(5000), renewed: false }]
    );
}

#[test]
fn a_different_t_on_the_arbiter_halts() {
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    let mut r = row(other(), false);
    r.timeout_ms = 3000;
    let fx = m.on_reply(ms(10), id, Reply::Read(Some(r)));
    assert!(
        matches!(&fx[..], [Effect::Halt(why)] if why.to_string().contains("T = 3000 ms") && why.to_string().contains("timeout_ms = 5000")),
        "{fx:?}"
    );
    assert!(m.is_halted());
    assert!(m.poll(ms(5000)).is_empty());
    assert_eq!(m.wake_at(), Duration::MAX);
}

#[test]
fn missed_ticks_are_skipped_not_replayed() {
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    let id = one_send(&m.poll(ms(0)), Call::Read);
    m.on_reply(ms(5), id, Reply::Read(Some(row(other(), true))));
    let fx = m.poll(ms(10_500));
    assert_eq!(fx.iter().filter(|e| matches!(e, Effect::Send { .. })).count(), 1);
    assert_eq!(m.wake_at(), ms(11_000));
}

#[test]
fn answers_to_unknown_calls_are_ignored() {
    let mut m = active();
    assert!(m.on_reply(ms(100), 999, Reply::Beat(Beat::NotApplied)).is_empty());
    assert_eq!(m.active_term(ms(100)), Some(1));
}

#[test]
fn an_ineligible_box_steps_down_at_once_and_never_heartbeats() {
    let mut m = active();
    let fx = arbiter_side(m.set_eligible(ms(50), false));
    assert_eq!(fx[0], Effect::Demoted(DemoteReason::Ineligible));
    // It hands the row over as a step-down does, so the partner need not wait for it to expire.
    let id = one_send(&fx, Call::Release);
    assert!(m.on_reply(ms(60), id, Reply::Released(true)).is_empty());
    assert_eq!(m.active_term(ms(100)), None);
    // Only reads from now on, whatever the arbiter says: its own live row is not renewed, a free
    // row is not claimed, and a heartbeat answer still in flight does not promote.
    for (t, answer) in [(1000, row(me(), true)), (2000, row(other(), false))] {
        let id = one_send(&m.poll(ms(t)), Call::Read);
        assert_eq!(sent(&m.on_reply(ms(t + 10), id, Reply::Read(Some(answer)))), None);
    }
    let id = one_send(&m.poll(ms(3000)), Call::Read);
    assert!(m.on_reply(ms(3010), id, Reply::Read(None)).is_empty());
    assert!(!m.is_eligible());
}

#[test]
fn a_heartbeat_answered_after_stepping_down_does_not_promote() {
    let mut m = active();
    let id = one_send(&m.poll(ms(1000)), Call::Heartbeat);
    m.set_eligible(ms(1001), false);
    assert!(m.on_reply(ms(1010), id, Reply::Beat(Beat::Applied { ts_us: 2, term: 1 })).is_empty());
    assert_eq!(m.active_term(ms(1020)), None);
    // A failed one does not turn into a claim either.
    let mut m = active();
    let id = one_send(&m.poll(ms(1000)), Call::Heartbeat);
    m.set_eligible(ms(1001), false);
    m.on_reply(ms(1010), id, Reply::Failed("gone".into()));
    // (After the release it sent instead, unanswered until its deadline.)
    one_send(&m.poll(ms(2500)), Call::Read);
}

#[test]
fn an_eligible_box_again_stands_at_the_next_free_read_after_t() {
    let mut m = active();
    let id = one_send(&m.set_eligible(ms(100), false), Call::Release);
    m.on_reply(ms(110), id, Reply::Released(true));
    assert!(m.set_eligible(ms(200), true).is_empty(), "becoming eligible changes no role by itself");
    // Within T of standing down the free row is left to the partner.
    let id = one_send(&m.poll(ms(1000)), Call::Read);
    assert!(m.on_reply(ms(1010), id, Reply::Read(None)).is_empty());
    let id = one_send(&m.poll(ms(6000)), Call::Read);
    let id = one_send(&m.on_reply(ms(6010), id, Reply::Read(None)), Call::Heartbeat);
    let fx = m.on_reply(ms(6020), id, Reply::Beat(Beat::Applied { ts_us: 3, term: 2 }));
    assert_eq!(fx, vec![Effect::Active { term: 2, until: ms(6010) + T - I, renewed: false }]);
}

#[test]
fn a_box_eligible_again_at_once_does_not_take_back_its_live_row() {
    // A full disk: the commit fails, the box stands down; the probe passes a moment later. Its
    // release did not reach the arbiter, so the row still names it and is alive: it is left
    // to the partner, not renewed (which had kept the partner out for as long as it flapped).
    let mut m = active();
    let id = one_send(&m.set_eligible(ms(100), false), Call::Release);
    m.on_reply(ms(110), id, Reply::Failed("unreachable".into()));
    m.set_eligible(ms(600), true);
    let id = one_send(&m.poll(ms(1000)), Call::Read);
    assert_eq!(sent(&m.on_reply(ms(1010), id, Reply::Read(Some(row(me(), true))))), None);
    assert_eq!(m.active_term(ms(1020)), None);
    // A standby turned ineligible holds no row and releases nothing.
    let mut m = Elector::new(params(), me(), UTYPE, ms(0));
    assert!(m.set_eligible(ms(10), false).is_empty());
}

#[test]
fn a_step_down_releases_the_row_and_holds_off_for_t() {
    let mut m = active();
    let fx = m.step_down(ms(100));
    assert_eq!(fx[0], Effect::Demoted(DemoteReason::SteppedDown));
    let id = one_send(&fx, Call::Release);
    assert_eq!(m.active_term(ms(100)), None);
    assert!(m.on_reply(ms(110), id, Reply::Released(true)).is_empty());
    assert_eq!(m.holding_off(ms(200)), Some(ms(100) + T));
    // The row is free, but the partner gets it: no claim before the hold-off ends.
    let id = one_send(&m.poll(ms(1000)), Call::Read);
    assert!(m.on_reply(ms(1010), id, Reply::Read(None)).is_empty());
    // After T, still free: the partner never came, so this box stands again.
    let id = one_send(&m.poll(ms(5100)), Call::Read);
    one_send(&m.on_reply(ms(5110), id, Reply::Read(None)), Call::Heartbeat);
}

#[test]
fn a_step_down_abandons_a_heartbeat_in_flight() {
    let mut m = active();
    let beat = one_send(&m.poll(ms(1000)), Call::Heartbeat);
    one_send(&m.step_down(ms(1001)), Call::Release);
    assert!(m.on_reply(ms(1002), beat, Reply::Beat(Beat::Applied { ts_us: 2, term: 1 })).is_empty());
    assert_eq!(m.active_term(ms(1003)), None);
}

#[derive(Debug, Clone)]
enum Step {
    Wait(u64),
    Answer(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![(1u64..1500).prop_map(Step::Wait), (0u8..6).prop_map(Step::Answer)]
}

proptest! {
    /// Whatever the arbiter answers and whenever: the lease never reaches past the send time
    /// of a heartbeat that the arbiter confirmed + (T − I), and no window of length I holds
    /// more than two calls.
    #[test]
    fn lease_and_call_budget_hold_for_any_answers(steps in proptest::collection::vec(step(), 1..200)) {
        let mut m = Elector::new(params(), me(), UTYPE, ms(0));
        let mut now = ms(0);
        let mut inflight: Option<(u64, Call, Duration)> = None;
        let mut sends: Vec<Duration> = Vec::new();
        let mut confirmed_send: Option<Duration> = None;
        let mut fx = m.poll(now);
        for s in steps {
            for e in &fx {
                if let Effect::Send { id, call, .. } = e {
                    inflight = Some((*id, *call, now));
                    sends.push(now);
                }
                if let Effect::Active { until, .. } = e {
                    let c = confirmed_send.expect("active without a confirmed heartbeat");
                    prop_assert!(*until <= c + T - I);
                }
            }
            fx = match s {
                Step::Wait(d) => {
                    now = (now + ms(d)).min(m.wake_at().max(now));
                    m.poll(now)
                }
                Step::Answer(k) => {
                    let Some((id, call, at)) = inflight.take() else { continue };
                    let reply = match (k, call) {
                        (0, _) => Reply::Failed("x".into()),
                        (1, Call::Read) => Reply::Read(None),
                        (2, Call::Read) => Reply::Read(Some(row(other(), true))),
                        (_, Call::Read) => Reply::Read(Some(row(me(), true))),
                        (1 | 2, Call::Heartbeat) => Reply::Beat(Beat::NotApplied),
                        (_, Call::Heartbeat) => {
                            confirmed_send = Some(at);
                            Reply::Beat(Beat::Applied { ts_us: 1, term: 1 })
                        }
                        (_, Call::Release) => Reply::Released(true),
                    };
                    m.on_reply(now, id, reply)
                }
            };
            if let Some(t) = m.active_term(now) {
                prop_assert!(t >= 1);
                prop_assert!(now < confirmed_send.unwrap() + T - I);
            }
        }
        // Ticks are at k·I: each tick period holds the tick's call and at most one follow-up.
        for s in &sends {
            let k = s.as_nanos() / I.as_nanos();
            let in_period = sends.iter().filter(|x| x.as_nanos() / I.as_nanos() == k).count();
            prop_assert!(in_period <= 2, "{} calls in interval {}: {:?}", in_period, k, sends);
        }
    }
}
