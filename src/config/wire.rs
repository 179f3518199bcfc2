//! The TOML file exactly as written: serde structs that reject unknown keys and keep the source
//! span of every value a later check may need to point at. Nothing here is trusted yet; see
//! `validate.rs` for the checks that turn this into [`super::Config`].

use serde::Deserialize;
use toml::Spanned;

/// Default location of the lease database and other local state.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/twinlease";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub node: Spanned<NodeSection>,
    #[serde(default = "default_dhcp")]
    pub dhcp: Spanned<DhcpSection>,
    #[serde(default)]
    pub subnet: Vec<Spanned<SubnetSection>>,
    #[serde(default)]
    pub reservation: Vec<Spanned<ReservationSection>>,
    #[serde(default)]
    pub log: LogSection,
    /// The partner box and the lease sync link; absent on a single box.
    pub peer: Option<Spanned<PeerSection>>,
}

fn default_dhcp() -> Spanned<DhcpSection> {
    Spanned::new(0..0, DhcpSection::default())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    pub name: Spanned<String>,
    #[serde(default = "default_state_dir")]
    pub state_dir: Spanned<String>,
}

fn default_state_dir() -> Spanned<String> {
    Spanned::new(0..0, DEFAULT_STATE_DIR.to_string())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DhcpSection {
    #[serde(default)]
    pub interfaces: Vec<Spanned<String>>,
    /// Also accept relayed requests (giaddr set) arriving on interfaces not listed above.
    #[serde(default = "yes")]
    pub listen_relayed: bool,
    #[serde(default = "default_offer_hold")]
    pub offer_hold_secs: Spanned<u64>,
    #[serde(default = "default_decline_probation")]
    pub decline_probation_secs: Spanned<u64>,
    #[serde(default = "default_affinity_hold")]
    pub affinity_hold_secs: Spanned<u64>,
    #[serde(default = "yes")]
    pub ping_check: bool,
    #[serde(default = "default_ping_timeout")]
    pub ping_timeout_ms: Spanned<u64>,
    #[serde(default)]
    pub on_alias_busy: AliasBusyPolicy,
}

impl Default for DhcpSection {
    fn default() -> Self {
        DhcpSection {
            interfaces: Vec::new(),
            listen_relayed: true,
            offer_hold_secs: default_offer_hold(),
            decline_probation_secs: default_decline_probation(),
            affinity_hold_secs: default_affinity_hold(),
            ping_check: true,
            ping_timeout_ms: default_ping_timeout(),
            on_alias_busy: AliasBusyPolicy::default(),
        }
    }
}

fn yes() -> bool {
    true
}
fn default_offer_hold() -> Spanned<u64> {
    Spanned::new(0..0, 30)
}
fn default_decline_probation() -> Spanned<u64> {
    Spanned::new(0..0, 600)
}
fn default_affinity_hold() -> Spanned<u64> {
    Spanned::new(0..0, 7200)
}
fn default_ping_timeout() -> Spanned<u64> {
    Spanned::new(0..0, 500)
}

/// What to do when a member of an alias group asks while another member holds the address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AliasBusyPolicy {
    /// Stay silent until the holder's lease ends or is released (seed 004).
    #[default]
    HoldOff,
    /// Abandon the holder's lease and give the address to the asker (dnsmasq).
    TakeOver,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubnetSection {
    pub cidr: Spanned<String>,
    #[serde(default)]
    pub pools: Vec<Spanned<String>>,
    #[serde(default)]
    pub exclude: Vec<Spanned<String>>,
    #[serde(default = "default_lease")]
    pub lease_secs: Spanned<u64>,
    /// T1; defaults to half the lease time.
    pub renew_secs: Option<Spanned<u64>>,
    /// T2; defaults to 7/8 of the lease time.
    pub rebind_secs: Option<Spanned<u64>>,
    #[serde(default)]
    pub routers: Vec<Spanned<String>>,
    #[serde(default)]
    pub dns_servers: Vec<Spanned<String>>,
    pub domain_name: Option<Spanned<String>>,
    #[serde(default)]
    pub ntp_servers: Vec<Spanned<String>>,
}

fn default_lease() -> Spanned<u64> {
    Spanned::new(0..0, 3600)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationSection {
    pub name: Spanned<String>,
    #[serde(default)]
    pub hw: Vec<Spanned<String>>,
    #[serde(default)]
    pub client_id: Vec<Spanned<String>>,
    pub ip: Spanned<String>,
    /// Overrides `[dhcp] on_alias_busy` for this group.
    pub on_alias_busy: Option<AliasBusyPolicy>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// A `RUST_LOG`-style filter; the `RUST_LOG` environment variable wins when set.
    pub filter: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSection {
    /// Where this box accepts the partner's connection ("IP:port").
    pub listen: Spanned<String>,
    /// Where the partner listens ("IP:port").
    pub address: Spanned<String>,
    /// Shared secret authenticating every frame on the link; must be mode 0600.
    pub key_file: Spanned<String>,
    #[serde(default)]
    pub sync_mode: SyncMode,
    #[serde(default = "default_ack_timeout")]
    pub ack_timeout_ms: Spanned<u64>,
}

/// When a DHCPACK may leave relative to the partner's acknowledgement of the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SyncMode {
    /// Hold the ACK until the partner has the lease on disk (bounded by ack_timeout_ms).
    #[default]
    BeforeAck,
    /// Send the ACK once the lease is on local disk; the update follows.
    AfterAck,
}

fn default_ack_timeout() -> Spanned<u64> {
    Spanned::new(0..0, 200)
}
