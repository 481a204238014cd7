//! The gRPC services: the public API (behind a bearer token), the supervisor API (behind
//! runtime tokens), health and reflection.

pub mod auth;
pub mod convert;
pub mod e2b;
pub mod exec;
pub mod files;
pub mod http;
pub mod info;
pub mod logs;
pub mod nodes;
pub mod public;
pub mod snapshots;
pub mod supervisor;
pub mod templates;
pub mod volumes;
pub mod watch;

use std::time::Duration;

use berth_proto::v1::execs_server::ExecsServer;
use berth_proto::v1::files_server::FilesServer;
use berth_proto::v1::gateway_server::GatewayServer;
use berth_proto::v1::logs_server::LogsServer;
use berth_proto::v1::nodes_server::NodesServer;
use berth_proto::v1::providers_server::ProvidersServer;
use berth_proto::v1::sandboxes_server::SandboxesServer;
use berth_proto::v1::snapshots_server::SnapshotsServer;
use berth_proto::v1::supervisor_server::SupervisorServer;
use berth_proto::v1::templates_server::TemplatesServer;
use berth_proto::v1::volumes_server::VolumesServer;
use tonic::server::NamedService;
use tonic::service::Routes;
use tonic_health::ServingStatus;

use crate::egress::Egress;
use crate::engine::Engine;
use crate::engine::activity::Activity;
use crate::engine::execs::Execs;
use crate::engine::files::Files;
use crate::engine::logs::Logs;

/// The services' statuses the health service reports.
pub struct Health {
    reporter: tonic_health::server::HealthReporter,
    served: [&'static str; 11],
}

impl Health {
    /// A health watch is a stream like any other: at a shutdown it hears NOT_SERVING (the whole
    /// server's, "", too), then ends, as a service's status dropped ends its watches, so that a
    /// load balancer watching neither misses the shutdown nor holds it up.
    pub async fn shut_down(mut self) {
        for name in self.served.into_iter().chain([""]) {
            self.reporter.set_service_status(name, ServingStatus::NotServing).await;
            self.reporter.clear_service_status(name).await;
        }
    }
}

/// Every service of a gateway, ready to serve on any listener, and their health.
pub async fn routes(engine: &Engine, token: &str, heartbeat: Duration) -> (Routes, Health) {
    let auth = auth::BearerAuth::new(token);
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let served = [
        SandboxesServer::<public::SandboxApi>::NAME,
        ProvidersServer::<public::ProviderApi>::NAME,
        ExecsServer::<exec::ExecApi>::NAME,
        LogsServer::<logs::LogsApi>::NAME,
        FilesServer::<files::FilesApi>::NAME,
        TemplatesServer::<templates::TemplateApi>::NAME,
        SnapshotsServer::<snapshots::SnapshotApi>::NAME,
        VolumesServer::<volumes::VolumeApi>::NAME,
        NodesServer::<nodes::NodeApi>::NAME,
        GatewayServer::<info::GatewayApi>::NAME,
        SupervisorServer::<supervisor::SupervisorApi>::NAME,
    ];
    for name in served {
        reporter.set_service_status(name, ServingStatus::Serving).await;
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(berth_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the embedded descriptor sets are valid");
    let sandboxes_auth = auth.clone();
    let providers_auth = auth.clone();
    let execs_auth = auth.clone();
    let logs_auth = auth.clone();
    let files_auth = auth.clone();
    let templates_auth = auth.clone();
    let snapshots_auth = auth.clone();
    let volumes_auth = auth.clone();
    let nodes_auth = auth.clone();
    let info_auth = auth;
    let execs = Execs::new(engine.clone());
    let activity = Activity::new(engine.clone());
    let shutdown = engine.shutdown();
    let mut routes = Routes::builder();
    routes
        .add_service(SandboxesServer::with_interceptor(public::SandboxApi::new(engine.clone()), move |r| {
            sandboxes_auth.check(r)
        }))
        .add_service(ProvidersServer::with_interceptor(public::ProviderApi::new(engine.clone()), move |r| {
            providers_auth.check(r)
        }))
        .add_service(ExecsServer::with_interceptor(
            exec::ExecApi::new(execs.clone(), activity.clone(), shutdown.clone()),
            move |r| execs_auth.check(r),
        ))
        .add_service(LogsServer::with_interceptor(
            logs::LogsApi::new(Logs::new(engine.clone()), activity, shutdown.clone()),
            move |r| logs_auth.check(r),
        ))
        .add_service(FilesServer::with_interceptor(files::FilesApi::new(Files::new(engine.clone())), move |r| {
            files_auth.check(r)
        }))
        .add_service(TemplatesServer::with_interceptor(templates::TemplateApi::new(engine.clone()), move |r| {
            templates_auth.check(r)
        }))
        .add_service(SnapshotsServer::with_interceptor(snapshots::SnapshotApi::new(engine.clone()), move |r| {
            snapshots_auth.check(r)
        }))
        .add_service(VolumesServer::with_interceptor(volumes::VolumeApi::new(engine.clone()), move |r| {
            volumes_auth.check(r)
        }))
        .add_service(NodesServer::with_interceptor(nodes::NodeApi::new(engine.clone()), move |r| nodes_auth.check(r)))
        .add_service(GatewayServer::with_interceptor(info::GatewayApi::new(engine.clone()), move |r| {
            info_auth.check(r)
        }))
        .add_service(SupervisorServer::new(supervisor::SupervisorApi::new(
            engine.clone(),
            execs,
            Egress::new(engine.clone()),
            heartbeat,
        )))
        .add_service(health_service)
        .add_service(reflection);
    (routes.routes(), Health { reporter, served })
}
