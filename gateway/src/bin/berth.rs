//! The Berth CLI. `berth --help` lists the commands.

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(trap) = berth_gateway::cli::misplaced_name(&args) {
        eprintln!("error: {trap}");
        return std::process::ExitCode::from(2);
    }
    berth_gateway::cli::main(berth_gateway::cli::Cli::parse_from(args)).await
}
