//! Building replies: header fields, options in the client's order of preference within its
//! size limit, and where the reply goes (RFC 2131 §4.1).

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, HType, MessageType, OptionCode};

use super::encode;
use super::inbound::Request;
use crate::config::{Class, ClassSet, OptionSet, OptionValue};

/// Where a reply is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// To the relay agent's giaddr, port 67.
    Relay(Ipv4Addr),
    /// To the client's ciaddr, port 68.
    Unicast(Ipv4Addr),
    /// To 255.255.255.255:68 on the interface the request came in on.
    Broadcast,
    /// To the new address, port 68; the client cannot answer ARP yet, so the driver installs a
    /// neighbour entry for `hw` first (as dnsmasq does) or falls back to broadcast.
    Hardware { addr: Ipv4Addr, hw: [u8; 6] },
}

/// RFC 2131 §4.1: giaddr → relay; ciaddr → unicast; broadcast bit → broadcast; otherwise
/// unicast to the hardware address. A NAK to a directly attached client is always broadcast.
pub fn destination(req: &Request, kind: MessageType, yiaddr: Ipv4Addr) -> Destination {
    let m = &req.msg;
    if !m.giaddr().is_unspecified() {
        return Destination::Relay(m.giaddr());
    }
    if kind == MessageType::Nak {
        return Destination::Broadcast;
    }
    if !m.ciaddr().is_unspecified() {
        return Destination::Unicast(m.ciaddr());
    }
    if m.flags().broadcast() || yiaddr.is_unspecified() {
        return Destination::Broadcast;
    }
    match (m.htype(), <[u8; 6]>::try_from(req.hw.as_slice())) {
        (HType::Eth, Ok(hw)) => Destination::Hardware { addr: yiaddr, hw },
        _ => Destination::Broadcast,
    }
}

/// Lease timing to put in a reply.
#[derive(Debug, Clone, Copy)]
pub struct LeaseTimes {
    pub lease: u32,
    pub renew: u32,
    pub rebind: u32,
}

/// The options that apply to one reply, most specific level first: the client's reservation,
/// its classes (in file order), the pool of its address, the subnet, then the global ones.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub reservation: Option<&'a OptionSet>,
    pub classes: ClassSet,
    pub all_classes: &'a [Class],
    pub pool: Option<&'a OptionSet>,
    pub subnet: Option<&'a OptionSet>,
    pub global: &'a OptionSet,
}

impl<'a> Scope<'a> {
    /// The levels, most specific first.
    pub fn levels(&self) -> impl Iterator<Item = &'a OptionSet> + 'a {
        let (classes, all) = (self.classes, self.all_classes);
        self.reservation
            .into_iter()
            .chain(classes.iter().filter_map(move |i| all.get(i).map(|c| &c.options)))
            .chain(self.pool)
            .chain(self.subnet)
            .chain(std::iter::once(self.global))
    }

    /// The value of `code` from the most specific level that sets it.
    pub fn get(&self, code: u8) -> Option<&'a OptionValue> {
        self.levels().find_map(|l| l.get(code))
    }

    /// Option 125's data: for each enterprise, the block of the most specific level that has
    /// one (RFC 3925 §4: enterprise number, length, sub-options), in order of appearance.
    fn vendor_identifying(&self) -> Vec<u8> {
        let mut seen: Vec<u32> = Vec::new();
        let mut out = Vec::new();
        for level in self.levels() {
            for b in level.vendor_blocks() {
                let Some(e) = b.enterprise else { continue };
                if seen.contains(&e) {
                    continue;
                }
                seen.push(e);
                out.extend_from_slice(&e.to_be_bytes());
                out.push(b.data.len() as u8);
                out.extend_from_slice(&b.data);
            }
        }
        out
    }

    fn header<T>(&self, field: impl Fn(&'a OptionSet) -> Option<T>) -> Option<T> {
        self.levels().find_map(field)
    }
}

/// What we send when the client gives no parameter request list.
const DEFAULT_PARAMS: [u8; 6] = [1, 3, 6, 15, 28, 42];

/// Options written by the reply itself, never looked up in the configuration.
fn written_here(code: u8) -> bool {
    matches!(code, 0 | 51 | 52 | 53 | 54 | 58 | 59 | 61 | 82 | 255)
}

/// The options every reply carries, in this order: message type, server identifier, lease
/// times (OFFER and ACK) and the client identifier echoed (RFC 6842).
fn fixed_options(req: &Request, kind: MessageType, server_id: Ipv4Addr, times: Option<LeaseTimes>) -> Vec<u8> {
    let mut fixed = Vec::with_capacity(64);
    encode::put(&mut fixed, 53, &[u8::from(kind)]);
    encode::put(&mut fixed, 54, &server_id.octets());
    if let Some(t) = times {
        encode::put(&mut fixed, 51, &t.lease.to_be_bytes());
        encode::put(&mut fixed, 58, &t.renew.to_be_bytes());
        encode::put(&mut fixed, 59, &t.rebind.to_be_bytes());
    }
    if let Some(id) = &req.client_id {
        encode::put(&mut fixed, 61, id);
    }
    fixed
}

/// The configured options to offer, highest priority first: those the client asks for in its
/// order (the defaults without a list), then the always-send ones, each code once. `vivso`
/// holds option 125's joined blocks when it is wanted.
fn wanted<'a>(req: &Request, s: &Scope<'a>, vivso: &'a mut Vec<u8>) -> Vec<(u8, &'a [u8])> {
    let requested: &[OptionCode] = match req.msg.opts().get(OptionCode::ParameterRequestList) {
        Some(DhcpOption::ParameterRequestList(list)) => list,
        _ => &[],
    };
    let defaults = DEFAULT_PARAMS.iter().copied().filter(|_| requested.is_empty());
    let asked = requested.iter().map(|c| u8::from(*c)).chain(defaults);
    let always = s.levels().flat_map(|l| l.iter()).filter(|o| o.always_send).map(|o| o.code);
    if asked.clone().any(|c| c == 125) || s.levels().any(|l| l.vendor_blocks().iter().any(|b| b.always_send)) {
        *vivso = s.vendor_identifying();
    }
    let vivso: &'a [u8] = vivso;
    let mut items = Vec::new();
    let mut sent = [0u64; 4];
    for code in asked.chain(always) {
        let bit = 1u64 << (code % 64);
        if written_here(code) || sent[usize::from(code / 64)] & bit != 0 {
            continue;
        }
        sent[usize::from(code / 64)] |= bit;
        if code == 125 {
            if !vivso.is_empty() {
                items.push((125, vivso));
            }
        } else if let Some(v) = s.get(code) {
            items.push((code, &v.data[..]));
        }
    }
    items
}

/// Writes `text` (cut to fit, NUL-padded) or the overloaded options into a header field.
fn header_field(out: &mut Vec<u8>, overloaded: Option<&[u8]>, text: Option<&str>, len: usize) {
    let start = out.len();
    match (overloaded, text) {
        (Some(bytes), _) => out.extend_from_slice(bytes),
        (None, Some(t)) => out.extend_from_slice(&t.as_bytes()[..t.len().min(len - 1)]),
        (None, None) => {}
    }
    // Padded by copying from a block of zeroes rather than with `resize`, which at the shipped
    // opt-level ("z") stored the zeroes one at a time. Both fields fit in it (SNAME_LEN < FILE_LEN).
    let pad = start + len - out.len();
    out.extend_from_slice(&[0u8; encode::FILE_LEN][..pad]);
}

/// Builds a reply of `kind` to `req`: the fixed BOOTP header, the options the reply always
/// carries, then from `scope` the options the client asked for (in its order of priority)
/// and those configured with `always_send`, within the client's size limit.
pub fn build(
    req: &Request,
    kind: MessageType,
    yiaddr: Ipv4Addr,
    server_id: Ipv4Addr,
    scope: Option<&Scope>,
    times: Option<LeaseTimes>,
) -> Vec<u8> {
    let r = &req.msg;
    let fixed = fixed_options(req, kind, server_id, times);
    let relay = req.relay_info.as_deref().unwrap_or(&[]);
    let scope = scope.filter(|_| kind != MessageType::Nak);
    let (next_server, boot_file, server_name) = match scope {
        Some(s) => {
            (s.header(|l| l.next_server), s.header(|l| l.boot_file.as_deref()), s.header(|l| l.server_name.as_deref()))
        }
        None => (None, None, None),
    };
    let mut vivso = Vec::new();
    let items = scope.map(|s| wanted(req, s, &mut vivso)).unwrap_or_default();
    // Fixed header (236) + cookie (4) + fixed options + relay's option 82 + End (1).
    let room = req.max_reply.saturating_sub(240 + fixed.len() + relay.len() + 1);
    let packed = encode::pack(&items, room, boot_file.is_none(), server_name.is_none());

    let mut flags = u16::from(r.flags());
    if kind == MessageType::Nak && !r.giaddr().is_unspecified() {
        flags |= 0x8000; // the relay must broadcast a NAK (RFC 2131 §4.3.2)
    }
    // ciaddr is echoed only in an ACK to a client that already has its address.
    let ciaddr = if kind == MessageType::Ack { r.ciaddr() } else { Ipv4Addr::UNSPECIFIED };
    let siaddr = next_server.unwrap_or(Ipv4Addr::UNSPECIFIED);
    let mut out = Vec::with_capacity(300.max(240 + fixed.len() + packed.main.len() + relay.len() + 1));
    out.extend_from_slice(&[2, u8::from(r.htype()), req.hw.len() as u8, 0]);
    out.extend_from_slice(&r.xid().to_be_bytes());
    out.extend_from_slice(&[0, 0]); // secs
    out.extend_from_slice(&flags.to_be_bytes());
    for a in [ciaddr, yiaddr, siaddr, r.giaddr()] {
        out.extend_from_slice(&a.octets());
    }
    let mut chaddr = [0u8; 16];
    chaddr[..req.hw.len()].copy_from_slice(&req.hw);
    out.extend_from_slice(&chaddr);
    header_field(&mut out, packed.sname.as_ref().map(|a| &a[..]), server_name, encode::SNAME_LEN);
    header_field(&mut out, packed.file.as_ref().map(|a| &a[..]), boot_file, encode::FILE_LEN);
    out.extend_from_slice(&[99, 130, 83, 99]);
    out.extend_from_slice(&fixed);
    out.extend_from_slice(&packed.main);
    // The relay's option 82 goes back verbatim, last before End.
    out.extend_from_slice(relay);
    out.push(255);
    // Some relays and clients drop BOOTP messages shorter than 300 bytes.
    if out.len() < 300 {
        out.resize(300, 0);
    }
    out
}
