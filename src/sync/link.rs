//! The one TCP connection to the partner.
//!
//! Both boxes listen and both dial while they have no link. The listener accepts connections
//! only from the partner's configured address (anything else is closed at once and never takes
//! a handshake slot), and the dialler connects from its own `listen` address, so each box sees
//! the other at the address its config names. A connection counts only once the partner has
//! proven the key on it: a handshake each way (side, node name, fresh nonce; see `frame`), then
//! one authenticated data frame each way bound to both handshakes. If two connections come up
//! (both dialled at once, or the partner restarted while the old one looks alive here), the one
//! dialled by the box with the smaller node name is kept, and a newer one replaces one that was
//! not; both boxes apply the same rule, so they keep the same connection. Only a connection
//! that passed all of this can replace the current one.
//!
//! A frame that fails authentication or decoding is dropped and logged, and the connection is
//! closed; the dialler then builds a new one. The link carries messages; what they mean is the
//! sync machine's business. Rejections are counted exactly and logged at a bounded rate.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::frame::{self, Hello, Opener, Sealer, Side};
use super::protocol::{self, Message};
use crate::logging::Throttle;

#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub node: String,
    pub listen: SocketAddr,
    pub partner: SocketAddr,
    pub key: Arc<Vec<u8>>,
}

#[derive(Debug)]
pub enum LinkEvent {
    Up { session: u64, partner: String },
    Down { session: u64, reason: String },
    Message { session: u64, msg: Message },
}

/// Counters for status displays and tests.
#[derive(Debug, Default)]
pub struct LinkStats {
    /// Connections refused at the handshake (wrong key, garbage, a relayed or reflected
    /// handshake, timeout, or a slot taken back for a newer connection).
    pub rejected: AtomicU64,
    /// Connections closed at once because they did not come from the partner's address.
    pub foreign: AtomicU64,
    /// Established connections closed because a frame failed authentication or decoding.
    pub bad_frames: AtomicU64,
    pub sessions: AtomicU64,
}

/// What the link's user asks of it.
#[derive(Debug)]
pub enum LinkCommand {
    Send { session: u64, msg: Message },
    Close { session: u64, reason: String },
}

/// Sends to the partner; cheap to clone.
#[derive(Clone)]
pub struct LinkHandle {
    cmd: mpsc::UnboundedSender<LinkCommand>,
    pub stats: Arc<LinkStats>,
}

impl LinkHandle {
    /// Queues `msg` on `session`; dropped if that session is gone (the machine resends by
    /// catch-up on the next one).
    pub fn send(&self, session: u64, msg: Message) {
        let _ = self.cmd.send(LinkCommand::Send { session, msg });
    }

    pub fn close(&self, session: u64, reason: String) {
        let _ = self.cmd.send(LinkCommand::Close { session, reason });
    }
}

/// A connection that passed the handshake and the first authenticated frame.
struct Verified {
    read: OwnedReadHalf,
    write: OwnedWriteHalf,
    sealer: Sealer,
    opener: Opener,
    partner_name: String,
    dialed_by_me: bool,
    from: SocketAddr,
}

struct Current {
    session: u64,
    dialed_by_me: bool,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for Current {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Handshakes in progress at once on the listener. Only the partner's address gets this far,
/// and when all are taken the oldest is dropped for the newcomer: idle connections cannot
/// lock the partner out.
const MAX_HANDSHAKES: usize = 4;
/// The whole pre-authentication exchange is two round trips and two HMACs: on a direct cable
/// that is well under a millisecond, so a second is generous and frees a stalled slot soon.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(1);
const CONNECT_DEADLINE: Duration = Duration::from_secs(2);
/// Rejection warnings: at most this many lines per window; the counters keep exact numbers.
const REJECT_LOG_BURST: u32 = 5;
const REJECT_LOG_WINDOW: Duration = Duration::from_secs(10);

/// A shared, rate-limited warning for rejected connections.
#[derive(Clone)]
struct RejectLog(Arc<Mutex<Throttle>>);

impl RejectLog {
    fn new() -> RejectLog {
        RejectLog(Arc::new(Mutex::new(Throttle::new(REJECT_LOG_WINDOW, REJECT_LOG_BURST))))
    }

    fn warn(&self, from: SocketAddr, why: &dyn std::fmt::Display) {
        let admitted = self.0.lock().unwrap_or_else(|e| e.into_inner()).admit(Instant::now());
        if let Some(held_back) = admitted {
            tracing::warn!(%from, reason = %why, not_logged_since = held_back, "peer connection rejected");
        }
    }
}

/// A handle whose commands come out of the returned receiver instead of going to a
/// connection: for in-process tests that play the partner (or join two boxes directly).
pub fn detached() -> (LinkHandle, mpsc::UnboundedReceiver<LinkCommand>) {
    let (cmd, commands) = mpsc::unbounded_channel();
    (LinkHandle { cmd, stats: Arc::new(LinkStats::default()) }, commands)
}

/// Starts the link: listener, dialler and connection manager.
pub fn spawn(cfg: LinkConfig) -> (LinkHandle, mpsc::UnboundedReceiver<LinkEvent>) {
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let stats = Arc::new(LinkStats::default());
    let (cand_tx, cand_rx) = mpsc::channel(4);
    let rejects = RejectLog::new();
    tokio::spawn(listen(cfg.clone(), cand_tx.clone(), stats.clone(), rejects.clone()));
    let (closed_tx, closed_rx) = mpsc::unbounded_channel();
    let (dial_done_tx, dial_done_rx) = mpsc::unbounded_channel();
    let manager = Manager {
        cfg,
        events: ev_tx,
        cand_tx,
        stats: stats.clone(),
        rejects,
        closed_tx,
        dial_done_tx,
        current: None,
        next_session: 1,
        dialing: false,
        backoff: Duration::from_millis(100),
        next_dial: tokio::time::Instant::now(),
    };
    tokio::spawn(manager.run(cmd_rx, cand_rx, closed_rx, dial_done_rx));
    (LinkHandle { cmd: cmd_tx, stats }, ev_rx)
}

async fn bind_listener(addr: SocketAddr) -> TcpListener {
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) => {
                tracing::error!(listen = %addr, error = %e, "cannot listen for the partner; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

async fn listen(cfg: LinkConfig, cand: mpsc::Sender<Verified>, stats: Arc<LinkStats>, rejects: RejectLog) {
    let listener = bind_listener(cfg.listen).await;
    tracing::info!(listen = %cfg.listen, partner = %cfg.partner.ip(), "listening for the partner");
    let mut handshakes: VecDeque<JoinHandle<()>> = VecDeque::new();
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept on the peer port failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if !same_host(from.ip(), cfg.partner.ip()) {
            stats.foreign.fetch_add(1, Ordering::Relaxed);
            rejects.warn(from, &format_args!("not the partner's address {}", cfg.partner.ip()));
            continue; // dropping the stream closes it
        }
        handshakes.retain(|h| !h.is_finished());
        if handshakes.len() >= MAX_HANDSHAKES
            && let Some(oldest) = handshakes.pop_front()
        {
            oldest.abort();
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            rejects.warn(from, &"every handshake slot busy; the oldest was dropped for this one");
        }
        let (cfg, cand, stats, rejects) = (cfg.clone(), cand.clone(), stats.clone(), rejects.clone());
        handshakes.push_back(tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_DEADLINE, handshake(&cfg, stream, from, Side::Acceptor)).await {
                Ok(Ok(v)) => {
                    let _ = cand.send(v).await;
                }
                Ok(Err(e)) => {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    rejects.warn(from, &e);
                }
                Err(_) => {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    rejects.warn(from, &"no handshake within the deadline");
                }
            }
        }));
    }
}

/// The same host, also when one side writes an IPv4 address as IPv4-mapped IPv6.
fn same_host(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Frame(#[from] frame::FrameError),
    #[error("the connecting box calls itself {0:?}, like this one; give each box its own [node] name")]
    SameName(String),
    #[error("the first frame was not the link confirmation")]
    NoConfirm,
}

async fn handshake(
    cfg: &LinkConfig,
    stream: TcpStream,
    from: SocketAddr,
    side: Side,
) -> Result<Verified, HandshakeError> {
    stream.set_nodelay(true)?;
    let (mut read, mut write) = stream.into_split();
    let mine = Hello { side, node: cfg.node.clone(), nonce: frame::random_nonce() };
    write.write_all(&frame::seal_handshake(&cfg.key, &mine)).await?;
    let theirs = frame::open_handshake(&cfg.key, &frame::read_frame(&mut read).await?)?;
    if theirs.node == cfg.node {
        return Err(HandshakeError::SameName(theirs.node));
    }
    let (mut sealer, mut opener) = frame::session(&cfg.key, &mine, &theirs)?;
    // An empty authenticated frame bound to both handshakes: proves the partner holds the key
    // now, on this connection (a replayed handshake cannot produce it).
    write.write_all(&sealer.seal(&[])).await?;
    let f = frame::read_frame(&mut read).await?;
    if !opener.open(&f)?.is_empty() {
        return Err(HandshakeError::NoConfirm);
    }
    Ok(Verified { read, write, sealer, opener, partner_name: theirs.node, dialed_by_me: side == Side::Dialer, from })
}

enum Closed {
    Session(u64, String),
}

/// Owns the current connection: picks between candidates, redials, routes commands.
struct Manager {
    cfg: LinkConfig,
    events: mpsc::UnboundedSender<LinkEvent>,
    cand_tx: mpsc::Sender<Verified>,
    stats: Arc<LinkStats>,
    rejects: RejectLog,
    closed_tx: mpsc::UnboundedSender<Closed>,
    dial_done_tx: mpsc::UnboundedSender<bool>,
    current: Option<Current>,
    next_session: u64,
    dialing: bool,
    backoff: Duration,
    next_dial: tokio::time::Instant,
}

impl Manager {
    async fn run(
        mut self,
        mut cmd: mpsc::UnboundedReceiver<LinkCommand>,
        mut cand: mpsc::Receiver<Verified>,
        mut closed: mpsc::UnboundedReceiver<Closed>,
        mut dial_done: mpsc::UnboundedReceiver<bool>,
    ) {
        let mut redial = tokio::time::interval(Duration::from_millis(100));
        redial.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                c = cmd.recv() => match c {
                    None => return,
                    Some(c) => self.on_command(c),
                },
                Some(v) = cand.recv() => self.on_candidate(v),
                Some(Closed::Session(session, reason)) = closed.recv() => self.on_closed(session, reason),
                Some(ok) = dial_done.recv() => self.on_dial_done(ok),
                _ = redial.tick() => self.maybe_dial(),
            }
        }
    }

    fn on_command(&mut self, c: LinkCommand) {
        match c {
            LinkCommand::Send { session, msg } => {
                if let Some(cur) = self.current.as_ref().filter(|c| c.session == session) {
                    let _ = cur.tx.send(protocol::encode(&msg));
                }
            }
            LinkCommand::Close { session, reason } => {
                if self.current.as_ref().is_some_and(|c| c.session == session) {
                    self.current = None;
                    tracing::warn!(%reason, session, "closing the peer link");
                    let _ = self.events.send(LinkEvent::Down { session, reason });
                }
            }
        }
    }

    fn on_candidate(&mut self, v: Verified) {
        let preferred_is_me = self.cfg.node < v.partner_name;
        let new_preferred = v.dialed_by_me == preferred_is_me;
        let keep_new = match &self.current {
            None => true,
            Some(cur) => new_preferred || cur.dialed_by_me != preferred_is_me,
        };
        if !keep_new {
            tracing::debug!(from = %v.from, "second connection from the partner; keeping the preferred one");
            return;
        }
        if let Some(old) = self.current.take() {
            let reason = "replaced by a newer connection".into();
            let _ = self.events.send(LinkEvent::Down { session: old.session, reason });
        }
        let session = self.next_session;
        self.next_session += 1;
        self.stats.sessions.fetch_add(1, Ordering::Relaxed);
        tracing::info!(partner = %v.partner_name, addr = %v.from, session, dialed_by_me = v.dialed_by_me, "peer link up");
        let _ = self.events.send(LinkEvent::Up { session, partner: v.partner_name.clone() });
        let (events, closed, stats) = (self.events.clone(), self.closed_tx.clone(), self.stats.clone());
        self.current = Some(start_connection(v, session, events, closed, stats));
        self.backoff = Duration::from_millis(100);
    }

    fn on_closed(&mut self, session: u64, reason: String) {
        if self.current.as_ref().is_some_and(|c| c.session == session) {
            self.current = None;
            tracing::warn!(%reason, session, "peer link down");
            let _ = self.events.send(LinkEvent::Down { session, reason });
            self.next_dial = tokio::time::Instant::now();
        }
    }

    fn on_dial_done(&mut self, connected: bool) {
        self.dialing = false;
        if !connected {
            self.next_dial = tokio::time::Instant::now() + self.backoff;
            self.backoff = (self.backoff * 2).min(Duration::from_secs(2));
        }
    }

    fn maybe_dial(&mut self) {
        if self.current.is_some() || self.dialing || tokio::time::Instant::now() < self.next_dial {
            return;
        }
        self.dialing = true;
        let (cfg, cand, done) = (self.cfg.clone(), self.cand_tx.clone(), self.dial_done_tx.clone());
        let (stats, rejects) = (self.stats.clone(), self.rejects.clone());
        tokio::spawn(async move {
            let ok = dial(&cfg, &cand, &stats, &rejects).await;
            let _ = done.send(ok);
        });
    }
}

/// Connects to the partner from this box's own `listen` address (when it names one), so the
/// partner's source check sees the address its config has for this box.
async fn connect(cfg: &LinkConfig) -> std::io::Result<TcpStream> {
    let socket = if cfg.partner.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if !cfg.listen.ip().is_unspecified() && cfg.listen.is_ipv4() == cfg.partner.is_ipv4() {
        socket.bind(SocketAddr::new(cfg.listen.ip(), 0))?;
    }
    socket.connect(cfg.partner).await
}

async fn dial(cfg: &LinkConfig, cand: &mpsc::Sender<Verified>, stats: &LinkStats, rejects: &RejectLog) -> bool {
    let stream = match tokio::time::timeout(CONNECT_DEADLINE, connect(cfg)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(partner = %cfg.partner, error = %e, "cannot reach the partner");
            return false;
        }
        Err(_) => {
            tracing::debug!(partner = %cfg.partner, "connecting to the partner timed out");
            return false;
        }
    };
    match tokio::time::timeout(HANDSHAKE_DEADLINE, handshake(cfg, stream, cfg.partner, Side::Dialer)).await {
        Ok(Ok(v)) => cand.send(v).await.is_ok(),
        Ok(Err(e)) => {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            rejects.warn(cfg.partner, &format_args!("handshake with the partner failed: {e}"));
            false
        }
        Err(_) => {
            rejects.warn(cfg.partner, &"handshake with the partner timed out");
            false
        }
    }
}

fn start_connection(
    v: Verified,
    session: u64,
    events: mpsc::UnboundedSender<LinkEvent>,
    closed: mpsc::UnboundedSender<Closed>,
    stats: Arc<LinkStats>,
) -> Current {
    let Verified { read, write, sealer, opener, dialed_by_me, from, .. } = v;
    let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let closed_w = closed.clone();
    let writer = tokio::spawn(async move {
        if let Err(e) = write_loop(write, sealer, rx).await {
            let _ = closed_w.send(Closed::Session(session, format!("write failed: {e}")));
        }
    });
    let reader = tokio::spawn(async move {
        let reason = read_loop(read, opener, from, session, &events, &stats).await;
        let _ = closed.send(Closed::Session(session, reason));
    });
    Current { session, dialed_by_me, tx, tasks: [writer, reader] }
}

async fn write_loop(
    write: OwnedWriteHalf,
    mut sealer: Sealer,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
) -> std::io::Result<()> {
    let mut w = BufWriter::with_capacity(64 * 1024, write);
    while let Some(body) = rx.recv().await {
        w.write_all(&sealer.seal(&body)).await?;
        // Everything already queued goes out in the same flush.
        while let Ok(body) = rx.try_recv() {
            w.write_all(&sealer.seal(&body)).await?;
        }
        w.flush().await?;
    }
    Ok(())
}

/// Reads and delivers messages until the connection ends; returns why it ended.
async fn read_loop(
    mut read: OwnedReadHalf,
    mut opener: Opener,
    from: SocketAddr,
    session: u64,
    events: &mpsc::UnboundedSender<LinkEvent>,
    stats: &LinkStats,
) -> String {
    loop {
        let f = match frame::read_frame(&mut read).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return "the partner closed the connection".to_string();
            }
            Err(e) => return format!("read failed: {e}"),
        };
        let body = match opener.open(&f) {
            Ok(b) => b,
            Err(e) => {
                stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%from, error = %e, "frame from the partner dropped; re-establishing the link");
                return format!("bad frame: {e}");
            }
        };
        if body.is_empty() {
            continue;
        }
        match protocol::decode(body) {
            Ok(msg) => {
                let _ = events.send(LinkEvent::Message { session, msg });
            }
            Err(e) => {
                stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%from, error = %e, "undecodable message from the partner dropped; re-establishing the link");
                return format!("bad message: {e}");
            }
        }
    }
}
