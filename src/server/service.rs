//! Starting the DHCP service in named steps, and stopping it in order.
//!
//! Start: bind the sockets (the one step that needs privileges, so it fails first), start the
//! store writer, the replication driver, the engine and one receive thread per socket, then tell
//! systemd READY=1. Stop: tell systemd, stop receiving, let the engine finish what it holds,
//! then let the writer commit what is queued before its thread ends.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle as ThreadHandle;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::control::{ControlSockets, Handlers, Sources};
use super::eligibility::Eligibility;
use super::engine::{Engine, EngineHandle, Transmit};
use super::interfaces::Interfaces;
use super::replication::{Replication, ReplicationInputs};
use super::socket::{self, DhcpSocket, ReplySender};
use super::{ElectionLink, ServerError, notify, ping, receive};
use crate::allocator::Allocator;
use crate::clock::unix_now;
use crate::config::Config;
use crate::events::Events;
use crate::lease::LeaseState;
use crate::role::RoleRx;
use crate::store::{LeaseStore, StoreIdentity, StoreWriter};
use crate::sync::machine::Readiness;

/// The lease store, opened, and the allocator loaded from it.
pub struct OpenedStore {
    store: LeaseStore,
    alloc: Allocator,
    identity: StoreIdentity,
}

impl OpenedStore {
    /// Opens (or creates) the database in the state directory and loads the allocator. A corrupt
    /// file is moved aside and the box starts empty (clients keep their addresses by renewing).
    pub fn open(cfg: &Config) -> Result<OpenedStore, ServerError> {
        let db = cfg.lease_db_path();
        let (store, report) = LeaseStore::open(&db, unix_now())?;
        if let Some(moved) = &report.quarantined {
            tracing::error!(path = %db.display(), moved_to = %moved.display(), "lease database was corrupt; moved aside and started empty (clients keep their addresses by renewing)");
        }
        let opened = Self::load(cfg, store)?;
        let now = unix_now();
        let live = opened.alloc.bindings().filter(|b| b.state == LeaseState::Leased && b.expires > now).count();
        tracing::info!(path = %db.display(), leases = live, addresses = opened.alloc.len(), "lease store open");
        tracing::info!(config_digest = %cfg.digest, classes = cfg.classes.len(), pools = cfg.pools.len(), "configuration loaded");
        Ok(opened)
    }

    /// A store that lives in memory only (tests of the glue).
    pub fn in_memory(cfg: &Config) -> Result<OpenedStore, ServerError> {
        Self::load(cfg, LeaseStore::open_in_memory()?)
    }

    fn load(cfg: &Config, mut store: LeaseStore) -> Result<OpenedStore, ServerError> {
        let identity = StoreIdentity { store: Some(store.store_id()?), partner_store: store.partner_store_id()? };
        let mut alloc = Allocator::new(cfg);
        let mut orphans = 0;
        store.for_each_binding(|s| orphans += alloc.load_with_marks([(s.binding, s.peer_synced_version)]).len())?;
        if orphans > 0 {
            tracing::warn!(
                count = orphans,
                "stored leases for addresses no longer in any pool or reservation are kept on disk but not served"
            );
        }
        Ok(OpenedStore { store, alloc, identity })
    }

    /// Starts the writer thread over this store; returns the allocator and the writer.
    pub fn spawn_writer(self) -> (Allocator, StoreIdentity, WriterParts) {
        let (events_tx, events) = mpsc::unbounded_channel();
        let (writer, thread) = StoreWriter::spawn(self.store, events_tx);
        (self.alloc, self.identity, WriterParts { writer, events, thread })
    }
}

/// The store writer as the service holds it.
pub struct WriterParts {
    pub writer: StoreWriter,
    pub events: mpsc::UnboundedReceiver<crate::store::WriterEvent>,
    pub thread: ThreadHandle<()>,
}

/// The running service.
pub struct Service {
    writer: StoreWriter,
    writer_thread: ThreadHandle<()>,
    engine: EngineHandle,
    engine_task: JoinHandle<()>,
    /// Helpers; aborted at stop.
    tasks: Vec<JoinHandle<()>>,
    /// One per DHCP socket; stopped first at stop.
    receivers: Vec<receive::Receiver>,
    reporter: notify::Reporter,
    /// Closed (and its files removed) when the service is dropped.
    _control: ControlSockets,
}

impl Service {
    pub fn start(
        cfg: Config,
        role: RoleRx,
        election: ElectionLink,
        opened: OpenedStore,
        key: Option<Vec<u8>>,
    ) -> Result<Service, ServerError> {
        let cfg = Arc::new(cfg);
        let ElectionLink { readiness, eligible, view, commands, events, fixed_role, votes } = election;
        let ifaces = Arc::new(Interfaces::new(&cfg.dhcp.interfaces));
        let (sockets, senders) = bind_sockets(&cfg, &ifaces)?;
        let (alloc, identity, parts) = opened.spawn_writer();
        let writer = parts.writer.clone();
        let eligibility = Eligibility::load(&cfg.node.state_dir, eligible, events.clone());
        let mut tasks = vec![tokio::spawn(follow_store_health(writer.can_commit(), eligibility.clone()))];
        let mut replication = start_replication(&cfg, &alloc, identity, key, (readiness.clone(), events.clone()));
        if let (Some((r, _)), Some(port)) = (replication.as_mut(), votes) {
            r.set_peer_votes(port);
        }
        let partner = replication.as_ref().map(|(r, _)| (r.stats(), r.link_stats(), readiness.subscribe()));
        let transmit = senders.iter().map(|s| s.clone() as Arc<dyn Transmit>).collect();
        let (mut engine, handle) =
            Engine::new(cfg.clone(), alloc, (parts.writer, parts.events), transmit, role.clone());
        engine = engine.with_events(events.clone());
        if let Some(p) = start_pinger(&cfg) {
            engine = engine.with_pinger(p);
        }
        if let Some(r) = replication {
            engine = engine.with_replication(r);
        }
        let engine_task = tokio::spawn(engine.run());
        let mut receivers = Vec::new();
        for (i, s) in sockets.into_iter().enumerate() {
            let (inbox, stats) = (handle.inbox.clone(), handle.stats.clone());
            let r = receive::spawn(s, i, ifaces.clone(), inbox, stats)
                .map_err(|source| ServerError::ReceiveThread { index: i, source })?;
            receivers.push(r);
        }
        tasks.push(tokio::spawn(refresh_interfaces(ifaces)));
        #[cfg(feature = "fault-injection")]
        tasks.push(super::fault::install(writer.clone()).expect("fault injection signal handlers"));
        let send_errors = Arc::new(move || senders.iter().map(|s| s.send_errors.load(Ordering::Relaxed)).sum());
        let sources = Sources {
            cfg: cfg.clone(),
            started: std::time::Instant::now(),
            role: role.clone(),
            fixed_role,
            election: view,
            eligibility,
            engine: handle.stats.clone(),
            snapshot: handle.snapshot.clone(),
            writer: writer.stats.clone(),
            can_commit: writer.can_commit(),
            partner: partner.clone(),
            send_errors,
            events,
        };
        let view_for_status = sources.election.clone();
        let handlers = Handlers { sources, engine: handle.commands.clone(), election: commands };
        let control = ControlSockets::start(&cfg.control, handlers, cfg.metrics_listen)?;
        let reporter = report_ready(&cfg, role, &handle, &writer, partner.map(|p| p.0), view_for_status);
        Ok(Service {
            writer,
            writer_thread: parts.thread,
            engine: handle,
            engine_task,
            tasks,
            receivers,
            reporter,
            _control: control,
        })
    }

    /// Stops in order: nothing new comes in, the engine finishes, the writer commits what is
    /// queued (and sends the ACKs waiting on it), then its thread ends.
    pub async fn stop(self) {
        let Service { writer, writer_thread, engine, engine_task, tasks, receivers, reporter, _control } = self;
        drop(_control);
        reporter.stop();
        notify::stopping();
        for t in tasks {
            t.abort();
        }
        let _ = tokio::task::spawn_blocking(move || receivers.into_iter().for_each(receive::Receiver::stop)).await;
        let stats = engine.stats.clone();
        let _ = engine.stop.send(());
        let _ = engine_task.await;
        let ws = &writer.stats;
        tracing::info!(
            target: "twinlease::stats",
            commits = ws.commits.load(Ordering::Relaxed),
            transitions = ws.transitions.load(Ordering::Relaxed),
            failures = ws.failures.load(Ordering::Relaxed),
            acks = stats.acks.load(Ordering::Relaxed),
            offers = stats.offers.load(Ordering::Relaxed),
            received = stats.received.load(Ordering::Relaxed),
            inbox_full = stats.dropped_queue_full.load(Ordering::Relaxed),
            "store and reply counters"
        );
        drop(writer);
        let _ = tokio::task::spawn_blocking(move || writer_thread.join()).await;
    }
}

/// The DHCP sockets, and their senders in the same order.
type Sockets = (Vec<DhcpSocket>, Vec<Arc<ReplySender>>);

/// Logs what listens, tells systemd READY=1 and starts the STATUS=/watchdog reporter.
fn report_ready(
    cfg: &Config,
    role: RoleRx,
    engine: &EngineHandle,
    writer: &StoreWriter,
    sync: Option<Arc<super::replication::SyncStats>>,
    election: Option<tokio::sync::watch::Receiver<crate::election::ElectionView>>,
) -> notify::Reporter {
    let listening: Vec<String> =
        cfg.dhcp.interfaces.iter().cloned().chain(cfg.dhcp.listen_relayed.then(|| "relay".to_string())).collect();
    let current = *role.borrow();
    tracing::info!(sockets = ?listening, node = %cfg.node.name, role = current.name(), term = current.term(), "listening on port 67");
    let watchdog = notify::watchdog_from_env();
    if let Some(w) = watchdog {
        tracing::info!(
            timeout_ms = w.as_millis() as u64,
            "systemd watchdog enabled; pinging every half timeout while the engine and the store thread are moving"
        );
    }
    let status =
        notify::StatusReporter::new(role, engine.stats.clone(), writer.stats.clone(), writer.can_commit(), sync)
            .with_election(election);
    notify::ready(&status.line());
    status.spawn(watchdog)
}

/// One socket per served interface, plus the relay socket.
fn bind_sockets(cfg: &Config, ifaces: &Interfaces) -> Result<Sockets, ServerError> {
    let mut sockets = Vec::new();
    let mut senders: Vec<Arc<ReplySender>> = Vec::new();
    for name in &cfg.dhcp.interfaces {
        if ifaces.index_of(name).is_none() {
            return Err(ServerError::NoInterface(name.clone()));
        }
        let (s, tx) = socket::bind(Some(name), socket::SERVER_PORT)
            .map_err(|source| ServerError::Bind { what: format!("interface {name}"), source })?;
        senders.push(Arc::new(ReplySender::new(tx, Some(name.clone()))));
        sockets.push(s);
    }
    if cfg.dhcp.listen_relayed {
        let (s, tx) = socket::bind(None, socket::SERVER_PORT)
            .map_err(|source| ServerError::Bind { what: "the relay socket (any interface)".into(), source })?;
        senders.push(Arc::new(ReplySender::new(tx, None)));
        sockets.push(s);
    }
    Ok((sockets, senders))
}

fn start_replication(
    cfg: &Config,
    alloc: &Allocator,
    identity: StoreIdentity,
    key: Option<Vec<u8>>,
    (readiness, events): (watch::Sender<Readiness>, Events),
) -> Option<(Replication, ReplicationInputs)> {
    let (Some(p), Some(key)) = (&cfg.peer, key) else {
        readiness.send_replace(Readiness::CaughtUp); // nobody to catch up with
        return None;
    };
    let unsynced = alloc.unsynced_addrs().len();
    tracing::info!(partner = %p.address, listen = %p.listen, mode = ?p.sync_mode, unsynced, store = ?identity.store, known_partner_store = ?identity.partner_store, "lease sync configured");
    let (mut replication, inputs) = Replication::start(&cfg.node.name, p, key, identity, readiness, events);
    replication.set_config_digest(cfg.digest);
    Some((replication, inputs))
}

fn start_pinger(cfg: &Config) -> Option<Arc<ping::Pinger>> {
    if !cfg.dhcp.ping_check {
        return None;
    }
    match ping::Pinger::start() {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(error = %e, "cannot open an ICMP socket (CAP_NET_RAW?); offering without a ping check");
            None
        }
    }
}

/// Interface addresses change (DHCP on the uplink, an operator): re-read them now and then.
async fn refresh_interfaces(ifaces: Arc<Interfaces>) {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        ifaces.refresh();
    }
}

/// Makes this box ineligible for the active role while its lease store cannot commit.
async fn follow_store_health(mut can_commit: watch::Receiver<bool>, eligibility: Eligibility) {
    loop {
        if can_commit.changed().await.is_err() {
            return;
        }
        let ok = *can_commit.borrow_and_update();
        if ok != eligibility.store_ok() {
            eligibility.set_store_ok(ok);
        }
    }
}
