//! View 2: the lease table, sorted by address, scrollable, filtered by `/`.

use ratatui::buffer::Buffer;
use ratatui::crossterm::event::KeyCode;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Row, Table, Widget};

use super::{WIDE, bad, block, render_scrolling};
use crate::tui::data::{LeaseRow, span};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasesView {
    /// Sorted by address.
    pub rows: Vec<LeaseRow>,
    /// Why the store could not be read, if it could not.
    pub error: Option<String>,
    /// Lower case; matched against address, MAC and hostname.
    pub filter: String,
    /// `/` was pressed: keys go into the filter.
    pub editing: bool,
    /// Index into the filtered rows.
    pub selected: usize,
    /// The wall clock the countdowns count from.
    pub now_unix: u64,
    ascii: bool,
}

impl LeasesView {
    pub fn new(ascii: bool) -> LeasesView {
        LeasesView {
            rows: Vec::new(),
            error: None,
            filter: String::new(),
            editing: false,
            selected: 0,
            now_unix: 0,
            ascii,
        }
    }

    /// A new reading of the store; the selection stays on the same address where it can.
    /// Returns whether anything shown changed.
    pub fn apply(&mut self, rows: Result<Vec<LeaseRow>, String>) -> bool {
        let keep = self.selected_row().map(|r| r.address);
        let changed = match rows {
            Ok(mut rows) => {
                rows.sort_by_key(|r| r.address);
                let changed = rows != self.rows || self.error.is_some();
                self.rows = rows;
                self.error = None;
                changed
            }
            Err(e) => self.error.replace(e.clone()) != Some(e),
        };
        if let Some(addr) = keep {
            self.selected = self.visible().iter().position(|r| r.address >= addr).unwrap_or(0);
        }
        self.clamp();
        changed
    }

    /// The rows the filter lets through.
    pub fn visible(&self) -> Vec<&LeaseRow> {
        self.rows.iter().filter(|r| r.matches(&self.filter)).collect()
    }

    pub fn selected_row(&self) -> Option<&LeaseRow> {
        self.visible().get(self.selected).copied()
    }

    pub fn scroll(&mut self, by: isize) {
        self.selected = self.selected.saturating_add_signed(by);
        self.clamp();
    }

    pub fn set_filter(&mut self, filter: String) {
        self.filter = filter.to_lowercase();
        self.selected = 0;
    }

    /// A key while the filter is being typed.
    pub fn edit(&mut self, code: KeyCode) {
        match code {
            KeyCode::Enter => self.editing = false,
            KeyCode::Esc => {
                self.editing = false;
                self.set_filter(String::new());
            }
            KeyCode::Backspace => {
                let mut f = self.filter.clone();
                f.pop();
                self.set_filter(f);
            }
            KeyCode::Char(c) => self.set_filter(format!("{}{c}", self.filter)),
            _ => {}
        }
    }

    fn clamp(&mut self) {
        self.selected = self.selected.min(self.visible().len().saturating_sub(1));
    }

    fn expires(&self, r: &LeaseRow) -> String {
        match r.state.as_str() {
            "free" => "-".to_string(),
            _ if r.expires <= self.now_unix => "expired".to_string(),
            _ => format!("in {}", span(r.expires - self.now_unix)),
        }
    }
}

impl Widget for &LeasesView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let show_filter = self.editing || !self.filter.is_empty();
        let [table_area, filter_area] =
            Layout::vertical([Constraint::Min(0), Constraint::Length(u16::from(show_filter))]).areas(area);
        let visible = self.visible();
        let mut title = format!(" Leases: {} of {} ", visible.len(), self.rows.len());
        if let Some(e) = &self.error {
            title = format!(" Leases: store not readable: {e} ");
        }
        let outer = block(Line::styled(title, if self.error.is_some() { bad() } else { Style::new() }), self.ascii);
        // Columns by width: the client identifier only where there is room for it.
        let columns: &[(&str, u16)] = match area.width {
            w if w >= 120 => &[
                ("ADDRESS", 15),
                ("STATE", 8),
                ("CLIENT", 24),
                ("HW", 17),
                ("HOSTNAME", 0),
                ("EXPIRES", 12),
                ("TERM", 4),
            ],
            w if w >= WIDE => {
                &[("ADDRESS", 15), ("STATE", 8), ("HW", 17), ("HOSTNAME", 0), ("EXPIRES", 12), ("TERM", 4)]
            }
            _ => &[("ADDRESS", 15), ("STATE", 8), ("HOSTNAME", 0), ("EXPIRES", 9)],
        };
        let rows = visible.iter().map(|r| {
            Row::new(columns.iter().map(|(name, _)| match *name {
                "ADDRESS" => r.address.to_string(),
                "STATE" => r.state.clone(),
                "CLIENT" => r.client.clone(),
                "HW" => r.hw.clone(),
                "HOSTNAME" if r.hostname.is_empty() => "-".to_string(),
                "HOSTNAME" => r.hostname.clone(),
                "EXPIRES" => self.expires(r),
                _ => r.term.to_string(),
            }))
        });
        let header = Row::new(columns.iter().map(|(name, _)| *name));
        let widths = columns.iter().map(|(_, w)| if *w == 0 { Constraint::Fill(1) } else { Constraint::Length(*w) });
        let selected = (!visible.is_empty()).then_some(self.selected);
        render_scrolling(Table::new(rows, widths).block(outer), header, selected, table_area, buf);
        if show_filter {
            let cursor = if self.editing { "_" } else { "" };
            Paragraph::new(format!("/{}{cursor}", self.filter)).render(filter_area, buf);
        }
    }
}
