//! Test hosts as network namespaces, the twinlease daemon as a real process, and real DHCP
//! clients. Every test gets its own namespace and interface names, so tests run in parallel;
//! everything is torn down on drop, also when a test fails. Addresses come from 198.18.0.0/15.
//! Readiness is waited for (sd_notify READY=1, a client's lease file), never slept for.

// Each test binary uses a part of these fixtures, and they are crate-private by nature.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_twinlease");

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A short name unique to this test process and call: fits in IFNAMSIZ with a suffix.
pub fn unique(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{tag}{:x}{n:x}", std::process::id() % 0xfff)
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn sh(script: &str) -> Output {
    run(Command::new("sh").arg("-c").arg(script))
}

/// Polls `f` until it returns Some, or panics after `limit` naming `what`.
pub fn wait_for<T>(what: &str, limit: Duration, f: impl FnMut() -> Option<T>) -> T {
    wait_for_every(what, limit, Duration::from_millis(20), f)
}

/// [`wait_for`], looking every `every` (a look that costs the thing waited for, such as an SSH
/// login on an emulated box, must not come too often).
pub fn wait_for_every<T>(what: &str, limit: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(every);
    }
}

/// A network namespace; deleted (with every process in it) on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = format!("tl-{}", unique(tag));
        run(Command::new("ip").args(["netns", "add", &name]));
        run(Command::new("ip").args(["-n", &name, "link", "set", "lo", "up"]));
        Netns { name }
    }

    /// A command that runs inside the namespace.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    pub fn ip(&self, args: &str) {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args.split_whitespace()));
    }

    pub fn sh(&self, script: &str) -> Output {
        run(self.cmd("sh").arg("-c").arg(script))
    }

    /// Runs `f` on a thread of its own that has entered this namespace: sockets it opens live
    /// in the namespace (and may be used from any thread afterwards).
    pub fn within<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: setns on a descriptor we own; it changes only this thread's namespace.
            assert_eq!(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns {path}");
            f()
        })
        .join()
        .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!("ip netns pids {0} | xargs -r kill -9; ip netns del {0}", self.name))
            .status();
    }
}

/// A server namespace and a relay namespace joined by a veth pair on `net` (e.g. "198.18.4"):
/// the server is `<net>.1`, the relay (perfdhcp with `-l`) `<net>.2`, prefix `/plen`.
pub struct RelayLab {
    pub srv: Netns,
    pub relay: Netns,
    pub relay_if: String,
    pub server_ip: String,
    pub relay_ip: String,
}

impl RelayLab {
    pub fn new(net: &str, plen: u8) -> RelayLab {
        let (srv, relay) = (Netns::new("s"), Netns::new("r"));
        let (a, b) = (unique("a"), unique("b"));
        run(Command::new("ip").args([
            "link",
            "add",
            &a,
            "netns",
            &srv.name,
            "type",
            "veth",
            "peer",
            "name",
            &b,
            "netns",
            &relay.name,
        ]));
        let (server_ip, relay_ip) = (format!("{net}.1"), format!("{net}.2"));
        srv.ip(&format!("addr add {server_ip}/{plen} dev {a}"));
        srv.ip(&format!("link set {a} up"));
        relay.ip(&format!("addr add {relay_ip}/{plen} dev {b}"));
        relay.ip(&format!("link set {b} up"));
        RelayLab { srv, relay, relay_if: b, server_ip, relay_ip }
    }

    /// perfdhcp from the relay: `count` exchanges at `rate`/s with MACs drawn from `macs`.
    pub fn perfdhcp(&self, macs: &Path, rate: u32, count: u32) -> Perf {
        let out = self
            .relay
            .cmd("perfdhcp")
            .args(["-4", "-l", &self.relay_ip, "-r", &rate.to_string(), "-n", &count.to_string(), "-M"])
            .arg(macs)
            .args(["-p", "60", &self.server_ip])
            .output()
            .unwrap();
        parse_perfdhcp(&String::from_utf8_lossy(&out.stdout))
    }
}

/// A small tmpfs mounted at `dir` for one test; unmounted on drop.
pub struct SmallDisk {
    pub dir: PathBuf,
}

impl SmallDisk {
    pub fn mount(dir: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(dir).unwrap();
        run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(dir));
        SmallDisk { dir: dir.to_path_buf() }
    }

    /// A tmpfs at `<parent>/disk`.
    pub fn new(parent: &Path, size: &str) -> SmallDisk {
        Self::mount(&parent.join("disk"), size)
    }

    /// Fills the filesystem to the last byte.
    pub fn fill(&self) {
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=4k"])
            .arg(format!("of={}", self.dir.join("filler").display()))
            .stderr(Stdio::null())
            .status();
    }

    pub fn unfill(&self) {
        std::fs::remove_file(self.dir.join("filler")).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// A LAN switch: a bridge in a namespace of its own, and client hosts plugged into it by veth
/// pairs. Both test LANs use it: [`Lan`] (a server on the bridge itself) and `pair::Pair` (two
/// boxes plugged in like the clients).
pub struct Switch {
    pub ns: Netns,
    pub bridge: String,
    pub clients: Vec<(Netns, String)>,
    id: String,
}

impl Switch {
    pub fn new(tag: &str) -> Switch {
        let ns = Netns::new(tag);
        let id = unique("");
        let bridge = format!("br{id}");
        ns.ip(&format!("link add {bridge} type bridge"));
        ns.ip(&format!("link set {bridge} up"));
        Switch { ns, bridge, clients: Vec::new(), id }
    }

    /// Adds a client host; returns its index. Its interface is named `c<id><n>`.
    pub fn add_client(&mut self) -> usize {
        let n = self.clients.len();
        let host = Netns::new("c");
        let inner = format!("c{}{n}", self.id);
        self.plug(&host, &inner, &format!("p{}{n}", self.id));
        host.ip(&format!("link set {inner} up"));
        self.clients.push((host, inner));
        n
    }

    /// Plugs `host` into the bridge: a veth pair, `inner` in the host, `outer` on the bridge.
    pub fn plug(&self, host: &Netns, inner: &str, outer: &str) {
        run(Command::new("ip").args([
            "link",
            "add",
            outer,
            "netns",
            &self.ns.name,
            "type",
            "veth",
            "peer",
            "name",
            inner,
            "netns",
            &host.name,
        ]));
        self.ns.ip(&format!("link set {outer} master {} up", self.bridge));
    }

    pub fn client(&self, n: usize) -> (&Netns, &str) {
        let (ns, i) = &self.clients[n];
        (ns, i.as_str())
    }

    pub fn set_mac(&self, n: usize, mac: &str) {
        let (ns, i) = self.client(n);
        ns.ip(&format!("link set {i} address {mac}"));
    }

    pub fn mac(&self, n: usize) -> String {
        let (ns, i) = self.client(n);
        let out = run(ns.cmd("cat").arg(format!("/sys/class/net/{i}/address")));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// A LAN with the server on the switch: the bridge is the served interface and carries the
/// server's address; the server runs in the switch's namespace (`lan.ns`).
pub struct Lan {
    pub sw: Switch,
    pub server_ip: Ipv4Addr,
}

impl Lan {
    /// `server_cidr` like "198.18.0.1/24".
    pub fn new(server_cidr: &str) -> Lan {
        let sw = Switch::new("s");
        sw.ns.ip(&format!("addr add {server_cidr} dev {}", sw.bridge));
        let server_ip = server_cidr.split('/').next().unwrap().parse().unwrap();
        Lan { sw, server_ip }
    }
}

impl std::ops::Deref for Lan {
    type Target = Switch;
    fn deref(&self) -> &Switch {
        &self.sw
    }
}

impl std::ops::DerefMut for Lan {
    fn deref_mut(&mut self) -> &mut Switch {
        &mut self.sw
    }
}

/// A twinlease process in a namespace, started with a NOTIFY_SOCKET the test owns (built by
/// [`Server::builder`]). Every notification it sends is kept with its arrival time. Killed on
/// drop.
pub struct Server {
    pub child: Child,
    pub dir: PathBuf,
    pub config: PathBuf,
    /// Holds its status.sock and control.sock.
    pub runtime_dir: PathBuf,
    pub ns: String,
    notify: UnixDatagram,
    pub log: PathBuf,
    /// (arrival, message) for every notification received so far.
    pub got: Vec<(Instant, String)>,
}

/// A config file's text for a LAN test: `[node]` with the state dir under `dir`, then `body`.
pub fn config_text(dir: &Path, body: &str) -> String {
    format!("[node]\nname = \"test\"\nstate_dir = \"{}\"\n{body}", dir.join("state").display())
}

/// How to start a test box: the one way every integration test starts `twinlease run`.
pub struct ServerBuilder<'a> {
    ns: &'a Netns,
    dir: PathBuf,
    config: Option<PathBuf>,
    pin: Option<String>,
    prefix: Vec<String>,
    env: Vec<(String, Option<String>)>,
}

impl<'a> ServerBuilder<'a> {
    /// Writes `text` to `<dir>/twinlease.toml` and uses it.
    pub fn config_text(mut self, text: &str) -> Self {
        let path = self.dir.join("twinlease.toml");
        std::fs::write(&path, text).unwrap();
        self.config = Some(path);
        self
    }

    pub fn config(mut self, path: &Path) -> Self {
        self.config = Some(path.to_path_buf());
        self
    }

    /// `--pin-role`: "standby" or "active:TERM", instead of the election.
    pub fn pin(mut self, role: &str) -> Self {
        self.pin = Some(role.to_string());
        self
    }

    /// Runs `prefix... BIN run ...` (the prefix may drop privileges or change mounts; it must
    /// exec, so the child's pid is the daemon's).
    pub fn prefix(mut self, prefix: &[&str]) -> Self {
        self.prefix = prefix.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), Some(value.to_string())));
        self
    }

    pub fn unset(mut self, key: &str) -> Self {
        self.env.push((key.to_string(), None));
        self
    }

    /// `WatchdogSec=` as systemd passes it.
    pub fn watchdog(self, usec: &str) -> Self {
        self.env("WATCHDOG_USEC", usec)
    }

    /// Starts the daemon without waiting for anything.
    pub fn spawn(self) -> Server {
        let config = self.config.expect("a config: config_text() or config()");
        let sock_path = self.dir.join(format!("notify-{}.sock", unique("")));
        let _ = std::fs::remove_file(&sock_path);
        let notify = UnixDatagram::bind(&sock_path).unwrap();
        // The daemon may run as another user: it needs write permission on the socket.
        std::fs::set_permissions(&sock_path, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        notify.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let log = self.dir.join("server.log");
        let logf = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut cmd = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = self.ns.cmd(first);
                c.args(rest).arg(BIN);
                c
            }
            None => self.ns.cmd(BIN),
        };
        cmd.arg("run");
        if let Some(role) = &self.pin {
            cmd.args(["--pin-role", role]);
        }
        // Every test box has sockets of its own, in a directory the daemon may use whatever user
        // it runs as.
        let runtime_dir = self.dir.join(format!("run-{}", unique("")));
        std::fs::create_dir_all(&runtime_dir).unwrap();
        std::fs::set_permissions(&runtime_dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        cmd.arg("--runtime-dir").arg(&runtime_dir);
        cmd.arg("--config").arg(&config).env("NOTIFY_SOCKET", &sock_path).env("TWINLEASE_LOG_STDERR", "1");
        cmd.env("RUST_LOG", std::env::var("TEST_RUST_LOG").unwrap_or_else(|_| "info".into()));
        cmd.env_remove("WATCHDOG_USEC").env_remove("WATCHDOG_PID").stdout(Stdio::null()).stderr(logf);
        for (k, v) in &self.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        let child = cmd.spawn().unwrap();
        Server { child, dir: self.dir, config, runtime_dir, ns: self.ns.name.clone(), notify, log, got: Vec::new() }
    }

    /// Starts the daemon and waits for READY=1.
    pub fn start(self) -> Server {
        let mut s = self.spawn();
        s.wait_notify("READY=1", Duration::from_secs(20));
        s
    }
}

impl Server {
    pub fn builder<'a>(ns: &'a Netns, dir: &Path) -> ServerBuilder<'a> {
        ServerBuilder { ns, dir: dir.to_path_buf(), config: None, pin: None, prefix: Vec::new(), env: Vec::new() }
    }

    /// `builder(ns, dir).config_text(config).start()`, the common case.
    pub fn start(ns: &Netns, dir: &Path, config: &str) -> Server {
        Self::builder(ns, dir).config_text(config).start()
    }

    /// Receives notifications until `deadline` or until `stop` holds for one (then `true`).
    pub fn collect_until(&mut self, deadline: Instant, mut stop: impl FnMut(&str) -> bool) -> bool {
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            if let Ok(n) = self.notify.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]).to_string();
                self.got.push((Instant::now(), msg.clone()));
                if stop(&msg) {
                    return true;
                }
            }
        }
        false
    }

    /// Waits for a notify message containing `what`; returns the message.
    pub fn wait_notify(&mut self, what: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("twinlease exited ({status}) before {what}:\n{}", self.log_text());
            }
            let step = (Instant::now() + Duration::from_millis(200)).min(deadline);
            if self.collect_until(step, |m| m.contains(what)) {
                return self.got.last().unwrap().1.clone();
            }
            assert!(Instant::now() < deadline, "no {what} from twinlease within {limit:?}:\n{}", self.log_text());
        }
    }

    /// Waits for a STATUS= line for which `want` holds; returns it.
    pub fn wait_status(&mut self, limit: Duration, want: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let left = limit.saturating_sub(start.elapsed());
            let msg = self.wait_notify("STATUS=", left.max(Duration::from_millis(1)));
            if let Some(status) = msg.lines().find_map(|l| l.strip_prefix("STATUS="))
                && want(status)
            {
                return status.to_string();
            }
        }
    }

    /// Arrival times of WATCHDOG=1 pings at or after `from`.
    pub fn pings_since(&self, from: Instant) -> Vec<Instant> {
        self.got.iter().filter(|(t, m)| *t >= from && m.lines().any(|l| l == "WATCHDOG=1")).map(|(t, _)| *t).collect()
    }

    pub fn signal(&self, sig: &str) {
        run(Command::new("kill").arg(format!("-{sig}")).arg(self.child.id().to_string()));
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        // `ip netns exec` execs the program, so the child pid is twinlease itself.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit, as long as the unit's TimeoutStopSec= allows.
    pub fn stop(&mut self) {
        let _ = nix_kill(self.child.id(), "TERM");
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > Duration::from_secs(20) {
                // Where each thread waits, for the report.
                let pid = self.child.id().to_string();
                let stacks = Command::new("gdb").args(["-batch", "-p", &pid, "-ex", "thread apply all bt 12"]).output();
                let stacks = stacks.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
                panic!("twinlease still runs 20 s after SIGTERM:\n{}\n{stacks}", self.log_text());
            }
            // Read the notifications meanwhile, as systemd does: a test that has not read them for
            // a minute leaves the socket's queue full, and the daemon's status reporter then blocks
            // in its send and holds up the stop (seen under gdb).
            self.collect_until(Instant::now() + Duration::from_millis(20), |_| false);
        };
        assert!(status.success(), "twinlease did not stop cleanly: {status}\n{}", self.log_text());
    }

    pub fn leases(&self) -> Vec<serde_json::Value> {
        leases(&self.config)
    }

    /// Sends `command` on the status socket (or, `act`, the control socket); the answer.
    pub fn ask(
        &self,
        command: &str,
        arguments: serde_json::Value,
        act: bool,
    ) -> twinlease::server::control::protocol::Response {
        use twinlease::server::control::{client, protocol::Request};
        let serde_json::Value::Object(args) = arguments else { panic!("arguments are an object") };
        let socket = self.runtime_dir.join(if act { "control.sock" } else { "status.sock" });
        client::ask(&socket, &Request::new(command, args))
            .unwrap_or_else(|e| panic!("{command}: {e}\n{}", self.log_text()))
    }

    /// The box's status (status-get).
    pub fn status(&self) -> twinlease::server::control::Status {
        let r = self.ask("status-get", serde_json::json!({}), false);
        assert_eq!(r.result, 0, "{}", r.text);
        serde_json::from_value(r.arguments.unwrap()).unwrap()
    }

    /// The partner part of the status (a box with `[peer]`).
    pub fn partner(&self) -> twinlease::server::control::status::PartnerStatus {
        self.status().partner.expect("a box with a [peer] section")
    }

    /// Waits until `f` holds for the partner part of the box's status.
    pub fn wait_partner(
        &self,
        what: &str,
        limit: Duration,
        f: impl Fn(&twinlease::server::control::status::PartnerStatus) -> bool,
    ) {
        wait_for(what, limit, || f(&self.partner()).then_some(()));
    }

    /// Whether the box holds the active role, by its status.
    pub fn is_active(&self) -> bool {
        self.status().role.state == "active"
    }

    /// Waits until `f` holds for the box's status; returns that status.
    pub fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        f: impl Fn(&twinlease::server::control::Status) -> bool,
    ) -> twinlease::server::control::Status {
        wait_for(what, limit, || Some(self.status()).filter(|s| f(s)))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nix_kill(pid: u32, sig: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status()
}

/// `twinlease leases --json --all` for a config (read-only, works while the daemon runs).
pub fn leases(config: &Path) -> Vec<serde_json::Value> {
    let out = run(Command::new(BIN).args(["leases", "--all", "--json", "--config"]).arg(config));
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn lease_of<'a>(rows: &'a [serde_json::Value], addr: &str) -> Option<&'a serde_json::Value> {
    rows.iter().find(|r| r["address"] == addr)
}

// ---- real DHCP clients ---------------------------------------------------------------------

/// What a client reported through its hook script.
#[derive(Debug, Clone)]
pub struct ClientEvent {
    pub reason: String,
    pub ip: String,
    pub fields: Vec<(String, String)>,
}

impl ClientEvent {
    pub fn get(&self, k: &str) -> Option<&str> {
        self.fields.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
    }
}

/// Reads `reason=.. ip=.. k=v ..` lines a hook script appended to `file`.
pub fn events(file: &Path) -> Vec<ClientEvent> {
    let Ok(f) = std::fs::File::open(file) else { return vec![] };
    BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .map(|l| {
            let fields: Vec<(String, String)> = l
                .split('\t')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let get = |k: &str| fields.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone()).unwrap_or_default();
            ClientEvent { reason: get("reason"), ip: get("ip"), fields }
        })
        .collect()
}

/// Waits until `file` has an event whose reason is in `reasons` beyond the first `skip` events.
pub fn wait_event(file: &Path, reasons: &[&str], skip: usize, limit: Duration) -> ClientEvent {
    wait_event_or(file, reasons, skip, limit, String::new)
}

/// [`wait_event`], adding `context()` (the servers' logs, say) to the message if it times out.
pub fn wait_event_or(
    file: &Path,
    reasons: &[&str],
    skip: usize,
    limit: Duration,
    context: impl Fn() -> String,
) -> ClientEvent {
    let log = file.with_extension("log");
    let what = || {
        format!(
            "client event {reasons:?} in {}\nevents so far:\n{}\nclient log:\n{}",
            file.display(),
            std::fs::read_to_string(file).unwrap_or_default(),
            std::fs::read_to_string(&log).unwrap_or_default(),
        ) + &context()
    };
    let start = Instant::now();
    loop {
        if let Some(e) = events(file).into_iter().skip(skip).find(|e| reasons.contains(&e.reason.as_str())) {
            return e;
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {}", what());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn write_script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// ISC dhclient in the foreground (-d), hook script records events and configures the address.
pub fn dhclient(ns: &Netns, iface: &str, dir: &Path, extra: &[&str]) -> (Child, PathBuf) {
    let ev = dir.join(format!("dhclient-{iface}.events"));
    let script = dir.join(format!("dhclient-{iface}.sh"));
    write_script(
        &script,
        &format!(
            "printf 'reason=%s\\tip=%s\\tmask=%s\\trouters=%s\\tdns=%s\\tdomain=%s\\tlease=%s\\tserver=%s\\n' \"$reason\" \"$new_ip_address\" \"$new_subnet_mask\" \"$new_routers\" \"$new_domain_name_servers\" \"$new_domain_name\" \"$new_dhcp_lease_time\" \"$new_dhcp_server_identifier\" >> {ev}\n\
             case \"$reason\" in BOUND|RENEW|REBIND|REBOOT) ip addr flush dev $interface; ip addr add $new_ip_address/$new_subnet_mask dev $interface ;; EXPIRE|FAIL|RELEASE|STOP) ip addr flush dev $interface ;; esac\n",
            ev = ev.display()
        ),
    );
    let child = ns
        .cmd("dhclient")
        .args(["-d", "-v", "-sf"])
        .arg(&script)
        .arg("-lf")
        .arg(dir.join(format!("dhclient-{iface}.leases")))
        .arg("-pf")
        .arg(dir.join(format!("dhclient-{iface}.pid")))
        .args(extra)
        .arg(iface)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("dhclient-{iface}.log"))).unwrap())
        .spawn()
        .unwrap();
    (child, ev)
}

/// Runs dhclient once more in release mode (-r) with the same lease file.
pub fn dhclient_release(ns: &Netns, iface: &str, dir: &Path) {
    let script = dir.join(format!("dhclient-{iface}.sh"));
    run(ns
        .cmd("dhclient")
        .args(["-r", "-sf"])
        .arg(&script)
        .arg("-lf")
        .arg(dir.join(format!("dhclient-{iface}.leases")))
        .arg("-pf")
        .arg(dir.join(format!("dhclient-{iface}-r.pid")))
        .arg(iface));
}

/// busybox udhcpc until it has a lease (-q), with a hook script recording events.
pub fn udhcpc_once(ns: &Netns, iface: &str, dir: &Path, extra: &[&str]) -> (Output, PathBuf) {
    let ev = dir.join(format!("udhcpc-{iface}.events"));
    let script = dir.join(format!("udhcpc-{iface}.sh"));
    write_script(
        &script,
        &format!(
            "printf 'reason=%s\\tip=%s\\tmask=%s\\trouters=%s\\tdns=%s\\tdomain=%s\\tlease=%s\\tserver=%s\\n' \"$1\" \"$ip\" \"$mask\" \"$router\" \"$dns\" \"$domain\" \"$lease\" \"$serverid\" >> {ev}\n\
             case \"$1\" in bound|renew) ip addr flush dev $interface; ip addr add $ip/$mask dev $interface ;; esac\n",
            ev = ev.display()
        ),
    );
    let out = ns
        .cmd("udhcpc")
        .args(["-f", "-q", "-n", "-t", "5", "-T", "2", "-i", iface, "-s"])
        .arg(&script)
        .args(extra)
        .output()
        .unwrap();
    (out, ev)
}

/// dhcpcd in oneshot mode (-1), IPv4 only, our hook script instead of the system's.
pub fn dhcpcd_once(ns: &Netns, iface: &str, dir: &Path, extra: &[&str]) -> (Output, PathBuf) {
    let ev = dir.join(format!("dhcpcd-{iface}.events"));
    let script = dir.join(format!("dhcpcd-{iface}.sh"));
    write_script(
        &script,
        &format!(
            "printf 'reason=%s\\tip=%s\\tlease=%s\\n' \"$reason\" \"$new_ip_address\" \"$new_dhcp_lease_time\" >> {}\n",
            ev.display()
        ),
    );
    // dhcpcd keeps leases per interface name in /var/lib/dhcpcd; names can repeat across runs,
    // and an old lease would turn a fresh DORA into an INIT-REBOOT.
    let forget = || sh(&format!("rm -f /var/lib/dhcpcd/{iface}.lease /var/lib/dhcpcd/{iface}-*.lease"));
    // Two dhcpcd processes at once (parallel tests) share dhcpcd's run and state directories
    // and miss their BOUND: one at a time within a test binary.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    forget();
    let out = ns
        .cmd("dhcpcd")
        .args(["-4", "-1", "-B", "-f", "/dev/null", "--noipv4ll", "-t", "20", "-c"])
        .arg(&script)
        .args(extra)
        .arg(iface)
        .output()
        .unwrap();
    forget();
    (out, ev)
}

/// perfdhcp's summary: (sent, received) per exchange.
#[derive(Debug, Default)]
pub struct Perf {
    pub discover_sent: u64,
    pub offers: u64,
    pub requests_sent: u64,
    pub acks: u64,
    pub text: String,
}

pub fn parse_perfdhcp(text: &str) -> Perf {
    let mut p = Perf { text: text.to_string(), ..Perf::default() };
    let mut section = "";
    for line in text.lines() {
        if line.contains("DISCOVER-OFFER") {
            section = "do";
        } else if line.contains("REQUEST-ACK") {
            section = "ra";
        }
        let num = |l: &str| l.split(':').nth(1).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
        match (section, line.split(':').next().unwrap_or("").trim()) {
            ("do", "sent packets") => p.discover_sent = num(line),
            ("do", "received packets") => p.offers = num(line),
            ("ra", "sent packets") => p.requests_sent = num(line),
            ("ra", "received packets") => p.acks = num(line),
            _ => {}
        }
    }
    p
}

/// `count` random locally administered MACs, one per line, for perfdhcp -M.
pub fn mac_file(dir: &Path, count: usize, seed: u32) -> PathBuf {
    let path = dir.join(format!("macs-{seed}.txt"));
    let mut x = seed.wrapping_mul(2654435761).max(1);
    let mut text = String::new();
    for _ in 0..count {
        let mut b = [0u8; 5];
        for v in &mut b {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *v = x as u8;
        }
        text.push_str(&format!("02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}\n", b[0], b[1], b[2], b[3], b[4]));
    }
    std::fs::write(&path, text).unwrap();
    path
}

// ---- packet capture ------------------------------------------------------------------------

/// DHCP replies (message type, chaddr, yiaddr) found in a pcap file written by tcpdump -w.
pub fn pcap_replies(path: &Path) -> Vec<(u8, [u8; 6], Ipv4Addr)> {
    pcap_replies_at(path).into_iter().map(|r| (r.kind, r.chaddr, r.yiaddr)).collect()
}

/// A DHCP reply seen on the wire, with the capture's (wall-clock) time stamp.
#[derive(Debug, Clone)]
pub struct WireReply {
    pub at: std::time::SystemTime,
    pub kind: u8,
    pub chaddr: [u8; 6],
    pub yiaddr: Ipv4Addr,
    pub src: Ipv4Addr,
    /// Option 51, the lease time granted (ACKs and OFFERs).
    pub lease_secs: Option<u32>,
}

pub fn pcap_replies_at(path: &Path) -> Vec<WireReply> {
    let data = std::fs::read(path).unwrap_or_default();
    let mut out = Vec::new();
    if data.len() < 24 {
        return out;
    }
    let le = data[0..4] == [0xd4, 0xc3, 0xb2, 0xa1];
    let linktype = if le {
        u32::from_le_bytes(data[20..24].try_into().unwrap())
    } else {
        u32::from_be_bytes(data[20..24].try_into().unwrap())
    };
    let mut off = 24;
    while off + 16 <= data.len() {
        let word = |at: usize| {
            if le {
                u32::from_le_bytes(data[at..at + 4].try_into().unwrap())
            } else {
                u32::from_be_bytes(data[at..at + 4].try_into().unwrap())
            }
        };
        let at =
            std::time::UNIX_EPOCH + Duration::from_secs(word(off).into()) + Duration::from_micros(word(off + 4).into());
        let incl = word(off + 8) as usize;
        let start = off + 16;
        let end = (start + incl).min(data.len());
        off = start + incl;
        let frame = &data[start..end];
        // Ethernet (1) or Linux cooked v1 (113).
        let ip = match linktype {
            1 if frame.len() > 14 && frame[12..14] == [8, 0] => &frame[14..],
            113 if frame.len() > 16 && frame[14..16] == [8, 0] => &frame[16..],
            _ => continue,
        };
        if ip.len() < 28 || ip[9] != 17 {
            continue;
        }
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let Some(udp) = ip.get(ihl..) else { continue };
        if udp.len() < 8 + 240 {
            continue;
        }
        let dhcp = &udp[8..];
        if dhcp[0] != 2 {
            continue; // replies only
        }
        let yiaddr = Ipv4Addr::new(dhcp[16], dhcp[17], dhcp[18], dhcp[19]);
        let chaddr: [u8; 6] = dhcp[28..34].try_into().unwrap();
        // Find option 53.
        let mut o = &dhcp[240..];
        let mut kind = 0;
        let mut lease_secs = None;
        while let [c, rest @ ..] = o {
            match *c {
                0 => o = rest,
                255 => break,
                code => {
                    let Some(&len) = rest.first() else { break };
                    let len = usize::from(len);
                    if rest.len() < 1 + len {
                        break;
                    }
                    if code == 53 && len == 1 {
                        kind = rest[1];
                    }
                    if code == 51 && len == 4 {
                        lease_secs = Some(u32::from_be_bytes(rest[1..5].try_into().unwrap()));
                    }
                    o = &rest[1 + len..];
                }
            }
        }
        let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
        out.push(WireReply { at, kind, chaddr, yiaddr, src, lease_secs });
    }
    out
}

pub fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}
pub mod arbiter;
pub mod bundle;
pub mod client;
pub mod fake_box;
pub mod image_pair;
pub mod pair;
pub mod site;
pub mod tmux;
pub mod vm;

/// tcpdump writing DHCP replies (UDP from port 67) seen on one interface to a pcap file;
/// `start` returns once tcpdump says it is listening. Immediate mode: without it, packets wait
/// in the kernel's capture buffer for up to a second, and those still waiting when the capture
/// stops are lost.
pub struct Capture {
    child: Child,
    pub path: PathBuf,
}

impl Capture {
    pub fn start(ns: &Netns, iface: &str, path: &Path) -> Capture {
        let mut child = ns
            .cmd("tcpdump")
            .args(["-i", iface, "-U", "--immediate-mode", "-n", "-w"])
            .arg(path)
            .args(["udp", "and", "src", "port", "67"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while err.read_line(&mut line).unwrap() > 0 && !line.contains("listening on") {
            line.clear();
        }
        Capture { child, path: path.to_path_buf() }
    }

    pub fn replies(&self) -> Vec<WireReply> {
        pcap_replies_at(&self.path)
    }

    /// Stops tcpdump (SIGINT flushes what it holds) and returns every reply it wrote.
    pub fn stop(mut self) -> Vec<WireReply> {
        let _ = nix_kill(self.child.id(), "INT");
        let _ = self.child.wait();
        self.replies()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
