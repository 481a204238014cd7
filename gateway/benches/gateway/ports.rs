//! Requests through the preview proxy beside direct ones to the same local HTTP server, and
//! beside a bare byte relay in front of it (what any proxy pays here): each request's latency
//! on a kept-alive connection, and bulk throughput. The proxy is the
//! gateway's own code; the run's side is berth-supervisor's session and ingress code, reaching
//! the server on loopback as a run reaches its own.

use std::convert::Infallible;

use axum::body::Body;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use super::*;

/// A local HTTP server: `/bytes/N` answers N bytes, streamed; anything else `ok`.
async fn server() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            stream.set_nodelay(true).unwrap();
            let service = hyper::service::service_fn(|request: http::Request<hyper::body::Incoming>| async move {
                let body = match request.uri().path().strip_prefix("/bytes/").and_then(|n| n.parse::<usize>().ok()) {
                    Some(n) => {
                        let chunk = hyper::body::Bytes::from(vec![7u8; 64 * 1024]);
                        let chunks = (0..n.div_ceil(chunk.len()))
                            .map(move |i| Ok::<_, Infallible>(chunk.slice(..(n - i * chunk.len()).min(chunk.len()))));
                        Body::from_stream(futures_util::stream::iter(chunks))
                    }
                    None => Body::from("ok"),
                };
                Ok::<_, Infallible>(http::Response::new(body))
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service));
        }
    });
    addr
}

/// The sandbox `web`'s run, its supervisor's session up, and the preview proxy: the proxy's
/// address and the access token of `port`.
async fn preview(dir: &std::path::Path, port: u16) -> (std::net::SocketAddr, String) {
    let (engine, token, gateway) = supervised(dir, bench_spec()).await;
    let (_exit, exit) = tokio::sync::watch::channel(None);
    let run = berth_supervisor::session::Run {
        token,
        exit,
        failed_to_start: None,
        execs: Default::default(),
        ports: Arc::new(berth_supervisor::ports::Loopback),
    };
    struct Quiet;
    impl berth_supervisor::session::Observer for Quiet {}
    tokio::spawn(async move {
        let (channel, wire) = (gateway.channel, gateway.wire);
        let connect = move |_| {
            let gateway = berth_supervisor::session::Gateway { channel: channel.clone(), wire: wire.clone() };
            async move { Ok(gateway) }
        };
        berth_supervisor::session::keep_session(connect, run, &mut Quiet).await;
        // Held, so the run's exit never reads as reported.
        drop(_exit);
    });
    let sandbox = loop {
        let s = engine.store().sandbox_by_name("web").await.unwrap().unwrap();
        if s.phase == berth_core::Phase::Ready {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let proxy = berth_gateway::ports::Proxy::new(engine.clone(), "bench-token", None);
    tokio::spawn(berth_gateway::ports::serve(
        proxy,
        berth_gateway::tcp::incoming(listener, None),
        std::future::pending(),
    ));
    let access = berth_core::port::derive_token(engine.key(), &sandbox.id, sandbox.generation, port);
    (addr, access.expose().to_string())
}

/// A kept-alive HTTP/1.1 connection to `addr`.
async fn connection(
    addr: std::net::SocketAddr,
) -> hyper::client::conn::http1::SendRequest<http_body_util::Empty<hyper::body::Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    sender
}

/// One GET on `sender`; the body's length.
async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<http_body_util::Empty<hyper::body::Bytes>>,
    path: &str,
    token: Option<&str>,
) -> usize {
    sender.ready().await.unwrap();
    let mut request = http::Request::get(path).header(http::header::HOST, "bench");
    if let Some(token) = token {
        request = request.header("x-berth-port-token", token);
    }
    let response = sender.send_request(request.body(http_body_util::Empty::new()).unwrap()).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            len += data.len();
        }
    }
    len
}

/// A bare byte relay in front of `upstream` (each connection copied both ways with 256 KiB
/// buffers, no HTTP): what any proxy on this machine pays at least, to read Berth's figure
/// against. On 2 cores a loopback transfer is bound by CPU, and a relay's two more copies of
/// every byte cost about as much as the client's and the server's own.
async fn relay(upstream: std::net::SocketAddr) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut server = tokio::net::TcpStream::connect(upstream).await.unwrap();
                let _ = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut server, 256 << 10, 256 << 10).await;
            });
        }
    });
    addr
}

pub(crate) fn ports(runtime: &tokio::runtime::Runtime, quick: bool) {
    let (requests, bulk, transfers) = if quick { (50, 8 << 20, 1) } else { (3_000, 512 << 20, 7) };
    println!(
        "preview proxy: requests through it (gateway -> supervisor -> run's loopback) beside direct and a bare byte relay, loopback; MB/s the median of {transfers} downloads of {} MiB",
        bulk >> 20
    );
    println!("{:>8} {:>14} {:>14} {:>12}", "path", "request p50", "p99", "MB/s");
    let dir = tempfile::tempdir().unwrap();
    let upstream = runtime.block_on(server());
    let relayed = runtime.block_on(relay(upstream));
    let (proxy, token) = runtime.block_on(preview(dir.path(), upstream.port()));
    let prefix = format!("/sandboxes/web/ports/{}", upstream.port());
    let mut p50s = Vec::new();
    let mut rates = Vec::new();
    for (path, addr, prefix, token) in [
        ("direct", upstream, "", None),
        ("relay", relayed, "", None),
        ("proxy", proxy, prefix.as_str(), Some(token.as_str())),
    ] {
        let (mut latencies, rate) = runtime.block_on(async {
            let mut sender = connection(addr).await;
            let mut latencies = Vec::with_capacity(requests);
            for _ in 0..requests {
                let t = Instant::now();
                assert_eq!(get(&mut sender, &format!("{prefix}/"), token).await, 2);
                latencies.push(t.elapsed());
            }
            let mut rates = Vec::with_capacity(transfers);
            for _ in 0..transfers {
                let t = Instant::now();
                assert_eq!(get(&mut sender, &format!("{prefix}/bytes/{bulk}"), token).await, bulk);
                rates.push(bulk as f64 / t.elapsed().as_secs_f64() / 1e6);
            }
            rates.sort_by(f64::total_cmp);
            (latencies, rates[rates.len() / 2])
        });
        latencies.sort();
        let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
        println!("{path:>8} {p50:>14?} {p99:>14?} {rate:>12.0}");
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        figure(&format!("preview {path}: request p50"), ms(p50), "ms");
        figure(&format!("preview {path}: request p99"), ms(p99), "ms");
        figure(&format!("preview {path}: throughput"), rate, "MB/s");
        p50s.push(p50);
        rates.push(rate);
    }
    figure("preview proxy: p50 overhead", (p50s[2].as_secs_f64() - p50s[0].as_secs_f64()) * 1e3, "ms");
    figure("preview proxy: throughput beside direct", rates[2] / rates[0], "x");
    figure("preview relay: throughput beside direct", rates[1] / rates[0], "x");
    figure("preview proxy: throughput beside the relay", rates[2] / rates[1], "x");
    println!();
}
