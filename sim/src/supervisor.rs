//! Simulated supervisors: one per run, speaking the real supervisor API to the gateway over
//! simulated TCP with the run's token, and stale ones reconnecting with old tokens. Each
//! acceptance and rejection is checked against the committed generations (I6).

use std::sync::Arc;
use std::time::Duration;

use berth_proto::v1 as pb;
use berth_proto::v1::gateway_message::Message as FromGateway;
use berth_proto::v1::supervisor_client::SupervisorClient;
use berth_proto::v1::supervisor_message::Message as ToGateway;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::checker::{generation_current_between, superseded_by};
use crate::net;
use crate::runtime::{Call, Request, RunSignal, Spawn};
use crate::world::{World, lock};

enum End {
    /// Nothing more to do: the run ended, or its exit was reported.
    Done,
    /// The gateway refused this run for good.
    Rejected,
    /// The connection broke: try again.
    Lost,
}

pub async fn supervisors(
    world: Arc<World>,
    mut spawns: mpsc::UnboundedReceiver<Spawn>,
    runtime: mpsc::UnboundedSender<Request>,
) -> turmoil::Result {
    while let Some(spawn) = spawns.recv().await {
        tokio::spawn(supervise(world.clone(), spawn, runtime.clone()));
    }
    Ok(())
}

async fn supervise(world: Arc<World>, mut spawn: Spawn, runtime: mpsc::UnboundedSender<Request>) {
    let actor = if spawn.ghost { "stale supervisor" } else { "supervisor" };
    let mut backoff = Duration::from_millis(100);
    // Like berth-supervisor given several gateways: each attempt goes to the next one.
    let mut gateway = spawn.generation as usize;
    loop {
        if !spawn.ghost && *spawn.signal.borrow() == RunSignal::Ended {
            return;
        }
        gateway = (gateway + 1) % world.scenario.gateways;
        match session(&world, &mut spawn, actor, gateway).await {
            End::Done => return,
            End::Rejected => {
                if !spawn.ghost {
                    // A rejected supervisor stops its workload and exits: its run ends.
                    let (reply, _) = tokio::sync::oneshot::channel();
                    let _ = runtime
                        .send(Request { call: Call::SupervisorExited(spawn.sandbox.clone(), spawn.generation), reply });
                }
                return;
            }
            End::Lost if spawn.ghost => return,
            End::Lost => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

fn message(m: ToGateway) -> pb::SupervisorMessage {
    pb::SupervisorMessage { message: Some(m) }
}

/// Checks a refusal: PERMISSION_DENIED is right only if a newer generation was committed.
fn rejected(world: &World, spawn: &Spawn, actor: &str, status: &tonic::Status, sent: u64) -> Option<End> {
    if !matches!(status.code(), Code::PermissionDenied | Code::NotFound | Code::Unauthenticated) {
        return None;
    }
    let name = lock(&world.runtime).name(&spawn.sandbox);
    world.event(actor, "rejected", format!("{name} generation {}: {:?}", spawn.generation, status.code()));
    let now = World::micros();
    match status.code() {
        Code::PermissionDenied if !superseded_by(world, &spawn.sandbox, spawn.generation, now) => world.violate(
            "I6",
            format!(
                "the supervisor of {} generation {} was rejected, but no newer generation was ever committed (hello sent at {sent} us): the runtime runs an identity the record does not hold",
                spawn.sandbox, spawn.generation
            ),
        ),
        Code::Unauthenticated => world.violate("I6", format!("a token the gateway issued for {} was not recognised", spawn.sandbox)),
        _ => {}
    }
    Some(End::Rejected)
}

async fn session(world: &World, spawn: &mut Spawn, actor: &str, gateway: usize) -> End {
    let (tx, rx) = mpsc::channel(4);
    let _ =
        tx.send(message(ToGateway::Hello(pb::Hello { runtime_token: spawn.token.clone(), main_process: None }))).await;
    let sent = World::micros();
    let mut client = SupervisorClient::new(net::channel(gateway));
    let mut inbound = match tokio::time::timeout(Duration::from_secs(3), client.session(ReceiverStream::new(rx))).await
    {
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(status)) => return rejected(world, spawn, actor, &status, sent).unwrap_or(End::Lost),
        Err(_) => return End::Lost,
    };
    match tokio::time::timeout(Duration::from_secs(3), inbound.message()).await {
        Ok(Ok(Some(pb::GatewayMessage { message: Some(FromGateway::Accepted(_)) }))) => {}
        Ok(Err(status)) => return rejected(world, spawn, actor, &status, sent).unwrap_or(End::Lost),
        _ => return End::Lost,
    }
    let accepted = World::micros();
    let name = lock(&world.runtime).name(&spawn.sandbox);
    world.event(actor, "accepted", format!("{name} generation {}", spawn.generation));
    // I6: only the current generation authenticates.
    if !generation_current_between(world, &spawn.sandbox, spawn.generation, sent, accepted) {
        world.violate(
            "I6",
            format!(
                "{} generation {} was accepted while another generation was current",
                spawn.sandbox, spawn.generation
            ),
        );
    }
    if spawn.ghost {
        return End::Done;
    }
    let mut heartbeat = tokio::time::interval(crate::gateway::HEARTBEAT);
    let mut reported = false;
    loop {
        let exited = match *spawn.signal.borrow_and_update() {
            RunSignal::MainExited(code) if !reported => Some(code),
            RunSignal::Ended if !reported => return End::Done,
            _ => None,
        };
        if let Some(code) = exited {
            let name = lock(&world.runtime).name(&spawn.sandbox);
            world.event(actor, "exit report", format!("{name} generation {} code {code}", spawn.generation));
            if tx.send(message(ToGateway::Exit(pb::MainProcessExit { exit_code: code }))).await.is_err() {
                return End::Lost;
            }
            reported = true;
        }
        tokio::select! {
            biased;
            received = inbound.message() => match received {
                Ok(Some(pb::GatewayMessage { message: Some(FromGateway::ExitAck(_)) })) => return End::Done,
                Ok(Some(_)) => {}
                Ok(None) => return End::Lost,
                Err(status) => return rejected(world, spawn, actor, &status, World::micros()).unwrap_or(End::Lost),
            },
            changed = spawn.signal.changed(), if !reported => if changed.is_err() { return End::Done },
            _ = heartbeat.tick() => {
                if tx.send(message(ToGateway::Heartbeat(pb::Heartbeat {}))).await.is_err() {
                    return End::Lost;
                }
            }
        }
    }
}
