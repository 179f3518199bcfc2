//! Whether this box may answer DHCP clients right now.
//!
//! The election (or, with no `[arbiter]`, a constant) publishes the role on a watch channel;
//! the DHCP path reads it before every reply, including replies released after a commit, so a
//! demotion silences the box at once.

use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Serving. `term` is the election term (fencing token) stamped on every lease change.
    Active { term: u64 },
    /// Not serving: another box is active, or this one cannot prove it is.
    Standby,
}

impl Role {
    pub fn is_active(self) -> bool {
        matches!(self, Role::Active { .. })
    }

    pub fn term(self) -> Option<u64> {
        match self {
            Role::Active { term } => Some(term),
            Role::Standby => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Active { .. } => "active",
            Role::Standby => "standby",
        }
    }
}

pub type RoleRx = watch::Receiver<Role>;
pub type RoleTx = watch::Sender<Role>;

/// A single box without an arbiter: always active, term 0.
pub fn standalone() -> (RoleTx, RoleRx) {
    watch::channel(Role::Active { term: 0 })
}
