//! Frames on the peer link: `u32 length | u64 sequence | body | HMAC-SHA256 tag`.
//!
//! A connection starts with one handshake frame each way: the sender's side of the connection
//! (it dialled, or it accepted), its node name and a fresh random nonce, tagged with the key.
//! A box refuses a handshake that claims its own side: of two boxes that are *both* accepting
//! (an attacker relaying between their listeners) or both dialling, neither gets a session.
//!
//! Both ends then derive the same *transcript* from the two handshakes, ordered by side
//! (dialler's name and nonce, then the acceptor's). Every later frame's tag covers the
//! transcript, the direction (dialler → acceptor or back), its sequence number and its body;
//! sequence numbers start at 1 and go up by one. So a frame is accepted once, on the
//! connection it was made for, between the two named boxes, in the direction it was sent: a
//! replayed, reordered, reflected, relayed or forged frame fails and closes the connection.
//! A replayed handshake alone proves nothing (the replayer cannot answer the fresh nonce),
//! which is why the link counts a connection as up only once a data frame has been verified.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

pub const NONCE_LEN: usize = 16;
const TAG_LEN: usize = 32;
const SEQ_LEN: usize = 8;
/// Largest frame accepted (a full page of catch-up is well below this).
pub const MAX_FRAME: usize = 4 << 20;

const HELLO_LABEL: &[u8] = b"twinlease/2 handshake";
const TRANSCRIPT_LABEL: &[u8] = b"twinlease/2 transcript";
const DATA_LABEL: &[u8] = b"twinlease/2 data";

/// Which end of the TCP connection a box is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Dialer,
    Acceptor,
}

impl Side {
    fn code(self) -> u8 {
        match self {
            Side::Dialer => 1,
            Side::Acceptor => 2,
        }
    }

    fn from_code(c: u8) -> Option<Side> {
        match c {
            1 => Some(Side::Dialer),
            2 => Some(Side::Acceptor),
            _ => None,
        }
    }

    fn other(self) -> Side {
        match self {
            Side::Dialer => Side::Acceptor,
            Side::Acceptor => Side::Dialer,
        }
    }
}

/// One box's handshake: which side it is, its name, its nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub side: Side,
    pub node: String,
    pub nonce: [u8; NONCE_LEN],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is outside the allowed size")]
    Size(usize),
    #[error("authentication failed (wrong key, forged or altered frame)")]
    BadTag,
    #[error("sequence number {got} where {want} was due (replayed or reordered frame)")]
    Sequence { got: u64, want: u64 },
    #[error("malformed handshake")]
    Handshake,
    #[error("the other end claims to be the {0:?} too (a relayed or reflected handshake)")]
    SameSide(Side),
}

pub fn random_nonce() -> [u8; NONCE_LEN] {
    use std::io::Read;
    let mut n = [0u8; NONCE_LEN];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut n)).is_err() {
        // Without a random source every session would be replayable: refuse to run.
        panic!("cannot read /dev/urandom for a session nonce");
    }
    n
}

fn mac(key: &[u8]) -> HmacSha256 {
    <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length")
}

fn frame(seq: u64, body: &[u8], tag: &[u8]) -> Vec<u8> {
    let len = SEQ_LEN + body.len() + TAG_LEN;
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(body);
    out.extend_from_slice(tag);
    out
}

/// Splits a frame (without its length prefix) into (sequence, body, tag).
fn split(f: &[u8]) -> Result<(u64, &[u8], &[u8]), FrameError> {
    if f.len() < SEQ_LEN + TAG_LEN || f.len() > MAX_FRAME {
        return Err(FrameError::Size(f.len()));
    }
    let (seq, rest) = f.split_at(SEQ_LEN);
    let (body, tag) = rest.split_at(rest.len() - TAG_LEN);
    Ok((u64::from_be_bytes(seq.try_into().expect("8 bytes")), body, tag))
}

/// A node name as it travels: one length byte, at most 255 bytes of name.
fn name_bytes(node: &str) -> &[u8] {
    &node.as_bytes()[..node.len().min(255)]
}

/// The handshake frame: side, node name and nonce, tagged with the key alone.
pub fn seal_handshake(key: &[u8], hello: &Hello) -> Vec<u8> {
    let name = name_bytes(&hello.node);
    let mut body = Vec::with_capacity(2 + name.len() + NONCE_LEN);
    body.push(hello.side.code());
    body.push(name.len() as u8);
    body.extend_from_slice(name);
    body.extend_from_slice(&hello.nonce);
    let mut m = mac(key);
    m.update(HELLO_LABEL);
    m.update(&body);
    frame(0, &body, &m.finalize().into_bytes())
}

pub fn open_handshake(key: &[u8], f: &[u8]) -> Result<Hello, FrameError> {
    let (seq, body, tag) = split(f)?;
    let mut m = mac(key);
    m.update(HELLO_LABEL);
    m.update(body);
    m.verify_slice(tag).map_err(|_| FrameError::BadTag)?;
    let [side, n, rest @ ..] = body else { return Err(FrameError::Handshake) };
    let (side, n) = (Side::from_code(*side).ok_or(FrameError::Handshake)?, usize::from(*n));
    if seq != 0 || rest.len() != n + NONCE_LEN {
        return Err(FrameError::Handshake);
    }
    let node = String::from_utf8(rest[..n].to_vec()).map_err(|_| FrameError::Handshake)?;
    Ok(Hello { side, node, nonce: rest[n..].try_into().expect("nonce length") })
}

/// The sealer and opener of one connection, from both handshakes. Fails unless the two ends
/// are on opposite sides.
pub fn session(key: &[u8], mine: &Hello, theirs: &Hello) -> Result<(Sealer, Opener), FrameError> {
    if theirs.side != mine.side.other() {
        return Err(FrameError::SameSide(theirs.side));
    }
    let (dialer, acceptor) = if mine.side == Side::Dialer { (mine, theirs) } else { (theirs, mine) };
    let mut h = Sha256::new();
    h.update(TRANSCRIPT_LABEL);
    for hello in [dialer, acceptor] {
        let name = name_bytes(&hello.node);
        h.update([name.len() as u8]);
        h.update(name);
        h.update(hello.nonce);
    }
    let transcript: [u8; 32] = h.finalize().into();
    let key = mac(key);
    Ok((
        Sealer { key: key.clone(), transcript, side: mine.side, seq: 0 },
        Opener { key, transcript, side: theirs.side, next: 1 },
    ))
}

fn data_mac(key: &HmacSha256, transcript: &[u8; 32], sender: Side, seq: u64, body: &[u8]) -> HmacSha256 {
    let mut m = key.clone();
    m.update(DATA_LABEL);
    m.update(transcript);
    m.update(&[sender.code()]);
    m.update(&seq.to_be_bytes());
    m.update(body);
    m
}

/// Seals outgoing frames of one connection.
pub struct Sealer {
    key: HmacSha256,
    transcript: [u8; 32],
    side: Side,
    seq: u64,
}

impl Sealer {
    pub fn seal(&mut self, body: &[u8]) -> Vec<u8> {
        self.seq += 1;
        let tag = data_mac(&self.key, &self.transcript, self.side, self.seq, body).finalize().into_bytes();
        frame(self.seq, body, &tag)
    }
}

/// Verifies incoming frames of one connection.
pub struct Opener {
    key: HmacSha256,
    transcript: [u8; 32],
    /// The sending end's side.
    side: Side,
    next: u64,
}

impl Opener {
    /// Checks a frame (without its length prefix) and returns its body.
    pub fn open<'a>(&mut self, f: &'a [u8]) -> Result<&'a [u8], FrameError> {
        let (seq, body, tag) = split(f)?;
        data_mac(&self.key, &self.transcript, self.side, seq, body)
            .verify_slice(tag)
            .map_err(|_| FrameError::BadTag)?;
        // Checked after the tag so an attacker learns nothing from which check failed.
        if seq != self.next {
            return Err(FrameError::Sequence { got: seq, want: self.next });
        }
        self.next += 1;
        Ok(body)
    }
}

/// Reads one frame (without its length prefix) from `r`.
pub async fn read_frame<R: tokio::io::AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let len = r.read_u32().await? as usize;
    if !(SEQ_LEN + TAG_LEN..=MAX_FRAME).contains(&len) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, FrameError::Size(len)));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    Ok(buf)
}
