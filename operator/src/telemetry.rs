//! The operator's telemetry: `tracing` to stderr (text, or one JSON object per line with
//! `--log-format json`: `timestamp`, `level`, `target`, `fields.message` and the call site's
//! fields, the shape of the agent's lines), the level from `RUST_LOG` (default `info`), and
//! OpenTelemetry traces exported over OTLP/HTTP (protobuf) when the standard `OTEL_*`
//! variables ask for them (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`;
//! `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn them off).
//!
//! Fields are chosen at each call site from an allow-list: policy and attempt namespace and
//! name, node, closed reasons and outcomes, endpoints, durations and counts. Nothing a workflow
//! controls (labels, runner names, job payloads) and no credential (JIT, token, key) is ever a
//! field or a message. The log output enforces the list ([`ALLOWED_FIELDS`], [`allow`]): a field
//! not on it is dropped from every line, text or JSON, event or span.
//!
//! Each runner gets one trace: the operator starts it when it creates the attempt (a root span
//! `runner.create`, linked to the reconcile that decided it) and writes its W3C `traceparent` on
//! the attempt ([`TRACEPARENT_ANNOTATION`]); the agent's launch spans join it.

use crate::cli::LogFormat;

pub use runner_manager_telemetry::{
    Telemetry, allow, current_traceparent, join, otlp_requested, well_formed,
};
pub mod origin;

pub use runner_manager_crds::TRACEPARENT_ANNOTATION;

/// The only field names a log line may carry (besides the message). Ids, namespaces and names
/// of the operator's own objects, closed vocabularies, addresses it serves on, counts and
/// durations; never a label, a job or runner name, a repository path, a URL or a credential.
/// Listed in docs/observability.md.
pub const ALLOWED_FIELDS: &[&str] = &[
    // objects: the operator's own, named by the admin or by the operator
    "namespace",
    "name",
    "policy",
    "policies",
    "attempt",
    "attempts",
    "node",
    "pod",
    "pod_ip",
    "daemonset",
    "agent_daemonset_uid",
    "owner",
    "owner_uid",
    "identity",
    "user",
    "caller",
    "peer",
    "secret",
    "configuration",
    "kind",
    "ownership_label",
    "attempt.uid",
    "attempt.namespace",
    "attempt.name",
    "policy.namespace",
    "policy.name",
    // closed vocabularies and our own error texts
    "reason",
    "outcome",
    "error",
    "endpoint",
    "github.endpoint",
    "http.request.method",
    "http.route",
    "http.response.status_code",
    "github.ratelimit.remaining",
    "origin",
    "action",
    "stage",
    "otel.name",
    "otel.kind",
    "otel.status_code",
    // where it serves, and switches
    "broker",
    "admission",
    "health",
    "webhook",
    "controllers",
    // counts, limits and durations
    "limit",
    "lifetime_s",
    "elapsed_ms",
    "reconciles",
    "status_writes",
    "housekeeping_ms",
    "prepare_ms",
    "apply_ms",
    "capacity",
    "desired",
    "planned",
    "pending_jobs",
    "jobs",
    "unplaceable",
    "create",
    // the scale-set listener: GitHub's numeric ids of a set and a message, its statistics
    "scale_set",
    "sets",
    "message_id",
    "available",
    "assigned",
    "deferred",
    "acquired",
    "entries",
    "still_pending",
    "retry_in_ms",
    // a job GitHub assigned to an attempt's runner: GitHub's numeric ids (never its repository
    // or name), and whether the attempt got the fact
    "job.id",
    "job.run_id",
    "fact_written",
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
    /// the operator's source emits is on it (the scan stops at each file's `#[cfg(test)]`, where
    /// this module feeds the layer fields that must be dropped).
    #[test]
    fn every_field_name_the_operator_emits_is_allowed() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        runner_manager_telemetry::testing::check_binary(&src, ALLOWED_FIELDS).unwrap();
    }
}
