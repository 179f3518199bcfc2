//! The status and control sockets of a running box, as operators and scripts use them:
//! `twinlease status` and `twinlease ctl` through the real sockets, the socket permissions, bad
//! input, and a pair handing service over on `step-down` and staying out of the election in
//! maintenance across a restart. (Status clients under DHCP load: `control_load.rs`.)

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::arbiter::*;
use common::site::*;
use common::*;
use serde_json::json;

fn lan_config(lan: &Lan, dir: &std::path::Path, control: &str) -> String {
    let body = format!(
        "[dhcp]\ninterfaces = [\"{}\"]\nping_check = false\n[[subnet]]\ncidr = \"198.18.0.0/24\"\n\
         pools = [\"198.18.0.100-198.18.0.150\"]\nlease_secs = 3600\n{control}",
        lan.bridge
    );
    config_text(dir, &body)
}

/// `twinlease ARGS --config CONFIG --runtime-dir DIR`, as `as_user` (setpriv arguments) if given.
fn cli(srv: &Server, args: &[&str], as_user: &[&str]) -> Output {
    let mut cmd = if as_user.is_empty() {
        Command::new(BIN)
    } else {
        let mut c = Command::new("setpriv");
        c.args(as_user).arg(BIN);
        c
    };
    cmd.args(args).arg("--config").arg(&srv.config).arg("--runtime-dir").arg(&srv.runtime_dir).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn every_command_answers_through_the_real_sockets() {
    let mut lan = Lan::new("198.18.0.1/24");
    let c = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&lan.ns, dir.path(), &lan_config(&lan, dir.path(), ""));
    let (ns, iface) = lan.client(c);
    let (out, ev) = udhcpc_once(ns, iface, dir.path(), &[]);
    assert!(out.status.success());
    let ip = events(&ev).into_iter().rev().find(|e| e.reason == "bound").unwrap().ip;
    // The engine publishes its counts once a second.
    srv.wait_until("the lease counted", Duration::from_secs(5), |s| s.subnets[0].leased == 1);

    let out = cli(&srv, &["status"], &[]);
    assert_eq!(out.status.code(), Some(0), "serving: exit 0\n{}", text(&out));
    assert!(
        text(&out).contains("serving all clients") && text(&out).contains("198.18.0.0/24: 1 of 51 in use"),
        "{}",
        text(&out)
    );
    let out = cli(&srv, &["status", "--json"], &[]);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["role"]["why"], "standalone");
    assert_eq!(s["dhcp"]["requests"]["discover"], 1);
    let out = cli(&srv, &["status", "--format", "prometheus"], &[]);
    assert!(text(&out).contains(r#"twinlease_leases{subnet="198.18.0.0/24",state="leased"} 1"#), "{}", text(&out));

    let out = cli(&srv, &["ctl", "lease-get", &format!("address={ip}"), "--json"], &[]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((r["result"].as_u64(), r["arguments"]["leases"][0]["state"].as_str()), (Some(0), Some("leased")), "{r}");
    let out = cli(&srv, &["ctl", "frobnicate"], &[]);
    assert_eq!(out.status.code(), Some(2), "unsupported: result 2\n{}", text(&out));
    let out = cli(&srv, &["ctl", "maintenance", "action=start"], &[]);
    assert_eq!(out.status.code(), Some(1), "no election, no maintenance\n{}", text(&out));

    // A new lease time takes effect without a restart; a new pool is refused whole.
    std::fs::write(&srv.config, lan_config(&lan, dir.path(), "").replace("lease_secs = 3600", "lease_secs = 600"))
        .unwrap();
    let out = cli(&srv, &["ctl", "reload"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::write(&srv.config, lan_config(&lan, dir.path(), "").replace("198.18.0.150", "198.18.0.160")).unwrap();
    let out = cli(&srv, &["ctl", "reload"], &[]);
    assert!(!out.status.success() && text(&out).contains("need a restart"), "{}", text(&out));
    let (out, ev) = udhcpc_once(ns, iface, dir.path(), &[]);
    assert!(out.status.success());
    assert_eq!(events(&ev).last().unwrap().get("lease"), Some("600"), "the reloaded lease time");
}

#[test]
fn malformed_and_oversized_requests_get_an_error_and_the_box_keeps_going() {
    let lan = Lan::new("198.18.0.1/24");
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&lan.ns, dir.path(), &lan_config(&lan, dir.path(), ""));
    let socket = srv.runtime_dir.join("status.sock");
    let exchange = |payload: &[u8]| {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(payload);
        let mut line = String::new();
        let _ = BufReader::new(&s).read_line(&mut line);
        line
    };
    for bad in [&b"hello\n"[..], b"{\"command\": 5}\n", b"[]\n", b"{\"command\": \"status-get\", \"version\": 9}\n"] {
        let answer: serde_json::Value = serde_json::from_str(&exchange(bad)).unwrap();
        assert_eq!(answer["result"], 1, "{}", String::from_utf8_lossy(bad));
    }
    let mut huge = vec![b' '; 70 * 1024];
    huge.push(b'\n');
    let answer = exchange(&huge);
    assert!(answer.contains("longer than"), "{answer}");
    assert_eq!(srv.status().summary, "serving all clients", "still answering");
    assert!(srv.child.id() > 0 && srv.log_text().contains("status and control sockets open"));
    let log = srv.log_text();
    assert!(log.contains("request refused: malformed request") && log.contains("socket=\"status\""), "{log}");
    assert!(log.contains("request refused: longer than 65536 bytes"), "{log}");
}

/// Slow and stuck clients: one sending its request a byte at a time is answered; 300 that
/// connect and send nothing take every slot, so the next client is told the box is busy (at
/// once, not left hanging) and the log says so, while DHCP goes on serving; once they go,
/// status answers again.
#[test]
fn slow_and_stuck_status_clients_cost_only_their_own_slots() {
    let mut lan = Lan::new("198.18.0.1/24");
    lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&lan.ns, dir.path(), &lan_config(&lan, dir.path(), ""));
    let socket = srv.runtime_dir.join("status.sock");

    let mut slow = UnixStream::connect(&socket).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for b in b"{\"command\": \"list-commands\"}\n" {
        slow.write_all(&[*b]).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut line = String::new();
    BufReader::new(&slow).read_line(&mut line).unwrap();
    assert!(line.contains("\"result\":0"), "{line}");
    drop(slow);

    let stuck: Vec<UnixStream> = (0..300).map(|_| UnixStream::connect(&socket).unwrap()).collect();
    let started = Instant::now();
    let answer = wait_for("a busy answer", Duration::from_secs(10), || {
        let s = UnixStream::connect(&socket).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).ok()?;
        line.contains("busy").then_some(line)
    });
    assert!(started.elapsed() < Duration::from_secs(5), "busy answer took {:?}: {answer}", started.elapsed());
    let (cns, ciface) = lan.client(0);
    let (out, ev) = udhcpc_once(cns, ciface, dir.path(), &[]);
    assert!(out.status.success(), "no lease while the status socket is full: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(events(&ev).last().unwrap().reason, "bound");
    assert!(srv.log_text().contains("client refused: 256 clients are connected"), "{}", srv.log_text());
    drop(stuck);
    wait_for("status to answer again", Duration::from_secs(10), || {
        let r = twinlease::server::control::client::ask(
            &socket,
            &twinlease::server::control::protocol::Request::new("status-get", serde_json::Map::new()),
        );
        r.ok().filter(|r| r.result == 0)
    });
}

#[test]
fn only_the_admin_group_may_act_and_only_the_status_group_may_read() {
    let lan = Lan::new("198.18.0.1/24");
    let dir = tempfile::tempdir().unwrap();
    // Groups every Debian system has stand in for twinlease and twinlease-admin.
    let control = "[control]\nstatus_group = \"users\"\nadmin_group = \"staff\"\n";
    let srv = Server::start(&lan.ns, dir.path(), &lan_config(&lan, dir.path(), control));
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let as_group = |gid: &str| vec!["--reuid=65534".to_string(), format!("--regid={gid}"), "--clear-groups".into()];
    let run = |args: &[&str], gid: &str| {
        let user = as_group(gid);
        cli(&srv, args, &user.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let out = run(&["status"], "users");
    assert_eq!(out.status.code(), Some(0), "the status group reads\n{}", text(&out));
    let out = run(&["ctl", "step-down"], "users");
    assert!(!out.status.success() && text(&out).contains("permission denied"), "{}", text(&out));
    let out = run(&["status"], "nogroup");
    assert!(!out.status.success() && text(&out).contains("permission denied"), "{}", text(&out));
    // The admin group reaches the control socket (this standalone box then refuses the action).
    let out = run(&["ctl", "step-down"], "staff");
    assert!(text(&out).contains("no election"), "{}", text(&out));
    assert!(srv.log_text().contains("status and control sockets open"));
}

/// `leases` (or `conflicts`) with `args`, as root reading the store: no box answers in an empty
/// runtime directory.
fn from_store(srv: &Server, args: &[&str]) -> String {
    let nobody_home = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(&srv.config)
        .arg("--runtime-dir")
        .arg(nobody_home.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// The table without its REMAINING column (third from the right), which moves with the clock.
fn without_remaining(table: &str) -> Vec<Vec<String>> {
    let row = |l: &str| {
        let mut t: Vec<String> = l.split_whitespace().map(str::to_string).collect();
        if t.len() > 3 {
            t.remove(t.len() - 3);
        }
        t
    };
    table.lines().map(row).collect()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// A `--json` lease array without "remaining_secs", checked first against "expires" as seen
/// some time between `asked` (before the command ran) and now: a loaded machine may take a
/// minute to list 65,536 leases.
fn without_remaining_secs(json: &str, asked: u64) -> Vec<serde_json::Value> {
    let mut rows: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
    // Laid out as serde_json pretty-prints the whole array, whoever produced it.
    assert_eq!(json, serde_json::to_string_pretty(&rows).unwrap() + "\n");
    let now = unix_now();
    for r in &mut rows {
        let expires = r["expires"].as_u64().unwrap();
        let (least, most) = (expires.saturating_sub(now + 1), expires.saturating_sub(asked) + 1);
        let said = r.as_object_mut().unwrap().remove("remaining_secs").unwrap().as_u64().unwrap();
        assert!((least..=most).contains(&said), "remaining {said} s, expected {least}..={most}: {r}");
    }
    rows
}

/// The unit keeps the state directory and the database to the service user (0750, umask 0077),
/// so an administrator (the admin group, not the status group) cannot read them; `twinlease
/// leases` and `conflicts` then ask the running box over the control socket and print what the
/// store holds, in the same table and JSON, a table of 65,536 leases too. Without either group,
/// or with the box stopped, the error says what to do.
#[test]
fn the_admin_group_reads_leases_and_conflicts_through_the_control_socket() {
    use twinlease::lease::{Binding, ClientKey, LeaseState, Transition};
    use twinlease::store::{ConflictKind, ConflictRecord, LeaseStore};
    let lan = Lan::new("198.18.0.1/15");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let control = "[control]\nstatus_group = \"users\"\nadmin_group = \"staff\"\n";
    let body = format!(
        "[dhcp]\ninterfaces = [\"{}\"]\nping_check = false\n[[subnet]]\ncidr = \"198.18.0.0/15\"\n\
         pools = [\"198.18.0.10-198.19.0.9\"]\nlease_secs = 3600\n{control}",
        lan.bridge
    );
    // Every pool address has a row: leased, but each 16th free with a history (`--all` only).
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let (mut store, _) = LeaseStore::open(&state.join("leases.db"), 1).unwrap();
    let binding = |i: u32| {
        let mut b = Binding::fresh(std::net::Ipv4Addr::from(0xc612_000a + i));
        b.state = if i.is_multiple_of(16) { LeaseState::Free } else { LeaseState::Leased };
        b.owner = Some(ClientKey::from_hw(1, &[2, 0, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8]));
        b.hw = vec![2, 0, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8];
        b.hostname = i.is_multiple_of(3).then(|| format!("host-{i}"));
        b.expires = 4_000_000_000 + u64::from(i);
        b.cltt = 1_700_000_000;
        b.version = 1;
        b.term = 1;
        b
    };
    let rows: Vec<Transition> =
        (0..65_536u32).map(|i| Transition { expect_version: 0, expect_owner: None, new: binding(i) }).collect();
    let conflict =
        ConflictRecord { at: 1_700_000_100, kind: ConflictKind::Address, winner: binding(1), loser: binding(2) };
    store.commit_with(&rows.iter().collect::<Vec<_>>(), &[], &[conflict]).unwrap();
    drop(store);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body));
    srv.wait_until("the table loaded", Duration::from_secs(20), |s| s.subnets[0].leased == 61_440);

    let as_gid = |gid: &str| vec!["--reuid=65534".to_string(), format!("--regid={gid}"), "--clear-groups".into()];
    let admin = as_gid("staff");
    let admin: Vec<&str> = admin.iter().map(String::as_str).collect();
    let out = cli(&srv, &["ctl", "version-get"], &admin);
    assert!(out.status.success(), "the admin reaches the control socket: {}", text(&out));
    let out = Command::new("setpriv").args(&admin).arg("cat").arg(state.join("leases.db")).output().unwrap();
    assert!(!out.status.success(), "the admin must not read the database itself");

    for (args, entries) in [(&["leases"][..], 61_440), (&["leases", "--all"][..], 65_536)] {
        let out = cli(&srv, args, &admin);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        let got = String::from_utf8(out.stdout).unwrap();
        assert!(got.ends_with(&format!("\n{entries} entries\n")), "{args:?}: {}", &got[got.len() - 200..]);
        assert_eq!(without_remaining(&got), without_remaining(&from_store(&srv, args)), "{args:?}");
    }
    for args in [&["leases", "--json"][..], &["leases", "--json", "--all"][..]] {
        let asked = unix_now();
        let out = cli(&srv, args, &admin);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        let got = without_remaining_secs(&String::from_utf8(out.stdout).unwrap(), asked);
        assert_eq!(got.len(), if args.len() == 3 { 65_536 } else { 61_440 });
        let asked = unix_now();
        assert!(got == without_remaining_secs(&from_store(&srv, args), asked), "{args:?}: differs from the store");
    }
    for args in [&["conflicts"][..], &["conflicts", "--json"][..]] {
        let out = cli(&srv, args, &admin);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        assert_eq!(String::from_utf8(out.stdout).unwrap(), from_store(&srv, args), "{args:?}");
    }
    let listed = from_store(&srv, &["conflicts"]);
    assert!(
        listed.contains("address-held-by-two-clients: kept 198.18.0.11 for") && listed.ends_with("\n1 conflicts\n"),
        "{listed}"
    );

    // A user in neither group may use neither socket nor read the store.
    let nobody = as_gid("nogroup");
    let nobody: Vec<&str> = nobody.iter().map(String::as_str).collect();
    let out = cli(&srv, &["leases"], &nobody);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("Add the user to group users (or staff)"), "{}", text(&out));
    // With the box stopped only the store is left, and only root may read it.
    srv.stop();
    let out = cli(&srv, &["leases", "--json"], &admin);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("not running") && text(&out).contains("as root"), "{}", text(&out));
}

/// The role and the arbiter's primary as one box's status has them.
fn sees(srv: &Server) -> (String, Option<String>) {
    let s = srv.status();
    (s.role.state, s.election.and_then(|e| e.arbiter.primary))
}

#[test]
fn step_down_hands_service_over_and_maintenance_survives_a_restart() {
    let mut site = Site::new(1);
    site.start(0);
    site.start(1);
    let a = wait_for("a box to win the election", Duration::from_secs(30), || {
        (0..2).find(|&i| site.srv(i).status().role.state == "active")
    });
    let b = 1 - a;
    site.srv(a)
        .wait_until("the partner in sync", Duration::from_secs(15), |s| s.partner.as_ref().is_some_and(|p| p.in_sync));
    let names = ["box-a", "box-b"];
    site.srv(b).wait_until("b to see a as primary", Duration::from_secs(5), |s| {
        s.election.as_ref().and_then(|e| e.arbiter.primary.as_deref()) == Some(names[a])
    });
    // A client holds a lease from a.
    let (cns, ciface) = site.p.client(0);
    let cdir = site.p.dir.path().join("client");
    std::fs::create_dir_all(&cdir).unwrap();
    let (mut dh, ev) = dhclient(cns, ciface, &cdir, &[]);
    let bound = wait_event(&ev, &["BOUND"], 0, Duration::from_secs(20));
    let _ = (dh.kill(), dh.wait());

    let r = site.srv(a).ask("step-down", json!({}), true);
    assert_eq!(r.result, 0, "{}", r.text);
    let asked = mono_ns();
    site.srv(b).wait_until("b to take over", Duration::from_millis(I_MS + 3000), |s| s.role.state == "active");
    let took = promoted_at(&site.srv(b).log_text()).unwrap().saturating_sub(asked);
    eprintln!("CONTROL step-down: the partner was active {} ms after the request (I = {I_MS} ms)", took / 1_000_000);
    assert!(took <= (I_MS + 1000) * 1_000_000, "hand-over took {} ms", took / 1_000_000);
    assert_eq!(sees(site.srv(a)).0, "standby");
    site.srv(a).wait_until("a to see b as primary", Duration::from_secs(5), |s| {
        s.election.as_ref().and_then(|e| e.arbiter.primary.as_deref()) == Some(names[b])
    });
    assert_eq!(sees(site.srv(a)).1, sees(site.srv(b)).1, "both boxes agree who is active");
    // The client renews with the new active: same address, no NAK.
    let (mut dh, _) = dhclient(cns, ciface, &cdir, &[]);
    let dlog = cdir.join(format!("dhclient-{ciface}.log"));
    let want = format!("DHCPACK of {} from {}", bound.ip, lan_ip(b));
    wait_for("the new active to ACK the client's address", Duration::from_secs(30), || {
        std::fs::read_to_string(&dlog).ok().filter(|t| t.contains(&want)).map(|_| ())
    });
    assert!(!std::fs::read_to_string(&dlog).unwrap().contains("DHCPNAK"));
    let _ = (dh.kill(), dh.wait());

    // Maintenance on a (now standby, partner caught up) survives its restart.
    site.srv(b).wait_until("b's partner in sync", Duration::from_secs(15), |s| {
        s.partner.as_ref().is_some_and(|p| p.in_sync && p.unsynced == 0)
    });
    let r = site.srv(a).ask("maintenance", json!({"action": "start"}), true);
    assert_eq!(r.result, 0, "{}", r.text);
    site.boxes[a].as_mut().unwrap().stop();
    site.start(a);
    let s =
        site.srv(a).wait_until("a to report maintenance", Duration::from_secs(10), |s| s.role.maintenance.is_some());
    assert!(!s.role.eligible && s.role.not_eligible_because.contains(&"maintenance".to_string()));
    // Even with b gone, a in maintenance does not take over.
    let b_killed = mono_ns();
    site.boxes[b].as_mut().unwrap().kill9();
    let settle = Instant::now() + Duration::from_millis(T_MS + 2 * I_MS);
    wait_for("T and two intervals", Duration::from_secs(10), || (Instant::now() >= settle).then_some(()));
    assert_eq!(site.srv(a).status().role.state, "standby", "a box in maintenance stays out of the election");
    let r = site.srv(a).ask("maintenance", json!({"action": "cancel"}), true);
    assert_eq!(r.result, 0, "{}", r.text);
    site.srv(a).wait_until("a to take over once maintenance ends", Duration::from_millis(T_MS + I_MS + 3000), |s| {
        s.role.state == "active"
    });
    let now = mono_ns();
    let lives = [(a, site.srv(a).log_text(), None), (b, site.srv(b).log_text(), Some(b_killed))];
    let all = lives
        .iter()
        .flat_map(|(i, log, killed)| {
            intervals(log, *killed, now).into_iter().map(move |(s, e, t)| (format!("box {i}"), s, e, t))
        })
        .collect();
    assert_disjoint(all, &site.logs());
}
