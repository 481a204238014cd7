//! Logs on every driver (DESIGN 8.2): a generation's stdout and stderr with offsets, read while
//! it runs, followed to its end, and read again once the sandbox is Stopped or in Error; each
//! generation apart; a file the sandbox plants in their place never read; removed with the
//! sandbox (`clean_up` finds nothing left). Then bad input.

use std::time::Duration;

use berth_proto::v1 as pb;
use berth_proto::v1::logs_output::Output;
use tonic::Code;

use crate::conformance::{Runtime, clean_up, create_in, target};
use crate::harness::*;

/// Counts its runs in the workspace and says which one it is, on both streams.
const SAYS_ITS_RUN: &[&str] = &[
    "sh",
    "-c",
    "n=$(cat runs 2>/dev/null || echo 0); n=$((n + 1)); echo $n > runs; echo \"run $n\"; echo \"err $n\" >&2; exec sleep 3600",
];

#[derive(Debug, Default, PartialEq)]
struct Logs {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Both streams, in offset order.
    all: Vec<u8>,
    end: Option<pb::LogsEnd>,
}

fn request(sandbox: &str, generation: u64, offset: u64, follow: bool) -> pb::ReadLogsRequest {
    pb::ReadLogsRequest { sandbox: sandbox.into(), generation, offset, follow }
}

/// Reads a logs stream to its end, checking every chunk follows the last.
async fn read(logs: &mut LogsService, request: pb::ReadLogsRequest) -> Result<Logs, tonic::Status> {
    let mut next = request.offset;
    let mut stream = logs.read_logs(request).await?.into_inner();
    let mut read = Logs::default();
    let collect = async {
        while let Some(message) = stream.message().await? {
            match message.output.expect("every message says something") {
                Output::Chunk(chunk) => {
                    assert_eq!(chunk.offset, next, "chunks follow one another");
                    next += chunk.data.len() as u64;
                    read.all.extend(&chunk.data);
                    match pb::OutputStream::try_from(chunk.stream).unwrap() {
                        pb::OutputStream::Stderr => read.stderr.extend(chunk.data),
                        _ => read.stdout.extend(chunk.data),
                    }
                }
                Output::Gap(gap) => panic!("a gap in a few bytes of output: {gap:?}"),
                Output::End(end) => {
                    assert_eq!(end.offset, next, "the end is where the output read ends");
                    read.end = Some(end);
                    return Ok(read);
                }
            }
        }
        panic!("the stream closed before its end")
    };
    tokio::time::timeout(Duration::from_secs(60), collect).await.expect("the logs ended in time")
}

/// Reads the current generation's logs until they hold `bytes` bytes: a run is Ready once its
/// supervisor speaks, which may be just before its command's first words reach the logs.
async fn once_written(logs: &mut LogsService, name: &str, bytes: usize) -> Logs {
    for _ in 0..100 {
        let read = read(logs, request(name, 0, 0, false)).await.unwrap();
        if read.all.len() >= bytes {
            return read;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the logs of '{name}' never held {bytes} bytes");
}

fn end(logs: &Logs) -> &pb::LogsEnd {
    logs.end.as_ref().expect("ended")
}

async fn each_generation_is_read_while_it_runs_and_after_it_stopped(runtime: Runtime) {
    let Some(target) = target(runtime, "logs").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut logs = gateway.logs().await;
    create_in(&target, &mut sandboxes, "box", SAYS_ITS_RUN).await;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;

    let first = once_written(&mut logs, "box", 12).await;
    assert_eq!((first.stdout.as_slice(), first.stderr.as_slice()), (&b"run 1\n"[..], &b"err 1\n"[..]), "{runtime:?}");
    assert_eq!((end(&first).generation, end(&first).complete, end(&first).offset), (1, false, 12), "{runtime:?}");
    // From inside a record, and from the end.
    let tail = read(&mut logs, request("box", 1, 2, false)).await.unwrap();
    assert_eq!(tail.all, first.all[2..], "{runtime:?}");

    // A follower waits at the end until the run is over, and is told it is.
    let follower = {
        let mut logs = logs.clone();
        tokio::spawn(async move { read(&mut logs, request("box", 0, 12, true)).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!follower.is_finished(), "{runtime:?}: a follower ended while the run goes on");
    lifecycle(&mut sandboxes, "stop", "box").await.unwrap();
    let followed = tokio::time::timeout(Duration::from_secs(60), follower).await.expect("the follower ended").unwrap();
    assert_eq!((followed.all.len(), end(&followed).complete, end(&followed).offset), (0, true, 12), "{runtime:?}");
    wait_phase(&mut sandboxes, "box", pb::Phase::Stopped).await;
    let stopped = read(&mut logs, request("box", 0, 0, false)).await.unwrap();
    assert_eq!((stopped.all.as_slice(), end(&stopped).complete), (first.all.as_slice(), true), "{runtime:?}");

    // The next generation's output is its own; the last one's stays.
    lifecycle(&mut sandboxes, "start", "box").await.unwrap();
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    let second = once_written(&mut logs, "box", 12).await;
    assert_eq!((second.stdout.as_slice(), end(&second).generation), (&b"run 2\n"[..], 2), "{runtime:?}");
    let again = read(&mut logs, request("box", 1, 0, false)).await.unwrap();
    assert_eq!((again.all.as_slice(), end(&again).complete), (first.all.as_slice(), true), "{runtime:?}");

    let refused = read(&mut logs, request("box", 3, 0, false)).await.expect_err("a generation yet to run");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused}");
    assert!(refused.message().contains("generation"), "{refused}");
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn a_failed_command_says_why_and_a_planted_link_is_never_followed(runtime: Runtime) {
    let Some(target) = target(runtime, "logsfail").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut logs = gateway.logs().await;

    create_in(&target, &mut sandboxes, "dies", &["sh", "-c", "echo starting; echo 'no config found' >&2; exit 3"])
        .await;
    wait_phase(&mut sandboxes, "dies", pb::Phase::Error).await;
    let died = read(&mut logs, request("dies", 0, 0, true)).await.unwrap();
    assert_eq!((died.stdout.as_slice(), died.stderr.as_slice()), (&b"starting\n"[..], &b"no config found\n"[..]));
    assert_eq!((end(&died).complete, end(&died).exit_code), (true, Some(3)), "{runtime:?}");

    // The sandbox swaps its log for a link to a file of the host's: the link is refused, and
    // nothing of the file is read.
    let plant = "cd /run/berth/logs 2>/dev/null || cd ../logs; echo before; sleep 1; \
                 rm -f g1-0.log; ln -s /etc/passwd g1-0.log; exec sleep 3600";
    create_in(&target, &mut sandboxes, "planter", &["sh", "-c", plant]).await;
    wait_phase(&mut sandboxes, "planter", pb::Phase::Ready).await;
    let mut refused = None;
    for _ in 0..100 {
        match read(&mut logs, request("planter", 0, 0, false)).await {
            Ok(read) => assert!(!read.all.windows(5).any(|w| w == b"root:"), "{runtime:?}: the host's file was read"),
            Err(status) => {
                refused = Some(status);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = refused.expect("the planted link was read as logs");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{runtime:?}: {refused}");
    assert!(!refused.message().contains("root:"), "{refused}");
    clean_up(&target, &data, &mut sandboxes).await;
}

macro_rules! on_every_driver {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn each_generation_is_read_while_it_runs_and_after_it_stopped() {
                    super::each_generation_is_read_while_it_runs_and_after_it_stopped(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_failed_command_says_why_and_a_planted_link_is_never_followed() {
                    super::a_failed_command_says_why_and_a_planted_link_is_never_followed(Runtime::$runtime).await
                }
            }
        )*
    };
}

on_every_driver!(Process => process, Docker => docker, Podman => podman);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_names_its_field_and_status() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut logs = gateway.logs().await;
    create(&mut sandboxes, "box", &["sleep", "3600"], &[]).await;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;

    let missing = read(&mut logs, request("missing", 0, 0, false)).await.expect_err("no such sandbox");
    assert_eq!(missing.code(), Code::NotFound, "{missing}");
    assert!(missing.message().contains("missing"), "{missing}");
    let later = read(&mut logs, request("box", 2, 0, false)).await.expect_err("a generation yet to run");
    assert_eq!(later.code(), Code::InvalidArgument, "{later}");
    assert!(later.message().contains("generation"), "{later}");
    // Past the end: nothing, and the end where the output ends.
    let past = read(&mut logs, request("box", 1, 1000, false)).await.unwrap();
    assert_eq!((past.all.len(), end(&past).complete), (0, false));

    let mut anonymous = berth_proto::v1::logs_client::LogsClient::new(gateway.channel().await);
    let status = anonymous.read_logs(request("box", 0, 0, false)).await.expect_err("no token");
    assert_eq!(status.code(), Code::Unauthenticated);
}
