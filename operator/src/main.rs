//! The operator binary.

use std::process::ExitCode;

use clap::Parser;
use runner_manager_operator::{cli::Cli, run, telemetry};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _telemetry = telemetry::init(cli.log_format, "runner-manager-operator");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("runner-manager-operator: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "runner-manager-operator stopped");
            ExitCode::FAILURE
        }
    }
}
