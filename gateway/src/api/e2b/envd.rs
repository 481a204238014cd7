//! E2B's in-sandbox process API (envd's `process.Process`, `E2B_SANDBOX_URL`), spoken as the
//! SDKs speak it: the Connect protocol with its JSON codec over HTTP/1.1, streams framed as
//! envelopes (a flags byte, a big-endian length, the message; flag 2 ends a stream), errors as
//! `{"code": "not_found", "message": ...}`. Each process is a Berth exec (DESIGN 8.1), so it
//! runs once, for the sandbox's current run, and always ends:
//!
//! - a process's pid is its exec's id, `e2b-<pid>`, drawn at random and unused in the sandbox;
//! - `Start` admits the exec and streams its output; `Connect` attaches to it from its first
//!   byte; `SendInput`, `StreamInput`, `CloseStdin`, `SendSignal` and `Update` (a terminal's
//!   size) reach its run through this gateway's session of it;
//! - the sandbox is named by the `E2b-Sandbox-Id` header, and the caller proves it may reach it
//!   with `X-Access-Token`: the in-sandbox API's access token of the sandbox's current run
//!   (`port::derive_api_token`: per generation like a port's, in a MAC domain of its own, so no
//!   preview URL's token and no public port opens it), which a create or a connect returns;
//! - a command's timeout (`connect-timeout-ms`) is the exec's: it is killed, and the stream
//!   ends `deadline_exceeded`.
//!
//! Commands run as the sandbox's own user: a call naming another (`user=`) is refused.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use berth_core::exec::{Exec, ExecId};
use berth_core::port::Refusal as PortRefusal;
use berth_core::{PhaseKind, Sandbox};
use berth_proto::v1 as pb;
use berth_proto::v1::exec_input::Input;
use berth_proto::v1::exec_output::Output;
use berth_proto::v1::execs_server::Execs as _;
use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::E2b;
use crate::api::exec::{self, ExecApi};

/// How often an idle stream says it is alive (the SDKs ask for every 50 s).
const KEEPALIVE: Duration = Duration::from_secs(30);
/// The largest request message read.
const MAX_MESSAGE: usize = 4 << 20;

/// A Connect error: its code, as Connect names it, and the message.
pub(super) struct ConnectError {
    pub(super) code: &'static str,
    pub(super) message: String,
}

pub(super) fn connect_error(code: &'static str, message: impl Into<String>) -> ConnectError {
    ConnectError { code, message: message.into() }
}

impl ConnectError {
    pub(super) fn from_status(status: &tonic::Status) -> Self {
        use tonic::Code;
        let code = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::Unauthenticated => "unauthenticated",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Cancelled => "canceled",
            Code::Unimplemented => "unimplemented",
            Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => "internal",
        };
        connect_error(code, status.message())
    }

    fn body(&self) -> Value {
        json!({"code": self.code, "message": self.message})
    }
}

impl IntoResponse for ConnectError {
    /// As a unary call's answer, with the HTTP status Connect gives the code.
    fn into_response(self) -> Response {
        let status = match self.code {
            "invalid_argument" | "failed_precondition" => StatusCode::BAD_REQUEST,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            "permission_denied" => StatusCode::FORBIDDEN,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, axum::Json(self.body())).into_response()
    }
}

pub(super) fn unary(message: Value) -> Response {
    axum::Json(message).into_response()
}

/// One envelope of a stream: `flags`, the length, the JSON.
fn envelope(flags: u8, message: &Value) -> Bytes {
    let json = serde_json::to_vec(message).unwrap_or_default();
    let mut framed = Vec::with_capacity(json.len() + 5);
    framed.push(flags);
    framed.extend_from_slice(&u32::try_from(json.len()).unwrap_or(u32::MAX).to_be_bytes());
    framed.extend_from_slice(&json);
    Bytes::from(framed)
}

/// The envelope that ends a stream: nothing, or the error that ended it.
fn end_of_stream(error: Option<ConnectError>) -> Bytes {
    envelope(2, &error.map_or_else(|| json!({}), |e| json!({"error": e.body()})))
}

fn streamed(frames: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    let body = Body::from_stream(frames.map(Ok::<_, std::convert::Infallible>));
    ([(header::CONTENT_TYPE, "application/connect+json")], body).into_response()
}

/// The messages of a streamed request, as they come: each envelope's JSON.
fn messages(body: Body) -> impl Stream<Item = Result<Value, ConnectError>> + Send {
    let chunks = body.into_data_stream();
    futures_util::stream::unfold((chunks, Vec::<u8>::new()), |(mut chunks, mut buffered)| async move {
        loop {
            if buffered.len() >= 5 {
                let length = u32::from_be_bytes([buffered[1], buffered[2], buffered[3], buffered[4]]) as usize;
                if length > MAX_MESSAGE {
                    let e = connect_error("resource_exhausted", format!("a message of {length} bytes is too large"));
                    return Some((Err(e), (chunks, Vec::new())));
                }
                if buffered.len() >= 5 + length {
                    let frame: Vec<u8> = buffered.drain(..5 + length).collect();
                    if frame[0] & 2 != 0 {
                        return None;
                    }
                    let parsed = serde_json::from_slice(&frame[5..])
                        .map_err(|e| connect_error("invalid_argument", format!("invalid JSON message: {e}")));
                    return Some((parsed, (chunks, buffered)));
                }
            }
            match chunks.next().await {
                Some(Ok(data)) => buffered.extend_from_slice(&data),
                Some(Err(e)) => return Some((Err(connect_error("canceled", e.to_string())), (chunks, Vec::new()))),
                None if buffered.is_empty() => return None,
                None => {
                    let e = connect_error("invalid_argument", "the request ended inside a message");
                    return Some((Err(e), (chunks, Vec::new())));
                }
            }
        }
    })
}

/// A unary call's message (its body is the JSON, as is).
pub(super) fn unary_message(bytes: &Bytes) -> Result<Value, ConnectError> {
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
    serde_json::from_slice(bytes).map_err(|e| connect_error("invalid_argument", format!("invalid JSON message: {e}")))
}

/// The sandbox the call names, once its access token opens it, and Ready.
pub(super) async fn sandbox(e2b: &E2b, headers: &HeaderMap) -> Result<Sandbox, ConnectError> {
    let name = headers.get("e2b-sandbox-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
    if berth_core::validate::dns_label("E2b-Sandbox-Id", name).is_err() {
        return Err(connect_error("invalid_argument", format!("no sandbox named by E2b-Sandbox-Id: {name:?}")));
    }
    let record = e2b.engine.store().sandbox_by_name(name).await.map_err(|e| {
        let status = tonic::Status::from(crate::error::ApiError::from(e));
        ConnectError::from_status(&status)
    })?;
    let admitted = match headers.get(super::carry::CARRIED) {
        // Carried from the gateway a client speaks to, which opened it for one run.
        Some(presented) => {
            if !bool::from(presented.as_bytes().ct_eq(e2b.token.as_bytes())) {
                return Err(connect_error("unauthenticated", "a carried call bears another API token"));
            }
            let generation = headers.get(super::carry::GENERATION).and_then(|v| v.to_str().ok()?.parse().ok());
            let generation =
                generation.ok_or_else(|| connect_error("invalid_argument", "a carried call names no run"))?;
            berth_core::port::admit_api_carried(e2b.engine.key(), record.as_ref(), generation)
        }
        None => {
            let token = headers.get("x-access-token").and_then(|v| v.to_str().ok());
            berth_core::port::admit_api(e2b.engine.key(), record.as_ref(), token)
        }
    };
    match admitted {
        Ok(_) => record.ok_or_else(|| connect_error("not_found", format!("sandbox {name} was not found"))),
        // The SDKs take "was not found" for a sandbox that is not running.
        Err(PortRefusal::NotFound) => Err(connect_error("unavailable", format!("sandbox {name} was not found"))),
        Err(PortRefusal::Unauthorized(why)) => Err(connect_error("unauthenticated", format!("X-Access-Token: {why}"))),
        Err(PortRefusal::Gone { .. }) => Err(connect_error(
            "unauthenticated",
            "X-Access-Token is of an earlier run of the sandbox: connect to it again for the current one",
        )),
        Err(PortRefusal::NotRunning(PhaseKind::Paused)) => {
            Err(connect_error("unavailable", format!("sandbox {name} is paused: connect to it to resume it")))
        }
        Err(PortRefusal::NotRunning(phase)) => {
            Err(connect_error("unavailable", format!("sandbox {name} is {phase}, not running")))
        }
    }
}

/// Commands run as the sandbox's user: an `authorization: Basic` naming another is refused.
fn check_user(headers: &HeaderMap) -> Result<(), ConnectError> {
    let Some(value) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else { return Ok(()) };
    let decoded = value.strip_prefix("Basic ").and_then(|b| BASE64.decode(b).ok()).unwrap_or_default();
    let user = String::from_utf8_lossy(&decoded);
    let user = user.split(':').next().unwrap_or_default();
    if user.is_empty() || user == "user" {
        return Ok(());
    }
    Err(connect_error(
        "invalid_argument",
        format!("Berth runs commands as the sandbox's own user: user {user:?} is not supported"),
    ))
}

/// The pid of an exec made for a process (its id spelled exactly as `exec_id` spells it).
fn pid_of(id: &ExecId) -> Option<u32> {
    let pid = id.as_str().strip_prefix("e2b-")?.parse().ok()?;
    (exec_id(pid) == *id).then_some(pid)
}

fn exec_id(pid: u32) -> ExecId {
    ExecId::parse("pid", &format!("e2b-{pid}")).unwrap_or_else(|_| unreachable!("e2b-<digits> is an exec id"))
}

/// The pid a process selector names; selecting by tag is not served.
fn selected(message: &Value, field: &str) -> Result<u32, ConnectError> {
    let selector = &message[field];
    if let Some(pid) = selector.get("pid") {
        return pid
            .as_u64()
            .or_else(|| pid.as_str().and_then(|s| s.parse().ok()))
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| connect_error("invalid_argument", format!("{field}.pid is not a pid")));
    }
    if selector.get("tag").is_some() {
        return Err(connect_error("invalid_argument", "Berth selects processes by pid, not by tag"));
    }
    Err(connect_error("invalid_argument", format!("{field} names no process")))
}

/// The exec of process `pid` of the sandbox, or `not_found`.
async fn process(api: &ExecApi, sandbox: &Sandbox, pid: u32) -> Result<Exec, ConnectError> {
    match api.execs().get(&sandbox.id, &exec_id(pid)).await {
        // One of an earlier run is over: no process of this one.
        Ok(Some(exec)) if exec.generation == sandbox.generation => Ok(exec),
        Ok(_) => Err(connect_error("not_found", format!("process with pid {pid} not found"))),
        Err(e) => Err(ConnectError::from_status(&e.into())),
    }
}

/// Bytes as the Connect JSON codec writes them: base64, padded or not, standard or URL-safe.
fn bytes_field(value: &Value) -> Result<Vec<u8>, ConnectError> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let lenient = GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let standard = GeneralPurpose::new(&base64::alphabet::STANDARD, lenient);
    let url_safe = GeneralPurpose::new(&base64::alphabet::URL_SAFE, lenient);
    let text = value.as_str().ok_or_else(|| connect_error("invalid_argument", "input is not a base64 string"))?;
    standard
        .decode(text)
        .or_else(|_| url_safe.decode(text))
        .map_err(|_| connect_error("invalid_argument", "input is not base64"))
}

/// What a `ProcessInput` (`{"stdin": ...}` or `{"pty": ...}`) hands the exec.
fn input_of(input: &Value) -> Result<Input, ConnectError> {
    match (input.get("stdin"), input.get("pty")) {
        (Some(data), _) | (None, Some(data)) => Ok(Input::Stdin(bytes_field(data)?)),
        (None, None) => Err(connect_error("invalid_argument", "input carries neither stdin nor pty")),
    }
}

async fn deliver(api: &ExecApi, exec: &Exec, input: Input) -> Result<(), ConnectError> {
    if exec.state.is_terminal() {
        return Err(connect_error(
            "not_found",
            format!("process with pid {} has ended", pid_of(&exec.id).unwrap_or(0)),
        ));
    }
    match exec::deliver(api, exec, input, &mut None).await {
        true => Ok(()),
        false => Err(connect_error(
            "unavailable",
            "the process's run is not served through this gateway now: retry, or reach it through the gateway its sandbox's run is connected to",
        )),
    }
}

/// The end event of a process, from its exec's final state.
fn end_event(exec: &pb::Exec) -> Value {
    let state = pb::ExecState::try_from(exec.state).unwrap_or(pb::ExecState::Unspecified);
    let (code, status, error) = match state {
        pb::ExecState::Exited => {
            let code = exec.exit_code.unwrap_or(0);
            (code, format!("exit status {code}"), None)
        }
        pb::ExecState::Signalled => {
            let signal = exec.signal.unwrap_or(0);
            (-1, format!("signal: {signal}"), None)
        }
        pb::ExecState::TimedOut => (-1, "timed out".to_string(), Some("the command timed out".to_string())),
        _ => (-1, exec.message.clone(), Some(format!("{state:?}: {}", exec.message))),
    };
    let mut end = json!({"exitCode": code, "exited": state == pb::ExecState::Exited, "status": status});
    if let Some(error) = error {
        end["error"] = json!(error);
    }
    json!({"event": {"end": end}})
}

/// A process's event stream from an exec's output: the start event with its pid, its output,
/// keepalives while it is quiet, its end; a timed-out exec ends the stream `deadline_exceeded`.
fn event_stream(pid: u32, output: exec::OutputStream) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        if tx.send(envelope(0, &json!({"event": {"start": {"pid": pid}}}))).await.is_err() {
            return;
        }
        let mut output = output;
        let mut ended = None;
        loop {
            let next = tokio::select! {
                next = output.next() => next,
                () = tokio::time::sleep(KEEPALIVE) => {
                    if tx.send(envelope(0, &json!({"event": {"keepalive": {}}}))).await.is_err() {
                        return;
                    }
                    continue;
                }
                () = tx.closed() => return,
            };
            let frame = match next {
                Some(Ok(pb::ExecOutput { output: Some(Output::Chunk(chunk)) })) => {
                    let stream = match pb::OutputStream::try_from(chunk.stream) {
                        Ok(pb::OutputStream::Stderr) => "stderr",
                        Ok(pb::OutputStream::Tty) => "pty",
                        _ => "stdout",
                    };
                    envelope(0, &json!({"event": {"data": {stream: BASE64.encode(&chunk.data)}}}))
                }
                Some(Ok(pb::ExecOutput { output: Some(Output::End(exec)) })) => {
                    if pb::ExecState::try_from(exec.state) == Ok(pb::ExecState::TimedOut) {
                        ended = Some(connect_error("deadline_exceeded", "the command timed out and was killed"));
                    }
                    envelope(0, &end_event(&exec))
                }
                // The admission, and output no longer kept: nothing E2B has a word for.
                Some(Ok(_)) => continue,
                Some(Err(status)) => {
                    ended = Some(ConnectError::from_status(&status));
                    break;
                }
                None => break,
            };
            if tx.send(frame).await.is_err() {
                return;
            }
        }
        let _ = tx.send(end_of_stream(ended)).await;
    });
    streamed(ReceiverStream::new(rx))
}

/// Reads a stream call's one request message.
async fn first_message(body: Body) -> Result<Value, ConnectError> {
    let mut messages = Box::pin(messages(body));
    messages.next().await.unwrap_or_else(|| Err(connect_error("invalid_argument", "the request has no message")))
}

fn timeout_ms(headers: &HeaderMap) -> Option<u64> {
    headers.get("connect-timeout-ms").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).filter(|ms| *ms > 0)
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

fn window(pty: &Value) -> Option<pb::WindowSize> {
    let size = pty.get("size")?;
    let dimension = |key: &str| size.get(key).and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok()).unwrap_or(0);
    Some(pb::WindowSize { rows: dimension("rows"), cols: dimension("cols") })
}

/// `GET /health`: 204 while the sandbox named runs; else 502 saying why, which the SDKs take
/// for a sandbox that is not running (`is_running()`, and their probe after a failed call).
pub(super) async fn health(State(e2b): State<Arc<E2b>>, headers: HeaderMap) -> Response {
    match sandbox(&e2b, &headers).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) if e.code == "unauthenticated" || e.code == "invalid_argument" => e.into_response(),
        Err(e) => (StatusCode::BAD_GATEWAY, axum::Json(json!({"message": e.message}))).into_response(),
    }
}

pub(super) async fn start(State(e2b): State<Arc<E2b>>, headers: HeaderMap, body: Body) -> Response {
    match start_process(&e2b, &headers, body).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn start_process(e2b: &E2b, headers: &HeaderMap, body: Body) -> Result<Response, ConnectError> {
    // The request is read (it is bounded) before anything refuses it: a reply sent while the
    // client still writes closes the connection under it, and it sees a broken pipe, not why.
    let request = first_message(body).await?;
    let sandbox = sandbox(e2b, headers).await?;
    check_user(headers)?;
    let config = &request["process"];
    let cmd = config["cmd"].as_str().unwrap_or_default();
    if cmd.is_empty() {
        return Err(connect_error("invalid_argument", "process.cmd is empty"));
    }
    if request.get("tag").is_some_and(|t| !t.is_null()) {
        return Err(connect_error("invalid_argument", "Berth selects processes by pid: a tag is not supported"));
    }
    let env: std::collections::BTreeMap<String, String> = config["envs"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
        .unwrap_or_default();
    let pty = request.get("pty").filter(|p| !p.is_null());
    let mut argv = vec![cmd.to_string()];
    argv.extend(strings(&config["args"]));
    let api = &e2b.execs;
    // A pid not in use in the sandbox: drawn again on a clash (rare), whether the check below
    // or the admission finds it.
    loop {
        let pid = u32::try_from(e2b.engine.random() % 2_000_000_000).unwrap_or(1) + 1000;
        match api.execs().get(&sandbox.id, &exec_id(pid)).await {
            Ok(None) => {}
            Ok(Some(_)) => continue,
            Err(e) => return Err(ConnectError::from_status(&e.into())),
        }
        let start = pb::ExecStart {
            sandbox: sandbox.name.to_string(),
            argv: argv.clone(),
            env: env.clone(),
            cwd: config["cwd"].as_str().unwrap_or_default().to_string(),
            tty: pty.is_some(),
            stdin: pty.is_some() || request["stdin"].as_bool().unwrap_or(false),
            timeout_ms: timeout_ms(headers),
            exec_id: exec_id(pid).to_string(),
            window: pty.and_then(window),
        };
        let metadata = tonic::metadata::MetadataMap::new();
        let mut output = match exec::open_exec(api, &metadata, start, futures_util::stream::empty()).await {
            Ok(output) => output,
            Err(status) if status.code() == tonic::Code::AlreadyExists => continue,
            Err(status) => return Err(ConnectError::from_status(&status)),
        };
        let admitted = match output.next().await {
            Some(Ok(pb::ExecOutput { output: Some(Output::Admitted(admitted)) })) => admitted,
            Some(Err(status)) => return Err(ConnectError::from_status(&status)),
            _ => return Err(connect_error("internal", "the exec's stream did not begin with its admission")),
        };
        // The token opened one run: a restart between its check and the admission gives a
        // command to another, which it does not open.
        if admitted.generation != sandbox.generation {
            let cancel = pb::ExecRequest { sandbox: sandbox.name.to_string(), exec_id: admitted.id };
            let _ = api.cancel_exec(tonic::Request::new(cancel)).await;
            return Err(connect_error("unauthenticated", "the sandbox was restarted: connect to it again"));
        }
        return Ok(event_stream(pid, output));
    }
}

pub(super) async fn connect(State(e2b): State<Arc<E2b>>, headers: HeaderMap, body: Body) -> Response {
    let attached = async {
        let request = first_message(body).await?;
        let sandbox = sandbox(&e2b, &headers).await?;
        let pid = selected(&request, "process")?;
        let exec = process(&e2b.execs, &sandbox, pid).await?;
        let request =
            pb::AttachExecRequest { sandbox: sandbox.name.to_string(), exec_id: exec.id.to_string(), offset: 0 };
        let output =
            e2b.execs.attach_exec(tonic::Request::new(request)).await.map_err(|s| ConnectError::from_status(&s))?;
        Ok::<_, ConnectError>(event_stream(pid, output.into_inner()))
    };
    attached.await.unwrap_or_else(IntoResponse::into_response)
}

pub(super) async fn list(State(e2b): State<Arc<E2b>>, headers: HeaderMap) -> Response {
    let listed = async {
        let sandbox = sandbox(&e2b, &headers).await?;
        let mut processes = Vec::new();
        let mut page = crate::store::PageRequest { after: None, limit: 500 };
        loop {
            let batch =
                e2b.execs.execs().list(&sandbox.name, &page).await.map_err(|e| ConnectError::from_status(&e.into()))?;
            for exec in batch.items.iter().filter(|e| !e.state.is_terminal()) {
                let Some(pid) = pid_of(&exec.id) else { continue };
                let (cmd, args) = exec.spec.argv.split_first().map_or(("", &[][..]), |(c, a)| (c.as_str(), a));
                let mut config = json!({"cmd": cmd, "args": args});
                if !exec.spec.cwd.is_empty() {
                    config["cwd"] = json!(exec.spec.cwd);
                }
                processes.push(json!({"config": config, "pid": pid}));
            }
            match batch.next {
                Some(next) => page.after = Some(next),
                None => break,
            }
        }
        Ok::<_, ConnectError>(unary(json!({"processes": processes})))
    };
    listed.await.unwrap_or_else(IntoResponse::into_response)
}

/// The unary calls that hand a running process one input: `SendInput`, `SendSignal`,
/// `CloseStdin` and `Update`.
pub(super) async fn send(
    State(e2b): State<Arc<E2b>>,
    axum::extract::Path(method): axum::extract::Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let sent = async {
        let sandbox = sandbox(&e2b, &headers).await?;
        let message = unary_message(&bytes)?;
        let pid = selected(&message, "process")?;
        let input = match method.as_str() {
            "SendInput" => input_of(&message["input"])?,
            "SendSignal" => match &message["signal"] {
                Value::String(s) if s == "SIGNAL_SIGKILL" => Input::Signal(9),
                Value::String(s) if s == "SIGNAL_SIGTERM" => Input::Signal(15),
                Value::Number(n) if n.as_u64() == Some(9) => Input::Signal(9),
                Value::Number(n) if n.as_u64() == Some(15) => Input::Signal(15),
                _ => return Err(connect_error("invalid_argument", "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")),
            },
            "CloseStdin" => Input::CloseStdin(pb::CloseStdin {}),
            "Update" => match message.get("pty").and_then(window) {
                Some(size) => Input::Resize(size),
                None => return Err(connect_error("invalid_argument", "pty.size is missing")),
            },
            other => {
                return Err(connect_error("unimplemented", format!("Berth does not serve process.Process/{other}")));
            }
        };
        let exec = process(&e2b.execs, &sandbox, pid).await?;
        let signal = matches!(input, Input::Signal(_));
        match deliver(&e2b.execs, &exec, input).await {
            // The run is reached through another gateway (its node's, when another node runs
            // it): a kill is a cancel, carried there.
            Err(e) if signal && e.code == "unavailable" => {
                let cancel = pb::ExecRequest { sandbox: sandbox.name.to_string(), exec_id: exec.id.to_string() };
                e2b.execs.cancel_exec(tonic::Request::new(cancel)).await.map_err(|s| ConnectError::from_status(&s))?;
            }
            delivered => delivered?,
        }
        Ok::<_, ConnectError>(unary(json!({})))
    };
    sent.await.unwrap_or_else(IntoResponse::into_response)
}

/// `StreamInput`: a start naming the process, then its input, message by message; one empty
/// reply once the client's side ends.
pub(super) async fn stream_input(State(e2b): State<Arc<E2b>>, headers: HeaderMap, body: Body) -> Response {
    let mut messages = Box::pin(messages(body));
    let streamed_in = async {
        let sandbox = sandbox(&e2b, &headers).await?;
        let first = messages.next().await.unwrap_or_else(|| Err(connect_error("invalid_argument", "no start")))?;
        let pid = selected(&first["start"], "process")?;
        let exec = process(&e2b.execs, &sandbox, pid).await?;
        let mut told = None;
        loop {
            let message = tokio::select! {
                biased;
                () = e2b.engine.shutdown().begun() => {
                    return Err(connect_error("unavailable", "the gateway is shutting down"));
                }
                message = messages.next() => message,
            };
            let Some(message) = message else { break };
            let message = message?;
            let Some(data) = message.get("data") else { continue };
            if !exec::deliver(&e2b.execs, &exec, input_of(&data["input"])?, &mut told).await {
                return Err(connect_error("unavailable", "the process's run is not served through this gateway now"));
            }
        }
        Ok::<_, ConnectError>(())
    };
    let frames = match streamed_in.await {
        Ok(()) => vec![envelope(0, &json!({})), end_of_stream(None)],
        Err(e) => {
            // The rest of the input is read and dropped, so the client, still writing, sees
            // the error and not a connection closed under it; shutdown does not wait for it.
            let shutdown = e2b.engine.shutdown();
            let drained = async { while let Some(Ok(_)) = messages.next().await {} };
            tokio::select! {
                () = shutdown.begun() => {}
                () = drained => {}
            }
            vec![end_of_stream(Some(e))]
        }
    };
    streamed(futures_util::stream::iter(frames))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(chunks: Vec<Vec<u8>>) -> Vec<Result<Value, &'static str>> {
        let chunks = futures_util::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
        let body = Body::from_stream(chunks);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(messages(body).map(|m| m.map_err(|e| e.code)).collect())
    }

    #[test]
    fn request_messages_are_read_across_any_split_and_end_at_the_end_flag() {
        let one = envelope(0, &json!({"start": {"process": {"pid": 7}}}));
        let two = envelope(0, &json!({"data": {"input": {"stdin": "YQ=="}}}));
        let mut all =
            [one.to_vec(), two.to_vec(), end_of_stream(None).to_vec(), envelope(0, &json!({})).to_vec()].concat();
        // Split everywhere, one byte at a time: the same two messages, and nothing after the end.
        let bytes: Vec<Vec<u8>> = all.iter().map(|b| vec![*b]).collect();
        let expected =
            vec![Ok(json!({"start": {"process": {"pid": 7}}})), Ok(json!({"data": {"input": {"stdin": "YQ=="}}}))];
        assert_eq!(frames(bytes), expected);
        assert_eq!(frames(vec![all.clone()]), expected);
        // Cut inside a message: said so, not taken as a message.
        all.truncate(one.len() + 3);
        assert_eq!(frames(vec![all]), vec![Ok(json!({"start": {"process": {"pid": 7}}})), Err("invalid_argument")]);
        // A length past the bound is refused before it is buffered.
        assert_eq!(frames(vec![vec![0, 0xff, 0xff, 0xff, 0xff]]), vec![Err("resource_exhausted")]);
        assert_eq!(frames(vec![[vec![0, 0, 0, 0, 1], b"{".to_vec()].concat()]), vec![Err("invalid_argument")]);
    }

    #[test]
    fn an_envelope_is_its_flags_a_big_endian_length_and_the_json() {
        let framed = envelope(0, &json!({"a": 1}));
        assert_eq!(&framed[..], b"\x00\x00\x00\x00\x07{\"a\":1}");
        assert_eq!(&end_of_stream(None)[..], b"\x02\x00\x00\x00\x02{}");
        let failed = end_of_stream(Some(connect_error("not_found", "gone")));
        assert_eq!(failed[0], 2);
        let body: Value = serde_json::from_slice(&failed[5..]).unwrap();
        assert_eq!(body, json!({"error": {"code": "not_found", "message": "gone"}}));
    }

    #[test]
    fn an_exec_ends_as_e2b_says_a_process_ended() {
        let exec = |state: pb::ExecState, exit_code, signal| pb::Exec {
            state: state.into(),
            exit_code,
            signal,
            message: "its run was lost".into(),
            ..pb::Exec::default()
        };
        let end = |e: &pb::Exec| end_event(e)["event"]["end"].clone();
        assert_eq!(
            end(&exec(pb::ExecState::Exited, Some(3), None)),
            json!({"exitCode": 3, "exited": true, "status": "exit status 3"})
        );
        assert_eq!(
            end(&exec(pb::ExecState::Signalled, None, Some(9))),
            json!({"exitCode": -1, "exited": false, "status": "signal: 9"})
        );
        let lost = end(&exec(pb::ExecState::Lost, None, None));
        assert_eq!((lost["exitCode"].as_i64(), lost["error"].as_str()), (Some(-1), Some("Lost: its run was lost")));
    }

    #[test]
    fn only_the_sandboxs_own_user_is_taken() {
        let with = |auth: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(a) = auth {
                headers.insert(header::AUTHORIZATION, a.parse().unwrap());
            }
            check_user(&headers).map_err(|e| e.message)
        };
        assert!(with(None).is_ok());
        assert!(with(Some(&format!("Basic {}", BASE64.encode("user:")))).is_ok());
        let root = with(Some(&format!("Basic {}", BASE64.encode("root:")))).unwrap_err();
        assert!(root.contains("\"root\" is not supported"), "{root}");
    }
}
