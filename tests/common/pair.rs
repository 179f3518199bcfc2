//! Two twinlease boxes on one client LAN (a bridge in its own namespace) with a direct peer
//! link between them, as a branch office would have them. Box a is 198.18.0.1 on the LAN and
//! 198.18.1.1 on the peer link, box b 198.18.0.2 and 198.18.1.2.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::*;

pub struct Pair {
    /// The client LAN; the boxes are plugged into it like clients (`p.add_client()` adds one).
    pub sw: Switch,
    pub boxes: [Netns; 2],
    /// LAN interface of each box.
    pub lan: [String; 2],
    /// Peer-link interface of each box.
    pub link: [String; 2],
    /// Each box's port on the LAN switch (in `sw.ns`): everything the box sends crosses it.
    pub ports: [String; 2],
    pub dir: tempfile::TempDir,
}

impl Pair {
    pub fn new() -> Pair {
        let sw = Switch::new("w");
        let id = unique("");
        let boxes = [Netns::new("a"), Netns::new("b")];
        let lan = [format!("la{id}"), format!("lb{id}")];
        let link = [format!("ka{id}"), format!("kb{id}")];
        let ports = [format!("oa{id}"), format!("ob{id}")];
        for (i, ns) in boxes.iter().enumerate() {
            sw.plug(ns, &lan[i], &ports[i]);
            ns.ip(&format!("addr add 198.18.0.{}/24 dev {}", i + 1, lan[i]));
            ns.ip(&format!("link set {} up", lan[i]));
        }
        let (a, b) = (&boxes[0], &boxes[1]);
        run(Command::new("ip").args([
            "link", "add", &link[0], "netns", &a.name, "type", "veth", "peer", "name", &link[1], "netns", &b.name,
        ]));
        for i in 0..2 {
            boxes[i].ip(&format!("addr add 198.18.1.{}/30 dev {}", i + 1, link[i]));
            boxes[i].ip(&format!("link set {} up", link[i]));
        }
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("peer.key");
        std::fs::write(&key, "c2hhcmVkIHNlY3JldCBmb3IgdGhlIHBhaXIgdGVzdHM=\n").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        Pair { sw, boxes, lan, link, ports, dir }
    }

    /// Box `i`'s directory (config, state, log).
    pub fn box_dir(&self, i: usize) -> PathBuf {
        let d = self.dir.path().join(["a", "b"][i]);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Writes box `i`'s config: the same pool on both, `[peer]` pointing at the other box.
    pub fn config(&self, i: usize, pool: &str, peer_extra: &str) -> PathBuf {
        let dir = self.box_dir(i);
        let text = format!(
            "[node]\nname = \"box-{name}\"\nstate_dir = \"{state}\"\n\
             [dhcp]\ninterfaces = [\"{lan}\"]\nping_check = false\n\
             [[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"{pool}\"]\nrouters = [\"198.18.0.1\"]\n\
             [peer]\nlisten = \"198.18.1.{me}:6767\"\naddress = \"198.18.1.{other}:6767\"\nkey_file = \"{key}\"\n{peer_extra}\n\
             [log]\nfilter = \"info\"\n",
            name = ["a", "b"][i],
            state = dir.join("state").display(),
            lan = self.lan[i],
            me = i + 1,
            other = 2 - i,
            key = self.dir.path().join("peer.key").display(),
        );
        let path = dir.join("twinlease.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Starts box `i` with its role pinned ("standby" or "active:TERM").
    pub fn start(&self, i: usize, config: &Path, role: &str) -> Server {
        Server::builder(&self.boxes[i], &self.box_dir(i)).config(config).pin(role).start()
    }

    /// Drops every packet on the peer link (both directions), leaving the LAN alone.
    pub fn partition(&self) {
        self.boxes[0].sh(&format!(
            "nft add table ip tlpart; nft add chain ip tlpart in '{{ type filter hook input priority 0; }}'; nft add chain ip tlpart out '{{ type filter hook output priority 0; }}'; nft add rule ip tlpart in iifname {l} drop; nft add rule ip tlpart out oifname {l} drop",
            l = self.link[0]
        ));
    }

    pub fn heal(&self) {
        self.boxes[0].sh("nft delete table ip tlpart");
    }
}

/// The replicated part of each busy or touched row, keyed by address: what both boxes must
/// agree on (versions and sync marks are per box).
pub fn table(rows: &[serde_json::Value]) -> std::collections::BTreeMap<String, String> {
    rows.iter()
        .map(|r| {
            (
                r["address"].as_str().unwrap().to_string(),
                format!("{} {} {} {} {}", r["state"], r["client"], r["expires"], r["cltt"], r["term"]),
            )
        })
        .collect()
}

/// Waits until both boxes show the same table; on timeout shows both tables and logs.
pub fn converge(a: &Server, b: &Server, limit: Duration) {
    let start = std::time::Instant::now();
    loop {
        let (ta, tb) = (table(&a.leases()), table(&b.leases()));
        if ta == tb {
            return;
        }
        if start.elapsed() > limit {
            panic!(
                "tables differ after {limit:?}:\n a: {ta:#?}\n b: {tb:#?}\n--- a log ---\n{}\n--- b log ---\n{}",
                a.log_text(),
                b.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl std::ops::Deref for Pair {
    type Target = Switch;
    fn deref(&self) -> &Switch {
        &self.sw
    }
}

impl std::ops::DerefMut for Pair {
    fn deref_mut(&mut self) -> &mut Switch {
        &mut self.sw
    }
}
