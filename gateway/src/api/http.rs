//! The public API as JSON over HTTP (`--http-listen`), for curl and languages without a gRPC
//! stack. Each route calls the gRPC service itself, so validation, errors and semantics are the
//! same; bodies and replies are the messages in the proto3 JSON mapping (the protos' field
//! names; 64-bit integers as strings, enums by name; unknown fields refused). Streams (a watch,
//! logs, an exec's output) are newline-delimited JSON, one message a line, ending with the
//! stream's last message or an error line. An exec over HTTP takes no stdin.
//!
//! The same bearer token as gRPC (`authorization: Bearer <token>`). gRPC status codes map to HTTP
//! ones as Google's APIs map them; an error's body is `{"code": "NOT_FOUND", "message": "..."}`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request as HttpRequest, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use berth_proto::v1 as pb;
use berth_proto::v1::execs_server::Execs as _;
use berth_proto::v1::gateway_server::Gateway;
use berth_proto::v1::logs_server::Logs as _;
use berth_proto::v1::nodes_server::Nodes;
use berth_proto::v1::providers_server::Providers;
use berth_proto::v1::sandboxes_server::Sandboxes;
use berth_proto::v1::snapshots_server::Snapshots;
use berth_proto::v1::templates_server::Templates;
use berth_proto::v1::volumes_server::Volumes;
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Code, Status};

use super::auth::BearerAuth;
use super::{exec, info, logs, nodes, public, snapshots, templates, volumes};
use crate::engine::Engine;
use crate::engine::activity::Activity;
use crate::engine::execs::Execs;
use crate::engine::logs::Logs;

struct Api {
    sandboxes: public::SandboxApi,
    providers: public::ProviderApi,
    templates: templates::TemplateApi,
    snapshots: snapshots::SnapshotApi,
    volumes: volumes::VolumeApi,
    nodes: nodes::NodeApi,
    execs: exec::ExecApi,
    logs: logs::LogsApi,
    gateway: info::GatewayApi,
    auth: BearerAuth,
}

type Shared = State<Arc<Api>>;

/// The HTTP status Google's APIs give a gRPC code.
pub(super) fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The code's name as the protos spell it: `NOT_FOUND`.
fn code_name(code: Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

fn error_body(status: &Status) -> serde_json::Value {
    serde_json::json!({"code": code_name(status.code()), "message": status.message()})
}

fn error(status: &Status) -> Response {
    (http_status(status.code()), axum::Json(error_body(status))).into_response()
}

fn reply<T: Serialize>(result: Result<tonic::Response<T>, Status>) -> Response {
    match result {
        Ok(r) => axum::Json(r.into_inner()).into_response(),
        Err(status) => error(&status),
    }
}

/// A request body: the message in its JSON mapping (an empty body is the empty message).
fn body<T: DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, Status> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| Status::invalid_argument(format!("invalid JSON body: {e}")))
}

/// A stream of messages as newline-delimited JSON; an error ends it with `{"error": {...}}`.
fn lines<T, S>(result: Result<tonic::Response<S>, Status>) -> Response
where
    T: Serialize + Send + 'static,
    S: Stream<Item = Result<T, Status>> + Send + 'static,
{
    let stream = match result {
        Ok(r) => r.into_inner(),
        Err(status) => return error(&status),
    };
    let body = stream
        .scan(false, |ended, item| {
            // An error is the stream's last line.
            let next = (!*ended).then_some(item);
            *ended = next.as_ref().is_some_and(Result::is_err);
            std::future::ready(next)
        })
        .map(|item| {
            let mut line = match &item {
                Ok(message) => serde_json::to_vec(message).unwrap_or_default(),
                Err(status) => {
                    serde_json::to_vec(&serde_json::json!({"error": error_body(status)})).unwrap_or_default()
                }
            };
            line.push(b'\n');
            Ok::<_, std::convert::Infallible>(Bytes::from(line))
        });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn request<T>(message: T) -> tonic::Request<T> {
    tonic::Request::new(message)
}

/// Runs `call` on a body parsed as `T`, or answers the parse error.
macro_rules! with_body {
    ($bytes:expr, |$parsed:ident: $t:ty| $call:expr) => {
        match body::<$t>(&$bytes) {
            Ok($parsed) => $call,
            Err(status) => error(&status),
        }
    };
}

async fn authorized(State(api): Shared, headers: HeaderMap, request: HttpRequest, next: Next) -> Response {
    match headers.get(header::AUTHORIZATION) {
        Some(value) if api.auth.accepts(value.as_bytes()) => next.run(request).await,
        Some(_) => error(&Status::unauthenticated("invalid bearer token")),
        None => error(&Status::unauthenticated("missing bearer token (header `authorization: Bearer <token>`)")),
    }
}

async fn get_info(State(api): Shared) -> Response {
    reply(api.gateway.get_info(request(pb::GetInfoRequest {})).await)
}

async fn create_sandbox(State(api): Shared, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::CreateSandboxRequest| reply(api.sandboxes.create_sandbox(request(r)).await))
}

/// `?page_size=&page_token=&selector=KEY=VALUE` (repeated).
async fn list_sandboxes(State(api): Shared, Query(query): Query<Vec<(String, String)>>) -> Response {
    let mut r = pb::ListSandboxesRequest::default();
    for (key, value) in query {
        match key.as_str() {
            "page_size" => match value.parse() {
                Ok(n) => r.page_size = n,
                Err(_) => {
                    return error(&Status::invalid_argument(format!("invalid page_size: {value:?} is not a number")));
                }
            },
            "page_token" => r.page_token = value,
            "selector" => {
                if let Err(e) = select(&mut r.label_selector, &value) {
                    return error(&e);
                }
            }
            other => return error(&unknown_parameter(other)),
        }
    }
    reply(api.sandboxes.list_sandboxes(request(r)).await)
}

/// `?cursor=&selector=KEY=VALUE` (repeated): the fleet's changes, as NDJSON.
async fn watch_sandboxes(State(api): Shared, Query(query): Query<Vec<(String, String)>>) -> Response {
    let mut r = pb::WatchSandboxesRequest::default();
    for (key, value) in query {
        match key.as_str() {
            "cursor" => r.cursor = value,
            "selector" => {
                if let Err(e) = select(&mut r.label_selector, &value) {
                    return error(&e);
                }
            }
            other => return error(&unknown_parameter(other)),
        }
    }
    lines(api.sandboxes.watch_sandboxes(request(r)).await)
}

/// Adds a `selector=KEY=VALUE` query parameter to a label selector.
fn select(selector: &mut BTreeMap<String, String>, value: &str) -> Result<(), Status> {
    let (k, v) = value
        .split_once('=')
        .ok_or_else(|| Status::invalid_argument(format!("invalid selector: {value:?} is not KEY=VALUE")))?;
    selector.insert(k.to_string(), v.to_string());
    Ok(())
}

fn unknown_parameter(name: &str) -> Status {
    Status::invalid_argument(format!("unknown query parameter {name:?}"))
}

async fn get_sandbox(State(api): Shared, Path(name): Path<String>) -> Response {
    reply(api.sandboxes.get_sandbox(request(pb::GetSandboxRequest { name })).await)
}

async fn watch_sandbox(State(api): Shared, Path(name): Path<String>) -> Response {
    lines(api.sandboxes.watch_sandbox(request(pb::WatchSandboxRequest { name })).await)
}

/// `POST /v1/sandboxes/{name}/{verb}`: stop, start, pause, resume, delete, renew; the body's fields beside the
/// name (an expected version, a renewal, a pause's `checkpoint`).
async fn sandbox_verb(State(api): Shared, Path((name, verb)): Path<(String, String)>, bytes: Bytes) -> Response {
    match verb.as_str() {
        "renew" => {
            with_body!(bytes, |r: pb::RenewSandboxRequest| reply(
                api.sandboxes.renew_sandbox(request(pb::RenewSandboxRequest { name, ..r })).await
            ))
        }
        "pause" => with_body!(bytes, |r: pb::PauseRequest| reply(
            api.sandboxes.pause_sandbox(request(pb::PauseRequest { name, ..r })).await
        )),
        "stop" | "start" | "resume" | "delete" => with_body!(bytes, |r: pb::LifecycleRequest| {
            let r = request(pb::LifecycleRequest { name, ..r });
            reply(match verb.as_str() {
                "stop" => api.sandboxes.stop_sandbox(r).await,
                "start" => api.sandboxes.start_sandbox(r).await,
                "resume" => api.sandboxes.resume_sandbox(r).await,
                _ => api.sandboxes.delete_sandbox(r).await,
            })
        }),
        other => error(&Status::not_found(format!(
            "no sandbox action {other:?} (stop, start, pause, resume, delete, renew)"
        ))),
    }
}

async fn port_url(State(api): Shared, Path((name, port)): Path<(String, u32)>) -> Response {
    reply(api.sandboxes.get_port_url(request(pb::GetPortUrlRequest { name, port })).await)
}

async fn delete_sandbox(State(api): Shared, Path(name): Path<String>) -> Response {
    reply(api.sandboxes.delete_sandbox(request(pb::LifecycleRequest { name, expected_resource_version: None })).await)
}

async fn create_provider(State(api): Shared, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::CreateProviderRequest| reply(api.providers.create_provider(request(r)).await))
}

async fn list_providers(State(api): Shared, Query(r): Query<PageQuery>) -> Response {
    let r =
        pb::ListProvidersRequest { page_size: r.page_size.unwrap_or(0), page_token: r.page_token.unwrap_or_default() };
    reply(api.providers.list_providers(request(r)).await)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    page_size: Option<u32>,
    page_token: Option<String>,
}

async fn get_provider(State(api): Shared, Path(name): Path<String>) -> Response {
    reply(api.providers.get_provider(request(pb::GetProviderRequest { name })).await)
}

async fn delete_provider(State(api): Shared, Path(name): Path<String>, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::DeleteProviderRequest| reply(
        api.providers.delete_provider(request(pb::DeleteProviderRequest { name, ..r })).await
    ))
}

async fn attach_provider(
    State(api): Shared,
    Path((sandbox, provider)): Path<(String, String)>,
    bytes: Bytes,
) -> Response {
    with_body!(bytes, |r: pb::AttachRequest| reply(
        api.providers.attach_provider(request(pb::AttachRequest { sandbox, provider, ..r })).await
    ))
}

async fn detach_provider(
    State(api): Shared,
    Path((sandbox, provider)): Path<(String, String)>,
    bytes: Bytes,
) -> Response {
    with_body!(bytes, |r: pb::AttachRequest| reply(
        api.providers.detach_provider(request(pb::AttachRequest { sandbox, provider, ..r })).await
    ))
}

async fn create_template(State(api): Shared, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::CreateTemplateRequest| reply(api.templates.create_template(request(r)).await))
}

async fn list_templates(State(api): Shared, Query(r): Query<PageQuery>) -> Response {
    let r =
        pb::ListTemplatesRequest { page_size: r.page_size.unwrap_or(0), page_token: r.page_token.unwrap_or_default() };
    reply(api.templates.list_templates(request(r)).await)
}

async fn get_template(State(api): Shared, Path(name): Path<String>) -> Response {
    reply(api.templates.get_template(request(pb::GetTemplateRequest { name })).await)
}

async fn delete_template(State(api): Shared, Path(name): Path<String>, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::DeleteTemplateRequest| reply(
        api.templates.delete_template(request(pb::DeleteTemplateRequest { name, ..r })).await
    ))
}

async fn set_pool(State(api): Shared, Path(template): Path<String>, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::SetPoolRequest| reply(
        api.templates.set_pool(request(pb::SetPoolRequest { template, ..r })).await
    ))
}

async fn claim(State(api): Shared, Path(template): Path<String>, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::ClaimSandboxRequest| reply(
        api.templates.claim_sandbox(request(pb::ClaimSandboxRequest { template, ..r })).await
    ))
}

async fn create_snapshot(State(api): Shared, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::CreateSnapshotRequest| reply(api.snapshots.create_snapshot(request(r)).await))
}

async fn list_snapshots(State(api): Shared, Query(r): Query<PageQuery>) -> Response {
    let r =
        pb::ListSnapshotsRequest { page_size: r.page_size.unwrap_or(0), page_token: r.page_token.unwrap_or_default() };
    reply(api.snapshots.list_snapshots(request(r)).await)
}

async fn get_snapshot(State(api): Shared, Path(name): Path<String>) -> Response {
    reply(api.snapshots.get_snapshot(request(pb::GetSnapshotRequest { name })).await)
}

async fn delete_snapshot(State(api): Shared, Path(name): Path<String>, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::DeleteSnapshotRequest| reply(
        api.snapshots.delete_snapshot(request(pb::DeleteSnapshotRequest { name, ..r })).await
    ))
}

async fn create_volume(State(api): Shared, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::CreateVolumeRequest| reply(api.volumes.create_volume(request(r)).await))
}

async fn list_volumes(State(api): Shared, Query(r): Query<PageQuery>) -> Response {
    let r =
        pb::ListVolumesRequest { page_size: r.page_size.unwrap_or(0), page_token: r.page_token.unwrap_or_default() };
    reply(api.volumes.list_volumes(request(r)).await)
}

async fn get_volume(State(api): Shared, Path(name): Path<String>) -> Response {
    reply(api.volumes.get_volume(request(pb::GetVolumeRequest { name })).await)
}

async fn delete_volume(State(api): Shared, Path(name): Path<String>, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::DeleteVolumeRequest| reply(
        api.volumes.delete_volume(request(pb::DeleteVolumeRequest { name, ..r })).await
    ))
}

async fn list_nodes(State(api): Shared) -> Response {
    reply(api.nodes.list_nodes(request(pb::ListNodesRequest {})).await)
}

async fn get_node(State(api): Shared, Path(id): Path<String>) -> Response {
    reply(api.nodes.get_node(request(pb::GetNodeRequest { id })).await)
}

async fn drain_node(State(api): Shared, Path(id): Path<String>) -> Response {
    reply(api.nodes.drain_node(request(pb::DrainNodeRequest { id })).await)
}

async fn undrain_node(State(api): Shared, Path(id): Path<String>) -> Response {
    reply(api.nodes.undrain_node(request(pb::DrainNodeRequest { id })).await)
}

async fn delete_node(State(api): Shared, Path(id): Path<String>) -> Response {
    reply(api.nodes.delete_node(request(pb::DeleteNodeRequest { id })).await)
}

async fn fork(State(api): Shared, Path(name): Path<String>, bytes: Bytes) -> Response {
    with_body!(bytes, |r: pb::ForkSandboxRequest| reply(
        api.snapshots.fork_sandbox(request(pb::ForkSandboxRequest { name, ..r })).await
    ))
}

/// `POST /v1/sandboxes/{name}/execs`: an `ExecStart` (no stdin); its output as it comes.
async fn run_exec(State(api): Shared, Path(sandbox): Path<String>, bytes: Bytes) -> Response {
    with_body!(bytes, |start: pb::ExecStart| {
        if start.stdin || start.tty {
            return error(&Status::invalid_argument(
                "invalid stdin: an exec over HTTP takes no stdin and no terminal; use gRPC",
            ));
        }
        let start = pb::ExecStart { sandbox, ..start };
        let started = exec::open_exec(&api.execs, &Default::default(), start, futures_util::stream::empty()).await;
        lines(started.map(tonic::Response::new))
    })
}

async fn list_execs(State(api): Shared, Path(sandbox): Path<String>, Query(r): Query<PageQuery>) -> Response {
    let r = pb::ListExecsRequest {
        sandbox,
        page_size: r.page_size.unwrap_or(0),
        page_token: r.page_token.unwrap_or_default(),
    };
    reply(api.execs.list_execs(request(r)).await)
}

async fn get_exec(State(api): Shared, Path((sandbox, exec_id)): Path<(String, String)>) -> Response {
    reply(api.execs.get_exec(request(pb::ExecRequest { sandbox, exec_id })).await)
}

async fn cancel_exec(State(api): Shared, Path((sandbox, exec_id)): Path<(String, String)>) -> Response {
    reply(api.execs.cancel_exec(request(pb::ExecRequest { sandbox, exec_id })).await)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct OffsetQuery {
    offset: Option<u64>,
}

async fn attach_exec(
    State(api): Shared,
    Path((sandbox, exec_id)): Path<(String, String)>,
    Query(q): Query<OffsetQuery>,
) -> Response {
    let r = pb::AttachExecRequest { sandbox, exec_id, offset: q.offset.unwrap_or(0) };
    lines(api.execs.attach_exec(request(r)).await)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LogsQuery {
    generation: Option<u64>,
    offset: Option<u64>,
    follow: Option<bool>,
}

async fn read_logs(State(api): Shared, Path(sandbox): Path<String>, Query(q): Query<LogsQuery>) -> Response {
    let r = pb::ReadLogsRequest {
        sandbox,
        generation: q.generation.unwrap_or(0),
        offset: q.offset.unwrap_or(0),
        follow: q.follow.unwrap_or(false),
    };
    lines(api.logs.read_logs(request(r)).await)
}

/// Every route, behind the token.
pub fn router(engine: &Engine, token: &str) -> Router {
    let activity = Activity::new(engine.clone());
    let api = Arc::new(Api {
        sandboxes: public::SandboxApi::new(engine.clone()),
        providers: public::ProviderApi::new(engine.clone()),
        templates: templates::TemplateApi::new(engine.clone()),
        snapshots: snapshots::SnapshotApi::new(engine.clone()),
        volumes: volumes::VolumeApi::new(engine.clone()),
        nodes: nodes::NodeApi::new(engine.clone()),
        execs: exec::ExecApi::new(Execs::new(engine.clone()), activity.clone(), engine.shutdown().clone()),
        logs: logs::LogsApi::new(Logs::new(engine.clone()), activity, engine.shutdown().clone()),
        gateway: info::GatewayApi::new(engine.clone()),
        auth: BearerAuth::new(token),
    });
    Router::new()
        .route("/v1/info", get(get_info))
        .route("/v1/sandboxes", post(create_sandbox).get(list_sandboxes))
        .route("/v1/sandboxes:watch", get(watch_sandboxes))
        .route("/v1/sandboxes/{name}", get(get_sandbox).delete(delete_sandbox))
        .route("/v1/sandboxes/{name}/watch", get(watch_sandbox))
        .route("/v1/sandboxes/{name}/logs", get(read_logs))
        .route("/v1/sandboxes/{name}/execs", post(run_exec).get(list_execs))
        .route("/v1/sandboxes/{name}/execs/{id}", get(get_exec))
        .route("/v1/sandboxes/{name}/execs/{id}/output", get(attach_exec))
        .route("/v1/sandboxes/{name}/execs/{id}/cancel", post(cancel_exec))
        .route("/v1/sandboxes/{name}/providers/{provider}", post(attach_provider).delete(detach_provider))
        .route("/v1/sandboxes/{name}/fork", post(fork))
        .route("/v1/sandboxes/{name}/ports/{port}/url", get(port_url))
        .route("/v1/sandboxes/{name}/{verb}", post(sandbox_verb))
        .route("/v1/providers", post(create_provider).get(list_providers))
        .route("/v1/providers/{name}", get(get_provider).delete(delete_provider))
        .route("/v1/templates", post(create_template).get(list_templates))
        .route("/v1/templates/{name}", get(get_template).delete(delete_template))
        .route("/v1/templates/{name}/pool", post(set_pool))
        .route("/v1/templates/{name}/claim", post(claim))
        .route("/v1/snapshots", post(create_snapshot).get(list_snapshots))
        .route("/v1/snapshots/{name}", get(get_snapshot).delete(delete_snapshot))
        .route("/v1/volumes", post(create_volume).get(list_volumes))
        .route("/v1/volumes/{name}", get(get_volume).delete(delete_volume))
        .route("/v1/nodes", get(list_nodes))
        .route("/v1/nodes/{id}", get(get_node).delete(delete_node))
        .route("/v1/nodes/{id}/drain", post(drain_node))
        .route("/v1/nodes/{id}/undrain", post(undrain_node))
        .route_layer(middleware::from_fn_with_state(api.clone(), authorized))
        .with_state(api)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_http_statuses_and_are_named_as_the_protos_name_them() {
        assert_eq!(
            (http_status(Code::NotFound), code_name(Code::NotFound)),
            (StatusCode::NOT_FOUND, "NOT_FOUND".into())
        );
        assert_eq!(code_name(Code::FailedPrecondition), "FAILED_PRECONDITION");
        assert_eq!(http_status(Code::Aborted), StatusCode::CONFLICT);
        assert_eq!(http_status(Code::Unavailable), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(http_status(Code::InvalidArgument), StatusCode::BAD_REQUEST);
    }
}
