//! The agent's log lines: text, or one JSON object per line (`--log-format json`, what the chart
//! sets, in the shape the operator's JSON lines have: `timestamp`, `level`, `fields.message`).
//! Messages carry ids, kinds and closed reasons, never a JIT, a token or runner output.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::jiff::Timestamp;

use crate::cli::LogFormat;

static JSON: AtomicBool = AtomicBool::new(false);

/// Chooses the format for the process.
pub fn init(format: LogFormat) {
    JSON.store(format == LogFormat::Json, Ordering::SeqCst);
}

/// Writes one line to stderr.
pub fn emit(args: fmt::Arguments<'_>) {
    let message = args.to_string();
    let now = Timestamp::now();
    if JSON.load(Ordering::SeqCst) {
        let line = serde_json::json!({
            "timestamp": now.to_string(),
            "level": "INFO",
            "target": "runner_manager_node_agent",
            "fields": {"message": message},
        });
        eprintln!("{line}");
    } else {
        eprintln!("{now} agent: {message}");
    }
}

/// `say!("...", args)`: one log line in the chosen format.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::agent::log::emit(::std::format_args!($($arg)*))
    };
}
pub(crate) use say;
