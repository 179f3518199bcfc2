//! The daemon as systemd runs it: readiness, watchdog, the unit's capability set, journald.
//!
//! Each test starts the real binary in its own network namespaces, with a NOTIFY_SOCKET the test
//! owns; time-based assertions use measured receive times with generous bounds, never sleeps.
//! The wedge tests need the `fault-injection` cargo feature (SIGUSR1/SIGUSR2 hooks), which
//! `make test` enables; a plain `cargo test` lists them as ignored.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const LAN: &str = "198.18.0.1/24";

fn body(iface: &str, dhcp_extra: &str) -> String {
    format!(
        "[dhcp]\ninterfaces = [\"{iface}\"]\n{dhcp_extra}\n\
         [[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.150\"]\n\
         routers = [\"198.18.0.1\"]\ndns_servers = [\"198.18.0.1\"]\n"
    )
}

fn gaps(ts: &[Instant]) -> Vec<Duration> {
    ts.windows(2).map(|w| w[1] - w[0]).collect()
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

/// The UDP sockets on port 67 in a namespace, as `ss` shows them (with the owning process).
fn port_67(ns: &Netns) -> String {
    String::from_utf8_lossy(&run(ns.cmd("ss").args(["-uanpH", "sport", "=", ":67"])).stdout).to_string()
}

const WATCHDOG_USEC: &str = "2000000";
const PING_PERIOD: Duration = Duration::from_secs(1);

/// Starts a daemon with WatchdogSec=2s on a fresh LAN; asserts READY=1 came with the DHCP
/// socket bound and the store open, and that WATCHDOG=1 arrives every second.
fn started_with_watchdog(lan: &Lan, dir: &Path) -> Server {
    let cfg = config_text(dir, &body(&lan.bridge, "ping_check = false"));
    let mut d = Server::builder(&lan.ns, dir).config_text(&cfg).watchdog(WATCHDOG_USEC).spawn();
    d.wait_notify("READY=1", Duration::from_secs(20));

    // READY=1 is sent after the bind: at the moment it arrives the socket is already there,
    // bound to the served interface and owned by twinlease, and the lease store exists.
    let bound = port_67(&lan.ns);
    assert!(
        bound.contains(&format!("%{}:67", lan.bridge)) && bound.contains("twinlease"),
        "READY=1 before the DHCP socket was bound:\n{bound}"
    );
    assert!(dir.join("state").join("leases.db").exists(), "READY=1 before the lease store was opened");
    let ready = &d.got.last().unwrap().1;
    assert!(ready.contains("STATUS=active (term 0), 0 leases"), "{ready}");

    // Pings at WatchdogSec/2 = 1 s.
    let from = Instant::now();
    d.collect_until(from + Duration::from_millis(6500), |_| false);
    let pings = d.pings_since(from);
    let g = gaps(&pings);
    eprintln!("watchdog pings over 6.5 s: {}; gaps {:?}", pings.len(), g);
    assert!((5..=9).contains(&pings.len()), "expected about 6 pings in 6.5 s at 1 s, got {}: {g:?}", pings.len());
    let m = median(g.clone());
    assert!(
        m >= PING_PERIOD * 7 / 10 && m <= PING_PERIOD * 14 / 10,
        "median ping gap {m:?}, expected about {PING_PERIOD:?}: {g:?}"
    );
    assert!(
        g.iter().all(|x| *x < Duration::from_micros(WATCHDOG_USEC.parse().unwrap())),
        "a gap reached WatchdogSec: {g:?}"
    );
    d
}

/// Sends `sig`, then asserts the pings stop within the grace period and stay stopped while the
/// process itself keeps running.
fn pings_stop_after(d: &mut Server, sig: &str, component: &str) {
    let wedged_at = Instant::now();
    d.signal(sig);
    d.collect_until(wedged_at + Duration::from_secs(10), |_| false);
    let after = d.pings_since(wedged_at);
    let last = after.last().copied().unwrap_or(wedged_at);
    // Stale after 3 s, noticed at the next 1 s check; 2 s of slack for a loaded machine.
    assert!(
        last - wedged_at <= Duration::from_secs(6),
        "pings went on {:?} after the {component} was wedged ({} pings)",
        last - wedged_at,
        after.len()
    );
    assert!(
        wedged_at + Duration::from_secs(10) - last >= Duration::from_secs(4),
        "pings resumed: {:?}",
        after.iter().map(|t| *t - wedged_at).collect::<Vec<_>>()
    );
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "the daemon should be alive (systemd, not the daemon, acts on a missed watchdog)"
    );
    let log = d.log_text();
    assert!(log.contains(component) && log.contains("withholding watchdog pings"), "{log}");
    let status = d.got.iter().rev().find(|(_, m)| m.contains("STATUS=unhealthy"));
    assert!(
        status.is_some_and(|(_, m)| m.contains(component)),
        "STATUS= should say what is wedged: {:?}",
        d.got.iter().map(|(_, m)| m).collect::<Vec<_>>()
    );
    eprintln!("{component} wedged: {} more pings, the last {:?} after the wedge", after.len(), last - wedged_at);
}

#[test]
#[cfg_attr(not(feature = "fault-injection"), ignore = "needs --features fault-injection (make test enables it)")]
fn ready_after_bind_then_watchdog_pings_until_the_store_thread_wedges() {
    let lan = Lan::new(LAN);
    let dir = tempfile::tempdir().unwrap();
    let mut d = started_with_watchdog(&lan, dir.path());
    pings_stop_after(&mut d, "USR2", "lease store thread");
}

#[test]
#[cfg_attr(not(feature = "fault-injection"), ignore = "needs --features fault-injection (make test enables it)")]
fn watchdog_pings_stop_when_the_dhcp_engine_wedges() {
    let lan = Lan::new(LAN);
    let dir = tempfile::tempdir().unwrap();
    let mut d = started_with_watchdog(&lan, dir.path());
    pings_stop_after(&mut d, "USR1", "DHCP engine");
}

#[test]
fn no_watchdog_pings_unless_systemd_asks_and_stopping_on_sigterm() {
    let lan = Lan::new(LAN);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_text(dir.path(), &body(&lan.bridge, "ping_check = false"));
    // WATCHDOG_PID naming another process: the duty is not ours (sd_watchdog_enabled).
    let mut d =
        Server::builder(&lan.ns, dir.path()).config_text(&cfg).watchdog("200000").env("WATCHDOG_PID", "1").spawn();
    d.wait_notify("READY=1", Duration::from_secs(20));
    let from = Instant::now();
    d.collect_until(from + Duration::from_millis(1500), |_| false);
    assert!(d.pings_since(from).is_empty(), "pinged for another pid");
    d.signal("TERM");
    assert!(
        d.collect_until(Instant::now() + Duration::from_secs(10), |m| m.lines().any(|l| l == "STOPPING=1")),
        "no STOPPING=1:\n{}",
        d.log_text()
    );
    let st = wait_for("exit after SIGTERM", Duration::from_secs(10), || d.child.try_wait().unwrap());
    assert!(st.success(), "{st}");
}

// ---- the unit's capability set -------------------------------------------------------------

/// `AmbientCapabilities=` of systemd/twinlease.service, as setpriv spells them.
fn unit_capabilities() -> Vec<String> {
    let unit =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/twinlease.service")).unwrap();
    let line =
        unit.lines().find_map(|l| l.strip_prefix("AmbientCapabilities=")).expect("AmbientCapabilities= in the unit");
    let bounding = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet= in the unit");
    assert_eq!(line, bounding, "ambient and bounding sets should be the same list");
    line.split_whitespace().map(|c| c.trim_start_matches("CAP_").to_ascii_lowercase()).collect()
}

/// setpriv arguments that do what systemd does for User=nobody, AmbientCapabilities=caps,
/// CapabilityBoundingSet=caps, NoNewPrivileges=yes.
fn as_unprivileged(caps: &[String]) -> Vec<String> {
    let list: String = caps.iter().map(|c| format!(",+{c}")).collect();
    vec![
        "setpriv".into(),
        "--reuid=65534".into(),
        "--regid=65534".into(),
        "--clear-groups".into(),
        format!("--inh-caps=-all{list}"),
        format!("--ambient-caps=-all{list}"),
        format!("--bounding-set=-all{list}"),
        "--no-new-privs".into(),
        "--".into(),
    ]
}

/// A state directory the unprivileged user owns, in a test directory it can reach.
fn unprivileged_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    run(Command::new("chown").arg("65534:65534").arg(&state));
    dir
}

#[test]
fn the_units_capabilities_suffice_for_ping_check_and_unicast_replies() {
    let caps = unit_capabilities();
    assert_eq!(caps, ["net_bind_service", "net_raw", "net_admin"]);
    let mut lan = Lan::new(LAN);
    let c = lan.add_client();
    let dir = unprivileged_dir();
    let cfg = config_text(dir.path(), &body(&lan.bridge, "ping_check = true\nping_timeout_ms = 200"));
    let prefix = as_unprivileged(&caps);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let mut d = Server::builder(&lan.ns, dir.path()).config_text(&cfg).prefix(&prefix).spawn();
    d.wait_notify("READY=1", Duration::from_secs(20));
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    assert!(status.lines().any(|l| l == "Uid:\t65534\t65534\t65534\t65534"), "{status}");
    assert!(status.lines().any(|l| l == "CapEff:\t0000000000003400"), "only the three network capabilities:\n{status}");

    let (ns, iface) = lan.client(c);
    let (out, ev) = udhcpc_once(ns, iface, dir.path(), &[]);
    assert!(out.status.success(), "udhcpc: {}\n{}", String::from_utf8_lossy(&out.stderr), d.log_text());
    let bound = events(&ev).into_iter().find(|e| e.reason == "bound").expect("bound");
    let log = d.log_text();
    assert!(!log.contains("ICMP socket"), "the ping check should have its raw socket:\n{log}");
    assert!(!log.contains("CAP_NET_ADMIN"), "ARP installation should work:\n{log}");
    // The neighbour entry SIOCSARP installed for the unicast reply.
    let neigh =
        String::from_utf8_lossy(&run(Command::new("ip").args(["-n", &lan.ns.name, "neigh", "show", &bound.ip])).stdout)
            .to_string();
    assert!(neigh.contains(&lan.mac(c)), "no ARP entry for {} on the server: {neigh:?}", bound.ip);
}

#[test]
fn without_cap_net_admin_replies_fall_back_to_broadcast() {
    let caps: Vec<String> = unit_capabilities().into_iter().filter(|c| c != "net_admin").collect();
    let mut lan = Lan::new(LAN);
    let c = lan.add_client();
    let dir = unprivileged_dir();
    let cfg = config_text(dir.path(), &body(&lan.bridge, "ping_check = false"));
    let prefix = as_unprivileged(&caps);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let mut d = Server::builder(&lan.ns, dir.path()).config_text(&cfg).prefix(&prefix).spawn();
    d.wait_notify("READY=1", Duration::from_secs(20));
    let (ns, iface) = lan.client(c);
    let (out, _) = udhcpc_once(ns, iface, dir.path(), &[]);
    assert!(out.status.success(), "udhcpc: {}\n{}", String::from_utf8_lossy(&out.stderr), d.log_text());
    let log = d.log_text();
    assert!(log.contains("no CAP_NET_ADMIN to install ARP entries"), "{log}");
}

#[test]
fn without_cap_net_bind_service_there_is_no_ready() {
    let caps: Vec<String> = unit_capabilities().into_iter().filter(|c| c != "net_bind_service").collect();
    let lan = Lan::new(LAN);
    let dir = unprivileged_dir();
    let cfg = config_text(dir.path(), &body(&lan.bridge, "ping_check = false"));
    let prefix = as_unprivileged(&caps);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let mut d = Server::builder(&lan.ns, dir.path()).config_text(&cfg).prefix(&prefix).spawn();
    let st = wait_for("the daemon to give up", Duration::from_secs(20), || d.child.try_wait().unwrap());
    assert!(!st.success());
    d.collect_until(Instant::now() + Duration::from_millis(200), |_| false);
    assert!(!d.got.iter().any(|(_, m)| m.contains("READY=1")), "READY=1 without a socket: {:?}", d.got);
    let log = d.log_text();
    assert!(log.contains("cannot listen for DHCP") && log.contains("CAP_NET_BIND_SERVICE"), "{log}");
}

// ---- journald ------------------------------------------------------------------------------

/// One journal entry in the native protocol: `KEY=value` lines, or `KEY\n<len u64 le><value>\n`.
fn parse_journal(mut d: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while !d.is_empty() {
        let nl = d.iter().position(|&b| b == b'\n').unwrap_or(d.len());
        let line = &d[..nl];
        if let Some(eq) = line.iter().position(|&b| b == b'=') {
            out.push((
                String::from_utf8_lossy(&line[..eq]).to_string(),
                String::from_utf8_lossy(&line[eq + 1..]).to_string(),
            ));
            d = d.get(nl + 1..).unwrap_or(&[]);
        } else {
            let key = String::from_utf8_lossy(line).to_string();
            let rest = &d[nl + 1..];
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            out.push((key, String::from_utf8_lossy(&rest[8..8 + len]).to_string()));
            d = rest.get(8 + len + 1..).unwrap_or(&[]);
        }
    }
    out
}

#[test]
fn logs_go_to_the_journal_with_role_term_client_and_address_fields() {
    let mut lan = Lan::new(LAN);
    let c = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.sock");
    let rx = UnixDatagram::bind(&journal).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let cfg = config_text(dir.path(), &body(&lan.bridge, "ping_check = false"));
    // A private mount namespace where the journal's socket is the test's.
    let script = format!(
        "mount -t tmpfs tmpfs /run/systemd 2>/dev/null || {{ mkdir -p /run/systemd && mount -t tmpfs tmpfs /run/systemd; }}; mkdir -p /run/systemd/journal && touch /run/systemd/journal/socket && mount --bind {} /run/systemd/journal/socket && exec \"$0\" \"$@\"",
        journal.display()
    );
    let prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script.as_str()];
    // Without TWINLEASE_LOG_STDERR, so the journal is chosen.
    let mut d =
        Server::builder(&lan.ns, dir.path()).config_text(&cfg).prefix(&prefix).unset("TWINLEASE_LOG_STDERR").spawn();
    d.wait_notify("READY=1", Duration::from_secs(20));
    let (ns, iface) = lan.client(c);
    let (out, _) = udhcpc_once(ns, iface, dir.path(), &[]);
    assert!(out.status.success(), "udhcpc: {}", String::from_utf8_lossy(&out.stderr));

    let mut entries = Vec::new();
    let granted = wait_for("a 'lease granted' journal entry", Duration::from_secs(10), || {
        let mut buf = vec![0u8; 65536];
        if let Ok(n) = rx.recv(&mut buf) {
            entries.push(parse_journal(&buf[..n]));
        }
        entries.iter().find(|e| e.iter().any(|(k, v)| k == "MESSAGE" && v == "lease granted")).cloned()
    });
    let get = |e: &[(String, String)], k: &str| e.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone());
    assert_eq!(get(&granted, "SYSLOG_IDENTIFIER").as_deref(), Some("twinlease"));
    assert_eq!(get(&granted, "PRIORITY").as_deref(), Some("6"));
    assert!(get(&granted, "ADDRESS").is_some_and(|a| a.starts_with("198.18.0.1")), "{granted:?}");
    assert!(get(&granted, "CLIENT").is_some_and(|c| !c.is_empty()), "{granted:?}");
    assert_eq!(get(&granted, "TERM").as_deref(), Some("0"), "{granted:?}");
    let listening = entries
        .iter()
        .find(|e| get(e, "MESSAGE").as_deref() == Some("listening on port 67"))
        .expect("the start-up entry");
    assert_eq!(get(listening, "ROLE").as_deref(), Some("active"), "{listening:?}");
    assert_eq!(get(listening, "TERM").as_deref(), Some("0"), "{listening:?}");
    assert!(!d.log_text().contains("lease granted"), "with the journal there, nothing goes to stderr");
}
