//! The Berth CLI. `berth --help` lists the commands.

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    berth_gateway::cli::main(berth_gateway::cli::Cli::parse()).await
}
