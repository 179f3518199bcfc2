//! The vocabulary shared by the allocator, the lease store, the DHCP decisions and lease sync:
//! who a client is, what state an address is in, and a compare-and-swap change of one address.

use std::fmt;
use std::net::Ipv4Addr;

/// Seconds since the Unix epoch (UTC). Lease times are wall-clock so they survive restarts;
/// decision code receives "now" from its caller and never reads a clock itself.
pub type UnixSecs = u64;

/// A client's identity: its client identifier (option 61) when it sends one, else its hardware
/// type and address (RFC 2131 §4.2). The first byte tags which, so the two never collide.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientKey(Box<[u8]>);

const TAG_CLIENT_ID: u8 = 0;
const TAG_HW: u8 = 1;

impl ClientKey {
    pub fn from_client_id(id: &[u8]) -> ClientKey {
        let mut v = Vec::with_capacity(id.len() + 1);
        v.push(TAG_CLIENT_ID);
        v.extend_from_slice(id);
        ClientKey(v.into())
    }

    pub fn from_hw(htype: u8, chaddr: &[u8]) -> ClientKey {
        let mut v = Vec::with_capacity(chaddr.len() + 2);
        v.extend_from_slice(&[TAG_HW, htype]);
        v.extend_from_slice(chaddr);
        ClientKey(v.into())
    }

    /// The stored form (as written by [`ClientKey::as_bytes`]); `None` if it is not one.
    pub fn from_bytes(b: &[u8]) -> Option<ClientKey> {
        match b.first() {
            Some(&TAG_CLIENT_ID) if b.len() > 1 => Some(ClientKey(b.into())),
            Some(&TAG_HW) if b.len() > 2 => Some(ClientKey(b.into())),
            _ => None,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

fn hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            f.write_str(":")?;
        }
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0[0] {
            TAG_CLIENT_ID => {
                f.write_str("id:")?;
                hex(f, &self.0[1..])
            }
            _ if self.0[1] == 1 => {
                f.write_str("hw:")?;
                hex(f, &self.0[2..])
            }
            _ => {
                write!(f, "hw{}:", self.0[1])?;
                hex(f, &self.0[2..])
            }
        }
    }
}

impl fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Formats a hardware address as colon-separated hex.
pub fn fmt_hw(bytes: &[u8]) -> String {
    struct H<'a>(&'a [u8]);
    impl fmt::Display for H<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            hex(f, self.0)
        }
    }
    H(bytes).to_string()
}

/// The state of one address. Everything but `Free` is "busy" and carries an owner and an expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LeaseState {
    /// In the queue; `expires` is the time it becomes available to clients other than `owner`.
    Free,
    /// An ICMP echo is in flight before the address is offered.
    Probing,
    /// Offered to `owner`, held until `expires`.
    Offered,
    /// Leased to `owner` until `expires`.
    Leased,
    /// Declined by a client or found in use; out of service until `expires`.
    Declined,
}

impl LeaseState {
    pub fn is_busy(self) -> bool {
        self != LeaseState::Free
    }

    pub fn code(self) -> i64 {
        match self {
            LeaseState::Free => 0,
            LeaseState::Offered => 1,
            LeaseState::Leased => 2,
            LeaseState::Declined => 3,
            LeaseState::Probing => 4,
        }
    }

    pub fn from_code(c: i64) -> Option<LeaseState> {
        Some(match c {
            0 => LeaseState::Free,
            1 => LeaseState::Offered,
            2 => LeaseState::Leased,
            3 => LeaseState::Declined,
            4 => LeaseState::Probing,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            LeaseState::Free => "free",
            LeaseState::Probing => "probing",
            LeaseState::Offered => "offered",
            LeaseState::Leased => "leased",
            LeaseState::Declined => "declined",
        }
    }
}

/// Everything known about one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub addr: Ipv4Addr,
    pub state: LeaseState,
    /// Busy: the holder. Free: the previous holder, who gets the address back first (affinity).
    pub owner: Option<ClientKey>,
    /// Busy: when it ends. Free: when it becomes available to everyone (the queue key).
    pub expires: UnixSecs,
    /// Client last transaction time.
    pub cltt: UnixSecs,
    /// Bumped by every change; compare-and-swap checks it.
    pub version: u64,
    /// Election term under which the change was made (fencing token for lease sync).
    pub term: u64,
    /// Causal counter of this address's content: every change sets it one above the content it
    /// replaces, and a copy from the partner keeps it. Unlike `version` (local to each box) it
    /// is the same on both boxes, so the conflict rule can order changes made within one second.
    pub seq: u64,
    /// Hardware address of the last client, for display.
    pub hw: Vec<u8>,
    pub hostname: Option<String>,
}

impl Binding {
    /// A never-used address: free and available since the epoch.
    pub fn fresh(addr: Ipv4Addr) -> Binding {
        Binding {
            addr,
            state: LeaseState::Free,
            owner: None,
            expires: 0,
            cltt: 0,
            version: 0,
            term: 0,
            seq: 0,
            hw: Vec::new(),
            hostname: None,
        }
    }

    /// Busy and not yet past its expiry.
    pub fn is_live(&self, now: UnixSecs) -> bool {
        self.state.is_busy() && self.expires > now
    }

    pub fn is_owned_by(&self, client: &ClientKey) -> bool {
        self.owner.as_ref() == Some(client)
    }
}

/// A compare-and-swap on one address: applies only if the address still has `expect_version`
/// and `expect_owner`; `new.version` is always `expect_version + 1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub expect_version: u64,
    pub expect_owner: Option<ClientKey>,
    pub new: Binding,
}
