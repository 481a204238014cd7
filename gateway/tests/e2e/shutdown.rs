//! A gateway stopped with SIGTERM while clients hold streams of every kind (issue 38): it exits
//! within its bound; each stream ends, after what was written before the signal, with its own
//! end or with UNAVAILABLE telling its client to reconnect; an exec cut off that way is attached
//! again from its offset once the gateway is back. Clients that read nothing hold the stop up
//! no longer than the bound.

use std::process::Stdio;
use std::time::{Duration, Instant};

use berth_proto::v1 as pb;
use berth_proto::v1::exec_input::Input;
use berth_proto::v1::exec_output::Output;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status, Streaming};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::exec::start;
use crate::harness::*;

/// Far past the gateway's own bound (`STREAMS_END_WITHIN`, 3 s, with no effect under way): a
/// gateway that waits on its clients never gets there.
const EXITS_WITHIN: Duration = Duration::from_secs(20);
/// Prints, sleeps past the stop and the restart, prints again.
const CUT: &[&str] = &["sh", "-c", "echo first; sleep 8; echo second"];

fn port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Reads `stream` until a message `want` holds, returning it.
async fn until<T: std::fmt::Debug>(stream: &mut Streaming<T>, want: impl Fn(&T) -> bool) -> T {
    let read = async {
        loop {
            let message = stream.message().await.expect("no error yet").expect("not ended yet");
            if want(&message) {
                return message;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read).await.expect("the awaited message came")
}

/// The rest of `stream`: its messages and how it ended (`Ok` for the end of the stream).
async fn rest<T>(mut stream: Streaming<T>, within: Duration) -> (Vec<T>, Result<(), Status>) {
    let deadline = tokio::time::Instant::now() + within;
    let mut messages = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, stream.message()).await.expect("the stream ended") {
            Ok(Some(message)) => messages.push(message),
            Ok(None) => return (messages, Ok(())),
            Err(status) => return (messages, Err(status)),
        }
    }
}

/// The end a client must be able to tell means "reconnect".
fn reconnect(ended: &Result<(), Status>, what: &str) {
    match ended {
        Err(status) => assert!(
            status.code() == Code::Unavailable && status.message().contains("shutting down"),
            "{what}: {status:?}"
        ),
        Ok(()) => panic!("{what} ended as if complete"),
    }
}

fn chunk(message: &pb::ExecOutput) -> Option<&pb::OutputChunk> {
    match &message.output {
        Some(Output::Chunk(chunk)) => Some(chunk),
        _ => None,
    }
}

/// Where the output read of an exec got to.
fn offset_after(messages: &[pb::ExecOutput]) -> u64 {
    messages.iter().filter_map(chunk).map(|c| c.offset + c.data.len() as u64).max().unwrap_or(0)
}

/// A curl following a stream of the HTTP/JSON API, a line of JSON at a time.
struct Ndjson {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Ndjson {
    fn open(base: &str, token: &str, method: &str, path: &str, body: Option<&str>) -> Self {
        let mut command = tokio::process::Command::new("curl");
        command.args(["-sSN", "-X", method, "-H", &format!("authorization: Bearer {token}")]);
        if let Some(body) = body {
            command.args(["-H", "content-type: application/json", "-d", body]);
        }
        let mut child = command.arg(format!("{base}{path}")).stdout(Stdio::piped()).kill_on_drop(true).spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    async fn until(&mut self, want: impl Fn(&Value) -> bool) {
        let read = async {
            let mut seen = Vec::new();
            loop {
                let Some(line) = self.lines.next_line().await.unwrap() else {
                    panic!("the stream ended before the awaited line: {seen:?}");
                };
                let line: Value = serde_json::from_str(&line).unwrap();
                if want(&line) {
                    return;
                }
                seen.push(line);
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read).await.expect("the awaited line came");
    }

    /// The last line, once curl is done (and whether the response was whole).
    async fn last(mut self) -> (Value, bool) {
        let mut last = Value::Null;
        while let Some(line) = self.lines.next_line().await.unwrap() {
            last = serde_json::from_str(&line).unwrap();
        }
        (last, self.child.wait().await.unwrap().success())
    }
}

/// An HTTP stream's last line, as a client must be able to tell means "reconnect".
fn reconnect_line((last, whole): &(Value, bool), what: &str) {
    assert!(*whole, "{what}: the response was cut off, not ended: {last}");
    assert_eq!(last["error"]["code"], "UNAVAILABLE", "{what}: {last}");
    assert!(last["error"]["message"].as_str().unwrap_or_default().contains("shutting down"), "{what}: {last}");
}

/// Starts an exec over gRPC, its request side held open (as an interactive client's is).
async fn exec(execs: &mut Execs, start: pb::ExecStart) -> (Streaming<pb::ExecOutput>, mpsc::Sender<pb::ExecInput>) {
    let (tx, rx) = mpsc::channel(4);
    tx.send(pb::ExecInput { input: Some(Input::Start(start)) }).await.unwrap();
    (execs.exec(ReceiverStream::new(rx)).await.unwrap().into_inner(), tx)
}

fn with_id(exec_id: &str, argv: &[&str]) -> pb::ExecStart {
    pb::ExecStart { exec_id: exec_id.into(), ..start("box", argv) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_ends_at_a_sigterm_and_the_gateway_exits_within_its_bound() {
    let data = DataDir::new();
    let http = format!("127.0.0.1:{}", port());
    let mut gateway = Gateway::start(&data, &["--http-listen", &http]).await;
    let mut sandboxes = gateway.sandboxes().await;
    create(&mut sandboxes, "box", &["sh", "-c", "echo booted; exec sleep 3600"], &[]).await;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;

    // gRPC: an exec that printed and runs on, an attach to it, and an exec that ended before
    // the signal whose client has not read it yet.
    let mut execs = gateway.execs().await;
    let printed = |m: &pb::ExecOutput| chunk(m).is_some_and(|c| c.data == b"first\n");
    let (mut cut, _input) = exec(&mut execs, with_id("grpc-cut", CUT)).await;
    let before = vec![until(&mut cut, printed).await];
    let request = pb::AttachExecRequest { sandbox: "box".into(), exec_id: "grpc-cut".into(), offset: 0 };
    let mut attached = execs.attach_exec(request).await.unwrap().into_inner();
    until(&mut attached, printed).await;
    let (done, _done_input) = exec(&mut execs, with_id("done", &["echo", "done"])).await;
    let request = pb::ExecRequest { sandbox: "box".into(), exec_id: "done".into() };
    for _ in 0..200 {
        let state = execs.get_exec(request.clone()).await.unwrap().into_inner().exec.unwrap().state;
        if state == pb::ExecState::Exited as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut logs = gateway.logs().await;
    let request = pb::ReadLogsRequest { sandbox: "box".into(), generation: 0, offset: 0, follow: true };
    let mut logs = logs.read_logs(request).await.unwrap().into_inner();
    until(&mut logs, |m| matches!(&m.output, Some(pb::logs_output::Output::Chunk(c)) if c.data == b"booted\n")).await;
    let mut watch = sandboxes.watch_sandbox(pb::WatchSandboxRequest { name: "box".into() }).await.unwrap().into_inner();
    until(&mut watch, |e| e.sandbox.is_some()).await;
    let mut fleet = sandboxes.watch_sandboxes(pb::WatchSandboxesRequest::default()).await.unwrap().into_inner();
    until(&mut fleet, |e| !e.cursor.is_empty()).await;
    let mut health = HealthClient::new(gateway.channel().await);
    let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
    let mut health = health.watch(request).await.unwrap().into_inner();
    until(&mut health, |h| h.status == ServingStatus::Serving as i32).await;

    // HTTP/JSON: the same kinds as newline-delimited JSON.
    let base = format!("http://{http}");
    let token = gateway.token.clone();
    let body = serde_json::json!({"exec_id": "http-cut", "argv": CUT}).to_string();
    let mut http_exec = Ndjson::open(&base, &token, "POST", "/v1/sandboxes/box/execs", Some(&body));
    // "first\n" in base64, at offset 0 (which JSON leaves out, as every default).
    http_exec.until(|l| l["chunk"]["data"] == "Zmlyc3QK" && l["chunk"]["offset"].as_str().unwrap_or("0") == "0").await;
    let mut http_logs = Ndjson::open(&base, &token, "GET", "/v1/sandboxes/box/logs?follow=true", None);
    http_logs.until(|l| l.get("chunk").is_some()).await;
    let mut http_watch = Ndjson::open(&base, &token, "GET", "/v1/sandboxes/box/watch", None);
    http_watch.until(|l| l["sandbox"]["name"] == "box").await;
    let mut http_fleet = Ndjson::open(&base, &token, "GET", "/v1/sandboxes:watch", None);
    http_fleet.until(|l| l["cursor"].as_str().is_some_and(|c| !c.is_empty())).await;

    let signalled = Instant::now();
    gateway.sigterm();
    let (exited, cut, attached, done, logs, watch, fleet, health, http_exec, http_logs, http_watch, http_fleet) = tokio::join!(
        gateway.exit_within(EXITS_WITHIN),
        rest(cut, EXITS_WITHIN),
        rest(attached, EXITS_WITHIN),
        rest(done, EXITS_WITHIN),
        rest(logs, EXITS_WITHIN),
        rest(watch, EXITS_WITHIN),
        rest(fleet, EXITS_WITHIN),
        rest(health, EXITS_WITHIN),
        http_exec.last(),
        http_logs.last(),
        http_watch.last(),
        http_fleet.last(),
    );
    let took = signalled.elapsed();
    eprintln!("the gateway exited {took:?} after SIGTERM");
    assert!(exited.is_some_and(|s| s.success()), "exited {exited:?} within {EXITS_WITHIN:?}:\n{}", data.log());
    assert!(
        !data.log().contains("connections still open"),
        "every stream of a reading client ended by itself, not at the bound:\n{}",
        data.log()
    );

    for (what, (messages, ended)) in [("the exec", &cut), ("the attach", &attached)] {
        assert!(
            messages.iter().all(|m| chunk(m).is_none() && !matches!(m.output, Some(Output::End(_)))),
            "{messages:?}"
        );
        reconnect(ended, what);
    }
    let (messages, ended) = &done;
    assert!(ended.is_ok(), "the exec that had ended: {ended:?}");
    assert_eq!(messages.iter().filter_map(chunk).map(|c| c.data.as_slice()).collect::<Vec<_>>(), [b"done\n"]);
    assert!(
        matches!(messages.last().and_then(|m| m.output.as_ref()), Some(Output::End(e)) if e.exit_code == Some(0)),
        "{messages:?}"
    );
    reconnect(&logs.1, "the logs");
    reconnect(&watch.1, "the watch");
    reconnect(&fleet.1, "the fleet watch");
    let (statuses, ended) = &health;
    assert!(ended.is_ok(), "the health watch ends: {ended:?}");
    assert_eq!(statuses.last().map(|h| h.status), Some(ServingStatus::NotServing as i32), "{statuses:?}");
    for (what, last) in
        [("http exec", &http_exec), ("http logs", &http_logs), ("http watch", &http_watch), ("http fleet", &http_fleet)]
    {
        reconnect_line(last, what);
    }

    // Back on the same data directory, each exec cut off reads on from the offset its client got
    // to: the rest of its output, and its end.
    let gateway = Gateway::start(&data, &[]).await;
    let mut execs = gateway.execs().await;
    for (exec_id, offset) in [("grpc-cut", offset_after(&before)), ("http-cut", 6)] {
        assert_eq!(offset, 6, "{exec_id}");
        let request = pb::AttachExecRequest { sandbox: "box".into(), exec_id: exec_id.into(), offset };
        let stream = execs.attach_exec(request).await.unwrap().into_inner();
        let (messages, ended) = rest(stream, Duration::from_secs(30)).await;
        assert!(ended.is_ok(), "{exec_id}: {ended:?}");
        let chunks: Vec<&pb::OutputChunk> = messages.iter().filter_map(chunk).collect();
        assert_eq!(chunks.first().map(|c| c.offset), Some(offset), "{exec_id}: {messages:?}");
        assert_eq!(chunks.iter().flat_map(|c| c.data.clone()).collect::<Vec<u8>>(), b"second\n", "{exec_id}");
        assert!(
            matches!(messages.last().and_then(|m| m.output.as_ref()), Some(Output::End(e)) if e.exit_code == Some(0)),
            "{exec_id}: {messages:?}"
        );
    }
    let mut sandboxes = gateway.sandboxes().await;
    lifecycle(&mut sandboxes, "delete", "box").await.unwrap();
    wait_gone(&mut sandboxes, "box").await;
}

/// Megabytes: more than every buffer between the gateway and a client that reads nothing holds.
const LOUD: &str = "head -c 16000000 /dev/zero";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_read_nothing_hold_the_stop_up_no_longer_than_its_bound() {
    let data = DataDir::new();
    let http = format!("127.0.0.1:{}", port());
    let mut gateway = Gateway::start(&data, &["--http-listen", &http]).await;
    let mut sandboxes = gateway.sandboxes().await;
    create(&mut sandboxes, "box", &["sh", "-c", &format!("{LOUD}; exec sleep 3600")], &[]).await;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;

    // gRPC: an exec's output on a stream whose window holds a kilobyte, read no further than
    // its first chunk.
    let channel = tonic::transport::Endpoint::from_shared(gateway.address.clone())
        .unwrap()
        .initial_stream_window_size(Some(1024))
        .connect()
        .await
        .unwrap();
    let mut execs =
        berth_proto::v1::execs_client::ExecsClient::with_interceptor(channel, Bearer(gateway.token.clone()));
    let (mut stream, _input) = exec(&mut execs, with_id("loud", &["sh", "-c", &format!("{LOUD}; sleep 60")])).await;
    until(&mut stream, |m| chunk(m).is_some()).await;

    // HTTP: the logs followed on a connection with a small receive buffer, read no further than
    // the response's head.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut connection = socket.connect(http.parse().unwrap()).await.unwrap();
    let request = format!(
        "GET /v1/sandboxes/box/logs?follow=true HTTP/1.1\r\nhost: {http}\r\nauthorization: Bearer {}\r\n\r\n",
        gateway.token
    );
    connection.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        connection.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));

    let signalled = Instant::now();
    gateway.sigterm();
    let exited = gateway.exit_within(EXITS_WITHIN).await;
    eprintln!("the gateway exited {:?} after SIGTERM", signalled.elapsed());
    assert!(exited.is_some_and(|s| s.success()), "exited {exited:?} within {EXITS_WITHIN:?}:\n{}", data.log());
    assert!(data.log().contains("connections still open"), "the bound ended the stop:\n{}", data.log());
    drop((stream, connection));
}
