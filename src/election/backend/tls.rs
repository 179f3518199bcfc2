//! rustls with the ring provider, shared by the PostgreSQL and MariaDB clients. Never aws-lc or
//! OpenSSL: they need C toolchains per target that break the static and cross builds (README,
//! "Packaging"; `make tls-guard` checks).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::ArbiterError;

/// Installs ring as the process-wide provider once. mysql_async builds its own ClientConfig
/// from the process default, so this must happen before its first TLS connection.
pub(super) fn ensure_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Trust `ca_file` if given, else the system's CA store.
pub(super) fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, ArbiterError> {
    ensure_provider();
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(p) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(p)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| ArbiterError::tls(p.display().to_string(), Some(e.into())))?;
            if certs.is_empty() {
                return Err(ArbiterError::tls(format!("{}: no PEM certificate in the file", p.display()), None));
            }
            for c in certs {
                roots.add(c).map_err(|e| ArbiterError::tls(p.display().to_string(), Some(e.into())))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for c in found.certs {
                let _ = roots.add(c);
            }
            if roots.is_empty() {
                return Err(ArbiterError::tls("no system CA certificates found; set [arbiter] ca_file", None));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ArbiterError::tls("rustls configuration", Some(e.into())))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
