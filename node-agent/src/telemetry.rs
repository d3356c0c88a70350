//! The agent's telemetry: `tracing` to stderr (text, or one JSON object per line with
//! `--log-format json`: `timestamp`, `level`, `target`, `fields.message` and the call site's
//! fields, the shape of the operator's lines), the level from `RUST_LOG` (default `info`), and
//! OpenTelemetry traces exported over OTLP/HTTP (protobuf) when the standard `OTEL_*`
//! variables ask for them (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`;
//! `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn them off).
//!
//! Fields are chosen at each call site from an allow-list: attempt namespace, name and uid,
//! node, closed reasons, step names, durations and counts. Nothing a workflow controls (labels,
//! runner output, environment values) and no credential (JIT, token) is ever a field or a
//! message. The log output enforces the list ([`ALLOWED_FIELDS`], [`allow`]): a field not on it
//! is dropped from every line, text or JSON, event or span.
//!
//! A launch's spans join the trace the operator started when it created the attempt: the
//! attempt carries the W3C `traceparent` in the [`TRACEPARENT_ANNOTATION`] annotation.

use crate::cli::LogFormat;

pub use runner_manager_telemetry::{
    Telemetry, allow, current_traceparent, join, otlp_requested, well_formed,
};

pub use runner_manager_crds::TRACEPARENT_ANNOTATION;

/// The only field names a log line may carry (besides the message): the attempt's namespace,
/// name and uid, the node, closed reasons and outcomes, our own error texts, step names, the
/// address it serves on, counts and durations. Never a label, a runner or job name, a path
/// under a workspace, an environment value or a credential. Listed in docs/observability.md.
pub const ALLOWED_FIELDS: &[&str] = &[
    "namespace",
    "attempt",
    "attempt.uid",
    "attempt.namespace",
    "attempt.name",
    "node",
    "pod",
    "slot",
    "pid",
    "runner_id",
    "reason",
    "outcome",
    "state",
    "error",
    "step",
    "stage",
    "launcher",
    "health",
    "capacity",
    "elapsed_ms",
    "retry_in_s",
    "otel.name",
    "otel.kind",
    "otel.status_code",
];

/// Install the process's subscriber (once; later calls do nothing).
pub fn init(format: LogFormat, service: &'static str) -> Telemetry {
    runner_manager_telemetry::init(
        format == LogFormat::Json,
        service,
        env!("CARGO_PKG_VERSION"),
        ALLOWED_FIELDS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list keeps what it must and drops what a workflow controls, and every field name
    /// the agent's source emits is on it (the scan stops at each file's `#[cfg(test)]`, where
    /// this module feeds the layer fields that must be dropped).
    #[test]
    fn every_field_name_the_agent_emits_is_allowed() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        runner_manager_telemetry::testing::check_binary(&src, ALLOWED_FIELDS).unwrap();
    }
}
