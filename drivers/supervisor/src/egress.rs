//! The sandbox's side of Berth's egress proxy (DESIGN 10). The sandbox has no network but its
//! loopback; the supervisor listens there (`--egress-proxy`, named by `HTTP_PROXY` and
//! `HTTPS_PROXY`) and takes a proxy request per connection: `CONNECT host:port`, or a plain
//! HTTP request in absolute form. It decides nothing: it asks the gateway, outside the
//! sandbox, to open the connection (`Supervisor.Egress`, with the run's token), and then only
//! carries bytes. A request the gateway refuses gets 403 with the reason.

use berth_proto::v1 as pb;
use berth_proto::v1::supervisor_client::SupervisorClient;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use berth_proto::carry::carry;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// Where the container drivers have the supervisor listen.
pub const LISTEN: &str = "127.0.0.1:3128";
/// The longest request head taken.
const MAX_HEAD: usize = 64 * 1024;
/// The most headers one request may carry.
const MAX_HEADERS: usize = 100;
/// Hop-by-hop headers a proxy consumes rather than passes on (RFC 9110 7.6.1), and the
/// proxy's own.
const HOP_BY_HOP: [&str; 6] = ["connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "upgrade"];

/// What the client asked to reach.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub host: String,
    pub port: u16,
    /// `CONNECT`: a tunnel, answered 200 once open.
    pub tunnel: bool,
    /// What to send upstream first: a plain request's head rewritten to origin form (one
    /// request per connection), and whatever the client sent after its head.
    pub first: Vec<u8>,
}

/// A client's mistake, answered with this status line and reason.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: &'static str,
    pub reason: String,
}

fn bad(reason: impl Into<String>) -> Refusal {
    Refusal { status: "400 Bad Request", reason: reason.into() }
}

/// `host:port` of a CONNECT, or the authority of an absolute URI (`default` port if none).
fn authority(authority: &http::uri::Authority, default: Option<u16>) -> Result<(String, u16), Refusal> {
    let port = authority.port_u16().or(default).ok_or_else(|| bad("CONNECT needs host:port"))?;
    let host = authority.host();
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    Ok((host.to_string(), port))
}

/// Parses a complete request head (`head` ends with the blank line; `rest` follows it).
pub fn parse(head: &[u8], rest: &[u8]) -> Result<Request, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(bad("the request head is incomplete")),
        Err(e) => return Err(bad(format!("the request head is malformed: {e}"))),
    }
    let (Some(method), Some(target), Some(version)) = (request.method, request.path, request.version) else {
        return Err(bad("the request line is incomplete"));
    };
    if method == "CONNECT" {
        let parsed: http::uri::Authority = target.parse().map_err(|_| bad(format!("'{target}' is not host:port")))?;
        let (host, port) = authority(&parsed, None)?;
        return Ok(Request { host, port, tunnel: true, first: rest.to_vec() });
    }
    let uri: http::Uri = target.parse().map_err(|_| bad(format!("'{target}' is not a URI")))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(parsed)) => {
            let (host, port) = authority(parsed, Some(80))?;
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            let mut first = format!("{method} {path} HTTP/1.{version}\r\n").into_bytes();
            let mut has_host = false;
            for header in request.headers.iter() {
                let name = header.name.to_ascii_lowercase();
                if HOP_BY_HOP.contains(&name.as_str()) {
                    continue;
                }
                has_host |= name == "host";
                first.extend_from_slice(header.name.as_bytes());
                first.extend_from_slice(b": ");
                first.extend_from_slice(header.value);
                first.extend_from_slice(b"\r\n");
            }
            if !has_host {
                first.extend_from_slice(format!("Host: {parsed}\r\n").as_bytes());
            }
            // One request per connection: a second one, maybe to another host, cannot follow
            // on a connection opened for the first.
            first.extend_from_slice(b"Connection: close\r\n\r\n");
            first.extend_from_slice(rest);
            Ok(Request { host, port, tunnel: false, first })
        }
        (Some(scheme), _) if scheme != "http" => Err(bad(format!(
            "a {scheme} URL goes through CONNECT (set HTTPS_PROXY): this proxy does not speak TLS itself"
        ))),
        _ => Err(bad("a proxy request needs CONNECT host:port or an absolute http:// URL")),
    }
}

/// Reads a request head: the bytes up to and including the blank line, and what came after.
async fn read_head<S: AsyncRead + Unpin>(client: &mut S) -> Result<(Vec<u8>, Vec<u8>), Refusal> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buffer.split_off(end + 4);
            return Ok((buffer, rest));
        }
        if buffer.len() > MAX_HEAD {
            return Err(Refusal { status: "431 Request Header Fields Too Large", reason: "over 64 KiB".into() });
        }
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return Err(bad("the connection ended inside the request head")),
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn refuse<S: AsyncWrite + Unpin>(client: &mut S, refusal: &Refusal) {
    let body = format!("{}\n", refusal.reason);
    let reply = format!(
        "HTTP/1.1 {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        refusal.status,
        body.len()
    );
    let _ = client.write_all(reply.as_bytes()).await;
    let _ = client.shutdown().await;
}

/// How the gateway's refusal reads to the client.
fn refusal(status: &tonic::Status) -> Refusal {
    let line = match status.code() {
        tonic::Code::PermissionDenied => "403 Forbidden",
        tonic::Code::InvalidArgument => "400 Bad Request",
        tonic::Code::DeadlineExceeded => "504 Gateway Timeout",
        _ => "502 Bad Gateway",
    };
    Refusal { status: line, reason: status.message().to_string() }
}

/// Serves one connection a sandbox process made to the proxy listener, through `gateway`.
/// Returns how it ended, for the supervisor's log.
pub async fn serve<S>(mut client: S, token: &str, gateway: Channel) -> Result<String, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let request = match read_head(&mut client).await {
        Ok((head, rest)) => parse(&head, &rest),
        Err(refusal) => Err(refusal),
    };
    let request = match request {
        Ok(request) => request,
        Err(refusal) => {
            refuse(&mut client, &refusal).await;
            return Err(refusal.reason);
        }
    };
    let (tx, rx) = mpsc::channel(8);
    let open =
        pb::EgressOpen { runtime_token: token.to_string(), host: request.host.clone(), port: request.port.into() };
    let _ = tx.send(pb::EgressUp { message: Some(pb::egress_up::Message::Open(open)) }).await;
    if !request.first.is_empty() {
        let _ = tx.send(pb::EgressUp { message: Some(pb::egress_up::Message::Data(request.first)) }).await;
    }
    let target = format!("{}:{}", request.host, request.port);
    let mut down = match SupervisorClient::new(gateway).egress(ReceiverStream::new(rx)).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            let refusal = refusal(&status);
            refuse(&mut client, &refusal).await;
            return Err(format!("{target}: {}", refusal.reason));
        }
    };
    let connected = match down.message().await {
        Ok(Some(pb::EgressDown { message: Some(pb::egress_down::Message::Connected(addr)) })) => addr,
        Ok(_) => {
            refuse(&mut client, &Refusal { status: "502 Bad Gateway", reason: "the gateway did not connect".into() })
                .await;
            return Err(format!("{target}: no connection"));
        }
        Err(status) => {
            let refusal = refusal(&status);
            refuse(&mut client, &refusal).await;
            return Err(format!("{target}: {}", refusal.reason));
        }
    };
    if request.tunnel && client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.is_err() {
        return Err(format!("{target}: the client left"));
    }
    let up = |data| pb::EgressUp { message: Some(pb::egress_up::Message::Data(data)) };
    let data = down.map_while(Result::ok).filter_map(|m| match m.message {
        Some(pb::egress_down::Message::Data(data)) => Some(data),
        _ => None,
    });
    carry(client, tx, up, data).await;
    Ok(format!("{target} via {connected}: closed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(head: &str, rest: &str) -> Result<Request, Refusal> {
        parse(head.as_bytes(), rest.as_bytes())
    }

    #[test]
    fn a_connect_names_its_host_and_port_and_keeps_what_follows() {
        let r = parsed("CONNECT one.test:8443 HTTP/1.1\r\nHost: one.test:8443\r\n\r\n", "hello").unwrap();
        assert_eq!(r, Request { host: "one.test".into(), port: 8443, tunnel: true, first: b"hello".to_vec() });
        let r = parsed("CONNECT [::1]:443 HTTP/1.1\r\n\r\n", "").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("::1", 443));
        assert!(parsed("CONNECT one.test HTTP/1.1\r\n\r\n", "").is_err(), "a tunnel needs a port");
    }

    #[test]
    fn a_plain_request_is_sent_on_in_origin_form_one_per_connection() {
        let head = "POST http://one.test:8080/a/b?c=d HTTP/1.1\r\nHost: one.test:8080\r\nProxy-Connection: \
                    keep-alive\r\nProxy-Authorization: Basic eA==\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n";
        let r = parsed(head, "hi").unwrap();
        assert_eq!((r.host.as_str(), r.port, r.tunnel), ("one.test", 8080, false));
        assert_eq!(
            String::from_utf8(r.first).unwrap(),
            "POST /a/b?c=d HTTP/1.1\r\nHost: one.test:8080\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        );
        let r = parsed("GET http://127.0.0.2/ HTTP/1.0\r\n\r\n", "").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("127.0.0.2", 80));
        assert_eq!(
            String::from_utf8(r.first).unwrap(),
            "GET / HTTP/1.0\r\nHost: 127.0.0.2\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn what_is_not_a_proxy_request_is_refused_with_a_reason() {
        for (head, says) in [
            ("GET / HTTP/1.1\r\nHost: one.test\r\n\r\n", "absolute"),
            ("GET https://one.test/ HTTP/1.1\r\n\r\n", "CONNECT"),
            ("NOT A REQUEST\r\n\r\n", "malformed"),
        ] {
            let refusal = parsed(head, "").unwrap_err();
            assert_eq!(refusal.status, "400 Bad Request");
            assert!(refusal.reason.contains(says), "{head:?}: {}", refusal.reason);
        }
    }

    #[test]
    fn the_gateways_refusal_reads_as_an_http_status() {
        assert_eq!(refusal(&tonic::Status::permission_denied("no")).status, "403 Forbidden");
        assert_eq!(refusal(&tonic::Status::unavailable("down")).status, "502 Bad Gateway");
        assert_eq!(refusal(&tonic::Status::invalid_argument("host")).status, "400 Bad Request");
    }
}
