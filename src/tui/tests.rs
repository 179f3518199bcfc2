//! Every view rendered from fixed snapshots (insta, `TestBackend`) in the states an operator
//! meets: active, standby, not serving, daemon down, partner down; at 80×24, 132×43 and the
//! narrow 48×20. Then what the keys do, and the event loop over a test backend.

use std::collections::{BTreeMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{Event as TermEvent, KeyCode, KeyEvent};
use ratatui::style::Color;

use super::app::{Action, App, Command, Overlay, Tab};
use super::data::{ConflictRow, ConflictSide, LeaseRow, Snapshot};
use super::source::Feed;
use super::term::{Input, event_loop};
use crate::events::{Event, EventKind};
use crate::server::control::Status;
use crate::server::control::status::*;
use crate::server::eligibility::Maintenance;

/// 2026-11-18 06:13:20 UTC: every clock in the fixtures counts from it.
pub(super) const NOW: u64 = 1_795_000_000;

fn subnet(cidr: &str, total: u64, busy: u64) -> SubnetStatus {
    SubnetStatus {
        cidr: cidr.to_string(),
        total,
        free: total - busy,
        probing: 0,
        offered: busy / 10,
        leased: busy - busy / 10,
        declined: 0,
        reserved: 2,
        utilisation_pct: (busy as f64 * 1000.0 / total as f64).round() / 10.0,
    }
}

fn event(secs_ago: u64, kind: EventKind, text: &str) -> Event {
    Event {
        wall_ms: (NOW - secs_ago) * 1000,
        mono_ns: (100_000 - secs_ago) * 1_000_000_000,
        kind,
        text: text.to_string(),
    }
}

/// A healthy lease store.
fn store() -> StoreStatus {
    StoreStatus {
        path: "/var/lib/twinlease/leases.db".to_string(),
        size_bytes: 1 << 20,
        wal_bytes: 4096,
        disk_free_bytes: Some(1 << 30),
        can_commit: true,
        commits: 4211,
        transitions: 4800,
        commit_failures: 0,
        last_commit_us: 900,
        files_lost: 0,
        rebuilds: 0,
        wal_truncations: 3,
    }
}

/// box-a, active and serving, its partner linked and in sync.
pub(super) fn active() -> Status {
    Status {
        node: "box-a".to_string(),
        version: "0.1.0".to_string(),
        config_digest: "5f2c9a1b".to_string(),
        uptime_secs: 5400,
        summary: "serving all clients".to_string(),
        role: RoleStatus {
            state: "active".to_string(),
            serving: true,
            term: Some(3),
            why: Some("arbiter lease".to_string()),
            eligible: true,
            not_eligible_because: vec![],
            maintenance: None,
        },
        election: Some(ElectionStatus {
            interval_ms: 500,
            timeout_ms: 2000,
            lease_left_ms: Some(1600),
            hold_off_left_ms: None,
            promotions: 1,
            arbiter: ArbiterStatus {
                reachable: true,
                last_heartbeat_age_ms: Some(210),
                rtt_ms: Some(0.8),
                calls: 10_800,
                failed_calls: 2,
                last_error: None,
                primary: Some("box-a".to_string()),
                primary_term: Some(3),
            },
            promised_left_ms: None,
            third_box: None,
        }),
        partner: Some(PartnerStatus {
            address: "198.18.1.2:6767".to_string(),
            link_up: true,
            in_sync: true,
            rtt_ms: Some(0.4),
            readiness: "caught-up".to_string(),
            updates_sent: 812,
            updates_applied: 3,
            unsynced: 0,
            last_catch_up_unix_ms: Some((NOW - 5300) * 1000),
            catch_ups: 1,
            conflicts: 1,
            fenced: 0,
            ack_timeouts: 0,
            sessions: 1,
            config_digest: Some("5f2c9a1b".to_string()),
            config_differs: false,
            rejected_connections: 0,
            foreign_connections: 0,
            bad_frames: 0,
        }),
        subnets: vec![
            subnet("198.18.0.0/24", 151, 131),
            subnet("198.18.2.0/24", 100, 93),
            subnet("198.18.4.0/23", 400, 48),
        ],
        store: store(),
        dhcp: DhcpStatus {
            received: 9000,
            requests: BTreeMap::from([("discover".to_string(), 4400), ("request".to_string(), 4600)]),
            malformed: 0,
            replies: BTreeMap::from([("ack".to_string(), 4500), ("offer".to_string(), 4400)]),
            dropped: BTreeMap::new(),
            pool_exhausted: 0,
            offers_reclaimed: 0,
            send_errors: 0,
        },
        events: vec![
            event(5390, EventKind::Role, "became active (term 3)"),
            event(5300, EventKind::CatchUp, "catch-up with the partner complete: 812 bindings"),
            event(4000, EventKind::Conflict, "198.18.0.104: kept 01:02:00:00:00:00:04 (term 3) over term 2"),
            event(60, EventKind::Action, "configuration reloaded from /etc/twinlease/twinlease.toml (uid 0)"),
        ],
    }
}

/// box-b, standby while box-a serves.
fn standby() -> Status {
    let mut s = active();
    s.node = "box-b".to_string();
    s.summary = "standby: box-a serves".to_string();
    s.role.state = "standby".to_string();
    s.role.serving = false;
    s.role.term = None;
    s.role.why = None;
    let e = s.election.as_mut().unwrap();
    e.lease_left_ms = None;
    s.partner.as_mut().unwrap().address = "198.18.1.1:6767".to_string();
    s.dhcp.replies.clear();
    s
}

/// box-b, standby, the arbiter unreachable and the partner gone: nobody serves.
fn not_serving() -> Status {
    let mut s = partner_down(standby());
    s.summary = "NOT SERVING: arbiter unreachable".to_string();
    let a = &mut s.election.as_mut().unwrap().arbiter;
    a.reachable = false;
    a.last_heartbeat_age_ms = Some(7400);
    a.rtt_ms = None;
    a.last_error = Some("connection refused".to_string());
    s
}

/// The partner's link is down: this box serves alone and counts what the partner lacks.
fn partner_down(mut s: Status) -> Status {
    if s.role.serving {
        s.summary = "serving all clients (partner link down)".to_string();
    }
    let p = s.partner.as_mut().unwrap();
    p.link_up = false;
    p.in_sync = false;
    p.rtt_ms = None;
    p.readiness = "partner-unreachable".to_string();
    p.unsynced = 17;
    s.events.push(event(20, EventKind::Partner, "lease-sync link to the partner down"));
    s
}

fn lease(i: u8) -> LeaseRow {
    let state = match i % 7 {
        5 => "offered",
        6 if i > 20 => "declined",
        _ => "leased",
    };
    LeaseRow {
        address: Ipv4Addr::new(198, 18, 0, 100 + i),
        state: state.to_string(),
        client: format!("01:02:00:00:00:00:{i:02x}"),
        hw: format!("02:00:00:00:00:{i:02x}"),
        hostname: if i.is_multiple_of(3) { String::new() } else { format!("host-{i}") },
        expires: NOW + 3600 - u64::from(i) * 97,
        cltt: NOW - u64::from(i) * 97,
        term: 3,
        version: u64::from(i) + 1,
        synced: i % 9 != 4,
    }
}

fn side(addr: u8, client: &str, term: u64) -> ConflictSide {
    ConflictSide {
        address: Ipv4Addr::new(198, 18, 0, addr),
        state: "leased".to_string(),
        client: client.to_string(),
        term,
        cltt: NOW - 4000,
    }
}

fn conflicts() -> Vec<ConflictRow> {
    vec![
        ConflictRow {
            at: NOW - 4000,
            kind: "address".to_string(),
            kept: side(104, "01:02:00:00:00:00:04", 3),
            lost: side(104, "01:02:00:00:00:00:99", 2),
        },
        ConflictRow {
            at: NOW - 3000,
            kind: "client".to_string(),
            kept: side(110, "01:02:00:00:00:00:0a", 3),
            lost: side(140, "01:02:00:00:00:00:0a", 2),
        },
    ]
}

const DOWN: &str =
    "twinlease is not running (nothing answers on /run/twinlease/status.sock: Connection refused (os error 111))";

/// An app that has seen a minute of refreshes ending in `status` (the reply counter rising
/// unevenly, so the sparkline has a shape).
pub(super) fn app_in(status: Result<Status, String>, ascii: bool) -> App {
    let mut app = App::new(ascii, false);
    let start = Instant::now();
    let mut replies = 0;
    for i in 0..60u64 {
        let mut s = active();
        replies += (i * 7) % 23 + if (20..30).contains(&i) { 40 } else { 0 };
        s.dhcp.replies = BTreeMap::from([("ack".to_string(), replies)]);
        app.apply(snapshot(Ok(s)), start + Duration::from_secs(i));
    }
    let status = status.map(|mut s| {
        if !s.dhcp.replies.is_empty() {
            s.dhcp.replies = BTreeMap::from([("ack".to_string(), replies + 12)]);
        }
        s
    });
    app.apply(snapshot(status), start + Duration::from_secs(60));
    app
}

pub(super) fn snapshot(status: Result<Status, String>) -> Snapshot {
    let control = if status.is_ok() { Ok(()) } else { Err("the daemon is not running".to_string()) };
    Snapshot {
        taken_unix: NOW,
        status,
        leases: Some(Ok((0..40).map(lease).collect())),
        conflicts: Some(Ok(conflicts())),
        control,
        update_answer: None,
    }
}

fn states() -> Vec<(&'static str, Result<Status, String>)> {
    vec![
        ("active", Ok(active())),
        ("standby", Ok(standby())),
        ("not_serving", Ok(not_serving())),
        ("daemon_down", Err(DOWN.to_string())),
        ("partner_down", Ok(partner_down(active()))),
    ]
}

pub(super) fn render(app: &App, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut t = Terminal::new(TestBackend::new(width, height)).unwrap();
    t.draw(|f| f.render_widget(app, f.area())).unwrap();
    t
}

#[test]
fn every_view_in_every_state_at_every_size() {
    for (state, status) in states() {
        let mut app = app_in(status, false);
        for tab in Tab::ALL {
            app.tab = tab;
            for (w, h) in [(80, 24), (132, 43), (48, 20)] {
                let name = format!("{}_{state}_{w}x{h}", tab.title().to_lowercase());
                insta::assert_snapshot!(name, render(&app, w, h).backend());
            }
        }
    }
}

#[test]
fn overlays_and_the_ascii_console() {
    let mut app = app_in(Ok(active()), true);
    insta::assert_snapshot!("ascii_dashboard_active_80x25", render(&app, 80, 25).backend());
    app.tab = Tab::Leases;
    insta::assert_snapshot!("ascii_leases_active_80x25", render(&app, 80, 25).backend());
    let mut app = app_in(Ok(active()), false);
    app.overlay = Overlay::Help;
    insta::assert_snapshot!("help_80x24", render(&app, 80, 24).backend());
    app.overlay = Overlay::Confirm(Action::StepDown);
    insta::assert_snapshot!("confirm_step_down_80x24", render(&app, 80, 24).backend());
    app.overlay = Overlay::Confirm(Action::PartnerDown);
    insta::assert_snapshot!("confirm_partner_down_80x24", render(&app, 80, 24).backend());
    app.tab = Tab::Leases;
    app.overlay = Overlay::Lease(Ipv4Addr::new(198, 18, 0, 104));
    insta::assert_snapshot!("lease_details_80x24", render(&app, 80, 24).backend());
    app.overlay = Overlay::None;
    app.leases.set_filter("host-1".to_string());
    insta::assert_snapshot!("leases_filtered_80x24", render(&app, 80, 24).backend());
}

#[test]
fn pool_bars_turn_yellow_at_80_and_red_at_90_percent() {
    let app = app_in(Ok(active()), false);
    let t = render(&app, 80, 24);
    let buf = t.backend().buffer();
    // The pools block follows the panels; find each subnet's row by its label.
    let colour_of = |cidr: &str| {
        let y = (0..buf.area.height)
            .find(|y| (0..buf.area.width).map(|x| buf[(x, *y)].symbol().to_string()).collect::<String>().contains(cidr))
            .unwrap_or_else(|| panic!("{cidr} not on screen"));
        buf[(20, y)].fg
    };
    assert_eq!(colour_of("198.18.0.0/24"), Color::Yellow, "86.8 %");
    assert_eq!(colour_of("198.18.2.0/24"), Color::Red, "93 %");
    assert_eq!(colour_of("198.18.4.0/23"), Color::Green, "12 %");
}

pub(super) fn key(c: char) -> KeyEvent {
    KeyEvent::from(KeyCode::Char(c))
}

pub(super) fn code(c: KeyCode) -> KeyEvent {
    KeyEvent::from(c)
}

#[test]
fn number_keys_and_tab_switch_views_and_q_quits() {
    let mut app = app_in(Ok(active()), false);
    assert_eq!(app.tab, Tab::Dashboard);
    for (k, want) in [('2', Tab::Leases), ('3', Tab::Conflicts), ('4', Tab::Events), ('1', Tab::Dashboard)] {
        assert_eq!(app.on_key(key(k)), None);
        assert_eq!(app.tab, want);
    }
    app.on_key(code(KeyCode::Tab));
    assert_eq!(app.tab, Tab::Leases);
    app.on_key(code(KeyCode::BackTab));
    app.on_key(code(KeyCode::BackTab));
    assert_eq!(app.tab, Tab::Events, "Shift-Tab wraps around");
    app.on_key(key('?'));
    assert_eq!(app.overlay, Overlay::Help);
    assert_eq!(app.on_key(key('q')), None, "q closes the help first");
    assert_eq!(app.overlay, Overlay::None);
    assert_eq!(app.on_key(key('q')), Some(Command::Quit));
}

#[test]
fn slash_filters_leases_by_address_mac_or_hostname() {
    let mut app = app_in(Ok(active()), false);
    app.on_key(key('/'));
    assert_eq!((app.tab, app.leases.editing), (Tab::Leases, true), "/ goes to the lease table");
    for c in "HOST-1".chars() {
        app.on_key(key(c));
    }
    let hosts: Vec<String> = app.leases.visible().iter().map(|r| r.hostname.clone()).collect();
    assert_eq!(hosts, ["host-1", "host-10", "host-11", "host-13", "host-14", "host-16", "host-17", "host-19"]);
    assert_eq!(app.on_key(key('q')), None, "q is typed into the filter, not a quit");
    assert!(app.leases.visible().is_empty());
    app.on_key(code(KeyCode::Backspace));
    app.on_key(code(KeyCode::Enter));
    assert!(!app.leases.editing);
    assert_eq!(app.leases.visible().len(), 8, "the filter stays after Enter");
    app.on_key(code(KeyCode::Esc));
    assert_eq!(app.leases.visible().len(), 40, "Esc clears it");
    // By MAC and by address.
    app.leases.set_filter("02:00:00:00:00:0A".to_string());
    assert_eq!(app.leases.visible().iter().map(|r| r.address.to_string()).collect::<Vec<_>>(), ["198.18.0.110"]);
    app.leases.set_filter("0.13".to_string());
    assert_eq!(
        app.leases.visible().iter().map(|r| r.address.to_string()).collect::<Vec<_>>(),
        [
            "198.18.0.130",
            "198.18.0.131",
            "198.18.0.132",
            "198.18.0.133",
            "198.18.0.134",
            "198.18.0.135",
            "198.18.0.136",
            "198.18.0.137",
            "198.18.0.138",
            "198.18.0.139"
        ]
    );
}

#[test]
fn arrows_move_within_the_table_and_enter_opens_the_lease() {
    let mut app = app_in(Ok(active()), false);
    app.on_key(key('2'));
    app.on_key(code(KeyCode::Up));
    assert_eq!(app.leases.selected, 0, "stops at the top");
    app.on_key(key('j'));
    app.on_key(code(KeyCode::Down));
    app.on_key(key('k'));
    assert_eq!(app.leases.selected, 1);
    app.on_key(code(KeyCode::End));
    assert_eq!(app.leases.selected, 39, "stops at the bottom");
    app.on_key(code(KeyCode::Enter));
    assert_eq!(app.overlay, Overlay::Lease(Ipv4Addr::new(198, 18, 0, 139)));
    app.on_key(code(KeyCode::Esc));
    assert_eq!(app.overlay, Overlay::None);
    // A new reading keeps the selection on the same address.
    app.on_key(code(KeyCode::Home));
    app.on_key(key('j'));
    let mut s = snapshot(Ok(active()));
    s.leases = Some(Ok((1..40).map(lease).collect()));
    app.apply(s, Instant::now() + Duration::from_secs(61));
    assert_eq!(app.leases.selected_row().unwrap().address, Ipv4Addr::new(198, 18, 0, 101));
}

/// Declaring the partner down can put two servers on the LAN if the partner in fact runs: the
/// dialog says so and only a capital Y sends it.
#[test]
fn partner_down_takes_a_capital_y() {
    let mut app = app_in(Ok(standby()), false);
    assert_eq!(app.on_key(key('D')), None);
    assert_eq!(app.overlay, Overlay::Confirm(Action::PartnerDown));
    assert_eq!(app.on_key(code(KeyCode::Enter)), None, "Enter does not send it");
    assert_eq!(app.on_key(key('y')), None, "nor does a small y");
    assert_eq!(app.overlay, Overlay::Confirm(Action::PartnerDown));
    assert!(app.message.as_deref().unwrap().contains("capital Y"));
    assert_eq!(app.on_key(key('Y')), Some(Command::Act(Action::PartnerDown)));
    assert_eq!(app.overlay, Overlay::None);
    app.acted(Action::PartnerDown, Err("refused: the partner is reachable on the peer link".to_string()));
    assert_eq!(app.message.as_deref(), Some("partner-down refused: the partner is reachable on the peer link"));
    app.on_key(key('D'));
    assert_eq!(app.on_key(code(KeyCode::Esc)), None);
    assert_eq!(app.message.as_deref(), Some("partner-down: not sent"));
}

#[test]
fn actions_ask_first_and_only_when_allowed() {
    let mut app = app_in(Ok(active()), false);
    assert_eq!(app.on_key(key('s')), None);
    assert_eq!(app.overlay, Overlay::Confirm(Action::StepDown));
    assert_eq!(app.on_key(key('x')), None, "other keys leave the dialog open");
    assert_eq!(app.on_key(key('n')), None);
    assert_eq!(app.overlay, Overlay::None);
    assert_eq!(app.message.as_deref(), Some("step-down: not sent"));
    app.on_key(key('s'));
    assert_eq!(app.on_key(key('y')), Some(Command::Act(Action::StepDown)));
    app.acted(Action::StepDown, Ok("stepped down".to_string()));
    assert_eq!(app.message.as_deref(), Some("step-down: stepped down"));
    app.on_key(key('m'));
    assert_eq!(app.on_key(code(KeyCode::Esc)), None);
    app.on_key(key('m'));
    assert_eq!(app.on_key(code(KeyCode::Enter)), Some(Command::Act(Action::MaintenanceStart)));

    let mut in_maintenance = active();
    in_maintenance.role.maintenance = Some(Maintenance { since: NOW, by_uid: 0 });
    app.apply(snapshot(Ok(in_maintenance)), Instant::now() + Duration::from_secs(61));
    app.on_key(key('m'));
    assert_eq!(app.overlay, Overlay::Confirm(Action::MaintenanceCancel));

    let mut read_only = app_in(Ok(active()), false);
    read_only.read_only = true;
    read_only.on_key(key('s'));
    assert_eq!(read_only.overlay, Overlay::None);
    assert!(read_only.message.as_deref().unwrap().contains("read-only"));
    let mut down = app_in(Err(DOWN.to_string()), false);
    down.on_key(key('s'));
    assert_eq!(down.overlay, Overlay::None);
    assert!(down.message.as_deref().unwrap().contains("not running"));
    let mut denied = app_in(Ok(active()), false);
    let mut s = snapshot(Ok(active()));
    s.control = Err("the control socket needs root or the admin group".to_string());
    denied.apply(s, Instant::now() + Duration::from_secs(61));
    denied.on_key(key('m'));
    assert_eq!(denied.overlay, Overlay::None);
    assert!(denied.message.as_deref().unwrap().contains("admin group"));
}

#[test]
fn the_reply_rate_is_the_counter_rise_per_second() {
    let mut app = App::new(false, false);
    let t0 = Instant::now();
    for (secs, count) in [(0, 100), (1, 130), (3, 190), (4, 150)] {
        let mut s = active();
        s.dhcp.replies = BTreeMap::from([("ack".to_string(), count)]);
        app.apply(snapshot(Ok(s)), t0 + Duration::from_secs(secs));
    }
    // The daemon restarted between the last two: its counters began again.
    assert_eq!(app.dashboard.rates, VecDeque::from([30, 30, 0]));
}

/// Keys from a list, then the end of input.
pub(super) struct Script(pub(super) VecDeque<char>);

impl Input for Script {
    fn next(&mut self, _: Duration) -> std::io::Result<Option<TermEvent>> {
        Ok(self.0.pop_front().map(|c| TermEvent::Key(key(c))))
    }
}

struct Fixed {
    polls: usize,
    acted: Vec<Action>,
}

impl Feed for Fixed {
    fn poll(&mut self, _: Instant) -> Snapshot {
        self.polls += 1;
        snapshot(Ok(active()))
    }

    fn act(&mut self, action: Action) -> Result<String, String> {
        self.acted.push(action);
        Ok("stepped down".to_string())
    }

    fn update_choices(&mut self) -> crate::tui::data::UpdateChoices {
        unreachable!("this script does not press u")
    }

    fn start_update(&mut self, _: &std::path::Path, _: bool) {
        unreachable!("this script does not press u")
    }
}

#[test]
fn the_event_loop_draws_acts_and_quits() {
    let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
    let mut app = App::new(false, false);
    let mut feed = Fixed { polls: 0, acted: vec![] };
    event_loop(&mut terminal, &mut app, &mut feed, &mut Script("s2y2q".chars().collect())).unwrap();
    assert_eq!(feed.acted, [Action::StepDown], "only the confirmed action is sent");
    assert!(feed.polls >= 2, "an action is followed by a refresh");
    let screen = terminal.backend().to_string();
    assert!(screen.contains("Leases: 40 of 40"), "{screen}");
}

#[test]
fn an_unchanged_refresh_draws_nothing() {
    let mut app = app_in(Ok(active()), false);
    assert!(app.take_dirty());
    let later = Instant::now() + Duration::from_secs(100);
    let same = |app: &App| Snapshot {
        taken_unix: NOW,
        status: app.dashboard.status.clone(),
        leases: Some(Ok(app.leases.rows.clone())),
        conflicts: None,
        control: Ok(()),
        update_answer: None,
    };
    app.apply(same(&app), later);
    assert!(!app.take_dirty(), "nothing new: no drawing");
    let mut s = same(&app);
    s.status.as_mut().unwrap().uptime_secs += 1;
    app.apply(s, later);
    assert!(app.take_dirty());
    let mut s = same(&app);
    s.leases.as_mut().unwrap().as_mut().unwrap()[3].hostname = "renamed".to_string();
    app.apply(s, later);
    assert!(app.take_dirty(), "a changed lease is drawn");
}
