//! The update service between the two boxes of a pair (README "Updating a pair"): one request
//! per TCP connection to the partner's port [`PORT`], authenticated both ways with the `[peer]`
//! key the boxes already share for lease sync.
//!
//! The exchange, one line each unless said otherwise:
//! 1. the serving side sends a fresh nonce (`nonce <hex>`);
//! 2. the caller sends its [`PeerRequest`] as JSON (with a nonce of its own), then
//!    `mac <hex>`: HMAC-SHA256 over the serving side's nonce and that JSON line, so a request
//!    cannot be made without the key nor replayed into another connection; then, for `install`
//!    and `roll`, exactly `bundle_len` bytes of bundle;
//! 3. the serving side sends any number of progress lines, which are only shown, and last
//!    `result <hex mac> <PeerReply JSON>`, the MAC over the caller's nonce and the JSON.
//!    Only the result is acted on, so a host without the key can neither ask nor answer.
//!
//! The bundle itself is not covered by these MACs: the box that installs it checks its
//! signature against the product key before writing anything, as for a local install.

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::roll::BoxView;

/// The partner's update service: beside the lease-sync port (6767) of the image's sites.
pub const PORT: u16 = 6769;
/// Bytes of each nonce.
pub const NONCE_LEN: usize = 32;
/// A request line longer than this is not a request.
pub const MAX_REQUEST_LINE: usize = 4096;

const REQUEST_LABEL: &[u8] = b"twinlease update request\0";
const REPLY_LABEL: &[u8] = b"twinlease update reply\0";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PeerCommand {
    /// The box's slots and daemon, for the roll's decisions.
    Status,
    /// Install the bundle that follows (and reboot into it if `reboot`).
    Install { bundle_len: u64, reboot: bool },
    /// Install the bundle this box staged when it handed a roll to the partner, the one whose
    /// manifest hashes to `manifest_sha256` (hex); nothing follows. The standby's data
    /// partition then holds one copy of the bundle, not two.
    InstallStaged { manifest_sha256: String, reboot: bool },
    /// Drive the rolling update of the pair with the bundle that follows (sent to the active
    /// box when `update pair` was started on the standby, which has it staged as
    /// `staged_manifest_sha256`).
    Roll { bundle_len: u64, timeout_secs: u64, staged_manifest_sha256: String },
}

impl PeerCommand {
    /// Bytes of bundle that follow the request.
    pub fn bundle_len(&self) -> u64 {
        match self {
            PeerCommand::Status | PeerCommand::InstallStaged { .. } => 0,
            PeerCommand::Install { bundle_len, .. } | PeerCommand::Roll { bundle_len, .. } => *bundle_len,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRequest {
    /// The caller's nonce (hex): the reply's MAC covers it.
    pub nonce: String,
    pub command: PeerCommand,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerReply {
    /// 0 when the command did what it was asked.
    pub exit: u8,
    /// The serving box as it is now (for `status`; after `install`, before any reboot).
    pub view: Option<BoxView>,
    /// Why not, when `exit` is not 0.
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PeerError {
    #[error("not hex: {0:?}")]
    NotHex(String),
    #[error("the MAC does not match: the other side does not hold this box's [peer] key")]
    BadMac,
    #[error("malformed {what}: {why}")]
    Malformed { what: &'static str, why: String },
}

fn mac(key: &[u8], label: &[u8], nonce: &[u8], body: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(label);
    m.update(nonce);
    m.update(body);
    m
}

/// The MAC line's value for `request_line` sent in answer to `server_nonce`.
pub fn request_mac(key: &[u8], server_nonce: &[u8], request_line: &str) -> String {
    to_hex(&mac(key, REQUEST_LABEL, server_nonce, request_line.as_bytes()).finalize().into_bytes())
}

/// Checks a request's MAC (in constant time) and parses it.
pub fn open_request(
    key: &[u8],
    server_nonce: &[u8],
    request_line: &str,
    mac_hex: &str,
) -> Result<PeerRequest, PeerError> {
    let tag = from_hex(mac_hex)?;
    mac(key, REQUEST_LABEL, server_nonce, request_line.as_bytes()).verify_slice(&tag).map_err(|_| PeerError::BadMac)?;
    serde_json::from_str(request_line).map_err(|e| PeerError::Malformed { what: "request", why: e.to_string() })
}

/// The `result` line (without its newline) for `reply` to a request that carried `client_nonce`.
pub fn result_line(key: &[u8], client_nonce: &[u8], reply: &PeerReply) -> String {
    let json = serde_json::to_string(reply).expect("a reply serializes");
    format!("result {} {json}", to_hex(&mac(key, REPLY_LABEL, client_nonce, json.as_bytes()).finalize().into_bytes()))
}

/// Checks a `result` line (without the word `result `) against the caller's nonce.
pub fn open_result(key: &[u8], client_nonce: &[u8], rest: &str) -> Result<PeerReply, PeerError> {
    let (mac_hex, json) =
        rest.split_once(' ').ok_or(PeerError::Malformed { what: "result", why: "no MAC before the JSON".into() })?;
    let tag = from_hex(mac_hex)?;
    mac(key, REPLY_LABEL, client_nonce, json.as_bytes()).verify_slice(&tag).map_err(|_| PeerError::BadMac)?;
    serde_json::from_str(json).map_err(|e| PeerError::Malformed { what: "result", why: e.to_string() })
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(text: &str) -> Result<Vec<u8>, PeerError> {
    let bad = || PeerError::NotHex(text.chars().take(80).collect());
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return Err(bad());
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).map_err(|_| bad())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn request() -> String {
        let r = PeerRequest {
            nonce: to_hex(&[7; NONCE_LEN]),
            command: PeerCommand::Install { bundle_len: 5, reboot: true },
        };
        serde_json::to_string(&r).unwrap()
    }

    #[test]
    fn a_request_opens_with_the_key_and_the_nonce_it_answers() {
        let line = request();
        let m = request_mac(KEY, &[1; NONCE_LEN], &line);
        let r = open_request(KEY, &[1; NONCE_LEN], &line, &m).unwrap();
        assert_eq!(r.command, PeerCommand::Install { bundle_len: 5, reboot: true });
        assert_eq!(r.command.bundle_len(), 5);
    }

    #[test]
    fn a_request_with_another_key_nonce_or_text_is_refused() {
        let line = request();
        let m = request_mac(KEY, &[1; NONCE_LEN], &line);
        assert_eq!(open_request(b"another key of 16+ bytes", &[1; NONCE_LEN], &line, &m), Err(PeerError::BadMac));
        // Replayed into another connection: another nonce.
        assert_eq!(open_request(KEY, &[2; NONCE_LEN], &line, &m), Err(PeerError::BadMac));
        let changed = line.replace("true", "false");
        assert_eq!(open_request(KEY, &[1; NONCE_LEN], &changed, &m), Err(PeerError::BadMac));
        assert!(matches!(open_request(KEY, &[1; NONCE_LEN], &line, "zz"), Err(PeerError::NotHex(_))));
    }

    #[test]
    fn a_result_is_believed_only_with_the_key_and_the_callers_nonce() {
        let reply = PeerReply { exit: 0, view: None, error: None };
        let line = result_line(KEY, &[3; NONCE_LEN], &reply);
        let rest = line.strip_prefix("result ").unwrap();
        assert_eq!(open_result(KEY, &[3; NONCE_LEN], rest).unwrap(), reply);
        assert_eq!(open_result(KEY, &[4; NONCE_LEN], rest), Err(PeerError::BadMac));
        assert_eq!(open_result(b"another key of 16+ bytes", &[3; NONCE_LEN], rest), Err(PeerError::BadMac));
        let forged = rest.replace("\"exit\":0", "\"exit\":1");
        assert_eq!(open_result(KEY, &[3; NONCE_LEN], &forged), Err(PeerError::BadMac));
    }

    #[test]
    fn unknown_commands_and_fields_are_malformed() {
        let m = |line: &str| request_mac(KEY, &[1; NONCE_LEN], line);
        for line in [
            r#"{"nonce":"00","command":{"command":"format-disk"}}"#,
            r#"{"nonce":"00","command":{"command":"status"},"x":1}"#,
        ] {
            assert!(
                matches!(open_request(KEY, &[1; NONCE_LEN], line, &m(line)), Err(PeerError::Malformed { .. })),
                "{line}"
            );
        }
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(from_hex(&to_hex(&[0, 1, 0xfe, 0xff])).unwrap(), vec![0, 1, 0xfe, 0xff]);
        assert!(from_hex("abc").is_err());
        assert!(from_hex("é1").is_err());
    }
}
