//! Building replies: header fields, options in the client's order of preference within its
//! size limit, and where the reply goes (RFC 2131 §4.1).

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode};
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

/// Encoded size of one option (code, length, data; long options split into 255-byte parts).
fn encoded_len(opt: &DhcpOption) -> usize {
    let mut buf = Vec::new();
    let _ = opt.encode(&mut Encoder::new(&mut buf));
    buf.len()
}

/// Builds a reply of `kind` to `req`.
pub fn build(req: &Request, kind: MessageType, yiaddr: Ipv4Addr, server_id: Ipv4Addr, subnet: Option<&Subnet>, times: Option<LeaseTimes>) -> Vec<u8> {
    let r = &req.msg;
    let mut m = Message::default();
    m.set_opcode(Opcode::BootReply)
        .set_htype(r.htype())
        .set_chaddr(&req.hw)
        .set_xid(r.xid())
        .set_giaddr(r.giaddr())
        .set_yiaddr(yiaddr);
    // ciaddr is echoed only in an ACK to a client that already has its address.
    if kind == MessageType::Ack {
        m.set_ciaddr(r.ciaddr());
    }
    let mut flags = r.flags();
    if kind == MessageType::Nak && !r.giaddr().is_unspecified() {
        flags = flags.set_broadcast(); // the relay must broadcast a NAK (RFC 2131 §4.3.2)
    }
    m.set_flags(Flags::new(u16::from(flags)));

    let opts = m.opts_mut();
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
        let requested: Vec<OptionCode> = match r.opts().get(OptionCode::ParameterRequestList) {
            Some(DhcpOption::ParameterRequestList(list)) => list.clone(),
            _ => DEFAULT_PARAMS.to_vec(),
        };
        // The client's order is its priority: fill in that order, skip what does not fit.
        for code in requested {
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

    let mut out = Vec::with_capacity(576);
    m.encode(&mut Encoder::new(&mut out)).expect("encoding into a Vec cannot fail");
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
