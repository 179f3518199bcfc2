//! The `twinlease` command line (the subcommands live in `cli/`).

mod cli;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run { .. } | Command::Update { .. }) {
        // A reporting command piped into `head` ends quietly when the reader goes, like every
        // other Unix tool; Rust ignores SIGPIPE and would panic on the failed write instead.
        // The daemon keeps ignoring it: a closed log socket must not kill the DHCP service.
        // So do the update commands: an install or a pair roll must finish (or stop where it
        // is safe to) when the admin's session or the partner that asked goes away.
        // SAFETY: restoring a default signal disposition before any thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // One thread for the whole async side: a request then never hops between worker threads on
    // the way through; the blocking work (fsync) has its own thread in the store writer.
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(cli::dispatch(cli.command)));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("twinlease: {e:#}");
            ExitCode::FAILURE
        }
    }
}
