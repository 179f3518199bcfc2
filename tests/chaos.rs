//! The chaos soak: a pair of boxes with a throwaway PostgreSQL arbiter, a peer link and a client
//! LAN (namespaces), perfdhcp at 500 exchanges/s and two renewing dhclients, and a seeded random
//! schedule of faults, one to three at once: kill -9 of either box (restarted), a box restarted on
//! an empty disk, SIGSTOP/SIGCONT, the peer link cut, a box's arbiter link cut, the arbiter
//! stopped (SIGSTOP), a box's state directory (a small tmpfs) full. An observer captures every
//! server reply on the boxes' LAN switch ports. Over the whole run: no two servers reply in one
//! instant, no address is ACKed to two clients with overlapping lease times, every lease a box
//! ACKed before it was killed is on the survivor (before-ack), both tables are equal after the
//! final heal, and no process or namespace is left behind.
//!
//! `CHAOS_CYCLES` (default 20; `make chaos` runs 200) and `CHAOS_SEED` (default fixed, so that
//! `make test` is repeatable; `make chaos` draws one) choose the run.
//!
//! `ack_timeout_ms` is 10 s (the most `check-config` allows), longer than any fault here lasts
//! with its recovery: a DHCPACK then always waits for the partner unless the partner is
//! unreachable or behind, which the kill check below takes into account.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime};

use common::arbiter::*;
use common::pair::*;
use common::*;

const I_MS: u64 = 500;
const T_MS: u64 = 2000;
const POOL: &str = "198.18.0.20-198.18.0.250";
/// perfdhcp's clients: fewer than the pool holds, so no address ever has to change hands.
const MACS: usize = 200;
const LEASE_SECS: u32 = 120;
const RATE: u32 = 500;
/// Replies from the two boxes closer together than this are "one instant": the election keeps
/// at least I between the old active's lease end and the new one's start.
const SAME_INSTANT: Duration = Duration::from_millis(I_MS / 2);
/// How long the pair may take to have one active box with its partner in sync after a heal.
const SETTLE: Duration = Duration::from_secs(90);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Kill(usize),
    /// Killed, and restarted on an empty state directory (a reflash).
    Reflash(usize),
    Stop(usize),
    PeerCut,
    ArbiterCut(usize),
    ArbiterStop,
    DiskFull(usize),
}

impl Fault {
    fn kind(self) -> &'static str {
        match self {
            Fault::Kill(_) => "kill -9",
            Fault::Reflash(_) => "restart on an empty disk",
            Fault::Stop(_) => "SIGSTOP/SIGCONT",
            Fault::PeerCut => "peer link cut",
            Fault::ArbiterCut(_) => "arbiter link cut",
            Fault::ArbiterStop => "arbiter stopped",
            Fault::DiskFull(_) => "disk full",
        }
    }

    /// The box whose process or disk this fault takes (arbiter link cuts leave both running).
    fn takes_box(self) -> Option<usize> {
        match self {
            Fault::Kill(i) | Fault::Reflash(i) | Fault::Stop(i) | Fault::DiskFull(i) => Some(i),
            _ => None,
        }
    }

    /// Whether, while it lasts, a box may ACK without its partner having the lease (the partner
    /// is gone, frozen, cannot write, or unreachable).
    fn breaks_sync(self) -> bool {
        self.takes_box().is_some() || self == Fault::PeerCut
    }
}

/// xorshift64*: a small seeded generator, so a schedule can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// One to three faults at once; at most one process or disk fault per box, and a reflash only
/// beside faults that keep the two copies in sync (the arbiter's). `active` is the
/// box serving now: half the box faults go to it, half to the standby.
fn schedule(rng: &mut Rng, active: usize) -> Vec<Fault> {
    let n = 1 + rng.below(3) as usize;
    let mut faults: Vec<Fault> = Vec::new();
    while faults.len() < n {
        let target = if rng.below(2) == 0 { active } else { 1 - active };
        let f = match rng.below(8) {
            0 | 1 => Fault::Kill(target),
            2 => Fault::Reflash(target),
            3 => Fault::Stop(target),
            4 => Fault::PeerCut,
            5 => Fault::ArbiterCut(target),
            6 => Fault::ArbiterStop,
            _ => Fault::DiskFull(target),
        };
        let same_box = |g: &Fault| f.takes_box().is_some() && g.takes_box() == f.takes_box();
        // A reflash loses a box's disk; with the other copy out of sync at the same time, leases
        // ACKed meanwhile exist nowhere else (no replication scheme survives that), and the
        // invariants would check the impossible.
        let reflash = |g: &Fault| matches!(g, Fault::Reflash(_));
        let both_copies = faults.iter().any(|g| (reflash(g) && f.breaks_sync()) || (reflash(&f) && g.breaks_sync()));
        let clash = faults.iter().any(|g| *g == f || same_box(g)) || both_copies;
        if !clash {
            faults.push(f);
        }
    }
    faults
}

/// What the run counted; every `*_violations` must be 0.
#[derive(Default, Debug)]
struct Figures {
    faults: BTreeMap<&'static str, u32>,
    acks: u64,
    replies: u64,
    failovers: u64,
    min_gap_between_servers: Option<Duration>,
    kills_checked: u32,
    acked_leases_checked: u64,
    same_instant_violations: u64,
    overlap_violations: u64,
    lost_ack_violations: u64,
    unexpected_exits: u32,
    details: Vec<String>,
}

/// A reply as the observer saw it, enough to check the run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Seen {
    at: SystemTime,
    src: std::net::Ipv4Addr,
    kind: u8,
    chaddr: [u8; 6],
    yiaddr: std::net::Ipv4Addr,
    lease_secs: Option<u32>,
}

impl From<WireReply> for Seen {
    fn from(r: WireReply) -> Seen {
        Seen { at: r.at, src: r.src, kind: r.kind, chaddr: r.chaddr, yiaddr: r.yiaddr, lease_secs: r.lease_secs }
    }
}

struct Chaos {
    // Dropped first: the daemons, then the captures, the disks, the namespaces.
    boxes: [Option<Server>; 2],
    caps: Vec<Capture>,
    dhclients: Vec<Child>,
    load: Option<Child>,
    disks: [SmallDisk; 2],
    configs: [PathBuf; 2],
    arbiter_if: [String; 2],
    macs: PathBuf,
    p: Pair,
    net: ArbiterNet,
    seen: HashSet<Seen>,
    cap_no: u32,
}

impl Chaos {
    fn new() -> Chaos {
        let mut p = Pair::new();
        let net = ArbiterNet::new();
        let arbiter_if = [0, 1].map(|i| net.attach(&p.boxes[i], i as u8 + 2));
        for _ in 0..3 {
            p.add_client();
        }
        // perfdhcp broadcasts from an interface only if it has an address.
        let (ns, iface) = p.client(0);
        ns.ip(&format!("addr add 198.18.0.9/24 dev {iface}"));
        let disks = [0, 1].map(|i| SmallDisk::mount(&p.box_dir(i).join("state"), "16m"));
        let peer = "sync_mode = \"before-ack\"\nack_timeout_ms = 10000";
        let configs = [0, 1].map(|i| {
            let path = p.config(i, POOL, peer);
            let text = std::fs::read_to_string(&path).unwrap().replace(
                "routers = [",
                &format!("lease_secs = {LEASE_SECS}\nrenew_secs = {}\nrebind_secs = {}\nrouters = [", LEASE_SECS / 4, LEASE_SECS / 2),
            );
            let arbiter = format!(
                "[arbiter]\nurl = \"{}\"\nutype = \"branch-chaos/dhcp\"\ninterval_ms = {I_MS}\ntimeout_ms = {T_MS}\ntls = \"off\"\n",
                net.url()
            );
            std::fs::write(&path, text + &arbiter).unwrap();
            path
        });
        let init = run(p.boxes[0].cmd(BIN).args(["arbiter", "init", "--config"]).arg(&configs[0]));
        assert!(String::from_utf8_lossy(&init.stdout).contains("arbiter ready"));
        let macs = mac_file(p.dir.path(), MACS, 77);
        let mut c = Chaos {
            boxes: [None, None],
            caps: Vec::new(),
            dhclients: Vec::new(),
            load: None,
            disks,
            configs,
            arbiter_if,
            macs,
            p,
            net,
            seen: HashSet::new(),
            cap_no: 0,
        };
        c.rotate_capture();
        c.start(0);
        c.start(1);
        for n in 1..3 {
            let (ns, iface) = c.p.client(n);
            let dir = c.p.dir.path().join(format!("client{n}"));
            std::fs::create_dir_all(&dir).unwrap();
            c.dhclients.push(dhclient(ns, iface, &dir, &[]).0);
        }
        c
    }

    fn start(&mut self, i: usize) {
        let b = Server::builder(&self.p.boxes[i], &self.p.box_dir(i)).config(&self.configs[i]);
        self.boxes[i] = Some(b.env("RUST_LOG", "info").start());
    }

    fn srv(&self, i: usize) -> &Server {
        self.boxes[i].as_ref().unwrap()
    }

    fn logs(&self) -> String {
        (0..2).map(|i| format!("---- box {i} ----\n{}", self.srv(i).log_text())).collect()
    }

    /// A new capture on both switch ports; the previous ones stop once the new ones listen, so
    /// no reply falls between them (the overlap is counted once).
    fn rotate_capture(&mut self) {
        self.cap_no += 1;
        let new: Vec<Capture> = (0..2)
            .map(|i| {
                let path = self.p.dir.path().join(format!("cap-{i}-{}.pcap", self.cap_no));
                Capture::start(&self.p.sw.ns, &self.p.ports[i], &path)
            })
            .collect();
        for (i, cap) in std::mem::replace(&mut self.caps, new).into_iter().enumerate() {
            let path = cap.path.clone();
            self.seen.extend(own(i, cap.stop()));
            let _ = std::fs::remove_file(path);
        }
    }

    /// The replies of the current capture so far.
    fn current(&self) -> Vec<Seen> {
        self.caps.iter().enumerate().flat_map(|(i, c)| own(i, c.replies())).collect()
    }

    /// A box's status, or None if it does not answer (stopped, starting, gone).
    fn status(&self, i: usize) -> Option<twinlease::server::control::Status> {
        use twinlease::server::control::{client, protocol::Request};
        let socket = self.boxes[i].as_ref()?.runtime_dir.join("status.sock");
        let req = Request::new("status-get", serde_json::Map::new());
        let r = client::ask_within(&socket, &req, Duration::from_secs(2)).ok()?;
        serde_json::from_value(r.arguments?).ok()
    }

    /// Waits until one box is active and its partner in sync, the other standby; returns the
    /// active box. A box that exited by itself is counted, logged and restarted.
    fn settle(&mut self, fig: &mut Figures) -> usize {
        let start = Instant::now();
        loop {
            for i in 0..2 {
                if let Ok(Some(status)) = self.boxes[i].as_mut().unwrap().child.try_wait() {
                    fig.unexpected_exits += 1;
                    fig.details.push(format!("box {i} exited by itself ({status})"));
                    eprintln!("CHAOS box {i} exited by itself ({status}):\n{}", self.srv(i).log_text());
                    self.start(i);
                }
            }
            let s = [self.status(0), self.status(1)];
            if let [Some(a), Some(b)] = &s {
                let active: Vec<usize> =
                    [a, b].iter().enumerate().filter(|(_, s)| s.role.state == "active").map(|(i, _)| i).collect();
                if let [i] = active[..] {
                    let (me, other) = if i == 0 { (a, b) } else { (b, a) };
                    let synced = me.partner.as_ref().is_some_and(|p| p.in_sync && p.link_up);
                    let standby_ready = other.partner.as_ref().is_some_and(|p| p.readiness == "caught-up" && p.link_up);
                    if synced && standby_ready && me.role.serving {
                        return i;
                    }
                }
            }
            assert!(start.elapsed() < SETTLE, "the pair did not settle within {SETTLE:?}: {s:#?}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn start_load(&mut self, secs: u64) {
        let (ns, iface) = self.p.client(0);
        let child = ns
            .cmd("perfdhcp")
            .args(["-4", "-l", iface, "-r", &RATE.to_string(), "-p", &secs.to_string(), "-M"])
            .arg(&self.macs)
            .stdout(std::fs::File::create(self.p.dir.path().join("perfdhcp.out")).unwrap())
            .stderr(std::fs::File::create(self.p.dir.path().join("perfdhcp.err")).unwrap())
            .spawn()
            .unwrap();
        self.load = Some(child);
    }

    fn wait_load(&mut self) {
        if let Some(mut child) = self.load.take() {
            wait_for("perfdhcp to finish its bounded run", Duration::from_secs(30), || child.try_wait().unwrap());
        }
    }

    /// Waits until the current capture holds `n` ACKs; on timeout shows perfdhcp's output.
    fn wait_acks(&self, n: usize) {
        let start = Instant::now();
        while self.current().iter().filter(|r| r.kind == 5).count() < n {
            let perf = |f: &str| std::fs::read_to_string(self.p.dir.path().join(f)).unwrap_or_default();
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no ACKs for perfdhcp within 20 s:\n{}\n{}\n{}",
                perf("perfdhcp.out"),
                perf("perfdhcp.err"),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn inject(&mut self, f: Fault) {
        match f {
            Fault::Kill(i) | Fault::Reflash(i) => self.boxes[i].as_mut().unwrap().kill9(),
            Fault::Stop(i) => self.srv(i).signal("STOP"),
            Fault::PeerCut => self.p.partition(),
            Fault::ArbiterCut(i) => self.p.boxes[i].ip(&format!("link set {} down", self.arbiter_if[i])),
            Fault::ArbiterStop => self.net.signal_all("STOP"),
            Fault::DiskFull(i) => self.disks[i].fill(),
        }
    }

    fn heal(&mut self, f: Fault) {
        match f {
            Fault::Kill(i) => self.start(i),
            Fault::Reflash(i) => {
                empty_dir(&self.disks[i].dir);
                self.start(i);
            }
            Fault::Stop(i) => self.srv(i).signal("CONT"),
            Fault::PeerCut => self.p.heal(),
            Fault::ArbiterCut(i) => self.p.boxes[i].ip(&format!("link set {} up", self.arbiter_if[i])),
            Fault::ArbiterStop => self.net.signal_all("CONT"),
            Fault::DiskFull(i) => self.disks[i].unfill(),
        }
    }

    /// Every address box `dead` ACKed in this capture up to `until` is leased to the same client
    /// on `survivor`'s disk. Returns (leases checked, missing).
    fn acked_on_survivor(&self, dead: usize, until: SystemTime, fig: &mut Figures) {
        let src = lan_ip(dead);
        let mut acked: HashMap<std::net::Ipv4Addr, [u8; 6]> = HashMap::new();
        let mut replies = self.current();
        replies.sort_by_key(|r| r.at);
        for r in replies.iter().filter(|r| r.kind == 5 && r.src == src && r.at <= until) {
            acked.insert(r.yiaddr, r.chaddr);
        }
        let rows = leases(&self.configs[1 - dead]);
        fig.kills_checked += 1;
        for (ip, mac) in &acked {
            fig.acked_leases_checked += 1;
            let row = lease_of(&rows, &ip.to_string());
            if !row.is_some_and(|l| l["state"] == "leased" && l["hw"] == fmt_mac(mac).as_str()) {
                fig.lost_ack_violations += 1;
                fig.details.push(format!(
                    "{ip} ACKed to {} by box {dead} before its kill; survivor has {row:?}",
                    fmt_mac(mac)
                ));
            }
        }
    }

    /// One cycle: load, faults, hold, heal, settle. `active` is the box serving at its start.
    fn cycle(&mut self, rng: &mut Rng, active: usize, first: bool, fig: &mut Figures) -> usize {
        // The first cycle is the plain failover, so that even a short run checks the survivor.
        let faults = if first { vec![Fault::Kill(active)] } else { schedule(rng, active) };
        let hold = Duration::from_millis(500 + rng.below(3500));
        self.start_load(hold.as_secs() + 3);
        let before = self.current().iter().filter(|r| r.kind == 5).count();
        self.wait_acks(before + 20);
        let mut sync_broken = false;
        let mut kills = Vec::new();
        for &f in &faults {
            *fig.faults.entry(f.kind()).or_default() += 1;
            self.inject(f);
            if let Fault::Kill(i) | Fault::Reflash(i) = f {
                // Checkable when both were in sync until now and the survivor keeps its disk.
                let survivor_wiped = faults.contains(&Fault::Reflash(1 - i));
                if !sync_broken && !survivor_wiped {
                    kills.push((i, SystemTime::now()));
                }
            }
            sync_broken |= f.breaks_sync();
            let gap = Duration::from_millis(rng.below(400));
            std::thread::sleep(gap);
        }
        std::thread::sleep(hold);
        for (dead, at) in kills {
            self.acked_on_survivor(dead, at, fig);
        }
        for &f in &faults {
            self.heal(f);
        }
        self.wait_load();
        let now_active = self.settle(fig);
        self.rotate_capture();
        eprintln!("CHAOS faults {faults:?}, held {hold:?}; active box {active} → {now_active}");
        now_active
    }

    /// Namespaces this run created.
    fn namespaces(&self) -> Vec<String> {
        let mut v = vec![self.p.sw.ns.name.clone(), self.net.arb.ns.name.clone()];
        v.extend(self.p.boxes.iter().map(|b| b.name.clone()));
        v.extend(self.p.clients.iter().map(|(ns, _)| ns.name.clone()));
        v
    }
}

impl Drop for Chaos {
    fn drop(&mut self) {
        for c in self.dhclients.iter_mut().chain(self.load.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        // A box frozen by a failed cycle must be able to die.
        for b in self.boxes.iter().flatten() {
            let _ = Command::new("kill").arg("-CONT").arg(b.child.id().to_string()).status();
        }
        self.net.signal_all("CONT");
    }
}

/// The replies box `i` sent, from the capture on its port (which also sees the other box's
/// broadcasts, flooded by the switch).
fn own(i: usize, replies: Vec<WireReply>) -> impl Iterator<Item = Seen> {
    let me = lan_ip(i);
    replies.into_iter().filter(move |r| r.src == me).map(Seen::from)
}

fn lan_ip(i: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(198, 18, 0, i as u8 + 1)
}

fn empty_dir(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
    }
}

/// The invariants over every reply seen in the run.
fn check_wire(seen: &HashSet<Seen>, fig: &mut Figures) {
    let mut all: Vec<&Seen> = seen.iter().collect();
    all.sort_by_key(|r| r.at);
    fig.replies = all.len() as u64;
    fig.acks = all.iter().filter(|r| r.kind == 5).count() as u64;
    for w in all.windows(2) {
        if w[0].src == w[1].src {
            continue;
        }
        fig.failovers += 1;
        let gap = w[1].at.duration_since(w[0].at).unwrap_or_default();
        fig.min_gap_between_servers = Some(fig.min_gap_between_servers.map_or(gap, |g| g.min(gap)));
        if gap < SAME_INSTANT {
            fig.same_instant_violations += 1;
            fig.details.push(format!("two servers replied {gap:?} apart: {:?} then {:?}", w[0], w[1]));
        }
    }
    // Per address, when each client's lease (by its latest ACK) ends.
    let mut ends: HashMap<std::net::Ipv4Addr, HashMap<[u8; 6], SystemTime>> = HashMap::new();
    for r in all.iter().filter(|r| r.kind == 5) {
        let holders = ends.entry(r.yiaddr).or_default();
        for (mac, end) in holders.iter() {
            if *mac != r.chaddr && *end > r.at {
                fig.overlap_violations += 1;
                fig.details.push(format!(
                    "{} ACKed to {} while {}'s lease ran: {r:?}",
                    r.yiaddr,
                    fmt_mac(&r.chaddr),
                    fmt_mac(mac)
                ));
            }
        }
        let end = r.at + Duration::from_secs(r.lease_secs.unwrap_or(LEASE_SECS).into());
        holders.insert(r.chaddr, end);
    }
}

fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{key}={v} is not a number")))
}

#[test]
fn chaos_soak_keeps_every_invariant() {
    let cycles = env_u64("CHAOS_CYCLES").unwrap_or(20);
    let seed = env_u64("CHAOS_SEED").unwrap_or(20261122);
    eprintln!("CHAOS seed {seed}, {cycles} cycles (CHAOS_SEED={seed} CHAOS_CYCLES={cycles} replays it)");
    let mut rng = Rng(seed.max(1));
    let mut fig = Figures::default();
    let started = Instant::now();
    let (names, marker) = {
        let mut chaos = Chaos::new();
        let mut active = chaos.settle(&mut fig);
        for n in 0..cycles {
            eprint!("CHAOS cycle {}/{cycles}: ", n + 1);
            active = chaos.cycle(&mut rng, active, n == 0, &mut fig);
        }
        converge(chaos.srv(0), chaos.srv(1), Duration::from_secs(30));
        chaos.rotate_capture();
        let seen = std::mem::take(&mut chaos.seen);
        check_wire(&seen, &mut fig);
        (chaos.namespaces(), chaos.p.dir.path().display().to_string())
    };
    let left = leftovers(&names, &marker);
    eprintln!(
        "CHAOS SUMMARY seed {seed}: {cycles} cycles in {:.0} s; faults {:?}; {} replies, {} ACKs, {} changes of replying box \
         (closest {:?}); {} kills checked for before-ack, {} ACKed leases checked on the survivor; \
         violations: same instant {}, overlapping leases {}, ACKed lease lost {}, box exited by itself {}; \
         tables equal after the final heal; left behind: {left:?}",
        started.elapsed().as_secs_f64(),
        fig.faults,
        fig.replies,
        fig.acks,
        fig.failovers,
        fig.min_gap_between_servers,
        fig.kills_checked,
        fig.acked_leases_checked,
        fig.same_instant_violations,
        fig.overlap_violations,
        fig.lost_ack_violations,
        fig.unexpected_exits,
    );
    assert!(fig.details.is_empty(), "seed {seed}: invariant violations:\n{}", fig.details.join("\n"));
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(fig.acks > 0 && fig.acked_leases_checked > 0, "a run that checked nothing: {fig:?}");
}

/// Namespaces of the run still present, and processes whose command line names its directory.
fn leftovers(names: &[String], marker: &str) -> Vec<String> {
    let listed = String::from_utf8_lossy(&run(Command::new("ip").args(["netns", "list"])).stdout).to_string();
    let mut left: Vec<String> = names
        .iter()
        .filter(|n| listed.lines().any(|l| l.split_whitespace().next() == Some(n.as_str())))
        .cloned()
        .collect();
    let procs = Command::new("pgrep").args(["-f", marker]).output().unwrap();
    left.extend(String::from_utf8_lossy(&procs.stdout).lines().map(|pid| format!("process {pid}")));
    left
}
