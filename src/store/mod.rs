//! The durable lease store (SQLite via rusqlite).
//!
//! WAL journal with `synchronous=FULL`: a commit is on disk when it returns, so a DHCPACK sent
//! after it survives a crash or power cut. Every write is a compare-and-swap on the row's
//! (version, owner), checked inside the same transaction as the write; a batch whose any CAS
//! fails is rolled back whole. Only the writer thread (`writer.rs`) writes; readers (the
//! `leases` command, status displays) open their own read-only connections.

pub mod file;
mod fold;
mod schema;
mod sync;
#[cfg(test)]
mod tests;
pub mod writer;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, params};

use crate::lease::{Binding, ClientKey, LeaseState, Transition};

pub use sync::{ConflictKind, ConflictRecord, StoreIdentity};
pub use writer::{Batch, StoreWriter, WriterEvent};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("lease store {path}: cannot open: {source}")]
    Open { path: PathBuf, source: rusqlite::Error },
    #[error("lease store {path}: cannot create the state directory: {source}")]
    StateDir { path: PathBuf, source: std::io::Error },
    #[error(
        "lease store {path}: written by a newer twinlease (schema {found}, this build knows {known}); upgrade twinlease or restore an older database"
    )]
    TooNew { path: PathBuf, found: i64, known: i64 },
    #[error("lease store: the disk is full; leases cannot be made durable, so no DHCPACK is sent until space is freed")]
    DiskFull,
    #[error("lease store: the database or its directory is read-only; no DHCPACK is sent until it is writable")]
    ReadOnly,
    #[error(
        "lease store: disk I/O error ({0}); the disk may be failing or read-only; no DHCPACK is sent until it is repaired"
    )]
    Io(String),
    #[error(
        "lease store: the database file is corrupt ({0}); restart twinlease to quarantine it and start a fresh one"
    )]
    Corrupt(String),
    #[error("lease store: {addr} was changed underneath (expected version {expected}); the batch was rolled back")]
    Conflict { addr: Ipv4Addr, expected: u64 },
    #[error("lease store: malformed row for {addr}")]
    BadRow { addr: Ipv4Addr },
    #[error(
        "lease store {path}: {what} while twinlease had it open; no DHCPACK is sent until the table held in memory is written to a fresh file"
    )]
    FileLost { path: PathBuf, what: String },
    #[error("lease store: the writer thread has stopped")]
    WriterGone,
    #[error("lease store: {0}")]
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        match e.sqlite_error_code() {
            Some(ErrorCode::DiskFull) => StoreError::DiskFull,
            Some(ErrorCode::ReadOnly) => StoreError::ReadOnly,
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreError::Corrupt(e.to_string()),
            Some(ErrorCode::SystemIoFailure) => StoreError::Io(e.to_string()),
            _ => StoreError::Sql(e),
        }
    }
}

/// What happened while opening: a corrupt database is moved aside, not fatal.
#[derive(Debug, Default)]
pub struct OpenReport {
    pub quarantined: Option<PathBuf>,
}

/// A binding as stored, with its sync status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBinding {
    pub binding: Binding,
    pub peer_synced_version: u64,
}

impl StoredBinding {
    pub fn synced(&self) -> bool {
        self.peer_synced_version == self.binding.version
    }
}

pub struct LeaseStore {
    conn: Connection,
    /// The file this store writes, for the identity check; `None` in memory and read-only.
    file: Option<file::DbFile>,
}

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Page cache per connection, in KiB. SQLite's default (2,000 KiB) filled up at start-up (the
/// quick check and the load read every page) and stayed, a tenth of a small box's memory budget
/// at 65,536 leases. A commit touches a few pages: the interior pages of the table stay
/// cached, and a leaf that is not comes from the kernel's page cache (instructions per lease
/// did not rise with this limit: README, "What the boxes run").
const PAGE_CACHE_KIB: i64 = 256;

fn limit_page_cache(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "cache_size", -PAGE_CACHE_KIB)
}

const COLUMNS: &str = "addr, state, owner, expires, cltt, version, term, hw, hostname, peer_synced_version, seq";

impl LeaseStore {
    /// Opens (creating if needed) the database at `path`. A file that is not a sound SQLite
    /// database is renamed to `<name>.corrupt-<unix time>` and a fresh one is created.
    pub fn open(path: &Path, now_unix: u64) -> Result<(LeaseStore, OpenReport), StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::StateDir { path: dir.to_path_buf(), source })?;
        }
        let mut report = OpenReport::default();
        let store = match Self::open_checked(path) {
            Ok(s) => s,
            Err(StoreError::Corrupt(_)) => {
                report.quarantined = Some(move_aside(path, &format!("corrupt-{now_unix}"))?);
                Self::open_checked(path)?
            }
            Err(e) => return Err(e),
        };
        Ok((store, report))
    }

    /// Writes `rows` to a new database at `path`, after moving whatever is there aside (as
    /// `<name>.lost-<unix time>`), keeping this store's identity and its partner's: the table
    /// held in memory is the good copy when the file was lost underneath a running box.
    /// Returns the new store and where the old file went, if there was one.
    pub fn rebuild(
        path: &Path,
        rows: &[StoredBinding],
        identity: StoreIdentity,
        now_unix: u64,
    ) -> Result<(LeaseStore, Option<PathBuf>), StoreError> {
        let moved = if path.exists() { Some(move_aside(path, &format!("lost-{now_unix}"))?) } else { None };
        let mut store = Self::open_checked(path)?;
        store.restore(rows, identity)?;
        Ok((store, moved))
    }

    fn open_checked(path: &Path) -> Result<LeaseStore, StoreError> {
        let conn = Connection::open(path).map_err(|source| StoreError::Open { path: path.to_path_buf(), source })?;
        let mut store = Self::setup(conn)?;
        let check: String = store.conn.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
        if check != "ok" {
            return Err(StoreError::Corrupt(check));
        }
        store.migrate(path)?;
        // The header in the file changes only at a checkpoint (WAL mode): write the id, then
        // checkpoint, so the file check below can read it from the file itself.
        store.conn.pragma_update(None, "application_id", file::APPLICATION_ID)?;
        let _ = file::checkpoint_truncate(&store.conn, BUSY_TIMEOUT);
        let opened =
            file::DbFile::open(path).map_err(|source| StoreError::StateDir { path: path.to_path_buf(), source })?;
        store.file = Some(opened);
        Ok(store)
    }

    /// A private in-memory store (tests, and the store battery).
    pub fn open_in_memory() -> Result<LeaseStore, StoreError> {
        let conn = Connection::open_in_memory()?;
        let mut s = Self::setup(conn)?;
        s.migrate(Path::new(":memory:"))?;
        Ok(s)
    }

    /// A read-only view for the `leases` command while the daemon writes.
    pub fn open_read_only(path: &Path) -> Result<LeaseStore, StoreError> {
        let conn =
            Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .map_err(|source| StoreError::Open { path: path.to_path_buf(), source })?;
        conn.busy_timeout(Duration::from_secs(2))?;
        limit_page_cache(&conn)?;
        Ok(LeaseStore { conn, file: None })
    }

    /// A read-only view of a database nobody writes (the daemon stopped cleanly: no log is
    /// left) for a reader that may not create the log index beside it, as the console unit on
    /// its read-only file system: SQLite reads the file as it stands, without locks.
    pub fn open_immutable(path: &Path) -> Result<LeaseStore, StoreError> {
        let escaped: String = path
            .to_string_lossy()
            .chars()
            .map(|c| match c {
                '%' | '?' | '#' => format!("%{:02X}", c as u32),
                c => c.to_string(),
            })
            .collect();
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        let conn = Connection::open_with_flags(format!("file:{escaped}?immutable=1"), flags)
            .map_err(|source| StoreError::Open { path: path.to_path_buf(), source })?;
        limit_page_cache(&conn)?;
        Ok(LeaseStore { conn, file: None })
    }

    /// A read-only view for a reader beside a daemon that may or may not run (`twinlease
    /// leases`, the console): read-only with locks while a log lies beside the file or the
    /// reader may create one, else immutable — a cleanly stopped store read by a user who may
    /// not write its directory (the console unit's user, an operator's own account).
    pub fn open_for_reading(path: &Path) -> Result<LeaseStore, StoreError> {
        let wal = PathBuf::from(format!("{}-wal", path.display()));
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let may_write = nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok();
        if wal.exists() || may_write { Self::open_read_only(path) } else { Self::open_immutable(path) }
    }

    fn setup(conn: Connection) -> Result<LeaseStore, StoreError> {
        // Any of these failing on a file that is not a database reports NotADatabase.
        // A commit writes whole pages to the WAL and lease rows are ~70 bytes: small pages keep
        // the bytes written (and checksummed) per lease down. Applies to new databases only.
        conn.pragma_update(None, "page_size", 1024)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // The log stays small enough for a small state partition (see `file.rs`).
        conn.pragma_update(None, "wal_autocheckpoint", file::AUTOCHECKPOINT_PAGES)?;
        conn.pragma_update(None, "journal_size_limit", file::JOURNAL_SIZE_LIMIT)?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        limit_page_cache(&conn)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        Ok(LeaseStore { conn, file: None })
    }

    /// Whether the database file is still the one this store opened, undamaged (see
    /// `file.rs`). Always fine for a store in memory.
    pub fn check_file(&self) -> Result<(), StoreError> {
        let Some(f) = &self.file else { return Ok(()) };
        f.check().map_err(|what| StoreError::FileLost { path: f.path.clone(), what })
    }

    /// Checkpoints and truncates the write-ahead log if `idle` (nothing else to do) or the
    /// file system is short of space. Returns whether the log is now empty.
    pub fn trim_wal(&self, idle: bool) -> Result<bool, StoreError> {
        let Some(f) = &self.file else { return Ok(true) };
        let empty = f.wal_bytes() == 0;
        if empty || !(idle || f.low_on_space()) {
            return Ok(empty);
        }
        Ok(file::checkpoint_truncate(&self.conn, BUSY_TIMEOUT)?)
    }

    /// Bytes of write-ahead log on disk (0 in memory).
    pub fn wal_bytes(&self) -> u64 {
        self.file.as_ref().map_or(0, file::DbFile::wal_bytes)
    }

    /// A small write that proves the store can commit again (after a full disk, say), and
    /// room for more than that write: a failed commit's checkpoint gives the log's space back,
    /// where one page fits but the next lease's commit (several pages) may not.
    pub fn probe(&mut self, now_unix: u64) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO meta (key, value) VALUES ('probe', ?1) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [now_unix as i64],
        )?;
        match &self.file {
            Some(f) if f.free_bytes().is_some_and(|free| free < file::PROBE_HEADROOM_BYTES) => {
                Err(StoreError::DiskFull)
            }
            _ => Ok(()),
        }
    }

    /// The path of the database file (None in memory).
    pub fn path(&self) -> Option<&Path> {
        self.file.as_ref().map(|f| f.path.as_path())
    }

    fn migrate(&mut self, path: &Path) -> Result<(), StoreError> {
        match schema::migrate(&mut self.conn)? {
            Ok(()) => Ok(()),
            Err(found) => Err(StoreError::TooNew { path: path.to_path_buf(), found, known: schema::CURRENT }),
        }
    }

    /// Every stored binding.
    pub fn load_all(&self) -> Result<Vec<StoredBinding>, StoreError> {
        let mut out = Vec::new();
        self.for_each_binding(|r| out.push(r))?;
        Ok(out)
    }

    /// Hands every stored binding to `f` in address order, one row at a time: loading a large
    /// table this way never holds a second copy of it.
    pub fn for_each_binding(&self, mut f: impl FnMut(StoredBinding)) -> Result<(), StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!("SELECT {COLUMNS} FROM lease ORDER BY addr"))?;
        for r in stmt.query_map([], row_to_binding)? {
            f(r??);
        }
        Ok(())
    }

    /// One page of the table for the control sockets' `lease-list`: at most `limit` bindings
    /// after `after` in address order, free ones only with `free`. The address is the rowid, so a
    /// page costs a range read, however deep into the table it starts.
    pub fn bindings_after(
        &self,
        after: Option<Ipv4Addr>,
        limit: usize,
        free: bool,
    ) -> Result<Vec<StoredBinding>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM lease WHERE addr > ?1 AND (?2 OR state != ?3) ORDER BY addr LIMIT ?4"
        ))?;
        let after = after.map_or(-1, |a| i64::from(u32::from(a)));
        let rows = stmt.query_map(params![after, free, LeaseState::Free.code(), limit as i64], row_to_binding)?;
        let mut out = Vec::with_capacity(limit.min(4096));
        for r in rows {
            out.push(r??);
        }
        Ok(out)
    }

    pub fn get(&self, addr: Ipv4Addr) -> Result<Option<StoredBinding>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!("SELECT {COLUMNS} FROM lease WHERE addr = ?1"))?;
        stmt.query_row([u32::from(addr)], row_to_binding).optional()?.transpose()
    }

    /// Applies a batch of transitions in one transaction, all or nothing.
    pub fn commit(&mut self, batch: &[&Transition]) -> Result<(), StoreError> {
        self.commit_with(batch, &[], &[])
    }

    /// Applies transitions, then sync marks (each only if its row is at that version), then
    /// conflict records, in one transaction, all or nothing.
    pub fn commit_with(
        &mut self,
        batch: &[&Transition],
        marks: &[(Ipv4Addr, u64)],
        conflicts: &[ConflictRecord],
    ) -> Result<(), StoreError> {
        // Cached BEGIN/COMMIT: this runs hundreds of times a second and re-parsing them was
        // a measurable share of a commit.
        self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        match self.apply_all(batch, marks, conflicts) {
            Ok(()) => match self.conn.prepare_cached("COMMIT")?.execute([]) {
                Ok(_) => Ok(()),
                Err(e) => {
                    self.rollback();
                    Err(e.into())
                }
            },
            Err(e) => {
                self.rollback();
                Err(e)
            }
        }
    }

    fn rollback(&self) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }

    fn apply_all(
        &self,
        batch: &[&Transition],
        marks: &[(Ipv4Addr, u64)],
        conflicts: &[ConflictRecord],
    ) -> Result<(), StoreError> {
        let tx = &self.conn;
        // Statements are taken from the cache only when used: a commit is mostly one new or one
        // renewed lease, and each cache lookup hashes and compares the statement's text.
        let mut insert = None;
        let mut update = None;
        for t in fold::fold(batch) {
            let b = t.new;
            let columns = LeaseColumns::of(b);
            let changed = if t.expect_version == 0 {
                if insert.is_none() {
                    insert = Some(tx.prepare_cached(
                        "INSERT INTO lease (addr, state, owner, expires, cltt, version, term, hw, hostname, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT(addr) DO NOTHING",
                    )?);
                }
                columns.execute(insert.as_mut().expect("prepared above"), &[])?
            } else {
                if update.is_none() {
                    update = Some(tx.prepare_cached(
                        "UPDATE lease SET state = ?2, owner = ?3, expires = ?4, cltt = ?5, version = ?6, term = ?7, hw = ?8, hostname = ?9, seq = ?10 WHERE addr = ?1 AND version = ?11 AND owner IS ?12",
                    )?);
                }
                let expect_owner = t.expect_owner.map(ClientKey::as_bytes);
                columns
                    .execute(update.as_mut().expect("prepared above"), &[&(t.expect_version as i64), &expect_owner])?
            };
            if changed != 1 {
                return Err(StoreError::Conflict { addr: b.addr, expected: t.expect_version });
            }
        }
        if !marks.is_empty() {
            let mut mark =
                tx.prepare_cached("UPDATE lease SET peer_synced_version = ?2 WHERE addr = ?1 AND version = ?2")?;
            for (addr, version) in marks {
                mark.execute(params![u32::from(*addr), *version as i64])?;
            }
        }
        Self::insert_conflicts(tx, conflicts)?;
        Ok(())
    }

    /// Records that the partner holds `addr` at `version` — only if the row is still at that
    /// version (a renew in between must stay unsynced). Returns whether it applied.
    pub fn mark_synced(&mut self, addr: Ipv4Addr, version: u64) -> Result<bool, StoreError> {
        let n = self.conn.execute(
            "UPDATE lease SET peer_synced_version = ?2 WHERE addr = ?1 AND version = ?2",
            params![u32::from(addr), version as i64],
        )?;
        Ok(n == 1)
    }
}

/// Renames the database and its -wal and -shm files to `<name>.<suffix>`; returns the new name.
fn move_aside(path: &Path, suffix: &str) -> Result<PathBuf, StoreError> {
    // Never over an earlier one (two losses within a second): `.1`, `.2`, ... after the first.
    let name = |n: u32| match n {
        0 => PathBuf::from(format!("{}.{suffix}", path.display())),
        n => PathBuf::from(format!("{}.{suffix}.{n}", path.display())),
    };
    let moved = (0..).map(name).find(|p| !p.exists()).expect("some free name");
    for part in ["", "-wal", "-shm"] {
        let from = PathBuf::from(format!("{}{part}", path.display()));
        if from.exists() {
            let to = PathBuf::from(format!("{}{part}", moved.display()));
            std::fs::rename(&from, &to).map_err(|source| StoreError::StateDir { path: from.clone(), source })?;
        }
    }
    Ok(moved)
}

fn row_to_binding(r: &rusqlite::Row<'_>) -> rusqlite::Result<Result<StoredBinding, StoreError>> {
    let addr = Ipv4Addr::from(r.get::<_, u32>(0)?);
    let state = LeaseState::from_code(r.get(1)?);
    let owner: Option<Vec<u8>> = r.get(2)?;
    let owner = match owner {
        None => Some(None),
        Some(b) => ClientKey::from_bytes(&b).map(Some),
    };
    let (Some(state), Some(owner)) = (state, owner) else {
        return Ok(Err(StoreError::BadRow { addr }));
    };
    Ok(Ok(StoredBinding {
        binding: Binding {
            addr,
            state,
            owner,
            expires: r.get::<_, i64>(3)? as u64,
            cltt: r.get::<_, i64>(4)? as u64,
            version: r.get::<_, i64>(5)? as u64,
            term: r.get::<_, i64>(6)? as u64,
            hw: r.get(7)?,
            hostname: r.get(8)?,
            seq: r.get::<_, i64>(10)? as u64,
        },
        peer_synced_version: r.get::<_, i64>(9)? as u64,
    }))
}

/// A binding as the lease table's first ten columns, in the order every statement here binds
/// them: addr, state, owner, expires, cltt, version, term, hw, hostname, seq.
pub(super) struct LeaseColumns<'a> {
    addr: u32,
    state: i64,
    owner: Option<&'a [u8]>,
    expires: i64,
    cltt: i64,
    version: i64,
    term: i64,
    hw: &'a [u8],
    hostname: Option<&'a str>,
    seq: i64,
}

impl<'a> LeaseColumns<'a> {
    pub(super) fn of(b: &'a Binding) -> Self {
        LeaseColumns {
            addr: u32::from(b.addr),
            state: b.state.code(),
            owner: b.owner.as_ref().map(ClientKey::as_bytes),
            expires: b.expires as i64,
            cltt: b.cltt as i64,
            version: b.version as i64,
            term: b.term as i64,
            hw: &b.hw,
            hostname: b.hostname.as_deref(),
            seq: b.seq as i64,
        }
    }

    /// Runs `stmt` with these ten columns as ?1..?10 and `extra` as the parameters after them.
    pub(super) fn execute(
        &self,
        stmt: &mut rusqlite::Statement<'_>,
        extra: &[&dyn rusqlite::ToSql],
    ) -> rusqlite::Result<usize> {
        let columns: [&dyn rusqlite::ToSql; 10] = [
            &self.addr,
            &self.state,
            &self.owner,
            &self.expires,
            &self.cltt,
            &self.version,
            &self.term,
            &self.hw,
            &self.hostname,
            &self.seq,
        ];
        for (i, value) in columns.iter().chain(extra).enumerate() {
            stmt.raw_bind_parameter(i + 1, value)?;
        }
        stmt.raw_execute()
    }
}
