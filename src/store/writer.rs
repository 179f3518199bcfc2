//! The one thread that writes the lease store.
//!
//! Jobs arrive on a channel; the thread takes everything queued (up to a bound), applies it in
//! one transaction, commits (one fsync for the whole group) and only then runs each job's
//! after-commit action, which is how a DHCPACK is held back until its lease is durable. While one
//! group is being fsynced the next one queues up, so batches grow with load.
//!
//! If a commit fails, the group is rolled back, its actions are dropped (the ACKs are never
//! sent; clients retry) and the writer refuses further commits until the owner of the in-memory
//! state asks for a [`Job::Resync`] and rebuilds from what is really on disk.
//!
//! Before every commit the writer checks that the database file is still the one it opened
//! (`file.rs`). If it is not, nothing on disk can be trusted: the writer refuses commits,
//! reports [`WriterEvent::FileLost`], and waits for the owner to hand over its whole table in a
//! [`Job::Rebuild`], which it writes to a fresh file (retrying while that fails, e.g. on a full
//! disk); then it asks for a resync like after a failed commit.
//!
//! Whether commits succeed is published on a watch channel ([`StoreWriter::can_commit`]): a box
//! that cannot make leases durable must not hold the active role. While commits fail, the
//! writer proves recovery with a small probe write whenever it is idle.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use super::{ConflictRecord, LeaseStore, StoreError, StoreIdentity, StoredBinding};
use crate::lease::Transition;

/// Runs on the writer thread after the job's transitions are durable.
pub type AfterCommit = Box<dyn FnOnce() + Send>;

/// Everything one job makes durable together: lease changes, then sync marks (each applied
/// only if its row is still at that version), then conflict records.
#[derive(Debug, Default)]
pub struct Batch {
    pub transitions: Vec<Transition>,
    pub marks: Vec<(std::net::Ipv4Addr, u64)>,
    pub conflicts: Vec<ConflictRecord>,
}

impl Batch {
    fn len(&self) -> usize {
        self.transitions.len() + self.marks.len() + self.conflicts.len()
    }
}

pub enum Job {
    Commit {
        batch: Batch,
        after: Option<AfterCommit>,
    },
    /// Reply with everything on disk; clears the failed state.
    Resync(oneshot::Sender<Result<Vec<StoredBinding>, StoreError>>),
    /// Run a closure with the store on the writer thread (reads for status, sync marks).
    With(Box<dyn FnOnce(&mut LeaseStore) + Send>),
    /// The database file was lost: write this table (everything held in memory) to a new one.
    Rebuild(Vec<StoredBinding>),
}

/// What the writer tells its owner.
#[derive(Debug)]
pub enum WriterEvent {
    /// A commit failed and was rolled back; the in-memory state is ahead of the disk.
    Failed(StoreError),
    /// The database file was replaced, deleted, truncated or overwritten underneath the store:
    /// send the whole in-memory table in a [`Job::Rebuild`].
    FileLost(StoreError),
    /// The table was written to a fresh file (the lost one, if any, moved to `moved_to`). Commits
    /// stay refused until a resync, since changes made meanwhile were never written.
    Rebuilt { rows: usize, moved_to: Option<PathBuf> },
}

/// Counters the status display and the benchmark read.
#[derive(Debug, Default)]
pub struct WriterStats {
    pub commits: AtomicU64,
    pub transitions: AtomicU64,
    pub failures: AtomicU64,
    /// Microseconds spent in the last commit (including fsync).
    pub last_commit_us: AtomicU64,
    /// Monotonic milliseconds (since the writer started) when the loop last went round; the
    /// watchdog uses it to tell a wedged writer from an idle one.
    pub alive_ms: AtomicU64,
    pub busy: AtomicBool,
    /// Times the database file was found lost, and rebuilt from memory.
    pub files_lost: AtomicU64,
    pub rebuilds: AtomicU64,
    /// Write-ahead log checkpoints that truncated the log.
    pub wal_truncations: AtomicU64,
}

#[derive(Clone)]
pub struct StoreWriter {
    tx: mpsc::Sender<Job>,
    pub stats: Arc<WriterStats>,
    can_commit: watch::Receiver<bool>,
}

/// Largest number of jobs in one transaction; bounds commit latency under a flood.
const MAX_GROUP: usize = 2048;

/// Group commit: when jobs come in groups (more than one was waiting, now or at the last
/// commit), the thread sleeps `GROUP_WINDOW` and then takes everything queued, so one fsync
/// covers many leases (at 4,000 leases/s a 4 ms window makes one fsync cover about 20 leases,
/// for a few ms more ACK latency, which no DHCP client notices; 2 ms cost about a fifth more
/// CPU per lease, README "What the boxes run"). It sleeps rather than waiting on the channel job by
/// job: a sleeping receiver costs the senders no wake-up, and the profile at 8,000 leases/s had
/// about a third of the CPU in those wake-ups. A lone request at low load is committed at once.
const GROUP_WINDOW: Duration = Duration::from_millis(4);

/// With nothing queued for this long the writer counts as idle: it checks the file, trims the
/// log, and probes a failing store.
const IDLE_TICK: Duration = Duration::from_millis(500);

impl StoreWriter {
    /// Starts the writer thread, which owns `store` until every `StoreWriter` clone is dropped.
    pub fn spawn(
        store: LeaseStore,
        events: tokio::sync::mpsc::UnboundedSender<WriterEvent>,
    ) -> (StoreWriter, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(WriterStats::default());
        let (health_tx, can_commit) = watch::channel(true);
        let thread = Thread {
            path: store.path().map(PathBuf::from),
            store,
            events,
            stats: stats.clone(),
            health: health_tx,
            refusing: None,
            rebuild: None,
            wal_dirty: false,
        };
        let handle = std::thread::Builder::new()
            .name("lease-store".into())
            .spawn(move || thread.run(rx))
            .expect("spawn the lease store thread");
        (StoreWriter { tx, stats, can_commit }, handle)
    }

    /// Queues transitions; `after` runs once they are durable (never, if the commit fails).
    pub fn commit(&self, transitions: Vec<Transition>, after: Option<AfterCommit>) {
        self.commit_batch(Batch { transitions, ..Batch::default() }, after);
    }

    /// Queues a batch; `after` runs once it is durable (never, if the commit fails).
    pub fn commit_batch(&self, batch: Batch, after: Option<AfterCommit>) {
        // A send only fails once the thread is gone, i.e. during shutdown.
        let _ = self.tx.send(Job::Commit { batch, after });
    }

    pub async fn resync(&self) -> Result<Vec<StoredBinding>, StoreError> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Job::Resync(tx));
        rx.await.unwrap_or(Err(StoreError::WriterGone))
    }

    /// Hands the whole in-memory table over after [`WriterEvent::FileLost`].
    pub fn rebuild(&self, rows: Vec<StoredBinding>) {
        let _ = self.tx.send(Job::Rebuild(rows));
    }

    /// Queues `f` to run on the writer thread, in order with the commits around it.
    pub fn exec(&self, f: impl FnOnce(&mut LeaseStore) + Send + 'static) {
        let _ = self.tx.send(Job::With(Box::new(f)));
    }

    /// Runs `f` on the writer thread and returns its result.
    pub async fn with<T: Send + 'static>(&self, f: impl FnOnce(&mut LeaseStore) -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Job::With(Box::new(move |s| {
            let _ = tx.send(f(s));
        })));
        rx.await.ok()
    }

    /// `true` while commits succeed; `false` from a failed commit (or a lost file) until a
    /// commit or probe succeeds again.
    pub fn can_commit(&self) -> watch::Receiver<bool> {
        self.can_commit.clone()
    }
}

/// Why the writer is refusing commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// A commit failed: until the owner resyncs.
    Failed,
    /// The file was lost: until a rebuild has succeeded (and then a resync).
    FileLost,
}

struct Thread {
    /// Where the database lives (`None` in memory: no file to lose).
    path: Option<PathBuf>,
    store: LeaseStore,
    events: tokio::sync::mpsc::UnboundedSender<WriterEvent>,
    stats: Arc<WriterStats>,
    health: watch::Sender<bool>,
    refusing: Option<Refusal>,
    /// A table waiting to be written to a fresh file, with the identities read from the lost
    /// one (retried while idle until it succeeds).
    rebuild: Option<(Vec<StoredBinding>, StoreIdentity)>,
    /// Commits since the log was last truncated.
    wal_dirty: bool,
}

impl Thread {
    fn run(mut self, rx: mpsc::Receiver<Job>) {
        let started = Instant::now();
        let mut group: Vec<Job> = Vec::new();
        let mut busy = false;
        loop {
            self.stats.alive_ms.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
            match rx.recv_timeout(IDLE_TICK) {
                Ok(j) => group.push(j),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    busy = false;
                    self.idle();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            drain(&rx, &mut group);
            if busy || group.len() > 1 {
                std::thread::sleep(GROUP_WINDOW);
                drain(&rx, &mut group);
            }
            busy = group.len() > 1;
            self.stats.busy.store(true, Ordering::Relaxed);
            self.run_group(&mut group);
            self.stats.busy.store(false, Ordering::Relaxed);
        }
    }

    fn run_group(&mut self, group: &mut Vec<Job>) {
        let mut commits: Vec<(Batch, Option<AfterCommit>)> = Vec::new();
        for job in group.drain(..) {
            match job {
                Job::Commit { batch, after } => {
                    if self.refusing.is_none() {
                        commits.push((batch, after));
                    }
                }
                other => {
                    // Keep order: whatever was queued before a resync or a read is committed first.
                    self.flush(&mut commits);
                    self.run_other(other);
                }
            }
        }
        self.flush(&mut commits);
    }

    fn run_other(&mut self, job: Job) {
        match job {
            Job::Resync(reply) => {
                let r = match self.refusing {
                    Some(Refusal::FileLost) => Err(self.lost_error()),
                    _ => self.store.load_all(),
                };
                if r.is_ok() {
                    self.refusing = None;
                }
                let _ = reply.send(r);
            }
            Job::With(f) => f(&mut self.store),
            Job::Rebuild(rows) => {
                if self.refusing == Some(Refusal::FileLost) {
                    self.rebuild = Some((rows, self.store.identity()));
                    self.try_rebuild();
                }
            }
            Job::Commit { .. } => unreachable!("commits are grouped by the caller"),
        }
    }

    fn lost_error(&self) -> StoreError {
        let path = self.path.clone().unwrap_or_default();
        StoreError::FileLost { path, what: "the database file was lost".into() }
    }

    /// Commits the pending group.
    fn flush(&mut self, commits: &mut Vec<(Batch, Option<AfterCommit>)>) {
        if commits.is_empty() {
            return;
        }
        if self.refusing.is_some() {
            commits.clear();
            return;
        }
        if let Err(e) = self.store.check_file() {
            commits.clear();
            self.file_lost(e);
            return;
        }
        let all: Vec<&Transition> = commits.iter().flat_map(|(b, _)| b.transitions.iter()).collect();
        let marks: Vec<(std::net::Ipv4Addr, u64)> = commits.iter().flat_map(|(b, _)| b.marks.iter().copied()).collect();
        let conflicts: Vec<ConflictRecord> = commits.iter().flat_map(|(b, _)| b.conflicts.iter().cloned()).collect();
        let t0 = Instant::now();
        let empty = commits.iter().all(|(b, _)| b.len() == 0);
        let result = if empty { Ok(()) } else { self.store.commit_with(&all, &marks, &conflicts) };
        let n = all.len() as u64;
        match result {
            Ok(()) => {
                self.stats.last_commit_us.store(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                self.stats.transitions.fetch_add(n, Ordering::Relaxed);
                for (_, after) in commits.drain(..) {
                    if let Some(f) = after {
                        f();
                    }
                }
                self.set_can_commit(true);
                self.wal_dirty |= !empty;
                // Short of space: keep the log from growing into what is left.
                self.trim_wal(false);
            }
            Err(e) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                commits.clear();
                self.refusing = Some(Refusal::Failed);
                self.set_can_commit(false);
                if matches!(e, StoreError::DiskFull) {
                    // The log is what a full disk can give back: checkpoint and truncate it now.
                    self.trim_wal(true);
                }
                let _ = self.events.send(WriterEvent::Failed(e));
            }
        }
    }

    fn file_lost(&mut self, e: StoreError) {
        self.stats.files_lost.fetch_add(1, Ordering::Relaxed);
        self.refusing = Some(Refusal::FileLost);
        self.set_can_commit(false);
        let _ = self.events.send(WriterEvent::FileLost(e));
    }

    /// Nothing queued: notice a lost file, retry a rebuild, probe a failing store, trim the log.
    fn idle(&mut self) {
        if self.refusing != Some(Refusal::FileLost)
            && let Err(e) = self.store.check_file()
        {
            self.file_lost(e);
        }
        if self.rebuild.is_some() {
            self.try_rebuild();
        }
        if self.refusing.is_none() && !*self.health.borrow() {
            match self.store.probe(crate::clock::unix_now()) {
                Ok(()) => {
                    tracing::info!("lease store commits again");
                    self.set_can_commit(true);
                }
                Err(e) => tracing::debug!(error = %e, "lease store probe failed"),
            }
        }
        if self.wal_dirty {
            self.trim_wal(true);
        }
    }

    fn trim_wal(&mut self, idle: bool) {
        match self.store.trim_wal(idle) {
            Ok(true) => {
                if self.wal_dirty {
                    self.stats.wal_truncations.fetch_add(1, Ordering::Relaxed);
                }
                self.wal_dirty = false;
            }
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "write-ahead log checkpoint failed; retrying when idle"),
        }
    }

    fn try_rebuild(&mut self) {
        let (Some((rows, identity)), Some(path)) = (self.rebuild.take(), self.path.clone()) else { return };
        // The old connection goes first: closing it may still touch its own -wal file by name,
        // which must not be the new database's. Until the rebuild succeeds an empty store in
        // memory stands in (every commit is refused meanwhile).
        match LeaseStore::open_in_memory() {
            Ok(placeholder) => drop(std::mem::replace(&mut self.store, placeholder)),
            Err(e) => {
                tracing::error!(error = %e, "cannot rebuild the lease database; retrying");
                self.rebuild = Some((rows, identity));
                return;
            }
        }
        match LeaseStore::rebuild(&path, &rows, identity, crate::clock::unix_now()) {
            Ok((store, moved_to)) => {
                self.store = store;
                self.stats.rebuilds.fetch_add(1, Ordering::Relaxed);
                // The rebuild was a commit; but changes made while the file was lost were
                // never written, so the owner resyncs before anything else is committed.
                self.refusing = Some(Refusal::Failed);
                self.set_can_commit(true);
                let _ = self.events.send(WriterEvent::Rebuilt { rows: rows.len(), moved_to });
            }
            Err(e) => {
                tracing::error!(error = %e, path = %path.display(), "cannot write the lease table to a fresh file; retrying");
                self.rebuild = Some((rows, identity));
            }
        }
    }

    fn set_can_commit(&self, ok: bool) {
        self.health.send_if_modified(|v| std::mem::replace(v, ok) != ok);
    }
}

/// Moves what is queued into `group`, up to [`MAX_GROUP`] jobs.
fn drain(rx: &mpsc::Receiver<Job>, group: &mut Vec<Job>) {
    while group.len() < MAX_GROUP {
        match rx.try_recv() {
            Ok(j) => group.push(j),
            Err(_) => break,
        }
    }
}
