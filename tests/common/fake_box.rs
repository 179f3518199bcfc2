//! A box's file system laid out in a directory, for `twinlease update --root`: the ESP with its
//! boot entries, the two slots as files in place of partitions, the kernel command line. What
//! systemd-boot does between boots (counting tries down) is done here by renaming the entry as
//! it would. [`UpdateSocket`] serves its update socket the way `twinlease-update.socket`
//! (Accept=yes) does on a box: one `twinlease update serve` per connection.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::BIN;
use super::bundle::Key;

pub const SLOT_BYTES: usize = 1 << 20;
pub const OPTIONS: &str = "root=PARTLABEL=root-a rootfstype=squashfs ro console=ttyS0,115200 quiet";

pub struct FakeBox {
    pub dir: tempfile::TempDir,
}

impl FakeBox {
    pub fn new() -> FakeBox {
        let dir = tempfile::Builder::new().prefix("tl-upd-").tempdir().unwrap();
        let b = FakeBox { dir };
        for d in ["efi/loader/entries", "efi/slot-a", "dev/disk/by-partlabel", "proc", "run"] {
            std::fs::create_dir_all(b.path(d)).unwrap();
        }
        std::fs::write(
            b.path("efi/loader/entries/twinlease-1-a.conf"),
            format!(
                "title twinlease 1.0 (slot a)\nlinux /slot-a/vmlinuz\ninitrd /slot-a/initrd.img\noptions {OPTIONS}\n"
            ),
        )
        .unwrap();
        std::fs::write(b.path("efi/slot-a/manifest"), "arch x86_64\nversion 1.0\n").unwrap();
        std::fs::write(b.path("dev/disk/by-partlabel/root-a"), vec![0xaa; SLOT_BYTES]).unwrap();
        std::fs::write(b.path("dev/disk/by-partlabel/root-b"), vec![0xbb; SLOT_BYTES]).unwrap();
        b.boot(OPTIONS);
        b
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// The command line the "boot loader" started the kernel with.
    pub fn boot(&self, cmdline: &str) {
        std::fs::write(self.path("proc/cmdline"), format!("{cmdline}\n")).unwrap();
    }

    pub fn update(&self, args: &[&str]) -> Output {
        Command::new(BIN).arg("update").arg("--root").arg(self.dir.path()).args(args).output().unwrap()
    }

    pub fn install(&self, bundle: &[u8], key: &Key) -> Output {
        let file = self.path("upload.bundle");
        std::fs::write(&file, bundle).unwrap();
        self.update(&["install", file.to_str().unwrap(), "--key", key.public.to_str().unwrap()])
    }

    pub fn status(&self) -> serde_json::Value {
        let out = self.update(&["status", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Every file of the ESP and the inactive slot, by path: what "nothing written" compares.
    pub fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        snapshot_into(&self.path("efi"), &mut out);
        out.insert("root-b".into(), std::fs::read(self.path("dev/disk/by-partlabel/root-b")).unwrap());
        out
    }

    pub fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path("efi/loader/entries"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// What systemd-boot does before starting an entry with tries left: count one down.
    pub fn rename_entry(&self, from: &str, to: &str) {
        let dir = self.path("efi/loader/entries");
        std::fs::rename(dir.join(from), dir.join(to)).unwrap();
    }
}

fn snapshot_into(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            snapshot_into(&p, out);
        } else {
            out.insert(p.clone(), std::fs::read(&p).unwrap());
        }
    }
}

/// The box's update socket at `run/update.sock`, served like `twinlease-update.socket`
/// (Accept=yes): each connection gets a `twinlease update --root DIR serve` of its own with
/// the connection as its standard input and output. Stops serving on drop.
pub struct UpdateSocket {
    pub path: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UpdateSocket {
    pub fn serve(b: &FakeBox) -> UpdateSocket {
        use std::os::unix::net::UnixListener;
        use std::sync::atomic::Ordering;
        let path = b.path("run/update.sock");
        let listener = UnixListener::bind(&path).unwrap();
        // Whoever runs the daemon under test may connect, as the admin group may on a box.
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (root, stopped) = (b.dir.path().to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let conn = conn.unwrap();
                let input = conn.try_clone().unwrap();
                let mut child = Command::new(BIN)
                    .arg("update")
                    .arg("--root")
                    .arg(&root)
                    .arg("serve")
                    .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(input)))
                    .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(conn)))
                    .spawn()
                    .unwrap();
                // Reaped in the background: a long request must not hold up the next one.
                std::thread::spawn(move || child.wait());
            }
        });
        UpdateSocket { path, stop, thread: Some(thread) }
    }
}

impl Drop for UpdateSocket {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Wakes the accept so the thread sees the flag.
        let _ = std::os::unix::net::UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
