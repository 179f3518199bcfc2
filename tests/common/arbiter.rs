//! A throwaway PostgreSQL arbiter in a namespace of its own, on a bridge the twinlease boxes are
//! plugged into (198.18.10.0/24), and the readings of the role-change lines every box logs with
//! CLOCK_MONOTONIC stamps — one kernel clock for every namespace.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::*;

pub const ARBITER_IP: &str = "198.18.10.1";
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec.
    assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) }, 0);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A PostgreSQL instance of its own in namespace `ns`, listening on ARBITER_IP; stopped (with
/// everything else in the namespace) when the namespace is dropped.
pub struct PgArbiter {
    pub ns: Netns,
    _dir: tempfile::TempDir,
    child: Child,
    log: PathBuf,
}

impl PgArbiter {
    pub fn start(ns: Netns) -> PgArbiter {
        let dir = tempfile::Builder::new().prefix("tl-pg-").tempdir().unwrap();
        let pg =
            nix::unistd::User::from_name("postgres").unwrap().expect("a postgres user (Debian package postgresql)");
        std::os::unix::fs::chown(dir.path(), Some(pg.uid.as_raw()), Some(pg.gid.as_raw())).unwrap();
        let data = dir.path().join("data");
        run(Command::new("runuser")
            .args(["-u", "postgres", "--", &format!("{PG_BIN}/initdb"), "-D"])
            .arg(&data)
            .args(["--auth=trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
            .stdout(Stdio::null()));
        let hba = data.join("pg_hba.conf");
        let mut text = std::fs::read_to_string(&hba).unwrap();
        text.push_str("host all all 198.18.0.0/15 trust\n");
        std::fs::write(&hba, text).unwrap();
        let log = dir.path().join("postgres.log");
        let child = ns
            .cmd("runuser")
            .args(["-u", "postgres", "--", &format!("{PG_BIN}/postgres"), "-D"])
            .arg(&data)
            .arg("-k")
            .arg(dir.path())
            .args([
                "-c",
                &format!("listen_addresses={ARBITER_IP}"),
                "-c",
                "fsync=off",
                "-c",
                "max_connections=30",
                "-c",
                "shared_buffers=16MB",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let a = PgArbiter { ns, _dir: dir, child, log };
        wait_for("the arbiter's PostgreSQL to accept connections", Duration::from_secs(30), || {
            a.ns.cmd(&format!("{PG_BIN}/pg_isready"))
                .args(["-q", "-h", ARBITER_IP])
                .status()
                .unwrap()
                .success()
                .then_some(())
        });
        // The role twinlease connects as; it may create its table (`twinlease arbiter init`).
        a.psql("CREATE ROLE twinlease LOGIN; GRANT CREATE ON SCHEMA public TO twinlease;");
        a
    }

    pub fn psql(&self, sql: &str) -> String {
        let out = run(self.ns.cmd("psql").args([
            "-h",
            ARBITER_IP,
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-Atc",
            sql,
        ]));
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// SIGSTOP / SIGCONT every process of the instance.
    pub fn signal_all(&self, sig: &str) {
        // From outside the namespace: a shell inside it would be one of the pids it stops.
        sh(&format!("ip netns pids {} | xargs -r kill -{sig}", self.ns.name));
    }
}

impl Drop for PgArbiter {
    fn drop(&mut self) {
        self.signal_all("CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("arbiter log:\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
    }
}

pub fn field(line: &str, key: &str) -> Option<u64> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Active intervals [start, end) in CLOCK_MONOTONIC ns, from one node's log. The end is the
/// earliest of: the logged demotion, the last lease end it logged, its death, `now`.
pub fn intervals(log: &str, killed_at: Option<u64>, now: u64) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let mut open: Option<(u64, u64, u64)> = None; // start, until, term
    let close = |o: (u64, u64, u64), end: u64, out: &mut Vec<(u64, u64, u64)>| out.push((o.0, end.min(o.1), o.2));
    for l in log.lines() {
        if l.contains("role change") && l.contains("role=\"active\"") {
            if let Some(o) = open.take() {
                close(o, field(l, "mono_ns").unwrap(), &mut out);
            }
            open = Some((field(l, "mono_ns").unwrap(), field(l, "until_mono_ns").unwrap(), field(l, "term").unwrap()));
        } else if l.contains("lease renewed") {
            if let Some(o) = open.as_mut() {
                o.1 = field(l, "until_mono_ns").unwrap();
            }
        } else if l.contains("role change")
            && l.contains("role=\"standby\"")
            && let Some(o) = open.take()
        {
            close(o, field(l, "mono_ns").unwrap(), &mut out);
        }
    }
    if let Some(o) = open {
        close(o, killed_at.unwrap_or(now).min(now), &mut out);
    }
    out
}

/// Whether the last role change in a box's log is to active.
pub fn logged_active(log: &str) -> bool {
    log.lines().rfind(|l| l.contains("role change")).is_some_and(|l| l.contains("role=\"active\""))
}

/// When the box whose log this is last became active (CLOCK_MONOTONIC ns).
pub fn promoted_at(log: &str) -> Option<u64> {
    log.lines().rfind(|l| l.contains("role change") && l.contains("role=\"active\"")).and_then(|l| field(l, "mono_ns"))
}

/// Asserts that no two of these active intervals (box, start, end, term) overlap; returns them
/// ordered by start. `logs` is shown when they do.
pub fn assert_disjoint(mut all: Vec<(String, u64, u64, u64)>, logs: &str) -> Vec<(String, u64, u64, u64)> {
    all.sort_by_key(|x| x.1);
    for w in all.windows(2) {
        assert!(
            w[0].2 <= w[1].1,
            "active intervals overlap by {} ms: {:?} and {:?}\n{logs}",
            (w[0].2 - w[1].1) / 1_000_000,
            w[0],
            w[1]
        );
    }
    all
}

/// The arbiter's namespace with its bridge; boxes are plugged in with [`ArbiterNet::attach`].
pub struct ArbiterNet {
    pub arb: PgArbiter,
    bridge: String,
}

impl ArbiterNet {
    pub fn new() -> ArbiterNet {
        let ns = Netns::new("a");
        let bridge = format!("br{}", unique(""));
        ns.ip(&format!("link add {bridge} type bridge"));
        ns.ip(&format!("addr add {ARBITER_IP}/24 dev {bridge}"));
        ns.ip(&format!("link set {bridge} up"));
        ArbiterNet { arb: PgArbiter::start(ns), bridge }
    }

    /// Plugs `ns` into the arbiter's bridge as 198.18.10.`host`; returns its interface's name.
    pub fn attach(&self, ns: &Netns, host: u8) -> String {
        let (outer, inner) = (unique("o"), unique("i"));
        run(Command::new("ip").args([
            "link",
            "add",
            &outer,
            "netns",
            &self.arb.ns.name,
            "type",
            "veth",
            "peer",
            "name",
            &inner,
            "netns",
            &ns.name,
        ]));
        self.arb.ns.ip(&format!("link set {outer} master {} up", self.bridge));
        ns.ip(&format!("addr add 198.18.10.{host}/24 dev {inner}"));
        ns.ip(&format!("link set {inner} up"));
        inner
    }

    pub fn url(&self) -> String {
        format!("postgres://twinlease@{ARBITER_IP}:5432/postgres")
    }
}

impl std::ops::Deref for ArbiterNet {
    type Target = PgArbiter;
    fn deref(&self) -> &PgArbiter {
        &self.arb
    }
}
