//! The Berth CLI. `berth --help` lists the commands.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(trap) = berth_gateway::cli::misplaced_name(&args) {
        eprintln!("error: {trap}");
        return std::process::ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the CLI's runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let status = runtime.block_on(berth_gateway::cli::main(berth_gateway::cli::Cli::parse_from(args)));
    // An exec's stdin (`-i`) is read on a thread of its own, blocked in read(2) until the next
    // keystroke or line: the exec is over, so do not wait for it, as dropping the runtime would.
    runtime.shutdown_background();
    status
}
