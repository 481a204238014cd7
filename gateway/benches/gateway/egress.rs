//! Connections through the egress proxy beside direct ones: time to a first byte, a round trip,
//! bulk throughput.

use super::*;

/// A local upstream: each connection's first line is a byte count to send back then close, or
/// `echo`, to echo every byte until the client closes.
pub(crate) async fn upstream() -> std::net::SocketAddr {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            stream.set_nodelay(true).unwrap();
            tokio::spawn(async move {
                let mut stream = tokio::io::BufReader::new(stream);
                let mut line = String::new();
                if stream.read_line(&mut line).await.is_err() {
                    return;
                }
                if line.trim() == "echo" {
                    let (mut read, mut write) = tokio::io::split(stream);
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                } else if let Ok(size) = line.trim().parse::<usize>() {
                    let chunk = vec![7u8; 64 * 1024];
                    let mut left = size;
                    while left > 0 {
                        let n = left.min(chunk.len());
                        if stream.get_mut().write_all(&chunk[..n]).await.is_err() {
                            return;
                        }
                        left -= n;
                    }
                    let _ = stream.get_mut().shutdown().await;
                }
            });
        }
    });
    addr
}

/// A gateway serving the supervisor API on a Unix socket (as containers reach it), with one
/// sandbox allowed `upstream`, and the supervisor's proxy listener for that sandbox's run: the
/// listener's address.
pub(crate) async fn egress_proxy(dir: &std::path::Path, upstream: std::net::SocketAddr) -> std::net::SocketAddr {
    let egress = berth_core::egress::Policy::parse("allow", [upstream.ip().to_string().as_str()]).unwrap();
    let (_, token, gateway) = supervised(dir, SandboxSpec { egress, ..bench_spec() }).await;
    let channel = gateway.channel;
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = proxy.accept().await {
            client.set_nodelay(true).unwrap();
            let (token, channel) = (token.clone(), channel.clone());
            tokio::spawn(async move { berth_supervisor::egress::serve(client, &token, channel).await });
        }
    });
    addr
}

/// A connection to `upstream`, directly or through `proxy` (CONNECT answered 200), carrying
/// `first` once open.
pub(crate) async fn open(
    upstream: std::net::SocketAddr,
    proxy: Option<std::net::SocketAddr>,
    first: &str,
) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(proxy.unwrap_or(upstream)).await.unwrap();
    stream.set_nodelay(true).unwrap();
    if proxy.is_some() {
        stream.write_all(format!("CONNECT {upstream} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    }
    stream.write_all(first.as_bytes()).await.unwrap();
    stream
}

pub(crate) fn egress(runtime: &tokio::runtime::Runtime, quick: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (connections, trips, bulk) = if quick { (10, 50, 8 << 20) } else { (300, 3_000, 512 << 20) };
    println!("egress: through the proxy (supervisor listener -> gateway over a Unix socket) beside direct, loopback");
    println!(
        "{:>8} {:>14} {:>14} {:>14} {:>14} {:>12}",
        "path", "first byte p50", "p99", "round trip p50", "p99", "MB/s"
    );
    let dir = tempfile::tempdir().unwrap();
    let upstream = runtime.block_on(upstream());
    let proxy = runtime.block_on(egress_proxy(dir.path(), upstream));
    for (path, via) in [("direct", None), ("proxy", Some(proxy))] {
        let (first, trip, rate) = runtime.block_on(async {
            let mut first = Vec::new();
            for _ in 0..connections {
                let t = Instant::now();
                let mut stream = open(upstream, via, "1\n").await;
                let mut byte = [0u8; 1];
                stream.read_exact(&mut byte).await.unwrap();
                first.push(t.elapsed());
            }
            let mut stream = open(upstream, via, "echo\n").await;
            let mut trip = Vec::new();
            let mut byte = [0u8; 1];
            for _ in 0..trips {
                let t = Instant::now();
                stream.write_all(b"x").await.unwrap();
                stream.read_exact(&mut byte).await.unwrap();
                trip.push(t.elapsed());
            }
            let t = Instant::now();
            let mut stream = open(upstream, via, &format!("{bulk}\n")).await;
            let mut buffer = vec![0u8; 256 * 1024];
            let mut got = 0;
            loop {
                match stream.read(&mut buffer).await.unwrap() {
                    0 => break,
                    n => got += n,
                }
            }
            assert_eq!(got, bulk);
            (first, trip, got as f64 / t.elapsed().as_secs_f64() / 1e6)
        });
        let (mut first, mut trip) = (first, trip);
        first.sort();
        trip.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{path:>8} {:>14?} {:>14?} {:>14?} {:>14?} {rate:>12.0}",
            percentile(&first, 0.5),
            percentile(&first, 0.99),
            percentile(&trip, 0.5),
            percentile(&trip, 0.99)
        );
        figure(&format!("egress {path}: connection to first byte p50"), ms(percentile(&first, 0.5)), "ms");
        figure(&format!("egress {path}: connection to first byte p99"), ms(percentile(&first, 0.99)), "ms");
        figure(&format!("egress {path}: round trip p50"), ms(percentile(&trip, 0.5)), "ms");
        figure(&format!("egress {path}: round trip p99"), ms(percentile(&trip, 0.99)), "ms");
        figure(&format!("egress {path}: throughput"), rate, "MB/s");
    }
    println!();
}
