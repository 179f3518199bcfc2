//! `twinlease status` and `twinlease ctl`: asking the running box over its sockets.

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Map, Value};
use twinlease::config::Config;
use twinlease::server::control::client::{self, ClientError};
use twinlease::server::control::commands::PARTNER_DOWN_RISK;
use twinlease::server::control::metrics::encode_status;
use twinlease::server::control::protocol::{Request, Response, SUCCESS};
use twinlease::server::control::status::{ElectionStatus, PartnerStatus, RoleStatus, Status, StoreStatus};

use super::StatusFormat;

/// Exit codes scripts and monitoring can use.
const SERVING: u8 = 0;
const NOT_RUNNING: u8 = 1;
const STANDBY: u8 = 3;

pub(super) fn status(cfg: &Config, json: bool, format: Option<StatusFormat>) -> anyhow::Result<ExitCode> {
    let req = Request::new("status-get", Map::new());
    let response = match client::ask(&cfg.control.status_socket(), &req) {
        Ok(r) => r,
        Err(e @ ClientError::NotRunning { .. }) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(NOT_RUNNING));
        }
        Err(e) => return Err(e.into()),
    };
    if response.result != SUCCESS {
        anyhow::bail!("the box answered: {}", response.text);
    }
    let status: Status = serde_json::from_value(response.arguments.unwrap_or_default())?;
    match (json, format) {
        (true, _) => println!("{}", serde_json::to_string_pretty(&status)?),
        (false, Some(StatusFormat::Prometheus)) => print!("{}", encode_status(&status)),
        (false, None) => print!("{}", describe(&status)),
    }
    Ok(ExitCode::from(if status.role.serving { SERVING } else { STANDBY }))
}

pub(super) fn ctl(cfg: &Config, command: &str, arguments: &[String], json: bool) -> anyhow::Result<ExitCode> {
    let mut args = Map::new();
    for a in arguments {
        let Some((k, v)) = a.split_once('=') else { anyhow::bail!("argument {a:?} is not KEY=VALUE") };
        args.insert(k.to_string(), value(v));
    }
    let response = client::ask(&cfg.control.control_socket(), &Request::new(command, args))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&response)?);
    } else {
        print_response(&response);
    }
    Ok(if response.result == SUCCESS { ExitCode::SUCCESS } else { ExitCode::from(response.result.max(1)) })
}

/// `twinlease partner-down`: the risk first; the request only with the confirmation.
pub(super) fn partner_down(cfg: &Config, confirmed: bool) -> anyhow::Result<ExitCode> {
    eprintln!("{PARTNER_DOWN_RISK}");
    if !confirmed {
        eprintln!("Nothing done. If the partner box is off, run again with --yes-the-partner-is-off.");
        return Ok(ExitCode::from(2));
    }
    let mut args = Map::new();
    args.insert("yes-the-partner-is-off".into(), Value::Bool(true));
    if let Some(name) = client::operator() {
        args.insert("operator".into(), Value::String(name));
    }
    let response = client::ask(&cfg.control.control_socket(), &Request::new("partner-down", args))?;
    print_response(&response);
    Ok(if response.result == SUCCESS { ExitCode::SUCCESS } else { ExitCode::from(response.result.max(1)) })
}

/// `true`, `false` and numbers as JSON values; anything else as a string.
fn value(v: &str) -> Value {
    match v {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ => v.parse::<u64>().map_or_else(|_| Value::String(v.to_string()), Value::from),
    }
}

fn print_response(r: &Response) {
    println!("{}", r.text);
    if let Some(a) = &r.arguments {
        println!("{}", serde_json::to_string_pretty(a).unwrap_or_default());
    }
}

/// The status as a few lines for a person.
pub(super) fn describe(s: &Status) -> String {
    let mut lines = vec![format!("{} (twinlease {}), up {}: {}", s.node, s.version, span(s.uptime_secs), s.summary)];
    lines.push(role_line(&s.role));
    lines.extend(s.election.as_ref().map(arbiter_line));
    lines.extend(s.partner.as_ref().map(partner_line));
    for n in &s.subnets {
        lines.push(format!(
            "subnet    {}: {} of {} in use ({:.1} %): {} leased, {} offered, {} declined, {} reserved",
            n.cidr,
            n.total - n.free,
            n.total,
            n.utilisation_pct,
            n.leased,
            n.offered,
            n.declined,
            n.reserved
        ));
    }
    lines.push(store_line(&s.store));
    let d = &s.dhcp;
    let list = |m: &std::collections::BTreeMap<String, u64>| {
        let v: Vec<String> = m.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{v} {k}")).collect();
        if v.is_empty() { "none".to_string() } else { v.join(", ") }
    };
    lines.push(format!(
        "dhcp      received {} ({}); replies: {}; dropped: {}",
        d.received,
        list(&d.requests),
        list(&d.replies),
        list(&d.dropped)
    ));
    for e in s.events.iter().rev().take(5) {
        lines.push(format!("event     {} {:?}: {}", clock(e.wall_ms), e.kind, e.text));
    }
    lines.iter().map(|l| format!("{l}\n")).collect()
}

fn role_line(r: &RoleStatus) -> String {
    let mut line = format!("role      {}", r.state);
    if let Some(t) = r.term {
        line.push_str(&format!(", term {t}"));
    }
    if let Some(w) = &r.why {
        line.push_str(&format!(" ({w})"));
    }
    if !r.eligible {
        line.push_str(&format!("; not eligible: {}", r.not_eligible_because.join(", ")));
    }
    line
}

fn arbiter_line(e: &ElectionStatus) -> String {
    let a = &e.arbiter;
    let mut line = format!("arbiter   {}", if a.reachable { "reachable" } else { "UNREACHABLE" });
    if let Some(age) = a.last_heartbeat_age_ms {
        line.push_str(&format!(", heartbeat {:.1} s ago", age as f64 / 1000.0));
    }
    if let Some(rtt) = a.rtt_ms {
        line.push_str(&format!(", rtt {rtt:.1} ms"));
    }
    if let Some(left) = e.lease_left_ms {
        let (left, t) = (left as f64 / 1000.0, e.timeout_ms as f64 / 1000.0);
        line.push_str(&format!("; lease {left:.1} s left of T {t:.1} s"));
    }
    match (&a.primary, a.primary_term) {
        (Some(p), Some(t)) => line.push_str(&format!("; primary {p} (term {t})")),
        _ => line.push_str("; no primary"),
    }
    if let Some(err) = a.last_error.as_deref().filter(|_| !a.reachable) {
        line.push_str(&format!("; last error: {err}"));
    }
    line
}

fn partner_line(p: &PartnerStatus) -> String {
    let link = if p.link_up { "link up" } else { "LINK DOWN" };
    let sync = if p.in_sync { "in sync" } else { "not in sync" };
    let rtt = p.rtt_ms.map(|r| format!(", rtt {r:.1} ms")).unwrap_or_default();
    let caught = p.last_catch_up_unix_ms.map(|t| format!("; caught up {}", clock(t))).unwrap_or_default();
    let config = match (&p.config_digest, p.config_differs) {
        (Some(d), true) => format!("; CONFIGURATION DIFFERS (partner {d})"),
        _ => String::new(),
    };
    format!(
        "partner   {} {link}, {sync}{rtt}; {} unsynced; {} sent, {} applied{caught}; {} conflicts{config}",
        p.address, p.unsynced, p.updates_sent, p.updates_applied, p.conflicts
    )
}

fn store_line(st: &StoreStatus) -> String {
    let free = st.disk_free_bytes.map(|f| format!(", {} free", bytes(f))).unwrap_or_default();
    let commit = if st.can_commit { "" } else { "CANNOT COMMIT; " };
    format!(
        "store     {commit}{} {} (log {}){free}; {} commits, {} failures, last {:.1} ms",
        st.path,
        bytes(st.size_bytes),
        bytes(st.wal_bytes),
        st.commits,
        st.commit_failures,
        st.last_commit_us as f64 / 1000.0
    )
}

fn span(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n < 10 << 10 => format!("{n} B"),
        n if n < 10 << 20 => format!("{} KiB", n >> 10),
        n if n < 10 << 30 => format!("{} MiB", n >> 20),
        n => format!("{} GiB", n >> 30),
    }
}

/// Milliseconds since the epoch as UTC time of day.
fn clock(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}
