//! Configuration: the TOML file (`wire`), the checks (`validate`) and the validated types the rest
//! of the program uses. Everything past `Config::load` can trust what it gets.

mod addr_set;
mod classes;
mod digest;
mod options;
mod validate;
pub mod wire;

use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;

pub use addr_set::AddrSet;
#[cfg(test)]
pub(crate) use addr_set::steps_taken;
pub use classes::{Class, ClassSet, MAX_CLASSES, Pattern, PatternKind};
pub use digest::ConfigDigest;
pub use options::{KNOWN as KNOWN_OPTIONS, MAX_OPTION_BYTES, OptionSet, OptionType, OptionValue, encoded_len};
pub use wire::{AliasBusyPolicy, SyncMode, TlsMode};

/// Where a value is written in the configuration (file, line, column), for errors found only
/// when something the value names is read later.
pub type Position = (PathBuf, usize, usize);

/// A configuration that passed every check.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub node: Node,
    pub dhcp: Dhcp,
    pub subnets: Vec<Subnet>,
    /// Every pool of every subnet; [`Subnet::pools`] and [`Network::pools`] index into it.
    pub pools: Vec<Pool>,
    /// Subnets grouped by `shared_network`; every subnet is in exactly one.
    pub networks: Vec<Network>,
    /// Options for every client (the least specific level).
    pub options: OptionSet,
    /// In file order: when two classes a client is in set one option, the earlier one wins.
    pub classes: Vec<Class>,
    pub reservations: Vec<Reservation>,
    pub log_filter: Option<String>,
    /// `None`: no `[arbiter]`, a single box that is always active.
    pub arbiter: Option<Arbiter>,
    pub peer: Option<Peer>,
    pub control: Control,
    /// Where to serve Prometheus metrics over HTTP, if anywhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Directories given on the command line in place of the file's (kept so a reload of the
    /// file applies them again).
    pub overrides: Overrides,
    /// A hash of everything that decides the answers clients get, which both boxes of a pair
    /// must agree on (see [`digest`]).
    pub digest: ConfigDigest,
}

/// `--state-dir` and `--runtime-dir`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    pub state_dir: Option<PathBuf>,
    pub runtime_dir: Option<PathBuf>,
}

impl Config {
    /// Uses `overrides` in place of the file's directories, and remembers them.
    pub fn with_overrides(mut self, overrides: Overrides) -> Config {
        if let Some(d) = &overrides.state_dir {
            self.node.state_dir = d.clone();
        }
        if let Some(d) = &overrides.runtime_dir {
            self.control.runtime_dir = d.clone();
        }
        self.overrides = overrides;
        self
    }
}

/// The validated `[control]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// Holds `status.sock` and `control.sock`.
    pub runtime_dir: PathBuf,
    pub status_group: String,
    pub admin_group: String,
    /// The firmware image's update socket, where `update-*` control commands are passed on.
    pub update_socket: PathBuf,
}

impl Control {
    pub fn status_socket(&self) -> PathBuf {
        self.runtime_dir.join("status.sock")
    }

    pub fn control_socket(&self) -> PathBuf {
        self.runtime_dir.join("control.sock")
    }
}

/// The validated `[arbiter]` section.
#[derive(Debug, Clone)]
pub struct Arbiter {
    pub url: String,
    pub kind: ArbiterKind,
    pub utype: String,
    pub interval: std::time::Duration,
    pub timeout: std::time::Duration,
    pub password_file: Option<PathBuf>,
    /// Where `password_file` is written in the configuration.
    pub password_file_at: Position,
    pub tls: TlsMode,
    pub ca_file: Option<PathBuf>,
    pub endpoint: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArbiterKind {
    Postgres,
    Mysql,
    /// `path` of `sqlite:///path`.
    Sqlite,
}

/// The partner box and how leases are synced to it.
#[derive(Debug, Clone)]
pub struct Peer {
    pub listen: std::net::SocketAddr,
    pub address: std::net::SocketAddr,
    pub key_file: PathBuf,
    /// Where `key_file` is written in the configuration, for errors found when it is read.
    pub key_file_at: Position,
    pub sync_mode: SyncMode,
    pub ack_timeout_ms: u64,
}

impl Peer {
    /// Reads the shared key. Refuses a key readable by group or others (it authenticates every
    /// lease the partner will store) and one too short to be a real secret.
    pub fn read_key(&self) -> Result<Vec<u8>, ConfigError> {
        let key = read_secret(&self.key_file, &self.key_file_at, "key_file", KEY_HINT)?.trim_ascii().to_vec();
        if key.len() < 16 {
            let (path, line, column) = self.key_file_at.clone();
            return Err(ConfigError::Invalid {
                path,
                line,
                column,
                message: format!(
                    "key_file {} holds {} bytes; at least 16 are needed",
                    self.key_file.display(),
                    key.len()
                ),
                hint: KEY_HINT.to_string(),
            });
        }
        Ok(key)
    }
}

const KEY_HINT: &str =
    "create it with `head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE` and copy it to the partner";

impl Arbiter {
    /// Reads the database password from `password_file`, if one is configured, under the same
    /// rules as the peer key. The line end is not part of the password.
    pub fn read_password(&self) -> Result<Option<String>, ConfigError> {
        let Some(file) = &self.password_file else { return Ok(None) };
        let hint = "write the arbiter database password into it and run `chmod 600` on it";
        let bytes = read_secret(file, &self.password_file_at, "password_file", hint)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            let (path, line, column) = self.password_file_at.clone();
            let message = format!("password_file {} is not UTF-8 text", file.display());
            ConfigError::Invalid { path, line, column, message, hint: hint.to_string() }
        })?;
        Ok(Some(text.trim_end_matches(['\r', '\n']).to_string()))
    }
}

/// The one check for a file holding a secret, used by `run` (when it reads the secret) and by
/// `check-config` (through [`Config::check_secret_files`]), so both judge a file alike: it must
/// be a regular file, readable by its owner only, and hold more than whitespace. Errors point
/// at `named_at`, where the configuration names the file.
fn read_secret(file: &Path, named_at: &Position, key: &str, create_hint: &str) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let invalid = |message: String, hint: &str| {
        let (path, line, column) = named_at.clone();
        ConfigError::Invalid { path, line, column, message, hint: hint.to_string() }
    };
    let shown = file.display();
    // O_NONBLOCK: opening a FIFO named by mistake must fail the checks below, not hang.
    let mut handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(file)
        .map_err(|e| invalid(format!("cannot read {key} {shown}: {e}"), create_hint))?;
    let meta = handle.metadata().map_err(|e| invalid(format!("cannot read {key} {shown}: {e}"), create_hint))?;
    if !meta.is_file() {
        return Err(invalid(format!("{key} {shown} is not a regular file"), create_hint));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(invalid(
            format!("{key} {shown} has mode {mode:04o}; it must not be readable by group or others"),
            "run `chmod 600` on it",
        ));
    }
    let mut content = Vec::new();
    handle
        .read_to_end(&mut content)
        .map_err(|e| invalid(format!("cannot read {key} {shown}: {e}"), "check the file's owner and mode"))?;
    if content.trim_ascii().is_empty() {
        return Err(invalid(format!("{key} {shown} is empty"), create_hint));
    }
    Ok(content)
}

#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub state_dir: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Dhcp {
    pub interfaces: Vec<String>,
    pub listen_relayed: bool,
    pub offer_hold_secs: u64,
    pub decline_probation_secs: u64,
    pub affinity_hold_secs: u64,
    pub ping_check: bool,
    pub ping_timeout_ms: u64,
    pub on_alias_busy: AliasBusyPolicy,
    /// The most pool addresses (after exclusions, all subnets together) this box will hold in
    /// memory; checked by arithmetic on the ranges before any address is enumerated.
    pub max_pool_addresses: u64,
}

/// Index of a subnet in [`Config::subnets`]; stable for the life of one loaded config.
pub type SubnetId = usize;
/// Index of a pool in [`Config::pools`].
pub type PoolId = usize;
/// Index of a network in [`Config::networks`].
pub type NetworkId = usize;

/// One network segment: a subnet, or several sharing one interface or relay
/// (`shared_network`). A client holds at most one address per network.
#[derive(Debug, Clone)]
pub struct Network {
    pub name: Option<String>,
    pub subnets: Vec<SubnetId>,
    /// The pools of its subnets, in the order they are tried.
    pub pools: Vec<PoolId>,
}

/// One pool: its addresses (after the subnet's exclusions), who may use it and its options.
#[derive(Debug, Clone)]
pub struct Pool {
    pub id: PoolId,
    pub subnet: SubnetId,
    pub addrs: AddrSet,
    /// Only clients in one of these classes (none: every client).
    pub allow: ClassSet,
    /// Never clients in one of these classes.
    pub deny: ClassSet,
    pub options: OptionSet,
}

impl Pool {
    /// Whether a client in `classes` may be given an address from this pool.
    pub fn admits(&self, classes: ClassSet) -> bool {
        ClassSet::admits(self.allow, self.deny, classes)
    }
}

#[derive(Debug, Clone)]
pub struct Subnet {
    pub id: SubnetId,
    pub net: Ipv4Net,
    pub network: NetworkId,
    /// The pools minus the exclusions, computed once when the file loads.
    dynamic: AddrSet,
    /// This subnet's pools, in the order they are tried.
    pub pools: Vec<PoolId>,
    pub lease_secs: u32,
    pub renew_secs: u32,
    pub rebind_secs: u32,
    pub routers: Vec<Ipv4Addr>,
    pub dns_servers: Vec<Ipv4Addr>,
    pub domain_name: Option<String>,
    pub ntp_servers: Vec<Ipv4Addr>,
    /// `[[subnet.option]]` plus mask, broadcast address and the keys above, encoded.
    pub options: OptionSet,
}

impl Subnet {
    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        self.net.contains(&addr)
    }

    /// Every address the allocator may hand out dynamically: pools minus exclusions, in
    /// ascending order, at no cost per exclusion. Reserved addresses are removed later by the
    /// allocator, which knows the reservations.
    pub fn dynamic_addresses(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.dynamic.iter()
    }

    /// The pools minus the exclusions, as ranges.
    pub fn dynamic(&self) -> &AddrSet {
        &self.dynamic
    }
}

/// An inclusive range of IPv4 addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrRange {
    pub first: Ipv4Addr,
    pub last: Ipv4Addr,
}

impl AddrRange {
    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        self.first <= addr && addr <= self.last
    }
    pub fn overlaps(&self, other: &AddrRange) -> bool {
        self.first <= other.last && other.first <= self.last
    }
    pub fn len(&self) -> u64 {
        u64::from(u32::from(self.last)) - u64::from(u32::from(self.first)) + 1
    }
    pub fn is_empty(&self) -> bool {
        false
    }
    pub fn iter(&self) -> impl Iterator<Item = Ipv4Addr> + use<> {
        (u32::from(self.first)..=u32::from(self.last)).map(Ipv4Addr::from)
    }
}

impl fmt::Display for AddrRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last { write!(f, "{}", self.first) } else { write!(f, "{}-{}", self.first, self.last) }
    }
}

/// A reserved address for one host or an alias group of hosts (seed 004: several hardware
/// addresses or client ids that may hold the address one at a time).
#[derive(Debug, Clone)]
pub struct Reservation {
    pub name: String,
    pub hw: Vec<[u8; 6]>,
    pub client_ids: Vec<Vec<u8>>,
    pub ip: Ipv4Addr,
    pub subnet: SubnetId,
    pub on_alias_busy: AliasBusyPolicy,
    /// Options for this host only (the most specific level).
    pub options: OptionSet,
}

impl Reservation {
    pub fn is_alias_group(&self) -> bool {
        self.hw.len() + self.client_ids.len() > 1
    }
}

/// The IPv4 addresses this host has, by interface; pools must not contain them.
#[derive(Debug, Clone, Default)]
pub struct LocalAddrs(pub Vec<(String, Ipv4Net)>);

impl LocalAddrs {
    /// The addresses of this host right now (in the current network namespace).
    pub fn of_this_host() -> LocalAddrs {
        let mut out = Vec::new();
        if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
            for ifa in addrs {
                let (Some(addr), Some(mask)) = (ifa.address, ifa.netmask) else { continue };
                let (Some(a), Some(m)) = (addr.as_sockaddr_in(), mask.as_sockaddr_in()) else {
                    continue;
                };
                let prefix = u32::from(m.ip()).leading_ones() as u8;
                if let Ok(net) = Ipv4Net::new(a.ip(), prefix) {
                    out.push((ifa.interface_name, net));
                }
            }
        }
        LocalAddrs(out)
    }

    pub fn find(&self, addr: Ipv4Addr) -> Option<&str> {
        self.0.iter().find(|(_, n)| n.addr() == addr).map(|(i, _)| i.as_str())
    }
}

/// A configuration error that names the file, the position and what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read the configuration file: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: {message}\n  fix: {hint}")]
    Invalid { path: PathBuf, line: usize, column: usize, message: String, hint: String },
}

impl Config {
    /// Reads, parses and validates `path` against the addresses of this host.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Self::load_with(path, &LocalAddrs::of_this_host())
    }

    pub fn load_with(path: &Path, local: &LocalAddrs) -> Result<Config, ConfigError> {
        let bytes = std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let text = validate::utf8(path, &bytes)?;
        Self::parse(path, text, local)
    }

    /// Reads every secret file the configuration names ([peer] key_file, [arbiter]
    /// password_file) with the checks `run` applies when it reads them.
    pub fn check_secret_files(&self) -> Result<(), ConfigError> {
        if let Some(peer) = &self.peer {
            peer.read_key()?;
        }
        if let Some(arbiter) = &self.arbiter {
            arbiter.read_password()?;
        }
        Ok(())
    }

    /// Pool addresses over all subnets (after exclusions; reservations inside pools included).
    pub fn pool_addresses(&self) -> u64 {
        self.subnets.iter().map(|s| s.dynamic.len()).sum()
    }

    /// Parses `text` as if it were the file `path` (used by tests and `check-config`).
    pub fn parse(path: &Path, text: &str, local: &LocalAddrs) -> Result<Config, ConfigError> {
        validate::parse(path, text, local)
    }

    pub fn lease_db_path(&self) -> PathBuf {
        self.node.state_dir.join("leases.db")
    }

    /// What differs between this (running) configuration and `new` that a running box cannot
    /// take over without a restart: its identity and directories, sockets, address pools and
    /// reservations (the allocator is built from them), the arbiter and the partner link.
    /// Lease times, options, hold and probation times and the log filter may change live.
    pub fn fixed_differences(&self, new: &Config) -> Vec<&'static str> {
        let (a, b) = (self, new);
        let subnet_shape = |c: &Config| c.subnets.iter().map(|s| (s.net, s.dynamic.clone())).collect::<Vec<_>>();
        let reservations = |c: &Config| {
            c.reservations
                .iter()
                .map(|r| (r.name.clone(), r.hw.clone(), r.client_ids.clone(), r.ip))
                .collect::<Vec<_>>()
        };
        let arbiter = |c: &Config| {
            c.arbiter.as_ref().map(|a| {
                let (files, tls) = ((a.password_file.clone(), a.ca_file.clone()), a.tls);
                (a.url.clone(), a.utype.clone(), a.interval, a.timeout, files, tls, a.endpoint.clone())
            })
        };
        let peer = |c: &Config| {
            c.peer.as_ref().map(|p| (p.listen, p.address, p.key_file.clone(), p.sync_mode, p.ack_timeout_ms))
        };
        let mut out = Vec::new();
        let mut check = |differs: bool, what: &'static str| {
            if differs {
                out.push(what);
            }
        };
        check((&a.node.name, &a.node.state_dir) != (&b.node.name, &b.node.state_dir), "[node]");
        check(a.dhcp.interfaces != b.dhcp.interfaces, "[dhcp] interfaces");
        check(a.dhcp.listen_relayed != b.dhcp.listen_relayed, "[dhcp] listen_relayed");
        check(a.dhcp.ping_check != b.dhcp.ping_check, "[dhcp] ping_check");
        check(a.dhcp.max_pool_addresses != b.dhcp.max_pool_addresses, "[dhcp] max_pool_addresses");
        check(subnet_shape(a) != subnet_shape(b), "[[subnet]] cidr, pools or exclusions");
        check(reservations(a) != reservations(b), "[[reservation]]");
        check(arbiter(a) != arbiter(b), "[arbiter]");
        check(peer(a) != peer(b), "[peer]");
        check(a.control != b.control, "[control]");
        check(a.metrics_listen != b.metrics_listen, "[metrics]");
        out
    }

    /// The subnet containing `addr`, if any.
    pub fn subnet_of(&self, addr: Ipv4Addr) -> Option<SubnetId> {
        self.subnets.iter().position(|s| s.contains(addr))
    }
}

#[cfg(test)]
mod tests;
