//! The update dialog: what it offers, what it refuses, what it sends, and how the console shows
//! an update under way and its answer.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{Event as TermEvent, KeyCode, KeyEvent};

use super::app::{Action, App, Command, Overlay};
use super::data::{BundleRow, Snapshot, UpdateChoices};
use super::source::Feed;
use super::term::{Input, event_loop};
use super::tests::{NOW, active, app_in, code, key, render, snapshot};

const WRONG_ARCH: &str = "the bundle is for aarch64, this box is x86_64";

fn choices() -> UpdateChoices {
    let row = |file: &str, version: Result<&str, &str>| BundleRow {
        path: PathBuf::from("/var/lib/twinlease-bundles").join(file),
        file: file.to_string(),
        bytes: 88_473_558,
        version: version.map(str::to_string).map_err(str::to_string),
    };
    UpdateChoices {
        dir: "/var/lib/twinlease-bundles".to_string(),
        slots: Ok("slot a: 0.1.0, good, booted; slot b: no version, no boot entry".to_string()),
        bundles: Ok(vec![
            row("twinlease-aarch64-0.2.0.bundle", Err(WRONG_ARCH)),
            row("twinlease-x86_64-0.2.0.bundle", Ok("0.2.0")),
        ]),
    }
}

fn screen(app: &App) -> String {
    render(app, 80, 24).backend().to_string()
}

#[test]
fn the_dialog_offers_the_bundles_and_asks_before_updating_the_pair() {
    let mut app = app_in(Ok(active()), false);
    assert_eq!(app.on_key(key('u')), Some(Command::OfferUpdate));
    app.show_update(choices());
    assert_eq!(app.overlay, Overlay::Update);
    insta::assert_snapshot!("update_dialog_80x24", render(&app, 80, 24).backend());

    // The first bundle is for another machine: Enter says so and opens nothing.
    assert_eq!(app.on_key(code(KeyCode::Enter)), None);
    assert_eq!(app.overlay, Overlay::Update);
    assert!(app.message.as_deref().is_some_and(|m| m.contains(WRONG_ARCH)), "{:?}", app.message);
    app.on_key(code(KeyCode::Down));
    app.on_key(code(KeyCode::Down));
    assert_eq!(app.update.selected, 1, "the choice stops at the last bundle");
    assert_eq!(app.on_key(code(KeyCode::Enter)), None);
    // A box with a partner updates the pair.
    assert_eq!(app.overlay, Overlay::Confirm(Action::UpdatePair));
    insta::assert_snapshot!("confirm_update_pair_80x24", render(&app, 80, 24).backend());
    let bundle = PathBuf::from("/var/lib/twinlease-bundles/twinlease-x86_64-0.2.0.bundle");
    assert_eq!(app.on_key(key('y')), Some(Command::Update { bundle, pair: true }));

    app.update_started(true, NOW);
    let s = screen(&app);
    assert!(s.contains("updating the pair with twinlease-x86_64-0.2.0.bundle since"), "{s}");
    // One update at a time from this console.
    assert_eq!(app.on_key(key('u')), None);
    assert!(app.message.as_deref().is_some_and(|m| m.contains("is being installed")), "{:?}", app.message);

    let answer =
        Snapshot { update_answer: Some(Err("refused: the partner is not caught up".into())), ..snapshot(Ok(active())) };
    app.apply(answer, Instant::now());
    assert_eq!(app.message.as_deref(), Some("update of the pair to 0.2.0 refused: the partner is not caught up"));
    assert!(app.update.running.is_none());
    assert_eq!(app.on_key(key('u')), Some(Command::OfferUpdate), "after the answer another update may start");
    app.show_update(choices());
    assert!(screen(&app).contains("last update refused: refused: the partner is not caught up"), "{}", screen(&app));
    app.on_key(code(KeyCode::Esc));
    assert_eq!(app.overlay, Overlay::None);
}

#[test]
fn a_box_without_a_partner_updates_itself_and_a_read_only_console_not_at_all() {
    let mut alone = active();
    alone.partner = None;
    let mut app = app_in(Ok(alone), false);
    assert_eq!(app.on_key(key('u')), Some(Command::OfferUpdate));
    app.show_update(choices());
    app.on_key(key('j'));
    app.on_key(code(KeyCode::Enter));
    assert_eq!(app.overlay, Overlay::Confirm(Action::UpdateBox));
    assert!(screen(&app).contains("Update this box?"), "{}", screen(&app));
    // n cancels and sends nothing.
    assert_eq!(app.on_key(key('n')), None);
    assert_eq!(app.overlay, Overlay::None);

    let mut read_only = app_in(Ok(active()), false);
    read_only.read_only = true;
    assert_eq!(read_only.on_key(key('u')), None);
    assert!(read_only.message.as_deref().is_some_and(|m| m.contains("read-only")), "{:?}", read_only.message);

    let mut empty = app_in(Ok(active()), false);
    empty.show_update(UpdateChoices { bundles: Ok(vec![]), ..choices() });
    assert_eq!(empty.on_key(code(KeyCode::Enter)), None);
    assert_eq!(empty.overlay, Overlay::Update);
    assert!(screen(&empty).contains("no *.bundle in /var/lib/twinlease-bundles"), "{}", screen(&empty));
}

/// Keys, then the end of input.
struct Keys(VecDeque<KeyEvent>);

impl Input for Keys {
    fn next(&mut self, _: Duration) -> std::io::Result<Option<TermEvent>> {
        Ok(self.0.pop_front().map(TermEvent::Key))
    }
}

/// A box whose update answers at the first refresh after it started.
#[derive(Default)]
struct Updating {
    started: Vec<(PathBuf, bool)>,
    polls_since_start: Option<u32>,
}

impl Feed for Updating {
    fn poll(&mut self, _: Instant) -> Snapshot {
        let answered = self.polls_since_start.as_mut().is_some_and(|n| {
            *n += 1;
            *n == 1
        });
        let update_answer = answered.then(|| Ok("rebooting into the new slot".to_string()));
        Snapshot { update_answer, ..snapshot(Ok(active())) }
    }

    fn act(&mut self, action: Action) -> Result<String, String> {
        panic!("no action was confirmed, yet {action:?} was sent")
    }

    fn update_choices(&mut self) -> UpdateChoices {
        choices()
    }

    fn start_update(&mut self, bundle: &Path, pair: bool) {
        self.started.push((bundle.to_path_buf(), pair));
        self.polls_since_start = Some(0);
    }
}

#[test]
fn the_event_loop_starts_the_update_and_shows_its_answer() {
    let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
    let mut app = App::new(false, false);
    let mut feed = Updating::default();
    let keys = [key('u'), code(KeyCode::Down), code(KeyCode::Enter), key('y'), key('q')];
    event_loop(&mut terminal, &mut app, &mut feed, &mut Keys(keys.into_iter().collect())).unwrap();
    let bundle = PathBuf::from("/var/lib/twinlease-bundles/twinlease-x86_64-0.2.0.bundle");
    assert_eq!(feed.started, [(bundle, true)]);
    assert_eq!(app.update.answer, Some(Ok("rebooting into the new slot".to_string())));
}
