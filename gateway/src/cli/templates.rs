//! `berth template` and `berth pool`: templates and their warm pools (DESIGN 9.4).

use berth_proto::v1 as pb;
use clap::Subcommand;
use serde_json::json;

use super::Output;
use super::client::{Client, Failed};
use super::print::{spec_json, table};
use super::spec::{SpecArgs, Versioned};

#[derive(Subcommand)]
pub(super) enum TemplateCmd {
    /// Create a template: a named spec whose pool keeps --min-ready sandboxes running it Ready
    /// for `berth sandbox claim`.
    Create {
        /// A DNS label of at most 54 characters; its pool's sandboxes are named `NAME-<8 hex>`.
        name: String,
        #[command(flatten)]
        spec: Box<SpecArgs>,
        /// How many Ready sandboxes its pool keeps.
        #[arg(long, default_value_t = 0)]
        min_ready: u32,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Show one template and its pool.
    Get { name: String },
    /// List templates and their pools.
    List,
    /// Delete a template; its pool's unclaimed sandboxes go with it, claimed ones stay.
    Delete {
        name: String,
        #[command(flatten)]
        version: Versioned,
    },
}

#[derive(Subcommand)]
pub(super) enum PoolCmd {
    /// Set how many Ready sandboxes a template's pool keeps (0 empties it).
    Set {
        template: String,
        #[arg(long)]
        min_ready: u32,
        #[command(flatten)]
        version: Versioned,
    },
    /// Show a template's pool: its size, and its members not yet claimed.
    Get { template: String },
    /// Every template's pool.
    List,
}

fn template_json(t: &pb::Template) -> serde_json::Value {
    let pool = t.pool.clone().unwrap_or_default();
    json!({
        "name": t.name, "resource_version": t.resource_version,
        "spec": t.spec.as_ref().map(spec_json),
        "pool": {"min_ready": pool.min_ready, "ready": pool.ready, "members": pool.members, "member_names": pool.member_names},
        "created_at_unix_ms": t.created_at_unix_ms, "updated_at_unix_ms": t.updated_at_unix_ms,
    })
}

impl Client {
    fn print_templates(&self, templates: &[pb::Template]) {
        match self.output {
            Output::Json if templates.len() == 1 => say!("{:#}", template_json(&templates[0])),
            Output::Json => say!("{:#}", json!(templates.iter().map(template_json).collect::<Vec<_>>())),
            Output::Table => {
                let rows = templates
                    .iter()
                    .map(|t| {
                        let pool = t.pool.clone().unwrap_or_default();
                        vec![
                            t.name.clone(),
                            t.spec.as_ref().map(|s| s.image.clone()).unwrap_or_default(),
                            pool.min_ready.to_string(),
                            pool.ready.to_string(),
                            pool.members.to_string(),
                            t.resource_version.to_string(),
                        ]
                    })
                    .collect();
                say!("{}", table(&["NAME", "IMAGE", "MIN_READY", "READY", "MEMBERS", "VERSION"], rows));
            }
        }
    }

    async fn all_templates(&mut self) -> Result<Vec<pb::Template>, Failed> {
        let mut all = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = pb::ListTemplatesRequest { page_size: 500, page_token };
            let reply = self.templates.list_templates(request).await?.into_inner();
            all.extend(reply.templates);
            if reply.next_page_token.is_empty() {
                return Ok(all);
            }
            page_token = reply.next_page_token;
        }
    }

    async fn get_template(&mut self, name: String) -> Result<pb::Template, Failed> {
        Ok(self
            .templates
            .get_template(pb::GetTemplateRequest { name })
            .await?
            .into_inner()
            .template
            .unwrap_or_default())
    }

    pub(super) async fn template(&mut self, command: TemplateCmd) -> Result<(), Failed> {
        match command {
            TemplateCmd::Create { name, spec, min_ready, command } => {
                let request = pb::CreateTemplateRequest {
                    name,
                    spec: Some(spec.wire(command)),
                    min_ready,
                    expected_resource_version: None,
                };
                let reply = self.templates.create_template(request).await?.into_inner();
                self.print_templates(&[reply.template.unwrap_or_default()]);
            }
            TemplateCmd::Get { name } => {
                let t = self.get_template(name).await?;
                self.print_templates(&[t]);
            }
            TemplateCmd::List => {
                let all = self.all_templates().await?;
                self.print_templates(&all);
            }
            TemplateCmd::Delete { name, version } => {
                let request = pb::DeleteTemplateRequest {
                    name: name.clone(),
                    expected_resource_version: version.expected_version,
                };
                self.templates.delete_template(request).await?;
                self.print_deleted("template", &name);
            }
        }
        Ok(())
    }

    pub(super) async fn pool(&mut self, command: PoolCmd) -> Result<(), Failed> {
        match command {
            PoolCmd::Set { template, min_ready, version } => {
                let request =
                    pb::SetPoolRequest { template, min_ready, expected_resource_version: version.expected_version };
                let reply = self.templates.set_pool(request).await?.into_inner();
                self.print_templates(&[reply.template.unwrap_or_default()]);
            }
            PoolCmd::Get { template } => {
                let t = self.get_template(template).await?;
                match self.output {
                    Output::Json => say!("{:#}", template_json(&t)["pool"]),
                    Output::Table => {
                        self.print_templates(std::slice::from_ref(&t));
                        for member in t.pool.unwrap_or_default().member_names {
                            say!("  {member}");
                        }
                    }
                }
            }
            PoolCmd::List => {
                let all = self.all_templates().await?;
                self.print_templates(&all);
            }
        }
        Ok(())
    }
}
