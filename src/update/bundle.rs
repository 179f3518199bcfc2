//! The update bundle `make bundle` writes (scripts/build-bundle.sh):
//!
//! ```text
//! TWINLEASE-BUNDLE 1\n             magic and format version
//! manifest length                  u32, big-endian
//! manifest                         UTF-8 lines: format, arch, version, one `payload` line each
//! signature                        Ed25519 over the manifest bytes (64 bytes)
//! payloads                         in manifest order: root (squashfs), kernel, initrd
//! ```
//!
//! Only the manifest is signed; it carries each payload's size and SHA-256, so a reader checks
//! the signature first (a few hundred bytes) and then streams the payloads through the hash,
//! without holding a 100 MB file in memory. Ed25519 is verified with `ring` (already the TLS
//! provider); the signing side is OpenSSL (`openssl pkeyutl -sign -rawin`).

use std::io::Read;

use base64::Engine as _;
use sha2::{Digest, Sha256};

/// Where a box keeps the public key bundles must be signed with, under its root (the image
/// puts the public half of `make bundle`'s key here).
pub const BOX_KEY: &str = "usr/share/twinlease/bundle-key.pem";
/// The first bytes of every bundle.
pub const MAGIC: &[u8] = b"TWINLEASE-BUNDLE 1\n";
/// An Ed25519 signature.
pub const SIGNATURE_LEN: usize = 64;
/// A manifest is a few lines; anything longer is not one of ours.
const MAX_MANIFEST: u32 = 64 * 1024;
/// The payloads every bundle carries, in this order.
pub const PAYLOADS: [&str; 3] = ["root", "kernel", "initrd"];
/// The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): the 32 key bytes follow.
const ED25519_SPKI_PREFIX: [u8; 12] = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("not a twinlease bundle (it does not start with {:?})", String::from_utf8_lossy(MAGIC))]
    NotABundle,
    #[error("reading the bundle: {0}")]
    Io(#[from] std::io::Error),
    #[error("truncated bundle: {0}")]
    Truncated(String),
    #[error("bad manifest: {0}")]
    Manifest(String),
    #[error("bad signature: the manifest was not signed by the key in {key}")]
    BadSignature { key: String },
    #[error("the bundle is for {found}, this box is {expected}")]
    WrongArch { found: String, expected: String },
    #[error("payload {name}: its SHA-256 differs from the signed manifest")]
    HashMismatch { name: String },
    #[error("{0} bytes after the last payload (not a bundle make bundle wrote)")]
    TrailingData(u64),
    #[error("public key {path}: {why}")]
    Key { path: String, why: String },
}

/// One payload as the manifest describes it; `offset` is where it starts in the bundle file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    pub name: String,
    pub size: u64,
    pub sha256: [u8; 32],
    pub offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub arch: String,
    pub version: String,
    pub payloads: Vec<Payload>,
    /// The signed text, kept beside the slot it was installed into.
    pub text: String,
}

impl Manifest {
    pub fn payload(&self, name: &str) -> &Payload {
        // Parsing guarantees every name in PAYLOADS is present.
        self.payloads.iter().find(|p| p.name == name).expect("payload checked at parse time")
    }

    /// Bytes of the whole bundle (header, manifest, signature and payloads).
    pub fn bundle_len(&self) -> u64 {
        self.payloads.last().map_or(0, |p| p.offset + p.size)
    }
}

/// The key bundles are checked against (PEM "PUBLIC KEY", as `openssl pkey -pubout` writes).
#[derive(Debug, Clone)]
pub struct PublicKey {
    raw: [u8; 32],
    pub path: String,
}

impl PublicKey {
    pub fn from_pem(text: &str, path: &str) -> Result<PublicKey, BundleError> {
        let err = |why: &str| BundleError::Key { path: path.to_string(), why: why.to_string() };
        let body: String = text
            .lines()
            .skip_while(|l| !l.starts_with("-----BEGIN PUBLIC KEY-----"))
            .skip(1)
            .take_while(|l| !l.starts_with("-----END"))
            .collect();
        if body.is_empty() {
            return Err(err("no PEM \"PUBLIC KEY\" block"));
        }
        let der = base64::engine::general_purpose::STANDARD.decode(body.trim()).map_err(|_| err("bad base64"))?;
        match der.strip_prefix(&ED25519_SPKI_PREFIX[..]) {
            Some(raw) if raw.len() == 32 => Ok(PublicKey { raw: raw.try_into().expect("32 bytes"), path: path.into() }),
            _ => Err(err("not an Ed25519 public key")),
        }
    }

    fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, self.raw).verify(message, signature).is_ok()
    }
}

/// Parses the manifest text; payload offsets start at `data_start`.
pub fn parse_manifest(text: &str, data_start: u64) -> Result<Manifest, BundleError> {
    let bad = |why: String| BundleError::Manifest(why);
    let (mut format, mut arch, mut version) = (None, None, None);
    let mut payloads: Vec<Payload> = Vec::new();
    let mut offset = data_start;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["format", f] => format = Some(*f),
            ["arch", a] => arch = Some(a.to_string()),
            ["version", v] => version = Some(v.to_string()),
            ["payload", name, size, hash] => {
                let size: u64 = size.parse().map_err(|_| bad(format!("payload {name}: size {size:?}")))?;
                let sha256 = parse_hex32(hash).ok_or_else(|| bad(format!("payload {name}: hash {hash:?}")))?;
                payloads.push(Payload { name: name.to_string(), size, sha256, offset });
                offset += size;
            }
            _ => return Err(bad(format!("unknown line {line:?}"))),
        }
    }
    if format != Some("1") {
        return Err(bad(format!("format {format:?}, this twinlease reads format 1")));
    }
    let names: Vec<&str> = payloads.iter().map(|p| p.name.as_str()).collect();
    if names != PAYLOADS {
        return Err(bad(format!("payloads {names:?}, expected {PAYLOADS:?}")));
    }
    Ok(Manifest {
        arch: arch.ok_or_else(|| bad("no arch".into()))?,
        version: version.ok_or_else(|| bad("no version".into()))?,
        payloads,
        text: text.to_string(),
    })
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Reads the header, manifest and signature from the start of a bundle and checks the
/// signature; the reader is left at the first payload.
pub fn read_signed_manifest(r: &mut impl Read, key: &PublicKey) -> Result<Manifest, BundleError> {
    let mut magic = vec![0u8; MAGIC.len()];
    read_exact(r, &mut magic, "header")?;
    if magic != MAGIC {
        return Err(BundleError::NotABundle);
    }
    let mut len = [0u8; 4];
    read_exact(r, &mut len, "manifest length")?;
    let len = u32::from_be_bytes(len);
    if len > MAX_MANIFEST {
        return Err(BundleError::Manifest(format!("{len} bytes long")));
    }
    let mut text = vec![0u8; len as usize];
    read_exact(r, &mut text, "manifest")?;
    let mut signature = [0u8; SIGNATURE_LEN];
    read_exact(r, &mut signature, "signature")?;
    if !key.verify(&text, &signature) {
        return Err(BundleError::BadSignature { key: key.path.clone() });
    }
    let text = String::from_utf8(text).map_err(|_| BundleError::Manifest("not UTF-8".into()))?;
    let data_start = (MAGIC.len() + 4 + len as usize + SIGNATURE_LEN) as u64;
    parse_manifest(&text, data_start)
}

/// The architecture check: a bundle only goes into a box of its own machine type.
pub fn check_arch(manifest: &Manifest, expected: &str) -> Result<(), BundleError> {
    if manifest.arch == expected {
        Ok(())
    } else {
        Err(BundleError::WrongArch { found: manifest.arch.clone(), expected: expected.to_string() })
    }
}

/// Streams every payload from `r` (positioned at the first) through SHA-256 and compares each
/// with the manifest; `sink` sees every byte of payload `name` (nothing, when checking only).
/// The bundle must end right after the last payload.
pub fn stream_payloads(
    r: &mut impl Read,
    manifest: &Manifest,
    mut sink: impl FnMut(&str, &[u8]) -> std::io::Result<()>,
) -> Result<(), BundleError> {
    let mut buf = vec![0u8; 1 << 20];
    for p in &manifest.payloads {
        let mut hash = Sha256::new();
        let mut left = p.size;
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = r.read(&mut buf[..want])?;
            if n == 0 {
                return Err(BundleError::Truncated(format!(
                    "payload {} ends {left} bytes short of its {} bytes",
                    p.name, p.size
                )));
            }
            hash.update(&buf[..n]);
            sink(&p.name, &buf[..n])?;
            left -= n as u64;
        }
        if hash.finalize()[..] != p.sha256[..] {
            return Err(BundleError::HashMismatch { name: p.name.clone() });
        }
    }
    let mut trailing = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        trailing += n as u64;
    }
    if trailing > 0 {
        return Err(BundleError::TrailingData(trailing));
    }
    Ok(())
}

fn read_exact(r: &mut impl Read, buf: &mut [u8], what: &str) -> Result<(), BundleError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => BundleError::Truncated(format!("ends inside the {what}")),
        _ => BundleError::Io(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(arch: &str) -> String {
        let h = "ab".repeat(32);
        format!(
            "format 1\narch {arch}\nversion 1.2.3\npayload root 10 {h}\npayload kernel 5 {h}\npayload initrd 0 {h}\n"
        )
    }

    #[test]
    fn manifest_offsets_follow_the_payload_order() {
        let m = parse_manifest(&manifest("x86_64"), 100).unwrap();
        assert_eq!(m.payload("root").offset, 100);
        assert_eq!(m.payload("kernel").offset, 110);
        assert_eq!(m.payload("initrd").offset, 115);
        assert_eq!(m.bundle_len(), 115);
        assert_eq!(m.version, "1.2.3");
    }

    #[test]
    fn manifest_without_every_payload_or_of_another_format_is_refused() {
        let text = manifest("x86_64").replace("payload initrd", "payload other");
        assert!(matches!(parse_manifest(&text, 0), Err(BundleError::Manifest(_))));
        let text = manifest("x86_64").replace("format 1", "format 2");
        assert!(matches!(parse_manifest(&text, 0), Err(BundleError::Manifest(_))));
    }

    #[test]
    fn wrong_arch_is_named() {
        let m = parse_manifest(&manifest("aarch64"), 0).unwrap();
        let e = check_arch(&m, "x86_64").unwrap_err();
        assert_eq!(e.to_string(), "the bundle is for aarch64, this box is x86_64");
    }

    #[test]
    fn payload_hashes_and_lengths_are_checked() {
        let root = b"0123456789";
        let digest = |b: &[u8]| Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect::<String>();
        let text = format!(
            "format 1\narch x86_64\nversion 1\npayload root 10 {}\npayload kernel 2 {}\npayload initrd 0 {}\n",
            digest(root),
            digest(b"kk"),
            digest(b"")
        );
        let m = parse_manifest(&text, 0).unwrap();
        let mut seen = Vec::new();
        stream_payloads(&mut &b"0123456789kk"[..], &m, |_, b| {
            seen.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, b"0123456789kk");
        let short = stream_payloads(&mut &b"0123456789k"[..], &m, |_, _| Ok(()));
        assert!(matches!(short, Err(BundleError::Truncated(_))), "{short:?}");
        let changed = stream_payloads(&mut &b"0123456789kx"[..], &m, |_, _| Ok(()));
        assert!(matches!(changed, Err(BundleError::HashMismatch { .. })), "{changed:?}");
        let long = stream_payloads(&mut &b"0123456789kkz"[..], &m, |_, _| Ok(()));
        assert!(matches!(long, Err(BundleError::TrailingData(1))), "{long:?}");
    }

    #[test]
    fn a_pem_that_is_not_ed25519_is_refused() {
        let e = PublicKey::from_pem("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "k.pem");
        assert!(matches!(e, Err(BundleError::Key { .. })));
        assert!(PublicKey::from_pem("nothing", "k.pem").is_err());
    }
}
