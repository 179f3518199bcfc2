//! Drawing: `impl Widget for &App` lays out the frame (tabs, the summary or the daemon-down
//! banner, the current view, the key line, an overlay) and each view draws itself with
//! `impl Widget for &View`. Nothing here reads a socket, a file or a clock.

pub mod conflicts;
pub mod dashboard;
pub mod events;
pub mod leases;
mod popup;

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, StatefulWidget, Table, TableState, Tabs, Widget, Wrap};

use super::app::{App, Overlay, Tab};

/// Widths below this get the narrow layouts (stacked panels, fewer columns).
pub const WIDE: u16 = 80;

/// Box drawing on terminals that have it, ASCII on those that may not (the Linux VT).
pub fn border_set(ascii: bool) -> symbols::border::Set<'static> {
    if ascii {
        symbols::border::Set {
            top_left: "+",
            top_right: "+",
            bottom_left: "+",
            bottom_right: "+",
            vertical_left: "|",
            vertical_right: "|",
            horizontal_top: "-",
            horizontal_bottom: "-",
        }
    } else {
        symbols::border::PLAIN
    }
}

/// A bordered block with `title`.
pub fn block(title: impl Into<Line<'static>>, ascii: bool) -> Block<'static> {
    Block::bordered().border_set(border_set(ascii)).title(title)
}

/// Bold, for labels and headers.
pub fn bold() -> Style {
    Style::new().add_modifier(Modifier::BOLD)
}

/// How a state reads at a glance: fine, worth a look, wrong.
pub fn good() -> Style {
    Style::new().fg(Color::Green)
}

pub fn warn() -> Style {
    Style::new().fg(Color::Yellow)
}

pub fn bad() -> Style {
    Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
}

/// Draws a bordered table with a bold header and row `selected` highlighted (`None`: no
/// selection). The selection stays on screen: the table scrolls only once it reaches the bottom.
pub fn render_scrolling(table: Table<'_>, header: Row<'_>, selected: Option<usize>, area: Rect, buf: &mut Buffer) {
    let table = table
        .header(header.style(bold()))
        .highlight_symbol(">")
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    // Two border lines and the header.
    let height = area.height.saturating_sub(3) as usize;
    let mut state = TableState::default();
    if let Some(selected) = selected {
        let offset = (selected + 1).saturating_sub(height.max(1));
        state = state.with_selected(Some(selected)).with_offset(offset);
    }
    StatefulWidget::render(table, area, buf, &mut state);
}

impl Widget for &App {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let summary_text = self.summary_line();
        let summary_height = if summary_text.width() > area.width as usize { 2 } else { 1 };
        let [tabs, summary, body, keys] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(summary_height),
            Constraint::Min(0),
            Constraint::Length(1),
        ])
        .areas(area);
        self.render_tabs(tabs, buf);
        Paragraph::new(summary_text).wrap(Wrap { trim: true }).render(summary, buf);
        match self.tab {
            Tab::Dashboard => self.dashboard.render(body, buf),
            Tab::Leases => self.leases.render(body, buf),
            Tab::Conflicts => self.conflicts.render(body, buf),
            Tab::Events => self.events.render(body, buf),
        }
        self.key_line(area.width).render(keys, buf);
        match self.overlay {
            Overlay::None => {}
            Overlay::Help => popup::help(self, area, buf),
            Overlay::Confirm(action) => popup::confirm(action, self, area, buf),
            Overlay::Lease(address) => popup::lease(address, self, area, buf),
            Overlay::Update => popup::update(self, area, buf),
        }
    }
}

impl App {
    fn render_tabs(&self, area: Rect, buf: &mut Buffer) {
        let short = area.width < 60;
        let titles = Tab::ALL.iter().enumerate().map(|(i, t)| {
            let name = match (short, t) {
                (true, Tab::Dashboard) => "Dash",
                (true, Tab::Conflicts) => "Confl.",
                _ => t.title(),
            };
            format!("{} {name}", i + 1)
        });
        let selected = Tab::ALL.iter().position(|t| *t == self.tab);
        Tabs::new(titles)
            .select(selected)
            .divider("|")
            .padding(" ", " ")
            .highlight_style(Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD))
            .render(area, buf);
    }

    /// The box's state in words, or the banner saying the daemon does not answer.
    fn summary_line(&self) -> Line<'static> {
        match &self.dashboard.status {
            Ok(s) => {
                let style = if s.summary.starts_with("NOT SERVING") {
                    Style::new().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD)
                } else if s.role.serving {
                    good().add_modifier(Modifier::BOLD)
                } else {
                    Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD)
                };
                Line::from(vec![Span::styled(format!("{}: ", s.node), bold()), Span::styled(s.summary.clone(), style)])
            }
            Err(_) => Line::styled(
                "DAEMON NOT RUNNING: leases shown from the store, read-only",
                Style::new().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD),
            ),
        }
    }

    fn key_line(&self, width: u16) -> Paragraph<'static> {
        if let Some(m) = &self.message {
            return Paragraph::new(Line::styled(m.clone(), warn().add_modifier(Modifier::BOLD)));
        }
        if self.tab == Tab::Leases && self.leases.editing {
            return Paragraph::new("type to filter  Enter keep  Esc clear");
        }
        if let Some(u) = &self.update.running {
            let what = if u.pair { "updating the pair with" } else { "updating this box with" };
            let line = format!("{what} {} since {} UTC", u.file, crate::tui::data::utc(u.since));
            return Paragraph::new(Line::styled(line, Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD)));
        }
        if width < WIDE {
            return Paragraph::new(Line::styled("1-4 views  / filter  ? keys  q quit", Style::new().fg(Color::Gray)));
        }
        // The moves (arrows, j/k, PgUp/PgDn) are in the help: with the actions, all of them
        // would not fit in 80 columns.
        let mut keys = "1-4/Tab views  / filter  ? help  ".to_string();
        if self.may_act().is_ok() {
            keys.push_str("s step-down  m maintenance  u update  ");
        } else {
            keys.push_str("(read-only)  ");
        }
        keys.push_str("q quit");
        Paragraph::new(Line::styled(keys, Style::new().fg(Color::Gray)))
    }
}

/// `area` shrunk to at most `width` × `height`, centred.
pub fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let (w, h) = (width.min(area.width), height.min(area.height));
    Rect::new(area.x + (area.width - w) / 2, area.y + (area.height - h) / 2, w, h)
}
