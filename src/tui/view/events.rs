//! View 4: the daemon's event ring (role changes, partner link, catch-ups, conflicts, store
//! faults, reloads, operator actions), newest first.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::Style;
use ratatui::widgets::{Paragraph, Row, Table, Widget, Wrap};

use super::{WIDE, block, render_scrolling, warn};
use crate::events::{Event, EventKind};
use crate::server::control::Status;
use crate::tui::data::utc;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsView {
    /// Newest first.
    pub events: Vec<Event>,
    /// Set while the daemon does not answer: the events shown are the last ones it gave.
    pub stale: bool,
    pub selected: usize,
    ascii: bool,
}

impl EventsView {
    pub fn new(ascii: bool) -> EventsView {
        EventsView { events: Vec::new(), stale: false, selected: 0, ascii }
    }

    pub fn apply(&mut self, status: &Result<Status, String>) {
        match status {
            Ok(s) => {
                self.events = s.events.iter().rev().cloned().collect();
                self.stale = false;
            }
            Err(_) => self.stale = true,
        }
        self.scroll(0);
    }

    pub fn scroll(&mut self, by: isize) {
        self.selected = self.selected.saturating_add_signed(by).min(self.events.len().saturating_sub(1));
    }
}

pub fn kind_name(k: EventKind) -> &'static str {
    match k {
        EventKind::Role => "role",
        EventKind::Partner => "partner",
        EventKind::CatchUp => "catch-up",
        EventKind::Conflict => "conflict",
        EventKind::Store => "store",
        EventKind::Config => "config",
        EventKind::Action => "action",
    }
}

impl Widget for &EventsView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let title = if self.stale {
            format!(" Events: {} (daemon not answering; last known) ", self.events.len())
        } else {
            format!(" Events: {} ", self.events.len())
        };
        let outer = block(title, self.ascii);
        if self.events.is_empty() {
            let text = if self.stale {
                "The event ring lives in the daemon, which does not answer."
            } else {
                "Nothing has happened since the daemon started."
            };
            return Paragraph::new(text).wrap(Wrap { trim: true }).block(outer).render(area, buf);
        }
        let wide = area.width >= WIDE;
        let rows = self.events.iter().map(|e| {
            let at = utc(e.wall_ms / 1000);
            let at = if wide { at } else { at[11..].to_string() };
            let kind = kind_name(e.kind);
            let style = if matches!(e.kind, EventKind::Store | EventKind::Conflict) { warn() } else { Style::new() };
            Row::new([at, kind.to_string(), e.text.clone()]).style(style)
        });
        let widths = [Constraint::Length(if wide { 19 } else { 8 }), Constraint::Length(8), Constraint::Fill(1)];
        let header = Row::new(["AT (UTC)", "KIND", "WHAT"]);
        render_scrolling(Table::new(rows, widths).block(outer), header, Some(self.selected), area, buf);
    }
}
