//! `twinlease leases` and `twinlease conflicts`: while the box runs, its answer over whichever of
//! its sockets this user may use (the database is the service user's alone: the unit's umask
//! keeps it and its log from the admin group); while it does not, the lease store read-only.
//! Both ways give the same table and the same JSON.

use std::io::{BufWriter, StdoutLock, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::bail;
use serde_json::{Map, Value, json};
use twinlease::config::Config;
use twinlease::lease::LeaseState;
use twinlease::server::control::client::{self, ClientError};
use twinlease::server::control::commands::{MAX_PAGE, conflict_json, lease_json};
use twinlease::server::control::protocol::{Request, Response, SUCCESS};
use twinlease::store::LeaseStore;

/// Where the report comes from.
enum Source {
    /// The running box, asked over this socket.
    Daemon(PathBuf),
    Store(LeaseStore),
}

/// What asking the running box came to, for the advice when its store cannot be read either.
enum Daemon {
    NotRunning,
    /// Both sockets refused this user (the file modes and groups).
    Refused,
    /// The box that answers uses another database (this one is a copy, or `--state-dir` names
    /// another box's directory): the one asked for is read directly.
    OtherStore(String),
    Failed(String),
}

/// The running box if one answers here about this database, else the database itself.
fn source(cfg: &Config) -> anyhow::Result<Source> {
    let db = cfg.lease_db_path();
    let mut daemon = Daemon::NotRunning;
    for socket in [cfg.control.status_socket(), cfg.control.control_socket()] {
        match client::ask(&socket, &Request::new("status-get", Map::new())) {
            Ok(r) if r.result == SUCCESS => {
                let theirs = r.arguments.as_ref().and_then(|a| a.pointer("/store/path")).and_then(Value::as_str);
                let theirs = theirs.unwrap_or_default().to_string();
                if same_file(Path::new(&theirs), &db) {
                    return Ok(Source::Daemon(socket));
                }
                daemon = Daemon::OtherStore(theirs);
                break;
            }
            Ok(r) => daemon = Daemon::Failed(format!("{}: {}", socket.display(), r.text)),
            Err(ClientError::Denied { .. }) if matches!(daemon, Daemon::NotRunning) => daemon = Daemon::Refused,
            Err(ClientError::Denied { .. } | ClientError::NotRunning { .. }) => {}
            Err(e) => daemon = Daemon::Failed(e.to_string()),
        }
    }
    open(cfg, &db, &daemon).map(Source::Store)
}

fn same_file(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// The store read-only, or why it cannot be read and what to do about it.
fn open(cfg: &Config, db: &Path, daemon: &Daemon) -> anyhow::Result<LeaseStore> {
    let why = match std::fs::metadata(db) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && matches!(daemon, Daemon::NotRunning) => {
            bail!("no lease database at {} (has the server run yet?)", db.display())
        }
        Err(e) => e.to_string(),
        Ok(_) => match nix::unistd::access(db, nix::unistd::AccessFlags::R_OK) {
            Err(e) => e.desc().to_string(),
            // SQLite opens lazily: one lookup finds out now whether the file, its log and the
            // log's index may be read, so the advice below comes with the failure.
            Ok(()) => match LeaseStore::open_for_reading(db).and_then(|s| s.get(Ipv4Addr::UNSPECIFIED).map(|_| s)) {
                Ok(s) => return Ok(s),
                Err(e) => e.to_string(),
            },
        },
    };
    let c = &cfg.control;
    let what = format!("cannot read the lease database {}: {why}", db.display());
    bail!(match daemon {
        Daemon::NotRunning => format!(
            "{what}. The box is not running, so it cannot be asked instead, and its database may be read only by \
             root and the service's user: run this as root (sudo)."
        ),
        Daemon::Refused => format!(
            "{what}; and the running box refuses this user on {} (group {}) and {} (group {}). Add the user to group \
             {} (or {}) and log in again, or run this as root (sudo).",
            c.status_socket().display(),
            c.status_group,
            c.control_socket().display(),
            c.admin_group,
            c.status_group,
            c.admin_group
        ),
        Daemon::OtherStore(theirs) => format!(
            "{what}. The box running here uses {theirs}; leave out --state-dir to see its table, or run this as root \
             (sudo)."
        ),
        Daemon::Failed(e) => format!("{what}; and asking the running box failed: {e}. Run this as root (sudo)."),
    })
}

/// One request to the box; an error unless it succeeded.
fn ask(socket: &Path, command: &str, arguments: Map<String, Value>) -> anyhow::Result<Response> {
    let r = client::ask(socket, &Request::new(command, arguments))?;
    if r.result != SUCCESS {
        bail!("{}: the box answered: {}", socket.display(), r.text);
    }
    Ok(r)
}

/// The lease table; `all` includes free addresses that have a history.
pub(super) fn leases(cfg: &Config, json: bool, all: bool) -> anyhow::Result<ExitCode> {
    let source = source(cfg)?;
    let now = twinlease::clock::unix_now();
    let mut out = Rows::new(json, now)?;
    match source {
        Source::Store(store) => {
            let mut failed: Option<std::io::Error> = None;
            store.for_each_binding(|r| {
                if failed.is_none() && (all || r.binding.state != LeaseState::Free) {
                    failed = out.lease(&lease_json(&r, now)).err();
                }
            })?;
            if let Some(e) = failed {
                return Err(e.into());
            }
        }
        // Page by page, printed as each arrives: neither the box nor this process ever holds
        // more than a page of a large table.
        Source::Daemon(socket) => {
            let mut from: Option<String> = None;
            loop {
                let mut args = Map::new();
                args.insert("all".into(), Value::Bool(all));
                args.insert("limit".into(), json!(MAX_PAGE));
                if let Some(f) = &from {
                    args.insert("from".into(), Value::String(f.clone()));
                }
                let mut page = ask(&socket, "lease-list", args)?.arguments.unwrap_or_default();
                let Some(Value::Array(rows)) = page.get_mut("leases").map(Value::take) else {
                    bail!("{}: the answer to lease-list carries no leases", socket.display());
                };
                for mut row in rows {
                    // The time left as of now, as reading the store now would give it.
                    let expires = row["expires"].as_u64().unwrap_or(0);
                    if let Some(o) = row.as_object_mut() {
                        o.insert("remaining_secs".into(), json!(expires.saturating_sub(now)));
                    }
                    out.lease(&row)?;
                }
                // A box that ignores "limit" (an older build) sends the whole table and no "next".
                let next = page.get("next").and_then(Value::as_str).map(str::to_string);
                match next {
                    Some(n) if from.as_deref() == Some(n.as_str()) => {
                        bail!("{}: lease-list does not advance past {n}", socket.display())
                    }
                    Some(n) => from = Some(n),
                    None => break,
                }
            }
        }
    }
    out.finish()?;
    Ok(ExitCode::SUCCESS)
}

/// The table or the JSON array, written lease by lease; the array laid out exactly as
/// `serde_json::to_string_pretty` lays out the whole array.
struct Rows {
    out: BufWriter<StdoutLock<'static>>,
    json: bool,
    now: u64,
    count: usize,
}

impl Rows {
    fn new(json: bool, now: u64) -> std::io::Result<Rows> {
        let mut out = BufWriter::new(std::io::stdout().lock());
        if !json {
            writeln!(
                out,
                "{:<15} {:<8} {:<24} {:<17} {:<16} {:<20} {:>9} {:>4} {:>4}",
                "ADDRESS", "STATE", "CLIENT", "HW", "HOSTNAME", "EXPIRES (UTC)", "REMAINING", "VER", "TERM"
            )?;
        }
        Ok(Rows { out, json, now, count: 0 })
    }

    /// One lease as `lease_json` gives it.
    fn lease(&mut self, l: &Value) -> std::io::Result<()> {
        self.count += 1;
        if self.json {
            let sep = if self.count == 1 { "[\n" } else { ",\n" };
            // JSON strings carry no raw newline, so every line of the object is indented one level.
            let text = serde_json::to_string_pretty(l)?;
            let indented: Vec<String> = text.lines().map(|line| format!("  {line}")).collect();
            return write!(self.out, "{sep}{}", indented.join("\n"));
        }
        let text = |k: &str| l[k].as_str().unwrap_or("-").to_string();
        let num = |k: &str| l[k].as_u64().unwrap_or(0);
        let remaining = if l["state"] == "free" {
            "-".to_string()
        } else {
            format!("{}s", num("expires").saturating_sub(self.now))
        };
        writeln!(
            self.out,
            "{:<15} {:<8} {:<24} {:<17} {:<16} {:<20} {:>9} {:>4} {:>4}",
            text("address"),
            text("state"),
            text("client"),
            text("hw"),
            text("hostname"),
            text("expires_utc"),
            remaining,
            num("version"),
            num("term")
        )
    }

    fn finish(mut self) -> std::io::Result<()> {
        match (self.json, self.count) {
            (true, 0) => self.out.write_all(b"[]\n")?,
            (true, _) => self.out.write_all(b"\n]\n")?,
            (false, n) => writeln!(self.out, "{n} entries")?,
        }
        self.out.flush()
    }
}

/// The conflicts lease sync resolved: both bindings and which one was kept.
pub(super) fn conflicts(cfg: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let list: Vec<Value> = match source(cfg)? {
        Source::Store(store) => store.conflicts()?.iter().map(conflict_json).collect(),
        Source::Daemon(socket) => {
            let mut answer = ask(&socket, "conflicts-get", Map::new())?.arguments.unwrap_or_default();
            let Some(Value::Array(mut list)) = answer.get_mut("conflicts").map(Value::take) else {
                bail!("{}: the answer to conflicts-get carries no conflicts", socket.display());
            };
            // An older box leaves out the time as text.
            for c in list.iter_mut().filter_map(Value::as_object_mut) {
                if !c.contains_key("at_utc") {
                    let at = c.get("at").and_then(Value::as_u64).unwrap_or(0);
                    c.insert("at_utc".into(), Value::String(utc(at)));
                }
            }
            list
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(ExitCode::SUCCESS);
    }
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let num = |v: &Value| v.as_u64().unwrap_or(0);
    for c in &list {
        let (w, l) = (&c["winner"], &c["loser"]);
        println!(
            "{} {}: kept {} for {} (term {}, cltt {}); lost {} for {} (term {}, cltt {})",
            text(&c["at_utc"]),
            text(&c["kind"]),
            text(&w["address"]),
            text(&w["client"]),
            num(&w["term"]),
            num(&w["cltt"]),
            text(&l["address"]),
            text(&l["client"]),
            num(&l["term"]),
            num(&l["cltt"])
        );
    }
    println!("{} conflicts", list.len());
    Ok(ExitCode::SUCCESS)
}

pub(super) fn utc_us(us: i64) -> String {
    let t = if us >= 0 { UNIX_EPOCH + Duration::from_micros(us as u64) } else { UNIX_EPOCH };
    humantime::format_rfc3339_millis(t).to_string()
}

fn utc(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}
