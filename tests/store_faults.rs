//! The lease store failing under a running server: a full disk, a filesystem turned read-only,
//! a corrupt database file at start. The server must say so clearly, send no DHCPACK it cannot
//! make durable, never crash, and recover when the fault is gone.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

fn lan_body(bridge: &str, state_dir: &Path) -> String {
    format!(
        "[node]\nname = \"test\"\nstate_dir = \"{}\"\n[dhcp]\ninterfaces = [\"{bridge}\"]\nping_check = false\n\
         [[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.150\"]\n",
        state_dir.display()
    )
}

fn try_lease(lan: &Lan, c: usize, dir: &Path) -> Option<String> {
    let (ns, iface) = lan.client(c);
    let (out, ev) = udhcpc_once(ns, iface, dir, &["-t", "2", "-T", "1"]);
    out.status.success().then(|| events(&ev).into_iter().rev().find(|e| e.reason == "bound").unwrap().ip)
}

#[test]
fn a_full_disk_stops_acks_until_space_returns() {
    let mut lan = Lan::new("198.18.0.1/24");
    let a = lan.add_client();
    let b = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::new(dir.path(), "1m");
    let mut srv = Server::start(&lan.ns, dir.path(), &lan_body(&lan.bridge, &disk.dir.join("state")));
    assert!(try_lease(&lan, a, dir.path()).is_some(), "a lease before the disk fills");

    disk.fill();
    assert!(try_lease(&lan, b, dir.path()).is_none(), "no ACK may leave while the lease cannot be stored");
    srv.wait_until("the store to report it cannot commit", Duration::from_secs(5), |s| !s.store.can_commit);
    assert!(srv.log_text().contains("the disk is full"), "the log says why");
    assert!(srv.child.try_wait().unwrap().is_none(), "the server keeps running");

    disk.unfill();
    let ip = try_lease(&lan, b, dir.path()).expect("served again once space is back");
    let rows = srv.leases();
    assert_eq!(lease_of(&rows, &ip).unwrap()["state"], "leased");
    assert_eq!(rows.iter().filter(|r| r["state"] == "leased").count(), 2, "the first lease survived the episode");
    srv.stop();
}

/// An ext4 filesystem on a loop device, mounted with errors=remount-ro; unmounted on drop.
struct Ext4Disk {
    image: PathBuf,
    dir: PathBuf,
    dev: Option<String>,
}

impl Ext4Disk {
    fn new(parent: &Path) -> Ext4Disk {
        let image = parent.join("disk.img");
        let dir = parent.join("disk");
        std::fs::create_dir_all(&dir).unwrap();
        run(Command::new("dd").args(["if=/dev/zero", "bs=1M", "count=32"]).arg(format!("of={}", image.display())));
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image));
        let mut d = Ext4Disk { image, dir, dev: None };
        d.mount();
        d
    }

    fn mount(&mut self) {
        let out = run(Command::new("losetup").args(["-f", "--show"]).arg(&self.image));
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        run(Command::new("blockdev").args(["--setrw", &dev]));
        run(Command::new("mount").args(["-o", "errors=remount-ro", &dev]).arg(&self.dir));
        self.dev = Some(dev);
    }

    fn unmount(&mut self) {
        if let Some(dev) = self.dev.take() {
            let _ = Command::new("umount").arg(&self.dir).status();
            let _ = Command::new("losetup").args(["-d", &dev]).status();
        }
    }

    /// What ext4 does on a disk error: the filesystem turns read-only under open files.
    fn fail_read_only(&self) {
        let dev = self.dev.as_ref().unwrap();
        let name = dev.rsplit('/').next().unwrap();
        std::fs::write(format!("/sys/fs/ext4/{name}/trigger_fs_error"), "1").unwrap();
    }
}

impl Drop for Ext4Disk {
    fn drop(&mut self) {
        self.unmount();
    }
}

#[test]
fn a_filesystem_gone_read_only_stops_acks_and_a_restart_recovers() {
    let mut lan = Lan::new("198.18.0.1/24");
    let a = lan.add_client();
    let b = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let mut disk = Ext4Disk::new(dir.path());
    let cfg = lan_body(&lan.bridge, &disk.dir.join("state"));
    let mut srv = Server::start(&lan.ns, dir.path(), &cfg);
    let first = try_lease(&lan, a, dir.path()).expect("a lease before the fault");

    disk.fail_read_only();
    assert!(try_lease(&lan, b, dir.path()).is_none(), "no ACK may leave a read-only store");
    wait_for("the store error in the log", Duration::from_secs(5), || {
        let log = srv.log_text();
        (log.contains("read-only") || log.contains("disk I/O error")).then_some(())
    });
    assert!(srv.child.try_wait().unwrap().is_none(), "the server keeps running");
    srv.stop();

    // The operator repairs the disk (here: a fresh mount) and the service comes back with
    // every lease it acknowledged before the fault.
    disk.unmount();
    disk.mount();
    let srv = Server::start(&lan.ns, dir.path(), &cfg);
    assert_eq!(lease_of(&srv.leases(), &first).unwrap()["state"], "leased");
    assert!(try_lease(&lan, b, dir.path()).is_some(), "served again after the repair");
}

#[test]
fn a_corrupt_database_is_moved_aside_and_service_continues() {
    let mut lan = Lan::new("198.18.0.1/24");
    let a = lan.add_client();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("leases.db"), vec![0x5a; 8192]).unwrap();
    let srv = Server::start(&lan.ns, dir.path(), &lan_body(&lan.bridge, &state));
    assert!(srv.log_text().contains("lease database was corrupt; moved aside"), "{}", srv.log_text());
    let moved: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("leases.db.corrupt-"))
        .collect();
    assert_eq!(moved.len(), 1, "the damaged file is kept for inspection");
    assert!(try_lease(&lan, a, dir.path()).is_some());
}
