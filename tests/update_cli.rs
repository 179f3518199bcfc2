//! `twinlease update` against a box's file system laid out in a directory (`--root`): the ESP
//! with its boot entries, the two slots as files in place of partitions, the kernel command
//! line. What systemd-boot does between boots (counting tries down) is done here by renaming
//! the entry as it would. The firmware image under QEMU is tests/update.rs (make test-update).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::BIN;
use common::bundle::{self, Key};
use common::fake_box::{FakeBox, OPTIONS, SLOT_BYTES};

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

const ROOT: &[u8] = b"a squashfs image would be here";
const KERNEL: &[u8] = b"vmlinuz";
const INITRD: &[u8] = b"initrd";

#[test]
fn bad_bundles_are_refused_before_anything_is_written() {
    let b = FakeBox::new();
    let key = Key::generate(b.dir.path(), "product");
    let other = Key::generate(b.dir.path(), "other");
    let good = bundle::make(&key, b.dir.path(), std::env::consts::ARCH, "2.0", [ROOT, KERNEL, INITRD]);
    let big_root = vec![7u8; SLOT_BYTES + 1];
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("flipped signature bit", bundle::flip_signature_bit(&good), "bad signature"),
        (
            "signed by another key",
            bundle::make(&other, b.dir.path(), std::env::consts::ARCH, "2.0", [ROOT, KERNEL, INITRD]),
            "bad signature",
        ),
        ("truncated by one byte", good[..good.len() - 1].to_vec(), "truncated bundle"),
        ("truncated inside the manifest", good[..30].to_vec(), "truncated bundle"),
        ("another architecture", bundle::for_arch(&good, "riscv64", &key, b.dir.path()), "the bundle is for riscv64"),
        ("one byte more", [good.clone(), vec![0]].concat(), "after the last payload"),
        ("not a bundle", b"#!/bin/sh\necho not a bundle at all\n".to_vec(), "not a twinlease bundle"),
        (
            "root larger than the slot",
            bundle::make(&key, b.dir.path(), std::env::consts::ARCH, "2.0", [&big_root, KERNEL, INITRD]),
            "slot b holds",
        ),
    ];
    let before = b.snapshot();
    for (case, bytes, says) in cases {
        let out = b.install(&bytes, &key);
        assert!(!out.status.success(), "{case}: installed:\n{}", text(&out));
        assert!(text(&out).contains(says), "{case}: expected {says:?} in:\n{}", text(&out));
        assert!(b.snapshot() == before, "{case}: the ESP or slot b changed");
    }
}

#[test]
fn install_boot_counting_rollback_and_mark_good() {
    let b = FakeBox::new();
    let key = Key::generate(b.dir.path(), "product");
    let bundle = bundle::make(&key, b.dir.path(), std::env::consts::ARCH, "2.0", [ROOT, KERNEL, INITRD]);
    let root_a = std::fs::read(b.path("dev/disk/by-partlabel/root-a")).unwrap();

    let out = b.install(&bundle, &key);
    assert!(out.status.success(), "{}", text(&out));
    let slot_b = std::fs::read(b.path("dev/disk/by-partlabel/root-b")).unwrap();
    assert_eq!(&slot_b[..ROOT.len()], ROOT);
    assert_eq!(std::fs::read(b.path("dev/disk/by-partlabel/root-a")).unwrap(), root_a, "the running slot was written");
    assert_eq!(std::fs::read(b.path("efi/slot-b/vmlinuz")).unwrap(), KERNEL);
    assert_eq!(std::fs::read(b.path("efi/slot-b/initrd.img")).unwrap(), INITRD);
    assert_eq!(b.entries(), ["twinlease-1-a.conf", "twinlease-2-b+3.conf"]);
    let entry = std::fs::read_to_string(b.path("efi/loader/entries/twinlease-2-b+3.conf")).unwrap();
    assert!(entry.contains(&format!("options {}", OPTIONS.replace("root-a", "root-b"))), "{entry}");
    assert!(entry.contains("linux /slot-b/vmlinuz"), "{entry}");
    let s = b.status();
    assert_eq!((s["booted"].as_str(), s["next_boot"].as_str()), (Some("a"), Some("b")), "{s}");
    assert_eq!(s["slots"][1]["state"], "trying");
    assert_eq!(s["slots"][1]["version"], "2.0");
    assert_eq!(s["slots"][1]["tries_left"], 3);

    // Three boots of slot b that never got healthy: systemd-boot leaves +0-3, boots slot a.
    b.rename_entry("twinlease-2-b+3.conf", "twinlease-2-b+0-3.conf");
    let s = b.status();
    assert_eq!(s["next_boot"], "a", "{s}");
    assert_eq!(s["slots"][1]["state"], "bad");
    assert_eq!(s["rollback"]["from_slot"], "b");
    assert_eq!(s["rollback"]["failed_boots"], 3);
    let human = b.update(&["status"]);
    assert!(
        text(&human).contains("ROLLBACK: slot b (2.0) failed 3 boots; slot a (1.0) runs again"),
        "{}",
        text(&human)
    );
    let health = b.update(&["health", "--config", b.path("none.toml").to_str().unwrap(), "--timeout", "1"]);
    assert!(text(&health).contains("ROLLBACK"), "{}", text(&health));

    // Installed again (a new generation), this time slot b comes up: on its first boot (+2-1)
    // it is marked good.
    let out = b.install(&bundle, &key);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(b.entries(), ["twinlease-1-a.conf", "twinlease-3-b+3.conf"]);
    b.rename_entry("twinlease-3-b+3.conf", "twinlease-3-b+2-1.conf");
    b.boot(&OPTIONS.replace("root-a", "root-b"));
    let out = b.update(&["mark-good"]);
    assert!(out.status.success() && text(&out).contains("slot b (2.0) marked good"), "{}", text(&out));
    assert_eq!(b.entries(), ["twinlease-1-a.conf", "twinlease-3-b.conf"]);
    let s = b.status();
    assert_eq!((s["booted"].as_str(), s["next_boot"].as_str()), (Some("b"), Some("b")), "{s}");
    assert_eq!(s["slots"][1]["state"], "good");
    assert!(s["rollback"].is_null());

    // The next install goes to slot a, generation 4: it sorts first.
    let out = b.install(&bundle::make(&key, b.dir.path(), std::env::consts::ARCH, "3.0", [ROOT, KERNEL, INITRD]), &key);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(b.entries(), ["twinlease-3-b.conf", "twinlease-4-a+3.conf"]);
    assert_eq!(b.status()["next_boot"], "a");
}

#[test]
fn the_last_try_is_still_a_trial_and_may_be_marked_good() {
    let b = FakeBox::new();
    let key = Key::generate(b.dir.path(), "product");
    let bundle = bundle::make(&key, b.dir.path(), std::env::consts::ARCH, "2.0", [ROOT, KERNEL, INITRD]);
    assert!(b.install(&bundle, &key).status.success());
    // systemd-boot counted the third try down before starting it: +0-3 is running.
    b.rename_entry("twinlease-2-b+3.conf", "twinlease-2-b+0-3.conf");
    b.boot(&OPTIONS.replace("root-a", "root-b"));
    // Without a site configuration the boot is the check (the daemon is not started at all).
    let health = b.update(&["health", "--config", b.path("none.toml").to_str().unwrap(), "--timeout", "1"]);
    assert!(health.status.success(), "{}", text(&health));
    assert!(text(&health).contains("slot b (2.0) on trial: boot 3 of 3"), "{}", text(&health));
    assert!(b.update(&["mark-good"]).status.success());
    assert_eq!(b.entries(), ["twinlease-1-a.conf", "twinlease-2-b.conf"]);
}

// ---- the partner's update port (update serve-peer) --------------------------------------

/// Box B of a pair in a directory, its update port served in a namespace where 198.18.1.1 is
/// its partner's address and 198.18.1.2 its own: each connection accepted by the test runs
/// `update serve-peer` on it, as systemd's socket unit does on a box.
struct PeerPort {
    b: FakeBox,
    ns: common::Netns,
    listener: std::net::TcpListener,
    config: PathBuf,
}

const PEER_KEY: &[u8] = b"the pair's shared key, 32 bytes!";

impl PeerPort {
    fn new(bundle_key: &Key) -> PeerPort {
        use std::os::unix::fs::PermissionsExt;
        let b = FakeBox::new();
        std::fs::create_dir_all(b.path("usr/share/twinlease")).unwrap();
        std::fs::copy(&bundle_key.public, b.path("usr/share/twinlease/bundle-key.pem")).unwrap();
        let key = b.path("peer.key");
        std::fs::write(&key, PEER_KEY).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let config = b.path("twinlease.toml");
        let peer = format!(
            "[[subnet]]\ncidr = \"198.18.0.0/24\"\n[peer]\nlisten = \"198.18.1.2:6767\"\n\
             address = \"198.18.1.1:6767\"\nkey_file = \"{}\"\n",
            key.display()
        );
        std::fs::write(&config, common::config_text(b.dir.path(), &peer)).unwrap();
        let ns = common::Netns::new("up");
        ns.ip("addr add 198.18.1.1/32 dev lo");
        ns.ip("addr add 198.18.1.2/32 dev lo");
        let listener = ns.within(|| std::net::TcpListener::bind("198.18.1.2:6769").unwrap());
        PeerPort { b, ns, listener, config }
    }

    /// Connects from `from` and serves the connection; returns the caller's end and the
    /// serving process.
    fn connect(&self, from: &str) -> (std::net::TcpStream, std::process::Child) {
        let from: std::net::SocketAddr = format!("{from}:0").parse().unwrap();
        let stream = self.ns.within(move || {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.bind(&from.into()).unwrap();
            s.connect(&std::net::SocketAddr::from(([198, 18, 1, 2], 6769)).into()).unwrap();
            std::net::TcpStream::from(s)
        });
        let (served, _) = self.listener.accept().unwrap();
        let out = served.try_clone().unwrap();
        let child = Command::new(BIN)
            .args(["update", "--root"])
            .arg(self.b.dir.path())
            .args(["serve-peer", "--config"])
            .arg(&self.config)
            .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(served)))
            .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(out)))
            .spawn()
            .unwrap();
        stream.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
        (stream, child)
    }

    /// One request from the partner's address with `key`: the lines before the result, and
    /// the result if one came and its MAC checked out with the key.
    fn ask(&self, key: &[u8], command: PeerCommand, bundle: &[u8]) -> (Vec<String>, Option<PeerReply>) {
        use std::io::{BufRead, Write};
        let (stream, mut child) = self.connect("198.18.1.1");
        let mut lines = std::io::BufReader::new(stream.try_clone().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let server_nonce = peer::from_hex(first.strip_prefix("nonce ").unwrap_or_else(|| panic!("{first}"))).unwrap();
        let nonce = [9u8; peer::NONCE_LEN];
        let request = serde_json::to_string(&PeerRequest { nonce: peer::to_hex(&nonce), command }).unwrap();
        let mut w = &stream;
        write!(w, "{request}\nmac {}\n", peer::request_mac(key, &server_nonce, &request)).unwrap();
        w.write_all(bundle).unwrap();
        let mut said = Vec::new();
        let mut reply = None;
        for line in lines.map_while(Result::ok) {
            match line.strip_prefix("result ") {
                Some(rest) => reply = Some(peer::open_result(key, &nonce, rest).expect("the result's MAC")),
                None => said.push(line),
            }
        }
        child.wait().unwrap();
        (said, reply)
    }
}

use twinlease::update::peer::{self, PeerCommand, PeerReply, PeerRequest};

#[test]
fn the_partners_update_port_answers_only_the_partner_with_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::generate(dir.path(), "k");
    let port = PeerPort::new(&key);
    let before = port.b.snapshot();

    let (_, status) = port.ask(PEER_KEY, PeerCommand::Status, &[]);
    let view = status.expect("a result").view.expect("the box's view");
    assert_eq!(
        (view.slots.booted.as_str(), view.slots.booted_version.as_deref(), view.slots.booted_state.as_deref()),
        ("a", Some("1.0"), Some("good"))
    );
    assert!(view.daemon.is_none(), "no daemon runs here: {view:?}");

    // Another key: refused, no result; another address: not even a nonce.
    let good = bundle::make(&key, dir.path(), std::env::consts::ARCH, "2.0", [ROOT, KERNEL, INITRD]);
    let install = PeerCommand::Install { bundle_len: good.len() as u64, reboot: false };
    let (said, reply) = port.ask(b"not the pair's key, but 32 bytes", install.clone(), &good);
    assert!(reply.is_none() && said.iter().any(|l| l.contains("refused")), "{said:?}");
    let (stream, mut child) = port.connect("198.18.1.2");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut &stream, &mut rest);
    child.wait().unwrap();
    assert!(rest.is_empty(), "a stranger got {rest:?}");
    assert_eq!(port.b.snapshot(), before, "a refused request wrote something");

    // A bundle signed by another key, with the pair's key: the box's own checks refuse it.
    let other = Key::generate(dir.path(), "other");
    let foreign = bundle::make(&other, dir.path(), std::env::consts::ARCH, "2.0", [ROOT, KERNEL, INITRD]);
    let (said, reply) =
        port.ask(PEER_KEY, PeerCommand::Install { bundle_len: foreign.len() as u64, reboot: false }, &foreign);
    let reply = reply.expect("a result");
    assert!(reply.exit == 1 && reply.error.as_deref().is_some_and(|e| e.contains("signature")), "{reply:?} {said:?}");
    assert_eq!(port.b.snapshot(), before, "a foreign bundle wrote something");

    // A staged bundle that is not staged here.
    let staged = PeerCommand::InstallStaged { manifest_sha256: "00".repeat(32), reboot: false };
    let (said, reply) = port.ask(PEER_KEY, staged, &[]);
    let reply = reply.expect("a result");
    assert!(reply.exit == 1 && reply.error.as_deref().is_some_and(|e| e.contains("staged")), "{reply:?} {said:?}");
    assert_eq!(port.b.snapshot(), before, "a missing staged bundle wrote something");

    // The partner's good bundle: received, installed into slot b, and not kept.
    let (said, reply) = port.ask(PEER_KEY, install, &good);
    assert_eq!(reply.expect("a result").exit, 0, "{said:?}");
    assert!(
        said.iter().any(|l| l.contains("received")) && said.iter().any(|l| l.contains("written and read back")),
        "{said:?}"
    );
    assert!(port.b.entries().iter().any(|e| e.ends_with("-b+3.conf")), "{:?}", port.b.entries());
    let incoming: Vec<_> = std::fs::read_dir(port.b.path("var/lib/twinlease-update")).unwrap().collect();
    assert!(incoming.is_empty(), "the received bundle was kept: {incoming:?}");
}

#[test]
fn update_pair_needs_a_partner_and_writes_nothing_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::generate(dir.path(), "k");
    let port = PeerPort::new(&key);
    let before = port.b.snapshot();
    let file = port.b.path("upload.bundle");
    std::fs::write(&file, bundle::make(&key, dir.path(), std::env::consts::ARCH, "2.0", [ROOT, KERNEL, INITRD]))
        .unwrap();
    let pair = |config: &Path| {
        port.ns
            .cmd(BIN)
            .args(["update", "--root"])
            .arg(port.b.dir.path())
            .arg("pair")
            .arg(&file)
            .arg("--config")
            .arg(config)
            .output()
            .unwrap()
    };
    // Nobody serves the partner's port (198.18.1.1:6769) in the namespace.
    let out = pair(&port.config);
    assert!(!out.status.success() && text(&out).contains("asking the partner's update port"), "{}", text(&out));
    let single = port.b.path("single.toml");
    let subnet = "[[subnet]]\ncidr = \"198.18.0.0/24\"\n";
    std::fs::write(&single, common::config_text(port.b.dir.path(), subnet)).unwrap();
    let out = pair(&single);
    assert!(!out.status.success() && text(&out).contains("not in a pair"), "{}", text(&out));
    assert_eq!(port.b.snapshot(), before);
}

/// The daemon's control socket passes `update-*` on to the update socket: status on either
/// socket, an install (with its reboot) only on the control socket, and `twinlease ctl` for
/// the operator. The update socket is served as on a box, by `twinlease update serve`.
#[test]
fn the_control_socket_relays_updates_to_the_update_socket() {
    use common::fake_box::UpdateSocket;
    use common::{Lan, Server, config_text};
    use serde_json::json;

    let b = FakeBox::new();
    let key = Key::generate(b.dir.path(), "product");
    let bundle_path = b.path("upload.bundle");
    std::fs::write(
        &bundle_path,
        bundle::make(&key, b.dir.path(), std::env::consts::ARCH, "2.0", [ROOT, KERNEL, INITRD]),
    )
    .unwrap();
    let socket = UpdateSocket::serve(&b);
    let lan = Lan::new("198.18.0.1/24");
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "[dhcp]\ninterfaces = [\"{}\"]\nping_check = false\n[[subnet]]\ncidr = \"198.18.0.0/24\"\n\
         pools = [\"198.18.0.100-198.18.0.150\"]\n[control]\nupdate_socket = \"{}\"\n",
        lan.bridge,
        socket.path.display()
    );
    let srv = Server::start(&lan.ns, dir.path(), &config_text(dir.path(), &body));

    let r = srv.ask("update-status", json!({}), false);
    assert_eq!(r.result, 0, "{}", r.text);
    assert_eq!(r.text, "slot a: 1.0, good, booted; slot b: no version, no boot entry");
    assert_eq!(r.arguments.unwrap()["booted"], "a");

    let install = json!({"bundle": bundle_path, "key": key.public, "reboot": true});
    let r = srv.ask("update-install", install.clone(), false);
    assert!(r.result != 0 && r.text.contains("control socket"), "the status socket must not install: {}", r.text);
    let r = srv.ask("update-install", json!({"bundle": "upload.bundle"}), true);
    assert!(r.result != 0 && r.text.contains("full path"), "{}", r.text);
    assert_eq!(b.entries(), ["twinlease-1-a.conf"], "nothing is written for a refused request");

    let r = srv.ask("update-install", install, true);
    assert_eq!(r.result, 0, "{}: {:?}", r.text, r.arguments);
    let output = r.arguments.unwrap()["output"].to_string();
    assert!(output.contains("signature, architecture and payloads check out"), "{output}");
    assert_eq!(r.text, "rebooting into the new slot");
    assert!(b.path("run/reboot-requested").exists(), "the reboot was asked for");
    assert_eq!(b.entries(), ["twinlease-1-a.conf", "twinlease-2-b+3.conf"]);
    let events = srv.ask("status-get", json!({}), false).arguments.unwrap()["events"].to_string();
    assert!(events.contains("update-install of") && events.contains("done"), "the action is logged: {events}");

    // The operator's way: `twinlease ctl` on the control socket.
    let out = Command::new(BIN)
        .args(["ctl", "update-status", "--config"])
        .arg(&srv.config)
        .arg("--runtime-dir")
        .arg(&srv.runtime_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("slot b: 2.0, on trial (3 boots left), boots next"), "{}", text(&out));
}
