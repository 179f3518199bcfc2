//! PostgreSQL arbiter (tokio-postgres, rustls with ring).
//!
//! UpdateHeartBeat is `INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING`: the row lock taken
//! by ON CONFLICT serialises racing claims, the WHERE is evaluated against the newest committed
//! row version, and RETURNING yields a row exactly when the statement applied. `now()` is the
//! statement's (autocommit transaction's) start on the server's clock, a `timestamptz`, so the
//! arithmetic is UTC intervals with no overflow.

use std::path::Path;

use tokio_postgres::{Client, NoTls, Statement};

use super::{ArbiterError, Backend, Beat, Claim, HolderRow, InitOutcome, TABLE, tls};
use crate::config::TlsMode;
use crate::election::Uuid;

pub fn schema_sql() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {TABLE} (\n\
         \x20   utype      text PRIMARY KEY,\n\
         \x20   uuid       text NOT NULL,\n\
         \x20   name       text NOT NULL,\n\
         \x20   endpoint   text NOT NULL,\n\
         \x20   ts         timestamptz NOT NULL,\n\
         \x20   term       bigint NOT NULL CHECK (term >= 1),\n\
         \x20   timeout_ms bigint NOT NULL CHECK (timeout_ms > 0)\n\
         )"
    )
}

fn read_sql() -> String {
    format!(
        "SELECT utype, uuid, name, endpoint, term, timeout_ms, \
                (extract(epoch FROM ts) * 1000000)::bigint, \
                (extract(epoch FROM (now() - ts)) * 1000)::bigint, \
                now() - ts <= timeout_ms * interval '1 millisecond' \
         FROM {TABLE} WHERE utype = $1"
    )
}

fn heartbeat_sql() -> String {
    // SET expressions all see the old row, so `term` can look at the old uuid and ts.
    format!(
        "INSERT INTO {TABLE} AS h (utype, uuid, name, endpoint, ts, term, timeout_ms) \
         VALUES ($1, $2, $3, $4, now(), GREATEST(1, $6::bigint), $5) \
         ON CONFLICT (utype) DO UPDATE SET \
             term = GREATEST($6::bigint, CASE WHEN h.uuid = excluded.uuid \
                                           AND now() - h.ts <= h.timeout_ms * interval '1 millisecond' \
                                      THEN h.term ELSE h.term + 1 END), \
             uuid = excluded.uuid, name = excluded.name, endpoint = excluded.endpoint, ts = now() \
         WHERE h.timeout_ms = excluded.timeout_ms \
           AND (h.uuid = excluded.uuid OR now() - h.ts > h.timeout_ms * interval '1 millisecond') \
         RETURNING (extract(epoch FROM ts) * 1000000)::bigint, term"
    )
}

/// A connected client with the two hot statements prepared.
pub struct PgConn {
    pub client: Client,
    read: Statement,
    beat: Statement,
}

impl PgConn {
    pub async fn prepare(client: Client) -> Result<PgConn, ArbiterError> {
        let read = client.prepare(&read_sql()).await.map_err(ArbiterError::query)?;
        let beat = client.prepare(&heartbeat_sql()).await.map_err(ArbiterError::query)?;
        Ok(PgConn { client, read, beat })
    }

    /// GetPrimary.
    pub async fn read(&self, utype: &str) -> Result<Option<HolderRow>, ArbiterError> {
        let rows = self.client.query(&self.read, &[&utype]).await.map_err(ArbiterError::query)?;
        let Some(r) = rows.first() else { return Ok(None) };
        let get = |e: tokio_postgres::Error| ArbiterError::Corrupt(e.to_string());
        super::row(
            r.try_get(0).map_err(get)?,
            r.try_get::<_, &str>(1).map_err(get)?,
            r.try_get(2).map_err(get)?,
            r.try_get(3).map_err(get)?,
            r.try_get(4).map_err(get)?,
            r.try_get(5).map_err(get)?,
            r.try_get(6).map_err(get)?,
            r.try_get(7).map_err(get)?,
            r.try_get(8).map_err(get)?,
        )
        .map(Some)
    }

    /// UpdateHeartBeat: one statement, one round trip.
    pub async fn heartbeat(&self, c: &Claim) -> Result<Beat, ArbiterError> {
        let uuid = c.uuid.to_string();
        let t = c.timeout_ms as i64;
        let floor = i64::try_from(c.min_term).unwrap_or(i64::MAX);
        let rows = self
            .client
            .query(&self.beat, &[&c.utype, &uuid, &c.name, &c.endpoint, &t, &floor])
            .await
            .map_err(ArbiterError::query)?;
        match rows.first() {
            None => Ok(Beat::NotApplied),
            Some(r) => {
                let ts_us: i64 = r.try_get(0).map_err(|e| ArbiterError::Corrupt(e.to_string()))?;
                let term: i64 = r.try_get(1).map_err(|e| ArbiterError::Corrupt(e.to_string()))?;
                let term = u64::try_from(term).map_err(|_| ArbiterError::Corrupt(format!("term {term}")))?;
                Ok(Beat::Applied { ts_us, term })
            }
        }
    }
}

pub struct PgBackend {
    config: tokio_postgres::Config,
    tls: TlsMode,
    rustls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    conn: Option<PgConn>,
}

impl PgBackend {
    pub fn new(
        url: &str,
        password: Option<String>,
        tls_mode: TlsMode,
        ca_file: Option<&Path>,
    ) -> Result<PgBackend, ArbiterError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| ArbiterError::url("cannot parse the PostgreSQL url", Some(e.into())))?;
        if let Some(p) = password {
            config.password(p);
        }
        if config.get_application_name().is_none() {
            config.application_name("twinlease");
        }
        config.connect_timeout(super::CONNECT_TIMEOUT);
        let rustls = match tls_mode {
            TlsMode::Off => {
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                None
            }
            TlsMode::Prefer => {
                config.ssl_mode(tokio_postgres::config::SslMode::Prefer);
                Some(tokio_postgres_rustls::MakeRustlsConnect::new(tls::client_config(ca_file)?))
            }
            TlsMode::Require => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                Some(tokio_postgres_rustls::MakeRustlsConnect::new(tls::client_config(ca_file)?))
            }
        };
        Ok(PgBackend { config, tls: tls_mode, rustls, conn: None })
    }

    /// Opens a new connection (its driver runs as a spawned task until the client drops).
    pub async fn connect(&self) -> Result<Client, ArbiterError> {
        let err = |e: tokio_postgres::Error| ArbiterError::connect(e);
        match &self.rustls {
            Some(tls) => {
                let (client, connection) = self.config.connect(tls.clone()).await.map_err(err)?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok(client)
            }
            None => {
                let (client, connection) = self.config.connect(NoTls).await.map_err(err)?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok(client)
            }
        }
    }

    pub fn tls_mode(&self) -> TlsMode {
        self.tls
    }

    async fn conn(&mut self) -> Result<&PgConn, ArbiterError> {
        if self.conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let client = self.connect().await?;
            self.conn = Some(PgConn::prepare(client).await?);
        }
        Ok(self.conn.as_ref().expect("just set"))
    }

    /// Whether the current connection is encrypted (for tests and `whois`).
    pub async fn is_encrypted(&mut self) -> Result<bool, ArbiterError> {
        let c = self.conn().await?;
        let rows = c
            .client
            .query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
            .await
            .map_err(ArbiterError::query)?;
        Ok(rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()).unwrap_or(false))
    }
}

impl Backend for PgBackend {
    async fn init(&mut self, utype: &str, timeout_ms: u64) -> Result<InitOutcome, ArbiterError> {
        let client = self.connect().await?;
        if let Err(e) = client.batch_execute(&schema_sql()).await {
            // Two processes creating the table at once: the loser sees a duplicate; fine.
            let dup = e.code().is_some_and(|c| {
                *c == tokio_postgres::error::SqlState::UNIQUE_VIOLATION
                    || *c == tokio_postgres::error::SqlState::DUPLICATE_TABLE
            });
            if !dup {
                return Err(ArbiterError::query(e));
            }
        }
        let conn = PgConn::prepare(client).await?;
        let Some(row) = conn.read(utype).await? else { return Ok(InitOutcome::Ready) };
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
        let n = conn
            .client
            .execute(&format!("UPDATE {TABLE} SET timeout_ms = $2, ts = ts - $2::bigint * interval '1 millisecond' WHERE utype = $1 AND timeout_ms = $3 AND now() - ts > timeout_ms * interval '1 millisecond'"), &[&utype, &(timeout_ms as i64), &(row.timeout_ms as i64)])
            .await
            .map_err(ArbiterError::query)?;
        if n == 0 {
            return Err(ArbiterError::TimeoutMismatch {
                utype: utype.into(),
                stored_ms: row.timeout_ms,
                wanted_ms: timeout_ms,
            });
        }
        Ok(InitOutcome::AdoptedTimeout { old_ms: row.timeout_ms })
    }

    async fn read(&mut self, utype: &str) -> Result<Option<HolderRow>, ArbiterError> {
        let r = self.conn().await?.read(utype).await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    async fn heartbeat(&mut self, claim: &Claim) -> Result<Beat, ArbiterError> {
        let r = self.conn().await?.heartbeat(claim).await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    async fn release(&mut self, utype: &str, uuid: Uuid) -> Result<bool, ArbiterError> {
        let c = self.conn().await?;
        let n = c
            .client
            .execute(&format!("UPDATE {TABLE} SET ts = now() - (timeout_ms + 1) * interval '1 millisecond' WHERE utype = $1 AND uuid = $2"), &[&utype, &uuid.to_string()])
            .await
            .map_err(ArbiterError::query)?;
        Ok(n > 0)
    }

    fn reset(&mut self) {
        self.conn = None;
    }
}
