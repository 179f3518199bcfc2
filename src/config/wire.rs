//! The TOML file exactly as written: serde structs that reject unknown keys and keep the source
//! span of every value a later check may need to point at. Nothing here is trusted yet; see
//! `validate.rs` for the checks that turn this into [`super::Config`].

use serde::Deserialize;
use toml::Spanned;

/// Default location of the lease database and other local state.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/twinlease";

/// Default `[dhcp] max_pool_addresses`: the lease count a branch box's memory budget is sized for.
pub const DEFAULT_MAX_POOL_ADDRESSES: u64 = 65_536;

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
    /// Options for every client (the least specific level).
    #[serde(default)]
    pub option: Vec<Spanned<OptionSection>>,
    /// Names (and types) for option codes twinlease does not know.
    #[serde(default)]
    pub option_def: Vec<Spanned<OptionDefSection>>,
    #[serde(default)]
    pub class: Vec<Spanned<ClassSection>>,
    #[serde(default)]
    pub log: LogSection,
    /// Absent: a single box, always active.
    pub arbiter: Option<Spanned<ArbiterSection>>,
    /// The partner box and the lease sync link; absent on a single box.
    pub peer: Option<Spanned<PeerSection>>,
    #[serde(default)]
    pub control: ControlSection,
    /// Absent: no metrics listener (`twinlease status --format prometheus` still works).
    pub metrics: Option<Spanned<MetricsSection>>,
}

/// Default directory of the status and control sockets (systemd's `RuntimeDirectory=`).
pub const DEFAULT_RUNTIME_DIR: &str = "/run/twinlease";

/// `[control]`: the status and control sockets.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlSection {
    #[serde(default = "default_runtime_dir")]
    pub runtime_dir: Spanned<String>,
    /// Group that may read `status.sock`.
    #[serde(default = "default_status_group")]
    pub status_group: String,
    /// Group that may use `control.sock` (besides root).
    #[serde(default = "default_admin_group")]
    pub admin_group: String,
    /// Where the firmware image's update socket is: the control socket's `update-*` commands
    /// are passed on to it.
    #[serde(default = "default_update_socket")]
    pub update_socket: Spanned<String>,
}

impl Default for ControlSection {
    fn default() -> Self {
        ControlSection {
            runtime_dir: default_runtime_dir(),
            status_group: default_status_group(),
            admin_group: default_admin_group(),
            update_socket: default_update_socket(),
        }
    }
}

fn default_runtime_dir() -> Spanned<String> {
    Spanned::new(0..0, DEFAULT_RUNTIME_DIR.to_string())
}

fn default_update_socket() -> Spanned<String> {
    Spanned::new(0..0, crate::update::socket::SOCKET.to_string())
}

fn default_status_group() -> String {
    "twinlease".into()
}

fn default_admin_group() -> String {
    "twinlease-admin".into()
}

/// `[metrics]`: the Prometheus text format over HTTP.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    pub listen: Spanned<String>,
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
    /// The most pool addresses (all subnets, after exclusions) this box accepts.
    #[serde(default = "default_max_pool_addresses")]
    pub max_pool_addresses: Spanned<u64>,
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
            max_pool_addresses: default_max_pool_addresses(),
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
fn default_max_pool_addresses() -> Spanned<u64> {
    Spanned::new(0..0, DEFAULT_MAX_POOL_ADDRESSES)
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
    /// Subnets with the same name share one network segment (one interface or one relay).
    pub shared_network: Option<Spanned<String>>,
    /// Pools with their own classes or options; used after the plain `pools`, in file order.
    #[serde(default)]
    pub pool: Vec<Spanned<PoolSection>>,
    #[serde(default)]
    pub option: Vec<Spanned<OptionSection>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    /// "first-last", a cidr or one address.
    pub range: Spanned<String>,
    /// Only clients in one of these classes use the pool (empty: every client).
    #[serde(default)]
    pub allow_classes: Vec<Spanned<String>>,
    /// Clients in any of these classes never use the pool.
    #[serde(default)]
    pub deny_classes: Vec<Spanned<String>>,
    #[serde(default)]
    pub option: Vec<Spanned<OptionSection>>,
}

/// One option value at some level; `name` (built in or from `[[option_def]]`) or `code` (with
/// `type` when the code has no definition).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptionSection {
    pub name: Option<Spanned<String>>,
    pub code: Option<Spanned<i64>>,
    #[serde(rename = "type")]
    pub kind: Option<Spanned<String>>,
    pub value: Option<Spanned<toml::Value>>,
    /// Send it even when the client's parameter request list does not name it.
    #[serde(default)]
    pub always_send: bool,
    /// Option 125 only: the enterprise number the sub-options belong to.
    pub enterprise: Option<Spanned<i64>>,
    /// Option 43 or 125: sub-options instead of a raw value.
    #[serde(default)]
    pub sub: Vec<Spanned<SubOptionSection>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubOptionSection {
    pub code: Spanned<i64>,
    #[serde(rename = "type")]
    pub kind: Spanned<String>,
    pub value: Spanned<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptionDefSection {
    pub name: Spanned<String>,
    pub code: Spanned<i64>,
    #[serde(rename = "type")]
    pub kind: Spanned<String>,
}

/// A client class: every match given must hold (any pattern of a list will do).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSection {
    pub name: Spanned<String>,
    #[serde(default)]
    pub vendor_class: Vec<Spanned<String>>,
    #[serde(default)]
    pub user_class: Vec<Spanned<String>>,
    #[serde(default)]
    pub hw_prefix: Vec<Spanned<String>>,
    #[serde(default)]
    pub circuit_id: Vec<Spanned<String>>,
    #[serde(default)]
    pub remote_id: Vec<Spanned<String>>,
    #[serde(default)]
    pub interface: Vec<Spanned<String>>,
    #[serde(default)]
    pub relay: Vec<Spanned<String>>,
    #[serde(default)]
    pub option: Vec<Spanned<OptionSection>>,
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
    /// Options for this host only (the most specific level).
    #[serde(default)]
    pub option: Vec<Spanned<OptionSection>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// A `RUST_LOG`-style filter; the `RUST_LOG` environment variable wins when set.
    pub filter: Option<Spanned<String>>,
}

/// The election arbiter (seeds 000–002): a SQL database at head office both boxes reach.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArbiterSection {
    /// postgres://user@host/db, mysql://user@host/db, or sqlite:///absolute/path.
    pub url: Spanned<String>,
    /// The service both boxes elect a primary for, e.g. "branch42/dhcp".
    pub utype: Spanned<String>,
    /// I: how often each box talks to the arbiter.
    #[serde(default = "default_interval")]
    pub interval_ms: Spanned<u64>,
    /// T: how long a heartbeat is valid. T > 2I.
    #[serde(default = "default_timeout")]
    pub timeout_ms: Spanned<u64>,
    /// A file holding the database password (overrides a password in the url).
    pub password_file: Option<Spanned<String>>,
    #[serde(default)]
    pub tls: TlsMode,
    /// PEM file with the CA certificate(s) to trust instead of the system's.
    pub ca_file: Option<Spanned<String>>,
    /// Where this box can be reached, shown by `whois` (defaults to the node name).
    pub endpoint: Option<Spanned<String>>,
}

fn default_interval() -> Spanned<u64> {
    Spanned::new(0..0, 1000)
}
fn default_timeout() -> Spanned<u64> {
    Spanned::new(0..0, 5000)
}

/// TLS to the arbiter (ignored for sqlite).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// Verified TLS or no connection.
    #[default]
    Require,
    /// Verified TLS when the server offers it, plain otherwise.
    Prefer,
    /// Plain TCP (a trusted network only).
    Off,
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
