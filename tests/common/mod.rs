//! Test hosts as network namespaces, the twinlease daemon as a real process, and real DHCP
//! clients. Every test gets its own namespace and interface names, so tests run in parallel;
//! everything is torn down on drop, also when a test fails. Addresses come from 198.18.0.0/15.
//! Readiness is waited for (sd_notify READY=1, a client's lease file), never slept for.

#![allow(dead_code)]

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
    assert!(out.status.success(), "{cmd:?} failed: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    out
}

pub fn sh(script: &str) -> Output {
    run(Command::new("sh").arg("-c").arg(script))
}

/// Polls `f` until it returns Some, or panics after `limit` naming `what`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
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
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("sh").arg("-c").arg(format!("ip netns pids {0} | xargs -r kill -9; ip netns del {0}", self.name)).status();
    }
}

/// A LAN: a server namespace holding a bridge (the served interface, with the server's address)
/// and any number of client namespaces attached to it by veth pairs.
pub struct Lan {
    pub srv: Netns,
    pub bridge: String,
    pub server_ip: Ipv4Addr,
    pub clients: Vec<(Netns, String)>,
    id: String,
}

impl Lan {
    /// `server_cidr` like "198.18.0.1/24".
    pub fn new(server_cidr: &str) -> Lan {
        let srv = Netns::new("s");
        let id = unique("");
        let bridge = format!("br{id}");
        srv.ip(&format!("link add {bridge} type bridge"));
        srv.ip(&format!("addr add {server_cidr} dev {bridge}"));
        srv.ip(&format!("link set {bridge} up"));
        let server_ip = server_cidr.split('/').next().unwrap().parse().unwrap();
        Lan { srv, bridge, server_ip, clients: Vec::new(), id }
    }

    /// Adds a client host; returns its index. Its interface is named `c<id><n>`.
    pub fn add_client(&mut self) -> usize {
        let n = self.clients.len();
        self.clients.push(attach_host(&self.srv, &self.bridge, &self.id, n));
        n
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

/// A new host namespace plugged into `bridge` (which lives in `switch`) by a veth pair; its end
/// is named `c<id><n>`, the bridge's end `p<id><n>`.
pub fn attach_host(switch: &Netns, bridge: &str, id: &str, n: usize) -> (Netns, String) {
    let ns = Netns::new("c");
    let inner = format!("c{id}{n}");
    let outer = format!("p{id}{n}");
    run(Command::new("ip").args(["link", "add", &outer, "netns", &switch.name, "type", "veth", "peer", "name", &inner, "netns", &ns.name]));
    switch.ip(&format!("link set {outer} master {bridge} up"));
    ns.ip(&format!("link set {inner} up"));
    (ns, inner)
}

/// A twinlease process in a namespace, started with a NOTIFY_SOCKET the test owns.
pub struct Server {
    pub child: Child,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub ns: String,
    notify: UnixDatagram,
    pub log: PathBuf,
}

/// A config file's text for a LAN test: `[node]` with the state dir under `dir`, then `body`.
pub fn config_text(dir: &Path, body: &str) -> String {
    format!("[node]\nname = \"test\"\nstate_dir = \"{}\"\n{body}", dir.join("state").display())
}

impl Server {
    /// Writes `config` to `dir`, starts the daemon in `ns` and waits for READY=1.
    pub fn start(ns: &Netns, dir: &Path, config: &str) -> Server {
        let path = dir.join("twinlease.toml");
        std::fs::write(&path, config).unwrap();
        Self::start_with(ns, dir, &path, &[])
    }

    pub fn start_with(ns: &Netns, dir: &Path, config: &Path, env: &[(&str, &str)]) -> Server {
        let sock_path = dir.join(format!("notify-{}.sock", unique("")));
        let _ = std::fs::remove_file(&sock_path);
        let notify = UnixDatagram::bind(&sock_path).unwrap();
        notify.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let log = dir.join("server.log");
        let logf = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut cmd = ns.cmd(BIN);
        cmd.args(["run", "--config"]).arg(config).env("NOTIFY_SOCKET", &sock_path).env("TWINLEASE_LOG_STDERR", "1").env("RUST_LOG", std::env::var("TEST_RUST_LOG").unwrap_or_else(|_| "info".into())).stdout(Stdio::null()).stderr(logf);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let mut s = Server { child, dir: dir.to_path_buf(), config: config.to_path_buf(), ns: ns.name.clone(), notify, log };
        s.wait_notify("READY=1", Duration::from_secs(20));
        s
    }

    /// Waits for a notify message containing `what`; returns the message.
    pub fn wait_notify(&mut self, what: &str, limit: Duration) -> String {
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("twinlease exited ({status}) before {what}:\n{}", self.log_text());
            }
            if let Ok(n) = self.notify.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]).to_string();
                if msg.contains(what) {
                    return msg;
                }
            }
            assert!(start.elapsed() < limit, "no {what} from twinlease within {limit:?}:\n{}", self.log_text());
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        // `ip netns exec` execs the program, so the child pid is twinlease itself.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) {
        let _ = nix_kill(self.child.id(), "TERM");
        let status = wait_for("twinlease to exit after SIGTERM", Duration::from_secs(10), || self.child.try_wait().unwrap());
        assert!(status.success(), "twinlease did not stop cleanly: {status}\n{}", self.log_text());
    }

    pub fn leases(&self) -> Vec<serde_json::Value> {
        leases(&self.config)
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
            let fields: Vec<(String, String)> = l.split('\t').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let get = |k: &str| fields.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone()).unwrap_or_default();
            ClientEvent { reason: get("reason"), ip: get("ip"), fields }
        })
        .collect()
}

/// Waits until `file` has an event whose reason is in `reasons` beyond the first `skip` events.
pub fn wait_event(file: &Path, reasons: &[&str], skip: usize, limit: Duration) -> ClientEvent {
    let log = file.with_extension("log");
    let what = || {
        format!(
            "client event {reasons:?} in {}\nevents so far:\n{}\nclient log:\n{}",
            file.display(),
            std::fs::read_to_string(file).unwrap_or_default(),
            std::fs::read_to_string(&log).unwrap_or_default()
        )
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
    run(ns.cmd("dhclient").args(["-r", "-sf"]).arg(&script).arg("-lf").arg(dir.join(format!("dhclient-{iface}.leases"))).arg("-pf").arg(dir.join(format!("dhclient-{iface}-r.pid"))).arg(iface));
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
    let out = ns.cmd("udhcpc").args(["-f", "-q", "-n", "-t", "5", "-T", "2", "-i", iface, "-s"]).arg(&script).args(extra).output().unwrap();
    (out, ev)
}

/// dhcpcd in oneshot mode (-1), IPv4 only, our hook script instead of the system's.
pub fn dhcpcd_once(ns: &Netns, iface: &str, dir: &Path, extra: &[&str]) -> (Output, PathBuf) {
    let ev = dir.join(format!("dhcpcd-{iface}.events"));
    let script = dir.join(format!("dhcpcd-{iface}.sh"));
    write_script(&script, &format!("printf 'reason=%s\\tip=%s\\tlease=%s\\n' \"$reason\" \"$new_ip_address\" \"$new_dhcp_lease_time\" >> {}\n", ev.display()));
    // dhcpcd keeps leases per interface name in /var/lib/dhcpcd; names can repeat across runs,
    // and an old lease would turn a fresh DORA into an INIT-REBOOT.
    let forget = || sh(&format!("rm -f /var/lib/dhcpcd/{iface}.lease /var/lib/dhcpcd/{iface}-*.lease"));
    // Two dhcpcd processes at once (parallel tests) share dhcpcd's run and state directories
    // and miss their BOUND: one at a time within a test binary.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    forget();
    let out = ns.cmd("dhcpcd").args(["-4", "-1", "-B", "-f", "/dev/null", "--noipv4ll", "-t", "20", "-c"]).arg(&script).args(extra).arg(iface).output().unwrap();
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
}

pub fn pcap_replies_at(path: &Path) -> Vec<WireReply> {
    let data = std::fs::read(path).unwrap_or_default();
    let mut out = Vec::new();
    if data.len() < 24 {
        return out;
    }
    let le = data[0..4] == [0xd4, 0xc3, 0xb2, 0xa1];
    let linktype = if le { u32::from_le_bytes(data[20..24].try_into().unwrap()) } else { u32::from_be_bytes(data[20..24].try_into().unwrap()) };
    let mut off = 24;
    while off + 16 <= data.len() {
        let word = |at: usize| if le { u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) } else { u32::from_be_bytes(data[at..at + 4].try_into().unwrap()) };
        let at = std::time::UNIX_EPOCH + Duration::from_secs(word(off).into()) + Duration::from_micros(word(off + 4).into());
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
                    o = &rest[1 + len..];
                }
            }
        }
        out.push(WireReply { at, kind, chaddr, yiaddr, src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]) });
    }
    out
}

pub fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}
pub mod arbiter;
pub mod pair;

/// tcpdump writing DHCP replies (UDP from port 67) seen on one interface to a pcap file;
/// `start` returns once tcpdump says it is listening.
pub struct Capture {
    child: Child,
    pub path: PathBuf,
}

impl Capture {
    pub fn start(ns: &Netns, iface: &str, path: &Path) -> Capture {
        let mut child = ns.cmd("tcpdump").args(["-i", iface, "-U", "-n", "-w"]).arg(path).args(["udp", "and", "src", "port", "67"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
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
