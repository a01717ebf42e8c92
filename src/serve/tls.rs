//! TLS for `serve`: rustls with the provider reqwest already brings.

use super::ServeError;
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls;

/// A TLS server configuration from PEM files: the certificate chain (leaf first) and its
/// private key. HTTP/1.1 is announced through ALPN.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ServeError::Tls(format!("certificate {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(ServeError::Tls(format!(
            "{} holds no PEM certificate",
            cert.display()
        )));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        ServeError::Tls(format!(
            "private key {}: {e} (expected an unencrypted PEM key: PKCS#8, RSA or EC)",
            key.display()
        ))
    })?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| ServeError::Tls(format!("{} with {}: {e}", cert.display(), key.display())))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
