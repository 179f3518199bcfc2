//! The `twinlease` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;
use clap::{Parser, Subcommand};

use twinlease::config::{ArbiterKind, Config};
use twinlease::election::backend::{self, AnyBackend, Backend, CONNECT_TIMEOUT, InitOutcome};
use twinlease::election::{Election, Params};
use twinlease::sync::machine::Readiness;
use twinlease::lease::{LeaseState, fmt_hw};
use twinlease::store::{LeaseStore, StoredBinding};

#[derive(Parser)]
#[command(name = "twinlease", version, about = "DHCPv4 server for a pair of branch-office boxes", long_about = "DHCPv4 server for a pair of branch-office boxes.\n\nLeases are durable (SQLite, fsync before every DHCPACK). Start with `twinlease check-config FILE`, then `twinlease run --config FILE`.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve DHCP on the configured interfaces until SIGTERM.
    Run {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        /// Use this directory for the lease database instead of [node] state_dir.
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Test only, until the election decides: fix this box's role ("standby" or
        /// "active:TERM").
        #[arg(long, value_name = "ROLE", hide = true)]
        pin_role: Option<String>,
    },
    /// Validate a configuration file; exit 0 if it is valid, 1 with the reason if not.
    CheckConfig {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Show the lease table (read-only; safe while the server runs).
    Leases {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Include free addresses that have a history (previous owner, affinity hold).
        #[arg(long)]
        all: bool,
    },
    /// Who is primary for this box's utype, and where (asks the arbiter).
    Whois {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Arbiter administration.
    Arbiter {
        #[command(subcommand)]
        command: ArbiterCommand,
    },
    /// Show the lease conflicts lease sync resolved (both bindings and which one was kept).
    Conflicts {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Print the version.
    Version,
}

#[derive(Subcommand)]
enum ArbiterCommand {
    /// Create the heartbeat table if missing (idempotent); adopt a changed T once the utype's
    /// row has expired.
    Init {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
    },
    /// Print the SQL that creates the heartbeat table (for a DBA to run by hand).
    Schema {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("twinlease: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load(config: &std::path::Path, state_dir: Option<PathBuf>) -> anyhow::Result<Config> {
    let mut cfg = Config::load(config)?;
    if let Some(d) = state_dir {
        cfg.node.state_dir = d;
    }
    Ok(cfg)
}

fn dispatch(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Version => {
            println!("twinlease {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckConfig { file } => match Config::load(&file) {
            Ok(c) => {
                let pool: usize = c.subnets.iter().map(|s| s.dynamic_addresses().count()).sum();
                println!("{}: OK ({} subnets, {} pool addresses, {} reservations)", file.display(), c.subnets.len(), pool, c.reservations.len());
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("{e}");
                Ok(ExitCode::FAILURE)
            }
        },
        Command::Run { config, state_dir, pin_role } => {
            let cfg = load(&config, state_dir)?;
            let pinned = match pin_role.as_deref() {
                None => None,
                Some("standby") => Some(twinlease::role::Role::Standby),
                Some(r) => match r.strip_prefix("active:").and_then(|t| t.parse().ok()) {
                    Some(term) => Some(twinlease::role::Role::active(term)),
                    None => anyhow::bail!("--pin-role takes \"standby\" or \"active:TERM\""),
                },
            };
            twinlease::logging::init(cfg.log_filter.as_deref());
            // One thread for the whole async side: a request then never hops between worker threads on
            // the way through; the blocking work (fsync) has its own thread in the store writer.
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
            rt.block_on(run(cfg, pinned))
        }
        Command::Whois { config, json } => {
            let cfg = Config::load(&config)?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
            rt.block_on(whois(&cfg, json))
        }
        Command::Arbiter { command: ArbiterCommand::Init { config } } => {
            let cfg = Config::load(&config)?;
            let a = arbiter_of(&cfg)?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
            rt.block_on(async {
                let mut b = AnyBackend::from_config(a)?;
                let outcome = tokio::time::timeout(CONNECT_TIMEOUT * 2, b.init(&a.utype, a.timeout.as_millis() as u64)).await.map_err(|_| anyhow::anyhow!("the arbiter did not answer within {:?}", CONNECT_TIMEOUT * 2))??;
                match outcome {
                    InitOutcome::Ready => println!("arbiter ready: table {} exists; utype {:?} uses T = {} ms", backend::TABLE, a.utype, a.timeout.as_millis()),
                    InitOutcome::AdoptedTimeout { old_ms } => println!("arbiter ready: utype {:?} changed from T = {old_ms} ms to T = {} ms (its row had expired)", a.utype, a.timeout.as_millis()),
                }
                Ok(ExitCode::SUCCESS)
            })
        }
        Command::Arbiter { command: ArbiterCommand::Schema { config } } => {
            let cfg = Config::load(&config)?;
            let a = arbiter_of(&cfg)?;
            let sql = match a.kind {
                ArbiterKind::Postgres => backend::postgres::schema_sql(),
                ArbiterKind::Mysql => backend::mysql::schema_sql(),
                ArbiterKind::Sqlite => backend::sqlite::schema_sql(),
            };
            println!("{sql};");
            Ok(ExitCode::SUCCESS)
        }
        Command::Conflicts { config, state_dir, json } => {
            let cfg = load(&config, state_dir)?;
            let path = cfg.lease_db_path();
            if !path.exists() {
                anyhow::bail!("no lease database at {} (has the server run yet?)", path.display());
            }
            let list = LeaseStore::open_read_only(&path)?.conflicts()?;
            let side = |b: &twinlease::lease::Binding| {
                serde_json::json!({
                    "address": b.addr.to_string(), "state": b.state.name(), "client": b.owner.as_ref().map(|o| o.to_string()),
                    "expires": b.expires, "cltt": b.cltt, "term": b.term,
                })
            };
            if json {
                let v: Vec<serde_json::Value> = list.iter().map(|c| serde_json::json!({"at": c.at, "at_utc": utc(c.at), "kind": c.kind.name(), "winner": side(&c.winner), "loser": side(&c.loser)})).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for c in &list {
                    let who = |b: &twinlease::lease::Binding| b.owner.as_ref().map_or("-".to_string(), |o| o.to_string());
                    println!(
                        "{} {}: kept {} for {} (term {}, cltt {}); lost {} for {} (term {}, cltt {})",
                        utc(c.at), c.kind.name(), c.winner.addr, who(&c.winner), c.winner.term, c.winner.cltt, c.loser.addr, who(&c.loser), c.loser.term, c.loser.cltt
                    );
                }
                println!("{} conflicts", list.len());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Leases { config, state_dir, json, all } => {
            let cfg = load(&config, state_dir)?;
            let path = cfg.lease_db_path();
            if !path.exists() {
                anyhow::bail!("no lease database at {} (has the server run yet?)", path.display());
            }
            let store = LeaseStore::open_read_only(&path)?;
            let rows: Vec<StoredBinding> = store.load_all()?.into_iter().filter(|r| all || r.binding.state != LeaseState::Free).collect();
            let now = twinlease::server::engine::unix_now();
            if json {
                let v: Vec<serde_json::Value> = rows.iter().map(|r| lease_json(r, now)).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_table(&rows, now);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn arbiter_of(cfg: &Config) -> anyhow::Result<&twinlease::config::Arbiter> {
    cfg.arbiter.as_ref().ok_or_else(|| anyhow::anyhow!("{}: no [arbiter] section; this box is standalone (always active)", cfg.path.display()))
}

/// `run`: standalone without `[arbiter]`; otherwise the DHCP service follows the election.
/// A demoted box stays in the process and re-enters the election (same uuid), so a box whose
/// heartbeat answers were merely lost renews its own row and serves again within one interval.
/// Only a T mismatch with the arbiter's row ends the process (exit 1; systemd restarts it).
/// `--pin-role` (tests) replaces both.
async fn run(cfg: Config, pinned: Option<twinlease::role::Role>) -> anyhow::Result<ExitCode> {
    if let Some(r) = pinned {
        let (_role_tx, role) = tokio::sync::watch::channel(r);
        twinlease::server::run(cfg, role).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let Some(a) = cfg.arbiter.clone() else {
        let (_role_tx, role) = twinlease::role::standalone();
        twinlease::server::run(cfg, role).await?;
        return Ok(ExitCode::SUCCESS);
    };
    let backend = AnyBackend::from_config(&a)?;
    let mut election = Election::new(backend, Params::from_config(&a), &a.utype, &cfg.node.name, &a.endpoint);
    election.startup_check().await?;
    let uuid = election.uuid();
    let (role_tx, role_rx) = tokio::sync::watch::channel(twinlease::role::Role::Standby);
    let (ready_tx, mut ready_rx) = tokio::sync::watch::channel(Readiness::Waiting);
    let mut elected = tokio::spawn(async move {
        // A box stands only once lease sync has caught up with its partner (or found it
        // unreachable), so a new primary never serves from a stale lease table.
        let _ = ready_rx.wait_for(|r| *r != Readiness::Waiting).await;
        election.run(role_tx, None).await
    });
    tokio::select! {
        r = twinlease::server::run_with(cfg, role_rx, ready_tx) => {
            r?;
            // The DHCP service has stopped (and sent its last released ACK): hand the row
            // over now, so the partner takes over within an interval instead of after T.
            elected.abort();
            release(&a, uuid).await;
            Ok(ExitCode::SUCCESS)
        }
        halted = &mut elected => {
            let why = halted.map_or_else(|e| format!("election task failed: {e}"), |e| e.to_string());
            anyhow::bail!("{why}")
        }
    }
}

async fn release(a: &twinlease::config::Arbiter, uuid: twinlease::election::Uuid) {
    let limit = a.interval.max(Duration::from_secs(1));
    let released = match AnyBackend::from_config(a) {
        Ok(mut b) => tokio::time::timeout(limit, b.release(&a.utype, uuid)).await,
        Err(e) => Ok(Err(e)),
    };
    match released {
        Ok(Ok(true)) => tracing::info!(mono_ns = twinlease::clock::monotonic().as_nanos() as u64, "handed the arbiter row over"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not hand the arbiter row over; the partner takes over after T"),
        Err(_) => tracing::warn!("the arbiter did not answer the hand-over; the partner takes over after T"),
    }
}

async fn whois(cfg: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let a = arbiter_of(cfg)?;
    let mut b = AnyBackend::from_config(a)?;
    let row = tokio::time::timeout(CONNECT_TIMEOUT, b.read(&a.utype)).await.map_err(|_| anyhow::anyhow!("the arbiter did not answer within {CONNECT_TIMEOUT:?}"))??;
    if json {
        let v = match &row {
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
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    match row {
        None => println!("utype {:?}: no primary (no heartbeat row yet)", a.utype),
        Some(r) => {
            let age = r.age_ms as f64 / 1000.0;
            if r.live {
                println!("utype {:?}: primary {} at {} (uuid {}, term {}), heartbeat {age:.1}s ago (T = {} ms)", r.utype, r.name, r.endpoint, r.uuid, r.term, r.timeout_ms);
            } else {
                println!("utype {:?}: no primary; last was {} at {} (uuid {}, term {}), heartbeat {age:.1}s ago, expired (T = {} ms)", r.utype, r.name, r.endpoint, r.uuid, r.term, r.timeout_ms);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn utc_us(us: i64) -> String {
    let t = if us >= 0 { UNIX_EPOCH + Duration::from_micros(us as u64) } else { UNIX_EPOCH };
    humantime::format_rfc3339_millis(t).to_string()
}

fn utc(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

fn lease_json(r: &StoredBinding, now: u64) -> serde_json::Value {
    let b = &r.binding;
    serde_json::json!({
        "address": b.addr.to_string(),
        "state": b.state.name(),
        "client": b.owner.as_ref().map(|o| o.to_string()),
        "hw": fmt_hw(&b.hw),
        "hostname": b.hostname,
        "expires": b.expires,
        "expires_utc": utc(b.expires),
        "remaining_secs": b.expires.saturating_sub(now),
        "cltt": b.cltt,
        "version": b.version,
        "term": b.term,
        "synced": r.synced(),
    })
}

fn print_table(rows: &[StoredBinding], now: u64) {
    println!("{:<15} {:<8} {:<24} {:<17} {:<16} {:<20} {:>9} {:>4} {:>4}", "ADDRESS", "STATE", "CLIENT", "HW", "HOSTNAME", "EXPIRES (UTC)", "REMAINING", "VER", "TERM");
    for r in rows {
        let b = &r.binding;
        let client = b.owner.as_ref().map(|o| o.to_string()).unwrap_or_else(|| "-".into());
        let remaining = if b.state == LeaseState::Free { "-".to_string() } else { format!("{}s", b.expires.saturating_sub(now)) };
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
