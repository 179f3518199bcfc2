//! The messages two boxes exchange on the peer link, and their byte encoding.
//!
//! The encoding is a small hand-written binary format (big-endian integers, length-prefixed
//! byte strings): every length is checked against what is left of the frame before anything is
//! allocated, and a message must use its frame exactly, so a malformed frame is an error and
//! never a partial message. Frames are authenticated before they get here (`frame.rs`).

use std::net::Ipv4Addr;

use crate::lease::{Binding, ClientKey, LeaseState};

/// Bumped when the message set changes incompatibly; a mismatch closes the link (and is logged
/// with both versions). 2: Hello carries the configuration digest. 3: the election's votes.
pub const PROTOCOL_VERSION: u16 = 3;

/// Largest number of bindings in one Updates message (catch-up pages are this size).
pub const MAX_ENTRIES: usize = 4096;

/// What a node asks its partner to send on (re)connect (seed 003's "SYNC FROM …").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUpRequest {
    /// Only what the partner holds that this node has not acknowledged.
    Unsynced,
    /// Everything: this node's store is new or wiped, so its marks mean nothing.
    Full,
}

/// Why a batch of bindings is sent; decides how the receiver merges them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    /// A change just made by the sender.
    Live,
    /// A page of catch-up after a (re)connect.
    CatchUp,
    /// Content of a /24 whose digest differed: merged by the conflict rule alone.
    Repair,
}

/// What the receiver did with one binding of an Updates batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryOutcome {
    /// The receiver now holds exactly the content sent: the sender marks it synced.
    Applied,
    /// The receiver holds other content that wins (conflict rule or fencing); the sender
    /// merges it.
    Superseded(Binding),
    /// The receiver does not manage this address (the two configs differ).
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryResult {
    pub addr: Ipv4Addr,
    /// The sender's version, echoed so the sender's mark compares against it.
    pub version: u64,
    pub outcome: EntryOutcome,
}

/// Per /24: how many bindings with history it has and a hash of their replicated content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bucket {
    pub prefix: u32,
    pub count: u32,
    pub hash: u64,
}

/// The election's messages: the partner box as the third voter (`election::peer`). The lease
/// sync machine never sees them; the replication driver hands them to the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vote {
    /// "Promise me not to become active": request `id` of process `uuid`, which knows `term`
    /// and is `active` or not.
    Ask { uuid: u128, id: u64, term: u64, active: bool },
    /// The answer to request `id` of process `to`.
    Answer { to: u128, id: u64, granted: bool, term: u64 },
    /// Process `from` no longer counts promises for its requests up to `up_to`.
    Release { from: u128, up_to: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// First message of a session in each direction.
    Hello {
        node: String,
        store_id: u64,
        catch_up: CatchUpRequest,
        term: Option<u64>,
        /// The sender's [`crate::config::ConfigDigest`]: both boxes must answer alike.
        config_digest: [u8; 32],
    },
    Updates {
        batch: u64,
        kind: UpdateKind,
        entries: Vec<Binding>,
    },
    Acks {
        batch: u64,
        results: Vec<EntryResult>,
    },
    /// The sender has sent every catch-up page (`entries` bindings in all).
    CatchUpDone {
        entries: u64,
    },
    Digest {
        buckets: Vec<Bucket>,
    },
    Heartbeat {
        sent_ms: u64,
    },
    HeartbeatAck {
        echo_ms: u64,
    },
    Vote(Vote),
}

impl Message {
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Updates { .. } => "updates",
            Message::Acks { .. } => "acks",
            Message::CatchUpDone { .. } => "catch-up-done",
            Message::Digest { .. } => "digest",
            Message::Heartbeat { .. } => "heartbeat",
            Message::HeartbeatAck { .. } => "heartbeat-ack",
            Message::Vote(Vote::Ask { .. }) => "vote-ask",
            Message::Vote(Vote::Answer { .. }) => "vote-answer",
            Message::Vote(Vote::Release { .. }) => "vote-release",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("message truncated")]
    Truncated,
    #[error("{0} bytes left over after the message")]
    Trailing(usize),
    #[error("unknown message tag {0}")]
    Tag(u8),
    #[error("bad value for {0}")]
    Bad(&'static str),
    #[error("{what}: {n} is more than the limit {max}")]
    TooMany { what: &'static str, n: usize, max: usize },
    #[error(
        "the partner speaks sync protocol version {0}, this box {PROTOCOL_VERSION}: run the same twinlease release on both boxes"
    )]
    Version(u16),
}

// ---- encoding --------------------------------------------------------------------------------

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u128(&mut self, v: u128) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn vote(&mut self, v: &Vote) {
        match *v {
            Vote::Ask { uuid, id, term, active } => {
                self.u8(8);
                self.u128(uuid);
                self.u64(id);
                self.u64(term);
                self.u8(u8::from(active));
            }
            Vote::Answer { to, id, granted, term } => {
                self.u8(9);
                self.u128(to);
                self.u64(id);
                self.u8(u8::from(granted));
                self.u64(term);
            }
            Vote::Release { from, up_to } => {
                self.u8(10);
                self.u128(from);
                self.u64(up_to);
            }
        }
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u16(b.len() as u16);
        self.0.extend_from_slice(b);
    }
    fn binding(&mut self, b: &Binding) {
        self.u32(u32::from(b.addr));
        self.u8(b.state.code() as u8);
        match &b.owner {
            Some(o) => {
                self.u8(1);
                self.bytes(o.as_bytes());
            }
            None => self.u8(0),
        }
        self.u64(b.expires);
        self.u64(b.cltt);
        self.u64(b.version);
        self.u64(b.term);
        self.u64(b.seq);
        self.bytes(&b.hw);
        match &b.hostname {
            Some(h) => {
                self.u8(1);
                self.bytes(h.as_bytes());
            }
            None => self.u8(0),
        }
    }
}

/// Byte strings in a binding are capped well below u16::MAX so encoding never truncates.
const MAX_FIELD: usize = 512;

/// The bytes of `b` that both boxes must agree on (everything but the local version); the
/// digest hashes these.
pub fn content_bytes(b: &Binding, out: &mut Vec<u8>) {
    let mut w = W(std::mem::take(out));
    let mut c = b.clone();
    c.version = 0;
    w.binding(&c);
    *out = w.0;
}

pub fn encode(m: &Message) -> Vec<u8> {
    let mut w = W(Vec::with_capacity(64));
    match m {
        Message::Hello { node, store_id, catch_up, term, config_digest } => {
            w.u8(1);
            w.u16(PROTOCOL_VERSION);
            w.bytes(&node.as_bytes()[..node.len().min(MAX_FIELD)]);
            w.u64(*store_id);
            w.u8(match catch_up {
                CatchUpRequest::Unsynced => 0,
                CatchUpRequest::Full => 1,
            });
            match term {
                Some(t) => {
                    w.u8(1);
                    w.u64(*t);
                }
                None => w.u8(0),
            }
            w.0.extend_from_slice(config_digest);
        }
        Message::Updates { batch, kind, entries } => {
            w.u8(2);
            w.u64(*batch);
            w.u8(match kind {
                UpdateKind::Live => 0,
                UpdateKind::CatchUp => 1,
                UpdateKind::Repair => 2,
            });
            w.u32(entries.len() as u32);
            for b in entries {
                w.binding(b);
            }
        }
        Message::Acks { batch, results } => {
            w.u8(3);
            w.u64(*batch);
            w.u32(results.len() as u32);
            for r in results {
                w.u32(u32::from(r.addr));
                w.u64(r.version);
                match &r.outcome {
                    EntryOutcome::Applied => w.u8(0),
                    EntryOutcome::Superseded(b) => {
                        w.u8(1);
                        w.binding(b);
                    }
                    EntryOutcome::Unknown => w.u8(2),
                }
            }
        }
        Message::CatchUpDone { entries } => {
            w.u8(4);
            w.u64(*entries);
        }
        Message::Digest { buckets } => {
            w.u8(5);
            w.u32(buckets.len() as u32);
            for b in buckets {
                w.u32(b.prefix);
                w.u32(b.count);
                w.u64(b.hash);
            }
        }
        Message::Heartbeat { sent_ms } => {
            w.u8(6);
            w.u64(*sent_ms);
        }
        Message::HeartbeatAck { echo_ms } => {
            w.u8(7);
            w.u64(*echo_ms);
        }
        Message::Vote(v) => w.vote(v),
    }
    w.0
}

// ---- decoding --------------------------------------------------------------------------------

struct R<'a>(&'a [u8]);

impl<'a> R<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn u128(&mut self) -> Result<u128, DecodeError> {
        Ok(u128::from_be_bytes(self.take(16)?.try_into().expect("16 bytes")))
    }
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = usize::from(self.u16()?);
        if n > MAX_FIELD {
            return Err(DecodeError::TooMany { what: "field length", n, max: MAX_FIELD });
        }
        self.take(n)
    }
    fn flag(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Bad(what)),
        }
    }
    /// A count of items each at least `min_size` bytes long: bounded by what is left.
    fn count(&mut self, what: &'static str, max: usize, min_size: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(DecodeError::TooMany { what, n, max });
        }
        if n.saturating_mul(min_size) > self.0.len() {
            return Err(DecodeError::Truncated);
        }
        Ok(n)
    }
    fn binding(&mut self) -> Result<Binding, DecodeError> {
        let addr = Ipv4Addr::from(self.u32()?);
        let state = LeaseState::from_code(i64::from(self.u8()?)).ok_or(DecodeError::Bad("state"))?;
        let owner = if self.flag("owner flag")? {
            Some(ClientKey::from_bytes(self.bytes()?).ok_or(DecodeError::Bad("client key"))?)
        } else {
            None
        };
        let expires = self.u64()?;
        let cltt = self.u64()?;
        let version = self.u64()?;
        let term = self.u64()?;
        let seq = self.u64()?;
        let hw = self.bytes()?.to_vec();
        let hostname = if self.flag("hostname flag")? {
            Some(String::from_utf8(self.bytes()?.to_vec()).map_err(|_| DecodeError::Bad("hostname"))?)
        } else {
            None
        };
        if state.is_busy() && owner.is_none() && state != LeaseState::Declined {
            return Err(DecodeError::Bad("busy binding without an owner"));
        }
        // Times are stored as SQLite integers; keep them in range.
        if [expires, cltt, version, term, seq].iter().any(|v| *v > i64::MAX as u64) {
            return Err(DecodeError::Bad("integer out of range"));
        }
        Ok(Binding { addr, state, owner, expires, cltt, version, term, seq, hw, hostname })
    }
}

/// Smallest encoded binding: addr, state, owner flag, 5 × u64, hw length, hostname flag.
const MIN_BINDING: usize = 4 + 1 + 1 + 40 + 2 + 1;

pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let mut r = R(bytes);
    let m = match r.u8()? {
        1 => {
            let version = r.u16()?;
            if version != PROTOCOL_VERSION {
                return Err(DecodeError::Version(version));
            }
            let node = String::from_utf8(r.bytes()?.to_vec()).map_err(|_| DecodeError::Bad("node name"))?;
            let store_id = r.u64()?;
            let catch_up = match r.u8()? {
                0 => CatchUpRequest::Unsynced,
                1 => CatchUpRequest::Full,
                _ => return Err(DecodeError::Bad("catch-up request")),
            };
            let term = if r.flag("term flag")? { Some(r.u64()?) } else { None };
            let config_digest = r.take(32)?.try_into().expect("32 bytes");
            Message::Hello { node, store_id, catch_up, term, config_digest }
        }
        2 => {
            let batch = r.u64()?;
            let kind = match r.u8()? {
                0 => UpdateKind::Live,
                1 => UpdateKind::CatchUp,
                2 => UpdateKind::Repair,
                _ => return Err(DecodeError::Bad("update kind")),
            };
            let n = r.count("entries", MAX_ENTRIES, MIN_BINDING)?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push(r.binding()?);
            }
            Message::Updates { batch, kind, entries }
        }
        3 => {
            let batch = r.u64()?;
            let n = r.count("results", MAX_ENTRIES, 13)?;
            let mut results = Vec::with_capacity(n);
            for _ in 0..n {
                let addr = Ipv4Addr::from(r.u32()?);
                let version = r.u64()?;
                let outcome = match r.u8()? {
                    0 => EntryOutcome::Applied,
                    1 => EntryOutcome::Superseded(r.binding()?),
                    2 => EntryOutcome::Unknown,
                    _ => return Err(DecodeError::Bad("entry outcome")),
                };
                results.push(EntryResult { addr, version, outcome });
            }
            Message::Acks { batch, results }
        }
        4 => Message::CatchUpDone { entries: r.u64()? },
        5 => {
            let n = r.count("buckets", 1 << 24, 16)?;
            let mut buckets = Vec::with_capacity(n);
            for _ in 0..n {
                buckets.push(Bucket { prefix: r.u32()?, count: r.u32()?, hash: r.u64()? });
            }
            Message::Digest { buckets }
        }
        6 => Message::Heartbeat { sent_ms: r.u64()? },
        7 => Message::HeartbeatAck { echo_ms: r.u64()? },
        8 => {
            let (uuid, id, term) = (r.u128()?, r.u64()?, r.u64()?);
            Message::Vote(Vote::Ask { uuid, id, term, active: r.flag("active flag")? })
        }
        9 => {
            let (to, id) = (r.u128()?, r.u64()?);
            let granted = r.flag("granted flag")?;
            Message::Vote(Vote::Answer { to, id, granted, term: r.u64()? })
        }
        10 => Message::Vote(Vote::Release { from: r.u128()?, up_to: r.u64()? }),
        t => return Err(DecodeError::Tag(t)),
    };
    if !r.0.is_empty() {
        return Err(DecodeError::Trailing(r.0.len()));
    }
    Ok(m)
}
