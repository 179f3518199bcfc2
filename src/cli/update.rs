//! `twinlease update`: a signed bundle into the root slot that is not running, the slots' state,
//! and the two steps of boot assessment the image runs after every boot (`health`, then
//! `mark-good`). The format and the slot rules are `twinlease::update`; this file does the I/O:
//! the bundle file, the slot's partition, the ESP (mounted read-only at /efi, remounted
//! read-write only while entries change). The data partition is never opened.
//!
//! Root runs these directly; anyone else (the `admin` user over SSH) goes through
//! `/run/twinlease-update.sock`, where a socket-activated root unit runs `install`/`status` for
//! members of the admin group (image/rootfs/etc/systemd/system/twinlease-update.socket).
//! The rolling update of a pair and the partner's update port are in `update/pair.rs`.

mod pair;

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use serde_json::json;
use sha2::{Digest, Sha256};
use twinlease::config::Config;
use twinlease::server::control::client;
use twinlease::server::control::protocol::{Request, SUCCESS};
use twinlease::server::control::status::Status;
use twinlease::update::bundle::{self, Manifest, PublicKey};
use twinlease::update::roll::SlotsView;
use twinlease::update::slots::{self, Assessment, Entry, Slot, TRIES};
use twinlease::update::socket::{self as update_socket, EXIT_LINE, PROGRESS_PREFIX, SOCKET};

/// Under `--root`, where a reboot is recorded instead (`run/` of the directory).
const REBOOT_MARKER: &str = "reboot-requested";
/// The key bundles must be signed with.
const DEFAULT_KEY: &str = bundle::BOX_KEY;

#[derive(Subcommand, Clone)]
pub(crate) enum UpdateCommand {
    /// Check a bundle (signature, architecture, every payload's hash) and only then write it
    /// into the root slot that is not running, with a boot entry that has 3 tries.
    Install {
        #[arg(value_name = "BUNDLE")]
        bundle: PathBuf,
        /// Reboot into the new slot once it is written.
        #[arg(long)]
        reboot: bool,
        /// The public key (PEM) bundles must be signed with.
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
    },
    /// Both slots: version, boot assessment (good, on trial, bad), which one runs, which boots
    /// next, and a rollback if there was one.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// After boot (twinlease-update-health.service, before boot-complete.target): a slot on
    /// trial passes when twinlease is READY, its store passes SQLite's check and, in a pair,
    /// the partner holds every binding. Exit 1 if not (the unit then reboots the box).
    Health {
        #[arg(long, short, value_name = "FILE", default_value = super::DEFAULT_CONFIG)]
        config: PathBuf,
        /// How long a slot on trial has to become healthy.
        #[arg(long, value_name = "SECONDS", default_value_t = 300)]
        timeout: u64,
    },
    /// After boot-complete.target: drop the booted entry's boot counter (what systemd-bless-boot
    /// does), so the slot boots from now on.
    MarkGood,
    /// Update both boxes of a pair without a DHCP outage: the standby first (installed,
    /// rebooted, back and marked good), then this box, after handing service to the partner.
    /// On the standby, the active partner is asked to drive the roll.
    Pair {
        #[arg(value_name = "BUNDLE")]
        bundle: PathBuf,
        /// The public key (PEM) bundles must be signed with.
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
        #[arg(long, short, value_name = "FILE", default_value = super::DEFAULT_CONFIG)]
        config: PathBuf,
        /// How long each box may take to come back healthy on the new version.
        #[arg(long, value_name = "SECONDS", default_value_t = 1800)]
        timeout: u64,
    },
    /// The root side of the update socket: one request on standard input (a JSON array of
    /// arguments), the output and `exit-status N` on standard output.
    #[command(hide = true)]
    Serve,
    /// The root side of the partner's update port (src/update/peer.rs): one authenticated
    /// request on standard input, progress and the MAC'd result on standard output.
    #[command(hide = true)]
    ServePeer {
        #[arg(long, short, value_name = "FILE", default_value = super::DEFAULT_CONFIG)]
        config: PathBuf,
    },
}

/// `update` as its own parser, for the requests the socket carries.
#[derive(Parser)]
#[command(name = "twinlease update", no_binary_name = true)]
struct Request_ {
    #[command(subcommand)]
    command: UpdateCommand,
}

/// Where the box's files are: `/` on a box; a test directory with the same layout otherwise.
struct Paths {
    root: PathBuf,
}

impl Paths {
    fn esp(&self) -> PathBuf {
        self.root.join("efi")
    }
    fn entries_dir(&self) -> PathBuf {
        self.esp().join("loader/entries")
    }
    fn slot_dir(&self, slot: Slot) -> PathBuf {
        self.esp().join(format!("slot-{slot}"))
    }
    fn device(&self, slot: Slot) -> PathBuf {
        self.root.join("dev/disk/by-partlabel").join(slot.partlabel())
    }
    fn booted(&self) -> anyhow::Result<Slot> {
        let cmdline = fs::read_to_string(self.root.join("proc/cmdline")).context("reading the kernel command line")?;
        Slot::from_cmdline(&cmdline).with_context(|| format!("no root=PARTLABEL=root-a|b in {:?}", cmdline.trim()))
    }
    fn entries(&self) -> anyhow::Result<Vec<Entry>> {
        let dir = self.entries_dir();
        let names: Vec<String> = fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().and_then(|e| e.file_name().into_string().ok()))
            .collect();
        Ok(slots::entries(names.iter().map(String::as_str)))
    }
    /// The version installed in `slot`, from the manifest kept beside its kernel.
    fn version(&self, slot: Slot) -> Option<String> {
        let text = fs::read_to_string(self.slot_dir(slot).join("manifest")).ok()?;
        text.lines().find_map(|l| l.strip_prefix("version ")).map(|v| v.trim().to_string())
    }
}

pub(crate) fn dispatch(cmd: UpdateCommand, root: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let direct = root.is_some() || nix::unistd::geteuid().is_root();
    let paths = Paths { root: root.unwrap_or_else(|| PathBuf::from("/")) };
    match cmd {
        UpdateCommand::Install { bundle, reboot, key } if !direct => {
            let mut args = socket_args("install", &bundle, key.as_deref())?;
            if reboot {
                args.push("--reboot".into());
            }
            through_socket(&args)
        }
        UpdateCommand::Status { json } if !direct => {
            through_socket(&[vec!["status".to_string()], if json { vec!["--json".into()] } else { vec![] }].concat())
        }
        UpdateCommand::Install { bundle, reboot, key } => {
            let key = key.unwrap_or_else(|| paths.root.join(DEFAULT_KEY));
            install(&paths, &bundle, &key)?;
            if reboot {
                say("rebooting into the new slot");
                self::reboot(&paths)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        UpdateCommand::Pair { bundle, key, config, timeout } if !direct => {
            let mut args = socket_args("pair", &bundle, key.as_deref())?;
            // Made absolute, not canonical: the site's directory is not the admin's to walk.
            args.extend(["--config".into(), std::path::absolute(&config)?.display().to_string()]);
            args.extend(["--timeout".into(), timeout.to_string()]);
            through_socket(&args)
        }
        UpdateCommand::Pair { bundle, key, config, timeout } => {
            let key = key.unwrap_or_else(|| paths.root.join(DEFAULT_KEY));
            if pair::roll(&paths, &bundle, &key, &config, Duration::from_secs(timeout), None)?
                == pair::Outcome::RebootHere
            {
                self::reboot(&paths)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        UpdateCommand::ServePeer { config } => pair::serve_peer(&paths, &config),
        UpdateCommand::Status { json } => status(&paths, json),
        UpdateCommand::Health { config, timeout } => health(&paths, &config, Duration::from_secs(timeout)),
        UpdateCommand::MarkGood => mark_good(&paths),
        UpdateCommand::Serve => serve(&paths),
    }
}

/// Set on the socket's root side: what the caller reads also goes to the journal.
static SERVING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A progress line for the caller (and the journal on the socket's root side). A caller that
/// went away (an SSH session cut in the middle of a pair roll) must not stop the work, so a
/// failed write is ignored.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{PROGRESS_PREFIX}{line}");
    let _ = out.flush();
    if SERVING.load(std::sync::atomic::Ordering::Relaxed) {
        eprintln!("{PROGRESS_PREFIX}{line}");
    }
}

/// Reboots the box, or, for a box laid out in a directory (`--root`, as the tests run it),
/// records that it would have: the machine this runs on is not that box.
fn reboot(paths: &Paths) -> anyhow::Result<()> {
    if paths.root != Path::new("/") {
        let marker = paths.root.join("run").join(REBOOT_MARKER);
        return fs::write(&marker, b"").with_context(|| marker.display().to_string());
    }
    let status = Command::new("systemctl").arg("reboot").status()?;
    if !status.success() {
        bail!("systemctl reboot: {status}");
    }
    Ok(())
}

// ---- install ------------------------------------------------------------------------------

/// An exclusive lock on `run/NAME`, held while the file lives.
fn lock(paths: &Paths, name: &str, busy: &str) -> anyhow::Result<File> {
    let lock_path = paths.root.join("run").join(name);
    let lock = File::create(&lock_path).with_context(|| lock_path.display().to_string())?;
    if lock.try_lock().is_err() {
        bail!("{busy}");
    }
    Ok(lock)
}

fn read_key(key_path: &Path) -> anyhow::Result<PublicKey> {
    let key_text = fs::read_to_string(key_path).with_context(|| format!("reading the key {}", key_path.display()))?;
    Ok(PublicKey::from_pem(&key_text, &key_path.display().to_string())?)
}

fn open_bundle(bundle_path: &Path) -> anyhow::Result<BufReader<File>> {
    let f = File::open(bundle_path).with_context(|| format!("opening {}", bundle_path.display()))?;
    Ok(BufReader::with_capacity(1 << 20, f))
}

/// Pass 1 of an install: signature, architecture, every payload's length and hash. Nothing is
/// written.
fn check_bundle(bundle_path: &Path, key: &PublicKey) -> anyhow::Result<Manifest> {
    let started = Instant::now();
    let mut r = open_bundle(bundle_path)?;
    let manifest = bundle::read_signed_manifest(&mut r, key)?;
    bundle::check_arch(&manifest, std::env::consts::ARCH)?;
    bundle::stream_payloads(&mut r, &manifest, |_, _| Ok(()))?;
    say(&format!(
        "bundle {} ({}, {} bytes): signature, architecture and payloads check out ({:.1} s)",
        manifest.version,
        manifest.arch,
        manifest.bundle_len(),
        started.elapsed().as_secs_f64()
    ));
    Ok(manifest)
}

fn install(paths: &Paths, bundle_path: &Path, key_path: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    // One install at a time: two would write the same slot.
    let _lock = lock(paths, "twinlease-update.lock", "another update install is running")?;
    let key = read_key(key_path)?;
    // Pass 1: everything is checked before anything is written.
    let manifest = check_bundle(bundle_path, &key)?;
    let booted = paths.booted()?;
    let target = booted.other();
    let device = paths.device(target);
    let mut slot = fs::OpenOptions::new().write(true).open(&device).with_context(|| device.display().to_string())?;
    let capacity = slot.seek(SeekFrom::End(0))?;
    slot.seek(SeekFrom::Start(0))?;
    let root_size = manifest.payload("root").size;
    if root_size > capacity {
        bail!("the root payload is {root_size} bytes, slot {target} holds {capacity}");
    }
    let entries = paths.entries()?;
    let options = booted_options(paths, &entries, booted)?;
    let _esp = EspWritable::open(&paths.esp())?;
    // The target's old entries go first: a power cut from here on leaves nothing that boots a
    // half-written slot, and the running slot's entry untouched.
    for e in entries.iter().filter(|e| e.slot == target) {
        fs::remove_file(paths.entries_dir().join(&e.file))?;
    }
    sync_dir(&paths.entries_dir())?;
    let slot_dir = paths.slot_dir(target);
    fs::create_dir_all(&slot_dir)?;
    let mut kernel = File::create(slot_dir.join("vmlinuz.new"))?;
    let mut initrd = File::create(slot_dir.join("initrd.img.new"))?;
    // Pass 2 writes, hashing again: the file may have changed since pass 1.
    let write_start = Instant::now();
    let mut r = open_bundle(bundle_path)?;
    bundle::read_signed_manifest(&mut r, &key)?;
    bundle::stream_payloads(&mut r, &manifest, |name, bytes| match name {
        "root" => slot.write_all(bytes),
        "kernel" => kernel.write_all(bytes),
        _ => initrd.write_all(bytes),
    })?;
    slot.sync_all()?;
    kernel.sync_all()?;
    initrd.sync_all()?;
    drop(slot);
    read_back(&device, &manifest)?;
    let written = write_start.elapsed();
    fs::rename(slot_dir.join("vmlinuz.new"), slot_dir.join("vmlinuz"))?;
    fs::rename(slot_dir.join("initrd.img.new"), slot_dir.join("initrd.img"))?;
    write_synced(&slot_dir.join("manifest"), manifest.text.as_bytes())?;
    sync_dir(&slot_dir)?;
    let name = slots::entry_name(slots::next_generation(&entries), target, Some(TRIES));
    let tmp = paths.entries_dir().join(format!("{name}.part"));
    write_synced(&tmp, slots::entry_text(target, &manifest.version, &slots::options_for(&options, target)).as_bytes())?;
    fs::rename(&tmp, paths.entries_dir().join(&name))?;
    sync_dir(&paths.entries_dir())?;
    say(&format!(
        "slot {target}: {} written and read back in {:.1} s (total {:.1} s); entry {name}: it boots next, {TRIES} tries, then slot {booted} again",
        manifest.version,
        written.as_secs_f64(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// The running slot's kernel options, for the other slot's entry.
fn booted_options(paths: &Paths, entries: &[Entry], booted: Slot) -> anyhow::Result<String> {
    if let Some(e) = slots::booted_entry(entries, booted) {
        let text = fs::read_to_string(paths.entries_dir().join(&e.file))?;
        if let Some(o) = text.lines().find_map(|l| l.strip_prefix("options ")) {
            return Ok(o.trim().to_string());
        }
    }
    bail!("slot {booted} has no boot entry with options on the ESP")
}

/// Reads the written slot back through its hash: what boots is what was signed.
fn read_back(device: &Path, manifest: &Manifest) -> anyhow::Result<()> {
    let root = manifest.payload("root");
    let mut f = File::open(device)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = root.size;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        f.read_exact(&mut buf[..want])?;
        hash.update(&buf[..want]);
        left -= want as u64;
    }
    if hash.finalize()[..] != root.sha256[..] {
        bail!("{} reads back different from the bundle's root", device.display());
    }
    Ok(())
}

fn write_synced(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// The ESP writable for as long as this lives: remounted read-write if it is mounted
/// read-only, and back (after a sync) when dropped.
struct EspWritable {
    remounted: Option<PathBuf>,
}

impl EspWritable {
    fn open(esp: &Path) -> anyhow::Result<EspWritable> {
        let ro = nix::sys::statvfs::statvfs(esp)
            .map(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
            .unwrap_or(false);
        if !ro {
            return Ok(EspWritable { remounted: None });
        }
        let status = Command::new("mount").args(["-o", "remount,rw"]).arg(esp).status()?;
        if !status.success() {
            bail!("remounting {} read-write: {status}", esp.display());
        }
        Ok(EspWritable { remounted: Some(esp.to_path_buf()) })
    }
}

impl Drop for EspWritable {
    fn drop(&mut self) {
        if let Some(esp) = &self.remounted {
            nix::unistd::sync();
            let _ = Command::new("mount").args(["-o", "remount,ro"]).arg(esp).status();
        }
    }
}

// ---- status -------------------------------------------------------------------------------

fn status(paths: &Paths, json: bool) -> anyhow::Result<ExitCode> {
    let booted = paths.booted()?;
    let entries = paths.entries()?;
    let next = slots::next_boot(&entries).map(|e| e.slot);
    let rollback = slots::rollback(&entries, booted);
    let slot_info = |slot: Slot| {
        let entry = entries.iter().find(|e| e.slot == slot);
        (paths.version(slot), entry.map(|e| e.assessment), entry.map(|e| e.file.clone()))
    };
    if json {
        let slots_json: Vec<_> = [Slot::A, Slot::B]
            .into_iter()
            .map(|s| {
                let (version, assessment, file) = slot_info(s);
                json!({
                    "slot": s.letter(),
                    "version": version,
                    "booted": s == booted,
                    "state": assessment.map(Assessment::word),
                    "tries_left": assessment.and_then(|a| match a { Assessment::Trying { left, .. } => Some(left), _ => None }),
                    "entry": file,
                })
            })
            .collect();
        let value = json!({
            "booted": booted.letter(),
            "next_boot": next.map(Slot::letter),
            "slots": slots_json,
            "rollback": rollback.map(|e| json!({
                "from_slot": e.slot.letter(),
                "version": paths.version(e.slot),
                "failed_boots": match e.assessment { Assessment::Bad { done } => done, _ => 0 },
            })),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(ExitCode::SUCCESS);
    }
    for s in [Slot::A, Slot::B] {
        let (version, assessment, _) = slot_info(s);
        println!(
            "slot {s}: {}, {}{}{}",
            version.as_deref().unwrap_or("no version"),
            assessment.map_or_else(|| "no boot entry".to_string(), |a| a.to_string()),
            if s == booted { ", booted" } else { "" },
            if next == Some(s) { ", boots next" } else { "" },
        );
    }
    if let Some(e) = rollback {
        println!("{}", rollback_line(paths, e, booted));
    }
    Ok(ExitCode::SUCCESS)
}

/// The booted slot as the pair roll needs it (src/update/roll.rs).
fn slots_view(paths: &Paths) -> anyhow::Result<SlotsView> {
    let booted = paths.booted()?;
    let entries = paths.entries()?;
    Ok(SlotsView {
        booted: booted.letter().to_string(),
        booted_version: paths.version(booted),
        booted_state: slots::booted_entry(&entries, booted).map(|e| e.assessment.word().to_string()),
        rolled_back_from: slots::rollback(&entries, booted).and_then(|e| paths.version(e.slot)),
    })
}

fn rollback_line(paths: &Paths, e: &Entry, booted: Slot) -> String {
    let done = match e.assessment {
        Assessment::Bad { done } => done,
        _ => 0,
    };
    format!(
        "ROLLBACK: slot {} ({}) failed {done} boots; slot {booted} ({}) runs again",
        e.slot,
        paths.version(e.slot).as_deref().unwrap_or("no version"),
        paths.version(booted).as_deref().unwrap_or("no version"),
    )
}

// ---- boot assessment ----------------------------------------------------------------------

fn health(paths: &Paths, config: &Path, timeout: Duration) -> anyhow::Result<ExitCode> {
    let booted = paths.booted()?;
    let entries = paths.entries()?;
    if let Some(e) = slots::rollback(&entries, booted) {
        say(&rollback_line(paths, e, booted));
    }
    let version = paths.version(booted).unwrap_or_else(|| "no version".into());
    // The booted entry's counter was counted down before this boot: `+0-3` is the last try
    // running, not a slot that is done.
    let (left, done) = match slots::booted_entry(&entries, booted).map(|e| e.assessment) {
        Some(Assessment::Trying { left, done }) => (left, done),
        Some(Assessment::Bad { done }) => (0, done),
        _ => {
            say(&format!("slot {booted} ({version}) runs, not on trial"));
            return Ok(ExitCode::SUCCESS);
        }
    };
    say(&format!("slot {booted} ({version}) on trial: boot {done} of {}", done + left));
    let start = Instant::now();
    let verdict = loop {
        match check_health(config) {
            Check::Healthy(why) => break Ok(why),
            Check::Failed(why) => break Err(why),
            Check::Waiting(why) if start.elapsed() >= timeout => break Err(format!("{why} after {timeout:?}")),
            Check::Waiting(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    };
    match verdict {
        Ok(why) => {
            say(&format!("slot {booted} healthy after {:.0} s: {why}", start.elapsed().as_secs_f64()));
            Ok(ExitCode::SUCCESS)
        }
        Err(why) => {
            let next = if left == 0 {
                format!("slot {} boots again", booted.other())
            } else {
                format!("{left} tries left, then slot {} boots again", booted.other())
            };
            say(&format!("slot {booted} UNHEALTHY: {why}; rebooting ({next})"));
            Ok(ExitCode::FAILURE)
        }
    }
}

enum Check {
    Healthy(String),
    Waiting(String),
    Failed(String),
}

/// One look at the daemon, its store and its partner.
fn check_health(config: &Path) -> Check {
    if !config.exists() {
        return Check::Healthy("no site configuration: the boot is the check".into());
    }
    let unit = unit_state("twinlease.service");
    if unit_state("twinlease-provision.service").0 == "failed" {
        return Check::Failed("the site configuration was refused".into());
    }
    // Restart=always: three restarts on one boot is a crash loop, not a slow start.
    if unit.1 >= 3 {
        return Check::Failed(format!("twinlease.service restarted {} times", unit.1));
    }
    if unit.0 != "active" {
        return Check::Waiting(format!("twinlease.service is {}, not READY", unit.0));
    }
    let cfg = match Config::load(config) {
        Ok(c) => c,
        Err(e) => return Check::Failed(format!("{config:?}: {e}")),
    };
    let req = Request::new("status-get", serde_json::Map::new());
    let status: Status = match client::ask(&cfg.control.status_socket(), &req) {
        Ok(r) if r.result == SUCCESS => match serde_json::from_value(r.arguments.unwrap_or_default()) {
            Ok(s) => s,
            Err(e) => return Check::Failed(format!("status answer: {e}")),
        },
        Ok(r) => return Check::Waiting(format!("status: {}", r.text)),
        Err(e) => return Check::Waiting(e.to_string()),
    };
    if !status.store.can_commit {
        return Check::Waiting("the lease store cannot commit".into());
    }
    match quick_check(&cfg.lease_db_path()) {
        Ok(()) => {}
        Err(e) => return Check::Failed(format!("lease store integrity: {e}")),
    }
    match &status.partner {
        Some(p) if !p.caught_up() => Check::Waiting(format!(
            "partner not caught up (link {}, in sync {}, {} bindings unsynced)",
            p.link_up, p.in_sync, p.unsynced
        )),
        Some(_) => Check::Healthy("READY, store ok, partner caught up".into()),
        None => Check::Healthy("READY, store ok".into()),
    }
}

/// SQLite's own check of the lease database, read-only beside the running daemon.
fn quick_check(path: &Path) -> anyhow::Result<()> {
    use rusqlite::OpenFlags;
    let conn = rusqlite::Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let verdict: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
    if verdict != "ok" {
        bail!("{verdict}");
    }
    Ok(())
}

/// A unit's ActiveState and NRestarts.
fn unit_state(unit: &str) -> (String, u64) {
    let out = Command::new("systemctl").args(["show", "-p", "ActiveState", "-p", "NRestarts", unit]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default();
    let get = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)).unwrap_or("").trim().to_string();
    (get("ActiveState="), get("NRestarts=").parse().unwrap_or(0))
}

fn mark_good(paths: &Paths) -> anyhow::Result<ExitCode> {
    let booted = paths.booted()?;
    let entries = paths.entries()?;
    let Some(e) = slots::booted_entry(&entries, booted).filter(|e| e.assessment != Assessment::Good) else {
        return Ok(ExitCode::SUCCESS);
    };
    let _esp = EspWritable::open(&paths.esp())?;
    fs::rename(paths.entries_dir().join(&e.file), paths.entries_dir().join(e.good_name()))?;
    sync_dir(&paths.entries_dir())?;
    say(&format!("slot {booted} ({}) marked good", paths.version(booted).as_deref().unwrap_or("no version")));
    Ok(ExitCode::SUCCESS)
}

// ---- the update socket --------------------------------------------------------------------

fn serve(paths: &Paths) -> anyhow::Result<ExitCode> {
    SERVING.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let code = match serde_json::from_str::<Vec<String>>(&line)
        .map_err(anyhow::Error::from)
        .and_then(|args| Request_::try_parse_from(args).map_err(anyhow::Error::from))
    {
        Ok(Request_ {
            command: cmd @ (UpdateCommand::Install { .. } | UpdateCommand::Status { .. } | UpdateCommand::Pair { .. }),
        }) => {
            let root = Some(paths.root.clone());
            match dispatch(cmd, root) {
                Ok(code) => u8::from(code != ExitCode::SUCCESS),
                Err(e) => {
                    say(&format!("refused: {e:#}"));
                    1
                }
            }
        }
        Ok(_) => {
            println!("twinlease update: only install, status and pair are taken over the socket");
            2
        }
        Err(e) => {
            println!("twinlease update: {e}");
            2
        }
    };
    println!("{EXIT_LINE}{code}");
    std::io::stdout().flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `verb BUNDLE [--key KEY]` for the update socket: the root side runs elsewhere, so the paths
/// go over as full paths.
fn socket_args(verb: &str, bundle: &Path, key: Option<&Path>) -> anyhow::Result<Vec<String>> {
    let bundle = fs::canonicalize(bundle).with_context(|| bundle.display().to_string())?;
    let mut args = vec![verb.to_string(), bundle.display().to_string()];
    if let Some(key) = key {
        args.extend(["--key".into(), fs::canonicalize(key)?.display().to_string()]);
    }
    Ok(args)
}

fn through_socket(args: &[String]) -> anyhow::Result<ExitCode> {
    let mut stream = UnixStream::connect(SOCKET).with_context(|| {
        format!("{SOCKET} (not root: the update socket takes install and status from the admin group)")
    })?;
    writeln!(stream, "{}", serde_json::to_string(args)?)?;
    let mut code = 1;
    for line in BufReader::new(stream).lines() {
        let line = line?;
        match update_socket::exit_status(&line) {
            Some(c) => code = c,
            None => println!("{line}"),
        }
    }
    Ok(ExitCode::from(code))
}
