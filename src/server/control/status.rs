//! What `status-get` answers: everything the running box knows about itself, in one object.
//! Built from the counters and watch channels the engine, the store writer, the replication
//! driver and the election publish, so answering never waits on the DHCP path. The same types
//! are read back by the clients (`twinlease status`, the console UI, the metrics endpoint).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::super::eligibility::{Eligibility, Maintenance};
use super::super::engine::{EngineSnapshot, EngineStats};
use super::super::replication::SyncStats;
use crate::clock;
use crate::config::Config;
use crate::election::ElectionView;
use crate::events::{Event, Events};
use crate::lease::LeaseState;
use crate::role::{Role, RoleRx};
use crate::store::writer::WriterStats;
use crate::sync::link::LinkStats;
use crate::sync::machine::Readiness;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub node: String,
    pub version: String,
    /// What decides the answers clients get, hashed (`check-config` prints it too); both boxes
    /// of a pair should show the same.
    pub config_digest: String,
    pub uptime_secs: u64,
    /// One line in words: "serving all clients", "standby: box-b serves", "NOT SERVING: ...".
    pub summary: String,
    pub role: RoleStatus,
    pub election: Option<ElectionStatus>,
    pub partner: Option<PartnerStatus>,
    pub subnets: Vec<SubnetStatus>,
    pub store: StoreStatus,
    pub dhcp: DhcpStatus,
    pub events: Vec<Event>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoleStatus {
    /// "active" or "standby".
    pub state: String,
    /// Whether the box answers clients right now.
    pub serving: bool,
    pub term: Option<u64>,
    /// Why it holds the role: "arbiter lease", "partner vote", "arbiter lease + partner vote",
    /// "operator partner-down", "standalone", "pinned".
    pub why: Option<String>,
    /// Whether it may stand; if not, why (lease store, maintenance).
    pub eligible: bool,
    pub not_eligible_because: Vec<String>,
    pub maintenance: Option<Maintenance>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElectionStatus {
    pub interval_ms: u64,
    pub timeout_ms: u64,
    /// Milliseconds left of the election lease (while active).
    pub lease_left_ms: Option<u64>,
    /// Milliseconds left of a step-down's hold-off.
    pub hold_off_left_ms: Option<u64>,
    /// Times this box became active since it started.
    pub promotions: u64,
    pub arbiter: ArbiterStatus,
    /// Milliseconds left of this box's promise to its partner not to become active.
    #[serde(default)]
    pub promised_left_ms: Option<u64>,
    /// A third box the arbiter names for this utype (partner votes are off while it does).
    #[serde(default)]
    pub third_box: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArbiterStatus {
    pub reachable: bool,
    /// Milliseconds since the last heartbeat the arbiter confirmed.
    pub last_heartbeat_age_ms: Option<u64>,
    pub rtt_ms: Option<f64>,
    pub calls: u64,
    pub failed_calls: u64,
    pub last_error: Option<String>,
    /// Who the arbiter named as primary at the last read.
    pub primary: Option<String>,
    pub primary_term: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartnerStatus {
    pub address: String,
    pub link_up: bool,
    /// Caught up and acknowledging in time: before-ack ACKs wait for it.
    pub in_sync: bool,
    pub rtt_ms: Option<f64>,
    /// "waiting", "caught-up", "partner-unreachable" (since this box started).
    pub readiness: String,
    pub updates_sent: u64,
    pub updates_applied: u64,
    /// Bindings the partner does not hold yet.
    pub unsynced: u64,
    pub last_catch_up_unix_ms: Option<u64>,
    pub catch_ups: u64,
    pub conflicts: u64,
    pub fenced: u64,
    pub ack_timeouts: u64,
    pub sessions: u64,
    /// The partner's configuration digest, once its Hello arrived.
    pub config_digest: Option<String>,
    /// Whether it differs from this box's (the boxes would answer clients differently).
    pub config_differs: bool,
    pub rejected_connections: u64,
    pub foreign_connections: u64,
    pub bad_frames: u64,
}

impl PartnerStatus {
    /// Linked, in sync and holding every binding: what maintenance, a slot's health check and a
    /// pair roll wait for before this box may stop serving.
    pub fn caught_up(&self) -> bool {
        self.link_up && self.in_sync && self.unsynced == 0
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubnetStatus {
    pub cidr: String,
    pub total: u64,
    pub free: u64,
    pub probing: u64,
    pub offered: u64,
    pub leased: u64,
    pub declined: u64,
    pub reserved: u64,
    /// Busy addresses (offered, leased, declined, probing) per 100 addresses.
    pub utilisation_pct: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreStatus {
    pub path: String,
    pub size_bytes: u64,
    pub wal_bytes: u64,
    pub disk_free_bytes: Option<u64>,
    pub can_commit: bool,
    pub commits: u64,
    pub transitions: u64,
    pub commit_failures: u64,
    pub last_commit_us: u64,
    pub files_lost: u64,
    pub rebuilds: u64,
    pub wal_truncations: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DhcpStatus {
    /// Datagrams received on the DHCP sockets.
    pub received: u64,
    /// Requests by message type ("discover", "request", ...).
    pub requests: BTreeMap<String, u64>,
    pub malformed: u64,
    /// Replies that left, by type.
    pub replies: BTreeMap<String, u64>,
    /// Requests dropped, by why.
    pub dropped: BTreeMap<String, u64>,
    pub pool_exhausted: u64,
    /// OFFERs of an address taken from another client's unrequested offer (pool exhausted).
    #[serde(default)]
    pub offers_reclaimed: u64,
    pub send_errors: u64,
}

/// Everything a status answer is read from.
#[derive(Clone)]
pub struct Sources {
    pub cfg: Arc<Config>,
    pub started: Instant,
    pub role: RoleRx,
    /// Why the role is what it is when no election decides it ("standalone", "pinned").
    pub fixed_role: Option<&'static str>,
    pub election: Option<watch::Receiver<ElectionView>>,
    pub eligibility: Eligibility,
    pub engine: Arc<EngineStats>,
    pub snapshot: watch::Receiver<EngineSnapshot>,
    pub writer: Arc<WriterStats>,
    pub can_commit: watch::Receiver<bool>,
    pub partner: Option<(Arc<SyncStats>, Arc<LinkStats>, watch::Receiver<Readiness>)>,
    pub send_errors: Arc<dyn Fn() -> u64 + Send + Sync>,
    pub events: Events,
}

impl Sources {
    pub fn status(&self) -> Status {
        let role = self.role_status();
        let election = self.election.as_ref().map(|v| self.election_status(&v.borrow()));
        let partner = self.partner.as_ref().map(|(s, l, r)| self.partner_status(s, l, &r.borrow()));
        let summary = summary(&role, election.as_ref(), partner.as_ref());
        Status {
            node: self.cfg.node.name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            config_digest: self.cfg.digest.to_string(),
            uptime_secs: self.started.elapsed().as_secs(),
            summary,
            role,
            election,
            partner,
            subnets: self.subnets(),
            store: self.store_status(),
            dhcp: self.dhcp_status(),
            events: self.events.recent(),
        }
    }

    fn role_status(&self) -> RoleStatus {
        let role = *self.role.borrow();
        let mut not_eligible_because = Vec::new();
        if !self.eligibility.store_ok() {
            not_eligible_because.push("the lease store cannot commit".to_string());
        }
        let maintenance = self.eligibility.maintenance();
        if maintenance.is_some() {
            not_eligible_because.push("maintenance".to_string());
        }
        let why = match role {
            Role::Active { .. } => {
                let elected = self.election.as_ref().and_then(|v| v.borrow().basis);
                Some(self.fixed_role.or(elected).unwrap_or("arbiter lease").to_string())
            }
            Role::Standby => None,
        };
        let state = if matches!(role, Role::Active { .. }) { "active" } else { "standby" };
        RoleStatus {
            state: state.to_string(),
            serving: role.is_active() && self.eligibility.store_ok(),
            term: role.term(),
            why,
            eligible: not_eligible_because.is_empty(),
            not_eligible_because,
            maintenance,
        }
    }

    fn election_status(&self, v: &ElectionView) -> ElectionStatus {
        let now = clock::boottime();
        let left = |t: Option<Duration>| t.filter(|t| *t > now).map(|t| (t - now).as_millis() as u64);
        let a = self.cfg.arbiter.as_ref();
        ElectionStatus {
            interval_ms: a.map_or(0, |a| a.interval.as_millis() as u64),
            timeout_ms: a.map_or(0, |a| a.timeout.as_millis() as u64),
            lease_left_ms: left(v.lease_until),
            hold_off_left_ms: left(v.hold_off_until),
            promotions: v.promotions,
            promised_left_ms: left(v.promised_until),
            third_box: v.third_box.clone(),
            arbiter: ArbiterStatus {
                reachable: v.reachable,
                last_heartbeat_age_ms: v.last_confirmed.map(|t| now.saturating_sub(t).as_millis() as u64),
                rtt_ms: v.last_rtt.map(|d| d.as_secs_f64() * 1000.0),
                calls: v.calls,
                failed_calls: v.failed_calls,
                last_error: v.last_error.clone(),
                primary: v.primary.as_ref().map(|p| p.name.clone()),
                primary_term: v.primary.as_ref().map(|p| p.term),
            },
        }
    }

    fn partner_status(&self, s: &SyncStats, l: &LinkStats, readiness: &Readiness) -> PartnerStatus {
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let link_up = s.link_up.load(Ordering::Relaxed);
        let rtt_us = load(&s.rtt_us);
        PartnerStatus {
            address: self.cfg.peer.as_ref().map(|p| p.address.to_string()).unwrap_or_default(),
            link_up,
            in_sync: s.reachable.load(Ordering::Relaxed),
            rtt_ms: (link_up && rtt_us > 0).then(|| rtt_us as f64 / 1000.0),
            readiness: match readiness {
                Readiness::Waiting => "waiting",
                Readiness::CaughtUp => "caught-up",
                Readiness::PartnerUnreachable => "partner-unreachable",
            }
            .to_string(),
            updates_sent: load(&s.sent),
            updates_applied: load(&s.applied),
            unsynced: self.snapshot.borrow().unsynced as u64,
            last_catch_up_unix_ms: Some(load(&s.last_catch_up_ms)).filter(|t| *t > 0),
            catch_ups: load(&s.catch_ups),
            conflicts: load(&s.conflicts),
            fenced: load(&s.fenced),
            ack_timeouts: load(&s.held_timeouts),
            sessions: load(&l.sessions),
            config_digest: s.partner_config().map(|d| d.to_string()),
            config_differs: s.config_differs.load(Ordering::Relaxed),
            rejected_connections: load(&l.rejected),
            foreign_connections: load(&l.foreign),
            bad_frames: load(&l.bad_frames),
        }
    }

    fn subnets(&self) -> Vec<SubnetStatus> {
        let snapshot = self.snapshot.borrow();
        let reserved = |i: usize| self.cfg.reservations.iter().filter(|r| r.subnet == i).count() as u64;
        self.cfg
            .subnets
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let c = snapshot.usage.get(i).copied().unwrap_or_default();
                let n = |state: LeaseState| c[state.code() as usize] as u64;
                let total: u64 = c.iter().map(|x| *x as u64).sum();
                let busy = total - n(LeaseState::Free);
                SubnetStatus {
                    cidr: s.net.to_string(),
                    total,
                    free: n(LeaseState::Free),
                    probing: n(LeaseState::Probing),
                    offered: n(LeaseState::Offered),
                    leased: n(LeaseState::Leased),
                    declined: n(LeaseState::Declined),
                    reserved: reserved(i),
                    utilisation_pct: if total == 0 {
                        0.0
                    } else {
                        (busy as f64 * 1000.0 / total as f64).round() / 10.0
                    },
                }
            })
            .collect()
    }

    fn store_status(&self) -> StoreStatus {
        let path = self.cfg.lease_db_path();
        let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let wal = std::path::PathBuf::from(format!("{}-wal", path.display()));
        let w = &self.writer;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        StoreStatus {
            path: path.display().to_string(),
            size_bytes: size(&path),
            wal_bytes: size(&wal),
            disk_free_bytes: crate::store::file::free_bytes(&self.cfg.node.state_dir),
            can_commit: *self.can_commit.borrow(),
            commits: load(&w.commits),
            transitions: load(&w.transitions),
            commit_failures: load(&w.failures),
            last_commit_us: load(&w.last_commit_us),
            files_lost: load(&w.files_lost),
            rebuilds: load(&w.rebuilds),
            wal_truncations: load(&w.wal_truncations),
        }
    }

    fn dhcp_status(&self) -> DhcpStatus {
        let e = &self.engine;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let requests = e.requests.iter().map(|(name, n)| (name.to_string(), load(n))).collect();
        DhcpStatus {
            received: load(&e.received),
            requests,
            malformed: load(&e.malformed),
            replies: [("offer", &e.offers), ("ack", &e.acks), ("nak", &e.naks)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), load(v)))
                .collect(),
            dropped: [
                ("not-active", &e.dropped_not_active),
                ("queue-full", &e.dropped_queue_full),
                ("duplicate", &e.duplicates),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), load(v)))
            .collect(),
            pool_exhausted: load(&e.exhausted),
            offers_reclaimed: load(&e.reclaimed),
            send_errors: (self.send_errors)(),
        }
    }
}

/// The box's state in one line of words.
pub fn summary(role: &RoleStatus, election: Option<&ElectionStatus>, partner: Option<&PartnerStatus>) -> String {
    if role.serving {
        return match partner {
            Some(p) if !p.link_up => "serving all clients (partner link down)".to_string(),
            _ => "serving all clients".to_string(),
        };
    }
    if role.state == "active" {
        return "NOT SERVING: the lease store cannot commit".to_string();
    }
    if !role.eligible {
        return format!("standby, not eligible: {}", role.not_eligible_because.join(", "));
    }
    match election {
        // Named as elsewhere on this line: the arbiter row's last known holder.
        Some(e) if e.promised_left_ms.is_some() => {
            let who = e.arbiter.primary.as_deref().unwrap_or("the partner");
            format!("standby: {who} serves, with this box's vote")
        }
        Some(e) if !e.arbiter.reachable => "NOT SERVING: arbiter unreachable".to_string(),
        Some(e) => match &e.arbiter.primary {
            Some(p) => format!("standby: {p} serves"),
            None => "standby: nobody holds the arbiter row yet".to_string(),
        },
        None => "standby".to_string(),
    }
}
