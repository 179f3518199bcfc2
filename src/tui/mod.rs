//! `twinlease tui`: the console. A ratatui application in the demo2/gitui shape: [`app::App`]
//! holds the state and handles keys (no I/O), [`view`] draws it (`impl Widget for &View`),
//! [`source`] reads the box and its lease store, [`term`] runs the loop over any backend.
//! Views: 1 Dashboard, 2 Leases, 3 Conflicts, 4 Events. The daemon's sockets and the store are
//! only read; actions go to the control socket after a confirmation, and never with
//! `--read-only`. `u` updates the box, or both boxes of a pair, from a bundle in the bundle
//! directory (README "Updating").

pub mod app;
pub mod data;
pub mod source;
pub mod term;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod update_tests;
pub mod view;

use crate::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum TuiError {
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
}

/// Where the firmware image keeps bundles for the console's update dialog: the admin copies
/// them here (group twinlease-admin).
pub const BUNDLE_DIR: &str = "/var/lib/twinlease-bundles";

/// How the console looks and what it may do.
#[derive(Debug, Clone)]
pub struct Options {
    /// ASCII borders and bars (the Linux VT's console fonts may lack box drawing).
    pub ascii: bool,
    /// No actions, even where the control socket would take them.
    pub read_only: bool,
    /// Where the update dialog finds bundles.
    pub bundles: source::BundleDir,
}

/// Whether a terminal of this `TERM` gets ASCII by default.
pub fn ascii_by_default(term: Option<&str>) -> bool {
    term == Some("linux")
}

/// Takes the terminal (raw mode, alternate screen; restored on return and on panic) and runs
/// the console until the operator quits.
pub fn run(cfg: &Config, opts: Options) -> Result<(), TuiError> {
    let mut source = source::Source::new(cfg, opts.read_only, opts.bundles);
    let mut app = app::App::new(opts.ascii, opts.read_only);
    term::stop_on_signals()?;
    let mut terminal = ratatui::try_init()?;
    let result = term::event_loop(&mut terminal, &mut app, &mut source, &mut term::Crossterm);
    ratatui::try_restore()?;
    result
}
