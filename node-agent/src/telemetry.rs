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

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::cli::LogFormat;

pub mod allow;

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
    "launcher",
    "health",
    "capacity",
    "elapsed_ms",
    "retry_in_s",
    "otel.name",
    "otel.kind",
    "otel.status_code",
];

/// The stderr (or `writer`) log layer: text or JSON, fields on [`ALLOWED_FIELDS`] only.
pub fn log_layer<S, W>(
    format: LogFormat,
    writer: W,
) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::Layer as _;
    let fmt = tracing_subscriber::fmt::layer();
    match format {
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(allow::AllowedJson {
                inner: writer,
                allowed: ALLOWED_FIELDS,
            })
            .boxed(),
        LogFormat::Text => fmt
            .with_ansi(false)
            .fmt_fields(allow::AllowedFields(ALLOWED_FIELDS))
            .with_writer(writer)
            .boxed(),
    }
}

/// The exporter's provider while traces are exported; flushes on drop.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.force_flush();
            let _ = p.shutdown();
        }
    }
}

/// Whether the standard variables ask for OTLP traces.
pub fn otlp_requested(env: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let none = env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    !disabled
        && !none
        && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

fn provider(service: &'static str) -> Option<SdkTracerProvider> {
    if !otlp_requested(|k| std::env::var(k).ok()) {
        return None;
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{service}: OTLP exporter not started: {e}");
            return None;
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build(),
    )
}

/// Install the process's subscriber (once; later calls do nothing).
pub fn init(format: LogFormat, service: &'static str) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let provider = provider(service);
    let otel = provider.as_ref().map(|p| {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        tracing_opentelemetry::layer().with_tracer(p.tracer(service))
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(otel)
        .with(log_layer(format, std::io::stderr))
        .try_init();
    Telemetry { provider }
}

/// The W3C `traceparent` of the current span, when spans are exported.
pub fn current_traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// Makes `span` a child of the span a `traceparent` names (what the operator wrote on the
/// attempt). A missing or malformed value leaves the span where it is.
pub fn join(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(tp) = traceparent.filter(|t| well_formed(t)) else {
        return;
    };
    let carrier = HashMap::from([("traceparent".to_owned(), tp.to_owned())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(cx);
}

/// `00-<32 hex>-<16 hex>-<2 hex>`. Pure.
pub fn well_formed(tp: &str) -> bool {
    let parts: Vec<&str> = tp.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    parts.len() == 4
        && hex(parts[0], 2)
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_only_when_the_standard_variables_ask() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert!(!otlp_requested(env(&[])));
        assert!(otlp_requested(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4318"
        )])));
        assert!(otlp_requested(env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/traces"
        )])));
        assert!(!otlp_requested(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "true")
        ])));
        assert!(!otlp_requested(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_TRACES_EXPORTER", "none")
        ])));
        assert!(!otlp_requested(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            " "
        )])));
    }

    /// A log sink for tests.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Self;
        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    #[test]
    fn workflow_controlled_fields_never_reach_the_log() {
        for format in [LogFormat::Text, LogFormat::Json] {
            let out = Captured::default();
            let subscriber = tracing_subscriber::registry().with(log_layer(format, out.clone()));
            tracing::subscriber::with_default(subscriber, || {
                let span = tracing::info_span!(
                    "launch",
                    attempt.uid = "uid-1",
                    job.name = "EVIL-span-job",
                );
                let _in = span.enter();
                tracing::info!(
                    namespace = "team-a",
                    job_name = "EVIL-job-name",
                    labels = ?["EVIL-label"],
                    runner_name = %"EVIL-runner",
                    reason = "Ready",
                    "one line"
                );
            });
            let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
            assert!(!text.contains("EVIL"), "{format:?}: {text}");
            for kept in ["team-a", "Ready", "one line", "uid-1", "launch"] {
                assert!(text.contains(kept), "{format:?} lost {kept}: {text}");
            }
            if matches!(format, LogFormat::Json) {
                let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
                assert_eq!(v["fields"]["namespace"], "team-a");
                assert_eq!(v["fields"]["message"], "one line");
                assert_eq!(v["span"]["attempt.uid"], "uid-1");
                assert!(v["fields"].get("job_name").is_none());
            } else {
                assert!(text.contains("namespace=\"team-a\""), "{text}");
            }
        }
    }

    #[test]
    fn traceparents_are_checked_before_use() {
        assert!(well_formed(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!well_formed(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
        ));
        assert!(!well_formed(
            "00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01"
        ));
        assert!(!well_formed(""));
    }
}
