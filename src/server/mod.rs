//! The daemon's driver: takes its claims on the box, opens the store, starts the service
//! (`service.rs`: store writer, replication, sockets, engine, receive threads, sd_notify), and
//! shuts it down in order on SIGTERM.

pub mod arp;
pub mod claim;
pub mod control;
pub mod eligibility;
pub mod engine;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod interfaces;
pub mod notify;
pub mod ping;
mod receive;
mod recovery;
pub mod replication;
mod service;
pub mod socket;
#[cfg(test)]
mod tests;

use tokio::sync::{mpsc, watch};

use crate::config::Config;
use crate::election::peer::{PeerPort, PeerVotes};
use crate::election::{ElectionCommand, ElectionView};
use crate::events::Events;
use crate::role::RoleRx;
use crate::store::StoreError;
use crate::sync::machine::Readiness;
pub use service::{OpenedStore, Service};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "cannot listen for DHCP on {what}: {source} (twinlease needs CAP_NET_BIND_SERVICE and CAP_NET_RAW, or root)"
    )]
    Bind { what: String, source: std::io::Error },
    #[error("cannot start the thread that reads DHCP socket {index}: {source}")]
    ReceiveThread { index: usize, source: std::io::Error },
    #[error("interface {0} does not exist; fix [dhcp] interfaces (see `ip link`)")]
    NoInterface(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Claim(#[from] claim::ClaimError),
    #[error(transparent)]
    Control(#[from] control::ControlError),
}

/// What the DHCP service and the election share. The service tells the election whether this
/// box may stand; the status socket reads what the election knows; the control socket sends
/// it operator actions.
pub struct ElectionLink {
    /// Caught up with the partner (or found it unreachable): the election waits for this
    /// before this box stands, so a new primary never serves from a stale lease table.
    pub readiness: watch::Sender<Readiness>,
    /// Whether this box may stand: its lease store commits (a box that cannot make leases
    /// durable acknowledges nothing) and it is not in maintenance.
    pub eligible: watch::Sender<bool>,
    /// `None` for a box without an election (standalone, or a pinned test box).
    pub view: Option<watch::Receiver<ElectionView>>,
    pub commands: Option<mpsc::Sender<ElectionCommand>>,
    pub events: Events,
    /// Why the role is what it is when no election decides it.
    pub fixed_role: Option<&'static str>,
    /// Where the replication driver delivers the partner's votes (None: no election).
    pub votes: Option<PeerPort>,
}

/// The election's ends of an [`ElectionLink`].
pub struct ElectionSide {
    pub readiness: watch::Receiver<Readiness>,
    pub eligible: watch::Receiver<bool>,
    pub view: watch::Sender<ElectionView>,
    pub commands: mpsc::Receiver<ElectionCommand>,
    pub votes: PeerVotes,
}

impl ElectionLink {
    pub fn new(events: Events) -> (ElectionLink, ElectionSide) {
        let (readiness, ready_rx) = watch::channel(Readiness::Waiting);
        let (eligible, eligible_rx) = watch::channel(true);
        let (view_tx, view) = watch::channel(ElectionView::default());
        let (commands_tx, commands) = mpsc::channel(4);
        let (port, votes) = crate::election::peer::channel();
        let link = ElectionLink {
            readiness,
            eligible,
            view: Some(view),
            commands: Some(commands_tx),
            events,
            fixed_role: None,
            votes: Some(port),
        };
        (link, ElectionSide { readiness: ready_rx, eligible: eligible_rx, view: view_tx, commands, votes })
    }

    /// For a box whose role does not come from an election; `why` names what decides it
    /// ("standalone", "pinned").
    pub fn none(why: &'static str, events: Events) -> ElectionLink {
        let (readiness, _) = watch::channel(Readiness::Waiting);
        let (eligible, _) = watch::channel(true);
        ElectionLink { readiness, eligible, view: None, commands: None, events, fixed_role: Some(why), votes: None }
    }
}

/// Runs the DHCP service until SIGTERM/SIGINT, with a role that no election decides (`why`:
/// "standalone", "pinned").
pub async fn run(cfg: Config, role: RoleRx, why: &'static str) -> Result<(), ServerError> {
    run_with(cfg, role, ElectionLink::none(why, Events::default())).await
}

/// Like [`run`], sharing with the election what [`ElectionLink`] carries.
pub async fn run_with(cfg: Config, role: RoleRx, election: ElectionLink) -> Result<(), ServerError> {
    let key = cfg.peer.as_ref().map(|p| p.read_key()).transpose()?;
    let _claims = claim::Claims::take(&cfg.node.state_dir, &cfg.dhcp.interfaces, cfg.dhcp.listen_relayed)?;
    let store = OpenedStore::open(&cfg)?;
    let service = Service::start(cfg, role, election, store, key)?;
    shutdown_signal().await;
    tracing::info!("stopping");
    service.stop().await;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
