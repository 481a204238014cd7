//! The preview proxy (DESIGN 13.1, `--proxy-listen`): HTTP to a port of a sandbox's current
//! run, routed by Host (`<port>-<sandbox>.<domain>`, with `--proxy-domain`) or by path
//! (`/sandboxes/<sandbox>/ports/<port>/...`).
//!
//! Who gets through, and to which run, is berth-core's rule ([`berth_core::port::admit`]):
//! a public port, the port's access token of the current generation, or the API token. The
//! connection into the run is made by the run's supervisor over its session (a container has
//! no network of its own), so every driver is reached the same way. A request goes over a
//! connection into the run in the HTTP version the client spoke; an HTTP/1.1 one a finished
//! request left idle is kept for the next request to the same run and port (the connection's
//! opening is most of a small request's cost); an upgrade (WebSocket) gets its own and becomes
//! a byte stream both ways. Bodies stream through, never held whole.
//!
//! Berth's credentials stop here: the access token (header, query parameter or cookie) and
//! the API token are taken off the request before it goes on.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use berth_core::SandboxId;
use berth_core::port::{self, Credential, Refusal};
use berth_proto::carry::carry;
use berth_proto::v1 as pb;
use berth_proto::v1::sandboxes_client::SandboxesClient;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, warn};

use crate::api::auth::BearerAuth;
use crate::data_dir::DataDir;
use crate::egress::Connection;
use crate::engine::Engine;
use crate::sessions::PortError;

/// How long reaching a gateway that shares the data directory may take.
pub(crate) const PEER_WITHIN: Duration = Duration::from_secs(2);
/// How many bytes of a connection through another gateway are buffered here each way (as
/// many as of one into a run).
const PEER_BUFFER: usize = 4 * berth_proto::carry::CHUNK;

/// The other gateways sharing this one's data directory (and so its host and store): one of
/// them holds the session of a run whose supervisor is not connected here.
#[derive(Clone)]
pub struct Peers {
    dir: PathBuf,
    me: String,
    /// `Bearer <API token>`: gateways sharing a data directory share its token.
    bearer: tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    /// The CA file a peer's certificate is checked against (`--tls-ca`).
    ca: Option<PathBuf>,
    channels: Arc<Mutex<BTreeMap<String, Channel>>>,
    /// TLS to peers' HTTP listeners, made once asked for.
    http_tls: Arc<std::sync::OnceLock<Result<Arc<tokio_rustls::rustls::ClientConfig>, String>>>,
}

impl fmt::Debug for Peers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peers").field("dir", &self.dir).field("me", &self.me).finish_non_exhaustive()
    }
}

impl Peers {
    /// `ca`: what a peer's certificate is checked against when its address is `https://`.
    pub fn new(dir: &Path, me: &str, api_token: &str, ca: Option<PathBuf>) -> Result<Self, String> {
        let mut bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {api_token}")
            .parse()
            .map_err(|_| "the API token is not a valid header value".to_string())?;
        bearer.set_sensitive(true);
        let (dir, me) = (dir.to_path_buf(), me.to_string());
        Ok(Self { dir, me, bearer, ca, channels: Arc::default(), http_tls: Arc::default() })
    }

    /// How this gateway speaks TLS to a peer's HTTP listener (`--tls-ca` as for its gRPC).
    pub(crate) fn http_tls(&self) -> Result<Arc<tokio_rustls::rustls::ClientConfig>, String> {
        let made =
            self.http_tls.get_or_init(|| crate::tls::client_config(self.ca.as_deref(), "--tls-ca").map(Arc::new));
        made.clone()
    }

    /// `Bearer <API token>`, for a call to another gateway.
    pub(crate) fn bearer(&self) -> tonic::metadata::MetadataValue<tonic::metadata::Ascii> {
        self.bearer.clone()
    }

    /// The other gateways' addresses, as they last wrote them.
    fn addresses(&self) -> Vec<String> {
        let data = DataDir::at(self.dir.clone());
        data.addressed_gateways()
            .into_iter()
            .filter(|name| *name != self.me)
            .filter_map(|name| data.read_address(&name))
            .collect()
    }

    /// A channel to the gateway at `address`, made once and kept.
    pub(crate) fn channel(&self, address: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let endpoint = Endpoint::from_shared(address.to_string()).map_err(|e| e.to_string())?;
        let endpoint = crate::tls::endpoint(endpoint, address, self.ca.as_deref())?;
        let endpoint = berth_proto::carry::wide(endpoint).connect_timeout(PEER_WITHIN);
        let channel = endpoint.connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    /// `port` of sandbox `name`'s run through the gateway at `address`, if its session is there.
    async fn through(&self, address: &str, name: &str, port: u16) -> Result<DuplexStream, tonic::Status> {
        let bearer: tonic::metadata::MetadataValue<tonic::metadata::Ascii> = self.bearer.clone();
        let channel = self.channel(address).map_err(tonic::Status::unavailable)?;
        let mut client = SandboxesClient::with_interceptor(channel, move |mut request: tonic::Request<()>| {
            request.metadata_mut().insert("authorization", bearer.clone());
            Ok(request)
        });
        let (tx, rx) = mpsc::channel(8);
        let start = pb::PortForwardStart { name: name.to_string(), port: port.into(), here_only: true };
        let _ = tx.send(pb::PortForwardInput { input: Some(pb::port_forward_input::Input::Start(start)) }).await;
        let reply = client.port_forward(ReceiverStream::new(rx)).await?.into_inner();
        let (ours, theirs) = tokio::io::duplex(PEER_BUFFER);
        let up = |data| pb::PortForwardInput { input: Some(pb::port_forward_input::Input::Data(data)) };
        tokio::spawn(carry(ours, tx, up, reply.map_while(|m| m.ok().map(|m| m.data))));
        Ok(theirs)
    }
}

/// A connection to `port` on the loopback of `sandbox`'s run `generation` (named `name`):
/// through this gateway's session of the run, or (unless `here_only`) through the gateway
/// sharing its data directory that holds one. The error names the sandbox and the port.
pub async fn connect(
    engine: &Engine,
    name: &str,
    sandbox: &SandboxId,
    generation: u64,
    port: u16,
    here_only: bool,
) -> Result<Box<dyn Connection>, Unreached> {
    if let Some(session) = engine.sessions().get(sandbox, generation) {
        return session.open_port(port).await.map_err(|e| Unreached::Refused(unreachable(e, name, port)));
    }
    let Some(peers) = engine.settings().peers.as_ref().filter(|_| !here_only) else {
        return Err(Unreached::NotConnected(unconnected(name)));
    };
    // A run on another node is reached through that node's gateway alone; one on this node,
    // through whichever gateway sharing the data directory holds its session.
    let addresses = match node_elsewhere(engine, sandbox).await {
        Some(address) => vec![address],
        None => peers.addresses(),
    };
    for address in addresses {
        match tokio::time::timeout(PEER_WITHIN, peers.through(&address, name, port)).await {
            Ok(Ok(connection)) => return Ok(Box::new(connection)),
            Ok(Err(status)) if decided(&status) => {
                return Err(Unreached::Refused(status.message().to_string()));
            }
            // Not there, gone (its address file outlived it), or not answering: the next one.
            Ok(Err(_)) | Err(_) => {}
        }
    }
    Err(Unreached::NotConnected(unconnected(name)))
}

/// The address of the gateway of the live node that runs `sandbox`, when that is not this
/// gateway's node (DESIGN 14).
async fn node_elsewhere(engine: &Engine, sandbox: &SandboxId) -> Option<String> {
    let record = engine.store().sandbox(sandbox).await.ok()??;
    let placed = record.placement.clone().filter(|_| !engine.runs_here(&record))?;
    let node = engine.store().node(&placed.node).await.ok()??;
    node.live.then_some(node.offer.address)
}

/// The metadata entry of a port-forward's refusal that says which `Unreached` it is, for a
/// gateway that forwarded the request to read.
const UNREACHED: &str = "berth-unreached";

/// Whether another gateway's refusal is its word on the run (it holds the session and the run
/// refused, or the sandbox changed since this gateway admitted the request) rather than on
/// itself (no session there, or no answer at all).
fn decided(status: &tonic::Status) -> bool {
    match status.metadata().get(UNREACHED).map(|v| v.as_bytes()) {
        Some(which) => which == b"refused",
        None => matches!(status.code(), tonic::Code::FailedPrecondition | tonic::Code::NotFound),
    }
}

/// Why no connection into a run was made.
#[derive(Debug)]
pub enum Unreached {
    /// No gateway here holds the run's session.
    NotConnected(String),
    /// The run was reached and could not connect (nothing listens), or did not answer.
    Refused(String),
}

impl Unreached {
    pub fn message(self) -> String {
        let (Unreached::NotConnected(m) | Unreached::Refused(m)) = self;
        m
    }

    /// A port-forward's answer: no session here is FAILED_PRECONDITION for a request that asked
    /// for this gateway only, else UNAVAILABLE; either way marked with which it is.
    pub fn into_status(self, here_only: bool) -> tonic::Status {
        let (code, which) = match &self {
            Unreached::NotConnected(_) if here_only => (tonic::Code::FailedPrecondition, "not-connected"),
            Unreached::NotConnected(_) => (tonic::Code::Unavailable, "not-connected"),
            Unreached::Refused(_) => (tonic::Code::Unavailable, "refused"),
        };
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert(UNREACHED, tonic::metadata::MetadataValue::from_static(which));
        tonic::Status::with_metadata(code, self.message(), metadata)
    }
}

/// The header that carries a port's access token.
pub const TOKEN_HEADER: &str = "x-berth-port-token";
/// The query parameter (and cookie) that carries it where a header cannot: a link, a browser.
pub const TOKEN_PARAM: &str = "berth_token";

/// Where the proxy serves, as the URLs it hands out name it.
#[derive(Clone, Debug)]
pub struct Preview {
    /// `https` when the proxy speaks TLS, else `http`.
    pub scheme: &'static str,
    /// `host:port` of the proxy as clients reach it.
    pub authority: String,
    /// With it, ports are reached as `<port>-<sandbox>.<domain>`.
    pub domain: Option<String>,
}

impl Preview {
    /// The proxy at `bound` (an unspecified address is reached on loopback).
    pub fn new(scheme: &'static str, bound: SocketAddr, domain: Option<String>) -> Self {
        let host = match bound.ip() {
            ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
            ip if ip.is_unspecified() => "[::1]".to_string(),
            ip if ip.is_ipv6() => format!("[{ip}]"),
            ip => ip.to_string(),
        };
        Self { scheme, authority: format!("{host}:{}", bound.port()), domain }
    }

    /// The URL of `port` of sandbox `name`, with `token` in its query unless it is public.
    pub fn url(&self, name: &str, port: u16, token: Option<&str>) -> String {
        let query = token.map(|t| format!("?{TOKEN_PARAM}={t}")).unwrap_or_default();
        match &self.domain {
            Some(domain) => {
                let listen_port = self.authority.rsplit_once(':').map_or("", |(_, p)| p);
                let implied = matches!((self.scheme, listen_port), ("http", "80") | ("https", "443"));
                let suffix = if implied { String::new() } else { format!(":{listen_port}") };
                format!("{}://{port}-{name}.{domain}{suffix}/{query}", self.scheme)
            }
            None => format!("{}://{}/sandboxes/{name}/ports/{port}/{query}", self.scheme, self.authority),
        }
    }
}

/// Which sandbox and port a request is for, and the path the run sees.
#[derive(Debug, PartialEq, Eq)]
struct Route {
    sandbox: String,
    port: u16,
    /// `Some` for the path form: the path below the port's prefix.
    path: Option<String>,
}

/// The Host form when the host is `<port>-<sandbox>.<domain>`, else the path form.
fn route(host: Option<&str>, path: &str, domain: Option<&str>) -> Option<Route> {
    let by_host = domain.zip(host).and_then(|(domain, host)| {
        let host =
            host.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(h, _)| h);
        let label = host.strip_suffix(domain)?.strip_suffix('.')?;
        let (port, sandbox) = label.split_once('-')?;
        Some(Route { sandbox: sandbox.to_string(), port: port.parse().ok().filter(|p| *p != 0)?, path: None })
    });
    by_host.or_else(|| {
        let rest = path.strip_prefix("/sandboxes/")?;
        let (sandbox, rest) = rest.split_once('/')?;
        let rest = rest.strip_prefix("ports/")?;
        let (port, below) = match rest.split_once('/') {
            Some((port, below)) => (port, format!("/{below}")),
            None => (rest, "/".to_string()),
        };
        Some(Route { sandbox: sandbox.to_string(), port: port.parse().ok().filter(|p| *p != 0)?, path: Some(below) })
    })
}

/// The query without the access token parameter, and the token if it held one.
fn take_token(query: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(query) = query else { return (None, None) };
    let mut token = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix(TOKEN_PARAM).and_then(|v| v.strip_prefix('=')) {
            Some(value) => {
                token = Some(value.to_string());
                false
            }
            None => !pair.is_empty(),
        })
        .collect();
    ((!kept.is_empty()).then(|| kept.join("&")), token)
}

/// The access token in a `Cookie` header, and the header without it (`None`: nothing left).
fn take_cookie(cookie: &str) -> (Option<String>, Option<String>) {
    let mut token = None;
    let kept: Vec<&str> = cookie
        .split(';')
        .map(str::trim)
        .filter(|c| match c.strip_prefix(TOKEN_PARAM).and_then(|v| v.strip_prefix('=')) {
            Some(value) => {
                token = Some(value.to_string());
                false
            }
            None => !c.is_empty(),
        })
        .collect();
    ((!kept.is_empty()).then(|| kept.join("; ")), token)
}

/// What a refusal says, naming the sandbox and the port.
pub fn refused(refusal: &Refusal, name: &str, port: u16) -> String {
    match refusal {
        Refusal::NotFound => format!("no sandbox '{name}'"),
        Refusal::Unauthorized(why) => format!("port {port} of sandbox '{name}': {why}"),
        Refusal::Gone { issued, current } => format!(
            "port {port} of sandbox '{name}': the token is for run {issued}, which is over (the sandbox runs generation {current} now): ask for its URL again"
        ),
        Refusal::NotRunning(phase) => format!("sandbox '{name}' is {phase}: no run serves port {port}"),
    }
}

/// Why a connection into a run was not made, naming the sandbox and the port.
pub fn unreachable(error: PortError, name: &str, port: u16) -> String {
    let (PortError::Refused(why) | PortError::NoAnswer(why)) = error;
    format!("port {port} of sandbox '{name}': {why}")
}

/// A run whose supervisor holds no session here.
pub fn unconnected(name: &str) -> String {
    format!("sandbox '{name}': its run's supervisor is not connected to this gateway")
}

/// Hop-by-hop headers (RFC 9110 7.6.1): this hop's, not passed on (but an upgrade's own).
pub(crate) const HOP_BY_HOP: [&str; 7] =
    ["connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer", "transfer-encoding"];

#[derive(Clone)]
pub struct Proxy {
    engine: Engine,
    auth: BearerAuth,
    domain: Option<String>,
    idle: Arc<Mutex<Idle>>,
}

/// Which run's port an idle connection leads to. The generation is part of it: a connection
/// into one run never carries a request admitted for the next.
type Upstream = (SandboxId, u64, u16);
type Sender = hyper::client::conn::http1::SendRequest<Incoming>;

/// HTTP/1.1 connections into runs that finished a request and wait for the next.
#[derive(Default)]
struct Idle(BTreeMap<Upstream, Vec<(tokio::time::Instant, Sender)>>);

/// How many idle connections into one run's port are kept, and for how long: each holds a
/// connection to the run's server and one of its supervisor's to this gateway.
const IDLE_PER_PORT: usize = 8;
const IDLE_FOR: Duration = Duration::from_secs(30);

/// Whether a connection left idle at `since` is kept at `now`: open, and not kept too long.
fn kept((since, sender): &(tokio::time::Instant, Sender), now: tokio::time::Instant) -> bool {
    now.duration_since(*since) < IDLE_FOR && !sender.is_closed()
}

impl Idle {
    /// An idle connection into `upstream` still open and ready, dropping those closed or kept
    /// too long.
    fn take(&mut self, upstream: &Upstream, now: tokio::time::Instant) -> Option<Sender> {
        let senders = self.0.get_mut(upstream)?;
        senders.retain(|idle| kept(idle, now));
        let sender = senders.iter().rposition(|(_, s)| s.is_ready()).map(|i| senders.remove(i).1);
        if senders.is_empty() {
            self.0.remove(upstream);
        }
        sender
    }

    fn put(&mut self, upstream: Upstream, sender: Sender, now: tokio::time::Instant) {
        // Runs that ended leave their closed connections behind: swept as others come back.
        self.0.retain(|_, senders| {
            senders.retain(|idle| kept(idle, now));
            !senders.is_empty()
        });
        let senders = self.0.entry(upstream).or_default();
        if senders.len() < IDLE_PER_PORT {
            senders.push((now, sender));
        }
    }
}

fn plain(status: StatusCode, message: String) -> Response<Body> {
    let mut response = Response::new(Body::from(format!("{message}\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

impl Proxy {
    pub fn new(engine: Engine, api_token: &str, domain: Option<String>) -> Self {
        Self { engine, auth: BearerAuth::new(api_token), domain, idle: Arc::default() }
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let response = self.forward(request).await.unwrap_or_else(|(status, message)| plain(status, message));
        self.engine.metrics().proxied(response.status().as_u16());
        response
    }

    async fn forward(&self, mut request: Request<Incoming>) -> Result<Response<Body>, (StatusCode, String)> {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string)
            .or_else(|| request.uri().authority().map(ToString::to_string));
        let Some(route) = route(host.as_deref(), request.uri().path(), self.domain.as_deref()) else {
            let form = match &self.domain {
                Some(domain) => format!("<port>-<sandbox>.{domain}, or "),
                None => String::new(),
            };
            return Err((
                StatusCode::NOT_FOUND,
                format!("not a sandbox's port: ask for {form}/sandboxes/<sandbox>/ports/<port>/"),
            ));
        };
        let (query, from_query) = take_token(request.uri().query());
        let headers = request.headers_mut();
        let from_header = headers.remove(TOKEN_HEADER).and_then(|v| v.to_str().ok().map(str::to_string));
        let from_cookie = match headers.remove(header::COOKIE).map(|c| take_cookie(c.to_str().unwrap_or_default())) {
            Some((rest, token)) => {
                if let Some(rest) = rest.and_then(|r| HeaderValue::from_str(&r).ok()) {
                    headers.insert(header::COOKIE, rest);
                }
                token
            }
            None => None,
        };
        // The run's own use of Authorization passes on; only the API token stops here.
        let api = headers.get(header::AUTHORIZATION).is_some_and(|value| self.auth.accepts(value.as_bytes()));
        if api {
            headers.remove(header::AUTHORIZATION);
        }
        let token = from_header.or(from_query.clone()).or(from_cookie);
        let credential = match (&token, api) {
            (_, true) => Credential::ApiToken,
            (Some(token), false) => Credential::PortToken(token),
            (None, false) => Credential::None,
        };
        let name = &route.sandbox;
        let port = route.port;
        let record = self
            .engine
            .store()
            .sandbox_by_name(name)
            .await
            .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, format!("the store did not answer: {e}")))?;
        let generation = port::admit(self.engine.key(), record.as_ref(), port, credential).map_err(|refusal| {
            let status = StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::BAD_GATEWAY);
            (status, refused(&refusal, name, port))
        })?;
        let sandbox = record.map(|r| r.id).expect("admitted, so the record is there");
        // What the run sees: origin form, its own loopback as the host (dev servers refuse
        // hosts they do not know), where the request came from in X-Forwarded-*.
        let path = route.path.as_deref().unwrap_or(request.uri().path()).to_string();
        let target = match &query {
            Some(q) => format!("{path}?{q}"),
            None => path,
        };
        let upgrade = request.headers().contains_key(header::UPGRADE);
        let version = request.version();
        let headers = request.headers_mut();
        let connection_header = headers.get(header::CONNECTION).cloned();
        for name in HOP_BY_HOP {
            headers.remove(name);
        }
        if upgrade && let Some(value) = connection_header {
            headers.insert(header::CONNECTION, value);
        }
        if let Some(host) = &host
            && let Ok(value) = HeaderValue::from_str(host)
        {
            headers.insert(HeaderName::from_static("x-forwarded-host"), value);
        }
        headers.insert(HeaderName::from_static("x-forwarded-proto"), HeaderValue::from_static("http"));
        let local = format!("localhost:{port}");
        headers.insert(header::HOST, HeaderValue::from_str(&local).expect("a host and port is a header value"));
        let uri = if version == Version::HTTP_2 { format!("http://{local}{target}") } else { target };
        *request.uri_mut() =
            uri.parse::<Uri>().map_err(|e| (StatusCode::BAD_REQUEST, format!("the request's target: {e}")))?;
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
        let upstream = (sandbox, generation, port);
        let keep = version != Version::HTTP_2 && !upgrade;
        let idle = keep.then(|| self.idle().take(&upstream, tokio::time::Instant::now())).flatten();
        let (mut response, sender) = match idle {
            Some(mut sender) => match sender.try_send_request(request).await {
                Ok(response) => (response, Some(sender)),
                // Closed between its check and this request, which it never took: a new one.
                Err(mut e) => match e.take_message() {
                    Some(request) => self.open(&upstream, name, request).await?,
                    None => return Err(self.broken(name, port, e.into_error())),
                },
            },
            None => self.open(&upstream, name, request).await?,
        };
        if let Some(mut sender) = sender.filter(|_| keep) {
            // Back for the next request once this one's response has been read to its end (a
            // response abandoned part-way closes the connection instead).
            let idle = self.idle.clone();
            tokio::spawn(async move {
                if sender.ready().await.is_ok() {
                    let mut idle = idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    idle.put(upstream, sender, tokio::time::Instant::now());
                }
            });
        }
        if response.status() == StatusCode::SWITCHING_PROTOCOLS
            && let Some(client_upgrade) = client_upgrade
        {
            let run_upgrade = hyper::upgrade::on(&mut response);
            let engine = self.engine.clone();
            tokio::spawn(async move {
                match tokio::try_join!(client_upgrade, run_upgrade) {
                    Ok((client, run)) => {
                        let carried =
                            tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(run)).await;
                        if let Ok((_, down)) = carried {
                            engine.metrics().proxied_bytes(down);
                        }
                    }
                    Err(e) => debug!(error = %e, "an upgrade through the proxy did not complete"),
                }
            });
        }
        let engine = self.engine.clone();
        let mut response = response.map(|body| {
            Body::new(body.map_frame(move |frame| {
                if let Some(data) = frame.data_ref() {
                    engine.metrics().proxied_bytes(data.len() as u64);
                }
                frame
            }))
        });
        // A browser sent here by a link keeps the token as a cookie for the page's other
        // requests; the path form scopes it to the port's prefix.
        if let Some(token) = from_query {
            let path = match route.path {
                Some(_) => format!("/sandboxes/{name}/ports/{port}/"),
                None => "/".to_string(),
            };
            let cookie = format!("{TOKEN_PARAM}={token}; Path={path}; HttpOnly; SameSite=Lax");
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().append(header::SET_COOKIE, value);
            }
        }
        Ok(response)
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Idle> {
        self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn broken(&self, name: &str, port: u16, e: hyper::Error) -> (StatusCode, String) {
        self.engine.metrics().proxy_upstream_error("broken");
        (StatusCode::BAD_GATEWAY, format!("port {port} of sandbox '{name}': {e}"))
    }

    /// `request` over a new connection into the run: its response, and for HTTP/1.1 the
    /// connection's sender, to be kept.
    async fn open(
        &self,
        (sandbox, generation, port): &Upstream,
        name: &str,
        request: Request<Incoming>,
    ) -> Result<(Response<Incoming>, Option<Sender>), (StatusCode, String)> {
        let connection = connect(&self.engine, name, sandbox, *generation, *port, false).await.map_err(|e| {
            let kind = match e {
                Unreached::NotConnected(_) => "unconnected",
                Unreached::Refused(_) => "refused",
            };
            self.engine.metrics().proxy_upstream_error(kind);
            (StatusCode::BAD_GATEWAY, e.message())
        })?;
        let io = TokioIo::new(connection);
        let bad = |e| self.broken(name, *port, e);
        if request.version() == Version::HTTP_2 {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.map_err(bad)?;
            tokio::spawn(conn);
            Ok((sender.send_request(request).await.map_err(bad)?, None))
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(bad)?;
            tokio::spawn(conn.with_upgrades());
            let response = sender.send_request(request).await.map_err(bad)?;
            Ok((response, Some(sender)))
        }
    }
}

/// Serves the proxy on the connections `incoming` accepts until `shutdown`; those then open
/// are cut. (A production gateway's are TCP's, the simulator's turmoil's.)
pub async fn serve<C>(
    proxy: Proxy,
    incoming: impl futures_util::Stream<Item = std::io::Result<C>>,
    shutdown: impl std::future::Future<Output = ()>,
) where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let proxy = Arc::new(proxy);
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut incoming = std::pin::pin!(incoming);
    loop {
        let connection = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = incoming.next() => match accepted {
                Some(Ok(connection)) => connection,
                Some(Err(e)) => {
                    warn!(error = %e, "the preview proxy could not accept a connection");
                    continue;
                }
                None => break,
            },
        };
        let proxy = proxy.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(proxy.handle(request).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(e) = builder.serve_connection_with_upgrades(TokioIo::new(connection), service).await {
                debug!(error = %e, "a preview proxy connection ended");
            }
        });
        while connections.try_join_next().is_some() {}
    }
    connections.abort_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_refusal_is_its_word_on_the_run_only_when_it_says_so_or_the_sandbox_changed() {
        let unreached = |u: Unreached, here_only| decided(&u.into_status(here_only));
        assert!(!unreached(Unreached::NotConnected(unconnected("web")), true));
        assert!(!unreached(Unreached::NotConnected(unconnected("web")), false));
        assert!(unreached(Unreached::Refused("port 80 of sandbox 'web': connection refused".into()), true));
        // The peer's own admission: the sandbox gone or stopped since this gateway admitted it.
        assert!(decided(&tonic::Status::not_found("no sandbox 'web'")));
        assert!(decided(&tonic::Status::failed_precondition("sandbox 'web' is Stopped")));
        // No answer from the peer itself.
        assert!(!decided(&tonic::Status::unavailable("tcp connect error")));
        assert!(!decided(&tonic::Status::cancelled("gone")));
    }

    #[test]
    fn a_request_is_routed_by_host_under_the_domain_or_else_by_path() {
        let d = Some("preview.test");
        let by_host = |sandbox: &str, port| Some(Route { sandbox: sandbox.into(), port, path: None });
        assert_eq!(route(Some("8080-web.preview.test"), "/a", d), by_host("web", 8080));
        assert_eq!(route(Some("8080-my-app.preview.test:7422"), "/", d), by_host("my-app", 8080));
        let by_path =
            |sandbox: &str, port, path: &str| Some(Route { sandbox: sandbox.into(), port, path: Some(path.into()) });
        assert_eq!(route(Some("127.0.0.1:7422"), "/sandboxes/web/ports/80/x/y", d), by_path("web", 80, "/x/y"));
        assert_eq!(route(None, "/sandboxes/web/ports/80", None), by_path("web", 80, "/"));
        assert_eq!(route(Some("8080-web.preview.test"), "/sandboxes/web/ports/81/", None), by_path("web", 81, "/"));
        for (host, path) in [
            (Some("x-web.preview.test"), "/"),
            (Some("0-web.preview.test"), "/"),
            (Some("8080-web.other.test"), "/"),
            (None, "/sandboxes/web/ports/99999/"),
            (None, "/sandboxes/web/"),
            (None, "/"),
        ] {
            assert_eq!(route(host, path, d), None, "{host:?} {path}");
        }
    }

    #[test]
    fn the_token_is_taken_off_the_query_and_the_cookies() {
        assert_eq!(take_token(Some("berth_token=t1&a=1")), (Some("a=1".into()), Some("t1".into())));
        assert_eq!(take_token(Some("berth_token=t1")), (None, Some("t1".into())));
        assert_eq!(take_token(Some("a=1&b=2")), (Some("a=1&b=2".into()), None));
        assert_eq!(take_token(Some("berth_tokens=x")), (Some("berth_tokens=x".into()), None));
        assert_eq!(take_token(None), (None, None));
        assert_eq!(take_cookie("a=1; berth_token=t2; b=2"), (Some("a=1; b=2".into()), Some("t2".into())));
        assert_eq!(take_cookie("berth_token=t2"), (None, Some("t2".into())));
    }

    #[test]
    fn urls_name_the_port_the_sandbox_and_the_token() {
        let by_path = Preview::new("http", "0.0.0.0:7422".parse().unwrap(), None);
        assert_eq!(
            by_path.url("web", 8080, Some("tok")),
            "http://127.0.0.1:7422/sandboxes/web/ports/8080/?berth_token=tok"
        );
        let by_host = Preview::new("http", "127.0.0.1:80".parse().unwrap(), Some("preview.test".into()));
        assert_eq!(by_host.url("web", 8080, None), "http://8080-web.preview.test/");
        let on_port = Preview::new("http", "[::1]:7422".parse().unwrap(), Some("preview.test".into()));
        assert_eq!(on_port.url("web", 3000, Some("t")), "http://3000-web.preview.test:7422/?berth_token=t");
        assert_eq!(Preview::new("http", "[::]:1".parse().unwrap(), None).authority, "[::1]:1");
        // Over TLS: https, its own port left implied, and the other's spelled out.
        let tls = Preview::new("https", "0.0.0.0:443".parse().unwrap(), Some("preview.test".into()));
        assert_eq!(tls.url("web", 8080, None), "https://8080-web.preview.test/");
        let tls_on_80 = Preview::new("https", "0.0.0.0:80".parse().unwrap(), Some("preview.test".into()));
        assert_eq!(tls_on_80.url("web", 8080, None), "https://8080-web.preview.test:80/");
        let tls_by_path = Preview::new("https", "127.0.0.1:7422".parse().unwrap(), None);
        assert_eq!(tls_by_path.url("web", 1, None), "https://127.0.0.1:7422/sandboxes/web/ports/1/");
    }
}
