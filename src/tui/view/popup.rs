//! What opens on top of a view: the key help, an action's confirmation, one lease's details,
//! the update dialog.

use std::net::Ipv4Addr;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Clear, Paragraph, Widget, Wrap};

use super::events::kind_name;
use super::{bad, block, bold, centered, warn};
use crate::tui::app::{Action, App};
use crate::tui::data::{span, utc};

fn show(title: String, lines: Vec<Line<'static>>, width: u16, app: &App, area: Rect, buf: &mut Buffer) {
    // Rows once wrapped (word wrapping may need a little more: one spare row).
    let inner = width.min(area.width).saturating_sub(2).max(1) as usize;
    let rows: usize = lines.iter().map(|l| l.width().div_ceil(inner).max(1)).sum();
    let spare = usize::from(lines.iter().any(|l| l.width() > inner));
    let at = centered(area, width, (rows + spare) as u16 + 2);
    Clear.render(at, buf);
    Paragraph::new(lines).wrap(Wrap { trim: false }).block(block(title, app.ascii)).render(at, buf);
}

pub(super) fn help(app: &App, area: Rect, buf: &mut Buffer) {
    let mut lines: Vec<Line<'static>> = [
        "1 2 3 4    Dashboard, Leases, Conflicts, Events",
        "Tab        next view (Shift-Tab: previous)",
        "Up Down    move (also j k, PgUp PgDn, g G)",
        "/          filter leases by address, MAC, host",
        "Enter      one lease's details and history",
        "Esc        close, clear the filter",
        "s          step down (hand over to the partner)",
        "m          start or cancel maintenance",
        "D          partner down (only once seen to be off)",
        "u          update from a bundle (this box or the pair)",
        "q          quit (Ctrl-C too)",
    ]
    .into_iter()
    .map(Line::raw)
    .collect();
    lines.push(Line::raw(""));
    lines.push(match app.may_act() {
        Ok(()) => Line::raw("Actions ask before they are sent."),
        Err(why) => Line::styled(why, warn()),
    });
    show(" Keys ".to_string(), lines, 56, app, area, buf);
}

pub(super) fn confirm(action: Action, app: &App, area: Rect, buf: &mut Buffer) {
    let node = app.dashboard.status.as_ref().map(|s| s.node.clone()).unwrap_or_default();
    let mut lines = vec![Line::styled(format!("{} ({node})", action.question()), bold()), Line::raw("")];
    if matches!(action, Action::UpdatePair | Action::UpdateBox)
        && let Some(b) = app.update.selected_bundle()
    {
        lines.push(Line::raw(format!("{}: version {}", b.file, b.version.as_deref().unwrap_or("?"))));
        lines.push(Line::raw(""));
    }
    lines.extend([Line::raw(action.consequence()), Line::raw(""), Line::styled(action.confirm_keys(), warn())]);
    show(" Confirm ".to_string(), lines, 50, app, area, buf);
}

/// The update dialog: this box's slots, then the bundles in the bundle directory (those that
/// cannot go into this box say why), and the last update's answer.
pub(super) fn update(app: &App, area: Rect, buf: &mut Buffer) {
    let Some(c) = &app.update.choices else { return };
    let mut lines = vec![match &c.slots {
        Ok(slots) => field("slots", slots.clone()),
        Err(why) => Line::styled(format!("slots unknown: {why}"), warn()),
    }];
    lines.push(Line::raw(""));
    match &c.bundles {
        Err(why) => lines.push(Line::styled(format!("no bundles: {why}"), bad())),
        Ok(rows) if rows.is_empty() => lines.push(Line::styled(format!("no *.bundle in {}", c.dir), warn())),
        Ok(rows) => {
            lines.push(Line::styled(format!("Bundles in {}", c.dir), bold()));
            for (i, b) in rows.iter().enumerate() {
                let mark = if i == app.update.selected { ">" } else { " " };
                let mb = b.bytes as f64 / 1e6;
                let line = match &b.version {
                    Ok(v) => Line::raw(format!("{mark} {}  {v}, {mb:.1} MB", b.file)),
                    Err(why) => Line::styled(format!("{mark} {}  {why}", b.file), warn()),
                };
                lines.push(if i == app.update.selected { line.patch_style(bold()) } else { line });
            }
        }
    }
    if let Some(answer) = &app.update.answer {
        lines.push(Line::raw(""));
        lines.push(match answer {
            Ok(text) => Line::raw(format!("last update: {text}")),
            Err(text) => Line::styled(format!("last update refused: {text}"), bad()),
        });
    }
    lines.push(Line::raw(""));
    lines.push(Line::styled("Up/Down choose  Enter install  Esc close", warn()));
    show(" Update ".to_string(), lines, 72, app, area, buf);
}

fn field(label: &str, value: String) -> Line<'static> {
    Line::from(vec![ratatui::text::Span::styled(format!("{label:<9} "), bold()), value.into()])
}

/// One lease: every field the store keeps, then what is known of its past: the conflicts
/// that touched it and the events that name it (the store keeps no log of earlier holders).
pub(super) fn lease(address: Ipv4Addr, app: &App, area: Rect, buf: &mut Buffer) {
    let Some(r) = app.leases.rows.iter().find(|r| r.address == address) else {
        return show(format!(" {address} "), vec![Line::styled("no longer in the store", bad())], 40, app, area, buf);
    };
    let now = app.leases.now_unix;
    let left = if r.expires > now { format!("in {}", span(r.expires - now)) } else { "past".to_string() };
    let holder = if r.state == "free" { "previous" } else { "client" };
    let mut lines = vec![
        field("state", r.state.clone()),
        field(holder, r.client.clone()),
        field("hw", r.hw.clone()),
        field("hostname", if r.hostname.is_empty() { "-".to_string() } else { r.hostname.clone() }),
        field("expires", format!("{} UTC ({left})", utc(r.expires))),
        field("last seen", format!("{} UTC", utc(r.cltt))),
        field("term", format!("{}, version {}", r.term, r.version)),
        field("partner", if r.synced { "holds this version" } else { "not yet told" }.to_string()),
        Line::raw(""),
        Line::styled("History", bold()),
    ];
    let mut history: Vec<Line<'static>> = app
        .conflicts
        .rows
        .iter()
        .filter(|c| c.involves(address))
        .map(|c| {
            Line::styled(
                format!("{} {} conflict: kept {}, lost {}", utc(c.at), c.kind, c.kept.client, c.lost.client),
                warn(),
            )
        })
        .collect();
    let needle = address.to_string();
    history.extend(
        app.events
            .events
            .iter()
            .filter(|e| e.text.split(|c: char| !(c.is_ascii_digit() || c == '.')).any(|w| w == needle))
            .map(|e| Line::raw(format!("{} {}: {}", utc(e.wall_ms / 1000), kind_name(e.kind), e.text))),
    );
    if history.is_empty() {
        history.push(Line::raw("no conflicts or events name this address"));
    }
    lines.extend(history.into_iter().take(8));
    show(format!(" Lease {address} "), lines, 72, app, area, buf);
}
