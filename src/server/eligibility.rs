//! Whether this box may stand in the election, and why not. Two things keep it out: a lease
//! store that cannot commit (it would acknowledge nothing) and maintenance mode, which an
//! operator starts and cancels and which survives a restart (a file in the state directory).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::events::{EventKind, Events};

/// Maintenance as recorded: who started it and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Maintenance {
    /// Unix seconds.
    pub since: u64,
    /// The uid that started it.
    pub by_uid: u32,
}

#[derive(Debug)]
struct State {
    store_ok: bool,
    maintenance: Option<Maintenance>,
}

/// Shared by the store-health follower, the control socket and the status socket.
#[derive(Debug, Clone)]
pub struct Eligibility {
    state: Arc<Mutex<State>>,
    eligible: Arc<watch::Sender<bool>>,
    file: PathBuf,
    events: Events,
}

impl Eligibility {
    /// Reads a maintenance mode left from before a restart; publishes on `eligible`.
    pub fn load(state_dir: &Path, eligible: watch::Sender<bool>, events: Events) -> Eligibility {
        let file = state_dir.join("maintenance");
        let maintenance = std::fs::read_to_string(&file).ok().and_then(|t| serde_json::from_str(&t).ok());
        if let Some(m) = &maintenance {
            let m: &Maintenance = m;
            tracing::warn!(
                since = m.since,
                by_uid = m.by_uid,
                "in maintenance: this box will not be active until it is cancelled"
            );
        }
        let e = Eligibility {
            state: Arc::new(Mutex::new(State { store_ok: true, maintenance })),
            eligible: Arc::new(eligible),
            file,
            events,
        };
        e.publish();
        e
    }

    pub fn set_store_ok(&self, ok: bool) {
        self.lock().store_ok = ok;
        if ok {
            tracing::info!("the lease store commits again: this box may stand in the election");
            self.events.record(EventKind::Store, "the lease store commits again");
        } else {
            tracing::error!(
                "the lease store cannot commit: this box stands down and will not be active until a commit succeeds"
            );
            self.events.record(EventKind::Store, "the lease store cannot commit: standing down");
        }
        self.publish();
    }

    /// Starts (`Some`) or cancels (`None`) maintenance, recording it so it survives a restart.
    pub fn set_maintenance(&self, m: Option<Maintenance>) -> std::io::Result<()> {
        match &m {
            Some(m) => write_atomically(&self.file, &serde_json::to_vec(m).expect("plain struct"))?,
            None => match std::fs::remove_file(&self.file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            },
        }
        self.lock().maintenance = m;
        self.publish();
        Ok(())
    }

    pub fn maintenance(&self) -> Option<Maintenance> {
        self.lock().maintenance.clone()
    }

    pub fn store_ok(&self) -> bool {
        self.lock().store_ok
    }

    pub fn is_eligible(&self) -> bool {
        *self.eligible.borrow()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self) {
        let ok = {
            let s = self.lock();
            s.store_ok && s.maintenance.is_none()
        };
        self.eligible.send_if_modified(|v| std::mem::replace(v, ok) != ok);
    }
}

/// Writes `path` so a crash leaves the old content or the new, never half of it.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("new");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maintenance_makes_a_box_ineligible_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = watch::channel(true);
        let e = Eligibility::load(dir.path(), tx, Events::default());
        assert!(*rx.borrow());
        e.set_maintenance(Some(Maintenance { since: 7, by_uid: 0 })).unwrap();
        assert!(!*rx.borrow());
        let (tx, rx) = watch::channel(true);
        let again = Eligibility::load(dir.path(), tx, Events::default());
        assert_eq!(again.maintenance(), Some(Maintenance { since: 7, by_uid: 0 }));
        assert!(!*rx.borrow(), "still in maintenance after a restart");
        again.set_maintenance(None).unwrap();
        assert!(*rx.borrow());
        again.set_store_ok(false);
        assert!(!*rx.borrow());
        again.set_store_ok(true);
        assert!(*rx.borrow());
    }
}
