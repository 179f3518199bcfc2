//! Decoding and sanity checks of what arrives on port 67. Anything that is not a well-formed
//! client message is rejected here with a reason, never passed on, never a panic.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder};

use crate::lease::ClientKey;

/// Offset of the options field (after the fixed header and the magic cookie).
const OPTIONS_OFFSET: usize = 240;
const MAGIC: [u8; 4] = [99, 130, 83, 99];
/// RFC 2131 §2: every client must accept 576-byte messages.
pub const MIN_MAX_MESSAGE: usize = 576;

/// A client message that passed every check.
#[derive(Debug, Clone)]
pub struct Request {
    pub msg: Message,
    pub kind: MessageType,
    pub client: ClientKey,
    pub hw: Vec<u8>,
    pub client_id: Option<Vec<u8>>,
    pub requested: Option<Ipv4Addr>,
    pub server_id: Option<Ipv4Addr>,
    pub hostname: Option<String>,
    /// Largest reply the client accepts, as a DHCP message (IP and UDP headers taken off).
    pub max_reply: usize,
    /// Option 82 exactly as the relay sent it (code, length, data), echoed unchanged.
    pub relay_info: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("undecodable: {0}")]
    Decode(String),
    #[error("too short for a DHCP message ({0} bytes)")]
    TooShort(usize),
    #[error("not a BOOTREQUEST")]
    NotRequest,
    #[error("bad magic cookie")]
    BadMagic,
    #[error("hardware address length {0} exceeds 16")]
    BadHlen(u8),
    #[error("no DHCP message type (plain BOOTP is not served)")]
    NoMessageType,
    #[error("message type {0:?} is not sent by clients")]
    NotClientMessage(MessageType),
    #[error("no client identity (empty chaddr and no client identifier)")]
    Anonymous,
    #[error("option {code} is malformed (length {len})")]
    BadOption { code: u8, len: usize },
}

pub fn parse(bytes: &[u8]) -> Result<Request, Rejected> {
    if bytes.len() < OPTIONS_OFFSET {
        return Err(Rejected::TooShort(bytes.len()));
    }
    if bytes[0] != 1 {
        return Err(Rejected::NotRequest);
    }
    // dhcproto's chaddr() slices by hlen and would panic on hlen > 16; check before decoding.
    if bytes[2] > 16 {
        return Err(Rejected::BadHlen(bytes[2]));
    }
    if bytes[236..240] != MAGIC {
        return Err(Rejected::BadMagic);
    }
    check_options(&bytes[OPTIONS_OFFSET..])?;
    let msg = Message::decode(&mut Decoder::new(bytes)).map_err(|e| Rejected::Decode(e.to_string()))?;
    if msg.opcode() != Opcode::BootRequest {
        return Err(Rejected::NotRequest);
    }
    let opts = msg.opts();
    let kind = opts.msg_type().ok_or(Rejected::NoMessageType)?;
    if !matches!(
        kind,
        MessageType::Discover
            | MessageType::Request
            | MessageType::Decline
            | MessageType::Release
            | MessageType::Inform
    ) {
        return Err(Rejected::NotClientMessage(kind));
    }
    let hw = msg.chaddr().to_vec();
    let client_id = match opts.get(OptionCode::ClientIdentifier) {
        Some(DhcpOption::ClientIdentifier(id)) if !id.is_empty() => Some(id.clone()),
        _ => None,
    };
    let client = match &client_id {
        Some(id) => ClientKey::from_client_id(id),
        None if hw.iter().any(|b| *b != 0) => ClientKey::from_hw(u8::from(msg.htype()), &hw),
        None => return Err(Rejected::Anonymous),
    };
    let requested = match opts.get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(a)) => Some(*a),
        _ => None,
    };
    let server_id = match opts.get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(a)) => Some(*a),
        _ => None,
    };
    let hostname = match opts.get(OptionCode::Hostname) {
        Some(DhcpOption::Hostname(h)) => {
            Some(h.chars().filter(|c| c.is_ascii_graphic()).take(63).collect::<String>()).filter(|h| !h.is_empty())
        }
        _ => None,
    };
    let max_reply = match opts.get(OptionCode::MaxMessageSize) {
        // The option counts the whole IP datagram; take off IPv4 (20) and UDP (8) headers.
        Some(DhcpOption::MaxMessageSize(n)) => (usize::from(*n).max(MIN_MAX_MESSAGE) - 28).min(1472),
        _ => MIN_MAX_MESSAGE - 28,
    };
    let relay_info = raw_option(&bytes[OPTIONS_OFFSET..], 82).map(<[u8]>::to_vec);
    Ok(Request { msg, kind, client, hw, client_id, requested, server_id, hostname, max_reply, relay_info })
}

/// Whether `len` is a legal length for option `code`, for options whose length is fixed or has
/// a minimum that dhcproto relies on without checking (some only by a debug assertion, some by
/// subtracting from the length).
fn length_ok(code: u8, len: usize) -> bool {
    match code {
        1 | 2 | 50 | 51 | 54 | 58 | 59 | 91 | 152..=155 => len == 4,
        53 => len == 1,
        57 => len == 2,
        80 => len == 0,
        94 => len == 3,
        81 => len >= 3,
        151 => len >= 1,
        _ => true,
    }
}

/// Walks the option TLVs: every option must fit in the packet and have its fixed length.
/// dhcproto stops quietly at the first bad option (and one of its checks is a debug assert),
/// so a malformed packet is refused here instead of being half-read.
fn check_options(mut opts: &[u8]) -> Result<(), Rejected> {
    while let [c, rest @ ..] = opts {
        match *c {
            0 => opts = rest,
            255 => return Ok(()),
            code => {
                let Some(&len) = rest.first() else { return Err(Rejected::BadOption { code, len: 0 }) };
                let len = usize::from(len);
                if rest.len() < 1 + len || !length_ok(code, len) {
                    return Err(Rejected::BadOption { code, len });
                }
                opts = &rest[1 + len..];
            }
        }
    }
    Ok(())
}

/// Finds option `code` in raw options and returns its whole TLV. Stops at End or at a
/// truncated option (dhcproto already accepted the options, so this is belt and braces).
fn raw_option(mut opts: &[u8], code: u8) -> Option<&[u8]> {
    while let [c, rest @ ..] = opts {
        match *c {
            0 => opts = rest,
            255 => return None,
            _ => {
                let len = usize::from(*rest.first()?);
                let total = 2 + len;
                if opts.len() < total {
                    return None;
                }
                if *c == code {
                    return Some(&opts[..total]);
                }
                opts = &opts[total..];
            }
        }
    }
    None
}
