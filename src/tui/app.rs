//! The console's state and what each key does: no I/O here. The driver feeds it snapshots and
//! keys; keys that need the box (an action) come back as a [`Command`] for the driver to carry
//! out, and its answer comes back through [`App::acted`].

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Instant;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::data::{BundleRow, Snapshot, UpdateChoices};
use super::view::conflicts::ConflictsView;
use super::view::dashboard::DashboardView;
use super::view::events::EventsView;
use super::view::leases::LeasesView;
use crate::server::control::commands::PARTNER_DOWN_RISK;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tab {
    Dashboard,
    Leases,
    Conflicts,
    Events,
}

impl Tab {
    pub const ALL: [Tab; 4] = [Tab::Dashboard, Tab::Leases, Tab::Conflicts, Tab::Events];

    pub fn title(self) -> &'static str {
        match self {
            Tab::Dashboard => "Dashboard",
            Tab::Leases => "Leases",
            Tab::Conflicts => "Conflicts",
            Tab::Events => "Events",
        }
    }

    fn index(self) -> usize {
        Tab::ALL.iter().position(|t| *t == self).unwrap_or(0)
    }

    fn step(self, by: isize) -> Tab {
        Tab::ALL[(self.index() as isize + by).rem_euclid(Tab::ALL.len() as isize) as usize]
    }
}

/// An operator action on the control socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    StepDown,
    MaintenanceStart,
    MaintenanceCancel,
    /// The operator has seen that the partner box is off: serve without its vote.
    PartnerDown,
    /// The bundle chosen in the update dialog into both boxes, one after the other.
    UpdatePair,
    /// The bundle chosen in the update dialog into this box (no partner), then a reboot.
    UpdateBox,
}

impl Action {
    /// The question the confirmation dialog asks.
    pub fn question(self) -> &'static str {
        match self {
            Action::StepDown => "Step down?",
            Action::MaintenanceStart => "Start maintenance?",
            Action::MaintenanceCancel => "Cancel maintenance?",
            Action::PartnerDown => "Declare the partner down?",
            Action::UpdatePair => "Update both boxes?",
            Action::UpdateBox => "Update this box?",
        }
    }

    /// What happens if the operator says yes.
    pub fn consequence(self) -> &'static str {
        match self {
            Action::StepDown => "This box hands the service to its partner and holds off for T.",
            Action::MaintenanceStart => {
                "This box steps down and stays out of the election until maintenance is cancelled (also across restarts). Refused unless the partner is caught up."
            }
            Action::MaintenanceCancel => "This box may stand in the election again.",
            Action::PartnerDown => PARTNER_DOWN_RISK,
            Action::UpdatePair => {
                "The standby installs the bundle and reboots first; once it is back, healthy and caught up, the active box hands over and does the same. DHCP is served throughout; it takes several minutes, and a box that fails to come up healthy stops the roll."
            }
            Action::UpdateBox => {
                "This box installs the bundle and reboots into it: no DHCP from it until it is back (a few minutes). If the new version fails three boots, the old one boots again."
            }
        }
    }

    /// The keys that send it. Declaring the partner down, if the partner in fact runs, can
    /// put two servers on the LAN: it takes a capital Y, never a reflexive Enter or y.
    pub fn confirmed_by(self, code: KeyCode) -> bool {
        match self {
            Action::PartnerDown => code == KeyCode::Char('Y'),
            _ => matches!(code, KeyCode::Char('y' | 'Y') | KeyCode::Enter),
        }
    }

    /// The confirmation dialog's key line.
    pub fn confirm_keys(self) -> &'static str {
        match self {
            Action::PartnerDown => "Y (capital): send it     n / Esc: cancel",
            _ => "y / Enter: send it     n / Esc: cancel",
        }
    }
}

/// What sits on top of the current view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlay {
    None,
    Help,
    Confirm(Action),
    /// One lease's details and history.
    Lease(Ipv4Addr),
    /// The update dialog: this box's slots and the bundles to choose from.
    Update,
}

/// What the driver must do after a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Quit,
    Act(Action),
    /// Read the slots and the bundle directory for the update dialog ([`App::show_update`]).
    OfferUpdate,
    /// Start an update with this bundle: of both boxes (`pair`) or of this one; its answer
    /// comes with a later snapshot.
    Update {
        bundle: PathBuf,
        pair: bool,
    },
}

/// The update dialog and the update this console started.
#[derive(Debug, Clone, Default)]
pub struct UpdateDialog {
    pub choices: Option<UpdateChoices>,
    pub selected: usize,
    pub running: Option<RunningUpdate>,
    /// The last update's answer.
    pub answer: Option<Result<String, String>>,
}

/// The update this console started, until its answer comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningUpdate {
    /// The bundle's file name.
    pub file: String,
    pub version: String,
    /// Of both boxes (else of this one).
    pub pair: bool,
    /// Seconds since the epoch.
    pub since: u64,
}

impl UpdateDialog {
    pub fn selected_bundle(&self) -> Option<&BundleRow> {
        self.choices.as_ref()?.bundles.as_ref().ok()?.get(self.selected)
    }
}

/// The whole console.
#[derive(Debug, Clone)]
pub struct App {
    pub tab: Tab,
    pub overlay: Overlay,
    /// Box-drawing characters replaced by ASCII (the Linux VT's fonts may lack them).
    pub ascii: bool,
    /// Actions are off whatever the control socket allows.
    pub read_only: bool,
    pub dashboard: DashboardView,
    pub leases: LeasesView,
    pub conflicts: ConflictsView,
    pub events: EventsView,
    pub update: UpdateDialog,
    /// `Ok`: actions may be sent; `Err`: why not.
    pub control: Result<(), String>,
    /// One line for the operator (an action's answer, why a key did nothing); cleared by the
    /// next key.
    pub message: Option<String>,
    dirty: bool,
}

impl App {
    pub fn new(ascii: bool, read_only: bool) -> App {
        App {
            tab: Tab::Dashboard,
            overlay: Overlay::None,
            ascii,
            read_only,
            dashboard: DashboardView::new(ascii),
            leases: LeasesView::new(ascii),
            conflicts: ConflictsView::new(ascii),
            events: EventsView::new(ascii),
            update: UpdateDialog::default(),
            control: Err("not checked yet".to_string()),
            message: None,
            dirty: true,
        }
    }

    /// Takes in a refresh read at `now`; marks the screen for drawing if it shows anything new.
    pub fn apply(&mut self, s: Snapshot, now: Instant) {
        let mut changed = self.dashboard.status != s.status || self.control != s.control;
        // Countdowns in the lease table move with the clock.
        changed |= self.tab == Tab::Leases && self.leases.now_unix != s.taken_unix;
        self.events.apply(&s.status);
        self.dashboard.apply(s.status, now);
        if let Some(leases) = s.leases {
            changed |= self.leases.apply(leases);
        }
        self.leases.now_unix = s.taken_unix;
        if let Some(conflicts) = s.conflicts {
            changed |= self.conflicts.apply(conflicts);
        }
        self.control = s.control;
        if let Some(answer) = s.update_answer {
            self.update_finished(answer);
            changed = true;
        }
        self.dirty |= changed;
    }

    /// Whether the screen must be drawn again; clears the mark.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::replace(&mut self.dirty, false)
    }

    /// Marks the screen for drawing (after a resize).
    pub fn touch(&mut self) {
        self.dirty = true;
    }

    /// The answer to an action the driver sent.
    pub fn acted(&mut self, action: Action, answer: Result<String, String>) {
        self.message = Some(match answer {
            Ok(text) => format!("{}: {text}", action_name(action)),
            // The daemon's refusals may say "refused" themselves.
            Err(text) => {
                format!("{} refused: {}", action_name(action), text.strip_prefix("refused: ").unwrap_or(&text))
            }
        });
        self.dirty = true;
    }

    /// Opens the update dialog on what the driver read.
    pub fn show_update(&mut self, choices: UpdateChoices) {
        self.update.selected = 0;
        self.update.choices = Some(choices);
        self.overlay = Overlay::Update;
        self.dirty = true;
    }

    /// The driver started the update the operator confirmed.
    pub fn update_started(&mut self, pair: bool, now_unix: u64) {
        if let Some(b) = self.update.selected_bundle() {
            let version = b.version.clone().unwrap_or_default();
            self.update.running = Some(RunningUpdate { file: b.file.clone(), version, pair, since: now_unix });
            self.update.answer = None;
        }
        self.dirty = true;
    }

    fn update_finished(&mut self, answer: Result<String, String>) {
        let what = match self.update.running.take() {
            Some(RunningUpdate { version, pair: true, .. }) => format!("update of the pair to {version}"),
            Some(RunningUpdate { version, pair: false, .. }) => format!("update to {version}"),
            None => "update".to_string(),
        };
        self.message = Some(match &answer {
            Ok(text) => format!("{what}: {text}"),
            Err(text) => format!("{what} refused: {}", text.strip_prefix("refused: ").unwrap_or(text)),
        });
        self.update.answer = Some(answer);
    }

    pub fn on_key(&mut self, key: KeyEvent) -> Option<Command> {
        if key.kind != KeyEventKind::Press {
            return None;
        }
        self.dirty = true;
        self.message = None;
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Some(Command::Quit);
        }
        match self.overlay {
            Overlay::Confirm(action) => return self.on_confirm_key(action, key.code),
            Overlay::Update => return self.on_update_key(key.code),
            Overlay::Help | Overlay::Lease(_) => {
                if matches!(key.code, KeyCode::Esc | KeyCode::Enter | KeyCode::Char('q' | '?')) {
                    self.overlay = Overlay::None;
                }
                return None;
            }
            Overlay::None => {}
        }
        if self.tab == Tab::Leases && self.leases.editing {
            self.leases.edit(key.code);
            return None;
        }
        self.on_view_key(key.code)
    }

    fn on_confirm_key(&mut self, action: Action, code: KeyCode) -> Option<Command> {
        match code {
            code if action.confirmed_by(code) => {
                self.overlay = Overlay::None;
                match action {
                    Action::UpdatePair | Action::UpdateBox => {
                        let bundle = self.update.selected_bundle()?.path.clone();
                        Some(Command::Update { bundle, pair: action == Action::UpdatePair })
                    }
                    _ => Some(Command::Act(action)),
                }
            }
            KeyCode::Char('n' | 'N' | 'q') | KeyCode::Esc => {
                self.overlay = Overlay::None;
                self.message = Some(format!("{}: not sent", action_name(action)));
                None
            }
            _ if action == Action::PartnerDown => {
                self.message = Some("partner-down: a capital Y sends it, n cancels".to_string());
                None
            }
            _ => None,
        }
    }

    /// The update dialog: choose a bundle, Enter asks for confirmation.
    fn on_update_key(&mut self, code: KeyCode) -> Option<Command> {
        let count = self.update.choices.as_ref().and_then(|c| c.bundles.as_ref().ok()).map_or(0, Vec::len);
        match code {
            KeyCode::Esc | KeyCode::Char('q') => self.overlay = Overlay::None,
            KeyCode::Up | KeyCode::Char('k') => self.update.selected = self.update.selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => {
                self.update.selected = (self.update.selected + 1).min(count.saturating_sub(1));
            }
            KeyCode::Enter => match self.update.selected_bundle().map(|b| b.version.clone()) {
                None => self.message = Some("no bundle to install".to_string()),
                Some(Err(why)) => self.message = Some(format!("this bundle cannot be installed: {why}")),
                Some(Ok(_)) => {
                    let pair = self.dashboard.status.as_ref().is_ok_and(|s| s.partner.is_some());
                    self.overlay = Overlay::Confirm(if pair { Action::UpdatePair } else { Action::UpdateBox });
                }
            },
            _ => {}
        }
        None
    }

    fn on_view_key(&mut self, code: KeyCode) -> Option<Command> {
        match code {
            KeyCode::Char('q') => return Some(Command::Quit),
            KeyCode::Char(c @ '1'..='4') => self.tab = Tab::ALL[(c as u8 - b'1') as usize],
            KeyCode::Tab => self.tab = self.tab.step(1),
            KeyCode::BackTab => self.tab = self.tab.step(-1),
            KeyCode::Char('?') => self.overlay = Overlay::Help,
            KeyCode::Up | KeyCode::Char('k') => self.scroll(-1),
            KeyCode::Down | KeyCode::Char('j') => self.scroll(1),
            KeyCode::PageUp => self.scroll(-10),
            KeyCode::PageDown => self.scroll(10),
            KeyCode::Home | KeyCode::Char('g') => self.scroll(isize::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.scroll(isize::MAX / 2),
            KeyCode::Char('/') => {
                self.tab = Tab::Leases;
                self.leases.editing = true;
            }
            KeyCode::Esc if self.tab == Tab::Leases => self.leases.set_filter(String::new()),
            KeyCode::Enter if self.tab == Tab::Leases => {
                if let Some(row) = self.leases.selected_row() {
                    self.overlay = Overlay::Lease(row.address);
                }
            }
            KeyCode::Char('s') => self.ask(Action::StepDown),
            KeyCode::Char('D') => self.ask(Action::PartnerDown),
            KeyCode::Char('u') => return self.offer_update(),
            KeyCode::Char('m') => {
                let in_maintenance = self.dashboard.status.as_ref().is_ok_and(|s| s.role.maintenance.is_some());
                self.ask(if in_maintenance { Action::MaintenanceCancel } else { Action::MaintenanceStart });
            }
            _ => {}
        }
        None
    }

    fn scroll(&mut self, by: isize) {
        match self.tab {
            Tab::Dashboard => {}
            Tab::Leases => self.leases.scroll(by),
            Tab::Conflicts => self.conflicts.scroll(by),
            Tab::Events => self.events.scroll(by),
        }
    }

    /// Opens the confirmation dialog for `action`, or says why actions are off.
    fn ask(&mut self, action: Action) {
        match self.may_act() {
            Ok(()) => self.overlay = Overlay::Confirm(action),
            Err(why) => self.message = Some(why),
        }
    }

    /// The update dialog, unless actions are off or an update is already under way.
    fn offer_update(&mut self) -> Option<Command> {
        if let Err(why) = self.may_act() {
            self.message = Some(why);
            return None;
        }
        if let Some(RunningUpdate { file, since, .. }) = &self.update.running {
            self.message = Some(format!("{file} is being installed (since {} UTC)", super::data::utc(*since)));
            return None;
        }
        Some(Command::OfferUpdate)
    }

    /// Whether actions may be offered; if not, why.
    pub fn may_act(&self) -> Result<(), String> {
        if self.read_only {
            return Err("read-only console (--read-only): actions are off".to_string());
        }
        if self.dashboard.status.is_err() {
            return Err("the daemon is not running: no actions".to_string());
        }
        self.control.clone().map_err(|why| format!("actions are off: {why}"))
    }
}

fn action_name(action: Action) -> &'static str {
    match action {
        Action::StepDown => "step-down",
        Action::MaintenanceStart => "maintenance start",
        Action::MaintenanceCancel => "maintenance cancel",
        Action::PartnerDown => "partner-down",
        Action::UpdatePair => "update of the pair",
        Action::UpdateBox => "update",
    }
}
