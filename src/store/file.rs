//! The database file under the store: is it still the file we opened, and is its write-ahead
//! log kept small enough for a small state partition?
//!
//! A running box keeps its database open for weeks. If the file is replaced, truncated or
//! overwritten underneath it (a careless restore, a full-disk clean-up script, a failing
//! card), SQLite keeps working on its open descriptor and its cache, and the damage shows only at
//! the next start, as an empty lease table. So the writer checks the file before every commit:
//! the path must still lead to the inode it opened, and the header must still be a SQLite
//! header carrying twinlease's application id. See `docs/design.md` ("Durability").
//!
//! The WAL is checkpointed and truncated when the writer is idle and after every commit while
//! the file system is short of space, and SQLite's own checkpoint runs after
//! [`AUTOCHECKPOINT_PAGES`]; `journal_size_limit` cuts the log back whenever it restarts. The
//! log therefore stays near a megabyte, where it used to grow to several and could fill a small
//! partition beyond recovery (a checkpoint needs room to run).

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

/// Written into every database header (`PRAGMA application_id`): "TLse".
pub const APPLICATION_ID: i32 = 0x544c_7365;
/// SQLite's automatic checkpoint threshold, in pages (1 KiB each).
pub const AUTOCHECKPOINT_PAGES: u32 = 1000;
/// After a checkpoint the log file is cut back to this size when it is next reused.
pub const JOURNAL_SIZE_LIMIT: i64 = 1 << 20;
/// Below this much free space the writer checkpoints and truncates after every commit.
pub const LOW_SPACE_BYTES: u64 = 4 << 20;
/// A store that failed for want of space counts as able to commit again only with this much
/// free: a group commit of many leases writes dozens of pages to the log.
pub const PROBE_HEADROOM_BYTES: u64 = 256 << 10;

const MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// The database file as it was opened.
#[derive(Debug)]
pub struct DbFile {
    pub path: PathBuf,
    /// `<path>-wal`, SQLite's write-ahead log (made once: the writer asks for its size after
    /// every commit).
    wal: PathBuf,
    handle: File,
    dev: u64,
    ino: u64,
    /// Whether the header carried twinlease's application id when opened (it may not yet, if
    /// the checkpoint that writes it was held up by a reader; then the id is not checked).
    has_id: bool,
}

impl DbFile {
    pub fn open(path: &Path) -> std::io::Result<DbFile> {
        let handle = File::open(path)?;
        let m = handle.metadata()?;
        let mut header = [0u8; 100];
        let has_id = handle.read_exact_at(&mut header, 0).is_ok() && application_id(&header) == APPLICATION_ID;
        let wal = PathBuf::from(format!("{}-wal", path.display()));
        Ok(DbFile { path: path.to_path_buf(), wal, handle, dev: m.dev(), ino: m.ino(), has_id })
    }

    /// `Err(what happened)` if the path no longer leads to the opened file, or the file's
    /// header is no longer a twinlease database's.
    pub fn check(&self) -> Result<(), String> {
        match std::fs::metadata(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err("the file was deleted".into()),
            Err(e) => return Err(format!("cannot stat the file: {e}")),
            Ok(m) if (m.dev(), m.ino()) != (self.dev, self.ino) => {
                return Err("the file was replaced by another one".into());
            }
            Ok(_) => {}
        }
        let mut header = [0u8; 100];
        let len = self.handle.metadata().map_err(|e| format!("cannot stat the open file: {e}"))?.len();
        if len < header.len() as u64 {
            return Err(format!("the file was truncated to {len} bytes"));
        }
        self.handle.read_exact_at(&mut header, 0).map_err(|e| format!("cannot read the header: {e}"))?;
        if &header[..16] != MAGIC {
            return Err("the file was overwritten (no SQLite header)".into());
        }
        let app = application_id(&header);
        if self.has_id && app != APPLICATION_ID {
            return Err(format!("the file was overwritten (application id {app:#x}, not twinlease's)"));
        }
        let page_size = match u32::from(u16::from_be_bytes([header[16], header[17]])) {
            1 => 65536,
            n => n,
        };
        let pages = u32::from_be_bytes(header[28..32].try_into().expect("4 bytes"));
        let counter_valid = header[24..28] == header[92..96];
        if counter_valid && len < u64::from(pages) * u64::from(page_size) {
            return Err(format!("the file was truncated to {len} bytes (its header says {pages} pages)"));
        }
        Ok(())
    }

    /// Bytes of write-ahead log on disk.
    pub fn wal_bytes(&self) -> u64 {
        std::fs::metadata(&self.wal).map_or(0, |m| m.len())
    }

    /// Whether the file system holding the database is short of space.
    pub fn low_on_space(&self) -> bool {
        self.free_bytes().is_some_and(|free| free < LOW_SPACE_BYTES)
    }

    /// Bytes still free for the database's writer on its file system.
    pub fn free_bytes(&self) -> Option<u64> {
        free_bytes(self.path.parent().unwrap_or(Path::new(".")))
    }
}

fn application_id(header: &[u8; 100]) -> i32 {
    i32::from_be_bytes(header[68..72].try_into().expect("4 bytes"))
}

/// Bytes an unprivileged writer may still use on the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(s.blocks_available() * s.fragment_size())
}

/// Copies the log into the database and truncates it to zero bytes. Returns whether it
/// completed: a reader still on an older snapshot makes it give up at once rather than stall the
/// writer (the next idle moment tries again).
pub fn checkpoint_truncate(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<bool> {
    conn.busy_timeout(Duration::ZERO)?;
    let r = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get::<_, i64>(0));
    conn.busy_timeout(busy_timeout)?;
    match r {
        Ok(busy) => Ok(busy == 0),
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => Ok(false),
        Err(e) => Err(e),
    }
}
