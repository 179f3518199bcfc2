//! The firmware image (`make image`) booted under QEMU with TCG: each VM gets a copy of the disk
//! with a site directory written onto its ESP by `scripts/provision-image`, its NICs on tap
//! devices in a namespace of the test's, and its serial console in a file the test reads.
//! Readiness comes from the console (the image's boot report and provisioning lines) or from
//! the box answering DHCP, never from sleeping.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// The image under test: `make test-image` sets TWINLEASE_IMAGE.
pub fn image() -> PathBuf {
    let path = std::env::var_os("TWINLEASE_IMAGE")
        .map(PathBuf::from)
        .expect("TWINLEASE_IMAGE is not set: these tests boot the firmware image, run them with `make test-image`");
    assert!(path.exists(), "{} does not exist (make image)", path.display());
    path
}

/// The machine an image is built for, from its file name (`make image` writes
/// `twinlease-<arch>.img`): which QEMU, machine, UEFI firmware and watchdog boot it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    pub fn of(image: &Path) -> Arch {
        let name = image.file_name().unwrap_or_default().to_string_lossy();
        if name.contains("aarch64") {
            Arch::Aarch64
        } else if name.contains("x86_64") {
            Arch::X86_64
        } else {
            panic!("{}: no architecture in the name (twinlease-<arch>.img)", image.display())
        }
    }

    /// The emulator and its machine. Under TCG a Cortex-A72 boots faster than `-cpu max` (no
    /// pointer authentication or SVE to emulate); the image needs nothing newer.
    fn qemu(self) -> (&'static str, [&'static str; 4]) {
        match self {
            Arch::X86_64 => ("qemu-system-x86_64", ["-machine", "q35", "-cpu", "max"]),
            Arch::Aarch64 => ("qemu-system-aarch64", ["-machine", "virt", "-cpu", "cortex-a72"]),
        }
    }

    /// UEFI firmware code and the template of its variable store (Debian's ovmf and
    /// qemu-efi-aarch64 packages).
    fn uefi(self) -> (&'static str, &'static str) {
        match self {
            Arch::X86_64 => ("/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"),
            Arch::Aarch64 => ("/usr/share/AAVMF/AAVMF_CODE.fd", "/usr/share/AAVMF/AAVMF_VARS.fd"),
        }
    }
}

/// How the VM starts the image's slot A.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Boot {
    /// UEFI firmware (OVMF / AAVMF) runs systemd-boot from the ESP: what a box does.
    Uefi,
    /// QEMU loads the kernel, initrd and command line systemd-boot would load (taken from the
    /// image's ESP); everything after the boot loader is the same. About three times faster
    /// under TCG, so the tests in `make test` use it and one test boots through UEFI.
    KernelFromEsp,
}

/// A site directory as a technician writes it: twinlease.toml, network/*.network, secrets.
pub struct SiteDir {
    pub dir: tempfile::TempDir,
}

impl SiteDir {
    pub fn new() -> SiteDir {
        let dir = tempfile::Builder::new().prefix("tl-site-").tempdir().unwrap();
        std::fs::create_dir(dir.path().join("network")).unwrap();
        SiteDir { dir }
    }

    pub fn file(self, name: &str, text: &str) -> SiteDir {
        std::fs::write(self.dir.path().join(name), text).unwrap();
        self
    }

    /// network/`name`.network giving `iface` the address `cidr`, with `extra` lines in [Network].
    pub fn network(self, name: &str, iface: &str, cidr: &str, extra: &str) -> SiteDir {
        let text = format!("[Match]\nName={iface}\n\n[Network]\nAddress={cidr}\n{extra}\n");
        self.file(&format!("network/{name}.network"), &text)
    }

    pub fn without(self, name: &str) -> SiteDir {
        std::fs::remove_file(self.dir.path().join(name)).unwrap();
        self
    }
}

/// The disk partition `name`'s byte offset (sfdisk's view of the GPT).
fn partition_offset(disk: &Path, name: &str) -> u64 {
    let out = run(Command::new("sfdisk").arg("--json").arg(disk));
    let table: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let table = &table["partitiontable"];
    let sector = table["sectorsize"].as_u64().unwrap_or(512);
    let part = table["partitions"].as_array().unwrap().iter().find(|p| p["name"] == name);
    part.unwrap_or_else(|| panic!("no partition {name} in {}", disk.display()))["start"].as_u64().unwrap() * sector
}

/// SHA-256 of partition `name` of the disk file, read from the host (also while QEMU runs:
/// what the guest has flushed).
pub fn partition_sha256(disk: &Path, name: &str) -> String {
    let out = run(Command::new("sfdisk").arg("--json").arg(disk));
    let table: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sector = table["partitiontable"]["sectorsize"].as_u64().unwrap_or(512);
    let parts = table["partitiontable"]["partitions"].as_array().unwrap();
    let part = parts.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("no partition {name}"));
    let (start, size) = (part["start"].as_u64().unwrap() * sector, part["size"].as_u64().unwrap() * sector);
    sha256_of(&format!("tail -c +{} {} | head -c {size} | sha256sum", start + 1, disk.display()))
}

/// The digest a shell pipeline ending in `sha256sum` prints.
fn sha256_of(script: &str) -> String {
    String::from_utf8(sh(script).stdout).unwrap().split_whitespace().next().unwrap().to_string()
}

/// Copies `from` on the disk's ESP to `to` with mcopy (`flags`: `-s` for a folder, `-o` to
/// overwrite a file).
fn copy_from_esp(disk: &Path, flags: &str, from: &str, to: &Path) {
    let esp = format!("{}@@{}", disk.display(), partition_offset(disk, "esp"));
    run(Command::new("mcopy").env("MTOOLS_SKIP_CHECK", "1").args([flags, "-i", &esp, &format!("::{from}")]).arg(to));
}

/// One SHA-256 over the names and contents of every file under `folder` on the disk's ESP: the
/// site folder (configuration, keys, network files), which no update may write.
pub fn esp_folder_sha256(disk: &Path, folder: &str) -> String {
    let to = tempfile::tempdir().unwrap();
    copy_from_esp(disk, "-s", folder, to.path());
    sha256_of(&format!("cd {} && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum", to.path().display()))
}

/// Copies `file` from the disk's ESP into `dir`; returns the copy's path.
pub fn esp_file(disk: &Path, file: &str, dir: &Path) -> PathBuf {
    let to = dir.join(Path::new(file).file_name().unwrap());
    copy_from_esp(disk, "-o", file, &to);
    to
}

// ---- one box on a LAN (tests/image.rs, tests/update.rs) ----------------------------------

pub const ONE_BOX: &str = r#"[node]
name = "branch-vm"

[dhcp]
interfaces = ["eth0"]

[[subnet]]
cidr = "198.18.0.0/24"
pools = ["198.18.0.100-198.18.0.199"]
routers = ["198.18.0.1"]
dns_servers = ["198.18.0.1"]
"#;

pub fn one_box_site() -> SiteDir {
    SiteDir::new().file("twinlease.toml", ONE_BOX).network("lan", "eth0", "198.18.0.1/24", "")
}

/// A LAN (switch namespace) with one client host, and the namespace the box's QEMU runs in: its
/// tap device bridged with a cable into the LAN switch.
pub struct OneBoxLan {
    pub lan: Switch,
    pub host: Netns,
    pub tap: String,
}

pub fn one_box_lan() -> OneBoxLan {
    let mut lan = Switch::new("l");
    lan.add_client();
    let host = Netns::new("v");
    let (br, tap) = (unique("bv"), unique("tv"));
    bridge(&host, &br);
    let (inner, outer) = (unique("iv"), unique("ov"));
    lan.plug(&host, &inner, &outer);
    host.ip(&format!("link set {inner} master {br} up"));
    tap_on_bridge(&host, &tap, &br);
    OneBoxLan { lan, host, tap }
}

/// Runs udhcpc on client `n` of `lan` until it gets a lease; returns the address.
pub fn lease_within(lan: &Switch, n: usize, dir: &std::path::Path, limit: Duration) -> String {
    let (ns, iface) = lan.client(n);
    wait_for("a lease from the booted box", limit, || {
        let (out, event_file) = udhcpc_once(ns, iface, dir, &[]);
        if !out.status.success() {
            return None;
        }
        events(&event_file).into_iter().find(|e| e.reason == "bound").map(|e| e.ip)
    })
}

/// A bridge `bridge` in `ns`, up.
pub fn bridge(ns: &Netns, bridge: &str) {
    ns.ip(&format!("link add {bridge} type bridge"));
    ns.ip(&format!("link set {bridge} up"));
}

/// A tap device `tap` in `ns` (where QEMU will run), enslaved to `bridge` there.
pub fn tap_on_bridge(ns: &Netns, tap: &str, bridge: &str) {
    ns.ip(&format!("tuntap add dev {tap} mode tap"));
    ns.ip(&format!("link set {tap} master {bridge} up"));
}

pub struct Vm {
    pub name: String,
    child: Child,
    /// The QEMU command line, to power the same disk on again.
    command: Vec<std::ffi::OsString>,
    pub dir: tempfile::TempDir,
    pub console: PathBuf,
    pub started: Instant,
}

impl Vm {
    /// Boots a copy of `image` with `site` on its ESP (none: an unprovisioned box) and one NIC per
    /// tap in `ns` (eth0, eth1, … in this order).
    pub fn start(name: &str, image: &Path, site: Option<&SiteDir>, boot: Boot, ns: &Netns, taps: &[&str]) -> Vm {
        let dir = tempfile::Builder::new().prefix("tl-vm-").tempdir().unwrap();
        let disk = dir.path().join("disk.img");
        run(Command::new("cp").arg("--sparse=always").arg(image).arg(&disk));
        if let Some(site) = site {
            run(Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/provision-image"))
                .arg(&disk)
                .arg(site.dir.path())
                .stdout(Stdio::null()));
        }
        let console = dir.path().join("console.log");
        let arch = Arch::of(image);
        let (qemu, machine) = arch.qemu();
        let mut cmd = ns.cmd(qemu);
        cmd.args(machine)
            .args(["-accel", "tcg", "-m", "512", "-smp", "1"])
            .args(["-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none"])
            // Appended to, so a machine powered on again continues the same log.
            .arg("-chardev")
            .arg(format!("file,id=console,path={},append=on", console.display()))
            .args(["-serial", "chardev:console"])
            .arg("-drive")
            .arg(format!("file={},format=raw,if=virtio", disk.display()))
            // The hardware watchdog systemd's RuntimeWatchdogSec= drives.
            .args(["-device", "i6300esb"]);
        let vm_byte = unique_byte();
        for (i, tap) in taps.iter().enumerate() {
            cmd.arg("-netdev").arg(format!("tap,id=n{i},ifname={tap},script=no,downscript=no"));
            // Fixed PCI slots, so eth0/eth1 follow the order of `taps`.
            cmd.arg("-device")
                .arg(format!("virtio-net-pci,netdev=n{i},addr=0x{:x},mac=52:54:00:12:{vm_byte:02x}:{i:02x}", 0x10 + i));
        }
        match boot {
            Boot::KernelFromEsp => {
                let entry =
                    std::fs::read_to_string(esp_file(&disk, "/loader/entries/twinlease-1-a.conf", dir.path())).unwrap();
                let line = |key: &str| {
                    entry
                        .lines()
                        .find_map(|l| l.strip_prefix(key))
                        .map(str::trim)
                        .unwrap_or_else(|| panic!("no {key} in the entry"))
                };
                cmd.arg("-kernel").arg(esp_file(&disk, line("linux "), dir.path()));
                cmd.arg("-initrd").arg(esp_file(&disk, line("initrd "), dir.path()));
                cmd.args(["-append", line("options ")]);
            }
            Boot::Uefi => {
                let (code, vars_template) = arch.uefi();
                let vars = dir.path().join("efi-vars.fd");
                std::fs::copy(vars_template, &vars).unwrap();
                cmd.arg("-drive").arg(format!("if=pflash,format=raw,unit=0,readonly=on,file={code}"));
                cmd.arg("-drive").arg(format!("if=pflash,format=raw,unit=1,file={}", vars.display()));
            }
        }
        let command: Vec<std::ffi::OsString> =
            std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(ToOwned::to_owned).collect();
        let child = spawn_qemu(&command, dir.path());
        Vm { name: name.to_string(), child, command, dir, console, started: Instant::now() }
    }

    /// Powers the machine on again after [`Vm::power_cut`]: the same disk and UEFI variables,
    /// the console log continued.
    pub fn power_on_again(&mut self) {
        self.power_cut();
        self.child = spawn_qemu(&self.command, self.dir.path());
    }

    /// If the box restarted itself after console byte `*mark` (the kernel's "reboot: Restarting
    /// system"), powers it off and on instead of leaving the warm reset to the firmware, and
    /// moves `*mark` past that line. Under TCG, OVMF has taken from minutes to more than 15 to
    /// come back from a guest's warm reset (busy, nothing on the console); what the box chose
    /// to boot next lives on its ESP, which a cold start reads the same way.
    pub fn cold_start_if_restarted(&mut self, mark: &mut usize) -> bool {
        let text = self.console_text();
        let Some(at) = text.get(*mark..).and_then(|t| t.find("reboot: Restarting system")) else {
            return false;
        };
        *mark += at + "reboot: Restarting system".len();
        self.power_on_again();
        true
    }

    /// Waits for the box's own restart after console byte `from`, then powers it off and on
    /// ([`Vm::cold_start_if_restarted`]); returns the console byte after the restart.
    pub fn cold_start_after_restart(&mut self, from: usize, limit: Duration) -> usize {
        let (_, next) = self.wait_console_after(from, "reboot: Restarting system", limit);
        self.power_on_again();
        next
    }

    /// The VM's copy of the image.
    pub fn disk(&self) -> PathBuf {
        self.dir.path().join("disk.img")
    }

    /// Bytes on the console so far: a mark for [`Vm::wait_console_after`].
    pub fn console_len(&self) -> usize {
        self.console_text().len()
    }

    /// Waits for a console line containing `needle` after byte `from` (an earlier boot printed
    /// the same lines); returns the line and the byte after it.
    pub fn wait_console_after(&mut self, from: usize, needle: &str, limit: Duration) -> (String, usize) {
        let start = Instant::now();
        loop {
            let text = self.console_text();
            let tail = text.get(from..).unwrap_or("");
            if let Some(at) = tail.find(needle) {
                let line_start = tail[..at].rfind('\n').map_or(0, |i| i + 1);
                let line_end = tail[at..].find('\n').map_or(tail.len(), |i| at + i);
                return (tail[line_start..line_end].trim_end().to_string(), from + line_end);
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{}: QEMU exited ({status}) before {needle:?}:\n{}", self.name, self.tail());
            }
            assert!(
                start.elapsed() < limit,
                "{}: no {needle:?} on the console within {limit:?}:\n{}",
                self.name,
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn console_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.console).unwrap_or_default()).to_string()
    }

    /// Waits until a console line contains `needle`; returns that line.
    pub fn wait_console(&mut self, needle: &str, limit: Duration) -> String {
        self.wait_console_after(0, needle, limit).0
    }

    /// The end of the console and QEMU's own messages, for failure reports.
    pub fn tail(&self) -> String {
        let text = self.console_text();
        let lines: Vec<&str> = text.lines().collect();
        let qemu = std::fs::read_to_string(self.dir.path().join("qemu.log")).unwrap_or_default();
        format!("{}\n[qemu] {qemu}", lines[lines.len().saturating_sub(80)..].join("\n"))
    }

    /// Pulls the plug: QEMU is killed, the guest gets no chance to shut down.
    pub fn power_cut(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.power_cut();
        if std::thread::panicking() {
            eprintln!("--- console of {} ---\n{}", self.name, self.tail());
        }
    }
}

fn spawn_qemu(command: &[std::ffi::OsString], dir: &Path) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("qemu.log")).unwrap();
    Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// A byte for MAC addresses that differs between the VMs of one test process.
fn unique_byte() -> u8 {
    static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) ^ (std::process::id() as u8)
}

/// The box's admin over SSH (the site's authorized_keys), from a namespace on its LAN.
pub struct Ssh {
    key: PathBuf,
    _dir: tempfile::TempDir,
}

impl Ssh {
    pub fn new() -> Ssh {
        let dir = tempfile::Builder::new().prefix("tl-ssh-").tempdir().unwrap();
        let key = dir.path().join("id");
        run(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", "test", "-f"]).arg(&key));
        Ssh { key, _dir: dir }
    }

    /// The line for the site's authorized_keys.
    pub fn authorized_keys(&self) -> String {
        std::fs::read_to_string(self.key.with_extension("pub")).unwrap()
    }

    pub fn options(&self) -> Vec<String> {
        let mut o = vec!["-i".to_string(), self.key.display().to_string()];
        for opt in [
            "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null",
            "BatchMode=yes",
            "ConnectTimeout=20",
            // A box that reboots under a session must end it, not leave it hanging.
            "ServerAliveInterval=5",
            "ServerAliveCountMax=3",
            "LogLevel=ERROR",
        ] {
            o.extend(["-o".to_string(), opt.to_string()]);
        }
        o
    }

    /// Runs `command` as admin@`host`.
    pub fn run(&self, ns: &Netns, host: &str, command: &str) -> Output {
        ns.cmd("ssh").args(self.options()).arg(format!("admin@{host}")).arg(command).output().unwrap()
    }

    /// Waits until sshd answers (the boot report comes before it may).
    pub fn wait(&self, ns: &Netns, host: &str, limit: Duration) {
        wait_for("sshd on the box", limit, || self.run(ns, host, "true").status.success().then_some(()));
    }

    /// Copies `file` into admin's home as `name`.
    pub fn copy(&self, ns: &Netns, host: &str, file: &Path, name: &str) {
        let out = ns.cmd("scp").args(self.options()).arg(file).arg(format!("admin@{host}:{name}")).output().unwrap();
        assert!(out.status.success(), "scp {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    }
}
