//! What the end-to-end tests of the preview proxy and of port-forward run inside a sandbox
//! (statically linked by `ci/build-static-supervisor`, for images without a C library).
//!
//! `port-server --http PORT [--http PORT...] [--tcp PORT]`: on each HTTP port, HTTP/1.1 and
//! HTTP/2 (prior knowledge) with `GET /hello` (its port and the Host it was sent), `GET
//! /connection` (the port the request's connection came from, to tell connections apart), `GET
//! /bytes/N` (N bytes of [`pattern`], streamed), `POST /echo` (the body back, streamed) and
//! `/ws` (a WebSocket echoing each message); on the TCP port, every connection's bytes echoed.

use std::convert::Infallible;

use axum::body::Body;
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// Byte `offset` of every download: a sequence whose period (251) no chunk size divides.
fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| ((offset + i) % 251) as u8).collect()
}

const CHUNK: usize = 64 * 1024;

async fn serve(port: u16, from: u16, mut request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_string();
    if path == "/ws" {
        let Some(key) = request.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
            return status(StatusCode::BAD_REQUEST, "not a WebSocket handshake");
        };
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            let Ok(upgraded) = upgrade.await else { return };
            let mut socket = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
            while let Some(Ok(message)) = socket.next().await {
                if (message.is_text() || message.is_binary()) && socket.send(message).await.is_err() {
                    break;
                }
            }
        });
        return Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_ACCEPT, derive_accept_key(key.as_bytes()))
            .body(Body::empty())
            .expect("a valid response");
    }
    if path == "/hello" {
        let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("").to_string();
        return Response::new(Body::from(format!("hello from port {port}, host {host}\n")));
    }
    if path == "/connection" {
        return Response::new(Body::from(format!("connection from port {from}\n")));
    }
    if path == "/echo" {
        return Response::new(Body::new(request.into_body()));
    }
    if let Some(n) = path.strip_prefix("/bytes/").and_then(|n| n.parse::<u64>().ok()) {
        let chunks = futures_util::stream::iter((0..n.div_ceil(CHUNK as u64)).map(move |i| {
            let offset = i * CHUNK as u64;
            let len = (n - offset).min(CHUNK as u64) as usize;
            Ok::<_, Infallible>(pattern(offset, len))
        }));
        return Response::new(Body::from_stream(chunks));
    }
    status(StatusCode::NOT_FOUND, "no such path")
}

fn status(code: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(format!("{message}\n")));
    *response.status_mut() = code;
    response
}

async fn http(port: u16) {
    let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("binding the HTTP port");
    loop {
        let Ok((stream, peer)) = listener.accept().await else { continue };
        tokio::spawn(async move {
            let from = peer.port();
            let service = hyper::service::service_fn(move |request| async move {
                Ok::<_, Infallible>(serve(port, from, request).await)
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let _ = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).await;
        });
    }
}

async fn tcp_echo(port: u16) {
    let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("binding the TCP port");
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        tokio::spawn(async move {
            let (mut read, mut write) = stream.split();
            let _ = tokio::io::copy(&mut read, &mut write).await;
        });
    }
}

#[tokio::main]
async fn main() {
    let mut servers = tokio::task::JoinSet::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let port: u16 = args.next().and_then(|p| p.parse().ok()).expect("each flag takes a port");
        match flag.as_str() {
            "--http" => servers.spawn(http(port)),
            "--tcp" => servers.spawn(tcp_echo(port)),
            other => panic!("unknown flag {other}"),
        };
    }
    println!("serving");
    servers.join_next().await;
}
