//! The event loop, generic over the terminal backend and the input (crossterm on a real
//! terminal, `TestBackend` and scripted keys in tests): draw when something changed, wait for a
//! key until the next refresh is due, refresh once a second.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::Backend;
use ratatui::crossterm::event::{self, Event};

use super::TuiError;
use super::app::{App, Command};
use super::source::Feed;

/// How often the box is asked.
pub const REFRESH: Duration = Duration::from_secs(1);

/// Set by SIGTERM and SIGHUP: the loop ends and the terminal is restored (`systemctl stop` of
/// the console unit, a closed SSH session).
static STOP: AtomicBool = AtomicBool::new(false);

/// Where keys come from.
pub trait Input {
    /// The next terminal event, or `None` once `timeout` passed without one.
    fn next(&mut self, timeout: Duration) -> io::Result<Option<Event>>;
}

/// The real terminal's keys.
pub struct Crossterm;

impl Input for Crossterm {
    fn next(&mut self, timeout: Duration) -> io::Result<Option<Event>> {
        match event::poll(timeout) {
            Ok(true) => event::read().map(Some),
            Ok(false) => Ok(None),
            // A signal woke the wait: the loop looks at STOP.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Runs until `q` (or a stop signal, or the input ends).
pub fn event_loop<B: Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    feed: &mut impl Feed,
    input: &mut impl Input,
) -> Result<(), TuiError> {
    let draw_error = |e: B::Error| TuiError::Terminal(io::Error::other(e.to_string()));
    let mut next_refresh = Instant::now();
    while !STOP.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= next_refresh {
            app.apply(feed.poll(now), now);
            next_refresh = now + REFRESH;
        }
        if app.take_dirty() {
            terminal.draw(|f| f.render_widget(&*app, f.area())).map_err(draw_error)?;
        }
        let wait = next_refresh.saturating_duration_since(Instant::now());
        match input.next(wait).map_err(TuiError::Terminal)? {
            Some(Event::Key(key)) => match app.on_key(key) {
                Some(Command::Quit) => return Ok(()),
                Some(Command::Act(action)) => {
                    let answer = feed.act(action);
                    app.acted(action, answer);
                    // Show the action's effect at once.
                    next_refresh = Instant::now();
                }
                Some(Command::OfferUpdate) => app.show_update(feed.update_choices()),
                Some(Command::Update { bundle, pair }) => {
                    // It runs for minutes: the feed carries it out in the background and its
                    // answer comes with a later snapshot, while the console keeps refreshing.
                    feed.start_update(&bundle, pair);
                    app.update_started(pair, crate::clock::unix_now());
                    next_refresh = Instant::now();
                }
                None => {}
            },
            Some(Event::Resize(..)) => {
                terminal.autoresize().map_err(draw_error)?;
                app.touch();
            }
            Some(_) | None => {}
        }
    }
    Ok(())
}

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// SIGTERM and SIGHUP end the loop instead of the process, so the terminal is put back.
pub fn stop_on_signals() -> Result<(), TuiError> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(SigHandler::Handler(on_stop), SaFlags::empty(), SigSet::empty());
    for sig in [Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }.map_err(|e| TuiError::Terminal(e.into()))?;
    }
    Ok(())
}
