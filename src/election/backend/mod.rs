//! The arbiter: one heartbeat row per utype in a SQL database, and the two procedures of the
//! seeds as single statements. Every backend (PostgreSQL, MariaDB, SQLite) keeps the same
//! contract, tested by one battery (tests/arbiter_battery.rs):
//!
//! * `heartbeat` (UpdateHeartBeat) — one statement, one round trip: inserts the row if absent,
//!   renews it if it holds this uuid, takes it over (term + 1) if `arbiter_now − ts > T`, else
//!   changes nothing; answers whether it applied, with the arbiter time and term it wrote.
//!   The term written is never below the caller's `min_term`: a box elected by its partner's
//!   vote (docs/design.md, "Three voters") carries its term to the row, so terms only grow
//!   whichever path elected them.
//!   A row whose stored T differs from the caller's is never renewed or taken over.
//! * `read` (GetPrimary) — the row, with `live = arbiter_now − ts <= T` computed by the database.
//!
//! All time arithmetic happens in the database on its own UTC clock, in 64-bit microseconds
//! or native intervals, so rows idle for years neither overflow nor wrap.

pub mod mysql;
pub mod postgres;
pub mod sqlite;
mod tls;

use std::future::Future;
use std::time::Duration;

use super::Uuid;
use crate::config::{Arbiter, ArbiterKind};

/// The name of the heartbeat table in every backend.
pub const TABLE: &str = "twinlease_heartbeat";

/// The heartbeat row as GetPrimary returns it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HolderRow {
    pub utype: String,
    pub uuid: Uuid,
    pub name: String,
    pub endpoint: String,
    pub term: u64,
    /// T stored with the row; both boxes must agree on it.
    pub timeout_ms: u64,
    /// Arbiter time of the last heartbeat, microseconds since the Unix epoch (UTC).
    pub ts_us: i64,
    /// Arbiter time now minus `ts`, in milliseconds (the heartbeat's age).
    pub age_ms: i64,
    /// `age <= T`, decided by the database.
    pub live: bool,
}

/// UpdateHeartBeat's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Beat {
    /// The row now holds the caller with this arbiter timestamp and term.
    Applied { ts_us: i64, term: u64 },
    /// Someone else holds a live row (or its T differs): nothing changed.
    NotApplied,
}

/// Who is heartbeating.
#[derive(Debug, Clone)]
pub struct Claim {
    pub utype: String,
    pub uuid: Uuid,
    pub name: String,
    pub endpoint: String,
    pub timeout_ms: u64,
    /// The lowest term the heartbeat may write (0: no floor).
    pub min_term: u64,
}

/// What `arbiter init` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitOutcome {
    /// Schema present; the utype's row (if any) already has this T.
    Ready,
    /// The utype's row had expired with another T; it now carries the configured T.
    AdoptedTimeout { old_ms: u64 },
}

/// An error from a database driver, a TLS library or the file system, kept as the source.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum ArbiterError {
    #[error("cannot connect to the arbiter: {}", Chain(&**source))]
    Connect {
        #[source]
        source: Cause,
    },
    #[error("arbiter statement failed: {}", Chain(&**source))]
    Query {
        #[source]
        source: Cause,
    },
    #[error("the arbiter returned a corrupt row: {0}")]
    Corrupt(String),
    #[error("arbiter url: {what}")]
    Url { what: String, source: Option<Cause> },
    #[error("TLS set-up: {what}{}", source.as_deref().map(|s| format!(": {}", Chain(s))).unwrap_or_default())]
    Tls { what: String, source: Option<Cause> },
    #[error(transparent)]
    Password(#[from] crate::config::ConfigError),
    #[error(
        "the row for utype {utype:?} is live with T = {stored_ms} ms, not {wanted_ms} ms; stop the active box (or wait until its heartbeat expires) before changing T"
    )]
    TimeoutMismatch { utype: String, stored_ms: u64, wanted_ms: u64 },
}

impl ArbiterError {
    pub fn connect(e: impl Into<Cause>) -> ArbiterError {
        ArbiterError::Connect { source: e.into() }
    }

    pub fn query(e: impl Into<Cause>) -> ArbiterError {
        ArbiterError::Query { source: e.into() }
    }

    pub fn url(what: impl Into<String>, source: Option<Cause>) -> ArbiterError {
        ArbiterError::Url { what: what.into(), source }
    }

    pub fn tls(what: impl Into<String>, source: Option<Cause>) -> ArbiterError {
        ArbiterError::Tls { what: what.into(), source }
    }
}

/// An error and its causes on one line ("a: b: c"): database drivers put the useful part
/// (the server's message) in a source.
struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

/// The arbiter procedures. Implementations reconnect by themselves after any error; callers put
/// a deadline on every call and drop the future when it passes (implementations must then not
/// reuse a connection left mid-statement).
pub trait Backend: Send + 'static {
    /// Creates the table if missing; adopts `timeout_ms` for an expired row of `utype`.
    fn init(&mut self, utype: &str, timeout_ms: u64) -> impl Future<Output = Result<InitOutcome, ArbiterError>> + Send;
    /// GetPrimary.
    fn read(&mut self, utype: &str) -> impl Future<Output = Result<Option<HolderRow>, ArbiterError>> + Send;
    /// UpdateHeartBeat.
    fn heartbeat(&mut self, claim: &Claim) -> impl Future<Output = Result<Beat, ArbiterError>> + Send;
    /// Expires the row if it holds `uuid` (a clean shutdown hands over at once instead of after
    /// T). Only for a process that has already stopped serving. Returns whether it held the row.
    fn release(&mut self, utype: &str, uuid: Uuid) -> impl Future<Output = Result<bool, ArbiterError>> + Send;
    /// Drops the connection; the next call reconnects.
    fn reset(&mut self);
}

/// Any of the three, chosen by the url scheme.
pub enum AnyBackend {
    Postgres(Box<postgres::PgBackend>),
    Mysql(mysql::MyBackend),
    Sqlite(sqlite::LiteBackend),
}

impl AnyBackend {
    /// Builds (without connecting) the backend the configuration names.
    pub fn from_config(a: &Arbiter) -> Result<AnyBackend, ArbiterError> {
        let password = a.read_password()?;
        Ok(match a.kind {
            ArbiterKind::Postgres => {
                AnyBackend::Postgres(Box::new(postgres::PgBackend::new(&a.url, password, a.tls, a.ca_file.as_deref())?))
            }
            ArbiterKind::Mysql => {
                AnyBackend::Mysql(mysql::MyBackend::new(&a.url, password, a.tls, a.ca_file.as_deref())?)
            }
            ArbiterKind::Sqlite => AnyBackend::Sqlite(sqlite::LiteBackend::new(&a.url)?),
        })
    }
}

impl Backend for AnyBackend {
    async fn init(&mut self, utype: &str, timeout_ms: u64) -> Result<InitOutcome, ArbiterError> {
        match self {
            AnyBackend::Postgres(b) => b.init(utype, timeout_ms).await,
            AnyBackend::Mysql(b) => b.init(utype, timeout_ms).await,
            AnyBackend::Sqlite(b) => b.init(utype, timeout_ms).await,
        }
    }
    async fn read(&mut self, utype: &str) -> Result<Option<HolderRow>, ArbiterError> {
        match self {
            AnyBackend::Postgres(b) => b.read(utype).await,
            AnyBackend::Mysql(b) => b.read(utype).await,
            AnyBackend::Sqlite(b) => b.read(utype).await,
        }
    }
    async fn heartbeat(&mut self, claim: &Claim) -> Result<Beat, ArbiterError> {
        match self {
            AnyBackend::Postgres(b) => b.heartbeat(claim).await,
            AnyBackend::Mysql(b) => b.heartbeat(claim).await,
            AnyBackend::Sqlite(b) => b.heartbeat(claim).await,
        }
    }
    async fn release(&mut self, utype: &str, uuid: Uuid) -> Result<bool, ArbiterError> {
        match self {
            AnyBackend::Postgres(b) => b.release(utype, uuid).await,
            AnyBackend::Mysql(b) => b.release(utype, uuid).await,
            AnyBackend::Sqlite(b) => b.release(utype, uuid).await,
        }
    }
    fn reset(&mut self) {
        match self {
            AnyBackend::Postgres(b) => b.reset(),
            AnyBackend::Mysql(b) => b.reset(),
            AnyBackend::Sqlite(b) => b.reset(),
        }
    }
}

/// Turns the raw columns every backend selects into a checked row.
#[expect(clippy::too_many_arguments, reason = "one argument per column of the row")]
pub(crate) fn row(
    utype: String,
    uuid: &str,
    name: String,
    endpoint: String,
    term: i64,
    timeout_ms: i64,
    ts_us: i64,
    age_ms: i64,
    live: bool,
) -> Result<HolderRow, ArbiterError> {
    // A holder that is no uuid (a row written by hand or by something else) is nobody's: the
    // row is someone else's, so this box stands by, and once it expires by the arbiter's own
    // clock a heartbeat takes it over. Refusing to read it would wedge the election for good.
    let uuid = Uuid::parse_str(uuid.trim()).unwrap_or_else(|e| {
        tracing::warn!(holder = uuid, error = %e, "the arbiter's row names a holder that is no uuid; treated as another node's, taken over once it expires");
        Uuid::nil()
    });
    let term = u64::try_from(term).map_err(|_| ArbiterError::Corrupt(format!("term {term}")))?;
    let timeout_ms =
        u64::try_from(timeout_ms).map_err(|_| ArbiterError::Corrupt(format!("timeout_ms {timeout_ms}")))?;
    Ok(HolderRow { utype, uuid, name, endpoint, term, timeout_ms, ts_us, age_ms, live })
}

/// How long a connection attempt may take when the caller set no deadline (init, whois).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_whose_holder_is_no_uuid_reads_as_another_node_s() {
        let r = row("u".into(), "not-a-uuid at all", "n".into(), "e".into(), 3, 2000, 1, 2500, false).unwrap();
        assert_eq!((r.uuid, r.term, r.live), (Uuid::nil(), 3, false));
        assert!(matches!(
            row("u".into(), "x", "n".into(), "e".into(), -1, 2000, 1, 0, true),
            Err(ArbiterError::Corrupt(_))
        ));
    }
}
