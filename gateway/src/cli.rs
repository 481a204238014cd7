//! `berth`: the command-line client of the public API.
//!
//! It finds the gateway and its token from flags, `BERTH_*` variables, or the gateway's data
//! directory. Lifecycle commands wait for their target phase by default, showing the current
//! phase, and fail (non-zero status, the server's message) if the sandbox lands in Error.
//!
//! A module per noun (sandbox, exec, logs, files, watch, provider, template) drives the gateway
//! through the client layer they share ([`client`]: the connection, the token, and reconnecting
//! a stream whose gateway went away).

use berth_proto::v1 as pb;
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

use client::{Client, Connection, Failed, connect};
use exec::ExecCmd;
use providers::ProviderCmd;
use sandbox::SandboxCmd;

/// `println!` that ends the CLI quietly once whoever reads its output has gone
/// (`berth sandbox list | head -1`), as a Unix tool does, instead of panicking on the write.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::print::say(format_args!($($arg)*))
    };
}

mod client;
mod e2b;
mod exec;
mod files;
mod logs;
mod nodes;
mod ports;
mod print;
mod providers;
mod sandbox;
mod snapshots;
mod spec;
mod templates;
mod volumes;
mod watch;

#[derive(Parser)]
#[command(name = "berth", version, about = "Drive a Berth gateway: sandboxes and providers")]
pub struct Cli {
    #[command(flatten)]
    connection: Connection,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    #[command(subcommand)]
    command: Top,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Top {
    /// Create, inspect and drive sandboxes.
    #[command(subcommand)]
    Sandbox(SandboxCmd),
    /// Create, inspect and attach providers (credentials for sandboxes).
    #[command(subcommand)]
    Provider(ProviderCmd),
    /// Inspect, attach to and cancel execs.
    #[command(subcommand)]
    Exec(ExecCmd),
    /// Create, inspect and delete templates: named specs with a warm pool.
    #[command(subcommand)]
    Template(templates::TemplateCmd),
    /// Size and inspect templates' warm pools.
    #[command(subcommand)]
    Pool(templates::PoolCmd),
    /// Take, inspect and delete snapshots of sandboxes' files.
    #[command(subcommand)]
    Snapshot(snapshots::SnapshotCmd),
    /// Create, inspect and delete volumes: files that outlive the sandboxes that mount them.
    #[command(subcommand)]
    Volume(volumes::VolumeCmd),
    /// Inspect and drain nodes: the hosts that run sandboxes.
    #[command(subcommand)]
    Node(nodes::NodeCmd),
    /// Point E2B's SDKs at this gateway (its --e2b-listen).
    #[command(subcommand)]
    E2b(e2b::E2bCmd),
    /// Print this client's version and the gateway's.
    Version,
    /// Print a shell completion script: `berth completions bash > /etc/bash_completion.d/berth`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

impl Client {
    /// The gateway's version and what it runs on (the client's is printed before connecting).
    async fn version(&mut self) -> Result<(), Failed> {
        let info = self.gateway.get_info(pb::GetInfoRequest {}).await?.into_inner();
        match self.output {
            Output::Json => say!(
                "{}",
                json!({"client": env!("CARGO_PKG_VERSION"), "gateway": {
                    "version": info.version, "name": info.name, "store": info.store, "driver": info.driver,
                }})
            ),
            Output::Table => {
                say!("gateway {} ({}, {} store, {} driver)", info.version, info.name, info.store, info.driver)
            }
        }
        Ok(())
    }
}

/// Why `args` (the command line) will not do what a docker user means by it, if so: `--name`
/// after `sandbox create` is the global flag naming the gateway, where `docker run --name` names
/// the container. Arguments after `--` (the command's own) are the command's.
pub fn misplaced_name(args: &[std::ffi::OsString]) -> Option<String> {
    let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap_or("")).take_while(|a| *a != "--").collect();
    let create = args.windows(2).position(|w| w == ["sandbox", "create"])? + 2;
    args[create..].iter().any(|a| *a == "--name" || a.starts_with("--name=")).then(|| {
        "--name after `sandbox create` would name the gateway (`berth --name GATEWAY ...`), not \
         the sandbox: the sandbox's name is create's first argument, `berth sandbox create NAME -- \
         COMMAND...`"
            .to_string()
    })
}

/// Runs the CLI; returns the process's exit status.
pub async fn main(cli: Cli) -> std::process::ExitCode {
    let result = async {
        let command = match cli.command {
            Top::Completions { shell } => {
                let mut command = <Cli as clap::CommandFactory>::command();
                clap_complete::generate(shell, &mut command, "berth", &mut std::io::stdout());
                return Ok(0);
            }
            // The client's version, even when no gateway answers (as JSON, once it is known
            // whether one did: the output is one document).
            Top::Version => {
                if matches!(cli.output, Output::Table) {
                    say!("client {}", env!("CARGO_PKG_VERSION"));
                }
                Top::Version
            }
            command => command,
        };
        let mut client = match connect(&cli.connection, cli.output).await {
            Ok(client) => client,
            Err(failed) => {
                if matches!((&command, cli.output), (Top::Version, Output::Json)) {
                    say!("{}", json!({"client": env!("CARGO_PKG_VERSION"), "gateway": null}));
                }
                return Err(failed);
            }
        };
        match command {
            Top::Sandbox(c) => client.sandbox(c).await,
            Top::Provider(c) => client.provider(c).await.map(|()| 0),
            Top::Exec(c) => client.exec_command(c).await,
            Top::Template(c) => client.template(c).await.map(|()| 0),
            Top::Pool(c) => client.pool(c).await.map(|()| 0),
            Top::Snapshot(c) => client.snapshot(c).await.map(|()| 0),
            Top::Volume(c) => client.volume(c).await.map(|()| 0),
            Top::Node(c) => client.node(c).await.map(|()| 0),
            Top::E2b(c) => client.e2b(c).await.map(|()| 0),
            Top::Version => client.version().await.map(|()| 0),
            // Answered above, before connecting.
            Top::Completions { .. } => Ok(0),
        }
    }
    .await;
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        Err(Failed(message)) => {
            eprintln!("error: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> Vec<std::ffi::OsString> {
        text.split_whitespace().map(Into::into).collect()
    }

    #[test]
    fn a_name_flag_after_sandbox_create_is_caught_and_nowhere_else() {
        for trap in ["berth sandbox create --name web -- sleep 1", "berth -o json sandbox create web --name=gw -- x"] {
            let why = misplaced_name(&line(trap)).unwrap_or_else(|| panic!("not caught: {trap}"));
            assert!(why.contains("berth sandbox create NAME"), "{why}");
        }
        for fine in [
            "berth --name gw sandbox create web -- sleep 1",
            "berth sandbox create web -- sh -c --name",
            "berth sandbox exec web --name x",
            "berth template create t --name x -- sleep 1",
        ] {
            assert_eq!(misplaced_name(&line(fine)), None, "{fine}");
        }
    }
}
