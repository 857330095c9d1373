//! TLS (rustls, with the `ring` provider) for the server and the client.
//! ALPN offers `h2` only: gRPC requires HTTP/2. Servers may require client
//! certificates (mutual TLS, [`server_config_mtls`]); clients may present
//! one ([`client_config_with_identity`]).

use std::sync::Arc;

use tokio_rustls::rustls::{self, pki_types::CertificateDer, pki_types::PrivateKeyDer};

use protoplane_grpc::status::{Code, Status};

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
    server_config_with(cert_pem, key_pem, None)
}

/// A server configuration that requires every client to present a
/// certificate chaining to one of the CA certificates in `client_ca_pem`
/// (mutual TLS): a client without one, or with one the CAs did not sign,
/// fails the handshake. The verified chain reaches handlers as
/// [`protoplane_grpc::call::Peer::certificates`].
pub fn server_config_mtls(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: &[u8],
) -> Result<Arc<rustls::ServerConfig>, Status> {
    server_config_with(cert_pem, key_pem, Some(client_ca_pem))
}

/// [`server_config`], or with `client_ca_pem` [`server_config_mtls`].
pub fn server_config_with(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> Result<Arc<rustls::ServerConfig>, Status> {
    let key = private_key(key_pem)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(bad)?;
    let builder = match client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = Arc::new(root_store(ca)?);
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
                    .build()
                    .map_err(|e| bad(format!("client CA: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs(cert_pem)?, key).map_err(bad)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

fn private_key(key_pem: &[u8]) -> Result<PrivateKeyDer<'static>, Status> {
    rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| bad(format!("key PEM: {e}")))?
        .ok_or_else(|| bad("no private key in PEM"))
}

fn root_store(pem: &[u8]) -> Result<rustls::RootCertStore, Status> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(pem)? {
        roots.add(c).map_err(bad)?;
    }
    Ok(roots)
}

/// A client configuration trusting the PEM roots.
pub fn client_config(roots_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, Status> {
    client_config_with_identity(roots_pem, None)
}

/// A client configuration trusting the PEM roots and, with `identity`
/// (certificate chain and key, PEM), presenting it to servers that ask
/// (mutual TLS).
pub fn client_config_with_identity(
    roots_pem: &[u8],
    identity: Option<(&[u8], &[u8])>,
) -> Result<Arc<rustls::ClientConfig>, Status> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(bad)?
        .with_root_certificates(root_store(roots_pem)?);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            builder.with_client_auth_cert(certs(cert)?, private_key(key)?).map_err(bad)?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
