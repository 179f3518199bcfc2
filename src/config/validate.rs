//! Turns the wire structs into validated types. Every rejection points at the value that caused
//! it (file, line, column) and says what to change.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::ops::Range;
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;
use toml::Spanned;

use super::addr_set::first_overlap;
use super::classes::{self, Class, class_set};
use super::options::{Defs, OptionSet, option_set};
use super::wire::{self, ConfigFile};
use super::{
    AddrRange, AddrSet, Arbiter, ArbiterKind, Config, ConfigError, Control, Dhcp, LocalAddrs, Network, Node, Peer,
    Pool, Position, Reservation, Subnet,
};

/// The highest `[dhcp] max_pool_addresses` accepted: a relay-only head-office box serving many
/// branches needs about this many; more would cost hundreds of MB of memory at start.
const MAX_POOL_ADDRESSES_CEILING: u64 = 1 << 20;

/// Where we are in the file, to turn byte spans into line and column.
pub(super) struct Source<'a> {
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
}

impl Source<'_> {
    pub(super) fn position(&self, offset: usize) -> Position {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (self.path.to_path_buf(), line, column)
    }

    pub(super) fn err(&self, span: Range<usize>, message: impl Into<String>, hint: impl Into<String>) -> ConfigError {
        let (path, line, column) = self.position(span.start);
        ConfigError::Invalid { path, line, column, message: message.into(), hint: hint.into() }
    }
}

/// The file as text, or an error at the line and column of its first byte that is not UTF-8
/// (TOML files are UTF-8; a Latin-1 editor or a stray binary paste gets here).
pub(super) fn utf8<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a str, ConfigError> {
    std::str::from_utf8(bytes).map_err(|e| {
        let valid = e.valid_up_to();
        let prefix = String::from_utf8_lossy(&bytes[..valid]);
        Source { path, text: &prefix }.err(
            valid..valid,
            format!("byte 0x{:02x} is not UTF-8", bytes[valid]),
            "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 FILE`)",
        )
    })
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
    let mut defs = Defs::new(&src, &file.option_def)?;
    let options = option_set(&src, &mut defs, &file.option)?;
    let classes = classes::classes(&src, &mut defs, &file.class, &dhcp.interfaces)?;
    let (subnets, pools) = subnets(&src, &mut defs, &classes, &file.subnet, local, dhcp.max_pool_addresses)?;
    let networks = networks(&src, &file.subnet, &subnets)?;
    let subnets = subnets
        .into_iter()
        .map(|mut s| {
            s.network = networks.iter().position(|n| n.subnets.contains(&s.id)).expect("every subnet has a network");
            s
        })
        .collect::<Vec<Subnet>>();
    let reservations = reservations(&src, &mut defs, &file.reservation, &subnets, local, dhcp.on_alias_busy)?;
    let arbiter = match &file.arbiter {
        Some(a) => Some(arbiter(&src, a, &node)?),
        None => None,
    };
    let peer = match &file.peer {
        Some(p) => Some(peer(&src, p)?),
        None => None,
    };
    let log_filter = log_filter(&src, &file.log)?;
    let control = control(&src, &file.control)?;
    let metrics_listen = file.metrics.as_ref().map(|m| metrics_listen(&src, m)).transpose()?;
    let mut config = Config {
        path: path.to_path_buf(),
        node,
        dhcp,
        subnets,
        pools,
        networks,
        options,
        classes,
        reservations,
        log_filter,
        arbiter,
        peer,
        control,
        metrics_listen,
        overrides: Default::default(),
        digest: super::ConfigDigest::default(),
    };
    config.digest = super::digest::of(&config);
    Ok(config)
}

/// Subnets naming the same `shared_network` form one network, in file order; every other
/// subnet is a network of its own. A network's pools are its subnets' pools in that order.
fn networks(
    src: &Source,
    list: &[Spanned<wire::SubnetSection>],
    subnets: &[Subnet],
) -> Result<Vec<Network>, ConfigError> {
    let mut out: Vec<Network> = Vec::new();
    for (s, w) in subnets.iter().zip(list) {
        let Some(name) = &w.get_ref().shared_network else {
            out.push(Network { name: None, subnets: vec![s.id], pools: s.pools.clone() });
            continue;
        };
        let n = name.get_ref();
        if n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(src.err(
                name.span(),
                format!("shared_network {n:?} is not a valid name"),
                "use letters, digits, '-' and '_'",
            ));
        }
        match out.iter_mut().find(|net| net.name.as_deref() == Some(n.as_str())) {
            Some(net) => {
                net.subnets.push(s.id);
                net.pools.extend_from_slice(&s.pools);
            }
            None => out.push(Network { name: Some(n.clone()), subnets: vec![s.id], pools: s.pools.clone() }),
        }
    }
    Ok(out)
}

/// Every `[[subnet]]`: each checked alone, then against the others and the pool-size limit.
fn subnets(
    src: &Source,
    defs: &mut Defs,
    classes: &[Class],
    list: &[Spanned<wire::SubnetSection>],
    local: &LocalAddrs,
    max_pool_addresses: u64,
) -> Result<(Vec<Subnet>, Vec<Pool>), ConfigError> {
    if list.is_empty() {
        return Err(src.err(0..0, "no [[subnet]] is configured", "add a [[subnet]] section with a cidr and pools"));
    }
    let mut subnets = Vec::with_capacity(list.len());
    let mut pools = Vec::new();
    for (id, s) in list.iter().enumerate() {
        subnets.push(subnet(src, defs, classes, id, s, local, &mut pools)?);
    }
    let nets: Vec<AddrRange> =
        subnets.iter().map(|s| AddrRange { first: s.net.network(), last: s.net.broadcast() }).collect();
    if let Some((earlier, later)) = first_overlap(&nets) {
        return Err(src.err(
            list[later].get_ref().cidr.span(),
            format!("subnet {} overlaps subnet {}", subnets[later].net, subnets[earlier].net),
            "give each [[subnet]] a distinct, non-overlapping cidr",
        ));
    }
    // Pools lie inside their own subnet and subnets are disjoint, so pools of different subnets
    // cannot overlap. The limit is arithmetic on range lengths: nothing is enumerated yet.
    let mut total = 0u64;
    for (s, w) in subnets.iter().zip(list) {
        total += s.dynamic().len();
        if total > max_pool_addresses {
            return Err(pool_limit_error(src, w.get_ref(), total, max_pool_addresses));
        }
    }
    Ok((subnets, pools))
}

/// The pools reached `total` addresses at this subnet: point at its largest pool.
fn pool_limit_error(src: &Source, w: &wire::SubnetSection, total: u64, max: u64) -> ConfigError {
    let largest = w
        .pools
        .iter()
        .chain(w.pool.iter().map(|p| &p.get_ref().range))
        .filter_map(|p| range(src, p, "pool").ok().map(|r| (r.len(), p.span())))
        .max_by_key(|(len, _)| *len);
    let (len, span) = largest.unwrap_or((0, w.cidr.span()));
    src.err(
        span,
        format!(
            "the pools hold {total} addresses (after exclusions, up to this subnet), \
             more than max_pool_addresses = {max}"
        ),
        format!(
            "shrink this pool ({len} addresses) or raise [dhcp] max_pool_addresses (at most \
             {MAX_POOL_ADDRESSES_CEILING}; each pool address takes about 200 bytes of memory from the start)"
        ),
    )
}

/// The `[log] filter`, checked with the parser `run` uses, so a typo is an error here instead
/// of a silent fall-back to "info".
fn log_filter(src: &Source, log: &wire::LogSection) -> Result<Option<String>, ConfigError> {
    let Some(filter) = &log.filter else { return Ok(None) };
    crate::logging::parse_filter(filter.get_ref()).map_err(|e| {
        src.err(
            filter.span(),
            format!("[log] filter {:?} is not a valid filter: {e}", filter.get_ref()),
            "write a level (error, warn, info, debug, trace, off), optionally with target=level \
             pairs, e.g. \"info,twinlease::sync=debug\"",
        )
    })?;
    Ok(Some(filter.get_ref().clone()))
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
        return Err(src.err(
            at(&n.get_ref().state_dir, &n.span()),
            format!("state_dir {dir:?} is not an absolute path"),
            "use an absolute path such as /var/lib/twinlease",
        ));
    }
    Ok(Node { name: name.clone(), state_dir: PathBuf::from(dir) })
}

fn control(src: &Source, c: &wire::ControlSection) -> Result<Control, ConfigError> {
    let dir = c.runtime_dir.get_ref();
    if !dir.starts_with('/') {
        return Err(src.err(
            c.runtime_dir.span(),
            format!("runtime_dir {dir:?} is not an absolute path"),
            "use an absolute path such as /run/twinlease",
        ));
    }
    let runtime_dir = PathBuf::from(dir);
    let update_socket = c.update_socket.get_ref();
    if !update_socket.starts_with('/') {
        return Err(src.err(
            c.update_socket.span(),
            format!("update_socket {update_socket:?} is not an absolute path"),
            "use an absolute path such as /run/twinlease-update.sock",
        ));
    }
    Ok(Control {
        runtime_dir,
        status_group: c.status_group.clone(),
        admin_group: c.admin_group.clone(),
        update_socket: PathBuf::from(update_socket),
    })
}

fn metrics_listen(src: &Source, m: &Spanned<wire::MetricsSection>) -> Result<std::net::SocketAddr, ConfigError> {
    let l = &m.get_ref().listen;
    l.get_ref().parse().map_err(|_| {
        src.err(
            l.span(),
            format!("metrics listen {:?} is not an address and port", l.get_ref()),
            "write an address and a port, e.g. \"198.18.0.1:9410\" (bind only where scrapers may reach it)",
        )
    })
}

fn dhcp(src: &Source, d: &Spanned<wire::DhcpSection>) -> Result<Dhcp, ConfigError> {
    let sec = d.span();
    let w = d.get_ref();
    let mut interfaces: Vec<String> = Vec::new();
    for i in &w.interfaces {
        let name = i.get_ref();
        if name.is_empty() || name.len() > 15 || name.contains(['/', ' ', '\0']) {
            return Err(src.err(
                i.span(),
                format!("{name:?} is not a valid interface name"),
                "use the kernel's name of the interface, at most 15 characters (see `ip link`)",
            ));
        }
        if interfaces.contains(name) {
            return Err(src.err(i.span(), format!("interface {name} is listed twice"), "list each interface once"));
        }
        interfaces.push(name.clone());
    }
    if interfaces.is_empty() && !w.listen_relayed {
        return Err(src.err(
            sec,
            "nothing to listen on: no interfaces and listen_relayed = false",
            "list the LAN interfaces in [dhcp] interfaces, or set listen_relayed = true",
        ));
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
        max_pool_addresses: bounded(&w.max_pool_addresses, 1, MAX_POOL_ADDRESSES_CEILING, "max_pool_addresses")?,
    })
}

fn ipv4(src: &Source, v: &Spanned<String>, what: &str) -> Result<Ipv4Addr, ConfigError> {
    v.get_ref().trim().parse().map_err(|_| {
        src.err(
            v.span(),
            format!("{what} {:?} is not an IPv4 address", v.get_ref()),
            "write a dotted-quad address such as 198.18.0.1",
        )
    })
}

/// Parses "a.b.c.d", "a.b.c.d-e.f.g.h" or "a.b.c.d/nn" into an inclusive range.
fn range(src: &Source, v: &Spanned<String>, what: &str) -> Result<AddrRange, ConfigError> {
    let text = v.get_ref().trim();
    let bad = || {
        src.err(
            v.span(),
            format!("{what} {text:?} is not an address range"),
            "write first-last (198.18.0.100-198.18.0.199), a cidr, or one address",
        )
    };
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

/// Blocks no client can be given an address in, nor use as its router or a server (RFC 6890):
/// with the limited broadcast address, 240.0.0.0/4 also holds 255.255.255.255.
const UNUSABLE_BLOCKS: [(Ipv4Addr, u8, &str); 4] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8, "\"this network\""),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "reserved"),
];

/// The first of [`UNUSABLE_BLOCKS`] that `net` overlaps, and what it is.
fn unusable_block(net: Ipv4Net) -> Option<(Ipv4Net, &'static str)> {
    UNUSABLE_BLOCKS.iter().find_map(|&(addr, prefix, what)| {
        let block = Ipv4Net::new(addr, prefix).ok()?;
        (block.contains(&net.network()) || net.contains(&block.network())).then_some((block, what))
    })
}

fn subnet(
    src: &Source,
    defs: &mut Defs,
    classes: &[Class],
    id: usize,
    s: &Spanned<wire::SubnetSection>,
    local: &LocalAddrs,
    all_pools: &mut Vec<Pool>,
) -> Result<Subnet, ConfigError> {
    let w = s.get_ref();
    let net = subnet_cidr(src, &w.cidr)?;
    let mut routers = Vec::new();
    for r in &w.routers {
        let a = ipv4(src, r, "router")?;
        if !net.contains(&a) {
            return Err(src.err(
                r.span(),
                format!("router {a} is outside subnet {net}"),
                "clients can only reach a router on their own subnet",
            ));
        }
        routers.push(host_address(src, r, "router", net)?);
    }
    let (dynamic, pools) = pools_minus_excludes(src, w, net, &routers, local)?;
    let mut pool_ids = Vec::with_capacity(pools.len());
    for (addrs, spec) in pools {
        let (allow, deny, options) = match spec {
            Some(p) => (
                class_set(src, classes, &p.allow_classes)?,
                class_set(src, classes, &p.deny_classes)?,
                option_set(src, defs, &p.option)?,
            ),
            None => Default::default(),
        };
        if let Some(p) = spec
            && allow.intersects(deny)
        {
            return Err(src.err(
                p.range.span(),
                format!("pool {} both allows and denies one class", p.range.get_ref()),
                "list a class in allow_classes or in deny_classes, not in both",
            ));
        }
        pool_ids.push(all_pools.len());
        all_pools.push(Pool { id: all_pools.len(), subnet: id, addrs, allow, deny, options });
    }
    let (lease_secs, renew_secs, rebind_secs) = lease_times(src, w, &s.span())?;
    let servers = |list: &[Spanned<String>], what: &str| -> Result<Vec<Ipv4Addr>, ConfigError> {
        list.iter().map(|v| host_address(src, v, what, net)).collect()
    };
    let dns_servers = servers(&w.dns_servers, "dns server")?;
    let domain_name = domain_name(src, &w.domain_name)?;
    let ntp_servers = servers(&w.ntp_servers, "ntp server")?;
    let options = subnet_options(src, defs, w, net, &routers, &dns_servers, domain_name.as_deref(), &ntp_servers)?;
    Ok(Subnet {
        id,
        net,
        network: 0,
        dynamic,
        pools: pool_ids,
        lease_secs,
        renew_secs,
        rebind_secs,
        routers,
        dns_servers,
        domain_name,
        ntp_servers,
        options,
    })
}

/// The subnet's `[[subnet.option]]` list plus what the subnet's own keys and cidr give: mask,
/// broadcast address, routers, DNS servers, domain name and NTP servers.
#[allow(clippy::too_many_arguments)]
fn subnet_options(
    src: &Source,
    defs: &mut Defs,
    w: &wire::SubnetSection,
    net: Ipv4Net,
    routers: &[Ipv4Addr],
    dns: &[Ipv4Addr],
    domain: Option<&str>,
    ntp: &[Ipv4Addr],
) -> Result<OptionSet, ConfigError> {
    let mut set = option_set(src, defs, &w.option)?;
    let addrs = |list: &[Ipv4Addr]| list.iter().flat_map(|a| a.octets()).collect::<Vec<u8>>();
    let keyed: [(u8, &str, Option<Vec<u8>>); 4] = [
        (3, "routers", (!routers.is_empty()).then(|| addrs(routers))),
        (6, "dns_servers", (!dns.is_empty()).then(|| addrs(dns))),
        (15, "domain_name", domain.map(|d| d.as_bytes().to_vec())),
        (42, "ntp_servers", (!ntp.is_empty()).then(|| addrs(ntp))),
    ];
    for (code, key, data) in keyed {
        let Some(data) = data else { continue };
        if set.get(code).is_some() {
            let at = w.option.iter().find(|o| o_code(defs, o.get_ref()) == Some(code)).map_or(0..0, |o| o.span());
            return Err(src.err(
                at,
                format!("option {code} is set both here and by the subnet's {key} key"),
                format!("keep one of them (the {key} key is checked against the subnet)"),
            ));
        }
        set.insert(code, data);
    }
    set.insert(1, net.netmask().octets().to_vec());
    set.insert(28, net.broadcast().octets().to_vec());
    Ok(set)
}

/// The code an option entry stands for, if it can be told (for pointing at it in an error).
fn o_code(defs: &Defs, w: &wire::OptionSection) -> Option<u8> {
    match (&w.name, &w.code) {
        (Some(n), _) => defs.code_of(n.get_ref()),
        (None, Some(c)) => u8::try_from(*c.get_ref()).ok(),
        _ => None,
    }
}

fn subnet_cidr(src: &Source, cidr: &Spanned<String>) -> Result<Ipv4Net, ConfigError> {
    let net: Ipv4Net = cidr.get_ref().trim().parse().map_err(|_| {
        src.err(
            cidr.span(),
            format!("cidr {:?} is not an IPv4 network", cidr.get_ref()),
            "write it as address/prefix, e.g. 198.18.0.0/24",
        )
    })?;
    if net.trunc() != net {
        return Err(src.err(
            cidr.span(),
            format!("cidr {net} has host bits set"),
            format!("did you mean {}?", net.trunc()),
        ));
    }
    if net.prefix_len() > 30 {
        return Err(src.err(
            cidr.span(),
            format!("cidr {net} is too small to serve clients"),
            "use a prefix of /30 or shorter",
        ));
    }
    if let Some((block, what)) = unusable_block(net) {
        return Err(src.err(
            cidr.span(),
            format!("cidr {net} includes {block} ({what}), where no client can have an address"),
            "write the network of the LAN or relayed segment this subnet serves, e.g. 198.18.0.0/24",
        ));
    }
    Ok(net)
}

/// An address given to the clients of `net` as their router or a server: never in one of the
/// [`UNUSABLE_BLOCKS`], nor the network or broadcast address of `net`.
fn host_address(src: &Source, v: &Spanned<String>, what: &str, net: Ipv4Net) -> Result<Ipv4Addr, ConfigError> {
    let a = ipv4(src, v, what)?;
    let hint = if what == "router" {
        format!("use the router's own address on this subnet, e.g. {}", Ipv4Addr::from(u32::from(net.network()) + 1))
    } else {
        "give the address at which clients reach the server".to_string()
    };
    if let Some((block, kind)) = unusable_block(Ipv4Net::from(a)) {
        return Err(src.err(v.span(), format!("{what} {a} is a {kind} address ({block})"), hint));
    }
    for (special, name) in [(net.network(), "network"), (net.broadcast(), "broadcast")] {
        if a == special {
            return Err(src.err(v.span(), format!("{what} {a} is the {name} address of subnet {net}"), hint));
        }
    }
    Ok(a)
}

/// A pool's addresses (after exclusions) and its `[[subnet.pool]]` table if it has one.
type PoolAddrs<'w> = (AddrSet, Option<&'w wire::PoolSection>);

/// The subnet's pools minus its exclusions, together and one by one (plain `pools` first,
/// then `[[subnet.pool]]` tables, in file order). Every check here works on ranges (a sort
/// and a merge), never address by address, so a /8 pool with 20,000 exclusions costs what
/// its 20,001 ranges cost; the pool-size limit is checked on the result's length.
fn pools_minus_excludes<'w>(
    src: &Source,
    w: &'w wire::SubnetSection,
    net: Ipv4Net,
    routers: &[Ipv4Addr],
    local: &LocalAddrs,
) -> Result<(AddrSet, Vec<PoolAddrs<'w>>), ConfigError> {
    let mut excludes = Vec::with_capacity(w.exclude.len());
    for e in &w.exclude {
        let r = range(src, e, "exclude")?;
        if !(net.contains(&r.first) && net.contains(&r.last)) {
            return Err(src.err(
                e.span(),
                format!("exclude {r} is outside subnet {net}"),
                "only exclude addresses of this subnet",
            ));
        }
        excludes.push(r);
    }
    let specs: Vec<(&Spanned<String>, Option<&wire::PoolSection>)> = w
        .pools
        .iter()
        .map(|p| (p, None))
        .chain(w.pool.iter().map(|p| (&p.get_ref().range, Some(p.get_ref()))))
        .collect();
    let mut pools = Vec::with_capacity(specs.len());
    for (p, _) in &specs {
        let r = range(src, p, "pool")?;
        if !(net.contains(&r.first) && net.contains(&r.last) && r.first != net.network() && r.last != net.broadcast()) {
            return Err(src.err(
                p.span(),
                format!("pool {r} is not inside subnet {net} (or contains its network/broadcast address)"),
                format!(
                    "keep pools within {}-{}",
                    Ipv4Addr::from(u32::from(net.network()) + 1),
                    Ipv4Addr::from(u32::from(net.broadcast()) - 1)
                ),
            ));
        }
        pools.push(r);
    }
    if let Some((earlier, later)) = first_overlap(&pools) {
        return Err(src.err(
            specs[later].0.span(),
            format!("pool {} overlaps pool {}", pools[later], pools[earlier]),
            "make the pools disjoint",
        ));
    }
    let excluded = AddrSet::from_ranges(excludes);
    let dynamic = AddrSet::from_ranges(pools.iter().copied()).minus(&excluded);
    // Only on the way to an error: which pool holds an address of `dynamic` (one always does).
    let holder = |a: Ipv4Addr| pools.iter().position(|p| p.contains(a)).unwrap_or(0);
    if let Some(a) = routers.iter().copied().find(|a| dynamic.contains(*a)) {
        let i = holder(a);
        return Err(src.err(
            specs[i].0.span(),
            format!("pool {} contains the router {a}", pools[i]),
            format!("exclude {a} or shrink the pool"),
        ));
    }
    if let Some((iface, n)) = local.0.iter().find(|(_, n)| dynamic.contains(n.addr())) {
        let (a, i) = (n.addr(), holder(n.addr()));
        return Err(src.err(
            specs[i].0.span(),
            format!("pool {} contains {a}, this server's own address on {iface}", pools[i]),
            format!("exclude {a} or shrink the pool"),
        ));
    }
    let each =
        pools.iter().zip(&specs).map(|(r, (_, spec))| (AddrSet::from_ranges([*r]).minus(&excluded), *spec)).collect();
    Ok((dynamic, each))
}

/// Lease time, T1 and T2: 0 < T1 < T2 < lease; T1 and T2 default to 1/2 and 7/8 of the lease.
fn lease_times(src: &Source, w: &wire::SubnetSection, sec: &Range<usize>) -> Result<(u32, u32, u32), ConfigError> {
    let lease = *w.lease_secs.get_ref();
    if !(60..=u64::from(u32::MAX - 1)).contains(&lease) {
        return Err(src.err(
            at(&w.lease_secs, sec),
            format!("lease_secs = {lease} is out of range"),
            "use at least 60 seconds and less than 136 years",
        ));
    }
    let lease = lease as u32;
    let t1 = w.renew_secs.as_ref().map_or(lease / 2, |v| (*v.get_ref()).min(u64::from(u32::MAX)) as u32);
    let t2 = w
        .rebind_secs
        .as_ref()
        .map_or((u64::from(lease) * 7 / 8) as u32, |v| (*v.get_ref()).min(u64::from(u32::MAX)) as u32);
    let t_span = w.rebind_secs.as_ref().or(w.renew_secs.as_ref()).map_or(sec.clone(), |v| v.span());
    if !(0 < t1 && t1 < t2 && t2 < lease) {
        return Err(src.err(
            t_span,
            format!(
                "renew_secs (T1 = {t1}) and rebind_secs (T2 = {t2}) must satisfy 0 < T1 < T2 < lease_secs ({lease})"
            ),
            "leave them out for the defaults (T1 = lease/2, T2 = 7/8 lease) or fix the order",
        ));
    }
    Ok((lease, t1, t2))
}

fn domain_name(src: &Source, d: &Option<Spanned<String>>) -> Result<Option<String>, ConfigError> {
    let Some(d) = d else { return Ok(None) };
    let name = d.get_ref().trim_end_matches('.');
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if !ok {
        return Err(src.err(
            d.span(),
            format!("domain_name {:?} is not a valid DNS name", d.get_ref()),
            "use labels of letters, digits and '-', separated by dots",
        ));
    }
    Ok(Some(name.to_string()))
}

/// "02:00:00:00:00:01" or "02-00-00-00-00-01".
pub(super) fn parse_mac(text: &str) -> Option<[u8; 6]> {
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
pub(super) fn parse_hex_bytes(text: &str) -> Option<Vec<u8>> {
    let out: Option<Vec<u8>> =
        text.trim().split(':').map(|p| if p.len() == 2 { u8::from_str_radix(p, 16).ok() } else { None }).collect();
    out.filter(|v| v.len() >= 2)
}

fn reservations(
    src: &Source,
    defs: &mut Defs,
    list: &[Spanned<wire::ReservationSection>],
    subnets: &[Subnet],
    local: &LocalAddrs,
    default_policy: wire::AliasBusyPolicy,
) -> Result<Vec<Reservation>, ConfigError> {
    let mut out: Vec<Reservation> = Vec::new();
    let mut members: HashMap<Vec<u8>, String> = HashMap::new();
    let mut names: HashSet<&str> = HashSet::new();
    let mut reserved: HashMap<Ipv4Addr, &str> = HashMap::new();
    for r in list {
        let w = r.get_ref();
        let name = w.name.get_ref();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(src.err(
                w.name.span(),
                format!("reservation name {name:?} is not a valid alias"),
                "use only letters, digits, '_' and '-' (an alias must never be a domain name)",
            ));
        }
        if !names.insert(name) {
            return Err(src.err(
                w.name.span(),
                format!("reservation name {name} is used twice"),
                "give each reservation its own name",
            ));
        }
        let (hw, client_ids) = reservation_members(src, w, &mut members)?;
        if hw.is_empty() && client_ids.is_empty() {
            return Err(src.err(
                r.span(),
                format!("reservation {name} has no members"),
                "add hw = [\"..\"] or client_id = [\"..\"]",
            ));
        }
        let (ip, subnet) = reserved_ip(src, w, subnets, local)?;
        if let Some(other) = reserved.insert(ip, name) {
            return Err(src.err(
                w.ip.span(),
                format!("reserved ip {ip} is already reserved for {other}"),
                "reserve each address once; list several hosts in one reservation's hw to share it",
            ));
        }
        out.push(Reservation {
            name: name.clone(),
            hw,
            client_ids,
            ip,
            subnet,
            on_alias_busy: w.on_alias_busy.unwrap_or(default_policy),
            options: option_set(src, defs, &w.option)?,
        });
    }
    Ok(out)
}

/// A reservation's hardware addresses and client ids.
type Members = (Vec<[u8; 6]>, Vec<Vec<u8>>);

/// A reservation's members; each may belong to one reservation only (`members` maps every one
/// seen so far to its reservation).
fn reservation_members(
    src: &Source,
    w: &wire::ReservationSection,
    members: &mut HashMap<Vec<u8>, String>,
) -> Result<Members, ConfigError> {
    let name = w.name.get_ref();
    let mut claim = |key: Vec<u8>, span: Range<usize>, what: String| match members.insert(key, name.clone()) {
        Some(other) => Err(src.err(
            span,
            format!("{what} is already in reservation {other}"),
            "a host may belong to one reservation only",
        )),
        None => Ok(()),
    };
    let mut hw = Vec::new();
    for h in &w.hw {
        let mac = parse_mac(h.get_ref()).ok_or_else(|| {
            src.err(
                h.span(),
                format!("{:?} is not a hardware address", h.get_ref()),
                "write six hex bytes, e.g. 02:00:00:00:00:01",
            )
        })?;
        claim([&[1u8][..], &mac].concat(), h.span(), format!("hardware address {}", h.get_ref()))?;
        hw.push(mac);
    }
    let mut client_ids = Vec::new();
    for c in &w.client_id {
        let id = parse_hex_bytes(c.get_ref()).ok_or_else(|| {
            src.err(
                c.span(),
                format!("{:?} is not a client identifier", c.get_ref()),
                "write at least two hex bytes separated by ':', e.g. 01:02:00:00:00:00:01",
            )
        })?;
        claim([&[0u8][..], &id].concat(), c.span(), format!("client id {}", c.get_ref()))?;
        client_ids.push(id);
    }
    Ok((hw, client_ids))
}

/// A reservation's address: a host address inside a subnet, and not this server's or a
/// router's.
fn reserved_ip(
    src: &Source,
    w: &wire::ReservationSection,
    subnets: &[Subnet],
    local: &LocalAddrs,
) -> Result<(Ipv4Addr, super::SubnetId), ConfigError> {
    let ip = ipv4(src, &w.ip, "reserved ip")?;
    let refuse = |message: String, hint: &str| Err(src.err(w.ip.span(), message, hint));
    let Some(subnet) = subnets.iter().position(|s| s.contains(ip)) else {
        return refuse(
            format!("reserved ip {ip} is outside every configured subnet"),
            "reserve an address inside one of the [[subnet]] cidrs",
        );
    };
    let net = subnets[subnet].net;
    if ip == net.network() || ip == net.broadcast() {
        return refuse(
            format!("reserved ip {ip} is the network or broadcast address of {net}"),
            "reserve a host address",
        );
    }
    if let Some(iface) = local.find(ip) {
        return refuse(format!("reserved ip {ip} is this server's own address on {iface}"), "reserve another address");
    }
    if subnets[subnet].routers.contains(&ip) {
        return refuse(format!("reserved ip {ip} is the router of {net}"), "reserve another address");
    }
    Ok((ip, subnet))
}

fn arbiter(src: &Source, a: &Spanned<wire::ArbiterSection>, node: &Node) -> Result<Arbiter, ConfigError> {
    let sec = a.span();
    let w = a.get_ref();
    let url = w.url.get_ref().trim();
    let kind = match url.split_once("://").map(|(s, _)| s) {
        Some("postgres" | "postgresql") => ArbiterKind::Postgres,
        Some("mysql" | "mariadb") => ArbiterKind::Mysql,
        Some("sqlite") => ArbiterKind::Sqlite,
        _ => {
            return Err(src.err(
                w.url.span(),
                format!("arbiter url {url:?} names no supported database"),
                "start it with postgres://, mysql:// or sqlite:/// (e.g. postgres://twinlease@hq.example/arbiter)",
            ));
        }
    };
    if kind == ArbiterKind::Sqlite && !url.starts_with("sqlite:///") {
        return Err(src.err(
            w.url.span(),
            format!("arbiter url {url:?} is not an absolute sqlite path"),
            "write sqlite:///absolute/path/arbiter.db (three slashes)",
        ));
    }
    let utype = w.utype.get_ref();
    if utype.is_empty() || utype.len() > 128 || !utype.chars().all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c))
    {
        return Err(src.err(
            w.utype.span(),
            format!("utype {utype:?} is not a valid service name"),
            "use 1-128 letters, digits, '.', '_', '/' or '-', the same on both boxes (e.g. branch42/dhcp)",
        ));
    }
    let interval = *w.interval_ms.get_ref();
    if !(50..=60_000).contains(&interval) {
        return Err(src.err(
            at(&w.interval_ms, &sec),
            format!("interval_ms = {interval} is out of range"),
            "use 50 to 60000 (1000 is a good start)",
        ));
    }
    let timeout = *w.timeout_ms.get_ref();
    if timeout <= 2 * interval || timeout > 3_600_000 {
        return Err(src.err(
            at(&w.timeout_ms, &sec),
            format!("timeout_ms (T = {timeout}) must be greater than 2 x interval_ms (I = {interval}) and at most one hour"),
            format!("raise timeout_ms above {} or lower interval_ms; T > 2I leaves the active box time to renew before it must stop", 2 * interval),
        ));
    }
    let abs = |v: &Option<Spanned<String>>, what: &str| -> Result<Option<PathBuf>, ConfigError> {
        match v {
            None => Ok(None),
            Some(p) if p.get_ref().starts_with('/') => Ok(Some(PathBuf::from(p.get_ref()))),
            Some(p) => Err(src.err(
                p.span(),
                format!("{what} {:?} is not an absolute path", p.get_ref()),
                "use an absolute path",
            )),
        }
    };
    let endpoint = w.endpoint.as_ref().map_or_else(|| node.name.clone(), |e| e.get_ref().clone());
    let password_file_at = src.position(w.password_file.as_ref().map_or(sec.start, |p| p.span().start));
    Ok(Arbiter {
        url: url.to_string(),
        kind,
        utype: utype.clone(),
        interval: std::time::Duration::from_millis(interval),
        timeout: std::time::Duration::from_millis(timeout),
        password_file: abs(&w.password_file, "password_file")?,
        password_file_at,
        tls: w.tls,
        ca_file: abs(&w.ca_file, "ca_file")?,
        endpoint,
    })
}

fn socket_addr(src: &Source, v: &Spanned<String>, what: &str) -> Result<std::net::SocketAddr, ConfigError> {
    match v.get_ref().parse::<std::net::SocketAddr>() {
        Ok(a) if a.port() != 0 => Ok(a),
        _ => Err(src.err(
            v.span(),
            format!("{what} {:?} is not an address and port", v.get_ref()),
            "write IP:PORT, e.g. \"198.18.1.1:6767\"",
        )),
    }
}

fn peer(src: &Source, p: &Spanned<wire::PeerSection>) -> Result<Peer, ConfigError> {
    let sec = p.span();
    let w = p.get_ref();
    let listen = socket_addr(src, &w.listen, "listen")?;
    let address = socket_addr(src, &w.address, "address")?;
    if listen == address {
        return Err(src.err(
            w.address.span(),
            format!("address {address} is this box's own listen address"),
            "set address to where the partner box listens",
        ));
    }
    let key = w.key_file.get_ref();
    if !key.starts_with('/') {
        return Err(src.err(
            w.key_file.span(),
            format!("key_file {key:?} is not an absolute path"),
            "use an absolute path such as /etc/twinlease/peer.key",
        ));
    }
    let ack = *w.ack_timeout_ms.get_ref();
    if !(1..=10_000).contains(&ack) {
        return Err(src.err(
            at(&w.ack_timeout_ms, &sec),
            format!("ack_timeout_ms = {ack} is out of range"),
            "use 1 to 10000 ms; it bounds how long a DHCPACK waits for the partner",
        ));
    }
    let key_file_at = src.position(w.key_file.span().start);
    Ok(Peer { listen, address, key_file: PathBuf::from(key), key_file_at, sync_mode: w.sync_mode, ack_timeout_ms: ack })
}
