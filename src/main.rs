//! The `twinlease` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;
use clap::{Parser, Subcommand};

use twinlease::config::Config;
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

fn load(config: &PathBuf, state_dir: Option<PathBuf>) -> anyhow::Result<Config> {
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
                    Some(term) => Some(twinlease::role::Role::Active { term }),
                    None => anyhow::bail!("--pin-role takes \"standby\" or \"active:TERM\""),
                },
            };
            twinlease::logging::init(cfg.log_filter.as_deref());
            // One thread for the whole async side: a request then never hops between worker threads on
            // the way through; the blocking work (fsync) has its own thread in the store writer.
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
            rt.block_on(async {
                let (_role_tx, role) = match pinned {
                    Some(r) => tokio::sync::watch::channel(r),
                    None => twinlease::role::standalone(),
                };
                twinlease::server::run(cfg, role).await
            })?;
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
