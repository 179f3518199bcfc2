//! View 3: the conflicts lease sync resolved, newest first.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::widgets::{Paragraph, Row, Table, Widget, Wrap};

use super::{WIDE, block, render_scrolling};
use crate::tui::data::{ConflictRow, ConflictSide, utc};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictsView {
    /// Newest first.
    pub rows: Vec<ConflictRow>,
    pub error: Option<String>,
    pub selected: usize,
    ascii: bool,
}

impl ConflictsView {
    pub fn new(ascii: bool) -> ConflictsView {
        ConflictsView { rows: Vec::new(), error: None, selected: 0, ascii }
    }

    /// A new reading of the store; returns whether anything shown changed.
    pub fn apply(&mut self, rows: Result<Vec<ConflictRow>, String>) -> bool {
        let changed = match rows {
            Ok(mut rows) => {
                rows.sort_by_key(|r| std::cmp::Reverse(r.at));
                let changed = rows != self.rows || self.error.is_some();
                self.rows = rows;
                self.error = None;
                changed
            }
            Err(e) => self.error.replace(e.clone()) != Some(e),
        };
        self.scroll(0);
        changed
    }

    pub fn scroll(&mut self, by: isize) {
        self.selected = self.selected.saturating_add_signed(by).min(self.rows.len().saturating_sub(1));
    }
}

fn side(s: &ConflictSide) -> String {
    format!("{} (term {})", s.client, s.term)
}

impl Widget for &ConflictsView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let outer = block(format!(" Conflicts resolved: {} ", self.rows.len()), self.ascii);
        if let Some(e) = &self.error {
            return Paragraph::new(format!("The lease store could not be read: {e}")).block(outer).render(area, buf);
        }
        if self.rows.is_empty() {
            let text = "None: the two boxes have never disagreed on a binding.";
            return Paragraph::new(text).wrap(Wrap { trim: true }).block(outer).render(area, buf);
        }
        // Wide: both sides in full; 80 columns: the clients; narrow: the kept client.
        let full = area.width >= 120;
        let rows = self.rows.iter().map(|c| {
            let at = utc(c.at);
            if full {
                let address = if c.kept.address == c.lost.address {
                    c.kept.address.to_string()
                } else {
                    format!("{} / {}", c.kept.address, c.lost.address)
                };
                Row::new([at, c.kind.clone(), address, side(&c.kept), side(&c.lost)])
            } else if area.width >= WIDE {
                let row = [at[5..16].to_string(), c.kind.clone(), c.kept.address.to_string()];
                Row::new(row.into_iter().chain([c.kept.client.clone(), c.lost.client.clone()]))
            } else {
                Row::new([at[11..].to_string(), c.kept.address.to_string(), c.kept.client.clone()])
            }
        });
        let (header, widths) = if full {
            (Row::new(["AT (UTC)", "KIND", "ADDRESS", "KEPT", "LOST"]), vec![19, 7, 27, 0, 0])
        } else if area.width >= WIDE {
            (Row::new(["AT (UTC)", "KIND", "ADDRESS", "KEPT", "LOST"]), vec![11, 7, 15, 0, 0])
        } else {
            (Row::new(["AT", "ADDRESS", "KEPT"]), vec![8, 15, 0])
        };
        let widths = widths.into_iter().map(|w| if w == 0 { Constraint::Fill(1) } else { Constraint::Length(w) });
        render_scrolling(Table::new(rows, widths).block(outer), header, Some(self.selected), area, buf);
    }
}
