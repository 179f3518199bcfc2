//! What a running server holds exclusively on its box, so a second `twinlease run` refuses to
//! start instead of serving beside the first:
//!
//! * the state directory, by an advisory lock on `<state_dir>/lock` (two writers on one lease
//!   database would each overwrite the other's changes);
//! * each served interface and the relay socket, by an abstract UNIX socket name per network
//!   namespace (two servers on one link would both answer every client; port 67 itself cannot
//!   say, since both bind it with SO_REUSEADDR).
//!
//! The kernel releases all of these when the process ends, however it ends.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(
        "another twinlease ({holder}) is running with the state directory {dir}; stop it first (two servers must never share one lease database)"
    )]
    StateDirBusy { dir: PathBuf, holder: String },
    #[error("cannot lock the state directory {dir}: {source}")]
    StateDirLock { dir: PathBuf, source: std::io::Error },
    #[error(
        "another twinlease already serves {what} in this network namespace; run one server per interface (stop the other, or remove it from [dhcp] interfaces)"
    )]
    Taken { what: String },
    #[error("cannot claim {what}: {source}")]
    Socket { what: String, source: std::io::Error },
}

/// Held for as long as the server runs.
#[derive(Debug)]
pub struct Claims {
    _state_dir: File,
    _names: Vec<UnixListener>,
}

impl Claims {
    /// Locks `state_dir` and claims `interfaces` (and the relay socket, if `relayed`).
    pub fn take(state_dir: &Path, interfaces: &[String], relayed: bool) -> Result<Claims, ClaimError> {
        let state = lock_state_dir(state_dir)?;
        let mut names = Vec::new();
        for i in interfaces {
            names.push(claim_name(&format!("twinlease/dhcp/{i}"), &format!("interface {i}"))?);
        }
        if relayed {
            names.push(claim_name("twinlease/dhcp-relayed", "the relay socket (listen_relayed)")?);
        }
        Ok(Claims { _state_dir: state, _names: names })
    }
}

fn lock_state_dir(dir: &Path) -> Result<File, ClaimError> {
    let lock_err = |source| ClaimError::StateDirLock { dir: dir.to_path_buf(), source };
    std::fs::create_dir_all(dir).map_err(lock_err)?;
    let path = dir.join("lock");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(lock_err)?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let holder = std::fs::read_to_string(&path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
            let holder = holder.map_or_else(|| "pid unknown".to_string(), |pid| format!("pid {pid}"));
            return Err(ClaimError::StateDirBusy { dir: dir.to_path_buf(), holder });
        }
        return Err(lock_err(e));
    }
    // Only the holder writes its pid, after locking, for the next one's message.
    f.set_len(0).and_then(|()| writeln!(f, "{}", std::process::id())).map_err(lock_err)?;
    Ok(f)
}

fn claim_name(name: &str, what: &str) -> Result<UnixListener, ClaimError> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|source| ClaimError::Socket { what: what.into(), source })?;
    UnixListener::bind_addr(&addr).map_err(|source| match source.kind() {
        std::io::ErrorKind::AddrInUse => ClaimError::Taken { what: what.into() },
        _ => ClaimError::Socket { what: what.into(), source },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_on_a_state_dir_or_an_interface_is_refused_until_the_first_ends() {
        let dir = tempfile::tempdir().unwrap();
        let iface = format!("tl-test-{}", std::process::id());
        let first = Claims::take(dir.path(), std::slice::from_ref(&iface), false).unwrap();
        let again = Claims::take(dir.path(), &[], false).unwrap_err();
        assert!(
            matches!(&again, ClaimError::StateDirBusy { holder, .. } if *holder == format!("pid {}", std::process::id())),
            "{again}"
        );
        let other = tempfile::tempdir().unwrap();
        let taken = Claims::take(other.path(), std::slice::from_ref(&iface), false).unwrap_err();
        assert!(matches!(taken, ClaimError::Taken { .. }), "{taken}");
        drop(first);
        Claims::take(dir.path(), &[iface], false).unwrap();
    }
}
