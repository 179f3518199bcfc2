//! Asking a running box: one request, one answer, over its status or control socket. Used by
//! `twinlease status`, `twinlease ctl` and the console (`twinlease tui`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::protocol::{Request, Response};

/// How long a box may take to answer.
const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("twinlease is not running (nothing answers on {path}: {source})")]
    NotRunning { path: String, source: std::io::Error },
    #[error(
        "{path}: permission denied; the status socket needs the status group, the control socket root or the admin group"
    )]
    Denied { path: String },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: the answer is not a response ({0})", path = .1)]
    Malformed(String, String),
}

/// Who is sending an action, for the daemon's log: the person behind `sudo`, else the login
/// name; None when neither is known.
pub fn operator() -> Option<String> {
    std::env::var("SUDO_USER").or_else(|_| std::env::var("USER")).ok()
}

pub fn ask(socket: &Path, req: &Request) -> Result<Response, ClientError> {
    ask_within(socket, req, DEADLINE)
}

/// [`ask`] with a deadline of the caller's (the console must not freeze for long on a wedged
/// daemon).
pub fn ask_within(socket: &Path, req: &Request, deadline: Duration) -> Result<Response, ClientError> {
    let path = socket.display().to_string();
    let mut stream = UnixStream::connect(socket).map_err(|source| match source.kind() {
        std::io::ErrorKind::PermissionDenied => ClientError::Denied { path: path.clone() },
        _ => ClientError::NotRunning { path: path.clone(), source },
    })?;
    let io = |source| ClientError::Io { path: path.clone(), source };
    stream.set_read_timeout(Some(deadline)).map_err(io)?;
    stream.set_write_timeout(Some(deadline)).map_err(io)?;
    stream.write_all(&req.to_line()).map_err(io)?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).map_err(io)?;
    serde_json::from_str(&line).map_err(|e| ClientError::Malformed(e.to_string(), path.clone()))
}
