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

/// Copies `file` from the disk's ESP into `dir`; returns the copy's path.
pub fn esp_file(disk: &Path, file: &str, dir: &Path) -> PathBuf {
    let esp = format!("{}@@{}", disk.display(), partition_offset(disk, "esp"));
    let to = dir.join(Path::new(file).file_name().unwrap());
    run(Command::new("mcopy").env("MTOOLS_SKIP_CHECK", "1").args(["-o", "-i", &esp, &format!("::{file}")]).arg(&to));
    to
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
        let mut cmd = ns.cmd("qemu-system-x86_64");
        cmd.args(["-machine", "q35", "-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "1"])
            .args(["-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
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
                    std::fs::read_to_string(esp_file(&disk, "/loader/entries/twinlease-a.conf", dir.path())).unwrap();
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
                let vars = dir.path().join("OVMF_VARS.fd");
                std::fs::copy("/usr/share/OVMF/OVMF_VARS_4M.fd", &vars).unwrap();
                cmd.arg("-drive").arg("if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd");
                cmd.arg("-drive").arg(format!("if=pflash,format=raw,unit=1,file={}", vars.display()));
            }
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("qemu.log")).unwrap())
            .spawn()
            .unwrap();
        Vm { name: name.to_string(), child, dir, console, started: Instant::now() }
    }

    pub fn console_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.console).unwrap_or_default()).to_string()
    }

    /// Waits until a console line contains `needle`; returns that line.
    pub fn wait_console(&mut self, needle: &str, limit: Duration) -> String {
        let start = Instant::now();
        loop {
            if let Some(line) = self.console_text().lines().find(|l| l.contains(needle)) {
                return line.trim_end().to_string();
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
            std::thread::sleep(Duration::from_millis(100));
        }
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

/// A byte for MAC addresses that differs between the VMs of one test process.
fn unique_byte() -> u8 {
    static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) ^ (std::process::id() as u8)
}
