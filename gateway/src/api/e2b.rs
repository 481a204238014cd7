//! E2B's public sandbox API (DESIGN 15), served with `--e2b-listen ADDR`: the REST control plane
//! that the unmodified `e2b` SDKs call (`E2B_API_URL`), mapped onto Berth's own commands, so
//! every rule (validation, the CAS, lifetimes, pools) is the one the gRPC API keeps.
//!
//! - a sandbox's E2B id is its Berth name; a template is a Berth template (a claim from its
//!   warm pool when it keeps one), and `base`, when no template has that name, a sandbox that
//!   only waits for commands;
//! - `timeout` is the lifetime's TTL (300 s when none is given, as E2B's own default), ending in
//!   a delete, or in a pause with `autoPause`; `set_timeout` a renew from now;
//! - `metadata` are labels (held to their rules: a key or value that is not one is refused
//!   naming it), `envVars` the spec's environment;
//! - pause and connect (resume) are DESIGN 12.1's freezer pause and resume;
//! - the API key (`X-API-KEY`) is Berth's API token.
//!
//! Answers are E2B's: a create is 201 once the sandbox is Ready; errors are `{"code": <HTTP
//! status>, "message": ...}`, which the SDKs raise as their own exception types. What Berth does
//! not serve (metrics, snapshots and forks through this API, network updates) answers 501
//! saying so.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, Request as HttpRequest, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use berth_core::lifetime::{Lifetime, OnExpiry, Renewal};
use berth_core::{Command, Hold, Outcome, PhaseKind, Request as CoreRequest, Sandbox, SandboxSpec};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tonic::Status;

use crate::engine::Engine;
use crate::error::ApiError;
use crate::store::PageRequest;

/// The envd version Berth answers as: the SDKs gate their calls on it, and refuse on their own
/// side what a lower one lacks.
pub const ENVD_VERSION: &str = "0.5.7";
/// The template the SDKs ask for when none is named.
const BASE_TEMPLATE: &str = "base";
/// The label a sandbox made from a template without a pool keeps its template's name in (a
/// pool's member has it in its record).
const TEMPLATE_LABEL: &str = "e2b.template";
/// E2B's default lifetime, when a create gives none.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a create, a pause or a resume waits for what it asked.
const READY_WITHIN: Duration = Duration::from_secs(120);

mod carry;
mod envd;
mod fs;
mod snapshots;

struct E2b {
    engine: Engine,
    execs: super::exec::ExecApi,
    snapshots: crate::api::snapshots::SnapshotApi,
    token: Arc<str>,
}

type Shared = State<Arc<E2b>>;

/// An error as E2B's API answers it: the HTTP status, and the status again in the body.
struct Refusal {
    status: StatusCode,
    message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Refusal {
    Refusal { status, message: message.into() }
}

fn from_api(e: ApiError) -> Refusal {
    from_status(&Status::from(e))
}

/// A gRPC service's refusal, as E2B's API answers it.
fn from_status(status: &Status) -> Refusal {
    error(super::http::http_status(status.code()), status.message())
}

async fn authorized(State(e2b): Shared, headers: HeaderMap, request: HttpRequest, next: Next) -> Response {
    let presented = headers.get("x-api-key").map(HeaderValue::as_bytes).unwrap_or_default();
    if presented.is_empty() || !bool::from(presented.ct_eq(e2b.token.as_bytes())) {
        return error(StatusCode::UNAUTHORIZED, "missing or invalid API key (header X-API-KEY: Berth's API token)")
            .into_response();
    }
    next.run(request).await
}

/// `POST /v2/sandboxes`'s body, as the SDKs send it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    env_vars: BTreeMap<String, String>,
    auto_pause: Option<bool>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

/// What E2B's API says of a sandbox just made or connected to: with the access token of its
/// current run's in-sandbox API.
fn sandbox_body(engine: &Engine, s: &Sandbox) -> Value {
    json!({
        "templateID": template_of(s),
        "sandboxID": &*s.name,
        "clientID": engine.settings().name,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": access_token(engine, s),
    })
}

fn access_token(engine: &Engine, s: &Sandbox) -> String {
    berth_core::port::derive_api_token(engine.key(), &s.id, s.generation).expose().to_string()
}

fn template_of(s: &Sandbox) -> String {
    let labelled = || s.spec.labels.get(TEMPLATE_LABEL).cloned();
    s.template.clone().or_else(labelled).unwrap_or_else(|| BASE_TEMPLATE.to_string())
}

/// The sandbox's user labels: E2B's metadata.
fn metadata(s: &Sandbox) -> BTreeMap<&str, &str> {
    s.spec
        .labels
        .iter()
        .filter(|(k, _)| !k.starts_with(berth_core::validate::RESERVED_LABEL_PREFIX) && *k != TEMPLATE_LABEL)
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// `running` or `paused`, for the phases E2B lists; `None` for the rest (stopped, failed, on
/// their way out), which E2B has no word for.
fn state(s: &Sandbox) -> Option<&'static str> {
    match s.phase.kind() {
        PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready => Some("running"),
        PhaseKind::Paused => Some("paused"),
        PhaseKind::Stopping | PhaseKind::Stopped | PhaseKind::Deleting | PhaseKind::Error => None,
    }
}

fn rfc3339(t: berth_core::Timestamp) -> String {
    let ms = u64::try_from(t.unix_millis()).unwrap_or(0);
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A listed sandbox (`ListedSandbox`), or a detailed one: the same fields.
fn listed(engine: &Engine, s: &Sandbox, state: &str) -> Value {
    let limits = &s.spec.limits;
    json!({
        "templateID": template_of(s),
        "sandboxID": &*s.name,
        "clientID": engine.settings().name,
        "startedAt": rfc3339(s.created_at),
        // No deadline: it runs until it is killed. E2B always has one; the latest time it can say.
        "endAt": s.deadline.map_or_else(|| "9999-12-31T23:59:59Z".to_string(), rfc3339),
        "cpuCount": limits.cpu_millis.map_or(0, |m| m.div_ceil(1000)),
        "memoryMB": limits.memory_bytes.map_or(0, |b| b >> 20),
        "diskSizeMB": 0,
        "state": state,
        "envdVersion": ENVD_VERSION,
        "metadata": metadata(s),
    })
}

async fn record(engine: &Engine, id: &str) -> Result<Sandbox, Refusal> {
    if berth_core::validate::dns_label("sandboxID", id).is_err() {
        return Err(error(StatusCode::NOT_FOUND, format!("sandbox {id:?} not found")));
    }
    match engine.store().sandbox_by_name(id).await {
        Ok(Some(s)) if state(&s).is_some() => Ok(s),
        Ok(_) => Err(error(StatusCode::NOT_FOUND, format!("sandbox {id:?} not found"))),
        Err(e) => Err(from_api(e.into())),
    }
}

async fn execute(engine: &Engine, command: Command) -> Result<Sandbox, Refusal> {
    match engine.execute(&CoreRequest::new(command, None)).await {
        Ok(Outcome::Sandbox(s)) => Ok(*s),
        Ok(_) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, "a sandbox command returned no sandbox")),
        Err(e) => Err(from_api(e)),
    }
}

/// Waits until sandbox `name` is Ready: E2B answers a create or a resume with a sandbox that
/// takes commands at once. Failed, or not Ready in time: the reason.
async fn ready(engine: &Engine, name: &str) -> Result<Sandbox, String> {
    reached(engine, name, berth_proto::v1::Phase::Ready).await
}

/// Waits until sandbox `name` is in `phase`: E2B's calls return once what they ask is done.
async fn reached(engine: &Engine, name: &str, phase: berth_proto::v1::Phase) -> Result<Sandbox, String> {
    use berth_proto::v1::Phase;
    let mut events = super::watch::one(engine.clone(), name.to_string()).await.map_err(|s| s.message().to_string())?;
    let waiting = async {
        while let Some(event) = events.next().await {
            let event = event.map_err(|s| s.message().to_string())?;
            if event.removed {
                return Err(format!("sandbox '{name}' was deleted meanwhile"));
            }
            let Some(wire) = event.sandbox else { continue };
            match Phase::try_from(wire.phase) {
                Ok(now) if now == phase => {
                    let record = engine.store().sandbox_by_name(name).await.map_err(|e| e.to_string())?;
                    return record.ok_or_else(|| format!("sandbox '{name}' is gone"));
                }
                Ok(Phase::Error | Phase::Stopped) => {
                    let why = wire.failure.map_or_else(|| "it stopped".to_string(), |f| f.message);
                    return Err(format!("sandbox '{name}' ended: {why}"));
                }
                _ => {}
            }
        }
        Err(format!("sandbox '{name}': its watch ended first"))
    };
    match tokio::time::timeout(READY_WITHIN, waiting).await {
        Ok(result) => result,
        Err(_) => Err(format!("sandbox '{name}' was not {phase:?} within {} s", READY_WITHIN.as_secs())),
    }
}

fn ttl(timeout: Option<u64>) -> Result<Duration, Refusal> {
    match timeout {
        Some(0) => Err(error(StatusCode::BAD_REQUEST, "timeout must be at least 1 second")),
        Some(secs) => Ok(Duration::from_secs(secs)),
        None => Ok(DEFAULT_TIMEOUT),
    }
}

fn parse<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, Refusal> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { bytes };
    serde_json::from_slice(bytes).map_err(|e| error(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

/// Fields of a create Berth does not act on: refused, naming them, rather than ignored.
fn unsupported(rest: &BTreeMap<String, Value>) -> Result<(), Refusal> {
    let refused: Vec<&str> = rest
        .iter()
        .filter(|(key, value)| !value.is_null() && !matches!(key.as_str(), "secure" | "autoPauseMemory"))
        .map(|(key, _)| key.as_str())
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    Err(error(
        StatusCode::BAD_REQUEST,
        format!("Berth's E2B API does not support {}: leave them unset", refused.join(", ")),
    ))
}

async fn create(State(e2b): Shared, bytes: Bytes) -> Response {
    match create_sandbox(&e2b.engine, bytes).await {
        Ok(body) => (StatusCode::CREATED, axum::Json(body)).into_response(),
        Err(refusal) => {
            // The SDKs post a create again after a 5xx unless told not to: one that failed
            // after its sandbox was made would make a second.
            let mut response = refusal.into_response();
            if response.status().is_server_error() {
                response.headers_mut().insert("should-retry", HeaderValue::from_static("false"));
            }
            response
        }
    }
}

async fn create_sandbox(engine: &Engine, bytes: Bytes) -> Result<Value, Refusal> {
    let new: NewSandbox = parse(&bytes)?;
    unsupported(&new.rest)?;
    let ttl = ttl(new.timeout)?;
    let template_name = new.template_id.unwrap_or_else(|| BASE_TEMPLATE.to_string());
    let template = match berth_core::validate::dns_label("templateID", &template_name) {
        Ok(()) => engine.store().template(&template_name).await.map_err(|e| from_api(e.into()))?,
        Err(_) => None,
    };
    let on_expiry = if new.auto_pause == Some(true) { OnExpiry::Pause } else { OnExpiry::Delete };
    let lifetime = Lifetime { ttl: Some(ttl), on_expiry, ..Lifetime::default() };
    let made = match template {
        Some(t) if t.min_ready > 0 => {
            if !new.env_vars.is_empty() || new.auto_pause == Some(true) {
                let why = format!(
                    "template '{template_name}' keeps a warm pool, whose sandboxes run already: envVars and an \
                     on-timeout pause cannot be set"
                );
                return Err(error(StatusCode::BAD_REQUEST, why));
            }
            let claim = Command::ClaimSandbox {
                template: template_name.clone(),
                labels: new.metadata,
                providers: Default::default(),
            };
            let claimed = execute(engine, claim).await?;
            let renew = Command::RenewSandbox { name: claimed.name.to_string(), renewal: Renewal::Ttl(ttl) };
            if let Err(refusal) = execute(engine, renew).await {
                let _ = execute(engine, Command::DeleteSandbox { name: claimed.name.to_string() }).await;
                return Err(refusal);
            }
            claimed
        }
        found => {
            let spec = match found {
                Some(t) => {
                    let mut spec = t.spec.clone();
                    spec.env.extend(new.env_vars);
                    spec.labels.extend(new.metadata);
                    spec.labels.insert(TEMPLATE_LABEL.to_string(), template_name.clone());
                    SandboxSpec { lifetime, ..spec }
                }
                None if template_name == BASE_TEMPLATE => SandboxSpec {
                    image: berth_core::spec::DEFAULT_IMAGE.into(),
                    command: vec!["sleep".into(), "infinity".into()],
                    env: new.env_vars,
                    labels: new.metadata,
                    lifetime,
                    ..SandboxSpec::default()
                },
                None => {
                    let (metadata, env) = (new.metadata, &new.env_vars);
                    return create_from_snapshot(engine, &template_name, metadata, env, ttl, new.auto_pause).await;
                }
            };
            let id = engine.new_sandbox_id();
            let name = id.to_string();
            let command = Command::CreateSandbox { id, name, spec, providers: Default::default(), deadline: None };
            execute(engine, command).await?
        }
    };
    answered_ready(engine, made).await
}

/// A sandbox just made, answered once Ready. E2B has no half-made sandbox: one that did not
/// start is deleted, and the reason is the create's. On a task of its own, so that a client
/// gone meanwhile leaves nothing either.
async fn answered_ready(engine: &Engine, made: Sandbox) -> Result<Value, Refusal> {
    let waiting = engine.clone();
    let waited = tokio::spawn(async move {
        let ready = ready(&waiting, &made.name).await;
        if ready.is_err() {
            let _ = execute(&waiting, Command::DeleteSandbox { name: made.name.to_string() }).await;
        }
        ready
    });
    match waited.await {
        Ok(Ok(s)) => Ok(sandbox_body(engine, &s)),
        Ok(Err(why)) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, why)),
        Err(e) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, format!("waiting for the sandbox: {e}"))),
    }
}

/// A create naming a snapshot (`Sandbox.create(snapshot_id)`): its spec and files, this
/// create's metadata and timeout. A snapshot's spec is its own: envs and an on-timeout pause
/// are refused.
async fn create_from_snapshot(
    engine: &Engine,
    snapshot: &str,
    metadata: BTreeMap<String, String>,
    env: &BTreeMap<String, String>,
    ttl: Duration,
    auto_pause: Option<bool>,
) -> Result<Value, Refusal> {
    let found = match berth_core::validate::dns_label("templateID", snapshot) {
        Ok(()) => engine.store().snapshot(snapshot).await.map_err(|e| from_api(e.into()))?,
        Err(_) => None,
    };
    if found.is_none() {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!("template '{snapshot}' not found (nor a snapshot of that name)"),
        ));
    }
    if !env.is_empty() || auto_pause == Some(true) {
        let why = format!(
            "a sandbox made from snapshot '{snapshot}' has its spec: envVars and an on-timeout pause cannot be set"
        );
        return Err(error(StatusCode::BAD_REQUEST, why));
    }
    let id = engine.new_sandbox_id();
    let command = Command::CreateFromSnapshot {
        name: id.to_string(),
        id,
        snapshot: snapshot.to_string(),
        labels: metadata,
        providers: Default::default(),
        deadline: Some(engine.now().plus(ttl)),
    };
    let made = execute(engine, command).await?;
    answered_ready(engine, made).await
}

/// `GET /v2/sandboxes?metadata=&state=&limit=&nextToken=`.
async fn list(State(e2b): Shared, Query(query): Query<Vec<(String, String)>>) -> Response {
    let mut selector = BTreeMap::new();
    let mut states: Option<Vec<String>> = None;
    let mut page = PageRequest { after: None, limit: 100 };
    for (key, value) in query {
        match key.as_str() {
            // Quoted twice by the SDKs: `k=v&k2=v2`, each key and value quoted again.
            "metadata" => {
                selector.extend(form_urlencoded::parse(value.as_bytes()).into_owned());
            }
            "state" => states = Some(value.split(',').map(str::to_string).collect()),
            "limit" => match value.parse::<usize>() {
                Ok(n) if (1..=1000).contains(&n) => page.limit = n,
                _ => {
                    return error(StatusCode::BAD_REQUEST, format!("limit must be 1 to 1000, not {value:?}"))
                        .into_response();
                }
            },
            "nextToken" => page.after = (!value.is_empty()).then_some(value),
            "order" | "template" | "startedAfter" => {
                return error(
                    StatusCode::NOT_IMPLEMENTED,
                    format!("Berth's E2B API does not filter or order by {key}"),
                )
                .into_response();
            }
            other => {
                return error(StatusCode::BAD_REQUEST, format!("unknown query parameter {other:?}")).into_response();
            }
        }
    }
    for (k, v) in &selector {
        if let Err(e) = berth_core::validate::label(k, v) {
            return error(StatusCode::BAD_REQUEST, format!("metadata: {e}")).into_response();
        }
    }
    let listing = match e2b.engine.store().list_sandboxes(&page, &selector).await {
        Ok(listing) => listing,
        Err(e) => return from_api(e.into()).into_response(),
    };
    let items: Vec<Value> = listing
        .items
        .iter()
        .filter_map(|s| {
            let state = state(s)?;
            states
                .as_ref()
                .is_none_or(|wanted| wanted.iter().any(|w| w == state))
                .then(|| listed(&e2b.engine, s, state))
        })
        .collect();
    let mut response = axum::Json(items).into_response();
    if let Some(next) = listing.next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert("x-next-token", next);
    }
    response
}

async fn get_one(State(e2b): Shared, Path(id): Path<String>) -> Response {
    match record(&e2b.engine, &id).await {
        Ok(s) => {
            let state = state(&s).unwrap_or("running");
            let mut body = listed(&e2b.engine, &s, state);
            body["envdAccessToken"] = json!(access_token(&e2b.engine, &s));
            body["lifecycle"] = json!({
                "autoResume": false,
                "onTimeout": if s.spec.lifetime.on_expiry == OnExpiry::Pause { "pause" } else { "kill" },
            });
            axum::Json(body).into_response()
        }
        Err(refusal) => refusal.into_response(),
    }
}

/// `DELETE /sandboxes/{id}`: whatever its phase (E2B has no word for a stopped or failed one,
/// and lists it nowhere, but a kill still ends it).
async fn kill(State(e2b): Shared, Path(id): Path<String>) -> Response {
    let found = match berth_core::validate::dns_label("sandboxID", &id) {
        Ok(()) => e2b.engine.store().sandbox_by_name(&id).await.map_err(|e| from_api(e.into())),
        Err(_) => Ok(None),
    };
    match found {
        Ok(Some(s)) if s.intent != berth_core::Intent::Deleted => {}
        Ok(_) => return error(StatusCode::NOT_FOUND, format!("sandbox {id:?} not found")).into_response(),
        Err(refusal) => return refusal.into_response(),
    }
    match execute(&e2b.engine, Command::DeleteSandbox { name: id }).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

#[derive(Deserialize)]
struct Timeout {
    timeout: u64,
}

async fn set_timeout(State(e2b): Shared, Path(id): Path<String>, bytes: Bytes) -> Response {
    let result = async {
        let Timeout { timeout } = parse(&bytes)?;
        record(&e2b.engine, &id).await?;
        execute(&e2b.engine, Command::RenewSandbox { name: id, renewal: Renewal::Ttl(ttl(Some(timeout))?) }).await
    };
    match result.await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// `POST /sandboxes/{id}/pause`: a freezer pause. Berth keeps a paused run's memory, so the
/// `memory` a body may carry changes nothing; one paused already is 409, as E2B answers it.
async fn pause(State(e2b): Shared, Path(id): Path<String>) -> Response {
    let result = async {
        let s = record(&e2b.engine, &id).await?;
        if s.phase.kind() == PhaseKind::Paused {
            return Err(error(StatusCode::CONFLICT, format!("sandbox {id:?} is paused already")));
        }
        execute(&e2b.engine, Command::PauseSandbox { name: id.clone(), hold: Hold::Freezer }).await?;
        // A paused sandbox is kept, as E2B keeps it: for the longest lifetime the gateway gives.
        let kept = Renewal::Ttl(e2b.engine.settings().limits.max_ttl);
        execute(&e2b.engine, Command::RenewSandbox { name: id.clone(), renewal: kept }).await?;
        reached(&e2b.engine, &id, berth_proto::v1::Phase::Paused)
            .await
            .map_err(|why| error(StatusCode::INTERNAL_SERVER_ERROR, why))
    };
    match result.await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

#[derive(Deserialize, Default)]
struct Connect {
    timeout: Option<u64>,
}

/// `POST /v2/sandboxes/{id}/connect`: a paused sandbox is resumed and waited for; a running one
/// is answered as it is. A `timeout` renews its lifetime from now.
async fn connect(State(e2b): Shared, Path(id): Path<String>, bytes: Bytes) -> Response {
    let engine = &e2b.engine;
    let result = async {
        let Connect { timeout } = parse(&bytes)?;
        let s = record(engine, &id).await?;
        let paused = s.intent == berth_core::Intent::Paused;
        // Renewed first: a sandbox paused at its timeout is past its deadline, which a resume
        // refuses. A resumed one runs for the timeout asked, or E2B's default.
        if paused || timeout.is_some() {
            let renewal = Renewal::Ttl(ttl(timeout)?);
            execute(engine, Command::RenewSandbox { name: id.clone(), renewal }).await?;
        }
        if paused {
            execute(engine, Command::ResumeSandbox { name: id.clone() }).await?;
        }
        ready(engine, &id).await.map_err(|why| error(StatusCode::INTERNAL_SERVER_ERROR, why))
    };
    match result.await {
        Ok(s) => axum::Json(sandbox_body(engine, &s)).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// Every other path: what E2B's API or its in-sandbox daemon serves and Berth does not.
async fn not_served(request: HttpRequest) -> Response {
    let path = request.uri().path().to_string();
    error(StatusCode::NOT_IMPLEMENTED, format!("Berth's E2B API does not serve {} {path}", request.method()))
        .into_response()
}

pub fn router(engine: &Engine, token: &str) -> Router {
    let activity = crate::engine::activity::Activity::new(engine.clone());
    let execs = crate::engine::execs::Execs::new(engine.clone());
    let execs = super::exec::ExecApi::new(execs, activity, engine.shutdown().clone());
    let snapshots = crate::api::snapshots::SnapshotApi::new(engine.clone());
    let e2b = Arc::new(E2b { engine: engine.clone(), execs, snapshots, token: token.into() });
    let public = Router::new()
        .route("/v2/sandboxes", post(create).get(list))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/snapshots", get(snapshots::list))
        .fallback(not_served)
        .route_layer(middleware::from_fn_with_state(e2b.clone(), authorized));
    // The in-sandbox API: each call proves it may reach the sandbox with its access token, and
    // is served by the node that runs the sandbox.
    let envd = Router::new()
        .route("/health", get(envd::health))
        .route("/process.Process/Start", post(envd::start))
        .route("/process.Process/Connect", post(envd::connect))
        .route("/process.Process/List", post(envd::list))
        .route("/process.Process/StreamInput", post(envd::stream_input))
        .route("/process.Process/{method}", post(envd::send))
        .route("/filesystem.Filesystem/{method}", post(fs::call))
        // The upload is bounded as it is spooled (`--max-upload-bytes`), not by axum's default.
        .route("/files", get(fs::download).post(fs::upload).layer(axum::extract::DefaultBodyLimit::disable()))
        .route_layer(middleware::from_fn_with_state(e2b.clone(), carry::carry));
    public.merge(envd).with_state(e2b)
}
