//! A pair of firmware-image boxes under QEMU (tests/image.rs, tests/update.rs): flashed from
//! the same image with two site configurations; the LAN switch is also the router to "head
//! office", where a throwaway PostgreSQL arbiter runs in a namespace of its own; the peer cable
//! is a veth between the boxes' namespaces, bridged to each box's second NIC.

use std::time::Instant;

use super::arbiter::*;
use super::vm::*;
use super::*;

/// The boxes' `[peer]` key (a site file, as a technician writes it).
pub const KEY: &str = "c2hhcmVkIHNlY3JldCBmb3IgdGhlIGltYWdlIHRlc3Rz\n";
pub const I_MS: u64 = 1000;
pub const T_MS: u64 = 4000;
const ROUTER: &str = "198.18.0.254";

pub struct ImagePair {
    pub lan: Switch,
    /// Kept for its drop: the arbiter lives as long as the pair.
    _arbiter: ArbiterNet,
    pub hosts: [Netns; 2],
    pub taps: [[String; 2]; 2],
    pub sites: [SiteDir; 2],
}

fn site(i: usize, arbiter_url: &str) -> SiteDir {
    let (me, other) = (i + 1, 2 - i);
    let toml = format!(
        "[node]\nname = \"box-{n}\"\n\n[dhcp]\ninterfaces = [\"eth0\"]\nping_check = false\n\n\
         [[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.199\"]\nrouters = [\"198.18.0.254\"]\n\n\
         [peer]\nlisten = \"198.18.1.{me}:6767\"\naddress = \"198.18.1.{other}:6767\"\nkey_file = \"/etc/twinlease/peer.key\"\n\
         sync_mode = \"before-ack\"\nack_timeout_ms = 3000\n\n\
         [arbiter]\nurl = \"{arbiter_url}\"\nutype = \"branch-vm/dhcp\"\ninterval_ms = {I_MS}\ntimeout_ms = {T_MS}\n\
         tls = \"off\"\nendpoint = \"box-{n}.branch.example\"\npassword_file = \"/etc/twinlease/arbiter.password\"\n",
        n = ["a", "b"][i],
    );
    SiteDir::new()
        .file("twinlease.toml", &toml)
        .file("peer.key", KEY)
        .file("arbiter.password", "not-asked-for-with-trust-auth\n")
        .network("lan", "eth0", &format!("198.18.0.{me}/24"), &format!("Gateway={ROUTER}"))
        .network("peer", "eth1", &format!("198.18.1.{me}/30"), "")
}

impl ImagePair {
    /// The pair's network, arbiter and sites (each passed through `site` for additions such
    /// as the admin's SSH keys), with `clients` client hosts on the LAN; no VM runs yet.
    pub fn new(clients: usize, extend: impl Fn(SiteDir) -> SiteDir) -> ImagePair {
        let mut lan = Switch::new("l");
        lan.ns.ip(&format!("addr add {ROUTER}/24 dev {}", lan.bridge));
        let arbiter = ArbiterNet::new();
        arbiter.attach(&lan.ns, 254);
        lan.ns.sh("sysctl -qw net.ipv4.ip_forward=1");
        arbiter.arb.ns.ip("route add 198.18.0.0/24 via 198.18.10.254");
        for _ in 0..clients {
            lan.add_client();
        }
        let hosts = [Netns::new("va"), Netns::new("vb")];
        let id = unique("");
        let taps = [0, 1].map(|i| [format!("tl{i}{id}"), format!("tk{i}{id}")]);
        let (link_a, link_b) = (format!("ka{id}"), format!("kb{id}"));
        run(std::process::Command::new("ip").args([
            "link",
            "add",
            &link_a,
            "netns",
            &hosts[0].name,
            "type",
            "veth",
            "peer",
            "name",
            &link_b,
            "netns",
            &hosts[1].name,
        ]));
        for (i, host) in hosts.iter().enumerate() {
            let (br_lan, br_link) = (format!("bl{i}{id}"), format!("bk{i}{id}"));
            bridge(host, &br_lan);
            bridge(host, &br_link);
            let (inner, outer) = (format!("i{i}{id}"), format!("o{i}{id}"));
            lan.plug(host, &inner, &outer);
            host.ip(&format!("link set {inner} master {br_lan} up"));
            host.ip(&format!("link set {} master {br_link} up", [&link_a, &link_b][i]));
            tap_on_bridge(host, &taps[i][0], &br_lan);
            tap_on_bridge(host, &taps[i][1], &br_link);
        }
        let sites = [0, 1].map(|i| extend(site(i, &arbiter.url())));
        // The arbiter's table, made once from head office's side (what `arbiter init` is for).
        let init_dir = tempfile::tempdir().unwrap();
        let init_cfg = init_dir.path().join("init.toml");
        let text = std::fs::read_to_string(sites[0].dir.path().join("twinlease.toml")).unwrap();
        let key = init_dir.path().join("peer.key");
        let pass = init_dir.path().join("arbiter.password");
        for (f, body) in [(&key, KEY), (&pass, "x\n")] {
            std::fs::write(f, body).unwrap();
            std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        }
        let text = text
            .replace("/etc/twinlease/peer.key", &key.display().to_string())
            .replace("/etc/twinlease/arbiter.password", &pass.display().to_string());
        std::fs::write(&init_cfg, text).unwrap();
        let init = run(lan.ns.cmd(BIN).args(["arbiter", "init", "--config"]).arg(&init_cfg));
        assert!(String::from_utf8_lossy(&init.stdout).contains("arbiter ready"));
        ImagePair { lan, _arbiter: arbiter, hosts, taps, sites }
    }

    pub fn boot(&self, i: usize, how: Boot) -> Vm {
        let taps = [self.taps[i][0].as_str(), self.taps[i][1].as_str()];
        Vm::start(["box-a", "box-b"][i], &image(), Some(&self.sites[i]), how, &self.hosts[i], &taps)
    }
}

/// udhcpc on client `n`, one DISCOVER a second for `tries` seconds, asking for `want` if
/// given; returns (address, server identifier, when bound).
pub fn udhcpc_bound(
    lan: &Switch,
    n: usize,
    dir: &std::path::Path,
    want: Option<&str>,
    tries: u32,
) -> Option<(String, String, Instant)> {
    let (ns, iface) = lan.client(n);
    let extra: Vec<&str> = want.map(|ip| vec!["-r", ip]).unwrap_or_default();
    let tries = tries.to_string();
    let ev = dir.join(format!("bound-{n}.events"));
    let script = dir.join(format!("bound-{n}.sh"));
    std::fs::write(
        &script,
        format!("#!/bin/sh\n[ \"$1\" = bound ] && echo \"$ip $serverid\" >> {}\nexit 0\n", ev.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = ns
        .cmd("udhcpc")
        .args(["-f", "-q", "-n", "-t", &tries, "-T", "1", "-A", "1", "-i", iface, "-s"])
        .arg(&script)
        .args(&extra)
        .output()
        .unwrap();
    let at = Instant::now();
    let line = std::fs::read_to_string(&ev).unwrap_or_default();
    let _ = std::fs::remove_file(&ev);
    let mut words = line.lines().last()?.split_whitespace();
    out.status.success().then(|| (words.next().unwrap().to_string(), words.next().unwrap_or("").to_string(), at))
}
