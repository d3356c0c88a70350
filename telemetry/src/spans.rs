//! The span export path's one bound and what it lost (issue 33 item 1): a collector that is down
//! or slow must cost no launch and no memory beyond a fixed queue, and a platform team must see
//! what it lost, not guess it from a gap in a trace.
//!
//! The SDK's batch processor already holds ended spans in a bounded queue and exports them from
//! its own thread, so a span's end never waits for the network. But what it drops is only logged
//! through the SDK's internal log: nothing a metric can read. So the queue's bound is kept here,
//! in front of it: [`Bounded`] admits an ended span only while fewer than `cap` are between their
//! end and the end of their export, and [`Counted`] (the exporter the processor calls) gives the
//! places back and counts each batch's fate. The processor's own queue has the same capacity, so
//! it never drops on its own: every span is counted exactly once, as exported, dropped because
//! the queue was full, or dropped because its export failed (the SDK does not retry a failed
//! batch; a collector that is down fails each batch at once, one that is slow holds the queue
//! full until `OTEL_EXPORTER_OTLP_TIMEOUT`).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Why a span never reached the collector. A closed vocabulary: it is a metric label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum DropReason {
    /// The queue held `cap` spans not yet exported (a collector down or slow for a while).
    #[allow(non_camel_case_types)]
    queue_full,
    /// Its batch's export failed (refused, timed out, or an error answer).
    #[allow(non_camel_case_types)]
    export_failed,
}

impl DropReason {
    pub const ALL: [DropReason; 2] = [DropReason::queue_full, DropReason::export_failed];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    reason: DropReason,
}

/// What became of the spans one provider ended.
#[derive(Debug, Default)]
pub struct SpanCounts {
    exported: Counter,
    dropped: Family<DropLabels, Counter>,
}

impl SpanCounts {
    pub fn exported(&self) -> u64 {
        self.exported.get()
    }

    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped.get_or_create(&DropLabels { reason }).get()
    }

    fn drop_n(&self, reason: DropReason, n: usize) {
        self.dropped
            .get_or_create(&DropLabels { reason })
            .inc_by(n as u64);
    }
}

/// The process's counts: its one tracer provider's (the subscriber it feeds is process-wide too).
static PROCESS: LazyLock<Arc<SpanCounts>> = LazyLock::new(|| {
    let counts = SpanCounts::default();
    // Both reasons at 0 from the start: an alert on their increase must see a series while
    // nothing is lost (no series is no data, not 0).
    for reason in DropReason::ALL {
        let _ = counts.dropped.get_or_create(&DropLabels { reason });
    }
    Arc::new(counts)
});

pub(crate) fn process() -> Arc<SpanCounts> {
    PROCESS.clone()
}

/// Registers the process's span counts on a binary's registry (both binaries call it, so one
/// alert covers both): `trace_spans_exported_total` and `trace_spans_dropped_total{reason}`.
/// They stay at 0 while no traces are exported.
pub fn register(registry: &mut Registry) {
    registry.register(
        "trace_spans_exported",
        "Spans the OTLP collector accepted",
        PROCESS.exported.clone(),
    );
    registry.register(
        "trace_spans_dropped",
        "Spans never exported, by why (queue_full: the bounded queue was full; export_failed: the collector refused or did not answer)",
        PROCESS.dropped.clone(),
    );
}

/// The places in the queue: taken at a span's end, given back when its batch's export ends.
#[derive(Debug)]
pub(crate) struct Gate {
    cap: usize,
    in_flight: AtomicUsize,
    counts: Arc<SpanCounts>,
}

impl Gate {
    pub(crate) fn new(cap: usize, counts: Arc<SpanCounts>) -> Arc<Self> {
        Arc::new(Gate {
            cap,
            in_flight: AtomicUsize::new(0),
            counts,
        })
    }

    fn admit(&self) -> bool {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        // Never below 0, even if the SDK exported a span this gate did not admit.
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |m| {
                Some(m.saturating_sub(n))
            });
    }
}

/// The processor in front of the SDK's: admits a span while the queue has a place.
#[derive(Debug)]
pub(crate) struct Bounded<P> {
    pub(crate) inner: P,
    pub(crate) gate: Arc<Gate>,
}

impl<P: SpanProcessor> SpanProcessor for Bounded<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.gate.admit() {
            self.inner.on_end(span);
        } else {
            self.gate.counts.drop_n(DropReason::queue_full, 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter the SDK's processor calls: counts each batch's fate, gives its places back.
#[derive(Debug)]
pub(crate) struct Counted<E> {
    pub(crate) inner: E,
    pub(crate) gate: Arc<Gate>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let n = batch.len();
        let export = self.inner.export(batch);
        let gate = self.gate.clone();
        async move {
            let result = export.await;
            match &result {
                Ok(()) => {
                    gate.counts.exported.inc_by(n as u64);
                }
                Err(_) => gate.counts.drop_n(DropReason::export_failed, n),
            }
            gate.release(n);
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The queue's capacity: `OTEL_BSP_MAX_QUEUE_SIZE` as the SDK reads it (default 2,048).
pub(crate) fn queue_cap(env: impl Fn(&str) -> Option<String>) -> usize {
    env("OTEL_BSP_MAX_QUEUE_SIZE")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(opentelemetry_sdk::trace::OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkError;
    use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
    use std::sync::{Condvar, Mutex};

    /// An exporter that holds every batch until told how to answer (`None`: hold).
    #[derive(Debug, Default)]
    struct Scripted {
        answer: Arc<(Mutex<Option<bool>>, Condvar)>,
    }

    impl Scripted {
        fn set(answer: &(Mutex<Option<bool>>, Condvar), ok: bool) {
            *answer.0.lock().unwrap() = Some(ok);
            answer.1.notify_all();
        }
    }

    impl SpanExporter for Scripted {
        fn export(&self, _batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
            let (lock, cv) = &*self.answer;
            let ok = *cv
                .wait_while(lock.lock().unwrap(), |a| a.is_none())
                .unwrap();
            async move {
                match ok {
                    Some(true) => Ok(()),
                    _ => Err(OTelSdkError::InternalFailure("collector down".into())),
                }
            }
        }
    }

    type Answer = Arc<(Mutex<Option<bool>>, Condvar)>;

    fn provider(cap: usize) -> (SdkTracerProvider, Answer, Arc<SpanCounts>) {
        let exporter = Scripted::default();
        let answer = exporter.answer.clone();
        let counts = Arc::new(SpanCounts::default());
        let gate = Gate::new(cap, counts.clone());
        let exporter = Counted {
            inner: exporter,
            gate: gate.clone(),
        };
        // No timer: batches leave when full or flushed, so what a test sees is what it did.
        let config = BatchConfigBuilder::default()
            .with_max_queue_size(cap)
            .with_max_export_batch_size(cap)
            .with_scheduled_delay(Duration::from_secs(3600))
            .build();
        let inner = BatchSpanProcessor::builder(exporter)
            .with_batch_config(config)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Bounded { inner, gate })
            .build();
        (provider, answer, counts)
    }

    fn end_spans(p: &SdkTracerProvider, n: usize) {
        let tracer = p.tracer("test");
        for i in 0..n {
            tracer.in_span(format!("s{i}"), |_| {});
        }
    }

    #[test]
    fn a_stuck_collector_costs_no_span_end_and_each_span_beyond_the_queue_is_counted() {
        let (p, answer, counts) = provider(4);
        // The exporter answers nothing yet: every end must still return, the fifth on dropped.
        end_spans(&p, 10);
        assert_eq!(counts.dropped(DropReason::queue_full), 6);
        Scripted::set(&answer, true);
        p.force_flush().unwrap();
        assert_eq!(counts.exported(), 4);
        // The places came back with the export: the queue takes spans again.
        end_spans(&p, 3);
        p.force_flush().unwrap();
        assert_eq!(counts.exported(), 7);
        assert_eq!(counts.dropped(DropReason::queue_full), 6);
        assert_eq!(counts.dropped(DropReason::export_failed), 0);
    }

    #[test]
    fn a_failed_export_counts_its_batch_and_gives_its_places_back() {
        let (p, answer, counts) = provider(4);
        Scripted::set(&answer, false);
        end_spans(&p, 3);
        let _ = p.force_flush();
        assert_eq!(counts.dropped(DropReason::export_failed), 3);
        assert_eq!(counts.exported(), 0);
        Scripted::set(&answer, true);
        end_spans(&p, 4);
        p.force_flush().unwrap();
        assert_eq!(counts.exported(), 4);
        assert_eq!(counts.dropped(DropReason::queue_full), 0);
    }

    #[test]
    fn the_queue_is_the_sdks_own_setting() {
        let env = |v: Option<&'static str>| {
            move |k: &str| {
                (k == "OTEL_BSP_MAX_QUEUE_SIZE")
                    .then_some(v)
                    .flatten()
                    .map(str::to_owned)
            }
        };
        assert_eq!(queue_cap(env(None)), 2048);
        assert_eq!(queue_cap(env(Some("64"))), 64);
        assert_eq!(queue_cap(env(Some("0"))), 2048);
        assert_eq!(queue_cap(env(Some("lots"))), 2048);
    }
}
