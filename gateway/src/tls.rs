//! TLS (DESIGN 14): once traffic leaves a host it is encrypted.
//!
//! A gateway given a certificate and its key (`--tls-cert`, `--tls-key`) serves TLS, and only
//! TLS, on every TCP listener it has: the gRPC API, the HTTP/JSON API, the metrics and the
//! preview proxy. Supervisors keep their Unix socket: it never leaves the host. Clients (the
//! CLI, a gateway reaching a peer) speak TLS to an `https://` address and plain HTTP/2 to an
//! `http://` one, never one for the other; they trust the CA file they are given, else the
//! system's roots.
//!
//! rustls on ring: no OpenSSL to link, the same on every machine.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, ServerConfig};

/// The protocols a listener offers in the handshake (ALPN), as its server speaks them.
#[derive(Clone, Copy, Debug)]
pub enum Protocols {
    /// gRPC: HTTP/2 alone.
    Grpc,
    /// The HTTP/JSON API and the metrics: HTTP/1.1.
    Http1,
    /// The preview proxy: HTTP/2 or HTTP/1.1, as the client prefers.
    Either,
}

impl Protocols {
    fn alpn(self) -> Vec<Vec<u8>> {
        let names: &[&[u8]] = match self {
            Protocols::Grpc => &[b"h2"],
            Protocols::Http1 => &[b"http/1.1"],
            Protocols::Either => &[b"h2", b"http/1.1"],
        };
        names.iter().map(|name| name.to_vec()).collect()
    }
}

/// The cryptography every TLS connection of the gateway's uses: ring, though rustls now marks it
/// deprecated for want of post-quantum key exchange. Its build needs a C compiler alone, where
/// aws-lc-rs (which has it) needs more toolchain on every machine that builds Berth; the key
/// exchange is X25519 or a NIST curve.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The gateway's certificate chain and key, read once at start.
pub struct ServerTls {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl ServerTls {
    /// Reads the PEM files `--tls-cert` (the chain, leaf first) and `--tls-key` name, and checks
    /// that they make a usable server identity: the error names the file at fault.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, String> {
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("tls_cert: reading {}: {e}", cert.display()))?;
        if chain.is_empty() {
            return Err(format!("tls_cert: {} holds no PEM certificate", cert.display()));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("tls_key: reading {}: {e}", key.display()))?;
        let tls = Self { chain, key };
        tls.config(Protocols::Grpc).map_err(|e| format!("tls_cert and tls_key: {e}"))?;
        Ok(tls)
    }

    fn config(&self, protocols: Protocols) -> Result<ServerConfig, rustls::Error> {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key.clone_key())?;
        config.alpn_protocols = protocols.alpn();
        Ok(config)
    }

    /// What accepts a listener's connections, offering `protocols`.
    pub fn acceptor(&self, protocols: Protocols) -> TlsAcceptor {
        // `load` built this configuration once already: the same inputs cannot fail now.
        let config = self.config(protocols).unwrap_or_else(|e| unreachable!("checked at load: {e}"));
        TlsAcceptor::from(Arc::new(config))
    }
}

/// How a client speaks to a gateway at `address`: TLS for `https://`, trusting the PEM file
/// `ca` if given, else the system's roots; nothing for `http://`.
pub fn client(address: &str, ca: Option<&Path>) -> Result<Option<tonic::transport::ClientTlsConfig>, String> {
    if !address.starts_with("https://") {
        return Ok(None);
    }
    let config = tonic::transport::ClientTlsConfig::new();
    Ok(Some(match ca {
        Some(path) => config.ca_certificate(tonic::transport::Certificate::from_pem(ca_file(path)?)),
        None => config.with_native_roots(),
    }))
}

/// The PEM text of a CA file, which must hold at least one certificate.
fn ca_file(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("reading the CA file {}: {e}", path.display()))?;
    if CertificateDer::pem_slice_iter(&pem).next().is_none() {
        return Err(format!("the CA file {} holds no PEM certificate", path.display()));
    }
    Ok(pem)
}

/// How the gateway speaks TLS to a server that is not a gateway's gRPC (a PostgreSQL store,
/// another node's E2B listener): the server's certificate checked, name included, against the
/// PEM file `ca` if given, else the system's roots; `option` is what gives one.
pub fn client_config(ca: Option<&Path>, option: &str) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in CertificateDer::pem_slice_iter(&ca_file(path)?) {
                let cert = cert.map_err(|e| format!("reading the CA file {}: {e}", path.display()))?;
                roots.add(cert).map_err(|e| format!("the CA file {}: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(format!("the system has no CA certificates to check the server's against; give {option}"));
            }
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// `endpoint` (of `address`) set to speak as [`client`] says.
pub fn endpoint(
    endpoint: tonic::transport::Endpoint,
    address: &str,
    ca: Option<&Path>,
) -> Result<tonic::transport::Endpoint, String> {
    match client(address, ca)? {
        Some(config) => endpoint.tls_config(config).map_err(|e| format!("{address}: {e}")),
        None => Ok(endpoint),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_server_identity_is_refused_naming_the_file_at_fault() {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let cert = written(dir.path(), "cert.pem", &made.cert.pem());
        let key = written(dir.path(), "key.pem", &made.signing_key.serialize_pem());
        let other_key = written(dir.path(), "other.pem", &other.signing_key.serialize_pem());
        let empty = written(dir.path(), "empty.pem", "");

        assert!(ServerTls::load(&cert, &key).is_ok());
        let missing = ServerTls::load(&dir.path().join("absent.pem"), &key).err().unwrap();
        assert!(missing.starts_with("tls_cert: reading"), "{missing}");
        let no_cert = ServerTls::load(&empty, &key).err().unwrap();
        assert!(no_cert.contains("holds no PEM certificate"), "{no_cert}");
        let no_key = ServerTls::load(&cert, &empty).err().unwrap();
        assert!(no_key.starts_with("tls_key:"), "{no_key}");
        let mismatched = ServerTls::load(&cert, &other_key).err().unwrap();
        assert!(mismatched.starts_with("tls_cert and tls_key:"), "{mismatched}");
    }

    #[test]
    fn only_an_https_address_takes_tls_and_a_ca_file_must_hold_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let empty = written(dir.path(), "empty.pem", "");
        assert!(client("http://127.0.0.1:7420", Some(&empty)).unwrap().is_none());
        assert!(client("https://127.0.0.1:7420", None).unwrap().is_some());
        let refused = client("https://127.0.0.1:7420", Some(&empty)).err().unwrap();
        assert!(refused.contains("holds no PEM certificate"), "{refused}");
        let absent = client("https://127.0.0.1:7420", Some(&dir.path().join("absent.pem"))).err().unwrap();
        assert!(absent.starts_with("reading the CA file"), "{absent}");
    }
}
