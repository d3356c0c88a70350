//! The telemetry both binaries share (one home: each binary's `telemetry` module names its own
//! field allow-list and service, and calls this): `tracing` to stderr (text, or one JSON object
//! per line: `timestamp`, `level`, `target`, `fields.message` and the call site's fields), the
//! level from `RUST_LOG` (default `info`), fields kept only when on the binary's allow-list
//! ([`allow`]), and OpenTelemetry traces exported over OTLP/HTTP (protobuf) when the standard
//! `OTEL_*` variables ask for them (`OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`
//! turn them off), through one bounded queue whose losses are counted ([`spans`]). A trace crosses processes as a W3C `traceparent` ([`current_traceparent`],
//! [`join`]).

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub mod allow;
pub mod exposition;
pub mod fields;
pub mod registry;
pub mod spans;
pub mod testing;

/// The stderr (or `writer`) log layer: text or JSON, fields on `allowed` only.
pub fn log_layer<S, W>(
    json: bool,
    writer: W,
    allowed: &'static [&'static str],
) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::Layer as _;
    let fmt = tracing_subscriber::fmt::layer();
    if json {
        fmt.json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(allow::AllowedJson {
                inner: writer,
                allowed,
            })
            .boxed()
    } else {
        fmt.with_ansi(false)
            .fmt_fields(allow::AllowedFields(allowed))
            .with_writer(writer)
            .boxed()
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

fn provider(service: &'static str, version: &'static str) -> Option<SdkTracerProvider> {
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
        .with_attribute(opentelemetry::KeyValue::new("service.version", version))
        .build();
    // The SDK's batch processor, behind the bound that counts what it loses (spans.rs).
    let cap = spans::queue_cap(|k| std::env::var(k).ok());
    let gate = spans::Gate::new(cap, spans::process());
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(cap)
        .build();
    let batch = BatchSpanProcessor::builder(spans::Counted {
        inner: exporter,
        gate: gate.clone(),
    })
    .with_batch_config(config)
    .build();
    Some(
        SdkTracerProvider::builder()
            .with_span_processor(spans::Bounded { inner: batch, gate })
            .with_resource(resource)
            .build(),
    )
}

/// Install the process's subscriber (once; later calls do nothing): `service` and `version`
/// name the process in its spans; its log lines keep only the fields on `allowed`.
pub fn init(
    json: bool,
    service: &'static str,
    version: &'static str,
    allowed: &'static [&'static str],
) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let provider = provider(service, version);
    let otel = provider.as_ref().map(|p| {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        tracing_opentelemetry::layer().with_tracer(p.tracer(service))
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(otel)
        .with(log_layer(json, std::io::stderr, allowed))
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
