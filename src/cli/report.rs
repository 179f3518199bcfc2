//! `twinlease leases` and `twinlease conflicts`: the lease store read-only, safe while the
//! daemon runs (and when it does not).

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use twinlease::config::Config;
use twinlease::lease::{Binding, LeaseState, fmt_hw};
use twinlease::server::control::commands::lease_json;
use twinlease::store::{ConflictRecord, LeaseStore, StoredBinding};

fn open(cfg: &Config) -> anyhow::Result<LeaseStore> {
    let path = cfg.lease_db_path();
    if !path.exists() {
        anyhow::bail!("no lease database at {} (has the server run yet?)", path.display());
    }
    Ok(LeaseStore::open_for_reading(&path)?)
}

/// The lease table; `all` includes free addresses that have a history.
pub(super) fn leases(cfg: &Config, json: bool, all: bool) -> anyhow::Result<ExitCode> {
    let store = open(cfg)?;
    let now = twinlease::clock::unix_now();
    if json {
        write_json_leases(&store, all, now)?;
    } else {
        let rows: Vec<StoredBinding> =
            store.load_all()?.into_iter().filter(|r| all || r.binding.state != LeaseState::Free).collect();
        print_table(&rows, now);
    }
    Ok(ExitCode::SUCCESS)
}

/// The JSON array of leases, written row by row as the store yields them (a million leases
/// never sit in memory twice: rows, then a document tree, then its text), laid out exactly as
/// `serde_json::to_string_pretty` lays out the whole array.
fn write_json_leases(store: &LeaseStore, all: bool, now: u64) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut first = true;
    let mut failed: Option<anyhow::Error> = None;
    store.for_each_binding(|r| {
        if failed.is_some() || !(all || r.binding.state != LeaseState::Free) {
            return;
        }
        let sep = if std::mem::take(&mut first) { "[\n" } else { ",\n" };
        let written =
            serde_json::to_string_pretty(&lease_json(&r, now)).map_err(anyhow::Error::from).and_then(|text| {
                // JSON strings carry no raw newline, so every line of the object is indented one level.
                let indented: Vec<String> = text.lines().map(|l| format!("  {l}")).collect();
                Ok(write!(out, "{sep}{}", indented.join("\n"))?)
            });
        failed = written.err();
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    out.write_all(if first { b"[]\n" } else { b"\n]\n" })?;
    out.flush()?;
    Ok(())
}

/// The conflicts lease sync resolved: both bindings and which one was kept.
pub(super) fn conflicts(cfg: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let list = open(cfg)?.conflicts()?;
    if json {
        let v: Vec<serde_json::Value> = list.iter().map(conflict_json).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    let who = |b: &Binding| b.owner.as_ref().map_or("-".to_string(), |o| o.to_string());
    for c in &list {
        let (w, l) = (&c.winner, &c.loser);
        println!(
            "{} {}: kept {} for {} (term {}, cltt {}); lost {} for {} (term {}, cltt {})",
            utc(c.at),
            c.kind.name(),
            w.addr,
            who(w),
            w.term,
            w.cltt,
            l.addr,
            who(l),
            l.term,
            l.cltt
        );
    }
    println!("{} conflicts", list.len());
    Ok(ExitCode::SUCCESS)
}

fn conflict_json(c: &ConflictRecord) -> serde_json::Value {
    let side = |b: &Binding| {
        serde_json::json!({
            "address": b.addr.to_string(), "state": b.state.name(), "client": b.owner.as_ref().map(|o| o.to_string()),
            "expires": b.expires, "cltt": b.cltt, "term": b.term,
        })
    };
    serde_json::json!({
        "at": c.at, "at_utc": utc(c.at), "kind": c.kind.name(), "winner": side(&c.winner), "loser": side(&c.loser),
    })
}

pub(super) fn utc_us(us: i64) -> String {
    let t = if us >= 0 { UNIX_EPOCH + Duration::from_micros(us as u64) } else { UNIX_EPOCH };
    humantime::format_rfc3339_millis(t).to_string()
}

fn utc(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

fn print_table(rows: &[StoredBinding], now: u64) {
    println!(
        "{:<15} {:<8} {:<24} {:<17} {:<16} {:<20} {:>9} {:>4} {:>4}",
        "ADDRESS", "STATE", "CLIENT", "HW", "HOSTNAME", "EXPIRES (UTC)", "REMAINING", "VER", "TERM"
    );
    for r in rows {
        let b = &r.binding;
        let client = b.owner.as_ref().map(|o| o.to_string()).unwrap_or_else(|| "-".into());
        let remaining =
            if b.state == LeaseState::Free { "-".to_string() } else { format!("{}s", b.expires.saturating_sub(now)) };
        println!(
            "{:<15} {:<8} {:<24} {:<17} {:<16} {:<20} {:>9} {:>4} {:>4}",
            b.addr.to_string(),
            b.state.name(),
            client,
            fmt_hw(&b.hw),
            b.hostname.as_deref().unwrap_or("-"),
            utc(b.expires),
            remaining,
            b.version,
            b.term
        );
    }
    println!("{} entries", rows.len());
}
