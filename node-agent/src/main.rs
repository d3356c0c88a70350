//! The node agent binary: the process of DESIGN §6 (see `agent`).

use std::process::ExitCode;

use clap::Parser;
use runner_manager_node_agent::agent::{self, AgentError};
use runner_manager_node_agent::cli::Cli;
use runner_manager_node_agent::telemetry;

/// Another agent holds the host fence.
const EXIT_FENCED: u8 = 3;
const EXIT_FAILED: u8 = 1;

fn main() -> ExitCode {
    // aws-lc-rs is the one TLS provider this workspace builds; say so before anything uses TLS.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cli = Cli::parse();
    let _telemetry = telemetry::init(cli.log_format, "runner-manager-node-agent");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("runner-manager-node-agent: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    match runtime.block_on(agent::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ AgentError::Fence(_)) => {
            tracing::error!(error = e.kind(), "runner-manager-node-agent: {e}");
            ExitCode::from(EXIT_FENCED)
        }
        Err(e) => {
            tracing::error!(error = e.kind(), "runner-manager-node-agent: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}
