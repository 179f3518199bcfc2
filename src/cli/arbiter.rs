//! `twinlease whois` and `twinlease arbiter init|schema`: asking and preparing the arbiter.

use std::process::ExitCode;

use twinlease::config::{Arbiter, ArbiterKind, Config};
use twinlease::election::backend::{self, AnyBackend, Backend, CONNECT_TIMEOUT, InitOutcome};

use twinlease::server::control::client;
use twinlease::server::control::protocol::Request;
use twinlease::server::control::status::{RoleStatus, Status};

use super::report::utc_us;

fn arbiter_of(cfg: &Config) -> anyhow::Result<&Arbiter> {
    cfg.arbiter.as_ref().ok_or_else(|| {
        anyhow::anyhow!("{}: no [arbiter] section; this box is standalone (always active)", cfg.path.display())
    })
}

/// Creates the table if missing; adopts a changed T once the utype's row has expired.
pub(super) async fn init(cfg: &Config) -> anyhow::Result<ExitCode> {
    let a = arbiter_of(cfg)?;
    let mut b = AnyBackend::from_config(a)?;
    let limit = CONNECT_TIMEOUT * 2;
    let outcome = tokio::time::timeout(limit, b.init(&a.utype, a.timeout.as_millis() as u64))
        .await
        .map_err(|_| anyhow::anyhow!("the arbiter did not answer within {limit:?}"))??;
    match outcome {
        InitOutcome::Ready => println!(
            "arbiter ready: table {} exists; utype {:?} uses T = {} ms",
            backend::TABLE,
            a.utype,
            a.timeout.as_millis()
        ),
        InitOutcome::AdoptedTimeout { old_ms } => println!(
            "arbiter ready: utype {:?} changed from T = {old_ms} ms to T = {} ms (its row had expired)",
            a.utype,
            a.timeout.as_millis()
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// The SQL that creates the heartbeat table, for a DBA to run by hand.
pub(super) fn schema(cfg: &Config) -> anyhow::Result<ExitCode> {
    let sql = match arbiter_of(cfg)?.kind {
        ArbiterKind::Postgres => backend::postgres::schema_sql(),
        ArbiterKind::Mysql => backend::mysql::schema_sql(),
        ArbiterKind::Sqlite => backend::sqlite::schema_sql(),
    };
    println!("{sql};");
    Ok(ExitCode::SUCCESS)
}

/// This box's role and why, from its status socket (None if it does not run here).
fn local_role(cfg: &Config) -> Option<RoleStatus> {
    let req = Request::new("status-get", serde_json::Map::new());
    let r = client::ask_within(&cfg.control.status_socket(), &req, std::time::Duration::from_secs(2)).ok()?;
    let status: Status = serde_json::from_value(r.arguments?).ok()?;
    Some(status.role)
}

pub(super) async fn whois(cfg: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let a = arbiter_of(cfg)?;
    let local = local_role(cfg);
    let this_box = local.as_ref().map(|r| match (&r.why, r.term) {
        (Some(why), Some(term)) if r.serving => {
            format!("this box ({}): active, term {term}, because: {why}", cfg.node.name)
        }
        _ => format!("this box ({}): {}", cfg.node.name, r.state),
    });
    let mut b = AnyBackend::from_config(a)?;
    let read = tokio::time::timeout(CONNECT_TIMEOUT, b.read(&a.utype))
        .await
        .map_err(|_| anyhow::anyhow!("the arbiter did not answer within {CONNECT_TIMEOUT:?}"))
        .and_then(|r| r.map_err(anyhow::Error::from));
    let row = match read {
        Ok(row) => row,
        Err(e) => {
            // Without the arbiter, what the box itself says is all there is to say.
            if let Some(line) = &this_box {
                println!("{line}");
            }
            return Err(e);
        }
    };
    if json {
        let mut v = match &row {
            None => serde_json::json!({ "utype": a.utype, "primary": null }),
            Some(r) => serde_json::json!({
                "utype": r.utype,
                "primary": if r.live { serde_json::Value::String(r.name.clone()) } else { serde_json::Value::Null },
                "live": r.live,
                "name": r.name,
                "uuid": r.uuid.to_string(),
                "endpoint": r.endpoint,
                "term": r.term,
                "heartbeat_age_ms": r.age_ms,
                "heartbeat_utc": utc_us(r.ts_us),
                "timeout_ms": r.timeout_ms,
            }),
        };
        if let Some(r) = &local {
            v["this_box"] = serde_json::json!({ "name": cfg.node.name, "state": r.state, "serving": r.serving, "term": r.term, "why": r.why });
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    match row {
        None => println!("utype {:?}: no primary (no heartbeat row yet)", a.utype),
        Some(r) => {
            let age = r.age_ms as f64 / 1000.0;
            if r.live {
                println!(
                    "utype {:?}: primary {} at {} (uuid {}, term {}), heartbeat {age:.1}s ago (T = {} ms)",
                    r.utype, r.name, r.endpoint, r.uuid, r.term, r.timeout_ms
                );
            } else {
                println!(
                    "utype {:?}: no primary; last was {} at {} (uuid {}, term {}), heartbeat {age:.1}s ago, expired (T = {} ms)",
                    r.utype, r.name, r.endpoint, r.uuid, r.term, r.timeout_ms
                );
            }
        }
    }
    if let Some(line) = &this_box {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
