//! The node agent binary. This build parses and checks its configuration and says plainly that
//! supervision is not implemented yet.

use std::process::ExitCode;

use clap::Parser;
use runner_manager_node_agent::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    eprintln!(
        "runner-manager-node-agent {}: node {}, capacity {}, launcher {:?}",
        env!("CARGO_PKG_VERSION"),
        cli.node_name,
        cli.capacity,
        cli.launcher
    );
    eprintln!(
        "this build does not supervise runners yet (admission, packages, workspaces and providers land with the node-agent issues); exiting"
    );
    ExitCode::from(2)
}
