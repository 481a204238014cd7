//! Execs on every driver (DESIGN 8.1): output, stdin, exit codes, timeouts, cancels and
//! signals; an exec retried with its id runs once; attaches from any offset read the same bytes
//! and the same end; a stop ends an exec Cancelled and a killed run ends it Lost; a gibibyte of
//! output arrives whole; 64 execs at once. Then what holds on any driver: bad input, and a
//! gateway restart in the middle of an exec.

use std::time::Duration;

use berth_proto::v1 as pb;
use berth_proto::v1::exec_input::Input;
use berth_proto::v1::exec_output::Output;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::conformance::{Runtime, Target, clean_up, create_in, target};
use crate::harness::*;

/// What a client read of an exec: checked to be contiguous from where it started.
#[derive(Debug, Default)]
pub(crate) struct Read {
    pub(crate) stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Both streams, in offset order.
    all: Vec<u8>,
    /// Bytes in all, and where the first chunk started.
    bytes: u64,
    first: Option<u64>,
    gaps: Vec<(u64, u64)>,
    end: Option<pb::Exec>,
}

impl Read {
    pub(crate) fn state(&self) -> pb::ExecState {
        pb::ExecState::try_from(self.end.as_ref().expect("ended").state).unwrap()
    }

    pub(crate) fn exit_code(&self) -> Option<i32> {
        self.end.as_ref().and_then(|e| e.exit_code)
    }
}

/// Reads a stream to its end (at most `within`), checking every chunk follows the last.
pub(crate) async fn read_all(mut stream: tonic::Streaming<pb::ExecOutput>, from: u64, within: Duration) -> Read {
    let mut read = Read::default();
    let mut next = from;
    let collect = async {
        while let Some(message) = stream.message().await.expect("the stream carries no error") {
            match message.output.expect("every message says something") {
                Output::Admitted(_) => {}
                Output::Chunk(chunk) => {
                    assert_eq!(chunk.offset, next, "chunks follow one another");
                    read.first.get_or_insert(chunk.offset);
                    next += chunk.data.len() as u64;
                    read.bytes += chunk.data.len() as u64;
                    // A gibibyte is only counted.
                    if read.bytes <= 1 << 20 {
                        read.all.extend(&chunk.data);
                        match pb::OutputStream::try_from(chunk.stream).unwrap() {
                            pb::OutputStream::Stderr => read.stderr.extend(chunk.data),
                            _ => read.stdout.extend(chunk.data),
                        }
                    }
                }
                Output::Gap(gap) => {
                    assert_eq!(gap.from, next);
                    read.gaps.push((gap.from, gap.to));
                    next = gap.to;
                }
                Output::End(exec) => {
                    read.end = Some(exec);
                    return;
                }
            }
        }
        panic!("the stream closed before the exec's end");
    };
    tokio::time::timeout(within, collect).await.expect("the exec ended in time");
    read
}

pub(crate) fn start(sandbox: &str, argv: &[&str]) -> pb::ExecStart {
    pb::ExecStart { sandbox: sandbox.into(), argv: argv.iter().map(|a| a.to_string()).collect(), ..Default::default() }
}

/// Starts an exec; the stream of its output and the sender of what follows the start.
pub(crate) async fn open(
    execs: &mut Execs,
    start: pb::ExecStart,
) -> Result<(tonic::Streaming<pb::ExecOutput>, mpsc::Sender<pb::ExecInput>), tonic::Status> {
    let (tx, rx) = mpsc::channel(16);
    tx.send(pb::ExecInput { input: Some(Input::Start(start)) }).await.unwrap();
    let stream = execs.exec(ReceiverStream::new(rx)).await?.into_inner();
    Ok((stream, tx))
}

pub(crate) async fn run(execs: &mut Execs, start: pb::ExecStart) -> Read {
    let (stream, _input) = open(execs, start).await.unwrap();
    read_all(stream, 0, Duration::from_secs(60)).await
}

fn input(i: Input) -> pb::ExecInput {
    pb::ExecInput { input: Some(i) }
}

async fn a_ready(target: &Target, gateway: &Gateway, name: &str) -> (Sandboxes, Execs, String) {
    let mut sandboxes = gateway.sandboxes().await;
    let id = create_in(target, &mut sandboxes, name, &["sleep", "3600"]).await.id;
    wait_phase(&mut sandboxes, name, pb::Phase::Ready).await;
    (sandboxes, gateway.execs().await, id)
}

async fn commands_with_their_output_stdin_exit_codes_timeouts_cancels_and_signals(runtime: Runtime) {
    let Some(target) = target(runtime, "exec").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let (mut sandboxes, mut execs, _) = a_ready(&target, &gateway, "box").await;

    let read = run(&mut execs, start("box", &["sh", "-c", "echo out; echo err >&2; exit 7"])).await;
    assert_eq!((read.stdout.as_slice(), read.stderr.as_slice()), (&b"out\n"[..], &b"err\n"[..]), "{runtime:?}");
    assert_eq!((read.state(), read.exit_code()), (pb::ExecState::Exited, Some(7)));
    assert_eq!(read.end.as_ref().unwrap().output_bytes, Some(8));

    let mut with_env = start("box", &["sh", "-c", "echo \"$GREETING\"; pwd"]);
    with_env.env.insert("GREETING".into(), "hi there".into());
    with_env.cwd = "/tmp".into();
    assert_eq!(run(&mut execs, with_env).await.stdout, b"hi there\n/tmp\n");

    let mut cat = start("box", &["cat"]);
    cat.stdin = true;
    let (stream, tx) = open(&mut execs, cat).await.unwrap();
    tx.send(input(Input::Stdin(b"hello ".to_vec()))).await.unwrap();
    tx.send(input(Input::Stdin(b"stdin".to_vec()))).await.unwrap();
    tx.send(input(Input::CloseStdin(pb::CloseStdin {}))).await.unwrap();
    let read = read_all(stream, 0, Duration::from_secs(30)).await;
    assert_eq!((read.stdout.as_slice(), read.exit_code()), (&b"hello stdin"[..], Some(0)), "{runtime:?}");

    let mut terminal =
        start("box", &["sh", "-c", "test -t 0 && test -t 1 && echo on-a-terminal; stty size; echo $TERM"]);
    terminal.tty = true;
    terminal.window = Some(pb::WindowSize { rows: 40, cols: 100 });
    let read = run(&mut execs, terminal).await;
    let text = String::from_utf8_lossy(&read.all);
    assert!(
        text.contains("on-a-terminal") && text.contains("40 100") && text.contains("xterm"),
        "{runtime:?}: {text:?}"
    );
    assert!(read.stderr.is_empty(), "a terminal is one stream");

    let missing = run(&mut execs, start("box", &["no-such-command"])).await;
    assert_eq!(missing.exit_code(), Some(127), "{runtime:?}: {:?}", missing.end);

    // A timeout kills the command, and one that ignores TERM after the grace.
    for argv in [&["sleep", "30"][..], &["sh", "-c", "trap '' TERM; sleep 30"]] {
        let mut slow = start("box", argv);
        slow.timeout_ms = Some(300);
        let read = run(&mut execs, slow).await;
        assert_eq!(read.state(), pb::ExecState::TimedOut, "{runtime:?} {argv:?}");
    }

    let mut cancelled = start("box", &["sleep", "30"]);
    cancelled.exec_id = "to-cancel".into();
    let (stream, _tx) = open(&mut execs, cancelled).await.unwrap();
    let reply = execs.cancel_exec(pb::ExecRequest { sandbox: "box".into(), exec_id: "to-cancel".into() }).await;
    assert!(reply.unwrap().into_inner().exec.unwrap().cancel_requested);
    let read = read_all(stream, 0, Duration::from_secs(30)).await;
    assert_eq!(read.state(), pb::ExecState::Cancelled, "{runtime:?}");

    let (stream, tx) = open(&mut execs, start("box", &["sleep", "30"])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.send(input(Input::Signal(9))).await.unwrap();
    let read = read_all(stream, 0, Duration::from_secs(30)).await;
    assert_eq!((read.state(), read.end.as_ref().unwrap().signal), (pb::ExecState::Signalled, Some(9)), "{runtime:?}");
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn a_retried_id_runs_once_and_every_attach_reads_the_same_bytes_and_end(runtime: Runtime) {
    let Some(target) = target(runtime, "execonce").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let (mut sandboxes, mut execs, id) = a_ready(&target, &gateway, "box").await;
    let mut once = start("box", &["sh", "-c", "echo ran >> count; echo first; echo second >&2; exit 3"]);
    once.exec_id = "once".into();
    let first = run(&mut execs, once.clone()).await;
    let again = run(&mut execs, once.clone()).await;
    assert_eq!((&again.stdout, &again.stderr, again.exit_code()), (&first.stdout, &first.stderr, Some(3)));
    assert_eq!(again.end.as_ref().unwrap().id, "once");
    assert_eq!(target.workspace_file(&data, &id, "count").as_deref(), Some("ran"), "{runtime:?}: it ran once");
    // From any offset: the same bytes at the same offsets, and the same end.
    for offset in [0, 3, 6, 12, 13] {
        let request = pb::AttachExecRequest { sandbox: "box".into(), exec_id: "once".into(), offset };
        let stream = execs.attach_exec(request).await.unwrap().into_inner();
        let read = read_all(stream, offset, Duration::from_secs(30)).await;
        assert_eq!(read.all, first.all[offset as usize..], "{runtime:?} from {offset}");
        assert_eq!(read.end, first.end, "{runtime:?} from {offset}");
    }
    once.argv.push("different".into());
    let refused = open(&mut execs, once).await.expect_err("refused");
    assert_eq!(refused.code(), Code::AlreadyExists, "{refused}");
    let listed = execs.list_execs(pb::ListExecsRequest { sandbox: "box".into(), ..Default::default() }).await;
    assert_eq!(listed.unwrap().into_inner().execs.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["once"]);
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn a_stop_cancels_a_running_exec_and_a_killed_run_loses_it(runtime: Runtime) {
    let Some(target) = target(runtime, "execend").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let (mut sandboxes, mut execs, id) = a_ready(&target, &gateway, "box").await;
    let mut stopped = start("box", &["sh", "-c", "echo before the stop; exec sleep 600"]);
    stopped.exec_id = "stopped".into();
    let (stream, _tx) = open(&mut execs, stopped).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    lifecycle(&mut sandboxes, "stop", "box").await.unwrap();
    let read = read_all(stream, 0, Duration::from_secs(30)).await;
    assert_eq!(read.state(), pb::ExecState::Cancelled, "{runtime:?}: {:?}", read.end);
    wait_phase(&mut sandboxes, "box", pb::Phase::Stopped).await;
    // Its output outlives its run: an attach once it is Stopped reads it whole.
    let request = pb::AttachExecRequest { sandbox: "box".into(), exec_id: "stopped".into(), offset: 0 };
    let again = read_all(execs.attach_exec(request).await.unwrap().into_inner(), 0, Duration::from_secs(30)).await;
    assert_eq!((again.all.as_slice(), again.gaps.as_slice()), (&b"before the stop\n"[..], &[][..]), "{runtime:?}");
    assert_eq!(again.state(), pb::ExecState::Cancelled);
    let refused = open(&mut execs, start("box", &["true"])).await.expect_err("refused");
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(refused.message().contains("while it is Stopped"), "{refused}");

    lifecycle(&mut sandboxes, "start", "box").await.unwrap();
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    let (stream, _tx) = open(&mut execs, start("box", &["sleep", "600"])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    target.kill_out_of_band(&id);
    let read = read_all(stream, 0, Duration::from_secs(30)).await;
    assert_eq!(read.state(), pb::ExecState::Lost, "{runtime:?}: {:?}", read.end);
    // Nothing of the exec outlives its run: on the process driver it leads its own group, which
    // the driver ends once it sees the run gone (a container takes it along).
    let mut waited = Duration::ZERO;
    while runtime == Runtime::Process && !exec_leaders(&id).is_empty() {
        assert!(waited < Duration::from_secs(10), "an exec outlived its killed run: {:?}", exec_leaders(&id));
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn a_gibibyte_of_output_arrives_whole_and_64_execs_run_at_once(runtime: Runtime) {
    let Some(target) = target(runtime, "execbig").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let (mut sandboxes, mut execs, _) = a_ready(&target, &gateway, "box").await;
    const GIB: u64 = 1 << 30;
    let read = run(&mut execs, start("box", &["head", "-c", &GIB.to_string(), "/dev/zero"])).await;
    assert_eq!((read.bytes, read.gaps.as_slice(), read.exit_code()), (GIB, &[][..], Some(0)), "{runtime:?}");
    assert_eq!(read.end.as_ref().unwrap().output_bytes, Some(GIB));

    let runs = (0..64).map(|i| {
        let mut execs = execs.clone();
        tokio::spawn(async move { (i, run(&mut execs, start("box", &["sh", "-c", "echo $0", &i.to_string()])).await) })
    });
    for task in runs.collect::<Vec<_>>() {
        let (i, read) = task.await.unwrap();
        assert_eq!((read.exit_code(), read.stdout), (Some(0), format!("{i}\n").into_bytes()), "{runtime:?}");
    }
    clean_up(&target, &data, &mut sandboxes).await;
}

/// The live process-group leaders on this host that are execs of sandbox `id`: its identity in
/// their environment, but no generation.
fn exec_leaders(id: &str) -> Vec<i32> {
    let tag = format!("BERTH_SANDBOX_ID={id}");
    let leaders = std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        let exec = vars.contains(&tag.as_bytes()) && !vars.iter().any(|v| v.starts_with(b"BERTH_GENERATION="));
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let alive = !matches!(stat[stat.rfind(')')? + 2..].chars().next(), Some('Z' | 'X'));
        let leads = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid))).ok()?.as_raw() == pid;
        (exec && alive && leads).then_some(pid)
    });
    leaders.collect()
}

macro_rules! on_every_driver {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn commands_with_their_output_stdin_exit_codes_timeouts_cancels_and_signals() {
                    super::commands_with_their_output_stdin_exit_codes_timeouts_cancels_and_signals(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_retried_id_runs_once_and_every_attach_reads_the_same_bytes_and_end() {
                    super::a_retried_id_runs_once_and_every_attach_reads_the_same_bytes_and_end(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_stop_cancels_a_running_exec_and_a_killed_run_loses_it() {
                    super::a_stop_cancels_a_running_exec_and_a_killed_run_loses_it(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_gibibyte_of_output_arrives_whole_and_64_execs_run_at_once() {
                    super::a_gibibyte_of_output_arrives_whole_and_64_execs_run_at_once(Runtime::$runtime).await
                }
            }
        )*
    };
}

on_every_driver!(Process => process, Docker => docker, Podman => podman);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_names_its_field_and_status() {
    let Some(target) = target(Runtime::Process, "execbad").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let (mut sandboxes, mut execs, _) = a_ready(&target, &gateway, "box").await;
    let cases: Vec<(pb::ExecStart, Code, &str)> = vec![
        (start("nope", &["true"]), Code::NotFound, "sandbox 'nope' not found"),
        (start("Bad", &["true"]), Code::InvalidArgument, "invalid sandbox"),
        (start("box", &[]), Code::InvalidArgument, "invalid argv"),
        (pb::ExecStart { timeout_ms: Some(0), ..start("box", &["true"]) }, Code::InvalidArgument, "invalid timeout"),
        (
            pb::ExecStart { timeout_ms: Some(u64::MAX), ..start("box", &["true"]) },
            Code::InvalidArgument,
            "invalid timeout",
        ),
        (pb::ExecStart { exec_id: "a b".into(), ..start("box", &["true"]) }, Code::InvalidArgument, "invalid exec_id"),
        (pb::ExecStart { cwd: "tmp".into(), ..start("box", &["true"]) }, Code::InvalidArgument, "invalid cwd"),
        (
            pb::ExecStart {
                env: [("BERTH_RUNTIME_TOKEN".to_string(), "x".to_string())].into(),
                ..start("box", &["true"])
            },
            Code::InvalidArgument,
            "invalid env",
        ),
    ];
    for (request, code, message) in cases {
        let status = open(&mut execs, request).await.expect_err("refused");
        assert_eq!(status.code(), code, "{status}");
        assert!(status.message().starts_with(message), "{message:?}: {status}");
    }
    // The first message must be the start.
    let (tx, rx) = mpsc::channel(1);
    tx.send(input(Input::Stdin(b"x".to_vec()))).await.unwrap();
    let status = execs.exec(ReceiverStream::new(rx)).await.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    let listed = execs
        .list_execs(pb::ListExecsRequest { sandbox: "box".into(), page_size: 1001, page_token: String::new() })
        .await;
    assert!(listed.unwrap_err().message().starts_with("invalid page_size"));
    let listed =
        execs.list_execs(pb::ListExecsRequest { sandbox: "box".into(), page_size: 0, page_token: "a b".into() }).await;
    assert!(listed.unwrap_err().message().starts_with("invalid page_token"));
    let missing = execs.get_exec(pb::ExecRequest { sandbox: "box".into(), exec_id: "nothing".into() }).await;
    assert_eq!(missing.unwrap_err().code(), Code::NotFound);
    // Without the token, nothing.
    let mut anonymous = berth_proto::v1::execs_client::ExecsClient::new(gateway.channel().await);
    let status = anonymous.get_exec(pb::ExecRequest { sandbox: "box".into(), exec_id: "x".into() }).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    clean_up(&target, &data, &mut sandboxes).await;
}

/// The gateway dies while an exec runs; the run's supervisor reconnects to the restarted one,
/// and an attach then reads all the output and the exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_outlives_a_gateway_restart_and_reads_whole_after_it() {
    let Some(target) = target(Runtime::Process, "execrestart").await else { return };
    let data = DataDir::new();
    let mut gateway = target.gateway(&data, &[]).await;
    let (_, mut execs, _) = a_ready(&target, &gateway, "box").await;
    let mut slow = start("box", &["sh", "-c", "echo before; sleep 2; echo after"]);
    slow.exec_id = "slow".into();
    let (mut stream, _tx) = open(&mut execs, slow).await.unwrap();
    assert!(matches!(stream.message().await.unwrap().unwrap().output, Some(Output::Admitted(_))));
    gateway.kill9();
    let gateway = target.gateway(&data, &[]).await;
    let mut execs = gateway.execs().await;
    let request = pb::AttachExecRequest { sandbox: "box".into(), exec_id: "slow".into(), offset: 0 };
    let stream = execs.attach_exec(request).await.unwrap().into_inner();
    let read = read_all(stream, 0, Duration::from_secs(30)).await;
    assert_eq!((read.stdout.as_slice(), read.exit_code()), (&b"before\nafter\n"[..], Some(0)));
    let mut sandboxes = gateway.sandboxes().await;
    clean_up(&target, &data, &mut sandboxes).await;
}

/// Two gateways on PostgreSQL: an exec is made through one, which is then killed; an attach
/// through the other reads the same bytes and the same exit, wherever the run's supervisor was
/// connected (on the killed one, it moves to the other; on the other, it never left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_gateways_an_exec_made_through_one_is_read_whole_through_another_after_it_died() {
    let _server = crate::harness::POSTGRES_SERVER.read().await;
    let Some(url) = crate::pg::fresh_schema("exec_two_gateways").await else { return };
    let data = DataDir::new();
    let args = |name: &'static str| ["--store", url.as_str(), "--name", name, "--lease-ttl", "2s"];
    let (one, two) = (args("g1"), args("g2"));
    let (mut first, second) = tokio::join!(Gateway::start(&data, &one), Gateway::start(&data, &two));
    let mut sandboxes = first.sandboxes().await;
    create(&mut sandboxes, "box", &["sleep", "3600"], &[]).await;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    let mut execs = first.execs().await;
    let mut slow = start("box", &["sh", "-c", "echo one; sleep 2; echo two >&2; exit 5"]);
    slow.exec_id = "across".into();
    let (mut stream, _tx) = open(&mut execs, slow).await.unwrap();
    assert!(matches!(stream.message().await.unwrap().unwrap().output, Some(Output::Admitted(_))));
    first.kill9();
    let mut execs = second.execs().await;
    let request = pb::AttachExecRequest { sandbox: "box".into(), exec_id: "across".into(), offset: 0 };
    let stream = execs.attach_exec(request).await.unwrap().into_inner();
    let read = read_all(stream, 0, Duration::from_secs(60)).await;
    assert_eq!((read.all.as_slice(), read.exit_code(), read.gaps.as_slice()), (&b"one\ntwo\n"[..], Some(5), &[][..]));
    let mut sandboxes = second.sandboxes().await;
    lifecycle(&mut sandboxes, "delete", "box").await.unwrap();
    wait_gone(&mut sandboxes, "box").await;
}

/// Two gateways on PostgreSQL, both alive: an exec read through each at once gets the same bytes
/// and the same exit, though only one holds the run's session (the other reads what the
/// supervisor keeps on the host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_gateways_an_exec_is_read_whole_through_either_while_both_live() {
    let _server = crate::harness::POSTGRES_SERVER.read().await;
    let Some(url) = crate::pg::fresh_schema("exec_both_gateways").await else { return };
    let data = DataDir::new();
    let args = |name: &'static str| ["--store", url.as_str(), "--name", name];
    let (one, two) = (args("g1"), args("g2"));
    let (first, second) = tokio::join!(Gateway::start(&data, &one), Gateway::start(&data, &two));
    let mut sandboxes = first.sandboxes().await;
    create(&mut sandboxes, "box", &["sleep", "3600"], &[]).await;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    let mut execs = first.execs().await;
    let mut slow = start("box", &["sh", "-c", "echo one; sleep 2; echo two >&2; exit 5"]);
    slow.exec_id = "both".into();
    let (stream, _tx) = open(&mut execs, slow).await.unwrap();
    let attach = |mut execs: Execs| async move {
        let request = pb::AttachExecRequest { sandbox: "box".into(), exec_id: "both".into(), offset: 0 };
        read_all(execs.attach_exec(request).await.unwrap().into_inner(), 0, Duration::from_secs(60)).await
    };
    let (made, via_first, via_second) = tokio::join!(
        read_all(stream, 0, Duration::from_secs(60)),
        attach(first.execs().await),
        attach(second.execs().await)
    );
    for read in [made, via_first, via_second] {
        assert_eq!(
            (read.all.as_slice(), read.exit_code(), read.gaps.as_slice()),
            (&b"one\ntwo\n"[..], Some(5), &[][..])
        );
    }
    lifecycle(&mut sandboxes, "delete", "box").await.unwrap();
    wait_gone(&mut sandboxes, "box").await;
}
