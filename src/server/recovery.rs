//! How the engine recovers when the store writer reports trouble. A failed commit leaves the
//! allocator ahead of the disk: rebuild it from what is durable. A lost database file leaves
//! the allocator as the only good copy: hand it over to be written to a fresh file, then reload
//! from that (see `store/writer.rs`).

use std::time::Duration;

use super::engine::Engine;
use crate::allocator::Allocator;
use crate::events::EventKind;
use crate::store::{StoreError, StoredBinding, WriterEvent};

impl Engine {
    pub(super) async fn on_writer_event(&mut self, first: WriterEvent) {
        let mut next = Some(first);
        while let Some(ev) = next.take() {
            let reload = match ev {
                WriterEvent::Failed(err) => {
                    tracing::error!(error = %err, "lease store commit failed; unacknowledged changes discarded, reloading from disk");
                    self.events.record(EventKind::Store, format!("commit failed: {err}"));
                    true
                }
                WriterEvent::FileLost(err) => {
                    tracing::error!(error = %err, "LEASE DATABASE LOST: DHCPACKs stopped; writing the lease table held in memory to a fresh file");
                    self.events.record(EventKind::Store, format!("database file lost: {err}"));
                    let rows = self.alloc.bindings_with_marks().into_iter();
                    let rows =
                        rows.map(|(binding, peer_synced_version)| StoredBinding { binding, peer_synced_version });
                    self.writer.rebuild(rows.collect());
                    false
                }
                WriterEvent::Rebuilt { rows, moved_to } => {
                    let moved_to = moved_to.map(|p| p.display().to_string()).unwrap_or_else(|| "-".into());
                    tracing::warn!(rows, %moved_to, "lease table written from memory to a fresh database file; reloading");
                    self.events.record(EventKind::Store, format!("{rows} leases written from memory to a fresh file"));
                    true
                }
            };
            if reload && self.reload_from_store().await {
                // Failures queued behind this one are covered by the reload; anything else is not.
                while let Ok(ev) = self.writer_events.try_recv() {
                    if !matches!(ev, WriterEvent::Failed(_)) {
                        next = Some(ev);
                        break;
                    }
                }
            }
        }
    }

    /// Replaces the allocator with what is on disk. `false` if the file turned out lost (its
    /// event is queued and handled next).
    async fn reload_from_store(&mut self) -> bool {
        let mut delay = Duration::from_millis(200);
        loop {
            match self.writer.resync().await {
                Ok(rows) => {
                    let mut alloc = Allocator::new(&self.cfg);
                    alloc.set_term(self.alloc.term());
                    alloc.load_with_marks(rows.into_iter().map(|r| (r.binding, r.peer_synced_version)));
                    self.alloc = alloc;
                    return true;
                }
                Err(StoreError::FileLost { .. } | StoreError::WriterGone) => return false,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the lease store; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}
