//! Whether this box may answer DHCP clients right now.
//!
//! The election (or, with no `[arbiter]`, a constant) publishes the role on a watch channel;
//! the DHCP path reads it before every reply, including replies released after a commit, so a
//! demotion silences the box at once.
//!
//! An elected role also carries the end of the lease that justifies it. `is_active` compares it
//! with the clock on every check, so the box falls silent on time even if the election task is
//! late to publish the demotion (a stalled runtime, a process resumed after SIGSTOP, a long
//! fsync in front of a released ACK).

use std::time::Duration;

use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Serving. `term` is the election term (fencing token) stamped on every lease change.
    /// `until` is the CLOCK_BOOTTIME instant (see [`crate::clock::boottime`]) after which this
    /// role no longer holds; `None` for a standalone box, which never loses it.
    Active { term: u64, until: Option<Duration> },
    /// Not serving: another box is active, or this one cannot prove it is.
    Standby,
}

impl Role {
    /// A role that never expires (standalone box).
    pub fn active(term: u64) -> Role {
        Role::Active { term, until: None }
    }

    /// Active and, if elected, still within the lease right now.
    pub fn is_active(self) -> bool {
        match self {
            Role::Active { until: None, .. } => true,
            Role::Active { until: Some(u), .. } => crate::clock::boottime() < u,
            Role::Standby => false,
        }
    }

    pub fn term(self) -> Option<u64> {
        match self {
            Role::Active { term, .. } => Some(term),
            Role::Standby => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Active { .. } if self.is_active() => "active",
            Role::Active { .. } => "active (lease ended)",
            Role::Standby => "standby",
        }
    }
}

pub type RoleRx = watch::Receiver<Role>;
pub type RoleTx = watch::Sender<Role>;

/// A single box without an arbiter: always active, term 0.
pub fn standalone() -> (RoleTx, RoleRx) {
    watch::channel(Role::active(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_elected_role_ends_with_its_lease_even_unpublished() {
        let now = crate::clock::boottime();
        assert!(Role::Active { term: 3, until: Some(now + Duration::from_secs(60)) }.is_active());
        assert!(!Role::Active { term: 3, until: Some(now) }.is_active());
        assert!(Role::active(0).is_active());
        assert!(!Role::Standby.is_active());
    }
}
