//! Configuration: the TOML file (`wire`), the checks (`validate`) and the validated types the rest
//! of the program uses. Everything past `Config::load` can trust what it gets.

mod validate;
pub mod wire;

use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;

pub use wire::{AliasBusyPolicy, SyncMode};

/// A configuration that passed every check.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub node: Node,
    pub dhcp: Dhcp,
    pub subnets: Vec<Subnet>,
    pub reservations: Vec<Reservation>,
    pub log_filter: Option<String>,
    pub peer: Option<Peer>,
}

/// The partner box and how leases are synced to it.
#[derive(Debug, Clone)]
pub struct Peer {
    pub listen: std::net::SocketAddr,
    pub address: std::net::SocketAddr,
    pub key_file: PathBuf,
    /// Where `key_file` is written in the configuration, for errors found when it is read.
    pub key_file_at: (PathBuf, usize, usize),
    pub sync_mode: SyncMode,
    pub ack_timeout_ms: u64,
}

impl Peer {
    /// Reads the shared key. Refuses a key readable by group or others (it authenticates every
    /// lease the partner will store) and one too short to be a real secret.
    pub fn read_key(&self) -> Result<Vec<u8>, ConfigError> {
        use std::os::unix::fs::PermissionsExt;
        let (path, line, column) = self.key_file_at.clone();
        let invalid = |message: String, hint: &str| ConfigError::Invalid { path: path.clone(), line, column, message, hint: hint.to_string() };
        let meta = std::fs::metadata(&self.key_file).map_err(|e| invalid(format!("cannot read key_file {}: {e}", self.key_file.display()), "create it with `head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE` and copy it to the partner"))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(invalid(format!("key_file {} has mode {mode:04o}; it must not be readable by group or others", self.key_file.display()), "run `chmod 600` on it"));
        }
        let text = std::fs::read(&self.key_file).map_err(|e| invalid(format!("cannot read key_file {}: {e}", self.key_file.display()), "check the file's owner and mode"))?;
        let key: Vec<u8> = text.trim_ascii().to_vec();
        if key.len() < 16 {
            return Err(invalid(format!("key_file {} holds {} bytes; at least 16 are needed", self.key_file.display(), key.len()), "use `head -c 32 /dev/urandom | base64` for a key"));
        }
        Ok(key)
    }
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
}

/// Index of a subnet in [`Config::subnets`]; stable for the life of one loaded config.
pub type SubnetId = usize;

#[derive(Debug, Clone)]
pub struct Subnet {
    pub net: Ipv4Net,
    pub pools: Vec<AddrRange>,
    pub exclude: Vec<AddrRange>,
    pub lease_secs: u32,
    pub renew_secs: u32,
    pub rebind_secs: u32,
    pub routers: Vec<Ipv4Addr>,
    pub dns_servers: Vec<Ipv4Addr>,
    pub domain_name: Option<String>,
    pub ntp_servers: Vec<Ipv4Addr>,
}

impl Subnet {
    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        self.net.contains(&addr)
    }

    /// Every address the allocator may hand out dynamically: pools minus exclusions.
    /// Reserved addresses are removed later by the allocator, which knows the reservations.
    pub fn dynamic_addresses(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.pools
            .iter()
            .flat_map(|r| r.iter())
            .filter(|a| !self.exclude.iter().any(|x| x.contains(*a)))
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
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
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
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Self::parse(path, &text, local)
    }

    /// Parses `text` as if it were the file `path` (used by tests and `check-config`).
    pub fn parse(path: &Path, text: &str, local: &LocalAddrs) -> Result<Config, ConfigError> {
        validate::parse(path, text, local)
    }

    pub fn lease_db_path(&self) -> PathBuf {
        self.node.state_dir.join("leases.db")
    }

    /// The subnet containing `addr`, if any.
    pub fn subnet_of(&self, addr: Ipv4Addr) -> Option<SubnetId> {
        self.subnets.iter().position(|s| s.contains(addr))
    }
}

#[cfg(test)]
mod tests;
