//! The Berth gateway. `berth-gateway --help` lists every setting.

use berth_gateway::config::{Config, Flags, LogFormat};
use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> std::process::ExitCode {
    let config = match Config::load(Flags::parse()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("berth-gateway: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let filter = EnvFilter::try_new(&config.log).unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let subscriber = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => subscriber.init(),
        LogFormat::Json => subscriber.json().init(),
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("berth-gateway: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(berth_gateway::server::run(config));
    // The shutdown is over, within its bound: what still runs (a connection past the bound, a
    // blocking task) is dropped as a crash would drop it, which every part is made to survive,
    // rather than waited for without a deadline.
    runtime.shutdown_background();
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("berth-gateway: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
