//! The stand-in runner's program, copied into the package as both `bin/Runner.Listener` and
//! `bin/Runner.Worker`; the worker is told apart by its `spawnclient` argument.

use runner_manager_e2e::standin_runner::{listener, worker};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = if args.first().map(String::as_str) == Some("spawnclient") {
        worker::main(&args)
    } else {
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(listener::main(&args)),
            Err(e) => {
                eprintln!("cannot start: {e}");
                1
            }
        }
    };
    std::process::exit(code);
}
