//! The command line: what each subcommand does, one function each. `main.rs` parses the
//! arguments and runs [`dispatch`] on the one tokio runtime.

mod arbiter;
mod report;
mod run;
mod status;
mod update;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use twinlease::config::{Config, Overrides};

#[derive(Parser)]
#[command(
    name = "twinlease",
    version,
    about = "DHCPv4 server for a pair of branch-office boxes",
    long_about = "DHCPv4 server for a pair of branch-office boxes.\n\nLeases are durable (SQLite, fsync before every DHCPACK). Start with `twinlease check-config FILE`, then `twinlease run --config FILE`."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Serve DHCP on the configured interfaces until SIGTERM.
    Run {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        /// Use this directory for the lease database instead of [node] state_dir.
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Put the status and control sockets here instead of [control] runtime_dir.
        #[arg(long, value_name = "DIR")]
        runtime_dir: Option<PathBuf>,
        /// Test only, until the election decides: fix this box's role ("standby" or
        /// "active:TERM").
        #[arg(long, value_name = "ROLE", hide = true)]
        pin_role: Option<String>,
    },
    /// Validate a configuration file and the secret files it names; exit 0 if it is valid, 1
    /// with the reason if not.
    CheckConfig {
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Do not read the [peer] key_file and [arbiter] password_file (for checking a file away
        /// from the box that holds them).
        #[arg(long)]
        skip_secret_files: bool,
    },
    /// Show the lease table (read-only): asks the running box over its status or control
    /// socket, or reads the lease database when the box does not run.
    Leases {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Where the box's sockets are, if not at [control] runtime_dir.
        #[arg(long, value_name = "DIR")]
        runtime_dir: Option<PathBuf>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Include free addresses that have a history (previous owner, affinity hold).
        #[arg(long)]
        all: bool,
    },
    /// Ask the running box how it is: role and why, election, partner, pools, store, counters,
    /// recent events. Exit 0 serving, 3 standby, 1 not running.
    Status {
        #[arg(long, short, value_name = "FILE", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Where the box's sockets are, if not at [control] runtime_dir.
        #[arg(long, value_name = "DIR")]
        runtime_dir: Option<PathBuf>,
        /// The whole status object as JSON.
        #[arg(long, conflicts_with = "format")]
        json: bool,
        /// "prometheus": the metrics text format.
        #[arg(long, value_name = "FORMAT")]
        format: Option<StatusFormat>,
    },
    /// Send one command to the running box's control socket (root or the admin group), e.g.
    /// `ctl step-down`, `ctl maintenance action=start`, `ctl lease-get address=198.18.0.9`,
    /// `ctl list-commands`.
    Ctl {
        #[arg(long, short, value_name = "FILE", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Where the box's sockets are, if not at [control] runtime_dir.
        #[arg(long, value_name = "DIR")]
        runtime_dir: Option<PathBuf>,
        /// The command name.
        command: String,
        /// Arguments as key=value (true/false and numbers are sent as such).
        #[arg(value_name = "KEY=VALUE")]
        arguments: Vec<String>,
        /// The whole response as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make this box active although neither the arbiter nor the partner can vote for it: for
    /// when the arbiter is unreachable and you have SEEN that the partner box is off or
    /// unplugged. Refused while the partner is reachable on the peer link; logged with who and
    /// when. The partner, once back, rejoins as standby.
    PartnerDown {
        #[arg(long, short, value_name = "FILE", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Where the box's sockets are, if not at [control] runtime_dir.
        #[arg(long, value_name = "DIR")]
        runtime_dir: Option<PathBuf>,
        /// Confirms that you have seen the partner box is off; without it, only the risk is shown.
        #[arg(long)]
        yes_the_partner_is_off: bool,
    },
    /// Who is primary for this box's utype, and where (asks the arbiter), and why this box is
    /// active if it is (asks the running box).
    Whois {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        /// Where the box's sockets are, if not at [control] runtime_dir.
        #[arg(long, value_name = "DIR")]
        runtime_dir: Option<PathBuf>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Arbiter administration.
    Arbiter {
        #[command(subcommand)]
        command: ArbiterCommand,
    },
    /// Show the lease conflicts lease sync resolved (both bindings and which one was kept); like
    /// `leases`, from the running box or, when it does not run, from the lease database.
    Conflicts {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Where the box's sockets are, if not at [control] runtime_dir.
        #[arg(long, value_name = "DIR")]
        runtime_dir: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// The console: dashboard, leases, conflicts and events of this box, refreshed every
    /// second; step-down and maintenance behind a confirmation (not with --read-only).
    Tui {
        #[arg(long, short, value_name = "FILE", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Where the box's sockets are, if not at [control] runtime_dir.
        #[arg(long, value_name = "DIR")]
        runtime_dir: Option<PathBuf>,
        /// Where the lease database is, if not at [node] state_dir.
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// ASCII borders and bars (the default when TERM=linux, the Linux console).
        #[arg(long)]
        ascii: bool,
        /// Show only: no actions, even where the control socket would take them.
        #[arg(long)]
        read_only: bool,
        /// Where the update dialog (`u`) finds bundles.
        #[arg(long, value_name = "DIR", default_value = twinlease::tui::BUNDLE_DIR)]
        bundles: PathBuf,
        /// The public key (PEM) the dialog checks bundles' manifests with.
        #[arg(long, value_name = "FILE", default_value = "/usr/share/twinlease/bundle-key.pem")]
        bundle_key: PathBuf,
    },
    /// Safe updates: a signed bundle into the other root slot, with automatic rollback
    /// (README "Updating").
    Update {
        /// Test only: the box's file system (efi/, dev/disk/by-partlabel/, proc/cmdline) is here.
        #[arg(long, value_name = "DIR", hide = true)]
        root: Option<PathBuf>,
        #[command(subcommand)]
        command: update::UpdateCommand,
    },
    /// Print the version.
    Version,
}

#[derive(Subcommand)]
pub(crate) enum ArbiterCommand {
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

/// Where the unit keeps the configuration.
const DEFAULT_CONFIG: &str = "/etc/twinlease/twinlease.toml";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StatusFormat {
    Prometheus,
}

/// Carries out one subcommand.
pub(crate) async fn dispatch(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Version => {
            println!("twinlease {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckConfig { file, skip_secret_files } => Ok(check_config(&file, skip_secret_files)),
        Command::Run { config, state_dir, runtime_dir, pin_role } => {
            let cfg = Config::load(&config)?.with_overrides(Overrides { state_dir, runtime_dir });
            run::run(cfg, pin_role.as_deref()).await
        }
        Command::Whois { config, runtime_dir, json } => {
            arbiter::whois(&with_runtime_dir(&config, runtime_dir)?, json).await
        }
        Command::Arbiter { command: ArbiterCommand::Init { config } } => arbiter::init(&Config::load(&config)?).await,
        Command::Arbiter { command: ArbiterCommand::Schema { config } } => arbiter::schema(&Config::load(&config)?),
        Command::Conflicts { config, state_dir, runtime_dir, json } => {
            report::conflicts(&load(&config, state_dir, runtime_dir)?, json)
        }
        Command::Leases { config, state_dir, runtime_dir, json, all } => {
            report::leases(&load(&config, state_dir, runtime_dir)?, json, all)
        }
        Command::Status { config, runtime_dir, json, format } => {
            status::status(&with_runtime_dir(&config, runtime_dir)?, json, format)
        }
        Command::Tui { config, runtime_dir, state_dir, ascii, read_only, bundles, bundle_key } => {
            let cfg = Config::load(&config)?.with_overrides(Overrides { state_dir, runtime_dir });
            let ascii = ascii || twinlease::tui::ascii_by_default(std::env::var("TERM").ok().as_deref());
            let bundles = twinlease::tui::source::BundleDir { dir: bundles, key: bundle_key };
            twinlease::tui::run(&cfg, twinlease::tui::Options { ascii, read_only, bundles })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::PartnerDown { config, runtime_dir, yes_the_partner_is_off } => {
            status::partner_down(&with_runtime_dir(&config, runtime_dir)?, yes_the_partner_is_off)
        }
        Command::Update { root, command } => update::dispatch(command, root),
        Command::Ctl { config, runtime_dir, command, arguments, json } => {
            status::ctl(&with_runtime_dir(&config, runtime_dir)?, &command, &arguments, json)
        }
    }
}

/// A configuration file, with `--state-dir` and `--runtime-dir` in place of `[node] state_dir`
/// and `[control] runtime_dir` when given.
fn load(config: &Path, state_dir: Option<PathBuf>, runtime_dir: Option<PathBuf>) -> anyhow::Result<Config> {
    Ok(Config::load(config)?.with_overrides(Overrides { state_dir, runtime_dir }))
}

/// A configuration file, with `--runtime-dir` in place of `[control] runtime_dir` when given.
fn with_runtime_dir(config: &Path, runtime_dir: Option<PathBuf>) -> anyhow::Result<Config> {
    Ok(Config::load(config)?.with_overrides(Overrides { state_dir: None, runtime_dir }))
}

/// Exit 0 with a summary, or 1 with the first problem (file:line:column and what to change).
fn check_config(file: &Path, skip_secret_files: bool) -> ExitCode {
    let checked =
        Config::load(file).and_then(|c| if skip_secret_files { Ok(c) } else { c.check_secret_files().map(|()| c) });
    match checked {
        Ok(c) => {
            println!(
                "{}: OK ({} subnets, {} pool addresses, {} reservations, {} classes{}); config digest {}",
                file.display(),
                c.subnets.len(),
                c.pool_addresses(),
                c.reservations.len(),
                c.classes.len(),
                if skip_secret_files { "; secret files not read" } else { "" },
                c.digest
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
