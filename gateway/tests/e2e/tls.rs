//! TLS (DESIGN 14): a gateway given a certificate serves TLS alone on every TCP listener; the
//! CLI speaks it to an https:// address, checking the certificate against the CA it is given,
//! and never speaks plaintext to an https:// address nor TLS to an http:// one.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use berth_proto::v1 as pb;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::cli::berth;
use crate::harness::*;

/// A CA, a certificate it signed for `localhost` and 127.0.0.1 with its key, and a CA that
/// signed nothing here, as PEM files.
struct Certificates {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    stranger: PathBuf,
}

impl Certificates {
    fn made(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let authority = |name: &str| {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.distinguished_name.push(rcgen::DnType::CommonName, name);
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
        };
        let ca = authority("Berth test CA");
        let stranger = authority("Some other CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();
        let written = |name: &str, pem: String| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        Self {
            ca: written("ca.pem", ca.pem()),
            cert: written("cert.pem", cert.pem()),
            key: written("key.pem", key.serialize_pem()),
            stranger: written("stranger.pem", stranger.pem()),
        }
    }
}

fn failed(out: &Output) -> String {
    assert!(!out.status.success(), "succeeded: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn succeeded(out: &Output) -> String {
    assert!(out.status.success(), "failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The whole answer to `GET target` over TLS to the loopback `port`, checked against `ca`.
async fn https_get(port: u16, target: &str, token: &str, ca: &Path) -> String {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = ClientConfig::builder_with_provider(berth_gateway::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let server = ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(server, tcp).await.unwrap();
    let request = format!(
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // A server may close without TLS's close_notify: what arrived before is the answer.
    let _ = tls.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// What a plaintext HTTP request to the loopback `port` gets back.
async fn plain_get(port: u16) -> Vec<u8> {
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(15), tcp.read_to_end(&mut answer)).await;
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_with_a_certificate_speaks_tls_alone_on_every_listener() {
    let data = DataDir::new();
    let certs = Certificates::made(&data.path.join("tls"));
    let (http, metrics, proxy) = (free_port(), free_port(), free_port());
    let listen = |port: u16| format!("127.0.0.1:{port}");
    let (http_at, metrics_at, proxy_at) = (listen(http), listen(metrics), listen(proxy));
    let flags = [
        "--tls-cert",
        certs.cert.to_str().unwrap(),
        "--tls-key",
        certs.key.to_str().unwrap(),
        "--http-listen",
        &http_at,
        "--metrics-listen",
        &metrics_at,
        "--proxy-listen",
        &proxy_at,
    ];
    let gateway = Gateway::start_trusting(&data, &flags, Some(&certs.ca)).await;
    assert!(gateway.address.starts_with("https://127.0.0.1:"), "{}", gateway.address);
    let mut sandboxes = gateway.sandboxes().await;
    create(&mut sandboxes, "secure", &["sleep", "3600"], &[]).await;
    wait_phase(&mut sandboxes, "secure", pb::Phase::Ready).await;

    // The CLI finds the https:// address in the data directory and checks the certificate.
    let ca = certs.ca.to_str().unwrap();
    let listed = succeeded(&berth(&data, &["--ca-file", ca, "sandbox", "list"]).await);
    assert!(listed.contains("secure"), "{listed}");
    let url = succeeded(&berth(&data, &["--ca-file", ca, "sandbox", "url", "secure", "8080"]).await);
    let prefix = format!("https://{proxy_at}/sandboxes/secure/ports/8080/?");
    assert!(url.trim().starts_with(&prefix), "{url}");

    // Without the CA that signed it, or with another, the certificate is refused.
    for refused in [
        berth(&data, &["sandbox", "list"]).await,
        berth(&data, &["--ca-file", certs.stranger.to_str().unwrap(), "sandbox", "list"]).await,
    ] {
        let why = failed(&refused);
        assert!(why.contains("certificate"), "{why}");
    }
    // Plaintext to the TLS listener is not served.
    let plain = gateway.address.replacen("https://", "http://", 1);
    failed(&berth(&data, &["--gateway", &plain, "sandbox", "list"]).await);

    // The HTTP/JSON API, the metrics and the preview proxy: TLS with the same certificate.
    let listing = https_get(http, "/v1/sandboxes", &gateway.token, &certs.ca).await;
    assert!(listing.starts_with("HTTP/1.1 200") && listing.contains("secure"), "{listing}");
    let scrape = https_get(metrics, "/metrics", &gateway.token, &certs.ca).await;
    assert!(scrape.starts_with("HTTP/1.1 200") && scrape.contains("berth_"), "{scrape}");
    let target = url.trim().strip_prefix(&format!("https://{proxy_at}")).unwrap();
    let nothing = https_get(proxy, target, &gateway.token, &certs.ca).await;
    assert!(nothing.starts_with("HTTP/1.1 502") && nothing.contains("8080"), "{nothing}");
    for port in [http, metrics, proxy] {
        let answer = plain_get(port).await;
        assert!(!answer.starts_with(b"HTTP/"), "port {port} answered plaintext: {}", String::from_utf8_lossy(&answer));
    }
}

#[tokio::test]
async fn an_https_address_is_never_spoken_as_plaintext() {
    let data = DataDir::new();
    let certs = Certificates::made(&data.path.join("tls"));
    let gateway = Gateway::start(&data, &[]).await;
    assert!(gateway.address.starts_with("http://"), "{}", gateway.address);
    let tls = gateway.address.replacen("http://", "https://", 1);
    let why =
        failed(&berth(&data, &["--gateway", &tls, "--ca-file", certs.ca.to_str().unwrap(), "sandbox", "list"]).await);
    assert!(why.contains("cannot reach the gateway"), "{why}");
}

#[tokio::test]
async fn a_certificate_the_gateway_cannot_use_stops_it_naming_the_setting() {
    let data = DataDir::new();
    let certs = Certificates::made(&data.path.join("tls"));
    let (cert, key, ca) = (certs.cert.to_str().unwrap(), certs.key.to_str().unwrap(), certs.ca.to_str().unwrap());
    let alone = refused(&data, &["--tls-cert", cert]).await;
    assert!(alone.contains("--tls-key"), "{alone}");
    // A CA's certificate with the server's key: they do not match.
    let mismatched = refused(&data, &["--tls-cert", ca, "--tls-key", key]).await;
    assert!(mismatched.contains("tls_cert and tls_key"), "{mismatched}");
    let absent = refused(&data, &["--tls-cert", cert, "--tls-key", "/nonexistent/key.pem"]).await;
    assert!(absent.contains("tls_key: reading /nonexistent/key.pem"), "{absent}");
}
