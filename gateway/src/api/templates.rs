//! Templates and warm pools (DESIGN 9.4): the `Templates` service.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_core::template::{POOL_LABEL, Template, is_member};
use berth_core::{Command, Outcome, PhaseKind, Request as CoreRequest, Sandbox};
use berth_proto::v1 as pb;
use berth_proto::v1::templates_server::Templates;
use tonic::{Request, Response, Status};

use super::convert;
use super::public::{core_invalid, invalid, page, sandbox_reply};
use crate::engine::Engine;
use crate::error::ApiError;
use crate::store::PageRequest;

/// The longest a claim may ask to wait for a Ready member.
const MAX_WAIT: Duration = Duration::from_secs(600);
/// How often a waiting claim looks again when nothing here told it to (a member made Ready
/// through another gateway).
const LOOK_AGAIN: Duration = Duration::from_millis(200);

pub struct TemplateApi {
    engine: Engine,
}

impl TemplateApi {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    /// The template as the API shows it, with its pool as it stands.
    async fn shown(&self, template: &Template) -> Result<pb::Template, Status> {
        let members = members(&self.engine, &template.name).await?;
        let ready = members.iter().filter(|s| s.phase.kind() == PhaseKind::Ready).count();
        Ok(pb::Template {
            name: template.name.clone(),
            spec: Some(convert::spec_to_wire(template.spec.clone())),
            resource_version: template.resource_version,
            created_at_unix_ms: template.created_at.unix_millis(),
            updated_at_unix_ms: template.updated_at.unix_millis(),
            pool: Some(pb::Pool {
                min_ready: template.min_ready,
                ready: ready as u32,
                members: members.len() as u32,
                member_names: members.iter().map(|s| s.name.to_string()).collect(),
            }),
        })
    }

    async fn reply(&self, outcome: Outcome) -> Result<Response<pb::TemplateReply>, Status> {
        match outcome {
            Outcome::Template(t) => Ok(Response::new(pb::TemplateReply { template: Some(self.shown(&t).await?) })),
            other => Err(Status::internal(format!("a template command returned {other:?}"))),
        }
    }
}

/// A pool's members not yet claimed, by name.
async fn members(engine: &Engine, template: &str) -> Result<Vec<Sandbox>, Status> {
    let selector = BTreeMap::from([(POOL_LABEL.to_string(), template.to_string())]);
    let mut all = Vec::new();
    let mut page = PageRequest { after: None, limit: 500 };
    loop {
        let batch = engine.store().list_sandboxes(&page, &selector).await.map_err(ApiError::from)?;
        all.extend(batch.items.into_iter().filter(|s| is_member(s, template)));
        match batch.next {
            Some(next) => page.after = Some(next),
            None => return Ok(all),
        }
    }
}

#[tonic::async_trait]
impl Templates for TemplateApi {
    async fn create_template(
        &self,
        request: Request<pb::CreateTemplateRequest>,
    ) -> Result<Response<pb::TemplateReply>, Status> {
        let r = request.into_inner();
        let spec =
            convert::spec_from_wire(r.spec.ok_or_else(|| invalid("spec", "is required"))?).map_err(core_invalid)?;
        let command = Command::CreateTemplate { name: r.name, spec, min_ready: r.min_ready };
        let outcome = self.engine.execute(&CoreRequest::new(command, r.expected_resource_version)).await?;
        self.engine.want_refill();
        self.reply(outcome).await
    }

    async fn get_template(
        &self,
        request: Request<pb::GetTemplateRequest>,
    ) -> Result<Response<pb::TemplateReply>, Status> {
        let name = request.into_inner().name;
        berth_core::validate::dns_label("name", &name).map_err(core_invalid)?;
        match self.engine.store().template(&name).await.map_err(ApiError::from)? {
            Some(t) => Ok(Response::new(pb::TemplateReply { template: Some(self.shown(&t).await?) })),
            None => Err(Status::not_found(format!("template '{name}' not found"))),
        }
    }

    async fn list_templates(
        &self,
        request: Request<pb::ListTemplatesRequest>,
    ) -> Result<Response<pb::ListTemplatesReply>, Status> {
        let r = request.into_inner();
        let batch =
            self.engine.store().list_templates(&page(r.page_size, r.page_token)?).await.map_err(ApiError::from)?;
        let mut templates = Vec::with_capacity(batch.items.len());
        for t in &batch.items {
            templates.push(self.shown(t).await?);
        }
        Ok(Response::new(pb::ListTemplatesReply { templates, next_page_token: batch.next.unwrap_or_default() }))
    }

    async fn delete_template(
        &self,
        request: Request<pb::DeleteTemplateRequest>,
    ) -> Result<Response<pb::DeleteTemplateReply>, Status> {
        let r = request.into_inner();
        let command = Command::DeleteTemplate { name: r.name };
        self.engine.execute(&CoreRequest::new(command, r.expected_resource_version)).await?;
        self.engine.want_refill();
        Ok(Response::new(pb::DeleteTemplateReply {}))
    }

    async fn set_pool(&self, request: Request<pb::SetPoolRequest>) -> Result<Response<pb::TemplateReply>, Status> {
        let r = request.into_inner();
        let command = Command::SetPool { template: r.template, min_ready: r.min_ready };
        let outcome = self.engine.execute(&CoreRequest::new(command, r.expected_resource_version)).await?;
        self.engine.want_refill();
        self.reply(outcome).await
    }

    async fn claim_sandbox(
        &self,
        request: Request<pb::ClaimSandboxRequest>,
    ) -> Result<Response<pb::SandboxReply>, Status> {
        let r = request.into_inner();
        let wait = Duration::from_millis(u64::from(r.wait_ms.unwrap_or(0)));
        if wait > MAX_WAIT {
            return Err(invalid("wait_ms", &format!("at most {}", MAX_WAIT.as_millis())));
        }
        let command = Command::ClaimSandbox {
            template: r.template,
            labels: r.labels,
            providers: r.providers.into_iter().collect(),
        };
        let request = CoreRequest::new(command, None);
        let until = tokio::time::Instant::now() + wait;
        let mut changes = self.engine.subscribe();
        loop {
            let result = self.engine.execute(&request).await;
            // Taken or not, the pool wants refilling.
            self.engine.want_refill();
            match result {
                Err(ApiError::Core(berth_core::Error::PoolEmpty { .. })) if tokio::time::Instant::now() < until => {
                    // A member turning Ready here is a change; one through another gateway is
                    // seen at the next look.
                    let _ =
                        tokio::time::timeout_at(until.min(tokio::time::Instant::now() + LOOK_AGAIN), changes.recv())
                            .await;
                }
                other => return sandbox_reply(other?),
            }
        }
    }
}
