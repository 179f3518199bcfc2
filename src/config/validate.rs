//! Turns the wire structs into validated types. Every rejection points at the value that caused
//! it (file, line, column) and says what to change.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::ops::Range;
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;
use toml::Spanned;

use super::wire::{self, ConfigFile};
use super::{AddrRange, Config, ConfigError, Dhcp, LocalAddrs, Node, Peer, Reservation, Subnet};

/// Where we are in the file, to turn byte spans into line and column.
struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    fn err(&self, span: Range<usize>, message: impl Into<String>, hint: impl Into<String>) -> ConfigError {
        let offset = span.start.min(self.text.len());
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            line,
            column,
            message: message.into(),
            hint: hint.into(),
        }
    }
}

/// A value's span, or the enclosing section's when the value was defaulted (span 0..0).
fn at<T>(v: &Spanned<T>, section: &Range<usize>) -> Range<usize> {
    let s = v.span();
    if s == (0..0) { section.clone() } else { s }
}

pub(super) fn parse(path: &Path, text: &str, local: &LocalAddrs) -> Result<Config, ConfigError> {
    let src = Source { path, text };
    let file: ConfigFile = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        let message = e.message().trim().to_string();
        let hint = if message.contains("unknown field") {
            "remove or rename this key; config/twinlease.example.toml lists every valid key"
        } else if message.contains("missing field") {
            "add the missing key to this section"
        } else {
            "correct the value or TOML syntax at this position"
        };
        src.err(span, message, hint)
    })?;

    let node = node(&src, &file.node)?;
    let dhcp = dhcp(&src, &file.dhcp)?;
    if file.subnet.is_empty() {
        return Err(src.err(0..0, "no [[subnet]] is configured", "add a [[subnet]] section with a cidr and pools"));
    }
    let mut subnets = Vec::new();
    for s in &file.subnet {
        let subnet = subnet(&src, s, local)?;
        if let Some(other) = subnets.iter().find(|o: &&Subnet| o.net.contains(&subnet.net.network()) || subnet.net.contains(&o.net.network())) {
            return Err(src.err(
                s.get_ref().cidr.span(),
                format!("subnet {} overlaps subnet {}", subnet.net, other.net),
                "give each [[subnet]] a distinct, non-overlapping cidr",
            ));
        }
        for p in &subnet.pools {
            for o in &subnets {
                if let Some(q) = o.pools.iter().find(|q| q.overlaps(p)) {
                    return Err(src.err(s.span(), format!("pool {p} overlaps pool {q}"), "make the pools disjoint"));
                }
            }
        }
        subnets.push(subnet);
    }
    let reservations = reservations(&src, &file.reservation, &subnets, local, dhcp.on_alias_busy)?;

    Ok(Config {
        path: path.to_path_buf(),
        node,
        dhcp,
        subnets,
        reservations,
        log_filter: file.log.filter,
        peer: match &file.peer {
            Some(p) => Some(peer(&src, p)?),
            None => None,
        },
    })
}

fn node(src: &Source, n: &Spanned<wire::NodeSection>) -> Result<Node, ConfigError> {
    let name = n.get_ref().name.get_ref();
    if name.is_empty() || name.len() > 63 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
        return Err(src.err(
            n.get_ref().name.span(),
            format!("node name {name:?} is not a valid identity"),
            "use 1-63 letters, digits, '.', '_' or '-', different on each box of a pair",
        ));
    }
    let dir = n.get_ref().state_dir.get_ref();
    if !dir.starts_with('/') {
        return Err(src.err(at(&n.get_ref().state_dir, &n.span()), format!("state_dir {dir:?} is not an absolute path"), "use an absolute path such as /var/lib/twinlease"));
    }
    Ok(Node { name: name.clone(), state_dir: PathBuf::from(dir) })
}

fn dhcp(src: &Source, d: &Spanned<wire::DhcpSection>) -> Result<Dhcp, ConfigError> {
    let sec = d.span();
    let w = d.get_ref();
    let mut interfaces: Vec<String> = Vec::new();
    for i in &w.interfaces {
        let name = i.get_ref();
        if name.is_empty() || name.len() > 15 || name.contains(['/', ' ', '\0']) {
            return Err(src.err(i.span(), format!("{name:?} is not a valid interface name"), "use the kernel's name of the interface, at most 15 characters (see `ip link`)"));
        }
        if interfaces.contains(name) {
            return Err(src.err(i.span(), format!("interface {name} is listed twice"), "list each interface once"));
        }
        interfaces.push(name.clone());
    }
    if interfaces.is_empty() && !w.listen_relayed {
        return Err(src.err(sec, "nothing to listen on: no interfaces and listen_relayed = false", "list the LAN interfaces in [dhcp] interfaces, or set listen_relayed = true"));
    }
    let bounded = |v: &Spanned<u64>, lo: u64, hi: u64, what: &str| {
        let x = *v.get_ref();
        if x < lo || x > hi {
            Err(src.err(at(v, &sec), format!("{what} = {x} is out of range"), format!("use a value from {lo} to {hi}")))
        } else {
            Ok(x)
        }
    };
    Ok(Dhcp {
        interfaces,
        listen_relayed: w.listen_relayed,
        offer_hold_secs: bounded(&w.offer_hold_secs, 1, 3600, "offer_hold_secs")?,
        decline_probation_secs: bounded(&w.decline_probation_secs, 0, 7 * 86400, "decline_probation_secs")?,
        affinity_hold_secs: bounded(&w.affinity_hold_secs, 0, 30 * 86400, "affinity_hold_secs")?,
        ping_check: w.ping_check,
        ping_timeout_ms: bounded(&w.ping_timeout_ms, 50, 5000, "ping_timeout_ms")?,
        on_alias_busy: w.on_alias_busy,
    })
}

fn ipv4(src: &Source, v: &Spanned<String>, what: &str) -> Result<Ipv4Addr, ConfigError> {
    v.get_ref().trim().parse().map_err(|_| {
        src.err(v.span(), format!("{what} {:?} is not an IPv4 address", v.get_ref()), "write a dotted-quad address such as 198.18.0.1")
    })
}

/// Parses "a.b.c.d", "a.b.c.d-e.f.g.h" or "a.b.c.d/nn" into an inclusive range.
fn range(src: &Source, v: &Spanned<String>, what: &str) -> Result<AddrRange, ConfigError> {
    let text = v.get_ref().trim();
    let bad = || src.err(v.span(), format!("{what} {text:?} is not an address range"), "write first-last (198.18.0.100-198.18.0.199), a cidr, or one address");
    let r = if let Some((a, b)) = text.split_once('-') {
        let first: Ipv4Addr = a.trim().parse().map_err(|_| bad())?;
        let last: Ipv4Addr = b.trim().parse().map_err(|_| bad())?;
        AddrRange { first, last }
    } else if text.contains('/') {
        let net: Ipv4Net = text.parse().map_err(|_| bad())?;
        AddrRange { first: net.network(), last: net.broadcast() }
    } else {
        let a: Ipv4Addr = text.parse().map_err(|_| bad())?;
        AddrRange { first: a, last: a }
    };
    if r.first > r.last {
        return Err(src.err(v.span(), format!("{what} {text} runs backwards"), "put the lower address first"));
    }
    Ok(r)
}

fn subnet(src: &Source, s: &Spanned<wire::SubnetSection>, local: &LocalAddrs) -> Result<Subnet, ConfigError> {
    let sec = s.span();
    let w = s.get_ref();
    let net: Ipv4Net = w.cidr.get_ref().trim().parse().map_err(|_| {
        src.err(w.cidr.span(), format!("cidr {:?} is not an IPv4 network", w.cidr.get_ref()), "write it as address/prefix, e.g. 198.18.0.0/24")
    })?;
    if net.trunc() != net {
        return Err(src.err(w.cidr.span(), format!("cidr {net} has host bits set"), format!("did you mean {}?", net.trunc())));
    }
    if net.prefix_len() > 30 {
        return Err(src.err(w.cidr.span(), format!("cidr {net} is too small to serve clients"), "use a prefix of /30 or shorter"));
    }
    let inside = |r: &AddrRange| net.contains(&r.first) && net.contains(&r.last) && r.first != net.network() && r.last != net.broadcast();

    let mut exclude = Vec::new();
    for e in &w.exclude {
        let r = range(src, e, "exclude")?;
        if !(net.contains(&r.first) && net.contains(&r.last)) {
            return Err(src.err(e.span(), format!("exclude {r} is outside subnet {net}"), "only exclude addresses of this subnet"));
        }
        exclude.push(r);
    }
    let excluded = |a: Ipv4Addr| exclude.iter().any(|x: &AddrRange| x.contains(a));

    let mut routers = Vec::new();
    for r in &w.routers {
        let a = ipv4(src, r, "router")?;
        if !net.contains(&a) {
            return Err(src.err(r.span(), format!("router {a} is outside subnet {net}"), "clients can only reach a router on their own subnet"));
        }
        routers.push(a);
    }

    let mut pools: Vec<AddrRange> = Vec::new();
    for p in &w.pools {
        let r = range(src, p, "pool")?;
        if !inside(&r) {
            return Err(src.err(p.span(), format!("pool {r} is not inside subnet {net} (or contains its network/broadcast address)"), format!("keep pools within {}-{}", Ipv4Addr::from(u32::from(net.network()) + 1), Ipv4Addr::from(u32::from(net.broadcast()) - 1))));
        }
        if let Some(q) = pools.iter().find(|q| q.overlaps(&r)) {
            return Err(src.err(p.span(), format!("pool {r} overlaps pool {q}"), "make the pools disjoint"));
        }
        if let Some(a) = routers.iter().copied().find(|a| r.contains(*a) && !excluded(*a)) {
            return Err(src.err(p.span(), format!("pool {r} contains the router {a}"), format!("exclude {a} or shrink the pool")));
        }
        for (iface, n) in &local.0 {
            if r.contains(n.addr()) && !excluded(n.addr()) {
                return Err(src.err(p.span(), format!("pool {r} contains {}, this server's own address on {iface}", n.addr()), format!("exclude {} or shrink the pool", n.addr())));
            }
        }
        pools.push(r);
    }

    let lease = *w.lease_secs.get_ref();
    if !(60..=u64::from(u32::MAX - 1)).contains(&lease) {
        return Err(src.err(at(&w.lease_secs, &sec), format!("lease_secs = {lease} is out of range"), "use at least 60 seconds and less than 136 years"));
    }
    let lease = lease as u32;
    let t1 = w.renew_secs.as_ref().map_or(lease / 2, |v| (*v.get_ref()).min(u64::from(u32::MAX)) as u32);
    let t2 = w.rebind_secs.as_ref().map_or((u64::from(lease) * 7 / 8) as u32, |v| (*v.get_ref()).min(u64::from(u32::MAX)) as u32);
    let t_span = w.rebind_secs.as_ref().or(w.renew_secs.as_ref()).map_or(sec.clone(), |v| v.span());
    if !(0 < t1 && t1 < t2 && t2 < lease) {
        return Err(src.err(t_span, format!("renew_secs (T1 = {t1}) and rebind_secs (T2 = {t2}) must satisfy 0 < T1 < T2 < lease_secs ({lease})"), "leave them out for the defaults (T1 = lease/2, T2 = 7/8 lease) or fix the order"));
    }

    let mut dns_servers = Vec::new();
    for d in &w.dns_servers {
        dns_servers.push(ipv4(src, d, "dns server")?);
    }
    let mut ntp_servers = Vec::new();
    for d in &w.ntp_servers {
        ntp_servers.push(ipv4(src, d, "ntp server")?);
    }
    let domain_name = match &w.domain_name {
        None => None,
        Some(d) => {
            let name = d.get_ref().trim_end_matches('.');
            let ok = !name.is_empty()
                && name.len() <= 253
                && name.split('.').all(|l| !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') && !l.starts_with('-') && !l.ends_with('-'));
            if !ok {
                return Err(src.err(d.span(), format!("domain_name {:?} is not a valid DNS name", d.get_ref()), "use labels of letters, digits and '-', separated by dots"));
            }
            Some(name.to_string())
        }
    };

    Ok(Subnet { net, pools, exclude, lease_secs: lease, renew_secs: t1, rebind_secs: t2, routers, dns_servers, domain_name, ntp_servers })
}

/// "02:00:00:00:00:01" or "02-00-00-00-00-01".
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = text.trim().split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        if p.len() != 2 {
            return None;
        }
        *m = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

/// "01:02:00:00:00:00:01" (hex bytes, ':' separated) as sent in option 61.
pub fn parse_hex_bytes(text: &str) -> Option<Vec<u8>> {
    let out: Option<Vec<u8>> = text.trim().split(':').map(|p| if p.len() == 2 { u8::from_str_radix(p, 16).ok() } else { None }).collect();
    out.filter(|v| v.len() >= 2)
}

fn reservations(
    src: &Source,
    list: &[Spanned<wire::ReservationSection>],
    subnets: &[Subnet],
    local: &LocalAddrs,
    default_policy: wire::AliasBusyPolicy,
) -> Result<Vec<Reservation>, ConfigError> {
    let mut out: Vec<Reservation> = Vec::new();
    let mut members: HashMap<Vec<u8>, String> = HashMap::new();
    for r in list {
        let w = r.get_ref();
        let name = w.name.get_ref();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(src.err(w.name.span(), format!("reservation name {name:?} is not a valid alias"), "use only letters, digits, '_' and '-' (an alias must never be a domain name)"));
        }
        if out.iter().any(|o| &o.name == name) {
            return Err(src.err(w.name.span(), format!("reservation name {name} is used twice"), "give each reservation its own name"));
        }
        let mut hw = Vec::new();
        for h in &w.hw {
            let mac = parse_mac(h.get_ref()).ok_or_else(|| src.err(h.span(), format!("{:?} is not a hardware address", h.get_ref()), "write six hex bytes, e.g. 02:00:00:00:00:01"))?;
            let key = [&[1u8][..], &mac].concat();
            if let Some(other) = members.insert(key, name.clone()) {
                return Err(src.err(h.span(), format!("hardware address {} is already in reservation {other}", h.get_ref()), "a host may belong to one reservation only"));
            }
            hw.push(mac);
        }
        let mut client_ids = Vec::new();
        for c in &w.client_id {
            let id = parse_hex_bytes(c.get_ref()).ok_or_else(|| src.err(c.span(), format!("{:?} is not a client identifier", c.get_ref()), "write at least two hex bytes separated by ':', e.g. 01:02:00:00:00:00:01"))?;
            let key = [&[0u8][..], &id].concat();
            if let Some(other) = members.insert(key, name.clone()) {
                return Err(src.err(c.span(), format!("client id {} is already in reservation {other}", c.get_ref()), "a host may belong to one reservation only"));
            }
            client_ids.push(id);
        }
        if hw.is_empty() && client_ids.is_empty() {
            return Err(src.err(r.span(), format!("reservation {name} has no members"), "add hw = [\"..\"] or client_id = [\"..\"]"));
        }
        let ip = ipv4(src, &w.ip, "reserved ip")?;
        let Some(subnet) = subnets.iter().position(|s| s.contains(ip)) else {
            return Err(src.err(w.ip.span(), format!("reserved ip {ip} is outside every configured subnet"), "reserve an address inside one of the [[subnet]] cidrs"));
        };
        let net = subnets[subnet].net;
        if ip == net.network() || ip == net.broadcast() {
            return Err(src.err(w.ip.span(), format!("reserved ip {ip} is the network or broadcast address of {net}"), "reserve a host address"));
        }
        if let Some(iface) = local.find(ip) {
            return Err(src.err(w.ip.span(), format!("reserved ip {ip} is this server's own address on {iface}"), "reserve another address"));
        }
        if subnets[subnet].routers.contains(&ip) {
            return Err(src.err(w.ip.span(), format!("reserved ip {ip} is the router of {net}"), "reserve another address"));
        }
        if let Some(o) = out.iter().find(|o| o.ip == ip) {
            return Err(src.err(w.ip.span(), format!("reserved ip {ip} is already reserved for {}", o.name), "reserve each address once; list several hosts in one reservation's hw to share it"));
        }
        out.push(Reservation { name: name.clone(), hw, client_ids, ip, subnet, on_alias_busy: w.on_alias_busy.unwrap_or(default_policy) });
    }
    Ok(out)
}

fn socket_addr(src: &Source, v: &Spanned<String>, what: &str) -> Result<std::net::SocketAddr, ConfigError> {
    match v.get_ref().parse::<std::net::SocketAddr>() {
        Ok(a) if a.port() != 0 => Ok(a),
        _ => Err(src.err(v.span(), format!("{what} {:?} is not an address and port", v.get_ref()), "write IP:PORT, e.g. \"198.18.1.1:6767\"")),
    }
}

fn peer(src: &Source, p: &Spanned<wire::PeerSection>) -> Result<Peer, ConfigError> {
    let sec = p.span();
    let w = p.get_ref();
    let listen = socket_addr(src, &w.listen, "listen")?;
    let address = socket_addr(src, &w.address, "address")?;
    if listen == address {
        return Err(src.err(w.address.span(), format!("address {address} is this box's own listen address"), "set address to where the partner box listens"));
    }
    let key = w.key_file.get_ref();
    if !key.starts_with('/') {
        return Err(src.err(w.key_file.span(), format!("key_file {key:?} is not an absolute path"), "use an absolute path such as /etc/twinlease/peer.key"));
    }
    let ack = *w.ack_timeout_ms.get_ref();
    if !(1..=10_000).contains(&ack) {
        return Err(src.err(at(&w.ack_timeout_ms, &sec), format!("ack_timeout_ms = {ack} is out of range"), "use 1 to 10000 ms; it bounds how long a DHCPACK waits for the partner"));
    }
    let at_key = src.err(w.key_file.span(), "", "");
    let key_file_at = match at_key {
        ConfigError::Invalid { path, line, column, .. } => (path, line, column),
        ConfigError::Read { path, .. } => (path, 0, 0),
    };
    Ok(Peer { listen, address, key_file: PathBuf::from(key), key_file_at, sync_mode: w.sync_mode, ack_timeout_ms: ack })
}
