use std::net::Ipv4Addr;
use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::config::{Config, LocalAddrs};

pub(crate) fn config(extra: &str) -> Config {
    let text = format!(
        "[node]\nname='t'\n[dhcp]\noffer_hold_secs=30\ndecline_probation_secs=600\naffinity_hold_secs=100\n{extra}\n\
         [[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.10-198.18.0.14']\nlease_secs=1000\n\
         [[reservation]]\nname='anna'\nhw=['02:00:00:00:00:01','02:00:00:00:00:02']\nip='198.18.0.50'\n"
    );
    Config::parse(Path::new("t.toml"), &text, &LocalAddrs::default()).unwrap()
}

use crate::testkit::{ip, key, mac};

fn offer_addr(c: Choice) -> Ipv4Addr {
    match c {
        Choice::Offer { addr, .. } => addr,
        other => panic!("expected an offer, got {other:?}"),
    }
}

#[test]
fn queue_head_is_the_address_free_longest() {
    let mut a = Allocator::new(&config(""));
    assert_eq!(offer_addr(a.choose(0, &key(10), &mac(10), None, None, 5)), ip(10));
    a.lease(ip(10), &key(10), &mac(10), None, 1000, 5);
    assert_eq!(offer_addr(a.choose(0, &key(11), &mac(11), None, None, 5)), ip(11));
    // Released addresses go to the back (affinity hold), after never-used ones.
    a.release(ip(10), &key(10), 6).unwrap();
    for n in 11..=14 {
        let addr = offer_addr(a.choose(0, &key(n), &mac(n), None, None, 7));
        assert_ne!(addr, ip(10), "a stranger got the recently released address while others were free");
        a.lease(addr, &key(n), &mac(n), None, 1000, 7);
    }
    // Only the released one is left: a stranger gets it rather than nothing.
    assert_eq!(offer_addr(a.choose(0, &key(20), &mac(20), None, None, 8)), ip(10));
    a.check_invariants(8).unwrap();
}

#[test]
fn an_exhausted_pool_reclaims_the_offer_made_longest_ago() {
    let mut a = Allocator::new(&config(""));
    a.lease(ip(10), &key(10), &mac(10), None, 1000, 0);
    a.lease(ip(11), &key(11), &mac(11), None, 1000, 0);
    // Three offers, made at 5, 7 and 6 (reserved 198.18.0.50 is for anna only).
    for (n, at) in [(12, 5), (13, 7), (14, 6)] {
        assert_eq!(offer_addr(a.choose(0, &key(n), &mac(n), None, None, at)), ip(n));
        a.offer(ip(n), &key(n), &mac(n), at);
    }
    let reclaim = |a: &Allocator, n| a.choose(0, &key(n), &mac(n), None, None, 8);
    assert_eq!(reclaim(&a, 20), Choice::Reclaim { addr: ip(12), from: key(12) });
    a.offer(ip(12), &key(20), &mac(20), 8);
    assert_eq!(reclaim(&a, 21), Choice::Reclaim { addr: ip(14), from: key(14) });
    // A REQUEST turns an offer into a lease, which is never reclaimed.
    a.lease(ip(14), &key(14), &mac(14), None, 1000, 8);
    assert_eq!(reclaim(&a, 21), Choice::Reclaim { addr: ip(13), from: key(13) });
    a.lease(ip(13), &key(13), &mac(13), None, 1000, 8);
    a.lease(ip(12), &key(20), &mac(20), None, 1000, 8);
    assert_eq!(reclaim(&a, 21), Choice::Exhausted);
    // The reserved address stays out of it, even while it is only offered to its host.
    a.offer(ip(50), &key(1), &mac(1), 8);
    assert_eq!(reclaim(&a, 21), Choice::Exhausted);
    a.check_invariants(8).unwrap();
}

#[test]
fn returning_client_gets_its_previous_address() {
    let mut a = Allocator::new(&config(""));
    a.lease(ip(12), &key(1 + 10), &mac(11), None, 1000, 0);
    a.release(ip(12), &key(11), 10).unwrap();
    assert_eq!(
        a.choose(0, &key(11), &mac(11), None, None, 20),
        Choice::Offer { addr: ip(12), fresh: false, take_over: false }
    );
}

#[test]
fn requested_address_is_honoured_when_free_but_not_when_held_for_another() {
    let mut a = Allocator::new(&config(""));
    assert_eq!(offer_addr(a.choose(0, &key(11), &mac(11), None, Some(ip(13)), 0)), ip(13));
    a.lease(ip(13), &key(11), &mac(11), None, 1000, 0);
    a.release(ip(13), &key(11), 10).unwrap();
    // Held for key(11) for the affinity hold (100 s): another client asking for it gets the head.
    assert_eq!(offer_addr(a.choose(0, &key(12), &mac(12), None, Some(ip(13)), 20)), ip(10));
    // After the hold it may have it.
    assert_eq!(offer_addr(a.choose(0, &key(12), &mac(12), None, Some(ip(13)), 200)), ip(13));
}

#[test]
fn release_by_a_non_owner_changes_nothing() {
    let mut a = Allocator::new(&config(""));
    a.lease(ip(10), &key(11), &mac(11), None, 1000, 0);
    let before = a.binding(ip(10)).unwrap().clone();
    assert!(a.release(ip(10), &key(12), 5).is_none());
    assert!(a.quarantine(ip(10), &key(12), 5).is_none());
    assert_eq!(a.binding(ip(10)).unwrap(), &before);
}

#[test]
fn stale_transition_is_refused() {
    let mut a = Allocator::new(&config(""));
    let t = a.lease(ip(10), &key(11), &mac(11), None, 1000, 0).pop().unwrap();
    a.lease(ip(10), &key(11), &mac(11), None, 1000, 50); // a renew in between
    assert!(matches!(a.apply(&t), Err(AllocError::VersionMismatch { .. })));
}

#[test]
fn client_never_holds_two_addresses() {
    let mut a = Allocator::new(&config(""));
    a.lease(ip(10), &key(11), &mac(11), None, 1000, 0);
    let ts = a.lease(ip(11), &key(11), &mac(11), None, 1000, 1);
    assert_eq!(ts.len(), 2, "the old address is freed in the same change");
    assert_eq!(a.binding(ip(10)).unwrap().state, LeaseState::Free);
    a.check_invariants(1).unwrap();
}

#[test]
fn alias_group_holds_one_address_one_member_at_a_time() {
    let mut a = Allocator::new(&config(""));
    assert_eq!(
        a.choose(0, &key(1), &mac(1), None, None, 0),
        Choice::Offer { addr: ip(50), fresh: true, take_over: false }
    );
    a.lease(ip(50), &key(1), &mac(1), None, 1000, 0);
    match a.choose(0, &key(2), &mac(2), None, None, 10) {
        Choice::HeldOff { group, holder } => {
            assert_eq!(group, "anna");
            assert_eq!(holder, key(1));
        }
        other => panic!("{other:?}"),
    }
    // Once the first member's lease ends, the second gets the address.
    assert_eq!(offer_addr(a.choose(0, &key(2), &mac(2), None, None, 1001)), ip(50));
    // Non-members never get the reserved address, even by asking for it.
    assert_ne!(offer_addr(a.choose(0, &key(9), &mac(9), None, Some(ip(50)), 0)), ip(50));
    assert_eq!(a.may_lease(ip(50), &key(9), &mac(9), None, 2000), Err(LeaseRefusal::ReservedForOther));
}

#[test]
fn alias_take_over_abandons_the_older_lease() {
    let mut a = Allocator::new(&config("on_alias_busy='take-over'"));
    a.lease(ip(50), &key(1), &mac(1), None, 1000, 0);
    assert_eq!(
        a.choose(0, &key(2), &mac(2), None, None, 10),
        Choice::Offer { addr: ip(50), fresh: false, take_over: true }
    );
    a.offer(ip(50), &key(2), &mac(2), 10);
    assert!(a.binding(ip(50)).unwrap().is_owned_by(&key(2)));
    assert_eq!(a.may_lease(ip(50), &key(1), &mac(1), None, 11), Err(LeaseRefusal::HeldByOther));
}

#[test]
fn decline_quarantines_for_the_probation() {
    let mut a = Allocator::new(&config(""));
    a.lease(ip(10), &key(11), &mac(11), None, 1000, 0);
    a.quarantine(ip(10), &key(11), 5).unwrap();
    assert_eq!(a.may_lease(ip(10), &key(12), &mac(12), None, 100), Err(LeaseRefusal::Quarantined));
    assert!(a.reap(604, 100).is_empty(), "still in probation");
    let freed = a.reap(605, 100);
    assert_eq!(freed.len(), 1);
    assert_eq!(freed[0].new.owner, None);
    a.check_invariants(605).unwrap();
}

#[test]
fn one_client_may_decline_only_its_share_within_the_probation() {
    let mut a = Allocator::new(&config(""));
    let (c, hw) = (key(11), mac(11));
    // The client declines every address it is given: the pool has five.
    for (n, t) in (10..=12).zip([0, 10, 20]) {
        a.lease(ip(n), &c, &hw, None, 1000, t);
        assert!(matches!(a.decline(ip(n), &c, t), Decline::Quarantined(_)), "decline {n}");
    }
    a.lease(ip(13), &c, &hw, None, 1000, 30);
    assert_eq!(a.decline(ip(13), &c, 30), Decline::OverLimit);
    assert_eq!(a.binding(ip(13)).unwrap().state, LeaseState::Leased, "its lease is left alone");
    assert_eq!(offer_addr(a.choose(0, &key(12), &mac(12), None, None, 31)), ip(14), "others still get addresses");
    // A decline of an address the client does not hold changes nothing and counts nothing.
    assert_eq!(a.decline(ip(14), &key(12), 31), Decline::NotHolder);
    // Once the first decline's probation is over, the client may decline again.
    assert!(matches!(a.decline(ip(13), &c, 600), Decline::Quarantined(_)));
    a.check_invariants(600).unwrap();
}

#[test]
fn exhaustion_means_no_offer() {
    let mut a = Allocator::new(&config(""));
    for n in 0..5 {
        let addr = offer_addr(a.choose(0, &key(20 + n), &mac(20 + n), None, None, 0));
        a.lease(addr, &key(20 + n), &mac(20 + n), None, 1000, 0);
    }
    assert_eq!(a.choose(0, &key(30), &mac(30), None, None, 0), Choice::Exhausted);
}

#[test]
fn reaper_walks_all_expired_entries_in_batches_and_nothing_else() {
    let text =
        "[node]\nname='t'\n[[subnet]]\ncidr='198.18.0.0/20'\npools=['198.18.0.10-198.18.15.200']\nlease_secs=100\n";
    let c = Config::parse(Path::new("t.toml"), text, &LocalAddrs::default()).unwrap();
    let mut a = Allocator::new(&c);
    let addrs: Vec<Ipv4Addr> = c.subnets[0].dynamic_addresses().take(2500).collect();
    for (i, addr) in addrs.iter().enumerate() {
        let k = ClientKey::from_hw(1, &(i as u32).to_be_bytes());
        a.lease(*addr, &k, &[], None, if i % 2 == 0 { 100 } else { 10_000 }, 0);
    }
    let mut freed = 0;
    loop {
        let batch = a.reap(500, 1000);
        assert!(batch.iter().all(|t| t.new.state == LeaseState::Free));
        freed += batch.len();
        if batch.len() < 1000 {
            break;
        }
    }
    assert_eq!(freed, 1250, "beyond the seed simulation's first-1000-keys limit");
    assert_eq!(a.bindings().filter(|b| b.state == LeaseState::Leased).count(), 1250);
    a.check_invariants(500).unwrap();
}

#[test]
fn queued_and_busy_is_repaired() {
    let mut a = Allocator::new(&config(""));
    a.lease(ip(10), &key(11), &mac(11), None, 1000, 0);
    a.corrupt_enqueue(ip(10));
    assert!(a.check_invariants(0).is_err());
    // Allocation skips the bogus queue entry...
    assert_ne!(offer_addr(a.choose(0, &key(12), &mac(12), None, None, 0)), ip(10));
    // ...and the repair pass removes it.
    assert_eq!(a.repair_queue(1000), 1);
    a.check_invariants(0).unwrap();
}

/// The allocator is built at start and again after every failed commit: from the subnet's
/// pools-minus-exclusions ranges, so 20,000 exclusions on a /15 cost one pass over the pool.
#[test]
fn a_big_pool_with_many_exclusions_holds_each_dynamic_address_once() {
    let first = u32::from(Ipv4Addr::new(198, 18, 0, 3));
    let excluded: Vec<Ipv4Addr> = (0..20_000).map(|i| Ipv4Addr::from(first + 6 * i)).collect();
    let list: Vec<String> = excluded.iter().map(|a| format!("'{a}'")).collect();
    let text = format!(
        "[node]\nname='t'\n[dhcp]\nmax_pool_addresses=131072\n[[subnet]]\ncidr='198.18.0.0/15'\n\
         pools=['198.18.0.1-198.19.255.254']\nexclude=[{}]\n\
         [[reservation]]\nname='in-pool'\nhw=['02:00:00:00:00:01']\nip='198.18.0.4'\n\
         [[reservation]]\nname='excluded'\nhw=['02:00:00:00:00:02']\nip='198.18.0.9'\n",
        list.join(",")
    );
    let c = Config::parse(Path::new("t.toml"), &text, &LocalAddrs::default()).unwrap();
    let a = Allocator::new(&c);
    // Every pool address but the exclusions, plus the reservation on an excluded address.
    assert_eq!(a.len(), 131_070 - excluded.len() + 1);
    assert_eq!(a.count(LeaseState::Free), a.len());
    assert!(excluded.iter().filter(|x| **x != Ipv4Addr::new(198, 18, 0, 9)).all(|x| a.binding(*x).is_none()));
    assert_eq!(a.reservation_of(Ipv4Addr::new(198, 18, 0, 4)), Some("in-pool"));
    assert_eq!(a.reservation_of(Ipv4Addr::new(198, 18, 0, 9)), Some("excluded"));
    // The queue head is the lowest dynamic address: .1 (.3 excluded, .4 reserved, .2 free).
    assert_eq!(offer_addr(a.choose(0, &key(77), &mac(77), None, None, 0)), Ipv4Addr::new(198, 18, 0, 1));
    a.check_invariants(0).unwrap();
}

// ---- properties --------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Discover(u8),
    Request(u8, u8),
    Release(u8, u8),
    Decline(u8, u8),
    Advance(u16),
    Reap,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..8).prop_map(Op::Discover),
        4 => (0u8..8, 8u8..16).prop_map(|(c, a)| Op::Request(c, a)),
        2 => (0u8..8, 8u8..16).prop_map(|(c, a)| Op::Release(c, a)),
        1 => (0u8..8, 8u8..16).prop_map(|(c, a)| Op::Decline(c, a)),
        2 => (0u16..2000).prop_map(Op::Advance),
        1 => Just(Op::Reap),
    ]
}

/// Members 1 and 2 form the alias group; the rest are ordinary clients.
fn member(c: u8) -> (ClientKey, [u8; 6]) {
    (key(c), mac(c))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn invariants_hold_under_any_sequence(ops in prop::collection::vec(op(), 1..120), take_over in any::<bool>()) {
        let mut a = Allocator::new(&config(if take_over { "on_alias_busy='take-over'" } else { "" }));
        let mut now: UnixSecs = 1;
        for op in ops {
            match op {
                Op::Discover(c) => {
                    let (k, m) = member(c);
                    if let Choice::Offer { addr, .. } = a.choose(0, &k, &m, None, None, now) {
                        a.offer(addr, &k, &m, now);
                    }
                }
                Op::Request(c, last) => {
                    let (k, m) = member(c);
                    let addr = ip(if last == 15 { 50 } else { last + 2 });
                    let before = a.binding(addr).cloned();
                    match a.may_lease(addr, &k, &m, None, now) {
                        Ok(()) => { a.lease(addr, &k, &m, None, 1000, now); }
                        Err(_) => prop_assert_eq!(a.binding(addr).cloned(), before),
                    }
                }
                Op::Release(c, last) => {
                    let (k, _) = member(c);
                    let addr = ip(last + 2);
                    let before = a.binding(addr).cloned();
                    let owned = before.as_ref().is_some_and(|b| b.is_owned_by(&k));
                    let t = a.release(addr, &k, now);
                    if !owned {
                        prop_assert!(t.is_none());
                        prop_assert_eq!(a.binding(addr).cloned(), before);
                    }
                }
                Op::Decline(c, last) => {
                    let (k, _) = member(c);
                    let addr = ip(last + 2);
                    let before = a.binding(addr).cloned();
                    if a.quarantine(addr, &k, now).is_none() {
                        prop_assert_eq!(a.binding(addr).cloned(), before);
                    }
                }
                Op::Advance(d) => now += u64::from(d),
                Op::Reap => {
                    let expired: Vec<Ipv4Addr> = a.bindings().filter(|b| b.state.is_busy() && b.expires <= now).map(|b| b.addr).collect();
                    let live: Vec<Binding> = a.bindings().filter(|b| b.is_live(now)).cloned().collect();
                    let freed = a.reap(now, 3);
                    let freed_more = a.reap(now, usize::MAX);
                    let mut got: Vec<Ipv4Addr> = freed.iter().chain(&freed_more).map(|t| t.new.addr).collect();
                    got.sort();
                    let mut want = expired.clone();
                    want.sort();
                    prop_assert_eq!(got, want, "the reaper frees exactly the expired entries");
                    for b in live {
                        prop_assert_eq!(a.binding(b.addr), Some(&b));
                    }
                }
            }
            prop_assert!(a.check_invariants(now).is_ok(), "{:?}", a.check_invariants(now));
            // Queue order: a stranger (no history, no request) is offered the queue minimum.
            let stranger = ClientKey::from_hw(1, &[9, 9, 9, 9, 9, 9]);
            if let Choice::Offer { addr, .. } = a.choose(0, &stranger, &[9; 6], None, None, now) {
                let min = a.bindings().filter(|b| b.state == LeaseState::Free && a.reservation_of(b.addr).is_none()).map(|b| (b.expires, b.addr)).min().unwrap();
                prop_assert_eq!(addr, min.1);
            }
        }
    }
}
