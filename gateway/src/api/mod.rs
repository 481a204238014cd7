//! The gRPC services: the public API (behind a bearer token), the supervisor API (behind
//! runtime tokens), health and reflection.

pub mod auth;
pub mod convert;
pub mod exec;
pub mod files;
pub mod http;
pub mod info;
pub mod logs;
pub mod public;
pub mod supervisor;
pub mod templates;
pub mod watch;

use std::time::Duration;

use berth_proto::v1::execs_server::ExecsServer;
use berth_proto::v1::files_server::FilesServer;
use berth_proto::v1::gateway_server::GatewayServer;
use berth_proto::v1::logs_server::LogsServer;
use berth_proto::v1::providers_server::ProvidersServer;
use berth_proto::v1::sandboxes_server::SandboxesServer;
use berth_proto::v1::supervisor_server::SupervisorServer;
use berth_proto::v1::templates_server::TemplatesServer;
use tonic::service::Routes;

use crate::engine::Engine;

/// Every service of a gateway, ready to serve on any listener.
pub async fn routes(engine: &Engine, token: &str, heartbeat: Duration) -> Routes {
    let auth = auth::BearerAuth::new(token);
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<SandboxesServer<public::SandboxApi>>().await;
    health.set_serving::<ProvidersServer<public::ProviderApi>>().await;
    health.set_serving::<ExecsServer<exec::ExecApi>>().await;
    health.set_serving::<LogsServer<logs::LogsApi>>().await;
    health.set_serving::<FilesServer<files::FilesApi>>().await;
    health.set_serving::<TemplatesServer<templates::TemplateApi>>().await;
    health.set_serving::<GatewayServer<info::GatewayApi>>().await;
    health.set_serving::<SupervisorServer<supervisor::SupervisorApi>>().await;
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
    let info_auth = auth;
    let mut routes = Routes::builder();
    routes
        .add_service(SandboxesServer::with_interceptor(public::SandboxApi::new(engine.clone()), move |r| {
            sandboxes_auth.check(r)
        }))
        .add_service(ProvidersServer::with_interceptor(public::ProviderApi::new(engine.clone()), move |r| {
            providers_auth.check(r)
        }))
        .add_service(ExecsServer::with_interceptor(exec::ExecApi::new(engine.clone()), move |r| execs_auth.check(r)))
        .add_service(LogsServer::with_interceptor(logs::LogsApi::new(engine.clone()), move |r| logs_auth.check(r)))
        .add_service(FilesServer::with_interceptor(files::FilesApi::new(engine.clone()), move |r| files_auth.check(r)))
        .add_service(TemplatesServer::with_interceptor(templates::TemplateApi::new(engine.clone()), move |r| {
            templates_auth.check(r)
        }))
        .add_service(GatewayServer::with_interceptor(info::GatewayApi::new(engine.clone()), move |r| {
            info_auth.check(r)
        }))
        .add_service(SupervisorServer::new(supervisor::SupervisorApi::new(engine.clone(), heartbeat)))
        .add_service(health_service)
        .add_service(reflection);
    routes.routes()
}
