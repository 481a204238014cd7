//! Runtime identities end to end: only the current generation's supervisor authenticates.

use std::path::PathBuf;

use berth_proto::v1 as pb;
use berth_proto::v1::gateway_message::Message as FromGateway;
use berth_proto::v1::supervisor_client::SupervisorClient;
use berth_proto::v1::supervisor_message::Message as ToGateway;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Endpoint, Uri};

use crate::harness::*;

async fn supervisor(data: &DataDir) -> SupervisorClient<tonic::transport::Channel> {
    let socket: PathBuf = data.path.join("run/gateway.sock");
    let connector = tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
    });
    SupervisorClient::new(Endpoint::from_static("http://gateway").connect_with_connector(connector).await.unwrap())
}

fn hello(token: &str) -> pb::SupervisorMessage {
    pb::SupervisorMessage {
        message: Some(ToGateway::Hello(pb::Hello {
            runtime_token: token.into(),
            main_process: None,
            out_of_memory: false,
        })),
    }
}

/// Opens a session; returns the sender and the gateway's first answer.
async fn open(
    client: &mut SupervisorClient<tonic::transport::Channel>,
    token: &str,
) -> Result<(mpsc::Sender<pb::SupervisorMessage>, tonic::Streaming<pb::GatewayMessage>), tonic::Status> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(hello(token)).await.unwrap();
    let mut inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
    match inbound.message().await?.and_then(|m| m.message) {
        Some(FromGateway::Accepted(_)) => Ok((tx, inbound)),
        other => panic!("expected Accepted, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_of_the_previous_generation_is_rejected_and_its_exit_report_changes_nothing() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let id = create(&mut sandboxes, "box", COUNTING, &[]).await.id;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    let mut client = supervisor(&data).await;

    // A second session of generation 1, open while it is current.
    let old = data.runtime_token(&id, 1);
    let (old_tx, mut old_inbound) = open(&mut client, old.expose()).await.unwrap();

    lifecycle(&mut sandboxes, "stop", "box").await.unwrap();
    wait_phase(&mut sandboxes, "box", pb::Phase::Stopped).await;
    lifecycle(&mut sandboxes, "start", "box").await.unwrap();
    let (ready, _) = wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    assert_eq!(ready.generation, 2);

    // Reconnecting with generation 1's token: PERMISSION_DENIED.
    let rejected = open(&mut client, old.expose()).await.unwrap_err();
    assert_eq!(rejected.code(), tonic::Code::PermissionDenied, "{rejected}");
    assert!(rejected.message().contains("stale runtime identity"), "{}", rejected.message());
    assert!(!rejected.message().contains(old.expose()), "the token never appears in an error");

    // The still-open generation-1 session reports an exit: acknowledged, and ignored.
    old_tx
        .send(pb::SupervisorMessage {
            message: Some(ToGateway::Exit(pb::MainProcessExit { exit_code: 9, out_of_memory: false })),
        })
        .await
        .unwrap();
    let ack = old_inbound.message().await.unwrap().and_then(|m| m.message);
    assert!(matches!(ack, Some(FromGateway::ExitAck(_))), "{ack:?}");
    let after = get(&mut sandboxes, "box").await.unwrap();
    assert_eq!((phase(&after), after.generation, after.failure), (pb::Phase::Ready, 2, None));
    assert!(!data.log().contains("cause=\"supervisor exit report\""), "the stale report changed a phase");
    // Its next heartbeat ends the session for good.
    old_tx.send(pb::SupervisorMessage { message: Some(ToGateway::Heartbeat(pb::Heartbeat {})) }).await.unwrap();
    let ended = old_inbound.message().await.unwrap_err();
    assert_eq!(ended.code(), tonic::Code::PermissionDenied);

    // The current generation authenticates; tokens that were never issued do not.
    assert!(open(&mut client, data.runtime_token(&id, 2).expose()).await.is_ok());
    for (bad, code) in [
        (data.runtime_token(&id, 3).expose().to_string(), tonic::Code::PermissionDenied),
        (data.runtime_token("sb-nope", 1).expose().to_string(), tonic::Code::NotFound),
        ("berth1.x.1.deadbeef".to_string(), tonic::Code::Unauthenticated),
        ("not a token".to_string(), tonic::Code::Unauthenticated),
        (String::new(), tonic::Code::Unauthenticated),
    ] {
        let err = open(&mut client, &bad).await.unwrap_err();
        assert_eq!(err.code(), code, "{bad:?}: {err}");
    }
    assert_eq!(phase(&get(&mut sandboxes, "box").await.unwrap()), pb::Phase::Ready);
}
