//! The one TCP connection to the partner.
//!
//! Both boxes listen and both dial while they have no link. A connection counts only once the
//! partner has proven the key on it: a handshake each way (node name, fresh nonce), then one
//! authenticated data frame each way bound to both nonces. If two connections come up (both
//! dialled at once, or the partner restarted while the old one looks alive here), the one dialled
//! by the box with the smaller node name is kept, and a newer one replaces one that was not;
//! both boxes apply the same rule, so they keep the same connection.
//!
//! A frame that fails authentication or decoding is dropped and logged, and the connection is
//! closed; the dialler then builds a new one. The link carries messages; what they mean is the
//! sync machine's business.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use super::frame::{self, Opener, Sealer};
use super::protocol::{self, Message};

#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub node: String,
    pub listen: SocketAddr,
    pub peer: SocketAddr,
    pub key: Arc<Vec<u8>>,
}

#[derive(Debug)]
pub enum LinkEvent {
    Up { session: u64, peer: String },
    Down { session: u64, reason: String },
    Message { session: u64, msg: Message },
}

/// Counters for status displays and tests.
#[derive(Debug, Default)]
pub struct LinkStats {
    /// Connections refused at the handshake (wrong key, garbage, timeout).
    pub rejected: AtomicU64,
    /// Established connections closed because a frame failed authentication or decoding.
    pub bad_frames: AtomicU64,
    pub sessions: AtomicU64,
}

enum Cmd {
    Send { session: u64, msg: Message },
    Close { session: u64, reason: String },
}

/// Sends to the partner; cheap to clone.
#[derive(Clone)]
pub struct LinkHandle {
    cmd: mpsc::UnboundedSender<Cmd>,
    pub stats: Arc<LinkStats>,
}

impl LinkHandle {
    /// Queues `msg` on `session`; dropped if that session is gone (the machine resends by
    /// catch-up on the next one).
    pub fn send(&self, session: u64, msg: Message) {
        let _ = self.cmd.send(Cmd::Send { session, msg });
    }

    pub fn close(&self, session: u64, reason: String) {
        let _ = self.cmd.send(Cmd::Close { session, reason });
    }
}

/// A connection that passed the handshake and the first authenticated frame.
struct Verified {
    read: OwnedReadHalf,
    write: OwnedWriteHalf,
    sealer: Sealer,
    opener: Opener,
    peer_name: String,
    dialed_by_me: bool,
    from: SocketAddr,
}

struct Current {
    session: u64,
    dialed_by_me: bool,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    tasks: [tokio::task::JoinHandle<()>; 2],
}

impl Drop for Current {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Handshakes in progress at once; more are refused (a flood of garbage connections must not
/// exhaust memory or tasks).
const MAX_HANDSHAKES: usize = 8;
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(3);
const CONNECT_DEADLINE: Duration = Duration::from_secs(2);

/// Starts the link: listener, dialler and connection manager.
pub fn spawn(cfg: LinkConfig) -> (LinkHandle, mpsc::UnboundedReceiver<LinkEvent>) {
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let stats = Arc::new(LinkStats::default());
    let (cand_tx, cand_rx) = mpsc::channel(4);
    tokio::spawn(listen(cfg.clone(), cand_tx.clone(), stats.clone()));
    tokio::spawn(manage(cfg, cmd_rx, ev_tx, cand_tx, cand_rx, stats.clone()));
    (LinkHandle { cmd: cmd_tx, stats }, ev_rx)
}

async fn listen(cfg: LinkConfig, cand: mpsc::Sender<Verified>, stats: Arc<LinkStats>) {
    let listener = loop {
        match TcpListener::bind(cfg.listen).await {
            Ok(l) => break l,
            Err(e) => {
                tracing::error!(listen = %cfg.listen, error = %e, "cannot listen for the partner; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    tracing::info!(listen = %cfg.listen, "listening for the partner");
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept on the peer port failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_HANDSHAKES {
            active.fetch_sub(1, Ordering::SeqCst);
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%from, "too many handshakes in progress on the peer port; connection refused");
            continue;
        }
        let (cfg, cand, stats, active) = (cfg.clone(), cand.clone(), stats.clone(), active.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_DEADLINE, handshake(&cfg, stream, from, false)).await {
                Ok(Ok(v)) => {
                    let _ = cand.send(v).await;
                }
                Ok(Err(e)) => {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%from, error = %e, "peer connection rejected");
                }
                Err(_) => {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%from, "peer connection rejected: no handshake within the deadline");
                }
            }
            active.fetch_sub(1, Ordering::SeqCst);
        });
    }
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

async fn handshake(cfg: &LinkConfig, stream: TcpStream, from: SocketAddr, dialed_by_me: bool) -> Result<Verified, HandshakeError> {
    stream.set_nodelay(true)?;
    let (mut read, mut write) = stream.into_split();
    let mine = frame::random_nonce();
    write.write_all(&frame::seal_handshake(&cfg.key, &cfg.node, &mine)).await?;
    let (peer_name, theirs) = frame::open_handshake(&cfg.key, &frame::read_frame(&mut read).await?)?;
    if peer_name == cfg.node {
        return Err(HandshakeError::SameName(peer_name));
    }
    let (mut sealer, mut opener) = (Sealer::new(&cfg.key, mine, theirs), Opener::new(&cfg.key, mine, theirs));
    // An empty authenticated frame bound to both nonces: proves the partner holds the key now,
    // on this connection (a replayed handshake cannot produce it).
    write.write_all(&sealer.seal(&[])).await?;
    let f = frame::read_frame(&mut read).await?;
    if !opener.open(&f)?.is_empty() {
        return Err(HandshakeError::NoConfirm);
    }
    Ok(Verified { read, write, sealer, opener, peer_name, dialed_by_me, from })
}

enum Closed {
    Session(u64, String),
}

async fn manage(
    cfg: LinkConfig,
    mut cmd: mpsc::UnboundedReceiver<Cmd>,
    events: mpsc::UnboundedSender<LinkEvent>,
    cand_tx: mpsc::Sender<Verified>,
    mut cand: mpsc::Receiver<Verified>,
    stats: Arc<LinkStats>,
) {
    let (closed_tx, mut closed) = mpsc::unbounded_channel::<Closed>();
    let mut current: Option<Current> = None;
    let mut next_session: u64 = 1;
    let mut dialing = false;
    let mut backoff = Duration::from_millis(100);
    let (dial_done_tx, mut dial_done) = mpsc::unbounded_channel::<bool>();
    let mut redial = tokio::time::interval(Duration::from_millis(100));
    redial.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_dial = tokio::time::Instant::now();
    loop {
        tokio::select! {
            c = cmd.recv() => match c {
                None => return,
                Some(Cmd::Send { session, msg }) => {
                    if let Some(cur) = current.as_ref().filter(|c| c.session == session) {
                        let _ = cur.tx.send(protocol::encode(&msg));
                    }
                }
                Some(Cmd::Close { session, reason }) => {
                    if current.as_ref().is_some_and(|c| c.session == session) {
                        current = None;
                        tracing::warn!(%reason, session, "closing the peer link");
                        let _ = events.send(LinkEvent::Down { session, reason });
                    }
                }
            },
            Some(v) = cand.recv() => {
                let preferred_is_me = cfg.node < v.peer_name;
                let new_preferred = v.dialed_by_me == preferred_is_me;
                let keep_new = match &current {
                    None => true,
                    Some(cur) => new_preferred || cur.dialed_by_me != preferred_is_me,
                };
                if !keep_new {
                    tracing::debug!(from = %v.from, "second connection from the partner; keeping the preferred one");
                    continue;
                }
                if let Some(old) = current.take() {
                    let _ = events.send(LinkEvent::Down { session: old.session, reason: "replaced by a newer connection".into() });
                }
                let session = next_session;
                next_session += 1;
                stats.sessions.fetch_add(1, Ordering::Relaxed);
                tracing::info!(peer = %v.peer_name, addr = %v.from, session, dialed_by_me = v.dialed_by_me, "peer link up");
                let _ = events.send(LinkEvent::Up { session, peer: v.peer_name.clone() });
                current = Some(start_connection(v, session, events.clone(), closed_tx.clone(), stats.clone()));
                backoff = Duration::from_millis(100);
            }
            Some(Closed::Session(session, reason)) = closed.recv() => {
                if current.as_ref().is_some_and(|c| c.session == session) {
                    current = None;
                    tracing::warn!(%reason, session, "peer link down");
                    let _ = events.send(LinkEvent::Down { session, reason });
                    next_dial = tokio::time::Instant::now();
                }
            }
            Some(ok) = dial_done.recv() => {
                dialing = false;
                if !ok {
                    next_dial = tokio::time::Instant::now() + backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
            _ = redial.tick() => {
                if current.is_none() && !dialing && tokio::time::Instant::now() >= next_dial {
                    dialing = true;
                    let (cfg, cand_tx, done, stats) = (cfg.clone(), cand_tx.clone(), dial_done_tx.clone(), stats.clone());
                    tokio::spawn(async move {
                        let ok = dial(&cfg, &cand_tx, &stats).await;
                        let _ = done.send(ok);
                    });
                }
            }
        }
    }
}

async fn dial(cfg: &LinkConfig, cand: &mpsc::Sender<Verified>, stats: &LinkStats) -> bool {
    let stream = match tokio::time::timeout(CONNECT_DEADLINE, TcpStream::connect(cfg.peer)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(peer = %cfg.peer, error = %e, "cannot reach the partner");
            return false;
        }
        Err(_) => {
            tracing::debug!(peer = %cfg.peer, "connecting to the partner timed out");
            return false;
        }
    };
    match tokio::time::timeout(HANDSHAKE_DEADLINE, handshake(cfg, stream, cfg.peer, true)).await {
        Ok(Ok(v)) => cand.send(v).await.is_ok(),
        Ok(Err(e)) => {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(peer = %cfg.peer, error = %e, "handshake with the partner failed");
            false
        }
        Err(_) => {
            tracing::warn!(peer = %cfg.peer, "handshake with the partner timed out");
            false
        }
    }
}

fn start_connection(v: Verified, session: u64, events: mpsc::UnboundedSender<LinkEvent>, closed: mpsc::UnboundedSender<Closed>, stats: Arc<LinkStats>) -> Current {
    let Verified { mut read, write, mut sealer, mut opener, dialed_by_me, from, .. } = v;
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let closed_w = closed.clone();
    let writer = tokio::spawn(async move {
        let mut w = BufWriter::with_capacity(64 * 1024, write);
        while let Some(body) = rx.recv().await {
            let mut r = w.write_all(&sealer.seal(&body)).await;
            // Everything already queued goes out in the same flush.
            while r.is_ok() {
                match rx.try_recv() {
                    Ok(body) => r = w.write_all(&sealer.seal(&body)).await,
                    Err(_) => break,
                }
            }
            if let Err(e) = r.and(w.flush().await) {
                let _ = closed_w.send(Closed::Session(session, format!("write failed: {e}")));
                return;
            }
        }
    });
    let reader = tokio::spawn(async move {
        let reason = loop {
            let f = match frame::read_frame(&mut read).await {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break "the partner closed the connection".to_string(),
                Err(e) => break format!("read failed: {e}"),
            };
            let body = match opener.open(&f) {
                Ok(b) => b,
                Err(e) => {
                    stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%from, error = %e, "peer frame dropped; re-establishing the link");
                    break format!("bad frame: {e}");
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
                    tracing::warn!(%from, error = %e, "undecodable peer message dropped; re-establishing the link");
                    break format!("bad message: {e}");
                }
            }
        };
        let _ = closed.send(Closed::Session(session, reason));
    });
    Current { session, dialed_by_me, tx, tasks: [writer, reader] }
}
