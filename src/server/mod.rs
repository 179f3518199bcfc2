//! The tokio driver: opens the store, binds the sockets, starts the engine and the receive
//! tasks, reports readiness to systemd, and shuts down in order on SIGTERM.

pub mod arp;
pub mod engine;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod interfaces;
pub mod notify;
pub mod peer;
pub mod ping;
pub mod socket;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::allocator::Allocator;
use crate::config::Config;
use crate::dhcp::{self, Ingress};
use crate::lease::LeaseState;
use crate::role::RoleRx;
use crate::store::{LeaseStore, StoreError, StoreWriter};
use crate::sync::link::{self, LinkConfig};
use crate::sync::machine::{Machine, Readiness, Timing};
use engine::{Engine, EngineStats, Input, unix_now};
use interfaces::Interfaces;
use socket::{DhcpSocket, ReplySender};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen for DHCP on {what}: {source} (twinlease needs CAP_NET_BIND_SERVICE and CAP_NET_RAW, or root)")]
    Bind { what: String, source: std::io::Error },
    #[error("interface {0} does not exist; fix [dhcp] interfaces (see `ip link`)")]
    NoInterface(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// Requests waiting for the engine; beyond this the receive tasks drop (clients retry). Kept
/// short on purpose: under overload a long queue only means answering requests whose clients
/// have given up (≈0.2 s of work at 10,000 requests/s).
const INBOX: usize = 2048;

/// Runs the DHCP service until SIGTERM/SIGINT.
pub async fn run(cfg: Config, role: RoleRx) -> Result<(), ServerError> {
    let (readiness, _) = watch::channel(Readiness::Waiting);
    run_with(cfg, role, readiness).await
}

/// Like [`run`], publishing on `readiness` when this box has caught up with its partner (or
/// found it unreachable): the election waits for that before this box stands.
pub async fn run_with(cfg: Config, role: RoleRx, readiness: watch::Sender<Readiness>) -> Result<(), ServerError> {
    let cfg = Arc::new(cfg);
    let started = Instant::now();
    let key = cfg.peer.as_ref().map(|p| p.read_key()).transpose()?;
    let db = cfg.lease_db_path();
    let (mut store, report) = LeaseStore::open(&db, unix_now())?;
    if let Some(moved) = &report.quarantined {
        tracing::error!(path = %db.display(), moved_to = %moved.display(), "lease database was corrupt; moved aside and started empty (clients keep their addresses by renewing)");
    }
    let stored = store.load_all()?;
    let (store_id, peer_store_id) = (store.store_id()?, store.peer_store_id()?);
    let mut alloc = Allocator::new(&cfg);
    let orphans = alloc.load_with_marks(stored.into_iter().map(|s| (s.binding, s.peer_synced_version)));
    if !orphans.is_empty() {
        tracing::warn!(count = orphans.len(), "stored leases for addresses no longer in any pool or reservation are kept on disk but not served");
    }
    let now = unix_now();
    let live = alloc.bindings().filter(|b| b.state == LeaseState::Leased && b.expires > now).count();
    tracing::info!(path = %db.display(), leases = live, addresses = alloc.len(), "lease store open");

    let (writer_events_tx, writer_events) = mpsc::unbounded_channel();
    let (writer, writer_thread) = StoreWriter::spawn(store, writer_events_tx);

    let peer = match (&cfg.peer, key) {
        (Some(p), Some(key)) => {
            let unsynced = alloc.unsynced_addrs().len();
            tracing::info!(partner = %p.address, listen = %p.listen, mode = ?p.sync_mode, unsynced, store_id, known_partner_store = ?peer_store_id, "lease sync configured");
            let (link, events) = link::spawn(LinkConfig { node: cfg.node.name.clone(), listen: p.listen, peer: p.address, key: Arc::new(key) });
            let machine = Machine::new(Timing::new(Duration::from_millis(p.ack_timeout_ms)), cfg.node.name.clone(), store_id, peer_store_id, Instant::now());
            Some(peer::PeerSide::new(machine, link, events, p.sync_mode, readiness))
        }
        _ => {
            readiness.send_replace(Readiness::CaughtUp); // nobody to catch up with
            None
        }
    };

    let ifaces = Arc::new(Interfaces::new(&cfg.dhcp.interfaces));
    for name in &cfg.dhcp.interfaces {
        if ifaces.index_of(name).is_none() {
            return Err(ServerError::NoInterface(name.clone()));
        }
    }
    let mut sockets = Vec::new();
    let mut senders = Vec::new();
    for name in &cfg.dhcp.interfaces {
        let (s, tx) = socket::bind(Some(name), socket::SERVER_PORT).map_err(|source| ServerError::Bind { what: format!("interface {name}"), source })?;
        senders.push(Arc::new(ReplySender::new(tx, Some(name.clone()))));
        sockets.push(s);
    }
    if cfg.dhcp.listen_relayed {
        let (s, tx) = socket::bind(None, socket::SERVER_PORT).map_err(|source| ServerError::Bind { what: "the relay socket (any interface)".into(), source })?;
        senders.push(Arc::new(ReplySender::new(tx, None)));
        sockets.push(s);
    }
    let pinger = if cfg.dhcp.ping_check {
        match ping::Pinger::start() {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(error = %e, "cannot open an ICMP socket (CAP_NET_RAW?); offering without a ping check");
                None
            }
        }
    } else {
        None
    };

    let stats = Arc::new(EngineStats::default());
    let sync_stats = peer.as_ref().map(|p| p.stats.clone());
    let (inbox_tx, inbox) = mpsc::channel(INBOX);
    let (stop_engine, shutdown) = tokio::sync::oneshot::channel();
    let engine = Engine {
        cfg: cfg.clone(),
        alloc,
        writer: writer.clone(),
        senders,
        pinger,
        role: role.clone(),
        inbox,
        inbox_tx: inbox_tx.clone(),
        writer_events,
        stats: stats.clone(),
        started,
        shutdown,
        ticks: 0,
        peer,
    };
    let engine_task = tokio::spawn(engine.run());
    let mut receivers = Vec::new();
    for (i, s) in sockets.into_iter().enumerate() {
        receivers.push(tokio::spawn(receive(s, i, ifaces.clone(), inbox_tx.clone(), stats.clone())));
    }
    drop(inbox_tx);
    let refresher = tokio::spawn({
        let ifaces = ifaces.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                ifaces.refresh();
            }
        }
    });

    #[cfg(feature = "fault-injection")]
    let faults = fault::install(writer.clone()).expect("fault injection signal handlers");

    let listening: Vec<String> = cfg.dhcp.interfaces.iter().cloned().chain(cfg.dhcp.listen_relayed.then(|| "relay".to_string())).collect();
    let current = *role.borrow();
    tracing::info!(sockets = ?listening, node = %cfg.node.name, role = current.name(), term = current.term(), "listening on port 67");
    let watchdog = notify::watchdog_from_env();
    if let Some(w) = watchdog {
        tracing::info!(timeout_ms = w.as_millis() as u64, "systemd watchdog enabled; pinging every half timeout while the engine and the store thread are moving");
    }
    let status = notify::StatusReporter::new(role.clone(), stats.clone(), writer.stats.clone(), sync_stats);
    notify::ready(&status.line());
    let reporter = status.spawn(watchdog);

    shutdown_signal().await;
    tracing::info!("stopping");
    reporter.stop();
    notify::stopping();
    #[cfg(feature = "fault-injection")]
    faults.abort();
    refresher.abort();
    for r in receivers {
        r.abort();
    }
    let _ = stop_engine.send(());
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
    // The writer finishes what is queued, then its thread ends.
    let _ = tokio::task::spawn_blocking(move || writer_thread.join()).await;
    Ok(())
}

async fn receive(sock: DhcpSocket, index: usize, ifaces: Arc<Interfaces>, inbox: mpsc::Sender<Input>, stats: Arc<EngineStats>) {
    let mut buf = vec![0u8; 4096];
    let served = sock.device.is_some();
    loop {
        let r = match sock.recv(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        stats.received.fetch_add(1, Ordering::Relaxed);
        let req = match dhcp::parse(&buf[..r.len]) {
            Ok(req) => req,
            Err(why) => {
                tracing::debug!(from = %r.src, reason = %why, "dropped");
                continue;
            }
        };
        let ingress = Ingress { iface_addrs: ifaces.addrs_of(r.ifindex), local_dst: r.dst, served };
        if inbox.try_send(Input::Packet { req: Box::new(req), ingress, socket: index }).is_err() {
            stats.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }
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

/// Where `run` keeps the lease database for a config (for the `leases` command).
pub fn lease_db(cfg: &Config) -> PathBuf {
    cfg.lease_db_path()
}
