//! The two sockets under the runtime directory: `status.sock` (read-only commands; mode 0660,
//! group `status_group`) and `control.sock` (actions too; mode 0660, group `admin_group`).
//! Each connection is a task of its own with its own deadlines, so a slow or stuck client costs
//! one slot and nothing else: the DHCP path never waits on it.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

use super::commands::{Caller, Handlers};
use super::protocol::{self, MAX_REQUEST, Response};
use crate::config::Control;
use crate::logging::Throttle;

/// Connections served at once per socket; more are told so and closed.
const MAX_CLIENTS: usize = 256;
/// A connection with no complete request for this long is closed (its slot is freed).
const IDLE: Duration = Duration::from_secs(60);
/// A client that does not read its answer within this long is dropped.
const WRITE_DEADLINE: Duration = Duration::from_secs(5);

/// Refused requests and clients are logged, but a local program looping on a bad request must
/// not fill the journal: at most this many lines per socket per 10 s, the rest counted.
const REFUSALS_LOGGED: u32 = 5;

/// The log of one socket's refusals (malformed, oversized, busy, idle, not reading).
#[derive(Clone)]
struct Refusals {
    socket: &'static str,
    throttle: Arc<std::sync::Mutex<Throttle>>,
}

impl Refusals {
    fn new(may_act: bool) -> Refusals {
        let throttle = Throttle::new(Duration::from_secs(10), REFUSALS_LOGGED);
        Refusals {
            socket: if may_act { "control" } else { "status" },
            throttle: Arc::new(std::sync::Mutex::new(throttle)),
        }
    }

    fn note(&self, uid: Option<u32>, what: &str) {
        let admitted = self.throttle.lock().unwrap_or_else(|e| e.into_inner()).admit(std::time::Instant::now());
        if let Some(held_back) = admitted {
            tracing::warn!(socket = self.socket, ?uid, held_back, "{what}");
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot create the runtime directory {dir}: {source}")]
    RuntimeDir { dir: PathBuf, source: std::io::Error },
    #[error("another twinlease answers on {0}; give each instance its own [control] runtime_dir")]
    InUse(PathBuf),
    #[error("cannot listen on {path}: {source}")]
    Bind { path: PathBuf, source: std::io::Error },
    #[error("cannot start the control thread: {0}")]
    Runtime(std::io::Error),
}

/// The sockets, served by a thread of their own: its own tokio runtime at a lower CPU priority,
/// so status clients, however many or however busy, take time from nothing but each other and
/// never hold up the DHCP engine's loop. Dropping it stops the thread and removes the files.
pub struct ControlSockets {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    paths: Vec<PathBuf>,
}

impl Drop for ControlSockets {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// How much less CPU priority the control thread has than the rest of the daemon.
const NICER: libc::c_int = 10;

impl ControlSockets {
    /// Binds both sockets (and, given `metrics`, serves Prometheus there) on the control
    /// thread; returns once they listen, or with why they cannot.
    pub fn start(
        cfg: &Control,
        handlers: Handlers,
        metrics: Option<SocketAddr>,
    ) -> Result<ControlSockets, ControlError> {
        let dir = cfg.runtime_dir.clone();
        std::fs::create_dir_all(&dir).map_err(|source| ControlError::RuntimeDir { dir: dir.clone(), source })?;
        let sockets = [
            (cfg.status_socket(), cfg.status_group.clone(), false),
            (cfg.control_socket(), cfg.admin_group.clone(), true),
        ];
        let paths = sockets.iter().map(|(p, _, _)| p.clone()).collect();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                // The raw syscall, not libc::gettid(): the static musl build links that as a null
                // weak symbol and the daemon would crash here at start.
                // SAFETY: gettid reads no memory; setpriority lowers this thread's own priority.
                unsafe {
                    let tid = libc::syscall(libc::SYS_gettid);
                    libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICER);
                }
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(source) => return drop(ready_tx.send(Err(ControlError::Runtime(source)))),
                };
                rt.block_on(async move {
                    let mut tasks = Vec::new();
                    for (path, group, may_act) in sockets {
                        match bind(&path, &group) {
                            Ok(l) => tasks.push(tokio::spawn(serve(l, handlers.clone(), may_act))),
                            Err(e) => return drop(ready_tx.send(Err(e))),
                        }
                    }
                    if let Some(addr) = metrics {
                        tasks.push(tokio::spawn(super::metrics::serve(addr, handlers.sources.clone())));
                    }
                    let _ = ready_tx.send(Ok(()));
                    let _ = stopped.await;
                    for t in tasks {
                        t.abort();
                    }
                });
            })
            .map_err(ControlError::Runtime)?;
        let started =
            ready.recv().unwrap_or_else(|_| Err(ControlError::Runtime(std::io::Error::other("control thread ended"))));
        let sockets = ControlSockets { stop: Some(stop), thread: Some(thread), paths };
        started?;
        tracing::info!(dir = %dir.display(), "status and control sockets open");
        Ok(sockets)
    }
}

/// Binds a socket file at `path` (taking the place of a stale one), 0660, group `group` when
/// that group exists.
fn bind(path: &Path, group: &str) -> Result<UnixListener, ControlError> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(ControlError::InUse(path.to_path_buf()));
    }
    let _ = std::fs::remove_file(path);
    let bind_err = |source| ControlError::Bind { path: path.to_path_buf(), source };
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(bind_err)?;
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => {
            if let Err(e) = nix::unistd::chown(path, None, Some(g.gid)) {
                tracing::warn!(path = %path.display(), %group, error = %e, "cannot give the socket to its group; only this user may use it");
            }
        }
        _ => {
            tracing::warn!(path = %path.display(), %group, "no such group; only this user (and root) may use the socket")
        }
    }
    Ok(listener)
}

async fn serve(listener: UnixListener, handlers: Handlers, may_act: bool) {
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    let refusals = Refusals::new(may_act);
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept on a control socket failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let uid = stream.peer_cred().ok().map(|c| c.uid());
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refusals.note(uid, &format!("client refused: {MAX_CLIENTS} clients are connected"));
            tokio::spawn(refuse(stream));
            continue;
        };
        let (handlers, refusals) = (handlers.clone(), refusals.clone());
        tokio::spawn(async move {
            connection(stream, &handlers, Caller { uid, may_act }, &refusals).await;
            drop(slot);
        });
    }
}

async fn refuse(mut stream: UnixStream) {
    let line = Response::error(format!("busy: {MAX_CLIENTS} clients are connected; try again")).to_line();
    let _ = tokio::time::timeout(WRITE_DEADLINE, stream.write_all(&line)).await;
}

/// Answers requests, one per line, until the client goes, idles, sends an oversized request or
/// does not read its answers.
async fn connection(stream: UnixStream, handlers: &Handlers, caller: Caller, refusals: &Refusals) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        let got = tokio::time::timeout(IDLE, read_line(&mut read, &mut line)).await;
        let response = match got {
            Err(_) => {
                return refusals
                    .note(caller.uid, &format!("client closed: no complete request in {} s", IDLE.as_secs()));
            }
            Ok(Err(_)) | Ok(Ok(Line::End)) => return,
            Ok(Ok(Line::TooLong)) => {
                refusals.note(caller.uid, &format!("request refused: longer than {MAX_REQUEST} bytes"));
                let r = Response::error(format!("request longer than {MAX_REQUEST} bytes; refused"));
                let _ = tokio::time::timeout(WRITE_DEADLINE, write.write_all(&r.to_line())).await;
                return;
            }
            Ok(Ok(Line::Complete)) => match protocol::parse(&line) {
                Ok(req) => handlers.handle(&req, caller).await,
                Err(r) => {
                    refusals.note(caller.uid, &format!("request refused: {}", r.text));
                    r
                }
            },
        };
        match tokio::time::timeout(WRITE_DEADLINE, write.write_all(&response.to_line())).await {
            Ok(Ok(())) => {}
            _ => {
                let what = format!("client dropped: it did not read its answer within {} s", WRITE_DEADLINE.as_secs());
                return refusals.note(caller.uid, &what);
            }
        }
    }
}

enum Line {
    Complete,
    TooLong,
    End,
}

/// Reads up to a newline, at most [`MAX_REQUEST`] bytes.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R, line: &mut Vec<u8>) -> std::io::Result<Line> {
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(if line.is_empty() { Line::End } else { Line::Complete });
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if line.len() + take > MAX_REQUEST {
            return Ok(Line::TooLong);
        }
        line.extend_from_slice(&buf[..take]);
        r.consume(take);
        if done {
            return Ok(Line::Complete);
        }
    }
}
