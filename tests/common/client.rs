//! A scripted DHCP client: DISCOVER/REQUEST/DECLINE built by hand, for tests that need to see
//! exactly which request got which answer.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};

use super::Netns;

/// A scripted DHCP client on a namespace's interface: broadcasts its requests and asks for
/// broadcast replies (it has no address), with a fixed hardware address.
pub struct RawClient {
    pub sock: UdpSocket,
    pub hw: [u8; 6],
}

/// A client-port socket on `ns`'s `iface` that may broadcast.
pub fn client_socket(ns: &Netns, iface: &str) -> UdpSocket {
    let iface = iface.to_string();
    ns.within(move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        s.set_reuse_address(true).unwrap();
        s.set_broadcast(true).unwrap();
        s.bind_device(Some(iface.as_bytes())).unwrap();
        s.bind(&SocketAddr::from(([0, 0, 0, 0], 68)).into()).unwrap();
        UdpSocket::from(s)
    })
}

impl RawClient {
    pub fn new(ns: &Netns, iface: &str, hw: [u8; 6]) -> RawClient {
        let sock = client_socket(ns, iface);
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        RawClient { sock, hw }
    }

    pub fn request(&self, kind: MessageType, opts: Vec<DhcpOption>, xid: u32) -> Vec<u8> {
        let z = Ipv4Addr::UNSPECIFIED;
        let mut m = Message::new_with_id(xid, z, z, z, z, &self.hw);
        m.set_flags(Flags::default().set_broadcast());
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        for o in opts {
            m.opts_mut().insert(o);
        }
        let mut buf = Vec::new();
        m.encode(&mut Encoder::new(&mut buf)).unwrap();
        buf
    }

    pub fn send(&self, bytes: &[u8]) {
        self.sock.send_to(bytes, SocketAddr::from(([255, 255, 255, 255], 67))).unwrap();
    }

    /// Sends and waits for the reply of type `want` to `xid`.
    pub fn exchange(&self, bytes: &[u8], xid: u32, want: MessageType) -> Option<Message> {
        self.exchange_within(bytes, xid, want, Duration::from_secs(3))
    }

    /// Like [`Self::exchange`], waiting at most `limit`.
    pub fn exchange_within(&self, bytes: &[u8], xid: u32, want: MessageType, limit: Duration) -> Option<Message> {
        self.send(bytes);
        let deadline = Instant::now() + limit;
        let mut buf = [0u8; 1500];
        while Instant::now() < deadline {
            let Ok(n) = self.sock.recv(&mut buf) else { continue };
            let Ok(m) = Message::decode(&mut Decoder::new(&buf[..n])) else { continue };
            if m.xid() == xid && m.opts().msg_type() == Some(want) {
                return Some(m);
            }
        }
        None
    }

    /// DISCOVER, REQUEST: the address ACKed and the server's identifier.
    pub fn dora(&self, xid: u32) -> (Ipv4Addr, Ipv4Addr) {
        let offer = self
            .exchange(&self.request(MessageType::Discover, vec![], xid), xid, MessageType::Offer)
            .expect("an OFFER");
        let Some(DhcpOption::ServerIdentifier(server)) =
            offer.opts().get(dhcproto::v4::OptionCode::ServerIdentifier).cloned()
        else {
            panic!("no server id")
        };
        let opts = vec![DhcpOption::RequestedIpAddress(offer.yiaddr()), DhcpOption::ServerIdentifier(server)];
        let ack = self.exchange(&self.request(MessageType::Request, opts, xid), xid, MessageType::Ack).expect("an ACK");
        (ack.yiaddr(), server)
    }

    pub fn decline(&self, addr: Ipv4Addr, server: Ipv4Addr, xid: u32) {
        let opts = vec![DhcpOption::RequestedIpAddress(addr), DhcpOption::ServerIdentifier(server)];
        self.send(&self.request(MessageType::Decline, opts, xid));
    }
}

/// What one probe got: a new client's DISCOVER and REQUEST.
#[derive(Debug, Clone)]
pub struct Probe {
    /// When its DISCOVER left.
    pub at: std::time::SystemTime,
    /// The server that ACKed (its identifier), None if the exchange was not completed.
    pub served_by: Option<Ipv4Addr>,
}

/// New clients, one every `period` whatever became of the earlier ones, each doing
/// DISCOVER/OFFER/REQUEST/ACK with `limit` per answer, until stopped (bounded by `max`
/// probes). Hardware addresses cycle through `macs` distinct ones, so the pool never runs dry;
/// the transaction id tells the answers apart.
pub struct Prober {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Probe>>>,
}

/// One probe in flight: where it is, and since when.
struct InFlight {
    index: usize,
    hw: [u8; 6],
    offered: bool,
    since: Instant,
}

impl Prober {
    pub fn start(ns: &Netns, iface: &str, period: Duration, limit: Duration, macs: u8, max: usize) -> Prober {
        let mut c = RawClient::new(ns, iface, [0x02, 0x77, 0, 0, 0, 0]);
        c.sock.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out: Vec<Probe> = Vec::new();
            let mut flying: std::collections::HashMap<u32, InFlight> = std::collections::HashMap::new();
            let mut next = Instant::now();
            let base = 0x5a00_0000u32 ^ (std::process::id() << 8);
            let mut buf = [0u8; 1500];
            loop {
                let stopping = flag.load(std::sync::atomic::Ordering::Relaxed) || out.len() >= max;
                if stopping && flying.is_empty() {
                    return out;
                }
                if !stopping && Instant::now() >= next {
                    let index = out.len();
                    let xid = base.wrapping_add(index as u32);
                    c.hw[5] = (index % usize::from(macs.max(1))) as u8;
                    c.send(&c.request(MessageType::Discover, vec![], xid));
                    out.push(Probe { at: std::time::SystemTime::now(), served_by: None });
                    flying.insert(xid, InFlight { index, hw: c.hw, offered: false, since: Instant::now() });
                    next += period;
                }
                flying.retain(|_, f| f.since.elapsed() < limit);
                let Ok(n) = c.sock.recv(&mut buf) else { continue };
                let Ok(m) = Message::decode(&mut Decoder::new(&buf[..n])) else { continue };
                let Some(f) = flying.get_mut(&m.xid()) else { continue };
                let server = match m.opts().get(dhcproto::v4::OptionCode::ServerIdentifier) {
                    Some(DhcpOption::ServerIdentifier(s)) => *s,
                    _ => continue,
                };
                match m.opts().msg_type() {
                    Some(MessageType::Offer) if !f.offered => {
                        f.offered = true;
                        f.since = Instant::now();
                        c.hw = f.hw;
                        let opts =
                            vec![DhcpOption::RequestedIpAddress(m.yiaddr()), DhcpOption::ServerIdentifier(server)];
                        c.send(&c.request(MessageType::Request, opts, m.xid()));
                    }
                    Some(MessageType::Ack) if f.offered => {
                        out[f.index].served_by = Some(server);
                        flying.remove(&m.xid());
                    }
                    _ => {}
                }
            }
        });
        Prober { stop, thread: Some(thread) }
    }

    pub fn stop(mut self) -> Vec<Probe> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl RawClient {
    /// DISCOVER then REQUEST, each answered within `limit`: the server that ACKed, if one did.
    pub fn dora_within(&self, xid: u32, limit: Duration) -> Option<Ipv4Addr> {
        let offer =
            self.exchange_within(&self.request(MessageType::Discover, vec![], xid), xid, MessageType::Offer, limit)?;
        let Some(DhcpOption::ServerIdentifier(server)) =
            offer.opts().get(dhcproto::v4::OptionCode::ServerIdentifier).cloned()
        else {
            return None;
        };
        let opts = vec![DhcpOption::RequestedIpAddress(offer.yiaddr()), DhcpOption::ServerIdentifier(server)];
        let ack = self.exchange_within(&self.request(MessageType::Request, opts, xid), xid, MessageType::Ack, limit)?;
        let Some(DhcpOption::ServerIdentifier(by)) =
            ack.opts().get(dhcproto::v4::OptionCode::ServerIdentifier).cloned()
        else {
            return Some(server);
        };
        Some(by)
    }
}

/// One exchange as a client that retransmits every second sees it.
#[derive(Debug, Clone)]
pub struct Waited {
    /// What was asked: "discover", "request" (a new client's) or "renew".
    pub kind: &'static str,
    /// When the first transmission left.
    pub at: Instant,
    /// From the first transmission to the answer (or to giving up).
    pub waited: Duration,
    /// The answer's type and its server's identifier; None if nothing came.
    pub answer: Option<(MessageType, Ipv4Addr)>,
}

impl RawClient {
    /// Sends `bytes` every second until a reply to `xid` of type `want` or a NAK comes, or
    /// `give_up` passes.
    pub fn exchange_retrying(
        &self,
        kind: &'static str,
        bytes: &[u8],
        xid: u32,
        want: MessageType,
        give_up: Duration,
    ) -> (Waited, Option<Message>) {
        let at = Instant::now();
        let mut buf = [0u8; 1500];
        let mut sent = 0;
        while at.elapsed() < give_up {
            if at.elapsed() >= Duration::from_secs(sent) {
                self.send(bytes);
                sent += 1;
            }
            let Ok(n) = self.sock.recv(&mut buf) else { continue };
            let Ok(m) = Message::decode(&mut Decoder::new(&buf[..n])) else { continue };
            let kind_of = m.opts().msg_type();
            if m.xid() != xid || !(kind_of == Some(want) || kind_of == Some(MessageType::Nak)) {
                continue;
            }
            let server = match m.opts().get(dhcproto::v4::OptionCode::ServerIdentifier) {
                Some(DhcpOption::ServerIdentifier(s)) => *s,
                _ => Ipv4Addr::UNSPECIFIED,
            };
            let w = Waited { kind, at, waited: at.elapsed(), answer: Some((kind_of.unwrap(), server)) };
            return (w, Some(m));
        }
        (Waited { kind, at, waited: at.elapsed(), answer: None }, None)
    }

    /// A RELEASE of `addr` to `server` (broadcast: the client has no address of its own here).
    pub fn release(&self, addr: Ipv4Addr, server: Ipv4Addr, xid: u32) {
        let z = Ipv4Addr::UNSPECIFIED;
        let mut m = Message::new_with_id(xid, addr, z, z, z, &self.hw);
        m.opts_mut().insert(DhcpOption::MessageType(MessageType::Release));
        m.opts_mut().insert(DhcpOption::ServerIdentifier(server));
        let mut buf = Vec::new();
        m.encode(&mut Encoder::new(&mut buf)).unwrap();
        self.send(&buf);
    }
}
