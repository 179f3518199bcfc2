//! Failover as a branch office lives it: two twinlease boxes on one client LAN with a peer link,
//! the election arbitrated by a real PostgreSQL in a namespace of its own, nothing pinned.
//! Under load, kill -9 the active: the standby takes over within T + I + 1 s, new clients are
//! served from then on, every lease the dead box ACKed is on the new active (before-ack), and a
//! client renewing its lease keeps its address. Then the dead box comes back reflashed (empty
//! state dir): it catches up from the partner before it enters the election, stays standby and
//! ends up with the same table.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use common::arbiter::*;
use common::pair::*;
use common::site::*;
use common::*;

#[test]
fn kill_9_of_the_active_under_load_then_a_reflashed_box_rejoins() {
    let mut site = Site::new(3);
    site.start(0);
    site.start(1);
    let a =
        wait_for("a box to win the election", Duration::from_secs(30), || (0..2).find(|&i| site.srv(i).is_active()));
    let b = 1 - a;
    site.srv(a).wait_partner("the partner in sync", Duration::from_secs(15), |p| p.in_sync);
    assert!(!site.srv(b).is_active(), "both active:\n{}", site.logs());

    // A real client gets its lease from the active and goes quiet (lease file kept).
    let (cns, ciface) = site.p.client(0);
    let cdir = site.p.dir.path().join("client");
    std::fs::create_dir_all(&cdir).unwrap();
    let (mut dh, ev) = dhclient(cns, ciface, &cdir, &[]);
    let bound = wait_event(&ev, &["BOUND"], 0, Duration::from_secs(20));
    assert_eq!(bound.get("server"), Some(lan_ip(a).as_str()));
    let lease_file = cdir.join(format!("dhclient-{ciface}.leases"));
    wait_for("dhclient's lease file", Duration::from_secs(10), || {
        std::fs::read_to_string(&lease_file).ok().filter(|t| t.contains(&bound.ip)).map(|_| ())
    });
    let _ = dh.kill();
    let _ = dh.wait();

    // Load: new clients through a relay to the active, and through another relay to the
    // standby (which must stay silent until it wins). Both runs are bounded in time.
    let cap_active = Capture::start(site.p.client(1).0, site.p.client(1).1, &site.p.dir.path().join("to-active.pcap"));
    let cap_standby =
        Capture::start(site.p.client(2).0, site.p.client(2).1, &site.p.dir.path().join("to-standby.pcap"));
    let mut load_a = perfdhcp(&site.p, 1, "198.18.0.9", &lan_ip(a), 50, 200, 12);
    let mut load_b = perfdhcp(&site.p, 2, "198.18.0.10", &lan_ip(b), 10, 60, 12);
    wait_for("60 leases granted by the active", Duration::from_secs(20), || {
        (site.srv(a).leases().iter().filter(|r| r["state"] == "leased").count() >= 60).then_some(())
    });
    assert!(cap_standby.replies().is_empty(), "the standby answered a client before the failover");

    let killed_wall = SystemTime::now();
    let killed_mono = mono_ns();
    site.boxes[a].as_mut().unwrap().kill9();
    let first_life = site.srv(a).log_text();
    wait_for("the standby to take over", Duration::from_millis(T_MS + I_MS + 5000), || {
        site.srv(b).is_active().then_some(())
    });
    let took = promoted_at(&site.srv(b).log_text()).unwrap() - killed_mono;
    // New clients: the first ACK the new active sends a new client after the kill.
    let served = wait_for("the new active to ACK a new client", Duration::from_millis(T_MS + I_MS + 5000), || {
        cap_standby.replies().into_iter().find(|r| r.kind == 5 && r.src.to_string() == lan_ip(b)).map(|r| r.at)
    });
    let served_after = served.duration_since(killed_wall).unwrap_or_default();
    eprintln!(
        "FAILOVER kill -9 under load: promoted {} ms after the kill, first ACK to a new client {} ms after it (T = {T_MS} ms, I = {I_MS} ms)",
        took / 1_000_000,
        served_after.as_millis()
    );
    let bound_ms = T_MS + I_MS + 1000;
    assert!(took <= bound_ms * 1_000_000, "promotion took {} ms > T + I + 1 s\n{}", took / 1_000_000, site.logs());
    assert!(
        served_after <= Duration::from_millis(bound_ms),
        "first new client served {served_after:?} after the kill\n{}",
        site.logs()
    );

    wait_exit(&mut load_a, Duration::from_secs(30));
    wait_exit(&mut load_b, Duration::from_secs(30));
    let to_active = cap_active.stop();
    let to_standby = cap_standby.stop();

    let acked = assert_acked_on(site.srv(b), &to_active, &lan_ip(a));
    let new_clients = to_standby.iter().filter(|r| r.kind == 5).count();
    eprintln!(
        "FAILOVER: {} addresses ACKed by the dead box, all on the new active; {new_clients} ACKs to new clients from the new active",
        acked.len()
    );

    returning_client_keeps_its_address(&site, b, &bound.ip, &cdir);

    let second_life = reflash_rejoins(&mut site, a, first_life.len(), acked.len());
    // No two active intervals ever overlapped.
    let now = mono_ns();
    let lives = [(a, first_life, Some(killed_mono)), (b, site.srv(b).log_text(), None), (a, second_life, None)];
    let all = lives
        .iter()
        .flat_map(|(i, log, killed)| {
            intervals(log, *killed, now).into_iter().map(move |(s, e, t)| (format!("box {i}"), s, e, t))
        })
        .collect();
    assert_disjoint(all, &site.logs());
}

/// The client that went quiet comes back: the new active `b` knows its lease and ACKs the same
/// address under the new term, and `whois` names `b`.
fn returning_client_keeps_its_address(site: &Site, b: usize, ip: &str, cdir: &std::path::Path) {
    let (cns, ciface) = site.p.client(0);
    let (mut dh, _) = dhclient(cns, ciface, cdir, &[]);
    let dlog = cdir.join(format!("dhclient-{ciface}.log"));
    let want = format!("DHCPACK of {} from {}", ip, lan_ip(b));
    wait_for("the new active to ACK the returning client's address", Duration::from_secs(30), || {
        std::fs::read_to_string(&dlog).ok().filter(|t| t.contains(&want)).map(|_| ())
    });
    assert!(!std::fs::read_to_string(&dlog).unwrap().contains("DHCPNAK"), "a known lease was refused");
    let _ = dh.kill();
    let _ = dh.wait();
    let l = lease_of(&site.srv(b).leases(), ip).cloned().unwrap();
    assert_eq!((l["state"].as_str(), l["term"].as_u64()), (Some("leased"), Some(2)), "renewed under the new term: {l}");
    let who = site.whois(b);
    assert_eq!((who["primary"].as_str(), who["term"].as_u64()), (Some(["box-a", "box-b"][b]), Some(2)), "{who}");
}

/// Every address `dead` ACKed (seen in `replies`) is a lease on `survivor`, for the same client
/// (before-ack). Returns the ACKed addresses and their clients.
fn assert_acked_on(survivor: &Server, replies: &[WireReply], dead: &str) -> HashMap<String, String> {
    let acked: HashMap<String, String> = replies
        .iter()
        .filter(|r| r.kind == 5 && r.src.to_string() == dead)
        .map(|r| (r.yiaddr.to_string(), fmt_mac(&r.chaddr)))
        .collect();
    assert!(acked.len() >= 50, "only {} addresses ACKed by the active before the kill", acked.len());
    let rows = survivor.leases();
    let missing: Vec<String> = acked
        .iter()
        .filter(|(ip, mac)| !lease_of(&rows, ip).is_some_and(|l| l["state"] == "leased" && l["hw"] == mac.as_str()))
        .map(|(ip, mac)| format!("{ip} ACKed to {mac}: new active has {:?}", lease_of(&rows, ip)))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} ACKed leases missing on the new active:\n{}",
        missing.len(),
        acked.len(),
        missing.join("\n")
    );
    acked
}

/// Box `a` comes back on an empty state directory: it catches up before it stands, stays
/// standby and ends with the same table as the active, which has more than `acked` leases.
/// Returns its log since the restart.
fn reflash_rejoins(site: &mut Site, a: usize, reborn_at: usize, acked: usize) -> String {
    let b = 1 - a;
    std::fs::remove_dir_all(site.p.box_dir(a).join("state")).unwrap();
    let started = Instant::now();
    site.start(a);
    let second_life = || site.srv(a).log_text()[reborn_at..].to_string();
    wait_for("the reflashed box to catch up", Duration::from_secs(20), || {
        second_life().contains("catch-up with the partner complete").then_some(())
    });
    eprintln!("REFLASH: the empty box caught up {} ms after its start", started.elapsed().as_millis());
    converge(site.srv(a), site.srv(b), Duration::from_secs(20));
    let log = second_life();
    let caught_up = log
        .find("caught up with the partner: eligible for election")
        .unwrap_or_else(|| panic!("no eligibility line:\n{log}"));
    if let Some(role) = log.find("role change") {
        assert!(caught_up < role, "the reflashed box took part in the election before catching up:\n{log}");
    }
    // A few intervals later it is still standby and the other still active.
    let settle = Instant::now() + Duration::from_millis(4 * I_MS);
    wait_for("a few election intervals", Duration::from_secs(5), || (Instant::now() >= settle).then_some(()));
    assert!(!second_life().contains("role=\"active\"") && site.srv(b).is_active(), "{}", site.logs());
    assert!(site.srv(b).log_text().contains("new or wiped"), "the active must notice the wiped store");
    assert!(leased_count(&site.srv(a).leases()) > acked);

    second_life()
}

fn leased_count(rows: &[serde_json::Value]) -> usize {
    rows.iter().filter(|r| r["state"] == "leased").count()
}
