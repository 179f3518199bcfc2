//! The ICMP echo probe before a first offer (ISC dhcpd's ping check): an address that answers is
//! in use by someone without a lease. Uses a raw ICMP socket (CAP_NET_RAW) or, failing that, an
//! unprivileged ping socket where net.ipv4.ping_group_range allows it.

use std::collections::HashMap;
use std::io;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

pub struct Pinger {
    sock: AsyncFd<Socket>,
    raw: bool,
    ident: u16,
    seq: AtomicU16,
    waiting: Mutex<HashMap<(Ipv4Addr, u16), oneshot::Sender<()>>>,
}

impl Pinger {
    /// Opens the ICMP socket and starts the task that matches echo replies to probes.
    pub fn start() -> io::Result<Arc<Pinger>> {
        let (sock, raw) = match Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4)) {
            Ok(s) => (s, true),
            Err(_) => (Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::ICMPV4))?, false),
        };
        sock.set_nonblocking(true)?;
        // SAFETY: the socket is owned by the AsyncFd and closed only when the AsyncFd drops.
        let sock = unsafe { AsyncFd::register(sock) }.map_err(|e| e.into_parts().1)?;
        let p = Arc::new(Pinger {
            sock,
            raw,
            ident: std::process::id() as u16,
            seq: AtomicU16::new(1),
            waiting: Mutex::new(HashMap::new()),
        });
        let me = p.clone();
        tokio::spawn(async move { me.receive().await });
        Ok(p)
    }

    /// Sends one echo request to `addr`; true if a reply came back within `timeout`.
    pub async fn probe(&self, addr: Ipv4Addr, timeout: Duration) -> bool {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap().insert((addr, seq), tx);
        let packet = echo_request(self.ident, seq);
        let sent = self.sock.get_ref().send_to(&packet, &SockAddr::from(SocketAddrV4::new(addr, 0)));
        let answered = match sent {
            Ok(_) => tokio::time::timeout(timeout, rx).await.is_ok_and(|r| r.is_ok()),
            // No route or similar: nobody can be using it from where we stand.
            Err(e) => {
                tracing::debug!(%addr, error = %e, "ping not sent");
                false
            }
        };
        self.waiting.lock().unwrap().remove(&(addr, seq));
        answered
    }

    async fn receive(&self) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 1500];
        loop {
            let Ok(mut guard) = self.sock.readable().await else { return };
            let r = guard.try_io(|s| s.get_ref().recv_from(&mut buf));
            let Ok(Ok((n, from))) = r else { continue };
            // SAFETY: recv_from initialised the first n bytes.
            let data: &[u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, n) };
            let Some(from) = from.as_socket_ipv4() else { continue };
            let icmp = if self.raw {
                let ihl = usize::from(data.first().map_or(0, |b| b & 0x0f)) * 4;
                data.get(ihl..).unwrap_or(&[])
            } else {
                data
            };
            // Echo reply: type 0, code 0, then checksum, identifier, sequence.
            if icmp.len() < 8 || icmp[0] != 0 || icmp[1] != 0 {
                continue;
            }
            let ident = u16::from_be_bytes([icmp[4], icmp[5]]);
            if self.raw && ident != self.ident {
                continue; // somebody else's ping (a ping socket's identifier is the kernel's)
            }
            let seq = u16::from_be_bytes([icmp[6], icmp[7]]);
            if let Some(tx) = self.waiting.lock().unwrap().remove(&(*from.ip(), seq)) {
                let _ = tx.send(());
            }
        }
    }
}

fn echo_request(ident: u16, seq: u16) -> Vec<u8> {
    let mut p = vec![8, 0, 0, 0];
    p.extend_from_slice(&ident.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(b"twinlease probe.");
    let sum = checksum(&p);
    p[2..4].copy_from_slice(&sum.to_be_bytes());
    p
}

/// The Internet checksum (RFC 1071).
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    #[test]
    fn checksum_of_a_packet_with_its_checksum_is_zero() {
        let p = super::echo_request(0x1234, 7);
        assert_eq!(super::checksum(&p), 0);
    }
}
