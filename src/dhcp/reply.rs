//! Building replies: header fields, options in the client's order of preference within its
//! size limit, and where the reply goes (RFC 2131 §4.1).

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, DhcpOptions, HType, MessageType, OptionCode};
use dhcproto::{Encodable, Encoder};

use super::inbound::Request;
use crate::config::Subnet;

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

/// The options we can supply for `subnet`, by code.
fn subnet_option(code: OptionCode, s: &Subnet) -> Option<DhcpOption> {
    Some(match code {
        OptionCode::SubnetMask => DhcpOption::SubnetMask(s.net.netmask()),
        OptionCode::Router if !s.routers.is_empty() => DhcpOption::Router(s.routers.clone()),
        OptionCode::DomainNameServer if !s.dns_servers.is_empty() => DhcpOption::DomainNameServer(s.dns_servers.clone()),
        OptionCode::DomainName => DhcpOption::DomainName(s.domain_name.clone()?),
        OptionCode::BroadcastAddr => DhcpOption::BroadcastAddr(s.net.broadcast()),
        OptionCode::NtpServers if !s.ntp_servers.is_empty() => DhcpOption::NtpServers(s.ntp_servers.clone()),
        _ => return None,
    })
}

/// What we send when the client gives no parameter request list.
const DEFAULT_PARAMS: [OptionCode; 6] = [
    OptionCode::SubnetMask,
    OptionCode::Router,
    OptionCode::DomainNameServer,
    OptionCode::DomainName,
    OptionCode::BroadcastAddr,
    OptionCode::NtpServers,
];

/// Encoded size of one option (code, length, data). Computed for the options we send; the
/// rare others are measured by encoding them.
fn encoded_len(opt: &DhcpOption) -> usize {
    let data = match opt {
        DhcpOption::SubnetMask(_) | DhcpOption::BroadcastAddr(_) | DhcpOption::ServerIdentifier(_) => 4,
        DhcpOption::AddressLeaseTime(_) | DhcpOption::Renewal(_) | DhcpOption::Rebinding(_) => 4,
        DhcpOption::MessageType(_) => 1,
        DhcpOption::Router(v) | DhcpOption::DomainNameServer(v) | DhcpOption::NtpServers(v) => 4 * v.len(),
        DhcpOption::DomainName(n) => n.len(),
        DhcpOption::ClientIdentifier(id) => id.len(),
        other => {
            let mut buf = Vec::new();
            let _ = other.encode(&mut Encoder::new(&mut buf));
            return buf.len();
        }
    };
    // Options longer than 255 bytes are split into several (RFC 3396), each with its own header.
    data + 2 * data.div_ceil(255).max(1)
}

/// Builds a reply of `kind` to `req`. The fixed BOOTP header is written here; dhcproto encodes
/// the options.
pub fn build(req: &Request, kind: MessageType, yiaddr: Ipv4Addr, server_id: Ipv4Addr, subnet: Option<&Subnet>, times: Option<LeaseTimes>) -> Vec<u8> {
    let r = &req.msg;
    let mut opts = DhcpOptions::new();
    opts.insert(DhcpOption::MessageType(kind));
    opts.insert(DhcpOption::ServerIdentifier(server_id));
    if let Some(t) = times {
        opts.insert(DhcpOption::AddressLeaseTime(t.lease));
        opts.insert(DhcpOption::Renewal(t.renew));
        opts.insert(DhcpOption::Rebinding(t.rebind));
    }
    if let Some(id) = &req.client_id {
        opts.insert(DhcpOption::ClientIdentifier(id.clone())); // RFC 6842
    }

    // Fixed header (236) + cookie (4) + what is in so far + End (1) + option 82 echo.
    let mut size = 240 + 1 + req.relay_info.as_ref().map_or(0, Vec::len);
    size += opts.iter().map(|(_, o)| encoded_len(o)).sum::<usize>();
    if kind != MessageType::Nak
        && let Some(s) = subnet
    {
        let requested: &[OptionCode] = match r.opts().get(OptionCode::ParameterRequestList) {
            Some(DhcpOption::ParameterRequestList(list)) => list,
            _ => &DEFAULT_PARAMS,
        };
        // The client's order is its priority: fill in that order, skip what does not fit.
        for &code in requested {
            if opts.get(code).is_some() {
                continue;
            }
            if let Some(opt) = subnet_option(code, s) {
                let len = encoded_len(&opt);
                if size + len <= req.max_reply {
                    size += len;
                    opts.insert(opt);
                }
            }
        }
    }

    let mut flags = u16::from(r.flags());
    if kind == MessageType::Nak && !r.giaddr().is_unspecified() {
        flags |= 0x8000; // the relay must broadcast a NAK (RFC 2131 §4.3.2)
    }
    // ciaddr is echoed only in an ACK to a client that already has its address.
    let ciaddr = if kind == MessageType::Ack { r.ciaddr() } else { Ipv4Addr::UNSPECIFIED };
    let mut out = Vec::with_capacity(size.max(300) + 8);
    out.extend_from_slice(&[2, u8::from(r.htype()), req.hw.len() as u8, 0]);
    out.extend_from_slice(&r.xid().to_be_bytes());
    out.extend_from_slice(&[0, 0]); // secs
    out.extend_from_slice(&flags.to_be_bytes());
    for a in [ciaddr, yiaddr, Ipv4Addr::UNSPECIFIED, r.giaddr()] {
        out.extend_from_slice(&a.octets());
    }
    let mut chaddr = [0u8; 16];
    chaddr[..req.hw.len()].copy_from_slice(&req.hw);
    out.extend_from_slice(&chaddr);
    out.resize(236, 0); // sname and file: empty
    out.extend_from_slice(&[99, 130, 83, 99]);
    // dhcproto's Encoder writes from the start of its buffer, so the options get their own.
    let mut encoded = Vec::with_capacity(size);
    opts.encode(&mut Encoder::new(&mut encoded)).expect("encoding into a Vec cannot fail");
    out.extend_from_slice(&encoded);
    if let Some(raw82) = &req.relay_info {
        // dhcproto ends with End (255); put the relay's option 82 back verbatim just before it.
        out.pop();
        out.extend_from_slice(raw82);
        out.push(255);
    }
    // Some relays and clients drop BOOTP messages shorter than 300 bytes.
    if out.len() < 300 {
        out.resize(300, 0);
    }
    out
}
