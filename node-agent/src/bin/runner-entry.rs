//! `runner-manager-runner-entry`: see `runner_manager_node_agent::entry`.

fn main() {
    std::process::exit(runner_manager_node_agent::entry::main_with_args(
        std::env::args_os().skip(1),
    ));
}
