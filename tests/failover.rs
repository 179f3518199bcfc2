//! Failover as a branch office lives it: two twinlease boxes on one client LAN with a peer link,
//! the election arbitrated by a real PostgreSQL in a namespace of its own, nothing pinned.
//! Under load, kill -9 the active: the standby takes over within T + I + 1 s, new clients are
//! served from then on, every lease the dead box ACKed is on the new active (before-ack), and a
//! client renewing its lease keeps its address. Then the dead box comes back reflashed (empty
//! state dir): it catches up from the partner before it enters the election, stays standby and
//! ends up with the same table.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::arbiter::*;
use common::pair::*;
use common::*;

const POOL: &str = "198.18.0.100-198.18.0.250";
const I_MS: u64 = 500;
const T_MS: u64 = 2000;

/// The two boxes of a pair with the arbiter; both run the real election.
struct Site {
    p: Pair,
    /// Kept for its drop: the arbiter lives as long as the site.
    _net: ArbiterNet,
    configs: [PathBuf; 2],
    boxes: [Option<Server>; 2],
}

impl Site {
    fn new(clients: usize) -> Site {
        let mut p = Pair::new();
        let net = ArbiterNet::new();
        for i in 0..2 {
            net.attach(&p.boxes[i], i as u8 + 2);
        }
        for _ in 0..clients {
            p.add_client();
        }
        // A generous ACK bound: a loaded CI machine must still hold every ACK for the partner.
        let peer = "sync_mode = \"before-ack\"\nack_timeout_ms = 3000";
        let configs = [0, 1].map(|i| {
            let path = p.config(i, POOL, peer);
            let mut text = std::fs::read_to_string(&path).unwrap();
            text.push_str(&format!(
                "[arbiter]\nurl = \"{url}\"\nutype = \"branch-failover/dhcp\"\ninterval_ms = {I_MS}\ntimeout_ms = {T_MS}\ntls = \"off\"\nendpoint = \"box-{n}.branch.example\"\n",
                url = net.url(),
                n = ["a", "b"][i]
            ));
            std::fs::write(&path, text).unwrap();
            path
        });
        let init = run(p.boxes[0]
            .cmd(BIN)
            .args(["arbiter", "init", "--config"])
            .arg(&configs[0]));
        assert!(String::from_utf8_lossy(&init.stdout).contains("arbiter ready"));
        Site {
            p,
            _net: net,
            configs,
            boxes: [None, None],
        }
    }

    fn start(&mut self, i: usize) {
        let env = [("RUST_LOG", "info,twinlease::election=debug")];
        self.boxes[i] = Some(Server::start_with(
            &self.p.boxes[i],
            &self.p.box_dir(i),
            &self.configs[i],
            &env,
        ));
    }

    fn srv(&self, i: usize) -> &Server {
        self.boxes[i].as_ref().unwrap()
    }

    fn logged_active(&self, i: usize) -> bool {
        logged_active(&self.srv(i).log_text())
    }

    fn logs(&self) -> String {
        (0..2)
            .map(|i| {
                format!(
                    "---- box {i} ----\n{}",
                    self.boxes[i]
                        .as_ref()
                        .map(Server::log_text)
                        .unwrap_or_default()
                )
            })
            .collect()
    }

    fn whois(&self, i: usize) -> serde_json::Value {
        let out = run(self.p.boxes[i]
            .cmd(BIN)
            .args(["whois", "--json", "--config"])
            .arg(&self.configs[i]));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// The box's LAN address (198.18.0.1 for box 0, .2 for box 1).
fn lan_ip(i: usize) -> String {
    format!("198.18.0.{}", i + 1)
}

/// perfdhcp as a relay at `relay_ip` (on client `n`) against `server`: `rate`/s new clients
/// (MACs from a file of `macs`, one set per client), for at most `secs` seconds.
fn perfdhcp(p: &Pair, n: usize, relay_ip: &str, server: &str, rate: u32, macs: usize, secs: u32) -> Child {
    let (ns, iface) = p.client(n);
    ns.ip(&format!("addr add {relay_ip}/24 dev {iface}"));
    let file = mac_file(p.dir.path(), macs, 10 + n as u32);
    ns.cmd("perfdhcp")
        .args([
            "-4",
            "-l",
            relay_ip,
            "-r",
            &rate.to_string(),
            "-p",
            &secs.to_string(),
            "-M",
        ])
        .arg(file)
        .arg(server)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_exit(child: &mut Child, limit: Duration) {
    wait_for("perfdhcp to finish its bounded run", limit, || {
        child.try_wait().unwrap()
    });
}

#[test]
fn kill_9_of_the_active_under_load_then_a_reflashed_box_rejoins() {
    let mut site = Site::new(3);
    site.start(0);
    site.start(1);
    let a = wait_for("a box to win the election", Duration::from_secs(30), || {
        (0..2).find(|&i| site.logged_active(i))
    });
    let b = 1 - a;
    wait_log(site.srv(a), "partner in sync", 1, Duration::from_secs(15));
    assert!(!site.logged_active(b), "both active:\n{}", site.logs());

    // A real client gets its lease from the active and goes quiet (lease file kept).
    let (cns, ciface) = site.p.client(0);
    let cdir = site.p.dir.path().join("client");
    std::fs::create_dir_all(&cdir).unwrap();
    let (mut dh, ev) = dhclient(cns, ciface, &cdir, &[]);
    let bound = wait_event(&ev, &["BOUND"], 0, Duration::from_secs(20));
    assert_eq!(bound.get("server"), Some(lan_ip(a).as_str()));
    let lease_file = cdir.join(format!("dhclient-{ciface}.leases"));
    wait_for("dhclient's lease file", Duration::from_secs(10), || {
        std::fs::read_to_string(&lease_file)
            .ok()
            .filter(|t| t.contains(&bound.ip))
            .map(|_| ())
    });
    let _ = dh.kill();
    let _ = dh.wait();

    // Load: new clients through a relay to the active, and through another relay to the
    // standby (which must stay silent until it wins). Both runs are bounded in time.
    let cap_active = Capture::start(
        site.p.client(1).0,
        site.p.client(1).1,
        &site.p.dir.path().join("to-active.pcap"),
    );
    let cap_standby = Capture::start(
        site.p.client(2).0,
        site.p.client(2).1,
        &site.p.dir.path().join("to-standby.pcap"),
    );
    let mut load_a = perfdhcp(&site.p, 1, "198.18.0.9", &lan_ip(a), 50, 200, 12);
    let mut load_b = perfdhcp(&site.p, 2, "198.18.0.10", &lan_ip(b), 10, 60, 12);
    wait_for(
        "60 leases granted by the active",
        Duration::from_secs(20),
        || {
            (site
                .srv(a)
                .leases()
                .iter()
                .filter(|r| r["state"] == "leased")
                .count()
                >= 60)
                .then_some(())
        },
    );
    assert!(
        cap_standby.replies().is_empty(),
        "the standby answered a client before the failover"
    );

    let killed_wall = SystemTime::now();
    let killed_mono = mono_ns();
    site.boxes[a].as_mut().unwrap().kill9();
    let first_life = site.srv(a).log_text();
    wait_for(
        "the standby to take over",
        Duration::from_millis(T_MS + I_MS + 5000),
        || site.logged_active(b).then_some(()),
    );
    let took = promoted_at(&site.srv(b).log_text()).unwrap() - killed_mono;
    // New clients: the first ACK the new active sends a new client after the kill.
    let served = wait_for(
        "the new active to ACK a new client",
        Duration::from_millis(T_MS + I_MS + 5000),
        || {
            cap_standby
                .replies()
                .into_iter()
                .find(|r| r.kind == 5 && r.src.to_string() == lan_ip(b))
                .map(|r| r.at)
        },
    );
    let served_after = served.duration_since(killed_wall).unwrap_or_default();
    eprintln!(
        "FAILOVER kill -9 under load: promoted {} ms after the kill, first ACK to a new client {} ms after it (T = {T_MS} ms, I = {I_MS} ms)",
        took / 1_000_000,
        served_after.as_millis()
    );
    let bound_ms = T_MS + I_MS + 1000;
    assert!(
        took <= bound_ms * 1_000_000,
        "promotion took {} ms > T + I + 1 s\n{}",
        took / 1_000_000,
        site.logs()
    );
    assert!(
        served_after <= Duration::from_millis(bound_ms),
        "first new client served {served_after:?} after the kill\n{}",
        site.logs()
    );

    wait_exit(&mut load_a, Duration::from_secs(30));
    wait_exit(&mut load_b, Duration::from_secs(30));
    let to_active = cap_active.stop();
    let to_standby = cap_standby.stop();

    // Every ACK the dead box sent is a lease on the new active (before-ack).
    let acked: HashMap<String, String> = to_active
        .iter()
        .filter(|r| r.kind == 5 && r.src.to_string() == lan_ip(a))
        .map(|r| (r.yiaddr.to_string(), fmt_mac(&r.chaddr)))
        .collect();
    assert!(
        acked.len() >= 50,
        "only {} addresses ACKed by the active before the kill",
        acked.len()
    );
    let rows = site.srv(b).leases();
    let missing: Vec<String> = acked
        .iter()
        .filter(|(ip, mac)| {
            !lease_of(&rows, ip).is_some_and(|l| l["state"] == "leased" && l["hw"] == mac.as_str())
        })
        .map(|(ip, mac)| {
            format!(
                "{ip} ACKed to {mac}: new active has {:?}",
                lease_of(&rows, ip)
            )
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} ACKed leases missing on the new active:\n{}",
        missing.len(),
        acked.len(),
        missing.join("\n")
    );
    let new_clients = to_standby.iter().filter(|r| r.kind == 5).count();
    eprintln!(
        "FAILOVER: {} addresses ACKed by the dead box, all on the new active; {new_clients} ACKs to new clients from the new active",
        acked.len()
    );

    // The quiet client comes back: the new active knows its lease and ACKs the same address.
    let (mut dh, _) = dhclient(cns, ciface, &cdir, &[]);
    let dlog = cdir.join(format!("dhclient-{ciface}.log"));
    let want = format!("DHCPACK of {} from {}", bound.ip, lan_ip(b));
    wait_for(
        "the new active to ACK the returning client's address",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(&dlog)
                .ok()
                .filter(|t| t.contains(&want))
                .map(|_| ())
        },
    );
    assert!(
        !std::fs::read_to_string(&dlog).unwrap().contains("DHCPNAK"),
        "a known lease was refused"
    );
    let _ = dh.kill();
    let _ = dh.wait();
    let l = lease_of(&site.srv(b).leases(), &bound.ip).cloned().unwrap();
    assert_eq!(
        (l["state"].as_str(), l["term"].as_u64()),
        (Some("leased"), Some(2)),
        "renewed under the new term: {l}"
    );
    let who = site.whois(b);
    assert_eq!(
        (who["primary"].as_str(), who["term"].as_u64()),
        (Some(["box-a", "box-b"][b]), Some(2)),
        "{who}"
    );

    // The dead box is reflashed: empty state dir. It catches up before it stands, then stays standby.
    std::fs::remove_dir_all(site.p.box_dir(a).join("state")).unwrap();
    let reborn_at = first_life.len();
    let started = Instant::now();
    site.start(a);
    let second_life = || site.srv(a).log_text()[reborn_at..].to_string();
    wait_for(
        "the reflashed box to catch up",
        Duration::from_secs(20),
        || {
            second_life()
                .contains("catch-up with the partner complete")
                .then_some(())
        },
    );
    eprintln!(
        "REFLASH: the empty box caught up {} ms after its start",
        started.elapsed().as_millis()
    );
    converge(site.srv(a), site.srv(b), Duration::from_secs(20));
    let log = second_life();
    let caught_up = log
        .find("caught up with the partner: eligible for election")
        .unwrap_or_else(|| panic!("no eligibility line:\n{log}"));
    if let Some(role) = log.find("role change") {
        assert!(
            caught_up < role,
            "the reflashed box took part in the election before catching up:\n{log}"
        );
    }
    // A few intervals later it is still standby and the other still active.
    let settle = Instant::now() + Duration::from_millis(4 * I_MS);
    wait_for("a few election intervals", Duration::from_secs(5), || {
        (Instant::now() >= settle).then_some(())
    });
    assert!(
        !second_life().contains("role=\"active\"") && site.logged_active(b),
        "{}",
        site.logs()
    );
    assert!(
        site.srv(b).log_text().contains("new or wiped"),
        "the active must notice the wiped store"
    );
    assert!(leased_count(&site.srv(a).leases()) > acked.len());

    // No two active intervals ever overlapped.
    let now = mono_ns();
    let lives = [(a, first_life, Some(killed_mono)), (b, site.srv(b).log_text(), None), (a, second_life(), None)];
    let all = lives
        .iter()
        .flat_map(|(i, log, killed)| intervals(log, *killed, now).into_iter().map(move |(s, e, t)| (format!("box {i}"), s, e, t)))
        .collect();
    assert_disjoint(all, &site.logs());
}

fn leased_count(rows: &[serde_json::Value]) -> usize {
    rows.iter().filter(|r| r["state"] == "leased").count()
}
