//! Logging: `tracing` to stderr, text or JSON, level from `RUST_LOG` (default `info`). Fields
//! are chosen at each call site from closed vocabularies; nothing workflow-controlled is logged.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Install the process's subscriber.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.with_ansi(false).try_init(),
    };
}
