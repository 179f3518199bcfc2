//! The `twinlease` command line (the subcommands live in `cli/`).

mod cli;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

/// The static musl builds (`make static`, `make cross`) allocate with mimalloc: musl's own malloc
/// was ~15 % of the instructions per lease (README, "What the boxes run").
#[cfg(target_env = "musl")]
mod allocator {
    use libmimalloc_sys as mi;

    #[global_allocator]
    static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

    /// mimalloc commits a whole arena up front where the OS overcommits (Linux) and then only
    /// resets freed pages, which stay in the RSS: 32 MiB instead of 23 with 65,536 leases
    /// (`make bench-scale`; budget 24). Committing on demand lets freed pages go back to the OS.
    /// This runs from `.init_array`, before `main` and the Rust runtime allocate anything: the
    /// option is read when the first arena is reserved.
    extern "C" fn configure() {
        // SAFETY: sets one of mimalloc's option slots; runs once, before any thread exists.
        unsafe { mi::mi_option_set(ARENA_EAGER_COMMIT, 0) };
    }

    /// `mi_option_arena_eager_commit` in mimalloc v3's `mimalloc.h` (the bindings lack it).
    const ARENA_EAGER_COMMIT: mi::mi_option_t = 4;

    #[used]
    #[unsafe(link_section = ".init_array")]
    static CONFIGURE: extern "C" fn() = configure;
}

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
