//! A branch office as the failover and fault tests build it: two twinlease boxes on one client
//! LAN with a peer link (see `pair.rs`), the election arbitrated by a throwaway PostgreSQL in a
//! namespace of its own (see `arbiter.rs`), nothing pinned.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use super::arbiter::*;
use super::pair::*;
use super::*;

pub const POOL: &str = "198.18.0.100-198.18.0.250";
pub const I_MS: u64 = 500;
pub const T_MS: u64 = 2000;

/// The two boxes of a pair with the arbiter; both run the real election.
pub struct Site {
    pub p: Pair,
    /// Kept for its drop: the arbiter lives as long as the site.
    _net: ArbiterNet,
    pub configs: [PathBuf; 2],
    pub boxes: [Option<Server>; 2],
}

impl Site {
    pub fn new(clients: usize) -> Site {
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
        let init = run(p.boxes[0].cmd(BIN).args(["arbiter", "init", "--config"]).arg(&configs[0]));
        assert!(String::from_utf8_lossy(&init.stdout).contains("arbiter ready"));
        Site { p, _net: net, configs, boxes: [None, None] }
    }

    pub fn start(&mut self, i: usize) {
        let (ns, dir) = (&self.p.boxes[i], self.p.box_dir(i));
        let b = Server::builder(ns, &dir).config(&self.configs[i]).env("RUST_LOG", "info,twinlease::election=debug");
        self.boxes[i] = Some(b.start());
    }

    pub fn srv(&self, i: usize) -> &Server {
        self.boxes[i].as_ref().unwrap()
    }

    pub fn logs(&self) -> String {
        (0..2)
            .map(|i| format!("---- box {i} ----\n{}", self.boxes[i].as_ref().map(Server::log_text).unwrap_or_default()))
            .collect()
    }

    pub fn whois(&self, i: usize) -> serde_json::Value {
        let out = run(self.p.boxes[i].cmd(BIN).args(["whois", "--json", "--config"]).arg(&self.configs[i]));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// The box's LAN address (198.18.0.1 for box 0, .2 for box 1).
pub fn lan_ip(i: usize) -> String {
    format!("198.18.0.{}", i + 1)
}

/// perfdhcp as a relay at `relay_ip` (on client `n`) against `server`: `rate`/s new clients
/// (MACs from a file of `macs`, one set per client), for at most `secs` seconds.
pub fn perfdhcp(p: &Pair, n: usize, relay_ip: &str, server: &str, rate: u32, macs: usize, secs: u32) -> Child {
    let (ns, iface) = p.client(n);
    ns.ip(&format!("addr add {relay_ip}/24 dev {iface}"));
    let file = mac_file(p.dir.path(), macs, 10 + n as u32);
    ns.cmd("perfdhcp")
        .args(["-4", "-l", relay_ip, "-r", &rate.to_string(), "-p", &secs.to_string(), "-M"])
        .arg(file)
        .arg(server)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

pub fn wait_exit(child: &mut Child, limit: Duration) {
    wait_for("perfdhcp to finish its bounded run", limit, || child.try_wait().unwrap());
}
