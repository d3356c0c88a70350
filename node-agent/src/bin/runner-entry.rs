//! `runner-manager-runner-entry`: see `runner_manager_node_agent::entry`.

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    // A runner's job-started hook runs it as the job gate's client
    // (`runner_manager_node_agent::job_gate`); here, not in `entry`, which the launchers use.
    if let Some(code) = runner_manager_node_agent::job_gate::client_main(&args) {
        std::process::exit(code);
    }
    std::process::exit(runner_manager_node_agent::entry::main_with_args(args));
}
