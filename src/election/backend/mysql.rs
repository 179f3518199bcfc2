//! MariaDB arbiter (mysql_async, rustls with ring). Needs MariaDB ≥ 10.5.
//!
//! UpdateHeartBeat is one statement, one round trip: `INSERT … ON DUPLICATE KEY UPDATE …
//! RETURNING`. MariaDB returns the row as it is after the statement in every case, so
//! "applied" is read from the row itself: it holds our uuid *and* its ts equals this statement's
//! `UTC_TIMESTAMP(6)` (constant for the whole statement). A row we did not write can only match
//! that if it was written by another statement of ours in the same microsecond, which is still
//! our own heartbeat. MySQL lacks RETURNING; it is not supported (see README, "Arbiter").
//!
//! MySQL evaluates `ON DUPLICATE KEY UPDATE` assignments left to right, each seeing the columns
//! already assigned. `term` is assigned first, while uuid and ts are still the old ones; the
//! condition is repeated for the later columns, and once `uuid` holds the new value it stays
//! true (an applied update) or stays false (nothing was changed), so every column agrees.

use std::path::{Path, PathBuf};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, SslOpts};

use super::{ArbiterError, Backend, Beat, Claim, HolderRow, InitOutcome, TABLE};
use crate::config::TlsMode;
use crate::election::Uuid;

pub fn schema_sql() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {TABLE} (\n\
         \x20   utype      varchar(128) NOT NULL PRIMARY KEY,\n\
         \x20   uuid       char(36) NOT NULL,\n\
         \x20   name       varchar(255) NOT NULL,\n\
         \x20   endpoint   varchar(255) NOT NULL,\n\
         \x20   ts         datetime(6) NOT NULL,\n\
         \x20   term       bigint NOT NULL CHECK (term >= 1),\n\
         \x20   timeout_ms bigint NOT NULL CHECK (timeout_ms > 0)\n\
         ) ENGINE=InnoDB"
    )
}

/// Microseconds between the row's ts and the statement's UTC time (64-bit, no overflow).
const AGE_US: &str = "TIMESTAMPDIFF(MICROSECOND, ts, UTC_TIMESTAMP(6))";
const EPOCH_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ts)";

fn read_sql() -> String {
    format!(
        "SELECT utype, uuid, name, endpoint, term, timeout_ms, {EPOCH_US}, {AGE_US} DIV 1000, {AGE_US} <= timeout_ms * 1000 FROM {TABLE} WHERE utype = ?"
    )
}

fn heartbeat_sql() -> String {
    let ok = format!("(timeout_ms = VALUES(timeout_ms) AND (uuid = VALUES(uuid) OR {AGE_US} > timeout_ms * 1000))");
    format!(
        "INSERT INTO {TABLE} (utype, uuid, name, endpoint, ts, term, timeout_ms) \
         VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6), GREATEST(1, ?), ?) \
         ON DUPLICATE KEY UPDATE \
             term = IF({ok}, GREATEST(VALUES(term), \
                                      IF(uuid = VALUES(uuid) AND {AGE_US} <= timeout_ms * 1000, term, term + 1)), term), \
             name = IF({ok}, VALUES(name), name), \
             endpoint = IF({ok}, VALUES(endpoint), endpoint), \
             uuid = IF({ok}, VALUES(uuid), uuid), \
             ts = IF({ok}, UTC_TIMESTAMP(6), ts) \
         RETURNING {EPOCH_US}, term, uuid, ts = UTC_TIMESTAMP(6)"
    )
}

type RawRow = (String, String, String, String, i64, i64, i64, i64, i64);

/// GetPrimary on an open connection.
pub async fn read_on(conn: &mut Conn, utype: &str) -> Result<Option<HolderRow>, ArbiterError> {
    let r: Option<RawRow> = conn.exec_first(read_sql(), (utype,)).await.map_err(ArbiterError::query)?;
    match r {
        None => Ok(None),
        Some((utype, uuid, name, endpoint, term, t, ts, age, live)) => {
            super::row(utype, &uuid, name, endpoint, term, t, ts, age, live != 0).map(Some)
        }
    }
}

/// UpdateHeartBeat on an open connection.
pub async fn heartbeat_on(conn: &mut Conn, c: &Claim) -> Result<Beat, ArbiterError> {
    let uuid = c.uuid.to_string();
    let r: Option<(i64, i64, String, i64)> = conn
        .exec_first(
            heartbeat_sql(),
            (&c.utype, &uuid, &c.name, &c.endpoint, i64::try_from(c.min_term).unwrap_or(i64::MAX), c.timeout_ms as i64),
        )
        .await
        .map_err(ArbiterError::query)?;
    let Some((ts_us, term, holder, fresh)) = r else {
        return Err(ArbiterError::Corrupt("INSERT … RETURNING returned no row (is this MariaDB ≥ 10.5?)".into()));
    };
    if holder == uuid && fresh != 0 {
        let term = u64::try_from(term).map_err(|_| ArbiterError::Corrupt(format!("term {term}")))?;
        Ok(Beat::Applied { ts_us, term })
    } else {
        Ok(Beat::NotApplied)
    }
}

pub struct MyBackend {
    opts: Opts,
    tls: TlsMode,
    ca_file: Option<PathBuf>,
    conn: Option<Conn>,
}

impl MyBackend {
    pub fn new(
        url: &str,
        password: Option<String>,
        tls: TlsMode,
        ca_file: Option<&Path>,
    ) -> Result<MyBackend, ArbiterError> {
        let url = url.replacen("mariadb://", "mysql://", 1);
        let base =
            Opts::from_url(&url).map_err(|e| ArbiterError::url("cannot parse the MariaDB url", Some(e.into())))?;
        // Never switch to a local unix socket: that would silently drop TLS (and the arbiter is remote).
        let mut b = OptsBuilder::from_opts(base).stmt_cache_size(8).tcp_nodelay(true).prefer_socket(false);
        if let Some(p) = password {
            b = b.pass(Some(p));
        }
        if tls != TlsMode::Off {
            super::tls::ensure_provider();
        }
        Ok(MyBackend { opts: b.into(), tls, ca_file: ca_file.map(Path::to_path_buf), conn: None })
    }

    fn ssl_opts(&self) -> SslOpts {
        let mut s = SslOpts::default();
        if let Some(ca) = &self.ca_file {
            s = s.with_root_certs(vec![ca.clone().into()]).with_disable_built_in_roots(true);
        }
        s
    }

    /// Opens a new connection honouring the TLS mode.
    pub async fn connect(&self) -> Result<Conn, ArbiterError> {
        let plain = || OptsBuilder::from_opts(self.opts.clone()).ssl_opts(None::<SslOpts>);
        let secure = || OptsBuilder::from_opts(self.opts.clone()).ssl_opts(self.ssl_opts());
        let err = |e: mysql_async::Error| ArbiterError::connect(e);
        match self.tls {
            TlsMode::Off => Conn::new(plain()).await.map_err(err),
            TlsMode::Require => Conn::new(secure()).await.map_err(err),
            TlsMode::Prefer => match Conn::new(secure()).await {
                Err(mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer)) => {
                    Conn::new(plain()).await.map_err(err)
                }
                other => other.map_err(err),
            },
        }
    }

    async fn conn(&mut self) -> Result<&mut Conn, ArbiterError> {
        if self.conn.is_none() {
            self.conn = Some(self.connect().await?);
        }
        Ok(self.conn.as_mut().expect("just set"))
    }

    /// Whether the current connection is encrypted (for tests).
    pub async fn is_encrypted(&mut self) -> Result<bool, ArbiterError> {
        let c = self.conn().await?;
        let r: Option<(String, String)> =
            c.query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'").await.map_err(ArbiterError::query)?;
        Ok(r.is_some_and(|(_, v)| !v.is_empty()))
    }
}

impl Backend for MyBackend {
    async fn init(&mut self, utype: &str, timeout_ms: u64) -> Result<InitOutcome, ArbiterError> {
        let mut conn = self.connect().await?;
        conn.query_drop(schema_sql()).await.map_err(ArbiterError::query)?;
        let Some(row) = read_on(&mut conn, utype).await? else { return Ok(InitOutcome::Ready) };
        if row.timeout_ms == timeout_ms {
            return Ok(InitOutcome::Ready);
        }
        if row.live {
            return Err(ArbiterError::TimeoutMismatch {
                utype: utype.into(),
                stored_ms: row.timeout_ms,
                wanted_ms: timeout_ms,
            });
        }
        // Only an expired row may change T: no box can still be active under the old one. Its ts
        // moves back by the new T so that it stays expired under the new T as well.
        conn.exec_drop(format!("UPDATE {TABLE} SET ts = ts - INTERVAL ? * 1000 MICROSECOND, timeout_ms = ? WHERE utype = ? AND timeout_ms = ? AND {AGE_US} > timeout_ms * 1000"), (timeout_ms as i64, timeout_ms as i64, utype, row.timeout_ms as i64))
            .await
            .map_err(ArbiterError::query)?;
        if conn.affected_rows() == 0 {
            return Err(ArbiterError::TimeoutMismatch {
                utype: utype.into(),
                stored_ms: row.timeout_ms,
                wanted_ms: timeout_ms,
            });
        }
        Ok(InitOutcome::AdoptedTimeout { old_ms: row.timeout_ms })
    }

    async fn read(&mut self, utype: &str) -> Result<Option<HolderRow>, ArbiterError> {
        // A future dropped at its deadline leaves the connection mid-statement: `conn` is taken
        // out while in use, so an abandoned call never hands a half-read connection back.
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.connect().await?,
        };
        let r = read_on(&mut conn, utype).await;
        if r.is_ok() {
            self.conn = Some(conn);
        }
        r
    }

    async fn heartbeat(&mut self, claim: &Claim) -> Result<Beat, ArbiterError> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.connect().await?,
        };
        let r = heartbeat_on(&mut conn, claim).await;
        if r.is_ok() {
            self.conn = Some(conn);
        }
        r
    }

    async fn release(&mut self, utype: &str, uuid: Uuid) -> Result<bool, ArbiterError> {
        let conn = self.conn().await?;
        conn.exec_drop(format!("UPDATE {TABLE} SET ts = UTC_TIMESTAMP(6) - INTERVAL (timeout_ms + 1) * 1000 MICROSECOND WHERE utype = ? AND uuid = ?"), (utype, uuid.to_string()))
            .await
            .map_err(ArbiterError::query)?;
        Ok(conn.affected_rows() > 0)
    }

    fn reset(&mut self) {
        self.conn = None;
    }
}
