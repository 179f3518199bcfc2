//! View 1: this box and its partner side by side (stacked when narrow), the pools' utilisation
//! and the reply rate.

use std::collections::VecDeque;
use std::time::Instant;

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::symbols;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Sparkline, Widget, Wrap};

use super::events::kind_name;
use super::{WIDE, bad, block, bold, good, warn};
use crate::server::control::Status;
use crate::server::control::status::{ElectionStatus, PartnerStatus, SubnetStatus};
use crate::tui::data::{span, utc};

/// Reply-rate samples kept (one per refresh).
const RATE_SAMPLES: usize = 240;

#[derive(Debug, Clone, PartialEq)]
pub struct DashboardView {
    /// The latest status, or why there is none.
    pub status: Result<Status, String>,
    /// Replies per second, oldest first.
    pub rates: VecDeque<u64>,
    /// Replies counted at the last status, and when it was read.
    last: Option<(u64, Instant)>,
    ascii: bool,
}

impl DashboardView {
    pub fn new(ascii: bool) -> DashboardView {
        DashboardView { status: Err("not read yet".to_string()), rates: VecDeque::new(), last: None, ascii }
    }

    /// Takes in a status read at `now`; the reply rate is the count's rise since the last one.
    pub fn apply(&mut self, status: Result<Status, String>, now: Instant) {
        if let Ok(s) = &status {
            let replies: u64 = s.dhcp.replies.values().sum();
            if let Some((before, at)) = self.last {
                let secs = now.saturating_duration_since(at).as_secs_f64();
                if secs > 0.0 {
                    self.rates.push_back((replies.saturating_sub(before) as f64 / secs).round() as u64);
                    if self.rates.len() > RATE_SAMPLES {
                        self.rates.pop_front();
                    }
                }
            }
            self.last = Some((replies, now));
        } else {
            self.last = None;
        }
        self.status = status;
    }
}

impl Widget for &DashboardView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let s = match &self.status {
            Ok(s) => s,
            Err(why) => return self.render_down(why, area, buf),
        };
        let (mut this, mut partner) = (this_box(s), partner_lines(s));
        let wide = area.width >= WIDE;
        let pools_height = s.subnets.len() + 2;
        let panels_height = if wide {
            this.len().max(partner.len()) + 2
        } else {
            // Stacked: what fits above the pools and a small rate line, the first lines (the
            // most telling) of each.
            let room = (area.height as usize).saturating_sub(pools_height + 3 + 4);
            partner.truncate(partner.len().min(room / 2).max(1));
            this.truncate(this.len().min(room - partner.len().min(room)).max(1));
            this.len() + partner.len() + 4
        };
        let rest = (area.height as usize).saturating_sub(panels_height + pools_height);
        let rate_height = if rest >= 12 { 7 } else { rest.max(3) };
        let [panels, subnets, rate, recent] = Layout::vertical([
            Constraint::Length(panels_height as u16),
            Constraint::Length(pools_height as u16),
            Constraint::Length(rate_height as u16),
            Constraint::Min(0),
        ])
        .areas(area);
        let [left, right] = if wide {
            Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(panels)
        } else {
            Layout::vertical([Constraint::Length(this.len() as u16 + 2), Constraint::Min(0)]).areas(panels)
        };
        Paragraph::new(this).block(block(format!(" This box: {} ", s.node), self.ascii)).render(left, buf);
        let title = match &s.partner {
            Some(p) => format!(" Partner {} ", p.address),
            None => " Partner ".to_string(),
        };
        Paragraph::new(partner).block(block(title, self.ascii)).render(right, buf);
        self.render_subnets(&s.subnets, subnets, buf);
        self.render_rate(rate, buf);
        if recent.height >= 3 {
            self.render_recent(s, recent, buf);
        }
    }
}

impl DashboardView {
    fn render_down(&self, why: &str, area: Rect, buf: &mut Buffer) {
        let text = vec![
            Line::styled("twinlease does not answer on its status socket.", bad()),
            Line::raw(why.to_string()),
            Line::raw(""),
            Line::raw("Leases (2) and Conflicts (3) are read from the lease store, read-only."),
            Line::raw("No actions until the daemon answers; this screen refreshes every second."),
        ];
        Paragraph::new(text).wrap(Wrap { trim: true }).block(block(" This box ", self.ascii)).render(area, buf);
    }

    fn render_subnets(&self, subnets: &[SubnetStatus], area: Rect, buf: &mut Buffer) {
        let outer = block(" Pools ", self.ascii);
        let inner = outer.inner(area);
        outer.render(area, buf);
        let (full, empty) = if self.ascii { ("#", ".") } else { ("█", "░") };
        for (i, n) in subnets.iter().enumerate().take(inner.height as usize) {
            let pct = n.utilisation_pct;
            let style = if pct >= 90.0 {
                Style::new().fg(Color::Red)
            } else if pct >= 80.0 {
                Style::new().fg(Color::Yellow)
            } else {
                Style::new().fg(Color::Green)
            };
            let label = format!("{:<18}", n.cidr);
            let figures = format!(" {pct:5.1} % {}/{}", n.total - n.free, n.total);
            let bar_width = (inner.width as usize).saturating_sub(label.len() + figures.len()).max(4);
            let filled = ((pct / 100.0) * bar_width as f64).round().clamp(0.0, bar_width as f64) as usize;
            let line = Line::from(vec![
                Span::raw(label),
                Span::styled(full.repeat(filled), style),
                Span::raw(empty.repeat(bar_width - filled)),
                Span::styled(figures, style),
            ]);
            let row = Rect::new(inner.x, inner.y + i as u16, inner.width, 1);
            line.render(row, buf);
        }
    }

    /// The newest events, as many as fit (all of them: view 4).
    fn render_recent(&self, s: &Status, area: Rect, buf: &mut Buffer) {
        let lines: Vec<Line<'static>> = s
            .events
            .iter()
            .rev()
            .take(area.height.saturating_sub(2) as usize)
            .map(|e| {
                Line::from(vec![
                    Span::raw(format!("{} ", &utc(e.wall_ms / 1000)[11..])),
                    Span::styled(format!("{:<8} ", kind_name(e.kind)), bold()),
                    Span::raw(e.text.clone()),
                ])
            })
            .collect();
        Paragraph::new(lines).block(block(" Recent events (4: all) ", self.ascii)).render(area, buf);
    }

    fn render_rate(&self, area: Rect, buf: &mut Buffer) {
        let now = self.rates.back().copied().unwrap_or(0);
        let peak = self.rates.iter().copied().max().unwrap_or(0);
        let title = format!(" Replies/s: {now} now, {peak} peak ");
        let outer = block(title, self.ascii);
        let inner = outer.inner(area);
        outer.render(area, buf);
        // Newest at the right edge: the history is padded with zeros on the left.
        let width = inner.width as usize;
        let mut shown = vec![0; width.saturating_sub(self.rates.len())];
        shown.extend(self.rates.iter().skip(self.rates.len().saturating_sub(width)));
        let bars = if self.ascii { ascii_bars() } else { symbols::bar::NINE_LEVELS };
        Sparkline::default()
            .data(&shown)
            .max(peak.max(1))
            .bar_set(bars)
            .style(Style::new().fg(Color::Cyan))
            .render(inner, buf);
    }
}

fn ascii_bars() -> symbols::bar::Set<'static> {
    symbols::bar::Set {
        full: "#",
        seven_eighths: "#",
        three_quarters: "=",
        five_eighths: "=",
        half: "-",
        three_eighths: "-",
        one_quarter: ".",
        one_eighth: ".",
        empty: " ",
    }
}

fn row(label: &str, value: impl Into<Span<'static>>) -> Line<'static> {
    Line::from(vec![Span::styled(format!("{label:<9} "), bold()), value.into()])
}

fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// This box: role and why, election lease vs T, arbiter, store, eligibility.
fn this_box(s: &Status) -> Vec<Line<'static>> {
    let r = &s.role;
    let mut role = r.state.clone();
    if let Some(t) = r.term {
        role.push_str(&format!(", term {t}"));
    }
    let mut lines = vec![row("role", Span::styled(role, if r.state == "active" { good() } else { Style::new() }))];
    if let Some(why) = &r.why {
        lines.push(row("why", why.clone()));
    }
    lines.push(row("serving", if r.serving { Span::styled("yes", good()) } else { Span::styled("no", warn()) }));
    match &s.election {
        Some(e) => lines.extend(election_lines(e)),
        None => lines.push(row("election", "none: the role is fixed")),
    }
    lines.push(row(
        "eligible",
        if r.eligible {
            Span::raw("yes")
        } else {
            Span::styled(format!("no: {}", r.not_eligible_because.join(", ")), warn())
        },
    ));
    let st = &s.store;
    lines.push(row(
        "store",
        if st.can_commit && st.commit_failures == 0 {
            Span::raw(format!("ok, {} commits", st.commits))
        } else if st.can_commit {
            Span::styled(format!("ok, {} commits, {} failed", st.commits, st.commit_failures), warn())
        } else {
            Span::styled("CANNOT COMMIT", bad())
        },
    ));
    lines.push(row("uptime", format!("{}, twinlease {}", span(s.uptime_secs), s.version)));
    lines
}

fn election_lines(e: &ElectionStatus) -> Vec<Line<'static>> {
    let t = format!("T {}, I {}", secs(e.timeout_ms), secs(e.interval_ms));
    let lease = match (e.lease_left_ms, e.hold_off_left_ms) {
        (Some(left), _) => format!("{} of {t}", secs(left)),
        (None, Some(hold)) => format!("hold-off {}, {t}", secs(hold)),
        (None, None) => format!("not held, {t}"),
    };
    let a = &e.arbiter;
    let rtt = a.rtt_ms.map(|r| format!(", rtt {r:.1} ms")).unwrap_or_default();
    let arbiter =
        if a.reachable { Span::styled(format!("reachable{rtt}"), good()) } else { Span::styled("UNREACHABLE", bad()) };
    let beat = a.last_heartbeat_age_ms.map_or_else(|| "none confirmed".to_string(), |age| format!("{} ago", secs(age)));
    let primary = match (&a.primary, a.primary_term) {
        (Some(p), Some(t)) => format!("{p}, term {t}"),
        _ => "nobody".to_string(),
    };
    let mut lines = vec![row("lease", lease), row("arbiter", arbiter), row("heartbeat", beat), row("primary", primary)];
    if let Some(err) = a.last_error.as_deref().filter(|_| !a.reachable) {
        lines.push(row("error", Span::styled(err.to_string(), warn())));
    }
    lines
}

/// The partner as this box sees it over the peer link.
fn partner_lines(s: &Status) -> Vec<Line<'static>> {
    let Some(p) = &s.partner else {
        return vec![Line::raw("none configured (no [peer]): this box serves alone")];
    };
    let link = if p.link_up {
        Span::styled(format!("up{}", p.rtt_ms.map(|r| format!(", rtt {r:.1} ms")).unwrap_or_default()), good())
    } else {
        Span::styled("DOWN", bad())
    };
    let sync = if p.in_sync { Span::styled("in sync", good()) } else { Span::styled("NOT in sync", warn()) };
    let unsynced = Span::styled(format!("{} updates", p.unsynced), if p.unsynced > 0 { warn() } else { Style::new() });
    let catch_up = match p.last_catch_up_unix_ms {
        Some(ms) => format!("{} UTC", utc(ms / 1000)),
        None => "none yet".to_string(),
    };
    let mut conflicts = format!("{} resolved", p.conflicts);
    if p.ack_timeouts > 0 {
        conflicts.push_str(&format!(", {} ack timeouts", p.ack_timeouts));
    }
    vec![
        row("link", link),
        row("sync", sync),
        row("readiness", p.readiness.clone()),
        row("unsynced", unsynced),
        row("catch-up", catch_up),
        row("conflicts", conflicts),
        row("config", config_line(p)),
    ]
}

fn config_line(p: &PartnerStatus) -> Span<'static> {
    match (&p.config_digest, p.config_differs) {
        (Some(d), true) => Span::styled(format!("DIFFERS (partner {d})"), bad()),
        (Some(_), false) => Span::raw("same as this box"),
        (None, _) => Span::raw("not known yet"),
    }
}
