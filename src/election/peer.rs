//! The election's side of the peer link: the partner's votes in, this box's votes out.
//!
//! The link belongs to lease sync (`server::replication` owns it on the engine task); the
//! election only borrows it. The replication driver tells a [`PeerPort`] when a session comes up
//! or goes down and hands it every [`Vote`] that arrives; the election's [`PeerVotes`] receives
//! those and sends its own votes on whatever session is current. A vote sent while no session
//! is up is dropped: the machine treats an unanswered request as no vote.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::sync::link::LinkHandle;
use crate::sync::protocol::{Message, Vote};

/// What the election hears from the peer link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerEvent {
    /// An authenticated session with the partner (named as it proved on the link) is up.
    Up {
        partner: String,
    },
    Down,
    Vote(Vote),
}

/// The link session the election sends on, if one is up.
type Current = Mutex<Option<(LinkHandle, u64)>>;

/// The replication driver's end.
#[derive(Clone)]
pub struct PeerPort {
    current: Arc<Current>,
    events: mpsc::UnboundedSender<PeerEvent>,
}

/// The election's end.
pub struct PeerVotes {
    current: Arc<Current>,
    events: mpsc::UnboundedReceiver<PeerEvent>,
}

pub fn channel() -> (PeerPort, PeerVotes) {
    let current = Arc::new(Mutex::new(None));
    let (tx, rx) = mpsc::unbounded_channel();
    (PeerPort { current: current.clone(), events: tx }, PeerVotes { current, events: rx })
}

impl PeerPort {
    pub fn up(&self, link: &LinkHandle, session: u64, partner: &str) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((link.clone(), session));
        let _ = self.events.send(PeerEvent::Up { partner: partner.to_string() });
    }

    pub fn down(&self, session: u64) {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if cur.as_ref().is_some_and(|(_, s)| *s == session) {
            *cur = None;
            let _ = self.events.send(PeerEvent::Down);
        }
    }

    pub fn deliver(&self, vote: Vote) {
        let _ = self.events.send(PeerEvent::Vote(vote));
    }
}

impl PeerVotes {
    /// Sends `vote` on the current session; false if none is up.
    pub fn send(&self, vote: Vote) -> bool {
        let cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        match cur.as_ref() {
            Some((link, session)) => {
                link.send(*session, Message::Vote(vote));
                true
            }
            None => false,
        }
    }

    /// The next event; None once the replication driver is gone.
    pub async fn recv(&mut self) -> Option<PeerEvent> {
        self.events.recv().await
    }
}
