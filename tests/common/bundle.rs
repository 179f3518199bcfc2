//! Update bundles for the tests (format: src/update/bundle.rs), signed with OpenSSL as
//! `scripts/build-bundle.sh` signs them: fresh Ed25519 keys, bundles made from given payloads,
//! and the ways a bundle goes bad (another signer, a flipped bit, a cut, another architecture).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::run;

/// An Ed25519 key pair in PEM files.
pub struct Key {
    pub private: PathBuf,
    pub public: PathBuf,
}

impl Key {
    pub fn generate(dir: &Path, name: &str) -> Key {
        let private = dir.join(format!("{name}.pem"));
        let public = dir.join(format!("{name}.pub.pem"));
        run(Command::new("openssl").args(["genpkey", "-algorithm", "ed25519", "-out"]).arg(&private));
        run(Command::new("openssl").arg("pkey").arg("-in").arg(&private).arg("-pubout").arg("-out").arg(&public));
        Key { private, public }
    }

    /// An existing private key (`make bundle`'s), its public half written beside `dir`'s files.
    pub fn existing(private: &Path, dir: &Path) -> Key {
        let public = dir.join("existing.pub.pem");
        run(Command::new("openssl").arg("pkey").arg("-in").arg(private).arg("-pubout").arg("-out").arg(&public));
        Key { private: private.to_path_buf(), public }
    }

    pub fn sign(&self, message: &[u8], dir: &Path) -> Vec<u8> {
        let (m, s) = (dir.join("to-sign"), dir.join("signature"));
        std::fs::write(&m, message).unwrap();
        run(Command::new("openssl")
            .args(["pkeyutl", "-sign", "-rawin", "-inkey"])
            .arg(&self.private)
            .arg("-in")
            .arg(&m)
            .arg("-out")
            .arg(&s));
        std::fs::read(s).unwrap()
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A bundle of `root`, `kernel` and `initrd` for `arch`, signed by `key`.
pub fn make(key: &Key, dir: &Path, arch: &str, version: &str, payloads: [&[u8]; 3]) -> Vec<u8> {
    let mut manifest = format!("format 1\narch {arch}\nversion {version}\n");
    for (name, p) in ["root", "kernel", "initrd"].iter().zip(payloads) {
        manifest.push_str(&format!("payload {name} {} {}\n", p.len(), sha256_hex(p)));
    }
    let mut out = assemble(manifest.as_bytes(), &key.sign(manifest.as_bytes(), dir));
    for p in payloads {
        out.extend_from_slice(p);
    }
    out
}

fn assemble(manifest: &[u8], signature: &[u8]) -> Vec<u8> {
    let mut out = b"TWINLEASE-BUNDLE 1\n".to_vec();
    out.extend_from_slice(&(manifest.len() as u32).to_be_bytes());
    out.extend_from_slice(manifest);
    out.extend_from_slice(signature);
    out
}

/// The manifest text and where the signature starts.
fn split(bundle: &[u8]) -> (String, usize) {
    let len = u32::from_be_bytes(bundle[19..23].try_into().unwrap()) as usize;
    (String::from_utf8(bundle[23..23 + len].to_vec()).unwrap(), 23 + len)
}

/// The same bundle with one bit of its signature flipped.
pub fn flip_signature_bit(bundle: &[u8]) -> Vec<u8> {
    let (_, at) = split(bundle);
    let mut out = bundle.to_vec();
    out[at + 10] ^= 0x01;
    out
}

/// The same bundle with its manifest's `arch` line changed and signed again by `key`: a valid
/// bundle for another machine.
pub fn for_arch(bundle: &[u8], arch: &str, key: &Key, dir: &Path) -> Vec<u8> {
    let (manifest, at) = split(bundle);
    let changed: String = manifest
        .lines()
        .map(|l| if l.starts_with("arch ") { format!("arch {arch}\n") } else { format!("{l}\n") })
        .collect();
    let mut out = assemble(changed.as_bytes(), &key.sign(changed.as_bytes(), dir));
    out.extend_from_slice(&bundle[at + 64..]);
    out
}
