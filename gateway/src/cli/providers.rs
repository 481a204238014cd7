//! `berth provider`: credentials for sandboxes, and attaching them.

use std::collections::BTreeMap;

use berth_proto::v1 as pb;
use clap::Subcommand;
use serde_json::json;

use super::Output;
use super::client::{Client, Failed};
use super::print::table;
use super::spec::Versioned;

#[derive(Subcommand)]
pub(super) enum ProviderCmd {
    /// Create a provider. Credential values are read from this process's environment, so they
    /// never appear in a command line.
    Create {
        name: String,
        #[arg(long)]
        kind: String,
        /// A credential: the name of an environment variable of this process whose value it
        /// takes, also the name it gets in sandboxes (repeatable).
        #[arg(long = "credential-from-env")]
        credentials: Vec<String>,
        /// Where the credentials are for: a host name, `*.suffix` or a CIDR block (repeatable).
        /// Attaching the provider lets a sandbox's runs reach them from their next start.
        #[arg(long = "endpoint")]
        endpoints: Vec<String>,
    },
    /// Show one provider (credential names only).
    Get { name: String },
    /// List providers.
    List,
    /// Delete a provider (refused while a sandbox that is not being deleted uses it).
    Delete {
        name: String,
        #[command(flatten)]
        version: Versioned,
    },
    /// Attach a provider to a sandbox (applies at its next start).
    Attach {
        sandbox: String,
        provider: String,
        #[command(flatten)]
        version: Versioned,
    },
    /// Detach a provider from a sandbox.
    Detach {
        sandbox: String,
        provider: String,
        #[command(flatten)]
        version: Versioned,
    },
}

fn provider_json(p: &pb::Provider) -> serde_json::Value {
    json!({
        "name": p.name, "kind": p.kind, "credential_names": p.credential_names, "endpoints": p.endpoints,
        "resource_version": p.resource_version,
    })
}

impl Client {
    fn print_providers(&self, providers: &[pb::Provider]) {
        match self.output {
            Output::Json if providers.len() == 1 => say!("{:#}", provider_json(&providers[0])),
            Output::Json => say!("{:#}", json!(providers.iter().map(provider_json).collect::<Vec<_>>())),
            Output::Table => say!(
                "{}",
                table(
                    &["NAME", "KIND", "CREDENTIALS", "ENDPOINTS", "VERSION"],
                    providers
                        .iter()
                        .map(|p| vec![
                            p.name.clone(),
                            p.kind.clone(),
                            p.credential_names.join(","),
                            p.endpoints.join(","),
                            p.resource_version.to_string()
                        ])
                        .collect()
                )
            ),
        }
    }

    pub(super) async fn provider(&mut self, command: ProviderCmd) -> Result<(), Failed> {
        match command {
            ProviderCmd::Create { name, kind, credentials, endpoints } => {
                let mut values = BTreeMap::new();
                for key in credentials {
                    let value = std::env::var(&key)
                        .map_err(|_| Failed(format!("--credential-from-env {key}: no such environment variable")))?;
                    values.insert(key, value);
                }
                let request = pb::CreateProviderRequest {
                    name,
                    kind,
                    credentials: values,
                    expected_resource_version: None,
                    endpoints,
                };
                let reply = self.providers.create_provider(request).await?.into_inner();
                self.print_providers(&[reply.provider.unwrap_or_default()]);
            }
            ProviderCmd::Get { name } => {
                let reply = self.providers.get_provider(pb::GetProviderRequest { name }).await?.into_inner();
                self.print_providers(&[reply.provider.unwrap_or_default()]);
            }
            ProviderCmd::List => {
                let mut all = Vec::new();
                let mut page_token = String::new();
                loop {
                    let reply = self
                        .providers
                        .list_providers(pb::ListProvidersRequest { page_size: 500, page_token })
                        .await?
                        .into_inner();
                    all.extend(reply.providers);
                    if reply.next_page_token.is_empty() {
                        break;
                    }
                    page_token = reply.next_page_token;
                }
                match self.output {
                    Output::Json => say!("{:#}", json!(all.iter().map(provider_json).collect::<Vec<_>>())),
                    Output::Table => self.print_providers(&all),
                }
            }
            ProviderCmd::Delete { name, version } => {
                let request = pb::DeleteProviderRequest {
                    name: name.clone(),
                    expected_resource_version: version.expected_version,
                };
                self.providers.delete_provider(request).await?;
                self.print_deleted("provider", &name);
            }
            ProviderCmd::Attach { sandbox, provider, version } => {
                let request =
                    pb::AttachRequest { sandbox, provider, expected_resource_version: version.expected_version };
                let reply = self.providers.attach_provider(request).await?.into_inner();
                self.print_sandboxes(&[reply.sandbox.unwrap_or_default()]);
            }
            ProviderCmd::Detach { sandbox, provider, version } => {
                let request =
                    pb::AttachRequest { sandbox, provider, expected_resource_version: version.expected_version };
                let reply = self.providers.detach_provider(request).await?.into_inner();
                self.print_sandboxes(&[reply.sandbox.unwrap_or_default()]);
            }
        }
        Ok(())
    }
}
