//! DHCP sockets: one per served interface (SO_BINDTODEVICE, so broadcasts go out the right
//! link) and one unbound socket for relayed traffic. Every socket reports, per packet, the
//! interface and destination address (IP_PKTINFO) the decisions need.

use std::io::{self, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::socket::{ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrIn, recvmmsg, setsockopt, sockopt};
use socket2::{Domain, Protocol, Socket, Type};

use super::arp;
use crate::dhcp::{Destination, Reply};

pub const SERVER_PORT: u16 = 67;
pub const CLIENT_PORT: u16 = 68;

/// What arrived, and where.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub len: usize,
    pub src: SocketAddrV4,
    pub ifindex: u32,
    pub dst: Ipv4Addr,
}

pub struct DhcpSocket {
    sock: UdpSocket,
    /// The served interface this socket is bound to; `None` for the relay socket.
    pub device: Option<String>,
}

/// Creates a UDP socket on `port`, bound to `device` if given. Returns the receiving half (read
/// by its own thread, `receive.rs`) and a duplicate for sending from any thread (the store
/// writer sends ACKs after commit). Both stay non-blocking: a full send buffer drops a reply
/// rather than stall the engine or the writer.
pub fn bind(device: Option<&str>, port: u16) -> io::Result<(DhcpSocket, UdpSocket)> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    s.set_broadcast(true)?;
    if let Some(d) = device {
        s.bind_device(Some(d.as_bytes()))?;
    }
    // Room for bursts (about two thousand requests) while the engine is busy, not more: a
    // deeper queue under overload only holds requests whose clients have given up. The send
    // side takes a group commit's worth of ACKs at once.
    let _ = s.set_recv_buffer_size(1 << 20);
    let _ = s.set_send_buffer_size(1 << 20);
    setsockopt(&s, sockopt::Ipv4PacketInfo, &true).map_err(io::Error::from)?;
    s.set_nonblocking(true)?;
    s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into())?;
    let sock: UdpSocket = s.into();
    let sender = sock.try_clone()?;
    Ok((DhcpSocket { sock, device: device.map(str::to_string) }, sender))
}

impl DhcpSocket {
    /// Has the kernel drop, before queueing, whatever arrives on the interfaces `ifindexes`
    /// (a classic BPF socket filter on the interface index). For the relay socket: a broadcast
    /// on a served interface is delivered to every socket bound to port 67, and the served
    /// interface's own socket answers it; without the filter each one would be queued, read
    /// and thrown away here too, and a broadcast flood would fill this socket's buffer and
    /// crowd out relayed requests.
    pub fn ignore_interfaces(&self, ifindexes: &[u32]) -> io::Result<()> {
        let mut program = ignore_program(ifindexes);
        let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_mut_ptr() };
        // SAFETY: SO_ATTACH_FILTER copies the program out of `fprog`, which outlives the call.
        let rc = unsafe {
            libc::setsockopt(
                self.sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&raw const fprog).cast(),
                std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }

    /// Waits up to `timeout` for a datagram; `false` if none came.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        let mut fds = [libc::pollfd { fd: self.sock.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `fds` is a valid array of one pollfd for the duration of the call.
        match unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) } {
            -1 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) }
            }
            n => Ok(n > 0),
        }
    }

    /// Reads what is queued, up to [`RECV_BATCH`] datagrams, in one `recvmmsg` call without
    /// waiting; returns how many (0 when nothing was queued). Under load the receive thread
    /// finds several waiting after each pause, and one call for all of them saves a system
    /// call per datagram and the empty read that used to end each round.
    pub fn recv_batch(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        let RecvBatch { headers, bufs, got } = batch;
        let mut free = bufs.iter_mut();
        let mut slices: [[IoSliceMut<'_>; 1]; RECV_BATCH] =
            std::array::from_fn(|_| [IoSliceMut::new(free.next().expect("one buffer per slot"))]);
        let results = match recvmmsg(self.sock.as_raw_fd(), headers, slices.iter_mut(), MsgFlags::MSG_DONTWAIT, None) {
            Ok(r) => r,
            Err(nix::errno::Errno::EAGAIN) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let mut n = 0;
        for (slot, msg) in got.iter_mut().zip(results) {
            let src = msg
                .address
                .map_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), |a| SocketAddrV4::new(a.ip(), a.port()));
            let (mut ifindex, mut dst) = (0, Ipv4Addr::UNSPECIFIED);
            for c in msg.cmsgs().into_iter().flatten() {
                if let ControlMessageOwned::Ipv4PacketInfo(pi) = c {
                    ifindex = pi.ipi_ifindex as u32;
                    dst = Ipv4Addr::from(u32::from_be(pi.ipi_addr.s_addr));
                }
            }
            *slot = Received { len: msg.bytes.min(DATAGRAM_MAX), src, ifindex, dst };
            n += 1;
        }
        Ok(n)
    }
}

/// Datagrams read in one `recvmmsg` call at most.
pub const RECV_BATCH: usize = 16;

/// The largest datagram read whole; DHCP messages are a few hundred bytes, and a longer one is
/// cut here (and then fails to parse, as any truncated message does).
const DATAGRAM_MAX: usize = 4096;

/// The buffers one receive thread reads into, made once: 64 KiB.
pub struct RecvBatch {
    headers: MultiHeaders<SockaddrIn>,
    bufs: Vec<[u8; DATAGRAM_MAX]>,
    got: [Received; RECV_BATCH],
}

impl Default for RecvBatch {
    fn default() -> RecvBatch {
        let none = Received {
            len: 0,
            src: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            ifindex: 0,
            dst: Ipv4Addr::UNSPECIFIED,
        };
        RecvBatch {
            headers: MultiHeaders::preallocate(RECV_BATCH, Some(nix::cmsg_space!(libc::in_pktinfo))),
            bufs: vec![[0; DATAGRAM_MAX]; RECV_BATCH],
            got: [none; RECV_BATCH],
        }
    }
}

impl RecvBatch {
    /// Datagram `i` of the last [`DhcpSocket::recv_batch`] and where it came from.
    pub fn datagram(&self, i: usize) -> (&[u8], Received) {
        let r = self.got[i];
        (&self.bufs[i][..r.len], r)
    }
}

/// At most this many interfaces in one filter (a jump offset is a byte); more are left to the
/// check in the receive thread.
const MAX_FILTERED_INTERFACES: usize = 200;

/// `ld ifindex; jeq i1 → drop; ...; ret accept; drop: ret 0`.
fn ignore_program(ifindexes: &[u32]) -> Vec<libc::sock_filter> {
    const LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS
    const JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const SKF_AD_IFINDEX: u32 = (-0x1000i32 as u32).wrapping_add(8); // SKF_AD_OFF + SKF_AD_IFINDEX
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let idx = &ifindexes[..ifindexes.len().min(MAX_FILTERED_INTERFACES)];
    let n = idx.len();
    let mut program = vec![op(LD_W_ABS, 0, 0, SKF_AD_IFINDEX)];
    for (i, &ix) in idx.iter().enumerate() {
        // From instruction 1 + i, the drop is at n + 2: jump over the rest and the accept.
        program.push(op(JEQ_K, (n - i) as u8, 0, ix));
    }
    program.push(op(RET_K, 0, 0, u32::MAX));
    program.push(op(RET_K, 0, 0, 0));
    program
}

/// Sends replies on one socket, from whichever thread has one ready.
pub struct ReplySender {
    sock: UdpSocket,
    device: Option<String>,
    /// Cleared after the first EPERM from SIOCSARP: no CAP_NET_ADMIN, broadcast instead.
    arp_allowed: AtomicBool,
    pub sent: AtomicU64,
    pub send_errors: AtomicU64,
}

impl super::engine::Transmit for ReplySender {
    fn transmit(&self, reply: &Reply) -> bool {
        self.send(reply)
    }
}

impl ReplySender {
    pub fn new(sock: UdpSocket, device: Option<String>) -> ReplySender {
        ReplySender {
            sock,
            device,
            arp_allowed: AtomicBool::new(true),
            sent: AtomicU64::new(0),
            send_errors: AtomicU64::new(0),
        }
    }

    /// Sends `reply`; `false` if the kernel refused it (counted, logged at debug).
    pub fn send(&self, reply: &Reply) -> bool {
        let to = match reply.dest {
            Destination::Relay(giaddr) => SocketAddrV4::new(giaddr, SERVER_PORT),
            Destination::Unicast(ciaddr) => SocketAddrV4::new(ciaddr, CLIENT_PORT),
            Destination::Broadcast => SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT),
            Destination::Hardware { addr, hw } => {
                if self.install_neighbour(addr, hw) {
                    SocketAddrV4::new(addr, CLIENT_PORT)
                } else {
                    SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT)
                }
            }
        };
        match self.sock.send_to(&reply.bytes, to) {
            Ok(_) => {
                self.sent.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                self.send_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%to, error = %e, "reply not sent");
                false
            }
        }
    }

    fn install_neighbour(&self, addr: Ipv4Addr, hw: [u8; 6]) -> bool {
        let Some(dev) = &self.device else { return false };
        if !self.arp_allowed.load(Ordering::Relaxed) {
            return false;
        }
        match arp::install(self.sock.as_raw_fd(), dev, addr, hw) {
            Ok(()) => true,
            Err(e) => {
                if e.raw_os_error() == Some(libc::EPERM) {
                    self.arp_allowed.store(false, Ordering::Relaxed);
                    tracing::warn!(interface = %dev, "no CAP_NET_ADMIN to install ARP entries; replies to clients without an address are broadcast");
                } else {
                    tracing::debug!(interface = %dev, error = %e, "ARP entry not installed; broadcasting");
                }
                false
            }
        }
    }
}
