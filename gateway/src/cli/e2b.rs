//! `berth e2b`: E2B's SDKs pointed at this gateway (DESIGN 15).

use clap::Subcommand;
use serde_json::json;

use super::Output;
use super::client::{Client, Failed};

#[derive(Subcommand)]
pub(super) enum E2bCmd {
    /// Print the exports that point E2B's SDKs at this gateway: `eval "$(berth e2b env)"`.
    Env,
}

impl Client {
    pub(super) async fn e2b(&mut self, command: E2bCmd) -> Result<(), Failed> {
        let E2bCmd::Env = command;
        let info = self.gateway.get_info(berth_proto::v1::GetInfoRequest {}).await?.into_inner();
        if info.e2b_url.is_empty() {
            return Err(Failed(format!(
                "gateway '{}' does not serve E2B's API: start it with --e2b-listen ADDR",
                info.name
            )));
        }
        let url = info.e2b_url;
        // The control plane and the in-sandbox API are served together, each sandbox named in
        // a header; the API key is the token this client presents.
        let exports = [("E2B_API_URL", url.as_str()), ("E2B_SANDBOX_URL", url.as_str()), ("E2B_API_KEY", &self.token)];
        match self.output {
            Output::Json => {
                say!("{:#}", json!(exports.iter().map(|(k, v)| (*k, *v)).collect::<std::collections::BTreeMap<_, _>>()))
            }
            Output::Table => {
                for (name, value) in exports {
                    say!("export {name}={}", shell_quoted(value));
                }
            }
        }
        Ok(())
    }
}

/// `value` as one shell word.
fn shell_quoted(value: &str) -> String {
    if value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:@%+=,".contains(&b)) {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_value_is_one_shell_word() {
        assert_eq!(super::shell_quoted("http://127.0.0.1:3000"), "http://127.0.0.1:3000");
        assert_eq!(super::shell_quoted("a b'c"), r"'a b'\''c'");
    }
}
