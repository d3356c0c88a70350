//! Where a runner's demand came from, for its trace. The webhook delivery that recorded a queued
//! job (span `webhook.delivery`) or the poll that found it (span `poll`) is remembered per policy
//! with its span context; the next `runner.create` of that policy takes the oldest one: a
//! delivery becomes `runner.create`'s parent (one delivery, one job, one runner: the runner's
//! trace starts at the delivery), a poll becomes a link (a poll finds many jobs and stays its
//! own trace). A job seen started or completed is forgotten; a job's origin is taken at most
//! once. In memory on the replica that saw the demand: when the delivery reached a standby, the
//! leader has no origin for it and `runner.create` stays the root (linked to its reconcile).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanContext, TraceContextExt};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// How a job's demand was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Delivery,
    Poll,
}

/// One job's origin.
#[derive(Clone, Debug)]
pub struct Origin {
    pub kind: Kind,
    pub context: SpanContext,
    at: Instant,
}

/// Entries per policy at most (the ledger's own bound is larger; older ones go first).
const PER_POLICY: usize = 1024;
/// An origin nobody took within this is dropped.
const MAX_AGE: Duration = Duration::from_secs(3600);

#[derive(Debug, Default)]
struct PolicyOrigins {
    pending: BTreeMap<i64, Origin>,
    /// Jobs whose origin was taken or that started: never recorded again.
    done: VecDeque<i64>,
}

impl PolicyOrigins {
    fn is_done(&self, job: i64) -> bool {
        self.done.contains(&job)
    }

    fn mark_done(&mut self, job: i64) {
        self.pending.remove(&job);
        if !self.is_done(job) {
            if self.done.len() >= PER_POLICY {
                self.done.pop_front();
            }
            self.done.push_back(job);
        }
    }
}

/// The origins of one process, by (namespace, policy).
#[derive(Debug, Default)]
pub struct Origins {
    by_policy: Mutex<HashMap<(String, String), PolicyOrigins>>,
}

impl Origins {
    fn with<T>(&self, ns: &str, policy: &str, f: impl FnOnce(&mut PolicyOrigins) -> T) -> T {
        let mut map = self
            .by_policy
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(map.entry((ns.to_owned(), policy.to_owned())).or_default())
    }

    /// Remembers `context` as job `job`'s origin unless it has one or was served. Pure apart
    /// from the map.
    pub fn record(&self, ns: &str, policy: &str, job: i64, kind: Kind, context: SpanContext) {
        if !context.is_valid() {
            return;
        }
        self.with(ns, policy, |p| {
            // A delivery is the more precise origin: it replaces a poll's, never the reverse.
            let replaces_poll =
                kind == Kind::Delivery && p.pending.get(&job).is_some_and(|o| o.kind == Kind::Poll);
            if p.is_done(job) || (p.pending.contains_key(&job) && !replaces_poll) {
                return;
            }
            p.pending.retain(|_, o| o.at.elapsed() < MAX_AGE);
            if p.pending.len() >= PER_POLICY
                && let Some((&oldest, _)) = p.pending.iter().min_by_key(|(_, o)| o.at)
            {
                p.pending.remove(&oldest);
            }
            p.pending.insert(
                job,
                Origin {
                    kind,
                    context,
                    at: Instant::now(),
                },
            );
        });
    }

    /// Job `job`'s origin is dropped unserved and may be recorded again (the delivery that
    /// recorded it could not write its ledger entry; GitHub redelivers it).
    pub fn withdraw(&self, ns: &str, policy: &str, job: i64) {
        self.with(ns, policy, |p| {
            p.pending.remove(&job);
        });
    }

    /// Job `job` started or completed: its demand no longer calls for a runner.
    pub fn forget(&self, ns: &str, policy: &str, job: i64) {
        self.with(ns, policy, |p| p.mark_done(job));
    }

    /// The oldest origin of the policy's demand not yet served, taken.
    pub fn take(&self, ns: &str, policy: &str) -> Option<Origin> {
        self.with(ns, policy, |p| {
            p.pending.retain(|_, o| o.at.elapsed() < MAX_AGE);
            let (&job, _) = p.pending.iter().min_by_key(|(_, o)| o.at)?;
            let origin = p.pending.remove(&job);
            p.mark_done(job);
            origin
        })
    }
}

/// The process's origins.
pub fn origins() -> &'static Origins {
    static ORIGINS: LazyLock<Origins> = LazyLock::new(Origins::default);
    &ORIGINS
}

/// The span context of `span` (invalid when spans are not exported).
pub fn span_context(span: &tracing::Span) -> SpanContext {
    span.context().span().span_context().clone()
}

/// Makes `span` (not yet entered) start from `origin`: a delivery is its parent, a poll a link.
pub fn attach(span: &tracing::Span, origin: &Origin) {
    match origin.kind {
        Kind::Delivery => {
            let cx = opentelemetry::Context::new().with_remote_span_context(origin.context.clone());
            let _ = span.set_parent(cx);
        }
        Kind::Poll => span.add_link(origin.context.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    fn cx(n: u8) -> SpanContext {
        SpanContext::new(
            TraceId::from_bytes([n; 16]),
            SpanId::from_bytes([n; 8]),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        )
    }

    #[test]
    fn a_withdrawn_origin_is_not_served_and_its_redelivery_records_again() {
        let o = Origins::default();
        o.record("ns", "web", 7, Kind::Delivery, cx(1));
        o.withdraw("ns", "web", 7);
        assert!(o.take("ns", "web").is_none(), "withdrawn, not served");
        o.record("ns", "web", 7, Kind::Delivery, cx(2));
        assert_eq!(o.take("ns", "web").map(|x| x.context), Some(cx(2)));
    }

    #[test]
    fn each_origin_is_taken_once_oldest_first_and_started_jobs_are_forgotten() {
        let o = Origins::default();
        o.record("ns", "web", 7, Kind::Delivery, cx(1));
        o.record("ns", "web", 8, Kind::Poll, cx(2));
        o.record("ns", "web", 9, Kind::Delivery, cx(3));
        // A poll seeing a job the delivery recorded keeps the delivery; a delivery after a
        // poll replaces it.
        o.record("ns", "web", 7, Kind::Poll, cx(4));
        o.record("ns", "swap", 1, Kind::Poll, cx(8));
        o.record("ns", "swap", 1, Kind::Delivery, cx(9));
        o.record("ns", "swap", 1, Kind::Poll, cx(10));
        let swapped = o.take("ns", "swap").unwrap();
        assert_eq!((swapped.kind, swapped.context), (Kind::Delivery, cx(9)));
        o.record("ns", "other", 1, Kind::Delivery, cx(5));
        o.forget("ns", "web", 8);
        let first = o.take("ns", "web").unwrap();
        assert_eq!((first.kind, first.context), (Kind::Delivery, cx(1)));
        // Served: a later poll does not bring it back.
        o.record("ns", "web", 7, Kind::Poll, cx(6));
        assert_eq!(o.take("ns", "web").unwrap().context, cx(3));
        assert!(o.take("ns", "web").is_none());
        assert_eq!(o.take("ns", "other").unwrap().context, cx(5));
        // Without exported spans there is nothing to remember.
        o.record(
            "ns",
            "web",
            10,
            Kind::Delivery,
            SpanContext::empty_context(),
        );
        assert!(o.take("ns", "web").is_none());
    }
}
