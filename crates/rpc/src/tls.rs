//! TLS (rustls, with the `ring` provider) for the server and the client.
//! ALPN offers `h2` only: gRPC requires HTTP/2.

use std::sync::Arc;

use tokio_rustls::rustls::{self, pki_types::CertificateDer, pki_types::PrivateKeyDer};

use crate::status::{Code, Status};

fn bad(what: impl std::fmt::Display) -> Status {
    Status::new(Code::InvalidArgument, what.to_string())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Status> {
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut &pem[..]).collect();
    let certs = certs.map_err(|e| bad(format!("certificate PEM: {e}")))?;
    if certs.is_empty() {
        return Err(bad("no certificate in PEM"));
    }
    Ok(certs)
}

/// A server configuration from a PEM certificate chain and private key.
pub fn server_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>, Status> {
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| bad(format!("key PEM: {e}")))?
        .ok_or_else(|| bad("no private key in PEM"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(bad)?
        .with_no_client_auth()
        .with_single_cert(certs(cert_pem)?, key)
        .map_err(bad)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A client configuration trusting the PEM roots.
pub fn client_config(roots_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, Status> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(roots_pem)? {
        roots.add(c).map_err(bad)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(bad)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
