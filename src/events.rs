//! The event ring: the last [`CAPACITY`] things an operator wants to see happened (role changes,
//! catch-ups, conflicts, store faults, configuration reloads, operator actions), each with its
//! wall-clock and CLOCK_MONOTONIC time. The status socket shows it; the log has the details.
//! Any task or thread may record one; recording never blocks on a reader for long (one short
//! mutex section).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// Events kept; older ones are dropped.
pub const CAPACITY: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// This box became active or standby.
    Role,
    /// The lease-sync link to the partner came up or went down; the partner is in sync or not.
    Partner,
    /// Catch-up with the partner completed.
    CatchUp,
    /// Lease sync resolved a conflict between the two boxes' bindings.
    Conflict,
    /// The lease store failed, recovered, or its file was lost and rewritten.
    Store,
    /// The configuration was reloaded (or a reload was refused).
    Config,
    /// An operator action on the control socket.
    Action,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Milliseconds since the Unix epoch.
    pub wall_ms: u64,
    /// CLOCK_MONOTONIC nanoseconds (the same clock as the role-change log lines).
    pub mono_ns: u64,
    pub kind: EventKind,
    pub text: String,
}

/// A shared handle on the ring; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Events(Arc<Mutex<VecDeque<Event>>>);

impl Events {
    pub fn record(&self, kind: EventKind, text: impl Into<String>) {
        let wall_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        let event = Event {
            wall_ms: wall_ms as u64,
            mono_ns: crate::clock::monotonic().as_nanos() as u64,
            kind,
            text: text.into(),
        };
        let mut ring = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() == CAPACITY {
            ring.pop_front();
        }
        ring.push_back(event);
    }

    /// Every event kept, oldest first.
    pub fn recent(&self) -> Vec<Event> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_events_in_order() {
        let events = Events::default();
        for i in 0..CAPACITY + 5 {
            events.record(EventKind::Action, format!("action {i}"));
        }
        let kept = events.recent();
        assert_eq!(kept.len(), CAPACITY);
        assert_eq!(kept[0].text, "action 5");
        assert_eq!(kept.last().unwrap().text, format!("action {}", CAPACITY + 4));
        assert!(kept.windows(2).all(|w| w[0].mono_ns <= w[1].mono_ns));
    }
}
