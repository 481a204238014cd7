//! Preview URLs (DESIGN 13.1) on every driver: a sandbox runs `port-server` (the gateway's
//! example, uploaded into its workspace); the URL `berth sandbox url` prints serves it, a
//! 100 MiB download arrives whole, a WebSocket echoes, HTTP/2 passes; without a token 401, a
//! public port needs none; nothing listening is 502 at once; Paused and Stopped are 409 naming
//! the phase; after a stop and start the old token is 410 Gone and the new URL reaches the new
//! run. `berth sandbox port-forward` carries a TCP echo and 100 MiB each way.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use berth_proto::v1 as pb;
use futures_util::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::Digest;
use tokio_tungstenite::tungstenite::Message;
use tonic::Code;

use crate::cli::berth;
use crate::conformance::{Runtime, clean_up, image_for, target};
use crate::files::{FilesService, files, upload};
use crate::harness::*;

/// The statically linked port-server (`ci/build-static-supervisor` makes it).
pub(crate) fn port_server() -> Option<PathBuf> {
    let found = std::env::var_os("BERTH_TEST_PORT_SERVER").map(PathBuf::from).filter(|p| p.exists());
    let required = std::env::var("BERTH_REQUIRE_RUNTIMES").is_ok_and(|v| v == "1");
    assert!(found.is_some() || !required, "BERTH_TEST_PORT_SERVER must name the static port-server under ci/test");
    if found.is_none() {
        eprintln!("skipping the preview proxy test: BERTH_TEST_PORT_SERVER is not set (ci/build-static-supervisor)");
    }
    found
}

/// What port-server's downloads hold at `offset`.
fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| ((offset + i) % 251) as u8).collect()
}

/// `url` with `path` in place of its path's end (its query kept).
fn at(url: &str, path: &str) -> String {
    match url.split_once('?') {
        Some((base, query)) => format!("{}{path}?{query}", base.trim_end_matches('/')),
        None => format!("{}{path}", url.trim_end_matches('/')),
    }
}

fn without_query(url: &str) -> &str {
    url.split_once('?').map_or(url, |(base, _)| base)
}

struct Reply {
    status: u16,
    body: Vec<u8>,
    headers: http::HeaderMap,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A GET over a connection of its own, HTTP/1.1 or HTTP/2 (prior knowledge), with the URL's
/// authority as its Host unless `headers` give one.
async fn get(url: &str, headers: &[(&str, &str)], h2: bool) -> Reply {
    let uri: http::Uri = url.parse().unwrap();
    let authority = uri.authority().unwrap().clone();
    let stream = tokio::net::TcpStream::connect(authority.as_str()).await.unwrap();
    let mut request = http::Request::get(if h2 { uri.to_string() } else { uri.path_and_query().unwrap().to_string() });
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        request = request.header(http::header::HOST, authority.as_str());
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(http_body_util::Empty::<hyper::body::Bytes>::new()).unwrap();
    let response = if h2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        sender.send_request(request).await.unwrap()
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        sender.send_request(request).await.unwrap()
    };
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes().to_vec();
    Reply { status, body, headers }
}

/// The URL's answer within 10 s: a proxy that hangs fails here.
async fn get_soon(url: &str, headers: &[(&str, &str)]) -> Reply {
    tokio::time::timeout(Duration::from_secs(10), get(url, headers, false)).await.expect("the proxy answers")
}

/// Waits for the run's server to answer through the proxy.
async fn serving(url: &str) -> Reply {
    for _ in 0..300 {
        let reply = get_soon(url, &[]).await;
        if reply.status == 200 {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} never served: {}", get_soon(url, &[]).await.text());
}

/// Streams `n` bytes from the URL, hashing as they come; the length and the SHA-256.
async fn download(url: &str) -> (u64, Vec<u8>) {
    let uri: http::Uri = url.parse().unwrap();
    let stream = tokio::net::TcpStream::connect(uri.authority().unwrap().as_str()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let request = http::Request::get(uri.path_and_query().unwrap().as_str())
        .header(http::header::HOST, uri.authority().unwrap().as_str())
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let (mut len, mut hash) = (0u64, sha2::Sha256::new());
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            len += data.len() as u64;
            hash.update(&data);
        }
    }
    (len, hash.finalize().to_vec())
}

async fn port_url(sandboxes: &mut Sandboxes, name: &str, port: u16) -> Result<pb::PortUrl, tonic::Status> {
    let request = pb::GetPortUrlRequest { name: name.into(), port: port.into() };
    Ok(sandboxes.get_port_url(request).await?.into_inner())
}

pub(crate) async fn put_server(files: &mut FilesService, sandbox: &str) {
    let binary = std::fs::read(port_server().expect("checked")).unwrap();
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(binary.len() as u64);
    header.set_mode(0o755);
    builder.append_data(&mut header, "port-server", &binary[..]).unwrap();
    upload(files, sandbox, ".", builder.into_inner().unwrap(), 1 << 20).await.unwrap();
}

async fn websocket_echoes(url: &str) {
    let ws = at(url, "/ws").replacen("http://", "ws://", 1);
    let uri: http::Uri = ws.parse().unwrap();
    let stream = tokio::net::TcpStream::connect(uri.authority().unwrap().as_str()).await.unwrap();
    let (mut socket, _) = tokio_tungstenite::client_async(ws.as_str(), stream).await.expect("the WebSocket opens");
    let big: Vec<u8> = pattern(7, 1 << 20);
    for message in [Message::text("hello"), Message::binary(big.clone()), Message::text("bye")] {
        socket.send(message.clone()).await.unwrap();
        let echoed = socket.next().await.unwrap().unwrap();
        assert_eq!(echoed, message, "the WebSocket echoes through the proxy");
    }
    socket.close(None).await.unwrap();
}

/// `berth sandbox port-forward` to the run's TCP echo: a line, then 100 MiB each way at once,
/// checksummed.
async fn port_forward_carries_tcp(data: &DataDir, echo: u16) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let mut cli = tokio::process::Command::new(bin("berth"))
        .arg("--data-dir")
        .arg(&data.path)
        .args(["sandbox", "port-forward", "web", &format!("0:{echo}")])
        .env_remove("BERTH_GATEWAY")
        .env_remove("BERTH_TOKEN")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(cli.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await.unwrap().unwrap().unwrap();
    let local = first
        .strip_prefix("Forwarding from ")
        .and_then(|rest| rest.split_once(' '))
        .map(|(addr, _)| addr.to_string())
        .unwrap_or_else(|| panic!("not the forward's address: {first}"));
    assert!(first.ends_with(&format!("-> web:{echo}")), "{first}");

    let mut line = tokio::net::TcpStream::connect(&local).await.unwrap();
    line.write_all(b"ping\n").await.unwrap();
    let mut answer = [0u8; 5];
    tokio::time::timeout(Duration::from_secs(10), line.read_exact(&mut answer)).await.unwrap().unwrap();
    assert_eq!(&answer, b"ping\n", "the run's echo answers through the forward");
    drop(line);

    let size = 100usize << 20;
    let (mut read, mut write) = tokio::net::TcpStream::connect(&local).await.unwrap().into_split();
    let began = Instant::now();
    let sending = tokio::spawn(async move {
        let mut hash = sha2::Sha256::new();
        for offset in (0..size).step_by(1 << 20) {
            let chunk = pattern(offset as u64, 1 << 20);
            hash.update(&chunk);
            write.write_all(&chunk).await.unwrap();
        }
        write.shutdown().await.unwrap();
        hash.finalize().to_vec()
    });
    let mut hash = sha2::Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    let mut received = 0;
    while received < size {
        let n = tokio::time::timeout(Duration::from_secs(30), read.read(&mut buffer)).await.unwrap().unwrap();
        assert_ne!(n, 0, "the forward closed after {received} bytes");
        hash.update(&buffer[..n]);
        received += n;
    }
    assert_eq!(hash.finalize().to_vec(), sending.await.unwrap(), "100 MiB come back whole and in order");
    eprintln!("port-forward: 100 MiB each way in {:?}", began.elapsed());
    cli.kill().await.unwrap();
}

async fn a_preview_url_reaches_the_current_run_only(runtime: Runtime) {
    if port_server().is_none() {
        return;
    }
    let Some(target) = target(runtime, "ports").await else { return };
    let data = DataDir::new();
    let proxy = format!("127.0.0.1:{}", free_port());
    let gateway = target.gateway(&data, &["--proxy-listen", &proxy]).await;
    let (mut sandboxes, mut files) = (gateway.sandboxes().await, files(&gateway).await);
    // A container has a loopback of its own; the process driver's runs share the host's.
    let (private, public, closed, echo) = match runtime {
        Runtime::Process => (free_port(), free_port(), free_port(), free_port()),
        _ => (8080, 8081, 9, 9000),
    };
    let script = format!(
        "while [ ! -x ./port-server ]; do sleep 0.1; done; exec ./port-server --http {private} --http {public} --tcp {echo}"
    );
    let spec = pb::SandboxSpec {
        image: image_for(&target).into(),
        ports: vec![pb::PortSpec { port: public.into(), public: true }],
        ..spec(&["sh", "-c", &script])
    };
    let request = pb::CreateSandboxRequest { name: "web".into(), spec: Some(spec), ..Default::default() };
    sandboxes.create_sandbox(request).await.unwrap();
    wait_phase(&mut sandboxes, "web", pb::Phase::Ready).await;
    put_server(&mut files, "web").await;

    // The CLI prints the URL, its token in the query.
    let out = berth(&data, &["sandbox", "url", "web", &private.to_string()]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let url = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let got = port_url(&mut sandboxes, "web", private).await.unwrap();
    assert_eq!((got.url.as_str(), got.generation, got.public), (url.as_str(), 1, false));
    assert!(url.starts_with(&format!("http://{proxy}/sandboxes/web/ports/{private}/?berth_token=")), "{url}");
    let hello = serving(&at(&url, "/hello")).await;
    assert_eq!(hello.text(), format!("hello from port {private}, host localhost:{private}\n"));
    // Requests one after another, each over a client connection of its own, reuse the proxy's
    // connection into the run that the one before left idle (it is put back once its response
    // ends, so one may open another if it comes first).
    let mut connections = std::collections::BTreeSet::new();
    for _ in 0..5 {
        connections.insert(serving(&at(&url, "/connection")).await.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(connections.len() < 5, "{runtime:?}: every request opened a connection into the run: {connections:?}");
    let cookie = hello.headers.get(http::header::SET_COOKIE).expect("a token from the query is kept as a cookie");
    assert!(cookie.to_str().unwrap().contains(&format!("Path=/sandboxes/web/ports/{private}/")), "{cookie:?}");

    // Without a token 401; the token's header, the cookie or the API token instead of it.
    let bare = format!("{}hello", without_query(&url));
    let refused = get_soon(&bare, &[]).await;
    assert_eq!(refused.status, 401, "{}", refused.text());
    assert!(refused.text().contains(&format!("port {private} of sandbox 'web'")), "{}", refused.text());
    assert_eq!(get_soon(&bare, &[("x-berth-port-token", &got.token)]).await.status, 200);
    assert_eq!(get_soon(&bare, &[("cookie", &format!("a=1; berth_token={}", got.token))]).await.status, 200);
    let bearer = format!("Bearer {}", gateway.token);
    assert_eq!(get_soon(&bare, &[("authorization", &bearer)]).await.status, 200);
    assert_eq!(get_soon(&bare, &[("x-berth-port-token", "berthp1.1.00")]).await.status, 401);
    // Another port's token opens only that port.
    let other = port_url(&mut sandboxes, "web", closed).await.unwrap();
    assert_eq!(get_soon(&bare, &[("x-berth-port-token", &other.token)]).await.status, 401);

    // A public port needs nothing.
    let open = port_url(&mut sandboxes, "web", public).await.unwrap();
    assert!(open.public && open.token.is_empty() && !open.url.contains('?'), "{open:?}");
    assert_eq!(get_soon(&at(&open.url, "/hello"), &[]).await.status, 200);

    // 100 MiB streamed, checksummed; a WebSocket; HTTP/2 from the client.
    let size = 100u64 << 20;
    let began = Instant::now();
    let (len, sum) = download(&at(&url, &format!("/bytes/{size}"))).await;
    let expected = {
        let mut hash = sha2::Sha256::new();
        let mut offset = 0;
        while offset < size {
            let n = (size - offset).min(1 << 20);
            hash.update(pattern(offset, n as usize));
            offset += n;
        }
        hash.finalize().to_vec()
    };
    assert_eq!((len, sum), (size, expected), "the download arrives whole and in order");
    eprintln!("{runtime:?}: 100 MiB through the preview proxy in {:?}", began.elapsed());
    websocket_echoes(&url).await;
    let over_h2 = tokio::time::timeout(Duration::from_secs(10), get(&at(&url, "/hello"), &[], true)).await.unwrap();
    assert_eq!((over_h2.status, over_h2.text()), (200, hello.text()));

    port_forward_carries_tcp(&data, echo).await;

    // Nothing listening: 502 naming the sandbox and the port, at once.
    let began = Instant::now();
    let nothing = get_soon(&at(&other.url, "/"), &[]).await;
    assert_eq!(nothing.status, 502, "{}", nothing.text());
    assert!(nothing.text().contains(&format!("port {closed} of sandbox 'web'")), "{}", nothing.text());
    eprintln!("{runtime:?}: a closed port answered 502 in {:?}", began.elapsed());

    // Paused: 409 naming the phase; resumed, the same run and the same token.
    lifecycle(&mut sandboxes, "pause", "web").await.unwrap();
    wait_phase(&mut sandboxes, "web", pb::Phase::Paused).await;
    let paused = get_soon(&at(&url, "/hello"), &[]).await;
    assert_eq!(paused.status, 409, "{}", paused.text());
    assert!(paused.text().contains("Paused"), "{}", paused.text());
    lifecycle(&mut sandboxes, "resume", "web").await.unwrap();
    wait_phase(&mut sandboxes, "web", pb::Phase::Ready).await;
    assert_eq!(get_soon(&at(&url, "/hello"), &[]).await.status, 200);

    // Stopped: 409, and no URL for the next run yet.
    lifecycle(&mut sandboxes, "stop", "web").await.unwrap();
    wait_phase(&mut sandboxes, "web", pb::Phase::Stopped).await;
    let stopped = get_soon(&at(&url, "/hello"), &[]).await;
    assert_eq!(stopped.status, 409, "{}", stopped.text());
    assert!(stopped.text().contains("Stopped"), "{}", stopped.text());
    assert_eq!(port_url(&mut sandboxes, "web", private).await.unwrap_err().code(), Code::FailedPrecondition);

    // Started: the old token is Gone, never the new run; the new URL reaches it.
    lifecycle(&mut sandboxes, "start", "web").await.unwrap();
    wait_phase(&mut sandboxes, "web", pb::Phase::Ready).await;
    let fresh = port_url(&mut sandboxes, "web", private).await.unwrap();
    assert_eq!(fresh.generation, 2);
    assert_eq!(serving(&at(&fresh.url, "/hello")).await.text(), hello.text());
    let gone = get_soon(&at(&url, "/hello"), &[]).await;
    assert_eq!(gone.status, 410, "{}", gone.text());
    assert!(gone.text().contains("run 1"), "{}", gone.text());
    assert_eq!(get_soon(&bare, &[("x-berth-port-token", &got.token)]).await.status, 410);

    clean_up(&target, &data, &mut sandboxes).await;
    let gone = get_soon(&at(&fresh.url, "/hello"), &[]).await;
    assert_eq!(gone.status, 404, "{}", gone.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_url_reaches_the_current_run_only_on_the_process_driver() {
    a_preview_url_reaches_the_current_run_only(Runtime::Process).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_url_reaches_the_current_run_only_on_docker() {
    a_preview_url_reaches_the_current_run_only(Runtime::Docker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_url_reaches_the_current_run_only_on_podman() {
    a_preview_url_reaches_the_current_run_only(Runtime::Podman).await;
}

/// A port-forward stream through `gateway` to `port` of `name`: one line echoed.
pub(crate) async fn forward_echoes(sandboxes: &mut Sandboxes, name: &str, port: u16) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let start = pb::PortForwardStart { name: name.into(), port: port.into(), here_only: false };
    tx.send(pb::PortForwardInput { input: Some(pb::port_forward_input::Input::Start(start)) }).await.unwrap();
    tx.send(pb::PortForwardInput { input: Some(pb::port_forward_input::Input::Data(b"across\n".to_vec())) })
        .await
        .unwrap();
    let mut down = sandboxes.port_forward(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let mut echoed = Vec::new();
    while echoed.len() < 7 {
        let message = tokio::time::timeout(Duration::from_secs(10), down.message()).await.unwrap().unwrap().unwrap();
        echoed.extend(message.data);
    }
    assert_eq!(echoed, b"across\n");
}

/// Two gateways on one store and data directory: the run's supervisor holds a session with one
/// of them, and either one's proxy and port-forward reach the run (through the other when the
/// session is not its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_gateway_reaches_the_run_wherever_its_session_is() {
    if port_server().is_none() {
        return;
    }
    let _server = crate::harness::POSTGRES_SERVER.read().await;
    let Some(url) = crate::pg::fresh_schema("ports_two_gateways").await else { return };
    let data = DataDir::new();
    let proxies = [format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port())];
    let args = |name, proxy| ["--store", &url, "--name", name, "--proxy-listen", proxy];
    let (a1, a2) = (args("g1", &proxies[0]), args("g2", &proxies[1]));
    let (g1, g2) = tokio::join!(Gateway::start(&data, &a1), Gateway::start(&data, &a2));
    let (http, echo) = (free_port(), free_port());
    let script =
        format!("while [ ! -x ./port-server ]; do sleep 0.1; done; exec ./port-server --http {http} --tcp {echo}");
    let mut sandboxes = g1.sandboxes().await;
    let request =
        pb::CreateSandboxRequest { name: "web".into(), spec: Some(spec(&["sh", "-c", &script])), ..Default::default() };
    sandboxes.create_sandbox(request).await.unwrap();
    wait_phase(&mut sandboxes, "web", pb::Phase::Ready).await;
    put_server(&mut files(&g1).await, "web").await;
    for (gateway, proxy) in [(&g1, &proxies[0]), (&g2, &proxies[1])] {
        let got = port_url(&mut gateway.sandboxes().await, "web", http).await.unwrap();
        assert!(got.url.starts_with(&format!("http://{proxy}/")), "each gateway names its own proxy: {}", got.url);
        let hello = serving(&at(&got.url, "/hello")).await;
        assert_eq!(hello.text(), format!("hello from port {http}, host localhost:{http}\n"));
        websocket_echoes(&got.url).await;
        forward_echoes(&mut gateway.sandboxes().await, "web", echo).await;
    }
    let log = format!("{}{}", data.log_of("g1"), data.log_of("g2"));
    assert!(!log.contains("ERROR"), "{log}");
    lifecycle(&mut sandboxes, "delete", "web").await.unwrap();
    wait_gone(&mut sandboxes, "web").await;
}

/// DESIGN 14: a run on another node is reached through any gateway's proxy and port-forward,
/// carried to its node's gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_another_node_is_reached_through_this_gateway() {
    if port_server().is_none() {
        return;
    }
    let _server = crate::harness::POSTGRES_SERVER.read().await;
    let proxy = format!("127.0.0.1:{}", free_port());
    let extra: [&[&str]; 2] = [&["--proxy-listen", &proxy], &[]];
    let Some((_data, [n1, n2])) = crate::nodes::two_nodes("ports_two_nodes", extra).await else { return };
    let (http, echo) = (free_port(), free_port());
    let script =
        format!("while [ ! -x ./port-server ]; do sleep 0.1; done; exec ./port-server --http {http} --tcp {echo}");
    let mut sandboxes = n1.sandboxes().await;
    let spec = pb::SandboxSpec {
        node_selector: [("host".to_string(), "two".to_string())].into(),
        ..spec(&["sh", "-c", &script])
    };
    let request = pb::CreateSandboxRequest { name: "far".into(), spec: Some(spec), ..Default::default() };
    sandboxes.create_sandbox(request).await.unwrap();
    let (far, _) = wait_phase(&mut sandboxes, "far", pb::Phase::Ready).await;
    assert_eq!(far.node, "n2");
    put_server(&mut files(&n1).await, "far").await;
    let got = port_url(&mut sandboxes, "far", http).await.unwrap();
    let hello = serving(&at(&got.url, "/hello")).await;
    assert_eq!(hello.text(), format!("hello from port {http}, host localhost:{http}\n"));
    forward_echoes(&mut sandboxes, "far", echo).await;
    drop(n2);
}

/// With `--proxy-domain`, the URL names the port and sandbox in its host, and the proxy routes
/// by the Host header (the client's DNS would send `*.domain` to the proxy; here the request
/// goes to the proxy's address with that Host); the path form still works beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_under_the_domain_is_routed_to_its_port() {
    if port_server().is_none() {
        return;
    }
    let data = DataDir::new();
    let proxy = format!("127.0.0.1:{}", free_port());
    let gateway = Gateway::start(&data, &["--proxy-listen", &proxy, "--proxy-domain", "Preview.Test"]).await;
    let (mut sandboxes, mut files) = (gateway.sandboxes().await, files(&gateway).await);
    let http = free_port();
    let script = format!("while [ ! -x ./port-server ]; do sleep 0.1; done; exec ./port-server --http {http}");
    let request =
        pb::CreateSandboxRequest { name: "web".into(), spec: Some(spec(&["sh", "-c", &script])), ..Default::default() };
    sandboxes.create_sandbox(request).await.unwrap();
    wait_phase(&mut sandboxes, "web", pb::Phase::Ready).await;
    put_server(&mut files, "web").await;
    let got = port_url(&mut sandboxes, "web", http).await.unwrap();
    let port = proxy.rsplit_once(':').unwrap().1;
    let host = format!("{http}-web.preview.test:{port}");
    assert_eq!(got.url, format!("http://{host}/?berth_token={}", got.token), "the domain lowercased");
    let by_path = format!("http://{proxy}/sandboxes/web/ports/{http}/hello?berth_token={}", got.token);
    let expected = serving(&by_path).await.text();
    let by_host = format!("http://{proxy}/hello?berth_token={}", got.token);
    let reply = get(&by_host, &[("host", &host)], false).await;
    assert_eq!((reply.status, reply.text()), (200, expected));
    let elsewhere = get(&by_host, &[("host", "9-other.elsewhere.test")], false).await;
    assert_eq!(elsewhere.status, 404, "{}", elsewhere.text());
    lifecycle(&mut sandboxes, "delete", "web").await.unwrap();
    wait_gone(&mut sandboxes, "web").await;
}
