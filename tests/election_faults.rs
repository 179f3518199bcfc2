//! Fault tests with real processes: two twinlease nodes, each in its own network namespace, and
//! a throwaway PostgreSQL arbiter in a third, joined by a bridge. Faults: kill -9 of the active,
//! the active's link to the arbiter going down, writes failing (privilege revoked) and then the
//! link going down too (the seed's dual-primary scenario), and the arbiter stalled by SIGSTOP.
//!
//! Every node logs its role changes with CLOCK_MONOTONIC stamps — one kernel clock for every
//! namespace — and the lease end it holds. From the logs each test builds each node's active
//! intervals and asserts that no two overlap, and that a take-over after the active's death or
//! isolation comes within T + I + 1 s.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::arbiter::*;
use common::*;

/// I and T: short by default to keep the test quick; `TL_FAULT_I_MS` / `TL_FAULT_T_MS` set
/// others (e.g. the shipped 1000 / 5000) to measure take-over times at those values.
fn env_ms(key: &str, default: u64) -> u64 {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
static TIMERS: std::sync::LazyLock<(u64, u64)> =
    std::sync::LazyLock::new(|| (env_ms("TL_FAULT_I_MS", 500), env_ms("TL_FAULT_T_MS", 2000)));
#[allow(non_snake_case)]
fn I_MS() -> u64 {
    TIMERS.0
}
#[allow(non_snake_case)]
fn T_MS() -> u64 {
    TIMERS.1
}
/// One twinlease box: its namespace (linked to the arbiter's bridge) and the daemon.
struct Node {
    name: String,
    ns: Netns,
    iface: String,
    dir: tempfile::TempDir,
    srv: Option<Server>,
    killed_at: Option<u64>,
    /// The arbiter url; the namespace lab's PostgreSQL unless set.
    url: Option<String>,
}

/// The arbiter namespace with its bridge, and `n` nodes attached to it.
fn lab(n: usize) -> (ArbiterNet, Vec<Node>) {
    let net = ArbiterNet::new();
    let nodes = (0..n)
        .map(|k| {
            let ns = Netns::new("n");
            let iface = net.attach(&ns, k as u8 + 2);
            Node {
                name: format!("box{}", k + 1),
                ns,
                iface,
                dir: tempfile::tempdir().unwrap(),
                srv: None,
                killed_at: None,
                url: None,
            }
        })
        .collect();
    (net, nodes)
}

impl Node {
    fn config(&self) -> PathBuf {
        let path = self.dir.path().join("twinlease.toml");
        let text = format!(
            "[node]\nname = \"{name}\"\nstate_dir = \"{state}\"\n\
             [dhcp]\ninterfaces = []\nlisten_relayed = true\nping_check = false\n\
             [[subnet]]\ncidr = \"198.18.20.0/24\"\npools = [\"198.18.20.10-198.18.20.50\"]\n\
             [arbiter]\nurl = \"{url}\"\nutype = \"branch-test/dhcp\"\n\
             interval_ms = {i}\ntimeout_ms = {t}\ntls = \"off\"\nendpoint = \"{name}.branch.example\"\n",
            name = self.name,
            state = self.dir.path().join("state").display(),
            i = I_MS(),
            t = T_MS(),
            url = self.url.clone().unwrap_or_else(|| format!("postgres://twinlease@{ARBITER_IP}:5432/postgres"))
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    fn start(&mut self) {
        let cfg = self.config();
        let filter = "info,twinlease::election=debug";
        self.srv = Some(Server::builder(&self.ns, self.dir.path()).config(&cfg).env("RUST_LOG", filter).start());
    }

    fn kill9(&mut self) {
        self.killed_at = Some(mono_ns());
        self.srv.as_mut().unwrap().kill9();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Whether the last role change in the log is to active.
    fn logged_active(&self) -> bool {
        logged_active(&self.log())
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = run(self.ns.cmd(BIN).args(args).arg("--config").arg(self.config()));
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    fn link(&self, up: bool) {
        self.ns.ip(&format!("link set {} {}", self.iface, if up { "up" } else { "down" }));
    }
}

/// Asserts that no two nodes were ever active at once; returns every interval by node.
fn assert_no_overlap(nodes: &[Node]) -> Vec<(String, u64, u64, u64)> {
    let now = mono_ns();
    let all = nodes
        .iter()
        .flat_map(|n| intervals(&n.log(), n.killed_at, now).into_iter().map(|(s, e, t)| (n.name.clone(), s, e, t)))
        .collect();
    assert_disjoint(all, &logs(nodes))
}

fn logs(nodes: &[Node]) -> String {
    nodes.iter().map(|n| format!("---- {} ----\n{}", n.name, n.log())).collect::<Vec<_>>().join("\n")
}

fn wait_active(nodes: &[Node], limit: Duration) -> usize {
    wait_for("a node to become active", limit, || nodes.iter().position(Node::logged_active))
}

fn start_pair() -> (ArbiterNet, Vec<Node>, usize) {
    let (arb, mut nodes) = lab(2);
    let init = nodes[0].cli(&["arbiter", "init"]);
    assert!(init.contains("arbiter ready"), "{init}");
    nodes[0].start();
    nodes[1].start();
    let a = wait_active(&nodes, Duration::from_secs(20));
    // Let it settle for a few intervals; the other must stay standby.
    std::thread::sleep(Duration::from_millis(3 * I_MS()));
    assert!(!nodes[1 - a].logged_active(), "both active:\n{}", logs(&nodes));
    (arb, nodes, a)
}

fn bound_ns() -> u64 {
    (T_MS() + I_MS() + 1000) * 1_000_000
}

#[test]
fn kill_9_of_the_active_fails_over_within_t_plus_i() {
    let (_arb, mut nodes, a) = start_pair();
    let b = 1 - a;
    let who = nodes[b].cli(&["whois"]);
    assert!(who.contains(&format!("primary {} at {}.branch.example", nodes[a].name, nodes[a].name)), "{who}");
    nodes[a].kill9();
    let died = nodes[a].killed_at.unwrap();
    wait_for("the standby to take over", Duration::from_millis(T_MS() + I_MS() + 5000), || {
        nodes[b].logged_active().then_some(())
    });
    let took = promoted_at(&nodes[b].log()).unwrap() - died;
    eprintln!("TAKEOVER kill -9: {} ms after the active died (T = {} ms, I = {} ms)", took / 1_000_000, T_MS(), I_MS());
    assert!(took <= bound_ns(), "take-over took {} ms > T + I + 1 s\n{}", took / 1_000_000, logs(&nodes));
    let who = nodes[a].cli(&["whois", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&who).unwrap();
    assert_eq!(v["primary"], nodes[b].name.as_str(), "{who}");
    assert_eq!(v["term"], 2);
    // The killed box comes back with a new uuid and must stay standby.
    nodes[a].killed_at = None;
    let old_log_len = nodes[a].log().len();
    nodes[a].start();
    std::thread::sleep(Duration::from_millis(4 * I_MS()));
    assert!(
        !nodes[a].log()[old_log_len..].contains("role=\"active\""),
        "the restarted box took over:\n{}",
        logs(&nodes)
    );
    nodes[a].killed_at = Some(died); // its earlier life ended at the kill
    assert_no_overlap(&nodes);
}

/// A clean stop (SIGTERM, e.g. an upgrade): the box stops serving, then expires its row, and the
/// partner takes over within an interval instead of after T.
#[test]
fn a_clean_stop_hands_over_within_an_interval() {
    let (_arb, mut nodes, a) = start_pair();
    let b = 1 - a;
    let stopping = mono_ns();
    nodes[a].srv.as_mut().unwrap().stop();
    nodes[a].killed_at = Some(mono_ns()); // its process has ended by now
    assert!(nodes[a].log().contains("handed the arbiter row over"), "{}", nodes[a].log());
    wait_for("the standby to take over", Duration::from_millis(T_MS() + I_MS() + 5000), || {
        nodes[b].logged_active().then_some(())
    });
    let took = promoted_at(&nodes[b].log()).unwrap() - stopping;
    eprintln!("TAKEOVER clean stop: {} ms after SIGTERM (I = {} ms)", took / 1_000_000, I_MS());
    assert!(took <= (I_MS() + 1000) * 1_000_000, "hand-over took {} ms", took / 1_000_000);
    assert_no_overlap(&nodes);
}

#[test]
fn the_active_losing_its_link_stops_before_the_other_starts() {
    let (_arb, nodes, a) = start_pair();
    let b = 1 - a;
    let cut = mono_ns();
    nodes[a].link(false);
    wait_for("the standby to take over", Duration::from_millis(T_MS() + I_MS() + 5000), || {
        nodes[b].logged_active().then_some(())
    });
    let took = promoted_at(&nodes[b].log()).unwrap() - cut;
    eprintln!("TAKEOVER link down: {} ms after the active's link went down", took / 1_000_000);
    assert!(took <= bound_ns(), "take-over took {} ms", took / 1_000_000);
    wait_for("the isolated box to demote itself", Duration::from_secs(5), || (!nodes[a].logged_active()).then_some(()));
    // Back online: it finds the other in charge and stays standby.
    nodes[a].link(true);
    std::thread::sleep(Duration::from_millis(4 * I_MS()));
    assert!(!nodes[a].logged_active() && nodes[b].logged_active(), "{}", logs(&nodes));
    assert_no_overlap(&nodes);
}

/// The seed's failure: writes fail while reads still succeed, then the active's link goes too,
/// then writes come back. The active must have stopped by the time the other can start.
#[test]
fn writes_failing_then_the_link_going_keeps_one_active() {
    let (arb, nodes, a) = start_pair();
    let b = 1 - a;
    arb.psql("REVOKE INSERT, UPDATE ON twinlease_heartbeat FROM twinlease;");
    std::thread::sleep(Duration::from_millis(3 * I_MS()));
    nodes[a].link(false);
    arb.psql("GRANT INSERT, UPDATE ON twinlease_heartbeat TO twinlease;");
    wait_for("the standby to take over", Duration::from_millis(T_MS() + I_MS() + 5000), || {
        nodes[b].logged_active().then_some(())
    });
    let all = assert_no_overlap(&nodes);
    let first_end = all.iter().find(|x| x.0 == nodes[a].name).map(|x| x.2).unwrap();
    let second_start = all.iter().find(|x| x.0 == nodes[b].name).map(|x| x.1).unwrap();
    eprintln!(
        "GAP writes-failing: the old active stopped {} ms before the new one started",
        (second_start - first_end) / 1_000_000
    );
    nodes[a].link(true);
}

/// The arbiter freezes (SIGSTOP) for longer than T: the active must stop serving on its own,
/// and after the arbiter resumes exactly one box serves.
#[test]
fn a_stalled_arbiter_silences_the_active_then_one_box_resumes() {
    let (arb, nodes, a) = start_pair();
    let stalled = mono_ns();
    arb.signal_all("STOP");
    wait_for("the active to demote itself", Duration::from_millis(T_MS() + 2000), || {
        (!nodes[a].logged_active()).then_some(())
    });
    let demoted =
        nodes[a].log().lines().rfind(|l| l.contains("role=\"standby\"")).and_then(|l| field(l, "mono_ns")).unwrap();
    eprintln!(
        "STALL: the active stopped serving {} ms after the arbiter froze (T - I = {} ms)",
        (demoted - stalled) / 1_000_000,
        T_MS() - I_MS()
    );
    assert!(demoted - stalled <= (T_MS() - I_MS() + 300) * 1_000_000);
    std::thread::sleep(Duration::from_millis(T_MS()));
    assert!(nodes.iter().all(|n| !n.logged_active()), "someone active while the arbiter is frozen:\n{}", logs(&nodes));
    arb.signal_all("CONT");
    wait_active(&nodes, Duration::from_millis(T_MS() + I_MS() + 5000));
    std::thread::sleep(Duration::from_millis(3 * I_MS()));
    assert_no_overlap(&nodes);
    assert_eq!(nodes.iter().filter(|n| n.logged_active()).count(), 1);
}

#[test]
fn a_different_t_on_one_box_is_refused_at_start_up() {
    let (_arb, nodes, a) = start_pair();
    let b = 1 - a;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("other-t.toml");
    let text = std::fs::read_to_string(nodes[b].config())
        .unwrap()
        .replace(&format!("timeout_ms = {}", T_MS()), "timeout_ms = 9000");
    std::fs::write(&cfg, text).unwrap();
    let out =
        nodes[b].ns.cmd(BIN).args(["run", "--config"]).arg(&cfg).env("TWINLEASE_LOG_STDERR", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("has T = {} ms but this box has timeout_ms = 9000", T_MS())), "{err}");
    assert_no_overlap(&nodes);
}

/// The demo set-up: two processes on one host (here: two namespaces, one file system) elect
/// through a shared SQLite file. kill -9 of the active: the other takes over within T + I.
#[test]
fn two_processes_sharing_a_sqlite_arbiter_fail_over() {
    let shared = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/arbiter.db", shared.path().display());
    let mut nodes: Vec<Node> = (0..2)
        .map(|k| Node {
            name: format!("demo{}", k + 1),
            ns: Netns::new("d"),
            iface: String::new(),
            dir: tempfile::tempdir().unwrap(),
            srv: None,
            killed_at: None,
            url: Some(url.clone()),
        })
        .collect();
    let init = nodes[0].cli(&["arbiter", "init"]);
    assert!(init.contains("arbiter ready"), "{init}");
    nodes[0].start();
    nodes[1].start();
    let a = wait_active(&nodes, Duration::from_secs(20));
    let b = 1 - a;
    std::thread::sleep(Duration::from_millis(3 * I_MS()));
    assert!(!nodes[b].logged_active(), "both active:\n{}", logs(&nodes));
    nodes[a].kill9();
    let died = nodes[a].killed_at.unwrap();
    wait_for("the other process to take over", Duration::from_millis(T_MS() + I_MS() + 5000), || {
        nodes[b].logged_active().then_some(())
    });
    let took = promoted_at(&nodes[b].log()).unwrap() - died;
    eprintln!("TAKEOVER sqlite kill -9: {} ms", took / 1_000_000);
    assert!(took <= bound_ns(), "take-over took {} ms", took / 1_000_000);
    let who = nodes[a].cli(&["whois"]);
    assert!(who.contains(&format!("primary {}", nodes[b].name)), "{who}");
    assert_no_overlap(&nodes);
}

/// The uuid in a node's log line "election started".
fn uuid_of(node: &Node) -> String {
    let log = node.log();
    let line = log.lines().find(|l| l.contains("election started")).expect("an election started line");
    line.split("uuid=").nth(1).unwrap().split_whitespace().next().unwrap().to_string()
}

/// An arbiter answering nonsense: the row rewritten with a uuid that is no uuid, then with the
/// standby's uuid (as a confused or tampered arbiter would). Each time the active says so in
/// its log and stops, never two boxes are active at once, and one box serves again without a
/// restart.
#[test]
fn an_arbiter_row_rewritten_with_nonsense_or_the_other_box_s_uuid_keeps_one_active() {
    let (arb, nodes, a) = start_pair();
    let b = 1 - a;
    arb.psql("UPDATE twinlease_heartbeat SET uuid = 'not-a-uuid at all', term = term + 1;");
    wait_for("the active to stop on the nonsense row", Duration::from_millis(T_MS() + 3000), || {
        (!nodes[a].logged_active()).then_some(())
    });
    assert!(
        nodes[a].log().contains("reason=the arbiter rejected our heartbeat"),
        "no clear log line:\n{}",
        nodes[a].log()
    );
    // The nonsense row expires after T like any other; a box takes it over.
    let limit = Instant::now() + Duration::from_millis(2 * T_MS() + 5000);
    let next = loop {
        if let Some(i) = nodes.iter().position(Node::logged_active) {
            break i;
        }
        assert!(Instant::now() < limit, "no box took the nonsense row over:\n{}", logs(&nodes));
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_no_overlap(&nodes);

    let other = &nodes[1 - next];
    let before = nodes[next].log().len();
    arb.psql(&format!("UPDATE twinlease_heartbeat SET uuid = '{}', name = '{}';", uuid_of(other), other.name));
    // The box the row now names never wrote it, so it lets the row expire rather than serve
    // beside the real holder; once it has, either box may take it over, and only one does.
    wait_for(
        "the row's holder to stand down and one box to take the expired row",
        Duration::from_millis(2 * T_MS() + 5000),
        || {
            let stood_down = nodes[next].log()[before..].contains("role=\"standby\"");
            (stood_down && other.log().contains("a row it never wrote") && nodes.iter().any(Node::logged_active))
                .then_some(())
        },
    );
    std::thread::sleep(Duration::from_millis(3 * I_MS()));
    assert_eq!(nodes.iter().filter(|n| n.logged_active()).count(), 1, "{}", logs(&nodes));
    assert_no_overlap(&nodes);
    let _ = b;
}
