//! The standby promise on disk: a box that promised its partner not to become active keeps that
//! promise across a restart of its process.
//!
//! One small file in the state directory, `election-promise`, holds the kernel's boot id and
//! the CLOCK_BOOTTIME instant (milliseconds) until which this box is bound. It is written
//! (temporary file, fsync, rename, fsync of the directory) before a granted answer leaves, so a
//! grant the partner counts is always on disk.
//!
//! At start, what the file says decides how long the new process stays bound:
//! * written in this boot: until the instant it names;
//! * written in an earlier boot: every promise of that boot was given before this boot began
//!   and lasted at most T, so it has ended by boottime T;
//! * no file (first start, or a wiped state directory): nothing says what an earlier process
//!   of this boot promised, so the box stays bound for T from now.
//!
//! The writes happen on a thread of their own ([`PromiseWriter`]): an fsync on a busy disk can
//! take seconds, and the election must keep answering meanwhile. The record runs ahead of the
//! promises given (up to 2T past the latest), and a grant leaves only if the record already
//! covers it; otherwise the answer is a refusal and the record is extended for the next request.
//! A restarted process therefore may wait up to 2T longer than it strictly must, never less.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

const FILE: &str = "election-promise";
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The same id handed over by systemd (`Environment=TWINLEASE_BOOT_ID=%b` in the unit): the
/// unit's `ProcSubset=pid` hides /proc/sys from the daemon.
const BOOT_ID_VAR: &str = "TWINLEASE_BOOT_ID";

#[derive(Debug, thiserror::Error)]
pub enum PromiseError {
    #[error("cannot record the standby promise in {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error(
        "cannot read the kernel's boot id ({BOOT_ID}): {0}; under a sandbox that hides /proc/sys, set {BOOT_ID_VAR} (systemd: Environment={BOOT_ID_VAR}=%b)"
    )]
    BootId(std::io::Error),
}

/// What a starting process finds on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inherited {
    /// Written in this boot: bound until this instant (possibly past).
    ThisBoot(Duration),
    /// Written in an earlier boot (or unreadable as this boot's).
    EarlierBoot,
    /// No record at all.
    Nothing,
}

impl Inherited {
    /// Until when a process starting at `now` (boottime) stays bound, given T.
    pub fn bound_until(self, now: Duration, timeout: Duration) -> Option<Duration> {
        let until = match self {
            Inherited::ThisBoot(until) => until,
            Inherited::EarlierBoot => timeout,
            Inherited::Nothing => now + timeout,
        };
        (until > now).then_some(until)
    }
}

pub struct PromiseFile {
    path: PathBuf,
    boot_id: String,
    /// The instant last recorded in this process.
    recorded: Option<Duration>,
}

impl PromiseFile {
    pub fn new(state_dir: &Path) -> Result<PromiseFile, PromiseError> {
        let boot_id = boot_id(std::fs::read_to_string(BOOT_ID), std::env::var(BOOT_ID_VAR).ok())?;
        Ok(PromiseFile { path: state_dir.join(FILE), boot_id, recorded: None })
    }

    pub fn load(&self) -> Inherited {
        let Ok(text) = std::fs::read_to_string(&self.path) else { return Inherited::Nothing };
        let mut words = text.split_whitespace();
        match (words.next(), words.next().and_then(|ms| ms.parse::<u64>().ok())) {
            (Some(boot), Some(ms)) if boot == self.boot_id => Inherited::ThisBoot(Duration::from_millis(ms)),
            // A torn or foreign file is no evidence of a promise in this boot; but it does show
            // that a process ran here, so treat it like an earlier boot's only if it names one.
            (Some(_), Some(_)) => Inherited::EarlierBoot,
            _ => Inherited::Nothing,
        }
    }

    /// Makes sure the file says this box is bound at least until `until`, extending it by up
    /// to `slack` to spare later writes. Returns once the record is durable.
    pub fn record(&mut self, until: Duration, slack: Duration) -> Result<(), PromiseError> {
        if self.recorded.is_some_and(|r| r >= until) {
            return Ok(());
        }
        let at = until + slack;
        self.write(at)?;
        self.recorded = Some(at);
        Ok(())
    }

    /// What this process has recorded so far.
    pub fn recorded(&self) -> Option<Duration> {
        self.recorded
    }

    fn write(&self, until: Duration) -> Result<(), PromiseError> {
        let err = |source| PromiseError::Write { path: self.path.clone(), source };
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        writeln!(f, "{} {}", self.boot_id, until.as_millis()).map_err(err)?;
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(err)?;
        }
        Ok(())
    }
}

/// This boot's id from the kernel or, where /proc/sys is hidden, from systemd. Both spellings
/// (the kernel's dashed UUID, systemd's 32 hex digits) become the same word, so a process that
/// read one and a later process that read the other agree on the boot.
fn boot_id(kernel: std::io::Result<String>, handed_over: Option<String>) -> Result<String, PromiseError> {
    let normal = |s: &str| s.trim().chars().filter(|c| *c != '-').collect::<String>().to_ascii_lowercase();
    match (kernel, handed_over) {
        (Ok(id), _) => Ok(normal(&id)),
        (Err(_), Some(id)) if !normal(&id).is_empty() => Ok(normal(&id)),
        (Err(e), _) => Err(PromiseError::BootId(e)),
    }
}

/// The promise file, written on a thread of its own.
pub struct PromiseWriter {
    requests: std::sync::mpsc::Sender<Duration>,
    /// The latest instant on disk, fsynced.
    recorded: tokio::sync::watch::Receiver<Duration>,
    requested: Duration,
}

impl PromiseWriter {
    pub fn spawn(mut file: PromiseFile) -> PromiseWriter {
        let start = file.recorded().unwrap_or_default();
        let (requests, wanted) = std::sync::mpsc::channel::<Duration>();
        let (done, recorded) = tokio::sync::watch::channel(start);
        std::thread::Builder::new()
            .name("promise-writer".into())
            .spawn(move || {
                while let Ok(mut until) = wanted.recv() {
                    // Only the latest request matters.
                    while let Ok(later) = wanted.try_recv() {
                        until = until.max(later);
                    }
                    match file.record(until, Duration::ZERO) {
                        Ok(()) => {
                            done.send_replace(until);
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "standby promise not recorded; the partner gets refusals")
                        }
                    }
                }
            })
            .expect("spawn the promise writer thread");
        PromiseWriter { requests, recorded, requested: start }
    }

    /// Whether a promise until `until` is on disk; if the record does not reach `ahead` past
    /// it, asks for a longer one (so the next request finds it written).
    pub fn covers(&mut self, until: Duration, ahead: Duration) -> bool {
        let recorded = *self.recorded.borrow();
        let want = until + ahead;
        if recorded < until + ahead / 2 && self.requested < want {
            self.requested = want;
            let _ = self.requests.send(want);
        }
        recorded >= until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn the_boot_id_comes_from_the_kernel_or_from_systemd_in_one_spelling() {
        let hidden = || Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        let kernel = boot_id(Ok("5D1B6E2A-0c4f-4b8e-9a51-3f2e8d7c6b10\n".into()), None).unwrap();
        assert_eq!(kernel, "5d1b6e2a0c4f4b8e9a513f2e8d7c6b10");
        let systemd = boot_id(hidden(), Some("5d1b6e2a0c4f4b8e9a513f2e8d7c6b10".into())).unwrap();
        assert_eq!(systemd, kernel);
        let err = boot_id(hidden(), Some(" ".into())).unwrap_err().to_string();
        assert!(err.contains("Environment=TWINLEASE_BOOT_ID=%b"), "{err}");
        assert!(boot_id(hidden(), None).is_err());
    }

    #[test]
    fn what_a_starting_process_inherits() {
        assert_eq!(Inherited::ThisBoot(s(107)).bound_until(s(100), T), Some(s(107)));
        assert_eq!(Inherited::ThisBoot(s(90)).bound_until(s(100), T), None);
        assert_eq!(Inherited::EarlierBoot.bound_until(s(2), T), Some(T), "a fast reboot waits out the old boot's");
        assert_eq!(Inherited::EarlierBoot.bound_until(s(100), T), None);
        assert_eq!(Inherited::Nothing.bound_until(s(100), T), Some(s(105)));
    }

    #[test]
    fn a_record_survives_the_process_and_only_grows() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = PromiseFile::new(dir.path()).unwrap();
        assert_eq!(f.load(), Inherited::Nothing);
        f.record(s(10), T).unwrap();
        assert_eq!(PromiseFile::new(dir.path()).unwrap().load(), Inherited::ThisBoot(s(15)));
        f.record(s(12), T).unwrap();
        assert_eq!(f.load(), Inherited::ThisBoot(s(15)), "already covered: not written again");
        f.record(s(16), T).unwrap();
        assert_eq!(f.load(), Inherited::ThisBoot(s(21)));
        std::fs::write(dir.path().join(FILE), "another-boot 99999\n").unwrap();
        assert_eq!(f.load(), Inherited::EarlierBoot);
        std::fs::write(dir.path().join(FILE), "garbage").unwrap();
        assert_eq!(f.load(), Inherited::Nothing);
    }
}
