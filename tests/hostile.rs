//! The defects hostile testing found, each reproduced with real processes in namespaces: a host
//! on the LAN relaying or flooding the peer port, a full disk on the active box of an elected
//! pair, a 2 MiB state partition, the database file replaced under a running box, a second
//! instance on one box, and a client that declines every address it is given.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::arbiter::*;
use common::client::RawClient;
use common::pair::*;
use common::site::*;
use common::*;

fn count(log: &str, what: &str) -> usize {
    log.matches(what).count()
}

/// Relays bytes between two connections until either closes or `limit` passes.
fn splice(x: TcpStream, y: TcpStream, limit: Duration) {
    let pump = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            from.set_read_timeout(Some(limit)).unwrap();
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(std::net::Shutdown::Both);
        })
    };
    let a = pump(x.try_clone().unwrap(), y.try_clone().unwrap());
    let b = pump(y, x);
    let _ = (a.join(), b.join());
}

#[test]
fn a_lan_host_can_neither_relay_nor_flood_the_peer_link_down() {
    let mut p = Pair::new();
    let att = p.add_client();
    let client = p.add_client();
    let (ans, aif) = p.client(att);
    // The attacker reaches both boxes' peer addresses through their LAN addresses.
    ans.ip(&format!("addr add 198.18.0.66/24 dev {aif}"));
    ans.ip("route add 198.18.1.1/32 via 198.18.0.1");
    ans.ip("route add 198.18.1.2/32 via 198.18.0.2");
    let peer = "sync_mode = \"before-ack\"";
    let (ca, cb) = (p.config(0, "198.18.0.100-198.18.0.150", peer), p.config(1, "198.18.0.100-198.18.0.150", peer));
    let a = p.start(0, &ca, "active:1");
    let b = p.start(1, &cb, "standby");
    a.wait_partner("the partner in sync", Duration::from_secs(15), |p| p.in_sync);
    let ups = || count(&a.log_text(), "peer link up") + count(&b.log_text(), "peer link up");
    let up_before = ups();

    // 60 rounds of relaying one box's peer port to the other's, then 400 idle connections.
    let flood = ans.within(|| {
        let peer_port = |host: u8| SocketAddr::from(([198, 18, 1, host], 6767));
        let connect = |host| TcpStream::connect_timeout(&peer_port(host), Duration::from_secs(1));
        let mut relayed = 0;
        for _ in 0..60 {
            if let (Ok(x), Ok(y)) = (connect(1), connect(2)) {
                splice(x, y, Duration::from_millis(300));
                relayed += 1;
            }
        }
        let idle: Vec<TcpStream> = (0..400).filter_map(|i| connect(1 + (i % 2) as u8).ok()).collect();
        (relayed, idle)
    });
    assert!(flood.0 > 0, "the attacker could not even connect; the test proves nothing");
    let (la, lb) = (a.log_text(), b.log_text());
    assert_eq!(ups(), up_before, "the attack made or replaced a peer session:\n{la}\n{lb}");
    assert!(!la.contains("replaced by a newer connection") && !lb.contains("replaced by a newer connection"));
    assert!(la.contains("not the partner's address"), "the rejection is logged:\n{la}");
    // About 700 rejections per box, logged at most 5 per 10 s.
    for log in [&la, &lb] {
        let lines = count(log, "peer connection rejected");
        assert!((1..=10).contains(&lines), "{lines} rejection lines: the log is not rate-limited");
    }

    // With the idle connections still open, the link comes back at once after a cut.
    p.partition();
    a.wait_partner("the link down", Duration::from_secs(10), |p| !p.link_up);
    p.heal();
    let healed = Instant::now();
    wait_for("the link back after the cut", Duration::from_secs(5), || (ups() > up_before).then_some(()));
    eprintln!(
        "HOSTILE peer link: back {} ms after the heal, with 400 idle attacker connections open",
        healed.elapsed().as_millis()
    );
    drop(flood);

    // And before-ack still holds: a lease the active ACKs is on the standby too.
    let (cns, cif) = p.client(client);
    let (out, _) = udhcpc_once(cns, cif, p.dir.path(), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    converge(&a, &b, Duration::from_secs(10));
}

#[test]
fn a_full_disk_on_the_active_hands_service_to_the_partner() {
    let mut site = Site::new(3);
    let disks = [0, 1].map(|i| SmallDisk::mount(&site.p.box_dir(i).join("state"), "4m"));
    site.start(0);
    site.start(1);
    let a =
        wait_for("a box to win the election", Duration::from_secs(30), || (0..2).find(|&i| site.srv(i).is_active()));
    let b = 1 - a;
    site.srv(a).wait_partner("the partner in sync", Duration::from_secs(15), |p| p.in_sync);
    assert_eq!(lease_from(&site, 0).get("server"), Some(lan_ip(a).as_str()));

    disks[a].fill();
    let granted_before = count(&site.srv(a).log_text(), "lease granted");
    let filled = mono_ns();
    // The next client's request fails to commit on the active, which steps down; the partner
    // takes over once the row expires and serves the client (which is still retrying).
    let (ns, iface) = site.p.client(1);
    let cdir = site.p.dir.path().join("dhclient");
    std::fs::create_dir_all(&cdir).unwrap();
    let (mut dh, ev) = dhclient(ns, iface, &cdir, &[]);
    let second = wait_event_or(&ev, &["BOUND"], 0, Duration::from_secs(40), || site.logs());
    let _ = (dh.kill(), dh.wait());
    assert_eq!(second.get("server"), Some(lan_ip(b).as_str()), "{}", site.logs());
    assert!(site.srv(b).is_active() && !site.srv(a).is_active(), "{}", site.logs());
    let took = promoted_at(&site.srv(b).log_text()).unwrap() - filled;
    eprintln!("HOSTILE disk full: the partner was active {} ms after the disk filled", took / 1_000_000);
    assert_eq!(count(&site.srv(a).log_text(), "lease granted"), granted_before, "the sick box claimed a grant");
    assert_eq!(site.whois(a)["primary"].as_str(), Some(["box-a", "box-b"][b]));
    let sick = site.boxes[a].as_mut().unwrap();
    sick.wait_status(Duration::from_secs(10), |s| s.contains("NOT SERVING: lease store cannot commit"));

    // Space returns: the box says so at once (it probes while idle) and stays standby.
    disks[a].unfill();
    let sick = site.boxes[a].as_mut().unwrap();
    sick.wait_status(Duration::from_secs(10), |s| s.starts_with("standby"));
    assert_eq!(lease_from(&site, 2).get("server"), Some(lan_ip(b).as_str()));
    converge(site.srv(a), site.srv(b), Duration::from_secs(10));

    let now = mono_ns();
    let all = (0..2)
        .flat_map(|i| {
            intervals(&site.srv(i).log_text(), None, now)
                .into_iter()
                .map(move |(s, e, t)| (format!("box {i}"), s, e, t))
        })
        .collect();
    assert_disjoint(all, &site.logs());
}

/// Client `n` of the site's LAN asks for a lease with udhcpc (retrying for about 10 s).
fn lease_from(site: &Site, n: usize) -> ClientEvent {
    let dir = site.p.dir.path().join("clients");
    std::fs::create_dir_all(&dir).unwrap();
    let (ns, iface) = site.p.client(n);
    let (out, ev) = udhcpc_once(ns, iface, &dir, &[]);
    assert!(out.status.success(), "client {n} got no lease\n{}", site.logs());
    events(&ev).into_iter().rev().find(|e| e.reason == "bound").unwrap()
}

fn relay_box_config(dir: &std::path::Path, state: &std::path::Path) -> std::path::PathBuf {
    let text = format!(
        "[node]\nname = \"test\"\nstate_dir = \"{}\"\n[dhcp]\ninterfaces = []\nlisten_relayed = true\nping_check = false\n\
         [[subnet]]\ncidr = \"198.18.6.0/24\"\npools = [\"198.18.6.10-198.18.6.250\"]\n[log]\nfilter = \"warn\"\n",
        state.display()
    );
    let path = dir.join("twinlease.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_store_lives_on_a_2_mib_partition_and_recovers_from_a_full_one() {
    let lab = RelayLab::new("198.18.6", 24);
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::new(dir.path(), "2m");
    let state = disk.dir.join("state");
    let config = relay_box_config(dir.path(), &state);
    let _srv = Server::builder(&lab.srv, dir.path()).config(&config).start();
    let macs = mac_file(dir.path(), 200, 7);
    let wal = state.join("leases.db-wal");
    let mut largest_wal = 0;
    // 4,000 exchanges by 200 clients: every client renews its lease about twenty times.
    for round in 0..4 {
        assert_mostly_acked(&lab.perfdhcp(&macs, 400, 1000), 950, &format!("round {round}"));
        largest_wal = largest_wal.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
    }
    let used = |p: &str| std::fs::metadata(state.join(p)).map_or(0, |m| m.len());
    eprintln!(
        "HOSTILE 2 MiB partition: 4,000 exchanges; database {} KiB, largest log seen {} KiB",
        used("leases.db") / 1024,
        largest_wal / 1024
    );
    assert!(largest_wal <= 1_300_000, "the log grew to {largest_wal} bytes");

    // Full: no ACK leaves; freed: ACKs again, without a restart.
    disk.fill();
    let perf = lab.perfdhcp(&macs, 200, 200);
    assert!(perf.acks <= 5, "{} ACKs while the disk was full", perf.acks);
    disk.unfill();
    assert_mostly_acked(&lab.perfdhcp(&macs, 200, 400), 380, "after space returned");
}

/// At least `min_sent` requests went out and 97 % of them were ACKed: a store stalled by its own
/// log answers nothing, while a busy machine drops a few late replies.
fn assert_mostly_acked(perf: &Perf, min_sent: u64, when: &str) {
    assert!(
        perf.requests_sent >= min_sent && perf.acks * 100 >= perf.requests_sent * 97,
        "{when}: {} ACKs of {} requests\n{}",
        perf.acks,
        perf.requests_sent,
        perf.text
    );
}

/// How the database file is damaged under the running box.
#[derive(Debug, Clone, Copy)]
enum Damage {
    Replaced,
    Truncated,
    Overwritten,
}

impl Damage {
    fn apply(self, db: &std::path::Path) {
        match self {
            Damage::Replaced => {
                let other = db.with_extension("other");
                std::fs::write(&other, b"").unwrap();
                std::fs::rename(&other, db).unwrap();
            }
            Damage::Truncated => std::fs::File::options().write(true).open(db).unwrap().set_len(0).unwrap(),
            Damage::Overwritten => {
                std::os::unix::fs::FileExt::write_all_at(
                    &std::fs::File::options().write(true).open(db).unwrap(),
                    &[0xa5; 4096],
                    0,
                )
                .unwrap();
            }
        }
    }
}

#[test]
fn a_database_lost_under_a_running_box_is_rewritten_and_no_acked_lease_is_lost() {
    let lab = RelayLab::new("198.18.7", 24);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let text = std::fs::read_to_string(relay_box_config(dir.path(), &state)).unwrap().replace("198.18.6.", "198.18.7.");
    let config = dir.path().join("twinlease.toml");
    std::fs::write(&config, text).unwrap();
    let mut srv = Server::builder(&lab.srv, dir.path()).config(&config).start();
    let capture = Capture::start(&lab.relay, &lab.relay_if, &dir.path().join("acks.pcap"));
    let db = state.join("leases.db");
    for (n, damage) in [Damage::Replaced, Damage::Truncated, Damage::Overwritten].into_iter().enumerate() {
        let macs = mac_file(dir.path(), 40, 100 + n as u32);
        let perf = lab.perfdhcp(&macs, 100, 40);
        assert!(perf.acks > 0, "{damage:?}: no ACKs before the damage\n{}", perf.text);
        damage.apply(&db);
        // The writer notices within an idle tick and rewrites the table from memory.
        wait_for(&format!("{damage:?}: the table rewritten"), Duration::from_secs(10), || {
            (count(&srv.log_text(), "lease table written from memory") > n).then_some(())
        });
        // Clients retry: the box may still be reloading its table from the new file.
        wait_for(&format!("{damage:?}: ACKs after the rewrite"), Duration::from_secs(15), || {
            (lab.perfdhcp(&macs, 100, 40).acks > 0).then_some(())
        });
    }
    let log = srv.log_text();
    assert_eq!(count(&log, "LEASE DATABASE LOST"), 3, "{log}");
    let acked: BTreeSet<String> = capture.stop().iter().filter(|r| r.kind == 5).map(|r| r.yiaddr.to_string()).collect();
    assert!(acked.len() >= 60, "only {} addresses ACKed", acked.len());

    // What the box ACKed is on disk: after kill -9 and a restart, every address is a lease.
    srv.kill9();
    let srv = Server::builder(&lab.srv, dir.path()).config(&config).start();
    assert!(!srv.log_text()[log.len()..].contains("corrupt"), "the restart found a damaged file");
    let rows = srv.leases();
    let missing: Vec<&String> =
        acked.iter().filter(|ip| lease_of(&rows, ip).is_none_or(|l| l["state"] != "leased")).collect();
    assert!(missing.is_empty(), "ACKed leases lost: {missing:?}");
    let kept: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.contains(".lost-"))
        .collect();
    assert!(
        kept.iter().filter(|n| !n.ends_with("-wal") && !n.ends_with("-shm")).count() >= 2,
        "the damaged files are kept for a look: {kept:?}"
    );
}

#[test]
fn a_second_instance_refuses_to_start() {
    let lan = Lan::new("198.18.0.1/24");
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "[dhcp]\ninterfaces = [\"{}\"]\nping_check = false\n[[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.150\"]\n",
        lan.bridge
    );
    let srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body));
    let second = |extra: &[&str]| {
        let out = lan
            .ns
            .cmd(BIN)
            .args(["run", "--config"])
            .arg(&srv.config)
            .args(extra)
            .env("TWINLEASE_LOG_STDERR", "1")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (code, err) = second(&[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("another twinlease") && err.contains("state directory"), "{err}");
    assert!(err.contains(&format!("pid {}", srv.child.id())), "the message names the running one: {err}");
    let other_state = dir.path().join("other-state");
    let (code, err) = second(&["--state-dir", other_state.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&format!("already serves interface {}", lan.bridge)), "{err}");
}

#[test]
fn a_client_declining_every_address_cannot_quarantine_the_pool() {
    let mut lan = Lan::new("198.18.0.1/24");
    let decliner = lan.add_client();
    let honest = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "[dhcp]\ninterfaces = [\"{}\"]\nping_check = false\n[[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.109\"]\n",
        lan.bridge
    );
    let mut srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body));
    let capture = Capture::start(&lan.ns, &lan.bridge, &dir.path().join("replies.pcap"));
    let (ns, iface) = lan.client(decliner);
    let c = RawClient::new(ns, iface, [0x02, 0, 0, 0, 0xde, 0xc1]);
    for round in 0..8u32 {
        let xid = 0x7e57_0000 + round;
        let (addr, server) = c.dora(xid);
        c.decline(addr, server, xid);
        // The decline is handled before the next DISCOVER (one engine, in order).
    }
    let declined = |rows: &[serde_json::Value]| rows.iter().filter(|r| r["state"] == "declined").count();
    let rows = wait_for("the last decline handled", Duration::from_secs(5), || {
        let log = srv.log_text();
        (count(&log, "DECLINE ignored") == 5).then(|| srv.leases())
    });
    assert_eq!(declined(&rows), 3, "{rows:#?}");
    let log = srv.log_text();
    assert_eq!(count(&log, "declined by the client"), 3);
    assert!(
        log.lines().filter(|l| l.contains("DECLINE ignored")).all(|l| l.contains("client=hw:02:00:00:00:de:c1")),
        "{log}"
    );

    let (hns, hif) = lan.client(honest);
    let (out, _) = udhcpc_once(hns, hif, dir.path(), &[]);
    assert!(out.status.success(), "an honest client still gets an address");
    srv.stop();
    let replies = capture.stop();
    let acks = replies.iter().filter(|r| r.kind == 5).count();
    let log = srv.log_text();
    assert_eq!(count(&log, "lease granted"), acks, "one 'lease granted' per ACK sent:\n{log}");
    assert!(log.contains(&format!("acks={acks}")), "the ACK counter counts what was sent:\n{log}");
}
