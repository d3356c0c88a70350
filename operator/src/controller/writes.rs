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
    /// The policy versions this process's own finalizer and status writes produced.
    pub echoes: std::sync::Arc<Echoes>,
}

/// The resourceVersions of the policy objects the leader's own writes produced, until the watch
/// shows each one. The writer knew that object when it wrote it: reconciling the policy again
/// for it is work for nothing (a fresh install's first round reconciled each policy three times,
/// once for its own finalizer write and once for its own status write). Any other change to the
/// policy (a spec edit, a webhook's `pendingJobs` entry, another writer) has a version of its
/// own and still triggers. A version the watch never shows (a relist skipped it) is dropped
/// once newer ones pushed it out.
///
/// The writes are merge patches: the version one returns can hold another writer's change the
/// cache has not shown (a webhook's `pendingJobs` entry written just before; a no-op write
/// returns the current version). So a version is recorded only when the returned object holds
/// nothing the reconcile did not read ([`only_ours`]); otherwise its event triggers as usual.
#[derive(Debug, Default)]
pub struct Echoes(std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>);

/// Versions kept per policy: a reconcile writes at most a finalizer and a status.
const ECHOES_PER_POLICY: usize = 4;

/// Whether `written` (a write's response) holds what the reconcile read in `read` and nothing
/// else that a reconcile acts on, `finalizers` being the list the write left (the read one for
/// a status write). Status fields other than `pendingJobs` are the leader's own.
fn only_ours(read: &ScalePolicy, finalizers: Option<&[String]>, written: &ScalePolicy) -> bool {
    let (r, w) = (&read.metadata, &written.metadata);
    let pending = |p: &ScalePolicy| p.status.as_ref().map(|s| s.pending_jobs.clone());
    r.generation == w.generation
        && r.deletion_timestamp == w.deletion_timestamp
        && r.annotations == w.annotations
        && finalizers.unwrap_or(r.finalizers.as_deref().unwrap_or_default())
            == w.finalizers.as_deref().unwrap_or_default()
        && pending(read).unwrap_or_default() == pending(written).unwrap_or_default()
}

impl Echoes {
    /// Record the version of `written`, the response to a write decided on `read`, if it is
    /// only that write (see [`only_ours`]).
    fn record_written(
        &self,
        read: &ScalePolicy,
        finalizers: Option<&[String]>,
        written: Option<ScalePolicy>,
    ) {
        let Some(written) = written else { return };
        if !only_ours(read, finalizers, &written) {
            return;
        }
        let (Some(ns), Some(name)) = (
            read.metadata.namespace.as_deref(),
            read.metadata.name.as_deref(),
        ) else {
            return;
        };
        self.record(ns, name, written.metadata.resource_version);
    }

    fn record(&self, namespace: &str, name: &str, version: Option<String>) {
        let Some(version) = version else { return };
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mine = all.entry(format!("{namespace}/{name}")).or_default();
        if mine.len() >= ECHOES_PER_POLICY {
            mine.remove(0);
        }
        mine.push(version);
    }

    /// Whether `p` as observed is exactly an object this process wrote (forgotten once asked).
    pub fn is_echo(&self, p: &ScalePolicy) -> bool {
        let (Some(ns), Some(name), Some(version)) = (
            p.metadata.namespace.as_deref(),
            p.metadata.name.as_deref(),
            p.metadata.resource_version.as_deref(),
        ) else {
            return false;
        };
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let k = format!("{ns}/{name}");
        let Some(mine) = all.get_mut(&k) else {
            return false;
        };
        let Some(at) = mine.iter().position(|v| v == version) else {
            return false;
        };
        // Older versions than this one will not be shown any more.
        mine.drain(..=at);
        if mine.is_empty() {
            all.remove(&k);
        }
        true
    }

    /// Forget the policies that are gone (`live`: `namespace/name` of those cached).
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| live.contains(k));
    }
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

/// The written policy's resourceVersion; a policy already gone is no error.
fn written(r: Result<ScalePolicy, kube::Error>) -> Result<Option<ScalePolicy>, kube::Error> {
    match r {
        Ok(p) => Ok(Some(p)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
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

    /// Set a policy's finalizers (CAS on the resourceVersion `p` was read at). Its event
    /// triggers a reconcile: the scale-set listener writes through this, and the policy's
    /// reconcile must see the listener's finalizer come and go.
    pub async fn policy_finalizers(
        &self,
        p: &ScalePolicy,
        finalizers: Vec<String>,
    ) -> Result<(), kube::Error> {
        self.write_policy_finalizers(p, finalizers).await.map(drop)
    }

    /// [`Self::policy_finalizers`] from the policy's own reconcile, which knew the object it
    /// wrote: the returned version is an echo (when it holds nothing else).
    pub async fn policy_finalizers_echoed(
        &self,
        p: &ScalePolicy,
        finalizers: Vec<String>,
    ) -> Result<(), kube::Error> {
        let written = self.write_policy_finalizers(p, finalizers.clone()).await?;
        self.echoes.record_written(p, Some(&finalizers), written);
        Ok(())
    }

    async fn write_policy_finalizers(
        &self,
        p: &ScalePolicy,
        finalizers: Vec<String>,
    ) -> Result<Option<ScalePolicy>, kube::Error> {
        self.count(WriteKind::PolicyFinalizer);
        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
        let name = p.metadata.name.as_deref().unwrap_or_default();
        let body = json!({"metadata": {
            "finalizers": finalizers, "resourceVersion": p.metadata.resource_version,
        }});
        written(
            self.policies(ns)
                .patch(name, &params(), &Patch::Merge(body))
                .await,
        )
    }

    /// A merge patch of the leader's own status fields (never `pendingJobs`, which every
    /// replica's webhook receiver writes), decided on `read`; `finalizers` when the same
    /// reconcile set them just before (else those read).
    pub async fn policy_status(
        &self,
        read: &ScalePolicy,
        finalizers: Option<&[String]>,
        status: serde_json::Value,
    ) -> Result<(), kube::Error> {
        self.count(WriteKind::PolicyStatus);
        let namespace = read.metadata.namespace.as_deref().unwrap_or_default();
        let name = read.metadata.name.as_deref().unwrap_or_default();
        let written = written(
            self.policies(namespace)
                .patch_status(name, &params(), &Patch::Merge(json!({"status": status})))
                .await,
        )?;
        self.echoes.record_written(read, finalizers, written);
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(name: &str, version: &str) -> ScalePolicy {
        let mut p: ScalePolicy = serde_json::from_value(json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"github": {"url": "https://github.com/a/b", "credentialsSecretRef": {"name": "s"}},
                "labels": ["x"], "maxRunners": 1}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        p.metadata.resource_version = Some(version.to_owned());
        p
    }

    #[test]
    fn only_the_versions_this_process_wrote_are_echoes_and_each_once() {
        let echoes = Echoes::default();
        echoes.record("team", "web", Some("10".into()));
        echoes.record("team", "web", Some("12".into()));
        // Someone else's write in between (a webhook's pendingJobs entry): it triggers.
        assert!(!echoes.is_echo(&seen("web", "11")));
        assert!(
            !echoes.is_echo(&seen("api", "10")),
            "another policy's version"
        );
        assert!(echoes.is_echo(&seen("web", "12")));
        // 12 was shown, so 10 never will be; nor is 12 an echo twice (a relist shows it again).
        assert!(!echoes.is_echo(&seen("web", "10")));
        assert!(!echoes.is_echo(&seen("web", "12")));
        for v in 0..10 {
            echoes.record("team", "web", Some(v.to_string()));
        }
        assert!(!echoes.is_echo(&seen("web", "0")), "bounded per policy");
        assert!(echoes.is_echo(&seen("web", "9")));
        echoes.record("team", "web", Some("20".into()));
        echoes.retain(&std::collections::HashSet::new());
        assert!(
            !echoes.is_echo(&seen("web", "20")),
            "forgotten with the policy"
        );
    }

    #[test]
    fn a_returned_object_holding_another_writers_change_is_not_an_echo() {
        let echoes = Echoes::default();
        let read = seen("web", "10");
        let mut written = seen("web", "12");
        // A status write of ours: the response is what was read plus our fields.
        echoes.record_written(&read, None, Some(written.clone()));
        assert!(echoes.is_echo(&written));
        // A webhook's pendingJobs entry landed before our merge patch (version 11, which a
        // relist may never show): the response carries it, so it must trigger.
        written.metadata.resource_version = Some("14".into());
        written.status.get_or_insert_default().pending_jobs.insert(
            "42".into(),
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        );
        echoes.record_written(&read, None, Some(written.clone()));
        assert!(!echoes.is_echo(&written), "pendingJobs differ");
        // Likewise a spec edit, a deletion or someone else's finalizer.
        for change in [
            |p: &mut ScalePolicy| p.metadata.generation = Some(2),
            |p: &mut ScalePolicy| {
                p.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ))
            },
            |p: &mut ScalePolicy| p.metadata.finalizers = Some(vec!["someone/else".into()]),
        ] {
            let mut w = seen("web", "16");
            change(&mut w);
            echoes.record_written(&read, None, Some(w.clone()));
            assert!(!echoes.is_echo(&w));
        }
        // Our own finalizer write: the finalizers it set are ours.
        let ours = vec!["runner-manager.dev/cleanup".to_owned()];
        let mut w = seen("web", "18");
        w.metadata.finalizers = Some(ours.clone());
        echoes.record_written(&read, Some(&ours), Some(w.clone()));
        assert!(echoes.is_echo(&w));
    }
}
