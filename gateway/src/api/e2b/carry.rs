//! Routing of E2B's in-sandbox API (DESIGN 14): a call about a sandbox that another node runs
//! is carried, whole, to that node's E2B listener (`--e2b-listen`, which it registers with its
//! lease), since the sessions of its processes and its workspace are on that node's host; the
//! answer is relayed as it comes. This gateway opens the call with the sandbox's access token,
//! which is of this gateway's key, not the node's: the node takes the carried call on the API
//! token the gateways share instead, for the one run this gateway admitted it for.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_core::{NodeId, Sandbox};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::E2b;
use super::envd::{ConnectError, connect_error, sandbox};
use crate::error::ApiError;

/// The header a carried call bears: the API token, which the node checks.
pub(super) const CARRIED: &str = "berth-carried";
/// The generation of the run the carrying gateway admitted the call for.
pub(super) const GENERATION: &str = "berth-generation";

/// Carries a call about a sandbox another node runs to that node; serves every other here (a
/// call carried here already, one this gateway refuses, which its handler says why).
pub(super) async fn carry(State(e2b): State<Arc<E2b>>, request: Request, next: Next) -> Response {
    if e2b.engine.settings().peers.is_none() || request.headers().contains_key(CARRIED) {
        return next.run(request).await;
    }
    // Most calls are about a sandbox this node runs: told from its record alone, and opened by
    // the handler. One that runs elsewhere is opened here, as it is read now.
    let name = request.headers().get("e2b-sandbox-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let Ok(Some(record)) = e2b.engine.store().sandbox_by_name(name).await else { return next.run(request).await };
    if e2b.engine.runs_here(&record) {
        return next.run(request).await;
    }
    let Ok(opened) = sandbox(&e2b, request.headers()).await else { return next.run(request).await };
    let Some(placed) = opened.placement.clone().filter(|_| !e2b.engine.runs_here(&opened)) else {
        return next.run(request).await;
    };
    carried(&e2b, &opened, &placed.node, request).await.unwrap_or_else(IntoResponse::into_response)
}

async fn carried(e2b: &E2b, opened: &Sandbox, node: &NodeId, request: Request) -> Result<Response, ConnectError> {
    let unreachable =
        |why: &str| connect_error("unavailable", format!("sandbox {} runs on node {node}, {why}", opened.name));
    let found =
        e2b.engine.store().node(node).await.map_err(|e| ConnectError::from_status(&ApiError::from(e).into()))?;
    let address = match found {
        Some(found) if !found.live => {
            return Err(unreachable("whose lease has lapsed: try again once it is back or fenced"));
        }
        Some(found) => found.offer.e2b_address,
        None => return Err(unreachable("which is not registered")),
    };
    let address = address.ok_or_else(|| unreachable("which does not serve E2B's API (--e2b-listen)"))?;
    let peers = e2b.engine.settings().peers.as_ref().expect("checked by the caller");
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let target: Uri = format!("{address}{path}").parse().map_err(|e| unreachable(&format!("at {address:?}: {e}")))?;
    let authority = target.authority().map(ToString::to_string).unwrap_or_default();
    for name in crate::ports::HOP_BY_HOP.into_iter().chain(["host", "x-access-token", "upgrade"]) {
        parts.headers.remove(name);
    }
    let host = HeaderValue::from_str(&authority).map_err(|e| unreachable(&format!("at {address:?}: {e}")))?;
    parts.headers.insert(header::HOST, host);
    let mut token = HeaderValue::from_str(&e2b.token).map_err(|_| connect_error("internal", "the API token"))?;
    token.set_sensitive(true);
    parts.headers.insert(CARRIED, token);
    parts.headers.insert(GENERATION, HeaderValue::from(opened.generation));
    parts.uri = Uri::builder().path_and_query(path).build().map_err(|e| connect_error("internal", e.to_string()))?;
    let request = Request::from_parts(parts, body);
    let not_reached = |e: String| unreachable(&format!("not reachable at {address}: {e}"));
    let within = crate::ports::PEER_WITHIN;
    let tcp = tokio::time::timeout(within, tokio::net::TcpStream::connect(&authority))
        .await
        .map_err(|_| not_reached(format!("no connection within {within:?}")))?
        .map_err(|e| not_reached(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let response = match target.scheme_str() {
        Some("https") => {
            let tls = peers.http_tls().map_err(&not_reached)?;
            let host = target.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
            let name =
                rustls_pki_types::ServerName::try_from(host.to_string()).map_err(|e| not_reached(e.to_string()))?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .map_err(|e| not_reached(e.to_string()))?;
            exchange(stream, request).await
        }
        _ => exchange(tcp, request).await,
    };
    Ok(response.map_err(not_reached)?.map(Body::new))
}

/// One request over a new HTTP/1.1 connection on `io`, its answer streamed.
async fn exchange<IO>(io: IO, request: Request) -> Result<axum::http::Response<hyper::body::Incoming>, String>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    sender.send_request(request).await.map_err(|e| crate::error::with_causes(&e))
}
