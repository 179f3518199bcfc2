//! SQLite arbiter (rusqlite): for one site or the demo, where both processes run on one host
//! and share the file. Same statements as PostgreSQL (`INSERT … ON CONFLICT … DO UPDATE …
//! WHERE … RETURNING`). Time is SQLite's `'now'` (the host's UTC clock, constant within one
//! statement), kept as 64-bit microseconds since the epoch.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::{ArbiterError, Backend, Beat, Claim, HolderRow, InitOutcome, TABLE};
use crate::election::Uuid;

const NOW_US: &str = "CAST(unixepoch('subsec') * 1000000 AS INTEGER)";

pub fn schema_sql() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {TABLE} (\n\
         \x20   utype      TEXT PRIMARY KEY,\n\
         \x20   uuid       TEXT NOT NULL,\n\
         \x20   name       TEXT NOT NULL,\n\
         \x20   endpoint   TEXT NOT NULL,\n\
         \x20   ts         INTEGER NOT NULL,\n\
         \x20   term       INTEGER NOT NULL CHECK (term >= 1),\n\
         \x20   timeout_ms INTEGER NOT NULL CHECK (timeout_ms > 0)\n\
         )"
    )
}

fn read_sql() -> String {
    format!(
        "SELECT utype, uuid, name, endpoint, term, timeout_ms, ts, ({NOW_US} - ts) / 1000, {NOW_US} - ts <= timeout_ms * 1000 FROM {TABLE} WHERE utype = ?1"
    )
}

fn heartbeat_sql() -> String {
    format!(
        "INSERT INTO {TABLE} AS h (utype, uuid, name, endpoint, ts, term, timeout_ms) \
         VALUES (?1, ?2, ?3, ?4, {NOW_US}, max(1, ?6), ?5) \
         ON CONFLICT (utype) DO UPDATE SET \
             term = max(?6, CASE WHEN h.uuid = excluded.uuid AND {NOW_US} - h.ts <= h.timeout_ms * 1000 \
                                 THEN h.term ELSE h.term + 1 END), \
             uuid = excluded.uuid, name = excluded.name, endpoint = excluded.endpoint, ts = {NOW_US} \
         WHERE h.timeout_ms = excluded.timeout_ms AND (h.uuid = excluded.uuid OR {NOW_US} - h.ts > h.timeout_ms * 1000) \
         RETURNING ts, term"
    )
}

fn open(path: &PathBuf) -> Result<Connection, ArbiterError> {
    let c = Connection::open(path).map_err(|e| ArbiterError::connect(format!("{}: {e}", path.display())))?;
    c.busy_timeout(Duration::from_millis(500)).map_err(ArbiterError::query)?;
    c.pragma_update(None, "journal_mode", "WAL").map_err(ArbiterError::query)?;
    // NORMAL: a commit reaches the WAL without an fsync. A process that dies loses nothing (the
    // WAL is in the page cache); only an OS crash can lose the last heartbeats, and that takes
    // down every process sharing this file too: their successors have new uuids and must wait
    // for the row to expire, so no two boxes can both believe they hold it. Without the fsync a
    // heartbeat no longer stalls behind the lease stores' fsyncs on a busy disk, which once held
    // a take-over for 8 s (T = 2 s).
    c.pragma_update(None, "synchronous", "NORMAL").map_err(ArbiterError::query)?;
    Ok(c)
}

fn read_on(c: &Connection, utype: &str) -> Result<Option<HolderRow>, ArbiterError> {
    let raw = c
        .prepare_cached(&read_sql())
        .map_err(ArbiterError::query)?
        .query_row(params![utype], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, i64>(5)?,
                r.get::<_, i64>(6)?,
                r.get::<_, i64>(7)?,
                r.get::<_, bool>(8)?,
            ))
        })
        .optional()
        .map_err(ArbiterError::query)?;
    match raw {
        None => Ok(None),
        Some((u, id, n, e, term, t, ts, age, live)) => super::row(u, &id, n, e, term, t, ts, age, live).map(Some),
    }
}

fn heartbeat_on(c: &Connection, claim: &Claim) -> Result<Beat, ArbiterError> {
    let r = c
        .prepare_cached(&heartbeat_sql())
        .map_err(ArbiterError::query)?
        .query_row(
            params![
                claim.utype,
                claim.uuid.to_string(),
                claim.name,
                claim.endpoint,
                claim.timeout_ms as i64,
                i64::try_from(claim.min_term).unwrap_or(i64::MAX)
            ],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
        )
        .optional()
        .map_err(ArbiterError::query)?;
    match r {
        None => Ok(Beat::NotApplied),
        Some((ts_us, term)) => Ok(Beat::Applied {
            ts_us,
            term: u64::try_from(term).map_err(|_| ArbiterError::Corrupt(format!("term {term}")))?,
        }),
    }
}

pub struct LiteBackend {
    path: PathBuf,
    conn: Arc<Mutex<Option<Connection>>>,
}

impl LiteBackend {
    /// `url` is `sqlite:///absolute/path`.
    pub fn new(url: &str) -> Result<LiteBackend, ArbiterError> {
        let path = url
            .strip_prefix("sqlite://")
            .filter(|p| p.starts_with('/'))
            .ok_or_else(|| ArbiterError::url(format!("{url:?}: expected sqlite:///absolute/path"), None))?;
        Ok(LiteBackend { path: PathBuf::from(path), conn: Arc::new(Mutex::new(None)) })
    }

    /// Runs `f` on the connection in the blocking pool. An abandoned call keeps the lock until
    /// it finishes, so later calls wait for it rather than share a connection mid-statement.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, ArbiterError> + Send + 'static,
    ) -> Result<T, ArbiterError> {
        let (path, slot) = (self.path.clone(), self.conn.clone());
        tokio::task::spawn_blocking(move || {
            let mut g = slot.lock().unwrap_or_else(|p| p.into_inner());
            if g.is_none() {
                *g = Some(open(&path)?);
            }
            let r = f(g.as_ref().expect("just set"));
            if r.is_err() {
                *g = None;
            }
            r
        })
        .await
        .map_err(ArbiterError::query)?
    }
}

impl Backend for LiteBackend {
    async fn init(&mut self, utype: &str, timeout_ms: u64) -> Result<InitOutcome, ArbiterError> {
        let utype = utype.to_string();
        self.with(move |c| {
            c.execute_batch(&schema_sql()).map_err(ArbiterError::query)?;
            let Some(row) = read_on(c, &utype)? else { return Ok(InitOutcome::Ready) };
            if row.timeout_ms == timeout_ms {
                return Ok(InitOutcome::Ready);
            }
            let n = if row.live {
                0
            } else {
                c.execute(&format!("UPDATE {TABLE} SET timeout_ms = ?2, ts = ts - ?2 * 1000 WHERE utype = ?1 AND timeout_ms = ?3 AND {NOW_US} - ts > timeout_ms * 1000"), params![utype, timeout_ms as i64, row.timeout_ms as i64]).map_err(ArbiterError::query)?
            };
            if n == 0 {
                return Err(ArbiterError::TimeoutMismatch { utype, stored_ms: row.timeout_ms, wanted_ms: timeout_ms });
            }
            Ok(InitOutcome::AdoptedTimeout { old_ms: row.timeout_ms })
        })
        .await
    }

    async fn read(&mut self, utype: &str) -> Result<Option<HolderRow>, ArbiterError> {
        let utype = utype.to_string();
        self.with(move |c| read_on(c, &utype)).await
    }

    async fn heartbeat(&mut self, claim: &Claim) -> Result<Beat, ArbiterError> {
        let claim = claim.clone();
        self.with(move |c| heartbeat_on(c, &claim)).await
    }

    async fn release(&mut self, utype: &str, uuid: Uuid) -> Result<bool, ArbiterError> {
        let (utype, uuid) = (utype.to_string(), uuid.to_string());
        self.with(move |c| {
            let n = c
                .execute(
                    &format!(
                        "UPDATE {TABLE} SET ts = {NOW_US} - (timeout_ms + 1) * 1000 WHERE utype = ?1 AND uuid = ?2"
                    ),
                    params![utype, uuid],
                )
                .map_err(ArbiterError::query)?;
            Ok(n > 0)
        })
        .await
    }

    fn reset(&mut self) {
        if let Ok(mut g) = self.conn.try_lock() {
            *g = None;
        }
    }
}
