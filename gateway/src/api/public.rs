//! The public API: sandboxes and providers.

use std::pin::Pin;

use berth_core::lifetime::Renewal;
use berth_core::port::{Credential, Refusal};
use berth_core::{Command, Hold, Intent, Outcome, Request as CoreRequest, validate};
use berth_proto::v1 as pb;
use berth_proto::v1::providers_server::Providers;
use berth_proto::v1::sandboxes_server::Sandboxes;
use futures_util::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use super::watch::{self, EventStream};
use crate::engine::Engine;
use crate::error::ApiError;
use crate::store::PageRequest;

const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;

/// A port from the wire: 1 to 65535.
fn tcp_port(port: u32) -> Result<u16, Status> {
    u16::try_from(port).ok().filter(|p| *p != 0).ok_or_else(|| invalid("port", &format!("{port} is not a TCP port")))
}

pub(super) fn invalid(field: &str, reason: &str) -> Status {
    Status::invalid_argument(format!("invalid {field}: {reason}"))
}

pub(super) fn core_invalid(e: berth_core::Error) -> Status {
    ApiError::from(e).into()
}

/// A page of `size` after `token`, which must be what the records are keyed by (`valid` says).
pub(super) fn page_of(
    size: u32,
    token: String,
    valid: impl Fn(&str, &str) -> Result<(), berth_core::Error>,
) -> Result<PageRequest, Status> {
    let limit = match size {
        0 => DEFAULT_PAGE,
        n if n > MAX_PAGE => return Err(invalid("page_size", &format!("at most {MAX_PAGE}, got {n}"))),
        n => n,
    };
    let after = if token.is_empty() {
        None
    } else {
        valid("page_token", &token).map_err(core_invalid)?;
        Some(token)
    };
    Ok(PageRequest { after, limit: limit as usize })
}

/// A page of records named by DNS labels (sandboxes, providers).
pub(super) fn page(size: u32, token: String) -> Result<PageRequest, Status> {
    page_of(size, token, validate::dns_label)
}

pub(super) fn sandbox_reply(outcome: Outcome) -> Result<Response<pb::SandboxReply>, Status> {
    match outcome {
        Outcome::Sandbox(s) => Ok(Response::new(pb::SandboxReply { sandbox: Some(convert::sandbox(*s)) })),
        other => Err(Status::internal(format!("a sandbox command returned {other:?}"))),
    }
}

pub struct SandboxApi {
    engine: Engine,
}

impl SandboxApi {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    async fn lifecycle(&self, command: Command, expected: Option<u64>) -> Result<Response<pb::SandboxReply>, Status> {
        sandbox_reply(self.engine.execute(&CoreRequest::new(command, expected)).await?)
    }
}

/// How long a port-forward's first message may take.
const START_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

type PortForwardStream = Pin<Box<dyn Stream<Item = Result<pb::PortForwardOutput, Status>> + Send>>;

#[tonic::async_trait]
impl Sandboxes for SandboxApi {
    type PortForwardStream = PortForwardStream;

    async fn port_forward(
        &self,
        request: Request<Streaming<pb::PortForwardInput>>,
    ) -> Result<Response<Self::PortForwardStream>, Status> {
        let mut inbound = request.into_inner();
        let start = match tokio::time::timeout(START_WITHIN, inbound.message()).await {
            Ok(Ok(Some(pb::PortForwardInput { input: Some(pb::port_forward_input::Input::Start(start)) }))) => start,
            Ok(Ok(_)) => return Err(invalid("start", "the first message of a port-forward must start it")),
            Ok(Err(status)) => return Err(status),
            Err(_) => return Err(Status::deadline_exceeded("no start within 10 s")),
        };
        validate::dns_label("name", &start.name).map_err(core_invalid)?;
        let port = tcp_port(start.port)?;
        let name = &start.name;
        let record = self.engine.store().sandbox_by_name(name).await.map_err(ApiError::from)?;
        let generation = berth_core::port::admit(self.engine.key(), record.as_ref(), port, Credential::ApiToken)
            .map_err(|refusal| {
                let message = crate::ports::refused(&refusal, name, port);
                match refusal {
                    Refusal::NotFound => Status::not_found(message),
                    Refusal::NotRunning(_) => Status::failed_precondition(message),
                    Refusal::Unauthorized(_) | Refusal::Gone { .. } => Status::permission_denied(message),
                }
            })?;
        let sandbox = record.map(|r| r.id).expect("admitted, so the record is there");
        let connection = crate::ports::connect(&self.engine, name, &sandbox, generation, port, start.here_only)
            .await
            .map_err(|e| e.into_status(start.here_only))?;
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let data_of = |m: pb::PortForwardInput| match m.input {
            Some(pb::port_forward_input::Input::Data(data)) => Some(data),
            _ => None,
        };
        let down_of = |data| pb::PortForwardOutput { data };
        tokio::spawn(super::supervisor::splice(
            self.engine.shutdown().clone(),
            connection,
            inbound,
            data_of,
            tx,
            down_of,
        ));
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn create_sandbox(
        &self,
        request: Request<pb::CreateSandboxRequest>,
    ) -> Result<Response<pb::SandboxReply>, Status> {
        let r = request.into_inner();
        if !r.from_snapshot.is_empty() {
            let mut spec = r.spec.unwrap_or_default();
            let labels = std::mem::take(&mut spec.labels);
            if spec != pb::SandboxSpec::default() {
                return Err(invalid(
                    "spec",
                    "a sandbox made from a snapshot runs the snapshot's spec: give only labels, to add to its",
                ));
            }
            let command = Command::CreateFromSnapshot {
                id: self.engine.new_sandbox_id(),
                name: r.name,
                snapshot: r.from_snapshot,
                labels,
                providers: r.providers.into_iter().collect(),
                deadline: r.deadline_unix_ms.map(convert::unix_millis),
            };
            return self.lifecycle(command, r.expected_resource_version).await;
        }
        let spec = r.spec.ok_or_else(|| invalid("spec", "is required"))?;
        let command = Command::CreateSandbox {
            id: self.engine.new_sandbox_id(),
            name: r.name,
            spec: convert::spec_from_wire(spec).map_err(core_invalid)?,
            providers: r.providers.into_iter().collect(),
            deadline: r.deadline_unix_ms.map(convert::unix_millis),
        };
        self.lifecycle(command, r.expected_resource_version).await
    }

    async fn get_sandbox(&self, request: Request<pb::GetSandboxRequest>) -> Result<Response<pb::SandboxReply>, Status> {
        let name = request.into_inner().name;
        validate::dns_label("name", &name).map_err(core_invalid)?;
        match self.engine.store().sandbox_by_name(&name).await.map_err(ApiError::from)? {
            Some(s) => Ok(Response::new(pb::SandboxReply { sandbox: Some(convert::sandbox(s)) })),
            None => Err(Status::not_found(format!("sandbox '{name}' not found"))),
        }
    }

    async fn list_sandboxes(
        &self,
        request: Request<pb::ListSandboxesRequest>,
    ) -> Result<Response<pb::ListSandboxesReply>, Status> {
        let r = request.into_inner();
        let page = page(r.page_size, r.page_token)?;
        let selector = r.label_selector.into_iter().collect();
        watch::validate_selector(&selector)?;
        let store = self.engine.store();
        let listing = store.list_sandboxes_at(&page, &selector).await.map_err(ApiError::from)?;
        Ok(Response::new(pb::ListSandboxesReply {
            sandboxes: listing.page.items.into_iter().map(convert::sandbox).collect(),
            next_page_token: listing.page.next.unwrap_or_default(),
            cursor: watch::cursor(store.as_ref(), listing.cursor),
        }))
    }

    type WatchSandboxStream = EventStream;

    async fn watch_sandbox(
        &self,
        request: Request<pb::WatchSandboxRequest>,
    ) -> Result<Response<Self::WatchSandboxStream>, Status> {
        Ok(Response::new(watch::one(self.engine.clone(), request.into_inner().name).await?))
    }

    type WatchSandboxesStream = EventStream;

    async fn watch_sandboxes(
        &self,
        request: Request<pb::WatchSandboxesRequest>,
    ) -> Result<Response<Self::WatchSandboxesStream>, Status> {
        let r = request.into_inner();
        let selector = r.label_selector.into_iter().collect();
        Ok(Response::new(watch::fleet(self.engine.clone(), selector, r.cursor).await?))
    }

    async fn renew_sandbox(
        &self,
        request: Request<pb::RenewSandboxRequest>,
    ) -> Result<Response<pb::SandboxReply>, Status> {
        let r = request.into_inner();
        let renewal = match (r.ttl_ms, r.deadline_unix_ms) {
            (Some(_), Some(_)) => return Err(invalid("ttl_ms", "give a ttl_ms or a deadline_unix_ms, not both")),
            (Some(ms), None) => Renewal::Ttl(convert::millis("ttl_ms", ms).map_err(core_invalid)?),
            (None, Some(ms)) => Renewal::Deadline(convert::unix_millis(ms)),
            (None, None) => Renewal::SpecTtl,
        };
        self.lifecycle(Command::RenewSandbox { name: r.name, renewal }, r.expected_resource_version).await
    }

    async fn stop_sandbox(&self, request: Request<pb::LifecycleRequest>) -> Result<Response<pb::SandboxReply>, Status> {
        let r = request.into_inner();
        self.lifecycle(Command::StopSandbox { name: r.name }, r.expected_resource_version).await
    }

    async fn start_sandbox(
        &self,
        request: Request<pb::LifecycleRequest>,
    ) -> Result<Response<pb::SandboxReply>, Status> {
        let r = request.into_inner();
        self.lifecycle(Command::StartSandbox { name: r.name }, r.expected_resource_version).await
    }

    async fn delete_sandbox(
        &self,
        request: Request<pb::LifecycleRequest>,
    ) -> Result<Response<pb::SandboxReply>, Status> {
        let r = request.into_inner();
        self.lifecycle(Command::DeleteSandbox { name: r.name }, r.expected_resource_version).await
    }

    async fn pause_sandbox(&self, request: Request<pb::PauseRequest>) -> Result<Response<pb::SandboxReply>, Status> {
        let r = request.into_inner();
        let hold = if r.checkpoint { Hold::Checkpoint } else { Hold::Freezer };
        self.lifecycle(Command::PauseSandbox { name: r.name, hold }, r.expected_resource_version).await
    }

    async fn resume_sandbox(
        &self,
        request: Request<pb::LifecycleRequest>,
    ) -> Result<Response<pb::SandboxReply>, Status> {
        let r = request.into_inner();
        self.lifecycle(Command::ResumeSandbox { name: r.name }, r.expected_resource_version).await
    }

    async fn get_port_url(&self, request: Request<pb::GetPortUrlRequest>) -> Result<Response<pb::PortUrl>, Status> {
        let r = request.into_inner();
        validate::dns_label("name", &r.name).map_err(core_invalid)?;
        let port = tcp_port(r.port)?;
        let Some(preview) = &self.engine.settings().preview else {
            return Err(Status::failed_precondition(
                "this gateway serves no preview proxy (start it with --proxy-listen)",
            ));
        };
        let sandbox = match self.engine.store().sandbox_by_name(&r.name).await.map_err(ApiError::from)? {
            Some(s) if s.intent != Intent::Deleted => s,
            _ => return Err(Status::not_found(format!("sandbox '{}' not found", r.name))),
        };
        // A token is its generation's: one for a stopped sandbox would be stale once it starts.
        if sandbox.intent == Intent::Stopped {
            return Err(Status::failed_precondition(format!(
                "sandbox '{}' is stopped: start it, then ask for the URL of its run",
                r.name
            )));
        }
        let public = berth_core::port::is_public(&sandbox, port);
        let token =
            (!public).then(|| berth_core::port::derive_token(self.engine.key(), &sandbox.id, sandbox.generation, port));
        let url = preview.url(&r.name, port, token.as_ref().map(|t| t.expose()));
        Ok(Response::new(pb::PortUrl {
            url,
            token: token.map(|t| t.expose().to_string()).unwrap_or_default(),
            generation: sandbox.generation,
            public,
            sandbox_id: sandbox.id.to_string(),
        }))
    }
}

pub struct ProviderApi {
    engine: Engine,
}

impl ProviderApi {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }
}

#[tonic::async_trait]
impl Providers for ProviderApi {
    async fn create_provider(
        &self,
        request: Request<pb::CreateProviderRequest>,
    ) -> Result<Response<pb::ProviderReply>, Status> {
        let r = request.into_inner();
        let endpoints = berth_core::egress::Policy::parse("endpoints", r.endpoints.iter().map(String::as_str))
            .map_err(ApiError::from)?;
        let command = Command::CreateProvider {
            name: r.name,
            kind: r.kind,
            credentials: convert::credentials(r.credentials),
            endpoints,
        };
        match self.engine.execute(&CoreRequest::new(command, r.expected_resource_version)).await? {
            Outcome::Provider(p) => Ok(Response::new(pb::ProviderReply { provider: Some(convert::provider(&p)) })),
            other => Err(Status::internal(format!("a provider command returned {other:?}"))),
        }
    }

    async fn get_provider(
        &self,
        request: Request<pb::GetProviderRequest>,
    ) -> Result<Response<pb::ProviderReply>, Status> {
        let name = request.into_inner().name;
        validate::dns_label("name", &name).map_err(core_invalid)?;
        match self.engine.store().provider(&name).await.map_err(ApiError::from)? {
            Some(p) => Ok(Response::new(pb::ProviderReply { provider: Some(convert::provider(&p)) })),
            None => Err(Status::not_found(format!("provider '{name}' not found"))),
        }
    }

    async fn list_providers(
        &self,
        request: Request<pb::ListProvidersRequest>,
    ) -> Result<Response<pb::ListProvidersReply>, Status> {
        let r = request.into_inner();
        let batch =
            self.engine.store().list_providers(&page(r.page_size, r.page_token)?).await.map_err(ApiError::from)?;
        Ok(Response::new(pb::ListProvidersReply {
            providers: batch.items.iter().map(convert::provider).collect(),
            next_page_token: batch.next.unwrap_or_default(),
        }))
    }

    async fn delete_provider(
        &self,
        request: Request<pb::DeleteProviderRequest>,
    ) -> Result<Response<pb::DeleteProviderReply>, Status> {
        let r = request.into_inner();
        let command = Command::DeleteProvider { name: r.name };
        self.engine.execute(&CoreRequest::new(command, r.expected_resource_version)).await?;
        Ok(Response::new(pb::DeleteProviderReply {}))
    }

    async fn attach_provider(&self, request: Request<pb::AttachRequest>) -> Result<Response<pb::SandboxReply>, Status> {
        let r = request.into_inner();
        let command = Command::AttachProvider { sandbox: r.sandbox, provider: r.provider };
        sandbox_reply(self.engine.execute(&CoreRequest::new(command, r.expected_resource_version)).await?)
    }

    async fn detach_provider(&self, request: Request<pb::AttachRequest>) -> Result<Response<pb::SandboxReply>, Status> {
        let r = request.into_inner();
        let command = Command::DetachProvider { sandbox: r.sandbox, provider: r.provider };
        sandbox_reply(self.engine.execute(&CoreRequest::new(command, r.expected_resource_version)).await?)
    }
}
