//! Updates of the firmware image under QEMU (`make test-update`; slow under TCG, so not in `make
//! test`): one box booted through OVMF and systemd-boot (boot counting needs the boot loader),
//! its admin on SSH from the LAN, bundles from `make bundle` uploaded with scp. The bad bundles
//! are made on the box from the uploaded good one (a few header bytes replaced, the last byte
//! cut), so the data partition never holds two 100 MB files. tests/update_cli.rs checks the
//! same command against a directory in milliseconds. The VMs follow the image's architecture
//! (`Arch`, from its file name): `make test-update-aarch64` runs the first test on the aarch64
//! image (qemu-system-aarch64, AAVMF).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::bundle::Key;
use common::vm::*;
use common::wait_for_every;

const BOOT_LIMIT: Duration = Duration::from_secs(900);
/// How often to look at an emulated box over SSH: each login costs it CPU.
const SSH_EVERY: Duration = Duration::from_secs(2);
/// The box's LAN address (common::vm::one_box_site) and the test's own on that LAN.
const BOX: &str = "198.18.0.1";
const ADMIN_HOST: &str = "198.18.0.250/24";
const CONFIG: &str = "/etc/twinlease/twinlease.toml";

fn env_path(name: &str) -> PathBuf {
    let p = PathBuf::from(std::env::var_os(name).unwrap_or_else(|| panic!("{name} is not set: run make test-update")));
    assert!(p.exists(), "{} does not exist", p.display());
    p
}

struct UpdateBox {
    net: OneBoxLan,
    ssh: Ssh,
    vm: Vm,
    dir: tempfile::TempDir,
}

impl UpdateBox {
    fn boot(name: &str) -> UpdateBox {
        let net = one_box_lan();
        net.lan.ns.ip(&format!("addr add {ADMIN_HOST} dev {}", net.lan.bridge));
        let ssh = Ssh::new();
        let site = one_box_site().file("authorized_keys", &ssh.authorized_keys());
        let mut vm = Vm::start(name, &image(), Some(&site), Boot::Uefi, &net.host, &[&net.tap]);
        vm.wait_console("twinlease-boot: system=", BOOT_LIMIT);
        ssh.wait(&net.lan.ns, BOX, Duration::from_secs(120));
        let dir = tempfile::Builder::new().prefix("tl-update-").tempdir().unwrap();
        UpdateBox { net, ssh, vm, dir }
    }

    /// Runs `command` as admin; returns (success, stdout + stderr).
    fn admin(&self, command: &str) -> (bool, String) {
        let out = self.ssh.run(&self.net.lan.ns, BOX, command);
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    }

    fn admin_ok(&self, command: &str) -> String {
        let (ok, text) = self.admin(command);
        assert!(ok, "{command}: {text}");
        text
    }

    fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.admin_ok("twinlease update status --json")).unwrap()
    }

    /// The lease table (address, hardware address, state), sorted: what an update must keep.
    /// Read through the control socket (the admin group's): the admin may not open the
    /// database beside the daemon (its directory is the service user's).
    fn leases(&self) -> Vec<(String, String, String)> {
        lease_table(&self.ssh, &self.net.lan, BOX)
    }

    fn lease(&self) -> String {
        lease_within(&self.net.lan, 0, self.dir.path(), Duration::from_secs(120))
    }

    fn upload(&self, file: &Path, name: &str) -> Duration {
        let start = Instant::now();
        self.ssh.copy(&self.net.lan.ns, BOX, file, name);
        start.elapsed()
    }
}

fn release(b: &UpdateBox) -> String {
    b.admin_ok("cat /usr/lib/twinlease/release").trim().to_string()
}

/// A machine type other than `arch` with a name as long: the bad-bundle cases rewrite the
/// header in place on the box, so a correctly signed bundle for it must keep the header's length.
fn another_arch(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "armv7l",
        Arch::Aarch64 => "riscv64",
    }
}

/// The size of payload `name` in `bundle`'s manifest.
fn payload_size(bundle: &[u8], name: &str) -> u64 {
    let len = u32::from_be_bytes(bundle[19..23].try_into().unwrap()) as usize;
    let manifest = String::from_utf8_lossy(&bundle[23..23 + len]).to_string();
    let line = manifest.lines().find_map(|l| l.strip_prefix(&format!("payload {name} ")));
    line.and_then(|l| l.split_whitespace().next()?.parse().ok()).unwrap_or_else(|| panic!("no {name} in {manifest}"))
}

/// `printf` octal escapes for `bytes` (the box's shell writes them with dd).
fn octal(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\{b:03o}")).collect()
}

#[test]
#[ignore = "boots the firmware image: make test-update"]
fn bad_bundles_are_refused_then_a_newer_one_boots_marked_good_with_the_leases_kept() {
    let bundle_path = env_path("TWINLEASE_BUNDLE");
    let mut b = UpdateBox::boot("update");
    let key = Key::existing(&env_path("TWINLEASE_BUNDLE_KEY"), b.dir.path());
    let ip = b.lease();
    let leases = b.leases();
    assert!(leases.iter().any(|l| l.0 == ip), "{ip} not in {leases:?}");
    let old = release(&b);
    let s = b.status();
    assert_eq!((s["booted"].as_str(), s["slots"][0]["state"].as_str()), (Some("a"), Some("good")), "{s}");
    let site_folder = esp_folder_sha256(&b.vm.disk(), "twinlease");

    let upload = b.upload(&bundle_path, "new.bundle");
    let good = std::fs::read(&bundle_path).unwrap();
    eprintln!("update: bundle {} bytes uploaded in {upload:.1?}", good.len());
    let header_len = 23 + u32::from_be_bytes(good[19..23].try_into().unwrap()) as usize + 64;
    let dir = b.dir.path().to_path_buf();
    let other = another_arch(Arch::of(&image()));
    let wrong_arch = common::bundle::for_arch(&good, other, &key, &dir);
    assert_eq!(wrong_arch.len(), good.len(), "{other}: the header keeps its length");
    let for_other = format!("the bundle is for {other}");
    let flipped = common::bundle::flip_signature_bit(&good);
    let disk = b.vm.disk();
    let before = (partition_sha256(&disk, "root-b"), partition_sha256(&disk, "esp"));
    // Each case rewrites the uploaded bundle in place, runs install, and restores it.
    let put_header = |bytes: &[u8]| {
        format!(
            "printf '{}' | dd of=new.bundle bs={header_len} count=1 conv=notrunc status=none",
            octal(&bytes[..header_len])
        )
    };
    let cases = [
        ("bad signature", put_header(&flipped), "bad signature", put_header(&good)),
        ("wrong architecture", put_header(&wrong_arch), for_other.as_str(), put_header(&good)),
        (
            "truncated",
            "tail -c 1 new.bundle > last && truncate -s -1 new.bundle".to_string(),
            "truncated bundle",
            "cat last >> new.bundle".to_string(),
        ),
    ];
    for (case, spoil, says, restore) in cases {
        b.admin_ok(&spoil);
        let (ok, text) = b.admin("twinlease update install new.bundle");
        assert!(!ok && text.contains(says), "{case}: {text}");
        b.admin_ok(&restore);
        eprintln!("update: {case}: {}", text.trim());
    }
    b.admin_ok("sync");
    assert_eq!(
        (partition_sha256(&disk, "root-b"), partition_sha256(&disk, "esp")),
        before,
        "a refused bundle wrote slot b or the ESP"
    );

    // The good one, rebooting into it, while the box keeps serving: a client gets its lease
    // again while the bundle is being checked and written.
    let mark = b.vm.console_len();
    let started = Instant::now();
    let (out, renewed_during_install) = std::thread::scope(|scope| {
        let install = scope.spawn(|| b.admin("twinlease update install new.bundle --reboot"));
        assert_eq!(b.lease(), ip);
        let during = !install.is_finished();
        (install.join().unwrap(), during)
    });
    eprintln!("update: install: {} ({:.1?})", out.1.trim(), started.elapsed());
    assert!(out.1.contains("written and read back"), "{}", out.1);
    assert!(renewed_during_install, "the client's renewal finished only after the install");
    let rebooted = Instant::now();
    let mark = b.vm.cold_start_after_restart(mark, Duration::from_secs(300));
    let (line, at) = b.vm.wait_console_after(mark, "twinlease-update: slot b (", BOOT_LIMIT);
    assert!(line.contains("on trial"), "{line}");
    let (line, _) = b.vm.wait_console_after(at, "marked good", BOOT_LIMIT);
    eprintln!("update: reboot to marked good: {:.1?} ({line})", rebooted.elapsed());
    b.ssh.wait(&b.net.lan.ns, BOX, Duration::from_secs(120));
    let new = release(&b);
    assert_ne!(new, old);
    assert!(line.contains(&new), "{line} does not name {new}");
    let s = b.status();
    assert_eq!((s["booted"].as_str(), s["slots"][1]["state"].as_str()), (Some("b"), Some("good")), "{s}");
    assert!(s["rollback"].is_null(), "{s}");
    assert_eq!(b.leases(), leases, "the lease table changed across the update");
    assert_eq!(b.lease(), ip, "the client's address changed across the update");
    assert_eq!(esp_folder_sha256(&disk, "twinlease"), site_folder, "the update wrote the site folder");
    assert_esp_has_room_for_the_next_install(&b, &good);
}

/// The next install (back into slot a) writes its kernel and initrd beside slot a's before
/// renaming them over, so after an update the ESP must still hold another pair of `bundle`'s
/// (arm64 kernels are uncompressed: the aarch64 image's ESP is the larger for it).
fn assert_esp_has_room_for_the_next_install(b: &UpdateBox, bundle: &[u8]) {
    let statfs = b.admin_ok("stat -f -c '%a %S' /efi");
    let (blocks, block) = statfs.trim().split_once(' ').unwrap();
    let free = blocks.parse::<u64>().unwrap() * block.parse::<u64>().unwrap();
    let pair = payload_size(bundle, "kernel") + payload_size(bundle, "initrd");
    eprintln!("update: ESP free after the update {free} bytes, a kernel and initrd {pair} bytes");
    assert!(free > pair, "the ESP has {free} bytes free, the next install needs {pair}");
}

#[test]
#[ignore = "boots the firmware image: make test-update"]
fn a_broken_build_is_tried_three_times_then_the_old_slot_boots_and_says_so() {
    let broken = env_path("TWINLEASE_BROKEN_BUNDLE");
    let mut b = UpdateBox::boot("rollback");
    let ip = b.lease();
    let leases = b.leases();
    let site = b.admin_ok(&format!("sha256sum {CONFIG}"));
    let site_folder = esp_folder_sha256(&b.vm.disk(), "twinlease");
    let old = release(&b);
    b.upload(&broken, "broken.bundle");
    let mark = b.vm.console_len();
    let started = Instant::now();
    let (_, text) = b.admin("twinlease update install broken.bundle --reboot");
    eprintln!("rollback: install: {}", text.trim());
    let mut at = mark;
    for n in 1..=3 {
        let (line, next) = b.vm.wait_console_after(at, &format!("on trial: boot {n} of 3"), BOOT_LIMIT);
        let (why, next) = b.vm.wait_console_after(next, "UNHEALTHY", Duration::from_secs(600));
        eprintln!("rollback: {:.1?}: {line} / {why}", started.elapsed());
        // The box reboots itself; the test powers it off and on at each reset (see
        // Vm::cold_start_if_restarted): boot counting lives in the entry's name on the ESP.
        at = b.vm.cold_start_after_restart(next, Duration::from_secs(300));
    }
    let (line, _) = b.vm.wait_console_after(at, "ROLLBACK: slot b", BOOT_LIMIT);
    eprintln!("rollback: install to rolled back: {:.1?} ({line})", started.elapsed());
    b.ssh.wait(&b.net.lan.ns, BOX, Duration::from_secs(120));
    assert_eq!(release(&b), old);
    let s = b.status();
    assert_eq!((s["booted"].as_str(), s["next_boot"].as_str()), (Some("a"), Some("a")), "{s}");
    assert_eq!(
        (s["rollback"]["from_slot"].as_str(), s["rollback"]["failed_boots"].as_u64()),
        (Some("b"), Some(3)),
        "{s}"
    );
    let human = b.admin_ok("twinlease update status");
    assert!(human.contains("ROLLBACK: slot b"), "{human}");
    assert_eq!(b.admin_ok(&format!("sha256sum {CONFIG}")), site);
    assert_eq!(esp_folder_sha256(&b.vm.disk(), "twinlease"), site_folder, "the site folder changed");
    assert_eq!(b.leases(), leases, "the lease table changed across the failed update");
    assert_eq!(b.lease(), ip);
}

#[test]
#[ignore = "boots the firmware image: make test-update"]
fn a_power_cut_while_the_slot_is_written_leaves_the_old_slot_booting_and_a_new_install_works() {
    let bundle_path = env_path("TWINLEASE_BUNDLE");
    let mut b = UpdateBox::boot("powercut");
    let old = release(&b);
    b.upload(&bundle_path, "new.bundle");
    b.admin_ok("sync");
    // The install's first line comes after the check pass, when the writing starts.
    let mut install = b
        .net
        .lan
        .ns
        .cmd("ssh")
        .args(b.ssh.options())
        .arg(format!("admin@{BOX}"))
        .arg("twinlease update install new.bundle")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(install.stdout.take().unwrap()), &mut first).unwrap();
    assert!(first.contains("check out"), "{first}");
    std::thread::sleep(Duration::from_secs(2));
    let mark = b.vm.console_len();
    b.vm.power_cut();
    let _ = install.kill();
    let _ = install.wait();
    eprintln!("powercut: cut 2 s into the write ({})", first.trim());
    b.vm.power_on_again();
    let (line, _) = b.vm.wait_console_after(mark, "twinlease-update: slot a (", BOOT_LIMIT);
    assert!(line.contains("not on trial"), "{line}");
    b.ssh.wait(&b.net.lan.ns, BOX, Duration::from_secs(120));
    assert_eq!(release(&b), old);
    let s = b.status();
    assert_eq!((s["booted"].as_str(), s["next_boot"].as_str()), (Some("a"), Some("a")), "{s}");
    assert!(s["slots"][1]["entry"].is_null(), "a half-written slot b has a boot entry: {s}");
    let out = b.admin_ok("twinlease update install new.bundle");
    assert!(out.contains("written and read back"), "{out}");
    let s = b.status();
    assert_eq!((s["next_boot"].as_str(), s["slots"][1]["state"].as_str()), (Some("b"), Some("trying")), "{s}");
}

/// DHCP clients on the pair's LAN while it is updated: one renewing its address every 2 s,
/// and a new client every second (DISCOVER, REQUEST, then RELEASE, so the pool never runs dry;
/// hardware addresses cycle through 60). Each retransmits every second, as `udhcpc -T 1`
/// does; what counts is how long each exchange waited for its answer.
struct ClientLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Vec<common::client::Waited>>>,
}

/// Bound on each load loop (a roll takes minutes under TCG; this is hours at one a second).
const MAX_EXCHANGES: usize = 10_000;
const GIVE_UP: Duration = Duration::from_secs(60);

impl ClientLoad {
    fn start(lan: &common::Switch) -> ClientLoad {
        use common::client::RawClient;
        use dhcproto::v4::{DhcpOption, MessageType};
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let client = |n: usize, hw: [u8; 6]| {
            let (ns, iface) = lan.client(n);
            let c = RawClient::new(ns, iface, hw);
            c.sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            c
        };
        let renewing = client(0, [0x02, 0x52, 0, 0, 0, 1]);
        let stopped = stop.clone();
        let renewer = std::thread::spawn(move || {
            let mut out = Vec::new();
            let (w, offer) = renewing.exchange_retrying(
                "discover",
                &renewing.request(MessageType::Discover, vec![], 1),
                1,
                MessageType::Offer,
                GIVE_UP,
            );
            out.push(w);
            let ip = offer.expect("the renewing client's first OFFER").yiaddr();
            let mut xid = 2;
            let mut next = Instant::now();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) && out.len() < MAX_EXCHANGES {
                let request = renewing.request(MessageType::Request, vec![DhcpOption::RequestedIpAddress(ip)], xid);
                out.push(renewing.exchange_retrying("renew", &request, xid, MessageType::Ack, GIVE_UP).0);
                xid += 1;
                next += Duration::from_secs(2);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            out
        });
        let mut newcomer = client(1, [0x02, 0x4e, 0, 0, 0, 0]);
        let stopped = stop.clone();
        let newcomers = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut next = Instant::now();
            for n in 0u32.. {
                if stopped.load(std::sync::atomic::Ordering::Relaxed) || out.len() >= MAX_EXCHANGES {
                    break;
                }
                newcomer.hw[5] = (n % 60) as u8;
                let xid = 0x4e00_0000 + n;
                let discover = newcomer.request(MessageType::Discover, vec![], xid);
                let (w, offer) = newcomer.exchange_retrying("discover", &discover, xid, MessageType::Offer, GIVE_UP);
                out.push(w);
                if let Some(offer) = offer.filter(|m| m.opts().msg_type() == Some(MessageType::Offer)) {
                    let server = out.last().unwrap().answer.unwrap().1;
                    let opts =
                        vec![DhcpOption::RequestedIpAddress(offer.yiaddr()), DhcpOption::ServerIdentifier(server)];
                    let request = newcomer.request(MessageType::Request, opts, xid);
                    let (w, ack) = newcomer.exchange_retrying("request", &request, xid, MessageType::Ack, GIVE_UP);
                    out.push(w);
                    if let Some(ack) = ack.filter(|m| m.opts().msg_type() == Some(MessageType::Ack)) {
                        newcomer.release(ack.yiaddr(), server, xid);
                    }
                }
                next += Duration::from_secs(1);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            out
        });
        ClientLoad { stop, threads: vec![renewer, newcomers] }
    }

    fn stop(self) -> Vec<common::client::Waited> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
    }
}

/// What `twinlease ctl status-get` says on box `host`, as admin.
fn box_status(ssh: &Ssh, lan: &common::Switch, host: &str) -> Option<serde_json::Value> {
    let out = ssh.run(&lan.ns, host, &format!("twinlease ctl -c {CONFIG} status-get --json"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(v["arguments"].clone())
}

fn slots_of(ssh: &Ssh, lan: &common::Switch, host: &str) -> Option<serde_json::Value> {
    let out = ssh.run(&lan.ns, host, "twinlease update status --json");
    serde_json::from_slice(&out.stdout).ok()
}

fn lease_table(ssh: &Ssh, lan: &common::Switch, host: &str) -> Vec<(String, String, String)> {
    let out = ssh.run(&lan.ns, host, &format!("twinlease ctl -c {CONFIG} lease-list --json"));
    let response: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = response["arguments"]["leases"].as_array().unwrap_or_else(|| panic!("{response}"));
    let field = |r: &serde_json::Value, k: &str| r[k].as_str().map(str::to_string).unwrap_or_else(|| r[k].to_string());
    let mut out: Vec<_> = rows.iter().map(|r| (field(r, "address"), field(r, "hw"), field(r, "state"))).collect();
    out.sort();
    out
}

#[test]
#[ignore = "boots the firmware image: make test-update"]
fn a_pair_is_updated_box_by_box_with_every_client_answered_within_4_s() {
    use common::image_pair::*;
    let bundle_path = env_path("TWINLEASE_BUNDLE");
    let ssh = Ssh::new();
    let p = ImagePair::new(2, |site| site.file("authorized_keys", &ssh.authorized_keys()));
    let mut vms = [p.boot(0, Boot::Uefi), p.boot(1, Boot::Uefi)];
    let hosts = ["198.18.0.1", "198.18.0.2"];
    for (vm, host) in vms.iter_mut().zip(hosts) {
        vm.wait_console("partner reachable", BOOT_LIMIT);
        ssh.wait(&p.lan.ns, host, Duration::from_secs(120));
    }
    let role =
        |host: &str| box_status(&ssh, &p.lan, host).and_then(|s| s["role"]["state"].as_str().map(str::to_string));
    let active =
        wait_for_every("an active box with its partner caught up", Duration::from_secs(300), SSH_EVERY, || {
            let a = hosts.iter().position(|h| role(h).as_deref() == Some("active"))?;
            let s = box_status(&ssh, &p.lan, hosts[a])?;
            let partner = &s["partner"];
            (partner["link_up"] == true && partner["in_sync"] == true && partner["unsynced"] == 0).then_some(a)
        });
    let standby = 1 - active;
    let old = ssh.run(&p.lan.ns, hosts[0], "cat /usr/lib/twinlease/release");
    let old = String::from_utf8_lossy(&old.stdout).trim().to_string();
    eprintln!(
        "pair roll: box {active} active, running {old}; both booted through UEFI {:.0?}",
        vms[0].started.elapsed()
    );

    // Started from the standby's console: the active partner drives the roll and updates the
    // standby first.
    let load = ClientLoad::start(&p.lan);
    let upload = Instant::now();
    ssh.copy(&p.lan.ns, hosts[standby], &bundle_path, "/var/lib/twinlease-bundles/new.bundle");
    eprintln!("pair roll: bundle uploaded to the standby in {:.1?}", upload.elapsed());
    // Each box restarts itself once; the test turns each restart into a cold start.
    let mut marks = [vms[0].console_len(), vms[1].console_len()];
    let started = roll_from_the_console(&ssh, &p.lan, hosts[standby]);

    // Done when both boxes run the new version from a slot marked good.
    let settled = |host: &str| {
        let s = slots_of(&ssh, &p.lan, host)?;
        let booted = s["booted"].as_str()?.to_string();
        let slot = s["slots"].as_array()?.iter().find(|x| x["slot"] == booted.as_str())?.clone();
        let version = slot["version"].as_str().filter(|v| *v != old)?.to_string();
        (slot["state"] == "good").then_some(version)
    };
    let limit = Duration::from_secs(1800);
    let mut restarts = 0;
    let versions = wait_for_every("both boxes on the new version, marked good", limit, SSH_EVERY, || {
        for (vm, mark) in vms.iter_mut().zip(marks.iter_mut()) {
            restarts += usize::from(vm.cold_start_if_restarted(mark));
        }
        let a = settled(hosts[0])?;
        let b = settled(hosts[1])?;
        Some((a, b))
    });
    let rolled = started.elapsed();
    // The tables, once the pair is in sync again.
    wait_for_every("the pair in sync after the roll", Duration::from_secs(120), SSH_EVERY, || {
        let s = box_status(&ssh, &p.lan, hosts.iter().find(|h| role(h).as_deref() == Some("active"))?)?;
        (s["partner"]["in_sync"] == true && s["partner"]["unsynced"] == 0).then_some(())
    });
    assert_eq!(restarts, 2, "each box restarts once in the roll");
    let waits = load.stop();
    // The driving box's steps, from its console.
    for line in vms[active].console_text().lines().filter(|l| l.contains("twinlease-update:")) {
        eprintln!("pair roll: box {active}: {}", line.trim());
    }
    let tables = [lease_table(&ssh, &p.lan, hosts[0]), lease_table(&ssh, &p.lan, hosts[1])];

    eprintln!(
        "pair roll: both boxes on {versions:?} {rolled:.0?} after the command; {} leases in each table",
        tables[0].len()
    );
    assert_clients_answered_within_4_s(&waits, started);
    assert_eq!(tables[0], tables[1], "the boxes' lease tables differ after the roll");
    assert!(tables[0].iter().any(|l| l.1 == "02:52:00:00:00:01"), "the renewing client's lease: {:?}", tables[0]);
}

/// Every exchange of the clients answered, none NAKed, none after more than 4 s.
fn assert_clients_answered_within_4_s(waits: &[common::client::Waited], started: Instant) {
    let longest = waits.iter().max_by_key(|w| w.waited).expect("the clients ran");
    let unanswered: Vec<_> = waits.iter().filter(|w| w.answer.is_none()).collect();
    let naks: Vec<_> =
        waits.iter().filter(|w| w.answer.is_some_and(|a| a.0 == dhcproto::v4::MessageType::Nak)).collect();
    let over_1s = waits.iter().filter(|w| w.waited > Duration::from_secs(1)).count();
    eprintln!(
        "pair roll: {} exchanges, {over_1s} waited over 1 s, the longest {:.2?} ({} at {:.0?} into the roll), {} unanswered, {} NAKs",
        waits.len(),
        longest.waited,
        longest.kind,
        longest.at.saturating_duration_since(started),
        unanswered.len(),
        naks.len(),
    );
    assert!(unanswered.is_empty() && naks.is_empty(), "unanswered {unanswered:?}, NAKs {naks:?}");
    assert!(longest.waited <= Duration::from_secs(4), "a client waited {longest:?}");
}

/// `twinlease tui` as admin over SSH on `host`, in tmux: `u`, the uploaded bundle, Enter, `y`.
/// Returns when the console says the update of the pair is under way (the roll's start).
fn roll_from_the_console(ssh: &Ssh, lan: &common::Switch, host: &str) -> Instant {
    let tmux = common::tmux::Tmux::new();
    let login = format!("admin@{host}");
    let mut argv = vec!["ip", "netns", "exec", &lan.ns.name, "ssh", "-t"];
    let options = ssh.options();
    argv.extend(options.iter().map(String::as_str));
    argv.extend([login.as_str(), "twinlease", "tui"]);
    tmux.run("console", (100, 30), &argv);
    let limit = Duration::from_secs(60);
    tmux.wait_screen("console", "the standby's console with actions", limit, |s| s.contains("u update"));
    tmux.keys("console", "u");
    let dialog = tmux.wait_screen("console", "the update dialog", limit, |s| s.contains("new.bundle"));
    eprintln!("pair roll: the standby's update dialog:\n{dialog}");
    tmux.keys("console", "Enter");
    tmux.wait_screen("console", "the confirmation", limit, |s| s.contains("Update both boxes?"));
    tmux.keys("console", "y");
    let started = Instant::now();
    let running = tmux.wait_screen("console", "the roll under way", limit, |s| s.contains("updating the pair with"));
    eprintln!("pair roll: started from the standby's console:\n{running}");
    started
}
