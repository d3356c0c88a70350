//! The controllers' writes to the API server, each a merge patch of the writer's own fields (or a
//! create/delete), counted by kind so the writes per attempt can be measured (DESIGN §10).

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use runner_manager_crds::attempt::{AttemptFacts, RunnerAttempt, TerminationReason};
use runner_manager_crds::patch::facts_patch;
use runner_manager_crds::policy::ScalePolicy;
use serde_json::json;

use crate::metrics::Metrics;

pub const FIELD_MANAGER: &str = "runner-manager-operator";

/// Closed vocabulary of write kinds (the `kind` label of `runner_manager_api_writes_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    AttemptCreate,
    AttemptFacts,
    AttemptTermination,
    AttemptEdge,
    AttemptFinalizer,
    AttemptDelete,
    PolicyStatus,
    PolicyFinalizer,
    PendingJobs,
    Event,
}

impl WriteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AttemptCreate => "attempt_create",
            Self::AttemptFacts => "attempt_facts",
            Self::AttemptTermination => "attempt_termination",
            Self::AttemptEdge => "attempt_edge",
            Self::AttemptFinalizer => "attempt_finalizer",
            Self::AttemptDelete => "attempt_delete",
            Self::PolicyStatus => "policy_status",
            Self::PolicyFinalizer => "policy_finalizer",
            Self::PendingJobs => "pending_jobs",
            Self::Event => "event",
        }
    }
}

/// The writer: a client and where writes are counted.
#[derive(Clone)]
pub struct Writer {
    pub kube: kube::Client,
    pub metrics: std::sync::Arc<Metrics>,
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

fn ignore_gone<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

impl Writer {
    fn count(&self, kind: WriteKind) {
        self.metrics.api_write(kind.as_str());
    }

    pub fn attempts(&self, namespace: &str) -> Api<RunnerAttempt> {
        Api::namespaced(self.kube.clone(), namespace)
    }

    pub fn policies(&self, namespace: &str) -> Api<ScalePolicy> {
        Api::namespaced(self.kube.clone(), namespace)
    }

    /// Creates an attempt in its runner's trace: a span `runner.create` (linked to the reconcile
    /// that decided it) whose `traceparent` the attempt carries, so the agent's launch spans join
    /// it. Its parent is the webhook delivery that recorded the policy's oldest unserved job, or
    /// a link to the poll that found it (`telemetry::origin`); without either it is the root.
    /// Without OpenTelemetry the attempt carries no annotation.
    pub async fn create_attempt(&self, a: &RunnerAttempt) -> Result<RunnerAttempt, kube::Error> {
        use tracing::Instrument;
        self.count(WriteKind::AttemptCreate);
        let ns = a.metadata.namespace.as_deref().unwrap_or_default();
        let span = tracing::info_span!(
            parent: None,
            "runner.create",
            attempt.namespace = ns,
            attempt.name = a.metadata.name.as_deref().unwrap_or_default(),
            node = a.spec.node_name.as_str(),
        );
        // The demand's origin: the webhook delivery (parent) or the poll (link) that saw it.
        if let Some(origin) = crate::telemetry::origin::origins().take(ns, &a.spec.policy) {
            crate::telemetry::origin::attach(&span, &origin);
        }
        span.follows_from(tracing::Span::current());
        let traced = span
            .in_scope(crate::telemetry::current_traceparent)
            .map(|tp| {
                let mut a = a.clone();
                a.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(crate::telemetry::TRACEPARENT_ANNOTATION.to_owned(), tp);
                a
            });
        self.attempts(ns)
            .create(&PostParams::default(), traced.as_ref().unwrap_or(a))
            .instrument(span)
            .await
    }

    pub async fn facts(
        &self,
        namespace: &str,
        name: &str,
        facts: &AttemptFacts,
    ) -> Result<(), kube::Error> {
        self.count(WriteKind::AttemptFacts);
        let body = facts_patch(facts).map_err(|e| kube::Error::Service(Box::new(e)))?;
        ignore_gone(
            self.attempts(namespace)
                .patch_status(name, &params(), &Patch::Merge(body))
                .await,
        )
    }

    pub async fn job_fact(
        &self,
        namespace: &str,
        name: &str,
        job: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        self.count(WriteKind::AttemptFacts);
        ignore_gone(
            self.attempts(namespace)
                .patch_status(
                    name,
                    &params(),
                    &Patch::Merge(json!({"status": {"job": job}})),
                )
                .await,
        )
    }

    /// `spec.termination`: the one mutable spec field, a request to the agent.
    pub async fn terminate(
        &self,
        namespace: &str,
        name: &str,
        reason: TerminationReason,
        deregistered: bool,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        self.count(WriteKind::AttemptTermination);
        let body = json!({"spec": {"termination": {
            "reason": reason,
            "requestedAt": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
            "deregistered": deregistered,
        }}});
        ignore_gone(
            self.attempts(namespace)
                .patch(name, &params(), &Patch::Merge(body))
                .await,
        )
    }

    /// Drop `finalizer` from an object's list (CAS on the resourceVersion we decided on).
    pub async fn attempt_finalizers(
        &self,
        a: &RunnerAttempt,
        finalizers: Vec<String>,
    ) -> Result<(), kube::Error> {
        self.count(WriteKind::AttemptFinalizer);
        let ns = a.metadata.namespace.as_deref().unwrap_or_default();
        let name = a.metadata.name.as_deref().unwrap_or_default();
        let body = json!({"metadata": {
            "finalizers": finalizers, "resourceVersion": a.metadata.resource_version,
        }});
        ignore_gone(
            self.attempts(ns)
                .patch(name, &params(), &Patch::Merge(body))
                .await,
        )
    }

    pub async fn delete_attempt(&self, namespace: &str, name: &str) -> Result<(), kube::Error> {
        self.count(WriteKind::AttemptDelete);
        ignore_gone(
            self.attempts(namespace)
                .delete(name, &DeleteParams::default())
                .await,
        )
    }

    pub async fn policy_finalizers(
        &self,
        p: &ScalePolicy,
        finalizers: Vec<String>,
    ) -> Result<(), kube::Error> {
        self.count(WriteKind::PolicyFinalizer);
        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
        let name = p.metadata.name.as_deref().unwrap_or_default();
        let body = json!({"metadata": {
            "finalizers": finalizers, "resourceVersion": p.metadata.resource_version,
        }});
        ignore_gone(
            self.policies(ns)
                .patch(name, &params(), &Patch::Merge(body))
                .await,
        )
    }

    /// A merge patch of the leader's own status fields (never `pendingJobs`, which every
    /// replica's webhook receiver writes).
    pub async fn policy_status(
        &self,
        namespace: &str,
        name: &str,
        status: serde_json::Value,
    ) -> Result<(), kube::Error> {
        self.count(WriteKind::PolicyStatus);
        ignore_gone(
            self.policies(namespace)
                .patch_status(name, &params(), &Patch::Merge(json!({"status": status})))
                .await,
        )
    }

    /// Add or remove (`None`) entries of `status.pendingJobs`.
    pub async fn pending_jobs(
        &self,
        namespace: &str,
        name: &str,
        entries: serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), kube::Error> {
        if entries.is_empty() {
            return Ok(());
        }
        self.count(WriteKind::PendingJobs);
        let body = json!({"status": {"pendingJobs": entries}});
        ignore_gone(
            self.policies(namespace)
                .patch_status(name, &params(), &Patch::Merge(body))
                .await,
        )
    }

    pub fn counted_event(&self) {
        self.count(WriteKind::Event);
    }

    pub fn dropped_event(&self) {
        self.metrics.event_dropped();
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}
